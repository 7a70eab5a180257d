"""docs/contract.md §1 events: decoding from JSON Lines and validation, with the reason codes of ``schema.py``."""

from __future__ import annotations

import copy
import json
import pickle
import sys
import tracemalloc
import warnings
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import AbstractTimeConfig as Config

from stream_eval.config import MAX_GRADE
from stream_eval.events import scan, schema
from stream_eval.events.join import EventCounts, Join
from stream_eval.events.scan import json_numbers
from stream_eval.events.schema import (
    Chunk,
    CompactRanking,
    EventError,
    Feedback,
    Invalid,
    Judgment,
    Ranking,
    Watermark,
    decode_chunk,
    decode_chunk_columns,
    decode_chunk_compact,
    decode_line,
    finish,
    item_list,
    parse_time,
    score_list,
    validate,
)

CONFIG = Config()
EPOCH_2026 = 1767225600.0  # 2026-01-01T00:00:00Z


def line(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def ranking(**fields: object) -> bytes:
    base: dict[str, object] = {"type": "ranking", "request_id": "r1", "ts": 100, "items": ["a", "b", "c"]}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not DROP}).encode()


def feedback(**fields: object) -> bytes:
    base: dict[str, object] = {"type": "feedback", "request_id": "r1", "item": "a", "ts": 101}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not DROP}).encode()


def judgment(**fields: object) -> bytes:
    base: dict[str, object] = {"type": "judgment", "experiment": "e", "query_id": "q", "verdict": "good", "ts": 5}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not DROP}).encode()


DROP = object()

#: A value of the wrong JSON type is rejected by msgspec; schema.py may name the field's own code or bad_field.
WRONG_TYPE = {
    "request_id": {"bad_field", "missing_field"},  # (null: missing_field)
    "items": {"bad_field", "bad_items"},
    "grade": {"bad_field", "bad_grade"},
    "ts": {"bad_field", "bad_ts"},
}


def invalid(raw: bytes, config: Config = CONFIG) -> Invalid:
    result = decode_line(raw, config, "f:1")
    assert isinstance(result, Invalid), f"accepted {raw!r} as {result!r}"
    assert result.where == "f:1"
    assert result.raw == raw
    assert result.reason
    return result


def valid(raw: bytes, config: Config = CONFIG) -> Ranking | Feedback | Judgment | Watermark:
    result = decode_line(raw, config)
    assert not isinstance(result, Invalid), f"rejected {raw!r}: {result.code} {result.reason}"
    return result


# -- the shape of a line ----------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"not json", b"{", b'{"type": "ranking",}', b'{"type": "ranking"'])
def test_malformed_json(raw: bytes) -> None:
    bad = invalid(raw)
    assert bad.code == "bad_json"


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"{\xc3(", b'{"type": "ranking", "x": "\xed\xa0\x80"}'])
def test_bytes_that_are_not_utf8_come_first(raw: bytes) -> None:
    """Bytes that are not UTF-8 are ``bad_utf8`` wherever they are, even where the JSON is malformed too."""
    assert invalid(raw).code == "bad_utf8"


def test_missing_type() -> None:
    bad = invalid(b'{"request_id": "r1", "items": ["a"], "ts": 1}')
    assert bad.code == "missing_type"
    assert "type" in bad.reason


@pytest.mark.parametrize("kind", ["rankings", "click", "", "Ranking"])
def test_unknown_type(kind: str) -> None:
    bad = invalid(line(type=kind, request_id="r1", items=["a"], ts=1))
    assert bad.code == "unknown_type"
    assert repr(kind) in bad.reason


@pytest.mark.parametrize("raw", [b"null", b"[]", b"3", b'"ranking"'])
def test_not_an_object(raw: bytes) -> None:
    assert invalid(raw).code in ("bad_field", "bad_json")


def test_unknown_extra_fields_are_ignored() -> None:
    extra = {"extra": {"nested": [1, 2, {"x": None}]}, "weird": True, "n": 1.5}
    event = valid(ranking(**extra))
    assert event == Ranking("r1", ["a", "b", "c"], ts=100.0)
    assert valid(feedback(**extra)) == Feedback("r1", "a", grade=1.0, ts=101.0)
    assert valid(judgment(**extra)) == Judgment("e", "q", "good", ts=5.0)
    assert valid(line(type="watermark", ts=7, **extra)) == Watermark(ts=7.0)


# -- ranking ----------------------------------------------------------------------------------------------


def test_ranking_defaults() -> None:
    event = valid(ranking())
    assert isinstance(event, Ranking)
    assert (event.request_id, event.items, event.ts) == ("r1", ["a", "b", "c"], 100.0)
    assert event.experiment == "default" and event.arm == "default"
    assert event.query_id is None and event.session_id is None  # default = request_id, resolved downstream
    assert event.scores is None and event.teams is None and event.subtopics is None


def test_ranking_all_fields() -> None:
    event = valid(ranking(scores=[3, 2.5, -1], query_id="q", session_id="s", experiment="x", arm="t",
                          teams=["A", "B", "A"], subtopics=[["s1"], [], ["s1", "s2"]]))
    assert isinstance(event, Ranking)
    assert event.scores == [3.0, 2.5, -1.0]
    assert (event.query_id, event.session_id, event.experiment, event.arm) == ("q", "s", "x", "t")
    assert event.teams == ["A", "B", "A"]
    assert event.subtopics == [["s1"], [], ["s1", "s2"]]


def test_ranking_missing_request_id() -> None:
    bad = invalid(ranking(request_id=DROP))
    assert (bad.kind, bad.code) == ("ranking", "missing_field")
    assert "request_id" in bad.reason


def test_ranking_empty_request_id() -> None:
    bad = invalid(ranking(request_id=""))
    assert (bad.kind, bad.code) == ("ranking", "missing_field")


@pytest.mark.parametrize("value", [5, 1.5, None, ["r1"], {"id": "r1"}, True])
def test_ranking_request_id_not_a_string(value: object) -> None:
    """null (like "") is a missing id; another type is ``bad_field`` (it was ``missing_field``, which sent users
    looking for a field that is there)."""
    bad = invalid(ranking(request_id=value))
    assert bad.kind == "ranking"
    assert bad.code == ("missing_field" if value is None else "bad_field")
    assert "request_id" in bad.reason
    assert invalid(judgment(experiment=value)).code == ("missing_field" if value is None else "bad_field")


def test_ranking_missing_items() -> None:
    bad = invalid(ranking(items=DROP))
    assert (bad.kind, bad.code) == ("ranking", "missing_field")
    assert "items" in bad.reason


def test_ranking_empty_items_is_a_zero_result_request() -> None:
    event = decode_line(ranking(items=[], scores=[]), CONFIG)
    assert event == Ranking("r1", [], ts=100.0, scores=[])
    compact = CompactRanking.of(event)  # type: ignore[arg-type]  # a Ranking
    assert (compact.items, compact.n, compact.scores) == ([], 0, None)  # never the compact text of one empty item
    assert item_list(compact.items) == []


@pytest.mark.parametrize(("dwell", "code"), [(-1, "bad_dwell"), ("5", "bad_dwell"), (True, "bad_dwell"),
                                             ([1], "bad_dwell"), (float("inf"), "bad_dwell")])
def test_feedback_dwell_must_be_finite_seconds(dwell: object, code: str) -> None:
    if dwell == float("inf"):  # (no JSON: an event made in Python, as the worker's tests make them)
        event = Feedback("r1", "a", dwell=float("inf"), ts=101.0)
        with pytest.raises(EventError) as error:
            validate(event, CONFIG)
        assert error.value.code == code
        return
    bad = invalid(feedback(dwell=dwell))
    assert (bad.kind, bad.code) == ("feedback", code)


def test_feedback_dwell_is_read() -> None:
    assert decode_line(feedback(dwell=12.5), CONFIG) == Feedback("r1", "a", grade=1.0, ts=101.0, dwell=12.5)
    assert decode_line(feedback(dwell=None), CONFIG) == Feedback("r1", "a", grade=1.0, ts=101.0)
    event = Feedback("r1", "a", dwell=3, ts=101.0)  # type: ignore[arg-type]  # an int, as Python code may give
    validate(event, CONFIG)
    assert event.dwell == 3.0 and type(event.dwell) is float


@pytest.mark.parametrize("items", [["a", "b", "a"], ["x", "x"]])
def test_ranking_duplicate_items(items: list[str]) -> None:
    bad = invalid(ranking(items=items))
    assert (bad.kind, bad.code) == ("ranking", "bad_items")
    assert repr(items[-1]) in bad.reason


@pytest.mark.parametrize("items", [[1, 2], ["a", None], "abc"])
def test_ranking_items_not_strings(items: object) -> None:
    assert invalid(ranking(items=items)).code in WRONG_TYPE["items"]


def test_ranking_max_items() -> None:
    config = Config(max_items=3)
    assert isinstance(valid(ranking(items=["a", "b", "c"]), config), Ranking)
    bad = invalid(ranking(items=["a", "b", "c", "d"]), config)
    assert (bad.kind, bad.code) == ("ranking", "bad_items")
    assert "max_items=3" in bad.reason


def test_ranking_default_max_items_is_1000() -> None:
    items = [f"i{k}" for k in range(1000)]
    assert isinstance(valid(ranking(items=items)), Ranking)
    assert invalid(ranking(items=[*items, "one-more"])).code == "bad_items"


@pytest.mark.parametrize("scores", [[1.0, 2.0], [1, 2, 3, 4], []])
def test_ranking_scores_wrong_length(scores: list[float]) -> None:
    bad = invalid(ranking(scores=scores))
    assert (bad.kind, bad.code) == ("ranking", "bad_length")
    assert "scores" in bad.reason


@pytest.mark.parametrize("scores", [[1, "x", 2], [1, None, 2], [1, [2], 3], [True, 1, 2], "123"])
def test_ranking_scores_not_numeric(scores: object) -> None:
    bad = invalid(ranking(scores=scores))
    assert (bad.kind, bad.code) == ("ranking", "bad_field")
    assert "scores" in bad.reason


