"""CUPED in the engine (engine/ab.py): what a unit's pre-period is on a stream, the warehouse table, the rows,
the report and /metrics. The estimator's oracles (gbstats, GrowthBook's derivation) are in test_stats.py; replay
against several stage partitions, bit for bit, in test_partitions.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry

from stream_eval.config import Config, ConfigError, ExperimentSettings, load_config
from stream_eval.engine.ab import CovariateTable, shard_of, unit_hashes
from stream_eval.engine.engine import Engine
from stream_eval.engine.replay import replay
from stream_eval.export.prometheus import EngineCollector
from stream_eval.simulate import SimulationConfig, simulate_lines

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a day boundary
DAY = 86400.0


def _request(rid: str, ts: float, unit: str, clicked: bool, experiment: str | None = None,
             arm: str | None = None) -> list[dict[str, Any]]:
    """A ranking of two items; a click on the first (RR 1) or none (RR 0)."""
    ranking: dict[str, Any] = {"type": "ranking", "request_id": rid, "ts": ts, "items": ["a", "b"],
                               "unit_id": unit}
    if experiment is not None:
        ranking |= {"experiment": experiment, "arm": arm}
    click = [{"type": "feedback", "request_id": rid, "item": "a", "ts": ts + 1.0}] if clicked else []
    return [ranking, *click]


def _replay(tmp_path: Path, events: list[dict[str, Any]], config: Config) -> Engine:
    path = tmp_path / "log.jsonl"
    events = sorted(events, key=lambda e: e["ts"])
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    return replay([str(path)], config)


def _covariate(engine: Engine, experiment: str, unit: str, metric: str) -> tuple[float, float]:
    """The pre-period sum and count of ``metric`` kept for ``unit``'s row in ``experiment``."""
    table = engine.ledger.experiments[experiment][shard_of(unit)]
    row = int(np.flatnonzero(table.unit_key[: table.size] == unit_hashes([unit])[0])[0])
    column = engine.ledger.names.index(metric)
    return float(table.x[row, column]), float(table.q[row, column])


def _cuped(**settings: Any) -> Config:
    return Config(experiments=(("exp", ExperimentSettings(control="a", cuped=True, **settings)),))


def test_the_pre_period_is_the_units_contributions_in_the_lookback_days_before_its_entry(tmp_path: Path) -> None:
    """A unit's covariate: its requests (in any other experiment) finalised from the start of the UTC day
    ``cuped_lookback`` days before the day it entered up to its entry; not older ones, not later ones, and not
    another unit's."""
    events = [
        *_request("old", T0, "u1", True),  # day 0: before the 1-day lookback
        *_request("in1", T0 + 2 * DAY + 600, "u1", False),  # day 2: in it
        *_request("in2", T0 + 3 * DAY + 600, "u1", True, "other", "x"),  # day 3, another experiment, before entry
        *_request("e1", T0 + 3 * DAY + 7200, "u1", True, "exp", "a"),  # the entry
        *_request("after", T0 + 3 * DAY + 9000, "u1", True),  # after it: not pre-period
        *_request("e2", T0 + 3 * DAY + 9600, "u1", False, "exp", "a"),
        *_request("v", T0 + 3 * DAY + 600, "u2", True),  # another unit's pre-period
        *_request("e3", T0 + 3 * DAY + 7300, "u2", False, "exp", "b"),
        *_request("e4", T0 + 3 * DAY + 7400, "u3", True, "exp", "b"),  # no pre-period at all
    ]
    engine = _replay(tmp_path, events, _cuped(cuped_lookback=DAY))
    assert _covariate(engine, "exp", "u1", "MRR") == (1.0, 2.0)  # in1 (RR 0) + in2 (RR 1)
    assert _covariate(engine, "exp", "u2", "MRR") == (1.0, 1.0)
    assert _covariate(engine, "exp", "u3", "MRR") == (0.0, 0.0)
    longer = _replay(tmp_path, events, _cuped(cuped_lookback=3 * DAY))
    assert _covariate(longer, "exp", "u1", "MRR") == (2.0, 3.0)  # "old" too
    rows = [row for row in engine.ab() if row["metric"] == "MRR"]
    assert rows and all(row["cuped"] and "variance_reduction" in row and "pre_p_value" in row for row in rows)
    assert engine.srm()[0]["pre_imbalance"] == []
    plain = _replay(tmp_path, events, Config(experiments=(("exp", ExperimentSettings(control="a")),)))
    assert not any(row["cuped"] or "variance_reduction" in row for row in plain.ab())
    assert "pre_imbalance" not in plain.srm()[0] and not plain.ledger.history


