"""GSB tallies from the three sources of docs/contract.md §3.

Verdicts are counted per (experiment, treatment, source) (:data:`GsbKey`): each treatment against the control.

* ``judgment``: each judgment event is a verdict (a judgment names no arm: its treatment is ``""``).
* ``metric``: requests with an explicit ``query_id`` are grouped by (experiment, query, ``gsb_window``
  bucket of serve time); when the bucket can no longer change, a query served by the control and a treatment
  gets the verdict of that treatment's mean ``gsb_metric`` against control's (beyond ``gsb_epsilon``).
* ``interleaving``: each request with ``teams`` credits its relevant items to teams; verdicts are resolved
  against the experiment's arms when counts are read (each treatment's team against the control's), so an arm
  first seen late is still right.

Query ids are in the shards of ``engine/ab.py`` (:func:`~stream_eval.engine.ab.shard_of`). A bucket keeps, for
each experiment, the requests of at most ``max_open_queries / SHARDS`` (rounded up) distinct query ids of each shard:
those of smallest :func:`rank` (a fixed hash of the id), so that which queries are kept depends neither on the order
their requests arrive in nor on where the experiment's requests are counted (the streaming regroup stage counts an
experiment's on one of its partitions; replay and the stage of any number of workers agree). The requests of the
other queries are left out of the metric verdicts and counted in :attr:`GsbTracker.overflow` when the bucket
closes.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import Counter
from collections.abc import Callable, KeysView, Sequence
from itertools import compress
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from stream_eval.config import Arms, Config
from stream_eval.engine.ab import SHARDS, shard_of, shards_of
from stream_eval.metrics.gsb import VERDICTS, GsbCounts, interleaving_verdict, metric_verdicts

Floats = npt.NDArray[np.float64]

ArmsOf = Callable[[str], Arms | None]
#: (experiment, treatment, source): what verdicts are counted per. A judgment's treatment is "" (it names no arm).
GsbKey = tuple[str, str, str]
Credit = tuple[tuple[str, int], ...]
Part = tuple[list[tuple[str, str]], list[str], Floats]
#: Queries put out of a full bucket before its parts are rewritten without their requests.
_COMPACT = 65_536


def rank(query: str) -> int:
    """A query id's place in the order of queries kept (smallest first): a 128-bit hash, the same in every process
    (Python's ``hash`` of a str is not)."""
    return int.from_bytes(hashlib.blake2b(query.encode("utf-8", "surrogatepass"), digest_size=16).digest(), "big")


class _Kept:
    """The distinct queries an open bucket keeps requests of: at most ``limit``, those of smallest :func:`rank`
    seen (a bottom-k sample: the same set in any order of arrival)."""

    __slots__ = ("limit", "queries", "largest", "left_out", "evicted")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.queries: set[str] = set()
        self.largest: list[tuple[int, str]] | None = None  # once full: a heap of (-rank, query) of those kept
        self.left_out = 0  # requests not kept, or dropped from the parts (see ``evicted``)
        self.evicted = 0  # queries put out whose requests the parts may still hold

    def admit(self, queries: list[str]) -> list[bool] | None:
        """Take the queries of a part's requests; which requests to keep (None: all)."""
        kept = self.queries
        if len(kept) + len(queries) <= self.limit:
            kept.update(queries)
            return None
        keep = [self._admit(query) for query in queries]
        return None if all(keep) else keep

    def _admit(self, query: str) -> bool:
        kept = self.queries
        if query in kept:
            return True
        if len(kept) < self.limit:
            kept.add(query)
            return True
        if not self.limit:
            self.left_out += 1
            return False
        largest = self.largest
        if largest is None:
            largest = self.largest = [(-rank(q), q) for q in kept]
            heapq.heapify(largest)
        mine = rank(query)
        if mine >= -largest[0][0]:
            self.left_out += 1
            return False
        _, out = heapq.heapreplace(largest, (-mine, query))
        kept.remove(out)
        kept.add(query)
        self.evicted += 1
        return True



def _drop_evicted(shards: dict[tuple[str, int], _Kept], parts: list[Part]) -> list[Part]:
    """``parts`` of a bucket without the requests of queries its shards put out (counted in their ``left_out``)."""
    for kept in shards.values():
        kept.evicted = 0
    out = []
    for groups, queries, values in parts:
        keys = list(zip(map(itemgetter(0), groups), map(shard_of, queries), strict=True))
        keep = [query in shards[key].queries for key, query in zip(keys, queries, strict=True)]
        if all(keep):
            out.append((groups, queries, values))
            continue
        for key, ok in zip(keys, keep, strict=True):
            if not ok:
                shards[key].left_out += 1
        if any(keep):
            out.append(_filtered((groups, queries, values), keep))
    return out


def _filtered(part: Part, keep: list[bool]) -> Part:
    groups, queries, values = part
    return list(compress(groups, keep)), list(compress(queries, keep)), values[np.array(keep, dtype=np.bool_)]


def gsb_key(parts: Sequence[str]) -> GsbKey:
    """A :data:`GsbKey` as written in a snapshot or share; (experiment, source), written before A/B/n, has the
    treatment ``""``.

    >>> gsb_key(["e", "b", "metric"]), gsb_key(["e", "judgment"])
    (('e', 'b', 'metric'), ('e', '', 'judgment'))
    """
    if len(parts) == 2:
        return str(parts[0]), "", str(parts[1])
    experiment, treatment, source = parts
    return str(experiment), str(treatment), str(source)


def _side(arms: Arms | None, arm: str) -> int:
    """0 for the control arm, ``k + 1`` for treatment ``k``, -1 for any other (or no arms)."""
    return -1 if arms is None else arms.side(arm)


class GsbTracker:
    """Verdict counts per (experiment, source), plus the open per-query metric buckets."""

    def __init__(self, config: Config, horizon: float) -> None:
        self.window = config.gsb_window
        self.epsilon = config.gsb_epsilon
        self.horizon = horizon
        self.counts: dict[GsbKey, GsbCounts] = {}
        # Every verdict, counted or not: a regroup stage rebuilt muted (engine/regroup.py) has given verdicts that
        # the previous owner counted; the always-valid sign test needs them all. (Without muting: ``counts``.)
        self.complete: dict[GsbKey, GsbCounts] = {}
        self._interleaving_complete: dict[str, Counter[Credit]] = {}
        self.frozen = False  # a regroup stage rebuilding from a snapshot: the complete tallies are in it
        # bucket -> the finalised requests with a query served in it, in parts: ((experiment, arm) of each,
        # query of each, metric of each). A bucket closes as a whole.
        self._queries: dict[int, list[Part]] = {}
        # bucket -> (experiment, shard) -> the distinct queries it keeps (at most ``limit`` each)
        self._kept: dict[int, dict[tuple[str, int], _Kept]] = {}
        self.limit = -(-config.max_open_queries // SHARDS)
        self.overflow = 0  # requests of closed buckets left out of metric verdicts: their query was not kept
        self._interleaving: dict[str, Counter[Credit]] = {}

    def _counts(self, key: GsbKey, complete: bool = False) -> GsbCounts:
        table = self.complete if complete else self.counts
        counts = table.get(key)
        if counts is None:
            counts = table[key] = GsbCounts()
        return counts

    def _add(self, key: GsbKey, verdict: str, times: int, count: bool) -> None:
        if not self.frozen:
            self._counts(key, complete=True).add(verdict, times)
        if count:
            self._counts(key).add(verdict, times)

    def judgment(self, experiment: str, verdict: str, count: bool = True) -> None:
        self._add((experiment, "", "judgment"), verdict, 1, count)

    def merge(self, other: GsbTracker, complete: bool = False) -> None:
        """Add another tracker's verdicts and interleaving tallies (open query buckets are not merged); with
        ``complete``, its complete tallies too (a regroup stage partition's)."""
        for key, counts in other.counts.items():
            self.counts[key] = self.counts.get(key, GsbCounts()) + counts
        for experiment, tally in other._interleaving.items():
            self._interleaving.setdefault(experiment, Counter()).update(tally)
        if complete:
            for key, counts in other.complete.items():
                self.complete[key] = self.complete.get(key, GsbCounts()) + counts
            for experiment, tally in other._interleaving_complete.items():
                self._interleaving_complete.setdefault(experiment, Counter()).update(tally)

    def drop_open(self) -> None:
        """Forget the open query buckets and the complete tallies (the regroup stage moved to another worker)."""
        self._queries.clear()
        self._kept.clear()
        self.complete.clear()
        self._interleaving_complete.clear()

    def bucket_of(self, serve_ts: float) -> int:
        return int(serve_ts // self.window)

    def open_buckets(self) -> KeysView[int]:
        """The query buckets not closed yet."""
        return self._queries.keys()

    def query_metric(self, experiment: str, arm: str, query_id: str, serve_ts: float, value: float) -> None:
        """One finalised request's ``gsb_metric`` for its query."""
        self.query_metrics([(experiment, arm)], [query_id], [serve_ts], [value])

    def query_metrics(self, groups: list[tuple[str, str]], queries: list[str], serve_ts: Sequence[float] | Floats,
                      values: Sequence[float] | Floats) -> None:
        """:meth:`query_metric` for many requests: their (experiment, arm), query, serve time and metric."""
        if not groups:
            return
        # floor division of floats, as Python's // (numpy's is CPython's algorithm)
        buckets = np.floor_divide(np.asarray(serve_ts, dtype=np.float64), self.window).astype(np.int64)
        metric = np.array(values, dtype=np.float64)  # a copy: kept
        for bucket in np.unique(buckets).tolist():
            rows = np.flatnonzero(buckets == bucket)
            if rows.shape[0] == len(groups):  # the usual batch: all in one bucket, kept as given
                self._keep(bucket, (groups, queries, metric))
                continue
            picked = rows.tolist()
            self._keep(bucket, ([groups[i] for i in picked], [queries[i] for i in picked], metric[rows]))

    def _keep(self, bucket: int, part: Part) -> None:
        """Add a part to its bucket, without the requests of queries beyond the bound of their experiment and
        shard."""
        shards = self._kept.setdefault(bucket, {})
        parts = self._queries.setdefault(bucket, [])
        groups, queries = part[0], part[1]
        rows_of: dict[tuple[str, int], list[int]] = {}
        for i, key in enumerate(zip(map(itemgetter(0), groups), shards_of(queries).tolist(), strict=True)):
            rows = rows_of.get(key)
            if rows is None:
                rows_of[key] = [i]
            else:
                rows.append(i)
        keep: list[bool] | None = None
        for key, rows in rows_of.items():
            kept = shards.get(key)
            if kept is None:
                kept = shards[key] = _Kept(self.limit)
            admitted = kept.admit(queries if len(rows) == len(queries) else [queries[i] for i in rows])
            if admitted is not None:
                if keep is None:
                    keep = [True] * len(queries)
                for i, ok in zip(rows, admitted, strict=True):
                    keep[i] = ok
        if keep is not None:
            part = _filtered(part, keep)
        if part[1]:
            parts.append(part)
        if sum(kept.evicted for kept in shards.values()) >= max(_COMPACT, self.limit):
            parts[:] = _drop_evicted(shards, parts)

    def interleaved(self, experiment: str, teams: list[str], relevant_positions: list[int],
                    count: bool = True) -> None:
        """One finalised interleaved request: each of its teams with the relevant items credited to it (0 for a
        team credited with none: the verdicts are only of the pairs of arms that took part)."""
        credited = Counter(dict.fromkeys(teams, 0))
        credited.update(teams[p - 1] for p in relevant_positions)
        credit = tuple(sorted(credited.items()))
        if not self.frozen:
            self._interleaving_complete.setdefault(experiment, Counter())[credit] += 1
        if count:
            self._interleaving.setdefault(experiment, Counter())[credit] += 1

    def close(self, watermark: float, arms_of: ArmsOf, count: bool = True) -> None:
        """Give verdicts to the query buckets that no finalisation can change any more (``count=False``:
        just forget them)."""
        if not self._queries:
            return
        closing = [b for b in self._queries if (b + 1) * self.window + self.horizon <= watermark]
        for bucket in sorted(closing):
            parts = self._queries.pop(bucket)
            shards = self._kept.pop(bucket, None)
            if shards is not None:
                if any(kept.evicted for kept in shards.values()):
                    parts = _drop_evicted(shards, parts)
                if count:
                    self.overflow += sum(kept.left_out for kept in shards.values())
            if parts:
                self._verdicts(parts, arms_of, count)

    def _verdicts(self, parts: list[Part], arms_of: ArmsOf, count: bool) -> None:
        """Count the verdicts of one closed bucket: a query served by both arms of its experiment gets one."""
        groups = [g for part_groups, _, _ in parts for g in part_groups]
        queries = [q for _, part_queries, _ in parts for q in part_queries]
        values = np.concatenate([part_values for _, _, part_values in parts])
        # each request's experiment, and side: 0 control, k + 1 treatment k, -1 neither (or no arms)
        known = {group: k for k, group in enumerate(dict.fromkeys(groups))}
        names = list(dict.fromkeys(experiment for experiment, _ in known))
        arms_by_name = {name: arms_of(name) for name in names}
        group_experiment = np.array([names.index(experiment) for experiment, _ in known], dtype=np.int64)
        group_side = np.array([_side(arms_by_name[experiment], arm) for experiment, arm in known], dtype=np.int64)
        group = np.fromiter(map(known.__getitem__, groups), dtype=np.int64, count=len(groups))
        experiment_of, side = group_experiment[group], group_side[group]
        for e, name in enumerate(names):
            arms = arms_by_name[name]
            for k, treatment in enumerate(arms.treatments if arms is not None else (), start=1):
                rows = np.flatnonzero((experiment_of == e) & ((side == 0) | (side == k)))
                if rows.shape[0]:
                    self._metric_verdicts((name, treatment, "metric"), queries, values, rows,
                                          (side[rows] == k).astype(np.int64), count)

    def _metric_verdicts(self, key: GsbKey, queries: list[str], values: Floats, rows: npt.NDArray[np.int64],
                         treated: npt.NDArray[np.int64], count: bool) -> None:
        """Count the verdicts of the queries of ``rows`` served by both arms (``treated``: 1 treatment, 0 control)."""
        picked = queries if rows.shape[0] == len(queries) else [queries[i] for i in rows.tolist()]
        # a query's code: the first of its rows (str keys, set once: no tuple per request)
        first: dict[str, int] = {}
        code = np.fromiter(map(first.setdefault, picked, range(len(picked))), dtype=np.int64, count=len(picked))
        cell = 2 * code + treated
        # sums in arrival order, as adding request by request would give
        sums = np.bincount(cell, weights=values[rows], minlength=2 * len(picked)).reshape(-1, 2)
        counts = np.bincount(cell, minlength=2 * len(picked)).reshape(-1, 2)
        both = np.flatnonzero((counts > 0).all(axis=1))
        if both.shape[0]:
            means = sums[both] / counts[both]
            tally = np.bincount(metric_verdicts(means[:, 1], means[:, 0], self.epsilon), minlength=3)
            for verdict, times in zip(VERDICTS, tally.tolist(), strict=True):
                if times:
                    self._add(key, verdict, times, count)

    def totals(self, arms_of: ArmsOf, complete: bool = False) -> dict[GsbKey, GsbCounts]:
        """All counts, the interleaving tallies resolved with the arms as they are known now (``complete``: every
        verdict given here, counted or not)."""
        counts_of, interleaving = (self.complete, self._interleaving_complete) if complete else (
            self.counts, self._interleaving)
        out = {key: GsbCounts() + value for key, value in counts_of.items()}
        for experiment, tally in interleaving.items():
            arms = arms_of(experiment)
            for pair in arms.pairs() if arms is not None else ():
                key = (experiment, pair.treatment, "interleaving")
                for credit, times in tally.items():
                    teams = dict(credit)
                    if pair.control not in teams or pair.treatment not in teams:
                        continue  # a request that did not interleave this treatment with the control: no row
                    verdict = interleaving_verdict(teams, pair.control, pair.treatment)
                    counts = out.setdefault(key, GsbCounts())
                    if verdict is not None:
                        counts.add(verdict, times)
        return out
