"""Sample ratio mismatch: are the units split between the arms as the design says?

Two tests side by side: Pearson's chi-squared goodness of fit (valid at one look; GrowthBook's ``check_srm``),
and the sequential Dirichlet-multinomial test of Lindon & Malek 2022 ("Anytime-valid inference for
multinomial count data", NeurIPS), whose p-value ``min(1, 1 / BF)`` stays valid however often it is looked
at: a Bayes factor of ``Dirichlet(k * shares)`` against the expected shares is a test martingale under a
correct split, and the caller keeps the running minimum of the p-value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stream_eval.stats.sequential import dirichlet_multinomial_log_bf
from stream_eval.stats.special import chi2_sf


@dataclass(frozen=True, slots=True)
class SrmTest:
    """Pearson chi-squared of units per arm against the expected shares, and the always-valid p-value."""

    chi2: float
    p_value: float  # Pearson chi-squared goodness of fit of units per arm vs the expected shares
    sequential_p_value: float  # always-valid p-value at this look (caller keeps running min)


def srm_test(units: Sequence[float], expected: Sequence[float], *, concentration: float = 100.0) -> SrmTest:
    """Units per arm (same order as the ``expected`` shares, which sum to 1).

    ``concentration`` is the Dirichlet prior's ``k`` (prior ``Dirichlet(k * expected)``, Lindon & Malek's
    default 100). With no units at all, ``chi2`` and ``p_value`` are NaN and the sequential p-value is 1.
    Every expected share must be positive.

    >>> t = srm_test([5100, 4900], [0.5, 0.5])
    >>> round(t.chi2, 6), round(t.p_value, 4), round(t.sequential_p_value, 4)
    (4.0, 0.0455, 1.0)
    >>> t = srm_test([5300, 4700], [0.5, 0.5])
    >>> round(t.chi2, 6), f"{t.p_value:.2e}", f"{t.sequential_p_value:.2e}"
    (36.0, '1.97e-09', '1.81e-07')
    """
    counts = np.asarray(units, dtype=np.float64)
    shares = np.asarray(expected, dtype=np.float64)
    if counts.ndim != 1 or counts.shape != shares.shape or counts.size < 2:
        raise ValueError(f"need units and expected shares for the same >= 2 arms, got {counts} and {shares}")
    if np.any(shares <= 0.0) or np.any(counts < 0.0) or not math.isclose(float(shares.sum()), 1.0, rel_tol=1e-9):
        raise ValueError(f"expected shares must be positive and sum to 1, units non-negative: {shares}, {counts}")
    total = float(counts.sum())
    if total == 0.0:
        return SrmTest(math.nan, math.nan, 1.0)
    expected_counts = total * shares
    chi2 = float((((counts - expected_counts) ** 2) / expected_counts).sum())
    log_bf = float(dirichlet_multinomial_log_bf(counts, shares, concentration))
    return SrmTest(chi2, chi2_sf(chi2, counts.size - 1), math.exp(-max(log_bf, 0.0)))
