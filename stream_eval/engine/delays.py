"""The delay of applied feedback after its serve time, as a cumulative histogram (for Prometheus).

Joins record ``feedback ts - serve ts`` of each applied feedback (status ``ok``: late, duplicate and orphan
feedback is not observed) into a plain list; :meth:`FeedbackDelays.drain` folds a batch of them into the bucket
counts with one vectorised call per :meth:`Engine.process <stream_eval.engine.engine.Engine.process>` batch.
Feedback stamped before its ranking (clock skew) is observed as a delay of 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from stream_eval.engine.plugins import EngineView
from stream_eval.events.join import Finalised, Join

#: Upper bounds in seconds: up to the default 30 min attribution window.
DELAY_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0)


class FeedbackDelays:
    """Counts of feedback delays per bucket, their sum and number; attaches itself to ``engine`` (a
    :class:`~stream_eval.engine.plugins.Plugin`).

    >>> from stream_eval.config import Config
    >>> from stream_eval.engine.engine import Engine
    >>> from stream_eval.events.schema import Feedback, Ranking
    >>> engine = Engine(Config())
    >>> delays = FeedbackDelays(engine)
    >>> engine.process([Ranking("r1", ["a"], ts=100.0), Feedback("r1", "a", grade=1.0, ts=103.0)])
    >>> delays.cumulative()[:3], delays.total, delays.count
    ([0, 0, 1], 3.0, 1)
    """

    role: ClassVar[str] = "delays"

    def __init__(self, engine: EngineView, buckets: Sequence[float] = DELAY_BUCKETS) -> None:
        self.bounds = np.array(sorted(buckets), dtype=np.float64)
        self.counts: npt.NDArray[np.int64] = np.zeros(len(self.bounds) + 1, dtype=np.int64)  # last: > max bound
        self.total = 0.0
        self.count = 0
        engine.attach(self)

    # -- engine hooks (engine/plugins.py) -------------------------------------------------------------
    def opened(self, join: Join) -> None:
        """Have ``join`` record the delays of the feedback it applies."""
        join.delays = []

    def advanced(self, join: Join, muted: bool) -> None:
        """A batch went into ``join``: :meth:`drain` it (muted: a rebuild, whose delays were counted before)."""
        self.drain(join, keep=not muted)

    def finalised(self, requests: Finalised, group: npt.NDArray[np.int64], values: npt.NDArray[np.float64]) -> None:
        """Nothing to do."""

    def closed(self, watermark: float) -> None:
        """Nothing to do."""

    def drain(self, join: Join, keep: bool = True) -> None:
        """Fold the delays ``join`` recorded since the last drain into the histogram (``keep=False``: drop them)."""
        recorded = join.delays
        if recorded is None:
            join.delays = []
            return
        if not recorded:
            return
        if keep:
            delays = np.maximum(np.array(recorded, dtype=np.float64), 0.0)
            self.counts += np.bincount(np.searchsorted(self.bounds, delays, side="left"), minlength=len(self.counts))
            self.total += float(delays.sum())
            self.count += len(recorded)
        recorded.clear()

    def cumulative(self) -> list[int]:
        """Observations ``<=`` each bound, then all of them (the ``+Inf`` bucket)."""
        return np.cumsum(self.counts).tolist()  # type: ignore[no-any-return]  # ints
