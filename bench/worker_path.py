"""The worker's path without Kafka, in process, on one JSON Lines log: CPU seconds by phase.

    python bench/worker_path.py LOG                         # fetches of 5,000 messages per topic-partition
    python bench/worker_path.py LOG --rankings 7500 --feedback 40000   # fetch sizes Kafka's 4 MB limit gives
    py-spy record --native -o profile.svg -- python bench/worker_path.py LOG
    # the cost of A/B/n, guardrails, CUPED and a segment: the defaults against bench/all-on.toml on one simulated
    # log, alternately in fresh processes, with /metrics' readout every 30,000 events (a second of a worker)
    python bench/worker_path.py ab.jsonl --simulate 60000 --readout-events 30000 --versus bench/all-on.toml
    # this tree against another commit's (a git worktree), instructions under cachegrind too (~10 min)
    python bench/worker_path.py LOG --baseline ../old --instructions

What a worker does with a backlog, less the broker: the log's events routed to 4 partitions by request id (CRC-32),
read in rounds of one fetch per topic-partition (feedback before rankings in each round), each fetch decoded as the
worker decodes it (``decode_message_chunk``) and fed to a ``PartitionedEngine`` whose engines are built as the
worker builds them (live windows, feedback delays, regroup sinks), each finalised request's request-metrics record
written into Kafka record batches as the worker writes them (``stream/batches.py``), the regroup records taken with
their commit markers and fed to a regroup stage held through ``StagePartitions``, as a worker's stage is. The
compiled loops are loaded first (``warm_up``) and the garbage collector and glibc's malloc are set as the worker
sets them (``quiet_gc``, ``tune_malloc``; the collector paused where the worker pauses it: ``collector_paused``).
A log of
``bench/stream.py`` (``--out-dir``'s ``stream-log.jsonl``) gives the events the throughput rows count.

``--config FILE`` evaluates with the worker's settings from that file (as ``stream-eval worker --config``; the
``STREAM_EVAL_*`` variables count too), else the defaults. ``--readout-events N`` also takes, between two rounds,
the readout ``/metrics`` shows once N events were fed since the last (``EngineCollector.refresh`` over the
partitions' shares and the stage's view, which the worker does every second: N stands for its events per second, a
count of events rather than a time so that a slower run, under valgrind say, takes no more readouts).
``--versus FILE`` runs the log with both settings, alternately, each run in a fresh process, ``--repeat`` times
(default 3), and prints each one's CPU seconds, events per CPU-second and events/s (median and range) and the cost,
1 - events per CPU-second with FILE ÷ without, run by run; with ``--instructions``, also the instructions of one run
each way under valgrind's cachegrind, which do not move with what else the machine runs, less those of a run of the
log's first 2,000 lines (start-up: imports, the compiled loops, reading), after a run of the whole log that numba
compiles in. ``--baseline DIR`` compares in the same way with the worker's path of another source tree (a git
worktree of another commit: its package and its copy of this script), with the same settings; each side's runs put
its own tree first on ``PYTHONPATH``. ``--simulate N`` first writes LOG: N
simulated requests of an experiment ``exp1`` with a control and three treatments, randomised per user, after a 60 s
pre-period of users with persistent preferences (CUPED's covariate), each ranking with a ``platform`` attribute (a
segment): what ``bench/all-on.toml`` turns on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from stream_eval.config import Config, load_config
from stream_eval.engine.delays import FeedbackDelays
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.engine.labels import LabelBounds
from stream_eval.engine.partitions import PartitionedEngine
from stream_eval.engine.regroup import RegroupSink
from stream_eval.engine.stages import StagePartitions
from stream_eval.engine.windows import RollingWindows
from stream_eval.events.messages import decode_message_chunk
from stream_eval.stream.app import METRICS_OPEN_EVERY, quiet_gc, tune_malloc
from stream_eval.stream.batches import ColumnBatch, column_batches
from stream_eval.stream.delivery import RequestRecords
from stream_eval.stream.logs import BATCH_BYTES
from stream_eval.stream.produce import END_WATERMARK
from stream_eval.stream.worker import collector_paused, warm_up

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import count_instructions  # noqa: E402  (bench/ is not a package)

PARTITIONS = 4
KINDS = ("feedback", "ranking", "judgment")
#: ``--simulate``: the arms of the experiment (a control and three treatments) and the platforms of the segment
SIMULATED_ARMS = (("control", 0.55), ("bm25-tuned", 0.6), ("dense", 0.7), ("hybrid", 0.65))
PLATFORMS = ("ios", "android", "web")


def simulate(path: Path, requests: int) -> None:
    """``--simulate``: A/B/n traffic per user with a pre-period, each ranking with ``attributes.platform``."""
    from stream_eval.simulate import SimulationConfig, simulate_lines

    config = SimulationConfig(requests=requests, items_per_request=20, seed=11, rate=200.0, arms=SIMULATED_ARMS,
                              unit="user", pre_period=60.0, preference=0.8)
    with path.open("wb") as out:
        for line in simulate_lines(config):
            event = orjson.loads(line)
            if event["type"] == "ranking":
                event["attributes"] = {"platform": PLATFORMS[zlib.crc32(event["unit_id"].encode()) % 3]}
            out.write(orjson.dumps(event) + b"\n")


def measure(log: Path, config: Config, rankings: int, feedback: int, readout_events: int,
            stage_count: int = 1) -> dict[str, Any]:
    """One run of the worker's path over ``log``: events, outputs, CPU seconds (in all and by phase), wall time."""
    tune_malloc()
    warm_up(config)
    quiet_gc()
    labels = LabelBounds(config.max_label_values)

    def engine() -> Engine:
        made = Engine(config)
        made.labels = labels
        RollingWindows(made)
        FeedbackDelays(made)
        made.regroup = RegroupSink()
        return made

    outputs: list[ColumnBatch] = []

    def finalised(partition: int, batch: FinalisedBatch) -> None:  # the request-metrics records, in batches
        if batch.states:
            records = RequestRecords.of(partition, batch).records
            outputs.extend(made for made, _ in column_batches(records, BATCH_BYTES, False))

    stages = StagePartitions(engine, PARTITIONS, stage_count)
    template = engine()
    partitioned = PartitionedEngine(template, time.monotonic, finalised, stages=stage_count)
    partitioned.stage_engines = stages.engines
    for partition in range(PARTITIONS):
        partitioned.assign(partition)
    for stage in range(stage_count):
        stages.take(stage)
    fed = [0]  # events fed so far: the readouts' clock
    refresh = readouts(partitioned, stages, labels, template, readout_events, lambda: fed[0])
    messages: dict[tuple[str, int], list[bytes]] = defaultdict(list)
    for line in log.read_bytes().splitlines():
        fields: dict[str, Any] = orjson.loads(line)
        if fields["type"] in KINDS:
            key = str(fields.get("query_id" if fields["type"] == "judgment" else "request_id", ""))
            messages[fields["type"], zlib.crc32(key.encode()) % PARTITIONS].append(line)
    for kind in KINDS:
        for partition in range(PARTITIONS):
            messages[kind, partition].append(END_WATERMARK)
    size = {"ranking": rankings, "feedback": feedback, "judgment": rankings}
    read: dict[tuple[str, int], int] = defaultdict(int)
    regroup_log: dict[int, list[bytes]] = defaultdict(list)  # by stage partition
    cpu: dict[str, float] = defaultdict(float)
    events = 0
    start, wall = time.process_time(), time.perf_counter()
    more = True
    while more:
        more = False
        with collector_paused():  # (as in the worker's handling of a fetch: its batches fed, then finalised)
            for (kind, partition), values in sorted(messages.items()):
                a = read[kind, partition]
                if a >= len(values):
                    continue
                more = True
                b = read[kind, partition] = min(a + size[kind], len(values))
                t0 = time.process_time()
                chunk = decode_message_chunk(values[a:b], kind, config, [0.0] * (b - a), [""] * (b - a))
                t1 = time.process_time()
                partitioned.feed(kind, partition, list(range(a, b)), chunk)
                cpu["decode"] += t1 - t0
                cpu["feed"] += time.process_time() - t1
                events += b - a
            fed[0] = events
            t0 = time.process_time()
            partitioned.tick()
            t1 = time.process_time()
        by_stage: dict[int, list[bytes]] = defaultdict(list)
        for to, _, value in partitioned.take_routed(commit=True):
            by_stage[to].append(value)
        by_stage[0] += stages.take_reports()  # (the other stage partitions' looks, as a worker writes them)
        with collector_paused():  # (as in the worker's stage: the regroup records fetched, applied)
            for stage, routed in sorted(by_stage.items()):
                offsets = range(len(regroup_log[stage]), len(regroup_log[stage]) + len(routed))
                stages.feed(stage, offsets, routed)
                regroup_log[stage] += routed
        cpu["finalise"] += t1 - t0
        t2 = time.process_time()
        cpu["regroup records and stage"] += t2 - t1
        if refresh is not None:
            with collector_paused():  # (as around the worker's readout)
                refresh()
            cpu["readout"] += time.process_time() - t2
    total, seconds = time.process_time() - start, time.perf_counter() - wall
    written = sum(made.record_count() for made in outputs)
    return {"events": events, "outputs": written, "regroup": sum(map(len, regroup_log.values())), "cpu": total,
            "seconds": seconds, "phases": dict(cpu)}


