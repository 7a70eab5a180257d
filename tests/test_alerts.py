"""The Prometheus rules and the Alertmanager config of deploy/, checked by promtool/amtool and for coverage.

``promtool test rules`` runs the unit tests of deploy/prometheus/tests/; the checks here make sure those tests
cover every alert both firing and not firing and every recording rule, that the alert names are the contract's
(docs/contract.md §6), and that every severity has a route. Without promtool (or amtool) the tests that need it
fail under CI (``CI=true``) and skip locally, saying what to install.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from promstack import Alertmanager, alertmanager_config, require_binary

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = sorted((PROMETHEUS / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))
ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"

#: docs/contract.md §6: the alert names are part of the product contract.
CONTRACT_ALERTS = {
    "StreamEvalTreatmentWorse", "StreamEvalTreatmentBetter", "StreamEvalSampleRatioMismatch",
    "StreamEvalNoFinalisedRequests", "StreamEvalEventTimeStalled", "StreamEvalInvalidEventsHigh",
    "StreamEvalLiveMetricDrop", "StreamEvalGuardrailBreached",
}
SEVERITIES = {"page", "warning", "info"}


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _rules() -> list[dict[str, Any]]:
    return [rule for path in RULES for group in _load(path)["groups"] for rule in group["rules"]]


def _alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in _rules() if "alert" in rule}


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_rule_files_and_their_tests_exist() -> None:
    names = {path.name for path in RULES}
    assert {"recording.yml", "alerts.yml"} <= names, names
    assert RULE_TESTS, "no promtool unit tests in deploy/prometheus/tests/"


@pytest.mark.slow
def test_promtool_check_rules() -> None:
    promtool = require_binary("promtool", package="prometheus")
    done = _run(promtool, "check", "rules", *map(str, RULES))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_promtool_unit_tests_pass() -> None:
    promtool = require_binary("promtool", package="prometheus")
    done = _run(promtool, "test", "rules", *map(str, RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAILED" not in done.stdout + done.stderr


@pytest.mark.slow
def test_promtool_check_config_of_docker_compose_prometheus() -> None:
    config = _load(PROMETHEUS / "prometheus.yml")
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    assert [t for am in config["alerting"]["alertmanagers"] for c in am["static_configs"]
            for t in c["targets"]] == ["alertmanager:9093"]
    targets = [t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert "worker:9464" in targets
    assert config["global"]["scrape_interval"] == "5s"
    promtool = require_binary("promtool", package="prometheus")
    # rule_files point into the container; a glob that matches nothing locally is valid
    done = _run(promtool, "check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_alert_names_are_the_contract_and_each_is_actionable() -> None:
    alerts = _alerts()
    assert set(alerts) == CONTRACT_ALERTS
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations.get("summary") and annotations.get("description"), name
        assert "{{" in annotations["description"], f"{name}: the description should show the values"
        if name not in ("StreamEvalTreatmentWorse", "StreamEvalTreatmentBetter", "StreamEvalSampleRatioMismatch"):
            assert rule.get("for"), f"{name}: a pipeline alert needs a for: duration"
    assert alerts["StreamEvalTreatmentWorse"]["labels"]["severity"] == "page"
    assert alerts["StreamEvalTreatmentBetter"]["labels"]["severity"] == "info"
    assert "cs_upper" in alerts["StreamEvalTreatmentWorse"]["expr"]
    assert "cs_lower" in alerts["StreamEvalTreatmentBetter"]["expr"]
    breached = alerts["StreamEvalGuardrailBreached"]
    assert breached["labels"] == {"severity": "page", "action": "rollback"}
    assert {"margin", "lower", "upper"} <= breached["annotations"].keys()  # the bounds in the webhook payload


def test_recording_rules_follow_level_metric_operations() -> None:
    records = [rule["record"] for rule in _rules() if "record" in rule]
    assert records
    for record in records:
        assert len(record.split(":")) == 3, record


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    seen: dict[str, set[bool]] = defaultdict(set)
    for path in RULE_TESTS:
        for case in _load(path).get("tests", []):
            for check in case.get("alert_rule_test", []):
                seen[check["alertname"]].add(bool(check.get("exp_alerts")))
    missing = {name: {True, False} - seen[name] for name in _alerts() if seen[name] != {True, False}}
    assert not missing, f"alerts without a promtool test firing (True) / not firing (False): {missing}"
    unknown = set(seen) - set(_alerts())
    assert not unknown, f"unit tests of alerts that do not exist: {unknown}"


def test_every_recording_rule_is_unit_tested() -> None:
    tested = {check["expr"] for path in RULE_TESTS for case in _load(path).get("tests", [])
              for check in case.get("promql_expr_test", [])}
    records = {rule["record"] for rule in _rules() if "record" in rule}
    untested = {r for r in records if not any(r in expr for expr in tested)}
    assert not untested, f"recording rules without a promql_expr_test: {untested}"


def _routes(route: dict[str, Any]) -> list[dict[str, Any]]:
    return [route, *(r for child in route.get("routes", []) for r in _routes(child))]


def test_every_severity_has_a_route_and_every_receiver_exists() -> None:
    config = _load(ALERTMANAGER)
    receivers = {r["name"] for r in config["receivers"]}
    routes = _routes(config["route"])
    assert all(r.get("receiver", config["route"]["receiver"]) in receivers for r in routes)
    matched = {m for r in routes[1:] for m in r.get("matchers", [])}
    assert {'severity="page"', 'severity="info"'} <= matched
    used = {rule["labels"]["severity"] for rule in _alerts().values()}
    assert used <= SEVERITIES


@pytest.mark.slow
def test_alertmanager_config_is_valid(tmp_path: Path) -> None:
    """``amtool check-config`` when amtool is installed; and Alertmanager starts with the shipped config as is
    (placeholder receivers) and as the end-to-end test rewrites it (receivers replaced by a webhook)."""
    amtool = shutil.which("amtool")
    if amtool is not None:
        done = _run(amtool, "check-config", str(ALERTMANAGER))
        assert done.returncode == 0, done.stdout + done.stderr
    for name, config in (("shipped", _load(ALERTMANAGER)),
                         ("webhook", alertmanager_config(ALERTMANAGER, "http://127.0.0.1:9/hook"))):
        with Alertmanager(tmp_path / name, config) as manager:
            status = manager.alerts()
            assert status == []
