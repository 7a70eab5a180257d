"""Event time over partitioned input, and recoverable per-partition state: the streaming side of the engine.

The rankings, feedback and judgments topics are co-partitioned by key (``request_id``), so partition ``p``
of every input topic forms one *task* (:class:`Task`, as Kafka Streams calls a partition's share of the work):
one :class:`~stream_eval.events.join.Join` holds the requests of partition ``p``. (A *unit* is only ever an A/B
randomisation unit.) This module knows nothing of Kafka; the worker feeds it decoded messages with their offsets.

Event time (docs/contract.md §1):

* Each topic-partition ("source") has a watermark: the largest ``ts`` it has carried, raised further by
  watermark events; ``{"type": "watermark", "end": true}`` ends it (+inf) until it speaks again.
* A task's join advances to the minimum over its rankings and feedback sources, so feedback that lags its
  ranking in another topic is never late because of the other topic.
* The engine's sessions and GSB buckets close on the minimum over every rankings and feedback source
  (judgments join nothing and count at once, so a quiet judgments topic holds nothing back).
* A source silent for ``idle_timeout`` seconds of the ``clock`` given (a worker's leaves broker outages out)
  stops holding event time back until it speaks.

Recoverable state (at-least-once delivery without double counting): :meth:`PartitionedEngine.checkpoint`
gives, per task, the offsets to resume reading from (``start``: the first event of every request still
open, waiting or remembered, so that re-reading rebuilds the join exactly), the offsets already counted
(``processed``) and the join's watermark. A new owner of the partition re-reads ``start..processed`` *muted*
(the state is rebuilt, nothing is counted or finalised twice), advances muted to the old watermark, and goes
on from there, so a rebalance never counts an event or a request twice.
"""

from __future__ import annotations

import math
import os
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter
from typing import Any

import numpy as np

from stream_eval.engine import shares
from stream_eval.engine.delays import FeedbackDelays
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.engine.regroup import RegroupSink, SessionStage
from stream_eval.engine.times import time_to_json
from stream_eval.engine.windows import RollingWindows
from stream_eval.events import compiled
from stream_eval.events.join import Join
from stream_eval.events.schema import Chunk, CompactRanking, Feedback, Invalid, Judgment, Ranking, Watermark

Event = Ranking | Feedback | Judgment | Watermark | Invalid
#: Rankings, full or compact (the join takes both).
_RANKINGS = (Ranking, CompactRanking)
KINDS = ("ranking", "feedback", "judgment")
JOINED = ("ranking", "feedback")
#: The most bytes of waiting feedback (JSON) a checkpoint record holds itself; more is stored in pieces before it
#: (:attr:`Checkpoint.waiting_at`).
WAITING_BYTES = 256 * 1024
#: Seconds of wall clock between two finalisation watermarks of one partition sent to the regroup log.
ANNOUNCE_EVERY = 0.2


