"""The HTML report of ``stream-eval replay --html``: one self-contained file, plotly.js and the data inside.

It shows what a ranker team looks at first: each experiment's A/B decisions (with segments, the exploratory rows
per segment value and the per-arm means of each segment value after them), then the per-arm means over event
time, each A/B delta with its confidence sequence over the looks, GSB and the sample-ratio check, the feedback
delay distribution, the per-query distributions of every metric and the queries whose metric differs most between
the arms. The charts are plotly figures (``plotly`` is the ``html`` extra); the page needs no network.

A small script records whether every chart rendered: ``<html>`` carries ``data-charts-expected``, and once the
charts are drawn ``data-charts-rendered`` (their number) and ``data-chart-errors`` (a JSON list of the page's
errors, console errors included), for a browser test or anyone checking the page.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from stream_eval.export.html_data import HtmlData, QueryMeans, ratio
from stream_eval.export.report import add_column, guardrail_status, percent, pre_period_check, variance_reduction

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

    from stream_eval.config import Arms

ArmsOf = Callable[[str], "Arms | None"]

#: Queries shown per experiment and metric in "queries that differ most".
TOP_QUERIES = 15
#: Bins of the per-query distributions.
HISTOGRAM_BINS = 30
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
DECISION_COLORS = {"better": "#1a7f37", "worse": "#cf222e", "inconclusive": "#6e7781"}
BAND = "rgba(31, 119, 180, 0.18)"

_STATUS_SCRIPT = """
window.streamEval = {rendered: [], errors: []};
(function () {
  var root = document.documentElement;
  function show() {
    root.setAttribute("data-charts-rendered", String(streamEval.rendered.length));
    root.setAttribute("data-chart-errors", JSON.stringify(streamEval.errors));
  }
  window.addEventListener("error", function (e) { streamEval.errors.push(String(e.message)); show(); });
  window.addEventListener("unhandledrejection", function (e) { streamEval.errors.push(String(e.reason)); show(); });
  var consoleError = console.error;
  console.error = function () {
    streamEval.errors.push(Array.prototype.map.call(arguments, String).join(" "));
    show();
    return consoleError.apply(console, arguments);
  };
  streamEval.drawn = function (id) {
    var chart = document.getElementById(id);
    if (chart && chart.querySelector(".main-svg")) { streamEval.rendered.push(id); }
    else { streamEval.errors.push("chart " + id + " drew nothing"); }
    show();
  };
  show();
})();
"""

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 1rem 2rem 4rem; color: #1f2328; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2.5rem; border-bottom: 1px solid #d0d7de; padding-bottom: .3rem; }
p.note { color: #57606a; max-width: 60rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .9rem; }
th, td { border: 1px solid #d0d7de; padding: .25rem .6rem; text-align: right; }
th { background: #f6f8fa; } td.text, th.text { text-align: left; }
.decision { font-weight: 600; color: #fff; border-radius: .3rem; padding: .05rem .45rem; }
.warning { background: #fff8c5; border: 1px solid #d4a72c; padding: .6rem 1rem; border-radius: .4rem; }
.chart { min-height: 420px; }
"""


def write_html(path: str, report: dict[str, Any], data: HtmlData, arms_of: ArmsOf, title: str) -> None:
    """Write the report to ``path`` (UTF-8)."""
    with open(path, "w", encoding="utf-8") as out:
        out.write(render_html(report, data, arms_of, title))