def test_ranking_teams_length_mismatch() -> None:
    bad = invalid(ranking(teams=["A", "B"]))
    assert (bad.kind, bad.code) == ("ranking", "bad_length")
    assert "teams" in bad.reason


def test_ranking_subtopics_length_mismatch() -> None:
    bad = invalid(ranking(subtopics=[["s"], ["s"], ["s"], ["s"]]))
    assert (bad.kind, bad.code) == ("ranking", "bad_length")
    assert "subtopics" in bad.reason


def test_ranking_subtopics_wrong_shape() -> None:
    assert invalid(ranking(subtopics=["s1", "s2", "s3"])).code == "bad_field"


# -- feedback ---------------------------------------------------------------------------------------------


def test_click_defaults_to_grade_1() -> None:
    event = valid(feedback())
    assert isinstance(event, Feedback)
    assert (event.request_id, event.item, event.kind, event.grade, event.ts) == ("r1", "a", "click", 1.0, 101.0)


def test_click_with_explicit_grade_keeps_it() -> None:
    event = valid(feedback(kind="click", grade=2))
    assert isinstance(event, Feedback) and event.grade == 2.0


@pytest.mark.parametrize("grade", [0, 0.5, 3, 17.25])
def test_label_with_grade(grade: float) -> None:
    event = valid(feedback(kind="label", grade=grade))
    assert isinstance(event, Feedback)
    assert (event.kind, event.grade) == ("label", float(grade))


def test_label_without_grade() -> None:
    bad = invalid(feedback(kind="label"))
    assert (bad.kind, bad.code) == ("feedback", "missing_grade")


@pytest.mark.parametrize("grade", [-1, -0.001])
def test_negative_grade(grade: float) -> None:
    bad = invalid(feedback(kind="label", grade=grade))
    assert (bad.kind, bad.code) == ("feedback", "bad_grade")
    bad = invalid(feedback(grade=grade))
    assert bad.code == "bad_grade"


@pytest.mark.parametrize("grade", ["3", [1], True])
def test_grade_not_a_number(grade: object) -> None:
    assert invalid(feedback(kind="label", grade=grade)).code in WRONG_TYPE["grade"]


def test_unknown_kind() -> None:
    bad = invalid(feedback(kind="purchase"))
    assert (bad.kind, bad.code) == ("feedback", "unknown_kind")
    assert "purchase" in bad.reason
    assert invalid(feedback(kind="purchase", grade=2)).code == "unknown_kind"


def test_kind_from_config_gets_its_grade() -> None:
    config = Config(kinds=(("purchase", 3.0), ("dwell", 0.5)))
    event = valid(feedback(kind="purchase"), config)
    assert isinstance(event, Feedback) and (event.kind, event.grade) == ("purchase", 3.0)
    event = valid(feedback(kind="dwell"), config)
    assert isinstance(event, Feedback) and event.grade == 0.5
    assert valid(feedback(), config).grade == 1.0  # type: ignore[union-attr]
    assert invalid(feedback(kind="share"), config).code == "unknown_kind"


def test_kinds_may_set_the_grades_of_click_and_label() -> None:
    """README: ``[kinds]`` may name ``click`` (the grade of a click that gives none) and ``label`` (the grade of a
    label that gives none, then not ``missing_grade``); feedback that gives its grade keeps it."""
    config = Config(kinds=(("click", 3.0), ("label", 2.0)))
    assert valid(feedback(), config).grade == 3.0  # type: ignore[union-attr]
    assert valid(feedback(kind="label"), config).grade == 2.0  # type: ignore[union-attr]
    assert valid(feedback(kind="label", grade=1), config).grade == 1.0  # type: ignore[union-attr]
    assert valid(feedback(grade=0), config).grade == 0.0  # type: ignore[union-attr]
    lines = b"".join(feedback(kind=kind) + b"\n" for kind in ("click", "label"))  # (the compiled reader, too)
    chunk = schema.decode_chunk_columns(lines, config)
    assert len(chunk.feedback) == 2 and sorted(chunk.feedback.grade.tolist()) == [2.0, 3.0]


def test_feedback_missing_fields() -> None:
    assert invalid(feedback(request_id=DROP)).code == "missing_field"
    assert invalid(feedback(item=DROP)).code == "missing_field"
    assert invalid(feedback(request_id="")).code == "missing_field"
    assert invalid(feedback(request_id=7)).code in WRONG_TYPE["request_id"]


def test_feedback_for_an_unshown_item_is_valid() -> None:
    assert isinstance(valid(feedback(item="never-shown", kind="label", grade=2)), Feedback)


# -- judgment ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("verdict", ["good", "same", "bad"])
def test_judgment(verdict: str) -> None:
    assert valid(judgment(verdict=verdict)) == Judgment("e", "q", verdict, ts=5.0)  # type: ignore[arg-type]


def test_judgment_bad_verdict_and_missing_fields() -> None:
    assert invalid(judgment(verdict="better")).code == "bad_field"
    for field in ("experiment", "query_id", "verdict"):
        bad = invalid(judgment(**{field: DROP}))
        assert (bad.kind, bad.code) == ("judgment", "missing_field")
    assert invalid(judgment(experiment="")).code == "missing_field"


# -- event time -------------------------------------------------------------------------------------------


def test_int_and_float_ts() -> None:
    event = valid(ranking(ts=1767225600))
    assert event.ts == EPOCH_2026 and type(event.ts) is float
    assert valid(ranking(ts=1767225600.25)).ts == 1767225600.25
    assert valid(feedback(ts=0)).ts == 0.0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2026-01-01T00:00:00Z", EPOCH_2026),
        ("2026-01-01T00:00:00+00:00", EPOCH_2026),
        ("2026-01-01T01:00:00+01:00", EPOCH_2026),
        ("2025-12-31T19:00:00-05:00", EPOCH_2026),
        ("2026-01-01T05:30:00+05:30", EPOCH_2026),
        ("2026-01-01T00:00:00.250Z", EPOCH_2026 + 0.25),
    ],
)
def test_iso_ts_with_offset_equals_epoch(text: str, expected: float) -> None:
    for make in (ranking, feedback, judgment):
        assert valid(make(ts=text)).ts == expected
    assert valid(line(type="watermark", ts=text)).ts == expected
    assert parse_time(text) == expected


@pytest.mark.parametrize("text", ["2026-01-01T00:00:00", "2026-01-01", "2026-01-01 00:00:00"])
def test_naive_iso_ts_rejected(text: str) -> None:
    for make in (ranking, feedback, judgment):
        bad = invalid(make(ts=text))
        assert bad.code == "bad_ts"
        assert "offset" in bad.reason


@pytest.mark.parametrize("text", ["yesterday", "", "1767225600"])
def test_unreadable_ts_rejected(text: str) -> None:
    assert invalid(ranking(ts=text)).code == "bad_ts"


@pytest.mark.parametrize("value", [True, [1], {"s": 1}])
def test_ts_of_wrong_type_rejected(value: object) -> None:
    assert invalid(ranking(ts=value)).code in WRONG_TYPE["ts"]


def test_missing_ts_rejected_in_files() -> None:
    for make, kind in ((ranking, "ranking"), (feedback, "feedback"), (judgment, "judgment")):
        bad = invalid(make(ts=DROP))
        assert (bad.kind, bad.code) == (kind, "missing_ts")
        bad = invalid(make(ts=None))
        assert bad.code == "missing_ts"


def test_missing_ts_on_a_topic_takes_the_message_timestamp() -> None:
    event = finish(Feedback("r1", "a"), CONFIG, default_ts=42.5)
    assert isinstance(event, Feedback) and event.ts == 42.5
    event = finish(Ranking("r1", ["a"], ts="2026-01-01T00:00:00Z"), CONFIG, default_ts=42.5)
    assert isinstance(event, Ranking) and event.ts == EPOCH_2026  # a ts of its own wins


def test_parse_time_errors() -> None:
    with pytest.raises(EventError) as info:
        parse_time(None)
    assert info.value.code == "missing_ts"
    with pytest.raises(EventError) as info:
        parse_time(float("nan"))
    assert info.value.code == "bad_ts"
    with pytest.raises(EventError) as info:
        parse_time("2026-01-01T00:00:00")
    assert info.value.code == "bad_ts"


# -- watermarks -------------------------------------------------------------------------------------------


def test_watermark_events() -> None:
    assert valid(line(type="watermark", ts=123)) == Watermark(ts=123.0, end=False)
    assert valid(line(type="watermark", ts=1.5)) == Watermark(ts=1.5)
    assert valid(line(type="watermark", end=True)) == Watermark(ts=None, end=True)
    assert valid(line(type="watermark", ts=9, end=True)) == Watermark(ts=9.0, end=True)
    bad = invalid(line(type="watermark"))
    assert (bad.kind, bad.code) == ("watermark", "missing_ts")
    assert invalid(line(type="watermark", ts="2026-01-01T00:00:00")).code == "bad_ts"
    assert invalid(line(type="watermark", end="yes")).code == "bad_field"


# -- chunks -----------------------------------------------------------------------------------------------

GOOD = [
    ranking(),
    ranking(request_id="r2", ts="2026-01-01T00:00:00Z", scores=[1, 2, 3]),
    feedback(),
    feedback(kind="label", grade=2, item="z"),
    judgment(),
    line(type="watermark", ts=50),
    line(type="watermark", end=True),
]
BAD_VALID_JSON = [  # decodable JSON that fails validation after decoding (the fast path handles these)
    ranking(items=["a", "b", "a"]),
    ranking(items=["a", "a"]),
    ranking(scores=[1]),
    ranking(ts="2026-01-01T00:00:00"),
    ranking(ts=DROP),
    feedback(kind="label"),
    feedback(grade=-2),
    feedback(kind="nope"),
    line(type="watermark"),
]
BAD_SCHEMA = [  # JSON that msgspec itself rejects
    ranking(request_id=3),
    line(request_id="r"),
    line(type="other"),
    judgment(verdict="meh"),
]
MALFORMED = [b"{oops", b"not json at all", b'{"type": "feedback", "request_id": "r1"']


