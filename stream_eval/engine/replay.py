"""Offline replay of JSON Lines files through the engine: the same code path as the streaming worker."""

from __future__ import annotations

import gc
import gzip
import io
import math
import os
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any, BinaryIO

from stream_eval.config import Config
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.events.schema import Chunk, count_lines, decode_chunk_columns, is_json

#: Bytes read at a time: the size that replayed the benchmark file fastest for a few MB more peak RSS; a larger
#: one gained little more and its peak grew with the file (docs/benchmarks.md, "Facts moved from code comments").
CHUNK_BYTES = 2 << 20
Progress = Callable[[int, int], None]


@contextmanager
def _open(path: str) -> Iterator[BinaryIO]:
    if path == "-":
        stdin = sys.stdin.buffer
        peek = getattr(stdin, "peek", None)
        if peek is not None and peek(2)[:2] == b"\x1f\x8b":  # gzip piped in
            with gzip.GzipFile(fileobj=stdin) as unzipped:
                yield unzipped  # type: ignore[misc]  # GzipFile is a binary stream
        else:
            yield stdin
        return
    with open(path, "rb") as raw:
        if raw.read(2) == b"\x1f\x8b":
            raw.seek(0)
            with gzip.GzipFile(fileobj=raw) as unzipped:
                yield unzipped  # type: ignore[misc]  # GzipFile is a binary stream
        else:
            raw.seek(0)
            yield raw


def first_bytes(path: str, size: int) -> bytes:
    """The first ``size`` bytes of an input as replay reads it (gzip undone); none of standard input (not to be
    consumed), of Parquet, or of a file that cannot be read."""
    if path == "-" or is_parquet(path) or not os.path.isfile(path):
        return b""
    with suppress(*_BROKEN), _open(path) as stream:
        return stream.read(size)
    return b""


def read_chunks(path: str, chunk_bytes: int = CHUNK_BYTES,
                damaged: list[str] | None = None) -> Iterator[tuple[bytes, int, int]]:
    """Complete lines of ``path`` in chunks: ``(chunk, number of its first line, compressed bytes read)``.

    With ``damaged``, a file that cannot be read to its end (gzip cut short or corrupt, an I/O error) ends where
    it breaks: its complete lines before are given, the text after the last line end (a line cut where the file
    broke) is left out, and the reason is added to ``damaged``.

    A UTF-8 byte order mark at the start (what some Windows tools write before UTF-8 text) is left out: JSON text
    has none, and RFC 8259 lets a reader ignore it."""
    with _open(path) as stream:
        raw = getattr(stream, "fileobj", stream)
        rest = b""
        line = 1
        blocks = _blocks(stream, chunk_bytes)
        first = True
        while True:
            try:
                block = next(blocks, b"")
            except _BROKEN as error:
                if damaged is None:
                    raise
                where, reason = "stdin" if path == "-" else path, str(error) or type(error).__name__
                read = line - 1 + count_lines(rest)
                partial = rest[rest.rfind(b"\n") + 1:]
                left = ""
                if partial.strip() and not is_json(partial):  # (a last line without its line end may be whole)
                    left = f" (and {len(partial):,} bytes of line {read + 1}, cut there, left out)"
                    rest = rest[: len(rest) - len(partial)]
                damaged.append(f"{where}: {reason} after line {read}; the events before were read{left}")
                break
            if not block:
                break
            if first:
                first = False
                block = block.removeprefix(BOM)
            cut = block.rfind(b"\n") + 1
            if cut == 0:  # no line ends in this block
                rest += block
                continue
            # the lines that end in this block, copied once
            chunk = b"".join((rest, memoryview(block)[:cut])) if cut < len(block) or rest else block
            rest = block[cut:]
            yield chunk, line, _tell(raw)
            line += count_lines(chunk)
        if rest.strip():
            yield rest, line, _tell(raw)


#: The UTF-8 byte order mark.
BOM = b"\xef\xbb\xbf"
#: What reading a damaged or cut input raises (gzip: BadGzipFile is an OSError, a cut stream EOFError).
_BROKEN = (EOFError, OSError, zlib.error)


def _blocks(stream: BinaryIO, size: int) -> Iterator[bytes]:
    """``stream`` in blocks of ``size`` bytes (the last may be shorter). A gzip stream is read a piece at a time,
    so that when it breaks, what it gave before is yielded before the error is raised."""
    if not isinstance(stream, gzip.GzipFile):
        while block := stream.read(size):
            yield block
        return
    parts: list[bytes] = []
    got = 0
    try:
        while part := stream.read1(size - got):
            parts.append(part)
            got += len(part)
            if got >= size:
                yield b"".join(parts)
                parts, got = [], 0
    except _BROKEN:
        if parts:
            yield b"".join(parts)
        raise
    if parts:
        yield b"".join(parts)


def _tell(stream: object) -> int:
    try:
        return int(stream.tell())  # type: ignore[attr-defined]  # file objects; stdin may not seek
    except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
        return 0


