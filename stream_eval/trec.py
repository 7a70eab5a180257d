"""``stream-eval trec QRELS RUN``: a TREC run evaluated as trec_eval 9 evaluates it, printed as it prints it.

Each query of the run that has qrels is ranked as trec_eval ranks it (score descending in single precision, ties
by docno descending, byte order). Two paths give the values, each measure by one of them (:data:`TREC_MEASURES`):

* measures of the registry (``map`` is ``AP``, ``P_5`` is ``P@5``, ...) go through
  :class:`~stream_eval.engine.engine.Engine` as events: one ranking per query and one ``label`` per judged document
  (a negative relevance, trec_eval's "in the pool but unjudged", is no label), with trec_eval's conventions as
  settings: linear gain, empty queries scored 0, relevant from ``-l`` (:func:`at_level`). ``-m`` takes any
  registry name too (``nDCG@10``, ``RBP(p=0.8)``, ``Judged@10``), printed under that name;
* the others (``bpref``, ``infAP``, ``iprec_at_recall``, ``set_F``, ...) need what events do not carry (whether an
  unjudged document is in the qrels, the judged non-relevant documents not retrieved, gain levels): they are
  trec_eval's loops over each query's ranked relevance list (:mod:`stream_eval.metrics.ranked_lists`).

As trec_eval 9 does, queries of the run without qrels are skipped, and so are queries of the qrels missing from the
run unless ``-c`` (then they count 0 in every mean, whose divisor is the number of queries of the qrels). The
output is trec_eval's: ``measure<TAB>qid<TAB>value``, the measures in trec_eval's order whatever the order of
``-m``; ``-q`` adds each query's lines; ``--json`` gives the engine's report with a ``trec`` section.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

import numpy as np
import orjson

from stream_eval.config import Config, ConfigError
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.events.schema import Feedback, Ranking, validate
from stream_eval.metrics.ranked_lists import LIST_MEASURES, MIN_GEO_MEAN, NONPOOL, UNJUDGED, RankedLists, relstring
from stream_eval.metrics.specs import BEHAVIOUR_METRICS, MetricNameError, MetricSpec, parse, select

#: trec_eval's cutoffs of P, recall, ndcg_cut, map_cut and relative_P.
CUTOFFS = (5, 10, 15, 20, 30, 100, 200, 500, 1000)
#: trec_eval's recall points of iprec_at_recall and 11pt_avg.
RECALL_POINTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: Event time of the events made from a run (any time a log may hold).
_TS = 1_000_000_000.0


class TrecError(ConfigError):
    """A qrels or run file that trec_eval would not read, or a measure that is not computed."""


@dataclasses.dataclass(frozen=True, slots=True)
class TrecMeasure:
    """One of trec_eval's measures: how it reads parameters, where its values come from, how it sums up.

    ``params``: ``none``; ``cutoffs`` (``P.5,10``: whole numbers, a value each, ``P_5``); ``fractions``
    (``iprec_at_recall.0.1,0.5``: a value each, ``iprec_at_recall_0.10``); ``floats`` (``set_F.0.5``: one value,
    named ``set_F_0.5``). ``engine``: the registry's name of the value (``{k}`` the cutoff); ``lists``: the key of
    :data:`~stream_eval.metrics.ranked_lists.LIST_MEASURES`, ``column`` the column of its result (for cutoffs and
    fractions, the one of the value). ``summary``: the ``all`` value, the ``mean``, the ``sum``, ``num_rel`` (the
    sum; with ``-c`` over all queries of the qrels), ``geometric`` (mean of logs, not printed per query), ``none``
    (printed per query only), ``num_q`` or ``runid`` (printed in the summary only). ``integer``: printed ``%ld``.
    """

    name: str
    params: str = "none"
    default: tuple[float, ...] = ()
    engine: str | None = None
    lists: str | None = None
    column: int = 0
    summary: str = "mean"
    integer: bool = False

    @property
    def per_query(self) -> bool:
        return self.summary not in ("geometric", "num_q", "runid")


#: trec_eval 9's measures that are computed here, in the order of its measure table: the order of its output.
TREC_MEASURES: dict[str, TrecMeasure] = {m.name: m for m in (
    TrecMeasure("runid", summary="runid"),
    TrecMeasure("num_q", summary="num_q"),
    TrecMeasure("num_ret", lists="counts", column=0, summary="sum", integer=True),
    TrecMeasure("num_rel", lists="counts", column=1, summary="num_rel", integer=True),
    TrecMeasure("num_rel_ret", lists="counts", column=2, summary="sum", integer=True),
    TrecMeasure("map", engine="AP"),
    TrecMeasure("gm_map", engine="AP", summary="geometric"),
    TrecMeasure("Rprec", engine="R-Prec"),
    TrecMeasure("bpref", lists="bpref"),
    TrecMeasure("recip_rank", engine="RR"),
    TrecMeasure("iprec_at_recall", "fractions", RECALL_POINTS, lists="iprec_at_recall"),
    TrecMeasure("P", "cutoffs", CUTOFFS, engine="P@{k}"),
    TrecMeasure("relstring", "floats", (10,), summary="none"),
    TrecMeasure("recall", "cutoffs", CUTOFFS, engine="R@{k}"),
    TrecMeasure("infAP", lists="infAP"),
    TrecMeasure("gm_bpref", lists="bpref", summary="geometric"),
    TrecMeasure("Rprec_mult", "fractions", (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0), lists="Rprec_mult"),
    TrecMeasure("utility", "floats", (1.0, -1.0, 0.0, 0.0), lists="utility"),
    TrecMeasure("11pt_avg", "floats", RECALL_POINTS, lists="11pt_avg"),
    TrecMeasure("binG", lists="binG"),
    TrecMeasure("G", lists="gains", column=3),
    TrecMeasure("ndcg", lists="gains", column=0),
    TrecMeasure("ndcg_rel", lists="gains", column=1),
    TrecMeasure("Rndcg", lists="gains", column=2),
    TrecMeasure("ndcg_cut", "cutoffs", CUTOFFS, engine="nDCG@{k}"),
    TrecMeasure("map_cut", "cutoffs", CUTOFFS, engine="AP@{k}"),
    TrecMeasure("relative_P", "cutoffs", CUTOFFS, lists="relative_P"),
    TrecMeasure("success", "cutoffs", (1, 5, 10), engine="Success@{k}"),
    TrecMeasure("set_P", lists="set", column=0),
    TrecMeasure("set_relative_P", lists="set", column=1),
    TrecMeasure("set_recall", lists="set", column=2),
    TrecMeasure("set_map", lists="set", column=3),
    TrecMeasure("set_F", "floats", (1.0,), lists="set", column=4),
    TrecMeasure("num_nonrel_judged_ret", lists="counts", column=3, summary="sum", integer=True),
)}
#: trec_eval's nicknames (``-m official`` is its default), as it defines them.
NICKNAMES: dict[str, tuple[str, ...]] = {
    "official": ("runid", "num_q", "num_ret", "num_rel", "num_rel_ret", "map", "gm_map", "Rprec", "bpref",
                 "recip_rank", "iprec_at_recall", "P"),
    "set": ("runid", "num_q", "num_ret", "num_rel", "num_rel_ret", "utility", "set_P", "set_recall",
            "set_relative_P", "set_map", "set_F"),
    "all_trec": ("runid", "num_q", "num_ret", "num_rel", "num_rel_ret", "map", "gm_map", "Rprec", "bpref",
                 "recip_rank", "iprec_at_recall", "P", "relstring", "recall", "infAP", "gm_bpref", "utility",
                 "11pt_avg", "ndcg", "relative_P", "Rprec_mult", "success", "map_cut", "ndcg_cut", "ndcg_rel",
                 "Rndcg", "binG", "G", "set_P", "set_recall", "set_relative_P", "set_map", "set_F",
                 "num_nonrel_judged_ret"),
}
#: trec_eval's measures read from other judgment formats (preferences, judgment groups): not computed here.
OTHER_FORMATS = ("all_prefs", "prefs", "qrels_jg")


@dataclasses.dataclass(frozen=True, slots=True)
class Measure:
    """One printed value: its name (trec_eval's ``P_5``, ``iprec_at_recall_0.10``, ``set_F_0.5``, or a registry
    name), the trec_eval measure giving it (``None``: a registry name), the registry name the engine computes it
    under, and the parameters and column of a list measure."""

    trec_name: str
    measure: TrecMeasure | None = None
    engine: str | None = None
    params: tuple[float, ...] = ()
    column: int = 0

    @property
    def summary(self) -> str:
        return "mean" if self.measure is None else self.measure.summary

    @property
    def integer(self) -> bool:
        return self.measure is not None and self.measure.integer

    @property
    def per_query(self) -> bool:
        """Whether trec_eval prints it for each query (with ``-q``)."""
        return self.measure is None or self.measure.per_query


def _read_params(measure: TrecMeasure, text: str, request: str) -> tuple[float, ...]:
    """The parameters of ``-m NAME.TEXT``: cutoffs and fractions sorted, as trec_eval sorts them."""
    if measure.params == "none":
        raise TrecError(f"-m {request}: {measure.name} takes no parameters here")
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) for v in values):
        raise TrecError(f"-m {request}: parameters are finite numbers, comma-separated")
    if measure.params == "cutoffs":
        if not all(v.is_integer() and v >= 1 for v in values):
            raise TrecError(f"-m {request}: cutoffs are positive whole numbers")
        return tuple(sorted(set(values)))
    if measure.params == "fractions":
        return tuple(sorted(set(values)))
    if measure.name == "utility" and len(values) != 4:
        raise TrecError(f"-m {request}: utility takes four coefficients")
    if measure.name == "relstring" and not (values[0].is_integer() and len(values) == 1):
        raise TrecError(f"-m {request}: relstring takes one length")
    return tuple(values)


def _value_name(name: str, kind: str, value: float) -> str:
    return f"{name}_{int(value)}" if kind == "cutoffs" else f"{name}_{value:3.2f}"


def parse_measures(requests: Iterable[str]) -> list[Measure]:
    """trec_eval's ``-m`` arguments (``map``, ``P.5,10``, ``P`` for its default cutoffs, ``P_5``, ``set_F.0.5``;
    ``official``, ``set``, ``all_trec``) and registry names (``nDCG@10``) as the values printed: trec_eval's
    measures in its order, then the registry names in the order given (RBP with its residual); each once.
    Parameters given replace the default (the cutoffs given in several ``-m`` add up; for other parameters the
    first counts, as in trec_eval).

    >>> [m.trec_name for m in parse_measures(["P.10,5", "map", "ndcg_cut_10", "RBP(p=0.8)", "set_F.0.5"])]
    ['map', 'P_5', 'P_10', 'ndcg_cut_10', 'set_F_0.5', 'RBP(p=0.8)', 'RBP-Res(p=0.8)']
    """
    chosen: dict[str, tuple[tuple[float, ...], str] | None] = {}  # measure -> (parameters, as written) or default
    registry: dict[str, None] = {}
    for request in requests:
        if request in NICKNAMES:
            for name in NICKNAMES[request]:
                chosen.setdefault(name, None)
            continue
        if request in OTHER_FORMATS:
            raise TrecError(f"-m {request}: trec_eval's measures of preference and judgment-group qrels are not "
                            "computed here")
        name, dot, text = request.partition(".")
        measure = TREC_MEASURES.get(name)
        if measure is None:  # P_5, iprec_at_recall_0.10
            family, _, text = request.rpartition("_")
            found = TREC_MEASURES.get(family)
            if found is not None and found.params in ("cutoffs", "fractions") and text:
                measure, dot = found, "."
        if measure is None:  # (with its companion: RBP(p=0.8) brings RBP-Res(p=0.8), as in replay)
            registry.update(dict.fromkeys(spec.name for spec in select([_registry_name(request)], ())))
            continue
        if not dot:
            chosen.setdefault(measure.name, None)
            continue
        params = _read_params(measure, text, request)
        before = chosen.get(measure.name)
        if before is not None and measure.params in ("cutoffs", "fractions"):
            params = tuple(sorted(set(before[0]) | set(params)))
        elif before is not None:
            continue
        chosen[measure.name] = (params, text)
    out: list[Measure] = []
    for measure in TREC_MEASURES.values():
        if measure.name not in chosen:
            continue
        given = chosen[measure.name]
        params = measure.default if given is None else given[0]
        if measure.params in ("cutoffs", "fractions"):
            out += [Measure(_value_name(measure.name, measure.params, value), measure,
                            None if measure.engine is None else measure.engine.format(k=int(value)), params, column)
                    for column, value in enumerate(params)]
        else:
            name = measure.name if given is None else f"{measure.name}_{given[1]}"
            out.append(Measure(name, measure, measure.engine, params, measure.column))
    return out + [Measure(name, None, name) for name in registry]


def _registry_name(request: str) -> str:
    try:
        spec = parse(request)
    except MetricNameError as exc:
        known = ", ".join([*NICKNAMES, *TREC_MEASURES])
        raise TrecError(f"-m {request}: not a trec_eval measure computed here ({known}), nor a measure of the "
                        f"registry ({exc})") from None
    if spec.needs_subtopics:
        raise TrecError(f"-m {request}: {spec.family} needs the items' subtopics, which qrels do not have")
    if spec.family in BEHAVIOUR_METRICS:
        raise TrecError(f"-m {request}: {spec.family} is a measure of what users did (clicks, dwell, sessions), "
                        "which qrels and runs do not have; trec evaluates relevance measures")
    return spec.name


@dataclasses.dataclass
class Run:
    """A TREC run: per query, its documents and scores in file order; the run's tag (trec_eval takes the last
    line's)."""

    docs: dict[str, list[tuple[str, float]]]
    tag: str


