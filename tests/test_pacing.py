"""The worker's reading order: feedback partitions read ahead of their rankings are paused, and only while those are
being read (``StreamWorker._pace_feedback``), and the feedback fetched ahead waits for them
(``StreamWorker._hold_ahead``); the order of a batch's topics changes no result."""

from __future__ import annotations

import asyncio
import math

import orjson
from aiokafka.structs import TopicPartition

from stream_eval.config import Config
from stream_eval.stream.settings import WorkerSettings
from stream_eval.stream.worker import _FEEDBACK_AHEAD, _HOLD_AT_MOST, _RANKINGS_QUIET, StreamWorker


class FakeConsumer:
    """What ``_pace_feedback`` uses of aiokafka's consumer."""

    def __init__(self, assigned: list[TopicPartition]) -> None:
        self.assigned = set(assigned)
        self.paused_set: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_set)

    def pause(self, *tps: TopicPartition) -> None:
        self.paused_set.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused_set.difference_update(tps)


def _worker(now: list[float]) -> tuple[StreamWorker, FakeConsumer]:
    worker = StreamWorker(WorkerSettings(["127.0.0.1:1"], prefix="pace.", group="pace", partitions=2), Config())
    worker.partitioned.clock = lambda: now[0]
    for partition in (0, 1):
        worker.partitioned.assign(partition)
    topics = worker.topics
    consumer = FakeConsumer([TopicPartition(topic, p) for topic in topics.inputs for p in (0, 1)])
    worker._consumer = consumer
    return worker, consumer


def _times(worker: StreamWorker, partition: int, rankings: float, feedback: float, heard: float) -> None:
    sources = worker.partitioned.tasks[partition].sources
    sources["ranking"].watermark, sources["feedback"].watermark = rankings, feedback
    sources["ranking"].heard = heard


def test_a_feedback_partition_ahead_of_its_rankings_is_paused_until_they_catch_up() -> None:
    now = [100.0]
    worker, consumer = _worker(now)
    feedback = worker.topics.feedback
    _times(worker, 0, rankings=1000.0, feedback=1000.0 + 5 * _FEEDBACK_AHEAD, heard=now[0])
    _times(worker, 1, rankings=1000.0, feedback=1000.0 + _FEEDBACK_AHEAD / 2, heard=now[0])
    worker._pace_feedback()
    assert consumer.paused() == {TopicPartition(feedback, 0)}  # never a rankings or judgments partition
    _times(worker, 0, rankings=1010.0, feedback=1005.0, heard=now[0])  # the rankings caught up
    worker._pace_feedback()
    assert consumer.paused() == set()


def test_rankings_that_went_quiet_or_ended_never_hold_their_feedback_back() -> None:
    now = [100.0]
    worker, consumer = _worker(now)
    _times(worker, 0, rankings=1000.0, feedback=2000.0, heard=now[0])
    worker._pace_feedback()
    assert consumer.paused()
    now[0] += _RANKINGS_QUIET * 1.5  # nothing more read from the rankings: the end of what the topic holds
    worker._pace_feedback()
    assert consumer.paused() == set()
    _times(worker, 0, rankings=1000.0, feedback=2000.0, heard=now[0])
    worker._pace_feedback()
    assert consumer.paused()
    worker.partitioned.tasks[0].sources["ranking"].ended = True
    worker._pace_feedback()
    assert consumer.paused() == set()


def test_no_event_time_yet_pauses_nothing() -> None:
    now = [100.0]
    worker, consumer = _worker(now)
    _times(worker, 0, rankings=-math.inf, feedback=1000.0, heard=now[0] - 10 * _RANKINGS_QUIET)
    worker._pace_feedback()
    assert consumer.paused() == set()


T0 = 1.7e9  # event time of the first request (2023)


class Record:
    """What the worker reads of a fetched Kafka record."""

    def __init__(self, offset: int, ts: float, value: bytes) -> None:
        self.offset, self.timestamp, self.value = offset, int(ts * 1000), value


def _rankings(first: int, times: list[float]) -> list[Record]:
    return [Record(first + k, t, orjson.dumps({"type": "ranking", "request_id": f"r{int(t)}", "items": ["a", "b"], "ts": t}))
            for k, t in enumerate(times)]


def _clicks(first: int, times: list[float]) -> list[Record]:
    return [Record(first + k, t + 0.5, orjson.dumps({"type": "feedback", "request_id": f"r{int(t)}", "item": "b",
                                                       "ts": t + 0.5}))
            for k, t in enumerate(times)]


def test_feedback_fetched_ahead_of_its_rankings_waits_for_them_and_joins_them() -> None:
    """Clicks stamped more than _FEEDBACK_AHEAD past the rankings read wait, unfed (their partition paused), until the
    rankings catch up; then they join their requests directly, none through the pending table."""
    now = [100.0]
    worker, consumer = _worker(now)
    rankings, feedback = (TopicPartition(worker.topics.for_type(kind), 0) for kind in ("ranking", "feedback"))
    times = [T0 + k for k in range(10)]
    asyncio.run(worker._handle({rankings: _rankings(0, times[:3]), feedback: _clicks(0, times)}))
    task = worker.partitioned.tasks[0]
    assert [r.offset for r in worker._ahead[feedback][1]] == list(range(3, 10))  # ahead of T0 + 2 + 1 s: held
    assert worker.events_seen == 3 + 3 and task.sources["feedback"].next_offset == 3
    worker._pace_feedback()
    assert consumer.paused() == {feedback}
    asyncio.run(worker._handle({rankings: _rankings(3, times[3:])}))  # the rankings catch up: all fed
    assert not worker._ahead and worker.events_seen == 20 and task.sources["feedback"].next_offset == 10
    assert not task.join.pending and task.join.counts["feedback", "ok"] == 10
    worker._pace_feedback()
    assert consumer.paused() == set()


def test_feedback_waits_for_no_rankings_that_ended_went_quiet_or_for_long() -> None:
    now = [100.0]
    worker, _ = _worker(now)
    rankings, feedback = (TopicPartition(worker.topics.for_type(kind), 0) for kind in ("ranking", "feedback"))
    times = [T0 + k for k in range(10)]
    asyncio.run(worker._handle({rankings: _rankings(0, times[:2]), feedback: _clicks(0, times[:5])}))
    assert len(worker._ahead[feedback][1]) == 3
    now[0] += _RANKINGS_QUIET * 1.5  # the rankings topic has nothing more: it holds nothing back
    asyncio.run(worker._handle({}))
    assert not worker._ahead and worker.partitioned.tasks[0].sources["feedback"].next_offset == 5
    asyncio.run(worker._handle({rankings: _rankings(2, times[2:4]), feedback: _clicks(5, times[5:])}))
    assert len(worker._ahead[feedback][1]) == 5  # all past T0 + 3 + 1 s
    held = worker._ahead[feedback]
    worker._ahead[feedback] = (held[0], held[1], held[2] - _HOLD_AT_MOST)  # held for _HOLD_AT_MOST already
    asyncio.run(worker._handle({}))
    assert not worker._ahead and worker.partitioned.tasks[0].sources["feedback"].next_offset == 10
