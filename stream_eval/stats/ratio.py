"""Mergeable sufficient statistics of an arm and the cluster-robust (delta-method) variance of its mean.

Inference is over randomisation units (users, sessions), never over requests: requests of one unit are
correlated, and treating them as independent understates the variance (see ``bench/validity.py``). Every
metric is a ratio metric: unit ``i`` contributes ``y_i`` (the sum of its per-request values) and ``n_i``
(how many of its requests have a value), and the arm's mean is ``sum y / sum n``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from stream_eval.stats.special import Floats


@dataclass(frozen=True, slots=True, eq=False)
class PreSums:
    """Sufficient statistics of the pre-period covariate of an arm's units (CUPED, ``stats/cuped.py``).

    Unit i has, per metric, ``x_i`` = the sum of its pre-period values and ``q_i`` = how many pre-period values
    it has (0 and 0 for a unit without pre-period data), beside its post-period ``y_i`` and ``n_i`` of
    :class:`ArmSums`. The sums run over the units that count for the metric (``n_i > 0``). Every field is a float64
    array of shape (K,); they merge by ``+`` like :class:`ArmSums`.
    """

    units: Floats  # units with q_i > 0
    x: Floats  # sum_i x_i
    q: Floats  # sum_i q_i
    xx: Floats  # sum_i x_i**2
    qq: Floats  # sum_i q_i**2
    xq: Floats  # sum_i x_i*q_i
    yx: Floats  # sum_i y_i*x_i
    yq: Floats  # sum_i y_i*q_i
    nx: Floats  # sum_i n_i*x_i
    nq: Floats  # sum_i n_i*q_i

    @classmethod
    def zeros(cls, k: int) -> PreSums:
        return cls(*(np.zeros(k) for _ in range(10)))

    def _values(self) -> tuple[Floats, ...]:
        values: tuple[Floats, ...] = _PRE_VALUES(self)  # (the fields, in order)
        return values

    def __add__(self, other: PreSums) -> PreSums:
        return PreSums(*(a + b for a, b in zip(self._values(), other._values(), strict=True)))

    def __sub__(self, other: PreSums) -> PreSums:
        return PreSums(*(a - b for a, b in zip(self._values(), other._values(), strict=True)))


@dataclass(frozen=True, slots=True, eq=False)
class ArmSums:
    """Sufficient statistics of one arm over its randomisation units, for K metrics at once.

    Every field is a float64 array of shape (K,) (any shape works elementwise, which the benchmark uses for
    many experiments at once). Unit i of the arm has, per metric, ``y_i`` = sum of the metric's per-request
    values and ``n_i`` = number of requests with a value (a ratio metric: mean = sum y / sum n). Arms merge by
    ``+`` over disjoint unit sets (partitions, workers, windows) and ``-`` reverts a merged part.
    ``==`` is exact equality of every field.

    >>> import numpy as np
    >>> a = ArmSums.of_units(np.array([[2.0, 1.0], [1.0, 0.0]]), np.array([[3.0, 1.0], [1.0, 0.0]]))
    >>> a.units.tolist(), a.y.tolist(), a.n.tolist(), a.yn.tolist()
    ([2.0, 1.0], [3.0, 1.0], [4.0, 1.0], [7.0, 1.0])
    >>> b = ArmSums.of_units(np.array([[0.5, 0.5]]), np.array([[1.0, 1.0]]))
    >>> (a + b).units.tolist(), (a + b - b) == a
    ([3.0, 2.0], True)
    """

    units: Floats  # number of units with n_i > 0 (per metric)
    y: Floats  # sum_i y_i
    n: Floats  # sum_i n_i
    yy: Floats  # sum_i y_i**2
    nn: Floats  # sum_i n_i**2
    yn: Floats  # sum_i y_i*n_i
    pre: PreSums | None = None  # the pre-period covariate's (CUPED); None: none kept (zeros)

    @classmethod
    def of_units(cls, y: npt.ArrayLike, n: npt.ArrayLike, x: npt.ArrayLike | None = None,
                 q: npt.ArrayLike | None = None) -> ArmSums:
        """From per-unit sums ``y`` and counts ``n`` of shape (U, K); a unit with ``n == 0`` for a metric does
        not count for it (its ``y`` is ignored, even NaN). ``x``, ``q``: the units' pre-period sums and counts
        (CUPED; :class:`PreSums`), same shape."""
        return cls.from_terms(unit_terms(y, n, x, q).sum(axis=0))

    @classmethod
    def from_terms(cls, terms: Floats) -> ArmSums:
        """From the sums of :func:`unit_terms` over an arm's units: shape (6, K), or (16, K) with the pre-period's."""
        pre = PreSums(*terms[6:]) if terms.shape[0] > 6 else None
        return cls.from_values(list(terms[:6]), pre)

    @classmethod
    def zeros(cls, k: int) -> ArmSums:
        """The empty arm (the identity of ``+``) for ``k`` metrics."""
        return cls.from_values([np.zeros(k) for _ in range(6)])

    @classmethod
    def from_values(cls, values: Sequence[Floats], pre: PreSums | None = None) -> ArmSums:
        """From the six post-period sums in field order (as :meth:`_values` gives them) and ``pre``."""
        units, y, n, yy, nn, yn = values
        return cls(units, y, n, yy, nn, yn, pre)

    def _values(self) -> tuple[Floats, ...]:
        """The six post-period sums (not :attr:`pre`)."""
        values: tuple[Floats, ...] = _ARM_VALUES(self)  # (the fields but pre, in order)
        return values

    @classmethod
    def total(cls, parts: Sequence[ArmSums]) -> ArmSums:
        """``parts[0] + parts[1] + ...`` (at least one), bit for bit, in one numpy reduction per kind of sum: the
        sums of an arm's shards at a look (``engine/ab.py``)."""
        if len(parts) == 1:
            return parts[0]
        pres = [part.pre._values() for part in parts if part.pre is not None]
        pre = None if not pres else pres[0] if len(pres) == 1 else np.add.reduce(np.array(pres), axis=0)
        values = np.add.reduce(np.array([part._values() for part in parts]), axis=0)
        return cls.from_values(list(values), None if pre is None else PreSums(*pre))

    def pre_or_zeros(self) -> PreSums:
        """:attr:`pre`, or zeros when none is kept."""
        return self.pre if self.pre is not None else PreSums(*(np.zeros(np.shape(self.y)) for _ in range(10)))

    def with_pre(self, pre: PreSums | None) -> ArmSums:
        return replace(self, pre=pre)

    def __add__(self, other: ArmSums) -> ArmSums:
        pre = self.pre if other.pre is None else other.pre if self.pre is None else self.pre + other.pre
        return ArmSums.from_values([a + b for a, b in zip(self._values(), other._values(), strict=True)], pre)

    def __sub__(self, other: ArmSums) -> ArmSums:
        pre = self.pre if other.pre is None else (self.pre_or_zeros() - other.pre)
        return ArmSums.from_values([a - b for a, b in zip(self._values(), other._values(), strict=True)], pre)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ArmSums) or (self.pre is None) != (other.pre is None):
            return False
        pairs = list(zip(self._values(), other._values(), strict=True))
        if self.pre is not None and other.pre is not None:
            pairs += list(zip(self.pre._values(), other.pre._values(), strict=True))
        return all(np.array_equal(a, b, equal_nan=True) for a, b in pairs)

    __hash__ = None  # type: ignore[assignment]  # mutable arrays inside: not hashable, like a numpy array


