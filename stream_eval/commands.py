"""What each ``stream-eval`` sub-command does (argument parsing lives in ``cli.py``)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import os
import sys
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import orjson

from stream_eval.config import Config, ConfigError
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.engine.replay import BOM, Progress, ProgressBar, first_bytes, is_parquet, replay, total_size
from stream_eval.export.report import PerRequestWriter, to_json, to_table
from stream_eval.metrics.specs import request_specs

if TYPE_CHECKING:
    from stream_eval.events.ubi import UbiCounts, UbiSettings
    from stream_eval.simulate import SimulationConfig
    from stream_eval.stream.kafka import KafkaSecurity

_T = TypeVar("_T")


def replay_command(args: argparse.Namespace, config: Config) -> int:
    check_paths(args.files, [args.output, args.per_request, getattr(args, "html", None), args.ab_trace])
    if args.output == "-":  # (standard output, where the report goes anyway)
        args.output = None
    for path in args.files:
        _check_text(path)
    for flag, path in (("--per-request", args.per_request), ("--html", getattr(args, "html", None)),
                       ("--ab-trace", args.ab_trace)):
        if path == "-":
            raise ConfigError(f"{flag} -: standard output holds the report; give {flag} a file")
    ubi = None
    if getattr(args, "input_format", "events") == "ubi":
        from stream_eval.events.ubi import ubi_config, ubi_settings

        _check_ubi_inputs("replay", args.files, getattr(args, "columns", None))
        ubi = ubi_settings(args.config)
        config = ubi_config(config, ubi)
    if any(is_parquet(path) for path in [*args.files, args.per_request or ""]) and (
            importlib.util.find_spec("pyarrow") is None):
        print("stream-eval replay: Parquet needs pyarrow; install it with: "
              "python3 -m pip install 'stream-eval[parquet]'", file=sys.stderr)
        return 2
    columns = _columns(args) if ubi is None else None  # (refused before any output is opened)
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
            writer = _per_request_writer(args.per_request, stack, config)
        progress = None
        if not args.no_progress and sys.stderr.isatty():
            progress = ProgressBar(total_size(args.files))
        trace = None
        if args.ab_trace:
            trace_file = stack.enter_context(open(args.ab_trace, "wb"))

            def trace(look: dict[str, object]) -> None:
                trace_file.write(orjson.dumps(look) + b"\n")

        on_finalised = _each(writer, html_data.on_finalised if html_data else None)
        on_look = _each(trace, html_data.on_look if html_data else None)
        attach = html_data.attach if html_data else None
        counts = None
        if ubi is not None:
            engine, counts = _replay_ubi(args.files, config, ubi, on_finalised, progress, on_look, attach)
        else:
            engine = replay(args.files, config, on_finalised, progress, on_look, attach=attach, columns=columns)
        if progress is not None:
            progress.close()
    report = engine.report()
    if counts is not None:
        report["ubi"] = counts.summary()
        print(f"stream-eval: {counts.describe()}", file=sys.stderr)
    for row in report.get("srm", []):  # a configured arm that no unit came to: a typo, most likely
        named = config.settings_of(row["experiment"])
        configured = dict.fromkeys([named.control, *named.treatments, *(arm for arm, _ in named.split)])
        empty = [arm for arm in configured if arm and not row["units"].get(arm)]
        seen = sorted(arm for arm, n in row["units"].items() if n)
        if empty and seen:
            print(f"stream-eval: warning: experiment {row['experiment']}: no unit came to {', '.join(map(repr, empty))}"
                  f" (arms with units: {', '.join(seen)}); check [experiments.{row['experiment']}]", file=sys.stderr)
    seen_experiments = sorted({group["experiment"] for group in report.get("groups", [])})
    unseen = [name for name, _ in config.experiments if name not in seen_experiments]
    if unseen and report.get("groups"):  # a configured experiment that no request came to: a typo, most likely
        print(f"stream-eval: warning: no request of experiment {', '.join(map(repr, unseen))}, which --config sets "
              f"(experiments seen: {', '.join(seen_experiments)}); check the [experiments.NAME] tables' names",
              file=sys.stderr)
    if engine.invalid_reasons and not report["events"].get("ranking"):  # nothing read as a ranking: why?
        for hint in filter(None, map(_array_hint, args.files)):
            print(f"stream-eval: hint: {hint}", file=sys.stderr)
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


def check_paths(inputs: list[str], outputs: list[str | None], several: bool = True) -> None:
    """Refuse, before any work, an input that is a directory and an output whose directory does not exist (or
    that is a directory itself, or names one with a trailing ``/``), rather than after the whole replay.

    ``several``: the command takes several inputs, and the message names the directory's files as a glob (of
    the kind of file most of them are)."""
    for path in inputs:
        if path != "-" and os.path.isdir(path):
            if not several:
                raise ConfigError(f"{path}: is a directory, not a file to read")
            raise ConfigError(f"{path}: is a directory; give the files in it (e.g. {_glob_of(path)})")
    written: list[str] = []
    for output in outputs:
        if not output or output == "-":
            continue
        if os.path.isdir(output) or output.endswith(("/", os.sep)):
            raise ConfigError(f"{output}: is a directory, not a file to write")
        directory = os.path.dirname(os.path.abspath(output))
        if not os.path.isdir(directory):
            raise ConfigError(f"{output}: cannot be written: no directory {directory}")
        # an output that is an input (or another output) would be emptied before it is read (or overwritten)
        for other in [*(path for path in inputs if path != "-"), *written]:
            if _same_file(output, other):
                what = "another output" if other in written else "an input"
                named = "" if other == output else f" ({other})"
                raise ConfigError(f"{output}: is {what}{named}; write the output to another file")
        written.append(output)


def _check_text(path: str) -> None:
    """Refuse an input of UTF-16 text (a byte order mark: what a Windows PowerShell redirect writes), every line of
    which would be invalid: replay reads UTF-8."""
    if first_bytes(path, 2) in (b"\xff\xfe", b"\xfe\xff"):
        raise ConfigError(f"{path}: is UTF-16 text; replay reads UTF-8: convert it first (iconv -f UTF-16 -t UTF-8 "
                          f"{path} > {path}.utf8)")


def _array_hint(path: str) -> str | None:
    """A hint for an input whose first line starts a JSON array (one array of events, not JSON Lines), else None."""
    if not first_bytes(path, 64).lstrip(BOM + b" \t\r\n").startswith(b"["):
        return None
    return (f"{path} starts with '[': if it is one JSON array of events, replay needs JSON Lines (one event object a "
            f"line): jq -c '.[]' {path} > events.jsonl")


def _same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name the same file (one that exists, or one that would be made)."""
    with contextlib.suppress(OSError):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def _glob_of(directory: str) -> str:
    """``directory/*.EXT`` for the suffix most of its files have (``.jsonl``, ``.jsonl.gz``, ``.parquet``...), else
    ``directory/*``."""
    with contextlib.suppress(OSError):
        suffixes = Counter(_suffix(name) for name in os.listdir(directory)
                           if not name.startswith(".") and os.path.isfile(os.path.join(directory, name)))
        suffixes.pop("", None)
        if suffixes:
            return os.path.join(directory, "*" + max(sorted(suffixes), key=suffixes.__getitem__))
    return os.path.join(directory, "*")


