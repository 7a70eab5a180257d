"""A/B/n: an experiment with one control and several treatments (docs/contract.md §3, §6).

Oracles: each treatment's rows equal, field for field, the rows of a two-arm replay of the same log without the
other treatments' requests (a treatment's comparison depends on its own and the control's units only); the SRM test
is scipy's chi-square over all the arms.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import orjson
import pytest
import scipy.stats

from stream_eval.config import Arms, Config, ConfigError, ExperimentSettings, _read, load_config
from stream_eval.engine.ab import LookMerger
from stream_eval.engine.replay import replay
from stream_eval.simulate import SimulationConfig, simulate_lines

#: The fields of an ``ab`` row that depend only on the control's and the treatment's units.
PAIR_FIELDS = ("experiment", "control", "treatment", "metric", "delta", "ci_lower", "ci_upper", "cs_lower",
               "cs_upper", "p_value", "units_control", "units_treatment", "n_control", "n_treatment", "lift",
               "lift_ci_lower", "lift_ci_upper", "lift_cs_lower", "lift_cs_upper")
ARMS = (("a-control", 0.55), ("b-better", 0.75), ("c-worse", 0.35))


def _config(text: str) -> Config:
    """The Config of a TOML text, as ``--config`` reads it."""
    return Config(**_read(tomllib.loads(text), "test"))


def test_control_alone_makes_every_other_arm_a_treatment() -> None:
    config = _config('[experiments.e]\ncontrol = "b"\n')
    assert config.arms_for("e", {"a", "b", "c"}) == Arms("b", ("a", "c"))
    assert config.arms_for("e", {"b"}) is None  # no treatment yet: no rows
    # no table: the first arm by name is the control, every other arm a treatment (none left out)
    assert config.arms_for("other", {"z", "y", "x"}) == Arms("x", ("y", "z"))
    # a two-arm config compares its two arms only
    two = _config('[experiments.e]\ncontrol = "b"\ntreatment = "a"\n')
    assert two.arms_for("e", {"a", "b", "c"}) == Arms("b", ("a",))
    assert two.to_json()["experiments"] == {"e": {"control": "b", "treatment": "a"}}


@pytest.mark.parametrize(("text", "message"), [
    ('[experiments.e]\ntreatment = "a"\n', "needs its control"),
    ('[experiments.e]\ncontrol = "a"\ntreatment = "a"\n', "cannot be a treatment too"),
    ('[experiments.e]\ncontrol = "x"\nsplit = {a = 1, b = 1}\n', "arms of the split"),
    ('[experiments.e]\ncontrl = "a"\n', r"unknown setting\(s\) contrl \(known: control, treatment, split"),
    # a measure that is not among `metrics` says so (it read as if the name were wrong)
    ('[experiments.e]\ncontrol = "a"\nguardrails = {"SatClick" = "-1%"}\n',
     r"'SatClick' is not a metric of the A/B rows .*; it is a measure, not among `metrics`: add it there"),
    ('[experiments.e]\ncontrol = "a"\nprimary = ["Foo"]\n', r"'Foo' is not a metric of the A/B rows \([^)]*\)$"),
    # (an arm with almost nothing, which made the SRM check fail with a traceback after the whole replay)
    ('[experiments.e]\nsplit = {a = 1e300, b = 1e-300}\n', "'b' would get 0 of the units"),
    ('[experiments.e]\nsplit = {a = 1, b = 1e-320}\n', "at least 1e-09 of the total"),
])
def test_experiment_tables_that_cannot_be_used_are_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(text)


def test_shares_too_large_to_sum_are_scaled() -> None:
    """Shares of 1e308 summed to infinity: every expected share was 0, and the SRM check failed with a traceback
    after the whole replay."""
    assert _config('[experiments.e]\nsplit = {a = 1e308, b = 1e308}\n').split_for("e", set()) == {"a": 0.5, "b": 0.5}
    # shares that sum to 1 are kept as written (they were echoed as 0.33999999999999997 in the report and SRM rows)
    thirds = _config('[experiments.e]\nsplit = {a = 0.34, b = 0.33, c = 0.33}\n')
    assert thirds.split_for("e", set()) == {"a": 0.34, "b": 0.33, "c": 0.33}
    assert thirds.to_json()["experiments"]["e"]["split"] == {"a": 0.34, "b": 0.33, "c": 0.33}


def test_a_config_file_with_three_arms(tmp_path: Path) -> None:
    path = tmp_path / "abn.toml"
    path.write_text('[experiments.e]\ncontrol = "a"\nsplit = {a = 2, b = 1, c = 1}\n')
    config = load_config(str(path), environ={})
    assert dict(config.experiments)["e"] == ExperimentSettings(
        control="a", split=(("a", 0.5), ("b", 0.25), ("c", 0.25)))


def _log(tmp_path: Path, arms: tuple[tuple[str, float], ...], name: str, seed: int = 5) -> Path:
    sim = SimulationConfig(requests=4000, seed=seed, arms=arms, label_rate=0.3, duplicate_fraction=0.02)
    path = tmp_path / name
    path.write_bytes(b"".join(simulate_lines(sim)))
    return path


def _without_arm(source: Path, arm: str, target: Path) -> Path:
    """The log without the rankings of ``arm`` (their feedback stays: orphans, which no A/B row sees)."""
    lines = [line for line in source.read_bytes().splitlines(keepends=True)
             if not (b'"ranking"' in line and orjson.loads(line).get("arm") == arm)]
    target.write_bytes(b"".join(lines))
    return target


def test_each_treatment_is_compared_with_the_control_as_in_a_two_arm_run(tmp_path: Path) -> None:
    config = Config(look_every=600.0)
    log = _log(tmp_path, ARMS, "three.jsonl")
    three = replay([str(log)], config)
    rows = three.ab()
    assert {row["treatment"] for row in rows} == {"b-better", "c-worse"}
    assert {row["control"] for row in rows} == {"a-control"}
    for left_out, kept in (("c-worse", "b-better"), ("b-better", "c-worse")):
        two = replay([str(_without_arm(log, left_out, tmp_path / f"no-{left_out}.jsonl"))], config)
        expected = [{k: row[k] for k in PAIR_FIELDS} for row in two.ab()]
        got = [{k: row[k] for k in PAIR_FIELDS} for row in rows if row["treatment"] == kept]
        assert got == expected  # bit for bit
    # the better arm wins, the worse loses (the simulator's qualities are far apart)
    decided = {(row["treatment"], row["decision"]) for row in rows if row["metric"] == "nDCG@10"}
    assert decided == {("b-better", "better"), ("c-worse", "worse")}
    # one SRM test over the three arms
    [srm] = three.srm()
    units = srm["units"]
    assert set(units) == {"a-control", "b-better", "c-worse"}
    oracle = scipy.stats.chisquare([units[arm] for arm, _ in ARMS])
    assert srm["chi2"] == pytest.approx(oracle.statistic, rel=1e-12)
    assert srm["p_value"] == pytest.approx(oracle.pvalue, rel=1e-9)
    # GSB: each treatment against the control
    gsb = {(row["treatment"], row["source"]) for row in three.gsb_rows()}
    assert gsb == {("b-better", "metric"), ("c-worse", "metric")}


def test_an_arm_given_as_the_empty_string_is_the_default_arm_in_gsb_rows(tmp_path: Path) -> None:
    """Only a judgment's GSB row has no treatment (null). An arm given as "" is an arm not given (docs/contract.md
    §1): ``default``, a treatment like any other."""
    engine = replay([str(_log(tmp_path, (("a-control", 0.55), ("", 0.75)), "empty-arm.jsonl"))],
                    _config('[experiments.exp1]\ncontrol = "a-control"\n'))
    assert {row["treatment"] for row in engine.ab()} == {"default"}
    assert [(row["treatment"], row["source"]) for row in engine.gsb_rows()] == [("default", "metric")]


def test_a_configured_control_that_does_not_sort_first(tmp_path: Path) -> None:
    config = _config('[experiments.exp1]\ncontrol = "b-better"\n')
    engine = replay([str(_log(tmp_path, ARMS, "three.jsonl"))], config)
    pairs = {(row["control"], row["treatment"]) for row in engine.ab()}
    assert pairs == {("b-better", "a-control"), ("b-better", "c-worse")}


def test_a_merger_state_written_before_a_b_n_is_read(tmp_path: Path) -> None:
    """A checkpointed merger state of a two-arm experiment, as written before A/B/n (one pair per experiment, its
    SRM p-value fifth), restores to the same rows."""
    engine = replay([str(_log(tmp_path, ARMS[:2], "two.jsonl"))], Config(look_every=600.0))
    merger = engine.ledger.merger
    state = orjson.loads(orjson.dumps(merger.state_to_json()))
    for name, running in state["running"].items():
        [(pair, p, lower, upper, lift_lower, lift_upper)] = running["pairs"]
        state["running"][name] = [pair, p, lower, upper, running["srm"], lift_lower, lift_upper]
    restored = LookMerger(engine.config, merger.names)
    restored.restore_json(state)
    assert repr(restored.results()) == repr(merger.results()) and merger.results()[0]  # (NaN: compared as text)


@pytest.mark.parametrize(("text", "message"), [
    ('[experiments.e]\nguardrails = {"ERR@10" = "1%"}\n', "a fall"),
    ('[experiments.e]\nguardrails = {"nDCG@7" = "-1%"}\n', "not a metric"),
    ('[experiments.e]\nguardrails = {"ERR@10" = "lots"}\n', "expected a number"),
    ('[experiments.e]\nguardrails = {"ERR@10" = "-100%"}\n', "can never be breached"),
    ('[experiments.e]\nprimary = ["MRR"]\nguardrails = {"MRR" = -0.01}\n', "both primary and a guardrail"),
])
def test_guardrails_that_cannot_be_used_are_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(text)


def test_a_guardrail_is_a_non_inferiority_test_and_leads_the_recommendation(tmp_path: Path) -> None:
    """b-better is better than the control, c-worse worse. GAUC, a guardrail of -0.01 (absolute): b is shown
    non-inferior (its sequence wholly above -0.01), c breaches it (wholly below). ERR@10, a guardrail of -50 %
    (relative, on the lift): both are within it. So b ships and c is rolled back."""
    log = _log(tmp_path, ARMS, "three.jsonl")
    config = _config('[experiments.exp1]\nguardrails = {"ERR@10" = "-50%", "GAUC" = -0.01}\n')
    engine = replay([str(log)], config)
    rows = {(row["treatment"], row["metric"]): row for row in engine.ab()}
    good, bad = rows["b-better", "GAUC"], rows["c-worse", "GAUC"]
    assert good["guardrail"] and good["margin"] == -0.01 and not good["margin_relative"]
    assert good["non_inferior"] and not good["breached"] and good["cs_lower"] > -0.01
    assert bad["breached"] and not bad["non_inferior"] and bad["cs_upper"] < -0.01
    for treatment in ("b-better", "c-worse"):
        relative = rows[treatment, "ERR@10"]
        assert relative["margin"] == -0.5 and relative["margin_relative"] and relative["non_inferior"]
        assert relative["lift_cs_lower"] > -0.5
    assert not rows["b-better", "MRR"]["guardrail"] and "margin" not in rows["b-better", "MRR"]
    recommendation = {r["treatment"]: r for r in engine.experiments()}
    assert recommendation["c-worse"]["recommendation"] == "rollback"
    assert recommendation["c-worse"]["breached"] == ["GAUC"]
    assert recommendation["b-better"]["recommendation"] == "ship"
    assert "nDCG@10" in recommendation["b-better"]["better"] and not recommendation["b-better"]["unproven"]
    # the report's config gives them as written: a relative loss as its text, an absolute one as a number
    assert engine.report()["config"]["experiments"]["exp1"]["guardrails"] == {"ERR@10": "-50%", "GAUC": -0.01}
    # a tighter tolerance that b has not been shown within: keep running
    strict = replay([str(log)], _config('[experiments.exp1]\nguardrails = {"GAUC" = -0.001}\n'))
    assert {r["treatment"]: r["recommendation"] for r in strict.experiments()}["b-better"] == "keep running"
    # a guardrail no unit has a value of (no subtopics in this log: no alpha-nDCG row) has shown nothing: it was
    # left out, and b shipped
    unseen = replay([str(log)], _config('[experiments.exp1]\nguardrails = {"alpha-nDCG@10" = -0.01}\n'))
    assert not [row for row in unseen.ab() if row["metric"] == "alpha-nDCG@10"]
    recommendation = {r["treatment"]: r for r in unseen.experiments()}
    assert recommendation["b-better"]["recommendation"] == "keep running"
    assert recommendation["b-better"]["unproven"] == ["alpha-nDCG@10"]


def test_the_table_view_shows_each_treatment_its_lift_guardrails_and_recommendation(tmp_path: Path) -> None:
    """The terminal's table (replay's default there) had no treatment in its GSB rows (two rows alike), and none of
    lift, guardrail status or recommendation: a terminal user never saw ``ship`` or ``rollback``."""
    from stream_eval.export.report import to_table

    log = _log(tmp_path, ARMS, "three.jsonl")
    report = replay([str(log)], _config('[experiments.exp1]\nguardrails = {"GAUC" = -0.01}\n')).report()
    lines = to_table(report).splitlines()
    gsb = [line.split() for line in lines[lines.index("GSB (treatment vs control; always-valid sign test)") + 3:]]
    assert [row[1] for row in gsb[:2]] == ["b-better", "c-worse"]
    rows = {(row["treatment"], row["metric"]): row for row in report["ab"]}
    for (treatment, metric), row in rows.items():
        line = next(line for line in lines if f"{treatment} - a-control" in line and f" {metric} " in line)
        assert f"{100 * row['lift']:+.2f}%" in line
        assert ("breached -0.0100" in line) == (treatment == "c-worse" and metric == "GAUC")
        assert ("within -0.0100" in line) == (treatment == "b-better" and metric == "GAUC")
    recommended = lines[lines.index("Recommendation per treatment") + 3:]
    assert recommended[0].split()[:5] == ["exp1", "b-better", "-", "a-control", "ship"]
    assert recommended[1].split()[:5] == ["exp1", "c-worse", "-", "a-control", "rollback"]


def test_only_the_named_primary_metrics_can_ship_a_treatment(tmp_path: Path) -> None:
    """With ``primary`` named, the other metrics are exploratory: b-better is decided better on MRR and nDCG@10
    but not on P@10, so with P@10 alone primary it keeps running, and with nDCG@10 primary it ships on nDCG@10
    only."""
    log = _log(tmp_path, ARMS, "three.jsonl")
    plain = {(r["treatment"], r["metric"]): r["decision"] for r in replay([str(log)], _config("")).ab()}
    assert plain["b-better", "P@10"] == "inconclusive" and plain["b-better", "MRR"] == "better"

    def recommended(primary: str) -> dict[str, Any]:
        engine = replay([str(log)], _config(f'[experiments.exp1]\nprimary = ["{primary}"]\n'))
        return {r["treatment"]: r for r in engine.experiments()}["b-better"]

    assert recommended("P@10")["recommendation"] == "keep running" and recommended("P@10")["better"] == []
    assert recommended("nDCG@10")["recommendation"] == "ship" and recommended("nDCG@10")["better"] == ["nDCG@10"]


def test_a_sample_ratio_mismatch_holds_back_ship_but_not_rollback(tmp_path: Path) -> None:
    """A split the traffic does not follow (units come equally, the split says 1:1:8) makes the comparison
    untrustworthy: b-better, which ships under the split it follows, keeps running, flagged ``srm_mismatch``;
    c-worse, whose GAUC guardrail is breached, is still rolled back (stopping exposure is the safe side)."""
    log = _log(tmp_path, ARMS, "three.jsonl")
    guardrail = 'guardrails = {"GAUC" = -0.01}\n'
    fair = replay([str(log)], _config(f'[experiments.exp1]\n{guardrail}'))
    assert {r["treatment"]: (r["recommendation"], r["srm_mismatch"]) for r in fair.experiments()} == {
        "b-better": ("ship", False), "c-worse": ("rollback", False)}
    skewed = replay([str(log)], _config(
        f'[experiments.exp1]\n{guardrail}split = {{a-control = 1, b-better = 1, c-worse = 8}}\n'))
    (srm,) = skewed.srm()
    assert srm["mismatch"] is True
    recommendation = {r["treatment"]: r for r in skewed.experiments()}
    assert recommendation["b-better"]["recommendation"] == "keep running"
    assert recommendation["b-better"]["srm_mismatch"] is True and "MRR" in recommendation["b-better"]["better"]
    assert recommendation["c-worse"]["recommendation"] == "rollback"


def test_an_arm_outside_the_split_is_no_arm_of_the_experiment_and_a_sample_ratio_mismatch(tmp_path: Path) -> None:
    """The split names the arms: without ``control`` the first of its arms is the control, not an arm seen outside
    it (a-control sorts first); traffic to that arm is impossible under the split, so the SRM row shows it with an
    expected share of 0 and a mismatch (p-value 0); its units are compared with nothing."""
    log = _log(tmp_path, ARMS, "three.jsonl")
    engine = replay([str(log)], _config('[experiments.exp1]\nsplit = {b-better = 1, c-worse = 1}\n'))
    assert {(row["control"], row["treatment"]) for row in engine.ab()} == {("b-better", "c-worse")}
    assert {r["treatment"] for r in engine.experiments()} == {"c-worse"}
    (srm,) = engine.srm()
    assert srm["expected"] == {"b-better": 0.5, "c-worse": 0.5, "a-control": 0.0}
    assert srm["units"]["a-control"] > 0 and srm["mismatch"] is True
    assert srm["p_value"] == 0.0 and srm["sequential_p_value"] == 0.0
    within = replay([str(log)], _config('[experiments.exp1]\nsplit = {a-control = 1, b-better = 1, c-worse = 1}\n'))
    (fair,) = within.srm()
    assert fair["mismatch"] is False and set(fair["units"]) == set(fair["expected"]) == {a for a, _ in ARMS}


def test_arms_folded_beyond_max_label_values_are_no_treatment_and_an_srm_mismatch(tmp_path: Path) -> None:
    """Beyond ``max_label_values`` arms the rest are ``__other__``: a mix of arms, compared with nothing, whose units
    the SRM test flags (the experiment's arms can no longer be told apart)."""
    engine = replay([str(_log(tmp_path, ARMS, "three.jsonl"))], _config("max_label_values = 2\n"))
    assert {(row["control"], row["treatment"]) for row in engine.ab()} == {("a-control", "b-better")}
    assert [row["treatment"] for row in engine.gsb_rows()] == ["b-better"]
    (srm,) = engine.srm()
    assert srm["expected"] == {"a-control": 0.5, "b-better": 0.5, "__other__": 0.0} and srm["mismatch"] is True


def test_a_split_whose_treatments_have_no_traffic_is_a_sample_ratio_mismatch(tmp_path: Path) -> None:
    """Treatment logging broken: only the control's requests arrive. With a split configured, the SRM test still
    runs over its arms (the treatment with 0 units) and flags it, where it used to vanish with the treatment."""
    log = tmp_path / "control-only.jsonl"
    log.write_bytes(b"".join(simulate_lines(SimulationConfig(requests=300, seed=5, arms=(("ctl", 0.6),)))))
    engine = replay([str(log)], _config('[experiments.exp1]\nsplit = {ctl = 0.5, treat = 0.5}\n'))
    (srm,) = engine.srm()
    assert srm["units"] == {"ctl": srm["units"]["ctl"], "treat": 0} and srm["units"]["ctl"] > 0
    assert srm["mismatch"] is True


def test_a_configured_control_not_seen_yet_is_a_sample_ratio_mismatch_not_a_crash(tmp_path: Path) -> None:
    """The control named in the config has no units yet (a worker's first look may see treatment traffic only):
    the SRM test counts it with 0 units (a mismatch), where it raised "need units and expected shares for the
    same >= 2 arms" in the look and stopped the engine."""
    log = tmp_path / "treatment-only.jsonl"
    log.write_bytes(b"".join(simulate_lines(SimulationConfig(requests=300, seed=5, arms=(("treat", 0.6),)))))
    report = orjson.loads(orjson.dumps(replay([str(log)], _config('[experiments.exp1]\ncontrol = "ctl"\n')).report()))
    (srm,) = report["srm"]
    assert srm["units"] == {"ctl": 0, "treat": srm["units"]["treat"]} and srm["units"]["treat"] > 0
    assert srm["mismatch"] is True
    assert {row["treatment"] for row in report["ab"]} == {"treat"}


def test_gsb_verdicts_all_the_same_decide_by_the_sign_test(tmp_path: Path) -> None:
    """Every judgment bad: the score's sequence is undefined (no variance), the always-valid sign test is not; the
    row decides "worse" once its p-value is below 1 - confidence, and not with too few verdicts."""
    def judged(n: int) -> Any:
        log = tmp_path / f"judged-{n}.jsonl"
        log.write_bytes(b"".join(orjson.dumps({"type": "judgment", "experiment": "e", "query_id": f"q{k}",
                                               "verdict": "bad", "ts": 1_767_225_600.0 + k}) + b"\n"
                                 for k in range(n)))
        [row] = replay([str(log)], Config()).gsb_rows()
        return row

    many, few = judged(300), judged(3)
    assert many["cs_lower"] is None and many["p_value"] < 0.05 and many["decision"] == "worse"
    assert few["p_value"] > 0.05 and few["decision"] == "inconclusive"


def test_a_configured_arm_no_unit_came_to_is_warned_of(tmp_path: Path) -> None:
    """``control = "a-contrl"`` (a typo) was taken silently: every treatment compared with an empty control.
    ``replay`` now says which configured arm got no unit, next to the arms that did; and which configured
    experiment no request named (``exp_1`` for ``exp1``: its control and guardrails were silently not used)."""
    import subprocess
    import sys

    log = _log(tmp_path, ARMS, "three.jsonl")
    config = tmp_path / "typo.toml"

    def stderr(table: str | None) -> str:
        if table is not None:
            config.write_text(table)
        done = subprocess.run([sys.executable, "-m", "stream_eval.cli", "replay", str(log), "-o", str(tmp_path / "r"),
                               *(["--config", str(config)] if table is not None else [])],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stderr

    assert ("warning: experiment exp1: no unit came to 'a-contrl' (arms with units: a-control, b-better, c-worse)"
            in stderr('[experiments.exp1]\ncontrol = "a-contrl"\n'))
    assert "warning" not in stderr(None)
    # an arm of the split misspelt (it had no warning: only control and treatment were checked)
    assert ("warning: experiment exp1: no unit came to 'c-wrose' (arms with units: a-control, b-better, c-worse)"
            in stderr('[experiments.exp1]\nsplit = {a-control = 1, b-better = 1, c-wrose = 1}\n'))
    assert ("warning: no request of experiment 'exp_1', which --config sets (experiments seen: exp1)"
            in stderr('[experiments.exp_1]\ncontrol = "b-better"\n'))
