"""``stream-eval trec``: TREC runs and qrels evaluated as trec_eval evaluates them, checked against pytrec_eval (the
trec_eval library) and ir_measures on files written here: ties in scores, unjudged documents, relevance 0..3 and
negative, queries missing from the run or from the qrels, queries without a relevant document, run lines with
fields after the tag. Where a ``trec_eval`` program is on the PATH, its output is compared byte for byte too."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import ir_measures
import pytest
import pytrec_eval
from ci import in_ci
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_eval.config import Config
from stream_eval.trec import (
    NICKNAMES,
    TREC_MEASURES,
    TrecError,
    evaluate,
    parse_measures,
    read_qrels,
    read_run,
    trec_config,
    trec_lines,
    trec_order,
)

Qrels = dict[str, dict[str, int]]
RunScores = dict[str, dict[str, float]]
#: Document names whose byte order differs from other orders (case, length): trec_eval's tie-break is by docno.
DOCS = ["d1", "d10", "d2", "D3", "a", "b", "Zz", "d20", "x-1", "x_1", "caf\u00e9", "10"]
QIDS = ["q1", "q2", "q10", "301", "Q3"]
#: trec_eval 9's default output (``-m official``), line by line (in the order of its measure table).
OFFICIAL = ["runid", "num_q", "num_ret", "num_rel", "num_rel_ret", "map", "gm_map", "Rprec", "bpref", "recip_rank",
            *(f"iprec_at_recall_{p / 10:.2f}" for p in range(11)),
            *(f"P_{k}" for k in (5, 10, 15, 20, 30, 100, 200, 500, 1000))]
#: Measures of all_trec with parameters other than the defaults, as pytrec_eval reads them.
WITH_PARAMS = ["P.3,1", "recall.2,7", "ndcg_cut.1,4", "map_cut.3,6", "relative_P.2,5", "success.2,3",
               "iprec_at_recall.0.25,0.5,0.9", "Rprec_mult.0.5,1.5,3", "11pt_avg.0.2,0.5,0.8", "set_F.0.5"]
#: The names pytrec_eval gives the measures of WITH_PARAMS whose printed name carries the parameters.
PYTREC_NAME = {"11pt_avg_0.2,0.5,0.8": "11pt_avg", "set_F_0.5": "set_F"}


@st.composite
def qrels_and_runs(draw: st.DrawFn) -> tuple[Qrels, RunScores]:
    qrels: Qrels = {}
    run: RunScores = {}
    scores = st.one_of(st.sampled_from([0.0, 1.0, 2.0, 0.5]), st.floats(-10, 10, allow_nan=False))
    for qid in QIDS:
        if draw(st.integers(0, 5)):  # most queries have qrels
            judged = draw(st.lists(st.sampled_from(DOCS), min_size=1, max_size=8, unique=True))
            qrels[qid] = {doc: draw(st.sampled_from([0, 0, 1, 1, 2, 3, -1, -2])) for doc in judged}
            # trec_eval (and pytrec_eval) fail on a query whose judgments are all negative: tested on its own
            qrels[qid][judged[0]] = abs(qrels[qid][judged[0]])
        if draw(st.integers(0, 5)):  # and most are in the run
            ranked = draw(st.lists(st.sampled_from(DOCS), min_size=1, max_size=12, unique=True))
            run[qid] = {doc: draw(scores) for doc in ranked}
    if not qrels.keys() & run.keys():
        qrels["q1"] = {"d1": 1}
        run["q1"] = {"d1": 1.0, "d2": 1.0}
    return qrels, run


def write_files(qrels: Qrels, run: RunScores, tmp: Path, extra: int = 0) -> tuple[Path, Path]:
    """The qrels and run as files; every ``extra``-th run line has fields after its tag (``extra`` 0: none)."""
    qrels_path, run_path = tmp / "qrels.txt", tmp / "run.txt"
    qrels_path.write_text("".join(f"{q} 0 {d} {r}\n" for q, docs in qrels.items() for d, r in docs.items()))
    lines = [f"{q} Q0 {d} {rank} {s!r} tag1" for q, docs in run.items()
             for rank, (d, s) in enumerate(docs.items(), start=1)]
    run_path.write_text("".join(line + (" 17 more\tfields" if extra and n % extra == 0 else "") + "\n"
                                for n, line in enumerate(lines)))
    return qrels_path, run_path


def ours(qrels_path: Path, run_path: Path, requests: list[str], level: int = 1, complete: bool = False,
         ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Per query (name -> value) and the ``all`` values, as ``stream-eval trec`` computes them."""
    qrels = read_qrels(qrels_path.read_bytes().splitlines())
    run = read_run(run_path.read_bytes().splitlines())
    measures = parse_measures(requests)
    result = evaluate(qrels, run, measures, level, complete)
    per_query = {qid: {m.trec_name: result.values[m.trec_name][q] for m in measures if m.per_query} for q, qid in
                 enumerate(result.qids)}
    return per_query, {m.trec_name: result.summary[m.trec_name] for m in measures}


