"""``stream-eval trec QRELS RUN``: a TREC run evaluated as trec_eval evaluates it, by the engine's own kernels.

The qrels and the run become events: per query of the run that has qrels, one ranking (its documents in trec_eval's
order: score descending in single precision, ties by docno descending, byte order) and one ``label`` per judged
document (its grade the qrels' relevance; a negative relevance, trec_eval's "in the pool but unjudged", is no label).
They are replayed through :class:`~stream_eval.engine.engine.Engine` with trec_eval's conventions as settings:
linear gain (its ``ndcg_cut``), empty queries scored 0, relevant from ``-l`` (default 1). Unjudged documents are
non-relevant. As trec_eval 9 does, queries of the run without qrels are skipped, and so are queries of the qrels
missing from the run unless ``-c`` (then they count 0 and every mean is over all queries of the qrels).

Measure names are trec_eval's (:data:`TREC_MEASURES`: one table, trec_eval name -> stream_eval name); output is
trec_eval's three columns (``measure \\t qid \\t value``; ``-q`` per query, ``all`` for the means), or the JSON
report with a ``trec`` section (``--json``).

One difference: with ``-l`` above 1, a query whose judged documents are all below the level is empty here, so its
nDCG is 0, where trec_eval's ``ndcg_cut`` (which ignores ``-l``) scores the lower grades.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

import numpy as np
import orjson

from stream_eval.config import Config, ConfigError
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.events.schema import Feedback, Ranking, validate

#: trec_eval's measures that stream_eval computes: trec_eval's name -> stream_eval's per-request metric (``{k}``:
#: a measure with cutoffs, ``P_5`` is ``P@5``). Adding a measure of the registry is one line here.
TREC_MEASURES: dict[str, str] = {
    "map": "AP",
    "Rprec": "R-Prec",
    "recip_rank": "RR",
    "P": "P@{k}",
    "recall": "R@{k}",
    "ndcg_cut": "nDCG@{k}",
    "success": "Success@{k}",
}
#: trec_eval's default cutoffs of each measure with cutoffs.
TREC_CUTOFFS: dict[str, tuple[int, ...]] = {
    "P": (5, 10, 15, 20, 30, 100, 200, 500, 1000),
    "recall": (5, 10, 15, 20, 30, 100, 200, 500, 1000),
    "ndcg_cut": (5, 10, 15, 20, 30, 100, 200, 500, 1000),
    "success": (1, 5, 10),
}
#: What ``stream-eval trec`` prints without ``-m``: trec_eval's ``official`` set where stream_eval has the measure,
#: with recall, nDCG and success at common cutoffs (measures not computed by this version are left out).
DEFAULT_MEASURES = ("runid", "num_q", "map", "Rprec", "recip_rank", "P.5,10,15,20,30,100,200,500,1000",
                    "recall.100,1000", "ndcg_cut.10,20,100", "success.1,10")
#: Event time of the events made from a run (any time a log may hold).
_TS = 1_000_000_000.0


class TrecError(ConfigError):
    """A qrels or run file that trec_eval would not read, or a measure that is not computed."""


@dataclasses.dataclass(frozen=True, slots=True)
class Measure:
    """One measure as trec_eval names it (``P_5``) and as stream_eval does (``P@5``); ``num_q`` and ``runid`` have
    no stream_eval name."""

    trec_name: str
    name: str | None


def parse_measures(requests: Iterable[str]) -> list[Measure]:
    """trec_eval's ``-m`` arguments (``map``, ``P.5,10``, ``P`` for its default cutoffs, ``P_5``; ``official``, and
    ``all_trec`` for every measure of :data:`TREC_MEASURES`) as measures, in order, each once.

    >>> [m.trec_name for m in parse_measures(["map", "P.5,10", "ndcg_cut_10"])]
    ['map', 'P_5', 'P_10', 'ndcg_cut_10']
    """
    out: dict[str, Measure] = {}
    for request in requests:
        if request in ("official", "all_trec"):
            expanded = DEFAULT_MEASURES if request == "official" else (
                "runid", "num_q", *(f"{n}.{','.join(map(str, TREC_CUTOFFS[n]))}" if n in TREC_CUTOFFS else n
                                    for n in TREC_MEASURES))
            out.update((m.trec_name, m) for m in parse_measures(expanded))
            continue
        name, _, cutoffs = request.partition(".")
        if not cutoffs and name not in TREC_MEASURES and "_" in name:  # P_5, ndcg_cut_10
            family, _, cutoff = name.rpartition("_")
            if family in TREC_CUTOFFS and cutoff.isdigit():
                name, cutoffs = family, cutoff
        if name in ("num_q", "runid") and not cutoffs:
            out[name] = Measure(name, None)
            continue
        template = TREC_MEASURES.get(name)
        if template is None:
            known = ", ".join(["num_q", "runid", *TREC_MEASURES])
            raise TrecError(f"-m {request}: not a trec_eval measure stream_eval computes (known: {known})")
        if name not in TREC_CUTOFFS:
            if cutoffs:
                raise TrecError(f"-m {request}: {name} takes no cutoffs")
            out[name] = Measure(name, template)
            continue
        try:
            ks = [int(k) for k in cutoffs.split(",")] if cutoffs else list(TREC_CUTOFFS[name])
        except ValueError:
            raise TrecError(f"-m {request}: cutoffs are whole numbers, comma-separated") from None
        if any(k < 1 for k in ks):
            raise TrecError(f"-m {request}: cutoffs must be positive")
        out.update((f"{name}_{k}", Measure(f"{name}_{k}", template.format(k=k))) for k in ks)
    return list(out.values())


@dataclasses.dataclass
class Run:
    """A TREC run: per query, its documents and scores in file order; the run's tag (last column)."""

    docs: dict[str, list[tuple[str, float]]]
    tag: str


