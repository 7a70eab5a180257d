"""Bounded label values: at most ``max_label_values`` distinct values per label, the rest ``__other__``.

Label values come from events (experiment, arm; and the segment fields of a ranking's ``attributes``); without a
bound a typo or an attack creates unbounded Prometheus series and report groups. Overflow is counted per label
(segments: the requests of ``__other__``, per field).

The values kept are the first ones met. On one engine (replay) that is the input's order; a worker's engines share
one table. Where a label has more distinct values than its bound, workers that see the input in another order may
keep other values than a replay. Segment fields have a bound four times the values they show (``segment_cap``),
and which ones are shown is decided from the totals when they are read, so that the order matters only beyond it;
or their values are listed (``segment_values``), and order never matters (README, "Segments").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

OTHER = "__other__"
#: The segment value of a ranking without the segment field in its ``attributes`` (never folded into ``__other__``).
MISSING = "__missing__"


def shown_segment_values(traffic: Mapping[str, float], limit: int | None) -> frozenset[str]:
    """The values of a segment field that are shown, from each value's traffic (requests, or units): the ``limit``
    with the most, ties by name (``None``: every one, for a field whose values are listed), and ``__missing__``;
    every other value is shown as ``__other__``. A function of the totals alone, not of the order they came in.

    >>> sorted(shown_segment_values({"ios": 5, "web": 9, "tv": 5, "__missing__": 1, "__other__": 7}, 2))
    ['__missing__', 'ios', 'web']
    """
    ranked = sorted((v for v in traffic if v != OTHER and v != MISSING), key=lambda v: (-traffic[v], v))
    return frozenset([*(ranked if limit is None else ranked[:limit]), MISSING])


class LabelBounds:
    """First come, first kept: the first ``limit`` distinct values of each label pass, later ones fold.

    >>> bounds = LabelBounds(2)
    >>> [bounds.value("arm", a) for a in ["a", "b", "c", "a"]]
    ['a', 'b', '__other__', 'a']
    >>> bounds.overflow["arm"]
    1
    """

    __slots__ = ("limit", "_known", "overflow", "_segments")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._known: dict[str, set[str]] = {}
        self.overflow: Counter[str] = Counter()
        self._segments: dict[str, set[str]] = {}

    def segment(self, field: str, value: str, limit: int, allowed: frozenset[str] | None = None) -> str:
        """The value kept for segment ``field``: one of ``allowed`` when the field's values are listed, else one of the
        first ``limit`` met (``segment_cap``); otherwise ``__other__``. (The requests folded are counted by the
        engine: its ``__other__`` segment groups.)

        >>> bounds = LabelBounds(100)
        >>> [bounds.segment("platform", p, 2) for p in ["ios", "web", "tv", "ios"]]
        ['ios', 'web', '__other__', 'ios']
        >>> [bounds.segment("locale", p, 2, frozenset({"de", "fr"})) for p in ["en", "fr", "de"]]
        ['__other__', 'fr', 'de']
        """
        if allowed is not None:
            return value if value in allowed else OTHER
        known = self._segments.get(field)
        if known is None:
            known = self._segments[field] = set()
        if value in known:
            return value
        if len(known) < limit:
            known.add(value)
            return value
        return OTHER

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
