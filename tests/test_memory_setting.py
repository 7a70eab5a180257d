"""The allocator setting of long runs (stream_eval/memory.py)."""

from __future__ import annotations

import sys

import pytest

from stream_eval import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_the_mmap_threshold_is_pinned_on_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert memory.pin_mmap_threshold() is True


def test_a_threshold_the_user_set_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert memory.pin_mmap_threshold() is False
