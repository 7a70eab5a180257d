"""A/B inference over randomisation units through the engine: unit_id, conflicts, looks and the trace.

The oracle for the ``ab`` rows is a direct computation from the per-request records: group them by unit, sum,
and feed ``stream_eval.stats.compare`` (which is itself checked against GrowthBook's gbstats in test_stats.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_eval.config import Config, load_config
from stream_eval.engine.ab import UnitLedger, key_id_order, shard_of, shards_of, unit_keys
from stream_eval.engine.compiled import add_rows, arm_sums
from stream_eval.engine.engine import FinalisedBatch
from stream_eval.engine.replay import replay
from stream_eval.simulate import SimulationConfig, simulate_lines
from stream_eval.stats import ArmSums, compare
from stream_eval.stats.ratio import unit_terms

T0 = 1_767_225_600.0


def _write(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    return path


def _replay(path: Path, config: Config, trace: list[dict[str, Any]] | None = None) -> tuple[Any, list[Any]]:
    records: list[dict[str, Any]] = []

    def keep(batch: FinalisedBatch) -> None:
        records.extend(batch.records())

    engine = replay([str(path)], config, keep, ab_trace=None if trace is None else trace.append)
    return engine, records


def _oracle(records: list[dict[str, Any]], units_of: dict[str, str], experiment: str, control: str,
            treatment: str, metric: str, config: Config) -> Any:
    """compare() on unit sums built straight from the per-request records (first arm of a unit kept)."""
    arm_of: dict[str, str] = {}
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in records:
        if r["experiment"] != experiment:
            continue
        unit = units_of[r["request_id"]]
        arm = arm_of.setdefault(unit, r["arm"])
        value = r["metrics"][metric]
        if arm != r["arm"] or value is None:
            continue
        sums[unit][0] += value
        sums[unit][1] += 1
    arms = {}
    for arm in (control, treatment):
        mine = [u for u in sums if arm_of[u] == arm]
        y = np.array([[sums[u][0]] for u in mine])
        n = np.array([[sums[u][1]] for u in mine])
        arms[arm] = ArmSums.of_units(y.reshape(-1, 1), n.reshape(-1, 1))
    return compare(arms[control], arms[treatment], confidence=config.confidence, sequential_n=config.sequential_n)


def test_units_group_requests_and_match_a_direct_computation(tmp_path: Path) -> None:
    """Requests of one unit_id (a user with several sessions) form one unit; the ab row equals compare() of the
    per-unit sums built from the per-request records; the fixed interval is the cluster-robust one."""
    rng = np.random.default_rng(5)
    events: list[dict[str, Any]] = []
    units_of: dict[str, str] = {}
    for k in range(600):
        user = f"u{rng.integers(120)}"
        arm = "A" if int(user[1:]) % 2 else "B"
        rid = f"r{k}"
        units_of[rid] = user
        ts = T0 + k
        events.append({"type": "ranking", "request_id": rid, "ts": ts, "items": ["a", "b", "c", "d"],
                       "session_id": f"{user}-s{k // 50}", "unit_id": user, "experiment": "e", "arm": arm})
        for item in ("a", "b", "c", "d"):
            if rng.random() < (0.25 if arm == "A" else 0.35):
                events.append({"type": "feedback", "request_id": rid, "item": item, "ts": ts + 5})
    config = Config()
    engine, records = _replay(_write(tmp_path / "log.jsonl", events), config)
    rows = {r["metric"]: r for r in engine.ab()}
    assert rows["MRR"]["units_control"] + rows["MRR"]["units_treatment"] == len(set(units_of.values()))
    assert rows["MRR"]["n_control"] + rows["MRR"]["n_treatment"] == 600
    for metric, name in (("MRR", "RR"), ("nDCG@10", "nDCG@10"), ("P@10", "P@10")):
        expected = _oracle(records, units_of, "e", "A", "B", name, config)
        row = rows[metric]
        for field in ("delta", "ci_lower", "ci_upper", "cs_lower", "cs_upper"):
            assert row[field] == pytest.approx(float(getattr(expected, field)[0]), rel=1e-9, abs=1e-12), field
        assert row["p_value"] <= float(expected.p_value[0]) + 1e-12  # a running minimum over looks
    # treating requests as independent would give a narrower interval: the units' correlation is accounted for
    naive = engine.groups
    assert all(row["cs_lower"] < row["ci_lower"] <= row["delta"] <= row["ci_upper"] < row["cs_upper"]
               for row in rows.values() if row["cs_lower"] is not None)
    assert naive  # (groups exist)


def test_unit_id_is_read_by_the_line_reader_and_by_msgspec_alike(tmp_path: Path) -> None:
    """A plain ranking (compiled reader) and one with teams-free but non-ASCII data (msgspec) both carry unit_id."""
    events = []
    for k in range(40):
        # every other line has a non-ASCII item: that one goes through msgspec
        item = "é" if k % 2 else "x"
        events.append({"type": "ranking", "request_id": f"r{k}", "ts": T0 + k, "items": [item, "y"],
                       "unit_id": f"u{k % 4}", "experiment": "e", "arm": "A" if k % 4 < 2 else "B"})
        events.append({"type": "feedback", "request_id": f"r{k}", "item": "y", "ts": T0 + k + 1})
    engine, _ = _replay(_write(tmp_path / "log.jsonl", events), Config())
    [srm] = engine.srm()
    assert srm["units"] == {"A": 2, "B": 2}


def test_a_unit_in_two_arms_is_a_conflict_kept_in_its_first_arm(tmp_path: Path) -> None:
    events = []
    for k, (unit, arm) in enumerate([("u1", "A"), ("u2", "B"), ("u1", "B"), ("u3", "A"), ("u1", "B"), ("u4", "B")]):
        events.append({"type": "ranking", "request_id": f"r{k}", "ts": T0 + k, "items": ["x", "y"],
                       "unit_id": unit, "experiment": "e", "arm": arm})
        events.append({"type": "feedback", "request_id": f"r{k}", "item": "x" if arm == "A" else "y",
                       "ts": T0 + k + 1})
    engine, _ = _replay(_write(tmp_path / "log.jsonl", events), Config())
    assert engine.ledger.conflicts() == {"e": 1}  # u1, once, though it came twice in B
    [srm] = engine.srm()
    assert srm["units"] == {"A": 2, "B": 2}  # u1 stays in A
    assert srm["unit_conflicts"] == 1  # the report says so too (it was on /metrics only)
    mrr = next(r for r in engine.ab() if r["metric"] == "MRR")
    assert (mrr["units_control"], mrr["units_treatment"]) == (2, 2)
    # u1's B requests (RR 0.5) are left out of the A/B statistics: A's units have RR 1, B's 0.5
    assert mrr["delta"] == pytest.approx(-0.5)


def test_the_requests_of_a_trace_line_are_those_of_its_look(tmp_path: Path) -> None:
    """An ``ab`` row's ``n_control``/``n_treatment`` in a trace line count the requests with a value that its look
    holds (finalised by its time: served + the horizon at or before it), conflicts' requests included as the
    ``groups`` count them; they were the requests counted when the line was written (the whole log for looks
    taken at its end)."""
    rng = np.random.default_rng(11)
    config = Config(look_every=60.0, attribution_window=30.0, allowed_lateness=10.0)
    horizon = config.attribution_window + config.allowed_lateness
    events: list[dict[str, Any]] = []
    served: dict[str, tuple[str, float]] = {}  # request -> its arm and serve time (RR has a value for each)
    for k in range(400):
        user = f"u{rng.integers(60)}"
        arm = "A" if int(user[1:]) % 2 else "B"
        if k % 97 == 5:  # now and then a unit's request in the other arm: a conflict
            arm = "B" if arm == "A" else "A"
        ts = T0 + 3.0 * k
        served[f"r{k}"] = (arm, ts)
        events.append({"type": "ranking", "request_id": f"r{k}", "ts": ts, "items": ["a", "b", "c"],
                       "unit_id": user, "experiment": "e", "arm": arm})
        if rng.random() < 0.7:
            events.append({"type": "feedback", "request_id": f"r{k}", "item": "b", "ts": ts + 5})
    events.sort(key=lambda e: e["ts"])
    trace: list[dict[str, Any]] = []
    engine, _ = _replay(_write(tmp_path / "log.jsonl", events), config, trace)
    assert engine.ledger.conflicts()["e"] > 0
    assert len(trace) > 10
    for line in trace[:-1]:
        row = next(r for r in line["ab"] if r["metric"] == "MRR")
        expected = [sum(1 for a, ts in served.values() if a == arm and ts + horizon <= line["ts"])
                    for arm in ("A", "B")]
        assert [row["n_control"], row["n_treatment"]] == expected, line["ts"]
    assert 0 < trace[0]["ab"][0]["n_control"] < trace[-2]["ab"][0]["n_control"]
    final = next(r for r in engine.ab() if r["metric"] == "MRR")
    groups = {g["arm"]: g["requests"] for g in engine.report()["groups"]}
    assert (final["n_control"], final["n_treatment"]) == (groups["A"], groups["B"])
    assert final == next(r for r in trace[-1]["ab"] if r["metric"] == "MRR")


def test_trace_has_a_line_per_look_and_ends_with_the_report(tmp_path: Path) -> None:
    sim = SimulationConfig(requests=3000, seed=3, rate=1.0, judgments=True)  # 50 min of event time
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(simulate_lines(sim)))
    config = Config(look_every=600.0)
    trace: list[dict[str, Any]] = []
    engine, _ = _replay(path, config, trace)
    times = [line["ts"] for line in trace]
    assert len(trace) >= 5 and times == sorted(times)
    assert all(a != b for a, b in zip(trace, trace[1:], strict=False))  # the end does not repeat the last look
    assert all(t % 600 == 0 for t in times[:-1])  # on the boundaries of look_every
    last = json.loads(orjson.dumps(trace[-1]))
    report = json.loads(orjson.dumps(engine.report()))
    assert last["ab"] == report["ab"] and last["srm"] == report["srm"] and last["gsb"] == report["gsb"]
    # the always-valid p-value is a running minimum: it never rises from look to look
    for metric in ("MRR", "nDCG@10"):
        ps = [next(r["p_value"] for r in line["ab"] if r["metric"] == metric) for line in trace]
        ps = [p for p in ps if p is not None]
        assert ps and all(b <= a for a, b in zip(ps, ps[1:], strict=False))
    units = [sum(line["srm"][0]["units"].values()) for line in trace]
    assert units == sorted(units) and units[0] < units[-1]  # looks see the units keyed up to their time


def test_a_true_effect_is_decided_and_an_a_a_split_is_not(tmp_path: Path) -> None:
    """The simulator's better arm is found better on MRR and nDCG@10; two arms of equal quality stay undecided."""
    cases = [((("control", 0.3), ("treatment", 0.9)), "better"), ((("a", 0.6), ("b", 0.6)), "inconclusive")]
    for arms, expected in cases:
        sim = SimulationConfig(requests=6000, seed=11, arms=arms, rate=20.0)
        path = tmp_path / f"{expected}.jsonl"
        path.write_bytes(b"".join(simulate_lines(sim)))
        engine, _ = _replay(path, Config())
        decisions = {r["metric"]: r["decision"] for r in engine.ab()}
        assert decisions["MRR"] == expected and decisions["nDCG@10"] == expected, decisions
        [srm] = engine.srm()
        assert srm["mismatch"] is False


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 30), st.sampled_from("AB"), st.integers(0, 40), st.floats(0, 1)),
                min_size=1, max_size=60), st.integers(1, 5))
