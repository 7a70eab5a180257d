"""Soak: the worker under steady simulated traffic for a long time, scraped like Prometheus would.

    python bench/soak.py                 # 30 min at 3,000 events/s, scrapes every 5 s
    python bench/soak.py --minutes 3     # a short run (smoke)

A Tansu broker on a free port, one ``stream-eval worker`` child and ``stream-eval simulate --broker --requests 0
--rate N`` (live traffic, event time = wall clock, users as randomisation units) as another child. Short horizons
(attribution window 60 s, allowed lateness 5 s, session gap 60 s, GSB window 60 s) so that the worker's steady
state (open requests, sessions, windows of 5 m / 1 h) is reached in minutes. Two things grow by design: the 1 h
window's buckets fill for an hour (a few KB a minute), and the A/B units are cumulative (the simulator brings new
users all the time, ~360 bytes each, up to ``max_units``).

Every ``--scrape-every`` s this process scrapes ``/metrics`` (timing it) and reads the worker's RSS, open file
descriptors and threads from ``/proc``. Warm-up is the first ``--warmup`` minutes (default 5). The report compares
the warm-up's end with the end: RSS (target: at most +10 %), file descriptors and threads (no growth), scrape time
(stable: median of the first and last 5 minutes after warm-up), and events counted per second against the
producer's rate (the worker keeps up). Written to ``bench/out/soak.md`` (raw series in ``soak.json``, the worker's
log in ``worker.log``).

The worker runs under a probe (this file with ``--as-worker``): a thread that writes, every ``--scrape-every`` s, the
number of live asyncio tasks to ``probe.jsonl`` (the soak's tasks column). For finding what grows:
``--sizes-every MIN`` has it also write, every MIN minutes, the count of objects per type and the length (or array
bytes) of every container the worker's objects hold, cheaply enough for a measured run; ``--trace-every MIN`` adds
a tracemalloc snapshot (tracing slows the worker down: diagnosis only). The report then lists what grew most between
the warm-up's end and the end.

    python bench/soak.py --minutes 8 --warmup 3 --sizes-every 1 --out-dir "$(mktemp -d)"
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import gc
import json
import math
import os
import runpy
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import machine_info  # noqa: E402
from stream import cpu_seconds, progress, scrape  # noqa: E402

from stream_eval.stream.broker import Broker, free_port, stop_process  # noqa: E402

SETTINGS = {
    "STREAM_EVAL_ATTRIBUTION_WINDOW": "60",
    "STREAM_EVAL_ALLOWED_LATENESS": "5",
    "STREAM_EVAL_SESSION_GAP": "60",
    "STREAM_EVAL_GSB_WINDOW": "60",
}
TARGET_RSS_GROWTH = 0.10


def _proc(pid: int) -> tuple[float, int, int]:
    """RSS in MB, open file descriptors and threads of a process."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss / 1024.0, len(os.listdir(f"/proc/{pid}/fd")), threads


def _live_tasks() -> int:
    """Asyncio tasks not done, in every loop of the process (read from another thread: asyncio's registry of tasks
    is a WeakSet that the loop's thread may change meanwhile, hence the retries)."""
    for _ in range(10):
        try:
            return sum(1 for task in list(asyncio.tasks._all_tasks) if not task.done())  # private: no public API
        except RuntimeError:  # changed size during iteration
            time.sleep(0.01)
    return -1