def _rows(lines: Iterable[bytes], source: str, layout: str) -> Iterator[tuple[str, list[str], str, str]]:
    """The non-blank lines of a TREC file of ``layout`` (its column names): ``(where, fields, qid, docno)``, each
    line checked to have one field per column and the same document at most once per query.

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
        if len(fields) != width:
            raise TrecError(f"{where}: expected {width} fields ({layout}), got {len(fields)}")
        qid, docno = fields[0], fields[2]
        if (qid, docno) in seen:
            raise TrecError(f"{where}: document {docno!r} appears twice for query {qid!r}")
        seen.add((qid, docno))
        yield where, fields, qid, docno


def read_qrels(lines: Iterable[bytes], source: str = "qrels") -> dict[str, dict[str, int]]:
    """``qid iter docno rel`` lines: per query, each document's relevance.

    Raises:
        TrecError: a line without four fields, a relevance that is not an integer, a document judged twice.
    """
    qrels: dict[str, dict[str, int]] = {}
    for where, fields, qid, docno in _rows(lines, source, "qid iter docno rel"):
        try:
            qrels.setdefault(qid, {})[docno] = int(fields[3])
        except ValueError:
            raise TrecError(f"{where}: relevance {fields[3]!r} is not an integer") from None
    return qrels


def read_run(lines: Iterable[bytes], source: str = "run") -> Run:
    """``qid Q0 docno rank score tag`` lines (the rank column is not used: trec_eval ranks by score).

    Raises:
        TrecError: a line without six fields, a score that is not a number, a document twice for one query.
    """
    docs: dict[str, list[tuple[str, float]]] = {}
    tag = ""
    for where, fields, qid, docno in _rows(lines, source, "qid Q0 docno rank score tag"):
        try:
            docs.setdefault(qid, []).append((docno, float(fields[4])))
        except ValueError:
            raise TrecError(f"{where}: score {fields[4]!r} is not a number") from None
        tag = tag or fields[5]
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


def run_events(qrels: dict[str, dict[str, int]], run: Run, config: Config, max_docs: int | None = None,
               ) -> Iterator[Ranking | Feedback]:
    """The events of the queries of ``run`` that have qrels, in query order: a ranking (request id = query id) and
    a ``label`` per judged document of the query (relevance >= 0)."""
    for qid in sorted(run.docs.keys() & qrels.keys(), key=str.encode):
        items = trec_order(run.docs[qid])[:max_docs]
        ranking = Ranking(request_id=qid, items=items, ts=_TS, query_id=qid, experiment="trec", arm=run.tag or "run")
        validate(ranking, config)
        yield ranking
        for docno, rel in qrels[qid].items():
            if rel >= 0:
                yield Feedback(request_id=qid, item=docno, kind="label", grade=float(rel), ts=_TS)


def trec_config(measures: list[Measure], relevance_level: int, longest: int, base: Config | None = None) -> Config:
    """Settings that give trec_eval's numbers: the cutoffs of ``measures``, linear gain, empty queries scored 0,
    ``rel_threshold`` = ``-l``, every document of the longest ranking kept."""
    base = base or Config()
    cutoffs = sorted({int(m.name.rpartition("@")[2]) for m in measures if m.name and "@" in m.name})
    names = tuple(dict.fromkeys(m.name for m in measures if m.name))
    # only the measures asked for run, where the settings can say so (``metrics``); GSB (one arm here) on one of them
    chosen: dict[str, Any] = {"metrics": names, "gsb_metric": names[0]} if names else {"gsb_metric": "RR"}
    return dataclasses.replace(base, cutoffs=tuple(cutoffs) or base.cutoffs, gain="linear", empty="zero",
                               rel_threshold=float(relevance_level), max_items=max(base.max_items, longest),
                               ab=False, **chosen)


@dataclasses.dataclass
class TrecResult:
    """Per-query values (query -> stream_eval name -> value), the queries averaged over, and the engine's report."""

    per_query: dict[str, dict[str, float]]
    num_q: int
    report: dict[str, Any]

    def mean(self, name: str) -> float:
        """The ``all`` value: the sum over the queries evaluated, divided by ``num_q`` (with ``-c``, queries of the
        qrels missing from the run count 0)."""
        if not self.num_q:
            return math.nan
        return math.fsum(values[name] for values in self.per_query.values()) / self.num_q


