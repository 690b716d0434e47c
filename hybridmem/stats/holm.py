"""Holm step-down adjustment of a family of p-values (App. B.5, B.12).

With ``m`` tests sorted ascending ``p_(1) <= ... <= p_(m)``::

    adj_(k) = max_{j <= k} min(1, (m - j + 1) p_(j))

returned in the caller's order. Twelve all-positive seeds (raw ``2/4096``) in the extension's
22-test family give ``min(1, 22 x 0.00048828125) = 0.0107421875``, printed as 0.01074219.

Hand-written because scipy has no Holm adjustment (``scipy.stats.false_discovery_control`` is
Benjamini-Hochberg/Yekutieli) and statsmodels' ``multipletests`` would be a new dependency for
these eight lines; the tests check the paper's values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hybridmem.stats.errors import StatsError


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, same order as ``pvalues``."""
    p = [float(x) for x in pvalues]
    if not p:
        raise StatsError("Holm adjustment needs at least one p-value, got 0")
    bad = [x for x in p if not (0.0 <= x <= 1.0) or math.isnan(x)]
    if bad:
        raise StatsError(f"p-values must lie in [0, 1], got {bad}")
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted
