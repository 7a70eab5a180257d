"""Session AUC compiled (numba): the replay's and the worker's scoring of closed sessions.

:func:`stream_eval.metrics.auc.session_auc` is the definition, in numpy, for any item order; this is the same
statistic for items already grouped by session, as :class:`~stream_eval.engine.sessions.Sessions` hands them
over. Sessions are short (tens of items) and have few positives or few negatives, so counting pairs of the
rarer class against the other beats sorting (measured against the numpy version on the main benchmark file:
docs/benchmarks.md). A session where both classes are many is sorted instead, so a long session never
costs quadratic time. Both count in half-units (ties 1/2) in integers: the AUC is one division of exact
numbers, the same float as the numpy version's. Scores are finite (the event schema rejects others).

Also compiled here: the A/B units' tables and their looks' sums per arm (``engine/ab.py``, :func:`arm_sums`) and the
sums of the live windows' cells (:func:`cell_sums`, ``engine/windows.py``), each a loop per row that numpy could only
run as a slower scatter, or through temporaries; and the units' keys (:func:`unit_key_pieces`: zlib's CRC-32 and
hashlib's 8-byte BLAKE2b of many ids at once, where a call per id cost more in the calls than in the hashing).
"""

from __future__ import annotations

from typing import Any, TypeVar

import numba as nb
import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
_Item = TypeVar("_Item", bound=np.generic)

#: A session whose rarer class has at most this many items is scored pair by pair; others are sorted.
PAIRWISE = 64


def grouped_session_auc(starts: Ints, scores: Floats, labels: Bools,
                        pairwise: int = PAIRWISE) -> tuple[Floats, Ints, Ints]:
    """Per-session AUC (ties count 1/2; NaN for a single-class session) of items grouped by session: session
    ``s`` owns ``starts[s]:starts[s + 1]``. Returns ``(auc, positives, negatives)``.

    >>> import numpy as np
    >>> auc, pos, neg = grouped_session_auc(np.array([0, 3, 5]), np.array([0.9, 0.5, 0.5, 1.0, 2.0]),
    ...                                     np.array([True, True, False, False, False]))
    >>> auc.tolist(), pos.tolist(), neg.tolist()
    ([0.75, nan], [2, 0], [1, 2])
    """
    n = starts.shape[0] - 1
    auc = np.empty(n, dtype=np.float64)
    positives = np.empty(n, dtype=np.int64)
    _grouped_auc(np.asarray(starts, dtype=np.int64), np.asarray(scores, dtype=np.float64),
                 np.asarray(labels, dtype=np.bool_), pairwise, auc, positives)
    negatives: Ints = np.diff(starts) - positives
    return auc, positives, negatives


@nb.njit(cache=True, nogil=True)
def _grouped_auc(starts: Ints, scores: Floats, labels: Bools, pairwise: int, auc: Floats,
                 positives: Ints) -> None:  # pragma: no cover  # compiled
    rare = np.empty(64, np.float64)  # the scores of a session's rarer class
    for s in range(starts.shape[0] - 1):
        lo, hi = starts[s], starts[s + 1]
        p = 0
        for i in range(lo, hi):
            p += labels[i]
        q = hi - lo - p
        positives[s] = p
        if p == 0 or q == 0:
            auc[s] = np.nan
            continue
        won = 0  # half-units: pairs (positive, negative) ordered right count 2, tied 1
        if min(p, q) <= pairwise:
            rare_label = p <= q
            if rare.shape[0] < min(p, q):
                rare = np.empty(max(min(p, q), 2 * rare.shape[0]), np.float64)
            k = 0
            for i in range(lo, hi):
                if labels[i] == rare_label:
                    rare[k] = scores[i]
                    k += 1
            for i in range(lo, hi):
                if labels[i] != rare_label:
                    x = scores[i]
                    for j in range(k):
                        won += (rare[j] > x) * 2 + (rare[j] == x)
            if not rare_label:  # counted the negatives above positives: the rest of the half-units
                won = 2 * p * q - won
        else:
            order = np.argsort(scores[lo:hi]) + lo
            below = 0  # negatives scored below the current run of equal scores
            j = 0
            while j < hi - lo:
                x = scores[order[j]]
                run_p, run_q = 0, 0
                while True:  # the run of scores equal to x (each step takes one item: ends even on a NaN)
                    if labels[order[j]]:
                        run_p += 1
                    else:
                        run_q += 1
                    j += 1
                    if j == hi - lo or scores[order[j]] != x:
                        break
                won += run_p * (2 * below + run_q)
                below += run_q
        auc[s] = won / (2 * p * q)


