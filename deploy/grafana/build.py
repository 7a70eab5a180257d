#!/usr/bin/env python3
"""The stream_eval Grafana dashboard as code: writes ``dashboards/stream-eval.json`` next to this script.

    python3 -m pip install 'grafana-foundation-sdk==1769699379!11.6.0'   # or: pip install -e '.[test]'
    python3 deploy/grafana/build.py            # rewrite the JSON
    python3 deploy/grafana/build.py --check    # exit 1 if the checked-in JSON differs from this script

The JSON is checked in, so running Grafana needs nothing from here; ``tests/test_deploy.py`` regenerates it in
memory and compares. The SDK is pinned exactly: its versions are ``<build epoch>!<Grafana version>``, so an
unpinned install picks whichever Grafana version was built last, and each build may encode differently.

Queries read the raw series of docs/contract.md §5 and §6, never recording rules, so the dashboard works without
them. Means are ratios of sums taken over workers (``sum(..._sum) / sum(..._count)``); the A/B, SRM and GSB p-value
gauges come from one worker of a group and are taken with ``max by (...)``, never summed. Only the variables
``$experiment``, ``$arm``, ``$metric``, ``$segment`` (the segment fields, config ``segments``) and
``$__rate_interval`` appear in queries.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Panel,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from stream_eval.metrics.specs import REGISTRY

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "dashboards" / "stream-eval.json"

DATASOURCE_UID = "stream-eval-prometheus"  # = provisioning/datasources/prometheus.yml
DATASOURCE = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
DASHBOARD_UID = "stream-eval"

ALL = VariableOption(selected=True, text="All", value="$__all")

EXP = 'experiment=~"$experiment"'
EXP_ARM = 'experiment=~"$experiment", arm=~"$arm"'
EXP_METRIC = 'experiment=~"$experiment", metric=~"$metric"'
SEGMENT = 'segment_field=~"$segment"'
#: The labels of a segment value's series, besides the group's (docs/contract.md §5).
SEGMENT_BY = "segment_field, segment_value"

# (name of the mean in the window and A/B series, per-request name in the finalised series, what it measures)
QUALITY = (
    ("MRR", "RR", "Mean reciprocal rank: 1 / the rank of the first relevant item, 0 if none was relevant."),
    ("nDCG@10", "nDCG@10", "Normalised discounted cumulative gain of the top 10 items "
     "(Järvelin & Kekäläinen 2002): 1 when the most relevant items are on top."),
    ("ERR@10", "ERR@10", "Expected reciprocal rank of the top 10 (Chapelle et al. 2009): "
     "how soon a user who stops at the first satisfying item is satisfied."),
    ("GAUC", "AUC", "Group AUC (Zhou et al. 2018): the weighted mean, over sessions with both clicked and "
     "unclicked items, of the probability that a clicked item was ranked above an unclicked one."),
)
QUALITY_TAIL = (
    " Per arm. '5m' and '1h': the requests served in the last 5 minutes / 1 hour of event time, open requests' "
    "current values included, so these move as clicks arrive. 'cumulative': every finalised request so far. "
    "All three are summed over workers first (sum of sums / sum of counts), so they are exact with any number of "
    "workers. Whether a gap between the arms is real is read in the A/B row."
)

# The behaviour measures (README, "Behaviour measures"; on with metrics = ["default", "behaviour"]): (mean, per-request
# name, what it measures, unit, whether it lies in [0, 1]).
BEHAVIOUR = (
    ("CTR@10", "CTR@10", "Click-through: the share of requests with a click on one of their top 10 items.",
     "percentunit", True),
    ("Abandoned", "Abandoned", "The share of requests that showed results and got no click (lower is better).",
     "percentunit", True),
    ("SatClick", "SatClick", "The share of requests with a satisfied click: a click with a dwell of at least sat_dwell "
     "(30 s) or feedback of a satisfying kind (sat_kinds, e.g. purchase).", "percentunit", True),
    ("TimeToFirstClick", "TimeToFirstClick", "Seconds from serving a list to its first click, over the requests with "
     "a click (lower is better).", "s", False),
    ("ZeroResult", "ZeroResult", "The share of requests that served an empty list (lower is better).", "percentunit",
     True),
    ("Reformulation", "Reformulation", "The share of requests of a session followed within reformulation_gap (60 s) "
     "by another query of the session without a satisfied click (lower is better). Valued when the session closes.",
     "percentunit", True),
    ("QueriesPerSession", "QueriesPerSession", "Requests per session, over the sessions that closed.", "none", False),
)
BEHAVIOUR_TAIL = (
    " Per arm; '5m' / '1h' of event time and 'cumulative', summed over workers first. Session measures are counted "
    "when the session closes, so their windows hold the sessions that closed in them. No data unless the worker runs "
    "the behaviour measures (metrics = [\"default\", \"behaviour\"])."
)
#: Metrics whose fall is an improvement: their decision reads a confidence sequence below 0 as better.
LOWER_IS_BETTER = "|".join(sorted(name for name, family in REGISTRY.items() if family.lower_is_better))

NEUTRAL, GOOD, BAD, WARN = "text", "green", "red", "orange"


def _query(ref_id: str, expr: str, legend: str, *, instant: bool = False) -> prometheus.Dataquery:
    query = prometheus.Dataquery().ref_id(ref_id).expr(expr).legend_format(legend).datasource(DATASOURCE)
    if instant:
        return query.instant().format(PromQueryFormat.TABLE)
    return query.range()


def _ratio(sum_series: str, count_series: str, selector: str, by_labels: str = "experiment, arm") -> str:
    """Mean per (experiment, arm) (or ``by_labels``) over workers; no value rather than NaN while nothing has been
    counted."""
    by = f"sum by ({by_labels})"
    return f"{by} ({sum_series}{{{selector}}})\n  / ({by} ({count_series}{{{selector}}}) > 0)"


def _as_mean_names(expr: str) -> str:
    """``expr``'s series of every metric, their per-request names given as the means' (RR -> MRR, AP(rel=2)@10 ->
    MAP(rel=2)@10, as the A/B series and live windows name them), and only those of the panel's ``$metric``."""
    # (${metric:raw}: a multi-value variable is regex-escaped, MAP\(rel=2\)@10, where a label value is set)
    return (f'label_replace({expr}, "metric", "M$1$2", "metric", "(RR|AP)([(@].*)?")\n'
            '  and on (metric) label_replace(vector(1), "metric", "${metric:raw}", "", "")')


