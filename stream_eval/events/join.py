"""The join of rankings and feedback: a pure state machine on event time, shared by replay and streaming.

Rules (docs/contract.md §1), with the one choice the contract leaves open written down:

* An item's grade for a request is the maximum grade of its feedback.
* Feedback may arrive before its ranking: it waits in ``pending``.
* Feedback with ``ts - serve_ts > attribution_window`` is **late** (dropped, counted).
* Repeating an ``(item, kind, grade)`` already seen for the request is a **duplicate** (counted, no effect).
* A ranking whose request_id was already seen is a **duplicate ranking** (the first one stands). Memory
  is bounded: a finalised request is remembered for one more ``attribution_window + allowed_lateness``;
  after that a ranking with its id starts a new request and feedback for it waits (and becomes an orphan).
* Feedback whose ranking has not arrived when the watermark passes ``ts + attribution_window +
  allowed_lateness`` is an **orphan**. At most ``max_waiting_feedback`` feedback events wait: beyond that, the one
  that would expire first is given up, an orphan at once, and counted (``OVERFLOW``, ``"waiting_feedback"``).
* A ranking that arrives when the watermark has passed its own finalisation point (``serve_ts +
  attribution_window + allowed_lateness``) is **late** (counted, left out of the metrics): counted, it would be a
  request with little or no feedback. It opens its request as any ranking does (feedback waiting for it joins it,
  and it is remembered), so that the join's state is the same whatever the watermark was when it came (a worker's
  rebuild re-reads it before event time moves); when finalised, at once, the request is not handed over. A
  duplicate ranking is a duplicate first.
* A request is finalised when the watermark passes ``serve_ts + attribution_window + allowed_lateness``.
  ``allowed_lateness`` (default 60 s) is how far out of event-time order an event may arrive; feedback
  that arrives after its request's finalisation point is late too.

Finalisation is *lazy but exact*: a request whose finalisation point the watermark has passed is treated
as final at once (later feedback is late), and one the watermark has taken past its memory is treated as
forgotten, even before :meth:`Join.advance` removes it; so calling ``advance`` after every event or after
every thousand events gives the same numbers.

**On columns.** The join takes a chunk of events at once (a replay chunk, a batch of Kafka records) and builds
no Python object per event or request. Open requests are *slots*, numbered in opening order: serve times,
flags and string offsets in arrays, the rankings in a list. In :meth:`Join.add`:

* rankings open slots in one short loop (an id already open or remembered is a duplicate ranking);
* each feedback's slot, its item's served position and whether it repeats an (item, kind, grade) are found
  by compiled loops (:mod:`stream_eval.events.compiled`) over the ids and item texts kept as bytes; lateness
  is one array comparison;
* applied feedback becomes rows ``(slot, item, kind, grade)``, kept by block of slots; a request's best grade
  per item comes from its rows when it is finalised (or, for the live windows, when it changes).

Feedback that arrives before its ranking, or for an id whose request was forgotten, goes through a short loop
over those events alone, with the same rules. The per-event join this replaced is kept in the tests as the
oracle: on any stream, any chunking and any schedule of ``advance`` the two give the same counts and finalise
the same requests in the same order with the same grades (``tests/test_join_oracle.py``).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import compress, count
from operator import attrgetter
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from stream_eval.config import Config
from stream_eval.events import compiled
from stream_eval.events.schema import (
    LABELS,
    NO_FEEDBACK,
    CompactRanking,
    Feedback,
    FeedbackColumns,
    PlainRankings,
    Ranking,
    kind_codes,
    label,
)
from stream_eval.metrics.kernels import pair_order

T = TypeVar("T")
_TS = attrgetter("ts")
_REQUEST_ID = attrgetter("request_id")

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bytes = npt.NDArray[np.uint8]
Bools = npt.NDArray[np.bool_]


#: The ``type`` under which :class:`EventCounts` keeps state overflow (``(OVERFLOW, kind)``): no event, not in the
#: ``events`` summary; counted there so that it is muted with the events while a join is rebuilt.
OVERFLOW = "overflow"


class EventCounts(Counter[tuple[str, str]]):
    """Events by ``(type, status)``; ``status`` is ok, invalid, late, duplicate or orphan (and ``(OVERFLOW, kind)``:
    feedback given up beyond a bound, also counted as events of their status)."""

    def summary(self) -> dict[str, int]:
        """The ``events`` section of the report."""
        by_status: Counter[str] = Counter()
        by_type: Counter[str] = Counter()
        for (kind, status), n in self.items():
            by_status[status] += n
            if status != "invalid":
                by_type[kind] += n
        return {
            "ranking": by_type["ranking"],
            "feedback": by_type["feedback"],
            "judgment": by_type["judgment"],
            "invalid": by_status["invalid"],
            "late": by_status["late"],
            "duplicate": by_status["duplicate"],
            "orphan": by_status["orphan"],
        }


class DueBySecond(Generic[T]):
    """Entries kept by the whole second of their due time, with a heap of those seconds: a list slot per entry
    where a heap of (due time, tie-breaker, entry) tuples cost ~70 bytes and a logarithmic pop with a cache miss
    per level. Used for the join's open requests and for sessions waiting to close."""

    __slots__ = ("_by_second", "_seconds")

    def __init__(self) -> None:
        self._by_second: dict[int, list[T]] = {}
        self._seconds: list[int] = []

    def add(self, due: float, entry: T) -> None:
        self._entries(math.floor(due)).append(entry)

    def add_many(self, dues: Floats, entries: list[T]) -> None:
        """:meth:`add` each entry with its due time, in order."""
        for second, index in _by_second(dues):
            self._entries(second).extend([entries[k] for k in index.tolist()])

    def _entries(self, second: int) -> list[T]:
        """The entries due in ``second`` (a new, empty list if none were)."""
        entries = self._by_second.get(second)
        if entries is None:
            entries = self._by_second[second] = []
            heapq.heappush(self._seconds, second)
        return entries

    def pop_due(self, watermark: float, due_of: Callable[[T], float]) -> list[T]:
        """Remove and return the entries due by ``watermark`` (``due_of(entry) <= watermark``), second by second
        in order, each second's in the order they were added."""
        return self._pop(watermark, lambda entries: ([e for e in entries if due_of(e) <= watermark],
                                                     [e for e in entries if due_of(e) > watermark]))

    def _pop(self, watermark: float, split: Callable[[list[T]], tuple[list[T], list[T]]]) -> list[T]:
        """Remove and return the entries due by ``watermark``; ``split`` parts the entries of the second the
        watermark is in into those due and those kept."""
        seconds, by_second, ready = self._seconds, self._by_second, []
        while seconds and seconds[0] <= watermark:
            second = seconds[0]
            entries = by_second[second]
            if second + 1 > watermark:  # the watermark is inside this second: some may stay
                due, entries[:] = split(entries)
                ready += due
                if entries:
                    break
            else:
                ready += entries
            heapq.heappop(seconds)
            del by_second[second]
        return ready

    def clear(self) -> None:
        self._by_second.clear()
        self._seconds.clear()


def _by_second(dues: Floats) -> list[tuple[int, Ints]]:
    """The whole seconds of ``dues``, each with the indexes of the times in it (ascending)."""
    floors = np.floor(dues)
    if not bool((np.abs(floors) < 2.0**62).all()):  # seconds beyond int64 (absurd times, but valid): Python ints
        by_second: dict[int, list[int]] = {}
        for k, second in enumerate(map(math.floor, dues.tolist())):
            by_second.setdefault(second, []).append(k)
        return [(second, np.array(index, dtype=np.int64)) for second, index in by_second.items()]
    seconds = floors.astype(np.int64)
    order = np.argsort(seconds, kind="stable")
    cuts = np.flatnonzero(np.diff(seconds[order])) + 1
    return [(int(seconds[part[0]]), part) for part in np.split(order, cuts) if part.shape[0]]