def test_release_order_does_not_depend_on_how_contributions_arrive(rows: list[tuple[int, str, int, float]],
                                                                   pieces: int) -> None:
    """The ledger applies contributions in (key, id) order: fed in any batches, in any order, and released
    whenever event time allows (never past the key of a contribution still to come, as the engine and the regroup
    stage guarantee), it ends with the same units and sums, bit for bit."""
    config = Config(look_every=10.0)
    ids = [f"r{k}" for k in range(len(rows))]

    def feed(order: list[int], cuts: int) -> UnitLedger:
        ledger = UnitLedger(config, ["M"])
        parts = [part.tolist() for part in np.array_split(np.array(order, dtype=np.int64), cuts)]
        for p, picked in enumerate(parts):
            if picked:
                ledger.add_requests(np.array([float(rows[k][2]) for k in picked]), [ids[k] for k in picked],
                                    ["e"] * len(picked), [rows[k][1] for k in picked],
                                    [f"u{rows[k][0]}" for k in picked], np.array([[rows[k][3]] for k in picked]))
            to_come = [rows[k][2] for later in parts[p + 1:] for k in later]
            ledger.release(min(to_come) - 0.5 if to_come else math.inf)
        ledger.release(math.inf)
        return ledger

    one = feed(list(range(len(rows))), 1)
    shuffled = sorted(range(len(rows)), key=lambda k: (rows[k][2] // 7, -k))  # roughly in time, ties reversed
    other = feed(shuffled, pieces)
    assert one.experiments["e"].keys() == other.experiments["e"].keys()
    for shard, a in one.experiments["e"].items():
        b = other.experiments["e"][shard]
        assert np.array_equal(a.unit_key[: a.size], b.unit_key[: b.size]) and a.conflicts == b.conflicts
        assert np.array_equal(a.y[: a.size], b.y[: b.size]) and np.array_equal(a.n[: a.size], b.n[: b.size])
    assert json.dumps(one.results(), default=str) == json.dumps(other.results(), default=str)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5).map(float), st.text("ab\x00\u00e9", max_size=3)), max_size=40))
