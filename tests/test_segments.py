"""Segments (config ``segments``): groups, series and rolling windows per value of a ranking's ``attributes`` field,
bounded to ``max_segment_values`` values plus ``__other__``; the same in replay and in the partitioned engine."""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import zlib
from collections import Counter, defaultdict
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from support import AbstractTimeConfig as Config
from support import approx, move_partition_halfway
from test_partitions import Collect, _short_horizons, run_partitioned, run_with_stages

from stream_eval.config import ConfigError, load_config
from stream_eval.engine import shares
from stream_eval.engine.ab import UnitLedger, shard_of
from stream_eval.engine.engine import Engine
from stream_eval.engine.labels import MISSING
from stream_eval.engine.partitions import PartitionedEngine
from stream_eval.engine.replay import replay
from stream_eval.engine.segment_ab import SegmentRule, ShardUnits, segment_looks
from stream_eval.engine.windows import RollingWindows
from stream_eval.events.messages import decode_messages
from stream_eval.events.schema import Feedback, Invalid, Ranking, decode_chunk
from stream_eval.simulate import SimulationConfig, simulate_lines
from stream_eval.stats import ArmSums, compare, difference
from stream_eval.stats.ratio import unit_terms

PLATFORMS = ("ios", "android", "web")
LOCALES = ("en-US", "de-DE", "fr-FR", "ja-JP", "pt-BR")
SEGMENTS = ("platform", "locale")
T0 = 1767225600.0


