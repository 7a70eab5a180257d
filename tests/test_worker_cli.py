"""`stream-eval worker` and `stream-eval produce` as a user runs them, and the worker's control topic."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from stream_eval.config import Config
from stream_eval.engine.replay import replay
from stream_eval.stream.broker import free_port, stop_process
from stream_eval.stream.demo import scrape

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "search-log.jsonl"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "stream_eval.cli", *args]


def _requests(url: str) -> float:
    try:
        return sum(v for _, v in scrape(url).get("stream_eval_requests_total", []))
    except OSError:
        return -1.0


async def _send(broker: str, topic: str, value: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=broker)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()


def _json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310  # a local worker
        found: dict[str, Any] = json.loads(response.read())
    return found


def test_worker_and_produce_commands_and_the_control_topic(broker: str, tmp_path: Path) -> None:
    expected = replay([str(EXAMPLE)], Config()).report()
    metrics_port = free_port()
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(_cli("worker", "--broker", f"kafka://{broker}", "--topic-prefix", "cli.",
                                       "--group", "cli", "--metrics-port", str(metrics_port)),
                                  stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        sent = subprocess.run(_cli("produce", str(EXAMPLE), "--broker", f"kafka://{broker}", "--topic-prefix",
                                   "cli."), capture_output=True, timeout=120)
        assert sent.returncode == 0, sent.stderr.decode()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _requests(url) < expected["overall"]["requests"]:
            assert worker.poll() is None, log.read_text()
            time.sleep(0.5)
        assert _requests(url) == expected["overall"]["requests"]
        samples = scrape(url)
        assert any(name.startswith("faust_") for name in samples)  # one registry with faust's sensors
        invalid = sum(v for labels, v in samples["stream_eval_events_total"] if labels["status"] == "invalid")
        assert invalid == expected["events"]["invalid"]
        # /report: the worker's report (it holds every partition: the stage's too, so the A/B rows, bit for bit)
        report_url = f"http://127.0.0.1:{metrics_port}/report"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _json(report_url)["ab"] != expected["ab"]:
            time.sleep(0.5)
        report = _json(report_url)
        assert report["ab"] == expected["ab"] and expected["ab"] and report["srm"] == expected["srm"]
        assert report["overall"]["requests"] == expected["overall"]["requests"]
        assert report["worker"] == {"input_partitions": [0, 1, 2, 3], "stage_partitions": [0, 1, 2, 3]}
        asyncio.run(_send(broker, "cli.cli.control", json.dumps({"command": "report"}).encode()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "report: " not in log.read_text():
            time.sleep(0.5)
        logged = [line.split("report: ", 1)[1] for line in log.read_text().splitlines() if "report: " in line]
        assert json.loads(logged[0])["ab"] == expected["ab"]  # (one line of JSON: until 2026-12-02 a Python repr)
    finally:
        code = stop_process(worker, grace=30)
    assert code == 0, log.read_text()


@pytest.mark.slow
def test_a_worker_on_tansu_refuses_transactions_in_one_line_and_logs_json_lines(tmp_path: Path) -> None:
    """``--delivery transactions`` on a broker without them: one line and exit code 2 before faust starts (it was
    a crash dump, exit 1). ``--log-format json`` at the default level: every line of the log is a JSON object (faust's
    spinner wrote terminal codes into them when stdout was not a terminal)."""
    from stream_eval.stream.broker import Broker

    with Broker(free_port()).start() as running:
        bootstrap = f"kafka://{running.bootstrap}"
        refused = subprocess.run(_cli("worker", "--broker", bootstrap, "--topic-prefix", "tx.", "--metrics-port",
                                      str(free_port()), "--delivery", "transactions"), capture_output=True,
                                 timeout=120)
        assert refused.returncode == 2, refused.stderr.decode()[-2000:]
        assert b"does not run transactions (use --delivery fenced-log or auto)" in refused.stderr
        assert b"Traceback" not in refused.stderr + refused.stdout
        metrics_port = free_port()
        log = tmp_path / "worker.jsonl"
        with open(log, "wb") as out:
            worker = subprocess.Popen(_cli("worker", "--broker", bootstrap, "--topic-prefix", "js.", "--metrics-port",
                                           str(metrics_port), "--log-format", "json"),
                                      stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and _requests(f"http://127.0.0.1:{metrics_port}/metrics") < 0:
                assert worker.poll() is None, log.read_text()
                time.sleep(0.5)
            time.sleep(3)  # (past faust's start-up, where its spinner wrote)
        finally:
            code = stop_process(worker, grace=60)
        assert code == 0, log.read_text()[-3000:]
    lines = log.read_bytes().splitlines()
    assert lines and b"\x1b" not in log.read_bytes()
    assert all(isinstance(json.loads(line), dict) for line in lines if line.strip()), lines[:5]


def test_repeated_client_log_lines_are_let_through_once_per_interval_with_a_count() -> None:
    from stream_eval.stream.worker import RepeatFilter

    now = [0.0]
    repeats = RepeatFilter(every=30.0, clock=lambda: now[0])

    def record(message: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("aiokafka.conn", logging.ERROR, __file__, 1, message, args, None)

    assert repeats.filter(record("Unable connect to node %s", 1))
    held = [repeats.filter(record("Unable connect to node %s", k)) for k in range(5)]
    assert held == [False] * 5 and repeats.filter(record("another message"))
    now[0] = 31.0
    again = record("Unable connect to node %s", 2)
    assert repeats.filter(again)
    assert again.getMessage() == "Unable connect to node 2 (5 more like it held back in the last 31 s)"


def test_every_partition_s_out_of_range_fetch_is_let_through_as_a_warning() -> None:
    """Input deleted (retention, a topic deleted and made again) before the worker read it: aiokafka says so in one
    INFO line per partition, and then reads on from the earliest offset the broker holds. The filter let only the
    first partition's line through in 30 s, at INFO (below the worker's default level): the loss went unseen."""
    from stream_eval.stream.worker import FetcherLog, RepeatFilter

    repeats, hook = RepeatFilter(every=30.0, clock=lambda: 0.0), FetcherLog()
    seen: list[tuple[Any, int]] = []
    hook.seen.append(seen)  # (a running worker's list: it counts what was lost)
    records = [logging.LogRecord("aiokafka.consumer.fetcher", logging.INFO, __file__, 1,
                                 "Fetch offset %s is out of range for partition %s, resetting offset",
                                 (4879 + p, f"TopicPartition(topic='s4.feedback', partition={p})"), None)
               for p in range(4)]
    assert all(repeats.filter(record) and hook.filter(record) for record in records)
    assert {record.levelno for record in records} == {logging.WARNING}
    assert "partition=3" in records[3].getMessage() and "stream_eval_input_lost_total" in records[3].getMessage()
    assert [offset for _, offset in seen] == [4879, 4880, 4881, 4882]


def test_every_failed_fetch_request_is_counted_though_repeated_lines_are_held_back() -> None:
    """aiokafka retries a failed fetch request on its own and says so only in its log; ``getmany`` hands out
    nothing. Each is a fetch error of every running worker (``stream_eval_broker_errors_total{operation="fetch"}``),
    without marking an outage; the log keeps one line in 30 s. Before, no failed fetch was counted."""
    from aiokafka.errors import KafkaConnectionError, RequestTimedOutError

    from stream_eval.stream.backoff import BrokerHealth
    from stream_eval.stream.worker import FetcherLog, RepeatFilter

    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    saved = list(fetcher.filters)
    try:
        fetcher.filters[:] = [RepeatFilter(every=30.0, clock=lambda: 0.0)]  # as _quiet_client_debug_logs leaves it
        hook = FetcherLog.installed()
        assert fetcher.filters[0] is hook and FetcherLog.installed() is hook
        health = BrokerHealth("test", logging.getLogger("test"))
        health.answered()
        hook.healths.append(health)
        errors = [KafkaConnectionError("Connection at 127.0.0.1:9092 closed"), RequestTimedOutError()] * 3
        # (a logger's ``filter`` gives True before Python 3.12, from 3.12 on the record itself)
        shown = [bool(fetcher.filter(logging.LogRecord(fetcher.name, logging.ERROR, __file__, 1,
                                                       "Failed fetch messages from %s: %s", (1, error), None)))
                 for error in errors]
        assert health.errors == {"fetch": 6}
        assert health.last_error.startswith("RequestTimedOutError")
        assert health.up and health.down_since is None  # the worker's own calls mark an outage
        assert shown == [True, False, False, False, False, False]  # one line through, the rest held back
        hook.healths.remove(health)
        fetcher.filter(logging.LogRecord(fetcher.name, logging.ERROR, __file__, 1,
                                         "Failed fetch messages from %s: %s", (1, errors[0]), None))
        assert health.errors == {"fetch": 6}  # a worker that stopped counts no more
    finally:
        fetcher.filters[:] = saved


@pytest.mark.slow
def test_a_worker_whose_broker_is_gone_stops_within_a_pod_s_grace_period(tmp_path: Path) -> None:
    """SIGTERM after the broker went away: exit 0 within 30 s (it took minutes: a checkpoint retried for ever, then
    faust's clients waited for the broker), and the outage does not flood the log (aiokafka logged each retry of
    each connection, hundreds of lines a second)."""
    from stream_eval.stream.broker import Broker

    metrics_port = free_port()
    log = tmp_path / "worker.log"
    running = Broker(free_port()).start()
    try:
        with open(log, "wb") as out:
            worker = subprocess.Popen(_cli("worker", "--broker", f"kafka://{running.bootstrap}", "--topic-prefix",
                                           "gone.", "--group", "gone", "--metrics-port", str(metrics_port)),
                                      stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and _requests(f"http://127.0.0.1:{metrics_port}/metrics") < 0:
            assert worker.poll() is None, log.read_text()
            time.sleep(0.5)
        time.sleep(5)
    finally:
        running.stop()
    time.sleep(3)
    started = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    try:
        code = worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert code == 0 and time.monotonic() - started < 30, log.read_text()[-3000:]
    assert "stopped without a final checkpoint: the broker is unreachable" in log.read_text()
    # its exit skips the interpreter's clean-up (the clients would wait minutes for the broker), not faust's data dir
    assert not Path(tempfile.gettempdir(), f"stream-eval-gone-{worker.pid}").exists()
    assert len(log.read_text().splitlines()) < 100, log.read_text()[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "message"), [
    (["--broker", "kafka://"], "--broker: broker 'kafka://'"),
    (["--broker", "localhost:99999"], "--broker: broker 'localhost:99999'"),
    (["--group", ""], "--group ''"),
    (["--topic-prefix", "bad topic/"], "topic name 'bad topic/rankings'"),
    (["--input-format", "ubi", "--ubi-queries-topic", "same", "--ubi-events-topic", "same"], "--ubi-events-topic"),
    (["--input-format", "ubi", "--ubi-events-topic", "judgments"], "--ubi-events-topic 'judgments'"),
    (["--metrics-host", "nosuch.invalid"], "--metrics-host 'nosuch.invalid'"),
])
def test_worker_options_it_cannot_use_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    """Each ended in a traceback (exit 1), or ran on: an empty group made topics named '.checkpoints', one topic
    for both UBI inputs counted nothing, a topic name Kafka refuses was retried for ever."""
    done = subprocess.run([sys.executable, "-m", "stream_eval.cli", "worker", "--metrics-port", str(free_port()),
                           "--broker", "kafka://127.0.0.1:1", *args], capture_output=True, timeout=60)
    err = done.stderr.decode()
    assert done.returncode == 2, err[-2000:]
    assert message in err and "Traceback" not in err


@pytest.mark.slow
def test_a_metrics_port_in_use_is_one_line_and_exit_2() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "stream_eval.cli", "worker", "--metrics-port", str(port),
                               "--metrics-host", "127.0.0.1", "--broker", "kafka://127.0.0.1:1"],
                              capture_output=True, timeout=60)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Address already in use" in err and "Traceback" not in err, err[-2000:]


def test_the_connection_settings_come_from_the_environment() -> None:
    """README: STREAM_EVAL_BROKER and the other connection settings share the prefix; the worker command read
    none of them (only faust's -A entry point did) and went to localhost:9092."""
    from stream_eval.cli import build_parser

    env = {"STREAM_EVAL_BROKER": "kafka://kafka-1:9093", "STREAM_EVAL_TOPIC_PREFIX": "prod.",
           "STREAM_EVAL_GROUP": "ranker"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        args = build_parser().parse_args(["worker"])
        flags = build_parser().parse_args(["worker", "--broker", "b:1", "--group", "g", "--topic-prefix", ""])
    assert (args.broker, args.topic_prefix, args.group) == ("kafka://kafka-1:9093", "prod.", "ranker")
    assert (flags.broker, flags.topic_prefix, flags.group) == ("b:1", "", "g")  # flags win
