"""Sessions for AUC/GAUC and the session measures: the served items of finalised requests, grouped by ``session_id``.

A request without ``session_id`` is a session of its own and is scored as soon as it is finalised. The
requests of a named session wait until event time passes the last request's finalisation point plus
``session_gap``; a request arriving later for the same id starts a new session.

A named session is keyed by its id and the shard of its requests' A/B unit (``engine/ab.py``; of its session id
for an interleaved request, which has no unit): the partitions of the streaming regroup stage each get the
requests of some shards, and keep the same sessions as replay. (Requests of one session id whose units fall in
different shards, which a log with one unit per session does not have, are sessions of their own.)

At most ``max_open_sessions / SHARDS`` (rounded up) named sessions of a shard are open: a request that would open
one more is scored at once as a session of its own (its session id as its id) and counted in
:attr:`Sessions.overflow`. Sessions whose close point
its finalisation point has passed are not open, whenever :meth:`Sessions.close` last ran, so the bound holds the
same in replay and on the regroup stage, which add requests in the same order.

The session measures (README, "Behaviour measures"), when one runs, are scored with the AUC: ``QueriesPerSession``,
the requests of the session, and ``Reformulation``, per request of the session: 1 when the session's next request
(in the order of serve time) follows within ``reformulation_gap``, is another query (a request without
``query_id`` is a query of its own) and the request had no satisfied click (``SatClick``), else 0. Requests with
the same serve time are taken in the order of their query id, then satisfied last, so that the values do not depend
on the order in which the parts of a session arrive.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import compress
from operator import attrgetter, itemgetter
from typing import Any, cast

import msgspec
import numpy as np
import numpy.typing as npt

from stream_eval.config import Config
from stream_eval.engine.ab import SHARDS, shard_of, shards_of
from stream_eval.engine.compiled import grouped_session_auc
from stream_eval.events.join import DueBySecond
from stream_eval.events.scan import json_numbers
from stream_eval.events.schema import SCORES_DECODER as _SCORES
from stream_eval.events.schema import CompactRanking
from stream_eval.metrics.auc import gauc_weights

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
_N = attrgetter("n")
_TS = attrgetter("ts")
_SESSION_ID = attrgetter("session_id")
_REQUEST_ID = attrgetter("request_id")
_SCORES_OF = attrgetter("scores")
_QUERY_ID = attrgetter("query_id")
_ENCODER = msgspec.json.Encoder()
#: Takes the requests of named sessions of a batch: (the batch's requests, groups and impressions, the requests'
#: rows).
NamedParts = Callable[["SessionRequests", Ints, "Impressions", list[int]], None]
#: An open session's key: (the shard of its requests' A/B unit, session id).
SessionKey = tuple[int, str]


class Impressions:
    """The served items of a batch of requests, flattened: request ``i`` owns ``starts[i]:starts[i+1]``.

    ``scores`` are the model scores, or minus the position where a ranking has none (higher position,
    higher score); ``labels`` mark relevant items. With ``satisfied`` (the session measures run), each request's
    serve time (``times``), query id (``queries``) and whether it had a satisfied click (``satisfied``) too.
    """

    __slots__ = ("starts", "scores", "labels", "times", "queries", "satisfied", "_lists")

    def __init__(self, states: Sequence[CompactRanking], rel_req: Ints, rel_pos: Ints,
                 n_shown: Ints | None = None, satisfied: Bools | None = None, times: Floats | None = None,
                 scores: Floats | None = None, queries: list[str | None] | None = None) -> None:
        if n_shown is None:
            n_shown = np.fromiter(map(_N, states), dtype=np.int64, count=len(states))
        starts = starts_of(n_shown)
        total = int(starts[-1])
        if scores is None:  # (given: the regroup stage's parts, every served item's score, flat)
            scores = self._scores(states, starts, n_shown, total)
        labels = np.zeros(total, dtype=np.bool_)
        labels[starts[rel_req] + rel_pos - 1] = True
        self.starts, self.scores, self.labels = starts, scores, labels
        self.satisfied = satisfied
        # (1-based positions of the relevant items, where each request's positions start) as lists, made at the
        # first call that reads one request's (an interleaved request's, for its teams' credit)
        self._lists: tuple[list[int], list[int]] | None = None
        self.times: Floats | None = None
        self.queries: list[str | None] | None = None
        if satisfied is not None:  # (``times``, ``queries``: the serve times and query ids, when the caller has them)
            self.times = np.fromiter(map(_TS, states), dtype=np.float64, count=len(states)) if times is None else times
            self.queries = list(map(_QUERY_ID, states)) if queries is None else queries

    @staticmethod
    def _scores(states: Sequence[CompactRanking], starts: Ints, n_shown: Ints, total: int) -> Floats:
        """The served items' scores of ``states``, flat: as the rankings kept them, or minus the position."""
        part = np.repeat(np.arange(len(states)), n_shown)
        scores = starts[part] - np.arange(total, dtype=np.float64) - 1.0
        # scores as JSON text (as rankings keep them; a list is encoded, exactly): "[1,2]" "[3]" read as one
        # "[1,2,3]" (flat arrays of numbers, never empty)
        kept_scores = list(map(_SCORES_OF, states))
        with_scores = present(kept_scores)
        if with_scores.any():
            texts = kept_scores if with_scores.all() else list(compress(kept_scores, with_scores.tolist()))
            scored = with_scores[part]
            try:
                text = b"".join(texts)  # the usual batch: all kept as text
            except TypeError:  # some kept as lists
                text = b"".join([kept if type(kept) is bytes else _ENCODER.encode(kept) for kept in texts])
            values = json_numbers(text, int(scored.sum()))
            scores[scored] = _SCORES.decode(text.replace(b"][", b",")) if values is None else values
        return scores

    def relevant_positions(self, i: int) -> list[int]:
        """1-based positions of the relevant items of request ``i``."""
        positions, bounds = self._as_lists()
        return positions[bounds[i] : bounds[i + 1]]

    def _as_lists(self) -> tuple[list[int], list[int]]:
        if self._lists is None:
            starts = self.starts
            hits = np.flatnonzero(self.labels)
            bounds = np.searchsorted(hits, starts)  # request i's relevant items: hits[bounds[i]:bounds[i + 1]]
            owner = np.repeat(np.arange(starts.shape[0] - 1), np.diff(bounds))
            self._lists = ((hits - starts[owner] + 1).tolist(), bounds.tolist())
        return self._lists