def _rows(lines: Iterable[bytes], source: str, layout: str, more: bool = False,
          ) -> Iterator[tuple[str, list[str], str, str]]:
    """The non-blank lines of a TREC file of ``layout`` (its column names): ``(where, fields, qid, docno)``, each
    line checked to have one field per column (``more``: at least, the rest of the line ignored) and the same
    document at most once per query.

    Raises:
        TrecError: a line with another number of fields or not UTF-8, or a document twice for one query.
    """
    width = len(layout.split())
    seen: set[tuple[str, str]] = set()
    for number, line in enumerate(lines, start=1):
        where = f"{source}:{number}"
        try:
            fields = line.decode().split()
        except UnicodeDecodeError:
            raise TrecError(f"{where}: not UTF-8 text") from None
        if not fields:
            continue
        if len(fields) < width or (len(fields) > width and not more):
            expected = f"at least {width}" if more else str(width)
            raise TrecError(f"{where}: expected {expected} fields ({layout}), got {len(fields)}")
        qid, docno = fields[0], fields[2]
        if (qid, docno) in seen:
            raise TrecError(f"{where}: document {docno!r} appears twice for query {qid!r}")
        seen.add((qid, docno))
        yield where, fields[:width], qid, docno


def read_qrels(lines: Iterable[bytes], source: str = "qrels") -> dict[str, dict[str, int]]:
    """``qid iter docno rel`` lines: per query, each document's relevance.

    Raises:
        TrecError: a line without four fields, a relevance that is not an integer, a document judged twice.
    """
    qrels: dict[str, dict[str, int]] = {}
    for where, fields, qid, docno in _rows(lines, source, "qid iter docno rel"):
        try:
            relevance = int(fields[3])
        except ValueError:
            raise TrecError(f"{where}: relevance {fields[3]!r} is not an integer") from None
        if not -2**31 <= relevance < 2**31:
            raise TrecError(f"{where}: relevance {fields[3]!r} is out of range (a 32-bit integer)")
        qrels.setdefault(qid, {})[docno] = relevance
    return qrels


