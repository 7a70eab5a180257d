"""Decoding Kafka message values: the topic gives the type (SPEC §1), a ``type`` field must agree.

Each message is one JSON object. The fast path decodes a whole fetched batch at once into the topic's
type; a batch with any bad, watermark or mistyped message is decoded message by message so that each is
classified on its own. A missing ``ts`` is the message's Kafka timestamp.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from stream_eval.config import Config
from stream_eval.events.schema import (
    _LINE_DECODER,
    DECODE_ERRORS,
    Event,
    EventError,
    Feedback,
    Invalid,
    Judgment,
    Ranking,
    Watermark,
    _reason_of,
    finish,
    type_name,
    validator,
)

_TOPIC_TYPES: dict[str, type[Ranking] | type[Feedback] | type[Judgment]] = {
    "ranking": Ranking,
    "feedback": Feedback,
    "judgment": Judgment,
}
_DECODERS = {kind: msgspec.json.Decoder(struct) for kind, struct in _TOPIC_TYPES.items()}
_MULTI_DECODERS = {kind: msgspec.json.Decoder(list[struct]) for kind, struct in _TOPIC_TYPES.items()}  # type: ignore[valid-type]  # a runtime type


def decode_message(
    value: bytes | None, kind: str, config: Config, default_ts: float, where: str = ""
) -> Event | Invalid:
    """One message of the topic for ``kind`` (``ranking``, ``feedback``, ``judgment``) as a validated event."""
    if value is None:
        return Invalid(kind, "bad_json", "empty message (no value)", where, b"")
    try:
        event: Event = _DECODERS[kind].decode(value)
    except DECODE_ERRORS as error:
        try:
            event = _LINE_DECODER.decode(value)  # a watermark, or a message whose type disagrees
        except DECODE_ERRORS:
            code, reason = _reason_of(error)
            return Invalid(kind, code, reason, where, bytes(value))
        if type(event) is not Watermark:
            other = type_name(event)
            return Invalid(kind, "type_mismatch", f"type: {other!r} on the {kind} topic", where, bytes(value))
    return finish(event, config, value, where, default_ts)


def decode_messages(
    values: Sequence[bytes | None], kind: str, config: Config, default_ts: Sequence[float], where: Sequence[str]
) -> list[Event | Invalid]:
    """Messages of one topic-partition, in order; ``default_ts[i]`` is message i's Kafka timestamp (s)."""
    if values and all(v is not None for v in values):
        try:
            decoded: list[Event | Invalid] = _MULTI_DECODERS[kind].decode(b"[" + b",".join(values) + b"]")  # type: ignore[arg-type]  # checked not None
        except DECODE_ERRORS:
            decoded = []
        if len(decoded) == len(values):  # a value holding two objects would shift the rest: one by one
            check = validator(config).check
            for index, event in enumerate(decoded):
                try:
                    check(event, default_ts[index])  # type: ignore[arg-type]  # the topic's type
                except EventError as error:
                    decoded[index] = Invalid(kind, error.code, error.reason, where[index], bytes(values[index] or b""))
            return decoded
    return [decode_message(v, kind, config, t, w) for v, t, w in zip(values, default_ts, where, strict=True)]
