"""stream_eval: ranking metrics, sessions' AUC and A/B decisions over search logs, replayed or live from Kafka."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable


def writable(path: str) -> bool:
    """Whether a file can be created in directory ``path`` (made if missing), as numba checks its cache places."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def numba_cache_dir(package: str, user_cache: str, can_write: Callable[[str], bool] = writable) -> str | None:
    """Where numba is to cache the compiled loops (``compiled.py`` modules, ``cache=True``), or None for its own
    choice: beside the package (``__pycache__``), else the user's cache directory. Where neither can be written (an
    image's read-only site-packages run by a user without a home, a read-only root file system), numba fails at
    import ("no locator available"): then a directory of this user's in the temporary directory, so that every
    command runs (each new process compiles once more when that directory does not persist)."""
    if can_write(os.path.join(package, "__pycache__")) or can_write(user_cache):
        return None
    return os.path.join(tempfile.gettempdir(), f"stream-eval-numba-{os.getuid() if hasattr(os, 'getuid') else 0}")


def _numba_cache() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    chosen = numba_cache_dir(os.path.dirname(os.path.abspath(__file__)), os.path.join(cache_home, "numba"))
    if chosen is not None:
        os.environ["NUMBA_CACHE_DIR"] = chosen
        numba = sys.modules.get("numba")
        if numba is not None:  # (imported before us: its configuration is read already)
            numba.config.CACHE_DIR = chosen


_numba_cache()
