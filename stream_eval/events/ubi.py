"""OpenSearch User Behavior Insights (UBI) as events: ``--input-format ubi QUERIES EVENTS``.

UBI (specification 1.x, https://github.com/o19s/ubi) logs searches in the index ``ubi_queries`` and what users
did next in ``ubi_events``. This module turns exports of the two into this project's JSON event lines, which then
take the standard path (the decoder of :mod:`~stream_eval.events.schema`, the engine, or the Kafka topics), so that
a UBI log is accepted, rejected and counted exactly as the same events written by hand:

- a query is a ranking: ``request_id`` = ``query_id``, ``items`` = ``query_response_hit_ids`` in order, ``ts`` =
  ``timestamp``, ``query_id`` = ``user_query`` (normalised: :func:`normalise_query`), ``unit_id`` = ``client_id``,
  ``session_id``, ``experiment`` and ``arm`` from the fields named in the ``[ubi]`` table of ``--config``, and
  ``attributes`` (the segment fields of config ``segments``) from the query's ``query_attributes``;
- an event is feedback when its ``action_name`` maps to a feedback kind (``[ubi.actions]``; by default ``click``
  and ``click_through`` are clicks, ``add_to_cart`` and ``purchase`` kinds of their own): ``request_id`` = its
  ``query_id``, ``item`` = ``event_attributes.object.object_id``, ``dwell`` from ``event_attributes.dwell_time``
  when it has one. Other actions (``impression``, ``hover``, ...) are ignored and counted, never errors.

The two inputs are merged in timestamp order, each read in order (as a JSON Lines log must be); records are held
back ``hold`` of event time (default: the attribution window plus the allowed lateness) and released in timestamp
order, so that a ranking can take its ``session_id`` from the events of its query when the query record has none,
and the inputs may be out of order by that much. Memory grows with the records of ``hold``, not with the log.

A record that cannot be converted is an :class:`~stream_eval.events.schema.Invalid` with a reason code (``kind``
``ranking`` for a query, ``feedback`` for an event), counted as an invalid line is: see :data:`REASONS`.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import tomllib
import unicodedata
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

import numpy as np
import orjson

from stream_eval.config import Config, ConfigError, parse_boolean, parse_duration
from stream_eval.events import scan
from stream_eval.events.schema import (
    CompactRanking,
    Event,
    EventError,
    Invalid,
    Watermark,
    decode_chunk_compact,
    is_json,
    parse_time,
    screen_one,
    screened,
)

#: ``action_name`` -> feedback kind, by default (``[ubi.actions]`` replaces the whole table).
DEFAULT_ACTIONS: tuple[tuple[str, str], ...] = (
    ("click", "click"), ("click_through", "click"), ("add_to_cart", "add_to_cart"), ("purchase", "purchase"))
#: Grades of the default kinds other than click, used when ``[kinds]`` does not set them.
DEFAULT_GRADES: dict[str, float] = {"add_to_cart": 2.0, "purchase": 3.0}

#: The reason codes of UBI records rejected here (the converted events may still be rejected by the standard
#: checks, with their codes: ``bad_items`` for a hit listed twice, ...).
REASONS = {
    "bad_json": "a line that is not JSON (or a file that is neither JSON Lines nor one JSON document)",
    "bad_utf8": "bytes that are not UTF-8",
    "duplicate_key": "a key twice in the record's object",
    "too_large": "a record of more than 256 KiB",
    "bad_record": "JSON that is neither an object nor an array of objects",
    "missing_query_id": "no query_id (a text of at least one character)",
    "missing_ts": "no timestamp",
    "bad_ts": "a timestamp that is neither ISO-8601 with a UTC offset nor epoch milliseconds",
    "ts_out_of_range": "a timestamp outside min_ts..max_ts",
    "bad_hits": "query_response_hit_ids that is not a list of ids",
    "missing_action": "an event without action_name",
    "bad_object": "an object_id that is not a text or an integer",
    "bad_ordinal": "a position.ordinal that is not an integer",
    "missing_object": "an event without object_id whose item its ordinal cannot give",
    "unknown_hit": "an object_id that is not among its query's hits",
    "ordinal_mismatch": "a position.ordinal at which its query's hits hold another object",
    "id_field_mismatch": "an object_id_field other than its query's: the ids name other things",
    "bad_dwell": "a dwell time that is not a finite number of seconds >= 0",
}

#: Distinct ignored action names counted one by one; the rest as ``__other__``.
MAX_IGNORED_NAMES = 100
#: Records converted to events per batch given to the engine.
BATCH = 4096
_QUERY, _EVENT = 0, 1
_WRAPPERS = ("index", "create", "update", "delete")  # the action lines of a _bulk file


class UbiSettings(NamedTuple):
    """The ``[ubi]`` table of ``--config``. A ``*_field`` is a path into the record, dotted for nested objects
    (``query_attributes.experiment``); a key that holds the dots itself (a flattened export) is found too."""

    actions: tuple[tuple[str, str], ...] = DEFAULT_ACTIONS
    experiment_field: str = "query_attributes.experiment"
    arm_field: str = "query_attributes.arm"
    unit_field: str = "client_id"
    session_field: str = "session_id"
    dwell_field: str = "event_attributes.dwell_time"
    #: the object of the query record whose values become the ranking's ``attributes`` (segments)
    attributes_field: str = "query_attributes"
    normalise_query: bool = True
    check_ordinal: bool = True
    ordinal_base: int = 1
    #: event time records are held back for; ``None``: the attribution window plus the allowed lateness
    hold: float | None = None


#: Where an event names the hit it acts on: the object's id, and its ordinal (position) in the query's hits.
OBJECT_ID = "event_attributes.object.object_id"
ORDINAL = "event_attributes.position.ordinal"
_TEXT_SETTINGS = ("experiment_field", "arm_field", "unit_field", "session_field", "dwell_field", "attributes_field")


def ubi_settings(path: str | None) -> UbiSettings:
    """The ``[ubi]`` table of a ``--config`` file (the defaults without one).

    Raises:
        ConfigError: the file cannot be read, or the table holds an unknown or unusable setting.
    """
    if path is None:
        return UbiSettings()
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"--config {path}: {error}") from None
    table = document.get("stream_eval", document).get("ubi", {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"--config {path}: ubi must be a table ([ubi])")
    return settings_of(table, f"--config {path}: ubi")


def settings_of(table: Mapping[str, Any], origin: str = "ubi") -> UbiSettings:
    """:class:`UbiSettings` from a table of settings.

    >>> settings_of({"arm_field": "application", "actions": {"click": "click", "watch": "click"}}).actions
    (('click', 'click'), ('watch', 'click'))
    """
    known = set(UbiSettings._fields)
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{origin}: unknown setting(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    for name, value in table.items():
        if name in _TEXT_SETTINGS:
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{origin}.{name}: expected a field name, got {value!r}")
            values[name] = value
        elif name in ("normalise_query", "check_ordinal"):
            values[name] = parse_boolean(value, f"{origin}.{name}")
        elif name == "ordinal_base":
            if type(value) is not int or value not in (0, 1):
                raise ConfigError(f"{origin}.ordinal_base: expected 0 or 1, got {value!r}")
            values[name] = value
        elif name == "hold":
            values[name] = parse_duration(value, f"{origin}.hold")
        else:  # actions
            if not isinstance(value, Mapping) or not all(isinstance(k, str) and k for k in value.values()):
                raise ConfigError(f'{origin}.actions: expected a table of action_name = "kind", e.g. '
                                  '[ubi.actions] click = "click"')
            values[name] = tuple((str(action), str(kind)) for action, kind in value.items())
    return UbiSettings(**values)


def ubi_config(config: Config, settings: UbiSettings) -> Config:
    """``config`` with a grade for each feedback kind that ``settings.actions`` names: ``[kinds]`` as given, plus
    :data:`DEFAULT_GRADES` for the default kinds it does not set (``click`` is 1 anyway).

    >>> dict(ubi_config(Config(kinds=(("purchase", 5.0),)), UbiSettings()).kinds)
    {'purchase': 5.0, 'add_to_cart': 2.0}

    Raises:
        ConfigError: an action maps to ``label`` (which needs a grade of its own) or to a kind without a grade.
    """
    kinds = ubi_kinds(config.kinds, settings)
    return dataclasses.replace(config, kinds=kinds) if kinds != config.kinds else config


def ubi_kinds(kinds: tuple[tuple[str, float], ...], settings: UbiSettings) -> tuple[tuple[str, float], ...]:
    """:func:`ubi_config`'s ``[kinds]``, before a :class:`Config` is made of them (so that ``sat_kinds`` may name
    ``purchase`` on UBI input without a ``[kinds]`` table)."""
    grades = {"click": 1.0, **dict(kinds)}
    added: dict[str, float] = {}
    for action, kind in settings.actions:
        if kind in grades or kind in added:
            continue
        if kind not in DEFAULT_GRADES:
            raise ConfigError(f"ubi.actions.{action}: the kind {kind!r} has no grade: give it one in the config's "
                              f"[kinds] table ({kind} = 2, say)")
        added[kind] = DEFAULT_GRADES[kind]
    return kinds + tuple(added.items())


def normalise_query(text: str) -> str:
    """The query id of a user's query text: Unicode NFKC, case folded, white space runs as one space, trimmed.

    >>> normalise_query("  Running   SHOES ")
    'running shoes'
    >>> normalise_query("Straße")
    'strasse'
    """
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


class UbiCounts:
    """What the conversion saw: records read, events made, records rejected (by ``kind: code``) and ignored."""

    __slots__ = ("queries", "events", "rankings", "feedback", "invalid", "ignored", "no_hits", "zero_results",
                 "of_no_hits", "steps", "backwards", "_previous")

    def __init__(self) -> None:
        self.queries = self.events = self.rankings = self.feedback = 0
        self.invalid: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()  # events by action name
        self.no_hits = 0  # queries without hits: an empty list (zero-result rankings) or none
        self.zero_results = 0  # ... of them an empty list
        self.of_no_hits = 0  # events of such queries
        # per input (queries, events): timestamps read after another, how many of them earlier than the one before
        self.steps, self.backwards = [0, 0], [0, 0]
        self._previous = [math.nan, math.nan]

    def timed(self, k: int, ts: float) -> None:
        """Input ``k``'s next record has timestamp ``ts``."""
        previous, self._previous[k] = self._previous[k], ts
        if previous == previous:  # (not the first)
            self.steps[k] += 1
            self.backwards[k] += ts < previous

    def ignore(self, action: str) -> None:
        if action not in self.ignored and len(self.ignored) >= MAX_IGNORED_NAMES:
            action = "__other__"
        self.ignored[action] += 1

    def summary(self) -> dict[str, Any]:
        """The ``ubi`` section of the report."""
        return {"queries": self.queries, "events": self.events, "rankings": self.rankings, "feedback": self.feedback,
                "invalid": dict(self.invalid.most_common()), "ignored_actions": dict(self.ignored.most_common()),
                "queries_without_hits": self.no_hits, "zero_result_rankings": self.zero_results,
                "events_of_queries_without_hits": self.of_no_hits}

    def describe(self) -> str:
        """One line for the terminal."""
        text = (f"ubi: read {self.queries:,} queries and {self.events:,} events; made {self.rankings:,} rankings and "
                f"{self.feedback:,} feedback events")
        ignored = sum(self.ignored.values())
        if ignored:
            names = ", ".join(f"{name} x{n}" for name, n in self.ignored.most_common(5))
            more = ", ..." if len(self.ignored) > 5 else ""
            text += f"; ignored {ignored:,} events of actions not mapped to feedback ({names}{more})"
        if self.no_hits:
            text += (f"; {self.no_hits:,} queries without hits ({self.zero_results:,} zero-result rankings, "
                     f"{self.no_hits - self.zero_results:,} without a list of hits left out; their "
                     f"{self.of_no_hits:,} events left out)")
        if self.invalid:
            rejected = ", ".join(f"{reason} x{n}" for reason, n in self.invalid.most_common())
            text += f"; rejected {sum(self.invalid.values()):,} records ({rejected})"
        for k, name in enumerate(("ubi_queries", "ubi_events")):
            if self.steps[k] >= 10 and self.backwards[k] > self.steps[k] // 2:
                text += (f"; the {name} export is mostly in descending time order ({self.backwards[k]:,} of "
                         f"{self.steps[k]:,} timestamps earlier than the one before): queries and events then meet "
                         "late or not at all; sort it by timestamp ascending")
        if not self.rankings and any(reason.endswith("missing_action") for reason in self.invalid):
            text += ("; no ranking was made and the events have no action_name: are the two inputs swapped? (the "
                     "ubi_queries export comes first, then ubi_events)")
        return text


