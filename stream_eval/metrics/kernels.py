"""Vectorised per-request list metrics over a batch of requests in sparse form.

A batch holds only the judged items with a grade > 0 (everything else has gain 0 and is not relevant):
for each request its number of served items, the (position, grade) of its judged shown items and the
grades of its judged items that were not shown. All families are computed from these arrays with numpy
(bincount, lexsort); the cost is proportional to the judged items, not to the served list length.

Every value of a request depends only on that request's own entries, in a canonical order, so it is the
same bit for bit whatever else is in the batch: the replay and the streaming worker agree exactly.

References: Järvelin & Kekäläinen (2002) for (n)DCG; Chapelle et al. (2009) for ERR; trec_eval's
``recip_rank``, ``map``, ``P``, ``recall`` and ``ndcg_cut`` for the conventions (IDCG over all judged
items, ``P@k`` divided by k even when fewer were served).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from stream_eval.config import Config
from stream_eval.metrics.specs import ZEROED_WHEN_EMPTY, MetricSpec, request_specs

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


@dataclasses.dataclass(slots=True)
class JudgedBatch:
    """``B`` requests: served lengths plus their judged items with grade > 0, in any order.

    ``shown_*`` arrays describe judged items that were served (1-based ``shown_pos``); ``unshown_*`` the
    judged items that were not. ``*_req`` is the request's index in ``0..B-1``.
    """

    n_shown: Ints
    shown_req: Ints
    shown_pos: Ints
    shown_grade: Floats
    unshown_req: Ints
    unshown_grade: Floats

    @property
    def size(self) -> int:
        return int(self.n_shown.shape[0])

    @classmethod
    def from_lists(
        cls,
        n_shown: Sequence[int],
        shown: Sequence[tuple[int, int, float]],
        unshown: Sequence[tuple[int, float]] = (),
    ) -> JudgedBatch:
        """From ``(request, position, grade)`` and ``(request, grade)`` tuples; zero grades are dropped."""
        shown_arr = np.array(shown, dtype=np.float64).reshape(-1, 3)
        unshown_arr = np.array(unshown, dtype=np.float64).reshape(-1, 2)
        return cls(
            np.asarray(n_shown, dtype=np.int64),
            shown_arr[:, 0].astype(np.int64),
            shown_arr[:, 1].astype(np.int64),
            shown_arr[:, 2].copy(),
            unshown_arr[:, 0].astype(np.int64),
            unshown_arr[:, 1].copy(),
        )


class _Prepared:
    """Derived arrays shared by the kernels of one batch (sorted entries, relevance, R, IDCG ranks)."""

    __slots__ = ("size", "req", "pos", "grade", "rel", "n_relevant", "judged_req", "judged_gain_rank", "judged_gain",
                 "gain", "config")

    def __init__(self, batch: JudgedBatch, config: Config) -> None:
        self.size = batch.size
        self.config = config
        keep = batch.shown_grade > 0
        order = pair_order(batch.shown_req[keep], batch.shown_pos[keep])  # the join hands them over in order
        self.req: Ints = batch.shown_req[keep][order]
        self.pos: Ints = batch.shown_pos[keep][order]
        self.grade: Floats = batch.shown_grade[keep][order]
        self.gain = _GAINS[config.gain]
        self.rel = self.grade >= config.rel_threshold
        judged_req = np.concatenate([self.req, batch.unshown_req[batch.unshown_grade > 0]])
        judged_grade = np.concatenate([self.grade, batch.unshown_grade[batch.unshown_grade > 0]])
        self.n_relevant: Ints = np.bincount(judged_req[judged_grade >= config.rel_threshold], minlength=self.size)
        ideal = np.lexsort((-judged_grade, judged_req))
        self.judged_req: Ints = judged_req[ideal]
        self.judged_gain = self.gain(judged_grade[ideal])
        self.judged_gain_rank: Ints = _rank_in_segment(self.judged_req, self.size)


def pair_order(major: Ints, minor: Ints, stable: bool = True) -> Ints:
    """The order that sorts rows by ``(major, minor)``, as ``np.lexsort((minor, major))`` (with ``stable=False``,
    rows with equal pairs may come in any order among themselves).

    The two integer columns are sorted as one int64 key when it fits (a third of lexsort's time unstable, two
    thirds stable), and rows already in order cost one comparison pass.

    >>> pair_order(np.array([1, 0, 1, 0]), np.array([5, 7, -2, 7])).tolist()
    [1, 3, 2, 0]
    """
    n = major.shape[0]
    if n < 2:
        return np.arange(n)
    low_major, low_minor = int(major.min()), int(minor.min())
    span = int(minor.max()) - low_minor + 1
    if (int(major.max()) - low_major + 1) * span >= 2**62:  # the key would not fit
        return np.lexsort((minor, major))
    key = (major - low_major) * span + (minor - low_minor)
    if bool((key[1:] >= key[:-1]).all()):
        return np.arange(n)
    order: Ints = np.argsort(key, kind="stable" if stable else None)
    return order


def _rank_in_segment(req: Ints, size: int) -> Ints:
    """0-based index of each entry within its request's run (``req`` sorted)."""
    starts = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(np.bincount(req, minlength=size), out=starts[1:])
    return np.arange(req.shape[0], dtype=np.int64) - starts[req]


