"""Compiled loops of the columnar join (numba): request ids to slots, items to served positions, duplicates.

These are the join's memory-bound steps. In Python each is slow on the main benchmark file, where the open
requests do not fit in the CPU caches: a dict lookup reads the hash table, the
entry and the stored key; a ``str.find`` reads a ranking's item text served half an hour earlier. Compiled, the
same reads cost a fraction of that (docs/benchmarks.md).

Strings come in as UTF-8 bytes, many in one buffer with the bounds of each (:func:`utf8_fields`). Matching is
exact: a hash only chooses where to look; keys are compared byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt
from numba.core import cgutils, types
from numba.extending import intrinsic

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int64]

EMPTY = -1
DELETED = -2
#: Entries of the smallest table (a power of two).
MIN_TABLE = 1024


def utf8_fields(texts: list[str]) -> tuple[Bytes, Ints, Ints]:
    """The UTF-8 bytes of ``texts`` in one buffer, with each one's start and end."""
    joined = "\x00".join(texts)
    if joined.count("\x00") == len(texts) - 1:  # no text has a NUL of its own
        buffer = np.frombuffer(joined.encode(), dtype=np.uint8)
        starts, ends = _split(buffer, len(texts))
        return buffer, starts, ends
    encoded = [text.encode() for text in texts]  # a text has a NUL: bounds from the lengths
    starts, ends = bounds(encoded)
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), starts, ends


def bounds(parts: list[bytes] | list[object]) -> tuple[Ints, Ints]:
    """Where each of ``parts`` (bytes-like) starts and ends in ``b"".join(parts)``."""
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))  # type: ignore[arg-type]  # sized
    ends = np.cumsum(lengths)
    return ends - lengths, ends


@nb.njit(cache=True, nogil=True)
def _split(buffer: Bytes, n: int) -> tuple[Ints, Ints]:  # pragma: no cover  # compiled
    starts = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    if n == 0:
        return starts, ends
    k = 0
    starts[0] = 0
    for i in range(buffer.shape[0]):
        if buffer[i] == 0:
            ends[k] = i
            k += 1
            starts[k] = i + 1
    ends[k] = buffer.shape[0]
    return starts, ends


@nb.njit(cache=True, inline="always")
def _hash(buffer: Bytes, start: int, end: int) -> np.uint64:  # pragma: no cover  # compiled
    h = np.uint64(14695981039346656037)
    for i in range(start, end):
        h = (h ^ np.uint64(buffer[i])) * np.uint64(1099511628211)
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    return h ^ (h >> np.uint64(32))


@nb.njit(cache=True, inline="always")
def equal_bytes(a: Bytes, a0: int, a1: int, b: Bytes, b0: int, b1: int) -> bool:  # pragma: no cover  # compiled
    if a1 - a0 != b1 - b0:
        return False
    for k in range(a1 - a0):
        if a[a0 + k] != b[b0 + k]:
            return False
    return True


@intrinsic
def _memcpy(typingctx: Any, target: Any, at: Any, source: Any, start: Any, size: Any) -> Any:  # pragma: no cover
    """One ``memcpy`` of ``size`` bytes from ``source[start]`` to ``target[at]`` (contiguous byte arrays)."""
    if not all(isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"
               and array.dtype == types.uint8 for array in (target, source)):
        return None
    signature = types.void(target, types.intp, source, types.intp, types.intp)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        into, into_at, out_of, out_of_at, count = args
        to = context.make_array(sig.args[0])(context, builder, into)
        of = context.make_array(sig.args[2])(context, builder, out_of)
        cgutils.raw_memcpy(builder, builder.gep(to.data, [into_at]),  # type: ignore[no-untyped-call]
                           builder.gep(of.data, [out_of_at]), count, 1)

    return signature, codegen


_memcpy_typed: Callable[[Bytes, int, Bytes, int, int], None] = _memcpy  # type: ignore[assignment]  # (numba's call)