def _thresholds(base: str, *steps: tuple[float, str]) -> dash.ThresholdsConfig:
    return dash.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(value=None, color=base), *(Threshold(value=v, color=c) for v, c in steps)])


def _mapping(options: dict[str, tuple[str, str]]) -> ValueMap:
    return ValueMap(options={value: ValueMappingResult(text=text, color=color, index=i)
                             for i, (value, (text, color)) in enumerate(options.items())})


def _graph(panel_id: int, title: str, description: str, *, unit: str = "none", w: int = 12,
           h: int = 8) -> timeseries.Panel:
    return (
        timeseries.Panel().id(panel_id).title(title).description(description).datasource(DATASOURCE)
        .unit(unit).span(w).height(h)
        .legend(common_builders.VizLegendOptions().show_legend(True)
                .display_mode(common.LegendDisplayMode.LIST).placement(common.LegendPlacement.BOTTOM))
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                 .sort(common.SortOrder.DESCENDING))
    )


def _line() -> common_builders.GraphThresholdsStyleConfig:
    """Thresholds drawn as lines across the graph (the base step, -inf, draws nothing)."""
    return common_builders.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE)


def _log_scale() -> common_builders.ScaleDistributionConfig:
    return common_builders.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10)


def _stat(panel_id: int, title: str, description: str, *, w: int = 4, h: int = 8) -> stat.Panel:
    return (
        stat.Panel().id(panel_id).title(title).description(description).datasource(DATASOURCE).span(w).height(h)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .color_mode(common.BigValueColorMode.BACKGROUND).graph_mode(common.BigValueGraphMode.NONE)
    )


def quality_panels(ids: Iterator[int]) -> list[timeseries.Panel]:
    return _per_arm_panels(ids, [(mean, per_request, what + QUALITY_TAIL, "none", True)
                                 for mean, per_request, what in QUALITY])


def behaviour_panels(ids: Iterator[int]) -> list[timeseries.Panel]:
    return _per_arm_panels(ids, [(mean, per_request, what + BEHAVIOUR_TAIL, unit, bounded)
                                 for mean, per_request, what, unit, bounded in BEHAVIOUR], w=8)


def _per_arm_panels(ids: Iterator[int], rows: Sequence[tuple[str, str, str, str, bool]],
                    w: int = 12) -> list[timeseries.Panel]:
    """A graph per mean: its 5m and 1h windows and its cumulative mean, per arm."""
    panels = []
    for mean, per_request, description, unit, bounded in rows:
        window = [f'{EXP_ARM}, metric="{mean}", window="{label}"' for label in ("5m", "1h")]
        finalised = f'{EXP_ARM}, metric="{per_request}"'
        graph = _graph(next(ids), f"{mean} per arm", description, unit=unit, w=w).decimals(3)
        panels.append(
            (graph.min(0).max(1) if bounded else graph.min(0))
            .with_target(_query("A", _ratio("stream_eval_window_sum", "stream_eval_window_count", window[0]),
                                "{{arm}} 5m"))
            .with_target(_query("B", _ratio("stream_eval_window_sum", "stream_eval_window_count", window[1]),
                                "{{arm}} 1h"))
            .with_target(_query("C", _ratio("stream_eval_metric_sum_total", "stream_eval_metric_count_total",
                                            finalised), "{{arm}} cumulative"))
            .override_by_regexp("/ 1h$/", [DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 6]})])
            .override_by_regexp("/ cumulative$/", [DynamicConfigValue("custom.lineWidth", 3)])
        )
    return panels