def total_size(paths: Sequence[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if p != "-" and os.path.exists(p))


@contextmanager
def _quiet_gc() -> Iterator[None]:
    """Events are acyclic and msgspec structs are untracked: pause the cyclic collector while replaying."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def replay(
    paths: Sequence[str],
    config: Config,
    on_finalised: Callable[[FinalisedBatch], None] | None = None,
    progress: Progress | None = None,
    ab_trace: Callable[[dict[str, Any]], None] | None = None,
    attach: Callable[[Engine], object] | None = None,
    columns: Mapping[str, str] | None = None,
) -> Engine:
    """Evaluate JSON Lines files (``-`` = stdin, gzip detected) in order, as one stream; returns the engine.

    ``ab_trace`` gets the A/B sections (``ab``, ``srm``, ``gsb``; ``segment_ab`` with segments) at each look
    (every ``look_every`` of event time) and at the end, each as ``{"ts": event time, "ab": [...], "srm": [...],
    "gsb": [...]}``. A look at time T holds the requests finalised (serve time + horizon) and sessions closed by T.

    A path ending ``.parquet`` is read as Parquet (:mod:`stream_eval.events.parquet`), its columns named as
    ``columns`` maps them (field -> column).

    ``attach`` is called with the engine before the first event, for listeners that attach themselves to it
    (e.g. :class:`~stream_eval.engine.delays.FeedbackDelays`).
    """
    engine = traced_engine(config, on_finalised, attach, ab_trace)
    done = 0
    events = 0
    with _quiet_gc():
        for path in paths:
            offset = done
            for decoded, position in _decoded_chunks(path, config, engine.unreadable, columns):
                engine.process(decoded)
                events += len(decoded)
                done = offset + position
                if progress is not None:
                    progress(done, events)
            done = offset + (os.path.getsize(path) if path != "-" and os.path.exists(path) else 0)
        engine.flush()
    last_look(engine, ab_trace)
    return engine


def traced_engine(config: Config, on_finalised: Callable[[FinalisedBatch], None] | None,
                  attach: Callable[[Engine], object] | None,
                  ab_trace: Callable[[dict[str, Any]], None] | None) -> Engine:
    """A replay's engine: ``attach`` called with it, ``ab_trace`` given the A/B sections at each look."""
    engine = Engine(config, on_finalised)
    if attach is not None:
        attach(engine)
    if ab_trace is not None:
        engine.ledger.on_look = _Tracer(engine, ab_trace)
    return engine


class _Tracer:
    """The ledger's look listener of a traced replay: gives ``ab_trace`` the A/B sections at each look, and keeps
    the last line given (:func:`last_look` does not repeat it)."""

    def __init__(self, engine: Engine, ab_trace: Callable[[dict[str, Any]], None]) -> None:
        self.engine, self.ab_trace = engine, ab_trace
        self.last: dict[str, Any] | None = None

    def __call__(self, ts: float) -> None:
        self.last = _look_sections(self.engine, ts)
        self.ab_trace(self.last)


def _look_sections(engine: Engine, ts: float | None) -> dict[str, Any]:
    """One line of ``--ab-trace``: the A/B sections at event time ``ts`` (with segments, their A/B rows too)."""
    results = engine.ab_results()
    return {"ts": ts, "ab": engine.ab(results), "srm": engine.srm(results), "gsb": engine.gsb_rows(),
            **({"segment_ab": engine.segment_ab()} if engine.segment_fields else {})}


def last_look(engine: Engine, ab_trace: Callable[[dict[str, Any]], None] | None) -> None:
    """The A/B sections once the input has ended (after ``engine.flush()``), for ``ab_trace``."""
    if ab_trace is None:
        return
    tracer, engine.ledger.on_look = engine.ledger.on_look, None
    # the end of input finalises everything: the last line is as of the last finalisation point applied (or the
    # last look's boundary, after it); not again when the last look already said the same
    last = max(engine.watermark, engine.ledger.last_key, engine.ledger.merger.folded)
    sections = _look_sections(engine, last if math.isfinite(last) else None)
    if not (isinstance(tracer, _Tracer) and tracer.last == sections):
        ab_trace(sections)


def is_parquet(path: str) -> bool:
    """Whether an input or output file is Parquet (by its suffix)."""
    return path.lower().endswith(".parquet")


def _decoded_chunks(path: str, config: Config, damaged: list[str],
                    columns: Mapping[str, str] | None) -> Iterator[tuple[Chunk, int]]:
    """The events of one input, a chunk at a time, with how many bytes of it were read."""
    if is_parquet(path):
        from stream_eval.events.parquet import read_parquet  # pyarrow: the parquet extra

        yield from read_parquet(path, config, columns, damaged)
        return
    for chunk, first_line, position in read_chunks(path, damaged=damaged):
        yield decode_chunk_columns(chunk, config, first_line, "stdin" if path == "-" else path), position


class ProgressBar:
    """A one-line progress display on a terminal (stderr): bytes read, events and events/s."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.start = time.monotonic()
        self.shown = 0.0

    def __call__(self, done: int, events: int) -> None:
        now = time.monotonic()
        if now - self.shown < 0.25:
            return
        self.shown = now
        rate = events / max(now - self.start, 1e-9)
        share = f"{100 * done / self.total:5.1f}%" if self.total else ""
        sys.stderr.write(f"\r  {share} {done / 1e6:8.1f} MB  {events:>11,} events  {rate / 1e3:7.1f}k events/s")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\r" + " " * 72 + "\r")
        sys.stderr.flush()