@nb.njit(cache=True, nogil=True)
def _probe(h: np.uint64, slots: npt.NDArray[np.int32], unit_key: npt.NDArray[np.uint64],
           mask: np.uint64) -> tuple[np.uint64, int]:
    """The slot of hash ``h`` in an open-addressing table of unit rows and its row (-1: not there, the slot
    free)."""
    i = h & mask
    while True:
        r = slots[i]
        if r < 0 or unit_key[r] == h:
            return i, r
        i = (i + np.uint64(1)) & mask


@nb.njit(cache=True, nogil=True)
def unit_rows(hashes: npt.NDArray[np.uint64], codes: Ints, slots: npt.NDArray[np.int32],
              unit_key: npt.NDArray[np.uint64], unit_arm: npt.NDArray[np.int16], conflicted: Bools, size: int,
              limit: int, rows: Ints, used: Bools) -> tuple[int, int, int, int]:
    """The A/B units' rows of contributions, in order (``engine/ab.py``): units by the 64-bit hash of their id in
    an open-addressing table (``slots``: a power of two, each the row of a unit or -1; ``unit_key``: each row's
    hash). A unit not in the table gets the next row (its arm ``codes[k]``), unless ``size`` reached ``limit``:
    row -1, not ``used`` (overflow). A unit seen in another arm: row -1 (a conflict, flagged once in
    ``conflicted``). Stops when the table or the rows are full (the caller grows them and goes on from there).
    Returns ``(contributions done, size, overflow, new conflicts)``."""
    mask = np.uint64(slots.shape[0] - 1)
    capacity = unit_key.shape[0]
    overflow = 0
    conflicts = 0
    for k in range(hashes.shape[0]):
        h = hashes[k]
        i, r = _probe(h, slots, unit_key, mask)
        if r < 0:
            if size >= limit:
                overflow += 1
                rows[k] = -1
                used[k] = False
                continue
            if size >= capacity or 2 * (size + 1) > slots.shape[0]:
                return k, size, overflow, conflicts
            slots[i] = size
            unit_key[size] = h
            unit_arm[size] = codes[k]
            rows[k] = size
            used[k] = True
            size += 1
        else:
            used[k] = True
            if unit_arm[r] != codes[k]:
                if not conflicted[r]:
                    conflicted[r] = True
                    conflicts += 1
                rows[k] = -1
            else:
                rows[k] = r
    return hashes.shape[0], size, overflow, conflicts


@nb.njit(cache=True, nogil=True)
def unit_slots(unit_key: npt.NDArray[np.uint64], size: int, capacity: int) -> npt.NDArray[np.int32]:
    """The table of :func:`unit_rows` (``capacity`` slots, a power of two) holding rows ``0:size``."""
    slots = np.full(capacity, -1, dtype=np.int32)
    mask = np.uint64(capacity - 1)
    for r in range(size):
        i = unit_key[r] & mask
        while slots[i] >= 0:
            i = (i + np.uint64(1)) & mask
        slots[i] = r
    return slots