class UbiLine(NamedTuple):
    """A converted event: its JSON line and where its UBI record is."""

    where: str
    line: bytes


# -- reading -----------------------------------------------------------------------------------------------------

class _Problem(NamedTuple):
    code: str
    reason: str


Record = tuple[str, "dict[str, Any] | _Problem", bytes]  # where, the record or why there is none, its bytes


def read_records(path: str, damaged: list[str] | None = None,
                 read: Callable[[int], None] | None = None) -> Iterator[Record]:
    """The UBI records of an export: JSON Lines (gzip recognised; ``-`` = stdin) of records, of search hits
    (``{"_source": {...}}``, as ``_search``, scroll and dump tools write them) or of ``_bulk`` bodies (the action
    lines are skipped); one indented JSON document, read whole (a ``_search`` response, or an array of records); or
    Parquet (a name ending ``.parquet``; one column per field, nested fields as structs or maps). ``read(n)``: told
    the bytes read so far. With ``damaged``, a file that breaks ends there, the reason added to it (as in replay)."""
    if path.lower().endswith(".parquet"):
        yield from _parquet_records(path, damaged, read)
        return
    from stream_eval.engine.replay import read_chunks

    source = "stdin" if path == "-" else path
    chunks = read_chunks(path, damaged=damaged)
    first = next(chunks, None)
    if first is None:
        return
    if _one_document(first[0]):
        whole = first[0] + b"".join(chunk for chunk, _, _ in chunks)
        try:
            document = orjson.loads(whole)
        except orjson.JSONDecodeError:  # then it is read as lines, which says which are not JSON
            document = None
        if document is not None:
            if read is not None:
                read(len(whole))
            yield from _document_records(document, source)
            return
        chunks = iter([(whole, 1, len(whole))])
    else:
        chunks = itertools.chain([first], chunks)
    for chunk, first_line, position in chunks:
        yield from _line_records(chunk, first_line, source)
        if read is not None:
            read(position)


