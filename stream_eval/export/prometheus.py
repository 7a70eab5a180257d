"""Prometheus export (docs/contract.md §5): a collector of readouts of the engine (``engine/readout.py``), and the
HTTP endpoint.

Every mean comes with its sum and count, so that several workers aggregate exactly in PromQL
(``sum(..._sum) / sum(..._count)``). Series:

* ``stream_eval_requests_total{experiment,arm}``: finalised requests.
* ``stream_eval_metric_sum_total`` / ``stream_eval_metric_count_total{experiment,arm,metric}``: sums and counts
  of finalised per-request values (``metric`` = ``RR``, ``AP``, ``nDCG@10``, ...), and for ``metric="AUC"`` the
  weighted sum of the session AUCs that enter GAUC and the sum of their weights (``gauc_weight``), so that
  ``sum / count`` is the GAUC.
* ``stream_eval_window_sum`` / ``_count`` / ``_mean{experiment,arm,metric,window}``: the rolling event-time windows
  of :mod:`stream_eval.engine.windows` (``metric`` = ``MRR``, ``MAP``, ``nDCG@10``, ..., ``GAUC``).
* ``stream_eval_gsb_total{experiment,arm,source,verdict}`` (``arm``: the treatment compared with the control; none
  for judgments, which name no arm); ``stream_eval_gsb_score{experiment,arm,source,window}`` with
  ``window="total"`` for every verdict so far and the rolling window labels (``5m``, ``1h``) for the verdicts
  given in that much event time.
* ``stream_eval_ab_delta`` / ``_ci_lower`` / ``_ci_upper`` / ``_cs_lower`` / ``_cs_upper`` / ``_lift`` /
  ``_lift_cs_lower`` / ``_lift_cs_upper`` / ``_p_value
  {experiment,metric,arm}``: treatment (``arm``) - control over randomisation units, its fixed-sample interval,
  its always-valid confidence sequence and p-value (``Engine.ab``); ``stream_eval_ab_units{experiment,arm}``,
  ``stream_eval_ab_unit_conflicts_total{experiment}``, ``stream_eval_srm_p_value`` / ``_mismatch{experiment}``,
  ``stream_eval_gsb_p_value{experiment,arm,source}``; the guardrails' ``stream_eval_ab_guardrail_margin`` /
  ``_lower`` / ``_upper`` / ``_breached`` / ``_non_inferior{experiment,metric,arm}`` and
  ``stream_eval_ab_recommendation{experiment,arm,recommendation}`` = 1; for CUPED experiments
  ``stream_eval_ab_variance_reduction`` / ``_pre_p_value{experiment,metric,arm}`` and
  ``stream_eval_pre_imbalance{experiment}`` (1 = the arms' pre-period means differ); with segments, the A/B rows per
  segment value ``stream_eval_segment_ab_delta`` ... ``_lift_cs_upper``, ``_rest_delta``, ``_rest_p_value`` and
  ``_differs{experiment,metric,arm,segment_field,segment_value}`` (exploratory: series of their own, which the alerts
  and dashboards of the experiment's rows do not read). The A/B units live on the worker that runs the regroup stage
  (``engine/regroup.py``): only it exports these (cumulative since each experiment's first event).
* ``stream_eval_events_total{type,status}``, ``stream_eval_invalid_events_total{type,code}`` (the invalid ones
  by reason), ``stream_eval_feedback_delay_seconds`` (histogram),
  ``stream_eval_watermark_seconds``, and ``stream_eval_label_overflow_total{label}``: event label values folded
  into ``__other__`` (docs/contract.md §5: overflow is counted); ``stream_eval_overflow_total{kind}``: requests or
  feedback beyond a bound on state (``session``, ``query``, ``unit``, ``waiting_feedback``; README, "Bounded state").
* ``stream_eval_broker_up`` (1 while the Kafka broker answers the worker) and
  ``stream_eval_broker_errors_total{operation}``: broker errors and stalls met by the worker, per operation
  (``startup``, ``fetch``, ``produce``, ``flush``, ``checkpoint``, ``commit``; ``stream/backoff.py``).
* ``stream_eval_delivery_info{mode}`` = 1: how the worker makes its results exactly-once, ``transactions`` or
  ``fenced-log`` (``--delivery auto`` chooses by the broker; none before it has chosen): :class:`InfoCollector`.

A worker's counters (requests, metric sums and counts, GSB verdicts, events, overflow, the delay histogram) are
exported per share of its totals, with the labels ``partition`` (input partition, or ``regroup`` for the regroup
stage's) and ``generation`` (one ownership of it): a share moves between workers with its partition
(``engine/shares.py``), so each series only grows and ``sum by`` over the labels of docs/contract.md §5 is exact.

Counters never decrease: each is exported as the largest value this collector has exported for its series. (GSB
interleaving verdicts are resolved against the arms known at scrape time; an arm appearing later could otherwise
shrink a count.) Undefined values (a mean of nothing) are NaN.

Thread safety: scrapes run in the HTTP server's thread. Give the collector the lock that the worker holds while it
processes a batch; a readout is read under it, and the families are built outside it. A worker also calls
:meth:`EngineCollector.refresh` between batches, so that a scrape shows a readout at most ``max_age`` old without
waiting for the batch in progress (and the A/B rows, O(units), are read again only when the units changed).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, cast
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString as _untyped_go_float

from stream_eval.config import ConfigError
from stream_eval.engine.engine import Engine
from stream_eval.engine.readout import SEGMENT_AB_FIELDS, Labels, Reader, Readout, Shares

log = logging.getLogger("stream_eval.export")

#: A sample value as prometheus_client writes it (``+Inf``, ``NaN``, Go's exponents), which Go's ParseFloat reads.
floatToGoString = cast(Callable[[float], str], _untyped_go_float)

#: The share of ``refresh_every`` after which :meth:`EngineCollector.refresh_soon` takes a readout, and the share of
#: the worker's time its readouts may take at most (a large state makes each readout long).
_SOON = 0.25
#: The share of the last :data:`_SOON` of ``refresh_every`` that the process worked (CPU time) from which
#: :meth:`EngineCollector.refresh_soon` does not wait for that long after the latest readout: the end of a backlog
#: worked through, not a trickle of records.
_BUSY = 0.5


class BrokerStatus(Protocol):
    """What the collector reads of the worker's broker health (``stream.backoff.BrokerHealth``)."""

    def snapshot(self) -> tuple[bool, dict[str, int]]:
        """``(broker up, errors per operation)``."""
        ...