def test_decode_chunk_mixed_lines_in_order_with_line_numbers() -> None:
    lines = [GOOD[0], b"", MALFORMED[0], GOOD[2], BAD_VALID_JSON[0], b"   ", GOOD[4], BAD_SCHEMA[2], GOOD[5]]
    chunk = b"\n".join(lines) + b"\n"
    results = decode_chunk(chunk, CONFIG, first_line=10, source="log.jsonl")
    assert len(results) == 7  # blank lines skipped
    assert results[0] == Ranking("r1", ["a", "b", "c"], ts=100.0)
    assert isinstance(results[1], Invalid) and results[1].code == "bad_json"
    assert results[1].where == "log.jsonl:12" and results[1].raw == MALFORMED[0]
    assert results[2] == Feedback("r1", "a", grade=1.0, ts=101.0)
    assert isinstance(results[3], Invalid) and results[3].code == "bad_items"
    assert results[3].where == "log.jsonl:14" and results[3].raw == BAD_VALID_JSON[0]
    assert results[4] == Judgment("e", "q", "good", ts=5.0)
    assert isinstance(results[5], Invalid) and results[5].code == "unknown_type"
    assert results[5].where == "log.jsonl:17"
    assert results[6] == Watermark(ts=50.0)


def test_decode_chunk_fast_path_line_numbers() -> None:
    # only validation failures (no malformed JSON): the whole chunk is decoded in one call
    lines = [GOOD[0], BAD_VALID_JSON[1], b"", GOOD[3], BAD_VALID_JSON[3], GOOD[6]]
    results = decode_chunk(b"\n".join(lines) + b"\n", CONFIG, first_line=1, source="s")
    assert [type(r).__name__ for r in results] == ["Ranking", "Invalid", "Feedback", "Invalid", "Watermark"]
    assert [(r.where, r.code, r.raw) for r in results if isinstance(r, Invalid)] == [
        ("s:2", "bad_items", BAD_VALID_JSON[1]),
        ("s:5", "bad_ts", BAD_VALID_JSON[3]),
    ]


def test_decode_chunk_without_trailing_newline_and_crlf() -> None:
    chunk = GOOD[2] + b"\r\n" + BAD_VALID_JSON[6] + b"\r\n" + GOOD[4]
    results = decode_chunk(chunk, CONFIG, 1, "f")
    assert results[0] == Feedback("r1", "a", grade=1.0, ts=101.0)
    assert isinstance(results[1], Invalid) and results[1].where == "f:2" and results[1].code == "bad_grade"
    assert results[2] == Judgment("e", "q", "good", ts=5.0)


def test_decode_chunk_only_blank_lines() -> None:
    assert decode_chunk(b"\n\n  \n", CONFIG, 1, "f") == []


def _per_line(chunk: bytes, first_line: int, source: str) -> list[object]:
    return [
        decode_line(raw, CONFIG, f"{source}:{first_line + k}")
        for k, raw in enumerate(chunk.split(b"\n"))
        if raw.strip()
    ]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(GOOD + BAD_VALID_JSON + BAD_SCHEMA + [b"", b"  "]), max_size=25),
    st.integers(min_value=1, max_value=10_000),
    st.booleans(),
)
def test_fast_path_equals_slow_path(lines: list[bytes], first_line: int, trailing_newline: bool) -> None:
    chunk = b"\n".join(lines) + (b"\n" if trailing_newline else b"")
    fast = decode_chunk(chunk, CONFIG, first_line, "src")
    # a malformed line at the end forces the line-by-line path for the whole chunk
    forced = decode_chunk(chunk + (b"" if trailing_newline or not lines else b"\n") + b"{malformed\n",
                          CONFIG, first_line, "src")
    assert isinstance(forced[-1], Invalid) and forced[-1].code == "bad_json"
    assert fast == forced[:-1]
    assert fast == _per_line(chunk, first_line, "src")


def test_two_json_objects_on_one_line_are_one_invalid_line() -> None:
    """JSON Lines: one value per line. The slow path rejects a line holding two objects; the fast path
    (``msgspec.json.Decoder.decode_lines``) accepts both objects, so the two paths disagree."""
    two = GOOD[5] + GOOD[5]
    chunk = GOOD[2] + b"\n" + two + b"\n" + GOOD[4] + b"\n"
    assert _per_line(chunk, 1, "f")[1].code == "bad_json"  # type: ignore[attr-defined]
    results = decode_chunk(chunk, CONFIG, 1, "f")
    assert len(results) == 3
    assert isinstance(results[1], Invalid) and results[1].where == "f:2"


def test_line_numbers_stay_right_after_a_line_with_two_objects() -> None:
    """With a two-object line before a bad line, the fast path maps results to lines by index: the
    invalid event gets the wrong line number and raw text, or the lookup runs past the end of the lines."""
    two = GOOD[5] + b" " + GOOD[5]
    chunk = two + b"\n" + BAD_VALID_JSON[8] + b"\n" + GOOD[5] + b"\n"
    results = decode_chunk(chunk, CONFIG, 1, "f")
    bad = [r for r in results if isinstance(r, Invalid) and r.code == "missing_ts"]
    assert [(r.where, r.raw) for r in bad] == [("f:2", BAD_VALID_JSON[8])]
    # the bad line last: must not crash
    decode_chunk(two + b"\n" + BAD_VALID_JSON[8] + b"\n", CONFIG, 1, "f")


@pytest.mark.parametrize(
    "raw, kind",
    [
        (feedback(request_id=5, item="ranking"), "feedback"),
        (judgment(verdict="meh", experiment="feedback"), "judgment"),
        (ranking(request_id=5, arm="judgment"), "ranking"),
    ],
    ids=["feedback-naming-ranking", "judgment-naming-feedback", "ranking-naming-judgment"],
)
def test_invalid_kind_is_the_type_of_the_line(raw: bytes, kind: str) -> None:
    """The type of a rejected event (counted per type: ``stream_eval_events_total{type,status}``) is its
    ``type`` field, not the first type name that happens to appear somewhere in the line."""
    assert invalid(raw).kind == kind


def tight(**fields: object) -> bytes:
    """A ranking line as compact JSON (no white space), the form the compact decoding path takes."""
    base: dict[str, object] = {"type": "ranking", "request_id": "r1", "ts": 100, "items": ["a", "b", "c"]}
    base.update(fields)
    return json.dumps(base, separators=(",", ":"), ensure_ascii=False).encode()


COMPACT_EDGE = [  # rankings whose items or scores leave the compact fast path, or only just stay in it
    tight(items=["a", 'b"c', "d"]),
    tight(items=["a", "b\\c"]),
    tight(items=[",", '","', ""]),
    tight(items=["", "x"]),
    tight(items=["é", "ü", "a b"]),
    tight(items=["a", "b"], scores=[1e300, -2.5e-3]),
    tight(items=["a", "b"], scores=[1, -0]),
    tight(items=["a"], scores=[]),
    tight(items=["a"], scores=None),
    tight(items=["a", "a", ","]),
    tight(items=["", ""]),
    tight(items=[""]),
    tight(items=["a", "b"], scores=[1]),
    tight(items=["a", "b"], teams=["x"]),
    tight(items=["a", "b"], subtopics=[["s"], ["t"]], teams=["x", "y"]),
    tight(items=[str(i) for i in range(1001)]),
    tight(items=["a"], ts="2026-01-01T00:00:00+00:00"),
    tight(items=["a"], ts="yesterday"),
    tight(items=[str(i) for i in range(60)], scores=[0.1234567890123 * i for i in range(60)]),
    b'{"type": "ranking", "request_id": "r1", "ts": 1, "items": [ "a" , "b" ], "scores": [ 1, 2 ]}',
    b'{"type":"ranking","request_id":"r1","ts":1,"items":["a","b"],"scores":[1E2,2e+3]}',
    b'{"type":"ranking","request_id":"r1","ts":1,"items":["a","b"],"scores":[1,1' + b"0" * 400 + b"]}",
    b'{"type":"ranking","request_id":"r1","ts":1,"items":["a","b"],"scores":[1,"x"]}',
    b'{"type":"ranking","request_id":"r1","ts":1,"items":["a",["b"]]}',
    b'{"type":"ranking","request_id":"r1","ts":1,"items":["\\u0061","b"]}',
    b'{"type":"ranking","request_id":"r1","items":["a","b"]}',
]
COMPACT_GOOD = [json.dumps(json.loads(raw), separators=(",", ":")).encode() for raw in GOOD]


#: Lines that are not one event: blank, white space only, two events on one line.
NOT_ONE_EVENT = [b"", b"  ", b"\r", COMPACT_GOOD[0] + b" " + COMPACT_GOOD[2], COMPACT_GOOD[2] + COMPACT_GOOD[4]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(GOOD + BAD_VALID_JSON + BAD_SCHEMA + COMPACT_EDGE + COMPACT_GOOD + NOT_ONE_EVENT),
                max_size=25), st.booleans())
def test_compact_decoding_equals_full_decoding(lines: list[bytes], last_newline: bool) -> None:
    chunk = b"\n".join(lines) + (b"\n" if last_newline else b"")
    full = [CompactRanking.of(e) if isinstance(e, Ranking) else e for e in decode_chunk(chunk, CONFIG, 3, "f")]
    compact = decode_chunk_compact(chunk, CONFIG, 3, "f")
    assert len(full) == len(compact)
    for a, b in zip(full, compact, strict=True):
        assert type(a) is type(b)
        if isinstance(a, CompactRanking) and isinstance(b, CompactRanking):
            assert item_list(a.items) == item_list(b.items) and a.n == b.n == len(item_list(b.items))
            assert score_list(a.scores) == score_list(b.scores)
            assert [getattr(a, k) for k in ("request_id", "ts", "query_id", "session_id", "experiment", "arm",
                                            "teams", "subtopics")] == [
                getattr(b, k) for k in ("request_id", "ts", "query_id", "session_id", "experiment", "arm",
                                        "teams", "subtopics")]
        else:
            assert a == b


