"""Thin Kafka helpers shared by the worker, ``produce``, ``simulate --broker`` and the demo.

Broker addresses, connection security (TLS, SASL), topic names, topic creation, partition look-up and message
keys. Nothing here keeps state.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
import time
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stream_eval.config import ConfigError, parse_boolean

log = logging.getLogger("stream_eval.kafka")

__all__ = [
    "DEFAULT_BROKER",
    "DEFAULT_PARTITIONS",
    "PLAINTEXT",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "KafkaSecurity",
    "KafkaSecurityError",
    "CHECKED_SETTINGS",
    "TopicSettingsError",
    "Topics",
    "ensure_topics",
    "client_options",
    "event_key",
    "kafka_security",
    "parse_brokers",
    "partitions_for",
    "topic_mismatches",
    "topics",
]

DEFAULT_BROKER = "kafka://localhost:9092"
"""The ``--broker`` default of every Kafka command (docs/contract.md §4)."""

DEFAULT_PARTITIONS = 4
"""Partitions of the topics we create (the broker's auto-creation also gives 4)."""

_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}$")


def parse_brokers(url: str) -> list[str]:
    """Bootstrap ``host:port`` list from a ``--broker`` value.

    >>> parse_brokers("kafka://localhost:9092,kafka://h2:9093")
    ['localhost:9092', 'h2:9093']
    >>> parse_brokers("localhost:9092, h2:9093")
    ['localhost:9092', 'h2:9093']

    Raises:
        ValueError: An entry is not ``[kafka://]host:port`` with a port in 1..65535, or the value is empty.
    """
    result: list[str] = []
    for raw in url.split(","):
        entry = raw.strip()
        if not entry:
            continue
        address = entry
        if "://" in address:
            scheme, _, address = address.partition("://")
            if scheme.lower() not in ("kafka", "tcp", "plaintext"):
                raise ValueError(f"broker {entry!r}: unsupported scheme {scheme!r} (use kafka://host:port)")
        address = address.rstrip("/")
        if not _HOST_PORT.match(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
            raise ValueError(f"broker {entry!r}: expected host:port or kafka://host:port")
        result.append(address)
    if not result:
        raise ValueError(f"no broker address in {url!r} (expected e.g. kafka://localhost:9092)")
    return result


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
"""Values of ``--security-protocol``, as Kafka clients name them."""

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""Values of ``--sasl-mechanism``."""

#: The environment variables of the connection settings (the password has no flag: a flag shows in ``ps``).
SECURITY_ENV = {
    "security_protocol": "STREAM_EVAL_SECURITY_PROTOCOL",
    "sasl_mechanism": "STREAM_EVAL_SASL_MECHANISM",
    "sasl_username": "STREAM_EVAL_SASL_USERNAME",
    "sasl_password_file": "STREAM_EVAL_SASL_PASSWORD_FILE",
    "ssl_cafile": "STREAM_EVAL_SSL_CAFILE",
    "ssl_certfile": "STREAM_EVAL_SSL_CERTFILE",
    "ssl_keyfile": "STREAM_EVAL_SSL_KEYFILE",
    "ssl_check_hostname": "STREAM_EVAL_SSL_CHECK_HOSTNAME",
}
PASSWORD_ENV = "STREAM_EVAL_SASL_PASSWORD"
KEY_PASSWORD_ENV = "STREAM_EVAL_SSL_KEY_PASSWORD"
_HIDDEN = "***"


class _HideSecrets(logging.Filter):
    """Rewrites log records of the Kafka clients that would show a secret: aiokafka logs every request at DEBUG,
    SaslAuthenticate's bytes included (for PLAIN: user and password in clear)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = re.sub(r"sasl_auth_bytes=b?(['\"]).*?\1", "sasl_auth_bytes=<hidden>", message)
        for secret in self.secrets:
            hidden = hidden.replace(secret, _HIDDEN)
        if hidden != message:
            record.msg, record.args = hidden, ()
        return True


