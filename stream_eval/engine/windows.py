"""Rolling event-time windows of per-request values, open requests included, updated incrementally.

A request belongs to the bucket of its serve time (``floor(ts / width)``). Each (bucket, group) holds a
:class:`~stream_eval.metrics.aggregates.Moments` of the per-request values of the requests served in it, and
values change the River way: revert the old contribution, add the new one.

* A new ranking adds its current values (those of :meth:`Engine.evaluate <stream_eval.engine.engine.Engine.evaluate>`,
  all zero or empty until feedback arrives).
* Feedback that raises a grade (the join's ``changed``) reverts the request's old row and adds the new one.
* Finalisation reverts the last row and adds the final values to a store of their own; the finalised request
  keeps no row, so memory is one row per *open* request plus two ``Moments`` per (bucket, group): the open
  requests' current values and the finalised requests' final ones. The finalised part is the engine's *share*
  of the windows, which a checkpoint stores (see below); the open part a new owner rebuilds.
* An open request without grades and without subtopics (most requests, most of their life) has the values every
  such request has: it holds no row (its row in the join is ``UNGRADED``) and is neither evaluated nor stored;
  the windows keep that one row, evaluated from the first such request they see.

Changed requests are evaluated in batches when the windows are read (:meth:`RollingWindows.sync`: a snapshot, a
readout), one evaluation per join fed since, never per event nor per batch: the join keeps the set of its open
requests that changed, and finalisation takes out whatever a request's row held when last evaluated.

**The window.** With bucket width ``w`` and the watermark ``wm`` in bucket ``B = floor(wm / w)``, the window of
``W`` seconds holds the buckets ``B - ceil(W / w) + 1`` and later, i.e. the requests served at or after
:meth:`RollingWindows.start` — the last ``W`` seconds of event time rounded to whole buckets — plus any served
ahead of the watermark (a partition may run ahead of the all-partition watermark). Buckets older than the
longest window are dropped when the watermark leaves them; later changes to their requests are ignored.
The default width is the shortest window / 30 (10 s for ``5m``).

**Window GAUC and GSB.** A session's AUC, and a GSB verdict, exist only once the session or the query bucket has
closed, long after the serve time of its requests. The windows therefore hold the sessions *scored*, and the GSB
verdicts *given*, while the all-partition watermark was in the bucket: window GAUC is the GAUC of the sessions that
closed in the last ``W`` seconds of event time (so it lags the request metrics by about ``attribution_window +
allowed_lateness``, plus ``session_gap`` for named sessions). They are taken, cheaply and exactly once, as the
change of the engine's own totals (``GroupStats.gauc``, ``GsbTracker.totals``) while the watermark stays in one
bucket: no second computation of AUCs or verdicts. GAUC's sum and count are the weighted sum of AUCs and the
sum of the session weights, so that ``sum / count`` is the GAUC and sums over workers stay exact. The session
measures (``QueriesPerSession``, ``Reformulation``) are held the same way, as columns after GAUC's: a window holds
the sessions that closed in it (a request without ``session_id`` closes its session of one when it is finalised).

Partitions: a partition's join that is dropped (rebalance) must leave the windows: call :meth:`RollingWindows.drop`
with it. While the engine is muted (rebuilding a partition), nothing is added; the rebuilt open requests stay in
the join's ``changed`` and enter the windows with the first unmuted :meth:`Engine.advance` of that join.

**Checkpoints.** :meth:`RollingWindows.share` gives the finalised part as JSON-ready data: the final values, the
sessions scored and verdicts given per bucket, what the next settle compares the engine's totals against, and
the watermark's bucket. ``share(full=True)`` gives every bucket and starts tracking changes afresh;
``share(full=False)`` only the buckets changed since (a small delta, for the checkpoint every second, with a full
share stored now and then). :meth:`RollingWindows.restore` puts a full share and its latest delta into the fresh
windows of a partition's next owner, whose engine's totals (``GroupStats.gauc``, the GSB tallies) are restored
alongside; the owner's muted re-read then rebuilds the open requests, which enter through
:meth:`RollingWindows.refresh` once it runs unmuted.
"""

from __future__ import annotations

import math
import os
from array import array
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from stream_eval.config import format_duration
from stream_eval.engine.compiled import cell_sums
from stream_eval.engine.gsb import GsbKey, gsb_key
from stream_eval.engine.plugins import EngineView, GroupTotals
from stream_eval.engine.times import array_from_json as _unarray
from stream_eval.engine.times import array_to_json as _array
from stream_eval.events.join import NO_ROW, UNGRADED, Finalised, Join
from stream_eval.events.schema import CompactRanking
from stream_eval.metrics.aggregates import Moments
from stream_eval.metrics.gsb import GsbCounts
from stream_eval.metrics.specs import GAUC

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
#: (experiment, arm, metric mean name, window label) -> (sum, count)
WindowSums = dict[tuple[str, str, str, str], tuple[float, float]]
#: (experiment, arm, segment field, segment value, metric mean name, window label) -> (sum, count)
SegmentWindowSums = dict[tuple[str, str, str, str, str, str], tuple[float, float]]
#: (experiment, treatment, source, window label) -> verdict counts
WindowVerdicts = dict[tuple[str, str, str, str], GsbCounts]
#: bucket -> group -> moments (the scored sessions)
Cells = dict[int, dict[int, Moments]]


