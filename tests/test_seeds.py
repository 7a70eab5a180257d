"""Every worked example of the seed documents (the blog posts on ranking metrics whose examples define the metrics
of docs/contract.md §2), computed by stream_eval's own code.

The seeds round their results (0.961, 0.83, 8.37, ...); each test says which tolerance the rounding allows.
"""

from __future__ import annotations

import math

import pytest
from oracle_cover import oracle_for
from support import AbstractTimeConfig as Config

from stream_eval.engine.engine import Engine
from stream_eval.events.schema import Feedback, Invalid, Judgment, Ranking, finish
from stream_eval.metrics.alpha import alpha_dcg, alpha_ndcg, subtopic_counts_above
from stream_eval.metrics.gsb import GsbCounts, metric_verdict
from stream_eval.metrics.kernels import evaluate_request

LINEAR6 = Config(gain="linear", cutoffs=(6,))
SHOWN = [3, 2, 3, 0, 1, 2]  # D1..D6 of seeds 001, 003 and 004


def run_engine(requests, config, judgments=()):
    """Run requests through the Engine as ranking + label events; returns (report, per-request records).

    ``requests`` is a list of ``(shown_grades, unshown_grades)``; every item gets a label event (grade 0 too).
    """
    records = []
    engine = Engine(config, on_finalised=lambda batch: records.extend(batch.records()))
    events = []
    for r, (shown, unshown) in enumerate(requests):
        rid = f"q{r + 1}"
        items = [f"{rid}-d{i + 1}" for i in range(len(shown))]
        events.append(Ranking(rid, items, ts=float(r)))
        for item, grade in zip(items, shown, strict=True):
            events.append(Feedback(rid, item, kind="label", grade=float(grade), ts=float(r) + 1.0))
        for j, grade in enumerate(unshown):
            item = f"{rid}-u{j + 1}"
            events.append(Feedback(rid, item, kind="label", grade=float(grade), ts=float(r) + 2.0))
    for experiment, query_id, verdict in judgments:
        events.append(Judgment(experiment, query_id, verdict, ts=10.0))
    checked = [finish(event, config) for event in events]
    assert not any(isinstance(event, Invalid) for event in checked)
    engine.process(checked)
    engine.flush()
    return engine.report(), {rec["request_id"]: rec["metrics"] for rec in records}


# -- seeds 001 / 004: nDCG, linear gain, D1..D6 graded 3, 2, 3, 0, 1, 2 --------------------------------------
@oracle_for("DCG")
def test_seed_dcg6_is_6_861():
    assert evaluate_request(SHOWN, LINEAR6)["DCG@6"] == pytest.approx(6.861, abs=5e-4)


def test_seed004_ndcg6_shown_only_is_0_961():
    # Seed 004: ideal 3,3,2,2,1,0 from the shown judgments only -> 6.86 / 7.14 = 96.08 %.
    assert evaluate_request(SHOWN, LINEAR6)["nDCG@6"] == pytest.approx(0.961, abs=5e-4)


def test_seed004_idcg6_shown_only_is_7_14_by_ratio():
    values = evaluate_request(SHOWN, LINEAR6)
    assert values["DCG@6"] / values["nDCG@6"] == pytest.approx(7.14, abs=5e-3)


def test_seed001_ndcg6_with_unshown_d7_d8_is_0_785():
    # Seed 001: ideal 3,3,2,2,1,0 is stated but IDCG 8.740 needs the judged-but-unshown D7=3, D8=2
    # (ideal 3,3,3,2,2,2): that is the reading of docs/contract.md §2.
    assert evaluate_request(SHOWN, LINEAR6, unshown=[3, 2])["nDCG@6"] == pytest.approx(0.785, abs=5e-4)


def test_seed001_idcg6_with_unshown_is_8_740_by_ratio():
    values = evaluate_request(SHOWN, LINEAR6, unshown=[3, 2])
    assert values["DCG@6"] == pytest.approx(6.861, abs=5e-4)  # unshown items do not change the DCG
    assert values["DCG@6"] / values["nDCG@6"] == pytest.approx(8.740, abs=5e-4)


