"""Floods of distinct ids keep the state bounded by configuration, count what overflows and export it.

A flood is many distinct ``session_id``, ``query_id``, ``unit_id`` values, or feedback for requests that never come,
within one attribution window (after it, everything expires anyway). Each bound is a setting (README, "Bounded
state"); beyond it the overflow is counted in the engine and exported as ``stream_eval_overflow_total{kind}``.
"""

from __future__ import annotations

import math
import random
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support import AbstractTimeConfig as Config
from support import regrouping
from test_partitions import PARTITIONS, _comparable, _feed, _replay, _route

from stream_eval.config import Arms, ConfigError, load_config
from stream_eval.engine.ab import SHARDS, UnitLedger, shard_of, unit_hashes
from stream_eval.engine.engine import Engine
from stream_eval.engine.gsb import _COMPACT, GsbTracker, rank
from stream_eval.engine.regroup import SessionStage
from stream_eval.engine.sessions import Impressions, SessionRequests, Sessions
from stream_eval.engine.windows import RollingWindows
from stream_eval.events.join import OVERFLOW, EventCounts, Join
from stream_eval.events.schema import Event, Feedback, Invalid, Ranking, finish
from stream_eval.export.prometheus import EngineCollector
from stream_eval.simulate import SimulationConfig, simulate_lines

