"""A worker killed with kill -9: the regroup log as a transaction log per input partition (engine/regroup.py).

Each input partition's engine writes its records through a ``RegroupSink(partition)``: numbered, followed by a
commit marker after each checkpoint of the partition. When its worker dies, the new owner restores the last
checkpoint and writes a rewind, then again what came after the checkpoint; the log holds both. The stage must
count every record once: the same report as the log without the crash, and as replay.

The partitions' records are made once, by engines fed the simulated events as the workers would (finalising on
the partition's own event time). A new owner, rebuilt from the checkpoint, writes what the dead one wrote after
it (the engines are deterministic: checked below), but not record for record (a new owner's sink announces the
arms again, it finalises in other batches): a crash is modelled by writing the records after the checkpoint
again, after one more (an arm announced again), so that they are numbered otherwise than the dead owner's.
"""

from __future__ import annotations

import functools
import math
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support import AbstractTimeConfig as Config
from test_partitions import PARTITIONS, _comparable, _replay, _route

from stream_eval.config import Config as ConfigType
from stream_eval.engine import snapshot
from stream_eval.engine.engine import Engine
from stream_eval.engine.regroup import RegroupSink, SessionStage, StageCheckpoint
from stream_eval.events.messages import decode_messages
from stream_eval.events.schema import Invalid, Watermark
from stream_eval.simulate import SimulationConfig, simulate_lines

JOINED = ("ranking", "feedback")


def _config(ab: bool = True) -> ConfigType:
    return Config(attribution_window=20.0, allowed_lateness=5.0, session_gap=20.0, gsb_window=30.0, ab=ab)


def _lines() -> list[bytes]:
    sim = SimulationConfig(requests=2500, seed=9, judgments=True, interleaving=True, label_rate=0.3,
                           duplicate_fraction=0.05, orphan_fraction=0.03, invalid_fraction=0.02, max_delay=15.0,
                           shuffle_window=3.0)
    return list(simulate_lines(sim))


# -- what each partition's owner writes ---------------------------------------------------------------------------
# One partition's writes, as operations: ("d", n, value) a data record; ("k", seq) a checkpoint of the partition
# stored (holding ``seq``; nothing in the log); ("c", seq, value) its commit marker, written with the next records.
Op = tuple[Any, ...]


class _Owner:
    """Partition ``p``'s engine as a worker drives it: event time is the minimum over its rankings and feedback
    sources; after each batch its finalisation watermark; every ``every`` batches a checkpoint and a commit."""

    def __init__(self, partition: int, config: ConfigType, every: int) -> None:
        self.partition, self.config, self.every = partition, config, every
        self.engine = Engine(config)
        self.sink = self.engine.regroup = RegroupSink(partition)
        self.sink.begin(f"{partition}-0", 0)
        (_, self.rewind), = self.sink.take()
        self.join = self.engine.new_join()
        self.marks = dict.fromkeys(JOINED, -math.inf)
        self.ended = dict.fromkeys(JOINED, False)
        self.flushed = False
        self.announced = -math.inf
        self.batches = 0
        self.ops: list[Op] = []

    def feed(self, kind: str, offsets: list[int], values: list[bytes]) -> None:
        events = decode_messages(values, kind, self.config, [0.0] * len(values),
                                 [f"{kind}/{self.partition}@{o}" for o in offsets])
        for event in events:
            if kind not in JOINED or type(event) is Invalid:
                continue
            if type(event) is Watermark and event.end:
                self.ended[kind] = True
            else:
                self.ended[kind] = self.ended[kind] and type(event) is Watermark
                self.marks[kind] = max(self.marks[kind], event.ts)
        engine = self.engine
        engine.process([e for e in events if type(e) is not Watermark], self.join, event_time=False)
        target = min(math.inf if self.ended[k] else self.marks[k] for k in JOINED)
        if target == math.inf:
            if not self.flushed:
                engine.flush(self.join)
                self.flushed = True
        elif target > self.join.watermark:
            engine.advance(target, self.join)
        finalised = math.inf if self.flushed else self.join.watermark
        if finalised > self.announced:
            self.announced = finalised
            self.sink.watermark(self.partition, finalised)
        self._take()
        self.batches += 1
        if self.batches % self.every == 0:
            self.checkpoint()

    def checkpoint(self) -> None:
        if not self.ops or self.ops[-1][0] == "c":
            return  # nothing since the last one
        seq = self.sink.seq  # stored in the partition's checkpoint once everything taken is written
        self.ops.append(("k", seq))
        self.sink.commit(seq)  # after the checkpoint is stored: written with the next records
        self._take()

    def _take(self) -> None:
        for _, value in self.sink.take():
            record = msgspec.msgpack.decode(value)
            assert record["P"] == self.partition
            self.ops.append(("c" if record["k"] == "c" else "d", record["n"], value))


