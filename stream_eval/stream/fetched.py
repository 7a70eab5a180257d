"""Fetched messages as aiokafka parsed them, without a ``ConsumerRecord`` each: for the worker's own consumers.

For every message it hands out, aiokafka builds a ``ConsumerRecord`` (a Python dataclass of eleven fields, the
headers copied into a tuple) from the record its compiled parser made. The worker reads four of those fields
(``offset``, ``timestamp``, ``key``, ``value``), which the parsed record has too; what building the dataclass
cost a worker is in docs/benchmarks.md ("Where a worker's CPU goes").

A consumer created with ``value_deserializer=RAW`` (:func:`lean_options`) gets the parsed records themselves, once
:func:`install` has run (the worker calls it before it creates its consumers). Every other consumer of the process,
faust's among them, still gets ``ConsumerRecord`` objects: only ``RAW`` selects the shortcut. ``RAW`` is the
identity, so where the shortcut is not installed (an aiokafka without ``PartitionRecords._consumer_record``), the
same consumer gets ``ConsumerRecord`` objects with the same values.
"""

from __future__ import annotations

from typing import Any


def RAW(value: bytes | None) -> bytes | None:  # noqa: N802  # a marker, named like a constant
    """The value as fetched (the marker of a consumer that takes aiokafka's parsed records)."""
    return value


_installed = False


def install() -> bool:
    """Let consumers created with ``value_deserializer=RAW`` get aiokafka's parsed records (idempotent); ``False``
    where this aiokafka has no such hook (they then get ``ConsumerRecord`` objects, as any other consumer)."""
    global _installed
    if _installed:
        return True
    try:
        from aiokafka.consumer.fetcher import PartitionRecords
    except ImportError:
        return False
    original = getattr(PartitionRecords, "_consumer_record", None)
    if original is None:
        return False

    def consumer_record(self: Any, tp: Any, record: Any) -> Any:
        if self._value_deserializer is RAW and self._key_deserializer is None:
            return record  # (offset, timestamp, timestamp_type, key, value, headers, checksum)
        return original(self, tp, record)

    PartitionRecords._consumer_record = consumer_record
    _installed = True
    return True


def lean_options() -> dict[str, Any]:
    """Options of an ``AIOKafkaConsumer`` whose records need only ``offset``, ``timestamp``, ``key`` and ``value``
    (after :func:`install`: aiokafka's parsed records)."""
    install()
    return {"value_deserializer": RAW}