@nb.njit(cache=True, nogil=True)
def unit_history(hashes: npt.NDArray[np.uint64], days: Ints, y: Floats, n: Floats, lookbacks: Ints, entries: Ints,
                 slots: npt.NDArray[np.int32], unit_key: npt.NDArray[np.uint64], day_tag: Ints, hist_y: Floats,
                 hist_n: Floats, last_day: Ints, size: int, out_x: Floats, out_q: Floats) -> tuple[int, int]:
    """The units' recent contributions by day (CUPED's pre-period, ``engine/ab.py``, ``UnitHistory``), in order.

    Unit rows as in :func:`unit_rows` (``slots``, ``unit_key``); row r keeps per day one bucket of sums
    ``hist_y[r, b]`` and counts ``hist_n[r, b]`` in a ring (``b = day % buckets``, ``day_tag[r, b]`` the day it
    holds, -1 none). For contribution k: when ``entries[k] >= 0`` (its unit enters a CUPED experiment with it), the
    buckets of days ``days[k] - lookbacks[k] .. days[k]`` before k are added to ``out_x[entries[k]]`` and
    ``out_q[entries[k]]``; then k is added to its day's bucket. Stops when the table is full (the caller grows it
    and goes on from there). Returns ``(contributions done, size)``."""
    mask = np.uint64(slots.shape[0] - 1)
    capacity = unit_key.shape[0]
    buckets = day_tag.shape[1]
    width = y.shape[1]
    for k in range(hashes.shape[0]):
        h = hashes[k]
        i, r = _probe(h, slots, unit_key, mask)
        day = days[k]
        if r < 0:
            if size >= capacity or 2 * (size + 1) > slots.shape[0]:
                return k, size
            slots[i] = size
            unit_key[size] = h
            r = size
            size += 1
        elif entries[k] >= 0:
            e = entries[k]
            lo = day - lookbacks[k]
            for b in range(buckets):
                tag = day_tag[r, b]
                if lo <= tag <= day:
                    for j in range(width):
                        out_x[e, j] += hist_y[r, b, j]
                        out_q[e, j] += hist_n[r, b, j]
        b = day % buckets
        if day_tag[r, b] != day:
            day_tag[r, b] = day
            for j in range(width):
                hist_y[r, b, j] = 0.0
                hist_n[r, b, j] = 0.0
        for j in range(width):
            hist_y[r, b, j] += y[k, j]
            hist_n[r, b, j] += n[k, j]
        if day > last_day[r]:
            last_day[r] = day
    return hashes.shape[0], size


@nb.njit(cache=True, nogil=True)
def add_rows(target: Floats, rows: Ints, values: Floats, picked: Ints) -> None:
    """``target[rows[k]] += values[picked[k]]`` for every ``k`` whose row is not negative, in order: the floats
    ``np.add.at(target, rows[keep], values[picked[keep]])`` gives, without its cost per element (the A/B units'
    sums, ``engine/ab.py``).

    >>> target = np.zeros((2, 2))
    >>> add_rows(target, np.array([1, -1, 1]), np.array([[1.0, 2.0], [9.0, 9.0], [0.5, 0.25]]), np.array([0, 1, 2]))
    >>> target.tolist()
    [[0.0, 0.0], [1.5, 2.25]]
    """
    for k in range(rows.shape[0]):
        r = rows[k]
        if r >= 0:
            i = picked[k]
            for j in range(target.shape[1]):
                target[r, j] += values[i, j]


@nb.njit(cache=True, nogil=True)
def cell_sums(cell: Ints, values: Floats, cells: int) -> tuple[Ints, Floats, Floats]:
    """Per cell of the live windows (``engine/windows.py``; ``cell``: each row's, ``0 .. cells - 1``) the count, sum
    and sum of squares of each column's values, a NaN (no value) left out. Rows are added in order, so the sums are
    the floats ``np.add.at`` gives, without its cost per element.

    >>> count, total, total_sq = cell_sums(np.array([1, 0, 1]), np.array([[1.0, np.nan], [2.0, 3.0], [4.0, 5.0]]), 2)
    >>> count.tolist(), total.tolist(), total_sq.tolist()
    ([[1, 1], [2, 1]], [[2.0, 3.0], [5.0, 5.0]], [[4.0, 9.0], [17.0, 25.0]])
    """
    size = values.shape[1]
    count = np.zeros((cells, size), dtype=np.int64)
    total = np.zeros((cells, size))
    total_sq = np.zeros((cells, size))
    for i in range(cell.shape[0]):
        c = cell[i]
        for j in range(size):
            v = values[i, j]
            if not np.isnan(v):
                count[c, j] += 1
                total[c, j] += v
                total_sq[c, j] += v * v
    return count, total, total_sq


