"""Measures as values (docs/contract.md §7): the name grammar, the registry, ``metrics`` choosing what runs, and the
names used as keys everywhere (report, per-request records, A/B rows, the Prometheus ``metric`` label)."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support import AbstractTimeConfig as Config

from stream_eval.config import ConfigError, load_config
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.events.schema import Feedback, Ranking, finish
from stream_eval.export.prometheus import EngineCollector
from stream_eval.metrics.kernels import evaluate_request
from stream_eval.metrics.specs import REGISTRY, MetricNameError, MetricSpec, parse, select

TESTS = Path(__file__).resolve().parent
ISSUE_NAMES = ("nDCG@10", "nDCG(gain=linear)@10", "P(rel=2)@5", "RR(rel=2)", "AP", "R@100", "R-Prec", "Success@10",
               "Judged@10", "RBP(p=0.8)", "ERR@10", "alpha-nDCG(alpha=0.5)@10", "DCG@10")


# -- the registry: every family has an oracle test ------------------------------------------------------------
def _oracle_marks() -> dict[str, list[str]]:
    """family -> the tests marked ``@oracle_for(family, ...)``, read from the test files' source."""
    covered: dict[str, list[str]] = {}
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "oracle_for":
                    for arg in decorator.args:
                        assert isinstance(arg, ast.Constant), f"{path.name}:{node.name}: oracle_for takes names"
                        covered.setdefault(arg.value, []).append(f"{path.name}::{node.name}")
    return covered


def test_every_registered_measure_has_an_oracle_test() -> None:
    covered = _oracle_marks()
    missing = [name for name in REGISTRY if name not in covered]
    assert not missing, f"measures without an @oracle_for test (README, 'Adding a measure'): {missing}"
    assert not set(covered) - set(REGISTRY), "an @oracle_for names a measure that is not registered"
    for family in REGISTRY.values():
        assert family.oracle, family.name  # the registry says what it is checked against


# -- the grammar ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ISSUE_NAMES)
def test_issue_names_are_canonical(name: str) -> None:
    assert parse(name).name == name
    assert parse(parse(name).name) == parse(name)


@pytest.mark.parametrize(("written", "canonical"), [
    ("MRR", "RR"), ("MAP(rel=2)", "AP(rel=2)"), (" nDCG( gain = 'linear' )@10 ", "nDCG(gain=linear)@10"),
    ("Rprec", "R-Prec"), ("alpha_nDCG(alpha=0.25)@5", "alpha-nDCG(alpha=0.25)@5"), ("RBP(rel=2,p=0.5)",
    "RBP(p=0.5,rel=2)"), ("P(rel=2.0)@5", "P(rel=2)@5"), ("RBP", "RBP"), ("Judged", "Judged"),
    ("P(rel=1.5)@3", "P(rel=1.5)@3"),
])
def test_spellings_parse_to_one_canonical_name(written: str, canonical: str) -> None:
    assert parse(written).name == canonical


@pytest.mark.parametrize("name", [
    "nDCG", "RR@10", "Foo@10", "P(rel=0)@5", "nDCG(gain=cubic)@10", "nDCG(rel=2)@10", "P@0", "P@ten",
    "RBP(p=1)", "P(rel)@5", "P(rel=1,rel=2)@5", "alpha-nDCG(alpha=1)@10", "nDCG@10@5", "",
])
def test_bad_names_are_refused_with_a_reason(name: str) -> None:
    with pytest.raises(MetricNameError):
        parse(name)


def test_means_keep_their_names() -> None:
    assert [parse(n).mean_name for n in ("RR", "AP", "RR(rel=2)", "nDCG@10", "R-Prec")] == [
        "MRR", "MAP", "MRR(rel=2)", "nDCG@10", "R-Prec"]


def test_specs_are_values() -> None:
    assert MetricSpec("P", 5, (("rel", "2"),)) == parse("P(rel=2)@5")
    assert len({parse("P(rel=2)@5"), parse("P(rel=2.0)@5")}) == 1
    assert MetricSpec("nDCG", 10).name == "nDCG@10"


