"""Hostile input, fuzzed: valid events mutated every way a broken or malicious producer can (bytes flipped, lines cut,
bytes that are not UTF-8 in known and unknown fields, keys twice, NaN and Infinity, numbers too large for a double,
the wrong JSON type in every field, null and empty values, deep nesting, 1 MB strings).

Every decoder must agree on each line, the compiled line reader (``decode_chunk_columns``) with msgspec alone; the
worker's message decoder must never raise and give each bad message a reason, its bytes kept for the dead letter;
and garbage inserted anywhere in a log must leave the report of the good lines as it was."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_eval.config import Config
from stream_eval.engine.replay import replay
from stream_eval.events.messages import decode_message, decode_message_chunk, decode_messages
from stream_eval.events.schema import (
    CompactRanking,
    Invalid,
    Ranking,
    decode_chunk,
    decode_chunk_columns,
    decode_chunk_compact,
    decode_line,
    item_list,
    score_list,
)
from stream_eval.simulate import SimulationConfig, simulate_lines

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z

#: Valid events of every type and shape, as (key, JSON value) pairs: the plainest forms the compiled reader takes,
#: and the others (non-ASCII, labels, teams, subtopics, unknown fields) that msgspec decodes.
SEEDS: list[dict[str, Any]] = [
    {"type": "feedback", "request_id": "r1", "item": "d1", "ts": T0 + 1},
    {"type": "feedback", "request_id": "r1", "item": "d2", "kind": "label", "grade": 2, "ts": T0 + 1.5},
    {"type": "feedback", "request_id": "r2", "item": "dé", "kind": "purchase", "ts": T0 + 2, "page": "home"},
    {"type": "ranking", "request_id": "r1", "ts": T0, "items": ["d1", "d2", "d3"], "scores": [0.5, 0.25, 0.125],
     "query_id": "q", "session_id": "s", "experiment": "e", "arm": "a"},
    {"type": "ranking", "request_id": "r3", "ts": T0 + 3, "items": ["d1", "d2"], "unit_id": "u",
     "attributes": {"platform": "ios", "locale": "en-GB"}},
    {"type": "ranking", "request_id": "r4", "ts": T0 + 4, "items": ["d1", "d2"], "query_id": "查询", "session_id": "sé",
     "arm": "bête", "attributes": {"langue": "français"}},
    {"type": "ranking", "request_id": "r2", "ts": T0, "items": ["d1", "dé"], "teams": ["a", "b"],
     "subtopics": [["x"], []], "unit_id": "u", "extra": {"k": [1, 2]}},
    {"type": "judgment", "experiment": "e", "query_id": "q", "verdict": "good", "ts": "2026-01-01T00:05:00Z"},
    {"type": "watermark", "ts": T0 + 100},
    {"type": "watermark", "end": True},
]
SEED_PAIRS = [[(key.encode(), json.dumps(value, ensure_ascii=False).encode()) for key, value in seed.items()]
              for seed in SEEDS]
KEYS = sorted({key for pairs in SEED_PAIRS for key, _ in pairs})

MEGABYTE = b'"' + b"x" * 1_000_000 + b'"'
NOT_UTF8 = [b"\xff", b"\xfe", b"\xc3(", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80",
            b"\xf0\x9f\x98"]
#: Values of every JSON type and of every sort a hostile producer may send, by sort.
HOSTILE = {
    "types": [b"null", b"true", b"false", b"0", b"-1", b"1.5", b'""', b'"x"', b"[]", b"[1]", b'["a"]', b"[null]",
              b"[[]]", b'[["x"]]', b"{}", b'{"a":1}'],
    "numbers": [b"-0", b"-0.0", b"2", b"1e400", b"-1e400", b"1e-400", b"1E5", b"NaN", b"Infinity", b"-Infinity",
                b"nan", b"1" * 400, b"9" * 400 + b".5", b"0." + b"1" * 30, b"01", b"1.", b"17672256000000000000",
                b"1767225600.123456789", b"1767225600.5e0"],
    "strings": [b'"\\u0000"', b'"\\ud800"', b'"\\"', b'"\\u00e9"', b'"2026-01-01T00:00:00Z"', b'"2026-01-01T00:00:00"',
                b'"9999-12-31T23:59:59-23:59"', b'"0001-01-01T00:00:00+01:00"', b'"\t"', b'"\x00"'],
    "large": [MEGABYTE, b"[" * 3000 + b"]" * 3000, b'{"x":' * 2000 + b"1" + b"}" * 2000, b"[" * 100 + b"]" * 100,
              b'{"a":1,"a":2}', b'["a","a"]', b"[" + b",".join([b'"i"'] * 2000) + b"]"],
    "not_utf8": [b'"a' + bad + b'"' for bad in NOT_UTF8],
    "objects": [b'{"a":"b"}', b'{"a":"b","a":"c"}', b'{"a":"\xc3\xa9"}', b'{ "a" : "b" }', b'{"a":"b",}',
                b'{"a":"\\u0062"}', b'{"":""}', b'{"a":"b","c":null}', b'{"a":"b"}}'],
}
#: Numbers a time or a grade may be.
NUMBERS = [b"1767225601", b"1767225601.25", b"1767225601.0000000000001", b"1.7672256e9", b"3", b"0", b"0.5", b"-0.0"]
#: Values of an unknown field that leave the event as it was (a nested object may repeat its keys).
BENIGN = [b'"y"', b"[1,2]", b'{"a":1,"a":2}', b'"\xc3\xa9"', b'["\xc3\xa9","\\u00e9"]', b"null", b'{"item":"z"}',
          b"1e5", b'"\\"item\\":1"']
#: What may be written into a line at any place, byte for byte.
TOKENS = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"\x00", b" ", b"\r", b"\t", b"null", b"NaN", b"\xff"]


def escaped(key: bytes) -> bytes:
    """The same key with its first character written as a JSON escape."""
    return b"\\u%04x" % key[0] + key[1:] if key else b"\\u0000"


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    return draw(st.sampled_from(HOSTILE[draw(st.sampled_from(sorted(HOSTILE)))]))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid event line mutated one to three times, field by field, then perhaps byte by byte."""
    pairs = list(draw(st.sampled_from(SEED_PAIRS)))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["value", "value", "number", "number", "new", "benign", "benign", "swap", "twice",
                                    "twice_escaped", "drop", "not_utf8", "attributes", "scores"]))
        at = draw(st.integers(0, len(pairs) - 1)) if pairs else 0
        if how == "value" and pairs:  # the wrong type, or a hostile value, in a known field
            pairs[at] = (pairs[at][0], draw(hostile()))
        elif how == "new":  # an unknown field, with any value
            pairs.insert(at, (draw(st.sampled_from([b"x", b"note", b"", b"Type"])), draw(hostile())))
        elif how == "number":  # a time or a grade in every form of JSON number, and a few that are not
            key = draw(st.sampled_from([b"ts", b"grade"]))
            pairs = [pair for pair in pairs if pair[0] != key]
            pairs.insert(min(at, len(pairs)), (key, draw(st.sampled_from(HOSTILE["numbers"] + NUMBERS))))
        elif how == "benign":  # an unknown field with a value that changes nothing
            pairs.insert(at, (draw(st.sampled_from([b"x", b"note", b"\xc3\xa9"])), draw(st.sampled_from(BENIGN))))
        elif how == "swap" and pairs:
            other = draw(st.integers(0, len(pairs) - 1))
            pairs[at], pairs[other] = pairs[other], pairs[at]
        elif how.startswith("twice") and pairs:  # a key again, known or not, with its value or another
            key, value = pairs[draw(st.integers(0, len(pairs) - 1))]
            if draw(st.booleans()):
                value = draw(st.sampled_from(HOSTILE["types"]))
            pairs.insert(at, (escaped(key) if how == "twice_escaped" else key, value))
        elif how == "drop" and pairs:
            del pairs[at]
        elif how == "scores":  # a ranking's scores in every form of JSON number, and a few that are not
            pairs = [pair for pair in pairs if pair[0] != b"scores"]
            numbers = draw(st.lists(st.sampled_from(HOSTILE["numbers"] + NUMBERS + [b"1.5e-05", b"0.9387000008474338"]),
                                    min_size=0, max_size=4))
            pairs.insert(min(at, len(pairs)), (b"scores", b"[" + b",".join(numbers) + b"]"))
        elif how == "attributes":  # a ranking's attributes (which the compiled reader reads) of every shape
            pairs = [pair for pair in pairs if pair[0] != b"attributes"]
            pairs.insert(min(at, len(pairs)), (b"attributes", draw(st.sampled_from(HOSTILE["objects"]
                                                                                    + HOSTILE["types"]))))
        elif how == "not_utf8" and pairs:  # bytes that are not UTF-8 in a key, or inside a string value
            bad = draw(st.sampled_from(NOT_UTF8))
            key, value = pairs[at]
            quote = value.find(b'"', 1)
            if draw(st.booleans()) or quote < 0:
                pairs.insert(at, (b"x" + bad, b"1"))
            else:
                pairs[at] = (key, value[:quote] + bad + value[quote:])
    comma, colon = draw(st.sampled_from([(b",", b":"), (b", ", b": "), (b" ,\t", b" : ")]))
    line = b"{" + comma.join(b'"' + key + b'"' + colon + value for key, value in pairs) + b"}"
    bytewise = draw(st.sampled_from(["none", "none", "none", "flip", "cut", "insert"]))
    if bytewise != "none":
        at = draw(st.integers(0, len(line)))
        if bytewise == "flip" and at < len(line):
            line = line[:at] + bytes([draw(st.integers(0, 255))]) + line[at + 1 :]
        elif bytewise == "cut":
            line = line[:at]
        else:
            line = line[:at] + draw(st.sampled_from(TOKENS)) + line[at:]
    return line