def numeric(names: list[str]) -> list[str]:
    """The values pytrec_eval gives numbers for (not ``runid``, ``relstring``)."""
    return [n for n in names if n != "runid" and not n.startswith("relstring")]


def check(got: float, expected: float, where: object) -> None:
    assert got == pytest.approx(expected, abs=1e-9, nan_ok=True), where


EXAMPLES = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@EXAMPLES
@given(data=qrels_and_runs(), level=st.sampled_from([1, 1, 2]), requests=st.sampled_from([["all_trec"], WITH_PARAMS]))
def test_every_measure_agrees_with_pytrec_eval(data: tuple[Qrels, RunScores], level: int, requests: list[str],
                                               tmp_path: Path) -> None:
    """Each value of ``-m all_trec`` (and of its measures with parameters), per query and for ``all``."""
    qrels, run = data
    per_query, summary = ours(*write_files(qrels, run, tmp_path, extra=3), requests, level=level)
    expected = pytrec_eval.RelevanceEvaluator(qrels, set(requests), relevance_level=level).evaluate(run)
    assert set(per_query) == set(expected) == qrels.keys() & run.keys()
    names = numeric(list(summary))
    assert len(names) > 5
    for name in names:
        oracle = PYTREC_NAME.get(name, name)
        values = [row[oracle] for row in expected.values()]
        if oracle == "num_q":
            assert summary[name] == len(expected)
            continue
        check(summary[name], pytrec_eval.compute_aggregated_measure(oracle, values), name)
        if not name.startswith("gm_"):  # a geometric mean's terms are not printed per query
            for qid, row in expected.items():
                check(per_query[qid][name], row[oracle], (qid, name))


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=qrels_and_runs())
def test_complete_counts_queries_missing_from_the_run(data: tuple[Qrels, RunScores], tmp_path: Path) -> None:
    """``-c``: means over every query of the qrels, a missing one 0 (MIN_GEO_MEAN in a geometric mean);
    ``num_rel`` counts every relevance above 0 of the qrels (as trec_eval's num_rel does)."""
    qrels, run = data
    expected = pytrec_eval.RelevanceEvaluator(qrels, {"all_trec"}).evaluate(run)
    _, summary = ours(*write_files(qrels, run, tmp_path), ["all_trec"], complete=True)
    missing = len(qrels) - len(expected)
    assert summary["num_q"] == len(qrels)
    assert summary["num_rel"] == sum(rel > 0 for judged in qrels.values() for rel in judged.values())
    for name in numeric(list(summary)):
        values = [row[name] for row in expected.values()]
        if name.startswith("gm_"):
            check(summary[name], math.exp((sum(values) + missing * math.log(1e-5)) / len(qrels)), name)
        elif name.startswith("num_") and name not in ("num_q", "num_rel"):
            check(summary[name], sum(values), name)
        elif name not in ("num_q", "num_rel"):
            check(summary[name], sum(values) / len(qrels), name)


def ir_measures_run(run: RunScores) -> RunScores:
    """The run with trec_eval's ranking made plain (distinct scores), so that every oracle ranks as it does."""
    return {qid: {doc: float(len(docs) - rank) for rank, doc in enumerate(trec_order(list(docs.items())))}
            for qid, docs in run.items()}


REGISTRY_NAMES = ["nDCG@10", "RBP(p=0.8)", "Judged@10", "P(rel=2)@5", "AP@3", "RR", "R-Prec", "R@4"]


