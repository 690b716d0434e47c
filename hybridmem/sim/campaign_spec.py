"""Campaign specs (TOML): a grid of simulated runs and the paired contrasts read from it.

::

    [campaign]                      # fixed for every cell
    name = "q1-exp1a"
    model = "falcon-h1-7b"          # preset, config.json or model directory
    device = "a100-40gb"
    requests = 300
    max_model_len = 8192            # optional (8192)

    [grid]                          # every combination is one cell; scalars count as one value
    org = ["S0", "S1", "S2"]
    budget = ["b63", "b83", "b108"]
    rate = [3.0]
    cap = [63]
    headroom = [0.0]
    pin_k = ["off"]                 # "off" or 1, 2, 3
    retention = [false]
    share = [0.5]
    isolate = [false]
    seeds = {start = 42000, count = 12}     # or a list

    [cost]                          # optional cost-constant overrides (hybridmem sim --cost)
    mfu = 0.55

    [[contrast]]                    # seed-paired num/den, within every other grid factor
    name = "S1/S0"
    num = {org = "S1"}
    den = {org = "S0"}

    [stats]
    metrics = ["throughput_tok_s"]  # summary keys tested (a log ratio needs positive values)
    level = 0.95                    # paired-t interval level; Holm runs over every test
                                    # (contrast x stratum x metric): the declared family

A cell's id is a digest of its parameters, so a cell keeps its directory (and its result) when
the spec grows: ``hybridmem campaign`` reruns nothing that finished.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hybridmem.errors import HybridMemError

AXES = ("org", "budget", "rate", "cap", "headroom", "pin_k", "retention", "share", "isolate")
FIXED = ("name", "model", "device", "requests", "max_model_len", "grid", "attention_fraction")
MAX_CELLS = 20_000


@dataclass(frozen=True)
class Cell:
    org: str
    budget: str
    rate: float
    cap: int
    headroom: float
    pin_k: int | None
    retention: bool
    share: float
    isolate: bool
    seed: int

    @property
    def params(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def stratum(self) -> dict[str, Any]:
        """Every parameter but the seed."""
        return {k: v for k, v in asdict(self).items() if k != "seed"}


@dataclass(frozen=True)
class Contrast:
    name: str
    num: dict[str, Any]
    den: dict[str, Any]


@dataclass(frozen=True)
class CampaignSpec:
    name: str
    model: str
    device: str
    requests: int
    max_model_len: int
    cells: tuple[Cell, ...]
    grid: int | None = None
    attention_fraction: float | None = None
    cost: dict[str, float] = field(default_factory=dict)
    contrasts: tuple[Contrast, ...] = ()
    metrics: tuple[str, ...] = ("throughput_tok_s",)
    level: float = 0.95

    def cell_id(self, cell: Cell) -> str:
        fixed: dict[str, Any] = {"model": self.model, "device": self.device,
                                 "requests": self.requests, "max_model_len": self.max_model_len,
                                 "cost": self.cost}
        if self.grid is not None:
            fixed["grid"] = self.grid
        if self.attention_fraction is not None:
            fixed["attention_fraction"] = self.attention_fraction
        key = {"fixed": fixed,
               "cell": cell.params}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        return f"{cell.org}-{cell.budget}-s{cell.seed}-{digest}"


def _list(v: Any, name: str) -> list[Any]:
    out = v if isinstance(v, list) else [v]
    if not out:
        raise HybridMemError(f"grid.{name} is empty")
    return out


def _seeds(v: Any) -> list[int]:
    if isinstance(v, dict):
        try:
            start, count = int(v["start"]), int(v["count"])
        except (KeyError, TypeError, ValueError):
            raise HybridMemError(f"grid.seeds {v!r}: expected {{start = S, count = N}}") from None
        if count < 1:
            raise HybridMemError(f"grid.seeds count must be >= 1, got {count}")
        seeds = list(range(start, start + count))
    else:
        seeds = _list(v, "seeds")
    for s in seeds:
        if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < 2**32:
            raise HybridMemError(f"grid.seeds: {s!r} is not an integer in [0, 2^32)")
    if len(set(seeds)) != len(seeds):
        raise HybridMemError("grid.seeds has duplicates")
    return seeds


def _num(v: Any, name: str, lo: float, hi: float, integer: bool = False) -> Any:
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not math.isfinite(v) or not lo <= v <= hi:
        kind = "an integer" if integer else "a finite number"
        raise HybridMemError(f"grid.{name}: {v!r} must be {kind} in [{lo}, {hi}]")
    return v


def load_spec(path: str | Path) -> CampaignSpec:
    """Parse and check a campaign TOML (one-line HybridMemError on any bad value)."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise HybridMemError(f"campaign spec {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise HybridMemError(f"cannot read campaign spec {str(p)!r}: {exc}") from None
    unknown = set(raw) - {"campaign", "grid", "cost", "contrast", "stats"}
    if unknown:
        raise HybridMemError(f"{p.name}: unknown tables {sorted(unknown)}")
    camp, grid = raw.get("campaign", {}), raw.get("grid", {})
    bad = set(camp) - set(FIXED)
    if bad:
        raise HybridMemError(f"{p.name}: unknown [campaign] keys {sorted(bad)}; known {FIXED}")
    bad = set(grid) - set(AXES) - {"seeds"}
    if bad:
        raise HybridMemError(f"{p.name}: unknown [grid] keys {sorted(bad)}; known "
                             f"{(*AXES, 'seeds')}")
    if "seeds" not in grid:
        raise HybridMemError(f"{p.name}: [grid] needs seeds")
    from hybridmem.sim.devices import DEVICES
    from hybridmem.sim.orgs import ORGS

    orgs = [str(o) for o in _list(grid.get("org", "vllm"), "org")]
    for o in orgs:
        if o not in ORGS:
            raise HybridMemError(f"grid.org: unknown organization {o!r}; expected {ORGS}")
    budgets = [str(b) for b in _list(grid.get("budget", "b63"), "budget")]
    rates = [_num(r, "rate", 1e-6, 1e6) for r in _list(grid.get("rate", 3.0), "rate")]
    caps = [_num(c, "cap", 1, 4096, True) for c in _list(grid.get("cap", 63), "cap")]
    heads = [_num(h, "headroom", 0.0, 0.999) for h in _list(grid.get("headroom", 0.0),
                                                            "headroom")]
    pins: list[int | None] = []
    for k in _list(grid.get("pin_k", "off"), "pin_k"):
        if k == "off":
            pins.append(None)
        elif k in (1, 2, 3) and not isinstance(k, bool):
            pins.append(int(k))
        else:
            raise HybridMemError(f"grid.pin_k: {k!r} must be \"off\", 1, 2 or 3")
    rets = _list(grid.get("retention", False), "retention")
    isos = _list(grid.get("isolate", False), "isolate")
    for name, vals in (("retention", rets), ("isolate", isos)):
        if any(not isinstance(v, bool) for v in vals):
            raise HybridMemError(f"grid.{name}: values must be true or false, got {vals}")
    shares = [_num(q, "share", 0.0, 1.0) for q in _list(grid.get("share", 0.5), "share")]
    seeds = _seeds(grid["seeds"])
    n = (len(orgs) * len(budgets) * len(rates) * len(caps) * len(heads) * len(pins)
         * len(rets) * len(shares) * len(isos) * len(seeds))
    if n > MAX_CELLS:
        raise HybridMemError(f"{p.name}: {n} cells exceed the limit of {MAX_CELLS}")
    cells = tuple(Cell(o, b, float(r), c, float(h), k, bool(rt), float(q), bool(i), s)
                  for o, b, r, c, h, k, rt, q, i, s in itertools.product(
                      orgs, budgets, rates, caps, heads, pins, rets, shares, isos, seeds))
    device = str(camp.get("device", "a100-40gb"))
    if device not in DEVICES:
        raise HybridMemError(f"campaign.device: unknown {device!r}; expected {sorted(DEVICES)}")
    requests = _num(camp.get("requests", 300), "requests", 1, 100_000, True)
    mml = _num(camp.get("max_model_len", 8192), "max_model_len", 64, 1 << 20, True)
    grid = camp.get("grid")
    if grid is not None:
        grid = _num(grid, "grid", 16, 65536, True)
        if grid % 16:
            raise HybridMemError(f"campaign.grid {grid} is not a multiple of 16 tokens")
    frac = camp.get("attention_fraction")
    if frac is not None:
        frac = float(_num(frac, "attention_fraction", 1e-9, 1 - 1e-9))
    cost = raw.get("cost", {})
    from hybridmem.sim.cost import CostConstants

    if not isinstance(cost, dict):
        raise HybridMemError(f"{p.name}: [cost] must be a table")
    CostConstants().with_values(**{k: float(v) for k, v in cost.items()})
    contrasts = []
    for i, c in enumerate(raw.get("contrast", [])):
        if not isinstance(c, dict) or not {"name", "num", "den"} <= set(c):
            raise HybridMemError(f"{p.name}: contrast #{i + 1} needs name, num and den")
        for side in ("num", "den"):
            if not isinstance(c[side], dict) or not c[side] or set(c[side]) - set(AXES):
                raise HybridMemError(f"{p.name}: contrast {c['name']!r}: {side} must set grid "
                                     f"factors among {AXES}, got {c[side]!r}")
        if set(c["num"]) != set(c["den"]):
            raise HybridMemError(f"{p.name}: contrast {c['name']!r}: num and den must set the "
                                 "same factors")
        contrasts.append(Contrast(str(c["name"]), dict(c["num"]), dict(c["den"])))
    stats = raw.get("stats", {})
    metrics = tuple(str(m) for m in _list(stats.get("metrics", ["throughput_tok_s"]),
                                          "metrics"))
    level = _num(stats.get("level", 0.95), "level", 0.5, 0.9999)
    return CampaignSpec(name=str(camp.get("name", p.stem)), model=str(camp.get("model",
                        "falcon-h1-7b")), device=device, requests=requests, max_model_len=mml,
                        cells=cells, cost={k: float(v) for k, v in cost.items()},
                        contrasts=tuple(contrasts), metrics=metrics, level=float(level),
                        grid=grid, attention_fraction=frac)