def test_compact_positions_are_exact() -> None:
    """The join finds a served item's position exactly whatever the items hold (commas, quotes, the separator
    of compact item texts, the empty string), and never takes another text for a served item."""
    for items in ([",", '","', "", "a", "a,b", "b"], ["", ",", "a,b", "b"]):
        join = Join(Config(), EventCounts())
        probes = [*items, "c", '"', ",a", "a,", '",', 'a","a,b', ",b", "a,b,"]
        grade = {probe: float(k + 1) for k, probe in enumerate(probes)}  # a grade that names the probe
        labels = [Feedback("r", probe, kind="label", grade=grade[probe], ts=2.0) for probe in probes]
        join.add([Ranking("r", items, ts=1.0), *labels])
        finalised = join.flush()
        assert finalised.shown_grades() == [{position: grade[item] for position, item in enumerate(items, 1)}]
        assert finalised.unshown_grades() == [sorted(grade[p] for p in probes if p not in items)]


NOT_UTF8 = [
    b'{"type": "ranking", "request_id": "r\xff2", "ts": 1, "items": ["a"]}',
    b'{"type": "feedback", "request_id": "r1", "item": "\xc3(", "ts": 2}',
]


@pytest.mark.parametrize("line", NOT_UTF8)
def test_bytes_that_are_not_utf8_are_invalid_not_a_crash(line: bytes) -> None:
    good = b'{"type": "ranking", "request_id": "r1", "ts": 1, "items": ["a", "b"]}'
    chunk = good + b"\n" + line + b"\n" + good.replace(b"r1", b"r3") + b"\n"
    for decode in (decode_chunk, decode_chunk_compact):  # the full decoder and replay's compact one
        decoded = decode(chunk, Config(), 1, "f")
        assert [type(e).__name__ == "Invalid" for e in decoded] == [False, True, False]
        assert decoded[1].code == "bad_utf8" and decoded[1].where == "f:2"  # type: ignore[union-attr]


@pytest.mark.parametrize("line", NOT_UTF8)
def test_kafka_messages_that_are_not_utf8_are_invalid_not_a_crash(line: bytes) -> None:
    from stream_eval.events.messages import decode_messages

    kind = "ranking" if b'"ranking"' in line else "feedback"
    good = {"ranking": b'{"request_id": "r1", "ts": 1, "items": ["a"]}',
            "feedback": b'{"request_id": "r1", "item": "a", "ts": 1}'}[kind]
    decoded = decode_messages([good, line, good], kind, Config(), [0.0] * 3, ["p@0", "p@1", "p@2"])
    assert [type(e).__name__ for e in decoded][1] == "Invalid"
    assert decoded[1].code == "bad_utf8" and decoded[1].where == "p@1" and decoded[1].raw == line  # type: ignore[union-attr]
    assert type(decoded[0]).__name__ != "Invalid" and type(decoded[2]).__name__ != "Invalid"


#: Feedback-topic messages of every sort: good (with and without ts), invalid field, bad JSON, two objects in one
#: value, a watermark, a mistyped event, no value at all.
_MESSAGES = [
    b'{"request_id": "r1", "item": "a", "ts": 5}',
    b'{"request_id": "r2", "item": "b", "kind": "label", "grade": 2, "ts": "2026-01-01T00:00:00Z"}',
    b'{"request_id": "r3", "item": "c"}',
    b'{"request_id": "r4", "item": "d", "kind": "label", "ts": 1}',
    b'{"request_id": "r5", "item": ',
    b'{"request_id": "r6", "item": "e", "ts": 1}{"request_id": "r7", "item": "f", "ts": 1}',
    b'{"type": "watermark", "ts": 9}',
    b'{"type": "ranking", "request_id": "r8", "items": ["a"], "ts": 1}',
    b'{"type": "ranking", "request_id": "r9", "item": "a", "ts": 1}',
    None,
]


@pytest.mark.parametrize(("value", "kind"), [
    (b'{"type": "feedback", "request_id": "r1", "items": ["a"], "ts": 1}', "ranking"),  # ranking-shaped
    (b'{"type": "ranking", "request_id": "r1", "item": "a", "ts": 1}', "feedback"),  # feedback-shaped
    (b'{"type": "feedback", "request_id": "r1", "item": "a", "ts": 1}', "ranking"),
    (b'{"type": "judgment", "experiment": "e", "query_id": "q", "verdict": "good", "ts": 1}', "feedback"),
])
def test_a_message_naming_another_type_is_a_type_mismatch_whatever_its_fields(value: bytes, kind: str) -> None:
    """docs/contract.md §1: a message's ``type`` must agree with its topic, else ``type_mismatch``. A message whose
    fields were those of its topic but whose type named another was dead-lettered as ``missing_field`` (it was
    checked as the other type)."""
    from stream_eval.events.messages import decode_message

    bad = decode_message(value, kind, CONFIG, 0.0, "t@0")
    assert isinstance(bad, Invalid) and bad.code == "type_mismatch", bad


@settings(max_examples=60, deadline=None)
@given(picks=st.lists(st.sampled_from(range(len(_MESSAGES))), max_size=300))
def test_a_batch_of_messages_decodes_as_its_messages_one_by_one(picks: list[int]) -> None:
    """Whatever bad messages a fetched batch holds, and wherever, the batch decodes to what each message alone
    decodes to (the fast path splits around bad messages instead of giving up on the batch)."""
    from stream_eval.events.messages import decode_message, decode_messages

    config = Config()
    values = [_MESSAGES[i] for i in picks]
    stamps = [float(n) for n in range(len(values))]
    where = [f"p@{n}" for n in range(len(values))]
    expected = [decode_message(v, "feedback", config, t, w) for v, t, w in zip(values, stamps, where, strict=True)]
    assert decode_messages(values, "feedback", config, stamps, where) == expected


# -- feedback read into columns (events/scan.py) -------------------------------------------------------------

