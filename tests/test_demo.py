"""`stream-eval demo`: its view, read from a dict of samples (no worker), and the demo end to end: broker, worker
and traffic start; per-arm metrics move; Ctrl-C stops all."""

from __future__ import annotations

import io
import json
import math
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from stream_eval.stream.broker import free_port
from stream_eval.stream.demo import (
    Display,
    Samples,
    View,
    decide,
    format_clock,
    parse_metrics,
    read_snapshot,
    scrape,
)

HEADER = "broker 127.0.0.1:9092 · http://127.0.0.1:9464/metrics · Ctrl-C stops"
TRUTH = {"exp1": {"control": {"MRR": 0.80, "nDCG@10": 0.72, "ERR@10": 0.090, "GAUC": 0.75},
                  "treatment": {"MRR": 0.84, "nDCG@10": 0.76, "ERR@10": 0.097, "GAUC": 0.77}}}


def _samples(ab: dict[str, tuple[float, float, float, float]], units: tuple[float, float] = (612, 622),
             srm: tuple[float, float] = (0.77, 0.0), **labels: str) -> Samples:
    """A scrape of experiment exp1: ``ab`` maps a mean to (delta, cs_lower, cs_upper, p_value)."""
    samples: Samples = {
        "stream_eval_events_total": [({"type": "ranking", "status": "ok"}, 5000.0),
                                     ({"type": "feedback", "status": "late"}, 12.0)],
        "stream_eval_watermark_seconds": [({}, 1_767_225_642.0)],
        "stream_eval_requests_total": [({"experiment": "exp1", "arm": "control"}, 2000.0),
                                       ({"experiment": "exp1", "arm": "treatment"}, 2100.0)],
        "stream_eval_window_mean": [
            ({"experiment": "exp1", "arm": arm, "metric": metric, "window": window}, value)
            for window in ("1h", "5m")
            for arm, base in (("control", 0.70), ("treatment", 0.74))
            for metric, value in (("MRR", base + 0.1), ("nDCG@10", base), ("ERR@10", base / 8), ("GAUC", base),
                                  ("SatClick", base - 0.2), ("Abandoned", 0.05))
        ],
        "stream_eval_window_count": [({"experiment": "exp1", "arm": arm, "metric": "MRR", "window": "5m"}, 1900.0)
                                     for arm in ("control", "treatment")],
        "stream_eval_ab_units": [({"experiment": "exp1", "arm": "control"}, units[0]),
                                 ({"experiment": "exp1", "arm": "treatment"}, units[1])],
        "stream_eval_srm_p_value": [({"experiment": "exp1"}, srm[0])],
        "stream_eval_srm_mismatch": [({"experiment": "exp1"}, srm[1])],
        "stream_eval_gsb_total": [({"experiment": "exp1", "source": "judgment", "verdict": verdict}, n)
                                  for verdict, n in (("good", 120.0), ("same", 90.0), ("bad", 60.0))],
        "stream_eval_gsb_p_value": [({"experiment": "exp1", "source": "judgment"}, 0.0003)],
    }
    for i, name in enumerate(("delta", "cs_lower", "cs_upper", "p_value")):
        samples[f"stream_eval_ab_{name}"] = [({"experiment": "exp1", "metric": metric, **labels}, values[i])
                                             for metric, values in ab.items()]
    return samples


STRAIGHT = {"MRR": (0.041, 0.01, 0.07, 0.00001), "nDCG@10": (0.02, -0.01, 0.05, 0.3),
            "ERR@10": (-0.01, -0.02, -0.001, 0.02)}


TRUTH3 = {"exp1": {"control": {"MRR": 0.80, "nDCG@10": 0.72, "ERR@10": 0.090, "SatClick": 0.74},
                   "treatment": {"MRR": 0.84, "nDCG@10": 0.77, "ERR@10": 0.098, "SatClick": 0.77},
                   "clickbait": {"MRR": 0.85, "nDCG@10": 0.78, "ERR@10": 0.100, "SatClick": 0.59}}}
