"""Apache Kafka for tests and benchmarks: a single-node KRaft broker (broker and controller in one JVM).

The jars come from Maven Central (``scripts/kafka/pom.xml``; ``scripts/kafka/fetch`` copies them with Maven to
``.cache/kafka/jars``). :class:`ApacheKafka` formats a storage directory as ``kafka-storage.sh format`` does
(``kafka.tools.StorageTool``), starts ``kafka.Kafka server.properties`` with a small heap, waits until it answers a
Metadata request, and stops it with SIGTERM (a controlled shutdown), removing its storage. It has the interface of
:class:`~stream_eval.stream.broker.Broker` (the Tansu broker), so a test takes either.

Settings are those of a fast single-node test cluster: replication factor 1 everywhere, no initial rebalance
delay, and auto-created topics of :data:`~stream_eval.stream.kafka.DEFAULT_PARTITIONS` partitions, as the Tansu
broker creates them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from stream_eval.stream.broker import Broker, BrokerError, free_port
from stream_eval.stream.kafka import DEFAULT_PARTITIONS

__all__ = ["JARS_ENV", "ApacheKafka", "default_jars", "java_found"]

JARS_ENV = "STREAM_EVAL_KAFKA_JARS"
"""Environment variable naming the directory of the Kafka jars (default: ``.cache/kafka/jars`` of the checkout)."""

HEAP = "-Xmx512m"

#: server.properties of every broker, after the listeners and the storage directory.
SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "num.partitions": str(DEFAULT_PARTITIONS),
    "auto.create.topics.enable": "true",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # the tests' logs have event times of 2026-01-01, and produce stamps messages with them: with the default
    # 7-day retention, checked every 5 minutes, the broker deleted input the worker had not read yet
    "log.retention.ms": "-1",
    # a node frozen (SIGSTOP, the broker-fault tests) and resumed must not fence itself for missed heartbeats to
    # its own controller: one node has no other broker to lead its partitions meanwhile
    "broker.session.timeout.ms": "600000",
    "log.flush.interval.messages": str(2**62),  # the page cache is enough for a test
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(4 << 20),
}


def default_jars() -> Path:
    """The directory of the Kafka jars: ``$STREAM_EVAL_KAFKA_JARS``, else ``.cache/kafka/jars`` of the checkout
    this package runs from."""
    named = os.environ.get(JARS_ENV)
    if named:
        return Path(named)
    return Path(__file__).resolve().parents[2] / ".cache" / "kafka" / "jars"


def java_found() -> str | None:
    """Path of ``java`` (``$JAVA_HOME/bin/java`` first), or None."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


class ApacheKafka(Broker):
    """An Apache Kafka broker (KRaft, one node) on ``host:port``; its storage in a temporary directory.

    Args:
        port: The client listener's port.
        host: Address to listen on and to advertise.
        jars: Directory of the Kafka jars (default :func:`default_jars`).
        settings: server.properties entries added to (or replacing) :data:`SETTINGS`.
        advertised_port: The port clients are told to connect to (a proxy before the broker); the broker itself
            talks to its own second listener.
        log, echo, startup_timeout: As for :class:`~stream_eval.stream.broker.Broker`.
    """

    kind = "Apache Kafka"

    def __init__(self, port: int = 9092, host: str = "127.0.0.1", *, jars: str | Path | None = None,
                 settings: dict[str, str] | None = None, log: str | Path | None = None, echo: bool = False,
                 startup_timeout: float = 90.0, advertised_port: int | None = None) -> None:
        super().__init__(port, host, log=log, echo=echo, startup_timeout=startup_timeout,
                         advertised_port=advertised_port)
        self.jars = Path(jars) if jars is not None else default_jars()
        self.settings = {**SETTINGS, **(settings or {})}
        self.directory: Path | None = None

    def check_installed(self) -> None:
        if java_found() is None:
            raise BrokerError("Apache Kafka needs Java 17 or later: no java on PATH or in JAVA_HOME")
        if not list(self.jars.glob("kafka_2.13-*.jar")):
            raise BrokerError(f"no Kafka jars in {self.jars}: fetch them with scripts/kafka/fetch (Maven), or name "
                              f"their directory in {JARS_ENV}")

    def _command(self) -> list[str]:
        java = java_found()
        assert java is not None
        self.directory = Path(tempfile.mkdtemp(prefix="stream-eval-kafka-"))
        host, internal, controller = self.host, free_port(self.host), free_port(self.host)
        lines = {
            "listeners": f"CLIENT://{host}:{self.port},INTERNAL://{host}:{internal},CONTROLLER://{host}:{controller}",
            "advertised.listeners": f"CLIENT://{host}:{self.advertised_port},INTERNAL://{host}:{internal}",
            "listener.security.protocol.map": "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.voters": f"1@{host}:{controller}",
            "log.dirs": str(self.directory / "data"),
            **self.settings,
        }
        properties = self.directory / "server.properties"
        properties.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
        classpath = [java, HEAP, "-XX:+UseSerialGC",
                     "-Djava.awt.headless=true", "-cp", str(self.jars / "*")]
        cluster = uuid.uuid4().bytes
        cluster_id = _base64url(cluster)
        # (one id in 32 starts with "-": as "--cluster-id=ID" it is not read as an option)
        formatted = subprocess.run([*classpath, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                                    "--config", str(properties), "--ignore-formatted"],
                                   capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
        if formatted.returncode != 0:
            self._remove_directory()
            raise BrokerError(f"formatting the Kafka storage failed ({formatted.returncode}): "
                              f"{(formatted.stdout + formatted.stderr).decode(errors='replace')[-2000:]}")
        return [*classpath, "kafka.Kafka", str(properties)]

    def _cleanup(self) -> None:
        super()._cleanup()
        self._remove_directory()

    def _remove_directory(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def _base64url(data: bytes) -> str:
    """A cluster id as Kafka writes them (``kafka-storage.sh random-uuid``): 16 bytes, URL-safe base64, no padding."""
    import base64

    return base64.urlsafe_b64encode(data).decode().rstrip("=")
