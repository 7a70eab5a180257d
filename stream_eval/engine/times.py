"""Event time in JSON records (checkpoints, the regroup log, snapshots)."""

from __future__ import annotations

import math


def time_to_json(value: float) -> float | str:
    """Event time for JSON, which has no infinities: ``"inf"``/``"-inf"`` (``float()`` reads them back)."""
    return value if math.isfinite(value) else str(value)