def test_seed003_variant_ideal_3_3_3_2_2_1():
    # Seed 003: same served grades; the query's judged documents are 3,3,3,2,2,1 -> one extra unshown 3.
    # The seed sums rounded terms: IDCG = 3 + 1.89 + 1.5 + 0.86 + 0.77 + 0.35 = 8.37, nDCG = 81.96 %.
    values = evaluate_request(SHOWN, LINEAR6, unshown=[3])
    idcg = values["DCG@6"] / values["nDCG@6"]
    assert idcg == pytest.approx(3 + 1.89 + 1.5 + 0.86 + 0.77 + 0.35, abs=0.02)
    assert values["DCG@6"] == pytest.approx(6.86, abs=5e-3)
    assert values["nDCG@6"] == pytest.approx(0.8196, abs=0.002)


def test_seed001_calc_ndcg_code_agrees_with_exp_gain():
    # Seed 001 ships a Python calc_ndcg (exp gain 2^r - 1, ideal over the same list); ported verbatim.
    def calc_dcg(sorted_vec, at):
        ranking = [t[1] for t in sorted_vec[0:at]]
        return sum([(2**r - 1) / math.log(i + 2, 2) for i, r in enumerate(ranking)])

    def calc_ndcg(vec, at):
        ideal_dcg = calc_dcg(sorted(vec, key=lambda t: t[1], reverse=True), at)
        cur_dcg = calc_dcg(sorted(vec, key=lambda t: t[0], reverse=True), at)
        return 0 if ideal_dcg == 0 else cur_dcg / ideal_dcg

    vec = [(len(SHOWN) - i, g) for i, g in enumerate(SHOWN)]  # predict score decreasing = served order
    for at in (1, 3, 6, 10):
        ours = evaluate_request(SHOWN, Config(gain="exp", cutoffs=(at,)))[f"nDCG@{at}"]
        assert ours == pytest.approx(calc_ndcg(vec, at), abs=1e-12)


# -- seeds 000 / 001: MRR = (1/3 + 1/1 + 1/5 + 0) / 4 = 0.383 ----------------------------------------------
MRR_REQUESTS = [([0, 0, 1, 0, 0], []), ([1, 0, 0], []), ([0, 0, 0, 0, 1, 0], []), ([0, 0, 0, 0], [])]


def test_seed_mrr_0_383_per_request():
    values = [evaluate_request(shown, Config(), unshown=unshown)["RR"] for shown, unshown in MRR_REQUESTS]
    assert values == [pytest.approx(1 / 3), 1.0, pytest.approx(1 / 5), 0.0]
    assert sum(values) / 4 == pytest.approx(0.383, abs=5e-4)


def test_seed_mrr_0_383_through_engine():
    # The fourth query has no relevant judgment at all: the default empty policy "zero" counts it as 0.
    report, records = run_engine(MRR_REQUESTS, Config())
    assert report["overall"]["requests"] == 4
    assert report["overall"]["empty"] == 1
    assert records["q4"]["RR"] == 0.0
    assert report["overall"]["metrics"]["MRR"] == pytest.approx((1 / 3 + 1 + 1 / 5) / 4, abs=1e-12)
    assert report["overall"]["metrics"]["MRR"] == pytest.approx(0.383, abs=5e-4)


def test_seed_mrr_0_383_fourth_query_with_unretrieved_answer():
    # Reading "no correct answer found" as: a relevant document exists but was not served -> RR 0, not empty.
    requests = MRR_REQUESTS[:3] + [([0, 0, 0, 0], [1])]
    for empty in ("zero", "skip"):
        report, records = run_engine(requests, Config(empty=empty))
        assert report["overall"]["empty"] == 0
        assert records["q4"]["RR"] == 0.0
        assert report["overall"]["metrics"]["MRR"] == pytest.approx(0.383, abs=5e-4)


# -- seed 000: AP 0.83 and 0.45, MAP 0.64 ------------------------------------------------------------------
AP_QUERY1 = ([1, 1, 0, 1, 0, 0, 1], [])  # 4 relevant, retrieved at ranks 1, 2, 4, 7
AP_QUERY2 = ([1, 0, 1, 0, 1], [1, 1])  # 5 relevant, retrieved at 1, 3, 5; two judged but not served