_SECRET_FILTER = _HideSecrets()
_CLIENT_LOGGERS = ("aiokafka", "aiokafka.conn", "aiokafka.client", "faust.transport.drivers.aiokafka")


def _hide_in_client_logs(secret: str | None) -> None:
    if not secret:
        return
    _SECRET_FILTER.secrets.add(secret)
    for name in _CLIENT_LOGGERS:
        client_logger = logging.getLogger(name)
        if _SECRET_FILTER not in client_logger.filters:
            client_logger.addFilter(_SECRET_FILTER)


class KafkaSecurityError(ConfigError):
    """The connection settings cannot be used; the message names the setting (never a secret's value)."""


@dataclass(frozen=True)
class KafkaSecurity:
    """How every Kafka client of a command connects: TLS and SASL settings, checked on creation.

    Build it with :func:`kafka_security` (flags, ``STREAM_EVAL_*`` variables, the ``[kafka]`` table of
    ``--config``); give it to each client as ``**security.client_options()``, or to faust as
    ``broker_credentials=security.faust_credentials()``. ``repr`` and ``str`` never show the passwords.

    >>> KafkaSecurity("SASL_PLAINTEXT", "SCRAM-SHA-256", "app", "s3cret")
    KafkaSecurity(protocol='SASL_PLAINTEXT', sasl_mechanism='SCRAM-SHA-256', sasl_username='app', sasl_password='***')
    >>> sorted(KafkaSecurity("SASL_PLAINTEXT", "PLAIN", "app", "pw").client_options())
    ['sasl_mechanism', 'sasl_plain_password', 'sasl_plain_username', 'security_protocol']

    Raises:
        KafkaSecurityError: An unknown protocol or mechanism, SASL without a user name or password, SASL or TLS
            settings with a protocol that does not use them, or a key without a certificate.
    """

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        protocol = self.protocol.strip().upper()
        object.__setattr__(self, "protocol", protocol)
        if protocol not in SECURITY_PROTOCOLS:
            raise KafkaSecurityError(f"security_protocol: {self.protocol!r} is not one of "
                                     f"{', '.join(SECURITY_PROTOCOLS)}")
        if self.uses_sasl:
            mechanism = (self.sasl_mechanism or "PLAIN").strip().upper()
            object.__setattr__(self, "sasl_mechanism", mechanism)
            if mechanism not in SASL_MECHANISMS:
                raise KafkaSecurityError(f"sasl_mechanism: {self.sasl_mechanism!r} is not one of "
                                         f"{', '.join(SASL_MECHANISMS)}")
            if not self.sasl_username:
                raise KafkaSecurityError(f"sasl_username: {protocol} needs a user name (--sasl-username)")
            if not self.sasl_password:
                raise KafkaSecurityError(f"sasl password: {protocol} needs a password, from the environment "
                                         f"variable {PASSWORD_ENV} or a file (--sasl-password-file)")
        elif self.sasl_mechanism or self.sasl_username or self.sasl_password:
            raise KafkaSecurityError(f"SASL settings given, but security_protocol is {protocol} (use SASL_SSL, "
                                     "or SASL_PLAINTEXT on a trusted network)")
        if not self.uses_ssl and (self.ssl_cafile or self.ssl_certfile or self.ssl_keyfile):
            raise KafkaSecurityError(f"TLS settings (ssl_cafile, ssl_certfile, ssl_keyfile) given, but "
                                     f"security_protocol is {protocol} (use SSL or SASL_SSL)")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise KafkaSecurityError("ssl_keyfile: given without ssl_certfile (the client certificate)")

    def __repr__(self) -> str:
        shown = [f"protocol={self.protocol!r}"]
        if self.uses_sasl:
            shown += [f"sasl_mechanism={self.sasl_mechanism!r}", f"sasl_username={self.sasl_username!r}",
                      f"sasl_password={_HIDDEN!r}"]
        if self.uses_ssl:
            shown += [f"ssl_cafile={self.ssl_cafile!r}", f"ssl_certfile={self.ssl_certfile!r}",
                      f"ssl_keyfile={self.ssl_keyfile!r}", f"ssl_check_hostname={self.ssl_check_hostname!r}"]
        return f"KafkaSecurity({', '.join(shown)})"

    __str__ = __repr__

    @property
    def uses_ssl(self) -> bool:
        """TLS to the brokers (``SSL``, ``SASL_SSL``)."""
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        """SASL authentication (``SASL_PLAINTEXT``, ``SASL_SSL``)."""
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def describe(self) -> str:
        """A short description for logs, without secrets: ``SASL_SSL (SCRAM-SHA-512 as app)``."""
        if self.uses_sasl:
            return f"{self.protocol} ({self.sasl_mechanism} as {self.sasl_username})"
        return self.protocol

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of the clients (``None`` without TLS): the system's CAs, or ``ssl_cafile``.

        Raises:
            KafkaSecurityError: A file cannot be read, or is not a certificate or key.
        """
        if not self.uses_ssl:
            return None
        from aiokafka.helpers import create_ssl_context

        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise KafkaSecurityError(f"{name}: {path}: no such file")
        try:
            context: ssl.SSLContext = create_ssl_context(cafile=self.ssl_cafile, certfile=self.ssl_certfile,
                                         keyfile=self.ssl_keyfile, password=self.ssl_key_password)
        except (OSError, ssl.SSLError) as error:  # not PEM, wrong key, wrong key password
            raise KafkaSecurityError(f"TLS settings: cannot load the CA file, certificate or key: "
                                     f"{type(error).__name__}: {getattr(error, 'reason', None) or error}") from None
        if self.ssl_cafile is None:
            context.load_default_certs()
        context.check_hostname = self.ssl_check_hostname
        if not self.ssl_check_hostname:
            context.verify_mode = ssl.CERT_REQUIRED  # still verified against the CAs: only the name is not
        return context

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for every aiokafka client (consumer, producer, admin client, client)."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        _hide_in_client_logs(self.sasl_password)  # the clients' DEBUG logs would show it
        if self.uses_sasl:
            options.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                           sasl_plain_password=self.sasl_password)
        if self.uses_ssl:
            options["ssl_context"] = self.ssl_context()
        return options

    def faust_credentials(self) -> Any:
        """faust's ``broker_credentials``: ``None``, ``SSLCredentials`` or ``SASLCredentials`` (TLS inside)."""
        _hide_in_client_logs(self.sasl_password)
        if self.uses_sasl:
            from faust.auth import SASLCredentials

            return SASLCredentials(username=self.sasl_username, password=self.sasl_password,
                                   ssl_context=self.ssl_context(), mechanism=self.sasl_mechanism)
        if self.uses_ssl:
            from faust.auth import SSLCredentials

            return SSLCredentials(self.ssl_context())
        return None