@dataclass
class Written:
    """The partitions' engines, what their owners write and in which order (partition, operation); the oracle:
    replay's engine."""

    config: ConfigType
    engines: list[Engine]
    ops: list[list[Op]]
    rewinds: list[bytes]
    timeline: list[tuple[int, int]]
    expected: Engine


def _write(config: ConfigType, every: int) -> Written:
    sent, _ = _route(_lines())
    owners = [_Owner(p, config, every) for p in range(PARTITIONS)]
    timeline: list[tuple[int, int]] = []
    for kind, partition, offset, value in sent:  # one message a batch
        owner = owners[partition]
        before = len(owner.ops)
        owner.feed(kind, [offset], [value])
        timeline += [(partition, k) for k in range(before, len(owner.ops))]
    for owner in owners:  # (a checkpoint after the end)
        before = len(owner.ops)
        owner.checkpoint()
        timeline += [(owner.partition, k) for k in range(before, len(owner.ops))]
    return Written(config, [o.engine for o in owners], [o.ops for o in owners], [o.rewind for o in owners], timeline,
                   _expected(config.ab))


@functools.cache
def _expected(ab: bool) -> Engine:
    with tempfile.TemporaryDirectory() as directory:
        engine, _ = _replay(_lines(), Path(directory), _config(ab))
    return engine


@functools.cache
def _written(every: int, ab: bool = True) -> Written:
    return _write(_config(ab), every)


# -- logs ------------------------------------------------------------------------------------------------------------
def _owners_writes(partition: int, ops: list[Op], crashes: Sequence[int]) -> tuple[list[bytes], list[int]]:
    """Partition ``partition``'s records in the log when its owners die after executing ``ops[:crash]`` for each
    crash in turn (each new owner restores the last checkpoint stored and writes what follows it again); the last
    owner runs to the end. Also the checkpoints they restored (what they rewound to).

    A new owner's records need not be the dead one's (its sink announces the arms again; it finalises in other
    batches): here each new owner first announces the partition's first arm again, so the records it writes
    again are numbered one further than the dead owner's."""
    arm = next(record for record in (msgspec.msgpack.decode(op[2]) for op in ops if op[0] == "d")
               if record["k"] == "a")
    writes: list[bytes] = []
    restored: list[int] = []
    start, committed = 0, 0
    shift = stored_shift = 0  # numbers of this owner's records, of the restored checkpoint's records, less ops'
    owners = [*sorted(crashes), len(ops)]
    for incarnation, crash in enumerate(owners):
        run = ops[start : max(crash, start)]
        shift = stored_shift + (incarnation > 0)
        sink = RegroupSink(partition)  # (for its rewind and commits)
        token = f"{partition}-{incarnation}"
        sink.begin(token, committed)
        restored.append(committed)
        seq = committed
        if incarnation:
            seq += 1
            sink.records.append((0, b"", msgspec.msgpack.encode({**arm, "n": seq, "x": token})))
        for op in run:
            if op[0] == "d":
                seq = op[1] + shift
                sink.records.append((0, b"", msgspec.msgpack.encode({**msgspec.msgpack.decode(op[2]), "n": seq,
                                                                      "x": token})))
            elif op[0] == "c":
                sink.commit(op[1] + shift)
        if incarnation == len(owners) - 1 and (not run or run[-1][0] != "c"):
            sink.commit(seq)  # (the last owner's next checkpoint)
        writes += [value for _, value in sink.take()]
        stored = [k for k in range(start + len(run)) if ops[k][0] == "k"]
        if not stored:
            start, committed, stored_shift = 0, 0, 0
            continue
        # the next owner restores the last checkpoint stored (this owner's, or the one it restored itself), and
        # writes no commit of it
        if stored[-1] >= start:
            stored_shift = shift
        start, committed = stored[-1] + 1, ops[stored[-1]][1] + stored_shift
        if start < len(ops) and ops[start][:2] == ("c", ops[stored[-1]][1]):
            start += 1
    return writes, restored


