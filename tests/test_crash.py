"""kill -9 of a worker (docs/reliability.md, "What is not safe yet"): nothing lost, nothing counted twice.

The requirement: kill -9 a worker at any moment, any number of times, with or without a second worker in the group;
once the group has caught up, every finalised total on /metrics (summed over the live workers), the sessions and
GAUC, GSB, the A/B statistics and the rolling windows equal those of an uninterrupted run and of ``stream-eval
replay`` of the same log, exactly; ``request-metrics`` holds every finalised request exactly once.

Every worker here is a ``stream-eval worker`` process killed with SIGKILL and started again; the log goes through
``stream-eval produce --speed`` so that the kills land while it is being read. The expected numbers are those of
the replay of the same log (``stream-eval replay --format json --per-request``, and the in-process replay's engine
read through :class:`EngineCollector`, which gives the same series as a worker's /metrics). Select these tests with
``-k test_kill_``.

What is compared, from the /metrics of every live worker:

* summed over the workers and over every label that is not one of :data:`CONTRACT_LABELS` (a worker may add labels
  such as a partition or a generation to its counters): ``stream_eval_requests_total``, ``..._metric_sum_total``
  (1e-9 relative) and ``..._metric_count_total`` per experiment, arm and metric (``metric="AUC"``: GAUC's weighted
  sum of session AUCs and its weight), ``..._gsb_total``, ``..._events_total``, the overflow counters, and the
  rolling windows ``..._window_sum`` (1e-9) / ``..._window_count``;
* from the one worker that exports them (the regroup stage's; never summed): ``stream_eval_ab_*``,
  ``stream_eval_srm_*`` and ``stream_eval_gsb_p_value``, bit for bit (a value on two workers fails; a NaN on
  another worker, next to the value, is only noted).

The windows: the log spans less than the shortest window (5 min of event time), so that at any finite watermark
past its start each window holds every request and every scored session: its sums are the totals. Replay has no
windows (and its last watermark is not a worker's), so they are compared with the totals of replay; that an
uninterrupted worker's windows are exactly those is checked by the ``uninterrupted`` and ``no-kill`` cases.

"Caught up": the numbers are replay's, or nothing has changed for :data:`SETTLE` seconds with every live worker
ready (``/readyz`` 200) and one holding the regroup stage; a group that never gets there (a worker stuck in a
rebalance) fails after 120 s with the last values seen. On a failure the timeline of starts and kills (where each
kill landed) and the tail of every worker's log are printed.

``STREAM_EVAL_CRASH_SEED=N`` (default 0) shifts every seed here, the log's and each scenario's kill moments, so that
a campaign of runs meets other moments than CI's (docs/reliability.md, "Stress campaigns")::

    for n in 1 2 3; do STREAM_EVAL_CRASH_SEED=$n python3 -m pytest tests/test_crash.py -k kill || break; done
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import read_topic
from test_stream import _log

from stream_eval.config import format_duration, load_config
from stream_eval.engine.engine import FinalisedBatch
from stream_eval.engine.replay import replay
from stream_eval.stream.broker import die_with_parent, free_port
from stream_eval.stream.demo import parse_metrics
from stream_eval.stream.kafka import topics

#: The short horizons of ``test_stream.SHORT``, as the workers' and replay's ``--config`` file.
SHORT_TOML = 'attribution_window = "20s"\nallowed_lateness = "5s"\nsession_gap = "20s"\ngsb_window = "30s"\n'
REQUESTS = 3000
#: Added to every seed of this module (the log's, the kill moments'): 0 in CI.
SHIFT = int(os.environ.get("STREAM_EVAL_CRASH_SEED", "0"))
SEED = 41 + SHIFT
#: ``stream-eval produce --speed``: the log's ~75 s of event time in ~37 s.
SPEED = 2.0
#: Labels of the series in docs/contract.md §5: everything else a worker adds is summed over.
CONTRACT_LABELS = frozenset({"experiment", "arm", "metric", "window", "source", "verdict", "type", "status", "kind",
                             "label", "le", "code"})
#: Counters and gauges that add up over workers: (name, compared exactly) (False: 1e-9 relative).
SUMMED = {"stream_eval_requests_total": True, "stream_eval_metric_sum_total": False,
          "stream_eval_metric_count_total": True, "stream_eval_gsb_total": True, "stream_eval_events_total": True,
          "stream_eval_invalid_events_total": True,
          "stream_eval_label_overflow_total": True, "stream_eval_overflow_total": True,
          "stream_eval_window_sum": False, "stream_eval_window_count": True,
          # each worker's stage partitions' shards of the A/B units
          "stream_eval_ab_units": True, "stream_eval_ab_unit_conflicts_total": True}
#: Series that one worker exports: the A/B rows and SRM tests from the worker of stage partition 0 (which merges
#: the looks), an experiment's sign tests from the worker of its stage partition. Taken from it, never summed;
#: compared bit for bit.
ONE_WORKER = ("stream_eval_ab_delta", "stream_eval_ab_ci_lower", "stream_eval_ab_ci_upper", "stream_eval_ab_cs_lower",
              "stream_eval_ab_cs_upper", "stream_eval_ab_p_value", "stream_eval_ab_lift",
              "stream_eval_ab_lift_cs_lower", "stream_eval_ab_lift_cs_upper", "stream_eval_srm_p_value",
              "stream_eval_srm_mismatch", "stream_eval_gsb_p_value")
NO_SECURITY_ENV = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_EVAL_")}
#: Seconds everything must stay unchanged, every live worker ready, before the numbers count as final.
SETTLE = 10.0

Key = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, contract labels)


class Stalled(AssertionError):
    """The live workers did not catch up in time (a liveness failure: nothing was compared yet)."""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "stream_eval.cli", *args]


def _key(name: str, labels: dict[str, str]) -> Key:
    """The series' identity: its name and contract labels. Invalid events are counted by the type of the topic they
    came from on a worker (a broken line goes to the rankings topic) and by their own in replay: compared as one
    total, as the report's ``events.invalid``, and by reason code over all types."""
    if name == "stream_eval_events_total" and labels.get("status") == "invalid":
        labels = {"status": "invalid"}
    elif name == "stream_eval_invalid_events_total":
        labels = {"code": labels["code"]}
    return name, tuple(sorted((k, v) for k, v in labels.items() if k in CONTRACT_LABELS))


