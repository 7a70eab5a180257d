"""False-discovery control over a family of always-valid tests: e-BH (Wang & Ramdas 2022, "False discovery rate
control with e-values", JRSS B 84(3)).

With ``K`` hypotheses and e-values ``e_1 .. e_K`` (here the normal-mixture likelihood ratios of the confidence
sequences, :func:`~stream_eval.stats.sequential.normal_mixture_log_e_value`), e-BH at level ``alpha`` rejects the
``k*`` hypotheses of largest e-value, ``k* = max{k : e_(k) >= K / (alpha k)}`` (``e_(k)`` the k-th largest; none
when no k qualifies). Its false-discovery rate is at most ``alpha`` *whatever the dependence* between the e-values
(the metrics of one experiment, the treatments sharing one control), which BH on p-values does not promise. e-BH is
BH applied to the p-values ``1 / e``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Bools = npt.NDArray[np.bool_]


def e_bh(log_e_values: npt.ArrayLike, alpha: float) -> Bools:
    """Which hypotheses e-BH rejects at level ``alpha``, given the logs of their e-values (NaN: no e-value yet,
    never rejected but counted in ``K``, the size of the family).

    >>> import math
    >>> e_bh([math.log(70), math.log(30), math.log(5), float("nan")], 0.05).tolist()  # K = 4: 80, 40, 26.7, 20
    [False, False, False, False]
    >>> e_bh([math.log(90), math.log(45), math.log(5), float("nan")], 0.05).tolist()
    [True, True, False, False]
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"need 0 < alpha < 1, got {alpha}")
    log_e = np.asarray(log_e_values, dtype=np.float64).ravel()
    count = log_e.shape[0]
    rejected = np.zeros(count, dtype=np.bool_)
    if not count:
        return rejected
    ordered = np.where(np.isnan(log_e), -np.inf, log_e)
    order = np.argsort(-ordered, kind="stable")  # largest first
    ranks = np.arange(1, count + 1, dtype=np.float64)
    # e_(k) >= K / (alpha k), in logs (e-values of 1e300 and more stay finite there)
    passes = ordered[order] >= np.log(count / (alpha * ranks))
    if passes.any():
        rejected[order[: int(np.flatnonzero(passes)[-1]) + 1]] = True
    return rejected
