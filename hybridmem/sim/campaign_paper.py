"""The paper's figures beside a campaign (``[[paper]]`` in a campaign TOML) and the verdict rule.

::

    [[paper]]
    ref = "§5.3; Table E-2"          # where the paper reports it
    what = "D0/S2 throughput, b63"   # one line for the report's table
    kind = "effect"                  # see KINDS
    contrast = "D0/S2"               # a declared [[contrast]] (effect, difference, interaction)
    where = {budget = "b63"}         # grid factors fixing the stratum (value: the arm)
    metric = "throughput_tok_s"      # a runs.parquet column
    value = 4.978                    # the paper's figure
    interval = [-0.1, 30.8]          # optional: the paper's interval
    tolerance = 5.0                  # reproduces within this many points (default 5)
    preemptions = 0                  # optional: the paper's preemptions per run (both arms)
    across = {share = [1.0, 0.0]}    # interaction: the factor and its (high, low) levels
    scale = "log"                    # effect / interaction: "pct" (mean of 100 (num/den - 1),
                                     # default) or "log" (100 (exp(mean ln(num/den)) - 1))
    reason = "..."                   # not_modelled: why the simulator cannot answer it

Kinds (the simulated figure and its interval at the spec's ``[stats] level``):

* ``effect``: seed-paired relative effect of the contrast in %, paired-t interval in log space
  (:func:`hybridmem.stats.contrast`).
* ``difference``: mean seedwise difference num - den of the metric (units of the metric), paired-t.
* ``interaction``: the contrast's seedwise effect at the high level of ``across`` minus at the
  low level (``pct``: percentage points; ``log``: ``100 (exp(mean(d_hi - d_lo)) - 1)``, the
  paper's K_ret), paired-t.
* ``value``: the arithmetic mean over the cells ``where`` selects (name the arm), t interval;
  the tolerance is in % of the value (in the metric's units when the paper's value is 0).
* ``within``: the contrast's interval must lie inside the paper's ``interval`` (a bound, like
  the trace probe check: 90% interval within +-3%).
* ``not_modelled``: the simulator cannot produce it; ``reason`` says why.
* ``simulated``: a contrast the paper has no figure for (stock vLLM arms): the effect is shown,
  the verdict is "not in the paper".

Verdicts (:func:`verdict`): **reproduces** (same sign, and inside the paper's interval or within
``tolerance`` of its value), **direction only** (same sign), **contradicts** (opposite sign and the
simulated interval excludes zero), **inconclusive** (opposite sign, interval includes zero);
for a paper figure of 0 and for values: **reproduces** within tolerance, else **differs**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hybridmem.errors import HybridMemError

KINDS = ("effect", "difference", "interaction", "value", "within", "not_modelled",
         "simulated")
VERDICTS = ("reproduces", "direction only", "contradicts", "inconclusive", "differs",
            "not modelled", "no data", "not in the paper")


@dataclass(frozen=True)
class PaperFigure:
    ref: str
    what: str
    kind: str
    contrast: str | None = None
    where: dict[str, Any] = field(default_factory=dict)
    metric: str = "throughput_tok_s"
    value: float | None = None
    interval: tuple[float, float] | None = None
    tolerance: float = 5.0
    preemptions: float | None = None
    across: tuple[str, Any, Any] | None = None   # (factor, high level, low level)
    scale: str = "pct"
    reason: str = ""


def parse_paper(raw: Any, where: str, contrasts: set[str]) -> tuple[PaperFigure, ...]:
    """``[[paper]]`` entries, checked (one-line HybridMemError naming the entry)."""
    from hybridmem.sim.campaign_spec import AXES

    if not isinstance(raw, list):
        raise HybridMemError(f"{where}: [[paper]] must be an array of tables")
    out = []
    known = {"ref", "what", "kind", "contrast", "where", "metric", "value", "interval",
             "tolerance", "preemptions", "across", "scale", "reason"}
    for i, e in enumerate(raw):
        name = f"{where}: paper #{i + 1}"
        if not isinstance(e, dict):
            raise HybridMemError(f"{name} must be a table")
        bad = set(e) - known
        if bad:
            raise HybridMemError(f"{name}: unknown keys {sorted(bad)}")
        kind = e.get("kind")
        if kind not in KINDS:
            raise HybridMemError(f"{name}: kind {kind!r} is not one of {KINDS}")
        if not isinstance(e.get("ref"), str) or not isinstance(e.get("what"), str):
            raise HybridMemError(f"{name} needs ref and what (strings)")
        sel = e.get("where", {})
        if not isinstance(sel, dict) or set(sel) - set(AXES):
            raise HybridMemError(f"{name}: where must set grid factors among {AXES}")
        if kind == "not_modelled":
            if not isinstance(e.get("reason"), str) or not e["reason"]:
                raise HybridMemError(f"{name}: not_modelled needs a reason")
        else:
            v = e.get("value")
            if kind not in ("within", "simulated") and (isinstance(v, bool)
                                                        or not isinstance(v, (int, float))):
                raise HybridMemError(f"{name}: value must be a number")
        if kind in ("effect", "difference", "interaction", "within", "simulated"):
            if e.get("contrast") not in contrasts:
                raise HybridMemError(f"{name}: contrast {e.get('contrast')!r} is not declared "
                                     f"(declared: {sorted(contrasts)})")
        interval = e.get("interval")
        if interval is not None:
            if (not isinstance(interval, list) or len(interval) != 2
                    or not all(isinstance(x, (int, float)) for x in interval)
                    or interval[0] > interval[1]):
                raise HybridMemError(f"{name}: interval must be [low, high]")
            interval = (float(interval[0]), float(interval[1]))
        if kind == "within" and interval is None:
            raise HybridMemError(f"{name}: within needs the paper's interval")
        across = e.get("across")
        if kind == "interaction":
            if (not isinstance(across, dict) or len(across) != 1
                    or next(iter(across)) not in AXES
                    or not isinstance(next(iter(across.values())), list)
                    or len(next(iter(across.values()))) != 2):
                raise HybridMemError(f"{name}: interaction needs across = {{factor = [high, "
                                     "low]}}")
            (factor, (hi, lo)), = across.items()
            across = (factor, hi, lo)
        scale = e.get("scale", "pct")
        if scale not in ("pct", "log"):
            raise HybridMemError(f"{name}: scale must be \"pct\" or \"log\"")
        tol = e.get("tolerance", 5.0)
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or tol < 0:
            raise HybridMemError(f"{name}: tolerance must be a number >= 0")
        pre = e.get("preemptions")
        if pre is not None and (isinstance(pre, bool) or not isinstance(pre, (int, float))):
            raise HybridMemError(f"{name}: preemptions must be a number")
        out.append(PaperFigure(
            ref=e["ref"], what=e["what"], kind=kind, contrast=e.get("contrast"),
            where=dict(sel), metric=str(e.get("metric", "throughput_tok_s")),
            value=None if e.get("value") is None else float(e["value"]), interval=interval,
            tolerance=float(tol), preemptions=None if pre is None else float(pre),
            across=across, scale=scale, reason=str(e.get("reason", ""))))
    return tuple(out)


def verdict(kind: str, paper: float | None, sim: float | None,
            sim_ci: tuple[float, float] | None, tolerance: float,
            paper_interval: tuple[float, float] | None = None) -> str:
    """The verdict of one simulated figure against the paper's (module docstring)."""
    if kind == "not_modelled":
        return "not modelled"
    if kind == "simulated":
        return "not in the paper"
    if sim is None or not math.isfinite(sim):
        return "no data"
    if kind == "within":
        assert paper_interval is not None
        lo, hi = sim_ci if sim_ci is not None else (sim, sim)
        return ("reproduces" if paper_interval[0] <= lo and hi <= paper_interval[1]
                else "differs")
    assert paper is not None
    if kind == "value":
        if paper == 0:
            return "reproduces" if abs(sim) <= tolerance else "differs"
        return "reproduces" if abs(100 * (sim / paper - 1)) <= tolerance else "differs"
    if paper == 0:
        return "reproduces" if abs(sim) <= tolerance else "differs"
    if sim != 0 and (sim > 0) == (paper > 0):
        inside = paper_interval is not None and paper_interval[0] <= sim <= paper_interval[1]
        return "reproduces" if inside or abs(sim - paper) <= tolerance else "direction only"
    excludes_zero = sim_ci is not None and (sim_ci[0] > 0 or sim_ci[1] < 0)
    return "contradicts" if excludes_zero else "inconclusive"
