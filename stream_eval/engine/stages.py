"""The partitions of the regroup stage that one process holds: an engine and a :class:`SessionStage` each.

The regroup log has ``count`` partitions (``engine/regroup.py``); each is read by the stage of one process at a
time, which holds that partition's sessions, query buckets, verdicts and shards of the A/B units in an engine of
its own — the partition's *share* of the totals, checkpointed with it. The stages other than partition 0's report
their looks of the A/B units for partition 0 (:meth:`StagePartitions.take_reports`), whose merger folds them.
A worker takes and gives up partitions as its consumer group assigns them; in-process tests hold them all.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stream_eval.engine import shares
from stream_eval.engine.engine import Engine
from stream_eval.engine.labels import LabelBounds
from stream_eval.engine.regroup import SessionStage, StageCheckpoint


@dataclass
class HeldStage:
    """A stage partition held here: its stage, its engine and this ownership of it (a label on ``/metrics``)."""

    stage: SessionStage
    engine: Engine
    generation: str
    next_snapshot: float = 0.0  # when its A/B state is snapshotted next (monotonic seconds)


class StagePartitions:
    """The stage partitions held here, by number, each built with ``make_engine``."""

    def __init__(self, make_engine: Callable[[], Engine], inputs: int, count: int = 1) -> None:
        """``inputs``: the input partitions (whose watermarks the stages close on); ``count``: the regroup log's."""
        self.make_engine = make_engine
        self.inputs = inputs
        self.count = count
        self.held: dict[int, HeldStage] = {}

    def take(self, partition: int, checkpoint: StageCheckpoint | None = None, snapshot: bytes | None = None,
             share: dict[str, Any] | None = None) -> HeldStage:
        """Hold stage partition ``partition`` from its checkpoint (``snapshot``: the data it names; ``share``: the
        counted totals stored with it)."""
        engine = self.make_engine()
        if share is not None:
            shares.restore(engine, share)
        stage = SessionStage(engine, self.inputs, checkpoint, snapshot, stage=partition, stages=self.count)
        held = self.held[partition] = HeldStage(stage, engine, os.urandom(4).hex())
        self._link()
        return held

    def give_up(self, partition: int) -> None:
        """Forget a partition (its checkpoint is stored, or not wanted)."""
        held = self.held.pop(partition)
        held.engine.drop_regrouped()
        self._link()

    def _link(self) -> None:
        """The stages held here report their looks to partition 0's merger at once when it is held here too, as well
        as through the log: a backlog's last looks are folded without waiting for a commit and a fetch. Reports are
        idempotent (a look or progress the log brings again changes nothing), so partition 0 may fold them before
        the log holds them (docs/design.md, "A/B units across workers"; :meth:`SessionStage.link`)."""
        local = self.held[0].engine.ledger.merger if 0 in self.held else None
        for q, held in self.held.items():
            merger = local if q != 0 else None
            if held.stage.local is not merger:
                held.stage.link(merger)

    def feed(self, partition: int, offsets: Sequence[int], values: Sequence[bytes]) -> None:
        self.held[partition].stage.feed(offsets, values)

    def reporting(self) -> bool:
        """Whether a stage held here has records for stage partition 0 not taken yet (its looks and progress)."""
        return any(held.stage.reports for held in self.held.values())

    def take_reports(self, partition: int | None = None, live: bool = True) -> list[bytes]:
        """The records for stage partition 0 that the stages held here wrote since the last call (of
        ``partition`` only, when given; ``live`` False: without the live looks, :meth:`SessionStage.take_reports`)."""
        chosen = self.held if partition is None else [partition]
        return [report for q in sorted(chosen) if q in self.held
                for report in self.held[q].stage.take_reports(live)]

    def engines(self) -> list[Engine]:
        return [self.held[q].engine for q in sorted(self.held)]

    def shares(self) -> list[tuple[str, str, Engine]]:
        """``(label, generation, engine)`` of each partition held: ``regroup`` for partition 0, ``regroup-<q>``."""
        return [(label(q), self.held[q].generation, self.held[q].engine) for q in sorted(self.held)]

    def view(self, labels: LabelBounds, watermark: float) -> Engine:
        """One engine with what the partitions held here hold (their A/B shards, partition 0's looks, their
        verdicts), for a readout: the label bounds and watermark given."""
        engine = self.make_engine()
        engine.regroup = None
        for held in self.engines():
            engine.merge(held)
        engine.labels = labels
        engine.watermark = watermark if watermark > -math.inf else engine.watermark
        return engine


def label(partition: int) -> str:
    """The ``partition`` label of a stage partition's share on ``/metrics``.

    >>> label(0), label(3)
    ('regroup', 'regroup-3')
    """
    return "regroup" if partition == 0 else f"regroup-{partition}"