def _interleave(streams: list[list[bytes]], rng: random.Random) -> list[bytes]:
    """The partitions' records in one log: each partition's in order, the partitions in a random order."""
    heads = [0] * len(streams)
    log: list[bytes] = []
    while True:
        left = [p for p, stream in enumerate(streams) if heads[p] < len(stream)]
        if not left:
            return log
        p = rng.choices(left, weights=[len(streams[q]) - heads[q] for q in left])[0]
        take = rng.randint(1, 30)
        log += streams[p][heads[p] : heads[p] + take]
        heads[p] += take


def _written_in_order(written: Written) -> list[bytes]:
    """The log without a crash, in the order the records were written."""
    return written.rewinds + [written.ops[p][k][2] for p, k in written.timeline if written.ops[p][k][0] != "k"]


def _without_partitions(log: list[bytes]) -> list[bytes]:
    """The same records as ``RegroupSink()`` writes them (no partition, no commit markers): the path of old logs."""
    out = []
    for value in log:
        record = msgspec.msgpack.decode(value)
        if record["k"] in ("c", "r"):
            continue
        del record["P"], record["n"]
        out.append(msgspec.msgpack.encode(record))
    return out


def _run(config: ConfigType, log: list[bytes], chunk: int = 64) -> Engine:
    engine = Engine(config)
    stage = SessionStage(engine, PARTITIONS)
    for a in range(0, len(log), chunk):
        stage.feed(range(a, min(a + chunk, len(log))), log[a : a + chunk])
    assert not any(held.records for held in stage._held.values())  # everything committed was applied
    return engine


#: The GSB sign tests' fields: from every verdict the stage has given since the start (engine/gsb.py).
_SIGN_TEST = ("p_value", "cs_lower", "cs_upper", "decision")


def _stage_report(engine: Engine, sign_tests: bool = True) -> dict[str, Any]:
    """What the stage counts (sessions in their groups, GSB, A/B units), comparable across orders of arrival.

    Without ``sign_tests``: not the GSB sign tests. A stage with no A/B units yet (or none: ``ab = false``) has
    no snapshot, and its checkpoint may start after the log's start: a new owner does not see the verdicts given
    before it, and its sign tests take fewer (as before records were numbered: the same without partitions)."""
    merged = Engine(engine.config)
    merged.merge(engine)
    report = merged.report()
    if not sign_tests:
        report["gsb"] = [{k: v for k, v in row.items() if k not in _SIGN_TEST} for row in report["gsb"]]
    return {"sections": _comparable(report), "gsb": report["gsb"], "ab": report["ab"], "srm": report["srm"],
            "sessions": merged.overall().sessions}


def _assert_as_replay(written: Written, stage_engine: Engine, sign_tests: bool = True) -> None:
    merged = Engine(written.config)
    for engine in written.engines:
        merged.merge(engine)
    merged.merge(stage_engine)
    expected = Engine(written.config)
    expected.merge(written.expected)
    assert _stage_report(merged, sign_tests) == _stage_report(expected, sign_tests)


