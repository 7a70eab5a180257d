"""The data plane of ``stream-eval worker``: batches from Kafka into the same engine that replay uses.

faust's per-message machinery costs ~150 µs a message (measured: docs/benchmarks.md, "Platform measurements"),
several times the whole budget of a worker, so the input topics are read here with aiokafka ``getmany`` in
batches, each read by the compiled line reader as replay reads a file, and fed to
:class:`~stream_eval.engine.partitions.PartitionedEngine`; the faust application (``stream/app.py``) runs this as
one of its services, next to its sensors and its control topic.

The claims, commits and releases of the partitions it owns are its :class:`~stream_eval.stream.delivery.Delivery`'s
(``stream/delivery.py``: Kafka transactions, or the fenced log on brokers without them); their invariants are
written once, in ``docs/design.md``, "Delivery".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from stream_eval.config import Config, ConfigError
from stream_eval.engine.ab import SHARDS
from stream_eval.engine.delays import FeedbackDelays
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.engine.labels import LabelBounds
from stream_eval.engine.partitions import PartitionedEngine
from stream_eval.engine.regroup import RegroupSink
from stream_eval.engine.stages import StagePartitions
from stream_eval.engine.windows import RollingWindows
from stream_eval.events.messages import decode_message_chunk
from stream_eval.events.schema import Watermark
from stream_eval.events.ubi import ubi_config
from stream_eval.stream.backoff import BrokerHealth, SilenceClock, is_broker_error
from stream_eval.stream.batches import column_batches
from stream_eval.stream.delivery import (
    DELIVERIES,
    Delivery,
    FencedLog,
    RequestRecords,
    refuse_transactions,
    transactions_supported,
)
from stream_eval.stream.fetched import Joined, lean_options
from stream_eval.stream.fetched import warm_up as warm_up_fetches
from stream_eval.stream.kafka import (
    TopicSettingsError,
    client_options,
    ensure_topics,
    input_partitions,
    partitions_for,
)
from stream_eval.stream.logs import BATCH_BYTES
from stream_eval.stream.settings import WorkerSettings
from stream_eval.stream.ubi_topics import UbiTopics

log = logging.getLogger("stream_eval.worker")
#: Seconds one start-up attempt waits for the broker before the outage is counted and the attempt retried.
_STARTUP_ATTEMPT = 5.0
#: Seconds the final checkpoint and each client's shutdown may take (a broker that is down cannot hold the exit).
_SHUTDOWN_TIMEOUT = 30.0
#: ... each client's shutdown when the broker is unreachable (its group leave cannot be sent).
_SHUTDOWN_UNREACHABLE = 2.0
#: The order in which a batch's topics are fed.
_FEED_ORDER = {"ranking": 0, "judgment": 1, "feedback": 2}
#: Event-loop turns given to aiokafka's fetcher after a batch is handed out: its task is woken in one, makes the
#: fetch requests' tasks in the next, and they write the requests in the third.
_FETCH_TICKS = 3
#: Event-time seconds a feedback partition may be read ahead of its rankings before it is paused.
_FEEDBACK_AHEAD = 1.0
#: Seconds without a rankings batch after which the rankings partition no longer holds its feedback back.
_RANKINGS_QUIET = 1.0
#: A worker that has read everything there is commits once this share of the checkpoint interval has passed.
_CAUGHT_UP_COMMITS = 0.25
#: Milliseconds the broker may hold a fetch request of the worker's consumers for partitions with nothing new.
#: Partitions resumed meanwhile (``_pace_feedback``) are asked for only once it returns, and a broker that does not
#: answer it early when records come (Tansu, often) hands them out only then: with aiokafka's 500 ms, a backlog's
#: last feedback and the regroup records of its end waited up to half a second (docs/benchmarks.md).
_FETCH_WAIT_MS = 100
#: Bytes the broker waits for (at most ``_FETCH_WAIT_MS``) before it answers an input fetch. Under live traffic the
#: worker then handles a batch every ~0.1 s rather than every few milliseconds, and the fixed cost of a batch (the
#: decoding, the join and the ticks of each partition) is paid less often: half the CPU per event at 6,400 events/s
#: (docs/benchmarks.md); a backlog holds more than this and is answered at once.
_FETCH_MIN_BYTES = 1 << 20
#: Seconds the input consumer stays behind the broker's high-water marks before the worker takes itself to be
#: working through a backlog (no readouts taken soon: the periodic one shows progress); under live traffic a fetch
#: answered while the last batch was handled puts it behind for a moment only.
_BACKLOG_AFTER = 0.5
#: Milliseconds between two looks at the consumers while the loop waits for records, where aiokafka's fetcher cannot
#: be waited on (:func:`_wait_for_records`).
_POLL_MS = 10


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a batch is handled, as replay has it off for its whole pass: a batch's
    containers live until it is done (reference counting frees them), and each collection in its middle walked
    them and moved them on to an older generation, to be walked again there. Enabled again after the batch, the
    collector runs on the next allocation if the batch made enough to call for it, so cycles are still collected
    (docs/benchmarks.md, "The collector paused during a batch"). Only around work that does not wait: never
    across an ``await`` (a broker outage's backoff would keep it off for as long)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def prepare_topics(settings: WorkerSettings, timeout: float) -> tuple[int, int]:
    """Create the worker's topics that do not exist, with their settings (:meth:`WorkerSettings.topic_configs`), and
    check those that do (:func:`~stream_eval.stream.kafka.ensure_topics`), waiting up to ``timeout`` seconds for each
    step. The regroup stage's topics get ``stage_partitions`` (default: as many as the input topics have; at most
    :data:`~stream_eval.engine.ab.SHARDS`); a regroup log that exists keeps its count. Returns the partitions of the
    input and of the regroup log.

    Raises:
        TimeoutError: The broker did not answer in time.
        TopicSettingsError: A topic exists with settings that do not fit.
        ValueError: The stage's topics exist with partitions that do not fit together.
    """
    configs = settings.topic_configs()
    stage_topics = [settings.regroup_topic, settings.regroup_checkpoint_topic, settings.snapshot_topic]

    async def count(topic: str) -> int:
        return len(await asyncio.wait_for(partitions_for(settings.brokers, topic, settings.security), timeout))

    inputs = await input_partitions(settings.brokers, settings.topics, settings.partitions, timeout,
                                    settings.security)
    wanted = min(settings.stage_partitions or inputs, SHARDS)
    # the others as many as the inputs too: partition p of the input checkpoints to partition p of the checkpoints
    partitions = {name: wanted if name in stage_topics else inputs for name in configs}
    await ensure_topics(settings.brokers, list(configs), partitions, timeout=timeout, security=settings.security,
                        replication_factor=settings.replication_factor, configs=configs)
    inputs = await count(settings.topics.rankings) or settings.partitions
    checkpoints = await count(settings.checkpoint_topic)
    if checkpoints < inputs:  # (made before the inputs grew, or by hand): the partitions past its end never commit
        raise TopicSettingsError(
            f"the checkpoint topic {settings.checkpoint_topic} has {checkpoints} partitions and the input topics "
            f"{inputs}: each input partition checkpoints to the partition of the same number. If partitions were "
            "added to the inputs of this group, start a new --group (requests in flight were split between "
            "partitions); if the checkpoint topic was made with fewer, give it as many (kafka-topics --alter "
            "--partitions N) or more (docs/operations.md)")
    counts = [await count(topic) for topic in stage_topics]
    stages = counts[0]  # (a regroup log that exists keeps its partitions: its records are routed by them)
    if not 1 <= stages <= SHARDS or min(counts[1:]) < stages:
        raise ValueError(f"the regroup stage's topics {stage_topics} have {counts} partitions: the regroup log "
                         f"needs 1 to {SHARDS}, and the others at least as many")
    if settings.stage_partitions and settings.stage_partitions != stages:
        log.warning("--stage-partitions %d: the regroup log %s exists with %d partitions and keeps them (a group's "
                    "records are routed by them): the option changes nothing for this group; a new --group takes it",
                    settings.stage_partitions, settings.regroup_topic, stages)
    return inputs, stages


Rebalance = Callable[[Any], Awaitable[None]]


class _Where(Sequence[str]):
    """``topic/partition@offset`` of each message, formatted only for the (few) invalid ones."""

    __slots__ = ("prefix", "offsets")

    def __init__(self, prefix: str, offsets: list[int]) -> None:
        self.prefix, self.offsets = prefix, offsets

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> str:  # type: ignore[override]  # no slices needed
        return f"{self.prefix}{self.offsets[index]}"


class _Timestamps(Sequence[float]):
    """Kafka timestamps in seconds (from milliseconds), read only for messages without ``ts``."""

    __slots__ = ("stamps",)

    def __init__(self, stamps: Sequence[int] | npt.NDArray[np.int64]) -> None:
        self.stamps = stamps

    def __len__(self) -> int:
        return len(self.stamps)

    def __getitem__(self, index: int) -> float:  # type: ignore[override]  # no slices needed
        return float(self.stamps[index]) / 1000.0


def _rebalancing(consumer: Any) -> bool:
    """Whether ``consumer``'s group is rebalancing (or not joined yet): its ``getmany`` would wait for the end."""
    return bool(consumer._subscription.reassignment_in_progress)  # aiokafka has no public reading of it


