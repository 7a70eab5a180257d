"""What the HTML report shows beyond the JSON report, collected while a replay runs.

Everything comes from what replay hands out: the finalised requests' per-request values (``on_finalised``), the
A/B sections at every look (``ab_trace``) and the feedback delay histogram
(:class:`~stream_eval.engine.delays.FeedbackDelays`, attached to the engine before the first event). The state
is bounded: the time series coarsen their buckets to keep at most ``max_points`` of them, and at most
``max_queries`` (experiment, arm, query) cells are kept (the requests of further ones are counted, not shown).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from operator import attrgetter
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from stream_eval.config import Config
from stream_eval.engine.delays import FeedbackDelays
from stream_eval.engine.engine import Engine, FinalisedBatch

Floats = npt.NDArray[np.float64]
K = TypeVar("K", bound=Hashable)
_EXPERIMENT_ARM = attrgetter("experiment", "arm")
_TS = attrgetter("ts")
_QUERY_ID = attrgetter("query_id")

#: Bucket widths of the time series in seconds; each divides the next, so buckets merge exactly when they grow.
BUCKET_WIDTHS = (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 86400, 7 * 86400)
#: Time buckets kept per series at most (the width grows to keep the span of the data within them).
MAX_POINTS = 100
#: (experiment, arm, query) cells kept at most; the requests of further cells are counted in ``QueryMeans.left_out``.
MAX_QUERIES = 500_000
#: Upper bounds of the feedback delay buckets in seconds (then doubling), up to the attribution window.
DELAY_BOUNDS = (0.1, 0.2, 0.5, 1, 2, 3, 5, 7, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 420, 600, 900, 1200, 1800,
                2700, 3600, 5400, 7200, 10800, 14400, 21600, 28800, 43200, 86400)


class KeyedSums(Generic[K]):
    """Sums and counts of per-request values (NaN = no value) per key, with the requests of each key (arrays
    indexed by the key's row in ``index``).

    >>> sums = KeyedSums[str](2)
    >>> sums.add(["a", "b", "a"], np.array([[1.0, np.nan], [2.0, 4.0], [3.0, 5.0]]))
    >>> sums.means("a").tolist(), float(sums.requests[sums.index["a"]])
    ([2.0, 5.0], 2.0)
    """

    def __init__(self, width: int) -> None:
        self.width = width
        self.index: dict[K, int] = {}
        self.sums: Floats = np.zeros((0, width))
        self.counts: Floats = np.zeros((0, width))
        self.requests: Floats = np.zeros(0)

    def add(self, keys: Sequence[K], values: Floats) -> None:
        """Add one row of ``values`` per key."""
        present = ~np.isnan(values)
        self.add_sums(keys, np.where(present, values, 0.0), present.astype(np.float64), np.ones(len(keys)))

    def add_sums(self, keys: Sequence[K], sums: Floats, counts: Floats, requests: Floats) -> None:
        """Add sums, value counts and request counts already summed per row."""
        index = self.index
        rows = np.fromiter((index.setdefault(key, len(index)) for key in keys), dtype=np.int64, count=len(keys))
        if len(index) > self.requests.shape[0]:
            grow = max(len(index), 2 * self.requests.shape[0], 64) - self.requests.shape[0]
            self.sums = np.concatenate([self.sums, np.zeros((grow, self.width))])
            self.counts = np.concatenate([self.counts, np.zeros((grow, self.width))])
            self.requests = np.concatenate([self.requests, np.zeros(grow)])
        touched, inverse = np.unique(rows, return_inverse=True)
        n = len(touched)
        for table, part in ((self.sums, sums), (self.counts, counts)):
            table[touched] += np.stack([np.bincount(inverse, weights=part[:, j], minlength=n)
                                        for j in range(self.width)], axis=1)
        self.requests[touched] += np.bincount(inverse, weights=requests, minlength=n)

    def means(self, key: K) -> Floats:
        """The means of ``key`` (NaN where it has no value)."""
        row = self.index[key]
        return ratio(self.sums[row], self.counts[row])


def ratio(sums: Floats, counts: Floats) -> Floats:
    """``sums / counts``, NaN where a count is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / counts


TimeKey = tuple[str, str, int]  # experiment, arm, bucket (serve time // width)
QueryKey = tuple[str, str, str]  # experiment, arm, query id


class Timeline:
    """Per-request values per (experiment, arm) and bucket of serve time, in at most ``max_points`` buckets."""

    def __init__(self, size: int, max_points: int = MAX_POINTS) -> None:
        self.size = size
        self.max_points = max_points
        self.width: int = BUCKET_WIDTHS[0]
        self.first = math.inf  # the earliest and latest serve times seen
        self.last = -math.inf
        self.sums = KeyedSums[TimeKey](size)

    def add(self, groups: Sequence[tuple[str, str]], serve: Floats, values: Floats) -> None:
        if not len(groups):
            return
        self.first = min(self.first, float(serve.min()))
        self.last = max(self.last, float(serve.max()))
        while math.floor(self.last / self.width) - math.floor(self.first / self.width) >= self.max_points:
            self._coarsen()
        buckets = np.floor(serve / self.width).astype(np.int64).tolist()
        self.sums.add([(e, a, b) for (e, a), b in zip(groups, buckets, strict=True)], values)

    def _coarsen(self) -> None:
        wider = next((w for w in BUCKET_WIDTHS if w > self.width), 2 * self.width)
        ratio = wider // self.width
        old = self.sums
        self.sums, self.width = KeyedSums[TimeKey](self.size), wider
        rows = list(old.index.values())
        self.sums.add_sums([(e, a, b // ratio) for e, a, b in old.index], old.sums[rows], old.counts[rows],
                           old.requests[rows])

    def series(self, experiment: str, arm: str) -> tuple[list[float], Floats, Floats, list[int]]:
        """Bucket start times, sums and value counts (one row per bucket) and requests of one group, in time
        order."""
        keys = sorted(key for key in self.sums.index if key[:2] == (experiment, arm))
        rows = [self.sums.index[key] for key in keys]
        return ([float(key[2] * self.width) for key in keys], self.sums.sums[rows], self.sums.counts[rows],
                self.sums.requests[rows].astype(np.int64).tolist())


class QueryMeans:
    """Per-request values per (experiment, arm, query) of the requests that name a ``query_id``."""

    def __init__(self, size: int, max_queries: int = MAX_QUERIES) -> None:
        self.sums = KeyedSums[QueryKey](size)
        self.max_queries = max_queries
        self.left_out = 0  # requests of cells beyond ``max_queries``

    def add(self, keys: Sequence[QueryKey | None], values: Floats) -> None:
        """One key per request (None: the request names no query)."""
        index, room = self.sums.index, self.max_queries - len(self.sums.index)
        new: set[QueryKey] = set()
        kept: list[QueryKey] = []
        rows: list[int] = []
        for i, key in enumerate(keys):
            if key is None:
                continue
            if key not in index and key not in new:
                if len(new) >= room:
                    self.left_out += 1
                    continue
                new.add(key)
            kept.append(key)
            rows.append(i)
        if kept:
            self.sums.add(kept, values[rows])

    def arms(self, experiment: str) -> dict[str, dict[str, int]]:
        """Per arm of ``experiment``, its queries and their rows."""
        out: dict[str, dict[str, int]] = {}
        for (e, arm, query), row in self.sums.index.items():
            if e == experiment:
                out.setdefault(arm, {})[query] = row
        return out


def delay_buckets(horizon: float) -> list[float]:
    """Upper bounds of the feedback delay histogram, up to the first at or beyond ``horizon`` (feedback later than
    the attribution window is late, never a delay).

    >>> delay_buckets(30.0)
    [0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0]
    """
    bounds: list[float] = []
    for bound in DELAY_BOUNDS:
        bounds.append(float(bound))
        if bound >= horizon:
            return bounds
    while bounds[-1] < horizon:
        bounds.append(2 * bounds[-1])
    return bounds


class HtmlData:
    """Collects the HTML report's data during :func:`~stream_eval.engine.replay.replay`: pass
    :meth:`on_finalised` as ``on_finalised``, :meth:`on_look` as ``ab_trace`` and :meth:`attach` as ``attach``."""

    def __init__(self, config: Config, max_points: int = MAX_POINTS, max_queries: int = MAX_QUERIES) -> None:
        self.config = config
        # the per-request columns, by the names of their means (MRR, nDCG@10, ...): the engine's records', from the
        # config (session measures are valued per session: in the A/B rows, not per request)
        self.names = [spec.mean_name for spec in config.specs if not spec.per_session]
        self.timeline = Timeline(len(self.names), max_points)
        self.queries = QueryMeans(len(self.names), max_queries)
        self.looks: list[dict[str, Any]] = []
        self.delays: FeedbackDelays | None = None

    def attach(self, engine: Engine) -> None:
        """Record feedback delays (called with the engine before the first event)."""
        self.delays = FeedbackDelays(engine, delay_buckets(self.config.attribution_window))

    def on_look(self, look: dict[str, Any]) -> None:
        """One A/B look: ``{"ts", "ab", "srm", "gsb"}`` as ``--ab-trace`` writes it."""
        self.looks.append(look)

    def on_finalised(self, batch: FinalisedBatch) -> None:
        names = [spec.mean_name for spec in batch.specs]
        if names != self.names:
            raise ValueError(f"the engine's per-request columns are not the config's: {names}, {self.names}")
        states = batch.states
        groups = list(map(_EXPERIMENT_ARM, states))
        self.timeline.add(groups, np.fromiter(map(_TS, states), dtype=np.float64, count=len(states)), batch.values)
        self.queries.add([None if query is None else (*group, query)
                          for group, query in zip(groups, map(_QUERY_ID, states), strict=True)], batch.values)