def render_html(report: dict[str, Any], data: HtmlData, arms_of: ArmsOf, title: str) -> str:
    """The whole page. ``arms_of`` gives an experiment's control and treatment (``Engine.arms_of``)."""
    from plotly.offline import get_plotlyjs

    page = _Page()
    page.heading("Decisions")
    page.raw(_decisions(report))
    if report.get("segment_ab"):
        page.heading("Segments (exploratory)")
        page.raw(_segment_table(report))
    if report.get("segments"):
        page.heading("Segment means")
        page.raw(_segment_means_table(report))
    page.heading("Per-arm means over event time")
    page.note(f"Mean of the per-request values of the requests served since the start (lines) and in each "
              f"{_duration(data.timeline.width)} of event time (dots), by serve time. Pick the metric in the menu.")
    page.chart(_timeline_figure(data))
    page.heading("A/B deltas and their confidence sequences")
    page.note(_looks_note(report, data))
    for experiment in sorted({row["experiment"] for row in report["ab"]}):
        page.chart(_ab_figure(experiment, report, data))
    page.heading("GSB (good / same / bad)")
    page.raw(_gsb_table(report))
    if report["gsb"]:
        page.chart(_gsb_figure(report))
    page.heading("Sample ratio (units per arm)")
    page.raw(_srm_table(report))
    if report.get("srm"):
        page.chart(_srm_figure(report, data))
    page.heading("Feedback delay")
    page.note("Feedback time minus serve time of the feedback applied to its request (late, duplicate and orphan "
              "feedback excluded).")
    page.chart(_delay_figure(data))
    page.heading("Per-query distributions")
    page.note("Distribution over queries (requests with a query_id) of each query's mean, per arm.")
    page.chart(_query_distribution_figure(data))
    page.heading("Queries that differ most between arms")
    page.note("Queries served by both arms, ranked by |treatment mean - control mean| x requests with a value: the "
              "queries that move the arms' means most. Hover for the means and request counts.")
    page.raw(_queries_left_out(data.queries))
    primary = _primary_metric(data)
    for experiment in sorted({e for (e, _, _) in data.queries.sums.index}):
        arms = arms_of(experiment)
        for pair in arms.pairs() if arms is not None else ():
            page.chart(_top_queries_figure(experiment, pair.control, pair.treatment, data))
            page.raw(_top_queries_table(experiment, pair.control, pair.treatment, data, primary))
    return page.render(title, _summary(report), get_plotlyjs())