# per treatment and mean: (delta, cs_lower, cs_upper, p_value, lift, lift_cs_lower, lift_cs_upper)
THREE = {
    "treatment": {"MRR": (0.04, 0.01, 0.07, 0.00001, 0.05, 0.012, 0.088),
                  "nDCG@10": (0.045, 0.02, 0.07, 0.001, 0.0625, 0.03, 0.095),
                  "ERR@10": (0.008, -0.004, 0.02, 0.2, 0.089, -0.044, 0.22),
                  "SatClick": (0.02, -0.01, 0.05, 0.3, 0.027, -0.014, 0.068)},
    "clickbait": {"MRR": (0.05, 0.02, 0.08, 0.0001, 0.0625, 0.025, 0.1),
                  "nDCG@10": (0.04, -0.01, 0.09, 0.2, 0.055, -0.014, 0.124),
                  "ERR@10": (0.01, -0.002, 0.022, 0.1, 0.11, -0.02, 0.24),
                  "SatClick": (-0.15, -0.2, -0.1, 0.000001, -0.2, -0.27, -0.13)},
}
GUARDRAILS = {"ERR@10": (-0.005, False), "SatClick": (-0.05, True)}  # tolerated loss, relative


def _three_arms(recommendations: dict[str, str] | None = None) -> Samples:
    """A scrape of a three-arm exp1 with the arm label on the A/B series, guardrails ERR@10 = -0.005 and SatClick
    = -5 %, and the worker's recommendations (default: ship treatment, roll back clickbait)."""
    recommended = {"treatment": "ship", "clickbait": "rollback"} if recommendations is None else recommendations
    samples = _samples({}, units=(600, 620))
    samples["stream_eval_ab_units"].append(({"experiment": "exp1", "arm": "clickbait"}, 610.0))
    names = ("delta", "cs_lower", "cs_upper", "p_value", "lift", "lift_cs_lower", "lift_cs_upper")
    for i, name in enumerate(names):
        samples[f"stream_eval_ab_{name}"] = [({"experiment": "exp1", "metric": metric, "arm": arm}, values[i])
                                             for arm, rows in THREE.items() for metric, values in rows.items()]
    for name in ("margin", "lower", "upper", "breached", "non_inferior"):
        samples[f"stream_eval_ab_guardrail_{name}"] = []
    for arm, rows in THREE.items():
        for metric, (margin, relative) in GUARDRAILS.items():
            delta, lower, upper, _, _, lift_lower, lift_upper = rows[metric]
            low, high = (lift_lower, lift_upper) if relative else (lower, upper)
            labels = {"experiment": "exp1", "metric": metric, "arm": arm}
            for name, value in (("margin", margin), ("lower", low), ("upper", high),
                                ("breached", float(high < margin)), ("non_inferior", float(low > margin))):
                samples[f"stream_eval_ab_guardrail_{name}"].append((labels, value))
    samples["stream_eval_ab_recommendation"] = [
        ({"experiment": "exp1", "arm": arm, "recommendation": recommendation}, 1.0)
        for arm, recommendation in recommended.items()]
    samples["stream_eval_gsb_total"] += [({"experiment": "exp1", "arm": "clickbait", "source": "metric",
                                           "verdict": verdict}, n)
                                         for verdict, n in (("good", 30.0), ("same", 10.0), ("bad", 20.0))]
    return samples


# -- the view, from samples ------------------------------------------------------------------------------------


def test_decide_from_the_confidence_sequence() -> None:
    assert decide(0.001, 0.2) == "better"
    assert decide(-0.2, -0.001) == "worse"
    assert decide(-0.1, 0.1) == "inconclusive"
    assert decide(0.0, 0.1) == "inconclusive"  # touching 0 is not excluding it
    assert decide(math.nan, math.nan) == "inconclusive"
    assert decide(-math.inf, math.inf) == "inconclusive"
    assert decide(-0.2, -0.001, "Abandoned") == "better" and decide(0.001, 0.2, "TimeToFirstClick") == "worse"