#: Sessions scored together when many close at once.
_SCORE_AT_ONCE = 16_384


class ScoredSessions:
    """Closed sessions: the group of each, its AUC (NaN if single-class) and its GAUC weight; for the A/B
    units (``engine/ab.py``), each one's close point (``keys``), id and unit. For the session measures: each one's
    requests (``requests``; 0 for a session of a request without ``session_id``, whose values the engine counts with
    the request) and how many of them were reformulated (``reformulations``)."""

    __slots__ = ("group", "auc", "weight", "keys", "ids", "units", "requests", "reformulations")

    def __init__(self, group: Ints, auc: Floats, weight: Floats, keys: Floats, ids: list[str],
                 units: list[str | None], requests: Ints | None = None, reformulations: Ints | None = None) -> None:
        self.group, self.auc, self.weight = group, auc, weight
        self.keys, self.ids, self.units = keys, ids, units  # units: None for sessions of no split (interleaved)
        none = np.zeros(group.shape[0], dtype=np.int64)
        self.requests = none if requests is None else requests
        self.reformulations = none if reformulations is None else reformulations


class SessionRequests:
    """What :class:`Sessions` reads of a batch of finalised requests, as columns: each one's session id (None: a
    session of its own), serve time, A/B unit (:func:`unit_of`) and request id."""

    __slots__ = ("sids", "ts", "units", "ids")

    def __init__(self, sids: list[str | None], ts: Floats, units: list[str | None], ids: list[str]) -> None:
        self.sids, self.ts, self.units, self.ids = sids, ts, units, ids

    @classmethod
    def of(cls, states: Sequence[CompactRanking], ts: Floats | None = None) -> SessionRequests:
        """The columns of requests read from the rankings (``ts``: their serve times, when the caller has them)."""
        if ts is None:
            ts = np.fromiter(map(_TS, states), dtype=np.float64, count=len(states))
        return cls(list(map(_SESSION_ID, states)), ts, list(map(unit_of, states)), list(map(_REQUEST_ID, states)))