def _behind(consumer: Any, tp: Any) -> int | None:
    """Messages of ``tp`` that the consumer has not handed out yet, by its latest fetch response's high-water mark
    (its last stable offset when it reads committed records only: those after an open transaction are not handed out
    yet either); ``None`` before the first fetch answered."""
    # aiokafka has no synchronous position(): the fetch position sits next to highwater() in its state
    state = consumer._subscription.subscription.assignment.state_value(tp)
    highwater = consumer.highwater(tp)
    if highwater is None or not state.has_valid_position:
        return None
    stable = state.lso  # (-1 when reading uncommitted records; None from brokers that do not say)
    end = int(highwater) if stable is None or stable < 0 else min(int(highwater), int(stable))
    return max(0, end - int(state.position))


def _lagging(consumer: Any) -> bool:
    """Whether the latest fetch responses say that a partition the consumer reads (not paused) holds messages it has
    not handed out yet: an empty fetch then means that the next one is on its way, not that it read all there is."""
    paused = consumer.paused()
    return any((_behind(consumer, tp) or 0) > 0 for tp in consumer.assignment() if tp not in paused)


def _settled(idle: bool, behind: bool) -> bool:
    """Whether a readout taken now shows a settled worker, whose open requests it re-evaluates (``refresh_soon``):
    one that has gone idle having read all the broker holds. An empty fetch while the broker holds more (``behind``:
    the middle of a backlog) leaves them as a busy worker's readouts do; every request they have is finalised or
    re-evaluated a moment later.

    >>> _settled(idle=True, behind=False), _settled(idle=True, behind=True), _settled(idle=False, behind=False)
    (True, False, False)
    """
    return idle and not behind


def _input_wait(stage_records: int, read_pending: bool, caught_up: bool) -> int:
    """Milliseconds the loop's next input fetch may wait for records when none are at hand.

    None while the stage has records to apply (its consumer fetches the next ones meanwhile), nor right after the
    work that took the worker to the end of a backlog, once it has read all the broker holds (``caught_up``): it is
    idle at once, and its caught-up commit (with the regroup records other workers' stage partitions wait for) and
    its readout go out now, not after a wait for input that is not on its way. Under live traffic it waits as
    before, so its commits stay as frequent. 20 ms when a readout was refused for coming too soon, else 100 ms.

    >>> [_input_wait(0, False, False), _input_wait(0, True, False), _input_wait(5, True, False),
    ...  _input_wait(0, True, True)]
    [100, 20, 0, 0]
    """
    if stage_records or caught_up:
        return 0
    return 20 if read_pending else 100


def _fetcher_part(consumer: Any, name: str) -> Any:
    """An attribute of ``consumer``'s aiokafka fetcher (None where this aiokafka or a consumer has none)."""
    return getattr(getattr(consumer, "_fetcher", None), name, None)


def _holds_records(consumer: Any) -> bool:
    """Whether ``consumer``'s fetcher holds fetched records (or an error) that ``getmany`` has not handed out yet."""
    return bool(_fetcher_part(consumer, "_records"))


