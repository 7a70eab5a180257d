"""Broker faults (issue 16): a broker that starts late, freezes (SIGSTOP) or is not there at all.

The worker waits and retries with backoff, reports the outage on /metrics (``stream_eval_broker_up``,
``stream_eval_broker_errors_total``) and in one log line, and afterwards its totals and its request-metrics records
are the replay's, each record once; ``produce`` waits through an outage and gives up only after --broker-timeout.
Each test runs a broker of its own: freezing the session's broker would stall the other tests' clients. Each runs on
both kinds of broker (``broker_kind``: Tansu and Apache Kafka).
"""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry
from support import approx, make_broker, read_topic
from test_stream import SHORT, _done, _log, _replay, _until

from stream_eval.config import Config
from stream_eval.engine.replay import replay
from stream_eval.export.prometheus import EngineCollector
from stream_eval.stream.backoff import Backoff, BrokerHealth
from stream_eval.stream.broker import Broker, free_port, stop_process
from stream_eval.stream.demo import scrape
from stream_eval.stream.kafka import topics
from stream_eval.stream.produce import send_lines
from stream_eval.stream.settings import WorkerSettings
from stream_eval.stream.worker import StreamWorker

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "search-log.jsonl"
PARTITIONS = 4


@pytest.fixture
def own_broker(broker_kind: str) -> Iterator[Broker]:
    """A broker of ``broker_kind`` for one test (resumed and stopped however the test ends)."""
    broker = make_broker(broker_kind, free_port()).start()
    try:
        yield broker
    finally:
        broker.stop()


# -- the schedule and the reporting, without a broker ----------------------------------------------------------
def test_backoff_doubles_from_half_a_second_to_thirty_with_jitter_below_the_ceiling() -> None:
    ceilings = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]
    assert [Backoff(jitter=0.0).ceiling(n) for n in range(10)] == ceilings
    schedule = Backoff(rng=random.Random(7))
    delays = [schedule.next() for _ in range(1000)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings + [30.0] * 990, strict=True))
    assert len({round(d, 6) for d in delays[10:]}) > 900  # jittered: clients do not retry in step
    schedule.reset()
    assert 0.25 <= schedule.next() <= 0.5
    with pytest.raises(ValueError):
        Backoff(initial=0.0)


def test_an_outage_is_logged_once_counted_per_error_and_its_end_logged(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    health = BrokerHealth("w", logging.getLogger("test.health"), stall=0.05, clock=lambda: now[0],
                          backoff=lambda: Backoff(initial=0.01, maximum=0.02))
    registry = CollectorRegistry()
    EngineCollector(replay([str(EXAMPLE)], Config()), registry, broker=health)
    assert registry.get_sample_value("stream_eval_broker_up") == 0.0  # nothing answered yet
    attempts = 0

    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 4:
            raise ConnectionRefusedError("refused")
        return "ok"

    async def silent() -> None:
        await asyncio.sleep(0.2)  # longer than the stall: reported, and waited for (never sent twice)

    async def not_a_broker_error() -> None:
        raise ValueError("a bug")

    with caplog.at_level(logging.WARNING, logger="test.health"):
        assert asyncio.run(health.call("startup", flaky)) == "ok"
        asyncio.run(health.call("flush", silent))
        with pytest.raises(ValueError):
            asyncio.run(health.call("commit", not_a_broker_error))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4 and "unreachable (startup: ConnectionRefusedError: refused)" in messages[0]
    assert "answers again" in messages[1] and "unreachable (flush: no answer" in messages[2]
    assert "answers again" in messages[3]
    assert attempts == 4 and health.errors == {"startup": 3, "flush": 1} and health.outages == 2
    assert registry.get_sample_value("stream_eval_broker_up") == 1.0
    assert registry.get_sample_value("stream_eval_broker_errors_total", {"operation": "startup"}) == 3.0


# -- on the development broker ----------------------------------------------------------------------------
def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "stream_eval.cli", *args]