#: A request's row in the live windows when they do not hold it, and when they hold it as ungraded: ``UNGRADED - k``
#: (``k`` >= 0, the windows' code of the request's segment groups, so that taking it out reads no ranking again).
NO_ROW = -1
UNGRADED = -2


#: Slots per block of feedback rows: finalising requests reads and rewrites the rows of their blocks only.
BLOCK = 8192
#: Slots of finalised and forgotten requests are dropped from the front of the arrays at least this many at a time
#: (the arrays are trimmed once they have doubled, so the cost per slot does not depend on it). Each input partition
#: of a worker has a join, and each may hold up to this many forgotten requests (~1 KB each) beyond what it needs.
TRIM = 1 << 12
#: Item texts of finalised requests are dropped once they take this many bytes (and half as many as the rest).
TEXT_CUT = 1 << 20
#: Slots the arrays hold at first (they grow by half when full).
FIRST_CAPACITY = 1024
#: Entries of the waiting feedback's expiry heap beyond twice the feedback waiting before it is rebuilt (entries of
#: feedback that found its ranking stay until they are due otherwise).
_EXPIRY_SLACK = 1 << 16
#: A feedback row's item is its ``field``: the served position (1, 2...), or ``-1 - code`` for an item that was
#: not served (codes 0, 1, 2... per request, see :func:`compiled.unshown_codes`). Duplicate keys are integers
#: ``(slot mod 2**36) << 27 | packed field << 4 | kind``, the packed field being the position, or
#: ``2**22 + code``; rows outside these bounds (a position or code from 2**22, more than 16 kinds) use tuple
#: keys in a dict instead.
_SLOT_MASK = (1 << 36) - 1
_FIELD_LIMIT = 1 << 22
_KIND_LIMIT = 16
#: Grades already seen for a duplicate key: the first grade, or the set of them once there are several.
SeenGrades = float | set[float]
#: A compact item text is the inside of the JSON array between these: ``["a","b"]`` becomes ``","a","b","``
#: (:func:`~stream_eval.events.schema.compact_texts`).
_ITEMS_OPEN, _ITEMS_CLOSE = np.frombuffer(b'",', dtype=np.uint8), np.frombuffer(b',"', dtype=np.uint8)
_NOTHING = np.frombuffer(b"", dtype=np.uint8)


class Finalised:
    """Requests finalised together, in order, with their judged items as columns.

    ``shown_*`` are the served items with a grade, 0 included (``shown_req`` indexes ``rankings``, ``shown_pos``
    is 1-based); ``unshown_*`` the judged items with a grade > 0 that were not served. The rows come
    sorted by request, then position (shown) or first feedback (unshown).

    For the behaviour measures (left empty when none runs): ``click_req``, ``click_pos`` the clicked served items,
    each once, sorted by request and position; ``first_click`` the time of each request's first click on a served
    item (+inf: none); ``satisfied`` whether a served item got a click with dwell >= ``sat_dwell`` or feedback of a
    kind in ``sat_kinds``.
    """

    __slots__ = ("rankings", "serve", "shown_req", "shown_pos", "shown_grade", "unshown_req", "unshown_grade",
                 "slots", "rows", "graded", "click_req", "click_pos", "first_click", "satisfied")

    def __init__(self, rankings: list[CompactRanking], serve: Floats, shown_req: Ints, shown_pos: Ints,
                 shown_grade: Floats, unshown_req: Ints, unshown_grade: Floats, slots: Ints, rows: Ints,
                 graded: Bools, click_req: Ints, click_pos: Ints, first_click: Floats, satisfied: Bools) -> None:
        self.rankings = rankings
        self.serve = serve
        self.shown_req = shown_req
        self.shown_pos = shown_pos
        self.shown_grade = shown_grade
        self.unshown_req = unshown_req
        self.unshown_grade = unshown_grade
        self.slots = slots  # the join's slot of each request
        self.rows = rows  # the live windows' row of each when it was taken (see Join.set_rows)
        self.graded = graded  # whether feedback that can change a value was applied (grade > 0, or a served item)
        self.click_req, self.click_pos = click_req, click_pos
        self.first_click, self.satisfied = first_click, satisfied

    def __len__(self) -> int:
        return len(self.rankings)

    def split_at(self, picked: list[int]) -> Finalised:
        """The requests at these indexes (ascending), in that order."""
        index = np.array(picked, dtype=np.int64)
        new_of = np.full(len(self), -1, dtype=np.int64)
        new_of[index] = np.arange(index.shape[0])
        shown, unshown = new_of[self.shown_req] >= 0, new_of[self.unshown_req] >= 0
        clicked = new_of[self.click_req] >= 0
        return self._part(index, [self.rankings[i] for i in picked], shown, new_of[self.shown_req[shown]], unshown,
                          new_of[self.unshown_req[unshown]], clicked, new_of[self.click_req[clicked]])

    def split(self, size: int) -> list[Finalised]:
        """In parts of at most ``size`` requests, in order."""
        if len(self) <= size:
            return [self]
        cuts = list(range(0, len(self), size)) + [len(self)]
        shown, unshown = np.searchsorted(self.shown_req, cuts), np.searchsorted(self.unshown_req, cuts)
        clicked = np.searchsorted(self.click_req, cuts)
        parts = []
        for k in range(len(cuts) - 1):
            a, b = cuts[k], cuts[k + 1]
            s, u = slice(shown[k], shown[k + 1]), slice(unshown[k], unshown[k + 1])
            c = slice(clicked[k], clicked[k + 1])
            parts.append(self._part(slice(a, b), self.rankings[a:b], s, self.shown_req[s] - a, u,
                                    self.unshown_req[u] - a, c, self.click_req[c] - a))
        return parts

    def _part(self, requests: slice | Ints, rankings: list[CompactRanking], shown: slice | Bools, shown_req: Ints,
              unshown: slice | Bools, unshown_req: Ints, clicked: slice | Bools, click_req: Ints) -> Finalised:
        """Some of these requests (``requests``), with their rows (``shown``, ``unshown``, ``clicked``) renumbered."""
        return Finalised(rankings, self.serve[requests], shown_req, self.shown_pos[shown], self.shown_grade[shown],
                         unshown_req, self.unshown_grade[unshown], self.slots[requests], self.rows[requests],
                         self.graded[requests], click_req, self.click_pos[clicked], self.first_click[requests],
                         self.satisfied[requests])

    def shown_grades(self) -> list[dict[int, float]]:
        """Each request's best grade per judged served position (0: judged non-relevant)."""
        out: list[dict[int, float]] = [{} for _ in self.rankings]
        for req, pos, grade in zip(self.shown_req.tolist(), self.shown_pos.tolist(), self.shown_grade.tolist(),
                                   strict=True):
            out[req][pos] = grade
        return out

    def unshown_grades(self) -> list[list[float]]:
        """Each request's best grades (> 0) of the items that were not served, in ascending order."""
        out: list[list[float]] = [[] for _ in self.rankings]
        for req, grade in zip(self.unshown_req.tolist(), self.unshown_grade.tolist(), strict=True):
            out[req].append(grade)
        return [sorted(grades) for grades in out]


def _empty_finalised() -> Finalised:
    no_ints = np.empty(0, dtype=np.int64)
    return Finalised([], np.empty(0), no_ints, no_ints, np.empty(0), no_ints, np.empty(0), no_ints, no_ints,
                     np.empty(0, dtype=np.bool_), no_ints, no_ints, np.empty(0), np.empty(0, dtype=np.bool_))