class _Page:
    """The body of the page as HTML parts, and its charts."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.charts = 0

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def note(self, text: str) -> None:
        self.parts.append(f'<p class="note">{html.escape(text)}</p>')

    def raw(self, markup: str) -> None:
        self.parts.append(markup)

    def chart(self, figure: Figure | None) -> None:
        if figure is None:
            self.parts.append('<p class="note">(nothing to show)</p>')
            return
        self.charts += 1
        figure.update_layout(template="plotly_white", height=figure.layout.height or 440,
                             margin={"t": 70, "r": 30, "b": 50, "l": 70})
        self.parts.append(figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{self.charts}",
                                         config=PLOT_CONFIG, post_script="streamEval.drawn('{plot_id}');"))

    def render(self, title: str, summary: str, plotly_js: str) -> str:
        return "\n".join([
            "<!DOCTYPE html>",
            f'<html lang="en" data-charts-expected="{self.charts}">',
            '<head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{_STYLE}</style>",
            f"<script>{_STATUS_SCRIPT}</script>",
            f"<script>{plotly_js}</script>",
            "</head><body>",
            f"<h1>{html.escape(title)}</h1>",
            summary,
            *self.parts,
            "</body></html>",
        ]) + "\n"


# -- tables ----------------------------------------------------------------------------------------------------


def _summary(report: dict[str, Any]) -> str:
    events = ", ".join(f"{name} {count:,}" for name, count in report["events"].items())
    overall = report["overall"]
    return (f'<p class="note">Events: {html.escape(events)}. Requests {overall["requests"]:,} (empty '
            f'{overall["empty"]:,}), sessions {overall["sessions"]:,}.</p>')


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int = 1) -> str:
    """An HTML table; cells are HTML already (escape what comes from the data)."""
    def cell(tag: str, k: int, value: str) -> str:
        return f'<{tag} class="text">{value}</{tag}>' if k < text_columns else f"<{tag}>{value}</{tag}>"

    head = "".join(cell("th", k, html.escape(h)) for k, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", k, c) for k, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _number(value: object, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return html.escape(str(value))


def _interval(lower: object, upper: object) -> str:
    return f"[{_number(lower)}, {_number(upper)}]"


def _badge(decision: str, text: str | None = None) -> str:
    """A decision (``better``, ``worse``, ``inconclusive``) in its colour, as ``text`` (default: itself)."""
    color = DECISION_COLORS.get(decision, DECISION_COLORS["inconclusive"])
    return f'<span class="decision" style="background:{color}">{html.escape(text or decision)}</span>'


def _guardrail(row: dict[str, Any]) -> str:
    """A guardrail row's status against its tolerated loss (``breached``, ``within``, ``unproven``), blank for a
    goal metric."""
    status = guardrail_status(row)
    return "" if status is None else _badge(*status)


def _decisions(report: dict[str, Any]) -> str:
    parts = []
    for row in report.get("srm", []):
        if row["mismatch"]:
            parts.append(f'<p class="warning">Sample-ratio mismatch in {html.escape(row["experiment"])} (sequential '
                         f'p = {_number(row["sequential_p_value"], 6)}): the split or the logging is broken, do not '
                         "trust this experiment's rows.</p>")
    if not report["ab"]:
        parts.append('<p class="note">No A/B comparison: no experiment with two arms (or <code>ab = false</code>).'
                     "</p>")
        return "".join(parts)
    level = f"{100 * report['config']['confidence']:g}%"
    rows = [[html.escape(a["experiment"]), f"{html.escape(a['treatment'])} - {html.escape(a['control'])}",
             html.escape(a["metric"]), _number(a["delta"]), _interval(a["cs_lower"], a["cs_upper"]),
             percent(a.get("lift")), f"[{percent(a.get('lift_cs_lower'))}, {percent(a.get('lift_cs_upper'))}]",
             _number(a["p_value"]), _badge(a["decision"]), _guardrail(a),
             f"{a['units_control']:,} / {a['units_treatment']:,}"]
            for a in report["ab"]]
    parts.append('<p class="note">Each treatment - the control, over randomisation units. The confidence sequence '
                 "and the p-value stay valid however often they are read; the decisions are taken after "
                 "false-discovery control (e-BH over the goal metrics and treatments).</p>")
    header = ["experiment", "arms", "metric", "delta", f"{level} confidence sequence", "lift",
              "lift's confidence sequence", "p", "decision", "guardrail", "units c / t"]
    if any(a.get("cuped") for a in report["ab"]):  # CUPED: the adjusted rows' variance reduction
        add_column(header, rows, "CUPED variance reduction", map(variance_reduction, report["ab"]))
        checks = [f"{html.escape(r['experiment'])}: {html.escape(check)}" for r in report.get("srm", [])
                  if (check := pre_period_check(r, report["ab"])) is not None]
        parts.append(f'<p class="note">CUPED on: each row adjusted by the units\' own pre-period values; '
                     f'pre-period check (the arms before the experiment) {"; ".join(checks) or "-"}.</p>')
    parts.append(_table(header, rows, text_columns=3))
    recommendation_colours = {"ship": "better", "rollback": "worse", "keep running": "inconclusive"}
    recommendations = [[html.escape(r["experiment"]), html.escape(r["treatment"]),
                        _badge(recommendation_colours[r["recommendation"]], r["recommendation"])
                        + (" " + _badge("worse", "SRM mismatch") if r.get("srm_mismatch") else ""),
                        html.escape(", ".join(r["better"])), html.escape(", ".join(r["breached"])),
                        html.escape(", ".join(r["unproven"]))] for r in report.get("experiments", [])]
    if recommendations:
        parts.append(_table(["experiment", "treatment", "recommendation", "better", "guardrails breached",
                             "guardrails not proven"], recommendations, text_columns=2))
    return "".join(parts)


def _segment_table(report: dict[str, Any]) -> str:
    """The A/B rows per segment value: exploratory, their decisions by e-BH over the experiment's segment rows, and
    whether the effect there differs from the rest of the experiment's."""
    level = f"{100 * report['config']['confidence']:g}%"
    rows = [[html.escape(a["experiment"]), html.escape(f"{a['segment']['field']} = {a['segment']['value']}"),
             f"{html.escape(a['treatment'])} - {html.escape(a['control'])}", html.escape(a["metric"]),
             _number(a["delta"]), _interval(a["cs_lower"], a["cs_upper"]), percent(a.get("lift")),
             _number(a["p_value"]), _badge(a["decision"]), _number(a["rest_delta"]), _number(a["rest_p_value"]),
             _badge("worse" if a["differs"] else "inconclusive", "differs" if a["differs"] else "no"),
             f"{a['units_control']:,} / {a['units_treatment']:,}"]
            for a in report["segment_ab"]]
    note = ('<p class="note">Each treatment - the control within one value of a segment field (a unit is in the value '
            "of its first request), as of the last look. Exploratory: the decisions are taken by e-BH over the "
            "experiment's segment rows, and \"vs rest\" is the delta here minus the delta of every other unit, "
            "flagged when it differs (an always-valid test, e-BH over the same rows).</p>")
    return note + _table(["experiment", "segment", "arms", "metric", "delta", f"{level} confidence sequence", "lift",
                          "p", "decision", "vs rest", "rest p", "differs", "units c / t"], rows, text_columns=4)


