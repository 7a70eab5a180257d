"""The faust application of ``stream-eval worker``: lifecycle, sensors, control topic; data through StreamWorker.

faust runs the worker process (signals, logging, services) and a small control topic
(``<prefix><group>.control``, JSON commands ``{"command": "checkpoint"}`` or ``{"command": "report"}``). The
input topics are consumed by :class:`~stream_eval.stream.worker.StreamWorker`, a future of the app started with it,
in batches: faust's per-message path would cap the worker near 6,500 events/s (see ``docs/design.md``).

No faust.App is built at import time here; ``stream_eval.stream.entry`` is the module for ``faust -A``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import json
import logging
import logging.config
import os
import shutil
import signal
import sys
import tempfile
import threading
from typing import Any

import faust
import orjson

from stream_eval.config import Config
from stream_eval.stream.kafka import PLAINTEXT, KafkaSecurity
from stream_eval.stream.settings import WorkerSettings
from stream_eval.stream.worker import StreamWorker, prepare_topics

log = logging.getLogger("stream_eval.worker")
LOG_FORMATS = ("text", "json")
#: Seconds a stop (SIGTERM) waits for the last checkpoint and the group leave (the worker bounds each to 30 s), and
#: how long with the broker unreachable (then the process exits without waiting for faust's clients).
_STOP_TIMEOUT = 75.0
_STOP_UNREACHABLE = 10.0
#: Seconds between two returns of the C heap's free pages to the OS (:func:`release_free_heap`).
RELEASE_HEAP_EVERY = 60.0
#: Seconds between two readouts of what /metrics exports, taken by the worker between batches, how old the readout
#: a scrape shows may be, and how long a scrape of an older one waits for the batch in progress before it shows it
#: after all (``EngineCollector``'s ``refresh_every``, ``max_age`` and ``max_wait``; README, "Prometheus").
METRICS_REFRESH_EVERY, METRICS_MAX_AGE, METRICS_MAX_WAIT = 1.0, 1.5, 1.0
#: The worker takes those readouts while the last two scrapes came within this many seconds of each other and of now
#: (``EngineCollector``'s ``watched_for``): a live view or a test scraping every second or two gets them; Prometheus
#: scraping every 5 s (deploy/prometheus) or 15 s gets a readout made at its scrape, and a worker nobody scrapes
#: takes none (docs/benchmarks.md, "Readouts when scraped").
METRICS_WATCHED_FOR = 3.0
#: Seconds between two of those periodic readouts that re-evaluate the open requests of the live windows (a worker
#: busy on a backlog, which takes readouts once a second; ``EngineCollector``'s ``open_every``): a readout costs in
#: proportion to the open requests changed since the last, and a backlog changes them all (docs/benchmarks.md,
#: "Open requests in a busy worker's readouts"). A scrape's own readout, and the one a worker takes as it goes idle,
#: re-evaluate them always.
METRICS_OPEN_EVERY = 5.0
#: The garbage collector's thresholds in a worker (:func:`quiet_gc`; Python's default is 700, 10, 10).
GC_THRESHOLDS = (20_000, 20, 10)


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``message`` (and ``exc``).

    ``secrets`` are replaced by ``***`` wherever they would appear (a second guard: nothing logs them).
    """

    def __init__(self, secrets: list[str] | None = None) -> None:
        super().__init__()
        self.secrets = [secret for secret in secrets or [] if secret]

    def format(self, record: logging.LogRecord) -> str:
        from datetime import UTC, datetime

        entry = {"ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z",
                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        line = json.dumps(entry, ensure_ascii=False, default=str)
        for secret in self.secrets:
            line = line.replace(json.dumps(secret, ensure_ascii=False)[1:-1], "***")
        return line


def log_options(log_format: str, loglevel: str, security: KafkaSecurity | None = None) -> dict[str, Any]:
    """Keyword arguments of faust's ``Worker`` for ``--log-format``: JSON lines on stdout, or faust's text."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: expected one of {', '.join(LOG_FORMATS)}")
    if log_format == "text":
        return {}
    level = "WARNING" if loglevel == "warn" else loglevel.upper()
    secrets = [s for s in (security.sasl_password, security.ssl_key_password) if s] if security else []
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonLogFormatter, "secrets": secrets}},
        "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stdout",
                              "level": level}},
        "root": {"level": level, "handlers": ["json"]},
    }
    return {"logging_config": config, "quiet": True}  # quiet: no banner, every line is JSON




#: glibc's ``mallopt`` parameters ``M_TRIM_THRESHOLD`` and ``M_MMAP_THRESHOLD`` (malloc.h), and the bytes the
#: worker sets them to (:func:`tune_malloc`).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
TRIM_THRESHOLD, MMAP_THRESHOLD = 64 << 20, 16 << 20


def tune_malloc() -> bool:
    """Have glibc serve allocations under :data:`MMAP_THRESHOLD` bytes from its heap, reusing freed blocks, and keep up
    to :data:`TRIM_THRESHOLD` bytes free at the heap's top (``mallopt``); ``False`` (nothing done) where the C library
    has no ``mallopt``, or where the environment sets glibc's malloc tunables itself (``MALLOC_*_``,
    ``GLIBC_TUNABLES``: they win).

    A worker's batches allocate and free blocks of 128 KiB to a few MiB all the time (fetched records, decoded
    columns, regroup records). Mapped from the OS one by one and unmapped when freed, each came back as fresh zeroed
    pages: faulting them in was a quarter of the worker's CPU time (docs/benchmarks.md). From the heap they are
    reused. glibc would raise its threshold by itself, to the size of each mapped block freed, but the thresholds set
    here also stop that drifting; the free pages that the heap keeps go back to the OS every ``RELEASE_HEAP_EVERY``
    seconds (:func:`release_free_heap`). What the heap keeps shows in RSS: bench/soak.py measures it.
    """
    if "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") and k.endswith("_") for k in os.environ):
        return False
    mallopt = _libc("mallopt")
    return (mallopt is not None and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
            and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)))


def _libc(name: str) -> Any:
    """The C library's function ``name``, or ``None`` where it has none (not glibc)."""
    import ctypes

    return getattr(ctypes.CDLL(None), name, None)


