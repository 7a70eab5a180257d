"""The worker's reading order: feedback partitions read ahead of their rankings are paused, and only while those are
being read (``StreamWorker._pace_feedback``); the order of a batch's topics changes no result."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from aiokafka.structs import TopicPartition

from stream_eval.config import Config
from stream_eval.stream.settings import WorkerSettings
from stream_eval.stream.worker import (
    _FEEDBACK_AHEAD,
    _POLL_MS,
    _RANKINGS_QUIET,
    StreamWorker,
    _behind,
    _holds_records,
    _lagging,
    _wait_for_records,
)


class _Position:
    def __init__(self, position: int, lso: int = -1) -> None:
        self.position, self.has_valid_position, self.lso = position, True, lso


class FakeConsumer:
    """What ``_pace_feedback`` uses of aiokafka's consumer: assignment, pause/resume, and per partition the fetch
    position and the latest high-water mark (``behind``: their difference; 0 unless set), and the last stable
    offset (``stable``: -1, reading uncommitted records, unless set)."""

    def __init__(self, assigned: list[TopicPartition]) -> None:
        self.assigned = set(assigned)
        self.paused_set: set[TopicPartition] = set()
        self.behind: dict[TopicPartition, int] = {}
        self.stable: dict[TopicPartition, int] = {}
        positions = self

        class _Assignment:
            def state_value(self, tp: TopicPartition) -> _Position:
                return _Position(1000 - positions.behind.get(tp, 0), positions.stable.get(tp, -1))

        self._subscription = type("S", (), {"subscription": type("A", (), {"assignment": _Assignment()})()})()

    def highwater(self, tp: TopicPartition) -> int:
        return 1000

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


def test_feedback_waits_for_a_partitions_first_rankings_while_they_may_come() -> None:
    """Before any of its rankings is fed, a partition's feedback is ahead of them (a fetch of it would all wait in
    the join): paused while the rankings were assigned or heard within the quiet time, or the broker holds some, and
    not once they went quiet with none held (a topic with feedback only is read after a quiet time)."""
    now = [100.0]
    worker, consumer = _worker(now)  # (partitions just assigned: nothing fed)
    feedback = worker.topics.feedback
    worker._pace_feedback()
    assert consumer.paused() == {TopicPartition(feedback, 0), TopicPartition(feedback, 1)}
    _times(worker, 1, rankings=1000.0, feedback=-math.inf, heard=now[0])  # partition 1's first rankings fed
    worker._pace_feedback()
    assert consumer.paused() == {TopicPartition(feedback, 0)}
    now[0] += _RANKINGS_QUIET * 1.5  # partition 0's rankings still silent, the broker holds none of them
    worker._pace_feedback()
    assert consumer.paused() == set()
    consumer.behind[TopicPartition(worker.topics.rankings, 0)] = 10  # ... or it does: they are on their way
    worker._pace_feedback()
    assert consumer.paused() == {TopicPartition(feedback, 0)}


def test_a_partitions_feedback_is_paused_on_assignment_before_a_fetch_goes_out() -> None:
    """The feedback partitions newly assigned are paused in the assignment callback before anything is awaited
    (the partitions' claims are round trips to the broker, during which aiokafka's fetcher would ask for them)."""
    import asyncio

    now = [100.0]
    worker, consumer = _worker(now)
    for partition in (0, 1):
        worker.partitioned.drop(partition)
    consumer.paused_set.clear()
    seen: list[set[TopicPartition]] = []

    async def claim(partition: int, tps: list[TopicPartition]) -> list[tuple[TopicPartition, int]]:
        seen.append(consumer.paused())  # (what the fetcher would see while the claim is awaited)
        worker.partitioned.assign(partition)
        return []

    worker._claim = claim  # type: ignore[method-assign]
    asyncio.run(worker.on_partitions_assigned(list(consumer.assigned)))
    feedback = {TopicPartition(worker.topics.feedback, p) for p in (0, 1)}
    assert seen and all(paused == feedback for paused in seen)
    assert consumer.paused() == feedback  # (no rankings fed yet: they stay paused until some are)


def test_rankings_the_broker_still_holds_keep_their_feedback_paused_though_quiet() -> None:
    """A worker blocked a while (a long checkpoint) has fed no rankings for longer than the quiet time; they are not
    caught up while the broker holds rankings not handed out yet, and feedback read on would wait past
    ``max_waiting_feedback`` (given up: orphans replay does not have)."""
    now = [100.0]
    worker, consumer = _worker(now)
    rankings = TopicPartition(worker.topics.rankings, 0)
    consumer.behind[rankings] = 5000
    _times(worker, 0, rankings=1000.0, feedback=2000.0, heard=now[0])
    _times(worker, 1, rankings=1000.0, feedback=1000.0, heard=now[0])
    worker._pace_feedback()
    assert consumer.paused() == {TopicPartition(worker.topics.feedback, 0)}
    now[0] += _RANKINGS_QUIET * 10
    worker._pace_feedback()
    assert consumer.paused() == {TopicPartition(worker.topics.feedback, 0)}
    consumer.behind[rankings] = 0  # every ranking handed out: caught up, and quiet
    worker._pace_feedback()
    assert consumer.paused() == set()


def test_an_empty_fetch_is_caught_up_only_when_no_partition_read_holds_more() -> None:
    """The worker commits at once when it has read all there is (``_lagging`` false), not when a fetch comes back
    empty while the broker holds more (the next fetch on its way); a paused partition does not count, and with
    committed reads only, records after an open transaction (past the last stable offset) are not there yet."""
    _, consumer = _worker([100.0])
    tp = sorted(consumer.assigned)[0]
    assert not _lagging(consumer)
    consumer.behind[tp] = 3
    assert _lagging(consumer) and _behind(consumer, tp) == 3
    consumer.pause(tp)
    assert not _lagging(consumer)
    consumer.resume(tp)
    consumer.stable[tp] = 997  # read_committed: a transaction open from offset 997 on
    assert _behind(consumer, tp) == 0 and not _lagging(consumer)
    consumer.stable[tp] = 999
    assert _behind(consumer, tp) == 2 and _lagging(consumer)


def test_the_next_fetch_requests_go_out_before_a_batch_is_handled() -> None:
    """aiokafka's fetcher asks for a partition's next records only once the last are handed out: ``getmany`` wakes
    its task, which makes a task per broker that writes the request. ``_fetch`` lets that chain run before the batch
    is handled, so the broker answers meanwhile; without it the requests would wait for the handling to end."""

    async def main() -> list[str]:
        worker, consumer = _worker([100.0])
        events: list[str] = []
        woken = asyncio.Event()

        async def fetcher() -> None:  # (aiokafka's _fetch_requests_routine, then its _proc_fetch_request)
            await woken.wait()

            async def request() -> None:
                events.append("request written")

            asyncio.get_running_loop().create_task(request())
            await asyncio.sleep(3600)

        async def getmany(timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list[Any]]:
            woken.set()  # (the records handed out: the fetcher is notified)
            return {sorted(consumer.assigned)[0]: ["a record"]}

        consumer.getmany = getmany  # type: ignore[attr-defined]
        task = asyncio.get_running_loop().create_task(fetcher())
        await asyncio.sleep(0)  # (the fetcher waits)
        batch = await worker._fetch(consumer, 0)
        events.append(f"batch of {sum(map(len, batch.values()))} handed to the worker")
        task.cancel()
        return events

    assert asyncio.run(main()) == ["request written", "batch of 1 handed to the worker"]


class _Fetcher:
    """The part of aiokafka's ``Fetcher`` the loop's wait reads: its records not handed out, and its waiters (futures
    it completes when a fetch response with records comes)."""

    def __init__(self) -> None:
        self._records: dict[Any, Any] = {}
        self._fetch_waiters: set[asyncio.Future[Any]] = set()

    def _create_fetch_waiter(self) -> asyncio.Future[Any]:
        waiter = asyncio.get_running_loop().create_future()
        self._fetch_waiters.add(waiter)
        waiter.add_done_callback(self._fetch_waiters.remove)  # (as aiokafka's: once, or it raises)
        return waiter

    def records_came(self) -> None:
        for waiter in list(self._fetch_waiters):
            waiter.set_result(None)


class _Consumer:
    def __init__(self) -> None:
        self._fetcher = _Fetcher()


def test_the_loop_wakes_for_records_of_either_consumer_not_only_the_input() -> None:
    """With nothing to hand out, the loop waits for the input's or the stage's next records, whichever come first:
    regroup records that come while it waits are applied at once, not after an input fetch's timeout (and the
    waiters left are dropped from both fetchers)."""

    async def waited(which: int) -> float:
        consumers = (_Consumer(), _Consumer())
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, consumers[which]._fetcher.records_came)
        start = loop.time()
        await _wait_for_records(consumers, 20_000)
        took = loop.time() - start
        await asyncio.sleep(0)  # (a future's done callbacks run in the next turn)
        assert all(not c._fetcher._fetch_waiters for c in consumers)
        return took

    assert asyncio.run(waited(0)) < 5.0  # (the input's records)
    assert asyncio.run(waited(1)) < 5.0  # (the stage's: without a waiter on it, 20 s)


def test_the_wait_times_out_and_without_aiokafkas_waiters_looks_again_soon() -> None:
    async def waited(consumers: tuple[Any, ...], timeout_ms: int) -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await _wait_for_records(consumers, timeout_ms)
        return loop.time() - start

    assert 0.04 <= asyncio.run(waited((_Consumer(), _Consumer()), 50)) < 5.0
    assert asyncio.run(waited((_Consumer(), object()), 20_000)) < _POLL_MS / 1000 + 5.0  # (polls: not 20 s)


def test_records_held_by_a_fetcher_are_seen_and_aiokafkas_fetcher_has_what_the_wait_reads() -> None:
    """The stage's records fetched while the loop was busy (a commit's round trips) are handed out without a wait;
    and the installed aiokafka's fetcher has the waiters and the records the wait reads, so it does not fall back to
    polling unnoticed."""
    from aiokafka.consumer.fetcher import Fetcher

    consumer = _Consumer()
    assert not _holds_records(consumer) and not _holds_records(object())
    consumer._fetcher._records[TopicPartition("regroup", 0)] = "a fetch result"
    assert _holds_records(consumer)
    assert callable(getattr(Fetcher, "_create_fetch_waiter", None))
    import inspect
    assert "self._records" in inspect.getsource(Fetcher.__init__)


def _loop_worker() -> tuple[StreamWorker, _Consumer, _Consumer]:
    """A worker whose input and stage consumers hand nothing out (``getmany``) and have fetchers to wait on."""
    worker, _ = _worker([100.0])
    consumers = (_Consumer(), _Consumer())
    for consumer in consumers:
        async def getmany(timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, Any]:
            await asyncio.sleep(timeout_ms / 1000)  # (nothing comes: the whole timeout)
            return {}

        consumer.getmany = getmany  # type: ignore[attr-defined]
    worker._consumer, worker._stage_consumer = consumers
    return worker, *consumers


def _rebalancing_now(consumer: _Consumer, now: bool) -> None:
    consumer._subscription = type("S", (), {"reassignment_in_progress": now})()  # type: ignore[attr-defined]


def test_the_loops_input_wait_ends_when_the_stage_gets_records() -> None:
    """The loop's wait for input ends when the stage consumer's records come (not after the input's timeout); it does
    not wait at all when the stage's records were stored meanwhile (a commit's round trips), or the input's were (a
    fetch error waited out), and it waits out its time when the stage consumer holding records is rebalancing (it
    would not hand them out)."""

    async def waited(setup: Any, wait_ms: int = 20_000) -> float:
        worker, input_consumer, stage = _loop_worker()
        _rebalancing_now(stage, False)
        setup(asyncio.get_running_loop(), input_consumer, stage)
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await worker._next_input(wait_ms) == {}
        return loop.time() - start

    def stage_records_come(loop: Any, _: _Consumer, stage: _Consumer) -> None:
        loop.call_later(0.01, stage._fetcher.records_came)

    def stage_holds_records(_: Any, __: _Consumer, stage: _Consumer) -> None:
        stage._fetcher._records[TopicPartition("regroup", 0)] = "a fetch result"

    def input_holds_records(_: Any, input_consumer: _Consumer, __: _Consumer) -> None:
        input_consumer._fetcher._records[TopicPartition("rankings", 0)] = "a fetch result"

    def stage_rebalancing(loop: Any, input_consumer: _Consumer, stage: _Consumer) -> None:
        stage_holds_records(loop, input_consumer, stage)
        _rebalancing_now(stage, True)

    assert asyncio.run(waited(stage_records_come)) < 5.0
    assert asyncio.run(waited(stage_holds_records)) < 1.0
    assert asyncio.run(waited(input_holds_records)) < 1.0
    assert 0.04 <= asyncio.run(waited(stage_rebalancing, 50)) < 5.0


def test_input_partitions_added_while_the_group_runs_stop_the_worker_with_a_settings_error() -> None:
    """Partitions added to the input topics of a running group: the worker given the new ones claimed them from
    checkpoint partitions that do not exist, retried that for ever as a broker outage (stream_eval_broker_up 0,
    /readyz 503), and the whole group stalled. It stops instead, with the message a restart gives (exit code 2)."""
    from stream_eval.stream.kafka import TopicSettingsError

    worker, _ = _worker([100.0])
    worker._stop = asyncio.Event()
    grown = [TopicPartition(topic, p) for topic in worker.topics.inputs for p in (2, 3)]
    asyncio.run(asyncio.wait_for(worker.on_partitions_assigned(grown), 5))  # (a claim would wait for the broker)
    assert isinstance(worker.fatal, TopicSettingsError)
    assert "input partitions [2, 3] assigned, but the input topics had 2 partitions" in str(worker.fatal)
    assert worker._stop.is_set() and sorted(worker.partitioned.tasks) == [0, 1]


def test_a_worker_without_live_windows_is_refused_with_a_message() -> None:
    """``windows = []`` (which replay accepts) crashed the worker at start with a traceback from its windows."""
    import dataclasses

    import pytest

    from stream_eval.config import ConfigError

    with pytest.raises(ConfigError, match=r"windows = \[\]: a worker keeps live windows"):
        StreamWorker(WorkerSettings(["127.0.0.1:1"], prefix="w.", group="w"), dataclasses.replace(Config(), windows=()))
