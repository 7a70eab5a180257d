"""``stream-eval trec``: TREC runs and qrels evaluated as trec_eval evaluates them, checked against pytrec_eval (the
trec_eval library) on files written here: ties in scores, unjudged documents, graded and negative relevance,
queries missing from the run or from the qrels, queries without a relevant document."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import pytrec_eval
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_eval.config import Config
from stream_eval.engine.engine import Engine
from stream_eval.trec import (
    TREC_MEASURES,
    TrecError,
    evaluate,
    parse_measures,
    read_qrels,
    read_run,
    trec_config,
    trec_order,
)

CUTOFFS = (1, 3, 5, 10)
#: Document names whose byte order differs from other orders (case, length): trec_eval's tie-break is by docno.
DOCS = ["d1", "d10", "d2", "D3", "a", "b", "Zz", "d20", "x-1", "x_1", "caf\u00e9", "10"]
QIDS = ["q1", "q2", "q10", "301", "Q3"]


def computed(measures: list[str]) -> list[str]:
    """The trec_eval measures of ``measures`` that this version computes (``Rprec``, ``success`` may be missing)."""
    parsed = parse_measures(measures)
    names = {spec.name for spec in Engine(trec_config(parsed, 1, 1)).specs}
    return [m.trec_name for m in parsed if m.name in names]


MEASURES = computed(["map", "recip_rank", "Rprec", *(f"{family}.{','.join(map(str, CUTOFFS))}" for family in
                                                    ("P", "recall", "ndcg_cut", "success"))])
PYTREC_MEASURES = {"map", "recip_rank", "Rprec", *(f"{family}.{','.join(map(str, CUTOFFS))}" for family in
                                                   ("P", "recall", "ndcg_cut", "success"))}


@st.composite
def qrels_and_runs(draw: st.DrawFn) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    scores = st.one_of(st.sampled_from([0.0, 1.0, 2.0, 0.5]), st.floats(-10, 10, allow_nan=False))
    for qid in QIDS:
        if draw(st.integers(0, 5)):  # most queries have qrels
            judged = draw(st.lists(st.sampled_from(DOCS), min_size=1, max_size=8, unique=True))
            qrels[qid] = {doc: draw(st.sampled_from([0, 0, 1, 1, 2, 3, -1])) for doc in judged}
        if draw(st.integers(0, 5)):  # and most are in the run
            ranked = draw(st.lists(st.sampled_from(DOCS), min_size=1, max_size=12, unique=True))
            run[qid] = {doc: draw(scores) for doc in ranked}
    if not qrels.keys() & run.keys():
        qrels["q1"] = {"d1": 1}
        run["q1"] = {"d1": 1.0, "d2": 1.0}
    return qrels, run


def write_files(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]], tmp: Path) -> tuple[Path, Path]:
    qrels_path, run_path = tmp / "qrels.txt", tmp / "run.txt"
    qrels_path.write_text("".join(f"{q} 0 {d} {r}\n" for q, docs in qrels.items() for d, r in docs.items()))
    run_path.write_text("".join(f"{q} Q0 {d} {rank} {s!r} tag1\n" for q, docs in run.items()
                                for rank, (d, s) in enumerate(docs.items(), start=1)))
    return qrels_path, run_path


def ours(qrels_path: Path, run_path: Path, level: int = 1, complete: bool = False) -> dict[str, dict[str, float]]:
    qrels = read_qrels(qrels_path.read_bytes().splitlines())
    run = read_run(run_path.read_bytes().splitlines())
    measures = parse_measures(MEASURES)
    result = evaluate(qrels, run, measures, level, complete)
    out = {qid: {m.trec_name: values[m.name] for m in measures if m.name} for qid, values in result.per_query.items()}
    out["all"] = {m.trec_name: result.mean(m.name) for m in measures if m.name}
    return out


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=qrels_and_runs(), level=st.sampled_from([1, 1, 2]))
def test_agrees_with_pytrec_eval(data: tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]], level: int,
                                 tmp_path: Path) -> None:
    qrels, run = data
    expected = pytrec_eval.RelevanceEvaluator(qrels, PYTREC_MEASURES, relevance_level=level).evaluate(run)
    got = ours(*write_files(qrels, run, tmp_path), level=level)
    assert set(got) - {"all"} == set(expected) == qrels.keys() & run.keys()
    # with -l above 1, trec_eval's ndcg_cut ignores the level (the module's documentation): not compared
    names = [name for name in MEASURES if level == 1 or not name.startswith("ndcg_cut")]
    for qid, values in expected.items():
        for name in names:
            assert got[qid][name] == pytest.approx(values[name], abs=1e-9), (qid, name)
    for name in names:
        mean = sum(values[name] for values in expected.values()) / len(expected)
        assert got["all"][name] == pytest.approx(mean, abs=1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=qrels_and_runs())
def test_complete_counts_queries_missing_from_the_run_as_zero(
        data: tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]], tmp_path: Path) -> None:
    qrels, run = data
    expected = pytrec_eval.RelevanceEvaluator(qrels, PYTREC_MEASURES).evaluate(run)
    got = ours(*write_files(qrels, run, tmp_path), complete=True)
    for name in MEASURES:
        assert got["all"][name] == pytest.approx(sum(v[name] for v in expected.values()) / len(qrels), abs=1e-9)


def test_trec_order_breaks_ties_by_docno_descending() -> None:
    assert trec_order([("d1", 1.0), ("D3", 1.0), ("d10", 1.0), ("a", 2.0), ("d2", -1.0)]) == [
        "a", "d10", "d1", "D3", "d2"]


def test_every_measure_of_the_table_parses() -> None:
    for name in TREC_MEASURES:
        assert parse_measures([name])
    assert [m.trec_name for m in parse_measures(["P_5", "P.5,10", "ndcg_cut.3"])] == ["P_5", "P_10", "ndcg_cut_3"]
    for bad in ("bpref", "P.x", "map.5", "P.0"):
        with pytest.raises(TrecError):
            parse_measures([bad])


def test_bad_files_are_errors() -> None:
    with pytest.raises(TrecError, match="4 fields"):
        read_qrels([b"q1 0 d1"])
    with pytest.raises(TrecError, match="twice"):
        read_qrels([b"q1 0 d1 1", b"q1 0 d1 0"])
    with pytest.raises(TrecError, match="not a number"):
        read_run([b"q1 Q0 d1 1 high tag"])
    with pytest.raises(TrecError, match="twice"):
        read_run([b"q1 Q0 d1 1 1.0 tag", b"q1 Q0 d1 2 0.5 tag"])


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stream_eval.cli", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture()
def small(tmp_path: Path) -> tuple[str, str]:
    qrels = {"q1": {"d1": 1, "d2": 0, "d3": 2}, "q2": {"d1": 1}, "q3": {"x": 1}}
    run = {"q1": {"d2": 1.0, "d1": 1.0, "d9": 0.5}, "q2": {"d5": 3.0}, "q9": {"d1": 3.0}}
    qrels_path, run_path = write_files(qrels, run, tmp_path)
    return str(qrels_path), str(run_path)


@pytest.mark.slow
def test_cli_prints_trec_eval_lines(small: tuple[str, str]) -> None:
    result = run_cli("trec", *small, "-q", "-m", "num_q", "-m", "map", "-m", "P.2", "-m", "ndcg_cut.10")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "map                   \tq1\t0.2500",
        "P_2                   \tq1\t0.5000",
        "ndcg_cut_10           \tq1\t0.2398",
        "map                   \tq2\t0.0000",
        "P_2                   \tq2\t0.0000",
        "ndcg_cut_10           \tq2\t0.0000",
        "num_q                 \tall\t2",
        "map                   \tall\t0.1250",
        "P_2                   \tall\t0.2500",
        "ndcg_cut_10           \tall\t0.1199",
    ]


@pytest.mark.slow
def test_cli_default_measures_and_json(small: tuple[str, str]) -> None:
    default = run_cli("trec", *small)
    assert default.returncode == 0, default.stderr
    names = [line.split("\t")[0].strip() for line in default.stdout.splitlines()]
    assert names[:4] == ["runid", "num_q", "map", "Rprec"] or names[:3] == ["runid", "num_q", "map"]
    assert {"recip_rank", "P_5", "P_10", "P_1000", "recall_100", "ndcg_cut_10"} <= set(names)
    report = json.loads(run_cli("trec", *small, "--json", "-c", "-q", "-m", "map").stdout)
    assert report["trec"] == {"num_q": 3, "all": {"map": pytest.approx(0.25 / 3)},
                              "queries": {"q1": {"map": 0.25}, "q2": {"map": 0.0}}}
    assert report["overall"]["requests"] == 2 and report["overall"]["metrics"]["MAP"] == 0.125
    unknown = run_cli("trec", *small, "-m", "bpref")
    assert unknown.returncode == 2 and "bpref" in unknown.stderr


def test_trec_config_keeps_every_document() -> None:
    config = trec_config(parse_measures(["P.5"]), 1, 5000)
    assert config.max_items == 5000 and config.gain == "linear" and config.cutoffs == (5,)
    assert trec_config(parse_measures(["map"]), 2, 10, Config()).rel_threshold == 2
