"""``stream-eval replay --html``: what the report collects, what the page holds, and the page in a real browser.

The browser tests open the page in headless Chromium (the Debian package ``chromium``; scripts/test installs it)
with every host name unresolvable, so a chart that needed the network would not draw: they read the page's own
render status (``data-charts-rendered``, ``data-chart-errors``) from the DOM after the charts drew, check that
the browser logged nothing from the page, and check a screenshot. Without Chromium they fail under CI and skip
elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from promstack import require_binary

from stream_eval.cli import main
from stream_eval.config import Config
from stream_eval.engine.replay import replay
from stream_eval.export.html_data import HtmlData, QueryMeans, Timeline

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "search-log.jsonl"
T0 = 1_767_225_600.0
BROWSER_TIMEOUT = 180.0


@pytest.fixture(scope="module")
def simulated_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two arms of known, different quality (users as units), with judgments and interleaving."""
    from stream_eval.simulate import SimulationConfig, write_jsonl

    path = tmp_path_factory.mktemp("sim") / "ab.jsonl"
    write_jsonl(SimulationConfig(requests=10000, seed=3, unit="user", judgments=True, interleaving=True), str(path))
    return path


@pytest.fixture(scope="module")
def segmented_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two arms (users as units) whose rankings carry a platform and a locale (some none): segment groups and
    segment A/B rows."""
    from test_segments import _with_attributes

    from stream_eval.simulate import SimulationConfig, simulate_lines

    path = tmp_path_factory.mktemp("seg") / "segments.jsonl"
    lines, _ = _with_attributes(list(simulate_lines(SimulationConfig(requests=4000, seed=5, unit="user"))))
    path.write_bytes(b"".join(lines))
    (path.parent / "segments.toml").write_text('segments = ["platform", "locale"]\nmax_segment_values = 3\n')
    return path


def _replay_html(log: Path, out: Path, *options: str) -> tuple[Path, dict[str, Any]]:
    """``stream-eval replay LOG --html`` (in process); the page and the JSON report."""
    page, report = out / f"{log.stem}.html", out / f"{log.stem}.json"
    assert main(["replay", str(log), "--html", str(page), "-o", str(report), "--no-progress", *options]) == 0
    return page, json.loads(report.read_text())


@pytest.fixture(scope="module")
def pages(simulated_log: Path, segmented_log: Path, tmp_path_factory: pytest.TempPathFactory,
          ) -> dict[str, tuple[Path, dict[str, Any]]]:
    out = tmp_path_factory.mktemp("html")
    return {"example": _replay_html(EXAMPLE, out, "--look-every", "5m"),
            "simulated": _replay_html(simulated_log, out, "--look-every", "15s"),
            "segments": _replay_html(segmented_log, out, "--config", str(segmented_log.with_suffix(".toml")))}


# -- what is collected ----------------------------------------------------------------------------------------


def test_the_collected_series_add_up_to_the_report(simulated_log: Path) -> None:
    config = Config(look_every=15.0)
    data = HtmlData(config)
    engine = replay([str(simulated_log)], config, data.on_finalised, ab_trace=data.on_look, attach=data.attach)
    report = engine.report()
    timeline = data.timeline
    assert timeline.width > 1 and len({b for (_, _, b) in timeline.sums.index}) <= timeline.max_points
    for group in report["groups"]:
        _, sums, counts, requests = timeline.series(group["experiment"], group["arm"])
        assert sum(requests) == group["requests"]
        for j, name in enumerate(data.names):
            expected = group["metrics"].get(name)
            total = sums[:, j].sum() / counts[:, j].sum() if counts[:, j].sum() else None
            assert (total is None and expected is None) or math.isclose(total, expected, rel_tol=1e-9), name
    # every simulated request names a query: the query cells hold them all, with the same sums
    queries = data.queries.sums
    assert queries.requests.sum() == report["overall"]["requests"] and data.queries.left_out == 0
    np.testing.assert_allclose(queries.sums[: len(queries.index)].sum(axis=0),
                               timeline.sums.sums[: len(timeline.sums.index)].sum(axis=0), rtol=1e-9)
    # the looks are the A/B trace: the last is the report's A/B sections
    assert len(data.looks) > 5
    assert data.looks[-1]["ab"] == report["ab"] and data.looks[-1]["srm"] == report["srm"]
    assert data.delays is not None and 0 < data.delays.count <= report["events"]["feedback"]


def test_the_timeline_coarsens_exactly_and_stays_bounded() -> None:
    timeline = Timeline(1, max_points=10)
    rng = np.random.default_rng(0)
    serve = np.sort(rng.uniform(T0, T0 + 86400, size=5000))
    values = rng.random((5000, 1))
    for part in np.array_split(np.arange(5000), 7):  # in batches, as finalisation hands them out
        timeline.add([("e", "a")] * len(part), serve[part], values[part])
    starts, sums, counts, requests = timeline.series("e", "a")
    assert len(starts) <= 10 and timeline.width == 3 * 3600
    assert sum(requests) == 5000 and math.isclose(sums.sum(), values.sum(), rel_tol=1e-12)
    for start, n in zip(starts, counts[:, 0].tolist(), strict=True):
        assert n == ((serve >= start) & (serve < start + timeline.width)).sum()


def test_query_cells_are_bounded_and_the_rest_counted() -> None:
    queries = QueryMeans(1, max_queries=3)
    keys: list[tuple[str, str, str] | None] = [("e", "a", f"q{i % 5}") for i in range(10)] + [None]
    queries.add(keys, np.ones((11, 1)))
    assert sorted(q for (_, _, q) in queries.sums.index) == ["q0", "q1", "q2"]
    assert queries.left_out == 4  # q3 and q4, twice each; the request without a query is no cell


# -- the page --------------------------------------------------------------------------------------------------


def test_the_page_is_self_contained(pages: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    for page, report in pages.values():
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"<script[^>]*\ssrc=|<link\b|<iframe\b|<img\b", text, re.IGNORECASE)
        assert "Plotly.newPlot" in text and len(text) > 1_000_000  # plotly.js is inside
        expected = int(re.search(r'data-charts-expected="(\d+)"', text).group(1))  # type: ignore[union-attr]
        assert expected == text.count("Plotly.newPlot(") >= 7
        for row in report["ab"]:
            assert row["metric"] in text
    _, report = pages["simulated"]
    assert {row["decision"] for row in report["ab"] if row["metric"] == "nDCG@10"} == {"better"}


def _section_rows(text: str, heading: str) -> list[list[str]]:
    """The cells (text, tags removed) of each body row of the table under ``<h2>heading</h2>``."""
    section = text[text.index(f"<h2>{heading}</h2>"):]
    table = section[section.index("<tbody>"):section.index("</tbody>")]
    return [[re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", table)]


def _segment_mean_rows(report: dict[str, Any]) -> list[list[str]]:
    """The rows the page must show for the report's segment groups, written from the report (a mean to 4 places)."""
    names = list(report["segments"][0]["metrics"])
    rows = sorted(report["segments"], key=lambda g: (g["experiment"], g["segment"]["field"], g["segment"]["value"],
                                                     g["arm"]))
    return [[g["experiment"], f"{g['segment']['field']} = {g['segment']['value']}", g["arm"], f"{g['requests']:,}",
             f"{g['empty']:,}", *("-" if g["metrics"][n] is None else f"{g['metrics'][n]:.4f}" for n in names)]
            for g in rows]