def read_run(lines: Iterable[bytes], source: str = "run") -> Run:
    """``qid Q0 docno rank score tag`` lines; fields after the tag are ignored, as trec_eval ignores them (the rank
    column is not used either: trec_eval ranks by score).

    Raises:
        TrecError: a line with fewer than six fields, a score that is not a number (or NaN), a document twice for a
            query.
    """
    docs: dict[str, list[tuple[str, float]]] = {}
    tag = ""
    for where, fields, qid, docno in _rows(lines, source, "qid Q0 docno rank score tag", more=True):
        try:
            score = float(fields[4])
        except ValueError:
            raise TrecError(f"{where}: score {fields[4]!r} is not a number") from None
        if math.isnan(score):  # (trec_eval's order of NaN scores is undefined: pytrec_eval's is another than ours)
            raise TrecError(f"{where}: score {fields[4]!r} is not a number (NaN has no rank order)")
        docs.setdefault(qid, []).append((docno, score))
        tag = fields[5]
    return Run(docs, tag)


def trec_order(docs: list[tuple[str, float]]) -> list[str]:
    """Documents as trec_eval ranks them: by score descending, ties by docno descending (byte order). Scores are
    compared in single precision, as trec_eval 9 keeps them (a ``float``; pytrec_eval too): scores that differ
    only beyond it tie.

    >>> trec_order([("d1", 1.0), ("d3", 2.0), ("d2", 1.0), ("d0", 1.00000001)])
    ['d3', 'd2', 'd1', 'd0']
    """
    with np.errstate(over="ignore"):  # beyond float's range: infinite, as C's conversion gives it
        kept = np.array([score for _, score in docs], dtype=np.float64).astype(np.float32).tolist()
    order = sorted(zip(kept, (docno.encode() for docno, _ in docs), range(len(docs)), strict=True), reverse=True)
    return [docs[k][0] for _, _, k in order]


