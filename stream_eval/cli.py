"""The ``stream-eval`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from stream_eval.config import Config, ConfigError, load_config

SHARED_OPTIONS: list[tuple[str, dict[str, object]]] = [
    ("--cutoffs", {"help": "cutoffs k of the @k metrics, comma-separated (default 10)"}),
    ("--gain", {"choices": ["exp", "linear"], "help": "DCG gain: exp = 2^g - 1 (default) or linear = g"}),
    ("--max-grade", {"help": "highest grade, for ERR (default 4)"}),
    ("--rel-threshold", {"help": "grade from which an item counts as relevant (default 1)"}),
    ("--empty", {"choices": ["zero", "skip"], "help": "requests with no relevant judged item: 0 or left out"}),
    ("--gauc-weight", {"choices": ["impressions", "clicks", "uniform"], "help": "session weight in GAUC"}),
    ("--attribution-window", {"help": "how long after serve time feedback counts (default 30m)"}),
    ("--allowed-lateness", {"help": "how far out of event-time order events may arrive (default 60s)"}),
    ("--session-gap", {"help": "a named session closes after this much idle event time (default 30m)"}),
    ("--alpha", {"help": "alpha of alpha-nDCG (default 0.5)"}),
    ("--gsb-metric", {"help": "metric compared per query for GSB source 'metric' (default nDCG@10)"}),
    ("--gsb-epsilon", {"help": "smallest difference that is not 'same' (default 0)"}),
    ("--config", {"metavar": "FILE", "help": "TOML file with settings (see README)"}),
]


def _add_shared(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("evaluation settings (also STREAM_EVAL_* variables and --config)")
    for flag, options in SHARED_OPTIONS:
        group.add_argument(flag, **options)  # type: ignore[arg-type]  # argparse keyword options


def config_from_args(args: argparse.Namespace) -> Config:
    overrides = {flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_")) for flag, _ in SHARED_OPTIONS}
    path = overrides.pop("config")
    return load_config(path, overrides)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-eval", description="Live and offline ranking-quality metrics (MRR, nDCG, ERR, AP, GAUC, GSB)."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay = commands.add_parser("replay", help="evaluate JSON Lines logs offline and print the report")
    replay.add_argument("files", nargs="+", metavar="FILE", help="JSON Lines files ('-' = stdin, .gz ok)")
    replay.add_argument("--format", choices=["json", "table"], help="default: table on a terminal, else json")
    replay.add_argument("--per-request", metavar="OUT.jsonl", help="write one line of metrics per request")
    replay.add_argument("--output", "-o", metavar="FILE", help="write the report here instead of stdout")
    replay.add_argument("--no-progress", action="store_true", help="no progress line on the terminal")
    _add_shared(replay)
    simulate = commands.add_parser("simulate", help="write synthetic traffic from a click model as JSON Lines")
    simulate.add_argument("--requests", type=int, default=1000)
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument("--interleaving", action="store_true", help="add team-draft interleaved requests")
    simulate.add_argument("--judgments", action="store_true", help="add side-by-side judgment events")
    simulate.add_argument("--output", "-o", default="-", metavar="FILE", help="'-' = stdout, .gz compresses")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "replay":
            from stream_eval.commands import replay_command

            return replay_command(args, config_from_args(args))
        if args.command == "simulate":
            from stream_eval.commands import simulate_command

            return simulate_command(args)
    except ConfigError as error:
        print(f"stream-eval: {error}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"stream-eval: {error.filename}: no such file", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
