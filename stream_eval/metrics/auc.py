"""Session AUC and GAUC (Zhou et al., 2018, "Deep Interest Network", group AUC).

AUC = P(score of a positive > score of a negative), ties counting 1/2: the Mann-Whitney statistic
from mid-ranks. :func:`session_auc` does it for many sessions at once with one lexsort, so that
GAUC over hundreds of thousands of sessions costs a few numpy passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


def session_auc(session: Ints, scores: Floats, labels: Bools, n_sessions: int) -> tuple[Floats, Ints, Ints]:
    """Per-session AUC with ties counted 1/2; NaN for sessions with a single class.

    Returns ``(auc, positives, negatives)``, each of length ``n_sessions``.

    >>> import numpy as np
    >>> auc, pos, neg = session_auc(np.array([0, 0, 0, 1, 1]), np.array([0.9, 0.5, 0.5, 1.0, 2.0]),
    ...                             np.array([True, True, False, False, False]), 2)
    >>> auc.tolist(), pos.tolist(), neg.tolist()
    ([0.75, nan], [2, 0], [1, 2])
    """
    session = np.asarray(session, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.bool_)
    order = np.lexsort((scores, session))
    s_session, s_scores, s_labels = session[order], scores[order], labels[order]
    n = s_session.shape[0]
    sizes = np.bincount(s_session, minlength=n_sessions)
    starts = np.zeros(n_sessions + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    # Tie groups: runs of equal (session, score); each member gets the group's mid-rank within its session.
    new_group = np.ones(n, dtype=np.bool_)
    new_group[1:] = (s_session[1:] != s_session[:-1]) | (s_scores[1:] != s_scores[:-1])
    group = np.cumsum(new_group) - 1
    group_first = np.flatnonzero(new_group)
    group_last = np.append(group_first[1:], n) - 1
    midrank = (group_first + group_last)[group] / 2.0 - starts[s_session] + 1.0
    positives = np.bincount(s_session, weights=s_labels, minlength=n_sessions).astype(np.int64)
    negatives = sizes - positives
    rank_sum = np.bincount(s_session[s_labels], weights=midrank[s_labels], minlength=n_sessions)
    pairs = positives * negatives
    auc = np.full(n_sessions, np.nan)
    both = pairs > 0
    auc[both] = (rank_sum[both] - positives[both] * (positives[both] + 1) / 2.0) / pairs[both]
    return auc, positives, negatives


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
    return _WEIGHTS[weight](positives, negatives)


_WEIGHTS = {
    "impressions": lambda p, n: (p + n).astype(np.float64),
    "clicks": lambda p, n: p.astype(np.float64),
    "uniform": lambda p, n: np.ones(p.shape[0]),
}