# -- the sink ---------------------------------------------------------------------------------------------------------
def test_a_partitions_sink_numbers_its_records_and_writes_rewinds_and_commits() -> None:
    sink = RegroupSink(4)
    sink.begin("t1", 7)
    sink.judgment("exp", "good")
    sink.arm("exp", "a")
    sink.arm("exp", "a")  # announced once
    assert sink.seq == 9
    sink.commit(sink.seq)
    records = [msgspec.msgpack.decode(value) for _, value in sink.take()]
    assert records == [{"k": "r", "P": 4, "x": "t1", "n": 7},
                       {"k": "j", "e": "exp", "v": "good", "P": 4, "n": 8, "x": "t1"},
                       {"k": "a", "e": "exp", "a": "a", "P": 4, "n": 9, "x": "t1"},
                       {"k": "c", "P": 4, "x": "t1", "n": 9}]
    sink.begin("t2", 8)  # the partition again (another ownership): numbering from its checkpoint, arms anew
    sink.arm("exp", "a")
    assert [msgspec.msgpack.decode(value) for _, value in sink.take()] == [
        {"k": "r", "P": 4, "x": "t2", "n": 8}, {"k": "a", "e": "exp", "a": "a", "P": 4, "n": 9, "x": "t2"}]
    sink.judgment("exp", "bad")
    with pytest.raises(ValueError):
        sink.begin("t3", 0)  # not after records


def test_a_sink_of_no_partition_writes_records_as_before() -> None:
    sink = RegroupSink()
    sink.judgment("exp", "good")
    sink.watermark(0, math.inf)
    assert [msgspec.msgpack.decode(value) for _, value in sink.take()] == [{"k": "j", "e": "exp", "v": "good"},
                                                                          {"k": "w", "u": 0, "t": "inf"}]
    with pytest.raises(ValueError):
        sink.commit(0)
    with pytest.raises(ValueError):
        sink.begin("t", 0)


@pytest.mark.slow
def test_the_partitions_engines_are_deterministic() -> None:
    """The records a partition's engine writes depend on its events only: what a new owner writes again after
    the checkpoint is what the dead owner wrote (as modelled here, numbering aside)."""
    first, second = _written(7), _write(_config(), 7)
    assert first.ops == second.ops


# -- the protocol on a small log --------------------------------------------------------------------------------------
def _judgments(engine: Engine) -> tuple[int, int, int]:
    counts = engine.gsb.totals(engine.arms_of).get(("exp", "", "judgment"))
    return (0, 0, 0) if counts is None else (counts.good, counts.same, counts.bad)


def _j(partition: int, n: int, verdict: str = "good") -> bytes:
    return orjson.dumps({"k": "j", "e": "exp", "v": verdict, "P": partition, "n": n})


def _c(kind: str, partition: int, token: str, n: int) -> bytes:
    return orjson.dumps({"k": kind, "P": partition, "x": token, "n": n})


def test_records_count_when_committed_and_a_rewind_discards_what_is_written_again() -> None:
    engine = Engine(_config())
    stage = SessionStage(engine, 2)
    log = [_c("r", 0, "a", 0), _j(0, 1), _j(0, 2), _j(1, 1, "bad")]
    stage.feed(range(4), log)
    assert _judgments(engine) == (0, 0, 0)  # nothing committed
    stage.feed([4, 5], [_c("c", 0, "a", 1), _c("c", 1, "z", 1)])  # partition 1: its first token seen is adopted
    assert _judgments(engine) == (1, 0, 1)
    # partition 0's owner dies after writing record 3; its last checkpoint holds 2 (never committed): the new owner
    # rewinds to 2, which applies record 2, and writes record 3 again; a late commit of the dead owner is ignored
    stage.feed(range(6, 11), [_j(0, 3, "same"), _c("r", 0, "b", 2), _c("c", 0, "a", 3), _j(0, 3, "bad"),
                              _c("c", 0, "b", 3)])
    assert _judgments(engine) == (2, 0, 2)
    # delivered again (a producer's retry): counted once
    stage.feed(range(11, 14), [_j(0, 3, "bad"), _j(0, 4), _c("c", 0, "b", 4)])
    assert _judgments(engine) == (3, 0, 2)
    # (the verdicts kept for the sign tests are cumulative: a stage without a snapshot restarts from the log's start)
    assert (stage.checkpoint().start, stage.checkpoint().processed) == (0, 14)