def test_seed000_ap_query1_is_0_83():
    ap = evaluate_request(AP_QUERY1[0], Config(), unshown=AP_QUERY1[1])["AP"]
    assert ap == pytest.approx((1 / 1 + 2 / 2 + 3 / 4 + 4 / 7) / 4, abs=1e-12)
    assert ap == pytest.approx(0.83, abs=5e-3)


def test_seed000_ap_query2_is_0_45():
    ap = evaluate_request(AP_QUERY2[0], Config(), unshown=AP_QUERY2[1])["AP"]
    assert ap == pytest.approx((1 / 1 + 2 / 3 + 3 / 5) / 5, abs=1e-12)
    assert ap == pytest.approx(0.45, abs=5e-3)


def test_seed000_map_is_0_64_through_engine():
    report, records = run_engine([AP_QUERY1, AP_QUERY2], Config())
    assert records["q1"]["AP"] == pytest.approx(0.83, abs=5e-3)
    assert records["q2"]["AP"] == pytest.approx(0.45, abs=5e-3)
    assert report["overall"]["metrics"]["MAP"] == pytest.approx(0.64, abs=5e-3)
    mean_ap = (records["q1"]["AP"] + records["q2"]["AP"]) / 2
    assert report["overall"]["metrics"]["MAP"] == pytest.approx(mean_ap, abs=1e-12)


# -- seed 003: AP 0.57 (served D2, D5, D3, D6, D4; D1 relevant but not retrieved) -------------------------
def test_seed003_ap_0_57():
    relevant = {"D1", "D2", "D3", "D4"}
    served = ["D2", "D5", "D3", "D6", "D4"]
    grades = [1 if d in relevant else 0 for d in served]
    ap = evaluate_request(grades, Config(), unshown=[1])["AP"]  # D1
    assert ap == pytest.approx((1 / 1 + 2 / 3 + 3 / 5) / 4, abs=1e-12)
    assert ap == pytest.approx(0.57, abs=5e-3)


# -- seed 002: AP = (1/1 + 2/3 + 3/6) / 3 (three relevant at positions 1, 3, 6) ------------------------------
def test_seed002_ap_positions_1_3_6():
    ap = evaluate_request([1, 0, 1, 0, 0, 1], Config())["AP"]
    assert ap == pytest.approx((1 / 1 + 2 / 3 + 3 / 6) / 3, abs=1e-12)


# -- seed 004: GSB = (1 - 2) / (1 + 1 + 2) = -0.25 ---------------------------------------------------------
GSB_VERDICTS = [("q1", "good"), ("q2", "same"), ("q3", "bad"), ("q4", "bad")]


def test_seed004_gsb_counts():
    counts = GsbCounts()
    for _, verdict in GSB_VERDICTS:
        counts.add(verdict)
    assert (counts.good, counts.same, counts.bad) == (1, 1, 2)
    assert counts.score == -0.25


def test_seed004_gsb_from_metric_verdicts():
    # The same four verdicts derived from per-query metric values of B (treatment) vs A (control).
    pairs = [(0.9, 0.5), (0.7, 0.7), (0.2, 0.6), (0.1, 0.3)]
    counts = GsbCounts()
    for treatment, control in pairs:
        counts.add(metric_verdict(treatment, control))
    assert [metric_verdict(t, c) for t, c in pairs] == [v for _, v in GSB_VERDICTS]
    assert counts.score == -0.25


def test_seed004_gsb_through_engine_judgments():
    judgments = [("B_vs_A", q, v) for q, v in GSB_VERDICTS]
    report, _ = run_engine([], Config(), judgments=judgments)
    assert report["events"]["judgment"] == 4
    rows = [row for row in report["gsb"] if row["source"] == "judgment"]
    expected = {"experiment": "B_vs_A", "source": "judgment", "good": 1, "same": 1, "bad": 2, "score": -0.25}
    assert [{k: row[k] for k in expected} for row in rows] == [expected]
    # four verdicts decide nothing: the always-valid sign test says so
    assert rows[0]["decision"] == "inconclusive" and rows[0]["p_value"] == 1.0