PLAINTEXT = KafkaSecurity()
"""No TLS, no SASL: the development broker's setting and every command's default."""


def _boolean(name: str, value: object) -> bool:
    try:
        return parse_boolean(value, name)
    except ConfigError as error:
        raise KafkaSecurityError(str(error)) from None


def _read_secret(path: str, name: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            secret = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise KafkaSecurityError(f"{name}: cannot read {path}: {type(error).__name__}") from None
    secret = secret.rstrip("\r\n")
    if not secret:
        raise KafkaSecurityError(f"{name}: {path} is empty")
    return secret


def _config_table(path: str) -> dict[str, Any]:
    """The ``[kafka]`` table of a ``--config`` file (``{}`` when it has none)."""
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise KafkaSecurityError(f"--config {path}: {error}") from None
    table = document.get("kafka", {})
    if not isinstance(table, Mapping):
        raise KafkaSecurityError(f"--config {path}: kafka must be a table ([kafka])")
    unknown = set(table) - set(SECURITY_ENV)
    if "sasl_password" in unknown:
        raise KafkaSecurityError(f"--config {path}: [kafka] sasl_password is not read from files in plain text; "
                                 f"use sasl_password_file or the variable {PASSWORD_ENV}")
    if unknown:
        raise KafkaSecurityError(f"--config {path}: [kafka] unknown setting(s) {', '.join(sorted(unknown))} "
                                 f"(known: {', '.join(SECURITY_ENV)})")
    return dict(table)


def kafka_security(flags: Mapping[str, object] | None = None, config_path: str | None = None,
                   environ: Mapping[str, str] | None = None) -> KafkaSecurity:
    """The connection settings of a command: ``[kafka]`` of ``--config`` < ``STREAM_EVAL_*`` < flags.

    ``flags`` holds the values of the flags that were given (``None`` = not given), keyed like
    :data:`SECURITY_ENV`. The SASL password comes from ``STREAM_EVAL_SASL_PASSWORD`` or from the file named by
    ``sasl_password_file`` (the file wins); an encrypted client key's password from
    ``STREAM_EVAL_SSL_KEY_PASSWORD``.

    >>> kafka_security({"security_protocol": "sasl_ssl", "sasl_username": "app"},
    ...                environ={"STREAM_EVAL_SASL_PASSWORD": "pw"}).describe()
    'SASL_SSL (PLAIN as app)'

    Raises:
        KafkaSecurityError: A setting is unknown or cannot be used, or the password file cannot be read.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = _config_table(config_path) if config_path else {}
    for name, variable in SECURITY_ENV.items():
        if env.get(variable):
            values[name] = env[variable]
    for name, value in (flags or {}).items():
        if name not in SECURITY_ENV:
            raise KafkaSecurityError(f"unknown connection setting {name!r}")
        if value is not None:
            values[name] = value
    password = env.get(PASSWORD_ENV) or None
    if values.get("sasl_password_file"):
        password = _read_secret(str(values["sasl_password_file"]), "sasl_password_file")
    protocol = str(values.get("security_protocol") or "PLAINTEXT")
    text = {name: (str(values[name]) if values.get(name) not in (None, "") else None)
            for name in ("sasl_mechanism", "sasl_username", "ssl_cafile", "ssl_certfile", "ssl_keyfile")}
    check_hostname = values.get("ssl_check_hostname")
    return KafkaSecurity(
        protocol=protocol,
        # a password in the environment alone does not ask for SASL: the variable may be set for another command
        sasl_password=password if protocol.strip().upper().startswith("SASL_") else None,
        ssl_key_password=env.get(KEY_PASSWORD_ENV) or None,
        ssl_check_hostname=True if check_hostname is None else _boolean("ssl_check_hostname", check_hostname),
        **text,
    )


def client_options(security: KafkaSecurity | None) -> dict[str, Any]:
    """``security.client_options()``, plain text for ``None``: the one way every client gets its settings."""
    return (security or PLAINTEXT).client_options()


@dataclass(frozen=True)
class Topics:
    """Names of the topics of one deployment (docs/contract.md §1, §4)."""

    rankings: str
    feedback: str
    judgments: str
    request_metrics: str
    dead_letters: str

    @property
    def inputs(self) -> tuple[str, str, str]:
        """The input topics: rankings, feedback, judgments."""
        return (self.rankings, self.feedback, self.judgments)

    def type_of(self, topic: str) -> str:
        """The event type an input topic carries: ``"ranking"``, ``"feedback"`` or ``"judgment"``.

        Raises:
            ValueError: ``topic`` is not one of :attr:`inputs`.
        """
        for name, kind in zip(self.inputs, ("ranking", "feedback", "judgment"), strict=True):
            if topic == name:
                return kind
        raise ValueError(f"{topic!r} is not an input topic ({', '.join(self.inputs)})")

    def for_type(self, kind: str) -> str:
        """The input topic of an event type (``"ranking"``, ``"feedback"``, ``"judgment"``).

        Raises:
            ValueError: ``kind`` is not one of the three event types.
        """
        by_type = {"ranking": self.rankings, "feedback": self.feedback, "judgment": self.judgments}
        try:
            return by_type[kind]
        except KeyError:
            raise ValueError(f"unknown event type {kind!r}") from None


def topics(prefix: str = "") -> Topics:
    """Topic names with a prefix, e.g. ``topics("demo.").rankings == "demo.rankings"``."""
    return Topics(
        rankings=f"{prefix}rankings",
        feedback=f"{prefix}feedback",
        judgments=f"{prefix}judgments",
        request_metrics=f"{prefix}request-metrics",
        dead_letters=f"{prefix}dead-letters",
    )


#: CreateTopics errors that no retry mends: an invalid name (17), partition count (37), replica assignment (39) or
#: config (40). Too few brokers for the replication factor (38) and a refused authorization (29) are retried: a
#: cluster that is starting registers its brokers, and an operator may grant the ACL.
_REFUSED_TOPICS = frozenset({17, 37, 39, 40})


class TopicSettingsError(ConfigError):
    """A topic that exists already has settings the worker cannot work with (the message says which, and how to
    fix them); not retried: the worker stops."""


#: The topic settings compared with a topic that exists already (others are only given at creation).
CHECKED_SETTINGS = ("cleanup.policy", "retention.ms", "retention.bytes", "min.insync.replicas")


def topic_mismatches(name: str, wanted: Mapping[str, str], found: Mapping[str, str]) -> list[str]:
    """What differs between the settings a topic needs (``wanted``) and those the broker reports (``found``).

    Only :data:`CHECKED_SETTINGS` are compared; a setting the broker does not report is not (the development broker
    reports only those given at creation). ``min.insync.replicas`` may be higher than wanted.

    >>> topic_mismatches("t", {"cleanup.policy": "compact"}, {"cleanup.policy": "delete"})
    ["t: cleanup.policy is 'delete', needs 'compact'"]
    >>> topic_mismatches("t", {"min.insync.replicas": "2", "retention.ms": "-1"}, {"min.insync.replicas": "3"})
    []
    """
    wrong = []
    for key in CHECKED_SETTINGS:
        if key not in wanted or found.get(key) is None:
            continue
        have, need = found[key], wanted[key]
        if key == "cleanup.policy":
            same = sorted(p.strip() for p in have.split(",")) == sorted(p.strip() for p in need.split(","))
        elif key == "min.insync.replicas":
            same = int(have) >= int(need)
            need = f"at least {need}"
        else:
            same = have == need
        if not same:
            wrong.append(f"{name}: {key} is {have!r}, needs {need!r}" if key != "min.insync.replicas"
                         else f"{name}: {key} is {have!r}, needs {need}")
    return wrong


async def ensure_topics(bootstrap: list[str], names: Iterable[str], partitions: int | Mapping[str, int],
                        timeout: float = 30,
                        security: KafkaSecurity | None = None, *, replication_factor: int = 1,
                        configs: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """Create the topics that do not exist yet, each with ``partitions`` partitions (or ``partitions[name]``),
    ``replication_factor`` replicas and the settings ``configs[name]``; check those that exist; wait until every one
    has a leader.

    An existing topic keeps its partitions; its settings of :data:`CHECKED_SETTINGS` named in ``configs[name]``
    (:func:`topic_mismatches`) and its replication factor (at least ``replication_factor``) are checked. Retries
    (connection refused, broker still starting, a new topic's leader not elected yet) until ``timeout`` seconds have
    passed. ``security``: TLS and SASL settings (default: plain text).

    Raises:
        TimeoutError: The broker did not answer, or the topics could not be created, within ``timeout``.
        TopicSettingsError: An existing topic has settings or a replication factor that do not fit.
        ValueError: ``partitions`` or ``replication_factor`` < 1.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    wanted = list(dict.fromkeys(names))
    counts = {name: partitions if isinstance(partitions, int) else partitions[name] for name in wanted}
    if min(counts.values(), default=1) < 1 or replication_factor < 1:
        raise ValueError("partitions and replication_factor must be >= 1")
    if not wanted:
        return
    settings = configs or {}
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    created: set[str] = set()
    checked = False
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=max(1000, int(timeout * 1000)),
                                    **client_options(security))
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            missing = [name for name in wanted if name not in existing]
            if not checked:
                await _check_topics(admin, [n for n in wanted if n in existing and n not in created],
                                    replication_factor, settings)
                checked = True
            if missing:
                new = [NewTopic(name, num_partitions=counts[name], replication_factor=replication_factor,
                                topic_configs=dict(settings.get(name, {}))) for name in missing]
                response: Any = await admin.create_topics(new)
                for topic_error in getattr(response, "topic_errors", []):
                    name, code = topic_error[0], topic_error[1]
                    if code not in (0, TopicAlreadyExistsError.errno):
                        message = topic_error[2] if len(topic_error) > 2 else None
                        text = f"cannot create topic {name!r}: error code {code}" + (f" ({message})" if message else "")
                        if code in _REFUSED_TOPICS:  # no retry will do: the worker stops (exit 2)
                            raise TopicSettingsError(text)
                        if code == 38:
                            text += ("; retried while a starting cluster registers its brokers: a cluster with fewer "
                                     "brokers than --replication-factor never will, lower it")
                        raise RuntimeError(text)
                    created.add(name)
            # Apache Kafka answers CreateTopics before every broker knows the topic and its leader: a consumer
            # that subscribed now would be assigned none of its partitions until its next metadata refresh
            leaderless = _without_leader(await admin.describe_topics(wanted))
            if not leaderless:
                return
            last = RuntimeError(f"no leader yet for {', '.join(leaderless)}")
        except (TimeoutError, RuntimeError, OSError) as error:
            last = error
        except TopicSettingsError:
            raise
        except Exception as error:  # aiokafka's KafkaError family: broker not ready yet
            if type(error).__module__.split(".")[0] != "aiokafka":
                raise
            last = error
        finally:
            await admin.close()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"cannot create topics on {','.join(bootstrap)} within {timeout:g}s: {last}")
        await asyncio.sleep(0.25)


