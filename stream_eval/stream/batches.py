"""Kafka record batches written from columns: the worker's request-metrics records, without an object per record.

aiokafka's batch builder takes one record per call: its key and value as bytes objects, its timestamp, a metadata
object made for each. The worker writes a request-metrics record per finalised request, so a backlog of 100,000
requests made 100,000 values, keys and tuples, sorted by partition and appended one by one. Here the records of a
partition are :class:`Records`: their keys, values and timestamps as columns (the values one after the other in
one buffer, as ``FinalisedBatch.encoded_values`` makes them), written into batches by a compiled loop
(``stream/compiled.py``'s ``pack_records``). A :class:`ColumnBatch` is handed to aiokafka's ``send_batch`` as its
own builder would be: the same bytes (the test suite compares them), its header written when the producer sends it
(with the idempotent or transactional producer's state, as aiokafka's builder does).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from stream_eval.stream.compiled import pack_records

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int64]
#: A record: (key, value, timestamp in ms or None for the producer's clock), as ``stream/logs.py`` sends them.
Record = tuple[bytes | None, bytes, int | None]

#: Kafka's record batch header (format v2): base offset, length, partition leader epoch, magic, CRC, attributes, last
#: offset delta, first and largest timestamps, producer id, producer epoch, base sequence, record count.
_HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC_AT = struct.calcsize(">qiib")
_ATTRIBUTES_AT = struct.calcsize(">qiibI")
_AFTER_LENGTH = struct.calcsize(">qi")
_TRANSACTIONAL = 0x10
#: Bytes a record takes beyond its key and value, at most (aiokafka's ``MAX_RECORD_OVERHEAD``).
_RECORD_OVERHEAD = 21


def ends_of(lengths: Sequence[int] | Ints) -> Ints:
    """Where each piece ends, pieces of these ``lengths`` laid one after the other."""
    return np.cumsum(np.asarray(lengths, dtype=np.int64), dtype=np.int64)


class Records(Sequence[Record]):
    """Records as columns: record ``i`` has key ``keys[key_ends[i - 1]:key_ends[i]]`` (from 0 for the first), value
    likewise, and timestamp ``stamps[i]`` in milliseconds (-1: none, the producer's clock). Every record has a key.

    >>> records = Records.of([b"k1", b"k2"], [b"v1", b"value2"], [5, -1])
    >>> len(records), records[1], records.sizes().tolist()
    (2, (b'k2', b'value2', None), [4, 8])
    >>> list(Records.joined([records, records[1:]]))[2]
    (b'k2', b'value2', None)
    """

    __slots__ = ("keys", "key_ends", "values", "value_ends", "stamps")

    def __init__(self, keys: Bytes, key_ends: Ints, values: Bytes, value_ends: Ints, stamps: Ints) -> None:
        self.keys, self.key_ends, self.values, self.value_ends, self.stamps = keys, key_ends, values, value_ends, stamps

    @classmethod
    def of(cls, keys: Sequence[bytes], values: Sequence[bytes], stamps: Sequence[int]) -> Records:
        """Records from one object per key and value."""
        return cls(np.frombuffer(b"".join(keys), dtype=np.uint8), ends_of(list(map(len, keys))),
                   np.frombuffer(b"".join(values), dtype=np.uint8), ends_of(list(map(len, values))),
                   np.asarray(stamps, dtype=np.int64))

    @classmethod
    def joined(cls, parts: Sequence[Records]) -> Records:
        """``parts``' records one after the other."""
        if len(parts) == 1:
            return parts[0]
        key_base = np.cumsum([0] + [len(part.keys) for part in parts[:-1]])
        value_base = np.cumsum([0] + [len(part.values) for part in parts[:-1]])
        return cls(np.concatenate([part.keys for part in parts]),
                   np.concatenate([part.key_ends + base for part, base in zip(parts, key_base.tolist(), strict=True)]),
                   np.concatenate([part.values for part in parts]),
                   np.concatenate([part.value_ends + base
                                   for part, base in zip(parts, value_base.tolist(), strict=True)]),
                   np.concatenate([part.stamps for part in parts]))

    def __len__(self) -> int:
        return len(self.stamps)

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> Records: ...

    def __getitem__(self, index: int | slice) -> Record | Records:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return self.rows(np.arange(start, stop, step))
            return self._run(start, max(start, stop))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        key_at = int(self.key_ends[index - 1]) if index else 0
        value_at = int(self.value_ends[index - 1]) if index else 0
        stamp = int(self.stamps[index])
        return (self.keys[key_at : self.key_ends[index]].tobytes(),
                self.values[value_at : self.value_ends[index]].tobytes(), None if stamp < 0 else stamp)

    def __iter__(self) -> Iterator[Record]:
        return map(self.__getitem__, range(len(self)))

    def _run(self, start: int, stop: int) -> Records:
        """Records ``start`` to ``stop`` (views of these columns)."""
        key_at = int(self.key_ends[start - 1]) if start else 0
        value_at = int(self.value_ends[start - 1]) if start else 0
        key_end = int(self.key_ends[stop - 1]) if stop else 0
        value_end = int(self.value_ends[stop - 1]) if stop else 0
        return Records(self.keys[key_at:key_end], self.key_ends[start:stop] - key_at,
                       self.values[value_at:value_end], self.value_ends[start:stop] - value_at,
                       self.stamps[start:stop])

    def sizes(self) -> Ints:
        """Each record's key and value bytes."""
        sizes: Ints = np.diff(self.key_ends, prepend=0) + np.diff(self.value_ends, prepend=0)
        return sizes

    def rows(self, picked: Ints) -> Records:
        """The records ``picked`` (indexes, in order)."""
        return Records(*_pick(self.keys, self.key_ends, picked), *_pick(self.values, self.value_ends, picked),
                       self.stamps[picked])


def _pick(data: Bytes, ends: Ints, picked: Ints) -> tuple[Bytes, Ints]:
    starts = np.concatenate([[0], ends[:-1]])[picked]
    lengths = ends[picked] - starts
    if not len(picked):
        return data[:0], lengths
    # every picked byte's index: each piece's start, then one by one
    ends_picked: Ints = np.cumsum(lengths)
    index = np.repeat(starts - (ends_picked - lengths), lengths) + np.arange(ends_picked[-1])
    return data[index], ends_picked


class ColumnBatch:
    """A record batch written whole, handed to aiokafka's ``producer.send_batch`` in place of the builder that
    ``producer.create_batch`` gives: it answers what aiokafka asks a builder (it takes no more records) and writes
    its header when the producer sends it, with the producer's state where it has one."""

    def __init__(self, body: bytearray, count: int, first_timestamp: int, largest_timestamp: int,
                 transactional: bool) -> None:
        self._buffer = body  # the header's room, then the records
        self._count = count
        self._first, self._largest = first_timestamp, largest_timestamp
        self._transactional = transactional
        self._producer = (-1, -1, 0)  # producer id, epoch, base sequence (as aiokafka's builder starts them)
        self._built: bytearray | None = None

    def append(self, *, timestamp: int | None, key: bytes | None, value: bytes | None,
               headers: Sequence[Any] = ()) -> None:
        """No more records (None: full, as aiokafka's builder answers for a closed batch)."""
        return None

    def close(self) -> None:
        pass

    def closed(self) -> bool:
        return True

    def record_count(self) -> int:
        return self._count

    def size(self) -> int:
        return len(self._buffer)

    def _set_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        self._producer = (producer_id, producer_epoch, base_sequence)

    def _build(self) -> bytearray:
        if self._built is None:
            from aiokafka.record.util import calc_crc32c

            buffer = self._buffer
            _HEADER.pack_into(buffer, 0, 0, len(buffer) - _AFTER_LENGTH, -1, 2, 0,
                              _TRANSACTIONAL if self._transactional else 0, self._count - 1, self._first,
                              self._largest, *self._producer, self._count)
            struct.pack_into(">I", buffer, _CRC_AT, calc_crc32c(memoryview(buffer)[_ATTRIBUTES_AT:]))
            self._built = buffer
        return self._built


def column_batches(records: Records, batch_size: int, transactional: bool) -> Iterator[tuple[ColumnBatch, int]]:
    """``records`` in batches below ``batch_size`` bytes (or of one record), as aiokafka's compiled builder of that
    size fills them; each with the index of the record after its last. Records without a timestamp take the clock's now,
    as aiokafka's builder gives them."""
    stamps = records.stamps
    if (stamps < 0).any():
        stamps = np.where(stamps < 0, int(time.time() * 1000), stamps)
    # (read-only views: numba compiles a loop once per signature, and whether an array is writable is part of it;
    # records joined from parts and records read from one buffer would otherwise each compile one, in a commit)
    keys, key_ends, values, value_ends, stamps = (_read_only(column) for column in (
        records.keys, records.key_ends, records.values, records.value_ends, stamps))
    sizes = records.sizes() + _RECORD_OVERHEAD
    after = np.cumsum(sizes[::-1])[::-1]  # the bytes of each record and those after it, at most
    total = len(records)
    first = 0
    while first < total:
        room = min(_HEADER.size + int(after[first]), max(batch_size, _HEADER.size + int(sizes[first])))
        buffer = bytearray(room)  # written through a view, then cut to what was written
        view = np.frombuffer(buffer, dtype=np.uint8)
        stop, end, largest = pack_records(keys, key_ends, values, value_ends, stamps, first, total, view,
                                          _HEADER.size, batch_size)
        del view
        try:
            del buffer[end:]  # (no copy)
        except BufferError:  # a view outlived the call (numba compiling in this call can leave it in a reference
            buffer = buffer[:end]  # cycle, which the worker's paused collector keeps): a copy instead
        yield ColumnBatch(buffer, stop - first, int(stamps[first]), largest, transactional), stop
        first = stop


def _read_only(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A read-only view of ``array``."""
    view = array.view()
    view.flags.writeable = False
    return view
