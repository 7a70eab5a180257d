"""The worker's consumers get aiokafka's parsed records; every other consumer still gets ConsumerRecord objects."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_eval.stream import fetched
from stream_eval.stream.fetched import JOINED, RAW, Joined, install, lean_options, warm_up

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


# -- the input consumer's fetches, read as one buffer (JOINED) -------------------------------------------------------

_CODEC_NONE, _CODEC_GZIP = 0, 1
_LOG_APPEND_TIME, _CONTROL = 0x08, 0x20


def _batch(base: int, records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]], *, first_ts: int,
           codec: int = _CODEC_NONE, producer: int = -1, transactional: bool = False, attributes: int = 0) -> bytes:
    """One record batch (format v2) as a broker serves it: ``records`` (key, value, headers) at offsets ``base``...,
    timestamps ``first_ts``, ``first_ts + 7``, ...; ``attributes`` bits set on top (log-append time, control), the CRC
    made again."""
    from aiokafka.record.util import calc_crc32c

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=int(transactional),
                                        producer_id=producer, producer_epoch=0 if producer >= 0 else -1,
                                        base_sequence=0 if producer >= 0 else -1, batch_size=1 << 30)
    for k, (key, value, headers) in enumerate(records):
        builder.append(k, timestamp=first_ts + 7 * k, key=key, value=value, headers=headers)
    data = bytearray(builder.build())
    data[0:8] = base.to_bytes(8, "big", signed=True)
    if attributes:
        data[21:23] = (int.from_bytes(data[21:23], "big") | attributes).to_bytes(2, "big")
        data[17:21] = calc_crc32c(bytes(data[21:])).to_bytes(4, "big")
    return bytes(data)


class _Assignment:
    """An assignment of one partition, never paused, whose position follows what is handed out."""

    active = True
    paused = False

    def __init__(self, position: int) -> None:
        self.position = position

    def state_value(self, tp: Any) -> _Assignment:
        return self

    def consumed_to(self, position: int) -> None:
        self.position = position


def _drain(data: bytes, fetch_offset: int, marker: Any, max_records: int | None,
           aborted: list[tuple[int, int]] | None = None, committed_only: bool = False) -> tuple[list[Any], int]:
    """What ``getmany`` hands out of a fetched partition, call by call (``[(offset, timestamp, value)...]`` of each
    call that hands out any), and the position after the last call."""
    from aiokafka.consumer import fetcher
    from aiokafka.consumer.fetcher import READ_COMMITTED, READ_UNCOMMITTED, FetchResult

    install()
    records = fetcher.MemoryRecords(data)
    if not records.has_next():  # (aiokafka makes no PartitionRecords of a fetch without one whole batch)
        return [], fetch_offset
    records = PartitionRecords(TP, records, aborted or [], fetch_offset, None, marker, True,
                               READ_COMMITTED if committed_only else READ_UNCOMMITTED)
    assignment = _Assignment(fetch_offset)
    result = FetchResult(TP, assignment=assignment, partition_records=records, backoff=0)
    calls = []
    while result.has_more():
        taken = result.getall(max_records)
        items = list(zip(taken.offsets, taken.timestamps.tolist(), taken.values, strict=True)) \
            if isinstance(taken, Joined) else [(r.offset, r.timestamp, r.value) for r in taken]
        if isinstance(taken, Joined):
            assert list(taken.values) == [value for _, _, value in items] == taken.values[:]
            assert taken.values[1:-1] == [value for _, _, value in items][1:-1]
            assert taken.offsets == [offset for offset, _, _ in items]
            if taken.joined is not None:
                assert taken.joined == b"\n".join(value for _, _, value in items)  # type: ignore[misc]
        if items:
            calls.append(items)
    return calls, assignment.position


_VALUES = st.one_of(st.none(), st.binary(max_size=30), st.sampled_from([b'{"a": 1}', b"x\ny", b"", b"\r"]))
_RECORD = st.tuples(st.none() | st.binary(max_size=5), _VALUES,
                    st.lists(st.tuples(st.text(max_size=3), st.binary(max_size=4)), max_size=2))


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.tuples(st.lists(_RECORD, min_size=1, max_size=12), st.booleans(), st.integers(0, 3)),
                        min_size=1, max_size=5),
       skip=st.integers(0, 11), max_records=st.none() | st.integers(1, 9), cut=st.integers(0, 40))
def test_a_fetch_read_as_one_buffer_hands_out_what_aiokafka_does(batches: list[Any], skip: int,
                                                                 max_records: int | None, cut: int) -> None:
    """JOINED against aiokafka's own reading (RAW): offsets, timestamps (log-append too), values (null, empty, with
    line breaks), the fetch position inside the first batch, ``max_records`` at a time, gaps between batches and a
    last batch cut short (a fetch ends where its size limit fell)."""
    data, base = b"", 100
    for records, log_append, gap in batches:
        data += _batch(base, records, first_ts=1_700_000_000_000 + base,
                       attributes=_LOG_APPEND_TIME if log_append else 0)
        base += len(records) + gap
    if cut:
        data = data[:-cut] if cut < len(data) - 70 else data
    fetch_offset = 100 + min(skip, len(batches[0][0]) - 1)
    assert _drain(data, fetch_offset, JOINED, max_records) == _drain(data, fetch_offset, RAW, max_records)


def test_aborted_transactions_and_control_batches_are_left_out_as_aiokafka_leaves_them() -> None:
    """read_committed: the batches of an aborted transaction (until its abort marker), and every control batch, are
    skipped; read_uncommitted reads the aborted ones too. Against aiokafka's own reading."""
    from aiokafka.record.control_record import _SCHEMA

    abort, commit = _SCHEMA.pack(0, 0), _SCHEMA.pack(0, 1)
    data = (_batch(0, [(None, b'{"p": 7, "n": 0}', []), (None, b'{"p": 7, "n": 1}', [])], first_ts=10, producer=7,
                   transactional=True)
            + _batch(2, [(None, b'{"p": 8, "n": 0}', [])], first_ts=11, producer=8, transactional=True)
            + _batch(3, [(abort, b"", [])], first_ts=12, producer=7, transactional=True, attributes=_CONTROL)
            + _batch(4, [(commit, b"", [])], first_ts=13, producer=8, transactional=True, attributes=_CONTROL)
            + _batch(5, [(None, b'{"plain": 1}', [])], first_ts=14))
    for committed_only in (True, False):
        for max_records in (None, 1, 2):
            calls, position = _drain(data, 0, JOINED, max_records, aborted=[(7, 0)], committed_only=committed_only)
            assert (calls, position) == _drain(data, 0, RAW, max_records, aborted=[(7, 0)],
                                               committed_only=committed_only)
            values = [value for items in calls for _, _, value in items]
            assert values == ([b'{"p": 8, "n": 0}', b'{"plain": 1}'] if committed_only else
                              [b'{"p": 7, "n": 0}', b'{"p": 7, "n": 1}', b'{"p": 8, "n": 0}', b'{"plain": 1}'])
            assert position == 6