@nb.njit(cache=True, inline="always")
def copy_bytes(target: Bytes, at: int, source: Bytes, start: int, size: int) -> None:  # pragma: no cover  # compiled
    """``target[at : at + size] = source[start : start + size]`` (contiguous byte arrays, both ranges within their
    arrays; nothing when ``size`` is not positive, as the slices would be empty) by one ``memcpy``: numba's slice
    assignment copied a byte at a time, and a plain loop in a larger function was no faster (docs/benchmarks.md,
    "Varints and byte copies in the compiled loops")."""
    if size > 0:
        _memcpy_typed(target, at, source, start, size)


@nb.njit(cache=True, nogil=True)
def find_ids(table: Ints, arena: Bytes, first: Ints, last: Ints, base: int, keys: Bytes, starts: Ints,
             ends: Ints) -> Ints:  # pragma: no cover  # compiled
    """The slot of each key (request id) in ``table``, or -1. ``arena[first[s - base]:last[s - base]]`` holds
    the id of slot ``s``; ``table`` is open addressing, ``table[2 i]`` a slot and ``table[2 i + 1]`` its hash.

    In stages, each a loop of loads that do not wait for one another (the table, the slots' bounds and their
    bytes are cache misses on large inputs): the hashes, then each key's first entry with its hash, then that
    slot's bounds, then its bytes; a key whose bytes differ (two ids with the same 64-bit hash) is looked up
    again entry by entry."""
    mask = table.shape[0] // 2 - 1
    n = starts.shape[0]
    out = np.full(n, -1, np.int64)
    hashes = np.empty(n, np.int64)
    for k in range(n):
        hashes[k] = np.int64(_hash(keys, starts[k], ends[k]))
    candidate = np.full(n, -1, np.int64)
    for k in range(n):
        i = hashes[k] & mask
        while True:
            slot = table[2 * i]
            if slot == EMPTY:
                break
            if table[2 * i + 1] == hashes[k]:
                candidate[k] = slot
                break
            i = (i + 1) & mask
    bounds = np.empty((n, 2), np.int64)
    for k in range(n):
        if candidate[k] >= 0:
            bounds[k, 0], bounds[k, 1] = first[candidate[k] - base], last[candidate[k] - base]
    for k in range(n):
        if candidate[k] < 0:
            continue
        if equal_bytes(arena, bounds[k, 0], bounds[k, 1], keys, starts[k], ends[k]):
            out[k] = candidate[k]
            continue
        i = hashes[k] & mask
        while table[2 * i] != EMPTY:
            if table[2 * i + 1] == hashes[k]:
                j = table[2 * i] - base
                if equal_bytes(arena, first[j], last[j], keys, starts[k], ends[k]):
                    out[k] = table[2 * i]
                    break
            i = (i + 1) & mask
    return out


@nb.njit(cache=True, nogil=True)
def put_ids(table: Ints, arena: Bytes, first: Ints, last: Ints, base: int,
            slots: Ints) -> int:  # pragma: no cover  # compiled
    """Make each slot (in order) the one of its id, replacing the id's earlier slot; returns the entries added."""
    mask = table.shape[0] // 2 - 1
    added = 0
    for slot in slots:
        j = slot - base
        h = _hash(arena, first[j], last[j])
        i = np.int64(h & np.uint64(mask))
        while True:
            other = table[2 * i]
            if other == EMPTY:
                table[2 * i] = slot
                table[2 * i + 1] = np.int64(h)
                added += 1
                break
            if table[2 * i + 1] == np.int64(h):
                o = other - base
                if equal_bytes(arena, first[o], last[o], arena, first[j], last[j]):
                    table[2 * i] = slot
                    break
            i = (i + 1) & mask
    return added


