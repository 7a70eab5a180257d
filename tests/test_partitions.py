"""The partitioned (streaming) engine without Kafka: same numbers as replay, rebalances count nothing twice."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest
from support import PARTITIONS, Log, approx, feed, move_partition_halfway, regrouping, route
from support import AbstractTimeConfig as Config

from stream_eval.config import ExperimentSettings
from stream_eval.engine import records, snapshot
from stream_eval.engine import snapshot as sn
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.engine.partitions import KINDS, Checkpoint, PartitionedEngine
from stream_eval.engine.parts import Parts
from stream_eval.engine.regroup import SessionStage, StageCheckpoint
from stream_eval.engine.replay import replay
from stream_eval.engine.sessions import starts_of
from stream_eval.engine.windows import RollingWindows
from stream_eval.events.join import EventCounts
from stream_eval.simulate import SimulationConfig, simulate_lines
from stream_eval.stream.backoff import BrokerHealth, SilenceClock

# (the helpers live in support; these names are what other test modules import from here)
_route, _feed = route, feed


def run_partitioned(lines: list[bytes], config: Any, collect: Collect, batch: int) -> PartitionedEngine:
    """``lines`` through a partitioned engine of every partition, in fetches of up to ``batch`` messages per
    topic-partition."""
    sent, _ = _route(lines)
    engine = PartitionedEngine(Engine(config, collect))
    for partition in range(PARTITIONS):
        engine.assign(partition)
    pending: dict[tuple[str, int], list[tuple[int, bytes]]] = defaultdict(list)
    for kind, partition, offset, value in sent:
        pending[kind, partition].append((offset, value))
        if len(pending[kind, partition]) >= batch:
            _feed(engine, kind, partition, pending.pop((kind, partition)))
    for (kind, partition), rest in pending.items():
        _feed(engine, kind, partition, rest)
    return engine


class Collect:
    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.repeated = 0

    def __call__(self, batch: FinalisedBatch) -> None:
        for record in batch.records():
            self.repeated += record["request_id"] in self.records
            self.records[record["request_id"]] = record


def _lines(requests: int, seed: int, behaviour: bool = False) -> list[bytes]:
    sim = SimulationConfig(requests=requests, seed=seed, judgments=True, interleaving=True, label_rate=0.3,
                           late_fraction=0.03, duplicate_fraction=0.05, orphan_fraction=0.03, invalid_fraction=0.02,
                           behaviour=behaviour)
    return list(simulate_lines(sim))


#: The measures with the behaviour and session measures (README, "Behaviour measures").
BEHAVIOUR = ("default", "behaviour")


def _replay(lines: list[bytes], tmp_path: Any, config: Config) -> tuple[Engine, Collect]:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(lines))
    collect = Collect()
    return replay([str(path)], config, collect), collect


def _comparable(report: dict[str, Any]) -> Any:
    """The report without its config; sums of floats taken in another order agree to 1e-12, not bit for bit."""
    return approx({key: report[key] for key in ("events", "overall", "groups", "gsb", "ab")})


@pytest.mark.slow
@pytest.mark.parametrize(("batch", "behaviour"), [(1, False), (7, False), (500, False), (7, True)])
def test_partitioned_input_gives_the_replay_numbers(tmp_path: Any, batch: int, behaviour: bool) -> None:
    config = Config(metrics=BEHAVIOUR) if behaviour else Config()
    lines = _lines(1500, seed=3, behaviour=behaviour)
    expected, expected_records = _replay(lines, tmp_path, config)
    collect = Collect()
    engine = run_partitioned(lines, config, collect, batch)
    assert engine.watermark == math.inf
    assert _comparable(engine.totals().report()) == _comparable(expected.report())
    assert collect.records == expected_records.records
    assert collect.repeated == 0


def test_events_after_the_end_of_every_partition_go_on_as_in_replay(tmp_path: Any) -> None:
    """A log read to its end (``produce`` sends an end watermark to every topic-partition), then more traffic on the
    same topics (live, say). Event time stood at +inf for good: the live windows and their gauge stopped, and the
    regroup stage closed no session and applied no A/B unit of the new traffic again (its partitions had said
    +inf). Now an ended partition that has events again tells the stage (a ``resumed`` watermark) and event time
    goes on from the new events, as replay goes on after an end watermark in its input: same numbers."""
    config, first = _short_horizons(600, seed=21, behaviour=False, look_every=60.0)
    defaults = SimulationConfig()
    later = defaults.start_ts + 600 / defaults.rate + 3600.0  # (an hour after the first log's last request)
    _, second = _short_horizons(600, seed=22, behaviour=False, start_ts=later)
    end = b'{"type": "watermark", "end": true}\n'
    expected, _ = _replay([*first, end, *second], tmp_path, config)
    engine = PartitionedEngine(Engine(config))
    for partition in range(PARTITIONS):
        engine.assign(partition)
    offsets: dict[tuple[str, int], int] = defaultdict(int)
    early: set[bytes] = set()  # (a judgment of the second log, read right after the end)
    for part in (first, second):
        sent, _ = _route(part)
        for kind, partition, _, value in sent:
            if value in early:
                early.discard(value)
                continue
            _feed(engine, kind, partition, [(offsets[kind, partition], value)])
            offsets[kind, partition] += 1
        if part is first:
            assert engine.watermark == math.inf
            closed = engine.totals().overall().sessions
            engine_units = engine.totals().report()["srm"][0]["units"]
            # a judgment after the end joins nothing: it starts no event time (no resumed watermark)
            judgment = next(value for kind, _, _, value in _route(second)[0] if kind == "judgment")
            partition = next(p for kind, p, _, value in _route(second)[0] if value == judgment)
            _feed(engine, "judgment", partition, [(offsets["judgment", partition], judgment)])
            offsets["judgment", partition] += 1
            early.add(judgment)
            assert engine.tasks[partition].flushed and engine.tasks[partition].announced == math.inf
    assert engine.watermark == math.inf and engine.engine.watermark > later  # (the windows went on)
    report = engine.totals().report()
    assert report["overall"]["sessions"] > closed > 0  # the new traffic's sessions were scored
    assert report["ab"] and report["srm"][0]["units"] != engine_units  # and its A/B units applied
    assert _comparable(report) == _comparable(expected.report())
    # a new owner of an ended partition (from its checkpoint) says "resumed" too when events come after the end
    checkpoint = Checkpoint.from_json(orjson.loads(orjson.dumps(engine.checkpoint(0).to_json())))
    assert checkpoint.watermark == math.inf and {"ranking", "feedback"} <= set(checkpoint.ended)
    moved = regrouping(Engine(config))
    moved.assign(0, checkpoint)
    moved.take_routed()
    ranking = [value for kind, partition, _, value in _route(second)[0] if kind == "ranking" and partition == 0][0]
    _feed(moved, "ranking", 0, [(offsets["ranking", 0], ranking)])  # (one of the second log's: after the end)
    marks = [records.decode(value) for _, _, value in moved.take_routed()]
    marks = [mark for mark in marks if type(mark) is records.PartitionWatermark and mark.input_partition == 0]
    assert [mark.resumed for mark in marks] == [True] and marks[0].at < math.inf


@pytest.mark.slow
@pytest.mark.parametrize("stale", [False, True], ids=["from-the-start-offsets", "from-offset-0"])
def test_rebalance_rebuilds_state_without_counting_twice(tmp_path: Any, stale: bool) -> None:
    """Partition 0 moves from worker A to worker B halfway; B re-reads from A's checkpoint, muted up to it.
    ``stale``: B's consumer reads from offset 0 instead (a reset to an old committed offset that won over the
    seek): what comes before the checkpoint's start is dropped, not counted again."""
    config = Config()
    lines = _lines(1500, seed=5)
    expected, expected_records = _replay(lines, tmp_path, config)
    first, second = Collect(), Collect()
    a, b = PartitionedEngine(Engine(config, first)), PartitionedEngine(Engine(config, second))
    checkpoint = move_partition_halfway(lines, a, b, stale=stale)
    assert checkpoint.start["ranking"] < checkpoint.processed["ranking"]  # open requests are rebuilt
    assert not set(first.records) & set(second.records)
    assert first.records | second.records == expected_records.records
    combined = EventCounts(a.totals().counts + b.totals().counts)
    assert combined.summary() == expected.counts.summary()  # lines of unknown type count as rankings' here
    overall = a.totals().overall()
    overall += b.totals().overall()
    assert overall.requests == expected.overall().requests