def _show(key: Key) -> str:
    return key[0] + "{" + ",".join(f'{k}="{v}"' for k, v in key[1]) + "}"


def _same(a: float, b: float, exact: bool) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if exact:
        return a == b
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b)) + 1e-12


# -- what replay says ---------------------------------------------------------------------------------------------

@dataclass
class Expected:
    """The log, the config file, and what ``stream-eval replay`` gives for them, as /metrics series and records."""

    log: Path
    config: Path
    series: dict[Key, float]
    records: dict[str, dict[str, Any]]
    report: dict[str, Any]

    @property
    def requests(self) -> int:
        return int(self.report["overall"]["requests"])

    @property
    def judgments(self) -> int:
        return int(self.report["events"]["judgment"])


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> Expected:
    from prometheus_client import CollectorRegistry

    from stream_eval.export.prometheus import EngineCollector

    directory = tmp_path_factory.mktemp("crash-log")
    log, config_file, per_request = directory / "log.jsonl", directory / "short.toml", directory / "per-request.jsonl"
    lines = _log(REQUESTS, seed=SEED, short=True)
    log.write_bytes(b"".join(lines))
    config_file.write_text(SHORT_TOML)
    done = subprocess.run(_cli("replay", str(log), "--format", "json", "--no-progress", "--config", str(config_file),
                               "--per-request", str(per_request)), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report = orjson.loads(done.stdout)
    records = [orjson.loads(line) for line in per_request.read_bytes().splitlines() if line.strip()]
    by_id = {r["request_id"]: r for r in records}
    assert len(by_id) == len(records) == report["overall"]["requests"] == REQUESTS
    # the in-process replay is the CLI's (same report, same records), read through the exporter the workers use
    finalised: dict[str, dict[str, Any]] = {}

    def keep(batch: FinalisedBatch) -> None:
        for record in batch.records():
            finalised[record["request_id"]] = record

    config = load_config(str(config_file), environ={})
    engine = replay([str(log)], config, keep)
    assert orjson.loads(orjson.dumps(engine.report())) == report
    assert finalised == by_id
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    series: dict[Key, float] = defaultdict(float)
    for family in registry.collect():
        for sample in family.samples:
            if sample.name in SUMMED or sample.name in ONE_WORKER:
                series[_key(sample.name, sample.labels)] += float(sample.value)  # adds: invalid events (_key)
    series = dict(series)
    # the windows: the log is shorter than the shortest window, so each window holds every request and session
    times = [ts for ts in map(_ranking_ts, lines) if ts is not None]
    assert max(times) - min(times) + config.attribution_window + config.session_gap < min(config.windows) - 60
    means = {spec.name: spec.mean_name for spec in engine.specs} | {"AUC": "GAUC"}
    for (name, labels), value in list(series.items()):
        if name in ("stream_eval_metric_sum_total", "stream_eval_metric_count_total"):
            fields = dict(labels)
            window = "stream_eval_window_sum" if name.endswith("sum_total") else "stream_eval_window_count"
            for length in config.windows:
                series[_key(window, {**fields, "metric": means[fields["metric"]],
                                     "window": format_duration(length)})] = value
    assert series[_key("stream_eval_requests_total", {"experiment": "exp1", "arm": "control"})] > 0
    return Expected(log, config_file, series, by_id, report)


def _ranking_ts(line: bytes) -> float | None:
    """The serve time of a ranking line (``None`` for other lines and broken ones)."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if isinstance(event, dict) and event.get("type") == "ranking" and isinstance(event.get("ts"), int | float):
        return float(event["ts"])
    return None


# -- workers as processes -----------------------------------------------------------------------------------------

@dataclass
class Worker:
    """One ``stream-eval worker`` process: its /metrics and /readyz, and its log (``--loglevel info``)."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log: Path
    killed: bool = False

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:  # noqa: S310  # local
            return str(response.read().decode())

    def samples(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        return parse_metrics(self.metrics_text())

    def readiness(self) -> tuple[int, str]:
        """``/readyz``: (status, reason); (0, why) while it does not answer."""
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=5) as response:  # noqa: S310  # local
                return response.status, orjson.loads(response.read())["reason"]
        except urllib.error.HTTPError as error:
            return error.code, orjson.loads(error.read())["reason"]
        except (OSError, ValueError) as error:
            return 0, f"no answer ({type(error).__name__})"

    def ready(self) -> bool:
        return self.readiness()[0] == 200

    def joined(self) -> bool:
        """The worker's consumer holds partitions (being assigned, rebuilding, reading, or caught up)."""
        status, reason = self.readiness()
        return status == 200 or (status == 503 and not reason.startswith(("starting", "no partitions", "rebalancing")))

    def holds_stage(self) -> bool:
        """Its log says it took partition 0 of the regroup stage (which merges the A/B looks) and has not given it
        up since."""
        said = re.findall(r"(took|gave up) stage partition 0\b", self.log.read_text(errors="replace"))
        return bool(said) and said[-1] == "took"

    def transactional(self) -> bool:
        """Whether its log says it delivers with Kafka transactions (``--delivery auto`` on a broker that runs them)."""
        return "delivery: transactions" in self.log.read_text(errors="replace")

    def holds(self) -> int:
        """Partitions its log says it took from an owner that had not released them: hand-over holds begun (the
        fenced log); with transactions, which need no hold, checkpoints restored."""
        pattern = r"restoring the checkpoint" if self.transactional() else r"did not release it: hand-over hold"
        return len(re.findall(pattern, self.log.read_text(errors="replace")))

    def events(self) -> float:
        try:
            return sum(v for _, v in self.samples().get("stream_eval_events_total", []))
        except OSError:
            return -1.0


class Cluster:
    """Worker processes of one consumer group on the session's broker, a producer, and a timeline of what was done.

    Every process is killed on exit; on an error the timeline and the tail of every worker's log are printed
    (pytest shows them with the failure).
    """

    def __init__(self, broker: str, name: str, expected: Expected, directory: Path) -> None:
        safe = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")
        self.broker, self.expected, self.directory = broker, expected, directory
        self.prefix, self.group = f"crash-{safe}-{os.getpid()}.", f"crash-{safe}"
        self.workers: list[Worker] = []  # every worker started, the killed ones too
        self.producer: subprocess.Popen[bytes] | None = None
        self.producer_log = directory / "produce.log"
        self.started = time.monotonic()
        self.timeline: list[str] = []
        self.nan_elsewhere: set[str] = set()  # one-worker series also exported, as NaN, by another worker
        self.env = {**NO_SECURITY_ENV, "TMPDIR": str(directory)}  # faust's data dirs of killed workers land here

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, kind: object, error: object, tb: object) -> None:
        self.close()
        if error is not None:
            print("\n".join(["timeline:", *self.timeline]))
            for worker in self.workers:
                text = worker.log.read_text(errors="replace").splitlines()
                print(f"\n---- {worker.name} ({worker.log}), last 40 of {len(text)} lines ----")
                print("\n".join(text[-40:]))
            if self.producer_log.exists():
                print(f"\n---- produce ----\n{self.producer_log.read_text(errors='replace')[-2000:]}")

    def close(self) -> None:
        """Kill every process still running (idempotent)."""
        for process in [w.process for w in self.workers] + ([self.producer] if self.producer else []):
            if process.poll() is None:
                process.kill()
            process.wait()

    def note(self, what: str) -> None:
        line = f"{time.monotonic() - self.started:6.1f}s {what}"
        self.timeline.append(line)
        print(line)

    @property
    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]

    def produce(self, speed: float = SPEED) -> None:
        with open(self.producer_log, "wb") as out:
            self.producer = subprocess.Popen(
                _cli("produce", str(self.expected.log), "--broker", f"kafka://{self.broker}", "--topic-prefix",
                     self.prefix, "--speed", f"{speed:g}"),
                stdout=out, stderr=subprocess.STDOUT, env=self.env, preexec_fn=die_with_parent())
        self.note(f"produce started (--speed {speed:g})")

    def producing(self) -> bool:
        return self.producer is not None and self.producer.poll() is None

    def start(self, name: str) -> Worker:
        port = free_port()
        log = self.directory / f"{name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                _cli("worker", "--broker", f"kafka://{self.broker}", "--topic-prefix", self.prefix, "--group",
                     self.group, "--metrics-port", str(port), "--metrics-host", "127.0.0.1", "--config",
                     str(self.expected.config), "--loglevel", "info"),
                stdout=out, stderr=subprocess.STDOUT, env=self.env, preexec_fn=die_with_parent())
        worker = Worker(name, process, f"http://127.0.0.1:{port}", log)
        self.workers.append(worker)
        self.note(f"started {name} (pid {process.pid}, port {port})")
        return worker

    def kill(self, worker: Worker) -> None:
        status, reason = worker.readiness()
        events, stage = worker.events(), worker.holds_stage()
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.killed = True
        worker.process.wait()
        self.note(f"killed {worker.name}: {events:.0f} events read, /readyz {status} {reason!r}, "
                  f"{'holding' if stage else 'not holding'} the regroup stage, producer "
                  f"{'running' if self.producing() else 'done'}")

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            self.no_crash(what)
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(0.1)

    def no_crash(self, what: str) -> None:
        """Fail if a worker that was not killed has exited."""
        for worker in self.workers:
            if not worker.killed and worker.process.poll() is not None:
                raise AssertionError(f"{worker.name} exited by itself ({worker.process.returncode}) while waiting "
                                     f"for {what}")

    def wait_joined(self, worker: Worker, timeout: float = 60) -> None:
        self.wait(worker.joined, timeout, f"{worker.name} to get partitions")
        self.note(f"{worker.name} has partitions ({worker.readiness()[1]})")

    def stage_holder(self, timeout: float = 60) -> Worker:
        self.wait(lambda: any(w.holds_stage() for w in self.live), timeout, "a live worker to hold the regroup stage")
        return next(w for w in self.live if w.holds_stage())

    def wait_produced(self, timeout: float = 120) -> None:
        self.wait(lambda: not self.producing(), timeout, "produce to finish")
        assert self.producer is not None and self.producer.returncode == 0, self.producer_log.read_text()[-2000:]
        self.note("produce done (end-of-stream watermarks sent)")

    # -- the numbers ------------------------------------------------------------------------------------------
    def view(self) -> tuple[dict[Key, float], list[str]]:
        """The live workers' series as one: :data:`SUMMED` added up, :data:`ONE_WORKER` from the worker exporting
        them; and what is wrong with how they are spread (a one-worker series with a value on two workers, or twice
        on one under labels that are not the contract's). A NaN next to a value is left out (a worker that gave the
        regroup stage up may keep a sign test of nothing): noted, not failed."""
        summed: dict[Key, float] = defaultdict(float)
        found: dict[Key, list[tuple[str, float, dict[str, str]]]] = defaultdict(list)
        for worker in self.live:
            for name, samples in worker.samples().items():
                for labels, value in samples:
                    key = _key(name, labels)
                    if name in SUMMED:
                        summed[key] += value
                    elif name in ONE_WORKER:
                        found[key].append((worker.name, value, labels))
        single: dict[Key, float] = {}
        problems: list[str] = []
        for key, candidates in found.items():
            values = [c for c in candidates if not math.isnan(c[1])] or candidates[:1]
            if len(values) > 1:
                problems.append(f"{_show(key)} exported more than once: " + ", ".join(
                    f"by {worker} ({value!r}, labels {labels})" for worker, value, labels in values))
            elif len(candidates) > 1:
                self.nan_elsewhere.add(f"{_show(key)}: NaN on " + ", ".join(
                    worker for worker, value, _ in candidates if math.isnan(value) and worker != values[0][0]))
            single[key] = values[0][1]
        return {**summed, **single}, problems

    def caught_up(self, timeout: float = 120) -> tuple[dict[Key, float], list[str]]:
        """Wait until the live workers' numbers are the replay's, or stay unchanged for :data:`SETTLE` seconds
        with every live worker ready and one of them holding the regroup stage; then :meth:`view` (a last look
        :data:`SETTLE` / 2 later, so that anything still arriving, such as a record counted twice, is seen)."""
        expected = self.expected
        want = expected.series
        deadline = time.monotonic() + timeout
        last: dict[Key, float] | None = None
        since = time.monotonic()
        progress = ""
        while True:
            self.no_crash("the workers to catch up")
            ready = [(w.name, *w.readiness()) for w in self.live]
            stage = any(w.holds_stage() for w in self.live)
            failed = ""
            try:
                seen, _ = self.view()
            except OSError as error:
                seen, failed = {}, f"; a scrape failed: {error}"
            if seen != last:
                last, since = seen, time.monotonic()
            requests = sum(v for (n, _), v in seen.items() if n == "stream_eval_requests_total")
            judged = sum(v for (n, labels), v in seen.items()
                         if n == "stream_eval_gsb_total" and ("source", "judgment") in labels)
            progress = (f"requests {requests:.0f} of {expected.requests}, judgment verdicts {judged:.0f} of "
                        f"{expected.judgments}; regroup stage {'held' if stage else 'not held'}; "
                        f"/readyz {ready}{failed}")
            all_ready = bool(ready) and all(status == 200 for _, status, _ in ready)
            if seen and _mismatches(want, seen) == [] and all_ready:
                break
            if seen and all_ready and stage and time.monotonic() - since >= SETTLE:
                break
            if time.monotonic() > deadline:
                raise Stalled(f"not caught up after {timeout:g}s: {progress}")
            time.sleep(0.5)
        self.note(f"caught up: {progress}")
        time.sleep(SETTLE / 2)
        return self.view()

    def check(self) -> None:
        """/metrics of the live workers, then the request-metrics records, against replay (every difference of
        both reported together)."""
        view, problems = self.caught_up()
        if self.nan_elsewhere:
            self.note("also exported as NaN by a worker without the regroup stage: " + "; ".join(
                sorted(self.nan_elsewhere)))
        mismatches = _mismatches(self.expected.series, view)
        if mismatches:
            by_name = Counter(line.split("{")[0] for line in mismatches)
            shown: Counter[str] = Counter()
            lines = []
            for line in mismatches:
                name = line.split("{")[0]
                shown[name] += 1
                if shown[name] <= 6:
                    lines.append(line)
            problems.append(f"/metrics: {len(mismatches)} series differ from replay's ({dict(by_name)}); "
                            f"{_headline(view, self.expected.series)}:\n" + "\n".join(lines))
        else:
            self.note("/metrics: replay's numbers")
        problems += self.records_problems()
        problems += self.dead_letter_problems()
        if problems:  # for the post-mortem: each live worker's /metrics as scraped
            for worker in self.live:
                with contextlib.suppress(OSError):
                    (self.directory / f"{worker.name}.metrics.txt").write_text(worker.metrics_text())
        # the input itself, as produced (a producer that resent a batch would explain a count above replay's)
        if problems:
            judgments = asyncio.run(read_topic(self.broker, topics(self.prefix).judgments, self.expected.judgments))
            values = Counter(r.value for r in judgments)
            problems.append(f"(the judgments topic holds {len(judgments)} records, {len(values)} distinct; replay "
                            f"counted {self.expected.judgments} valid judgments)")
        assert not problems, "\n\n".join(problems)

    def records_problems(self) -> list[str]:
        expected = self.expected.records
        records = asyncio.run(read_topic(self.broker, topics(self.prefix).request_metrics, len(expected)))
        ids = Counter(r.key.decode() for r in records)
        twice = {k: n for k, n in ids.items() if n > 1}
        missing, extra = expected.keys() - ids.keys(), ids.keys() - expected.keys()
        if twice or missing or extra:
            return [f"request-metrics: {len(records)} records of {len(ids)} request ids for replay's {len(expected)}: "
                    f"{len(twice)} ids more than once ({sum(twice.values()) - len(twice)} extra records, e.g. "
                    f"{sorted(twice)[:5]}), {len(missing)} missing (e.g. {sorted(missing)[:5]}), {len(extra)} not in "
                    "replay"]
        values = {r.key.decode(): orjson.loads(r.value) for r in records}
        differ = sorted(k for k, v in values.items() if v != expected[k])
        if differ:
            return [f"request-metrics: {len(differ)} records differ from replay's, e.g. {values[differ[0]]} != "
                    f"{expected[differ[0]]}"]
        self.note(f"request-metrics: {len(records)} records, each request once, replay's values")
        return []


    def dead_letter_problems(self) -> list[str]:
        """Every invalid message of the log dead-lettered: exactly once with transactions; with the fenced log at
        least once (docs/reliability.md, "Known gaps"), copies told apart by the topic, partition and offset in
        their headers."""
        invalid = int(self.expected.report["events"]["invalid"])
        dead = asyncio.run(read_topic(self.broker, topics(self.prefix).dead_letters, invalid))
        where = Counter(tuple(dict(r.headers)[h] for h in ("topic", "partition", "offset")) for r in dead)
        copies = sum(where.values()) - len(where)
        transactional = any(w.transactional() for w in self.workers)
        if len(where) != invalid or (copies and transactional):
            doubled = [r for r in dead
                       if where[tuple(dict(r.headers)[h] for h in ("topic", "partition", "offset"))] > 1]
            return [f"dead letters: {len(dead)} of {len(where)} messages for replay's {invalid} invalid events "
                    f"({copies} copies; delivery {'transactions' if transactional else 'fenced-log'}); the copies: "
                    + "; ".join(f"{dict(r.headers)} at {r.partition}@{r.offset}: {r.value[:80]!r}" for r in doubled)]
        self.note(f"dead letters: {len(where)} messages, {copies} copies "
                  f"({'transactions' if transactional else 'fenced log'})")
        return []


