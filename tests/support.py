"""Helpers shared by test modules (imported as ``support``: pytest puts this directory on ``sys.path``)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import os
import subprocess
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest

from stream_eval.config import Config
from stream_eval.engine.engine import Engine
from stream_eval.engine.partitions import KINDS, Checkpoint, PartitionedEngine
from stream_eval.engine.regroup import RegroupSink
from stream_eval.events.messages import decode_message_chunk, decode_messages
from stream_eval.events.schema import _guess_kind
from stream_eval.stream.apache_kafka import ApacheKafka
from stream_eval.stream.broker import Broker

ROOT = Path(__file__).resolve().parent.parent

#: The kinds of broker the Kafka tests run on (the ``broker_kind`` fixture's parameters).
BROKER_KINDS = ("tansu", "kafka")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without its ``STREAM_EVAL_*`` variables, and ``extra``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("STREAM_EVAL_")}, **extra}


def run_cli(*args: str | Path, stdin: bytes = b"", env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """``stream-eval ARGS`` run in this process (``stream_eval.cli.main``, with stdin, stdout and stderr of its own,
    and the environment :func:`clean_env` gives with ``env``): what ``python -m stream_eval.cli ARGS`` prints and
    returns, without a second of interpreter start-up and imports per call. Tests of the process itself (the
    console script, the working directory, signals) start one instead."""
    from stream_eval.cli import main

    argv = [str(arg) for arg in args]
    written = io.BytesIO(), io.BytesIO()  # (under text streams: the commands write bytes to their .buffer too)
    out, err = (io.TextIOWrapper(data, encoding="utf-8") for data in written)
    piped = io.TextIOWrapper(io.BufferedReader(io.BytesIO(stdin)), encoding="utf-8")  # (peek, as a pipe's)
    with mock.patch.dict(os.environ, clean_env(**(env or {})), clear=True), mock.patch.object(sys, "stdin", piped), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as done:  # (argparse's usage errors)
            code = done.code if isinstance(done.code, int) else 1 if done.code else 0
        out.flush()
        err.flush()
    stdout, stderr = (data.getvalue().decode() for data in written)
    return subprocess.CompletedProcess(["stream-eval", *argv], code, stdout, stderr)


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


#: The input partitions of the in-process partitioned runs (:func:`route`).
PARTITIONS = 3
#: Messages of each (kind, partition) of the input topics: (offset, value), in offset order.
Log = dict[tuple[str, int], list[tuple[int, bytes]]]


def route(lines: list[bytes]) -> tuple[list[tuple[str, int, int, bytes]], Log]:
    """Messages as a producer would write them (``stream-eval produce``: a line without its line break): (kind,
    partition, offset, value) in send order, ending with an end watermark on every topic-partition; and the log of
    each topic-partition."""
    sent: list[tuple[str, int, int, bytes]] = []
    log: Log = {}
    for given in lines:
        line = given.rstrip(b"\r\n") if given.endswith(b"\n") else given  # (a message holds no line break)
        try:
            fields = orjson.loads(line)
        except orjson.JSONDecodeError:
            fields = None
        kind = fields.get("type") if isinstance(fields, dict) else None
        if kind == "watermark":
            continue
        if kind not in KINDS:
            kind = _guess_kind(line) if _guess_kind(line) in KINDS else "ranking"
        key = ""
        if isinstance(fields, dict):
            key = str(fields.get("query_id" if kind == "judgment" else "request_id", ""))
        partition = zlib.crc32(key.encode()) % PARTITIONS
        messages = log.setdefault((kind, partition), [])
        messages.append((len(messages), line))
        sent.append((kind, partition, len(messages) - 1, line))
    for kind in KINDS:
        for partition in range(PARTITIONS):
            messages = log.setdefault((kind, partition), [])
            messages.append((len(messages), b'{"type": "watermark", "end": true}'))
            sent.append((kind, partition, len(messages) - 1, b'{"type": "watermark", "end": true}'))
    return sent, log


def regrouping(engine: Engine, **options: Any) -> PartitionedEngine:
    """``engine`` as a worker's host engine (its partitions write to the regroup log), owning every partition."""
    engine.regroup = RegroupSink()
    partitioned = PartitionedEngine(engine, **options)
    for partition in range(PARTITIONS):
        partitioned.assign(partition)
    return partitioned


def feed(engine: PartitionedEngine, kind: str, partition: int, batch: list[tuple[int, bytes]]) -> None:
    """One fetch of messages of a topic-partition into ``engine``, then a tick."""
    offsets = [o for o, _ in batch]
    values = [v for _, v in batch]
    # as the worker reads a batch: by the line reader (feedback as columns), every other batch event by event
    decode = decode_message_chunk if sum(offsets) % 2 == 0 else decode_messages
    events = decode(values, kind, engine.engine.config, [0.0] * len(batch),
                    [f"{kind}/{partition}@{o}" for o in offsets])
    engine.feed(kind, partition, offsets, events)  # type: ignore[arg-type]  # decoded events
    engine.tick()


