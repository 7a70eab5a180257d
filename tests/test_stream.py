"""The worker on a real broker: a log sent through Kafka gives the replay's numbers; two workers give one's totals."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import approx

from stream_eval.config import Config
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.engine.replay import replay
from stream_eval.events.join import EventCounts
from stream_eval.simulate import SimulationConfig, simulate_lines
from stream_eval.stream.kafka import topics
from stream_eval.stream.produce import send_lines
from stream_eval.stream.worker import StreamWorker, WorkerSettings

PARTITIONS = 4


def _log(requests: int, seed: int) -> list[bytes]:
    """Graded labels (shown and unshown items), clicks, late, duplicate, orphan, out-of-order and invalid events."""
    sim = SimulationConfig(requests=requests, seed=seed, judgments=True, interleaving=True, label_rate=0.3,
                           late_fraction=0.03, duplicate_fraction=0.05, orphan_fraction=0.03,
                           invalid_fraction=0.02, shuffle_window=20.0)
    return list(simulate_lines(sim))


class Records:
    def __init__(self) -> None:
        self.by_id: dict[str, dict[str, Any]] = {}

    def __call__(self, batch: FinalisedBatch) -> None:
        for record in batch.records():
            self.by_id[record["request_id"]] = record


def _replay(lines: list[bytes], tmp_path: Path) -> tuple[Engine, Records]:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(lines))
    records = Records()
    return replay([str(path)], Config(), records), records


async def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.1)


async def _read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[Any]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    found: list[Any] = []
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while len(found) < expected and asyncio.get_running_loop().time() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                found += records
        await asyncio.sleep(0.5)  # anything beyond the expected number would be a duplicate
        for records in (await consumer.getmany(timeout_ms=500)).values():
            found += records
    finally:
        await consumer.stop()
    return found


async def _running(worker: StreamWorker) -> tuple[asyncio.Task[None], asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    return task, stop


async def _stop(*running: tuple[asyncio.Task[None], asyncio.Event]) -> None:
    for _, stop in running:
        stop.set()
    for task, _ in running:
        await asyncio.wait_for(task, 60)


def _run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(main())


def test_kafka_gives_the_replay_numbers(broker: str, tmp_path: Path) -> None:
    lines = _log(5000, seed=11)
    expected, expected_records = _replay(lines, tmp_path)
    prefix = "parity."
    settings = WorkerSettings([broker], prefix=prefix, group="parity", partitions=PARTITIONS)

    async def main() -> None:
        await send_lines(lines, [broker], topics(prefix), partitions=PARTITIONS)
        worker = StreamWorker(settings, Config())
        running = await _running(worker)
        await _until(lambda: worker.partitioned.watermark == math.inf, 120, "the end of every partition")
        await _stop(running)
        report, want = worker.engine.report(), expected.report()
        for section in ("events", "overall", "groups", "gsb", "ab"):
            assert report[section] == approx(want[section]), section
        found = await _read_topic(broker, topics(prefix).request_metrics, len(expected_records.by_id))
        records = {r.key.decode(): orjson.loads(r.value) for r in found}
        assert len(found) == len(records) == len(expected_records.by_id)
        assert records == expected_records.by_id
        dead = await _read_topic(broker, topics(prefix).dead_letters, expected.counts.summary()["invalid"])
        assert len(dead) == expected.counts.summary()["invalid"]
        sent = {line.strip() for line in lines}
        assert all(record.value.strip() in sent for record in dead)  # the original bytes
        assert all(dict(record.headers)["reason"] for record in dead)

    _run(main)


def test_two_workers_and_a_rebalance_count_everything_once(broker: str, tmp_path: Path) -> None:
    """Worker A reads the first half alone; B joins (A gives up partitions mid-stream); then the second half."""
    lines = _log(5000, seed=12)
    expected, expected_records = _replay(lines, tmp_path)
    prefix = "rebalance."
    settings = WorkerSettings([broker], prefix=prefix, group="rebalance", partitions=PARTITIONS)
    half = len(lines) // 2

    async def main() -> None:
        await send_lines(lines[:half], [broker], topics(prefix), partitions=PARTITIONS, flush=False)
        a, b = StreamWorker(settings, Config()), StreamWorker(settings, Config())
        running_a = await _running(a)
        await _until(lambda: a.events_seen >= half * 0.9, 120, "worker A to read the first half")
        running_b = await _running(b)
        await _until(lambda: bool(b.partitioned.units), 120, "worker B to get partitions")
        await send_lines(lines[half:], [broker], topics(prefix), partitions=PARTITIONS)
        await _until(lambda: a.partitioned.watermark == math.inf and b.partitioned.watermark == math.inf, 120,
                     "the end of every partition on both workers")
        await _stop(running_a, running_b)
        counts = EventCounts(a.engine.counts + b.engine.counts)
        assert counts.summary() == expected.counts.summary()
        overall = a.engine.overall()
        overall += b.engine.overall()
        want = expected.overall()
        assert overall.requests == want.requests and overall.empty == want.empty
        assert overall.moments.total.tolist() == pytest.approx(want.moments.total.tolist(), rel=1e-12)
        found = await _read_topic(broker, topics(prefix).request_metrics, len(expected_records.by_id))
        records = {r.key.decode(): orjson.loads(r.value) for r in found}
        assert len(found) == len(records) == len(expected_records.by_id)
        assert records == expected_records.by_id

    _run(main)