def _sample(url: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    try:
        found = scrape(url).get(name, [])
    except OSError:
        return None
    values = [v for series, v in found if all(series.get(k) == v2 for k, v2 in (labels or {}).items())]
    return sum(values) if values else None


def _wait(condition: Callable[[], bool], timeout: float, what: str, process: subprocess.Popen[bytes],
          log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the worker exited:\n{log.read_text()}"
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


@pytest.mark.slow
def test_a_worker_started_before_its_broker_waits_then_counts_as_replay_does(broker_kind: str, tmp_path: Path) -> None:
    """`stream-eval worker` with nothing on the port: /metrics up, broker_up 0, startup errors counted; a broker
    started 10 s later on that port; then the log through `produce`, frozen 20 s on the way: replay's numbers."""
    expected = replay([str(EXAMPLE)], Config()).report()
    port, metrics_port = free_port(), free_port()
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    log = tmp_path / "worker.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        worker = subprocess.Popen(_cli("worker", "--broker", f"kafka://127.0.0.1:{port}", "--group", "late",
                                       "--metrics-port", str(metrics_port), "--loglevel", "info"),
                                  stdout=out, stderr=subprocess.STDOUT)
    broker = make_broker(broker_kind, port)
    try:
        _wait(lambda: (_sample(url, "stream_eval_broker_errors_total", {"operation": "startup"}) or 0) >= 1, 30,
              "the worker to report the missing broker", worker, log)
        assert _sample(url, "stream_eval_broker_up") == 0.0
        time.sleep(max(0.0, 10 - (time.monotonic() - started)))
        broker.start()
        _wait(lambda: _sample(url, "stream_eval_broker_up") == 1.0, 60, "the worker to connect", worker, log)
        producer = subprocess.Popen(_cli("produce", str(EXAMPLE), "--broker", broker.url, "--speed", "200"),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # ~12 s of sending
        try:
            _wait(lambda: (_sample(url, "stream_eval_events_total") or 0) > 0, 60, "the first events", worker, log)
            with broker.frozen():
                time.sleep(20)
                assert _sample(url, "stream_eval_broker_up") == 0.0  # /metrics answers while the broker does not
            _, err = producer.communicate(timeout=120)
            assert producer.returncode == 0, err.decode()
            assert b"unreachable" in err and b"answers again" in err  # produce saw the freeze too, and rode it out
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait()
        want = expected["overall"]["requests"]
        _wait(lambda: _sample(url, "stream_eval_requests_total") == want, 120, "replay's request count", worker, log)
        samples = scrape(url)
        by_status: dict[str, float] = {}
        for series, value in samples["stream_eval_events_total"]:
            by_status[series["status"]] = by_status.get(series["status"], 0.0) + value
        for status in ("invalid", "late", "duplicate", "orphan"):
            assert by_status.get(status, 0.0) == expected["events"][status], status
        errors = {s["operation"]: v for s, v in samples["stream_eval_broker_errors_total"]}
        assert errors["startup"] >= 1 and sum(errors.values()) >= 2, errors  # the freeze was counted too
        assert _sample(url, "stream_eval_broker_up") == 1.0
        mode = "transactions" if broker_kind == "kafka" else "fenced-log"  # --delivery auto chose by the broker
        assert [series for series, _ in samples["stream_eval_delivery_info"]] == [{"mode": mode}]
        text = log.read_text()
        assert text.count("is unreachable (startup") == 1, text  # once per outage, not per attempt
        assert "answers again" in text
    finally:
        code = stop_process(worker, grace=60)
        broker.stop()
    assert code == 0, log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("seconds", [60])
def test_a_broker_frozen_mid_stream_loses_and_repeats_nothing(own_broker: Broker, tmp_path: Path,
                                                               seconds: float) -> None:
    """SIGSTOP for ``seconds`` (longer than the session timeout, 6 s, and aiokafka's request timeouts, 40 s) while
    `send_lines` sends and the worker consumes; then SIGCONT: the worker's totals and records are the replay's."""
    lines = _log(3000, seed=21, short=True)
    expected, expected_records = _replay(lines, tmp_path, SHORT)
    prefix = "frozen."
    settings = WorkerSettings([own_broker.bootstrap], prefix=prefix, group="frozen", partitions=PARTITIONS,
                              broker_stall=3.0)
    registry = CollectorRegistry()

    async def main() -> None:
        worker = StreamWorker(settings, SHORT)
        EngineCollector(worker.stage_view, registry, lock=worker.lock, broker=worker.health, shares=worker.shares)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))

        def alive() -> bool:
            if running.done():
                running.result()  # its error, not a timeout
                raise AssertionError("the worker stopped")
            return True

        sending = asyncio.create_task(send_lines(lines, [own_broker.bootstrap], topics(prefix),
                                                 partitions=PARTITIONS, rate=len(lines) / 10))
        await _until(lambda: alive() and worker.totals().overall().requests > 0, 60, "the first finalised requests")
        own_broker.freeze()
        frozen = time.monotonic()
        try:
            # /readyz goes 503 as soon as the outage counts (broker_stall, 3 s here), not 30 s on (stale fetches)
            await _until(lambda: worker.health.down_since is not None, 20, "the outage to count")
            ready, reason = worker.readiness()
            assert not ready and reason.startswith("the Kafka broker has not answered for"), reason
            await asyncio.sleep(seconds - (time.monotonic() - frozen))
            assert registry.get_sample_value("stream_eval_broker_up") == 0.0
            assert not sending.done() and not running.done()
        finally:
            own_broker.thaw()
        counts = await asyncio.wait_for(sending, 120)
        assert sum(counts.values()) > len(lines) * 0.9
        await _until(lambda: alive() and _done(expected, worker), 120, "the end of every partition after the freeze")
        await _until(lambda: worker.readiness()[0], 30, "/readyz ready again")
        report, want = worker.totals().report(), expected.report()  # (a stopped worker hands every share over)
        stop.set()
        await asyncio.wait_for(running, 60)
        for section in ("events", "overall", "groups", "gsb", "ab"):
            assert report[section] == approx(want[section]), section
        assert report["ab"] == want["ab"] and report["srm"] == want["srm"]
        found = await read_topic(own_broker.bootstrap, topics(prefix).request_metrics, len(expected_records.by_id))
        records = {r.key.decode(): orjson.loads(r.value) for r in found}
        assert len(found) == len(records) == len(expected_records.by_id)  # each once
        assert records == expected_records.by_id
        errors = sum(worker.health.errors.values())
        assert errors >= 1 and registry.get_sample_value("stream_eval_broker_up") == 1.0
        # the fetches in flight at the freeze got no answer in aiokafka's request timeout (40 s)
        assert worker.health.errors.get("fetch", 0) >= 1, worker.health.errors
        assert sum(registry.get_sample_value("stream_eval_broker_errors_total", {"operation": op}) or 0
                   for op in worker.health.errors) == errors

    asyncio.run(main())


@pytest.mark.slow
def test_produce_gives_up_on_an_unreachable_broker_after_broker_timeout() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = subprocess.run(_cli("produce", str(EXAMPLE), "--broker", f"kafka://127.0.0.1:{port}",
                                 "--broker-timeout", "4"), capture_output=True, timeout=60)
    took = time.monotonic() - started
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert f"the Kafka broker at 127.0.0.1:{port} did not answer for 4 s" in err
    assert "--broker-timeout 4 s" in err and "Traceback" not in err
    assert err.count("is unreachable") == 1  # logged once, not per attempt
    assert 4 <= took < 20
