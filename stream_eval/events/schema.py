"""The event schema of docs/contract.md §1: decoding from JSON bytes and validation, each rejection with a reason.

Decoding uses msgspec Structs (``gc=False``: the garbage collector never scans them), so a line becomes a
typed event in one C call; the checks msgspec cannot express (unique items, equal lengths, a grade for a
label, time zones) follow in :func:`validate`. An event that fails either step becomes an :class:`Invalid`
with a short ``code`` (counted per code) and a human-readable ``reason``. What msgspec lets through, bytes that are
not UTF-8 in a value it skips and a key twice (it keeps the last value), :func:`scan.screen_lines` finds first:
``bad_utf8`` and ``duplicate_key``, before any other reason, in every decoder.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import repeat
from operator import attrgetter
from typing import Annotated, Any, Literal, NoReturn, cast

import msgspec
import numpy as np
import numpy.typing as npt
import orjson

from stream_eval.config import MAX_GRADE, Config
from stream_eval.events import compiled, scan

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

Time = float | str | None
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Grade = Annotated[float, msgspec.Meta(ge=0, le=MAX_GRADE)]
Dwell = Annotated[float, msgspec.Meta(ge=0)]


class Ranking(msgspec.Struct, tag="ranking", tag_field="type", gc=False):
    """One served result list (topic ``rankings``). ``ts`` is epoch seconds once validated. An empty ``items`` is
    a zero-result request: valid, its relevance measures undefined (README, "Behaviour measures")."""

    request_id: NonEmpty
    items: list[str]
    ts: Time = None
    scores: list[float] | None = None
    query_id: str | None = None
    session_id: str | None = None
    experiment: str = "default"
    arm: str = "default"
    teams: list[str] | None = None
    subtopics: list[list[str]] | None = None
    unit_id: str | None = None
    attributes: dict[str, str] | None = None


class Feedback(msgspec.Struct, tag="feedback", tag_field="type", gc=False):
    """A click or a relevance label for one item of a request (topic ``feedback``). ``dwell``: seconds the user
    stayed on the item (finite, >= 0), for ``SatClick`` and ``Reformulation``."""

    request_id: NonEmpty
    item: str
    kind: str = "click"
    grade: Grade | None = None
    ts: Time = None
    dwell: Dwell | None = None


#: Feedback kinds by code, one numbering for the whole process (codes are never persisted).
KIND_NAMES: list[str] = []
_KIND_CODES: dict[str, int] = {}


def kind_codes(kinds: list[str]) -> npt.NDArray[np.int64]:
    """The code of each kind name (:data:`KIND_NAMES` ``[code]`` is the name), new names numbered as met."""
    codes = np.fromiter(map(_KIND_CODES.get, kinds, repeat(-1)), dtype=np.int64, count=len(kinds))
    if (codes < 0).any():
        for kind in kinds:
            if kind not in _KIND_CODES:
                _KIND_CODES[kind] = len(KIND_NAMES)
                KIND_NAMES.append(kind)
        codes = np.fromiter(map(_KIND_CODES.__getitem__, kinds), dtype=np.int64, count=len(kinds))
    return codes


class FeedbackColumns:
    """Validated feedback events as columns: the request id and the item of each are bounds in ``text``
    (UTF-8), the kind a code of :func:`kind_codes`; the grade is set (a default grade applied) and ``ts`` is
    epoch seconds; ``dwell`` is in seconds, NaN where the event has none."""

    __slots__ = ("text", "rid_start", "rid_end", "item_start", "item_end", "kind", "grade", "ts", "dwell")

    def __init__(self, text: npt.NDArray[np.uint8], rid_start: Ints, rid_end: Ints, item_start: Ints, item_end: Ints,
                 kind: Ints, grade: Floats, ts: Floats, dwell: Floats | None = None) -> None:
        self.text = text
        self.rid_start, self.rid_end = rid_start, rid_end
        self.item_start, self.item_end = item_start, item_end
        self.kind, self.grade, self.ts = kind, grade, ts
        self.dwell = np.full(ts.shape[0], np.nan) if dwell is None else dwell

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    @classmethod
    def of(cls, events: Sequence[Feedback]) -> FeedbackColumns:
        """The columns of validated :class:`Feedback` events."""
        n = len(events)
        text, starts, ends = compiled.utf8_fields([e.request_id for e in events] + [e.item for e in events])
        return cls(text, starts[:n], ends[:n], starts[n:], ends[n:], kind_codes([e.kind for e in events]),
                   np.array([e.grade for e in events], dtype=np.float64),
                   np.array([e.ts for e in events], dtype=np.float64),
                   np.array([math.nan if e.dwell is None else e.dwell for e in events], dtype=np.float64))

    def take(self, index: Ints | slice) -> FeedbackColumns:
        """The events at ``index``, in that order (sharing ``text``)."""
        return FeedbackColumns(self.text, self.rid_start[index], self.rid_end[index], self.item_start[index],
                               self.item_end[index], self.kind[index], self.grade[index], self.ts[index],
                               self.dwell[index])

    @staticmethod
    def concat(parts: Sequence[FeedbackColumns]) -> FeedbackColumns:
        """The events of ``parts``, one after the other."""
        if len(parts) == 1:
            return parts[0]
        shifts = np.cumsum([0] + [p.text.shape[0] for p in parts[:-1]])
        return FeedbackColumns(
            np.concatenate([p.text for p in parts]),
            *(np.concatenate([getattr(p, name) + shift for p, shift in zip(parts, shifts, strict=True)])
              for name in ("rid_start", "rid_end", "item_start", "item_end")),
            *(np.concatenate([getattr(p, name) for p in parts]) for name in ("kind", "grade", "ts", "dwell")))

    def item(self, k: int) -> str:
        return self.text[self.item_start[k] : self.item_end[k]].tobytes().decode()

    def events(self, at: Ints | None = None) -> list[Feedback]:
        """The events at ``at`` (all by default), in that order, as :class:`Feedback` (a NaN dwell as ``None``)."""
        pick = slice(None) if at is None else at
        raw = self.text.tobytes()
        names = KIND_NAMES
        return [Feedback(raw[a:b].decode(), raw[c:d].decode(), names[kind], grade, ts,
                         None if dwell != dwell else dwell)
                for a, b, c, d, kind, grade, ts, dwell in zip(
                    *(column[pick].tolist() for column in (self.rid_start, self.rid_end, self.item_start,
                                                           self.item_end, self.kind, self.grade, self.ts,
                                                           self.dwell)), strict=True)]


#: No feedback, as columns.
NO_FEEDBACK = FeedbackColumns.of([])


class Judgment(msgspec.Struct, tag="judgment", tag_field="type", gc=False):
    """A side-by-side verdict of treatment vs control for one query (topic ``judgments``)."""

    experiment: NonEmpty
    query_id: NonEmpty
    verdict: Literal["good", "same", "bad"]
    ts: Time = None


class Watermark(msgspec.Struct, tag="watermark", tag_field="type", gc=False):
    """Event time on a partition has reached ``ts``; ``end`` marks the end of a partition (replay done)."""

    ts: Time = None
    end: bool = False


class _RawRanking(Ranking, tag="ranking", tag_field="type", gc=False):
    """A ranking as the replay fast path decodes it: ``items`` and ``scores`` kept as their JSON text."""

    items: msgspec.Raw  # type: ignore[assignment]  # the raw form of Ranking.items
    scores: msgspec.Raw = msgspec.Raw(b"null")  # type: ignore[assignment]  # the raw form of Ranking.scores


#: The separator of :attr:`CompactRanking.items`: no item of a compact list contains a double quote.
SEP = '","'


class CompactRanking(msgspec.Struct, gc=False):
    """A validated ranking in the compact form the join keeps (made by :func:`decode_chunk_compact`).

    ``items`` is either one str, ``SEP + SEP.join(items) + SEP`` when no item contains ``"`` (so an item's
    position is exact: the number of separators before the match of ``SEP + item + SEP``), or the list
    itself (always for an empty list: zero results). ``scores`` is the JSON text of a flat array of numbers
    (decoded when the request is finalised, by the same decoder as :class:`Ranking`), a list of floats, or
    ``None``. (A Struct, not decoded from JSON: its constructor runs in C.)
    """

    request_id: str
    items: str | list[str]
    n: int
    ts: float
    scores: bytes | list[float] | None
    query_id: str | None
    session_id: str | None
    experiment: str
    arm: str
    teams: list[str] | None = None
    subtopics: list[list[str]] | None = None
    unit_id: str | None = None  # the A/B randomisation unit, when the ranking names one
    attributes: dict[str, str] | None = None  # segments are read from it (config ``segments``)

    @classmethod
    def of(cls, event: Ranking) -> CompactRanking:
        """The compact form of a validated :class:`Ranking`."""
        items = event.items
        # (an empty list, zero results, stays a list: the compact text of no item would read as one empty item)
        text: str | list[str] = SEP + SEP.join(items) + SEP if items and '"' not in "".join(items) else list(items)
        # Scores as JSON text (~7 bytes a number, not a 24-byte float object each): msgspec writes the
        # shortest text that reads back as the same float, so the values are exact. Copied to a bytes of its own
        # size: the encoder's result keeps its over-allocated block (20 scores, 172 bytes, held 257). No item, no
        # score: the scores of a zero-result request are none.
        scores = None if not event.scores else bytes(memoryview(_SCORES_ENCODER.encode(event.scores)))
        return cls(event.request_id, text, len(items), event.ts, scores,  # type: ignore[arg-type]  # validated: ts is float
                   *_named(event))


def _named(event: Ranking) -> tuple[Any, ...]:
    """A ranking's fields after its scores, as :class:`CompactRanking` takes them: an empty id or name is one not
    given (docs/contract.md §1), and so are empty ``attributes``."""
    return (event.query_id or None, event.session_id or None, event.experiment or "default", event.arm or "default",
            event.teams, event.subtopics, event.unit_id or None, event.attributes or None)


_RAW_ITEMS = attrgetter("items")
_RAW_SCORES = attrgetter("scores")
SCORES_DECODER = msgspec.json.Decoder(list[float])
_SCORES_ENCODER = msgspec.json.Encoder()
#: Longer score arrays are decoded once at validation, to be sure they decode (e.g. no overflow).
_SHORT_SCORES = 300


def compact_texts(text: str, starts: list[int], ends: list[int]) -> list[str]:
    """The compact item text of each plain raw ``items`` array ``text[start:end]`` (``["a","b"]`` becomes
    ``","a","b","``)."""
    return ['",' + text[a + 1 : b - 1] + ',"' for a, b in zip(starts, ends, strict=True)]


def item_list(items: str | list[str]) -> list[str]:
    """The items of a :class:`CompactRanking` as a list."""
    return items[3:-3].split(SEP) if type(items) is str else list(items)


def score_list(scores: bytes | list[float] | None) -> list[float] | None:
    """The scores of a :class:`CompactRanking` as a list (``None`` if the ranking had none)."""
    if scores is None or type(scores) is list:
        return scores
    return SCORES_DECODER.decode(scores)  # type: ignore[arg-type]  # bytes here


Event = Ranking | Feedback | Judgment | Watermark
EVENT_TYPES = ("ranking", "feedback", "judgment")


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


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


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


class Validator:
    """The checks of docs/contract.md §1 that msgspec's types cannot express, for one :class:`Config`.

    ``check`` validates an event in place (``ts`` becomes epoch seconds, a click gets grade 1) or raises
    :class:`EventError`. Built once per config: the hot path does no dict building or attribute chains.
    """

    __slots__ = ("max_items", "min_ts", "max_ts", "default_grades", "graded_kinds", "_checks", "scan_kinds")

    def __init__(self, config: Config) -> None:
        self.max_items = config.max_items
        self.min_ts, self.max_ts = config.min_ts, config.max_ts
        self.default_grades = config.kind_grades
        self.graded_kinds = {"label", *self.default_grades}
        self._checks: dict[type, Any] = {Ranking: self.ranking, Feedback: self.feedback, Judgment: self.judgment}
        # the kinds as scan.scan_lines takes them: their bytes and bounds, default grades (NaN: none), the
        # index of click, and each one's code (kind_codes)
        names = sorted(self.graded_kinds)
        texts = [name.encode() for name in names]
        starts, ends = compiled.bounds(texts)
        self.scan_kinds = (np.frombuffer(b"".join(texts) or b"\0", dtype=np.uint8), starts, ends,
                           np.array([self.default_grades.get(name, math.nan) for name in names]),
                           names.index("click") if "click" in names else -1, kind_codes(names))

    def check(self, event: Ranking | Feedback | Judgment, default_ts: float | None = None) -> None:
        if (type(event) is Feedback and event.grade is None and type(event.ts) is float  # most events: a click
                and event.dwell is None):
            grade = self.default_grades.get(event.kind)
            if grade is not None and self.min_ts <= event.ts <= self.max_ts:
                event.grade = grade
                return
        self._checks[type(event)](event)
        event.ts = self.time(event.ts, default_ts)

    def time(self, ts: Time, default_ts: float | None = None) -> float:
        """``ts`` (``default_ts`` when absent) as epoch seconds, checked to be a time a real log can hold."""
        if type(ts) is not float:
            ts = default_ts if ts is None and default_ts is not None else parse_time(ts)
        if self.min_ts <= ts <= self.max_ts:
            return ts
        hint = "; epoch milliseconds? ts is in seconds" if self.min_ts * 1000 <= ts <= self.max_ts * 1000 else ""
        raise EventError("ts_out_of_range", f"ts: {ts!r} is outside the event times a log can hold "
                         f"[{_iso(self.min_ts)}, {_iso(self.max_ts)}] (settings min_ts, max_ts){hint}")

    def ranking(self, event: Ranking) -> None:
        items = event.items
        n = len(items)
        if n > self.max_items or len(set(items)) != n:
            self._check_items(items)
        self._check_lengths(event, n, ("scores", "teams", "subtopics"))

    def compact_many(self, events: list[_RawRanking]) -> list[CompactRanking | EventError | None]:
        """:meth:`compact` of each ranking (its result, or the error it raises). The plainest rankings are
        checked by one compiled pass over their raw items and scores (:func:`compiled.simple_rankings`), the
        others one by one."""
        items = list(map(_RAW_ITEMS, events))
        scores = list(map(_RAW_SCORES, events))
        item_bytes, scores_bytes = b"".join(items), b"".join(scores)
        i_starts, i_ends = compiled.bounds(items)
        s_starts, s_ends = compiled.bounds(scores)
        counts = compiled.simple_rankings(np.frombuffer(item_bytes, dtype=np.uint8), i_starts, i_ends,
                                          np.frombuffer(scores_bytes, dtype=np.uint8), s_starts, s_ends,
                                          self.max_items).tolist()
        # the plain rankings are ASCII: their offsets hold
        texts = compact_texts(item_bytes.decode("ascii", "replace"), i_starts.tolist(), i_ends.tolist())
        out: list[CompactRanking | EventError | None] = []
        for event, n, text, raw_scores in zip(events, counts, texts, scores, strict=True):
            try:
                if n < 0:
                    out.append(self.compact(event))
                    continue
                kept: bytes | None = bytes(raw_scores)  # a msgspec.Raw
                out.append(self._compacted(event, text, n, None if kept == b"null" else kept))
            except EventError as error:
                out.append(error)
        return out

    def compact(self, event: _RawRanking) -> CompactRanking | None:
        """Validate a ranking decoded with raw ``items`` and ``scores``, exactly as :meth:`ranking` and
        :meth:`check` would; ``None`` when they are not in the simple form checked here (no escapes, no
        white space, numbers without exponent): then the line is decoded in full instead."""
        raw = bytes(event.items)
        if raw[:2] != b'["' or raw[-2:] != b'"]' or b"\\" in raw:
            return None
        try:
            text = '",' + raw[1:-1].decode() + ',"'
        except UnicodeDecodeError:
            return None
        if text.count('"') != 2 * text.count(SEP):
            return None  # a quote inside an item, or white space between them
        items = text[3:-3].split(SEP)
        n = len(items)
        scores: bytes | None = bytes(event.scores)
        if scores == b"null":
            scores = None
            n_scores = n
        else:
            kept = scores.translate(None, b"0123456789.,-")  # type: ignore[union-attr]  # bytes here
            if kept != b"[]" and kept.translate(None, b"eE+") != b"[]":
                return None  # not a flat array of numbers without white space
            # Without an exponent and in under 300 characters, no number can be out of range.
            if kept != b"[]" or len(scores) > _SHORT_SCORES:  # type: ignore[arg-type]  # bytes here
                try:
                    SCORES_DECODER.decode(scores)  # type: ignore[arg-type]  # bytes here
                except DECODE_ERRORS:
                    return None
            n_scores = 0 if scores == b"[]" else scores.count(b",") + 1  # type: ignore[union-attr]  # bytes here
        if n > self.max_items or len(set(items)) != n:
            self._check_items(items)
        if n_scores != n:
            raise EventError("bad_length", f"scores: {n_scores} entries for {n} items")
        return self._compacted(event, text, n, scores)

    def _compacted(self, event: _RawRanking, text: str, n: int, scores: bytes | None) -> CompactRanking:
        """The checks left once items and scores are known good, and the compact ranking."""
        if event.teams is not None or event.subtopics is not None:
            self._check_lengths(event, n, ("teams", "subtopics"))
        return CompactRanking(event.request_id, text, n, self.time(event.ts), scores, *_named(event))

    def _check_items(self, items: list[str]) -> None:
        n = len(items)
        if n > self.max_items:
            raise EventError("bad_items", f"items: {n} items, more than max_items={self.max_items}")
        if len(set(items)) != n:
            seen: set[str] = set()
            repeated = next(item for item in items if item in seen or seen.add(item))  # type: ignore[func-returns-value]  # set.add returns None: the expression tests membership first
            raise EventError("bad_items", f"items: {repeated!r} appears more than once")

    @staticmethod
    def _check_lengths(event: Ranking | _RawRanking, n: int, fields: tuple[str, ...]) -> None:
        for field in fields:
            values = getattr(event, field)
            if values is not None and len(values) != n:
                raise EventError("bad_length", f"{field}: {len(values)} entries for {n} items")

    def feedback(self, event: Feedback) -> None:
        dwell = event.dwell
        if dwell is not None and not (type(dwell) is float and 0.0 <= dwell < math.inf):
            if isinstance(dwell, int) and not isinstance(dwell, bool) and dwell >= 0:
                event.dwell = float(dwell)
            else:
                raise EventError("bad_dwell", f"dwell: {dwell!r} is not a finite number of seconds >= 0")
        if event.grade is None:
            grade = self.default_grades.get(event.kind)
            if grade is None:
                if event.kind == "label":
                    raise EventError("missing_grade", "grade: required for kind 'label'")
                raise EventError("unknown_kind", f"kind: {event.kind!r} is not click, label or a kind in the config")
            event.grade = grade
        elif event.kind not in self.graded_kinds:
            raise EventError("unknown_kind", f"kind: {event.kind!r} is not click, label or a kind in the config")

    def judgment(self, event: Judgment) -> None:
        pass


@functools.lru_cache(maxsize=16)
def validator(config: Config) -> Validator:
    """The :class:`Validator` of a config (cached: configs are frozen)."""
    return Validator(config)


def validate(event: Ranking | Feedback | Judgment, config: Config, default_ts: float | None = None) -> None:
    """Check what msgspec cannot, and set ``event.ts`` to epoch seconds (``default_ts`` when absent).

    Raises :class:`EventError` with a code and a reason.
    """
    validator(config).check(event, default_ts)


def type_name(event: object) -> str:
    """The name of an event's type (docs/contract.md §1): ``ranking``, ``feedback``, ``judgment`` or ``watermark``."""
    return _TYPE_NAMES[type(event)]