def test_key_id_order_is_python_s_order_of_key_then_id(rows: list[tuple[float, str]]) -> None:
    """The ledger's release order is the (key, id) order of Python's tuples, trailing NULs and runs of ties
    included (numpy's str arrays, which it replaced, drop trailing NULs)."""
    keys = np.array([k for k, _ in rows], dtype=np.float64)
    ids = [i for _, i in rows]
    expected = sorted(range(len(rows)), key=lambda k: rows[k])
    got = key_id_order(keys, ids).tolist()
    assert [rows[k] for k in got] == [rows[k] for k in expected]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=300), st.text("u-01\x00", max_size=12),
                          st.text(st.characters(codec="utf-8"), max_size=20),
                          st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3)), max_size=30))
def test_compiled_unit_keys_are_zlib_s_crc_32_and_hashlib_s_blake2b(units: list[str]) -> None:
    # the compiled hashes stand for the ids in snapshots written before them: every byte string, any length (one,
    # several and exactly one 128-byte block), non-ASCII and lone surrogates, must hash as the library functions do
    encoded = [unit.encode("utf-8", "surrogatepass") for unit in units]
    shards, hashes = unit_keys(units)
    assert shards.tolist() == [shard_of(unit) for unit in units] == shards_of(units).tolist()
    assert shards.tolist() == [zlib.crc32(data) % 64 for data in encoded]
    assert hashes.tolist() == [int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
                               for data in encoded]