@dataclass
class Checkpoint:
    """Where a task's state can be rebuilt from: per kind, first offset to read and first offset not counted;
    what the task had counted by then (its share, ``engine/shares.py``) and the sequence number of its last
    record in the regroup log (``engine/regroup.py``). The worker adds where its outputs stood."""

    partition: int
    start: dict[str, int] = field(default_factory=dict)
    processed: dict[str, int] = field(default_factory=dict)
    watermark: float = -math.inf
    share: dict[str, Any] | None = None
    regroup_seq: int = 0
    #: The worker's: the end offset of the partition's request-metrics output after the checkpoint's flush.
    output_end: int | None = None
    #: The worker's: where the full windows share that ``share``'s windows delta builds on is stored.
    windows: tuple[int, int] | None = None
    #: The ownership (generation) that stored it.
    owner: str | None = None
    #: The worker's: request ids that a previous owner wrote to request-metrics before ``output_end`` and that
    #: are still open here (not to be written again when they are finalised).
    written: list[str] = field(default_factory=list)
    #: The feedback waiting for its ranking (``Join.waiting_feedback``); None in checkpoints stored before
    #: 2026-11-28, and in those stored before 2026-12-02 when more waited than :data:`WAITING_BYTES`: the rebuild then
    #: keeps the feedback re-read that waits (docs/design.md, "Delivery", says what that can miss).
    waiting: list[list[Any]] | None = None
    #: The worker's: where the waiting feedback is stored when it is more than :data:`WAITING_BYTES` (``waiting`` is
    #: then None in the record, and filled in when it is read back).
    waiting_at: tuple[int, int] | None = None
    #: The input topics (kinds) of the partition whose last message read was an end watermark: a new owner takes
    #: them as ended (they hold event time back no more) until an event comes after the end.
    ended: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "start": self.start, "processed": self.processed,
                "watermark": time_to_json(self.watermark), "share": self.share, "regroup_seq": self.regroup_seq,
                "output_end": self.output_end, "windows": None if self.windows is None else list(self.windows),
                "owner": self.owner, "written": self.written,
                **({} if self.waiting is None else {"waiting": self.waiting}),
                **({} if self.waiting_at is None else {"waiting_at": list(self.waiting_at)}),
                **({"ended": self.ended} if self.ended else {})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        windows, waiting_at = data.get("windows"), data.get("waiting_at")
        output_end = data.get("output_end")
        return cls(int(data["partition"]), {k: int(v) for k, v in data["start"].items()},
                   {k: int(v) for k, v in data["processed"].items()}, float(data["watermark"]),
                   data.get("share"), int(data.get("regroup_seq", 0)),
                   None if output_end is None else int(output_end),
                   None if windows is None else (int(windows[0]), int(windows[1])), data.get("owner"),
                   [str(request_id) for request_id in data.get("written", ())], data.get("waiting"),
                   None if waiting_at is None else (int(waiting_at[0]), int(waiting_at[1])),
                   [str(kind) for kind in data.get("ended", ())])


class Source:
    """One topic-partition: its watermark, whether it has ended, when it last spoke, the next offset to feed."""

    __slots__ = ("watermark", "ended", "heard", "next_offset", "received")

    def __init__(self, now: float) -> None:
        self.watermark = -math.inf
        self.ended = False
        self.heard = now
        self.next_offset: int | None = None  # after the last message fed to the engine
        self.received: int | None = None  # after the last message accepted (fed, or held while rebuilding)

    def time(self, now: float, idle_timeout: float) -> float | None:
        """This source's event time, ``None`` while it is idle (it holds nothing back)."""
        if self.ended:
            return math.inf
        if now - self.heard > idle_timeout:
            return None
        return self.watermark


class Requests:
    """Offsets of the first event of each request of one topic-partition that the join may still need.

    In offset order: the offsets in an ``array`` (8 bytes each, not a 28-byte int in a 64-byte tuple) and the
    request ids, which the join's state holds anyway, in a list; ``head`` is the first one still needed.
    """

    __slots__ = ("offsets", "ids", "head")

    def __init__(self) -> None:
        self.offsets = array("q")
        self.ids: list[str] = []
        self.head = 0

    def add(self, offsets: Sequence[int], events: Sequence[Event] | Chunk, join: Join) -> None:
        """Record the first ranking or feedback of each request in a batch, as ``join`` (before it takes the
        batch) tells: a ranking is first unless its request is open or finalised; feedback is first unless
        feedback is waiting for the request, was applied to it, or it is finalised (late feedback is not needed)."""
        if isinstance(events, Chunk):
            picked, rids = _firsts_of_chunk(offsets, events, join)
        else:
            picked, rids = _firsts(list(zip(offsets, events, strict=True)), join)
        if len(set(rids)) != len(rids):  # a request's first twice in the batch (rare): the earlier one
            first_of: dict[str, int] = {}
            for k, rid in enumerate(rids):
                first_of.setdefault(rid, k)
            picked, rids = [picked[k] for k in first_of.values()], list(first_of)
        self.offsets.extend(picked)
        self.ids += rids

    def first(self, join: Join) -> int | None:
        """The smallest offset still needed (requests the join has forgotten are dropped first)."""
        ids, head = self.ids, self.head
        step = 256
        while head < len(ids):
            held, _, waiting = join.status(ids[head : head + step])
            needed = np.flatnonzero(held | waiting)
            if needed.shape[0]:
                head += int(needed[0])
                break
            head += step
            step = min(2 * step, 1 << 16)  # (a long run of requests forgotten since: fewer, larger looks)
        head = min(head, len(ids))
        if head > 4096 and 2 * head > len(ids):
            del self.offsets[:head], ids[:head]
            head = 0
        self.head = head
        return self.offsets[head] if head < len(ids) else None