class _Cell:
    """A (bucket, group) cell of per-request values (open or final): the rows of ``sums`` are each column's count,
    total and squared total, added by one numpy operation. The values have unit weight, so a ``Moments``' weight and
    squared weight are the count (as floats: exact); ``count``, ``weight``, ``weight_sq``, ``total`` and ``total_sq``
    read a cell as its ``Moments``."""

    __slots__ = ("sums",)

    def __init__(self, size: int) -> None:
        self.sums: Floats = np.zeros((3, size))

    @property
    def count(self) -> Floats:
        row: Floats = self.sums[0]
        return row

    weight = weight_sq = count

    @property
    def total(self) -> Floats:
        row: Floats = self.sums[1]
        return row

    @property
    def total_sq(self) -> Floats:
        row: Floats = self.sums[2]
        return row


#: bucket -> group -> cell (the open and the final values)
ValueCells = dict[int, dict[int, _Cell]]
_BUCKETS_PER_SHORTEST_WINDOW = 30
#: The format of :meth:`RollingWindows.share`.
SHARE_VERSION = 1
_FLOAT_FIELDS = ("weight", "weight_sq", "total", "total_sq")


def _has_row(requests: Finalised) -> npt.NDArray[np.bool_]:
    """Whether each open request needs a row of its own (it has grades, subtopics or no item: a zero-result request
    has other values), not the shared ungraded one."""
    special = np.fromiter((r.subtopics is not None or not r.n for r in requests.rankings), dtype=np.bool_,
                          count=len(requests))
    return requests.graded | special


def _numbered(keys: Ints) -> tuple[Ints, Ints]:
    """``np.unique(keys, return_inverse=True)`` of non-negative keys; without sorting when they span a small range
    (the windows' cells: a few hundred buckets of a few groups)."""
    span = int(keys.max()) + 1
    if span > 4 * keys.shape[0] + 4096:
        unique, inverse = np.unique(keys, return_inverse=True)
        return unique, inverse.reshape(-1)
    seen = np.zeros(span, dtype=np.bool_)
    seen[keys] = True
    unique = np.flatnonzero(seen)
    number = np.empty(span, dtype=np.int64)
    number[unique] = np.arange(unique.shape[0])
    return unique, number[keys]


def _pack(moments: Sequence[Moments] | Sequence[_Cell], size: int, unit: bool) -> dict[str, Any]:
    """``Moments`` of ``size`` metrics as two arrays with a row each: ``count``, and ``sums`` (weight, squared
    weight, total, squared total). ``unit``: of values of unit weight, whose weight and squared weight are their
    count; ``sums`` has only their total and squared total."""
    count = np.array([m.count for m in moments], dtype=np.int64).reshape(-1, size)
    if not count.size or (count.min() >= -(2**31) and count.max() < 2**31):
        count = count.astype(np.int32)  # half the bytes
    names = _FLOAT_FIELDS[2:] if unit else _FLOAT_FIELDS
    sums = np.array([[getattr(m, name) for name in names] for m in moments], dtype=np.float64)
    return {"count": _array(count), "sums": _array(sums.reshape(-1, len(names), size))}


def _unpack(data: dict[str, Any], size: int) -> list[Moments]:
    """The ``Moments`` that :func:`_pack` packed (``unit`` False)."""
    count = _unarray(data["count"]).astype(np.int64).reshape(-1, size)
    sums = _unarray(data["sums"]).reshape(-1, len(_FLOAT_FIELDS), size)
    out = []
    for i in range(count.shape[0]):
        m = Moments(size)
        m.count = count[i].copy()
        for k, name in enumerate(_FLOAT_FIELDS):
            setattr(m, name, sums[i, k].copy())
        out.append(m)
    return out


def _unpack_cells(data: dict[str, Any], size: int) -> list[_Cell]:
    """The cells that :func:`_pack` packed (``unit`` True)."""
    count = _unarray(data["count"]).astype(np.int64).reshape(-1, size)
    sums = _unarray(data["sums"]).reshape(-1, 2, size)
    out = []
    for i in range(count.shape[0]):
        cell = _Cell(size)
        cell.sums[0] = count[i]
        cell.sums[1:] = sums[i]
        out.append(cell)
    return out