def good(seed: int) -> bytes:
    return b"{" + b",".join(b'"' + key + b'":' + value for key, value in SEED_PAIRS[seed]) + b"}"


CONFIGS = [Config(kinds=(("purchase", 3.0),)), Config()]


def comparable(events: list[Any]) -> list[Any]:
    """Events with each ranking in compact form, its items and scores as lists (scores are kept as the JSON text
    read, or written again: two texts of the same numbers)."""
    events = [CompactRanking.of(e) if type(e) is Ranking else e for e in events]
    return [(item_list(e.items), score_list(e.scores), msgspec.structs.replace(e, items="", scores=None))
            if type(e) is CompactRanking else e for e in events]


def codes(events: list[Any]) -> list[str | None]:
    return [e.code if type(e) is Invalid else None for e in events]


@pytest.mark.slow
@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.one_of(mutated(), st.sampled_from(range(len(SEEDS))).map(good)), min_size=1, max_size=8),
       st.sampled_from(CONFIGS))
def test_every_decoder_gives_each_mutated_line_the_same_event_or_reason(lines: list[bytes], config: Config) -> None:
    """The compiled line reader and msgspec alone (whole chunk, line by line) give each line the same event, or
    the same invalid reason, with its line number and its bytes."""
    chunk = b"\n".join(lines) + b"\n"
    columns = comparable(decode_chunk_columns(chunk, config, 5, "f").as_list())
    numbered = [(5 + k, line) for k, line in enumerate(chunk.split(b"\n")) if line.strip()]
    one_by_one = comparable([decode_line(line, config, f"f:{number}") for number, line in numbered])
    assert codes(columns) == codes(one_by_one)
    assert columns == one_by_one
    assert columns == comparable(decode_chunk_compact(chunk, config, 5, "f"))
    assert columns == comparable(decode_chunk(chunk, config, 5, "f"))
    for event, (_, line) in zip(one_by_one, numbered, strict=True):
        if type(event) is Invalid:
            assert event.reason and event.raw == line  # dead-lettered as it came
        else:
            assert not set(line) & NEVER_UTF8, f"accepted {line[:200]!r}"


