"""Vectorised per-request list metrics over a batch of requests in sparse form.

A batch holds only the judged items (everything else has gain 0, is not relevant and is unjudged): for each
request its number of served items, the (position, grade) of its judged shown items and the grades of its judged
items that were not shown. All measures are computed from these arrays with numpy (bincount, lexsort); the cost is
proportional to the judged items, not to the served list length. Which kernel computes which measure, with which
parameters, is the registry's business (:mod:`stream_eval.metrics.specs`); a kernel takes the prepared batch, the
cutoff and the measure's resolved parameters.

Every value of a request depends only on that request's own entries, in a canonical order, so it is the
same bit for bit whatever else is in the batch: the replay and the streaming worker agree exactly.

References: Järvelin & Kekäläinen (2002) for (n)DCG; Chapelle et al. (2009) for ERR; Moffat & Zobel (2008) for
RBP and its residual; trec_eval's ``recip_rank``, ``map``, ``P``, ``recall``, ``Rprec``, ``success`` and
``ndcg_cut`` for the conventions (IDCG over all judged items, ``P@k`` divided by k even when fewer were served,
unjudged = non-relevant); ir_measures' ``Judged`` (divided by min(k, served)).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from stream_eval.config import Config
    from stream_eval.metrics.specs import MetricSpec

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
#: A measure's parameters, every one resolved (the name's value, else the global setting).
Params = Mapping[str, "float | str"]


@dataclasses.dataclass(slots=True)
class JudgedBatch:
    """``B`` requests: served lengths plus their judged items, in any order.

    ``shown_*`` arrays describe judged items that were served (1-based ``shown_pos``), grade 0 included (judged
    non-relevant: ``Judged@k`` and the RBP residual tell them from unjudged items); ``unshown_*`` the judged items
    that were not served (only those with grade > 0 matter). ``*_req`` is the request's index in ``0..B-1``.

    What users did, for the behaviour measures (``None``: nothing, no click): ``click_req``, ``click_pos`` the served
    items clicked, each (request, position) once; ``first_click`` the seconds from serve time to the request's first
    click (NaN: none); ``satisfied`` whether a click had a long dwell or a satisfying kind was given (README,
    "Behaviour measures").
    """

    n_shown: Ints
    shown_req: Ints
    shown_pos: Ints
    shown_grade: Floats
    unshown_req: Ints
    unshown_grade: Floats
    click_req: Ints | None = None
    click_pos: Ints | None = None
    first_click: Floats | None = None
    satisfied: Bools | None = None

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
        """From ``(request, position, grade)`` and ``(request, grade)`` tuples (grade 0 = judged non-relevant)."""
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


class Prepared:
    """Derived arrays shared by the kernels of one batch: the graded served entries sorted by (request,
    position), and per relevance threshold and gain (computed once each, on first use) relevance, R and the
    ideal gains."""

    __slots__ = ("size", "req", "pos", "grade", "n_shown", "_batch", "_judged_req", "_judged_grade",
                 "_judged_rank", "_relevant", "_n_relevant", "_ideal", "_judged_shown", "_clicks", "_clicked")

    def __init__(self, batch: JudgedBatch) -> None:
        self.size = batch.size
        self.n_shown = batch.n_shown
        self._batch = batch
        keep = batch.shown_grade > 0
        order = pair_order(batch.shown_req[keep], batch.shown_pos[keep])  # the join hands them over in order
        self.req: Ints = batch.shown_req[keep][order]
        self.pos: Ints = batch.shown_pos[keep][order]
        self.grade: Floats = batch.shown_grade[keep][order]
        graded_unshown = batch.unshown_grade > 0
        judged_req = np.concatenate([self.req, batch.unshown_req[graded_unshown]])
        judged_grade = np.concatenate([self.grade, batch.unshown_grade[graded_unshown]])
        ideal = np.lexsort((-judged_grade, judged_req))
        self._judged_req: Ints = judged_req[ideal]
        self._judged_grade: Floats = judged_grade[ideal]
        self._judged_rank: Ints = _rank_in_segment(self._judged_req, self.size)
        self._relevant: dict[float, Bools] = {}
        self._n_relevant: dict[float, Ints] = {}
        self._judged_shown: tuple[Ints, Ints] | None = None
        self._ideal: dict[str, Floats] = {}
        self._clicks: tuple[Ints, Ints] | None = None
        self._clicked: dict[int | None, Floats] = {}

    def relevant(self, rel: float) -> Bools:
        """Which served entries are relevant at threshold ``rel``."""
        found = self._relevant.get(rel)
        if found is None:
            found = self._relevant[rel] = self.grade >= rel
        return found

    def n_relevant(self, rel: float) -> Ints:
        """R per request: its relevant judged items at threshold ``rel``, served or not."""
        found = self._n_relevant.get(rel)
        if found is None:
            relevant = self._judged_req[self._judged_grade >= rel]
            found = self._n_relevant[rel] = np.bincount(relevant, minlength=self.size)
        return found

    def ideal_dcg_terms(self, gain: str) -> tuple[Ints, Ints, Floats]:
        """Request, 0-based ideal rank and discounted gain of every judged grade > 0 (grades sorted descending)."""
        terms = self._ideal.get(gain)
        if terms is None:
            terms = self._ideal[gain] = GAINS[gain](self._judged_grade) / np.log2(self._judged_rank + 2.0)
        return self._judged_req, self._judged_rank, terms

    def judged_shown(self) -> tuple[Ints, Ints]:
        """Request and position of every judged served item, grade 0 included, sorted (the join's order)."""
        if self._judged_shown is None:
            req, pos = self._batch.shown_req, self._batch.shown_pos
            order = pair_order(req, pos)
            self._judged_shown = req[order], pos[order]
        return self._judged_shown


    # -- what users did -------------------------------------------------------------------------------------------
    def clicks(self) -> tuple[Ints, Ints]:
        """Request and position of every clicked served item, each once."""
        if self._clicks is None:
            batch = self._batch
            if batch.click_req is None or batch.click_pos is None:
                self._clicks = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
            else:
                self._clicks = batch.click_req, batch.click_pos
        return self._clicks

    def clicked(self, k: int | None = None) -> Floats:
        """Clicked served items per request (in the top ``k``; ``None``: anywhere), computed once per ``k``."""
        found = self._clicked.get(k)
        if found is None:
            req, pos = self.clicks()
            found = self._clicked[k] = _count_per_request(self, req if k is None else req[pos <= k])
        return found

    def shown_nothing(self) -> Bools:
        """Requests that served an empty list (zero results)."""
        nothing: Bools = self.n_shown == 0
        return nothing

    def first_click(self) -> Floats:
        """Seconds from serve time to each request's first click (NaN: none), a new array."""
        first = self._batch.first_click
        return np.full(self.size, np.nan) if first is None else np.array(first, dtype=np.float64)

    def satisfied(self) -> Floats:
        """1.0 for each request with a satisfied click or a satisfying kind, else 0.0 (a new array)."""
        satisfied = self._batch.satisfied
        return np.zeros(self.size) if satisfied is None else np.array(satisfied, dtype=np.float64)


def pair_order(major: Ints, minor: Ints, stable: bool = True) -> Ints:
    """The order that sorts rows by ``(major, minor)``, as ``np.lexsort((minor, major))`` (with ``stable=False``,
    rows with equal pairs may come in any order among themselves).

    The two integer columns are sorted as one int64 key when it fits (faster than lexsort, stable or not:
    docs/benchmarks.md, "Facts moved from code comments"), and rows already in order cost one comparison pass.

    >>> pair_order(np.array([1, 0, 1, 0]), np.array([5, 7, -2, 7])).tolist()
    [1, 3, 2, 0]
    """
    n = major.shape[0]
    if n < 2:
        return np.arange(n)
    low_major, low_minor = int(major.min()), int(minor.min())
    span = int(minor.max()) - low_minor + 1
    order: Ints
    if (int(major.max()) - low_major + 1) * span >= 2**62:  # the key would not fit
        order = np.lexsort((minor, major))
        return order
    key = (major - low_major) * span + (minor - low_minor)
    if bool((key[1:] >= key[:-1]).all()):
        return np.arange(n)
    order = np.argsort(key, kind="stable" if stable else None)
    return order


def _rank_in_segment(req: Ints, size: int) -> Ints:
    """0-based index of each entry within its request's run (``req`` sorted)."""
    starts = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(np.bincount(req, minlength=size), out=starts[1:])
    return np.arange(req.shape[0], dtype=np.int64) - starts[req]


def _sum_per_request(prep: Prepared, req: Ints, weights: Floats) -> Floats:
    return np.bincount(req, weights=weights, minlength=prep.size).astype(np.float64, copy=False)


def _count_per_request(prep: Prepared, req: Ints) -> Floats:
    return np.bincount(req, minlength=prep.size).astype(np.float64)


def _exp_gain(grade: Floats) -> Floats:
    return np.exp2(grade) - 1.0


def _linear_gain(grade: Floats) -> Floats:
    return grade.astype(np.float64, copy=True)


GAINS: dict[str, Callable[[Floats], Floats]] = {"exp": _exp_gain, "linear": _linear_gain}


def _ratio(numerator: Floats, denominator: Floats) -> Floats:
    out = np.zeros_like(numerator)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def _cutoff(k: int | None) -> int:
    assert k is not None, "the registry gives this family a cutoff"
    return k


def _rel(params: Params) -> float:
    return float(params["rel"])


# -- kernels: (prepared batch, cutoff, resolved parameters) -> one value per request ----------------------------
def reciprocal_rank(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``RR``: 1 / position of the first relevant served item, 0 if none was served."""
    relevant = prep.relevant(_rel(params))
    first_req, first_index = np.unique(prep.req[relevant], return_index=True)
    out = np.zeros(prep.size)
    out[first_req] = 1.0 / prep.pos[relevant][first_index]
    return out


def _hits(prep: Prepared, k: int, rel: float) -> Floats:
    return _count_per_request(prep, prep.req[prep.relevant(rel) & (prep.pos <= k)])


def precision(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``P@k``: relevant items in the top k, divided by k (even if fewer than k were served)."""
    return _hits(prep, _cutoff(k), _rel(params)) / _cutoff(k)


def recall(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``R@k``: relevant items in the top k divided by R, all relevant judged items (shown or not)."""
    rel = _rel(params)
    return _ratio(_hits(prep, _cutoff(k), rel), prep.n_relevant(rel).astype(np.float64))


def success(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``Success@k``: 1 if a relevant item is in the top k, else 0 (trec_eval's ``success``)."""
    return (_hits(prep, _cutoff(k), _rel(params)) > 0).astype(np.float64)


def r_precision(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``R-Prec``: relevant items in the top R divided by R (R even when fewer were served; trec_eval's ``Rprec``)."""
    rel = _rel(params)
    n_relevant = prep.n_relevant(rel)
    relevant = prep.relevant(rel)
    req = prep.req[relevant]
    within = prep.pos[relevant] <= n_relevant[req]
    return _ratio(_count_per_request(prep, req[within]), n_relevant.astype(np.float64))


def average_precision(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``AP``: sum of P@i over relevant served positions i, divided by R (unserved relevant items count);
    ``AP@k`` only over positions i <= k (trec_eval's ``map_cut``)."""
    rel = _rel(params)
    relevant = prep.relevant(rel) if k is None else prep.relevant(rel) & (prep.pos <= k)
    req = prep.req[relevant]
    nth = _rank_in_segment(req, prep.size) + 1
    return _ratio(_sum_per_request(prep, req, nth / prep.pos[relevant]), prep.n_relevant(rel).astype(np.float64))


def _dcg(prep: Prepared, k: int, gain: str) -> Floats:
    top = prep.pos <= k
    return _sum_per_request(prep, prep.req[top], GAINS[gain](prep.grade[top]) / np.log2(prep.pos[top] + 1.0))


def dcg(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``DCG@k`` = sum over the top k of gain(g_i) / log2(i + 1); gain ``exp`` (2^g - 1) or ``linear`` (g)."""
    return _dcg(prep, _cutoff(k), str(params["gain"]))


def ndcg(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``nDCG@k`` = DCG@k / IDCG@k, the ideal taken over all judged grades of the request, shown or not."""
    gain = str(params["gain"])
    req, rank, terms = prep.ideal_dcg_terms(gain)
    top = rank < _cutoff(k)
    return _ratio(_dcg(prep, _cutoff(k), gain), _sum_per_request(prep, req[top], terms[top]))


def expected_reciprocal_rank(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``ERR@k`` = sum_r (1/r) R_r prod_{i<r} (1 - R_i), R_i = (2^g_i - 1) / 2^max_grade (grades capped)."""
    top = prep.pos <= _cutoff(k)
    req, pos = prep.req[top], prep.pos[top]
    max_grade = float(params["max_grade"])
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


def judged(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``Judged@k``: judged items (any grade, 0 included) in the top k, divided by min(k, served) (ir_measures);
    without a cutoff, over the whole served list."""
    req, pos = prep.judged_shown()
    depth = prep.n_shown if k is None else np.minimum(prep.n_shown, k)
    return _ratio(_count_per_request(prep, req[pos <= depth[req]]), depth.astype(np.float64))


def rank_biased_precision(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``RBP(p)`` = (1 - p) sum over relevant served positions i of p^(i - 1) (Moffat & Zobel 2008; binary at
    ``rel``, unjudged = non-relevant, as ir_measures' ``RBP(rel=...)``)."""
    p = float(params["p"])
    relevant = prep.relevant(_rel(params))
    return _sum_per_request(prep, prep.req[relevant], (1.0 - p) * p ** (prep.pos[relevant] - 1.0))


def rank_biased_residual(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``RBP-Res(p)``: how much RBP could still grow, the weight of the unjudged served positions plus that of the
    positions beyond the list, p^n: 1 - (1 - p) sum over judged served positions i of p^(i - 1).
    RBP lies in [RBP, RBP + RBP-Res] whatever the unjudged and unseen items turn out to be."""
    p = float(params["p"])
    req, pos = prep.judged_shown()
    return 1.0 - _sum_per_request(prep, req, (1.0 - p) * p ** (pos - 1.0))


# -- behaviour kernels: of the clicks, dwell and feedback kinds; undefined (NaN) where nothing was served ----------
def _of_shown(prep: Prepared, values: Floats) -> Floats:
    values[prep.shown_nothing()] = np.nan
    return values


def click_through(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``CTR@k``: 1 if a served item in the top k was clicked, else 0; its mean is the click-through rate over
    requests (queries), the share of them with a click in the top k."""
    return _of_shown(prep, (prep.clicked(_cutoff(k)) > 0).astype(np.float64))


def clicks(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``Clicks``: the served items clicked (each once, however often); ``Clicks@k``: in the top k. Its mean is
    clicks per query."""
    return _of_shown(prep, prep.clicked(k).copy())  # (the counts are cached: not changed in place)


def abandoned(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``Abandoned``: 1 if results were shown and none was clicked, else 0."""
    return _of_shown(prep, (prep.clicked() == 0).astype(np.float64))


def zero_result(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``ZeroResult``: 1 for a request that served an empty list, else 0 (defined for every request)."""
    return prep.shown_nothing().astype(np.float64)


def time_to_first_click(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``TimeToFirstClick``: seconds from serve time to the first click on a served item, 0 for a click stamped
    before its ranking (clocks that disagree: a negative value would also make the exported sum fall); undefined
    without a click, so its mean is over the requests with a click."""
    return _of_shown(prep, np.maximum(prep.first_click(), 0.0))


def sat_click(prep: Prepared, k: int | None, params: Params) -> Floats:
    """``SatClick``: 1 if a served item got a click with dwell >= ``sat_dwell`` or feedback of a kind in
    ``sat_kinds``, else 0."""
    return _of_shown(prep, prep.satisfied())


#: The signature of every kernel in :data:`stream_eval.metrics.specs.REGISTRY`.
Kernel = Callable[[Prepared, "int | None", Params], Floats]


@dataclasses.dataclass(slots=True)
class BatchValues:
    """Per-request values of a batch: ``values[:, j]`` is ``specs[j]``; NaN means left out of means."""

    specs: tuple[MetricSpec, ...]
    values: Floats
    empty: Bools
    n_relevant: Ints


def evaluate_batch(batch: JudgedBatch, config: Config, specs: Sequence[MetricSpec] | None = None) -> BatchValues:
    """All list measures of ``specs`` (default: the config's) for every request of ``batch``, with the ``empty``
    policy applied. Columns of measures without a kernel (``alpha-nDCG``) are left NaN for the caller to fill.
    """
    chosen = tuple(specs) if specs is not None else config.specs
    prep = Prepared(batch)
    values = np.full((prep.size, len(chosen)), np.nan)
    params = [spec.resolve(config) for spec in chosen]
    for j, spec in enumerate(chosen):
        kernel = spec.definition.kernel
        if kernel is not None:
            values[:, j] = kernel(prep, spec.k, params[j])
    n_relevant = prep.n_relevant(config.rel_threshold)
    apply_empty_policy(values, chosen, params, prep, config)
    return BatchValues(chosen, values, (n_relevant == 0) & ~prep.shown_nothing(), n_relevant)


def apply_empty_policy(values: Floats, specs: Sequence[MetricSpec], params: Sequence[Params], prep: Prepared,
                       config: Config) -> None:
    """Requests with no relevant judged item: ``zero`` sets the measures the registry zeroes to 0, ``skip`` leaves
    them out. A measure with a relevance threshold ``rel`` judges emptiness at its own threshold, others at
    ``rel_threshold``. Relevance measures of a request that served nothing are undefined (NaN), whatever the
    policy; behaviour measures are not about relevance and keep their values."""
    nothing = prep.shown_nothing()
    for j, spec in enumerate(specs):
        definition = spec.definition
        if definition.scope != "relevance":
            continue
        rel = _rel(params[j]) if definition.relevance else config.rel_threshold
        empty = prep.n_relevant(rel) == 0
        if config.empty == "skip":
            values[empty, j] = np.nan
        elif definition.zeroed and definition.kernel is not None:
            values[empty, j] = 0.0
        values[nothing, j] = np.nan


def evaluate_request(
    grades: Sequence[float | None],
    config: Config,
    unshown: Sequence[float] = (),
    specs: Sequence[MetricSpec] | None = None,
) -> dict[str, float]:
    """Measures of one request from the grades of its served items in order (``None``: unjudged), plus the
    grades of judged items that were not served.

    The seeds' nDCG example (linear gain, shown items 3, 2, 3, 0, 1, 2):

    >>> from stream_eval.config import Config
    >>> linear = Config(gain="linear", cutoffs=(6,))
    >>> round(evaluate_request([3, 2, 3, 0, 1, 2], linear)["nDCG@6"], 3)
    0.961
    >>> round(evaluate_request([3, 2, 3, 0, 1, 2], linear, unshown=[3, 2])["nDCG@6"], 3)
    0.785
    >>> evaluate_request([1, None, 0], Config(metrics=("Judged@3",)))["Judged@3"]  # doctest: +ELLIPSIS
    0.666...
    """
    shown = [(0, i + 1, float(g)) for i, g in enumerate(grades) if g is not None]
    batch = JudgedBatch.from_lists([len(grades)], shown, [(0, float(g)) for g in unshown if g > 0])
    result = evaluate_batch(batch, config, specs)
    return {spec.name: float(result.values[0, j]) for j, spec in enumerate(result.specs)}
