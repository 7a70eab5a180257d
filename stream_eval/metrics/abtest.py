"""Treatment minus control with a confidence interval, from mergeable moments.

The interval is Welch's normal approximation: ``delta +- z * sqrt(var_t / n_t + var_c / n_c)``, with
``n`` the (effective) number of requests or sessions. It is a fixed-sample interval: looking at it
repeatedly while data arrives inflates the error rate (always-valid sequential intervals are planned).
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import numpy as np

from stream_eval.metrics.aggregates import Moments


@dataclasses.dataclass(frozen=True, slots=True)
class Difference:
    """``delta`` = treatment mean - control mean, with its interval (NaN where undefined)."""

    delta: float
    ci_lower: float
    ci_upper: float
    n_control: int
    n_treatment: int


def difference(control: Moments, treatment: Moments, confidence: float = 0.95) -> list[Difference]:
    """One :class:`Difference` per metric of two aligned :class:`Moments`.

    >>> import numpy as np
    >>> c, t = Moments(1), Moments(1)
    >>> c.update_many(np.array([[0.0], [1.0], [0.0], [1.0]])); t.update_many(np.array([[1.0], [1.0], [0.0], [1.0]]))
    >>> d = difference(c, t)[0]
    >>> d.delta, round(d.ci_lower, 4), round(d.ci_upper, 4)
    (0.25, -0.4985, 0.9985)
    """
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    mean_c, mean_t = control.mean(), treatment.mean()
    var_c, var_t = control.variance(), treatment.variance()
    n_c, n_t = control.effective_count(), treatment.effective_count()
    out = []
    for j in range(control.size):
        delta = float(mean_t[j] - mean_c[j])
        if n_c[j] > 1 and n_t[j] > 1 and not (np.isnan(var_c[j]) or np.isnan(var_t[j])):
            half = z * math.sqrt(var_t[j] / n_t[j] + var_c[j] / n_c[j])
            lower, upper = delta - half, delta + half
        else:
            lower = upper = math.nan
        out.append(Difference(delta, lower, upper, int(control.count[j]), int(treatment.count[j])))
    return out