class _DueSlots(DueBySecond[tuple[Ints, Floats]]):
    """Open slots by the whole second of their deadline: arrays of slots and deadlines per second."""

    __slots__ = ()

    def add_slots(self, slots: Ints, deadlines: Floats) -> None:
        for second, part in _by_second(deadlines):
            self._entries(second).append((slots[part], deadlines[part]))

    def pop_slots(self, watermark: float) -> tuple[Ints, Floats]:
        """Remove and return the slots whose deadline is at most ``watermark``, with their deadlines."""

        def split(entries: list[tuple[Ints, Floats]]) -> tuple[list[tuple[Ints, Floats]], list[tuple[Ints, Floats]]]:
            ready = [(part[due <= watermark], due[due <= watermark]) for part, due in entries]
            kept = [(part[due > watermark], due[due > watermark]) for part, due in entries]
            return ready, [entry for entry in kept if entry[0].shape[0]]

        parts = self._pop(watermark, split)
        if not parts:
            return np.empty(0, dtype=np.int64), np.empty(0)
        return np.concatenate([part for part, _ in parts]), np.concatenate([due for _, due in parts])


#: The arrays of Join indexed by slot - base.
_COLUMNS = ("_serve", "_final", "_applied", "_graded", "_row", "_id_first", "_id_last", "_text_first", "_text_last",
            "_unshown_count")
#: The columns the behaviour measures add, when one runs (Join.behaviour).
_BEHAVIOUR_COLUMNS = ("_first_click", "_satisfied")


class _Arena:
    """Bytes of the slots' strings in one growing buffer, cut from the front when slots are dropped."""

    __slots__ = ("data", "used")

    def __init__(self) -> None:
        self.data = np.empty(1 << 16, dtype=np.uint8)
        self.used = 0

    def append(self, buffer: npt.NDArray[np.uint8]) -> int:
        """Add ``buffer``; returns the offset where it starts."""
        start = self.used
        self.reserve(buffer.shape[0])
        self.data[start : start + buffer.shape[0]] = buffer
        self.used += buffer.shape[0]
        return start

    def reserve(self, more: int) -> None:
        """Room for ``more`` bytes after those used."""
        end = self.used + more
        if end > self.data.shape[0]:
            size = self.data.shape[0]
            while size < end:
                size += size // 2  # by half: the bytes held stay within 1.5x (on average 1.25x) of those used
            grown = np.empty(size, dtype=np.uint8)
            grown[: self.used] = self.data[: self.used]
            self.data = grown

    def cut(self, offset: int) -> None:
        """Drop the bytes before ``offset`` (offsets held elsewhere move down by it)."""
        self.data[: self.used - offset] = self.data[offset : self.used]
        self.used -= offset


