"""Soak: the worker under steady simulated traffic for a long time, scraped like Prometheus would.

    python bench/soak.py                 # 30 min at 3,000 events/s, scrapes every 5 s
    python bench/soak.py --minutes 3     # a short run (smoke)

A Tansu broker on a free port, one ``stream-eval worker`` child and ``stream-eval simulate --broker --requests 0
--rate N`` (live traffic, event time = wall clock, users as randomisation units) as another child. Short horizons
(attribution window 60 s, allowed lateness 5 s, session gap 60 s, GSB window 60 s) so that the worker's steady
state (open requests, sessions, windows of 5 m / 1 h) is reached in minutes: the 1 h window fills for an hour,
so its buckets are the one thing still growing in a 30 min run (a few KB a minute; said in the report).

Every ``--scrape-every`` s this process scrapes ``/metrics`` (timing it) and reads the worker's RSS, open file
descriptors and threads from ``/proc``. Warm-up is the first ``--warmup`` minutes (default 5). The report compares
the warm-up's end with the end: RSS (target: at most +10 %), file descriptors and threads (no growth), scrape time
(stable: median of the first and last 5 minutes after warm-up), and events counted per second against the
producer's rate (the worker keeps up). Written to ``bench/out/soak.md`` (raw series in ``soak.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import machine_info  # noqa: E402
from stream import progress, scrape  # noqa: E402

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


def soak(args: argparse.Namespace) -> dict[str, Any]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("STREAM_EVAL_")}, **SETTINGS}
    command = [sys.executable, "-m", "stream_eval.cli"]
    rows: list[dict[str, float]] = []
    with Broker(free_port()) as broker:
        port = free_port()
        worker = subprocess.Popen([*command, "worker", "--broker", broker.url, "--metrics-port", str(port),
                                   "--topic-prefix", "soak.", "--group", "soak"], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
                rows.append({"t": round(tick - start, 1), "rss_mb": rss, "fds": fds, "threads": threads,
                             "scrape_s": seconds, "scrape_bytes": len(text), "events": events, "requests": requests})
                time.sleep(max(0.0, args.scrape_every - (time.monotonic() - tick)))
        finally:
            stop_process(traffic)
            stop_process(worker)
    return {"rows": rows, "args": vars(args)}


def _window(rows: list[dict[str, float]], start: float, end: float) -> list[dict[str, float]]:
    return [r for r in rows if start <= r["t"] < end]


def render(result: dict[str, Any], machine: dict[str, Any]) -> str:
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

    rss_warm, rss_end = med(first, "rss_mb"), med(final, "rss_mb")
    growth = rss_end / rss_warm - 1.0
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
        f"| scrape time, ms | {1000 * med(first, 'scrape_s'):.1f} | {1000 * med(final, 'scrape_s'):.1f} | "
        f"max {1000 * max(r['scrape_s'] for r in after):.0f} |",
        f"| /metrics size, KB | {med(first, 'scrape_bytes') / 1024:.0f} | {med(final, 'scrape_bytes') / 1024:.0f} | |",
        "",
        f"Events counted after warm-up: {rate:,.0f}/s for {args['rate']:,.0f}/s produced; requests finalised: "
        f"{after[-1]['requests']:,.0f} in all.",
        "",
        f"Verdict: RSS {'flat' if growth <= TARGET_RSS_GROWTH else 'GREW'} ({100 * growth:+.1f} %); "
        f"file descriptors {'flat' if med(final, 'fds') <= med(first, 'fds') else 'grew'}; threads "
        f"{'flat' if med(final, 'threads') <= med(first, 'threads') else 'grew'}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=3000.0, help="events per second of simulated traffic")
    p.add_argument("--scrape-every", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=5.0, help="minutes left out before comparing (default 5)")
    p.add_argument("--out-dir", default=str(HERE / "out"))
    args = p.parse_args(argv)
    args.warmup = min(args.warmup, args.minutes / 3)
    machine = machine_info()
    result = soak(args)
    report = render(result, machine)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.md").write_text(report)
    (out / "soak.json").write_text(json.dumps(result))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