TOPIC = {"ranking": "ranking", "feedback": "feedback", "judgment": "judgment", "watermark": "feedback"}


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.one_of(mutated(), st.sampled_from(range(len(SEEDS))).map(good), st.none()), min_size=1,
                max_size=40),
       st.sampled_from(["ranking", "feedback", "judgment"]))
def test_the_worker_decoder_never_raises_and_gives_every_bad_message_a_reason(values: list[bytes | None],
                                                                             kind: str) -> None:
    """A fetched batch of mutated messages: each is an event or an Invalid with a code, a reason and its bytes (for
    the dead-letter topic), the batch decodes as its messages one by one, and the codes for bytes that are not
    UTF-8 and for a key twice are those of the files."""
    config = CONFIGS[0]
    where = [f"p@{k}" for k in range(len(values))]
    events = decode_messages(values, kind, config, [T0 + 0.5] * len(values), where)
    assert events == [decode_message(v, kind, config, T0 + 0.5, w) for v, w in zip(values, where, strict=True)]
    for event, value, place in zip(events, values, where, strict=True):
        if type(event) is Invalid:
            assert event.code and event.reason and event.where == place and event.raw == (value or b"")
            continue
        assert value is not None
        file_code = codes([decode_line(value, config)])[0]
        assert file_code not in {"bad_utf8", "duplicate_key", "bad_json", "too_deep"}, (value[:200], file_code)
        assert not set(value) & NEVER_UTF8, f"accepted {value[:200]!r}"
    for event, value in zip(events, values, strict=True):
        if value is not None and codes([decode_line(value, config)])[0] in {"bad_utf8", "duplicate_key"}:
            assert type(event) is Invalid and event.code == decode_line(value, config).code  # type: ignore[union-attr]


