"""Bounded label values: at most ``max_label_values`` distinct values per label, the rest ``__other__``.

Label values come from events (experiment, arm); without a bound a typo or an attack creates unbounded
Prometheus series and report groups. Overflow is counted per label.
"""

from __future__ import annotations

from collections import Counter

OTHER = "__other__"


class LabelBounds:
    """First come, first kept: the first ``limit`` distinct values of each label pass, later ones fold.

    >>> bounds = LabelBounds(2)
    >>> [bounds.value("arm", a) for a in ["a", "b", "c", "a"]]
    ['a', 'b', '__other__', 'a']
    >>> bounds.overflow["arm"]
    1
    """

    __slots__ = ("limit", "_known", "overflow")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._known: dict[str, set[str]] = {}
        self.overflow: Counter[str] = Counter()

    def value(self, label: str, value: str) -> str:
        known = self._known.get(label)
        if known is None:
            known = self._known[label] = set()
        if value in known:
            return value
        if len(known) < self.limit:
            known.add(value)
            return value
        self.overflow[label] += 1
        return OTHER