def unit_terms(y: npt.ArrayLike, n: npt.ArrayLike, x: npt.ArrayLike | None = None,
               q: npt.ArrayLike | None = None) -> Floats:
    """Per unit, the terms whose sums over an arm's units are its :class:`ArmSums` (:meth:`ArmSums.from_terms`): shape
    (U, 6, K) in the order of :class:`ArmSums`' fields, or (U, 16, K) with ``x`` and ``q`` (the pre-period's, in the
    order of :class:`PreSums`' fields, after them). A unit with ``n == 0`` for a metric adds nothing to it; one with
    ``q == 0`` nothing to the pre-period's sums.

    >>> import numpy as np
    >>> unit_terms(np.array([[2.0, 1.0]]), np.array([[3.0, 0.0]]))[0].tolist()
    [[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 0.0], [9.0, 0.0], [6.0, 0.0]]
    """
    y_arr = np.asarray(y, dtype=np.float64)
    n_arr = np.asarray(n, dtype=np.float64)
    if y_arr.ndim != 2 or y_arr.shape != n_arr.shape:
        raise ValueError(f"y and n must both have shape (units, metrics), got {y_arr.shape} and {n_arr.shape}")
    present = n_arr > 0.0
    y_arr = np.where(present, y_arr, 0.0)
    n_arr = np.where(present, n_arr, 0.0)
    terms = [present.astype(np.float64), y_arr, n_arr, y_arr * y_arr, n_arr * n_arr, y_arr * n_arr]
    if x is not None and q is not None:
        q_arr = np.where(present, np.asarray(q, dtype=np.float64), 0.0)
        x_arr = np.where(present & (q_arr > 0.0), np.asarray(x, dtype=np.float64), 0.0)
        terms += [(q_arr > 0.0).astype(np.float64), x_arr, q_arr, x_arr * x_arr, q_arr * q_arr, x_arr * q_arr,
                  y_arr * x_arr, y_arr * q_arr, n_arr * x_arr, n_arr * q_arr]
    return np.stack(terms, axis=1)


