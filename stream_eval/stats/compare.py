"""Treatment minus control for every metric: a fixed-sample interval and an always-valid confidence sequence.

Both intervals use the same cluster-robust (delta-method) variance of the difference,
``v = var(mean_t) + var(mean_c)`` from :func:`~stream_eval.stats.ratio.ratio_mean_variance`:

* the fixed-sample interval ``delta +- z_{1 - alpha/2} sqrt(v)`` is valid at one pre-planned look only;
* the confidence sequence (normal mixture, Waudby-Smith et al. 2023 eq. 9, as gbstats'
  ``SequentialTwoSidedTTest``) holds at every look at once, so the experiment can be watched continuously
  and stopped as soon as it excludes 0. Its always-valid p-value is below ``alpha`` exactly when it does.

Zero variance (every unit of both arms has the same ratio, e.g. a metric that is 0 everywhere so far) gives
NaN intervals and a NaN p-value: no interval can be formed, and :func:`decide` says ``"inconclusive"``. (gbstats
also refuses to test then; it only needs the *sum* of the two arms' variances to be positive here.)

Deviation from gbstats, on purpose: its ``TwoSidedTTest`` uses a Student t quantile with Welch's degrees of
freedom; ours is the normal quantile (units are many; the confidence sequence is asymptotic anyway).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from stream_eval.stats.cuped import adjusted
from stream_eval.stats.ratio import ArmSums, ratio_mean_variance
from stream_eval.stats.sequential import (
    mixture_rho,
    normal_mixture_halfwidth,
    normal_mixture_log_e_value,
    normal_mixture_p_value,
)
from stream_eval.stats.special import Floats


@dataclass(frozen=True, slots=True, eq=False)
class Comparison:
    """Treatment - control, every field an array of shape (K,)."""

    delta: Floats  # treatment mean - control mean
    ci_lower: Floats  # fixed-sample cluster-robust normal interval
    ci_upper: Floats
    cs_lower: Floats  # always-valid normal-mixture confidence sequence
    cs_upper: Floats
    p_value: Floats  # always-valid p-value AT THIS LOOK (the caller keeps the running minimum)
    log_e_value: Floats  # log of the mixture likelihood ratio AT THIS LOOK: an e-value for e-BH (stats/fdr.py)
    units_control: Floats
    units_treatment: Floats
    lift: Floats  # treatment mean / control mean - 1, with the delta-method variance of the ratio of means
    lift_ci_lower: Floats
    lift_ci_upper: Floats
    lift_cs_lower: Floats
    lift_cs_upper: Floats
    # CUPED (``compare(..., cuped=True)``; NaN without): the pooled theta, 1 - the adjusted variance of the delta
    # over the unadjusted one, and the pre-period imbalance check (treatment - control of the pre-period means, with
    # its always-valid p-value AT THIS LOOK)
    theta: Floats
    variance_reduction: Floats
    pre_delta: Floats
    pre_p_value: Floats
    variance: Floats  # the variance of ``delta`` (CUPED-adjusted with ``cuped``; NaN where not positive)


def compare(
    control: ArmSums, treatment: ArmSums, *, confidence: float = 0.95, sequential_n: float = 10_000,
    cuped: bool = False,
) -> Comparison:
    """Treatment mean - control mean for every metric, with both intervals and the always-valid p-value.

    ``sequential_n`` (N*, in units of both arms together) tunes the confidence sequence to be tightest there.
    NaN where an arm has fewer than 2 units for a metric or the variance is 0.

    With ``cuped`` the delta is the difference of the CUPED-adjusted means and every interval, sequence, p-value and
    e-value takes the adjusted variance (``stats/cuped.py``); the lift is that delta over the control's unadjusted
    mean, with the adjusted variances (as gbstats' relative tests with regression adjustment).

    >>> import numpy as np
    >>> col = lambda *v: np.array(v, dtype=float)[:, None]  # one metric: a column of per-unit values
    >>> control = ArmSums.of_units(col(1, 2, 0, 1, 1, 0), col(2, 3, 1, 2, 1, 2))
    >>> treatment = ArmSums.of_units(col(2, 3, 1, 2, 1, 2), col(2, 3, 2, 2, 1, 3))
    >>> c = compare(control, treatment, sequential_n=12)
    >>> [round(float(x[0]), 4) for x in (c.delta, c.ci_lower, c.ci_upper, c.cs_lower, c.cs_upper, c.p_value)]
    [0.3916, 0.0764, 0.7068, -0.0965, 0.8797, 0.2148]
    >>> decide(c.ci_lower[0], c.ci_upper[0]), decide(c.cs_lower[0], c.cs_upper[0])  # one look: CS is wider
    ('better', 'inconclusive')
    """
    alpha = 1.0 - confidence
    rho = mixture_rho(alpha, sequential_n)
    mean_c, var_c = ratio_mean_variance(control)
    mean_t, var_t = ratio_mean_variance(treatment)
    delta = mean_t - mean_c
    nan = np.full(np.shape(delta), np.nan)
    theta = reduction = pre_delta = pre_p = nan
    n_total = control.units + treatment.units
    if cuped:
        adj = adjusted(control, treatment)
        unadjusted = var_c + var_t
        delta, var_c, var_t = adj.mean_treatment - adj.mean_control, adj.var_control, adj.var_treatment
        theta = adj.theta
        with np.errstate(divide="ignore", invalid="ignore"):
            reduction = np.where(unadjusted > 0.0, 1.0 - (var_c + var_t) / unadjusted, np.nan)
        pre_delta = adj.pre_delta
        pre_p = normal_mixture_p_value(pre_delta, adj.pre_variance, n_total, rho)
    variance = var_c + var_t
    ok = np.isfinite(delta) & (variance > 0.0)
    variance = np.where(ok, variance, np.nan)
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    fixed_half = z * np.sqrt(variance)
    cs_half = normal_mixture_halfwidth(variance, n_total, alpha, rho)
    # relative: (m_t - m_c) / m_c, variance var_t / m_c^2 + var_c m_t^2 / m_c^4 (the delta method for a ratio of
    # independent means, as gbstats' relative tests)
    with np.errstate(divide="ignore", invalid="ignore"):
        lift = np.where(mean_c != 0.0, delta / mean_c, np.nan)
        relative = var_t / mean_c**2 + var_c * mean_t**2 / mean_c**4
    relative = np.where(np.isfinite(lift) & (relative > 0.0), relative, np.nan)
    lift_fixed = z * np.sqrt(relative)
    lift_cs = normal_mixture_halfwidth(relative, n_total, alpha, rho)
    return Comparison(
        delta=delta,
        ci_lower=delta - fixed_half,
        ci_upper=delta + fixed_half,
        cs_lower=delta - cs_half,
        cs_upper=delta + cs_half,
        p_value=normal_mixture_p_value(delta, variance, n_total, rho),
        log_e_value=normal_mixture_log_e_value(delta, variance, n_total, rho),
        units_control=np.asarray(control.units, dtype=np.float64),
        units_treatment=np.asarray(treatment.units, dtype=np.float64),
        lift=lift,
        lift_ci_lower=lift - lift_fixed,
        lift_ci_upper=lift + lift_fixed,
        lift_cs_lower=lift - lift_cs,
        lift_cs_upper=lift + lift_cs,
        theta=theta,
        variance_reduction=reduction,
        pre_delta=pre_delta,
        pre_p_value=pre_p,
        variance=variance,
    )


@dataclass(frozen=True, slots=True, eq=False)
class Difference:
    """The effect (treatment - control) in a segment minus the effect in the rest of the experiment, every field an
    array of shape (K,)."""

    delta: Floats  # segment's delta - rest's delta
    p_value: Floats  # always-valid p-value of a difference of 0 AT THIS LOOK (the caller keeps the running minimum)
    log_e_value: Floats  # log of the mixture likelihood ratio AT THIS LOOK (an e-value, for e-BH)


def difference(segment: Comparison, rest: Comparison, *, confidence: float = 0.95,
               sequential_n: float = 10_000) -> Difference:
    """Statsig's segment-vs-rest test, always valid: is the effect in a segment the effect in the rest of the
    experiment (its complement)? The two deltas are over disjoint units, so independent: the difference has the
    variance ``v_segment + v_rest``, and its normal-mixture p-value and e-value (as :func:`compare`'s) take the units
    of both, ``N = `` every unit of both arms. (Statsig runs Welch's t-test on the same difference and variance, at
    fixed looks, with a Bonferroni correction; README, "Segment A/B rows".)

    >>> import numpy as np
    >>> col = lambda *v: np.array(v, dtype=float)[:, None]
    >>> ones = col(1, 1, 1, 1, 1, 1)
    >>> flat = ArmSums.of_units(col(1, 2, 0, 1, 1, 0), ones)
    >>> up = ArmSums.of_units(col(3, 4, 2, 3, 3, 2), ones)  # the effect is 2 in the segment, 0 in the rest
    >>> d = difference(compare(flat, up, sequential_n=24), compare(flat, flat, sequential_n=24), sequential_n=24)
    >>> round(float(d.delta[0]), 4), bool(d.p_value[0] < 0.05)
    (2.0, True)
    """
    rho = mixture_rho(1.0 - confidence, sequential_n)
    delta = segment.delta - rest.delta
    variance = segment.variance + rest.variance
    units = segment.units_control + segment.units_treatment + rest.units_control + rest.units_treatment
    return Difference(delta, normal_mixture_p_value(delta, variance, units, rho),
                      normal_mixture_log_e_value(delta, variance, units, rho))


def decide(cs_lower: float, cs_upper: float) -> str:
    """``'better'`` if ``cs_lower > 0``, ``'worse'`` if ``cs_upper < 0``, else ``'inconclusive'`` (NaN bounds:
    inconclusive; every metric here is higher-is-better).

    >>> decide(0.01, 0.03), decide(-0.03, -0.01), decide(-0.01, 0.01), decide(float("nan"), float("nan"))
    ('better', 'worse', 'inconclusive', 'inconclusive')
    """
    if cs_lower > 0.0:
        return "better"
    if cs_upper < 0.0:
        return "worse"
    return "inconclusive"
