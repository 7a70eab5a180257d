"""Record sizes of every topic of a worker, and what they come to per day (docs/operations.md, "Sizes").

Simulated traffic (``--requests``, judgments on, 20 items a list) goes through a local broker (Tansu; Apache Kafka
with ``--kafka``) to one worker, which then runs idle for ``--idle`` seconds more, so that the records written per
second of wall clock (checkpoints, probes, stage checkpoints) show apart from those written per request. Every topic
is then read whole: records and bytes (key + value + headers) per topic and per kind of record (the checkpoint
topic's keys), and the per-day sizes at ``--rate`` requests/s with ``--partitions`` partitions are printed.

    python3 bench/topic_sizes.py --requests 20000 --rate 1000
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections import defaultdict
from typing import Any

from stream_eval.config import Config
from stream_eval.simulate import SimulationConfig, simulate_lines
from stream_eval.stream.apache_kafka import ApacheKafka
from stream_eval.stream.broker import Broker, free_port
from stream_eval.stream.produce import send_lines
from stream_eval.stream.settings import WorkerSettings
from stream_eval.stream.worker import StreamWorker

DAY = 86_400


async def read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic`` (until a fetch of 2 s brings nothing)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, max_partition_fetch_bytes=8 << 20)
    await consumer.start()
    found: list[Any] = []
    try:
        while batch := await consumer.getmany(timeout_ms=2000):
            for records in batch.values():
                found += records
    finally:
        await consumer.stop()
    return found


def size(record: Any) -> int:
    return len(record.key or b"") + len(record.value or b"") + sum(len(k) + len(v) for k, v in record.headers or ())


async def measure(bootstrap: str, requests: int, idle: float, partitions: int) -> dict[str, Any]:
    lines = list(simulate_lines(SimulationConfig(requests=requests, seed=5, judgments=True, rate=200.0)))
    settings = WorkerSettings([bootstrap], prefix="sizes.", group="sizes", partitions=partitions,
                              snapshot_interval=10.0)
    await send_lines(lines, [bootstrap], settings.topics, partitions=partitions)
    worker = StreamWorker(settings, Config())
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    began = time.monotonic()
    while worker.partitioned.watermark != math.inf and time.monotonic() - began < 600:
        await asyncio.sleep(0.5)
    await asyncio.sleep(idle)
    wall = time.monotonic() - began
    stop.set()
    await task
    names = settings.topics
    topics = {"input (rankings + feedback + judgments)": list(names.inputs), "request-metrics": [names.request_metrics],
              "dead-letters": [names.dead_letters], "checkpoints": [settings.checkpoint_topic],
              "regroup": [settings.regroup_topic], "regroup-checkpoints": [settings.regroup_checkpoint_topic],
              "ab-snapshots": [settings.snapshot_topic]}
    result: dict[str, Any] = {"requests": requests, "wall": wall, "topics": {}}
    for label, chosen in topics.items():
        records = [r for topic in chosen for r in await read_all(bootstrap, topic)]
        by_key: dict[str, list[int]] = defaultdict(list)
        for record in records:
            by_key[(record.key or b"-").decode(errors="replace")[:20] if label == "checkpoints" else "*"].append(
                size(record))
        result["topics"][label] = {key: (len(sizes), sum(sizes)) for key, sizes in by_key.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds the worker runs on after catching up")
    parser.add_argument("--rate", type=float, default=1000.0, help="requests/s for the per-day sizes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--kafka", action="store_true", help="on Apache Kafka (.cache/kafka/jars) instead of Tansu")
    args = parser.parse_args()
    broker: Broker = ApacheKafka(free_port()) if args.kafka else Broker(free_port())
    with broker:
        result = asyncio.run(measure(broker.bootstrap, args.requests, args.idle, args.partitions))
    print(f"{result['requests']} requests, worker ran {result['wall']:.0f} s of wall clock")
    for label, keys in result["topics"].items():
        for key, (count, total) in sorted(keys.items()):
            mean = total / count if count else 0.0
            print(f"{label:42s} {key:12s} {count:8d} records {total / 1e6:9.2f} MB  {mean:9.0f} B/record  "
                  f"{total / result['requests']:8.1f} B/request")
    print(f"per day at {args.rate:g} requests/s ({args.rate * DAY / 1e6:.1f} M requests), "
          f"{args.partitions} partitions:")
    for label in ("input (rankings + feedback + judgments)", "request-metrics", "regroup"):
        total = sum(t for _, t in result["topics"][label].values())
        print(f"  {label:42s} {total / result['requests'] * args.rate * DAY / 1e9:8.2f} GB (per request)")


if __name__ == "__main__":
    main()
