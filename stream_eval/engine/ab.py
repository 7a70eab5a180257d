"""A/B inference over randomisation units, applied in event-time order so that every run agrees.

Each finalised request (not interleaved) is a *contribution* to its experiment's unit (``unit_id``, else
``session_id``, else ``request_id``): its per-request values add to the unit's sums and its value counts to
the unit's counts; a scored session adds ``weight * AUC`` and ``weight`` to the GAUC column of the unit of its
first request. An arm's mean is then a ratio of sums over its units, with the delta-method (cluster-robust)
variance (``stream_eval.stats``).

Contributions wait in :class:`UnitLedger` until event time passes their *key* (a request's finalisation
point, a session's close point) and are applied in (key, id) order. Replay and the streaming regroup stage
release them on the same event times, so units, their first arm, the sums (added in the same order) and the
looks are the same whatever the number of workers and however the input was partitioned.

*Looks* are taken every ``look_every`` of event time (on the boundaries, with exactly the contributions keyed
up to there) and when results are read: the always-valid p-value is the running minimum over looks and the
confidence sequence their running intersection, so a decision, once reached, stays (until the pair of arms
compared changes). A unit seen in a second arm is a *conflict*: counted once, kept in its first arm, and that
contribution is left out of the A/B statistics (it still counts in its arm's means elsewhere in the report).

An experiment keeps at most ``max_units`` units: a contribution of a unit first seen beyond that, in the (key, id)
order of application, is left out of the A/B statistics like a conflict and counted (``UnitLedger.overflow``);
so the bound, too, is the same whatever the number of workers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from stream_eval.config import ArmPair, Config
from stream_eval.stats import ArmSums, compare, decide, srm_test

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
#: Called with the event time of a look once it is taken (the replay's ``--ab-trace``).
LookListener = Callable[[float], None]


@dataclass
class _Running:
    """The running minimum p-value and intersection of confidence sequences of one experiment's rows."""

    pair: ArmPair
    p_value: Floats
    cs_lower: Floats
    cs_upper: Floats
    srm_p_value: float = 1.0


