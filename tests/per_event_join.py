"""The per-event join that the columnar :class:`stream_eval.events.join.Join` replaced, kept as its oracle.

It applies the rules of docs/contract.md §1 one event at a time, with a Python object per request. The columnar join
must give the same counts and the same finalised requests on any stream, any chunking and any schedule of
``advance`` (``tests/test_join_oracle.py``); this code is simple enough to read against docs/contract.md §1.

Orphans are defined here from docs/contract.md §1, not by the production join's expiry heap: feedback that arrives while
no ranking of its id is open or remembered waits, in arrival order, in one list. It is an *orphan* once event time
has passed the end of its wait — its own time plus the attribution window and the allowed lateness
(:meth:`Join.wait_over`) — without its ranking: counted when a ranking of its id arrives after that, when
:meth:`Join.advance` moves event time past it, or at :meth:`Join.flush`. Waiting feedback whose ranking arrives
in time is applied as if it had come after the ranking, in the order it arrived.
"""

from __future__ import annotations

import heapq
import math
from itertools import count

from support import AbstractTimeConfig as Config

from stream_eval.events.join import DueBySecond, EventCounts
from stream_eval.events.schema import SEP, CompactRanking, Feedback, Ranking, item_list, score_list

#: :attr:`RequestState.row` (unused here: the live windows read the columnar join).
NO_ROW = -1
_SHORT_SEEN = 8


#: Experiment and arm names are shared by most requests: kept once (a bounded table, first come first kept).
_LABELS: dict[str, str] = {}
_MAX_LABELS = 4096
#: Feedback keys of a request are kept in a list up to this many, then in a set.
_SHORT_SEEN = 8


#: Query ids repeat across requests too (head queries most): a larger table, also first come first kept.
_QUERIES: dict[str, str] = {}
_MAX_QUERIES = 65_536


def _label(value: str, table: dict[str, str] = _LABELS, limit: int = _MAX_LABELS) -> str:
    kept = table.get(value)
    if kept is not None:
        return kept
    if len(table) < limit:
        table[value] = value
    return value


class RequestState:
    """A served list and the best grade seen for each of its items so far.

    Compact: the ranking's fields are kept without the decoded event (see :class:`CompactRanking`: the
    items as one str, the scores as their JSON text); :attr:`ranking` rebuilds the event on demand.
    """

    __slots__ = ("request_id", "experiment", "arm", "query_id", "session_id", "items", "n", "scores", "teams",
                 "subtopics", "ts", "grades", "seen", "row", "clicked", "first_click", "satisfied")

    def __init__(self, ranking: Ranking | CompactRanking) -> None:
        if type(ranking) is not CompactRanking:
            ranking = CompactRanking.of(ranking)  # type: ignore[arg-type]  # a Ranking
        self.request_id: str = ranking.request_id
        self.experiment = _label(ranking.experiment)
        self.arm = _label(ranking.arm)
        query = ranking.query_id
        self.query_id: str | None = None if query is None else _label(query, _QUERIES, _MAX_QUERIES)
        self.session_id: str | None = ranking.session_id
        self.items: str | list[str] = ranking.items
        self.n: int = ranking.n
        self.scores: bytes | list[float] | None = ranking.scores
        self.teams: list[str] | None = ranking.teams
        self.subtopics: list[list[str]] | None = ranking.subtopics
        self.ts: float = ranking.ts  # finalised at ts + horizon (not kept: a float object is 24 bytes)
        # Best grade per item; None until the first feedback (an empty dict is 64 bytes; most requests get none).
        self.grades: dict[str, float] | None = None
        # (item, kind, grade) of the feedback seen; a click of grade 1 is kept as its item alone. A list while
        # short (a set costs 216 bytes, a list of four 88), then a set.
        self.seen: list[str | tuple[str, str, float]] | set[str | tuple[str, str, float]] | None = None
        self.row = NO_ROW  # the live windows' row of this request (see engine/windows.py)
        # the behaviour measures': served positions clicked, the first click's time, a satisfied click or kind
        self.clicked: set[int] = set()
        self.first_click = math.inf
        self.satisfied = False

    @property
    def ranking(self) -> Ranking:
        """The served ranking as an event (rebuilt: the state keeps its fields in compact form)."""
        return Ranking(self.request_id, self.item_list(), self.ts, score_list(self.scores), self.query_id,
                       self.session_id, self.experiment, self.arm, self.teams, self.subtopics)

    def item_list(self) -> list[str]:
        """The served items, in order."""
        return item_list(self.items)

    def score_list(self) -> list[float] | None:
        """The model scores of the served items, ``None`` if the ranking had none."""
        return score_list(self.scores)

    def position(self, item: str) -> int:
        """1-based served position of ``item``; 0 if it was not served."""
        items = self.items
        if type(items) is str:
            if '"' in item:
                return 0  # no item of a compact list has a quote
            at = items.find(SEP + item + SEP)
            return 0 if at < 0 else items.count(SEP, 0, at) + 1
        try:
            return items.index(item) + 1
        except ValueError:
            return 0


