"""Parquet input (Apache Arrow): events read from columns, as :func:`~stream_eval.events.schema.decode_chunk_columns`
gives them from JSON Lines.

A file holds rows of events, one column per field of docs/contract.md §1 (``--columns
request_id=req_id,items=doc_ids`` maps a field to a column of another name). A ``type`` column says what each row
is; without one, a row with ``items`` is a ranking, else one with ``item`` is feedback, else one with ``verdict`` a
judgment. A null cell is an absent field. ``ts`` may be a number (epoch seconds), a timestamp (UTC when it has no
time zone) or an ISO-8601 string. ``attributes`` (a ranking's segment fields) is a ``map<string, string>`` column,
which holds any JSON object of string values, or a struct of string fields (what ``pyarrow.json`` infers from JSON
Lines), whose null fields are absent keys: each row's value becomes the dict a JSON line's object would.

The file is read in record batches. The plainest rows, as in the JSON Lines reader, never become Python objects
one by one: feedback goes straight from Arrow's string buffers into :class:`~stream_eval.events.schema.FeedbackColumns`,
and a ranking's items are written by Arrow into one buffer that the join copies from (``PlainRankings``), checked
by the same compiled pass as JSON rankings. Every other row (a judgment, a watermark, a ranking with ``teams``, an
item with a quote or non-ASCII text, anything invalid) is written as one JSON line and decoded by
:func:`~stream_eval.events.schema.decode_line`, so that it is accepted or rejected exactly as in a JSON Lines log,
with the same reason.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stream_eval.config import MAX_GRADE, Config, ConfigError
from stream_eval.events import compiled, scan
from stream_eval.events.schema import (
    NO_FEEDBACK,
    Chunk,
    CompactRanking,
    FeedbackColumns,
    Invalid,
    PlainRankings,
    Ranking,
    decode_line,
    kind_codes,
    labels_of,
    validator,
)

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

#: The fields a column can hold (docs/contract.md §1, all event types).
FIELDS = ("type", "request_id", "ts", "items", "scores", "query_id", "session_id", "experiment", "arm", "unit_id",
          "teams", "subtopics", "item", "kind", "grade", "verdict", "end", "dwell", "attributes")
#: Rows read at a time. 64k rows is ~2 MB of the benchmark's columns, like the JSON reader's chunks.
BATCH_ROWS = 65_536
_NO_BYTES = np.zeros(0, dtype=np.uint8)
_FEEDBACK, _RANKING = 1, 2
#: The fields of a ranking read by the fast path.
_RANKING_FIELDS = frozenset(("request_id", "items", "scores", "query_id", "session_id", "experiment", "arm", "unit_id"))
#: Rows of the column matrix that ``PlainRankings`` reads (request id and items bounds; the rest unused).
_PLAIN_ROWS = 1 + max(max(pair) for pair in scan.COLUMNS.values())


class ColumnError(ConfigError):
    """A column mapping that names an unknown field, or a file that lacks a column it needs."""


def parse_columns(text: str | None) -> dict[str, str]:
    """``field=column`` pairs, comma-separated (``request_id=req_id,items=doc_ids``), as a dict.

    >>> parse_columns("request_id=req_id, items=doc_ids")
    {'request_id': 'req_id', 'items': 'doc_ids'}
    """
    mapping: dict[str, str] = {}
    for pair in (text or "").split(","):
        if not pair.strip():
            continue
        field, equals, column = (part.strip() for part in pair.partition("="))
        if not equals or not field or not column:
            raise ColumnError(f"--columns: {pair.strip()!r} is not FIELD=COLUMN")
        if field not in FIELDS:
            raise ColumnError(f"--columns: {field!r} is not a field of an event (one of {', '.join(FIELDS)})")
        if field in mapping and mapping[field] != column:  # (which one was meant? the last one was taken)
            raise ColumnError(f"--columns: {field} is given twice ({mapping[field]} and {column})")
        mapping[field] = column
    return mapping


def read_parquet(path: str, config: Config, columns: Mapping[str, str] | None = None,
                 damaged: list[str] | None = None, batch_rows: int = BATCH_ROWS) -> Iterator[tuple[Chunk, int]]:
    """The events of a Parquet file, a record batch at a time: ``(chunk, bytes of the file read so far)``, the
    second an estimate from the rows read (for progress).

    With ``damaged``, a file that cannot be read to its end ends where it breaks: the batches before are given
    and the reason is added to ``damaged`` (as :func:`~stream_eval.engine.replay.read_chunks` does for gzip).

    Raises:
        ColumnError: ``columns`` names a column the file does not have, or the file has no column that says
            what its rows are (``type``, ``items``, ``item`` or ``verdict``).
    """
    mapping = dict(columns or {})
    try:
        file = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as error:  # not Parquet, empty, cut before its footer
        if damaged is None or isinstance(error, FileNotFoundError):
            raise
        damaged.append(f"{path}: cannot be read as Parquet ({error}); no events read from it")
        return
    present = set(file.schema_arrow.names)
    missing = sorted(column for column in mapping.values() if column not in present)
    if missing:
        raise ColumnError(f"{path}: no column {', '.join(map(repr, missing))} (columns: {', '.join(sorted(present))})")
    selected = {field: mapping.get(field, field) for field in FIELDS if mapping.get(field, field) in present}
    if not selected.keys() & {"type", "items", "item", "verdict"}:
        raise ColumnError(f"{path}: no column type, items, item or verdict: nothing says what a row is "
                          "(map one with --columns)")
    size = os.path.getsize(path)
    total = max(file.metadata.num_rows, 1)
    rows = 0
    read = list(dict.fromkeys(selected.values()))
    for groups in _row_group_runs(file, batch_rows):
        broken: Exception | None = None
        try:
            # a run of row groups at a time: a damaged one ends the file where it starts
            batches = list(file.iter_batches(batch_size=batch_rows, row_groups=groups, columns=read))
        except (OSError, pa.ArrowException) as error:
            if damaged is None:
                raise
            broken, batches = error, []
            for group in groups:  # the run's groups before the damaged one are read still
                try:
                    batches.extend(file.iter_batches(batch_size=batch_rows, row_groups=[group], columns=read))
                except (OSError, pa.ArrowException):
                    break
        for batch in batches:
            fields = {field: batch.column(column) for field, column in selected.items()}
            yield decode_batch(fields, batch.num_rows, config, path, rows), size * (rows + batch.num_rows) // total
            rows += batch.num_rows
        if broken is not None and damaged is not None:
            damaged.append(f"{path}: {broken} after row {rows}; the events before were read")
            return


def _row_group_runs(file: Any, batch_rows: int) -> Iterator[list[int]]:
    """The row groups of ``file`` in runs of consecutive ones of at most ``batch_rows`` rows together (or one)."""
    run: list[int] = []
    rows = 0
    for group in range(file.metadata.num_row_groups):
        size = file.metadata.row_group(group).num_rows
        if run and rows + size > batch_rows:
            yield run
            run, rows = [], 0
        run.append(group)
        rows += size
    if run:
        yield run


def decode_batch(fields: Mapping[str, Any], n: int, config: Config, source: str = "", first_row: int = 0) -> Chunk:
    """``n`` rows of events, each field an Arrow array (absent fields: no array), as one :class:`Chunk`: the same
    events, in the same order, as the JSON lines of the same rows give. ``first_row`` numbers the rows (from 0) in
    the reasons of invalid ones."""
    fields = dict(fields)
    # attributes become the Python dicts a ranking keeps, once per batch; the Arrow columns go on without them
    attributes = _attribute_values(fields.pop("attributes", None), n)
    bad_text = np.zeros(n, dtype=np.bool_)
    for field, array in fields.items():
        if field not in ("ts", "grade", "end", "items", "scores", "teams", "subtopics", "dwell"):
            fields[field], bad = _text(array)
            bad_text |= bad
    kind = np.where(bad_text, 0, _row_kinds(fields, n))
    ts = _times(fields.get("ts"), n)
    check = validator(config)
    ts_ok = (ts >= check.min_ts) & (ts <= check.max_ts)  # NaN (null, text): not here
    rid_ok = _valid(fields.get("request_id"), n) & (_lengths(fields.get("request_id"), n) > 0)
    ok = ts_ok & rid_ok & ~_maybe_too_large(fields, n, attributes)
    feedback = np.flatnonzero((kind == _FEEDBACK) & ok & _plain_feedback(fields, n, check.graded_kinds,
                                                                          check.default_grades))
    ranked = np.flatnonzero((kind == _RANKING) & ok & _plain_ranking_rows(fields, n) & _plain_attributes(attributes))
    plain = None
    rankings: list[CompactRanking] = []
    if ranked.shape[0]:
        take = pa.array(ranked)
        plain, read = _plain_rankings({f: a.take(take) for f, a in fields.items() if f in _RANKING_FIELDS},
                                      ts[ranked], config.max_items, [attributes[k] for k in ranked.tolist()])
        ranked = ranked[read]
        rankings = plain.rankings
    fast = np.zeros(n, dtype=np.int8)
    fast[feedback], fast[ranked] = _FEEDBACK, _RANKING
    objects_at = np.flatnonzero(fast != _FEEDBACK)
    events: list[Any] = rankings
    slow = np.flatnonzero(fast == 0)
    if slow.shape[0]:
        decoded = [_slow_row(fields, k, attributes[k], bool(bad_text[k]), config, f"{source}:row {first_row + k + 1}")
                   for k in slow.tolist()]
        merged = np.empty(objects_at.shape[0], dtype=object)
        is_slow = fast[objects_at] == 0
        merged[is_slow] = decoded
        merged[~is_slow] = rankings
        events = merged.tolist()
    return Chunk(events, objects_at, _feedback_columns(fields, feedback, ts, check.default_grades), feedback,
                 plain if rankings else None)


def _text(array: Any) -> tuple[Any, Bools]:
    """A string-like column as ``large_string`` (dictionaries decoded; binary checked to be UTF-8), and which rows
    held bytes that are not UTF-8 (those become null)."""
    n = len(array)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        try:
            return array.cast(pa.large_string()), np.zeros(n, dtype=np.bool_)
        except pa.ArrowInvalid:
            values = array.to_pylist()
            bad = np.array([v is not None and not _is_utf8(v) for v in values], dtype=np.bool_)
            kept = [None if b else v for v, b in zip(values, bad.tolist(), strict=True)]
            return pa.array(kept, type=pa.large_binary()).cast(pa.large_string()), bad
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return array.cast(pa.large_string()), np.zeros(n, dtype=np.bool_)
    return array, np.zeros(n, dtype=np.bool_)  # another type: the JSON decoder says what is wrong


def _large(text: str) -> Any:
    """A ``large_string`` scalar (Arrow's string functions take their constants in the type of the columns)."""
    return pa.scalar(text, pa.large_string())


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode()
    except UnicodeDecodeError:
        return False
    return True


def _is_text(array: Any) -> bool:
    return array is not None and pa.types.is_large_string(array.type)


def _valid(array: Any, n: int) -> Bools:
    """Which rows have a value in ``array`` (none when there is no column)."""
    if array is None:
        return np.zeros(n, dtype=np.bool_)
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)