def test_arms_that_differed_before_the_experiment_are_flagged_beside_srm(tmp_path: Path) -> None:
    """The pre-period check: when the units of one arm clicked before they entered and the other's did not, the
    rows' ``pre_p_value`` falls below ``srm_alpha`` and the SRM row and ``stream_eval_pre_imbalance`` say so."""
    events = []
    for k in range(200):
        arm = "a" if k % 2 else "b"
        events += _request(f"p{k}", T0 + k, f"u{k}", (arm == "a") != (k % 10 == 1))  # arm a's units mostly clicked
        events += _request(f"e{k}", T0 + 3600 + k, f"u{k}", k % 3 == 0, "exp", arm)
    engine = _replay(tmp_path, events, _cuped())
    [srm] = engine.srm()
    rows = {row["metric"]: row for row in engine.ab()}
    assert rows["MRR"]["pre_p_value"] < engine.config.srm_alpha
    assert "MRR" in srm["pre_imbalance"] and srm["pre_imbalance"] == sorted(srm["pre_imbalance"])
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    assert registry.get_sample_value("stream_eval_pre_imbalance", {"experiment": "exp"}) == 1.0
    # the terminal's table shows it beside the sample ratio (it showed CUPED nowhere)
    from stream_eval.export.report import to_table

    lines = to_table(engine.report()).splitlines()
    header = lines[lines.index("Sample ratio (units per arm)") + 1]
    assert header.split()[-1] == "pre-period"
    assert "IMBALANCE" in lines[lines.index("Sample ratio (units per arm)") + 3] and "MRR" in lines[-1]


def test_the_pre_period_check_says_when_no_unit_had_pre_period_data(tmp_path: Path) -> None:
    """CUPED on a log without a pre-period: the rows are the unadjusted ones, and the check beside the sample
    ratio says ``no pre-period data`` (it said ``ok``, which read as a check passed); with pre-period data, ``ok``."""
    from stream_eval.export.report import to_table

    def check(pre_period: bool) -> str:
        events = []
        for k in range(40):
            if pre_period:
                events += _request(f"p{k}", T0 + k, f"u{k}", k % 2 == 0)
            events += _request(f"e{k}", T0 + 3600 + k, f"u{k}", k % 3 == 0, "exp", "a" if k % 2 else "b")
        lines = to_table(_replay(tmp_path, events, _cuped()).report()).splitlines()
        return lines[lines.index("Sample ratio (units per arm)") + 3]

    assert check(False).endswith("no pre-period data")
    assert check(True).endswith(" ok") and "no pre-period data" not in check(True)


def test_units_entering_one_shard_together_each_get_their_own_covariate(tmp_path: Path) -> None:
    """Several units of one shard entering in the same release (rows set together, by entry): each unit's
    covariate is its own, from the stream's pre-period and from a warehouse table alike."""
    shard = shard_of("u1")
    units = [u for u in (f"u{k}" for k in range(1, 2000)) if shard_of(u) == shard][:5]
    assert len(units) == 5
    events = []
    for k, unit in enumerate(units):  # unit k: k + 1 pre-period requests, the first k of them clicked
        events += [e for j in range(k + 1) for e in _request(f"p{k}-{j}", T0 + 600 + 10 * k + j, unit, j < k)]
        events += _request(f"e{k}", T0 + 3600 + k, unit, True, "exp", "ab"[k % 2])
    engine = _replay(tmp_path, events, _cuped())
    assert [_covariate(engine, "exp", unit, "MRR") for unit in units] == [(float(k), k + 1.0) for k in range(5)]
    table = tmp_path / "pre.parquet"
    pq.write_table(pa.table({"unit": units, "metric": ["MRR"] * 5, "value": [0.1, 0.2, 0.3, 0.4, 0.5]}), table)
    engine = _replay(tmp_path, events, _cuped(cuped_table=str(table)))
    assert [_covariate(engine, "exp", unit, "MRR") for unit in units] == [(0.1, 1.0), (0.2, 1.0), (0.3, 1.0),
                                                                          (0.4, 1.0), (0.5, 1.0)]


