"""What a scrape of ``/metrics`` costs the worker's process: prometheus_client's text export against the worker's own
(``export.exposition`` of the collector's rows), side by side, on the series of a worker with three experiments (two,
two and three arms), a segment field of three values and four input partitions.

    python bench/exposition.py              # 3 experiments x 4 partitions (~10,000 series), 30 interleaved rounds
    python bench/exposition.py --partitions 16 --rounds 10

The engine is ``stream-eval replay``'s of ``--requests`` simulated requests per experiment (the traffic of
tests/test_e2e_alerting.py: ``platform`` attributes, ``segments = ["platform"]``, a guardrail on the three-arm
experiment); the worker's per-partition shares are that engine under ``--partitions`` partition labels
(``EngineCollector(shares=...)``), which gives a worker's label set and series count. Each round times, in this
one thread, prometheus_client's ``generate_latest`` of the registry, which makes a sample object per series as the
collector did until 2026-12-02 (what ``/metrics`` served then, with gzip at level 9), and ``exposition`` of the
collector's rows (what it serves now, with gzip at level 1; Prometheus asks for gzip). Reported: medians (min-max)
of CPU milliseconds per scrape, and their ratio. The output is checked to be the same bytes both ways.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from run import machine_info  # noqa: E402  (bench/ is not a package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000, help="simulated requests per experiment (4000)")
    parser.add_argument("--partitions", type=int, default=4, help="input partitions the series are exported for (4)")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (30)")
    args = parser.parse_args()

    from prometheus_client import CollectorRegistry, generate_latest
    from test_e2e_alerting import CONFIG, RATE, traffic_lines

    from stream_eval.config import load_config
    from stream_eval.engine.replay import replay
    from stream_eval.export.prometheus import EngineCollector, exposition

    lines = list(itertools.islice(traffic_lines(time.time() - 3 * args.requests / RATE), 15 * args.requests))
    with tempfile.TemporaryDirectory() as tmp:
        log, config = Path(tmp) / "traffic.jsonl", Path(tmp) / "worker.toml"
        log.write_bytes(b"".join(lines))
        config.write_text(CONFIG)
        engine = replay([str(log)], load_config(str(config), environ={}))
    registry = CollectorRegistry()
    shares = [(str(p), "1", engine) for p in range(args.partitions)]
    EngineCollector(engine, registry, shares=lambda: shares)
    assert exposition(registry.collect()) == generate_latest(registry)  # (a warm-up too)
    text = exposition(registry.collect())
    series = sum(1 for line in text.splitlines() if not line.startswith(b"#"))

    def cpu_ms(call: object) -> float:
        started = time.process_time()
        call()  # type: ignore[operator]
        return (time.process_time() - started) * 1000

    before: list[float] = []
    now: list[float] = []
    for _ in range(args.rounds):
        before.append(cpu_ms(lambda: gzip.compress(generate_latest(registry))))
        now.append(cpu_ms(lambda: gzip.compress(exposition(registry.collect()), compresslevel=1)))
    info = machine_info()
    print(f"\n{info['date']}, {info['cpu']}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"stream_eval at {info['commit']}; {series:,} series ({len(text) / 1e6:.1f} MB), {args.partitions} "
          f"partitions; median (min-max) of {args.rounds} interleaved rounds, CPU ms per scrape in one thread\n")
    print("| /metrics | CPU ms per scrape |\n|---|---|")
    for name, times in (("prometheus_client generate_latest + gzip level 9", before),
                        ("exposition of the rows + gzip level 1", now)):
        print(f"| {name} | {statistics.median(times):.1f} ({min(times):.1f}-{max(times):.1f}) |")
    print(f"\nratio of the medians: {statistics.median(before) / statistics.median(now):.2f}x")


if __name__ == "__main__":
    main()
