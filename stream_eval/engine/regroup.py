"""Sessions and per-query GSB across workers: finalised requests regrouped through one ordered log.

A session's requests (and a query's requests, for GSB source ``metric``) can sit in input partitions owned by
different workers. So, when streaming, each worker hands the part of a finalised request that needs
regrouping to a :class:`RegroupSink` instead of keeping it: the served items' scores and relevance of a
request of a *named* session, the request's ``gsb_metric`` value for its query, the arms it has seen. The
worker writes these records, followed by the finalisation watermark of each input partition it owns, to one
ordered log (a one-partition topic). The worker that owns that log runs the :class:`SessionStage`: it adds the
parts to the engine's :class:`~stream_eval.engine.sessions.Sessions` and GSB tallies — the same objects and
functions replay uses — and closes them on the minimum of the partitions' finalisation watermarks, which is
when every request of a session or query bucket that closes has been finalised and its record written.

The stage is recoverable the same way as an input partition (``engine/partitions.py``): its checkpoint holds
the offset of the first record that an open session or query bucket still needs, the offset after the last
record counted, the partitions' watermarks and the arms seen; a new owner re-reads muted up to there.

An input partition's records are a transaction log with commit markers, so that a worker killed between two
checkpoints of a partition counts nothing twice (the records are the typed structs of ``engine/records.py``).
The partition's sink (``RegroupSink(p)``) numbers its data records (``partition`` p, ``seq`` 1, 2, ...) and marks
them with its ownership (``owner``): the stage drops the data records and commits of an ownership that a later
rewind replaced (a worker still writing after its partition moved). Each owner of the partition first writes a
:class:`~stream_eval.engine.records.Rewind` (its ``owner``; ``seq`` s, the number of the last record its restored
checkpoint covers, 0 without one); after storing a checkpoint holding :attr:`RegroupSink.seq`, the worker writes a
:class:`~stream_eval.engine.records.Commit` of that number. The stage holds the partition's data records until a
commit of its current ownership applies those numbered up to it, or a rewind applies those up to s (the checkpoint
covers them) and discards the rest: the new owner writes them again, as it re-finalises what came after its
checkpoint. A record takes effect where its commit or rewind is (what a rebuild mutes or finds in a snapshot); the
stage's checkpoint starts no later than the first record still held, nor between a record and the commit that
applied it. Records of no partition (``RegroupSink()``; logs of workers before numbered records) take effect at once.

Session parts and query metrics are written as columns (:class:`~stream_eval.engine.records.SessionParts`,
:class:`~stream_eval.engine.records.QueryMetrics`), one record per many finalised requests, just before the next
record of another kind: their order against watermarks, commits and other records is the order they were given in.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import numpy.typing as npt

from stream_eval.engine import records
from stream_eval.engine.ab import LookMerger, ShardLook, look_from_json, shard_of, shards_of
from stream_eval.engine.parts import Parts
from stream_eval.engine.segment_ab import SegmentLook
from stream_eval.engine.sessions import Impressions, SessionKey, SessionRequests
from stream_eval.engine.snapshot import restore
from stream_eval.engine.times import time_to_json

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
_TS = attrgetter("ts")
#: Rows of A/B unit contributions per regroup record (~100 KB: far below Kafka's 1 MB default).
UNIT_ROWS = 1000
#: Characters of ids (request, experiment, arm, unit) per regroup record of unit contributions: fewer rows when
#: the ids are long (up to 4 bytes a character: 256 KiB of them at most, with Kafka's limit 1 MiB a message).
UNIT_ID_CHARS = 64 << 10
#: Characters counted per number a row carries (a session part's scores) when records are cut to size.
NUMBER_CHARS = 24
#: Closed sessions' and buckets' entries a checkpoint pops from the stage's heap of needed offsets before it filters
#: the whole heap instead (:meth:`SessionStage._first_needed`).
_POPS = 64
#: Bytes of looks per :class:`~stream_eval.engine.records.LookReport` (a look larger than this goes alone): the
#: segment looks of a shard can be large (README, "Segment A/B rows"), and Kafka's default limit is 1 MiB a message.
REPORT_BYTES = 512 << 10


def row_ranges(columns: list[list[str]], extra: list[int] | None = None) -> list[tuple[int, int]]:
    """Ranges of rows of the string ``columns`` (of equal length), in order, of at most :data:`UNIT_ROWS` rows and
    :data:`UNIT_ID_CHARS` characters each (a row longer than that alone); ``extra``: more characters per row (the
    numbers a row carries, as :data:`NUMBER_CHARS` each).

    >>> row_ranges([["a"] * 2500])
    [(0, 1000), (1000, 2000), (2000, 2500)]
    >>> row_ranges([["x" * 40_000, "y", "z" * 40_000], ["e"] * 3])
    [(0, 2), (2, 3)]
    >>> row_ranges([["a"] * 3], [40_000, 40_000, 10])
    [(0, 1), (1, 3)]
    """
    n = len(columns[0]) if columns else 0
    sizes = np.zeros(n, dtype=np.int64) if extra is None else np.array(extra, dtype=np.int64)
    for column in columns:
        sizes += np.fromiter(map(len, column), dtype=np.int64, count=n)
    if int(sizes.sum()) <= UNIT_ID_CHARS:  # most batches: rows are the bound
        return [(a, min(a + UNIT_ROWS, n)) for a in range(0, n, UNIT_ROWS)]
    ends = np.concatenate([[0], np.cumsum(sizes)])  # rows a:b hold ends[b] - ends[a] characters
    out: list[tuple[int, int]] = []
    start = 0
    while start < n:  # the most rows that fit (a row longer than the bound alone)
        fit = int(np.searchsorted(ends, ends[start] + UNIT_ID_CHARS, side="right")) - 1
        end = max(start + 1, min(fit, start + UNIT_ROWS, n))
        out.append((start, end))
        start = end
    return out

if TYPE_CHECKING:
    from stream_eval.engine.engine import Engine


class RegroupSink:
    """Collects, in order, the records a worker writes to the regroup log: (stage partition, key, record bytes).

    With ``partition``, those of one input partition: numbered, and held by the stage until committed (module
    docstring). The worker calls :meth:`begin` when it takes the partition, stores :attr:`seq` in the
    partition's checkpoint once everything taken before it is written, and calls :meth:`commit` with it once
    the checkpoint is stored.

    With ``stages`` partitions of the regroup log, a record goes to the stage partition of its shard
    (``engine/ab.py``) modulo ``stages``: a unit contribution by its unit, a session part by its unit (by its
    session id without one), a query metric and a verdict by its experiment (so that an experiment's GSB sign tests
    are on one partition). Watermarks, arms seen, rewinds and commits go to every stage partition (the same bytes,
    the same number)."""

    def __init__(self, partition: int | None = None, stages: int = 1) -> None:
        self.records: list[tuple[int, bytes, bytes]] = []
        self.stages = stages
        self._arms: set[tuple[str, str]] = set()
        self.partition = partition
        self.token: str | None = None  # this ownership of the partition (set by begin)
        self._seq = 0
        # Session parts and query metrics given since the last record, written as columns (SessionParts,
        # QueryMetrics) before the next record of another kind: one record per many requests, applied at once.
        self._parts: list[Parts] = []
        self._queries = _QueryColumns()

    @property
    def seq(self) -> int:
        """The number of the last data record appended (what a checkpoint of the partition stores)."""
        self._flush()
        return self._seq

    def _routes(self, keys: Sequence[str]) -> list[tuple[int, list[int] | None]]:
        """The stage partitions of rows routed by ``keys`` (each's shard modulo the partitions), in order, with
        the rows of each (None: all rows)."""
        if self.stages == 1:
            return [(0, None)]
        stage = shards_of(keys) % self.stages
        out: list[tuple[int, list[int] | None]] = []
        for to in np.unique(stage).tolist():
            rows = np.flatnonzero(stage == to)
            out.append((to, None if rows.shape[0] == len(keys) else rows.tolist()))
        return out

    def _flush(self) -> None:
        """Write the session parts and query metrics given so far as columnar records (in that order)."""
        given, queries = self._parts, self._queries
        if given:
            self._parts = []
            parts = Parts.concat(given)
            routed = [(0, parts)]
            if self.stages > 1:  # (one copy: the parts by stage partition, in row order in each)
                stage = shards_of([s if u is None else u for s, u in zip(parts.sessions, parts.units, strict=True)])
                stage %= self.stages
                order = np.argsort(stage, kind="stable")
                bounds = np.searchsorted(stage[order], np.arange(self.stages + 1)).tolist()
                ordered = parts.take(order)
                routed = [(to, ordered.between(a, b))
                          for to, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)) if b > a]
            for to, mine in routed:
                extra = (mine.sizes * NUMBER_CHARS).tolist()
                for a, b in row_ranges([mine.sessions, mine.experiments, mine.arms], extra):
                    self._append(b"", mine.between(a, b).record(), flush=False, to=to)
        if queries.queries:
            self._queries = _QueryColumns()
            for to, rows in self._routes(queries.experiments):  # (an experiment's sign tests on one partition)
                metrics = queries if rows is None else queries.rows(rows)
                for a, b in row_ranges([metrics.queries, metrics.experiments, metrics.arms]):
                    self._append(b"", records.QueryMetrics(
                        experiments=metrics.experiments[a:b], arms=metrics.arms[a:b], queries=metrics.queries[a:b],
                        served=metrics.served[a:b], values=metrics.values[a:b]), flush=False, to=to)

    def begin(self, token: str, committed: int) -> None:
        """A new owner (ownership ``token``) takes the partition from a checkpoint that stored :attr:`seq` =
        ``committed`` (0 without one): numbering goes on from it, after a rewind record (before anything else)."""
        if self.partition is None:
            raise ValueError("a sink of no partition has no ownership to begin")
        if self.records:
            raise ValueError("begin the ownership before appending records")
        self.token, self._seq = token, committed
        self._arms.clear()  # announcements after the checkpoint are discarded by the rewind: made again
        self._parts, self._queries = [], _QueryColumns()
        self._broadcast(b"", records.encode(records.Rewind(partition=self.partition, seq=committed, owner=token)))

    def commit(self, seq: int) -> None:
        """The checkpoint holding ``seq`` is stored: the stage may count the records numbered up to it."""
        if self.partition is None:
            raise ValueError("a sink of no partition has nothing to commit")
        self._flush()
        self._broadcast(b"", records.encode(records.Commit(partition=self.partition, seq=seq, owner=self.token)))

    def _broadcast(self, key: bytes, value: bytes) -> None:
        self.records += [(to, key, value) for to in range(self.stages)]

    def _append(self, key: bytes, record: records.Record, flush: bool = True, to: int | None = None) -> None:
        """Append a data record for stage partition ``to`` (None: every one)."""
        if flush:
            self._flush()  # (the parts and metrics given before this record come before it)
        if self.partition is not None:
            self._seq += 1
            record.partition, record.seq, record.owner = self.partition, self._seq, self.token
        value = records.encode(record)
        if to is None:
            self._broadcast(key, value)
        else:
            self.records.append((to, key, value))

    def session_parts(self, requests: SessionRequests, experiments: list[str], arms: list[str],
                      impressions: Impressions, rows: list[int]) -> None:
        """Finalised requests ``rows`` of named sessions (of ``requests`` and ``impressions``; with their labels
        ``experiments``, ``arms``): their :class:`~stream_eval.engine.parts.Parts`, written with the next record."""
        self._parts.append(Parts.of_batch(requests, experiments, arms, impressions, rows))

    def unit_requests(self, keys: Floats, ids: list[str], experiments: list[str], arms: list[str],
                      units: list[str], values: Floats,
                      segments: Sequence[tuple[str | None, ...]] | None = None) -> None:
        """Finalised requests' share of their A/B units, as columns: one record per :data:`UNIT_ROWS` requests of a
        stage partition, fewer when their ids are long (:func:`row_ranges`; NaN is written as null); with
        ``segments``, each request's value of every segment field."""
        self._unit_records(records.UnitRequests, keys, ids, experiments, arms, units,
                           None if segments is None else list(map(list, segments)), flat_values=values)

    def unit_sessions(self, keys: Floats, ids: list[str], experiments: list[str], arms: list[str],
                      units: list[str], weighted_auc: Floats, weight: Floats) -> None:
        """Scored one-request sessions' share of their A/B units, as columns (as :meth:`unit_requests`)."""
        self._unit_records(records.UnitSessions, keys, ids, experiments, arms, units, weighted_auc=weighted_auc,
                           weight=weight)

    def _unit_records(self, kind: type[records.UnitRequests] | type[records.UnitSessions], keys: Floats,
                      ids: list[str], experiments: list[str], arms: list[str], units: list[str],
                      segments: list[list[str | None]] | None = None, **numbers: Floats) -> None:
        """Records of ``kind`` with these columns (``numbers``: the arrays of the kind's other fields, a ``flat_*``
        one written as a flat column; ``segments``: the requests' segment values), each row to the stage partition
        of its unit."""
        for to, rows in self._routes(units):
            keys_, numbers_, segments_ = keys, numbers, segments
            ids_, experiments_, arms_, units_ = ids, experiments, arms, units
            if rows is not None:
                keys_, numbers_ = keys[rows], {name: array[rows] for name, array in numbers.items()}
                ids_, experiments_, arms_, units_ = (_pick(column, rows) for column in (ids, experiments, arms, units))
                segments_ = None if segments is None else _pick(segments, rows)
            extra = None if segments_ is None else _characters(segments_)
            for a, b in row_ranges([ids_, experiments_, arms_, units_], extra):
                others: dict[str, Any] = {name: records.flat(array[a:b]) if name.startswith("flat_")
                                          else array[a:b].tolist() for name, array in numbers_.items()}
                if segments_ is not None:
                    others["segments"] = segments_[a:b]
                self._append(b"", kind(keys=keys_[a:b].tolist(), ids=ids_[a:b], experiments=experiments_[a:b],
                                       arms=arms_[a:b], units=units_[a:b], **others), to=to)

    def query_metrics(self, groups: list[tuple[str, str]], queries: list[str], ts: list[float],
                      values: list[float]) -> None:
        """Finalised requests' ``gsb_metric`` for their queries: (experiment, arm), query id, serve time, value
        (written with the next record, as columns)."""
        columns = self._queries
        columns.experiments += [experiment for experiment, _ in groups]
        columns.arms += [arm for _, arm in groups]
        columns.queries += queries
        columns.served += ts
        columns.values += values

    def _stage_of(self, experiment: str) -> int:
        return shard_of(experiment) % self.stages

    def judgment(self, experiment: str, verdict: str) -> None:
        self._append(experiment.encode(), records.Judgment(experiment=experiment, verdict=verdict),
                     to=self._stage_of(experiment))

    def interleaved(self, experiment: str, teams: list[str], relevant_positions: list[int]) -> None:
        self._append(experiment.encode(), records.Interleaved(experiment=experiment, teams=teams,
                                                              relevant=relevant_positions),
                     to=self._stage_of(experiment))

    def arm(self, experiment: str, arm: str) -> None:
        if (experiment, arm) not in self._arms:
            self._arms.add((experiment, arm))
            self._append(experiment.encode(), records.ArmSeen(experiment=experiment, arm=arm))

    def watermark(self, partition: int, watermark: float, resumed: bool = False) -> None:
        """Every request of input partition ``partition`` finalised by ``watermark`` has its records above;
        ``resumed``: the partition had ended, and has events again (its event time goes back from +inf)."""
        self._append(b"", records.PartitionWatermark(input_partition=partition, time=time_to_json(watermark),
                                                     resumed=resumed))

    def take_routed(self) -> list[tuple[int, bytes, bytes]]:
        """The records appended since the last call: (stage partition, key, value), in order."""
        self._flush()
        taken, self.records = self.records, []
        return taken

    def take(self) -> list[tuple[bytes, bytes]]:
        """:meth:`take_routed` of a sink of one stage partition: (key, value)."""
        if self.stages != 1:
            raise ValueError("records for several stage partitions: take_routed")
        return [(key, value) for _, key, value in self.take_routed()]


def _characters(rows: list[list[str | None]]) -> list[int]:
    """The characters of each row's strings (None: none), a column at a time (not a generator per row)."""
    columns = [[len(v) if v else 0 for v in column] for column in zip(*rows, strict=True)]
    if len(columns) == 1:
        return columns[0]
    return list(map(sum, zip(*columns, strict=True))) if columns else [0] * len(rows)


def _pick(column: list[Any], rows: list[int]) -> list[Any]:
    return [column[i] for i in rows]


class _QueryColumns:
    """Query metrics given to a sink, not written yet (the columns of :class:`records.QueryMetrics`)."""

    __slots__ = ("experiments", "arms", "queries", "served", "values")

    def __init__(self) -> None:
        self.experiments: list[str] = []
        self.arms: list[str] = []
        self.queries: list[str] = []
        self.served: list[float] = []
        self.values: list[float | None] = []

    def rows(self, rows: list[int]) -> _QueryColumns:
        """These columns' ``rows``."""
        out = _QueryColumns()
        for name in self.__slots__:
            setattr(out, name, _pick(getattr(self, name), rows))
        return out


class _WaitingParts:
    """Session parts received but not added yet, one run per record: its parts in the order of their deadlines
    (serve time plus ``horizon``), read from the front as event time passes them. :meth:`due` gives those due in
    the order of (deadline, offset of their record, row in it), the order in which they are added."""

    __slots__ = ("_runs", "_horizon")

    def __init__(self, horizon: float) -> None:
        # (deadline of the run's next part, offset of its record, that part's place in the run, the run): a heap
        # (offsets tell every two runs apart); a run is (deadlines in order, the parts, their rows in that order)
        self._runs: list[tuple[float, int, int, tuple[Floats, Parts, Ints]]] = []
        self._horizon = horizon

    def __bool__(self) -> bool:
        return bool(self._runs)

    def __len__(self) -> int:
        """The parts waiting."""
        return sum(len(run[1]) - start for _, _, start, run in self._runs)

    def add(self, offset: int, parts: Parts) -> None:
        """The parts of the record at ``offset``."""
        if not len(parts):
            return
        deadlines = parts.served + self._horizon
        rows = np.argsort(deadlines, kind="stable")  # (equal deadlines in row order)
        run = (deadlines[rows], parts, rows)
        heapq.heappush(self._runs, (float(run[0][0]), offset, 0, run))

    def first_offset(self) -> int | None:
        """The smallest offset of a record with parts waiting."""
        return min((offset for _, offset, _, _ in self._runs), default=None)

    def due(self, watermark: float) -> tuple[Ints, Parts | None]:
        """Take the parts due by ``watermark`` (deadline at most it): their records' offsets and the parts, in
        the order of (deadline, offset, row); None when none is due."""
        runs = self._runs
        taken: list[tuple[int, int, int, tuple[Floats, Parts, Ints]]] = []  # (offset, start, end, run)
        while runs and runs[0][0] <= watermark:
            _, offset, start, run = heapq.heappop(runs)
            deadlines = run[0]
            end = start + int(np.searchsorted(deadlines[start:], watermark, side="right"))
            taken.append((offset, start, end, run))
            if end < len(deadlines):
                heapq.heappush(runs, (float(deadlines[end]), offset, end, run))
        if not taken:
            return np.empty(0, dtype=np.int64), None
        offsets = np.repeat(np.array([offset for offset, _, _, _ in taken], dtype=np.int64),
                            [end - start for _, start, end, _ in taken])
        deadlines = np.concatenate([run[0][start:end] for _, start, end, run in taken])
        # (stable: a record's parts of one deadline stay in row order, as its run holds them)
        order = np.lexsort((offsets, deadlines))
        # One copy of the parts due: their records' parts put together (a record's only where some of them wait
        # on), then taken in that order.
        blocks, rows, base = [], [], 0
        for _, start, end, run in taken:
            block, picked = run[1], run[2][start:end]
            if end - start < len(block) // 2:
                block, picked = block.take(picked), np.arange(end - start)
            blocks.append(block)
            rows.append(picked + base)
            base += len(block)
        return offsets[order], Parts.concat(blocks).take(np.concatenate(rows)[order])


class _Held:
    """An input partition's data records the stage holds until a commit or rewind applies them."""

    __slots__ = ("token", "known", "applied", "records")

    def __init__(self) -> None:
        self.token: str | None = None  # the partition's current ownership (once ``known``)
        self.known = False
        self.applied = 0  # the number of the last record applied (a record numbered up to it is delivered again)
        self.records: list[tuple[int, int, records.AnyRecord]] = []  # (number, offset, record) in number order


@dataclass
class StageCheckpoint:
    start: int = 0
    processed: int = 0
    #: the input partitions' finalisation watermarks just before ``start`` (JSON key ``units``, as written before)
    partition_watermarks: list[float] = field(default_factory=list)
    arms: list[tuple[str, str]] = field(default_factory=list)
    # The latest snapshot of the stage-held state (engine/snapshot.py): where its records are in the snapshot
    # topic (first offset, count), and the log offset it covers (every record before it is in the snapshot).
    snapshot: tuple[int, int] | None = None
    snapshot_at: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "processed": self.processed,
                "units": [time_to_json(u) for u in self.partition_watermarks], "arms": self.arms,
                "snapshot": None if self.snapshot is None else list(self.snapshot), "snapshot_at": self.snapshot_at}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageCheckpoint:
        snapshot = data.get("snapshot")
        return cls(int(data["start"]), int(data["processed"]), [float(u) for u in data["units"]],
                   [(str(e), str(a)) for e, a in data["arms"]],
                   None if snapshot is None else (int(snapshot[0]), int(snapshot[1])), int(data.get("snapshot_at", 0)))


