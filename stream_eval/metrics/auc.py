"""Session AUC and GAUC (Zhou et al., 2018, "Deep Interest Network", group AUC).

AUC = P(score of a positive > score of a negative), ties counting 1/2: the Mann-Whitney statistic
from mid-ranks. :func:`session_auc` does it for many sessions at once with one lexsort, so that
GAUC over hundreds of thousands of sessions costs a few numpy passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


def session_auc(session: Ints, scores: Floats, labels: Bools, n_sessions: int) -> tuple[Floats, Ints, Ints]:
    """Per-session AUC with ties counted 1/2; NaN for sessions with a single class.

    Returns ``(auc, positives, negatives)``, each of length ``n_sessions``. Sessions are sorted as rows of
    a padded matrix (sessions of similar length share a matrix), which costs far less than one global
    sort of (session, score) pairs.

    >>> import numpy as np
    >>> auc, pos, neg = session_auc(np.array([0, 0, 0, 1, 1]), np.array([0.9, 0.5, 0.5, 1.0, 2.0]),
    ...                             np.array([True, True, False, False, False]), 2)
    >>> auc.tolist(), pos.tolist(), neg.tolist()
    ([0.75, nan], [2, 0], [1, 2])
    """
    session = np.asarray(session, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.bool_)
    if session.shape[0] > 1 and bool(np.any(session[1:] < session[:-1])):
        order = np.argsort(session, kind="stable")
        session, scores, labels = session[order], scores[order], labels[order]
    if n_sessions <= _BLOCK:
        return _sorted_session_auc(session, scores, labels, n_sessions)
    # Blocks of sessions: the temporaries of one block stay in cache (one call over 300k sessions was half as
    # fast per session as calls of 8k); each session lies whole in one block, so the values are the same.
    bounds = np.searchsorted(session, np.arange(0, n_sessions + _BLOCK, _BLOCK)).tolist()
    parts = []
    for block, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        first = block * _BLOCK
        parts.append(_sorted_session_auc(session[lo:hi] - first, scores[lo:hi], labels[lo:hi],
                                         min(_BLOCK, n_sessions - first)))
    auc, positives, negatives = (np.concatenate(arrays) for arrays in zip(*parts, strict=True))
    return auc, positives, negatives


#: Sessions per block of :func:`session_auc`.
_BLOCK = 8192


def _sorted_session_auc(session: Ints, scores: Floats, labels: Bools, n_sessions: int) -> tuple[Floats, Ints, Ints]:
    """:func:`session_auc` of items already in session order."""
    sizes = np.bincount(session, minlength=n_sessions)
    starts = np.zeros(n_sessions + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    column = np.arange(session.shape[0], dtype=np.int64) - starts[session]
    positives = np.bincount(session, weights=labels, minlength=n_sessions).astype(np.int64)
    negatives = sizes - positives
    auc = np.full(n_sessions, np.nan)
    both = (positives > 0) & (negatives > 0)
    width = np.left_shift(1, np.ceil(np.log2(np.maximum(sizes, 1))).astype(np.int64))
    for w in np.unique(width[both]).tolist():
        chosen = np.flatnonzero(both & (width == w))
        row = np.full(n_sessions, -1, dtype=np.int64)
        row[chosen] = np.arange(chosen.shape[0])
        member = row[session] >= 0
        cell = row[session[member]] * w + column[member]
        matrix = np.full((chosen.shape[0], w), np.inf)
        matrix.ravel()[cell] = scores[member]
        positive = np.zeros((chosen.shape[0], w), dtype=np.bool_)
        positive.ravel()[cell] = labels[member]
        p, n = positives[chosen], negatives[chosen]
        auc[chosen] = _wins(matrix, positive) / (p * n)
    return auc, positives, negatives


def _wins(matrix: Floats, positive: Bools) -> Floats:
    """Per row: pairs (positive, negative) with the positive scored higher, ties counting 1/2.

    Each row is sorted once; the sorted rows are then cut into runs of equal score, and every positive
    of a run beats the negatives of the earlier runs of its row and ties with the negatives of its own.
    Padding is ``+inf`` and neither positive nor negative. All sums are of half-integers: exact.
    """
    height, width = matrix.shape
    order = np.argsort(matrix, axis=1)
    value = np.take_along_axis(matrix, order, axis=1).ravel()
    is_positive = np.take_along_axis(positive, order, axis=1).ravel()
    is_negative = ~is_positive & (value != np.inf)
    run_start = np.ones(value.shape[0], dtype=np.bool_)
    run_start[1:] = value[1:] != value[:-1]
    run_start[::width] = True
    starts = np.flatnonzero(run_start)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1:] = value.shape[0]
    positives_upto = np.zeros(value.shape[0] + 1, dtype=np.int64)
    np.cumsum(is_positive, out=positives_upto[1:])
    negatives_upto = np.zeros(value.shape[0] + 1, dtype=np.int64)
    np.cumsum(is_negative, out=negatives_upto[1:])
    row_of_run = starts // width
    pos_run = positives_upto[ends] - positives_upto[starts]
    neg_before = negatives_upto[starts] - negatives_upto[row_of_run * width]
    neg_run = negatives_upto[ends] - negatives_upto[starts]
    won = pos_run * (neg_before + 0.5 * neg_run)
    wins: Floats = np.bincount(row_of_run, weights=won, minlength=height).astype(np.float64)
    return wins


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """AUC of one group; NaN when all labels are equal.

    >>> auc([0.9, 0.8, 0.7, 0.6], [True, False, True, False])
    0.75
    """
    values, _, _ = session_auc(np.zeros(len(scores), dtype=np.int64), np.asarray(scores, dtype=np.float64),
                               np.asarray(labels, dtype=np.bool_), 1)
    return float(values[0])


def gauc_weights(positives: Ints, negatives: Ints, weight: str) -> Floats:
    """Session weights for GAUC: ``impressions`` (items shown), ``clicks`` (positives) or ``uniform``."""
    weights: Floats = _WEIGHTS[weight](positives, negatives)
    return weights


_WEIGHTS: dict[str, Callable[[Ints, Ints], Floats]] = {
    "impressions": lambda p, n: (p + n).astype(np.float64),
    "clicks": lambda p, n: p.astype(np.float64),
    "uniform": lambda p, n: np.ones(p.shape[0]),
}
