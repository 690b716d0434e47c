"""Student-t distribution: CDF and inverse CDF (quantile) without scipy.

The CDF goes through the regularized incomplete beta function; for ``t >= 0`` and ``v`` degrees
of freedom::

    P(T <= t) = 1 - I_x(v/2, 1/2) / 2,      x = v / (v + t^2)

``I_x(a, b)`` is evaluated with the modified Lentz continued fraction (the classical expansion
``x^a (1-x)^b / (a B(a,b)) * 1/(1+ d1/(1+ d2/(1+ ...))))``), switching to ``1 - I_{1-x}(b, a)``
where the fraction converges slowly. The quantile inverts the CDF by bisection on ``t`` to the
last representable bit. Against 40-digit mpmath references the relative error is below 1e-14 for
``df <= 1e4`` and below 1e-10 up to ``df = 1e7`` (the fraction loses digits near its switch
point when ``df`` is huge).

``t_quantile(0.975, 5)`` is 2.5705818356363133; the exact value is 2.57058183563631551... The
constant printed in the paper's eq. (G4), 2.5705818366147395, is about 1e-9 higher (a float
library's rounding); the difference is far below every printed digit of Table G-7.
"""

from __future__ import annotations

import math

_EPS = 1e-16
_TINY = 1e-300
_MAX_TERMS = 10_000


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS + 1):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                    -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            return h
    raise AssertionError(  # pragma: no cover - would indicate a bug in the fraction
        f"incomplete beta fraction did not converge for a={a}, b={b}, x={x}; "
        "this indicates a bug in _beta_cf")


def _lgamma_correction(z: float) -> float:
    """``lgamma(z) - [(z - 1/2) ln z - z + ln(2 pi) / 2]`` for ``z >= 100`` (Stirling series)."""
    z2 = z * z
    return (1.0 / 12.0 - (1.0 / 360.0 - (1.0 / 1260.0 - 1.0 / (1680.0 * z2)) / z2) / z2) / z


def _log_beta(a: float, b: float) -> float:
    """``ln B(a, b)``; stable when one argument is huge (``a = df/2`` for large ``df``).

    ``lgamma(a) - lgamma(a + b)`` cancels catastrophically for large ``a``; there it is taken
    from the Stirling form ``-(a - 1/2) log1p(b/a) - b ln(a + b) + b + corr(a) - corr(a + b)``.
    """
    if a < b:
        a, b = b, a
    if a < 100.0:
        return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    diff = (-(a - 0.5) * math.log1p(b / a) - b * math.log(a + b) + b
            + _lgamma_correction(a) - _lgamma_correction(a + b))
    return math.lgamma(b) + diff


def _betainc(a: float, b: float, x: float, y: float, log_x: float, log_y: float) -> float:
    """``I_x(a, b)`` given ``y = 1 - x`` and both logs, each computed accurately by the caller."""
    log_front = a * log_x + b * log_y - _log_beta(a, b)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, y) / b


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``."""
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc needs a > 0 and b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1, got x={x}")
    if x == 0.0 or x == 1.0:
        return x
    return _betainc(a, b, x, 1.0 - x, math.log(x), math.log1p(-x))


def _check_df(df: float) -> None:
    if not (df > 0 and math.isfinite(df)):
        raise ValueError(f"degrees of freedom must be positive and finite, got {df}")


def t_sf(t: float, df: float) -> float:
    """Upper tail ``P(T > t)`` of Student's t with ``df`` degrees of freedom."""
    _check_df(df)
    if math.isnan(t):
        raise ValueError("t is NaN")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    if t == 0.0:
        return 0.5
    # x = df / (df + t^2) and y = 1 - x = t^2 / (df + t^2), with logs free of cancellation
    r = t * t / df
    x, y = 1.0 / (1.0 + r), r / (1.0 + r)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x, y, -math.log1p(r), math.log(r) - math.log1p(r))
    return tail if t >= 0 else 1.0 - tail


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` of Student's t with ``df`` degrees of freedom."""
    return 1.0 - t_sf(t, df)


def t_quantile(p: float, df: float) -> float:
    """Inverse CDF: the ``t`` with ``P(T <= t) = p``, for ``0 < p < 1``.

    Solved on the upper tail (``P(T > t) = 1 - p`` for ``p >= 1/2``) so that small tail
    probabilities keep full relative precision; bisection halves the bracket until it cannot
    shrink in floating point.
    """
    _check_df(df)
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile probability must be in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    tail = 1.0 - p
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > tail:
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            raise ValueError(f"t quantile for p={p}, df={df} overflows a float")
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if t_sf(mid, df) > tail:
            lo = mid
        else:
            hi = mid
    # lo and hi are adjacent floats around the root; return the closer one.
    return lo if abs(t_sf(lo, df) - tail) <= abs(t_sf(hi, df) - tail) else hi