_TYPE_NAMES: dict[type, str] = {Ranking: "ranking", Feedback: "feedback", Judgment: "judgment", Watermark: "watermark"}

_LINE_DECODER = msgspec.json.Decoder(Event)
_COMPACT_DECODER = msgspec.json.Decoder(_RawRanking | Feedback | Judgment | Watermark)


#: Short reason codes for msgspec's type errors, by the field they are about.
_FIELD_CODES = {"items": "bad_items", "grade": "bad_grade", "ts": "bad_ts", "dwell": "bad_dwell",
                "attributes": "bad_attributes"}
#: Fields required as text: null there is ``missing_field``, another type ``bad_field``.
_REQUIRED_TEXT = frozenset({"request_id", "experiment", "query_id"})


#: What decoding bytes can raise: msgspec's errors, UnicodeDecodeError for bytes that are not UTF-8, and
#: RecursionError for JSON nested deeper than the interpreter's recursion limit allows (msgspec skips even unknown
#: fields recursively; the screen's :data:`scan.TOO_DEEP` keeps events from getting there).
DECODE_ERRORS = (msgspec.MsgspecError, UnicodeDecodeError, RecursionError)


TOO_DEEP_REASON = f"JSON nested too deeply (arrays or objects inside each other more than {scan.MAX_DEPTH} levels)"


