"""Delivery: the claim, commit and release of the partitions a worker owns.

The worker (``stream/worker.py``) reads batches and feeds the engines; a :class:`Delivery` owns everything that
makes the results exact across crashes and rebalances: when a partition is assigned, its *claim* (restore the last
checkpoint, and make sure no earlier owner writes on); every ``checkpoint_interval`` and at a revocation, its
*commit* (the outputs, the checkpoint and the consumer offsets together); when it is revoked, its *release*. The
same for the regroup stage's partitions. The invariants every implementation keeps are written once, in
docs/design.md, "Delivery"; :class:`FencedLog` keeps them without transactions (claims and probes in the
checkpoint topic, the hand-over hold, release records), the transactional delivery with Kafka transactions.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import orjson

from stream_eval.config import Config, ConfigError
from stream_eval.engine import shares, snapshot
from stream_eval.engine.engine import FinalisedBatch
from stream_eval.engine.partitions import WAITING_BYTES, Checkpoint, PartitionedEngine
from stream_eval.engine.regroup import StageCheckpoint
from stream_eval.engine.stages import StagePartitions
from stream_eval.events.scan import MAX_EVENT_BYTES
from stream_eval.events.schema import Invalid
from stream_eval.stream.backoff import BrokerHealth
from stream_eval.stream.batches import Record, Records, ends_of
from stream_eval.stream.logs import CHECKPOINT, Headers, Logs, Sender
from stream_eval.stream.settings import WorkerSettings

log = logging.getLogger("stream_eval.worker")
#: Keys of the records of the checkpoint topic besides checkpoints: the pieces of a full windows share and of
#: waiting feedback too large for the checkpoint record, a new owner's claim, a probe (written to read up to it),
#: and the release of an owner that gave its partition up.
WINDOWS = b"windows"
WAITING = b"waiting"
CLAIM = b"claim"
PROBE = b"probe"
RELEASE = b"release"


class Claim(msgspec.Struct, frozen=True):
    """A new owner's claim of an input partition (key :data:`CLAIM`): its ownership token."""

    owner: str = msgspec.field(name="claim")


class Release(msgspec.Struct, frozen=True):
    """An owner gave its input partition up cleanly (key :data:`RELEASE`): after its last checkpoint, with every
    output acknowledged."""

    owner: str = msgspec.field(name="release")


class Probe(msgspec.Struct, frozen=True):
    """Written to read the checkpoint topic up to it (key :data:`PROBE`): whether anyone claimed since."""


_claims = msgspec.json.Decoder(Claim)
_releases = msgspec.json.Decoder(Release)
_encode = msgspec.json.encode