def _sizes(obj: Any, path: str, out: dict[str, float], seen: set[int], depth: int = 4) -> None:
    """Lengths of the containers (bytes of the arrays) held by ``obj`` and, recursively, by the stream_eval
    objects it holds: what grows among them is what the worker keeps."""
    if id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    fields = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(obj, name):
                fields[name] = getattr(obj, name)
    for name, value in fields.items():
        where = f"{path}.{name}"
        if hasattr(value, "nbytes") and hasattr(value, "shape"):
            out[where] = float(value.nbytes)
        elif isinstance(value, (list, dict, set, frozenset, collections.deque, bytearray, bytes)) or \
                type(value).__name__ == "array":
            out[where] = float(len(value))
            if isinstance(value, dict) and value and len(value) <= 64:
                for key, item in list(value.items()):
                    if type(item).__module__.startswith("stream_eval"):
                        _sizes(item, f"{where}[{key}]", out, seen, depth - 1)
            elif isinstance(value, list) and value and len(value) <= 64:
                for k, item in enumerate(list(value)):
                    if type(item).__module__.startswith("stream_eval") or isinstance(item, tuple):
                        for part in item if isinstance(item, tuple) else (item,):
                            if type(part).__module__.startswith("stream_eval"):
                                _sizes(part, f"{where}[{k}]", out, seen, depth - 1)
        elif type(value).__module__.startswith("stream_eval"):
            _sizes(value, where, out, seen, depth - 1)


def _worker_sizes() -> dict[str, float]:
    """:func:`_sizes` of the process's ``StreamWorker`` (read under its lock), largest first."""
    workers = [o for o in gc.get_objects() if type(o).__name__ == "StreamWorker"]
    out: dict[str, float] = {}
    for worker in workers:
        with worker.lock:
            _sizes(worker, "worker", out, set())
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:400])


def _heap() -> dict[str, float]:
    """glibc's view of the heap (``mallinfo2``), MB: in use, free inside it, and mapped blocks ({} elsewhere)."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return {"heap_used_mb": info.uordblks / 2**20, "heap_free_mb": info.fordblks / 2**20,
            "mmap_mb": info.hblkhd / 2**20}


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return math.nan


def _trimmed() -> dict[str, float]:
    """Diagnosis: RSS before and after glibc's ``malloc_trim(0)`` (how much of it is free heap pages)."""
    import ctypes

    before = _rss_mb()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return {}
    return {"rss_before_trim_mb": before, "rss_after_trim_mb": _rss_mb()}