def release_free_heap() -> bool:
    """Give the free pages of the C heap back to the OS: glibc's ``malloc_trim(0)``; ``False`` (nothing done) where
    the C library has none.

    A worker's heap keeps the pages of freed temporaries (decoded batches, the A/B snapshot and windows shares,
    arrays that grew), and glibc returns them only from the top of the heap: without this, RSS creeps up long after
    the state has stopped growing (bench/soak.py measures both). Called every ``RELEASE_HEAP_EVERY`` seconds.
    """
    trim = _libc("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def quiet_gc() -> None:
    """Move what the process holds at start (faust, aiokafka, numba and their modules) out of the cyclic garbage
    collector's sight, and let it run less often: the batches make many short-lived containers that reference
    counting frees, and each collection of the oldest generation walked every object of the process (replay
    turns the collector off; a worker, which runs for ever, keeps it)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def create_app(settings: WorkerSettings, config: Config, registry: Any = None,
               lock: threading.Lock | None = None) -> tuple[faust.App, StreamWorker]:
    """The faust app and the worker it runs; faust's sensors go to ``registry`` when one is given."""
    worker = StreamWorker(settings, config, lock)
    datadir = os.path.join(tempfile.gettempdir(), f"stream-eval-{settings.group}-{os.getpid()}")
    stop, stopped = asyncio.Event(), asyncio.Event()

    async def evaluate() -> None:
        quiet_gc()
        try:
            await worker.run(stop)
        finally:
            stopped.set()
        if worker.fatal is not None:  # (the worker stopped by itself: faust stops as on SIGTERM, run_worker exits 2)
            os.kill(os.getpid(), signal.SIGTERM)

    class WorkerApp(faust.App):
        async def on_first_start(self) -> None:
            """The data plane starts with the app: a faust task would start only once faust's own consumer has
            joined its group (the control topic's), and the input's group join would come after that one's (each
            held by the broker's initial rebalance delay, 3 s by default)."""
            await super().on_first_start()
            self.add_future(evaluate())

    app = WorkerApp(
        f"{settings.prefix}{settings.group}-control",
        broker=[f"kafka://{address}" for address in settings.brokers],
        datadir=datadir,
        web_enabled=False,
        autodiscover=False,
        broker_session_timeout=6,  # the development broker holds JoinGroup for session_timeout / 2
        broker_heartbeat_interval=1,
        topic_partitions=1,
        topic_replication_factor=settings.replication_factor,  # faust's own topic (<app id>-__assignor-__leader)
        stream_wait_empty=False,
        broker_credentials=settings.security.faust_credentials() if settings.security else None,
    )
    control = app.topic(settings.control_topic, value_serializer="json", partitions=1)

    @app.agent(control)
    async def commands(stream: Any) -> None:
        async for command in stream:
            name = command.get("command") if isinstance(command, dict) else None
            if name == "checkpoint":
                await worker.checkpoint_now()
                log.warning("checkpoint written on request")
            elif name == "report":  # (one line of JSON: what this worker holds, as /report gives it)
                log.warning("report: %s", orjson.dumps(worker.report()).decode())
            else:
                log.warning("unknown control command %r", command)

    @app.timer(RELEASE_HEAP_EVERY)  # type: ignore[untyped-decorator]  # faust's timer decorator has no types
    async def release_heap() -> None:
        release_free_heap()

    @app.on_before_shutdown.connect  # type: ignore[arg-type]  # faust types handlers as taking `signal=`
    async def graceful_stop(sender: Any, **_: Any) -> None:
        """SIGTERM / Ctrl-C: the loop ends, the last checkpoint is written and the group left, before faust
        closes the event loop (which would drop the task mid-way)."""
        stop.set()
        loop = asyncio.get_running_loop()
        deadline, unreachable_since = loop.time() + _STOP_TIMEOUT, None
        while not stopped.is_set():  # (a second at a time: the broker may be found unreachable meanwhile)
            now = loop.time()
            if worker.health.up:
                unreachable_since = None
            elif unreachable_since is None:
                unreachable_since = now
            if now >= deadline or unreachable_since is not None and now - unreachable_since >= _STOP_UNREACHABLE:
                log.error("stream-eval worker: no clean stop within %.0fs (checkpoint or group leave pending)",
                          now - deadline + _STOP_TIMEOUT)
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), 1.0)
        if stopped.is_set() and worker.health.up:
            log.warning("stream-eval worker: stopped: final checkpoint done, Kafka clients closed (group left)")
        elif not worker.health.up:  # (a checkpoint retrying, and faust's own clients, would wait minutes for it)
            log.error("stream-eval worker: stopped without a final checkpoint: the broker is unreachable (the next "
                      "owner of its partitions resumes from the last checkpoint stored)")
            logging.shutdown()
            shutil.rmtree(datadir, ignore_errors=True)  # (run_worker's own removal is skipped by the exit below)
            os._exit(0)

    if registry is not None:
        from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor

        app.monitor = PrometheusMonitor(metrics=FaustMetrics.create(registry, "faust"))
    return app, worker