def _suffix(name: str) -> str:
    """A file name's kind: ``.jsonl``, ``.jsonl.gz`` (a compressed file's suffix with the one before it)."""
    suffixes = Path(name).suffixes
    return "".join(suffixes[-2:] if suffixes and suffixes[-1] == ".gz" else suffixes[-1:])


def _check_ubi_inputs(command: str, files: list[str], columns: str | None) -> None:
    """``--input-format ubi`` takes two inputs, the queries and the events, and no ``--columns``."""
    if len(files) != 2:
        raise ConfigError(f"{command} --input-format ubi: give two inputs, the exports of ubi_queries and of "
                          f"ubi_events (QUERIES EVENTS), not {len(files)}")
    missing = [path for path in files if path != "-" and not os.path.isfile(path)]
    if missing:
        raise FileNotFoundError(errno.ENOENT, "no such file", missing[0])
    if files == ["-", "-"]:
        raise ConfigError(f"{command} --input-format ubi: only one of the two inputs can be stdin ('-')")
    if columns:
        raise ConfigError(f"{command} --input-format ubi: --columns maps the columns of event logs; UBI fields are "
                          "mapped in the [ubi] table of --config")


def _replay_ubi(paths: list[str], config: Config, settings: UbiSettings,
                on_finalised: Callable[[FinalisedBatch], None] | None, progress: Progress | None,
                on_look: Callable[[dict[str, Any]], None] | None,
                attach: Callable[[Engine], object] | None) -> tuple[Engine, UbiCounts]:
    """:func:`~stream_eval.engine.replay.replay` of two UBI exports: their records converted to event lines
    (:mod:`stream_eval.events.ubi`), decoded and counted as a log's lines are."""
    from stream_eval.engine.replay import last_look, traced_engine
    from stream_eval.events.ubi import UbiConverter, decoded, read_records

    engine = traced_engine(config, on_finalised, attach, on_look)
    converter = UbiConverter(config, settings)
    read = [0, 0]  # bytes read of each input, for progress

    def reading(k: int) -> Callable[[int], None]:
        return lambda n: read.__setitem__(k, n)

    records = [read_records(path, engine.unreadable, reading(k)) for k, path in enumerate(paths)]
    events = 0
    for batch in decoded(converter.convert(*records), config):
        engine.process(batch)
        events += len(batch)
        if progress is not None:
            progress(sum(read), events)
    engine.flush()
    last_look(engine, on_look)
    return engine, converter.counts