def _ab(series: str, selector: str = f'{EXP_METRIC}, arm=~"$arm"') -> str:
    """An A/B series per treatment (``arm``) and metric (max over the workers exporting it during a hand-over)."""
    return f"max by (experiment, arm, metric) ({series}{{{selector}}})"


def _status_table(panel: table.Panel, columns: dict[str, tuple[str, str]], status: str,
                  states: dict[str, tuple[str, str]], keys: Sequence[str] = ("experiment", "arm", "metric"),
                  ) -> table.Panel:
    """An instant table of one row per ``keys`` (experiment, arm, metric): the columns' queries merged, the
    ``status`` column (the first) mapped to the names and colours of ``states``."""
    names = [*keys, *(f"Value #{ref}" for ref in columns)]
    panel = (
        panel
        .with_transformation(DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True},
            "indexByName": {name: i for i, name in enumerate(names)},  # original names, as Grafana wants
            "renameByName": {f"Value #{ref}": name for ref, (_, name) in columns.items()},
        }))
        .override_by_name(status, [
            DynamicConfigValue("mappings", [_mapping(states)]),
            DynamicConfigValue("custom.cellOptions", {"type": "color-background"}),
        ])
    )
    for ref, (expr, _) in columns.items():
        panel = panel.with_target(_query(ref, expr, "", instant=True))
    return panel


def decisions_panel(panel_id: int) -> table.Panel:
    higher, lower = f'{EXP}, metric!~"{LOWER_IS_BETTER}"', f'{EXP}, metric=~"{LOWER_IS_BETTER}"'
    decision = (f"({_ab('stream_eval_ab_cs_lower', higher)} > bool 0)\n"
                f"  - ({_ab('stream_eval_ab_cs_upper', higher)} < bool 0)\n"
                f"or ({_ab('stream_eval_ab_cs_upper', lower)} < bool 0)\n"
                f"  - ({_ab('stream_eval_ab_cs_lower', lower)} > bool 0)")
    columns = {  # ref id: (series or expression, column name)
        "A": (decision, "decision"),
        "B": (_ab("stream_eval_ab_delta", EXP), "delta"),
        "C": (_ab("stream_eval_ab_cs_lower", EXP), "cs lower"),
        "D": (_ab("stream_eval_ab_cs_upper", EXP), "cs upper"),
        "E": (_ab("stream_eval_ab_p_value", EXP), "p-value (always valid)"),
        "F": (_ab("stream_eval_ab_ci_lower", EXP), "ci lower (fixed)"),
        "G": (_ab("stream_eval_ab_ci_upper", EXP), "ci upper (fixed)"),
    }
    panel = (
        table.Panel().id(panel_id).title("Decisions: each treatment vs control, every metric")
        .description(
            "One line per treatment arm and metric of the experiment (every arm but the control is a treatment). "
            "'delta' is treatment minus control. 'cs lower' / 'cs upper' "
            "bound the always-valid confidence sequence: unlike a fixed-sample interval, it stays valid however "
            "often you look, so you may stop as soon as it excludes 0. decision = better when cs lower > 0, worse "
            "when cs upper < 0, otherwise inconclusive (keep collecting); the other way round for the measures "
            f"where lower is better ({LOWER_IS_BETTER.replace('|', ', ')}). 'p-value (always valid)' is below "
            "1 - confidence exactly when the sequence excludes 0. The fixed-sample interval (ci) is shown for "
            "reference only: it is valid at one look planned in advance, not when watched continuously.")
        .datasource(DATASOURCE).span(24).height(7).decimals(4)
    )
    return _status_table(panel, columns, "decision",
                         {"1": ("better", GOOD), "0": ("inconclusive", NEUTRAL), "-1": ("worse", BAD)})