def run_worker(settings: WorkerSettings, config: Config, metrics_port: int, loglevel: str = "warn", *,
               metrics_host: str = "0.0.0.0", log_format: str = "text") -> int:
    """``stream-eval worker``: the faust worker in the foreground; ``/metrics``, ``/healthz`` and ``/readyz`` on
    ``metrics_host:metrics_port``; logs as text or JSON lines (``log_format``). SIGTERM or Ctrl-C: a last
    checkpoint, the consumer group left, exit code 0."""
    from faust.worker import Worker
    from prometheus_client import CollectorRegistry

    from stream_eval.export.prometheus import CountsCollector, EngineCollector, InfoCollector, serve_metrics
    from stream_eval.stream.produce import run_interruptible

    tune_malloc()  # (before the worker allocates anything large)
    logging_options = log_options(log_format, loglevel, settings.security)
    if log_format == "json":  # from the first line on, before faust sets logging up with the same options
        logging.config.dictConfig(copy.deepcopy(logging_options["logging_config"]))  # dictConfig consumes it
    if settings.prefix and settings.group == WorkerSettings.group:
        log.warning("stream-eval worker: the consumer groups %s and %s.regroup carry no topic prefix: a deployment "
                    "with another --topic-prefix and the default --group shares them (give each its own --group)",
                    settings.group, settings.group)
    registry = CollectorRegistry()
    lock = threading.Lock()
    app, worker = create_app(settings, config, registry, lock)
    collector = EngineCollector(worker.stage_view, lock=lock, registry=registry, broker=worker.health,
                                shares=worker.shares, refresh_every=METRICS_REFRESH_EVERY, max_age=METRICS_MAX_AGE,
                                max_wait=METRICS_MAX_WAIT, watched_for=METRICS_WATCHED_FOR,
                                open_every=METRICS_OPEN_EVERY)
    InfoCollector("stream_eval_delivery_info", "1 for how the worker makes its results exactly-once: transactions "
                  "or fenced-log.", "mode", lambda: worker.delivery_mode, registry)
    CountsCollector("stream_eval_input_lost", "Input messages the broker deleted before the worker read them "
                    "(retention shorter than an outage, a topic deleted and made again), by topic and partition.",
                    ["topic", "partition"],
                    lambda: {(topic, str(p)): float(n) for (topic, p), n in list(worker.input_lost.items())}, registry)
    collector.take()  # a readout from the start: a scrape never has to wait for the first batches to end
    worker.between_batches, worker.readout_soon = collector.refresh, collector.refresh_soon
    server = serve_metrics(registry, metrics_port, metrics_host, readiness=worker.readiness, report=worker.report)
    log.warning("stream-eval worker: /metrics, /healthz, /readyz, /report on %s:%d, brokers %s (%s), topics %s*",
                metrics_host, metrics_port, ",".join(settings.brokers), (settings.security or PLAINTEXT).describe(),
                settings.prefix)
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the outage is logged once (stream/backoff.py), not per connection attempt
    try:  # faust needs a broker to start: wait for one, /metrics up (stream_eval_broker_up 0), retrying with backoff
        _, interrupted = run_interruptible(worker.health.call("startup", lambda: prepare_topics(settings, 5)))
    except BaseException:  # topics with settings that do not fit (TopicSettingsError, exit code 2), Ctrl-C
        server.stop()
        raise
    finally:
        quiet.setLevel(level)
    if not interrupted and settings.delivery == "transactions":  # refused before faust starts: one line, exit 2
        from stream_eval.stream.delivery import refuse_transactions, transactions_supported

        supported, interrupted = run_interruptible(transactions_supported(settings))
        if not interrupted and not supported:
            server.stop()
            refuse_transactions(settings, supported=False)
    if interrupted:
        server.stop()
        return 0
    try:
        faust_worker = Worker(app, loglevel=loglevel, **logging_options)
        if log_format == "json" or not sys.stdout.isatty():  # faust's spinner writes terminal codes on stdout
            faust_worker.spinner = None
        faust_worker.execute_from_commandline()
        code = 0
    except SystemExit as done:
        code = int(done.code or 0)
    finally:
        server.stop()
        shutil.rmtree(app.conf.datadir, ignore_errors=True)  # faust's, made for this process
    if worker.fatal is not None:  # (a ConfigError: its message, exit code 2; anything else exit code 1)
        raise worker.fatal
    return code
