"""trec_eval's measures that need more than the engine's events carry, compiled (numba) over each query's ranked
relevance list.

The engine sees a document as judged (a grade) or not. trec_eval tells three kinds of retrieved documents apart:
judged (relevance >= 0), in the qrels with a negative relevance ("in the pool but unjudged", :data:`UNJUDGED`) and
absent from the qrels (:data:`NONPOOL`); ``bpref`` and ``infAP`` count them differently, and ``bpref`` also counts
the judged non-relevant documents that were not retrieved. :class:`RankedLists` holds what trec_eval's
relevance lists give each measure: per query, the relevance of each retrieved document in rank order, and
the grades of all its judged documents. Each function here is trec_eval 9's loop of its measure on it,
one value (or one row of values) per query, so the numbers are trec_eval's to the last bit of its arithmetic.

Gains (``ndcg``, ``ndcg_rel``, ``Rndcg``, ``G``) are trec_eval's defaults: a document's gain is its relevance, 0
for unjudged documents; ideal lists are the judged grades sorted descending. These ignore ``-l``, as in trec_eval,
but for ``Rndcg``, 0 for a query with no document relevant at ``-l``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numba as nb
import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

#: A retrieved document absent from the qrels (trec_eval's "not in the pool", -1).
NONPOOL = -1
#: A retrieved document with a negative relevance in the qrels: in the pool, not judged (-2).
UNJUDGED = -2
#: Floor of a query's value before the log of a geometric mean (trec_eval's ``MIN_GEO_MEAN``).
MIN_GEO_MEAN = 0.00001
#: trec_eval's ``INFAP_EPSILON``.
INFAP_EPSILON = 0.00001


def _segments(lengths: Sequence[int]) -> Ints:
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.asarray(lengths, dtype=np.int64), out=starts[1:])
    return starts


@dataclasses.dataclass(frozen=True)
class RankedLists:
    """Queries ``0..n-1``: ``rels[starts[q]:starts[q + 1]]`` the relevance of query ``q``'s retrieved documents in
    rank order (a grade >= 0, :data:`NONPOOL` or :data:`UNJUDGED`); ``judged[judged_starts[q]:judged_starts[q +
    1]]`` the grades >= 0 of all its judged documents, descending; ``level`` the relevance level (``-l``)."""

    starts: Ints
    rels: Ints
    judged_starts: Ints
    judged: Ints
    level: int

    @classmethod
    def build(cls, ranked: Sequence[Sequence[int]], judged: Sequence[Sequence[int]], level: int) -> RankedLists:
        """From each query's retrieved relevances in rank order and its qrels' relevances (any order, negative
        ones are not judged).

        >>> lists = RankedLists.build([[1, NONPOOL, 0]], [[0, 2, -1, 1]], 1)
        >>> lists.judged.tolist(), lists.num_rel.tolist(), lists.num_nonrel.tolist()
        ([2, 1, 0], [2], [1])
        """
        grades = [sorted((g for g in query if g >= 0), reverse=True) for query in judged]
        return cls(_segments([len(q) for q in ranked]),
                   np.fromiter((r for q in ranked for r in q), dtype=np.int64),
                   _segments([len(q) for q in grades]),
                   np.fromiter((g for q in grades for g in q), dtype=np.int64), level)

    @property
    def size(self) -> int:
        return int(self.starts.shape[0]) - 1

    @staticmethod
    def _per_query(mask: npt.NDArray[np.bool_], starts: Ints) -> Ints:
        running = np.zeros(mask.shape[0] + 1, dtype=np.int64)
        np.cumsum(mask, out=running[1:])
        counts: Ints = running[starts[1:]] - running[starts[:-1]]
        return counts

    @property
    def num_ret(self) -> Ints:
        return np.diff(self.starts)

    @property
    def num_rel(self) -> Ints:
        """Judged documents at or above the level, retrieved or not."""
        return self._per_query(self.judged >= self.level, self.judged_starts)

    @property
    def num_nonrel(self) -> Ints:
        """Judged documents below the level, retrieved or not."""
        return self._per_query(self.judged < self.level, self.judged_starts)

    @property
    def num_rel_ret(self) -> Ints:
        return self._per_query(self.rels >= self.level, self.starts)

    @property
    def num_judged_ret(self) -> Ints:
        """Retrieved documents with a relevance >= 0 (neither :data:`NONPOOL` nor :data:`UNJUDGED`)."""
        return self._per_query(self.rels >= 0, self.starts)


# -- the loops of trec_eval's m_*.c, one query at a time ---------------------------------------------------------
@nb.njit(cache=True, nogil=True)
def _bpref(starts: Ints, rels: Ints, num_rel: Ints, num_nonrel: Ints, level: int,
           out: Floats) -> None:  # pragma: no cover  # compiled
    for q in range(starts.shape[0] - 1):
        nonrel_so_far = 0
        bpref = 0.0
        for j in range(starts[q], starts[q + 1]):
            rel = rels[j]
            if rel == NONPOOL or rel == UNJUDGED:
                continue
            if 0 <= rel < level:
                nonrel_so_far += 1
            elif nonrel_so_far > 0:
                bpref += 1.0 - min(nonrel_so_far, num_rel[q]) / min(num_nonrel[q], num_rel[q])
            else:
                bpref += 1.0
        out[q] = bpref / num_rel[q] if num_rel[q] else bpref


@nb.njit(cache=True, nogil=True)
def _infap(starts: Ints, rels: Ints, num_rel: Ints, level: int, out: Floats) -> None:  # pragma: no cover
    for q in range(starts.shape[0] - 1):
        nonrel_so_far = 0
        rel_so_far = 0
        pool_unjudged_so_far = 0
        inf_ap = 0.0
        for j in range(starts[q + 1] - starts[q]):
            rel = rels[starts[q] + j]
            if rel == NONPOOL:
                continue
            if rel == UNJUDGED:
                pool_unjudged_so_far += 1
                continue
            if 0 <= rel < level:
                nonrel_so_far += 1
                continue
            rel_so_far += 1
            if j == 0:
                inf_ap += 1.0
            else:
                fj = float(j)
                inf_ap += (1.0 / (fj + 1.0) + (fj / (fj + 1.0))
                           * ((rel_so_far - 1 + nonrel_so_far + pool_unjudged_so_far) / fj)
                           * ((rel_so_far - 1 + INFAP_EPSILON) / (rel_so_far - 1 + nonrel_so_far + 2 * INFAP_EPSILON)))
        out[q] = inf_ap / num_rel[q] if num_rel[q] else inf_ap


@nb.njit(cache=True, nogil=True)
def _interpolated_precision(starts: Ints, rels: Ints, num_rel: Ints, num_rel_ret: Ints, fractions: Floats,
                            level: int, out: Floats) -> None:  # pragma: no cover  # compiled
    """``iprec_at_recall`` (and ``11pt_avg``, its mean): out[q, c], fractions ascending."""
    cutoffs = np.empty(fractions.shape[0], np.int64)
    for q in range(starts.shape[0] - 1):
        lo = starts[q]
        num_ret = starts[q + 1] - lo
        for c in range(fractions.shape[0]):
            cutoffs[c] = int(fractions[c] * num_rel[q] + 0.9)
        current = fractions.shape[0] - 1
        while current >= 0 and cutoffs[current] > num_rel_ret[q]:
            out[q, current] = 0.0
            current -= 1
        int_precis = num_rel_ret[q] / num_ret
        rel_so_far = num_rel_ret[q]
        i = num_ret
        while i > 0 and rel_so_far > 0:
            precis = rel_so_far / i
            if int_precis < precis:
                int_precis = precis
            if rels[lo + i - 1] >= level:
                while current >= 0 and rel_so_far == cutoffs[current]:
                    out[q, current] = int_precis
                    current -= 1
                rel_so_far -= 1
            i -= 1
        while current >= 0:
            out[q, current] = int_precis
            current -= 1


@nb.njit(cache=True, nogil=True)
def _rprec_mult(starts: Ints, rels: Ints, num_rel: Ints, num_rel_ret: Ints, fractions: Floats, level: int,
                out: Floats) -> None:  # pragma: no cover  # compiled
    cutoffs = np.empty(fractions.shape[0], np.int64)
    for q in range(starts.shape[0] - 1):
        lo = starts[q]
        num_ret = starts[q + 1] - lo
        out[q, :] = 0.0
        for c in range(fractions.shape[0]):
            cutoffs[c] = int(fractions[c] * num_rel[q] + 0.9)
        current = fractions.shape[0] - 1
        while current >= 0 and cutoffs[current] > num_ret:
            out[q, current] = num_rel_ret[q] / cutoffs[current]
            current -= 1
        rel_so_far = num_rel_ret[q]
        i = num_ret
        while i > 0 and rel_so_far > 0:
            precis = rel_so_far / i
            while current >= 0 and i == cutoffs[current]:
                out[q, current] = precis
                current -= 1
            if rels[lo + i - 1] >= level:
                rel_so_far -= 1
            i -= 1


@nb.njit(cache=True, nogil=True)
def _hits(starts: Ints, rels: Ints, cutoffs: Ints, level: int, out: Ints) -> None:  # pragma: no cover
    """Relevant documents in the top ``cutoffs[c]``: out[q, c]."""
    for q in range(starts.shape[0] - 1):
        rel_so_far = 0
        c = 0
        for i in range(starts[q + 1] - starts[q]):
            while c < cutoffs.shape[0] and i == cutoffs[c]:
                out[q, c] = rel_so_far
                c += 1
            if rels[starts[q] + i] >= level:
                rel_so_far += 1
        while c < cutoffs.shape[0]:
            out[q, c] = rel_so_far
            c += 1


@nb.njit(cache=True, nogil=True)
def _bin_g(starts: Ints, rels: Ints, num_rel: Ints, level: int, out: Floats) -> None:  # pragma: no cover
    for q in range(starts.shape[0] - 1):
        rel_so_far = 0
        total = 0.0
        for i in range(starts[q + 1] - starts[q]):
            if rels[starts[q] + i] >= level:
                rel_so_far += 1
                total += 1.0 / math.log2(3 + i - rel_so_far)
        out[q] = total / num_rel[q] if rel_so_far else 0.0


@nb.njit(cache=True, nogil=True)
def _ideal(judged: Ints, lo: int, hi: int, p: int) -> float:  # pragma: no cover  # compiled
    """The gain at 0-based ideal position ``p``: the p-th judged grade, descending (0 past them)."""
    return float(judged[lo + p]) if lo + p < hi else 0.0


@nb.njit(cache=True, nogil=True)
def _gain_measures(starts: Ints, rels: Ints, judged_starts: Ints, judged: Ints, num_rel: Ints,
                   out: Floats) -> None:  # pragma: no cover  # compiled
    """``ndcg``, ``ndcg_rel``, ``Rndcg`` and ``G`` (out[q, 0..3]) with trec_eval's default gains (a document's
    gain is its relevance, unjudged 0): trec_eval's loops of these measures, where the ideal
    gain at each step is the next judged grade in descending order."""
    for q in range(starts.shape[0] - 1):
        lo, n = starts[q], starts[q + 1] - starts[q]
        jlo, jhi = judged_starts[q], judged_starts[q + 1]
        top = _ideal(judged, jlo, jhi, 0)
        # ndcg
        results_dcg = 0.0
        ideal_dcg = 0.0
        for i in range(n):
            gain = float(max(rels[lo + i], 0))
            if gain != 0:
                results_dcg += gain / math.log2(i + 2.0)
        p = 0
        while _ideal(judged, jlo, jhi, p) > 0.0:
            ideal_dcg += _ideal(judged, jlo, jhi, p) / math.log2(p + 2.0)
            p += 1
        out[q, 0] = results_dcg / ideal_dcg if ideal_dcg > 0.0 else 0.0
        # ndcg_rel
        results_dcg = 0.0
        ideal_dcg = 0.0
        total = 0.0
        rel_ret = 0
        rel = 0
        ideal_gain = top
        i = 0
        while i < n and ideal_gain > 0.0:
            gain = float(max(rels[lo + i], 0))
            if gain != 0:
                results_dcg += gain / math.log2(i + 2.0)
            ideal_gain = _ideal(judged, jlo, jhi, i)
            if ideal_gain > 0.0:
                rel += 1
                ideal_dcg += ideal_gain / math.log2(i + 2.0)
            if gain > 0:
                total += results_dcg / ideal_dcg
                rel_ret += 1
            i += 1
        while i < n:
            gain = float(max(rels[lo + i], 0))
            if gain != 0:
                results_dcg += gain / math.log2(i + 2.0)
            if gain > 0:
                total += results_dcg / ideal_dcg
                rel_ret += 1
            i += 1
        while ideal_gain > 0.0:
            ideal_gain = _ideal(judged, jlo, jhi, i)
            if ideal_gain > 0.0:
                rel += 1
                ideal_dcg += ideal_gain / math.log2(i + 2.0)
            i += 1
        total += (rel - rel_ret) * results_dcg / ideal_dcg if ideal_dcg > 0.0 else 0.0
        out[q, 1] = total / rel if total > 0.0 else 0.0
        # Rndcg
        out[q, 2] = 0.0
        if num_rel[q] != 0:
            results_dcg = 0.0
            ideal_dcg = 0.0
            total = 0.0
            changes = 0
            ideal_gain = top
            old_ideal_gain = top
            i = 0
            while i < n and ideal_gain > 0.0:
                gain = float(max(rels[lo + i], 0))
                ideal_gain = _ideal(judged, jlo, jhi, i)
                if old_ideal_gain != ideal_gain:
                    if ideal_dcg > 0.0:
                        total += results_dcg / ideal_dcg
                        changes += 1
                    old_ideal_gain = ideal_gain
                if gain != 0:
                    results_dcg += gain / math.log2(i + 2.0)
                if ideal_gain > 0.0:
                    ideal_dcg += ideal_gain / math.log2(i + 2.0)
                i += 1
            if i < n:
                while i < n:
                    gain = float(max(rels[lo + i], 0))
                    if gain != 0:
                        results_dcg += gain / math.log2(i + 2.0)
                    i += 1
                if ideal_dcg > 0.0:
                    total += results_dcg / ideal_dcg
                    changes += 1
            while ideal_gain > 0.0:
                ideal_gain = _ideal(judged, jlo, jhi, i)
                if old_ideal_gain != ideal_gain:
                    if ideal_dcg > 0.0:
                        total += results_dcg / ideal_dcg
                        changes += 1
                    old_ideal_gain = ideal_gain
                if ideal_gain > 0.0:
                    ideal_dcg += ideal_gain / math.log2(i + 2.0)
                i += 1
            out[q, 2] = total / changes if changes else math.nan
        # G
        sum_results = 0.0
        sum_ideal = 0.0
        sum_cost = 0.0
        results_g = 0.0
        ideal_gain = top
        i = 0
        while i < n and ideal_gain > 0.0:
            gain = float(max(rels[lo + i], 0))
            sum_results += gain
            ideal_gain = _ideal(judged, jlo, jhi, i)
            if ideal_gain > 0.0:
                sum_ideal += ideal_gain
            sum_cost += ideal_gain if ideal_gain >= 1.0 else 1.0
            if gain != 0:
                results_g += gain / math.log2(2 + sum_cost - sum_results)
            i += 1
        while i < n:
            gain = float(max(rels[lo + i], 0))
            sum_results += gain
            sum_cost += 1.0
            if gain != 0:
                results_g += gain / math.log2(2 + sum_cost - sum_results)
            i += 1
        while ideal_gain > 0.0:
            ideal_gain = _ideal(judged, jlo, jhi, i)
            if ideal_gain > 0.0:
                sum_ideal += ideal_gain
            i += 1
        out[q, 3] = results_g / sum_ideal if sum_ideal > 0.0 else 0.0


# -- measures: (lists, parameters) -> one column per value ----------------------------------------------------------
def counts(lists: RankedLists, params: Sequence[float] = ()) -> Floats:
    """``num_ret``, ``num_rel``, ``num_rel_ret`` and ``num_nonrel_judged_ret``, in that order (columns)."""
    rel_ret = lists.num_rel_ret
    out: Floats = np.stack([lists.num_ret, lists.num_rel, rel_ret, lists.num_judged_ret - rel_ret], axis=1)
    return out.astype(np.float64)


def _column(values: npt.NDArray[np.float64 | np.int64]) -> Floats:
    return np.asarray(values, dtype=np.float64).reshape(-1, 1)


def _ratio(numerator: Floats | Ints, denominator: Floats | Ints) -> Floats:
    out = np.zeros(np.shape(numerator), dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=np.asarray(denominator) > 0)
    return out


def bpref(lists: RankedLists, params: Sequence[float] = ()) -> Floats:
    """``bpref``: per relevant retrieved document, the share of the top-R judged non-relevant documents ranked
    below it, over R (Buckley & Voorhees 2004); unjudged documents are skipped."""
    out = np.zeros(lists.size)
    _bpref(lists.starts, lists.rels, lists.num_rel, lists.num_nonrel, lists.level, out)
    return _column(out)


def inf_ap(lists: RankedLists, params: Sequence[float] = ()) -> Floats:
    """``infAP`` (Yilmaz & Aslam 2006): AP estimated from the judged sample of the pool."""
    out = np.zeros(lists.size)
    _infap(lists.starts, lists.rels, lists.num_rel, lists.level, out)
    return _column(out)


def iprec_at_recall(lists: RankedLists, params: Sequence[float]) -> Floats:
    """``iprec_at_recall``: interpolated precision at each recall fraction of ``params`` (ascending)."""
    out = np.zeros((lists.size, len(params)))
    _interpolated_precision(lists.starts, lists.rels, lists.num_rel, lists.num_rel_ret,
                            np.asarray(params, dtype=np.float64), lists.level, out)
    return out


def eleven_point_average(lists: RankedLists, params: Sequence[float]) -> Floats:
    """``11pt_avg``: the mean of ``iprec_at_recall`` over the recall fractions of ``params``."""
    fractions = sorted(params)
    return _column(iprec_at_recall(lists, fractions)[:, ::-1].sum(axis=1) / len(fractions))


def rprec_mult(lists: RankedLists, params: Sequence[float]) -> Floats:
    """``Rprec_mult``: precision at each multiple of R of ``params`` (ascending)."""
    out = np.zeros((lists.size, len(params)))
    _rprec_mult(lists.starts, lists.rels, lists.num_rel, lists.num_rel_ret, np.asarray(params, dtype=np.float64),
                lists.level, out)
    return out


def relative_precision(lists: RankedLists, params: Sequence[float]) -> Floats:
    """``relative_P``: relevant documents in the top k over min(k, R), at each cutoff k of ``params``."""
    cutoffs = np.asarray(params, dtype=np.int64)
    hits = np.zeros((lists.size, cutoffs.shape[0]), dtype=np.int64)
    _hits(lists.starts, lists.rels, cutoffs, lists.level, hits)
    return _ratio(hits, np.minimum(cutoffs[None, :], lists.num_rel[:, None]))


def bin_g(lists: RankedLists, params: Sequence[float] = ()) -> Floats:
    """``binG``: per relevant retrieved document 1 / log2(2 + non-relevant documents above it), over R."""
    out = np.zeros(lists.size)
    _bin_g(lists.starts, lists.rels, lists.num_rel, lists.level, out)
    return _column(out)


def gain_measures(lists: RankedLists, params: Sequence[float] = ()) -> Floats:
    """``ndcg``, ``ndcg_rel``, ``Rndcg`` and ``G``, in that order (columns)."""
    out = np.zeros((lists.size, 4))
    _gain_measures(lists.starts, lists.rels, lists.judged_starts, lists.judged, lists.num_rel, out)
    return out


def utility(lists: RankedLists, params: Sequence[float]) -> Floats:
    """``utility``: p1 * relevant retrieved + p2 * non-relevant retrieved + p3 * relevant not retrieved + p4 * the
    rest of the collection (whose size trec_eval's ``-N`` gives; 0 here, as its default)."""
    if len(params) != 4:
        raise ValueError("utility takes four coefficients")
    a, ret, rel = lists.num_rel_ret, lists.num_ret, lists.num_rel
    p1, p2, p3, p4 = params
    return _column(p1 * a + p2 * (ret - a) + p3 * (rel - a) + p4 * (0 + a - ret - rel))


def set_measures(lists: RankedLists, params: Sequence[float] = (1.0,)) -> Floats:
    """``set_P``, ``set_relative_P``, ``set_recall``, ``set_map`` and ``set_F`` (F with ``params[0]`` the weight
    of recall), in that order: the retrieved list taken as a set."""
    a = lists.num_rel_ret.astype(np.float64)
    ret, rel = lists.num_ret.astype(np.float64), lists.num_rel.astype(np.float64)
    precision, recall = _ratio(a, ret), _ratio(a, rel)
    x = float(params[0]) if params else 1.0
    f = np.zeros_like(a)
    hit = a > 0
    f[hit] = (x + 1.0) * precision[hit] * recall[hit] / (x * precision[hit] + recall[hit])
    both = (ret > 0) & (rel > 0)
    return np.stack([precision, np.where(both, _ratio(a, np.minimum(ret, rel)), 0.0), recall,
                     np.where(both, _ratio(a * a, ret * rel), 0.0), f], axis=1)


def relstring(lists: RankedLists, length: int) -> list[str]:
    """``relstring``: the relevance of the first ``length`` retrieved documents, one character each: the grade
    0-9, ``>`` above 9, ``-`` not in the qrels, ``.`` in them unjudged (negative).

    >>> relstring(RankedLists.build([[1, NONPOOL, UNJUDGED, 12]], [[1]], 1), 10)
    ['1-.>']
    """
    def char(rel: int) -> str:
        return ">" if rel > 9 else str(rel) if rel >= 0 else "-" if rel == NONPOOL else "." if rel == UNJUDGED else "<"

    rels = lists.rels.tolist()
    return ["".join(char(r) for r in rels[lo:lo + max(min(length, hi - lo), 0)])
            for lo, hi in zip(lists.starts[:-1].tolist(), lists.starts[1:].tolist(), strict=True)]


#: The list measures by key: each gives one column per value (a cutoff, a fraction, or one of several measures).
LIST_MEASURES: dict[str, Callable[[RankedLists, Sequence[float]], Floats]] = {
    "counts": counts,
    "bpref": bpref,
    "infAP": inf_ap,
    "iprec_at_recall": iprec_at_recall,
    "11pt_avg": eleven_point_average,
    "Rprec_mult": rprec_mult,
    "relative_P": relative_precision,
    "binG": bin_g,
    "gains": gain_measures,
    "utility": utility,
    "set": set_measures,
}
