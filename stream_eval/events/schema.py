"""The event schema of SPEC §1: decoding from JSON bytes and validation, each rejection with a reason.

Decoding uses msgspec Structs (``gc=False``: the garbage collector never scans them), so a line becomes a
typed event in one C call; the checks msgspec cannot express (unique items, equal lengths, a grade for a
label, time zones) follow in :func:`validate`. An event that fails either step becomes an :class:`Invalid`
with a short ``code`` (counted per code) and a human-readable ``reason``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

import msgspec

from stream_eval.config import Config

Time = float | str | None


class Ranking(msgspec.Struct, tag="ranking", tag_field="type", gc=False):
    """One served result list (topic ``rankings``). ``ts`` is epoch seconds once validated."""

    request_id: str
    items: list[str]
    ts: Time = None
    scores: list[float] | None = None
    query_id: str | None = None
    session_id: str | None = None
    experiment: str = "default"
    arm: str = "default"
    teams: list[str] | None = None
    subtopics: list[list[str]] | None = None


class Feedback(msgspec.Struct, tag="feedback", tag_field="type", gc=False):
    """A click or a relevance label for one item of a request (topic ``feedback``)."""

    request_id: str
    item: str
    kind: str = "click"
    grade: float | None = None
    ts: Time = None


class Judgment(msgspec.Struct, tag="judgment", tag_field="type", gc=False):
    """A side-by-side verdict of treatment vs control for one query (topic ``judgments``)."""

    experiment: str
    query_id: str
    verdict: Literal["good", "same", "bad"]
    ts: Time = None


class Watermark(msgspec.Struct, tag="watermark", tag_field="type", gc=False):
    """Event time on a partition has reached ``ts``; ``end`` marks the end of a partition (replay done)."""

    ts: Time = None
    end: bool = False


Event = Ranking | Feedback | Judgment | Watermark
EVENT_TYPES = ("ranking", "feedback", "judgment")
TOPIC_TYPES: dict[str, type[Ranking] | type[Feedback] | type[Judgment]] = {
    "rankings": Ranking,
    "feedback": Feedback,
    "judgments": Judgment,
}


class Invalid(msgspec.Struct, gc=False):
    """An event that was rejected: ``kind`` is its type when known, ``code`` a short countable reason."""

    kind: str
    code: str
    reason: str
    where: str = ""
    raw: bytes = b""


class EventError(ValueError):
    """Raised by :func:`validate`; carries the short code and the readable reason."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def parse_time(value: Time, field: str = "ts") -> float:
    """Epoch seconds from a number or an ISO-8601 string with a UTC offset.

    >>> parse_time("2026-01-01T00:00:00Z")
    1767225600.0
    >>> parse_time(1767225600)
    1767225600.0
    """
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise EventError("bad_ts", f"{field}: not a finite number")
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise EventError("bad_ts", f"{field}: {value!r} is not an ISO-8601 time") from None
        if moment.tzinfo is None:
            raise EventError("bad_ts", f"{field}: {value!r} has no UTC offset (add Z or +hh:mm)")
        return moment.timestamp()
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise EventError("missing_ts", f"{field}: missing")


def _finite(values: list[float], field: str) -> None:
    for value in values:
        if not math.isfinite(value):
            raise EventError("bad_value", f"{field}: contains a non-finite number")


def _check_ranking(event: Ranking, config: Config) -> None:
    items = event.items
    n = len(items)
    if not event.request_id:
        raise EventError("missing_field", "request_id: empty")
    if n == 0:
        raise EventError("bad_items", "items: empty list")
    if n > config.max_items:
        raise EventError("bad_items", f"items: {n} items, more than max_items={config.max_items}")
    if len(set(items)) != n:
        seen: set[str] = set()
        repeated = next(item for item in items if item in seen or seen.add(item))  # type: ignore[func-returns-value]  # set.add returns None: the expression tests membership first
        raise EventError("bad_items", f"items: {repeated!r} appears more than once")
    if event.scores is not None:
        if len(event.scores) != n:
            raise EventError("bad_length", f"scores: {len(event.scores)} scores for {n} items")
        _finite(event.scores, "scores")
    if event.teams is not None and len(event.teams) != n:
        raise EventError("bad_length", f"teams: {len(event.teams)} teams for {n} items")
    if event.subtopics is not None and len(event.subtopics) != n:
        raise EventError("bad_length", f"subtopics: {len(event.subtopics)} entries for {n} items")