# -- choosing what runs -----------------------------------------------------------------------------------------
def test_default_is_todays_set() -> None:
    config = Config(cutoffs=(5, 10))
    assert [s.name for s in config.specs] == [
        "RR", "AP", "P@5", "P@10", "R@5", "R@10", "DCG@5", "DCG@10", "nDCG@5", "nDCG@10", "ERR@5", "ERR@10",
        "alpha-nDCG@5", "alpha-nDCG@10"]
    assert config.gsb_metric == "nDCG@10"


def test_family_without_cutoff_runs_at_every_cutoff_and_rbp_brings_its_residual() -> None:
    assert [s.name for s in select(["P(rel=2)", "RBP(p=0.5)", "RR", "MRR"], (1, 3))] == [
        "P(rel=2)@1", "P(rel=2)@3", "RBP(p=0.5)", "RBP-Res(p=0.5)", "RR"]


def test_metrics_from_file_environment_and_flag(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text('metrics = ["nDCG(gain=linear)@10", "RBP(p=0.8,rel=2)"]\n')
    from_file = load_config(str(path), environ={})
    assert [s.name for s in from_file.specs] == ["nDCG(gain=linear)@10", "RBP(p=0.8,rel=2)", "RBP-Res(p=0.8)"]
    from_env = load_config(environ={"STREAM_EVAL_METRICS": "RBP(p=0.8,rel=2),AP"})
    assert [s.name for s in from_env.specs] == ["RBP(p=0.8,rel=2)", "RBP-Res(p=0.8)", "AP"]
    flag = load_config(str(path), overrides={"metrics": "RR,P@5"}, environ={})
    assert [s.name for s in flag.specs] == ["RR", "P@5"] and flag.gsb_metric == "RR"
    assert flag.to_json()["metrics"] == ["RR", "P@5"]
    # GAUC, which the measures table lists, is reported whatever is named: naming it was "unknown measure"
    with_gauc = load_config(overrides={"metrics": "nDCG@10,GAUC"}, environ={})
    assert [s.name for s in with_gauc.specs] == ["nDCG@10"]


@pytest.mark.parametrize(("settings", "message"), [
    ({"metrics": ("nDCG(gain=cubic)@10",)}, "metrics: parameter gain"),
    ({"metrics": ("RR",), "gsb_metric": "nDCG@10"}, "gsb_metric"),
    ({"metrics": ("alpha-nDCG@10", "RR"), "gsb_metric": "alpha-nDCG@10"}, "gsb_metric"),
    ({"metrics": ("GAUC",)}, "GAUC is always reported; name the per-request measures"),
])
def test_bad_metrics_settings_are_config_errors(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config(**settings)


def test_global_settings_are_defaults_for_names_that_do_not_say() -> None:
    grades = [1, 2, None, 0, 3]
    config = Config(gain="exp", rel_threshold=2.0, metrics=("nDCG@5", "nDCG(gain=linear)@5", "P@5", "P(rel=1)@5"))
    ours = evaluate_request(grades, config)
    linear = evaluate_request(grades, Config(gain="linear", metrics=("nDCG@5",)))
    exp = evaluate_request(grades, Config(gain="exp", metrics=("nDCG@5",)))
    assert ours["nDCG(gain=linear)@5"] == linear["nDCG@5"] and ours["nDCG@5"] == exp["nDCG@5"]
    assert (ours["P@5"], ours["P(rel=1)@5"]) == (2 / 5, 3 / 5)


def test_empty_is_judged_at_each_measures_own_threshold() -> None:
    # grade 1 only: not empty at rel 1, empty at rel 2 (skip: left out), nDCG follows rel_threshold
    skip = Config(empty="skip", metrics=("RR", "RR(rel=2)", "P(rel=2)@3", "nDCG@3"))
    ours = evaluate_request([0, 1], skip)
    assert ours["RR"] == 0.5 and math.isnan(ours["RR(rel=2)"]) and math.isnan(ours["P(rel=2)@3"])
    assert ours["nDCG@3"] > 0


# -- the names as keys everywhere -------------------------------------------------------------------------------
def _events(config: Any) -> list[Any]:
    events: list[Any] = []
    for r in range(40):
        arm = "a" if r % 2 else "b"
        items = [f"r{r}-d{i}" for i in range(6)]
        events.append(Ranking(f"r{r}", items, ts=1_767_225_600.0 + r, experiment="e", arm=arm, session_id=f"s{r}"))
        for i, grade in enumerate((r % 3, 0, r % 4, None, 2, None)):
            if grade is not None:
                events.append(Feedback(f"r{r}", items[i], kind="label", grade=float(grade), ts=1_767_225_601.0 + r))
    return [finish(e, config) for e in events]


def test_names_key_the_report_records_ab_rows_and_prometheus_label() -> None:
    config = Config(metrics=ISSUE_NAMES)
    records: list[dict[str, object]] = []

    def keep(batch: FinalisedBatch) -> None:
        records.extend(batch.records())

    engine = Engine(config, on_finalised=keep)
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    engine.process(_events(config))
    engine.flush()
    report = engine.report()
    per_request = [s.name for s in config.specs]
    means = [s.mean_name for s in config.specs if not s.needs_subtopics]
    assert "RBP-Res(p=0.8)" in per_request
    assert list(records[0]["metrics"]) == per_request  # type: ignore[call-overload]
    assert list(report["overall"]["metrics"]) == [*means, "GAUC"]
    assert {row["metric"] for row in report["ab"]} == {*means, "GAUC"}
    one = {n: evaluate_request([0, 0, 0, None, 2, None], config)[n] for n in per_request}  # request r0
    assert records[0]["request_id"] == "r0"
    for name in per_request:
        value = records[0]["metrics"][name]  # type: ignore[index]
        assert (value is None and math.isnan(one[name])) or value == pytest.approx(one[name], abs=1e-12), name
    for spec in config.specs:
        if spec.needs_subtopics:
            continue
        labels = {"experiment": "e", "arm": "a", "metric": spec.name}
        count = registry.get_sample_value("stream_eval_metric_count_total", labels)
        if count is None:  # the collector may label counters by partition: sum over them
            count = sum(s.value for f in registry.collect() for s in f.samples
                        if s.name == "stream_eval_metric_count_total"
                        and all(s.labels.get(k) == v for k, v in labels.items()))
        assert count == 20, spec.name


def test_replay_metrics_flag(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    lines = [{"type": "ranking", "request_id": "r1", "ts": 1_767_225_600, "items": ["a", "b", "c"]},
             {"type": "feedback", "request_id": "r1", "item": "b", "kind": "label", "grade": 2, "ts": 1_767_225_601},
             {"type": "feedback", "request_id": "r1", "item": "c", "kind": "label", "grade": 0, "ts": 1_767_225_601}]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "per-request.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "stream_eval.cli", "replay", str(log), "--format", "json", "--no-progress",
         "--metrics", "RR(rel=2),P(rel=2)@2,Judged@3,RBP(p=0.5),GAUC", "--gsb-window", "30m",
         "--per-request", str(out)],
        capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    assert report["config"]["gsb_window"] == 1800.0  # (--gsb-window, which README lists among the flags)
    assert report["overall"]["metrics"] == {"MRR(rel=2)": 0.5, "P(rel=2)@2": 0.5, "Judged@3": 2 / 3,
                                            "RBP(p=0.5)": 0.25, "RBP-Res(p=0.5)": 0.625, "GAUC": 0.5}
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["metrics"] == {"RR(rel=2)": 0.5, "P(rel=2)@2": 0.5, "Judged@3": 2 / 3, "RBP(p=0.5)": 0.25,
                                 "RBP-Res(p=0.5)": 0.625}