def _segment_means_table(report: dict[str, Any]) -> str:
    """The report's segment groups: per experiment, segment field and value shown, each arm's requests and means
    of the per-request measures, so that a segment A/B row can be read against the levels it compares (a delta of
    0.02 on a mean of 0.1 is not one on 0.8), and a value's traffic seen per arm."""
    rows = sorted(report["segments"], key=lambda g: (g["experiment"], g["segment"]["field"], g["segment"]["value"],
                                                     g["arm"]))
    names = list(dict.fromkeys(name for group in rows for name in group["metrics"]))
    body = [[html.escape(g["experiment"]), html.escape(f"{g['segment']['field']} = {g['segment']['value']}"),
             html.escape(g["arm"]), f"{g['requests']:,}", f"{g['empty']:,}",
             *(_number(g["metrics"].get(name)) for name in names)] for g in rows]
    folded = ", ".join(f"{field} {count:,}" for field, count in report.get("segment_overflow", {}).items() if count)
    note = ('<p class="note">Mean of the per-request values of the requests in each segment value, per arm (a request '
            "is in the value its ranking's attributes carry; <code>__missing__</code>: without the field, "
            "<code>__other__</code>: the values beyond those shown"
            + (f"; requests folded into it: {html.escape(folded)}" if folded else "") + ").</p>")
    return note + _table(["experiment", "segment", "arm", "requests", "empty", *names], body, text_columns=3)


def _gsb_table(report: dict[str, Any]) -> str:
    if not report["gsb"]:
        return '<p class="note">No GSB verdicts (judgments, per-query metrics of both arms, or interleaving).</p>'
    rows = [[html.escape(g["experiment"]), html.escape(g["treatment"] or ""), html.escape(g["source"]),
             f"{g['good']:,}", f"{g['same']:,}",
             f"{g['bad']:,}", _number(g["score"]), _interval(g["cs_lower"], g["cs_upper"]), _number(g["p_value"]),
             _badge(g["decision"])] for g in report["gsb"]]
    return _table(["experiment", "treatment", "source", "good", "same", "bad", "score", "confidence sequence", "p",
                   "decision"], rows, text_columns=3)


def _srm_table(report: dict[str, Any]) -> str:
    if not report.get("srm"):
        return '<p class="note">No A/B units (no experiment with two arms, or <code>ab = false</code>).</p>'
    rows = [[html.escape(r["experiment"]), html.escape(", ".join(f"{arm} {n:,}" for arm, n in r["units"].items())),
             html.escape(", ".join(f"{arm} {share:g}" for arm, share in r["expected"].items())),
             _number(r["p_value"]), _number(r["sequential_p_value"]),
             _badge("worse", "MISMATCH") if r["mismatch"] else _badge("better", "ok")]
            for r in report["srm"]]
    header = ["experiment", "units", "expected split", "chi2 p", "sequential p", "sample ratio"]
    if any("pre_imbalance" in r for r in report["srm"]):  # CUPED: the arms' pre-period compared, as in the table view
        add_column(header, rows, "pre-period", (html.escape(pre_period_check(r, report.get("ab", ())) or "-")
                                                 for r in report["srm"]))
    return _table(header, rows, text_columns=3)