def _reason_of(error: msgspec.MsgspecError | UnicodeDecodeError | RecursionError) -> tuple[str, str]:
    if isinstance(error, UnicodeDecodeError):
        return "bad_utf8", f"not UTF-8 text: {error.reason} at byte {error.start}"
    if isinstance(error, RecursionError):
        return "too_deep", TOO_DEEP_REASON
    text = str(error)
    if isinstance(error, msgspec.DecodeError) and not isinstance(error, msgspec.ValidationError):
        if text == "Input data was truncated":  # (msgspec's words for a high surrogate escape without its pair too)
            text += " (or a string holds a lone UTF-16 surrogate escape such as \\ud800)"
        return "bad_json", text
    if "missing required field `type`" in text:
        return "missing_type", "type: missing (one of ranking, feedback, judgment, watermark)"
    if "at `$.type`" in text:
        return "unknown_type", f"type: {text.split(' - ')[0].replace('Invalid value', 'unknown type')}"
    if "missing required field" in text:
        return "missing_field", _worded(text)
    field = text.rpartition("at `$.")[2].rstrip("`").split("[")[0].split(".")[0]
    if field in _REQUIRED_TEXT and ("got `null`" in text or "length >= 1" in text):  # (null, empty: not given)
        return "missing_field", _worded(text)
    return _FIELD_CODES.get(field, "bad_field"), _worded(text)