class Join:
    """Rankings and feedback joined by ``request_id`` on event time, one event at a time."""

    def __init__(self, config: Config, counts: EventCounts) -> None:
        self.attribution_window = config.attribution_window
        self.horizon = config.attribution_window + config.allowed_lateness
        self.sat_dwell, self.sat_kinds = config.sat_dwell, set(config.sat_kinds)
        self.counts = counts
        self.watermark = -math.inf
        self.open: dict[str, RequestState] = {}
        self.waiting: list[Feedback] = []  # feedback waiting for its ranking, in arrival order
        self.closed: dict[str, float] = {}
        # Opened or re-graded since cleared: kept only once live windows read it (they start it, see windows.py).
        self.changed: dict[str, RequestState] | None = None
        self.delays: list[float] | None = None  # feedback ts - serve ts of applied feedback, when recorded
        self._due: DueBySecond[RequestState] = DueBySecond()  # open requests, due at their deadline ts + horizon
        self._closed_expiry: list[tuple[float, int, str]] = []
        self._early: list[RequestState] = []
        self._seq = count()
        self.late: set[int] = set()  # the ids of the requests of late rankings: finalised, never handed over

    # -- events -------------------------------------------------------------------------------------
    def _remembered(self, rid: str) -> bool:
        """Whether a finalised request is still remembered (lazily: as if ``advance`` had just run)."""
        forget_at = self.closed.get(rid)
        return forget_at is not None and forget_at > self.watermark

    def ranking(self, event: Ranking | CompactRanking) -> str:
        """Open a request; ``duplicate`` if its request_id was already seen (and is still remembered); ``late`` if
        event time is past its finalisation point (opened all the same, never handed over)."""
        rid = event.request_id
        previous = self.open.get(rid)
        if previous is not None and previous.ts + self.horizon + self.horizon <= self.watermark:
            # Finalised and forgotten already had advance run: do now what advance would have done.
            del self.open[rid]
            self._early.append(previous)
            previous = None
        if previous is not None or self._remembered(rid):
            self.counts["ranking", "duplicate"] += 1
            return "duplicate"
        # late: event time is past its own finalisation point; it opens its request, which is never handed over
        late = event.ts + self.horizon <= self.watermark  # type: ignore[operator]  # ts is float
        self.counts["ranking", "late" if late else "ok"] += 1
        self.closed.pop(rid, None)
        state = RequestState(event)
        if late:
            self.late.add(id(state))
        self.open[rid] = state
        if self.changed is not None and not late:
            self.changed[rid] = state
        self._due.add(state.ts + self.horizon, state)
        mine = [f for f in self.waiting if f.request_id == rid]
        if mine:
            self.waiting = [f for f in self.waiting if f.request_id != rid]
            for feedback in mine:
                if self.wait_over(feedback, self.watermark):
                    self.counts["feedback", "orphan"] += 1
                else:
                    self._apply(state, feedback)
        return "ok"

    def feedback(self, event: Feedback) -> str:
        """Apply feedback to its request: ``ok``, ``late``, ``duplicate`` or ``pending`` (no ranking yet)."""
        state = self.open.get(event.request_id)
        if state is not None and state.ts + self.horizon + self.horizon > self.watermark:
            return self._apply(state, event)
        if self._remembered(event.request_id):
            self.counts["feedback", "late"] += 1
            return "late"
        self.waiting.append(event)
        return "pending"

    def wait_over(self, feedback: Feedback, watermark: float) -> bool:
        """Whether event time ``watermark`` is past the wait of ``feedback`` for its ranking (docs/contract.md §1:
        the ranking did not come within the attribution window, plus the allowed lateness every event time gets)."""
        return watermark >= feedback.ts + self.horizon  # type: ignore[operator]  # ts is float

    def _apply(self, state: RequestState, event: Feedback) -> str:
        ts: float = event.ts  # type: ignore[assignment]  # validated: epoch seconds
        if ts - state.ts > self.attribution_window or state.ts + self.horizon <= self.watermark:
            self.counts["feedback", "late"] += 1
            return "late"
        grade: float = event.grade  # type: ignore[assignment]  # validated: kinds without grade get one
        item = event.item
        position = state.position(item)  # the behaviour measures: feedback that counts, repeated or not
        if position and event.kind == "click":
            state.clicked.add(position)
            state.first_click = min(state.first_click, ts)
            state.satisfied |= event.dwell is not None and event.dwell >= self.sat_dwell
        if position and event.kind in self.sat_kinds:
            state.satisfied = True
        key = item if grade == 1.0 and event.kind == "click" else (item, event.kind, grade)
        seen = state.seen
        if seen is None:
            state.seen = [key]
        elif key in seen:
            self.counts["feedback", "duplicate"] += 1
            return "duplicate"
        elif type(seen) is set:
            seen.add(key)
        elif len(seen) < _SHORT_SEEN:
            seen.append(key)  # type: ignore[union-attr]  # a list here
        else:
            state.seen = {*seen, key}
        self.counts["feedback", "ok"] += 1
        if self.delays is not None:
            self.delays.append(ts - state.ts)
        grades = state.grades  # grade 0 too: a judged non-relevant item (Judged@k, the RBP residual)
        if grades is None:
            state.grades = {item: grade}
            if self.changed is not None:
                self.changed[state.request_id] = state
        elif grade > grades.get(item, -1.0):
            grades[item] = grade
            if self.changed is not None:
                self.changed[state.request_id] = state
        return "ok"

    # -- event time ---------------------------------------------------------------------------------
    def advance(self, watermark: float) -> list[RequestState]:
        """Move event time to ``watermark`` (never back) and return the requests it finalises, in order."""
        if watermark > self.watermark:
            self.watermark = watermark
        watermark = self.watermark
        finalised, self._early = self._early, []
        horizon = self.horizon
        ready = self._due.pop_due(watermark, lambda s: s.ts + horizon)
        if ready:
            ready.sort(key=lambda s: s.ts + horizon)  # stable: equal deadlines stay in the order they opened
            open_, changed = self.open, self.changed
            for state in ready:
                rid = state.request_id
                if open_.get(rid) is not state:
                    continue  # finalised early (see ``ranking``)
                del open_[rid]
                if changed is not None:
                    changed.pop(rid, None)
                finalised.append(state)
        for state in finalised:
            forget_at = state.ts + horizon + horizon
            if forget_at > watermark:
                rid = state.request_id
                self.closed[rid] = forget_at
                heapq.heappush(self._closed_expiry, (forget_at, next(self._seq), rid))
        over = [f for f in self.waiting if self.wait_over(f, watermark)]
        if over:
            self.counts["feedback", "orphan"] += len(over)
            self.waiting = [f for f in self.waiting if not self.wait_over(f, watermark)]
        closed = self._closed_expiry
        while closed and closed[0][0] <= watermark:
            forget_at, _, rid = heapq.heappop(closed)
            if self.closed.get(rid) == forget_at:
                del self.closed[rid]
        return self._handed_over(finalised)

    def _handed_over(self, finalised: list[RequestState]) -> list[RequestState]:
        """The finalised requests less those of late rankings."""
        if not self.late:
            return finalised
        kept = [state for state in finalised if id(state) not in self.late]
        self.late.difference_update(id(state) for state in finalised)
        return kept

    def flush(self) -> list[RequestState]:
        """End of input: finalise every open request and count every waiting feedback as an orphan."""
        horizon = self.horizon
        finalised = self._early + sorted(self.open.values(), key=lambda s: s.ts + horizon)  # stable: opening order
        self._early = []
        self.open.clear()
        if self.changed is not None:
            self.changed.clear()
        self._due.clear()
        self.counts["feedback", "orphan"] += len(self.waiting)
        self.waiting = []
        self.closed.clear()
        self._closed_expiry.clear()
        return self._handed_over(finalised)
