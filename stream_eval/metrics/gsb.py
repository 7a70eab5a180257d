"""GSB (good / same / bad): side-by-side comparison of a treatment against a control.

``score = (good - bad) / (good + same + bad)``. Verdicts come from three sources (docs/contract.md §3): human
``judgment`` events, the ``metric`` of the two arms on the same query, and ``interleaving`` credit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

VERDICTS = ("good", "same", "bad")
SOURCES = ("judgment", "metric", "interleaving")


@dataclasses.dataclass(slots=True)
class GsbCounts:
    """Counts of verdicts; adds and subtracts like any aggregate.

    The seed example: q1 good, q2 same, q3 and q4 bad.

    >>> counts = GsbCounts()
    >>> for verdict in ["good", "same", "bad", "bad"]:
    ...     counts.add(verdict)
    >>> counts.score
    -0.25
    """

    good: int = 0
    same: int = 0
    bad: int = 0

    def add(self, verdict: str, times: int = 1) -> None:
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
        setattr(self, verdict, getattr(self, verdict) + times)

    @property
    def total(self) -> int:
        return self.good + self.same + self.bad

    @property
    def score(self) -> float:
        """(good - bad) / (good + same + bad); NaN with no verdict."""
        return (self.good - self.bad) / self.total if self.total else math.nan

    def __add__(self, other: GsbCounts) -> GsbCounts:
        return GsbCounts(self.good + other.good, self.same + other.same, self.bad + other.bad)

    def __sub__(self, other: GsbCounts) -> GsbCounts:
        return GsbCounts(self.good - other.good, self.same - other.same, self.bad - other.bad)


def metric_verdict(treatment: float, control: float, epsilon: float = 0.0) -> str:
    """``good`` if the treatment's metric is higher by more than ``epsilon``, ``bad`` if lower, else ``same``.

    >>> metric_verdict(0.8, 0.7), metric_verdict(0.7, 0.8), metric_verdict(0.70, 0.70)
    ('good', 'bad', 'same')
    """
    return VERDICTS[int(metric_verdicts(np.array([treatment]), np.array([control]), epsilon)[0])]


def metric_verdicts(treatment: npt.NDArray[np.float64], control: npt.NDArray[np.float64],
                    epsilon: float = 0.0) -> npt.NDArray[np.int64]:
    """:func:`metric_verdict` of many pairs, as indexes into :data:`VERDICTS` (0 good, 1 same, 2 bad)."""
    good = treatment - control > epsilon
    bad = ~good & (control - treatment > epsilon)
    return np.where(good, 0, np.where(bad, 2, 1)).astype(np.int64)


def interleaving_credit(teams: Sequence[str], relevant_positions: Sequence[int]) -> dict[str, int]:
    """Relevant served items credited to each team (``relevant_positions`` are 1-based).

    >>> interleaving_credit(["A", "B", "A", "B"], [1, 3, 4])
    {'A': 2, 'B': 1}
    """
    credit: dict[str, int] = {}
    for position in relevant_positions:
        team = teams[position - 1]
        credit[team] = credit.get(team, 0) + 1
    return credit


def interleaving_verdict(credit: Mapping[str, int], control: str, treatment: str) -> str | None:
    """More relevant items credited to the treatment = good, fewer = bad, equal and non-zero = same.

    ``None`` when neither arm got credit (no verdict).

    >>> interleaving_verdict({"A": 2, "B": 1}, control="A", treatment="B")
    'bad'
    """
    t, c = credit.get(treatment, 0), credit.get(control, 0)
    if t == c:
        return "same" if t > 0 else None
    return "good" if t > c else "bad"