_AT = re.compile(r"(.+) - at `\$\.?(.*)`")
_MISSING = re.compile(r"Object missing required field `(.+)`(?: - at `\$\.?(.*)`)?")


def _worded(text: str) -> str:
    """msgspec's message of a validation error in the words of the other reasons: the field first.

    >>> _worded("Expected `float` >= 0.0 - at `$.grade`"), _worded("Object missing required field `ts`")
    ('grade: expected `float` >= 0.0', 'ts: missing (a required field)')
    >>> _worded("Expected `str`, got `int` - at `$.items[2]`")
    'items[2]: expected `str`, got `int`'
    """
    missing = _MISSING.fullmatch(text)
    if missing is not None:
        where = f"{missing.group(2)}." if missing.group(2) else ""
        return f"{where}{missing.group(1)}: missing (a required field)"
    at = _AT.fullmatch(text)
    if at is not None:
        message, path = at.groups()
        return f"{path or 'the event'}: {message[:1].lower()}{message[1:]}"
    return text


_TYPE_FIELD = re.compile(rb'"type"\s*:\s*"([a-z]+)"')


def _guess_kind(line: bytes) -> str:
    """The type a rejected line says it has, for counting (``unknown`` if it names none we know)."""
    match = _TYPE_FIELD.search(line)
    kind = match.group(1).decode() if match else ""
    return kind if kind in EVENT_TYPES else "unknown"


class _Pairs(list[tuple[str, Any]]):
    """The keys and values of a JSON object, in order (``json``'s ``object_pairs_hook``)."""


def _repeated_key(line: bytes) -> str | None:
    """The first key that the top-level object of ``line`` has twice, the keys decoded (escapes undone); ``None``
    if there is none, or if ``line`` is not one JSON object. (Numbers are not converted: any length is read.)"""
    try:
        pairs = json.loads(line, object_pairs_hook=_Pairs, parse_int=str, parse_float=str, parse_constant=str)
    except (ValueError, RecursionError):
        return None
    if type(pairs) is not _Pairs:
        return None
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    return None


def screened(line: bytes, verdict: int) -> tuple[str, str] | None:
    """The code and reason of a line (or message) that :func:`scan.screen_lines` gave ``verdict``: ``bad_utf8``,
    ``too_deep``, ``duplicate_key`` (certain for :data:`scan.REPEATED_KEY`, looked for in the decoded keys for
    :data:`scan.ASK`), or ``None`` when nothing is against it; before all, ``too_large``. They come before msgspec's
    reasons, in every decoder."""
    if verdict == scan.TOO_LARGE:
        return "too_large", (f"{len(line):,} bytes: more than the {scan.MAX_EVENT_BYTES:,} an event may have (a "
                             "worker could not write its outputs to Kafka)")
    if verdict == scan.TOO_DEEP:
        return "too_deep", TOO_DEEP_REASON
    if verdict == scan.NOT_UTF8:
        try:
            bytes(line).decode()
        except UnicodeDecodeError as error:
            return "bad_utf8", f"not UTF-8 text: {error.reason} at byte {error.start}"
        return "bad_utf8", "not UTF-8 text"  # pragma: no cover  # the screen and Python's decoder agree
    if verdict != scan.REPEATED_KEY and verdict != scan.ASK:
        return None
    key = _repeated_key(line)
    if key is not None:
        return "duplicate_key", f"{key!r}: the key appears more than once in the object (which value holds is a guess)"
    if verdict == scan.REPEATED_KEY:  # (a line cut short, or not JSON, but with the same key twice)
        return "duplicate_key", "a key appears more than once in the object (which value holds is a guess)"
    return None