def _without_leader(described: list[Any]) -> list[str]:
    """Names of the topics in a metadata answer that are unknown, have no partition, or a partition without a
    leader."""
    return [str(topic.get("topic")) for topic in described
            if topic.get("error_code") or not topic.get("partitions")
            or any(part.get("leader", -1) < 0 for part in topic["partitions"])]


async def _check_topics(admin: Any, names: list[str], replication_factor: int,
                        configs: Mapping[str, Mapping[str, str]]) -> None:
    """Raise :class:`TopicSettingsError` naming every existing topic of ``names`` whose replication factor or
    checked settings do not fit. Settings a broker does not report, or cannot describe at all, are not checked."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    if not names:
        return
    wrong: list[str] = []
    for topic in await admin.describe_topics(names):
        replicas = min((len(part.get("replicas", ())) for part in topic.get("partitions", ())), default=None)
        if replicas is not None and replicas < replication_factor:
            wrong.append(f"{topic.get('topic')}: replication factor {replicas}, needs at least {replication_factor}")
    described = [name for name in names if configs.get(name)]
    if described:
        try:
            answers = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)
                                                    for name in described])
        except Exception as error:  # a broker without DescribeConfigs: nothing to compare
            if type(error).__module__.split(".")[0] != "aiokafka":
                raise
            log.info("the broker does not describe topic settings (%s): they are not checked", error)
            answers = []
        for answer in answers:
            for resource in answer.resources:
                code, name, entries = resource[0], resource[3], resource[4]
                if code == 0:
                    found = {entry[0]: entry[1] for entry in entries}
                    wrong += topic_mismatches(name, configs.get(name, {}), found)
                else:  # e.g. 29, not authorised: the operator vouches for them (docs/operations.md, ACLs)
                    log.warning("the settings of topic %s cannot be read (error code %s): they are not checked",
                                name, code)
    if wrong:
        raise TopicSettingsError(
            "topics exist with settings the worker cannot work with (docs/operations.md says what each needs; "
            "change them with kafka-configs.sh --alter --entity-type topics, or use new topics):\n  "
            + "\n  ".join(wrong))


async def idempotence_supported(bootstrap: list[str], security: KafkaSecurity | None = None,
                                 transactional_id: str | None = None, timeout: float = 30.0) -> bool:
    """Whether the broker gives producers an id (idempotent writes: a batch resent after a lost answer is stored
    once), and with ``transactional_id`` whether it also runs transactions: such a producer starts and commits an
    empty transaction. The development broker advertises the requests and fails them."""
    import contextlib

    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                transactional_id=transactional_id, **client_options(security))
    sender_log = logging.getLogger("aiokafka.producer.sender")  # its error about a refused id is our answer here
    quiet = _Without("Unexpected error during InitProducerIdRequest")
    sender_log.addFilter(quiet)
    try:
        await asyncio.wait_for(producer.start(), timeout)
        if transactional_id is not None:
            await producer.begin_transaction()
            await asyncio.wait_for(producer.commit_transaction(), timeout)
        return True
    except Exception as error:
        log.info("the broker does not run %s (%s: %s)", "transactions" if transactional_id else "idempotent producers",
                 type(error).__name__, error)
        return False
    finally:
        sender_log.removeFilter(quiet)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), 10.0)


class _Without(logging.Filter):
    """Drops the log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


