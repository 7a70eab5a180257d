"""Helpers shared by test modules (imported as ``support``: pytest puts this directory on ``sys.path``)."""

from __future__ import annotations

from typing import Any

import pytest


def approx(value: Any) -> Any:
    """``value`` with every float replaced by ``pytest.approx(rel=1e-12)``: sums of the same floats taken in
    another order (other partitions, other batches) agree to 1e-12, not bit for bit."""
    if isinstance(value, dict):
        return {k: approx(v) for k, v in value.items()}
    if isinstance(value, list):
        return [approx(v) for v in value]
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-12, abs=1e-12)
    return value
