"""Helpers shared by test modules (imported as ``support``: pytest puts this directory on ``sys.path``)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from stream_eval.config import Config
from stream_eval.stream.apache_kafka import ApacheKafka
from stream_eval.stream.broker import Broker

ROOT = Path(__file__).resolve().parent.parent

#: The kinds of broker the Kafka tests run on (the ``broker_kind`` fixture's parameters).
BROKER_KINDS = ("tansu", "kafka")


def make_broker(kind: str, port: int, **options: Any) -> Broker:
    """A broker of ``kind`` (not started): the Tansu binary, or Apache Kafka from ``.cache/kafka/jars``
    (``scripts/kafka/fetch``). ``options``: those of :class:`Broker` (``log``, ``advertised_port``, ...)."""
    if kind == "kafka":
        return ApacheKafka(port, jars=ROOT / ".cache" / "kafka" / "jars", **options)
    if kind == "tansu":
        return Broker(port, **options)
    raise ValueError(f"unknown broker kind {kind!r} (one of {', '.join(BROKER_KINDS)})")


def approx(value: Any) -> Any:
    """``value`` with every float replaced by ``pytest.approx(rel=1e-12)``: sums of the same floats taken in
    another order (other partitions, other batches) agree to 1e-12, not bit for bit."""
    if isinstance(value, dict):
        return {k: approx(v) for k, v in value.items()}
    if isinstance(value, list):
        return [approx(v) for v in value]
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-12, abs=1e-12)
    return value


def AbstractTimeConfig(**settings: Any) -> Config:  # noqa: N802  # stands in for the Config class
    """A :class:`Config` for tests that model event time with small numbers (``ts`` = 0, 5, 100 s): the range of
    valid event times is widened to any time from 1800 to 5000, since by default a time before 2000-01-01 is
    invalid (docs/contract.md §1). Tests of that default use :class:`Config` itself."""
    return Config(**{"min_ts": -5.4e9, "max_ts": 9.5e10, **settings})


async def read_topic(bootstrap: str, topic: str, expected: int = 0, timeout: float = 120) -> list[Any]:
    """Every record of ``topic``: until there are ``expected``, then until a fetch of 1 s brings nothing (so that
    records beyond the expected number, duplicates, are read too)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    found: list[Any] = []
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                found += records
            if (not batch and len(found) >= expected) or asyncio.get_running_loop().time() > deadline:
                break
    finally:
        await consumer.stop()
    return found


def held_stages(workers: Sequence[Any]) -> dict[int, Any]:
    """The regroup stage partitions the workers hold (``HeldStage``), by number (a partition held twice, during a
    hand-over: the last worker's)."""
    return {q: held for worker in workers for q, held in worker.stages.held.items()}


def stages_done(workers: Sequence[Any]) -> bool:
    """Every partition of the regroup stage is held by one of the workers and has closed everything (its
    watermark at the end of every input partition), and partition 0 has every partition's last looks."""
    held = held_stages(workers)
    count = max((worker.stages.count for worker in workers), default=1)
    return len(held) == count and all(h.stage.watermark == math.inf for h in held.values()) and \
        min(held[0].engine.ledger.merger.progress_of) == math.inf  # partition 0 merged every partition's looks


def stage_sessions(worker: Any) -> int:
    """Named sessions scored by the stage partitions a worker holds."""
    return sum(engine.overall().sessions for engine in worker.stages.engines())