class InfoCollector(Collector):
    """One series ``name{label="<value>"} 1`` for the value ``read()`` gives at each scrape (none while ``None``)."""

    def __init__(self, name: str, doc: str, label: str, read: Callable[[], str | None],
                 registry: CollectorRegistry | None = None) -> None:
        self.name, self.doc, self.label, self.read = name, doc, label, read
        if registry is not None:
            registry.register(self)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.doc, labels=[self.label])
        value = self.read()
        if value is not None:
            family.add_metric([value], 1.0)
        yield family


class CountsCollector(Collector):
    """A counter ``name_total`` with a series per key of the counts ``read()`` gives at each scrape (label values)."""

    def __init__(self, name: str, doc: str, labels: list[str], read: Callable[[], Mapping[Labels, float]],
                 registry: CollectorRegistry | None = None) -> None:
        self.name, self.doc, self.labels, self.read = name, doc, labels, read
        if registry is not None:
            registry.register(self)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for key, value in sorted(self.read().items()):
            family.add_metric(list(key), value)
        yield family


class LineCache:
    """The start of each exported line (``name{label="value",...} ``) by sample name and label values, kept from
    one scrape to the next: a scrape of an unchanged set of series formats no labels. Lines not used by a scrape
    are forgotten at the next (:meth:`turn`)."""

    def __init__(self) -> None:
        self._previous: dict[tuple[str, Labels], str] = {}
        self._current: dict[tuple[str, Labels], str] = {}

    def turn(self) -> None:
        """A new scrape: what the last one did not use goes."""
        self._previous, self._current = self._current, {}

    def start(self, name: str, labels: Sequence[str], order: Sequence[int], key: Labels) -> str:
        """``name{...} `` for the label values ``key`` of ``labels``, written in the label order ``order``."""
        line = self._previous.get((name, key))
        if line is None:
            pairs = ",".join([f'{labels[i]}="{_label_value(key[i])}"' for i in order])
            line = f"{name}{{{pairs}}} " if pairs else f"{name} "
        self._current[name, key] = line
        return line


class Rows(Metric):
    """A counter or gauge family held as its rows ``(label values, value)``: /metrics writes them directly
    (:meth:`text`, through a :class:`LineCache`), and the samples prometheus_client reads (its own export, tests)
    are made when asked for."""

    def __init__(self, name: str, doc: str, kind: str, labels: Sequence[str], rows: list[tuple[Labels, float]],
                 lines: LineCache) -> None:
        super().__init__(name, doc, kind)
        self.labels, self.rows, self._lines = tuple(labels), rows, lines
        self._text: str | None = None

    @property
    def sample_name(self) -> str:
        return self.name + "_total" if self.type == "counter" else self.name

    @property
    def samples(self) -> list[Sample]:
        name = self.sample_name
        return [Sample(name, dict(zip(self.labels, key, strict=True)), value) for key, value in self.rows]

    @samples.setter
    def samples(self, _: object) -> None:
        """(Metric's constructor sets an empty list: the rows are the samples)"""

    def text(self) -> str:
        """The family in the text format, as :func:`exposition` writes every family (written once: a family is
        made for one readout, and scrapes of the same readout export it again)."""
        if self._text is not None:
            return self._text
        name = self.sample_name
        order = sorted(range(len(self.labels)), key=self.labels.__getitem__)
        start, labels = self._lines.start, self.labels
        out = [_head(name, self.documentation, self.type)]
        out += [f"{start(name, labels, order, key)}{floatToGoString(value)}\n" for key, value in self.rows]
        self._text = "".join(out)
        return self._text

    def _restricted_metric(self, names: set[str]) -> Metric | None:
        """The family when ``?name[]=`` asks for it (prometheus_client's ``restricted_registry``), else None: its
        samples all have one name, so none is made to be filtered."""
        return self if self.rows and self.sample_name in names else None


