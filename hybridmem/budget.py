"""Budget labels and the integer allocation planner (SPEC §4, App. B.3, Table B-2).

A label ``bN`` is a nominal byte target of ``N x u x a`` bytes per layer (1,605,632 B per unit for
Falcon-H1-7B). Each organization turns the nominal target into whole units of its own:

    S0     round(nominal / s0_page)                                    (b63 -> 63 pages)
    S1/S2  round(nominal / P)                                          (b63 -> 193 pages)
    D0     floor(frac x nominal / 16a) attention units,                (b63 -> 3,256)
           floor((1 - frac) x nominal / r) recurrent composites        (b63 -> 29)

Rounding is half-up and all arithmetic is exact (``Fraction``), so the planner never depends on
binary floating point; ``frac`` is taken at its decimal value (0.527383 for Falcon-H1-7B).

Whole model. The plan is one pool per layer; layers differ in what they hold. A shared pool
(S0/S1/S2) sits in every layer that holds state (``Geometry.n_state_layers``: 44 of Falcon-H1-7B's
44 layers, 40 of Granite-4.0-H-Micro's 40, 28 of Nemotron-H-8B's 52, whose 24 MLP-only layers hold
none); D0's attention pool sits in the attention layers and its recurrent pool in the Mamba layers::

    shared  model_bytes = pages x page_bytes x L_state
    D0      model_bytes = attention_bytes x L_attention + recurrent_bytes x L_mamba

A whole-cache total ``T`` (what vLLM's ``--kv-cache-memory-bytes`` reserves, all layers together)
is split per layer so that no organization's whole-model bytes exceed it, rounding down:

    shared  per-layer bytes  T / L_state                      -> floor(T / L_state / page) pages
    D0      per-layer budget B = T / (f L_attention + (1 - f) L_mamba)
            -> floor(f B / 16a) attention units, floor((1 - f) B / r) recurrent composites

so ``f`` keeps one meaning (D0's per-layer attention share) for labels and totals; for a parallel
hybrid both splits are ``T / layers``. A total's label is ``total SIZE`` (``total 12GiB``), and
:func:`parse_budget` reads that label back, so a total travels wherever a budget text does (the
CLI's ``--total``, a campaign grid, the vLLM plugin's settings).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from math import floor
from typing import Any

from hybridmem.errors import BudgetError
from hybridmem.units import Units

_SIZE_SUFFIX = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_LABEL_RE = re.compile(r"^b(\d+)$")
MAX_TEXT = 40  # characters of a budget or size (a 5,000-digit budget is refused, not parsed)
MAX_BYTES = 1 << 60
TOTAL_PREFIX = "total "  # the label of a whole-cache total: "total 12GiB"


def parse_size(text: str) -> int:
    """Bytes from ``123``, ``96MiB``, ``1.5GiB`` or ``100MB``; rejects zero, negatives, more
    than ``MAX_BYTES`` and input longer than ``MAX_TEXT`` characters."""
    if len(str(text)) > MAX_TEXT:
        raise BudgetError(f"bad size {str(text)[:20]!r}... ({len(str(text))} characters)")
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _SIZE_SUFFIX:
        raise BudgetError(f"bad size {text!r}: expected bytes or a size like 96MiB, 1.5GiB, 100MB")
    value = Fraction(m.group(1)) * _SIZE_SUFFIX[m.group(2).lower()]
    if value.denominator != 1:
        raise BudgetError(f"bad size {text!r}: {float(value)} is not a whole number of bytes")
    if value <= 0:
        raise BudgetError(f"size must be positive, got {text!r}")
    if value > MAX_BYTES:
        raise BudgetError(f"size {text!r} is over {MAX_BYTES:,} B")
    return int(value)


@dataclass(frozen=True)
class Budget:
    label: str  # "b63", or the size as given
    nominal_bytes: int  # per layer (for a total: its share of one state-holding layer)
    total_bytes: int | None = None  # a whole-cache total this budget was split from


def _too_small(raw: str, nominal: int, units: Units) -> BudgetError:
    r = units.geometry.composite_bytes
    hint = f"; did you mean b{raw}?" if raw.isdigit() else ""
    return BudgetError(
        f"budget {raw!r} is {nominal:,} B per layer, less than one recurrent state "
        f"({r:,} B): no organization can hold a checkpoint{hint}"
    )


def parse_budget(text: str, units: Units) -> Budget:
    """A label ``bN`` (N >= 1), a byte count, a size such as ``96MiB``, or a total's label
    ``total SIZE`` (:func:`parse_total`)."""
    raw = str(text).strip()
    if raw.startswith(TOTAL_PREFIX):  # a total's label: the size is checked as --total's
        return parse_total(raw[len(TOTAL_PREFIX):], units)
    if len(raw) > MAX_TEXT:
        raise BudgetError(f"bad budget {raw[:20]!r}... ({len(raw)} characters)")
    if raw.startswith("-"):
        raise BudgetError(f"budget must be positive, got {text!r}")
    m = _LABEL_RE.match(raw)
    if m:
        n = int(m.group(1))
        if n <= 0:
            raise BudgetError(f"budget label must be b1 or larger, got {text!r}")
        if n * units.label_unit_bytes > MAX_BYTES:
            raise BudgetError(f"budget label {text!r} is over {MAX_BYTES:,} B")
        return Budget(raw, n * units.label_unit_bytes)
    if raw[:1].lower() == "b":
        raise BudgetError(f"bad budget label {text!r}: expected bN with N a positive integer")
    try:
        nominal = parse_size(raw)
    except BudgetError:
        raise BudgetError(
            f"bad budget {text!r}: expected a label bN (e.g. b63), a byte count, or a size "
            "such as 96MiB"
        ) from None
    if nominal < units.geometry.composite_bytes:  # `--budget 63` is a forgotten `b`
        raise _too_small(raw, nominal, units)
    return Budget(raw, nominal)


def parse_total(text: str, units: Units) -> Budget:
    """A whole-cache size (``12GiB``, bytes), all layers together, as :class:`Budget` labelled
    ``total SIZE`` (which :func:`parse_budget` reads back)."""
    total = parse_size(text)
    state_layers = units.geometry.n_state_layers
    return Budget(f"{TOTAL_PREFIX}{str(text).strip()}", total // state_layers, total)


def check_fraction(frac: float) -> Fraction:
    value = Fraction(str(frac))
    if not 0 < value < 1:
        raise BudgetError(f"attention fraction must lie in (0, 1), got {frac}")
    return value


def _round_half_up(x: Fraction) -> int:
    return floor(x + Fraction(1, 2))


@dataclass(frozen=True)
class SharedPlan:
    pages: int
    page_bytes: int

    @property
    def bytes(self) -> int:
        return self.pages * self.page_bytes


@dataclass(frozen=True)
class D0Plan:
    attention_units: int
    attention_unit_bytes: int
    recurrent_units: int
    recurrent_unit_bytes: int
    attention_fraction: float

    @property
    def attention_bytes(self) -> int:
        return self.attention_units * self.attention_unit_bytes

    @property
    def recurrent_bytes(self) -> int:
        return self.recurrent_units * self.recurrent_unit_bytes

    @property
    def bytes(self) -> int:
        return self.attention_bytes + self.recurrent_bytes


@dataclass(frozen=True)
class Plan:
    """Per-layer integer allocation of one nominal budget under each organization."""

    units: Units
    budget: Budget
    s0: SharedPlan
    s1: SharedPlan
    s2: SharedPlan
    d0: D0Plan | None  # None when no attention fraction is known for the model

    def org(self, name: str) -> SharedPlan | D0Plan | None:
        return {"S0": self.s0, "S1": self.s1, "S2": self.s2, "D0": self.d0}[name]

    def model_bytes(self, name: str) -> int:
        """Whole-model bytes of one organization (see the module docstring)."""
        geo = self.units.geometry
        if name == "D0":
            if self.d0 is None:
                raise BudgetError("D0 is not planned: no attention fraction for this model")
            return (self.d0.attention_bytes * geo.n_attention_layers
                    + self.d0.recurrent_bytes * geo.n_mamba_layers)
        return self.org(name).bytes * geo.n_state_layers  # type: ignore[union-attr]

    def empty_units(self, orgs: Iterable[str] = ("S0", "S1", "S2", "D0")) -> list[str]:
        """What a too-small budget leaves at zero in ``orgs``, with the size of one unit."""
        names = set(orgs)
        out = [f"{name} 0 pages (one is {sp.page_bytes:,} B)"
               for name, sp in (("S0", self.s0), ("S1", self.s1), ("S2", self.s2))
               if sp.pages == 0 and name in names]
        d = self.d0
        if d is not None and "D0" in names:
            f = d.attention_fraction
            if d.attention_units == 0:
                out.append(f"D0 0 attention units (one is {d.attention_unit_bytes:,} B of the "
                           f"attention share {f})")
            if d.recurrent_units == 0:
                out.append(f"D0 0 recurrent composites (one is {d.recurrent_unit_bytes:,} B of "
                           f"the recurrent share {1 - f:.6g})")
        return out

    def check_holds(self, orgs: Iterable[str] = ("S0", "S1", "S2", "D0")) -> Plan:
        """Refuse a plan in which any of ``orgs`` holds nothing of a kind of unit."""
        empty = self.empty_units(orgs)
        if empty:
            b = self.budget
            per = (f"total {b.total_bytes:,} B" if b.total_bytes is not None
                   else f"{b.nominal_bytes:,} B per layer")
            raise BudgetError(f"budget {b.label} ({per}) is too small: " + "; ".join(empty))
        return self

    def as_dict(self) -> dict[str, Any]:
        geo = self.units.geometry
        orgs: dict[str, Any] = {}
        for name, sp in (("S0", self.s0), ("S1", self.s1), ("S2", self.s2)):
            orgs[name] = {"pages": sp.pages, "page_bytes": sp.page_bytes, "bytes": sp.bytes,
                          "model_bytes": self.model_bytes(name)}
        if self.d0 is not None:
            d = self.d0
            orgs["D0"] = {
                "attention_units": d.attention_units,
                "attention_unit_bytes": d.attention_unit_bytes,
                "attention_bytes": d.attention_bytes,
                "recurrent_units": d.recurrent_units,
                "recurrent_unit_bytes": d.recurrent_unit_bytes,
                "recurrent_bytes": d.recurrent_bytes,
                "bytes": d.bytes,
                "model_attention_bytes": d.attention_bytes * geo.n_attention_layers,
                "model_recurrent_bytes": d.recurrent_bytes * geo.n_mamba_layers,
                "model_bytes": self.model_bytes("D0"),
                "attention_fraction": d.attention_fraction,
            }
        return {
            "model": geo.model,
            "budget": self.budget.label,
            "nominal_bytes": self.budget.nominal_bytes,
            "total_bytes": self.budget.total_bytes,
            "layers": geo.layers,
            "attention_layers": geo.n_attention_layers,
            "mamba_layers": geo.n_mamba_layers,
            "state_layers": geo.n_state_layers,
            "layout": geo.layout,
            "orgs": orgs,
        }


def _fraction(units: Units, attention_fraction: float | None) -> Fraction | None:
    frac = units.geometry.attention_fraction if attention_fraction is None else attention_fraction
    return None if frac is None else check_fraction(frac)


def plan_budget(units: Units, budget: Budget, attention_fraction: float | None = None) -> Plan:
    """Integer units of every organization for ``budget`` (per layer); a budget split from a
    whole-cache total is planned by :func:`plan_total`'s rules (rounding down)."""
    if budget.total_bytes is not None:
        return plan_total(units, budget, attention_fraction)
    nominal = Fraction(budget.nominal_bytes)
    if nominal <= 0:
        raise BudgetError(f"budget must be positive, got {budget.nominal_bytes} B")
    s0 = SharedPlan(_round_half_up(nominal / units.s0_page_bytes), units.s0_page_bytes)
    s1 = SharedPlan(_round_half_up(nominal / units.page_bytes), units.page_bytes)
    f = _fraction(units, attention_fraction)
    d0 = None if f is None else _d0_plan(units, f, nominal)
    return Plan(units, budget, s0, s1, SharedPlan(s1.pages, s1.page_bytes), d0)