def _queries_left_out(queries: QueryMeans) -> str:
    if not queries.left_out:
        return ""
    return (f'<p class="note">{queries.left_out:,} requests of queries beyond the first {queries.max_queries:,} '
            "(experiment, arm, query) cells are not shown.</p>")


# -- figures ---------------------------------------------------------------------------------------------------


def _when(ts: float) -> str:
    """An event time as plotly reads dates (UTC)."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _duration(seconds: float) -> str:
    """``90`` -> ``1.5 min``."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def _label(text: str) -> str:
    """A string from the data as plotly text (which reads a few HTML tags): shown as it is."""
    return html.escape(text, quote=False)


def _with_menu(figure: Figure, labels: Sequence[str], owner: Sequence[int], titles: Sequence[str],
               selected: str | None = None) -> Figure:
    """Show one option at a time: trace ``i`` belongs to option ``owner[i]``; a menu switches between
    ``labels`` (with their ``titles``), starting on ``selected`` (default: the first)."""
    first = labels.index(selected) if selected in labels else 0
    for i, trace in enumerate(figure.data):
        trace.visible = owner[i] == first
    figure.update_layout(title={"text": titles[first]})
    if len(labels) > 1:
        buttons = [{"label": label, "method": "update",
                    "args": [{"visible": [o == k for o in owner]}, {"title.text": titles[k]}]}
                   for k, label in enumerate(labels)]
        figure.update_layout(updatemenus=[{"buttons": buttons, "active": first, "x": 1.0, "xanchor": "right",
                                           "y": 1.02, "yanchor": "bottom", "direction": "down"}])
    return figure


def _shown_metrics(data: HtmlData) -> list[int]:
    """The per-request columns with at least one value (alpha-nDCG needs subtopics)."""
    counts = data.timeline.sums.counts
    return [j for j in range(len(data.names)) if counts.shape[0] and counts[:, j].sum() > 0]


def _groups(data: HtmlData) -> list[tuple[str, str]]:
    return sorted({(e, a) for (e, a, _) in data.timeline.sums.index})


def _timeline_figure(data: HtmlData) -> Figure | None:
    import plotly.colors
    import plotly.graph_objects as go

    metrics = _shown_metrics(data)
    if not metrics:
        return None
    figure, owner = go.Figure(), []
    colors = plotly.colors.qualitative.Plotly
    for k, j in enumerate(metrics):
        for g, (experiment, arm) in enumerate(_groups(data)):
            starts, sums, counts, requests = data.timeline.series(experiment, arm)
            xs, name, color = [_when(t) for t in starts], _label(f"{experiment} / {arm}"), colors[g % len(colors)]
            figure.add_trace(go.Scatter(
                x=xs, y=ratio(np.cumsum(sums[:, j]), np.cumsum(counts[:, j])), mode="lines", name=name,
                legendgroup=name, line={"color": color, "width": 2.5},
                hovertemplate=f"{name}: %{{y:.4f}} since the start<extra></extra>"))
            figure.add_trace(go.Scatter(
                x=xs, y=ratio(sums[:, j], counts[:, j]), mode="markers", name=name, legendgroup=name,
                showlegend=False, marker={"color": color, "size": 5, "opacity": 0.45}, customdata=requests,
                hovertemplate=f"{name}: %{{y:.4f}} in this bucket (%{{customdata}} requests)<extra></extra>"))
            owner += [k, k]
    figure.update_xaxes(title="serve time (UTC)")
    names = [data.names[j] for j in metrics]
    return _with_menu(figure, names, owner, [f"{name} per arm: since the start (lines) and per bucket (dots)"
                                             for name in names], _primary_name(data))


