"""Always-valid (anytime-valid) kernels: mixture martingales and the confidence sequences they give.

All functions are vectorised (numpy broadcasting), so the same code serves one look of one experiment and a
benchmark of thousands of simulated experiments at hundreds of looks.

* **Normal mixture** (Robbins 1970; Howard, Ramdas, McAuliffe & Sekhon 2021, "Time-uniform, nonparametric,
  nonasymptotic confidence sequences", two-sided normal mixture; Waudby-Smith, Arbour, Sinha, Kennedy &
  Ramdas 2023, "Time-uniform central limit theory and asymptotic confidence sequences", eq. 9 (the
  asymptotic CS), eq. 155 (its e-value / p-value) and eq. 161 (the choice of rho)). It is GrowthBook
  gbstats' ``SequentialTwoSidedTTest`` and the inverted mSPRT of Johari et al. 2017. With ``N`` randomisation
  units in all, an estimate ``d`` of variance ``v`` (so ``s2 = N v`` per unit) and mixing precision
  ``rho``:

      half-width  = sqrt(s2) * sqrt(2 (N rho^2 + 1) / (N rho)^2 * log(sqrt(N rho^2 + 1) / alpha))
      mixture LR  = exp(rho^2 N d^2 / v / (2 (N rho^2 + 1))) / sqrt(N rho^2 + 1),  p = min(1, 1 / LR)
      rho         = sqrt((-2 log alpha + log(-2 log alpha + 1)) / N*)

  ``rho`` makes the boundary tightest at ``N*`` units (gbstats' ``sequential_tuning_parameter``), and
  ``p < alpha`` exactly when the CS at level ``1 - alpha`` excludes 0.
* **Beta-binomial mixture** of Bernoulli(q) likelihood ratios against q = 1/2: an exact test martingale for
  the sign test (Ville's inequality gives P(sup BF >= 1/alpha) <= alpha).
* **Dirichlet-multinomial mixture** against fixed multinomial shares: Lindon & Malek 2022, "Anytime-valid
  inference for multinomial count data" (NeurIPS), the sequential sample-ratio-mismatch test, with prior
  ``Dirichlet(k * shares)`` (their default k = 100).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from stream_eval.stats.special import Floats, log_gamma


def mixture_rho(alpha: float, sequential_n: float) -> float:
    """The normal mixture's rho tuned for ``sequential_n`` units at level ``alpha`` (Waudby-Smith et al. eq. 161).

    >>> round(mixture_rho(0.05, 5000), 8)
    0.03984007
    """
    if not 0.0 < alpha < 1.0 or not sequential_n > 0.0:
        raise ValueError(f"need 0 < alpha < 1 and sequential_n > 0, got {alpha}, {sequential_n}")
    log_alpha = math.log(alpha)
    return math.sqrt((-2.0 * log_alpha + math.log(-2.0 * log_alpha + 1.0)) / sequential_n)


def normal_mixture_halfwidth(variance: npt.ArrayLike, n_total: npt.ArrayLike, alpha: float, rho: float) -> Floats:
    """Half-width of the asymptotic confidence sequence for an estimate of variance ``variance`` from
    ``n_total`` units (Waudby-Smith et al. 2023 eq. 9, as gbstats writes it). NaN where ``variance`` or
    ``n_total`` is not positive.

    >>> normal_mixture_halfwidth([0.01, 0.0], 100.0, 0.05, mixture_rho(0.05, 100.0)).round(6).tolist()
    [0.303521, nan]
    """
    v = np.asarray(variance, dtype=np.float64)
    n = np.asarray(n_total, dtype=np.float64)
    ok = (v > 0.0) & (n > 0.0)
    v, n = np.where(ok, v, np.nan), np.where(ok, n, np.nan)
    growth = n * rho * rho + 1.0  # N rho^2 + 1
    s2 = v * n
    return np.asarray(np.sqrt(s2) * np.sqrt(2.0 * growth * np.log(np.sqrt(growth) / alpha) / (n * rho) ** 2))


def normal_mixture_log_e_value(
    estimate: npt.ArrayLike, variance: npt.ArrayLike, n_total: npt.ArrayLike, rho: float
) -> Floats:
    """Log of the mixture likelihood ratio of ``estimate == 0`` at this look (Waudby-Smith et al. 2023 eq. 155):
    an e-value at any stopping time (its expectation under the null is at most 1, asymptotically), so e-BH may
    combine several under any dependence (Wang & Ramdas 2022). NaN where the variance is not positive.

    >>> normal_mixture_log_e_value([0.0, 0.5], 0.01, 100.0, mixture_rho(0.05, 100.0)).round(6).tolist()
    [-1.095053, 10.006135]
    """
    d = np.asarray(estimate, dtype=np.float64)
    v = np.asarray(variance, dtype=np.float64)
    n = np.asarray(n_total, dtype=np.float64)
    ok = (v > 0.0) & (n > 0.0) & np.isfinite(d)
    v, n = np.where(ok, v, np.nan), np.where(ok, n, np.nan)
    growth = n * rho * rho + 1.0
    return np.asarray(np.where(ok, rho * rho * (d * d * n / v) / (2.0 * growth) - 0.5 * np.log(growth), np.nan))


def normal_mixture_p_value(
    estimate: npt.ArrayLike, variance: npt.ArrayLike, n_total: npt.ArrayLike, rho: float
) -> Floats:
    """Always-valid p-value of ``estimate == 0`` at this look: ``min(1, 1 / mixture likelihood ratio)``
    (Waudby-Smith et al. 2023 eq. 155, as gbstats writes it). NaN where the variance is not positive.

    >>> normal_mixture_p_value([0.0, 0.5], 0.01, 100.0, mixture_rho(0.05, 100.0)).round(6).tolist()
    [1.0, 4.5e-05]
    """
    log_lr = normal_mixture_log_e_value(estimate, variance, n_total, rho)
    return np.asarray(np.where(np.isnan(log_lr), np.nan, np.exp(-np.maximum(log_lr, 0.0))))


def beta_binomial_log_bf(successes: npt.ArrayLike, failures: npt.ArrayLike, shape: float) -> Floats:
    """Log Bayes factor of ``q ~ Beta(shape, shape)`` against ``q = 1/2`` after ``successes`` and ``failures``:
    ``log B(shape + s, shape + f) - log B(shape, shape) + (s + f) log 2``, a test martingale under q = 1/2.

    >>> beta_binomial_log_bf([0, 10], [0, 0], 1.0).round(6).tolist()  # uniform prior: 2**10 / 11
    [0.0, 4.533577]
    """
    s = np.asarray(successes, dtype=np.float64)
    f = np.asarray(failures, dtype=np.float64)
    log_beta_post = log_gamma(shape + s) + log_gamma(shape + f) - log_gamma(2.0 * shape + s + f)
    log_beta_prior = 2.0 * math.lgamma(shape) - math.lgamma(2.0 * shape)
    return np.asarray(log_beta_post - log_beta_prior + (s + f) * math.log(2.0))


def dirichlet_multinomial_log_bf(counts: npt.ArrayLike, shares: npt.ArrayLike, concentration: float) -> Floats:
    """Log Bayes factor of ``Dirichlet(concentration * shares)`` against multinomial ``shares`` for the
    ``counts`` on the last axis (Lindon & Malek 2022), a test martingale under the null shares.

    >>> dirichlet_multinomial_log_bf([[0, 0], [60, 40]], [0.5, 0.5], 100.0).round(6).tolist()
    [0.0, 0.658892]
    """
    x = np.asarray(counts, dtype=np.float64)
    p = np.asarray(shares, dtype=np.float64)
    prior = concentration * p
    total = x.sum(axis=-1)
    per_arm = log_gamma(prior + x) - log_gamma(prior) - x * np.log(p)
    return np.asarray(math.lgamma(concentration) - log_gamma(concentration + total) + per_arm.sum(axis=-1))
