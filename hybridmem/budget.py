"""Budget labels and the integer allocation planner (SPEC §4, App. B.3, Table B-2).

A label ``bN`` is a nominal byte target of ``N x u x a`` bytes per layer (1,605,632 B per unit for
Falcon-H1-7B). Each organization turns the nominal target into whole units of its own:

    S0     round(nominal / s0_page)                                    (b63 -> 63 pages)
    S1/S2  round(nominal / P)                                          (b63 -> 193 pages)
    D0     floor(frac x nominal / 16a) attention units,                (b63 -> 3,256)
           floor((1 - frac) x nominal / r) recurrent composites        (b63 -> 29)

Rounding is half-up and all arithmetic is exact (``Fraction``), so the planner never depends on
binary floating point; ``frac`` is taken at its decimal value (0.527383 for Falcon-H1-7B).
Whole-model bytes multiply the per-layer figures by the layer count.
"""

from __future__ import annotations

import re
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
    nominal_bytes: int


def parse_budget(text: str, units: Units) -> Budget:
    """A label ``bN`` (N >= 1), a byte count, or a size such as ``96MiB``."""
    raw = str(text).strip()
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
        return Budget(raw, parse_size(raw))
    except BudgetError:
        raise BudgetError(
            f"bad budget {text!r}: expected a label bN (e.g. b63), a byte count, or a size "
            "such as 96MiB"
        ) from None


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

    def as_dict(self) -> dict[str, Any]:
        layers = self.units.geometry.layers
        orgs: dict[str, Any] = {}
        for name, sp in (("S0", self.s0), ("S1", self.s1), ("S2", self.s2)):
            orgs[name] = {"pages": sp.pages, "page_bytes": sp.page_bytes, "bytes": sp.bytes,
                          "model_bytes": sp.bytes * layers}
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
                "model_bytes": d.bytes * layers,
                "attention_fraction": d.attention_fraction,
            }
        return {
            "model": self.units.geometry.model,
            "budget": self.budget.label,
            "nominal_bytes": self.budget.nominal_bytes,
            "layers": layers,
            "orgs": orgs,
        }


def plan_budget(units: Units, budget: Budget, attention_fraction: float | None = None) -> Plan:
    """Integer units of every organization for ``budget`` (per layer)."""
    nominal = Fraction(budget.nominal_bytes)
    if nominal <= 0:
        raise BudgetError(f"budget must be positive, got {budget.nominal_bytes} B")
    s0 = SharedPlan(_round_half_up(nominal / units.s0_page_bytes), units.s0_page_bytes)
    s1 = SharedPlan(_round_half_up(nominal / units.page_bytes), units.page_bytes)
    frac = attention_fraction
    if frac is None:
        frac = units.geometry.attention_fraction
    d0 = None
    if frac is not None:
        f = check_fraction(frac)
        d0 = D0Plan(
            attention_units=floor(f * nominal / units.d0_attn_unit_bytes),
            attention_unit_bytes=units.d0_attn_unit_bytes,
            recurrent_units=floor((1 - f) * nominal / units.d0_recurrent_unit_bytes),
            recurrent_unit_bytes=units.d0_recurrent_unit_bytes,
            attention_fraction=float(f),
        )
    return Plan(units, budget, s0, s1, SharedPlan(s1.pages, s1.page_bytes), d0)