def _without_ts(value: bytes) -> bytes:
    """A message with its ``ts`` left out (the Kafka timestamp stands in for it), when it has a simple one."""
    return re.sub(rb',\s*"ts"\s*:\s*[-0-9.eE+]+', b"", value, count=1)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.one_of(mutated(), st.sampled_from(range(len(SEEDS))).map(good),
                          st.sampled_from(range(len(SEEDS))).map(good).map(_without_ts), st.none(),
                          st.sampled_from([b"", b"  ", b'{"type": "feedback",\n "request_id": "r", "item": "a"}'])),
                min_size=1, max_size=40),
       st.sampled_from(["ranking", "feedback", "judgment"]), st.sampled_from([math.inf, T0 + 1.0, T0 - 1e6]))
def test_the_worker_reads_a_batch_as_lines_with_the_events_of_its_messages(
        values: list[bytes | None], kind: str, not_after: float) -> None:
    """The worker's batch read by the compiled line reader (feedback in columns) holds the events that decoding each
    message gives: same types, fields, reasons, places and bytes, Kafka timestamps and future times included."""
    config = CONFIGS[0]
    where = [f"p@{k}" for k in range(len(values))]
    stamps = [T0 + 0.5 + k for k in range(len(values))]
    chunk = decode_message_chunk(values, kind, config, stamps, where, not_after)
    expected = decode_messages(values, kind, config, stamps, where, not_after)
    assert len(chunk) == len(values)
    assert comparable(chunk.as_list()) == comparable(expected)


#: Bytes that UTF-8 never has.
NEVER_UTF8 = {0xC0, 0xC1, *range(0xF5, 0x100)}


def _log(requests: int, seed: int) -> list[bytes]:
    sim = SimulationConfig(requests=requests, seed=seed, judgments=True, interleaving=True, label_rate=0.3,
                           duplicate_fraction=0.05, orphan_fraction=0.03, invalid_fraction=0.02)
    return [line.rstrip(b"\n") for line in simulate_lines(sim)]


GOOD = _log(300, seed=11)


def _report(lines: list[bytes], path: Path) -> dict[str, Any]:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return replay([str(path)], Config()).report()


@cache
def _good_report(directory: str) -> dict[str, Any]:
    return _report(GOOD, Path(directory) / "good.jsonl")


def _garbage(line: bytes) -> bool:
    """One invalid line (no newline in it, not blank, not the start of a gzip file)."""
    return (b"\n" not in line and bool(line.strip()) and not line.startswith(b"\x1f")
            and type(decode_line(line, Config())) is Invalid)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(st.integers(0, len(GOOD)), mutated().filter(_garbage)), min_size=1, max_size=10))
def test_garbage_anywhere_leaves_the_report_of_the_good_lines(tmp_path_factory: pytest.TempPathFactory,
                                                              inserted: list[tuple[int, bytes]]) -> None:
    """Good lines with garbage inserted anywhere give the report of the good lines alone, but for the count of
    invalid events."""
    directory = tmp_path_factory.mktemp("fuzz")
    lines = list(GOOD)
    for at, line in sorted(inserted, key=lambda pair: pair[0], reverse=True):
        lines.insert(at, line)
    want = json.loads(json.dumps(_good_report(str(tmp_path_factory.getbasetemp()))))
    got = _report(lines, directory / "garbage.jsonl")
    assert got["events"].pop("invalid") == want["events"].pop("invalid") + len(inserted)
    assert got == want


# -- the two holes closed: a key twice, and bytes that are not UTF-8 in a value msgspec skips ------------------