def _probe(out: Path, every: float, trace_every: float, trim: bool) -> None:
    """The probe thread of a worker run with ``--as-worker`` (see the module docstring)."""
    start = time.monotonic()
    next_trace = start + trace_every if trace_every else math.inf
    dumps = 0
    with (out / "probe.jsonl").open("a") as lines:
        while True:
            time.sleep(every)
            now = time.monotonic()
            row: dict[str, Any] = {"t": round(now - start, 1), "tasks": _live_tasks(), **_heap()}
            if tracemalloc.is_tracing():
                row["traced_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
            if now >= next_trace:
                next_trace += trace_every
                if tracemalloc.is_tracing():
                    tracemalloc.take_snapshot().dump(str(out / f"trace-{dumps:03d}.tracemalloc"))
                    row["trace"] = dumps
                row["types"] = dict(collections.Counter(type(o).__name__ for o in gc.get_objects()).most_common(40))
                row["sizes"] = _worker_sizes()
                if trim:
                    row.update(_trimmed())
                dumps += 1
            lines.write(json.dumps(row) + "\n")
            lines.flush()


def as_worker(argv: list[str]) -> None:
    """``--as-worker OUT EVERY TRACE_EVERY SIZES_EVERY trim|no-trim -- ARGS``: ``stream-eval ARGS`` with the probe
    thread writing to OUT."""
    out, every, trace_every, sizes_every = Path(argv[0]), float(argv[1]), float(argv[2]) * 60, float(argv[3]) * 60
    trim = argv[4] == "trim"
    sys.path.remove(str(HERE))  # the worker imports nothing from bench/
    if trace_every:
        tracemalloc.start(1)
    trace_every = trace_every or sizes_every
    threading.Thread(target=_probe, args=(out, every, trace_every, trim), name="soak-probe", daemon=True).start()
    sys.argv = ["stream-eval", *argv[argv.index("--") + 1:]]
    runpy.run_module("stream_eval.cli", run_name="__main__")


def _last_probe(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError:
        return {}
    lines = text.splitlines()
    return json.loads(lines[-1]) if lines and text.endswith("\n") else {}


def _growth(out: Path, rows: list[dict[str, Any]], warm: float) -> list[str]:
    """What grew most from the first deep probe after the warm-up to the last: allocation sites (tracemalloc), the
    worker's containers and the objects per type."""
    deep = [r for r in rows if "types" in r]
    after = [r for r in deep if r["t"] >= warm]
    if len(after) < 2:
        after = deep[-2:]
    if len(after) < 2:
        return []
    first, last = after[0], after[-1]
    lines = ["", f"Growth from {first['t'] / 60:.1f} to {last['t'] / 60:.1f} min:"]
    if "trace" in first and "trace" in last:
        old = tracemalloc.Snapshot.load(str(out / f"trace-{first['trace']:03d}.tracemalloc"))
        new = tracemalloc.Snapshot.load(str(out / f"trace-{last['trace']:03d}.tracemalloc"))
        lines += ["", f"Allocation sites (tracemalloc; traced {first.get('traced_mb', 0):.0f} -> "
                  f"{last.get('traced_mb', 0):.0f} MB):", ""]
        for stat in new.compare_to(old, "lineno")[:25]:
            frame = stat.traceback[0]
            lines.append(f"    {stat.size_diff / 2**20:+8.2f} MB {stat.count_diff:+9d} blocks  "
                         f"{frame.filename.rpartition('site-packages/')[2]}:{frame.lineno}")
    sizes = sorted(((n - first["sizes"].get(k, 0), k, n) for k, n in last.get("sizes", {}).items()),
                   key=lambda row: -abs(row[0]))[:25]
    lines += ["", "The worker's containers (growth, length or array bytes at the end):", ""]
    lines += [f"    {diff:+12,.0f} {name} ({n:,.0f})" for diff, name, n in sizes if diff]
    types = sorted(((n - first["types"].get(k, 0), k, n) for k, n in last["types"].items()), reverse=True)[:15]
    lines += ["", "Objects per type (growth, count at the end):", ""]
    lines += [f"    {diff:+9d} {name} ({n})" for diff, name, n in types]
    return lines


def soak(args: argparse.Namespace) -> dict[str, Any]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("STREAM_EVAL_")}, **SETTINGS}
    if args.max_units:
        env["STREAM_EVAL_MAX_UNITS"] = str(args.max_units)
    command = [sys.executable, "-m", "stream_eval.cli"]
    rows: list[dict[str, Any]] = []
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    probe = out / "probe.jsonl"
    probe.unlink(missing_ok=True)
    with Broker(free_port()) as broker, (out / "worker.log").open("wb") as worker_log:
        port = free_port()
        wrapper = [sys.executable, __file__, "--as-worker", str(out), str(args.scrape_every), str(args.trace_every),
                  str(args.sizes_every), "trim" if args.trim else "no-trim", "--"]
        worker = subprocess.Popen([*wrapper, "worker", "--broker", broker.url, "--metrics-port", str(port),
                                   "--topic-prefix", "soak.", "--group", "soak"], env=env,
                                  stdin=subprocess.DEVNULL, stdout=worker_log, stderr=subprocess.STDOUT)
        traffic = subprocess.Popen([*command, "simulate", "--broker", broker.url, "--requests", "0", "--rate",
                                    str(args.rate), "--topic-prefix", "soak.", "--unit", "user"], env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}/metrics"
        start = time.monotonic()
        end = start + args.minutes * 60
        try:
            while time.monotonic() < end:
                tick = time.monotonic()
                for name, proc in (("worker", worker), ("simulate", traffic)):
                    if proc.poll() is not None:
                        raise RuntimeError(f"{name} exited with {proc.returncode}")
                try:
                    before = time.perf_counter()
                    text = scrape(url)
                    seconds = time.perf_counter() - before
                except OSError:
                    time.sleep(1)
                    continue
                rss, fds, threads = _proc(worker.pid)
                events, requests = progress(text)
                units = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                            if line.startswith("stream_eval_ab_units{"))
                probed = _last_probe(probe)
                rows.append({"t": round(tick - start, 1), "rss_mb": rss, "fds": fds, "threads": threads,
                             "tasks": probed.get("tasks", math.nan), "heap_mb": probed.get("heap_used_mb", math.nan),
                             "scrape_s": seconds, "scrape_bytes": len(text),
                             "events": events, "requests": requests, "units": units,
                             "cpu_s": {"worker": cpu_seconds(worker.pid), "simulate": cpu_seconds(traffic.pid),
                                       "broker": cpu_seconds(broker.process.pid) if broker.process else math.nan}})
                time.sleep(max(0.0, args.scrape_every - (time.monotonic() - tick)))
        finally:
            stop_process(traffic)
            stop_process(worker)
    probes = [json.loads(line) for line in probe.read_text().splitlines() if line.strip()] if probe.exists() else []
    return {"rows": rows, "args": vars(args), "probes": probes}


