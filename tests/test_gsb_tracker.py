"""GSB from per-query metrics (engine/gsb.py) against a plain reference: sums per (bucket, experiment, query,
arm) added request by request, a verdict per bucket, query and treatment served with the control (A/B/n: e1 has
two treatments)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import AbstractTimeConfig as Config

from stream_eval.config import Arms
from stream_eval.engine.gsb import GsbTracker
from stream_eval.metrics.gsb import metric_verdict

ARMS = {"e1": Arms("c", ("t", "x")), "e2": Arms("t", ("c",))}  # e3 has no arms: no verdict


def arms_of(experiment: str) -> Arms | None:
    return ARMS.get(experiment)


Request = tuple[str, str, str, float, float]  # experiment, arm, query, serve time, metric


def reference(requests: list[Request], window: float, epsilon: float) -> dict[tuple[str, str], list[int]]:
    sums: dict[tuple[int, str, str], dict[str, list[float]]] = {}
    for experiment, arm, query, ts, value in requests:
        per_arm = sums.setdefault((int(ts // window), experiment, query), {})
        total = per_arm.setdefault(arm, [0.0, 0.0])
        total[0] += value
        total[1] += 1.0
    out: dict[tuple[str, str], list[int]] = {}
    for (_, experiment, _), per_arm in sums.items():
        arms = arms_of(experiment)
        for treatment in arms.treatments if arms is not None else ():
            if arms is None or arms.control not in per_arm or treatment not in per_arm:
                continue
            t, c = per_arm[treatment], per_arm[arms.control]
            verdict = metric_verdict(t[0] / t[1], c[0] / c[1], epsilon)
            out.setdefault((experiment, treatment), [0, 0, 0])[("good", "same", "bad").index(verdict)] += 1
    return out


REQUEST = st.tuples(st.sampled_from(["e1", "e2", "e3"]), st.sampled_from(["c", "t", "x"]),
                    st.sampled_from(["q1", "q2", "q3"]), st.floats(0, 50),
                    st.sampled_from([0.0, 0.1, 0.2, 0.3, 1 / 3, 1.0]))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(REQUEST, max_size=12), max_size=8), st.sampled_from([5.0, 7.5, 100.0]),
       st.sampled_from([0.0, 0.05]), st.lists(st.floats(0, 80), max_size=4))
def test_query_gsb_equals_request_by_request_sums(batches: list[list[Request]],
                                                  window: float, epsilon: float, closes: list[float]) -> None:
    """In batches, with closes in between (each closing only buckets no later request falls in), the verdicts
    are those of the reference over all requests."""
    tracker = GsbTracker(Config(gsb_window=window, gsb_epsilon=epsilon), horizon=0.0)
    served: list[Request] = []
    closed_before = -1.0
    for k, batch in enumerate(batches):
        batch = [r for r in batch if int(r[3] // window) > closed_before]  # a closed bucket gets no more requests
        tracker.query_metrics([(e, a) for e, a, _, _, _ in batch], [q for _, _, q, _, _ in batch],
                              [ts for *_, ts, _ in batch], [v for *_, v in batch])
        served += batch
        if k < len(closes):
            tracker.close(closes[k], arms_of)
            closed_before = max(closed_before, closes[k] // window - 1)
    tracker.close(1e9, arms_of)
    got = {(experiment, treatment): [c.good, c.same, c.bad]
           for (experiment, treatment, source), c in tracker.counts.items() if source == "metric"}
    assert got == reference(served, window, epsilon)


def test_interleaving_verdicts_are_only_of_the_arms_a_request_interleaved() -> None:
    """A/B/n: requests interleave c with t only; x took part in none of them, so it gets no verdict and no row (it
    got "bad" for every request where c was credited). A team credited with nothing is still one that took part."""
    tracker = GsbTracker(Config(), horizon=0.0)
    tracker.interleaved("e1", ["c", "t", "c", "t"], [1, 3])  # c credited twice, t took part: bad for t
    tracker.interleaved("e1", ["t", "c"], [1])  # good for t
    totals = tracker.totals(arms_of)
    assert (totals["e1", "t", "interleaving"].good, totals["e1", "t", "interleaving"].bad) == (1, 1)
    assert ("e1", "x", "interleaving") not in totals  # no row: it was never interleaved


def test_interleaving_credits_written_before_every_team_was_listed_are_read_with_the_experiment_s_teams() -> None:
    from stream_eval.engine.snapshot import tallies_from_json, tallies_to_json

    old = {"interleaving": {"e1": [[[["c", 2]], 5], [[["c", 1], ["t", 1]], 2]]}, "teams": {"e1": ["c", "t"]}}
    tallies = tallies_from_json(old)
    assert tallies == {"e1": {(("c", 2), ("t", 0)): 5, (("c", 1), ("t", 1)): 2}}
    assert tallies_from_json({"interleaving_credits": tallies_to_json(tallies)}) == tallies