def readouts(partitioned: PartitionedEngine, stages: StagePartitions, labels: LabelBounds, template: Engine,
             every: int, fed: Callable[[], int]) -> Callable[[], None] | None:
    """What the worker calls between batches (``stream/app.py``) when ``every`` > 0: the readout /metrics shows, from
    the partitions' shares and the stage's view, taken once ``every`` events were ``fed`` since the last (the worker
    takes one a second)."""
    if every <= 0:
        return None
    from prometheus_client import CollectorRegistry

    from stream_eval.export.prometheus import EngineCollector

    def shares() -> list[tuple[str, str, Engine]]:
        return [(str(p), task.generation, task.engine) for p, task in partitioned.engines()] + stages.shares()

    collector = EngineCollector(lambda: stages.view(labels, template.watermark), registry=CollectorRegistry(),
                                shares=shares, refresh_every=1.0, clock=lambda: fed() / every,
                                open_every=METRICS_OPEN_EVERY)
    return collector.refresh


#: One side of a comparison: its label, its settings file (None: the defaults), its source tree (None: this one).
Side = tuple[str, str | None, Path | None]


def child(args: argparse.Namespace, log: Path, side: Side) -> tuple[list[str], dict[str, str]]:
    """The command of one run of ``log`` on ``side``, printing JSON, and its environment (another tree's package
    first on the path, and its own copy of this script)."""
    _, config, tree = side
    root = Path(__file__).resolve().parent.parent if tree is None else tree.resolve()
    command = [sys.executable, str(root / "bench" / "worker_path.py"), str(log), "--rankings", str(args.rankings),
               "--feedback", str(args.feedback), "--readout-events", str(args.readout_events), "--json",
               "--stages", str(args.stages)]
    # (the tree's package first: a script's own directory, bench/, is what Python puts on the path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return command + (["--config", config] if config else []), env