FB = b'"type":"feedback","request_id":"r1","item":"a"'
FEEDBACK_EDGE = [  # feedback lines the compiled reader must read exactly as msgspec, or leave to it
    b"{" + FB + b',"ts":2}',
    b"{" + FB + b',"ts":2.5,"kind":"click"}',
    b'{"ts":2,"item":"a","request_id":"r1","type":"feedback"}',
    b'{ "type" : "feedback" ,\t"request_id":"r1", "item": "a", "ts": 2 }\r',
    b"  {" + FB + b',"ts":2}  ',
    b"{" + FB + b',"ts":2,"kind":"label","grade":0}',
    b"{" + FB + b',"ts":2,"kind":"label","grade":2.75}',
    b"{" + FB + b',"ts":2,"kind":"label","grade":null}',
    b"{" + FB + b',"ts":2,"kind":"click","grade":3}',
    b"{" + FB + b',"ts":2,"kind":"purchase"}',
    b"{" + FB + b',"ts":2,"kind":"purchase","grade":1}',
    b"{" + FB + b',"ts":2,"kind":"nope"}',
    b"{" + FB + b',"ts":2,"grade":-1}',
    b"{" + FB + b',"ts":2,"grade":-0}',
    b"{" + FB + b',"ts":2,"grade":"2"}',
    b"{" + FB + b',"ts":2,"grade":true}',
    b"{" + FB + b',"ts":-0.0}',
    b"{" + FB + b',"ts":1767225600.123456}',
    b"{" + FB + b',"ts":1767225600.1234567}',
    b"{" + FB + b',"ts":0.1000000000000001}',
    b"{" + FB + b',"ts":12345678901234567890}',
    b"{" + FB + b',"ts":1e3}',
    b"{" + FB + b',"ts":1.5E-2}',
    b"{" + FB + b',"ts":01}',
    b"{" + FB + b',"ts":1.}',
    b"{" + FB + b',"ts":.5}',
    b"{" + FB + b',"ts":-}',
    b"{" + FB + b',"ts":"2026-01-01T00:00:00Z"}',
    b"{" + FB + b',"ts":"2026-01-01T00:00:00"}',
    b"{" + FB + b',"ts":null}',
    b"{" + FB + b"}",
    b"{" + FB + b',"ts":2,"ts":3}',
    b"{" + FB + b',"ts":2,"extra":"x","n":1.5e400,"b":false,"z":null}',
    b"{" + FB + b',"ts":2,"nested":{"a":1}}',
    b"{" + FB + b',"ts":2,"list":[1,2]}',
    b"{" + FB + b',"ts":2}x',
    b"{" + FB + b',"ts":2}{"a":1}',
    b"{" + FB + b',"ts":2,}',
    b"{" + FB + b',"ts" 2}',
    b"{" + FB + b',"ts":2',
    b'{"type":"feedbackx","request_id":"r1","item":"a","ts":2}',
    b'{"type":"feedback","request_id":"","item":"a","ts":2}',
    b'{"type":"feedback","request_id":"r1","item":"","ts":2}',
    b'{"type":"feedback","request_id":"r1","ts":2}',
    b'{"type":"feedback","item":"a","ts":2}',
    b'{"request_id":"r1","item":"a","ts":2}',
    b'{"type":"feedback","request_id":"r1","item":"a\\"b","ts":2}',
    b'{"type":"feedback","request_id":"r\\u0031","item":"a","ts":2}',
    b'{"type":"feedback","request_id":"r1","item":"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80","ts":2}',
    b'{"type":"feedback","request_id":"r1","item":"\xc0\x80","ts":2}',
    b'{"type":"feedback","request_id":"r1","item":"\xed\xa0\x80","ts":2}',
    b'{"type":"feedback","request_id":"r1","item":"\xf5\x80\x80\x80","ts":2}',
    b'{"type":"feedback","request_id":"r1","item":"\xe4\xb8","ts":2}',
    b'{"type":"feedback","request_id":"r1","item":"a\tb","ts":2}',
    b'{"type":"feedback","request_id":"r1","item":1,"ts":2}',
    b'{"type":"feedback","request_id":"r1","item":"a","kind":null,"ts":2}',
    b'{"ty\\u0070e":"feedback","request_id":"r1","item":"a","ts":2}',
    b'["type","feedback"]',
    b"{}",
    b"\x0c{" + FB + b',"ts":2}',
    b"{" + FB + b',"ts":2,"dwell":31.5}',
    b"{" + FB + b',"ts":2,"dwell":0}',
    b"{" + FB + b',"ts":2,"dwell":-0}',
    b"{" + FB + b',"ts":2,"dwell":-0.0}',
    b"{" + FB + b',"ts":2,"dwell":-1.5}',
    b"{" + FB + b',"ts":2,"dwell":null}',
    b"{" + FB + b',"ts":2,"dwell":"30"}',
    b"{" + FB + b',"ts":2,"dwell":true}',
    b"{" + FB + b',"ts":2,"dwell":[30]}',
    b"{" + FB + b',"ts":2,"dwell":3e1}',
    b"{" + FB + b',"ts":2,"dwell":30.000000000000000000001}',
    b"{" + FB + b',"ts":2,"dwell":1' + b"0" * 400 + b'.5}',
    b"{" + FB + b',"ts":2,"dwell":12345678901234567890}',
    b"{" + FB + b',"ts":2,"dwell":5,"dwell":6}',
    b"{" + FB + b',"ts":2,"kind":"label","grade":2,"dwell":40}',
]
RK = b'"type":"ranking","request_id":"r9","ts":5,"items":["a","b"]'
RANKING_EDGE = [  # rankings the compiled reader must make compact exactly as msgspec and Validator.compact, or leave
    b"{" + RK + b"}",
    b"{" + RK + b',"scores":[0.5,0.25],"query_id":"q","session_id":"s","experiment":"e","arm":"t"}',
    b'{"arm":"t","items":["a","b"],"ts":5.125,"request_id":"r9","type":"ranking"}',
    b'{ "type": "ranking", "request_id": "r9", "ts": 5, "items": ["a","b"], "scores": [1,2] }',
    b"{" + RK + b',"scores":null,"query_id":null,"session_id":null,"teams":null,"subtopics":null}',
    b"{" + RK + b',"scores":[]}',
    b"{" + RK + b',"scores":[1]}',
    b"{" + RK + b',"scores":[1e2,3]}',
    b"{" + RK + b',"scores":[1.12345678901234567,3]}',
    b"{" + RK + b',"scores":["1",3]}',
    b"{" + RK + b',"scores":[1,[3]]}',
    b"{" + RK + b',"scores":[01,3]}',
    b"{" + RK + b',"scores":[1,2,]}',
    b"{" + RK + b',"scores":[1 ,2]}',
    b"{" + RK + b',"experiment":null}',
    b"{" + RK + b',"experiment":""}',
    b"{" + RK + b',"arm":5}',
    b"{" + RK + b',"query_id":5}',
    b"{" + RK + b',"query_id":"\\u0071"}',
    b"{" + RK + b',"session_id":"s\xc3\xa9"}',
    b"{" + RK + b',"teams":["x","y"]}',
    b"{" + RK + b',"subtopics":[["x"],["y"]]}',
    b"{" + RK + b',"extra":["x","y"],"n":[1,2],"o":{"a":1},"f":true}',
    b"{" + RK + b',"extra":["x","y"],"g":-1,"kind":"nope","item":5}',
    b"{" + RK + b',"items":["c"]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":[]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":["a","a"]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":["a", "b"]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":[1,2]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":[["a"]]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":["a\"b"]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":["\xc3\xa9","b"]}',
    b'{"type":"ranking","request_id":"r\xc3\xa9","ts":5,"items":["a"]}',
    b'{"type":"ranking","request_id":"","ts":5,"items":["a"]}',
    b'{"type":"ranking","request_id":"r9","items":["a"]}',
    b'{"type":"ranking","request_id":"r9","ts":"2026-01-01T00:00:00Z","items":["a"]}',
    b'{"type":"ranking","request_id":"r9","ts":1767225600.123456789,"items":["a"]}',
    b'{"type":"ranking","request_id":"r9","ts":-0,"items":["a"]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":["a"],"ts":6}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":["' + b'","'.join(b"%d" % i for i in range(1001)) + b'"]}',
    b'{"type":"rankings","request_id":"r9","ts":5,"items":["a"]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":["a"]',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":["a"]} {}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":[],"scores":[]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":[],"scores":[1]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":["a"],"dwell":5}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":["a"],"dwell":[5]}',
]
ATTRIBUTES_EDGE = [  # a ranking's attributes: a flat object of UTF-8 strings without escapes, each key once, up to
    # 16, is read by the compiled reader (the first seven lines, the one of "é" and the one of 16 keys), anything else
    # is left to msgspec
    b"{" + RK + b',"attributes":{"platform":"ios"}}',
    b"{" + RK + b',"attributes":{"platform":"ios","locale":"en-GB"},"unit_id":"u1"}',
    b"{" + RK + b',"attributes":{ "platform" : "ios" , "locale":"" }}',
    b"{" + RK + b',"attributes":{"":""}}',
    b"{" + RK + b',"attributes":{}}',
    b"{" + RK + b',"attributes":{ }}',
    b"{" + RK + b',"attributes":null}',
    b"{" + RK + b',"attributes":{"platform":"ios","platform":"web"}}',
    b"{" + RK + b',"attributes":{"platform":"ios","locale":"en","platform":"web"}}',
    b"{" + RK + b',"attributes":{"platform":5}}',
    b"{" + RK + b',"attributes":{"platform":null}}',
    b"{" + RK + b',"attributes":{"platform":["ios"]}}',
    b"{" + RK + b',"attributes":{"platform":{"os":"ios"}}}',
    b"{" + RK + b',"attributes":{"platform":"ios",}}',
    b"{" + RK + b',"attributes":{"platform" "ios"}}',
    b"{" + RK + b',"attributes":{"platform":"ios"',
    b"{" + RK + b',"attributes":{"platform":"i\\u006fs"}}',
    b"{" + RK + b',"attributes":{"pl\\u0061tform":"ios"}}',
    b"{" + RK + b',"attributes":{"platform":"\xc3\xa9"}}',
    b"{" + RK + b',"attributes":{"platform":"\xff"}}',
    b"{" + RK + b',"attributes":{' + b",".join(b'"k%d":"v"' % k for k in range(17)) + b"}}",
    b"{" + RK + b',"attributes":{' + b",".join(b'"k%d":"v"' % k for k in range(16)) + b"}}",
    b"{" + RK + b',"attributes":"ios"}',
    b"{" + RK + b',"attributes":{"platform":"ios"},"attributes":{"platform":"web"}}',
    b"{" + RK + b',"other":{"platform":"ios"}}',
    b'{"type":"feedback","request_id":"r9","item":"a","ts":5,"attributes":{"platform":"ios"}}',
]
WIDE_EDGE = [  # labels that are not ASCII (valid UTF-8, without escapes) are read by the compiled reader (the first
    # six lines); request ids and items that are not ASCII, and bytes that are not UTF-8, are left to msgspec
    b"{" + RK + b',"query_id":"\xe6\x9f\xa5\xe8\xaf\xa2","session_id":"s\xc3\xa9",'
    b'"unit_id":"\xe7\x94\xa8\xe6\x88\xb7"}',
    b"{" + RK + b',"experiment":"exp\xc3\xa9","arm":"\xf0\x9f\x8d\x8e"}',
    b"{" + RK + b',"query_id":"\xe6\x9f\xa5\xe8\xaf\xa2","arm":"b"}',
    b"{" + RK + b',"session_id":"\xc3\xa9","attributes":{"langue":"fran\xc3\xa7ais"}}',
    b"{" + RK + b',"query_id":"q","session_id":"s","experiment":"e","arm":"a","unit_id":"u"}',
    b"{" + RK + b',"query_id":"\x7f\xc2\x80"}',
    b"{" + RK + b',"query_id":"\xff"}',
    b"{" + RK + b',"session_id":"\xc3\xa9\\u00e9"}',
    b"{" + RK + b',"query_id":"\xe6\x9f"}',
    b'{"type":"ranking","request_id":"r\xc3\xa9","ts":5,"items":["a","b"]}',
    b'{"type":"ranking","request_id":"r9","ts":5,"items":["\xc3\xa9","b"]}',
]
RK3 = b'"type":"ranking","request_id":"r9","ts":5,"items":["a","b","c"],"scores":'
SCORES_EDGE = [  # scores of any JSON form are read by the compiled reader (the first eight lines) when each one's text
    # bounds its value below a double's largest (300 characters; 24 with an exponent of at most two digits)
    b"{" + RK3 + b"[0.9387000008474338,0.9122000002550691,8.47e-06]}",
    b"{" + RK3 + b"[1E5,-0e5,1e+05]}",
    b"{" + RK3 + b"[1.5e-99,-2.5E99,3]}",
    b"{" + RK3 + b"[12345678901234567890123,0,-0]}",
    b"{" + RK3 + b"[" + b"9" * 298 + b".5,1,2]}",
    b"{" + RK3 + b"[1.2345678901234567e-10,1,2]}",
    b"{" + RK3 + b"[0." + b"1" * 297 + b",1,2]}",
    b"{" + RK3 + b"[1.23456789012345678901e5,1,2]}",
    b"{" + RK3 + b"[ 1 , 2e-5 , 3 ]}",
    b"{" + RK3 + b"[" + b"9" * 300 + b".5,1,2]}",
    b"{" + RK3 + b"[" + b"1" * 400 + b",1,2]}",
    b"{" + RK3 + b"[1e400,1,2]}",
    b"{" + RK3 + b"[1e-400,1,2]}",
    b"{" + RK3 + b"[1e100,1,2]}",
    b"{" + RK3 + b"[1.234567890123456789012e5,1,2]}",
    b"{" + RK3 + b"[1e,1,2]}",
    b"{" + RK3 + b"[1e+,1,2]}",
    b"{" + RK3 + b"[01,1,2]}",
    b"{" + RK3 + b"[1.e5,1,2]}",
    b"{" + RK3 + b"[.5,1,2]}",
    b"{" + RK3 + b"[+1,1,2]}",
    b"{" + RK3 + b"[1e5e5,1,2]}",
    b"{" + RK3 + b"[1-2,1,2]}",
    b"{" + RK3 + b"[1e5,1]}",
    b"{" + RK3 + b"[NaN,1,2]}",
    b"{" + RK3 + b"[Infinity,1,2]}",
    b"{" + RK3 + b"[1,2,3,]}",
]
#: ISO-8601 times: the compiled reader takes the first ten (``YYYY-MM-DDTHH:MM:SS``, a fraction of 1 to 6 digits,
#: ``Z`` or ``+HH:MM``), msgspec and parse_time the others, valid or not
ISO_EDGE = ["2026-01-01T00:00:00Z", "2026-01-01T00:00:00.123Z", "2026-03-31T23:59:59.999999+05:30",
            "2024-02-29T12:00:00.5-08:00", "2026-01-01T00:00:00-00:00", "2026-06-30T00:00:00.12345+23:59",
            "1970-01-01T00:00:00Z", "2000-02-29T00:00:00Z", "2255-06-05T00:00:00Z", "1686-01-01T00:00:00Z",
            "2026-02-29T00:00:00Z", "2100-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-13-01T00:00:00Z",
            "2026-00-01T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01T00:60:00Z",
            "2026-01-01T00:00:60Z", "0000-01-01T00:00:00Z", "2026-01-01T00:00:00z", "2026-01-01 00:00:00Z",
            "2026-01-01T00:00:00.1234567Z", "2026-01-01T00:00:00.Z", "2026-01-01T00:00:00,5Z", "2026-01-01T00:00Z",
            "2026-01-01T00:00:00+0530", "2026-01-01T00:00:00+24:00", "2026-01-01T00:00:00+05:60",
            "2026-01-01T00:00:00", "2026-01-01", "2026-01-01T00:00:00ZZ", "2026-01-01T00:00:00+05:30:00",
            "20260101T000000Z", "2026-01-01T00:00:00\u005a", "+2026-01-01T00:00:00Z", "2026-1-01T00:00:00Z",
            "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "2026-01-01T0a:00:00Z", ""]
KINDS_CONFIG = Config(kinds=(("purchase", 3.0),))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(GOOD + BAD_VALID_JSON + BAD_SCHEMA + MALFORMED + COMPACT_GOOD + COMPACT_EDGE
                                + NOT_ONE_EVENT + FEEDBACK_EDGE + RANKING_EDGE + ATTRIBUTES_EDGE
                                + WIDE_EDGE + SCORES_EDGE), max_size=25),
       st.booleans(), st.sampled_from([CONFIG, KINDS_CONFIG]))