def test_a_fetch_the_compiled_loop_does_not_read_goes_aiokafkas_way() -> None:
    """A compressed batch: the fetch's records one by one, as RAW gives them; a batch whose CRC is wrong: aiokafka's
    error, as without the shortcut."""
    from aiokafka.errors import CorruptRecordException

    plain = _batch(0, [(None, b'{"a": 1}', [])], first_ts=5)
    zipped = _batch(1, [(None, b'{"b": 2}', []), (b"k", None, [])], first_ts=6, codec=_CODEC_GZIP)
    calls, position = _drain(plain + zipped, 0, JOINED, None)
    assert (calls, position) == _drain(plain + zipped, 0, RAW, None)
    assert [value for items in calls for _, _, value in items] == [b'{"a": 1}', b'{"b": 2}', None] and position == 3
    broken = bytearray(plain)
    broken[-1] ^= 0xFF
    with pytest.raises(CorruptRecordException):
        _drain(bytes(broken), 0, JOINED, None)


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.binary(max_size=300), min_size=1, max_size=20), flip=st.integers(0, 10**6),
       bit=st.integers(0, 7))
def test_batch_crcs_are_checked_by_the_cpu_instruction_as_aiokafka_checks_them(values: list[bytes], flip: int,
                                                                                bit: int) -> None:
    """The JOINED loop checks each batch's CRC-32C with google-crc32c's compiled library (a dependency; on this
    machine its C implementation): the verdict of aiokafka's ``validate_crc``, on a batch as built (valid) and on
    one with a bit flipped anywhere from the CRC on (the CRC itself, or the bytes it covers: invalid)."""
    assert fetched._crc32c is not None, "google-crc32c without its compiled library: the slower check is used"
    data = _batch(3, [(None, value, []) for value in values], first_ts=9)
    broken = bytearray(data)
    broken[17 + flip % (len(data) - 17)] ^= 1 << bit
    for buffer, valid in ((data, True), (bytes(broken), False)):
        batch = MemoryRecords(buffer).next_batch()
        assert batch.validate_crc() is valid
        assert fetched._crc_valid(batch, np.frombuffer(buffer, dtype=np.uint8), 0, len(buffer)) is valid


