"""Event times and numpy arrays in JSON records (checkpoints, the regroup log, snapshots, windows shares)."""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np


def time_to_json(value: float) -> float | str:
    """Event time for JSON, which has no infinities: ``"inf"``/``"-inf"`` (``float()`` reads them back)."""
    return value if math.isfinite(value) else str(value)


def array_to_json(value: np.ndarray[Any, Any]) -> dict[str, Any]:
    """An array as JSON: its dtype, shape and bytes (base64); :func:`array_from_json` gives it back.

    >>> array_from_json(array_to_json(np.arange(6, dtype=np.int64).reshape(2, 3))).tolist()
    [[0, 1, 2], [3, 4, 5]]
    """
    data = np.ascontiguousarray(value)
    return {"dtype": data.dtype.str, "shape": list(data.shape), "b": base64.b64encode(data.tobytes()).decode()}


def array_from_json(value: dict[str, Any]) -> np.ndarray[Any, Any]:
    """The array :func:`array_to_json` wrote (a copy, writable)."""
    raw = base64.b64decode(value["b"])
    return np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
