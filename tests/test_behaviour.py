"""The behaviour measures against a plain loop over the log (README, "Behaviour measures").

The oracle below reads the generated events one by one, in the order of the log, keeps per request what the
definitions name (the clicked served items, the first click, whether a click was satisfied) and per session its
requests, and computes every value with ordinary Python: no code of the package is used to compute them. The
logs have rankings with and without items, query ids and session ids; clicks on served and unserved items, twice,
late (after the attribution window), before and after the satisfying dwell, without dwell; labels and purchases
(a satisfying kind); requests of a session at the same time and further apart than ``reformulation_gap``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle_cover import oracle_for
from support import AbstractTimeConfig as Config
from support import approx

from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.engine.replay import replay
from stream_eval.engine.windows import RollingWindows
from stream_eval.events.schema import Feedback, Ranking, decode_chunk_columns, finish

T0 = 1_000_000.0
WINDOW, LATENESS = 1800.0, 60.0  # the defaults: feedback more than WINDOW after serve time is late
SAT_DWELL, GAP = 30.0, 60.0
K = 3
BEHAVIOUR = ("CTR@3", "CTR@10", "Clicks", "Clicks@2", "Abandoned", "ZeroResult", "TimeToFirstClick", "SatClick",
             "QueriesPerSession", "Reformulation")
CONFIG = Config(metrics=("nDCG@3", *BEHAVIOUR), kinds=(("purchase", 3.0),), sat_kinds=("purchase",))
PER_REQUEST = BEHAVIOUR[:8]


# -- the log ------------------------------------------------------------------------------------------------------
feedback_of = st.tuples(
    st.integers(0, 6),  # the item: its position when served (0 = first), else an item that was not served
    st.sampled_from(["click", "click", "click", "label", "purchase"]),
    st.one_of(st.none(), st.sampled_from([0.0, 5.5, 29.9, 30.0, 45.0, 200.0])),  # dwell
    # seconds after serve time: before it (a clock ahead: the feedback waits for its ranking), late or not
    st.one_of(st.integers(0, 40), st.sampled_from([-5, 1799, 1800, 1801, 1900])),
    st.booleans(),  # sent twice (a few seconds later)
)
request_of = st.tuples(
    st.integers(0, 5),  # items served (0: zero results)
    st.one_of(st.none(), st.sampled_from(["q1", "q2", "q3"])),
    st.one_of(st.none(), st.sampled_from(["s1", "s2", "s3"])),
    st.sampled_from([0, 0, 10, 59, 60, 61, 200]),  # seconds after the previous request (sessions never end)
    st.lists(feedback_of, max_size=5),
)


def make_log(requests: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Events in event-time order (a ranking before the feedback of its own time)."""
    events: list[tuple[float, int, dict[str, Any]]] = []
    ts = T0
    for r, (n, query, session, after, feedback) in enumerate(requests):
        ts += after
        items = [f"r{r}-d{i}" for i in range(n)]
        ranking: dict[str, Any] = {"type": "ranking", "request_id": f"r{r}", "ts": ts, "items": items,
                                   "arm": "a" if r % 2 else "b"}
        if query is not None:
            ranking["query_id"] = query
        if session is not None:
            ranking["session_id"] = session
        events.append((ts, len(events), ranking))
        for position, kind, dwell, delay, twice in feedback:
            item = items[position] if position < n else f"r{r}-other{position}"
            event: dict[str, Any] = {"type": "feedback", "request_id": f"r{r}", "item": item, "kind": kind,
                                     "ts": ts + delay}
            if kind == "label":
                event["grade"] = position % 3
            if dwell is not None:
                event["dwell"] = dwell
            events.append((ts + delay, len(events), event))
            if twice:
                again = dict(event, ts=ts + delay + 3)
                events.append((ts + delay + 3, len(events), again))
    return [event for _, _, event in sorted(events, key=lambda e: (e[0], e[1]))]