def _window(rows: list[dict[str, float]], start: float, end: float) -> list[dict[str, float]]:
    return [r for r in rows if start <= r["t"] < end]


def _cpu_lines(rows: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    """Cores used by the worker, the broker and the simulator, each minute after the warm-up, and the counted
    events/s beside them: whether a minute that fell behind was the worker's or the broker's (rows of runs before
    2026-12-03 have no CPU)."""
    if not after or "cpu_s" not in after[0]:
        return []
    out = ["Each minute after the warm-up: events counted per second; cores used by the worker, the broker, the "
           "simulator.", "", "| minute | events/s counted | worker | broker | simulator |", "|---|---|---|---|---|"]
    times = [r["t"] for r in rows]
    start = after[0]["t"]
    while start + 60 <= rows[-1]["t"]:
        a, b = rows[bisect.bisect_left(times, start)], rows[min(len(rows) - 1, bisect.bisect_left(times, start + 60))]
        dt = b["t"] - a["t"]
        if dt <= 0:
            break
        cores = [(b["cpu_s"][name] - a["cpu_s"][name]) / dt for name in ("worker", "broker", "simulate")]
        out.append(f"| {a['t'] / 60:.0f} | {(b['events'] - a['events']) / dt:,.0f} | "
                   + " | ".join(f"{c:.2f}" for c in cores) + " |")
        start += 60
    return [*out, ""]


def render(result: dict[str, Any], machine: dict[str, Any], out: Path) -> str:
    rows, args = result["rows"], result["args"]
    warm = args["warmup"] * 60
    last = rows[-1]["t"]
    after = [r for r in rows if r["t"] >= warm]
    if len(after) < 4:
        raise RuntimeError("too short a run after the warm-up")
    span = min(300.0, (last - warm) / 2)
    first, final = _window(rows, warm, warm + span), _window(rows, last - span, last + 1)

    def med(part: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in part)

    def flat(key: str) -> str:  # (aiokafka's tasks come and go: 66-70 at any time)
        return "flat" if med(final, key) <= max(r[key] for r in first) else "GREW"

    rss_warm, rss_end = med(first, "rss_mb"), med(final, "rss_mb")
    growth = rss_end / rss_warm - 1.0
    result["passed"] = growth <= TARGET_RSS_GROWTH and all(flat(key) == "flat" for key in ("fds", "threads", "tasks"))
    rate = (after[-1]["events"] - after[0]["events"]) / (after[-1]["t"] - after[0]["t"])
    lines = [
        f"# Soak: {args['minutes']:g} min at {args['rate']:,.0f} events/s, scrapes every {args['scrape_every']:g} s",
        "",
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        f"Warm-up: first {args['warmup']:.1f} min; compared: the first and last {span / 60:.1f} min after it "
        f"(medians of {len(first)} and {len(final)} scrapes).",
        "",
        "| | after warm-up | at the end | change |",
        "|---|---|---|---|",
        f"| worker RSS, MB | {rss_warm:.0f} | {rss_end:.0f} | {100 * growth:+.1f} % (target ≤ +10 %) |",
        f"| open file descriptors | {med(first, 'fds'):.0f} | {med(final, 'fds'):.0f} | "
        f"max {max(r['fds'] for r in after)} |",
        f"| threads | {med(first, 'threads'):.0f} | {med(final, 'threads'):.0f} | "
        f"max {max(r['threads'] for r in after)} |",
        f"| asyncio tasks | {med(first, 'tasks'):.0f} | {med(final, 'tasks'):.0f} | "
        f"max {max(r['tasks'] for r in after):.0f} |",
        f"| glibc heap in use, MB (part of the RSS) | {med(first, 'heap_mb'):.0f} | {med(final, 'heap_mb'):.0f} | "
        f"{100 * (med(final, 'heap_mb') / med(first, 'heap_mb') - 1):+.1f} % |",
        f"| scrape time, ms | {1000 * med(first, 'scrape_s'):.1f} | {1000 * med(final, 'scrape_s'):.1f} | "
        f"max {1000 * max(r['scrape_s'] for r in after):.0f} |",
        f"| A/B units (all arms) | {med(first, 'units'):,.0f} | {med(final, 'units'):,.0f} | "
        f"max_units {args.get('max_units') or 'default'} per experiment |",
        f"| /metrics size, KB | {med(first, 'scrape_bytes') / 1024:.0f} | {med(final, 'scrape_bytes') / 1024:.0f} | |",
        "",
        f"Events counted after warm-up: {rate:,.0f}/s for {args['rate']:,.0f}/s produced; requests finalised: "
        f"{after[-1]['requests']:,.0f} in all.",
        "",
        *_cpu_lines(rows, after),
        f"Verdict: RSS {'flat' if growth <= TARGET_RSS_GROWTH else 'GREW'} ({100 * growth:+.1f} %); "
        f"file descriptors {flat('fds')}; threads {flat('threads')}; asyncio tasks {flat('tasks')} (grew: the last "
        f"minutes' median above the largest value just after the warm-up).",
        *_growth(out, result.get("probes", []), warm),
    ]
    trims = [r for r in result.get("probes", []) if "rss_before_trim_mb" in r]
    if trims:
        lines += ["", "RSS before -> after malloc_trim(0) (--trim), MB: " + ", ".join(
            f"{r['t'] / 60:.0f} min {r['rss_before_trim_mb']:.0f} -> {r['rss_after_trim_mb']:.0f}" for r in trims)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--as-worker"]:
        as_worker(argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=3000.0, help="events per second of simulated traffic")
    p.add_argument("--scrape-every", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=5.0, help="minutes left out before comparing (default 5)")
    p.add_argument("--max-units", type=int, default=0, metavar="N",
                   help="the worker's max_units (default: the config's): with N reached in the warm-up, the A/B "
                        "units stop growing and what still grows is not by design")
    p.add_argument("--out-dir", default=str(HERE / "out"))
    p.add_argument("--trace-every", type=float, default=0.0, metavar="MIN",
                   help="diagnosis: a tracemalloc snapshot and object counts of the worker every MIN minutes")
    p.add_argument("--trim", action="store_true",
                   help="diagnosis: with each deep probe, glibc's malloc_trim(0), and the RSS before and after it")
    p.add_argument("--sizes-every", type=float, default=0.0, metavar="MIN",
                   help="diagnosis: the worker's object counts and container sizes every MIN minutes (no tracing)")
    args = p.parse_args(argv)
    args.warmup = min(args.warmup, args.minutes / 3)
    machine = machine_info()
    result = soak(args)
    out = Path(args.out_dir)
    report = render(result, machine, out)
    (out / "soak.md").write_text(report)
    (out / "soak.json").write_text(json.dumps(result))
    print(report)
    return 0 if result["passed"] else 1  # (RSS beyond its target, or file descriptors, threads or tasks grew)


if __name__ == "__main__":
    sys.exit(main())
