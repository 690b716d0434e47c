"""Student-t distribution: CDF, upper tail and quantile, from ``scipy.stats.t``.

scipy evaluates these through Boost's incomplete beta and its inverse; against 40-digit mpmath
references the relative error is below 1e-13 for ``df <= 1e4`` and about 1e-9 at ``df = 1e9``
(tests/hybridmem/test_stats.py). Only the argument checks are ours: scipy answers NaN for a
probability outside (0, 1) or a non-positive ``df``, where a contrast must fail instead.

``t_quantile(0.975, 5)`` is 2.5705818356363146; the exact value is 2.57058183563631551... The
constant printed in the paper's eq. (G4), 2.5705818366147395, is about 1e-9 higher (a float
library's rounding); the difference is far below every printed digit of Table G-7.

scipy is imported on first use: ``scipy.stats`` costs about a second to import, which the CLI's
other subcommands (and ``--help``) should not pay.
"""

from __future__ import annotations

import math
from typing import Any


def _check_df(df: float) -> None:
    if not (df > 0 and math.isfinite(df)):
        raise ValueError(f"degrees of freedom must be positive and finite, got {df}")


def _t() -> Any:
    from scipy.stats import t

    return t


def t_sf(t: float, df: float) -> float:
    """Upper tail ``P(T > t)`` of Student's t with ``df`` degrees of freedom."""
    _check_df(df)
    if math.isnan(t):
        raise ValueError("t is NaN")
    return float(_t().sf(t, df))


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` of Student's t with ``df`` degrees of freedom."""
    _check_df(df)
    if math.isnan(t):
        raise ValueError("t is NaN")
    return float(_t().cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """Inverse CDF: the ``t`` with ``P(T <= t) = p``, for ``0 < p < 1``."""
    _check_df(df)
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile probability must be in (0, 1), got {p}")
    return float(_t().ppf(p, df))