def _check_feedback(event: Feedback, config: Config) -> None:
    if not event.request_id:
        raise EventError("missing_field", "request_id: empty")
    grade = event.grade
    if grade is None:
        if event.kind == "label":
            raise EventError("missing_grade", "grade: required for kind 'label'")
        default = config.kind_grades.get(event.kind)
        if default is None:
            raise EventError("unknown_kind", f"kind: {event.kind!r} is not click, label or a kind in the config")
        event.grade = default
    elif not (grade >= 0.0 and math.isfinite(grade)):
        raise EventError("bad_grade", f"grade: must be a finite number >= 0, got {grade}")
    elif event.kind not in ("label", "click") and event.kind not in config.kind_grades:
        raise EventError("unknown_kind", f"kind: {event.kind!r} is not click, label or a kind in the config")


def _check_judgment(event: Judgment, config: Config) -> None:
    if not event.experiment or not event.query_id:
        raise EventError("missing_field", "experiment and query_id must not be empty")


_CHECKS: Mapping[type, Any] = {
    Ranking: _check_ranking,
    Feedback: _check_feedback,
    Judgment: _check_judgment,
}


def validate(event: Ranking | Feedback | Judgment, config: Config, default_ts: float | None = None) -> None:
    """Check what msgspec cannot, and set ``event.ts`` to epoch seconds (``default_ts`` when absent).

    Raises :class:`EventError` with a code and a reason.
    """
    _CHECKS[type(event)](event, config)
    ts = event.ts
    if ts is None and default_ts is not None:
        event.ts = default_ts
    elif type(ts) is not float:
        event.ts = parse_time(ts)
    elif not math.isfinite(ts):
        raise EventError("bad_ts", "ts: not a finite number")


def type_name(event: object) -> str:
    """The SPEC name of an event's type: ``ranking``, ``feedback``, ``judgment`` or ``watermark``."""
    return _TYPE_NAMES[type(event)]


_TYPE_NAMES: dict[type, str] = {Ranking: "ranking", Feedback: "feedback", Judgment: "judgment", Watermark: "watermark"}

_LINE_DECODER = msgspec.json.Decoder(Event)


def _reason_of(error: msgspec.MsgspecError) -> tuple[str, str]:
    text = str(error)
    if isinstance(error, msgspec.DecodeError) and not isinstance(error, msgspec.ValidationError):
        return "bad_json", text
    if "missing required field `type`" in text:
        return "missing_type", "type: missing (one of ranking, feedback, judgment, watermark)"
    if "at `$.type`" in text:
        return "unknown_type", f"type: {text.split(' - ')[0].replace('Invalid value', 'unknown type')}"
    if "missing required field" in text:
        return "missing_field", text
    return "bad_field", text


def _guess_kind(line: bytes) -> str:
    for kind in EVENT_TYPES:
        if b'"' + kind.encode() + b'"' in line:
            return kind
    return "unknown"


def decode_line(line: bytes, config: Config, where: str = "") -> Event | Invalid:
    """One JSON Lines record as a validated event, or an :class:`Invalid` with its reason."""
    try:
        event = _LINE_DECODER.decode(line)
    except msgspec.MsgspecError as error:
        code, reason = _reason_of(error)
        return Invalid(_guess_kind(line), code, reason, where, bytes(line))
    return finish(event, config, line, where)


def finish(event: Event, config: Config, raw: bytes = b"", where: str = "", default_ts: float | None = None) -> Event | Invalid:
    """Validate an already-decoded event; watermarks get their time parsed."""
    try:
        if isinstance(event, Watermark):
            if event.ts is not None:
                event.ts = parse_time(event.ts)
            elif not event.end:
                raise EventError("missing_ts", "watermark: needs ts or end")
        else:
            validate(event, config, default_ts)
    except EventError as error:
        return Invalid(type_name(event), error.code, error.reason, where, bytes(raw))
    return event


def decode_chunk(chunk: bytes, config: Config, first_line: int = 1, source: str = "") -> list[Event | Invalid]:
    """Every line of ``chunk`` (complete lines only) as events; one bad line never spoils its neighbours.

    The fast path decodes the whole chunk in one call; if any line is malformed JSON, the chunk is decoded
    line by line so that each bad line is reported with its number.
    """
    try:
        decoded = _LINE_DECODER.decode_lines(chunk)
    except msgspec.MsgspecError:
        return [
            decode_line(line, config, f"{source}:{first_line + offset}")
            for offset, line in enumerate(chunk.split(b"\n"))
            if line.strip()
        ]
    results: list[Event | Invalid] = [finish(event, config) for event in decoded]
    if any(type(result) is Invalid for result in results):
        lines = [(first_line + k, line) for k, line in enumerate(chunk.split(b"\n")) if line.strip()]
        for index, result in enumerate(results):
            if type(result) is Invalid:
                number, line = lines[index]
                result.where = f"{source}:{number}"
                result.raw = bytes(line)
    return results
