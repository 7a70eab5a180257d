"""Fetched messages as aiokafka parsed them, without a ``ConsumerRecord`` each, or as one buffer: for the worker's
own consumers.

For every message it hands out, aiokafka builds a ``ConsumerRecord`` (a Python dataclass of eleven fields, the
headers copied into a tuple) from the record its compiled parser made. The worker reads four of those fields
(``offset``, ``timestamp``, ``key``, ``value``), which the parsed record has too; what building the dataclass
cost a worker is in docs/benchmarks.md ("Where a worker's CPU goes").

A consumer created with ``value_deserializer=RAW`` (:func:`lean_options`) gets the parsed records themselves, once
:func:`install` has run (the worker calls it before it creates its consumers).

A consumer created with ``value_deserializer=JOINED`` (``lean_options(joined=True)``: the worker's input consumer)
gets, for each topic-partition of a fetch, one :class:`Joined`: the values one after the other in one buffer,
separated by line feeds (what the line reader of ``events/messages.py`` reads), with each one's offset and
timestamp, read from the fetched bytes by a compiled loop (``stream/compiled.py``) without an object per message.
Batches are taken as aiokafka takes them: their CRCs checked, control batches and (``read_committed``) aborted
transactions' batches skipped, the records before the fetch position left out, ``max_records`` at a time. A fetch
that holds a batch the loop does not read (compressed, the old formats) or that aiokafka's parser would refuse
goes the ``RAW`` way instead, whole: its records, one object each, or aiokafka's own error.

Every other consumer of the process, faust's among them, still gets ``ConsumerRecord`` objects: only the markers
select the shortcuts. ``RAW`` and ``JOINED`` are the identity, so where the shortcuts are not installed (an aiokafka
without ``PartitionRecords._consumer_record`` or ``FetchResult.getall``), the same consumer gets ``ConsumerRecord``
objects with the same values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from stream_eval.stream.compiled import READ, Bools, Bytes, Ints, unpack_values


def RAW(value: bytes | None) -> bytes | None:  # noqa: N802  # a marker, named like a constant
    """The value as fetched (the marker of a consumer that takes aiokafka's parsed records)."""
    return value


def JOINED(value: bytes | None) -> bytes | None:  # noqa: N802  # a marker, named like a constant
    """The value as fetched (the marker of a consumer that takes each partition's records as one :class:`Joined`)."""
    return value


class Values(Sequence[bytes | None]):
    """The values of a :class:`Joined`, each made when asked for."""

    __slots__ = ("_buffer", "_starts", "_ends", "_nulls")

    def __init__(self, buffer: Bytes, starts: Ints, ends: Ints, nulls: Bools) -> None:
        self._buffer, self._starts, self._ends, self._nulls = buffer, starts, ends, nulls

    def __len__(self) -> int:
        return int(self._starts.shape[0])

    @overload
    def __getitem__(self, index: int) -> bytes | None: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes | None]: ...

    def __getitem__(self, index: int | slice) -> bytes | None | list[bytes | None]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if self._nulls[index]:
            return None
        return self._buffer[self._starts[index] : self._ends[index]].tobytes()

    def __iter__(self) -> Iterator[bytes | None]:
        return map(self.__getitem__, range(len(self)))


class Joined:
    """Messages of one topic-partition, in offset order: ``offsets``; ``timestamps`` (Kafka's, milliseconds);
    ``values`` (:class:`Values`); ``joined``, the values separated by line feeds as one ``bytes`` (None when a value
    is null: the values are then read one by one)."""

    __slots__ = ("offsets", "timestamps", "values", "joined")

    def __init__(self, offsets: Ints, timestamps: Ints, buffer: Bytes, starts: Ints, ends: Ints,
                 nulls: Bools) -> None:
        self.offsets: list[int] = offsets.tolist()
        self.timestamps = timestamps
        self.values = Values(buffer, starts, ends, nulls)
        self.joined = None if nulls.any() or not len(self.offsets) else \
            buffer[starts[0] : ends[-1]].tobytes()

    def __len__(self) -> int:
        return len(self.offsets)


