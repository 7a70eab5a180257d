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

Units are kept in :data:`SHARDS` shards by a hash of the unit id (:func:`shard_of`). When streaming, each
partition of the regroup stage holds the shards of its number modulo the partitions (``engine/regroup.py``); in
replay one ledger holds them all. Each shard's sums are its units' in the order they were applied, so a shard's
sums are the same wherever it is held; an experiment's sums are its shards', added in shard order
(:class:`LookMerger`).

*Looks* are taken on the boundaries of ``look_every`` of event time: a contribution keyed ``k`` is in the look
on ``ceil(k / look_every) * look_every``, taken once event time reaches it (no look where nothing changed). The
shards changed since the previous look report their sums (:class:`ShardLook`) to the merger, which folds a
boundary once every ledger holding shards has reported up to it. The always-valid p-value is the running
minimum over looks and the confidence sequence their running intersection (from scratch when the control a
treatment is compared with changes); the rows read are those of the last look. Decisions are taken after
false-discovery control (e-BH on the e-values of the look, :func:`_decided`). An experiment
has one control and any number of treatments (A/B/n, ``Config.arms_for``): one comparison per treatment, each with
its running state, and one SRM test over all the arms. A unit seen in a second
arm is a *conflict*: counted once, kept in its first arm, and that contribution is left out of the A/B
statistics (it still counts in its arm's means elsewhere in the report).

With segments (``Config.segments``), each unit also has a value of each segment field, its first request's; each
shard reports its units' sums per value and arm at the look boundaries, and the merger keeps the rows per segment
value beside the experiment's (``engine/segment_ab.py``; README, "Segment A/B rows").

A shard of an experiment keeps at most ``max_units / SHARDS`` units (rounded up): a contribution of a unit first
seen beyond that, in the (key, id) order of application, is left out of the A/B statistics like a conflict and
counted (``UnitLedger.overflow``); so the bound, too, is the same whatever the number of workers.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from stream_eval.config import ArmPair, Arms, Config, ConfigError
from stream_eval.engine import compiled
from stream_eval.engine.compiled import add_rows, unit_history, unit_rows, unit_slots
from stream_eval.engine.segment_ab import (
    SegmentGroup,
    SegmentLook,
    SegmentRule,
    ShardUnits,
    families_rejected,
    fit_codes,
    segment_groups,
    segment_looks,
)
from stream_eval.engine.times import array_from_json, array_to_json, time_to_json
from stream_eval.metrics.specs import lower_is_better
from stream_eval.stats import (
    ArmSums,
    Comparison,
    Difference,
    PreSums,
    SrmTest,
    compare,
    decide,
    difference,
    srm_test,
)

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
#: Strings in an array of objects.
Strs = npt.NDArray[np.object_]
#: A request's value of each segment field (``Config.segments``; None: without the field in its ``attributes``).
Segments = tuple[str | None, ...]
#: Called with the event time of a look once it is taken (the replay's ``--ab-trace``).
LookListener = Callable[[float], None]
#: The A/B units of an experiment are kept in this many shards, by a hash of the unit id (:func:`shard_of`):
#: the partitions of the streaming regroup stage each hold some of them (at most this many partitions).
SHARDS = 64
#: A hashable key (:func:`distinct_keys`).
_Key = TypeVar("_Key")


def shard_of(unit: str) -> int:
    """The shard of an A/B unit (CRC-32 of its UTF-8 bytes, modulo :data:`SHARDS`): the same in every process.

    >>> shard_of("user-1"), shard_of("user-2")
    (20, 46)
    """
    return zlib.crc32(unit.encode("utf-8", "surrogatepass")) % SHARDS


def unit_hashes(units: Sequence[str]) -> npt.NDArray[np.uint64]:
    """The 64-bit hash that stands for each unit id in a ledger (BLAKE2b of its UTF-8 bytes): two ids with one hash
    (about one chance in 3 × 10^5 with 10 million units) would be one unit, in replay and streaming alike.

    >>> unit_hashes(["user-1"]).tolist()
    [9863422088627006618]
    """
    return unit_keys(units)[1]


def shards_of(keys: Sequence[str] | Strs) -> Ints:
    """:func:`shard_of` of each of ``keys``, as an array (compiled: ``compiled.unit_key_pieces``).

    >>> shards_of(["user-1", "user-2", "user-1"]).tolist()
    [20, 46, 20]
    """
    return compiled.unit_key_pieces(*_packed(keys), blake2b=False)[0] % SHARDS


def unit_keys(units: Sequence[str] | Strs) -> tuple[Ints, npt.NDArray[np.uint64]]:
    """:func:`shards_of` and :func:`unit_hashes` of ``units`` together (compiled: ``compiled.unit_key_pieces``).

    >>> [a.tolist() for a in unit_keys(["user-1", "user-2", "user-1"])]
    [[20, 46, 20], [9863422088627006618, 14441893227659663174, 9863422088627006618]]
    """
    crc, hashes = compiled.unit_key_pieces(*_packed(units))
    return crc % SHARDS, hashes


def _packed(keys: Sequence[str] | Strs) -> tuple[npt.NDArray[np.uint8], Ints]:
    """The UTF-8 bytes of ``keys`` one after the other (lone surrogates as themselves), and where each one ends."""
    joined = "".join(keys)
    if joined.isascii():
        data, lengths = joined.encode("ascii"), np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    else:
        encoded = [key.encode("utf-8", "surrogatepass") for key in keys]
        data, lengths = b"".join(encoded), np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    return np.frombuffer(data, dtype=np.uint8), np.cumsum(lengths)


def grouped(keys: Ints) -> tuple[Ints, Ints, list[int]]:
    """The positions of ``keys`` ordered by key (a stable sort: each key's positions ascending), the keys in that
    order, and the bounds of each key's run among them (from 0 to ``len(keys)``).

    >>> order, ordered, bounds = grouped(np.array([5, 2, 5, 2, 7]))
    >>> order.tolist(), ordered.tolist(), bounds
    ([1, 3, 0, 2, 4], [2, 2, 5, 5, 7], [0, 2, 4, 5])
    """
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    return order, ordered, [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), len(keys)]


def distinct_keys(keys: Sequence[_Key]) -> tuple[Sequence[_Key], Ints]:
    """``keys`` (hashable) without repeats, in order of first appearance, and where each key is among them.

    >>> distinct, at = distinct_keys(["b", "a", "b"])
    >>> list(distinct), at.tolist()
    (['b', 'a'], [0, 1, 0])
    """
    index = dict.fromkeys(keys, 0)
    if len(index) == len(keys):
        return keys, np.arange(len(keys))
    for i, key in enumerate(index):
        index[key] = i
    return list(index), np.fromiter(map(index.__getitem__, keys), dtype=np.int64, count=len(keys))


@dataclass
class _Running:
    """The running minimum p-value and intersection of confidence sequences of one treatment's rows."""

    pair: ArmPair
    p_value: Floats
    cs_lower: Floats
    cs_upper: Floats
    lift_cs_lower: Floats | None = None  # (None: as wide as can be, in a merger state written before lift)
    lift_cs_upper: Floats | None = None
    pre_p_value: Floats | None = None  # CUPED's pre-period imbalance check (None: 1, in a state written before)

    def to_json(self) -> list[Any]:
        cuped = () if self.pre_p_value is None else (self.pre_p_value,)  # (as before CUPED without it)
        return [[self.pair.control, self.pair.treatment], self.p_value.tolist(), self.cs_lower.tolist(),
                self.cs_upper.tolist(), *(None if v is None else v.tolist()
                                          for v in (self.lift_cs_lower, self.lift_cs_upper, *cuped))]

    @classmethod
    def from_json(cls, data: list[Any]) -> _Running:
        pair, p, lower, upper, *lifts = data
        return cls(ArmPair(*pair), _array(p), _array(lower), _array(upper), *map(_optional_array, lifts))


@dataclass
class _RunningExperiment:
    """An experiment's running state: each treatment's (:class:`_Running`, by treatment) and the SRM test's running
    minimum p-value over the arms ``srm_arms`` (None: not known, in a merger state written before A/B/n)."""

    pairs: dict[str, _Running]
    srm_p_value: float = 1.0
    srm_arms: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pairs": [r.to_json() for r in self.pairs.values()], "srm": self.srm_p_value,
                "srm_arms": None if self.srm_arms is None else list(self.srm_arms)}

    @classmethod
    def from_json(cls, data: dict[str, Any] | list[Any]) -> _RunningExperiment:
        if isinstance(data, list):  # written before A/B/n: one pair, its SRM p-value fifth
            pair, p, lower, upper, srm, *lifts = data
            running = _Running.from_json([pair, p, lower, upper, *lifts])
            return cls({running.pair.treatment: running}, float(srm))
        pairs = [_Running.from_json(entry) for entry in data["pairs"]]
        arms = data["srm_arms"]
        return cls({r.pair.treatment: r for r in pairs}, float(data["srm"]), None if arms is None else tuple(arms))


def _array(values: list[float]) -> Floats:
    return np.array(values, dtype=np.float64)


def _optional_array(values: list[float] | None) -> Floats | None:
    return None if values is None else _array(values)


@dataclass(frozen=True)
class _Look:
    """An experiment's comparisons at a look: each treatment's with the control, in the order of ``arms``."""

    arms: Arms
    comparisons: list[Comparison]
    srm: SrmRow
    requests: dict[str, Floats] | None = None  # per arm, its requests with a value of each metric column (None: a
    # shard's look written before 2026-12-04, without them)


