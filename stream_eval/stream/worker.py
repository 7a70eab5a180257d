"""The data plane of ``stream-eval worker``: batches from Kafka into the same engine that replay uses.

faust's per-message machinery costs ~150 µs a message (measured: docs/benchmarks.md, "Platform measurements"),
several times the whole budget of a worker, so the input topics are read here with aiokafka ``getmany`` in
batches, each read by the compiled line reader as replay reads a file, and fed to
:class:`~stream_eval.engine.partitions.PartitionedEngine`; the faust application (``stream/app.py``) runs this as
one of its services, next to its sensors and its control topic.

How delivery is made exact without transactions (checkpoints, shares, records once, commit markers in the regroup
log, fencing by claims, the hand-over hold, release records) is written once, with its invariants, in
``docs/design.md``, "Delivery, checkpoints, rebalances" and "Crashes"; the methods below say which part they do.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from stream_eval.config import Config, ConfigError
from stream_eval.engine import shares, snapshot
from stream_eval.engine.ab import SHARDS
from stream_eval.engine.delays import FeedbackDelays
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.engine.labels import LabelBounds
from stream_eval.engine.partitions import Checkpoint, PartitionedEngine
from stream_eval.engine.regroup import RegroupSink, StageCheckpoint
from stream_eval.engine.stages import StagePartitions
from stream_eval.engine.windows import RollingWindows
from stream_eval.events.messages import decode_message_chunk
from stream_eval.events.scan import MAX_EVENT_BYTES
from stream_eval.events.schema import Invalid, Watermark
from stream_eval.events.ubi import UbiSettings, ubi_config
from stream_eval.stream.backoff import BrokerHealth, is_broker_error
from stream_eval.stream.fetched import lean_options
from stream_eval.stream.kafka import (
    DEFAULT_PARTITIONS,
    KafkaSecurity,
    Topics,
    client_options,
    ensure_topics,
    partitions_for,
    topics,
)
from stream_eval.stream.ubi_topics import UbiTopics

log = logging.getLogger("stream_eval.worker")
#: The producer's batch size; records of at least ``_LARGE_RECORD`` bytes go through ``producer.send`` alone.
_BATCH_BYTES = 1 << 20
_LARGE_RECORD = 64 << 10
#: Seconds one start-up attempt waits for the broker before the outage is counted and the attempt retried.
_STARTUP_ATTEMPT = 5.0
#: Seconds the final checkpoint and the clients' shutdown may take (a broker that is down cannot hold the exit).
_SHUTDOWN_TIMEOUT = 30.0
#: Keys of the records of the checkpoint topic: a partition's checkpoint, and the pieces of a full windows share.
_CHECKPOINT = b"checkpoint"
_WINDOWS = b"windows"
#: Key of a new owner's claim of a partition, in the checkpoint topic: ``{"claim": generation}``.
_CLAIM = b"claim"
#: Key of a record a worker writes to check, up to it, that no one has claimed its partition (on revocation).
_PROBE = b"probe"
#: Key of the record a worker writes when it gives a partition up cleanly (revocation, shutdown): after its last
#: checkpoint, with every output acknowledged. A new owner that finds it last before its claim needs no hold.
_RELEASE = b"release"


@dataclass(frozen=True)
class WorkerSettings:
    """How the worker reaches Kafka; the evaluation settings are the :class:`Config`."""

    brokers: list[str]
    prefix: str = ""
    group: str = "stream-eval"
    partitions: int = DEFAULT_PARTITIONS
    checkpoint_interval: float = 1.0
    #: Seconds between snapshots of the regroup stage's A/B state (engine/snapshot.py): a new owner of the stage
    #: re-reads the regroup log from the latest one, not from its start.
    snapshot_interval: float = 60.0
    #: Partitions of the regroup log, spread over the group's workers like the input partitions (at most the 64
    #: shards of the A/B units); None: as many as the input topics. A regroup log that exists keeps its count.
    stage_partitions: int | None = None
    max_records: int = 20_000
    session_timeout_ms: int = 6_000
    #: Seconds a new owner of a partition keeps its request-metrics records (and its checkpoints) back, and then
    #: leaves out those a previous owner wrote meanwhile (the module docstring's hand-over hold).
    handover_hold: float = 5.0
    heartbeat_interval_ms: int = 1_000
    #: A broker call without an answer for this many seconds counts as an outage (``stream_eval_broker_up`` 0).
    broker_stall: float = 10.0
    #: The producer's ``request_timeout_ms``: how long it keeps a batch the broker has not acknowledged before it
    #: gives up on it. An outage shorter than this loses nothing and writes nothing twice (backoff.py).
    produce_timeout_ms: int = 600_000
    extra: dict[str, Any] = field(default_factory=dict)
    #: TLS and SASL settings of every client (``None``: plain text); see :class:`KafkaSecurity`.
    security: KafkaSecurity | None = None
    #: ``"ubi"``: the rankings and feedback come as OpenSearch UBI records on the topics below (after ``prefix``),
    #: converted as ``replay --input-format ubi`` converts them, with the ``[ubi]`` settings ``ubi``
    #: (stream/ubi_topics.py); ``"events"``: this project's events on the rankings and feedback topics.
    input_format: str = "events"
    ubi_queries_topic: str = "ubi_queries"
    ubi_events_topic: str = "ubi_events"
    ubi: UbiSettings = UbiSettings()
    #: Replicas of each topic the worker creates; a topic that exists must have at least as many.
    replication_factor: int = 1
    #: ``min.insync.replicas`` of each topic the worker creates (one that exists must have at least this): the
    #: worker's producer waits for every in-sync replica (acks=all), and a write fails with fewer than this in sync.
    min_insync_replicas: int = 1

    def __post_init__(self) -> None:
        if self.replication_factor < 1 or not 1 <= self.min_insync_replicas <= self.replication_factor:
            raise ConfigError(f"min_insync_replicas ({self.min_insync_replicas}) must be from 1 to the replication "
                              f"factor ({self.replication_factor}): no write could succeed otherwise")

    @property
    def topics(self) -> Topics:
        if self.input_format == "ubi":  # the UBI topics stand where the rankings and feedback topics stand
            return dataclasses.replace(topics(self.prefix), rankings=f"{self.prefix}{self.ubi_queries_topic}",
                                       feedback=f"{self.prefix}{self.ubi_events_topic}")
        return topics(self.prefix)

    @property
    def checkpoint_topic(self) -> str:
        return f"{self.prefix}{self.group}.checkpoints"

    @property
    def control_topic(self) -> str:
        return f"{self.prefix}{self.group}.control"

    @property
    def regroup_topic(self) -> str:
        """Finalised requests' session parts, query metrics and A/B contributions, from every worker, in order,
        in the stage's partitions (engine/regroup.py)."""
        return f"{self.prefix}{self.group}.regroup"

    @property
    def regroup_checkpoint_topic(self) -> str:
        return f"{self.prefix}{self.group}.regroup-checkpoints"

    @property
    def snapshot_topic(self) -> str:
        """Snapshots of each stage partition's A/B state, in pieces, on its partition (engine/snapshot.py)."""
        return f"{self.prefix}{self.group}.ab-snapshots"

    def topic_configs(self) -> dict[str, dict[str, str]]:
        """The settings each topic is created with; those of ``CHECKED_SETTINGS`` are checked on topics that exist
        (docs/operations.md says why each needs them). Only the latest record of each key of the regroup
        checkpoints is read: compacted. The checkpoint topic (windows shares in pieces, read by offset), the regroup
        log (re-read from a stage checkpoint's offset) and the A/B snapshots (pieces, read by offset) are logs that
        must be kept whole: deleted never. Inputs and outputs are plain logs (never compacted: feedback shares its
        request's key, dead letters have none); their retention is the operator's."""
        isr = {"min.insync.replicas": str(self.min_insync_replicas)}
        plain = {"cleanup.policy": "delete", **isr}
        kept = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1", **isr}
        compacted = {"cleanup.policy": "compact", "segment.ms": str(3_600_000), **isr}  # compacted hourly
        names = self.topics
        return {
            **{name: plain for name in (*names.inputs, names.request_metrics, names.dead_letters, self.control_topic)},
            self.checkpoint_topic: kept,
            self.regroup_topic: kept,
            self.snapshot_topic: kept,
            self.regroup_checkpoint_topic: compacted,
        }


