"""docker-compose.yml, the Dockerfile and the Prometheus config, checked statically (no Docker engine here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from stream_eval.cli import build_parser
from stream_eval.stream.kafka import parse_brokers, topics
from stream_eval.stream.worker import WorkerSettings

ROOT = Path(__file__).resolve().parent.parent


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def test_services_and_dependencies() -> None:
    services = _compose()["services"]
    assert {"kafka", "create-topics", "worker", "prometheus"} <= set(services)
    assert services["worker"]["depends_on"]["create-topics"]["condition"] == "service_completed_successfully"
    assert services["create-topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_worker_command_is_valid_and_reaches_the_broker() -> None:
    services = _compose()["services"]
    args = build_parser().parse_args(services["worker"]["command"])
    assert args.command == "worker"
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    internal = re.search(r"PLAINTEXT://([^,]+)", advertised)
    assert internal is not None and parse_brokers(args.broker) == [internal.group(1)]
    assert f"{args.metrics_port}:{args.metrics_port}" in services["worker"]["ports"]


def test_every_topic_the_worker_uses_is_created() -> None:
    services = _compose()["services"]
    args = build_parser().parse_args(services["worker"]["command"])
    settings = WorkerSettings(parse_brokers(args.broker), args.topic_prefix, args.group, args.partitions)
    script = services["create-topics"]["command"][0]
    loop = re.search(r"for topic in ([^;]+);", script)
    assert loop is not None
    created = set(loop.group(1).split()) | set(re.findall(r"--topic ([\w.-]+)", script))
    names = topics(settings.prefix)
    assert {*names.inputs, names.request_metrics, names.dead_letters, settings.checkpoint_topic} <= created
    partitions = set(re.findall(r"--partitions (\d+)", script))
    assert partitions == {str(settings.partitions)}  # co-partitioned: the same count everywhere


def test_prometheus_scrapes_the_worker() -> None:
    services = _compose()["services"]
    args = build_parser().parse_args(services["worker"]["command"])
    mounted = [v for v in services["prometheus"]["volumes"] if v.endswith("/etc/prometheus/prometheus.yml:ro")]
    assert len(mounted) == 1
    config = yaml.safe_load((ROOT / mounted[0].split(":")[0]).read_text())
    targets = [t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert f"worker:{args.metrics_port}" in targets


def test_dockerfile_default_command_is_valid() -> None:
    text = (ROOT / "Dockerfile").read_text()
    entry = re.search(r'^ENTRYPOINT (\[.*\])$', text, re.M)
    command = re.search(r'^CMD (\[.*\])$', text, re.M)
    assert entry is not None and command is not None
    assert yaml.safe_load(entry.group(1)) == ["stream-eval"]
    args = build_parser().parse_args(yaml.safe_load(command.group(1)))
    assert args.command == "worker" and shlex.join(["--broker", args.broker])
