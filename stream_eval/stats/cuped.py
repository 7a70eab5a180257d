"""CUPED: regression adjustment of ratio metrics on each unit's own pre-period value, from mergeable sums.

Deng, Xu, Kohavi & Walker (2013), "Improving the sensitivity of online controlled experiments by utilizing
pre-experiment data"; for ratio metrics GrowthBook's delta-method derivation (gbstats'
``RegressionAdjustedRatioStatistic``). Unit i of an arm has post-period sums ``y_i`` over ``n_i`` requests and
pre-period sums ``x_i`` over ``q_i`` requests (:class:`~stream_eval.stats.ratio.PreSums`). The arm's adjusted mean
is ``r - theta * r_pre`` with ``r = sum y / sum n`` and ``r_pre = sum x / sum q``. Linearised (the delta method),
unit i stands for ``e_i / nbar - theta * f_i / qbar`` with the residuals ``e_i = y_i - r n_i`` and
``f_i = x_i - r_pre q_i`` and the means ``nbar = sum n / u``, ``qbar = sum q / u`` over the arm's ``u`` units, so::

    var(adjusted mean) = (P - 2 theta C + theta^2 V) / ((u - 1) u)
    P = sum e_i^2 / nbar^2,  V = sum f_i^2 / qbar^2,  C = sum e_i f_i / (nbar qbar)

which is gbstats' ``nabla' Lambda nabla / n`` (the 4 x 4 covariance matrix of the per-unit ``(y, n, x, q)`` and the
gradient of ``y/n - theta x/q``) written in sums. Every sum expands into the fields of ``ArmSums`` and
``PreSums`` (``sum e_i f_i = yx - r_pre yq - r nx + r r_pre nq``), so arms, shards and workers merge by ``+``.

``theta`` is pooled over the two arms compared: the same linearisation over their units taken as one sample,
``theta = C / V`` of the pooled sums. With one request per unit in both periods (``n_i = q_i = 1``) this is
gbstats' ``compute_theta`` exactly (the joint statistic of both arms), and every number here equals gbstats'
``RegressionAdjustedStatistic``'s (``tests/test_cuped.py``). ``theta`` is 0 (no adjustment, as gbstats) when the
pooled pre-period or post-period variance is 0 or an arm has no pre-period data at all.

A unit without pre-period data has ``x_i = q_i = 0``: its linearised covariate ``f_i / qbar`` is 0, so it adds
nothing to ``C`` or ``V`` (``theta`` is fitted on the units with data) and keeps its own post-period term in the
variance. ``r_pre`` is the ratio over the units with data. The adjusted delta ``(r_t - r_c) - theta (r_pre,t -
r_pre,c)`` stays unbiased: under randomisation both the pre-period means and the share of units with data are the
same in expectation in every arm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stream_eval.stats.ratio import ArmSums, ratio_mean_variance
from stream_eval.stats.special import Floats


@dataclass(frozen=True, slots=True, eq=False)
class Adjusted:
    """Both arms' CUPED-adjusted means and the variances of those means (every field of shape (K,))."""

    theta: Floats
    mean_control: Floats
    mean_treatment: Floats
    var_control: Floats
    var_treatment: Floats
    pre_delta: Floats  # treatment - control of the pre-period means (0 in expectation: the imbalance check)
    pre_variance: Floats  # its delta-method variance


@dataclass(frozen=True, slots=True, eq=False)
class _Linearised:
    """An arm's (or a pooled sample's) ratio means and the sums P, V, C of the module docstring."""

    units: Floats
    mean: Floats
    pre_mean: Floats
    post: Floats  # P
    pre: Floats  # V
    cov: Floats  # C