def _headline(seen: dict[Key, float], want: dict[Key, float]) -> str:
    """The totals that say most at a glance: requests, events read, GAUC's weight, judgment verdicts."""
    def total(values: dict[Key, float], name: str, test: Callable[[dict[str, str]], bool]) -> float:
        return sum(v for (n, labels), v in values.items() if n == name and test(dict(labels)))

    parts: list[tuple[str, str, Callable[[dict[str, str]], bool]]] = [
        ("requests", "stream_eval_requests_total", lambda _: True),
        ("rankings read", "stream_eval_events_total", lambda labels: labels == {"type": "ranking", "status": "ok"}),
        ("feedback read", "stream_eval_events_total", lambda labels: labels == {"type": "feedback", "status": "ok"}),
        ("GAUC weight", "stream_eval_metric_count_total", lambda labels: labels.get("metric") == "AUC"),
        ("judgment verdicts", "stream_eval_gsb_total", lambda labels: labels.get("source") == "judgment"),
    ]
    return ", ".join(f"{what} {total(seen, name, test):g} (replay {total(want, name, test):g})"
                     for what, name, test in parts)


def _mismatches(want: dict[Key, float], seen: dict[Key, float]) -> list[str]:
    out = []
    for key in sorted(want.keys() | seen.keys()):
        exact = SUMMED.get(key[0], True)
        if key not in seen:
            out.append(f"{_show(key)}: missing (replay {want[key]!r})")
        elif key not in want:
            if seen[key] != 0:
                out.append(f"{_show(key)}: {seen[key]!r}, not in replay")
        elif not _same(seen[key], want[key], exact):
            out.append(f"{_show(key)}: {seen[key]!r}, replay {want[key]!r} (difference {seen[key] - want[key]:+.6g})")
    return out


