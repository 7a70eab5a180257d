"""Compiled loop of the input consumer (numba): a fetched record batch's values, one after the other in one buffer.

aiokafka makes a record object of every message it hands out (its key, value and headers copied into bytes objects),
which the worker then reads four fields of and joins the values of into one buffer for the line reader
(``events/messages.py``). :func:`unpack_values` reads the records of an uncompressed batch (Kafka's record format v2)
straight into that buffer, with each one's offset and timestamp, as ``stream/fetched.py`` explains; it reads each
record's fields as aiokafka's own parser does (every length a zigzag varint, headers skipped), and reports
what that parser would refuse rather than guess.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import numpy.typing as npt

from stream_eval.events.compiled import copy_bytes

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

#: :func:`unpack_values`' status: the records were read.
READ = 0
#: A record that aiokafka's parser refuses (a length out of the batch, bytes left over, a negative count).
CORRUPT = 1


@nb.njit(cache=True, nogil=True, inline="always")
def _varint(buf: Bytes, pos: int, end: int) -> tuple[int, int, bool]:  # pragma: no cover  # compiled
    """The zigzag varint at ``pos`` (aiokafka's ``decode_varint64``), the position after it, and whether it lies
    within ``end`` and 64 bits. (Its first byte read before the loop: the loop with every check before its first
    read took 15 times as long a varint; docs/benchmarks.md, "Varints and byte copies in the compiled loops".)"""
    if pos >= end:
        return 0, pos, False
    byte = np.uint64(buf[pos])
    pos += 1
    value = byte & np.uint64(0x7F)
    shift = 7
    while byte >= np.uint64(0x80):
        if pos >= end or shift > 63:
            return 0, pos, False
        byte = np.uint64(buf[pos])
        pos += 1
        value |= (byte & np.uint64(0x7F)) << np.uint64(shift)
        shift += 7
    decoded = np.int64(value >> np.uint64(1)) ^ -np.int64(value & np.uint64(1))
    return int(decoded), pos, True


@nb.njit(cache=True, nogil=True)
def unpack_values(buf: Bytes, pos: int, end: int, count: int, base_offset: int, first_timestamp: int,
                  log_append: bool, max_timestamp: int, next_offset: int, out: Bytes, out_pos: int, offsets: Ints,
                  stamps: Ints, starts: Ints, ends: Ints, nulls: Bools,
                  n: int) -> tuple[int, int, int, int]:  # pragma: no cover  # compiled
    """The ``count`` records of one batch, ``buf[pos:end]`` after its header: each value whose offset is at least
    the running ``next_offset`` (aiokafka skips the others, as a fetch starts at the beginning of a batch) goes to
    ``out`` at ``out_pos``, after a line feed when it is not the first (``n`` values so far), with its offset,
    timestamp (the batch's ``max_timestamp`` when it has log-append times, else its first timestamp plus the
    record's delta), bounds in ``out`` and whether it is null. Returns ``(n, out_pos, next_offset, status)``."""
    for _ in range(count):
        length, pos, ok = _varint(buf, pos, end)
        if not ok:
            return n, out_pos, next_offset, CORRUPT
        begin = pos
        _, pos, ok = _varint(buf, pos, end)  # attributes
        delta, pos, ok2 = _varint(buf, pos, end)
        offset_delta, pos, ok3 = _varint(buf, pos, end)
        key_len, pos, ok4 = _varint(buf, pos, end)
        if not (ok and ok2 and ok3 and ok4) or key_len > end - pos:  # (every length checked before it is added)
            return n, out_pos, next_offset, CORRUPT
        if key_len > 0:
            pos += key_len
        value_len, pos, ok = _varint(buf, pos, end)
        if not ok or value_len > end - pos:
            return n, out_pos, next_offset, CORRUPT
        value_at = pos
        if value_len > 0:
            pos += value_len
        headers, pos, ok = _varint(buf, pos, end)
        if not ok or headers < 0 or headers > end - pos:
            return n, out_pos, next_offset, CORRUPT
        for _ in range(headers):
            key_len, pos, ok = _varint(buf, pos, end)
            if not ok or key_len < 0 or key_len > end - pos:
                return n, out_pos, next_offset, CORRUPT
            pos += key_len
            header_len, pos, ok = _varint(buf, pos, end)
            if not ok or header_len > end - pos:
                return n, out_pos, next_offset, CORRUPT
            if header_len > 0:
                pos += header_len
        if pos - begin != length:
            return n, out_pos, next_offset, CORRUPT
        offset = base_offset + offset_delta
        if offset < next_offset:
            continue
        if n > 0:
            out[out_pos] = 10  # b"\n"
            out_pos += 1
        starts[n] = out_pos
        if value_len > 0:
            copy_bytes(out, out_pos, buf, value_at, value_len)
            out_pos += value_len
        ends[n] = out_pos
        nulls[n] = value_len < 0
        offsets[n] = offset
        stamps[n] = max_timestamp if log_append else first_timestamp + delta
        n += 1
        next_offset = offset + 1
    if pos != end:
        return n, out_pos, next_offset, CORRUPT
    return n, out_pos, next_offset, READ


@nb.njit(cache=True, nogil=True)
def _put_varint(out: Bytes, pos: int, value: int) -> int:  # pragma: no cover  # compiled
    """``value`` as a zigzag varint at ``out[pos]`` (aiokafka's ``encode_varint``); the position after it."""
    rest = np.uint64((value << 1) ^ (value >> 63))
    while rest >= np.uint64(0x80):
        out[pos] = np.uint8((rest & np.uint64(0x7F)) | np.uint64(0x80))
        rest >>= np.uint64(7)
        pos += 1
    out[pos] = np.uint8(rest)
    return pos + 1


@nb.njit(cache=True, nogil=True)
def _varint_size(value: int) -> int:  # pragma: no cover  # compiled
    rest = np.uint64((value << 1) ^ (value >> 63))
    size = 1
    while rest >= np.uint64(0x80):
        rest >>= np.uint64(7)
        size += 1
    return size


@nb.njit(cache=True, nogil=True)
def pack_records(keys: Bytes, key_ends: Ints, values: Bytes, value_ends: Ints, stamps: Ints, first: int, stop: int,
                 out: Bytes, pos: int, limit: int) -> tuple[int, int, int]:  # pragma: no cover  # compiled
    """Records ``first``, ``first + 1``, ... (before ``stop``) of the columns (record ``i``: key
    ``keys[key_ends[i - 1]:key_ends[i]]``, value likewise, timestamp ``stamps[i]``) into ``out`` at ``pos``, in
    Kafka's record format v2 as aiokafka's batch builder writes them (no attributes, the timestamp less the first
    record's, the offset less the first's, no headers), for as long as the batch stays below ``limit`` bytes (the
    first record always). Returns the record after the last written, the position after it, and the largest
    timestamp."""
    base = stamps[first]
    largest = base
    i = first
    while i < stop:
        key_at = key_ends[i - 1] if i > 0 else 0
        value_at = value_ends[i - 1] if i > 0 else 0
        key_len = key_ends[i] - key_at
        value_len = value_ends[i] - value_at
        delta = stamps[i] - base
        offset = i - first
        length = (1 + _varint_size(delta) + _varint_size(offset) + _varint_size(key_len) + key_len
                  + _varint_size(value_len) + value_len + 1)
        if i > first and pos + _varint_size(length) + length >= limit:  # (as aiokafka's compiled builder)
            break
        pos = _put_varint(out, pos, length)
        out[pos] = 0  # attributes
        pos = _put_varint(out, pos + 1, delta)
        pos = _put_varint(out, pos, offset)
        pos = _put_varint(out, pos, key_len)
        copy_bytes(out, pos, keys, key_at, key_len)
        pos = _put_varint(out, pos + key_len, value_len)
        copy_bytes(out, pos, values, value_at, value_len)
        pos += value_len
        out[pos] = 0  # no headers
        pos += 1
        if stamps[i] > largest:
            largest = stamps[i]
        i += 1
    return i, pos, largest