def session_key(state: Any) -> SessionKey:
    """The key of the session of a request with a ``session_id``: the shard of its A/B unit (of its session id when
    it has none: interleaved), and the session id."""
    unit = unit_of(state)
    sid: str = state.session_id
    return shard_of(sid if unit is None else unit), sid


def session_keys(sessions: Sequence[tuple[str | None, str]]) -> list[SessionKey]:
    """:func:`session_key` of sessions given as (``unit_of`` a request of it, its session id), each shard computed
    once (:func:`~stream_eval.engine.ab.shards_of`).

    >>> session_keys([("user-1", "s1"), (None, "s2")]) == [(shard_of("user-1"), "s1"), (shard_of("s2"), "s2")]
    True
    """
    shards = shards_of([sid if unit is None else unit for unit, sid in sessions]).tolist()
    return [(shard, sid) for shard, (_, sid) in zip(shards, sessions, strict=True)]


def unit_of(state: Any) -> str | None:
    """The A/B randomisation unit of a request: ``unit_id``, else ``session_id``, else ``request_id``; None for
    an interleaved request (with ``teams``), which is no arm of a split."""
    if state.teams is not None:
        return None
    unit: str | None = state.unit_id
    if unit is None:
        unit = state.session_id
    return state.request_id if unit is None else unit


class _Session(msgspec.Struct, gc=False):
    """An open named session (a Struct: made in C, cheaper to create than a class with ``__init__``;
    docs/benchmarks.md)."""

    group: int
    sid: str = ""
    unit: str | None = None  # the A/B unit of its first request
    shard: int = 0  # the shard of its requests' units (engine/ab.py)
    parts: list[tuple[Impressions, int]] = []  # a new list for each session
    deadline: float = -math.inf
    offset: float = math.inf  # streaming: the smallest regroup-log offset of its parts (engine/regroup.py)


