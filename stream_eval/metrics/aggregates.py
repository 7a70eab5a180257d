"""Mergeable aggregates: weighted moments of several metrics at once.

A :class:`Moments` holds, per metric, the count, the sum of weights and of squared weights, and the
weighted sums of values and squared values. It is a monoid under ``+`` (partitions, workers and windows
combine exactly as one stream would) and ``-`` reverts a contribution, so a request whose value changes
as clicks arrive is updated by reverting its old values and adding its new ones (the River idiom).
NaN values are "no value" and leave the aggregate untouched.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


class Moments:
    """Weighted count, sum and sum of squares of ``size`` metrics.

    >>> import numpy as np
    >>> m = Moments(2)
    >>> m.update(np.array([1.0, np.nan])); m.update(np.array([0.5, 1.0]))
    >>> m.mean().tolist(), m.count.tolist()
    ([0.75, 1.0], [2, 1])
    >>> m.revert(np.array([0.5, 1.0])); m.mean().tolist()
    [1.0, nan]
    """

    __slots__ = ("count", "weight", "weight_sq", "total", "total_sq")

    def __init__(self, size: int) -> None:
        self.count: Ints = np.zeros(size, dtype=np.int64)
        self.weight: Floats = np.zeros(size)
        self.weight_sq: Floats = np.zeros(size)
        self.total: Floats = np.zeros(size)
        self.total_sq: Floats = np.zeros(size)

    @property
    def size(self) -> int:
        return int(self.count.shape[0])

    def _apply(self, values: Floats, weight: float, sign: int) -> None:
        present = ~np.isnan(values)
        v = np.where(present, values, 0.0)
        w = present * float(weight)
        self.count += sign * present
        self.weight += sign * w
        self.weight_sq += sign * w * weight
        self.total += sign * w * v
        self.total_sq += sign * w * v * v

    def update(self, values: Floats, weight: float = 1.0) -> None:
        """Add one observation of every metric (NaN entries are skipped)."""
        self._apply(np.asarray(values, dtype=np.float64), weight, 1)

    def revert(self, values: Floats, weight: float = 1.0) -> None:
        """Undo :meth:`update` with the same arguments."""
        self._apply(np.asarray(values, dtype=np.float64), weight, -1)

    def update_many(self, values: Floats, weights: Floats | None = None) -> None:
        """Add many observations: ``values`` has one row per observation."""
        values = np.asarray(values, dtype=np.float64).reshape(-1, self.size)
        present = ~np.isnan(values)
        w = present * (1.0 if weights is None else np.asarray(weights, dtype=np.float64)[:, None])
        v = np.where(present, values, 0.0)
        self.count += present.sum(axis=0)
        self.weight += w.sum(axis=0)
        self.weight_sq += (w * w).sum(axis=0) if weights is not None else present.sum(axis=0)
        self.total += (w * v).sum(axis=0)
        self.total_sq += (w * v * v).sum(axis=0)

    def _fields(self) -> tuple[npt.NDArray[np.float64], ...]:
        return (self.count, self.weight, self.weight_sq, self.total, self.total_sq)  # type: ignore[return-value]  # count is int64; + and - treat all alike

    def __iadd__(self, other: Moments) -> Moments:
        for mine, theirs in zip(self._fields(), other._fields(), strict=True):
            mine += theirs
        return self

    def __isub__(self, other: Moments) -> Moments:
        for mine, theirs in zip(self._fields(), other._fields(), strict=True):
            mine -= theirs
        return self

    def __add__(self, other: Moments) -> Moments:
        out = self.copy()
        out += other
        return out

    def __sub__(self, other: Moments) -> Moments:
        out = self.copy()
        out -= other
        return out

    def copy(self) -> Moments:
        out = Moments(self.size)
        for mine, theirs in zip(out._fields(), self._fields(), strict=True):
            mine[:] = theirs
        return out

    def mean(self) -> Floats:
        """Weighted mean of each metric; NaN where there is no observation."""
        out = np.full(self.size, np.nan)
        np.divide(self.total, self.weight, out=out, where=self.count > 0)
        return out

    def effective_count(self) -> Floats:
        """Kish's effective sample size (the count itself when all weights are 1)."""
        out = np.zeros(self.size)
        np.divide(self.weight * self.weight, self.weight_sq, out=out, where=self.weight_sq > 0)
        return out

    def variance(self) -> Floats:
        """Unbiased (for unit weights) variance of each metric; NaN with fewer than two observations."""
        n_eff = self.effective_count()
        mean = self.mean()
        out = np.full(self.size, np.nan)
        ok = (self.count > 1) & (n_eff > 1)
        spread = np.maximum(self.total_sq[ok] / self.weight[ok] - mean[ok] ** 2, 0.0)
        out[ok] = spread * n_eff[ok] / (n_eff[ok] - 1.0)
        return out

    def state(self) -> list[list[float]]:
        """Plain lists, for checkpoints and tests."""
        return [field.tolist() for field in self._fields()]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Moments) and all(
            np.array_equal(a, b) for a, b in zip(self._fields(), other._fields(), strict=True)
        )

    def __repr__(self) -> str:
        return f"Moments(count={self.count.tolist()}, mean={self.mean().tolist()})"


def grouped_moments(group: Ints, values: Floats, n_groups: int, weights: Floats | None = None) -> list[Moments]:
    """One :class:`Moments` per group from a matrix of rows and each row's group (vectorised)."""
    values = np.asarray(values, dtype=np.float64)
    size = values.shape[1]
    present = ~np.isnan(values)
    v = np.where(present, values, 0.0)
    w = present * (1.0 if weights is None else np.asarray(weights, dtype=np.float64)[:, None])
    out = [Moments(size) for _ in range(n_groups)]
    for j in np.flatnonzero(present.any(axis=0)).tolist():  # (a column without a value adds nothing)
        count = np.bincount(group, weights=present[:, j], minlength=n_groups)
        weight = np.bincount(group, weights=w[:, j], minlength=n_groups)
        weight_sq = np.bincount(group, weights=w[:, j] * w[:, j], minlength=n_groups)
        total = np.bincount(group, weights=w[:, j] * v[:, j], minlength=n_groups)
        total_sq = np.bincount(group, weights=w[:, j] * v[:, j] * v[:, j], minlength=n_groups)
        for g in range(n_groups):
            m = out[g]
            m.count[j] = int(count[g])
            m.weight[j], m.weight_sq[j], m.total[j], m.total_sq[j] = weight[g], weight_sq[g], total[g], total_sq[g]
    return out
