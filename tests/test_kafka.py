"""Kafka helpers, ``stream-eval produce``, ``stream-eval broker`` and ``simulate --broker`` on a real broker."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stream_eval.stream.broker import Broker, BrokerError, free_port
from stream_eval.stream.kafka import ensure_topics, event_key, parse_brokers, partitions_for, topics
from stream_eval.stream.produce import END_WATERMARK, WATERMARKS, route_line, send_lines

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
END = json.loads(END_WATERMARK)


def _prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}."


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stream_eval.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


Record = tuple[str, int, bytes | None, bytes, int]  # topic, partition, key, value, timestamp


async def _consume(bootstrap: str, names: tuple[str, ...], until: int, idle: float = 1.5) -> list[Record]:
    """Every message of the topics from the start: stops once ``until`` messages came and then none for ``idle`` s."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(*names, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None, session_timeout_ms=6000,
                                heartbeat_interval_ms=1000, isolation_level="read_committed")
    await consumer.start()
    records: list[Record] = []
    try:
        deadline = time.monotonic() + 20
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            got = [(m.topic, m.partition, m.key, m.value, m.timestamp) for ms in batch.values() for m in ms]
            records += got
            if got:
                quiet_since = time.monotonic()
            elif len(records) >= until and time.monotonic() - quiet_since > idle:
                break
    finally:
        await consumer.stop()
    return records


@pytest.mark.parametrize(("url", "expected"), [
    ("kafka://localhost:9092,kafka://h2:9093", ["localhost:9092", "h2:9093"]),
    ("localhost:9092,h2:9093", ["localhost:9092", "h2:9093"]),
    (" kafka://b1:1 , b2.example.com:65535 ", ["b1:1", "b2.example.com:65535"]),
    ("127.0.0.1:9092", ["127.0.0.1:9092"]),
    ("[::1]:9092", ["[::1]:9092"]),
])
def test_parse_brokers(url: str, expected: list[str]) -> None:
    assert parse_brokers(url) == expected


@pytest.mark.parametrize("url", ["", ",", "localhost", "http://h:9092", "h:0", "h:70000", "h:port", "a b:1"])
def test_parse_brokers_rejects_garbage(url: str) -> None:
    with pytest.raises(ValueError, match="broker|expected"):
        parse_brokers(url)


def test_topic_names() -> None:
    t = topics("demo.")
    assert (t.rankings, t.feedback, t.judgments) == ("demo.rankings", "demo.feedback", "demo.judgments")
    assert (t.request_metrics, t.dead_letters) == ("demo.request-metrics", "demo.dead-letters")
    assert t.inputs == ("demo.rankings", "demo.feedback", "demo.judgments")
    assert [t.type_of(name) for name in t.inputs] == ["ranking", "feedback", "judgment"]
    assert topics().rankings == "rankings" and topics().dead_letters == "dead-letters"
    with pytest.raises(ValueError):
        t.type_of("demo.dead-letters")


def test_event_keys_and_routing() -> None:
    assert event_key("ranking", {"request_id": "r1", "query_id": "q"}) == b"r1"
    assert event_key("feedback", {"request_id": "r1"}) == b"r1"
    assert event_key("judgment", {"request_id": "r1", "query_id": "q9"}) == b"q9"
    assert event_key("ranking", {"request_id": 5}) is None
    assert event_key("ranking", None) is None
    t = topics("p.")
    iso = route_line(b'{"type":"feedback","request_id":"r","item":"a","ts":"2026-01-01T00:00:01.5Z"}\n', t)
    assert iso is not None and iso.topic == "p.feedback" and iso.timestamp_ms == (T0 + 1) * 1000 + 500
    assert route_line(b"   \n", t) is None
    broken = route_line(b'{"type":"ranking","request_id":"r', t)
    assert broken is not None and (broken.topic, broken.key, broken.ts) == ("p.rankings", None, None)
    unknown = route_line(b'{"type":"impression","request_id":"r","ts":5}', t)
    assert unknown is not None and (unknown.topic, unknown.key) == ("p.rankings", None)
    assert route_line(b'[1, 2]', t) is not None
    wm = route_line(b'{"type":"watermark","ts":7}', t)
    assert wm is not None and wm.topic is None and wm.timestamp_ms == 7000
    assert route_line(b'{"type":"ranking","request_id":"r","ts":true}', t).ts is None  # type: ignore[union-attr]


