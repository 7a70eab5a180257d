"""What Kafka transactions cost the worker: ``--delivery transactions`` against ``fenced-log``, on Apache Kafka.

One log (simulated requests with clicks, labels and A/B units) is produced once to a single-node Apache Kafka
(``scripts/kafka/fetch``); then worker runs alternate between the two deliveries, each with a fresh consumer group
and its own internal topics, and each timed as ``bench/stream.py`` times a worker: from the first event counted to
every event counted and every session scored, with the worker's CPU seconds over that span. The figure quoted is the
ratio of the medians, transactions ÷ fenced log, of events/s and of events per CPU-second (the target: a cost of at
most 15 %). Results: stdout, ``bench/out/delivery.{md,json}``.

    python3 bench/delivery.py                 # 60,000 requests, 3 runs of each
    python3 bench/delivery.py --quick         # 20,000 requests, 2 runs of each
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import code_hash, fmt_range, machine_info, summary  # noqa: E402
from stream import StreamBench, log, parse_args, start_broker  # noqa: E402

DELIVERIES = ("fenced-log", "transactions")


def main(argv: Sequence[str] | None = None) -> int:
    own = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    own.add_argument("--quick", action="store_true", help="20,000 requests, 2 runs of each delivery")
    own.add_argument("--repeat", type=int, help="runs of each delivery (default 3; 2 with --quick)")
    own.add_argument("--requests", type=int, help="simulated requests (default 60,000; 20,000 with --quick)")
    own.add_argument("--out-dir", default=str(HERE / "out"))
    mine = own.parse_args(argv)
    repeat = mine.repeat or (2 if mine.quick else 3)
    args = parse_args([*(["--quick"] if mine.quick else []), "--kafka", "--only", "throughput",
                       "--out-dir", mine.out_dir, *(["--requests", str(mine.requests)] if mine.requests else [])])
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    broker, machine["broker"] = start_broker(True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in DELIVERIES}
    with broker:
        bench = StreamBench(args, broker.bootstrap)
        prefix = f"bench-{bench.run_id}-delivery-"
        data = bench.produce(prefix)
        for i in range(repeat):
            for name in DELIVERIES if i % 2 == 0 else reversed(DELIVERIES):  # alternating: drift hits both
                run = bench.run_worker(prefix, f"{name}{i}", data["events"], data["requests"],
                                       extra=("--delivery", name))
                del run["timeline"]
                runs[name].append(run)
                log(f"run {i + 1}: {name} {run['rate']:,.0f} events/s, {run['per_cpu']:,.0f} per CPU-second")
    machine["loadavg_end"] = os.getloadavg()
    machine["code_hash_end"] = code_hash()

    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    lines = [f"## Transactions against the fenced log ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"`python3 bench/delivery.py{' --quick' if mine.quick else ''}`)", "",
             f"{machine.get('broker')}; {data['events']:,} events ({data['requests']:,} requests), {repeat} runs of "
             f"each delivery, alternating; machine: {machine.get('cpu', '?')}, load average at the end "
             f"{machine['loadavg_end'][0]:.1f}.", "",
             "| delivery | events/s (median, range) | events per CPU-second (median, range) | wall s |",
             "|---|---|---|---|"]
    for name in DELIVERIES:
        lines.append(f"| {name} | {fmt_range(summary([r['rate'] for r in runs[name]]))} | "
                     f"{fmt_range(summary([r['per_cpu'] for r in runs[name]]))} | "
                     f"{statistics.median(r['seconds'] for r in runs[name]):.1f} |")
    rate = median("transactions", "rate") / median("fenced-log", "rate")
    per_cpu = median("transactions", "per_cpu") / median("fenced-log", "per_cpu")
    lines += ["", f"Transactions ÷ fenced log: {rate:.2f}× the events/s, {per_cpu:.2f}× the events per CPU-second "
              f"(cost {100 * (1 - rate):+.0f} % / {100 * (1 - per_cpu):+.0f} %; target ≤ 15 %)."]
    text = "\n".join(lines)
    (Path(args.out_dir) / "delivery.md").write_text(text + "\n")
    (Path(args.out_dir) / "delivery.json").write_text(json.dumps(
        {"machine": machine, "data": data, "runs": runs, "ratio": {"rate": rate, "per_cpu": per_cpu}},
        indent=1, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