def run_events(qrels: dict[str, dict[str, int]], rankings: dict[str, list[str]], tag: str, config: Config,
               ) -> Iterator[Ranking | Feedback]:
    """The events of the ranked queries, in the order of ``rankings``: a ranking (request id = query id) and a
    ``label`` per judged document of the query (relevance >= 0)."""
    for qid, items in rankings.items():
        ranking = Ranking(request_id=qid, items=items, ts=_TS, query_id=qid, experiment="trec", arm=tag or "run")
        validate(ranking, config)
        yield ranking
        for docno, rel in qrels[qid].items():
            if rel >= 0:
                yield Feedback(request_id=qid, item=docno, kind="label", grade=float(rel), ts=_TS)


def trec_config(names: Sequence[str], longest: int, base: Config | None = None) -> Config:
    """Settings that give trec_eval's numbers for the registry measures ``names``: their cutoffs, linear gain,
    empty queries scored 0, every document of the longest ranking kept. ``rel_threshold`` stays 1: a query is empty
    when no document has a positive grade, where nDCG's ideal is 0, whatever ``-l`` (trec_eval's ``ndcg_cut``
    ignores it); the measures that take ``-l`` have it in their names (:func:`at_level`)."""
    base = base or Config()
    cutoffs = sorted({k for k in (parse(name).k for name in names) if k is not None})
    names = tuple(dict.fromkeys(names))
    # only the measures asked for run, where the settings can say so (``metrics``); GSB (one arm here) on one of them
    chosen: dict[str, Any] = {"metrics": names, "gsb_metric": names[0]} if names else {"gsb_metric": "RR"}
    return dataclasses.replace(base, cutoffs=tuple(cutoffs) or base.cutoffs, gain="linear", empty="zero",
                               rel_threshold=1.0, max_items=max(base.max_items, longest), ab=False, **chosen)


