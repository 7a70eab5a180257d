"""How plug-ins attach to the engine: what the engine tells them, and what they may read of it.

The engine (:mod:`stream_eval.engine.engine`) never imports its plug-ins — the rolling windows
(:mod:`~stream_eval.engine.windows`), the feedback delay histogram (:mod:`~stream_eval.engine.delays`) and the
regroup sink (:mod:`~stream_eval.engine.regroup`) — and they never import it: a plug-in sees the engine as an
:class:`EngineView`, attaches with :meth:`EngineView.attach`, and from then on the engine calls its
:class:`Plugin` hooks. The regroup sink is set by whoever runs the partition (``engine.regroup``) and gets the
:class:`RegroupHooks` calls instead of the engine counting sessions, query GSB and A/B units itself.

Readers of the engine's state (shares, readouts, partitions) still find the windows and the delays as
``engine.windows`` and ``engine.delays`` (looked up by :attr:`Plugin.role`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from stream_eval.config import Arms, Config
    from stream_eval.engine.gsb import GsbTracker
    from stream_eval.engine.sessions import Impressions, SessionRequests
    from stream_eval.events.join import Finalised, Join
    from stream_eval.metrics.aggregates import Moments
    from stream_eval.metrics.kernels import JudgedBatch
    from stream_eval.metrics.specs import MetricSpec

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


class Plugin(Protocol):
    """What the engine tells a plug-in: a join opened, a batch advanced a join, requests were finalised, event
    time (of every partition) moved."""

    #: The name readers find the plug-in under (``engine.windows``, ``engine.delays``).
    role: ClassVar[str]

    def opened(self, join: Join) -> None:
        """``join`` starts feeding the engine (the engine's own join at attachment, a partition's later)."""

    def advanced(self, join: Join, muted: bool) -> None:
        """A batch of events went into ``join`` (``muted``: rebuilding a partition, nothing is counted)."""

    def finalised(self, requests: Finalised, group: Ints, values: Floats) -> None:
        """``requests`` were finalised, in groups ``group``, with per-request ``values`` (one column per spec)."""

    def closed(self, watermark: float) -> None:
        """Event time of every partition reached ``watermark``."""


class GroupTotals(Protocol):
    @property
    def gauc(self) -> Moments: ...

    @property
    def moments(self) -> Moments: ...


class EngineView(Protocol):
    """What a plug-in reads of the engine (it writes none of it)."""

    @property
    def config(self) -> Config: ...

    @property
    def join(self) -> Join: ...

    @property
    def specs(self) -> Sequence[MetricSpec]: ...

    @property
    def group_keys(self) -> Sequence[tuple[str, str]]: ...

    @property
    def groups(self) -> Sequence[GroupTotals]: ...

    @property
    def gsb(self) -> GsbTracker: ...

    @property
    def with_subtopics(self) -> int: ...

    @property
    def segment_fields(self) -> Sequence[str]: ...

    @property
    def segment_keys(self) -> Sequence[tuple[str, str, str, str]]: ...

    def group_of(self, experiment: str, arm: str) -> int: ...

    def groups_of(self, states: Sequence[Any]) -> Ints: ...

    def segment_of(self, experiment: str, arm: str, field: str, value: str) -> int: ...

    def segments_of(self, rankings: Sequence[Any], group: Ints | None = None) -> Ints: ...

    def arms_of(self, experiment: str) -> Arms | None: ...

    def evaluate_finalised(self, finalised: Finalised) -> tuple[Floats, JudgedBatch, npt.NDArray[np.bool_]]: ...

    def attach(self, plugin: Plugin) -> None: ...


class RegroupHooks(Protocol):
    """What a partition's engine hands to the regroup log instead of counting it (``engine/regroup.py``)."""

    def session_parts(self, requests: SessionRequests, experiments: list[str], arms: list[str],
                      impressions: Impressions, rows: list[int]) -> None: ...

    def unit_requests(self, keys: Floats, ids: list[str], experiments: list[str], arms: list[str],
                      units: list[str], values: Floats,
                      segments: Sequence[tuple[str | None, ...]] | None = None) -> None: ...

    def unit_sessions(self, keys: Floats, ids: list[str], experiments: list[str], arms: list[str],
                      units: list[str], weighted_auc: Floats, weight: Floats) -> None: ...

    def query_metrics(self, groups: list[tuple[str, str]], queries: list[str], ts: list[float],
                      values: list[float]) -> None: ...

    def judgment(self, experiment: str, verdict: str) -> None: ...

    def interleaved(self, experiment: str, teams: list[str], relevant_positions: list[int]) -> None: ...

    def arm(self, experiment: str, arm: str) -> None: ...