def _jx(partition: int, n: int, token: str, verdict: str = "good") -> bytes:
    return orjson.dumps({"k": "j", "e": "exp", "v": verdict, "P": partition, "n": n, "x": token})


def test_records_of_a_replaced_owner_still_writing_count_nothing() -> None:
    """Owner ``a`` of partition 0 is replaced by ``b`` (from ``a``'s checkpoint at record 1) but goes on writing
    (stalled past its session, it has not noticed yet): its records after ``b``'s rewind, numbered like ``b``'s,
    and its commit, are ignored; ``b``'s count once."""
    engine = Engine(_config())
    stage = SessionStage(engine, 1)
    log = [_c("r", 0, "a", 0), _jx(0, 1, "a"), _c("c", 0, "a", 1), _jx(0, 2, "a", "bad"), _c("r", 0, "b", 1),
           _jx(0, 2, "a", "bad"), _jx(0, 3, "a", "bad"), _jx(0, 2, "b", "same"), _c("c", 0, "a", 3),
           _jx(0, 3, "b", "same"), _c("c", 0, "b", 3)]
    stage.feed(range(len(log)), log)
    assert _judgments(engine) == (1, 2, 0)


def test_a_record_counts_where_its_commit_is_and_the_checkpoint_keeps_them_together() -> None:
    """A record written before the stage's checkpoint and committed after it is re-read and counted by the new
    owner; the checkpoint starts at the first record still held, or applied by a commit after its start."""
    config = _config()
    engine = Engine(config)
    stage = SessionStage(engine, 2)
    log = [_c("r", 0, "a", 0), _c("r", 1, "z", 0), _j(0, 1), _j(1, 1, "bad"), _c("c", 1, "z", 1)]
    stage.feed(range(len(log)), log)
    # (a snapshot of the verdicts kept for the sign tests: without one, a checkpoint starts at the log's start)
    data = snapshot.take(engine)
    stage.snapshot_taken((0, 1), stage.next_offset)
    checkpoint = stage.checkpoint()
    assert (checkpoint.start, checkpoint.processed) == (2, 5)  # record 1 of partition 0 is still held
    rebuilt = Engine(config)
    second = SessionStage(rebuilt, 2, StageCheckpoint.from_json(orjson.loads(orjson.dumps(checkpoint.to_json()))),
                          data)
    log += [_c("c", 0, "a", 1)]
    second.feed(range(checkpoint.start, len(log)), log[checkpoint.start :])
    assert _judgments(engine) == (0, 0, 1) and _judgments(rebuilt) == (1, 0, 0)  # each counted once
    # every record applied, nothing held: a rebuild starts where the snapshot's does
    assert (second.checkpoint().start, second.checkpoint().processed) == (checkpoint.start, len(log))
    # a start that would fall between a record (offset 2) and its commit (offset 5) moves down to the record
    third = SessionStage(Engine(config), 2)
    third.feed(range(len(log)), log)
    assert third._settled(4) == 2 and third._settled(6) == 6


# -- the partitions' engines and the stage ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("every", [1, 40])
def test_committed_records_give_the_replay_numbers(every: int) -> None:
    """No crash: commit markers after every batch (or every 40 batches); the records in the order written, or
    interleaved otherwise; the same report as replay and as the records fed without partitions (old logs)."""
    written = _written(every)
    log = _written_in_order(written)
    engine = _run(written.config, log)
    _assert_as_replay(written, engine)
    old = _run(written.config, _without_partitions(log))
    assert _stage_report(engine) == _stage_report(old)
    other = _run(written.config, _interleave([_owners_writes(p, ops, [])[0] for p, ops in enumerate(written.ops)],
                                             random.Random(every)))
    assert _stage_report(other) == _stage_report(engine)