def test_snapshot_reads_the_ab_section() -> None:
    snapshot = read_snapshot(_samples(STRAIGHT), TRUTH)
    (experiment,) = snapshot.experiments
    (treatment,) = experiment.treatments  # series without an arm label: the sorted arms' second
    assert (experiment.name, experiment.control, treatment.arm) == ("exp1", "control", "treatment")
    assert experiment.units == {"control": 612, "treatment": 622} and experiment.total_units == 1234
    assert [row.metric for row in treatment.ab] == ["MRR", "nDCG@10", "ERR@10"]  # the contract's order
    assert [row.decision for row in treatment.ab] == ["better", "inconclusive", "worse"]
    assert treatment.ab[1].true_delta == pytest.approx(0.04)
    assert treatment.ab[1].true_lift == pytest.approx(0.76 / 0.72 - 1)
    assert treatment.recommendation == "" and treatment.guardrails == ()
    assert not experiment.srm_mismatch and experiment.srm_p_value == 0.77
    (gsb,) = experiment.gsb
    assert (gsb.source, gsb.good, gsb.same, gsb.bad, gsb.p_value) == ("judgment", 120, 90, 60, 0.0003)
    assert gsb.score == pytest.approx(60 / 270)
    assert [w.window for w in snapshot.windows] == ["5m", "5m", "1h", "1h"]  # shortest window first
    assert snapshot.total_events == 5012


def test_control_and_treatments_from_the_arm_labels() -> None:
    """The A/B series name the treatment (``arm``); the control is the arm with units that is none of them."""
    samples = _samples(STRAIGHT, units=(612, 622), arm="treatment")
    samples["stream_eval_ab_units"].insert(0, ({"experiment": "exp1", "arm": "a-first"}, 5.0))
    (experiment,) = read_snapshot(samples, TRUTH).experiments
    assert experiment.control == "a-first" and [t.arm for t in experiment.treatments] == ["treatment"]
    (experiment,) = read_snapshot(_three_arms(), TRUTH3).experiments
    assert experiment.control == "control" and [t.arm for t in experiment.treatments] == ["clickbait", "treatment"]
    assert experiment.arms == ["control", "clickbait", "treatment"]


def test_three_arms_show_lift_guardrails_and_recommendations() -> None:
    view = View(HEADER, started=100.0, truth=TRUTH3)
    view.update(_three_arms(), now=142.0)
    text = view.text()
    assert ("A/B exp1: clickbait, treatment vs control · units control 600  clickbait 610  treatment 620 · "
            "SRM p 0.7700 ok") in text
    clickbait, treatment = text.split("  clickbait vs control: recommendation rollback\n")[1].split(
        "  treatment vs control: recommendation ship\n")
    assert ("  SatClick           -0.1500   [-0.2000, -0.1000]     -20.00%   [-27.00%, -13.00%]    <0.0001   worse"
            "         breached -5%         -0.1500   -20.27%") in clickbait.splitlines()
    assert "within -0.005" in clickbait and "GSB metric        score +0.167   good 30  same 10  bad 20" in clickbait
    assert ("  SatClick           +0.0200   [-0.0100, +0.0500]      +2.70%   [-1.40%, +6.80%]       0.3000   "
            "inconclusive  within -5%           +0.0300    +4.05%") in treatment.splitlines()
    assert ("  nDCG@10            +0.0450   [+0.0200, +0.0700]      +6.25%   [+3.00%, +9.50%]       0.0010   better"
            "                             +0.0500    +6.94%") in treatment.splitlines()
    (experiment,) = view.snapshot.experiments if view.snapshot else ()
    guard = {(t.arm, row.metric): row.guardrail for t in experiment.treatments for row in t.guardrails}
    assert set(guard) == {(arm, metric) for arm in ("clickbait", "treatment") for metric in ("ERR@10", "SatClick")}
    assert guard["clickbait", "SatClick"] is not None and guard["clickbait", "SatClick"].relative  # the lift's bounds
    assert guard["treatment", "ERR@10"] is not None and not guard["treatment", "ERR@10"].relative

    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(view.rich())
    rich = console.export_text()
    for expected in ("A/B exp1: clickbait, treatment vs control", "clickbait vs control", "treatment vs control",
                     "recommendation  rollback ", "recommendation  ship ", "breached -5%", "within -0.005",
                     "-20.00%", "[-27.00%, -13.00%]", "lift sequence", "guardrail", "true lift",
                     "GSB clickbait vs control", "decisions and recommendations"):
        assert expected in rich, expected