async def prepare_topics(settings: WorkerSettings, timeout: float) -> tuple[int, int]:
    """Create the worker's topics that do not exist, with their settings (:meth:`WorkerSettings.topic_configs`), and
    check those that do (:func:`~stream_eval.stream.kafka.ensure_topics`), waiting up to ``timeout`` seconds for each
    step. The regroup stage's topics get ``stage_partitions`` (default: as many as the input topics have; at most
    :data:`~stream_eval.engine.ab.SHARDS`); a regroup log that exists keeps its count. Returns the partitions of the
    input and of the regroup log.

    Raises:
        TimeoutError: The broker did not answer in time.
        TopicSettingsError: A topic exists with settings that do not fit.
        ValueError: The stage's topics exist with partitions that do not fit together.
    """
    configs = settings.topic_configs()
    stage_topics = [settings.regroup_topic, settings.regroup_checkpoint_topic, settings.snapshot_topic]

    async def count(topic: str) -> int:
        return len(await asyncio.wait_for(partitions_for(settings.brokers, topic, settings.security), timeout))

    wanted = min(settings.stage_partitions or await count(settings.topics.rankings) or settings.partitions, SHARDS)
    partitions = {name: wanted if name in stage_topics else settings.partitions for name in configs}
    await ensure_topics(settings.brokers, list(configs), partitions, timeout=timeout, security=settings.security,
                        replication_factor=settings.replication_factor, configs=configs)
    inputs = await count(settings.topics.rankings) or settings.partitions
    counts = [await count(topic) for topic in stage_topics]
    stages = counts[0]  # (a regroup log that exists keeps its partitions: its records are routed by them)
    if not 1 <= stages <= SHARDS or min(counts[1:]) < stages:
        raise ValueError(f"the regroup stage's topics {stage_topics} have {counts} partitions: the regroup log "
                         f"needs 1 to {SHARDS}, and the others at least as many")
    return inputs, stages


