"""Validity of the A/B statistics under continuous monitoring: simulated A/A and A/B experiments.

    python bench/validity.py            # 1,000 experiments per scenario, 500 for A/B/n (~15 min on 2 cores)
    python bench/validity.py --quick    # a fifth of them
    python bench/validity.py --only family,guardrails --experiments 1000   # some sections (two-arm, cuped, ...)

Each simulated experiment randomises 20,000 units one by one to control or treatment (50/50). A unit has
1 + Poisson(9) requests (10 on average); a request's value is an nDCG@10-like number in [0, 1]: the unit's
mean ``m ~ Beta`` around the arm's mean (0.45 for control) and the request's value ``~ Beta`` around ``m``,
with total standard deviation 0.3 and the intra-class correlation (ICC) of the scenario. The experiment is
looked at after every 100 units (200 looks), as a dashboard refreshed continuously would.

Reported per scenario (every rate with its Wilson 95 % interval):

* the always-valid confidence sequence (``stream_eval.stats.compare``, cluster-robust variance, normal
  mixture tuned for N* = 10,000 units): the fraction of experiments whose CS ever excludes 0 (false alarms
  in A/A, power in A/B), and in A/B the median number of units at the first decision;
* the old method, a per-request Welch interval (every request independent: the formula of
  ``stream_eval.metrics.abtest.difference`` over ``Moments``, vectorised here and checked against it), peeked
  at the same looks, and at the final look only;
* the cluster-robust fixed interval peeked at every look and at the final look only (peeking and clustering
  are two separate errors);
* SRM on the A/A experiments: the sequential Dirichlet-multinomial p-value against Pearson's chi-squared,
  both peeked at every look, at 0.001 and 0.05; and detection of 49/51 and 48/52 splits;
* CUPED (``compare(..., cuped=True)``): units whose own pre-period value (1 + Poisson(9) requests before the
  experiment, around the same unit mean, so that the unit-level correlation of the pre- and post-period values as
  CUPED linearises them is ``rho``, measured too) is the covariate; in two scenarios a fifth of the units have no
  pre-period data. Per scenario
  (A/A, +1 %, +3 % at rho 0.5 and 0.7) with and without CUPED: false alarms / decisions, the median variance
  reduction at the last look and the median units to a decision (experiments never decided count as beyond the
  end);
* A/B/n through the engine's own code: 10,000 units randomised one by one to a control and 3 treatments, 9
  correlated metrics (the A/B rows of a report without ``--metrics``), looked at every 100 units. At each look the
  arms' sums go to the ``LookMerger`` the engine uses (``stream_eval.engine.ab``: ``compare`` per treatment, the
  running intersection of the sequences, e-BH over the family of goal metrics × treatments, the guardrails'
  non-inferiority tests) and ``recommend``; nothing of it is re-implemented here. Per scenario (every treatment =
  control; or one treatment = control and the others with true effects on some metrics), for the e-BH decisions
  and for the unadjusted ones (each row's own sequence): the share of experiments with at least one false
  discovery and the false-discovery rate (mean false-discovery proportion), when acting at the first decision, at
  the last look, and counting every decision ever shown; and the true effects found;
* guardrails, through the same code: treatments exactly at the tolerated loss (relative ``-2%`` on ERR@10,
  absolute ``-0.005`` on GAUC) and clearly beyond it: the share of experiments that ever recommend ``rollback``,
  and the median units to it.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stream_eval.config import Config, ExperimentSettings, Tolerance  # noqa: E402
from stream_eval.engine.ab import LookMerger, ShardLook, _decision, recommend  # noqa: E402
from stream_eval.metrics.abtest import difference  # noqa: E402
from stream_eval.metrics.aggregates import Moments  # noqa: E402
from stream_eval.metrics.specs import lower_is_better  # noqa: E402
from stream_eval.stats import ArmSums, PreSums, compare, srm_test  # noqa: E402
from stream_eval.stats.sequential import dirichlet_multinomial_log_bf  # noqa: E402

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

UNITS = 20_000
LOOK_EVERY = 100
MEAN, SD = 0.45, 0.3
ALPHA = 0.05
SEQUENTIAL_N = 10_000.0
CHUNK = 20  # experiments simulated at once (~4M requests, ~0.5 GB at the peak)


@dataclass(frozen=True)
class Scenario:
    name: str
    icc: float
    lift: float  # relative lift of the treatment mean


SCENARIOS = (
    Scenario("A/A, ICC 0.1", 0.1, 0.0),
    Scenario("A/A, ICC 0.3", 0.3, 0.0),
    Scenario("+1 %, ICC 0.1", 0.1, 0.01),
    Scenario("+3 %, ICC 0.1", 0.1, 0.03),
    Scenario("+1 %, ICC 0.3", 0.3, 0.01),
    Scenario("+3 %, ICC 0.3", 0.3, 0.03),
)


@dataclass
class ChunkResult:
    cs_first: npt.NDArray[np.int64]  # first look (index) where the CS excludes 0, -1 if never
    cs_sign: npt.NDArray[np.int64]  # +1 treatment better, -1 worse, 0 never
    robust_any: Bools  # cluster-robust fixed interval excludes 0 at some look
    robust_final: Bools
    welch_any: Bools  # per-request Welch interval excludes 0 at some look
    welch_final: Bools
    treated: npt.NDArray[np.int64]  # units in treatment at every look, shape (experiments, looks)
    check: float  # largest relative gap between the vectorised Welch bounds and abtest.difference


def beta_shapes(icc: float) -> tuple[float, float]:
    """Concentrations of the unit-mean Beta (phi) and the request-value Beta (kappa) for the target sd and ICC.

    Var(m) = mu (1 - mu) / (phi + 1) = sd^2 icc; E Var(v | m) = E[m (1 - m)] / (kappa + 1) = sd^2 (1 - icc)."""
    spread = MEAN * (1 - MEAN)
    phi = spread / (SD * SD * icc) - 1
    kappa = spread * phi / (phi + 1) / (SD * SD * (1 - icc)) - 1
    return phi, kappa


def first_true(flags: Bools) -> npt.NDArray[np.int64]:
    """Index of the first True of every row, -1 for rows without one."""
    first = np.argmax(flags, axis=1)
    return np.where(flags.any(axis=1), first, -1).astype(np.int64)


def welch_bounds(control: tuple[Floats, ...], treatment: tuple[Floats, ...]) -> tuple[Floats, Floats]:
    """``stream_eval.metrics.abtest.difference`` vectorised: (requests, sum, sum of squares) per arm in."""
    z = NormalDist().inv_cdf(0.5 + (1 - ALPHA) / 2)
    stats = []
    for count, total, total_sq in (control, treatment):
        mean = total / count
        variance = np.maximum(total_sq / count - mean**2, 0.0) * count / (count - 1)
        stats.append((mean, variance, count))
    (mean_c, var_c, n_c), (mean_t, var_t, n_t) = stats
    delta = mean_t - mean_c
    half = z * np.sqrt(var_t / n_t + var_c / n_c)
    return delta - half, delta + half


def check_against_difference(control: tuple[Floats, ...], treatment: tuple[Floats, ...], lower: Floats) -> float:
    """Largest relative gap between our vectorised Welch bounds and ``difference()`` on Moments at some looks."""
    gap = 0.0
    for look in (0, lower.shape[1] // 2, lower.shape[1] - 1):
        arms = []
        for count, total, total_sq in (control, treatment):
            m = Moments(1)
            m.count[0] = int(count[0, look])
            m.weight[0] = m.weight_sq[0] = count[0, look]
            m.total[0], m.total_sq[0] = total[0, look], total_sq[0, look]
            arms.append(m)
        reference = difference(arms[0], arms[1], 1 - ALPHA)[0].ci_lower
        gap = max(gap, abs(lower[0, look] - reference) / abs(reference))
    return gap


def simulate(seed: np.random.SeedSequence, experiments: int, scenario: Scenario) -> ChunkResult:
    rng = np.random.default_rng(seed)
    phi, kappa = beta_shapes(scenario.icc)
    treated = rng.random((experiments, UNITS)) < 0.5
    requests = 1 + rng.poisson(9.0, (experiments, UNITS))
    arm_mean = np.where(treated, MEAN * (1 + scenario.lift), MEAN)
    unit_mean = rng.beta(arm_mean * phi, (1 - arm_mean) * phi)
    flat_counts = requests.ravel()
    per_request_mean = np.repeat(unit_mean.ravel(), flat_counts)
    values = rng.beta(per_request_mean * kappa, (1 - per_request_mean) * kappa)
    starts = np.concatenate([[0], np.cumsum(flat_counts)[:-1]])
    y = np.add.reduceat(values, starts).reshape(experiments, UNITS)
    y_sq = np.add.reduceat(values * values, starts).reshape(experiments, UNITS)
    del values, per_request_mean
    n = requests.astype(np.float64)

    def at_looks(x: Floats, arm: Bools) -> Floats:
        running: Floats = np.cumsum(np.where(arm, x, 0.0), axis=1)
        return running[:, LOOK_EVERY - 1 :: LOOK_EVERY]

    def arm_sums(arm: Bools) -> ArmSums:
        return ArmSums(
            units=at_looks(np.ones_like(y), arm),
            y=at_looks(y, arm),
            n=at_looks(n, arm),
            yy=at_looks(y * y, arm),
            nn=at_looks(n * n, arm),
            yn=at_looks(y * n, arm),
        )

    control, treatment = arm_sums(~treated), arm_sums(treated)
    c = compare(control, treatment, confidence=1 - ALPHA, sequential_n=SEQUENTIAL_N)
    excludes = (c.cs_lower > 0) | (c.cs_upper < 0)
    cs_first = first_true(excludes)
    rows = np.arange(experiments)
    cs_sign = np.where(cs_first >= 0, np.sign(c.delta[rows, np.maximum(cs_first, 0)]), 0).astype(np.int64)
    robust = (c.ci_lower > 0) | (c.ci_upper < 0)
    welch_c = (control.n, control.y, at_looks(y_sq, ~treated))
    welch_t = (treatment.n, treatment.y, at_looks(y_sq, treated))
    lower, upper = welch_bounds(welch_c, welch_t)
    welch = (lower > 0) | (upper < 0)
    return ChunkResult(
        cs_first=cs_first,
        cs_sign=cs_sign,
        robust_any=robust.any(axis=1),
        robust_final=robust[:, -1],
        welch_any=welch.any(axis=1),
        welch_final=welch[:, -1],
        treated=treatment.units.astype(np.int64),
        check=check_against_difference(welch_c, welch_t, lower),
    )


@dataclass(frozen=True)
class CupedScenario:
    name: str
    rho: float  # target unit-level correlation of the pre- and post-period means
    lift: float
    missing: float = 0.0  # share of units without pre-period data
    sequential_n: float = SEQUENTIAL_N  # N*: the units the confidence sequences are tuned for


CUPED_UNITS = 60_000  # (a +1 % lift needs more units than the other scenarios' 20,000 to be decided)


CUPED_SCENARIOS = (
    CupedScenario("A/A, rho 0.5", 0.5, 0.0),
    CupedScenario("A/A, rho 0.5, 20 % without pre-period", 0.5, 0.0, 0.2),
    CupedScenario("+1 %, rho 0.5", 0.5, 0.01),
    CupedScenario("+3 %, rho 0.5", 0.5, 0.03),
    CupedScenario("+3 %, rho 0.5, 20 % without pre-period", 0.5, 0.03, 0.2),
    CupedScenario("+1 %, rho 0.7", 0.7, 0.01),
    CupedScenario("+3 %, rho 0.7", 0.7, 0.03),
)


@dataclass
class CupedResult:
    first: npt.NDArray[np.int64]  # (2, experiments): first look deciding, without and with CUPED; -1 never
    sign: npt.NDArray[np.int64]  # (2, experiments): the sign of the delta there
    reduction: Floats  # (experiments,) variance reduction at the last look
    imbalance: Bools  # (experiments,) the pre-period check ever below 0.05
    correlation: Floats  # (experiments,) the units' correlation of the linearised pre- and in-experiment values


def cuped_simulate(seed: np.random.SeedSequence, experiments: int, scenario: CupedScenario) -> CupedResult:
    """Units with a persistent mean ``m`` (Gaussian, variance ``s``) shared by both periods and Gaussian request noise
    (variance ``SD**2 - s``); ``n`` and ``q`` requests in the two periods, each 1 + Poisson(k - 1).

    What CUPED uses of a ratio metric is the unit's linearised value, ``y - R n`` and ``x - R_x q``; their
    correlation is ``k**2 s / ((k**2 + k - 1) s + k (SD**2 - s))`` (the counts are independent of ``m``, and
    ``E[n**2] = k**2 + k - 1``): ``s`` is set so that it is ``rho``, and the variance reduction is ``rho**2``. The
    correlation is also measured on the data (``CupedResult.correlation``)."""
    rng = np.random.default_rng(seed)
    k = 10.0  # mean requests per unit and period
    rho = scenario.rho
    # rho ((k^2 + k - 1) s + k (SD^2 - s)) = k^2 s: solve for the unit-mean variance s
    unit_var = rho * k * SD * SD / (k * k - rho * (k * k - 1.0))
    noise_var = SD * SD - unit_var
    shape = (experiments, CUPED_UNITS)
    treated = rng.random(shape) < 0.5
    m = MEAN + rng.normal(0.0, math.sqrt(unit_var), shape)
    n = 1.0 + rng.poisson(k - 1.0, shape)
    q = np.where(rng.random(shape) < scenario.missing, 0.0, 1.0 + rng.poisson(k - 1.0, shape))
    y = n * (m + np.where(treated, MEAN * scenario.lift, 0.0)) + np.sqrt(n * noise_var) * rng.normal(0.0, 1.0, shape)
    x = q * m + np.sqrt(q * noise_var) * rng.normal(0.0, 1.0, shape)

    def arm(mask: Bools) -> ArmSums:
        def at_looks(v: Floats) -> Floats:
            running: Floats = np.cumsum(np.where(mask, v, 0.0), axis=1)
            return running[:, LOOK_EVERY - 1 :: LOOK_EVERY]

        base = ArmSums(at_looks(np.ones_like(y)), at_looks(y), at_looks(n), at_looks(y * y), at_looks(n * n),
                       at_looks(y * n))
        return base.with_pre(PreSums(at_looks((q > 0).astype(np.float64)), at_looks(x), at_looks(q),
                                     at_looks(x * x), at_looks(q * q), at_looks(x * q), at_looks(y * x),
                                     at_looks(y * q), at_looks(n * x), at_looks(n * q)))

    control, treatment = arm(~treated), arm(treated)
    firsts, signs = [], []
    rows = np.arange(experiments)
    reduction = np.full(experiments, np.nan)
    imbalance = np.zeros(experiments, dtype=np.bool_)
    for cuped in (False, True):
        c = compare(control, treatment, confidence=1 - ALPHA, sequential_n=scenario.sequential_n, cuped=cuped)
        # the running intersection of the sequences, as the engine keeps it
        lower, upper = np.fmax.accumulate(c.cs_lower, axis=1), np.fmin.accumulate(c.cs_upper, axis=1)
        first = first_true((lower > 0) | (upper < 0))
        firsts.append(first)
        signs.append(np.where(first >= 0, np.sign(c.delta[rows, np.maximum(first, 0)]), 0).astype(np.int64))
        if cuped:
            reduction = c.variance_reduction[:, -1]
            imbalance = (c.pre_p_value < 0.05).any(axis=1)
    return CupedResult(np.stack(firsts), np.stack(signs), reduction, imbalance, linearised_correlation(y, n, x, q))


def linearised_correlation(y: Floats, n: Floats, x: Floats, q: Floats) -> Floats:
    """Per experiment (row), the correlation over units of ``y - R n`` and ``x - R_x q`` (``R``: the ratio of the
    sums), the quantities whose regression CUPED's delta method makes for ratio metrics."""
    ly = y - (y.sum(axis=1) / n.sum(axis=1))[:, None] * n
    lx = x - (x.sum(axis=1) / np.maximum(q.sum(axis=1), 1e-300))[:, None] * q
    ly -= ly.mean(axis=1, keepdims=True)
    lx -= lx.mean(axis=1, keepdims=True)
    return (ly * lx).sum(axis=1) / np.sqrt((ly * ly).sum(axis=1) * (lx * lx).sum(axis=1))