def _over_looks(data: HtmlData, section: str, **fields: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of ``section`` (``ab``, ``srm``) with these ``fields``, at each look, with the looks' times."""
    rows, xs = [], []
    for look in data.looks:
        if look["ts"] is None:
            continue
        for row in look[section]:
            if all(row[name] == value for name, value in fields.items()):
                rows.append(row)
                xs.append(_when(look["ts"]))
    return rows, xs


def _looks_note(report: dict[str, Any], data: HtmlData) -> str:
    every = _duration(report["config"]["look_every"])
    text = (f"One point per A/B look (every {every} of event time, and at the end of input): the running "
            "intersection of the confidence sequences, as --ab-trace writes it. Zero (dotted) outside the band is a "
            "decision.")
    if len(data.looks) < 5:
        text += f" Only {len(data.looks)} look(s): a smaller --look-every gives a finer curve."
    return text


def _ab_figure(experiment: str, report: dict[str, Any], data: HtmlData) -> Figure | None:
    """Per metric (behind a menu), the delta and its confidence sequence (a band) at each look."""
    import plotly.graph_objects as go

    figure = go.Figure()
    labels: list[str] = []
    titles: list[str] = []
    owner: list[int] = []
    for final in report["ab"]:
        if final["experiment"] != experiment:
            continue
        metric = final["metric"]
        rows, xs = _over_looks(data, "ab", experiment=experiment, metric=metric)
        figure.add_trace(go.Scatter(x=xs, y=[r["cs_upper"] for r in rows], mode="lines", line={"width": 0},
                                    showlegend=False, hovertemplate="upper %{y:.4f}<extra></extra>"))
        figure.add_trace(go.Scatter(x=xs, y=[r["cs_lower"] for r in rows], mode="lines", line={"width": 0},
                                    fill="tonexty", fillcolor=BAND, name="confidence sequence",
                                    hovertemplate="lower %{y:.4f}<extra></extra>"))
        figure.add_trace(go.Scatter(x=xs, y=[r["delta"] for r in rows], mode="lines+markers", name="delta",
                                    line={"color": "#1f77b4"}, customdata=[r["units_control"] + r["units_treatment"]
                                                                          for r in rows],
                                    hovertemplate="delta %{y:.4f} (%{customdata} units)<extra></extra>"))
        owner += [len(labels)] * 3
        labels.append(_label(metric))
        titles.append(f"{_label(experiment)}: {_label(final['treatment'])} - {_label(final['control'])}, "
                      f"{_label(metric)} (decision: {final['decision']})")
    if not labels:
        return None
    figure.add_hline(y=0, line={"color": "#57606a", "dash": "dot"})
    figure.update_xaxes(title="look (event time, UTC)")
    return _with_menu(figure, labels, owner, titles, _primary_name(data))


def _gsb_figure(report: dict[str, Any]) -> Figure:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                           subplot_titles=["verdicts", "score (good - bad) / all, with its confidence sequence"])
    rows = report["gsb"]
    labels = [_label(f"{g['experiment']} · {g['source']}") for g in rows]
    for verdict, color in (("good", "#1a7f37"), ("same", "#afb8c1"), ("bad", "#cf222e")):
        figure.add_trace(go.Bar(y=labels, x=[g[verdict] for g in rows], name=verdict, orientation="h",
                                marker_color=color), row=1, col=1)

    def gap(row: dict[str, Any], bound: str) -> float | None:
        return None if row[bound] is None or row["score"] is None else abs(row[bound] - row["score"])

    figure.add_trace(go.Scatter(
        y=labels, x=[g["score"] for g in rows], mode="markers", name="score", showlegend=False,
        marker={"size": 11, "color": [DECISION_COLORS.get(g["decision"], "#6e7781") for g in rows]},
        error_x={"type": "data", "symmetric": False, "color": "#1f2328", "array": [gap(g, "cs_upper") for g in rows],
                 "arrayminus": [gap(g, "cs_lower") for g in rows]},
        customdata=[g["decision"] for g in rows], hovertemplate="score %{x:.4f} (%{customdata})<extra></extra>"),
        row=1, col=2)
    figure.add_vline(x=0, line={"color": "#57606a", "dash": "dot"}, row=1, col=2)
    figure.update_xaxes(range=[-1.05, 1.05], row=1, col=2)
    figure.update_layout(barmode="stack", title={"text": "GSB per experiment and source"},
                         height=max(300, 160 + 60 * len(rows)))
    return figure


