"""The join of rankings and feedback on columns: the rules of :mod:`stream_eval.events.join`, a chunk at a time.

The per-event :class:`~stream_eval.events.join.Join` builds Python objects for every event and request. This
join keeps the open requests as *slots*: numbered in opening order, with their serve times in an array and
their rankings in a list. A chunk of events is joined at once:

* rankings open slots in a short loop (a request id already open or remembered is a duplicate ranking);
* each feedback's slot is found with one C-level ``map(dict.get)``; lateness is one array comparison;
* a feedback's served position is looked up once, on arrival, in the ranking's compact item text;
* duplicates are found with a dict of integer keys ``(slot, position, kind)`` holding the grades seen; only
  keys seen before (a double click) or repeated within the chunk go through a Python loop;
* applied feedback is kept as rows ``(slot, position, kind, grade)`` by block of slots, and a request's best
  grade per item is taken from its rows when it is finalised.

Feedback that arrives before its ranking, for an item that was not served, or in any other rare case goes
through short loops over those rows alone, written with the same rules.

The numbers equal the per-event join's on any stream, any chunking and any schedule of :meth:`advance`
(``tests/test_columns.py`` checks this with hypothesis): the same counts, the same requests finalised by each
``advance`` in the same order, with the same grades.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from itertools import count, repeat
from typing import Union

import numpy as np
import numpy.typing as npt

from stream_eval.config import Config
from stream_eval.events.join import EventCounts
from stream_eval.events.schema import SEP, CompactRanking, Feedback, Ranking

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

#: Slots per block of feedback rows: finalising requests reads and rewrites the rows of their blocks only.
BLOCK = 8192
#: Slots of finalised and forgotten requests are dropped from the front of the arrays this many at a time.
TRIM = 1 << 16
#: Slots the arrays hold at first (they double when full).
FIRST_CAPACITY = 1024
#: Integer duplicate keys: ``(slot mod 2**39) << 24 | position << 4 | kind``; rows outside these bounds
#: (positions from 2**20, more than 16 kinds) and items that were not served use tuple keys instead.
_SLOT_MASK = (1 << 39) - 1
_POSITION_LIMIT = 1 << 20
_KIND_LIMIT = 16
#: Grades already seen for a duplicate key: the first grade, or the set of them once there are several.
SeenGrades = Union[float, set[float]]


class Finalised:
    """Requests finalised together, in order, with their judged items (grade > 0) as columns.

    ``shown_*`` are the served items with a grade (``shown_req`` indexes ``rankings``, ``shown_pos`` is
    1-based); ``unshown_*`` the judged items that were not served. The rows come sorted by request, then
    position (shown) or first feedback (unshown).
    """

    __slots__ = ("rankings", "serve", "applied", "shown_req", "shown_pos", "shown_grade", "unshown_req",
                 "unshown_item", "unshown_grade")

    def __init__(self, rankings: list[CompactRanking], serve: Floats, applied: Bools, shown_req: Ints,
                 shown_pos: Ints, shown_grade: Floats, unshown_req: Ints, unshown_item: list[str],
                 unshown_grade: Floats) -> None:
        self.rankings = rankings
        self.serve = serve
        self.applied = applied  # whether any feedback was applied to the request
        self.shown_req = shown_req
        self.shown_pos = shown_pos
        self.shown_grade = shown_grade
        self.unshown_req = unshown_req
        self.unshown_item = unshown_item
        self.unshown_grade = unshown_grade

    def __len__(self) -> int:
        return len(self.rankings)

    def grades(self) -> list[dict[str, float]]:
        """Each request's best grade per item (grade > 0), as the per-event join keeps it."""
        out: list[dict[str, float]] = [{} for _ in self.rankings]
        items = [_item_list(r.items) if i in set(self.shown_req.tolist()) else []
                 for i, r in enumerate(self.rankings)]
        for req, pos, grade in zip(self.shown_req.tolist(), self.shown_pos.tolist(), self.shown_grade.tolist(),
                                   strict=True):
            out[req][items[req][pos - 1]] = grade
        for req, item, grade in zip(self.unshown_req.tolist(), self.unshown_item, self.unshown_grade.tolist(),
                                    strict=True):
            out[req][item] = grade
        return out