def _attribute_values(array: Any, n: int) -> list[Any]:
    """Each row's ``attributes`` as its JSON line would hold them: ``None`` where null (or no column), a dict for a
    map (a key given twice: the last value, as a JSON object's) or a struct (its null fields left out), and for a
    column of another type its Python value, which the JSON decoder then rejects (``bad_attributes``)."""
    if array is None:
        return [None] * n
    values = array.to_pylist()
    if pa.types.is_map(array.type):
        return [None if pairs is None else dict(pairs) for pairs in values]
    if pa.types.is_struct(array.type):
        return [None if row is None else {k: v for k, v in row.items() if v is not None} for row in values]
    return values  # type: ignore[no-any-return]  # Python objects


def _plain_attributes(attributes: list[Any]) -> Bools:
    """Which rows' attributes a ranking can keep as they are: none, or a dict of text to text."""
    if attributes.count(None) == len(attributes):  # no column, or none given: the common case, at C speed
        return np.ones(len(attributes), dtype=np.bool_)
    return np.fromiter((value is None or (type(value) is dict and all(type(v) is str for v in value.values()))
                        for value in attributes), dtype=np.bool_, count=len(attributes))


def _maybe_too_large(fields: Mapping[str, Any], n: int, attributes: list[Any]) -> Bools:
    """Rows whose text (every text field, the text in lists: items, teams, subtopics, and the keys and values of
    ``attributes``) is more than half of ``scan.MAX_EVENT_BYTES``: they go the slow way, whose JSON line
    :func:`decode_line` measures, so that a row is ``too_large`` exactly when its line in a JSON Lines log would
    be."""
    total = np.zeros(n, dtype=np.int64)
    if attributes.count(None) != n:
        total += np.fromiter((0 if type(value) is not dict else sum(
            len(k.encode()) + (len(v.encode()) if type(v) is str else 0) for k, v in value.items())
            for value in attributes), dtype=np.int64, count=n)
    for array in fields.values():
        if array is None:
            continue
        rows = np.arange(n, dtype=np.int64)  # the row of each value of ``values``
        values = array
        while pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
            parents = np.asarray(pc.list_parent_indices(values).to_numpy(zero_copy_only=False), dtype=np.int64)
            rows, values = rows[parents], pc.list_flatten(values)
        kind = values.type
        if len(values) and (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
                            or pa.types.is_large_binary(kind)):
            lengths = pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False)
            total += np.bincount(rows, weights=lengths, minlength=n).astype(np.int64)
    return total > scan.MAX_EVENT_BYTES // 2


