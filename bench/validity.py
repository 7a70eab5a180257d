"""Validity of the A/B statistics under continuous monitoring: simulated A/A and A/B experiments.

    python bench/validity.py            # 1,000 experiments per scenario (a few minutes on 2 cores)
    python bench/validity.py --quick    # 200 experiments per scenario

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
  both peeked at every look, at 0.001 and 0.05; and detection of 49/51 and 48/52 splits.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stream_eval.metrics.abtest import difference  # noqa: E402
from stream_eval.metrics.aggregates import Moments  # noqa: E402
from stream_eval.stats import ArmSums, compare, srm_test  # noqa: E402
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


def run_scenario(scenario: Scenario, experiments: int, seed: int, pool: ProcessPoolExecutor) -> ChunkResult:
    sizes = [min(CHUNK, experiments - start) for start in range(0, experiments, CHUNK)]
    seeds = np.random.SeedSequence([seed, int(scenario.icc * 1000), int(scenario.lift * 1000)]).spawn(len(sizes))
    parts = list(pool.map(simulate, seeds, sizes, [scenario] * len(sizes)))
    joined = {
        f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(ChunkResult) if f.name != "check"
    }
    return ChunkResult(**joined, check=max(p.check for p in parts))


def wilson(successes: int, trials: int, z: float = 1.959963984540054) -> tuple[float, float]:
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 experiments per scenario")
    parser.add_argument("--experiments", type=int, default=None, help="per scenario (default 1000, 200 with --quick)")
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    experiments = args.experiments or (200 if args.quick else 1000)
    started = time.perf_counter()
    results: dict[str, ChunkResult] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for scenario in SCENARIOS:
            t0 = time.perf_counter()
            results[scenario.name] = run_scenario(scenario, experiments, args.seed, pool)
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
        detected, units = srm_broken_split(experiments, args.seed + 1, share)
        median = f"{np.median(units):,.0f}" if units.size else "-"
        print(
            f"SRM of a {100 * share:.0f}/{100 - 100 * share:.0f} split: sequential p < 0.001 in {rate(detected)} "
            f"of {experiments} experiments by {UNITS:,} units, median {median} units to detection."
        )
    print(
        f"\n{platform.python_implementation()} {platform.python_version()}, numpy {np.__version__}, "
        f"{args.jobs} jobs, {time.perf_counter() - started:.0f} s in all."
    )


if __name__ == "__main__":
    main()
