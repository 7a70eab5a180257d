"""Sessions and per-query GSB across workers: finalised requests regrouped through one ordered log.

A session's requests (and a query's requests, for GSB source ``metric``) can sit in input partitions owned by
different workers. So, when streaming, each worker hands the part of a finalised request that needs
regrouping to a :class:`RegroupSink` instead of keeping it: the served items' scores and relevance of a
request of a *named* session, the request's ``gsb_metric`` value for its query, the arms it has seen. The
worker writes these records, followed by the finalisation watermark of each input partition it owns, to one
ordered log (a one-partition topic). The worker that owns that log runs the :class:`SessionStage`: it adds the
parts to the engine's :class:`~stream_eval.engine.sessions.Sessions` and GSB tallies — the same objects and
functions replay uses — and closes them on the minimum of the partitions' finalisation watermarks, which is
when every request of a session or query bucket that closes has been finalised and its record written.

The stage is recoverable the same way as an input partition (``engine/partitions.py``): its checkpoint holds
the offset of the first record that an open session or query bucket still needs, the offset after the last
record counted, the partitions' watermarks and the arms seen; a new owner re-reads muted up to there.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import orjson

from stream_eval.engine.partitions import time_to_json
from stream_eval.engine.sessions import Impressions, unit_of
from stream_eval.engine.snapshot import restore

Floats = npt.NDArray[np.float64]
#: Rows of A/B unit contributions per regroup record (~150 KB of JSON: far below Kafka's 1 MB default).
UNIT_ROWS = 1000

if TYPE_CHECKING:
    from stream_eval.engine.engine import Engine
    from stream_eval.events.schema import CompactRanking


class RegroupSink:
    """Collects, in order, the records a worker writes to the regroup log (JSON bytes, key)."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []
        self._arms: set[tuple[str, str]] = set()

    def session_part(self, state: CompactRanking, experiment: str, arm: str, impressions: Impressions, i: int) -> None:
        a, b = int(impressions.starts[i]), int(impressions.starts[i + 1])
        record = {"k": "s", "id": state.session_id, "e": experiment, "a": arm, "t": state.ts,
                  "s": impressions.scores[a:b].tolist(), "r": impressions.relevant_positions(i),
                  "u": unit_of(state)}
        self.records.append((str(state.session_id).encode(), orjson.dumps(record)))

    def unit_requests(self, keys: Floats, ids: list[str], experiments: list[str], arms: list[str],
                      units: list[str], values: Floats) -> None:
        """Finalised requests' share of their A/B units (``engine/ab.py``), as columns: one record per
        :data:`UNIT_ROWS` requests (NaN is written as null)."""
        for a in range(0, len(ids), UNIT_ROWS):
            b = a + UNIT_ROWS
            self.records.append((b"", orjson.dumps({"k": "U", "t": keys[a:b].tolist(), "id": ids[a:b],
                                                    "e": experiments[a:b], "a": arms[a:b], "u": units[a:b],
                                                    "v": values[a:b].tolist()})))

    def unit_sessions(self, keys: Floats, ids: list[str], experiments: list[str], arms: list[str],
                      units: list[str], weighted_auc: Floats, weight: Floats) -> None:
        """Scored one-request sessions' share of their A/B units, as columns (as :meth:`unit_requests`)."""
        for a in range(0, len(ids), UNIT_ROWS):
            b = a + UNIT_ROWS
            self.records.append((b"", orjson.dumps({"k": "V", "t": keys[a:b].tolist(), "id": ids[a:b],
                                                    "e": experiments[a:b], "a": arms[a:b], "u": units[a:b],
                                                    "y": weighted_auc[a:b].tolist(), "w": weight[a:b].tolist()})))

    def query_metric(self, experiment: str, arm: str, query_id: str, ts: float, value: float) -> None:
        record = {"k": "q", "e": experiment, "a": arm, "q": query_id, "t": ts, "v": value}
        self.records.append((query_id.encode(), orjson.dumps(record)))

    def judgment(self, experiment: str, verdict: str) -> None:
        self.records.append((experiment.encode(), orjson.dumps({"k": "j", "e": experiment, "v": verdict})))

    def interleaved(self, experiment: str, teams: list[str], relevant_positions: list[int]) -> None:
        self.records.append((experiment.encode(), orjson.dumps({"k": "i", "e": experiment, "teams": teams,
                                                                 "r": relevant_positions})))

    def arm(self, experiment: str, arm: str) -> None:
        if (experiment, arm) not in self._arms:
            self._arms.add((experiment, arm))
            self.records.append((experiment.encode(), orjson.dumps({"k": "a", "e": experiment, "a": arm})))

    def watermark(self, unit: int, watermark: float) -> None:
        """Every request of input partition ``unit`` finalised by ``watermark`` has its records above."""
        self.records.append((b"", orjson.dumps({"k": "w", "u": unit, "t": time_to_json(watermark)})))

    def take(self) -> list[tuple[bytes, bytes]]:
        records, self.records = self.records, []
        return records