def run_cuped(scenario: CupedScenario, experiments: int, seed: int, pool: ProcessPoolExecutor) -> CupedResult:
    sizes = [min(CHUNK, experiments - start) for start in range(0, experiments, CHUNK)]
    seeds = np.random.SeedSequence([seed, 7, int(scenario.rho * 1000), int(scenario.lift * 1000)]).spawn(len(sizes))
    parts = list(pool.map(cuped_simulate, seeds, sizes, [scenario] * len(sizes)))
    return CupedResult(np.concatenate([p.first for p in parts], axis=1),
                       np.concatenate([p.sign for p in parts], axis=1),
                       np.concatenate([p.reduction for p in parts]), np.concatenate([p.imbalance for p in parts]),
                       np.concatenate([p.correlation for p in parts]))


def median_units(first: npt.NDArray[np.int64]) -> float:
    """Median units to a decision, an experiment never decided counting as beyond the end (inf)."""
    units = np.where(first >= 0, (first + 1) * LOOK_EVERY, np.inf).astype(np.float64)
    return float(np.median(units))


def print_cuped(results: dict[str, CupedResult], experiments: int, sequential_n: float) -> None:
    print(f"\nCUPED: {experiments} experiments per scenario, {CUPED_UNITS:,} units, a look every {LOOK_EVERY}, "
          f"N* = {sequential_n:,.0f}.\n")
    print("| scenario | decided (plain) | decided (CUPED) | median units to a decision: plain | CUPED | fewer units "
          "| median variance reduction | measured correlation (median) | pre-period check ever < 0.05 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for scenario in CUPED_SCENARIOS:
        r = results[scenario.name]
        cells = [scenario.name]
        medians = []
        for k in (0, 1):
            decided = r.first[k] >= 0
            wrong = int((r.sign[k] < 0).sum()) if scenario.lift > 0 else None
            cells.append(rate(decided) + ("" if wrong is None else f", {wrong} wrong-way"))
            medians.append(median_units(r.first[k]))
        if scenario.lift > 0:
            plain, adjusted = medians
            cells += [f"{plain:,.0f}" if math.isfinite(plain) else "> end",
                      f"{adjusted:,.0f}" if math.isfinite(adjusted) else "> end",
                      f"{100 * (1 - adjusted / plain):.0f} %" if math.isfinite(plain) else "-"]
        else:
            cells += ["-", "-", "-"]
        cells += [f"{100 * float(np.median(r.reduction)):.1f} %", f"{float(np.median(r.correlation)):.3f}",
                  rate(r.imbalance)]
        print("| " + " | ".join(cells) + " |")


# ---- A/B/n: a family of tests and guardrails, through the engine's own LookMerger ---------------------------

#: The A/B rows of a report without ``--metrics`` (the default measures at cutoff 10, and GAUC): nine metrics.
NAMES = tuple(spec.mean_name for spec in Config().specs) + ("GAUC",)
#: Each metric's control mean (ratio metrics, every request valued; one standard deviation, ``SD``, for all).
MEANS = {"MRR": 0.55, "MAP": 0.40, "P@10": 0.25, "R@10": 0.50, "DCG@10": 0.90, "nDCG@10": 0.45, "ERR@10": 0.30,
         "alpha-nDCG@10": 0.40, "GAUC": 0.70}
ARMS_UNITS = 10_000  # units of every arm together, randomised one by one with equal shares
ARMS_ICC = 0.2  # the share of a request value's variance that is its unit's
METRIC_CORRELATION = 0.7  # correlation between metrics of a unit's means, and of a request's values
ARMS_CHUNK = 10  # experiments simulated at once (each then looked at through a LookMerger of its own)
EXPERIMENT = "exp"


@dataclass(frozen=True)
class ArmsScenario:
    name: str
    settings: ExperimentSettings  # the [experiments.exp] table (control "control")
    treatments: tuple[str, ...]
    effects: tuple[tuple[str, str, str, float], ...]  # (treatment, metric, "lift" | "delta", true value)

    def means(self) -> Floats:
        """True means, arms (control first) x metrics."""
        means = np.tile(np.array([MEANS[name] for name in NAMES]), (1 + len(self.treatments), 1))
        for treatment, metric, kind, value in self.effects:
            row, column = 1 + self.treatments.index(treatment), NAMES.index(metric)
            means[row, column] = means[0, column] * (1 + value) if kind == "lift" else means[0, column] + value
        return means


FAMILY_SCENARIOS = (
    ArmsScenario("every treatment = control (27 true nulls)", ExperimentSettings(control="control"),
                 ("t1", "t2", "t3"), ()),
    ArmsScenario("t1 = control; t2 +5 % on MRR, MAP, nDCG@10; t3 +5 % on P@10, R@10, DCG@10, nDCG@10 and -5 % on "
                 "ERR@10 (19 true nulls)", ExperimentSettings(control="control"), ("t1", "t2", "t3"),
                 (*(("t2", m, "lift", 0.05) for m in ("MRR", "MAP", "nDCG@10")),
                  *(("t3", m, "lift", 0.05) for m in ("P@10", "R@10", "DCG@10", "nDCG@10")),
                  ("t3", "ERR@10", "lift", -0.05))),
)
GUARDRAILS = (("ERR@10", Tolerance(-0.02, True)), ("GAUC", Tolerance(-0.005, False)))
GUARDRAIL_SCENARIO = ArmsScenario(
    "guardrails ERR@10 -2 %, GAUC -0.005", ExperimentSettings(control="control", primary=("nDCG@10",),
                                                              guardrails=GUARDRAILS),
    ("at -2 % on ERR@10", "at -0.005 on GAUC", "-10 % on ERR@10", "-0.025 on GAUC"),
    (("at -2 % on ERR@10", "ERR@10", "lift", -0.02), ("at -0.005 on GAUC", "GAUC", "delta", -0.005),
     ("-10 % on ERR@10", "ERR@10", "lift", -0.10), ("-0.025 on GAUC", "GAUC", "delta", -0.025)))


@dataclass
class ArmsResult:
    ebh: npt.NDArray[np.int8]  # (experiments, looks, rows): +1 decided better, -1 worse, 0 not; after e-BH
    plain: npt.NDArray[np.int8]  # the same from each row's own confidence sequence (unadjusted)
    rollback: Bools  # (experiments, looks, treatments): the recommendation is rollback

    @staticmethod
    def join(parts: list[ArmsResult]) -> ArmsResult:
        return ArmsResult(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(ArmsResult)))