@dataclass
class _Experiment:
    """The units of one experiment: arm code, sums and counts per metric column (the last is GAUC)."""

    width: int
    index: dict[str, int] = field(default_factory=dict)
    arms: list[str] = field(default_factory=list)
    arm_code: dict[str, int] = field(default_factory=dict)
    unit_arm: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    y: Floats = field(default_factory=lambda: np.zeros((0, 0)))
    n: Floats = field(default_factory=lambda: np.zeros((0, 0)))
    conflicted: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    conflicts: int = 0
    version: int = 0
    limit: int = 2**62  # units kept (``max_units``); a new unit beyond it is not tracked
    overflow: int = 0  # contributions of units beyond ``limit``, left out

    def __post_init__(self) -> None:
        self.y = np.zeros((0, self.width))
        self.n = np.zeros((0, self.width))

    @property
    def size(self) -> int:
        return len(self.index)

    def rows_of(self, units: Sequence[str], arms: Sequence[str]) -> Ints:
        """Each contribution's unit row, -1 for a conflict (a unit seen before in another arm) or a unit beyond
        ``limit`` (not tracked: counted in ``overflow``, its arm not seen)."""
        index, arm_code = self.index, self.arm_code
        rows = np.empty(len(units), dtype=np.int64)
        for k, (unit, arm) in enumerate(zip(units, arms, strict=True)):
            row = index.get(unit)
            if row is None and len(index) >= self.limit:
                self.overflow += 1
                rows[k] = -1
                continue
            code = arm_code.get(arm)
            if code is None:
                code = arm_code[arm] = len(self.arms)
                self.arms.append(arm)
            if row is None:
                row = index[unit] = len(index)
                if row >= self.unit_arm.shape[0]:
                    self._grow(row + 1)
                self.unit_arm[row] = code
            elif self.unit_arm[row] != code:
                if not self.conflicted[row]:
                    self.conflicted[row] = True
                    self.conflicts += 1
                row = -1
            rows[k] = row
        return rows

    def _grow(self, size: int) -> None:
        old = self.unit_arm.shape[0]
        capacity = max(size, old + old // 2, 64)
        unit_arm = np.full(capacity, -1, dtype=np.int64)
        unit_arm[:old] = self.unit_arm
        conflicted = np.zeros(capacity, dtype=np.bool_)
        conflicted[:old] = self.conflicted
        y, n = np.zeros((capacity, self.width)), np.zeros((capacity, self.width))
        y[:old], n[:old] = self.y, self.n
        self.unit_arm, self.conflicted, self.y, self.n = unit_arm, conflicted, y, n

    def arm_sums(self, arm: str) -> ArmSums:
        code = self.arm_code.get(arm)
        size = self.size
        if code is None:
            return ArmSums.zeros(self.width)
        mine = self.unit_arm[:size] == code
        return ArmSums.of_units(self.y[:size][mine], self.n[:size][mine])

    def units_per_arm(self) -> dict[str, int]:
        counts = np.bincount(self.unit_arm[: self.size], minlength=len(self.arms))
        return {arm: int(counts[code]) for code, arm in enumerate(self.arms)}


class _Pending:
    """Contributions not applied yet, batch by batch (columns), until event time passes their keys."""

    __slots__ = ("keys", "ids", "experiments", "arms", "units", "y", "n")

    def __init__(self, keys: Floats, ids: list[str], experiments: list[str], arms: list[str], units: list[str],
                 y: Floats, n: Floats) -> None:
        self.keys, self.ids, self.experiments, self.arms, self.units, self.y, self.n = (
            keys, ids, experiments, arms, units, y, n)

    def take(self, rows: Ints) -> _Pending:
        picked = rows.tolist()
        return _Pending(self.keys[rows], [self.ids[k] for k in picked], [self.experiments[k] for k in picked],
                        [self.arms[k] for k in picked], [self.units[k] for k in picked], self.y[rows], self.n[rows])

    @staticmethod
    def join(parts: list[_Pending]) -> _Pending:
        if len(parts) == 1:
            return parts[0]
        return _Pending(np.concatenate([p.keys for p in parts]), [i for p in parts for i in p.ids],
                        [e for p in parts for e in p.experiments], [a for p in parts for a in p.arms],
                        [u for p in parts for u in p.units], np.concatenate([p.y for p in parts]),
                        np.concatenate([p.n for p in parts]))


@dataclass(frozen=True)
class AbRow:
    """Treatment - control of one mean, as the report and ``/metrics`` show it."""

    experiment: str
    control: str
    treatment: str
    metric: str
    delta: float
    ci_lower: float
    ci_upper: float
    cs_lower: float
    cs_upper: float
    p_value: float
    decision: str
    units_control: int
    units_treatment: int


@dataclass(frozen=True)
class SrmRow:
    experiment: str
    units: dict[str, int]
    expected: dict[str, float]
    chi2: float
    p_value: float
    sequential_p_value: float
    mismatch: bool


class UnitLedger:
    """Per experiment, the units of the A/B split and their sums, fed in event-time order.

    ``names`` are the per-request metric columns' report names (the means: ``MRR``, ``nDCG@10``, ...); the
    ledger adds a last column for ``GAUC``.
    """

    def __init__(self, config: Config, names: Sequence[str], gauc_name: str = "GAUC") -> None:
        self.config = config
        self.names = [*names, gauc_name]
        self.width = len(self.names)
        self.experiments: dict[str, _Experiment] = {}
        self._pending: list[_Pending] = []
        self._running: dict[str, _Running] = {}
        self.next_look = -math.inf  # the next look boundary (set by the first contribution)
        self.released = -math.inf  # event time up to which contributions were applied
        self.last_key = -math.inf  # the latest key of a contribution applied
        self.on_look: LookListener | None = None
        self.looks = 0  # looks taken (each may change the running p-values and sequences)
        # The regroup stage rebuilding from a snapshot: records the snapshot holds change nothing here.
        self.frozen = False

    # -- input ------------------------------------------------------------------------------------------
    def add_requests(self, keys: Floats, ids: list[str], experiments: list[str], arms: list[str],
                     units: list[str], values: Floats) -> None:
        """Finalised requests: finalisation points, request ids, labels, units and their per-request values
        (NaN = no value); ``values`` has one column per name except GAUC."""
        if not len(ids) or self.frozen:
            return
        present = ~np.isnan(values)
        y = np.zeros((len(ids), self.width))
        n = np.zeros((len(ids), self.width))
        y[:, :-1] = np.where(present, values, 0.0)
        n[:, :-1] = present
        self._pending.append(_Pending(np.asarray(keys, dtype=np.float64), ids, experiments, arms, units, y, n))

    def add_sessions(self, keys: Floats, ids: list[str], experiments: list[str], arms: list[str],
                     units: list[str], weighted_auc: Floats, weight: Floats, values: Floats | None = None,
                     counts: Floats | None = None) -> None:
        """Scored sessions with both classes: close points, session ids, labels, units, ``w * AUC`` and ``w``.
        ``values``, ``counts``: their session measures (one column per name except GAUC, NaN: none; engine.py) and
        how many per-request values each one sums; a session without both classes then comes with ``w`` 0."""
        if not len(ids) or self.frozen:
            return
        y = np.zeros((len(ids), self.width))
        n = np.zeros((len(ids), self.width))
        y[:, -1] = weighted_auc
        n[:, -1] = weight
        if values is not None and counts is not None:
            y[:, :-1] = np.where(np.isnan(values), 0.0, values)
            n[:, :-1] = counts
        # a session sorts after a request of the same key and id ("~" is after every printable ASCII id)
        self._pending.append(_Pending(np.asarray(keys, dtype=np.float64), [f"~{i}" for i in ids], experiments,
                                      arms, units, y, n))

    # -- event time ---------------------------------------------------------------------------------------
    def release(self, watermark: float, arms_for: Callable[[str, set[str]], ArmPair | None] | None = None) -> None:
        """Apply the contributions keyed at or before ``watermark``, taking the looks on the boundaries passed."""
        if self.frozen or not self._pending or watermark < min(float(p.keys.min()) for p in self._pending):
            return  # nothing due (the usual case for most watermarks): no copy of what waits
        pending = _Pending.join(self._pending)
        due = pending.keys <= watermark
        if not due.any():
            self._pending = [pending]
            return
        self._pending = [] if due.all() else [pending.take(np.flatnonzero(~due))]
        ready = pending if due.all() else pending.take(np.flatnonzero(due))
        order = np.lexsort((np.array(ready.ids, dtype=str), ready.keys))
        ready = ready.take(order)
        every = self.config.look_every
        if self.next_look == -math.inf:
            self.next_look = (math.floor(float(ready.keys[0]) / every) + 1) * every
        start = 0
        while start < len(ready.ids):
            if float(ready.keys[-1]) < self.next_look:
                self._apply(ready, start, len(ready.ids))
                break
            end = int(np.searchsorted(ready.keys, self.next_look, side="right"))
            self._apply(ready, start, end)
            start = end
            self.look(self.next_look)
            # the next boundary after the next contribution (no look where nothing changed)
            following = float(ready.keys[start]) if start < len(ready.ids) else self.next_look
            self.next_look = max(self.next_look + every, (math.floor(following / every) + 1) * every)
        self.released = max(self.released, watermark)
        self.last_key = max(self.last_key, float(ready.keys[-1]))

    def _apply(self, ready: _Pending, start: int, end: int) -> None:
        if start >= end:
            return
        names = set(ready.experiments[start:end])
        for name in sorted(names):
            picked = list(range(start, end)) if len(names) == 1 else [
                k for k in range(start, end) if ready.experiments[k] == name]
            experiment = self.experiments.get(name)
            if experiment is None:
                experiment = self.experiments[name] = _Experiment(self.width, limit=self.config.max_units)
            rows = experiment.rows_of([ready.units[k] for k in picked], [ready.arms[k] for k in picked])
            keep = rows >= 0
            index = np.array(picked, dtype=np.int64)[keep]
            np.add.at(experiment.y, rows[keep], ready.y[index])
            np.add.at(experiment.n, rows[keep], ready.n[index])
            experiment.version += 1

    # -- results ------------------------------------------------------------------------------------------
    def pair(self, name: str) -> ArmPair | None:
        experiment = self.experiments.get(name)
        return None if experiment is None else self.config.arms_for(name, set(experiment.arms))

    def _now(self, name: str) -> tuple[ArmPair, Any, SrmRow] | None:
        """The comparison and SRM test of an experiment as its units stand now (None: no pair of arms)."""
        experiment = self.experiments[name]
        pair = self.pair(name)
        if pair is None:
            return None
        comparison = compare(experiment.arm_sums(pair.control), experiment.arm_sums(pair.treatment),
                             confidence=self.config.confidence, sequential_n=self.config.sequential_n)
        units = experiment.units_per_arm()
        expected = self.config.split_for(name, set(units))
        counts = [float(units.get(arm, 0)) for arm in expected]
        test = srm_test(counts, list(expected.values()))
        srm = SrmRow(name, {arm: units.get(arm, 0) for arm in expected}, expected, test.chi2, test.p_value,
                     test.sequential_p_value, False)
        return pair, comparison, srm

    def look(self, ts: float) -> None:
        """Take a look: fold each experiment's current results into its running p-values and sequences."""
        for name in sorted(self.experiments):
            now = self._now(name)
            if now is None:
                continue
            self._running[name] = self._fold(name, *now)
        self.looks += 1
        if self.on_look is not None:
            self.on_look(ts)

    def _fold(self, name: str, pair: ArmPair, comparison: Any, srm: SrmRow) -> _Running:
        """The running state of an experiment with one more look folded in (not stored: see :meth:`look`). NaN
        (undefined at this look) leaves a bound or p-value as it was (``fmin``/``fmax`` skip NaN)."""
        before = self._running.get(name)
        if before is None or before.pair != pair:
            before = _Running(pair, np.ones(self.width), np.full(self.width, -math.inf), np.full(self.width, math.inf))
        srm_p = srm.sequential_p_value
        return _Running(pair, np.fmin(before.p_value, comparison.p_value),
                        np.fmax(before.cs_lower, comparison.cs_lower), np.fmin(before.cs_upper, comparison.cs_upper),
                        before.srm_p_value if math.isnan(srm_p) else min(before.srm_p_value, srm_p))

    def results(self, names: Sequence[str] | None = None) -> tuple[list[AbRow], list[SrmRow]]:
        """The ``ab`` and ``srm`` rows as of now (a look at the current state, not kept).

        ``names`` picks the metric columns shown (default: all).
        """
        ab: list[AbRow] = []
        srm_rows: list[SrmRow] = []
        shown = self.names if names is None else names
        columns = [(self.names.index(name), name) for name in shown if name in self.names]
        for name in sorted(self.experiments):
            now = self._now(name)
            if now is None:
                continue
            pair, comparison, srm = now
            running = self._fold(name, pair, comparison, srm)
            for j, metric in columns:
                lower, upper = _bound(running.cs_lower[j]), _bound(running.cs_upper[j])
                ab.append(AbRow(
                    name, pair.control, pair.treatment, metric, float(comparison.delta[j]),
                    float(comparison.ci_lower[j]), float(comparison.ci_upper[j]), lower, upper,
                    float(running.p_value[j]) if not math.isnan(float(comparison.p_value[j])) else math.nan,
                    _decision(lower, upper), int(comparison.units_control[j]), int(comparison.units_treatment[j]),
                ))
            srm_rows.append(SrmRow(srm.experiment, srm.units, srm.expected, srm.chi2, srm.p_value,
                                   running.srm_p_value, running.srm_p_value < self.config.srm_alpha))
        return ab, srm_rows

    def state_key(self) -> tuple[int, ...]:
        """Equal for two calls on this ledger when :meth:`results`, :meth:`units`, :meth:`conflicts` and
        :attr:`overflow` are unchanged between them (a cache of the A/B rows keys on it; ``export/prometheus.py``)."""
        return (self.looks, *(e.version for e in self.experiments.values()))

    @property
    def overflow(self) -> int:
        """Contributions left out of the A/B statistics because their unit was new beyond ``max_units``."""
        return sum(e.overflow for e in self.experiments.values())

    def conflicts(self) -> dict[str, int]:
        """Units seen in a second arm, per experiment."""
        return {name: e.conflicts for name, e in sorted(self.experiments.items())}

    def units(self) -> dict[str, dict[str, int]]:
        return {name: e.units_per_arm() for name, e in sorted(self.experiments.items())}


def _bound(value: float) -> float:
    value = float(value)
    return math.nan if math.isinf(value) else value


def _decision(lower: float, upper: float) -> str:
    if lower > upper:  # an empty intersection: the asymptotic sequence did not hold here
        return "inconclusive"
    return decide(lower, upper)