def versus(args: argparse.Namespace) -> None:
    """``--versus`` or ``--baseline``: the two sides alternately, each run in a fresh process; medians, ranges and
    the cost of the second (``--versus``'s settings, or the baseline tree) against the first."""
    sides: dict[str, Side] = (
        {"base": ("this tree", args.config, None), "versus": (f"the tree at {args.baseline}", args.config,
                                                               Path(args.baseline))} if args.baseline else
        {"base": (args.config or "defaults", args.config, None), "versus": (args.versus, args.versus, None)})
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "versus": []}
    for i in range(args.repeat):
        for name, side in sides.items():
            command, env = child(args, args.log, side)
            result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout)
            runs[name].append(result)
            print(f"# run {i + 1} {name}: {result['cpu']:.2f} CPU-s, {result['events'] / result['cpu']:,.0f} events "
                  f"per CPU-second", file=sys.stderr, flush=True)
    base, other = runs["base"], runs["versus"]
    assert {r["events"] for r in base} == {r["events"] for r in other}, "the two settings read other events"

    def spread(values: list[float], form: str = ",.0f") -> str:
        return f"{statistics.median(values):{form}} ({min(values):{form}}–{max(values):{form}})"

    print(f"{base[0]['events']:,} messages of {args.log.name}, {PARTITIONS} partitions, fetches of {args.rankings:,} "
          f"rankings / {args.feedback:,} feedback, a readout every {args.readout_events:,} events; {args.repeat} runs "
          f"of each, alternating, each in a fresh process. Median (min–max).\n")
    print("| settings | CPU seconds | events per CPU-second | events/s (wall) | request-metrics records |")
    print("|---|---|---|---|---|")
    for name, (label, _, _) in sides.items():
        rs = runs[name]
        print(f"| {label} | {spread([r['cpu'] for r in rs], '.2f')} | "
              f"{spread([r['events'] / r['cpu'] for r in rs])} | {spread([r['events'] / r['seconds'] for r in rs])} "
              f"| {rs[0]['outputs']:,} |")
    per_cpu = [1 - (o["events"] / o["cpu"]) / (b["events"] / b["cpu"]) for b, o in zip(base, other, strict=True)]
    per_s = [1 - (o["events"] / o["seconds"]) / (b["events"] / b["seconds"]) for b, o in zip(base, other, strict=True)]
    versus_label = sides["versus"][0]
    print(f"\nCost of {versus_label} (1 - with ÷ without, run by run): events per CPU-second "
          f"{spread([100 * c for c in per_cpu], '.1f')} %, events/s {spread([100 * c for c in per_s], '.1f')} %.")
    phases = sorted({phase for r in base + other for phase in r["phases"]})
    print("\nCPU seconds by phase (median): " + "; ".join(
        f"{phase} {statistics.median(r['phases'].get(phase, 0.0) for r in base):.2f} → "
        f"{statistics.median(r['phases'].get(phase, 0.0) for r in other):.2f}" for phase in phases) + ".")
    if args.instructions:
        head = args.log.with_suffix(".head.jsonl")
        head.write_bytes(b"".join(args.log.read_bytes().splitlines(keepends=True)[:2000]))
        counts = {}
        for name, side in sides.items():
            # numba compiles for valgrind's CPU once (a run of the whole log: the head leaves some loops out)
            count_instructions(*child(args, args.log, side))
            counts[name] = (count_instructions(*child(args, head, side)), count_instructions(*child(args, args.log,
                                                                                                   side)))
            print(f"# instructions {name}: start-up {counts[name][0] / 1e9:.2f} G, run {counts[name][1] / 1e9:.2f} G",
                  file=sys.stderr, flush=True)
        (start, whole), (other_start, other_whole) = counts["base"], counts["versus"]
        print(f"\nInstructions (cachegrind), one run each way: {whole / 1e9:.2f} G and {other_whole / 1e9:.2f} G; "
              f"less the start-up (a run of the log's first 2,000 lines: {start / 1e9:.2f} G and "
              f"{other_start / 1e9:.2f} G), {versus_label} costs "
              f"{100 * ((other_whole - other_start) / (whole - start) - 1):+.1f} %.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("--rankings", type=int, default=5000, help="messages per fetch of a rankings partition")
    parser.add_argument("--feedback", type=int, default=5000, help="messages per fetch of a feedback partition")
    parser.add_argument("--config", help="the worker's settings (TOML, as `stream-eval worker --config`)")
    parser.add_argument("--readout-events", type=int, default=50_000, metavar="N",
                        help="take /metrics' readout between rounds once N events were fed since the last (default "
                             "50,000, about a worker's events per second: the live windows are evaluated when read; "
                             "0: none)")
    parser.add_argument("--versus", metavar="FILE", help="compare with these settings, run by run (see above)")
    parser.add_argument("--baseline", metavar="DIR",
                        help="compare with the worker's path of another source tree (a git worktree of another "
                             "commit), same settings, run by run, as --versus")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each settings with --versus (default 3)")
    parser.add_argument("--simulate", type=int, metavar="N", help="first write LOG: N simulated A/B/n requests")
    parser.add_argument("--instructions", action="store_true",
                        help="with --versus or --baseline: also count instructions under cachegrind (one run each "
                             "way; slow)")
    parser.add_argument("--json", action="store_true", help="print one run's numbers as JSON")
    parser.add_argument("--stages", type=int, default=1, metavar="N",
                        help="stage partitions (default 1; a worker's default is one per input partition, 4): the "
                             "records of the others' looks go to partition 0, as a worker writes them")
    args = parser.parse_args()
    if args.simulate:
        simulate(args.log, args.simulate)
    if args.versus or args.baseline:
        versus(args)
        return
    config = load_config(args.config)  # (the STREAM_EVAL_* variables count with or without a file)
    result = measure(args.log, config, args.rankings, args.feedback, args.readout_events, args.stages)
    if args.json:
        print(json.dumps(result))
        return
    total = result["cpu"]
    phases = ", ".join(f"{name} {seconds:.2f}" for name, seconds in result["phases"].items())
    print(f"{result['events']:,} messages, {result['outputs']:,} request-metrics records, {result['regroup']:,} "
          f"regroup records")
    print(f"CPU {total:.2f} s: {result['events'] / total:,.0f} messages per CPU-second ({phases})")


if __name__ == "__main__":
    main()