_SIGN = {"better": 1, "worse": -1, "inconclusive": 0}


def arms_simulate(seed: np.random.SeedSequence, experiments: int, scenario: ArmsScenario) -> ArmsResult:
    """Units with a mean per metric (``ARMS_ICC`` of the variance, correlated over metrics) and Gaussian request
    noise (correlated over metrics too), 1 + Poisson(9) requests each; every look's per-arm sums go through a
    ``LookMerger`` and ``recommend``, as the engine's looks do."""
    rng = np.random.default_rng(seed)
    arms = ("control", *scenario.treatments)
    width = len(NAMES)
    shape = (experiments, ARMS_UNITS)
    arm = rng.integers(0, len(arms), shape)
    n = 1.0 + rng.poisson(9.0, shape)
    shared, own = math.sqrt(METRIC_CORRELATION), math.sqrt(1.0 - METRIC_CORRELATION)

    def correlated() -> Floats:
        return shared * rng.normal(size=shape)[..., None] + own * rng.normal(size=(*shape, width))

    unit = SD * math.sqrt(ARMS_ICC) * correlated()
    noise = SD * math.sqrt(1.0 - ARMS_ICC) * np.sqrt(n)[..., None] * correlated()
    y = n[..., None] * (scenario.means()[arm] + unit) + noise
    del unit, noise
    counts = np.broadcast_to(n[..., None], y.shape)
    values = (np.ones_like(y), y, counts, y * y, counts * counts, y * counts)  # the six sums of ArmSums
    looks = ARMS_UNITS // LOOK_EVERY
    sums = np.empty((len(arms), len(values), experiments, looks, width))
    for a in range(len(arms)):
        mine = (arm == a)[..., None]
        for f, v in enumerate(values):
            sums[a, f] = np.cumsum(np.where(mine, v, 0.0), axis=1)[:, LOOK_EVERY - 1 :: LOOK_EVERY]
    config = Config(experiments=((EXPERIMENT, scenario.settings),), confidence=1 - ALPHA, sequential_n=SEQUENTIAL_N)
    order = {(t, m): k for k, (t, m) in enumerate((t, m) for t in scenario.treatments for m in NAMES)}
    out = ArmsResult(np.zeros((experiments, looks, len(order)), dtype=np.int8),
                     np.zeros((experiments, looks, len(order)), dtype=np.int8),
                     np.zeros((experiments, looks, len(scenario.treatments)), dtype=np.bool_))
    for e in range(experiments):
        merger = LookMerger(config, NAMES)
        for j in range(looks):
            look = ShardLook(EXPERIMENT, 0, list(arms), [ArmSums.from_values(list(sums[a, :, e, j])) for a in
                                                         range(len(arms))],
                             [int(sums[a, 0, e, j, 0]) for a in range(len(arms))], 0, 0)
            merger.add(float(j + 1), [look])
            merger.progress(0, float(j + 1))
            rows, _ = merger.results()
            for row in rows:
                k = order[row.treatment, row.metric]
                out.ebh[e, j, k] = _SIGN[row.decision]
                out.plain[e, j, k] = _SIGN[_decision(row.cs_lower, row.cs_upper)]
            for r in recommend(rows, config):
                out.rollback[e, j, scenario.treatments.index(r.treatment)] = r.recommendation == "rollback"
    return out