def test_the_segment_means_table_shows_each_segment_group(pages: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    """With segments, a table of each segment value's per-arm requests and means (the report's ``segments``)
    follows the exploratory A/B rows; the metrics in its header; pages without segments have none."""
    page, report = pages["segments"]
    text = page.read_text(encoding="utf-8")
    assert text.index("Segments (exploratory)") < text.index("Segment means") < text.index("Per-arm means over")
    values = {g["segment"]["value"] for g in report["segments"]}
    assert {"ios", "android", "web", "__missing__", "__other__"} <= values  # 5 locales, 3 shown
    assert len({g["arm"] for g in report["segments"]}) == 2
    assert _section_rows(text, "Segment means") == _segment_mean_rows(report)
    header = text[text.index("<h2>Segment means</h2>"):].split("</thead>")[0]
    assert all(f">{name}<" in header for name in report["segments"][0]["metrics"])
    assert "Segment means" not in pages["simulated"][0].read_text(encoding="utf-8")


def test_labels_from_the_log_are_escaped(tmp_path: Path) -> None:
    hostile = '<script>alert(1)</script><b onmouseover="x">'
    lines = []
    for i in range(40):
        arm = "a" if i % 2 else hostile
        lines.append({"type": "ranking", "request_id": f"r{i}", "ts": T0 + i, "items": ["d1", "d2", "d3"],
                      "query_id": hostile if i % 4 < 2 else "q", "experiment": hostile, "arm": arm,
                      "session_id": f"s{i}"})
        lines.append({"type": "feedback", "request_id": f"r{i}", "item": "d2" if i % 3 else "d1", "ts": T0 + i + 2})
    log = tmp_path / "hostile.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    page, _ = _replay_html(log, tmp_path)
    text = page.read_text(encoding="utf-8")
    assert "alert(1)" in text  # shown ...
    assert "<script>alert" not in text and "<b onmouseover" not in text  # ... never as markup


def test_without_plotly_the_command_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "plotly" else find_spec(name, *args))
    assert main(["replay", str(EXAMPLE), "--html", str(tmp_path / "r.html"), "-o", str(tmp_path / "r.json")]) == 2
    assert "stream-eval[html]" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