FLOOD = 200_000
CAP = 1_000
PER_SHARD = -(-CAP // SHARDS)  # the bounds on sessions, queries and units are per shard (engine/ab.py)
KEPT = SHARDS * PER_SHARD
T0 = 1_000.0


@contextmanager
def traced() -> Iterator[Callable[[], int]]:
    """Bytes allocated since the start of the block and still held (tracemalloc)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        yield lambda: tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


def _events(events: list[Any], config: Any) -> list[Event | Invalid]:
    out = [finish(e, config) for e in events]
    assert not any(isinstance(e, Invalid) for e in out)
    return out


def _overflow(registry: CollectorRegistry, kind: str) -> float | None:
    return registry.get_sample_value("stream_eval_overflow_total", {"kind": kind})


# -- sessions --------------------------------------------------------------------------------------------------
class _Request:
    """A finalised request of a named session, as Sessions and Impressions read it (2 items, scores as a list)."""

    __slots__ = ("session_id", "ts", "n", "scores", "unit_id", "teams", "request_id")

    def __init__(self, session_id: str, ts: float) -> None:
        self.session_id, self.ts, self.n, self.scores = session_id, ts, 2, [2.0, 1.0]
        self.unit_id, self.teams, self.request_id = None, None, f"r-{session_id}"


def _add(sessions: Sessions, requests: list[_Request]) -> Any:
    impressions = Impressions(requests, np.zeros(len(requests), dtype=np.int64),  # type: ignore[arg-type]  # duck
                              np.ones(len(requests), dtype=np.int64))
    return sessions.add(SessionRequests.of(requests), np.zeros(len(requests), dtype=np.int64),  # type: ignore[arg-type]
                        impressions)


@pytest.mark.slow
def test_a_flood_of_session_ids_keeps_open_sessions_at_the_bound() -> None:
    _add(Sessions(Config(max_open_sessions=1)), [_Request("x", T0), _Request("y", T0)])  # compiled before tracing
    sessions = Sessions(Config(max_open_sessions=CAP))
    scored_alone = 0
    with traced() as held:
        for start in range(0, FLOOD, 10_000):  # 200k sessions opened within 20 s: none may close yet
            batch = [_Request(f"s{k}", T0 + k / 10_000) for k in range(start, start + 10_000)]
            scored = _add(sessions, batch)
            scored_alone += 0 if scored is None else len(scored.ids)
            del batch, scored
        kept = SHARDS * -(-CAP // SHARDS)  # (the bound is per shard: CAP / SHARDS, rounded up)
        assert len(sessions.open) == kept
        assert sessions.overflow == scored_alone == FLOOD - kept
        # what is held is what CAP open sessions hold (~1 KB each with 20 items; ~600 bytes here), not the flood's
        assert held() < 2_000_000


def _one_shard(n: int) -> list[str]:
    """``n`` session ids of one shard (of the A/B units: a session without unit_id has its id as unit)."""
    return [sid for sid in (f"s{k}" for k in range(100 * n * SHARDS)) if shard_of(sid) == 0][:n]


def test_sessions_beyond_the_bound_are_scored_alone_under_their_session_id() -> None:
    sessions = Sessions(Config(max_open_sessions=2 * SHARDS))  # two per shard
    a, b, c = _one_shard(3)
    other = next(sid for sid in (f"t{k}" for k in range(1000)) if shard_of(sid) != 0)  # another shard has room
    scored = _add(sessions, [_Request(a, T0), _Request(b, T0), _Request(c, T0 + 1), _Request(a, T0 + 2),
                             _Request(other, T0 + 2)])
    assert scored is not None and scored.ids == [c] and scored.units == [c]
    assert [sid for _, sid in sessions.open] == [a, b, other] and len(sessions.open[0, a].parts) == 2
    assert sessions.overflow == 1
    assert scored.keys.tolist() == [T0 + 1 + sessions.horizon]  # its finalisation point, as a request of its own


def test_sessions_that_ended_make_room_however_rarely_close_runs() -> None:
    config = Config(max_open_sessions=2 * SHARDS)
    sessions = Sessions(config)
    a, b, c, d = _one_shard(4)
    _add(sessions, [_Request(a, T0), _Request(b, T0)])
    after_gap = T0 + config.session_gap + 1  # a and b ended before this request was finalised
    assert _add(sessions, [_Request(c, after_gap), _Request(d, after_gap)]) is None  # no close() in between
    assert sorted(sid for _, sid in sessions.open) == sorted([c, d]) and sessions.overflow == 0
    closed = sessions.close(after_gap + sessions.horizon)  # a and b are scored by the next close
    assert closed is not None and sorted(closed.ids) == sorted([a, b])


# -- GSB query buckets -----------------------------------------------------------------------------------------
def _query_rows(n: int, seed: int) -> tuple[list[tuple[str, str]], list[str], list[float], list[float]]:
    """Requests of ``n`` distinct queries, one per arm (so each query kept gets a verdict), in a shuffled order."""
    rng = random.Random(seed)
    rows = [(("exp", arm), f"q{k}", T0 + 1.0, rng.random()) for k in range(n) for arm in ("a", "b")]
    rng.shuffle(rows)
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]


def _arms(_: str) -> Arms:
    return Arms("a", ("b",))


@pytest.mark.slow
def test_a_flood_of_query_ids_keeps_a_bucket_at_the_bound_in_any_order() -> None:
    n = FLOOD // 2  # 200k requests, 100k distinct queries
    groups, queries, ts, values = _query_rows(n, seed=1)
    totals = []
    for order in ("shuffled", "reversed"):
        tracker = GsbTracker(Config(max_open_queries=CAP), horizon=60.0)
        if order == "reversed":
            groups, queries, ts, values = groups[::-1], queries[::-1], ts[::-1], values[::-1]
        with traced() as held:
            for k in range(0, len(queries), 8192):
                tracker.query_metrics(groups[k : k + 8192], queries[k : k + 8192], ts[k : k + 8192],
                                      values[k : k + 8192])
            (shards,) = tracker._kept.values()
            assert [len(kept.queries) for kept in shards.values()] == [PER_SHARD] * SHARDS
            assert held() < 3_000_000  # CAP queries' requests (and their strings), not 100k
        tracker.close(math.inf, _arms)
        assert tracker.overflow == 2 * (n - KEPT)  # both requests of every query not kept
        total = tracker.totals(_arms)["exp", "b", "metric"]
        assert total.good + total.same + total.bad == KEPT
        totals.append((total.good, total.same, total.bad))
    assert totals[0] == totals[1]  # the queries of smallest rank, whatever the order of arrival
    smallest: dict[int, set[str]] = {}  # of each shard
    for query in sorted((f"q{k}" for k in range(n)), key=rank):
        shard = smallest.setdefault(shard_of(query), set())
        if len(shard) < PER_SHARD:
            shard.add(query)
    tracker = GsbTracker(Config(max_open_queries=CAP), horizon=60.0)
    tracker.query_metrics(groups, queries, ts, values)
    assert {shard: kept.queries for (_, shard), kept in next(iter(tracker._kept.values())).items()} == smallest


def test_queries_arriving_largest_rank_first_are_compacted_away() -> None:
    """The worst order for a bottom-k bound: every new query puts one out. Their requests are dropped from the
    bucket's parts every ``_COMPACT`` queries put out, so the bucket holds fewer than CAP + _COMPACT requests."""
    n = KEPT + 2 * _COMPACT + 10
    names = sorted((f"q{k}" for k in range(n)), key=rank, reverse=True)
    tracker = GsbTracker(Config(max_open_queries=CAP), horizon=60.0)
    for k in range(0, n, 1000):
        chunk = names[k : k + 1000]
        tracker.query_metrics([("exp", "a")] * len(chunk), chunk, [T0] * len(chunk), [0.5] * len(chunk))
        held = sum(len(queries) for _, queries, _ in tracker._queries[int(T0 // tracker.window)])
        assert held < KEPT + _COMPACT + 1000
    tracker.close(math.inf, _arms)
    assert tracker.overflow == n - KEPT


def test_query_overflow_is_counted_when_its_bucket_closes_and_not_while_rebuilding() -> None:
    tracker = GsbTracker(Config(max_open_queries=1), horizon=60.0)  # (one per shard)
    queries = [q for q in (f"q{k}" for k in range(1000)) if shard_of(q) == 0][:3]
    tracker.query_metrics([("exp", "a")] * 3, queries, [T0] * 3, [1.0] * 3)
    assert tracker.overflow == 0  # counted with the bucket's verdicts
    tracker.close(math.inf, _arms, count=False)  # a muted rebuild: the previous owner counted them
    assert tracker.overflow == 0
    tracker.query_metrics([("exp", "a")] * 3, queries, [T0] * 3, [1.0] * 3)
    tracker.close(math.inf, _arms)
    assert tracker.overflow == 2


# -- A/B units ---------------------------------------------------------------------------------------------------
def _contributions(ledger: UnitLedger, order: list[int]) -> None:
    """One request per unit ``u{k}``, keyed at k / 1000 s; added in ``order``, in batches."""
    for start in range(0, len(order), 10_000):
        ks = order[start : start + 10_000]
        ledger.add_requests(np.array([T0 + k / 1000 for k in ks]), [f"r{k}" for k in ks], ["exp"] * len(ks),
                            ["a" if k % 2 else "b" for k in ks], [f"u{k}" for k in ks], np.ones((len(ks), 1)))


@pytest.mark.slow
def test_a_flood_of_unit_ids_keeps_each_experiment_at_the_bound() -> None:
    config = Config(max_units=CAP)
    ledgers = []
    for seed in (1, 2):
        order = list(range(FLOOD))
        random.Random(seed).shuffle(order)  # arrival order differs (another worker count): the units do not
        ledger = UnitLedger(config, ["MRR"])
        with traced() as held:
            _contributions(ledger, order)
            ledger.release(math.inf)
            assert held() < 2_000_000  # CAP units' rows and ids, not 200k
        # each shard keeps the first ceil(CAP / SHARDS) of its units in (key, id) order
        per_shard = -(-CAP // SHARDS)
        kept: dict[int, list[str]] = {}
        for k in range(FLOOD):
            shard = kept.setdefault(shard_of(f"u{k}"), [])
            if len(shard) < per_shard:
                shard.append(f"u{k}")
        shards = ledger.experiments["exp"]
        assert {s: e.unit_key[: e.size].tolist() for s, e in shards.items()} == {
            s: unit_hashes(units).tolist() for s, units in kept.items()}
        assert sum(e.size for e in shards.values()) == SHARDS * per_shard
        assert ledger.overflow == FLOOD - SHARDS * per_shard
        ledgers.append(ledger)
    first, second = (ledger.experiments["exp"] for ledger in ledgers)
    for shard, one in first.items():
        other = second[shard]
        assert np.array_equal(one.unit_key, other.unit_key) and np.array_equal(one.y, other.y) \
            and np.array_equal(one.n, other.n)
    assert repr(ledgers[0].results()) == repr(ledgers[1].results())  # (NaN fields: compared as text)
    units = ledgers[0].units()["exp"]
    assert units["a"] + units["b"] == SHARDS * per_shard


def test_a_known_unit_is_still_tracked_at_the_bound_and_a_new_arm_is_not_seen() -> None:
    ledger = UnitLedger(Config(max_units=1), ["MRR"])  # (one unit per shard)
    keys = np.array([T0, T0 + 1, T0 + 2])
    other = next(f"u{k}" for k in range(2, 1000) if shard_of(f"u{k}") == shard_of("u1"))  # in u1's shard
    ledger.add_requests(keys, ["r1", "r2", "r3"], ["exp"] * 3, ["a", "b", "a"], ["u1", other, "u1"], np.ones((3, 1)))
    ledger.release(math.inf)
    experiment = ledger.experiments["exp"][shard_of("u1")]
    assert experiment.arms == ["a"] and experiment.n[0, 0] == 2.0 and ledger.overflow == 1


# -- feedback waiting for its ranking ---------------------------------------------------------------------------
@pytest.mark.slow
def test_a_flood_of_orphan_feedback_keeps_the_waiting_feedback_at_the_bound() -> None:
    config = Config(max_waiting_feedback=CAP)
    Join(config, EventCounts()).add([Feedback("x", "d1", ts=T0), Ranking("x", ["d1"], ts=T0)])  # compiled first
    counts = EventCounts()
    join = Join(config, counts)

    def flood(start: int, end: int) -> None:  # feedback within 20 s for rankings that never come
        for first in range(start, end, 10_000):
            join.add([Feedback(f"never-{k}", "d1", ts=T0 + k / 10_000) for k in range(first, first + 10_000)])
            join.advance(T0 + (first + 10_000) / 10_000)

    flood(0, FLOOD - 50_000)
    with traced() as held:  # (the last 50k only: tracing slows the join tenfold)
        flood(FLOOD - 50_000, FLOOD)
        # what it holds is the CAP feedback waiting at the end (all arrived while tracing, ~500 bytes each): at the
        # bound, a new waiting feedback takes the place of one given up (without a bound: ~45 MB more)
        assert held() < 1_000_000
    assert join.waiting == sum(map(len, join.pending.values())) == CAP
    assert len(join._pending_expiry) <= 2 * CAP + (1 << 16)
    assert counts["feedback", "orphan"] == counts[OVERFLOW, "waiting_feedback"] == FLOOD - CAP
    assert set(join.pending) == {f"never-{k}" for k in range(FLOOD - CAP, FLOOD)}  # the latest wait
    join.flush()
    assert counts["feedback", "orphan"] == FLOOD and counts[OVERFLOW, "waiting_feedback"] == FLOOD - CAP
    assert counts.summary()["feedback"] == FLOOD  # overflow is no event of its own


def test_feedback_before_its_ranking_still_joins_during_a_flood() -> None:
    config = Config(max_waiting_feedback=10)
    engine = Engine(config)
    flood = [Feedback(f"never-{k}", "d1", ts=T0 + k / 100) for k in range(100)]
    engine.process(_events([Feedback("real", "d1", ts=T0 + 1.5), *flood[:5]], config))  # waits for its ranking
    assert engine.join.waiting == 6
    engine.process(_events([Ranking("real", ["d1", "d2"], ts=T0), *flood[5:]], config))
    engine.flush()
    assert engine.report()["overall"]["metrics"]["MRR"] == 1.0
    assert engine.counts[OVERFLOW, "waiting_feedback"] == 90 and engine.counts["feedback", "orphan"] == 100


def test_waiting_feedback_is_not_counted_while_a_join_is_rebuilt() -> None:
    config = Config(max_waiting_feedback=1)
    engine = Engine(config)
    join = engine.new_join()
    with engine.muted(join):
        engine.process(_events([Feedback(f"never-{k}", "d1", ts=T0) for k in range(5)], config), join)
    assert join.waiting == 1 and not engine.counts


# -- replay and the workers agree at the bounds -----------------------------------------------------------------
@pytest.mark.slow
def test_the_regroup_stage_gives_replays_numbers_at_the_bounds(tmp_path: Any) -> None:
    """Sessions, query buckets and A/B units beyond small bounds: three partitions and the regroup stage count the
    same overflow and give the same report as replay."""
    config = Config(attribution_window=20.0, allowed_lateness=5.0, session_gap=20.0, gsb_window=30.0,
                    max_open_sessions=15, max_open_queries=25, max_units=120)
    sim = SimulationConfig(requests=3000, seed=9, queries=400, judgments=True, label_rate=0.3,
                           duplicate_fraction=0.05, orphan_fraction=0.03, max_delay=15.0, shuffle_window=3.0)
    lines = list(simulate_lines(sim))
    expected, _ = _replay(lines, tmp_path, config)
    assert expected.sessions.overflow and expected.gsb.overflow and expected.ledger.overflow
    sent, _ = _route(lines)
    engine = Engine(config)
    partitioned = regrouping(engine)
    stage = SessionStage(engine, PARTITIONS)
    offset = 0
    for kind, partition, message_offset, value in sent:
        _feed(partitioned, kind, partition, [(message_offset, value)])
        records = [record for _, record in partitioned.take_regrouped(commit=True)]
        stage.feed(list(range(offset, offset + len(records))), records)
        offset += len(records)
    assert (engine.sessions.overflow, engine.gsb.overflow, engine.ledger.overflow) == (
        expected.sessions.overflow, expected.gsb.overflow, expected.ledger.overflow)
    totals = partitioned.totals()
    assert _comparable(totals.report()) == _comparable(expected.report())
    assert totals.ab() == expected.ab() and totals.srm() == expected.srm()


def test_bounds_not_reached_change_nothing(tmp_path: Any) -> None:
    sim = SimulationConfig(requests=1500, seed=4, judgments=True, interleaving=True, label_rate=0.3,
                           orphan_fraction=0.05, shuffle_window=20.0)
    lines = list(simulate_lines(sim))
    unbounded, _ = _replay(lines, tmp_path, Config())
    # (max_units is spread over the shards: the largest shard of an experiment sets the bound)
    units = SHARDS * max(e.size for shards in unbounded.ledger.experiments.values() for e in shards.values())
    tight = Config(max_units=units, max_open_queries=400, max_open_sessions=1500, max_waiting_feedback=1500)
    bounded, _ = _replay(lines, tmp_path, tight)
    assert bounded.report() == {**unbounded.report(), "config": bounded.report()["config"]}
    assert (bounded.sessions.overflow, bounded.gsb.overflow, bounded.ledger.overflow) == (0, 0, 0)
    assert bounded.counts[OVERFLOW, "waiting_feedback"] == 0
    below, _ = _replay(lines, tmp_path, Config(max_units=units - SHARDS))
    assert below.ledger.overflow > 0  # the bound was tight


# -- export ---------------------------------------------------------------------------------------------------------
def test_overflow_is_exported_per_kind() -> None:
    config = Config(max_open_sessions=1, max_open_queries=1, max_units=1, max_waiting_feedback=1)
    engine = Engine(config)
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    assert [_overflow(registry, kind) for kind in ("session", "query", "unit", "waiting_feedback")] == [0.0] * 4
    # one shard of units (and so of sessions), and of queries: bounds of 1 per shard
    units = [u for u in (f"u{k}" for k in range(2000)) if shard_of(u) == 0][:4]
    queries = [q for q in (f"q{k}" for k in range(2000)) if shard_of(q) == 0][:4]
    rankings = [Ranking(f"r{k}", ["d1", "d2"], ts=T0 + k, session_id=f"s{k}", query_id=queries[k], unit_id=units[k],
                        experiment="exp", arm="ab"[k % 2]) for k in range(4)]
    clicks = [Feedback(f"r{k}", "d1", ts=T0 + k + 1) for k in range(4)]
    orphans = [Feedback(f"never-{k}", "d1", ts=T0) for k in range(3)]
    engine.process(_events([*rankings, *clicks, *orphans], config))
    engine.flush()
    assert engine.sessions.overflow == 3 and engine.gsb.overflow == 3
    assert engine.ledger.overflow == 6  # the requests of u1, u2, u3 and their sessions (scored alone)
    assert _overflow(registry, "session") == 3.0
    assert _overflow(registry, "query") == 3.0
    assert _overflow(registry, "unit") == 6.0
    assert _overflow(registry, "waiting_feedback") == 2.0
    assert registry.get_sample_value("stream_eval_events_total", {"type": "feedback", "status": "orphan"}) == 3.0
    assert registry.get_sample_value("stream_eval_events_total",
                                     {"type": OVERFLOW, "status": "waiting_feedback"}) is None  # no event


def _exposition_lines(distinct: int) -> int:
    """``/metrics`` lines after ``distinct`` requests, each of its own experiment, arm, query, session and unit,
    clicked, plus as many feedback events for requests that never come (live windows attached).

    Sessions, queries, units and waiting feedback have no series of their own; the lines are those of the
    (experiment, arm) groups, ~67 each (here 21: ``max_label_values`` 20, and ``__other__``)."""
    config = Config(max_open_sessions=CAP, max_open_queries=CAP, max_units=CAP, max_waiting_feedback=CAP,
                    max_label_values=20)
    engine = Engine(config)
    RollingWindows(engine, width=10.0)
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    events: list[Any] = []
    for k in range(distinct):
        events += [Ranking(f"r{k}", ["d1", "d2"], ts=T0 + k / 10, experiment=f"e{k}", arm=f"a{k}", query_id=f"q{k}",
                           session_id=f"s{k}", unit_id=f"u{k}"),
                   Feedback(f"r{k}", "d1", ts=T0 + k / 10 + 1), Feedback(f"never-{k}", "d1", ts=T0 + k / 10)]
    engine.process(_events(events, config))
    engine.advance(T0 + distinct / 10 + engine.join.horizon + 1)  # requests finalised; sessions, buckets open
    return len(generate_latest(registry).splitlines())


def test_metrics_stay_small_with_thousands_of_distinct_ids() -> None:
    lines = _exposition_lines(5_000)
    assert lines < 2_000
    assert _exposition_lines(2_500) == lines  # bounded by the settings, not by the number of distinct ids


# -- settings ---------------------------------------------------------------------------------------------------------
def test_bounds_are_settings() -> None:
    config = load_config(overrides={"max_units": "5"}, environ={"STREAM_EVAL_MAX_OPEN_SESSIONS": "7"})
    assert (config.max_units, config.max_open_sessions) == (5, 7)
    defaults = Config()
    assert (defaults.max_open_sessions, defaults.max_open_queries, defaults.max_units,
            defaults.max_waiting_feedback) == (300_000, 500_000, 1_000_000, 100_000)
    with pytest.raises(ConfigError, match="max_waiting_feedback"):
        Config(max_waiting_feedback=-1)
    assert orjson.dumps(defaults.to_json())  # the report's config section is unchanged by them
