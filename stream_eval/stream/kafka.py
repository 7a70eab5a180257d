"""Thin Kafka helpers shared by the worker, ``produce``, ``simulate --broker`` and the demo.

Broker addresses, topic names, topic creation, partition look-up and message keys. Nothing here keeps state.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_BROKER",
    "DEFAULT_PARTITIONS",
    "Topics",
    "ensure_topics",
    "event_key",
    "parse_brokers",
    "partitions_for",
    "topics",
]

DEFAULT_BROKER = "kafka://localhost:9092"
"""The ``--broker`` default of every Kafka command (SPEC §4)."""

DEFAULT_PARTITIONS = 4
"""Partitions of the topics we create (the broker's auto-creation also gives 4)."""

_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}$")


def parse_brokers(url: str) -> list[str]:
    """Bootstrap ``host:port`` list from a ``--broker`` value.

    >>> parse_brokers("kafka://localhost:9092,kafka://h2:9093")
    ['localhost:9092', 'h2:9093']
    >>> parse_brokers("localhost:9092, h2:9093")
    ['localhost:9092', 'h2:9093']

    Raises:
        ValueError: An entry is not ``[kafka://]host:port`` with a port in 1..65535, or the value is empty.
    """
    result: list[str] = []
    for raw in url.split(","):
        entry = raw.strip()
        if not entry:
            continue
        address = entry
        if "://" in address:
            scheme, _, address = address.partition("://")
            if scheme.lower() not in ("kafka", "tcp", "plaintext"):
                raise ValueError(f"broker {entry!r}: unsupported scheme {scheme!r} (use kafka://host:port)")
        address = address.rstrip("/")
        if not _HOST_PORT.match(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
            raise ValueError(f"broker {entry!r}: expected host:port or kafka://host:port")
        result.append(address)
    if not result:
        raise ValueError(f"no broker address in {url!r} (expected e.g. kafka://localhost:9092)")
    return result


@dataclass(frozen=True)
class Topics:
    """Names of the topics of one deployment (SPEC §1, §4)."""

    rankings: str
    feedback: str
    judgments: str
    request_metrics: str
    dead_letters: str

    @property
    def inputs(self) -> tuple[str, str, str]:
        """The input topics: rankings, feedback, judgments."""
        return (self.rankings, self.feedback, self.judgments)

    def type_of(self, topic: str) -> str:
        """The event type an input topic carries: ``"ranking"``, ``"feedback"`` or ``"judgment"``.

        Raises:
            ValueError: ``topic`` is not one of :attr:`inputs`.
        """
        for name, kind in zip(self.inputs, ("ranking", "feedback", "judgment"), strict=True):
            if topic == name:
                return kind
        raise ValueError(f"{topic!r} is not an input topic ({', '.join(self.inputs)})")

    def for_type(self, kind: str) -> str:
        """The input topic of an event type (``"ranking"``, ``"feedback"``, ``"judgment"``).

        Raises:
            ValueError: ``kind`` is not one of the three event types.
        """
        by_type = {"ranking": self.rankings, "feedback": self.feedback, "judgment": self.judgments}
        try:
            return by_type[kind]
        except KeyError:
            raise ValueError(f"unknown event type {kind!r}") from None


def topics(prefix: str = "") -> Topics:
    """Topic names with a prefix, e.g. ``topics("demo.").rankings == "demo.rankings"``."""
    return Topics(
        rankings=f"{prefix}rankings",
        feedback=f"{prefix}feedback",
        judgments=f"{prefix}judgments",
        request_metrics=f"{prefix}request-metrics",
        dead_letters=f"{prefix}dead-letters",
    )


async def ensure_topics(bootstrap: list[str], names: Iterable[str], partitions: int, timeout: float = 30) -> None:
    """Create the topics that do not exist yet, each with ``partitions`` partitions.

    Existing topics are left as they are. Retries (connection refused, broker still starting) until ``timeout``
    seconds have passed.

    Raises:
        TimeoutError: The broker did not answer, or the topics could not be created, within ``timeout``.
        ValueError: ``partitions`` < 1.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=max(1000, int(timeout * 1000)))
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            missing = [name for name in wanted if name not in existing]
            if missing:
                new = [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in missing]
                response: Any = await admin.create_topics(new)
                for topic_error in getattr(response, "topic_errors", []):
                    name, code = topic_error[0], topic_error[1]
                    if code not in (0, TopicAlreadyExistsError.errno):
                        raise RuntimeError(f"cannot create topic {name!r}: error code {code}")
            return
        except (TimeoutError, RuntimeError, OSError) as error:
            last = error
        except Exception as error:  # aiokafka's KafkaError family: broker not ready yet
            if type(error).__module__.split(".")[0] != "aiokafka":
                raise
            last = error
        finally:
            await admin.close()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"cannot create topics on {','.join(bootstrap)} within {timeout:g}s: {last}")
        await asyncio.sleep(0.25)


async def partitions_for(bootstrap: list[str], topic: str) -> list[int]:
    """Sorted partition ids of ``topic`` (empty if the topic does not exist)."""
    from aiokafka import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    try:
        await client.bootstrap()
        await client.force_metadata_update()
        found = client.cluster.partitions_for_topic(topic)
        return sorted(found) if found else []
    finally:
        await client.close()


def event_key(kind: str, fields: dict[str, Any] | None) -> bytes | None:
    """The message key of an event: ``request_id`` for rankings and feedback, ``query_id`` for judgments.

    ``None`` when the field is missing or not a string (the worker reports such events as invalid).
    """
    if fields is None:
        return None
    name = "query_id" if kind == "judgment" else "request_id" if kind in ("ranking", "feedback") else None
    if name is None:
        return None
    value = fields.get(name)
    return value.encode() if isinstance(value, str) else None