def _attributes(request_id: str) -> dict[str, str]:
    """A request's attributes, a fixed function of its id: every platform, five locales, some without a locale."""
    h = zlib.crc32(request_id.encode())
    out = {"platform": PLATFORMS[h % 3], "page": "search"}
    if h % 7:
        out["locale"] = LOCALES[(h // 7) % 5]
    return out


def _with_attributes(lines: list[bytes]) -> tuple[list[bytes], dict[str, dict[str, str]]]:
    """Simulated lines whose rankings carry ``attributes``; and the attributes of each request id."""
    out, attributes = [], {}
    for line in lines:
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            out.append(line)
            continue
        if isinstance(event, dict) and event.get("type") == "ranking" and isinstance(event.get("request_id"), str):
            event["attributes"] = attributes.setdefault(event["request_id"], _attributes(event["request_id"]))
            line = orjson.dumps(event) + b"\n"
        out.append(line)
    return out, attributes


def _lines(requests: int, seed: int) -> tuple[list[bytes], dict[str, dict[str, str]]]:
    sim = SimulationConfig(requests=requests, seed=seed, judgments=True, interleaving=True, label_rate=0.3,
                           late_fraction=0.03, duplicate_fraction=0.05, orphan_fraction=0.03, invalid_fraction=0.02,
                           arms=(("control", 0.55), ("treatment", 0.7), ("worse", 0.4)))
    return _with_attributes(list(simulate_lines(sim)))


def _replay(lines: list[bytes], tmp_path: Any, config: Any) -> tuple[Engine, Collect]:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(lines))
    collect = Collect()
    return replay([str(path)], config, collect, attach=RollingWindows), collect


def _expected_segments(records: Any, attributes: dict[str, dict[str, str]],
                       limit: int | None = None) -> dict[tuple[str, str, str, str], list[dict[str, Any]]]:
    """Oracle: the per-request metrics of each segment group shown, from the records and each ranking's attributes:
    per experiment and field the ``limit`` values with the most requests (ties by name; None: all) and
    ``__missing__``, the others' requests in ``__other__``."""
    traffic: Counter[tuple[str, str, str]] = Counter()
    for record in records.values():
        for field in SEGMENTS:
            traffic[record["experiment"], field, attributes[record["request_id"]].get(field, "__missing__")] += 1
    shown = {key for key in traffic if key[2] == "__missing__"}
    for experiment, field in {(e, f) for e, f, _ in traffic}:
        ranked = sorted((v for e, f, v in traffic if (e, f) == (experiment, field) and v != "__missing__"),
                        key=lambda v: (-traffic[experiment, field, v], v))
        shown |= {(experiment, field, v) for v in ranked[:limit]}
    expected: dict[tuple[str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in records.values():
        for field in SEGMENTS:
            value = attributes[record["request_id"]].get(field, "__missing__")
            value = value if (record["experiment"], field, value) in shown else "__other__"
            expected[record["experiment"], record["arm"], field, value].append(record["metrics"])
    return expected


def _check_segments(report: dict[str, Any], expected: dict[tuple[str, str, str, str], list[dict[str, Any]]]) -> None:
    """The report's segment rows are ``expected``'s groups: their requests and means; and per field, the values'
    requests add up to their group's."""
    rows = {(r["experiment"], r["arm"], r["segment"]["field"], r["segment"]["value"]): r for r in report["segments"]}
    assert set(rows) == set(expected)
    for key, records in expected.items():
        assert rows[key]["requests"] == len(records)
        for name, mean in rows[key]["metrics"].items():
            spec_name = {"MRR": "RR", "MAP": "AP"}.get(name, name)
            values = [m[spec_name] for m in records if m[spec_name] is not None]
            assert mean == approx(sum(values) / len(values) if values else None), (key, name)
    groups = {(g["experiment"], g["arm"]): g["requests"] for g in report["groups"]}
    for field in SEGMENTS:
        per_group: dict[tuple[str, str], int] = defaultdict(int)
        for (e, a, f, _), row in rows.items():
            if f == field:
                per_group[e, a] += row["requests"]
        assert per_group == {k: n for k, n in groups.items() if n}
    folded = {f: sum(len(records) for (_, _, f2, v), records in expected.items() if f2 == f and v == "__other__")
              for f in SEGMENTS}
    assert report["segment_overflow"] == folded


def test_segment_groups_are_the_means_of_their_requests(tmp_path: Any) -> None:
    """Oracle: each segment group's requests and means, from the per-request records and the attributes each
    ranking carried; and per field, the values' requests add up to their group's."""
    config = Config(segments=SEGMENTS)
    lines, attributes = _lines(1200, seed=11)
    engine, collect = _replay(lines, tmp_path, config)
    report = engine.report()
    _check_segments(report, _expected_segments(collect.records, attributes))
    assert {r["segment"]["value"] for r in report["segments"] if r["segment"]["field"] == "locale"} == \
        {*LOCALES, "__missing__"}
    assert report["segment_overflow"] == {"platform": 0, "locale": 0}
    assert "segments" not in Engine(Config()).report()  # without segments, the report is as before


def test_the_values_with_the_most_requests_are_shown_and_the_rest_is_other(tmp_path: Any) -> None:
    """``max_segment_values`` 2: per experiment and field, the two values with the most requests (ties by name) and
    __missing__; the other values' requests are __other__'s, counted in ``segment_overflow``."""
    config = Config(segments=SEGMENTS, max_segment_values=2)
    lines, attributes = _lines(300, seed=12)
    engine, collect = _replay(lines, tmp_path, config)
    report = engine.report()
    expected = _expected_segments(collect.records, attributes, limit=2)
    _check_segments(report, expected)
    assert all(report["segment_overflow"].values())  # (three platforms, five locales: some are folded)
    assert {v for (_, _, f, v) in expected if f == "locale"} == {"__missing__", "__other__", *(
        v for (_, _, f, v) in expected if f == "locale" and v in LOCALES)}


def test_a_listed_field_shows_its_values_and_folds_every_other(tmp_path: Any) -> None:
    """``segment_values``: the values listed are shown, whatever ``max_segment_values`` and their traffic (``xx``,
    which no request has, with none: it was left out); the others are __other__ when counted (``/metrics`` too)."""
    config = Config(segments=SEGMENTS, max_segment_values=1, segment_values=(("locale", ("de-DE", "ja-JP", "xx")),))
    lines, attributes = _lines(300, seed=12)
    engine, collect = _replay(lines, tmp_path, config)
    listed = {rid: {**a, "locale": a["locale"] if a.get("locale") in ("de-DE", "ja-JP") else "__other__"}
              if "locale" in a else a for rid, a in attributes.items()}
    expected = {key: rows for key, rows in _expected_segments(collect.records, listed).items()
                if key[2] == "locale"}
    expected.update({key: rows for key, rows in _expected_segments(collect.records, attributes, limit=1).items()
                     if key[2] == "platform"})
    assert not any(key[3] == "xx" for key in expected)
    expected.update({(e, a, "locale", "xx"): [] for e, a, f, _ in list(expected) if f == "locale"})
    _check_segments(engine.report(), expected)
    counted = engine.segment_overflow(shown=False)
    assert counted["locale"] == engine.report()["segment_overflow"]["locale"] > 0 and counted["platform"] == 0
    with pytest.raises(ConfigError, match="segment_values.page: not a field"):
        Config(segments=SEGMENTS, segment_values=(("page", ("a",)),))
    with pytest.raises(ConfigError, match="distinct values"):
        Config(segments=SEGMENTS, segment_values=(("locale", ("a", "a")),))
    loaded = load_config(overrides={"segments": "platform", "segment_values": {"platform": ["ios", "web"]}},
                         environ={})
    assert loaded.segment_values == (("platform", ("ios", "web")),)
    assert loaded.to_json()["segment_values"] == {"platform": ["ios", "web"]}


#: Values of a field and a second field of two values, for the property below.
_VALUE_NAMES = tuple(f"v{k}" for k in range(12))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_values_shown_do_not_depend_on_the_order_they_come_in(data: st.DataObject) -> None:
    """Up to ``segment_cap`` (4 × ``max_segment_values``) distinct values, any order of arrival, spread over any
    number of engines (partitions) merged: the same values shown, the same requests and means, as one engine fed
    in time order."""
    config = Config(segments=("platform", "page"), max_segment_values=2, attribution_window=5.0, allowed_lateness=0.0)
    distinct = data.draw(st.integers(config.max_segment_values + 1, config.segment_cap), label="distinct values")
    values = _VALUE_NAMES[:distinct]
    counts = data.draw(st.lists(st.integers(1, 4), min_size=len(values), max_size=len(values)), label="requests")
    requests = data.draw(st.permutations([v for v, n in zip(values, counts, strict=True) for _ in range(n)]),
                         label="order")
    parts = data.draw(st.integers(1, 4), label="engines")
    where = data.draw(st.lists(st.integers(0, parts - 1), min_size=len(requests), max_size=len(requests)))
    events: list[list[Any]] = [[] for _ in range(parts)]
    for k, value in enumerate(requests):
        rid, ts = f"r{k}", T0 + k
        attributes = {"platform": value, "page": ("a", "b")[k % 3 == 0]}
        for target in (events[where[k]],):
            target.append(Ranking(rid, ["a", "b", "c"], ts=ts, experiment="e", arm=("x", "y")[k % 2],
                                  attributes=attributes))
            if k % 2:
                target.append(Feedback(rid, "abc"[k % 3], ts=ts + 1.0))
    one = Engine(config)
    one.process(sorted((e for part in events for e in part), key=lambda e: e.ts))
    one.flush()
    merged = Engine(config)
    for part in events:
        engine = Engine(config)
        engine.process(part)
        engine.flush()
        merged.merge(engine)
    assert merged.segment_rows() == approx(one.segment_rows())
    traffic = Counter(requests)
    shown = sorted(values, key=lambda v: (-traffic[v], v))[:2]
    assert {r["segment"]["value"] for r in one.segment_rows() if r["segment"]["field"] == "platform"} == \
        {*shown, "__other__"}
    assert one.segment_overflow()["platform"] == sum(traffic[v] for v in values if v not in shown)


def _segments_of(engine: Engine) -> Any:
    return approx(engine.segment_rows())


@pytest.mark.parametrize("batch", [1, 50])
def test_partitioned_engine_gives_the_replay_segments(tmp_path: Any, batch: int) -> None:
    config = Config(segments=SEGMENTS)
    lines, _ = _lines(1000, seed=13)
    expected, expected_records = _replay(lines, tmp_path, config)
    collect = Collect()
    engine = run_partitioned(lines, config, collect, batch)
    assert collect.records == expected_records.records
    totals = engine.totals()
    assert _segments_of(totals) == expected.segment_rows()
    assert totals.report()["groups"] == approx(expected.report()["groups"])
    # the A/B rows per segment value: the units' sums are applied in one order whatever the partitions, bit for bit
    assert totals.segment_ab() == expected.segment_ab() and len(expected.segment_ab()) > 100


@pytest.mark.slow
@pytest.mark.parametrize(("stages", "moves", "cuped"), [(3, "snapshots", True), (2, "moves", False)])
def test_segment_rows_with_a_regroup_stage_of_several_partitions(tmp_path: Any, stages: int, moves: str,
                                                                  cuped: bool) -> None:
    """The A/B units in shards over ``stages`` stage partitions that move mid-stream (from checkpoints, or
    snapshots), the shards' segment looks merged on partition 0: the segment rows are replay's, bit for bit, at
    every look (``look_every`` 30 s: a few looks, the first ones showing other values than the last)."""
    config, lines = _short_horizons(2000, 31, False, look_every=30.0, cuped=cuped)
    config = dataclasses.replace(config, segments=SEGMENTS, max_segment_values=3)
    lines, _ = _with_attributes(lines)
    expected, _ = _replay(lines, tmp_path, config)
    merged, _ = run_with_stages(lines, config, stages, moves)
    rows = expected.segment_ab()
    assert rows and merged.segment_ab() == rows
    assert {r["segment"]["value"] for r in rows if r["segment"]["field"] == "locale"} >= {"__other__", "__missing__"}
    assert {r["treatment"] for r in rows} == {"treatment", "worse"} and all(r["cuped"] == cuped for r in rows)
    assert _segments_of(merged) == expected.segment_rows()


def test_segments_survive_a_rebalance_from_a_checkpoint(tmp_path: Any) -> None:
    """Partition 0 moves halfway from engine A to engine B through its checkpoint (its share holds its segment
    groups): A's and B's totals together are the replay's."""
    config = Config(segments=SEGMENTS)
    lines, _ = _lines(1000, seed=14)
    expected, _ = _replay(lines, tmp_path, config)
    a, b = PartitionedEngine(Engine(config, Collect())), PartitionedEngine(Engine(config, Collect()))
    move_partition_halfway(lines, a, b)
    combined = Engine(config)
    combined.merge(a.totals())
    combined.merge(b.totals())
    assert _segments_of(combined) == expected.segment_rows()


def test_windows_per_segment_add_up_to_the_group_windows_and_travel_in_shares(tmp_path: Any) -> None:
    """Per field, the values' window sums and counts are their group's (open requests included, mid-stream); a
    share of the windows restored into fresh ones gives the same finalised part."""
    config = Config(segments=SEGMENTS, attribution_window=60.0, allowed_lateness=0.0)
    engine = Engine(config)
    windows = RollingWindows(engine)
    rng = random.Random(15)
    events: list[Any] = []
    for k in range(400):  # a request a second over 400 s, a click on one of its first items most of the time
        rid, ts = f"r{k}", T0 + k
        events.append(Ranking(rid, ["a", "b", "c"], ts=ts, experiment="e", arm=("x", "y")[k % 2],
                              attributes=_attributes(rid)))
        for _ in range(rng.randint(0, 2)):  # grades that change while the request is open
            events.append(Feedback(rid, rng.choice("abc"), grade=float(rng.randint(1, 3)), ts=ts + rng.uniform(0, 50)))
    events.sort(key=lambda e: e.ts)
    for start in range(0, len(events), 25):  # in batches: open requests' rows are reverted and replaced
        engine.process(events[start : start + 25])
    assert 0 < engine.overall().requests and windows.open_rows > 0
    main, segment = windows.snapshot(), windows.segment_snapshot()
    assert segment
    for field in SEGMENTS:
        added: dict[tuple[str, str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for (e, a, f, _, metric, window), (total, count) in segment.items():
            if f == field:
                added[e, a, metric, window][0] += total
                added[e, a, metric, window][1] += count
        for key, (total, count) in added.items():
            assert main[key][1] == count and main[key][0] == pytest.approx(total, rel=1e-12, abs=1e-12)
    data = orjson.loads(orjson.dumps(shares.take(engine, windows=True)))
    fresh = Engine(config)
    fresh_windows = RollingWindows(fresh)
    shares.restore(fresh, data, None)
    assert _segments_of(fresh) == engine.segment_rows()
    final = _final_cells(windows)
    assert final  # the finalised requests' values (the open ones a new owner rebuilds from the input)
    assert _final_cells(fresh_windows) == final


def _final_cells(windows: RollingWindows) -> dict[tuple[Any, ...], list[float]]:
    """The windows' finalised values per (bucket, segment group), by the segment group's key."""
    keys = windows.engine.segment_keys
    return {(b, *keys[g]): [*m.count.tolist(), *m.total.tolist()]
            for b, cells in windows._segment_final.items() for g, m in cells.items()}


def test_prometheus_exports_every_value_tracked(tmp_path: Any) -> None:
    """/metrics shows every value tracked (a counter cannot follow which values the report shows as their traffic
    changes): the groups of a report that shows them all (``max_segment_values`` above the values there are);
    ``stream_eval_segment_overflow_total`` counts what was folded when counted (a value not listed)."""
    from stream_eval.export.prometheus import EngineCollector

    listed = (("locale", ("de-DE", "ja-JP")),)
    lines, _ = _lines(300, seed=16)
    engine, _ = _replay(lines, tmp_path, Config(segments=SEGMENTS, max_segment_values=2, segment_values=listed))
    everything = _replay(lines, tmp_path, Config(segments=SEGMENTS, segment_values=listed))[0].report()
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    assert len({r["segment"]["value"] for r in everything["segments"] if r["segment"]["field"] == "platform"}) == 3
    for row in everything["segments"]:
        labels = {"experiment": row["experiment"], "arm": row["arm"], "segment_field": row["segment"]["field"],
                  "segment_value": row["segment"]["value"]}
        assert registry.get_sample_value("stream_eval_segment_requests_total", labels) == row["requests"]
        if row["metrics"]["MRR"] is not None:
            total = registry.get_sample_value("stream_eval_segment_metric_sum_total", {**labels, "metric": "RR"})
            count = registry.get_sample_value("stream_eval_segment_metric_count_total", {**labels, "metric": "RR"})
            assert total / count == pytest.approx(row["metrics"]["MRR"], rel=1e-12)
        assert registry.get_sample_value("stream_eval_segment_window_count",
                                         {**labels, "metric": "MRR", "window": "1h"}) is not None
    assert registry.get_sample_value("stream_eval_segment_overflow_total", {"segment_field": "platform"}) == 0
    assert registry.get_sample_value("stream_eval_segment_overflow_total", {"segment_field": "locale"}) == \
        everything["segment_overflow"]["locale"] > 0


def test_attributes_in_the_schema() -> None:
    config = Config()
    good = (b'{"type": "ranking", "request_id": "r1", "ts": 1767225600, "items": ["a"], '
            b'"attributes": {"platform": "ios", "locale": "en-US"}}')
    bad = b'{"type": "ranking", "request_id": "r2", "ts": 1767225600, "items": ["a"], "attributes": {"platform": 3}}'
    listed = b'{"type": "ranking", "request_id": "r3", "ts": 1767225600, "items": ["a"], "attributes": ["ios"]}'
    events = decode_chunk(b"\n".join([good, bad, listed]) + b"\n", config)
    assert isinstance(events[0], Ranking) and events[0].attributes == {"platform": "ios", "locale": "en-US"}
    assert [e.code for e in events[1:] if isinstance(e, Invalid)] == ["bad_attributes", "bad_attributes"]
    topic = decode_messages([good], "ranking", config, [0.0], ["rankings/0@0"])
    assert topic[0].attributes == {"platform": "ios", "locale": "en-US"}  # type: ignore[union-attr]  # a ranking


def _planted(units: int, seed: int) -> tuple[list[Any], dict[str, str]]:
    """Rankings of ``units`` units of arms c and t, three requests each a minute apart, a click on the first or the
    second of three items. The treatment moves the click up on ios only. Each request names a platform (the first
    one the unit's: later ones another at random, half the time); the platform of each unit's first request."""
    rng = random.Random(seed)
    events: list[Any] = []
    first: dict[str, str] = {}
    for u in range(units):
        unit = f"u{u}"
        arm = ("c", "t")[zlib.crc32(unit.encode()) % 2]
        platform = first[unit] = PLATFORMS[rng.randrange(3)]
        for k in range(3):
            rid, ts = f"{unit}-{k}", T0 + 60.0 * k + u * 0.01
            given = platform if k == 0 or rng.random() < 0.5 else PLATFORMS[rng.randrange(3)]
            events.append(Ranking(rid, ["a", "b", "c"], ts=ts, experiment="e", arm=arm, unit_id=unit,
                                  attributes={"platform": given}))
            up = 0.8 if arm == "t" and platform == "ios" else 0.4  # (the unit's platform: its first request's)
            events.append(Feedback(rid, "a" if rng.random() < up else "b", grade=1.0, ts=ts + 1.0))
    events.sort(key=lambda e: e.ts)
    return events, first


#: The planted events' config: one segment field, RR (and GAUC), short horizons, one look at the end.
PLANTED = Config(segments=("platform",), metrics=("RR",), attribution_window=10.0, allowed_lateness=0.0,
                 look_every=1e9)


def _replayed(events: list[Any], config: Any = PLANTED) -> Engine:
    engine = Engine(config)
    engine.process(events)
    engine.flush()
    return engine


def test_segment_rows_are_the_comparisons_of_their_units_and_find_the_segment_that_differs() -> None:
    """Oracle: each unit in the value of its first request; per platform, the comparison of its units' sums (the
    always-valid sequence of the one look), and its difference from the comparison of every other unit. The
    treatment is better on ios only: ios is decided better and flagged as differing from the rest."""
    config = PLANTED
    events, first = _planted(900, seed=3)
    engine = _replayed(events)
    rows = {(r["segment"]["value"], r["metric"]): r for r in engine.segment_ab()}
    assert set(rows) == {(p, m) for p in PLATFORMS for m in ("MRR", "GAUC")}
    per_unit: dict[str, list[float]] = defaultdict(list)
    for event in events:
        if isinstance(event, Feedback):
            per_unit[event.request_id.split("-")[0]].append(1.0 if event.item == "a" else 0.5)
    arm_of = {u: ("c", "t")[zlib.crc32(u.encode()) % 2] for u in first}

    def sums(units: list[str], arm: str) -> ArmSums:
        mine = [u for u in units if arm_of[u] == arm]
        return ArmSums.of_units(np.array([[sum(per_unit[u])] for u in mine]), np.array([[3.0] for _ in mine]))

    for platform in PLATFORMS:
        inside = [u for u, p in first.items() if p == platform]
        outside = [u for u, p in first.items() if p != platform]
        here = compare(sums(inside, "c"), sums(inside, "t"), sequential_n=config.sequential_n)
        rest = compare(sums(outside, "c"), sums(outside, "t"), sequential_n=config.sequential_n)
        apart = difference(here, rest, sequential_n=config.sequential_n)
        row = rows[platform, "MRR"]
        assert (row["units_control"], row["units_treatment"]) == (int(here.units_control[0]),
                                                                 int(here.units_treatment[0]))
        for name, value in (("delta", here.delta), ("cs_lower", here.cs_lower), ("cs_upper", here.cs_upper),
                            ("p_value", here.p_value), ("lift", here.lift), ("rest_delta", apart.delta),
                            ("rest_p_value", apart.p_value)):
            assert row[name] == pytest.approx(float(value[0]), rel=1e-9), (platform, name)
        assert row["exploratory"] is True and row["guardrail"] is False and "n_control" not in row
    assert rows["ios", "MRR"]["decision"] == "better" and rows["ios", "MRR"]["differs"]
    assert rows["web", "MRR"]["decision"] == "inconclusive"
    # the experiment's own rows are untouched by segments: the same as without them
    plain = _replayed(events, dataclasses.replace(config, segments=()))
    assert engine.ab() == plain.ab() and "segment_ab" not in plain.report()


def test_a_unit_keeps_a_small_row_with_segments() -> None:
    """The A/B state per unit with two segment fields and nine metric columns stays under 200 bytes: 2 bytes a field
    beside its sums (the segments' sums are per value, never per unit)."""
    config = Config(segments=("platform", "locale"))
    ledger = UnitLedger(config, [spec.mean_name for spec in config.specs])
    count = 50_000
    values = np.random.default_rng(0).random((count, len(config.specs)))
    ledger.add_requests(np.arange(count, dtype=np.float64), [f"r{i}" for i in range(count)], ["e"] * count,
                        [("a", "b")[i % 2] for i in range(count)], [f"u{i}" for i in range(count)], values,
                        [(PLATFORMS[i % 3], LOCALES[i % 5]) for i in range(count)])
    ledger.release(math.inf)
    shards = ledger.experiments["e"].values()
    held = sum(array.nbytes for e in shards for array in (e.slots, e.unit_key, e.unit_arm, e.conflicted, e.y, e.n,
                                                          e.x, e.q, e.segment))
    assert sum(e.size for e in shards) == count and ledger.width == 9
    assert held / count < 200
    assert {r.value for r in ledger.segment_results() if r.field == "locale"} == set(LOCALES)


def test_prometheus_exports_the_segment_rows() -> None:
    """``stream_eval_segment_ab_*{experiment,metric,arm,segment_field,segment_value}``: each segment row's fields;
    the experiment's own series (``stream_eval_ab_*``, which the alerts read) carry no segment."""
    from stream_eval.export.prometheus import EngineCollector

    engine = _replayed(_planted(300, seed=4)[0])
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    rows = engine.segment_ab()
    assert rows
    for row in rows:
        labels = {"experiment": row["experiment"], "metric": row["metric"], "arm": row["treatment"],
                  "segment_field": row["segment"]["field"], "segment_value": row["segment"]["value"]}
        for name in ("delta", "cs_lower", "cs_upper", "p_value", "lift", "rest_delta", "rest_p_value"):
            expected = math.nan if row[name] is None else row[name]
            assert registry.get_sample_value(f"stream_eval_segment_ab_{name}", labels) == pytest.approx(
                expected, rel=0, abs=0, nan_ok=True), (labels, name)
        assert registry.get_sample_value("stream_eval_segment_ab_differs", labels) == float(row["differs"])
    exported = [s for family in registry.collect() if family.name == "stream_eval_ab_delta" for s in family.samples]
    assert exported and all("segment_field" not in s.labels for s in exported)


def test_the_html_report_has_a_table_of_the_segment_rows(tmp_path: Any) -> None:
    """``--html`` with segments: a table after the decisions, a line per segment row, its value and whether it
    differs from the rest."""
    pytest.importorskip("plotly")
    from stream_eval.cli import main

    lines, _ = _lines(600, seed=17)
    log, page, out, config = (tmp_path / name for name in ("log.jsonl", "page.html", "report.json", "seg.toml"))
    log.write_bytes(b"".join(lines))
    config.write_text('segments = ["platform", "locale"]\nmax_segment_values = 2\n')
    assert main(["replay", str(log), "--config", str(config), "--html", str(page), "-o", str(out),
                 "--no-progress"]) == 0
    report = orjson.loads(out.read_bytes())
    text = page.read_text(encoding="utf-8")
    assert report["segment_ab"] and "Segments (exploratory)" in text
    section = text[text.index("Segments (exploratory)"):]
    for row in report["segment_ab"]:
        assert f"{row['segment']['field']} = {row['segment']['value']}" in section
    assert section.count("<tr>") >= len(report["segment_ab"])


def test_a_boundary_s_segment_looks_go_in_records_below_kafka_s_limit() -> None:
    """A stage partition's segment looks (up to ``segment_cap`` values a field, 16 sums of every metric with CUPED)
    are cut into regroup records of about 512 KiB, far below Kafka's 1 MiB, and read back bit for bit."""
    from stream_eval.engine import records
    from stream_eval.engine.ab import look_from_json
    from stream_eval.engine.regroup import SessionStage
    from stream_eval.engine.segment_ab import SegmentLook

    config = Config(segments=SEGMENTS)
    stage = SessionStage(Engine(config), 1, stage=1, stages=2)
    rng = np.random.default_rng(5)
    values = [f"v{k}" for k in range(config.segment_cap)]
    looks = [SegmentLook("e", shard, "locale", ["a", "b", "c"], values,
                         rng.integers(0, 9, (len(values), 3)), rng.random((len(values), 3, 16, 9)))
             for shard in range(4)]
    stage._report_looks(60.0, list(looks))
    reports = stage.take_reports()
    assert len(reports) > 2 and max(map(len, reports)) < 900_000
    back = [look_from_json(raw) for report in reports for raw in records.decode(report).looks]  # type: ignore[union-attr]
    assert all(isinstance(look, SegmentLook) for look in back)
    assert [(look.shard, look.values) for look in back] == [(look.shard, look.values) for look in looks]
    assert all(np.array_equal(a.sums, b.sums) and np.array_equal(a.units, b.units)  # type: ignore[union-attr]
               for a, b in zip(back, looks, strict=True))


def test_the_ab_trace_has_the_segment_rows_of_each_look(tmp_path: Any) -> None:
    """``--ab-trace``: each look's line carries the segment rows as they stood then (a look of the first half of
    the units shows fewer than the last), the last line the report's."""
    events, _ = _planted(400, seed=6)
    path = tmp_path / "planted.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"type": "ranking" if isinstance(e, Ranking) else "feedback",
                                            **{k: v for k, v in msgspec.structs.asdict(e).items() if v is not None}})
                              + b"\n" for e in events))
    lines: list[dict[str, Any]] = []
    engine = replay([str(path)], dataclasses.replace(PLANTED, look_every=2.0), ab_trace=lines.append)
    assert len(lines) > 2 and all("segment_ab" in line for line in lines)
    assert lines[-1]["segment_ab"] == engine.segment_ab() == engine.report()["segment_ab"]
    units = [sum(r["units_control"] + r["units_treatment"] for r in line["segment_ab"] if r["metric"] == "MRR")
             for line in lines]
    assert 0 < units[1] < units[-1] == 400


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_segment_rows_are_the_same_however_the_shards_are_spread_and_fed(data: st.DataObject) -> None:
    """Units with up to 12 values of a field (beyond ``segment_cap`` 8: each shard then folds some into __other__,
    in its own order), their requests fed in any batches and any order to a ledger holding every shard, or to 2-4
    ledgers each holding some shards, released at any event times, the others' looks merged by the first ledger's
    merger: the segment rows are the same, bit for bit (and the experiment's rows too)."""
    config = Config(segments=("platform",), metrics=("RR",), max_segment_values=2, look_every=10.0)
    count = data.draw(st.integers(20, 120), label="requests")
    values = data.draw(st.lists(st.sampled_from(_VALUE_NAMES), min_size=count, max_size=count), label="values")
    keys = np.array(data.draw(st.lists(st.integers(0, 60), min_size=count, max_size=count)), dtype=np.float64)
    units = [f"u{data.draw(st.integers(0, count // 2), label='unit')}" for _ in range(count)]
    rows = [(keys[k], f"r{k}", "e", ("c", "t")[zlib.crc32(units[k].encode()) % 2], units[k], values[k])
            for k in range(count)]
    rr = np.random.default_rng(count).random((count, 1))

    def feed(ledger: UnitLedger, picked: list[int]) -> None:
        ledger.add_requests(keys[picked], [rows[k][1] for k in picked], ["e"] * len(picked),
                            [rows[k][3] for k in picked], [rows[k][4] for k in picked], rr[picked],
                            [(rows[k][5],) for k in picked])

    one = UnitLedger(config, ["MRR"])
    feed(one, list(range(count)))
    one.release(math.inf)
    parts = data.draw(st.integers(2, 4), label="ledgers")
    ledgers = [UnitLedger(config, ["MRR"]) for _ in range(parts)]
    merger = ledgers[0].merger
    merger.progress_of = [-math.inf] * parts
    for q, ledger in enumerate(ledgers[1:], 1):
        ledger.on_shard_look = merger.add
        ledger.on_progress = functools.partial(merger.progress, q)
    order = data.draw(st.permutations(range(count)), label="arrival order")
    marks = sorted(data.draw(st.lists(st.integers(0, 70), max_size=4), label="watermarks"))
    for q, ledger in enumerate(ledgers):
        mine = [k for k in order if shard_of(units[k]) % parts == q]
        cut = data.draw(st.integers(0, len(mine)), label="batch")
        for batch in (mine[:cut], mine[cut:]):
            if batch:
                feed(ledger, batch)
        for mark in marks:
            ledger.release(float(mark))
    for ledger in ledgers:
        ledger.release(math.inf)
    assert repr(merger.segment_results()) == repr(one.segment_results())  # (NaN: compared as text)
    assert repr(merger.results()) == repr(one.merger.results())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_segment_looks_of_shards_taken_together_are_each_shard_s_own(data: st.DataObject) -> None:
    """``segment_looks`` sums the units of every shard of a look boundary at once: each shard's looks are bit for
    bit those of the shard alone, and each (value, arm) holds the sum of its units' terms (to rounding: numpy
    associates the adds of a group its own way, the same for the same units in the same order), its unit count, and
    zeros where it has no unit. Shards with and without a pre-period, of different
    arms and value tables (some without ``__missing__``, some units unset), and empty ones, are mixed."""
    rule = SegmentRule(("platform", "locale"), {}, cap=4, shown=20)
    width = data.draw(st.integers(1, 3))
    shards = []
    for s in range(data.draw(st.integers(1, 6))):
        size = data.draw(st.integers(0, 30))
        arms = ["c", "t1", "t2"][: data.draw(st.integers(1, 3))]
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        tables = []
        codes = np.empty((size, 2), dtype=np.int16)
        for f, values in enumerate((PLATFORMS, (*LOCALES, MISSING))):
            table = {v: i for i, v in enumerate(values[: data.draw(st.integers(1, len(values)))])}
            tables.append(table)
            codes[:, f] = rng.integers(-1, len(table), size)  # (-1: unset)
        n = rng.integers(0, 3, (size, width)).astype(np.float64)
        pre = data.draw(st.booleans())
        shards.append(ShardUnits("e", s, arms, rng.integers(0, len(arms), size).astype(np.int16), codes, tables,
                                 rng.random((size, width)) * n, n, rng.random((size, width)) if pre else None,
                                 rng.integers(0, 2, (size, width)).astype(np.float64) if pre else None))
    together = segment_looks(rule, shards)
    alone = [look for shard in shards for look in segment_looks(rule, [shard])]
    assert len(together) == len(alone) == 2 * sum(1 for s in shards if len(s.unit_arm))
    for a, b in zip(together, alone, strict=True):
        assert (a.experiment, a.shard, a.field, a.arms, a.values) == (b.experiment, b.shard, b.field, b.arms, b.values)
        assert a.units.tobytes() == b.units.tobytes() and a.sums.tobytes() == b.sums.tobytes()
    by_shard = {s.shard: s for s in shards}
    for look in together:
        shard = by_shard[look.shard]
        f = rule.fields.index(look.field)
        terms = unit_terms(shard.y, shard.n, shard.x, shard.q)
        table = shard.tables[f]
        value = [MISSING if c == -1 and MISSING not in table else
                 list(table)[table.get(MISSING, -1) if c == -1 else c] for c in shard.codes[:, f].tolist()]
        assert look.values == sorted(set(value), key=[*table, MISSING].index)
        for v, name in enumerate(look.values):
            for a in range(len(shard.arms)):
                mine = [u for u in range(len(value)) if value[u] == name and shard.unit_arm[u] == a]
                expected = np.zeros(terms.shape[1:])
                for u in mine:
                    expected = expected + terms[u]
                assert look.units[v, a] == len(mine)
                np.testing.assert_allclose(look.sums[v, a], expected, rtol=1e-12, atol=1e-12)