@pytest.mark.parametrize("size", [0, 1, 127, 128, 129, 255, 256, 257, 1000])
def test_compiled_unit_keys_of_every_block_length(size: int) -> None:
    unit = "".join(chr(32 + (i * 7) % 90) for i in range(size))
    _, hashes = unit_keys([unit, unit + "é"])
    for got, data in zip(hashes.tolist(), [unit.encode(), (unit + "é").encode()], strict=True):
        assert got == int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 4), st.floats(-1e6, 1e6), st.floats(-1e-3, 1e3)), max_size=50))
def test_add_rows_gives_the_floats_of_numpy_s_add_at(rows: list[tuple[int, float, float]]) -> None:
    """The units' sums are added row by row in order, as ``np.add.at`` adds them, bit for bit (the order of the
    additions is part of replay = stream)."""
    at = np.array([r for r, _, _ in rows], dtype=np.int64)
    values = np.array([[a, b] for _, a, b in rows], dtype=np.float64).reshape(len(rows), 2)
    picked = np.arange(len(rows), dtype=np.int64)[::-1].copy()  # (values read through an index)
    expected = np.full((5, 2), 0.1)
    keep = at >= 0
    np.add.at(expected, at[keep], values[picked][keep])
    got = np.full((5, 2), 0.1)
    add_rows(got, at, values, picked)
    assert got.tobytes() == expected.tobytes()


_MAGNITUDES = st.sampled_from([0.0, -0.0, 1.0, 3.0, 1e-12, 1e12, 0.1, -7.5, 2.0**60, math.nan])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.integers(1, 4), st.integers(1, 3), st.booleans(), st.randoms(use_true_random=False),
       st.lists(_MAGNITUDES, min_size=8, max_size=8))