def delta_panel(panel_id: int) -> timeseries.Panel:
    dashed = {"fill": "dash", "dash": [10, 6]}
    return (
        _graph(panel_id, "$metric: treatment - control, with its confidence sequence",
               "Each treatment arm minus control of $metric over time (one panel per selected metric; the 'arm' "
               "selector picks treatments). 'cs lower' .. 'cs upper' is the always-valid confidence sequence: it "
               "narrows as randomisation units accumulate and may be read at any time; a treatment is better once "
               "its sequence lies wholly above the red zero line, worse once wholly below. The dashed lines are "
               "the fixed-sample confidence interval, narrower but valid only for a single look planned in "
               "advance.", w=24, h=9)
        .repeat("metric").repeat_direction("h").max_per_row(2)
        .thresholds(_thresholds("transparent", (0, BAD))).thresholds_style(_line())
        .with_target(_query("A", _ab("stream_eval_ab_delta"), "{{arm}} delta"))
        .with_target(_query("B", _ab("stream_eval_ab_cs_lower"), "{{arm}} cs lower"))
        .with_target(_query("C", _ab("stream_eval_ab_cs_upper"), "{{arm}} cs upper"))
        .with_target(_query("D", _ab("stream_eval_ab_ci_lower"), "{{arm}} ci lower"))
        .with_target(_query("E", _ab("stream_eval_ab_ci_upper"), "{{arm}} ci upper"))
        .override_by_regexp("/ delta$/", [DynamicConfigValue("custom.lineWidth", 2)])
        .override_by_regexp("/ ci /", [DynamicConfigValue("custom.lineStyle", dashed)])
    )


def lift_panel(panel_id: int) -> timeseries.Panel:
    return (
        _graph(panel_id, "$metric: relative lift of each treatment, with its confidence sequence",
               "Each treatment arm's relative lift on $metric over time: treatment / control - 1 (one panel per "
               "selected metric; the 'arm' selector picks treatments), the number teams read and set thresholds "
               "in ('nDCG@10 +1.2 %'). 'cs lower' .. 'cs upper' is its always-valid confidence sequence (delta "
               "method for the ratio of the two arms' means): a treatment is better once the band lies wholly "
               "above the red zero line, worse once wholly below (the other way round where lower is better).",
               unit="percentunit", w=24, h=9)
        .repeat("metric").repeat_direction("h").max_per_row(2).decimals(2)
        .thresholds(_thresholds("transparent", (0, BAD))).thresholds_style(_line())
        .with_target(_query("A", _ab("stream_eval_ab_lift"), "{{arm}} lift"))
        .with_target(_query("B", _ab("stream_eval_ab_lift_cs_lower"), "{{arm}} cs lower"))
        .with_target(_query("C", _ab("stream_eval_ab_lift_cs_upper"), "{{arm}} cs upper"))
        .override_by_regexp("/ lift$/", [DynamicConfigValue("custom.lineWidth", 2)])
    )


def _recommendation(recommendation: str) -> str:
    """1 where the worker recommends ``recommendation`` for the arm, per experiment and treatment (``arm``)."""
    return (f"(max by (experiment, arm) (stream_eval_ab_recommendation{{{EXP_ARM}, "
            f'recommendation="{recommendation}"}}) == 1)')


#: The recommendation per treatment as a number: 1 ship, 0 keep running, -1 rollback (each arm has one at a time).
RECOMMENDATION = (f"{_recommendation('ship')}\nor -{_recommendation('rollback')}\n"
                  f"or 0 * {_recommendation('keep running')}")


def recommendation_panel(panel_id: int) -> stat.Panel:
    return (
        _stat(panel_id, "Recommendation per treatment",
              "What to do with each treatment arm, as the worker decides it at every look: 'ship' when a goal "
              "metric (primary, else every metric that is no guardrail) is better after false-discovery control "
              "(e-BH over goal metrics x treatments) and every guardrail is shown non-inferior; 'rollback' as soon "
              "as a guardrail is breached (its confidence sequence wholly beyond the tolerated loss; the "
              "StreamEvalGuardrailBreached alert pages and Alertmanager calls the rollback webhook); else 'keep "
              "running'.", w=8)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .mappings([_mapping({"1": ("ship", GOOD), "0": ("keep running", WARN), "-1": ("rollback", BAD)})])
        .with_target(_query("A", RECOMMENDATION, "{{arm}}"))
    )


def _guardrail(series: str) -> str:
    return f"max by (experiment, arm, metric) ({series}{{{EXP_ARM}}})"


def guardrails_panel(panel_id: int) -> table.Panel:
    status = (f"{_guardrail('stream_eval_ab_guardrail_non_inferior')}\n"
              f"  - {_guardrail('stream_eval_ab_guardrail_breached')}")
    columns = {  # ref id: (expression, column name)
        "A": (status, "status"),
        "B": (_guardrail("stream_eval_ab_guardrail_margin"), "tolerated loss"),
        "C": (_guardrail("stream_eval_ab_guardrail_lower"), "cs lower"),
        "D": (_guardrail("stream_eval_ab_guardrail_upper"), "cs upper"),
        "E": (_guardrail("stream_eval_ab_guardrail_relative"), "on"),
    }
    panel = (
        table.Panel().id(panel_id).title("Guardrails: each treatment against the tolerated loss")
        .description(
            "One line per treatment arm and guardrail metric ([experiments.NAME] guardrails, e.g. ERR@10 = "
            "\"-1%\", GAUC = -0.005). 'tolerated loss' is on the relative lift when configured in %, else on the "
            "delta (column 'on': lift or delta); 'cs lower' .. 'cs upper' is the always-valid confidence sequence "
            "of that same quantity. status "
            "= within (non-inferior) when the sequence lies wholly on the good side of the tolerated loss, "
            "breached when wholly on the bad side (the treatment is then rolled back), else unproven (keep "
            "collecting).")
        .datasource(DATASOURCE).span(16).height(8).decimals(4)
    )
    return (_status_table(panel, columns, "status",
                          {"1": ("within", GOOD), "0": ("unproven", WARN), "-1": ("breached", BAD)})
            .override_by_name("on", [DynamicConfigValue("mappings", [_mapping({"1": ("lift", "text"),
                                                                               "0": ("delta", "text")})])]))