def _one_document(chunk: bytes) -> bool:
    """Whether a file that starts with ``chunk`` is one JSON document over several lines: its first line opens an
    object and holds nothing else (as indented JSON does), or opens an object or an array and is not JSON by itself,
    nor is the line after it (a ``_search`` response written with a hit per line). A JSON Lines file whose first
    line is broken stays JSON Lines, its second line being a record: it is not read whole."""
    lines = [line.strip() for line in chunk.lstrip().split(b"\n", 8)[:8] if line.strip()][:2] or [b""]
    first = lines[0]
    if first == b"{":
        return True
    if first[:1] not in (b"{", b"[") or is_json(first):
        return False
    return first[:1] == b"[" or (len(lines) > 1 and not is_json(lines[1]))


def _line_records(chunk: bytes, first_line: int, source: str) -> Iterator[Record]:
    verdicts = scan.screen_lines(np.frombuffer(chunk, dtype=np.uint8)).tolist()
    k = 0
    for offset, line in enumerate(chunk.split(b"\n")):
        if not line.strip():
            continue
        verdict = verdicts[k]
        k += 1
        where = f"{source}:{first_line + offset}"
        problem = screened(line, verdict) if verdict else None
        if problem is not None:
            yield where, _Problem(*problem), line
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            yield where, _Problem("bad_json", str(error)), line
            continue
        for where_of, record in _unwrapped(value, where):
            yield where_of, record, line