def test_the_covariate_comes_from_a_warehouse_table_when_one_is_named(tmp_path: Path) -> None:
    """``cuped_table``: a Parquet file of (unit, metric, value); a listed value is one pre-period observation, a
    unit or metric not listed has none; the stream's pre-period is not used then."""
    table = tmp_path / "pre.parquet"
    pq.write_table(pa.table({"unit": ["u1", "u1", "u2"], "metric": ["MRR", "nDCG@10", "MRR"],
                             "value": [0.25, 0.5, 0.75]}), table)
    events = [*_request("p", T0 + 10, "u1", True), *_request("e1", T0 + 100, "u1", True, "exp", "a"),
              *_request("e2", T0 + 200, "u2", True, "exp", "b"), *_request("e3", T0 + 300, "u3", True, "exp", "b")]
    engine = _replay(tmp_path, events, _cuped(cuped_table=str(table)))
    assert _covariate(engine, "exp", "u1", "MRR") == (0.25, 1.0)
    assert _covariate(engine, "exp", "u1", "nDCG@10") == (0.5, 1.0)
    assert _covariate(engine, "exp", "u2", "nDCG@10") == (0.0, 0.0)
    assert _covariate(engine, "exp", "u3", "MRR") == (0.0, 0.0)
    assert not engine.ledger.history  # (no stream pre-period kept for a table)
    pq.write_table(pa.table({"unit": ["u1"], "metric": ["nDCG@5"], "value": [0.5]}), tmp_path / "bad.parquet")
    with pytest.raises(ConfigError, match="nDCG@5"):
        CovariateTable(str(tmp_path / "bad.parquet"), ["MRR", "nDCG@10", "GAUC"])


def test_a_warehouse_table_that_cannot_be_used_is_a_clear_error_and_an_empty_one_none(tmp_path: Path) -> None:
    """A missing file, missing columns, text values: a ConfigError that says which (at start, not at the first
    unit); an empty table is valid, every unit without pre-period data."""
    names = ["MRR", "nDCG@10", "GAUC"]
    with pytest.raises(ConfigError, match="no such file"):
        CovariateTable(str(tmp_path / "absent.parquet"), names)
    (tmp_path / "text.parquet").write_text("unit,metric,value\n")
    with pytest.raises(ConfigError, match="not a Parquet file"):
        CovariateTable(str(tmp_path / "text.parquet"), names)
    pq.write_table(pa.table({"user": ["u1"], "metric": ["MRR"], "val": [0.5]}), tmp_path / "cols.parquet")
    with pytest.raises(ConfigError, match="needs the columns unit, metric and value; unit, value missing"):
        CovariateTable(str(tmp_path / "cols.parquet"), names)
    pq.write_table(pa.table({"unit": ["u1"], "metric": ["MRR"], "value": ["high"]}), tmp_path / "str.parquet")
    with pytest.raises(ConfigError, match="must hold numbers, it holds string"):
        CovariateTable(str(tmp_path / "str.parquet"), names)
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"unit": pa.array([], pa.string()), "metric": pa.array([], pa.string()),
                             "value": pa.array([], pa.float64())}), empty)
    x, q = CovariateTable(str(empty), names).lookup(["u1", "u2"])
    assert x.shape == q.shape == (2, 3) and not x.any() and not q.any()
    events = [*_request("e1", T0 + 100, "u1", True, "exp", "a"), *_request("e2", T0 + 200, "u2", False, "exp", "b")]
    engine = _replay(tmp_path, events, _cuped(cuped_table=str(empty)))
    assert _covariate(engine, "exp", "u1", "MRR") == (0.0, 0.0) and engine.ab()


def test_cuped_settings_are_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[experiments.exp]\ncontrol = "a"\ncuped = true\ncuped_lookback = "28d"\n')
    config = load_config(str(path), environ={})
    settings = config.settings_of("exp")
    assert settings.cuped and settings.cuped_lookback == 28 * DAY
    assert config.to_json()["experiments"]["exp"] == {"control": "a", "cuped": True, "cuped_lookback": 28 * DAY}
    assert not load_config(None, environ={}).settings_of("exp").cuped  # off by default
    path.write_text('[experiments.exp]\ncuped_table = "pre.parquet"\n')
    with pytest.raises(ConfigError, match="cuped_table needs cuped"):
        load_config(str(path), environ={})
    path.write_text('[experiments.exp]\ncuped = true\ncuped_lookback = "0s"\n')
    with pytest.raises(ConfigError, match="cuped_lookback"):
        load_config(str(path), environ={})