class _Unpacked:
    """A fetched partition's messages read in one pass, handed out ``max_records`` at a time."""

    __slots__ = ("buffer", "offsets", "stamps", "starts", "ends", "nulls", "count", "given", "position")

    def __init__(self, buffer: Bytes, offsets: Ints, stamps: Ints, starts: Ints, ends: Ints, nulls: Bools,
                 count: int, position: int) -> None:
        self.buffer, self.offsets, self.stamps, self.starts, self.ends, self.nulls = \
            buffer, offsets, stamps, starts, ends, nulls
        self.count, self.given, self.position = count, 0, position  # position: after the fetch's last batch

    def take(self, records: Any, max_records: int | None) -> Joined:
        """The next ``max_records`` messages (all that are left: None), moving the partition's position past them
        as aiokafka moves it."""
        first = self.given
        last = self.count if max_records is None else min(self.count, first + max_records)
        self.given = last
        if last == self.count:
            records.next_fetch_offset = self.position
        elif last > first:
            records.next_fetch_offset = int(self.offsets[last - 1]) + 1
        return Joined(self.offsets[first:last], self.stamps[first:last], self.buffer, self.starts[first:last],
                      self.ends[first:last], self.nulls[first:last])

    @property
    def done(self) -> bool:
        return self.given >= self.count


def _unpack(records: Any) -> _Unpacked | None:
    """Every message of a fetched partition (aiokafka's ``PartitionRecords`` before it handed any out) read as its
    ``_unpack_records`` reads them, or None when the compiled loop cannot read the fetch (the records then go
    aiokafka's way, which raises its own errors)."""
    from aiokafka.consumer.fetcher import READ_COMMITTED
    from aiokafka.record.memory_records import MemoryRecords

    raw = getattr(records._records, "raw", None)
    if raw is None:
        return None
    buf = np.frombuffer(raw, dtype=np.uint8)
    batches = MemoryRecords(raw)  # (its own walk: the partition's is left as it was, for aiokafka's way)
    aborted = list(records._aborted_transactions)
    aborted_producers = set(records._aborted_producers)
    committed_only = records._isolation_level == READ_COMMITTED
    position = records.next_fetch_offset
    out = np.empty(len(raw), dtype=np.uint8)  # (the values and their separators fit in the bytes they came in)
    size = 1024
    offsets, stamps = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64)
    starts, ends, nulls = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64), np.empty(size, dtype=np.bool_)
    n = out_pos = at = 0
    while batches.has_next():
        batch = batches.next_batch()
        start = at
        at += 12 + int.from_bytes(raw[start + 8 : start + 12], "big", signed=True)
        if batch.magic < 2 or batch.base_offset != int.from_bytes(raw[start : start + 8], "big", signed=True):
            return None
        if records._check_crcs and not _crc_valid(batch, buf, start, at):
            return None
        if committed_only and batch.producer_id is not None:  # (aiokafka's own rules, batch by batch)
            while aborted and aborted[0][1] <= batch.base_offset:
                aborted_producers.add(aborted.pop(0)[0])
            if batch.is_control_batch and records._contains_abort_marker(batch):
                aborted_producers.discard(batch.producer_id)
            if batch.is_transactional and batch.producer_id in aborted_producers:
                position = batch.next_offset
                continue
        if batch.is_control_batch:
            position = batch.next_offset
            continue
        if batch.compression_type:
            return None
        count = int.from_bytes(raw[start + 57 : start + 61], "big", signed=True)
        if not 0 <= count <= (at - start - 61) // 7:  # (a record takes at least 7 bytes: a count no batch holds)
            return None
        if n + count > size:
            size = max(2 * size, n + count)
            offsets, stamps, starts, ends = (np.resize(column, size) for column in (offsets, stamps, starts, ends))
            nulls = np.resize(nulls, size).astype(np.bool_, copy=False)
        n, out_pos, position, status = unpack_values(
            buf, start + 61, at, count, batch.base_offset, batch.first_timestamp, batch.timestamp_type == 1,
            batch.max_timestamp, position, out, out_pos, offsets, stamps, starts, ends, nulls, n)
        if status != READ:
            return None
        position = batch.next_offset
    records._aborted_transactions, records._aborted_producers = aborted, aborted_producers
    return _Unpacked(out, offsets[:n], stamps[:n], starts[:n], ends[:n], nulls[:n], n, position)


def _hardware_crc32c() -> Callable[[Bytes], int] | None:
    """google-crc32c's ``value`` when its compiled library is there (CRC-32C by the CPU's instruction, several times
    aiokafka's table-driven loop; it takes a NumPy view of the fetched bytes without a copy), else None."""
    try:
        import google_crc32c
    except ImportError:
        return None
    value: Callable[[Bytes], int] = google_crc32c.value
    return value if google_crc32c.implementation == "c" else None