def _crash_log(written: Written, crashes: list[list[int]], seed: int) -> tuple[list[bytes], list[list[int]]]:
    writes = [_owners_writes(p, ops, crashes[p]) for p, ops in enumerate(written.ops)]
    return _interleave([w for w, _ in writes], random.Random(seed)), [r for _, r in writes]


def _positions(written: Written, partition: int, kind: str) -> list[int]:
    return [k for k, op in enumerate(written.ops[partition]) if op[0] == kind]


@pytest.mark.slow
def test_crashes_before_a_commit_and_right_after_a_checkpoint_count_nothing_twice() -> None:
    written = _written(40)
    baseline = _stage_report(_run(written.config, _written_in_order(written)))
    ops = written.ops
    first_checkpoint = _positions(written, 0, "k")[0]
    commit = _positions(written, 1, "c")[len(_positions(written, 1, "c")) // 2]
    checkpoint = _positions(written, 2, "k")[len(_positions(written, 2, "k")) // 3]
    crashes = [
        [first_checkpoint],  # partition 0: after records, before its first checkpoint (the new owner rewinds to 0)
        [commit + 1],  # partition 1: right after a checkpoint and its commit (nothing held)
        [checkpoint + 1, checkpoint + 100],  # 2: a checkpoint stored, its commit not written; its new owner dies too
    ]
    assert first_checkpoint > 0 and ops[2][checkpoint + 1][0] == "c"
    log, restored = _crash_log(written, crashes, seed=1)
    assert restored == [[0, 0], [0, ops[1][commit][1]], [0, ops[2][checkpoint][1], restored[2][2]]]
    assert restored[2][2] > ops[2][checkpoint][1]
    assert len(log) > len(_written_in_order(written)) + 20  # records written twice
    engine = _run(written.config, log)
    assert _stage_report(engine) == baseline
    _assert_as_replay(written, engine)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 7, 40]), st.lists(st.lists(st.floats(0.0, 1.0), max_size=3), min_size=PARTITIONS,
                                            max_size=PARTITIONS), st.integers(0, 2**32))
@example(7, [[0.0], [1.0], []], 0)  # a crash at once (nothing written but the rewind), one after the last commit
@example(40, [[0.5, 0.5, 0.6], [0.3], [0.9]], 1)  # an owner dies before storing a checkpoint of its own
def test_crashes_at_random_points_give_the_report_without_crash(every: int, crashes: list[list[float]],
                                                                seed: int) -> None:
    written = _written(every)
    baseline = _stage_report(_run(written.config, _written_in_order(written)))
    points = [[int(f * len(written.ops[p])) for f in fractions] for p, fractions in enumerate(crashes)]
    log, _ = _crash_log(written, points, seed)
    assert _stage_report(_run(written.config, log)) == baseline


# -- the stage's own owner restarts ----------------------------------------------------------------------------------
@dataclass
class Handovers:
    checkpoints: list[StageCheckpoint] = field(default_factory=list)
    held: int = 0  # handovers while records were held, waiting for their commit
    settled: int = 0  # checkpoints moved down to a record applied by a commit after the records needed


def _with_handovers(config: ConfigType, log: list[bytes], handovers: Sequence[int], snapshots: Sequence[int],
                    chunk: int = 50) -> tuple[Engine, Handovers]:
    """The stage fed ``log`` in chunks; at each of ``handovers`` (chunk numbers) it moves to a new engine from its
    checkpoint (and the latest snapshot, taken at the chunk numbers ``snapshots``); all the engines merged."""
    engines: list[Engine] = []
    engine = Engine(config)
    stage = SessionStage(engine, PARTITIONS)
    stored: dict[tuple[int, int], bytes] = {}
    seen = Handovers()
    chunks = range(0, len(log), chunk)
    for k, a in enumerate(chunks):
        b = min(a + chunk, len(log))
        stage.feed(range(a, b), log[a:b])
        if k in snapshots:
            where = (len(stored), 1)
            stored[where] = snapshot.take(engine)
            stage.snapshot_taken(where, stage.next_offset)
        if k in handovers:
            needed = stage._first_needed()
            needed = b if needed is None else min(needed, b)
            seen.settled += stage._settled(needed) < needed
            seen.held += any(held.records for held in stage._held.values())
            checkpoint = StageCheckpoint.from_json(orjson.loads(orjson.dumps(stage.checkpoint().to_json())))
            seen.checkpoints.append(checkpoint)
            engine.drop_regrouped()
            engines.append(engine)
            engine = Engine(config)
            data = None if checkpoint.snapshot is None else stored[checkpoint.snapshot]
            stage = SessionStage(engine, PARTITIONS, checkpoint, data)
            stage.feed(range(checkpoint.start, b), log[checkpoint.start : b])
    engines.append(engine)
    merged = Engine(config)
    for e in engines:
        merged.merge(e)
    return merged, seen


