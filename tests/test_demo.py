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
    assert (experiment.name, experiment.control, experiment.treatment) == ("exp1", "control", "treatment")
    assert experiment.units == {"control": 612, "treatment": 622} and experiment.total_units == 1234
    assert [row.metric for row in experiment.ab] == ["MRR", "nDCG@10", "ERR@10"]  # the contract's order
    assert [row.decision for row in experiment.ab] == ["better", "inconclusive", "worse"]
    assert experiment.ab[1].true_delta == pytest.approx(0.04)
    assert not experiment.srm_mismatch and experiment.srm_p_value == 0.77
    (gsb,) = experiment.gsb
    assert (gsb.source, gsb.good, gsb.same, gsb.bad, gsb.p_value) == ("judgment", 120, 90, 60, 0.0003)
    assert gsb.score == pytest.approx(60 / 270)
    assert [w.window for w in snapshot.windows] == ["5m", "5m", "1h", "1h"]  # shortest window first
    assert snapshot.total_events == 5012


def test_control_and_treatment_from_the_series_labels() -> None:
    samples = _samples(STRAIGHT, control="treatment", treatment="control")
    (experiment,) = read_snapshot(samples, TRUTH).experiments
    assert (experiment.control, experiment.treatment) == ("treatment", "control")
    assert experiment.ab[1].true_delta == pytest.approx(-0.04)


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
    assert "  nDCG@10     +0.0200   [-0.0100, +0.0500]       0.3000   inconclusive     +0.0400" in text
    assert "  MRR         +0.0410   [+0.0100, +0.0700]      <0.0001   better           +0.0400" in text
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
    assert view.snapshot is not None and view.snapshot.experiments[0].ab[0].true_delta is None
    assert view.decisions[0].text().endswith("(00:05 after start)")
    view.set_truth(TRUTH)
    assert view.snapshot.experiments[0].ab[0].true_delta == pytest.approx(0.04)
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
    (row,) = experiment.ab
    assert (row.metric, row.delta, row.cs_upper, row.decision) == ("nDCG@10", 0.042, math.inf, "better")
    assert experiment.units == {} and math.isnan(experiment.srm_p_value)


def test_format_clock() -> None:
    assert [format_clock(s) for s in (0, 42.9, 61, 3723)] == ["00:00", "00:42", "01:01", "1:02:03"]


@pytest.mark.slow
def test_true_effects_child_prints_json() -> None:
    """What the demo runs in the background while the broker and the worker start."""
    result = subprocess.run([sys.executable, "-m", "stream_eval.stream.demo", "true-effects", "--rate", "50",
                             "--seed", "0", "--cutoffs", "5,10"], capture_output=True, timeout=120, check=True)
    truth = json.loads(result.stdout)
    assert set(truth) == {"exp1"} and set(truth["exp1"]) == {"control", "treatment"}
    assert {"nDCG@5", "nDCG@10", "MRR", "GAUC"} <= set(truth["exp1"]["control"])
    assert truth["exp1"]["treatment"]["nDCG@10"] > truth["exp1"]["control"]["nDCG@10"]


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


@pytest.mark.slow
def test_demo_shows_both_arms_and_stops_cleanly_on_ctrl_c() -> None:
    port, metrics_port = free_port(), free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "stream_eval.cli", "demo", "--port", str(port), "--metrics-port", str(metrics_port),
         "--rate", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        deadline = time.monotonic() + 120
        finalised: dict[str, float] = {}
        while time.monotonic() < deadline and demo.poll() is None:
            finalised = _finalised(url)
            if finalised.get("control", 0) > 0 and finalised.get("treatment", 0) > 0:
                break
            time.sleep(1)
        assert finalised.get("control", 0) > 0 and finalised.get("treatment", 0) > 0, finalised
        samples = scrape(url)
        windows = {(s["arm"], s["metric"], s["window"]) for s, _ in samples["stream_eval_window_mean"]}
        for arm in ("control", "treatment"):
            for metric in ("MRR", "nDCG@10", "ERR@10"):
                assert (arm, metric, "5m") in windows
        assert any(labels["source"] == "judgment" for labels, _ in samples["stream_eval_gsb_total"])
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    assert demo.returncode == 0, err.decode()
    view = out.decode()
    assert "exp1 / control" in view and "exp1 / treatment" in view and "GSB exp1" in view
    assert "A/B exp1: treatment vs control" in view
    assert "true values exp1 / treatment: MRR" in view  # computed in the background while the worker started
    assert not _listening(port) and not _listening(metrics_port)  # broker and worker are gone