def timestamps_ms(ts: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Kafka record timestamps for event times ``ts``: milliseconds (truncated), or -1 (the producer's clock) for a
    time Kafka cannot hold (negative, or past int64 milliseconds; only configured ``min_ts``/``max_ts`` let one in).

    >>> timestamps_ms(np.array([1.0015, -1.0, 1e17, np.nan])).tolist()
    [1001, -1, -1, -1]
    """
    with np.errstate(over="ignore"):  # (a time past float's range: inf, which has no timestamp)
        ms = ts * 1000.0
    return np.where((ms >= 0.0) & (ms < 9.2e18), ms, -1.0).astype(np.int64)


@dataclass(slots=True)
class RequestRecords:
    """The request-metrics records of an input partition's finalised requests: their request ids (each record's
    key) and the records, as columns (``stream/batches.py``)."""

    partition: int
    ids: list[str]
    records: Records

    @classmethod
    def of(cls, partition: int, batch: FinalisedBatch) -> RequestRecords:
        """The records of ``batch`` (``FinalisedBatch.encoded_values``), keyed by request id, each at its request's
        serve time."""
        states = batch.states
        ids = [state.request_id for state in states]
        joined = "".join(ids)
        if joined.isascii():
            keys, lengths = joined.encode(), list(map(len, ids))
        else:
            encoded = [rid.encode() for rid in ids]
            keys, lengths = b"".join(encoded), list(map(len, encoded))
        values, value_ends = batch.encoded_values()
        served = np.fromiter(map(attrgetter("ts"), states), dtype=np.float64, count=len(states))
        return cls(partition, ids, Records(np.frombuffer(keys, dtype=np.uint8), ends_of(lengths), values, value_ends,
                                           timestamps_ms(served)))

    def rows(self, kept: list[int]) -> RequestRecords:
        """The records ``kept`` (indexes, in order)."""
        return RequestRecords(self.partition, [self.ids[i] for i in kept],
                              self.records.rows(np.array(kept, dtype=np.int64)))


@dataclass
class Outbox:
    """Outputs of the input partitions owned, not sent yet: request-metrics records and dead letters, by the input
    partition they come from, in order."""

    requests: list[RequestRecords] = field(default_factory=list)
    dead: list[tuple[Invalid, str, int, int]] = field(default_factory=list)  # invalid, topic, partition, offset

    def take(self, partitions: set[int] | None = None) -> Outbox:
        """What ``partitions`` (default: all) have waiting, taken out."""
        if partitions is None:
            taken, self.requests, self.dead = Outbox(self.requests, self.dead), [], []
            return taken
        taken = Outbox([e for e in self.requests if e.partition in partitions],
                       [e for e in self.dead if e[2] in partitions])
        self.requests = [e for e in self.requests if e.partition not in partitions]
        self.dead = [e for e in self.dead if e[2] not in partitions]
        return taken

    def __bool__(self) -> bool:
        return bool(self.requests or self.dead)


class SettingsChanged(ConfigError):
    """A checkpoint of the group was stored under settings its state cannot be restored under (:func:`fingerprint`)."""


def fingerprint(settings: WorkerSettings, config: Config) -> dict[str, Any]:
    """The settings a checkpoint's state was counted under and can only be restored under: the measures (by column),
    the horizons that finalise requests and close sessions, the live windows, the segment fields, and where the
    input comes from (docs/operations.md, "Changing settings")."""
    return {"metrics": [spec.mean_name for spec in config.specs], "attribution_window": config.attribution_window,
            "allowed_lateness": config.allowed_lateness, "session_gap": config.session_gap,
            "windows": list(config.windows), "segments": list(config.segments),
            "input_format": settings.input_format, "topics": [settings.topics.rankings, settings.topics.feedback]}


def check_fingerprint(found: dict[str, Any] | None, current: dict[str, Any], where: str) -> None:
    """Raise :class:`SettingsChanged` when the fingerprint of checkpoint record ``found`` (None, or one stored before
    2026-12-02 without one: not checked) differs from ``current``, naming each setting that changed."""
    stored = None if found is None else found.get("settings")
    if not isinstance(stored, dict):
        return
    changed = [f"{name} {stored.get(name)!r} -> {value!r}" for name, value in current.items()
               if name in stored and stored[name] != value]
    if changed:
        raise SettingsChanged(
            f"{where}: its checkpoint was counted under other settings ({'; '.join(changed)}); restored under these "
            "it would count requests or sessions twice or never, or mix up the measures' columns. Start a new "
            "--group for the new settings (it reads the inputs from their start, or from where you point it), or "
            "restart with the old ones (docs/operations.md, \"Changing settings\")")


class Delivery(abc.ABC):
    """Claims, commits and releases the input partitions and regroup stage partitions of one worker.

    The worker calls :meth:`finalised` and :meth:`dead_letter` while it feeds the engines (under ``lock``), and the
    others between batches and in its rebalance callbacks (never two at once). docs/design.md, "Delivery", holds the
    invariants.
    """

    #: ``--delivery`` name of the implementation.
    name = ""
    #: How the worker's consumers read the logs it writes (``read_committed`` where they are written in transactions).
    isolation_level = "read_uncommitted"

    def __init__(self, settings: WorkerSettings, partitioned: PartitionedEngine, stages: StagePartitions,
                 lock: threading.Lock, health: BrokerHealth, logs: Logs | None = None) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.partitioned = partitioned
        self.stages = stages
        self.lock = lock
        self.health = health
        self.logs = logs or Logs(settings.brokers, health, settings.security)
        #: What each checkpoint stores of the settings its state was counted under (:func:`fingerprint`).
        self.fingerprint = fingerprint(settings, partitioned.engine.config)
        self.outbox = Outbox()
        self.output_partitions = settings.partitions
        self._windows_due: dict[int, float] = {}  # when each partition's full windows share is stored next
        self.consumer: Any = None
        self.stage_consumer: Any = None
        #: Hand-over holds begun (partitions taken from an owner that had not released them): :class:`FencedLog`.
        self.handover_holds = 0
        #: Input partitions dropped because their transaction failed, and when (:class:`Transactions`): the worker
        #: claims one again if its consumer still holds it a session later (no one else took it).
        self.lost: dict[int, float] = {}
        self.lost_stages: dict[int, float] = {}  # the same for stage partitions

    # -- what the engines produce -------------------------------------------------------------------
    def output_partition(self, partition: int) -> int:
        """Partition ``p`` of the input writes to partition ``p`` of request-metrics (modulo its size), so that a
        new owner of ``p`` finds there what its predecessor wrote after its last checkpoint."""
        return partition % self.output_partitions

    def finalised(self, partition: int, batch: FinalisedBatch) -> None:
        """Requests of input partition ``partition`` finalised: their request-metrics records go out with the
        partition's next commit."""
        self._outputs(partition, batch, None)

    def _outputs(self, partition: int, batch: FinalisedBatch, written: set[str] | None) -> None:
        """The request-metrics records of ``batch`` into the outbox, but for the ids in ``written`` (each skipped
        once: a predecessor wrote it)."""
        if not batch.states:
            return
        records = RequestRecords.of(partition, batch)
        if written:
            kept = []
            for i, request_id in enumerate(records.ids):
                if request_id in written:
                    written.discard(request_id)
                else:
                    kept.append(i)
            if len(kept) < len(records.ids):
                records = records.rows(kept)
        self.outbox.requests.append(records)

    def dead_letter(self, invalid: Invalid, topic: str, partition: int, offset: int) -> None:
        self.outbox.dead.append((invalid, topic, partition, offset))

    async def send_outbox(self, sender: Sender, outbox: Outbox) -> None:
        """Send what ``outbox`` holds through ``sender``: request-metrics records to their partitions, then dead
        letters (with where they were read, in headers)."""
        if outbox.requests:
            by_partition: dict[int, list[Records]] = {}
            for requests in outbox.requests:
                by_partition.setdefault(self.output_partition(requests.partition), []).append(requests.records)
            for number, parts in by_partition.items():
                await sender.send_records(self.topics.request_metrics, number, Records.joined(parts))
        if not outbox.dead:
            return
        letters: list[Record] = []
        all_headers: list[Headers] = []
        for invalid, topic, partition, offset in outbox.dead:
            headers = [("reason", invalid.reason.encode()), ("code", invalid.code.encode()),
                       ("kind", invalid.kind.encode()), ("topic", topic.encode()),
                       ("partition", str(partition).encode()), ("offset", str(offset).encode())]
            raw = invalid.raw
            if len(raw) > MAX_EVENT_BYTES:  # (too_large): its start, and its size; the whole is at its offset
                headers.append(("truncated", str(len(raw)).encode()))
                raw = raw[:MAX_EVENT_BYTES]
            letters.append((None, raw, None))
            all_headers.append(headers)
        await sender.send_batches(self.topics.dead_letters, letters, headers=all_headers)

    async def send_routed(self, sender: Sender, routed: list[tuple[int, bytes, bytes]],
                          reports: list[bytes]) -> None:
        """Send regroup records, ``(stage partition, key, value)``, and looks reported to stage partition 0."""
        by_stage: dict[int, list[Record]] = {}
        for to, key, value in routed:
            by_stage.setdefault(to, []).append((key or None, value, None))
        if reports:
            by_stage.setdefault(0, []).extend((None, report, None) for report in reports)
        for to in sorted(by_stage):
            await sender.send_batches(self.settings.regroup_topic, by_stage[to], partition=to)

    # -- the life of the clients --------------------------------------------------------------------
    @abc.abstractmethod
    async def start(self, consumer: Any, stage_consumer: Any) -> None:
        """Start the clients this delivery writes with; ``consumer`` and ``stage_consumer`` are the worker's."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop those clients (after the last commit)."""

    async def trim(self) -> None:
        """Delete what no reader needs any more of the internal logs kept forever, when due (:class:`Transactions`;
        a fenced log keeps them whole: its claims and probes read back past its checkpoints)."""
        return None

    # -- input partitions ---------------------------------------------------------------------------
    @abc.abstractmethod
    async def claim(self, partition: int) -> dict[str, int]:
        """Take input partition ``partition`` over: make sure that no earlier owner commits anything of it from now
        on, restore its last checkpoint into the engines, and return the offsets to read from, per input kind."""

    @abc.abstractmethod
    async def commit(self, partitions: list[int] | None = None, release: bool = False) -> None:
        """Store the outputs of ``partitions`` (default: all owned), then their checkpoints and consumer offsets,
        all or none of a partition counting (a partition found claimed by another worker is dropped instead); with
        ``release`` (the worker gives them up), make sure a next owner needs to wait for nothing."""

    def drop(self, partition: int) -> None:
        """Forget input partition ``partition`` at once: its share, and its outputs not committed (its next owner
        writes them)."""
        with self.lock:
            if partition in self.partitioned.tasks:
                self.partitioned.drop(partition)
        self.outbox.take({partition})
        self._windows_due.pop(partition, None)

    def _encoded(self, checkpoint: Checkpoint) -> bytes:
        """An input partition's checkpoint record, with the settings its state was counted under."""
        return orjson.dumps({**checkpoint.to_json(), "settings": self.fingerprint})

    async def _restore(self, partition: int, before: int | None, owner: str) -> tuple[Checkpoint | None, Any,
                                                                                       dict[str, int]]:
        """Restore input partition ``partition`` from its last checkpoint before offset ``before`` of the checkpoint
        topic, as ownership ``owner``: the checkpoint, the last record before ``before``, and the offsets to read
        from."""
        found, last = await self.logs.last_checkpoint(self.settings.checkpoint_topic, partition, before)
        check_fingerprint(found, self.fingerprint, f"input partition {partition}")
        checkpoint = None if found is None else Checkpoint.from_json(found)
        windows = None
        if checkpoint is not None and checkpoint.windows is not None:
            windows = await self._read_stored(checkpoint.windows, partition)
        if checkpoint is not None and checkpoint.waiting_at is not None:
            checkpoint.waiting = await self._read_stored(checkpoint.waiting_at, partition)
        log.info("partition %d: %s", partition, "no checkpoint" if checkpoint is None else
                 f"restoring the checkpoint (start {checkpoint.start}, processed {checkpoint.processed})")
        with self.lock:
            starts = self.partitioned.assign(partition, checkpoint, windows, owner)
        return checkpoint, last, starts

    async def _read_stored(self, where: tuple[int, int], partition: int) -> Any:
        """What :meth:`_store` stored in pieces at ``where`` of the checkpoint topic's ``partition``."""
        return orjson.loads(zlib.decompress(await self.logs.read_pieces(where, self.settings.checkpoint_topic,
                                                                        partition)))

    async def _store_waiting(self, checkpoint: Checkpoint, producer: Any = None) -> None:
        """Waiting feedback of more than :data:`WAITING_BYTES` (JSON), which would not fit in the checkpoint record
        (one Kafka message) with its share, stored in pieces before it (through ``producer``: a transaction's);
        the checkpoint then says where (``waiting_at``)."""
        if checkpoint.waiting is None:
            return
        data = orjson.dumps(checkpoint.waiting)
        if len(data) > WAITING_BYTES:
            checkpoint.waiting_at = await self.logs.store_pieces(zlib.compress(data, 1), self.settings.checkpoint_topic,
                                                                 checkpoint.partition, WAITING, producer=producer)
            checkpoint.waiting = None

    def _windows_record(self, partition: int) -> bytes | None:
        """The full share of a partition's windows, compressed, when one is due (every ``snapshot_interval``; the
        checkpoints in between hold what changed since)."""
        task = self.partitioned.tasks[partition]
        if task.windows is not None and time.monotonic() < self._windows_due.get(partition, 0.0):
            return None
        data = self.partitioned.windows_share(partition)
        self._windows_due[partition] = time.monotonic() + self.settings.snapshot_interval
        return None if data is None else zlib.compress(orjson.dumps(data), 1)

    def _checkpointed(self, partition: int) -> bool:
        """Whether input partition ``partition`` has anything a checkpoint would say (something was fed)."""
        task = self.partitioned.tasks.get(partition)
        return task is not None and any(source.next_offset is not None for source in task.sources.values())

    def _offsets(self, partition: int, checkpoint: Checkpoint) -> dict[Any, Any]:
        """The consumer offsets a checkpoint commits: its ``start`` per input topic."""
        from aiokafka import TopicPartition
        from aiokafka.structs import OffsetAndMetadata

        return {TopicPartition(self.topics.for_type(kind), partition): OffsetAndMetadata(offset, "")
                for kind, offset in checkpoint.start.items()}

    # -- regroup stage partitions -------------------------------------------------------------------
    async def claim_stage(self, stage: int) -> int | None:
        """Take stage partition ``stage`` over from its last checkpoint (and the snapshot it names); returns the
        offset of the regroup log to read from (None: its start)."""
        found, _ = await self.logs.last_checkpoint(self.settings.regroup_checkpoint_topic, stage)
        check_fingerprint(found, self.fingerprint, f"stage partition {stage}")
        checkpoint = None if found is None else StageCheckpoint.from_json(found)
        data = None
        if checkpoint is not None and checkpoint.snapshot is not None:
            data = await self.logs.read_pieces(checkpoint.snapshot, self.settings.snapshot_topic, stage)
        with self.lock:
            held = self.stages.take(stage, checkpoint, data, None if found is None else found.get("share"))
        held.next_snapshot = time.monotonic() + self.settings.snapshot_interval
        log.info("took stage partition %d", stage)
        return None if checkpoint is None else checkpoint.start

    async def report_looks(self) -> None:
        """Send the looks and progress at boundaries that the stage partitions held here report to partition 0, at
        once, where their delivery allows it (:class:`FencedLog`; in a transaction they go with the stage's commit).
        Reports are idempotent (docs/design.md, "A/B units across workers"), so they need no commit of their own."""
        return None

    @abc.abstractmethod
    async def commit_stages(self, stages: list[int]) -> None:
        """Store the looks that stage partitions ``stages`` report, then (a snapshot when due and) their checkpoints
        and consumer offsets."""

    async def release_stages(self, stages: list[int]) -> None:
        """Commit stage partitions ``stages`` one last time and give them up (the next owner restores them)."""
        await self.commit_stages(stages)
        for stage in [q for q in stages if q in self.stages.held]:  # (a failed commit gave it up already)
            with self.lock:
                self.stages.give_up(stage)
            log.info("gave up stage partition %d", stage)

    async def _snapshot(self, stage: int) -> tuple[bytes, int] | None:
        """A snapshot of stage partition ``stage``'s A/B state when one is due: (data, regroup offset it covers)."""
        held = self.stages.held[stage]
        if not held.stage.cumulative() or held.stage.rebuilding or time.monotonic() < held.next_snapshot:
            return None
        with self.lock:
            return snapshot.take(held.engine), held.stage.next_offset

    def _snapshot_stored(self, stage: int, where: tuple[int, int], covers: int, size: int) -> None:
        held = self.stages.held[stage]
        held.stage.snapshot_taken(where, covers)
        held.next_snapshot = time.monotonic() + self.settings.snapshot_interval
        log.info("stored a snapshot of stage partition %d's A/B state (%d bytes, %d pieces, covering its log to %d)",
                 stage, size, where[1], covers)

    def _stage_record(self, stage: int) -> tuple[bytes, int]:
        """Stage partition ``stage``'s checkpoint record (its share with it), and the regroup offset it starts at."""
        held = self.stages.held[stage]
        checkpoint = held.stage.checkpoint()
        record = {**checkpoint.to_json(), "share": shares.take(held.engine, windows=True), "settings": self.fingerprint}
        return orjson.dumps(record), checkpoint.start


class FencedLog(Delivery):
    """Exactly-once results without transactions: fencing by claims in the checkpoint topic, records once by the
    request ids a predecessor wrote, the hand-over hold, release records, and commit markers in the regroup log
    (docs/design.md, "Delivery", says how each keeps the invariants D2 and D3, and where it stops)."""

    name = "fenced-log"

    def __init__(self, *args: Any, sender: Sender | None = None, **kwargs: Any) -> None:
        """``sender`` and ``logs``: given (tests: in memory), or made by :meth:`start` on the broker's clients."""
        super().__init__(*args, **kwargs)
        self.sender = sender
        #: The producer is idempotent (where the broker allows it: those with transactions).
        self.idempotent = False
        #: Per owned input partition: the offset of the checkpoint topic up to which no other worker has claimed it.
        self.fences: dict[int, int] = {}
        #: Per input partition: request ids a predecessor wrote to request-metrics after its checkpoint.
        self.written: dict[int, set[str]] = {}
        #: Per input partition taken over less than ``handover_hold`` s ago: (when its hold ends, the offset of its
        #: request-metrics partition up to which the records written by others have been read).
        self.held: dict[int, tuple[float, int]] = {}
        self._fence_reader: Any = None

    async def start(self, consumer: Any, stage_consumer: Any) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        from stream_eval.stream.kafka import client_options
        from stream_eval.stream.logs import BATCH_BYTES, LINGER_MS

        settings = self.settings
        security = client_options(settings.security)
        self.consumer, self.stage_consumer = consumer, stage_consumer
        producer = AIOKafkaProducer(bootstrap_servers=settings.brokers, linger_ms=LINGER_MS, acks="all",
                                    max_batch_size=BATCH_BYTES, request_timeout_ms=settings.produce_timeout_ms,
                                    enable_idempotence=self.idempotent, **security)
        self.sender = Sender(producer, self.health, settings.produce_timeout_ms)
        self.logs.producer = producer
        # reads the checkpoint topic for other workers' claims (fencing)
        self._fence_reader = AIOKafkaConsumer(bootstrap_servers=settings.brokers, enable_auto_commit=False,
                                              fetch_max_wait_ms=100,
                                              max_partition_fetch_bytes=2 * snapshot.CHUNK_BYTES, **security)
        for client in (producer, self._fence_reader):
            await self.health.call("startup", client.start)

    async def stop(self) -> None:
        for client in (self._fence_reader, None if self.sender is None else self.sender.producer):
            if client is not None:
                await asyncio.wait_for(client.stop(), 30.0)

    def finalised(self, partition: int, batch: FinalisedBatch) -> None:
        # (not the ids the partition's previous owner wrote after its checkpoint)
        self._outputs(partition, batch, self.written.get(partition))

    def _output_end(self, partition: int) -> int | None:
        assert self.sender is not None
        return self.sender.ends.get((self.topics.request_metrics, self.output_partition(partition)))

    def _note_output_end(self, partition: int, end: int) -> None:
        assert self.sender is not None
        where = (self.topics.request_metrics, self.output_partition(partition))
        self.sender.ends[where] = max(end, self.sender.ends.get(where, 0))

    async def claim(self, partition: int) -> dict[str, int]:
        settings = self.settings
        owner = os.urandom(4).hex()
        claimed = await self.logs.store(settings.checkpoint_topic, _encode(Claim(owner)), partition, CLAIM)
        checkpoint, last, starts = await self._restore(partition, claimed, owner)
        # the last record before the claim is a release of the ownership that stored that checkpoint (a release of
        # an owner replaced before it wrote it says nothing of the one after)
        released = (checkpoint is not None and checkpoint.owner is not None and last is not None
                    and last.key == RELEASE and _releases.decode(last.value).owner == checkpoint.owner)
        output = self.output_partition(partition)
        read_to = None  # where request-metrics was read to, for the hand-over hold
        if checkpoint is not None and checkpoint.output_end is not None:
            # what a predecessor killed after its checkpoint wrote: not written again
            found, read_to = await self.logs.keys_since(self.topics.request_metrics, output, checkpoint.output_end)
            if found:
                log.info("request-metrics partition %d holds %d records written after the last checkpoint by a "
                         "previous owner: they are not written again", output, len(found))
            self.written[partition] = found
            self._note_output_end(partition, read_to)
        if checkpoint is not None and checkpoint.written:  # written before its output_end, still open
            self.written.setdefault(partition, set()).update(checkpoint.written)
        log.info("partition %d: claimed at offset %d", partition, claimed)
        self.fences[partition] = claimed
        if checkpoint is None:
            # a first checkpoint at once, saying where request-metrics ended before any record of ours
            read_to = await self.logs.end_offset(self.topics.request_metrics, output)
            self._note_output_end(partition, read_to)
            first = Checkpoint(partition, output_end=self._output_end(partition), owner=owner)
            self._own({partition: await self.logs.store(settings.checkpoint_topic, self._encoded(first),
                                                         partition)})
        if settings.handover_hold > 0 and checkpoint is not None and not released:
            # a previous owner that did not say it was done may still write (a worker it was not its last act for
            # is dead or stalled): the hand-over hold
            if read_to is None:
                read_to = await self.logs.end_offset(self.topics.request_metrics, output)
            self.held[partition] = (time.monotonic() + settings.handover_hold, read_to)
            self.handover_holds += 1
            log.info("partition %d: its previous owner did not release it: hand-over hold of %gs",
                     partition, settings.handover_hold)
        return starts

    async def commit(self, partitions: list[int] | None = None, release: bool = False) -> None:
        assert self.sender is not None
        sender = self.sender
        chosen = sorted(self.partitioned.tasks if partitions is None else partitions)
        # claimed by a new owner (this worker stalled past its session)? Then nothing more of it is written
        await self._taken_over(await self._probe(chosen))
        await self._release_held()
        await self._send_outputs()
        await sender.flush()
        stored: dict[int, Checkpoint] = {}
        windows: dict[int, tuple[bytes, bytes]] = {}
        for partition in chosen:
            if self._checkpointed(partition) and partition not in self.held:  # (held: its records wait)
                record = self._windows_record(partition)
                if record is not None:
                    where = await self.logs.store_pieces(record, self.settings.checkpoint_topic, partition, WINDOWS)
                    self.partitioned.windows_stored(partition, where)
                checkpoint = self.partitioned.checkpoint(partition)
                await self._store_waiting(checkpoint)
                checkpoint.output_end = self._output_end(partition)
                checkpoint.written = sorted(self.written.get(partition, ()))  # (a next owner will not read them)
                stored[partition] = checkpoint
                windows[partition] = (CHECKPOINT, self._encoded(checkpoint))
        at = await self.logs.store_all(self.settings.checkpoint_topic, windows)  # one round trip for all
        # a checkpoint stored after another owner's claim is not the one it restored: it must not count
        await self._taken_over(at)
        offsets: dict[Any, Any] = {}
        for partition, checkpoint in stored.items():
            task = self.partitioned.tasks.get(partition)
            if task is None:
                continue
            # the stage may now count the partition's regroup records up to here: a successor starts after them
            task.engine.regroup.commit(checkpoint.regroup_seq)  # type: ignore[union-attr]  # set by partitioned
            offsets.update(self._offsets(partition, checkpoint))
        if offsets:
            await self._send_outputs()  # the commit markers (sent with the next flush)
        if release:
            await self._release(chosen)
        if offsets:
            await self._commit_offsets(self.consumer, offsets)

    async def _send_outputs(self) -> None:
        assert self.sender is not None
        outbox = self.outbox.take()
        if self.held:  # a partition taken over moments ago: its records wait (the hand-over hold)
            self.outbox = outbox.take(set(self.held))
        await self.send_outbox(self.sender, outbox)
        await self.send_routed(self.sender, self.partitioned.take_routed(), self.stages.take_reports())

    async def report_looks(self) -> None:
        assert self.sender is not None
        await self.send_routed(self.sender, [], self.stages.take_reports(live=False))  # (flushed by the commit)

    async def _probe(self, partitions: list[int]) -> dict[int, int]:
        """Write a probe to each owned partition of ``partitions`` in the checkpoint topic (at once); their offsets."""
        probe = _encode(Probe())
        return await self.logs.store_all(self.settings.checkpoint_topic, {
            p: (PROBE, probe) for p in partitions if p in self.fences and p in self.partitioned.tasks})

    def _own(self, written: Mapping[int, int]) -> None:
        """This worker has just written the record at offset ``written[p]`` of checkpoint topic partition ``p``: a
        fence right before it moves over it, as no other worker's claim can lie between them, so that the next check
        reads nothing (in the steady state every probe and checkpoint follows this worker's previous record)."""
        fences = self.fences
        for p, at in written.items():
            if fences.get(p) == at - 1:
                fences[p] = at

    async def _taken_over(self, upto: dict[int, int]) -> None:
        """Give up at once, without a checkpoint, each partition that another worker has claimed since this worker's
        last check (or its own claim), up to offset ``upto[p]`` of the checkpoint topic, a record this worker has just
        written (:meth:`_own`: nothing to read when it follows the last offset checked); the next check of the
        others starts after ``upto``. One read for all partitions."""
        from aiokafka import TopicPartition

        self._own(upto)
        fences = self.fences
        parts = {p: at for p, at in upto.items() if p in self.partitioned.tasks and fences.get(p, at) < at}
        if not parts:
            return
        topic = self.settings.checkpoint_topic
        tps = {TopicPartition(topic, p): p for p in parts}
        owners = {p: self.partitioned.tasks[p].generation for p in parts}
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
                        if fences[p] < record.offset <= parts[p] and record.key == CLAIM:
                            owner = _claims.decode(record.value).owner
                            if owner != owners[p]:
                                found[p] = owner
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
            self.drop(p)

    async def _release(self, partitions: list[int]) -> None:
        """Say that this worker has written all it will of ``partitions``: once every output is acknowledged, a
        :class:`Release` in each partition of the checkpoint topic that it still owns (a claim since its last check
        gave the partition up already), unless the partition is still in its own hand-over hold (then the next
        owner holds too, for a predecessor of this worker that may still write)."""
        assert self.sender is not None
        await self.sender.flush()
        await self.logs.store_all(self.settings.checkpoint_topic, {
            p: (RELEASE, _encode(Release(self.partitioned.tasks[p].generation)))
            for p in partitions if p in self.partitioned.tasks and p not in self.held})

    async def _release_held(self) -> None:
        """End the hand-over holds that are due: leave out of the outbox the records that a previous owner wrote to
        request-metrics since the new owner's read at its claim, and let the rest go."""
        now = time.monotonic()
        for partition, (until, read_to) in list(self.held.items()):
            if now < until:
                continue
            found, _ = await self.logs.keys_since(self.topics.request_metrics, self.output_partition(partition),
                                                  read_to)
            if partition not in self.held:  # given up meanwhile
                continue
            del self.held[partition]
            if not found:
                continue
            kept, finalised = [], set()
            for requests in self.outbox.requests:
                if requests.partition == partition:
                    finalised.update(found.intersection(requests.ids))
                    requests = requests.rows([i for i, rid in enumerate(requests.ids) if rid not in found])
                if requests.ids:
                    kept.append(requests)
            self.outbox.requests = kept
            self.written.setdefault(partition, set()).update(found - finalised)  # finalised later: skipped then
            log.info("request-metrics partition %d: %d records written by a previous owner during the hand-over: "
                     "not written again", self.output_partition(partition), len(found))

    def drop(self, partition: int) -> None:
        super().drop(partition)
        self.fences.pop(partition, None)
        self.written.pop(partition, None)
        self.held.pop(partition, None)

    async def _commit_offsets(self, consumer: Any, offsets: dict[Any, Any]) -> None:
        """Commit ``start`` offsets. After an outage longer than the session timeout the group has moved on and
        the commit is refused: that is harmless, as a new owner starts from the checkpoint topic, not from these."""
        from aiokafka.errors import CommitFailedError, IllegalStateError

        try:
            await self.health.call("commit", lambda: consumer.commit(offsets))
        except (CommitFailedError, IllegalStateError) as error:
            log.info("offsets not committed, the group rebalanced (%s); the checkpoints hold them", error)

    async def commit_stages(self, stages: list[int]) -> None:
        from aiokafka import TopicPartition
        from aiokafka.structs import OffsetAndMetadata

        assert self.sender is not None
        stages = [stage for stage in sorted(stages) if stage in self.stages.held]
        if not stages:
            return
        # what a checkpoint or snapshot covers was reported before it is stored
        await self.send_routed(self.sender, [], [r for stage in stages for r in self.stages.take_reports(stage)])
        await self.sender.flush()
        for stage in stages:
            taken = await self._snapshot(stage)
            if taken is not None:
                data, covers = taken
                where = await self.logs.store_pieces(data, self.settings.snapshot_topic, stage)
                self._snapshot_stored(stage, where, covers, len(data))
        records = {stage: self._stage_record(stage) for stage in stages}
        await self.logs.store_all(self.settings.regroup_checkpoint_topic,
                                  {stage: (CHECKPOINT, value) for stage, (value, _) in records.items()})
        await self._commit_offsets(self.stage_consumer, {
            TopicPartition(self.settings.regroup_topic, stage): OffsetAndMetadata(start, "")
            for stage, (_, start) in records.items()})


def _transaction_failed() -> tuple[type[Exception], ...]:
    """What a transaction that cannot commit raises: fenced (ProducerFenced, then IllegalOperation for every later
    call of that producer), or an error Kafka does not retry. (aiokafka is imported only when it is needed.)"""
    from aiokafka.errors import IllegalOperation, KafkaError

    return KafkaError, IllegalOperation


class Transactions(Delivery):
    """Exactly-once results with Kafka transactions: each input partition and each stage partition owned has a
    transactional producer of its own (transactional id ``<prefix><group>.input-<p>`` / ``.stage-<q>``), and a
    commit writes the partition's outputs, regroup records, commit marker, checkpoint and consumer offsets in one
    transaction. A new owner's producer, starting with the same transactional id, fences the previous owner's
    (Kafka aborts its open transaction and refuses its later writes), so nothing is written twice, dead letters
    included, however long a worker stalls. Every internal log is read ``read_committed``; consumers of the
    outputs must read them so too (docs/operations.md)."""

    name = "transactions"
    isolation_level = "read_committed"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logs.isolation_level = "read_committed"
        self.senders: dict[int, Sender] = {}  # per input partition owned: its transactional producer
        self.stage_senders: dict[int, Sender] = {}  # per stage partition held
        self._closing: list[Sender] = []  # senders of partitions given up, whose producers are to stop
        #: Per (topic, partition) of the logs kept forever, the offset before which a committed checkpoint needs
        #: nothing, and the offset deleted before so far (:meth:`trim`).
        self.trim_wanted: dict[tuple[str, int], int] = {}
        self.trimmed: dict[tuple[str, int], int] = {}
        self._trim_due = time.monotonic() + self.settings.trim_interval
        self._trim_failed = False
        self._trimming: asyncio.Future[None] | None = None

    def _transactional_id(self, kind: str, partition: int) -> str:
        return f"{self.settings.prefix}{self.settings.group}.{kind}-{partition}"

    async def _open(self, transactional_id: str) -> Sender:
        """A started transactional producer (its start fences every earlier one of the same id and ends their open
        transactions), in a transaction."""
        from aiokafka import AIOKafkaProducer

        from stream_eval.stream.kafka import client_options
        from stream_eval.stream.logs import BATCH_BYTES, LINGER_MS

        settings = self.settings
        # a transaction outlives the producer's resends (a broker away for minutes aborts nothing; a new owner's
        # producer ends a dead owner's transaction at once anyway)
        producer = AIOKafkaProducer(bootstrap_servers=settings.brokers, linger_ms=LINGER_MS, acks="all",
                                    enable_idempotence=True, transactional_id=transactional_id,
                                    transaction_timeout_ms=min(settings.produce_timeout_ms, 900_000),
                                    max_batch_size=BATCH_BYTES, request_timeout_ms=settings.produce_timeout_ms,
                                    **client_options(settings.security))
        sender = Sender(producer, self.health, settings.produce_timeout_ms)
        with self._closed_if_it_fails(sender):
            await self.health.call("startup", producer.start)
            await producer.begin_transaction()
        return sender

    @contextlib.contextmanager
    def _closed_if_it_fails(self, sender: Sender) -> Iterator[None]:
        """A claim under way with ``sender``'s producer: if it fails, the producer goes with those to stop (at the
        next claim, or at :meth:`stop`)."""
        try:
            yield
        except BaseException:
            self._closing.append(sender)
            raise

    async def start(self, consumer: Any, stage_consumer: Any) -> None:
        self.consumer, self.stage_consumer = consumer, stage_consumer

    async def stop(self) -> None:
        self._closing += [*self.senders.values(), *self.stage_senders.values()]
        self.senders, self.stage_senders = {}, {}
        await self._close()
        if self._trimming is not None and not self._trimming.done():
            self._trimming.cancel()
        await self.logs.close()

    def _trim_to(self, topic: str, partition: int, offset: int | None) -> None:
        """A committed checkpoint needs nothing of ``topic``'s ``partition`` before ``offset`` any more."""
        if offset is not None and offset > self.trim_wanted.get((topic, partition), 0):
            self.trim_wanted[topic, partition] = offset

    async def trim(self) -> None:
        """Every ``trim_interval`` seconds, delete the records before what the latest committed checkpoints need:
        of an input partition's checkpoint topic, everything before the windows share its checkpoint names (the
        checkpoint comes after it); of a stage partition's regroup log, everything before the offset its checkpoint
        re-reads from; of its A/B snapshots, everything before the snapshot its checkpoint names. A new owner reads
        nothing before those (it restores the latest committed checkpoint, which is this one or a later one), so
        a trim never races a hand-over. A failure (a broker without DeleteRecords, an ACL missing) is logged once
        and retried at the next interval: the logs only keep growing meanwhile."""
        interval = self.settings.trim_interval
        if interval <= 0 or time.monotonic() < self._trim_due:
            return
        self._trim_due = time.monotonic() + interval
        due = {key: offset for key, offset in self.trim_wanted.items() if offset > self.trimmed.get(key, 0)}
        if due and (self._trimming is None or self._trimming.done()):  # in the background: the loop goes on
            self._trimming = asyncio.ensure_future(self._trim(due))

    async def _trim(self, due: dict[tuple[str, int], int]) -> None:
        try:
            await asyncio.wait_for(self.logs.delete_before(due), 60.0)
        except Exception as error:
            if not self._trim_failed:
                log.warning("could not delete the records the internal logs no longer need (%s: %s); they keep "
                            "growing until this succeeds (docs/operations.md)", type(error).__name__, error)
            self._trim_failed = True
            return
        if self._trim_failed:
            log.warning("the records the internal logs no longer need are deleted again")
        self._trim_failed = False
        self.trimmed.update(due)

    async def _close(self) -> None:
        closing, self._closing = self._closing, []
        for sender in closing:
            sender.abandon()
            try:
                await asyncio.wait_for(sender.producer.stop(), 30.0)
            except Exception as error:  # (a fenced or broken producer: nothing of it counts any more)
                log.info("a producer of a partition given up did not stop cleanly: %s: %s", type(error).__name__, error)

    async def claim(self, partition: int) -> dict[str, int]:
        await self._close()
        sender = await self._open(self._transactional_id("input", partition))
        with self._closed_if_it_fails(sender):
            _, _, starts = await self._restore(partition, None, os.urandom(4).hex())
        self.senders[partition] = sender
        log.info("partition %d: claimed (transactional id %s)", partition, self._transactional_id("input", partition))
        return starts

    async def _commit_transaction(self, sender: Sender, offsets: dict[Any, Any], group: str, again: bool) -> None:
        """Add ``offsets`` of ``group`` to the sender's transaction and commit it; with ``again``, begin the next.
        (aiokafka retries these itself: a broker that does not answer is reported, and waited for.)"""
        producer = sender.producer
        if offsets:
            await self.health.call("commit", lambda: producer.send_offsets_to_transaction(offsets, group),
                                   retry=False)
        await self.health.call("commit", producer.commit_transaction, retry=False)
        sender.committed()
        if again:
            await producer.begin_transaction()

    async def commit(self, partitions: list[int] | None = None, release: bool = False) -> None:
        chosen = sorted(self.partitioned.tasks if partitions is None else partitions)
        # each partition's transaction is its own: they go to the broker side by side (round trips overlap)
        await asyncio.gather(*(self._commit_partition(p, release) for p in chosen if p in self.senders))
        if release:
            await self._close()

    async def _commit_partition(self, partition: int, release: bool) -> None:
        sender, task = self.senders[partition], self.partitioned.tasks.get(partition)
        if task is None:
            return
        try:
            await self.send_outbox(sender, self.outbox.take({partition}))
            checkpoint = None
            if self._checkpointed(partition):
                record = self._windows_record(partition)
                if record is not None:
                    where = await self.logs.store_pieces(record, self.settings.checkpoint_topic, partition,
                                                       WINDOWS, producer=sender.producer)
                    self.partitioned.windows_stored(partition, where)
                checkpoint = self.partitioned.checkpoint(partition)
                await self._store_waiting(checkpoint, producer=sender.producer)
                # its commit marker goes in the same transaction: the stage counts the records when it does
                task.engine.regroup.commit(checkpoint.regroup_seq)  # type: ignore[union-attr]  # set by partitioned
            await self.send_routed(sender, self.partitioned.take_routed(partitions=[partition]), [])
            offsets = {}
            if checkpoint is not None:
                await sender.send_record(self.settings.checkpoint_topic, partition,
                                         (CHECKPOINT, self._encoded(checkpoint), None))
                offsets = self._offsets(partition, checkpoint)
            await self._commit_transaction(sender, offsets, self.settings.group, again=not release)
            if checkpoint is not None and checkpoint.windows is not None:
                self._trim_to(self.settings.checkpoint_topic, partition, checkpoint.windows[0])
        except _transaction_failed() as error:  # fenced by a new owner, or the transaction failed: nothing of it counts
            log.warning("partition %d: its transaction failed (%s: %s): given up without committing",
                        partition, type(error).__name__, error)
            self.drop(partition)
            self.lost[partition] = time.monotonic()
            return
        if release:
            self._closing.append(self.senders.pop(partition))

    def drop(self, partition: int) -> None:
        super().drop(partition)
        sender = self.senders.pop(partition, None)
        if sender is not None:
            self._closing.append(sender)

    async def claim_stage(self, stage: int) -> int | None:
        sender = await self._open(self._transactional_id("stage", stage))
        with self._closed_if_it_fails(sender):
            start = await super().claim_stage(stage)
        self.stage_senders[stage] = sender
        return start

    async def commit_stages(self, stages: list[int]) -> None:
        await asyncio.gather(*(self._commit_stage(q) for q in sorted(stages) if q in self.stage_senders))

    async def _commit_stage(self, stage: int) -> None:
        from aiokafka import TopicPartition
        from aiokafka.structs import OffsetAndMetadata

        sender = self.stage_senders[stage]
        if stage not in self.stages.held:
            return
        try:
            await self.send_routed(sender, [], self.stages.take_reports(stage))
            taken = await self._snapshot(stage)
            if taken is not None:
                data, covers = taken
                where = await self.logs.store_pieces(data, self.settings.snapshot_topic, stage,
                                                   producer=sender.producer)
                self._snapshot_stored(stage, where, covers, len(data))
            value, start = self._stage_record(stage)
            await sender.send_record(self.settings.regroup_checkpoint_topic, stage, (CHECKPOINT, value, None))
            offsets = {TopicPartition(self.settings.regroup_topic, stage): OffsetAndMetadata(start, "")}
            await self._commit_transaction(sender, offsets, f"{self.settings.group}.regroup", again=True)
            self._trim_to(self.settings.regroup_topic, stage, start)
            ref = self.stages.held[stage].stage.snapshot_ref if stage in self.stages.held else None
            self._trim_to(self.settings.snapshot_topic, stage, None if ref is None else ref[0][0])
        except _transaction_failed() as error:
            log.warning("stage partition %d: its transaction failed (%s: %s): given up without committing",
                        stage, type(error).__name__, error)
            with self.lock:
                self.stages.give_up(stage)
            self._closing.append(self.stage_senders.pop(stage))
            self.lost_stages[stage] = time.monotonic()

    async def release_stages(self, stages: list[int]) -> None:
        await super().release_stages(stages)
        self._closing += [self.stage_senders.pop(stage) for stage in stages if stage in self.stage_senders]
        await self._close()


async def transactions_supported(settings: WorkerSettings) -> bool:
    """Whether the broker runs transactions: a transactional producer (id ``<prefix><group>.probe``) starts and
    commits an empty transaction."""
    from stream_eval.stream.kafka import idempotence_supported

    return await idempotence_supported(settings.brokers, settings.security,
                                       f"{settings.prefix}{settings.group}.probe")


def refuse_transactions(settings: WorkerSettings, supported: bool) -> None:
    """``--delivery transactions`` on a broker that does not run them: a ConfigError."""
    if settings.delivery == "transactions" and not supported:
        raise ConfigError(f"--delivery transactions: the broker at {','.join(settings.brokers)} does not run "
                          "transactions (use --delivery fenced-log or auto)")


DELIVERIES: dict[str, type[Delivery]] = {d.name: d for d in (FencedLog, Transactions)}