def at_level(name: str, level: int) -> str:
    """The registry name ``name`` relevant from ``level`` on (``-l``): with ``rel`` = ``level`` when its family
    takes ``rel`` and the name gives none.

    >>> at_level("P@5", 2), at_level("P(rel=3)@5", 2), at_level("nDCG@10", 2), at_level("AP", 1)
    ('P(rel=2)@5', 'P(rel=3)@5', 'nDCG@10', 'AP')
    """
    spec = parse(name)
    if level == 1 or "rel" not in spec.definition.params or "rel" in dict(spec.params):
        return spec.name
    return MetricSpec(spec.family, spec.k, (*spec.params, ("rel", float(level)))).name


@dataclasses.dataclass
class TrecResult:
    """The queries evaluated (byte order), each printed value's per-query values (by its name, aligned with
    ``qids``), the ``all`` values, the queries averaged over (``num_q``) and the engine's report."""

    qids: list[str]
    values: dict[str, list[Any]]
    summary: dict[str, Any]
    num_q: int
    report: dict[str, Any]


def _summary(measure: Measure, values: list[Any], qrels: dict[str, dict[str, int]], num_q: int, complete: bool,
             tag: str) -> Any:
    """The ``all`` value, as trec_eval averages each measure (``None``: not printed)."""
    kind = measure.summary
    if kind == "runid":
        return tag
    if kind == "num_q":
        return num_q
    if kind == "none":
        return None
    if kind == "num_rel" and complete:  # trec_eval counts relevance > 0 here, whatever -l
        return sum(rel > 0 for judged in qrels.values() for rel in judged.values())
    if kind in ("sum", "num_rel"):
        return int(_added(values))
    if kind == "geometric":  # queries missing from the run (-c) count MIN_GEO_MEAN
        logs = _added(math.log(max(value, MIN_GEO_MEAN)) for value in values)
        return math.exp((logs + (num_q - len(values)) * math.log(MIN_GEO_MEAN)) / num_q)
    return _added(values) / num_q


