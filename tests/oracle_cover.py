"""``@oracle_for("nDCG", ...)`` marks a test that checks measure families against an independent reference
(trec_eval, ir_measures, the seeds' worked examples). tests/test_measures.py reads these marks from the test files'
source and fails for a registered family that no test covers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

_Test = TypeVar("_Test", bound=Callable[..., object])


def oracle_for(*families: str) -> Callable[[_Test], _Test]:
    def mark(test: _Test) -> _Test:
        test.oracle_for = families  # type: ignore[attr-defined]  # read by humans; the check reads the source
        return test

    return mark
