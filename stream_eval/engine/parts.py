"""Session parts as columns: the finalised requests of named sessions on their way through the regroup log.

A worker gives the stage (``engine/regroup.py``) each finalised request of a named session as a *part*: its session
id, labels, serve time, the served items' scores and the 1-based positions of the relevant ones, its A/B unit (None:
an interleaved request, of no split) and, with the session measures on, its query id and whether a click satisfied.
:class:`Parts` holds many of them as columns, from the batch that finalised them to the stage's
:class:`~stream_eval.engine.sessions.Sessions`, without an object per part: the items' scores and the relevant
positions are flat arrays with each part's count beside them.

>>> parts = Parts(["s1", "s2"], ["exp", "exp"], ["A", "B"], np.array([1.0, 2.0]), np.array([2, 1]),
...               np.array([0.5, 0.25, 1.0]), np.array([1, 0]), np.array([2]), ["u1", None], None, None)
>>> picked = parts.take(np.array([1, 0]))
>>> picked.sessions, picked.scores.tolist(), picked.relevant.tolist(), picked.relevant_sizes.tolist()
(['s2', 's1'], [1.0, 0.5, 0.25], [2], [0, 1])
>>> Parts.concat([parts.between(1, 2), parts.between(0, 1)]).scores.tolist()
[1.0, 0.5, 0.25]
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from stream_eval.engine import records
from stream_eval.engine.compiled import parts_valid, take_ranges
from stream_eval.engine.sessions import Impressions, SessionRequests, starts_of

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


class Parts:
    """Session parts as columns (module docstring): part ``i``'s items are ``scores[starts[i]:starts[i + 1]]``
    (``starts`` from ``sizes``), its relevant positions likewise in ``relevant`` by ``relevant_sizes``. ``queries``
    and ``satisfied`` are None when the session measures are off."""

    __slots__ = ("sessions", "experiments", "arms", "served", "sizes", "scores", "relevant_sizes", "relevant",
                 "units", "queries", "satisfied", "_starts")

    def __init__(self, sessions: list[str], experiments: list[str], arms: list[str], served: Floats, sizes: Ints,
                 scores: Floats, relevant_sizes: Ints, relevant: Ints, units: list[str | None],
                 queries: list[str | None] | None, satisfied: Bools | None) -> None:
        self.sessions, self.experiments, self.arms, self.units = sessions, experiments, arms, units
        self.served, self.sizes, self.scores = served, sizes, scores
        self.relevant_sizes, self.relevant = relevant_sizes, relevant
        self.queries, self.satisfied = queries, satisfied
        self._starts: tuple[Ints, Ints] | None = None  # (of the items, of the relevant positions) once read

    def starts(self) -> tuple[Ints, Ints]:
        """Where each part's items start in :attr:`scores`, and its relevant positions in :attr:`relevant` (and
        where the last ends)."""
        if self._starts is None:
            self._starts = (starts_of(self.sizes), starts_of(self.relevant_sizes))
        return self._starts

    def __len__(self) -> int:
        return len(self.sessions)

    @classmethod
    def of_batch(cls, requests: SessionRequests, experiments: list[str], arms: list[str], impressions: Impressions,
                 rows: list[int]) -> Parts:
        """The parts of a finalised batch's requests ``rows`` (with their labels ``experiments``, ``arms``)."""
        index = np.array(rows, dtype=np.int64)
        starts = impressions.starts
        first = starts[index]
        sizes = starts[index + 1] - first
        hits = np.flatnonzero(take_ranges(impressions.labels, first, sizes))  # (in part order, ascending in each)
        owner = np.repeat(np.arange(index.shape[0]), sizes)[hits]
        relevant = hits - starts_of(sizes)[owner] + 1
        queries: list[str | None] | None = None
        satisfied = None
        if impressions.satisfied is not None:  # the session measures run: the query and a satisfied click
            listed = impressions.queries
            queries = [None] * len(rows) if listed is None else list(map(listed.__getitem__, rows))
            satisfied = impressions.satisfied[index]
        return cls(list(map(requests.sids.__getitem__, rows)), experiments, arms,  # type: ignore[arg-type]
                   requests.ts[index], sizes, take_ranges(impressions.scores, first, sizes),
                   np.bincount(owner, minlength=index.shape[0]), relevant, list(map(requests.units.__getitem__, rows)),
                   queries, satisfied)

    @classmethod
    def of_record(cls, record: records.SessionParts | records.SessionPart, horizon: float) -> Parts:
        """The parts of a :class:`records.SessionParts`, or the one of a :class:`records.SessionPart` (without a
        serve time, written before 2026-11-23: its finalisation point less the horizon). Columns of unequal lengths,
        negative counts and relevant positions outside their part, which no sink writes, are an error rather than
        parts left out or another part's item marked relevant."""
        if type(record) is records.SessionPart:
            old: Any = record  # (``finalised`` is set where ``served`` is not)
            served = old.served if old.served is not None else float(old.finalised) - horizon
            unit = old.session if old.unit is msgspec.UNSET else old.unit
            parts = cls([old.session], [old.experiment], [old.arm], np.array([served], dtype=np.float64),
                        np.array([len(old.scores)], dtype=np.int64), np.array(old.scores, dtype=np.float64),
                        np.array([len(old.relevant)], dtype=np.int64), np.array(old.relevant, dtype=np.int64), [unit],
                        [old.query], np.array([old.satisfied], dtype=np.bool_))
            parts._check()
            return parts
        columns: Any = record
        n = len(columns.sessions)
        if columns.flat_scores is not None:
            scores = records.floats(columns.flat_scores)
            sizes = np.array(columns.sizes or [], dtype=np.int64)
        else:  # (logs written before 2026-11-28: a list of numbers per part)
            listed = columns.scores or []
            sizes = np.fromiter(map(len, listed), dtype=np.int64, count=len(listed))
            scores = np.array(list(chain.from_iterable(listed)), dtype=np.float64)
        if columns.flat_relevant is not None:
            relevant = np.array(columns.flat_relevant, dtype=np.int64)
            relevant_sizes = np.array(columns.relevant_sizes or [], dtype=np.int64)
        else:  # (logs written before 2026-12-07: a list of positions per part)
            nested = columns.relevant or []
            relevant_sizes = np.fromiter(map(len, nested), dtype=np.int64, count=len(nested))
            relevant = np.fromiter(chain.from_iterable(nested), dtype=np.int64, count=int(relevant_sizes.sum()))
        satisfied = None if columns.satisfied is None else np.array(columns.satisfied, dtype=np.bool_)
        lengths = {len(columns.experiments), len(columns.arms), len(columns.served), len(columns.units),
                   sizes.shape[0], relevant_sizes.shape[0]}
        lengths |= {len(column) for column in (columns.queries, satisfied) if column is not None}
        if lengths != {n} or int(sizes.sum()) != scores.shape[0] or int(relevant_sizes.sum()) != relevant.shape[0]:
            raise ValueError(f"a SessionParts record of {n} parts with columns of other lengths")
        parts = cls(columns.sessions, columns.experiments, columns.arms, np.array(columns.served, dtype=np.float64),
                    sizes, scores, relevant_sizes, relevant, columns.units, columns.queries, satisfied)
        parts._check()
        return parts

    def _check(self) -> None:
        """No count below 0, no relevant position outside its part (the sizes' and positions' sums checked)."""
        if not parts_valid(self.sizes, self.relevant_sizes, self.relevant):
            raise ValueError(f"a SessionParts record of {len(self)} parts with a negative count or a relevant "
                             "position outside its part")

    def record(self) -> records.SessionParts:
        """These parts as a record's columns."""
        return records.SessionParts(
            sessions=self.sessions, experiments=self.experiments, arms=self.arms, served=self.served.tolist(),
            flat_scores=records.flat(self.scores), sizes=self.sizes.tolist(), flat_relevant=self.relevant.tolist(),
            relevant_sizes=self.relevant_sizes.tolist(), units=self.units, queries=self.queries,
            satisfied=None if self.satisfied is None else self.satisfied.tolist())

    def requests(self) -> SessionRequests:
        """The parts as the requests :class:`~stream_eval.engine.sessions.Sessions` reads (a part's request id is its
        session id)."""
        return SessionRequests(self.sessions, self.served, self.units, self.sessions)  # type: ignore[arg-type]

    def impressions(self, behaviour: bool) -> Impressions:
        """The parts' served items, as :class:`~stream_eval.engine.sessions.Impressions` (``behaviour``: with the
        serve times, queries and satisfied clicks the session measures read)."""
        n = len(self)
        rel_req = np.repeat(np.arange(n), self.relevant_sizes)
        queries: list[str | None] | None = None
        satisfied = None
        if behaviour:
            satisfied = np.zeros(n, dtype=np.bool_) if self.satisfied is None else self.satisfied
            queries = [None] * n if self.queries is None else self.queries
        return Impressions((), rel_req, self.relevant, self.sizes, satisfied, self.served, self.scores, queries)

    def take(self, rows: Ints) -> Parts:
        """These parts' ``rows``, in that order (a copy)."""
        starts, relevant_starts = self.starts()
        sizes, relevant_sizes = self.sizes[rows], self.relevant_sizes[rows]
        picked = rows.tolist()

        def pick(column: list[Any]) -> list[Any]:
            return list(map(column.__getitem__, picked))

        return Parts(pick(self.sessions), pick(self.experiments), pick(self.arms), self.served[rows], sizes,
                     take_ranges(self.scores, starts[rows], sizes), relevant_sizes,
                     take_ranges(self.relevant, relevant_starts[rows], relevant_sizes),
                     pick(self.units), None if self.queries is None else pick(self.queries),
                     None if self.satisfied is None else self.satisfied[rows])

    def between(self, a: int, b: int) -> Parts:
        """Parts ``a:b`` (views of the arrays)."""
        if a == 0 and b == len(self):
            return self
        starts, relevant_starts = self.starts()
        return Parts(self.sessions[a:b], self.experiments[a:b], self.arms[a:b], self.served[a:b], self.sizes[a:b],
                     self.scores[starts[a] : starts[b]], self.relevant_sizes[a:b],
                     self.relevant[relevant_starts[a] : relevant_starts[b]], self.units[a:b],
                     None if self.queries is None else self.queries[a:b],
                     None if self.satisfied is None else self.satisfied[a:b])

    @staticmethod
    def concat(blocks: Sequence[Parts]) -> Parts:
        """The parts of ``blocks``, one after another (with the session measures' columns if any block has them)."""
        if len(blocks) == 1:
            return blocks[0]

        def joined(name: str) -> list[Any]:
            return list(chain.from_iterable(getattr(block, name) for block in blocks))

        def arrays(name: str) -> Any:
            return np.concatenate([getattr(block, name) for block in blocks])

        queries = satisfied = None
        if any(block.satisfied is not None for block in blocks):
            queries = list(chain.from_iterable([None] * len(block) if block.queries is None else block.queries
                                               for block in blocks))
            satisfied = np.concatenate([np.zeros(len(block), dtype=np.bool_) if block.satisfied is None
                                        else block.satisfied for block in blocks])
        return Parts(joined("sessions"), joined("experiments"), joined("arms"), arrays("served"), arrays("sizes"),
                     arrays("scores"), arrays("relevant_sizes"), arrays("relevant"), joined("units"), queries,
                     satisfied)