def _firsts(placed: list[tuple[int, Any]], join: Join) -> tuple[list[int], list[str]]:
    """The place and request id of each ranking and feedback of ``placed`` (place, event) that may be the first
    of its request (:meth:`Requests.add`), in order."""
    chosen = [(place, event) for place, event in placed if type(event) in _RANKINGS or type(event) is Feedback]
    if not chosen:
        return [], []
    rids: list[str] = [event.request_id for _, event in chosen]
    held, fed, waiting = join.status(rids)
    is_feedback = np.array([type(event) is Feedback for _, event in chosen], dtype=np.bool_)
    first = np.flatnonzero(np.where(is_feedback, ~(waiting | fed), ~held)).tolist()
    return [chosen[k][0] for k in first], [rids[k] for k in first]


def _firsts_of_chunk(offsets: Sequence[int], chunk: Chunk, join: Join) -> tuple[list[int], list[str]]:
    """:func:`_firsts` of ``chunk`` (a batch whose event ``k`` is at ``offsets[k]``), by offset. Of its feedback
    columns, only the ids of the events whose request has had no feedback are decoded (feedback that was applied
    is no request's first)."""
    plain = chunk.plain
    if plain is not None and len(plain) == len(chunk.events):  # (every object a ranking the line reader read)
        first = np.flatnonzero(~join.held_at(plain.raw, plain.id_start, plain.id_end))
        rankings = plain.rankings
        places, rids = chunk.events_at[first].tolist(), [rankings[k].request_id for k in first.tolist()]
    else:
        places, rids = _firsts(list(zip(chunk.events_at.tolist(), chunk.events, strict=True)), join)
    columns = chunk.feedback
    if len(columns):
        maybe = np.flatnonzero(~join.fed_at(columns.text, columns.rid_start, columns.rid_end))
        if maybe.shape[0]:  # each request's first feedback of the batch (a later one is not its first)
            maybe = maybe[compiled.distinct_spans(columns.text, columns.rid_start[maybe], columns.rid_end[maybe])[1]]
        text = columns.text.tobytes() if maybe.shape[0] else b""
        found = [text[a:b].decode() for a, b in zip(columns.rid_start[maybe].tolist(),
                                                     columns.rid_end[maybe].tolist(), strict=True)]
        at = chunk.feedback_at[maybe].tolist()
        pending = join.pending
        if pending:  # feedback waiting for its ranking: this one is not its request's first either
            free = [rid not in pending for rid in found]
            found, at = list(compress(found, free)), list(compress(at, free))
        if places and found:  # both kinds: in the order of their places
            merged = sorted(zip(places + at, rids + found, strict=True), key=itemgetter(0))
            places, rids = [place for place, _ in merged], [rid for _, rid in merged]
        elif found:
            places, rids = at, found
    return [offsets[place] for place in places], rids