def guardrail_bounds_panel(panel_id: int) -> timeseries.Panel:
    dashed = {"fill": "dash", "dash": [10, 6]}
    return (
        _graph(panel_id, "Guardrails: confidence sequence and tolerated loss over time",
               "For each treatment arm and guardrail: the bounds of the always-valid confidence sequence (of the "
               "lift for a tolerance in %, else of the delta) and the tolerated loss (dashed). The sequence wholly "
               "on the good side of the dashed line: non-inferior; wholly beyond it: breached, rollback.", w=24,
               h=9)
        .with_target(_query("A", _guardrail("stream_eval_ab_guardrail_lower"), "{{arm}} {{metric}} cs lower"))
        .with_target(_query("B", _guardrail("stream_eval_ab_guardrail_upper"), "{{arm}} {{metric}} cs upper"))
        .with_target(_query("C", _guardrail("stream_eval_ab_guardrail_margin"), "{{arm}} {{metric}} tolerated"))
        .override_by_regexp("/ tolerated$/", [DynamicConfigValue("custom.lineStyle", dashed)])
    )


def p_value_panel(panel_id: int) -> timeseries.Panel:
    return (
        _graph(panel_id, "Always-valid p-value of the A/B delta",
               "The always-valid p-value of treatment - control, per metric (log scale). It can be checked at every "
               "look without inflating false positives; below the red line (0.05, i.e. confidence 0.95, the "
               "default) the confidence sequence excludes 0 and the decision is better or worse.")
        .max(1).scale_distribution(_log_scale())
        .thresholds(_thresholds("transparent", (0.05, BAD))).thresholds_style(_line())
        .with_target(_query("A", _ab("stream_eval_ab_p_value"), "{{arm}} {{metric}}"))
    )


def units_panel(panel_id: int) -> timeseries.Panel:
    return (
        _graph(panel_id, "Randomisation units per arm",
               "Distinct randomisation units (unit_id, e.g. users) seen in each arm since the experiment's first "
               "event. A/B inference is over units, not requests; the split between arms should follow the "
               "configured one (equal by default) - the SRM panels test that.")
        .decimals(0)
        .with_target(_query("A", f"sum by (experiment, arm) (stream_eval_ab_units{{{EXP_ARM}}})", "{{arm}}"))
    )


def srm_panels(ids: Iterator[int]) -> list[stat.Panel]:
    return [
        _stat(next(ids), "SRM p-value",
              "Sample-ratio-mismatch check: the always-valid p-value of the randomisation units' split between "
              "arms against the expected split (equal unless configured). Red below srm_alpha (0.001 by "
              "default): the assignment or the logging is broken, and the A/B results of this experiment should "
              "not be trusted until that is explained.")
        .decimals(4).thresholds(_thresholds(BAD, (0.001, GOOD)))
        .with_target(_query("A", f"max by (experiment) (stream_eval_srm_p_value{{{EXP}}})", "{{experiment}}")),
        _stat(next(ids), "Sample ratio mismatch",
              "1 (MISMATCH) when the sample-ratio test rejects the expected split at srm_alpha, else 0 (ok). "
              "A mismatch usually means units are lost or duplicated in one arm: check the assignment and the "
              "logging before reading any A/B result.")
        .mappings([_mapping({"0": ("ok", GOOD), "1": ("MISMATCH", BAD)})])
        .with_target(_query("A", f"max by (experiment) (stream_eval_srm_mismatch{{{EXP}}})", "{{experiment}}")),
        _stat(next(ids), "Units seen in a second arm",
              "Randomisation units that appeared in a second arm of the experiment, counted since its first event "
              "(each stays counted in the arm it was first seen in). Should stay 0: a unit in two arms means the "
              "assignment is not sticky or unit_id is not the randomisation unit.")
        .decimals(0).thresholds(_thresholds(GOOD, (1, WARN)))
        .with_target(_query("A", f"sum by (experiment) (stream_eval_ab_unit_conflicts_total{{{EXP}}})",
                            "{{experiment}}")),
    ]