@dataclass
class _Experiment:
    """The units of one experiment: arm code, sums and counts per metric column (the last is GAUC)."""

    width: int
    arms: list[str] = field(default_factory=list)
    arm_code: dict[str, int] = field(default_factory=dict)
    # The units, by the 64-bit hash of their id (unit_hashes): an open-addressing table of rows (slots: -1 empty),
    # and per row its hash, arm code, conflict flag, sums and counts. ~170 bytes a unit with 9 metric columns.
    slots: npt.NDArray[np.int32] = field(default_factory=lambda: np.full(64, -1, dtype=np.int32))
    unit_key: npt.NDArray[np.uint64] = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    unit_arm: npt.NDArray[np.int16] = field(default_factory=lambda: np.zeros(0, dtype=np.int16))
    y: Floats = field(default_factory=lambda: np.zeros((0, 0)))
    n: Floats = field(default_factory=lambda: np.zeros((0, 0)))
    conflicted: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    size: int = 0
    conflicts: int = 0
    version: int = 0
    limit: int = 2**62  # units kept (``max_units``); a new unit beyond it is not tracked
    overflow: int = 0  # contributions of units beyond ``limit``, left out
    # CUPED (``pre``): per row the unit's pre-period sums and counts, set when it entered (UnitLedger._covariates)
    pre: bool = False
    x: Floats = field(default_factory=lambda: np.zeros((0, 0)))
    q: Floats = field(default_factory=lambda: np.zeros((0, 0)))
    # segments (``segment_ab.py``): per row the code of the unit's value of each of ``fields`` segment fields (-1: not
    # set yet), into the tables of the values kept (per field, value -> code, in the order met)
    fields: int = 0
    segment: npt.NDArray[np.int16] = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int16))
    segment_codes: list[dict[str, int]] = field(default_factory=list)
    # per arm (``request_arms``, in the order met), the contributions with a value of each column, those of
    # conflicts and of units beyond ``limit`` included: the requests of an A/B row (sessions for GAUC), as the
    # ``groups`` count them, as of a look
    request_arms: list[str] = field(default_factory=list)
    requests: Floats = field(default_factory=lambda: np.zeros((0, 0)))
    counts_requests: bool = True  # False: restored from a snapshot written before 2026-12-04, which had no counts

    def __post_init__(self) -> None:
        self.requests = np.zeros((0, self.width))
        self.y = np.zeros((0, self.width))
        self.n = np.zeros((0, self.width))
        self.x = np.zeros((0, self.width))
        self.q = np.zeros((0, self.width))
        self.segment, self.segment_codes = fit_codes(self.segment, self.segment_codes, 0, self.fields)

    def holds(self, unit: str) -> bool:
        """Whether ``unit`` is one of the units kept."""
        return bool(np.isin(unit_hashes([unit]), self.unit_key[: self.size])[0])

    def rows_of(self, hashes: npt.NDArray[np.uint64], arm_of: Ints, arm_names: Sequence[str]
                ) -> tuple[Ints, npt.NDArray[np.bool_]]:
        """Each contribution's unit row (its unit by :func:`unit_hashes`, its arm ``arm_names[arm_of[k]]``), -1 for
        a conflict (a unit seen before in another arm) or a unit beyond ``limit`` (not tracked: counted in
        ``overflow``, its arm not seen); and whether its unit is tracked (a conflict's is)."""
        count = len(hashes)
        arm_code, known = self.arm_code, len(self.arms)
        # arms not seen before, in order of their first contribution: kept if a unit kept comes with them
        given, first = np.unique(arm_of, return_index=True)
        new = {arm_names[g]: 0 for g in given[np.argsort(first)].tolist() if arm_names[g] not in arm_code}
        new.update((arm, known + j) for j, arm in enumerate(new))
        codes = np.array([arm_code.get(arm, new.get(arm, -1)) for arm in arm_names], dtype=np.int64)[arm_of]
        rows = np.empty(count, dtype=np.int64)
        used = np.empty(count, dtype=np.bool_)
        before, done = self.size, 0
        while done < count:
            stop, self.size, overflow, conflicts = unit_rows(
                hashes[done:], codes[done:], self.slots, self.unit_key, self.unit_arm, self.conflicted, self.size,
                self.limit, rows[done:], used[done:])
            self.overflow += overflow
            self.conflicts += conflicts
            done += stop
            if done < count:
                self._grow(self.size + 1)
        if new:
            seen = set(codes[used].tolist())
            remap = np.arange(known + len(new), dtype=np.int16)
            for arm, code in new.items():
                if code in seen:
                    remap[code] = arm_code[arm] = len(self.arms)
                    self.arms.append(arm)
            self.unit_arm[before : self.size] = remap[self.unit_arm[before : self.size]]
        return rows, used

    def _grow(self, size: int) -> None:
        """Room for ``size`` units: rows grown by an eighth (little slack per unit), the table kept at most half
        full."""
        old = self.unit_key.shape[0]
        if size > old:
            capacity = max(size, old + old // 8, 64)
            unit_key = np.zeros(capacity, dtype=np.uint64)
            unit_arm = np.full(capacity, -1, dtype=np.int16)
            conflicted = np.zeros(capacity, dtype=np.bool_)
            y, n = np.zeros((capacity, self.width)), np.zeros((capacity, self.width))
            unit_key[:old], unit_arm[:old], conflicted[:old] = self.unit_key, self.unit_arm, self.conflicted
            y[:old], n[:old] = self.y, self.n
            self.unit_key, self.unit_arm, self.conflicted, self.y, self.n = unit_key, unit_arm, conflicted, y, n
            if self.pre:
                x, q = np.zeros((capacity, self.width)), np.zeros((capacity, self.width))
                x[: self.x.shape[0]], q[: self.q.shape[0]] = self.x, self.q
                self.x, self.q = x, q
            if self.fields:
                self.segment, self.segment_codes = fit_codes(self.segment, self.segment_codes, capacity, self.fields)
        slots = self.slots.shape[0]
        while 2 * size > slots:
            slots *= 2
        if slots != self.slots.shape[0]:
            self.slots = unit_slots(self.unit_key, self.size, slots)

    def look(self, name: str, shard: int) -> ShardLook:
        """This shard's look (its arms in order of first unit). Each arm's sums are its units' terms summed in unit
        order as they are made (``compiled.arm_sums``): bit for bit :meth:`ArmSums.of_units` of its units."""
        size = self.size
        unit_arm = self.unit_arm[:size]
        counts = np.bincount(unit_arm, minlength=len(self.arms))
        empty = np.zeros((0, self.width))
        pre = (self.x[:size], self.q[:size]) if self.pre else (empty, empty)
        by_arm = compiled.arm_sums(self.y[:size], self.n[:size], *pre, unit_arm, len(self.arms), self.pre)
        sums = [ArmSums.from_terms(by_arm[code]) for code in range(len(self.arms))]
        return ShardLook(name, shard, list(self.arms), sums, counts[: len(self.arms)].tolist(), self.conflicts,
                         self.overflow, dict(zip(self.request_arms, self.requests.copy(), strict=True))
                         if self.counts_requests else None)

    def count_requests(self, arm_names: Sequence[str], codes: Sequence[int], arm_of: Ints, positive: Floats,
                       picked: Ints) -> None:
        """Count contributions ``picked`` of arms ``arm_names[arm_of]``, among ``arm_names[codes]`` (``positive``: 1
        in each column where a contribution has a value, else 0)."""
        listed = self.request_arms
        rows = np.zeros(len(arm_names), dtype=np.int64)
        for code in codes:
            if arm_names[code] not in listed:
                listed.append(arm_names[code])
            rows[code] = listed.index(arm_names[code])
        if self.requests.shape[0] < len(listed):
            grown = np.zeros((len(listed), self.width))
            grown[: self.requests.shape[0]] = self.requests
            self.requests = grown
        add_rows(self.requests, rows[arm_of], positive, picked)

    def units_per_arm(self) -> dict[str, int]:
        counts = np.bincount(self.unit_arm[: self.size], minlength=len(self.arms))
        return {arm: int(counts[code]) for code, arm in enumerate(self.arms)}

    def units_of(self, name: str, shard: int) -> ShardUnits:
        """This shard's units as its segment looks read them (its arms in order of first unit)."""
        size = self.size
        return ShardUnits(name, shard, list(self.arms), self.unit_arm[:size], self.segment[:size], self.segment_codes,
                          self.y[:size], self.n[:size], self.x[:size] if self.pre else None,
                          self.q[:size] if self.pre else None)


#: Seconds of a day: CUPED's pre-period is kept per unit in buckets of a day of event time (of contribution keys).
DAY = 86400.0


def lookback_days(lookback: float) -> int:
    """Whole days of buckets before the day of a unit's entry that its pre-period spans (``cuped_lookback``, rounded
    up).

    >>> lookback_days(14 * 86400.0), lookback_days(3600.0)
    (14, 1)
    """
    return max(1, math.ceil(lookback / DAY - 1e-9))


@dataclass
class UnitHistory:
    """One shard's units' recent contributions, summed per day of their key, for CUPED's pre-period.

    Every contribution of a unit tracked in some experiment of the shard (whatever the experiment) adds to its
    bucket of the day; when the unit enters a CUPED experiment, the buckets of the ``cuped_lookback`` days before
    that day and of that day so far are its covariate (:func:`~stream_eval.engine.compiled.unit_history`). A ring of
    ``buckets`` days per unit (the longest lookback + 1); units idle for longer are dropped when room is needed
    (they can be in no window again, so when that happens changes no number). ``16 * buckets * width`` bytes a
    unit: 2.4 KB with 14 days and 10 metric columns."""

    width: int
    buckets: int
    slots: npt.NDArray[np.int32] = field(default_factory=lambda: np.full(64, -1, dtype=np.int32))
    unit_key: npt.NDArray[np.uint64] = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    day_tag: Ints = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    y: Floats = field(default_factory=lambda: np.zeros((0, 0, 0)))
    n: Floats = field(default_factory=lambda: np.zeros((0, 0, 0)))
    last_day: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    size: int = 0

    def __post_init__(self) -> None:
        if self.y.shape[1:] != (self.buckets, self.width):
            self.day_tag = np.zeros((0, self.buckets), dtype=np.int64)
            self.y = np.zeros((0, self.buckets, self.width))
            self.n = np.zeros((0, self.buckets, self.width))

    def apply(self, hashes: npt.NDArray[np.uint64], days: Ints, y: Floats, n: Floats, lookbacks: Ints,
              entries: Ints, count: int) -> tuple[Floats, Floats]:
        """Contributions in order (``entries[k]``: the index of the entry contribution ``k`` is, -1 none; ``count``
        entries): the entries' pre-period sums and counts."""
        out_x, out_q = np.zeros((count, self.width)), np.zeros((count, self.width))
        done, total = 0, len(hashes)
        while done < total:
            stop, self.size = unit_history(hashes[done:], days[done:], y[done:], n[done:], lookbacks[done:],
                                           entries[done:], self.slots, self.unit_key, self.day_tag, self.y, self.n,
                                           self.last_day, self.size, out_x, out_q)
            done += stop
            if done < total:
                self._make_room(int(days[done]))
        return out_x, out_q

    def _make_room(self, today: int) -> None:
        """Room for one more unit: the units idle since before every window are dropped when they are half or more,
        else the rows grow by an eighth when full; the table is kept at most half full."""
        size = self.size
        live = self.last_day[:size] >= today - (self.buckets - 1)
        kept = int(live.sum())
        if 2 * kept <= size:
            self._rows(np.flatnonzero(live), max(kept + kept // 8 + 1, 64))
        elif size + 1 > self.unit_key.shape[0]:
            old = self.unit_key.shape[0]
            self._rows(np.arange(size), max(size + 1, old + old // 8, 64))
        slots = 64
        while 2 * (self.size + 1) > slots:
            slots *= 2
        self.slots = unit_slots(self.unit_key, self.size, max(slots, self.slots.shape[0] if kept == size else 64))

    def _rows(self, keep: Ints, capacity: int) -> None:
        """The rows ``keep`` (in order) in arrays of ``capacity`` rows."""
        size = len(keep)
        unit_key = np.zeros(capacity, dtype=np.uint64)
        day_tag = np.full((capacity, self.buckets), -1, dtype=np.int64)
        y, n = np.zeros((capacity, self.buckets, self.width)), np.zeros((capacity, self.buckets, self.width))
        last_day = np.zeros(capacity, dtype=np.int64)
        unit_key[:size], day_tag[:size], y[:size], n[:size], last_day[:size] = (
            self.unit_key[keep], self.day_tag[keep], self.y[keep], self.n[keep], self.last_day[keep])
        self.unit_key, self.day_tag, self.y, self.n, self.last_day, self.size = unit_key, day_tag, y, n, last_day, size


#: The columns of a ``cuped_table``.
_COVARIATE_COLUMNS = ("unit", "metric", "value")


class CovariateTable:
    """Pre-period values a warehouse exports, for lookbacks longer than the stream keeps: a Parquet file with the
    columns ``unit`` (str), ``metric`` (an A/B row's metric name) and ``value`` (the unit's pre-period value of
    it). A unit's value counts as one pre-period observation (``q = 1``); a unit or metric not in the file has no
    pre-period data."""

    def __init__(self, path: str, names: Sequence[str]) -> None:
        import pyarrow.parquet as pq

        if not os.path.isfile(path):
            raise ConfigError(f"cuped_table {path}: no such file")
        try:
            missing = [name for name in _COVARIATE_COLUMNS if name not in pq.read_schema(path).names]
            table = None if missing else pq.read_table(path, columns=list(_COVARIATE_COLUMNS))
        except (OSError, ValueError, KeyError) as exc:  # (pyarrow's errors derive from these)
            raise ConfigError(f"cuped_table {path}: not a Parquet file pyarrow can read ({exc})") from None
        if table is None:
            raise ConfigError(f"cuped_table {path}: needs the columns unit, metric and value; {', '.join(missing)} "
                              "missing")
        units = [str(u) for u in table.column("unit").to_pylist()]
        metrics = [str(m) for m in table.column("metric").to_pylist()]
        try:
            values = np.asarray(table.column("value").to_numpy(zero_copy_only=False), dtype=np.float64)
        except (TypeError, ValueError):
            raise ConfigError(f"cuped_table {path}: the column value must hold numbers, it holds "
                              f"{table.column('value').type}") from None
        columns = {name: j for j, name in enumerate(names)}
        unknown = sorted(set(metrics) - columns.keys())
        if unknown:
            raise ConfigError(f"cuped_table {path}: {', '.join(unknown)} is not a metric of the A/B rows (one of "
                              f"{', '.join(names)})")
        if not np.isfinite(values).all():
            raise ConfigError(f"cuped_table {path}: every value must be a finite number")
        hashes = unit_hashes(units)
        self.keys, rows = np.unique(hashes, return_inverse=True)
        cols = np.array([columns[m] for m in metrics], dtype=np.int64)
        if len(np.unique(rows * len(names) + cols)) < len(rows):
            raise ConfigError(f"cuped_table {path}: a unit has two values for one metric")
        self.x = np.zeros((len(self.keys), len(names)))
        self.q = np.zeros((len(self.keys), len(names)))
        self.x[rows, cols] = values
        self.q[rows, cols] = 1.0

    def lookup(self, units: Sequence[str]) -> tuple[Floats, Floats]:
        """The pre-period sums and counts of ``units`` (zeros for a unit not in the table)."""
        if not len(self.keys):  # an empty table: no unit has pre-period data
            return np.zeros((len(units), self.x.shape[1])), np.zeros((len(units), self.q.shape[1]))
        hashes = unit_hashes(units)
        at = np.minimum(np.searchsorted(self.keys, hashes), len(self.keys) - 1)
        found = self.keys[at] == hashes
        return np.where(found[:, None], self.x[at], 0.0), np.where(found[:, None], self.q[at], 0.0)


@functools.lru_cache(maxsize=8)
def _covariate_table(path: str, names: tuple[str, ...]) -> CovariateTable:
    return CovariateTable(path, names)


def key_id_order(keys: Floats, ids: Sequence[str] | Strs) -> Ints:
    """The order that sorts contributions by (key, id): a stable sort of the keys, and the ids compared as Python
    strings only among equal keys (rare: requests served at the same instant).

    >>> key_id_order(np.array([2.0, 1.0, 2.0, 1.0]), ["b", "z", "a", "y"]).tolist()
    [3, 1, 2, 0]
    """
    order: Ints = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    ties = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
    if not ties.shape[0]:
        return order
    # runs of equal keys: each starts where a tie does not continue the one before
    starts = ties[np.concatenate([[True], ties[1:] != ties[:-1] + 1])]
    ends = ties[np.concatenate([ties[1:] != ties[:-1] + 1, [True]])] + 2
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        run = order[a:b].tolist()
        order[a:b] = sorted(run, key=ids.__getitem__)
    return order


def _objects(values: Sequence[str]) -> Strs:
    """``values`` as an array of objects (joined and reordered in C, not element by element)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


class _Pending:
    """Contributions not applied yet, batch by batch (columns), until event time passes their keys."""

    __slots__ = ("keys", "ids", "experiments", "arms", "units", "y", "n", "segments")

    def __init__(self, keys: Floats, ids: Strs, experiments: Strs, arms: Strs, units: Strs, y: Floats, n: Floats,
                 segments: list[Segments | None] | None = None) -> None:
        self.keys, self.ids, self.experiments, self.arms, self.units, self.y, self.n = (
            keys, ids, experiments, arms, units, y, n)
        # each contribution's value of every segment field (None: a session's, which sets none; all None: None)
        self.segments = segments

    @classmethod
    def of(cls, keys: Floats, ids: Sequence[str], experiments: Sequence[str], arms: Sequence[str],
           units: Sequence[str], y: Floats, n: Floats, segments: list[Segments | None] | None = None) -> _Pending:
        return cls(np.asarray(keys, dtype=np.float64), _objects(ids), _objects(experiments), _objects(arms),
                   _objects(units), y, n, segments)

    def segments_of(self, picked: list[int]) -> list[Segments | None]:
        """The segment values of the contributions ``picked``."""
        given = self.segments
        return [None] * len(picked) if given is None else [given[k] for k in picked]

    def slice(self, start: int, stop: int) -> _Pending:
        """The contributions ``start:stop``."""
        return _Pending(self.keys[start:stop], self.ids[start:stop], self.experiments[start:stop],
                        self.arms[start:stop], self.units[start:stop], self.y[start:stop], self.n[start:stop],
                        None if self.segments is None else self.segments[start:stop])

    def take(self, rows: Ints) -> _Pending:
        return _Pending(self.keys[rows], self.ids[rows], self.experiments[rows], self.arms[rows], self.units[rows],
                        self.y[rows], self.n[rows], None if self.segments is None else self.segments_of(rows.tolist()))

    @staticmethod
    def join(parts: list[_Pending]) -> _Pending:
        if len(parts) == 1:
            return parts[0]
        return _Pending(np.concatenate([p.keys for p in parts]), np.concatenate([p.ids for p in parts]),
                        np.concatenate([p.experiments for p in parts]), np.concatenate([p.arms for p in parts]),
                        np.concatenate([p.units for p in parts]), np.concatenate([p.y for p in parts]),
                        np.concatenate([p.n for p in parts]),
                        None if all(p.segments is None for p in parts) else
                        [g for p in parts for g in p.segments_of(list(range(len(p.ids))))])


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
    lift: float = math.nan  # treatment / control - 1
    lift_ci_lower: float = math.nan
    lift_ci_upper: float = math.nan
    lift_cs_lower: float = math.nan  # the running intersection of the lift's confidence sequences
    lift_cs_upper: float = math.nan
    guardrail: bool = False  # a guardrail of the experiment: the fields below say how it stands
    margin: float = math.nan  # the tolerated loss: on ``lift`` when ``margin_relative``, else on ``delta``
    margin_relative: bool = False
    non_inferior: bool = False  # the confidence sequence lies wholly on the good side of ``margin``
    breached: bool = False  # ... wholly on the bad side of it
    cuped: bool = False  # regression-adjusted on the units' pre-period values: the fields below say how
    variance_reduction: float = math.nan  # 1 - adjusted variance of the delta / unadjusted variance
    theta: float = math.nan
    pre_delta: float = math.nan  # treatment - control of the pre-period means
    pre_p_value: float = math.nan  # always-valid p-value of pre_delta == 0 (running minimum): the imbalance check
    # the requests with a value (GAUC: sessions) of each arm as of the look (None: not known from the looks)
    requests_control: int | None = None
    requests_treatment: int | None = None


@dataclass(frozen=True)
class Recommendation:
    """What to do with one treatment of an experiment (README, "Guardrails and the recommendation")."""

    experiment: str
    control: str
    treatment: str
    recommendation: str  # "ship" | "rollback" | "keep running"
    better: list[str]  # goal metrics decided better (after false-discovery control)
    breached: list[str]  # guardrails breached
    unproven: list[str]  # guardrails not shown non-inferior yet
    srm_mismatch: bool = False  # the experiment's SRM check flags it: no ship until the split is mended


@dataclass(frozen=True)
class SegmentAbRow:
    """An A/B row within one value of a segment field (README, "Segment A/B rows"): exploratory, its decision taken
    by e-BH over the experiment's segment rows, and its effect compared with the rest of the experiment's."""

    row: AbRow
    field: str
    value: str
    rest_delta: float  # the delta here minus the delta in the rest of the experiment (every other value)
    rest_p_value: float  # always-valid p-value of rest_delta == 0 (running minimum over looks)
    differs: bool  # rest_delta != 0 after e-BH over the same family as the decisions


@dataclass(frozen=True)
class SrmRow:
    experiment: str
    units: dict[str, int]
    expected: dict[str, float]
    chi2: float
    p_value: float
    sequential_p_value: float
    mismatch: bool
    cuped: bool = False  # the experiment is CUPED: the pre-period imbalance check below ran
    pre_imbalance: list[str] = field(default_factory=list)  # metrics whose pre-period means differ (p < srm_alpha)
    unit_conflicts: int = 0  # units seen in a second arm (kept in their first), as of the look


@dataclass
class ShardLook:
    """One shard's units of one experiment at a look: its arms (in the order their first unit came), each arm's
    sums and units, and the shard's conflicts and overflow so far. Looks of every shard, added in shard order,
    give the experiment's look (:class:`LookMerger`), whichever process holds which shards."""

    experiment: str
    shard: int
    arms: list[str]
    sums: list[ArmSums]
    units: list[int]
    conflicts: int
    overflow: int
    # per arm its requests with a value of each column (:attr:`_Experiment.requests`); None: a look written
    # before 2026-12-04
    requests: dict[str, Floats] | None = None

    def to_json(self) -> list[Any]:
        """JSON-ready, read back bit for bit: each arm's sums, its six post-period arrays followed by the ten of its
        pre-period covariate when it has them (CUPED), as one array of arms × sums × metrics, its bytes in base64
        (:func:`~stream_eval.engine.times.array_to_json`: no float is written or read as text)."""
        rows = [[*s._values(), *(() if s.pre is None else s.pre._values())] for s in self.sums]
        sums: Any = [[v.tolist() for v in row] for row in rows]  # (arms with sums of different kinds: as numbers)
        if rows and len({len(row) for row in rows}) == 1:
            sums = array_to_json(np.array(rows, dtype=np.float64))
        out = [self.experiment, self.shard, self.arms, sums, self.units, self.conflicts, self.overflow]
        if self.requests is not None:
            out.append([list(self.requests), array_to_json(np.array(list(self.requests.values())))])
        return out

    @classmethod
    def from_json(cls, data: list[Any]) -> ShardLook:
        """A look as :meth:`to_json` writes it, or as it was written before 2026-12-04 (each arm's arrays as lists of
        JSON numbers, and without the requests per arm)."""
        experiment, shard, arms, sums, units, conflicts, overflow = data[:7]
        requests = None
        if len(data) > 7:
            counted, counts = data[7]
            requests = dict(zip(map(str, counted), array_from_json(counts), strict=True))

        def arm_sums(values: Sequence[Floats]) -> ArmSums:
            return ArmSums.from_values(list(values[:6]), PreSums(*values[6:]) if len(values) > 6 else None)

        if isinstance(sums, dict):
            arm_values: list[Sequence[Floats]] = list(array_from_json(sums))
        else:
            arm_values = [[np.array(v, dtype=np.float64) for v in arm] for arm in sums]
        return cls(str(experiment), int(shard), [str(a) for a in arms], [arm_sums(arm) for arm in arm_values],
                   [int(u) for u in units], int(conflicts), int(overflow), requests)


#: Called with a look's boundary and the looks of the shards that changed since the previous one.
ShardLookListener = Callable[[float, list[ShardLook | SegmentLook]], None]


def look_from_json(data: list[Any] | dict[str, Any]) -> ShardLook | SegmentLook:
    """A look as :meth:`ShardLook.to_json` (a list) or :meth:`SegmentLook.to_json` (a dict) wrote it."""
    return SegmentLook.from_json(data) if isinstance(data, dict) else ShardLook.from_json(data)


@dataclass
class _SegmentRunning:
    """The running state of one treatment's rows in one segment group: its sequences and p-values (as a treatment's,
    :class:`_Running`), the running minimum p-value of its difference with the rest, and the values it held (from
    scratch when they change: ``__other__`` holds other values as the ones shown change)."""

    running: _Running
    rest_p_value: Floats
    members: tuple[str, ...]

    def to_json(self) -> list[Any]:
        return [self.running.to_json(), self.rest_p_value.tolist(), list(self.members)]

    @classmethod
    def from_json(cls, data: list[Any]) -> _SegmentRunning:
        running, rest, members = data
        return cls(_Running.from_json(running), _array(rest), tuple(members))


#: An experiment's segment groups at the last look: each group's comparison of each treatment with the control, and
#: the difference of its delta with the rest's.
_SegmentEntry = tuple[SegmentGroup, ArmPair, Comparison, Difference]


class LookMerger:
    """The looks of every shard of the A/B units, folded into each experiment's running p-values and sequences.

    A look is taken on a boundary (a multiple of ``look_every``) once every source — the ledgers holding the
    shards: one in replay, one per regroup-stage partition when streaming — has reported its shards up to it
    (:meth:`progress`). An experiment's sums at a look are its shards' latest sums at or before the boundary,
    added in shard order: the same numbers, bit for bit, however the shards are spread over processes.
    Reports are idempotent (a source restarting reports the same looks again: nothing changes)."""

    def __init__(self, config: Config, names: Sequence[str], sources: int = 1) -> None:
        self.config = config
        self.names = list(names)
        self.width = len(self.names)
        self.progress_of = [-math.inf] * sources
        self.folded = -math.inf  # the last boundary folded
        self.looks = 0
        self.on_look: LookListener | None = None
        # reported, not folded yet: boundary -> each shard's (and segment field's) look, the last reported (a look
        # given at once comes again through the log: kept once)
        self._queue: dict[float, dict[tuple[str, int, str | None], ShardLook | SegmentLook]] = {}
        self.latest: dict[str, dict[int, ShardLook]] = {}  # each experiment's shards as of the last fold
        # segments: each experiment's shards' looks per field as of the last fold, (shard, field) -> look; its
        # groups' comparisons at the last fold and their running state, by (field, value, treatment)
        self.segments = SegmentRule.of(config)
        self.latest_segments: dict[str, dict[tuple[int, str], SegmentLook]] = {}
        self._segment_now: dict[str, list[_SegmentEntry]] = {}
        self._segment_running: dict[str, dict[tuple[str, str, str], _SegmentRunning]] = {}
        self._running: dict[str, _RunningExperiment] = {}
        self._now: dict[str, _Look] = {}  # each experiment's comparisons at the last fold
        # Shards' looks since their last boundary (a stage partition reports them as it goes, for the live rows):
        # (experiment, shard) -> (the event time up to which it was applied, its look). A fold past that time
        # drops it.
        self.live: dict[tuple[str, int], tuple[float, ShardLook]] = {}
        #: Whether this merger gives the rows: replay's, and stage partition 0's (the others' merge nothing).
        self.active = True
        self.staged = False  # a regroup stage partition's (0: the one that merges every partition's looks)
        self.version = 0  # changes with every fold and live look (the readout's cache of the rows keys on it)

    def holds_looks(self) -> bool:
        """Whether it has folded a look, or holds shards' looks not folded yet (reported, or live)."""
        return bool(self.looks or self.live or any(self._queue.values()))

    def add_live(self, time: float, looks: Sequence[ShardLook | SegmentLook]) -> None:
        """Shards' looks at event time ``time``, between boundaries: shown by :meth:`results`, never folded (nor are
        segment looks ever live)."""
        if time > self.folded:
            live = self.live
            for look in looks:
                if not isinstance(look, ShardLook):
                    continue
                key = (look.experiment, look.shard)
                held = live.get(key)
                if held is None or held[0] <= time:  # (a newer look stays: the log brings again what was given at once)
                    live[key] = (time, look)
            self.version += 1

    def add(self, boundary: float, looks: Sequence[ShardLook | SegmentLook]) -> None:
        """Shards' looks at ``boundary`` (a boundary folded already is reported again by a restarted source)."""
        if boundary > self.folded:
            self._enqueue(boundary, looks)
            self._fold_ready()

    def _enqueue(self, boundary: float, looks: Sequence[ShardLook | SegmentLook]) -> None:
        queued = self._queue.setdefault(boundary, {})
        for look in looks:
            queued[look.experiment, look.shard, look.field if isinstance(look, SegmentLook) else None] = look

    def progress(self, source: int, upto: float) -> None:
        """``source`` has reported every look up to event time ``upto``: fold the boundaries every source passed."""
        if source >= len(self.progress_of):
            self.progress_of += [-math.inf] * (source + 1 - len(self.progress_of))
        if upto > self.progress_of[source]:
            self.progress_of[source] = upto
            self._fold_ready()

    def _fold_ready(self) -> None:
        ready = min(self.progress_of)
        queue = self._queue
        for boundary in sorted(b for b in queue if b <= ready):
            for look in queue.pop(boundary).values():
                self._keep(look)
            self._fold(boundary)
            self.live = {key: entry for key, entry in self.live.items() if entry[0] > boundary}

    def _keep(self, look: ShardLook | SegmentLook) -> None:
        """A shard's look as its latest (of its segment field's, for a segment look), for the folds from now on."""
        if isinstance(look, SegmentLook):
            self.latest_segments.setdefault(look.experiment, {})[look.shard, look.field] = look
        else:
            self.latest.setdefault(look.experiment, {})[look.shard] = look

    def _fold(self, boundary: float) -> None:
        for name in sorted(self.latest):
            now = self._merged(name)
            if now is None:
                continue
            self._now[name] = now
            self._running[name] = self._folded(name, now)
            if self.segments is not None:
                self._fold_segments(name, now)
        self.folded = boundary
        self.looks += 1
        self.version += 1
        if self.on_look is not None:
            self.on_look(boundary)

    def _merged(self, name: str, live: dict[int, ShardLook] | None = None) -> _Look | None:
        """The comparisons and SRM test of an experiment from its shards' latest looks (with ``live``: those
        instead, where given; None: no treatment)."""
        parts: dict[str, list[ArmSums]] = {}  # each arm's sums of every shard, in shard order
        units: dict[str, int] = {}
        shards = self.latest.get(name, {})
        if live:
            shards = {**shards, **live}
        conflicts = 0
        requests: dict[str, Floats] | None = {}
        for shard in sorted(shards):
            look = shards[shard]
            conflicts += look.conflicts
            if look.requests is None:
                requests = None
            elif requests is not None:
                for arm, counted in look.requests.items():
                    requests[arm] = requests[arm] + counted if arm in requests else counted
            for arm, arm_sums, n in zip(look.arms, look.sums, look.units, strict=True):
                parts.setdefault(arm, []).append(arm_sums)
                units[arm] = units.get(arm, 0) + n
        sums = {arm: ArmSums.total(listed) for arm, listed in parts.items()}
        arms = self.config.arms_for(name, set(sums))
        if arms is None:
            return None
        zeros = ArmSums.zeros(self.width)
        control = sums.get(arms.control, zeros)
        cuped = self.config.settings_of(name).cuped
        comparisons = [compare(control, sums.get(treatment, zeros), confidence=self.config.confidence,
                               sequential_n=self.config.sequential_n, cuped=cuped) for treatment in arms.treatments]
        # the arms compared count even before their first unit (a control not seen yet: 0 units, a mismatch)
        expected = self.config.split_for(name, set(units) | {arms.control, *arms.treatments})
        counts = [float(units.get(arm, 0)) for arm in expected]
        # units in an arm the split gives no share: impossible under the split, a mismatch for sure (p = 0)
        strays = {arm: n for arm, n in sorted(units.items()) if arm not in expected and n > 0}
        test = SrmTest(math.inf, 0.0, 0.0) if strays else srm_test(counts, list(expected.values()))
        srm = SrmRow(name, {**{arm: units.get(arm, 0) for arm in expected}, **strays},
                     {**expected, **dict.fromkeys(strays, 0.0)}, test.chi2, test.p_value, test.sequential_p_value,
                     False, unit_conflicts=conflicts)
        return _Look(arms, comparisons, srm, requests)

    def _folded(self, name: str, now: _Look) -> _RunningExperiment:
        """The running state of an experiment with one more look folded in: per treatment (from scratch when its
        control changed), and the SRM test's (from scratch when its arms changed). NaN (undefined at this look)
        leaves a bound or p-value as it was (``fmin``/``fmax`` skip NaN)."""
        before = self._running.get(name)
        cuped = self.config.settings_of(name).cuped
        pairs = {pair.treatment: _fold_pair(None if before is None else before.pairs.get(pair.treatment), pair,
                                            comparison, cuped)
                 for pair, comparison in zip(now.arms.pairs(), now.comparisons, strict=True)}
        srm_arms = tuple(now.srm.expected)
        srm_before = 1.0
        if before is not None and before.srm_arms in (None, srm_arms):
            srm_before = before.srm_p_value
        srm_p = now.srm.sequential_p_value
        return _RunningExperiment(pairs, srm_before if math.isnan(srm_p) else min(srm_before, srm_p), srm_arms)

    def results(self, names: Sequence[str] | None = None,
                live: Sequence[ShardLook] = ()) -> tuple[list[AbRow], list[SrmRow]]:
        """The ``ab`` and ``srm`` rows as of the last look folded, with a look (not kept) at the shards' live looks
        since (reported, and ``live``), if any. ``names`` picks the metric columns shown (default: all)."""
        ab: list[AbRow] = []
        srm_rows: list[SrmRow] = []
        if not self.active:
            return ab, srm_rows
        shown = self.names if names is None else names
        columns = [(self.names.index(name), name) for name in shown if name in self.names]
        latest: dict[str, dict[int, ShardLook]] = {}
        for _, look in self.live.values():
            latest.setdefault(look.experiment, {})[look.shard] = look
        for look in live:
            latest.setdefault(look.experiment, {})[look.shard] = look
        now_of = dict(self._now)
        running_of = dict(self._running)
        for name, shards in latest.items():
            now = self._merged(name, shards)
            if now is not None:
                now_of[name], running_of[name] = now, self._folded(name, now)
        for name in sorted(now_of):
            now = now_of[name]
            running = running_of[name]
            cuped = self.config.settings_of(name).cuped
            rows: list[AbRow] = []
            log_e: list[float] = []
            for pair, comparison in zip(now.arms.pairs(), now.comparisons, strict=True):
                rows.extend(_rows(name, pair, comparison, running.pairs[pair.treatment], columns, cuped,
                                  now.requests))
                log_e.extend(float(comparison.log_e_value[j]) for j, _ in columns)
            ab.extend(_decided(rows, log_e, self.config))
            srm = now.srm
            imbalanced = sorted({row.metric for row in rows if row.pre_p_value < self.config.srm_alpha})
            srm_rows.append(SrmRow(srm.experiment, srm.units, srm.expected, srm.chi2, srm.p_value,
                                   running.srm_p_value, running.srm_p_value < self.config.srm_alpha,
                                   cuped, imbalanced, srm.unit_conflicts))
        return ab, srm_rows

    def _segment_entries(self, name: str, now: _Look) -> list[_SegmentEntry]:
        """The segment groups of an experiment from its shards' latest looks, each compared as the experiment is
        (each treatment with the control, CUPED if it is), with the difference from the rest of the experiment."""
        assert self.segments is not None
        cuped = self.config.settings_of(name).cuped
        options = {"confidence": self.config.confidence, "sequential_n": self.config.sequential_n}
        zeros = ArmSums.zeros(self.width)
        entries: list[_SegmentEntry] = []
        for group in segment_groups(self.latest_segments.get(name, {}), self.segments, 16 if cuped else 6):
            for pair in now.arms.pairs():
                here = compare(group.sums.get(pair.control, zeros), group.sums.get(pair.treatment, zeros),
                               cuped=cuped, **options)
                rest = compare(group.rest.get(pair.control, zeros), group.rest.get(pair.treatment, zeros),
                               cuped=cuped, **options)
                entries.append((group, pair, here, difference(here, rest, **options)))
        return entries

    def _fold_segments(self, name: str, now: _Look) -> None:
        """Fold a look into an experiment's segment rows: each (field, value, treatment)'s running state, from
        scratch when its control or the values its group holds changed; groups no longer shown are dropped."""
        entries = self._segment_entries(name, now)
        before = self._segment_running.get(name, {})
        cuped = self.config.settings_of(name).cuped
        running: dict[tuple[str, str, str], _SegmentRunning] = {}
        for group, pair, here, apart in entries:
            key = (group.field, group.value, pair.treatment)
            was = before.get(key)
            if was is not None and was.members != group.members:
                was = None
            rest_p = np.ones(self.width) if was is None else was.rest_p_value
            running[key] = _SegmentRunning(_fold_pair(None if was is None else was.running, pair, here, cuped),
                                           np.fmin(rest_p, apart.p_value), group.members)
        self._segment_now[name] = entries
        self._segment_running[name] = running

    def segment_results(self, names: Sequence[str] | None = None) -> list[SegmentAbRow]:
        """The segment rows as of the last look folded (never between looks: README, "Segment A/B rows"), with
        their decisions and the flags of a difference from the rest, each by e-BH over the experiment's segment rows
        (goal metrics × treatments × segment values; the other metrics a family of their own)."""
        out: list[SegmentAbRow] = []
        if not self.active:
            return out
        shown = self.names if names is None else names
        columns = [(self.names.index(name), name) for name in shown if name in self.names]
        for name in sorted(self._segment_now):
            cuped = self.config.settings_of(name).cuped
            rows: list[AbRow] = []
            log_e: list[float] = []
            apart_e: list[float] = []
            where: list[tuple[SegmentGroup, float, float]] = []
            for group, pair, here, apart in self._segment_now[name]:
                state = self._segment_running[name][group.field, group.value, pair.treatment]
                rows.extend(_rows(name, pair, here, state.running, columns, cuped))
                for j, _ in columns:
                    log_e.append(float(here.log_e_value[j]))
                    apart_e.append(float(apart.log_e_value[j]))
                    rest_p = float(apart.p_value[j])
                    where.append((group, float(apart.delta[j]),
                                  rest_p if math.isnan(rest_p) else float(state.rest_p_value[j])))
            decided = _decided(rows, log_e, self.config, exploratory=True)
            differs = families_rejected(apart_e, _families(rows, self.config, exploratory=True),
                                        1.0 - self.config.confidence)
            out.extend(SegmentAbRow(row, group.field, group.value, rest_delta, rest_p, flag)
                       for row, (group, rest_delta, rest_p), flag in zip(decided, where, differs, strict=True))
        return out

    def state_to_json(self) -> dict[str, Any]:
        """What a new owner of the merger needs (it is rebuilt from this and the reports after it)."""
        return {"progress": [time_to_json(t) for t in self.progress_of], "folded": time_to_json(self.folded),
                "looks": self.looks,
                "queue": [[time_to_json(b), [look.to_json() for look in looks.values()]]
                          for b, looks in self._queue.items()],
                "latest": [*(look.to_json() for shards in self.latest.values() for look in shards.values()),
                           *(look.to_json() for shards in self.latest_segments.values() for look in shards.values())],
                "running": {name: r.to_json() for name, r in self._running.items()},
                "segment_running": {name: [[*key, state.to_json()] for key, state in running.items()]
                                    for name, running in self._segment_running.items()}}

    def restore_json(self, data: dict[str, Any]) -> None:
        self.progress_of = [float(t) for t in data["progress"]] + self.progress_of[len(data["progress"]):]
        self.folded, self.looks = float(data["folded"]), int(data["looks"])
        self._queue = {}
        for b, looks in data["queue"]:
            self._enqueue(float(b), [look_from_json(look) for look in looks])
        self.latest, self.latest_segments = {}, {}
        for raw in data["latest"]:
            self._keep(look_from_json(raw))
        self._running = {name: _RunningExperiment.from_json(r) for name, r in data["running"].items()}
        self._segment_running = {
            name: {(str(f), str(v), str(t)): _SegmentRunning.from_json(state) for f, v, t, state in running}
            for name, running in data.get("segment_running", {}).items()}  # (none in a state written before)
        self._now, self._segment_now = {}, {}
        for name in self.latest:
            now = self._merged(name)
            if now is not None:
                self._now[name] = now
                if self.segments is not None and name in self._segment_running:
                    entries = self._segment_entries(name, now)
                    running = self._segment_running[name]
                    self._segment_now[name] = [e for e in entries if (e[0].field, e[0].value, e[1].treatment)
                                               in running]


class UnitLedger:
    """Per experiment, the units of the A/B split and their sums, fed in event-time order, in :data:`SHARDS`
    shards by unit (:func:`shard_of`); a ledger may get the contributions of some shards only (a partition of the
    streaming regroup stage).

    ``names`` are the per-request metric columns' report names (the means: ``MRR``, ``nDCG@10``, ...); the
    ledger adds a last column for ``GAUC``. Its looks go to :attr:`merger` (replay: all shards here), or to
    :attr:`on_shard_look` when set (a stage partition reporting to the merger of another).
    """

    def __init__(self, config: Config, names: Sequence[str], gauc_name: str = "GAUC") -> None:
        self.config = config
        self.names = [*names, gauc_name]
        self.width = len(self.names)
        self.experiments: dict[str, dict[int, _Experiment]] = {}  # experiment -> shard -> its units
        self._pending: list[_Pending] = []
        self.merger = LookMerger(config, self.names)
        self.on_shard_look: ShardLookListener | None = None
        self.on_progress: LookListener | None = None  # with on_shard_look: every look up to a time was reported
        self.open_look: float | None = None  # the boundary of contributions applied and not looked at yet
        self.released = -math.inf  # event time up to which contributions were applied
        self.last_key = -math.inf  # the latest key of a contribution applied
        self._changed: set[tuple[str, int]] = set()  # (experiment, shard) changed since the last look
        self._live_changed: set[tuple[str, int]] = set()  # ... since the last live report (live_looks)
        # The regroup stage rebuilding from a snapshot: records the snapshot holds change nothing here.
        self.frozen = False
        # CUPED: each CUPED experiment's lookback in days, its warehouse table if any; the units' recent
        # contributions per shard (kept only when some experiment is CUPED)
        self.cuped = {name: (lookback_days(settings.cuped_lookback),
                             _covariate_table(settings.cuped_table, tuple(self.names)) if settings.cuped_table
                             else None) for name, settings in config.experiments if settings.cuped}
        self.buckets = max((days for days, table in self.cuped.values() if table is None), default=-1) + 1
        self.history: dict[int, UnitHistory] = {}
        self.segments = SegmentRule.of(config)  # segment fields: each unit's value of each (segment_ab.py)

    @property
    def on_look(self) -> LookListener | None:
        return self.merger.on_look

    @on_look.setter
    def on_look(self, listener: LookListener | None) -> None:
        self.merger.on_look = listener

    @property
    def looks(self) -> int:
        return self.merger.looks

    # -- input ------------------------------------------------------------------------------------------
    def add_requests(self, keys: Floats, ids: list[str], experiments: list[str], arms: list[str],
                     units: list[str], values: Floats, segments: Sequence[Segments] | None = None) -> None:
        """Finalised requests: finalisation points, request ids, labels, units and their per-request values
        (NaN = no value); ``values`` has one column per name except GAUC. ``segments``: each request's value of every
        segment field (none given: without the fields, ``__missing__``)."""
        if not len(ids) or self.frozen:
            return
        present = ~np.isnan(values)
        y = np.zeros((len(ids), self.width))
        n = np.zeros((len(ids), self.width))
        y[:, :-1] = np.where(present, values, 0.0)
        n[:, :-1] = present
        given: list[Segments | None] | None = None
        if self.segments is not None:
            given = list(segments) if segments is not None else [(None,) * len(self.segments.fields)] * len(ids)
        self._pending.append(_Pending.of(keys, ids, experiments, arms, units, y, n, given))

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
        self._pending.append(_Pending.of(keys, [f"~{i}" for i in ids], experiments, arms, units, y, n))

    # -- event time ---------------------------------------------------------------------------------------
    def release(self, watermark: float) -> None:
        """Apply the contributions keyed at or before ``watermark``, in (key, id) order, and take the looks on the
        boundaries passed: a contribution keyed ``k`` is in the look on ``ceil(k / look_every) * look_every``, taken
        once the watermark reaches it."""
        if self.frozen:
            return
        if self._pending and watermark >= min(float(p.keys.min()) for p in self._pending):
            # in (key, id) order, the contributions due are the first ones (a key at or before the watermark)
            pending = _Pending.join(self._pending)
            pending = pending.take(key_id_order(pending.keys, pending.ids))
            due = int(np.searchsorted(pending.keys, watermark, side="right"))
            count = len(pending.ids)
            self._pending = [pending.slice(due, count)] if due < count else []
            if due:
                ready = pending if due == count else pending.slice(0, due)
                every = self.config.look_every
                bounds = np.ceil(ready.keys / every) * every
                start, count = 0, len(ready.ids)
                while start < count:
                    boundary = float(bounds[start])
                    end = int(np.searchsorted(bounds, boundary, side="right"))
                    if self.open_look is not None and self.open_look < boundary:
                        self._look(self.open_look)
                    self._apply(ready, start, end)
                    self.open_look = boundary
                    start = end
                self.last_key = max(self.last_key, float(ready.keys[-1]))
        if self.open_look is not None and self.open_look <= watermark:
            self._look(self.open_look)
        self.released = max(self.released, watermark)
        if self.on_shard_look is None:
            self.merger.progress(0, watermark)
        elif self.on_progress is not None:
            self.on_progress(watermark)

    def _look(self, boundary: float) -> None:
        """The looks of the shards changed since the last one, at ``boundary``, to the merger."""
        self.open_look = None
        changed = sorted(self._changed)
        looks: list[ShardLook | SegmentLook] = [self.experiments[name][shard].look(name, shard)
                                                for name, shard in changed]
        if self.segments is not None:  # (at the boundaries only, never live: README "Segment A/B rows")
            looks += segment_looks(self.segments, [self.experiments[name][shard].units_of(name, shard)
                                                   for name, shard in changed])
        self._live_changed -= self._changed  # (looked at: no live look of them is needed)
        self._changed.clear()
        if self.on_shard_look is not None:
            self.on_shard_look(boundary, looks)
        else:
            self.merger.add(boundary, looks)
            self.merger.progress(0, boundary)

    def _apply(self, ready: _Pending, start: int, end: int) -> None:
        if start >= end:
            return
        shards, hashes = unit_keys(ready.units[start:end])
        names = ready.experiments[start:end]
        count = end - start
        tracked = np.zeros(count, dtype=np.bool_)  # (CUPED) the contribution's unit is tracked in its experiment
        entry_of = np.full(count, -1, dtype=np.int64)  # (CUPED) which entry into a CUPED experiment it is
        entered: list[tuple[_Experiment, int, str]] = []  # ... each entry's experiment, its unit row, its name
        # the contributions by (experiment, shard), in that order, each group's in (key, id) order
        ordered = sorted(set(names))
        code = {name: i for i, name in enumerate(ordered)}
        group = np.fromiter(map(code.__getitem__, names), dtype=np.int64, count=count) * SHARDS + shards
        order, group, bounds = grouped(group)
        arm_names, arm_of = distinct_keys(ready.arms[start:end].tolist())
        positive = (ready.n[start:end] > 0).astype(np.float64)  # (the requests with a value, per column)
        arms_with: dict[int, list[int]] = {}  # each experiment's arms here (codes into arm_names)
        for pair in np.unique(group // SHARDS * len(arm_names) + arm_of[order]).tolist():
            arms_with.setdefault(pair // len(arm_names), []).append(pair % len(arm_names))
        for first, stop in itertools.pairwise(bounds):
            name, shard = ordered[int(group[first]) // SHARDS], int(group[first]) % SHARDS
            local = order[first:stop]  # (ascending: the sort is stable)
            picked = (local + start).tolist()
            experiment = self.experiments.setdefault(name, {}).get(shard)
            if experiment is None:
                experiment = self.experiments[name][shard] = _Experiment(
                    self.width, limit=_shard_limit(self.config), pre=name in self.cuped,
                    fields=0 if self.segments is None else len(self.segments.fields))
            before = experiment.size
            rows, used = experiment.rows_of(hashes[local], arm_of[local], arm_names)
            experiment.count_requests(arm_names, arms_with[int(group[first]) // SHARDS], arm_of[local], positive, local)
            if self.segments is not None:
                self.segments.assign(experiment.segment, experiment.segment_codes, rows, ready.segments_of(picked))
            if experiment.pre or self.buckets > 0:
                tracked[local] = used
                if experiment.pre:  # a unit's first contribution with a new row: its entry
                    new_rows, first = np.unique(rows[rows >= before], return_index=True)
                    for row, k in zip(new_rows.tolist(), local[rows >= before][first].tolist(), strict=True):
                        entry_of[k] = len(entered)
                        entered.append((experiment, row, name))
            index = local + start
            add_rows(experiment.y, rows, ready.y, index)
            add_rows(experiment.n, rows, ready.n, index)
            experiment.version += 1
            self._changed.add((name, shard))
            self._live_changed.add((name, shard))
        if entered or (self.buckets > 0 and tracked.any()):
            self._covariates(ready, start, shards, hashes, tracked, entry_of, entered)

    def _covariates(self, ready: _Pending, start: int, shards: Ints, hashes: npt.NDArray[np.uint64],
                    tracked: npt.NDArray[np.bool_], entry_of: Ints, entered: list[tuple[_Experiment, int, str]]
                    ) -> None:
        """CUPED: the tracked contributions ``start:`` of ``ready`` into their shards' :class:`UnitHistory` in
        (key, id) order, and each entry's pre-period (the history before it, or the experiment's warehouse table)
        into its unit's row."""
        count = len(tracked)
        tables = [self.cuped[name][1] for _, _, name in entered]
        if any(table is not None for table in tables):
            units = ready.units[start : start + count]
            for k in np.flatnonzero(entry_of >= 0).tolist():
                table = tables[int(entry_of[k])]
                if table is not None:
                    experiment, row, _ = entered[int(entry_of[k])]
                    x, q = table.lookup([units[k]])
                    experiment.x[row], experiment.q[row] = x[0], q[0]
                    entry_of[k] = -1  # (not from the stream)
        if self.buckets <= 0:
            return
        days = np.floor(ready.keys[start : start + count] / DAY).astype(np.int64)
        lookbacks = np.zeros(count, dtype=np.int64)
        entries_here = np.flatnonzero(entry_of >= 0)
        if len(entries_here):
            lookback_of = np.array([self.cuped[name][0] for _, _, name in entered], dtype=np.int64)
            lookbacks[entries_here] = lookback_of[entry_of[entries_here]]
        # the tracked contributions by shard, each shard's in their order
        picked = np.flatnonzero(tracked)
        if not len(picked):
            return
        order, shard_of, bounds = grouped(shards[picked])
        picked = picked[order]
        for first, stop in itertools.pairwise(bounds):
            at, shard = picked[first:stop], int(shard_of[first])
            entries = entry_of[at]
            mine = entries >= 0
            local = np.full(len(at), -1, dtype=np.int64)
            local[mine] = np.arange(int(mine.sum()))
            history = self.history.get(shard)
            if history is None:
                history = self.history[shard] = UnitHistory(self.width, self.buckets)
            out_x, out_q = history.apply(hashes[at], days[at], ready.y[start + at], ready.n[start + at], lookbacks[at],
                                         local, int(mine.sum()))
            for j, e in enumerate(entries[mine].tolist()):
                experiment, row, _ = entered[e]
                experiment.x[row], experiment.q[row] = out_x[j], out_q[j]

    def merge(self, other: UnitLedger) -> None:
        """Take the shards ``other`` holds (the partitions of a regroup stage hold different shards; of a shard
        held by both, the copy of the ledger released further), and its merger if it folded further."""
        for name, shards in other.experiments.items():
            mine = self.experiments.setdefault(name, {})
            for shard, experiment in shards.items():
                if shard not in mine or other.released > self.released:
                    mine[shard] = experiment
        for shard, history in other.history.items():
            if shard not in self.history or other.released > self.released:
                self.history[shard] = history
        def rank(merger: LookMerger) -> tuple[bool, bool, float, int]:
            return merger.active, merger.staged, merger.folded, merger.looks

        if rank(other.merger) > rank(self.merger):
            self.merger = other.merger
        elif other.experiments and not other.merger.active and self.merger.active and not self.merger.staged \
                and not self.merger.looks:
            # shards of a stage partition that reports to another's merger: this empty one gives no rows either
            self.merger = LookMerger(self.config, self.names)
            self.merger.active = False
        self._changed |= other._changed  # (their live looks: the shards are those taken above)
        self.released, self.last_key = max(self.released, other.released), max(self.last_key, other.last_key)

    # -- results ------------------------------------------------------------------------------------------
    def look(self, ts: float) -> None:
        """Take a look now (at event time ``ts``) at what has been applied, wherever the boundaries are."""
        self._look(ts)

    def results(self, names: Sequence[str] | None = None) -> tuple[list[AbRow], list[SrmRow]]:
        """The ``ab`` and ``srm`` rows as of the last look (:class:`LookMerger`), with a look (not kept) at what
        was applied since: here, and as the other stage partitions reported it."""
        return self.merger.results(names, self.live_looks())

    def segment_results(self, names: Sequence[str] | None = None) -> list[SegmentAbRow]:
        """The segment rows as of the last look (:meth:`LookMerger.segment_results`)."""
        return self.merger.segment_results(names)

    def live_looks(self, since_report: bool = False) -> list[ShardLook]:
        """The looks of the shards changed since their last look (with ``since_report``: since the last call so,
        whose looks are reported as live; ``engine/regroup.py``)."""
        changed = self._live_changed if since_report else self._changed
        looks = [self.experiments[name][shard].look(name, shard) for name, shard in sorted(changed)]
        if since_report:
            self._live_changed = set()
        return looks

    def state_key(self) -> tuple[int, ...]:
        """Equal for two calls on this ledger when :meth:`results`, :meth:`units`, :meth:`conflicts` and
        :attr:`overflow` are unchanged between them (a cache of the A/B rows keys on it; ``export/prometheus.py``)."""
        return (self.merger.version, *(e.version for shards in self.experiments.values() for e in shards.values()))

    @property
    def overflow(self) -> int:
        """Contributions left out of the A/B statistics because their unit was new beyond ``max_units``."""
        return sum(e.overflow for shards in self.experiments.values() for e in shards.values())

    def conflicts(self) -> dict[str, int]:
        """Units seen in a second arm, per experiment (of the shards held here)."""
        return {name: sum(e.conflicts for e in shards.values()) for name, shards in sorted(self.experiments.items())}

    def units(self) -> dict[str, dict[str, int]]:
        """Units per arm of each experiment (of the shards held here)."""
        out: dict[str, dict[str, int]] = {}
        for name, shards in sorted(self.experiments.items()):
            arms = out[name] = {}
            for shard in sorted(shards):
                for arm, n in shards[shard].units_per_arm().items():
                    arms[arm] = arms.get(arm, 0) + n
        return out


def _shard_limit(config: Config) -> int:
    """Units kept per shard of an experiment: ``max_units`` spread over the shards (rounded up)."""
    return -(-config.max_units // SHARDS)


def _fold_pair(was: _Running | None, pair: ArmPair, comparison: Comparison, cuped: bool) -> _Running:
    """A treatment's running state with one more look folded in (from scratch without one, or when its control
    changed): the running minimum of the p-values, the running intersection of the sequences. NaN (undefined at this
    look) leaves a bound or p-value as it was (``fmin``/``fmax`` skip NaN)."""
    width = comparison.delta.shape[0]
    if was is None or was.pair != pair:
        was = _Running(pair, np.ones(width), np.full(width, -math.inf), np.full(width, math.inf))
    lift_lower = np.full(width, -math.inf) if was.lift_cs_lower is None else was.lift_cs_lower
    lift_upper = np.full(width, math.inf) if was.lift_cs_upper is None else was.lift_cs_upper
    pre_p = None
    if cuped:
        pre_p = np.fmin(np.ones(width) if was.pre_p_value is None else was.pre_p_value, comparison.pre_p_value)
    return _Running(pair, np.fmin(was.p_value, comparison.p_value), np.fmax(was.cs_lower, comparison.cs_lower),
                    np.fmin(was.cs_upper, comparison.cs_upper), np.fmax(lift_lower, comparison.lift_cs_lower),
                    np.fmin(lift_upper, comparison.lift_cs_upper), pre_p)


def _rows(name: str, pair: ArmPair, comparison: Comparison, running: _Running,
          columns: list[tuple[int, str]], cuped: bool = False, requests: dict[str, Floats] | None = None
          ) -> list[AbRow]:
    """The rows of one treatment against the control, for the metric ``columns`` (index, name); ``cuped``: with
    CUPED's fields; ``requests``: each arm's requests per column, as of the look."""
    rows = []
    for j, metric in columns:
        lower, upper = _bound(running.cs_lower[j]), _bound(running.cs_upper[j])
        counted = [None if requests is None else int(requests[arm][j]) if arm in requests else 0
                   for arm in (pair.control, pair.treatment)]
        row = AbRow(
            name, pair.control, pair.treatment, metric, float(comparison.delta[j]),
            float(comparison.ci_lower[j]), float(comparison.ci_upper[j]), lower, upper,
            float(running.p_value[j]) if not math.isnan(float(comparison.p_value[j])) else math.nan,
            _decision(lower, upper), int(comparison.units_control[j]), int(comparison.units_treatment[j]),
            float(comparison.lift[j]), float(comparison.lift_ci_lower[j]), float(comparison.lift_ci_upper[j]),
            _bound(running.lift_cs_lower[j]) if running.lift_cs_lower is not None else math.nan,
            _bound(running.lift_cs_upper[j]) if running.lift_cs_upper is not None else math.nan,
            requests_control=counted[0], requests_treatment=counted[1],
        )
        if cuped:
            pre_p = float(comparison.pre_p_value[j])
            if running.pre_p_value is not None and not math.isnan(pre_p):
                pre_p = float(running.pre_p_value[j])
            row = dataclasses.replace(row, cuped=True, variance_reduction=float(comparison.variance_reduction[j]),
                                      theta=float(comparison.theta[j]), pre_delta=float(comparison.pre_delta[j]),
                                      pre_p_value=pre_p)
        rows.append(row)
    return rows


def _families(rows: list[AbRow], config: Config, exploratory: bool = False) -> list[list[int]]:
    """The false-discovery families of an experiment's rows (indexes): its goal metrics (``primary``, else every
    metric not a guardrail) of every treatment; and the other metrics not guardrails, when ``primary`` names fewer
    (``exploratory``, an experiment's segment rows: every other metric, guardrails included)."""
    if not rows:
        return []
    settings = config.settings_of(rows[0].experiment)
    guardrails = {metric for metric, _ in settings.guardrails}
    goal = set(settings.primary) or {row.metric for row in rows} - guardrails
    others = {row.metric for row in rows} - goal - (set() if exploratory else guardrails)
    return [[k for k, row in enumerate(rows) if row.metric in family] for family in (goal, others)]


def _decided(rows: list[AbRow], log_e: list[float], config: Config, exploratory: bool = False) -> list[AbRow]:
    """An experiment's rows with their decisions after false-discovery control, and its guardrails tested.

    Families (README, "False discoveries"; :func:`_families`). Each family's decisions are e-BH's at level
    ``1 - confidence`` on the e-values of this look: a row not rejected is ``inconclusive``. A guardrail keeps its
    own decision (unadjusted; in ``exploratory`` segment rows, it is in the second family) and gets its
    non-inferiority test: its confidence sequence (of the lift for a relative tolerance) wholly on the good side of
    the tolerated loss (``non_inferior``), or wholly on the bad side (``breached``)."""
    if not rows:
        return rows
    guardrails = dict(config.settings_of(rows[0].experiment).guardrails)
    out = list(rows)
    families = _families(rows, config, exploratory)
    rejected = families_rejected(log_e, families, 1.0 - config.confidence)
    for k in (member for family in families for member in family):
        if not rejected[k]:
            out[k] = dataclasses.replace(rows[k], decision="inconclusive")
    for k, row in enumerate(rows):
        tolerance = guardrails.get(row.metric)
        if tolerance is not None:
            lower, upper = (row.lift_cs_lower, row.lift_cs_upper) if tolerance.relative else (row.cs_lower,
                                                                                               row.cs_upper)
            if tolerance.value > 0:  # a metric lower-is-better: a rise is the loss
                good, bad = upper < tolerance.value, lower > tolerance.value
            else:
                good, bad = lower > tolerance.value, upper < tolerance.value
            out[k] = dataclasses.replace(out[k], guardrail=True, margin=tolerance.value,
                                         margin_relative=tolerance.relative, non_inferior=good, breached=bad)
    return out


def recommend(rows: Sequence[AbRow], config: Config, mismatched: Collection[str] = ()) -> list[Recommendation]:
    """Per treatment: ``rollback`` when a guardrail is breached; ``ship`` when a goal metric (``primary``, else every
    metric not a guardrail) is better (its decision, taken after false-discovery control, in the metric's direction)
    and every guardrail is shown non-inferior, unless the experiment is in ``mismatched`` (its SRM check flags it:
    the comparison is not to be trusted, so a treatment that would ship keeps running); else ``keep running``."""
    out: dict[tuple[str, str], Recommendation] = {}
    primary = {name: set(config.settings_of(name).primary) for name in {row.experiment for row in rows}}
    for row in rows:
        key = (row.experiment, row.treatment)
        now = out.get(key)
        if now is None:
            now = out[key] = Recommendation(row.experiment, row.control, row.treatment, "keep running", [], [], [],
                                            row.experiment in mismatched)
        if row.guardrail:
            if row.breached:
                now.breached.append(row.metric)
            elif not row.non_inferior:
                now.unproven.append(row.metric)
        elif row.decision == ("worse" if lower_is_better(row.metric) else "better") and (
                not primary[row.experiment] or row.metric in primary[row.experiment]):
            now.better.append(row.metric)
    rowed = {(row.experiment, row.treatment, row.metric) for row in rows if row.guardrail}
    for now in out.values():  # a guardrail without a row (no unit has a value of it yet) is shown nothing
        now.unproven.extend(metric for metric, _ in config.settings_of(now.experiment).guardrails
                            if (now.experiment, now.treatment, metric) not in rowed)
    return [dataclasses.replace(r, recommendation="rollback" if r.breached else
                                "ship" if r.better and not r.unproven and not r.srm_mismatch else "keep running")
            for r in out.values()]


def _bound(value: float) -> float:
    value = float(value)
    return math.nan if math.isinf(value) else value


def _decision(lower: float, upper: float) -> str:
    if lower > upper:  # an empty intersection: the asymptotic sequence did not hold here
        return "inconclusive"
    return decide(lower, upper)