def move_partition_halfway(lines: list[bytes], a: PartitionedEngine, b: PartitionedEngine,
                           stale: bool = False) -> Checkpoint:
    """Partition 0 moves from ``a`` (which holds every partition) to ``b`` halfway through ``lines``, one message a
    fetch: ``a`` reads the first half, its checkpoint of 0 goes to ``b`` through JSON, ``b`` re-reads partition 0
    from the checkpoint's start up to what ``a`` had processed (from offset 0 with ``stale``: a reset to an old
    committed offset that won over the seek), and the second half goes on, partition 0 to ``b``. Returns the
    checkpoint."""
    sent, log = route(lines)
    for partition in range(PARTITIONS):
        a.assign(partition)
    half = len(sent) // 2
    for kind, partition, offset, value in sent[:half]:
        feed(a, kind, partition, [(offset, value)])
    checkpoint = Checkpoint.from_json(orjson.loads(orjson.dumps(a.checkpoint(0).to_json())))
    a.drop(0)
    starts = b.assign(0, checkpoint)
    for kind in KINDS:  # b first re-reads what a had read of partition 0, from the checkpoint on
        for offset, value in log.get((kind, 0), []):
            if (0 if stale else starts.get(kind, 0)) <= offset < checkpoint.processed.get(kind, 0):
                feed(b, kind, 0, [(offset, value)])
    for kind, partition, offset, value in sent[half:]:
        feed(a if partition else b, kind, partition, [(offset, value)])
    return checkpoint


async def read_topic(bootstrap: str, topic: str, expected: int = 0, timeout: float = 120) -> list[Any]:
    """Every record of ``topic``: until there are ``expected``, then until a fetch of 1 s brings nothing (so that
    records beyond the expected number, duplicates, are read too); ``read_committed``, as users of the outputs read
    them (the records of a transaction a fenced worker did not commit are not outputs)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, isolation_level="read_committed")
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


class MemoryLogs:
    """The worker's logs (``stream/logs.py``'s :class:`Logs`) in memory, for delivery tests without a broker:
    ``topics[topic][partition]`` is a list of (key, value) records; ``stored`` counts the writes."""

    def __init__(self) -> None:
        self.topics: dict[str, dict[int, list[tuple[bytes | None, bytes]]]] = {}
        self.stored = 0

    def log(self, topic: str, partition: int) -> list[tuple[bytes | None, bytes]]:
        return self.topics.setdefault(topic, {}).setdefault(partition, [])

    async def store(self, topic: str, value: bytes, partition: int, key: bytes = b"checkpoint") -> int:
        self.stored += 1
        self.log(topic, partition).append((key, value))
        return len(self.log(topic, partition)) - 1

    async def store_all(self, topic: str, records: dict[int, tuple[bytes, bytes]]) -> dict[int, int]:
        return {p: await self.store(topic, value, p, key) for p, (key, value) in sorted(records.items())}

    async def store_pieces(self, data: bytes, topic: str, partition: int, key: bytes | None = None,
                           producer: Any = None) -> tuple[int, int]:
        return await self.store(topic, data, partition, key or b""), 1

    async def read_pieces(self, where: tuple[int, int], topic: str, partition: int) -> bytes:
        return self.log(topic, partition)[where[0]][1]

    async def last_checkpoint(self, topic: str, partition: int, before: int | None = None) -> tuple[Any, Any]:
        from types import SimpleNamespace

        records = self.log(topic, partition)[:before]
        found = [value for key, value in records if key == b"checkpoint"]
        last = SimpleNamespace(key=records[-1][0], value=records[-1][1]) if records else None
        return (orjson.loads(found[-1]) if found else None), last

    async def end_offset(self, topic: str, partition: int) -> int:
        return len(self.log(topic, partition))

    async def keys_since(self, topic: str, partition: int, start: int) -> tuple[set[str], int]:
        records = self.log(topic, partition)
        return {key.decode() for key, _ in records[start:] if key}, len(records)


class RecordingSender:
    """A :class:`~stream_eval.stream.logs.Sender` that keeps what it is given: ``sent`` (topic, partition, key)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int | None, bytes | None]] = []
        self.ends: dict[tuple[str, int], int] = {}

    async def send_batches(self, topic: str, records: Sequence[Any], partition: int | None = None,
                           headers: Any = None) -> None:
        self.sent += [(topic, partition, key) for key, _, _ in records]

    async def send_records(self, topic: str, partition: int, records: Any) -> None:
        self.sent += [(topic, partition, key) for key, _, _ in records]

    async def send_record(self, topic: str, partition: int | None, record: Any, headers: Any = None) -> None:
        self.sent.append((topic, partition, record[0]))

    async def flush(self) -> None:
        pass
