"""How long a checkpoint holds the worker's loop: the wall time of each commit under steady live traffic.

    python bench/commits.py                       # 2 rounds of 40 s at 5,000 events/s
    python bench/commits.py --baseline ../old     # also another source tree's worker, in the same rounds

A worker commits every ``checkpoint_interval`` (1 s), and more often once caught up: each owned input partition's
outputs, checkpoint and offsets (``Delivery.commit``), then each held stage partition's reports, snapshot and
checkpoint (``Delivery.commit_stages``). The loop reads nothing while a commit waits on the broker. Here a Tansu
broker on a free port, per run a fresh topic prefix with ``stream-eval simulate --broker --requests 0 --rate N``
(live traffic), and the worker (fenced log: Tansu has no transactions) started through a wrapper that times those
two coroutines, wall clock, from their call to their return; the first 5 of each are left out (claims, first
checkpoints), and the last (the worker's stop). Results: stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import machine_info  # noqa: E402
from stream import source_tree, tree_env  # noqa: E402

from stream_eval.stream.broker import Broker, free_port, stop_process  # noqa: E402

#: The worker, with its two commit coroutines timed (``sys.argv[1]``: where to write the times at exit).
TIMED_WORKER = """
import atexit, functools, json, sys, time
from stream_eval.stream import delivery
times = {"commit": [], "commit_stages": []}
def timed(name, method):
    @functools.wraps(method)
    async def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return await method(*args, **kwargs)
        finally:
            times[name].append(time.perf_counter() - start)
    return wrapper
for name in times:
    setattr(delivery.FencedLog, name, timed(name, getattr(delivery.FencedLog, name)))
out = sys.argv[1]
atexit.register(lambda: json.dump(times, open(out, "w")))  # (after faust's own stop on SIGTERM)
from stream_eval.cli import main
sys.argv = ["stream-eval", "worker", *sys.argv[2:]]
sys.exit(main())
"""
#: Commits left out at the start of a run (claims, the first checkpoints); the last one, at the worker's stop (its
#: release), is left out too.
SKIP = 5


def run(broker: Broker, name: str, args: argparse.Namespace, source: str | None) -> dict[str, list[float]]:
    """One run of the worker from ``source`` (None: this tree) on fresh live traffic: its commits' wall times."""
    prefix = f"commits-{name}-{time.monotonic_ns()}."
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_EVAL_")}
    traffic = subprocess.Popen([sys.executable, "-m", "stream_eval.cli", "simulate", "--broker", broker.url,
                                "--requests", "0", "--rate", str(args.rate), "--topic-prefix", prefix], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        worker = subprocess.Popen([sys.executable, "-c", TIMED_WORKER, str(out), "--broker", broker.url,
                                   "--metrics-port", str(free_port()), "--topic-prefix", prefix,
                                   "--group", prefix.rstrip(".")],
                                  env=tree_env(source, env), cwd=source,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(args.seconds)
        finally:
            stop_process(traffic)
            stop_process(worker)
        if not out.exists():  # (the worker did not stop in time, and was killed)
            print(f"{name}: the worker wrote no times", flush=True)
            return {"commit": [], "commit_stages": []}
        times: dict[str, list[float]] = json.loads(out.read_text())
    return {name: values[SKIP:-1] for name, values in times.items()}


def describe(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    return (f"{len(values)}, median {statistics.median(values) * 1e3:.1f} ms, "
            f"p90 {ordered[int(0.9 * len(ordered))] * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=5000.0, help="events/s of the live traffic (5,000)")
    parser.add_argument("--seconds", type=float, default=40.0, help="seconds of each run (40)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds (2)")
    parser.add_argument("--baseline", metavar="DIR", help="a source tree of another commit (e.g. a git worktree): "
                        "its worker runs too, in the same rounds")
    args = parser.parse_args()
    baseline, baseline_commit = source_tree(args.baseline)
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    if baseline is not None:
        trees.append((f"baseline ({baseline_commit})", baseline))
    machine = machine_info()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine['cpu']}, {machine['cores']} cores; "
          f"{machine['python']}; stream_eval at {machine['commit']}; live traffic at {args.rate:,.0f} events/s, "
          f"{args.seconds:.0f} s a run", flush=True)
    with Broker(free_port()) as broker:
        for i in range(args.repeat):
            for name, source in (trees if i % 2 == 0 else trees[::-1]):
                slug = "".join(c if c.isalnum() else "-" for c in name)
                times = run(broker, slug, args, source)
                print(f"round {i + 1}, {name}: commits {describe(times['commit'])}; "
                      f"stage commits {describe(times['commit_stages'])}", flush=True)


if __name__ == "__main__":
    main()