def screen_one(line: bytes) -> int:
    """:func:`scan.screen_spans` of one line or message."""
    return int(scan.screen_spans(np.frombuffer(line, dtype=np.uint8), _ZERO, np.array([len(line)]))[0])


_ZERO = np.zeros(1, dtype=np.int64)


def decode_line(line: bytes, config: Config, where: str = "") -> Event | Invalid:
    """One JSON Lines record as a validated event, or an :class:`Invalid` with its reason.

    What msgspec does not check comes first: bytes that are not UTF-8 (``bad_utf8``, wherever they are), then a
    key of the event's object twice (``duplicate_key``, even in a line cut short); then msgspec's reasons."""
    verdict = screen_one(line)
    problem = screened(line, verdict) if verdict else None
    if problem is not None:
        return Invalid(_guess_kind(line), *problem, where, bytes(line))
    return _decode_screened(line, config, where)


def _decode_screened(line: bytes, config: Config, where: str) -> Event | Invalid:
    """:func:`decode_line` of a line already screened (:func:`scan.screen_lines`) with nothing against it."""
    try:
        event = _LINE_DECODER.decode(line)
    except DECODE_ERRORS as error:
        code, reason = _reason_of(error)
        return Invalid(_guess_kind(line), code, reason, where, bytes(line))
    return finish(event, config, line, where)


def _screen_decoded(chunk: bytes, results: list[Any], first_line: int, source: str,
                    numbers: list[int] | None) -> list[tuple[int, bytes]] | None:
    """Mark the lines of a chunk that msgspec decoded in one call but that are not UTF-8 or have a key twice:
    ``results[index]`` becomes their :class:`Invalid`, as :func:`decode_line` gives it. Returns the numbered lines
    if it needed them."""
    verdicts = scan.screen_lines(np.frombuffer(chunk, dtype=np.uint8))
    flagged = np.flatnonzero(verdicts).tolist()
    if not flagged:
        return None
    lines = _numbered(chunk, first_line, numbers)
    for index in flagged:
        number, line = lines[index]
        problem = screened(line, int(verdicts[index]))
        if problem is not None:
            results[index] = Invalid(_guess_kind(line), *problem, f"{source}:{number}", bytes(line))
    return lines


def finish(
    event: Event, config: Config, raw: bytes = b"", where: str = "", default_ts: float | None = None
) -> Event | Invalid:
    """Validate an already-decoded event; watermarks get their time parsed."""
    try:
        if isinstance(event, Watermark):
            if event.ts is not None:
                event.ts = validator(config).time(event.ts)
            elif not event.end:
                raise EventError("missing_ts", "watermark: needs ts or end")
        else:
            validate(event, config, default_ts)
    except EventError as error:
        return Invalid(type_name(event), error.code, error.reason, where, bytes(raw))
    return event


def _numbered(chunk: bytes, first_line: int, numbers: list[int] | None) -> list[tuple[int, bytes]]:
    """The non-blank lines of ``chunk`` with their numbers: counted from ``first_line``, or ``numbers``."""
    if numbers is None:
        return [(first_line + k, line) for k, line in enumerate(chunk.split(b"\n")) if line.strip()]
    return list(zip(numbers, (line for line in chunk.split(b"\n") if line.strip()), strict=True))


def _line_by_line(chunk: bytes, config: Config, first_line: int, source: str,
                  numbers: list[int] | None = None) -> list[Event | Invalid]:
    return [decode_line(line, config, f"{source}:{number}") for number, line in _numbered(chunk, first_line, numbers)]


def decode_chunk(chunk: bytes, config: Config, first_line: int = 1, source: str = "") -> list[Event | Invalid]:
    """Every line of ``chunk`` (complete lines only) as events; one bad line never spoils its neighbours.

    The fast path decodes the whole chunk in one call; if any line is malformed JSON, the chunk is decoded
    line by line so that each bad line is reported with its number.
    """
    try:
        # (each decoded event may be replaced by an Invalid in place: msgspec types the list as events only)
        decoded = cast("list[Event | Invalid]", _LINE_DECODER.decode_lines(chunk))
    except DECODE_ERRORS:
        return _line_by_line(chunk, config, first_line, source)
    # decode_lines skips blank lines and accepts two JSON values on one line; a line must hold one event.
    if len(decoded) != sum(1 for line in chunk.split(b"\n") if line.strip()):
        return _line_by_line(chunk, config, first_line, source)
    check = validator(config).check
    results: list[Event | Invalid] = decoded
    _screen_decoded(chunk, results, first_line, source, None)
    for index, event in enumerate(decoded):
        if type(event) is Invalid:
            continue
        if type(event) is Watermark:
            results[index] = finish(event, config)
            continue
        try:
            check(event)  # type: ignore[arg-type]  # neither Invalid nor Watermark (checked above)
        except EventError as error:
            results[index] = Invalid(type_name(event), error.code, error.reason)
    if any(type(result) is Invalid for result in results):
        lines = _numbered(chunk, first_line, None)
        for index, result in enumerate(results):
            if type(result) is Invalid and not result.where:
                number, line = lines[index]
                result.where = f"{source}:{number}"
                result.raw = bytes(line)
    return results


