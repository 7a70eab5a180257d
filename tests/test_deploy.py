"""docker-compose.yml, the Dockerfile, the Prometheus config and the Grafana dashboards, checked statically.

No Docker engine or Grafana here: the dashboards' PromQL is parsed with promtool when it is on PATH (always under
CI=true), and run against a real Prometheus by the end-to-end tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from ci import in_ci

from stream_eval.cli import build_parser
from stream_eval.stream.kafka import parse_brokers, topics
from stream_eval.stream.settings import WorkerSettings

ROOT = Path(__file__).resolve().parent.parent


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def _internal_listener() -> str:
    """host:port of the broker's listener for the compose network."""
    advertised = _compose()["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    internal = re.search(r"PLAINTEXT://([^,]+)", advertised)
    assert internal is not None
    return internal.group(1)


def test_services_and_dependencies() -> None:
    services = _compose()["services"]
    assert {"kafka", "create-topics", "worker", "prometheus", "alertmanager", "grafana"} <= set(services)
    assert {"worker", "alertmanager"} <= set(services["prometheus"]["depends_on"])
    assert "prometheus" in services["grafana"]["depends_on"]
    assert services["worker"]["depends_on"]["create-topics"]["condition"] == "service_completed_successfully"
    assert services["create-topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_worker_command_is_valid_and_reaches_the_broker() -> None:
    services = _compose()["services"]
    args = build_parser().parse_args(services["worker"]["command"])
    assert args.command == "worker"
    assert parse_brokers(args.broker) == [_internal_listener()]
    assert f"{args.metrics_port}:{args.metrics_port}" in services["worker"]["ports"]


def test_the_worker_reads_the_mounted_config_with_the_behaviour_measures() -> None:
    """The compose worker ran without a config: the dashboard's behaviour row (CTR@10, SatClick, ...) stayed empty
    and there was no place to name an experiment. It reads deploy/stream-eval.toml, whose settings load."""
    from stream_eval.config import load_config
    from stream_eval.metrics.specs import request_specs

    worker = _compose()["services"]["worker"]
    args = build_parser().parse_args(worker["command"])
    assert _bind_mounts(worker) == {args.config: "deploy/stream-eval.toml"}
    config = load_config(str(ROOT / "deploy" / "stream-eval.toml"), environ={})
    names = {spec.mean_name for spec in request_specs(config)}
    assert {"CTR@10", "SatClick", "Abandoned", "nDCG@10"} <= names


def test_every_topic_the_worker_uses_is_created() -> None:
    services = _compose()["services"]
    args = build_parser().parse_args(services["worker"]["command"])
    settings = WorkerSettings(parse_brokers(args.broker), args.topic_prefix, args.group, args.partitions)
    script = services["create-topics"]["command"][0]
    loops = re.findall(r"for topic in ([^;]+);", script)
    assert loops
    created = {name for loop in loops for name in loop.split()} | set(re.findall(r"--topic ([\w.-]+)", script))
    names = topics(settings.prefix)
    assert {*names.inputs, names.request_metrics, names.dead_letters, settings.checkpoint_topic} <= created
    partitions = set(re.findall(r"--partitions (\d+)", script))
    assert partitions == {str(settings.partitions)}  # co-partitioned: the same count everywhere
    # the checkpoints topic made here carries what the worker would have made it with (segment.ms too, which
    # the worker's check of existing topics does not cover: without it trimmed checkpoints stayed for a week)
    made = script.split(f"--topic {settings.checkpoint_topic}")[1].split("\n\n")[0]
    given = dict(re.findall(r"--config ([\w.]+)=(\S+)", made))
    wanted = {k: v for k, v in settings.topic_configs()[settings.checkpoint_topic].items()
              if k != "min.insync.replicas"}
    assert {k: given.get(k) for k in wanted} == wanted


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
    assert args.command == "worker"
    # the image alone, run in the compose network, reaches the broker and serves the port it exposes
    assert parse_brokers(args.broker) == [_internal_listener()]
    assert re.search(rf"^EXPOSE {args.metrics_port}$", text, re.M)


def test_the_build_context_leaves_out_host_caches_and_keeps_what_the_dockerfile_copies() -> None:
    """Without a .dockerignore, ``COPY stream_eval`` took the host's ``__pycache__`` and numba cache files (``.nbi``,
    ``.nbc``: of another interpreter or CPU) into the image."""
    ignored = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert {"**/__pycache__", "**/*.nbi", "**/*.nbc", ".git"} <= set(ignored)
    copied = re.findall(r"^COPY (.+) \./", (ROOT / "Dockerfile").read_text(), re.M)
    sources = {source for line in copied for source in line.split()}
    assert sources == {"pyproject.toml", "README.md", "stream_eval"} and not sources & set(ignored)


def test_dockerfile_runs_as_a_non_root_user_without_the_development_broker() -> None:
    text = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)\s*$", text, re.M)
    assert users, "the image must name a USER"
    final = users[-1].split(":")[0]
    assert final not in ("root", "0"), f"the image runs as {final}"
    installs = " ".join(re.findall(r"pip install[^\n&]*", text))
    assert "calfkit" not in text.lower() and "[dev]" not in installs and ".[" not in installs, installs
    dependencies = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[0]
    assert "calfkit" not in dependencies  # the broker is the `dev` extra, not a dependency of the image
    # numba's cache: a directory the user owns, filled (the loops compiled) as that user after the USER line
    cache = re.search(r"^ENV NUMBA_CACHE_DIR=(\S+)$", text, re.M)
    assert cache is not None and f"chown {final} {cache.group(1)}" in text
    assert "warm_up" in text.split(f"USER {users[-1]}")[-1]


@pytest.mark.parametrize("given", [None, "unwritable"])
def test_the_compiled_loops_cache_where_the_package_and_home_cannot_be_written(tmp_path: Path,
                                                                              given: str | None) -> None:
    """The image runs as a user without a home over a site-packages it cannot write: numba, finding none of its
    cache places writable, failed at import ("no locator available"), so every command did; so did an image whose
    NUMBA_CACHE_DIR another uid owns. A ``__pycache__`` that is a file, and directories under a file, cannot be
    written even by root."""
    import sys

    package = tmp_path / "site" / "stream_eval"
    shutil.copytree(ROOT / "stream_eval", package, ignore=shutil.ignore_patterns("__pycache__"))
    for directory in [package, *(d for d in package.rglob("*") if d.is_dir())]:
        (directory / "__pycache__").write_text("not a directory")
    (tmp_path / "afile").write_text("")
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(PYTHONPATH=str(package.parent), XDG_CACHE_HOME=str(tmp_path / "afile" / "cache"),
               HOME=str(tmp_path / "afile"), TMPDIR=str(temp), PYTHONDONTWRITEBYTECODE="1")
    if given:
        env["NUMBA_CACHE_DIR"] = str(tmp_path / "afile" / "numba-cache")
    code = ("import os, numpy as np; from stream_eval.engine import compiled; "
            "print(os.environ['NUMBA_CACHE_DIR']); print(compiled.__file__)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    cache, module = done.stdout.split()
    assert module.startswith(str(package)) and cache.startswith(str(temp)) and "stream-eval-numba" in cache
    assert (Path(cache).stat().st_mode & 0o077) == 0  # this user's alone (numba unpickles what it finds there)


def test_the_numba_cache_is_numbas_own_choice_where_it_can_write(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from stream_eval import numba_cache_dir, private_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # (the directories it makes: not left in /tmp)

    def choose(writable: Callable[[str], bool], given: str = "", private: bool = True) -> str | None:
        return numba_cache_dir("/pkg", "/home/u/.cache/numba", given, writable, lambda path: private)

    assert choose(lambda path: path == "/pkg/__pycache__") is None
    assert choose(lambda path: path.startswith("/home")) is None
    assert choose(lambda path: path == "/cache", given="/cache") is None
    chosen = choose(lambda path: False, given="/cache")  # NUMBA_CACHE_DIR set, but not writable: no say
    assert chosen is not None and "stream-eval-numba" in chosen
    # a shared name that is not this user's private directory (made by someone else, or open to others): not used
    other = choose(lambda path: False, private=False)
    assert other is not None and other != chosen and Path(other).is_dir() and other.startswith(str(tmp_path))
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    assert not private_dir(str(shared)) and private_dir(str(tmp_path / "mine"))


def _bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path (relative to the repository) of a service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts[target] = source[2:]
    return mounts


def test_every_mounted_host_path_exists() -> None:
    compose = _compose()
    named = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source} is not in the repository"
            else:
                assert source in named, f"{name}: volume {source} is not declared"
    expected = {
        "prometheus": {"/etc/prometheus/prometheus.yml": "deploy/prometheus/prometheus.yml",
                       "/etc/prometheus/rules": "deploy/prometheus/rules"},
        "alertmanager": {"/etc/alertmanager/alertmanager.yml": "deploy/alertmanager/alertmanager.yml"},
        "grafana": {"/etc/grafana/provisioning": "deploy/grafana/provisioning",
                    "/var/lib/grafana/dashboards": "deploy/grafana/dashboards"},
    }
    for name, mounts in expected.items():
        assert _bind_mounts(compose["services"][name]).items() >= mounts.items(), name


def test_prometheus_loads_the_mounted_rules_and_reaches_alertmanager() -> None:
    services = _compose()["services"]
    mounts = _bind_mounts(services["prometheus"])
    config = yaml.safe_load((ROOT / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    for pattern in config["rule_files"]:
        directory, glob = pattern.rsplit("/", 1)
        assert directory in mounts, f"{pattern} is not under a mounted directory"
        assert list((ROOT / mounts[directory]).glob(glob)), f"no rule file matches {pattern}"
    targets = [t for am in config["alerting"]["alertmanagers"] for c in am["static_configs"] for t in c["targets"]]
    ports = {p.split(":")[-1] for p in services["alertmanager"]["ports"]}
    assert targets and all(t.split(":")[0] == "alertmanager" and t.split(":")[1] in ports for t in targets)


# --- Grafana ---------------------------------------------------------------------------------------------------

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))

#: The segment A/B series the dashboards must show (the lift and the fixed interval are the A/B panels' alone).
SEGMENT_AB_SHOWN = ("delta", "cs_lower", "cs_upper", "p_value", "rest_delta", "rest_p_value", "differs")
# Every stream_eval series a dashboard may query (docs/contract.md §5, §6, and export/prometheus.py), and whether the
# dashboards must show it. A name not listed here (a typo, a recording rule) fails the test.
SERIES = {
    "stream_eval_requests_total": True,
    "stream_eval_metric_sum_total": True,
    "stream_eval_metric_count_total": True,
    "stream_eval_window_sum": True,
    "stream_eval_window_count": True,
    "stream_eval_window_mean": False,  # one worker's mean: dashboards divide the summed sums and counts instead
    "stream_eval_gsb_total": True,
    "stream_eval_gsb_score": True,
    "stream_eval_gsb_p_value": True,
    "stream_eval_ab_delta": True,
    "stream_eval_ab_ci_lower": True,
    "stream_eval_ab_ci_upper": True,
    "stream_eval_ab_cs_lower": True,
    "stream_eval_ab_cs_upper": True,
    "stream_eval_ab_p_value": True,
    "stream_eval_ab_lift": True,
    "stream_eval_ab_lift_cs_lower": True,
    "stream_eval_ab_lift_cs_upper": True,
    "stream_eval_ab_guardrail_margin": True,
    "stream_eval_ab_guardrail_lower": True,
    "stream_eval_ab_guardrail_upper": True,
    "stream_eval_ab_guardrail_breached": True,
    "stream_eval_ab_guardrail_non_inferior": True,
    "stream_eval_ab_guardrail_relative": True,
    "stream_eval_ab_recommendation": True,
    "stream_eval_ab_units": True,
    "stream_eval_ab_unit_conflicts_total": True,
    "stream_eval_srm_p_value": True,
    "stream_eval_srm_mismatch": True,
    "stream_eval_events_total": True,
    "stream_eval_feedback_delay_seconds_bucket": True,
    "stream_eval_feedback_delay_seconds_sum": False,
    "stream_eval_feedback_delay_seconds_count": False,
    "stream_eval_watermark_seconds": True,
    "stream_eval_label_overflow_total": False,
    # segments (README, "Segments"): the series per segment value and the exploratory segment A/B rows
    "stream_eval_segment_requests_total": True,
    "stream_eval_segment_metric_sum_total": True,
    "stream_eval_segment_metric_count_total": True,
    "stream_eval_segment_window_sum": True,
    "stream_eval_segment_window_count": True,
    "stream_eval_segment_window_mean": False,  # one worker's mean, as stream_eval_window_mean
    "stream_eval_segment_overflow_total": True,
    **{f"stream_eval_segment_ab_{name}": name in SEGMENT_AB_SHOWN for name in (
        "delta", "ci_lower", "ci_upper", "cs_lower", "cs_upper", "p_value", "lift", "lift_cs_lower", "lift_cs_upper",
        "rest_delta", "rest_p_value", "differs")},
}
# The variables a query may use, with the values the promtool check substitutes.
VARIABLES = {"experiment": "exp", "arm": "control", "metric": "MRR", "segment": "platform", "__rate_interval": "1m",
             "__interval": "15s"}


def _datasource_uid() -> str:
    config = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = config["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "prometheus" in _compose()["services"]
    return str(source["uid"])


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and the panels nested in (collapsed) rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _queries() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(file name, panel, target) of every query panel's targets."""
    for path in DASHBOARDS:
        for panel in _panels(json.loads(path.read_text())):
            if panel["type"] != "row":
                for target in panel.get("targets", []):
                    yield path.name, panel, target


def _series(expr: str) -> set[str]:
    """The stream_eval metric names an expression reads (string literals, i.e. label values, left out)."""
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return {name for name in re.findall(r"[A-Za-z_:][\w:]*", code) if "stream_eval" in name}


def _substituted(expr: str, **values: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in VARIABLES, f"unknown variable ${name} in {expr!r}"
        return values.get(name, VARIABLES[name])
    # ($1, ${2}: label_replace's groups, which Grafana leaves as they are: no variable is named by digits)
    return re.sub(r"\$\{([A-Za-z_]\w*)(?::\w+)?\}|\$([A-Za-z_]\w*)", value, expr)


def test_grafana_provisioning_matches_compose() -> None:
    services = _compose()["services"]
    grafana = _bind_mounts(services["grafana"])
    (provider,) = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "stream-eval.yml").read_text())["providers"]
    assert provider["type"] == "file" and provider["folder"] == "stream_eval"
    assert grafana[provider["options"]["path"]] == "deploy/grafana/dashboards"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    directory, name = home.rsplit("/", 1)
    assert (ROOT / grafana[directory] / name).is_file()
    assert any(p.endswith(":3000") for p in services["grafana"]["ports"])


def test_dashboards_exist_with_unique_uids_and_panel_ids() -> None:
    assert [p.name for p in DASHBOARDS] == ["stream-eval.json"]
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARDS]
    assert len(set(uids)) == len(uids)
    for path in DASHBOARDS:
        ids = [panel["id"] for panel in _panels(json.loads(path.read_text()))]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"


def test_every_panel_queries_the_provisioned_datasource() -> None:
    uid = _datasource_uid()
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                assert variable["datasource"]["uid"] == uid, variable["name"]
        for panel in _panels(dashboard):
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == uid, panel["title"]
            assert panel.get("description", "").strip(), f"{panel['title']}: no description"
            assert panel["targets"], f"{panel['title']}: no target"
            for target in panel["targets"]:
                assert target.get("datasource", panel["datasource"])["uid"] == uid, panel["title"]


def test_every_query_reads_known_series_with_known_variables() -> None:
    queries = list(_queries())
    assert len(queries) > 10
    for name, panel, target in queries:
        expr = target.get("expr", "")
        assert expr.strip(), f"{name} {panel['title']} {target['refId']}: empty expr"
        found = _series(expr)
        assert found, f"{panel['title']}: reads no stream_eval series"
        assert found <= set(SERIES), f"{panel['title']}: unknown series {found - set(SERIES)}"
        _substituted(expr)
    for path in DASHBOARDS:
        for variable in json.loads(path.read_text())["templating"]["list"]:
            query = variable.get("query", "")
            query = query if isinstance(query, str) else query.get("query", "")
            assert _series(query) <= set(SERIES), variable["name"]
            _substituted(query)


def test_dashboards_show_every_series_of_the_contract() -> None:
    shown = set().union(*(_series(target["expr"]) for _, _, target in _queries()))
    missing = {name for name, required in SERIES.items() if required} - shown
    assert not missing, f"no panel shows {sorted(missing)}"


def test_a_b_gauges_are_taken_with_max_and_units_summed() -> None:
    """The A/B rows and sign tests come from one worker of a group (the stage partition merging them): a sum would
    count them once per worker that ever exported them. Each worker exports the units of its stage partitions'
    shards: they are summed."""
    single = {"stream_eval_ab_delta", "stream_eval_ab_ci_lower", "stream_eval_ab_ci_upper", "stream_eval_ab_cs_lower",
              "stream_eval_ab_cs_upper", "stream_eval_ab_p_value", "stream_eval_srm_p_value",
              "stream_eval_srm_mismatch", "stream_eval_gsb_p_value", "stream_eval_ab_lift",
              "stream_eval_ab_lift_cs_lower", "stream_eval_ab_lift_cs_upper", "stream_eval_ab_recommendation",
              *(f"stream_eval_ab_guardrail_{name}" for name in ("margin", "lower", "upper", "breached",
                                                                "non_inferior")),
              *(f"stream_eval_segment_ab_{name}" for name in SEGMENT_AB_SHOWN)}
    summed = {"stream_eval_ab_units", "stream_eval_ab_unit_conflicts_total"}
    checked = set()
    for _, panel, target in _queries():
        for name in _series(target["expr"]) & (single | summed):
            aggregation = "sum" if name in summed else "max"
            assert re.search(rf"{aggregation} by \([^)]*\) \({name}\{{", target["expr"]), (panel["title"], name)
            checked.add(name)
    assert {"stream_eval_ab_delta", "stream_eval_srm_p_value", "stream_eval_gsb_p_value",
            "stream_eval_ab_units", "stream_eval_ab_lift", "stream_eval_ab_recommendation",
            "stream_eval_ab_guardrail_breached", "stream_eval_segment_ab_delta",
            "stream_eval_segment_ab_differs"} <= checked


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        if in_ci():
            pytest.fail("promtool is not on PATH (scripts/test installs it)")
        pytest.skip("promtool is not on PATH")
    return promtool


def _build_module() -> ModuleType:
    if not in_ci():
        pytest.importorskip("grafana_foundation_sdk")  # in the test extra; CI always has it
    spec = importlib.util.spec_from_file_location("stream_eval_grafana_build", GRAFANA / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_dashboard_equals_the_generator_output() -> None:
    build = _build_module()
    assert (GRAFANA / "dashboards" / "stream-eval.json").read_text(encoding="utf-8") == build.render(), (
        "stream-eval.json is out of date: run python3 deploy/grafana/build.py")
    assert build.DATASOURCE_UID == _datasource_uid()


@pytest.mark.slow
def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    promtool = _promtool()
    rules = []
    for name, panel, target in _queries():
        record = re.sub(r"[^\w:]", "_", f"dashboard:{name}_{panel['id']}_{target['refId']}")
        rules.append({"record": record, "expr": _substituted(target["expr"])})
    for path in DASHBOARDS:  # the variables' queries wrap a selector in label_values(...)
        for variable in json.loads(path.read_text())["templating"]["list"]:
            inner = re.fullmatch(r"label_values\((.*), *\w+\)", variable.get("query", ""))
            if inner:
                rules.append({"record": f"dashboard:variable_{variable['name']}", "expr": _substituted(inner[1])})
    file = tmp_path / "dashboard-rules.yml"
    file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}, sort_keys=False))
    result = subprocess.run([promtool, "check", "rules", str(file)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout + result.stderr


def _target(title: str, ref_id: str, metric: str = ".*") -> str:
    """A query of the dashboard, for experiment "exp" and every arm and metric (or ``metric``: one copy of a panel
    that repeats per metric)."""
    (expr,) = [t["expr"] for _, panel, t in _queries() if panel["title"] == title and t["refId"] == ref_id]
    return _substituted(expr, arm=".*", metric=metric)


@pytest.mark.slow
def test_queries_compute_what_their_panels_say(tmp_path: Path) -> None:
    """A few queries evaluated by promtool on made-up series of two workers: the decision mapping, means as sums
    over workers, the GSB score from the counts, the event-time lag, the recommendation and guardrail status per
    treatment (a worker that exported them before a hand-over keeps its old values until they go stale), a segment
    value's means and its exploratory row's flag."""
    def series(name: str, values: str, **labels: str) -> dict[str, str]:
        return {"series": name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}

    def sample(value: float, **labels: str) -> dict[str, Any]:
        return {"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "value": value}

    nan = " ".join(["NaN"] * 6)
    bounds = {"MRR": ("0.01", "0.05"), "nDCG@10": ("-0.05", "-0.01"), "ERR@10": ("-0.01", "0.02"), "GAUC": (nan, nan),
              "Abandoned": ("-0.05", "-0.01"), "TimeToFirstClick": ("0.5", "2")}  # lower is better: fell, rose
    inputs = [series(f"stream_eval_ab_cs_{side}", f"{value}x5" if value != nan else value, experiment="exp",
                     metric=metric, instance="w1")
              for metric, (lower, upper) in bounds.items() for side, value in (("lower", lower), ("upper", upper))]
    for instance, rr_sum, window_sum, good in (("w1", "3", "1", "4"), ("w2", "1", "2", "2")):
        labels = {"experiment": "exp", "arm": "control", "instance": instance}
        inputs += [
            series("stream_eval_metric_sum_total", f"0+{rr_sum}x5", metric="RR", **labels),
            series("stream_eval_metric_count_total", "0+4x5", metric="RR", **labels),
            series("stream_eval_window_sum", f"{window_sum}x5", metric="MRR", window="5m", **labels),
            series("stream_eval_window_count", "2x5", metric="MRR", window="5m", **labels),
            series("stream_eval_gsb_total", f"{good}x5", experiment="exp", source="judgment", verdict="good",
                   instance=instance),
            series("stream_eval_gsb_total", "1x5", experiment="exp", source="judgment", verdict="same",
                   instance=instance),
            series("stream_eval_gsb_total", "1x5", experiment="exp", source="judgment", verdict="bad",
                   instance=instance),
        ]
    inputs += [series("stream_eval_metric_sum_total", "0x5", experiment="exp", arm="treatment", metric="RR"),
               series("stream_eval_metric_count_total", "0x5", experiment="exp", arm="treatment", metric="RR"),
               series("stream_eval_watermark_seconds", "60x5", instance="w1"),
               series("stream_eval_watermark_seconds", "200x5", instance="w2")]
    # three treatments, one recommendation each (w2 holds a stale "keep running" of b from before a hand-over)
    for arm, recommendation, instance in (("b", "ship", "w1"), ("b", "keep running", "w2"), ("c", "rollback", "w1"),
                                          ("d", "keep running", "w1")):
        value = "0x5" if instance == "w2" else "1x5"
        inputs.append(series("stream_eval_ab_recommendation", value, experiment="exp", arm=arm,
                             recommendation=recommendation, instance=instance))
    for arm, non_inferior, breached in (("b", "1", "0"), ("c", "0", "1"), ("d", "0", "0")):
        for name, value in (("non_inferior", non_inferior), ("breached", breached)):
            inputs.append(series(f"stream_eval_ab_guardrail_{name}", f"{value}x5", experiment="exp", arm=arm,
                                 metric="SatClick", instance="w1"))
    segment = {"experiment": "exp", "segment_field": "platform", "segment_value": "ios"}
    for instance, window_sum, total, differs in (("w1", "1", "0+3x5", "1x5"), ("w2", "2", "0+1x5", "0x5")):
        labels = {**segment, "arm": "control", "instance": instance}
        inputs += [
            series("stream_eval_segment_window_sum", f"{window_sum}x5", metric="MRR", window="1h", **labels),
            series("stream_eval_segment_window_count", "2x5", metric="MRR", window="1h", **labels),
            series("stream_eval_segment_window_sum", "9x5", metric="MRR", window="5m", **labels),  # not read
            series("stream_eval_segment_window_sum", "1x5", metric="nDCG@10", window="1h", **labels),
            series("stream_eval_segment_window_count", "2x5", metric="nDCG@10", window="1h", **labels),
            # (the cumulative series name a measure per request, RR; the windows and A/B series by its mean, MRR)
            series("stream_eval_segment_metric_sum_total", total, metric="RR", **labels),
            series("stream_eval_segment_metric_count_total", "0+4x5", metric="RR", **labels),
            series("stream_eval_segment_metric_sum_total", "0+1x5", metric="nDCG@10", **labels),
            series("stream_eval_segment_metric_count_total", "0+4x5", metric="nDCG@10", **labels),
            series("stream_eval_segment_metric_sum_total", "0+3x5", metric="AP(rel=2)@10", **labels),
            series("stream_eval_segment_metric_count_total", "0+4x5", metric="AP(rel=2)@10", **labels),
            series("stream_eval_segment_ab_differs", differs, metric="MRR", **{**labels, "arm": "treatment"}),
        ]
    checks = [
        # (1 + 2) / (2 + 2) in the last hour; (3 + 1) * 5 / (4 + 4) * 5 cumulative
        # (per metric: with $metric at "All" the panel repeats, and no query adds two metrics' sums together)
        (_target("$metric per arm and segment value", "A"), [sample(0.75, arm="control", metric="MRR", **segment),
                                                            sample(0.5, arm="control", metric="nDCG@10", **segment)]),
        (_target("$metric per arm and segment value", "B", "MRR"),
         [sample(0.5, arm="control", metric="MRR", **segment)]),
        (_target("$metric per arm and segment value", "B", "nDCG@10"),
         [sample(0.25, arm="control", metric="nDCG@10", **segment)]),
        (_target("$metric per arm and segment value", "B", "MAP(rel=2)@10"),  # (the raw value: no escapes)
         [sample(0.75, arm="control", metric="MAP(rel=2)@10", **segment)]),
        # w2's 0 is a stale value from before a hand-over: the row is flagged (max over workers)
        (_target("Segment rows: each treatment vs control within a segment value", "A"),
         [sample(1, arm="treatment", metric="MRR", **segment)]),
        (_target("Decisions: each treatment vs control, every metric", "A"),
         [sample(1, experiment="exp", metric="MRR"), sample(-1, experiment="exp", metric="nDCG@10"),
          sample(0, experiment="exp", metric="ERR@10"), sample(0, experiment="exp", metric="GAUC"),
          sample(1, experiment="exp", metric="Abandoned"), sample(-1, experiment="exp", metric="TimeToFirstClick")]),
        # (3 + 1) * 5 / (4 + 4) * 5; the treatment counted nothing yet: no value rather than NaN
        (_target("MRR per arm", "C"), [sample(0.5, experiment="exp", arm="control")]),
        (_target("MRR per arm", "A"), [sample(0.75, experiment="exp", arm="control")]),  # (1 + 2) / (2 + 2)
        (_target("GSB score", "A"), [sample(0.4, experiment="exp", source="judgment")]),  # (6 - 2) / 10
        (_target("Event-time lag", "A"), [sample(240)]),  # at 300 s, the slowest watermark is 60
        (_target("Recommendation per treatment", "A"),  # 1 ship, 0 keep running, -1 rollback
         [sample(1, experiment="exp", arm="b"), sample(-1, experiment="exp", arm="c"),
          sample(0, experiment="exp", arm="d")]),
        (_target("Guardrails: each treatment against the tolerated loss", "A"),  # 1 within, -1 breached, 0 unproven
         [sample(1, experiment="exp", arm="b", metric="SatClick"), sample(-1, experiment="exp", arm="c",
                                                                          metric="SatClick"),
          sample(0, experiment="exp", arm="d", metric="SatClick")]),
    ]
    tests = {"interval": "1m", "input_series": inputs,
             "promql_expr_test": [{"expr": expr, "eval_time": "5m", "exp_samples": expected}
                                  for expr, expected in checks]}
    file = tmp_path / "dashboard-test.yml"
    file.write_text(yaml.safe_dump({"evaluation_interval": "1m", "tests": [tests]}, sort_keys=False))
    result = subprocess.run([_promtool(), "test", "rules", str(file)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_input_topics_keep_a_produced_log() -> None:
    """The compose made the input topics with the broker's 7-day retention: `stream-eval produce` stamps messages
    with their events' times, so a log older than that was deleted at the broker's next check, read or not."""
    script = "\n".join(_compose()["services"]["create-topics"]["command"])
    for topic in ("rankings", "feedback", "judgments"):
        loops = [block for block in script.split("for topic in ")[1:] if topic in block.split(";")[0].split()]
        assert len(loops) == 1, topic
        assert "--config retention.ms=-1" in loops[0].split("done")[0], topic
