"""The records of the regroup log (``engine/regroup.py``), as typed structs: one class per kind, with field names that
say what they hold, encoded and decoded here only.

On the wire each record is a MessagePack map whose ``"k"`` names its kind and whose keys are short (the log carries one
record per batch of finalised requests); the keys are those of the logs written before these classes, which are read
as they were. A record of an input partition's transaction (``docs/design.md``, "Delivery", D4) also carries the
partition (``"P"``), its number in the partition's sequence (``"n"``) and the ownership that wrote it (``"x"``).
Logs written before 2026-12-06 hold the same maps as JSON objects, which are read too (a JSON object starts with
``{``, a MessagePack map never does); MessagePack writes a record's float64 columns as raw bytes rather than base64
text, and its numbers and strings without text to scan: 27 % fewer bytes, half the CPU to encode
(docs/benchmarks.md, "Regroup records in MessagePack").

>>> record = decode(encode(Judgment(experiment="exp", verdict="good")))
>>> record
Judgment(experiment='exp', verdict='good', partition=None, seq=None, owner=None)
>>> msgspec.msgpack.decode(encode(Commit(partition=3, seq=9, owner="t1")))
{'k': 'c', 'P': 3, 'n': 9, 'x': 't1'}
>>> decode(b'{"k":"w","u":2,"t":"inf"}').at
inf
"""

from __future__ import annotations

from typing import Union

import msgspec
import numpy as np
import numpy.typing as npt
from msgspec import UNSET, UnsetType, field


class Record(msgspec.Struct, tag_field="k", kw_only=True, omit_defaults=True, gc=False):
    """What every record may carry: the input partition whose transaction it belongs to, its number there and the
    ownership that wrote it (``None``: a record of no partition's transaction, applied at once)."""

    partition: int | None = field(default=None, name="P")
    seq: int | None = field(default=None, name="n")
    owner: str | None = field(default=None, name="x")


class Rewind(Record, tag="r"):
    """A new owner of ``partition`` took it from a checkpoint covering its records numbered up to ``seq``: those are
    applied, the rest is discarded (the new owner writes them again)."""


class Commit(Record, tag="c"):
    """The checkpoint covering ``partition``'s records numbered up to ``seq`` is stored: they may be counted."""


class SessionParts(Record, tag="S"):
    """Finalised requests of named sessions, as columns: the session, its labels, the serve time, the served items'
    scores and the 1-based positions of the relevant ones, the A/B unit; with the session measures on, the query id
    and whether a click satisfied."""

    sessions: list[str] = field(name="id")
    experiments: list[str] = field(name="e")
    arms: list[str] = field(name="a")
    served: list[float] = field(name="t")
    units: list[str | None] = field(name="u")
    queries: list[str | None] | None = field(default=None, name="q")
    satisfied: list[bool] | None = field(default=None, name="c")
    #: every part's scores, one after another, as little-endian float64 (base64 in JSON), and how many each part
    #: has: no float is written or read as text
    flat_scores: bytes | None = field(default=None, name="f")
    sizes: list[int] | None = field(default=None, name="z")
    #: the scores per part, as numbers (logs written before 2026-11-28, without ``flat_scores``)
    scores: list[list[float]] | None = field(default=None, name="s")
    #: every part's relevant positions, one after another, and how many each part has
    flat_relevant: list[int] | None = field(default=None, name="R")
    relevant_sizes: list[int] | None = field(default=None, name="Z")
    #: the relevant positions per part (logs written before 2026-12-07, without ``flat_relevant``)
    relevant: list[list[int]] | None = field(default=None, name="r")


class SessionPart(Record, tag="s"):
    """One finalised request of a named session (logs written before 2026-11-26; ``finalised``: before 2026-11-23,
    the finalisation point instead of the serve time; no ``unit``: the session is the unit)."""

    session: str = field(name="id")
    experiment: str = field(name="e")
    arm: str = field(name="a")
    scores: list[float] = field(name="s")
    relevant: list[int] = field(name="r")
    served: float | None = field(default=None, name="t")
    finalised: float | None = field(default=None, name="d")
    unit: str | None | UnsetType = field(default=UNSET, name="u")
    query: str | None = field(default=None, name="q")
    satisfied: bool = field(default=False, name="c")


class QueryMetrics(Record, tag="Q"):
    """Finalised requests' ``gsb_metric`` values for their queries, as columns (``None``: NaN)."""

    experiments: list[str] = field(name="e")
    arms: list[str] = field(name="a")
    queries: list[str] = field(name="q")
    served: list[float] = field(name="t")
    values: list[float | None] = field(name="v")


class QueryMetric(Record, tag="q"):
    """One request's ``gsb_metric`` value for its query (logs written before 2026-11-26)."""

    experiment: str = field(name="e")
    arm: str = field(name="a")
    query: str = field(name="q")
    served: float = field(name="t")
    value: float | None = field(name="v")


