"""Agreement with independent implementations: pytrec_eval (trec_eval), ir_measures and scikit-learn, to 1e-9.

Oracle input: run scores do not increase with the served position, with ties when a request says so; each
oracle breaks ties its own way (trec_eval by docno descending, ir_measures' Judged by doc id ascending, cwl_eval
keeps the run's order), so the doc ids are chosen to make every oracle's order the served order. Qrels are all
judged grades (int, shown or not, 0 included); an item without feedback is unjudged, which every oracle (like us)
takes as non-relevant. trec_eval only scores queries with a relevant judgment, so the list metrics are compared on
those; our empty requests are checked on their own.
"""

from __future__ import annotations

import math

import ir_measures
import numpy as np
import pytest
import pytrec_eval
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle_cover import oracle_for
from sklearn.metrics import roc_auc_score
from support import AbstractTimeConfig as Config

from stream_eval.engine.compiled import PAIRWISE, grouped_session_auc
from stream_eval.engine.engine import Engine
from stream_eval.events.schema import Feedback, Invalid, Ranking, finish
from stream_eval.metrics.auc import auc, gauc_weights, session_auc
from stream_eval.metrics.kernels import JudgedBatch, evaluate_batch, evaluate_request
from stream_eval.metrics.specs import DEFAULT_METRICS, parse

TOL = 1e-9
CUTOFFS = (5, 10, 20)
GRADE_P = [0.55, 0.2, 0.12, 0.08, 0.05]


def generate_requests(seed: int, n_requests: int = 400):
    """Requests as dicts: served item ids, their grades (None = unjudged), unshown judged items."""
    rng = np.random.RandomState(seed)
    requests = []
    for r in range(n_requests):
        n = int(rng.randint(1, 31))  # 1..30, many shorter than the cutoffs
        kind = rng.rand()
        items = [f"r{r}-d{i}" for i in range(n)]
        grades: list[int | None] = []
        for _ in range(n):
            if kind < 0.1:  # empty request: everything judged 0 or unjudged
                grades.append(0 if rng.rand() < 0.7 else None)
            elif rng.rand() < 0.8:
                grades.append(int(rng.choice(5, p=GRADE_P)))
            else:
                grades.append(None)
        unshown = {}
        if kind >= 0.1:
            for j in range(int(rng.randint(0, 5))):
                unshown[f"r{r}-u{j}"] = int(rng.choice(5, p=GRADE_P))
        elif rng.rand() < 0.5:
            unshown[f"r{r}-u0"] = 0
        requests.append({"qid": f"r{r}", "items": items, "grades": grades, "unshown": unshown})
    return requests


def docno(qid: str, i: int, ties: str) -> str:
    """The id of the item at 0-based position i that puts it in served order among equal scores: ``desc`` for
    trec_eval (ties by docno descending), ``asc`` for ir_measures' Judged (by doc id ascending)."""
    return f"{qid}-d{9999 - i if ties == 'desc' else i:04d}"