def gsb_panels(ids: Iterator[int]) -> list[timeseries.Panel]:
    by = "sum by (experiment, arm, source)"
    score = (f'({by} (stream_eval_gsb_total{{{EXP}, verdict="good"}})\n'
             f'  - {by} (stream_eval_gsb_total{{{EXP}, verdict="bad"}}))\n'
             f"  / ({by} (stream_eval_gsb_total{{{EXP}}}) > 0)")
    return [
        _graph(next(ids), "GSB verdicts",
               "Good / same / bad verdicts of each treatment (arm; none for judgments) against the control, per "
               "source, counted since the "
               "worker's state began and summed over workers. judgment: human side-by-side judgments; metric: "
               "queries served by both arms, compared on their mean gsb_metric (nDCG@10 by default); "
               "interleaving: interleaved requests, credited to the team whose items were relevant.", w=8)
        .decimals(0)
        .with_target(_query("A", f"sum by (experiment, arm, source, verdict) (stream_eval_gsb_total{{{EXP}}})",
                            "{{arm}} {{source}} {{verdict}}")),
        _graph(next(ids), "GSB score",
               "(good - bad) / (good + same + bad), from -1 (treatment always worse) to 1 (always better). "
               "'total': every verdict so far, from the counts summed over workers. '5m' / '1h': the verdicts "
               "given in the last 5 minutes / 1 hour of event time, as each worker exports them (exact with one "
               "worker; with several, each line covers that worker's partitions).", w=8)
        .min(-1).max(1).decimals(3)
        .with_target(_query("A", score, "{{arm}} {{source}} total"))
        .with_target(_query("B", f'stream_eval_gsb_score{{{EXP}, window!="total"}}',
                            "{{arm}} {{source}} {{window}} {{instance}}")),
        _graph(next(ids), "GSB p-value",
               "Always-valid p-value of the sign test on the GSB verdicts (ties left out), per source (log "
               "scale): below the red line (0.05) the treatment wins or loses more often than chance allows, "
               "however often you have looked.", w=8)
        .max(1).scale_distribution(_log_scale())
        .thresholds(_thresholds("transparent", (0.05, BAD))).thresholds_style(_line())
        .with_target(_query("A", f"max by (experiment, arm, source) (stream_eval_gsb_p_value{{{EXP}}})",
                                  "{{arm}} {{source}}")),
    ]


def health_panels(ids: Iterator[int]) -> list[timeseries.Panel]:
    delay = "sum by (le) (rate(stream_eval_feedback_delay_seconds_bucket[$__rate_interval]))"
    return [
        _graph(next(ids), "Events by status",
               "Input events per second by type (ranking, feedback, judgment) and status. ok: applied. invalid: "
               "rejected by validation (sent to the dead-letters topic with the reason). late: feedback that arrived "
               "after its request was finalised, or a ranking after its own finalisation point (left out of the "
               "metrics). duplicate: seen before. orphan: feedback whose ranking never arrived. "
               "Also: event label values folded into experiment=\"__other__\" because a label had too many values.",
               unit="eps")
        .with_target(_query("A", "sum by (type, status) (rate(stream_eval_events_total[$__rate_interval]))",
                            "{{type}} {{status}}"))
        .with_target(_query("B", "sum by (label) (rate(stream_eval_label_overflow_total[$__rate_interval]))",
                            "{{label}} folded into __other__"))
        .override_by_regexp("/ (invalid|orphan)$/", [DynamicConfigValue("color", {"mode": "fixed",
                                                                                   "fixedColor": "red"})]),
        _graph(next(ids), "Throughput",
               "Events read per second (all types and statuses, over workers), and requests finalised per second "
               "per arm (their metrics enter the cumulative means). Finalisation follows event time: it stalls "
               "when the input does.", unit="suffix:/s")
        .with_target(_query("A", "sum(rate(stream_eval_events_total[$__rate_interval]))", "events in"))
        .with_target(_query("B", f"sum by (experiment, arm) (rate(stream_eval_requests_total{{{EXP_ARM}}}"
                                 "[$__rate_interval]))", "finalised {{arm}}")),
        _graph(next(ids), "Feedback delay",
               "Quantiles of the time between serving a ranking and its feedback (feedback ts - serve ts, in event "
               "time) of applied feedback. Feedback later than the attribution window is not applied, so the p99 "
               "approaching that window means clicks are being lost.", unit="s")
        .with_target(_query("A", f"histogram_quantile(0.5, {delay})", "p50"))
        .with_target(_query("B", f"histogram_quantile(0.9, {delay})", "p90"))
        .with_target(_query("C", f"histogram_quantile(0.99, {delay})", "p99")),
        _graph(next(ids), "Event-time lag",
               "Wall-clock time minus the event time that every partition has reached (the slowest worker's "
               "watermark). Grows when the input stops or a partition falls behind; requests finalise only as the "
               "watermark advances. Large by design when replaying old logs.", unit="s")
        .with_target(_query("A", "time() - min(stream_eval_watermark_seconds > 0)", "lag")),
    ]