class EngineCollector(Collector):
    """Exports a :class:`~stream_eval.engine.readout.Readout` of an engine (or of a worker's shares) per scrape.

    Args:
        engine: The engine; ``engine.windows`` (:class:`~stream_eval.engine.windows.RollingWindows`) and
            ``engine.delays`` (:class:`~stream_eval.engine.delays.FeedbackDelays`) are exported when attached.
        registry: Registered there when given (never the global default registry unless passed explicitly).
        lock: Held by the worker while it changes the engines; the collector takes it to read a consistent state.
        broker: The worker's broker health, exported when given (read at every scrape).
        shares: A worker's shares of the totals, ``(partition, generation, engine)`` each (``StreamWorker.shares``):
            the counters are read from each and labelled ``partition`` (an input partition, or ``regroup``,
            ``regroup-1``, ... for the regroup stage partitions' shares) and ``generation`` (one ownership of it);
            the windows are summed over them. ``engine`` (or a callable giving it) then holds what the worker's
            stage partitions hold (``StreamWorker.stage_view``).
        refresh_every: Seconds between two readouts that :meth:`refresh` takes (the worker calls it between
            batches); 0 (default): it takes none.
        max_age: Seconds a readout may be old when a scrape shows it (without taking ``lock``); an older one (the
            worker in a long batch or a rebalance) makes the scrape read the engine itself, under ``lock``.
            0 (default): every scrape reads the engine.
        max_wait: Seconds such a scrape waits for ``lock`` before it shows the latest readout after all, older
            than ``max_age`` (a busy worker takes the lock back batch after batch, and a waiting scrape could
            otherwise wait for seconds); None (default): it waits until it has the lock. Without any readout yet
            it always waits.
        watched_for: :meth:`refresh` and :meth:`refresh_soon` take readouts while the last two scrapes came at most
            this many seconds apart and the latest at most this long ago (inf, default: always). Otherwise nobody
            looks closely (no scrape, or Prometheus every 15 s): the worker takes none between its batches, and a
            scrape reads the engine itself (``max_age``), or, when it cannot have the lock within ``max_wait``, asks
            for one that the next :meth:`refresh` takes.
        open_every: Seconds between two of :meth:`refresh`'s readouts that re-evaluate the open requests in the live
            windows (``RollingWindows.sync``); its others show them as last evaluated, as their finalised values
            and every counter are up to date. The readouts of a scrape, of :meth:`refresh_soon` and of :meth:`take`
            always re-evaluate them. 0 (default): every readout does.

    >>> from prometheus_client import CollectorRegistry
    >>> from stream_eval.config import Config
    >>> registry = CollectorRegistry()
    >>> collector = EngineCollector(Engine(Config()), registry)
    >>> registry.get_sample_value("stream_eval_watermark_seconds")
    nan
    """

    def __init__(
        self, engine: Engine | Callable[[], Engine], registry: CollectorRegistry | None = None,
        lock: threading.Lock | None = None,
        broker: BrokerStatus | None = None, shares: Callable[[], Shares] | None = None,
        refresh_every: float = 0.0, max_age: float = 0.0, max_wait: float | None = None,
        clock: Callable[[], float] = time.monotonic, cpu_clock: Callable[[], float] = time.process_time,
        watched_for: float = math.inf, open_every: float = 0.0,
    ) -> None:
        self._engine = engine
        self.broker = broker
        self.lock = lock
        self.shares = shares
        self.refresh_every = refresh_every
        self.max_age = max_age
        self.max_wait = max_wait
        self.watched_for = watched_for
        self.open_every = open_every
        self._open_read = -math.inf  # (clock) when a readout last re-evaluated the open requests
        self._scraped = self._scraped_before = -math.inf  # (clock) when the last two scrapes asked for a readout
        self._wanted = False  # a scrape found the latest readout too old and could not read the engine itself
        self.clock = clock
        self.cpu_clock = cpu_clock
        self._marks: deque[tuple[float, float]] = deque()  # (clock, CPU time) at refresh_soon's calls
        self._reader = Reader(clock)
        self._readout: Readout | None = None  # the latest readout (replaced whole, never changed)
        self._refresh_failed = False
        self._read_seconds = 0.0  # how long the latest readout took to read
        self._scraping = threading.Lock()  # one scrape at a time updates the counters' high-water marks
        self._high: dict[tuple[str, Labels], float] = {}
        self._lines = LineCache()
        self._exported: tuple[Readout, list[Metric]] | None = None  # the latest readout exported, and its families
        if registry is not None:
            registry.register(self)

    @property
    def engine(self) -> Engine:
        """The engine read for everything that is not a share (the A/B units, watermark, label overflow)."""
        engine = self._engine
        return engine() if callable(engine) else engine

    def _locked(self) -> AbstractContextManager[object]:
        return self.lock if self.lock is not None else nullcontext()

    def _read(self, open_requests: bool = True) -> Readout:
        """A readout of the engine now (the caller holds the lock); kept as the latest. ``open_requests``: the live
        windows' open requests re-evaluated first."""
        started = time.perf_counter()
        if open_requests:
            self._open_read = self.clock()
        readout = self._reader.read(self.engine, None if self.shares is None else self.shares(), open_requests)
        self._readout, self._wanted = readout, False
        self._read_seconds = time.perf_counter() - started
        return readout

    def take(self) -> bool:
        """A readout now (under the lock), scraped or not: the worker's first, so that a scrape never waits for the
        first batches to end. True when it took one."""
        return self._refresh_after(0.0, always=True)

    def refresh(self) -> None:
        """Between the worker's batches: read the engine (under the lock) when the latest readout is
        :attr:`spacing` old and the worker is :attr:`watched`, or at once when a scrape asked for one (nothing to do
        when ``refresh_every`` is 0); the open requests re-evaluated once ``open_every`` has passed."""
        self._refresh_after(0.0 if self._wanted else self.spacing,
                            open_requests=self.clock() - self._open_read >= self.open_every)

    @property
    def spacing(self) -> float:
        """Seconds between two periodic readouts: ``refresh_every``, or :attr:`paced` when that is longer."""
        return max(self.refresh_every, self.paced)

    @property
    def paced(self) -> float:
        """The last readout's own time divided by :data:`_SOON`: readouts no closer together than this take at most a
        quarter of the worker's time (a large state, A/B units by the million)."""
        return self._read_seconds / _SOON

    @property
    def watched(self) -> bool:
        """Whether the last two scrapes came within ``watched_for`` of each other and of now (readouts are taken
        between batches), or one asked for a readout."""
        within = self.watched_for
        return within == math.inf or self._wanted or (self._scraped - self._scraped_before <= within
                                                      and self.clock() - self._scraped <= within)

    def refresh_soon(self, settled: bool = True) -> bool:
        """Between the worker's batches, when it has just started counting, gone idle after new work (``settled``),
        or taken new work under live traffic: a readout now, unless the latest is younger than :data:`_SOON` of
        ``refresh_every`` (at most four a second; not waited for when the process worked :data:`_BUSY` of that time
        until now: the end of a backlog shows at once), or than the last readout's own time divided by :data:`_SOON`
        (these readouts take at most a quarter of the worker's time). It re-evaluates the live windows' open
        requests when the worker has settled, or was not busy; a busy worker's new work (the start of a backlog,
        before the worker finds it is behind) leaves them as :meth:`refresh` does, until ``open_every`` has passed.
        True when it took one, or when none is wanted (no scrape within ``watched_for``); False when it is due
        later."""
        if not self.watched:
            return True
        now, cpu, spacing, marks = self.clock(), self.cpu_clock(), self.refresh_every * _SOON, self._marks
        while len(marks) > 1 and marks[1][0] <= now - spacing:  # the latest call at least ``spacing`` ago first
            marks.popleft()
        busy = bool(marks) and cpu - marks[0][1] >= _BUSY * (now - marks[0][0])
        marks.append((now, cpu))
        open_requests = settled or not busy or now - self._open_read >= self.open_every
        return self._refresh_after(max(0.0 if busy else spacing, self.paced), open_requests=open_requests)

    def _refresh_after(self, age: float, always: bool = False, open_requests: bool = True) -> bool:
        readout = self._readout
        if not always and (self.refresh_every <= 0 or not self.watched
                           or (readout is not None and self.clock() - readout.taken < age)):
            return False
        try:
            with self._locked():
                self._read(open_requests)
        except Exception:  # never stops the worker: scrapes then read the engine themselves (and fail there)
            if not self._refresh_failed:
                log.exception("reading what /metrics exports failed (logged once)")
            self._refresh_failed = True
            return False
        return True

    def readout(self) -> Readout:
        """What a scrape shows: the latest readout if at most ``max_age`` old (or, when readouts take long, the last
        one's own time divided by :data:`_SOON`; ``max_age`` 0: never), else one read now under the lock (or, when the
        lock is not free within ``max_wait``, the latest after all, having asked the worker for one)."""
        readout = self._readout
        now = self.clock()
        self._scraped_before, self._scraped = self._scraped, now
        max_age = self.max_age and max(self.max_age, self.paced)  # (0: every scrape reads)
        if readout is None or now - readout.taken > max_age:
            lock = self.lock
            if lock is None:
                return self._read()
            self._wanted = True  # (taken by the worker's next refresh when this scrape cannot have the lock)
            if not lock.acquire(timeout=-1 if readout is None or self.max_wait is None else self.max_wait):
                latest = self._readout  # (the worker may have taken one meanwhile)
                assert latest is not None  # (without one, it waited for the lock)
                return latest
            try:
                readout = self._read()
            finally:
                lock.release()
        return readout

    # -- families ---------------------------------------------------------------------------------------
    def _counter(self, name: str, doc: str, labels: list[str], values: Mapping[Labels, float]) -> Rows:
        rows = []
        for key, value in sorted(values.items()):
            high = self._high.get((name, key), 0.0)
            if value > high:
                high = value
            self._seen[name, key] = high
            rows.append((key, high))
        return Rows(name, doc, "counter", labels, rows, self._lines)

    def _gauge(self, name: str, doc: str, labels: list[str], values: Mapping[Labels, float]) -> Rows:
        return Rows(name, doc, "gauge", labels, sorted(values.items()), self._lines)

    def describe(self) -> Iterator[Metric]:
        """The families without samples (registration checks names without reading the engine)."""
        yield from self._families(Readout())
        yield from self._broker_families({}, {})

    def collect(self) -> Iterator[Metric]:
        readout = self.readout()
        broker_up: dict[Labels, float] = {}
        broker_errors: dict[Labels, float] = {}
        if self.broker is not None:  # read at every scrape: an outage shows at once
            up, errors = self.broker.snapshot()
            broker_up[()] = 1.0 if up else 0.0
            broker_errors = {(operation,): float(n) for operation, n in errors.items()}
        with self._scraping:
            cached = self._exported
            if cached is not None and cached[0] is readout:  # a scrape of the same readout: its families again
                self._seen = self._high
                families = cached[1]
            else:
                self._seen = {}
                self._lines.turn()
                families = list(self._families(readout))
                self._exported = (readout, families)
            families = [*families, *self._broker_families(broker_up, broker_errors)]
            self._high = self._seen  # series no longer exported (a partition given up) are forgotten
        yield from families

    def _segment_families(self, s: Readout, extra: list[str]) -> Iterator[Metric]:
        """The series per segment value (config ``segments``): the group's labels and ``segment_field``,
        ``segment_value``."""
        segment = ["experiment", "arm", "segment_field", "segment_value"]
        metric = [*segment, "metric", *extra]
        yield self._counter("stream_eval_segment_requests", "Finalised requests of a segment value.",
                            [*segment, *extra], s.segment_requests)
        yield self._counter("stream_eval_segment_metric_sum", "Sum of finalised per-request values of a segment "
                            "value.", metric, s.segment_sum)
        yield self._counter("stream_eval_segment_metric_count", "Number of finalised per-request values of a segment "
                            "value.", metric, s.segment_count)
        yield from self._window_families("stream_eval_segment_window", " of a segment value", [*segment, "metric"],
                                         s.segment_window)
        yield self._counter("stream_eval_segment_overflow", "Finalised requests whose segment value was folded into "
                            "__other__ (beyond max_segment_values per field).", ["segment_field", *extra],
                            s.segment_overflow)

    def _window_families(self, name: str, of: str, labels: list[str],
                         window: Mapping[Labels, tuple[float, float]]) -> Iterator[Metric]:
        """``NAME_sum``, ``NAME_count`` and ``NAME_mean`` of rolling windows' ``(sum, count)`` per labels and window."""
        labels = [*labels, "window"]
        yield self._gauge(f"{name}_sum", f"Sum of per-request values{of} (open requests' current values included) in "
                          "a rolling event-time window.", labels, {k: v[0] for k, v in window.items()})
        yield self._gauge(f"{name}_count", f"Number of per-request values{of} in a rolling event-time window.", labels,
                          {k: v[1] for k, v in window.items()})
        yield self._gauge(f"{name}_mean", f"Mean of a metric{of} in a rolling event-time window.", labels,
                          {k: v[0] / v[1] if v[1] > 0 else math.nan for k, v in window.items()})

    def _families(self, s: Readout) -> Iterator[Metric]:
        """The families of a readout (those of the broker's health apart: they are read at every scrape)."""
        extra = [] if self.shares is None else ["partition", "generation"]
        group, metric = ["experiment", "arm", *extra], ["experiment", "arm", "metric", *extra]
        yield self._counter("stream_eval_requests", "Finalised requests.", group, s.requests)
        yield self._counter("stream_eval_metric_sum", "Sum of finalised per-request values (AUC: weighted sum of "
                            "session AUCs).", metric, s.metric_sum)
        yield self._counter("stream_eval_metric_count", "Number of finalised per-request values (AUC: sum of "
                            "session weights).", metric, s.metric_count)
        yield from self._window_families("stream_eval_window", "", ["experiment", "arm", "metric"], s.window)
        if s.segment_requests or s.segment_window or s.segment_overflow:
            yield from self._segment_families(s, extra)
        yield self._counter("stream_eval_gsb", "GSB verdicts, treatment (arm; none for judgments) vs control.",
                            ["experiment", "arm", "source", "verdict", *extra], s.gsb)
        yield self._gauge("stream_eval_gsb_score", "GSB score (good - bad) / (good + same + bad); window=total for "
                          "all verdicts.", ["experiment", "arm", "source", "window"], s.gsb_score)
        ab = ["experiment", "metric", "arm"]
        for i, (name, doc) in enumerate(_AB_SERIES):
            yield self._gauge(f"stream_eval_ab_{name}", doc, ab, {k: v[i] for k, v in s.ab.ab.items()})
        for i, (name, doc) in enumerate(_SEGMENT_AB_SERIES):  # (series of their own: alerts never read them)
            yield self._gauge(f"stream_eval_segment_ab_{name}", f"{doc} Within a segment value (exploratory).",
                              [*ab, "segment_field", "segment_value"], {k: v[i] for k, v in s.ab.segments.items()})
        for i, (name, doc) in enumerate((
            ("stream_eval_ab_guardrail_margin", "A guardrail's tolerated loss (on the lift when given in %, else on "
             "the delta)."),
            ("stream_eval_ab_guardrail_lower", "Lower bound of the always-valid confidence sequence a guardrail's "
             "margin is compared with (the lift's for a relative margin)."),
            ("stream_eval_ab_guardrail_upper", "Upper bound of that confidence sequence."),
            ("stream_eval_ab_guardrail_breached", "1 when the treatment is worse than the guardrail tolerates (the "
             "sequence wholly on the bad side of the margin)."),
            ("stream_eval_ab_guardrail_non_inferior", "1 when the treatment is shown within the guardrail's "
             "tolerance (the sequence wholly on the good side of the margin)."),
            ("stream_eval_ab_guardrail_relative", "1 when the guardrail's margin was given in % (margin, lower and "
             "upper are then on the relative lift: -0.01 = -1 %), 0 when it is on the delta."),
        )):
            yield self._gauge(name, doc, ab, {k: v[i] for k, v in s.ab.guardrails.items()})
        yield self._gauge("stream_eval_ab_recommendation", "1 for a treatment's recommendation: ship, rollback or "
                          "keep running.", ["experiment", "arm", "recommendation"], s.ab.recommendations)
        yield self._gauge("stream_eval_ab_units", "Randomisation units of an arm in the A/B statistics.",
                          ["experiment", "arm"], s.ab.units)
        yield self._counter("stream_eval_ab_unit_conflicts", "Units seen in a second arm (kept in their first).",
                            ["experiment"], s.ab.conflicts)
        yield self._gauge("stream_eval_srm_p_value", "Always-valid p-value of the sample-ratio check (units per "
                          "arm against the expected split).", ["experiment"], {k: v[0] for k, v in s.ab.srm.items()})
        yield self._gauge("stream_eval_srm_mismatch", "1 when the sample ratio mismatches (p-value below "
                          "srm_alpha).", ["experiment"], {k: v[1] for k, v in s.ab.srm.items()})
        yield self._gauge("stream_eval_ab_variance_reduction", "CUPED: 1 - the adjusted variance of the A/B delta "
                          "over the unadjusted one.", ab, {k: v[0] for k, v in s.ab.cuped.items()})
        yield self._gauge("stream_eval_ab_pre_p_value", "CUPED: always-valid p-value of a difference between the "
                          "arms' pre-period means (running minimum; small: the arms differed before the experiment).",
                          ab, {k: v[1] for k, v in s.ab.cuped.items()})
        yield self._gauge("stream_eval_pre_imbalance", "CUPED: 1 when some metric's pre-period means differ between "
                          "the arms (pre-period p-value below srm_alpha).", ["experiment"], s.ab.pre_imbalance)
        yield self._gauge("stream_eval_gsb_p_value", "Always-valid sign-test p-value of good against bad (ties "
                          "out).", ["experiment", "arm", "source"], s.gsb_p_value)
        yield self._counter("stream_eval_events", "Input events by type and status.", ["type", "status", *extra],
                            s.events)
        yield self._counter("stream_eval_invalid_events", "Invalid input events by type and reason code (the "
                            "dead letters' code header).", ["type", "code", *extra], s.invalid)
        yield self._counter("stream_eval_label_overflow", "Event label values folded into __other__.", ["label"],
                            s.label_overflow)
        yield self._counter("stream_eval_overflow", "Requests or feedback beyond a bound on state (kind: session = "
                            "scored as a session of its own, query = left out of metric GSB, unit = left out of A/B, "
                            "waiting_feedback = given up as an orphan).", ["kind", *extra], s.state_overflow)
        delay = HistogramMetricFamily("stream_eval_feedback_delay_seconds", "Feedback ts - serve ts of applied "
                                      "feedback.", labels=extra)
        for key, (buckets, total) in sorted(s.delays.items()):
            delay.add_metric(list(key), buckets, total)
        yield delay
        watermark = GaugeMetricFamily("stream_eval_watermark_seconds", "Event time reached by every partition.")
        watermark.add_metric([], s.watermark)
        yield watermark

    def _broker_families(self, broker_up: Mapping[Labels, float],
                         broker_errors: Mapping[Labels, float]) -> Iterator[Metric]:
        yield self._gauge("stream_eval_broker_up", "1 while the Kafka broker answers the worker, 0 during an outage "
                          "(and before it first answered).", [], broker_up)
        yield self._counter("stream_eval_broker_errors", "Kafka broker errors and stalls (no answer for "
                            "broker_stall seconds) met by the worker, by operation.", ["operation"], broker_errors)