class _CellSums:
    """The totals and weights of the cells of ``stores`` per group, over the buckets of a window: each cell's added
    in the stores' order, as adding their ``Moments`` one by one would (the same floats), but the cells are walked
    once for every window and added by numpy, not a ``Moments`` at a time."""

    def __init__(self, stores: Sequence[ValueCells], groups: int, size: int) -> None:
        self.groups, self.size = groups, size
        bucket: list[int] = []
        group: list[int] = []
        total: list[Floats] = []
        weight: list[Floats] = []
        for store in stores:
            for b, cells in store.items():
                bucket += [b] * len(cells)
                group += cells.keys()
                for moments in cells.values():
                    total.append(moments.total)
                    weight.append(moments.weight)
        self.bucket = np.array(bucket, dtype=np.int64)
        self.group = np.array(group, dtype=np.int64)
        self.total = np.array(total).reshape(-1, size)
        self.weight = np.array(weight).reshape(-1, size)

    def since(self, first: int) -> tuple[list[list[float]], list[list[float]]]:
        """Per group and column, the total and the weight of the cells of buckets ``first`` and later."""
        total, weight = np.zeros((self.groups, self.size)), np.zeros((self.groups, self.size))
        picked = self.bucket >= first
        np.add.at(total, self.group[picked], self.total[picked])  # (in order, row by row)
        np.add.at(weight, self.group[picked], self.weight[picked])
        return total.tolist(), weight.tolist()


