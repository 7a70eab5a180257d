"""A process-wide setting of the C allocator for long runs: the replay of a large log, the streaming worker."""

from __future__ import annotations

import ctypes
import os
import sys

#: glibc's ``mallopt`` parameter: the size from which a block gets a memory mapping of its own.
_M_MMAP_THRESHOLD = -3
#: Blocks from 16 MiB up are mapped on their own (see :func:`pin_mmap_threshold`).
MMAP_THRESHOLD = 16 << 20


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Keep glibc's mmap threshold where it is set, instead of letting it rise as the run goes.

    By default glibc raises the threshold to the size of each mapped block that is freed (up to 32 MiB). After
    that, the temporaries of each chunk (several MB) come from the heap, between arrays that live for the
    attribution window, and the heap grows with the number of requests replayed although the data held does not:
    521 MB of peak RSS for 1M requests and 552 MB for 2M at the same density (docs/benchmarks.md, 2026-11-23).
    Pinned at 16 MiB: 483 and 488 MB, for ~3 % more time on the main benchmark file.

    Does nothing (and returns ``False``) off Linux, without glibc's ``mallopt``, or when the user set
    ``MALLOC_MMAP_THRESHOLD_`` themselves.
    """
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