Rebalance = Callable[[Any], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _Delivery:
    """Records handed to the producer since the last flush, with the future that says whether they were stored."""

    future: asyncio.Future[Any]
    topic: str
    partition: int | None
    records: list[tuple[bytes | None, bytes, int | None]]
    headers: list[tuple[str, bytes]] | None = None


class _Where(Sequence[str]):
    """``topic/partition@offset`` of each message, formatted only for the (few) invalid ones."""

    __slots__ = ("prefix", "offsets")

    def __init__(self, prefix: str, offsets: list[int]) -> None:
        self.prefix, self.offsets = prefix, offsets

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> str:  # type: ignore[override]  # no slices needed
        return f"{self.prefix}{self.offsets[index]}"


class _Timestamps(Sequence[float]):
    """Kafka timestamps in seconds, read only for messages without ``ts``."""

    __slots__ = ("records",)

    def __init__(self, records: list[Any]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> float:  # type: ignore[override]  # no slices needed
        return float(self.records[index].timestamp) / 1000.0


def _timestamp_ms(ts: float) -> int | None:
    """A Kafka record timestamp for event time ``ts``: milliseconds, or ``None`` (the producer's clock) for a time
    Kafka cannot hold (negative, or past int64 milliseconds; only configured ``min_ts``/``max_ts`` let one in)."""
    ms = ts * 1000.0
    return int(ms) if 0.0 <= ms < 9.2e18 else None


def _rebalancing(consumer: Any) -> bool:
    """Whether ``consumer``'s group is rebalancing (or not joined yet): its ``getmany`` would wait for the end."""
    return bool(consumer._subscription.reassignment_in_progress)  # aiokafka has no public reading of it


def _quiet_client_debug_logs() -> None:
    """Keep aiokafka's per-message debug logging off unless a real log handler takes DEBUG records.

    mode's terminal spinner (a handler at DEBUG) puts the root logger at DEBUG under every ``--loglevel``, so
    aiokafka built a LogRecord for each message it sent (and filtered it): a cost measured in docs/benchmarks.md.
    """
    root = logging.getLogger()
    if any(handler.level <= logging.DEBUG for handler in root.handlers if type(handler).__name__ != "SpinnerHandler"):
        return  # --loglevel debug: keep everything
    client = logging.getLogger("aiokafka")
    if client.level == logging.NOTSET:
        client.setLevel(logging.INFO)


def warm_up(config: Config) -> None:
    """Run a few simulated requests through the path a batch takes (decode, join, finalise, the regroup stage), so
    that numba loads its compiled loops from the cache now, before the worker joins its group, not while a first
    batch keeps the group waiting (a few seconds)."""
    from stream_eval.simulate import SimulationConfig, simulate_lines

    lines = [line.rstrip(b"\n") for line in simulate_lines(SimulationConfig(requests=40, seed=1, judgments=False))]
    engine = Engine(config)
    engine.labels = LabelBounds(config.max_label_values)
    RollingWindows(engine)
    FeedbackDelays(engine)

    def finalised(partition: int, batch: FinalisedBatch) -> None:
        for record in batch.records():
            orjson.dumps(record)

    partitioned = PartitionedEngine(engine, on_finalised=finalised)  # (runs the regroup stage itself)
    partitioned.assign(0)
    for kind in ("ranking", "feedback"):
        values = [line for line in lines if f'"type": "{kind}"'.encode() in line or f'"type":"{kind}"'.encode() in line]
        if values:
            chunk = decode_message_chunk(values, kind, config, [0.0] * len(values), [""] * len(values))
            partitioned.feed(kind, 0, list(range(len(values))), chunk)
    partitioned.feed("ranking", 0, [len(lines)], [Watermark(end=True)])
    partitioned.feed("feedback", 0, [len(lines)], [Watermark(end=True)])
    partitioned.tick()


class StreamWorker:
    """Consumes the input topics in a consumer group and keeps an :class:`Engine` up to date.

    ``lock`` is held while the engine changes, so that a Prometheus scrape from another thread reads a
    consistent state.
    """

    def __init__(self, settings: WorkerSettings, config: Config, lock: threading.Lock | None = None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.wall_clock = wall_clock
        if settings.input_format == "ubi":  # (the grades of the feedback kinds UBI actions map to)
            config = ubi_config(config, settings.ubi)
        self.config = config
        self.lock = lock or threading.Lock()
        self.labels = LabelBounds(config.max_label_values)  # one bound for every engine of this worker
        self.engine = self._stage_engine()  # the template of every engine; its live windows move with the others'
        self.partition_count = settings.partitions  # of the input topics (found at start)
        #: The partitions of the regroup stage this worker holds, as the stage's consumer group assigns them.
        self.stages = StagePartitions(self._stage_engine, self.partition_count, settings.stage_partitions or 1)
        self._stage_consumer: Any = None
        # each input partition gets an engine of its own, built like self.engine: its totals are its share
        self.partitioned = PartitionedEngine(self.engine, clock, self._finalised)
        self.partitioned.stage_engines = self.stages.engines
        self.ubi: UbiTopics | None = None  # the UBI records of the partitions owned, with --input-format ubi
        if settings.input_format == "ubi":
            self.ubi = UbiTopics(config, settings.ubi, clock)
        #: Per partition of the request-metrics topic: the end offset after the last flush (where a checkpoint says
        #: its records end), and per input partition the request ids a predecessor wrote after its checkpoint.
        self._output_end: dict[int, int] = {}
        self._written: dict[int, set[str]] = {}
        self._output_partitions = settings.partitions
        self._windows_due: dict[int, float] = {}  # when each partition's full windows share is stored next
        self.topics = settings.topics
        self._outbox: list[tuple[bytes, bytes, int | None, int]] = []  # (key, value, timestamp ms, partition)
        self._dead: list[tuple[Invalid, str, int, int]] = []
        self._consumer: Any = None
        self._producer: Any = None
        self._busy = asyncio.Lock()
        self.events_seen = 0
        #: The broker's health as this worker sees it: ``stream_eval_broker_up``, ``..._broker_errors_total``.
        self.health = BrokerHealth("stream-eval worker", log, stall=settings.broker_stall)
        self._deliveries: list[_Delivery] = []
        self._fetch_backoff = self.health.backoff()
        #: Called between batches, without the lock: ``EngineCollector.refresh`` (the readout /metrics shows).
        self.between_batches: Callable[[], None] | None = None
        #: Per owned input partition: the offset of the checkpoint topic up to which no other worker has claimed it.
        self._fences: dict[int, int] = {}
        #: Per input partition taken over less than ``handover_hold`` s ago: (when its hold ends, the offset of its
        #: request-metrics partition up to which the records written by others have been read).
        self._held: dict[int, tuple[float, int]] = {}
        #: Hand-over holds begun (partitions taken from an owner that had not released them).
        self.handover_holds = 0
        self._fence_reader: Any = None

    def _stage_engine(self) -> Engine:
        """An engine for a regroup stage partition's share; the partitions' engines are built like it."""
        engine = Engine(self.config)
        engine.labels = self.labels
        RollingWindows(engine)  # attaches itself: live 5m/1h windows with open requests
        FeedbackDelays(engine)  # attaches itself: the feedback delay histogram
        engine.regroup = RegroupSink()  # sessions and query GSB across workers: engine/regroup.py
        return engine

    def shares(self) -> list[tuple[str, str, Engine]]:
        """``(partition, generation, engine)`` of each share of the totals this worker holds: one per input
        partition it owns, and one per regroup stage partition (``regroup``, ``regroup-1``, ...; exported with these
        labels)."""
        out = [(str(p), task.generation, task.engine) for p, task in self.partitioned.engines()]
        return out + self.stages.shares()

    def stage_view(self) -> Engine:
        """What the stage partitions held here hold, as one engine (the A/B rows, units and sign tests a readout
        exports; the label overflow and event time of this worker)."""
        return self.stages.view(self.labels, self.engine.watermark)

    def totals(self) -> Engine:
        """This worker's totals as one engine (for a report)."""
        return self.partitioned.totals()

    # -- outputs ------------------------------------------------------------------------------------
    def _output_partition(self, partition: int) -> int:
        """Partition ``p`` of the input writes to partition ``p`` of request-metrics (modulo its size), so that a
        new owner of ``p`` finds there what its predecessor wrote after its last checkpoint."""
        return partition % self._output_partitions

    def _finalised(self, partition: int, batch: FinalisedBatch) -> None:
        written = self._written.get(partition)
        for state, record in zip(batch.states, batch.records(), strict=True):
            request_id = record["request_id"]
            if written and request_id in written:
                written.discard(request_id)  # written by the partition's previous owner after its checkpoint
                continue
            self._outbox.append((request_id.encode(), orjson.dumps(record), _timestamp_ms(state.ts), partition))

    async def _send_outputs(self) -> None:
        outbox, dead = self._outbox, self._dead
        self._outbox, self._dead = [], []
        if self._held:  # a partition taken over moments ago: its records wait (the hand-over hold)
            self._outbox = [entry for entry in outbox if entry[3] in self._held]
            outbox = [entry for entry in outbox if entry[3] not in self._held]
        if outbox:
            by_partition: dict[int, list[tuple[bytes | None, bytes, int | None]]] = {}
            for key, value, ts_ms, partition in outbox:
                by_partition.setdefault(self._output_partition(partition), []).append((key, value, ts_ms))
            for number, records in by_partition.items():
                await self._send_batches(self.topics.request_metrics, records, partition=number)
        await self._send_regrouped()
        for invalid, topic, partition, offset in dead:
            headers = [("reason", invalid.reason.encode()), ("code", invalid.code.encode()),
                       ("kind", invalid.kind.encode()), ("topic", topic.encode()),
                       ("partition", str(partition).encode()), ("offset", str(offset).encode())]
            raw = invalid.raw
            if len(raw) > MAX_EVENT_BYTES:  # (too_large): its start, and its size; the whole is at its offset
                headers.append(("truncated", str(len(raw)).encode()))
                raw = raw[:MAX_EVENT_BYTES]
            await self._send_record(self.topics.dead_letters, None, (None, raw, None), headers)

    async def _send_regrouped(self, stage: int | None = None) -> None:
        """Send the regroup records: the input partitions' to their stage partitions, and the looks that the stage
        partitions held here report to partition 0 (with ``stage``: only that stage partition's reports)."""
        by_stage: dict[int, list[tuple[bytes | None, bytes, int | None]]] = {}
        if stage is None:
            for to, key, value in self.partitioned.take_routed():
                by_stage.setdefault(to, []).append((key or None, value, None))
        reports = self.stages.take_reports(stage)
        if reports:
            by_stage.setdefault(0, []).extend((None, report, None) for report in reports)
        for to in sorted(by_stage):
            await self._send_batches(self.settings.regroup_topic, by_stage[to], partition=to)

    async def _send_batches(
        self, topic: str, records: Sequence[tuple[bytes | None, bytes, int | None]], partition: int | None = None
    ) -> None:
        """Send (key, value, timestamp ms) records in order, as whole batches per partition.

        What ``producer.send`` does per record (partition by the key's murmur2 hash, like every Kafka client's
        default partitioner), without its per-record future and accumulator call, which cost much of producing a
        worker's outputs (docs/benchmarks.md). Delivery is awaited by ``producer.flush`` at the next checkpoint.
        """
        from aiokafka.partitioner import DefaultPartitioner

        producer = self._producer
        by_partition: Mapping[int, Sequence[tuple[bytes | None, bytes, int | None]]]
        if partition is None:
            all_partitions = sorted(await self.health.call("produce", lambda: producer.partitions_for(topic)))
            choose = DefaultPartitioner()
            by_key: dict[int, list[tuple[bytes | None, bytes, int | None]]] = {}
            for record in records:
                by_key.setdefault(choose(record[0], all_partitions, all_partitions), []).append(record)
            by_partition = by_key
        else:
            by_partition = {partition: records}  # as given: no copy
        for number, part in by_partition.items():
            batch = producer.create_batch()
            queued: list[tuple[bytes | None, bytes, int | None]] = []
            for record in part:
                key, value, ts_ms = record
                if len(value) + len(key or b"") >= _LARGE_RECORD:
                    # producer.send checks the size and raises for a record the broker would refuse (a batch
                    # builder takes any first record); queued after the batch so far, so order holds
                    if batch.record_count():
                        await self._send_batch(topic, number, batch, queued)
                        batch, queued = producer.create_batch(), []
                    await self._send_record(topic, number, record)
                elif batch.append(key=key, value=value, timestamp=ts_ms) is None:  # full: send it, start the next
                    await self._send_batch(topic, number, batch, queued)
                    batch, queued = producer.create_batch(), [record]
                    batch.append(key=key, value=value, timestamp=ts_ms)
                else:
                    queued.append(record)
            if batch.record_count():
                await self._send_batch(topic, number, batch, queued)

    async def _send_batch(self, topic: str, partition: int, batch: Any,
                          records: list[tuple[bytes | None, bytes, int | None]]) -> None:
        """Queue a batch (retried while the client cannot queue it: nothing is queued twice); its delivery is
        checked by :meth:`_flush`."""
        producer = self._producer
        future = await self.health.call("produce", lambda: producer.send_batch(batch, topic, partition=partition))
        self._deliveries.append(_Delivery(future, topic, partition, records))

    async def _send_record(self, topic: str, partition: int | None, record: tuple[bytes | None, bytes, int | None],
                           headers: list[tuple[str, bytes]] | None = None) -> None:
        producer = self._producer
        key, value, ts_ms = record
        future = await self.health.call("produce", lambda: producer.send(
            topic, value, key=key, partition=partition, timestamp_ms=ts_ms, headers=headers))
        self._deliveries.append(_Delivery(future, topic, partition, [record], headers))

    async def _flush(self) -> None:
        """Wait until every record sent so far is stored (however long the broker is away).

        aiokafka resends a batch that failed for a retriable reason until ``produce_timeout_ms`` has passed and then
        fails its future (``flush`` does not raise): such batches are sent again here, as nothing must be lost,
        though the broker may have stored them already (a request it answered too late).
        """
        while True:
            await self.health.call("flush", self._producer.flush)
            deliveries, self._deliveries = self._deliveries, []
            failed = [d for d in deliveries if d.future.done() and not d.future.cancelled()
                      and d.future.exception() is not None]
            for d in deliveries:
                if d.topic == self.topics.request_metrics and d.partition is not None and d.future.done() \
                        and not d.future.cancelled() and d.future.exception() is None and d.future.result() is not None:
                    end = d.future.result().offset + len(d.records)
                    self._output_end[d.partition] = max(end, self._output_end.get(d.partition, 0))
            self._deliveries = [d for d in deliveries if not d.future.done()]
            if not failed:
                return
            error = failed[0].future.exception()
            self.health.failed("produce", f"{type(error).__name__}: {error}")
            log.warning("%d batches of records were not acknowledged in %d s (%s): sending them again; some may be "
                        "stored twice", len(failed), self.settings.produce_timeout_ms // 1000, error)
            for delivery in failed:
                for record in delivery.records:
                    await self._send_record(delivery.topic, delivery.partition, record, delivery.headers)

    # -- checkpoints --------------------------------------------------------------------------------
    async def _load_checkpoint(self, partition: int, before: int) -> tuple[Checkpoint | None, bool]:
        """The partition's last checkpoint before offset ``before``, and whether its owner then released the
        partition: the last record before ``before`` is a :data:`_RELEASE` of the ownership that stored that
        checkpoint (a release of an owner that was replaced before it wrote it says nothing of the one after)."""
        found, last = await self._last_record(self.settings.checkpoint_topic, partition, before)
        checkpoint = None if found is None else Checkpoint.from_json(found)
        released = (checkpoint is not None and checkpoint.owner is not None and last is not None
                    and last.key == _RELEASE and orjson.loads(last.value).get("release") == checkpoint.owner)
        return checkpoint, released

    async def _last_record(self, topic: str, partition: int, before: int | None = None) -> tuple[Any, Any]:
        """The last checkpoint record of a checkpoint topic's partition (before offset ``before``, default: the
        end), decoded (one record per produce batch, so the end offset is exact even with the development broker's
        ListOffsets bug), and the very last record there (a consumer record); retried while the broker is away."""
        found: tuple[Any, Any] = await self.health.call(
            "checkpoint", lambda: self._read_last_record(topic, partition, before))
        return found

    @contextlib.asynccontextmanager
    async def _reader(self, topic: str, partition: int, **options: Any) -> AsyncIterator[tuple[Any, Any]]:
        """A consumer of its own (no group) started and assigned to one partition: ``(consumer, partition)``."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        reader = AIOKafkaConsumer(bootstrap_servers=self.settings.brokers, enable_auto_commit=False,
                                  **client_options(self.settings.security), **options)
        try:
            await reader.start()
            tp = TopicPartition(topic, partition)
            reader.assign([tp])
            yield reader, tp
        finally:
            # (aiokafka's stop awaits a task it cancels: one that has not run yet raises CancelledError)
            await asyncio.sleep(0)
            await reader.stop()

    async def _read_last_record(self, topic: str, partition: int, before: int | None) -> tuple[Any, Any]:
        if before == 0:
            return None, None
        async with self._reader(topic, partition) as (reader, tp):
            end = (await reader.end_offsets([tp]))[tp] if before is None else before
            back, last = 1, None
            while back <= 4 * end:  # the last checkpoint record; pieces of a windows share may follow it
                reader.seek(tp, max(end - back, 0))
                records: list[Any] = []
                while not records or records[-1].offset < end - 1:
                    batch = await reader.getmany(tp, timeout_ms=5_000)
                    more = batch.get(tp, [])
                    if not more:  # a broker that does not answer in time: retried
                        raise TimeoutError(f"checkpoint of partition {partition} unreadable at offset {end - back}")
                    records += more
                before_end = [r for r in records if r.offset < end]
                if back == 1 and before_end:
                    last = before_end[-1]
                found = [r for r in before_end if r.key in (_CHECKPOINT, None)]  # (None: old logs)
                if found:
                    return orjson.loads(found[-1].value), last
                back *= 4
            return None, last

    async def _end_offset(self, topic: str, partition: int) -> int:
        """The partition's end offset: the high-water mark of a fetch of its last batch (the development broker's
        ListOffsets gives the last batch's base offset + 1)."""

        async def read() -> int:  # (a fetch returns the last batch whole: up to _BATCH_BYTES of outputs)
            async with self._reader(topic, partition, max_partition_fetch_bytes=4 * _BATCH_BYTES) as (reader, tp):
                end = int((await reader.end_offsets([tp]))[tp])
                if end == 0:
                    return 0
                reader.seek(tp, end - 1)
                if not (await reader.getmany(tp, timeout_ms=5_000)).get(tp):
                    raise TimeoutError(f"{topic}/{partition} unreadable at offset {end - 1}")
                return max(end, int(reader.highwater(tp) or 0))

        end: int = await self.health.call("checkpoint", read)
        return end

    async def _written_since(self, partition: int, start: int) -> tuple[set[str], int]:
        """The keys (request ids) of the request-metrics records in ``partition`` from offset ``start`` on, and the
        end offset read to."""

        end = await self._end_offset(self.topics.request_metrics, partition)

        async def read() -> set[str]:
            async with self._reader(self.topics.request_metrics, partition,
                                    max_partition_fetch_bytes=4 * _BATCH_BYTES) as (reader, tp):
                reader.seek(tp, start)
                keys: set[str] = set()
                while await reader.position(tp) < end:
                    records = (await reader.getmany(tp, timeout_ms=5_000)).get(tp, [])
                    if not records:
                        raise TimeoutError(f"request-metrics partition {partition} unreadable at offset "
                                           f"{await reader.position(tp)}")
                    keys.update(record.key.decode() for record in records
                                if record.key is not None and record.offset < end)
                return keys

        if end <= start:
            return set(), start
        found = await self.health.call("checkpoint", read)
        if found:
            log.info("request-metrics partition %d holds %d records written after the last checkpoint by a "
                     "previous owner: they are not written again", partition, len(found))
        return found, end

    async def checkpoint(self, partitions: list[int] | None = None, release: bool = False) -> None:
        """Store the outputs, then the checkpoints and the group offsets of ``partitions`` (default: all); with
        ``release`` (the worker gives them up), then a release record for each that no one else has claimed."""
        from aiokafka import TopicPartition
        from aiokafka.structs import OffsetAndMetadata

        chosen = sorted(self.partitioned.tasks if partitions is None else partitions)
        # claimed by a new owner (this worker stalled past its session)? Then nothing more of it is written
        await self._taken_over(await self._probe(chosen))
        await self._release_held()
        await self._send_outputs()
        await self._flush()
        offsets = {}
        stored: dict[int, tuple[int, Checkpoint]] = {}
        for partition in chosen:
            task = self.partitioned.tasks.get(partition)
            if task is None or not any(source.next_offset is not None for source in task.sources.values()) \
                    or partition in self._held:  # a checkpoint says its records are written: not yet
                continue
            if task.windows is None or time.monotonic() >= self._windows_due.get(partition, 0.0):
                await self._store_windows(partition)
            checkpoint = self.partitioned.checkpoint(partition)
            checkpoint.output_end = self._output_end.get(self._output_partition(partition))
            checkpoint.written = sorted(self._written.get(partition, ()))  # (a next owner will not read them)
            at = await self._store_checkpoint(self.settings.checkpoint_topic, orjson.dumps(checkpoint.to_json()),
                                              partition)
            stored[partition] = at, checkpoint
        # a checkpoint stored after another owner's claim is not the one it restored: it must not count
        await self._taken_over({partition: at for partition, (at, _) in stored.items()})
        committed = False
        for partition, (_, checkpoint) in stored.items():
            task = self.partitioned.tasks.get(partition)
            if task is None:
                continue
            # the stage may now count the partition's regroup records up to here: a successor starts after them
            task.engine.regroup.commit(checkpoint.regroup_seq)  # type: ignore[union-attr]  # set by partitioned
            committed = True
            for kind, offset in checkpoint.start.items():
                offsets[TopicPartition(self._topic_of(kind), partition)] = OffsetAndMetadata(offset, "")
        if committed:
            await self._send_outputs()  # the commit markers (sent with the next flush)
        if release:
            await self._release(chosen)
        if offsets:
            await self._commit(self._consumer, offsets)
        if partitions is None:
            for stage in sorted(self.stages.held):
                await self._checkpoint_stage(stage)

    async def _store_checkpoint(self, topic: str, value: bytes, partition: int, key: bytes = _CHECKPOINT) -> int:
        """Write a checkpoint record, again after a broker error (a second copy of the last one is harmless);
        returns its offset."""
        producer = self._producer
        stored = await self.health.call("checkpoint", lambda: producer.send_and_wait(topic, value, partition=partition,
                                                                                     key=key))
        return int(stored.offset)

    async def _probe(self, partitions: list[int]) -> dict[int, int]:
        """Write a probe to each owned partition of ``partitions`` in the checkpoint topic (at once); their offsets."""
        chosen = [p for p in partitions if p in self._fences and p in self.partitioned.tasks]
        if not chosen:
            return {}
        producer, topic = self._producer, self.settings.checkpoint_topic

        async def write() -> list[Any]:
            sent = [await producer.send(topic, b"{}", partition=p, key=_PROBE) for p in chosen]
            return list(await asyncio.gather(*sent))

        stored = await self.health.call("checkpoint", write)
        return {p: int(metadata.offset) for p, metadata in zip(chosen, stored, strict=True)}

    async def _taken_over(self, upto: dict[int, int]) -> None:
        """Give up at once, without a checkpoint, each partition that another worker has claimed since this worker's
        last check (or its own claim), up to offset ``upto[p]`` of the checkpoint topic (the module docstring's
        fencing); the next check of the others starts after ``upto``. One read for all partitions."""
        from aiokafka import TopicPartition

        fences = self._fences
        parts = {p: at for p, at in upto.items() if p in self.partitioned.tasks and fences.get(p, at) < at}
        if not parts:
            return
        topic = self.settings.checkpoint_topic
        tps = {TopicPartition(topic, p): p for p in parts}
        generations = {p: self.partitioned.tasks[p].generation for p in parts}
        reader = self._fence_reader

        async def read() -> dict[int, str]:
            if reader.assignment() != set(tps):
                reader.assign(list(tps))
            for tp, p in tps.items():
                reader.seek(tp, fences[p] + 1)
            pending, found = set(tps), {}
            while pending:
                batch = await reader.getmany(*pending, timeout_ms=5_000)
                if not batch:
                    raise TimeoutError(f"checkpoint topic partitions {sorted(tps[tp] for tp in pending)} unreadable")
                for tp, records in batch.items():
                    p = tps[tp]
                    for record in records:
                        if fences[p] < record.offset <= parts[p] and record.key == _CLAIM:
                            token = str(orjson.loads(record.value).get("claim"))
                            if token != generations[p]:
                                found[p] = token
                    if records and records[-1].offset >= parts[p]:
                        pending.discard(tp)
            return found

        found = await self.health.call("checkpoint", read)
        for p, at in parts.items():
            if p not in found:
                fences[p] = at
                continue
            log.warning("partition %d was claimed by another worker (generation %s) while this worker still held it "
                        "(stalled past its session?): given up without committing its last checkpoint", p, found[p])
            self._drop(p)

    async def _release(self, partitions: list[int]) -> None:
        """Say that this worker has written all it will of ``partitions``: once every output is acknowledged, a
        :data:`_RELEASE` record in each partition of the checkpoint topic that it still owns (a claim since its last
        check gave the partition up already), unless the partition is still in its own hand-over hold (then the
        next owner holds too, for a predecessor of this worker that may still write)."""
        await self._flush()
        for partition in partitions:
            task = self.partitioned.tasks.get(partition)
            if task is not None and partition not in self._held:
                await self._store_checkpoint(self.settings.checkpoint_topic,
                                             orjson.dumps({"release": task.generation}), partition, _RELEASE)

    async def _release_held(self) -> None:
        """End the hand-over holds that are due: leave out of the outbox the records that a previous owner wrote to
        request-metrics since the new owner's read at its claim, and let the rest go."""
        now = time.monotonic()
        for partition, (until, read_to) in list(self._held.items()):
            if now < until:
                continue
            found, _ = await self._written_since(self._output_partition(partition), read_to)
            if partition not in self._held:  # given up meanwhile
                continue
            del self._held[partition]
            if not found:
                continue
            kept, finalised = [], set()
            for entry in self._outbox:
                request_id = entry[0].decode() if entry[3] == partition else None
                if request_id in found:
                    finalised.add(request_id)
                else:
                    kept.append(entry)
            self._outbox = kept
            self._written.setdefault(partition, set()).update(found - finalised)  # finalised later: skipped then
            log.info("request-metrics partition %d: %d records written by a previous owner during the hand-over: "
                     "not written again", self._output_partition(partition), len(found))

    def _drop(self, partition: int) -> None:
        """Forget ``partition`` at once: its share, its fence, and outputs not sent yet (its next owner writes them)."""
        with self.lock:
            if partition in self.partitioned.tasks:
                self.partitioned.drop(partition)
        self._outbox = [entry for entry in self._outbox if entry[3] != partition]
        self._dead = [entry for entry in self._dead if entry[2] != partition]
        self._fences.pop(partition, None)
        self._written.pop(partition, None)
        self._held.pop(partition, None)

    async def _store_windows(self, partition: int) -> None:
        """Store the full share of a partition's windows before its checkpoint (which then holds what changed since),
        in pieces keyed ``windows`` in the partition of the checkpoint topic; every ``snapshot_interval``."""
        data = self.partitioned.windows_share(partition)
        if data is None:
            return
        where = await self._store_pieces(zlib.compress(orjson.dumps(data), 1), self.settings.checkpoint_topic,
                                         partition, _WINDOWS)
        self.partitioned.windows_stored(partition, where)
        self._windows_due[partition] = time.monotonic() + self.settings.snapshot_interval

    async def _commit(self, consumer: Any, offsets: dict[Any, Any]) -> None:
        """Commit ``start`` offsets. After an outage longer than the session timeout the group has moved on and
        the commit is refused: that is harmless, as a new owner starts from the checkpoint topic, not from these."""
        from aiokafka.errors import CommitFailedError, IllegalStateError

        try:
            await self.health.call("commit", lambda: consumer.commit(offsets))
        except (CommitFailedError, IllegalStateError) as error:
            log.info("offsets not committed, the group rebalanced (%s); the checkpoints hold them", error)

    async def _checkpoint_stage(self, stage: int) -> None:
        """Store stage partition ``stage``'s checkpoint (after the looks it reported, and a snapshot when due) on
        its partition of the stage's checkpoint topic, and commit its start."""
        from aiokafka import TopicPartition
        from aiokafka.structs import OffsetAndMetadata

        held = self.stages.held[stage]
        await self._send_regrouped(stage)  # what a checkpoint or snapshot covers was reported before it is stored
        await self._flush()
        engine = held.engine
        if (engine.ledger.experiments or engine.gsb.complete or engine.ledger.merger.looks) \
                and not held.stage.rebuilding and time.monotonic() >= held.next_snapshot:
            await self._store_snapshot(stage)
        checkpoint = held.stage.checkpoint()
        record = {**checkpoint.to_json(), "share": shares.take(engine, windows=True)}
        await self._store_checkpoint(self.settings.regroup_checkpoint_topic, orjson.dumps(record), stage)
        tp = TopicPartition(self.settings.regroup_topic, stage)
        await self._commit(self._stage_consumer, {tp: OffsetAndMetadata(checkpoint.start, "")})

    async def _store_snapshot(self, stage: int) -> None:
        """Store a stage partition's A/B state in pieces; its later checkpoints name them (between two batches)."""
        held = self.stages.held[stage]
        with self.lock:
            data, covers = snapshot.take(held.engine), held.stage.next_offset
        where = await self._store_pieces(data, self.settings.snapshot_topic, stage)
        held.stage.snapshot_taken(where, covers)
        held.next_snapshot = time.monotonic() + self.settings.snapshot_interval
        log.info("stored a snapshot of stage partition %d's A/B state (%d bytes, %d pieces, covering its log to %d)",
                 stage, len(data), where[1], covers)

    async def _read_snapshot(self, where: tuple[int, int], topic: str | None = None, partition: int = 0) -> bytes:
        """The pieces of a snapshot (default: of the stage's A/B state), joined (retried while the broker is away)."""
        name: str = self.settings.snapshot_topic if topic is None else topic
        data: bytes = await self.health.call("checkpoint", lambda: self._read_pieces(where, name, partition))
        return data

    async def _store_pieces(self, data: bytes, topic: str, partition: int, key: bytes | None = None) -> tuple[int, int]:
        """Store ``data`` in pieces below Kafka's message size; returns where: (first offset, number of pieces)."""
        producer = self._producer
        first = -1
        pieces = snapshot.chunks(data)
        for piece in pieces:
            stored = await self.health.call("checkpoint", lambda piece=piece: producer.send_and_wait(  # type: ignore[misc]  # bound per piece
                topic, piece, partition=partition, key=key))
            first = stored.offset if first < 0 else first
        return first, len(pieces)

    async def _read_pieces(self, where: tuple[int, int], topic: str, partition: int) -> bytes:
        first, count = where
        async with self._reader(topic, partition, max_partition_fetch_bytes=2 * snapshot.CHUNK_BYTES) as (reader, tp):
            reader.seek(tp, first)
            pieces: list[bytes] = []
            while len(pieces) < count:
                batch = await reader.getmany(tp, timeout_ms=5_000)
                records = batch.get(tp, [])
                if not records:
                    raise TimeoutError(f"snapshot pieces from offset {first} unreadable")
                pieces += [r.value for r in records if first <= r.offset < first + count][: count - len(pieces)]
            return b"".join(pieces)

    async def on_stage_revoked(self, revoked: Any) -> None:
        async with self._busy:
            for stage in sorted(self.stages.held):
                await self._checkpoint_stage(stage)
                with self.lock:  # its share went with the checkpoint: the next owner restores it
                    self.stages.give_up(stage)
                log.info("gave up stage partition %d", stage)

    async def on_stage_assigned(self, assigned: Any) -> None:
        async with self._busy:
            for tp in sorted(assigned, key=lambda tp: tp.partition):
                stage = tp.partition
                if stage in self.stages.held:
                    continue
                found, _ = await self._last_record(self.settings.regroup_checkpoint_topic, stage)
                checkpoint = None if found is None else StageCheckpoint.from_json(found)
                data = None
                if checkpoint is not None and checkpoint.snapshot is not None:
                    data = await self._read_snapshot(checkpoint.snapshot, partition=stage)
                with self.lock:
                    held = self.stages.take(stage, checkpoint, data, None if found is None else found.get("share"))
                held.next_snapshot = time.monotonic() + self.settings.snapshot_interval
                if checkpoint is not None:
                    self._stage_consumer.seek(tp, checkpoint.start)
                log.info("took stage partition %d", stage)

    async def checkpoint_now(self, release: bool = False) -> None:
        """A checkpoint between two batches (e.g. before planned maintenance); with ``release``, the last one before
        the worker stops (see :meth:`checkpoint`)."""
        async with self._busy:
            await self.checkpoint(release=release)

    def readiness(self, stale_after: float = 30.0) -> tuple[bool, str]:
        """``(ready, reason)`` for ``/readyz``: the worker holds an assignment and has caught up with it.

        Caught up: every assigned input partition is owned by the engine, and the consumer's position is at or
        past the high-water mark of the partition's latest fetch response, received less than ``stale_after``
        seconds ago. Read-only, and safe to call from another thread (the HTTP server's): it reads the consumer's
        state without awaiting anything; a rebalance under way reads as not ready.
        """
        consumer = self._consumer
        if consumer is None:
            return False, "starting: not connected to Kafka yet"
        try:
            assigned = sorted(consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))
            if not assigned:
                return False, "no partitions assigned (joining the consumer group)"
            now_ms = time.time() * 1000
            for tp in assigned:
                where = f"{tp.topic}/{tp.partition}"
                if tp.partition not in self.partitioned.tasks:
                    return False, f"{where}: being assigned"
                # aiokafka has no synchronous position(): the fetch position sits next to highwater() in its state
                state = consumer._subscription.subscription.assignment.state_value(tp)
                highwater, polled = consumer.highwater(tp), consumer.last_poll_timestamp(tp)
                if highwater is None or polled is None or not state.has_valid_position:
                    return False, f"{where}: not fetched yet"
                if now_ms - polled > stale_after * 1000:
                    return False, f"{where}: no fetch answered for {(now_ms - polled) / 1000:.0f}s"
                if state.position < highwater:
                    return False, f"{where}: {highwater - state.position} messages behind"
        except (AttributeError, AssertionError, RuntimeError, KeyError, TypeError) as error:
            return False, f"rebalancing ({type(error).__name__})"  # the assignment changed under us
        return True, f"caught up on {len(assigned)} partitions"

    def _topic_of(self, kind: str) -> str:
        return self.topics.for_type(kind)

    # -- rebalancing --------------------------------------------------------------------------------
    async def on_partitions_revoked(self, revoked: Any) -> None:
        asked = time.monotonic()
        async with self._busy:
            revoking = sorted({tp.partition for tp in revoked} & set(self.partitioned.tasks))
            if not revoking:
                return
            log.info("revoking partitions %s (waited %.2fs for the batch in hand)", revoking,
                     time.monotonic() - asked)
            try:
                await self.checkpoint(revoking, release=True)
            finally:  # a task kept after it was given up would be stale when it comes back
                for partition in revoking:
                    self._drop(partition)
            log.info("revoked partitions %s in %.2fs", revoking, time.monotonic() - asked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        async with self._busy:
            by_unit: dict[int, list[Any]] = defaultdict(list)
            seeks: list[tuple[Any, int]] = []
            for tp in assigned:
                by_unit[tp.partition].append(tp)
            for partition, tps in sorted(by_unit.items()):
                if partition in self.partitioned.tasks:
                    continue
                generation = os.urandom(4).hex()
                claimed = await self._store_checkpoint(self.settings.checkpoint_topic,
                                                       orjson.dumps({"claim": generation}), partition, _CLAIM)
                checkpoint, released = await self._load_checkpoint(partition, before=claimed)
                windows = None
                if checkpoint is not None and checkpoint.windows is not None:
                    data = await self._read_snapshot(checkpoint.windows, self.settings.checkpoint_topic, partition)
                    windows = orjson.loads(zlib.decompress(data))
                output = self._output_partition(partition)
                read_to = None  # where request-metrics was read to, for the hand-over hold
                if checkpoint is not None and checkpoint.output_end is not None:
                    # what a predecessor killed after its checkpoint wrote: not written again
                    self._written[partition], read_to = await self._written_since(output, checkpoint.output_end)
                    self._output_end[output] = max(read_to, self._output_end.get(output, 0))
                if checkpoint is not None and checkpoint.written:  # written before its output_end, still open
                    self._written.setdefault(partition, set()).update(checkpoint.written)
                log.info("partition %d: claimed at offset %d; %s", partition, claimed,
                         "no checkpoint before it" if checkpoint is None else
                         f"restoring the checkpoint (start {checkpoint.start}, processed {checkpoint.processed})")
                with self.lock:
                    starts = self.partitioned.assign(partition, checkpoint, windows, generation)
                self._fences[partition] = claimed
                if checkpoint is None:
                    # a first checkpoint at once, saying where request-metrics ended before any record of ours
                    read_to = await self._end_offset(self.topics.request_metrics, output)
                    self._output_end[output] = max(read_to, self._output_end.get(output, 0))
                    first = Checkpoint(partition, output_end=self._output_end[output], owner=generation)
                    await self._store_checkpoint(self.settings.checkpoint_topic, orjson.dumps(first.to_json()),
                                                 partition)
                if self.settings.handover_hold > 0 and checkpoint is not None and not released:
                    # a previous owner that did not say it was done may still write (a worker it was not its
                    # last act for is dead or stalled): the hand-over hold
                    if read_to is None:
                        read_to = await self._end_offset(self.topics.request_metrics, output)
                    self._held[partition] = (time.monotonic() + self.settings.handover_hold, read_to)
                    self.handover_holds += 1
                    log.info("partition %d: its previous owner did not release it: hand-over hold of %gs",
                             partition, self.settings.handover_hold)
                for tp in tps:
                    start = starts.get(self.topics.type_of(tp.topic))
                    if start is not None:
                        seeks.append((tp, start))
            for tp, start in seeks:  # at the end, with nothing awaited after (the units drop what comes before)
                self._consumer.seek(tp, start)
            log.info("assigned partitions %s", sorted(by_unit))

    # -- the loop -----------------------------------------------------------------------------------
    async def _handle(self, batch: dict[Any, list[Any]]) -> None:
        config = self.config
        not_after = self.wall_clock() + config.max_clock_skew
        with self.lock:
            for tp, records in batch.items():
                if not records or tp.partition not in self.partitioned.tasks:
                    continue
                kind = self.topics.type_of(tp.topic)
                offsets = [r.offset for r in records]
                task = self.partitioned.tasks[tp.partition]
                if task.sources[kind].received is None:
                    log.info("partition %d: first %s message read at offset %d", tp.partition, kind, offsets[0])
                if self.ubi is not None and kind != "judgment":  # UBI records, released as converted
                    for released in self.ubi.read(task, tp.partition, kind, tp.topic, records, not_after):
                        self._feed(tp.partition, *released)
                else:
                    self._feed(tp.partition, kind, offsets, decode_message_chunk(
                        [r.value for r in records], kind, config, _Timestamps(records),
                        _Where(f"{tp.topic}/{tp.partition}@", offsets), not_after=not_after))
                self.events_seen += len(records)
            if self.ubi is not None:  # held UBI records that a topic gone silent no longer holds back
                for partition, released in self.ubi.release(self.partitioned.tasks, not_after):
                    self._feed(partition, *released)
            self.partitioned.tick()

    def _feed(self, partition: int, kind: str, offsets: list[int], events: Any) -> None:
        """Feed messages of one input topic-partition to the engine; the invalid ones go to the dead letters."""
        for event in self.partitioned.feed(kind, partition, offsets, events):
            offset = int(event.where.rpartition("@")[2])
            self._dead.append((event, self._topic_of(kind), partition, offset))

    async def _handle_stage(self) -> None:
        # aiokafka's getmany waits, timeout or not, for a rebalance of the consumer's group to end; the stage's
        # rebalance callbacks wait for _busy, held here: fetching now would deadlock both groups
        if _rebalancing(self._stage_consumer):
            return
        batch = await self._fetch(self._stage_consumer, 0)
        with self.lock:
            for tp, records in batch.items():
                if records and tp.partition in self.stages.held:
                    self.stages.feed(tp.partition, [r.offset for r in records], [r.value for r in records])

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Consume until ``stop`` is set (or the task is cancelled); checkpoints on the way out."""
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
        from aiokafka.abc import ConsumerRebalanceListener
        from aiokafka.coordinator.assignors.range import RangePartitionAssignor

        settings = self.settings
        _quiet_client_debug_logs()
        try:
            warm_up(self.config)
        except Exception as error:  # (only a speed-up: a configuration it does not fit must not stop the worker)
            log.info("warm-up of the compiled loops skipped: %s: %s", type(error).__name__, error)
        await self.health.call("startup", self._prepare_topics)  # waits, with backoff, for a broker to answer

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
            def __init__(self, revoked: Rebalance, assigned: Rebalance) -> None:
                self.revoked, self.assigned = revoked, assigned

            async def on_partitions_revoked(self, revoked: Any) -> None:
                await self.revoked(revoked)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                await self.assigned(assigned)

        security = client_options(settings.security)
        self._producer = AIOKafkaProducer(bootstrap_servers=settings.brokers, linger_ms=5, acks="all",
                                          max_batch_size=_BATCH_BYTES, request_timeout_ms=settings.produce_timeout_ms,
                                          **security)
        common = {"bootstrap_servers": settings.brokers, "enable_auto_commit": False, "auto_offset_reset": "earliest",
                  "session_timeout_ms": settings.session_timeout_ms,
                  "heartbeat_interval_ms": settings.heartbeat_interval_ms, **security, **lean_options(),
                  **settings.extra}
        self._consumer = AIOKafkaConsumer(
            group_id=settings.group, **common,
            partition_assignment_strategy=(RangePartitionAssignor,),  # partition p of every input topic together
            max_partition_fetch_bytes=4 << 20, fetch_max_bytes=32 << 20,
        )
        self._stage_consumer = AIOKafkaConsumer(group_id=f"{settings.group}.regroup", **common)
        # reads the checkpoint topic for other workers' claims (fencing: the module docstring)
        self._fence_reader = AIOKafkaConsumer(bootstrap_servers=settings.brokers, enable_auto_commit=False,
                                              fetch_max_wait_ms=100,
                                              max_partition_fetch_bytes=2 * snapshot.CHUNK_BYTES,  # windows pieces
                                              **security)
        for client in (self._producer, self._consumer, self._stage_consumer, self._fence_reader):
            await self.health.call("startup", client.start)
        self._consumer.subscribe(list(self.topics.inputs),
                                 listener=Listener(self.on_partitions_revoked, self.on_partitions_assigned))
        self._stage_consumer.subscribe([settings.regroup_topic],
                                       listener=Listener(self.on_stage_revoked, self.on_stage_assigned))
        stop = stop or asyncio.Event()
        last_checkpoint = time.monotonic()
        try:
            while not stop.is_set():
                batch = await self._fetch(self._consumer, 100)
                async with self._busy:
                    await self._handle(batch)
                    await self._handle_stage()
                    if self.between_batches is not None:
                        self.between_batches()
                    # the outputs go with the checkpoints, once no other worker has claimed their partitions
                    if time.monotonic() - last_checkpoint >= settings.checkpoint_interval:
                        await self.checkpoint()
                        last_checkpoint = time.monotonic()
        finally:
            with contextlib.suppress(Exception):  # bounded: a broker that is down must not hold the exit
                await asyncio.wait_for(self.checkpoint_now(release=True), _SHUTDOWN_TIMEOUT)
            for client in (self._consumer, self._stage_consumer, self._fence_reader, self._producer):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop(), _SHUTDOWN_TIMEOUT)
            for partition in list(self.partitioned.tasks):  # every share went with the final checkpoints
                self._drop(partition)
            with self.lock:
                for stage in list(self.stages.held):
                    self.stages.give_up(stage)

    async def _prepare_topics(self) -> None:
        """Create the topics and count the input partitions: one start-up attempt, bounded by ``_STARTUP_ATTEMPT``
        seconds."""
        settings = self.settings
        self.partition_count, stages = await prepare_topics(settings, _STARTUP_ATTEMPT)
        self.stages.inputs, self.stages.count = self.partition_count, stages
        self.partitioned.stages = stages

    async def _fetch(self, consumer: Any, timeout_ms: int) -> dict[Any, list[Any]]:
        """``getmany``; a broker error is counted and waited out (backoff), and gives an empty batch. A fetch the
        broker does not answer gives an empty batch too, without an error: the checkpoints notice the outage."""
        try:
            batch: dict[Any, list[Any]] = await consumer.getmany(timeout_ms=timeout_ms,
                                                                 max_records=self.settings.max_records)
        except Exception as error:
            if not is_broker_error(error):
                raise
            self.health.failed("fetch", error)
            await asyncio.sleep(self._fetch_backoff.next())
            return {}
        if batch:
            self._fetch_backoff.reset()
            self.health.answered()
        return batch