def _sum_per_request(prep: _Prepared, req: Ints, weights: Floats) -> Floats:
    return np.bincount(req, weights=weights, minlength=prep.size).astype(np.float64, copy=False)


def _count_per_request(prep: _Prepared, req: Ints) -> Floats:
    return np.bincount(req, minlength=prep.size).astype(np.float64)


def _exp_gain(grade: Floats) -> Floats:
    return np.exp2(grade) - 1.0


def _linear_gain(grade: Floats) -> Floats:
    return grade.astype(np.float64, copy=True)


_GAINS: dict[str, Callable[[Floats], Floats]] = {"exp": _exp_gain, "linear": _linear_gain}


def _ratio(numerator: Floats, denominator: Floats) -> Floats:
    out = np.zeros_like(numerator)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def reciprocal_rank(prep: _Prepared, k: int | None) -> Floats:
    """``RR``: 1 / position of the first relevant served item, 0 if none was served."""
    req = prep.req[prep.rel]
    first_req, first_index = np.unique(req, return_index=True)
    out = np.zeros(prep.size)
    out[first_req] = 1.0 / prep.pos[prep.rel][first_index]
    return out


def precision(prep: _Prepared, k: int | None) -> Floats:
    """``P@k``: relevant items in the top k, divided by k (even if fewer than k were served)."""
    assert k is not None
    return _count_per_request(prep, prep.req[prep.rel & (prep.pos <= k)]) / k


def recall(prep: _Prepared, k: int | None) -> Floats:
    """``R@k``: relevant items in the top k divided by R, all relevant judged items (shown or not)."""
    assert k is not None
    hits = _count_per_request(prep, prep.req[prep.rel & (prep.pos <= k)])
    return _ratio(hits, prep.n_relevant.astype(np.float64))


def average_precision(prep: _Prepared, k: int | None) -> Floats:
    """``AP``: sum of P@i over relevant served positions i, divided by R (unserved relevant items count)."""
    req = prep.req[prep.rel]
    pos = prep.pos[prep.rel]
    nth = _rank_in_segment(req, prep.size) + 1
    return _ratio(_sum_per_request(prep, req, nth / pos), prep.n_relevant.astype(np.float64))


def _dcg(prep: _Prepared, k: int) -> Floats:
    top = prep.pos <= k
    return _sum_per_request(prep, prep.req[top], prep.gain(prep.grade[top]) / np.log2(prep.pos[top] + 1.0))


def _ideal_dcg(prep: _Prepared, k: int) -> Floats:
    top = prep.judged_gain_rank < k
    return _sum_per_request(
        prep, prep.judged_req[top], prep.judged_gain[top] / np.log2(prep.judged_gain_rank[top] + 2.0)
    )


def dcg(prep: _Prepared, k: int | None) -> Floats:
    """``DCG@k`` = sum over the top k of gain(g_i) / log2(i + 1); gain ``exp`` (2^g - 1) or ``linear`` (g)."""
    assert k is not None
    return _dcg(prep, k)


def ndcg(prep: _Prepared, k: int | None) -> Floats:
    """``nDCG@k`` = DCG@k / IDCG@k, the ideal taken over all judged grades of the request, shown or not."""
    assert k is not None
    return _ratio(_dcg(prep, k), _ideal_dcg(prep, k))