async def input_partitions(bootstrap: list[str], names: Topics, default: int, timeout: float,
                           security: KafkaSecurity | None = None) -> int:
    """The partition count of the input topics: that of the ``rankings`` or ``feedback`` topic that exists, else
    ``default``. The join reads partition p of the rankings with partition p of the feedback (both keyed by request
    id): a topic of the pair that exists sets the count of the other, and two that differ cannot be used.

    Raises:
        TimeoutError: The broker did not answer in time.
        TopicSettingsError: Both exist with different counts.
    """
    pair = (names.rankings, names.feedback)
    found = {topic: len(await asyncio.wait_for(partitions_for(bootstrap, topic, security), timeout))
             for topic in pair}
    if 0 not in found.values() and len(set(found.values())) > 1:
        raise TopicSettingsError(
            f"the input topics {' and '.join(f'{t} ({n} partitions)' for t, n in found.items())} must have the "
            "same partition count: a request's ranking and its feedback are keyed by request_id, and the worker "
            "joins partition p of one with partition p of the other. Give the topic with fewer the same count "
            "(kafka-topics --alter --partitions N) before more data is written to it (docs/operations.md)")
    return max(found.values()) or default


async def partitions_for(bootstrap: list[str], topic: str, security: KafkaSecurity | None = None) -> list[int]:
    """Sorted partition ids of ``topic`` (empty if the topic does not exist)."""
    from aiokafka import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=bootstrap, **client_options(security))
    try:
        await client.bootstrap()
        await client.force_metadata_update()
        found = client.cluster.partitions_for_topic(topic)
        return sorted(found) if found else []
    finally:
        await client.close()


def event_key(kind: str, fields: dict[str, Any] | None) -> bytes | None:
    """The message key of an event: ``request_id`` for rankings and feedback, ``query_id`` for judgments.

    ``None`` when the field is missing or not a string (the worker reports such events as invalid).
    """
    if fields is None:
        return None
    name = "query_id" if kind == "judgment" else "request_id" if kind in ("ranking", "feedback") else None
    if name is None:
        return None
    value = fields.get(name)
    return value.encode() if isinstance(value, str) else None