#: The gauges of an A/B row (``stream_eval_ab_NAME``), in the order of ``readout.AB_FIELDS``.
_AB_SERIES = (
    ("delta", "Treatment - control of a mean, over randomisation units."),
    ("ci_lower", "Lower bound of the fixed-sample (cluster-robust) interval of the A/B delta: not valid when watched "
     "continuously."),
    ("ci_upper", "Upper bound of the fixed-sample (cluster-robust) interval of the A/B delta."),
    ("cs_lower", "Lower bound of the always-valid confidence sequence of the A/B delta (> 0: treatment better)."),
    ("cs_upper", "Upper bound of the always-valid confidence sequence of the A/B delta (< 0: treatment worse)."),
    ("p_value", "Always-valid p-value of the A/B delta (running minimum over looks)."),
    ("lift", "Relative lift of a mean: treatment / control - 1."),
    ("lift_cs_lower", "Lower bound of the always-valid confidence sequence of the relative lift."),
    ("lift_cs_upper", "Upper bound of the always-valid confidence sequence of the relative lift."),
)
#: ... and of a segment A/B row (``stream_eval_segment_ab_NAME``), in the order of ``readout.SEGMENT_AB_FIELDS``.
_SEGMENT_AB_SERIES = (
    *_AB_SERIES,
    ("rest_delta", "The A/B delta in the segment value minus the delta in the rest of the experiment."),
    ("rest_p_value", "Always-valid p-value of that difference (running minimum over looks)."),
    ("differs", "1 when the effect in the segment value differs from the rest's (after e-BH over the segment rows)."),
)
assert [name for name, _ in _SEGMENT_AB_SERIES] == list(SEGMENT_AB_FIELDS)