@nb.njit(cache=True, nogil=True)
def arm_sums(y: Floats, n: Floats, x: Floats, q: Floats, unit_arm: npt.NDArray[np.int16], arms: int,
             pre: bool) -> Floats:
    """Per arm, the sums over its units, in unit order, of the terms of ``stats.ratio.unit_terms(y, n)`` (shape
    (arms, 6, K)), or ``unit_terms(y, n, x, q)`` with ``pre`` (shape (arms, 16, K)): the floats of
    ``unit_terms(...)[unit_arm == a].sum(axis=0)`` (numpy adds the rows of an outer axis to zeros one after the
    other), without making the terms (the A/B units' looks, ``engine/ab.py``). ``unit_arm``: each unit's arm,
    ``0 .. arms - 1``.

    >>> arm_sums(np.array([[2.0], [1.0]]), np.array([[3.0], [1.0]]), np.zeros((0, 1)), np.zeros((0, 1)),
    ...          np.array([1, 1], dtype=np.int16), 2, False)[:, :, 0].tolist()
    [[0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [2.0, 3.0, 4.0, 5.0, 10.0, 7.0]]
    """
    width = y.shape[1]
    count = 16 if pre else 6
    out = np.zeros((arms, count, width))
    term = np.zeros(count)
    for u in range(unit_arm.shape[0]):
        a = unit_arm[u]
        for k in range(width):
            present = n[u, k] > 0.0
            yv = y[u, k] if present else 0.0
            nv = n[u, k] if present else 0.0
            term[0] = 1.0 if present else 0.0
            term[1] = yv
            term[2] = nv
            term[3] = yv * yv
            term[4] = nv * nv
            term[5] = yv * nv
            if pre:
                qv = q[u, k] if present else 0.0
                xv = x[u, k] if present and qv > 0.0 else 0.0
                term[6] = 1.0 if qv > 0.0 else 0.0
                term[7] = xv
                term[8] = qv
                term[9] = xv * xv
                term[10] = qv * qv
                term[11] = xv * qv
                term[12] = yv * xv
                term[13] = yv * qv
                term[14] = nv * xv
                term[15] = nv * qv
            for t in range(count):
                out[a, t, k] += term[t]
    return out


@nb.njit(cache=True, nogil=True)
def json_string_pieces(text: npt.NDArray[np.uint8], count: int, starts: Ints,
                       ends: Ints) -> None:  # pragma: no cover  # compiled
    """The bounds of each string's inside in ``text``, orjson's JSON of a list of ``count`` strings, into ``starts``
    and ``ends``: the list's text is well formed, so a string ends at the first quote not escaped by
    a backslash."""
    pos = 1  # after "["
    for k in range(count):
        pos += 1  # the opening quote
        starts[k] = pos
        while text[pos] != 34:  # '"'
            pos += 2 if text[pos] == 92 else 1  # a backslash escapes the next character
        ends[k] = pos
        pos += 2  # the closing quote, and "," or "]"


@nb.njit(cache=True, nogil=True)
def json_number_pieces(text: npt.NDArray[np.uint8], count: int, starts: Ints,
                       ends: Ints) -> None:  # pragma: no cover  # compiled
    """The bounds of each number (or ``null``) in ``text``, orjson's JSON of a list of ``count`` of them, into
    ``starts`` and ``ends``."""
    pos = 1
    for k in range(count):
        starts[k] = pos
        while text[pos] != 44 and text[pos] != 93:  # "," or "]"
            pos += 1
        ends[k] = pos
        pos += 1


@nb.njit(cache=True, nogil=True)
def fill_template(text: npt.NDArray[np.uint8], starts: Ints, ends: Ints, constants: npt.NDArray[np.uint8],
                  constant_ends: Ints) -> tuple[npt.NDArray[np.uint8], Ints]:  # pragma: no cover  # compiled
    """Records from a template: record ``i`` is ``constants``' first piece, ``text[starts[0, i]:ends[0, i]]``, the
    second piece, and so on, ending with the last piece (``constant_ends``: each piece's end; one more piece than
    ``starts`` has rows). Returns the records one after the other, and where each ends."""
    fields, count = starts.shape
    total = count * constant_ends[fields]
    for k in range(fields):
        for i in range(count):
            total += ends[k, i] - starts[k, i]
    out = np.empty(total, dtype=np.uint8)
    record_ends = np.empty(count, dtype=np.int64)
    pos = 0
    for i in range(count):
        begin = 0
        for k in range(fields + 1):
            stop = constant_ends[k]
            for j in range(begin, stop):
                out[pos] = constants[j]
                pos += 1
            begin = stop
            if k < fields:
                for j in range(starts[k, i], ends[k, i]):
                    out[pos] = text[j]
                    pos += 1
        record_ends[i] = pos
    return out, record_ends