def evaluate(qrels: dict[str, dict[str, int]], run: Run, measures: list[Measure], relevance_level: int = 1,
             complete: bool = False, max_docs: int | None = None) -> TrecResult:
    """Evaluate ``run`` against ``qrels`` through the engine: the values of ``measures`` per query."""
    longest = max((len(docs) for docs in run.docs.values()), default=1)
    config = trec_config(measures, relevance_level, min(longest, max_docs or longest))
    per_query: dict[str, dict[str, float]] = {}

    def keep(batch: FinalisedBatch) -> None:
        names = [spec.name for spec in batch.specs]
        for state, row in zip(batch.states, batch.values.tolist(), strict=True):
            per_query[state.request_id] = dict(zip(names, row, strict=True))

    engine = Engine(config, keep)
    batch: list[Ranking | Feedback] = []
    for event in run_events(qrels, run, config, max_docs):
        batch.append(event)
        if len(batch) >= 8192:
            engine.process(batch)
            batch = []
    engine.process(batch)
    engine.flush()
    num_q = len(qrels) if complete else len(per_query)
    return TrecResult(per_query, num_q, engine.report())


def trec_lines(result: TrecResult, measures: list[Measure], run: Run, per_query: bool = False) -> Iterator[str]:
    """trec_eval's output: with ``per_query``, each query's lines (queries in byte order of their ids), then the
    ``all`` lines, each ``measure<TAB>qid<TAB>value`` (the measure padded to 22 characters, values to 4 decimals,
    as trec_eval prints them)."""
    if per_query:
        for qid in sorted(result.per_query, key=str.encode):
            values = result.per_query[qid]
            for m in measures:
                if m.name is not None:
                    yield f"{m.trec_name:<22}\t{qid}\t{values[m.name]:6.4f}"
    for m in measures:
        if m.trec_name == "runid":
            yield f"{'runid':<22}\tall\t{run.tag}"
        elif m.trec_name == "num_q":
            yield f"{'num_q':<22}\tall\t{result.num_q}"
        elif m.name is not None:
            yield f"{m.trec_name:<22}\tall\t{result.mean(m.name):6.4f}"


def trec_json(result: TrecResult, measures: list[Measure], per_query: bool = False) -> dict[str, Any]:
    """The engine's report with a ``trec`` section: the ``all`` values and, with ``per_query``, each query's, by
    trec_eval's names."""
    named = [m for m in measures if m.name is not None]
    trec: dict[str, Any] = {"num_q": result.num_q,
                            "all": {m.trec_name: _number(result.mean(m.name)) for m in named if m.name}}
    if per_query:
        trec["queries"] = {qid: {m.trec_name: _number(result.per_query[qid][m.name]) for m in named if m.name}
                           for qid in sorted(result.per_query, key=str.encode)}
    return {**result.report, "trec": trec}


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def _lines(path: str) -> list[bytes]:
    if path == "-":
        return sys.stdin.buffer.read().splitlines()
    with open(path, "rb") as file:
        return file.read().splitlines()


def trec_command(args: argparse.Namespace) -> int:
    """``stream-eval trec QRELS RUN``."""
    qrels = read_qrels(_lines(args.qrels), args.qrels)
    run = read_run(_lines(args.run), args.run)
    measures = parse_measures(args.measure or ["official"])
    result = evaluate(qrels, run, measures, args.relevance_level, args.complete, args.max_docs)
    if not result.num_q:
        print("stream-eval trec: no query has both results and relevance judgements", file=sys.stderr)
        return 1
    output: IO[bytes] = open(args.output, "wb") if args.output else sys.stdout.buffer
    try:
        if args.json:
            output.write(orjson.dumps(trec_json(result, measures, args.query), option=orjson.OPT_INDENT_2) + b"\n")
        else:
            output.write("".join(line + "\n" for line in trec_lines(result, measures, run, args.query)).encode())
    finally:
        if args.output:
            output.close()
    return 0