def test_cuped_rows_show_cuped_true_and_their_variance_reduction() -> None:
    """A CUPED experiment (the worker exports its pre-period check): the title line says ``cuped: true`` and how the
    check stands, each row its variance reduction; traffic outside any experiment with units of one arm (an older
    worker exported them) makes no A/B section, and announcements then name no experiment."""
    samples = _three_arms()
    samples["stream_eval_pre_imbalance"] = [({"experiment": "exp1"}, 0.0)]
    samples["stream_eval_ab_variance_reduction"] = [
        ({"experiment": "exp1", "metric": metric, "arm": arm}, 0.0123 * (k + 1))
        for arm in THREE for k, metric in enumerate(THREE[arm])]
    samples["stream_eval_ab_units"].append(({"experiment": "default", "arm": "default"}, 812.0))
    view = View(HEADER, started=100.0, truth=TRUTH3)
    view.update(samples, now=142.0)
    text = view.text()
    assert ("A/B exp1: clickbait, treatment vs control · units control 600  clickbait 610  treatment 620 · "
            "SRM p 0.7700 ok · cuped: true · pre-period check ok") in text.splitlines()
    assert "A/B default" not in text and "vs default" not in text and not view.several
    treatment = text.split("  treatment vs control: recommendation ship\n")[1]
    assert treatment.splitlines()[0].endswith("true delta true lift  var. red.")
    assert ("  nDCG@10            +0.0450   [+0.0200, +0.0700]      +6.25%   [+3.00%, +9.50%]       0.0010   better"
            "                             +0.0500    +6.94%       2.5%") in treatment.splitlines()
    assert treatment.splitlines()[1].endswith("       1.2%")  # MRR, the first row
    console = Console(file=io.StringIO(), width=220, record=True)
    console.print(view.rich())
    rich = console.export_text()
    assert "cuped: true · pre-period check ok" in rich and "var. red." in rich and "4.9%" in rich

    samples["stream_eval_pre_imbalance"] = [({"experiment": "exp1"}, 1.0)]
    view.update(samples, now=143.0)
    assert "cuped: true · PRE-PERIOD IMBALANCE: the arms differed before the experiment" in view.text()
    plain = View(HEADER, started=100.0, truth=TRUTH3)
    plain.update(_three_arms(), now=142.0)  # not CUPED: no such column
    assert "cuped" not in plain.text() and "var. red." not in plain.text()


def test_ship_and_rollback_are_announced_once_when_they_arrive() -> None:
    view = View(HEADER, started=100.0, truth=TRUTH3)
    running = view.update(_three_arms({"treatment": "keep running", "clickbait": "keep running"}), now=120.0)
    assert not any(line.startswith("recommendation:") for line in view.text().splitlines())
    assert {type(a).__name__ for a in running} == {"Decision"}

    new = view.update(_three_arms({"treatment": "keep running", "clickbait": "rollback"}), now=142.0)
    assert [a.text() for a in new] == [
        "recommendation: rollback clickbait vs control after 1,830 units (00:42 after start) · guardrail SatClick "
        "breached: [-27.00%, -13.00%] below -5% · true values: correct"]
    new = view.update(_three_arms(), now=170.0)
    assert [a.text() for a in new] == [
        "recommendation: ship treatment vs control after 1,830 units (01:10 after start) · better on MRR, nDCG@10 "
        "· guardrails within tolerance: ERR@10, SatClick · true values: correct"]
    assert view.update(_three_arms(), now=171.0) == []  # announced once
    lines = [line for line in view.text().splitlines() if line.startswith("recommendation:")]
    assert [line.split(" after ")[0] for line in lines] == ["recommendation: rollback clickbait vs control",
                                                            "recommendation: ship treatment vs control"]