class Task:
    """Partition ``p`` of every input topic: its engine (whose join holds its requests and whose totals are its
    share), sources, needed offsets and rebuild progress."""

    __slots__ = ("engine", "join", "sources", "requests", "mute", "resume_watermark", "held", "flushed",
                 "announced", "announced_at", "generation", "windows", "restored", "waiting")

    def __init__(self, engine: Engine, now: float, checkpoint: Checkpoint | None,
                 generation: str | None = None) -> None:
        self.engine = engine
        self.join = engine.join
        # this ownership of the partition: a label, the regroup token, the worker's claim
        self.generation = os.urandom(4).hex() if generation is None else generation
        self.windows: tuple[int, int] | None = None  # where the full windows share of this ownership is stored
        self.restored = checkpoint
        #: The checkpoint's waiting feedback, until the rebuild is done and it replaces what re-reading left waiting
        #: (which depends on the order the topics are re-read in, and on event time, which stands still while muted).
        self.waiting = None if checkpoint is None else checkpoint.waiting
        self.sources = {kind: Source(now) for kind in KINDS}
        self.requests = {kind: Requests() for kind in JOINED}
        self.mute: dict[str, int] = {}
        self.resume_watermark = -math.inf
        self.held: list[tuple[str, list[int], list[Event]]] = []
        self.flushed = False
        self.announced = -math.inf  # the finalisation watermark last written to the regroup log
        self.announced_at = -math.inf
        if checkpoint is not None:
            self.mute = {k: e for k, e in checkpoint.processed.items() if e > checkpoint.start.get(k, e)}
            self.resume_watermark = checkpoint.watermark
            if not self.mute:  # (nothing to re-read: at once)
                self.restore_waiting()
            for kind in checkpoint.ended:  # (a re-read of the topic before its end opens and ends it again)
                if kind in self.sources:
                    self.sources[kind].ended = True
            for kind, start in checkpoint.start.items():
                # what comes before the checkpoint's start is in its share: never fed again, even when the consumer
                # reads from an older position (a reset to the group's committed offset that won over our seek)
                if kind in self.sources:
                    self.sources[kind].received = start

    @property
    def rebuilding(self) -> bool:
        return bool(self.mute)

    def restore_waiting(self) -> None:
        """The rebuild is done: the feedback waiting is the checkpoint's (when it stored it)."""
        if self.waiting is not None:
            self.join.restore_waiting(self.waiting)
            self.waiting = None