def test_lines_read_by_compiled_code_equal_msgspec(lines: list[bytes], last_newline: bool, config: Config) -> None:
    """Every line decodes to the same event, in the same order, with the same line number in its reason,
    whether the compiled reader took it (feedback into columns, rankings made compact) or left it to msgspec."""
    chunk = b"\n".join(lines) + (b"\n" if last_newline else b"")
    assert comparable(decode_chunk_columns(chunk, config, 7, "f").as_list()) == comparable(
        decode_chunk_compact(chunk, config, 7, "f"))


def as_compact(events: list[Any]) -> list[Any]:
    """Events as :func:`decode_chunk` gives them, each ranking in compact form."""
    return [CompactRanking.of(e) if type(e) is Ranking else e for e in events]


def comparable(events: list[Any]) -> list[Any]:
    """Events with each compact ranking's items and scores as lists (the JSON text of the same scores can be
    written two ways: as read, or encoded again after a line was decoded alone)."""
    return [(item_list(e.items), score_list(e.scores), msgspec.structs.replace(e, items="", scores=None))
            if type(e) is CompactRanking else e for e in events]


def read_alike(chunk: bytes, config: Config = CONFIG, first_line: int = 1) -> Chunk:
    """``chunk`` by the compiled reader, once it is checked to give msgspec's events and reasons (file ``f``)."""
    decoded = decode_chunk_columns(chunk, config, first_line, "f")
    assert comparable(decoded.as_list()) == comparable(decode_chunk_compact(chunk, config, first_line, "f"))
    return decoded


@pytest.mark.parametrize("line", ATTRIBUTES_EDGE, ids=lambda line: line[len(RK) + 2:].decode("latin-1"))
def test_a_ranking_s_attributes_read_the_same_compiled_and_by_msgspec(line: bytes) -> None:
    """Each line alone, and twice in one chunk (the second time its attributes are known), decodes to the same event
    or reason by either reader; a flat object of strings becomes the ranking's attributes, an empty one none."""
    for chunk in (line, line + b"\n" + line):
        columns = read_alike(chunk, first_line=3).as_list()
    if type(columns[0]) is CompactRanking:
        given = msgspec.json.decode(line).get("attributes")
        assert columns[0].attributes == (given or None) == columns[1].attributes


def read_compiled(chunk: bytes) -> list[bool]:
    """Whether the compiled reader made each line of ``chunk`` (rankings only) into its ranking, not msgspec."""
    return [bool(decoded.plain is not None and len(decoded.plain.rankings))
            for decoded in (decode_chunk_columns(line, CONFIG) for line in chunk.split(b"\n"))]


def test_which_attributes_the_compiled_reader_takes() -> None:
    """A flat object of at most 16 UTF-8 strings without escapes, each key once, is read compiled; every other
    shape (a key twice among them: msgspec keeps the last value) is left to msgspec."""
    taken = {0, 1, 2, 3, 4, 5, 6, 18, 21}
    assert [read_compiled(line)[0] for line in ATTRIBUTES_EDGE] == [k in taken for k in range(len(ATTRIBUTES_EDGE))]


@pytest.mark.parametrize("line", WIDE_EDGE, ids=lambda line: line[len(RK) - 20:].decode("utf-8", "replace"))
def test_labels_that_are_not_ascii_read_the_same_compiled_and_by_msgspec(line: bytes) -> None:
    """A ranking whose query, session, experiment, arm or unit is not ASCII: the same event (or reason) by either
    reader, alone, after an ASCII ranking and among others (the first six lines by the compiled reader)."""
    ascii_line = b"{" + RK + b',"query_id":"q","session_id":"s"}'
    repeated = b'{"type":"ranking","request_id":"r8","ts":5,"items":["a","a"],"query_id":"\xc3\xa9"}'  # (msgspec)
    for chunk in (line, ascii_line + b"\n" + line + b"\n" + ascii_line, repeated + b"\n" + line + b"\n" + repeated):
        read_alike(chunk, first_line=3)
    assert read_compiled(line) == [WIDE_EDGE.index(line) < 6]


@pytest.mark.parametrize("line", SCORES_EDGE, ids=lambda line: line[len(RK3) + 1:60].decode())
def test_scores_of_any_json_form_read_the_same_compiled_and_by_msgspec(line: bytes) -> None:
    """Scores with exponents, many digits or long arrays: the same event (or reason) by either reader, alone and
    among others; the compiled reader takes those whose text bounds their value."""
    plain = b"{" + RK3 + b"[1,2,3]}"
    for chunk in (line, plain + b"\n" + line + b"\n" + plain):
        columns = comparable(read_alike(chunk, first_line=3).as_list())
        assert columns == comparable(as_compact(decode_chunk(chunk, CONFIG, 3, "f")))  # (msgspec alone)
    assert read_compiled(line) == [SCORES_EDGE.index(line) < 8]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=3, max_size=3), min_size=1,
                max_size=5), st.sampled_from(["{!r}", "{:.17g}", "{:e}", "{:.3E}", "{:.20f}"]))
def test_scores_as_programs_write_them_read_the_same_compiled_and_by_msgspec(rows: list[list[float]],
                                                                             form: str) -> None:
    """Scores as Python, C and Java write doubles (shortest repr, 17 digits, exponents, fixed point): both readers
    give the same values; the compiled reader takes every line whose numbers are within its bounds."""
    texts = [[form.format(x) for x in row] for row in rows]
    chunk = b"\n".join(b"{" + RK3 + ("[" + ",".join(row) + "]").encode() + b"}" for row in texts)
    columns = read_alike(chunk).as_list()
    def msgspec_values(row: list[str]) -> list[str] | None:  # (to the bit: "-0" is 0.0, "-0.0" is -0.0)
        try:
            return list(map(str, msgspec.json.decode(("[" + ",".join(row) + "]").encode(), type=list[float])))
        except msgspec.ValidationError:  # a number that rounds beyond a double is refused
            return None
    assert [list(map(str, score_list(e.scores))) if type(e) is CompactRanking else None for e in columns] == list(
        map(msgspec_values, texts))
    assert comparable(columns) == comparable(as_compact(decode_chunk(chunk, CONFIG, 1, "f")))

    def bounded(text: str) -> bool:
        mantissa, _, exponent = text.lower().partition("e")
        return len(text) <= 300 if not exponent else len(text) <= 24 and len(exponent.lstrip("+-")) <= 2
    assert read_compiled(chunk) == [all(map(bounded, row)) for row in texts]