def _short_horizons(requests: int, seed: int, behaviour: bool, look_every: float = 3600.0,
                    cuped: bool = False, **simulated: Any) -> tuple[Config, list[bytes]]:
    """A config of short horizons (many sessions and query buckets close) and simulated traffic with every kind of
    event, in three arms (A/B/n: control, then the treatments treatment and worse); with ``behaviour``, the
    behaviour and session measures and traffic with dwell; with ``cuped``, users with persistent preferences and a
    pre-period of a third of the log, the experiment CUPED."""
    experiments = (("exp1", ExperimentSettings(cuped=True)),) if cuped else ()
    config = Config(attribution_window=20.0, allowed_lateness=5.0, session_gap=20.0, gsb_window=30.0,
                    look_every=look_every, metrics=BEHAVIOUR if behaviour else (), experiments=experiments)
    users = {"unit": "user", "pre_period": requests / 50.0 / 3, "preference": 0.8} if cuped else {}
    sim = SimulationConfig(requests=requests, seed=seed, judgments=True, interleaving=True, label_rate=0.3,
                           duplicate_fraction=0.05, orphan_fraction=0.03, invalid_fraction=0.02, max_delay=15.0,
                           shuffle_window=3.0, behaviour=behaviour,
                           arms=(("control", 0.55), ("treatment", 0.7), ("worse", 0.4)), **users, **simulated)
    return config, list(simulate_lines(sim))


@pytest.mark.slow
@pytest.mark.parametrize(("snapshots", "behaviour"), [(False, False), (True, False), (True, True)],
                         ids=["from-the-start", "from-a-snapshot", "from-a-snapshot-behaviour"])
