"""Scale-out benchmark (issue 24): one and two ``stream-eval worker`` processes of one consumer group on one backlog.

    python bench/scale.py             # 60k requests (~300k events), 3 runs each of 1 and 2 workers; ~4 min on 2 cores
    python bench/scale.py --quick     # 2 rounds instead of 3 (a smaller backlog is counted before the second poll)
    python bench/scale.py --event-rate 10   # the same requests over 100 minutes of event time (finalised as read)
    python bench/scale.py --worker-args "--attribution-window 60s --session-gap 60s" --tag window60
    python bench/scale.py --baseline ../old   # also another source tree's workers, in the same rounds

A Tansu broker is started on a free port (``Broker(free_port())``) and simulated traffic is produced once to the
input topics of one prefix, 4 partitions per topic, with end-of-stream watermarks (``StreamBench.produce`` of
``bench/stream.py``). Then runs of 1 and 2 workers alternate (1, 2, 1, 2, ...), each run a fresh consumer group
(``--group`` unique, same ``--topic-prefix``: every run reads the same backlog from its start, and has a regroup log
of its own). The workers of a run are started together; every ``--poll`` s this process scrapes each worker's
``/metrics`` and reads its CPU seconds (utime + stime, ``/proc/<pid>/stat``). Summed over the workers:

* *first event*: the first poll at which ``stream_eval_events_total`` is above 0 (start-up and group join are left
  out, as in ``bench/stream.py``);
* *requests*: the first poll at which every event is counted and ``stream_eval_requests_total`` equals the
  requests produced (every request finalised);
* *A/B-complete*: every request finalised and the group's A/B readout equal to that of ``stream-eval replay`` of the
  same log (run once, after producing): ``stream_eval_ab_units`` of every arm and ``stream_eval_ab_delta`` of every
  metric (GAUC's too) as the replay's, and the GAUC of ``stream_eval_metric_sum_total`` / ``_count_total``
  ``{metric="AUC"}`` summed over the workers as the replay's (every session scored). The polls go on until the
  regroup stage's series (``stage_state`` of ``bench/stream.py``) have not changed for ``--settle`` s; the report
  says if they changed after A/B-complete (they should not).

events/s to a point = events counted after the start of the work ÷ time from it: the last poll, up to the first
event's, before which no worker's CPU had risen by ``IDLE_CORES`` (0.2) of a core since the poll before (the
workers' readouts lag their work; until 2026-12-04 the first event's poll, which could come when most of a backlog
had been read). Events per worker
CPU-second = the same events ÷ the CPU seconds of all the run's workers over the same interval. A worker is *busy*
in a poll interval when its CPU rate over the last ``--window`` s is at least ``--busy`` of a core; its *work end*
is the end of the last busy interval before A/B-complete. The *tail* of a two-worker run is how long the last worker
keeps working after the first one's work end (each worker's own tail: its work end less the other's, if later),
as a share of the run (start of the work to A/B-complete). A worker's *work start* is the end of the first poll
interval in which its CPU rose by ``IDLE_CORES`` of a core; the *stagger*, the last worker's start less the first's
(on Tansu, which answers each member's JoinGroup 3 s after that member's own request, the worker whose process
started first begins first). The worker holding the regroup stage is the one that exports
series labelled ``partition="regroup"``. A run in which a partition or the stage changed owner (two ``generation``
labels of one ``partition``: the group rebalanced, e.g. because one worker joined after the other had started
reading) is run again, up to ``--retries`` times; the report counts those.

Speed-up = events/s of the 2-worker run ÷ that of the 1-worker run next to it, run by run; efficiency = speed-up ÷ 2.
With ``--baseline DIR`` the workers of another source tree (a git worktree of another commit) run in the same
rounds, their 1 and 2 workers before or after this tree's in turn, so that the two trees' speed-ups are measured
side by side (on a shared machine, runs an hour apart differ by more than most changes).
Each tree's compiled loops are loaded once before the first round (``compile_loops``: numba compiles them where
its cache is missing or stale, as in a fresh worktree), so that no run measures compilation.
Where the machine's cores went over each run (start of the work to A/B-complete) is reported too: the workers, the
broker, this process (the poller), every other process (``/proc/stat``'s busy time less those) and idle; and, run
by run, what that leaves the workers: the cores they used plus the idle ones over the cores one worker used in the
run next to it, the most they could reach with no core idle at one worker's events per CPU-second (``ceilings``).
The Markdown report is printed and written to ``bench/out/scale.md`` (``scale-quick.md``, ``scale-<tag>.md``), the
raw numbers (every poll of every run) to the ``.json`` beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# run.py (imported by stream.py first) also pins numpy to one thread
from run import code_hash, fmt_range, machine_info, summary  # noqa: E402
from stream import (  # noqa: E402
    EVENT_RATE,
    IDLE_CORES,
    PARTITIONS,
    StreamBench,
    ab_complete,
    ab_not_reached,
    ab_series,
    compile_loops,
    cpu_seconds,
    samples,
    scrape,
    source_tree,
    stage_state,
    start_broker,
    verdict,
    worker_cmd,
)

from stream_eval.stream.broker import stop_process  # noqa: E402

#: Runs go on after A/B-complete until the regroup stage's series have not changed this long (``--settle``).
STAGE_SETTLE_SECONDS = 1.0
TARGET_SPEEDUP = 1.8  # 2 workers ÷ 1, events/s to A/B-complete
TARGET_EFFICIENCY = 0.9  # speed-up ÷ workers
TARGET_TAIL_SHARE = 0.10  # the last worker's work after the first went idle, share of the run
COUNTERS = {"stream_eval_events_total", "stream_eval_requests_total"}


def log(message: str) -> None:
    print(f"[scale-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def counted(text: str) -> tuple[float, float, list[str], list[str]]:
    """(events, requests) summed over every label of the two counters, the ``partition`` labels with events
    counted, and every share's ``partition/generation`` (one ownership of a partition, or of the regroup stage)."""
    events = requests = 0.0
    partitions: set[str] = set()
    shares: set[str] = set()
    for name, labels, value in samples(text, COUNTERS):
        if "partition" in labels:
            shares.add(f"{labels['partition']}/{labels.get('generation', '')}")
        if name == "stream_eval_events_total":
            events += value
            if value:
                partitions.add(labels.get("partition", "?"))
        else:
            requests += value
    return events, requests, sorted(partitions), sorted(shares)