def _segment_ab(series: str, selector: str = f'{EXP_METRIC}, arm=~"$arm", {SEGMENT}') -> str:
    """An exploratory A/B series per treatment, metric and segment value (max over the workers exporting it)."""
    return f"max by (experiment, arm, metric, {SEGMENT_BY}) ({series}{{{selector}}})"


def segment_panels(ids: Iterator[int]) -> list[Builder[Panel]]:
    """Per segment value (config ``segments``; README, "Segments"): traffic, per-arm means and the exploratory A/B
    rows. Exploratory: nothing here is an alert or a decision of the experiment."""
    by = f"sum by (experiment, arm, {SEGMENT_BY})"
    window = f'{EXP_ARM}, {SEGMENT}, metric=~"$metric", window="1h"'
    columns = {  # ref id: (series or expression, column name)
        "A": (_segment_ab("stream_eval_segment_ab_differs", f"{EXP}, {SEGMENT}"), "differs from the rest"),
        "B": (_segment_ab("stream_eval_segment_ab_delta", f"{EXP}, {SEGMENT}"), "delta"),
        "C": (_segment_ab("stream_eval_segment_ab_cs_lower", f"{EXP}, {SEGMENT}"), "cs lower"),
        "D": (_segment_ab("stream_eval_segment_ab_cs_upper", f"{EXP}, {SEGMENT}"), "cs upper"),
        "E": (_segment_ab("stream_eval_segment_ab_p_value", f"{EXP}, {SEGMENT}"), "p-value (always valid)"),
        "F": (_segment_ab("stream_eval_segment_ab_rest_delta", f"{EXP}, {SEGMENT}"), "delta - rest's delta"),
        "G": (_segment_ab("stream_eval_segment_ab_rest_p_value", f"{EXP}, {SEGMENT}"), "rest p-value"),
    }
    rows = (
        table.Panel().id(next(ids)).title("Segment rows: each treatment vs control within a segment value")
        .description(
            "Exploratory A/B rows: one line per treatment arm, metric and value of a segment field ($segment). A "
            "unit is in the value of its first request. 'delta' .. 'p-value' as in the decisions table, within the "
            "value, their decisions by e-BH over the experiment's segment rows only; 'delta - rest's delta' is the "
            "delta here minus the delta over every other unit, and 'differs from the rest' = yes when that "
            "difference is significant (always-valid test, e-BH). These rows never enter the experiment's "
            "decisions, recommendation or alerts: read them as where to look, not as results.")
        .datasource(DATASOURCE).span(24).height(8).decimals(4)
    )
    return [
        _graph(next(ids), "Requests per segment value",
               "Finalised requests per second of each value of the segment fields ($segment) per arm, summed over "
               "workers. __missing__: rankings without the field in their attributes; __other__: values beyond the "
               "segment_cap tracked (or not listed in segment_values), whose rate is also shown per field.",
               unit="suffix:/s")
        .with_target(_query("A", f"{by} (rate(stream_eval_segment_requests_total{{{EXP_ARM}, {SEGMENT}}}"
                                 "[$__rate_interval]))", "{{segment_field}}={{segment_value}} {{arm}}"))
        .with_target(_query("B", f"sum by (segment_field) (rate(stream_eval_segment_overflow_total{{{SEGMENT}}}"
                                 "[$__rate_interval]))", "{{segment_field}} folded into __other__")),
        _graph(next(ids), "$metric per arm and segment value",
               "Mean of $metric per arm within each segment value ($segment), over the requests served in the "
               "last hour of event time (open requests' current values included), summed over workers first "
               "(sum of sums / sum of counts). 'cumulative': every finalised request of the value so far. Session "
               "measures (GAUC, QueriesPerSession, Reformulation) are not per segment. One panel per selected "
               "metric.", w=24, h=9)
        .repeat("metric").repeat_direction("h").max_per_row(2)
        .decimals(3).min(0)
        .with_target(_query("A", _ratio("stream_eval_segment_window_sum", "stream_eval_segment_window_count", window,
                                        f"experiment, arm, metric, {SEGMENT_BY}"),
                            "{{segment_field}}={{segment_value}} {{arm}} 1h"))
        .with_target(_query("B", _as_mean_names(_ratio("stream_eval_segment_metric_sum_total",
                                                       "stream_eval_segment_metric_count_total",
                                                       f"{EXP_ARM}, {SEGMENT}",
                                                       f"experiment, arm, metric, {SEGMENT_BY}")),
                            "{{segment_field}}={{segment_value}} {{arm}} cumulative"))
        .override_by_regexp("/ cumulative$/", [DynamicConfigValue("custom.lineWidth", 3)]),
        _status_table(rows, columns, "differs from the rest", {"1": ("yes", WARN), "0": ("no", NEUTRAL)},
                      keys=("experiment", "arm", "metric", "segment_field", "segment_value")),
        _graph(next(ids), "$metric within each segment value: treatment - control, with its confidence sequence",
               "Exploratory: each treatment arm minus control of $metric within each segment value ($segment), "
               "with the bounds of its always-valid confidence sequence, and the delta minus the rest of the "
               "experiment's (dashed). A segment whose band lies apart from the others' is where the effect "
               "differs; the experiment's decision stays the one of the A/B row above.", w=24, h=9)
        .thresholds(_thresholds("transparent", (0, BAD))).thresholds_style(_line())
        .with_target(_query("A", _segment_ab("stream_eval_segment_ab_delta"),
                            "{{arm}} {{segment_field}}={{segment_value}} delta"))
        .with_target(_query("B", _segment_ab("stream_eval_segment_ab_cs_lower"),
                            "{{arm}} {{segment_field}}={{segment_value}} cs lower"))
        .with_target(_query("C", _segment_ab("stream_eval_segment_ab_cs_upper"),
                            "{{arm}} {{segment_field}}={{segment_value}} cs upper"))
        .with_target(_query("D", _segment_ab("stream_eval_segment_ab_rest_delta"),
                            "{{arm}} {{segment_field}}={{segment_value}} vs rest"))
        .override_by_regexp("/ delta$/", [DynamicConfigValue("custom.lineWidth", 2)])
        .override_by_regexp("/ vs rest$/", [DynamicConfigValue("custom.lineStyle", {"fill": "dash",
                                                                                      "dash": [10, 6]})]),
    ]