_crc32c = _hardware_crc32c()
#: Where a record batch's attributes start (after its base offset, length, leader epoch, magic and CRC).
_ATTRIBUTES = 21


def _crc_valid(batch: Any, buf: Bytes, start: int, end: int) -> bool:
    """Whether the record batch in ``buf[start:end]`` has the CRC-32C it states, over its bytes from its attributes
    on (what aiokafka's ``validate_crc`` checks)."""
    if _crc32c is None:
        return bool(batch.validate_crc())
    return _crc32c(buf[start + _ATTRIBUTES : end]) == int(batch.crc)


_installed = False


def install() -> bool:
    """Let consumers created with ``value_deserializer=RAW`` get aiokafka's parsed records, and those created with
    ``JOINED`` a :class:`Joined` per partition (idempotent); ``False`` where this aiokafka has no such hooks (they
    then get ``ConsumerRecord`` objects, as any other consumer)."""
    global _installed
    if _installed:
        return True
    try:
        from aiokafka.consumer import fetcher
        from aiokafka.consumer.fetcher import FetchResult, PartitionRecords
    except ImportError:
        return False
    original = getattr(PartitionRecords, "_consumer_record", None)
    getall = getattr(FetchResult, "getall", None)
    if original is None or getall is None or not hasattr(fetcher, "MemoryRecords"):
        return False

    def consumer_record(self: Any, tp: Any, record: Any) -> Any:
        if self._value_deserializer in (RAW, JOINED) and self._key_deserializer is None:
            return record  # (offset, timestamp, timestamp_type, key, value, headers, checksum)
        return original(self, tp, record)

    def joined_getall(self: Any, max_records: int | None = None) -> Any:
        records = self._partition_records
        if records is None or records._value_deserializer is not JOINED or records._key_deserializer is not None:
            return getall(self, max_records)
        if not self.check_assignment(self._topic_partition):  # (revoked, paused or moved: nothing, as aiokafka)
            return []
        unpacked: _Unpacked | None
        if hasattr(records, "_stream_eval_unpacked"):
            unpacked = records._stream_eval_unpacked
        else:  # (first call: read the whole fetch, or leave it to aiokafka, which raises its own errors)
            try:
                unpacked = _unpack(records)
            except Exception:  # (aiokafka's batch reader refused a batch)
                unpacked = None
            records._stream_eval_unpacked = unpacked
        if unpacked is None:
            return getall(self, max_records)
        taken = unpacked.take(records, max_records)
        self._update_position()
        if unpacked.done:
            self._partition_records = None
        return taken if len(taken) else []

    class KeptRecords(fetcher.MemoryRecords):  # type: ignore[misc]  # aiokafka is untyped
        """aiokafka's records of a fetched partition, with the bytes they are read from (``raw``)."""

        def __init__(self, raw: bytes) -> None:
            super().__init__(raw)
            self.raw = raw

    PartitionRecords._consumer_record = consumer_record
    FetchResult.getall = joined_getall
    fetcher.MemoryRecords = KeptRecords
    _installed = True
    return True


def warm_up() -> None:
    """Read a fetch of one message as the input consumer reads one, so that numba loads the compiled loop from its
    cache before the worker joins its group."""
    from aiokafka.consumer import fetcher
    from aiokafka.consumer.fetcher import PartitionRecords
    from aiokafka.record.default_records import DefaultRecordBatchBuilder
    from aiokafka.structs import TopicPartition

    if not install():  # (this aiokafka has no hooks: its consumers get ConsumerRecord objects)
        return
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 16)
    builder.append(0, timestamp=0, key=None, value=b"{}", headers=[])
    records = PartitionRecords(TopicPartition("warm-up", 0), fetcher.MemoryRecords(bytes(builder.build())), [], 0,
                               None, JOINED, True, 0)
    unpacked = _unpack(records)
    assert unpacked is not None and unpacked.take(records, None).joined == b"{}"


def lean_options(joined: bool = False) -> dict[str, Any]:
    """Options of an ``AIOKafkaConsumer`` whose records need only ``offset``, ``timestamp``, ``key`` and ``value``
    (after :func:`install`: aiokafka's parsed records), or (``joined``) that reads each partition's records as a
    :class:`Joined`."""
    install()
    return {"value_deserializer": JOINED if joined else RAW}
