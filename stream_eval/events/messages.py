"""Decoding Kafka message values: the topic gives the type (docs/contract.md §1), a ``type`` field must agree.

Each message is one JSON object. The fast path decodes a whole fetched batch at once into the topic's
type; a batch with a bad, watermark or mistyped message is split in halves, each decoded the same way, down to
runs of a few messages that are decoded one by one so that each is classified on its own (one bad message in a
fetch of 20,000 costs a few re-decodes of halves, not 20,000 single decodes). A missing ``ts`` is the message's
Kafka timestamp.

What msgspec does not check, bytes that are not UTF-8 where it skips a value and an object with a key twice, one
compiled pass over the batch finds first (:func:`~stream_eval.events.scan.screen_spans`): such a message is
invalid (``bad_utf8``, ``duplicate_key``) with the same reason as in a file, and is dead-lettered like any other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from stream_eval.config import Config
from stream_eval.events import scan
from stream_eval.events.schema import (
    _LINE_DECODER,
    DECODE_ERRORS,
    Chunk,
    CompactRanking,
    Event,
    EventError,
    Feedback,
    Invalid,
    Judgment,
    Ranking,
    Watermark,
    _reason_of,
    finish,
    screen_one,
    screened,
    type_name,
    validator,
)
from stream_eval.events.schema import decode_chunk_columns as _decode_lines

_TOPIC_TYPES: dict[str, type[Ranking] | type[Feedback] | type[Judgment]] = {
    "ranking": Ranking,
    "feedback": Feedback,
    "judgment": Judgment,
}
Ints = npt.NDArray[np.int64]
_DECODERS = {kind: msgspec.json.Decoder(struct) for kind, struct in _TOPIC_TYPES.items()}


class _Typed(msgspec.Struct):
    type: object = None


_TYPE_DECODER = msgspec.json.Decoder(_Typed)


def _type_named(value: bytes) -> object:
    """The ``type`` field of a message that is a JSON object (else None)."""
    try:
        return _TYPE_DECODER.decode(value).type
    except DECODE_ERRORS:
        return None
_MULTI_DECODERS = {kind: msgspec.json.Decoder(list[struct]) for kind, struct in _TOPIC_TYPES.items()}  # type: ignore[valid-type]  # a runtime type


def decode_message(
    value: bytes | None, kind: str, config: Config, default_ts: float, where: str = "", verdict: int | None = None
) -> Event | Invalid:
    """One message of the topic for ``kind`` (``ranking``, ``feedback``, ``judgment``) as a validated event.

    The reasons come in the order of :func:`~stream_eval.events.schema.decode_line`'s. ``verdict``: the message's
    :func:`~stream_eval.events.scan.screen_spans`, when known."""
    if value is None:
        return Invalid(kind, "bad_json", "empty message (no value)", where, b"")
    if verdict is None:
        verdict = screen_one(value)
    problem = screened(value, verdict) if verdict else None
    if problem is not None:
        return Invalid(kind, *problem, where, bytes(value))
    try:
        event: Event = _DECODERS[kind].decode(value)
    except DECODE_ERRORS as error:
        try:
            event = _LINE_DECODER.decode(value)  # a watermark, or a message whose type disagrees
        except DECODE_ERRORS as as_line:
            code, reason = _reason_of(error)
            if code == "unknown_type":
                named = _type_named(value)
                if isinstance(named, str) and named in _TOPIC_TYPES and named != kind:  # another type: it comes first
                    return Invalid(kind, "type_mismatch", f"type: {named!r} on the {kind} topic", where, bytes(value))
                code, reason = _reason_of(as_line)  # what is wrong with it as such, as in a file
            return Invalid(kind, code, reason, where, bytes(value))
        if type(event) is not Watermark:
            other = type_name(event)
            return Invalid(kind, "type_mismatch", f"type: {other!r} on the {kind} topic", where, bytes(value))
    return finish(event, config, value, where, default_ts)


def decode_messages(
    values: Sequence[bytes | None], kind: str, config: Config, default_ts: Sequence[float], where: Sequence[str],
    not_after: float = math.inf,
) -> list[Event | Invalid]:
    """Messages of one topic-partition, in order; ``default_ts[i]`` is message i's Kafka timestamp (s).

    An event whose time is after ``not_after`` (the worker's wall clock plus ``max_clock_skew``) is invalid
    (``future_ts``): a producer with a wrong clock must not move event time and finalise everything.
    """
    out: list[Event | Invalid] = []
    present = values if None not in values else [value or b"" for value in values]
    joined = b",".join(present)  # type: ignore[arg-type]  # no None in present
    lengths = np.fromiter(map(len, present), dtype=np.int64, count=len(present))  # type: ignore[arg-type]  # idem
    ends = np.cumsum(lengths + 1) - 1
    verdicts = scan.screen_spans(np.frombuffer(joined, dtype=np.uint8), ends - lengths, ends)
    _decode_range(values, 0, len(values), kind, config, default_ts, where, out, verdicts,
                  joined if present is values else None)
    if not_after < math.inf:
        for index, event in enumerate(out):
            out[index] = _not_future(event, not_after, config, where[index], values[index])
    return out


def _not_future(event: Event | Invalid, not_after: float, config: Config, where: str, value: bytes | None,
                ) -> Event | Invalid:
    """``event``, or an Invalid (``future_ts``) when its time is after ``not_after``."""
    ts = getattr(event, "ts", None)
    if ts is None or type(event) is Invalid or ts <= not_after:
        return event
    return Invalid(type_name(event), "future_ts", f"ts: {ts!r} is more than max_clock_skew="
                   f"{config.max_clock_skew:g}s ahead of the worker's clock", where, bytes(value or b""))


#: The event types a topic's messages may decode to (a watermark may come on any topic).
_ACCEPTED: dict[str, tuple[type, ...]] = {
    "ranking": (CompactRanking, Ranking, Watermark),
    "feedback": (Feedback, Watermark),
    "judgment": (Judgment, Watermark),
}


def decode_message_chunk(
    values: Sequence[bytes | None], kind: str, config: Config, default_ts: Sequence[float], where: Sequence[str],
    not_after: float = math.inf, joined: bytes | None = None,
) -> Chunk:
    """:func:`decode_messages` as a :class:`Chunk`: the same events, with the plainest feedback read into columns and
    the plainest rankings made compact by the compiled line reader, as replay reads a file.

    The messages are read as the lines of one chunk when each is one line (no message empty, none holding a line
    break); every event that the line reader did not give as a valid event of the topic's type (an invalid line,
    another type, a missing ``ts``, a time after ``not_after``) is decoded again as a message, by
    :func:`decode_message`, so its reason, its Kafka timestamp and its place are a message's. Anything else (rare:
    feedback on another topic, feedback from the future, a batch not one message a line) is decoded by
    :func:`decode_messages`. ``joined``: the values already joined by line feeds, none of them null (the input
    consumer reads them so: ``stream/fetched.py``).
    """
    def whole() -> Chunk:
        return Chunk.of(decode_messages(values, kind, config, default_ts, where, not_after))

    if joined is None:
        if not values or None in values:
            return whole()
        joined = b"\n".join(values)  # type: ignore[arg-type]  # no None
    if joined.count(b"\n") != len(values) - 1 or b"\r" in joined:
        return whole()
    chunk = _decode_lines(joined, config)
    feedback = chunk.feedback
    if len(chunk) != len(values) or (len(feedback) and (kind != "feedback" or float(feedback.ts.max()) > not_after)):
        return whole()  # a message of white space only (no line), or feedback the columns cannot keep
    accepted = _ACCEPTED[kind]
    events: list[Any] = chunk.events
    events_at = chunk.events_at.tolist()
    replaced = False
    for k, event in enumerate(events):
        if type(event) in accepted and (getattr(event, "ts", None) or -math.inf) <= not_after:
            continue
        i = events_at[k]
        if not replaced:
            events = chunk.events = list(events)  # (not the plain rankings' own list)
            replaced = True
        events[k] = _not_future(decode_message(values[i], kind, config, default_ts[i], where[i]), not_after,
                                config, where[i], values[i])
    if replaced and chunk.plain is not None:
        chunk.plain.fill_items()  # the objects no longer line up with the rankings read in place
        chunk.plain = None
    return chunk


#: Runs of at most this many messages with a bad one among them are decoded message by message.
_ONE_BY_ONE = 32


def _decode_range(
    values: Sequence[bytes | None], lo: int, hi: int, kind: str, config: Config, default_ts: Sequence[float],
    where: Sequence[str], out: list[Event | Invalid], verdicts: Ints, joined: bytes | None = None,
) -> None:
    """Decode ``values[lo:hi]`` into ``out``; ``verdicts``: :func:`scan.screen_spans` of every value; ``joined``: the
    values of the range joined by commas, when at hand."""
    part = values[lo:hi]
    if part and (joined is not None or all(v is not None for v in part)):
        if joined is None:
            joined = b",".join(part)  # type: ignore[arg-type]  # checked not None
        try:
            decoded: list[Event | Invalid] = _MULTI_DECODERS[kind].decode(b"[" + joined + b"]")
        except DECODE_ERRORS:
            decoded = []
        if len(decoded) == hi - lo:  # a value holding two objects would shift the rest: split
            check = validator(config).check
            for index, event in enumerate(decoded):
                try:
                    check(event, default_ts[lo + index])  # type: ignore[arg-type]  # the topic's type
                except EventError as error:
                    decoded[index] = Invalid(kind, error.code, error.reason, where[lo + index],
                                             bytes(part[index] or b""))
            for index in np.flatnonzero(verdicts[lo:hi]).tolist():  # not UTF-8, a key twice: these reasons first
                problem = screened(part[index] or b"", int(verdicts[lo + index]))
                if problem is not None:
                    decoded[index] = Invalid(kind, *problem, where[lo + index], bytes(part[index] or b""))
            out += decoded
            return
    if hi - lo <= _ONE_BY_ONE:
        out += [decode_message(values[i], kind, config, default_ts[i], where[i], int(verdicts[i]))
                for i in range(lo, hi)]
        return
    middle = (lo + hi) // 2
    _decode_range(values, lo, middle, kind, config, default_ts, where, out, verdicts)
    _decode_range(values, middle, hi, kind, config, default_ts, where, out, verdicts)
