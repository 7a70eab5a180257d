"""Poisoned input: deeply nested JSON, times no real log has, a key twice and bytes that are not UTF-8 are invalid with
their reason, in every decoder, in replay and in the worker, and never change the numbers of the good events
(tests/test_fuzz.py fuzzes the same)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import stages_done

from stream_eval.config import MAX_TS, MIN_TS, Config, ConfigError, load_config
from stream_eval.engine.replay import replay
from stream_eval.events import schema
from stream_eval.events.messages import decode_messages
from stream_eval.events.scan import MAX_DEPTH
from stream_eval.simulate import SimulationConfig, simulate_lines

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
DEEP = (b'{"type":"ranking","request_id":"deep","ts":1767225600,"items":["a"],"x":' + b"[" * 10_000 + b"]" * 10_000
        + b"}")
DEEP_OBJECTS = b'{"x":' * 20_000 + b"1" + b"}" * 20_000
HUGE_TS = b'{"type":"ranking","request_id":"huge","ts":1e300,"items":["a","b"]}'
HUGE_FEEDBACK = b'{"type":"feedback","request_id":"huge","item":"a","ts":1e300}'
FAR_TS = b'{"type":"ranking","request_id":"far","ts":99999999999,"items":["a"]}'
OLD_TS = b'{"type":"feedback","request_id":"old","item":"a","ts":5}'
ISO_FAR = b'{"type":"judgment","experiment":"e","query_id":"q","verdict":"good","ts":"2150-01-01T00:00:00Z"}'
WATERMARK_FAR = b'{"type":"watermark","ts":1e300}'
TWICE = b'{"type":"feedback","request_id":"twice","item":"a","item":"b","ts":1767225600}'  # msgspec kept "b"
NOT_UTF8 = b'{"type":"ranking","request_id":"bytes","ts":1767225600,"items":["a"],"note":"\xff"}'  # skipped unread
#: A plain ranking but for its 300 KB request id: its request-metrics record (the id as key and in the value) would
#: pass Kafka's 1 MiB a message; the compiled reader would read it.
LONG_ID = b'{"type":"ranking","request_id":"' + b"r" * 300_000 + b'","ts":1767225600,"items":["a"]}'
POISON = [DEEP, DEEP_OBJECTS, HUGE_TS, HUGE_FEEDBACK, FAR_TS, OLD_TS, ISO_FAR, TWICE, NOT_UTF8, LONG_ID, WATERMARK_FAR]
CODES = ["too_deep", "too_deep", "ts_out_of_range", "ts_out_of_range", "ts_out_of_range", "ts_out_of_range",
         "ts_out_of_range", "duplicate_key", "bad_utf8", "too_large", "ts_out_of_range"]


def _code(event: Any) -> str | None:
    return event.code if type(event) is schema.Invalid else None


@pytest.mark.parametrize("decode", ["line", "chunk", "compact", "columns"])
def test_every_line_decoder_rejects_poison_with_its_reason(decode: str) -> None:
    config = Config()
    good = b'{"type":"ranking","request_id":"ok","ts":1767225600,"items":["a"]}'
    lines = [good, *POISON, good.replace(b'"ok"', b'"ok2"')]
    chunk = b"\n".join(lines) + b"\n"
    if decode == "line":
        events: list[Any] = [schema.decode_line(line, config) for line in lines]
    elif decode == "chunk":
        events = schema.decode_chunk(chunk, config)
    elif decode == "compact":
        events = schema.decode_chunk_compact(chunk, config)
    else:
        events = schema.decode_chunk_columns(chunk, config).as_list()
    assert [_code(e) for e in events] == [None, *CODES, None]
    assert [e.request_id for e in (events[0], events[-1])] == ["ok", "ok2"]
    assert all(e.raw == line for e, line in zip(events[1:-1], POISON, strict=True))  # dead-lettered as they came
    assert "2100-01-01T00:00:00Z" in events[3].reason and "1e+300" in events[3].reason


def _nested(depth: int, inner: bytes = b"1") -> bytes:
    return b'{"type":"feedback","request_id":"r","item":"a","ts":1767225600,"x":' + b"[" * (depth - 1) + inner + \
        b"]" * (depth - 1) + b"}"


def _on_a_deep_stack(levels: int, call: Any) -> Any:
    return call() if levels == 0 else _on_a_deep_stack(levels - 1, call)


@pytest.mark.parametrize("stack", [0, 300])
def test_nesting_is_too_deep_past_the_same_depth_in_every_decoder_and_at_any_stack_depth(stack: int) -> None:
    """Past :data:`scan.MAX_DEPTH` levels a line is ``too_deep`` even where it is broken JSON inside (msgspec's
    RecursionError depends on how deep the caller's stack is: a check by it gave bad_json in one decoder and
    too_deep in another); at that depth it is read."""
    config = Config()
    lines = [_nested(MAX_DEPTH), _nested(MAX_DEPTH + 1), _nested(MAX_DEPTH, b"\x00"), _nested(MAX_DEPTH + 1, b"\x00"),
             _nested(900, b"\x00"), DEEP]
    chunk = b"\n".join(lines) + b"\n"
    expected = [None, "too_deep", "bad_json", "too_deep", "too_deep", "too_deep"]
    decoders = {"line": lambda: [schema.decode_line(line, config) for line in lines],
                "chunk": lambda: schema.decode_chunk(chunk, config),
                "compact": lambda: schema.decode_chunk_compact(chunk, config),
                "columns": lambda: schema.decode_chunk_columns(chunk, config).as_list(),
                "messages": lambda: decode_messages(lines, "feedback", config, [T0] * len(lines),
                                                    [str(k) for k in range(len(lines))])}
    for name, decode in decoders.items():
        assert [_code(e) for e in _on_a_deep_stack(stack, decode)] == expected, name


def test_the_compiled_reader_checks_times_it_reads_itself() -> None:
    """Plain feedback and rankings are read by compiled code; a time out of range there still goes to the
    validator (read exactly: inexact decimals are parsed by float, then checked)."""
    config = Config(min_ts=T0, max_ts=T0 + 100)
    lines = [b'{"type":"feedback","request_id":"r","item":"a","ts":%s}' % t for t in
             (b"1767225650", b"1767225700.0000000000001", b"1767225700.5", b"1767225599.999999", b"1767225600")]
    events = schema.decode_chunk_columns(b"\n".join(lines) + b"\n", config).as_list()
    assert [_code(e) for e in events] == [None, None, "ts_out_of_range", "ts_out_of_range", None]
    assert [e.ts for e in events if _code(e) is None] == [T0 + 50, 1767225700.0000000000001, T0]


def test_time_bounds_are_settings() -> None:
    assert (Config().min_ts, Config().max_ts) == (MIN_TS, MAX_TS)
    config = load_config(overrides={"min_ts": "1970-01-01T00:00:00Z", "max_ts": "3000-01-01T00:00:00+00:00"},
                         environ={})
    assert config.min_ts == 0.0 and config.max_ts == 32503680000.0
    assert load_config(environ={"STREAM_EVAL_MAX_TS": "5000000000"}).max_ts == 5e9
    assert schema.decode_line(FAR_TS, config).code == "ts_out_of_range"  # type: ignore[union-attr]
    assert type(schema.decode_line(OLD_TS, config)) is schema.Feedback
    with pytest.raises(ConfigError, match="min_ts"):
        Config(min_ts=10.0, max_ts=5.0)
    with pytest.raises(ConfigError, match="years 1 to 9999"):  # (the reasons name the bounds as dates)
        load_config(overrides={"min_ts": -1e11}, environ={})
    assert load_config(overrides={"min_ts": "0001-01-01T00:00:00Z"}, environ={}).min_ts == -62_135_596_800.0
    with pytest.raises(ConfigError, match="UTC offset"):
        load_config(overrides={"max_ts": "2030-01-01T00:00:00"}, environ={})


@pytest.mark.parametrize("kind", ["ranking", "feedback", "judgment"])
def test_message_decoder_survives_poison_in_a_batch(kind: str) -> None:
    """A fetched batch with poison inside: the batch decode fails, its halves are decoded, down to the message."""
    config = Config()
    good = {
        "ranking": b'{"request_id":"r%d","ts":1767225600,"items":["a"]}',
        "feedback": b'{"request_id":"r%d","item":"a","ts":1767225600}',
        "judgment": b'{"experiment":"e","query_id":"q%d","verdict":"same","ts":1767225600}',
    }[kind]
    values: list[bytes | None] = [good % k for k in range(100)]
    values[37] = DEEP_OBJECTS
    values[38] = good.replace(b"1767225600", b"1e300") % 38
    values[90] = good.replace(b"1767225600", b"4000000000") % 90  # in range, but in the future
    now = 3_999_999_000.0
    events = decode_messages(values, kind, config, [now] * 100, [f"@{k}" for k in range(100)],
                             not_after=now + config.max_clock_skew)
    codes = {k: _code(e) for k, e in enumerate(events) if _code(e)}
    assert codes == {37: "too_deep", 38: "ts_out_of_range", 90: "future_ts"}
    assert events[90].raw == values[90] and events[90].where == "@90"  # type: ignore[union-attr]
    assert decode_messages(values[89:91], kind, config, [now] * 2, ["a", "b"])[1].ts == 4e9  # type: ignore[union-attr]


def test_a_message_without_ts_takes_its_kafka_time_and_is_checked_too() -> None:
    config = Config()
    value = b'{"request_id":"r","item":"a"}'
    assert decode_messages([value], "feedback", config, [T0 + 1.5], ["w"])[0].ts == T0 + 1.5  # type: ignore[union-attr]
    assert _code(decode_messages([value], "feedback", config, [-0.001], ["w"])[0]) == "ts_out_of_range"


def _log(requests: int, seed: int) -> list[bytes]:
    sim = SimulationConfig(requests=requests, seed=seed, judgments=True, interleaving=True, label_rate=0.3,
                           duplicate_fraction=0.05, orphan_fraction=0.03, invalid_fraction=0.02)
    return list(simulate_lines(sim))


def _report(lines: list[bytes], path: Path) -> dict[str, Any]:
    path.write_bytes(b"".join(line.rstrip(b"\n") + b"\n" for line in lines))
    return replay([str(path)], Config()).report()


GOOD = _log(600, seed=5)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, len(GOOD)), st.sampled_from(POISON)), min_size=1, max_size=12))
def test_poison_anywhere_leaves_the_good_events_numbers(tmp_path: Path, inserted: list[tuple[int, bytes]]) -> None:
    """Good lines with poison inserted anywhere give the report of the good lines alone, but for the count of
    invalid events (a far-future time would otherwise finalise every open request at once)."""
    lines = list(GOOD)
    for at, line in sorted(inserted, reverse=True):
        lines.insert(at, line)
    want, got = _report(GOOD, tmp_path / "good.jsonl"), _report(lines, tmp_path / "poisoned.jsonl")
    assert got["events"].pop("invalid") == want["events"].pop("invalid") + len(inserted)
    assert got == want


@pytest.mark.slow
def test_replay_cli_reports_poison_and_goes_on(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "log.jsonl"
    path.write_bytes(b"\n".join([*GOOD[:50], DEEP, HUGE_TS, *GOOD[50:]]) + b"\n")
    done = subprocess.run([sys.executable, "-m", "stream_eval.cli", "replay", str(path), "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "JSON nested too deeply" in done.stderr and "outside the event times" in done.stderr
    assert json.loads(done.stdout)["overall"]["requests"] > 0


def test_worker_survives_poison_and_dead_letters_it(broker: str, tmp_path: Path) -> None:
    """Deeply nested JSON, times out of range, messages too large (one of 2 MB) and a producer clock an hour ahead,
    on every input topic: the worker dead-letters each with its code (a large one cut to ``MAX_EVENT_BYTES``, with
    its size in a header), never stops, and its numbers are those of the good lines."""
    from support import read_topic
    from test_stream import _running, _stop, _until

    from stream_eval.events.scan import MAX_EVENT_BYTES
    from stream_eval.stream.kafka import ensure_topics, topics
    from stream_eval.stream.produce import send_lines
    from stream_eval.stream.settings import WorkerSettings
    from stream_eval.stream.worker import StreamWorker

    future = time.time() + 3600
    poison = [*POISON[:-1],
              b'{"type":"ranking","request_id":"soon","ts":%r,"items":["a"]}' % future,
              b'{"type":"feedback","request_id":"r1","item":"a","ts":%r}' % future,
              b'{"type":"feedback","request_id":"big","item":"a","x":"' + b"y" * 2_000_000 + b'"}']
    codes = sorted([*CODES[:-1], "future_ts", "future_ts", "too_large"])
    lines = list(GOOD)
    rng = random.Random(3)
    for line in poison:
        lines.insert(rng.randrange(len(lines)), line + b"\n")
    want = _report(GOOD, tmp_path / "good.jsonl")
    prefix = "poison."
    worker = StreamWorker(WorkerSettings([broker], prefix=prefix, group="poison", partitions=2), Config())

    async def main() -> None:
        # Apache Kafka refuses a message over 1 MB (message.max.bytes); one may reach the worker where a topic
        # allows more (max.message.bytes): so these do (Tansu takes it whatever the setting)
        large = {name: {"max.message.bytes": str(4 << 20)} for name in topics(prefix).inputs}
        await ensure_topics([broker], topics(prefix).inputs, 2, configs=large)
        await send_lines(lines, [broker], topics(prefix), partitions=2)
        running = await _running(worker)
        await _until(lambda: worker.partitioned.watermark == float("inf") and stages_done([worker]), 120,
                     "the end of every partition")
        assert not running[0].done()
        got.update(worker.totals().report())  # the live worker's (a stopped one hands every share over)
        await _stop(running)
        invalid = want["events"]["invalid"] + len(poison)
        dead = await read_topic(broker, topics(prefix).dead_letters, invalid)
        cut = {line[:MAX_EVENT_BYTES]: str(len(line)).encode() for line in poison if len(line) > MAX_EVENT_BYTES}
        whole = {p.strip() for p in poison}
        by_code = sorted(dict(r.headers)["code"].decode() for r in dead if r.value.strip() in whole
                         or (r.value in cut and cut[r.value] == dict(r.headers)["truncated"]))
        assert len(cut) == 2 and by_code == codes
        assert len(dead) == invalid

    got: dict[str, Any] = {}
    asyncio.run(main())
    assert got["events"].pop("invalid") == want["events"].pop("invalid") + len(poison)
    from support import approx

    for section in ("events", "overall", "groups", "gsb", "ab"):
        assert got[section] == approx(want[section]), section