class _Part:
    """A request of a named session as the stage sees it (what Sessions, Impressions and unit_of read)."""

    __slots__ = ("session_id", "ts", "n", "scores", "unit_id", "teams", "request_id")

    def __init__(self, session_id: str, ts: float, scores: list[float], unit: str | None) -> None:
        self.session_id = session_id
        self.ts = ts
        self.n = len(scores)
        self.scores = scores
        # unit_of(part) gives ``unit`` back: None (a session of no split: interleaved) through ``teams``
        self.unit_id = unit
        self.teams: list[str] | None = [] if unit is None else None
        self.request_id = session_id


@dataclass
class StageCheckpoint:
    start: int = 0
    processed: int = 0
    units: list[float] = field(default_factory=list)  # the partitions' watermarks just before ``start``
    arms: list[tuple[str, str]] = field(default_factory=list)
    # The latest snapshot of the stage-held state (engine/snapshot.py): where its records are in the snapshot
    # topic (first offset, count), and the log offset it covers (every record before it is in the snapshot).
    snapshot: tuple[int, int] | None = None
    snapshot_at: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "processed": self.processed,
                "units": [time_to_json(u) for u in self.units], "arms": self.arms,
                "snapshot": None if self.snapshot is None else list(self.snapshot), "snapshot_at": self.snapshot_at}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageCheckpoint:
        snapshot = data.get("snapshot")
        return cls(int(data["start"]), int(data["processed"]), [float(u) for u in data["units"]],
                   [(str(e), str(a)) for e, a in data["arms"]],
                   None if snapshot is None else (int(snapshot[0]), int(snapshot[1])), int(data.get("snapshot_at", 0)))