def test_without_the_view_the_demo_prints_where_it_runs_and_each_announcement_once() -> None:
    """``demo --no-view``: the header (broker, /metrics, how it stops) once, then one line per decision or
    recommendation as it arrives, and nothing else."""
    out = io.StringIO()
    view = View(HEADER, started=100.0, truth=TRUTH3)
    with Display(view, out, interactive=False, quiet=True) as display:
        display.show(view.update(_three_arms({"treatment": "keep running", "clickbait": "keep running"}), now=120.0))
        display.show(view.update(_three_arms({"treatment": "keep running", "clickbait": "rollback"}), now=142.0))
        display.show(view.update(_three_arms(), now=170.0))
        display.show(view.update(_three_arms(), now=171.0))
    lines = out.getvalue().splitlines()
    assert lines[0] == HEADER
    recommendations = [line for line in lines if line.startswith("recommendation:")]
    assert [line.split(" after ")[0] for line in recommendations] == [
        "recommendation: rollback clickbait vs control", "recommendation: ship treatment vs control"]
    assert len(lines) == len(set(lines))  # each line once: no text blocks of the view
    assert not any(line.startswith(("A/B", "rolling")) for line in lines)


def test_recommendations_are_checked_against_the_truth() -> None:
    """A rollback is wrong when the breached guardrail is truly within tolerance; a ship is wrong when a guardrail
    is truly breached; unknown without the truth."""
    fine = {"exp1": {**TRUTH3["exp1"], "clickbait": {**TRUTH3["exp1"]["clickbait"], "SatClick": 0.73}}}
    bad = {"exp1": {**TRUTH3["exp1"], "treatment": {**TRUTH3["exp1"]["treatment"], "ERR@10": 0.08}}}
    view = View(HEADER, started=0.0)
    view.update(_three_arms(), now=10.0)
    assert [r.correct for r in view.recommendations] == [None, None]
    assert not any("true values" in r.text() for r in view.recommendations)
    view.set_truth(fine)  # SatClick -1.4 %: within the tolerated -5 %
    assert [(r.treatment, r.correct) for r in view.recommendations] == [("clickbait", False), ("treatment", True)]
    assert view.recommendations[0].text().endswith("· true values: wrong")
    view.set_truth(bad)  # ERR@10 -0.010: beyond the tolerated -0.005
    assert [(r.treatment, r.correct) for r in view.recommendations] == [("clickbait", True), ("treatment", False)]


def test_lower_is_better_decisions_are_checked_in_their_direction() -> None:
    truth = {"exp1": {"control": {"Abandoned": 0.05}, "treatment": {"Abandoned": 0.07}}}
    view = View(HEADER, started=0.0, truth=truth)
    (decision,) = view.update(_samples({"Abandoned": (0.02, 0.01, 0.03, 0.001)}), now=5.0)
    assert decision.text() == ("decision: treatment worse on Abandoned after 1,234 units (00:05 after start) "
                               "· true delta +0.0200 (correct)")  # a rise of Abandoned is worse


def test_non_terminal_display_prints_each_recommendation_once() -> None:
    out = io.StringIO()
    view = View(HEADER, started=0.0, truth=TRUTH3)
    with Display(view, out, interactive=False) as display:
        display.show(view.update(_three_arms({}), now=1.0))
        display.show(view.update(_three_arms(), now=2.0))
        display.show(view.update(_three_arms(), now=3.0))
    printed = out.getvalue()
    line = ("recommendation: rollback clickbait vs control after 1,830 units (00:02 after start) · guardrail SatClick "
            "breached: [-27.00%, -13.00%] below -5% · true values: correct")
    assert printed.count(line) == 3  # in the second and third blocks, and once on its own after the second
    assert printed.count(line + "\nrecommendation: ship treatment vs control") == 3