async def _wait_for_records(consumers: Sequence[Any], timeout_ms: int) -> None:
    """Return once one of ``consumers`` stores a fetch response with records (or its client fails), or after
    ``timeout_ms``. aiokafka's ``getmany`` waits on one consumer only, and the worker's loop waits on two, its input
    and its stage: this waits on their fetchers' futures (where this aiokafka has none: a short sleep instead)."""
    creates = [_fetcher_part(consumer, "_create_fetch_waiter") for consumer in consumers]
    if any(create is None for create in creates):
        await asyncio.sleep(min(timeout_ms, _POLL_MS) / 1000)
        return
    waiters: list[asyncio.Future[Any]] = [create() for create in creates]
    try:
        await asyncio.wait(waiters, timeout=timeout_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            if waiter.done() and not waiter.cancelled():
                waiter.exception()  # (a fatal client error, read here: the consumer's next getmany raises it)
            waiter.cancel()  # (a future not done: the fetcher drops it from its set)


def _quiet_client_debug_logs() -> None:
    """Keep aiokafka's per-message debug logging off unless a real log handler takes DEBUG records.

    mode's terminal spinner (a handler at DEBUG) puts the root logger at DEBUG under every ``--loglevel``, so
    aiokafka built a LogRecord for each message it sent (and filtered it): a cost measured in docs/benchmarks.md.
    """
    root = logging.getLogger()
    if any(handler.level <= logging.DEBUG for handler in root.handlers if type(handler).__name__ != "SpinnerHandler"):
        return  # --loglevel debug: keep everything
    client = logging.getLogger("aiokafka")
    if client.level == logging.NOTSET:
        client.setLevel(logging.INFO)
    repeats = RepeatFilter()
    for name in list(logging.Logger.manager.loggerDict):
        if name == "aiokafka" or name.startswith("aiokafka."):
            logger = logging.getLogger(name)
            if not any(isinstance(f, RepeatFilter) for f in logger.filters):
                logger.addFilter(repeats)


#: The start of aiokafka's line for a fetch from an offset its broker no longer holds (it then reads on from the
#: earliest it holds).
_OUT_OF_RANGE = "Fetch offset %s is out of range"
#: aiokafka's line for a fetch request that failed (no connection, no answer in time): it retries on its own.
_FAILED_FETCH = "Failed fetch messages from %s: %s"


class FetcherLog(logging.Filter):
    """What aiokafka's fetcher says in its log only, handed to every worker of the process:

    * a fetch from an offset the broker no longer holds (it then reads on from the earliest it holds): the line made
      a warning, the topic-partition and offset appended to each worker's ``out_of_range`` list
      (:meth:`StreamWorker._count_lost_input` counts what was lost);
    * a fetch request that failed (it retries on its own, and ``getmany`` then hands out nothing): counted in each
      worker's ``stream_eval_broker_errors_total{operation="fetch"}`` (:meth:`BrokerHealth.counted`).

    It comes first among the fetcher logger's filters, so that :class:`RepeatFilter` (which holds back repeated
    lines) does not keep lines from it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[tuple[Any, int]]] = []  # each running worker's StreamWorker.out_of_range
        self.healths: list[BrokerHealth] = []  # each running worker's StreamWorker.health

    def filter(self, record: logging.LogRecord) -> bool:
        message, args = str(record.msg), record.args
        if not (isinstance(args, tuple) and len(args) == 2):
            return True
        if message == _FAILED_FETCH:
            for health in self.healths:
                health.counted("fetch", args[1] if isinstance(args[1], BaseException) else str(args[1]))
        elif message.startswith(_OUT_OF_RANGE):
            offset, tp = args
            for seen in self.seen:
                seen.append((tp, int(offset)))  # type: ignore[call-overload]  # aiokafka's: an int
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            record.msg = (f"{record.msg}: the broker no longer holds the offsets this worker was to read (deleted by "
                          "retention before they were read, or the topic was deleted and made again); the worker "
                          "counts what was lost in stream_eval_input_lost_total (docs/operations.md, \"Lost input\")")
        return True

    @classmethod
    def installed(cls) -> FetcherLog:
        """The filter of aiokafka's fetcher logger (installed once, first, with the logger at INFO at least)."""
        fetcher = logging.getLogger("aiokafka.consumer.fetcher")
        for found in fetcher.filters:
            if isinstance(found, FetcherLog):
                return found
        made = cls()
        fetcher.filters.insert(0, made)
        if fetcher.getEffectiveLevel() > logging.INFO:
            fetcher.setLevel(logging.INFO)
        return made


class RepeatFilter(logging.Filter):
    """Lets a log message through once per ``every`` seconds per logger and message template, saying how many like
    it were held back: during a broker outage aiokafka logs every retry of every connection, hundreds of lines a
    second (the worker's own outage line, stream/backoff.py, says what matters)."""

    def __init__(self, every: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every, self.clock = every, clock
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # (logger, template) -> (last let through, held)

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(_OUT_OF_RANGE):  # (each partition's: FetcherLog)
            return True
        key, now = (record.name, str(record.msg)), self.clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.every:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        self._seen[key] = (now, 0)
        if last is not None and last[1]:
            record.msg = f"{record.msg} ({last[1]} more like it held back in the last {now - last[0]:.0f} s)"
        return True


def warm_up(config: Config) -> None:
    """Run simulated requests through the path a batch takes (decode, join, finalise, the regroup stage), so
    that numba loads its compiled loops from the cache now, while the worker's groups form, not while a first
    batch keeps the group waiting (a few seconds)."""
    from stream_eval.simulate import SimulationConfig, simulate_lines

    # each compiled loop with each kind of array a worker's batches give it: enough requests for the join's tables to
    # grow; feedback after its rankings, then before them with late, orphan, duplicate and invalid lines among it;
    # rankings with attributes, and interleaved ones (their teams read by msgspec a chunk at a time)
    plain = SimulationConfig(requests=750, seed=1, judgments=False)
    rough = dataclasses.replace(plain, seed=2, id_prefix="w", start_ts=plain.start_ts + 86400.0, late_fraction=0.05,
                                orphan_fraction=0.02, duplicate_fraction=0.02, invalid_fraction=0.02)
    attributed = dataclasses.replace(plain, requests=100, seed=3, id_prefix="a", start_ts=rough.start_ts + 86400.0,
                                     segments=(("platform", ("ios", "web")),), interleaving=True)
    orders = (("ranking", "feedback"), ("feedback", "ranking"), ("ranking", "feedback"))
    parts = [[line.rstrip(b"\n") for line in simulate_lines(sim)] for sim in (plain, rough, attributed)]
    engine = Engine(config)
    engine.labels = LabelBounds(config.max_label_values)
    RollingWindows(engine)
    FeedbackDelays(engine)

    def finalised(partition: int, batch: FinalisedBatch) -> None:  # (their request-metrics records, in batches)
        for _ in column_batches(RequestRecords.of(partition, batch).records, BATCH_BYTES, False):
            pass

    partitioned = PartitionedEngine(engine, on_finalised=finalised)  # (runs the regroup stage itself)
    partitioned.assign(0)
    read = {"ranking": 0, "feedback": 0}
    for part, kinds in zip(parts, orders, strict=True):
        for kind in kinds:
            marks = (f'"type": "{kind}"'.encode(), f'"type":"{kind}"'.encode())
            values = [line for line in part if marks[0] in line or marks[1] in line]
            if values:
                chunk = decode_message_chunk(values, kind, config, [0.0] * len(values), [""] * len(values))
                partitioned.feed(kind, 0, list(range(read[kind], read[kind] + len(values))), chunk)
                read[kind] += len(values)
    partitioned.feed("ranking", 0, [read["ranking"]], [Watermark(end=True)])
    partitioned.feed("feedback", 0, [read["feedback"]], [Watermark(end=True)])
    partitioned.tick()
    _warm_up_growth()
    warm_up_fetches()


def _warm_up_growth() -> None:
    """The compiled loops that run only when a table grows past what :func:`warm_up`'s traffic fills (an A/B shard's
    unit slots, the join's table of items not served, rebuilt): loaded with the kinds of array they are given."""
    from stream_eval.engine.compiled import unit_slots
    from stream_eval.events.compiled import UNSHOWN_ENTRY, empty_table, keep_unshown, unshown_live

    unit_slots(np.zeros(1, dtype=np.uint64), 0, 2)
    table, arena, held = empty_table(1, UNSHOWN_ENTRY), np.zeros(1, dtype=np.uint8), np.zeros(1, dtype=np.bool_)
    unshown_live(table, held, 0)
    keep_unshown(table, arena, held, 0, empty_table(1, UNSHOWN_ENTRY), np.zeros(1, dtype=np.uint8))


class StreamWorker:
    """Consumes the input topics in a consumer group and keeps an :class:`Engine` up to date.

    ``lock`` is held while the engine changes, so that a Prometheus scrape from another thread reads a
    consistent state.
    """

    def __init__(self, settings: WorkerSettings, config: Config, lock: threading.Lock | None = None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.wall_clock = wall_clock
        if settings.input_format == "ubi":  # (the grades of the feedback kinds UBI actions map to)
            config = ubi_config(config, settings.ubi)
        if not config.windows:  # (replay keeps no live windows; a worker's /metrics shows them)
            raise ConfigError('windows = []: a worker keeps live windows for /metrics and needs at least one '
                              'duration, e.g. windows = ["5m", "1h"] (the default)')
        self.config = config
        self.lock = lock or threading.Lock()
        self.labels = LabelBounds(config.max_label_values)  # one bound for every engine of this worker
        self.engine = self._stage_engine()  # the template of every engine; its live windows move with the others'
        self.partition_count = settings.partitions  # of the input topics (found at start)
        #: The partitions of the regroup stage this worker holds, as the stage's consumer group assigns them.
        self.stages = StagePartitions(self._stage_engine, self.partition_count, settings.stage_partitions or 1)
        self._stage_consumer: Any = None
        # each input partition gets an engine of its own, built like self.engine: its totals are its share
        #: The broker's health as this worker sees it: ``stream_eval_broker_up``, ``..._broker_errors_total``.
        self.health = BrokerHealth("stream-eval worker", log, stall=settings.broker_stall)
        # a source's silence is counted while the broker answers and the worker runs (an outage is no silence)
        silence = SilenceClock(self.health, clock)
        self.partitioned = PartitionedEngine(self.engine, silence, lambda p, batch: self.delivery.finalised(p, batch))
        self.partitioned.stage_engines = self.stages.engines
        self.ubi: UbiTopics | None = None  # the UBI records of the partitions owned, with --input-format ubi
        if settings.input_format == "ubi":
            self.ubi = UbiTopics(config, settings.ubi, silence)
        self.topics = settings.topics
        self._consumer: Any = None
        self._busy = asyncio.Lock()
        self.events_seen = 0
        self._fetch_backoff = self.health.backoff()
        #: Called between batches, without the lock: ``EngineCollector.refresh`` (the readout /metrics shows).
        self.between_batches: Callable[[], None] | None = None
        #: Called between batches when the worker has just started counting events, has gone idle with changes since
        #: (the argument True when it also read all the broker holds: :func:`_settled`), or took new work under live
        #: traffic: ``EngineCollector.refresh_soon`` (a readout sooner than the periodic one; True if it took one or
        #: none is wanted, False if it is due later).
        self.readout_soon: Callable[[bool], bool] | None = None
        #: The claims, commits and releases of the partitions this worker owns (stream/delivery.py).
        self.delivery: Delivery = FencedLog(settings, self.partitioned, self.stages, self.lock, self.health)
        #: ``transactions`` or ``fenced-log`` once chosen at start (``stream_eval_delivery_info``)
        self.delivery_mode: str | None = None
        #: Why the worker stopped by itself (:meth:`_stop_for`): the command raises it (exit code 2 for settings or
        #: topics that do not fit, as at start).
        self.fatal: Exception | None = None
        #: Input messages the broker deleted before this worker read them, per (topic, partition).
        self.input_lost: dict[tuple[str, int], int] = defaultdict(int)
        #: (topic, partition) -> the first offset the broker held when this worker last counted it lost: a fetch from
        #: before it again (another rebalance before the next checkpoint committed the offsets) counts nothing twice.
        self._lost_counted: dict[tuple[str, int], int] = {}
        #: (topic-partition, offset) of the fetches aiokafka found out of range since the last batch (FetcherLog).
        self.out_of_range: list[tuple[Any, int]] = []
        self._stop: asyncio.Event | None = None

    @property
    def handover_holds(self) -> int:
        """Hand-over holds begun (partitions taken from an owner that had not released them)."""
        return self.delivery.handover_holds

    def _stage_engine(self) -> Engine:
        """An engine for a regroup stage partition's share; the partitions' engines are built like it."""
        engine = Engine(self.config)
        engine.labels = self.labels
        RollingWindows(engine)  # attaches itself: live 5m/1h windows with open requests
        FeedbackDelays(engine)  # attaches itself: the feedback delay histogram
        engine.regroup = RegroupSink()  # sessions and query GSB across workers: engine/regroup.py
        return engine

    def shares(self) -> list[tuple[str, str, Engine]]:
        """``(partition, generation, engine)`` of each share of the totals this worker holds: one per input
        partition it owns, and one per regroup stage partition (``regroup``, ``regroup-1``, ...; exported with these
        labels)."""
        out = [(str(p), task.generation, task.engine) for p, task in self.partitioned.engines()]
        return out + self.stages.shares()

    def stage_view(self) -> Engine:
        """What the stage partitions held here hold, as one engine (the A/B rows, units and sign tests a readout
        exports; the label overflow and event time of this worker)."""
        return self.stages.view(self.labels, self.engine.watermark)

    def totals(self) -> Engine:
        """This worker's totals as one engine (for a report)."""
        return self.partitioned.totals()

    def report(self) -> dict[str, Any]:
        """The report of what this worker holds (its input partitions' shares and its stage partitions': the A/B
        rows where it holds stage partition 0), with ``worker``: which partitions those are."""
        with self.lock:
            report = self.totals().report()
            held = {"input_partitions": sorted(self.partitioned.tasks), "stage_partitions": sorted(self.stages.held)}
        return {"worker": held, **report}

    # -- commits ------------------------------------------------------------------------------------
    async def checkpoint(self, partitions: list[int] | None = None, release: bool = False) -> None:
        """Commit ``partitions`` (default: all, and the stage partitions held): their outputs, checkpoints and
        offsets (:meth:`Delivery.commit`); with ``release`` the worker gives them up."""
        await self.delivery.commit(partitions, release)
        if partitions is None:
            await self.delivery.commit_stages(sorted(self.stages.held))
            if not release:
                await self.delivery.trim()

    async def on_stage_revoked(self, revoked: Any) -> None:
        async with self._busy:
            await self.delivery.release_stages(sorted(self.stages.held))

    async def on_stage_assigned(self, assigned: Any) -> None:
        async with self._busy:
            for tp in sorted(assigned, key=lambda tp: tp.partition):
                if tp.partition not in self.stages.held:
                    start = await self.delivery.claim_stage(tp.partition)
                    if start is not None:
                        self._stage_consumer.seek(tp, start)

    async def checkpoint_now(self, release: bool = False) -> None:
        """A checkpoint between two batches (e.g. before planned maintenance); with ``release``, the last one before
        the worker stops (see :meth:`checkpoint`)."""
        async with self._busy:
            await self.checkpoint(release=release)

    def readiness(self, stale_after: float = 30.0) -> tuple[bool, str]:
        """``(ready, reason)`` for ``/readyz``: the worker holds an assignment and has caught up with it, and the
        broker answers (not ready from the moment an outage counts, ``stream_eval_broker_up`` 0).

        Caught up: every assigned input partition is owned by the engine, and the consumer's position is at or
        past the high-water mark of the partition's latest fetch response, received less than ``stale_after``
        seconds ago. Read-only, and safe to call from another thread (the HTTP server's): it reads the consumer's
        state without awaiting anything; a rebalance under way reads as not ready.
        """
        if self._consumer is None or self._stage_consumer is None:
            return False, "starting: not connected to Kafka yet"
        down_since = self.health.down_since  # (read once: the worker's thread may end the outage meanwhile)
        if down_since is not None:
            return False, (f"the Kafka broker has not answered for {self.health.clock() - down_since:.0f}s "
                           f"({self.health.last_error})")
        try:
            # the input partitions and the regroup stage's: a worker may hold only the latter (more workers than
            # input partitions) and still export the A/B results
            assigned = [(consumer, owned, tp) for consumer, owned in ((self._consumer, self.partitioned.tasks),
                                                                    (self._stage_consumer, self.stages.held))
                        for tp in sorted(consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))]
            if not assigned:
                return False, "no partitions assigned (joining the consumer group)"
            now_ms = time.time() * 1000
            for consumer, owned, tp in assigned:
                where = f"{tp.topic}/{tp.partition}"
                if tp.partition not in owned:
                    return False, f"{where}: being assigned"
                behind, polled = _behind(consumer, tp), consumer.last_poll_timestamp(tp)
                if behind is None or polled is None:
                    return False, f"{where}: not fetched yet"
                if now_ms - polled > stale_after * 1000:
                    return False, f"{where}: no fetch answered for {(now_ms - polled) / 1000:.0f}s"
                if behind > 0:
                    return False, f"{where}: {behind} messages behind"
        except (AttributeError, AssertionError, RuntimeError, KeyError, TypeError) as error:
            return False, f"rebalancing ({type(error).__name__})"  # the assignment changed under us
        return True, f"caught up on {len(assigned)} partitions"

    # -- rebalancing --------------------------------------------------------------------------------
    async def on_partitions_revoked(self, revoked: Any) -> None:
        asked = time.monotonic()
        async with self._busy:
            revoking = sorted({tp.partition for tp in revoked} & set(self.partitioned.tasks))
            if not revoking:
                return
            log.info("revoking partitions %s (waited %.2fs for the batch in hand)", revoking,
                     time.monotonic() - asked)
            try:
                await self.checkpoint(revoking, release=True)
            finally:  # a task kept after it was given up would be stale when it comes back
                for partition in revoking:
                    self.delivery.drop(partition)
            log.info("revoked partitions %s in %.2fs", revoking, time.monotonic() - asked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self._pace_feedback()  # (at once, before a fetch can go out while the new partitions are claimed)
        async with self._busy:
            by_partition: dict[int, list[Any]] = defaultdict(list)
            seeks: list[tuple[Any, int]] = []
            for tp in assigned:
                by_partition[tp.partition].append(tp)
            grown = sorted(partition for partition in by_partition if partition >= self.partition_count)
            if grown:
                self._stop_for(TopicSettingsError(
                    f"input partitions {grown} assigned, but the input topics had {self.partition_count} partitions "
                    f"when this worker started: partitions were added to them while the group ran. Each input "
                    f"partition checkpoints to the partition of the same number of {self.settings.checkpoint_topic}, "
                    "the regroup stage waits for every input partition's event time, and requests in flight are now "
                    "split between partitions: stop the group's workers and start a new --group (docs/operations.md)"
                    ))
                return
            for partition, tps in sorted(by_partition.items()):
                if partition not in self.partitioned.tasks:
                    seeks += await self._claim(partition, tps)
            for tp, start in seeks:  # at the end, with nothing awaited after (the tasks drop what comes before)
                self._consumer.seek(tp, start)
            self._pace_feedback()  # (before the first fetch: a partition's rankings come first)
            log.info("assigned partitions %s", sorted(by_partition))

    def _stop_for(self, error: Exception) -> None:
        """Stop the worker (its loop ends after the batch in hand, with a last checkpoint of what it holds) for
        ``error``, which the command then prints: with exit code 2 for settings that do not fit (a ConfigError),
        else 1."""
        if self.fatal is None:
            log.error("stream-eval worker: stopping: %s", error)
            self.fatal = error
        if self._stop is not None:
            self._stop.set()

    async def _claim(self, partition: int, tps: list[Any]) -> list[tuple[Any, int]]:
        """Claim input partition ``partition`` (:meth:`Delivery.claim`); where to seek its topic-partitions ``tps``."""
        starts = await self.delivery.claim(partition)
        return [(tp, starts[kind]) for tp in tps if (kind := self.topics.type_of(tp.topic)) in starts]

    async def _claim_lost(self) -> None:
        """Claim again an input or stage partition whose transaction failed (:attr:`Transactions.lost`) when the
        consumer still holds it a session later, with no rebalance under way: no one else took it (a transaction that
        timed out, say, after a long broker outage); a worker that was replaced learns so from its group before then."""
        for stage in self._lost(self.delivery.lost_stages, self._stage_consumer, self.stages.held):
            start = await self.delivery.claim_stage(stage.partition)
            if start is not None:
                self._stage_consumer.seek(stage, start)
        lost = self._lost(self.delivery.lost, self._consumer, self.partitioned.tasks)
        for partition in sorted({tp.partition for tp in lost}):
            tps = [tp for tp in self._consumer.assignment() if tp.partition == partition]
            for tp, start in await self._claim(partition, tps):
                self._consumer.seek(tp, start)

    def _lost(self, lost: dict[int, float], consumer: Any, held: Mapping[int, Any]) -> list[Any]:
        """The topic-partitions of ``consumer`` whose partition was lost (``lost``: when), is not ``held`` again, and
        has stayed assigned here for a session since; the others leave ``lost``."""
        if not lost or _rebalancing(consumer):
            return []
        assigned = sorted(consumer.assignment(), key=lambda tp: (tp.partition, tp.topic))
        now, found = time.monotonic(), []
        for partition, when in sorted(lost.items()):
            if partition in held or partition not in {tp.partition for tp in assigned}:
                del lost[partition]
            elif now - when >= self.settings.session_timeout_ms / 1000:
                del lost[partition]
                log.warning("partition %d: still assigned here %.0f s after its transaction failed: claimed again",
                            partition, now - when)
                found += [tp for tp in assigned if tp.partition == partition]
        return found

    # -- the loop -----------------------------------------------------------------------------------
    async def _handle(self, batch: dict[Any, Any]) -> None:
        config = self.config
        not_after = self.wall_clock() + config.max_clock_skew
        type_of = self.topics.type_of
        # rankings first: feedback whose ranking came in the same batch then joins at once, not through the pending
        # table (each source keeps its own event time, so the order of a batch's topics changes no result)
        fetched = sorted(batch.items(), key=lambda item: _FEED_ORDER[type_of(item[0].topic)])
        with self.lock, collector_paused():
            for tp, records in fetched:
                if not records or tp.partition not in self.partitioned.tasks:
                    continue
                kind = type_of(tp.topic)
                joined = records if type(records) is Joined else None  # (else a list of aiokafka's records)
                offsets = [r.offset for r in records] if joined is None else joined.offsets
                task = self.partitioned.tasks[tp.partition]
                if task.sources[kind].received is None:
                    log.info("partition %d: first %s message read at offset %d", tp.partition, kind, offsets[0])
                if self.ubi is not None and kind != "judgment":  # UBI records, released as converted
                    for released in self.ubi.read(task, tp.partition, kind, tp.topic, records, not_after):
                        self._feed(tp.partition, *released)
                else:
                    values, stamps, line = ([r.value for r in records], [r.timestamp for r in records], None) \
                        if joined is None else (joined.values, joined.timestamps, joined.joined)
                    self._feed(tp.partition, kind, offsets, decode_message_chunk(
                        values, kind, config, _Timestamps(stamps), _Where(f"{tp.topic}/{tp.partition}@", offsets),
                        not_after=not_after, joined=line))
                self.events_seen += len(records)
            if self.ubi is not None:  # held UBI records that a topic gone silent no longer holds back
                for partition, released in self.ubi.release(self.partitioned.tasks, not_after):
                    self._feed(partition, *released)
            self.partitioned.tick()

    def _pace_feedback(self) -> None:
        """Pause the feedback partitions read ahead of their rankings, resume the others.

        A fetch holds several times more feedback events than rankings (they are smaller), so on a backlog the
        feedback of requests whose rankings are not read yet would wait in the join's pending table, the join's
        slow path, bounded by ``max_waiting_feedback`` (beyond it feedback is given up: a result replay does not
        have). A feedback partition is paused while its event time is more than :data:`_FEEDBACK_AHEAD` past its
        rankings', and those are still being read: the broker holds rankings the worker has not been handed
        (:func:`_behind`), or some were fed within :data:`_RANKINGS_QUIET`. A rankings partition that ended, or is
        caught up and went quiet, never holds its feedback back. Before any of its rankings is fed, a partition's
        feedback counts as ahead, and before it is claimed it is paused: on assignment (called then too, before
        the claims and after them) its rankings are read first, for at most :data:`_RANKINGS_QUIET` when the broker
        turns out to hold none (docs/benchmarks.md, "Rankings first on assignment")."""
        consumer = self._consumer
        if consumer is None or self.ubi is not None:
            return
        now = self.partitioned.clock()
        topic = self.topics.feedback
        pause, resume = [], []
        paused = consumer.paused()
        assigned = consumer.assignment()
        rankings_tp = {tp.partition: tp for tp in assigned if tp.topic == self.topics.rankings}
        for tp in assigned:
            if tp.topic != topic:
                continue
            task = self.partitioned.tasks.get(tp.partition)
            ahead = task is None  # (not claimed yet: nothing of it can be fed)
            if task is not None and not task.rebuilding:
                rankings, feedback = task.sources["ranking"], task.sources["feedback"]
                read = rankings_tp.get(tp.partition)
                # (no rankings fed yet: any feedback is ahead, the first fetch of a partition included)
                lead = feedback.watermark - rankings.watermark if rankings.watermark > -math.inf else math.inf
                ahead = (lead > _FEEDBACK_AHEAD and not rankings.ended
                         and (now - rankings.heard < _RANKINGS_QUIET
                              or read is not None and (_behind(consumer, read) or 0) > 0))
            if ahead and tp not in paused:
                pause.append(tp)
            elif not ahead and tp in paused:
                resume.append(tp)
        if pause:
            consumer.pause(*pause)
        if resume:
            consumer.resume(*resume)

    def _feed(self, partition: int, kind: str, offsets: list[int], events: Any) -> None:
        """Feed messages of one input topic-partition to the engine; the invalid ones go to the dead letters."""
        for event in self.partitioned.feed(kind, partition, offsets, events):
            # where it was read: a partition rebuilding returns, once rebuilt, what other topics held back too
            place, _, offset = event.where.rpartition("@")
            topic, _, number = place.rpartition("/")
            self.delivery.dead_letter(event, topic, int(number), int(offset))

    async def _next_input(self, waited: int) -> dict[Any, Any]:
        """The input's next batch. With none to hand out, and nothing for the stage either, the loop waits up to
        ``waited`` ms for records of either consumer, whichever come first: the stage's records are applied as they
        come, not after an input fetch's timeout (docs/design.md, "the regroup log")."""
        batch = await self._fetch(self._consumer, 0)
        stage = self._stage_consumer
        # (the input's records held: stored while a fetch error was waited out; the stage's: while the loop worked)
        if batch or not waited or _holds_records(self._consumer) or _holds_records(stage) and not _rebalancing(stage):
            return batch
        await _wait_for_records((self._consumer, self._stage_consumer), waited)
        return await self._fetch(self._consumer, 0)

    async def _handle_stage(self) -> int:
        """Apply the regroup records fetched for the stage partitions held; returns how many were fetched."""
        # aiokafka's getmany waits, timeout or not, for a rebalance of the consumer's group to end; the stage's
        # rebalance callbacks wait for _busy, held here: fetching now would deadlock both groups
        if _rebalancing(self._stage_consumer):
            return 0
        batch = await self._fetch(self._stage_consumer, 0)
        fetched = 0
        with self.lock, collector_paused():
            for tp, records in batch.items():
                fetched += len(records)
                if records and tp.partition in self.stages.held:
                    self.stages.feed(tp.partition, [r.offset for r in records], [r.value for r in records])
        return fetched

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Consume until ``stop`` is set (or the task is cancelled); checkpoints on the way out."""
        from aiokafka import AIOKafkaConsumer
        from aiokafka.abc import ConsumerRebalanceListener
        from aiokafka.coordinator.assignors.range import RangePartitionAssignor

        settings = self.settings
        _quiet_client_debug_logs()
        await self.health.call("startup", self._prepare_topics)  # waits, with backoff, for a broker to answer

        worker = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
            def __init__(self, revoked: Rebalance, assigned: Rebalance) -> None:
                self.revoked, self.assigned = revoked, assigned

            async def on_partitions_revoked(self, revoked: Any) -> None:
                await self.revoked(revoked)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                try:
                    await self.assigned(assigned)
                except Exception as error:  # (aiokafka logs a listener's error and goes on: the partitions would
                    worker._stop_for(error)  # stay unclaimed for ever, the worker looking healthy)

        await self._choose_delivery()
        security = client_options(settings.security)
        common = {"bootstrap_servers": settings.brokers, "enable_auto_commit": False, "auto_offset_reset": "earliest",
                  "isolation_level": self.delivery.isolation_level, "fetch_max_wait_ms": _FETCH_WAIT_MS,
                  "session_timeout_ms": settings.session_timeout_ms,
                  "heartbeat_interval_ms": settings.heartbeat_interval_ms, **security}
        self._consumer = AIOKafkaConsumer(  # (the input's values in one buffer, but for UBI's records)
            group_id=settings.group, **common, **{**lean_options(joined=self.ubi is None), **settings.extra},
            partition_assignment_strategy=(RangePartitionAssignor,),  # partition p of every input topic together
            max_partition_fetch_bytes=4 << 20, fetch_max_bytes=32 << 20, fetch_min_bytes=_FETCH_MIN_BYTES,
        )
        self._stage_consumer = AIOKafkaConsumer(group_id=f"{settings.group}.regroup", **common,
                                                **{**lean_options(), **settings.extra})
        for client in (self._consumer, self._stage_consumer):
            await self.health.call("startup", client.start)
        await self.delivery.start(self._consumer, self._stage_consumer)
        self._consumer.subscribe(list(self.topics.inputs),
                                 listener=Listener(self.on_partitions_revoked, self.on_partitions_assigned))
        self._stage_consumer.subscribe([settings.regroup_topic],
                                       listener=Listener(self.on_stage_revoked, self.on_stage_assigned))
        stop = self._stop = stop or asyncio.Event()
        last_checkpoint = time.monotonic()
        committed = 0  # input messages read at the last checkpoint
        stage_records = stage_read = 0  # regroup records: of the last fetch, all read
        shown = (0, 0)  # input messages and regroup records read at the last readout taken soon
        behind = False  # the input consumer was behind the broker at the end of the last iteration
        behind_since = math.inf  # since when the input consumer has been behind the broker (inf: it is not)
        read_pending = False  # a readout soon was due and refused (the latest was too recent)
        in_backlog = False  # behind the broker for _BACKLOG_AFTER, and not idle since
        fetcher_log = FetcherLog.installed()
        fetcher_log.seen.append(self.out_of_range)
        fetcher_log.healths.append(self.health)
        try:
            await self._warm_up()
            while not stop.is_set():
                batch = await self._next_input(_input_wait(stage_records, read_pending, in_backlog and not behind))
                async with self._busy:
                    await self._handle(batch)
                    if self.out_of_range:
                        await self._count_lost_input()
                    self._pace_feedback()
                    stage_records = await self._handle_stage()
                    stage_read += stage_records
                    if stage_records:  # partition 0 folds a boundary once every stage partition's looks are in
                        await self.delivery.report_looks()
                    await self._claim_lost()
                    if self.between_batches is not None:
                        with collector_paused():
                            self.between_batches()
                    # a readout at once when the first events are counted, when the worker goes idle after new work
                    # (the end of a backlog, a quiet stream), and after new work under live traffic (not behind the
                    # broker for _BACKLOG_AFTER): /metrics then shows the state within a poll
                    idle = not batch and not stage_records
                    now, behind = time.monotonic(), _lagging(self._consumer)
                    behind_since = min(behind_since, now) if behind else math.inf
                    live = now - behind_since < _BACKLOG_AFTER
                    in_backlog = (in_backlog or not live) and not idle
                    read = (self.events_seen, stage_read)
                    read_pending = False
                    if self.readout_soon is not None and read != shown and (shown[0] == 0 or idle or live):
                        read_pending = not self.readout_soon(_settled(idle, behind))
                        shown = shown if read_pending else read
                    # the outputs go with the checkpoints, once no other worker has claimed their partitions; a
                    # worker that has read all there is commits what it read at once (its outputs, the regroup
                    # records other workers' stage partitions wait for, and its stage partitions' looks, which stage
                    # partition 0 waits for), at most every _CAUGHT_UP_COMMITS of the interval; not while the broker
                    # holds input it has not handed out (a backlog: the next fetch is on its way)
                    since = time.monotonic() - last_checkpoint
                    caught_up = idle and not behind and (self.events_seen != committed or self.stages.reporting())
                    if since >= settings.checkpoint_interval or (
                            caught_up and since >= settings.checkpoint_interval * _CAUGHT_UP_COMMITS):
                        await self.checkpoint()
                        last_checkpoint, committed = time.monotonic(), self.events_seen
        finally:
            fetcher_log.seen.remove(self.out_of_range)
            fetcher_log.healths.remove(self.health)
            # with the broker unreachable there is nothing to checkpoint to, nor a group to leave
            up = self.health.up
            if up:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.checkpoint_now(release=True), _SHUTDOWN_TIMEOUT)
            stops = [client.stop for client in (self._consumer, self._stage_consumer) if client is not None]
            for stop_client in [*stops, self.delivery.stop]:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(stop_client(), _SHUTDOWN_TIMEOUT if up else _SHUTDOWN_UNREACHABLE)
            for partition in list(self.partitioned.tasks):  # every share went with the final checkpoints
                self.delivery.drop(partition)
            with self.lock:
                for stage in list(self.stages.held):
                    self.stages.give_up(stage)

    async def _warm_up(self) -> None:
        """Load the compiled loops (:func:`warm_up`) while the groups form: in a thread, so that the event loop goes
        on with the joins meanwhile (the broker holds a new group's first join for its initial rebalance delay, 3 s by
        default; Tansu holds each member's for half its session timeout), and a worker starts its work that much
        sooner than when it warmed up before joining. A first batch that comes sooner waits for the loops it calls
        (numba compiles and loads under one lock)."""
        def run() -> None:
            try:
                warm_up(self.config)
            except Exception as error:  # (only a speed-up: a configuration it does not fit must not stop the worker)
                log.info("warm-up of the compiled loops skipped: %s: %s", type(error).__name__, error)

        await asyncio.to_thread(run)

    async def _choose_delivery(self) -> None:
        """Transactions where the broker runs them (``delivery`` auto or transactions), else the fenced log (whose
        producer is idempotent where the broker allows it)."""
        settings = self.settings
        supported = await transactions_supported(settings)
        refuse_transactions(settings, supported)
        chosen = "transactions" if supported and settings.delivery != "fenced-log" else "fenced-log"
        self.delivery = DELIVERIES[chosen](settings, self.partitioned, self.stages, self.lock, self.health)
        self.delivery_mode = chosen
        if isinstance(self.delivery, FencedLog):
            self.delivery.idempotent = supported
        log.info("delivery: %s%s", chosen, " (idempotent producer)" if chosen == "fenced-log" and supported else "")

    async def _prepare_topics(self) -> None:
        """Create the topics and count the input partitions: one start-up attempt, bounded by ``_STARTUP_ATTEMPT``
        seconds."""
        settings = self.settings
        self.partition_count, stages = await prepare_topics(settings, _STARTUP_ATTEMPT)
        self.stages.inputs, self.stages.count = self.partition_count, stages
        self.partitioned.stages = stages

    async def _count_lost_input(self) -> None:
        """The input consumer was to read offsets that the broker no longer holds (:class:`FetcherLog` saw aiokafka
        say so, and it reads on from the earliest offset held): deleted by retention before they were read, or the
        topic was deleted and made again. Counts what was lost (:attr:`input_lost`, ``stream_eval_input_lost_total``)
        and says so."""
        seen, self.out_of_range[:] = list(self.out_of_range), []
        consumer = self._consumer
        assigned = consumer.assignment()
        offsets = {tp: offset for tp, offset in seen if tp in assigned}
        if not offsets:
            return
        tps = list(offsets)
        first = await self.health.call("fetch", lambda: consumer.beginning_offsets(tps))
        end = await self.health.call("fetch", lambda: consumer.end_offsets(tps))
        for tp in tps:
            offset, held = int(offsets[tp]), int(first[tp])
            counted_to = self._lost_counted.get((tp.topic, tp.partition), 0)
            if offset < held <= counted_to:
                continue  # counted already: the same deleted offsets found out of range again
            if offset < held:
                # a new owner re-reads from its checkpoint's start: what lies before the checkpoint's end was read
                # once (and is needed again for the requests open then), what lies after it never
                task = self.partitioned.tasks.get(tp.partition)
                kind = self.topics.type_of(tp.topic)
                read_to = offset if task is None else task.mute.get(kind, offset)
                lost = max(held - max(offset, read_to, counted_to), 0)
                self.input_lost[tp.topic, tp.partition] += lost
                self._lost_counted[tp.topic, tp.partition] = held
                log.warning("%s/%d: offsets %d to %d were deleted by the broker (its retention) before this worker "
                            "read them: %d messages never read, counted in stream_eval_input_lost_total, and %d read "
                            "before its checkpoint that the requests open then miss; reading on from %d "
                            "(docs/operations.md, \"Lost input\")", tp.topic, tp.partition, offset, held - 1,
                            lost, min(held, read_to) - offset, held)
            else:
                log.error("%s/%d: the broker holds offsets %d to %d, and this worker was to read from %d: the topic "
                          "was deleted and made again (or cut) under the running group; reading on from %d, where "
                          "the messages before offset %d are taken as read already. Start a new --group to read it "
                          "whole (docs/operations.md, \"Lost input\")", tp.topic, tp.partition, held, int(end[tp]) - 1,
                          offset, held, offset)

    async def _fetch(self, consumer: Any, timeout_ms: int) -> dict[Any, Any]:
        """``getmany``; a broker error is counted and waited out (backoff), and gives an empty batch. A fetch request
        that failed inside aiokafka (which retries it) gives an empty batch too; :class:`FetcherLog` counts it, and
        the checkpoints mark the outage."""
        try:
            batch: dict[Any, Any] = await consumer.getmany(timeout_ms=timeout_ms,
                                                           max_records=self.settings.max_records)
        except Exception as error:
            if not is_broker_error(error):
                raise
            self.health.failed("fetch", error)
            await asyncio.sleep(self._fetch_backoff.next())
            return {}
        if batch:
            self._fetch_backoff.reset()
            self.health.answered()
            # aiokafka asks the broker for a partition's next records only once its last ones are handed out, from
            # its fetcher's task: let that task send the requests now, so that the broker answers while this batch
            # is handled (otherwise they go out only at the next await, after the batch, and are waited for)
            for _ in range(_FETCH_TICKS):
                await asyncio.sleep(0)
        return batch