def _d0_plan(units: Units, f: Fraction, per_layer: Fraction) -> D0Plan:
    """D0's two pools for a per-layer byte target: floor(f B / 16a) and floor((1 - f) B / r)."""
    return D0Plan(
        attention_units=floor(f * per_layer / units.d0_attn_unit_bytes),
        attention_unit_bytes=units.d0_attn_unit_bytes,
        recurrent_units=floor((1 - f) * per_layer / units.d0_recurrent_unit_bytes),
        recurrent_unit_bytes=units.d0_recurrent_unit_bytes,
        attention_fraction=float(f),
    )


def plan_total(units: Units, budget: Budget, attention_fraction: float | None = None) -> Plan:
    """Per-layer units of every organization whose whole-model bytes fit ``budget.total_bytes``
    (the split is in the module docstring); every count rounds down."""
    if budget.total_bytes is None or budget.total_bytes <= 0:
        raise BudgetError(f"{budget.label}: not a positive whole-cache total")
    geo = units.geometry
    total = Fraction(budget.total_bytes)
    shared = total / geo.n_state_layers
    s0 = SharedPlan(floor(shared / units.s0_page_bytes), units.s0_page_bytes)
    s1 = SharedPlan(floor(shared / units.page_bytes), units.page_bytes)
    f = _fraction(units, attention_fraction)
    d0 = None
    if f is not None:
        d0 = _d0_plan(units, f, total / (f * geo.n_attention_layers
                                         + (1 - f) * geo.n_mamba_layers))
    return Plan(units, budget, s0, s1, SharedPlan(s1.pages, s1.page_bytes), d0)
