"""Trace probe-effect check (SPEC §6, §4.5, Table C-3): does tracing change throughput?

Trace-ON and trace-OFF runs are paired by workload seed. For each pair::

    e(s) = 100 ln(ON_s / OFF_s)          (log points; ~ percent for small effects)

The check passes when the two-sided 90% paired-t interval of mean e (df = n - 1) lies inside
[-3, +3]. The interval is in log points, not back-transformed: 100 ln(1.03) = 2.96 and
100 ln(0.97) = -3.05, so the bound is symmetric in log space as the rule states.

A run directory holds ``summary.json`` (written by ``hybridmem run``) with at least::

    {"seed": 7, "trace": true, "throughput_tok_s": 412.5, "throughput_ledger_tok_s": 398.1}

``throughput_tok_s`` is completed output tokens over the request span (the default metric);
``throughput_ledger_tok_s`` is over the ledger interval; ``throughput_cpu_tok_s`` (in-process
driver only) over the CPU seconds the run's process spent in that interval, every thread counted
(the trace flusher too): a diagnostic for shared machines, where other tenants move wall-clock
time, not the SPEC metric.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from hybridmem.errors import HybridMemError
from hybridmem.inputs import read_input_text
from hybridmem.stats import StatsError, TInterval, paired_t_interval

SUMMARY_FILE = "summary.json"
DEFAULT_METRIC = "throughput_tok_s"
METRICS = ("throughput_tok_s", "throughput_ledger_tok_s", "throughput_cpu_tok_s")
LEVEL = 0.90
BOUND = 3.0


class FidelityError(HybridMemError):
    """Run directories that cannot be paired or read (CLI exit 2)."""


class RunSummary(NamedTuple):
    path: Path
    seed: int
    trace: bool
    value: float  # the chosen throughput metric, tokens/s


class FidelityPair(NamedTuple):
    seed: int
    on: float
    off: float
    effect: float  # 100 ln(on / off)


class FidelityResult(NamedTuple):
    metric: str
    pairs: tuple[FidelityPair, ...]
    interval: TInterval   # of the effects, in log points
    bound: float
    passed: bool

    def as_dict(self) -> dict[str, Any]:
        iv = self.interval
        return {
            "metric": self.metric, "n": iv.n, "level": iv.level, "bound": self.bound,
            "mean_log_points": iv.mean, "interval_log_points": [iv.low, iv.high],
            "verdict": "PASS" if self.passed else "FAIL",
            "pairs": [p._asdict() for p in self.pairs],
        }


def read_summary(run_dir: str | Path, metric: str = DEFAULT_METRIC) -> RunSummary:
    """The seed, trace flag and ``metric`` of one run directory."""
    d = Path(run_dir)
    f = d / SUMMARY_FILE
    if not f.is_file():
        raise FidelityError(f"{str(d)!r} holds no {SUMMARY_FILE}")
    try:
        data = json.loads(read_input_text(f, "run summary"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FidelityError(f"cannot read {str(f)!r}: {exc}") from None
    except RecursionError:
        raise FidelityError(f"cannot read {str(f)!r}: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise FidelityError(f"{str(f)!r} is not a JSON object")
    seed, trace, value = data.get("seed"), data.get("trace"), data.get(metric)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise FidelityError(f"{str(f)!r}: 'seed' must be an integer, got {seed!r}")
    if not isinstance(trace, bool):
        raise FidelityError(f"{str(f)!r}: 'trace' must be true or false, got {trace!r}")
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not (value > 0 and math.isfinite(value))):
        raise FidelityError(f"{str(f)!r}: {metric!r} must be a positive number, got {value!r}")
    return RunSummary(path=d, seed=seed, trace=trace, value=float(value))


def _by_seed(runs: Iterable[RunSummary], side: str, trace: bool) -> dict[int, RunSummary]:
    out: dict[int, RunSummary] = {}
    for r in runs:
        if r.trace is not trace:
            raise FidelityError(f"--{side} run {str(r.path)!r} has trace={str(r.trace).lower()}")
        if r.seed in out:
            raise FidelityError(f"--{side} has seed {r.seed} twice: {str(out[r.seed].path)!r} "
                                f"and {str(r.path)!r}")
        out[r.seed] = r
    return out


def pair_runs(on: Iterable[RunSummary], off: Iterable[RunSummary]) -> tuple[FidelityPair, ...]:
    """ON/OFF pairs by seed; every seed must appear exactly once on each side."""
    on_s, off_s = _by_seed(on, "on", True), _by_seed(off, "off", False)
    if set(on_s) != set(off_s):
        raise FidelityError(f"runs are not paired by seed: ON only {sorted(set(on_s) - set(off_s))}"
                            f", OFF only {sorted(set(off_s) - set(on_s))}")
    return tuple(
        FidelityPair(seed=s, on=on_s[s].value, off=off_s[s].value,
                     effect=100.0 * math.log(on_s[s].value / off_s[s].value))
        for s in sorted(on_s))


def check_pairs(pairs: Iterable[FidelityPair], *, metric: str = DEFAULT_METRIC,
                level: float = LEVEL, bound: float = BOUND) -> FidelityResult:
    """Apply the rule: the paired-t interval of ``100 ln(ON/OFF)`` inside ``[-bound, +bound]``."""
    if not (bound > 0 and math.isfinite(bound)):
        raise FidelityError(f"bound must be a positive number of log points, got {bound}")
    pairs = tuple(pairs)
    try:
        iv = paired_t_interval([p.effect for p in pairs], level)
    except StatsError as exc:
        raise FidelityError(f"fidelity check: {exc}") from None
    return FidelityResult(metric=metric, pairs=pairs, interval=iv, bound=bound,
                          passed=(-bound <= iv.low and iv.high <= bound))


def fidelity(on_dirs: Iterable[str | Path], off_dirs: Iterable[str | Path], *,
             metric: str = DEFAULT_METRIC, level: float = LEVEL,
             bound: float = BOUND) -> FidelityResult:
    """Read, pair and check trace-ON against trace-OFF run directories."""
    on = [read_summary(d, metric) for d in on_dirs]
    off = [read_summary(d, metric) for d in off_dirs]
    return check_pairs(pair_runs(on, off), metric=metric, level=level, bound=bound)
