"""Broker faults: retry broker calls with exponential backoff and jitter, and keep the broker's health for /metrics.

The worker and ``produce`` call the broker through :meth:`BrokerHealth.call`. An outage (connection refused, a
request that times out, a broker that stops answering: SIGSTOP, a network partition) is logged once when it starts,
with the error, and once when the broker answers again; :class:`BrokerHealth` counts the errors per operation and
says whether the broker is up (``stream_eval_broker_errors_total{operation}``, ``stream_eval_broker_up``).

A call that is in flight is never abandoned because it is slow: a produce request the broker has not answered may
still be stored, and sending it again would write it twice (the development broker has no idempotent producer).
So a call that does not answer within ``stall`` seconds is *reported* (the broker counts as down) and waited for;
only an error the client raises, which means the call did not happen (``KafkaTimeoutError`` before a record was
queued, a refused connection, a fetch or metadata request that timed out), is retried after a backoff, and only for
operations that are safe to repeat. aiokafka itself resends produce batches and commits that failed for a
retriable reason, as long as its ``request_timeout_ms`` has not passed; give the producer a timeout longer than the
outages to ride out.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["Backoff", "BrokerHealth", "BrokerTimeout", "SilenceClock", "is_broker_error"]

_T = TypeVar("_T")


class BrokerTimeout(TimeoutError):
    """The broker stayed unreachable longer than the caller allows."""


class Backoff:
    """Delays between attempts: ``initial`` doubling (``factor``) up to ``maximum`` seconds, each drawn uniformly
    from ``[(1 - jitter) * d, d]`` so that many clients do not retry in step.

    >>> delays = Backoff(jitter=0.0)
    >>> [delays.next() for _ in range(9)]
    [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    >>> delays.reset(); delays.next()
    0.5
    """

    __slots__ = ("initial", "factor", "maximum", "jitter", "attempt", "_random")

    def __init__(self, initial: float = 0.5, factor: float = 2.0, maximum: float = 30.0, jitter: float = 0.5,
                 rng: random.Random | None = None) -> None:
        if not (0 < initial <= maximum and factor >= 1 and 0 <= jitter <= 1):
            raise ValueError("need 0 < initial <= maximum, factor >= 1 and 0 <= jitter <= 1")
        self.initial, self.factor, self.maximum, self.jitter = initial, factor, maximum, jitter
        self.attempt = 0
        self._random = rng or random.Random()

    def ceiling(self, attempt: int) -> float:
        """The delay before retry number ``attempt + 1`` without jitter."""
        return min(self.maximum, self.initial * self.factor ** min(attempt, 64))

    def next(self) -> float:
        """The next delay, in seconds."""
        ceiling = self.ceiling(self.attempt)
        self.attempt += 1
        return ceiling * (1.0 - self.jitter * self._random.random())

    def reset(self) -> None:
        """Start again from ``initial`` (after a success)."""
        self.attempt = 0


def is_broker_error(error: BaseException) -> bool:
    """Whether ``error`` means the broker could not be reached or did not answer in time (worth a retry).

    aiokafka's retriable errors (``KafkaConnectionError``, ``KafkaTimeoutError``, ``RequestTimedOutError``,
    ``NodeNotReadyError``, a leader or coordinator not available, ...), timeouts and socket errors.
    """
    if isinstance(error, TimeoutError | OSError):
        return True
    if type(error).__module__.split(".")[0] != "aiokafka":
        return False
    from aiokafka.errors import KafkaTimeoutError

    # KafkaTimeoutError (not marked retriable): no metadata, or no room in the queue, in time; nothing was queued
    return isinstance(error, KafkaTimeoutError) or bool(getattr(error, "retriable", False))


class BrokerHealth:
    """Whether the broker answers, and the errors per operation; an outage is logged once, and its end.

    Read by the Prometheus collector from another thread: :meth:`snapshot` copies under the GIL.

    Args:
        who: Names the client in log messages (``stream-eval worker``, ``stream-eval produce``).
        where: The broker's addresses, for messages.
        logger: Where outages are logged (warnings).
        stall: Seconds without an answer after which a call in flight counts as an outage.
        clock: Monotonic seconds (tests pass their own).
        backoff: Builds the delays of one retried call.
    """

    def __init__(self, who: str, logger: logging.Logger, stall: float = 10.0, where: str = "",
                 clock: Callable[[], float] = time.monotonic,
                 backoff: Callable[[], Backoff] = Backoff) -> None:
        self.who = who
        self.where = where
        self.log = logger
        self.stall = stall
        self.clock = clock
        self.backoff = backoff
        self.up = False  # nothing answered yet
        self.errors: dict[str, int] = {}
        self.outages = 0
        self.down_since: float | None = None
        self.last_error = ""

    def snapshot(self) -> tuple[bool, dict[str, int]]:
        """``(up, errors per operation)``, copied."""
        return self.up, dict(self.errors)

    def counted(self, operation: str, error: BaseException | str) -> None:
        """Count an error of ``operation`` that the client retries on its own (aiokafka's failed fetch requests):
        in ``errors`` and ``last_error``, without marking an outage, which the worker's own calls mark and end."""
        self.errors[operation] = self.errors.get(operation, 0) + 1
        self.last_error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"

    def failed(self, operation: str, error: BaseException | str, since: float | None = None) -> None:
        """Count an error of ``operation``; the first one of an outage is logged. ``since``: when the failed call
        started (the outage began then at the latest); default now."""
        self.counted(operation, error)
        self.up = False
        if self.down_since is None:
            self.down_since = self.clock() if since is None else since
            self.outages += 1
            self.log.warning("%s: the Kafka broker%s is unreachable (%s: %s); retrying with backoff", self.who,
                             self._at(), operation, self.last_error)

    def answered(self) -> None:
        """The broker answered: the end of an outage is logged."""
        if self.down_since is not None:
            self.log.warning("%s: the Kafka broker%s answers again after %.1f s", self.who, self._at(),
                             self.clock() - self.down_since)
            self.down_since = None
        self.up = True

    def down_for(self) -> float:
        """Seconds since the current outage started (0 when the broker is up)."""
        return 0.0 if self.down_since is None else self.clock() - self.down_since

    async def call(self, operation: str, make: Callable[[], Awaitable[_T]], *, retry: bool = True,
                   give_up_after: float | None = None) -> _T:
        """``await make()``, reported and retried as the module doc says.

        Args:
            operation: Label of the error counter (``startup``, ``fetch``, ``produce``, ``flush``, ``checkpoint``,
                ``commit``).
            make: Starts the call; called again for each retry, so only for calls that are safe to repeat.
            retry: Retry broker errors (with backoff); ``False``: count and raise them.
            give_up_after: Raise :class:`BrokerTimeout` once an outage has lasted this many seconds (``None``: never).

        Raises:
            BrokerTimeout: The outage lasted ``give_up_after`` seconds.
            Exception: Whatever ``make()`` raises that is not a broker error (or any error when ``retry`` is false).
        """
        delays = self.backoff()
        while True:
            started = self.clock()
            try:
                result = await self._watch(operation, asyncio.ensure_future(make()), give_up_after)
            except BrokerTimeout:
                raise
            except Exception as error:
                if not is_broker_error(error):
                    raise
                self.failed(operation, error, started)
                if not retry:
                    raise
                delay = delays.next()
                if give_up_after is not None:
                    left = give_up_after - self.down_for()
                    if left <= 0:
                        raise BrokerTimeout(self.gave_up(give_up_after)) from error
                    delay = min(delay, left)
                await asyncio.sleep(delay)
                continue
            self.answered()
            return result

    async def _watch(self, operation: str, task: asyncio.Future[_T], give_up_after: float | None) -> _T:
        """Wait for ``task``; after ``stall`` seconds the broker counts as down (once), and the wait goes on."""
        reported, started = False, self.clock()
        try:
            while True:
                wait = None if reported else self.stall
                if give_up_after is not None and reported:
                    left = give_up_after - self.down_for()
                    if left <= 0:
                        task.cancel()
                        raise BrokerTimeout(self.gave_up(give_up_after))
                    wait = left
                done, _ = await asyncio.wait({task}, timeout=wait)
                if done:
                    return task.result()
                if not reported:
                    reported = True
                    self.failed(operation, f"no answer for {self.stall:g} s", started)
        except asyncio.CancelledError:
            task.cancel()
            raise

    def gave_up(self, seconds: float) -> str:
        """The message of :class:`BrokerTimeout`."""
        return f"the Kafka broker{self._at()} did not answer for {seconds:g} s (last error: {self.last_error})"

    def _at(self) -> str:
        return f" at {self.where}" if self.where else ""


class SilenceClock:
    """Seconds of wall clock that count as an input source's silence (``idle_timeout``): the clock stands still
    while the broker is unreachable, and a step longer than ``max_step`` between two readings (the process was
    stopped, or blocked on a call) counts as ``max_step``.

    A source cannot be heard while nothing can be read: without this, every source would look idle the moment a
    long outage ends, and the first topic read again (feedback, say) would move event time past requests whose
    rankings are only a fetch away, making their feedback orphans. Monotonic; read once per loop step at least.
    """

    __slots__ = ("clock", "health", "max_step", "_last", "_value")

    def __init__(self, health: BrokerHealth, clock: Callable[[], float] = time.monotonic,
                 max_step: float = 1.0) -> None:
        self.clock, self.health, self.max_step = clock, health, max_step
        self._last = clock()
        self._value = self._last

    def __call__(self) -> float:
        now = self.clock()
        step, self._last = now - self._last, now
        if self.health.up and step > 0:
            self._value += min(step, self.max_step)
        return self._value
