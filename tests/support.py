"""Helpers shared by test modules (imported as ``support``: pytest puts this directory on ``sys.path``)."""

from __future__ import annotations

from typing import Any

import pytest

from stream_eval.config import Config


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


def AbstractTimeConfig(**settings: Any) -> Config:  # noqa: N802  # stands in for the Config class
    """A :class:`Config` for tests that model event time with small numbers (``ts`` = 0, 5, 100 s): the range of
    valid event times is widened to any time from 1800 to 5000, since by default a time before 2000-01-01 is
    invalid (SPEC §1). Tests of that default use :class:`Config` itself."""
    return Config(**{"min_ts": -5.4e9, "max_ts": 9.5e10, **settings})