def _item_list(items: str | list[str]) -> list[str]:
    return items[3:-3].split(SEP) if type(items) is str else list(items)


def _empty_finalised() -> Finalised:
    no_ints = np.empty(0, dtype=np.int64)
    return Finalised([], np.empty(0), np.empty(0, dtype=np.bool_), no_ints, no_ints, np.empty(0), no_ints, [],
                     np.empty(0))


class _DueSlots:
    """Open slots by the whole second of their deadline: arrays per second, with a heap of the seconds."""

    __slots__ = ("_by_second", "_seconds")

    def __init__(self) -> None:
        self._by_second: dict[int, list[tuple[Ints, Floats]]] = {}
        self._seconds: list[int] = []

    def add(self, slots: Ints, deadlines: Floats) -> None:
        seconds = np.floor(deadlines).astype(np.int64)
        order = np.argsort(seconds, kind="stable")
        cuts = np.flatnonzero(np.diff(seconds[order])) + 1
        for part in np.split(order, cuts):
            if not part.shape[0]:
                continue
            second = int(seconds[part[0]])
            entry = (slots[part], deadlines[part])
            entries = self._by_second.get(second)
            if entries is None:
                self._by_second[second] = [entry]
                heapq.heappush(self._seconds, second)
            else:
                entries.append(entry)

    def pop(self, watermark: float) -> tuple[Ints, Floats]:
        """Remove and return the slots whose deadline is at most ``watermark``, with their deadlines."""
        seconds, by_second = self._seconds, self._by_second
        slots: list[Ints] = []
        deadlines: list[Floats] = []
        while seconds and seconds[0] <= watermark:
            second = seconds[0]
            entries = by_second[second]
            if second + 1 > watermark:  # the watermark is inside this second: some may stay
                kept = []
                for part, due in entries:
                    ready = due <= watermark
                    slots.append(part[ready])
                    deadlines.append(due[ready])
                    if not ready.all():
                        kept.append((part[~ready], due[~ready]))
                if kept:
                    by_second[second] = kept
                    break
            else:
                slots += [part for part, _ in entries]
                deadlines += [due for _, due in entries]
            heapq.heappop(seconds)
            del by_second[second]
        if not slots:
            return np.empty(0, dtype=np.int64), np.empty(0)
        return np.concatenate(slots), np.concatenate(deadlines)

    def clear(self) -> None:
        self._by_second.clear()
        self._seconds.clear()