class SessionStage:
    """Feeds regrouped records to an engine's sessions and GSB tallies; closes them on the units' watermark."""

    def __init__(self, engine: Engine, units: int, checkpoint: StageCheckpoint | None = None,
                 snapshot: bytes | None = None) -> None:
        """``snapshot``: the data of ``checkpoint.snapshot`` (required when the checkpoint names one)."""
        self.engine = engine
        self.units = [-math.inf] * units
        self.watermark = -math.inf
        self.received: int | None = None
        self.muted_until = -1
        # (offset, "s"|"q", session id | bucket) of records whose session or bucket may still be open: a heap
        self._needed: list[tuple[int, str, Any]] = []
        # Session parts received but not added: (deadline, offset, record). They are added in deadline order
        # once every partition is past their deadline, as one engine finalises them in replay: whether a
        # request starts a new session depends on the order (see Sessions.add).
        self._waiting: list[tuple[float, int, dict[str, Any]]] = []
        self._horizon = engine.config.attribution_window + engine.config.allowed_lateness
        # The partitions' watermarks after each watermark record: a checkpoint stores them as they were just
        # before its ``start``, so that a rebuild from there closes sessions exactly where they closed.
        self._history: deque[tuple[int, tuple[float, ...]]] = deque()
        self._base: tuple[float, ...] = tuple(self.units)
        if checkpoint is not None:
            self.units = list(checkpoint.units) + [-math.inf] * (units - len(checkpoint.units))
            self._base = tuple(self.units)
            self.watermark = min(self.units)
            self.muted_until = checkpoint.processed
            for experiment, arm in checkpoint.arms:
                engine.arms_seen.setdefault(experiment, set()).add(arm)
        # Records before ``frozen_until`` are in the restored snapshot: they leave its state alone on a rebuild.
        # (where it is stored, the offset it covers, the offset a rebuild from it starts at)
        self.snapshot_ref: tuple[tuple[int, int], int, int] | None = None
        self.frozen_until = 0
        if checkpoint is not None and checkpoint.snapshot is not None:
            if snapshot is None:
                raise ValueError("the stage checkpoint names a snapshot: pass its data")
            restore(engine, snapshot)
            self.snapshot_ref = (checkpoint.snapshot, checkpoint.snapshot_at, checkpoint.start)
            self.frozen_until = checkpoint.snapshot_at

    def checkpoint(self) -> StageCheckpoint:
        processed = max(self.received or 0, self.muted_until)
        arms = sorted((e, a) for e, arms in self.engine.arms_seen.items() for a in arms)
        snapshot, snapshot_at, snapshot_start = self.snapshot_ref if self.snapshot_ref is not None else (None, 0, 0)
        if self.engine.ledger.experiments and snapshot is None:
            # The A/B units are cumulative since each experiment's first event: until a snapshot of them is
            # stored, a new owner rebuilds them (and everything else, muted) from the start of the log.
            return StageCheckpoint(0, processed, [], arms)
        needed = self._first_needed()
        start = min(needed, processed) if needed is not None else processed
        if snapshot is not None:
            # a rebuild re-reads what the sessions and query buckets open at the snapshot need: those that closed
            # since gave their share after the snapshot, from records before it
            start = min(start, snapshot_start)
        history = self._history
        while history and history[0][0] < start:
            self._base = history.popleft()[1]
        return StageCheckpoint(start, processed, list(self._base), arms, snapshot, snapshot_at)

    def snapshot_taken(self, where: tuple[int, int], covers: int) -> None:
        """A snapshot of the state after every record before offset ``covers`` is stored at ``where`` (take it
        between two :meth:`feed` calls, ``covers`` = :attr:`next_offset`)."""
        needed = self._first_needed()
        self.snapshot_ref = (where, covers, covers if needed is None else min(needed, covers))

    @property
    def next_offset(self) -> int:
        """The offset after the last record fed (what a snapshot taken now covers)."""
        return max(self.received or 0, 0)

    def _first_needed(self) -> int | None:
        open_sessions, buckets = self.engine.sessions.open, self.engine.gsb.open_buckets()
        needed = self._needed
        while needed:
            offset, kind, key = needed[0]
            if kind == "s":
                session = open_sessions.get(key)
                if session is not None and session.offset == offset:  # not an earlier session of the same id
                    break
            elif key in buckets:
                break
            heapq.heappop(needed)
        waiting = min((offset for _, offset, _ in self._waiting), default=None)
        if not needed:
            return waiting
        return needed[0][0] if waiting is None else min(needed[0][0], waiting)

    def feed(self, offsets: Sequence[int], values: Sequence[bytes]) -> None:
        """Records of the regroup log in offset order (redelivered offsets are skipped)."""
        engine = self.engine
        for offset, value in zip(offsets, values, strict=True):
            if self.received is not None and offset < self.received:
                continue
            self.received = offset + 1
            record = orjson.loads(value)
            kind = record["k"]
            frozen = offset < self.frozen_until  # (in the restored snapshot)
            engine.ledger.frozen = engine.gsb.frozen = frozen
            if kind == "U" or kind == "V":
                # A/B units: rebuilt from every record, muted or not (their state is not a counter)
                if not frozen:
                    self._add_units(record)
                continue
            if kind == "s":
                heapq.heappush(self._waiting, (self._serve_ts(record) + self._horizon, offset, record))
                continue
            with self._quiet(offset):
                if kind == "q":
                    bucket = engine.gsb.bucket_of(record["t"])
                    if bucket not in engine.gsb.open_buckets():
                        heapq.heappush(self._needed, (offset, "q", bucket))
                    engine.gsb.query_metric(record["e"], record["a"], record["q"], record["t"], record["v"])
                elif kind == "a":
                    engine.arms_seen.setdefault(record["e"], set()).add(record["a"])
                elif kind == "j":  # counted once; kept for the sign test even while rebuilding
                    engine.gsb.judgment(record["e"], record["v"], count=offset >= self.muted_until)
                elif kind == "i":
                    engine.teams_seen.setdefault(record["e"], set()).update(record["teams"])
                    engine.gsb.interleaved(record["e"], record["teams"], record["r"],
                                           count=offset >= self.muted_until)
                elif kind == "w":
                    unit, time = int(record["u"]), float(record["t"])
                    if unit >= len(self.units):
                        self.units += [-math.inf] * (unit + 1 - len(self.units))
                    if time <= self.units[unit]:
                        continue
                    self.units[unit] = time
                    self._history.append((offset, tuple(self.units)))
                    watermark = min(self.units)
                    if watermark > self.watermark or watermark == math.inf:
                        self.watermark = watermark
                        self._add_parts(watermark)
                        engine.close(watermark, windows=False)

    def _add_units(self, record: dict[str, Any]) -> None:
        """Requests' ("U") or one-request sessions' ("V") shares of their A/B units, to the ledger (released on
        watermarks, in key order)."""
        ledger = self.engine.ledger
        columns = (np.array(record["t"], dtype=np.float64), record["id"], record["e"], record["a"], record["u"])
        if record["k"] == "U":
            ledger.add_requests(*columns, np.array(record["v"], dtype=np.float64))
        else:
            ledger.add_sessions(*columns, np.array(record["y"], dtype=np.float64),
                                np.array(record["w"], dtype=np.float64))

    def _serve_ts(self, record: dict[str, Any]) -> float:
        """A session part's serve time (records written before 2026-11-23 carry its finalisation point ``d``)."""
        return float(record["t"]) if "t" in record else float(record["d"]) - self._horizon

    def _quiet(self, offset: int) -> AbstractContextManager[None]:
        return self.engine.muted(self.engine.join) if offset < self.muted_until else nullcontext()

    def _add_parts(self, watermark: float) -> None:
        """Add the waiting session parts due by ``watermark`` (all partitions have finalised up to it)."""
        waiting = self._waiting
        parts: list[tuple[int, dict[str, Any]]] = []
        while waiting and waiting[0][0] <= watermark:
            _, offset, record = heapq.heappop(waiting)
            parts.append((offset, record))
        if not parts:
            return
        engine = self.engine
        states = [_Part(r["id"], self._serve_ts(r), [float(x) for x in r["s"]], r.get("u", r["id"]))
                  for _, r in parts]
        group = np.array([engine.group_of(r["e"], r["a"]) for _, r in parts], dtype=np.int64)
        rel_req = np.array([i for i, (_, r) in enumerate(parts) for _ in r["r"]], dtype=np.int64)
        rel_pos = np.array([p for _, r in parts for p in r["r"]], dtype=np.int64)
        impressions = Impressions(states, rel_req, rel_pos)  # type: ignore[arg-type]  # duck-typed parts
        # (under the quiet context of the watermark record that released them: named parts count nothing)
        engine.add_session_parts(states, group, impressions)  # type: ignore[arg-type]  # duck-typed parts
        # A rebuild must re-read every part of every open session: the smallest offset of each is needed (parts
        # are added in deadline order, which is not the log's order when they come from different partitions).
        open_sessions = engine.sessions.open
        for offset, record in parts:
            session = open_sessions.get(record["id"])
            if session is not None and offset < session.offset:
                session.offset = offset
                heapq.heappush(self._needed, (offset, "s", record["id"]))
