"""The worker's C heap: glibc's mmap threshold held fixed (``stream/app.py``), so that large temporaries never
settle in the heap (bench/soak.py measures the RSS it saves)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

PROBE = """
import ctypes, sys
from stream_eval.stream.app import fix_mmap_threshold

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold()
libc.free(libc.malloc(8 << 20))  # a mapped block freed: glibc raises its threshold to 8 MiB, unless it is fixed
mapped = libc.mallinfo2().hblkhd
block = libc.malloc(1 << 20)
print(libc.mallinfo2().hblkhd - mapped)
"""


def _glibc() -> tuple[int, ...]:
    name, version = platform.libc_ver()
    return tuple(int(part) for part in version.split(".")) if name == "glibc" and version else ()


@pytest.mark.skipif(_glibc() < (2, 33), reason="glibc's malloc, with mallinfo2 (2.33)")
@pytest.mark.parametrize("threshold", ["glibc-default", "fixed"])
def test_a_fixed_mmap_threshold_keeps_large_blocks_out_of_the_heap(threshold: str) -> None:
    """After a large block is freed, glibc serves a 1 MiB allocation from the heap (its threshold moved up); with
    the worker's fixed threshold, from a mapping of its own, given back when it is freed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # glibc's tunables: its defaults
    done = subprocess.run([sys.executable, "-c", PROBE, threshold], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 0, done.stderr
    mapped = int(done.stdout)
    assert (mapped >= 1 << 20) == (threshold == "fixed"), mapped