@pytest.mark.slow
@EXAMPLES
@given(data=qrels_and_runs(), level=st.sampled_from([1, 2]))
def test_registry_names_agree_with_ir_measures(data: tuple[Qrels, RunScores], level: int, tmp_path: Path) -> None:
    """``-m nDCG@10 -m 'RBP(p=0.8)' ...``: the registry's measures, printed under their names. ``-l`` is their
    ``rel`` where they take one and the name does not give it (nDCG, like trec_eval's ndcg_cut, has none). A
    negative relevance is unjudged here (trec_eval's meaning), a judgment to ir_measures' Judged: its qrels leave
    them out."""
    qrels, run = data
    per_query, summary = ours(*write_files(qrels, run, tmp_path, extra=2), REGISTRY_NAMES, level=level)
    assert list(summary) == ["nDCG@10", "RBP(p=0.8)", "RBP-Res(p=0.8)", "Judged@10", "P(rel=2)@5", "AP@3", "RR",
                             "R-Prec", "R@4"]
    oracle = {"nDCG@10": "nDCG@10", "RBP(p=0.8)": f"RBP(p=0.8,rel={level})", "Judged@10": "Judged@10",
              "P(rel=2)@5": "P(rel=2)@5", "AP@3": f"AP(rel={level})@3", "RR": f"RR(rel={level})",
              "R-Prec": f"Rprec(rel={level})", "R@4": f"R(rel={level})@4"}
    judged_qrels = {q: {d: r for d, r in docs.items() if r >= 0} for q, docs in qrels.items()}
    shown = {q: docs for q, docs in ir_measures_run(run).items() if q in qrels}
    compared = 0
    for ours_name, name in oracle.items():
        measure = ir_measures.parse_measure(name)
        for metric in ir_measures.iter_calc([measure], judged_qrels if name == "Judged@10" else qrels, shown):
            if metric.query_id in per_query:
                check(per_query[metric.query_id][ours_name], metric.value, (metric.query_id, name))
                compared += 1
    assert compared >= len(per_query) * len(oracle)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=qrels_and_runs(), level=st.sampled_from([1, 2]),
       coefficients=st.lists(st.sampled_from([-2.0, -1.0, 0.0, 0.5, 3.0]), min_size=4, max_size=4))
def test_utility_with_coefficients_is_trec_eval_formula_on_pytrec_eval_counts(
        data: tuple[Qrels, RunScores], level: int, coefficients: list[float], tmp_path: Path) -> None:
    """pytrec_eval does not read utility's coefficients: trec_eval's formula (without -N) on its counts."""
    qrels, run = data
    request = f"utility.{','.join(map(str, coefficients))}"
    per_query, _ = ours(*write_files(qrels, run, tmp_path), [request], level=level)
    counts = pytrec_eval.RelevanceEvaluator(qrels, {"num_rel_ret", "num_ret", "num_rel"},
                                            relevance_level=level).evaluate(run)
    p1, p2, p3, p4 = coefficients
    for qid, row in counts.items():
        a, ret, rel = row["num_rel_ret"], row["num_ret"], row["num_rel"]
        check(per_query[qid][f"utility_{request[8:]}"], p1 * a + p2 * (ret - a) + p3 * (rel - a) + p4 * (a - ret - rel),
              qid)


def test_a_query_judged_only_negative_is_a_query_with_nothing_judged(tmp_path: Path) -> None:
    """trec_eval 9 stops on it (or reads what an earlier query left); here its documents are unjudged."""
    per_query, _ = ours(*write_files({"q1": {"d1": -1, "d2": -2}, "q2": {"d1": 1}},
                                     {"q1": {"d1": 1.0, "d3": 0.5}, "q2": {"d1": 1.0}}, tmp_path), ["all_trec"])
    assert per_query["q1"]["relstring"] == ".-"
    assert per_query["q1"]["num_rel"] == per_query["q1"]["num_nonrel_judged_ret"] == 0
    assert {v for k, v in per_query["q1"].items() if k not in ("relstring", "num_ret", "utility")} == {0.0}
    assert per_query["q2"]["map"] == 1.0


def test_trec_order_breaks_ties_by_docno_descending() -> None:
    assert trec_order([("d1", 1.0), ("D3", 1.0), ("d10", 1.0), ("a", 2.0), ("d2", -1.0)]) == [
        "a", "d10", "d1", "D3", "d2"]