def take_ranges(values: npt.NDArray[_Item], first: Ints, lengths: Ints) -> npt.NDArray[_Item]:
    """The ranges ``values[first[k] : first[k] + lengths[k]]``, one after the other (a copy): what
    ``values[ranges_of(first, lengths)]`` gives (``engine/sessions.py``), without its index array.

    >>> take_ranges(np.array([0.5, 1.0, 2.0, 4.0]), np.array([2, 0]), np.array([2, 1])).tolist()
    [2.0, 4.0, 0.5]
    """
    taken: npt.NDArray[_Item] = _take_ranges(values, first, lengths)
    return taken


@nb.njit(cache=True, nogil=True)
def _take_ranges(values: Any, first: Ints, lengths: Ints) -> Any:  # pragma: no cover  # compiled
    total = 0
    for k in range(lengths.shape[0]):
        total += lengths[k]
    out = np.empty(total, values.dtype)
    j = 0
    for k in range(first.shape[0]):
        a = first[k]
        for i in range(a, a + lengths[k]):
            out[j] = values[i]
            j += 1
    return out


@nb.njit(cache=True, nogil=True)
def parts_valid(sizes: Ints, relevant_sizes: Ints, relevant: Ints) -> bool:  # pragma: no cover  # compiled
    """Whether session parts' counts are all at least 0 and each relevant position (1-based) lies in its part:
    part ``k`` has ``sizes[k]`` items and the next ``relevant_sizes[k]`` positions of ``relevant`` (whose lengths
    the caller has checked against the sums)."""
    j = 0
    for k in range(sizes.shape[0]):
        size, count = sizes[k], relevant_sizes[k]
        if size < 0 or count < 0:
            return False
        for i in range(j, j + count):
            if relevant[i] < 1 or relevant[i] > size:
                return False
        j += count
    return True


# -- unit keys: CRC-32 (zlib's) and BLAKE2b with an 8-byte digest (hashlib's) of each of many byte strings ---------

def _crc32_table() -> npt.NDArray[np.int64]:
    table = np.arange(256, dtype=np.int64)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ 0xEDB88320, table >> 1)
    return table


_CRC32 = _crc32_table()
_BLAKE2B_IV = np.array([0x6A09E667F3BCC908, 0xBB67AE8584CAA73B, 0x3C6EF372FE94F82B, 0xA54FF53A5F1D36F1,
                        0x510E527FADE682D1, 0x9B05688C2B3E6C1F, 0x1F83D9ABFB41BD6B, 0x5BE0CD19137E2179],
                       dtype=np.uint64)