def run_arms(scenario: ArmsScenario, experiments: int, seed: int, pool: ProcessPoolExecutor) -> ArmsResult:
    sizes = [min(ARMS_CHUNK, experiments - start) for start in range(0, experiments, ARMS_CHUNK)]
    seeds = np.random.SeedSequence([seed, 11, len(scenario.effects), len(scenario.settings.guardrails)]).spawn(
        len(sizes))
    return ArmsResult.join(list(pool.map(arms_simulate, seeds, sizes, [scenario] * len(sizes))))


@dataclass
class FamilyRates:
    """Per experiment, at one moment: whether it shows a false discovery, its false-discovery proportion, and the
    share of the true effects it shows in their true direction."""

    false_any: Bools
    fdp: Floats
    found: Floats


def family_rates(decisions: npt.NDArray[np.int8], truth: npt.NDArray[np.int64]) -> dict[str, FamilyRates]:
    """At the first look with a decision (else the last), at the last look, and over every look (a row counts as
    discovered if it was ever decided, falsely if ever decided against its true sign: 0 for a true null)."""
    decided = decisions != 0
    wrong = decided & (decisions != truth)
    right = decided & (decisions == truth) & (truth != 0)
    first = first_true(decided.any(axis=2))
    stop = np.where(first >= 0, first, decisions.shape[1] - 1)
    rows = np.arange(decisions.shape[0])
    effects = max(int((truth != 0).sum()), 1)
    moments = {"at the first decision": (wrong[rows, stop], decided[rows, stop], right[rows, stop]),
               "at the last look": (wrong[:, -1], decided[:, -1], right[:, -1]),
               "ever, over all looks": (wrong.any(axis=1), decided.any(axis=1), right.any(axis=1))}
    out = {}
    for name, (false, shown, true) in moments.items():
        fdp = false.sum(axis=1) / np.maximum(shown.sum(axis=1), 1)
        out[name] = FamilyRates(false.any(axis=1), fdp, true.sum(axis=1) / effects)
    return out


