"""The worker's C heap: glibc's mmap and trim thresholds set by the worker (``stream/app.py``, ``tune_malloc``), so
that the blocks its batches free are reused from the heap instead of being mapped afresh each time (bench/stream.py
measures the system time it saves, bench/soak.py the RSS)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

PROBE = """
import ctypes, sys
from stream_eval.stream.app import MMAP_THRESHOLD, tune_malloc

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "tuned":
    assert tune_malloc()
elif sys.argv[1] == "tuned-under-tunables":  # (the environment sets a tunable of its own)
    assert tune_malloc() is False

def mapped(size):
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(size)
    now = libc.mallinfo2().hblkhd - before
    libc.free(block)
    return now

print(mapped(1 << 20), mapped(MMAP_THRESHOLD * 2))
"""


def _glibc() -> tuple[int, ...]:
    name, version = platform.libc_ver()
    return tuple(int(part) for part in version.split(".")) if name == "glibc" and version else ()


def _probe(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60,
                          env={**clean, **env})


@pytest.mark.skipif(_glibc() < (2, 33), reason="glibc's malloc, with mallinfo2 (2.33)")
@pytest.mark.parametrize("malloc", ["glibc-default", "tuned"])
def test_the_worker_serves_megabyte_blocks_from_the_heap(malloc: str) -> None:
    """glibc maps a fresh 1 MiB block from the OS (its threshold starts at 128 KiB); with the worker's settings it
    comes from the heap, while a block over the worker's threshold is still mapped."""
    done = _probe(malloc)
    assert done.returncode == 0, done.stderr
    megabyte, large = (int(n) for n in done.stdout.split())
    assert (megabyte >= 1 << 20) == (malloc == "glibc-default"), megabyte
    assert large > 0


@pytest.mark.skipif(_glibc() < (2, 33), reason="glibc's malloc, with mallinfo2 (2.33)")
def test_glibc_tunables_in_the_environment_win() -> None:
    """A deployment that sets glibc's malloc tunables itself keeps them: the worker sets nothing, so a 1 MiB block is
    still mapped (glibc's own threshold), where the worker's settings would serve it from the heap."""
    for env in ({"MALLOC_TRIM_THRESHOLD_": "1048576"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"}):
        done = _probe("tuned-under-tunables", **env)
        assert done.returncode == 0, (env, done.stderr)
        megabyte, _ = (int(n) for n in done.stdout.split())
        assert megabyte >= 1 << 20, (env, megabyte)