class ColumnJoin:
    """Rankings and feedback joined by ``request_id`` on event time, a chunk of events at a time.

    Call :meth:`add` with a chunk of rankings and feedback and the watermark before each event, then
    :meth:`advance`; :meth:`flush` at the end of input.
    """

    def __init__(self, config: Config, counts: EventCounts) -> None:
        self.window = config.attribution_window
        self.horizon = config.attribution_window + config.allowed_lateness
        self.counts = counts
        self.watermark = -math.inf
        self.slot_of: dict[str, int] = {}  # request id -> its latest slot (open, or finalised and not yet dropped)
        self.base = 0  # the slot at index 0 of the arrays
        self.size = 0  # slots in the arrays
        self._serve = np.empty(FIRST_CAPACITY)
        self._final = np.zeros(FIRST_CAPACITY, dtype=np.bool_)
        self._applied = np.zeros(FIRST_CAPACITY, dtype=np.bool_)
        self._rids: list[str] = []
        self._rankings: list[CompactRanking | None] = []
        self._items: list[str | None] = []  # the ranking's compact item text ("" when kept as a list)
        self._listed: set[int] = set()  # open slots whose items are kept as a list (an item has a quote)
        self._due = _DueSlots()
        self._early: list[int] = []  # finalised when a new ranking took their id: emitted by the next advance
        self.pending: dict[str, list[Feedback]] = {}
        self._pending_expiry: list[tuple[float, int, str]] = []
        self._seq = count()
        self._rows: dict[int, list[tuple[Ints, Ints, Ints, Floats]]] = {}  # block -> (slot, pos, kind, grade)
        self._seen: dict[int | tuple[int, str, str], SeenGrades] = {}
        self._odd_keys: dict[int, list[tuple[int, str, str]]] = {}  # slot -> its tuple keys
        self._unshown: dict[int, dict[str, float]] = {}  # slot -> best grade of each item that was not served
        self._kinds: dict[str, int] = {}
        self.delays: list[float] | None = None  # feedback ts - serve ts of applied feedback, when recorded

    # -- slots ----------------------------------------------------------------------------------------
    def _grow(self, size: int) -> None:
        capacity = self._serve.shape[0]
        if size <= capacity:
            return
        while capacity < size:
            capacity *= 2
        for name in ("_serve", "_final", "_applied"):
            old = getattr(self, name)
            new = np.zeros(capacity, dtype=old.dtype)
            new[: self.size] = old[: self.size]
            setattr(self, name, new)

    def _kind_codes(self, kinds: list[str]) -> Ints:
        table = self._kinds
        codes = np.fromiter(map(table.get, kinds, repeat(-1)), dtype=np.int64, count=len(kinds))
        if (codes < 0).any():
            codes = np.array([table.setdefault(kind, len(table)) for kind in kinds], dtype=np.int64)
        return codes

    # -- events ---------------------------------------------------------------------------------------
    def add(self, events: Sequence[Ranking | CompactRanking | Feedback], before: Floats | None = None) -> None:
        """Join a chunk of rankings and feedback, in arrival order.

        ``before[i]`` is the watermark when event ``i`` arrives (event time moved by the events before it);
        ``None``: :attr:`watermark` for every event. The caller then moves :attr:`watermark` (``advance``).
        """
        if not events:
            return
        n_events = len(events)
        marks: list[float] = [self.watermark] * n_events if before is None else before.tolist()
        is_feedback = np.fromiter((type(e) is Feedback for e in events), dtype=np.bool_, count=n_events)
        horizon = self.horizon
        counts = self.counts
        slot_of = self.slot_of
        # 1. Rankings open slots, in order.
        first_new = self.base + self.size
        new_at: list[int] = []  # chunk position of each new slot's ranking
        new_ts: list[float] = []
        new_rankings: list[CompactRanking] = []
        replaced: dict[int, int] = {}  # new slot -> the slot its id had
        early_here: list[int] = []  # open slots whose id a new ranking took, in that order
        # rows applied at another place than their arrival: slot, feedback, applied at, order there, watermark,
        # and whether they waited for their ranking (then the orphan rule applies)
        waiting_rows: list[tuple[int, Feedback, int, int, float, bool]] = []
        ranking_ok = ranking_duplicate = 0
        serve = self._serve
        for p in np.flatnonzero(~is_feedback).tolist():
            ranking = events[p]
            rid = ranking.request_id
            mark = marks[p]
            slot = slot_of.get(rid)
            if slot is not None:
                served = new_ts[slot - first_new] if slot >= first_new else float(serve[slot - self.base])
                if served + horizon + horizon > mark:  # open, or finalised and still remembered
                    ranking_duplicate += 1
                    continue
                if slot >= first_new or not self._final[slot - self.base]:
                    early_here.append(slot)  # open but forgotten: finalised now, before the new request opens
            ranking_ok += 1
            if type(ranking) is not CompactRanking:
                ranking = CompactRanking.of(ranking)  # type: ignore[arg-type]  # a Ranking
            new_slot = first_new + len(new_at)
            slot_of[rid] = new_slot
            if slot is not None:
                replaced[new_slot] = slot
            new_at.append(p)
            new_ts.append(ranking.ts)
            new_rankings.append(ranking)
            waiting = self.pending.pop(rid, None)
            if waiting is not None:
                waiting_rows += [(new_slot, f, p, k - len(waiting), mark, True) for k, f in enumerate(waiting)]
        if ranking_ok:
            counts["ranking", "ok"] += ranking_ok
        if ranking_duplicate:
            counts["ranking", "duplicate"] += ranking_duplicate
        n_new = len(new_at)
        if n_new:
            self._grow(self.size + n_new)
            span = slice(self.size, self.size + n_new)
            self._serve[span] = new_ts
            self._final[span] = False
            self._applied[span] = False
            self._rids += [r.request_id for r in new_rankings]
            self._rankings += new_rankings
            self._items += [r.items if type(r.items) is str else "" for r in new_rankings]
            if "" in self._items[self.size:]:
                self._listed.update(first_new + k for k, r in enumerate(new_rankings) if type(r.items) is list)
            self.size += n_new
            slots = np.arange(first_new, first_new + n_new, dtype=np.int64)
            self._due.add(slots, self._serve[span] + self.horizon)
        for slot in early_here:
            self._final[slot - self.base] = True
        self._early += early_here
        # 2. Feedback finds its slot.
        at = np.flatnonzero(is_feedback)
        feedback: list[Feedback] = [events[j] for j in at.tolist()]  # type: ignore[misc]  # feedback here
        rows_slot = np.empty(0, dtype=np.int64)
        rows_at = rows_seq = at[:0]
        rows_mark = np.empty(0)
        rows_feedback: list[Feedback] = []
        if feedback:
            found = np.fromiter(map(slot_of.get, [f.request_id for f in feedback], repeat(-1)), dtype=np.int64,
                                count=len(feedback))
            fb_mark = np.array(marks)[at] if before is not None else np.full(at.shape[0], self.watermark)
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
            odd = np.flatnonzero(~regular & ~remembered).tolist()
            take = np.flatnonzero(regular)
            rows_slot = slot_index[take] + self.base
            rows_at = rows_seq = at[take]
            rows_mark = fb_mark[take]
            rows_feedback = [feedback[k] for k in take.tolist()] if take.shape[0] != len(feedback) else feedback
            if odd:
                waiting_rows += self._odd_feedback(
                    [(feedback[k], int(at[k]), float(fb_mark[k])) for k in odd], first_new, new_at, replaced,
                    early_here, marks)
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
            every = [*rows_feedback, *w_feedback]
            rows_feedback = [every[k] for k in order.tolist()]
        else:
            waiting_flag = np.zeros(rows_slot.shape[0], dtype=np.bool_)
        if rows_feedback:
            self._apply(rows_slot, rows_feedback, rows_mark, waiting_flag)

    def _odd_feedback(
        self,
        odd: list[tuple[Feedback, int, float]],
        first_new: int,
        new_at: list[int],
        replaced: dict[int, int],
        early_here: list[int],
        marks: list[float],
    ) -> list[tuple[int, Feedback, int, int, float, bool]]:
        """Feedback that did not find an open request when it arrived: before its ranking, for a forgotten
        request, or while its id was still another request's. Returns the rows to apply; the rest waits."""
        horizon = self.horizon
        opens: dict[str, list[tuple[int, int]]] = {}  # id -> (chunk position, slot) of the rankings opened
        for k, p in enumerate(new_at):
            rankings = self._rankings[first_new - self.base + k]
            opens.setdefault(rankings.request_id, []).append((p, first_new + k))  # type: ignore[union-attr]
        rows: list[tuple[int, Feedback, int, int, float, bool]] = []
        for event, j, mark in odd:
            rid = event.request_id
            slot = self.slot_of.get(rid)
            # the slot its id had when it arrived
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
                rows.append((s, event, p, j, marks[p], True))
                continue
            self.pending.setdefault(rid, []).append(event)
            heapq.heappush(self._pending_expiry, (event.ts + self.horizon, next(self._seq), rid))  # type: ignore[operator]  # ts is float
        return rows

    def _apply(self, slots: Ints, feedback: list[Feedback], marks: Floats, waiting: Bools) -> None:
        """Apply feedback rows in order: orphans (waiting rows past their time), late, duplicates, the rest."""
        counts = self.counts
        ts = np.array([f.ts for f in feedback], dtype=np.float64)
        index = slots - self.base
        served = self._serve[index]
        orphan = waiting & (ts + self.horizon <= marks)
        late = ~orphan & ((ts - served > self.window) | (served + self.horizon <= marks))
        if orphan.any():
            counts["feedback", "orphan"] += int(orphan.sum())
        if late.any():
            counts["feedback", "late"] += int(late.sum())
        keep = np.flatnonzero(~(orphan | late))
        if not keep.shape[0]:
            return
        if keep.shape[0] != len(feedback):
            feedback = [feedback[k] for k in keep.tolist()]
            slots, index, ts, served = slots[keep], index[keep], ts[keep], served[keep]
        grade = np.array([f.grade for f in feedback], dtype=np.float64)
        kind = self._kind_codes([f.kind for f in feedback])
        # served position of each item: one search of the request's item text (0: not served)
        texts = self._items
        items = [f.item for f in feedback]
        position = np.array([t.count(SEP, 0, a) + 1 if (a := (t := texts[r]).find(SEP + item + SEP)) >= 0 else 0  # type: ignore[union-attr]  # open slots
                             for r, item in zip(index.tolist(), items, strict=True)], dtype=np.int64)
        if '"' in "".join(items) or self._listed:  # no item of a compact item text has a quote
            for k, item in enumerate(items):
                slot = int(slots[k])
                if slot in self._listed:
                    listed: list[str] = self._rankings[slot - self.base].items  # type: ignore[union-attr, assignment]
                    position[k] = listed.index(item) + 1 if item in listed else 0
                elif '"' in item:
                    position[k] = 0
        simple = (position > 0) & (position < _POSITION_LIMIT) & (kind < _KIND_LIMIT)
        applied = np.zeros(len(feedback), dtype=np.bool_)
        seen = self._seen
        # integer keys: suspects are keys seen before or repeated here; the rest are new at once
        take = np.flatnonzero(simple)
        if take.shape[0]:
            keys = ((slots[take] & _SLOT_MASK) << 24) | (position[take] << 4) | kind[take]
            key_list = keys.tolist()
            suspect = np.fromiter(map(seen.__contains__, key_list), dtype=np.bool_, count=len(key_list))
            order = np.argsort(keys, kind="stable")
            repeated = np.flatnonzero(keys[order[1:]] == keys[order[:-1]])
            suspect[order[repeated]] = True  # a key repeated within these rows
            suspect[order[repeated + 1]] = True
            clean = ~suspect
            grade_list = grade[take].tolist()
            if clean.all():
                seen.update(zip(key_list, grade_list, strict=True))
                applied[take] = True
            else:
                clean_at = np.flatnonzero(clean)
                seen.update(zip(keys[clean_at].tolist(), grade[take][clean_at].tolist(), strict=True))
                applied[take[clean_at]] = True
                for k in np.flatnonzero(suspect).tolist():
                    applied[take[k]] = _first_time(seen, key_list[k], grade_list[k])
        # tuple keys: items not served, and keys out of the integer bounds
        for k in np.flatnonzero(~simple).tolist():
            slot = int(slots[k])
            key = (slot, items[k], feedback[k].kind)
            if _first_time(seen, key, float(grade[k])):
                applied[k] = True
                self._odd_keys.setdefault(slot, []).append(key)
                if position[k] == 0:
                    best = self._unshown.setdefault(slot, {})
                    if grade[k] > best.get(items[k], 0.0):
                        best[items[k]] = float(grade[k])
        duplicates = len(feedback) - int(applied.sum())
        counts["feedback", "ok"] += len(feedback) - duplicates
        if duplicates:
            counts["feedback", "duplicate"] += duplicates
        self._applied[index[applied]] = True
        if self.delays is not None:
            self.delays += (ts - served)[applied].tolist()
        store = np.flatnonzero(applied & (position > 0))
        if store.shape[0]:
            row = (slots[store], position[store], kind[store], grade[store])
            block = row[0] // BLOCK
            if block[0] == block[-1] and (block == block[0]).all():
                self._rows.setdefault(int(block[0]), []).append(row)
                return
            order = np.argsort(block, kind="stable")
            cuts = np.flatnonzero(np.diff(block[order])) + 1
            for part in np.split(order, cuts):
                self._rows.setdefault(int(block[part[0]]), []).append(tuple(c[part] for c in row))  # type: ignore[arg-type]

    # -- event time -----------------------------------------------------------------------------------
    def advance(self, watermark: float) -> Finalised:
        """Move event time to ``watermark`` (never back) and return the requests it finalises, in order."""
        if watermark > self.watermark:
            self.watermark = watermark
        watermark = self.watermark
        early, self._early = self._early, []
        slots, deadlines = self._due.pop(watermark)
        if slots.shape[0]:
            order = np.lexsort((slots, deadlines))
            slots = slots[order]
            slots = slots[~self._final[slots - self.base]]  # not finalised early
        if early:
            slots = np.concatenate((np.array(early, dtype=np.int64), slots))
        finalised = self._finalise(slots)
        self._expire_pending(watermark)
        self._trim()
        return finalised

    def _finalise(self, slots: Ints) -> Finalised:
        if not slots.shape[0]:
            return _empty_finalised()
        base = self.base
        index = slots - base
        self._final[index] = True
        n = slots.shape[0]
        request_of = np.full(self.size, -1, dtype=np.int64)
        request_of[index] = np.arange(n, dtype=np.int64)
        # the rows of these slots, taken out of their blocks
        parts: list[tuple[Ints, Ints, Ints, Floats]] = []
        for block in np.unique(slots // BLOCK).tolist():
            stored = self._rows.pop(block, None)
            if stored is None:
                continue
            columns = [np.concatenate(c) for c in zip(*stored, strict=True)] if len(stored) > 1 else list(stored[0])
            mine = request_of[columns[0] - base] >= 0
            if mine.all():
                parts.append(tuple(columns))  # type: ignore[arg-type]
                continue
            parts.append(tuple(c[mine] for c in columns))  # type: ignore[arg-type]
            self._rows[block] = [tuple(c[~mine] for c in columns)]  # type: ignore[list-item]
        seen = self._seen
        if parts:
            row_slot, row_pos, row_kind, row_grade = (np.concatenate(c) for c in zip(*parts, strict=True))
            simple = (row_pos < _POSITION_LIMIT) & (row_kind < _KIND_LIMIT)
            keys = ((row_slot[simple] & _SLOT_MASK) << 24) | (row_pos[simple] << 4) | row_kind[simple]
            deque(map(seen.pop, keys.tolist(), repeat(None)), maxlen=0)  # a key's rows may be several
            req = request_of[row_slot - base]
            order = np.lexsort((row_pos, req))
            req, row_pos, row_grade = req[order], row_pos[order], row_grade[order]
            starts = np.ones(req.shape[0], dtype=np.bool_)
            starts[1:] = (np.diff(req) != 0) | (np.diff(row_pos) != 0)
            first = np.flatnonzero(starts)
            best = np.maximum.reduceat(row_grade, first)
            graded = best > 0.0
            shown_req, shown_pos, shown_grade = req[first][graded], row_pos[first][graded], best[graded]
        else:
            shown_req = shown_pos = np.empty(0, dtype=np.int64)
            shown_grade = np.empty(0)
        unshown_req: list[int] = []
        unshown_item: list[str] = []
        unshown_grade: list[float] = []
        slot_list = slots.tolist()
        if self._odd_keys:
            for slot in self._odd_keys.keys() & set(slot_list):
                for key in self._odd_keys.pop(slot):
                    seen.pop(key, None)  # once per grade seen
            for k, slot in enumerate(slot_list):
                best_of = self._unshown.pop(slot, None)
                if best_of is not None:
                    for item, grade in best_of.items():
                        if grade > 0.0:
                            unshown_req.append(k)
                            unshown_item.append(item)
                            unshown_grade.append(grade)
        rankings_of, items_of = self._rankings, self._items
        index_list = index.tolist()
        rankings: list[CompactRanking] = [rankings_of[i] for i in index_list]  # type: ignore[misc]  # open slots
        for i in index_list:
            rankings_of[i] = None
            items_of[i] = None
        if self._listed:
            self._listed.difference_update(slot_list)
        return Finalised(rankings, self._serve[index], self._applied[index], shown_req, shown_pos, shown_grade,
                         np.array(unshown_req, dtype=np.int64), unshown_item, np.array(unshown_grade))

    def _expire_pending(self, watermark: float) -> None:
        expiry = self._pending_expiry
        while expiry and expiry[0][0] <= watermark:
            _, _, rid = heapq.heappop(expiry)
            waiting = self.pending.get(rid)
            if waiting is None:
                continue
            keep = [f for f in waiting if f.ts + self.horizon > watermark]  # type: ignore[operator]  # ts is float
            self.counts["feedback", "orphan"] += len(waiting) - len(keep)
            if keep:
                self.pending[rid] = keep
            else:
                del self.pending[rid]

    def _trim(self) -> None:
        """Drop the slots at the front that are finalised and forgotten, ``TRIM`` at a time."""
        horizon = self.horizon
        dropped = 0
        while self.size - dropped >= 2 * TRIM:
            window = slice(dropped, dropped + TRIM)
            if not (self._final[window].all() and (self._serve[window] + horizon + horizon <= self.watermark).all()):
                break
            dropped += TRIM
        if not dropped:
            return
        slot_of = self.slot_of
        for k, rid in enumerate(self._rids[:dropped]):
            if slot_of.get(rid) == self.base + k:
                del slot_of[rid]
        for name in ("_serve", "_final", "_applied"):
            column = getattr(self, name)
            column[: self.size - dropped] = column[dropped : self.size].copy()
        del self._rids[:dropped], self._rankings[:dropped], self._items[:dropped]
        self.base += dropped
        self.size -= dropped

    def flush(self) -> Finalised:
        """End of input: finalise every open request and count every waiting feedback as an orphan."""
        open_index = np.flatnonzero(~self._final[: self.size])
        open_index = open_index[np.argsort(self._serve[open_index] + self.horizon, kind="stable")]
        slots = np.concatenate((np.array(self._early, dtype=np.int64), open_index + self.base))
        self._early = []
        finalised = self._finalise(slots)
        self._due.clear()
        self.counts["feedback", "orphan"] += sum(len(w) for w in self.pending.values())
        self.pending.clear()
        self._pending_expiry.clear()
        self.slot_of.clear()
        self._rows.clear()
        self._seen.clear()
        self._odd_keys.clear()
        self._unshown.clear()
        self.base += self.size
        self.size = 0
        self._rids, self._rankings, self._items = [], [], []
        self._listed.clear()
        return finalised


def _first_time(seen: dict[int | tuple[int, str, str], SeenGrades], key: int | tuple[int, str, str],
                grade: float) -> bool:
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