def test_the_worker_warms_the_compiled_loop_up() -> None:
    warm_up()  # (asserts what it read)


def _varint(value: int) -> bytes:
    """A zigzag varint (Kafka's record fields)."""
    zigzag, out = ((value << 1) ^ (value >> 63)) & ((1 << 64) - 1), bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    return bytes([*out, zigzag])


def _recrc(data: bytearray, start: int = 0) -> bytes:
    """The batch at ``start`` with its length and CRC made again for what it now holds (a broker that checks nothing
    serves such a batch)."""
    from aiokafka.record.util import calc_crc32c

    data[start + 8 : start + 12] = (len(data) - start - 12).to_bytes(4, "big")
    data[start + 17 : start + 21] = calc_crc32c(bytes(data[start + 21 :])).to_bytes(4, "big")
    return bytes(data)


def _outcome(data: bytes, marker: Any, max_records: int | None) -> Any:
    try:
        return _drain(data, 100, marker, max_records)
    except Exception as error:  # noqa: BLE001  # (the error's kind is what is compared)
        return type(error)


@settings(max_examples=300, deadline=None)
@given(records=st.lists(_RECORD, min_size=1, max_size=6), where=st.integers(0, 10_000), byte=st.integers(0, 255),
       max_records=st.none() | st.integers(1, 3))
def test_a_batch_made_wrong_with_a_right_crc_is_read_as_aiokafka_reads_it(records: list[Any], where: int, byte: int,
                                                                        max_records: int | None) -> None:
    """One byte of the records changed, the CRC made again: the same messages as aiokafka's reading, or the same
    error (a header key that is not UTF-8, which aiokafka refuses, may be read)."""
    data = bytearray(_batch(100, records, first_ts=1_000))
    at = 61 + where % (len(data) - 61)
    data[at] = byte
    raw, joined = _outcome(_recrc(data), RAW, max_records), _outcome(_recrc(data), JOINED, max_records)
    assert joined == raw or raw is UnicodeDecodeError


def test_lengths_and_counts_no_batch_can_hold_are_aiokafkas_errors() -> None:
    """A key length near 2**63 (once read past the buffer) and a count of a billion records (once sized arrays for
    them): aiokafka's error, as without the shortcut."""
    from aiokafka.errors import CorruptRecordException

    body = b"\x00" + _varint(0) + _varint(0) + _varint(2**63 - 6) + _varint(1) + b"A" + _varint(0)
    huge_key = bytearray(_batch(100, [(None, b"x", [])], first_ts=1_000))[:61] + _varint(len(body)) + body
    data = _recrc(huge_key)
    assert _outcome(data, JOINED, None) is _outcome(data, RAW, None) is OverflowError
    counted = bytearray(_batch(100, [(None, b"x", [])], first_ts=1_000))
    counted[57:61] = (10**9).to_bytes(4, "big")
    data = _recrc(counted)
    assert _outcome(data, JOINED, None) is _outcome(data, RAW, None) is CorruptRecordException
    from aiokafka.consumer import fetcher

    from stream_eval.stream.fetched import _unpack

    install()
    assert _unpack(PartitionRecords(TP, fetcher.MemoryRecords(data), [], 100, None, JOINED, True, 0)) is None


@settings(max_examples=300, deadline=None)
@given(value=st.integers(-(2**63), 2**63 - 1), before=st.binary(max_size=3), after=st.binary(max_size=3))
def test_a_varint_is_read_as_aiokafka_writes_it_and_a_cut_one_is_refused(value: int, before: bytes,
                                                                         after: bytes) -> None:
    """The compiled loop's varint (read with its first byte before its loop, docs/benchmarks.md) gives what
    aiokafka's ``encode_varint`` wrote, and the place after it; cut anywhere short of its end, or run on past
    64 bits, it is refused."""
    from aiokafka.record.util import encode_varint

    from stream_eval.stream.compiled import _varint

    written = bytearray()
    encode_varint(value, written.append)
    buf = np.frombuffer(before + bytes(written) + after, dtype=np.uint8)
    end = len(before) + len(written)
    assert _varint(buf, len(before), len(buf)) == (value, end, True)
    for cut in range(len(before), end):
        assert _varint(buf, len(before), cut)[2] is False
    assert _varint(np.array([0x80] * 10 + [0], dtype=np.uint8), 0, 11)[2] is False  # (an 11th byte: past 64 bits)