class UnitRequests(Record, tag="U"):
    """Finalised requests' share of their A/B units, as columns: finalisation point, request id, labels, unit and
    the per-request values; with segments, each request's value of every segment field (``None``: none)."""

    keys: list[float] = field(name="t")
    ids: list[str] = field(name="id")
    experiments: list[str] = field(name="e")
    arms: list[str] = field(name="a")
    units: list[str] = field(name="u")
    segments: list[list[str | None]] | None = field(default=None, name="g")
    #: the per-request values, a row per request, as little-endian float64 (base64 in JSON; NaN: no value)
    flat_values: bytes | None = field(default=None, name="f")
    #: the same as numbers (logs written before 2026-11-28, without ``flat_values``)
    values: list[list[float | None]] | None = field(default=None, name="v")

    def value_rows(self) -> npt.NDArray[np.float64]:
        """The per-request values, a row per request (NaN: no value), from either form."""
        if self.flat_values is None:
            return np.array(self.values, dtype=np.float64)
        return floats(self.flat_values).reshape(len(self.ids), -1)


class UnitSessions(Record, tag="V"):
    """Scored one-request sessions' share of their A/B units, as columns: close point, session id, labels, unit,
    weight × AUC and weight."""

    keys: list[float] = field(name="t")
    ids: list[str] = field(name="id")
    experiments: list[str] = field(name="e")
    arms: list[str] = field(name="a")
    units: list[str] = field(name="u")
    weighted_auc: list[float | None] = field(name="y")
    weight: list[float | None] = field(name="w")


class Judgment(Record, tag="j"):
    """A side-by-side verdict for an experiment (counted by the stage)."""

    experiment: str = field(name="e")
    verdict: str = field(name="v")


class Interleaved(Record, tag="i"):
    """An interleaved request: its experiment, the team of each served item and the relevant positions."""

    experiment: str = field(name="e")
    teams: list[str]
    relevant: list[int] = field(name="r")


class ArmSeen(Record, tag="a"):
    """An arm of an experiment was finalised in the partition (announced once per ownership)."""

    experiment: str = field(name="e")
    arm: str = field(name="a")


class PartitionWatermark(Record, tag="w"):
    """Every request of input partition ``input_partition`` finalised by ``time`` has its records above this one
    (``time``: epoch seconds, or ``"inf"`` at the end of the partition). ``resumed``: the partition, ended
    (``"inf"`` written before), has events again: its event time is ``time`` from here on, lower than the end."""

    input_partition: int = field(name="u")
    time: float | str = field(name="t")  # a number, or "inf"/"-inf" as JSON holds them (engine/times.py)
    resumed: bool = field(default=False, name="r")

    @property
    def at(self) -> float:
        """``time`` as a float."""
        return float(self.time)


class LookReport(Record, tag="L"):
    """A partition of the regroup stage (``stage``) reports the looks of its shards of the A/B units changed since
    its previous look, at the boundary ``time`` (to the merger, on stage partition 0: ``engine/ab.py``). Each look
    is :meth:`ShardLook.to_json <stream_eval.engine.ab.ShardLook.to_json>`'s list, or (segments, at boundaries only)
    :meth:`SegmentLook.to_json <stream_eval.engine.segment_ab.SegmentLook.to_json>`'s dict; a boundary's looks may
    take several records."""

    stage: int = field(name="g")
    time: float | str = field(name="t")
    looks: list[list[object] | dict[str, object]] = field(name="l")
    live: bool = field(default=False, name="v")  # looks between boundaries (shown, never folded: engine/ab.py)


class LookProgress(Record, tag="G"):
    """Stage partition ``stage`` has reported every look up to event time ``time``."""

    stage: int = field(name="g")
    time: float | str = field(name="t")

    @property
    def at(self) -> float:
        return float(self.time)


AnyRecord = Union[Rewind, Commit, SessionParts, SessionPart, QueryMetrics, QueryMetric, UnitRequests,  # noqa: UP007
                  UnitSessions, Judgment, Interleaved, ArmSeen, PartitionWatermark, LookReport, LookProgress]
_DECODER = msgspec.msgpack.Decoder(AnyRecord)
_JSON_DECODER = msgspec.json.Decoder(AnyRecord)  # (logs written before 2026-12-06)
_ENCODER = msgspec.msgpack.Encoder()


def encode(record: Record) -> bytes:
    """The record as MessagePack."""
    return _ENCODER.encode(record)


def flat(array: npt.ArrayLike) -> bytes:
    """An array's numbers for a ``flat_*`` field: little-endian float64, in C order."""
    return np.ascontiguousarray(array, dtype="<f8").tobytes()


def floats(data: bytes) -> npt.NDArray[np.float64]:
    """The float64 of a ``flat_*`` field (read-only)."""
    return np.frombuffer(data, dtype="<f8")


def decode(value: bytes) -> AnyRecord:
    """A record of the regroup log (MessagePack, or JSON as written before 2026-12-06)."""
    record: AnyRecord = (_JSON_DECODER if value[:1] == b"{" else _DECODER).decode(value)
    return record