def _lines() -> list[bytes]:
    events: list[dict[str, Any]] = [
        {"type": "ranking", "request_id": "r1", "ts": T0, "items": ["a", "b"], "experiment": "e"},
        {"type": "feedback", "request_id": "r1", "item": "a", "ts": T0 + 1.25},
        {"type": "judgment", "experiment": "e", "query_id": "q1", "verdict": "good", "ts": T0 + 2},
        {"type": "watermark", "ts": T0 + 3},
        {"type": "ranking", "request_id": "r2", "ts": T0 + 4, "items": ["c"], "query_id": "q1"},
    ]
    lines = [json.dumps(e).encode() for e in events]
    lines.insert(2, b'{"type": "feedback", "request_id": "r1", "item": ')  # broken JSON
    return lines


def test_produce_file_and_consume_back(broker: str, tmp_path: Path) -> None:
    prefix = _prefix()
    t = topics(prefix)
    lines = _lines()
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n\n")
    result = _cli("produce", str(path), "--broker", f"kafka://{broker}", "--topic-prefix", prefix,
                  "--partitions", "3")
    assert result.returncode == 0, result.stderr
    assert f"to {t.rankings}" in result.stderr and "sent 5 events" in result.stderr
    records = asyncio.run(_consume(broker, t.inputs, until=5 + 2 * 9))
    partitions = {name: asyncio.run(partitions_for([broker], name)) for name in t.inputs}
    assert partitions == {name: [0, 1, 2] for name in t.inputs}

    data = [r for r in records if b"watermark" not in r[3]]
    by_value = {value: (topic, key, ts) for topic, _, key, value, ts in data}
    assert by_value[lines[0]] == (t.rankings, b"r1", T0 * 1000)
    assert by_value[lines[1]] == (t.feedback, b"r1", T0 * 1000 + 1250)
    assert by_value[lines[2]][:2] == (t.rankings, None)  # broken line: unchanged, rankings, no key
    assert by_value[lines[3]] == (t.judgments, b"q1", (T0 + 2) * 1000)
    assert by_value[lines[5]] == (t.rankings, b"r2", (T0 + 4) * 1000)
    assert len(data) == 5

    # The file's watermark and the end watermark reach every partition of every input topic, in that order.
    for name in t.inputs:
        for partition in partitions[name]:
            marks = [(value, ts) for topic, p, _, value, ts in records
                     if topic == name and p == partition and b"watermark" in value]
            assert marks == [(lines[4], (T0 + 3) * 1000), (END_WATERMARK, (T0 + 4) * 1000)], (name, partition)
    # Per partition, the end watermark is the last message.
    for name in t.inputs:
        for partition in partitions[name]:
            values = [value for topic, p, _, value, _ in records if topic == name and p == partition]
            assert values[-1] == END_WATERMARK


def test_produce_no_flush_sends_no_end_watermark(broker: str, tmp_path: Path) -> None:
    prefix = _prefix()
    t = topics(prefix)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(_lines()) + b"\n")
    result = _cli("produce", str(path), "--broker", broker, "--topic-prefix", prefix, "--no-flush")
    assert result.returncode == 0, result.stderr
    records = asyncio.run(_consume(broker, t.inputs, until=5 + 12))
    assert len(records) == 5 + 12  # 5 events, the file's watermark on 3 x 4 partitions
    assert not [r for r in records if r[3] == END_WATERMARK]


def test_send_lines_paces_by_rate_and_event_time(broker: str) -> None:
    t = topics(_prefix())
    lines = [json.dumps({"type": "ranking", "request_id": f"r{i}", "ts": T0 + i * 0.1}).encode() for i in range(6)]
    start = time.monotonic()
    counts = asyncio.run(send_lines(lines, broker, t, speed=1.0, flush=False, partitions=1))
    assert time.monotonic() - start >= 0.45
    assert counts == Counter({t.rankings: 6})
    start = time.monotonic()
    counts = asyncio.run(send_lines(lines, broker, t, speed=None, flush=True, partitions=1, rate=20))
    assert time.monotonic() - start >= 0.2
    assert counts == Counter({t.rankings: 6, WATERMARKS: 3})