def mean_rate(values: Floats) -> str:
    """A mean of values in [0, 1] with the Wilson interval (valid there: such a value's variance is at most
    mean (1 - mean), the binomial's)."""
    lo, hi = wilson(float(values.sum()), int(values.size))
    return f"{100 * float(values.mean()):.1f} % ({100 * lo:.1f}-{100 * hi:.1f})"


def print_family(results: dict[str, ArmsResult], experiments: int) -> None:
    print(f"\nA/B/n: {experiments} experiments per scenario, {ARMS_UNITS:,} units in 4 arms (control, t1, t2, t3), "
          f"{len(NAMES)} metrics ({', '.join(NAMES)}; a unit's metrics correlated {METRIC_CORRELATION}, ICC "
          f"{ARMS_ICC}), a look every {LOOK_EVERY} units; decisions and rows from the engine's LookMerger. Family: "
          f"the 27 rows (goal metrics x treatments), alpha {ALPHA}. A false discovery: a true null decided, or an "
          "effect decided the wrong way. Rates with Wilson 95 % intervals (for the FDR, on the mean false-discovery "
          "proportion).\n")
    print("| scenario | decisions | when | experiments with a false discovery | FDR | true effects found |")
    print("|---|---|---|---|---|---|")
    for scenario in FAMILY_SCENARIOS:
        r = results[scenario.name]
        truth = np.sign(scenario.means()[1:] - scenario.means()[0]).astype(np.int64).ravel()
        assert not any(lower_is_better(name) for name in NAMES)  # (+1 is a rise here)
        for method, decisions in (("e-BH (the product's)", r.ebh), ("unadjusted", r.plain)):
            for when, rates in family_rates(decisions, truth).items():
                found = f"{100 * float(rates.found.mean()):.0f} %" if truth.any() else "-"
                print(f"| {scenario.name} | {method} | {when} | {rate(rates.false_any)} | {mean_rate(rates.fdp)} "
                      f"| {found} |")