def test_regroup_stage_moves_between_engines_without_changing_sessions_or_gsb(tmp_path: Any, snapshots: bool,
                                                                              behaviour: bool) -> None:
    """Named sessions and query GSB go through the regroup log; its stage moves to another engine mid-stream.

    Without a snapshot the new owner rebuilds the A/B units from the log's start; with one (taken at a third of
    the stream, then again at a half), from the snapshot and the records after the offset it covers. With the
    session measures, the session parts carry their query and whether they had a satisfied click."""
    config, lines = _short_horizons(4000, 9, behaviour)
    expected, _ = _replay(lines, tmp_path, config)
    sent, _ = _route(lines)
    first, second = Engine(config), Engine(config)
    partitioned = regrouping(first)
    log: list[bytes] = []
    stage = SessionStage(first, PARTITIONS)
    handed_over = False
    stored: dict[tuple[int, int], bytes] = {}
    for n, (kind, partition, offset, value) in enumerate(sent):
        _feed(partitioned, kind, partition, [(offset, value)])
        new = [value for _, value in partitioned.take_regrouped(commit=True)]
        stage.feed(list(range(len(log), len(log) + len(new))), new)
        log += new
        if snapshots and n in (len(sent) // 3, len(sent) // 2):
            where = (len(stored), 1)
            stored[where] = snapshot.take(first)
            stage.snapshot_taken(where, stage.next_offset)
        if not handed_over and n >= len(sent) * 3 // 4:
            assert first.overall().sessions > 0 and first.sessions.open  # scored some, some still open
            checkpoint = StageCheckpoint.from_json(orjson.loads(orjson.dumps(stage.checkpoint().to_json())))
            assert checkpoint.start < checkpoint.processed
            # with a snapshot, the rebuild starts where the sessions and query buckets open at the snapshot need
            # it (here a long-lived session from the start of the log), no longer at 0 for the A/B units
            assert (checkpoint.snapshot is not None) == snapshots and (checkpoint.start > 0) == snapshots
            first.drop_regrouped()
            data = None if checkpoint.snapshot is None else stored[checkpoint.snapshot]
            stage = SessionStage(second, PARTITIONS, checkpoint, data)
            stage.feed(list(range(checkpoint.start, len(log))), log[checkpoint.start:])
            handed_over = True
    merged = Engine(config)
    merged.merge(partitioned.totals())  # the partitions' shares and the stage's first owner's
    merged.merge(second)
    assert _comparable(merged.report()) == _comparable(expected.report())
    assert second.overall().sessions > 0
    # the A/B units were rebuilt by the new owner from the log: the same numbers as replay's, exactly
    assert merged.ab() and merged.ab() == expected.ab()
    assert {row["treatment"] for row in expected.ab()} == {"treatment", "worse"}  # every treatment compared
    assert merged.srm() == expected.srm() and set(expected.srm()[0]["units"]) == {"control", "treatment", "worse"}
    # every verdict (judgments and interleaving too) reached the stage: the sign tests are replay's
    rows = merged.gsb_rows()
    assert {row["source"] for row in rows} == {"judgment", "metric", "interleaving"}
    assert rows == expected.gsb_rows() and all(row["p_value"] is not None for row in rows)


class Stages:
    """A regroup log of several partitions, each read by its own stage (``SessionStage(stage=q)``), in process."""

    def __init__(self, config: Config, stages: int, local: str = "", lag: int = 0, live: bool = True) -> None:
        """``local``: the other partitions also give their looks to partition 0's merger at once, as a process
        holding them all does (``"also"``: besides the log; ``"only"``: their reports never reach the log). ``lag``:
        partition 0 reads its log that many records behind (a backlog; :meth:`catch_up`). ``live``: the other
        partitions report their live looks too. :attr:`folds` keeps the rows of partition 0 at each look it folds."""
        self.config, self.count, self.local, self.lag, self.live = config, stages, local, lag, live
        self.engines = [Engine(config) for _ in range(stages)]
        self.stages = [SessionStage(self.engines[q], PARTITIONS, stage=q, stages=stages) for q in range(stages)]
        self.logs: list[list[bytes]] = [[] for _ in range(stages)]
        self.fed = [0] * stages  # how much of its log each partition's stage has read
        self.snapshots: dict[tuple[int, int], bytes] = {}
        self.retired: list[Engine] = []  # engines of earlier owners: what they counted is their share
        self.folds: dict[float, Any] = {}
        self._link()

    def _link(self) -> None:
        """Link the stages as a process holding them all does (``StagePartitions``), partition 0's folds kept."""
        merger = self.engines[0].ledger.merger
        merger.on_look = lambda boundary: self.folds.__setitem__(boundary, merger.results())
        linked = merger if self.local else None
        for stage in self.stages[1:]:
            if stage.local is not linked:
                stage.link(linked)

    def write(self, routed: list[tuple[int, bytes, bytes]]) -> None:
        """Append records to their partitions and feed them; then the looks the partitions report, to 0."""
        for q in range(self.count):
            self._append(q, [value for to, _, value in routed if to == q])
        reports = [report for stage in self.stages[1:] for report in stage.take_reports(self.live)]
        self._append(0, [] if self.local == "only" else reports)

    def _append(self, q: int, values: list[bytes]) -> None:
        self.logs[q] += values
        self.catch_up(q, lagging=True)

    def catch_up(self, q: int, lagging: bool = False) -> None:
        """Feed partition ``q``'s stage its log (``lagging``: but the last :attr:`lag` records of partition 0's)."""
        log, fed = self.logs[q], self.fed[q]
        upto = len(log) - (self.lag if lagging and q == 0 else 0)
        if upto > fed:
            self.stages[q].feed(list(range(fed, upto)), log[fed:upto])
            self.fed[q] = upto

    def move(self, q: int, snapshot: bool) -> None:
        """Stage partition ``q`` moves to a new engine: from its checkpoint (after a snapshot when ``snapshot``)."""
        stage, engine = self.stages[q], self.engines[q]
        if snapshot:
            where = (len(self.snapshots), q)
            self.snapshots[where] = sn.take(engine)
            stage.snapshot_taken(where, stage.next_offset)
        reports = stage.take_reports(self.live)  # (written before the checkpoint is stored)
        checkpoint = StageCheckpoint.from_json(orjson.loads(orjson.dumps(stage.checkpoint().to_json())))
        self._append(0, reports) if q else None
        engine.drop_regrouped()
        self.retired.append(engine)
        new = self.engines[q] = Engine(self.config)
        data = None if checkpoint.snapshot is None else self.snapshots[checkpoint.snapshot]
        self.stages[q] = SessionStage(new, PARTITIONS, checkpoint, data, stage=q, stages=self.count)
        self._link()
        self.fed[q] = checkpoint.start
        self.catch_up(q, lagging=True)
        if q:
            self._append(0, self.stages[q].take_reports(self.live))


def run_with_stages(lines: list[bytes], config: Config, stages: int, moves: str = "",
                    local: str = "") -> tuple[Engine, Stages]:
    """``lines`` through a partitioned engine of every partition, one message a fetch, and a regroup log of
    ``stages`` partitions each read by its own stage; ``moves``: partitions 0 and 1 move to new engines at a third
    and two thirds of the stream (from their checkpoints; with ``"snapshots"``, from snapshots taken then); ``local``:
    see :class:`Stages`. Returns the merged totals (of the partitions, and of every stage engine, earlier owners'
    included) and the log."""
    sent, _ = _route(lines)
    host = Engine(config)  # (the stage is run here, by partitions)
    partitioned = regrouping(host, stages=stages)
    log = Stages(config, stages, local)
    for n, (kind, partition, offset, value) in enumerate(sent):
        _feed(partitioned, kind, partition, [(offset, value)])
        log.write(partitioned.take_routed(commit=True))
        if moves and n in (len(sent) // 3, len(sent) * 2 // 3):
            log.move(1, moves == "snapshots")
            log.move(0, moves == "snapshots")
    assert all(len(records) for records in log.logs)  # every partition had its share
    merged = Engine(config)
    merged.merge(partitioned.totals())
    for engine in log.engines + log.retired:
        merged.merge(engine)
    return merged, log


@pytest.mark.slow
@pytest.mark.parametrize(("stages", "moves", "cuped", "local"), [
    (2, "", False, ""), (3, "moves", False, ""), (5, "snapshots", False, ""), (3, "", True, ""),
    (4, "snapshots", True, ""), (3, "", False, "only"), (3, "snapshots", False, "also")])
def test_a_regroup_stage_of_several_partitions_gives_the_replay_numbers(tmp_path: Any, stages: int, moves: str,
                                                                        cuped: bool, local: str) -> None:
    """The regroup log in ``stages`` partitions, each with its share of the sessions, query buckets and A/B shards,
    the looks merged on partition 0: replay's numbers, the A/B rows bit for bit. ``moves``: partitions 0 and 1
    move to new engines mid-stream (from their checkpoints; with ``snapshots``, from snapshots taken then).
    ``cuped``: the units' pre-period histories live in the shards too, and the CUPED rows are replay's. ``local``:
    the looks also reach partition 0's merger at once, as in a process holding partition 0 (``only``: not through
    the log at all, so that the merger's rows are seen to come from the direct path; ``also``: both, the log's copy
    arriving after the merger folded the boundary, and again from the rebuilds)."""
    config, lines = _short_horizons(3000, 21, True, look_every=60.0, cuped=cuped)
    expected, _ = _replay(lines, tmp_path, config)
    merged, log = run_with_stages(lines, config, stages, moves, local)
    if local == "only":
        assert not any(isinstance(records.decode(value), records.LookReport) for value in log.logs[0])
    assert _comparable(merged.report()) == _comparable(expected.report())
    assert merged.ab() and merged.ab() == expected.ab()
    assert {row["treatment"] for row in expected.ab()} == {"treatment", "worse"}  # every treatment compared
    assert merged.srm() == expected.srm() and set(expected.srm()[0]["units"]) == {"control", "treatment", "worse"}
    assert merged.gsb_rows() == expected.gsb_rows()
    assert {(row["treatment"], row["source"]) for row in expected.gsb_rows()} >= {
        ("treatment", "metric"), ("worse", "metric"), (None, "judgment")}
    assert merged.overflow() == expected.overflow()
    if cuped:  # (the pre-period predicts: the variance falls, so the covariates reached the rows)
        assert all(row["cuped"] for row in expected.ab())
        assert max(row["variance_reduction"] for row in expected.ab() if row["metric"] == "MRR") > 0.05
    shards = [set(shard for e in engine.ledger.experiments.values() for shard in e) for engine in log.engines]
    assert all(shards) and not set.intersection(*shards)  # no partition holds all units


@pytest.mark.slow
def test_rows_between_boundaries_are_the_same_with_any_number_of_stage_partitions(tmp_path: Any) -> None:
    """Before a look boundary (``look_every`` longer than the log), the A/B rows show what was applied so far, a
    look not kept: partition 0 merges the shards' live looks the other partitions report. With 1 and 3 partitions
    fed alike, the rows mid-stream are the same, bit for bit; at the end they are replay's."""
    config, lines = _short_horizons(2000, 23, False, look_every=1e9)
    expected, _ = _replay(lines, tmp_path, config)
    sent, _ = _route(lines)
    runs = []
    now = [0.0]  # one clock for both runs (watermarks are announced every 0.2 s of it), 0.05 s per message
    for stages in (1, 3):
        host = Engine(config)
        partitioned = regrouping(host, clock=lambda: now[0], stages=stages)
        runs.append((partitioned, Stages(config, stages)))
    middle: list[Any] = []
    for n, (kind, partition, offset, value) in enumerate(sent):
        now[0] += 0.05
        for partitioned, log in runs:
            _feed(partitioned, kind, partition, [(offset, value)])
            log.write(partitioned.take_routed(commit=True))
            if n == len(sent) * 3 // 4:  # the rows partition 0 gives alone (as its worker exports them)
                middle.append((log.engines[0].ab(), log.engines[0].srm()))
    assert middle[0][0] and middle[0] == middle[1]
    assert middle[0][1][0]["units"]["control"] > 20  # (units of many shards, on every partition)
    for partitioned, log in runs:
        merged = Engine(config)
        merged.merge(partitioned.totals())
        for engine in log.engines:
            merged.merge(engine)
        assert merged.ab() == expected.ab() and merged.srm() == expected.srm()


def test_an_idle_partition_stops_holding_event_time_back() -> None:
    """A silent partition holds the watermark back only for idle_timeout seconds of wall clock (docs/contract.md §1)."""
    now = [0.0]
    config = Config(attribution_window=10.0, allowed_lateness=0.0)
    collect = Collect()
    engine = PartitionedEngine(Engine(config, collect), clock=lambda: now[0])
    for partition in (0, 1):
        engine.assign(partition)

    def send(partition: int, kind: str, offset: int, fields: dict[str, Any]) -> None:
        _feed(engine, kind, partition, [(offset, orjson.dumps({"type": kind, **fields}))])

    send(0, "ranking", 0, {"request_id": "a", "items": ["x", "y"], "ts": 100.0})
    send(0, "feedback", 0, {"request_id": "a", "item": "y", "ts": 101.0})
    send(1, "ranking", 0, {"request_id": "b", "items": ["x", "y"], "ts": 100.0})
    send(1, "feedback", 0, {"request_id": "b", "item": "x", "ts": 102.0})
    for offset, ts in enumerate((150.0, 200.0), 1):  # partition 0 moves on, partition 1 falls silent
        send(0, "ranking", offset, {"request_id": f"a{offset}", "items": ["x"], "ts": ts})
        send(0, "feedback", offset, {"request_id": f"a{offset}", "item": "x", "ts": ts})
    assert set(collect.records) == {"a", "a1"}  # partition 0 finalises on its own event time
    assert engine.watermark == 100.0  # the all-partition watermark waits for partition 1 (judgments never do)
    now[0] = config.idle_timeout + 1.0
    send(0, "feedback", 3, {"request_id": "a2", "item": "x", "ts": 200.5})
    engine.tick()
    assert engine.watermark == 200.5  # silent sources are ignored now: only partition 0's feedback spoke
    assert "b" in collect.records  # and partition 1's request is finalised by the others' event time
    assert collect.records["b"]["metrics"]["RR"] == 1.0
    send(1, "ranking", 1, {"request_id": "c", "items": ["x"], "ts": 90.0})  # partition 1 speaks again
    assert engine.watermark == 200.5  # (event time never goes back)


def test_a_partition_that_ended_before_its_checkpoint_holds_no_event_time_back_after_a_move() -> None:
    """A new owner of a partition whose topics had ended (end watermarks read, everything finalised) holds the
    all-partition event time back no more than its last owner did: not for idle_timeout until an event comes."""
    now = [0.0]
    config = Config(attribution_window=10.0, allowed_lateness=0.0)
    first = PartitionedEngine(Engine(config, Collect()), clock=lambda: now[0])
    for partition in (0, 1):
        first.assign(partition)
    end = b'{"type": "watermark", "end": true}'
    for partition in (0, 1):
        _feed(first, "ranking", partition, [(0, orjson.dumps({"type": "ranking", "request_id": f"r{partition}",
                                                                  "items": ["x", "y"], "ts": 100.0})), (1, end)])
        _feed(first, "feedback", partition, [(0, orjson.dumps({"type": "feedback", "request_id": f"r{partition}",
                                                                   "item": "y", "ts": 101.0})), (1, end)])
    assert first.watermark == math.inf
    moved = [Checkpoint.from_json(orjson.loads(orjson.dumps(first.checkpoint(p).to_json()))) for p in (0, 1)]
    now[0] += 1.0
    collect = Collect()
    second = PartitionedEngine(Engine(config, collect), clock=lambda: now[0])
    for checkpoint in moved:
        second.assign(checkpoint.partition, checkpoint)
    second.tick()
    assert second.watermark == math.inf  # (was -inf until idle_timeout: the restored sources had not ended)
    # an event after the end marker opens the partition again, as on its first owner
    _feed(second, "ranking", 1, [(2, orjson.dumps({"type": "ranking", "request_id": "late", "items": ["x"],
                                                   "ts": 300.0}))])
    assert "late" not in collect.records  # held open: partition 1 has not ended any more
    _feed(second, "ranking", 1, [(3, end)])
    _feed(second, "feedback", 1, [(2, end)])
    assert "late" in collect.records


@pytest.mark.parametrize("silence", [True, False])
def test_a_broker_outage_is_no_silence(silence: bool) -> None:
    """A worker counts a source's silence on :class:`SilenceClock`: an outage of the broker (or a stop of the
    process) longer than ``idle_timeout`` leaves no source idle, so feedback read again before its rankings waits
    for them instead of becoming an orphan. With the plain clock (``silence=False``) it would (the bug this fixes)."""
    now = [0.0]
    health = BrokerHealth("w", logging.getLogger("test.silence"), clock=lambda: now[0])
    clock = SilenceClock(health, clock=lambda: now[0]) if silence else (lambda: now[0])
    config = Config(attribution_window=10.0, allowed_lateness=0.0)
    collect = Collect()
    engine = PartitionedEngine(Engine(config, collect), clock=clock)
    engine.assign(0)
    health.answered()

    def send(kind: str, offset: int, fields: dict[str, Any]) -> None:
        _feed(engine, kind, 0, [(offset, orjson.dumps({"type": kind, **fields}))])
        engine.tick()

    send("ranking", 0, {"request_id": "a", "items": ["x", "y"], "ts": 100.0})
    send("feedback", 0, {"request_id": "a", "item": "y", "ts": 101.0})
    now[0] += 0.5
    health.failed("fetch", "frozen")
    for _ in range(60):  # the broker frozen for 60 s (idle_timeout: 30 s), the loop ticking
        now[0] += 1.0
        engine.tick()
    health.answered()
    now[0] += 0.1
    send("feedback", 1, {"request_id": "b", "item": "x", "ts": 150.0})  # feedback is read again first
    send("feedback", 2, {"request_id": "d", "item": "x", "ts": 170.0})
    send("ranking", 1, {"request_id": "b", "items": ["x"], "ts": 149.0})
    send("ranking", 2, {"request_id": "d", "items": ["x"], "ts": 165.0})
    send("ranking", 3, {"request_id": "c", "items": ["x"], "ts": 200.0})
    send("feedback", 3, {"request_id": "c", "item": "x", "ts": 200.0})
    counts = engine.totals().counts
    assert counts["feedback", "orphan"] == (0 if silence else 1)
    assert ("b" in collect.records and collect.records["b"]["metrics"]["RR"] == 1.0) == silence


def test_the_silence_clock_stands_while_the_broker_is_down_or_the_process_stopped() -> None:
    now = [10.0]
    health = BrokerHealth("w", logging.getLogger("test.silence"), clock=lambda: now[0])
    silence = SilenceClock(health, clock=lambda: now[0], max_step=1.0)
    now[0] += 5.0
    assert silence() == 10.0  # nothing answered yet
    health.answered()
    for _ in range(8):
        now[0] += 0.5
        silence()
    assert silence() == 14.0
    health.failed("fetch", "down")
    now[0] += 60.0
    assert silence() == 14.0
    health.answered()
    now[0] += 0.25
    assert silence() == 14.25
    now[0] += 100.0  # SIGSTOP, or a call blocked for 100 s: one step counts max_step
    assert silence() == 15.25


def _one_user_log(ts_field: str, requests: int = 20) -> list[bytes]:
    """One session id (a user) with a request every 100 s: each request starts a new session (gap 5 s)."""
    horizon = 10.0

    def part(t: float) -> bytes:
        time = {"t": t} if ts_field == "t" else {"d": t + horizon}
        return orjson.dumps({"k": "s", "id": "u1", "e": "x", "a": "A", **time, "s": [1.0, 0.5], "r": [1]})

    log: list[bytes] = []
    for i in range(requests):
        log += [part(100.0 * i), orjson.dumps({"k": "w", "u": 0, "t": 100.0 * i + 11})]
    return log


def test_a_reused_session_id_does_not_hold_the_stage_checkpoint_back() -> None:
    """The stage's checkpoint starts at the first part of the sessions still open, not at the first session
    that ever had the same id (a rebuild would re-read the whole log)."""
    config = Config(attribution_window=10.0, allowed_lateness=0.0, session_gap=5.0)
    engine = Engine(config)
    stage = SessionStage(engine, 1)
    log = _one_user_log("t")
    stage.feed(list(range(len(log))), log)
    assert engine.overall().sessions == 19  # every earlier session closed (and has both classes)
    assert stage._first_needed() == 38  # sessions need only the open session's only part
    # but the A/B units are cumulative since the experiment's first event: a new owner rebuilds from the start
    assert engine.ledger.experiments and stage.checkpoint().start == 0


@pytest.mark.parametrize("requests", [66, 300])
def test_a_checkpoint_after_many_sessions_closed_needs_only_the_open_ones(requests: int) -> None:
    """Past a few dozen closed sessions the stage filters its heap of needed offsets in one pass rather than
    popping each: the first offset needed is still the open session's, and the closed ones are gone."""
    config = Config(attribution_window=10.0, allowed_lateness=0.0, session_gap=5.0)
    engine = Engine(config)
    stage = SessionStage(engine, 1)
    log = _one_user_log("t", requests)
    stage.feed(list(range(len(log))), log)
    assert engine.overall().sessions == requests - 1
    assert stage._first_needed() == 2 * (requests - 1)
    assert len(stage._needed) == 1 and stage._first_needed() == 2 * (requests - 1)


def test_the_stage_reads_session_parts_written_before_they_carried_ts() -> None:
    """Parts logged by an older worker carry the finalisation point (``d``), not the serve time (``t``)."""
    config = Config(attribution_window=10.0, allowed_lateness=0.0, session_gap=5.0)
    results = []
    for field in ("t", "d"):
        engine = Engine(config)
        stage = SessionStage(engine, 1)
        log = _one_user_log(field)
        stage.feed(list(range(len(log))), log)
        stage.feed([len(log)], [orjson.dumps({"k": "w", "u": 0, "t": "inf"})])
        results.append(engine.report())
    assert results[0] == results[1] and results[0]["overall"]["sessions"] == 20


def _as_numbers(value: bytes) -> tuple[bytes, bool]:
    """A regroup record as workers wrote it before the flat columns (2026-11-28): a session part's scores and a
    request's values as JSON numbers (NaN: null); whether it changed."""
    record = records.decode(value)
    if isinstance(record, records.SessionParts) and record.flat_scores is not None:
        parts = Parts.of_record(record, 0.0)
        scores, relevant = starts_of(parts.sizes).tolist(), starts_of(parts.relevant_sizes).tolist()
        record = msgspec.structs.replace(  # (and the relevant positions as a list per part, as until 2026-12-07)
            record, flat_scores=None, sizes=None, flat_relevant=None, relevant_sizes=None,
            scores=[parts.scores[a:b].tolist() for a, b in zip(scores, scores[1:], strict=False)],
            relevant=[parts.relevant[a:b].tolist() for a, b in zip(relevant, relevant[1:], strict=False)])
    elif isinstance(record, records.UnitRequests) and record.flat_values is not None:
        rows = record.value_rows().tolist()
        record = msgspec.structs.replace(record, flat_values=None,
                                         values=[[None if v != v else v for v in row] for row in rows])
    else:
        return value, False
    return records.encode(record), True


def test_the_stage_reads_scores_and_values_written_as_numbers(tmp_path: Any) -> None:
    """Session parts and A/B unit contributions go through the regroup log as flat float64 columns; a log of the
    workers before them (the same columns as JSON numbers) gives the stage the same sessions, GSB and A/B units,
    bit for bit, and both replay's."""
    config, lines = _short_horizons(1500, 5, False)
    expected, _ = _replay(lines, tmp_path, config)
    sent, _ = _route(lines)
    first = Engine(config)
    partitioned = regrouping(first)
    log: list[bytes] = []
    for kind, partition, offset, value in sent:
        _feed(partitioned, kind, partition, [(offset, value)])
        log += [value for _, value in partitioned.take_regrouped(commit=True)]
    rewritten = [_as_numbers(value) for value in log]
    assert sum(changed for _, changed in rewritten) >= 2  # (both kinds of records were there)
    reports = []
    for values in (log, [value for value, _ in rewritten]):
        engine = Engine(config)
        stage = SessionStage(engine, PARTITIONS)
        stage.feed(list(range(len(values))), values)
        merged = Engine(config)
        merged.merge(partitioned.totals())
        merged.merge(engine)
        reports.append((_comparable(merged.report()), merged.ab(), merged.gsb_rows()))
    assert reports[0] == reports[1]
    assert reports[0][0] == _comparable(expected.report()) and reports[0][1] == expected.ab() and reports[0][1]



def _windows_fed(log: Log, sent: list[tuple[str, int, int, bytes]] | None) -> dict[Any, tuple[float, float]]:
    """The rolling windows summed over the partitions' shares (as /metrics sums them) after feeding every message,
    one message a fetch in send order (``sent``), or each topic-partition in one fetch to its end (``log``)."""
    engine = PartitionedEngine(Engine(Config()))
    RollingWindows(engine.engine)
    for partition in range(PARTITIONS):
        engine.assign(partition)
    if sent is None:
        for (kind, partition), batch in sorted(log.items()):
            _feed(engine, kind, partition, batch)
    else:
        for kind, partition, offset, value in sent:
            _feed(engine, kind, partition, [(offset, value)])
    assert engine.watermark == math.inf
    out: dict[Any, tuple[float, float]] = {}
    for _, unit in engine.engines():
        assert unit.engine.windows is not None
        for key, (total, count) in unit.engine.windows.snapshot().items():
            before = out.get(key, (0.0, 0.0))
            out[key] = (before[0] + total, before[1] + count)
    return out


@pytest.mark.slow
def test_a_log_read_at_once_to_its_end_leaves_the_windows_of_one_read_message_by_message() -> None:
    """A worker started after the whole log was produced reads every partition to its end marker before event
    time could move: the all-partition watermark goes from -inf to +inf in one tick. Its windows must still stand
    at the event time the log reached, as those of a worker that read the log as it was produced (they were
    empty: no finite watermark had ever placed them). The log spans less than an hour, so that its 1 h windows
    hold every request whichever finite watermark ends the run."""
    sent, log = _route(_lines(600, seed=5))
    expected = {key: value for key, value in _windows_fed(log, sent).items() if key[3] == "1h"}
    assert any(count for (_, _, metric, _), (_, count) in expected.items() if metric == "MRR")
    got = _windows_fed(log, None)
    assert approx({key: got.get(key) for key in expected}) == approx(expected)


@pytest.mark.parametrize("batch", [7, 300])
def test_the_first_offsets_kept_are_those_of_every_request_id_decoded(monkeypatch: pytest.MonkeyPatch,
                                                                       batch: int) -> None:
    """A partition keeps the offset of each request's first event (what a checkpoint's start comes from), decoding
    only the feedback ids that can be a request's first, once a fetch, and looking rankings up by their bytes; what
    it keeps is what the rule gives applied to the id of every ranking and feedback, decoded (the code before
    2026-11-28, here), fetch by fetch (``batch`` messages: a request's feedback several times in one, or not),
    both ways of decoding."""
    from stream_eval.engine import partitions
    from stream_eval.events.schema import Chunk, Feedback

    def every_id(self: Any, offsets: Any, events: Any, join: Any) -> None:
        if isinstance(events, Chunk):
            kept = [(at, event) for at, event in zip(events.events_at.tolist(), events.events, strict=True)
                    if type(event) in partitions._RANKINGS or type(event) is Feedback]
            columns = events.feedback
            text = columns.text.tobytes() if len(columns) else b""
            places = [at for at, _ in kept] + events.feedback_at.tolist()
            rids = [event.request_id for _, event in kept] + [
                text[a:b].decode() for a, b in zip(columns.rid_start.tolist(), columns.rid_end.tolist(), strict=True)]
            is_feedback = [type(event) is Feedback for _, event in kept] + [True] * len(columns)
            order = sorted(range(len(places)), key=places.__getitem__)
            picked = [offsets[places[k]] for k in order]
            rids, is_feedback = [rids[k] for k in order], [is_feedback[k] for k in order]
        else:
            chosen = [(offset, event) for offset, event in zip(offsets, events, strict=True)
                      if type(event) in partitions._RANKINGS or type(event) is Feedback]
            picked, rids = [offset for offset, _ in chosen], [event.request_id for _, event in chosen]
            is_feedback = [type(event) is Feedback for _, event in chosen]
        if not picked:
            return
        held, fed, waiting = join.status(rids)
        first = np.where(np.array(is_feedback, dtype=np.bool_), ~(waiting | fed), ~held)
        new: set[str] = set()
        for k in np.flatnonzero(first).tolist():
            if rids[k] not in new:
                new.add(rids[k])
                self.offsets.append(picked[k])
                self.ids.append(rids[k])

    config, lines = _short_horizons(800, 11, False)
    kept = []
    for add in (None, every_id):
        if add is not None:
            monkeypatch.setattr(partitions.Requests, "add", add)
        engine = run_partitioned(lines, config, Collect(), batch=batch)
        kept.append({(partition, kind): (list(requests.offsets), requests.ids)
                     for partition, task in engine.tasks.items() for kind, requests in task.requests.items()})
    assert kept[0] == kept[1]
    assert sum(len(ids) for _, ids in kept[0].values()) > 800  # (rankings and feedback firsts of every partition)


@pytest.mark.parametrize(("fetch", "lag", "order"), [(7, 0, KINDS), (40, 3, KINDS), (40, 3, KINDS[::-1])],
                         ids=["rankings-first", "rankings-behind", "rankings-behind-re-read-last"])
def test_feedback_waiting_at_a_checkpoint_is_counted_once_by_the_next_owner(fetch: int, lag: int,
                                                                            order: tuple[str, ...]) -> None:
    """Short horizons, so that much feedback waits for a request already forgotten (an orphan to be), and the
    topics read in fetches of ``fetch`` messages, the rankings ``lag`` rounds behind: what waited depends on
    the order the topics were read in. A new owner re-reads the rankings first, so feedback that had waited
    found its request open and was applied, muted: it was never counted (up to 67 of 3,179 feedback short),
    and feedback that had been late waited again and was counted twice. The checkpoint now stores the feedback
    waiting, and the next owner's counts, moved at any point, are an uninterrupted run's, whichever topic it
    re-reads first (``order``: feedback re-read before its ranking still joins it, and its duplicates count)."""
    config = Config(attribution_window=5.0, allowed_lateness=1.0, session_gap=5.0)
    sent, log = route(list(simulate_lines(SimulationConfig(requests=400, seed=7, duplicate_fraction=0.05))))
    queues = {key: list(messages) for key, messages in log.items()}
    schedule: list[tuple[str, int, list[tuple[int, bytes]]]] = []
    for round_ in range(10**6):
        if not any(queues.values()):
            break
        for (kind, partition), queue in sorted(queues.items()):
            if queue and (kind != "ranking" or round_ >= lag):
                schedule.append((kind, partition, queue[:fetch]))
                del queue[:fetch]

    now = [0.0]

    def counts(cut: int | None) -> dict[str, int]:
        # (a partition whose rankings all came before the move is silent for its new owner: event time moves on
        # once its idle_timeout has passed, as in a worker)
        a, b = (PartitionedEngine(Engine(config), clock=lambda: now[0]) for _ in range(2))
        for partition in range(PARTITIONS):
            a.assign(partition)
        for kind, partition, batch in schedule[:cut]:
            feed(a, kind, partition, batch)
        if cut is None:
            now[0] += config.idle_timeout + 1
            a.tick()
            return a.totals().counts.summary()
        checkpoint = Checkpoint.from_json(orjson.loads(orjson.dumps(a.checkpoint(0).to_json())))
        a.drop(0)
        starts = b.assign(0, checkpoint)
        for kind in order:  # re-read
            again = [(o, v) for o, v in log.get((kind, 0), []) if starts.get(kind, 0) <= o < checkpoint.processed[kind]]
            for k in range(0, len(again), fetch):
                feed(b, kind, 0, again[k:k + fetch])
        for kind, partition, batch in schedule[cut:]:
            feed(b if partition == 0 else a, kind, partition, batch)
        now[0] += config.idle_timeout + 1
        a.tick()
        b.tick()
        return EventCounts(a.totals().counts + b.totals().counts).summary()

    whole = counts(None)
    assert whole["orphan"] > 0 and whole["late"] > 0 and whole["duplicate"] > 0
    for share in (0.45, 0.6, 0.75, 0.9):
        assert counts(int(len(schedule) * share)) == whole, share


@pytest.mark.slow
@pytest.mark.parametrize("moves", ["partition 1 into 0's process", "partition 0 into 1's process"])
def test_looks_given_at_once_never_overtake_those_partition_0_has_not_read(tmp_path: Any, moves: str) -> None:
    """Partition 0 reads its log 300 records behind (a backlog) when, at two thirds of the stream, partition 1 comes
    to the process that holds partition 0 (from a snapshot), or partition 0 to the one that holds partition 1 (from
    a snapshot, re-reading its log after it): from then on partition 1's looks also go to partition 0's merger at
    once. Its earlier looks, some not read by partition 0 yet, are in the log only; its progress must not reach the
    merger before them, or a boundary would be folded without them. Every look partition 0 folds is replay's."""
    config, lines = _short_horizons(3000, 21, True, look_every=5.0)
    folds: dict[float, Any] = {}

    def attach(engine: Engine) -> None:
        merger = engine.ledger.merger
        merger.on_look = lambda boundary: folds.__setitem__(boundary, merger.results())

    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(lines))
    expected = replay([str(path)], config, attach=attach)
    sent, _ = _route(lines)
    partitioned = regrouping(Engine(config), stages=2)
    log = Stages(config, 2, lag=300, live=False)
    for n, (kind, partition, offset, value) in enumerate(sent):
        _feed(partitioned, kind, partition, [(offset, value)])
        log.write(partitioned.take_routed(commit=True))
        if n == len(sent) * 2 // 3:
            assert log.fed[0] < len(log.logs[0])  # (partition 0 is behind)
            log.local = "also"
            log.move(1 if moves.startswith("partition 1") else 0, snapshot=True)
    log.catch_up(0)
    merged = Engine(config)
    merged.merge(partitioned.totals())
    for engine in log.engines + log.retired:
        merged.merge(engine)
    assert merged.ab() and merged.ab() == expected.ab()
    later = [boundary for boundary in log.folds if boundary in folds]
    assert len(later) >= 15  # (every look of the stream: 5 s of event time each)
    # (as text: the rows' floats exactly, and NaN equal to NaN)
    assert [repr(log.folds[boundary]) for boundary in later] == [repr(folds[boundary]) for boundary in later]


def test_stage_partitions_held_together_give_their_looks_to_partition_0_at_once() -> None:
    """A process holding stage partition 0 links its other stage partitions to 0's merger, and unlinks them when 0
    goes (their looks then travel through the log only); partition 0 reports to no one."""
    from stream_eval.engine.stages import StagePartitions

    config = Config(look_every=60.0)
    held = StagePartitions(lambda: Engine(config), PARTITIONS, count=3)
    held.take(2)
    assert held.held[2].stage.local is None  # (no partition 0 here yet)
    held.take(0)
    held.take(1)
    merger = held.held[0].engine.ledger.merger
    assert [held.held[q].stage.local for q in (0, 1, 2)] == [None, merger, merger]
    held.held[2].stage._report_progress(125.0)  # (a look at 120 reported: progress on the boundary)
    assert merger.progress_of[2] == 120.0 and len(held.take_reports(2)) == 1  # at once, and for the log too
    held.give_up(0)
    assert held.held[1].stage.local is None and held.held[2].stage.local is None


def test_a_live_look_given_at_once_is_not_replaced_by_an_older_one_from_the_log() -> None:
    """Partition 0's merger keeps a shard's newest live look: the log brings a look given at once again later, and
    after an older one."""
    from stream_eval.engine.ab import LookMerger, ShardLook

    merger = LookMerger(Config(look_every=60.0), ["MRR"], sources=2)
    older, newer = (ShardLook("exp1", 3, [], [], [], conflicts, 0) for conflicts in (1, 2))
    merger.add_live(70.0, [older])
    merger.add_live(90.0, [newer])  # (given at once)
    merger.add_live(70.0, [older])  # (the log's copy of the older one, read after)
    assert merger.live[("exp1", 3)] == (90.0, newer)


def test_partition_0_checkpoints_looks_reported_before_its_first_fold() -> None:
    """A partition 0 with no A/B units of its own that has folded nothing yet may hold another partition's looks,
    waiting for their boundary: its checkpoint must not skip the records that brought them, or a new owner would
    never fold them."""
    from stream_eval.engine.ab import ArmSums, ShardLook

    config = Config(look_every=60.0)
    first = Engine(config)
    look = ShardLook("exp1", 3, ["a"], [ArmSums.zeros(len(first.ledger.names))], [5], 0, 0)
    log = [records.encode(records.LookReport(stage=1, time="60", looks=[look.to_json()])),
           records.encode(records.LookProgress(stage=1, time="60"))]
    stage = SessionStage(first, PARTITIONS, stage=0, stages=2)
    stage.feed([0, 1], log)
    checkpoint = StageCheckpoint.from_json(orjson.loads(orjson.dumps(stage.checkpoint().to_json())))
    assert checkpoint.start == 0  # (no snapshot yet: re-read from the start)
    second = Engine(config)
    SessionStage(second, PARTITIONS, checkpoint, stage=0, stages=2).feed(list(range(checkpoint.start, 2)),
                                                                         log[checkpoint.start:])
    second.ledger.release(120.0)  # (partition 0's own progress: the look at 60 is folded)
    assert second.ledger.merger.looks == 1


def test_a_look_given_at_once_and_through_the_log_is_queued_once() -> None:
    """A shard's look at a boundary not folded yet, given twice (at once, then by the log), is held once: a
    partition 0 behind in its log does not keep every look twice."""
    from stream_eval.engine.ab import ArmSums, LookMerger, ShardLook

    config = Config(look_every=60.0)
    merger = LookMerger(config, ["MRR"], sources=2)
    look = ShardLook("exp1", 3, ["a"], [ArmSums.zeros(2)], [5], 0, 0)
    again = ShardLook("exp1", 3, ["a"], [ArmSums.zeros(2)], [5], 0, 0)
    merger.add(60.0, [look])
    merger.add(60.0, [again])
    merger.add(60.0, [ShardLook("exp1", 4, ["a"], [ArmSums.zeros(2)], [1], 0, 0)])
    (boundary, queued), = merger.state_to_json()["queue"]
    assert len(queued) == 2