@nb.njit(cache=True, nogil=True)
def positions(texts: Bytes, first: Ints, last: Ints, base: int, slots: Ints, items: Bytes, starts: Ints,
              ends: Ints) -> Ints:  # pragma: no cover  # compiled
    """1-based position of each item in its slot's compact item text ``","a","b","`` (0: not served).

    The texts are read first a byte per cache line of their start, in a loop of loads that do not wait for one
    another (they are cache misses on large inputs), then searched."""
    n = starts.shape[0]
    out = np.zeros(n, np.int64)
    bounds = np.empty((n, 2), np.int64)
    touched = 0
    for k in range(n):
        j = slots[k] - base
        t, end = first[j], last[j]
        bounds[k, 0], bounds[k, 1] = t + 3, end
        if end > t:  # (a ranking whose items are kept as a list has no text)
            touched += texts[t] + texts[min(t + 64, end - 1)]
    for k in range(n):
        t, end = bounds[k, 0], bounds[k, 1]
        size = ends[k] - starts[k]
        position = 1
        while t < end:
            stop = t
            while not (texts[stop] == 34 and texts[stop + 1] == 44 and texts[stop + 2] == 34):  # '","'
                stop += 1
            if stop - t == size and equal_bytes(texts, t, stop, items, starts[k], ends[k]):
                out[k] = position
                break
            position += 1
            t = stop + 3
    if touched < 0:  # never: keeps the first loop's reads
        out[0] = -1
    return out


@nb.njit(cache=True, inline="always")
def _mix(key: np.int64, grade: np.int64) -> np.uint64:  # pragma: no cover  # compiled
    h = np.uint64(key) * np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(grade) * np.uint64(0xC2B2AE3D27D4EB4F)
    return h ^ (h >> np.uint64(31))


@nb.njit(cache=True, nogil=True)
def first_times(table: Ints, keys: Ints,
                grades: Ints) -> tuple[npt.NDArray[np.bool_], int]:  # pragma: no cover  # compiled
    """Record each ``(key, grade)`` in order; ``True`` where it was not seen before. Returns the entries added.

    ``table[2 i]`` is a key (or EMPTY / DELETED) and ``table[2 i + 1]`` the bits of its grade."""
    mask = table.shape[0] // 2 - 1
    new = np.zeros(keys.shape[0], np.bool_)
    added = 0
    for k in range(keys.shape[0]):
        key, grade = keys[k], grades[k]
        i = np.int64(_mix(key, grade) & np.uint64(mask))
        free = np.int64(-1)
        while True:
            other = table[2 * i]
            if other == EMPTY:
                if free < 0:
                    free = i
                    added += 1
                table[2 * free] = key
                table[2 * free + 1] = grade
                new[k] = True
                break
            if other == DELETED:
                if free < 0:
                    free = i
            elif other == key and table[2 * i + 1] == grade:
                break
            i = (i + 1) & mask
    return new, added


@nb.njit(cache=True, nogil=True)
def forget_keys(table: Ints, keys: Ints, grades: Ints) -> int:  # pragma: no cover  # compiled
    """Remove each ``(key, grade)`` (present once); returns how many were found."""
    mask = table.shape[0] // 2 - 1
    removed = 0
    for k in range(keys.shape[0]):
        key, grade = keys[k], grades[k]
        i = np.int64(_mix(key, grade) & np.uint64(mask))
        while True:
            other = table[2 * i]
            if other == EMPTY:
                break
            if other == key and table[2 * i + 1] == grade:
                table[2 * i] = DELETED
                removed += 1
                break
            i = (i + 1) & mask
    return removed


