"""alpha-nDCG (Clarke et al., 2008, "Novelty and diversity in information retrieval evaluation").

The gain of the item at position i is ``sum over its subtopics s of J_i * (1 - alpha) ** N_s`` where
``N_s`` counts the relevant items above i that have s and ``J_i`` is 1 when the item is relevant. The
discount is ``log2(i + 1)``; the ideal list is built greedily (at each rank, the item with the largest
gain given the items already placed; ties go to the earlier served item). Only served items carry
subtopics, so the ideal is taken over the served list.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence


def subtopic_counts_above(
    subtopics: Sequence[Sequence[str]], relevant: Sequence[bool], position: int
) -> dict[str, int]:
    """``N_s`` for every subtopic s of the item at 1-based ``position``.

    The seed example: doc_f (position 6) has subtopics before and after; above it, before appears in
    a, c, e and after in b, c (doc_a's list is written ``["before", "mid""after"]`` in the seed, which
    Python reads as ``["before", "midafter"]``).

    >>> docs = [["before", "midafter"], ["mid", "after"], ["before", "after"],
    ...         ["no_of_time", "mid"], ["before", "no_of_time"], ["before", "after"]]
    >>> subtopic_counts_above(docs, [True] * 6, 6)
    {'before': 3, 'after': 2}
    """
    seen: Counter[str] = Counter()
    for topics, is_relevant in zip(subtopics[: position - 1], relevant[: position - 1], strict=True):
        if is_relevant:
            seen.update(set(topics))
    return {s: seen[s] for s in dict.fromkeys(subtopics[position - 1])}


def _distinct(topics: Iterable[str]) -> tuple[str, ...]:
    """Subtopics once each, in the order given: sums over them never depend on the hash seed."""
    return tuple(dict.fromkeys(topics))


def _gain(topics: tuple[str, ...], seen: Counter[str], keep: float) -> float:
    return math.fsum(keep ** seen[s] for s in topics)


def alpha_dcg(subtopics: Sequence[Sequence[str]], relevant: Sequence[bool], k: int, alpha: float) -> float:
    """alpha-DCG@k of the served order."""
    keep = 1.0 - alpha
    seen: Counter[str] = Counter()
    total = 0.0
    for i, (topics, is_relevant) in enumerate(zip(subtopics[:k], relevant[:k], strict=True)):
        if is_relevant:
            distinct = _distinct(topics)
            total += _gain(distinct, seen, keep) / math.log2(i + 2)
            seen.update(distinct)
    return total


def ideal_alpha_dcg(subtopics: Sequence[Sequence[str]], relevant: Sequence[bool], k: int, alpha: float) -> float:
    """alpha-DCG@k of the greedy ideal ordering of the relevant served items."""
    keep = 1.0 - alpha
    candidates = [_distinct(t) for t, r in zip(subtopics, relevant, strict=True) if r and t]
    seen: Counter[str] = Counter()
    total = 0.0
    for rank in range(min(k, len(candidates))):
        best = max(range(len(candidates)), key=lambda c: (_gain(candidates[c], seen, keep), -c))
        total += _gain(candidates[best], seen, keep) / math.log2(rank + 2)
        seen.update(candidates.pop(best))
    return total


def alpha_ndcg(subtopics: Sequence[Sequence[str]], relevant: Sequence[bool], k: int, alpha: float = 0.5) -> float:
    """alpha-nDCG@k = alpha-DCG@k / ideal alpha-DCG@k (0 when the ideal is 0).

    The exact ideal is NP-hard; the greedy one can fall short of the served list itself when alpha is
    large, so the ideal used is the better of the greedy list and the served list (the served list is a
    feasible ordering): the value never exceeds 1.

    >>> alpha_ndcg([["a"], ["a"], ["b"]], [True, True, True], k=3, alpha=0.5)  # doctest: +ELLIPSIS
    0.965...
    """
    served = alpha_dcg(subtopics, relevant, k, alpha)
    ideal = max(ideal_alpha_dcg(subtopics, relevant, k, alpha), served)
    return served / ideal if ideal > 0 else 0.0
