"""Campaign specs (TOML): a grid of simulated runs and the paired contrasts read from it.

::

    [campaign]                      # fixed for every cell
    name = "q1-exp1a"
    model = "falcon-h1-7b"          # preset, config.json or model directory
    device = "a100-40gb"
    requests = 300
    max_model_len = 8192            # optional (8192)
    system_prompt_tokens = [300, 1200]  # optional: per-context shared prefix S_c ~ U{lo..hi},
                                    # P_i = min(q L_i, S_c) (hybridmem.workload)

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
    chunking = ["default"]          # prefill split: "default" or names in schedulers.CHUNKINGS;
                                    # every arm of a contrast gets the same split unless the
                                    # contrast sets chunking itself
    trace = [false]                 # true: the cell writes its trace and lineage.json
    seeds = {start = 42000, count = 12}     # or a list

    # [[grid]] tables instead of one [grid]: the union of their products (for designs that
    # are not one product, like b63/cap 63 beside b108/cap 109)

    [cost]                          # optional cost-constant overrides (hybridmem sim --cost)
    mfu = 0.55

    [[contrast]]                    # seed-paired num/den, within every other grid factor
    name = "S1/S0"
    num = {org = "S1"}
    den = {org = "S0"}

    [[paper]]                       # the paper's figure this campaign is read against
    ...                             # (hybridmem.sim.campaign_paper; campaign report)

    [stats]
    metrics = ["throughput_tok_s"]  # summary keys tested (a log ratio needs positive values)
    level = 0.95                    # paired-t interval level; Holm runs over every test
                                    # (contrast x stratum x metric): the declared family

``org = "vllm"`` (vLLM's own manager) takes no headroom or retention (refused) and no pinning:
its cells keep the grid's ``pin_k`` for pairing but run without it (summary.json: pin_k null).

A cell's id is a digest of its parameters, so a cell keeps its directory (and its result) when
the spec grows: ``hybridmem campaign`` reruns nothing that finished.

Validation is hand-written rather than a pydantic model, for three reasons. pydantic is not a
declared dependency (it arrives only with vLLM's locked set, not with the project or its
``campaign`` extra). The checks that make a spec safe are not per-field types: a seed range is
bounded arithmetically before any list is built, the grid's product is bounded before any cell
is built, ``org = "vllm"`` refuses headroom and retention across fields, and ``preflight`` runs
the model, budget and ``SimConfig.check`` a cell would run; a model would keep all of these as
custom validators. And what it would replace (the type and range checks of ``_num``, the
boolean axes, the unknown-key checks: about 40 lines) names the value and its allowed range in
one line, where a ``ValidationError`` prints a multi-line report whose text would have to be
re-formatted into the same line anyway.
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
from hybridmem.geometry import ATTENTION_FRACTION_RANGE
from hybridmem.inputs import read_input_text

AXES = ("org", "budget", "rate", "cap", "headroom", "pin_k", "retention", "share", "isolate",
        "chunking", "trace")
# axes added after campaigns were kept: left out of a cell's id at their default, so a kept
# cell keeps its directory
LATE_AXES = {"chunking": None, "trace": False}
FIXED = ("name", "model", "device", "requests", "max_model_len", "grid", "attention_fraction",
         "question", "system_prompt_tokens")
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
    chunking: str | None = None   # prefill split (schedulers.CHUNKINGS); None: the seam's default
    trace: bool = False           # write the trace and its lineage summary

    @property
    def params(self) -> dict[str, Any]:
        """Every parameter (what a worker gets and a runs.parquet row holds)."""
        return asdict(self)

    @property
    def id_params(self) -> dict[str, Any]:
        """The parameters a cell id digests: late axes only when set."""
        return {k: v for k, v in asdict(self).items()
                if not (k in LATE_AXES and v == LATE_AXES[k])}

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
    question: str | None = None   # "Q1".."Q9": the paper's question (Table 2) it answers
    paper: tuple[Any, ...] = ()   # campaign_paper.PaperFigure: the paper's figures beside it
    system_prompt_tokens: tuple[int, int] | None = None  # workload: per-context prefix range

    def cell_id(self, cell: Cell) -> str:
        fixed: dict[str, Any] = {"model": self.model, "device": self.device,
                                 "requests": self.requests, "max_model_len": self.max_model_len,
                                 "cost": self.cost}
        if self.grid is not None:
            fixed["grid"] = self.grid
        if self.attention_fraction is not None:
            fixed["attention_fraction"] = self.attention_fraction
        if self.system_prompt_tokens is not None:
            fixed["system_prompt_tokens"] = list(self.system_prompt_tokens)
        key = {"fixed": fixed,
               "cell": cell.id_params}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        return f"{cell.org}-{cell.budget}-s{cell.seed}-{digest}"


def _list(v: Any, name: str) -> list[Any]:
    out = v if isinstance(v, list) else [v]
    if not out:
        raise HybridMemError(f"grid.{name} is empty")
    return out


def _seeds(v: Any, limit: int = MAX_CELLS) -> list[int]:
    """The seed list; a ``{start, count}`` range is checked arithmetically (integers, within
    [0, 2^32) and at most ``limit`` seeds) before any list is built."""
    if isinstance(v, dict):
        start, count = v.get("start"), v.get("count")
        if set(v) != {"start", "count"} or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in (start, count)):
            raise HybridMemError(f"grid.seeds {v!r}: expected {{start = S, count = N}} with "
                                 "integers S and N")
        assert isinstance(start, int) and isinstance(count, int)
        if count < 1:
            raise HybridMemError(f"grid.seeds count must be >= 1, got {count}")
        if count > limit:
            raise HybridMemError(f"grid.seeds count {count} exceeds the limit of {limit} "
                                 "cells")
        if not 0 <= start or start + count > 2**32:
            raise HybridMemError(f"grid.seeds {{start = {start}, count = {count}}} leaves "
                                 "[0, 2^32)")
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


def _grid_cells(grid: Any, where: str, limit: int = MAX_CELLS) -> list[Cell]:
    """Every combination of one ``[grid]`` table's values (scalars count as one value); the
    count is checked against ``limit`` before any cell is built."""
    if not isinstance(grid, dict):
        raise HybridMemError(f"{where}: a [grid] must be a table")
    bad = set(grid) - set(AXES) - {"seeds"}
    if bad:
        raise HybridMemError(f"{where}: unknown [grid] keys {sorted(bad)}; known "
                             f"{(*AXES, 'seeds')}")
    if "seeds" not in grid:
        raise HybridMemError(f"{where}: [grid] needs seeds")
    from hybridmem.sim import schedulers as sim_orgs

    orgs = [str(o) for o in _list(grid.get("org", "vllm"), "org")]
    for o in orgs:
        if o not in sim_orgs.ORGS:
            raise HybridMemError(f"grid.org: unknown organization {o!r}; expected "
                                 f"{sim_orgs.ORGS}")
    budgets = _list(grid.get("budget", "b63"), "budget")
    for b in budgets:
        if not isinstance(b, str) or not b.strip():
            raise HybridMemError(f"grid.budget: {b!r} must be a string: a label like \"b63\", "
                                 "a byte count, a size like \"96MiB\" (per layer) or a "
                                 "whole-cache total like \"total 12GiB\"")
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
    traces = _list(grid.get("trace", False), "trace")
    for name, vals in (("retention", rets), ("isolate", isos), ("trace", traces)):
        if any(not isinstance(v, bool) for v in vals):
            raise HybridMemError(f"grid.{name}: values must be true or false, got {vals}")
    shares = [_num(q, "share", 0.0, 1.0) for q in _list(grid.get("share", 0.5), "share")]
    chunkings = [_chunking(c) for c in _list(grid.get("chunking", "default"), "chunking")]
    seeds = _seeds(grid["seeds"], limit)
    n = (len(orgs) * len(budgets) * len(rates) * len(caps) * len(heads) * len(pins)
         * len(rets) * len(shares) * len(isos) * len(chunkings) * len(traces) * len(seeds))
    if n > limit:
        raise HybridMemError(f"{where}: {n} cells exceed the limit of {MAX_CELLS}")
    if "vllm" in orgs and (any(h for h in heads) or any(rets)):
        raise HybridMemError(f"{where}: org \"vllm\" (vLLM's own manager) has no admission "
                             "headroom or retention: give its grid headroom = 0 and "
                             "retention = false")
    return [Cell(o, b, float(r), c, float(h), k, bool(rt), float(q), bool(i), s, ch, bool(t))
            for o, b, r, c, h, k, rt, q, i, ch, t, s in itertools.product(
                orgs, budgets, rates, caps, heads, pins, rets, shares, isos, chunkings, traces,
                seeds)]


def _chunking(v: Any) -> str | None:
    """A prefill-split name: ``"default"`` (the key omitted) or one of ``schedulers.CHUNKINGS``."""
    if v == "default":
        return None
    from hybridmem.sim import schedulers

    names = getattr(schedulers, "CHUNKINGS", None)
    if names is None:
        raise HybridMemError(f"grid.chunking: {v!r}: this build names no prefill splits "
                             "(hybridmem.sim.schedulers.CHUNKINGS); omit the key")
    if not isinstance(v, str) or v not in names:
        raise HybridMemError(f"grid.chunking: {v!r} is not a prefill split; expected one of "
                             f"{tuple(names)}")
    return v


def load_spec(path: str | Path) -> CampaignSpec:
    """Parse and check a campaign TOML (one-line HybridMemError on any bad value)."""
    p = Path(path)
    try:
        raw = tomllib.loads(read_input_text(p, "campaign spec"))
    except FileNotFoundError:
        raise HybridMemError(f"campaign spec {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise HybridMemError(f"cannot read campaign spec {str(p)!r}: {exc}") from None
    unknown = set(raw) - {"campaign", "grid", "cost", "contrast", "stats", "paper"}
    if unknown:
        raise HybridMemError(f"{p.name}: unknown tables {sorted(unknown)}")
    camp = raw.get("campaign", {})
    bad = set(camp) - set(FIXED)
    if bad:
        raise HybridMemError(f"{p.name}: unknown [campaign] keys {sorted(bad)}; known {FIXED}")
    grids = raw.get("grid", {})
    grids = grids if isinstance(grids, list) else [grids]
    if not grids:
        raise HybridMemError(f"{p.name}: [[grid]] is empty")
    # several [[grid]] tables: the union of their products (a cell listed twice runs once);
    # the running total bounds what is built, not only each table
    built: list[Cell] = []
    for i, g in enumerate(grids):
        built += _grid_cells(g, p.name if len(grids) == 1 else f"{p.name} grid #{i + 1}",
                             MAX_CELLS - len(built))
    cells = tuple(dict.fromkeys(built))
    if len(cells) > MAX_CELLS:
        raise HybridMemError(f"{p.name}: {len(cells)} cells exceed the limit of {MAX_CELLS}")
    from hybridmem.sim.devices import DEVICES

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
        frac = float(_num(frac, "attention_fraction", *ATTENTION_FRACTION_RANGE))
    model = camp.get("model", "falcon-h1-7b")
    if not isinstance(model, str) or not model.strip():
        raise HybridMemError(f"campaign.model: {model!r} must be a preset name or a path")
    name = camp.get("name", p.stem)
    if not isinstance(name, str) or not name.strip():
        raise HybridMemError(f"campaign.name: {name!r} must be a non-empty string")
    system = _system_prompt(camp.get("system_prompt_tokens"), p.name)
    cost = raw.get("cost", {})
    from hybridmem.sim.cost import CostConstants

    if not isinstance(cost, dict):
        raise HybridMemError(f"{p.name}: [cost] must be a table")
    for k, v in cost.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise HybridMemError(f"{p.name}: cost.{k} = {v!r} is not a finite number")
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
    question = camp.get("question")
    if question is not None and not isinstance(question, str):
        raise HybridMemError(f"{p.name}: campaign.question must be a string like \"Q4\"")
    from hybridmem.sim.campaign_paper import parse_paper

    paper = parse_paper(raw.get("paper", []), p.name, {c.name for c in contrasts})
    spec = CampaignSpec(name=name, model=model, device=device, requests=requests, max_model_len=mml,
                        cells=cells, cost={k: float(v) for k, v in cost.items()},
                        contrasts=tuple(contrasts), metrics=metrics, level=float(level),
                        grid=grid, attention_fraction=frac, question=question, paper=paper,
                        system_prompt_tokens=system)
    preflight(spec, p.name)
    return spec


def preflight(spec: CampaignSpec, where: str) -> None:
    """Every check a cell's run would make before its work, made once per distinct cell setting
    here, so a bad spec fails in one line before any worker starts: the model resolves, every
    budget parses for it, D0 has an attention fraction, every cell's settings pass
    ``SimConfig.check``."""
    from hybridmem.budget import parse_budget
    from hybridmem.sim.model_shape import load_shape
    from hybridmem.sim.run import SimConfig
    from hybridmem.units import derive_units

    shape = load_shape(spec.model)
    units = derive_units(shape.geometry)
    for budget in dict.fromkeys(c.budget for c in spec.cells):
        try:
            parse_budget(budget, units)
        except HybridMemError as exc:
            raise HybridMemError(f"{where}: grid.budget {budget!r}: {exc}") from None
    if (spec.attention_fraction is None and shape.geometry.attention_fraction is None
            and any(c.org == "D0" for c in spec.cells)):
        raise HybridMemError(f"{where}: org D0 needs campaign.attention_fraction: model "
                             f"{spec.model!r} has no preset attention fraction")
    seen: set[tuple[Any, ...]] = set()
    for c in spec.cells:
        key = tuple(c.stratum.values())
        if key in seen:
            continue
        seen.add(key)
        try:
            SimConfig(model=spec.model, device=spec.device, org=c.org, budget=c.budget,
                      requests=spec.requests, rate=c.rate, share=c.share, seed=c.seed,
                      cap=c.cap, headroom=c.headroom,
                      pin_k=None if c.org == "vllm" else c.pin_k, retention=c.retention,
                      isolate=c.isolate, grid=spec.grid,
                      attention_fraction=spec.attention_fraction, chunking=c.chunking,
                      max_model_len=spec.max_model_len, constants=spec.cost,
                      system_prompt=spec.system_prompt_tokens).check()
        except HybridMemError as exc:
            raise HybridMemError(f"{where}: cell {spec.cell_id(c)}: {exc}") from None


def _system_prompt(v: Any, name: str) -> tuple[int, int] | None:
    """``[campaign] system_prompt_tokens = [lo, hi]`` checked (None when absent)."""
    if v is None:
        return None
    if (not isinstance(v, list) or len(v) != 2
            or any(not isinstance(x, int) or isinstance(x, bool) for x in v)
            or not 1 <= v[0] <= v[1] <= 1 << 20):
        raise HybridMemError(f"{name}: campaign.system_prompt_tokens {v!r} must be [lo, hi], "
                             "integers with 1 <= lo <= hi")
    return int(v[0]), int(v[1])