def _added(values: Iterable[float]) -> float:
    """The values added one by one in query order, as trec_eval adds them (the same last bit, so the same
    rounding to 4 decimals)."""
    total = 0.0
    for value in values:
        total += value
    return total


def evaluate(qrels: dict[str, dict[str, int]], run: Run, measures: list[Measure], relevance_level: int = 1,
             complete: bool = False, max_docs: int | None = None) -> TrecResult:
    """Evaluate ``run`` against ``qrels``: each value of ``measures``, per query and for ``all``."""
    qids = sorted(run.docs.keys() & qrels.keys(), key=str.encode)
    if not qids:
        raise TrecError("no query has both results and relevance judgements (are the query ids of the run and the "
                        "qrels written alike?)")
    rankings = {qid: trec_order(run.docs[qid])[:max_docs] for qid in qids}
    engine_values = _engine_values(qrels, rankings, run.tag, measures, relevance_level)
    lists = RankedLists.build(
        [[NONPOOL if (rel := qrels[qid].get(doc)) is None else rel if rel >= 0 else UNJUDGED for doc in docs]
         for qid, docs in rankings.items()], [list(qrels[qid].values()) for qid in qids], relevance_level)
    computed: dict[tuple[str, tuple[float, ...]], Any] = {}
    values: dict[str, list[Any]] = {}
    for m in measures:
        if m.engine is not None:
            name = at_level(m.engine, relevance_level)
            values[m.trec_name] = [engine_values[0][qid][name] for qid in qids]
        elif m.measure is not None and m.measure.name == "relstring":
            values[m.trec_name] = relstring(lists, int(m.params[0]))
        elif m.measure is not None and m.measure.lists is not None:
            key = (m.measure.lists, m.params)
            if key not in computed:
                computed[key] = LIST_MEASURES[m.measure.lists](lists, m.params)
            values[m.trec_name] = computed[key][:, m.column].tolist()
        else:
            values[m.trec_name] = []
    num_q = len(qrels) if complete else len(qids)
    summary = {m.trec_name: _summary(m, values[m.trec_name], qrels, num_q, complete, run.tag) for m in measures}
    return TrecResult(qids, values, summary, num_q, engine_values[1])