def test_measures_parse_as_trec_eval_reads_them() -> None:
    for name in TREC_MEASURES:
        assert parse_measures([name])
    assert [m.trec_name for m in parse_measures(["P_5", "P.10,5", "ndcg_cut.3"])] == ["P_5", "P_10", "ndcg_cut_3"]
    assert [m.trec_name for m in parse_measures(["iprec_at_recall_0.10", "set_F.0.5", "relstring.3", "utility"])
            ] == ["iprec_at_recall_0.10", "relstring_3", "utility", "set_F_0.5"]
    # trec_eval's order whatever the order given; registry names after, as given
    assert [m.trec_name for m in parse_measures(["nDCG@10", "P.5", "MAP", "map", "runid"])] == [
        "runid", "map", "P_5", "nDCG@10", "AP"]
    assert [m.trec_name for m in parse_measures(["official"])] == OFFICIAL
    assert [m.trec_name for m in parse_measures(["set"])][:5] == ["runid", "num_q", "num_ret", "num_rel",
                                                                  "num_rel_ret"]
    every = pytrec_eval.RelevanceEvaluator({"q": {"d": 1}}, {"all_trec"}).evaluate({"q": {"d": 1.0}})["q"]
    assert {m.trec_name for m in parse_measures(["all_trec"])} == set(every)  # 95 values
    for bad in ("P.x", "map.5", "P.0", "ndcg.1=3", "utility.1,2", "set_F.nan", "prefs", "bpref@5", "alpha-nDCG@10",
                "Foo"):
        with pytest.raises(TrecError):
            parse_measures([bad])
    assert set(NICKNAMES["all_trec"]) <= set(TREC_MEASURES)
    # RBP brings its residual along, as in replay (it was left out of the text output)
    assert [m.trec_name for m in parse_measures(["RBP(p=0.8)", "map"])] == ["map", "RBP(p=0.8)", "RBP-Res(p=0.8)"]
    # measures of what users did: a clear refusal (it was a message about gsb_metric, a setting never given)
    for behaviour in ("Reformulation", "QueriesPerSession", "CTR@10"):
        with pytest.raises(TrecError, match="a measure of what users did"):
            parse_measures([behaviour])


def test_bad_files_are_errors() -> None:
    with pytest.raises(TrecError, match="expected 4 fields"):
        read_qrels([b"q1 0 d1"])
    with pytest.raises(TrecError, match="expected 4 fields"):
        read_qrels([b"q1 0 d1 1 extra"])  # trec_eval refuses it too
    with pytest.raises(TrecError, match="at least 6 fields"):
        read_run([b"q1 Q0 d1 1 1.0"])
    with pytest.raises(TrecError, match="twice"):
        read_qrels([b"q1 0 d1 1", b"q1 0 d1 0"])
    with pytest.raises(TrecError, match="not a number"):
        read_run([b"q1 Q0 d1 1 high tag"])
    for nan in (b"nan", b"NaN", b"-nan"):  # (float() takes them; trec_eval's order of NaN is undefined)
        with pytest.raises(TrecError, match="NaN has no rank order"):
            read_run([b"q1 Q0 d1 1 " + nan + b" tag"])
    assert read_run([b"q1 Q0 d1 1 inf tag", b"q1 Q0 d2 2 -inf tag"]).docs == {"q1": [("d1", math.inf),
                                                                                ("d2", -math.inf)]}
    with pytest.raises(TrecError, match="twice"):
        read_run([b"q1 Q0 d1 1 1.0 tag", b"q1 Q0 d1 2 0.5 tag"])
    with pytest.raises(TrecError, match="out of range"):
        read_qrels([b"q1 0 d1 9223372036854775808"])


def test_files_without_a_query_in_common_are_an_error_not_a_crash(tmp_path: Path) -> None:
    """Query ids written differently in the run and the qrels (1 against Q1), or an empty run: a message and exit
    2, with or without -c (it was a ZeroDivisionError without it)."""
    qrels, run, empty = tmp_path / "qrels", tmp_path / "run", tmp_path / "empty"
    qrels.write_text("1 0 d1 1\n")
    run.write_text("Q1 Q0 d1 1 1.0 tag\n")
    empty.write_text("")
    for args in ((qrels, run), (qrels, empty), (qrels, run, "-c")):
        result = run_cli("trec", *map(str, args))
        assert result.returncode == 2 and "no query has both results and relevance judgements" in result.stderr
        assert "Traceback" not in result.stderr