def _linearised(s: ArmSums) -> _Linearised:
    p = s.pre_or_zeros()
    with np.errstate(divide="ignore", invalid="ignore"):
        units = np.asarray(s.units, dtype=np.float64)
        r = np.where(s.n > 0.0, s.y / s.n, 0.0)
        r_pre = np.where(p.q > 0.0, p.x / p.q, 0.0)
        nbar = np.where(units > 0.0, s.n / units, np.nan)
        qbar = np.where(units > 0.0, p.q / units, np.nan)
        see = s.yy - 2.0 * r * s.yn + r * r * s.nn
        sff = p.xx - 2.0 * r_pre * p.xq + r_pre * r_pre * p.qq
        sef = p.yx - r_pre * p.yq - r * p.nx + r * r_pre * p.nq
        has_pre = p.q > 0.0
        post = see / (nbar * nbar)
        pre = np.where(has_pre, sff / (qbar * qbar), 0.0)
        cov = np.where(has_pre, sef / (nbar * qbar), 0.0)
    return _Linearised(units, np.where(s.n > 0.0, r, np.nan), np.where(has_pre, r_pre, np.nan), post, pre, cov)


def pooled_theta(control: ArmSums, treatment: ArmSums) -> Floats:
    """``theta`` of the two arms' units taken as one sample (module docstring); 0 where no adjustment is made.

    >>> import numpy as np
    >>> col = lambda *v: np.array(v, dtype=float)[:, None]
    >>> a = ArmSums.of_units(col(1, 2, 3), col(1, 1, 1), col(1, 2, 4), col(1, 1, 1))
    >>> b = ArmSums.of_units(col(2, 4), col(1, 1), col(1, 3), col(1, 1))
    >>> pooled_theta(a, b).round(6).tolist()  # covariance / pre-period variance over all 5 units
    [0.676471]
    """
    joint = _linearised(control + treatment)
    p_c, p_t = control.pre_or_zeros(), treatment.pre_or_zeros()
    with np.errstate(divide="ignore", invalid="ignore"):
        theta = joint.cov / joint.pre
    usable = (joint.pre > 0.0) & (joint.post > 0.0) & (p_c.q > 0.0) & (p_t.q > 0.0) & np.isfinite(theta)
    return np.where(usable, theta, 0.0)


def adjusted(control: ArmSums, treatment: ArmSums) -> Adjusted:
    """The CUPED-adjusted means of both arms with ``theta`` pooled over them, and their variances (NaN as
    :func:`~stream_eval.stats.ratio.ratio_mean_variance`: fewer than 2 units or no post-period request).

    With ``theta`` 0 the means and variances are the unadjusted ones, bit for bit.

    >>> import numpy as np
    >>> col = lambda *v: np.array(v, dtype=float)[:, None]
    >>> a = ArmSums.of_units(col(1, 2, 3), col(1, 1, 1), col(1, 2, 4), col(1, 1, 1))
    >>> b = ArmSums.of_units(col(2, 4), col(1, 1), col(1, 3), col(1, 1))
    >>> adj = adjusted(a, b)
    >>> [round(float(v[0]), 6) for v in (adj.mean_control, adj.mean_treatment, adj.var_control, adj.var_treatment)]
    [0.421569, 1.647059, 0.012784, 0.104671]
    """
    theta = pooled_theta(control, treatment)
    out = []
    for arm in (control, treatment):
        mean, variance = ratio_mean_variance(arm)
        lin = _linearised(arm)
        with np.errstate(divide="ignore", invalid="ignore"):
            extra = (theta * theta * lin.pre - 2.0 * theta * lin.cov) / ((lin.units - 1.0) * lin.units)
            pre_variance = lin.pre / ((lin.units - 1.0) * lin.units)
        shift = np.where(theta != 0.0, theta * lin.pre_mean, 0.0)
        out.append((mean - shift, np.where(theta != 0.0, np.maximum(variance + extra, 0.0), variance),
                    lin.pre_mean, np.where(lin.units >= 2.0, pre_variance, np.nan)))
    (mean_c, var_c, pre_c, pvar_c), (mean_t, var_t, pre_t, pvar_t) = out
    return Adjusted(theta, mean_c, mean_t, var_c, var_t, pre_t - pre_c, pvar_c + pvar_t)
