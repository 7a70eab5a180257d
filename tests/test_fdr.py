"""False-discovery control (stats/fdr.py, engine/ab.py): e-BH on the normal-mixture e-values.

* e-BH's rejections satisfy its definition (Wang & Ramdas 2022) for any e-values, and equal BH's (scipy) on the
  p-values 1 / e;
* simulated experiments of one control and three treatments sharing it, nine correlated metrics each (so the tests
  are dependent), some true effects: the false-discovery rate of e-BH stays at most alpha while it still finds the
  true effects;
* through the engine: decisions are those e-BH allows, ``p_value`` stays unadjusted.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_eval.config import Config, ExperimentSettings
from stream_eval.engine.replay import replay
from stream_eval.simulate import SimulationConfig, simulate_lines
from stream_eval.stats import ArmSums, compare, e_bh

LOG_E = st.one_of(st.floats(-20, 20), st.just(math.nan), st.sampled_from([math.log(20.0), math.log(40.0)]))


@settings(max_examples=400, deadline=None)
@given(st.lists(LOG_E, max_size=30), st.sampled_from([0.01, 0.05, 0.1, 0.5]))
def test_e_bh_rejects_what_its_definition_says(log_e: list[float], alpha: float) -> None:
    rejected = e_bh(log_e, alpha)
    count = len(log_e)
    e = np.exp(np.nan_to_num(np.array(log_e, dtype=np.float64), nan=-np.inf))
    k = int(rejected.sum())
    # the k largest e-values are rejected, each at least K / (alpha k) ...
    if k:
        assert e[rejected].min() >= e[~rejected].max(initial=0.0)
        assert e[rejected].min() * (1 + 1e-12) >= count / (alpha * k)
    # ... and no larger k qualifies
    for larger in range(k + 1, count + 1):
        assert np.count_nonzero(e * (1 + 1e-12) >= count / (alpha * larger)) < larger
    # e-BH is BH on the p-values 1 / e (capped at 1)
    if count:
        with np.errstate(divide="ignore"):
            p = np.minimum(1.0, 1.0 / e)
        bh = scipy.stats.false_discovery_control(p, method="bh") <= alpha
        assert (bh == rejected).all() or np.any(np.isclose(p * count / alpha, np.arange(1, count + 1)[:, None]))


def _sums(values: np.ndarray) -> ArmSums:
    """An arm of one request per unit: ``values`` of shape (units, experiments, metrics)."""
    units = np.full(values.shape[1:], float(values.shape[0]))
    return ArmSums(units, values.sum(axis=0), units, (values * values).sum(axis=0), units, values.sum(axis=0))


def test_e_bh_controls_the_false_discovery_rate_of_dependent_tests() -> None:
    """2,000 experiments, one control and three treatments (400 units each), nine metrics correlated 0.5 within a
    unit: treatment 1 truly better by 0.35 sd on metrics 0-2, everything else null. FDR <= 5 % for e-BH, with the
    true effects found in most experiments."""
    rng = np.random.default_rng(7)
    experiments, units, metrics, alpha = 2000, 400, 9, 0.05
    effect = np.zeros((3, metrics))
    effect[0, :3] = 0.35

    def arm(shift: np.ndarray) -> ArmSums:
        shared = rng.standard_normal((units, experiments, 1))
        own = rng.standard_normal((units, experiments, metrics))
        return _sums(math.sqrt(0.5) * shared + math.sqrt(0.5) * own + shift)

    control = arm(np.zeros(metrics))
    log_e = np.stack([compare(control, arm(effect[t]), sequential_n=2 * units).log_e_value for t in range(3)],
                     axis=1)  # (experiments, treatments, metrics)
    null = (effect == 0.0).ravel()
    false, found, unadjusted_false = [], [], []
    for e in log_e.reshape(experiments, -1):
        rejected = e_bh(e, alpha)
        false.append(np.count_nonzero(rejected & null) / max(np.count_nonzero(rejected), 1))
        found.append(np.count_nonzero(rejected & ~null) / np.count_nonzero(~null))
        unadjusted_false.append(np.any((e >= math.log(1 / alpha)) & null))
    fdr = float(np.mean(false))
    assert fdr <= alpha, fdr
    assert np.mean(found) > 0.5  # not by rejecting nothing
    # the family needed it: without control, some null of the 24 is called in many experiments
    assert np.mean(unadjusted_false) > fdr


@pytest.mark.slow
def test_decisions_in_the_report_are_taken_after_e_bh(tmp_path: Path) -> None:
    arms = (("a-control", 0.4), ("b-better", 0.9), ("c-same", 0.4))
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(simulate_lines(SimulationConfig(requests=8000, seed=11, arms=arms,
                                                                label_rate=0.3))))
    plain = replay([str(path)], Config())
    goal = Config(experiments=(("exp1", ExperimentSettings(primary=("nDCG@10",))),))
    narrow = replay([str(path)], goal)
    for engine in (plain, narrow):
        rows = engine.ab()
        # decided rows are a subset of those whose always-valid sequence excludes 0 (the unadjusted decision)
        for row in rows:
            if row["decision"] != "inconclusive":
                assert row["cs_lower"] > 0 or row["cs_upper"] < 0
    # p-values stay unadjusted: the same whatever the family
    assert [r["p_value"] for r in plain.ab()] == [r["p_value"] for r in narrow.ab()]
    decided = {(r["treatment"], r["metric"]): r["decision"] for r in narrow.ab()}
    assert decided["b-better", "nDCG@10"] == "better" and decided["c-same", "nDCG@10"] == "inconclusive"
    # no guardrails: a goal metric better is enough to ship
    assert {(r["treatment"], r["recommendation"]) for r in narrow.experiments()} == {
        ("b-better", "ship"), ("c-same", "keep running")}
