"""Record batches written from columns (``stream/batches.py``): the bytes aiokafka's own builder writes."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_eval.stream.batches import Records, column_batches

RECORDS = st.lists(st.tuples(st.binary(min_size=1, max_size=24), st.binary(max_size=400),
                             st.integers(0, 1 << 42)), min_size=1, max_size=60)


def _aiokafka_batches(records: list[tuple[bytes, bytes, int]], batch_size: int, transactional: bool,
                      state: tuple[int, int, int] | None, compiled: bool) -> list[bytes]:
    """The batches aiokafka's builder fills with ``records``, appended until it is full, then a new one: its
    compiled builder (what its producer uses) or its Python one (``compiled`` False)."""
    from aiokafka.record._crecords.default_records import DefaultRecordBatchBuilder
    from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

    kind: Any = DefaultRecordBatchBuilder if compiled else _DefaultRecordBatchBuilderPy
    built: list[bytes] = []

    def finish(builder: Any) -> None:
        if state is not None:
            builder.set_producer_state(*state)
        built.append(bytes(builder.build()))

    def new() -> Any:
        return kind(2, 0, int(transactional), -1, -1, 0, batch_size)

    builder, offset = new(), 0
    for key, value, stamp in records:
        while builder.append(offset, timestamp=stamp, key=key, value=value, headers=[]) is None:
            finish(builder)
            builder, offset = new(), 0
        offset += 1
    finish(builder)
    return built


@settings(max_examples=300, deadline=None)
@given(RECORDS, st.integers(80, 3000), st.booleans(),
       st.none() | st.tuples(st.integers(0, 1 << 40), st.integers(0, 1000), st.integers(0, 1 << 30)),
       st.booleans())
def test_column_batches_are_the_batches_aiokafka_builds(records: list[tuple[bytes, bytes, int]], batch_size: int,
                                                        transactional: bool, state: tuple[int, int, int] | None,
                                                        by_time: bool) -> None:
    """Byte for byte what aiokafka writes, with the producer's state and the transactional flag in the header: each
    batch what its Python builder (the reference) makes of the same records, timestamps in any order (a negative
    delta); and with timestamps in order, the batches its compiled builder of the same size fills, which its
    producer uses (a record that does not fit starts the next batch; a batch's first record always fits). Where a
    timestamp is below the batch's first, the compiled builder takes its delta for larger than it is, and may start
    a new batch one record sooner."""
    if by_time:
        records = sorted(records, key=lambda record: record[2])
    ours, split = [], []
    done = 0
    for batch, end in column_batches(Records.of(*zip(*records, strict=True)), batch_size, transactional):
        assert batch.record_count() == end - done and batch.closed()
        assert batch.append(timestamp=None, key=b"k", value=b"v") is None  # (it takes no more)
        split.append(records[done:end])
        done = end
        if state is not None:
            batch._set_producer_state(*state)
        size = batch.size()
        ours.append(bytes(batch._build()))
        assert len(ours[-1]) == size
    assert done == len(records)
    assert ours == [_aiokafka_batches(part, 1 << 30, transactional, state, compiled=False)[0] for part in split]
    if by_time:
        assert ours == _aiokafka_batches(records, batch_size, transactional, state, compiled=True)


def test_records_without_a_timestamp_take_the_clocks() -> None:
    from aiokafka.record.default_records import DefaultRecordBatch

    before = int(time.time() * 1000)
    [(batch, _)] = list(column_batches(Records.of([b"a", b"b"], [b"x", b"y"], [-1, 7]), 1 << 20, False))
    after = int(time.time() * 1000)
    stamps = [record.timestamp for record in DefaultRecordBatch(bytes(batch._build()))]
    assert before <= stamps[0] <= after and stamps[1] == 7


@settings(max_examples=200, deadline=None)
@given(RECORDS, st.data())
def test_records_sliced_picked_and_joined_hold_their_records(records: list[tuple[bytes, bytes, int]],
                                                            data: st.DataObject) -> None:
    columns = Records.of(*zip(*records, strict=True))
    assert list(columns) == records
    start = data.draw(st.integers(0, len(records)))
    stop = data.draw(st.integers(start, len(records)))
    assert list(columns[start:stop]) == records[start:stop]
    picked = sorted(data.draw(st.sets(st.integers(0, len(records) - 1))))
    assert list(columns.rows(np.array(picked, dtype=np.int64))) == [records[i] for i in picked]
    assert list(Records.joined([columns[:start], columns[start:]])) == records
    assert columns.sizes().tolist() == [len(key) + len(value) for key, value, _ in records]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=10) | st.sampled_from(['"', "\\", "é", "ü\u2028", "r,1"]),
                          st.floats() | st.sampled_from([0.0, -1e-3, 1.0015, 9.3e15, 1e17])), min_size=1, max_size=8),
       st.data())
def test_request_records_are_each_requests_record_keyed_by_its_id_at_its_serve_time(
        requests: list[tuple[str, float]], data: st.DataObject) -> None:
    """The request-metrics records of a finalised batch: each request's JSON record (``encoded``), keyed by its id in
    UTF-8, its timestamp the serve time in milliseconds, or none (the producer's clock) for a time Kafka cannot hold
    (negative, NaN, past int64 milliseconds); rows picked (the hand-over hold's) keep theirs."""
    from types import SimpleNamespace as Of

    from stream_eval.engine.engine import FinalisedBatch
    from stream_eval.stream.delivery import RequestRecords

    states = [Of(request_id=rid, experiment="e", arm="a", query_id=None, session_id=None, ts=ts)
              for rid, ts in requests]
    batch = FinalisedBatch(states, (Of(name="RR"),), np.arange(len(states), dtype=np.float64)[:, None])  # type: ignore[arg-type]
    made = RequestRecords.of(3, batch)

    def stamp(ts: float) -> int | None:
        ms = ts * 1000.0
        return int(ms) if 0.0 <= ms < 9.2e18 else None

    expected = [(rid.encode(), value, stamp(ts)) for (rid, ts), value in zip(requests, batch.encoded(), strict=True)]
    assert made.partition == 3 and made.ids == [rid for rid, _ in requests]
    assert list(made.records) == expected
    kept = sorted(data.draw(st.sets(st.integers(0, len(requests) - 1))))
    assert list(made.rows(kept).records) == [expected[i] for i in kept]


def test_a_view_that_outlives_the_packing_leaves_the_batches_as_they_are(monkeypatch: Any) -> None:
    """A view of a batch's buffer still alive after the compiled packing loop returns (numba compiling a new
    signature in that call can leave its arguments in a reference cycle, which the worker's paused collector keeps)
    blocks cutting the buffer in place: the batch is then a copy cut to size, the same bytes. Before, the worker
    stopped with ``BufferError: Existing exports of data`` in a commit."""
    import gc

    from stream_eval.stream import batches

    kept: list[Any] = []
    packing = batches.pack_records

    def keeping(*args: Any) -> Any:
        kept.append(args[7])  # the view of the buffer, alive after the call
        return packing(*args)

    records = [(b"k%d" % i, b"v" * (i % 50), 1000 + i) for i in range(300)]
    expected = [bytes(batch._build()) for batch, _ in column_batches(Records.of(*zip(*records, strict=True)), 2000,
                                                                     False)]
    monkeypatch.setattr(batches, "pack_records", keeping)
    gc.disable()
    try:
        got = [bytes(batch._build()) for batch, _ in column_batches(Records.of(*zip(*records, strict=True)), 2000,
                                                                    False)]
    finally:
        gc.enable()
    assert len(kept) == len(expected) > 1
    assert got == expected


def test_the_packing_loop_warmed_up_is_the_one_every_commit_calls() -> None:
    """After the worker's warm-up, packing records read from one buffer, joined from several parts, sliced or
    picked compiles nothing more: a commit never waits for numba (and never makes the view the loop writes
    through outlive the call, as compiling did: the test above). Whether an array is writable is part of a compiled
    loop's signature, and joined records' arrays are writable where one buffer's are not."""
    from stream_eval.config import Config
    from stream_eval.stream import compiled
    from stream_eval.stream.worker import warm_up

    warm_up(Config())
    signatures = list(compiled.pack_records.signatures)
    one = Records.of([b"k1", b"k22"], [b"v1", b""], [5, -1])
    other = Records.of([b"k3"], [b"value"], [7])
    for records in (one, Records.joined([one, other]), Records.joined([one, other])[1:], one[:1]):
        assert [batch.record_count() for batch, _ in column_batches(records, 1 << 20, False)] == [len(records)]
    assert compiled.pack_records.signatures == signatures
