"""The worker's path without Kafka, in process, on one JSON Lines log: CPU seconds by phase.

    python bench/worker_path.py LOG                         # fetches of 5,000 messages per topic-partition
    python bench/worker_path.py LOG --rankings 7500 --feedback 40000   # fetch sizes Kafka's 4 MB limit gives
    py-spy record --native -o profile.svg -- python bench/worker_path.py LOG

What a worker does with a backlog, less the broker: the log's events routed to 4 partitions by request id (CRC-32),
read in rounds of one fetch per topic-partition (feedback before rankings in each round), each fetch decoded as
the worker decodes it (``decode_message_chunk``) and fed to a ``PartitionedEngine`` whose engines are built as the
worker builds them (live windows, feedback delays, regroup sinks), each finalised request written as the worker's
request-metrics record (``orjson``), the regroup records taken with their commit markers and fed to a regroup stage
held through ``StagePartitions``, as a worker's stage is, and a readout of every share (what ``/metrics`` exports) taken
every ``--readout-every`` CPU-seconds, as the worker takes one a second between batches. The compiled loops are loaded first (``warm_up``) and the
garbage collector is set as the worker sets it (``quiet_gc``). A log of ``bench/stream.py`` (``--out-dir``'s
``stream-log.jsonl``) gives the events the throughput rows count.
"""

from __future__ import annotations

import argparse
import time
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from stream_eval.config import Config
from stream_eval.engine.delays import FeedbackDelays
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.engine.labels import LabelBounds
from stream_eval.engine.partitions import PartitionedEngine
from stream_eval.engine.readout import Reader
from stream_eval.engine.regroup import RegroupSink
from stream_eval.engine.stages import StagePartitions
from stream_eval.engine.windows import RollingWindows
from stream_eval.events.messages import decode_message_chunk
from stream_eval.stream.app import quiet_gc
from stream_eval.stream.produce import END_WATERMARK
from stream_eval.stream.worker import warm_up

PARTITIONS = 4
KINDS = ("feedback", "ranking", "judgment")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("--rankings", type=int, default=5000, help="messages per fetch of a rankings partition")
    parser.add_argument("--feedback", type=int, default=5000, help="messages per fetch of a feedback partition")
    parser.add_argument("--readout-every", type=float, default=1.0,
                        help="CPU-seconds between two readouts of the shares, taken after a round (default 1)")
    args = parser.parse_args()
    config = Config()
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

    outputs: list[tuple[bytes, bytes]] = []

    def finalised(partition: int, batch: FinalisedBatch) -> None:
        outputs.extend((record["request_id"].encode(), orjson.dumps(record)) for record in batch.records())

    stages = StagePartitions(engine, PARTITIONS, 1)
    partitioned = PartitionedEngine(engine(), time.monotonic, finalised)
    partitioned.stage_engines = stages.engines
    for partition in range(PARTITIONS):
        partitioned.assign(partition)
    stages.take(0)
    messages: dict[tuple[str, int], list[bytes]] = defaultdict(list)
    for line in args.log.read_bytes().splitlines():
        fields: dict[str, Any] = orjson.loads(line)
        if fields["type"] in KINDS:
            key = str(fields.get("query_id" if fields["type"] == "judgment" else "request_id", ""))
            messages[fields["type"], zlib.crc32(key.encode()) % PARTITIONS].append(line)
    for kind in KINDS:
        for partition in range(PARTITIONS):
            messages[kind, partition].append(END_WATERMARK)
    size = {"ranking": args.rankings, "feedback": args.feedback, "judgment": args.rankings}
    read: dict[tuple[str, int], int] = defaultdict(int)
    regroup_log: list[bytes] = []
    cpu: dict[str, float] = defaultdict(float)
    events = 0
    reader = Reader(time.process_time)
    start = last_readout = time.process_time()
    more = True
    while more:
        more = False
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
        t0 = time.process_time()
        partitioned.tick()
        t1 = time.process_time()
        routed = [value for _, _, value in partitioned.take_routed(commit=True)]
        stages.feed(0, range(len(regroup_log), len(regroup_log) + len(routed)), routed)
        regroup_log += routed
        cpu["finalise"] += t1 - t0
        cpu["regroup records and stage"] += time.process_time() - t1
        if time.process_time() - last_readout >= args.readout_every or not more:
            t0 = last_readout = time.process_time()
            shares = [(str(p), "0", task.engine) for p, task in partitioned.engines()] + stages.shares()
            reader.read(stages.view(labels, partitioned.engine.watermark), shares)
            cpu["readouts"] += time.process_time() - t0
    total = time.process_time() - start
    phases = ", ".join(f"{name} {seconds:.2f}" for name, seconds in cpu.items())
    print(f"{events:,} messages, {len(outputs):,} request-metrics records, {len(regroup_log):,} regroup records")
    print(f"CPU {total:.2f} s: {events / total:,.0f} messages per CPU-second ({phases})")


if __name__ == "__main__":
    main()