def _srm_figure(report: dict[str, Any], data: HtmlData) -> Figure:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=2, subplot_titles=["units per arm: seen and expected",
                                                           "sequential p-value over the looks"])
    labels, seen, expected = [], [], []
    for row in report["srm"]:
        total = sum(row["units"].values())
        for arm, share in row["expected"].items():
            labels.append(_label(f"{row['experiment']} · {arm}"))
            seen.append(row["units"].get(arm, 0))
            expected.append(share * total)
    figure.add_trace(go.Bar(x=labels, y=seen, name="units"), row=1, col=1)
    figure.add_trace(go.Bar(x=labels, y=expected, name="expected", marker_color="#afb8c1"), row=1, col=1)
    for row in report["srm"]:
        rows, xs = _over_looks(data, "srm", experiment=row["experiment"])
        figure.add_trace(go.Scatter(x=xs, y=[r["sequential_p_value"] for r in rows], mode="lines+markers",
                                    name=_label(f"{row['experiment']} p")), row=1, col=2)
    figure.add_hline(y=report["config"]["srm_alpha"], line={"color": "#cf222e", "dash": "dot"}, row=1, col=2)
    figure.update_yaxes(type="log", row=1, col=2)
    figure.update_layout(barmode="group", title={"text": "Sample ratio"})
    return figure


def _delay_figure(data: HtmlData) -> Figure | None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    delays = data.delays
    if delays is None or not delays.count:
        return None
    counts = delays.counts.tolist()
    used = max(k for k, n in enumerate(counts) if n) + 1  # no empty buckets at the end
    bounds = [*delays.bounds.tolist(), math.inf][:used]
    labels = [f"{_duration(a)} - {_duration(b)}" if math.isfinite(b) else f"> {_duration(a)}"
              for a, b in zip([0.0, *bounds], bounds, strict=False)]
    figure = make_subplots(specs=[[{"secondary_y": True}]])
    figure.add_trace(go.Bar(x=labels, y=counts[:used], name="feedback events"), secondary_y=False)
    figure.add_trace(go.Scatter(x=labels, y=np.cumsum(counts[:used]) / delays.count, mode="lines+markers",
                                name="share within", hovertemplate="%{y:.1%}"), secondary_y=True)
    figure.update_yaxes(title="feedback events", secondary_y=False)
    figure.update_yaxes(title="share within", range=[0, 1.02], tickformat=".0%", tickvals=[0, 0.25, 0.5, 0.75, 1],
                        showgrid=False, secondary_y=True)
    figure.update_xaxes(title="delay after serve time")
    mean = delays.total / delays.count
    figure.update_layout(title={"text": f"Feedback delay ({delays.count:,} events, mean {_duration(mean)})"})
    return figure


def _query_distribution_figure(data: HtmlData) -> Figure | None:
    import plotly.graph_objects as go

    queries = data.queries.sums
    metrics = [j for j in _shown_metrics(data) if queries.counts.shape[0] and queries.counts[:, j].sum() > 0]
    if not metrics:
        return None
    groups = sorted({(e, a) for (e, a, _) in queries.index})
    rows_of = {group: [row for (e, a, _), row in queries.index.items() if (e, a) == group] for group in groups}
    figure, owner = go.Figure(), []
    for k, j in enumerate(metrics):
        with np.errstate(invalid="ignore", divide="ignore"):
            means = queries.sums[:, j] / queries.counts[:, j]
        known = means[~np.isnan(means)]
        edges = np.histogram_bin_edges(known, bins=HISTOGRAM_BINS)
        for experiment, arm in groups:
            values = means[rows_of[(experiment, arm)]]
            values = values[~np.isnan(values)]
            counts, _ = np.histogram(values, bins=edges)
            shares = counts / max(len(values), 1)
            figure.add_trace(go.Scatter(x=edges, y=[*shares, shares[-1]], mode="lines",  # steps over the bins
                                        line={"shape": "hv", "width": 2},
                                        name=_label(f"{experiment} / {arm} ({len(values):,} queries)"),
                                        hovertemplate="from %{x:.3f}: %{y:.1%} of queries"))
            owner.append(k)
    figure.update_xaxes(title="the query's mean")
    figure.update_yaxes(title="share of queries", tickformat=".0%")
    names = [data.names[j] for j in metrics]
    return _with_menu(figure, names, owner, [f"per-query mean {name}" for name in names], _primary_name(data))