def print_guardrails(result: ArmsResult, experiments: int) -> None:
    scenario = GUARDRAIL_SCENARIO
    margins = ", ".join(f"{metric} {tolerance.label()}" for metric, tolerance in GUARDRAILS)
    print(f"\nGuardrails ({margins}; primary nDCG@10): {experiments} experiments, {ARMS_UNITS:,} units in "
          f"{1 + len(scenario.treatments)} arms, a look every {LOOK_EVERY} units; recommendations from the engine's "
          "LookMerger and recommend(). Each treatment is at or beyond the tolerated loss on one guardrail and equal "
          "to the control elsewhere. Units: of the experiment (all arms) at the look; an experiment never rolled back "
          "counts as beyond the end.\n")
    print("| treatment | true value | ever recommended rollback | median units to rollback | ... of those rolled "
          "back |")
    print("|---|---|---|---|---|")
    for k, (treatment, metric, kind, value) in enumerate(scenario.effects):
        ever = result.rollback[:, :, k].any(axis=1)
        first = first_true(result.rollback[:, :, k])
        units = (first[first >= 0] + 1) * LOOK_EVERY
        median = median_units(first)
        true = f"{100 * value:+g} % lift" if kind == "lift" else f"{value:+g} delta"
        print(f"| {treatment} | {metric} {true} | {rate(ever)} | "
              f"{f'{median:,.0f}' if math.isfinite(median) else '> end'} | "
              f"{f'{np.median(units):,.0f}' if units.size else '-'} |")