def expected_reciprocal_rank(prep: _Prepared, k: int | None) -> Floats:
    """``ERR@k`` = sum_r (1/r) R_r prod_{i<r} (1 - R_i), R_i = (2^g_i - 1) / 2^max_grade (grades capped)."""
    assert k is not None
    top = prep.pos <= k
    req, pos = prep.req[top], prep.pos[top]
    max_grade = prep.config.max_grade
    stop = (np.exp2(np.minimum(prep.grade[top], max_grade)) - 1.0) / np.exp2(max_grade)
    # Entries are sorted by (request, position): walk the j-th judged entry of every request at once.
    nth = _rank_in_segment(req, prep.size)
    out = np.zeros(prep.size)
    keep_going = np.ones(prep.size)
    for j in range(int(nth.max()) + 1 if nth.size else 0):
        at = nth == j
        r = req[at]
        out[r] += keep_going[r] * stop[at] / pos[at]
        keep_going[r] *= 1.0 - stop[at]
    return out


Kernel = Callable[[_Prepared, int | None], Floats]
#: The registry: one kernel per family (alpha-nDCG needs subtopics and lives in ``alpha.py``).
KERNELS: dict[str, Kernel] = {
    "RR": reciprocal_rank,
    "AP": average_precision,
    "P": precision,
    "R": recall,
    "DCG": dcg,
    "nDCG": ndcg,
    "ERR": expected_reciprocal_rank,
}


@dataclasses.dataclass(slots=True)
class BatchValues:
    """Per-request values of a batch: ``values[:, j]`` is ``specs[j]``; NaN means left out of means."""

    specs: tuple[MetricSpec, ...]
    values: Floats
    empty: npt.NDArray[np.bool_]
    n_relevant: Ints


def evaluate_batch(batch: JudgedBatch, config: Config, specs: Sequence[MetricSpec] | None = None) -> BatchValues:
    """All list metrics of ``specs`` for every request of ``batch``, with the ``empty`` policy applied.

    Columns of families without a kernel here (``alpha-nDCG``) are left NaN for the caller to fill.
    """
    chosen = tuple(specs) if specs is not None else request_specs(config)
    prep = _Prepared(batch, config)
    values = np.full((prep.size, len(chosen)), np.nan)
    for j, spec in enumerate(chosen):
        kernel = KERNELS.get(spec.family)
        if kernel is not None:
            values[:, j] = kernel(prep, spec.k)
    empty = prep.n_relevant == 0
    apply_empty_policy(values, chosen, empty, config)
    return BatchValues(chosen, values, empty, prep.n_relevant)


def apply_empty_policy(
    values: Floats, specs: Sequence[MetricSpec], empty: npt.NDArray[np.bool_], config: Config
) -> None:
    """Requests with no relevant judged item: ``zero`` sets the SPEC's metrics to 0, ``skip`` leaves all out."""
    if not empty.any():
        return
    if config.empty == "skip":
        values[empty, :] = np.nan
        return
    for j, spec in enumerate(specs):
        if spec.family in ZEROED_WHEN_EMPTY and spec.family in KERNELS:
            values[empty, j] = 0.0


def evaluate_request(
    grades: Sequence[float],
    config: Config,
    unshown: Sequence[float] = (),
    specs: Sequence[MetricSpec] | None = None,
) -> dict[str, float]:
    """Metrics of one request from the grades of its served items in order, plus unserved judged grades.

    The seeds' nDCG example (linear gain, shown items 3, 2, 3, 0, 1, 2):

    >>> from stream_eval.config import Config
    >>> linear = Config(gain="linear", cutoffs=(6,))
    >>> round(evaluate_request([3, 2, 3, 0, 1, 2], linear)["nDCG@6"], 3)
    0.961
    >>> round(evaluate_request([3, 2, 3, 0, 1, 2], linear, unshown=[3, 2])["nDCG@6"], 3)
    0.785
    """
    shown = [(0, i + 1, float(g)) for i, g in enumerate(grades) if g > 0]
    batch = JudgedBatch.from_lists([len(grades)], shown, [(0, float(g)) for g in unshown if g > 0])
    result = evaluate_batch(batch, config, specs)
    return {spec.name: float(result.values[0, j]) for j, spec in enumerate(result.specs)}