class Sessions:
    """Open named sessions, and the scoring of sessions as they close."""

    def __init__(self, config: Config) -> None:
        self.gap = config.session_gap
        self.weight = config.gauc_weight
        self.behaviour = any(spec.per_session for spec in config.specs)  # session measures run
        self.reformulation_gap = config.reformulation_gap
        self.horizon = config.attribution_window + config.allowed_lateness  # a request's deadline: ts + horizon
        # Open sessions by (shard, session id): the shard of the A/B unit of their requests (engine/ab.py), so that
        # the partitions of the regroup stage, which get the requests of some shards each, keep the same sessions.
        self.open: dict[SessionKey, _Session] = {}
        self.limit = -(-config.max_open_sessions // SHARDS)  # per shard
        self._in_shard = [0] * SHARDS  # open sessions per shard
        self.overflow = 0  # requests that would have opened a session beyond ``limit``: scored alone
        # (deadline, key) of every deadline a session was given; stale entries are skipped at close.
        self._closing: DueBySecond[tuple[float, SessionKey]] = DueBySecond()
        self._ended: list[_Session] = []  # sessions a later request showed closed: scored by the next close

    def _score(self, starts: Ints, scores: Floats, labels: Bools, group: Ints, keys: Floats, ids: list[str],
               units: list[str | None], requests: Ints | None = None,
               reformulations: Ints | None = None) -> ScoredSessions:
        """Score sessions whose items are grouped: session ``s`` owns ``starts[s]:starts[s + 1]``."""
        auc, positives, negatives = grouped_session_auc(starts, scores, labels)
        return ScoredSessions(group, auc, gauc_weights(positives, negatives, self.weight), keys, ids, units,
                              requests, reformulations)

    def add(
        self, requests: SessionRequests, group: Ints, impressions: Impressions, named: NamedParts | None = None,
        offsets: list[int] | None = None, lowered: list[tuple[int, SessionKey]] | None = None
    ) -> ScoredSessions | None:
        """Take a batch of finalised requests; returns the one-request sessions, scored.

        With ``named``, requests of named sessions are handed to it (``named(requests, group, impressions, rows)``,
        once per batch) instead of being kept: the streaming worker regroups them by session across workers.
        With ``offsets`` (the regroup stage: each request's offset in the regroup log), an open session's
        :attr:`_Session.offset` is the smallest of its requests'; each time it goes down, (offset, key) is appended
        to ``lowered``.
        """
        sids = requests.sids
        own = ~present(sids)
        starts = impressions.starts
        in_named = np.flatnonzero(~own).tolist()
        alone: list[int] = []  # requests beyond the bound on open sessions: scored as sessions of their own
        if named is not None:
            if in_named:
                named(requests, group, impressions, in_named)
        elif in_named:
            open_, gap, groups, limit, units = self.open, self.gap, group.tolist(), self.limit, requests.units
            # when each request is finalised: its serve time plus the horizon
            finalised_at = (requests.ts + self.horizon).tolist()
            closing: list[tuple[float, SessionKey]] = []  # (deadline, key) of each deadline given, in order
            named_sids = cast("list[str]", sids)  # read at the requests of named sessions only (in_named)
            in_shard = self._in_shard
            for i in in_named:
                sid = named_sids[i]
                unit = units[i]
                key = (shard_of(sid if unit is None else unit), sid)
                shard = key[0]
                session = open_.get(key)
                if session is not None and finalised_at[i] > session.deadline:
                    # Event time passed the session's close point before this request was finalised: the
                    # session had ended, however far event time jumped in one step (so the result does not
                    # depend on how often finalisation runs); the request starts the next one.
                    self._end(open_.pop(key))
                    session = None
                if session is None:
                    if in_shard[shard] >= limit and not self._room(finalised_at[i], closing, shard):
                        alone.append(i)
                        continue
                    session = open_[key] = _Session(groups[i], sid, unit, shard)
                    in_shard[shard] += 1
                session.parts.append((impressions, i))
                if offsets is not None and offsets[i] < session.offset:
                    session.offset = offsets[i]
                    lowered.append((offsets[i], key))  # type: ignore[union-attr]  # given with offsets
                deadline = finalised_at[i] + gap
                if deadline > session.deadline:
                    session.deadline = deadline
                    closing.append((deadline, key))
            self._keep_closing(closing)
            if alone:
                self.overflow += len(alone)
                own[alone] = True
        if not own.any():
            return None
        if own.all():
            keys, ids, units_ = requests.ts + self.horizon, requests.ids, requests.units
        else:
            picked = own.tolist()
            keys = requests.ts[own] + self.horizon
            ids, units_ = list(compress(requests.ids, picked)), list(compress(requests.units, picked))
        n_requests = None
        if alone:  # a session of its own under its session id
            mine_sids = list(compress(sids, own.tolist()))
            ids = [rid if sid is None else sid for rid, sid in zip(ids, mine_sids, strict=True)]
            if self.behaviour:  # (those without a session id are counted with the request: see ScoredSessions)
                n_requests = present(mine_sids).astype(np.int64)
        if own.all():
            return self._score(starts, impressions.scores, impressions.labels, group, keys, ids, units_, n_requests)
        n_shown = np.diff(starts)
        keep = np.repeat(own, n_shown)
        return self._score(starts_of(n_shown[own]), impressions.scores[keep], impressions.labels[keep], group[own],
                           keys, ids, units_, n_requests)

    def _end(self, session: _Session) -> None:
        """A session taken out of :attr:`open`, to be scored by the next :meth:`close`."""
        self._in_shard[session.shard] -= 1
        self._ended.append(session)

    def _keep_closing(self, closing: list[tuple[float, SessionKey]]) -> None:
        """Add the deadlines given, in order, to those waiting (and empty ``closing``)."""
        if closing:
            self._closing.add_many(np.fromiter(map(itemgetter(0), closing), dtype=np.float64, count=len(closing)),
                                   closing)
            closing.clear()

    def _room(self, finalised_at: float, closing: list[tuple[float, SessionKey]], shard: int) -> bool:
        """Whether a session can open in ``shard`` at ``finalised_at`` once the sessions that had ended by then are
        out of :attr:`open` (to be scored by the next :meth:`close`, as a later request of theirs would end them)."""
        self._keep_closing(closing)
        open_ = self.open
        # ended: close point before ``finalised_at`` (a request finalised at a session's close point continues it)
        ended = self._closing.pop_due(math.nextafter(finalised_at, -math.inf), itemgetter(0))
        ended.sort()
        for deadline, key in ended:
            session = open_.get(key)
            if session is not None and session.deadline == deadline:
                self._end(open_.pop(key))
        return self._in_shard[shard] < self.limit

    def close(self, watermark: float) -> ScoredSessions | None:
        """Score and forget the named sessions idle since before ``watermark``."""
        ready = self._closing.pop_due(watermark, itemgetter(0))
        ready.sort()  # closing order: (deadline, shard, session id)
        sessions, self._ended = self._ended, []
        open_, in_shard = self.open, self._in_shard
        for deadline, key in ready:
            session = open_.get(key)
            if session is not None and session.deadline == deadline:
                del open_[key]
                in_shard[session.shard] -= 1
                sessions.append(session)
        if not sessions:
            return None
        if len(sessions) <= _SCORE_AT_ONCE:
            return self._score_sessions(sessions)
        # At the end of input every open session closes at once: scored a slice at a time, the temporaries
        # stay those of one slice (the peak memory of a replay was set here).
        slices = [self._score_sessions(sessions[k : k + _SCORE_AT_ONCE])
                  for k in range(0, len(sessions), _SCORE_AT_ONCE)]
        def joined(name: str) -> Any:
            return np.concatenate([getattr(s, name) for s in slices])

        return ScoredSessions(joined("group"), joined("auc"), joined("weight"), joined("keys"),
                              [i for s in slices for i in s.ids], [u for s in slices for u in s.units],
                              joined("requests"), joined("reformulations"))

    def _score_sessions(self, sessions: list[_Session]) -> ScoredSessions:
        # Gather the parts batch by batch: one vectorised take per batch of impressions.
        by_batch: dict[int, tuple[Impressions, list[int], list[int]]] = {}
        for k, session in enumerate(sessions):
            for impressions, i in session.parts:
                entry = by_batch.get(id(impressions))
                if entry is None:
                    entry = by_batch[id(impressions)] = (impressions, [], [])
                entry[1].append(i)
                entry[2].append(k)
        part_owners: list[int] = []  # the session of each part, batch by batch
        length_parts, score_parts, label_parts = [], [], []
        times: list[Floats] = []  # the session measures': each part's serve time, query and satisfaction
        queries: list[str | None] = []
        satisfied: list[Bools] = []
        for impressions, requests, owners in by_batch.values():
            index = np.array(requests, dtype=np.int64)
            first, lengths = impressions.starts[index], impressions.starts[index + 1] - impressions.starts[index]
            offsets = ranges_of(first, lengths)
            score_parts.append(impressions.scores[offsets])
            label_parts.append(impressions.labels[offsets])
            part_owners += owners
            length_parts.append(lengths)
            if self.behaviour:
                times.append(impressions.times[index] if impressions.times is not None else np.zeros(len(requests)))
                satisfied.append(np.zeros(len(requests), dtype=np.bool_) if impressions.satisfied is None
                                 else impressions.satisfied[index])
                listed = impressions.queries
                queries += [None] * len(requests) if listed is None else list(map(listed.__getitem__, requests))
        # The items in session order, as the scoring needs them: the parts (a request's ~20 items each) are
        # sorted by session, stably.
        owner = np.array(part_owners, dtype=np.int64)
        lengths = np.concatenate(length_parts)
        order = np.argsort(owner, kind="stable")
        sorted_lengths = lengths[order]
        items = ranges_of((np.cumsum(lengths) - lengths)[order], sorted_lengths)
        group = np.array([s.group for s in sessions], dtype=np.int64)
        sizes = np.bincount(owner, weights=lengths, minlength=len(sessions)).astype(np.int64)
        keys = np.array([s.deadline for s in sessions], dtype=np.float64)
        n_requests = reformulated = None
        if self.behaviour:
            n_requests = np.bincount(owner, minlength=len(sessions)).astype(np.int64)
            reformulated = _reformulations(owner, np.concatenate(times), queries, np.concatenate(satisfied),
                                           self.reformulation_gap, len(sessions))
        return self._score(starts_of(sizes), np.concatenate(score_parts)[items], np.concatenate(label_parts)[items],
                           group, keys, [s.sid for s in sessions], [s.unit for s in sessions], n_requests,
                           reformulated)


def _reformulations(owner: Ints, times: Floats, queries: list[str | None], satisfied: Bools, gap: float,
                    n_sessions: int) -> Ints:
    """The reformulated requests of each session (module docstring), from its requests' serve times, query ids and
    satisfaction (``owner``: the session of each request, in any order).

    >>> _reformulations(np.array([0, 0, 0, 1, 1, 2, 2, 2]), np.array([10.0, 30.0, 200.0, 5.0, 6.0, 1.0, 1.0, 2.0]),
    ...                 ["a", "b", "c", None, None, "b", "a", "a"], np.zeros(8, dtype=np.bool_), 60.0, 3).tolist()
    [1, 1, 2]
    """
    if not owner.shape[0]:
        return np.zeros(n_sessions, dtype=np.int64)
    order = np.lexsort((times, owner))
    tied = np.flatnonzero((owner[order][1:] == owner[order][:-1]) & (times[order][1:] == times[order][:-1]))
    if tied.shape[0]:  # requests of a session served at the same time (rare): by query id, none first, then satisfied
        order = order.copy()
        start = int(tied[0])
        for k, at in enumerate(tied.tolist()):
            if k + 1 < tied.shape[0] and tied[k + 1] == at + 1:
                continue  # the run of ties goes on
            run = order[start : at + 2].tolist()
            run.sort(key=lambda i: (queries[i] is not None, queries[i] or "", bool(satisfied[i])))
            order[start : at + 2] = run
            start = int(tied[k + 1]) if k + 1 < tied.shape[0] else 0
    owner, times, satisfied = owner[order], times[order], satisfied[order]
    listed = list(map(queries.__getitem__, order.tolist()))
    query = np.empty(order.shape[0], dtype=object)
    query[:] = listed
    absent = ~present(listed)
    other = (query[1:] != query[:-1]) | absent[1:] | absent[:-1]  # a request without query_id: a query of its own
    follows = (owner[1:] == owner[:-1]) & (times[1:] - times[:-1] <= gap) & other & ~satisfied[:-1]
    return np.bincount(owner[:-1][follows], minlength=n_sessions).astype(np.int64)


def starts_of(sizes: Ints) -> Ints:
    """Where each of consecutive groups of ``sizes`` starts, and where the last ends.

    >>> starts_of(np.array([2, 0, 3])).tolist()
    [0, 2, 2, 5]
    """
    starts = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    return starts


def present(values: list[Any]) -> Bools:
    """Which of ``values`` are not ``None`` (one C-level count when all are, or none is: the common cases).

    >>> present([None, None]).tolist(), present(["a", None]).tolist(), present(["a"]).tolist()
    ([False, False], [True, False], [True])
    """
    missing = values.count(None)
    if missing == 0 or missing == len(values):
        return np.full(len(values), missing == 0)
    return np.fromiter((value is not None for value in values), dtype=np.bool_, count=len(values))


def ranges_of(first: Ints, lengths: Ints) -> Ints:
    """The ranges ``first[k] : first[k] + lengths[k]``, one after the other.

    >>> ranges_of(np.array([5, 0]), np.array([2, 3])).tolist()
    [5, 6, 0, 1, 2]
    """
    ranges: Ints = np.repeat(first - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
    return ranges