def message_record(value: bytes | None, where: str) -> tuple[dict[str, Any] | _Problem, Any]:
    """The UBI record of one Kafka message (a record, or a search hit holding one in ``_source``), or why there is
    none, checked as a line of an export is; and the parsed JSON value (``None`` when it is not JSON)."""
    if not value:
        return _Problem("bad_json", "empty message (no value)"), None
    verdict = screen_one(value)
    problem = screened(value, verdict) if verdict else None
    if problem is not None:
        return _Problem(*problem), None
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as error:
        return _Problem("bad_json", str(error)), None
    records = list(_unwrapped(parsed, where))
    if len(records) != 1:
        return _Problem("bad_record", f"{len(records)} records in one message: send one record a message"), parsed
    return records[0][1], parsed


def _unwrapped(value: Any, where: str) -> Iterator[tuple[str, dict[str, Any] | _Problem]]:
    """The records of one JSON value: itself, its ``_source``, a ``_search`` response's hits, an array's elements;
    nothing for a ``_bulk`` action line."""
    if isinstance(value, list):
        for n, element in enumerate(value, 1):
            yield from _unwrapped(element, f"{where} record {n}")
        return
    if not isinstance(value, dict):
        yield where, _Problem("bad_record", f"a JSON {type(value).__name__}, not an object")
        return
    source = value.get("_source")
    if isinstance(source, dict):
        yield where, source
        return
    if len(value) == 1 and next(iter(value)) in _WRAPPERS and isinstance(next(iter(value.values())), dict):
        return  # {"index": {"_index": ..., "_id": ...}}
    hits = value.get("hits")
    if isinstance(hits, dict) and isinstance(hits.get("hits"), list) and "query_id" not in value:
        for n, hit in enumerate(hits["hits"], 1):
            yield from _unwrapped(hit, f"{where} hit {n}")
        return
    yield where, value


def _document_records(document: Any, source: str) -> Iterator[Record]:
    for where, record in _unwrapped(document, source):
        yield where, record, b""