@pytest.fixture
def cluster(broker: str, expected: Expected, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A :class:`Cluster` for the test; the test runs inside ``with cluster:`` (logs printed if it fails)."""
    began = time.monotonic()
    running = Cluster(broker, request.node.name, expected, tmp_path)
    try:
        yield running
    finally:
        running.close()
        print(f"{request.node.name}: {time.monotonic() - began:.0f}s")


# -- the scenarios ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kills", [0, 5], ids=["uninterrupted", "5-kills"])
def test_kill_the_only_worker_at_random_moments(cluster: Cluster, kills: int) -> None:
    """One worker, killed ``kills`` times while the log is produced and started again each time; then it runs
    until caught up. Each kill comes at a random moment: about one in four 0-2 s after the worker got its
    partitions (while it loads their checkpoints and rebuilds them, muted), the others 0-2.5 s after it has caught
    up with the log (counting live, between two checkpoints). ``kills=0`` is the uninterrupted run: the harness's
    baseline.

    A restart takes ~15 s before the new worker holds partitions (the dead member's 6 s session runs out; the
    development broker holds each JoinGroup 3 s, faust's control group first): the log goes out slower with kills,
    so that most of them land while it is still being produced."""
    rng = random.Random(7 + kills + SHIFT)
    with cluster:
        cluster.produce(speed=1.0 if kills else SPEED)
        worker = cluster.start("w0")
        for n in range(kills):
            cluster.wait_joined(worker)
            if rng.random() < 0.25:
                time.sleep(rng.uniform(0.0, 2.0))
            else:
                cluster.wait(worker.ready, 60, f"{worker.name} to catch up")
                time.sleep(rng.uniform(0.0, 2.5))
            cluster.kill(worker)
            worker = cluster.start(f"w{n + 1}")
        cluster.wait_produced()
        cluster.check()
        # a killed owner never released its partitions: its successor held those that had a checkpoint (all of
        # them unless the kill came inside the assignment callback); the first worker had no one to wait for
        holds = [w.holds() for w in cluster.workers]
        assert holds[0] == 0 and (kills == 0 or sum(holds) >= kills), holds


def test_kill_during_a_rebalance_and_the_stage_owner(cluster: Cluster) -> None:
    """A reads alone; B joins, and A is killed while the partitions move (a random 0.5-3.5 s after B's consumer
    exists: A revokes, checkpoints and rejoins within ~4 s of that) and started again (A2: a second rebalance,
    after A's session has run out); then whichever worker holds the regroup stage is killed and started again."""
    rng = random.Random(11 + SHIFT)
    with cluster:
        cluster.produce(speed=1.5)  # ~50 s: both kills land while the log is produced
        a = cluster.start("a")
        cluster.wait_joined(a)
        time.sleep(rng.uniform(2.0, 5.0))
        b = cluster.start("b")
        cluster.wait(lambda: b.readiness()[1].startswith("no partitions") or b.joined(), 60,
                     "b's consumer to join the group")
        cluster.note("b is joining the group")
        time.sleep(rng.uniform(0.5, 3.5))
        text = a.log.read_text(errors="replace")
        told = text.count(f"for group {cluster.group} because it is rebalancing")  # aiokafka's heartbeat
        done = len(re.findall(r"\] revoked partitions \[", text))
        cluster.note(f"a's heartbeats were told {told} times that the input partitions' group is rebalancing; "
                     f"a finished {done} revocations")
        cluster.kill(a)
        a2 = cluster.start("a2")
        cluster.wait_joined(a2)
        cluster.wait_joined(b)
        holder = cluster.stage_holder()
        time.sleep(rng.uniform(0.5, 3.0))
        holder = cluster.stage_holder(timeout=10)
        cluster.kill(holder)
        cluster.start(f"{holder.name}-again")
        cluster.wait_produced()
        cluster.check()


@pytest.mark.parametrize("kill", [False, True], ids=["no-kill", "kill"])
def test_kill_the_regroup_stage_owner(cluster: Cluster, kill: bool) -> None:
    """Two workers read from the start; at a random moment (2-12 s after both have partitions) the one holding
    the regroup stage is killed and started again. ``no-kill``: the two-worker baseline."""
    rng = random.Random(13 + SHIFT)
    with cluster:
        cluster.produce()
        a, b = cluster.start("a"), cluster.start("b")
        cluster.wait_joined(a)
        cluster.wait_joined(b)
        if kill:
            cluster.stage_holder()
            time.sleep(rng.uniform(2.0, 12.0))
            holder = cluster.stage_holder(timeout=10)  # the stage may have moved with a rebalance meanwhile
            cluster.kill(holder)
            cluster.start(f"{holder.name}-again")
        cluster.wait_produced()
        cluster.check()


def test_kill_two_of_three_workers(cluster: Cluster) -> None:
    """Three workers read from the start (four input and four stage partitions: two of each on one worker, one on
    each other). At random moments the one holding stage partition 0 (which merges the other stage partitions'
    looks) is killed, and then one of the others, each started again: the merge of looks from partitions held
    by three processes, through two hand-overs."""
    rng = random.Random(19 + SHIFT)
    with cluster:
        cluster.produce(speed=1.5)
        workers = [cluster.start(name) for name in ("a", "b", "c")]
        for worker in workers:
            cluster.wait_joined(worker)
        time.sleep(rng.uniform(1.0, 6.0))
        holder = cluster.stage_holder(timeout=10)
        cluster.kill(holder)
        cluster.start(f"{holder.name}-again")
        time.sleep(rng.uniform(8.0, 14.0))  # past the dead member's session: the group has settled again
        other = rng.choice([w for w in cluster.live if not w.holds_stage()])
        cluster.kill(other)
        cluster.start(f"{other.name}-again")
        cluster.wait_produced()
        cluster.check()


@pytest.mark.parametrize("broker_kind", ["kafka"], indirect=True)  # transactions: only Apache Kafka runs them
def test_a_worker_frozen_past_its_session_writes_nothing_twice(cluster: Cluster) -> None:
    """The zombie: of two workers, one is frozen (SIGSTOP) 2-6 s after both have partitions, for 20 s — past its
    6 s session and the fenced log's 5 s hand-over hold — while the other takes its partitions over, and then
    resumed (SIGCONT) with its transactions half done. With Kafka transactions its writes are refused (its
    producers fenced by the new owner's): /metrics, every request-metrics record and every dead letter exactly
    once, as replay. (The fenced log, on brokers without transactions, can write records twice here: its known
    gap.)"""
    rng = random.Random(17 + SHIFT)
    with cluster:
        cluster.produce(speed=1.0)
        a, b = cluster.start("a"), cluster.start("b")
        cluster.wait_joined(a)
        cluster.wait_joined(b)
        time.sleep(rng.uniform(2.0, 6.0))
        os.kill(a.process.pid, signal.SIGSTOP)
        cluster.note("froze a (SIGSTOP)")
        time.sleep(20.0)
        os.kill(a.process.pid, signal.SIGCONT)
        cluster.note("resumed a (SIGCONT)")
        cluster.wait_produced()
        cluster.check()
        assert a.transactional() and b.transactional()
        text = a.log.read_text(errors="replace")
        assert "its transaction failed" in text or "ProducerFenced" in text, "a was never fenced"
