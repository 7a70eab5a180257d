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

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

#: :func:`unpack_values`' status: the records were read.
READ = 0
#: A record that aiokafka's parser refuses (a length out of the batch, bytes left over, a negative count).
CORRUPT = 1


@nb.njit(cache=True, nogil=True)
def _varint(buf: Bytes, pos: int, end: int) -> tuple[int, int, bool]:  # pragma: no cover  # compiled
    """The zigzag varint at ``pos`` (aiokafka's ``decode_varint64``), the position after it, and whether it lies
    within ``end`` and 64 bits."""
    value = np.uint64(0)
    shift = 0
    while True:
        if pos >= end:
            return 0, pos, False
        byte = np.uint64(buf[pos])
        pos += 1
        value |= (byte & np.uint64(0x7F)) << np.uint64(shift)
        if byte < np.uint64(0x80):
            break
        shift += 7
        if shift > 63:
            return 0, pos, False
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
            out[out_pos : out_pos + value_len] = buf[value_at : value_at + value_len]
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