# -- the oracle: a loop over the events ------------------------------------------------------------------------------
def oracle(events: list[dict[str, Any]]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Per-request values of the request measures, and the means of every behaviour measure."""
    requests: dict[str, dict[str, Any]] = {}
    for event in events:
        if event["type"] == "ranking":
            requests[event["request_id"]] = {"ts": event["ts"], "items": event["items"],
                                             "query": event.get("query_id"), "session": event.get("session_id"),
                                             "clicked": set(), "first": math.inf, "sat": False}
    for event in events:  # (feedback may come before its ranking: it waits for it)
        if event["type"] != "feedback":
            continue
        request = requests[event["request_id"]]
        if event["ts"] - request["ts"] > WINDOW or event["item"] not in request["items"]:
            continue  # late, or not served: no behaviour
        position = request["items"].index(event["item"]) + 1
        if event["kind"] == "click":
            request["clicked"].add(position)
            request["first"] = min(request["first"], event["ts"])
            if event.get("dwell", -1.0) >= SAT_DWELL:
                request["sat"] = True
        if event["kind"] == "purchase":
            request["sat"] = True
    values: dict[str, dict[str, float]] = {}
    for rid, request in requests.items():
        shown = bool(request["items"])
        clicked = request["clicked"]
        nan = math.nan

        def of_shown(value: float, shown: bool = shown) -> float:
            return value if shown else math.nan

        values[rid] = {
            "CTR@3": of_shown(float(any(p <= 3 for p in clicked))),
            "CTR@10": of_shown(float(any(p <= 10 for p in clicked))),
            "Clicks": of_shown(float(len(clicked))),
            "Clicks@2": of_shown(float(sum(1 for p in clicked if p <= 2))),
            "Abandoned": of_shown(float(not clicked)),
            "ZeroResult": float(not shown),
            "TimeToFirstClick": max(request["first"] - request["ts"], 0.0) if clicked else nan,
            "SatClick": of_shown(float(request["sat"])),
        }
    # sessions: the requests of a session id (the log's sessions never go quiet for the 30 min session gap)
    sessions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rid, request in requests.items():
        sessions[request["session"] or f"alone:{rid}"].append(request)
    sizes, reformulated = [], []
    for members in sessions.values():
        members.sort(key=lambda m: (m["ts"], m["query"] is not None, m["query"] or "", m["sat"]))
        sizes.append(len(members))
        for current, following in zip(members, members[1:] + [None], strict=True):
            reformulated.append(float(
                following is not None and following["ts"] - current["ts"] <= GAP and not current["sat"]
                and (current["query"] is None or following["query"] is None or following["query"] != current["query"])))
    means = {name: _mean([v[name] for v in values.values()]) for name in PER_REQUEST}
    means["QueriesPerSession"] = _mean([float(n) for n in sizes])
    means["Reformulation"] = _mean(reformulated)
    return values, means


def _mean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def _same(ours: float | None, theirs: float) -> bool:
    if ours is None:
        return math.isnan(theirs)
    return math.isclose(ours, theirs, rel_tol=1e-12, abs_tol=1e-12)


# -- the engine, as replay runs it ----------------------------------------------------------------------------------
def run(events: list[dict[str, Any]], config: Config = CONFIG, windows: bool = False,
        ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], Engine]:
    records: dict[str, dict[str, Any]] = {}

    def keep(batch: FinalisedBatch) -> None:
        for record in batch.records():
            records[record["request_id"]] = record["metrics"]

    engine = Engine(config, on_finalised=keep)
    if windows:
        RollingWindows(engine, windows=(1e7,))  # one window holding everything
    lines = b"".join(orjson.dumps(event) + b"\n" for event in events)
    engine.process(decode_chunk_columns(lines, config))
    engine.flush()
    return engine.report(), records, engine


@oracle_for("CTR", "Clicks", "Abandoned", "ZeroResult", "TimeToFirstClick", "SatClick", "QueriesPerSession",
            "Reformulation")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(request_of, min_size=1, max_size=14))
def test_behaviour_measures_equal_a_loop_over_the_log(requests: list[tuple[Any, ...]]) -> None:
    events = make_log(requests)
    expected_values, expected_means = oracle(events)
    report, records, _ = run(events)
    assert report["events"]["invalid"] == 0
    for rid, expected in expected_values.items():
        for name, value in expected.items():
            assert _same(records[rid][name], value), (rid, name, records[rid][name], value)
        assert "QueriesPerSession" not in records[rid] and "Reformulation" not in records[rid]  # per session
    for name, value in expected_means.items():
        assert _same(report["overall"]["metrics"][name], value), (name, report["overall"]["metrics"][name], value)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(request_of, min_size=1, max_size=14), st.integers(1, 7))
def test_chunks_and_windows_do_not_change_the_values(requests: list[tuple[Any, ...]], pieces: int) -> None:
    """The same log fed in chunks (feedback of a request in another chunk than its ranking) gives the same report;
    a window holding everything holds every mean of the report, session measures included."""
    events = make_log(requests)
    whole, _, _ = run(events)
    engine = Engine(CONFIG)
    windows = RollingWindows(engine, windows=(1e7,))
    size = max(1, len(events) // pieces)
    for start in range(0, len(events), size):
        chunk = b"".join(orjson.dumps(event) + b"\n" for event in events[start : start + size])
        engine.process(decode_chunk_columns(chunk, CONFIG))
    engine.flush()
    assert engine.report()["overall"] == approx(whole["overall"])  # (sums of other batches: to 1e-12)
    sums = windows.snapshot(events[-1]["ts"])
    for group in whole["groups"]:
        for name, value in group["metrics"].items():
            total, count = sums[group["experiment"], group["arm"], name, windows.labels[0]]
            assert _same(total / count if count else None, math.nan if value is None else value), name


def test_a_worked_session() -> None:
    """Three requests of one session: reformulated (unsatisfied, another query 20 s later), then satisfied, then
    nothing served; and a request of no session."""
    events = [
        {"type": "ranking", "request_id": "r1", "ts": T0, "items": ["a", "b", "c"], "query_id": "q1",
         "session_id": "s1"},
        {"type": "feedback", "request_id": "r1", "item": "b", "ts": T0 + 5, "dwell": 3},
        {"type": "ranking", "request_id": "r2", "ts": T0 + 20, "items": ["d", "e"], "query_id": "q2",
         "session_id": "s1"},
        {"type": "feedback", "request_id": "r2", "item": "d", "ts": T0 + 28},
        {"type": "feedback", "request_id": "r2", "item": "e", "ts": T0 + 30, "dwell": 45.5},
        {"type": "ranking", "request_id": "r3", "ts": T0 + 40, "items": [], "query_id": "q3", "session_id": "s1"},
        {"type": "ranking", "request_id": "r4", "ts": T0 + 50, "items": ["x"]},
    ]
    report, records, _ = run(events)
    assert records["r1"] == {**records["r1"], "CTR@3": 1.0, "Clicks": 1.0, "Abandoned": 0.0, "TimeToFirstClick": 5.0,
                             "SatClick": 0.0, "ZeroResult": 0.0}
    assert (records["r2"]["Clicks"], records["r2"]["TimeToFirstClick"], records["r2"]["SatClick"]) == (2.0, 8.0, 1.0)
    assert records["r3"]["ZeroResult"] == 1.0 and records["r3"]["nDCG@3"] is None and records["r3"]["CTR@3"] is None
    assert records["r4"]["Abandoned"] == 1.0
    metrics = report["overall"]["metrics"]
    assert metrics["QueriesPerSession"] == 2.0  # (3 + 1) / 2 sessions
    assert metrics["Reformulation"] == 0.25  # r1 of 4 requests
    assert metrics["ZeroResult"] == 0.25 and metrics["Abandoned"] == pytest.approx(1 / 3)
    assert report["overall"]["requests"] == 4 and report["overall"]["empty"] == 1  # r4; r3 served nothing: not empty


def test_lower_is_better_decisions_read_a_fall_as_better() -> None:
    """Abandoned falls from 80 % of the requests to 20 %: treatment is better on it (and on CTR@10, which rises)."""
    events: list[dict[str, Any]] = []
    for r in range(600):
        arm = "treatment" if r % 2 else "control"
        ts = T0 + r
        events.append({"type": "ranking", "request_id": f"r{r}", "ts": ts, "items": ["a", "b"],
                       "experiment": "e", "arm": arm})
        if (arm == "treatment") != (r % 10 in (0, 1)):
            events.append({"type": "feedback", "request_id": f"r{r}", "item": "a", "ts": ts})
    report, _, _ = run(events, Config(metrics=("CTR@10", "Abandoned"), sequential_n=100))
    decisions = {row["metric"]: (round(row["delta"], 9), row["decision"]) for row in report["ab"]}
    assert decisions["Abandoned"] == (-0.6, "better") and decisions["CTR@10"] == (0.6, "better")


def test_nothing_is_kept_when_no_behaviour_measure_runs() -> None:
    engine = Engine(Config())
    assert not engine.join.behaviour and not engine.sessions.behaviour
    engine.process([finish(Ranking("r1", ["a"], ts=T0), engine.config),
                    finish(Feedback("r1", "a", ts=T0 + 1, dwell=40.0), engine.config)])
    engine.flush()
    assert engine.report()["overall"]["metrics"]["MRR"] == 1.0


def test_simulated_behaviour_replays_the_same_from_a_file(tmp_path: Path) -> None:
    """The simulator's behaviour (dwell, zero results, sessions): replay of its file equals the oracle's means."""
    from stream_eval.simulate import SimulationConfig, simulate

    events = list(simulate(SimulationConfig(requests=3000, behaviour=True, seed=4, max_delay=60.0)))
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(orjson.dumps(event) + b"\n" for event in events))
    config = Config(metrics=BEHAVIOUR)
    report = replay([str(path)], config).report()
    _, means = oracle(events)
    for name, value in means.items():
        assert _same(report["overall"]["metrics"][name], value), name
    assert 0 < report["overall"]["metrics"]["ZeroResult"] < 0.05
    assert 0.05 < report["overall"]["metrics"]["Reformulation"] < 0.5


@pytest.mark.parametrize(("settings", "message"), [
    ({"sat_dwell": -1.0}, "sat_dwell"),
    ({"sat_dwell": math.inf}, "sat_dwell"),
    ({"reformulation_gap": math.nan}, "reformulation_gap"),
    ({"sat_kinds": ("purchase",)}, "sat_kinds: 'purchase'"),  # not a kind of [kinds]
    ({"sat_kinds": ("label",)}, "sat_kinds"),  # editorial, not behaviour
    ({"metrics": ("Reformulation",)}, "a measure valued for every request"),
    ({"metrics": ("nDCG@10", "Reformulation"), "gsb_metric": "Reformulation"}, "gsb_metric"),
])
def test_bad_behaviour_settings_are_config_errors(settings: dict[str, Any], message: str) -> None:
    from stream_eval.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        Config(**settings)


def test_behaviour_settings_from_a_file_and_flags(tmp_path: Path) -> None:
    from stream_eval.config import load_config

    path = tmp_path / "settings.toml"
    path.write_text('metrics = ["nDCG@10", "behaviour"]\nsat_dwell = "45s"\nsat_kinds = ["purchase"]\n'
                    'reformulation_gap = "2m"\n[kinds]\npurchase = 3\n')
    config = load_config(str(path), environ={})
    assert (config.sat_dwell, config.sat_kinds, config.reformulation_gap) == (45.0, ("purchase",), 120.0)
    assert config.to_json()["sat_kinds"] == ["purchase"] and "Reformulation" in config.to_json()["metrics"]
    flags = load_config(str(path), overrides={"sat_dwell": "10", "sat_kinds": "purchase,click"}, environ={})
    assert (flags.sat_dwell, flags.sat_kinds) == (10.0, ("purchase", "click"))


def test_the_stage_reads_session_parts_with_and_without_query_and_satisfaction() -> None:
    """Regroup records of session parts carry ``q`` and ``c`` when the session measures run; parts written without
    them (older workers) read as no query id (a query of its own) and no satisfied click."""
    from stream_eval.engine.regroup import SessionStage

    config = Config(metrics=("RR", "behaviour"))

    def part(t: float, **extra: object) -> bytes:
        return orjson.dumps({"k": "s", "id": "s1", "e": "e", "a": "a", "t": t, "s": [1.0, 0.5], "r": [1], "u": "s1",
                             **extra})

    def reformulation(log: list[bytes]) -> tuple[float, float]:
        engine = Engine(config)
        stage = SessionStage(engine, 1)
        log = [*log, orjson.dumps({"k": "w", "u": 0, "t": "inf"})]
        stage.feed(list(range(len(log))), log)
        metrics = engine.report()["overall"]["metrics"]
        return metrics["Reformulation"], metrics["QueriesPerSession"]

    # the same query, then another one 10 s later: only the second pair is a reformulation
    assert reformulation([part(T0, q="q1", c=False), part(T0 + 5, q="q1", c=False),
                          part(T0 + 15, q="q2", c=False)]) == (1 / 3, 3.0)
    assert reformulation([part(T0, q="q1", c=True), part(T0 + 5, q="q2", c=False)]) == (0.0, 2.0)  # satisfied
    assert reformulation([part(T0), part(T0 + 5)]) == (0.5, 2.0)  # older records: no query, no satisfied click


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(request_of, min_size=2, max_size=14))
def test_metrics_endpoint_exports_the_report_means(requests: list[tuple[Any, ...]]) -> None:
    """/metrics: every behaviour measure's finalised sum and count, and its window, give the report's mean."""
    from prometheus_client import CollectorRegistry

    from stream_eval.export.prometheus import EngineCollector

    events = make_log(requests)
    report, _, engine = run(events, windows=True)
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    label = engine.windows.labels[0]  # type: ignore[union-attr]  # attached by run
    for group in report["groups"]:
        for name in BEHAVIOUR:
            labels = {"experiment": group["experiment"], "arm": group["arm"], "metric": name}
            total = registry.get_sample_value("stream_eval_metric_sum_total", labels)
            count = registry.get_sample_value("stream_eval_metric_count_total", labels)
            window = [registry.get_sample_value(f"stream_eval_window_{part}", {**labels, "window": label})
                      for part in ("sum", "count")]
            expected = group["metrics"][name]
            assert total is not None and count is not None and window[0] is not None and window[1] is not None
            assert _same(total / count if count else None, math.nan if expected is None else expected), name
            assert _same(window[0] / window[1] if window[1] else None, math.nan if expected is None else expected)