def test_decision_lines_appear_exactly_when_the_sequence_excludes_zero() -> None:
    view = View(HEADER, started=100.0, truth=TRUTH)
    undecided = {metric: (0.01, -0.02, 0.04, 0.4) for metric in STRAIGHT}
    assert view.update(_samples(undecided, units=(300, 310)), now=120.0) == []
    assert "decision:" not in view.text()

    new = view.update(_samples(STRAIGHT), now=142.0)
    assert [(d.metric, d.verdict) for d in new] == [("MRR", "better"), ("ERR@10", "worse")]
    text = view.text()
    assert ("decision: treatment better on MRR after 1,234 units (00:42 after start) · true delta +0.0400 (correct)"
            in text.splitlines())
    assert ("decision: treatment worse on ERR@10 after 1,234 units (00:42 after start) · true delta +0.0070 (wrong)"
            in text.splitlines())
    assert "on nDCG@10" not in text

    # a decision arrives once: later scrapes keep it (with its first units and time) and add only new ones
    later = {**STRAIGHT, "nDCG@10": (0.03, 0.001, 0.06, 0.04)}
    new = view.update(_samples(later, units=(1000, 1010)), now=200.0)
    assert [(d.metric, d.verdict, d.units, d.elapsed) for d in new] == [("nDCG@10", "better", 2010, 100.0)]
    assert view.update(_samples(later, units=(1100, 1110)), now=201.0) == []
    lines = [line for line in view.text().splitlines() if line.startswith("decision:")]
    assert len(lines) == 3 and "on nDCG@10 after 2,010 units (01:40 after start)" in lines[2]


def test_view_text_shows_arms_units_srm_gsb_and_truth() -> None:
    view = View(HEADER, started=100.0, duration=120.0, truth=TRUTH)
    view.update(_samples(STRAIGHT), now=130.0)
    text = view.text()
    assert text.splitlines()[0] == HEADER + " · 00:30 elapsed"
    assert "true values exp1 / control: MRR 0.8000  nDCG@10 0.7200  ERR@10 0.0900  GAUC 0.7500" in text
    assert ("5m     exp1 / control                    0.8000    0.7000    0.0875    0.7000    0.5000    0.0500"
            "      1,900") in text
    assert "exp1 / treatment" in text and "finalised requests: exp1/control 2,000, exp1/treatment 2,100" in text
    assert "A/B exp1: treatment vs control · units control 612  treatment 622 · SRM p 0.7700 ok" in text
    assert "  treatment vs control: recommendation -" in text  # none exported
    assert ("  nDCG@10            +0.0200   [-0.0100, +0.0500]           -   [-, -]                 0.3000   "
            "inconclusive                       +0.0400    +5.56%") in text
    assert ("  MRR                +0.0410   [+0.0100, +0.0700]           -   [-, -]                <0.0001   "
            "better                             +0.0400    +5.00%") in text
    assert "GSB exp1 judgment      score +0.222   good 120  same 90  bad 60   p 0.0003" in text
    assert "MISMATCH" not in text


def test_srm_mismatch_is_flagged() -> None:
    view = View(HEADER, started=0.0)
    view.update(_samples(STRAIGHT, units=(700, 534), srm=(0.00002, 1.0)), now=10.0)
    assert "SRM p <0.0001 MISMATCH: the split is off, do not trust the A/B rows" in view.text()
    console = Console(file=io.StringIO(), width=140, record=True)
    console.print(view.rich())
    assert "MISMATCH" in console.export_text()


def test_truth_arriving_late_fills_the_rows_and_the_decisions() -> None:
    view = View(HEADER, started=0.0)
    assert "true values: computing" in view.text()
    view.update(_samples(STRAIGHT), now=5.0)
    assert view.snapshot is not None and view.snapshot.experiments[0].treatments[0].ab[0].true_delta is None
    assert view.decisions[0].text().endswith("(00:05 after start)")
    view.set_truth(TRUTH)
    assert view.snapshot.experiments[0].treatments[0].ab[0].true_delta == pytest.approx(0.04)
    assert view.decisions[0].text().endswith("· true delta +0.0400 (correct)")
    view.set_truth(None, "unavailable (exit code 1)")
    assert "true values: unavailable (exit code 1)" in view.text()