def group_sums(terms: Floats, group: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                                                                     Floats]:
    """:func:`unit_terms` (U, Q, K) summed per ``group`` of each unit, the units of a group in their order (one
    ``np.add.reduceat``: the same sums for the same units in the same order, though not always bit for bit those of
    :meth:`ArmSums.of_units`): the groups present, ascending, their units, and their sums (G, Q, K).

    >>> import numpy as np
    >>> groups, units, sums = group_sums(np.arange(8.0).reshape(4, 2, 1), np.array([3, 1, 3, 1]))
    >>> groups.tolist(), units.tolist(), sums[:, :, 0].tolist()
    ([1, 3], [2, 2], [[8.0, 10.0], [4.0, 6.0]])
    """
    order = np.argsort(group, kind="stable")
    ordered = group[order]
    if not len(order):
        return ordered, ordered, np.zeros((0, *terms.shape[1:]))
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    units = np.diff(starts, append=len(order))
    return ordered[starts], units, np.add.reduceat(terms[order], starts, axis=0)


def ratio_mean_variance(s: ArmSums) -> tuple[Floats, Floats]:
    """``mean = y / n`` and the delta-method (cluster-robust) variance of that mean; NaN with < 2 units.

    With ``u`` units, ``r = y / n`` and the residuals ``e_i = y_i - r n_i`` (which sum to 0)::

        var(mean) = sum e_i^2 / ((u - 1) u nbar^2),   nbar = n / u,   sum e_i^2 = yy - 2 r yn + r^2 nn

    This is gbstats' ``RatioStatistic.variance / n`` exactly (Deng, Knoblich & Lu 2018, "Applying the delta
    method in metric analytics"): ``var_m / mu_d^2 - 2 cov mu_m / mu_d^3 + mu_m^2 var_d / mu_d^4`` with the
    unbiased (``u - 1``) sample variances and covariance of the per-unit ``y_i`` and ``n_i``, divided by
    ``u``; expanding it gives the line above. With one request per unit it is the sample variance of the
    mean. Rounding can make it slightly negative when it is 0: it is clipped at 0.

    >>> import numpy as np
    >>> s = ArmSums.of_units(np.array([[1.0], [3.0], [2.0]]), np.array([[2.0], [2.0], [4.0]]))
    >>> mean, var = ratio_mean_variance(s)  # residuals -0.5, 1.5, -1: 3.5 * 3 / (2 * 8**2)
    >>> mean.tolist(), var.round(6).tolist()
    ([0.75], [0.082031])
    """
    units = np.asarray(s.units, dtype=np.float64)
    ok_mean = s.n > 0.0
    mean = np.divide(s.y, s.n, out=np.full(np.shape(s.y), np.nan), where=ok_mean)
    ok = ok_mean & (units >= 2.0)
    r = np.where(ok, mean, 0.0)
    residual_sq = np.maximum(s.yy - 2.0 * r * s.yn + r * r * s.nn, 0.0)
    safe_units = np.where(ok, units, 2.0)
    safe_n = np.where(ok, s.n, 1.0)
    variance = np.where(ok, residual_sq * safe_units / ((safe_units - 1.0) * safe_n * safe_n), np.nan)
    return mean, variance


#: The fields of each kind of sums, in order (``_values``).
_PRE_VALUES = attrgetter(*(f.name for f in fields(PreSums)))
_ARM_VALUES = attrgetter(*(f.name for f in fields(ArmSums) if f.name != "pre"))