def _lengths(array: Any, n: int) -> Ints:
    """The byte length of each string (0 for null or a column that is not text)."""
    if not _is_text(array):
        return np.zeros(n, dtype=np.int64)
    return np.asarray(pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _spans(array: Any) -> tuple[Bytes, Ints, Ints]:
    """A ``large_string`` array's UTF-8 bytes and the bounds of each value in them (no copy)."""
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[array.offset : array.offset + len(array) + 1]
    data = _NO_BYTES if buffers[2] is None else np.frombuffer(buffers[2], dtype=np.uint8)
    return data, offsets[:-1], offsets[1:]


def _row_kinds(fields: Mapping[str, Any], n: int) -> npt.NDArray[np.int8]:
    """What each row may be for the fast paths: feedback, a ranking, or 0 (the JSON decoder takes it)."""
    kinds = np.zeros(n, dtype=np.int8)
    types = fields.get("type")
    if types is not None:
        if _is_text(types):
            for name, code in (("feedback", _FEEDBACK), ("ranking", _RANKING)):
                kinds[np.asarray(pc.equal(types, name).fill_null(False).to_numpy(zero_copy_only=False))] = code
        return kinds
    kinds[_valid(fields.get("item"), n)] = _FEEDBACK
    kinds[_valid(fields.get("items"), n)] = _RANKING
    return kinds


def _inferred_type(fields: Mapping[str, Any], k: int) -> str | None:
    """The type of row ``k`` of a file without a ``type`` column (see the module's documentation)."""
    for field, name in (("items", "ranking"), ("item", "feedback"), ("verdict", "judgment")):
        array = fields.get(field)
        if array is not None and array[k].is_valid:
            return name
    return None


def _times(array: Any, n: int) -> Floats:
    """``ts`` as epoch seconds; NaN where it is null, not finite, or text (then the JSON decoder parses it)."""
    if array is None:
        return np.full(n, np.nan)
    kind = array.type
    if pa.types.is_timestamp(kind):
        per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[kind.unit]
        ticks = array.cast(pa.int64()).cast(pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False)
        return np.asarray(ticks, dtype=np.float64) / per_second
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        values = np.asarray(array.cast(pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False),
                            dtype=np.float64)
        return np.where(np.isfinite(values), values, np.nan)
    return np.full(n, np.nan)


def _floats(array: Any, n: int) -> Floats:
    """A numeric column as floats, NaN where null (and everywhere when it is not numeric)."""
    if array is None or not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
        return np.full(n, np.nan)
    return np.asarray(array.cast(pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False), dtype=np.float64)


def _kinds(fields: Mapping[str, Any], n: int, known: set[str], default_grades: Mapping[str, float]
           ) -> tuple[Ints, Floats, Bools]:
    """Each row's feedback kind (``click`` when null) as its code, its default grade (NaN: none) and whether it is
    a kind of the config."""
    names: list[str] = ["click"]
    index = np.zeros(n, dtype=np.int64)
    array = fields.get("kind")
    if _is_text(array):
        encoded = pc.dictionary_encode(array)
        names += encoded.dictionary.to_pylist()
        index = np.asarray(encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64) + 1
    elif array is not None and array.null_count != n:
        return np.zeros(n, dtype=np.int64), np.full(n, np.nan), np.zeros(n, dtype=np.bool_)
    codes = kind_codes(names)
    grades = np.array([default_grades.get(name, math.nan) for name in names], dtype=np.float64)
    ok = np.array([name in known for name in names], dtype=np.bool_)
    return codes[index], grades[index], ok[index]


def _plain_feedback(fields: Mapping[str, Any], n: int, known: set[str], default_grades: Mapping[str, float]) -> Bools:
    """Which rows, if feedback, are read by the fast path: an item, a kind of the config, a grade of at least 0
    (or none, for a kind with a default grade), and no dwell or a finite one of at least 0. (Request id and time are
    checked by the caller.)"""
    item = fields.get("item")
    if not _is_text(item):
        return np.zeros(n, dtype=np.bool_)
    _, default, known_kind = _kinds(fields, n, known, default_grades)
    grade_array = fields.get("grade")
    grade = _floats(grade_array, n)
    has_grade = _valid(grade_array, n)
    graded = has_grade & (grade >= 0) & (grade <= MAX_GRADE)  # NaN, negative, too large: the decoder rejects it
    defaulted = ~has_grade & np.isfinite(default)
    dwell_array = fields.get("dwell")
    dwell = _floats(dwell_array, n)
    dwell_ok = ~_valid(dwell_array, n) | ((dwell >= 0) & np.isfinite(dwell))  # else the decoder says what is wrong
    return np.asarray(_valid(item, n) & known_kind & (graded | defaulted) & dwell_ok, dtype=np.bool_)


def _feedback_columns(fields: Mapping[str, Any], rows: Ints, ts: Floats,
                      default_grades: Mapping[str, float]) -> FeedbackColumns:
    """The feedback rows ``rows`` (read by the fast path) as columns: request ids and items in one UTF-8 buffer that
    Arrow joins."""
    if not rows.shape[0]:
        return NO_FEEDBACK
    take = pa.array(rows)
    picked = {field: array.take(take) for field, array in fields.items() if field in ("request_id", "item", "kind",
                                                                                       "grade", "dwell")}
    n = rows.shape[0]
    rid = picked["request_id"]
    text, starts, ends = _spans(pc.binary_join_element_wise(rid, picked["item"], _large("")))
    rid_end = starts + _lengths(rid, n)
    codes, default, _ = _kinds(picked, n, set(), default_grades)
    grade = _floats(picked.get("grade"), n)
    grade = np.where(np.isnan(grade), default, grade)
    return FeedbackColumns(text, starts, rid_end, rid_end.copy(), ends, codes, grade, ts[rows],
                           _floats(picked.get("dwell"), n))


def _plain_ranking_rows(fields: Mapping[str, Any], n: int) -> Bools:
    """Which rows, if rankings, may be read by the fast path (their items are checked next): items given; scores
    none or one finite number per item; no teams or subtopics; labels that are text or null."""
    items = fields.get("items")
    if items is None or not (pa.types.is_list(items.type) or pa.types.is_large_list(items.type)):
        return np.zeros(n, dtype=np.bool_)
    if not (pa.types.is_string(items.type.value_type) or pa.types.is_large_string(items.type.value_type)):
        return np.zeros(n, dtype=np.bool_)
    count = np.asarray(pc.list_value_length(items).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    ok = _valid(items, n) & (count > 0)
    scores = fields.get("scores")
    if scores is not None and scores.null_count != n:
        if not (pa.types.is_list(scores.type) or pa.types.is_large_list(scores.type)) or not (
                pa.types.is_floating(scores.type.value_type) or pa.types.is_integer(scores.type.value_type)):
            return np.zeros(n, dtype=np.bool_)
        given = _valid(scores, n)
        length = np.asarray(pc.list_value_length(scores).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        finite = pc.is_finite(pc.list_flatten(scores).cast(pa.float64())).fill_null(False)
        # a row is plain when every score of it is finite: count the finite ones per row
        parents = pc.list_parent_indices(scores)
        finite_per_row = np.bincount(np.asarray(parents.to_numpy(zero_copy_only=False), dtype=np.int64),
                                     weights=np.asarray(finite.to_numpy(zero_copy_only=False), dtype=np.float64),
                                     minlength=n)
        ok &= ~given | ((length == count) & (finite_per_row == length))
    for field in ("teams", "subtopics"):
        ok &= ~_valid(fields.get(field), n)
    for field in ("query_id", "session_id", "experiment", "arm", "unit_id"):
        array = fields.get(field)
        if array is not None and not _is_text(array):
            ok &= ~_valid(array, n)
    return np.asarray(ok, dtype=np.bool_)


def _plain_rankings(fields: Mapping[str, Any], ts: Floats, max_items: int, attributes: list[Any],
                    ) -> tuple[PlainRankings, Bools]:
    """Rankings (rows already screened by :func:`_plain_ranking_rows` and :func:`_plain_attributes`, whose
    ``attributes`` are given) whose items are in the plainest form: Arrow writes each as
    ``request_id["a","b",...]`` into one buffer, checked by :func:`compiled.simple_rankings` as a JSON ranking's
    items are (ASCII without quotes or backslashes, all different, at most ``max_items``); those become compact
    rankings with their items left in the buffer. Returns them and which rows they are."""
    items = fields["items"].cast(pa.large_list(pa.large_string()))
    rid = fields["request_id"]
    n = len(rid)
    written = pc.binary_join_element_wise(rid, _large('["'), pc.binary_join(items, _large('","')), _large('"]'),
                                          _large(""))
    raw, starts, ends = _spans(written)
    items_start = starts + _lengths(rid, n)
    no_scores = np.zeros(n, dtype=np.int64)
    counts = compiled.simple_rankings(raw, items_start, ends, _NO_BYTES, no_scores, no_scores, max_items)
    length = np.asarray(pc.list_value_length(items).to_numpy(zero_copy_only=False), dtype=np.int64)
    plain = counts == length  # (an item with '","' in it would count as more items)
    rows = np.flatnonzero(plain)
    columns = np.zeros((_PLAIN_ROWS, rows.shape[0]), dtype=np.int64)
    (id0, id1), (i0, i1) = (scan.COLUMNS[key] for key in ("request_id", "items"))
    columns[id0], columns[id1] = starts[rows], items_start[rows]
    columns[i0], columns[i1] = items_start[rows], ends[rows]
    if rows.shape[0] != n:  # some are not plain: the others' fields
        take = pa.array(rows)
        fields = {field: array.take(take) for field, array in fields.items()}

    def values(field: str, default: str | None, shared: bool) -> list[Any]:
        """The column's values, ``default`` where null or empty (an empty id or name is one not given)."""
        array = fields.get(field)
        if array is None:
            return [default] * rows.shape[0]
        if not shared:
            return [value or default for value in _strings(array)]
        encoded = pc.dictionary_encode(array)  # few distinct names: each is read once, as the label kept
        names = labels_of(encoded.dictionary.to_pylist())
        index = np.asarray(encoded.indices.fill_null(len(names)).to_numpy(zero_copy_only=False), dtype=np.int64)
        return np.array([*(name or default for name in names), default],  # type: ignore[no-any-return]  # objects
                        dtype=object)[index].tolist()

    made = list(map(CompactRanking, _strings(fields["request_id"]), repeat(""), length[rows].tolist(),
                    ts[rows].tolist(), _score_texts(fields.get("scores"), rows.shape[0]),
                    values("query_id", None, True), values("session_id", None, False),
                    values("experiment", "default", True), values("arm", "default", True), repeat(None),
                    repeat(None), values("unit_id", None, False),
                    [attributes[k] or None for k in rows.tolist()]))  # ({}: none, as a JSON ranking's)
    text = raw.tobytes().decode("latin-1")  # one character per byte: offsets hold (these rankings are ASCII)
    return PlainRankings(made, raw, text, columns), plain


def _score_texts(scores: Any, n: int) -> list[bytes | None]:
    """The scores of ``n`` rankings as the JSON text a ranking keeps them in (``None`` where null): orjson
    writes them all at once, each number in its shortest form that reads back as the same float, and each ranking
    takes its span of that text."""
    if scores is None or scores.null_count == n:
        return [None] * n
    picked = scores.cast(pa.large_list(pa.float64()))
    offsets = np.asarray(picked.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    flat = np.ascontiguousarray(picked.values.to_numpy(zero_copy_only=False), dtype=np.float64)
    text = orjson.dumps(flat, option=orjson.OPT_SERIALIZE_NUMPY)  # "[1.5,0.25,...]"
    commas = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == 44)
    # number i runs from the byte after the comma before it to the comma after it
    starts = np.concatenate(([1], commas + 1))
    ends = np.concatenate((commas, [len(text) - 1]))
    given = _valid(picked, n)
    first, last = offsets[:-1], offsets[1:] - 1
    texts: list[bytes | None] = [b"[" + text[a:b] + b"]" for a, b in zip(
        starts[np.where(given, first, 0)].tolist(), ends[np.where(given, last, 0)].tolist(), strict=True)]
    if not given.all():
        for k in np.flatnonzero(~given).tolist():
            texts[k] = None
    return texts


def _strings(array: Any) -> list[Any]:
    """A column's values as Python objects (``None`` where null)."""
    return array.to_numpy(zero_copy_only=False).tolist()  # type: ignore[no-any-return]  # objects


def _slow_row(fields: Mapping[str, Any], k: int, attributes: Any, bad_text: bool, config: Config, where: str) -> Any:
    """Row ``k`` (its ``attributes`` given apart, as :func:`_attribute_values` reads them) as :func:`decode_line`
    reads it written as a JSON line (null cells left out); a ranking becomes a :class:`CompactRanking`, as the join
    keeps it."""
    row = {field: array[k].as_py() for field, array in fields.items() if array[k].is_valid}
    if attributes is not None:
        row["attributes"] = attributes
    if "type" not in fields and (kind := _inferred_type(fields, k)) is not None:
        row["type"] = kind
    kind = str(row["type"]) if row.get("type") in ("ranking", "feedback", "judgment") else "unknown"
    if bad_text:
        return Invalid(kind, "bad_utf8", "not UTF-8 text", where)
    for field in ("ts", "grade", "dwell"):
        value = row.get(field)
        if isinstance(value, float) and not math.isfinite(value):  # (a time no log holds: docs/contract.md §1)
            return Invalid(kind, "ts_out_of_range" if field == "ts" else f"bad_{field}",
                           f"{field}: not a finite number", where)
    scores = row.get("scores")
    if isinstance(scores, list) and any(isinstance(x, float) and not math.isfinite(x)
                                        for x in scores):  # (JSON has no NaN: it would be written as null)
        return Invalid(kind, "bad_field", "scores: not a finite number (NaN or infinite) in the list", where)
    if "ts" in row and not isinstance(row["ts"], int | float | str):  # a timestamp column
        row["ts"] = float(_times(fields["ts"].slice(k, 1), 1)[0])
    try:
        line = orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as error:
        return Invalid(kind, "bad_field", f"a cell that JSON cannot hold: {error}", where)
    event = decode_line(line, config, where)
    return CompactRanking.of(event) if type(event) is Ranking else event
