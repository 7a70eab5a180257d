"""The cyclic garbage collector is off while the worker handles a batch, and as it was after (``collector_paused``)."""

from __future__ import annotations

import gc
import weakref

import pytest

from stream_eval.stream.worker import collector_paused


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_off_in_a_batch_and_as_it_was_after(enabled: bool) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError), collector_paused():  # a batch that fails leaves it as it was too
            raise RuntimeError("batch failed")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_a_cycle_made_in_a_batch_is_collected_by_the_first_allocation_after_it() -> None:
    class Node:
        me: Node

    was = gc.isenabled()
    gc.enable()
    try:
        with collector_paused():
            node = Node()
            node.me = node  # a cycle: only the collector frees it
            freed = weakref.ref(node)
            del node
            held: list[list[int]] = [[] for _ in range(2 * gc.get_threshold()[0])]  # (calls for a young collection)
            assert gc.get_count()[0] > gc.get_threshold()[0]
            assert freed() is not None  # (none ran)
        after = [held]  # the first container made after the batch
        assert gc.get_count()[0] < gc.get_threshold()[0]
        assert freed() is None
        del after, held
    finally:
        (gc.enable if was else gc.disable)()
