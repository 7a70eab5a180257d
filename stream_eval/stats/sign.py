"""Always-valid sign test for GSB (good / same / bad) side-by-side verdicts.

* p-value: good against bad with the ties (same) left out, the mixture of Bernoulli(q) likelihood ratios
  against q = 1/2 over ``q ~ Beta(a, a)``, ``p = min(1, 1 / BF)``: an exact test martingale under
  P(good) = P(bad), so ``P(ever p <= alpha) <= alpha`` under continuous monitoring (Ville's inequality; the
  beta-binomial mixture of Robbins 1970 and Lai 1976). The prior is matched to the normal mixture of the
  confidence sequence: ``a = 1 / (2 rho^2)`` makes the prior variance of the sign effect ``2q - 1`` equal to
  ``rho^2 / (1 + rho^2)``, about the normal mixture's ``rho^2`` for a unit-variance observation, with ``rho``
  tuned for ``sequential_n`` verdicts.
* score: ``(good - bad) / (good + same + bad)``, the mean of per-verdict values +1 / 0 / -1, with the
  normal-mixture asymptotic confidence sequence on that mean (one sample of ``good + same + bad`` verdicts,
  unbiased sample variance; Waudby-Smith et al. 2023 eq. 9).

The p-value and the sequence are two different tests (ties count in the score's variance, not in the sign
test), so near the boundary one can reject while the other does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stream_eval.stats.sequential import beta_binomial_log_bf, mixture_rho, normal_mixture_halfwidth


@dataclass(frozen=True, slots=True)
class SignTest:
    """Score, always-valid sign-test p-value and confidence sequence on the score (NaN where undefined)."""

    score: float  # (good - bad) / (good + same + bad)
    p_value: float  # always-valid sign test of good vs bad, ties (same) left out, at this look
    cs_lower: float  # always-valid confidence sequence on the score
    cs_upper: float


def sign_test(good: int, same: int, bad: int, *, confidence: float = 0.95, sequential_n: float = 10_000) -> SignTest:
    """GSB verdict counts in, score with its always-valid p-value and confidence sequence out.

    No verdicts: all NaN. Only ties (no good nor bad): p-value 1. Fewer than 2 verdicts or zero variance
    (every verdict the same): NaN sequence. The sequence is clipped to [-1, 1], where the score lies.

    >>> from dataclasses import astuple
    >>> [round(x, 4) for x in astuple(sign_test(120, 40, 80, sequential_n=1000))]
    [0.1667, 0.1365, -0.0238, 0.3571]
    >>> [round(x, 4) for x in astuple(sign_test(240, 80, 160, sequential_n=1000))]  # twice as many
    [0.1667, 0.0045, 0.04, 0.2934]
    >>> sign_test(0, 0, 0).p_value, sign_test(0, 5, 0).p_value
    (nan, 1.0)
    """
    if min(good, same, bad) < 0:
        raise ValueError(f"verdict counts must be non-negative, got {good}, {same}, {bad}")
    total = good + same + bad
    if total == 0:
        return SignTest(math.nan, math.nan, math.nan, math.nan)
    alpha = 1.0 - confidence
    rho = mixture_rho(alpha, sequential_n)
    score = (good - bad) / total
    log_bf = float(beta_binomial_log_bf(good, bad, 1.0 / (2.0 * rho * rho)))
    p_value = math.exp(-max(log_bf, 0.0))
    if total < 2:
        return SignTest(score, p_value, math.nan, math.nan)
    variance = max(good + bad - total * score * score, 0.0) / (total - 1)  # unbiased sample variance of +1/0/-1
    half = float(normal_mixture_halfwidth(variance / total, total, alpha, rho))
    # the score lies in [-1, 1]: so does the sequence (clipping keeps its coverage)
    return SignTest(score, p_value, max(score - half, -1.0), min(score + half, 1.0))
