"""The worker's CPU per event under steady live traffic, with features on and off: the cost of the A/B units (and of a
config file's features) where no backlog ends, so no end-of-backlog tail is counted.

    python bench/steady.py                                  # 3 rounds: A/B units on, off; 10,000 events/s, 40 s each
    python bench/steady.py --config bench/all-on.toml       # also the worker with that file (A/B/n traffic)
    python bench/steady.py --rate 30000 --seconds 60 --repeat 5
    python bench/steady.py --baseline ../old                # also another commit's worker (a git worktree)

``bench/stream.py`` times a backlog to its end: its A/B-units cost includes the last looks' way to stage partition 0
(two or three checkpoints after the input ends) and the readouts meanwhile, a fixed cost a longer backlog shares out
over more events. Here a Tansu broker on a free port, and per run a fresh topic prefix with ``stream-eval simulate
--broker --requests 0 --rate N`` (live traffic, event time = wall clock; with ``--config``, three treatments and a
``platform`` attribute, users as units) and one ``stream-eval worker`` of a fresh group on it; the variants of a
round run one after the other, the rounds alternate. Each run is measured after ``--warmup`` s of counting: the
worker's CPU seconds (``/proc``) and the events it counted (``stream_eval_events_total``) over the next
``--seconds`` s; reported: events per CPU-second and the share of a core, median (min-max), and the cost of each
feature, 1 - its events per CPU-second / the baseline's, run by run. Written to ``bench/out/steady.md``. Meanwhile
/metrics is scraped every ``--scrape-every`` s (15, a common Prometheus interval: a worker scraped less often than
every 3 s takes its readouts at the scrapes; 1: a live view's, and the worker takes them every second).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import fmt_range, machine_info, summary  # noqa: E402
from stream import cpu_seconds, progress, scrape, source_tree, tree_env  # noqa: E402

from stream_eval.stream.broker import Broker, free_port, stop_process  # noqa: E402

COMMAND = [sys.executable, "-m", "stream_eval.cli"]
#: The name of ``--baseline``'s worker among the variants.
BASELINE = "baseline tree, A/B units on"


def run(broker: Broker, name: str, env: dict[str, str], extra: list[str], args: argparse.Namespace,
        traffic_args: list[str], source: str | None = None) -> dict[str, float]:
    """One run of the worker (``extra``: more of its arguments; ``source``: the source tree it runs from, first on
    its path, else this one) on fresh live traffic; its CPU and events."""
    prefix = f"steady-{name}-{time.monotonic_ns()}."
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    traffic = subprocess.Popen([*COMMAND, "simulate", "--broker", broker.url, "--requests", "0", "--rate",
                                str(args.rate), "--topic-prefix", prefix, *traffic_args], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([*COMMAND, "worker", "--broker", broker.url, "--metrics-port", str(port),
                               "--topic-prefix", prefix, "--group", prefix.rstrip("."), *extra],
                              env=tree_env(source, env), cwd=source,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:  # counting
            if time.monotonic() > deadline or worker.poll() is not None or traffic.poll() is not None:
                raise RuntimeError(f"{name}: the worker did not start counting")
            try:
                if progress(scrape(url))[0] > 0:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        stop = threading.Event()
        scraper = threading.Thread(target=scrape_every, args=(url, args.scrape_every, stop), daemon=True)
        scraper.start()  # (as Prometheus scrapes the worker)
        time.sleep(args.warmup)
        events0, cpu0, t0 = progress(scrape(url))[0], cpu_seconds(worker.pid), time.monotonic()
        time.sleep(args.seconds)
        events1, cpu1, t1 = progress(scrape(url))[0], cpu_seconds(worker.pid), time.monotonic()
        stop.set()
    finally:
        stop_process(traffic)
        stop_process(worker)
    events, cpu = events1 - events0, cpu1 - cpu0
    return {"events": events, "cpu_s": cpu, "per_cpu": events / cpu, "cores": cpu / (t1 - t0),
            "events_per_s": events / (t1 - t0)}


def scrape_every(url: str, seconds: float, stop: threading.Event) -> None:
    """Scrape ``url`` every ``seconds`` until ``stop`` (not at all when ``seconds`` is 0)."""
    while seconds > 0 and not stop.wait(seconds):
        with contextlib.suppress(OSError):
            scrape(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=10000.0, help="events/s of the live traffic (10,000)")
    parser.add_argument("--seconds", type=float, default=40.0, help="seconds measured per run (40)")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of counting before (15)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (3)")
    parser.add_argument("--scrape-every", type=float, default=15.0, help="seconds between two scrapes of the "
                        "worker's /metrics while it counts, as Prometheus scrapes it (15; 0: only the measurement's "
                        "two, at its start and end)")
    parser.add_argument("--config", help="also the worker with --config FILE (and A/B/n traffic for every run)")
    parser.add_argument("--baseline", metavar="DIR", help="a source tree of another commit (e.g. a git worktree): "
                        "its worker runs too, A/B units on, in the same rounds (its events per CPU-second against "
                        "this tree's, run by run)")
    parser.add_argument("--out-dir", default=str(HERE / "out"))
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_EVAL_")}
    traffic_args = ["--unit", "user"]
    if args.config:
        traffic_args += ["--arms", "control:0.55,better:0.7,worse:0.4,same:0.55", "--segment",
                         "platform=ios,android,web"]
    # (name, environment, more worker arguments, the source tree it runs from: None for this one)
    variants: list[tuple[str, dict[str, str], list[str], str | None]] = [
        ("A/B units on", {**env, "STREAM_EVAL_AB": "true"}, [], None),
        ("A/B units off", {**env, "STREAM_EVAL_AB": "false"}, [], None),
    ]
    if args.config:
        variants.append((f"--config {args.config}", {**env, "STREAM_EVAL_AB": "true"}, ["--config", args.config],
                         None))
    baseline, baseline_commit = source_tree(args.baseline)
    if baseline is not None:
        variants.append((BASELINE, {**env, "STREAM_EVAL_AB": "true"}, [], baseline))
    started, machine = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine_info()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in variants}
    with Broker(free_port()) as broker:
        for i in range(args.repeat):
            for name, variant_env, extra, source in (variants if i % 2 == 0 else variants[::-1]):
                slug = "".join(c if c.isalnum() else "-" for c in name.lower())
                runs[name].append(run(broker, slug, variant_env, extra, args, traffic_args, source))
                r = runs[name][-1]
                print(f"round {i + 1}: {name}: {r['events_per_s']:,.0f} events/s, {r['per_cpu']:,.0f} per "
                      f"CPU-second, {r['cores']:.2f} cores", flush=True)
    lines = [f"## The worker under steady live traffic: {started}", "",
             f"Machine: {machine['cpu']}, {machine['cores']} cores; {machine['python']}; stream_eval at "
             f"{machine['commit']}. Command: `python3 bench/steady.py {' '.join(sys.argv[1:])}`.", "",
             f"Live traffic asked at {args.rate:,.0f} events/s ({' '.join(traffic_args)}), {args.seconds:.0f} s "
             f"measured after {args.warmup:.0f} s of counting, {args.repeat} rounds, /metrics scraped "
             + (f"every {args.scrape_every:g} s" if args.scrape_every > 0 else "only at the start and end") +
             "; median (min-max).", "",
             "| worker | events/s counted | events per CPU-second | cores |", "|---|---|---|---|"]
    for name, rows in runs.items():
        cells = [fmt_range(summary([r[key] for r in rows]), f) for key, f in (
            ("events_per_s", "{:,.0f}".format), ("per_cpu", "{:,.0f}".format), ("cores", "{:.2f}".format))]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    base = runs["A/B units off"]
    lines.append("")
    for name, rows in runs.items():
        if name in ("A/B units off", BASELINE):
            continue
        against = base if name == "A/B units on" else runs["A/B units on"]
        costs = [1.0 - r["per_cpu"] / b["per_cpu"] for r, b in zip(rows, against, strict=True)]
        what = "the A/B units" if name == "A/B units on" else f"`{name}` (against the A/B units on)"
        lines.append(f"Cost of {what}, events per CPU-second, run by run: "
                     f"{fmt_range(summary(costs), lambda x: f'{100 * x:.1f} %')}.")
    if baseline is not None:
        ratios = [r["per_cpu"] / b["per_cpu"] for r, b in zip(runs["A/B units on"], runs[BASELINE], strict=True)]
        lines.append(f"This tree ÷ the baseline's (`--baseline`, at {baseline_commit}), A/B units on, events per "
                     f"CPU-second, run by run: {fmt_range(summary(ratios), lambda x: f'{x:.2f}×')}.")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "steady.md").write_text(text)
    (out / "steady.json").write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
