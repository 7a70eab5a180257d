"""Agreement with independent implementations: pytrec_eval (trec_eval) and scikit-learn, to 1e-9.

trec_eval mapping: run scores decrease with the served position (so trec order = served order), qrels are
all judged grades (int, shown or not). trec_eval only scores queries with a relevant judgment, so the list
metrics are compared on those; our empty requests are checked on their own.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytrec_eval
from sklearn.metrics import roc_auc_score
from support import AbstractTimeConfig as Config

from stream_eval.engine.compiled import PAIRWISE, grouped_session_auc
from stream_eval.engine.engine import Engine
from stream_eval.events.schema import Feedback, Invalid, Ranking, finish
from stream_eval.metrics.auc import auc, gauc_weights, session_auc
from stream_eval.metrics.kernels import JudgedBatch, evaluate_batch, evaluate_request

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


def to_trec(requests):
    qrels, run = {}, {}
    for req in requests:
        n = len(req["items"])
        run[req["qid"]] = {item: float(n - i) for i, item in enumerate(req["items"])}
        judged = {item: g for item, g in zip(req["items"], req["grades"], strict=True) if g is not None}
        judged.update(req["unshown"])
        if judged:
            qrels[req["qid"]] = dict(judged)
    return qrels, run


def to_batch(requests):
    shown, unshown = [], []
    for r, req in enumerate(requests):
        for i, g in enumerate(req["grades"]):
            if g:
                shown.append((r, i + 1, float(g)))
        for g in req["unshown"].values():
            if g:
                unshown.append((r, float(g)))
    return JudgedBatch.from_lists([len(req["items"]) for req in requests], shown, unshown)


def n_relevant(req, threshold):
    grades = [g for g in req["grades"] if g is not None] + list(req["unshown"].values())
    return sum(g >= threshold for g in grades)


MEASURES = {"map", "recip_rank"} | {f"{m}.{','.join(map(str, CUTOFFS))}" for m in ("ndcg_cut", "P", "recall")}
OURS_OF_TREC = {"map": "AP", "recip_rank": "RR"} | {
    f"{t}_{k}": f"{o}@{k}" for k in CUTOFFS for t, o in (("ndcg_cut", "nDCG"), ("P", "P"), ("recall", "R"))
}
BINARY = {name: ours for name, ours in OURS_OF_TREC.items() if not name.startswith("ndcg")}


def compare(ours_row: dict[str, float], trec_row: dict[str, float], names: dict[str, str], qid: str) -> None:
    for trec_name, our_name in names.items():
        assert ours_row[our_name] == pytest.approx(trec_row[trec_name], abs=TOL), (qid, trec_name)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_kernels_match_trec_eval(seed):
    requests = generate_requests(seed)
    qrels, run = to_trec(requests)
    trec = pytrec_eval.RelevanceEvaluator(qrels, MEASURES).evaluate(run)
    config = Config(gain="linear", cutoffs=CUTOFFS)
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
    config = Config(gain="linear", cutoffs=CUTOFFS)
    for req in requests:
        if n_relevant(req, 1) == 0:
            continue
        grades = [g or 0 for g in req["grades"]]
        ours = evaluate_request(grades, config, unshown=list(req["unshown"].values()))
        compare(ours, trec[req["qid"]], OURS_OF_TREC, req["qid"])


@pytest.mark.parametrize("seed", [4, 5])
def test_relevance_level_2_matches_rel_threshold_2(seed):
    requests = generate_requests(seed)
    qrels, run = to_trec(requests)
    measures = {"map", "recip_rank"} | {f"{m}.{','.join(map(str, CUTOFFS))}" for m in ("P", "recall")}
    trec = pytrec_eval.RelevanceEvaluator(qrels, measures, relevance_level=2).evaluate(run)
    result = evaluate_batch(to_batch(requests), Config(gain="linear", cutoffs=CUTOFFS, rel_threshold=2.0))
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
        # grades below the threshold still give a DCG: "zero" only sets the SPEC's list to 0.
        # alpha-nDCG has no list kernel (it needs subtopics): the engine fills it, evaluate_batch leaves NaN.
        kernel_columns = [j for j, spec in enumerate(result.specs) if spec.family != "alpha-nDCG"]
        assert not np.isnan(rows[:, kernel_columns]).any()


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
    config = Config(gain="linear", cutoffs=CUTOFFS, empty="skip")
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
        ours: trec_name for trec_name, ours in OURS_OF_TREC.items() if "@" in ours
    }
    for ours, trec_name in means.items():
        expected = float(np.mean([trec[q][trec_name] for q in scored]))
        assert overall["metrics"][ours] == pytest.approx(expected, abs=TOL), ours
    assert report["events"]["invalid"] == 0 and report["events"]["late"] == 0