def _parquet_records(path: str, damaged: list[str] | None,
                     read: Callable[[int], None] | None) -> Iterator[Record]:
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as error:
        if damaged is None or isinstance(error, FileNotFoundError):
            raise
        damaged.append(f"{path}: {str(error).rstrip('.')}; nothing was read")
        return
    size, total = os.path.getsize(path), max(file.metadata.num_rows, 1)
    rows = 0
    batches = file.iter_batches(batch_size=BATCH)
    while True:
        try:
            batch = next(batches, None)
        except (OSError, pa.ArrowException) as error:
            if damaged is None:
                raise
            damaged.append(f"{path}: {error} after row {rows}; the records before were read")
            return
        if batch is None:
            return
        for record in batch.to_pylist():
            rows += 1
            yield f"{path}:row {rows}", {k: v for k, v in record.items() if v is not None}, b""
        if read is not None:
            read(size * rows // total)


# -- converting ----------------------------------------------------------------------------------------------------

class _Query(NamedTuple):
    request_id: str
    ts: float
    hits: list[str]
    positions: dict[str, int]
    query_id: str | None
    session_id: str | None
    experiment: str
    arm: str
    unit_id: str | None
    id_field: str | None
    where: str
    attributes: dict[str, str] | None = None


class _Event(NamedTuple):
    request_id: str
    ts: float
    kind: str
    item: str | None
    ordinal: int | None
    dwell: float | None
    id_field: str | None
    where: str


def lookup(record: dict[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` of a record (``None`` when absent): a key that holds the whole path first,
    then nested objects (Parquet maps, read as lists of pairs, too).

    >>> lookup({"query_attributes": {"experiment": "ranker-v2"}}, "query_attributes.experiment")
    'ranker-v2'
    >>> lookup({"query_attributes.arm": "b"}, "query_attributes.arm")
    'b'
    """
    return _Path(path)(record)


class _Path:
    """:func:`lookup` of one path, split once."""

    __slots__ = ("path", "parts")

    def __init__(self, path: str) -> None:
        self.path, self.parts = path, tuple(path.split("."))

    def __call__(self, record: dict[str, Any]) -> Any:
        value = record.get(self.path)
        if value is not None or len(self.parts) == 1:
            return value
        node: Any = record
        for part in self.parts:
            if type(node) is not dict:
                if type(node) is not list or not all(type(pair) is tuple and len(pair) == 2 for pair in node):
                    return None
                node = dict(node)
            node = node.get(part)
            if node is None:
                return None
        return node


def _label(value: Any) -> str | None:
    """A record's value as a label (experiment, arm, session, unit): text as it is, a number or a boolean as its
    JSON text; ``None`` for anything else or an empty text."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float) and math.isfinite(value):
        return str(value)
    return None


def _id(value: Any) -> str | None:
    """An object id (text or integer) as text; ``None`` for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


class UbiConverter:
    """UBI records to event lines, for one :class:`Config` (event times, the horizon) and :class:`UbiSettings`.

    :meth:`convert` merges the queries and events, checks each record and yields, in timestamp order, a
    :class:`UbiLine` for each event made and an :class:`~stream_eval.events.schema.Invalid` for each record
    rejected (at once, when it is read). ``counts`` counts all of it.
    """

    def __init__(self, config: Config, settings: UbiSettings | None = None, counts: UbiCounts | None = None) -> None:
        self.config = config
        self.settings = settings = settings or UbiSettings()
        self.actions = dict(settings.actions)
        horizon = config.attribution_window + config.allowed_lateness
        self.hold = horizon if settings.hold is None else settings.hold
        self.keep = 2 * horizon  # how long a query's hits are kept to check its events, after it is released
        self.counts = counts or UbiCounts()
        self._experiment, self._arm, self._unit, self._session, self._dwell, self._attributes = (
            _Path(path) for path in (settings.experiment_field, settings.arm_field, settings.unit_field,
                                     settings.session_field, settings.dwell_field, settings.attributes_field))
        # (paths, so that a flattened export's keys ``event_attributes.object.object_id`` work too)
        self._object_id, self._ordinal, self._object_id_field = (
            _Path(path) for path in (OBJECT_ID, ORDINAL, "event_attributes.object.object_id_field"))
        self._heap: list[tuple[float, int, int, _Query | _Event]] = []
        self._seq = 0
        # queries read (their hits, to check events) and the first session named by an event of each query, both in
        # the order read, forgotten once released ``keep`` ago
        self._queries: dict[str, _Query] = {}
        self._query_times: deque[tuple[float, str]] = deque()
        self._sessions: dict[str, str] = {}
        self._session_times: deque[tuple[float, str]] = deque()

    # -- the merge ---------------------------------------------------------------------------------------------------
    def convert(self, queries: Iterable[Record], events: Iterable[Record]) -> Iterator[UbiLine | Invalid]:
        """The events of the two inputs in timestamp order, and the rejected records (see the class)."""
        readers = [iter(queries), iter(events)]
        last = [-math.inf, -math.inf]  # the latest timestamp read from each input
        alive = [True, True]
        while alive[0] or alive[1]:
            k = 0 if alive[0] and (not alive[1] or last[0] <= last[1]) else 1
            record = next(readers[k], None)
            if record is None:
                alive[k] = False
            else:
                pending = self.read(k, *record)
                if isinstance(pending, Invalid):
                    yield pending
                    continue
                if isinstance(pending, float):  # a record that makes no event, read at this time
                    last[k] = max(last[k], pending)
                    continue
                if pending is None:
                    continue
                last[k] = max(last[k], pending.ts)
                heapq.heappush(self._heap, (pending.ts, k, self._seq, pending))
                self._seq += 1
            if alive[0] and alive[1]:
                clock = last[0] if last[0] < last[1] else last[1]
            elif alive[0] or alive[1]:
                clock = last[0] if alive[0] else last[1]
            else:
                break
            heap = self._heap
            if heap and heap[0][0] <= clock - self.hold:  # (a record that makes no event: released next time)
                yield from self._release(clock - self.hold)
        yield from self._release(math.inf)

    def _release(self, until: float) -> Iterator[UbiLine | Invalid]:
        heap = self._heap
        while heap and heap[0][0] <= until:
            _, k, _, pending = heapq.heappop(heap)
            made = self.make(pending)
            if made is not None:
                yield made
        self.forget(until)

    # -- one record at a time (convert, and the worker reading the UBI topics: stream/ubi_topics.py) ------------------
    def read(self, k: int, where: str, value: dict[str, Any] | _Problem, raw: bytes,
             ) -> _Query | _Event | float | Invalid | None:
        """Record ``value`` of input ``k`` (0: a query, 1: an event), counted and checked: the query or event to
        :meth:`make` an event of once its time is released; the time of a record that makes no event (``None``
        when it has none); or the :class:`Invalid` that rejects it, at once."""
        if k == _QUERY:
            self.counts.queries += 1
        else:
            self.counts.events += 1
        try:
            if isinstance(value, _Problem):
                raise EventError(*value)
            read = self._query(where, value) if k == _QUERY else self._event(where, value)
            if read is not None:
                self.counts.timed(k, read if isinstance(read, float) else read.ts)
            return read
        except EventError as reject:
            kind = "ranking" if k == _QUERY else "feedback"
            self.counts.invalid[f"{kind}: {reject.code}"] += 1
            return Invalid(kind, reject.code, reject.reason, where, raw)

    def make(self, pending: _Query | _Event) -> UbiLine | Invalid | None:
        """The event line of a query or event :meth:`read` earlier (with the sessions and hits read since), the
        :class:`Invalid` rejecting an event its query's hits contradict, or ``None`` (an event of a query without
        hits)."""
        return self._ranking(pending) if isinstance(pending, _Query) else self._feedback(pending)

    def forget(self, until: float) -> None:
        """Forget the queries and sessions read ``keep`` before event time ``until``."""
        if until < math.inf:
            _forget(self._query_times, self._queries, until - self.keep)
            _forget(self._session_times, self._sessions, until - self.keep)

    # -- reading a record --------------------------------------------------------------------------------------------
    def _time(self, record: dict[str, Any]) -> float:
        value = record.get("timestamp")
        try:
            if value is None:
                raise EventError("missing_ts", "timestamp: missing")
            ts = _epoch_seconds(value)
        except OverflowError:
            raise EventError("bad_ts", f"timestamp: {value!r} is out of range") from None
        if not self.config.min_ts <= ts <= self.config.max_ts:
            number = isinstance(value, int | float) and not isinstance(value, bool) or (
                isinstance(value, str) and value.isdigit())
            seconds = number and self.config.min_ts <= ts * 1000 <= self.config.max_ts
            hint = "; epoch seconds? a number is read as epoch milliseconds, as UBI writes them" if seconds else ""
            raise EventError("ts_out_of_range", f"timestamp: {value!r} is outside the event times a log can hold "
                             f"(settings min_ts, max_ts){hint}")
        return ts

    @staticmethod
    def _request_id(record: dict[str, Any]) -> str:
        value = record.get("query_id")
        request_id = _id(value)  # (an integer as its text, as object ids)
        if not request_id:
            raise EventError("missing_query_id", "query_id: missing" if value is None else
                             f"query_id: {value!r} is not a text of at least one character or an integer")
        return request_id

    def _query(self, where: str, record: dict[str, Any]) -> _Query | float | None:
        settings = self.settings
        request_id = self._request_id(record)
        ts = self._time(record)
        raw_hits = record.get("query_response_hit_ids")
        hits = [] if raw_hits is None else list(map(_id, raw_hits)) if isinstance(raw_hits, list) else None
        if hits is None or None in hits:
            raise EventError("bad_hits", f"query_response_hit_ids: {raw_hits!r} is not a list of ids (texts or "
                             "integers)")
        text = record.get("user_query")
        query_id = (normalise_query(text) if settings.normalise_query else text) if isinstance(text, str) else None
        experiment, arm = _label(self._experiment(record)), _label(self._arm(record))
        query = _Query(request_id, ts, hits, {}, query_id or None,  # type: ignore[arg-type]  # no None in hits
                       _label(self._session(record)), experiment or "default", arm or "default",
                       _label(self._unit(record)), _id(record.get("object_id_field")), where,
                       self._attributes_of(record))
        if request_id not in self._queries:
            self._queries[request_id] = query
            self._query_times.append((ts, request_id))
        if not hits:
            self.counts.no_hits += 1
            if raw_hits is None:  # (no list of hits logged: nothing to evaluate)
                return ts
            self.counts.zero_results += 1  # (a search that found nothing: a zero-result ranking, as in an event log)
        return query

    def _attributes_of(self, record: dict[str, Any]) -> dict[str, str] | None:
        """A query's ``attributes``: each key of the object at ``attributes_field`` (a JSON object, a Parquet struct
        or map; in a flattened export the record's keys ``query_attributes.KEY``) whose value is a label, as
        :func:`_label` makes experiment and arm (text as it is; a number or a boolean as its JSON text). Other
        values (nested objects, lists, null, empty text) are left out: they cannot be a segment's value, and a
        missing field is the segment ``__missing__``."""
        node = self._attributes(record)
        pairs = node.items() if type(node) is dict else node if type(node) is list else ()
        prefix = self._attributes.path + "."
        flat = [(key[len(prefix):], value) for key, value in record.items() if key.startswith(prefix)]
        attributes = {}
        for pair in itertools.chain(pairs, flat):
            if type(pair) is tuple and len(pair) == 2 and isinstance(pair[0], str) and (
                    value := _label(pair[1])) is not None:
                attributes[pair[0]] = value
        return attributes or None

    def _event(self, where: str, record: dict[str, Any]) -> _Event | float | None:
        action = record.get("action_name")
        if not isinstance(action, str) or not action:
            raise EventError("missing_action", "action_name: missing" if action is None else
                             f"action_name: {action!r} is not a text")
        request_id = _id(record.get("query_id"))
        session = _label(self._session(record))
        kind = self.actions.get(action)
        if kind is None:
            self.counts.ignore(action)
            try:
                ts: float | None = self._time(record)
            except EventError:
                ts = None
            self._note_session(request_id, session, ts)
            return ts
        request_id = self._request_id(record)
        ts = self._time(record)
        self._note_session(request_id, session, ts)
        raw_item = self._object_id(record)
        item = _id(raw_item)
        if raw_item is not None and item is None:
            raise EventError("bad_object", f"{OBJECT_ID}: {raw_item!r} is not a text or an integer")
        raw_ordinal = self._ordinal(record)
        ordinal = _ordinal(raw_ordinal)
        if raw_ordinal is not None and ordinal is None:
            raise EventError("bad_ordinal", f"{ORDINAL}: {raw_ordinal!r} is not an integer")
        raw_dwell = self._dwell(record)
        dwell = None
        if raw_dwell is not None:
            if isinstance(raw_dwell, bool) or not isinstance(raw_dwell, int | float) or not (
                    math.isfinite(raw_dwell) and raw_dwell >= 0):
                raise EventError("bad_dwell", f"{self.settings.dwell_field}: {raw_dwell!r} is not a number of seconds "
                                 ">= 0")
            dwell = float(raw_dwell)
        id_field = _id(self._object_id_field(record))
        return _Event(request_id, ts, kind, item, ordinal, dwell, id_field, where)

    def _note_session(self, request_id: Any, session: str | None, ts: float | None) -> None:
        """Keep the session an event names for its query's ranking (the first one read; none from an event without
        a valid time, which says nothing of when it was)."""
        if session is not None and ts is not None and isinstance(request_id, str) and request_id not in self._sessions:
            self._sessions[request_id] = session
            self._session_times.append((ts, request_id))

    # -- making events -----------------------------------------------------------------------------------------------
    def _ranking(self, query: _Query) -> UbiLine:
        event: dict[str, Any] = {"type": "ranking", "request_id": query.request_id, "ts": query.ts,
                                 "items": query.hits}
        session = query.session_id or self._sessions.get(query.request_id)
        for name, value in (("query_id", query.query_id), ("session_id", session), ("unit_id", query.unit_id)):
            if value is not None:
                event[name] = value
        event["experiment"], event["arm"] = query.experiment, query.arm
        if query.attributes is not None:
            event["attributes"] = query.attributes
        self.counts.rankings += 1
        return UbiLine(query.where, orjson.dumps(event))

    def _feedback(self, event: _Event) -> UbiLine | Invalid | None:
        query = self._queries.get(event.request_id)
        item = event.item
        try:
            if query is not None:
                if not query.hits:
                    self.counts.of_no_hits += 1
                    return None
                item = self._checked_item(event, query)
            elif item is None:
                raise EventError("missing_object", f"{OBJECT_ID}: missing, and the query's hits "
                                 "are not known (no query record, or one too far away in time) to take it from the "
                                 "ordinal")
        except EventError as reject:
            self.counts.invalid[f"feedback: {reject.code}"] += 1
            return Invalid("feedback", reject.code, reject.reason, event.where)
        line: dict[str, Any] = {"type": "feedback", "request_id": event.request_id, "item": item, "kind": event.kind,
                                "ts": event.ts}
        if event.dwell is not None:
            line["dwell"] = event.dwell
        self.counts.feedback += 1
        return UbiLine(event.where, orjson.dumps(line))

    def _checked_item(self, event: _Event, query: _Query) -> str:
        """The item of an event whose query is known: its object id, checked against the hits (or the hit at its
        ordinal, when it has no object id)."""
        hits = query.hits
        if event.id_field is not None and query.id_field is not None and event.id_field != query.id_field:
            raise EventError("id_field_mismatch", f"object_id_field: {event.id_field!r}, but the query's hits are ids "
                             f"of {query.id_field!r}")
        index = None if event.ordinal is None else event.ordinal - self.settings.ordinal_base
        at = hits[index] if index is not None and 0 <= index < len(hits) else None
        if event.item is None:
            if at is None:
                raise EventError("missing_object", f"{OBJECT_ID}: missing" + (
                    "" if event.ordinal is None else f", and ordinal {event.ordinal} is outside the query's "
                    f"{len(hits)} hits (ordinals {self.settings.ordinal_base} to "
                    f"{len(hits) - 1 + self.settings.ordinal_base})"))
            return at
        if not query.positions:
            query.positions.update(zip(hits, range(len(hits)), strict=True))
        if event.item not in query.positions:
            raise EventError("unknown_hit", f"object_id {event.item!r} is not among the {len(hits)} hits of query "
                             f"{event.request_id!r}")
        if self.settings.check_ordinal and event.ordinal is not None and at != event.item:
            held = f"{at!r}" if at is not None else "nothing"
            raise EventError("ordinal_mismatch", f"ordinal {event.ordinal}: the query's hits hold {held} there, "
                             f"{event.item!r} at {query.positions[event.item] + self.settings.ordinal_base}")
        return event.item


def _forget(times: deque[tuple[float, str]], table: dict[str, Any], before: float) -> None:
    """Forget the entries of ``table`` read with a timestamp before ``before`` (``times``: in the order read)."""
    while times and times[0][0] < before:
        _, request_id = times.popleft()
        table.pop(request_id, None)


def _ordinal(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _epoch_seconds(value: Any) -> float:
    """Epoch seconds of a UBI timestamp: ISO-8601 text with a UTC offset (``Z``, ``+00:00`` or ``+0000``), or epoch
    milliseconds (a number, or text of digits), as OpenSearch's ``date`` fields take them; a datetime (a Parquet
    timestamp column) without a time zone is UTC.

    >>> _epoch_seconds("2026-01-01T00:00:00.250+0000"), _epoch_seconds(1767225600250)
    (1767225600.25, 1767225600.25)
    """
    if type(value) is str:  # the usual: ISO-8601 with an offset
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if moment.tzinfo is not None:
                return moment.timestamp()
    if isinstance(value, datetime):
        return (value if value.tzinfo is not None else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, bool):
        raise EventError("bad_ts", f"timestamp: {value!r} is not a time")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise EventError("bad_ts", "timestamp: not a finite number")
        return value / 1000.0
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value) / 1000.0
    if isinstance(value, str):
        return parse_time(value.strip(), "timestamp")
    raise EventError("bad_ts", f"timestamp: {value!r} is not a time")


# -- the standard path ---------------------------------------------------------------------------------------------

def decoded(items: Iterable[UbiLine | Invalid | Watermark], config: Config,
            batch: int = BATCH) -> Iterator[list[CompactRanking | Event | Invalid]]:
    """The events of converted lines, decoded and validated by the standard decoder
    (:func:`~stream_eval.events.schema.decode_chunk_compact`, a batch of lines at a time: rankings compact, as the
    join keeps them; a line rejected there is invalid where its UBI record is), in batches for the engine; rejected
    records (and watermarks) as they came."""
    out: list[Any] = []
    lines: list[bytes] = []
    places: list[int] = []
    wheres: list[str] = []
    for item in items:
        if type(item) is UbiLine:
            places.append(len(out))
            wheres.append(item.where)
            lines.append(item.line)
        out.append(item)
        if len(out) >= batch:
            yield _decoded_batch(out, lines, places, wheres, config)
            out, lines, places, wheres = [], [], [], []
    if out:
        yield _decoded_batch(out, lines, places, wheres, config)


def _decoded_batch(out: list[Any], lines: list[bytes], places: list[int], wheres: list[str],
                   config: Config) -> list[CompactRanking | Event | Invalid]:
    if lines:
        for place, where, event in zip(places, wheres, decode_chunk_compact(b"\n".join(lines), config), strict=True):
            if type(event) is Invalid:
                event.where = where
            out[place] = event
    return out


def ubi_lines(converter: UbiConverter, queries: str, events: str,
              damaged: list[str] | None = None) -> Iterator[bytes]:
    """The event lines of two UBI exports (what ``produce --input-format ubi`` sends); rejected records are counted
    in ``converter.counts``, not sent."""
    for item in converter.convert(read_records(queries, damaged), read_records(events, damaged)):
        if type(item) is UbiLine:
            yield item.line