@pytest.mark.parametrize("ts", ISO_EDGE)
def test_iso_times_read_the_same_compiled_and_by_msgspec(ts: str) -> None:
    """A ranking and its feedback with an ISO-8601 ``ts``: the same events (or reasons) by either reader; the
    compiled reader takes the usual forms (the feedback in columns), with parse_time's value to the bit."""
    config = Config(min_ts=-6.2e10, max_ts=2.5e11)  # (years 5 to 9891)
    chunk = (b'{"type":"ranking","request_id":"r1","ts":"%b","items":["a","b"]}\n'
             b'{"type":"feedback","request_id":"r1","item":"a","ts":"%b"}' % (ts.encode(), ts.encode()))
    decoded = read_alike(chunk, config)
    taken = ISO_EDGE.index(ts) < 10
    assert (decoded.plain is not None, len(decoded.feedback)) == (taken, int(taken))
    if taken:
        assert str(decoded.events[0].ts) == str(decoded.feedback.ts[0]) == str(parse_time(ts))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.datetimes(min_value=datetime(1690, 1, 2), max_value=datetime(2250, 12, 30)),
                 st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30))),
       st.integers(-23 * 60 - 59, 23 * 60 + 59), st.sampled_from(["seconds", "milliseconds", "microseconds", "auto"]),
       st.booleans())
def test_any_iso_time_reads_as_parse_time_reads_it(moment: datetime, minutes: int, timespec: str, zulu: bool) -> None:
    """Times as ``datetime.isoformat`` writes them, at any offset (``Z`` for UTC when asked): the compiled reader
    gives parse_time's seconds to the bit, and msgspec's path the same events."""
    zone = timezone(timedelta(minutes=0 if zulu else minutes))
    text = moment.replace(tzinfo=zone).isoformat(timespec=timespec)
    if zulu:
        text = text.replace("+00:00", "Z")
    config = Config(min_ts=-6.2e10, max_ts=2.5e11)
    line = b'{"type":"feedback","request_id":"r1","item":"a","ts":"%b"}' % text.encode()
    decoded = read_alike(line, config)
    micros = (moment.replace(tzinfo=zone) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    assert len(decoded.feedback) == (abs(micros) < 2**53)  # (beyond, parse_time reads it: years 1685 to 2255)
    if len(decoded.feedback):
        assert str(decoded.feedback.ts[0]) == str(parse_time(text))


def _spaced(line: bytes) -> bytes | None:
    """``line`` as ``json.dumps`` writes it by default (``", "`` and ``": "``), ``None`` when it is not JSON."""
    try:
        return json.dumps(json.loads(line), ensure_ascii=False).encode()
    except (ValueError, RecursionError):
        return None


EVERY_EDGE = [*GOOD, *BAD_VALID_JSON, *BAD_SCHEMA, *MALFORMED, *COMPACT_EDGE, *NOT_ONE_EVENT, *FEEDBACK_EDGE,
              *RANKING_EDGE, *ATTRIBUTES_EDGE, *WIDE_EDGE, *SCORES_EDGE]


@pytest.mark.parametrize("line", [line for line in EVERY_EDGE if _spaced(line) not in (None, line)])
def test_lines_written_with_spaces_read_as_the_compact_ones(line: bytes) -> None:
    """A line as ``json.dumps`` writes it by default (in a chunk that starts so: read minified) gives the same
    event or reason as msgspec gives it, and the compiled reader takes it when it takes the compact line."""
    spaced = _spaced(line)
    assert spaced is not None
    compact = json.dumps(json.loads(line), ensure_ascii=False, separators=(",", ":")).encode()
    chunk = b'{"type": "watermark", "ts": 5}\n' + spaced
    decoded = read_alike(chunk)
    assert (read_compiled(spaced), len(decoded.feedback)) == (read_compiled(compact),
                                                             len(decode_chunk_columns(compact, CONFIG).feedback))
    for event in decoded.as_list():
        if type(event) is Invalid:
            assert event.raw in (b'{"type": "watermark", "ts": 5}', spaced)  # dead-lettered as written


@st.composite
def _loosened(draw: st.DrawFn) -> bytes:
    """A line of the edge cases with JSON white space put anywhere outside its strings (perhaps inside a number,
    where it is no longer JSON), or bytes of any kind put in."""
    line = draw(st.sampled_from(EVERY_EDGE))
    out, inside, escaped = bytearray(), False, False
    for byte in line:
        if not inside and draw(st.integers(0, 5)) == 0:
            out += draw(st.sampled_from([b" ", b"\t", b"\r", b"  ", b" \t "]))
        out.append(byte)
        if inside:
            inside = escaped or byte != 34
            escaped = not escaped and byte == 92
        elif byte == 34:
            inside = True
    return bytes(out)


@settings(max_examples=400, deadline=None)
@given(st.lists(_loosened(), min_size=1, max_size=8))
def test_any_white_space_reads_as_msgspec_reads_it(lines: list[bytes]) -> None:
    """Lines with white space anywhere outside their strings, read minified (the chunk starts with a spaced line),
    give msgspec's events and reasons, each bad line dead-lettered as written; the minified lines are JSON exactly
    when the lines were, with the same values."""
    chunk = b'{"type": "watermark", "ts": 5}\n' + b"\n".join(lines)
    read_alike(chunk)
    minified = scan.minified(np.frombuffer(chunk, dtype=np.uint8)).tobytes().split(b"\n")
    assert len(minified) == chunk.count(b"\n") + 1
    for written, compact in zip(chunk.split(b"\n"), minified, strict=True):
        try:
            expected = json.loads(written)
        except (ValueError, RecursionError):
            with pytest.raises((ValueError, RecursionError)):
                json.loads(compact)
        else:
            assert json.loads(compact) == expected


def _objects(draw: st.DrawFn) -> tuple[bytes, dict[str, str], bool]:
    """An ``attributes`` object as JSON text (a key perhaps twice, any white space, escaped or not), what msgspec
    decodes it to, and whether the compiled reader takes it."""
    pairs = draw(st.lists(st.tuples(st.text(max_size=6), st.text(max_size=6)), max_size=20))
    if pairs and draw(st.booleans()):  # a key twice
        pairs.append((draw(st.sampled_from(pairs))[0], draw(st.text(max_size=6))))
    ascii_only = draw(st.booleans())
    comma, colon = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\t", "\r: ")]))
    text = "{" + comma.join(json.dumps(k, ensure_ascii=ascii_only) + colon + json.dumps(v, ensure_ascii=ascii_only)
                            for k, v in pairs) + "}"
    plain = all(ord(c) >= 32 and c not in '"\\' and (ord(c) < 128 or not ascii_only)
                for pair in pairs for part in pair for c in part)
    keys = [k for k, _ in pairs]
    return text.encode(), dict(pairs), plain and len(set(keys)) == len(keys) <= 16


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_attributes_read_the_same_compiled_and_by_msgspec(data: st.DataObject) -> None:
    """Rankings with any ``attributes`` of strings (escaped or not, any characters, keys twice, up to 21 keys) decode
    the same by either reader, and the compiled reader takes those it should."""
    objects = [data.draw(st.composite(_objects)()) for _ in range(data.draw(st.integers(1, 6)))]
    chunk = b"\n".join(b"{" + RK + b',"attributes":' + text + b"}" for text, _, _ in objects)
    columns = read_alike(chunk).as_list()
    assert [e.attributes for e in columns] == [value or None for _, value, _ in objects]
    assert read_compiled(chunk) == [taken for _, _, taken in objects]


def test_rankings_share_their_attributes_read_only() -> None:
    """One object for every ranking with the same attributes text, in one chunk and the next; it cannot be changed
    (every ranking holding it would change); a copy or a pickle of it is a plain dict. A long text is decoded for
    its chunk and not kept."""
    def attributes(text: bytes, count: int = 2) -> list[Any]:
        chunk = b"\n".join(b"{" + RK + b',"attributes":' + text + b"}" for _ in range(count))
        return [e.attributes for e in decode_chunk_columns(chunk, CONFIG).as_list()]

    first, second = attributes(b'{"platform":"share-test"}')
    assert first is second is attributes(b'{"platform":"share-test"}')[0]
    assert schema.ATTRIBUTE_SETS[b'{"platform":"share-test"}'] is first
    with pytest.raises(TypeError, match="shared"):
        first["platform"] = "web"
    with pytest.raises(TypeError, match="shared"):
        first.update(locale="en")
    assert first == {"platform": "share-test"}
    assert type(pickle.loads(pickle.dumps(first))) is dict and copy.deepcopy(first) == first
    long = b'{"note":"' + b"x" * schema._SHARED_TEXT + b'"}'
    one, other = attributes(long)
    assert one is other and long not in schema.ATTRIBUTE_SETS and attributes(long)[0] is not one


def test_attributes_msgspec_refuses_send_their_ranking_to_msgspec(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should the compiled reader pass an object msgspec refuses (it passes none), that ranking is decoded by msgspec,
    which says why, and the others of its chunk are not: here a decoder allowing values of 3 characters at most."""
    short = dict[str, Annotated[str, msgspec.Meta(max_length=3)]]
    monkeypatch.setattr(schema, "_ATTRIBUTES_DECODER", msgspec.json.Decoder(list[short]))  # type: ignore[valid-type]
    monkeypatch.setattr(schema, "_ATTRIBUTE_DECODER", msgspec.json.Decoder(short))  # type: ignore[valid-type]
    values = [{"platform": "ios"}, {"platform": "android-refused"}, {"platform": "web"}, {}]
    chunk = b"\n".join(b"{" + RK + b',"attributes":' + json.dumps(value).encode() + b"}" for value in values)
    decoded = decode_chunk_columns(chunk, CONFIG, 1, "f")
    assert decoded.as_list() == decode_chunk_compact(chunk, CONFIG, 1, "f")
    assert [e.attributes for e in decoded.as_list()] == [{"platform": "ios"}, {"platform": "android-refused"},
                                                         {"platform": "web"}, None]
    assert decoded.plain is not None and len(decoded.plain.rankings) == 3  # the refused one went to msgspec


def test_plain_feedback_is_read_into_columns() -> None:
    """The forms a log usually has do not go through msgspec (they are in the columns, not the objects)."""
    dwell = FEEDBACK_EDGE[-15:]  # with a dwell: numbers in the plain form, a long decimal, null
    plain = [*FEEDBACK_EDGE[:7], FEEDBACK_EDGE[8], *FEEDBACK_EDGE[16:20], FEEDBACK_EDGE[48],
             *(dwell[k] for k in (0, 1, 2, 3, 5, 10, 14))]
    chunk = b"\n".join([ranking(), *plain])
    decoded = decode_chunk_columns(chunk, CONFIG)
    assert len(decoded.feedback) == len(plain) and decoded.feedback_at.tolist() == list(range(1, len(plain) + 1))
    assert [type(e) for e in decoded.events] == [CompactRanking]


def test_plain_rankings_do_not_go_through_msgspec(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forms a log usually has are made compact by the compiled reader; the others still decode."""
    plain = [*(RANKING_EDGE[k] for k in (0, 1, 2, 3, 4, 8, 15, 23, 36, 37)), *ATTRIBUTES_EDGE[:7], ATTRIBUTES_EDGE[21]]
    expected = decode_chunk_compact(b"\n".join(plain), CONFIG)
    monkeypatch.setattr(schema, "decode_chunk_compact", None)  # any line left to msgspec would fail here
    decoded = decode_chunk_columns(b"\n".join(plain), CONFIG)
    assert decoded.plain is not None and decoded.plain.rankings == decoded.events  # items left in the chunk
    assert all(e.items == "" for e in decoded.events)
    assert decoded.as_list() == expected and all(type(e) is CompactRanking for e in decoded.events)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.from_regex(r"-?(0|[1-9][0-9]{0,19})(\.[0-9]{1,25})?", fullmatch=True),
       st.sampled_from([b"ts", b"grade", b"dwell"]))
def test_numbers_read_in_columns_are_exact(text: str, key: bytes) -> None:
    """A time, grade or dwell read into columns is the double nearest its decimal text, as ``float`` has it; every
    number without an exponent is read there, but integers of more than 15 digits, negative grades and dwells, and
    grades above MAX_GRADE (bad_grade)."""
    number = text.encode()
    line = (b"{" + FB + b',"ts":' + number + b"}" if key == b"ts"
            else b"{" + FB + b',"ts":1,"' + key + b'":' + number + b"}")
    decoded = decode_chunk_columns(line, CONFIG)
    long_integer = "." not in text and sum(c.isdigit() for c in text) > 15
    if len(decoded.feedback):
        value = getattr(decoded.feedback, key.decode())[0]
        assert str(value) == str(msgspec.json.decode(number, type=float)) and not long_integer
        assert decoded.as_list() == decode_chunk_compact(line, CONFIG)
    else:
        out_of_range = key == b"ts" and not CONFIG.min_ts <= float(text) <= CONFIG.max_ts  # invalid: ts_out_of_range
        too_high = key == b"grade" and float(text) > MAX_GRADE  # invalid: bad_grade
        assert long_integer or out_of_range or too_high or (key != b"ts" and (float(text) < 0 or text.startswith("-")))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                                   st.from_regex(r"-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,25})?([eE][+-]?[0-9]{1,2})?",
                                                 fullmatch=True)), min_size=1, max_size=8), max_size=6))
