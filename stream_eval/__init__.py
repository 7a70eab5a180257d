"""stream_eval: ranking metrics, sessions' AUC and A/B decisions over search logs, replayed or live from Kafka."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Callable


def writable(path: str) -> bool:
    """Whether a file can be created in directory ``path`` (made if missing), as numba checks its cache places."""
    if path.startswith("~"):  # (no home to expand to: not a place to create)
        return False
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def private_dir(path: str) -> bool:
    """Whether ``path`` is (or can be made) a directory of this user's that no one else can write: numba loads the
    index files of its cache with pickle, so a cache others can write runs their code."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        found = os.lstat(path)
    except OSError:
        return False
    owner = found.st_uid == os.getuid() if hasattr(os, "getuid") else True
    return (stat.S_ISDIR(found.st_mode) and owner and not found.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            and writable(path))


def numba_cache_dir(package: str, user_cache: str, given: str = "", can_write: Callable[[str], bool] = writable,
                    private: Callable[[str], bool] = private_dir) -> str | None:
    """Where numba is to cache the compiled loops (``compiled.py`` modules, ``cache=True``), or None for its own
    choice: ``NUMBA_CACHE_DIR`` (``given``), beside the package (``__pycache__``), else the user's cache directory.
    Where none of them can be written (an image's read-only site-packages run by a user without a home, or under
    another uid than its cache directory's owner; a read-only root file system), numba fails at import ("no
    locator available"): then a directory of this user's in the temporary directory, so that every command runs
    (a new such directory compiles the loops once more)."""
    if (given and can_write(given)) or can_write(os.path.join(package, "__pycache__")) or can_write(user_cache):
        return None
    uid = os.getuid() if hasattr(os, "getuid") else 0
    shared = os.path.join(tempfile.gettempdir(), f"stream-eval-numba-{uid}")
    return shared if private(shared) else tempfile.mkdtemp(prefix="stream-eval-numba-")


def user_cache_dir() -> str:
    """numba's cache directory of the user (``appdirs``' choice for the platform)."""
    home = os.path.expanduser("~")
    if sys.platform == "darwin":
        return os.path.join(home, "Library", "Caches", "numba")
    if sys.platform.startswith("win"):
        return os.path.join(os.environ.get("LOCALAPPDATA") or home, "numba", "Cache")
    return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.join(home, ".cache")), "numba")


def _numba_cache() -> None:
    chosen = numba_cache_dir(os.path.dirname(os.path.abspath(__file__)), user_cache_dir(),
                             os.environ.get("NUMBA_CACHE_DIR", ""))
    if chosen is not None:
        os.environ["NUMBA_CACHE_DIR"] = chosen
        numba = sys.modules.get("numba")
        if numba is not None:  # (imported before us: its configuration is read already)
            numba.config.CACHE_DIR = chosen


_numba_cache()
