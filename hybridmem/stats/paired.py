"""Seed-paired contrasts: log ratios, relative effects, paired-t interval, sign-flip p.

Estimands (§4.1, App. B.5, G.4). For seed ``s`` and arms ``num``/``den``::

    d(s)  = ln(num_s / den_s)                                   simple contrast
    d(s)  = ln(num_s / den_s) - ln(minus_num_s / minus_den_s)    interaction (e.g. K_ret)

    mean_relative_pct = mean_s 100 (num_s / den_s - 1)           [interaction: the mean of the
                        seedwise percentage-point differences 100(r1 - 1) - 100(r2 - 1)]
    effect_pct        = 100 (exp(mean d) - 1)
    ci_pct            = 100 (exp(mean d -+ t_{(1+level)/2, n-1} s_d / sqrt(n)) - 1)
    sign_flip_p       = exact two-sided sign-flip p of d over all 2^n assignments

``mean_relative_pct`` is what the paper displays for Q1-Q6 ("means of within-seed ratios");
``effect_pct`` and its interval are the Q9 log-space estimand (eq. G3, G4). For a simple
contrast ``effect_pct`` equals the ratio of the arms' geometric means.

The sign-flip test runs on the scale the family states (SPEC §8, ``test_scale``)::

    "log"       d(s)                          the 22-test extension family (default)
    "relative"  100 (num_s / den_s - 1)       the original five comparisons (App. B.5);
                [interaction: the seedwise pp differences]   log ratios are their sensitivity
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

from hybridmem.stats.errors import StatsError
from hybridmem.stats.signflip import sign_flip_p
from hybridmem.stats.tdist import t_quantile

SeedValues = Mapping[int, float]
TEST_SCALES = ("log", "relative")


class TInterval(NamedTuple):
    """Two-sided paired-t interval of a mean, in the units of the effects given."""

    n: int
    mean: float
    sd: float       # sample standard deviation (ddof = 1)
    t: float        # t quantile at (1 + level) / 2, df = n - 1
    low: float
    high: float
    level: float


class PairedContrast(NamedTuple):
    """One seed-paired contrast; see the module docstring for each estimand."""

    n: int
    seeds: tuple[int, ...]
    log_effects: tuple[float, ...]   # d(s), in the order of ``seeds``
    mean_relative_pct: float
    effect_pct: float
    ci_pct: tuple[float, float]
    level: float
    sign_flip_p: float
    test_scale: str = "log"

    def as_dict(self) -> dict[str, object]:
        """The JSON contract of ``hybridmem stats contrast --json`` (plus level and seeds)."""
        return {
            "n": self.n,
            "mean_relative_pct": self.mean_relative_pct,
            "effect_pct": self.effect_pct,
            "ci_pct": [self.ci_pct[0], self.ci_pct[1]],
            "sign_flip_p": self.sign_flip_p,
            "test_scale": self.test_scale,
            "level": self.level,
            "seeds": list(self.seeds),
        }


def check_level(level: float) -> float:
    """A two-sided confidence level strictly between 0 and 1."""
    level = float(level)
    if not 0.0 < level < 1.0:
        raise StatsError(f"confidence level must lie strictly between 0 and 1, got {level}")
    return level


def paired_t_interval(effects: Iterable[float], level: float = 0.95) -> TInterval:
    """``mean +- t_{(1+level)/2, n-1} sd / sqrt(n)`` of seed effects (``n >= 2``)."""
    level = check_level(level)
    d = np.fromiter(effects, dtype=float)
    n = int(d.size)
    if n < 2:
        raise StatsError(f"a paired-t interval needs at least 2 seeds, got {n}")
    if not np.all(np.isfinite(d)):
        raise StatsError(f"seed effects must be finite, got {d.tolist()}")
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    t = t_quantile(0.5 + level / 2.0, n - 1)
    half = t * sd / math.sqrt(n)
    return TInterval(n=n, mean=mean, sd=sd, t=t, low=mean - half, high=mean + half, level=level)


def pair_seeds(arms: Mapping[str, SeedValues]) -> tuple[int, ...]:
    """The common seeds of all ``arms``; every arm must hold exactly the same seeds."""
    names = list(arms)
    if not names:
        raise StatsError("no arms to pair")
    seeds = set(arms[names[0]])
    for name in names[1:]:
        other = set(arms[name])
        if other != seeds:
            only_a = sorted(seeds - other)
            only_b = sorted(other - seeds)
            raise StatsError(
                f"arms are not paired by seed: {names[0]!r} has seeds {only_a} that "
                f"{name!r} lacks, {name!r} has seeds {only_b} that {names[0]!r} lacks")
    for name in names:
        bad = {s: v for s, v in arms[name].items() if not (v > 0 and math.isfinite(v))}
        if bad:
            raise StatsError(f"arm {name!r} has values that are not positive and finite "
                             f"(log ratios need them): {bad}")
    return tuple(sorted(seeds))


def log_ratios(num: SeedValues, den: SeedValues, seeds: Iterable[int]) -> np.ndarray:
    """Seedwise ``ln(num_s / den_s)`` in the order of ``seeds``."""
    return np.array([math.log(num[s] / den[s]) for s in seeds])


def contrast(num: SeedValues, den: SeedValues, *, minus_num: SeedValues | None = None,
             minus_den: SeedValues | None = None, level: float = 0.95,
             test_scale: str = "log") -> PairedContrast:
    """Seed-paired contrast ``num/den``, or the interaction ``(num/den)/(minus_num/minus_den)``;
    the sign-flip p on ``test_scale`` (``"log"`` or ``"relative"``)."""
    level = check_level(level)
    if test_scale not in TEST_SCALES:
        raise StatsError(f"test scale must be one of {TEST_SCALES}, got {test_scale!r}")
    if (minus_num is None) != (minus_den is None):
        raise StatsError("an interaction needs both minus_num and minus_den")
    arms: dict[str, SeedValues] = {"num": num, "den": den}
    if minus_num is not None and minus_den is not None:
        arms.update(minus_num=minus_num, minus_den=minus_den)
    seeds = pair_seeds(arms)
    d = log_ratios(num, den, seeds)
    rel = 100.0 * (np.exp(d) - 1.0)
    if minus_num is not None and minus_den is not None:
        d2 = log_ratios(minus_num, minus_den, seeds)
        rel = rel - 100.0 * (np.exp(d2) - 1.0)
        d = d - d2
    ci = paired_t_interval(d, level)
    return PairedContrast(
        n=len(seeds),
        seeds=seeds,
        log_effects=tuple(float(x) for x in d),
        mean_relative_pct=float(rel.mean()),
        effect_pct=100.0 * math.expm1(ci.mean),
        ci_pct=(100.0 * math.expm1(ci.low), 100.0 * math.expm1(ci.high)),
        level=level,
        sign_flip_p=sign_flip_p(d if test_scale == "log" else rel),
        test_scale=test_scale,
    )


def geometric_mean(values: SeedValues) -> float:
    """``exp(mean ln v)`` over seeds (the paper's bar summary, eq. G1)."""
    v = np.array(list(values.values()), dtype=float)
    if v.size == 0 or not np.all((v > 0) & np.isfinite(v)):
        raise StatsError(f"geometric mean needs positive finite values, got {v.tolist()}")
    return float(np.exp(np.log(v).mean()))
