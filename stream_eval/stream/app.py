"""The faust application of ``stream-eval worker``: lifecycle, sensors, control topic; data through StreamWorker.

faust runs the worker process (signals, logging, services) and a small control topic
(``<prefix><group>.control``, JSON commands ``{"command": "checkpoint"}`` or ``{"command": "report"}``). The
input topics are consumed by :class:`~stream_eval.stream.worker.StreamWorker`, a faust task, in batches:
faust's per-message path would cap the worker near 6,500 events/s (see ``docs/design.md``).

No faust.App is built at import time here; ``stream_eval.stream.entry`` is the module for ``faust -A``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import threading
from typing import Any

import faust

from stream_eval.config import Config
from stream_eval.stream.kafka import ensure_topics
from stream_eval.stream.worker import StreamWorker, WorkerSettings

log = logging.getLogger("stream_eval.worker")


def create_app(settings: WorkerSettings, config: Config, registry: Any = None,
               lock: threading.Lock | None = None) -> tuple[faust.App, StreamWorker]:
    """The faust app and the worker it runs; faust's sensors go to ``registry`` when one is given."""
    worker = StreamWorker(settings, config, lock)
    datadir = os.path.join(tempfile.gettempdir(), f"stream-eval-{settings.group}-{os.getpid()}")
    app = faust.App(
        f"{settings.prefix}{settings.group}-control",
        broker=[f"kafka://{address}" for address in settings.brokers],
        datadir=datadir,
        web_enabled=False,
        autodiscover=False,
        broker_session_timeout=6,  # the development broker holds JoinGroup for session_timeout / 2
        broker_heartbeat_interval=1,
        topic_partitions=1,
        stream_wait_empty=False,
    )
    control = app.topic(settings.control_topic, value_serializer="json", partitions=1)

    @app.agent(control)
    async def commands(stream: Any) -> None:
        async for command in stream:
            name = command.get("command") if isinstance(command, dict) else None
            if name == "checkpoint":
                await worker.checkpoint_now()
                log.warning("checkpoint written on request")
            elif name == "report":
                with worker.lock:
                    report = worker.engine.report()
                log.warning("report: %s", report)
            else:
                log.warning("unknown control command %r", command)

    @app.task  # type: ignore[untyped-decorator]  # faust's task decorator has no types
    async def evaluate() -> None:
        await worker.run()

    if registry is not None:
        from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor

        app.monitor = PrometheusMonitor(metrics=FaustMetrics.create(registry, "faust"))
    return app, worker


def run_worker(settings: WorkerSettings, config: Config, metrics_port: int, loglevel: str = "warn") -> int:
    """``stream-eval worker``: the faust worker in the foreground, ``/metrics`` on ``metrics_port``."""
    from faust.worker import Worker
    from prometheus_client import CollectorRegistry

    from stream_eval.export.prometheus import EngineCollector, serve_metrics

    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # one clear message below, not one per connection attempt
    try:  # a clear message instead of faust's traceback when the broker is not there
        asyncio.run(ensure_topics(settings.brokers, [*settings.topics.inputs, settings.control_topic],
                                  settings.partitions, timeout=30))
    except TimeoutError:
        print(f"stream-eval worker: no Kafka broker answers at {','.join(settings.brokers)} (start one with "
              "`stream-eval broker`, or give --broker)", file=sys.stderr)
        return 2
    finally:
        quiet.setLevel(level)
    registry = CollectorRegistry()
    lock = threading.Lock()
    app, worker = create_app(settings, config, registry, lock)
    EngineCollector(worker.engine, lock=lock, registry=registry)
    server = serve_metrics(registry, metrics_port)
    log.warning("stream-eval worker: /metrics on port %d, brokers %s, topics %s*", metrics_port,
                ",".join(settings.brokers), settings.prefix)
    try:
        Worker(app, loglevel=loglevel).execute_from_commandline()
    except SystemExit as done:
        return int(done.code or 0)
    finally:
        server.stop()
    return 0