_BLAKE2B_SIGMA = np.array([
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
    [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4], [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
    [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13], [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
    [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11], [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
    [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5], [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
], dtype=np.int64)


def unit_key_pieces(data: npt.NDArray[np.uint8], ends: Ints,
                    blake2b: bool = True) -> tuple[Ints, npt.NDArray[np.uint64]]:
    """The CRC-32 (as ``zlib.crc32``) and the BLAKE2b with an 8-byte digest, read as a little-endian integer (as
    ``int.from_bytes(hashlib.blake2b(piece, digest_size=8).digest(), "little")``), of each piece of ``data``: piece
    ``k`` ends at ``ends[k]`` and starts where the one before ends (``engine/ab.py``'s unit keys). Without
    ``blake2b``, the CRC-32s only (the hashes left 0).

    >>> import hashlib, zlib
    >>> crc, blake = unit_key_pieces(np.frombuffer(b"user-1x", dtype=np.uint8), np.array([6, 6, 7]))
    >>> crc.tolist() == [zlib.crc32(b"user-1"), zlib.crc32(b""), zlib.crc32(b"x")]
    True
    >>> blake.tolist()[0] == int.from_bytes(hashlib.blake2b(b"user-1", digest_size=8).digest(), "little")
    True
    """
    crc = np.empty(ends.shape[0], dtype=np.int64)
    blake = np.zeros(ends.shape[0], dtype=np.uint64)
    _unit_key_pieces(data, ends, _CRC32, _BLAKE2B_IV, _BLAKE2B_SIGMA, blake2b, crc, blake)
    return crc, blake


@nb.njit(cache=True, nogil=True, inline="always")
def _mix_half(a: np.uint64, b: np.uint64, c: np.uint64, d: np.uint64, x: np.uint64, r: np.uint64,
              s: np.uint64) -> tuple[np.uint64, np.uint64, np.uint64, np.uint64]:  # pragma: no cover  # compiled
    """Half of BLAKE2b's mixing: ``x`` added, then the rotations by ``r`` and ``s`` bits."""
    a = a + b + x
    d = d ^ a
    d = (d >> r) | (d << (np.uint64(64) - r))
    c = c + d
    b = b ^ c
    b = (b >> s) | (b << (np.uint64(64) - s))
    return a, b, c, d


@nb.njit(cache=True, nogil=True, inline="always")
def _mix(a: np.uint64, b: np.uint64, c: np.uint64, d: np.uint64, x: np.uint64,
         y: np.uint64) -> tuple[np.uint64, np.uint64, np.uint64, np.uint64]:  # pragma: no cover  # compiled
    """BLAKE2b's mixing of four words of its state with two words of the message."""
    a, b, c, d = _mix_half(a, b, c, d, x, np.uint64(32), np.uint64(24))
    return _mix_half(a, b, c, d, y, np.uint64(16), np.uint64(63))


@nb.njit(cache=True, nogil=True)
def _unit_key_pieces(data: npt.NDArray[np.uint8], ends: Ints, table: Ints, iv: npt.NDArray[np.uint64],
                     sigma: Ints, blake2b: bool, crc: Ints,
                     blake: npt.NDArray[np.uint64]) -> None:  # pragma: no cover  # compiled
    h = np.empty(8, dtype=np.uint64)
    m = np.empty(16, dtype=np.uint64)
    start = 0
    for k in range(ends.shape[0]):
        end = ends[k]
        c = 0xFFFFFFFF
        for i in range(start, end):
            c = table[(c ^ data[i]) & 0xFF] ^ (c >> 8)
        crc[k] = c ^ 0xFFFFFFFF
        if blake2b:
            blake[k] = _blake2b_8(data, start, end, iv, sigma, h, m)
        start = end


@nb.njit(cache=True, nogil=True, inline="always")
def _blake2b_8(data: npt.NDArray[np.uint8], start: int, end: int, iv: npt.NDArray[np.uint64], sigma: Ints,
               h: npt.NDArray[np.uint64], m: npt.NDArray[np.uint64]) -> np.uint64:  # pragma: no cover  # compiled
    """BLAKE2b with an 8-byte digest of ``data[start:end]``, as a little-endian integer (``h``, ``m``: room for
    the state and a block)."""
    h[:] = iv
    h[0] ^= np.uint64(0x01010008)  # digest 8 bytes, no key, fanout 1, depth 1
    at = start
    while True:  # each 128-byte block; the last (maybe short, or empty) zero-padded and flagged
        size = min(end - at, 128)
        last = end - at <= 128
        m[:] = 0
        for i in range(size):
            m[i >> 3] |= np.uint64(data[at + i]) << np.uint64(8 * (i & 7))
        at += size
        v0, v1, v2, v3, v4, v5, v6, v7 = h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]
        v8, v9, v10, v11, v12, v13, v14, v15 = iv[0], iv[1], iv[2], iv[3], iv[4], iv[5], iv[6], iv[7]
        v12 ^= np.uint64(at - start)
        if last:
            v14 = ~v14
        for r in range(12):
            s = sigma[r % 10]
            v0, v4, v8, v12 = _mix(v0, v4, v8, v12, m[s[0]], m[s[1]])
            v1, v5, v9, v13 = _mix(v1, v5, v9, v13, m[s[2]], m[s[3]])
            v2, v6, v10, v14 = _mix(v2, v6, v10, v14, m[s[4]], m[s[5]])
            v3, v7, v11, v15 = _mix(v3, v7, v11, v15, m[s[6]], m[s[7]])
            v0, v5, v10, v15 = _mix(v0, v5, v10, v15, m[s[8]], m[s[9]])
            v1, v6, v11, v12 = _mix(v1, v6, v11, v12, m[s[10]], m[s[11]])
            v2, v7, v8, v13 = _mix(v2, v7, v8, v13, m[s[12]], m[s[13]])
            v3, v4, v9, v14 = _mix(v3, v4, v9, v14, m[s[14]], m[s[15]])
        h[0] ^= v0 ^ v8
        h[1] ^= v1 ^ v9
        h[2] ^= v2 ^ v10
        h[3] ^= v3 ^ v11
        h[4] ^= v4 ^ v12
        h[5] ^= v5 ^ v13
        h[6] ^= v6 ^ v14
        h[7] ^= v7 ^ v15
        if last:
            return np.uint64(h[0])