Readiness = Callable[[], tuple[bool, str]]
"""``() -> (ready, reason)``: what ``/readyz`` answers (e.g. :meth:`StreamWorker.readiness`)."""
_WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def probes_app(metrics: _WSGIApp, readiness: Readiness | None = None,
               report: Callable[[], dict[str, Any]] | None = None) -> _WSGIApp:
    """``/healthz`` and ``/readyz`` for Kubernetes probes in front of the ``/metrics`` app (every other path), and
    ``/report`` where ``report`` is given.

    ``/healthz``: 200 while the process serves HTTP. ``/readyz``: 200 when ``readiness()`` says ready, else 503;
    both with a short JSON body (``{"ready": false, "reason": "..."}``). Without ``readiness``, ready. ``/report``:
    ``report()`` as JSON (a worker's report of what it holds: README, "Control topic and /report").
    """
    import orjson

    def respond(start_response: Callable[..., Any], status: str, body: dict[str, Any]) -> list[bytes]:
        data = orjson.dumps(body) + b"\n"
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                                ("Cache-Control", "no-store")])
        return [data]

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            return respond(start_response, "200 OK", {"alive": True})
        if path == "/report" and report is not None:
            return respond(start_response, "200 OK", report())
        if path == "/readyz":
            try:
                ready, reason = readiness() if readiness is not None else (True, "no readiness check")
            except Exception as error:  # a probe answers; the reason says what went wrong
                ready, reason = False, f"readiness check failed: {type(error).__name__}"
            return respond(start_response, "200 OK" if ready else "503 Service Unavailable",
                           {"ready": ready, "reason": reason})
        return metrics(environ, start_response)

    return app