class RollingWindows:
    """Rolling event-time windows over an :class:`~stream_eval.engine.engine.Engine`; attaches itself to it
    (a :class:`~stream_eval.engine.plugins.Plugin`).

    Args:
        engine: The engine to follow; ``engine.windows`` is this object from then on.
        windows: Window lengths in seconds (default: ``engine.config.windows``, i.e. 300 and 3600).
        width: Bucket width in seconds (default: the shortest window / 30).

    >>> from stream_eval.config import Config
    >>> from stream_eval.engine.engine import Engine
    >>> from stream_eval.events.schema import Feedback, Ranking
    >>> engine = Engine(Config())
    >>> windows = RollingWindows(engine)
    >>> engine.process([Ranking("r1", ["a", "b"], ts=100.0), Feedback("r1", "b", grade=1.0, ts=110.0)])
    >>> windows.snapshot(110.0)["default", "default", "MRR", "5m"]
    (0.5, 1.0)
    """

    role: ClassVar[str] = "windows"

    def __init__(self, engine: EngineView, windows: Sequence[float] | None = None, width: float | None = None) -> None:
        lengths = tuple(float(w) for w in (engine.config.windows if windows is None else windows))
        if not lengths or min(lengths) <= 0:
            raise ValueError(f"windows must be positive durations, got {lengths}")
        self.engine = engine
        self.width = float(width) if width is not None else min(lengths) / _BUCKETS_PER_SHORTEST_WINDOW
        if not self.width > 0:
            raise ValueError(f"bucket width must be positive, got {self.width}")
        self.windows = lengths
        self.labels = tuple(format_duration(w) for w in lengths)
        self._spans = tuple(max(1, math.ceil(w / self.width - 1e-9)) for w in lengths)
        self.size = len(engine.specs)
        # the sessions' columns: GAUC's (0), then each session measure's
        self._session_columns = [j for j, spec in enumerate(engine.specs) if spec.per_session]
        self._session_size = 1 + len(self._session_columns)
        self.watermark = -math.inf
        self._current: int | None = None  # bucket of the watermark
        self._floor = -(2**62)  # buckets below are dropped for good
        self._cells: ValueCells = {}  # bucket -> group -> current values of the open requests
        self._final: ValueCells = {}  # bucket -> group -> final values of the finalised requests
        self._sessions: Cells = {}  # bucket -> group -> session AUCs scored
        self._verdicts: dict[int, dict[GsbKey, GsbCounts]] = {}  # bucket -> (experiment, treatment, source)
        # segment groups (config segments): the open and final values again, per (bucket, segment group)
        self._segment_fields = len(engine.segment_fields)
        self._segment_cells: ValueCells = {}
        self._segment_final: ValueCells = {}
        self._gauc_seen = {g: self._session_totals(stats) for g, stats in enumerate(engine.groups)}  # at last settle
        self._gsb_seen = engine.gsb.totals(engine.arms_of)
        self._share_id: str | None = None  # of the last full share (taken or restored)
        self._changed: set[int] = set()  # buckets of _final, _sessions or _verdicts changed since
        # One row per open request with grades (or subtopics): arrays grown by doubling; the join keeps each
        # request's row (Join.set_rows).
        self._rows = 0
        self._free = array("q")
        self._ungraded: Floats | None = None  # the values of a request without grades or subtopics
        self._held = 0  # open requests in the windows (with a row or ungraded)
        self._values: Floats = np.zeros((0, self.size))
        self._bucket: Ints = np.zeros(0, dtype=np.int64)
        self._group: Ints = np.zeros(0, dtype=np.int64)
        self._segment: Ints = np.zeros((0, self._segment_fields), dtype=np.int64)
        # an ungraded request's segment groups, as a code in its join row (UNGRADED - code): code -> segment groups
        self._combos: Ints = np.zeros((1, self._segment_fields), dtype=np.int64)  # (code 0: none, without fields)
        self._combo_of: dict[tuple[int, ...], int] = {}
        self.with_subtopics = False
        # joins fed since the windows were last read: their open requests are re-evaluated when the windows are
        # read (:meth:`sync`), once for many batches, not after every batch
        self._stale: dict[int, Join] = {}
        engine.attach(self)

    # -- engine hooks (engine/plugins.py) -------------------------------------------------------------
    def opened(self, join: Join) -> None:
        """Nothing to do: a join's open requests enter at its first :meth:`refresh`."""

    def advanced(self, join: Join, muted: bool) -> None:
        """A batch went into ``join``: its open requests are re-evaluated (:meth:`refresh`) at the next read of the
        windows (not while muted: rebuilt requests stay in ``changed``). Finalisation needs no refresh first: it
        takes out what each request's row holds, whenever that was evaluated."""
        if not muted:
            self._stale[id(join)] = join

    def sync(self) -> None:
        """:meth:`refresh` every join fed since the last read: the open values as if refreshed after each batch
        (up to the order of floating-point additions)."""
        stale, self._stale = self._stale, {}
        for join in stale.values():
            self.refresh(join)

    def refresh(self, join: Join) -> None:
        """Re-evaluate the open requests of ``join`` that are new or whose grades changed (one batch)."""
        changed = join.changed
        if changed is None:  # the join's first refresh: start tracking; everything open is new to the windows
            join.changed = set()
            slots = join.open_slots()
        else:
            slots = np.array(sorted(changed), dtype=np.int64)
            changed.clear()
        if not slots.shape[0]:
            return
        requests = join.current(slots)
        own = _has_row(requests)
        values = np.empty((len(requests), self.size))
        if not own.all():
            if self._ungraded is None:
                first = int(np.flatnonzero(~own)[0])
                self._ungraded = self.engine.evaluate_finalised(requests.split_at([first]))[0][0]
            values[~own] = self._ungraded
        if own.any():
            values[own] = self.engine.evaluate_finalised(requests.split_at(np.flatnonzero(own).tolist()))[0]
        join.set_rows(slots, self._replace(requests, self._groups(requests.rankings), values, final=False, own=own))

    def _groups(self, rankings: Sequence[CompactRanking]) -> Ints:
        return self.engine.groups_of(rankings)

    def finalised(self, requests: Finalised, group: Ints, values: Floats) -> None:
        """Replace the rows of requests just finalised by their final values (they keep no row)."""
        self._replace(requests, group, values, final=True)

    def closed(self, watermark: float) -> None:
        """The all-partition watermark moved: settle scored sessions and verdicts, drop old buckets."""
        if not math.isfinite(watermark):
            self._settle()
            return
        if watermark <= self.watermark:
            return
        self.watermark = watermark
        bucket = self._bucket_of(watermark)
        if bucket == self._current:
            return
        if self._current is not None:
            self._settle()
        self._current = bucket
        floor = bucket - max(self._spans) + 1
        if floor > self._floor:
            self._floor = floor
            for store in (self._cells, self._final, self._sessions, self._verdicts, self._segment_cells,
                          self._segment_final):
                for old in [b for b in store if b < floor]:
                    del store[old]
            self._changed = {b for b in self._changed if b >= floor}

    def drop(self, join: Join) -> None:
        """Take the open requests of a partition's ``join`` out of the windows (the partition was revoked)."""
        self._stale.pop(id(join), None)
        requests = join.current(join.open_slots())
        self._revert(requests)
        join.set_rows(requests.slots, np.full(len(requests), NO_ROW, dtype=np.int64))
        if join.changed is not None:
            join.changed.clear()

    # -- reading ----------------------------------------------------------------------------------------
    def start(self, watermark: float, seconds: float) -> float:
        """Earliest serve time in the window of ``seconds`` (one of :attr:`windows`) at ``watermark``."""
        span = self._spans[self.windows.index(float(seconds))]
        return (self._bucket_of(watermark) - span + 1) * self.width

    def snapshot(self, watermark: float | None = None, sync: bool = True) -> WindowSums:
        """``(sum, count)`` per (experiment, arm, metric mean name, window label), for every known group.

        Metrics are the means of the per-request metrics (``MRR``, ``MAP``, ``nDCG@10``, ...; alpha-nDCG once a
        ranking with subtopics was seen) and ``GAUC``. Does not change the windows, but for the open requests
        re-evaluated first (:meth:`sync`; ``sync`` False: not, they count as last evaluated).
        """
        if sync:
            self.sync()
        watermark = self.watermark if watermark is None else watermark
        engine = self.engine
        columns = [
            (j, spec.mean_name)
            for j, spec in enumerate(engine.specs)
            if (not spec.needs_subtopics or self.with_subtopics or engine.with_subtopics) and not spec.per_session
        ]
        session_names = [engine.specs[j].mean_name for j in self._session_columns]
        pending = self._pending_sessions()
        out: WindowSums = {}
        if not math.isfinite(watermark):
            return out
        current = self._bucket_of(watermark)
        sums = _CellSums((self._cells, self._final), len(engine.group_keys), self.size)
        for label, span in zip(self.labels, self._spans, strict=True):
            first = current - span + 1
            total, weight = sums.since(first)
            sessions = [Moments(self._session_size) for _ in engine.group_keys]
            for b, cells in self._sessions.items():
                if b >= first:
                    for g, moments in cells.items():
                        sessions[g] += moments
            if self._current is not None and self._current >= first:
                for g, moments in pending.items():
                    sessions[g] += moments
            for g, (experiment, arm) in enumerate(engine.group_keys):
                for j, name in columns:
                    out[experiment, arm, name, label] = (total[g][j], weight[g][j])
                out[experiment, arm, GAUC, label] = (float(sessions[g].total[0]), float(sessions[g].weight[0]))
                for k, name in enumerate(session_names, start=1):
                    out[experiment, arm, name, label] = (float(sessions[g].total[k]), float(sessions[g].weight[k]))
        return out

    def segment_snapshot(self, watermark: float | None = None, sync: bool = True) -> SegmentWindowSums:
        """``(sum, count)`` per (experiment, arm, segment field, segment value, metric mean name, window label), for
        every known segment group: the per-request measures only (no GAUC, no session measure); ``sync`` as
        :meth:`snapshot`'s."""
        if sync:
            self.sync()
        watermark = self.watermark if watermark is None else watermark
        engine = self.engine
        out: SegmentWindowSums = {}
        if not math.isfinite(watermark) or not self._segment_fields:
            return out
        columns = [
            (j, spec.mean_name)
            for j, spec in enumerate(engine.specs)
            if (not spec.needs_subtopics or self.with_subtopics or engine.with_subtopics) and not spec.per_session
        ]
        current = self._bucket_of(watermark)
        sums = _CellSums((self._segment_cells, self._segment_final), len(engine.segment_keys), self.size)
        for label, span in zip(self.labels, self._spans, strict=True):
            total, weight = sums.since(current - span + 1)
            for g, key in enumerate(engine.segment_keys):
                for j, name in columns:
                    out[(*key, name, label)] = (total[g][j], weight[g][j])
        return out

    def verdicts(self, watermark: float | None = None) -> WindowVerdicts:
        """GSB verdicts given in each window, per (experiment, treatment, source, window label)."""
        watermark = self.watermark if watermark is None else watermark
        out: WindowVerdicts = {}
        if not math.isfinite(watermark):
            return out
        current = self._bucket_of(watermark)
        pending = self._pending_verdicts()
        for label, span in zip(self.labels, self._spans, strict=True):
            first = current - span + 1
            for key in self._gsb_seen.keys() | pending.keys():
                out[(*key, label)] = GsbCounts()
            for b, cells in self._verdicts.items():
                if b >= first:
                    for key, counts in cells.items():
                        out[(*key, label)] += counts
            if self._current is not None and self._current >= first:
                for key, counts in pending.items():
                    out[(*key, label)] += counts
        return out

    @property
    def open_rows(self) -> int:
        """Open requests the windows hold (with a row of their own, or ungraded)."""
        self.sync()
        return self._held

    # -- checkpoints ------------------------------------------------------------------------------------
    def share(self, full: bool) -> dict[str, Any]:
        """The finalised part of the windows as JSON-ready data (orjson; arrays as their raw bytes, bit for bit).

        ``full``: every bucket, and changes are tracked afresh from here. Else only the buckets whose final
        values, scored sessions or verdicts changed since the last full share (taken or restored), which
        :meth:`restore` applies over that full share. Either way with the watermark's bucket and what the next
        settle compares the engine's totals against. Groups are named by their (experiment, arm).

        Raises:
            ValueError: ``full`` is False and no full share was taken or restored yet.
        """
        if full:
            self._share_id = os.urandom(8).hex()
            self._changed = set()
            buckets = sorted(b for b in self._final.keys() | self._sessions.keys() | self._verdicts.keys()
                             if b >= self._floor)
        elif self._share_id is None:
            raise ValueError("no full share to build on: take share(full=True) first")
        else:
            buckets = sorted(b for b in self._changed if b >= self._floor)
        final = [(b, g, m) for b in buckets for g, m in sorted(self._final.get(b, {}).items())]
        segment_final = [(b, g, m) for b in buckets for g, m in sorted(self._segment_final.get(b, {}).items())]
        sessions = [(b, g, m) for b in buckets for g, m in sorted(self._sessions.get(b, {}).items())]
        seen = sorted(self._gauc_seen.items())
        return {
            "version": SHARE_VERSION,
            "full": full,
            "id" if full else "base": self._share_id,
            "width": self.width,
            "metrics": [spec.name for spec in self.engine.specs],
            "watermark": self.watermark if math.isfinite(self.watermark) else None,
            "current": self._current,
            "floor": self._floor,
            "with_subtopics": self.with_subtopics,
            "groups": [[experiment, arm] for experiment, arm in self.engine.group_keys],
            "buckets": buckets,
            "final": {"bucket": [b for b, _, _ in final], "group": [g for _, g, _ in final],
                      **_pack([m for _, _, m in final], self.size, unit=True)},
            "sessions": {"bucket": [b for b, _, _ in sessions], "group": [g for _, g, _ in sessions],
                         **_pack([m for _, _, m in sessions], self._session_size, unit=False)},
            "verdicts": [[b, *key, c.good, c.same, c.bad]
                         for b in buckets for key, c in sorted(self._verdicts.get(b, {}).items())],
            "gauc_seen": {"group": [g for g, _ in seen], **_pack([m for _, m in seen], self._session_size,
                                                                 unit=False)},
            "gsb_seen": [[*key, c.good, c.same, c.bad] for key, c in sorted(self._gsb_seen.items())],
            **({"segments": [list(key) for key in self.engine.segment_keys],
                "segment_final": {"bucket": [b for b, _, _ in segment_final], "group": [g for _, g, _ in segment_final],
                                  **_pack([m for _, _, m in segment_final], self.size, unit=True)}}
               if self._segment_fields else {}),
        }

    def restore(self, full: dict[str, Any], delta: dict[str, Any] | None = None) -> None:
        """Put a full :meth:`share`, then a later delta of it, into these fresh windows (a partition's new owner).

        The delta's buckets replace the full share's, buckets below the delta's floor are dropped, and the
        watermark's bucket and what the next settle compares against are the delta's. Groups are found by their
        (experiment, arm) with ``engine.group_of``. Shares to come (:meth:`share` with ``full`` False) build on
        ``full``, so the owner may go on storing deltas of it.

        The engine's own totals are the caller's: its ``GroupStats.gauc`` and GSB tallies (with the arms and
        teams seen, which resolve interleaving verdicts) must be the ones checkpointed with the share before the
        engine next closes event time (:meth:`Engine.close`, also while muted) or the windows are read; before or
        after this call. The open requests, rebuilt muted, enter through :meth:`refresh` (the first unmuted
        :meth:`Engine.process` of their join).

        Raises:
            ValueError: The shares do not fit these windows or each other (another bucket width or metrics, a
                delta of another full share), or the windows already hold something.
        """
        if not full.get("full"):
            raise ValueError("restore needs a full share, then optionally a delta of it")
        self._check(full)
        if delta is not None:
            self._check(delta)
            if delta.get("full") or delta.get("base") != full.get("id"):
                raise ValueError("the delta is not a change of this full share")
        if self._held or self._final or self._sessions or self._verdicts or self._segment_final:
            raise ValueError("restore into fresh windows (before the engine closes event time or adds requests)")
        final: ValueCells = {}
        sessions: Cells = {}
        segment_final: ValueCells = {}
        verdicts: dict[int, dict[GsbKey, GsbCounts]] = {}
        last = full
        for share in (full, delta):
            if share is None:
                continue
            last = share
            groups = [self.engine.group_of(experiment, arm) for experiment, arm in share["groups"]]
            for b in share["buckets"]:  # a delta's buckets replace the full share's
                for store in (final, sessions, verdicts, segment_final):
                    store.pop(b, None)
            if "segment_final" in share:
                segments = [self.engine.segment_of(*key) for key in share["segments"]]
                part = share["segment_final"]
                for b, g, cell in zip(part["bucket"], part["group"], _unpack_cells(part, self.size), strict=True):
                    segment_final.setdefault(b, {})[segments[g]] = cell
            part = share["final"]
            for b, g, cell in zip(part["bucket"], part["group"], _unpack_cells(part, self.size), strict=True):
                final.setdefault(b, {})[groups[g]] = cell
            part = share["sessions"]
            for b, g, moments in zip(part["bucket"], part["group"], _unpack(part, self._session_size), strict=True):
                sessions.setdefault(b, {})[groups[g]] = moments
            for b, *key, good, same, bad in share["verdicts"]:
                verdicts.setdefault(b, {})[gsb_key(key)] = GsbCounts(good, same, bad)
        floor = int(last["floor"])
        self._final = {b: cells for b, cells in final.items() if b >= floor}
        self._sessions = {b: cells for b, cells in sessions.items() if b >= floor}
        self._verdicts = {b: cells for b, cells in verdicts.items() if b >= floor}
        self._segment_final = {b: cells for b, cells in segment_final.items() if b >= floor}
        self._changed = {b for b in (delta or {}).get("buckets", ()) if b >= floor}
        self._share_id = full["id"]
        self._floor = floor
        self._current = None if last["current"] is None else int(last["current"])
        self.watermark = -math.inf if last["watermark"] is None else float(last["watermark"])
        self.with_subtopics = bool(last["with_subtopics"])
        groups = [self.engine.group_of(experiment, arm) for experiment, arm in last["groups"]]
        seen = last["gauc_seen"]
        self._gauc_seen = {groups[g]: moments
                           for g, moments in zip(seen["group"], _unpack(seen, self._session_size),
                                                 strict=True)}
        self._gsb_seen = {gsb_key(key): GsbCounts(good, same, bad) for *key, good, same, bad in last["gsb_seen"]}

    def _check(self, share: dict[str, Any]) -> None:
        """Raise ValueError unless ``share`` fits these windows (format, bucket width, metric columns)."""
        if share.get("version") != SHARE_VERSION:
            raise ValueError(f"unknown windows share format {share.get('version')!r}")
        if share["width"] != self.width:
            raise ValueError(f"the share has buckets of {share['width']} s, these windows of {self.width} s")
        metrics = [spec.name for spec in self.engine.specs]
        if share["metrics"] != metrics:
            raise ValueError(f"the share has the metrics {share['metrics']}, these windows {metrics}")

    # -- internals --------------------------------------------------------------------------------------
    def _bucket_of(self, ts: float) -> int:
        return math.floor(ts / self.width)

    def _buckets(self, serve: Floats) -> Ints:
        """The bucket of each serve time (the join's ``serve`` is each ranking's ``ts``)."""
        out: Ints = np.floor(serve / self.width).astype(np.int64)
        return out

    def _ungraded_rows(self, n: int) -> Floats:
        """``n`` rows of the values every request without grades or subtopics has (known once one was seen)."""
        return np.tile(self._ungraded, (n, 1))  # type: ignore[arg-type]  # set with the first such request

    def _revert(self, requests: Finalised) -> None:
        """Take the current contribution of requests out of the cells: their rows (``NO_ROW``: not held; ungraded:
        ``UNGRADED - code``, the code of their segment groups)."""
        rows = requests.rows
        stored = rows[rows >= 0]
        if stored.shape[0]:
            self._apply(self._cells, self._bucket[stored], self._group[stored], self._values[stored], -1)
            if self._segment_fields:
                self._apply_segments(self._segment_cells, self._bucket[stored], self._segment[stored],
                                     self._values[stored], -1)
            self._free.extend(stored.tolist())
        ungraded = np.flatnonzero(rows <= UNGRADED)
        if ungraded.shape[0]:
            picked = ungraded.tolist()
            buckets, values = self._buckets(requests.serve[ungraded]), self._ungraded_rows(len(picked))
            self._apply(self._cells, buckets, self._groups([requests.rankings[i] for i in picked]), values, -1)
            if self._segment_fields:
                self._apply_segments(self._segment_cells, buckets, self._combos[UNGRADED - rows[ungraded]], values, -1)
        self._held -= int((rows != NO_ROW).sum())

    def _replace(self, requests: Finalised, group: Ints, values: Floats, final: bool,
                 own: npt.NDArray[np.bool_] | None = None) -> Ints:
        """Revert the requests' rows, add their values; returns their new rows (``final``: none)."""
        rankings = requests.rankings
        segments = self.segments(requests, group) if self._segment_fields else None  # (before their rows are freed)
        self._revert(requests)
        rows = np.full(len(rankings), NO_ROW, dtype=np.int64)
        bucket_i = self._buckets(requests.serve)
        live = bucket_i >= self._floor
        if not self.with_subtopics and any(r.subtopics is not None for r in rankings):
            self.with_subtopics = True
        if live.any():
            self._apply(self._final if final else self._cells, bucket_i[live], group[live], values[live], 1)
            if segments is not None:
                self._apply_segments(self._segment_final if final else self._segment_cells, bucket_i[live],
                                     segments[live], values[live], 1)
            if not final:
                self._held += int(live.sum())
                rows[live] = UNGRADED if segments is None else UNGRADED - self._codes(segments[live])
                stored = np.flatnonzero(live & own) if own is not None else np.flatnonzero(live)
                rows[stored] = self._store(bucket_i[stored], group[stored], values[stored],
                                           None if segments is None else segments[stored])
        return rows

    def segments(self, requests: Finalised, group: Ints) -> Ints:
        """The segment groups of requests (of groups ``group``; ``Engine.segments_of``), looked up once per request:
        when the windows first take it; then kept in its row, or as the code of its join row while ungraded (also
        for the engine's counts when it finalises them, before the windows take their rows)."""
        rows = requests.rows
        out = np.empty((len(rows), self._segment_fields), dtype=np.int64)
        stored = rows >= 0
        out[stored] = self._segment[rows[stored]]
        ungraded = rows <= UNGRADED
        out[ungraded] = self._combos[UNGRADED - rows[ungraded]]
        new = np.flatnonzero(rows == NO_ROW)
        if new.shape[0]:
            rankings = requests.rankings
            if new.shape[0] == len(rankings):
                out[new] = self.engine.segments_of(rankings, group)
            else:
                out[new] = self.engine.segments_of([rankings[i] for i in new.tolist()], group[new])
        return out

    def _codes(self, segments: Ints) -> Ints:
        """The code of each request's segment groups (one of each segment field), new combinations numbered as met."""
        n_segments = len(self.engine.segment_keys)
        if n_segments ** self._segment_fields < 2**62:  # each combination as one integer
            _, first, inverse = np.unique(segments @ n_segments ** np.arange(self._segment_fields), return_index=True,
                                          return_inverse=True)
            combos = segments[first]
        else:
            combos, inverse = np.unique(segments, axis=0, return_inverse=True)
        codes = []
        for combo in map(tuple, combos.tolist()):
            code = self._combo_of.get(combo)
            if code is None:
                code = self._combo_of[combo] = len(self._combo_of)
                if code >= self._combos.shape[0]:
                    self._combos = np.concatenate([self._combos, np.zeros_like(self._combos)])
                self._combos[code] = combo
            codes.append(code)
        out: Ints = np.array(codes, dtype=np.int64)[inverse.reshape(-1)]
        return out

    def _apply_segments(self, store: ValueCells, bucket: Ints, segments: Ints, values: Floats, sign: int) -> None:
        """:meth:`_apply` for the segment groups: each request's values go to its group of each segment field."""
        n_fields = self._segment_fields
        self._apply(store, np.repeat(bucket, n_fields), segments.reshape(-1), np.repeat(values, n_fields, axis=0),
                    sign)

    def _apply(self, store: ValueCells, bucket: Ints, group: Ints, values: Floats, sign: int) -> None:
        """Add (``sign`` 1) or revert (-1) rows of values into their (bucket, group) cells of ``store`` (the open
        or the final values); a cell left with no value is removed (its sums are zero)."""
        live = bucket >= self._floor
        if not live.all():
            bucket, group, values = bucket[live], group[live], values[live]
        if not bucket.size:
            return
        # the (bucket, group) cells, in that order, as one integer each
        first, groups = int(bucket.min()), int(group.max()) + 1
        cell_keys, inverse = _numbered((bucket - first) * groups + group)
        keys = np.stack([cell_keys // groups + first, cell_keys % groups], axis=1)
        count, total, total_sq = cell_sums(inverse, values, cell_keys.shape[0])
        sums = np.stack([count.astype(np.float64), total, total_sq], axis=1)  # (cells, 3, columns)
        if sign < 0:
            np.negative(sums, out=sums)
        size = self.size
        for (b, g), added in zip(keys.tolist(), sums, strict=True):
            cells = store.get(b)
            if cells is None:
                cells = store[b] = {}
            cell = cells.get(g)
            if cell is None:
                cell = cells[g] = _Cell(size)
            cell.sums += added
            if sign < 0 and not cell.sums[0].any():  # every value reverted: exactly nothing (no rounding residue)
                del cells[g]
                if not cells:
                    del store[b]
        if store is self._final or store is self._segment_final:
            self._changed.update(np.unique(keys[:, 0]).tolist())

    def _store(self, bucket: Ints, group: Ints, values: Floats, segments: Ints | None = None) -> Ints:
        """Rows for these values (and the requests' segment groups); returns them."""
        need = bucket.shape[0] - len(self._free)
        if need > 0:
            self._grow(need)
        index = np.array([self._free.pop() for _ in range(bucket.shape[0])], dtype=np.int64)
        self._values[index] = values
        self._bucket[index] = bucket
        self._group[index] = group
        if segments is not None:
            self._segment[index] = segments
        return index

    def _grow(self, need: int) -> None:
        old = self._rows
        new = max(2 * old, old + need, 64)
        self._values = np.concatenate([self._values, np.zeros((new - old, self.size))])
        self._bucket = np.concatenate([self._bucket, np.zeros(new - old, dtype=np.int64)])
        self._group = np.concatenate([self._group, np.zeros(new - old, dtype=np.int64)])
        self._segment = np.concatenate([self._segment, np.zeros((new - old, self._segment_fields), dtype=np.int64)])
        self._rows = new
        self._free.extend(range(new - 1, old - 1, -1))

    def _session_totals(self, stats: GroupTotals) -> Moments:
        """A group's totals of what closing sessions count: GAUC's moments, then the session measures' columns."""
        if not self._session_columns:
            return stats.gauc.copy()
        out = Moments(self._session_size)
        columns, moments = self._session_columns, stats.moments
        for name in ("count", "weight", "weight_sq", "total", "total_sq"):
            mine = getattr(out, name)
            mine[0] = getattr(stats.gauc, name)[0]
            mine[1:] = getattr(moments, name)[columns]
        return out

    def _pending_sessions(self) -> dict[int, Moments]:
        """Sessions scored since the last settle, per group (the engine's GAUC and session measures' moments minus
        those seen)."""
        out: dict[int, Moments] = {}
        for g, stats in enumerate(self.engine.groups):
            seen = self._gauc_seen.get(g)
            now = self._session_totals(stats)
            if seen is None:
                if now.count.any():
                    out[g] = now
            elif now != seen:
                out[g] = now - seen
        return out

    def _pending_verdicts(self) -> dict[GsbKey, GsbCounts]:
        totals = self.engine.gsb.totals(self.engine.arms_of)
        out: dict[GsbKey, GsbCounts] = {}
        for key, counts in totals.items():
            seen = self._gsb_seen.get(key)
            delta = counts if seen is None else counts - seen
            if delta.good or delta.same or delta.bad:
                out[key] = delta
        return out

    def _settle(self) -> None:
        """Put what was scored and judged since the last settle into the bucket of the watermark."""
        sessions = self._pending_sessions()
        verdicts = self._pending_verdicts()
        if self._current is not None and self._current >= self._floor:
            if sessions or verdicts:
                self._changed.add(self._current)
            if sessions:
                cells = self._sessions.setdefault(self._current, {})
                for g, moments in sessions.items():
                    if g in cells:
                        cells[g] += moments
                    else:
                        cells[g] = moments
            if verdicts:
                gsb_cells = self._verdicts.setdefault(self._current, {})
                for key, counts in verdicts.items():
                    gsb_cells[key] = gsb_cells.get(key, GsbCounts()) + counts
        self._gauc_seen = {g: self._session_totals(stats) for g, stats in enumerate(self.engine.groups)}
        self._gsb_seen = self.engine.gsb.totals(self.engine.arms_of)