def test_rich_view_has_the_same_content() -> None:
    view = View(HEADER, started=0.0, duration=60.0, truth=TRUTH)
    view.update(_samples(STRAIGHT), now=42.0)
    console = Console(file=io.StringIO(), width=160, record=True)
    console.print(view.rich())
    text = console.export_text()
    for expected in ("stream-eval demo", "00:18 left of 01:00", "true values under the simulator's click model",
                     "exp1 / treatment", "A/B exp1: treatment vs control", "units control 612  treatment 622",
                     "SRM p 0.7700 ok", "[+0.0100, +0.0700]", "inconclusive", "+0.0400", "judgment", "+0.222",
                     "decision: treatment better on MRR after 1,234 units (00:42 after start)"):
        assert expected in text, expected


def test_non_terminal_display_prints_blocks_and_each_decision_once() -> None:
    out = io.StringIO()
    view = View(HEADER, started=0.0, truth=TRUTH)
    with Display(view, out, interactive=False) as display:
        display.show(view.update(_samples({"MRR": (0.01, -0.02, 0.04, 0.4)}), now=1.0))
        display.show(view.update(_samples(STRAIGHT), now=2.0))
        display.show(view.update(_samples(STRAIGHT), now=3.0))
    printed = out.getvalue()
    assert "\x1b" not in printed  # plain text for logs
    assert printed.count(HEADER) == 3
    line = "decision: treatment better on MRR after 1,234 units (00:02 after start) · true delta +0.0400 (correct)"
    # in the second and third blocks, plus once on its own right after the second block
    assert printed.count(line) == 3
    assert printed.count(line + "\ndecision: treatment worse on ERR@10") == 3


def test_parse_metrics_reads_an_exposition() -> None:
    text = "\n".join([
        "# TYPE stream_eval_ab_delta gauge",
        'stream_eval_ab_delta{experiment="exp1",metric="nDCG@10"} 0.042',
        "# TYPE stream_eval_ab_cs_lower gauge",
        'stream_eval_ab_cs_lower{experiment="exp1",metric="nDCG@10"} 0.01',
        "# TYPE stream_eval_ab_cs_upper gauge",
        'stream_eval_ab_cs_upper{experiment="exp1",metric="nDCG@10"} +Inf',
        "# TYPE stream_eval_gsb counter",
        'stream_eval_gsb_total{experiment="exp1",source="metric",verdict="good"} 3.0',
        "",
    ])
    samples = parse_metrics(text)
    assert samples["stream_eval_gsb_total"] == [({"experiment": "exp1", "source": "metric", "verdict": "good"}, 3.0)]
    (experiment,) = read_snapshot(samples).experiments
    (row,) = experiment.treatments[0].ab
    assert (row.metric, row.delta, row.cs_upper, row.decision) == ("nDCG@10", 0.042, math.inf, "better")
    assert experiment.units == {} and math.isnan(experiment.srm_p_value)


def test_format_clock() -> None:
    assert [format_clock(s) for s in (0, 42.9, 61, 3723)] == ["00:00", "00:42", "01:01", "1:02:03"]


@pytest.mark.slow
def test_true_effects_child_prints_json() -> None:
    """What the demo runs in the background while the broker and the worker start."""
    result = subprocess.run([sys.executable, "-m", "stream_eval.stream.demo", "true-effects", "--rate", "50",
                             "--seed", "0", "--cutoffs", "5,10", "--metrics", "default,behaviour"],
                            capture_output=True, timeout=120, check=True)
    truth = json.loads(result.stdout)
    assert set(truth) == {"exp1"} and set(truth["exp1"]) == {"control", "treatment", "clickbait"}
    arms = truth["exp1"]
    assert {"nDCG@5", "nDCG@10", "MRR", "GAUC", "SatClick"} <= set(arms["control"])
    assert arms["clickbait"]["nDCG@10"] > arms["treatment"]["nDCG@10"] > arms["control"]["nDCG@10"]
    # clickbait: the better ranker, but its users leave quickly: beyond the embedded config's SatClick -5 %
    assert arms["clickbait"]["SatClick"] / arms["control"]["SatClick"] - 1 < -0.05
    assert arms["treatment"]["SatClick"] > arms["control"]["SatClick"]


# -- end to end ------------------------------------------------------------------------------------------------