class SessionStage:
    """Feeds regrouped records to an engine's sessions and GSB tallies; closes them on the units' watermark.

    With ``stages`` partitions of the regroup log, this is the stage of partition ``stage``: its engine holds the
    sessions, query buckets, verdicts and A/B units of its shards (:class:`RegroupSink`). The A/B looks of every
    partition are merged on partition 0 (``engine/ab.py``): the others report theirs in records for it
    (:meth:`take_reports`), which partition 0 applies as they come."""

    def __init__(self, engine: Engine, partitions: int, checkpoint: StageCheckpoint | None = None,
                 snapshot: bytes | None = None, stage: int = 0, stages: int = 1) -> None:
        """``partitions``: the input partitions; ``snapshot``: the data of ``checkpoint.snapshot`` (required when
        the checkpoint names one)."""
        self.engine = engine
        self.stage, self.stages = stage, stages
        self.reports: list[bytes] = []  # records for stage partition 0 (the looks of this one's shards)
        #: stage partition 0's merger when the same process holds it (:meth:`link`): the looks and progress go to it
        #: at once as well as in :attr:`reports` (docs/design.md, "A/B units across workers")
        self.local: LookMerger | None = None
        self._direct_after = -math.inf  # progress goes to :attr:`local` once it has this partition's up to here
        self._reported = -math.inf  # the progress last reported
        #: each input partition's finalisation watermark (the stage closes sessions on their minimum)
        self.partition_watermarks = [-math.inf] * partitions
        self.watermark = -math.inf
        self.received: int | None = None
        self.muted_until = -1
        # (offset, "s"|"q", session id | bucket) of records whose session or bucket may still be open: a heap
        self._needed: list[tuple[int, str, Any]] = []
        # Session parts received but not added. They are added in deadline order once every partition is past
        # their deadline, as one engine finalises them in replay: whether a request starts a new session depends on
        # the order (see Sessions.add).
        self._horizon = engine.config.attribution_window + engine.config.allowed_lateness
        self._waiting = _WaitingParts(self._horizon)
        # The partitions' watermarks after each watermark record: a checkpoint stores them as they were just
        # before its ``start``, so that a rebuild from there closes sessions exactly where they closed.
        self._history: deque[tuple[int, tuple[float, ...]]] = deque()
        self._base: tuple[float, ...] = tuple(self.partition_watermarks)
        # Input partitions' records not applied yet, by partition; and (smallest offset of the records applied,
        # offset of the commit or rewind applying them) since the last checkpoint's start: a checkpoint does
        # not start between the two (a rebuild would apply the commit without the records).
        self._held: dict[int, _Held] = {}
        self._applied: deque[tuple[int, int]] = deque()
        if checkpoint is not None:
            self.received = checkpoint.start  # (records before it are never fed again: see feed)
            self.partition_watermarks = list(checkpoint.partition_watermarks) + [-math.inf] * (
                partitions - len(checkpoint.partition_watermarks))
            self._base = tuple(self.partition_watermarks)
            self.watermark = min(self.partition_watermarks)
            self.muted_until = checkpoint.processed
            for experiment, arm in checkpoint.arms:
                engine.arms_seen.setdefault(experiment, set()).add(arm)
        self._restored = checkpoint
        # Records before ``frozen_until`` are in the restored snapshot: they leave its state alone on a rebuild.
        # (where it is stored, the offset it covers, the offset a rebuild from it starts at)
        self.snapshot_ref: tuple[tuple[int, int], int, int] | None = None
        self.frozen_until = 0
        self._connect_looks()
        if checkpoint is not None and checkpoint.snapshot is not None:
            if snapshot is None:
                raise ValueError("the stage checkpoint names a snapshot: pass its data")
            restore(engine, snapshot)
            self.snapshot_ref = (checkpoint.snapshot, checkpoint.snapshot_at, checkpoint.start)
            self.frozen_until = checkpoint.snapshot_at

    def _connect_looks(self) -> None:
        """Partition 0 merges every partition's looks; the others report theirs to it."""
        ledger = self.engine.ledger
        ledger.merger.staged = True
        if self.stage == 0:
            merger = ledger.merger
            merger.progress_of += [-math.inf] * (self.stages - len(merger.progress_of))
            return
        ledger.on_shard_look, ledger.on_progress = self._report_looks, self._report_progress
        ledger.merger.active = False

    def link(self, merger: LookMerger | None) -> None:
        """Give the looks and progress from now on to ``merger`` (stage partition 0's, held in the same process) at
        once, as well as through the log (None: through the log only).

        A progress is a promise that every look up to it has been given. The looks this partition, or an earlier
        owner of it, reported before the link went through the log only, and partition 0 may not have read them
        yet; so progress goes to ``merger`` at once only when the log has brought it this partition's progress up to
        where the link began (the looks are always given: one not folded yet waits for its boundary's progress)."""
        self.local = merger
        if merger is not None:
            self._direct_after = max(self._reported, self._mark(self.engine.ledger.released))

    def _mark(self, upto: float) -> float:
        """The last look boundary at or before event time ``upto`` (every look up to it is taken by then)."""
        every = self.engine.config.look_every
        return upto if math.isinf(upto) else math.floor(upto / every) * every

    def _report_looks(self, boundary: float, looks: list[ShardLook | SegmentLook], live: bool = False) -> None:
        """Looks at ``boundary`` (``live``: between boundaries) for partition 0, in records of about
        :data:`REPORT_BYTES` of looks at most."""
        batch: list[Any] = []
        size = 0
        for look in looks:
            data = look.to_json()
            length = len(msgspec.json.encode(data))
            if batch and size + length > REPORT_BYTES:
                self.reports.append(records.encode(records.LookReport(stage=self.stage, time=time_to_json(boundary),
                                                                      looks=batch, live=live)))
                batch, size = [], 0
            batch.append(data)
            size += length
        if batch or not looks:
            self.reports.append(records.encode(records.LookReport(stage=self.stage, time=time_to_json(boundary),
                                                                  looks=batch, live=live)))
        if self.local is not None:
            (self.local.add_live if live else self.local.add)(boundary, looks)

    def _report_progress(self, upto: float) -> None:
        """Report progress on the boundaries only (the merger folds looks there): at most once per look."""
        mark = self._mark(upto)
        if mark > self._reported:
            self._reported = mark
            self.reports.append(records.encode(records.LookProgress(stage=self.stage, time=time_to_json(mark))))
            local = self.local
            if local is not None and self.stage < len(local.progress_of) \
                    and local.progress_of[self.stage] >= self._direct_after:
                local.progress(self.stage, mark)

    def take_reports(self, live: bool = True) -> list[bytes]:
        """The records for stage partition 0 since the last call (write them before this stage's checkpoint), with
        the live looks of the shards changed since (for the rows partition 0 shows between boundaries; ``live``
        False: the boundaries' looks and progress only)."""
        ledger = self.engine.ledger
        if live and self.stage != 0 and not ledger.frozen:
            changed = ledger.live_looks(since_report=True)
            if changed:
                self._report_looks(ledger.released, list(changed), live=True)
        taken, self.reports = self.reports, []
        return taken

    @property
    def rebuilding(self) -> bool:
        """Still re-reading (muted) what the checkpoint it was restored from had counted."""
        return self.next_offset < self.muted_until

    def checkpoint(self) -> StageCheckpoint:
        if self._restored is not None and self.rebuilding:
            # A stage given up again before its rebuild got to ``processed`` knows less than the checkpoint it
            # came from (records it has not re-read yet may be needed): the next owner starts from that one.
            return StageCheckpoint.from_json(self._restored.to_json())
        processed = max(self.received or 0, self.muted_until)
        arms = sorted((e, a) for e, arms in self.engine.arms_seen.items() for a in arms)
        snapshot, snapshot_at, snapshot_start = self.snapshot_ref if self.snapshot_ref is not None else (None, 0, 0)
        needed = self._first_needed()
        start = min(needed, processed) if needed is not None else processed
        if snapshot is not None:
            # a rebuild re-reads what the sessions and query buckets open at the snapshot need: those that closed
            # since gave their share after the snapshot, from records before it
            start = min(start, snapshot_start)
        start = self._settled(start)
        applied = self._applied
        while applied and applied[0][1] < start:  # (later checkpoints start no earlier)
            applied.popleft()
        if snapshot is None and self.cumulative():
            # The A/B units and the verdicts kept for the sign tests are cumulative since the first event: until
            # a snapshot of them is stored, a new owner rebuilds them (and everything else, muted) from the log start.
            return StageCheckpoint(0, processed, [], arms)
        history = self._history
        while history and history[0][0] < start:
            self._base = history.popleft()[1]
        return StageCheckpoint(start, processed, list(self._base), arms, snapshot, snapshot_at)

    def cumulative(self) -> bool:
        """Whether this stage holds state cumulative since the log's start, which only a snapshot or a rebuild from
        the start gives a new owner: A/B units, verdicts kept for the sign tests, and on partition 0 looks folded, or
        other partitions' looks reported and waiting for their boundary (a partition 0 with no units of its own)."""
        ledger = self.engine.ledger
        return bool(ledger.experiments or self.engine.gsb.complete or ledger.merger.holds_looks())

    def snapshot_taken(self, where: tuple[int, int], covers: int) -> None:
        """A snapshot of the state after every record before offset ``covers`` is stored at ``where`` (take it
        between two :meth:`feed` calls, ``covers`` = :attr:`next_offset`)."""
        needed = self._first_needed()
        self.snapshot_ref = (where, covers, self._settled(covers if needed is None else min(needed, covers)))

    @property
    def next_offset(self) -> int:
        """The offset after the last record fed (what a snapshot taken now covers)."""
        return max(self.received or 0, 0)

    def _first_needed(self) -> int | None:
        open_sessions, buckets = self.engine.sessions.open, self.engine.gsb.open_buckets()

        def still(entry: tuple[int, str, Any]) -> bool:
            offset, kind, key = entry
            if kind == "s":
                session = open_sessions.get(key)
                return session is not None and session.offset == offset  # not an earlier session of the same id
            return key in buckets

        needed = self._needed
        for _ in range(_POPS):
            if not needed or still(needed[0]):
                break
            heapq.heappop(needed)
        else:  # many closed at once (a backlog's end): the rest filtered in one pass, not popped one by one
            needed[:] = filter(still, needed)
            heapq.heapify(needed)
        waiting = self._waiting.first_offset()
        first = [] if waiting is None else [waiting]
        first += [min(offset for _, offset, _ in held.records) for held in self._held.values() if held.records]
        if needed:
            first.append(needed[0][0])
        return min(first, default=None)

    def _settled(self, start: int) -> int:
        """``start``, or earlier: no record before it was applied by a commit or rewind at or after it."""
        for first, at in reversed(self._applied):  # (in the order of ``at``; ``start`` only goes down)
            if at < start:
                break
            start = min(start, first)
        return start

    def feed(self, offsets: Sequence[int], values: Sequence[bytes]) -> None:
        """Records of the regroup log in offset order (redelivered offsets are skipped)."""
        for offset, value in zip(offsets, values, strict=True):
            if self.received is not None and offset < self.received:
                continue
            self.received = offset + 1
            record = records.decode(value)
            partition = record.partition
            if partition is None:  # (no partition's transaction: at once)
                self._apply(record, offset, offset)
                continue
            held = self._held.get(partition)
            if held is None:
                held = self._held[partition] = _Held()
            kind, n = type(record), record.seq or 0
            if kind is records.Commit:
                if held.known and record.owner != held.token:
                    continue  # a commit of an earlier ownership
                held.token, held.known = record.owner, True
                self._apply_held(held, n, offset, record.owner)
            elif kind is records.Rewind:
                self._apply_held(held, n, offset)  # what the new owner's checkpoint covers
                held.records.clear()  # the rest is written again
                held.token, held.known, held.applied = record.owner, True, n
            elif n > held.applied:
                if held.known and (record.owner or held.token) != held.token:
                    continue  # written by an ownership that a later one has replaced (a worker still writing)
                kept = held.records
                if not kept or n > kept[-1][0]:
                    kept.append((n, offset, record))
                else:  # (out of order: in number order, once)
                    k = bisect_left(kept, n, key=itemgetter(0))
                    if kept[k][0] != n:
                        kept.insert(k, (n, offset, record))

    def _apply_held(self, held: _Held, n: int, at: int, token: str | None = None) -> None:
        """Apply a partition's held records numbered up to ``n``, at offset ``at`` (a commit or rewind); those of
        another ownership than ``token`` (a commit's) are dropped instead."""
        kept = held.records
        k = 0
        while k < len(kept) and kept[k][0] <= n:
            k += 1
        taken = kept[:k]
        del kept[:k]
        if token is not None:
            taken = [held_record for held_record in taken if (held_record[2].owner or token) == token]
        if taken:
            self._applied.append((min(offset for _, offset, _ in taken), at))
            for _, offset, record in taken:
                self._apply(record, offset, at)
        held.applied = max(held.applied, n)

    def _apply(self, record: records.AnyRecord, offset: int, at: int) -> None:
        """Apply a record of the log at ``offset``; what is rebuilt (muted, in the snapshot) is decided at ``at``,
        where it took effect (what a rebuild re-reads, by ``offset``)."""
        engine = self.engine
        kind = type(record)
        frozen = at < self.frozen_until  # (in the restored snapshot)
        engine.ledger.frozen = engine.gsb.frozen = frozen
        if kind is records.UnitRequests or kind is records.UnitSessions:
            # A/B units: rebuilt from every record, muted or not (their state is not a counter)
            if not frozen:
                self._add_units(record)  # type: ignore[arg-type]  # dispatched on type
            return
        if kind is records.LookReport:  # (partition 0: another partition's looks; idempotent, like the units')
            if not frozen:
                report: Any = record
                looks = [look_from_json(look) for look in report.looks]
                merger = engine.ledger.merger
                (merger.add_live if report.live else merger.add)(float(report.time), looks)
            return
        if kind is records.LookProgress:
            if not frozen:
                engine.ledger.merger.progress(record.stage, record.at)  # type: ignore[union-attr]  # by kind
            return
        if kind is records.SessionParts or kind is records.SessionPart:
            self._waiting.add(offset, Parts.of_record(record, self._horizon))  # type: ignore[arg-type]  # by kind
            return
        with self._quiet(at):
            if kind is records.QueryMetrics or kind is records.QueryMetric:
                columnar = kind is records.QueryMetrics
                metrics: Any = record
                gsb = engine.gsb
                serve = np.array(metrics.served if columnar else [metrics.served], dtype=np.float64)
                for bucket in np.unique(np.floor_divide(serve, gsb.window)).astype(np.int64).tolist():
                    if bucket not in gsb.open_buckets():
                        heapq.heappush(self._needed, (offset, "q", bucket))
                values = np.array(metrics.values if columnar else [metrics.value], dtype=np.float64)  # (None: NaN)
                if columnar:
                    gsb.query_metrics(list(zip(metrics.experiments, metrics.arms, strict=True)), metrics.queries,
                                      serve, values)
                else:
                    gsb.query_metrics([(metrics.experiment, metrics.arm)], [metrics.query], serve, values)
            elif kind is records.ArmSeen:
                engine.arms_seen.setdefault(record.experiment, set()).add(record.arm)  # type: ignore[union-attr]
            elif kind is records.Judgment:  # counted once; kept for the sign test even while rebuilding
                engine.gsb.judgment(record.experiment, record.verdict,  # type: ignore[union-attr]
                                    count=at >= self.muted_until)
            elif kind is records.Interleaved:
                interleaved: Any = record
                engine.teams_seen.setdefault(interleaved.experiment, set()).update(interleaved.teams)
                engine.gsb.interleaved(interleaved.experiment, interleaved.teams, interleaved.relevant,
                                       count=at >= self.muted_until)
            elif kind is records.PartitionWatermark:
                mark: Any = record
                partition, time = int(mark.input_partition), mark.at
                marks = self.partition_watermarks
                if partition >= len(marks):
                    marks += [-math.inf] * (partition + 1 - len(marks))
                if mark.resumed and marks[partition] == math.inf and time < math.inf:
                    # an ended partition has events again: event time goes on from the end's +inf down to them
                    # (what closed at the end stays closed; what comes now closes as its time passes, as in replay)
                    marks[partition] = time
                    self._history.append((at, tuple(self.partition_watermarks)))
                    self.watermark = min(self.watermark, min(marks))
                    return
                if time <= marks[partition]:
                    return
                marks[partition] = time
                self._history.append((at, tuple(self.partition_watermarks)))
                watermark = min(self.partition_watermarks)
                if watermark > self.watermark or watermark == math.inf:
                    self.watermark = watermark
                    self._add_parts(watermark)
                    engine.close(watermark, windows=False)

    def _add_units(self, record: records.UnitRequests | records.UnitSessions) -> None:
        """Requests' or one-request sessions' shares of their A/B units, to the ledger (released on watermarks, in
        key order)."""
        ledger = self.engine.ledger
        columns = (np.array(record.keys, dtype=np.float64), record.ids, record.experiments, record.arms, record.units)
        if type(record) is records.UnitRequests:
            given = None if record.segments is None else list(map(tuple, record.segments))
            ledger.add_requests(*columns, record.value_rows(), given)
        else:
            ledger.add_sessions(*columns, np.array(record.weighted_auc, dtype=np.float64),  # type: ignore[union-attr]
                                np.array(record.weight, dtype=np.float64))  # type: ignore[union-attr]

    def _quiet(self, offset: int) -> AbstractContextManager[None]:
        return self.engine.muted(self.engine.join) if offset < self.muted_until else nullcontext()

    def _add_parts(self, watermark: float) -> None:
        """Add the waiting session parts due by ``watermark`` (all partitions have finalised up to it)."""
        offsets, parts = self._waiting.due(watermark)
        if parts is None:
            return
        engine = self.engine
        group = engine.groups_of_labels(parts.experiments, parts.arms)
        # (under the quiet context of the watermark record that released them: named parts count nothing)
        # A rebuild must re-read every part of every open session: the smallest offset of each is needed (parts are
        # added in deadline order, which is not the log's order when they come from different partitions).
        lowered: list[tuple[int, SessionKey]] = []
        engine.add_session_parts(parts.requests(), group, parts.impressions(engine.sessions.behaviour),
                                 offsets.tolist(), lowered)
        needed = self._needed
        for offset, key in lowered:
            heapq.heappush(needed, (offset, "s", key))
