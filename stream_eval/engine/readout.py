"""What ``/metrics`` shows of the engine, read at one moment: an immutable :class:`Readout`.

The Prometheus collector (``export/prometheus.py``) formats a readout and never reads the engine itself. A
:class:`Reader` builds readouts from an engine, or from a worker's shares of its totals (``engine/shares.py``):
the counters of each share with its ``partition`` and ``generation`` labels, the rolling windows summed over the
shares, and what only the regroup stage's engine holds (sessions' and query GSB's sign tests, the A/B units).

Reading is done under the worker's lock (the engine must not change meanwhile) and takes a few milliseconds, most of
it in the A/B rows, which are computed over every randomisation unit (``Engine.ab``, ``Engine.srm``: O(units)). A
:class:`Reader` therefore keeps the A/B part of its last readout and reuses it while the ledger has not changed
(:meth:`UnitLedger.state_key <stream_eval.engine.ab.UnitLedger.state_key>`).

Keys are the label values of the exported series, in the order the collector names the labels; mappings are
never changed once a readout is built.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from stream_eval.engine.engine import Engine
from stream_eval.events.join import OVERFLOW
from stream_eval.metrics.gsb import VERDICTS, GsbCounts

Labels = tuple[str, ...]
#: A worker's shares of its totals: ``(partition, generation, engine)`` each (``StreamWorker.shares``).
Shares = Sequence[tuple[str, str, Engine]]
#: The fields of an A/B row that are exported, in this order in :attr:`Readout.ab`.
AB_FIELDS = ("delta", "ci_lower", "ci_upper", "cs_lower", "cs_upper", "p_value", "lift", "lift_cs_lower",
             "lift_cs_upper")
#: The fields of a segment A/B row that are exported, in this order in :attr:`AbReadout.segments`: an A/B row's, and
#: its comparison with the rest of the experiment (``differs`` 0/1).
SEGMENT_AB_FIELDS = (*AB_FIELDS, "rest_delta", "rest_p_value", "differs")


#: A guardrail's exported fields: its tolerated loss, the bounds of the sequence compared with it (the lift's for a
#: relative tolerance), breached 0/1 and non-inferior 0/1.
GUARDRAIL_FIELDS = ("margin", "lower", "upper", "breached", "non_inferior", "relative")


@dataclass(frozen=True, eq=False)
class AbReadout:
    """The A/B part of a readout: ``(experiment, metric, treatment)`` -> :data:`AB_FIELDS`; the guardrails and the
    recommendations; units per ``(experiment,
    arm)``; conflicts per ``(experiment,)``; ``(experiment,)`` -> (sequential SRM p-value, mismatch 0/1)."""

    ab: Mapping[Labels, tuple[float, ...]] = field(default_factory=dict)
    units: Mapping[Labels, float] = field(default_factory=dict)
    conflicts: Mapping[Labels, float] = field(default_factory=dict)
    srm: Mapping[Labels, tuple[float, float]] = field(default_factory=dict)
    #: ``(experiment, metric, treatment)`` of each guardrail -> :data:`GUARDRAIL_FIELDS`
    guardrails: Mapping[Labels, tuple[float, ...]] = field(default_factory=dict)
    #: ``(experiment, treatment, recommendation)`` -> 1, for each treatment's recommendation
    recommendations: Mapping[Labels, float] = field(default_factory=dict)
    #: CUPED: ``(experiment, metric, treatment)`` -> (variance reduction, pre-period imbalance p-value) of its rows
    cuped: Mapping[Labels, tuple[float, float]] = field(default_factory=dict)
    #: CUPED: ``(experiment,)`` -> 1 when some metric's pre-period means differ between the arms, else 0
    pre_imbalance: Mapping[Labels, float] = field(default_factory=dict)
    #: segments: ``(experiment, metric, treatment, segment field, segment value)`` -> :data:`SEGMENT_AB_FIELDS`
    segments: Mapping[Labels, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Readout:
    """Everything the collector exports but the broker's health, as it stood at :attr:`taken`.

    ``extra`` below is ``(partition, generation)`` of a share, or ``()`` for an engine read without shares.

    * ``requests[experiment, arm, *extra]``; ``metric_sum`` / ``metric_count[experiment, arm, metric, *extra]``
      (``metric="AUC"``: weighted sum of session AUCs and sum of their weights);
    * ``window[experiment, arm, metric, window]`` -> (sum, count), summed over the shares;
    * ``gsb[experiment, source, verdict, *extra]``; ``gsb_score[experiment, source, window]`` (``"total"`` and the
      rolling windows' labels); ``gsb_p_value[experiment, source]``;
    * ``ab``: :class:`AbReadout`;
    * ``events[type, status, *extra]``; ``invalid[type, code, *extra]`` (the invalid events by reason);
      ``label_overflow[label,]``; ``state_overflow[kind, *extra]``;
    * segments (config ``segments``): ``segment_requests[experiment, arm, field, value, *extra]``;
      ``segment_sum`` / ``segment_count[experiment, arm, field, value, metric, *extra]``;
      ``segment_window[experiment, arm, field, value, metric, window]`` -> (sum, count), summed over the shares;
      ``segment_overflow[field, *extra]`` (requests whose value was folded into ``__other__`` when counted): every
      value tracked (up to ``segment_cap`` per field, or those listed), since a counter's series cannot follow the
      values the report shows as their traffic changes;
    * ``delays[extra]`` -> (cumulative buckets ``(upper bound text, count)``, sum of delays);
    * ``watermark``: NaN until event time is finite; ``taken``: ``time.monotonic()`` when read.
    """

    requests: Mapping[Labels, float] = field(default_factory=dict)
    metric_sum: Mapping[Labels, float] = field(default_factory=dict)
    metric_count: Mapping[Labels, float] = field(default_factory=dict)
    window: Mapping[Labels, tuple[float, float]] = field(default_factory=dict)
    gsb: Mapping[Labels, float] = field(default_factory=dict)
    gsb_score: Mapping[Labels, float] = field(default_factory=dict)
    gsb_p_value: Mapping[Labels, float] = field(default_factory=dict)
    ab: AbReadout = field(default_factory=AbReadout)
    events: Mapping[Labels, float] = field(default_factory=dict)
    invalid: Mapping[Labels, float] = field(default_factory=dict)
    label_overflow: Mapping[Labels, float] = field(default_factory=dict)
    state_overflow: Mapping[Labels, float] = field(default_factory=dict)
    delays: Mapping[Labels, tuple[list[tuple[str, float]], float]] = field(default_factory=dict)
    segment_requests: Mapping[Labels, float] = field(default_factory=dict)
    segment_sum: Mapping[Labels, float] = field(default_factory=dict)
    segment_count: Mapping[Labels, float] = field(default_factory=dict)
    segment_window: Mapping[Labels, tuple[float, float]] = field(default_factory=dict)
    segment_overflow: Mapping[Labels, float] = field(default_factory=dict)
    watermark: float = math.nan
    taken: float = -math.inf


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


class Reader:
    """Builds :class:`Readout` objects; keeps the A/B part of the last one until the ledger changes.

    >>> from stream_eval.config import Config
    >>> reader = Reader()
    >>> readout = reader.read(Engine(Config()))
    >>> readout.watermark, dict(readout.requests)
    (nan, {})
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # (engine, ledger, its key, the A/B part read then); engine and ledger are kept to compare identities
        self._ab: tuple[Engine, object, tuple[int, ...], AbReadout] | None = None

    def read(self, engine: Engine, shares: Shares | None = None, open_requests: bool = True) -> Readout:
        """Read ``engine`` (without ``shares``: its counters, unlabelled), or a worker's ``shares`` with ``engine``
        what its regroup stage partitions hold (``StreamWorker.stage_view``: the A/B rows and units, sign tests,
        watermark, label overflow). ``open_requests`` False: the live windows' open requests are not re-evaluated
        first, they count with their values when last evaluated (``RollingWindows.snapshot``).
        Call it while nothing changes the engines (under the worker's lock)."""
        taken = self.clock()
        requests: dict[Labels, float] = {}
        metric_sum: dict[Labels, float] = {}
        metric_count: dict[Labels, float] = {}
        gsb: dict[Labels, float] = {}
        events: dict[Labels, float] = {}
        invalid: dict[Labels, float] = {}
        state_overflow: dict[Labels, float] = {}
        delays: dict[Labels, tuple[list[tuple[str, float]], float]] = {}
        window: dict[Labels, tuple[float, float]] = {}  # summed over the shares
        verdicts: dict[Labels, GsbCounts] = {}
        segment_requests: dict[Labels, float] = {}
        segment_sum: dict[Labels, float] = {}
        segment_count: dict[Labels, float] = {}
        segment_window: dict[Labels, tuple[float, float]] = {}  # summed over the shares
        segment_overflow: dict[Labels, float] = {}
        every: Shares = [("", "", engine)] if shares is None else shares
        for partition, generation, share in every:
            extra: Labels = () if shares is None else (partition, generation)
            if share.windows is not None and open_requests:  # once, first (its sums below are read without): the
                share.windows.sync()  # open requests it takes in may be of a group new to the engine
            subtopics = share.with_subtopics
            names = [(j, spec.name) for j, spec in enumerate(share.specs)
                     if not spec.needs_subtopics or subtopics]
            for (experiment, arm), stats in zip(share.group_keys, share.groups, strict=True):
                requests[experiment, arm, *extra] = float(stats.requests)
                total, count = stats.moments.total.tolist(), stats.moments.count.tolist()
                for j, name in names:
                    metric_sum[experiment, arm, name, *extra] = total[j]
                    metric_count[experiment, arm, name, *extra] = float(count[j])
                metric_sum[experiment, arm, "AUC", *extra] = float(stats.gauc.total[0])
                metric_count[experiment, arm, "AUC", *extra] = float(stats.gauc.weight[0])
            per_request = [(j, name) for j, name in names if not share.specs[j].per_session]
            if share.segment_fields:
                for segment_field, n in share.segment_overflow(shown=False).items():
                    segment_overflow[segment_field, *extra] = float(n)
            for segment, stats in zip(share.segment_keys, share.segment_groups, strict=True):
                segment_requests[(*segment, *extra)] = float(stats.requests)
                total, count = stats.moments.total.tolist(), stats.moments.count.tolist()
                for j, name in per_request:
                    segment_sum[(*segment, name, *extra)] = total[j]
                    segment_count[(*segment, name, *extra)] = float(count[j])
            for (experiment, treatment, source), counts in share.gsb.totals(share.arms_of).items():
                for verdict in VERDICTS:
                    gsb[experiment, treatment, source, verdict, *extra] = float(getattr(counts, verdict))
            for (kind, status), n in share.counts.items():
                if kind != OVERFLOW:
                    events[kind, status, *extra] = float(n)
            for reason, n in share.invalid_reasons.items():  # "kind: code"
                kind, _, code = reason.partition(": ")
                invalid[kind, code, *extra] = float(n)
            # state beyond its bounds (README, "Bounded state"): every kind, zero included
            state_overflow[("session", *extra)] = float(share.sessions.overflow)
            state_overflow[("query", *extra)] = float(share.gsb.overflow)
            state_overflow[("waiting_feedback", *extra)] = float(share.counts[OVERFLOW, "waiting_feedback"])
            if share.delays is not None:
                bounds = [f"{b:g}" for b in share.delays.bounds.tolist()] + ["+Inf"]
                delays[extra] = (list(zip(bounds, [float(c) for c in share.delays.cumulative()], strict=True)),
                                 share.delays.total)
            if share.windows is not None:
                for key, (total, count) in share.windows.snapshot(sync=False).items():
                    before = window.get(key, (0.0, 0.0))
                    window[key] = (before[0] + total, before[1] + count)
                for labels, counts in share.windows.verdicts().items():
                    verdicts[labels] = verdicts.get(labels, GsbCounts()) + counts
                for segment_key, (total, count) in share.windows.segment_snapshot(sync=False).items():
                    before = segment_window.get(segment_key, (0.0, 0.0))
                    segment_window[segment_key] = (before[0] + total, before[1] + count)
        if shares is None:
            state_overflow[("unit",)] = float(engine.ledger.overflow)
        for partition, generation, share in shares or ():
            if partition.startswith("regroup"):  # the A/B units' overflow belongs to the stage partitions' shares
                state_overflow[("unit", partition, generation)] = float(share.ledger.overflow)
        gsb_score: dict[Labels, float] = {}
        gsb_p_value: dict[Labels, float] = {}
        for row in engine.gsb_rows():
            gsb_labels = (row["experiment"], row["treatment"] or "", row["source"])
            gsb_score[(*gsb_labels, "total")] = _number(row["score"])
            gsb_p_value[gsb_labels] = _number(row["p_value"])
        for given, counts in verdicts.items():
            gsb_score[given] = counts.score
        return Readout(
            requests=requests, metric_sum=metric_sum, metric_count=metric_count, window=window, gsb=gsb,
            gsb_score=gsb_score, gsb_p_value=gsb_p_value, ab=self._read_ab(engine), events=events, invalid=invalid,
            label_overflow={(label,): float(n) for label, n in engine.labels.overflow.items()},
            state_overflow=state_overflow, delays=delays, segment_requests=segment_requests, segment_sum=segment_sum,
            segment_count=segment_count, segment_window=segment_window, segment_overflow=segment_overflow,
            watermark=engine.watermark if math.isfinite(engine.watermark) else math.nan, taken=taken,
        )

    def _read_ab(self, engine: Engine) -> AbReadout:
        """The A/B rows, units, conflicts and SRM checks: the last ones while the ledger is unchanged."""
        ledger = engine.ledger
        key = (int(engine.with_subtopics > 0), *ledger.state_key())  # alpha-nDCG rows appear with subtopics
        cached = self._ab
        if cached is not None and cached[0] is engine and cached[1] is ledger and cached[2] == key:
            return cached[3]
        results = engine.ab_results()  # (once for the rows, the recommendations and the SRM checks)
        rows = engine.ab(results)
        ab: dict[Labels, tuple[float, ...]] = {
            (row["experiment"], row["metric"], row["treatment"]): tuple(_number(row[k]) for k in AB_FIELDS)
            for row in rows}
        guardrails: dict[Labels, tuple[float, ...]] = {}
        for row in rows:
            if row["guardrail"]:
                bounds = ("lift_cs_lower", "lift_cs_upper") if row["margin_relative"] else ("cs_lower", "cs_upper")
                guardrails[row["experiment"], row["metric"], row["treatment"]] = (
                    row["margin"], _number(row[bounds[0]]), _number(row[bounds[1]]), float(row["breached"]),
                    float(row["non_inferior"]), float(row["margin_relative"]))
        recommendations: dict[Labels, float] = {
            (r["experiment"], r["treatment"], r["recommendation"]): 1.0 for r in engine.experiments(results)}
        compared = engine.config.compares  # (the traffic outside any experiment is tracked for CUPED, not shown)
        units: dict[Labels, float] = {(experiment, arm): float(n) for experiment, arms in ledger.units().items()
                                      if compared(experiment) for arm, n in arms.items()}
        conflicts: dict[Labels, float] = {(experiment,): float(n) for experiment, n in ledger.conflicts().items()
                                          if compared(experiment)}
        srm_rows = engine.srm(results)
        srm: dict[Labels, tuple[float, float]] = {
            (row["experiment"],): (_number(row["sequential_p_value"]), float(row["mismatch"])) for row in srm_rows}
        cuped: dict[Labels, tuple[float, float]] = {
            (row["experiment"], row["metric"], row["treatment"]): (_number(row["variance_reduction"]),
                                                                   _number(row["pre_p_value"]))
            for row in rows if row["cuped"]}
        pre_imbalance: dict[Labels, float] = {
            (row["experiment"],): float(bool(row["pre_imbalance"])) for row in srm_rows if "pre_imbalance" in row}
        segments: dict[Labels, tuple[float, ...]] = {
            (row["experiment"], row["metric"], row["treatment"], row["segment"]["field"], row["segment"]["value"]):
            tuple(_number(row[k]) for k in SEGMENT_AB_FIELDS) for row in engine.segment_ab()}
        part = AbReadout(ab=ab, units=units, conflicts=conflicts, srm=srm, guardrails=guardrails,
                         recommendations=recommendations, cuped=cuped, pre_imbalance=pre_imbalance, segments=segments)
        self._ab = (engine, ledger, key, part)
        return part
