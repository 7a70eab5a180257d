"""How a worker reaches Kafka and names its topics: :class:`WorkerSettings` (the evaluation settings are the
:class:`~stream_eval.config.Config`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from stream_eval.config import ConfigError
from stream_eval.events.ubi import UbiSettings
from stream_eval.stream.kafka import DEFAULT_PARTITIONS, KafkaSecurity, Topics, topics

#: What Kafka allows in a topic name (and what a group here may hold: it starts topic names).
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
#: The ways of delivering results exactly once (``stream/delivery.py``), besides ``auto``.
DELIVERY_NAMES = ("fenced-log", "transactions")


@dataclass(frozen=True)
class WorkerSettings:
    """How the worker reaches Kafka; the evaluation settings are the :class:`Config`."""

    brokers: list[str]
    prefix: str = ""
    group: str = "stream-eval"
    partitions: int = DEFAULT_PARTITIONS
    checkpoint_interval: float = 1.0
    #: Seconds between snapshots of the regroup stage's A/B state (engine/snapshot.py): a new owner of the stage
    #: re-reads the regroup log from the latest one, not from its start.
    snapshot_interval: float = 60.0
    #: Partitions of the regroup log, spread over the group's workers like the input partitions (at most the 64
    #: shards of the A/B units); None: as many as the input topics. A regroup log that exists keeps its count.
    stage_partitions: int | None = None
    max_records: int = 20_000
    session_timeout_ms: int = 6_000
    #: Seconds a new owner of a partition keeps its request-metrics records (and its checkpoints) back, and then
    #: leaves out those a previous owner wrote meanwhile (the module docstring's hand-over hold).
    handover_hold: float = 5.0
    heartbeat_interval_ms: int = 1_000
    #: A broker call without an answer for this many seconds counts as an outage (``stream_eval_broker_up`` 0).
    broker_stall: float = 10.0
    #: The producer's ``request_timeout_ms``: how long it keeps a batch the broker has not acknowledged before it
    #: gives up on it. An outage shorter than this loses nothing and writes nothing twice (backoff.py).
    produce_timeout_ms: int = 600_000
    extra: dict[str, Any] = field(default_factory=dict)
    #: TLS and SASL settings of every client (``None``: plain text); see :class:`KafkaSecurity`.
    security: KafkaSecurity | None = None
    #: ``"ubi"``: the rankings and feedback come as OpenSearch UBI records on the topics below (after ``prefix``),
    #: converted as ``replay --input-format ubi`` converts them, with the ``[ubi]`` settings ``ubi``
    #: (stream/ubi_topics.py); ``"events"``: this project's events on the rankings and feedback topics.
    input_format: str = "events"
    ubi_queries_topic: str = "ubi_queries"
    ubi_events_topic: str = "ubi_events"
    ubi: UbiSettings = UbiSettings()
    #: Replicas of each topic the worker creates; a topic that exists must have at least as many.
    replication_factor: int = 1
    #: ``min.insync.replicas`` of each topic the worker creates (one that exists must have at least this): the
    #: worker's producer waits for every in-sync replica (acks=all), and a write fails with fewer than this in sync.
    min_insync_replicas: int = 1
    #: How the results are made exactly-once (stream/delivery.py): ``transactions`` (Kafka transactions),
    #: ``fenced-log`` (no transactions), or ``auto``: transactions where the broker runs them.
    delivery: str = "auto"
    #: Seconds between deletions (Kafka's DeleteRecords) of what no reader needs any more of the checkpoint, regroup
    #: and A/B snapshot topics, which are kept forever otherwise (docs/operations.md); with transactions only (a
    #: fenced log's claims read further back). 0: never.
    trim_interval: float = 60.0

    def __post_init__(self) -> None:
        if not _NAME.match(self.group):
            raise ConfigError(f"--group {self.group!r}: a consumer group and the start of topic names: letters, "
                              "digits, '.', '_' and '-' only, not empty")
        if self.input_format == "ubi":
            queries, events, plain = self.ubi_queries_topic, self.ubi_events_topic, topics(self.prefix)
            taken = {plain.judgments, plain.request_metrics, plain.dead_letters}
            if not (queries and events) or queries == events or {self.topics.rankings, self.topics.feedback} & taken:
                raise ConfigError(f"--ubi-queries-topic {queries!r} and --ubi-events-topic {events!r}: two topics, "
                                  "not empty, not the same, and neither judgments, request-metrics nor dead-letters")
        bad = [name for name in self.topic_configs() if not _NAME.match(name) or len(name) > 249]
        if bad:
            raise ConfigError(f"topic name {bad[0]!r} (from --topic-prefix {self.prefix!r}): Kafka takes letters, "
                              "digits, '.', '_' and '-' only, at most 249 characters")
        if self.delivery not in ("auto", *DELIVERY_NAMES):
            raise ConfigError(f"delivery {self.delivery!r}: one of auto, {', '.join(DELIVERY_NAMES)}")
        if self.replication_factor < 1 or not 1 <= self.min_insync_replicas <= self.replication_factor:
            raise ConfigError(f"min_insync_replicas ({self.min_insync_replicas}) must be from 1 to the replication "
                              f"factor ({self.replication_factor}): no write could succeed otherwise")

    @property
    def topics(self) -> Topics:
        if self.input_format == "ubi":  # the UBI topics stand where the rankings and feedback topics stand
            return dataclasses.replace(topics(self.prefix), rankings=f"{self.prefix}{self.ubi_queries_topic}",
                                       feedback=f"{self.prefix}{self.ubi_events_topic}")
        return topics(self.prefix)

    @property
    def checkpoint_topic(self) -> str:
        return f"{self.prefix}{self.group}.checkpoints"

    @property
    def control_topic(self) -> str:
        return f"{self.prefix}{self.group}.control"

    @property
    def regroup_topic(self) -> str:
        """Finalised requests' session parts, query metrics and A/B contributions, from every worker, in order,
        in the stage's partitions (engine/regroup.py)."""
        return f"{self.prefix}{self.group}.regroup"

    @property
    def regroup_checkpoint_topic(self) -> str:
        return f"{self.prefix}{self.group}.regroup-checkpoints"

    @property
    def snapshot_topic(self) -> str:
        """Snapshots of each stage partition's A/B state, in pieces, on its partition (engine/snapshot.py)."""
        return f"{self.prefix}{self.group}.ab-snapshots"

    def topic_configs(self) -> dict[str, dict[str, str]]:
        """The settings each topic is created with; those of ``CHECKED_SETTINGS`` are checked on topics that exist
        (docs/operations.md says why each needs them). Only the latest record of each key of the regroup
        checkpoints is read: compacted. The checkpoint topic (windows shares in pieces, read by offset), the regroup
        log (re-read from a stage checkpoint's offset) and the A/B snapshots (pieces, read by offset) are logs that
        retention must never delete (the worker trims what no reader needs: ``Delivery.trim``). Inputs and outputs
        are plain logs (never compacted: feedback shares its request's key, dead letters have none); their retention
        is the operator's."""
        isr = {"min.insync.replicas": str(self.min_insync_replicas)}
        plain = {"cleanup.policy": "delete", **isr}
        # segments roll hourly: compacted within the hour, and what the worker trims leaves the disk within the hour
        hourly = {"segment.ms": str(3_600_000), **isr}
        kept = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1", **hourly}
        compacted = {"cleanup.policy": "compact", **hourly}
        names = self.topics
        return {
            **{name: plain for name in (*names.inputs, names.request_metrics, names.dead_letters, self.control_topic)},
            self.checkpoint_topic: kept,
            self.regroup_topic: kept,
            self.snapshot_topic: kept,
            self.regroup_checkpoint_topic: compacted,
        }