def test_arm_sums_are_the_floats_of_numpy_s_sums_of_the_unit_terms(units: int, width: int, arms: int, pre: bool,
                                                                  random: Any, magnitudes: list[float]) -> None:
    """A look's sums per arm, summed as the terms are made (compiled), are bit for bit numpy's sums of
    ``unit_terms`` per arm in unit order: units without a value (``n`` 0, their ``y`` anything, NaN included),
    without pre-period data (``q`` 0), zeros of either sign, magnitudes far apart."""
    def column() -> np.ndarray:
        return np.array([[random.choice(magnitudes) * random.uniform(0.5, 2.0) for _ in range(width)]
                         for _ in range(units)], dtype=np.float64).reshape(units, width)

    y, x = column(), column()
    n = np.array([[random.choice([0.0, 0.0, 1.0, 2.0, 5.0]) for _ in range(width)] for _ in range(units)],
                 dtype=np.float64).reshape(units, width)
    q = np.array([[random.choice([0.0, 1.0, 3.0]) for _ in range(width)] for _ in range(units)],
                 dtype=np.float64).reshape(units, width)
    unit_arm = np.array([random.randrange(arms) for _ in range(units)], dtype=np.int16)
    terms = unit_terms(y, n, x, q) if pre else unit_terms(y, n)
    expected = np.stack([terms[unit_arm == a].sum(axis=0) for a in range(arms)])
    empty = np.zeros((0, width))
    got = arm_sums(y, n, x, q, unit_arm, arms, True) if pre else arm_sums(y, n, empty, empty, unit_arm, arms, False)
    assert got.shape == expected.shape and got.tobytes() == expected.tobytes()


def test_the_requests_counted_go_through_a_snapshot_and_one_without_them_is_read_as_unknown() -> None:
    """A stage partition's snapshot keeps each shard's requests per arm: restored, its looks count on exactly as the
    ledger that was not interrupted (arms met in another order after the restore included). A snapshot written before
    2026-12-04 has none: its shards' looks say so (None), and the rows' n_* then come from the groups, as before."""
    from stream_eval.engine import snapshot
    from stream_eval.engine.engine import Engine

    config = Config(look_every=10.0)
    values = np.random.default_rng(2).random((200, 1))
    values[::7] = np.nan  # (no value: not counted)

    def feed(engine: Engine, lo: int, hi: int, arms: tuple[str, ...]) -> None:
        picked = list(range(lo, hi))
        engine.ledger.add_requests(np.array([float(k) for k in picked]), [f"r{k}" for k in picked],
                                   ["e"] * len(picked), [arms[k % len(arms)] for k in picked],
                                   [f"u{k % 37}" for k in picked], values[picked])
        engine.ledger.release(float(hi))

    def looks(engine: Engine) -> dict[int, dict[str, list[float]] | None]:
        shards = engine.ledger.experiments["e"]
        return {shard: None if (look := shards[shard].look("e", shard)).requests is None else
                {arm: counted.tolist() for arm, counted in sorted(look.requests.items())} for shard in shards}

    engine = Engine(dataclasses.replace(config, metrics=("RR",), gsb_metric="RR"))
    feed(engine, 0, 100, ("A", "B"))
    data = snapshot.take(engine)
    state = snapshot.load(data)
    for shards in state["ledger"]["experiments"].values():
        for fields in shards.values():
            for name in ("requests", "request_arms", "counts_requests"):
                del fields[name]
    old = _json_snapshot(state)
    restored, from_old = Engine(engine.config), Engine(engine.config)
    snapshot.restore(restored, data)
    snapshot.restore(from_old, old)
    assert looks(restored) == looks(engine) and all(v is None for v in looks(from_old).values())
    for each in (engine, restored, from_old):
        feed(each, 100, 200, ("C", "B", "A"))
    assert looks(restored) == looks(engine)
    total = {arm: sum(v[arm][0] for v in looks(engine).values() if v and arm in v) for arm in "ABC"}
    assert total == {arm: float(sum(1 for k in range(200) if not np.isnan(values[k, 0]) and
                                    (("A", "B")[k % 2] if k < 100 else ("C", "B", "A")[k % 3]) == arm))
                     for arm in "ABC"}


