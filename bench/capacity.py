"""Capacity figures (issue 24, item 4): the per-stage CPU costs and state sizes that docs/capacity.md sizes from.

    python bench/capacity.py            # 60k requests (~300k events), 3 repeats of the stage breakdown; ~10 min
    python bench/capacity.py --quick    # 20k requests, 1 repeat, 50k units, 45 min of steady state

No broker: the worker's own objects, in this process (one core), fed the simulated traffic of ``bench/stream.py``
(``simulate_lines``, same seed), routed as the producer routes it (the key's murmur2 hash over 4 partitions, the
end-of-stream watermarks to every partition).

1. **Stages.** A ``StreamWorker`` (no broker; its four partitions assigned, as ``bench/stream.py``'s memory child
   builds it) is fed the traffic the way its loop is: in fetches of ``--fetch`` messages (the worker's
   ``max_records``, 20,000), each split by topic-partition, ``decode_messages`` + ``PartitionedEngine.feed`` per
   part, then ``tick``. After each tick the regroup records (``take_regrouped(commit=True)``) go to a
   ``SessionStage`` on the worker's stage engine, as they would through the one-partition regroup log. Every
   ``--checkpoint-every`` fetches (the worker checkpoints once a second) each partition's checkpoint is taken and
   encoded (``checkpoint(p).to_json()`` + ``orjson.dumps``; the windows as changes since a full share, as the
   worker stores them), and the stage's (its checkpoint + ``shares.take``). At the end, a snapshot of the stage's
   A/B state (``snapshot.take``). CPU time (``time.process_time``) is charged to the innermost of these sections:
   *decode* (``decode_messages``), *join* (``feed``), *finalise* (``tick`` less what is inside it below),
   *outputs* (the delivery's ``finalised``: a request-metrics record per request), *A/B records* (the partitions'
   ``RegroupSink.unit_requests`` / ``unit_sessions``), *stage* (``SessionStage.feed`` less the A/B units),
   *A/B units* (``SessionStage._add_units`` and ``UnitLedger.release``), *checkpoints*, *stage checkpoints*.
   What the worker does besides (aiokafka fetching and unpacking records, producing, fencing probes, /metrics
   readouts) is not here: it is the rest of the worker's measured CPU (``bench/stream.py``, ``bench/scale.py``).
2. **Re-read.** Before the end-of-stream watermarks, every partition's checkpoint is taken (every request is open:
   the traffic spans 5 minutes of event time, the attribution window 30), and a second worker takes the four
   partitions from those checkpoints and is fed the same messages: it re-reads them muted (rebuilds the joins,
   counts nothing) as a new owner after a rebalance does. Events re-read per CPU-second.
3. **A/B units.** A ``UnitLedger`` with the default metrics fed ``--units`` distinct units (one request each, the
   unit ids of ``simulate --unit user``'s form), released: bytes per unit by tracemalloc and by RSS (a fresh child
   process each, with the worker's malloc settings, ``tune_malloc``; RSS once the free heap pages are given back, as
   the worker does every minute, ``release_free_heap``, and before), and the compressed snapshot
   (``snapshot.take``) per unit.
4. **Stage state.** The regroup records of the traffic, with ``--stage-window`` s of attribution window (so that
   requests are finalised while the traffic runs) and the default 30-minute session gap, fed to a fresh stage in a
   child process under tracemalloc up to, not including, the end-of-stream watermarks: bytes per request held on
   the stage (session parts waiting, open sessions) and per open session.
5. **Steady state.** ``--steady-rate`` requests/s of event time for ``--steady-hours`` with the default settings
   (30-minute attribution window and session gap): what the four partitions hold (tracemalloc growth since the
   worker was built, and RSS) every 10 minutes of event time, once without the stage (its records dropped: what
   a worker without the stage holds) and once with it beside them (the difference: what the stage's worker holds
   more). What the engine holds is steady after ~62 minutes of event time (docs/design.md).

The Markdown report is printed and written to ``bench/out/capacity.md`` (``capacity-quick.md``), raw numbers beside.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import code_hash, fmt_num, machine_info, summary  # noqa: E402  (run.py also pins numpy to one thread)
from scale import machine_lines  # noqa: E402
from stream import PARTITIONS  # noqa: E402

MIB = 1 << 20
SECTIONS = ("decode", "join", "finalise", "outputs", "A/B records", "stage", "A/B units", "checkpoints",
            "stage checkpoints")


def log(message: str) -> None:
    print(f"[capacity {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ==========================================================================================================
# The traffic, as the worker's fetches deliver it
# ==========================================================================================================
Fetch = list[tuple[str, int, list[int], list[bytes], list[float]]]  # (kind, partition, offsets, values, Kafka ts)


class Traffic:
    """The simulated lines (``requests`` at ``rate`` per second of event time) routed to (topic kind, partition) with
    their offsets, as the producer routes them, in fetches of ``fetch`` messages (:meth:`fetches`, lazily); then
    :meth:`end`: the end-of-stream watermarks (``send_lines(..., flush=True)``: one to every partition of every
    topic). ``counts``: messages by kind, so far."""

    def __init__(self, requests: int, fetch: int, rate: float = 200.0) -> None:
        from stream_eval.stream.kafka import topics

        self.config_args = {"requests": requests, "items_per_request": 20, "seed": 11, "rate": rate}
        self.fetch = fetch
        self.names = topics("")
        self.kinds = dict(zip(self.names.inputs, ("ranking", "feedback", "judgment"), strict=True))
        self.offsets: Counter[tuple[str, int]] = Counter()
        self.counts: Counter[str] = Counter()
        self.last_ts = 0.0

    def _cut(self, items: list[tuple[str, int, int, bytes, float]]) -> Fetch:
        parts: dict[tuple[str, int], tuple[list[int], list[bytes], list[float]]] = {}
        for kind, p, offset, value, ts in items:
            part = parts.setdefault((kind, p), ([], [], []))
            part[0].append(offset)
            part[1].append(value)
            part[2].append(ts)
        # rankings first: in live traffic a request's ranking comes before its feedback (fed feedback first, a
        # fetch's feedback would all wait for rankings of the same fetch, on the join's slower path)
        order = {"ranking": 0, "feedback": 1, "judgment": 2}
        return [(kind, p, *part) for (kind, p), part in sorted(parts.items(), key=lambda kp: (order[kp[0][0]],
                                                                                               kp[0][1]))]

    def _to_all(self, value: bytes, ts: float) -> list[tuple[str, int, int, bytes, float]]:
        out = []
        for kind in self.kinds.values():
            for p in range(PARTITIONS):
                out.append((kind, p, self.offsets[kind, p], value, ts))
                self.offsets[kind, p] += 1
        return out

    def fetches(self) -> Iterator[Fetch]:
        from aiokafka.partitioner import DefaultPartitioner

        from stream_eval.simulate import SimulationConfig, simulate_lines
        from stream_eval.stream.produce import route_line

        choose = DefaultPartitioner()
        everything = list(range(PARTITIONS))
        pending: list[tuple[str, int, int, bytes, float]] = []
        for line in simulate_lines(SimulationConfig(**self.config_args)):  # type: ignore[arg-type]
            routed = route_line(line, self.names)
            if routed is None:
                continue
            ts = routed.ts if routed.ts is not None and math.isfinite(routed.ts) else self.last_ts
            self.last_ts = max(self.last_ts, ts)
            if routed.topic is None:  # a watermark line: to every partition of every input topic
                pending += self._to_all(routed.value, ts)
                self.counts["watermark"] += 1
            else:
                kind = self.kinds[routed.topic]
                p = choose(routed.key, everything, everything)
                pending.append((kind, p, self.offsets[kind, p], routed.value, ts))
                self.offsets[kind, p] += 1
                self.counts[kind] += 1
            if len(pending) >= self.fetch:
                yield self._cut(pending)
                pending = []
        if pending:
            yield self._cut(pending)

    def end(self) -> list[Fetch]:
        from stream_eval.stream.produce import END_WATERMARK

        return [self._cut(self._to_all(END_WATERMARK, self.last_ts))]

    @property
    def events(self) -> int:
        return sum(self.counts[k] for k in ("ranking", "feedback", "judgment"))


# ==========================================================================================================
# CPU time by section
# ==========================================================================================================
class Clock:
    """CPU seconds by section, each charged with its own time only (not that of the sections inside it)."""

    def __init__(self) -> None:
        self.own: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._stack: list[list[Any]] = []

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        started = time.process_time()
        self._stack.append([name, 0.0])
        try:
            yield
        finally:
            elapsed = time.process_time() - started
            _, inner = self._stack.pop()
            self.own[name] += elapsed - inner
            self.calls[name] += 1
            if self._stack:
                self._stack[-1][1] += elapsed

    def wrap(self, owner: Any, attribute: str, name: str) -> Callable[[], None]:
        """Charge every call of ``owner.attribute`` to ``name``; returns the undo."""
        original = getattr(owner, attribute)
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            with clock.section(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)
        return lambda: setattr(owner, attribute, original)


def new_worker(config: Any) -> Any:
    from stream_eval.stream.settings import WorkerSettings
    from stream_eval.stream.worker import StreamWorker

    worker = StreamWorker(WorkerSettings(brokers=["127.0.0.1:9"], partitions=PARTITIONS), config)
    # as if its broker had answered: a worker's sources are silent, and its partitions announce their finalisation
    # watermarks to the stage (every ANNOUNCE_EVERY s), only by a clock that runs while the broker is up
    worker.health.answered()
    return worker


def feed(worker: Any, fetch: Fetch) -> list[Any]:
    """One fetch through the worker's loop body (``StreamWorker._handle`` without aiokafka's records)."""
    from stream_eval.events.messages import decode_messages

    config = worker.config
    for kind, p, offsets, values, ts in fetch:
        events = decode_messages(values, kind, config, ts, [f"{kind}/{p}@{o}" for o in offsets])
        worker.partitioned.feed(kind, p, offsets, events)
    worker.partitioned.tick()
    return [value for _, value in worker.partitioned.take_regrouped(commit=True)]


def child_stages(requests: int, fetch_size: int, checkpoint_every: int) -> dict[str, Any]:
    """Section 1 and 2 of the module docstring, in this (fresh) process."""
    import orjson

    from stream_eval.config import Config
    from stream_eval.engine import shares, snapshot
    from stream_eval.engine.ab import UnitLedger
    from stream_eval.engine.regroup import RegroupSink, SessionStage
    from stream_eval.events.messages import decode_messages
    from stream_eval.stream.delivery import FencedLog

    warm = Traffic(2_000, fetch_size)  # numba's compiled loops loaded (or compiled) and every path run once
    warm_worker = new_worker(Config())
    for p in range(PARTITIONS):
        warm_worker.partitioned.assign(p)
    warm_stage = SessionStage(warm_worker.engine, PARTITIONS)
    warm_records = [value for fetch in [*warm.fetches(), *warm.end()] for value in feed(warm_worker, fetch)]
    warm_stage.feed(range(len(warm_records)), warm_records)
    orjson.dumps(warm_worker.partitioned.checkpoint(0).to_json())
    snapshot.take(warm_worker.engine)
    del warm_worker, warm_stage, warm_records
    source = Traffic(requests, fetch_size)
    fetches = list(source.fetches())
    marks, counts = source.end(), source.counts
    clock = Clock()
    undo = [clock.wrap(FencedLog, "finalised", "outputs"),
            clock.wrap(RegroupSink, "unit_requests", "A/B records"),
            clock.wrap(RegroupSink, "unit_sessions", "A/B records"),
            clock.wrap(SessionStage, "_add_units", "A/B units"),
            clock.wrap(UnitLedger, "release", "A/B units")]
    worker = new_worker(Config())
    for p in range(PARTITIONS):
        worker.partitioned.assign(p)
    stage = SessionStage(worker.engine, PARTITIONS)
    log_offset = 0
    opened = finalised_so_far = 0
    checkpoints: list[dict[str, Any]] = []
    stage_checkpoints: list[dict[str, Any]] = []
    windows_stored: set[int] = set()

    def run(fetch: Fetch) -> None:
        nonlocal log_offset, opened, finalised_so_far
        for kind, p, offsets, values, ts in fetch:
            opened += len(offsets) if kind == "ranking" else 0
            with clock.section("decode"):
                events = decode_messages(values, kind, worker.config, ts, [f"{kind}/{p}@{o}" for o in offsets])
            with clock.section("join"):
                worker.partitioned.feed(kind, p, offsets, events)
        with clock.section("finalise"):
            worker.partitioned.tick()
            records = [value for _, value in worker.partitioned.take_regrouped(commit=True)]
        finalised_so_far += len(worker.delivery.outbox.take().requests)  # (one record per request finalised)
        with clock.section("stage"):
            stage.feed(range(log_offset, log_offset + len(records)), records)
        log_offset += len(records)

    def checkpoint_all() -> None:
        open_requests = opened - finalised_so_far
        for p in range(PARTITIONS):
            started = time.process_time()
            with clock.section("checkpoints"):
                if p not in windows_stored:  # the worker stores a full windows share, then changes since it
                    orjson.dumps(worker.partitioned.windows_share(p))
                    worker.partitioned.windows_stored(p, (0, 0))
                    windows_stored.add(p)
                data = orjson.dumps(worker.partitioned.checkpoint(p).to_json())
            checkpoints.append({"seconds": time.process_time() - started, "bytes": len(data),
                                "open": open_requests})
        started = time.process_time()
        with clock.section("stage checkpoints"):
            data = orjson.dumps({**stage.checkpoint().to_json(), "share": shares.take(worker.engine, windows=True)})
        stage_checkpoints.append({"seconds": time.process_time() - started, "bytes": len(data)})

    started = time.process_time()
    for i, fetch in enumerate(fetches):
        run(fetch)
        if (i + 1) % checkpoint_every == 0:
            checkpoint_all()
    # every request is open here: the checkpoints a new owner would restore, and the re-read it would do
    before_end = {}
    for p in range(PARTITIONS):
        full = worker.partitioned.windows_share(p)  # (as the worker stores it: a full windows share, then changes)
        worker.partitioned.windows_stored(p, (0, 0))
        before_end[p] = (worker.partitioned.checkpoint(p), full)
    for fetch in marks:
        run(fetch)
    checkpoint_all()
    total = time.process_time() - started
    for restore in undo:
        restore()
    units = sum(n for arms in worker.engine.ledger.units().values() for n in arms.values())
    started = time.process_time()
    snap = snapshot.take(worker.engine)
    snapshot_seconds = time.process_time() - started
    finalised = worker.totals().overall().requests
    events = sum(counts[k] for k in ("ranking", "feedback", "judgment"))

    # 2. a new owner of the four partitions re-reads everything up to the checkpoints, muted
    reader = new_worker(Config())
    for p, (checkpoint, full) in before_end.items():
        reader.partitioned.assign(p, checkpoint, full)
    started = time.process_time()
    decode_seconds = 0.0
    for fetch in fetches:
        for kind, p, offsets, values, ts in fetch:
            t0 = time.process_time()
            decoded = decode_messages(values, kind, reader.config, ts, [f"{kind}/{p}@{o}" for o in offsets])
            decode_seconds += time.process_time() - t0
            reader.partitioned.feed(kind, p, offsets, decoded)
        reader.partitioned.tick()
        reader.partitioned.take_regrouped(commit=True)
    reread = time.process_time() - started
    rebuilt = all(not unit.rebuilding for _, unit in reader.partitioned.engines())
    return {
        "events": events, "requests": counts["ranking"], "counts": dict(counts), "finalised": finalised,
        "fetches": len(fetches), "seconds": sum(clock.own.values()), "wall_cpu": total, "own": dict(clock.own),
        "calls": dict(clock.calls),
        "checkpoints": checkpoints, "stage_checkpoints": stage_checkpoints,
        "units": units, "snapshot_bytes": len(snap), "snapshot_seconds": snapshot_seconds,
        "reread": {"seconds": reread, "decode": decode_seconds, "events": events, "rebuilt": rebuilt},
    }


def child_units(units: int, traced: bool) -> dict[str, Any]:
    """Section 3: bytes per A/B unit of a ledger with the default metrics (one request per unit)."""
    import numpy as np

    from stream_eval.config import Config
    from stream_eval.engine import snapshot
    from stream_eval.engine.engine import Engine
    from stream_eval.stream.app import release_free_heap, tune_malloc

    tune_malloc()  # (as stream-eval worker runs)
    engine = Engine(Config())
    ledger = engine.ledger
    width = ledger.width - 1  # the per-request columns (GAUC is the last)
    rng = np.random.default_rng(5)
    batch = 10_000

    def add(lo: int, hi: int) -> None:
        n = hi - lo
        ids = [f"r{i:09d}" for i in range(lo, hi)]
        unit_ids = [f"user-{i:08d}" for i in range(lo, hi)]
        arms = ["control" if i % 2 else "treatment" for i in range(lo, hi)]
        ledger.add_requests(np.arange(lo, hi, dtype=np.float64), ids, ["exp1"] * n, arms, unit_ids,
                            rng.random((n, width)))
        ledger.release(float(hi))

    add(0, batch)  # warm: the experiment exists, arrays allocated once
    gc.collect()
    if traced:
        tracemalloc.start()
    before, traced0 = rss(), tracemalloc.get_traced_memory()[0] if traced else 0
    for lo in range(batch, units + batch, batch):
        add(lo, lo + batch)
    gc.collect()
    untrimmed = rss()
    release_free_heap()  # (the worker's every RELEASE_HEAP_EVERY seconds)
    out: dict[str, Any] = {"units": units, "width": ledger.width, "rss_per_unit": (rss() - before) / units,
                           "rss_per_unit_untrimmed": (untrimmed - before) / units}
    if traced:
        out["traced_per_unit"] = (tracemalloc.get_traced_memory()[0] - traced0) / units
        tracemalloc.stop()
    else:
        started = time.process_time()
        data = snapshot.take(engine)
        out["snapshot_per_unit"] = len(data) / (units + batch)
        out["snapshot_seconds_per_unit"] = (time.process_time() - started) / (units + batch)
    out["total_units"] = sum(n for arms in ledger.units().values() for n in arms.values())
    return out


def child_stage_state(requests: int, fetch_size: int, window: float) -> dict[str, Any]:
    """Section 4: what the regroup stage holds per request while sessions are open (tracemalloc)."""
    from stream_eval.config import Config
    from stream_eval.engine.regroup import SessionStage

    config = Config(attribution_window=window)
    source = Traffic(requests, fetch_size)
    counts = source.counts
    worker = new_worker(config)
    for p in range(PARTITIONS):
        worker.partitioned.assign(p)
    records: list[bytes] = []
    for fetch in source.fetches():
        records += feed(worker, fetch)
        worker.delivery.outbox.take()
    finalised = worker.totals().overall().requests
    del worker
    gc.collect()
    stage_engine = new_worker(config).engine
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    stage = SessionStage(stage_engine, PARTITIONS)
    stage.feed(range(len(records)), records)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    open_sessions = len(stage_engine.sessions.open)
    waiting = len(stage._waiting)
    units = sum(n for arms in stage_engine.ledger.units().values() for n in arms.values())
    added = finalised - waiting
    return {"requests": counts["ranking"], "finalised": finalised, "records": len(records),
            "record_bytes": sum(map(len, records)), "waiting": waiting, "open_sessions": open_sessions,
            "added": added, "held_bytes": held, "units": units, "window": window, "session_gap": config.session_gap}


def short_path(filename: str) -> str:
    """A source file's name without this machine's directories: from the package (``stream_eval/...``) or from
    ``site-packages`` on."""
    for mark in ("site-packages/", "stream_eval/"):
        if mark in filename:
            return (mark if mark == "stream_eval/" else "") + filename.rsplit(mark, 1)[1]
    return filename.rsplit("/", 1)[-1]


def child_steady(rate: float, seconds: float, fetch_size: int, stage_on: bool) -> dict[str, Any]:
    """Section 5: what the worker's partitions hold (and, with ``stage_on``, the regroup stage beside them) fed
    ``seconds`` of event time at ``rate`` requests/s with the default settings (30-minute attribution window and
    session gap), sampled every 10 minutes of event time (tracemalloc, and RSS)."""
    from stream_eval.config import Config
    from stream_eval.engine.regroup import SessionStage

    source = Traffic(int(rate * seconds), fetch_size, rate)
    worker = new_worker(Config())
    for p in range(PARTITIONS):
        worker.partitioned.assign(p)
    stage = SessionStage(worker.engine, PARTITIONS) if stage_on else None
    tracemalloc.start()
    base_traced, base_rss = tracemalloc.get_traced_memory()[0], rss()
    samples: list[tuple[float, float, float]] = []  # (event time since the first event, traced MB growth, RSS MB)
    first_ts: float | None = None
    offset = 0
    for fetch in source.fetches():
        records = feed(worker, fetch)
        worker.delivery.outbox.take()
        if stage is not None:
            stage.feed(range(offset, offset + len(records)), records)
            offset += len(records)
        if first_ts is None:
            first_ts = source.last_ts
        if source.last_ts - first_ts >= 600 * (len(samples) + 1):
            samples.append((source.last_ts - first_ts, (tracemalloc.get_traced_memory()[0] - base_traced) / MIB,
                            rss() / MIB))
    # where the held memory is, by source file (the largest ten), in MB
    held = tracemalloc.take_snapshot()
    by_file = [(short_path(stat.traceback[0].filename), stat.size / MIB) for stat in held.statistics("filename")[:10]]
    by_line = [(f"{short_path(stat.traceback[0].filename)}:{stat.traceback[0].lineno}", stat.size / MIB, stat.count)
               for stat in held.statistics("lineno")[:20]]
    units = sum(n for arms in worker.engine.ledger.units().values() for n in arms.values())
    return {"rate": rate, "seconds": seconds, "stage": stage_on, "samples": samples, "events": source.events,
            "by_file": by_file, "by_line": by_line,
            "base_rss_mb": base_rss / MIB, "units": units,
            "open_sessions": len(worker.engine.sessions.open) if stage_on else 0,
            "finalised": worker.totals().overall().requests}


# ==========================================================================================================
# Driver
# ==========================================================================================================
def child(kind: str, *args: Any) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} child exited {proc.returncode}: {proc.stderr.decode()[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return result


def render(results: dict[str, Any], machine: dict[str, Any], args: argparse.Namespace) -> str:
    out = [f"## Capacity figures{' (quick)' if args.quick else ''}: {machine['date']}", "", *machine_lines(machine)]
    runs = results["stages"]
    first = runs[0]
    events, requests = first["events"], first["requests"]
    out.append(f"### Stages: {events:,} events ({requests:,} requests), fetches of {args.fetch:,} messages, "
               f"{len(runs)} runs (median, min–max)")
    out.append("")
    out.append("| Section | CPU s | share | events per CPU-second | requests per CPU-second |")
    out.append("|---|---|---|---|---|")
    for name in [*SECTIONS, "all"]:
        secs = [r["seconds"] if name == "all" else r["own"].get(name, 0.0) for r in runs]
        s = summary(secs)
        share = statistics.median(x / r["seconds"] for x, r in zip(secs, runs, strict=True))
        per_event = summary([events / x if x > 0 else math.inf for x in secs])
        per_request = summary([requests / x if x > 0 else math.inf for x in secs])
        out.append(f"| {name} | {s['median']:.3f} ({s['min']:.3f}–{s['max']:.3f}) | {100 * share:.1f} % "
                   f"| {fmt_num(per_event['median'])} ({fmt_num(per_event['min'])}–{fmt_num(per_event['max'])}) "
                   f"| {fmt_num(per_request['median'])} |")
    out.append("")
    ck = [c for r in runs for c in r["checkpoints"]]
    sck = [c for r in runs for c in r["stage_checkpoints"]]
    out.append(f"Partition checkpoints: {len(ck)} taken (every {args.checkpoint_every} fetches, 4 partitions), "
               f"median {1000 * statistics.median(c['seconds'] for c in ck):.2f} ms and "
               f"{statistics.median(c['bytes'] for c in ck):,.0f} bytes each (max "
               f"{1000 * max(c['seconds'] for c in ck):.1f} ms, {max(c['bytes'] for c in ck):,} bytes; open requests "
               f"up to {max(c['open'] for c in ck):,}); stage checkpoints median "
               f"{1000 * statistics.median(c['seconds'] for c in sck):.2f} ms, "
               f"{statistics.median(c['bytes'] for c in sck):,.0f} bytes. A/B snapshot at the end: "
               f"{first['units']:,} units, {first['snapshot_bytes']:,} bytes, "
               f"{1000 * statistics.median(r['snapshot_seconds'] for r in runs):.1f} ms.")
    out.append("")
    rr = [r["reread"] for r in runs]
    out.append(f"Re-read by a new owner (muted, from checkpoints taken with every request open): "
               f"{fmt_num(statistics.median(x['events'] / x['seconds'] for x in rr))} events per CPU-second "
               f"(decode {fmt_num(statistics.median(x['events'] / x['decode'] for x in rr))}/s of it); rebuilt: "
               f"{all(x['rebuilt'] for x in rr)}.")
    out.append("")
    units = results["units"]
    out.append(f"### A/B units: {units['rss']['units']:,} units of one request each, {units['rss']['width']} "
               f"columns (the default metrics + GAUC)")
    out.append("")
    out.append(f"RSS **{units['rss']['rss_per_unit']:,.0f} bytes per unit** once the free heap pages are given back "
               f"({units['rss'].get('rss_per_unit_untrimmed', math.nan):,.0f} before), tracemalloc "
               f"{units['traced']['traced_per_unit']:,.0f}; snapshot {units['rss']['snapshot_per_unit']:,.0f} bytes "
               f"per unit (compressed), taken at {1e6 * units['rss']['snapshot_seconds_per_unit']:.2f} µs per unit.")
    out.append("")
    st = results["stage_state"]
    out.append(f"### Stage state: attribution window {st['window']:g} s, session gap {st['session_gap']:g} s")
    out.append("")
    out.append(f"{st['finalised']:,} of {st['requests']:,} requests finalised before the end of the traffic, "
               f"{st['records']:,} regroup records ({st['record_bytes'] / max(1, st['finalised']):,.0f} bytes per "
               f"finalised request); on the stage: {st['open_sessions']:,} open sessions, {st['waiting']:,} session "
               f"parts waiting. Held: {st['held_bytes'] / MIB:.1f} MB = **{st['held_bytes'] / st['finalised']:,.0f} "
               f"bytes per finalised request**, "
               + (f"{st['held_bytes'] / st['open_sessions']:,.0f} per open session" if st['open_sessions'] else
                  "no open session to divide by")
               + f"; A/B units on the stage: {st['units']:,}.")
    out.append("")
    out.append(f"### Steady state: {args.steady_rate:g} requests/s of event time for {args.steady_hours:g} h, the "
               f"default settings: MB held (tracemalloc, growth since the worker was built) and the process's RSS, "
               f"every 10 min of event time")
    out.append("")
    out.append("| run | " + " | ".join(f"{t / 60:.0f} min" for t, _, _ in results["steady"]["partitions"]["samples"])
               + " | per request/s at the end |")
    out.append("|---|" + "---|" * (len(results["steady"]["partitions"]["samples"]) + 1))
    for name, r in results["steady"].items():
        last = r["samples"][-1]
        out.append(f"| {name}, traced | " + " | ".join(f"{m:.0f}" for _, m, _ in r["samples"])
                   + f" | {last[1] * MIB / r['rate'] / 1e6:.2f} MB |")
        out.append(f"| {name}, RSS | " + " | ".join(f"{m:.0f}" for _, _, m in r["samples"]) + " | |")
    for name, r in results["steady"].items():
        out.append("")
        out.append(f"Held at the end, {name}, by source file (MB): "
                   + ", ".join(f"`{where}` {mb:.0f}" for where, mb in r.get("by_file", [])) + ".")
    stage_run = results["steady"]["with stage"]
    out.append("")
    out.append(f"With the stage: {stage_run['units']:,} A/B units (cumulative), {stage_run['open_sessions']:,} open "
               f"sessions at the end; the process's RSS once the worker was built (imports, before any event) "
               f"{stage_run['base_rss_mb']:.0f} MB.")
    out.append("")
    return "\n".join(out)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="capacity figures of the worker's stages (docs/capacity.md)")
    p.add_argument("--quick", action="store_true", help="20k requests, 1 run, 50k units")
    p.add_argument("--requests", type=int, help="requests of the traffic (60,000 = ~300k events; --quick: 20,000)")
    p.add_argument("--repeat", type=int, help="runs of the stage breakdown (default 3; 1 with --quick)")
    p.add_argument("--fetch", type=int, default=20_000, help="messages per fetch (the worker's max_records)")
    p.add_argument("--checkpoint-every", type=int, default=2, help="fetches between checkpoints (default 2)")
    p.add_argument("--units", type=int, help="A/B units (default 500,000; 50,000 with --quick)")
    p.add_argument("--stage-window", type=float, default=20.0,
                   help="attribution window (s) of the stage-state run (default 20)")
    p.add_argument("--steady-rate", type=float, default=20.0, help="requests/s of the steady-state runs (20)")
    p.add_argument("--steady-hours", type=float, help="hours of event time of the steady-state runs (1.25; 0.75 "
                                                      "with --quick); the engine is steady after ~62 min")
    p.add_argument("--out-dir", default=str(HERE / "out"))
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.requests = args.requests or (20_000 if args.quick else 60_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.units = args.units or (50_000 if args.quick else 500_000)
    args.steady_hours = args.steady_hours or (0.75 if args.quick else 1.25)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "stages":
            result = child_stages(int(rest[0]), int(rest[1]), int(rest[2]))
        elif kind == "units":
            result = child_units(int(rest[0]), bool(int(rest[1])))
        elif kind == "steady":
            result = child_steady(float(rest[0]), float(rest[1]), int(rest[2]), bool(int(rest[3])))
        else:
            result = child_stage_state(int(rest[0]), int(rest[1]), float(rest[2]))
        print(json.dumps(result), flush=True)
        return 0
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    started = time.perf_counter()
    results: dict[str, Any] = {"stages": []}
    for i in range(args.repeat):
        results["stages"].append(child("stages", args.requests, args.fetch, args.checkpoint_every))
        r = results["stages"][-1]
        log(f"stages {i + 1}: {r['events'] / r['seconds']:,.0f} events per CPU-second in all; "
            + ", ".join(f"{k} {v:.2f} s" for k, v in r["own"].items()))
    results["units"] = {"rss": child("units", args.units, 0), "traced": child("units", args.units, 1)}
    log(f"units: {results['units']['rss']['rss_per_unit']:.0f} bytes RSS, "
        f"{results['units']['traced']['traced_per_unit']:.0f} traced per unit")
    results["stage_state"] = child("stage_state", args.requests, args.fetch, args.stage_window)
    results["steady"] = {}
    for stage_on in (0, 1):
        r = results["steady"]["with stage" if stage_on else "partitions"] = child(
            "steady", args.steady_rate, args.steady_hours * 3600, args.fetch, stage_on)
        log(f"steady state{' with the stage' if stage_on else ''}: {r['samples'][-1][1]:.0f} MB traced, "
            f"{r['samples'][-1][2]:.0f} MB RSS after {r['seconds'] / 3600:g} h at {r['rate']:g} requests/s")
    log(f"stage state: {results['stage_state']['held_bytes'] / results['stage_state']['finalised']:.0f} bytes per "
        f"finalised request")
    machine["loadavg_end"] = os.getloadavg()
    machine["code_hash_end"] = code_hash()
    machine["bench_seconds"] = time.perf_counter() - started
    text = render(results, machine, args)
    name = "capacity-quick" if args.quick else "capacity"
    (Path(args.out_dir) / f"{name}.md").write_text(text + "\n")
    (Path(args.out_dir) / f"{name}.json").write_text(
        json.dumps({"machine": machine, "args": vars(args), "results": results}, indent=1, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