#: The Prometheus text format (0.0.4), which every Prometheus reads; /metrics always answers in it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Samples that the text format exports after their family, as gauges of their own (OpenMetrics ``_created``, gauge
#: histograms' ``_gsum`` / ``_gcount``), as prometheus_client does.
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


def _head(name: str, doc: str, kind: str) -> str:
    """A family's ``# HELP`` and ``# TYPE`` lines."""
    help_text = doc.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


def _label_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def exposition(families: Iterable[Metric]) -> bytes:
    """``families`` in the Prometheus text format (0.0.4): byte for byte what ``prometheus_client.generate_latest``
    writes for them (tests/test_prometheus.py compares the two), in a fraction of its time, which matters: a scrape
    of a worker's 10,000 series holds the interpreter the worker runs on. Metric and label names are written as
    given (the collectors here name them; UTF-8 names outside Prometheus' legacy charset are not quoted)."""
    out: list[str] = []
    append = out.append
    for family in families:
        if isinstance(family, Rows):
            append(family.text())
            continue
        name, kind = family.name, family.type
        typed = name + "_total" if kind == "counter" else name + "_info" if kind == "info" else name
        append(_head(typed, family.documentation, _TYPES.get(kind, kind)))
        extra: dict[str, list[str]] = {}
        for sample in family.samples:
            labels = ",".join([f'{k}="{_label_value(v)}"' for k, v in sorted(sample.labels.items())])
            line = f"{sample.name}{{{labels}}} {floatToGoString(sample.value)}" if labels else \
                f"{sample.name} {floatToGoString(sample.value)}"
            if sample.timestamp is not None:
                line += f" {int(float(sample.timestamp) * 1000):d}"
            suffix = sample.name[len(name):] if sample.name.startswith(name) else ""
            if suffix in _OM_SUFFIXES:
                extra.setdefault(suffix, []).append(line)
            else:
                append(line + "\n")
        for suffix, lines in sorted(extra.items()):
            append(_head(name + suffix, family.documentation, "gauge"))
            append("".join(f"{line}\n" for line in lines))
    return "".join(out).encode()