def _json_snapshot(state: dict[str, Any]) -> bytes:
    """A snapshot of ``state`` (``snapshot.load``'s) as they were written before 2026-12-05: compressed JSON, each
    array's bytes in base64 within it."""
    import zlib

    from stream_eval.engine.times import array_to_json

    def as_json(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return array_to_json(value)
        if isinstance(value, dict):
            return {key: as_json(v) for key, v in value.items()}
        return [as_json(v) for v in value] if isinstance(value, list) else value

    return zlib.compress(orjson.dumps(as_json(state)), 1)


def test_a_snapshot_in_json_as_written_before_restores_the_same_state() -> None:
    """Snapshots are JSON and then their arrays' bytes, compressed; one written before 2026-12-05, all JSON (arrays
    in base64), restores the same units, sums, pending contributions, CUPED histories and segment codes: the two
    restored engines snapshot again to the bytes of the engine they came from."""
    from stream_eval.engine import snapshot
    from stream_eval.engine.engine import Engine
    from stream_eval.events.schema import decode_chunk_columns

    config = dataclasses.replace(load_config(str(Path(__file__).resolve().parents[1] / "bench" / "all-on.toml")),
                                 attribution_window=2.0, allowed_lateness=0.0, look_every=5.0)
    simulated = SimulationConfig(requests=1200, seed=3, arms=(("control", 0.5), ("better", 0.7)), unit="user",
                                 pre_period=8.0, preference=0.8, segments=(("platform", ("ios", "web")),))
    lines = list(simulate_lines(simulated))
    engine = Engine(config)
    engine.process(decode_chunk_columns(b"\n".join(lines[: len(lines) // 2]) + b"\n", config))
    ledger = engine.ledger
    assert "exp1" in ledger.experiments and ledger.cuped and ledger.segments is not None
    width = ledger.width - 1  # (contributions not released yet: GAUC's column is the ledger's own)
    ledger.add_requests(np.array([2e9, 2e9 + 1]), ["p1", "p2"], ["exp1"] * 2, ["control", "better"], ["u1", "u2"],
                        np.full((2, width), 0.25), [("ios",), ("web",)])
    data = snapshot.take(engine)
    assert data.startswith(snapshot.MAGIC)
    restored = [Engine(config), Engine(config)]
    snapshot.restore(restored[0], data)
    snapshot.restore(restored[1], _json_snapshot(snapshot.load(data)))
    assert [snapshot.take(each) for each in restored] == [data, data]


def test_a_snapshot_keeps_names_that_look_like_its_own_keys() -> None:
    """Arms and segment values are users' strings: an arm called "dtype" and segment values "at", "dtype" and "shape"
    (the keys an array's reference has in a snapshot) come back as names, in either format."""
    from stream_eval.engine import snapshot
    from stream_eval.engine.engine import Engine

    engine = Engine(Config(segments=("platform",)))
    ledger = engine.ledger
    names = ["at", "dtype", "shape"]
    ledger.add_requests(np.arange(6, dtype=np.float64), [f"r{k}" for k in range(6)], ["e"] * 6,
                        ["dtype", "shape"] * 3, [f"u{k}" for k in range(6)], np.full((6, ledger.width - 1), 0.5),
                        [(names[k % 3],) for k in range(6)])
    ledger.release(10.0)
    data = snapshot.take(engine)
    for form in (data, _json_snapshot(snapshot.load(data))):
        restored = Engine(engine.config)
        snapshot.restore(restored, form)
        assert snapshot.take(restored) == data
        shards = restored.ledger.experiments["e"].values()
        assert {arm for shard in shards for arm in shard.arm_code} == {"dtype", "shape"}
        assert {value for shard in shards for codes in shard.segment_codes for value in codes} == set(names)


def test_a_snapshot_keeps_arms_named_as_an_array_s_keys() -> None:
    """Arms called "at", "dtype" and "shape" (all the keys of an array's reference in a snapshot) come back as arms."""
    from stream_eval.engine import snapshot
    from stream_eval.engine.engine import Engine

    engine = Engine(Config())
    ledger = engine.ledger
    arms = ["at", "dtype", "shape"]
    units = [unit for unit in (f"u{k}" for k in range(1000)) if shard_of(unit) == shard_of("u0")][:3]  # (one shard)
    ledger.add_requests(np.arange(30, dtype=np.float64), [f"r{k}" for k in range(30)], ["e"] * 30,
                        [arms[k % 3] for k in range(30)], [units[k % 3] for k in range(30)],
                        np.full((30, ledger.width - 1), 0.5))
    ledger.release(40.0)
    restored = Engine(engine.config)
    snapshot.restore(restored, snapshot.take(engine))
    assert restored.ledger.units() == engine.ledger.units() == {"e": dict.fromkeys(arms, 1)}
