"""The worker's consumers get aiokafka's parsed records; every other consumer still gets ConsumerRecord objects."""

from __future__ import annotations

from typing import Any

from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord, TopicPartition

from stream_eval.stream.fetched import RAW, install, lean_options

TP = TopicPartition("t", 3)


def _records(value_deserializer: Any) -> list[Any]:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for offset, (key, value) in enumerate([(b"k1", b'{"a":1}'), (None, b'{"b":2}')]):
        builder.append(offset, timestamp=1_000 + offset, key=key, value=value, headers=[])
    records = MemoryRecords(bytes(builder.build()))
    return list(PartitionRecords(TP, records, [], 0, None, value_deserializer, True, 0))


def test_the_worker_reads_the_same_fields_from_parsed_records() -> None:
    assert install() and install()  # (idempotent)
    assert lean_options() == {"value_deserializer": RAW}
    lean, full = _records(RAW), _records(None)
    assert all(type(record) is not ConsumerRecord for record in lean)
    assert all(type(record) is ConsumerRecord for record in full)
    fields = [(r.offset, r.timestamp, r.key, r.value) for r in lean]
    assert fields == [(r.offset, r.timestamp, r.key, r.value) for r in full]
    assert fields == [(0, 1_000, b"k1", b'{"a":1}'), (1, 1_001, None, b'{"b":2}')]


def test_other_deserializers_are_left_alone() -> None:
    install()
    records = _records(bytes.decode)
    assert [type(r) for r in records] == [ConsumerRecord, ConsumerRecord]
    assert [r.value for r in records] == ['{"a":1}', '{"b":2}']
    assert RAW(b"x") == b"x" and RAW(None) is None