def test_run_lines_may_have_fields_after_the_tag() -> None:
    """trec_eval reads six fields and skips the rest of the line; its runid is the last line's tag."""
    run = read_run([b"q1 Q0 d1 1 1.0 first 1 2 3", b"", b"q1\tQ0 d2 2 0.5 last extra"])
    assert run.docs == {"q1": [("d1", 1.0), ("d2", 0.5)]} and run.tag == "last"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stream_eval.cli", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture()
def small(tmp_path: Path) -> tuple[str, str]:
    qrels = {"q1": {"d1": 1, "d2": 0, "d3": 2, "d4": -1}, "q2": {"d1": 1}, "q3": {"x": 1}}
    run = {"q1": {"d2": 1.0, "d1": 1.0, "d9": 0.5, "d4": 0.2}, "q2": {"d5": 3.0}, "q9": {"d1": 3.0}}
    qrels_path, run_path = write_files(qrels, run, tmp_path, extra=2)
    return str(qrels_path), str(run_path)


@pytest.mark.slow
def test_cli_prints_trec_eval_lines(small: tuple[str, str]) -> None:
    result = run_cli("trec", *small, "-q", "-m", "ndcg_cut.10", "-m", "num_q", "-m", "P.2", "-m", "map",
                     "-m", "num_rel", "-m", "relstring", "-m", "gm_map")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "num_rel               \tq1\t2",
        "map                   \tq1\t0.2500",
        "P_2                   \tq1\t0.5000",
        "relstring             \tq1\t'01-.'",
        "ndcg_cut_10           \tq1\t0.2398",
        "num_rel               \tq2\t1",
        "map                   \tq2\t0.0000",
        "P_2                   \tq2\t0.0000",
        "relstring             \tq2\t'-'",
        "ndcg_cut_10           \tq2\t0.0000",
        "num_q                 \tall\t2",
        "num_rel               \tall\t3",
        "map                   \tall\t0.1250",
        "gm_map                \tall\t0.0016",
        "P_2                   \tall\t0.2500",
        "ndcg_cut_10           \tall\t0.1199",
    ]


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=qrels_and_runs(), query=st.booleans())
def test_default_output_is_trec_eval_official(data: tuple[Qrels, RunScores], query: bool, tmp_path: Path) -> None:
    """No ``-m``: trec_eval 9's 30 lines in its order (and with ``-q`` each query's, without runid, num_q and
    gm_map), each value pytrec_eval's to the 4 decimals printed."""
    qrels, run = data
    paths = [str(p) for p in write_files(qrels, run, tmp_path, extra=2)]
    result = run_cli("trec", *paths, *(["-q"] if query else []))
    assert result.returncode == 0, result.stderr
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    expected = pytrec_eval.RelevanceEvaluator(qrels, {"official"}).evaluate(run)
    summary = [(name.rstrip(), value) for name, qid, value in lines if qid == "all"]
    assert [name for name, _ in summary] == OFFICIAL
    assert all(len(name) == 22 for name, qid, _ in lines)
    each = [(name.rstrip(), qid, value) for name, qid, value in lines if qid != "all"]
    per_query_names = [n for n in OFFICIAL if n not in ("runid", "num_q", "gm_map")]
    assert [(name, qid) for name, qid, _ in each] == ([(name, qid) for qid in sorted(expected, key=str.encode)
                                                       for name in per_query_names] if query else [])
    for name, qid, value in each:
        assert float(value) == pytest.approx(expected[qid][name], abs=5.1e-5), (qid, name)
    for name, value in summary[1:]:
        values = [row[name] for row in expected.values()]
        assert float(value) == pytest.approx(pytrec_eval.compute_aggregated_measure(name, values), abs=5.1e-5), name
    assert summary[0][1] == "tag1"


@pytest.mark.slow
def test_cli_json_and_errors(small: tuple[str, str]) -> None:
    report = json.loads(run_cli("trec", *small, "--json", "-c", "-q", "-m", "map", "-m", "num_ret",
                                "-m", "gm_map", "-m", "runid").stdout)
    assert report["trec"] == {"num_q": 3, "runid": "tag1",
                              "all": {"num_ret": 5, "map": pytest.approx(0.25 / 3), "gm_map": pytest.approx(
                                  math.exp((math.log(0.25) + 2 * math.log(1e-5)) / 3))},
                              "queries": {"q1": {"num_ret": 4, "map": 0.25}, "q2": {"num_ret": 1, "map": 0.0}}}
    assert report["overall"]["requests"] == 2 and report["overall"]["metrics"]["MAP"] == 0.125
    unknown = run_cli("trec", *small, "-m", "prefs_simp")
    assert unknown.returncode == 2 and "prefs_simp" in unknown.stderr