def to_trec(requests, ties: str = "desc"):
    """qrels and run of the requests; a request's ``tie`` (default 1) is how many consecutive items share a score."""
    qrels, run = {}, {}
    for req in requests:
        n, tie = len(req["grades"]), req.get("tie", 1)
        items = [docno(req["qid"], i, ties) for i in range(n)]
        run[req["qid"]] = {item: float((n - 1 - i) // tie) for i, item in enumerate(items)}
        judged = {item: g for item, g in zip(items, req["grades"], strict=True) if g is not None}
        judged.update(req["unshown"])
        if judged:
            qrels[req["qid"]] = dict(judged)
    return qrels, run


def to_batch(requests):
    shown, unshown = [], []
    for r, req in enumerate(requests):
        for i, g in enumerate(req["grades"]):
            if g is not None:  # grade 0: judged non-relevant
                shown.append((r, i + 1, float(g)))
        for g in req["unshown"].values():
            if g:
                unshown.append((r, float(g)))
    return JudgedBatch.from_lists([len(req["grades"]) for req in requests], shown, unshown)


def n_relevant(req, threshold):
    grades = [g for g in req["grades"] if g is not None] + list(req["unshown"].values())
    return sum(g >= threshold for g in grades)


MEASURES = {"map", "recip_rank"} | {
    f"{m}.{','.join(map(str, CUTOFFS))}" for m in ("ndcg_cut", "P", "recall", "map_cut")
}
OURS_OF_TREC = {"map": "AP", "recip_rank": "RR"} | {
    f"{t}_{k}": f"{o}@{k}" for k in CUTOFFS
    for t, o in (("ndcg_cut", "nDCG"), ("P", "P"), ("recall", "R"), ("map_cut", "AP"))
}
BINARY = {name: ours for name, ours in OURS_OF_TREC.items() if not name.startswith("ndcg")}
#: The default measures and AP@k (trec_eval's map_cut) at every cutoff.
WITH_AP_AT_K = (*DEFAULT_METRICS, *(f"AP@{k}" for k in CUTOFFS))


def compare(ours_row: dict[str, float], trec_row: dict[str, float], names: dict[str, str], qid: str) -> None:
    for trec_name, our_name in names.items():
        assert ours_row[our_name] == pytest.approx(trec_row[trec_name], abs=TOL), (qid, trec_name)


@oracle_for("RR", "AP", "P", "R", "nDCG")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_kernels_match_trec_eval(seed):
    requests = generate_requests(seed)
    qrels, run = to_trec(requests)
    trec = pytrec_eval.RelevanceEvaluator(qrels, MEASURES).evaluate(run)
    config = Config(gain="linear", cutoffs=CUTOFFS, metrics=WITH_AP_AT_K)
    result = evaluate_batch(to_batch(requests), config)
    names = [s.name for s in result.specs]
    compared = 0
    for r, req in enumerate(requests):
        if n_relevant(req, 1) == 0:
            continue
        ours = dict(zip(names, result.values[r].tolist(), strict=True))
        compare(ours, trec[req["qid"]], OURS_OF_TREC, req["qid"])
        compared += 1
    assert compared > 300
    assert sum(len(r["items"]) < 20 for r in requests) > 200  # lists shorter than a cutoff are covered


@pytest.mark.parametrize("seed", [3])
def test_evaluate_request_matches_trec_eval(seed):
    requests = generate_requests(seed, 200)
    qrels, run = to_trec(requests)
    trec = pytrec_eval.RelevanceEvaluator(qrels, MEASURES).evaluate(run)
    config = Config(gain="linear", cutoffs=CUTOFFS, metrics=WITH_AP_AT_K)
    compared = 0
    for req in requests:
        if n_relevant(req, 1) == 0:
            continue
        ours = evaluate_request(req["grades"], config, unshown=list(req["unshown"].values()))
        compare(ours, trec[req["qid"]], OURS_OF_TREC, req["qid"])
        compared += 1
    assert compared > 150


@pytest.mark.parametrize("seed", [4, 5])
def test_relevance_level_2_matches_rel_threshold_2(seed):
    requests = generate_requests(seed)
    qrels, run = to_trec(requests)
    measures = {"map", "recip_rank"} | {f"{m}.{','.join(map(str, CUTOFFS))}" for m in ("P", "recall", "map_cut")}
    trec = pytrec_eval.RelevanceEvaluator(qrels, measures, relevance_level=2).evaluate(run)
    config = Config(gain="linear", cutoffs=CUTOFFS, rel_threshold=2.0, metrics=WITH_AP_AT_K)
    result = evaluate_batch(to_batch(requests), config)
    names = [s.name for s in result.specs]
    compared = 0
    for r, req in enumerate(requests):
        if n_relevant(req, 2) == 0:
            continue
        ours = dict(zip(names, result.values[r].tolist(), strict=True))
        compare(ours, trec[req["qid"]], BINARY, req["qid"])
        compared += 1
    assert compared > 200


@pytest.mark.parametrize("empty", ["zero", "skip"])
def test_empty_requests_policy(empty):
    requests = generate_requests(6)
    config = Config(gain="linear", cutoffs=CUTOFFS, empty=empty)
    result = evaluate_batch(to_batch(requests), config)
    is_empty = np.array([n_relevant(req, 1) == 0 for req in requests])
    assert is_empty.sum() > 20
    assert result.empty.tolist() == is_empty.tolist()
    assert result.n_relevant.tolist() == [n_relevant(req, 1) for req in requests]
    rows = result.values[is_empty]
    for j, spec in enumerate(result.specs):
        column = rows[:, j]
        if empty == "skip":
            assert np.isnan(column).all(), spec.name
        elif spec.family in ("RR", "AP", "nDCG", "R", "ERR", "P"):
            assert (column == 0.0).all(), spec.name
    if empty == "zero":
        # grades below the threshold still give a DCG: "zero" only sets the list of docs/contract.md §2 to 0.
        # alpha-nDCG has no list kernel (it needs subtopics): the engine fills it, evaluate_batch leaves NaN.
        kernel_columns = [j for j, spec in enumerate(result.specs) if spec.family != "alpha-nDCG"]
        assert not np.isnan(rows[:, kernel_columns]).any()


# -- measures with parameters, and those trec_eval and ir_measures add (docs/contract.md §7) -------------------
ORACLE_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ORACLE_CUTOFFS = (1, 3, 5, 10)


@st.composite
def oracle_requests(draw):
    """A batch of requests: served grades (None = unjudged, 0 = judged non-relevant), grades of judged items that
    were not served, and how many consecutive items share a run score (ties)."""
    grade = st.one_of(st.none(), st.integers(0, 4))
    requests = []
    for r in range(draw(st.integers(1, 12))):
        requests.append({
            "qid": f"q{r}",
            "grades": draw(st.lists(grade, min_size=1, max_size=25)),
            "unshown": {f"q{r}-u{j}": g for j, g in enumerate(draw(st.lists(st.integers(0, 4), max_size=4)))},
            "tie": draw(st.integers(1, 4)),
        })
    return requests


def ours_by_request(requests, config):
    result = evaluate_batch(to_batch(requests), config)
    names = [s.name for s in result.specs]
    return {req["qid"]: dict(zip(names, result.values[r].tolist(), strict=True)) for r, req in enumerate(requests)}


def check(ours, expected: dict[str, dict[str, float]], names: dict[str, str]) -> int:
    """Compare ``expected[qid][oracle name]`` with ``ours[qid][our name]``; the number of values compared."""
    compared = 0
    for qid, row in expected.items():
        for oracle_name, our_name in names.items():
            assert ours[qid][our_name] == pytest.approx(row[oracle_name], abs=TOL), (qid, our_name, row)
            compared += 1
    return compared


@oracle_for("RR", "AP", "P", "R", "R-Prec", "Success")
@ORACLE_SETTINGS
@given(requests=oracle_requests(), rel=st.integers(1, 3), explicit=st.booleans())
def test_binary_measures_at_a_relevance_level_match_trec_eval(requests, rel, explicit):
    """``RR(rel=r)``, ``P(rel=r)@k``, ... (or the global ``rel_threshold = r``) are trec_eval's measures at
    ``relevance_level = r``, ties and unjudged items included."""
    qrels, run = to_trec(requests)
    ks = ",".join(map(str, ORACLE_CUTOFFS))
    measures = {"recip_rank", "map", "Rprec", f"P.{ks}", f"recall.{ks}", f"success.{ks}"}
    trec = pytrec_eval.RelevanceEvaluator(qrels, measures, relevance_level=rel).evaluate(run)
    param = f"(rel={rel})" if explicit else ""
    config = Config(rel_threshold=1.0 if explicit else float(rel), cutoffs=ORACLE_CUTOFFS,
                    metrics=tuple(f"{f}{param}" for f in ("RR", "AP", "R-Prec", "P", "R", "Success")))
    names = {"recip_rank": f"RR{param}", "map": f"AP{param}", "Rprec": f"R-Prec{param}"} | {
        f"{t}_{k}": f"{o}{param}@{k}" for k in ORACLE_CUTOFFS for t, o in (("P", "P"), ("recall", "R"),
                                                                          ("success", "Success"))}
    check(ours_by_request(requests, config), trec, names)


@oracle_for("nDCG")
@ORACLE_SETTINGS
@given(requests=oracle_requests())
def test_ndcg_with_linear_gain_in_its_name_matches_trec_eval(requests):
    """``nDCG(gain=linear)@k`` is trec_eval's ``ndcg_cut`` whatever the global gain."""
    qrels, run = to_trec(requests)
    trec = pytrec_eval.RelevanceEvaluator(qrels, {f"ndcg_cut.{','.join(map(str, ORACLE_CUTOFFS))}"}).evaluate(run)
    trec = {q: row for q, row in trec.items() if n_relevant(next(r for r in requests if r["qid"] == q), 1)}
    config = Config(gain="exp", cutoffs=ORACLE_CUTOFFS, metrics=("nDCG(gain=linear)", "nDCG"))
    ours = ours_by_request(requests, config)
    check(ours, trec, {f"ndcg_cut_{k}": f"nDCG(gain=linear)@{k}" for k in ORACLE_CUTOFFS})


def ir_measures_values(qrels, run, measures) -> dict[str, dict[str, float]]:
    """``qid -> {name as given: value}`` (ir_measures may spell a measure differently)."""
    parsed = {ir_measures.parse_measure(m): m for m in measures}
    out: dict[str, dict[str, float]] = {}
    for metric in ir_measures.iter_calc(list(parsed), qrels, run):
        out.setdefault(metric.query_id, {})[parsed[metric.measure]] = metric.value
    return out


@oracle_for("Judged")
@ORACLE_SETTINGS
@given(requests=oracle_requests())
def test_judged_matches_ir_measures(requests):
    """``Judged@k``: judged items (grade 0 too) in the top k over min(k, served); ``Judged``: the whole list."""
    qrels, run = to_trec(requests, ties="asc")
    measures = ["Judged"] + [f"Judged@{k}" for k in ORACLE_CUTOFFS]
    expected = ir_measures_values(qrels, run, measures)
    ours = ours_by_request(requests, Config(metrics=tuple(measures)))
    assert check(ours, expected, {m: m for m in measures}) == len(qrels) * len(measures)


@oracle_for("RBP", "RBP-Res")
@ORACLE_SETTINGS
@given(requests=oracle_requests(), rel=st.integers(1, 3), p=st.sampled_from([0.5, 0.8, 0.95]))
def test_rbp_and_its_residual_match_ir_measures(requests, rel, p):
    """``RBP(p=..,rel=..)`` is ir_measures' (cwl_eval's) binary RBP. Its residual ``RBP-Res`` is how much RBP
    grows when every unjudged served item and every item past the end of the list is relevant: cwl_eval's RBP
    of that optimistic run (padded until p^depth < 1e-12) minus the RBP."""
    qrels, run = to_trec(requests)
    measure = f"RBP(p={p},rel={rel})"
    lower = ir_measures_values(qrels, run, [measure])
    best = max(4, rel)
    optimistic_qrels, optimistic_run = {}, {}
    depth = int(math.ceil(math.log(1e-12) / math.log(p)))
    for req in requests:
        qid = req["qid"]
        judged = qrels.get(qid, {})
        items = list(run[qid])
        padding = [f"{qid}-pad{j}" for j in range(depth)]
        optimistic_run[qid] = run[qid] | {item: -1.0 - j for j, item in enumerate(padding)}
        optimistic_qrels[qid] = judged | {item: best for item in items + padding if item not in judged}
    upper = ir_measures_values(optimistic_qrels, optimistic_run, [measure])
    config = Config(metrics=(f"RBP(p={p},rel={rel})",))
    ours = ours_by_request(requests, config)
    name, residual = f"RBP(p={p:g},rel={rel})", f"RBP-Res(p={p:g})"
    assert list(ours[requests[0]["qid"]]) == [name, residual]  # the residual comes along
    assert check(ours, lower, {measure: name}) == len(qrels)
    assert len(upper) == len(requests)
    for qid, row in upper.items():
        assert ours[qid][residual] == pytest.approx(row[measure] - lower.get(qid, {}).get(measure, 0.0), abs=TOL)


# -- AUC and GAUC vs scikit-learn ----------------------------------------------------------------------------
def generate_sessions(seed: int, n_sessions: int = 600):
    rng = np.random.RandomState(seed)
    sizes = rng.randint(1, 41, size=n_sessions)
    session = np.repeat(np.arange(n_sessions), sizes)
    p_pos = rng.rand(n_sessions)[session]
    labels = rng.rand(session.shape[0]) < p_pos
    scores = np.round(rng.rand(session.shape[0]), 1)  # ties
    order = rng.permutation(session.shape[0])  # rows in any order
    return session[order], scores[order], labels[order]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("block", [None, 7])
def test_session_auc_matches_sklearn(seed, block, monkeypatch):
    session, scores, labels = generate_sessions(seed)
    n_sessions = int(session.max()) + 3  # two sessions without items at the end
    if block is not None:  # many blocks of sessions, in shuffled order: the large-input path
        monkeypatch.setattr("stream_eval.metrics.auc._BLOCK", block)
        order = np.random.default_rng(seed).permutation(session.shape[0])
        session, scores, labels = session[order], scores[order], labels[order]
    ours, positives, negatives = session_auc(session, scores, labels, n_sessions)
    single, both = 0, 0
    for s in range(n_sessions):
        mine = session == s
        y, x = labels[mine], scores[mine]
        assert positives[s] == y.sum() and negatives[s] == (~y).sum()
        if y.all() or not y.any():
            assert math.isnan(ours[s])
            single += 1
            continue
        assert ours[s] == pytest.approx(roc_auc_score(y, x), abs=TOL)
        assert auc(x.tolist(), y.tolist()) == pytest.approx(roc_auc_score(y, x), abs=TOL)
        both += 1
    assert single > 20 and both > 300


@pytest.mark.parametrize("pairwise", [0, PAIRWISE, 10_000])  # always sorted, as shipped, always pair by pair
def test_compiled_session_auc_matches_sklearn(pairwise):
    session, scores, labels = generate_sessions(3)
    order = np.argsort(session, kind="stable")  # grouped by session, as the engine hands them over
    session, scores, labels = session[order], scores[order], labels[order]
    n_sessions = int(session.max()) + 2  # a session without items at the end
    starts = np.searchsorted(session, np.arange(n_sessions + 1))
    ours, positives, negatives = grouped_session_auc(starts, scores, labels, pairwise)
    both = 0
    for s in range(n_sessions):
        y, x = labels[session == s], scores[session == s]
        assert positives[s] == y.sum() and negatives[s] == (~y).sum()
        if y.all() or not y.any():
            assert math.isnan(ours[s])
            continue
        assert ours[s] == pytest.approx(roc_auc_score(y, x), abs=TOL)
        both += 1
    assert both > 300


@pytest.mark.parametrize("weight", ["impressions", "clicks", "uniform"])
def test_gauc_weighted_mean_matches_sklearn(weight):
    session, scores, labels = generate_sessions(7)
    n_sessions = int(session.max()) + 1
    ours, positives, negatives = session_auc(session, scores, labels, n_sessions)
    w = gauc_weights(positives, negatives, weight)
    both = ~np.isnan(ours)
    ours_gauc = float(np.sum(ours[both] * w[both]) / np.sum(w[both]))
    aucs, weights = [], []
    for s in range(n_sessions):
        y, x = labels[session == s], scores[session == s]
        if y.all() or not y.any():
            continue
        aucs.append(roc_auc_score(y, x))
        weights.append({"impressions": len(y), "clicks": int(y.sum()), "uniform": 1}[weight])
    assert ours_gauc == pytest.approx(np.average(aucs, weights=weights), abs=TOL)


def session_events(seed: int, with_scores: bool, n_sessions: int = 150):
    """Sessions of 1..3 requests each (named session_id), labels as feedback; plus the sklearn view."""
    rng = np.random.RandomState(seed)
    events, per_session = [], []
    ts = 0.0
    for s in range(n_sessions):
        ys, xs = [], []
        p = rng.rand()
        for q in range(int(rng.randint(1, 4))):
            rid = f"s{s}-q{q}"
            n = int(rng.randint(1, 12))
            items = [f"{rid}-d{i}" for i in range(n)]
            scores = np.round(rng.rand(n), 1).tolist() if with_scores else None
            ts += 1.0
            events.append(Ranking(rid, items, ts=ts, scores=scores, session_id=f"s{s}"))
            for i, item in enumerate(items):
                grade = int(rng.choice(5, p=GRADE_P)) if rng.rand() < p else 0
                if grade or rng.rand() < 0.3:
                    events.append(Feedback(rid, item, kind="label", grade=float(grade), ts=ts + 0.5))
                ys.append(grade >= 1)
                xs.append(scores[i] if with_scores else -(i + 1.0))  # default: higher position, higher score
            if rng.rand() < 0.3:  # a judged item that was not served: no impression, no AUC effect
                events.append(Feedback(rid, f"{rid}-unserved", kind="label", grade=3.0, ts=ts + 0.5))
        per_session.append((np.array(ys), np.array(xs)))
    return events, per_session


@pytest.mark.parametrize("weight", ["impressions", "clicks", "uniform"])
@pytest.mark.parametrize("with_scores", [True, False])
@pytest.mark.parametrize("slices", [False, True])
def test_engine_gauc_matches_sklearn(weight, with_scores, slices, monkeypatch):
    if slices:  # every session closes at the end of input: scored 7 at a time (the large-input path)
        monkeypatch.setattr("stream_eval.engine.sessions._SCORE_AT_ONCE", 7)
    config = Config(gauc_weight=weight)
    events, per_session = session_events(11, with_scores)
    engine = Engine(config)
    checked = [finish(e, config) for e in events]
    assert not any(isinstance(e, Invalid) for e in checked)
    engine.process(checked)
    engine.flush()
    report = engine.report()
    aucs, weights = [], []
    for ys, xs in per_session:
        if ys.all() or not ys.any():
            continue
        aucs.append(roc_auc_score(ys, xs))
        weights.append({"impressions": len(ys), "clicks": int(ys.sum()), "uniform": 1}[weight])
    assert report["overall"]["sessions"] == len(aucs) > 50
    # the sessions left out, every impression of one class, are counted (the table view's "single-class")
    single = sum(bool(ys.all() or not ys.any()) for ys, _ in per_session)
    assert report["overall"]["single_class_sessions"] == single > 0
    assert report["overall"]["metrics"]["GAUC"] == pytest.approx(np.average(aucs, weights=weights), abs=TOL)


# -- the whole Engine path vs trec_eval ----------------------------------------------------------------------
def request_events(requests, rng):
    events = []
    for r, req in enumerate(requests):
        ts = float(r)
        events.append(Ranking(req["qid"], req["items"], ts=ts))
        labels = [(item, g) for item, g in zip(req["items"], req["grades"], strict=True) if g is not None]
        labels += list(req["unshown"].items())
        for item, g in labels:
            events.append(Feedback(req["qid"], item, kind="label", grade=float(g), ts=ts + 1.0))
            if g >= 1 and rng.rand() < 0.3:  # a lower label and a click: the maximum grade stands
                events.append(Feedback(req["qid"], item, kind="label", grade=float(g) - 1.0, ts=ts + 2.0))
                events.append(Feedback(req["qid"], item, kind="click", ts=ts + 3.0))
    rng.shuffle(events)  # arrival order is not event-time order; all within the attribution window
    return events


@pytest.mark.parametrize("seed", [8, 9])
def test_engine_report_matches_trec_eval_means(seed):
    requests = generate_requests(seed)
    rng = np.random.RandomState(seed)
    config = Config(gain="linear", cutoffs=CUTOFFS, empty="skip", metrics=WITH_AP_AT_K)
    events = [finish(e, config) for e in request_events(requests, rng)]
    assert not any(isinstance(e, Invalid) for e in events)
    engine = Engine(config)
    engine.process(events)
    engine.flush()
    report = engine.report()

    qrels, run = to_trec(requests)
    trec = pytrec_eval.RelevanceEvaluator(qrels, MEASURES).evaluate(run)
    scored = [req["qid"] for req in requests if n_relevant(req, 1) > 0]
    overall = report["overall"]
    assert overall["requests"] == len(requests)
    assert overall["empty"] == len(requests) - len(scored)
    means = {"MRR": "recip_rank", "MAP": "map"} | {
        parse(ours).mean_name: trec_name for trec_name, ours in OURS_OF_TREC.items() if "@" in ours
    }
    for ours, trec_name in means.items():
        expected = float(np.mean([trec[q][trec_name] for q in scored]))
        assert overall["metrics"][ours] == pytest.approx(expected, abs=TOL), ours
    assert report["events"]["invalid"] == 0 and report["events"]["late"] == 0
