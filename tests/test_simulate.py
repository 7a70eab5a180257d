"""Tests of the synthetic traffic generator (stream_eval.simulate)."""

from __future__ import annotations

import collections
import dataclasses
import gzip
import hashlib
import itertools
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_eval.config import load_config
from stream_eval.simulate import (
    ATTRIBUTION_WINDOW,
    INTERLEAVED_ARM,
    SimulationConfig,
    simulate,
    simulate_lines,
    true_effects,
    true_grades,
    write_jsonl,
)

RANKING_FIELDS = {"type", "request_id", "ts", "items", "scores", "query_id", "session_id", "experiment", "arm"}
CLICK_FIELDS = {"type", "request_id", "item", "kind", "ts"}
LABEL_FIELDS = CLICK_FIELDS | {"grade"}
JUDGMENT_FIELDS = {"type", "experiment", "query_id", "verdict", "ts"}


def _events(**kwargs: Any) -> list[dict[str, Any]]:
    return list(simulate(SimulationConfig(**kwargs)))


def _by_type(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for event in events:
        grouped[event["type"]].append(event)
    return grouped


def _ndcg10(items: list[str], grades: dict[str, int]) -> float:
    def dcg(values: list[int]) -> float:
        return float(sum((2**g - 1) / math.log2(i + 2) for i, g in enumerate(values[:10])))

    ideal = dcg(sorted(grades.values(), reverse=True))
    return dcg([grades[item] for item in items]) / ideal if ideal > 0 else 0.0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# --- determinism -------------------------------------------------------------------------------------------


def test_same_seed_same_events() -> None:
    config = SimulationConfig(requests=3000, judgments=True, interleaving=True, late_fraction=0.05, seed=7)
    assert list(simulate_lines(config)) == list(simulate_lines(config))
    assert list(simulate(config)) == list(simulate(config))


def test_different_seed_different_events() -> None:
    a = list(simulate_lines(SimulationConfig(requests=200, seed=1)))
    b = list(simulate_lines(SimulationConfig(requests=200, seed=2)))
    assert a != b


def test_true_grades_depend_only_on_the_world() -> None:
    base = SimulationConfig(queries=30, catalogue=12, seed=3)
    grades = true_grades(base)
    assert grades == true_grades(SimulationConfig(queries=30, catalogue=12, seed=3, requests=5, rate=9.0))
    assert grades != true_grades(SimulationConfig(queries=30, catalogue=12, seed=4))
    assert sorted(grades) == sorted(f"q{q}" for q in range(30))
    for query, pool in grades.items():
        assert sorted(pool) == sorted(f"{query}-d{j}" for j in range(12))
        assert all(isinstance(g, int) and 0 <= g <= base.max_grade for g in pool.values())


def test_grades_skewed_toward_zero() -> None:
    counts = collections.Counter(g for pool in true_grades(SimulationConfig()).values() for g in pool.values())
    assert counts[0] > counts[1] > counts[2] > counts[3] > counts[4] > 0


# --- schema --------------------------------------------------------------------------------------------------


def test_events_have_spec_fields_and_types() -> None:
    config = SimulationConfig(requests=2000, judgments=True)
    grades = true_grades(config)
    events = list(simulate(config))
    grouped = _by_type(events)
    assert set(grouped) == {"ranking", "feedback", "judgment"}
    for event in grouped["ranking"]:
        assert set(event) == RANKING_FIELDS
        assert isinstance(event["request_id"], str) and event["request_id"]
        assert isinstance(event["ts"], float)
        assert isinstance(event["items"], list) and all(isinstance(x, str) for x in event["items"])
        assert isinstance(event["scores"], list) and all(isinstance(x, float) for x in event["scores"])
        for field in ("query_id", "session_id", "experiment", "arm"):
            assert isinstance(event[field], str)
        assert event["experiment"] == "exp1"
        assert event["arm"] in ("control", "treatment")
        assert all(item in grades[event["query_id"]] for item in event["items"])
    for event in grouped["feedback"]:
        assert isinstance(event["request_id"], str)
        assert isinstance(event["item"], str)
        assert isinstance(event["ts"], float)
        if event["kind"] == "click":
            assert set(event) == CLICK_FIELDS
        else:
            assert event["kind"] == "label"
            assert set(event) == LABEL_FIELDS
            assert isinstance(event["grade"], int) and 0 <= event["grade"] <= config.max_grade
    for event in grouped["judgment"]:
        assert set(event) == JUDGMENT_FIELDS
        assert event["verdict"] in ("good", "same", "bad")
        assert event["experiment"] == "exp1"
        assert event["query_id"] in grades
        assert isinstance(event["ts"], float)


def test_ts_rounded_to_milliseconds() -> None:
    events = _events(requests=500)
    assert len(events) > 500
    for event in events:
        assert round(event["ts"], 3) == event["ts"]


def test_rankings_unique_items_and_descending_scores() -> None:
    config = SimulationConfig(requests=3000)
    rankings = [e for e in simulate(config) if e["type"] == "ranking"]
    assert len(rankings) == 3000
    assert len({e["request_id"] for e in rankings}) == 3000
    lengths = []
    for event in rankings:
        items, scores = event["items"], event["scores"]
        assert len(items) == len(set(items)) >= 1
        assert len(scores) == len(items)
        assert all(a >= b for a, b in itertools.pairwise(scores))
        lengths.append(len(items))
    assert min(lengths) >= 15 and max(lengths) <= 25  # 20 ± 25 %
    assert 19 <= sum(lengths) / len(lengths) <= 21
    assert len(set(lengths)) > 5
    ties = sum(a == b for e in rankings for a, b in itertools.pairwise(e["scores"]))
    assert ties < 0.01 * sum(lengths)  # ties allowed, but rare


def test_short_lists_and_small_catalogue() -> None:
    events = _events(requests=300, items_per_request=1, catalogue=3)
    for event in events:
        if event["type"] == "ranking":
            assert len(event["items"]) == 1
    events = _events(requests=300, items_per_request=40, catalogue=10, label_rate=1.0)
    rankings = {e["request_id"]: e for e in events if e["type"] == "ranking"}
    assert all(len(e["items"]) == 10 for e in rankings.values())


def test_request_ids_and_query_ids() -> None:
    rankings = [e for e in _events(requests=2000, queries=50) if e["type"] == "ranking"]
    assert [e["request_id"] for e in rankings] == [f"r{n}" for n in range(2000)]
    per_query = collections.Counter(e["query_id"] for e in rankings)
    assert len(per_query) > 40
    assert per_query.most_common(1)[0][1] >= 5  # queries are asked many times


# --- ordering --------------------------------------------------------------------------------------------------


def test_ordered_by_event_time_without_shuffle() -> None:
    events = _events(requests=25_000, judgments=True, orphan_fraction=0.05, duplicate_fraction=0.05)
    stamps = [e["ts"] for e in events]
    assert all(a <= b for a, b in itertools.pairwise(stamps))
    assert stamps[0] == SimulationConfig().start_ts


def test_late_feedback_still_ordered() -> None:
    events = _events(requests=25_000, late_fraction=0.1)
    assert all(a["ts"] <= b["ts"] for a, b in itertools.pairwise(events))


def test_feedback_after_its_ranking_and_within_max_delay() -> None:
    config = SimulationConfig(requests=3000)
    serve: dict[str, float] = {}
    checked = 0
    for event in simulate(config):
        if event["type"] == "ranking":
            serve[event["request_id"]] = event["ts"]
        elif event["type"] == "feedback":
            assert event["request_id"] in serve  # ranking came first
            assert 0 <= event["ts"] - serve[event["request_id"]] <= config.max_delay + 1e-6
            checked += 1
    assert len(serve) == 3000 and checked > 1000


@pytest.mark.slow
def test_shuffle_window_bounds_the_disorder() -> None:
    window = 30.0
    events = _events(requests=20_000, shuffle_window=window)
    stamps = [e["ts"] for e in events]
    inversions = sum(a > b for a, b in itertools.pairwise(stamps))
    assert inversions > 0.05 * len(stamps)
    running_max = -math.inf
    for ts in stamps:
        assert running_max - ts <= window + 1e-6
        running_max = max(running_max, ts)
    plain = _events(requests=20_000)
    assert sorted(map(orjson.dumps, events)) == sorted(map(orjson.dumps, plain))  # same events, other order


def test_rate_sets_event_time_span() -> None:
    rankings = [e for e in _events(requests=5000, rate=100.0) if e["type"] == "ranking"]
    span = rankings[-1]["ts"] - rankings[0]["ts"]
    assert 45.0 < span < 55.0


# --- the click model and ground truth ---------------------------------------------------------------------------


@pytest.mark.parametrize("click_model", ["cascade", "pbm"])
def test_better_arm_has_higher_true_ndcg(click_model: str) -> None:
    config = SimulationConfig(requests=2000, click_model=click_model)
    grades = true_grades(config)
    per_arm: dict[str, list[float]] = collections.defaultdict(list)
    for event in simulate(config):
        if event["type"] == "ranking":
            per_arm[event["arm"]].append(_ndcg10(event["items"], grades[event["query_id"]]))
    means = {arm: sum(v) / len(v) for arm, v in per_arm.items()}
    assert set(means) == {"control", "treatment"}
    assert min(len(v) for v in per_arm.values()) > 600
    assert means["treatment"] > means["control"] + 0.03


def test_quality_extremes() -> None:
    config = SimulationConfig(requests=600, arms=(("random", 0.0), ("oracle", 1.0)))
    grades = true_grades(config)
    per_arm: dict[str, list[float]] = collections.defaultdict(list)
    for event in simulate(config):
        if event["type"] == "ranking":
            per_arm[event["arm"]].append(_ndcg10(event["items"], grades[event["query_id"]]))
            if event["arm"] == "oracle":
                shown = [grades[event["query_id"]][item] for item in event["items"]]
                assert shown == sorted(shown, reverse=True)
    assert min(per_arm["oracle"]) == pytest.approx(1.0)
    assert sum(per_arm["random"]) / len(per_arm["random"]) < 0.6


def test_feedback_per_request_with_defaults() -> None:
    config = SimulationConfig(requests=5000)
    counts = collections.Counter(e["type"] for e in simulate(config))
    per_request = counts["feedback"] / counts["ranking"]
    assert 3.0 <= per_request <= 5.0
    assert counts["judgment"] == 0


def test_clicks_follow_relevance_and_position() -> None:
    config = SimulationConfig(requests=5000)
    grades = true_grades(config)
    rankings: dict[str, dict[str, Any]] = {}
    clicked_grades: list[int] = []
    position_clicks: collections.Counter[int] = collections.Counter()
    multi: collections.Counter[str] = collections.Counter()
    for event in simulate(config):
        if event["type"] == "ranking":
            rankings[event["request_id"]] = event
        elif event["kind"] == "click":
            ranking = rankings[event["request_id"]]
            assert event["item"] in ranking["items"]  # clicks only on shown items
            clicked_grades.append(grades[ranking["query_id"]][event["item"]])
            position_clicks[ranking["items"].index(event["item"])] += 1
            multi[event["request_id"]] += 1
    all_grades = [g for pool in grades.values() for g in pool.values()]
    assert sum(clicked_grades) / len(clicked_grades) > 1.5 * sum(all_grades) / len(all_grades)
    assert position_clicks[0] > position_clicks[9] > position_clicks[18]
    assert sum(n > 1 for n in multi.values()) > 0.3 * len(rankings)  # several clicks per request happen


def test_pbm_clicks_decay_with_position() -> None:
    config = SimulationConfig(requests=4000, click_model="pbm", arms=(("random", 0.0),))
    rankings: dict[str, list[str]] = {}
    by_position: collections.Counter[int] = collections.Counter()
    for event in simulate(config):
        if event["type"] == "ranking":
            rankings[event["request_id"]] = event["items"]
        elif event["kind"] == "click":
            by_position[rankings[event["request_id"]].index(event["item"])] += 1
    # A random ranker: clicks fall off like 1/i (position 1 vs 4: about 4x).
    assert 2.5 < by_position[0] / by_position[3] < 6.0


def test_labels_carry_true_grades_for_shown_and_unshown_items() -> None:
    config = SimulationConfig(requests=4000)
    grades = true_grades(config)
    rankings: dict[str, dict[str, Any]] = {}
    shown_labels: collections.Counter[str] = collections.Counter()
    unshown_labels: collections.Counter[str] = collections.Counter()
    for event in simulate(config):
        if event["type"] == "ranking":
            rankings[event["request_id"]] = event
        elif event["kind"] == "label":
            ranking = rankings[event["request_id"]]
            assert event["item"] in grades[ranking["query_id"]]
            assert event["grade"] == grades[ranking["query_id"]][event["item"]]
            if event["item"] in ranking["items"]:
                shown_labels[event["request_id"]] += 1
            else:
                unshown_labels[event["request_id"]] += 1
    labelled = set(shown_labels) | set(unshown_labels)
    assert 0.08 * 4000 < len(labelled) < 0.12 * 4000
    assert 2.5 < sum(shown_labels.values()) / len(labelled) < 3.5
    assert 1.0 <= sum(unshown_labels.values()) / len(labelled) <= 2.0
    assert set(unshown_labels) == labelled


def test_sessions_group_consecutive_requests_with_one_arm() -> None:
    rankings = [e for e in _events(requests=6000) if e["type"] == "ranking"]
    sessions: dict[str, list[int]] = collections.defaultdict(list)
    arms: dict[str, set[str]] = collections.defaultdict(set)
    for n, event in enumerate(rankings):
        sessions[event["session_id"]].append(n)
        arms[event["session_id"]].add(event["arm"])
    for positions in sessions.values():
        assert positions == list(range(positions[0], positions[0] + len(positions)))
    assert all(len(a) == 1 for a in arms.values())
    assert 2.5 < len(rankings) / len(sessions) < 3.5
    per_arm = collections.Counter(e["arm"] for e in rankings)
    assert abs(per_arm["control"] - per_arm["treatment"]) < 0.15 * len(rankings)


# --- optional parts ---------------------------------------------------------------------------------------------


def test_interleaving_teams() -> None:
    config = SimulationConfig(requests=4000, interleaving=True)
    rankings = [e for e in simulate(config) if e["type"] == "ranking"]
    interleaved = [e for e in rankings if e["arm"] == INTERLEAVED_ARM]
    assert 0.1 * len(rankings) < len(interleaved) < 0.4 * len(rankings)
    both_teams = 0
    for event in interleaved:
        assert len(event["teams"]) == len(event["items"]) == len(event["scores"])
        assert set(event["teams"]) <= {"control", "treatment"}
        assert len(set(event["items"])) == len(event["items"])
        assert all(a > b for a, b in itertools.pairwise(event["scores"]))
        counts = collections.Counter(event["teams"])
        assert abs(counts["control"] - counts["treatment"]) <= 1  # team draft keeps the teams balanced
        both_teams += len(counts) == 2
    assert both_teams > 0.9 * len(interleaved)
    assert all("teams" not in e for e in rankings if e["arm"] != INTERLEAVED_ARM)


def test_interleaving_needs_two_arms() -> None:
    with pytest.raises(ValueError):
        SimulationConfig(interleaving=True, arms=(("only", 0.5),))


def test_judgments_favour_the_better_arm() -> None:
    config = SimulationConfig(requests=20_000, judgments=True, arms=(("control", 0.3), ("treatment", 0.8)))
    verdicts = collections.Counter(e["verdict"] for e in simulate(config) if e["type"] == "judgment")
    total = sum(verdicts.values())
    assert 0.03 * 20_000 < total < 0.07 * 20_000
    assert verdicts["good"] > 2 * verdicts["bad"]
    assert verdicts["same"] > 0


def test_subtopics() -> None:
    config = SimulationConfig(requests=500, subtopics=True)
    rankings = [e for e in simulate(config) if e["type"] == "ranking"]
    labels: set[str] = set()
    per_item: dict[tuple[str, str], list[str]] = {}
    for event in rankings:
        assert len(event["subtopics"]) == len(event["items"])
        for item, topics in zip(event["items"], event["subtopics"], strict=True):
            assert 1 <= len(topics) <= 3 and len(set(topics)) == len(topics)
            assert per_item.setdefault((event["query_id"], item), topics) == topics  # fixed per item
            labels.update(topics)
    assert len(labels) == 6
    assert all("subtopics" not in e for e in _events(requests=50) if e["type"] == "ranking")


# --- faults -------------------------------------------------------------------------------------------------------


def test_fault_fractions_are_honoured() -> None:
    base = SimulationConfig(requests=10_000)
    clean_feedback = sum(e["type"] == "feedback" for e in simulate(base))
    config = SimulationConfig(requests=10_000, late_fraction=0.05, duplicate_fraction=0.04, orphan_fraction=0.03)
    serve: dict[str, float] = {}
    feedback: list[dict[str, Any]] = []
    for event in simulate(config):
        if event["type"] == "ranking":
            serve[event["request_id"]] = event["ts"]
        else:
            feedback.append(event)
    orphans = [e for e in feedback if e["request_id"] not in serve]
    attached = [e for e in feedback if e["request_id"] in serve]
    late = [e for e in attached if e["ts"] - serve[e["request_id"]] > ATTRIBUTION_WINDOW]
    seen: set[tuple[Any, ...]] = set()
    duplicates = 0
    for event in attached:
        key = (event["request_id"], event["item"], event["kind"], event.get("grade"))
        duplicates += key in seen
        seen.add(key)
    assert len(orphans) == pytest.approx(0.03 * clean_feedback, rel=0.2)
    assert duplicates == pytest.approx(0.04 * clean_feedback, rel=0.2)
    assert len(late) == pytest.approx(0.05 * (clean_feedback + duplicates), rel=0.2)
    assert all(e["ts"] - serve[e["request_id"]] < ATTRIBUTION_WINDOW + 601 for e in late)
    # Orphan request ids look like real ones but are never served.
    assert all(e["request_id"].startswith("r") and int(e["request_id"][1:]) >= 10_000 for e in orphans)
    assert len(attached) - duplicates == clean_feedback  # the faults are extra: the clean feedback is all there


def test_no_faults_by_default() -> None:
    config = SimulationConfig(requests=3000)
    serve: dict[str, float] = {}
    seen: set[tuple[Any, ...]] = set()
    for event in simulate(config):
        if event["type"] == "ranking":
            serve[event["request_id"]] = event["ts"]
            continue
        assert event["request_id"] in serve
        assert event["ts"] - serve[event["request_id"]] <= ATTRIBUTION_WINDOW
        key = (event["request_id"], event["item"], event["kind"], event.get("grade"))
        assert key not in seen
        seen.add(key)
    assert len(serve) == 3000 and len(seen) > 1000


def _invalid_reason(line: bytes) -> str | None:
    """Why a line is malformed under docs/contract.md §1, or None if it is a valid event."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return "broken_json"
    kind = event.get("type")
    if kind not in ("ranking", "feedback", "judgment"):
        return "unknown_type"
    if kind in ("ranking", "feedback") and not isinstance(event.get("request_id"), str):
        return "missing_request_id"
    if kind == "ranking":
        if not isinstance(event["items"], list):
            return "items_not_list"
        if len(set(event["items"])) != len(event["items"]):
            return "duplicate_items"
    if kind == "feedback" and "grade" in event and event["grade"] < 0:
        return "negative_grade"
    return None


def test_invalid_lines() -> None:
    config = SimulationConfig(requests=5000, invalid_fraction=0.05)
    lines = list(simulate_lines(config))
    valid = list(simulate_lines(SimulationConfig(requests=5000)))
    reasons = collections.Counter(_invalid_reason(line) for line in lines)
    invalid = len(lines) - reasons[None]
    assert reasons[None] == len(valid)
    assert [line for line in lines if _invalid_reason(line) is None] == valid
    assert invalid == pytest.approx(0.05 * len(valid), rel=0.15)
    assert set(reasons) - {None} == {
        "broken_json",
        "unknown_type",
        "missing_request_id",
        "items_not_list",
        "duplicate_items",
        "negative_grade",
    }
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines)


# --- encoding and files -------------------------------------------------------------------------------------------


def test_lines_are_the_events_as_compact_json() -> None:
    config = SimulationConfig(requests=1500, judgments=True, interleaving=True, subtopics=True)
    lines = list(simulate_lines(config))
    events = list(simulate(config))
    assert len(lines) == len(events)
    for line, event in zip(lines, events, strict=True):
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert b", " not in line and b": " not in line
        assert orjson.loads(line) == event


@pytest.mark.parametrize("name", ["events.jsonl", "events.jsonl.gz"])
def test_write_jsonl(tmp_path: Path, name: str) -> None:
    config = SimulationConfig(requests=2000, invalid_fraction=0.02)
    path = tmp_path / name
    count = write_jsonl(config, str(path))
    data = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
    lines = list(simulate_lines(config))
    assert count == len(lines) == data.count(b"\n")
    assert data == b"".join(lines)


def test_zero_requests() -> None:
    assert list(simulate(SimulationConfig(requests=0))) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"requests": -1},
        {"catalogue": 0},
        {"arms": ()},
        {"arms": (("a", 1.5),)},
        {"arms": (("a", 0.5), ("a", 0.6))},
        {"click_model": "dbn"},
        {"label_rate": 1.5},
        {"rate": 0.0},
        {"seed": -1},
        {"judgments": True, "arms": (("a", 0.5),)},
        {"interleaving": True, "arms": (("interleaved", 0.5), ("b", 0.6))},
        {"dwell_scale": (("treatment", 0.5),)},  # without behaviour: no dwell to scale
        {"behaviour": True, "dwell_scale": (("nope", 0.5),)},
        {"behaviour": True, "dwell_scale": (("treatment", 0.0),)},
        {"behaviour": True, "dwell_scale": (("treatment", math.inf),)},
        {"segments": (("platform", ()),)},
        {"segments": (("platform", ("ios", "ios")),)},
        {"segments": (("", ("ios",)),)},
        {"segments": (("platform", ("ios",)), ("platform", ("web",)))},
    ],
)
def test_config_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SimulationConfig(**kwargs)


# --- scale ---------------------------------------------------------------------------------------------------------


def test_is_lazy() -> None:
    huge = SimulationConfig(requests=10**9)
    first = list(itertools.islice(simulate_lines(huge), 1000))
    assert len(first) == 1000


@pytest.mark.slow
def test_hundred_thousand_requests() -> None:
    config = SimulationConfig(requests=100_000)
    counts: collections.Counter[str] = collections.Counter()
    lines = 0
    previous = -math.inf
    for line in simulate_lines(config):
        event = orjson.loads(line)
        counts[event["type"]] += 1
        assert event["ts"] >= previous
        previous = event["ts"]
        lines += 1
    assert counts["ranking"] == 100_000
    assert 300_000 <= counts["feedback"] <= 500_000


# --- randomisation per user (unit_id) ----------------------------------------------------------------------------

# sha256 of the JSON lines of these configs, recorded with the simulator as it was before `unit` existed: the
# default (unit="session") must keep every existing output byte for byte (benchmarks, examples, tests rely on it).
UNCHANGED_OUTPUTS = [
    ({}, 4973, "b1772dcae297bb8496bd42d3d7e8e87c32398fe765de8344273d04c7f063c3fc"),
    (
        {
            "requests": 3000, "seed": 7, "interleaving": True, "judgments": True, "label_rate": 0.1,
            "duplicate_fraction": 0.02, "late_fraction": 0.01, "invalid_fraction": 0.002, "orphan_fraction": 0.01,
            "shuffle_window": 5.0, "subtopics": True,
        },
        15425,
        "0d094f52c3b371052e57ce62f3e5f6c727015804a2830cc85e9e50fdd3eb22bb",
    ),
    (
        {
            "requests": 12000, "seed": 5, "click_model": "pbm", "arms": (("a", 0.3), ("b", 0.6), ("c", 0.9)),
            "sessions_per_user_requests": 4, "judgments": True,
        },
        38807,
        "d94f175d0046762d2813713713a7f8aae8efdbb30d25d5a249dc0565406f2a43",
    ),
]


@pytest.mark.parametrize(("kwargs", "lines", "digest"), UNCHANGED_OUTPUTS)
def test_default_output_is_unchanged(kwargs: dict[str, Any], lines: int, digest: str) -> None:
    for config in (SimulationConfig(**kwargs), SimulationConfig(**kwargs, unit="session", sessions_per_user=2.0)):
        output = list(simulate_lines(config))
        assert len(output) == lines
        assert hashlib.sha256(b"".join(output)).hexdigest() == digest


def test_default_endless_output_is_unchanged() -> None:
    """The demo's kind of traffic (endless, several chunks), as it was before `unit` existed."""
    config = SimulationConfig(
        endless=True, start_ts=1767225600.0, rate=200, max_delay=15.0, seed=3, interleaving=True, judgments=True,
        label_rate=0.1, duplicate_fraction=0.02, late_fraction=0.01, invalid_fraction=0.002,
    )
    output = b"".join(itertools.islice(simulate_lines(config), 50_000))
    assert hashlib.sha256(output).hexdigest() == "69921e3eb9a8b794677aebd9574f38235a1ad21b7fd198c3eeeecbfa65e121f6"


def test_rankings_have_no_unit_id_by_default() -> None:
    assert all("unit_id" not in e for e in _events(requests=500, interleaving=True))


def test_users_keep_their_arm_across_sessions_and_chunks() -> None:
    config = SimulationConfig(
        requests=25_000, items_per_request=4, catalogue=8, queries=50, label_rate=0.0, interleaving=True,
        unit="user", sessions_per_user=4.0, seed=11,
    )
    rankings = [e for e in simulate(config) if e["type"] == "ranking"]
    assert len(rankings) == 25_000  # more than two chunks: users come back across chunk boundaries
    arms: dict[str, set[str]] = collections.defaultdict(set)
    sessions: dict[str, set[str]] = collections.defaultdict(set)
    session_units: dict[str, set[str]] = collections.defaultdict(set)
    chunks: dict[str, set[int]] = collections.defaultdict(set)
    for n, event in enumerate(rankings):
        unit = event["unit_id"]
        assert isinstance(unit, str) and unit.startswith("u")
        arms[unit].add(event["arm"])
        sessions[unit].add(event["session_id"])
        session_units[event["session_id"]].add(unit)
        chunks[unit].add(n // 10_000)
    assert all(len(a) == 1 for a in arms.values())  # every unit's requests are in one arm
    assert all(len(u) == 1 for u in session_units.values())  # a session is one user's
    assert sum(len(s) for s in sessions.values()) / len(sessions) == pytest.approx(4.0, rel=0.15)
    assert sum(len(c) > 1 for c in chunks.values()) > 100
    per_arm = collections.Counter(next(iter(a)) for a in arms.values())
    assert set(per_arm) == {"control", "treatment", INTERLEAVED_ARM}
    assert abs(per_arm["control"] - per_arm["treatment"]) < 0.15 * len(arms)
    assert 0.18 < per_arm[INTERLEAVED_ARM] / len(arms) < 0.32


def test_users_are_deterministic_and_leave_the_rest_of_the_event() -> None:
    config = SimulationConfig(requests=3000, unit="user", seed=4)
    first = list(simulate(config))
    assert first == list(simulate(config))
    plain = list(simulate(SimulationConfig(requests=3000, seed=4)))
    rankings = [e for e in first if e["type"] == "ranking"]
    assert [e["request_id"] for e in rankings] == [e["request_id"] for e in plain if e["type"] == "ranking"]
    assert {k for e in rankings for k in e} == RANKING_FIELDS | {"unit_id"}


@pytest.mark.parametrize("kwargs", [{"unit": "device"}, {"unit": "user", "sessions_per_user": 0.5}])
def test_unit_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SimulationConfig(**kwargs)


# --- the true effect of the arms ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_true_effects_follow_the_arms_quality() -> None:
    config = SimulationConfig(arms=(("a", 0.2), ("b", 0.55), ("c", 0.9)), seed=2)
    truth = true_effects(config, requests=5000)
    assert set(truth) == {"a", "b", "c"}
    for metric in ("MRR", "nDCG@10", "ERR@10", "GAUC"):
        assert truth["a"][metric] < truth["b"][metric] < truth["c"][metric], metric
    assert truth == true_effects(config, requests=5000)  # seeded


def test_true_delta_of_the_default_arms() -> None:
    """Qualities 0.55 and 0.7: a few hundredths of nDCG@10 and MRR, a smaller ERR@10 gain (clicks cap it)."""
    truth = true_effects(SimulationConfig(), requests=10_000)
    delta = {m: truth["treatment"][m] - truth["control"][m] for m in truth["control"]}
    assert 0.02 < delta["nDCG@10"] < 0.07
    assert 0.02 < delta["MRR"] < 0.07
    assert 0.002 < delta["ERR@10"] < 0.02
    assert 0.005 < delta["GAUC"] < 0.04
    assert 0.6 < truth["control"]["nDCG@10"] < 0.8


@pytest.mark.slow
def test_estimates_converge_to_the_true_effects(tmp_path: Path) -> None:
    """A two-arm run replayed by `stream-eval replay`'s engine lands near the truth (other draws, same world)."""
    from stream_eval.config import Config
    from stream_eval.engine.replay import replay

    config = SimulationConfig(requests=40_000, seed=5, unit="user")
    truth = true_effects(config, requests=20_000)
    path = str(tmp_path / "events.jsonl")
    write_jsonl(config, path)
    groups = {g["arm"]: g["metrics"] for g in replay([path], Config()).report()["groups"]}
    for arm in ("control", "treatment"):
        for metric in ("MRR", "nDCG@10", "ERR@10"):
            assert groups[arm][metric] == pytest.approx(truth[arm][metric], abs=0.01), (arm, metric)
    estimate = groups["treatment"]["nDCG@10"] - groups["control"]["nDCG@10"]
    true = truth["treatment"]["nDCG@10"] - truth["control"]["nDCG@10"]
    assert estimate == pytest.approx(true, abs=0.012)


# --- per-arm dwell (the demo's clickbait arm) --------------------------------------------------------------------


def test_dwell_scale_cuts_one_arms_dwell_and_leaves_everything_else() -> None:
    """Three arms, one with its dwell halved: the same events as without the option, but that arm's clicks carry
    half the dwell (rounded to 0.1 s), on its own lists and on its team's items of interleaved lists (of a and b)."""
    arms = (("a", 0.55), ("b", 0.7), ("c", 0.75))
    base = SimulationConfig(requests=3000, seed=4, arms=arms, behaviour=True, unit="user", interleaving=True)
    plain = list(simulate(base))
    scaled = list(simulate(dataclasses.replace(base, dwell_scale=(("b", 0.5), ("a", 1.0)))))
    assert len(plain) == len(scaled)
    arm_of = {e["request_id"]: e["arm"] for e in plain if e["type"] == "ranking"}
    teams = {e["request_id"]: dict(zip(e["items"], e["teams"], strict=True)) for e in plain if e.get("teams")}
    halved = 0
    for before, after in zip(plain, scaled, strict=True):
        assert {k: v for k, v in before.items() if k != "dwell"} == {k: v for k, v in after.items() if k != "dwell"}
        if "dwell" in before:
            arm = arm_of[before["request_id"]]
            arm = teams[before["request_id"]][before["item"]] if arm == "interleaved" else arm
            if arm == "b":
                assert after["dwell"] == pytest.approx(before["dwell"] * 0.5, abs=0.1)
                halved += 1
            else:
                assert after["dwell"] == before["dwell"]
    assert halved > 500
    assert teams and {t for row in teams.values() for t in row.values()} == {"a", "b"}


def test_dwell_scale_moves_satisfied_clicks_not_relevance() -> None:
    arms = (("control", 0.55), ("clickbait", 0.55))
    truth = true_effects(SimulationConfig(arms=arms, behaviour=True, dwell_scale=(("clickbait", 0.5),)),
                         requests=3000, evaluation=load_config(overrides={"metrics": "default,behaviour"}, environ={}))
    control, clickbait = truth["control"], truth["clickbait"]
    assert clickbait["nDCG@10"] == control["nDCG@10"] and clickbait["MRR"] == control["MRR"]  # same clicks
    assert clickbait["SatClick"] < 0.85 * control["SatClick"]
    assert clickbait["Reformulation"] > control["Reformulation"]


def test_segments_give_each_unit_one_value_of_each_field() -> None:
    """``segments``: every ranking carries ``attributes`` with one value of each field, the same for every ranking of
    a unit (a user stays on their platform, pre-period included), each value with a share of the units; the rest
    of each event is what it was without them."""
    base = SimulationConfig(requests=3000, unit="user", pre_period=5.0)
    fields = (("platform", ("ios", "android", "web")), ("locale", ("en", "de")))
    plain, segmented = list(simulate(base)), list(simulate(dataclasses.replace(base, segments=fields)))
    assert [{k: v for k, v in e.items() if k != "attributes"} for e in segmented] == plain
    rankings = [e for e in segmented if e["type"] == "ranking"]
    assert all(set(e["attributes"]) == {"platform", "locale"} for e in rankings)
    seen: dict[str, set[tuple[str, str]]] = collections.defaultdict(set)
    for e in rankings:
        seen[e["unit_id"]].add((e["attributes"]["platform"], e["attributes"]["locale"]))
    assert all(len(values) == 1 for values in seen.values())
    per_unit = collections.Counter(value for values in seen.values() for value, _ in values)
    assert set(per_unit) == {"ios", "android", "web"} and min(per_unit.values()) > len(seen) / 6
    assert not any("attributes" in e for e in plain)