class PartitionedEngine:
    """Feeds engines from partitioned input with per-source watermarks and checkpoints.

    Each partition gets an engine of its own (built like ``engine``: the same configuration, label bounds,
    rolling windows and feedback delays), whose totals are the partition's share (``engine/shares.py``): a
    checkpoint stores it, a new owner restores it. Named sessions, query GSB and the A/B units span partitions:
    each partition's engine writes them to its :class:`~stream_eval.engine.regroup.RegroupSink`, and a
    :class:`~stream_eval.engine.regroup.SessionStage` on ``engine`` counts them. With ``engine.regroup`` set,
    the caller runs that stage (a worker: through the regroup log; :meth:`take_regrouped` gives the records);
    otherwise this object runs it itself.

    ``on_finalised(partition, batch)``: called with every batch of requests a partition finalises (default: the
    ``on_finalised`` of ``engine``, without the partition).
    """

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.monotonic,
                 on_finalised: Callable[[int, FinalisedBatch], None] | None = None, stages: int = 1) -> None:
        """``stages``: the partitions of the regroup log (its records are routed to them: ``engine/regroup.py``)."""
        self.engine = engine
        self.stages = stages
        self.clock = clock
        self.idle_timeout = engine.config.idle_timeout
        self.tasks: dict[int, Task] = {}
        self.watermark = -math.inf
        if on_finalised is None and engine.on_finalised is not None:
            callback = engine.on_finalised
            on_finalised = lambda partition, batch: callback(batch)  # noqa: E731  # the partition is not needed
        self.on_finalised = on_finalised
        self.external_stage = engine.regroup is not None
        #: The engines of the regroup stage's partitions held here (a worker's: ``engine/stages.py``), whose live
        #: windows move with the others' and whose totals are part of :meth:`totals`.
        self.stage_engines: Callable[[], list[Engine]] = list
        self._stage: SessionStage | None = None  # the stage this object runs (without ``engine.regroup``)
        self._stage_log = 0  # offsets of the records given to it

    def _new_engine(self, partition: int) -> Engine:
        main = self.engine
        callback = self.on_finalised
        engine = Engine(main.config, None if callback is None else (lambda batch: callback(partition, batch)),
                        main.batch_size)
        engine.labels = main.labels
        if main.windows is not None:
            RollingWindows(engine, main.windows.windows, main.windows.width)
        if main.delays is not None:
            FeedbackDelays(engine, main.delays.bounds.tolist())
        engine.regroup = RegroupSink(partition, self.stages)
        return engine

    # -- ownership ----------------------------------------------------------------------------------
    def assign(self, partition: int, checkpoint: Checkpoint | None = None,
               windows: dict[str, Any] | None = None, generation: str | None = None) -> dict[str, int]:
        """Take partition ``partition`` from its last checkpoint (``windows``: the full windows share that the
        checkpoint names), as ownership ``generation`` (default: a new random one); returns the offsets to start
        reading from (those known)."""
        engine = self._new_engine(partition)
        task = Task(engine, self.clock(), checkpoint, generation)
        if checkpoint is not None and checkpoint.watermark == math.inf:
            task.announced = math.inf  # (the end was written to the regroup log: events after it resume, in tick)
        if checkpoint is not None and checkpoint.share is not None:
            shares.restore(engine, checkpoint.share, windows)
        engine.regroup.begin(task.generation, 0 if checkpoint is None else checkpoint.regroup_seq)  # type: ignore[union-attr]  # set above
        self.tasks[partition] = task
        return dict(checkpoint.start) if checkpoint is not None else {}

    def drop(self, partition: int) -> None:
        """Forget partition ``partition`` and its share (its checkpoint is stored already, or not wanted)."""
        del self.tasks[partition]

    def checkpoint(self, partition: int) -> Checkpoint:
        """Partition ``partition``'s checkpoint, share included (its windows as a change since the last full
        windows share, :meth:`windows_share`, when the task has stored one; else in full)."""
        task = self.tasks[partition]
        checkpoint = Checkpoint(partition, watermark=max(task.join.watermark, task.resume_watermark),
                                owner=task.generation)
        if task.flushed:
            checkpoint.watermark = math.inf
        restored = task.restored
        for kind, source in task.sources.items():
            if source.next_offset is None:
                if restored is not None and kind in restored.processed:  # nothing fed yet: as restored
                    checkpoint.processed[kind], checkpoint.start[kind] = restored.processed[kind], restored.start[kind]
                continue
            processed = max(source.next_offset, task.mute.get(kind, source.next_offset))
            needed = task.requests[kind].first(task.join) if kind in task.requests else None
            checkpoint.processed[kind] = processed
            checkpoint.start[kind] = min(needed, source.next_offset) if needed is not None else source.next_offset
        checkpoint.ended = [kind for kind, source in task.sources.items() if source.ended]
        checkpoint.share = shares.take(task.engine, windows=task.windows is None)
        if task.waiting is not None:  # (still rebuilding)
            checkpoint.waiting = task.waiting
        else:  # (the delivery stores more than WAITING_BYTES of it apart: a checkpoint is one Kafka message)
            checkpoint.waiting = task.join.waiting_feedback()
        checkpoint.windows = task.windows
        checkpoint.regroup_seq = task.engine.regroup.seq  # type: ignore[union-attr]  # set in _new_engine
        return checkpoint

    def windows_share(self, partition: int) -> dict[str, Any] | None:
        """The full share of partition ``partition``'s windows (later checkpoints store what changed since);
        the caller stores it and tells where with :meth:`windows_stored`."""
        windows = self.tasks[partition].engine.windows
        return None if windows is None else windows.share(full=True)

    def windows_stored(self, partition: int, where: tuple[int, int]) -> None:
        self.tasks[partition].windows = where

    def engines(self) -> list[tuple[int, Task]]:
        """The partitions owned and their tasks (``task.engine``: the partition's share of the totals)."""
        return sorted(self.tasks.items())

    def take_routed(self, commit: bool = False,
                    partitions: Sequence[int] | None = None) -> list[tuple[int, bytes, bytes]]:
        """The records the partitions' engines (of ``partitions`` only, when given) wrote for the regroup log since
        the last call, as (stage partition, key, value); with ``commit``, each partition's followed by its commit
        marker (``engine/regroup.py``)."""
        records: list[tuple[int, bytes, bytes]] = []
        chosen = self.tasks if partitions is None else {p: self.tasks[p] for p in partitions if p in self.tasks}
        for _, task in sorted(chosen.items()):
            sink = task.engine.regroup
            assert isinstance(sink, RegroupSink)  # the sink _new_engine set
            if commit and sink.records:
                sink.commit(sink.seq)
            records += sink.take_routed()
        return records

    def take_regrouped(self, commit: bool = False) -> list[tuple[bytes, bytes]]:
        """:meth:`take_routed` with one stage partition: (key, value)."""
        if self.stages != 1:
            raise ValueError("records for several stage partitions: take_routed")
        return [(key, value) for _, key, value in self.take_routed(commit)]

    def totals(self) -> Engine:
        """One engine with the totals of the partitions owned and of ``engine`` (for a report)."""
        total = Engine(self.engine.config)
        total.merge(self.engine)
        for _, task in sorted(self.tasks.items()):
            total.merge(task.engine)
        for engine in self.stage_engines():
            total.merge(engine)
        total.watermark = self.engine.watermark
        return total

    # -- input --------------------------------------------------------------------------------------
    def feed(self, kind: str, partition: int, offsets: list[int], events: list[Event] | Chunk) -> list[Invalid]:
        """Messages of one topic-partition in offset order (``events``: one per offset, or a :class:`Chunk` of
        them); returns the invalid ones counted now."""
        task = self.tasks[partition]
        if not offsets:
            return []
        source = task.sources[kind]
        source.heard = self.clock()
        if isinstance(events, Chunk):
            if task.rebuilding or (source.received is not None and offsets[0] < source.received):
                return self.feed(kind, partition, offsets, events.as_list())  # type: ignore[arg-type]  # (rare: cut)
            source.received = offsets[-1] + 1
            return self._feed(task, kind, offsets, events)
        if source.received is not None and offsets[0] < source.received:
            # Delivered again (a fetch from before a rebalance, or a re-read): each offset counts once.
            skip = bisect_left(offsets, source.received)
            offsets, events = offsets[skip:], events[skip:]
            if not offsets:
                return []
        source.received = offsets[-1] + 1
        if not task.rebuilding:
            return self._feed(task, kind, offsets, events)
        muted_until = task.mute.get(kind)
        cut = 0 if muted_until is None else bisect_left(offsets, muted_until)
        if cut:
            self._feed(task, kind, offsets[:cut], events[:cut], muted=True)
            if offsets[-1] + 1 >= muted_until:  # type: ignore[operator]  # cut > 0 implies a bound
                del task.mute[kind]
        if cut < len(offsets):
            task.held.append((kind, offsets[cut:], events[cut:]))
        if task.rebuilding:
            return []
        engine = task.engine
        with engine.muted(engine.join):
            engine.finalise_until(task.resume_watermark)  # what the previous owner had finalised
        task.restore_waiting()
        held, task.held = task.held, []
        invalid: list[Invalid] = []
        for held_kind, held_offsets, held_events in held:
            invalid += self._feed(task, held_kind, held_offsets, held_events)
        return invalid

    def _feed(
        self, task: Task, kind: str, offsets: list[int], events: list[Event] | Chunk, muted: bool = False
    ) -> list[Invalid]:
        source = task.sources[kind]
        source.next_offset = offsets[-1] + 1
        watermark = source.watermark
        plain: list[Event] | Chunk = events
        invalid: list[Invalid] = []
        marks = False
        chunk = events if isinstance(events, Chunk) else None
        objects: list[Any] = events.events if isinstance(events, Chunk) else events
        places: Sequence[int] = range(len(objects)) if chunk is None else chunk.events_at.tolist()
        last_end = last_event = -1  # the places of the last end of the partition, and of the last event
        for at, event in zip(places, objects, strict=True):
            event_type = type(event)
            if event_type is Invalid:
                invalid.append(event)
                continue
            if event_type is Watermark:
                marks = True
                if event.end:
                    last_end = at
                    continue
            else:
                last_event = at
            ts: float | None = event.ts  # validated
            if ts is not None and ts > watermark:
                watermark = ts
        if chunk is not None and len(chunk.feedback):
            last_event = max(last_event, int(chunk.feedback_at[-1]))
            watermark = max(watermark, float(chunk.feedback.ts.max()))
        if last_event >= 0:
            task.flushed = False
        if last_end > last_event or last_event >= 0:
            source.ended = last_end > last_event  # an end stands until an event comes after it
        source.watermark = watermark
        if marks and chunk is None:
            plain = [e for e in objects if type(e) is not Watermark]
        if kind in task.requests:
            task.requests[kind].add(offsets, events, task.join)
        engine = task.engine
        if muted:
            with engine.muted(engine.join):
                engine.process(plain, event_time=False)
            return []
        engine.process(plain, event_time=False)
        return invalid

    # -- event time ---------------------------------------------------------------------------------
    def tick(self) -> float:
        """Advance every join and the engine's all-partition event time; returns that watermark."""
        now = self.clock()
        idle = self.idle_timeout
        overall = math.inf
        speaking = False
        for task in self.tasks.values():
            for kind in JOINED:  # judgments join nothing: they count at once and never hold event time back
                t = task.sources[kind].time(now, idle)
                if t is not None:
                    speaking = True
                    overall = min(overall, t)
        if not speaking:
            overall = self.watermark  # everything idle: event time stands still
        for partition, task in self.tasks.items():
            if task.rebuilding:
                continue
            engine = task.engine
            times = [t for t in (task.sources[k].time(now, idle) for k in JOINED) if t is not None]
            target = min(times) if times else overall
            if target == math.inf:
                if not task.flushed:
                    engine.finalise_open()
                    task.flushed = True
            elif target > task.join.watermark:
                engine.finalise_until(target)
            # the regroup stage closes sessions when every partition is this far
            finalised = math.inf if task.flushed else task.join.watermark
            if task.announced == math.inf and finalised < math.inf:  # ended, and events came after the end
                task.announced, task.announced_at = finalised, now
                engine.regroup.watermark(partition, finalised, resumed=True)  # type: ignore[union-attr]  # (as below)
            elif finalised > task.announced and (finalised == math.inf or now - task.announced_at >= ANNOUNCE_EVERY):
                task.announced, task.announced_at = finalised, now
                engine.regroup.watermark(partition, finalised)  # type: ignore[union-attr]  # set in _new_engine
        if not self.external_stage:
            self._run_stage()
        if overall == math.inf and self.watermark == -math.inf:
            # every source ended before event time ever moved (a log read to its end at once): the windows first
            # stand where the sources' event time reached, as they would have had the end markers come later
            reached = [s.watermark for task in self.tasks.values() for kind, s in task.sources.items()
                       if kind in JOINED and math.isfinite(s.watermark)]
            if reached:
                self._close_windows(min(reached))
        if overall > self.watermark or math.inf in (overall, self.watermark):
            # (from +inf down to a finite time: ended sources have events again, and event time goes on with them)
            self.watermark = overall
            self._close_windows(overall)
        return self.watermark

    def _close_windows(self, watermark: float) -> None:
        """Move every engine's windows to the all-partition event time ``watermark`` (sessions close on the stage)."""
        for task in self.tasks.values():
            task.engine.close(watermark, sessions=False)
        self.engine.close(watermark, sessions=False)
        for engine in self.stage_engines():
            engine.close(watermark, sessions=False)

    def _run_stage(self) -> None:
        """Without an external stage: the regroup records go to a stage on ``engine`` at once."""
        if self._stage is None:
            self._stage = SessionStage(self.engine, max(self.tasks, default=-1) + 1)
        records = [value for _, value in self.take_regrouped(commit=True)]
        if records:
            self._stage.feed(range(self._stage_log, self._stage_log + len(records)), records)
            self._stage_log += len(records)