# -- seed 000: alpha-nDCG, N_i for doc_f -------------------------------------------------------------------
# Written literally as in the seed: doc_a is ["before","mid""after"], which Python concatenates into
# ["before", "midafter"] -- so doc_a does NOT have "after", and "after" above doc_f counts b and c only (2).
SEED_DOCS = {
    "doc_a": ["before", "mid" "after"],  # the seed's missing comma, kept on purpose
    "doc_b": ["mid", "after"],
    "doc_c": ["before", "after"],
    "doc_d": ["no_of_time", "mid"],
    "doc_e": ["before", "no_of_time"],
    # doc_f's list also holds '', '', 6, 1, 0.0, 1.0 (table residue); its subtopics C_d are before, after.
    "doc_f": ["before", "after"],
}


def test_seed000_alpha_literal_concatenation():
    assert SEED_DOCS["doc_a"] == ["before", "midafter"]


def test_seed000_alpha_counts_above_doc_f():
    docs = list(SEED_DOCS.values())
    counts = subtopic_counts_above(docs, [True] * len(docs), position=6)
    assert counts == {"before": 3, "after": 2}  # before: a, c, e; after: b, c


def test_seed000_alpha_counts_with_the_literal_lists_of_doc_f_and_doc_g():
    # The seed's lists for doc_f and doc_g, residue included, exactly as written.
    docs = [
        ["before", "mid" "after"],
        ["mid", "after"],
        ["before", "after"],
        ["no_of_time", "mid"],
        ["before", "no_of_time"],
        ["", "", 6, 1, 0.0, 1.0, "before", "after"],
        ["", "", 7, 1, 1.0, 1.0, "mid", "after"],
    ]
    counts = subtopic_counts_above(docs, [True] * len(docs), position=6)
    assert counts["before"] == 3
    assert counts["after"] == 2


def test_seed000_alpha_counts_only_relevant_items_above():
    docs = list(SEED_DOCS.values())
    relevant = [True, True, False, True, True, True]  # doc_c not relevant
    assert subtopic_counts_above(docs, relevant, position=6) == {"before": 2, "after": 1}


@oracle_for("alpha-nDCG")
def test_seed000_alpha_gain_of_doc_f():
    # gain(doc_f) = (1 - alpha)^3 + (1 - alpha)^2 with alpha = 1/2 ("通常情况，alpha取1/2"), checked through
    # alpha_ndcg: the alpha-DCG@6 of the six docs minus alpha-DCG@5 is doc_f's gain / log2(7).
    docs = list(SEED_DOCS.values())
    relevant = [True] * 6
    delta = alpha_dcg(docs, relevant, 6, 0.5) - alpha_dcg(docs, relevant, 5, 0.5)
    assert delta * math.log2(7) == pytest.approx(0.5**3 + 0.5**2, abs=1e-12)
    assert 0.0 < alpha_ndcg(docs, relevant, 6, 0.5) <= 1.0


# -- seeds 001 / 002: ERR = sum_r 1/r R_r prod_{i<r} (1 - R_i), R = (2^g - 1) / 2^max_grade ----------------
def err_reference(grades, k, max_grade):
    """Straightforward cascade loop over positions."""
    total, p_continue = 0.0, 1.0
    for r, g in enumerate(grades[:k], start=1):
        stop = (2.0 ** min(g, max_grade) - 1.0) / 2.0**max_grade
        total += p_continue * stop / r
        p_continue *= 1.0 - stop
    return total


@oracle_for("ERR")
def test_seed_err_hand_example():
    # Grades 2, 1 with max grade 2: R1 = 3/4, R2 = 1/4 -> ERR = 3/4 + (1/2)(1/4)(1/4) = 0.78125.
    config = Config(cutoffs=(2,), max_grade=2.0)
    assert evaluate_request([2, 1], config)["ERR@2"] == pytest.approx(0.78125, abs=1e-15)
    assert err_reference([2, 1], 2, 2.0) == 0.78125


@pytest.mark.parametrize(
    "grades",
    [[3, 0, 2, 4, 1], [0, 0, 4], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [4, 4], [0, 2, 0, 3, 0, 1, 0]],
)
@pytest.mark.parametrize("k", [1, 3, 5, 10])
def test_seed_err_matches_position_loop(grades, k):
    config = Config(cutoffs=(k,), max_grade=4.0)
    ours = evaluate_request(grades, config, unshown=[4])  # unshown judged items do not enter ERR
    assert ours[f"ERR@{k}"] == pytest.approx(err_reference(grades, k, 4.0), abs=1e-12)