def produce_ubi_command(args: argparse.Namespace, security: KafkaSecurity) -> int:
    """``stream-eval produce --input-format ubi QUERIES EVENTS``: the converted events into the input topics."""
    from stream_eval.config import load_config
    from stream_eval.events.ubi import UbiConverter, ubi_config, ubi_lines, ubi_settings
    from stream_eval.stream.produce import produce_command

    _check_ubi_inputs("produce", args.files, None)
    settings = ubi_settings(args.config)
    config = ubi_config(load_config(args.config), settings)
    converter = UbiConverter(config, settings)
    damaged: list[str] = []
    status = produce_command(args.files, args.broker, args.topic_prefix, args.speed, not args.no_flush,
                             args.partitions, lines=ubi_lines(converter, args.files[0], args.files[1], damaged),
                             broker_timeout=args.broker_timeout, security=security)
    print(f"stream-eval: {converter.counts.describe()}", file=sys.stderr)
    for problem in damaged:
        print(f"stream-eval: error: {problem}", file=sys.stderr)
    return status or (1 if damaged else 0)


def _columns(args: argparse.Namespace) -> dict[str, str] | None:
    """``--columns FIELD=COLUMN,...`` as a dict (None when not given)."""
    if not getattr(args, "columns", None):
        return None
    if not any(is_parquet(path) for path in args.files):  # (a JSON line names its fields itself)
        raise ConfigError("--columns maps the columns of Parquet inputs (a name ending .parquet); none is given, "
                          "and JSON Lines are read by their field names")
    from stream_eval.events.parquet import parse_columns

    return parse_columns(args.columns)


def _per_request_writer(path: str, stack: ExitStack, config: Config) -> Callable[[FinalisedBatch], object]:
    """``--per-request``: Parquet when the name ends ``.parquet``, else JSON Lines."""
    if is_parquet(path):
        from stream_eval.export.parquet import ParquetPerRequestWriter

        metrics = [spec.name for spec in request_specs(config)]
        return stack.enter_context(ParquetPerRequestWriter(path, metrics))
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
    from stream_eval.simulate import simulate_lines, write_jsonl

    if getattr(args, "broker", None):
        return _simulate_to_kafka(args)
    from stream_eval.stream.kafka import DEFAULT_PARTITIONS

    given = [option for option, dest in _BROKER_ONLY if getattr(args, dest, None) not in (None, False, 0, 0.0, "")]
    if getattr(args, "ssl_check_hostname", None) is False:
        given.append("--no-ssl-check-hostname")
    if args.partitions != DEFAULT_PARTITIONS:
        given.append("--partitions")
    if given:  # (they were ignored without a word: a user who forgot --broker would wait for a paced file)
        raise ConfigError(f"simulate: {', '.join(given)}: only with --broker (sending to Kafka)")
    check_paths([], [args.output])
    sim = _simulation(**_simulated(args))
    if args.output == "-":
        out = sys.stdout.buffer
        for line in simulate_lines(sim):
            out.write(line)
        out.flush()
    else:
        lines = write_jsonl(sim, args.output)
        print(f"stream-eval: wrote {lines:,} events to {args.output}", file=sys.stderr)
    return 0


#: ``simulate``'s options that only sending to Kafka uses: (option, argument name).
_BROKER_ONLY = (("--rate", "rate"), ("--topic-prefix", "topic_prefix"), ("--no-flush", "no_flush"),
                ("--broker-timeout", "broker_timeout"),
                ("--security-protocol", "security_protocol"), ("--sasl-mechanism", "sasl_mechanism"),
                ("--sasl-username", "sasl_username"), ("--sasl-password-file", "sasl_password_file"),
                ("--ssl-cafile", "ssl_cafile"), ("--ssl-certfile", "ssl_certfile"), ("--ssl-keyfile", "ssl_keyfile"),
                ("--ssl-check-hostname", "ssl_check_hostname"))


def _simulated(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``simulate``'s options, as :class:`SimulationConfig` names them."""
    arms = {} if args.arms is None else {"arms": args.arms}
    return dict(requests=args.requests, seed=args.seed, interleaving=args.interleaving, judgments=args.judgments,
                unit=args.unit, behaviour=args.behaviour, pre_period=args.pre_period, preference=args.preference,
                segments=tuple(args.segment), **arms)


def _simulation(**settings: Any) -> SimulationConfig:
    """``SimulationConfig(**settings)``; settings it refuses are a ConfigError (a message, exit 2)."""
    from stream_eval.simulate import SimulationConfig

    try:
        return SimulationConfig(**settings)
    except ValueError as error:
        raise ConfigError(f"simulate: {error}") from None


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
    # each run its own ids (a request id again within the attribution window would count as a duplicate, and its
    # feedback join the earlier request): the start's milliseconds, in hex
    run = f"{time.time_ns() // 1_000_000:x}-"
    sim = _simulation(**_simulated(args), start_ts=start, endless=endless, rate=requests_per_second, id_prefix=run)
    timeout = {} if args.broker_timeout is None else {"broker_timeout": args.broker_timeout}
    return produce_command([], args.broker, args.topic_prefix, 1.0 if paced else None, not args.no_flush,
                           args.partitions, lines=simulate_lines(sim), rate=args.rate or None, endless=endless,
                           security=getattr(args, "security", None), **timeout)
