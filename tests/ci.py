"""Whether the tests run in CI, where a missing tool or broker is a failure, never a skip."""

from __future__ import annotations

import os


def in_ci() -> bool:
    """``CI`` set to 1, true or yes (any case), as CI services set it."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