def _sign_tests_kept(seen: Handovers) -> bool:
    """Whether every new owner had the verdicts kept for the sign tests: rebuilt from the log's start or from a
    snapshot (see :func:`_stage_report`)."""
    return all(c.start == 0 or c.snapshot is not None for c in seen.checkpoints)


_MODES = {"from-the-start": (True, False), "from-a-snapshot": (True, True), "without-ab": (False, False)}


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(_MODES))
def test_the_stage_moves_while_commits_are_pending(mode: str) -> None:
    """Records committed long after they were written (40 batches) and crashes of partition writers; the stage
    moves to another engine five times: the report of one stage without a move."""
    ab, snapshots = _MODES[mode]
    written = _written(40, ab)
    log, _ = _crash_log(written, [[len(written.ops[0]) // 3], [], [len(written.ops[2]) // 2]], seed=3)
    baseline = _run(written.config, log)
    chunks = math.ceil(len(log) / 50)
    handovers = [chunks * k // 6 for k in range(1, 6)]
    merged, seen = _with_handovers(written.config, log, handovers, [chunks // 7, chunks // 3] if snapshots else [])
    assert _sign_tests_kept(seen)  # (with or without A/B: until a snapshot, rebuilt from the log's start)
    assert _stage_report(merged, sign_tests=True) == _stage_report(baseline, sign_tests=True)
    assert seen.held == len(handovers)  # each time, records written before were still waiting for their commit
    starts = [c.start for c in seen.checkpoints]
    if not snapshots:
        assert starts == [0] * len(handovers)  # the A/B units and sign-test verdicts: rebuilt from the log's start
    else:
        assert all(0 < c.start < c.processed for c in seen.checkpoints)
        assert seen.settled  # some checkpoint started at a record whose commit came after the records needed
    _assert_as_replay(written, merged, sign_tests=True)


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(_MODES)), st.sampled_from([1, 40]),
       st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4), st.lists(st.floats(0.0, 1.0), max_size=3),
       st.lists(st.lists(st.floats(0.0, 1.0), max_size=2), min_size=PARTITIONS, max_size=PARTITIONS),
       st.integers(0, 2**32))
@example("from-the-start", 40, [0.0], [], [[], [], []], 0)  # (before the first A/B unit: no sign tests)
def test_the_stage_moves_at_random_points(mode: str, every: int, handovers: list[float], snapshots: list[float],
                                          crashes: list[list[float]], seed: int) -> None:
    ab, with_snapshots = _MODES[mode]
    written = _written(every, ab)
    points = [[int(f * len(written.ops[p])) for f in fractions] for p, fractions in enumerate(crashes)]
    log, _ = _crash_log(written, points, seed)
    baseline = _run(written.config, _written_in_order(written))
    chunks = math.ceil(len(log) / 50)
    merged, seen = _with_handovers(written.config, log, [int(f * chunks) for f in handovers],
                                   [int(f * chunks) for f in snapshots] if with_snapshots else [])
    kept = _sign_tests_kept(seen)  # (a handover before the first verdict may start later)
    assert _stage_report(merged, sign_tests=kept) == _stage_report(baseline, sign_tests=kept)