class Join:
    """Rankings and feedback joined by ``request_id`` on event time, a chunk of events at a time.

    Call :meth:`add` with a chunk of rankings and feedback and the watermark before each event, then
    :meth:`advance`; :meth:`flush` at the end of input.
    """

    def __init__(self, config: Config, counts: EventCounts) -> None:
        self.attribution_window = config.attribution_window
        self.horizon = config.attribution_window + config.allowed_lateness
        self.max_waiting = config.max_waiting_feedback
        self.counts = counts
        self.watermark = -math.inf
        # open slots that are new or whose grades may have changed: kept once the live windows read it
        self.changed: set[int] | None = None
        self._seq = count()
        self.delays: list[float] | None = None  # feedback ts - serve ts of applied feedback, when recorded
        # behaviour measures (README, "Behaviour measures"): each request's first click and whether it was satisfied
        # are kept only when a behaviour or session measure runs
        self.behaviour = any(spec.definition.scope != "relevance" for spec in config.specs)
        self._columns = _COLUMNS + _BEHAVIOUR_COLUMNS if self.behaviour else _COLUMNS  # the slot columns
        self._click = int(kind_codes(["click"])[0])
        self._sat_kinds = kind_codes(list(config.sat_kinds))
        self._sat_dwell = config.sat_dwell
        self._start(0)

    def _start(self, base: int) -> None:
        """No request yet; the next slot is ``base``."""
        self.base = base  # the slot at index 0 of the arrays
        self.size = 0  # slots in the arrays
        # the columns (_COLUMNS)
        self._serve = np.zeros(FIRST_CAPACITY)
        self._final = np.zeros(FIRST_CAPACITY, dtype=np.bool_)
        self._late: set[int] = set()  # open slots of late rankings (docs/contract.md §1): never handed over
        self._applied = np.zeros(FIRST_CAPACITY, dtype=np.bool_)  # feedback was applied
        self._graded = np.zeros(FIRST_CAPACITY, dtype=np.bool_)  # feedback with grade > 0 or on a served item
        self._row = np.zeros(FIRST_CAPACITY, dtype=np.int64)  # the live windows' row (see set_rows)
        self._id_first = np.zeros(FIRST_CAPACITY, dtype=np.int64)
        self._id_last = np.zeros(FIRST_CAPACITY, dtype=np.int64)
        self._text_first = np.zeros(FIRST_CAPACITY, dtype=np.int64)
        self._text_last = np.zeros(FIRST_CAPACITY, dtype=np.int64)
        self._unshown_count = np.zeros(FIRST_CAPACITY, dtype=np.int64)  # codes given to items not served
        # behaviour (only when it runs: else never read, and of no size): the time of the first click on a served
        # item, and whether a served item got a satisfied click or a satisfying kind
        size = FIRST_CAPACITY if self.behaviour else 0
        self._first_click = np.full(size, math.inf)
        self._satisfied = np.zeros(size, dtype=np.bool_)
        # request id -> its latest slot (open, or finalised and not yet dropped): an open-addressing table of
        # (slot, hash) pairs over the ids' bytes in ``_ids``, slot ``s``'s at ``[_id_first, _id_last)[s - base]``
        self._id_table = compiled.empty_table(0)
        self._id_entries = 0
        self._trim_at = 2 * TRIM  # slots in the arrays when _trim next looks
        self._first_open = base  # no slot before it is open (see _cut_texts)
        self._ids = _Arena()
        self._texts = _Arena()  # the compact item texts, as bytes (empty when kept as a list)
        self._rankings: list[CompactRanking | None] = []
        self._listed: set[int] = set()  # open slots whose items are kept as a list (an item has a quote)
        self._due = _DueSlots()
        self._early: list[int] = []  # finalised when a new ranking took their id: emitted by the next advance
        self.pending: dict[str, list[Feedback]] = {}
        self.waiting = 0  # feedback events in ``pending``
        self._pending_expiry: list[tuple[float, int, str]] = []
        self._rows: dict[int, list[tuple[Ints, Ints, Ints, Floats]]] = {}  # block -> (slot, pos, kind, grade)
        # (key, grade bits) of the applied feedback with an integer key (see _SLOT_MASK), as a compiled table
        self._dup_table = compiled.empty_table(0)
        self._dup_entries = 0  # entries in use or deleted
        self._seen: dict[tuple[int, int, int], SeenGrades] = {}  # the other applied feedback
        self._odd_keys: dict[int, list[tuple[int, int, int]]] = {}  # slot -> its tuple keys
        # (slot, item not served) -> code: entries of compiled.UNSHOWN_ENTRY columns, the items' bytes in the arena
        self._unshown_table = compiled.empty_table(0, compiled.UNSHOWN_ENTRY)
        self._unshown_entries = 0
        self._unshown_items = _Arena()

    # -- slots ----------------------------------------------------------------------------------------
    def _grow(self, size: int) -> None:
        capacity = self._serve.shape[0]
        if size <= capacity:
            return
        while capacity < size:
            capacity += capacity // 2 + 1
        for name in self._columns:
            old = getattr(self, name)
            new = np.zeros(capacity, dtype=old.dtype)
            new[: self.size] = old[: self.size]
            setattr(self, name, new)

    def _keep_strings(self, arena: _Arena, texts: list[str], first: Ints, last: Ints, span: slice) -> None:
        buffer, starts, ends = compiled.utf8_fields(texts)
        offset = arena.append(buffer)
        first[span] = starts + offset
        last[span] = ends + offset

    @staticmethod
    def _copy_spans(arena: _Arena, raw: Bytes, starts: Ints, ends: Ints, before: Bytes, after: Bytes, first: Ints,
                    last: Ints, span: slice) -> None:
        """:meth:`_keep_strings` of byte strings ``raw[starts:ends]``, each put between ``before`` and ``after``."""
        arena.reserve(int((ends - starts).sum()) + starts.shape[0] * (before.shape[0] + after.shape[0]))
        arena.used = compiled.copy_spans(raw, starts, ends, before, after, arena.data, arena.used, first[span],
                                         last[span])

    def _reserve_keys(self, more: int) -> None:
        """Room for ``more`` duplicate keys: rebuilt (without deleted entries) when it would be over half full."""
        if 2 * (self._dup_entries + more) <= self._dup_table.shape[0] // 2:
            return
        old = self._dup_table
        live = int((old[::2] >= 0).sum())
        self._dup_table = compiled.empty_table(2 * (live + more))
        self._dup_entries = compiled.rehash(old, self._dup_table)

    def _unshown_codes(self, slots: Ints, buffer: Bytes, starts: Ints, ends: Ints) -> Ints:
        """The code of each (slot, item not served), the items' UTF-8 at ``buffer[starts:ends]``; the table is
        rebuilt, sized for the open slots' entries alone, when it would be over half full."""
        table, arena = self._unshown_table, self._unshown_items
        n_items = slots.shape[0]
        if 2 * (self._unshown_entries + n_items) > table.shape[0] // compiled.UNSHOWN_ENTRY:
            old, old_arena = table, arena.data
            held = ~self._final[: self.size]
            held[np.array(self._early, dtype=np.int64) - self.base] = True  # finalised early, may still get rows
            live, size = compiled.unshown_live(old, held, self.base)  # sized for these: the table cannot creep up
            table = self._unshown_table = compiled.empty_table(live + n_items, compiled.UNSHOWN_ENTRY)
            arena.data = np.empty(max(size + int((ends - starts).sum()), 1 << 16), dtype=np.uint8)
            arena.used, self._unshown_entries = compiled.keep_unshown(old, old_arena, held,
                                                                      self.base, table, arena.data)
        arena.reserve(int((ends - starts).sum()))  # room for them all
        codes, arena.used, added = compiled.unshown_codes(table, arena.data, arena.used, self._unshown_count,
                                                          self.base, slots, buffer, starts, ends)
        self._unshown_entries += added
        return codes

    def _find_ids(self, rids: list[str]) -> Ints:
        """The latest slot of each request id, or -1."""
        return self._find(*compiled.utf8_fields(rids))

    def _find(self, keys: Bytes, starts: Ints, ends: Ints) -> Ints:
        """:meth:`_find_ids` of the ids at ``keys[starts:ends]`` (UTF-8)."""
        return compiled.find_ids(self._id_table, self._ids.data, self._id_first, self._id_last, self.base, keys,
                                 starts, ends)

    def _put_ids(self, slots: Ints) -> None:
        """Make ``slots`` (in order) the latest of their ids; the table grows to stay at most half full."""
        if 2 * (self._id_entries + slots.shape[0]) > self._id_table.shape[0] // 2:
            self._id_table = compiled.empty_table(2 * (self._id_entries + slots.shape[0]))
            self._id_entries = 0
            slots = np.arange(self.base, self.base + self.size, dtype=np.int64)  # every slot again, in order
        self._id_entries += compiled.put_ids(self._id_table, self._ids.data, self._id_first, self._id_last,
                                             self.base, slots)

    # -- events ---------------------------------------------------------------------------------------
    def add(self, events: Sequence[Ranking | CompactRanking | Feedback], before: Floats | None = None) -> None:
        """Join a chunk of rankings and feedback, in arrival order.

        ``before[i]`` is the watermark when event ``i`` arrives (event time moved by the events before it);
        ``None``: :attr:`watermark` for every event. The caller then moves :attr:`watermark` (``advance``).

        The join takes the rankings it opens requests with: it keeps a compact ranking's item text as bytes and
        empties its ``items`` (and shares its label strings), so a ranking object goes to one join, once.
        """
        self.add_columns(events, np.arange(len(events)), NO_FEEDBACK, np.empty(0, dtype=np.int64), before)

    def add_columns(self, objects: Sequence[Ranking | CompactRanking | Feedback], objects_at: Ints,
                    feedback: FeedbackColumns, feedback_at: Ints, before: Floats | None = None,
                    plain: PlainRankings | None = None) -> None:
        """:meth:`add` for a chunk whose events come as objects and as feedback columns, each at its place
        (``objects_at``, ``feedback_at``: ascending) among the chunk's events; ``before`` is indexed by place.
        Places may skip events that are not the join's (judgments, invalid events).

        With ``plain``, the rankings among ``objects`` are exactly ``plain.rankings``, in order: their ids and
        items are copied from the chunk's bytes (their ``items`` are empty, their names already shared)."""
        if not len(objects) and not len(feedback):
            return
        if self.size + len(objects) > self._serve.shape[0]:
            self._trim(full=True)  # room for the new slots, if forgotten ones can make it
        if Feedback in map(type, objects):  # feedback objects join the columns, in order
            is_feedback = np.fromiter((type(e) is Feedback for e in objects), dtype=np.bool_, count=len(objects))
            more = FeedbackColumns.of(list(compress(objects, is_feedback.tolist())))  # type: ignore[arg-type]
            feedback_at = np.concatenate((feedback_at, objects_at[is_feedback]))
            order = np.argsort(feedback_at, kind="stable")
            feedback, feedback_at = FeedbackColumns.concat([feedback, more]).take(order), feedback_at[order]
            objects = list(compress(objects, (~is_feedback).tolist()))
            objects_at = objects_at[~is_feedback]
        if before is None:
            places = max(int(objects_at.max()) if len(objects) else -1, int(feedback_at.max()) if len(feedback) else -1)
            marks = np.full(places + 1, self.watermark)
        else:
            marks = np.asarray(before, dtype=np.float64)
        horizon = self.horizon
        counts = self.counts
        # 1. Rankings open slots, in order.
        ranking_at = objects_at.tolist()
        rankings: list[CompactRanking] = objects  # type: ignore[assignment]  # rankings here
        rids = list(map(_REQUEST_ID, rankings))
        if plain is None:
            known_slots = self._find_ids(rids)  # the slot of each id before this chunk, or -1
        elif len(plain) == len(rankings):
            known_slots = self._find(plain.raw, plain.id_start, plain.id_end)
        else:
            raise ValueError(f"{len(rankings)} rankings given with the bytes of {len(plain)}")
        taken: list[int] = []  # with plain: the index in rankings of each new slot's ranking
        opened: dict[str, int] = {}  # the ids given a slot in this chunk
        first_new = self.base + self.size
        new_at: list[int] = []  # chunk position of each new slot's ranking
        new_ts: list[float] = []
        new_rankings: list[CompactRanking] = []
        replaced: dict[int, int] = {}  # new slot -> the slot its id had
        early_here: list[int] = []  # open slots whose id a new ranking took, in that order
        # rows applied at another place than their arrival: slot, feedback, applied at, order there, watermark,
        # and whether they waited for their ranking (then the orphan rule applies)
        waiting_rows: list[tuple[int, Feedback, int, int, float, bool]] = []
        ranking_ok = ranking_duplicate = ranking_late = 0
        late_slots: list[int] = []  # the new slots of late rankings (opened as any, left out when finalised)
        serve = self._serve
        served_at = list(map(_TS, rankings))
        if (rids and known_slots.max() < 0 and len(set(rids)) == len(rids) and self.pending.keys().isdisjoint(rids)
                and (plain is not None or all(type(r) is CompactRanking for r in rankings))
                and not (np.array(served_at) + horizon <= marks[objects_at]).any()):
            # new ids only, each once, none awaited, none late: every ranking opens a slot (the loop below, at once)
            ranking_ok, new_at, new_rankings = len(rids), ranking_at, rankings
            new_ts = served_at
            rankings = []
        for k, (p, ranking, rid, slot) in enumerate(zip(ranking_at, rankings, rids, known_slots.tolist(),
                                                        strict=False)):
            mark = float(marks[p])
            if opened:
                slot = opened.get(rid, slot)
            if slot >= 0:
                served = new_ts[slot - first_new] if slot >= first_new else float(serve[slot - self.base])
                if served + horizon + horizon > mark:  # open, or finalised and still remembered
                    ranking_duplicate += 1
                    continue
            if slot >= 0 and (slot >= first_new or not self._final[slot - self.base]):
                early_here.append(slot)  # open but forgotten: finalised now, before the new request opens
            if served_at[k] + horizon <= mark:  # late: event time is past its own finalisation point
                ranking_late += 1
                late_slots.append(first_new + len(new_at))
            else:
                ranking_ok += 1
            if type(ranking) is not CompactRanking:
                ranking = CompactRanking.of(ranking)  # type: ignore[arg-type]  # a Ranking
            new_slot = first_new + len(new_at)
            opened[rid] = new_slot
            if slot >= 0:
                replaced[new_slot] = slot
            new_at.append(p)
            new_ts.append(ranking.ts)
            new_rankings.append(ranking)
            taken.append(k)
            waiting = self.pending.pop(rid, None)
            if waiting is not None:
                self.waiting -= len(waiting)
                waiting_rows += [(new_slot, f, p, k - len(waiting), mark, True) for k, f in enumerate(waiting)]
        if ranking_ok:
            counts["ranking", "ok"] += ranking_ok
        if ranking_duplicate:
            counts["ranking", "duplicate"] += ranking_duplicate
        if ranking_late:
            counts["ranking", "late"] += ranking_late
        n_new = len(new_at)
        if n_new:
            self._grow(self.size + n_new)
            span = slice(self.size, self.size + n_new)
            self._serve[span] = new_ts
            self._final[span] = False
            self._applied[span] = False
            self._graded[span] = False
            self._row[span] = NO_ROW
            self._unshown_count[span] = 0
            if self.behaviour:
                self._first_click[span] = math.inf
                self._satisfied[span] = False
            self._rankings += new_rankings
            if plain is None:
                texts = [r.items if type(r.items) is str else "" for r in new_rankings]
                if "" in texts:
                    if any(r.items == "" for r in new_rankings):
                        raise ValueError("a ranking was given to the join twice (it keeps a ranking's items, see add)")
                    self._listed.update(first_new + k for k, text in enumerate(texts) if not text)
                self._keep_strings(self._texts, texts, self._text_first, self._text_last, span)
                _keep_lightly(new_rankings)
                self._keep_strings(self._ids, [r.request_id for r in new_rankings], self._id_first, self._id_last,
                                   span)
            else:
                plain.filled = True  # the join holds their items now
                pick = slice(None) if not taken else np.array(taken, dtype=np.int64)
                self._copy_spans(self._texts, plain.raw, plain.items_start[pick] + 1, plain.items_end[pick] - 1,
                                 _ITEMS_OPEN, _ITEMS_CLOSE, self._text_first, self._text_last, span)
                self._copy_spans(self._ids, plain.raw, plain.id_start[pick], plain.id_end[pick], _NOTHING, _NOTHING,
                                 self._id_first, self._id_last, span)
            self.size += n_new
            slots = np.arange(first_new, first_new + n_new, dtype=np.int64)
            self._put_ids(slots)
            if late_slots:
                self._late.update(late_slots)
            if self.changed is not None:
                self.changed.update(slots.tolist())
                if late_slots:
                    self.changed.difference_update(late_slots)
            self._due.add_slots(slots, self._serve[span] + self.horizon)
        for slot in early_here:
            self._final[slot - self.base] = True
        self._early += early_here
        # 2. Feedback finds its slot.
        at = feedback_at
        rows_slot = np.empty(0, dtype=np.int64)
        rows_at = rows_seq = at[:0]
        rows_mark = np.empty(0)
        rows_feedback = NO_FEEDBACK
        if len(feedback):
            found = self._find(feedback.text, feedback.rid_start, feedback.rid_end)
            fb_mark = marks[at]
            missing = found < 0
            slot_index = np.where(missing, self.base, found) - self.base
            opened_later = np.zeros(at.shape[0], dtype=np.bool_)
            if n_new:
                new_positions = np.array(new_at, dtype=np.int64)
                recent = ~missing & (slot_index >= first_new - self.base)
                opened_later[recent] = new_positions[slot_index[recent] - (first_new - self.base)] > at[recent]
            alive = self._serve[slot_index] + horizon + horizon > fb_mark
            final = self._final[slot_index].copy()
            if early_here:
                final[np.isin(slot_index + self.base, list(early_here))] = False  # they were open when it arrived
            regular = ~missing & ~opened_later & alive & ~final
            remembered = ~missing & ~opened_later & alive & final
            if remembered.any():
                counts["feedback", "late"] += int(remembered.sum())
            odd = np.flatnonzero(~regular & ~remembered)
            take = np.flatnonzero(regular)
            rows_slot = slot_index[take] + self.base
            rows_at = rows_seq = at[take]
            rows_mark = fb_mark[take]
            rows_feedback = feedback.take(take) if take.shape[0] != len(feedback) else feedback
            if odd.shape[0]:
                waiting_rows += self._odd_feedback(
                    list(zip(feedback.events(odd), at[odd].tolist(), fb_mark[odd].tolist(), found[odd].tolist(),
                             strict=True)), first_new, new_at, replaced, early_here, marks)
        # 3. Rows: orphans, late, then apply.
        if waiting_rows:
            w_slot, w_feedback, w_at, w_seq, w_mark, w_waits = zip(*waiting_rows, strict=True)
            rows_slot = np.concatenate((rows_slot, np.array(w_slot, dtype=np.int64)))
            rows_at = np.concatenate((rows_at, np.array(w_at, dtype=np.int64)))
            rows_seq = np.concatenate((rows_seq, np.array(w_seq, dtype=np.int64)))
            rows_mark = np.concatenate((rows_mark, np.array(w_mark, dtype=np.float64)))
            waiting_flag = np.zeros(rows_slot.shape[0], dtype=np.bool_)
            waiting_flag[rows_slot.shape[0] - len(waiting_rows):] = w_waits
            order = np.lexsort((rows_seq, rows_at))
            rows_slot, rows_mark, waiting_flag = rows_slot[order], rows_mark[order], waiting_flag[order]
            rows_feedback = FeedbackColumns.concat([rows_feedback, FeedbackColumns.of(w_feedback)]).take(order)
        else:
            waiting_flag = np.zeros(rows_slot.shape[0], dtype=np.bool_)
        if len(rows_feedback):
            self._apply(rows_slot, rows_feedback, rows_mark, waiting_flag)

    def _odd_feedback(
        self,
        odd: list[tuple[Feedback, int, float, int]],
        first_new: int,
        new_at: list[int],
        replaced: dict[int, int],
        early_here: list[int],
        marks: Floats,
    ) -> list[tuple[int, Feedback, int, int, float, bool]]:
        """Feedback that did not find an open request when it arrived: before its ranking, for a forgotten
        request, or while its id was still another request's. Returns the rows to apply; the rest waits."""
        horizon = self.horizon
        opens: dict[str, list[tuple[int, int]]] = {}  # id -> (chunk position, slot) of the rankings opened
        for k, p in enumerate(new_at):
            rankings = self._rankings[first_new - self.base + k]
            opens.setdefault(rankings.request_id, []).append((p, first_new + k))  # type: ignore[union-attr]
        rows: list[tuple[int, Feedback, int, int, float, bool]] = []
        for event, j, mark, found in odd:
            rid = event.request_id
            # the slot its id had when it arrived
            slot: int | None = found if found >= 0 else None
            while slot is not None and slot >= first_new and new_at[slot - first_new] > j:
                slot = replaced.get(slot)
            if slot is not None and self._serve[slot - self.base] + horizon + horizon > mark:
                if self._final[slot - self.base] and slot not in early_here:
                    self.counts["feedback", "late"] += 1
                else:
                    rows.append((slot, event, j, j, mark, False))
                continue
            later = [(p, s) for p, s in opens.get(rid, ()) if p > j]
            if later:  # waits for a ranking of this chunk
                p, s = later[0]
                rows.append((s, event, p, j, float(marks[p]), True))
                continue
            self.pending.setdefault(rid, []).append(event)
            self.waiting += 1
            heapq.heappush(self._pending_expiry, (event.ts + self.horizon, next(self._seq), rid))  # type: ignore[operator]  # ts is float
            if self.waiting > self.max_waiting:
                self._give_up(mark)
            if len(self._pending_expiry) > 2 * self.waiting + _EXPIRY_SLACK:
                self._rebuild_expiry()
        return rows

    def _give_up(self, mark: float) -> None:
        """Back to ``max_waiting_feedback`` waiting, at watermark ``mark``: what has expired by then is an orphan
        (as :meth:`advance` would count it); then, while too many wait, the feedback that would expire first is
        given up: an orphan at once, counted as overflow."""
        self._expire_pending(mark)
        expiry = self._pending_expiry
        while self.waiting > self.max_waiting:
            due, _, rid = heapq.heappop(expiry)
            waiting = self.pending.get(rid)
            # the first of its feedback with this expiry (none: the entry of feedback that found its ranking)
            k = next((k for k, f in enumerate(waiting or ()) if f.ts + self.horizon == due), None)  # type: ignore[operator]  # ts is float
            if k is None:
                continue
            del waiting[k]  # type: ignore[union-attr]  # found in it
            if not waiting:
                del self.pending[rid]
            self.waiting -= 1
            self.counts["feedback", "orphan"] += 1
            self.counts[OVERFLOW, "waiting_feedback"] += 1

    def waiting_feedback(self) -> list[list[Any]]:
        """The feedback waiting for its ranking, as JSON-ready rows ``[request_id, item, kind, grade, ts, dwell]``
        (a checkpoint stores them: re-read events do not tell which feedback waited, as that depended on event time
        and on the rankings read then)."""
        return [[f.request_id, f.item, f.kind, f.grade, f.ts, f.dwell] for waiting in self.pending.values()
                for f in waiting]

    def restore_waiting(self, rows: Sequence[Sequence[Any]]) -> None:
        """After a rebuild, the feedback waiting is what :meth:`waiting_feedback` gave (in that order), not what
        the re-read feedback left waiting."""
        self.pending, self.waiting, self._pending_expiry = {}, 0, []
        for request_id, item, kind, grade, ts, dwell in rows:
            event = Feedback(request_id, item, kind, grade, ts, dwell)
            self.pending.setdefault(event.request_id, []).append(event)
            self.waiting += 1
            heapq.heappush(self._pending_expiry, (event.ts + self.horizon, next(self._seq), event.request_id))  # type: ignore[operator]  # ts is float

    def _rebuild_expiry(self) -> None:
        """The expiry heap of the feedback waiting, without the entries of feedback that found its ranking."""
        horizon, seq = self.horizon, self._seq
        self._pending_expiry = [(f.ts + horizon, next(seq), rid) for rid, waiting in self.pending.items()  # type: ignore[operator]  # ts is float
                                for f in waiting]
        heapq.heapify(self._pending_expiry)

    def _apply(self, slots: Ints, feedback: FeedbackColumns, marks: Floats, waiting: Bools) -> None:
        """Apply feedback rows in order: orphans (waiting rows past their time), late, duplicates, the rest."""
        counts = self.counts
        ts = feedback.ts
        index = slots - self.base
        served = self._serve[index]
        orphan = waiting & (ts + self.horizon <= marks)
        late = ~orphan & ((ts - served > self.attribution_window) | (served + self.horizon <= marks))
        if orphan.any():
            counts["feedback", "orphan"] += int(orphan.sum())
        if late.any():
            counts["feedback", "late"] += int(late.sum())
        keep = np.flatnonzero(~(orphan | late))
        if not keep.shape[0]:
            return
        if keep.shape[0] != len(feedback):
            feedback = feedback.take(keep)
            slots, index, ts, served = slots[keep], index[keep], ts[keep], served[keep]
        grade, kind = feedback.grade, feedback.kind
        # served position of each item, from the request's compact item text (0: not served)
        buffer, starts, ends = feedback.text, feedback.item_start, feedback.item_end
        position = compiled.positions(self._texts.data, self._text_first, self._text_last, self.base, slots, buffer,
                                      starts, ends)
        if self._listed:  # items kept as a list: no compact text
            for k in np.flatnonzero(np.isin(slots, list(self._listed))).tolist():
                listed: list[str] = self._rankings[int(index[k])].items  # type: ignore[union-attr, assignment]
                item = feedback.item(k)
                position[k] = listed.index(item) + 1 if item in listed else 0
        if self.behaviour:
            self._behave(index, kind, ts, feedback.dwell, position > 0)
        field = position
        not_served = np.flatnonzero(position == 0)
        if not_served.shape[0]:
            field[not_served] = -1 - self._unshown_codes(slots[not_served], buffer, starts[not_served],
                                                         ends[not_served])
        applied = np.zeros(len(feedback), dtype=np.bool_)
        # integer keys (slot, field, kind) with the grade's bits, in the compiled table
        simple = _simple(field, kind)
        take = np.flatnonzero(simple) if not simple.all() else np.arange(len(feedback))
        if take.shape[0]:
            keys = _keys(slots[take], field[take], kind[take])
            self._reserve_keys(take.shape[0])
            new, added = compiled.first_times(self._dup_table, keys, _grade_bits(grade[take]))
            self._dup_entries += added
            applied[take] = new
        # tuple keys for the rest
        for k in np.flatnonzero(~simple).tolist():
            slot = int(slots[k])
            key = (slot, int(field[k]), int(kind[k]))
            if _first_time(self._seen, key, float(grade[k])):
                applied[k] = True
                self._odd_keys.setdefault(slot, []).append(key)
        duplicates = len(feedback) - int(applied.sum())
        counts["feedback", "ok"] += len(feedback) - duplicates
        if duplicates:
            counts["feedback", "duplicate"] += duplicates
        self._applied[index[applied]] = True
        # a served item judged 0 counts too: it changes Judged@k and the RBP residual (unserved, it changes nothing)
        judged = applied & ((grade > 0.0) | (field > 0))
        self._graded[index[judged]] = True
        if self.changed is not None:
            self.changed.update(slots[judged].tolist())
        if self.delays is not None:
            self.delays += (ts - served)[applied].tolist()
        store = np.flatnonzero(applied)
        if store.shape[0]:
            row = (slots[store], field[store], kind[store], grade[store])
            block = row[0] // BLOCK
            if block[0] == block[-1] and (block == block[0]).all():
                self._rows.setdefault(int(block[0]), []).append(row)
                return
            order = np.argsort(block, kind="stable")
            cuts = np.flatnonzero(np.diff(block[order])) + 1
            for part in np.split(order, cuts):
                self._rows.setdefault(int(block[part[0]]), []).append(tuple(c[part] for c in row))  # type: ignore[arg-type]

    def _behave(self, index: Ints, kind: Ints, ts: Floats, dwell: Floats, served: Bools) -> None:
        """What the behaviour measures keep of feedback that counts (neither late nor an orphan; duplicates too, as
        what they keep, a minimum time and a flag, is the same however often an event comes): the time of each
        request's first click on a served item and whether a served item got a click with dwell >= ``sat_dwell`` or
        feedback of a kind in ``sat_kinds``. A request whose value moves is changed for the live windows."""
        click = served & (kind == self._click)
        satisfying = click & (dwell >= self._sat_dwell)
        if self._sat_kinds.shape[0]:
            satisfying |= served & np.isin(kind, self._sat_kinds)
        changed = index[compiled.behave(self._first_click, self._satisfied, index, click, satisfying, ts)]
        if changed.shape[0]:
            self._graded[changed] = True
            if self.changed is not None:
                self.changed.update((changed + self.base).tolist())

    # -- event time -----------------------------------------------------------------------------------
    def advance(self, watermark: float) -> Finalised:
        """Move event time to ``watermark`` (never back) and return the requests it finalises, in order."""
        if watermark > self.watermark:
            self.watermark = watermark
        watermark = self.watermark
        early, self._early = self._early, []
        slots, deadlines = self._due.pop_slots(watermark)
        if slots.shape[0]:
            order = np.lexsort((slots, deadlines))
            slots = slots[order]
            slots = slots[~self._final[slots - self.base]]  # not finalised early
        if early:
            slots = np.concatenate((np.array(early, dtype=np.int64), slots))
        finalised = self._finalise(slots)
        self._expire_pending(watermark)
        self._trim()
        self._cut_texts()
        return finalised

    def _finalise(self, slots: Ints) -> Finalised:
        if not slots.shape[0]:
            return _empty_finalised()
        index = slots - self.base
        self._final[index] = True
        if self._late:  # late rankings' requests: finalised (remembered, their rows let go), not handed over
            late = np.fromiter(map(self._late.__contains__, slots.tolist()), dtype=np.bool_, count=slots.shape[0])
            if late.any():
                self._late.difference_update(slots[late].tolist())
                self._view(slots[late], take=True)
                self._release(slots[late], index[late])
                slots, index = slots[~late], index[~late]
                if not slots.shape[0]:
                    return _empty_finalised()
        finalised = self._view(slots, take=True)
        self._release(slots, index)
        return finalised

    def _release(self, slots: Ints, index: Ints) -> None:
        """What finalised requests no longer need: their duplicate keys, rankings, listings, live changes."""
        slot_list = slots.tolist()
        if self._odd_keys:
            for slot in self._odd_keys.keys() & set(slot_list):
                for key in self._odd_keys.pop(slot):
                    self._seen.pop(key, None)  # once per grade seen
        rankings_of = self._rankings
        for i in index.tolist():
            rankings_of[i] = None
        if self._listed:
            self._listed.difference_update(slot_list)
        if self.changed:
            self.changed.difference_update(slot_list)

    def current(self, slots: Ints) -> Finalised:
        """Open requests as they stand now (their rows stay): the live windows' view."""
        return self._view(slots, take=False) if slots.shape[0] else _empty_finalised()

    def _view(self, slots: Ints, take: bool) -> Finalised:
        """The requests of ``slots`` with the best grade of each judged item, from their rows; ``take``: the
        rows leave their blocks and their duplicate keys are forgotten."""
        index = slots - self.base
        blocks = np.unique(slots // BLOCK)
        # the request of each slot of the blocks read (-1: not asked for), from the first block's first slot
        low = int(blocks[0]) * BLOCK
        request_of = np.full((int(blocks[-1]) + 1) * BLOCK - low, -1, dtype=np.int64)
        request_of[slots - low] = np.arange(slots.shape[0], dtype=np.int64)
        parts: list[tuple[Ints, Ints, Ints, Floats]] = []
        click_req = click_pos = np.empty(0, dtype=np.int64)
        for block in blocks.tolist():
            stored = self._rows.get(block)
            if stored is None:
                continue
            columns = [np.concatenate(c) for c in zip(*stored, strict=True)] if len(stored) > 1 else list(stored[0])
            mine = request_of[columns[0] - low] >= 0
            if mine.all():
                parts.append(tuple(columns))  # type: ignore[arg-type]  # the four columns
                if take:
                    del self._rows[block]
                continue
            parts.append(tuple(c[mine] for c in columns))
            if take:
                self._rows[block] = [tuple(c[~mine] for c in columns)]
            elif len(stored) > 1:
                self._rows[block] = [tuple(columns)]  # type: ignore[list-item]  # kept concatenated
        if parts:
            row_slot, row_field, row_kind, row_grade = (np.concatenate(c) for c in zip(*parts, strict=True))
            if take:
                simple = _simple(row_field, row_kind)
                compiled.forget_keys(self._dup_table, _keys(row_slot[simple], row_field[simple], row_kind[simple]),
                                     _grade_bits(row_grade[simple]))
            # the best grade of each (request, item)
            req = request_of[row_slot - low]
            order = pair_order(req, row_field, stable=False)  # any order within a (request, item): the best is kept
            req, row_field, row_grade = req[order], row_field[order], row_grade[order]
            starts = np.ones(req.shape[0], dtype=np.bool_)
            starts[1:] = (np.diff(req) != 0) | (np.diff(row_field) != 0)
            first = np.flatnonzero(starts)
            best = np.maximum.reduceat(row_grade, first) if first.shape[0] else row_grade
            if self.behaviour and first.shape[0]:  # the clicked served items, each once, in the same order
                clicked = np.logical_or.reduceat(row_kind[order] == self._click, first) & (row_field[first] > 0)
                click_req, click_pos = req[first][clicked], row_field[first][clicked]
            req, row_field = req[first], row_field[first]
            # served items keep grade 0 (judged non-relevant: Judged@k, the RBP residual); unserved ones need not
            shown, unshown = row_field > 0, (best > 0.0) & (row_field < 0)
            shown_req, shown_pos, shown_grade = req[shown], row_field[shown], best[shown]
            unshown_req, unshown_grade = req[unshown], best[unshown]
        else:
            shown_req = shown_pos = unshown_req = np.empty(0, dtype=np.int64)
            shown_grade = unshown_grade = np.empty(0)
        rankings: list[CompactRanking] = [self._rankings[i] for i in index.tolist()]  # open slots: set
        return Finalised(rankings, self._serve[index], shown_req, shown_pos, shown_grade, unshown_req, unshown_grade,
                         slots, self._row[index].copy(), self._graded[index], click_req, click_pos,
                         self._first_click[index] if self.behaviour else np.full(index.shape[0], math.inf),
                         self._satisfied[index] if self.behaviour else np.zeros(index.shape[0], dtype=np.bool_))

    # -- what other parts read ------------------------------------------------------------------------
    def open_slots(self) -> Ints:
        """The slots of the requests not finalised yet, in opening order (with those finalised early because a
        new ranking took their id, until the next :meth:`advance` hands them over)."""
        slots = np.flatnonzero(~self._final[: self.size]) + self.base
        return np.union1d(slots, self._early) if self._early else slots

    def set_rows(self, slots: Ints, rows: Ints) -> None:
        """The live windows' row of each slot (see :data:`~stream_eval.events.join.NO_ROW`)."""
        self._row[slots - self.base] = rows

    def status(self, rids: list[str]) -> tuple[Bools, Bools, Bools]:
        """For each request id: whether its request is open or finalised and still remembered; whether
        feedback was applied to it or it is remembered; whether feedback waits for it."""
        held, fed = self._held_fed(self._find_ids(rids))
        pending = self.pending
        waiting = np.fromiter(map(pending.__contains__, rids), dtype=np.bool_, count=len(rids))
        return held, fed, waiting

    def held_at(self, keys: Bytes, starts: Ints, ends: Ints) -> Bools:
        """:meth:`status`'s first answer for the request ids at ``keys[starts:ends]`` (UTF-8)."""
        return self._held_fed(self._find(keys, starts, ends))[0]

    def fed_at(self, keys: Bytes, starts: Ints, ends: Ints) -> Bools:
        """:meth:`status`'s second answer for the request ids at ``keys[starts:ends]`` (UTF-8)."""
        return self._held_fed(self._find(keys, starts, ends))[1]

    def _held_fed(self, found: Ints) -> tuple[Bools, Bools]:
        index = np.where(found >= 0, found - self.base, 0)
        known = found >= 0
        remembered = known & self._final[index] & (self._serve[index] + self.horizon + self.horizon > self.watermark)
        held = known & (~self._final[index] | remembered)
        fed = known & ((~self._final[index] & self._applied[index]) | remembered)
        return held, fed

    def _expire_pending(self, watermark: float) -> None:
        expiry = self._pending_expiry
        while expiry and expiry[0][0] <= watermark:
            _, _, rid = heapq.heappop(expiry)
            waiting = self.pending.get(rid)
            if waiting is None:
                continue
            keep = [f for f in waiting if f.ts + self.horizon > watermark]  # type: ignore[operator]  # ts is float
            self.counts["feedback", "orphan"] += len(waiting) - len(keep)
            self.waiting -= len(waiting) - len(keep)
            if keep:
                self.pending[rid] = keep
            else:
                del self.pending[rid]

    def _trim(self, full: bool = False) -> None:
        """Drop the slots at the front that are finalised and forgotten, ``TRIM`` at a time, once the arrays
        have doubled since the last time (the copy and the rebuilt id table cost once per slot), or when they
        are ``full``: they grow only when no slot can be dropped, so their size follows the requests held, not
        how the points of trimming happened to fall."""
        if self.size < self._trim_at and not full:
            return
        horizon = self.horizon
        dropped = 0
        # slots finalised early wait for the next advance to hand them out: nothing from the first of them is dropped
        limit = min(self._early) - self.base if self._early else self.size
        while dropped + TRIM <= limit:
            block = slice(dropped, dropped + TRIM)
            if not (self._final[block].all() and (self._serve[block] + horizon + horizon <= self.watermark).all()):
                break
            dropped += TRIM
        self._trim_at = max(2 * TRIM, 2 * (self.size - dropped)) if dropped else self.size + TRIM
        if not dropped:
            return
        for arena, first, last in ((self._ids, self._id_first, self._id_last),
                                   (self._texts, self._text_first, self._text_last)):
            offset = max(int(first[dropped]) if dropped < self.size else arena.used, 0)  # texts may be cut already
            arena.cut(offset)
            first -= offset
            last -= offset
        for name in self._columns:
            column = getattr(self, name)
            column[: self.size - dropped] = column[dropped : self.size].copy()
        del self._rankings[:dropped]
        self.base += dropped
        self.size -= dropped
        self._id_table = compiled.empty_table(2 * self.size)  # the ids of the slots left, again
        self._id_entries = 0
        self._put_ids(np.arange(self.base, self.base + self.size, dtype=np.int64))

    def _cut_texts(self) -> None:
        """Drop the item texts of the finalised slots before the first open one (only open requests read
        theirs), once they take at least half as many bytes as the texts kept (so the buffer holds at most ~1.5x
        the live texts; each cut moves the live ones, a cost paid rarely: docs/benchmarks.md)."""
        index = max(self._first_open - self.base, 0)
        while index < self.size:
            finalised = self._final[index : min(index + TRIM, self.size)]
            if not finalised.all():
                index += int(np.argmin(finalised))
                break
            index += finalised.shape[0]
        self._first_open = self.base + index
        texts = self._texts
        offset = int(self._text_first[index]) if index < self.size else texts.used
        if 2 * offset < max(texts.used - offset, 2 * TEXT_CUT):
            return
        texts.cut(offset)
        self._text_first[: self.size] -= offset
        self._text_last[: self.size] -= offset

    def flush(self) -> Finalised:
        """End of input: finalise every open request and count every waiting feedback as an orphan."""
        open_index = np.flatnonzero(~self._final[: self.size])
        open_index = open_index[np.argsort(self._serve[open_index] + self.horizon, kind="stable")]
        slots = np.concatenate((np.array(self._early, dtype=np.int64), open_index + self.base))
        self._early = []
        finalised = self._finalise(slots)
        self.counts["feedback", "orphan"] += sum(len(w) for w in self.pending.values())
        self._start(self.base + self.size)
        if self.changed is not None:
            self.changed.clear()
        return finalised


def _keep_lightly(rankings: list[CompactRanking]) -> None:
    """What an open request keeps of its ranking: its item text lives in the join's bytes (a compact
    ranking's ``items`` becomes empty), and its experiment, arm and query names are shared."""
    labels = LABELS
    for ranking in rankings:
        if type(ranking.items) is str:
            ranking.items = ""
        experiment, arm, query = ranking.experiment, ranking.arm, ranking.query_id
        ranking.experiment = labels.get(experiment) or label(experiment)
        ranking.arm = labels.get(arm) or label(arm)
        if query is not None:
            ranking.query_id = labels.get(query) or label(query)


def _simple(field: Ints, kind: Ints) -> Bools:
    """Rows whose duplicate key fits in an integer (see ``_SLOT_MASK``)."""
    return (field < _FIELD_LIMIT) & (field >= -_FIELD_LIMIT) & (kind < _KIND_LIMIT)


def _keys(slots: Ints, field: Ints, kind: Ints) -> Ints:
    packed = np.where(field > 0, field, _FIELD_LIMIT - 1 - field)
    return ((slots & _SLOT_MASK) << 27) | (packed << 4) | kind


def _grade_bits(grade: Floats) -> Ints:
    """Grades as int64 bits for the duplicate table, with -0.0 as 0.0 (equal grades, equal bits)."""
    return (grade + 0.0).view(np.int64)


def _first_time(seen: dict[tuple[int, int, int], SeenGrades], key: tuple[int, int, int], grade: float) -> bool:
    """Record ``grade`` for ``key``; ``False`` if it was seen already (a duplicate)."""
    before = seen.get(key)
    if before is None:
        seen[key] = grade
        return True
    if type(before) is float:
        if before == grade:
            return False
        seen[key] = {before, grade}
        return True
    if grade in before:  # type: ignore[operator]  # a set here
        return False
    before.add(grade)  # type: ignore[union-attr]  # a set here
    return True