def _trec_eval() -> str:
    """trec_eval: the one ``scripts/trec_eval/fetch`` puts in ``.cache/trec_eval`` (what ``scripts/test`` runs), else
    the PATH's. Missing: the test is skipped, and fails in CI."""
    fetched = Path(__file__).resolve().parent.parent / ".cache" / "trec_eval" / "trec_eval"
    found = str(fetched) if fetched.exists() else shutil.which("trec_eval")
    if found is None:
        if in_ci():
            pytest.fail("no trec_eval: scripts/trec_eval/fetch puts one in .cache/trec_eval", pytrace=False)
        pytest.skip("no trec_eval program (scripts/trec_eval/fetch fetches one)")
    return found


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=qrels_and_runs(), options=st.sampled_from([[], ["-q", "-m", "all_trec"], ["-q", "-c", "-m", "all_trec"],
                                                      ["-M", "3", "-q", "-m", "all_trec"]]))
@pytest.mark.slow
def test_output_is_trec_eval_byte_for_byte(data: tuple[Qrels, RunScores], options: list[str], tmp_path: Path) -> None:
    _agrees_with_trec_eval(options, [str(p) for p in write_files(*data, tmp_path, extra=2)])


def _agrees_with_trec_eval(options: list[str], paths: list[str]) -> subprocess.CompletedProcess[str]:
    """``stream-eval trec`` prints what trec_eval prints, byte for byte, with ``options`` on ``paths``; trec_eval's
    run."""
    expected = subprocess.run([_trec_eval(), *options, *paths], capture_output=True, text=True, timeout=60)
    assert run_cli("trec", *options, *paths).stdout == expected.stdout
    return expected


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "trec"


def _readme_sample() -> list[str]:
    """The lines of the README's sample output of ``stream-eval trec`` (the block that starts with ``runid``), less
    the lines that stand for several (``...``)."""
    readme = (EXAMPLE.parent.parent / "README.md").read_text(encoding="utf-8")
    block = readme.split("```\nrunid", 1)[1].split("```", 1)[0]
    return [line for line in ("runid" + block).splitlines() if line and not line.startswith("...")]


def test_the_readme_sample_is_what_the_example_files_give() -> None:
    sample = _readme_sample()
    printed = run_cli("trec", str(EXAMPLE / "qrels.txt"), str(EXAMPLE / "run.txt")).stdout.splitlines()
    assert len(sample) >= 10 and [line for line in printed if line in sample] == sample


@pytest.mark.slow
def test_the_example_files_give_trec_eval_byte_for_byte() -> None:
    for options in ([], ["-q", "-m", "all_trec"]):
        expected = _agrees_with_trec_eval(options, [str(EXAMPLE / "qrels.txt"), str(EXAMPLE / "run.txt")])
        assert expected.returncode == 0 and expected.stdout


def test_trec_config_keeps_every_document() -> None:
    config = trec_config(["P@5"], 5000)
    assert config.max_items == 5000 and config.gain == "linear" and config.cutoffs == (5,)
    assert trec_config(["AP(rel=2)"], 10, Config(rel_threshold=3)).rel_threshold == 1


def test_lines_skip_what_trec_eval_does_not_print(tmp_path: Path) -> None:
    """relstring has no ``all`` line; gm_map, num_q and runid no per-query line."""
    qrels_path, run_path = write_files({"q1": {"d1": 1}}, {"q1": {"d1": 1.0}}, tmp_path)
    measures = parse_measures(["runid", "num_q", "gm_map", "relstring"])
    result = evaluate(read_qrels(qrels_path.read_bytes().splitlines()),
                      read_run(run_path.read_bytes().splitlines()), measures)
    assert [line.split("\t")[:2] for line in trec_lines(result, measures, per_query=True)] == [
        ["relstring             ", "q1"], ["runid                 ", "all"], ["num_q                 ", "all"],
        ["gm_map                ", "all"]]
