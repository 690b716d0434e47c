"""Exact two-sided sign-flip (randomization) test for paired seed effects (App. B.5).

Under the null each seed effect ``d_s`` is symmetric about zero, so all ``2^n`` sign
assignments ``(+-d_1, ..., +-d_n)`` are equally likely. The two-sided p-value is the share of
assignments whose absolute mean is at least the observed absolute mean (the observed assignment
and its mirror image included), so the smallest attainable p is ``2 / 2^n``:

    n = 12, all effects positive:  p = 2 / 4096 = 0.00048828125

Enumeration is meet-in-the-middle: the signed sums of the first ``h`` effects (``2^h`` of them)
are sorted, and for each signed sum ``b`` of the other ``n - h`` effects the count of
``|a + b| >= T`` comes from two binary searches. Every one of the ``2^n`` assignments is counted
exactly once; memory and time grow as ``2^(n/2)``.

Why not ``scipy.stats.permutation_test``: it computes the same exact p (``permutation_type=
"samples"`` on the one sample ``d``, statistic ``|mean|``, ``alternative="greater"``,
``n_resamples=inf``), and the tests use it as the reference on fixed inputs, but it enumerates
all ``2^n`` assignments. Measured on the shared 2-core box (loaded): 0.03 s at 12 seeds, 0.6 s at
16, 11 s at 20, 43 s at 22, against under 4 ms here for each; exactness is required (the paper's
smallest attainable p, ``2 / 2^n``, is what Holm multiplies), so its Monte Carlo mode is no
substitute, and this module's 40-seed limit would fall to about 16 with scipy.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from hybridmem.stats.errors import StatsError

MAX_SEEDS = 40  # 2 x 2^20 half-sums; beyond this the exact enumeration is not attempted
# Sums that are mathematically equal can differ by rounding; treat them as ties (counted as
# "at least as extreme"). The tolerance is relative to the largest attainable |sum|.
_REL_TIE = 1e-10


def _signed_sums(d: np.ndarray) -> np.ndarray:
    """All ``2^len(d)`` sums ``sum(+-d_i)``, built by doubling."""
    sums = np.zeros(1)
    for x in d:
        sums = np.concatenate((sums + x, sums - x))
    return sums


def sign_flip_p(effects: Iterable[float]) -> float:
    """Exact two-sided sign-flip p-value of the mean of ``effects`` over all ``2^n`` signs."""
    d = np.fromiter(effects, dtype=float)
    n = d.size
    if n == 0:
        raise StatsError("sign-flip test needs at least one seed effect, got 0")
    if n > MAX_SEEDS:
        raise StatsError(f"exact sign-flip enumeration supports at most {MAX_SEEDS} seeds, got {n}")
    if not np.all(np.isfinite(d)):
        raise StatsError(f"seed effects must be finite, got {d.tolist()}")
    scale = float(np.abs(d).sum())
    if scale == 0.0:
        return 1.0  # every assignment has mean 0 == observed
    threshold = abs(float(d.sum())) - _REL_TIE * scale
    if threshold <= 0.0:
        return 1.0  # observed mean is (numerically) zero: every assignment is as extreme
    h = n // 2
    left = np.sort(_signed_sums(d[:h]))
    right = _signed_sums(d[h:])
    # count a with a + b >= T  plus  a with a + b <= -T (disjoint when T > 0)
    upper = left.size - np.searchsorted(left, threshold - right, side="left")
    lower = np.searchsorted(left, -threshold - right, side="right")
    extreme = int(upper.sum() + lower.sum())
    total = left.size * right.size
    assert 2 <= extreme <= total, (
        f"{extreme} of {total} assignments as extreme as the observed one; the observed "
        "assignment and its mirror must both count, this indicates a bug in sign_flip_p")
    return extreme / total