def _finalised(url: str) -> dict[str, float]:
    try:
        samples = scrape(url)
    except OSError:
        return {}
    finalised: dict[str, float] = {}
    for labels, value in samples.get("stream_eval_requests_total", []):  # summed over partitions
        finalised[labels["arm"]] = finalised.get(labels["arm"], 0.0) + value
    return finalised


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _recommended(url: str) -> dict[str, str]:
    try:
        samples = scrape(url)
    except OSError:
        return {}
    return {labels["arm"]: labels["recommendation"] for labels, value in
            samples.get("stream_eval_ab_recommendation", []) if value >= 1}


@pytest.mark.slow
def test_demo_runs_three_arms_announces_ship_and_rollback_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    """The demo as a user starts it (default rate, embedded config): all three arms are finalised, the worker
    recommends ship for treatment and rollback for clickbait within the first minutes, the view announces both
    (checked against the true values), and Ctrl-C stops everything. CUPED is on: the pre-period traffic (no
    experiment) is no A/B experiment of its own, and the rows carry their variance reduction."""
    port, metrics_port = free_port(), free_port()
    output = tmp_path / "view.txt"  # a file, not a pipe: the view writes a block a second
    with open(output, "wb") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "stream_eval.cli", "demo", "--port", str(port), "--metrics-port",
             str(metrics_port)], stdout=out, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    arms = ("control", "treatment", "clickbait")
    try:
        deadline = time.monotonic() + 300
        recommended: dict[str, str] = {}
        while time.monotonic() < deadline and demo.poll() is None:
            recommended = _recommended(url)
            if recommended.get("treatment") == "ship" and recommended.get("clickbait") == "rollback":
                break
            time.sleep(2)
        assert recommended == {"treatment": "ship", "clickbait": "rollback"}, recommended
        finalised = _finalised(url)
        assert all(finalised.get(arm, 0) > 0 for arm in arms), finalised
        samples = scrape(url)
        windows = {(s["arm"], s["metric"], s["window"]) for s, _ in samples["stream_eval_window_mean"]}
        for arm in arms:
            for metric in ("MRR", "nDCG@10", "ERR@10", "SatClick"):
                assert (arm, metric, "5m") in windows
        assert any(labels["source"] == "judgment" for labels, _ in samples["stream_eval_gsb_total"])
        assert {labels["experiment"] for labels, _ in samples["stream_eval_ab_units"]} == {"exp1"}
        assert ("default", "default") in {(s["experiment"], s["arm"]) for s, _ in samples["stream_eval_window_mean"]}
        reductions = {(labels["arm"], labels["metric"]): value
                      for labels, value in samples["stream_eval_ab_variance_reduction"]}
        assert {arm for arm, _ in reductions} == {"treatment", "clickbait"}
        assert reductions["treatment", "MRR"] > 0 and reductions["treatment", "nDCG@10"] > 0, reductions
        time.sleep(2)  # the view's next scrape
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    assert demo.returncode == 0, err.decode()
    view = output.read_text()
    for arm in arms:
        assert f"exp1 / {arm}" in view and f"true values exp1 / {arm}: MRR" in view
    assert "A/B exp1: clickbait, treatment vs control" in view and "GSB exp1" in view
    assert "A/B default" not in view and "cuped: true · pre-period check ok" in view and "var. red." in view
    assert "  clickbait vs control: recommendation rollback" in view
    assert "  treatment vs control: recommendation ship" in view
    assert "breached -5%" in view and "within -0.005" in view
    lines = {line for line in view.splitlines() if line.startswith("recommendation: ")}
    (rollback,) = [line for line in lines if line.startswith("recommendation: rollback clickbait vs control after ")]
    (ship,) = [line for line in lines if line.startswith("recommendation: ship treatment vs control after ")]
    assert "guardrail SatClick breached" in rollback and rollback.endswith("· true values: correct"), rollback
    assert "guardrails within tolerance: ERR@10, SatClick" in ship and ship.endswith("· true values: correct"), ship
    assert len({line.split(" · ")[0] for line in lines}) == 2, lines  # announced once each (the truth may follow)
    assert not _listening(port) and not _listening(metrics_port)  # broker and worker are gone
