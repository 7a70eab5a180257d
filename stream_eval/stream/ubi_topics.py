"""``stream-eval worker --input-format ubi``: the worker reading OpenSearch UBI topics itself.

The queries topic (``ubi_queries`` after the topic prefix, ``--ubi-queries-topic``) stands where the rankings topic
stands, and the events topic (``ubi_events``, ``--ubi-events-topic``) where the feedback topic does: the worker
takes partition ``p`` of both together (one task, as rankings and feedback), and the join keeps a query and its
events together only when they are in the same partition number. So a UBI producer must key the records of both
topics by ``query_id`` with one partitioner (Kafka's default, murmur2 of the key, as the Java client, aiokafka and
``stream-eval produce`` use) and give both topics the same partition count; the worker does not re-key.

Each record is converted by :class:`~stream_eval.events.ubi.UbiConverter`, the code of ``replay --input-format
ubi`` (one converter a partition: what it keeps, hits and sessions, is per ``query_id``), and its event decoded by
the same decoder. Records are held back ``hold`` of event time as there (so that a query takes its ``session_id``
from its events, which UBI puts there), then passed on per topic in offset order: what the engine has been fed is
always a prefix of each topic-partition, so the checkpoints' offsets stay right and a new owner of a partition
reads again what was held. Event time here is the smaller of the latest ``timestamp`` of the two topics of the
partition (a topic ended by an end watermark, or silent for ``idle_timeout``, holds nothing back): end watermarks
(``{"type": "watermark", "end": true}``, the message ``produce`` ends with) on both topics of a partition release
everything before them.

What is not rebuilt after a restart: a request still open at the checkpoint whose session came only from an event
that makes no feedback (an ``impression``) read before the checkpoint's start offset of the events topic (the
checkpoints keep the offsets of the first feedback of each open request, not of such events).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from stream_eval.config import Config
from stream_eval.events.messages import _not_future, decode_message
from stream_eval.events.schema import CompactRanking, Event, Invalid, Watermark
from stream_eval.events.ubi import UbiConverter, UbiCounts, UbiLine, UbiSettings, decoded, message_record

#: The input topic kinds of the two UBI topics, by the converter's input number (0 queries, 1 events).
KINDS = ("ranking", "feedback")
Released = tuple[str, list[int], list[CompactRanking | Event | Invalid]]


class _Partition:
    """One partition of the two topics: its converter, and per topic the records read and not passed on yet
    (offset, event time they wait for, what they are, the message, where it is), the latest time read, whether it
    has ended, when it was last heard from, and the offset after the last message read."""

    __slots__ = ("task", "converter", "pending", "last", "ended", "heard", "read_to")

    def __init__(self, task: object, converter: UbiConverter, now: float) -> None:
        self.task = task
        self.converter = converter
        self.pending: tuple[deque[tuple[int, float, Any, bytes, str]], ...] = (deque(), deque())
        self.last = [-math.inf, -math.inf]
        self.ended = [False, False]
        self.heard = [now, now]
        self.read_to: list[int | None] = [None, None]


class UbiTopics:
    """The UBI records of the partitions a worker owns, as the events of its input topics."""

    def __init__(self, config: Config, settings: UbiSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.settings, self.clock = config, settings, clock
        self.counts = UbiCounts()  # over every partition this worker has read
        self.partitions: dict[int, _Partition] = {}

    def _partition(self, partition: int, task: object) -> _Partition:
        """The state of ``partition`` for ``task`` (the worker's task of it: a new one starts afresh, from the offsets
        of its checkpoint, so what an earlier ownership read is forgotten)."""
        state = self.partitions.get(partition)
        if state is None or state.task is not task:
            converter = UbiConverter(self.config, self.settings, self.counts)
            state = self.partitions[partition] = _Partition(task, converter, self.clock())
        return state

    def read(self, task: object, partition: int, kind: str, topic: str, records: Sequence[Any],
             not_after: float = math.inf) -> list[Released]:
        """Messages of one topic-partition (aiokafka records, in offset order): the events released by them, per
        kind, with their offsets, to feed in the order given."""
        state = self._partition(partition, task)
        k = KINDS.index(kind)
        now = state.heard[k] = self.clock()
        pending, converter = state.pending[k], state.converter
        for record in records:
            offset = record.offset
            if state.read_to[k] is not None and offset < state.read_to[k]:  # delivered again: read once
                continue
            state.read_to[k] = offset + 1
            where, raw = f"{topic}/{partition}@{offset}", record.value or b""
            value, parsed = message_record(record.value, where)
            if type(parsed) is dict and parsed.get("type") == "watermark":  # our watermark, not a UBI record
                mark = decode_message(record.value, kind, self.config, record.timestamp / 1000.0, where)
                due = -math.inf
                if type(mark) is Watermark:
                    state.ended[k] = mark.end
                    if not mark.end and isinstance(mark.ts, float | int):
                        due = float(mark.ts)
                        state.last[k] = max(state.last[k], due)
                pending.append((offset, due, mark, raw, where))
                continue
            state.ended[k] = False  # an end stands until a record comes after it
            made = converter.read(k, where, value, raw)
            if isinstance(made, Invalid):
                pending.append((offset, -math.inf, made, raw, where))
            elif isinstance(made, float):  # a record that makes no event (an action not mapped): its time counts
                state.last[k] = max(state.last[k], made)
            elif made is not None:
                state.last[k] = max(state.last[k], made.ts)
                pending.append((offset, made.ts, made, raw, where))
        return self._release(state, now, not_after)

    def release(self, tasks: dict[int, Any], not_after: float = math.inf) -> list[tuple[int, Released]]:
        """What the passing of wall clock releases (a topic gone silent for ``idle_timeout`` no longer holds the
        other back), per partition of ``tasks`` (the worker's tasks; the state of others is dropped)."""
        out: list[tuple[int, Released]] = []
        now = self.clock()
        for partition, state in list(self.partitions.items()):
            if tasks.get(partition) is not state.task:
                del self.partitions[partition]
            elif state.pending[0] or state.pending[1]:
                out += [(partition, released) for released in self._release(state, now, not_after)]
        return out

    def _release(self, state: _Partition, now: float, not_after: float) -> list[Released]:
        idle = self.config.idle_timeout
        times = [math.inf if state.ended[k] else state.last[k] for k in (0, 1)
                 if state.ended[k] or now - state.heard[k] <= idle]
        if not times:
            return []  # both silent: event time stands still
        converter = state.converter
        until = min(times) - converter.hold
        out: list[Released] = []
        for k, kind in enumerate(KINDS):
            pending = state.pending[k]
            offsets: list[int] = []
            items: list[UbiLine | Invalid | Watermark] = []
            raws: list[bytes] = []
            wheres: list[str] = []
            while pending and pending[0][1] <= until:
                offset, _, item, raw, where = pending.popleft()
                if type(item) is not Invalid and type(item) is not Watermark:
                    item = converter.make(item)
                    if item is None:  # an event of a query without hits, counted
                        continue
                offsets.append(offset)
                items.append(item)
                raws.append(raw)
                wheres.append(where)
            if offsets:
                out.append((kind, offsets, self._decoded(items, raws, wheres, not_after)))
        converter.forget(until)
        return out

    def _decoded(self, items: list[UbiLine | Invalid | Watermark], raws: list[bytes], wheres: list[str],
                 not_after: float) -> list[CompactRanking | Event | Invalid]:
        """The events of released items, decoded as replay decodes them; a rejected one keeps its message's bytes
        (for the dead letters); an event from the future is rejected as on the other topics."""
        events = next(decoded(items, self.config, batch=len(items) + 1))
        for index, event in enumerate(events):
            if type(event) is Invalid:
                event.raw = raws[index]
            elif not_after < math.inf:
                events[index] = _not_future(event, not_after, self.config, wheres[index], raws[index])  # type: ignore[arg-type]  # a compact ranking has its ts too
        return events
