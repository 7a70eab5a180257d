"""The worker's reads and writes of Kafka logs, through the broker's health (``stream/backoff.py``).

:class:`Sender` hands records to one producer in whole batches and waits until they are stored; :class:`Logs`
stores and reads the records of the internal logs (checkpoints, claims, pieces of snapshots) and finds what a
partition holds. Both retry while the broker is away. Which records go where, and when, is the delivery's
(``stream/delivery.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import orjson

from stream_eval.engine import snapshot
from stream_eval.stream.backoff import BrokerHealth
from stream_eval.stream.batches import Record, Records, column_batches
from stream_eval.stream.kafka import KafkaSecurity, client_options

log = logging.getLogger("stream_eval.worker")
#: The producer's batch size; records of at least ``LARGE_RECORD`` bytes go through ``producer.send`` alone.
BATCH_BYTES = 1 << 20
#: The worker's producers send a batch as soon as their sender task runs (aiokafka's ``linger_ms``): what the worker
#: writes is awaited soon after (a commit's probe, outputs, checkpoints and markers are each a round trip on the
#: loop's path), and a linger would add itself to each of those round trips (aiokafka's ``flush`` waits it out). What
#: is written while a request is in flight (aiokafka sends one at a time to a broker) goes in the next request, so
#: records written in a burst still share requests after the first.
LINGER_MS = 0
LARGE_RECORD = 64 << 10
#: Key of a checkpoint record (the other keys of a checkpoint topic are the delivery's: ``stream/delivery.py``).
CHECKPOINT = b"checkpoint"

#: A record's headers: (name, value) pairs.
Headers = list[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class _Sent:
    """Records handed to the producer since the last flush, with the future that says whether they were stored."""

    future: asyncio.Future[Any]
    topic: str
    partition: int | None
    records: Sequence[Record]
    headers: list[Headers | None] | None = None  # each record's (None: none has headers)


class Sender:
    """Sends records through ``producer`` in whole batches per partition; :meth:`flush` waits until every one is
    stored, and :attr:`ends` then holds, per (topic, partition) sent to with a number, the end offset of the last
    batch acknowledged."""

    def __init__(self, producer: Any, health: BrokerHealth, produce_timeout_ms: int = 600_000) -> None:
        self.producer = producer
        self.health = health
        self.produce_timeout_ms = produce_timeout_ms
        self.ends: dict[tuple[str, int], int] = {}
        self._sent: list[_Sent] = []

    async def send_batches(self, topic: str, records: Sequence[Record], partition: int | None = None,
                           headers: Sequence[Headers] | None = None) -> None:
        """Send (key, value, timestamp ms) records in order, as whole batches per partition; ``headers``: each
        record's headers.

        What ``producer.send`` does per record (partition by the key's murmur2 hash, like every Kafka client's
        default partitioner; records without a key all to one partition chosen at random, as a sticky partitioner
        does for a batch), without its per-record future and accumulator call, which cost much of producing a
        worker's outputs (docs/benchmarks.md); sent one by one, with nothing to share its request, a record took
        ~30 times the CPU of its place in a batch. Delivery is awaited by :meth:`flush`.
        """
        from aiokafka.partitioner import DefaultPartitioner

        producer = self.producer
        by_partition: Mapping[int, Sequence[int] | None]  # the records' indexes per partition (None: all of them)
        if partition is None:
            all_partitions = sorted(await self.health.call("produce", lambda: producer.partitions_for(topic)))
            choose = DefaultPartitioner()
            keyless = choose(None, all_partitions, all_partitions)
            by_key: dict[int, list[int]] = {}
            for k, record in enumerate(records):
                key = record[0]
                by_key.setdefault(keyless if key is None else choose(key, all_partitions, all_partitions),
                                  []).append(k)
            by_partition = by_key
        else:
            by_partition = {partition: None}  # as given: no copy
        for number, indexes in by_partition.items():
            part = records if indexes is None else [records[k] for k in indexes]
            these = headers if headers is None or indexes is None else [headers[k] for k in indexes]
            batch, start = producer.create_batch(), 0  # the batch holds part[start:k]
            for k, (key, value, ts_ms) in enumerate(part):
                if len(value) + len(key or b"") >= LARGE_RECORD:
                    # producer.send checks the size and raises for a record the broker would refuse (a batch
                    # builder takes any first record); queued after the batch so far, so order holds
                    if k > start:
                        await self._send_batch(topic, number, batch, part, these, start, k)
                        batch = producer.create_batch()
                    await self.send_record(topic, number, part[k], None if these is None else these[k])
                    start = k + 1
                    continue
                while (batch.append(key=key, value=value, timestamp=ts_ms) if these is None else
                       batch.append(key=key, value=value, timestamp=ts_ms, headers=these[k])) is None:
                    # full: sent, and the record goes into the next (which takes any first record)
                    await self._send_batch(topic, number, batch, part, these, start, k)
                    batch, start = producer.create_batch(), k
            if len(part) > start:
                await self._send_batch(topic, number, batch, part, these, start, len(part))

    async def send_records(self, topic: str, partition: int, records: Records) -> None:
        """Send ``records``, as columns, in order to ``partition``, in whole batches written by a compiled loop
        (``stream/batches.py``) rather than a record at a time; a record of ``LARGE_RECORD`` bytes or more alone,
        in its place, as :meth:`send_batches` sends it. Delivery is awaited by :meth:`flush`."""
        producer = self.producer
        manager = getattr(producer, "_txn_manager", None)  # (as aiokafka's producer marks its batches)
        transactional = manager is not None and manager.transactional_id is not None
        total = len(records)
        start = 0
        for stop in [*np.flatnonzero(records.sizes() >= LARGE_RECORD).tolist(), total]:
            if stop > start:
                run, done = records[start:stop], 0  # (views of the columns)
                for batch, end in column_batches(run, BATCH_BYTES, transactional):
                    future = await self.health.call("produce", partial(producer.send_batch, batch, topic,
                                                                       partition=partition))
                    self._sent.append(_Sent(future, topic, partition, run[done:end]))
                    done = end
            if stop < total:
                await self.send_record(topic, partition, records[stop])
            start = stop + 1

    async def _send_batch(self, topic: str, partition: int, batch: Any, records: Sequence[Record],
                          headers: Sequence[Headers] | None, start: int, end: int) -> None:
        """Queue a batch holding ``records[start:end]`` (retried while the client cannot queue it: nothing is queued
        twice)."""
        producer = self.producer
        future = await self.health.call("produce", lambda: producer.send_batch(batch, topic, partition=partition))
        self._sent.append(_Sent(future, topic, partition, list(records[start:end]),
                                None if headers is None else list(headers[start:end])))

    async def send_record(self, topic: str, partition: int | None, record: Record,
                          headers: Headers | None = None) -> None:
        producer = self.producer
        key, value, ts_ms = record
        future = await self.health.call("produce", lambda: producer.send(
            topic, value, key=key, partition=partition, timestamp_ms=ts_ms, headers=headers))
        self._sent.append(_Sent(future, topic, partition, [record], None if headers is None else [headers]))

    def abandon(self) -> None:
        """Forget the records not known to be stored (their partition is given up: a transaction that will not
        commit); their failures are not errors to report."""
        for sent in self._sent:
            sent.future.add_done_callback(lambda future: future.cancelled() or future.exception())
        self._sent.clear()

    def committed(self) -> None:
        """Every record sent is stored: its transaction was committed (which waits for all of them)."""
        self._sent.clear()

    async def flush(self) -> None:
        """Wait until every record sent so far is stored (however long the broker is away).

        aiokafka resends a batch that failed for a retriable reason until ``produce_timeout_ms`` has passed and then
        fails its future (``flush`` does not raise): such batches are sent again here, as nothing must be lost,
        though the broker may have stored them already (a request it answered too late).
        """
        while True:
            await self.health.call("flush", self.producer.flush)
            sent, self._sent = self._sent, []
            failed = [s for s in sent if s.future.done() and not s.future.cancelled() and s.future.exception()]
            for s in sent:
                if s.partition is not None and s.future.done() and not s.future.cancelled() \
                        and s.future.exception() is None and s.future.result() is not None:
                    end, where = s.future.result().offset + len(s.records), (s.topic, s.partition)
                    self.ends[where] = max(end, self.ends.get(where, 0))
            self._sent = [s for s in sent if not s.future.done()]
            if not failed:
                return
            error = failed[0].future.exception()
            self.health.failed("produce", f"{type(error).__name__}: {error}")
            log.warning("%d batches of records were not acknowledged in %d s (%s): sending them again; some may be "
                        "stored twice", len(failed), self.produce_timeout_ms // 1000, error)
            for s in failed:
                for record, headers in zip(s.records, s.headers or [None] * len(s.records), strict=True):
                    await self.send_record(s.topic, s.partition, record, headers)


class Logs:
    """Stores and reads the records of Kafka logs for the worker: ``producer`` writes (set once started), readers
    of their own (no group) read, ``isolation_level`` ``read_committed`` where the logs are written in
    transactions."""

    def __init__(self, brokers: list[str], health: BrokerHealth, security: KafkaSecurity | None = None,
                 isolation_level: str = "read_uncommitted") -> None:
        self.brokers = brokers
        self.health = health
        self.security = security
        self.isolation_level = isolation_level
        self.producer: Any = None
        self._admin: Any = None  # for DeleteRecords, started when first needed

    async def store(self, topic: str, value: bytes, partition: int, key: bytes = CHECKPOINT) -> int:
        """Write one record and wait until it is stored, again after a broker error (a second copy of a checkpoint
        record is harmless); returns its offset."""
        producer = self.producer
        stored = await self.health.call("checkpoint", lambda: producer.send_and_wait(topic, value, partition=partition,
                                                                                     key=key))
        return int(stored.offset)

    async def store_all(self, topic: str, records: Mapping[int, tuple[bytes, bytes]]) -> dict[int, int]:
        """Write one (key, value) record to each partition given, all at once (one round trip, not one each);
        their offsets."""
        producer, chosen = self.producer, sorted(records)
        if not chosen:
            return {}

        async def write() -> list[Any]:
            sent = [await producer.send(topic, records[p][1], partition=p, key=records[p][0]) for p in chosen]
            return list(await asyncio.gather(*sent))

        stored = await self.health.call("checkpoint", write)
        return {p: int(metadata.offset) for p, metadata in zip(chosen, stored, strict=True)}

    async def store_pieces(self, data: bytes, topic: str, partition: int, key: bytes | None = None,
                           producer: Any = None) -> tuple[int, int]:
        """Store ``data`` in pieces below Kafka's message size (through ``producer``, default this one's: a
        transactional producer writes them in its transaction); returns where: (first offset, number of pieces)."""
        producer = producer or self.producer
        pieces = snapshot.chunks(data)

        async def write() -> list[Any]:
            sent = [await producer.send(topic, piece, partition=partition, key=key) for piece in pieces]
            return list(await asyncio.gather(*sent))

        stored = await self.health.call("checkpoint", write)
        return int(stored[0].offset), len(pieces)

    async def read_pieces(self, where: tuple[int, int], topic: str, partition: int) -> bytes:
        """The pieces of a snapshot stored by :meth:`store_pieces`, joined (retried while the broker is away)."""
        first, count = where

        async def read() -> bytes:
            async with self.reader(topic, partition, max_partition_fetch_bytes=2 * snapshot.CHUNK_BYTES) as (
                    reader, tp):
                reader.seek(tp, first)
                pieces: list[bytes] = []
                while len(pieces) < count:
                    batch = await reader.getmany(tp, timeout_ms=5_000)
                    records = batch.get(tp, [])
                    if not records:
                        raise TimeoutError(f"snapshot pieces from offset {first} unreadable")
                    pieces += [r.value for r in records if first <= r.offset < first + count][: count - len(pieces)]
                return b"".join(pieces)

        data: bytes = await self.health.call("checkpoint", read)
        return data

    @contextlib.asynccontextmanager
    async def reader(self, topic: str, partition: int, **options: Any) -> AsyncIterator[tuple[Any, Any]]:
        """A consumer of its own (no group) started and assigned to one partition: ``(consumer, partition)``."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        # (an offset before the log's start, records deleted by a trim, reads from its start)
        reader = AIOKafkaConsumer(bootstrap_servers=self.brokers, enable_auto_commit=False, fetch_max_wait_ms=50,
                                  isolation_level=self.isolation_level, **client_options(self.security),
                                  **{"auto_offset_reset": "earliest", **options})
        try:
            await reader.start()
            tp = TopicPartition(topic, partition)
            reader.assign([tp])
            yield reader, tp
        finally:
            # (aiokafka's stop awaits a task it cancels: one that has not run yet raises CancelledError)
            await asyncio.sleep(0)
            await reader.stop()

    @classmethod
    async def _fetch_to(cls, reader: Any, tp: Any, end: int) -> None:
        """Fetch from the reader's position until a record comes or the position reaches ``end`` (past markers)."""
        fetches = cls._read_to(reader, tp, end)
        try:
            async for records in fetches:
                if records:
                    return
        finally:
            await fetches.aclose()

    @staticmethod
    async def _read_to(reader: Any, tp: Any, end: int, patience: float = 5.0) -> AsyncGenerator[list[Any], None]:
        """The records from the reader's position to offset ``end``, as fetched. Short fetches: read
        ``read_committed``, the last offsets before ``end`` are often a transaction's marker, which takes an offset
        and returns no record (the reader's position passes it at the fetch after). A position that does not move
        for ``patience`` seconds is a broker that does not answer: TimeoutError (retried)."""
        loop = asyncio.get_running_loop()
        at, moved = await reader.position(tp), loop.time()
        while at < end:
            yield (await reader.getmany(tp, timeout_ms=100)).get(tp, [])
            at, was = await reader.position(tp), at
            if at != was:
                moved = loop.time()
            elif loop.time() - moved >= patience:
                raise TimeoutError(f"{tp.topic}/{tp.partition} unreadable at offset {at}")

    async def delete_before(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Delete the records before ``offsets[(topic, partition)]`` (Kafka's DeleteRecords: the partition's log
        start moves there; the broker frees the segments wholly before it). One attempt: an error is raised."""
        from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
        from aiokafka.structs import TopicPartition

        if self._admin is None:
            self._admin = AIOKafkaAdminClient(bootstrap_servers=self.brokers, **client_options(self.security))
            await self._admin.start()
        wanted = {TopicPartition(topic, partition): RecordsToDelete(offset)
                  for (topic, partition), offset in offsets.items()}
        await self._admin.delete_records(wanted, timeout_ms=30_000)

    async def close(self) -> None:
        """Close the admin client, if one was started."""
        admin, self._admin = self._admin, None
        if admin is not None:
            await admin.close()

    async def last_checkpoint(self, topic: str, partition: int, before: int | None = None) -> tuple[Any, Any]:
        """The last checkpoint record (key :data:`CHECKPOINT`) of a checkpoint topic's partition before offset
        ``before`` (default: the end), decoded, and the very last record there (a consumer record); retried while
        the broker is away. (One checkpoint record per produce batch, so the end offset is exact even with the
        development broker's ListOffsets bug.)"""
        found: tuple[Any, Any] = await self.health.call(
            "checkpoint", lambda: self._read_last_checkpoint(topic, partition, before))
        return found

    async def _read_last_checkpoint(self, topic: str, partition: int, before: int | None) -> tuple[Any, Any]:
        if before == 0:
            return None, None
        async with self.reader(topic, partition) as (reader, tp):
            # (read_committed: the end is the last stable offset, and transaction markers take offsets of their own)
            end = (await reader.end_offsets([tp]))[tp] if before is None else before
            back, last = 1, None
            while back <= 4 * end:  # the last checkpoint record; pieces of a windows share may follow it
                reader.seek(tp, max(end - back, 0))
                records: list[Any] = []
                async for more in self._read_to(reader, tp, end):
                    records += more
                before_end = [r for r in records if r.offset < end]
                if back == 1 and before_end:
                    last = before_end[-1]
                found = [r for r in before_end if r.key in (CHECKPOINT, None)]  # (None: old logs)
                if found:
                    return orjson.loads(found[-1].value), last
                back *= 4
            return None, last

    async def end_offset(self, topic: str, partition: int) -> int:
        """The partition's end offset: the high-water mark of a fetch of its last batch (the development broker's
        ListOffsets gives the last batch's base offset + 1)."""

        async def read() -> int:  # (a fetch returns the last batch whole: up to BATCH_BYTES of outputs)
            async with self.reader(topic, partition, max_partition_fetch_bytes=4 * BATCH_BYTES) as (reader, tp):
                end = int((await reader.end_offsets([tp]))[tp])
                if end == 0:
                    return 0
                reader.seek(tp, end - 1)
                # (the last offset may be a transaction's marker, which no fetch returns: its position passes it)
                await self._fetch_to(reader, tp, end)
                return max(end, int(reader.highwater(tp) or 0))

        end: int = await self.health.call("checkpoint", read)
        return end

    async def keys_since(self, topic: str, partition: int, start: int) -> tuple[set[str], int]:
        """The keys of the records in ``topic``'s ``partition`` from offset ``start`` on, and the end offset read
        to."""
        end = await self.end_offset(topic, partition)

        async def read() -> set[str]:
            async with self.reader(topic, partition, max_partition_fetch_bytes=4 * BATCH_BYTES) as (reader, tp):
                reader.seek(tp, start)
                keys: set[str] = set()
                async for records in self._read_to(reader, tp, end):
                    keys.update(record.key.decode() for record in records
                                if record.key is not None and record.offset < end)
                return keys

        if end <= start:
            return set(), start
        found: set[str] = await self.health.call("checkpoint", read)
        return found, end