def build() -> dash.Dashboard:
    ids = itertools.count(1)
    board = (
        dash.Dashboard("stream_eval").uid(DASHBOARD_UID).tags(["stream_eval"])
        .description("Live ranking quality, A/B decisions and pipeline health of stream_eval workers "
                     "(docs/contract.md §5, §6).")
        .refresh("30s").time("now-6h", "now").timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR)
        .annotation(  # Grafana's own annotations (what it adds to every dashboard), so the list is never empty
            dash.AnnotationQuery().name("Annotations & Alerts").built_in(1).type("dashboard").enable(True).hide(True)
            .datasource(DataSourceRef(type_val="grafana", uid="-- Grafana --")).icon_color("rgba(0, 211, 255, 1)"))
        .with_variable(
            dash.QueryVariable("experiment").label("experiment").datasource(DATASOURCE)
            .query("label_values(stream_eval_requests_total, experiment)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC))
        .with_variable(
            dash.QueryVariable("arm").label("arm").datasource(DATASOURCE)
            .query('label_values(stream_eval_requests_total{experiment=~"$experiment"}, arm)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*").current(ALL))
        .with_variable(
            dash.QueryVariable("metric").label("A/B metric").datasource(DATASOURCE)
            .query('label_values(stream_eval_ab_delta{experiment=~"$experiment"}, metric)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*").current(ALL))
        .with_variable(
            dash.QueryVariable("segment").label("segment field").datasource(DATASOURCE)
            .query('label_values(stream_eval_segment_requests_total{experiment=~"$experiment"}, segment_field)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*").current(ALL))
    )
    sections: list[tuple[str, Callable[[Iterator[int]], Sequence[Builder[Panel]]]]] = [
        ("Ranking quality per arm", quality_panels),
        ("Search behaviour per arm", behaviour_panels),
        ("A/B test of $experiment: treatment - control", lambda ids: [
            decisions_panel(next(ids)), delta_panel(next(ids)), p_value_panel(next(ids)), units_panel(next(ids))]),
        ("Guardrails and recommendation of $experiment", lambda ids: [
            recommendation_panel(next(ids)), guardrails_panel(next(ids)), guardrail_bounds_panel(next(ids)),
            lift_panel(next(ids))]),
        ("Sample ratio", srm_panels),
        ("Good / same / bad", gsb_panels),
        ("Segments of $experiment (exploratory)", segment_panels),
        ("Pipeline health", health_panels),
    ]
    for title, panels in sections:  # a row, then its panels (rows stay expanded: panels at the top level)
        board = board.with_row(dash.Row(title).id(next(ids)))
        for panel in panels(ids):
            board = board.with_panel(panel)
    return board


def render() -> str:
    """The dashboard's JSON text, exactly as checked in."""
    return JSONEncoder(sort_keys=True, indent=2, ensure_ascii=False).encode(build().build()) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the checked-in JSON is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.name} is out of date: run python3 deploy/grafana/build.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