def given_up(text: str) -> dict[str, float]:
    """What a worker gave up, by kind: ``orphan`` feedback and each ``stream_eval_overflow_total`` kind (a bound of
    the state passed), the non-zero ones; any of them makes its figures differ from the replay's."""
    out: dict[str, float] = {}
    for name, labels, value in samples(text, {"stream_eval_events_total", "stream_eval_overflow_total"}):
        if name == "stream_eval_overflow_total":
            key = f"overflow/{labels.get('kind')}"
        elif labels.get("status") == "orphan":
            key = "orphan"
        else:
            continue
        out[key] = out.get(key, 0.0) + value
    return {key: value for key, value in sorted(out.items()) if value}


# ==========================================================================================================
# One run: n workers in one fresh consumer group
# ==========================================================================================================
class Poll:
    """What one poll saw of every worker of a run."""

    __slots__ = ("t", "events", "requests", "cpu", "state", "partitions", "shares", "ab", "took", "machine")

    def __init__(self, n: int) -> None:
        self.t = 0.0
        self.machine = (0.0, 0.0, 0.0, 0.0)  # CPU seconds so far: the machine's busy, the broker, this process, idle
        self.took = 0.0  # seconds the poll's scrapes took
        self.events = [0.0] * n
        self.requests = [0.0] * n
        self.cpu = [0.0] * n
        self.state: list[tuple[float, ...]] = [()] * n
        self.partitions: list[list[str]] = [[] for _ in range(n)]
        self.shares: list[list[str]] = [[] for _ in range(n)]
        self.ab: list[dict[str, float]] = [{} for _ in range(n)]

    def copy_worker(self, other: Poll, k: int) -> None:
        for name in ("events", "requests", "state", "partitions", "shares", "ab"):
            getattr(self, name)[k] = getattr(other, name)[k]

    def summed_ab(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for ab in self.ab:
            for key, value in ab.items():
                out[key] = out.get(key, 0.0) + value
        return out


def working(polls: list[Poll], i: int, k: int) -> bool:
    """Whether worker ``k``'s CPU rose by at least ``IDLE_CORES`` of a core over the poll interval ending at poll
    ``i``: the rule that begins a run, and each worker's work."""
    return polls[i].cpu[k] - polls[i - 1].cpu[k] >= IDLE_CORES * (polls[i].t - polls[i - 1].t)


def machine_cpu(broker_pid: int | None) -> tuple[float, float, float, float]:
    """CPU seconds so far of the whole machine (busy: all but idle and iowait, from ``/proc/stat``), of the broker,
    of this process (the poller), and the machine's idle seconds: where the cores went during a run."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    broker = cpu_seconds(broker_pid) if broker_pid else 0.0
    return (sum(fields[:8]) - idle) / tick, broker, time.process_time(), idle / tick


class ScaleBench:
    def __init__(self, args: argparse.Namespace, bootstrap: str, broker_pid: int | None = None) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.broker_pid = broker_pid
        self.run_id = f"{os.getpid()}-{int(time.time())}"
        self.results: dict[str, Any] = {}
        self.expected: dict[str, float] = {}

    def command(self, prefix: str, group: str, port: int) -> list[str]:
        if self.args.worker_cmd:
            cmd = shlex.split(self.args.worker_cmd.format(python=sys.executable, broker=f"kafka://{self.bootstrap}",
                                                          bootstrap=self.bootstrap, prefix=prefix, group=group,
                                                          port=port))
        else:
            cmd = worker_cmd(self.bootstrap, prefix, group, port)
        return cmd + shlex.split(self.args.worker_args or "")

    def produce(self, prefix: str) -> dict[str, Any]:
        """The backlog (``StreamBench.produce``), and the A/B readout a replay of it gives (``expected_ab``)."""
        with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:  # StreamBench.produce keeps the log there
            options = argparse.Namespace(requests=self.args.requests, out_dir=tmp, all_on=None,  # (default traffic)
                                         invalid=0.0)
            bench = StreamBench(options, self.bootstrap)
            data = bench.produce(prefix, self.args.event_rate)  # (with the replay's A/B figures: expected_ab)
            self.expected = bench.expected
            log(f"replay of the backlog: {len(self.expected)} A/B figures to reach")
        data["expected"] = self.expected
        return data

    def run(self, prefix: str, group: str, n: int, events: int, requests: int,
            source: str | None = None) -> dict[str, Any]:
        """One run of ``n`` workers (of the tree ``source``, when given: ``python -m`` there imports its package)."""
        from stream_eval.stream.broker import free_port

        args = self.args
        ports = [free_port() for _ in range(n)]
        errors = [tempfile.TemporaryFile() for _ in range(n)]
        start = time.perf_counter()
        procs = [subprocess.Popen(self.command(prefix, group, port), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=err, cwd=source)
                 for port, err in zip(ports, errors, strict=True)]
        polls: list[Poll] = []
        first = counted_at = done = settled = None
        stage_last: tuple[tuple[tuple[float, ...], ...], int] | None = None  # the stage's series, poll of last change
        answered = [False] * n
        deadline = start + args.timeout
        try:
            while time.perf_counter() < deadline:
                poll = Poll(n)
                began = time.perf_counter()
                for k, (proc, port) in enumerate(zip(procs, ports, strict=True)):
                    if proc.poll() is not None:
                        errors[k].seek(0)
                        raise RuntimeError(f"worker {k} exited {proc.returncode}: {errors[k].read().decode()[-3000:]}")
                    try:
                        text = scrape(f"http://127.0.0.1:{port}/metrics")
                    except OSError:
                        if polls:  # (a scrape that failed: the worker's last numbers)
                            poll.copy_worker(polls[-1], k)
                        poll.cpu[k] = cpu_seconds(proc.pid)
                        continue
                    answered[k] = True
                    poll.events[k], poll.requests[k], poll.partitions[k], poll.shares[k] = counted(text)
                    poll.state[k] = stage_state(text)
                    poll.ab[k] = ab_series(text)
                    poll.cpu[k] = cpu_seconds(proc.pid)
                poll.t = time.perf_counter()
                poll.took = poll.t - began
                poll.machine = machine_cpu(self.broker_pid)
                if not all(answered):
                    time.sleep(args.poll)
                    continue
                polls.append(poll)
                i = len(polls) - 1
                total_events, total_requests = sum(poll.events), sum(poll.requests)
                if first is None and total_events > 0:
                    first = i
                if counted_at is None and total_events >= events and total_requests >= requests:
                    counted_at = i
                if done is None and counted_at is not None and ab_complete(poll.summed_ab(), self.expected):
                    done = i
                state = tuple(poll.state)
                if stage_last is None or state != stage_last[0]:
                    stage_last = (state, i)
                elif done is not None and poll.t - polls[stage_last[1]].t >= args.settle:
                    settled = stage_last[1]  # (the stage's series' last change)
                    break
                time.sleep(args.poll)
            else:  # timed out: what each worker gave up (orphans, bounds passed) may say why
                for k, port in enumerate(ports):
                    with contextlib.suppress(OSError):
                        log(f"worker {k} gave up: {given_up(scrape(f'http://127.0.0.1:{port}/metrics')) or 'nothing'}")
        finally:
            for proc in procs:
                stop_process(proc)
        if done is None or first is None or counted_at is None or settled is None:
            last = polls[-1] if polls else Poll(n)
            for key, value, got in ab_not_reached(last.summed_ab(), self.expected):
                log(f"not reached: {key}: replay {value!r}, the group {got!r}")
            for k, err in enumerate(errors):  # (the workers' logs are temporary files: their ends, kept here)
                err.seek(0)
                log(f"worker {k}'s log ends:\n" + err.read().decode(errors="replace")[-2000:])
            raise RuntimeError(f"{n} worker(s) did not finish in {args.timeout} s: events {sum(last.events)}, "
                               f"requests {sum(last.requests)}, A/B {'complete' if done is not None else 'not yet'}")
        # the work begins at the last poll, up to the first that showed events, before which no worker was busy: the
        # workers' readouts lag their work (a first readout could show most of a backlog), their CPU does not
        begin = first
        while begin > 0 and any(working(polls, begin, k) for k in range(n)):
            begin -= 1
        if done <= begin or sum(polls[begin].events) >= events:
            raise RuntimeError("everything was counted before the second poll: produce more (--requests)")
        result = self.measure(polls, begin, counted_at, done, events, start)
        result["settled_after_done"] = polls[settled].t - polls[done].t  # > 0: the stage changed after A/B-complete
        return result

    def measure(self, polls: list[Poll], first: int, counted_at: int, done: int, events: int,
                start: float) -> dict[str, Any]:
        """The figures of one run from its polls (see the module docstring)."""
        args = self.args
        p0 = polls[first]
        n = len(p0.events)
        from_events = sum(p0.events)

        def at(i: int) -> dict[str, Any]:
            seconds = polls[i].t - p0.t
            cpu = [polls[i].cpu[k] - p0.cpu[k] for k in range(n)]
            work = events - from_events
            return {"seconds": seconds, "rate": work / seconds if seconds > 0 else math.nan, "cpu": cpu,
                    "per_cpu": work / sum(cpu) if sum(cpu) > 0 else math.nan,
                    "share": [c / sum(cpu) if sum(cpu) > 0 else math.nan for c in cpu]}

        # each worker's CPU rate over the last --window s, at every poll from the start of the work to A/B-complete
        busy_until = [p0.t] * n
        curve: list[list[float]] = []
        j = first
        for i in range(first + 1, done + 1):
            while j + 1 < i and polls[i].t - polls[j + 1].t >= args.window:
                j += 1
            span = polls[i].t - polls[j].t
            rates = [(polls[i].cpu[k] - polls[j].cpu[k]) / span for k in range(n)]
            curve.append([round(polls[i].t - p0.t, 3), *[round(r, 3) for r in rates]])
            for k in range(n):
                if rates[k] >= args.busy:
                    busy_until[k] = polls[i].t
        run_seconds = polls[done].t - p0.t
        ends = [b - p0.t for b in busy_until]
        # each worker's start of work: the end of the first poll interval, from the run's start, in which its CPU rose
        # by IDLE_CORES of a core (the rule that begins the run); the stagger, the last worker's start less the first's
        starts = [next((polls[i].t - p0.t for i in range(first + 1, done + 1) if working(polls, i, k)), run_seconds)
                  for k in range(n)]
        tails = [max(0.0, ends[k] - min(ends[v] for v in range(n) if v != k)) for k in range(n)] if n > 1 else [0.0]
        # ownerships seen (partition/generation): more than one of a partition = it moved (a rebalance) in the run
        owners: dict[str, set[str]] = {}
        for poll in polls:
            for k in range(n):
                for share in poll.shares[k]:
                    partition, _, generation = share.partition("/")
                    owners.setdefault(partition, set()).add(f"{k}:{generation}")
        moved = sorted(p for p, seen in owners.items() if len(seen) > 1)
        last = polls[done]
        stage = [k for k in range(n) if any(s.startswith("regroup/") for s in last.shares[k])]
        gaps = [b.t - a.t for a, b in zip(polls[first:done], polls[first + 1:done + 1], strict=True)]
        # cores used over the run: the workers, the broker, this poller, every other process, and idle
        busy, broker, bench, idle = (b - a for a, b in zip(p0.machine, last.machine, strict=True))
        workers = sum(last.cpu) - sum(p0.cpu)
        cores = {"workers": workers / run_seconds, "broker": broker / run_seconds, "poller": bench / run_seconds,
                 "others": max(0.0, busy - workers - broker - bench) / run_seconds, "idle": idle / run_seconds}
        return {
            "workers": n,
            "startup": p0.t - start,
            "requests_point": at(counted_at),
            "ab_point": at(done),
            "work_end": ends,
            "work_start": starts,
            "stagger": max(starts) - min(starts),
            "tail": max(tails),
            "tails": tails,
            "tail_share": max(tails) / run_seconds,
            "stage_worker": stage,
            "partitions": [[p for p in ps if not p.startswith("regroup")] for ps in last.partitions],
            "moved": moved,
            "events_by_worker": last.events,
            "cores": cores,
            "poll_gap_max": max(gaps, default=0.0),
            "poll_gap_median": statistics.median(gaps) if gaps else 0.0,
            "cpu_curve": curve,
            "timeline": [[round(p.t - start, 3), round(p.took, 3), *p.events, *p.requests,
                          *[round(c, 2) for c in p.cpu]] for p in polls],
        }

    def throughput(self) -> None:
        args = self.args
        prefix = f"scale-{self.run_id}-"
        data = self.produce(prefix)
        self.results["data"] = data
        # (the log's label, the tree run: None for this one)
        trees: list[tuple[str, str | None]] = [("", None)] + ([("baseline ", args.baseline)] if args.baseline else [])
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {tree: {n: [] for n in args.workers} for tree, _ in trees}
        discarded: list[dict[str, Any]] = []
        for _, source in trees:
            compile_loops(source)
        for i in range(args.repeat):
            order = trees if i % 2 == 0 else trees[::-1]  # the trees' order alternates
            for (tree, source), n in [(t, n) for t in order for n in args.workers]:
                for attempt in range(args.retries + 1):
                    result = self.run(prefix, f"scale{i}-{tree.strip()}{n}w-{attempt}", n, data["events"],
                                      data["requests"], source)
                    if not result["moved"] or attempt == args.retries:
                        break
                    log(f"run {i + 1}, {tree}{n} worker(s): partitions {result['moved']} moved between workers "
                        f"(the group rebalanced during the run): run again")
                    discarded.append({"round": i, "workers": n, "moved": result["moved"],
                                      "rate": result["ab_point"]["rate"]})
                runs[tree][n].append(result)
                ab = result["ab_point"]
                log(f"run {i + 1}, {tree}{n} worker(s): {ab['rate']:,.0f} events/s to A/B-complete "
                    f"({ab['seconds']:.1f} s; {result['requests_point']['rate']:,.0f}/s to every request), "
                    f"{ab['per_cpu']:,.0f} per CPU-s, CPU shares {[round(s, 2) for s in ab['share']]}, "
                    f"work starts {[round(e, 2) for e in result['work_start']]} s, "
                    f"work ends {[round(e, 1) for e in result['work_end']]} s, stage on {result['stage_worker']}, "
                    f"partitions {result['partitions']}{', MOVED ' + str(result['moved']) if result['moved'] else ''}, "
                    f"poll gaps max {result['poll_gap_max']:.1f} s")
        self.results["runs"] = {str(n): rs for n, rs in runs[""].items()}
        if args.baseline:
            self.results["baseline_runs"] = {str(n): rs for n, rs in runs["baseline "].items()}
        self.results["discarded"] = discarded


# ==========================================================================================================
# Report
# ==========================================================================================================
def speedups(runs: dict[str, list[dict[str, Any]]], point: str, n: int, base: int = 1) -> list[float]:
    """events/s of the n-worker run ÷ that of the base run of the same round, run by run."""
    return [b[point]["rate"] / a[point]["rate"] for a, b in zip(runs[str(base)], runs[str(n)], strict=True)]


def ceilings(runs: dict[str, list[dict[str, Any]]], n: int) -> list[float]:
    """Run by run, the cores the ``n`` workers used plus those idle, over the cores one worker used in the run next
    to it: the speed-up the machine allows them at one worker's events per CPU-second.

    >>> ceilings({"1": [{"cores": {"workers": 0.96, "idle": 0.9}}],
    ...           "2": [{"cores": {"workers": 1.6, "idle": 0.16}}]}, 2)
    [1.8333333333333335]
    """
    return [(b["cores"]["workers"] + b["cores"]["idle"]) / a["cores"]["workers"]
            for a, b in zip(runs["1"], runs[str(n)], strict=True) if a["cores"]["workers"] > 0]


def stage_first(result: dict[str, Any], values: list[Any]) -> list[Any]:
    """``values`` (one per worker) with the stage's worker first."""
    stage = result["stage_worker"][0] if result["stage_worker"] else 0
    return [values[stage]] + [v for k, v in enumerate(values) if k != stage]


def machine_lines(machine: dict[str, Any]) -> list[str]:
    """The machine, the code measured and the load average at start and end (``machine_info`` + the end's), as a
    Markdown list."""
    load = "; ".join(f"{when} {', '.join(f'{x:.2f}' for x in machine[key])}"
                     for when, key in (("start", "loadavg_start"), ("end", "loadavg_end")))
    changed = machine["code_hash"] != machine.get("code_hash_end")
    return [f"- machine: {machine['cpu']} ({machine['cores']} cores, {machine['affinity']} usable), "
            f"{machine['memory_mb'] / 1024:.0f} GiB RAM, {machine['platform']}, {machine['python']}",
            f"- code: stream_eval at {machine['commit']}, source digest {machine['code_hash']}"
            + (" (CHANGED during the run)" if changed else ""),
            f"- load average (1, 5, 15 min) at {load}; the run took {machine['bench_seconds'] / 60:.1f} min",
            f"- broker: {machine.get('broker', 'Tansu')}", ""]


def render(results: dict[str, Any], machine: dict[str, Any], args: argparse.Namespace) -> str:
    def f1(x: float) -> str:
        return f"{x:.1f}"

    def f2(x: float) -> str:
        return f"{x:.2f}"

    def pct(x: float) -> str:
        return f"{100 * x:.0f} %"

    title = "Scale-out results" + (" (quick)" if args.quick else "") + (f", {args.tag}" if args.tag else "")
    out = [f"## {title}: {machine['date']}", ""]
    out += machine_lines(machine)
    data, runs = results["data"], results["runs"]
    every = [r for rs in runs.values() for r in rs]
    out.append(
        f"Data: {data['events']:,} simulated events ({data['requests']:,} requests of ~20 items, {data['feedback']:,} "
        f"feedback; {args.event_rate:g} requests per second of event time: "
        f"{data['requests'] / args.event_rate / 60:.0f} minutes) + {data['watermarks']} end-of-stream watermarks, "
        f"{PARTITIONS} partitions per topic, produced once. "
        f"Worker command: `{shlex.join(args.command_shown)}`. Runs alternate {', '.join(map(str, args.workers))} "
        f"worker(s), {args.repeat} rounds, a fresh consumer group each; /metrics and /proc polled every "
        f"{args.poll:g} s (a scrape waits while a worker's readout is older than 1.5 s: gaps between polls up to "
        f"{max(r['poll_gap_max'] for r in every):.1f} s, median "
        f"{statistics.median(r['poll_gap_median'] for r in every):.2f} s); busy = at least {args.busy:g} of a core "
        f"over the last {args.window:g} s. Median (min–max) over the runs; runs again because the group rebalanced "
        f"during them: {len(results.get('discarded', []))}."
    )
    out.append("")
    out.append("| Workers | events/s to every request finalised | events/s to A/B-complete | time to A/B-complete, s "
               "| events per worker CPU-second | CPU share of each worker (stage's first) "
               "| work end of each worker, s (stage's first) | tail, s (share of the run) "
               "| stagger of the workers' starts, s | start-up + join, s |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for n in args.workers:
        rs = runs[str(n)]
        shares = [stage_first(r, r["ab_point"]["share"]) for r in rs]
        ends = [stage_first(r, r["work_end"]) for r in rs]
        share_text = " / ".join(fmt_range(summary([s[k] for s in shares]), pct) for k in range(n))
        end_text = " / ".join(fmt_range(summary([e[k] for e in ends]), f1) for k in range(n))
        tail = (f"{fmt_range(summary([r['tail'] for r in rs]), f1)} "
                f"({fmt_range(summary([r['tail_share'] for r in rs]), pct)})") if n > 1 else "–"
        out.append(
            f"| {n} | {fmt_range(summary([r['requests_point']['rate'] for r in rs]))} "
            f"| **{fmt_range(summary([r['ab_point']['rate'] for r in rs]))}** "
            f"| {fmt_range(summary([r['ab_point']['seconds'] for r in rs]), f1)} "
            f"| {fmt_range(summary([r['ab_point']['per_cpu'] for r in rs]))} | {share_text} | {end_text} | {tail} "
            f"| {fmt_range(summary([r['stagger'] for r in rs]), f2) if n > 1 else '–'} "
            f"| {fmt_range(summary([r['startup'] for r in rs]), f1)} |")
    out.append("")
    if all("cores" in r for r in every):
        parts = []
        for n in args.workers:
            rs = runs[str(n)]
            parts.append(f"{n} worker(s): " + ", ".join(
                f"{name} {statistics.median(r['cores'][name] for r in rs):.2f}"
                for name in ("workers", "broker", "poller", "others", "idle")))
        out.append("Cores in use from the start of the work to A/B-complete (median over the runs; /proc/stat and "
                   "/proc/<pid>/stat; \"others\": every other process on the machine): " + "; ".join(parts) + ".")
        if "1" in runs:
            bounds = [f"{n} workers {fmt_range(summary(ceilings(runs, n)), f2)}×" for n in args.workers if n != 1]
            if bounds:
                out.append("What the machine leaves the workers, run by run: the cores the workers used and those left "
                           "idle, ÷ the cores one worker used in the run next to it (the most the workers could reach "
                           "with no core idle and one worker's events per CPU-second; the broker's, the poller's and "
                           "other processes' cores left out): " + ", ".join(bounds) + ".")
        out.append("")
    late = [r["settled_after_done"] for r in every if r["settled_after_done"] > 0]
    out.append("Every run reached A/B-complete (the replay's units, deltas and GAUC); the stage's series last changed "
               + (f"after it in {len(late)} runs (by up to {max(late):.1f} s)." if late
                  else "at or before it in every run."))
    out.append("")
    rows: list[tuple[str, str, str, bool]] = []
    for n in args.workers:
        if n == 1 or "1" not in runs:
            continue
        rs = runs[str(n)]
        up_req = summary(speedups(runs, "requests_point", n))
        up_ab = summary(speedups(runs, "ab_point", n))
        eff = summary([s / n for s in speedups(runs, "ab_point", n)])
        cpu_ratio = summary([b["ab_point"]["per_cpu"] / a["ab_point"]["per_cpu"]
                             for a, b in zip(runs["1"], rs, strict=True)])
        out.append(f"{n} workers ÷ 1, run by run: speed-up to every request finalised "
                   f"{fmt_range(up_req, f2)}×, to A/B-complete **{fmt_range(up_ab, f2)}×**, efficiency "
                   f"{fmt_range(eff, f2)}; events per worker CPU-second {fmt_range(cpu_ratio, f2)}× one worker's. "
                   f"Input partitions of each worker, the stage's first: "
                   f"{'; '.join(' + '.join(','.join(p) for p in stage_first(r, r['partitions'])) for r in rs)}"
                   + (f"; runs with partitions moved (kept after {args.retries} retries): "
                      f"{[r['moved'] for r in rs if r['moved']]}" if any(r["moved"] for r in rs) else "") + ".")
        out.append("")
        tail = summary([r["tail_share"] for r in rs])
        rows.append((f"{n} workers ÷ 1, events/s to A/B-complete", f"≥ {TARGET_SPEEDUP:g}×",
                     f"{fmt_range(up_ab, f2)}×", up_ab["median"] >= TARGET_SPEEDUP))
        rows.append((f"efficiency (speed-up ÷ {n})", f"≥ {TARGET_EFFICIENCY:g}", fmt_range(eff, f2),
                     eff["median"] >= TARGET_EFFICIENCY))
        rows.append(("tail: how long the last worker is busy after the first went idle, share of the run",
                     f"≤ {100 * TARGET_TAIL_SHARE:.0f} %", fmt_range(tail, pct), tail["median"] <= TARGET_TAIL_SHARE))
    base = results.get("baseline_runs")
    if base:
        def rates(rs: list[dict[str, Any]]) -> list[float]:
            return [r["ab_point"]["rate"] for r in rs]

        ups = [f"{n} ÷ 1 **{fmt_range(summary(speedups(base, 'ab_point', n)), f2)}×** (this tree: "
               f"{fmt_range(summary(speedups(runs, 'ab_point', n)), f2)}×)" for n in args.workers if n != 1]
        ratios = [f"{n} worker(s) {fmt_range(summary([a / b for a, b in zip(rates(runs[str(n)]), rates(base[str(n)]), strict=True)]), f2)}×"  # noqa: E501
                  for n in args.workers]
        out.append(f"The baseline tree (`--baseline`, at {args.baseline_commit}), in the same rounds: events/s to "
                   "A/B-complete " + ", ".join(f"{n} worker(s) {fmt_range(summary(rates(base[str(n)])))}"
                                               for n in args.workers)
                   + "; run by run, " + ", ".join(ups) + ". This tree ÷ the baseline, run by run, events/s to "
                   "A/B-complete: " + ", ".join(ratios) + ".")
        out.append("")
    if rows:
        out += ["| Target | Required | Measured | Verdict |", "|---|---|---|---|",
                *(f"| {name} | {required} | {measured} | {verdict(ok)} |" for name, required, measured, ok in rows), ""]
    return "\n".join(out)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="scale-out benchmark of stream-eval worker (see docs/benchmarks.md)")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 rounds")
    p.add_argument("--requests", type=int, help="requests of the backlog (60,000 = ~300k events)")
    p.add_argument("--repeat", type=int, help="rounds of runs (default 3; 2 with --quick)")
    p.add_argument("--workers", default="1,2", help="worker counts run in each round, in order (default 1,2)")
    p.add_argument("--worker-cmd", help="worker command line, a template with {python} {broker} {bootstrap} "
                                        "{prefix} {group} {port} (default: python -m stream_eval.cli worker --broker "
                                        "{broker} --topic-prefix {prefix} --metrics-port {port} --group {group}). "
                                        "To run another source tree's worker, start it from that tree (python -m "
                                        "puts the working directory first on the path, before PYTHONPATH): "
                                        "\"sh -c 'cd TREE && exec {python} -m stream_eval.cli worker ...'\"")
    p.add_argument("--worker-args", default="", help="extra arguments for every worker, e.g. "
                                                     "'--attribution-window 60s'")
    p.add_argument("--event-rate", type=float, default=EVENT_RATE,
                   help=f"simulated requests per second of event time (default {EVENT_RATE:g}: the backlog spans "
                        "less than the 30-minute attribution window, so every request is finalised at its end)")
    p.add_argument("--poll", type=float, default=0.1, help="seconds between polls (default 0.1)")
    p.add_argument("--settle", type=float, default=STAGE_SETTLE_SECONDS,
                   help=f"seconds the stage's series must stand still (default {STAGE_SETTLE_SECONDS:g})")
    p.add_argument("--busy", type=float, default=0.1, help="CPU rate (cores) from which a worker is busy (0.1)")
    p.add_argument("--window", type=float, default=1.0, help="seconds over which the CPU rate is taken (1.0)")
    p.add_argument("--retries", type=int, default=2, help="runs again when the group rebalanced during a run (2)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a run counts as failed")
    p.add_argument("--tag", default="", help="suffix of the output files' names")
    p.add_argument("--kafka", action="store_true", help="on Apache Kafka (scripts/kafka/fetch) instead of Tansu")
    p.add_argument("--baseline", help="a source tree of another commit (e.g. a git worktree): its workers run too, "
                                      "in the same rounds, as the same-run baseline")
    p.add_argument("--out-dir", default=str(HERE / "out"))
    args = p.parse_args(argv)
    args.baseline, args.baseline_commit = source_tree(args.baseline)
    args.requests = args.requests or 60_000
    args.repeat = args.repeat or (2 if args.quick else 3)
    args.workers = [int(n) for n in args.workers.split(",")]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    started = time.perf_counter()
    broker, machine["broker"] = start_broker(args.kafka)
    with broker:
        bench = ScaleBench(args, broker.bootstrap, broker.process.pid if broker.process is not None else None)
        args.command_shown = [{sys.executable: "python", "0": "PORT"}.get(part, part).replace(broker.bootstrap,
                                                                                             "HOST:PORT")
                              for part in bench.command("PREFIX", "GROUP", 0)]
        log(f"broker on {broker.bootstrap}; worker command: {shlex.join(args.command_shown)}")
        bench.throughput()
    machine["loadavg_end"] = os.getloadavg()
    machine["code_hash_end"] = code_hash()
    machine["bench_seconds"] = time.perf_counter() - started
    text = render(bench.results, machine, args)
    name = "scale" + ("-quick" if args.quick else "") + (f"-{args.tag}" if args.tag else "")
    (Path(args.out_dir) / f"{name}.md").write_text(text + "\n")
    (Path(args.out_dir) / f"{name}.json").write_text(
        json.dumps({"machine": machine, "args": vars(args), "results": bench.results}, indent=1, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