def test_send_lines_endless_iterator_can_be_cancelled(broker: str) -> None:
    t = topics(_prefix())

    def endless() -> Any:
        i = 0
        while True:
            yield json.dumps({"type": "feedback", "request_id": f"r{i}", "item": "a", "ts": T0 + i}).encode()
            i += 1

    async def main() -> Counter[str]:
        counts: Counter[str] = Counter()
        task = asyncio.create_task(send_lines(endless(), [broker], t, None, True, 2, counts=counts))
        await asyncio.sleep(1.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return counts

    counts = asyncio.run(main())
    assert counts[t.feedback] > 100 and counts[WATERMARKS] == 0


def test_ensure_topics_keeps_existing(broker: str) -> None:
    name = _prefix() + "x"
    asyncio.run(ensure_topics([broker], [name], 2))
    asyncio.run(ensure_topics([broker], [name, name], 5))
    assert asyncio.run(partitions_for([broker], name)) == [0, 1]


def test_ensure_topics_times_out_without_broker() -> None:
    with pytest.raises(TimeoutError, match="within"):
        asyncio.run(ensure_topics([f"127.0.0.1:{free_port()}"], ["x"], 1, timeout=1))


def test_broker_port_taken_is_a_clear_error(broker: str) -> None:
    port = int(broker.rsplit(":", 1)[1])
    with pytest.raises(BrokerError, match="already in use"):
        Broker(port).start()


def test_broker_command_runs_and_stops_on_sigterm() -> None:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "stream_eval.cli", "broker", "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert f"127.0.0.1:{port}" in line, line
        assert asyncio.run(partitions_for([f"127.0.0.1:{port}"], "nothing")) == []
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - started < 6
        with pytest.raises(OSError):  # the broker is gone too
            import socket

            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_simulate_to_kafka(broker: str) -> None:
    prefix = _prefix()
    t = topics(prefix)
    result = _cli("simulate", "--requests", "200", "--broker", broker, "--topic-prefix", prefix, "--judgments")
    assert result.returncode == 0, result.stderr
    match = re.search(r"sent ([\d,]+) events", result.stderr)
    assert match, result.stderr
    sent = int(match.group(1).replace(",", ""))
    records = asyncio.run(_consume(broker, t.inputs, until=sent + 12))
    kinds = Counter(r[0] for r in records if r[3] != END_WATERMARK)
    assert kinds[t.rankings] >= 200 and kinds[t.feedback] > 200 and kinds[t.judgments] > 0
    assert sum(kinds.values()) == sent
    rankings = [json.loads(r[3]) for r in records if r[0] == t.rankings and r[2] is not None]
    assert all(r["request_id"].encode() == key for r, key in zip(rankings, [r[2] for r in records
               if r[0] == t.rankings and r[2] is not None], strict=True))
    # as fast as possible, the whole simulated log lies in the past: a worker would not reject it as future_ts
    assert max(r["ts"] for r in rankings) <= time.time()
    assert len([r for r in records if r[3] == END_WATERMARK]) == 12


def test_simulate_runs_into_the_same_topics_share_no_request_id(broker: str) -> None:
    """Every run's ids were ``r0``, ``r1``, ...: a second run within the attribution window counted its rankings as
    duplicates and joined its feedback to the first run's requests."""
    prefix = _prefix()
    sent = 0
    for _ in range(2):
        result = _cli("simulate", "--requests", "30", "--broker", broker, "--topic-prefix", prefix, "--unit", "user")
        assert result.returncode == 0, result.stderr
        sent += int(re.search(r"sent ([\d,]+) events", result.stderr).group(1).replace(",", ""))  # type: ignore[union-attr]
    t = topics(prefix)
    records = asyncio.run(_consume(broker, t.inputs, until=sent + 24))
    rankings = [json.loads(r[3]) for r in records if r[0] == t.rankings and r[3] != END_WATERMARK]
    ids = [r["request_id"] for r in rankings]
    assert len(ids) == 60 and len(set(ids)) == 60
    runs = {rid.rpartition("-")[0] for rid in ids}
    assert len(runs) == 2  # each run's own prefix, on its sessions and users too
    assert all(r["session_id"].startswith(r["request_id"].rpartition("-")[0] + "-s") for r in rankings)
    assert all(r["unit_id"].startswith(r["request_id"].rpartition("-")[0] + "-u") for r in rankings)


def test_simulate_endless_until_sigterm(broker: str) -> None:
    prefix = _prefix()
    process = subprocess.Popen([sys.executable, "-m", "stream_eval.cli", "simulate", "--requests", "0", "--broker",
                                broker, "--topic-prefix", prefix, "--rate", "500"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4)
        assert process.poll() is None, process.communicate()[1]
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=15)
        assert process.returncode == 0, err
        match = re.search(r"interrupted; sent ([\d,]+) events", err)
        assert match and int(match.group(1).replace(",", "")) > 100, err
        assert "watermark" not in err  # no end-of-stream watermark when stopped
        # paced, event time follows the wall clock (--rate is events/s, and sending never gets ahead of event time)
        sent = int(match.group(1).replace(",", ""))
        records = asyncio.run(_consume(broker, topics(prefix).inputs, until=sent))
        times = [json.loads(r[3])["ts"] for r in records if r[3] != END_WATERMARK]
        assert max(times) <= time.time() + 1.0 and max(times) - min(times) < 10
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_broker_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A parent killed by SIGKILL (no clean-up runs) does not leave its broker behind (Linux)."""
    pid_file = tmp_path / "broker.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from stream_eval.stream.broker import Broker, free_port\n"
        "broker = Broker(free_port()).start()\n"
        f"open({str(pid_file)!r}, 'w').write(str(broker.process.pid))\n"
        "time.sleep(600)\n")])
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.1)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists() and \
            "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]:
        time.sleep(0.1)
    alive = Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]
    assert not alive, "the broker outlived its parent"


class _FakeProducer:
    """The slice of AIOKafkaProducer that StreamWorker._send_batches uses, recording what it is given."""

    def __init__(self, batch_bytes: int) -> None:
        self.batch_bytes = batch_bytes
        self.sent: list[tuple[int, list[tuple[bytes | None, bytes, int]]]] = []
        self.headers: list[list[list[tuple[str, bytes]]]] = []  # each sent batch's records' headers
        self.failing = 0  # the next sends whose futures fail

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1, 2, 3, 4}

    def create_batch(self) -> Any:
        from aiokafka.producer.message_accumulator import BatchBuilder

        return BatchBuilder(self.batch_bytes, 0, is_transactional=False)

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[Any]:
        from aiokafka.record.default_records import DefaultRecordBatch

        parsed = list(DefaultRecordBatch(batch._build()))
        assert parsed, "an empty batch was sent"
        self.sent.append((partition, [(r.key, r.value, r.timestamp) for r in parsed]))
        self.headers.append([list(r.headers) for r in parsed])
        return self._done()

    async def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None,
                   timestamp_ms: int | None = None, headers: Any = None) -> asyncio.Future[Any]:
        self.sent.append((partition, [(key, value, timestamp_ms)]))  # type: ignore[list-item]  # set here
        self.headers.append([list(headers or [])])
        return self._done()

    def _done(self) -> asyncio.Future[Any]:
        """A future already done: failed while ``failing`` counts down, else stored (no offset)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.failing > 0:
            self.failing -= 1
            future.set_exception(RuntimeError("not acknowledged"))
        else:
            future.set_result(None)
        return future

    async def flush(self) -> None:
        pass


@pytest.mark.parametrize("batch_bytes", [60, 500, 1 << 20])
def test_outputs_go_out_in_order_to_the_key_partition_in_batches(batch_bytes: int) -> None:
    """Every record once, in order per partition, on the partition Kafka's default partitioner gives its key;
    small batches fill and are replaced; a record too large for a batch goes through producer.send (which
    checks its size), in its place."""
    from aiokafka.partitioner import DefaultPartitioner

    from stream_eval.stream import logs
    from stream_eval.stream.backoff import BrokerHealth

    producer = _FakeProducer(batch_bytes)
    sender = logs.Sender(producer, BrokerHealth("test", logs.log))
    large = logs.LARGE_RECORD
    records = [(f"r{i}".encode(), b"v" * (large if i % 97 == 5 else i % 70), 1000 + i) for i in range(400)]
    asyncio.run(sender.send_batches("request-metrics", records))
    got: dict[int, list[Any]] = {}
    for partition, batch in producer.sent:
        got.setdefault(partition, []).extend(batch)
    expected: dict[int, list[Any]] = {}
    choose = DefaultPartitioner()
    for key, value, ts in records:
        expected.setdefault(choose(key, [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]), []).append((key, value, ts))
    assert got == expected
    assert any(len(batch) == 1 and len(batch[0][1]) >= large for _, batch in producer.sent)


@pytest.mark.parametrize("batch_bytes", [300, 1 << 20])
def test_keyless_records_go_in_batches_with_each_ones_headers(batch_bytes: int) -> None:
    """Dead letters: records without a key, each with headers of its own, go in order to one partition in whole
    batches (each sent alone cost ~30 times the CPU: a request each), each keeping its headers; a large one goes
    through producer.send in its place with its own. A batch the broker did not acknowledge is sent again record by
    record, each still with its headers."""
    from stream_eval.stream import logs
    from stream_eval.stream.backoff import BrokerHealth

    producer = _FakeProducer(batch_bytes)
    sender = logs.Sender(producer, BrokerHealth("test", logs.log))
    large = logs.LARGE_RECORD
    records = [(None, b"x" * (large if i == 7 else 10 + i), None) for i in range(40)]
    headers = [[("code", f"c{i}".encode()), ("offset", str(i).encode())] for i in range(40)]

    async def send() -> None:
        await sender.send_batches("dead-letters", records, headers=headers)
        await sender.flush()

    asyncio.run(send())
    assert len({partition for partition, _ in producer.sent}) == 1
    assert [(key, value) for _, batch in producer.sent for key, value, _ in batch] == [r[:2] for r in records]
    assert [h for batch in producer.headers for h in batch] == headers
    assert any(len(batch) > 1 for _, batch in producer.sent)

    producer = _FakeProducer(batch_bytes)
    producer.failing = 1  # the first batch is not acknowledged
    sender = logs.Sender(producer, BrokerHealth("test", logs.log))
    asyncio.run(send())
    first = len(producer.sent[0][1])
    assert [(partition, batch[0][:2]) for partition, batch in producer.sent[-first:]] == \
        [(producer.sent[0][0], r[:2]) for r in records[:first]]
    assert [h for batch in producer.headers[-first:] for h in batch] == headers[:first]


@pytest.mark.slow
@pytest.mark.parametrize("broker_kind", ["kafka"], indirect=True)
def test_apache_kafka_starts_whatever_its_cluster_id(broker_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster id is 16 random bytes in URL-safe base64; one in 32 begins with ``-``, which the storage tool read
    as an option ("usage: kafka-storage format"): a whole CI run's Apache Kafka tests failed on one such id."""
    from types import SimpleNamespace

    from support import make_broker

    from stream_eval.stream import apache_kafka

    leading_dash = b"\xfb" + bytes(15)
    assert apache_kafka._base64url(leading_dash).startswith("-")
    monkeypatch.setattr(apache_kafka.uuid, "uuid4", lambda: SimpleNamespace(bytes=leading_dash))
    broker = make_broker(broker_kind, free_port()).start()
    try:
        asyncio.run(ensure_topics([broker.bootstrap], ["t"], 2, timeout=60))
        assert asyncio.run(partitions_for([broker.bootstrap], "t")) == [0, 1]
    finally:
        broker.stop()


@pytest.mark.slow
@pytest.mark.parametrize("broker_kind", ["kafka"], indirect=True)
def test_logs_read_to_the_end_past_a_transaction_marker(broker: str) -> None:
    """A log whose last offset is a transaction's commit marker (request-metrics after a worker with transactions,
    read by one with the fenced log): the end offset and the keys are found, where a fetch of the last offset,
    which returns no record, used to be retried for ever ("unreadable at offset")."""
    from aiokafka import AIOKafkaProducer

    from stream_eval.stream.backoff import BrokerHealth
    from stream_eval.stream.logs import Logs, log

    topic = f"marker-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        await ensure_topics([broker], [topic], 1, timeout=60)
        producer = AIOKafkaProducer(bootstrap_servers=broker, transactional_id=topic, enable_idempotence=True)
        await producer.start()
        try:
            await producer.begin_transaction()
            for key in (b"r1", b"r2"):
                await producer.send(topic, b"{}", key=key, partition=0)
            await producer.commit_transaction()  # offsets 0, 1 and the marker at 2
        finally:
            await producer.stop()
        health = BrokerHealth("test", log)
        # the coordinator writes the marker after it answered the commit: wait until the log ends with it
        deadline = time.monotonic() + 30
        while await asyncio.wait_for(Logs([broker], health).end_offset(topic, 0), 30) < 3:
            assert time.monotonic() < deadline, "the transaction's marker never reached the log"
            await asyncio.sleep(0.1)
        for isolation in ("read_uncommitted", "read_committed"):
            logs = Logs([broker], health, isolation_level=isolation)
            assert await asyncio.wait_for(logs.end_offset(topic, 0), 30) == 3
            assert await asyncio.wait_for(logs.keys_since(topic, 0, 0), 30) == ({"r1", "r2"}, 3)
        assert not health.errors  # no read had to be retried

    asyncio.run(main())