# -- in a real browser -----------------------------------------------------------------------------------------


def _chromium(page: Path, *options: str) -> subprocess.CompletedProcess[str]:
    browser = require_binary("chromium", "chromium-browser", package="chromium")
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=30000",
         *options, page.resolve().as_uri()],
        capture_output=True, text=True, timeout=BROWSER_TIMEOUT, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("log", ["example", "simulated", "segments"])
def test_every_chart_renders_in_chromium_without_errors(pages: dict[str, tuple[Path, dict[str, Any]]],
                                                         log: str) -> None:
    page, report = pages[log]
    done = _chromium(page, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    root = re.search(r"<html[^>]*>", done.stdout)
    assert root is not None, done.stdout[:500]
    status = dict(re.findall(r'(data-[a-z-]+)="([^"]*)"', root.group(0)))
    expected = int(status["data-charts-expected"])
    assert expected >= 7
    assert json.loads(status["data-chart-errors"].replace("&quot;", '"')) == []
    assert int(status["data-charts-rendered"]) == expected
    # each chart drew its svg and its traces
    assert done.stdout.count('class="main-svg"') >= expected
    assert len(re.findall(r'class="trace (?:scatter|bars)', done.stdout)) >= expected
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], "the page logged to the console:\n" + "\n".join(console)
    if report.get("segments"):  # the segment tables are in the page the browser built, a row per report row
        assert _section_rows(done.stdout, "Segment means") == _segment_mean_rows(report)