FEEDBACK = b'"type":"feedback","request_id":"r1","item":"d1","ts":1767225601'
DUPLICATES = [
    b"{" + FEEDBACK + b',"item":"d2"}',  # a known key twice: msgspec kept the last
    b"{" + FEEDBACK + b',"x":1,"x":2}',  # an unknown key twice (the compiled reader took it)
    b"{" + FEEDBACK + b',"\\u0069tem":"d2"}',  # the same key, written with an escape
    b'{"ts":1767225601,"ts":5,"type":"feedback","request_id":"r1","item":"d1"}',  # (was ts_out_of_range)
    b"{" + FEEDBACK + b"," + b",".join(b'"k%d":%d' % (k, k) for k in range(40)) + b',"k3":0}',  # among many keys
    b'{"type":"ranking","request_id":"r9","ts":1767225600,"items":["a"],"arm":"x","arm":"y"}',
    b'{"type":"judgment","experiment":"e","query_id":"q","verdict":"good","verdict":"bad","ts":1767225600}',
]
BAD_UTF8 = [
    b"{" + FEEDBACK + b',"x":"\xff"}',  # an unknown field's value: msgspec skipped it unread
    b"{" + FEEDBACK + b',"x\xc3(":1}',  # an unknown key
    b"{" + FEEDBACK + b',"x":["ok","\xed\xa0\x80"]}',  # a surrogate, inside an array
    b'{"type":"ranking","request_id":"r9","ts":1767225600,"items":["a"],"x":{"y":"\xf4\x90\x80\x80"}}',
]
NOT_DUPLICATES = [  # the same key in nested objects, or as a value, is not a key twice
    b"{" + FEEDBACK + b',"x":{"item":1,"y":{"item":2}}}',
    b"{" + FEEDBACK + b',"x":["item","item"],"kind":"click"}',
    b"{" + FEEDBACK + b',"x":"\\"item\\":1"}',
    b"{" + FEEDBACK + b',"\\u0078":1,"y":2}',  # a key written with an escape, once
    b"{" + FEEDBACK + b"," + b",".join(b'"k%d":%d' % (k, k) for k in range(40)) + b"}",  # many keys, each once
]


def _decoded_by_every_path(line: bytes, config: Config) -> list[Any]:
    chunk = b"\n".join([good(0), line, good(3)]) + b"\n"
    paths: list[list[Any]] = [
        decode_chunk_columns(chunk, config, 1, "f").as_list(), decode_chunk_compact(chunk, config, 1, "f"),
        decode_chunk(chunk, config, 1, "f"),
        [decode_line(x, config, f"f:{k + 1}") for k, x in enumerate(chunk.split(b"\n")[:3])]]
    return [events[1] for events in paths]


@pytest.mark.parametrize(("line", "code"), [*((x, "duplicate_key") for x in DUPLICATES),
                                            *((x, "bad_utf8") for x in BAD_UTF8)])
def test_a_key_twice_and_bytes_not_utf8_are_invalid_in_every_decoder(line: bytes, code: str) -> None:
    config = Config()
    for event in _decoded_by_every_path(line, config):
        assert type(event) is Invalid and (event.code, event.where, event.raw) == (code, "f:2", line), event
    kind = json.loads(line.decode("utf-8", "replace"))["type"]
    value = line.replace(b'"type":"%s",' % kind.encode(), b"")
    events = decode_messages([good(0) if kind == "feedback" else None, value, value], kind, config, [T0] * 3,
                             ["a", "b", "c"])
    assert [(e.code, e.raw) for e in events[1:]] == [(code, value)] * 2  # type: ignore[union-attr]
    if code == "duplicate_key" and b"\\u" not in line and b"k3" not in line:
        assert "appears more than once" in events[1].reason  # type: ignore[union-attr]


@pytest.mark.parametrize("line", NOT_DUPLICATES)
def test_nested_or_quoted_keys_are_not_a_key_twice(line: bytes) -> None:
    assert all(type(event) is not Invalid for event in _decoded_by_every_path(line, Config()))


def test_a_grade_too_large_for_a_double_is_invalid_in_every_decoder() -> None:
    """A decimal of hundreds of digits: msgspec says out of range; the compiled reader, which parses long decimals
    with ``float``, got infinity and took it (found by the differential property)."""
    line = b"{" + FEEDBACK + b',"kind":"label","grade":' + b"9" * 400 + b".5}"
    assert {(e.code, e.reason) for e in _decoded_by_every_path(line, Config())} == {
        ("bad_grade", "grade: number out of range")}


@pytest.mark.slow
def test_the_replay_command_counts_them_by_reason_and_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"\n".join([*GOOD[:40], *DUPLICATES, *GOOD[40:100], *BAD_UTF8, *GOOD[100:]]) + b"\n")
    done = subprocess.run([sys.executable, "-m", "stream_eval.cli", "replay", str(path), "--format", "json"],
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    stderr = done.stderr.decode()
    assert f"feedback: duplicate_key x{sum(b'feedback' in x for x in DUPLICATES)}" in stderr
    assert f"feedback: bad_utf8 x{sum(b'feedback' in x for x in BAD_UTF8)}" in stderr
    assert "ranking: duplicate_key x1" in stderr and "judgment: duplicate_key x1" in stderr
    assert f"{path}:41: feedback: 'item': the key appears more than once" in stderr
    got = json.loads(done.stdout)
    want = _report(GOOD, tmp_path / "good.jsonl")
    assert got["events"].pop("invalid") == want["events"].pop("invalid") + len(DUPLICATES) + len(BAD_UTF8)
    assert got["events"] == want["events"] and got["overall"] == want["overall"] and got["groups"] == want["groups"]
