"""Send JSON Lines events to the input topics: ``stream-eval produce``, ``stream-eval simulate --broker``, the demo.

Each line goes out unchanged (the worker validates and counts bad lines), routed by its ``"type"``:
``ranking`` -> rankings, ``feedback`` -> feedback, ``judgment`` -> judgments, keyed as :func:`event_key` says,
with the event's ``ts`` as the message timestamp. A line whose JSON is broken or whose type is unknown goes to
the rankings topic with no key, so that the worker still sees and counts it. A watermark line
(``{"type": "watermark", "ts": T}``) is copied to every partition of every input topic, and at the end an
end-of-stream watermark (``{"type": "watermark", "end": true}``) goes to every partition of every input topic
so that the worker finalises every open request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from stream_eval.events.schema import DECODE_ERRORS, EventError, parse_time
from stream_eval.stream.backoff import BrokerHealth, BrokerTimeout, is_broker_error
from stream_eval.stream.kafka import (
    DEFAULT_PARTITIONS,
    KafkaSecurity,
    KafkaSecurityError,
    Topics,
    client_options,
    ensure_topics,
    event_key,
    idempotence_supported,
    input_partitions,
    kafka_security,
    parse_brokers,
)

__all__ = [
    "END_WATERMARK",
    "WATERMARKS",
    "Routed",
    "BROKER_TIMEOUT",
    "SendError",
    "file_lines",
    "format_counts",
    "route_line",
    "run_interruptible",
    "send_lines",
]

END_WATERMARK = b'{"type":"watermark","end":true}'
"""The end-of-stream watermark sent to every partition of every input topic (docs/contract.md §1)."""

WATERMARKS = "watermarks"
"""Key of the :func:`send_lines` counter that counts watermark messages (one per partition they went to)."""

_YIELD_EVERY = 1000
#: Default of ``--broker-timeout``: seconds the broker may stay unreachable before ``produce`` gives up.
BROKER_TIMEOUT = 300.0
#: Seconds without a delivery, records waiting, after which the broker counts as down (logged once).
_STALL = 10.0
#: Seconds one attempt to reach the broker at start may take before it is retried (with backoff).
_ATTEMPT = 5.0
log = logging.getLogger("stream_eval.produce")
_T = TypeVar("_T")


class SendError(RuntimeError):
    """Some messages could not be delivered."""


class _Head(msgspec.Struct):
    """The only fields routing needs; the rest of the line is skipped by the decoder."""

    type: Any = None
    ts: Any = None
    request_id: Any = None
    query_id: Any = None


_decode_head = msgspec.json.Decoder(_Head).decode


@dataclass(frozen=True, slots=True)
class Routed:
    """Where one line goes.

    Attributes:
        value: The line, without its line ending.
        topic: Destination topic; ``None`` for a watermark, which goes to every partition of every input topic.
        key: Message key, or ``None``.
        ts: Event time in epoch seconds, or ``None`` when the line has no usable ``ts``.
    """

    value: bytes
    topic: str | None
    key: bytes | None
    ts: float | None

    @property
    def timestamp_ms(self) -> int | None:
        """Message timestamp in milliseconds (``None``: the producer stamps the current time).

        An event time more than :data:`MAX_STAMP_AHEAD` ahead of this machine's clock is not used: Apache Kafka
        refuses a message stamped beyond ``log.message.timestamp.after.max.ms`` (1 hour by default in 4.x) ahead
        of its own clock, and with it every other message of its batch. The worker reads the event's ``ts`` (and
        calls it ``future_ts``), not the message's timestamp, so nothing is lost.
        """
        if self.ts is None or self.ts > time.time() + MAX_STAMP_AHEAD:
            return None
        return int(round(self.ts * 1000))


MAX_STAMP_AHEAD = 600.0
"""Seconds ahead of the clock beyond which an event's ``ts`` is not its message's timestamp (:class:`Routed`)."""


def _event_time(value: Any) -> float | None:
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            ts = parse_time(float(value) if isinstance(value, int) else value)
        except (EventError, OverflowError):
            return None
        if math.isfinite(ts) and 0 <= ts < 1e11:  # Kafka timestamps are non-negative milliseconds
            return ts
    return None


def route_line(line: bytes, topics: Topics) -> Routed | None:
    """Route one JSON line (see the module doc); ``None`` for a blank line."""
    value = line.rstrip(b"\r\n") if line.endswith(b"\n") else line
    if not value.strip():
        return None
    try:
        head = _decode_head(value)
    except DECODE_ERRORS:  # broken or too deeply nested JSON, not an object
        return Routed(value, topics.rankings, None, None)
    kind = head.type
    ts = _event_time(head.ts)
    if kind == "watermark":
        return Routed(value, None, None, ts)
    if kind not in ("ranking", "feedback", "judgment"):
        return Routed(value, topics.rankings, None, ts)
    fields = {"request_id": head.request_id, "query_id": head.query_id}
    return Routed(value, topics.for_type(kind), event_key(kind, fields), ts)


def file_lines(paths: Sequence[str]) -> Iterator[bytes]:
    """The lines of JSON Lines files (``-`` = stdin, gzip recognised), in order."""
    from stream_eval.engine.replay import read_chunks

    for path in paths:
        for chunk, _, _ in read_chunks(path):
            yield from chunk.splitlines()


class _Pacer:
    """Sleeps so that events go out at ``speed`` times their event-time pace, or at ``rate`` events per second."""

    def __init__(self, speed: float | None, rate: float | None) -> None:
        if speed is not None and not (speed > 0 and math.isfinite(speed)):
            raise ValueError("speed must be a positive number (or None for as fast as possible)")
        if rate is not None and not (rate >= 0 and math.isfinite(rate)):
            raise ValueError("rate must be >= 0 (0 or None: as fast as possible)")
        self.speed = speed
        self.rate = rate or None
        self.start = time.monotonic()
        self.first_ts: float | None = None
        self.sent = 0

    @property
    def active(self) -> bool:
        return self.speed is not None or self.rate is not None

    def delay(self, ts: float | None) -> float:
        """Seconds to wait before sending the next event."""
        target = self.start
        if self.rate is not None:
            target = self.start + self.sent / self.rate
        if self.speed is not None and ts is not None:
            if self.first_ts is None:
                self.first_ts = ts
                self.start = time.monotonic()
            target = max(target, self.start + (ts - self.first_ts) / self.speed)
        self.sent += 1
        return target - time.monotonic()


async def _aiter(lines: Iterable[bytes] | AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    if isinstance(lines, AsyncIterable):
        async for line in lines:
            yield line
    else:
        for n, line in enumerate(lines):
            yield line
            if n % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)  # let the sender run and cancellation arrive, even from an endless iterator


async def send_lines(
    lines: Iterable[bytes] | AsyncIterable[bytes],
    bootstrap: str | list[str],
    topics: Topics,
    speed: float | None = None,
    flush: bool = True,
    partitions: int = DEFAULT_PARTITIONS,
    *,
    rate: float | None = None,
    timeout: float = 30.0,
    counts: Counter[str] | None = None,
    broker_timeout: float = BROKER_TIMEOUT,
    security: KafkaSecurity | None = None,
) -> Counter[str]:
    """Send JSON lines to the input topics (routing and keys as in the module doc).

    Works with an endless (async) iterator and stops cleanly when cancelled: messages already handed to the
    producer are delivered, and no end-of-stream watermark is sent.

    Args:
        lines: JSON lines (a trailing newline is removed; blank lines are skipped).
        bootstrap: ``host:port`` list, or a ``--broker`` value.
        topics: Topic names.
        speed: Pace by event time, ``speed`` times real time (1 = real time); ``None`` = as fast as possible.
        flush: At the end, send the end-of-stream watermark to every partition of every input topic.
        partitions: Partition count of the input topics this creates when missing.
        rate: Pace at this many lines per second (``None`` or 0 = unlimited); with ``speed`` too, the slower wins.
        timeout: Seconds one attempt to reach the broker at start may take (at most 5 s; then retried).
        counts: Counter to count into (it holds the numbers so far also when the call is cancelled).
        broker_timeout: Seconds the broker may stay unreachable (at start, or with records waiting for it) before
            the call gives up. Until then every send and the final flush wait, retrying with backoff; an outage is
            logged once when it starts and once when it ends.
        security: TLS and SASL settings of the producer (default: plain text).

    Returns:
        Messages sent per topic name (lines routed there), and watermark messages under :data:`WATERMARKS`.

    Raises:
        BrokerTimeout: The broker did not answer for ``broker_timeout`` seconds (a :class:`TimeoutError`).
        SendError: Some messages were not delivered (after all others were sent).
    """
    servers = parse_brokers(bootstrap) if isinstance(bootstrap, str) else list(bootstrap)
    health = BrokerHealth("stream-eval", log, stall=min(_STALL, broker_timeout), where=",".join(servers))
    progress = _Progress(health.clock())
    main = asyncio.ensure_future(_send_lines(lines, servers, topics, speed, flush, partitions, rate, timeout,
                                             Counter() if counts is None else counts, health, broker_timeout,
                                             progress, security))
    watchdog = asyncio.ensure_future(_watch_deliveries(main, health, broker_timeout, progress))
    try:
        return await main
    except asyncio.CancelledError:
        if watchdog.done() and not watchdog.cancelled() and watchdog.result():
            raise BrokerTimeout(health.gave_up(broker_timeout)) from None
        raise
    finally:
        watchdog.cancel()
        main.cancel()


class _Progress:
    """Records handed to the producer and delivered (or failed), and when the last one was."""

    __slots__ = ("handed", "done", "at")

    def __init__(self, now: float) -> None:
        self.handed = self.done = 0
        self.at = now


async def _watch_deliveries(main: asyncio.Future[Any], health: BrokerHealth, broker_timeout: float,
                            progress: _Progress) -> bool:
    """Report an outage when records wait for the broker ``health.stall`` seconds without a delivery; cancel
    ``main`` once it has lasted ``broker_timeout`` seconds (returns True then)."""
    every = max(0.05, min(1.0, health.stall / 4))
    while not main.done():
        await asyncio.sleep(every)
        if progress.handed == progress.done:
            continue
        if health.clock() - progress.at > health.stall and health.down_since is None:
            health.failed("produce", f"no delivery for {health.stall:g} s", since=progress.at)
        if health.down_since is not None and health.down_for() >= broker_timeout:
            main.cancel()
            return True
    return False


async def _send_lines(
    lines: Iterable[bytes] | AsyncIterable[bytes], servers: list[str], topics: Topics, speed: float | None,
    flush: bool, partitions: int, rate: float | None, timeout: float, counts: Counter[str], health: BrokerHealth,
    broker_timeout: float, progress: _Progress, security: KafkaSecurity | None = None,
) -> Counter[str]:
    from aiokafka import AIOKafkaProducer

    pacer = _Pacer(speed, rate)
    attempt = max(0.5, min(timeout, _ATTEMPT, broker_timeout / 2))  # shorter than the stall: its error is reported
    async def prepare() -> None:  # (the missing input topics as many partitions as an existing rankings/feedback)
        count = await input_partitions(servers, topics, partitions, attempt, security)
        await ensure_topics(servers, topics.inputs, count, timeout=attempt, security=security)

    await health.call("startup", prepare, give_up_after=broker_timeout)
    # idempotent where the broker allows it: a batch resent after an answer lost on the way is stored once
    idempotent = await idempotence_supported(servers, security, timeout=min(attempt, 10.0))
    producer = AIOKafkaProducer(
        bootstrap_servers=servers, linger_ms=10, max_batch_size=256 * 1024, max_request_size=8 * 1024 * 1024,
        request_timeout_ms=int(max(timeout, broker_timeout) * 1000), enable_idempotence=idempotent,
        **client_options(security),
    )
    failures: list[str] = []
    all_partitions: dict[str, list[int]] = {}

    def delivered(future: asyncio.Future[Any]) -> None:
        progress.done += 1
        progress.at = health.clock()
        if not future.cancelled() and future.exception() is not None:
            failures.append(f"{type(future.exception()).__name__}: {future.exception()}")
        elif health.down_since is not None:
            health.answered()

    async def send(topic: str, value: bytes, key: bytes | None, ms: int | None, partition: int | None = None) -> None:
        try:
            try:
                future = await producer.send(topic, value, key=key, timestamp_ms=ms, partition=partition)
            except Exception as error:
                if not is_broker_error(error):
                    raise
                health.failed("produce", error)  # not queued (no metadata, or no room, in time): sent again
                future = await health.call("produce", lambda: producer.send(
                    topic, value, key=key, timestamp_ms=ms, partition=partition), give_up_after=broker_timeout)
        except BrokerTimeout:
            raise
        except Exception as error:  # e.g. a line larger than the largest request: counted, the run goes on
            if type(error).__module__.split(".")[0] != "aiokafka":
                raise
            failures.append(f"{type(error).__name__}: {error}")
            return
        if not progress.handed - progress.done:
            progress.at = health.clock()  # the first record waiting since the last delivery
        progress.handed += 1
        future.add_done_callback(delivered)

    async def broadcast(value: bytes, ms: int | None) -> None:
        for topic in topics.inputs:
            if topic not in all_partitions:
                found = await health.call("produce", lambda: producer.partitions_for(topic),  # noqa: B023  # awaited now
                                          give_up_after=broker_timeout)
                all_partitions[topic] = sorted(found) if found else [0]
            for partition in all_partitions[topic]:
                await send(topic, value, None, ms, partition)
                counts[WATERMARKS] += 1

    timed_out = False
    try:
        await health.call("startup", producer.start, give_up_after=broker_timeout)
        last_ms: int | None = None
        async for line in _aiter(lines):
            routed = route_line(line, topics)
            if routed is None:
                continue
            if pacer.active:
                wait = pacer.delay(routed.ts)
                if wait > 0.001:
                    await asyncio.sleep(wait)
            ms = routed.timestamp_ms
            if ms is not None:
                last_ms = ms if last_ms is None else max(last_ms, ms)
            if routed.topic is None:
                await broadcast(routed.value, ms)
            else:
                await send(routed.topic, routed.value, routed.key, ms)
                counts[routed.topic] += 1
        if flush:
            await broadcast(END_WATERMARK, last_ms)
        await producer.flush()
    except (asyncio.CancelledError, BrokerTimeout):
        timed_out = health.down_since is not None and health.down_for() >= broker_timeout
        raise
    finally:
        with contextlib.suppress(Exception):  # delivers what was handed over, also when cancelled (not when the
            await asyncio.wait_for(producer.stop(), 1.0 if timed_out else None)  # broker is gone for good)
    if failures:
        raise SendError(f"{len(failures)} messages not delivered, e.g. {failures[0]}")
    return counts


def format_counts(counts: Counter[str], topics: Topics) -> str:
    """``sent 12 events: 5 to p.rankings, ...; 24 watermark messages`` for the terminal."""
    events = sum(n for name, n in counts.items() if name != WATERMARKS)
    parts = [f"{counts[name]:,} to {name}" for name in topics.inputs]
    text = f"sent {events:,} events: " + ", ".join(parts)
    if counts[WATERMARKS]:
        text += f"; {counts[WATERMARKS]:,} watermark messages"
    return text


async def _cancel_on_signals(main: Awaitable[_T]) -> _T:
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, task.cancel)
            installed.append(sig)
    try:
        return await task
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def run_interruptible(main: Awaitable[_T]) -> tuple[_T | None, bool]:
    """Run a coroutine until it ends or Ctrl-C / SIGTERM cancels it: ``(result, interrupted)``."""
    try:
        return asyncio.run(_cancel_on_signals(main)), False
    except (asyncio.CancelledError, KeyboardInterrupt):
        return None, True


def produce_command(files: Sequence[str], broker: str, prefix: str, speed: float | None, flush: bool,
                    partitions: int, lines: Iterable[bytes] | None = None, rate: float | None = None,
                    endless: bool = False, broker_timeout: float = BROKER_TIMEOUT,
                    security: KafkaSecurity | None = None) -> int:
    """``stream-eval produce`` (and ``simulate --broker`` with ``lines``): send, report counts, exit code.

    ``endless``: the lines never end, so Ctrl-C / SIGTERM is the normal way to stop (exit code 0, not 130).
    ``broker_timeout``: seconds the broker may stay unreachable before it gives up (exit code 1, ``--broker-timeout``).
    ``security``: TLS and SASL settings; ``None`` reads them from the ``STREAM_EVAL_*`` variables.
    """
    from stream_eval.stream.kafka import topics as make_topics

    names = make_topics(prefix)
    try:
        servers = parse_brokers(broker)
    except ValueError as error:
        print(f"stream-eval: --broker: {error}", file=sys.stderr)
        return 2
    try:
        security = kafka_security() if security is None else security
        security.ssl_context()  # unreadable TLS files: a clear error now, not a connection failure later
    except KafkaSecurityError as error:
        print(f"stream-eval: {error}", file=sys.stderr)
        return 2
    from stream_eval.commands import check_paths
    from stream_eval.config import ConfigError

    try:
        check_paths(list(files), [])  # (a directory: the message replay gives)
    except ConfigError as error:
        print(f"stream-eval: {error}", file=sys.stderr)
        return 2
    missing = [path for path in files if path != "-" and not os.path.isfile(path)]
    if missing:
        print(f"stream-eval: {missing[0]}: no such file", file=sys.stderr)
        return 2
    source = file_lines(files) if lines is None else lines
    counts: Counter[str] = Counter()
    client_log = logging.getLogger("aiokafka")
    if client_log.level == logging.NOTSET:  # an outage is reported once (stream/backoff.py), not per connection
        client_log.setLevel(logging.CRITICAL)
    try:
        _, interrupted = run_interruptible(
            send_lines(source, servers, names, speed=speed, flush=flush, partitions=partitions, rate=rate,
                       counts=counts, broker_timeout=broker_timeout, security=security)
        )
    except BrokerTimeout as error:
        sent = f"; {format_counts(counts, names)}, some maybe not delivered" if sum(counts.values()) else ""
        print(f"stream-eval: {error}; gave up after --broker-timeout {broker_timeout:g} s{sent}", file=sys.stderr)
        return 1
    except (TimeoutError, SendError) as error:  # messages not delivered
        print(f"stream-eval: {error}", file=sys.stderr)
        return 1
    if interrupted:
        print(f"stream-eval: interrupted; {format_counts(counts, names)}", file=sys.stderr)
        return 0 if endless else 130
    print(f"stream-eval: {format_counts(counts, names)}", file=sys.stderr)
    return 0