def test_scores_read_by_compiled_code_equal_msgspec(arrays: list[list[float | str]]) -> None:
    """Scores kept as JSON text are read back (:func:`scan.json_numbers`) to the same doubles as msgspec."""
    texts = [b"[" + b",".join(x.encode() if isinstance(x, str) else msgspec.json.encode(x) for x in a) + b"]"
             for a in arrays]
    text = b"".join(texts)
    expected = [v for t in texts for v in msgspec.json.decode(t, type=list[float])]
    values = json_numbers(text, len(expected))
    assert values is not None and [str(v) for v in values.tolist()] == [str(v) for v in expected]
    assert json_numbers(text, len(expected) + 1) is None and json_numbers(text + b"[x]", len(expected) + 1) is None


@pytest.mark.parametrize("room", [65_536, 2])
def test_plain_rankings_share_their_names(monkeypatch: pytest.MonkeyPatch, room: int) -> None:
    """Experiment, arm and query names read by the line reader are one string per name across chunks (open
    requests hold many); once the bounded table is full, new names stay as read, with the right values."""
    monkeypatch.setattr(schema, "_MAX_LABELS", room)
    kept = dict(schema.LABELS)  # (the table is cleared and refilled in place: other modules hold it)
    schema.LABELS.clear()
    try:
        _check_names_shared(room)
    finally:
        schema.LABELS.clear()
        schema.LABELS.update(kept)


def _check_names_shared(room: int) -> None:

    def line(rid: str, experiment: str, query: str | None) -> bytes:
        event = {"type": "ranking", "request_id": rid, "ts": 1, "items": ["a", "b"], "experiment": experiment,
                 "arm": "A", "query_id": query}
        return json.dumps(event, separators=(",", ":")).encode()

    first = decode_chunk_columns(b"\n".join([line("r1", "e1", "q"), line("r2", "e2", None)]), CONFIG)
    second = decode_chunk_columns(b"\n".join([line("r3", "e2", "q"), line("r4", "e1", "q")]), CONFIG)
    events = [*first.events, *second.events]
    assert first.plain is not None and second.plain is not None  # read by the line reader
    assert [(e.experiment, e.arm, e.query_id) for e in events] == [
        ("e1", "A", "q"), ("e2", "A", None), ("e2", "A", "q"), ("e1", "A", "q")]
    assert events[3].experiment is events[0].experiment and events[3].query_id is events[2].query_id
    # read in order: queries, experiments, arms; with room for two names, e2 came when the table was full
    assert (events[2].experiment is events[1].experiment) == (room > 2)


def test_compact_scores_hold_only_their_own_size() -> None:
    """A compact ranking keeps its scores as JSON text in a bytes of the text's size: msgspec's encoder returns its
    result in an over-allocated block (257 bytes held for a 172-byte text of 20 scores), which a quarter of the
    worker's ~1 KB per open request went to."""
    rankings = [Ranking(f"r{k}", [f"i{j}" for j in range(20)], ts=1.0,
                        scores=[round(1 - (k + 7 * j) % 997 / 997, 4) for j in range(20)]) for k in range(3000)]
    tracemalloc.start()
    try:
        compact = [CompactRanking.of(ranking) for ranking in rankings]
        with_scores = tracemalloc.get_traced_memory()[0]
        sizes = [sys.getsizeof(c.scores) for c in compact]
        for c in compact:
            c.scores = None
        held = (with_scores - tracemalloc.get_traced_memory()[0]) / len(compact)
    finally:
        tracemalloc.stop()
    assert held <= sum(sizes) / len(sizes) + 8  # the bytes object itself, rounded up to pymalloc's 8-byte sizes


ODD_FIELDS = [{"attributes": value} for value in (5, 5.5, "ios", True, [], ["x"], "", None, {"platform": "ios"},
                                                  {"platform": 7})]


@pytest.mark.parametrize("fields", ODD_FIELDS, ids=repr)
def test_a_ranking_reads_the_same_compact_and_spaced(fields: dict[str, object], tmp_path: Path) -> None:
    """A line without white space takes the compiled reader, one with spaces msgspec: both accept and refuse the
    same rankings (an ``attributes`` that is not an object was accepted compact and refused spaced)."""
    from stream_eval.engine.replay import replay

    event = {"type": "ranking", "request_id": "r1", "ts": EPOCH_2026, "items": ["a", "b"], **fields}
    reports = []
    for name, separators in (("compact", (",", ":")), ("spaced", (", ", ": "))):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(event, separators=separators) + "\n")
        reports.append(replay([str(path)], CONFIG).report()["events"])
    assert reports[0] == reports[1]
    expected_invalid = 0 if fields["attributes"] is None or fields["attributes"] == {"platform": "ios"} else 1
    assert reports[0]["invalid"] == expected_invalid


@pytest.mark.parametrize("grade", [100, 100.5, 1100, 1e300])
def test_a_grade_beyond_100_is_bad_grade_on_every_path(grade: float, tmp_path: Path) -> None:
    """2^grade, the exp gain, overflows a double from 1024 on (its square, in the intervals, from 512): a grade of
    1100 made a request's nDCG null without a word. Beyond MAX_GRADE (100) it is ``bad_grade``, compact or spaced;
    100 itself is valid, and its intervals finite."""
    from stream_eval.engine.replay import replay

    lines = [{"type": "ranking", "request_id": f"r{k}", "ts": EPOCH_2026 + k, "items": ["a", "b"]} for k in range(3)]
    lines.append({"type": "feedback", "request_id": "r1", "item": "b", "kind": "label", "grade": grade,
                  "ts": EPOCH_2026 + 5})
    for separators in ((",", ":"), (", ", ": ")):
        path = tmp_path / "log.jsonl"
        path.write_text("".join(json.dumps(e, separators=separators) + "\n" for e in lines))
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no overflow in the sums and their squares
            engine = replay([str(path)], CONFIG)
            report = engine.report()
        if grade == MAX_GRADE:
            assert not engine.invalid_reasons and report["overall"]["metrics"]["nDCG@10"] > 0
        else:
            assert engine.invalid_reasons == {"feedback: bad_grade": 1}, separators


def test_a_lone_surrogate_escape_is_named_as_a_possible_reason() -> None:
    """msgspec says "Input data was truncated" for a string with a high surrogate escape without its pair: a whole
    line then read as if cut. The reason names both."""
    lone = invalid(b'{"type": "ranking", "request_id": "r", "ts": 1767225600, "items": ["\\ud800"]}')
    cut = invalid(b'{"type": "ranking", "request_id": "r", "ts": 1767225600, "items": ["a')
    assert lone.code == cut.code == "bad_json"
    assert "lone UTF-16 surrogate" in lone.reason and "truncated" in lone.reason