def run_scenario(scenario: Scenario, experiments: int, seed: int, pool: ProcessPoolExecutor) -> ChunkResult:
    sizes = [min(CHUNK, experiments - start) for start in range(0, experiments, CHUNK)]
    seeds = np.random.SeedSequence([seed, int(scenario.icc * 1000), int(scenario.lift * 1000)]).spawn(len(sizes))
    parts = list(pool.map(simulate, seeds, sizes, [scenario] * len(sizes)))
    joined = {
        f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(ChunkResult) if f.name != "check"
    }
    return ChunkResult(**joined, check=max(p.check for p in parts))


def wilson(successes: float, trials: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927)."""
    if trials == 0:
        return math.nan, math.nan
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(flags: Bools) -> str:
    k, total = int(flags.sum()), int(flags.size)
    lo, hi = wilson(k, total)
    return f"{100 * k / total:.1f} % ({100 * lo:.1f}-{100 * hi:.1f})"


def srm_rates(treated: npt.NDArray[np.int64]) -> dict[str, Bools]:
    """Ever-rejected flags per experiment of the sequential and Pearson SRM tests, peeked at every look."""
    looks = np.arange(LOOK_EVERY, UNITS + 1, LOOK_EVERY)
    sequential = np.empty(treated.shape)
    pearson = np.empty(treated.shape)
    for e in range(treated.shape[0]):
        for j in range(treated.shape[1]):
            test = srm_test([float(looks[j] - treated[e, j]), float(treated[e, j])], [0.5, 0.5])
            sequential[e, j], pearson[e, j] = test.sequential_p_value, test.p_value
    return {
        "sequential < 0.05": (sequential < 0.05).any(axis=1),
        "sequential < 0.001": (sequential < 0.001).any(axis=1),
        "Pearson < 0.001": (pearson < 0.001).any(axis=1),
        "Pearson < 0.05": (pearson < 0.05).any(axis=1),
    }


def srm_broken_split(experiments: int, seed: int, share: float = 0.49) -> tuple[Bools, Floats]:
    """Detection by the sequential SRM test (p < 0.001) of a ``share`` split, and units at detection."""
    rng = np.random.default_rng(seed)
    treated = np.cumsum(rng.random((experiments, UNITS)) < share, axis=1)[:, LOOK_EVERY - 1 :: LOOK_EVERY]
    looks = np.arange(LOOK_EVERY, UNITS + 1, LOOK_EVERY)
    counts = np.stack([looks - treated, treated], axis=-1)
    p = np.exp(-np.maximum(dirichlet_multinomial_log_bf(counts, [0.5, 0.5], 100.0), 0.0))
    first = first_true(p < 0.001)
    return first >= 0, ((first[first >= 0] + 1) * LOOK_EVERY).astype(np.float64)


def two_arm(experiments: int, seed: int, jobs: int) -> None:
    """The two-arm A/A and A/B scenarios and SRM."""
    results: dict[str, ChunkResult] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for scenario in SCENARIOS:
            t0 = time.perf_counter()
            results[scenario.name] = run_scenario(scenario, experiments, seed, pool)
            print(f"# {scenario.name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    gap = max(r.check for r in results.values())
    assert gap < 1e-9, f"vectorised Welch differs from abtest.difference by {gap}"

    print(f"{experiments} experiments per scenario, {UNITS:,} units each (50/50), a look every {LOOK_EVERY} units;")
    print(f"alpha = {ALPHA}, N* = {SEQUENTIAL_N:,.0f}; rates with Wilson 95 % intervals.\n")
    print(
        "| scenario | CS ever excludes 0 | per-request Welch, peeked | per-request Welch, final look "
        "| cluster-robust fixed, peeked | cluster-robust fixed, final look | CS: median units at decision (decided) |"
    )
    print("|---|---|---|---|---|---|---|")
    for scenario in SCENARIOS:
        r = results[scenario.name]
        decided = r.cs_first >= 0
        median = f"{np.median((r.cs_first[decided] + 1) * LOOK_EVERY):,.0f}" if decided.any() else "-"
        wrong = int((r.cs_sign < 0).sum()) if scenario.lift > 0 else None
        cs = rate(decided) + ("" if wrong is None else f", {wrong} wrong-way")
        row = [scenario.name, cs, rate(r.welch_any), rate(r.welch_final), rate(r.robust_any), rate(r.robust_final)]
        print("| " + " | ".join([*row, median if scenario.lift > 0 else "-"]) + " |")

    treated = np.concatenate([results[s.name].treated for s in SCENARIOS if s.lift == 0])
    print(
        f"\nSRM under a correct 50/50 split ({treated.shape[0]} A/A experiments, 200 looks each), "
        "fraction ever flagged:\n"
    )
    print("| test | false alarms |")
    print("|---|---|")
    for name, flags in srm_rates(treated).items():
        print(f"| {name} | {rate(flags)} |")
    print()
    for share in (0.49, 0.48):
        detected, units = srm_broken_split(experiments, seed + 1, share)
        median = f"{np.median(units):,.0f}" if units.size else "-"
        print(
            f"SRM of a {100 * share:.0f}/{100 - 100 * share:.0f} split: sequential p < 0.001 in {rate(detected)} "
            f"of {experiments} experiments by {UNITS:,} units, median {median} units to detection."
        )


SECTIONS = ("two-arm", "cuped", "family", "guardrails")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a fifth of the experiments per scenario")
    parser.add_argument("--experiments", type=int, default=None,
                        help="per scenario (default 1000, and 500 for family and guardrails; a fifth with --quick)")
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections to run, of {', '.join(SECTIONS)} (default all)")
    parser.add_argument("--cuped-only", action="store_true", help="only the CUPED scenarios (--only cuped)")
    parser.add_argument("--sequential-n", type=float, default=SEQUENTIAL_N,
                        help=f"N* of the CUPED scenarios' confidence sequences (default {SEQUENTIAL_N:,.0f}): the "
                             "same data, the sequences tuned for fewer or more units")
    args = parser.parse_args(argv)
    only = {"cuped"} if args.cuped_only else set(args.only.split(","))
    unknown = only - set(SECTIONS)
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(sorted(unknown))}")
    experiments = args.experiments or (200 if args.quick else 1000)
    # the A/B/n sections go through the engine's merger look by look: fewer experiments by default
    engine_experiments = args.experiments or (100 if args.quick else 500)
    started = time.perf_counter()
    if "two-arm" in only:
        two_arm(experiments, args.seed, args.jobs)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        if "cuped" in only:
            scenarios = [replace(s, sequential_n=args.sequential_n) for s in CUPED_SCENARIOS]
            print_cuped({s.name: run_cuped(s, experiments, args.seed, pool) for s in scenarios}, experiments,
                        args.sequential_n)
        if "family" in only:
            family = {}
            for scenario in FAMILY_SCENARIOS:
                t0 = time.perf_counter()
                family[scenario.name] = run_arms(scenario, engine_experiments, args.seed, pool)
                print(f"# {scenario.name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            print_family(family, engine_experiments)
        if "guardrails" in only:
            t0 = time.perf_counter()
            guarded = run_arms(GUARDRAIL_SCENARIO, engine_experiments, args.seed, pool)
            print(f"# {GUARDRAIL_SCENARIO.name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            print_guardrails(guarded, engine_experiments)
    print(
        f"\n{platform.python_implementation()} {platform.python_version()}, numpy {np.__version__}, "
        f"{args.jobs} jobs, {time.perf_counter() - started:.0f} s in all."
    )


if __name__ == "__main__":
    main()