@pytest.mark.slow
def test_the_screenshot_shows_the_charts(pages: dict[str, tuple[Path, dict[str, Any]]], tmp_path: Path) -> None:
    from PIL import Image

    page, report = pages["simulated"]
    shot = tmp_path / "report.png"
    done = _chromium(page, f"--screenshot={shot}", "--window-size=1280,7000")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(np.int32)
    height = pixels.shape[0]
    ink = (pixels < 235).any(axis=2)  # not white or near white
    colourful = pixels.max(axis=2) - pixels.min(axis=2) > 60  # chart traces, bars, badges; not text or grid
    assert ink.mean() > 0.03, f"the screenshot is almost blank ({ink.mean():.2%} ink)"
    # charts all down the page, not only at its top: colour in most quarters of the page's length
    rows = colourful.any(axis=1)
    quarters = [rows[k * height // 4:(k + 1) * height // 4].mean() for k in range(4)]
    assert sum(q > 0.05 for q in quarters) >= 3, quarters
    # the decision badges: 'better' is green (#1a7f37) in the table of decisions
    assert any(row["decision"] == "better" for row in report["ab"])
    green = (np.abs(pixels - np.array([0x1A, 0x7F, 0x37])).max(axis=2) < 12).sum()
    assert green > 500, "no 'better' badge or green bar in the screenshot"


def test_a_page_with_the_behaviour_measures(tmp_path: Path) -> None:
    """Behaviour measures have charts like any per-request measure; session measures are in the A/B rows."""
    from stream_eval.simulate import SimulationConfig, write_jsonl

    log = tmp_path / "behaviour.jsonl"
    write_jsonl(SimulationConfig(requests=3000, seed=5, unit="user", behaviour=True), str(log))
    page, report = _replay_html(log, tmp_path, "--metrics", "nDCG@10,behaviour", "--look-every", "15s")
    text = page.read_text()
    assert {row["metric"] for row in report["ab"]} >= {"SatClick", "Abandoned", "Reformulation", "QueriesPerSession"}
    for name in ("CTR@10", "TimeToFirstClick", "Reformulation"):
        assert name in text


def test_the_decisions_table_shows_lift_and_each_guardrail_status(tmp_path: Path) -> None:
    """Three arms, guardrails on ERR@10 (absolute) and MRR (relative): each ``ab`` row's lift is in the page, and
    each guardrail row's status (breached / within / unproven) with its tolerated loss, as the report says."""
    from stream_eval.simulate import SimulationConfig, write_jsonl

    log, config = tmp_path / "three.jsonl", tmp_path / "guard.toml"
    write_jsonl(SimulationConfig(requests=3000, seed=3, unit="user", arms=(("a", 0.55), ("b", 0.75), ("c", 0.2))),
                str(log))
    config.write_text('[experiments.exp1]\ncontrol = "a"\nguardrails = {"ERR@10" = -0.005, "MRR" = "-2%"}\n')
    page, report = _replay_html(log, tmp_path, "--config", str(config))
    text = page.read_text(encoding="utf-8")
    guards = [row for row in report["ab"] if row["guardrail"]]
    assert {row["metric"] for row in guards} == {"ERR@10", "MRR"} and len(guards) == 4
    for row in guards:
        status = "breached" if row["breached"] else "within" if row["non_inferior"] else "unproven"
        tolerated = "-2.00%" if row["metric"] == "MRR" else "-0.0050"
        assert f"{status} {tolerated}" in text, (row["treatment"], row["metric"], status)
    assert any(row["breached"] for row in guards)  # c is far worse: a breach shows
    for row in report["ab"]:
        assert f"{100 * row['lift']:+.2f}%" in text


def test_a_sample_ratio_mismatch_shows_beside_the_recommendation(tmp_path: Path) -> None:
    """A split the traffic does not follow: each treatment's recommendation carries an "SRM mismatch" badge."""
    from stream_eval.simulate import SimulationConfig, write_jsonl

    log, config = tmp_path / "three.jsonl", tmp_path / "skewed.toml"
    write_jsonl(SimulationConfig(requests=3000, seed=3, unit="user", arms=(("a", 0.55), ("b", 0.75), ("c", 0.2))),
                str(log))
    config.write_text('[experiments.exp1]\ncontrol = "a"\nsplit = {a = 1, b = 1, c = 8}\n')
    page, report = _replay_html(log, tmp_path, "--config", str(config))
    assert [r["srm_mismatch"] for r in report["experiments"]] == [True, True]
    assert page.read_text(encoding="utf-8").count("SRM mismatch") == 2
