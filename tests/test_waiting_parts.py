"""The regroup stage's waiting session parts (engine/regroup.py, ``_WaitingParts``): parts come out in the order
of (deadline, offset of their record, row in it) as event time passes them, as a heap of every part gives them."""

from __future__ import annotations

import heapq

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_eval.engine.parts import Parts
from stream_eval.engine.regroup import _WaitingParts

HORIZON = 1800.0


def _parts(names: list[str], times: list[float]) -> Parts:
    """Parts named ``names`` (their session ids) served at ``times``, each with one served item."""
    n = len(names)
    return Parts(names, ["e"] * n, ["a"] * n, np.array(times, dtype=np.float64), np.ones(n, dtype=np.int64),
                 np.arange(n, dtype=np.float64), np.zeros(n, dtype=np.int64), np.empty(0, dtype=np.int64),
                 [None] * n, None, None)


records = st.lists(st.lists(st.sampled_from([0.0, 1.0, 2.5, 7.0, 7.0, 30.0, float("inf")]), min_size=0, max_size=6),
                   min_size=1, max_size=8)
steps = st.lists(st.sampled_from([-1.0, 0.0, 1.0, 2.0, 2.5, 6.9, 7.0, 20.0, 1e9, float("inf")]), min_size=1,
                 max_size=6)


@settings(max_examples=300, deadline=None)
@given(records, steps, st.randoms(use_true_random=False))
def test_parts_come_out_as_a_heap_of_every_part_gives_them(times: list[list[float]], marks: list[float],
                                                          rng: object) -> None:
    waiting, heap = _WaitingParts(HORIZON), []
    offsets = list(range(100, 100 + 7 * len(times), 7))
    rng.shuffle(offsets)  # type: ignore[attr-defined]  # (records applied out of offset order, as commits do)
    for offset, ts_list in zip(offsets, times, strict=True):
        names = [f"{offset}-{row}" for row in range(len(ts_list))]
        waiting.add(offset, _parts(names, ts_list))
        for row, (name, ts) in enumerate(zip(names, ts_list, strict=True)):
            heapq.heappush(heap, (ts + HORIZON, offset, row, name))
    for mark in sorted(marks):
        watermark = mark + HORIZON
        got_offsets, got = waiting.due(watermark)
        expected = []
        while heap and heap[0][0] <= watermark:
            expected.append(heapq.heappop(heap))
        assert ([] if got is None else got.sessions) == [name for _, _, _, name in expected]
        if got is not None:  # (each part's own item went with it: its score is its row)
            assert got.scores.tolist() == [float(name.split("-")[1]) for name in got.sessions]
        assert got_offsets.tolist() == [offset for _, offset, _, _ in expected]
        assert waiting.first_offset() == (min(offset for _, offset, _, _ in heap) if heap else None)
        assert bool(waiting) == bool(heap) and len(waiting) == len(heap)