@nb.njit(cache=True, nogil=True)
def rehash(old: Ints, new: Ints) -> int:  # pragma: no cover  # compiled
    """Copy the live ``(key, grade)`` entries of one duplicate table into another (empty) one; returns them."""
    mask = new.shape[0] // 2 - 1
    live = 0
    for i in range(old.shape[0] // 2):
        key = old[2 * i]
        if key < 0:
            continue
        grade = old[2 * i + 1]
        j = np.int64(_mix(key, grade) & np.uint64(mask))
        while new[2 * j] != EMPTY:
            j = (j + 1) & mask
        new[2 * j] = key
        new[2 * j + 1] = grade
        live += 1
    return live


def empty_table(entries: int, width: int = 2) -> Ints:
    """An open-addressing table for ``entries`` at a load of at most 1/2: a power of two of entries of
    ``width`` int64 each, all EMPTY."""
    size = MIN_TABLE
    while size < 2 * entries:
        size *= 2
    return np.full(width * size, EMPTY, dtype=np.int64)


#: Columns of an entry of the table of items that were not served: slot, code, first byte, end, hash.
UNSHOWN_ENTRY = 5


@nb.njit(cache=True, nogil=True)
def unshown_codes(table: Ints, arena: Bytes, used: int, counts: Ints, base: int, slots: Ints, items: Bytes,
                  starts: Ints, ends: Ints) -> tuple[Ints, int, int]:  # pragma: no cover  # compiled
    """A code for each (slot, item not served): 0, 1, 2... in the order a slot's items are first seen.

    New items are copied to ``arena`` from ``used`` on (the caller leaves room); returns the codes, the bytes
    used and the entries added. ``counts[s - base]`` is the number of codes slot ``s`` has given."""
    mask = table.shape[0] // UNSHOWN_ENTRY - 1
    out = np.empty(starts.shape[0], np.int64)
    added = 0
    for k in range(starts.shape[0]):
        slot = slots[k]
        h = _hash(items, starts[k], ends[k]) ^ (np.uint64(slot) * np.uint64(0x9E3779B97F4A7C15))
        i = np.int64(h & np.uint64(mask))
        while True:
            e = UNSHOWN_ENTRY * i
            if table[e] == EMPTY:
                code = counts[slot - base]
                counts[slot - base] += 1
                size = ends[k] - starts[k]
                copy_bytes(arena, used, items, starts[k], size)
                table[e] = slot
                table[e + 1] = code
                table[e + 2] = used
                table[e + 3] = used + size
                table[e + 4] = np.int64(h)
                used += size
                added += 1
                out[k] = code
                break
            if (table[e] == slot and table[e + 4] == np.int64(h)
                    and equal_bytes(arena, table[e + 2], table[e + 3], items, starts[k], ends[k])):
                out[k] = table[e + 1]
                break
            i = (i + 1) & mask
    return out, used, added


@nb.njit(cache=True, nogil=True)
def unshown_live(table: Ints, open_slot: npt.NDArray[np.bool_],
                 base: int) -> tuple[int, int]:  # pragma: no cover  # compiled
    """The entries of open slots (``open_slot[s - base]``) in a table of items not served, and their bytes."""
    entries = 0
    size = 0
    for i in range(table.shape[0] // UNSHOWN_ENTRY):
        e = UNSHOWN_ENTRY * i
        slot = table[e]
        if slot >= base and slot - base < open_slot.shape[0] and open_slot[slot - base]:
            entries += 1
            size += table[e + 3] - table[e + 2]
    return entries, size


@nb.njit(cache=True, nogil=True)
def keep_unshown(old: Ints, old_arena: Bytes, open_slot: npt.NDArray[np.bool_], base: int, new: Ints,
                 new_arena: Bytes) -> tuple[int, int]:  # pragma: no cover  # compiled
    """Copy the entries of open slots (``open_slot[s - base]``) to an empty table and arena; returns the bytes
    used and the entries kept."""
    mask = new.shape[0] // UNSHOWN_ENTRY - 1
    used = 0
    kept = 0
    for i in range(old.shape[0] // UNSHOWN_ENTRY):
        e = UNSHOWN_ENTRY * i
        slot = old[e]
        if slot < base or slot - base >= open_slot.shape[0] or not open_slot[slot - base]:
            continue
        j = np.int64(np.uint64(old[e + 4]) & np.uint64(mask))
        while new[UNSHOWN_ENTRY * j] != EMPTY:
            j = (j + 1) & mask
        f = UNSHOWN_ENTRY * j
        size = old[e + 3] - old[e + 2]
        copy_bytes(new_arena, used, old_arena, old[e + 2], size)
        new[f] = slot
        new[f + 1] = old[e + 1]
        new[f + 2] = used
        new[f + 3] = used + size
        new[f + 4] = old[e + 4]
        used += size
        kept += 1
    return used, kept


@nb.njit(cache=True, nogil=True)
def behave(first_click: npt.NDArray[np.float64], satisfied: npt.NDArray[np.bool_], index: Ints,
           click: npt.NDArray[np.bool_], satisfying: npt.NDArray[np.bool_],
           ts: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:  # pragma: no cover  # compiled
    """The behaviour measures' state of requests (``first_click``, ``satisfied``, by slot index) after feedback
    events in order: a ``click`` lowers its request's first click time to its ``ts``, a ``satisfying`` event sets
    its request satisfied. Returns which events changed their request's state."""
    changed = np.zeros(index.shape[0], np.bool_)
    for k in range(index.shape[0]):
        i = index[k]
        if click[k] and ts[k] < first_click[i]:
            first_click[i] = ts[k]
            changed[k] = True
        if satisfying[k] and not satisfied[i]:
            satisfied[i] = True
            changed[k] = True
    return changed


#: The longest score (a JSON number) that :func:`simple_rankings` takes: without an exponent, at most 299 digits
#: before the point, less than 10**299; with one of at most two digits, :data:`SCORE_EXPONENT_CHARS` in all (less
#: than 10**21 times 10**99). Longer ones go through msgspec, which says whether they are in range.
SCORE_CHARS = 300
SCORE_EXPONENT_CHARS = 24


@nb.njit(cache=True, nogil=True)
def simple_rankings(items: Bytes, i_starts: Ints, i_ends: Ints, scores: Bytes, s_starts: Ints, s_ends: Ints,
                    max_items: int) -> Ints:  # pragma: no cover  # compiled
    """The number of items of each ranking whose raw ``items`` and ``scores`` pass :meth:`Validator.compact`'s
    checks in their plainest form, -1 for any other ranking (the caller runs :meth:`Validator.compact` on it,
    which gives the result or the error).

    Plainest form: ``items`` is ``["a","b",...]`` with ASCII items without quotes or backslashes (so the
    compact text is exact), at most ``max_items`` and all different; ``scores`` is ``null`` (or empty: none) or a
    flat array of JSON numbers (checked before: by the line reader, or msgspec) without white space, one per item,
    each of at most :data:`SCORE_CHARS` characters, or :data:`SCORE_EXPONENT_CHARS` with an exponent of at most two
    digits: no such number is beyond a double's range (it is less than 10**300), so msgspec would take each one."""
    out = np.full(i_starts.shape[0], -1, np.int64)
    size = 64
    while size < 2 * max_items:
        size *= 2
    mask = size - 1
    owner = np.full(size, -1, np.int64)  # the ranking that holds each entry of the item set: no clearing
    first = np.empty(size, np.int64)
    last = np.empty(size, np.int64)
    hashes = np.empty(size, np.uint64)
    for k in range(i_starts.shape[0]):
        start, end = i_starts[k], i_ends[k]
        if end - start < 4 or items[start] != 91 or items[start + 1] != 34 or items[end - 1] != 93:
            continue
        n = 0
        i = start + 2
        plain = True
        while plain:
            a = i
            while items[i] != 34:  # the item runs to the next quote
                if items[i] == 92 or items[i] >= 128:
                    plain = False
                    break
                i += 1
            if not plain:
                break
            n += 1
            if n > max_items:
                plain = False
                break
            # the set of items so far: a repeated item leaves the plain form
            h = _hash(items, a, i)
            j = np.int64(h & np.uint64(mask))
            while owner[j] == k:
                if hashes[j] == h and equal_bytes(items, first[j], last[j], items, a, i):
                    plain = False
                    break
                j = (j + 1) & mask
            if not plain:
                break
            owner[j], hashes[j], first[j], last[j] = k, h, a, i
            if i + 2 == end and items[i + 1] == 93:  # '"]': the last item
                break
            if i + 3 < end and items[i + 1] == 44 and items[i + 2] == 34:  # '","': another item
                i += 3
                continue
            plain = False
        if not plain:
            continue
        a, b = s_starts[k], s_ends[k]
        if b == a:
            out[k] = n  # no scores
            continue
        if b - a == 4 and scores[a] == 110 and scores[a + 1] == 117 and scores[a + 2] == 108 and scores[a + 3] == 108:
            out[k] = n  # null
            continue
        if b - a < 2 or scores[a] != 91 or scores[b - 1] != 93:
            continue
        commas = 0
        size = 0  # characters of the number so far
        exponent = -1  # digits of its exponent so far (-1: none)
        for i in range(a + 1, b - 1):
            c = scores[i]
            if c == 44:
                commas += 1
                size, exponent = 0, -1
                continue
            size += 1
            if c == 101 or c == 69:  # 'e', 'E'
                exponent = 0
            elif 48 <= c <= 57:
                if exponent >= 0:
                    exponent += 1
            elif not (c == 46 or c == 45 or c == 43):  # '.', '-', '+'
                plain = False
                break
            if size > SCORE_CHARS or (exponent >= 0 and (size > SCORE_EXPONENT_CHARS or exponent > 2)):
                plain = False
                break
        if plain and (0 if b - a == 2 else commas + 1) == n:
            out[k] = n
    return out


@nb.njit(cache=True, nogil=True)
def distinct_spans(raw: Bytes, starts: Ints, ends: Ints) -> tuple[Ints, Ints]:  # pragma: no cover  # compiled
    """The byte strings ``raw[starts[k]:ends[k]]`` numbered in order of first appearance: the number of each
    (-1 where ``starts[k] < 0``: none), and the ``k`` where each number first appears."""
    n = starts.shape[0]
    size = 64
    while size < 2 * n:
        size *= 2
    mask = size - 1
    first_at = np.full(size, -1, np.int64)  # entry -> the k of its first appearance
    number = np.empty(size, np.int64)
    hashes = np.empty(size, np.uint64)
    codes = np.full(n, -1, np.int64)
    firsts = np.empty(n, np.int64)
    m = 0
    for k in range(n):
        a, b = starts[k], ends[k]
        if a < 0:
            continue
        h = _hash(raw, a, b)
        j = np.int64(h & np.uint64(mask))
        while first_at[j] >= 0:
            f = first_at[j]
            if hashes[j] == h and equal_bytes(raw, starts[f], ends[f], raw, a, b):
                break
            j = (j + 1) & mask
        if first_at[j] < 0:
            first_at[j], hashes[j], number[j] = k, h, m
            firsts[m] = k
            m += 1
        codes[k] = number[j]
    return codes, firsts[:m]


@nb.njit(cache=True, nogil=True)
def copy_spans(source: Bytes, starts: Ints, ends: Ints, before: Bytes, after: Bytes, target: Bytes, at: int,
               first: Ints, last: Ints) -> int:  # pragma: no cover  # compiled
    """Write each ``before + source[starts[k]:ends[k]] + after`` into ``target`` from ``at``, one after the other
    (``target`` has room); ``first[k]``, ``last[k]`` get where each starts and ends. Returns the end."""
    for k in range(starts.shape[0]):
        first[k] = at
        for c in before:
            target[at] = c
            at += 1
        size = ends[k] - starts[k]
        copy_bytes(target, at, source, starts[k], size)
        at += size
        for c in after:
            target[at] = c
            at += 1
        last[k] = at
    return at
