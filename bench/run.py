"""Benchmarks of stream_eval against its targets, side by side with pytrec_eval and ranx, in one run.

    python bench/run.py                 # 1M requests (~5M events); ~15-25 min on 2 cores
    python bench/run.py --quick         # 50k requests, smoke run (< 1 min once the data is cached)
    python bench/run.py --profile py-spy # also profile `stream-eval replay` on the main file

Every measurement is repeated (``--repeat``, default 3; the comparisons are interleaved run by run so that
noise on a shared machine hits both sides alike) and reported as median (min-max). The Markdown report is
printed and written to ``bench/out/results.md`` (raw numbers in ``bench/out/results.json``).

What is measured (see docs/benchmarks.md):

1. ``stream-eval replay FILE --format json -o /dev/null --no-progress`` as a child process: wall time,
   CPU time and peak RSS (``os.wait4`` rusage of that child alone).
2. ``stream_eval.engine.replay.replay([FILE], Config())`` + ``report()`` timed inside a fresh child process,
   with its RSS sampled after every read chunk.
3. The pytrec_eval pipeline in a child process: read the same JSONL, ``orjson.loads`` every line, build
   the run (served order) and qrels (max grade per item) dicts, ``RelevanceEvaluator`` with ndcg_cut.10,
   map, recip_rank, P.10, recall.10, ``evaluate``. Garbage collection is disabled in it (a stronger baseline).
4. List-metric kernels: ``evaluate_batch`` (RR, AP, P@10, R@10, nDCG@10) on a prepared ``JudgedBatch``, in
   batches of 8192 and all requests at once, vs ``ranx.evaluate`` (numba) on prepared typed lists with
   ``threads=1`` (same as ours) and ``threads=2`` (informational); the values are cross-checked.
5. ``session_auc`` + ``gauc_weights`` + the weighted mean (tie-aware GAUC) on prepared arrays of sessions
   of 20-60 items, and the same with the compiled ``grouped_session_auc`` the engine scores closed sessions
   with; a per-session ``sklearn.metrics.roc_auc_score`` loop on a subset for reference.
6. Peak RSS of ``stream-eval replay`` on 500k, 1M and 2M requests of the same event-time density
   (``--memory-rate``, default 50 requests/s, so that even the smallest file spans 2.8 h of event time, past
   the ~2.2 h it takes the process to reach its steady size): it must not grow with the number of finished
   requests. Also reported: the slope, peak bytes per extra finished request between smallest and largest.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one core, before numpy loads
    os.environ.setdefault(_var, "1")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import generate as gen  # noqa: E402  (bench/ is not a package)

TARGET_EVENTS_PER_S = 200_000
TARGET_KERNEL_RATIO = 1.2
TARGET_SESSIONS_PER_S = 200_000
MEMORY_FLAT_TOLERANCE = 0.10  # peak RSS of the largest file may exceed the smallest by at most 10 %
# The smallest memory-series file spans this much event time. What the engine holds is at its steady size after
# ~62 min (attribution window + lateness, then the session gap), but the process's RSS keeps rising until ~2.2 h
# (measured, not explained in full: GSB query buckets live up to gsb_window + horizon = 91 min, and the heap
# settles): the 1M-request file at 50/s levels off from 40 % on. A smaller span would measure that warm-up, not
# growth with finished requests.
MEMORY_SPAN_S = 10_000.0
PYTREC_MEASURES = ("ndcg_cut.10", "map", "recip_rank", "P.10", "recall.10")
RANX_METRICS = ("ndcg_burges@10", "mrr", "map", "precision@10", "recall@10")  # burges = exp gain, our default
#: our column -> ranx metric, pytrec_eval measure (pytrec's ndcg uses linear gain: not compared)
SAME_METRICS = {
    "RR": ("mrr", "recip_rank"),
    "AP": ("map", "map"),
    "P@10": ("precision@10", "P_10"),
    "R@10": ("recall@10", "recall_10"),
    "nDCG@10": ("ndcg_burges@10", None),
}
MIB = 1 << 20
DEFAULT_SECTIONS = {"replay", "kernels", "gauc", "memory"}


# ==========================================================================================================
# Child processes (a fresh interpreter each, so that peak RSS and timings belong to one measurement)
# ==========================================================================================================
def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child_replay_inproc(path: str) -> dict[str, Any]:
    import resource

    from stream_eval.config import Config
    from stream_eval.engine.replay import replay

    size = os.path.getsize(path)
    timeline: list[tuple[float, int, float]] = []
    step = [0.0]

    def progress(done: int, events: int) -> None:
        if done >= step[0]:
            timeline.append((round(done / size, 3), events, round(_rss_now() / MIB, 1)))
            step[0] += size / 40

    start = time.perf_counter()
    engine = replay([path], Config(), progress=progress)
    report = engine.report()
    seconds = time.perf_counter() - start
    timeline.append(
        (
            1.0,
            sum(v for k, v in report["events"].items() if k in ("ranking", "feedback", "judgment")),
            round(_rss_now() / MIB, 1),
        )
    )
    return {
        "seconds": seconds,
        "events": report["events"],
        "requests": report["overall"]["requests"],
        "metrics": report["overall"]["metrics"],
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "timeline": timeline,
    }


def child_tracemalloc(path: str) -> dict[str, Any]:
    """Peak of Python allocations during ``replay()`` and, at ~60 % of the file (steady state), the largest
    live allocation sites: what the open state is made of."""
    import tracemalloc

    from stream_eval.config import Config
    from stream_eval.engine.replay import replay

    size = os.path.getsize(path)
    top: list[tuple[str, float, int]] = []
    live = [0.0]

    def progress(done: int, events: int) -> None:
        if not top and done >= 0.6 * size:
            snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            stats = snapshot.statistics("lineno")
            live[0] = sum(stat.size for stat in stats) / MIB
            for stat in stats[:12]:
                frame = stat.traceback[0]
                top.append(
                    (
                        _short(f"x ({frame.filename}:{frame.lineno})").split(" ", 1)[1].strip("()"),
                        stat.size / MIB,
                        stat.count,
                    )
                )

    tracemalloc.start()
    start = time.perf_counter()
    engine = replay([path], Config(), progress=progress)
    engine.report()
    seconds = time.perf_counter() - start
    current, peak = tracemalloc.get_traced_memory()
    return {
        "seconds": seconds,
        "peak_mb": peak / MIB,
        "current_mb": current / MIB,
        "live_at_60_mb": live[0],
        "top_at_60": top,
    }


def child_pytrec(path: str) -> dict[str, Any]:
    import orjson
    import pytrec_eval

    gc.disable()  # the dicts are acyclic: a stronger baseline (GC matters as much as the parser: docs/benchmarks.md)
    start = time.perf_counter()
    loads = orjson.loads
    run: dict[str, dict[str, float]] = {}
    qrels: dict[str, dict[str, int]] = {}
    with open(path, "rb") as f:
        for line in f:
            event = loads(line)
            kind = event["type"]
            if kind == "ranking":
                items = event["items"]
                n = len(items)
                run[event["request_id"]] = {item: float(n - k) for k, item in enumerate(items)}  # served order
            elif kind == "feedback":
                grade = int(event["grade"]) if event.get("kind") == "label" else 1
                judged = qrels.get(event["request_id"])
                if judged is None:
                    qrels[event["request_id"]] = {event["item"]: grade}
                elif grade > judged.get(event["item"], -1):
                    judged[event["item"]] = grade
    for rid in run:
        if rid not in qrels:
            qrels[rid] = {"__no_judgment__": 0}  # pytrec_eval skips queries without qrels; ours count them as 0
    built = time.perf_counter()
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, set(PYTREC_MEASURES))
    results = evaluator.evaluate(run)
    done = time.perf_counter()
    means = {}
    for measure in ("ndcg_cut_10", "map", "recip_rank", "P_10", "recall_10"):
        means[measure] = sum(r[measure] for r in results.values()) / len(results)
    return {
        "build_s": built - start,
        "eval_s": done - built,
        "total_s": done - start,
        "queries": len(results),
        "means": means,
    }


CHILDREN: dict[str, Callable[[str], dict[str, Any]]] = {
    "replay-inproc": child_replay_inproc,
    "tracemalloc": child_tracemalloc,
    "pytrec": child_pytrec,
}


# ==========================================================================================================
# Process helpers
# ==========================================================================================================
#: Runs the measured command and reports its rusage. A child's ``ru_maxrss`` includes the peak RSS of the
#: address space it was exec'ed from (Linux records the old mm's high-water mark at exec, and Python spawns
#: with vfork), so measured commands are started from this small launcher, never from the big parent.
LAUNCHER = """
import json, os, subprocess, sys, time
report, cmd = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
proc = subprocess.Popen(cmd)
_, status, usage = os.wait4(proc.pid, 0)
wall = time.perf_counter() - start
with open(report, "w") as f:
    json.dump({"wall_s": wall, "user_s": usage.ru_utime, "sys_s": usage.ru_stime,
               "maxrss_mb": usage.ru_maxrss / 1024}, f)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def spawn(cmd: Sequence[str], parse_json: bool = False) -> dict[str, Any]:
    """Run ``cmd`` through :data:`LAUNCHER`: its wall time and the rusage of that child alone."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "rusage.json"
        proc = subprocess.run(
            [sys.executable, "-c", LAUNCHER, str(report), *cmd], capture_output=True, stdin=subprocess.DEVNULL
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr.decode(errors='replace')[-3000:]}"
            )
        result: dict[str, Any] = json.loads(report.read_text())
    if parse_json:
        result["out"] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return result


def stream_eval_cmd() -> list[str]:
    exe = shutil.which("stream-eval")
    if exe:
        return [exe]
    return [sys.executable, "-m", "stream_eval.cli"]


def replay_cmd(path: Path) -> list[str]:
    return [*stream_eval_cmd(), "replay", str(path), "--format", "json", "-o", "/dev/null", "--no-progress"]


def child_cmd(kind: str, path: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", kind, str(path)]


def warm_page_cache(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


# ==========================================================================================================
# Statistics and formatting
# ==========================================================================================================
def summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt_num(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.0f}k"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.3g}"


def fmt_range(s: dict[str, float], f: Callable[[float], str] = fmt_num) -> str:
    if s["n"] == 1:
        return f"{f(s['median'])} (1 run)"
    return f"{f(s['median'])} ({f(s['min'])}–{f(s['max'])})"


def fmt_s(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}×"


def rates(times: Sequence[float], work: float) -> dict[str, float]:
    return summary([work / t for t in times])


# ==========================================================================================================
# Machine facts
# ==========================================================================================================
def code_hash() -> str:
    """Digest of the package's source files: tells whether the code changed while the benchmark ran."""
    import hashlib

    import stream_eval

    digest = hashlib.sha256()
    root = Path(stream_eval.__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def python_loop_seconds(n: int = 20_000_000) -> float:
    """Seconds for a plain Python loop of ``n`` additions: a yardstick of how fast the (shared) machine is this
    hour, taken at the start and the end of a run (docs/benchmarks.md compares runs with it)."""
    started = time.perf_counter()
    total = 0
    for i in range(n):
        total += i
    return time.perf_counter() - started


def count_instructions(command: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Instructions the process of ``command`` runs (with the environment ``env``, None: this one's), under
    valgrind's cachegrind without the cache simulation: a count that does not move with what else a shared machine
    runs, as CPU time does. (numba caches its code per CPU, and valgrind's is another: a first run under it
    compiles.)"""
    result = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={os.devnull}",
                             *command], capture_output=True, text=True, check=True, env=env)
    match = re.search(r"I\s+refs:\s+([\d,]+)", result.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output: {result.stderr[-500:]}")
    return int(match.group(1).replace(",", ""))


def machine_info() -> dict[str, Any]:
    from importlib import metadata

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("stream-eval", "numpy", "msgspec", "orjson", "ranx", "numba", "pytrec_eval-terrier", "scikit-learn"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    commit = ""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "stream_eval"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if dirty:
            commit += " + uncommitted changes in stream_eval/"
    except (OSError, subprocess.CalledProcessError):
        pass
    mem_total = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_total = int(line.split()[1]) // 1024
    except OSError:
        pass
    return {
        "code_hash": code_hash(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_mb": mem_total,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": versions,
        "commit": commit,
        "loadavg_start": os.getloadavg(),
        "python_loop_start": python_loop_seconds(),
    }


# ==========================================================================================================
# Kernel inputs, prepared outside every timed region
# ==========================================================================================================
class KernelInputs:
    """The judged items of every request of the main file, as our ``JudgedBatch``es and ranx typed lists.

    Built from the generator's draws (the same numbers the JSONL holds), joined the way the engine joins:
    an item's grade is the max of its feedback; zero grades carry no information for these five metrics
    and are left out of both sides' inputs.
    """

    def __init__(self, params: gen.Params) -> None:
        import numpy as np

        n_items, run_items, j_req, j_pos, j_item, j_grade = [], [], [], [], [], []
        for chunk in gen.iter_chunks(params):
            n = chunk.n_items
            valid = np.arange(gen.MAX_ITEMS)[None, :] < n[:, None]
            n_items.append(n)
            run_items.append(chunk.items[valid])
            local = chunk.fb_req - chunk.first
            key = local * gen.CATALOGUE + chunk.fb_item
            order = np.lexsort((chunk.fb_grade, key))
            last = np.ones(order.size, dtype=bool)
            last[:-1] = key[order][1:] != key[order][:-1]
            sel = order[last]  # per (request, item): the entry with the largest grade
            req, item, grade = local[sel], chunk.fb_item[sel], chunk.fb_grade[sel]
            keep = grade > 0
            req, item, grade = req[keep], item[keep], grade[keep]
            match = (chunk.items[req] == item[:, None]) & valid[req]
            pos = np.where(match.any(axis=1), match.argmax(axis=1) + 1, 0)
            j_req.append(req + chunk.first)
            j_pos.append(pos)
            j_item.append(item)
            j_grade.append(grade)
        self.n_shown = np.concatenate(n_items).astype(np.int64)
        self.size = int(self.n_shown.size)
        self.run_items = np.concatenate(run_items)
        self.req = np.concatenate(j_req).astype(np.int64)
        self.pos = np.concatenate(j_pos).astype(np.int64)
        self.item = np.concatenate(j_item)
        self.grade = np.concatenate(j_grade).astype(np.float64)

    def judged_batch(self, start: int, stop: int) -> Any:
        import numpy as np

        from stream_eval.metrics.kernels import JudgedBatch

        lo, hi = np.searchsorted(self.req, [start, stop])
        req, pos, grade = self.req[lo:hi] - start, self.pos[lo:hi], self.grade[lo:hi]
        shown = pos > 0
        return JudgedBatch(
            self.n_shown[start:stop].copy(),
            req[shown].copy(),
            pos[shown].copy(),
            grade[shown].copy(),
            req[~shown].copy(),
            grade[~shown].copy(),
        )

    def batches(self, size: int) -> list[Any]:
        return [self.judged_batch(a, min(a + size, self.size)) for a in range(0, self.size, size)]

    def ranx_lists(self) -> tuple[Any, Any]:
        """``(qrels, run)`` as numba typed lists of (n, 2) float64 arrays, like ``Qrels/Run.to_typed_list()``:
        run rows [item id, score] by descending score (score = served order), qrels rows [item id, grade] by
        descending grade."""
        import numpy as np

        run_flat = np.empty((self.run_items.size, 2))
        run_flat[:, 0] = self.run_items
        starts = np.zeros(self.size + 1, dtype=np.int64)
        np.cumsum(self.n_shown, out=starts[1:])
        position = np.arange(self.run_items.size) - np.repeat(starts[:-1], self.n_shown)
        run_flat[:, 1] = np.repeat(self.n_shown, self.n_shown) - position
        order = np.lexsort((-self.grade, self.req))
        qrels_flat = np.empty((order.size, 2))
        qrels_flat[:, 0] = self.item[order]
        qrels_flat[:, 1] = self.grade[order]
        q_starts = np.zeros(self.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.req, minlength=self.size), out=q_starts[1:])
        split = _numba_splitter()
        return split(qrels_flat, q_starts), split(run_flat, starts)


def _numba_splitter() -> Callable[..., Any]:
    from numba import njit
    from numba.typed import List

    @njit(cache=False)
    def split(flat: Any, starts: Any) -> Any:
        out = List()
        for i in range(starts.shape[0] - 1):
            out.append(flat[starts[i] : starts[i + 1]].copy())
        return out

    return split


def make_gauc_inputs(n_sessions: int, seed: int = 7) -> tuple[Any, Any, Any]:
    """Sessions of 20-60 items (as the engine hands them over: grouped by session), scores with ties
    (2 decimals), 2-30 % positives per session (some sessions single-class)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes = rng.integers(20, 61, n_sessions)
    session = np.repeat(np.arange(n_sessions, dtype=np.int64), sizes)
    scores = np.round(rng.random(session.size), 2)
    share = rng.uniform(0.02, 0.30, n_sessions)
    labels = rng.random(session.size) < share[session]
    return session, scores, labels


def gauc_parts(session: Any, scores: Any, labels: Any, n_sessions: int) -> tuple[float, float]:
    """Numerator and denominator of GAUC (impression-weighted mean of the defined session AUCs)."""
    import numpy as np

    from stream_eval.metrics.auc import gauc_weights, session_auc

    auc, positives, negatives = session_auc(session, scores, labels, n_sessions)
    weights = gauc_weights(positives, negatives, "impressions")
    ok = ~np.isnan(auc) & (weights > 0)
    return float((auc[ok] * weights[ok]).sum()), float(weights[ok].sum())


def gauc(session: Any, scores: Any, labels: Any, n_sessions: int) -> float:
    num, den = gauc_parts(session, scores, labels, n_sessions)
    return num / den


def compiled_gauc(starts: Any, scores: Any, labels: Any) -> float:
    """GAUC as the engine scores closed sessions: the compiled session AUC on items grouped by session."""
    import numpy as np

    from stream_eval.engine.compiled import grouped_session_auc
    from stream_eval.metrics.auc import gauc_weights

    auc, positives, negatives = grouped_session_auc(starts, scores, labels)
    weights = gauc_weights(positives, negatives, "impressions")
    ok = ~np.isnan(auc) & (weights > 0)
    return float((auc[ok] * weights[ok]).sum() / weights[ok].sum())


# ==========================================================================================================
# The benchmark
# ==========================================================================================================
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.results: dict[str, Any] = {}
        self.data = Path(args.data_dir)
        self.out = Path(args.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_lines: list[str] = []

    def log(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"[{stamp}] {text}", file=sys.stderr, flush=True)

    def data_file(self, prefix: str, params: gen.Params) -> Path:
        if prefix == "events" and params.requests == 1_000_000 and params.rate == 200.0:
            return self.data / "events.jsonl"  # the file `python bench/generate.py` writes by default
        return self.data / f"{prefix}-{params.requests}-{params.rate:g}ps.jsonl"

    # -- 1-3: replay and the pytrec_eval pipeline ---------------------------------------------------------
    def replay_vs_pytrec(self, path: Path, meta: dict[str, Any]) -> None:
        args = self.args
        events, requests = meta["lines"], meta["params"]["requests"]
        warm_page_cache(path)
        cli, inproc, pytrec = [], [], []
        for rep in range(args.repeat):
            cli.append(spawn(replay_cmd(path)))
            last = cli[-1]
            self.log(
                f"replay CLI run {rep + 1}: {last['wall_s']:.1f} s, {events / last['wall_s']:,.0f} events/s, "
                f"{last['maxrss_mb']:.0f} MB"
            )
            inproc.append(spawn(child_cmd("replay-inproc", path), parse_json=True))
            self.log(f"replay() in-process run {rep + 1}: {inproc[-1]['out']['seconds']:.1f} s")
            if not args.no_pytrec:
                pytrec.append(spawn(child_cmd("pytrec", path), parse_json=True))
                self.log(
                    f"pytrec_eval pipeline run {rep + 1}: {pytrec[-1]['wall_s']:.1f} s "
                    f"(build {pytrec[-1]['out']['build_s']:.1f} s, evaluate {pytrec[-1]['out']['eval_s']:.1f} s)"
                )
        res: dict[str, Any] = {"file": str(path), "events": events, "requests": requests, "bytes": meta["bytes"]}
        res["cli"] = {
            "runs": cli,
            "wall": summary([r["wall_s"] for r in cli]),
            "events_per_s": rates([r["wall_s"] for r in cli], events),
            "requests_per_s": rates([r["wall_s"] for r in cli], requests),
            "cpu_s": summary([r["user_s"] + r["sys_s"] for r in cli]),
            "maxrss_mb": summary([r["maxrss_mb"] for r in cli]),
        }
        res["inproc"] = {
            "runs": inproc,
            "seconds": summary([r["out"]["seconds"] for r in inproc]),
            "events_per_s": rates([r["out"]["seconds"] for r in inproc], events),
            "requests_per_s": rates([r["out"]["seconds"] for r in inproc], requests),
            "maxrss_mb": summary([r["maxrss_mb"] for r in inproc]),
            "metrics": inproc[0]["out"]["metrics"],
            "timeline": inproc[0]["out"]["timeline"],
            "event_counts": inproc[0]["out"]["events"],
        }
        if pytrec:
            res["pytrec"] = {
                "runs": pytrec,
                "wall": summary([r["wall_s"] for r in pytrec]),
                "build_s": summary([r["out"]["build_s"] for r in pytrec]),
                "eval_s": summary([r["out"]["eval_s"] for r in pytrec]),
                "queries": pytrec[0]["out"]["queries"],
                "queries_per_s": rates([r["wall_s"] for r in pytrec], pytrec[0]["out"]["queries"]),
                "maxrss_mb": summary([r["maxrss_mb"] for r in pytrec]),
                "means": pytrec[0]["out"]["means"],
                "ratio": summary([p["wall_s"] / c["wall_s"] for p, c in zip(pytrec, cli, strict=True)]),
            }
            ours = res["inproc"]["metrics"]
            mapping = {"MRR": "recip_rank", "MAP": "map", "P@10": "P_10", "R@10": "recall_10"}
            res["pytrec"]["max_mean_diff"] = max(abs(ours[k] - res["pytrec"]["means"][v]) for k, v in mapping.items())
        self.results["replay"] = res

    # -- 4: list-metric kernels vs ranx --------------------------------------------------------------------------
    def kernels(self, params: gen.Params) -> None:
        import numpy as np
        import ranx

        from stream_eval.config import Config
        from stream_eval.metrics.kernels import evaluate_batch
        from stream_eval.metrics.specs import MetricSpec

        args = self.args
        t = time.perf_counter()
        inputs = KernelInputs(params)
        whole = inputs.judged_batch(0, inputs.size)
        batches = inputs.batches(args.batch_size)
        qrels, run = inputs.ranx_lists()
        self.log(
            f"kernel inputs prepared in {time.perf_counter() - t:.1f} s ({inputs.size:,} requests, "
            f"{inputs.req.size:,} judged items with grade > 0)"
        )
        config = Config()
        specs = (MetricSpec("RR"), MetricSpec("AP"), MetricSpec("P", 10), MetricSpec("R", 10), MetricSpec("nDCG", 10))
        metrics = list(RANX_METRICS)
        # Warm-ups: numba compilation (and its on-disk cache load) is excluded; numpy gets a warm-up too.
        t = time.perf_counter()
        warm = ranx.evaluate(qrels, run, metrics, return_mean=False, threads=1, save_results_in_run=False)
        ranx.evaluate(qrels, run, metrics, return_mean=False, threads=2, save_results_in_run=False)
        self.log(f"ranx warm-up (compile or cache load + 2 evaluations) {time.perf_counter() - t:.1f} s")
        evaluate_batch(batches[0], config, specs)
        ours_whole = evaluate_batch(whole, config, specs).values

        timings: dict[str, list[float]] = {"batched": [], "whole": [], "ranx1": [], "ranx2": []}
        for rep in range(args.fast_repeat):
            gc.collect()
            start = time.perf_counter()
            for batch in batches:
                evaluate_batch(batch, config, specs)
            timings["batched"].append(time.perf_counter() - start)
            start = time.perf_counter()
            evaluate_batch(whole, config, specs)
            timings["whole"].append(time.perf_counter() - start)
            for threads in (1, 2):
                start = time.perf_counter()
                ranx.evaluate(qrels, run, metrics, return_mean=False, threads=threads, save_results_in_run=False)
                timings[f"ranx{threads}"].append(time.perf_counter() - start)
            self.log(
                "kernels run {}: ours 8192 {:.2f} s, ours whole {:.2f} s, ranx 1 thread {:.2f} s, "
                "ranx 2 threads {:.2f} s".format(rep + 1, *(timings[k][-1] for k in timings))
            )
        # Cross-check: the same numbers on both sides.
        diffs = {}
        for j, spec in enumerate(specs):
            diffs[spec.name] = float(np.max(np.abs(ours_whole[:, j] - warm[SAME_METRICS[spec.name][0]])))
        # Peak extra memory of one whole-batch evaluation (numpy allocations are traced by tracemalloc).
        import tracemalloc

        tracemalloc.start()
        evaluate_batch(whole, config, specs)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        n = inputs.size
        res = {
            "requests": n,
            "judged": int(inputs.req.size),
            "batch_size": args.batch_size,
            "value_max_abs_diff": diffs,
            "means": {spec.name: float(np.mean(ours_whole[:, j])) for j, spec in enumerate(specs)},
            "whole_peak_alloc_mb": peak / MIB,
        }
        for key, values in timings.items():
            res[key] = {"seconds": summary(values), "queries_per_s": rates(values, n)}
        for key in ("batched", "whole"):
            res[key]["ratio_vs_ranx1"] = summary([r / o for r, o in zip(timings["ranx1"], timings[key], strict=True)])
            res[key]["ratio_vs_ranx2"] = summary([r / o for r, o in zip(timings["ranx2"], timings[key], strict=True)])
        self.results["kernels"] = res
        del inputs, whole, batches, qrels, run, warm

    # -- 5: GAUC ---------------------------------------------------------------------------------------------------
    def gauc(self, n_sessions: int) -> None:
        import numpy as np
        from sklearn.metrics import roc_auc_score

        from stream_eval.metrics.auc import session_auc

        args = self.args
        session, scores, labels = make_gauc_inputs(n_sessions)
        size = args.gauc_batch_size
        bounds = np.searchsorted(session, np.minimum(np.arange(0, n_sessions + size, size), n_sessions))
        batches = [
            (session[a:b] - k * size, scores[a:b], labels[a:b], min(size, n_sessions - k * size))
            for k, (a, b) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))
            if b > a
        ]
        gauc(session[:1000], scores[:1000], labels[:1000], int(session[999]) + 1)  # warm-up
        starts = np.searchsorted(session, np.arange(n_sessions + 1))
        compiled_gauc(starts[:11], scores, labels)  # warm-up (loads the compiled kernel)
        times: dict[str, list[float]] = {"batched": [], "whole": [], "compiled": []}
        for rep in range(args.fast_repeat):
            start = time.perf_counter()
            num = den = 0.0
            for b_session, b_scores, b_labels, b_n in batches:
                b_num, b_den = gauc_parts(b_session, b_scores, b_labels, b_n)
                num += b_num
                den += b_den
            batched = num / den
            times["batched"].append(time.perf_counter() - start)
            start = time.perf_counter()
            value = gauc(session, scores, labels, n_sessions)
            times["whole"].append(time.perf_counter() - start)
            start = time.perf_counter()
            compiled = compiled_gauc(starts, scores, labels)
            times["compiled"].append(time.perf_counter() - start)
            self.log(
                f"GAUC run {rep + 1}: batches of {size} {n_sessions / times['batched'][-1]:,.0f} sessions/s, "
                f"all at once {n_sessions / times['whole'][-1]:,.0f} sessions/s, "
                f"compiled {n_sessions / times['compiled'][-1]:,.0f} sessions/s"
            )
        # Reference and cross-check: sklearn's roc_auc_score per session on the first sessions.
        k = min(300, n_sessions)
        cut = int(np.searchsorted(session, k))
        auc, _, _ = session_auc(session[:cut], scores[:cut], labels[:cut], k)
        starts = np.searchsorted(session[:cut], np.arange(k + 1))
        start = time.perf_counter()
        ref = []
        for s in range(k):
            a, b = starts[s], starts[s + 1]
            y = labels[a:b]
            ref.append(roc_auc_score(y, scores[a:b]) if 0 < y.sum() < y.size else float("nan"))
        sk_time = time.perf_counter() - start
        ref_arr = np.array(ref)
        both = ~np.isnan(ref_arr)
        diff = float(np.max(np.abs(ref_arr[both] - auc[both]))) if both.any() else 0.0
        same_nan = bool(np.array_equal(np.isnan(ref_arr), np.isnan(auc)))
        self.results["gauc"] = {
            "sessions": n_sessions,
            "items": int(session.size),
            "gauc": value,
            "batch_size": size,
            "batched_gauc_diff": abs(batched - value),
            "compiled_gauc_diff": abs(compiled - value),
            "batched": {
                "seconds": summary(times["batched"]),
                "sessions_per_s": rates(times["batched"], n_sessions),
                "items_per_s": rates(times["batched"], session.size),
            },
            "whole": {
                "seconds": summary(times["whole"]),
                "sessions_per_s": rates(times["whole"], n_sessions),
                "items_per_s": rates(times["whole"], session.size),
            },
            "compiled": {
                "seconds": summary(times["compiled"]),
                "sessions_per_s": rates(times["compiled"], n_sessions),
                "items_per_s": rates(times["compiled"], session.size),
            },
            "sklearn_sessions": k,
            "sklearn_seconds": sk_time,
            "sklearn_sessions_per_s": k / sk_time,
            "sklearn_max_abs_diff": diff,
            "sklearn_same_undefined": same_nan,
        }

    # -- 6: memory does not grow with finished requests ---------------------------------------------------------
    def memory_series(self, sizes: Sequence[int]) -> None:
        args = self.args
        rows = []
        for n in sizes:
            params = gen.Params(requests=n, rate=args.memory_rate)
            path = self.data_file("mem", params)
            meta = gen.ensure(params, path)
            warm_page_cache(path)
            runs = []
            for rep in range(args.memory_repeat):
                runs.append(spawn(replay_cmd(path)))
                self.log(
                    f"memory series {n:,} requests run {rep + 1}: {runs[-1]['maxrss_mb']:.0f} MB, "
                    f"{runs[-1]['wall_s']:.1f} s"
                )
            first_ts = gen.T0
            rows.append(
                {
                    "requests": n,
                    "events": meta["lines"],
                    "file": str(path),
                    "span_min": n / args.memory_rate / 60.0,
                    "first_ts": first_ts,
                    "maxrss_mb": summary([r["maxrss_mb"] for r in runs]),
                    "wall": summary([r["wall_s"] for r in runs]),
                    "events_per_s": rates([r["wall_s"] for r in runs], meta["lines"]),
                }
            )
        largest = Path(rows[-1]["file"])
        timeline = spawn(child_cmd("replay-inproc", largest), parse_json=True)["out"]["timeline"]
        rss = [r["maxrss_mb"]["median"] for r in rows]
        self.results["memory"] = {
            "rate": args.memory_rate,
            "rows": rows,
            "timeline": timeline,
            "growth": rss[-1] / rss[0] - 1.0,
            "growth_last": rss[-1] / rss[-2] - 1.0 if len(rss) > 1 else 0.0,
            # peak bytes per finished request more (an open request costs ~1 KB: a kept finished request would
            # show as hundreds of bytes here)
            "bytes_per_request": (rss[-1] - rss[0]) * 2**20 / (sizes[-1] - sizes[0]) if len(rss) > 1 else 0.0,
        }

    def tracemalloc_run(self, path: Path) -> None:
        out = spawn(child_cmd("tracemalloc", path), parse_json=True)["out"]
        self.results["tracemalloc"] = {"file": str(path), **out}
        self.log(f"tracemalloc peak of replay(): {out['peak_mb']:.0f} MB")

    # -- profile ---------------------------------------------------------------------------------------------------
    def profile(self, path: Path, tool: str) -> None:
        self.results["profile"] = {"file": str(path)}
        if tool in ("py-spy", "both"):
            spy = shutil.which("py-spy")
            if spy is None:
                self.log("py-spy not installed (pip install py-spy); skipped")
            else:
                raw = self.out / "replay-py-spy.txt"
                cmd = [
                    spy,
                    "record",
                    "--rate",
                    "250",
                    "--function",
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                    "--",
                    *replay_cmd(path),
                ]
                subprocess.run(cmd, check=True, capture_output=True)
                self.results["profile"]["py-spy"] = summarise_collapsed(raw)
                self.log(f"py-spy profile written to {raw}")
        if tool in ("cprofile", "both"):
            prof = self.out / "replay.prof"
            cmd = [
                sys.executable,
                "-m",
                "cProfile",
                "-o",
                str(prof),
                "-m",
                "stream_eval.cli",
                *replay_cmd(path)[len(stream_eval_cmd()) :],
            ]
            subprocess.run(cmd, check=True, capture_output=True)
            self.results["profile"]["cprofile"] = summarise_pstats(prof)
            self.log(f"cProfile profile written to {prof}")


def _short(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py:12)``, keeping the package path for stream_eval."""
    name, _, where = frame.rpartition(" (")
    where = where.rstrip(")")
    path, _, line = where.rpartition(":")
    if "stream_eval/" in path:
        path = "stream_eval/" + path.split("stream_eval/", 1)[1]
    elif "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    else:
        path = os.path.basename(path)
    return f"{name} ({path}:{line})"


def summarise_collapsed(raw: Path, top: int = 15) -> dict[str, Any]:
    """Own and cumulative sample shares per function from py-spy's collapsed stacks."""
    own: dict[str, int] = {}
    cumulative: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [_short(f) for f in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            cumulative[frame] = cumulative.get(frame, 0) + n

    def table(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, v / total) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": total, "own": table(own), "cumulative": table(cumulative)}


def summarise_pstats(prof: Path, top: int = 15) -> dict[str, Any]:
    import pstats

    stats = pstats.Stats(str(prof))
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_, nc, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((_short(f"{func} ({file}:{line})"), nc, tt, ct))
    by_ct = sorted(rows, key=lambda r: -r[3])[:top]
    by_tt = sorted(rows, key=lambda r: -r[2])[:top]
    return {"total_s": total, "cumulative": by_ct, "own": by_tt}


# ==========================================================================================================
# Report
# ==========================================================================================================
def render(results: dict[str, Any], machine: dict[str, Any], args: argparse.Namespace) -> str:
    out: list[str] = []
    w = out.append
    title = "quick smoke run" if args.quick else "full run"
    w(f"## Results ({title}, {machine['date']})\n")
    v = machine["versions"]
    w(
        f"Machine: {machine['platform']}; CPU {machine['cpu']}, {machine['cores']} cores "
        f"({machine['affinity']} usable), {machine['memory_mb'] / 1024:.0f} GiB RAM; {machine['python']}; "
        + ", ".join(f"{k} {val}" for k, val in v.items())
        + (f"; stream_eval at {machine['commit']}" if machine["commit"] else "")
        + f". Load average at start {', '.join(f'{x:.2f}' for x in machine['loadavg_start'])}, at end "
        + f"{', '.join(f'{x:.2f}' for x in machine['loadavg_end'])} (a shared machine: noise is real); a plain "
        + f"Python loop of 20M additions took {machine['python_loop_start']:.2f} s at start and "
        + f"{machine['python_loop_end']:.2f} s at end (the hour's speed). "
        + f"stream_eval source digest {machine['code_hash']}"
        + (
            f" at start, **{machine['code_hash_end']} at end: the package changed during the run**. "
            if machine["code_hash_end"] != machine["code_hash"]
            else " (unchanged during the run). "
        )
        + f"Each row: median (min–max) of {args.repeat} runs (rows 1-3 and the memory series) or "
        + f"{args.fast_repeat} runs (rows 4-9, in-process, seconds each).\n"
    )

    rp = results.get("replay")
    if rp or results.get("kernels") or results.get("gauc"):
        w("| # | Measurement | Work | Time, s | Throughput | vs comparator | Peak memory |")
        w("|---|---|---|---|---|---|---|")
    if rp:
        ev, rq = rp["events"], rp["requests"]
        cli = rp["cli"]
        ratio = ""
        if "pytrec" in rp:
            ratio = f"row 3 time ÷ row 1 time: {fmt_range(rp['pytrec']['ratio'], fmt_ratio)} (> 1: we are faster)"
        cpu_share = cli["cpu_s"]["median"] / cli["wall"]["median"]
        w(
            f"| 1 | `stream-eval replay` CLI, end to end (child process; CPU/wall {cpu_share:.2f}) | "
            f"{ev / 1e6:.2f}M events ({rq / 1e6:.2f}M requests, {rp['bytes'] / 1e6:.0f} MB JSONL) | "
            f"{fmt_range(cli['wall'], fmt_s)} | **{fmt_range(cli['events_per_s'])} events/s**; "
            f"{fmt_range(cli['requests_per_s'])} requests/s | {ratio} | RSS {fmt_range(cli['maxrss_mb'], fmt_mb)} |"
        )
        ip = rp["inproc"]
        w(
            f"| 2 | `replay([file], Config())` + `report()` in-process (fresh child; time of the call only) | "
            f"same file | {fmt_range(ip['seconds'], fmt_s)} | {fmt_range(ip['events_per_s'])} events/s; "
            f"{fmt_range(ip['requests_per_s'])} requests/s | | RSS {fmt_range(ip['maxrss_mb'], fmt_mb)} |"
        )
        if "pytrec" in rp:
            pt = rp["pytrec"]
            w(
                f"| 3 | pytrec_eval pipeline: orjson parse + build run/qrels dicts + evaluate 5 measures "
                f"(child process, GC off) | same file, {pt['queries'] / 1e6:.2f}M queries | "
                f"{fmt_range(pt['wall'], fmt_s)} (build {fmt_s(pt['build_s']['median'])}, evaluate "
                f"{fmt_s(pt['eval_s']['median'])}) | {fmt_range(pt['queries_per_s'])} queries/s; "
                f"{fmt_num(ev / pt['wall']['median'])} events/s | comparator | "
                f"RSS {fmt_range(pt['maxrss_mb'], fmt_mb)} |"
            )
    kn = results.get("kernels")
    if kn:
        n = kn["requests"]
        work = f"{n / 1e6:.2f}M requests, {kn['judged'] / 1e6:.2f}M judged items"
        w(
            f"| 4 | `evaluate_batch` RR, AP, P@10, R@10, nDCG@10, batches of {kn['batch_size']} | {work} | "
            f"{fmt_range(kn['batched']['seconds'], fmt_s)} | "
            f"**{fmt_range(kn['batched']['queries_per_s'])} queries/s** | "
            f"ranx time ÷ ours: {fmt_range(kn['batched']['ratio_vs_ranx1'], fmt_ratio)} (row 6, 1 thread); "
            f"{fmt_range(kn['batched']['ratio_vs_ranx2'], fmt_ratio)} (row 7, 2 threads) | |"
        )
        w(
            f"| 5 | `evaluate_batch`, all {n / 1e6:.2f}M requests at once | same | "
            f"{fmt_range(kn['whole']['seconds'], fmt_s)} | **{fmt_range(kn['whole']['queries_per_s'])} queries/s** | "
            f"ranx time ÷ ours: {fmt_range(kn['whole']['ratio_vs_ranx1'], fmt_ratio)} (row 6, 1 thread); "
            f"{fmt_range(kn['whole']['ratio_vs_ranx2'], fmt_ratio)} (row 7, 2 threads) | "
            f"+{kn['whole_peak_alloc_mb']:.0f} MB (tracemalloc peak) |"
        )
        w(
            f"| 6 | ranx {ranx_version(machine)} `evaluate` (numba), `threads=1`, prepared typed lists | same | "
            f"{fmt_range(kn['ranx1']['seconds'], fmt_s)} | {fmt_range(kn['ranx1']['queries_per_s'])} queries/s | "
            f"comparator | |"
        )
        w(
            f"| 7 | ranx `evaluate`, `threads=2` (informational: uses both cores) | same | "
            f"{fmt_range(kn['ranx2']['seconds'], fmt_s)} | {fmt_range(kn['ranx2']['queries_per_s'])} queries/s | | |"
        )
    ga = results.get("gauc")
    if ga:
        gw = f"{ga['sessions'] / 1e3:.0f}k sessions, {ga['items'] / 1e6:.1f}M items"
        for row, key, what, label in (
            (8, "batched", "`session_auc`", f"in batches of {ga['batch_size']:,} sessions"),
            (9, "whole", "`session_auc`", "all sessions in one call"),
            ("9b", "compiled", "`grouped_session_auc` (compiled; how the engine scores closed sessions)",
             "all sessions in one call"),
        ):
            if key not in ga:
                continue
            g = ga[key]
            w(
                f"| {row} | tie-aware GAUC: {what} + `gauc_weights` + weighted mean, {label} | {gw} | "
                f"{fmt_range(g['seconds'], fmt_s)} | **{fmt_range(g['sessions_per_s'])} sessions/s**; "
                f"{fmt_num(g['items_per_s']['median'])} items/s | "
                f"{g['sessions_per_s']['median'] / ga['sklearn_sessions_per_s']:.0f}× the sessions/s of row 10 | |"
            )
        w(
            f"| 10 | sklearn `roc_auc_score` per session (loop; reference) | "
            f"first {ga['sklearn_sessions']:,} sessions | "
            f"{fmt_s(ga['sklearn_seconds'])} (1 run) | {fmt_num(ga['sklearn_sessions_per_s'])} sessions/s | | |"
        )
    w("")

    me = results.get("memory")
    if me:
        w(f"### Peak memory vs. finished requests (same event-time density: {me['rate']:g} requests/s of event time)\n")
        w("| Requests | Events | Event time spanned | `stream-eval replay` peak RSS | Wall, s | Events/s |")
        w("|---|---|---|---|---|---|")
        for row in me["rows"]:
            w(
                f"| {row['requests']:,} | {row['events']:,} | {row['span_min']:.0f} min | "
                f"{fmt_range(row['maxrss_mb'], fmt_mb)} | {fmt_range(row['wall'], fmt_s)} | "
                f"{fmt_range(row['events_per_s'])} |"
            )
        tl = me["timeline"]
        picks = [tl[int(round(i * (len(tl) - 1) / 8))] for i in range(9)]
        w("")
        w(
            "RSS of `replay()` while reading the largest file (share of file read: events so far, RSS MB): "
            + "; ".join(f"{p[0]:.0%}: {p[1]:,} ev, {p[2]:.0f} MB" for p in picks)
            + ".\n"
        )
    tm = results.get("tracemalloc")
    if tm:
        w(
            f"tracemalloc, `replay()` on {Path(tm['file']).name}: peak of Python allocations {tm['peak_mb']:.0f} MB "
            f"(run time under tracing {tm['seconds']:.0f} s); live at 60 % of the file {tm['live_at_60_mb']:.0f} MB, "
            "largest sites:\n"
        )
        w("| Allocation site | MB | blocks |")
        w("|---|---|---|")
        for where, mb, count in tm["top_at_60"]:
            w(f"| `{where}` | {mb:.0f} | {count:,} |")
        w("")

    rows = verdicts(results)
    if rows:
        w("### Targets\n")
        w("| Target | Required | Measured (median, min–max) | Verdict |")
        w("|---|---|---|---|")
        for target, required, measured, ok in rows:
            w(f"| {target} | {required} | {measured} | {'**met**' if ok else '**NOT met**'} |")
        w("")
    if rp or results.get("kernels") or results.get("gauc"):
        w("### Cross-checks\n")
    if rp and "pytrec" in rp:
        w(
            f"- Replay report vs pytrec_eval means (MRR, MAP, P@10, R@10) on the same file: max |difference| "
            f"{rp['pytrec']['max_mean_diff']:.2e} (nDCG not compared: trec_eval's ndcg uses linear gain, ours exp)."
        )
    if rp:
        ec = rp["inproc"]["event_counts"]
        w(f"- Replay event counts: {ec}.")
    if kn:
        worst = max(kn["value_max_abs_diff"].values())
        w(f"- `evaluate_batch` vs ranx per request, all 5 metrics: max |difference| {worst:.2e}.")
        if rp:
            ours = rp["inproc"]["metrics"]
            names = {"RR": "MRR", "AP": "MAP"}
            d = max(abs(ours[names.get(k, k)] - m) for k, m in kn["means"].items())
            w(f"- Kernel input (drawn from the generator) vs replay of the JSONL: means differ by at most {d:.2e}.")
    if ga:
        w(
            f"- `session_auc` vs sklearn `roc_auc_score` on {ga['sklearn_sessions']:,} sessions: max |difference| "
            f"{ga['sklearn_max_abs_diff']:.2e}; same undefined sessions: {ga['sklearn_same_undefined']}; "
            f"GAUC batched vs all at once: |difference| {ga['batched_gauc_diff']:.1e}; compiled vs numpy: "
            f"|difference| {ga.get('compiled_gauc_diff', float('nan')):.1e}."
        )
    w("")
    pr = results.get("profile")
    if pr:
        w(render_profile(pr, results))
    return "\n".join(out)


def fmt_mb(x: float) -> str:
    return f"{x:.0f} MB"


def ranx_version(machine: dict[str, Any]) -> str:
    return str(machine["versions"].get("ranx", ""))


def verdicts(results: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    rows = []
    rp = results.get("replay")
    if rp:
        e = rp["cli"]["events_per_s"]
        rows.append(
            (
                "`stream-eval replay` end to end, one core",
                f"≥ {TARGET_EVENTS_PER_S:,} events/s",
                f"{fmt_range(e)} events/s",
                e["median"] >= TARGET_EVENTS_PER_S,
            )
        )
        if "pytrec" in rp:
            r = rp["pytrec"]["ratio"]
            rows.append(
                (
                    "`stream-eval replay` vs pytrec_eval building its dicts + evaluating",
                    "faster (> 1×)",
                    f"{fmt_range(r, fmt_ratio)}",
                    r["median"] > 1.0,
                )
            )
    kn = results.get("kernels")
    if kn:
        for key, label in (("batched", f"batches of {kn['batch_size']}"), ("whole", "whole batch")):
            r = kn[key]["ratio_vs_ranx1"]
            rows.append(
                (
                    f"list-metric kernels ({label}) vs ranx numba, same threads (1)",
                    f"≥ {TARGET_KERNEL_RATIO}×",
                    f"{fmt_range(r, fmt_ratio)}",
                    r["median"] >= TARGET_KERNEL_RATIO,
                )
            )
    ga = results.get("gauc")
    if ga:
        for key, label in (("batched", f"batches of {ga['batch_size']:,} sessions"), ("whole", "all at once"),
                           ("compiled", "compiled, as the engine scores sessions")):
            if key not in ga:
                continue
            s = ga[key]["sessions_per_s"]
            rows.append(
                (
                    f"tie-aware GAUC ({label})",
                    f"≥ {TARGET_SESSIONS_PER_S:,} sessions/s",
                    f"{fmt_range(s)} sessions/s",
                    s["median"] >= TARGET_SESSIONS_PER_S,
                )
            )
    me = results.get("memory")
    if me:
        rss = " → ".join(f"{r['maxrss_mb']['median']:.0f}" for r in me["rows"])
        sizes = " / ".join(fmt_num(r["requests"]) for r in me["rows"])
        rows.append(
            (
                "peak memory does not grow with finished requests",
                f"largest/smallest peak RSS ≤ {1 + MEMORY_FLAT_TOLERANCE:.2f}",
                f"{sizes} requests: {rss} MB ({me['growth']:+.1%}; {me['bytes_per_request']:+.0f} bytes per "
                "finished request)",
                me["growth"] <= MEMORY_FLAT_TOLERANCE,
            )
        )
    return rows


def render_profile(pr: dict[str, Any], results: dict[str, Any]) -> str:
    out = []
    name = Path(pr.get("file", "")).name
    if "py-spy" in pr:
        p = pr["py-spy"]
        out.append(f"### Profile of `stream-eval replay {name}` (py-spy, {p['samples']:,} samples at 250 Hz)\n")
        out.append("| Top by cumulative share | % | Top by own share | % |")
        out.append("|---|---|---|---|")
        for (cf, cv), (of, ov) in zip(p["cumulative"], p["own"], strict=False):
            out.append(f"| `{cf}` | {cv:.1%} | `{of}` | {ov:.1%} |")
        out.append("")
    if "cprofile" in pr:
        p = pr["cprofile"]
        out.append(f"### Profile of `stream-eval replay {name}` (cProfile, {p['total_s']:.0f} s under tracing)\n")
        out.append("| Top by cumulative time | calls | cum s | Top by own time | calls | own s |")
        out.append("|---|---|---|---|---|---|")
        for c, o in zip(p["cumulative"], p["own"], strict=False):
            out.append(f"| `{c[0]}` | {c[1]:,} | {c[3]:.1f} | `{o[0]}` | {o[1]:,} | {o[2]:.1f} |")
        out.append("")
    return "\n".join(out)


# ==========================================================================================================
# Main
# ==========================================================================================================
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="stream_eval benchmarks (see docs/benchmarks.md)")
    p.add_argument("--requests", type=int, help="requests in the main file (default 1,000,000; 50,000 with --quick)")
    p.add_argument("--quick", action="store_true", help="smoke run: 50k requests, small memory series, 3 runs")
    p.add_argument(
        "--repeat", type=int, default=3, help="runs per replay / pytrec_eval / memory-series measurement (default 3)"
    )
    p.add_argument(
        "--fast-repeat",
        type=int,
        default=7,
        help="runs per in-process kernel and GAUC measurement (default 7: seconds each, noisy machine)",
    )
    p.add_argument("--rate", type=float, default=200.0, help="requests per second of event time, main file")
    p.add_argument(
        "--memory-rate",
        type=float,
        help="requests per second of event time in the memory series (default: the smallest file spans "
        f"{MEMORY_SPAN_S / 60:.0f} min, i.e. 50/s for 500k)",
    )
    p.add_argument("--memory-sizes", help="comma-separated request counts (default 500000,1000000,2000000)")
    p.add_argument("--memory-repeat", type=int, help="runs per memory-series file (default --repeat)")
    p.add_argument("--batch-size", type=int, default=8192, help="requests per evaluate_batch call (default 8192)")
    p.add_argument("--gauc-batch-size", type=int, default=8192, help="sessions per session_auc call (default 8192)")
    p.add_argument("--only", help="comma-separated subset of: replay,kernels,gauc,memory,profile,tracemalloc")
    p.add_argument("--no-pytrec", action="store_true", help="skip the pytrec_eval pipeline")
    p.add_argument("--tracemalloc", action="store_true", help="also one tracemalloc run of replay() on the main file")
    p.add_argument(
        "--profile", choices=["py-spy", "cprofile", "both"], help="profile stream-eval replay on the main file"
    )
    p.add_argument("--data-dir", default=str(HERE / "data"))
    p.add_argument("--out-dir", default=str(HERE / "out"))
    p.add_argument("--child", nargs=2, metavar=("KIND", "FILE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.requests is None:
        args.requests = 50_000 if args.quick else 1_000_000
    if args.memory_sizes:
        args.memory_sizes = [int(x) for x in args.memory_sizes.split(",")]
    else:
        scale = 8 if args.quick else 2  # quick: 6.25k / 12.5k / 25k; full: 500k / 1M / 2M
        args.memory_sizes = [args.requests // scale, 2 * args.requests // scale, 4 * args.requests // scale]
    if args.memory_rate is None:
        args.memory_rate = min(args.memory_sizes) / MEMORY_SPAN_S
    if args.memory_repeat is None:
        args.memory_repeat = 1 if args.quick else args.repeat
    args.only = set(args.only.split(",")) if args.only else set(DEFAULT_SECTIONS)
    if args.profile:
        args.only.add("profile")
    elif "profile" in args.only:
        args.profile = "py-spy" if shutil.which("py-spy") else "cprofile"
    if args.tracemalloc:
        args.only.add("tracemalloc")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        kind, path = args.child
        print(json.dumps(CHILDREN[kind](path)))
        return 0
    bench = Bench(args)
    machine = machine_info()
    started = time.perf_counter()
    params = gen.Params(requests=args.requests, rate=args.rate)
    path = bench.data_file("events", params)
    meta = gen.ensure(params, path)
    bench.log(f"main file {path}: {meta['lines']:,} events, {meta['bytes'] / 1e6:.0f} MB")
    if "replay" in args.only:
        bench.replay_vs_pytrec(path, meta)
    if "kernels" in args.only:
        bench.kernels(params)
    if "gauc" in args.only:
        bench.gauc(max(1000, args.requests // 3))
    if "memory" in args.only:
        bench.memory_series(args.memory_sizes)
    if "tracemalloc" in args.only:
        bench.tracemalloc_run(path)
    if "profile" in args.only:
        bench.profile(path, args.profile)
    machine["loadavg_end"] = os.getloadavg()
    machine["python_loop_end"] = python_loop_seconds()
    machine["code_hash_end"] = code_hash()
    machine["bench_seconds"] = time.perf_counter() - started
    text = render(bench.results, machine, args)
    name = "results-quick" if args.quick else "results"
    if not DEFAULT_SECTIONS <= args.only:
        name += "-" + "-".join(sorted(args.only))  # a partial run does not overwrite the full report
    (bench.out / f"{name}.md").write_text(text + "\n")
    (bench.out / f"{name}.json").write_text(
        json.dumps(
            {
                "machine": machine,
                "args": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()},
                "results": bench.results,
            },
            indent=1,
            default=str,
        )
        + "\n"
    )
    print(text)
    bench.log(f"done in {machine['bench_seconds']:.0f} s; report in {bench.out / (name + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
