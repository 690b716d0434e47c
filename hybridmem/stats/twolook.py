"""The two-look rule of the original five comparisons (App. B.5, eq. B1).

A contrast assessed at six seeds and again at nine gets one sequential p-value::

    p_seq = min(1, 2 min(p6, p9))        a look not taken counts p = 1

Paper Table E-5: comparison 1 (six seeds only, p6 = 4/64) gives p_seq = 0.1250; comparisons 2 and
3 (all nine effects negative, p6 = 2/64, p9 = 2/512) give 0.0078; Holm over the five gives
0.3750, 0.0391, 0.0391, 0.5469, 0.3750.
"""

from __future__ import annotations

import math

from hybridmem.stats.errors import StatsError


def _p(value: float | None, name: str) -> float:
    if value is None:
        return 1.0
    v = float(value)
    if not (math.isfinite(v) and 0.0 <= v <= 1.0):
        raise StatsError(f"{name} must be a p-value in [0, 1], got {value}")
    return v


def two_look(p6: float | None, p9: float | None) -> float:
    """``min(1, 2 min(p6, p9))``; ``None`` is a look not taken (p = 1)."""
    return min(1.0, 2.0 * min(_p(p6, "p6"), _p(p9, "p9")))