def metrics_app(registry: CollectorRegistry) -> _WSGIApp:
    """The ``/metrics`` WSGI app of ``registry``: GET answers :func:`exposition` (gzip-compressed, at a low level,
    when the client accepts it: Prometheus does), ``?name[]=`` restricting it to those series as with
    prometheus_client's app; OPTIONS answers what is allowed, other methods 405."""
    import gzip
    from urllib.parse import parse_qs

    from prometheus_client.exposition import gzip_accepted

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS,GET")])
            return [b""]
        if method != "GET":
            start_response("405 Method Not Allowed", [("Allow", "OPTIONS,GET")])
            return [f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode()]
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        source = registry.restricted_registry(names) if names else registry
        body = exposition(source.collect())
        headers = [("Content-Type", CONTENT_TYPE)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [body]

    return app


class MetricsServer:
    """A running ``/metrics``, ``/healthz`` and ``/readyz`` endpoint (a threading WSGI server in a daemon thread)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self.server = server
        self.thread = thread

    @property
    def port(self) -> int:
        """The port listened on (useful with port 0)."""
        return int(self.server.server_port)

    def stop(self) -> None:
        """Stop serving and release the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class MetricsAddressError(ConfigError):
    """The /metrics server cannot listen where it was asked to (a port in use, a host of no interface here)."""


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0",
                  readiness: Readiness | None = None,
                  report: Callable[[], dict[str, Any]] | None = None) -> MetricsServer:
    """Serve ``registry`` on ``http://host:port/metrics`` (any path but the others), with ``/healthz``,
    ``/readyz`` and ``/report`` (:func:`probes_app`); ``port=0`` picks a free port, ``host`` may be IPv4, IPv6 or a
    name."""
    import socket
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """No line per request on stderr (every scrape and probe would log one)."""

    try:
        family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except OSError as error:  # (socket.gaierror: a name that does not resolve)
        raise MetricsAddressError(f"--metrics-host {host!r}: {error}") from None

    class Server(ThreadingWSGIServer):
        address_family = family

    try:
        server = make_server(host, port, probes_app(metrics_app(registry), readiness, report), Server,
                             handler_class=Quiet)
    except OSError as error:  # in use, or an address of no interface here
        raise MetricsAddressError(f"/metrics on {host}:{port}: {error.strerror or error} (choose another "
                                  "--metrics-port or --metrics-host)") from None
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return MetricsServer(server, thread)