def _differences(experiment: str, control: str, treatment: str, data: HtmlData, j: int) -> list[dict[str, Any]]:
    """Queries of both arms with a value of column ``j``, the ones that move the means most first."""
    sums = data.queries.sums
    arms = data.queries.arms(experiment)
    mine, theirs = arms.get(control, {}), arms.get(treatment, {})
    out = []
    for query in mine.keys() & theirs.keys():
        c, t = mine[query], theirs[query]
        n_c, n_t = sums.counts[c, j], sums.counts[t, j]
        if not (n_c and n_t):
            continue
        mean_c, mean_t = sums.sums[c, j] / n_c, sums.sums[t, j] / n_t
        out.append({"query": query, "control": mean_c, "treatment": mean_t, "delta": mean_t - mean_c,
                    "n_control": int(n_c), "n_treatment": int(n_t), "impact": abs(mean_t - mean_c) * (n_c + n_t)})
    out.sort(key=lambda d: (-d["impact"], d["query"]))
    return out[:TOP_QUERIES]


def _top_queries_figure(experiment: str, control: str, treatment: str, data: HtmlData) -> Figure | None:
    import plotly.graph_objects as go

    figure = go.Figure()
    options: list[str] = []
    owner: list[int] = []
    for j in _shown_metrics(data):
        top = _differences(experiment, control, treatment, data, j)
        if not top:
            continue
        top.reverse()  # the largest at the top of the chart
        figure.add_trace(go.Bar(
            y=[_label(d["query"]) for d in top], x=[d["delta"] for d in top], orientation="h", showlegend=False,
            marker_color=["#1a7f37" if d["delta"] > 0 else "#cf222e" for d in top],
            customdata=[[d["control"], d["treatment"], d["n_control"], d["n_treatment"]] for d in top],
            hovertemplate=("delta %{x:.4f}<br>control %{customdata[0]:.4f} (%{customdata[2]} requests)"
                           "<br>treatment %{customdata[1]:.4f} (%{customdata[3]} requests)<extra></extra>")))
        owner.append(len(options))
        options.append(data.names[j])
    if not options:
        return None
    figure.update_xaxes(title=_label(f"{treatment} - {control}"), zeroline=True)
    figure.update_yaxes(type="category")
    figure.update_layout(height=120 + 28 * TOP_QUERIES)
    titles = [f"{_label(experiment)}: queries that differ most, {_label(name)}" for name in options]
    return _with_menu(figure, [_label(name) for name in options], owner, titles, _primary_name(data))


def _primary_metric(data: HtmlData) -> int | None:
    """The column of the GSB metric (``gsb_metric``, nDCG@10 by default) if it is shown, else the first shown."""
    shown = _shown_metrics(data)
    for j in shown:
        if data.names[j] == data.config.gsb_metric:
            return j
    return shown[0] if shown else None


def _primary_name(data: HtmlData) -> str | None:
    j = _primary_metric(data)
    return None if j is None else data.names[j]


def _top_queries_table(experiment: str, control: str, treatment: str, data: HtmlData, j: int | None) -> str:
    if j is None:
        return ""
    top = _differences(experiment, control, treatment, data, j)
    if not top:
        return f'<p class="note">No query of {html.escape(experiment)} was served by both arms.</p>'
    rows = [[html.escape(d["query"]), _number(d["control"]), _number(d["treatment"]), _number(d["delta"]),
             f"{d['n_control']:,} / {d['n_treatment']:,}"] for d in top]
    return _table(["query", f"{control} {data.names[j]}", f"{treatment} {data.names[j]}", "delta",
                   "requests c / t"], rows)
