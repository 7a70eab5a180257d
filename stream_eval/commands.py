"""What each ``stream-eval`` sub-command does (argument parsing lives in ``cli.py``)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from contextlib import ExitStack
from typing import IO, TypeVar

import orjson

from stream_eval.config import Config
from stream_eval.engine.engine import FinalisedBatch
from stream_eval.engine.replay import ProgressBar, is_parquet, replay, total_size
from stream_eval.export.report import PerRequestWriter, to_json, to_table

_T = TypeVar("_T")


def replay_command(args: argparse.Namespace, config: Config) -> int:
    if any(is_parquet(path) for path in [*args.files, args.per_request or ""]) and (
            importlib.util.find_spec("pyarrow") is None):
        print("stream-eval replay: Parquet needs pyarrow; install it with: "
              "python3 -m pip install 'stream-eval[parquet]'", file=sys.stderr)
        return 2
    html_data = None
    if getattr(args, "html", None):
        if importlib.util.find_spec("plotly") is None:
            print("stream-eval replay --html: plotly is not installed; install it with: "
                  "python3 -m pip install 'stream-eval[html]'", file=sys.stderr)
            return 2
        from stream_eval.export.html_data import HtmlData

        html_data = HtmlData(config)
    with ExitStack() as stack:
        writer = None
        if args.per_request:
            writer = _per_request_writer(args.per_request, stack)
        progress = None
        if not args.no_progress and sys.stderr.isatty():
            progress = ProgressBar(total_size(args.files))
        trace = None
        if args.ab_trace:
            trace_file = stack.enter_context(open(args.ab_trace, "wb"))

            def trace(look: dict[str, object]) -> None:
                trace_file.write(orjson.dumps(look) + b"\n")

        engine = replay(args.files, config, _each(writer, html_data.on_finalised if html_data else None), progress,
                        _each(trace, html_data.on_look if html_data else None),
                        attach=html_data.attach if html_data else None, columns=_columns(args))
        if progress is not None:
            progress.close()
    report = engine.report()
    examples = [f"{e.where or '?'}: {e.kind}: {e.reason}" for e in engine.invalid_examples]
    for line in examples[:5]:
        print(f"stream-eval: invalid {line}", file=sys.stderr)
    if engine.invalid_reasons:
        summary = ", ".join(f"{reason} x{n}" for reason, n in engine.invalid_reasons.most_common())
        skipped = sum(engine.invalid_reasons.values())
        print(f"stream-eval: skipped {skipped} invalid events ({summary})", file=sys.stderr)
    output: IO[bytes] = open(args.output, "wb") if args.output else sys.stdout.buffer
    fmt = args.format or ("table" if output.isatty() else "json")
    try:
        output.write(to_table(report, examples).encode() if fmt == "table" else to_json(report))
    finally:
        if args.output:
            output.close()
    if html_data is not None:
        from stream_eval.export.html import write_html

        write_html(args.html, report, html_data, engine.arms_of, f"stream-eval report: {', '.join(args.files)}")
    for problem in engine.unreadable:  # the report covers what was read; the exit status says it is not all
        print(f"stream-eval: error: {problem}", file=sys.stderr)
    return 1 if engine.unreadable else 0


def _columns(args: argparse.Namespace) -> dict[str, str] | None:
    """``--columns FIELD=COLUMN,...`` as a dict (None when not given)."""
    if not getattr(args, "columns", None):
        return None
    from stream_eval.events.parquet import parse_columns

    return parse_columns(args.columns)


def _per_request_writer(path: str, stack: ExitStack) -> Callable[[FinalisedBatch], object]:
    """``--per-request``: Parquet when the name ends ``.parquet``, else JSON Lines."""
    if is_parquet(path):
        from stream_eval.export.parquet import ParquetPerRequestWriter

        return stack.enter_context(ParquetPerRequestWriter(path))
    return PerRequestWriter(stack.enter_context(open(path, "wb")))


def _each(*callbacks: Callable[[_T], object] | None) -> Callable[[_T], None] | None:
    """One callback that calls each given one in turn (None when none is given)."""
    given = [callback for callback in callbacks if callback is not None]
    if not given:
        return None

    def each(value: _T) -> None:
        for callback in given:
            callback(value)

    return each


def simulate_command(args: argparse.Namespace) -> int:
    from stream_eval.simulate import SimulationConfig, simulate_lines, write_jsonl

    if getattr(args, "broker", None):
        return _simulate_to_kafka(args)
    sim = SimulationConfig(requests=args.requests, seed=args.seed, interleaving=args.interleaving,
                           judgments=args.judgments, unit=args.unit, behaviour=args.behaviour)
    if args.output == "-":
        out = sys.stdout.buffer
        for line in simulate_lines(sim):
            out.write(line)
        out.flush()
    else:
        lines = write_jsonl(sim, args.output)
        print(f"stream-eval: wrote {lines:,} events to {args.output}", file=sys.stderr)
    return 0


#: Events per simulated request with the default settings (a ranking and ~4 feedback events; measured 5.07).
EVENTS_PER_REQUEST = 5.0


def _simulate_to_kafka(args: argparse.Namespace) -> int:
    """``simulate --broker``: the same lines, sent by the routing of ``produce``; ``--requests 0`` = until Ctrl-C."""
    import time

    from stream_eval.simulate import SimulationConfig, simulate_lines
    from stream_eval.stream.produce import produce_command

    endless = args.requests == 0
    # Event time must not run ahead of the wall clock (the worker rejects events more than max_clock_skew ahead):
    # paced (--rate, or endless traffic), the simulated requests per second of event time follow the rate asked
    # for and sending never gets ahead of event time; as fast as possible, the whole log lies in the past.
    paced = endless or args.rate > 0
    requests_per_second = args.rate / EVENTS_PER_REQUEST if args.rate > 0 else SimulationConfig.rate
    now = float(int(time.time()))
    start = now if paced else now - args.requests / requests_per_second
    sim = SimulationConfig(requests=args.requests, seed=args.seed, interleaving=args.interleaving,
                           judgments=args.judgments, unit=args.unit, start_ts=start, endless=endless,
                           rate=requests_per_second, behaviour=args.behaviour)
    return produce_command([], args.broker, args.topic_prefix, 1.0 if paced else None, not args.no_flush,
                           args.partitions, lines=simulate_lines(sim), rate=args.rate or None, endless=endless,
                           security=getattr(args, "security", None))