def _engine_values(qrels: dict[str, dict[str, int]], rankings: dict[str, list[str]], tag: str,
                   measures: list[Measure], relevance_level: int) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """The registry measures of ``measures`` per query (query -> name -> value), through the engine, and its
    report."""
    longest = max((len(docs) for docs in rankings.values()), default=1)
    config = trec_config([at_level(m.engine, relevance_level) for m in measures if m.engine is not None], longest)
    per_query: dict[str, dict[str, float]] = {}

    def keep(batch: FinalisedBatch) -> None:
        names = [spec.name for spec in batch.specs]
        for state, row in zip(batch.states, batch.values.tolist(), strict=True):
            per_query[state.request_id] = dict(zip(names, row, strict=True))

    engine = Engine(config, keep)
    batch: list[Ranking | Feedback] = []
    for event in run_events(qrels, rankings, tag, config):
        batch.append(event)
        if len(batch) >= 8192:
            engine.process(batch)
            batch = []
    engine.process(batch)
    engine.flush()
    return per_query, engine.report()


def _text(measure: Measure, value: Any) -> str:
    if measure.measure is not None and measure.measure.name == "relstring":
        return f"'{value}'"
    if measure.integer:
        return str(int(value))
    return f"{value:6.4f}"


def trec_lines(result: TrecResult, measures: list[Measure], per_query: bool = False) -> Iterator[str]:
    """trec_eval's output: with ``per_query``, each query's lines (queries in byte order of their ids), then the
    ``all`` lines, each ``measure<TAB>qid<TAB>value`` (the measure padded to 22 characters; values to 4 decimals,
    counts as integers, as trec_eval prints them)."""
    printed = [m for m in measures if m.per_query]
    if per_query:
        for q, qid in enumerate(result.qids):
            for m in printed:
                yield f"{m.trec_name:<22}\t{qid}\t{_text(m, result.values[m.trec_name][q])}"
    for m in measures:
        value = result.summary[m.trec_name]
        if value is not None:
            yield f"{m.trec_name:<22}\tall\t{value if m.summary in ('runid', 'num_q') else _text(m, value)}"


def trec_json(result: TrecResult, measures: list[Measure], per_query: bool = False) -> dict[str, Any]:
    """The engine's report with a ``trec`` section: ``num_q``, ``runid`` if asked for, the other ``all`` values
    and, with ``per_query``, each query's, by the names trec_eval prints."""
    special = {"runid", "num_q"}
    trec: dict[str, Any] = {"num_q": result.num_q}
    trec |= {m.trec_name: result.summary[m.trec_name] for m in measures if m.trec_name == "runid"}
    trec["all"] = {m.trec_name: _number(result.summary[m.trec_name]) for m in measures
                   if m.summary not in special and result.summary[m.trec_name] is not None}
    if per_query:
        printed = [m for m in measures if m.per_query]
        trec["queries"] = {qid: {m.trec_name: _number(result.values[m.trec_name][q]) for m in printed}
                           for q, qid in enumerate(result.qids)}
    return {**result.report, "trec": trec}


def _number(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def _lines(path: str) -> list[bytes]:
    if path == "-":
        return sys.stdin.buffer.read().splitlines()
    with open(path, "rb") as file:
        return file.read().splitlines()


def trec_command(args: argparse.Namespace) -> int:
    """``stream-eval trec QRELS RUN``."""
    from stream_eval.commands import check_paths

    check_paths([args.qrels, args.run], [args.output], several=False)
    qrels = read_qrels(_lines(args.qrels), args.qrels)
    run = read_run(_lines(args.run), args.run)
    measures = parse_measures(args.measure or ["official"])
    result = evaluate(qrels, run, measures, args.relevance_level, args.complete, args.max_docs)
    output: IO[bytes] = open(args.output, "wb") if args.output else sys.stdout.buffer
    try:
        if args.json:
            output.write(orjson.dumps(trec_json(result, measures, args.query), option=orjson.OPT_INDENT_2) + b"\n")
        else:
            output.write("".join(line + "\n" for line in trec_lines(result, measures, args.query)).encode())
    finally:
        if args.output:
            output.close()
    return 0