def test_simulated_users_with_a_pre_period_give_a_variance_reduction_on_metrics(tmp_path: Path) -> None:
    """``simulate --unit user --pre-period --preference``: pre-period requests carry no experiment; users' persistent
    preferences make their pre-period predict, so CUPED narrows the rows; /metrics shows it."""
    sim = SimulationConfig(requests=12_000, seed=5, unit="user", pre_period=80.0, preference=1.0, sessions_per_user=8.0)
    lines = list(simulate_lines(sim))
    rankings = [orjson.loads(line) for line in lines if b'"ranking"' in line]
    pre = [r for r in rankings if r["ts"] < sim.start_ts + 80.0]
    assert pre and all("experiment" not in r and "arm" not in r for r in pre)
    assert all(r["experiment"] == "exp1" for r in rankings if r["ts"] >= sim.start_ts + 80.0)
    path = tmp_path / "sim.jsonl"
    path.write_bytes(b"".join(lines))
    config = Config(experiments=(("exp1", ExperimentSettings(control="control", cuped=True)),))
    engine = replay([str(path)], config)
    rows = {row["metric"]: row for row in engine.ab()}
    assert rows["MRR"]["variance_reduction"] > 0.1 and rows["nDCG@10"]["variance_reduction"] > 0.1
    plain = replay([str(path)], Config(experiments=(("exp1", ExperimentSettings(control="control")),)))
    before = {row["metric"]: row for row in plain.ab()}
    assert rows["MRR"]["cs_upper"] - rows["MRR"]["cs_lower"] < before["MRR"]["cs_upper"] - before["MRR"]["cs_lower"]
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    labels = {"experiment": "exp1", "metric": "MRR", "arm": "treatment"}
    assert registry.get_sample_value("stream_eval_ab_variance_reduction", labels) == rows["MRR"]["variance_reduction"]
    assert registry.get_sample_value("stream_eval_ab_pre_p_value", labels) == rows["MRR"]["pre_p_value"]
    assert registry.get_sample_value("stream_eval_pre_imbalance", {"experiment": "exp1"}) == 0.0
    # the terminal's table and the HTML page show each row's variance reduction and the pre-period check
    from stream_eval.export.html import _decisions
    from stream_eval.export.report import to_table

    report = engine.report()
    lines = to_table(report).splitlines()
    header = next(line for line in lines if line.startswith("experiment") and "fixed interval" in line)
    assert header.split()[-2:] == ["var.", "red."]
    mrr = next(line for line in lines if "treatment - control" in line and " MRR " in line)
    assert mrr.split()[-1] == f"{100 * rows['MRR']['variance_reduction']:.1f}%"
    assert plain.report()["ab"] and "var. red." not in to_table(plain.report())
    page = _decisions(report)  # (the page's Decisions section)
    assert "CUPED variance reduction" in page and f"{100 * rows['MRR']['variance_reduction']:.1f}%" in page
    assert "pre-period check (the arms before the experiment) exp1: ok" in page
    from stream_eval.export.html import _srm_table

    srm = _srm_table(report)  # (and the page's sample-ratio table, as the terminal's)
    assert "<th>pre-period</th>" in srm.replace(' class="text"', "") and srm.count(">ok<") == 2
    assert "pre-period" not in _srm_table(plain.report())


def test_traffic_outside_any_experiment_is_not_compared_once_experiments_are_configured(tmp_path: Path) -> None:
    """Requests that name no experiment (``default``: a pre-period, or traffic outside every experiment, here with
    two arm labels) give no A/B rows, SRM row or units on /metrics once the config names experiments, yet still feed
    CUPED's pre-period; without an ``[experiments]`` table, or with ``[experiments.default]``, they are compared."""
    events: list[dict[str, Any]] = []
    for i in range(60):
        outside = _request(f"p{i}", T0 + 10 * i, f"u{i}", i % 3 == 0)
        outside[0]["arm"] = ("legacy", "canary")[i % 2]  # an arm, but no experiment
        events += [*outside, *_request(f"e{i}", T0 + 3600 + 10 * i, f"u{i}", i % 2 == 0, "exp", "ab"[i % 2])]
    engine = _replay(tmp_path, events, _cuped())
    assert {row["experiment"] for row in engine.ab()} == {"exp"}
    assert [row["experiment"] for row in engine.srm()] == ["exp"]
    assert _covariate(engine, "exp", "u3", "MRR") == (1.0, 1.0)  # its request outside any experiment
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    assert registry.get_sample_value("stream_eval_ab_units", {"experiment": "exp", "arm": "a"}) == 30.0
    assert registry.get_sample_value("stream_eval_ab_units", {"experiment": "default", "arm": "legacy"}) is None
    assert registry.get_sample_value("stream_eval_srm_p_value", {"experiment": "default"}) is None
    for compared in (Config(), Config(experiments=(("exp", ExperimentSettings(control="a")),
                                                   ("default", ExperimentSettings(control="legacy"))))):
        engine = _replay(tmp_path, events, compared)
        assert {row["experiment"] for row in engine.ab()} == {"default", "exp"}
        assert [row["experiment"] for row in engine.srm()] == ["default", "exp"]