def is_json(text: bytes) -> bool:
    """Whether ``text`` is one whole JSON value."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def count_lines(chunk: bytes) -> int:
    """The number of newlines in ``chunk`` (numpy counts faster than ``bytes.count``; docs/benchmarks.md)."""
    return int(np.count_nonzero(np.frombuffer(chunk, dtype=np.uint8) == 10))


def _nonblank_lines(chunk: bytes) -> int:
    # numpy finds the line starts: bytes.count(b"\n{") was a visible part of a replay's instructions (cachegrind;
    # docs/benchmarks.md)
    raw = np.frombuffer(chunk, dtype=np.uint8)
    starts = np.flatnonzero(raw == 10) + 1  # where each line after the first starts (or the end)
    if chunk[:1] == b"{" and bool((raw[starts[starts < len(raw)]] == 123).all()):
        return len(starts) + (not chunk.endswith(b"\n"))  # every line starts with an object: none is blank
    return sum(1 for line in chunk.split(b"\n") if line.strip())


def decode_chunk_compact(
    chunk: bytes, config: Config, first_line: int = 1, source: str = "", numbers: list[int] | None = None
) -> list[CompactRanking | Feedback | Judgment | Watermark | Invalid]:
    """:func:`decode_chunk` with each valid ranking as a :class:`CompactRanking` (what replay feeds the join).

    Items and scores are decoded as raw JSON text (one object each instead of one per item), checked and
    kept in compact form; a ranking whose items or scores are not in the simple form is decoded in full.
    The results equal ``decode_chunk``'s, rankings converted with :meth:`CompactRanking.of`. ``numbers``:
    the line number of each non-blank line, when they are not counted from ``first_line``.
    """
    try:
        decoded: list[Any] = _COMPACT_DECODER.decode_lines(chunk)
    except DECODE_ERRORS:
        decoded = []
    else:
        if len(decoded) != _nonblank_lines(chunk):
            decoded = []
    if not decoded:
        return [CompactRanking.of(e) if type(e) is Ranking else e  # type: ignore[misc]  # dispatched on type
                for e in _line_by_line(chunk, config, first_line, source, numbers)]
    checker = validator(config)
    check = checker.check
    results: list[Any] = decoded
    lines = _screen_decoded(chunk, results, first_line, source, numbers)
    invalid = False
    types = list(map(type, decoded))
    at = [index for index, kind in enumerate(types) if kind is _RawRanking]
    for index, converted in zip(at, checker.compact_many([decoded[index] for index in at]), strict=True):
        if type(converted) is CompactRanking:
            results[index] = converted
        elif converted is None:
            if lines is None:
                lines = _numbered(chunk, first_line, numbers)
            number, line = lines[index]
            full = _decode_screened(line, config, f"{source}:{number}")
            results[index] = CompactRanking.of(full) if type(full) is Ranking else full
        else:
            results[index] = Invalid("ranking", converted.code, converted.reason)  # type: ignore[union-attr]
            invalid = True
    for index, kind in enumerate(types):
        if kind is _RawRanking or kind is Invalid:
            continue
        event = decoded[index]
        if kind is Watermark:
            results[index] = finish(event, config)
            invalid = True  # perhaps
        else:
            try:
                check(event)
            except EventError as error:
                results[index] = Invalid(type_name(event), error.code, error.reason)
                invalid = True
    if invalid:
        if lines is None:
            lines = _numbered(chunk, first_line, numbers)
        for index, result in enumerate(results):
            if type(result) is Invalid and not result.where:
                number, line = lines[index]
                result.where = f"{source}:{number}"
                result.raw = bytes(line)
    return results


class PlainRankings:
    """The rankings of a chunk read by the line reader, in order, with their request ids and item arrays left in
    the chunk's bytes (``raw[id_start:id_end]``, and the array ``["a","b"]`` at ``raw[items_start:items_end]``):
    their ``items`` stays empty until :meth:`fill_items`, as the join copies the bytes into its own instead
    (:meth:`~stream_eval.events.join.Join.add_columns`). ``text`` is the chunk decoded as Latin-1."""

    __slots__ = ("rankings", "raw", "text", "id_start", "id_end", "items_start", "items_end", "filled")

    def __init__(self, rankings: list[CompactRanking], raw: npt.NDArray[np.uint8], text: str, columns: Ints) -> None:
        self.rankings, self.raw, self.text = rankings, raw, text
        (self.id_start, self.id_end), (self.items_start, self.items_end) = (
            columns[list(scan.COLUMNS[key])] for key in ("request_id", "items"))
        self.filled = False

    def __len__(self) -> int:
        return len(self.rankings)

    def fill_items(self) -> None:
        """Give each ranking its compact item text (for every use but the join's); nothing once done, or once the
        join took the rankings (it keeps their items, as it does for any ranking)."""
        if self.filled:
            return
        texts = compact_texts(self.text, self.items_start.tolist(), self.items_end.tolist())
        for ranking, text in zip(self.rankings, texts, strict=True):
            ranking.items = text
        self.filled = True


class Chunk:
    """A decoded chunk of lines (:func:`decode_chunk_columns`): the plain feedback events as columns, the other
    events as objects; ``feedback_at`` and ``events_at`` are their places among the chunk's events. ``plain``: the
    rankings among the objects that the line reader read, whose items are left in the chunk's bytes."""

    __slots__ = ("events", "events_at", "feedback", "feedback_at", "plain")

    def __init__(self, events: list[CompactRanking | Feedback | Judgment | Watermark | Invalid], events_at: Ints,
                 feedback: FeedbackColumns, feedback_at: Ints, plain: PlainRankings | None = None) -> None:
        self.events, self.events_at = events, events_at
        self.feedback, self.feedback_at = feedback, feedback_at
        self.plain = plain

    def __len__(self) -> int:
        return len(self.events) + len(self.feedback)

    @classmethod
    def of(cls, events: list[Any]) -> Chunk:
        """Events already decoded, all as objects."""
        return cls(events, np.arange(len(events)), NO_FEEDBACK, np.empty(0, dtype=np.int64))

    def as_list(self) -> list[CompactRanking | Feedback | Judgment | Watermark | Invalid]:
        """Every event in order, the columns' feedback as :class:`Feedback` objects (rankings with their items)."""
        if self.plain is not None:
            self.plain.fill_items()
        if not len(self.feedback):
            return self.events  # every place is an object's
        out: list[Any] = [None] * len(self)
        for k, event in zip(self.events_at.tolist(), self.events, strict=True):
            out[k] = event
        for k, event in zip(self.feedback_at.tolist(), self.feedback.events(), strict=True):
            out[k] = event
        return out


def decode_chunk_columns(chunk: bytes, config: Config, first_line: int = 1, source: str = "") -> Chunk:
    """:func:`decode_chunk_compact` with the feedback in the plainest form read into columns, and the rankings in
    the plainest form made compact, by compiled code (:mod:`stream_eval.events.scan`); every other line goes
    through :func:`decode_chunk_compact`. The events are the same, in the same order (:meth:`Chunk.as_list`).

    Lines written with white space after their commas and colons (``json.dumps``' default) are read from a
    :func:`scan.minified` copy; a line left to msgspec is still decoded, and dead-lettered, as it was written."""
    checker = validator(config)
    kinds, kind_starts, kind_ends, grades, click, codes = checker.scan_kinds
    written = chunk
    if _SPACED in chunk[:_SPACED_PROBE]:
        chunk = scan.minified(np.frombuffer(chunk, dtype=np.uint8)).tobytes()
    raw = np.frombuffer(chunk, dtype=np.uint8)
    lines, fast, fields, values = scan.scan_lines(raw, kinds, kind_starts, kind_ends, grades, click)
    if chunk is not written:  # each line as written (the same lines, in the same order: blank ones stay blank)
        lines = scan.line_bounds(np.frombuffer(written, dtype=np.uint8))
    fast[lines[:, 1] - lines[:, 0] > scan.MAX_EVENT_BYTES] = 0  # too large: screened (and rejected) below
    columns = fields.T  # a view: each key's bounds are rows
    _check_numbers(chunk, fast, columns, values, checker)
    ranked = np.flatnonzero(fast == scan.RANKING)
    rankings: list[CompactRanking] = []
    read_rankings = None
    if ranked.shape[0]:
        read_rankings, plain = _plain_rankings(chunk, raw, columns[:, ranked], values[ranked, 1], checker.max_items)
        rankings = read_rankings.rankings
        fast[ranked[~plain]] = 0  # items or scores not in the plainest form: msgspec and Validator.compact
    objects_at = np.flatnonzero(fast != scan.FEEDBACK)
    other = fast[objects_at] == 0
    events: list[Any] = rankings
    if other.any():
        bounds = lines[objects_at[other]]
        rest = b"\n".join([written[a:b] for a, b in zip(bounds[:, 0].tolist(), bounds[:, 1].tolist(), strict=True)])
        decoded = decode_chunk_compact(rest, config, first_line, source, (bounds[:, 2] + first_line).tolist())
        if not rankings:
            events = decoded
        else:
            merged = np.empty(objects_at.shape[0], dtype=object)
            merged[other], merged[~other] = decoded, rankings
            events = merged.tolist()
    read = np.flatnonzero(fast == scan.FEEDBACK)
    return Chunk(events, objects_at, _feedback_columns(raw, columns[:, read], values[read], codes), read,
                 read_rankings if rankings else None)


#: A chunk whose first bytes hold a colon and a space after a quote (``"type": "ranking"``) is read minified.
_SPACED, _SPACED_PROBE = b'": ', 4096


def _check_numbers(chunk: bytes, fast: Ints, columns: Ints, values: Floats, checker: Validator) -> None:
    """Parse the times, grades and dwell times of the lines read (``values``, in place) and leave a line whose time no
    real log has, or whose grade or dwell is too large for a double (a long decimal), to msgspec and
    :class:`Validator`, which reject it with the reason."""
    read = np.flatnonzero(fast)
    (t0, t1) = (columns[k] for k in scan.COLUMNS["ts"])
    exact = columns[scan.TS_EXACT]
    ts = _parsed(chunk, values[read, 1], exact[read], t0[read], t1[read])
    values[read, 1] = ts
    exact[read] = 1
    outside = ~((ts >= checker.min_ts) & (ts <= checker.max_ts))
    if outside.any():
        fast[read[outside]] = 0
    for key, column, exact_column in (("grade", 0, scan.GRADE_EXACT), ("dwell", 2, scan.DWELL_EXACT)):
        inexact = read[columns[exact_column][read] == 0]  # feedback with a long decimal grade or dwell (rare)
        if inexact.shape[0]:
            (g0, g1) = (columns[k][inexact] for k in scan.COLUMNS[key])
            parsed = _parsed(chunk, values[inexact, column], np.zeros_like(inexact), g0, g1)
            values[inexact, column] = parsed
            columns[exact_column][inexact] = 1
            fast[inexact[~np.isfinite(parsed)]] = 0  # msgspec: "Number out of range"
    fast[read[values[read, 0] > MAX_GRADE]] = 0  # msgspec and Validator: bad_grade


def _parsed(chunk: bytes, column: Floats, exact: Ints, starts: Ints, ends: Ints) -> Floats:
    """``column`` with the numbers not read exactly parsed from their text by ``float`` (correctly rounded, as
    msgspec's parser is)."""
    parse = np.flatnonzero(exact == 0)
    if parse.shape[0]:
        column = column.copy()
        column[parse] = [float(chunk[a:b]) for a, b in zip(starts[parse].tolist(), ends[parse].tolist(), strict=True)]
    return column


def _feedback_columns(raw: npt.NDArray[np.uint8], columns: Ints, values: Floats, codes: Ints) -> FeedbackColumns:
    """The feedback lines read by :func:`scan.scan_lines` (their columns and values) as :class:`FeedbackColumns`."""
    (rid0, rid1), (item0, item1) = (
        (columns[a], columns[b]) for a, b in (scan.COLUMNS[k] for k in ("request_id", "item")))
    grade, ts, dwell = values[:, 0], values[:, 1], values[:, 2]  # parsed by _check_numbers
    return FeedbackColumns(raw, rid0.copy(), rid1.copy(), item0.copy(), item1.copy(), codes[columns[scan.KIND_INDEX]],
                           grade, ts, dwell)


def _plain_rankings(chunk: bytes, raw: npt.NDArray[np.uint8], columns: Ints, ts: Floats,
                    max_items: int) -> tuple[PlainRankings, Bools]:
    """The rankings read by :func:`scan.scan_lines` whose items and scores are in the plainest form (checked as
    :meth:`Validator.compact_many` does), made compact with their items left in the chunk; and which of them
    those are."""
    (i0, i1), (s0, s1) = (columns[list(scan.COLUMNS[key])] for key in ("items", "scores"))
    counts = compiled.simple_rankings(raw, i0, i1, raw, np.maximum(s0, 0), np.maximum(s1, 0), max_items)
    plain = counts >= 0
    columns, ts, counts = columns[:, plain], ts[plain], counts[plain]
    attributes, refused = _attributes(chunk, *(columns[k] for k in scan.COLUMNS["attributes"]))
    if refused is not None:  # (none: the scanner passes no object msgspec refuses; if it did, msgspec says why)
        plain[np.flatnonzero(plain)[refused]] = False
        kept = ~refused
        columns, ts, counts = columns[:, kept], ts[kept], counts[kept]
        attributes = [value for value, keep in zip(attributes, kept.tolist(), strict=True) if keep]
    text = chunk.decode("latin-1")  # one character per byte: offsets hold (ids and items are ASCII)
    wide = np.flatnonzero(columns[scan.WIDE]).tolist()  # the rankings with a label that is not ASCII

    def strings(key: str, source: str | bytes = text) -> list[Any]:  # (an empty one, b == a, is none)
        starts, ends = (columns[k].tolist() for k in scan.COLUMNS[key])
        return [source[a:b] if b > a else None for a, b in zip(starts, ends, strict=True)]

    def utf8_strings(key: str) -> list[str | None]:  # :func:`strings` of a label, UTF-8 where it is not ASCII
        found = strings(key)
        if wide:
            starts, ends = (columns[k] for k in scan.COLUMNS[key])
            for k in wide:
                if found[k] is not None:
                    found[k] = chunk[starts[k]:ends[k]].decode()
        return found

    def labels(key: str, absent: str | None) -> list[str | None]:
        # few distinct names: each is read once, as the label kept (see label()); an empty one is one not given
        starts, ends = (columns[k] for k in scan.COLUMNS[key])
        codes, firsts = compiled.distinct_spans(raw, starts, ends)
        names = labels_of([chunk[a:b].decode() for a, b in zip(starts[firsts].tolist(), ends[firsts].tolist(),
                                                                 strict=True)])
        return np.array([*(name or absent for name in names), absent],  # type: ignore[no-any-return]  # code -1: absent
                        dtype=object)[codes].tolist()

    times = ts.tolist()  # parsed by _check_numbers
    made = list(map(CompactRanking, strings("request_id"), repeat(""), counts.tolist(), times, strings("scores", chunk),
                    labels("query_id", None), utf8_strings("session_id"), labels("experiment", "default"),
                    labels("arm", "default"), repeat(None), repeat(None), utf8_strings("unit_id"), attributes))
    return PlainRankings(made, raw, text, columns), plain


class SharedAttributes(dict[str, str]):
    """The ``attributes`` of rankings read by the compiled reader: one object for every ranking with the same JSON
    text (:data:`ATTRIBUTE_SETS`), so read-only; copied and pickled as a plain ``dict``."""

    __slots__ = ()

    def _read_only(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a ranking's attributes are shared with other rankings: read them, do not change them")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only

    def __reduce__(self) -> tuple[type[dict[str, str]], tuple[dict[str, str]]]:
        return dict, (dict(self),)


_ATTRIBUTES_DECODER = msgspec.json.Decoder(list[dict[str, str]])
_ATTRIBUTE_DECODER = msgspec.json.Decoder(dict[str, str])
#: The ``attributes`` of rankings read by the compiled reader, by their JSON text: few distinct ones (a segment's
#: values), which open requests share. First come, first kept: at most :data:`_MAX_ATTRIBUTE_SETS` texts of at most
#: :data:`_SHARED_TEXT` bytes (a longer one is decoded once per chunk).
ATTRIBUTE_SETS: dict[bytes, SharedAttributes | None] = {}
_MAX_ATTRIBUTE_SETS = 4_096
_SHARED_TEXT = 512
_REFUSED = SharedAttributes()  # a text msgspec does not decode as ``dict[str, str]``


def _attributes(chunk: bytes, starts: Ints, ends: Ints) -> tuple[list[SharedAttributes | None], Bools | None]:
    """The ``attributes`` of rankings read by :func:`scan.scan_lines` (flat objects of strings at
    ``chunk[starts[k]:ends[k]]``; -1: none), each text decoded once (:data:`ATTRIBUTE_SETS`); an empty one is none,
    as :func:`_named` has it. Also the rankings whose attributes msgspec refused (``None``: none was)."""
    out: list[SharedAttributes | None] = [None] * starts.shape[0]
    given = np.flatnonzero(starts >= 0)
    if not given.shape[0]:
        return out, None
    texts = [chunk[a:b] for a, b in zip(starts[given].tolist(), ends[given].tolist(), strict=True)]
    known = ATTRIBUTE_SETS
    fresh = list(dict.fromkeys(text for text in texts if text not in known))
    if fresh:
        decoded = _decode_attributes(fresh)
        kept = {text: value for text, value in decoded.items() if len(text) <= _SHARED_TEXT and value is not _REFUSED}
        if len(known) + len(kept) <= _MAX_ATTRIBUTE_SETS:
            known.update(kept)
        found = [decoded[text] if text in decoded else known[text] for text in texts]
    else:
        found = list(map(known.__getitem__, texts))
    for k, value in zip(given.tolist(), found, strict=True):
        out[k] = value
    if not (fresh and any(value is _REFUSED for value in decoded.values())):  # (by identity: _REFUSED == {})
        return out, None
    return out, np.array([value is _REFUSED for value in out], dtype=np.bool_)


def _decode_attributes(texts: list[bytes]) -> dict[bytes, SharedAttributes | None]:
    """Each JSON text as :class:`SharedAttributes` (none for an empty object; :data:`_REFUSED` where msgspec refuses
    it), in one call where it can."""
    try:
        values: list[Any] = _ATTRIBUTES_DECODER.decode(b"[" + b",".join(texts) + b"]")
    except DECODE_ERRORS:
        values = []
        for text in texts:
            try:
                values.append(_ATTRIBUTE_DECODER.decode(text))
            except DECODE_ERRORS:
                values.append(_REFUSED)
    return {text: value if value is _REFUSED else SharedAttributes(value) if value else None
            for text, value in zip(texts, values, strict=True)}


#: Experiment, arm and query names repeat across requests: open requests share one copy of each (first come, first
#: kept, a bounded table). Other modules hold this dict: it is never rebound.
LABELS: dict[str, str] = {}
_MAX_LABELS = 65_536


def label(value: str) -> str:
    """The copy of ``value`` that requests share (``LABELS.get(value) or label(value)`` inline)."""
    kept = LABELS.get(value)
    if kept is not None:
        return kept
    if len(LABELS) < _MAX_LABELS:
        LABELS[value] = value
    return value


def labels_of(values: list[str]) -> list[str]:
    """:func:`label` of each value."""
    kept = LABELS.get
    if len(LABELS) >= _MAX_LABELS:  # full: values not kept stay as they are
        return [kept(value, value) for value in values]
    return [kept(value) or label(value) for value in values]
