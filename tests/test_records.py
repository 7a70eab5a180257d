"""The regroup log's records (``engine/records.py``): typed structs that read the logs written before them."""

from __future__ import annotations

import base64
import math
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_eval.engine import records

TEXT = st.text(min_size=1, max_size=8)
FLOAT = st.floats(allow_nan=False, allow_infinity=False, width=64)
TRANSACTION = st.fixed_dictionaries({}, optional={"partition": st.integers(0, 64), "seq": st.integers(1, 10**9),
                                                  "owner": st.text(alphabet="0123456789abcdef", min_size=8,
                                                                   max_size=8)})


def columns(n: int, *makers: st.SearchStrategy[object]) -> st.SearchStrategy[list[list[object]]]:
    return st.tuples(*(st.lists(make, min_size=n, max_size=n) for make in makers)).map(list)


@st.composite
def any_record(draw: st.DrawFn) -> records.Record:
    common = draw(TRANSACTION)
    kind = draw(st.sampled_from(["S", "Q", "U", "V", "j", "i", "a", "w", "c", "r"]))
    n = draw(st.integers(1, 5))
    if kind == "S":
        sessions, experiments, arms, units = draw(columns(n, TEXT, TEXT, TEXT, st.none() | TEXT))
        served = draw(st.lists(FLOAT, min_size=n, max_size=n))
        scores = draw(st.lists(st.lists(FLOAT, min_size=1, max_size=4), min_size=n, max_size=n))
        relevant = draw(st.lists(st.lists(st.integers(1, 4), max_size=3), min_size=n, max_size=n))
        behaviour = draw(st.booleans())
        numbers: dict[str, object] = {"scores": scores}  # (as written before 2026-11-28)
        if draw(st.booleans()):
            numbers = {"flat_scores": records.flat([x for part in scores for x in part]),
                       "sizes": [len(part) for part in scores]}
        if draw(st.booleans()):  # (flat relevant positions, as written since 2026-12-07)
            numbers |= {"flat_relevant": [x for part in relevant for x in part],
                        "relevant_sizes": [len(part) for part in relevant]}
        else:
            numbers["relevant"] = relevant
        return records.SessionParts(
            sessions=sessions, experiments=experiments, arms=arms, served=served, **numbers,
            units=units, queries=draw(st.lists(st.none() | TEXT, min_size=n, max_size=n)) if behaviour else None,
            satisfied=draw(st.lists(st.booleans(), min_size=n, max_size=n)) if behaviour else None, **common)
    if kind == "Q":
        experiments, arms, queries = draw(columns(n, TEXT, TEXT, TEXT))
        return records.QueryMetrics(experiments=experiments, arms=arms, queries=queries,
                                    served=draw(st.lists(FLOAT, min_size=n, max_size=n)),
                                    values=draw(st.lists(st.none() | FLOAT, min_size=n, max_size=n)), **common)
    if kind in "UV":
        ids, experiments, arms, units = draw(columns(n, TEXT, TEXT, TEXT, TEXT))
        keys = draw(st.lists(FLOAT, min_size=n, max_size=n))
        if kind == "U":
            values = draw(st.lists(st.lists(st.none() | FLOAT, min_size=3, max_size=3), min_size=n, max_size=n))
            flat = {"flat_values": records.flat([[math.nan if v is None else v for v in row] for row in values])}
            return records.UnitRequests(keys=keys, ids=ids, experiments=experiments, arms=arms, units=units,
                                        **(flat if draw(st.booleans()) else {"values": values}), **common)
        y, w = draw(columns(n, st.none() | FLOAT, st.none() | FLOAT))
        return records.UnitSessions(keys=keys, ids=ids, experiments=experiments, arms=arms, units=units,
                                    weighted_auc=y, weight=w, **common)
    if kind == "j":
        return records.Judgment(experiment=draw(TEXT), verdict=draw(st.sampled_from(["good", "same", "bad"])),
                                **common)
    if kind == "i":
        return records.Interleaved(experiment=draw(TEXT), teams=draw(st.lists(TEXT, max_size=4)),
                                   relevant=draw(st.lists(st.integers(1, 4), max_size=4)), **common)
    if kind == "a":
        return records.ArmSeen(experiment=draw(TEXT), arm=draw(TEXT), **common)
    if kind == "w":
        time = draw(FLOAT.map(float) | st.sampled_from(["inf", "-inf"]))
        return records.PartitionWatermark(input_partition=draw(st.integers(0, 64)), time=time,
                                          resumed=draw(st.booleans()), **common)
    return (records.Commit if kind == "c" else records.Rewind)(**common)


@settings(max_examples=300, deadline=None)
@given(any_record())
def test_every_record_reads_back_as_written(record: records.Record) -> None:
    assert records.decode(records.encode(record)) == record


@settings(max_examples=300, deadline=None)
@given(any_record())
def test_the_wire_keys_are_those_of_the_earlier_logs(record: records.Record) -> None:
    """Written as a MessagePack map with the short keys of the logs written before the structs: ``k`` the kind, ``P``
    ``n`` ``x`` the partition's transaction, and no key for a field left at its default."""
    wire = msgspec.msgpack.decode(records.encode(record))
    assert wire["k"] == type(record).__struct_config__.tag
    fields = {f.encode_name: getattr(record, f.name) for f in msgspec.structs.fields(record)}
    defaults = {f.encode_name: f.default for f in msgspec.structs.fields(record)}
    assert {key for key in wire if key != "k"} == {key for key, value in fields.items()
                                                   if value is not None and value is not defaults[key]}
    for key, value in wire.items():
        if key != "k":
            assert value == fields[key] or (isinstance(value, float) and math.isnan(value))


@settings(max_examples=300, deadline=None)
@given(any_record())
def test_records_written_as_json_before_messagepack_are_read(record: records.Record) -> None:
    """Logs written before 2026-12-06 hold each record as a JSON object (a flat column's bytes in base64, NaN as
    null): read as the same record."""
    text = msgspec.json.encode(record)
    assert text.startswith(b"{") and records.encode(record)[:1] != b"{"
    if isinstance(record, records.UnitRequests) and record.flat_values is not None:
        assert base64.b64encode(record.flat_values) in text
    assert records.decode(text) == record


def test_records_written_by_earlier_workers_are_read() -> None:
    """Records as the dict encoder wrote them before the structs (one part or query metric per record, a part of
    2026-11-22 with its finalisation point and no unit), read with their meaning."""
    old = [
        {"k": "r", "P": 4, "x": "t1", "n": 7},
        {"k": "c", "P": 4, "x": "t1", "n": 9},
        {"k": "s", "id": "s1", "e": "exp", "a": "A", "t": 100.0, "s": [1.0, 0.5], "r": [1], "u": "user1",
         "P": 4, "n": 8, "x": "t1"},
        {"k": "s", "id": "s2", "e": "exp", "a": "B", "d": 1960.0, "s": [2, 1], "r": []},
        {"k": "q", "e": "exp", "a": "A", "q": "q1", "t": 100.0, "v": 0.5},
        {"k": "U", "t": [1960.0], "id": ["r1"], "e": ["exp"], "a": ["A"], "u": ["user1"], "v": [[1.0, None]]},
        {"k": "V", "t": [1980.0], "id": ["s1"], "e": ["exp"], "a": ["A"], "u": ["user1"], "y": [0.5], "w": [2.0]},
        {"k": "j", "e": "exp", "v": "good"},
        {"k": "i", "e": "exp", "teams": ["A", "B"], "r": [2]},
        {"k": "a", "e": "exp", "a": "A"},
        {"k": "w", "u": 3, "t": "inf"},
    ]
    read = [records.decode(orjson.dumps(record)) for record in old]
    rewind, commit, part, old_part, metric, units, sessions, judgment, interleaved, arm, mark = read
    assert (type(rewind), rewind.partition, rewind.owner, rewind.seq) == (records.Rewind, 4, "t1", 7)
    assert (type(commit), commit.seq) == (records.Commit, 9)
    assert isinstance(part, records.SessionPart) and (part.session, part.served, part.unit, part.seq) == (
        "s1", 100.0, "user1", 8)
    assert isinstance(old_part, records.SessionPart) and old_part.served is None and old_part.finalised == 1960.0
    assert old_part.unit is msgspec.UNSET and old_part.partition is None  # no unit: the session's; no partition
    assert isinstance(metric, records.QueryMetric) and (metric.query, metric.value) == ("q1", 0.5)
    assert isinstance(units, records.UnitRequests) and units.values == [[1.0, None]]
    assert isinstance(sessions, records.UnitSessions) and (sessions.weighted_auc, sessions.weight) == ([0.5], [2.0])
    assert isinstance(judgment, records.Judgment) and judgment.verdict == "good"
    assert isinstance(interleaved, records.Interleaved) and interleaved.relevant == [2]
    assert isinstance(arm, records.ArmSeen) and arm.arm == "A"
    assert isinstance(mark, records.PartitionWatermark) and (mark.input_partition, mark.at) == (3, math.inf)


def test_the_stage_reads_a_session_part_of_any_form_alike() -> None:
    """Session parts as the stage waits on them (``Parts.of_record``): the same from a columnar record with flat
    relevant positions, from one with a list of them per part (logs before 2026-12-07) or scores as numbers (before
    2026-11-28), from a one-part record (before 2026-11-26), and from one with its finalisation point instead of its
    serve time and no unit (before 2026-11-23: the serve time is the point less the horizon, the unit the session)."""
    from stream_eval.engine.parts import Parts

    horizon = 1800.0
    common: dict[str, Any] = {"sessions": ["s1", "s2"], "experiments": ["exp", "exp"], "arms": ["A", "B"],
                              "served": [100.0, 160.0], "units": ["user1", None], "queries": ["q1", "q2"],
                              "satisfied": [True, False]}
    flat = {"flat_scores": records.flat(np.array([1.0, 0.5, 2.0, 1.0, 0.25])), "sizes": [2, 3]}
    columnar = records.SessionParts(**common, **flat, flat_relevant=[1], relevant_sizes=[1, 0])
    nested = records.SessionParts(**common, **flat, relevant=[[1], []])
    numbers = records.SessionParts(**common, scores=[[1.0, 0.5], [2.0, 1.0, 0.25]], relevant=[[1], []])
    one_part = records.SessionPart(session="s1", experiment="exp", arm="A", scores=[1.0, 0.5], relevant=[1],
                                   served=100.0, unit="user1", query="q1", satisfied=True)
    oldest = records.SessionPart(session="s1", experiment="exp", arm="A", scores=[1.0, 0.5], relevant=[1],
                                 finalised=100.0 + horizon, query="q1", satisfied=True)

    def fields(parts: Parts) -> dict[str, Any]:
        return {name: value.tolist() if isinstance(value, np.ndarray) else value
                for name in Parts.__slots__ if not name.startswith("_") for value in [getattr(parts, name)]}

    both = fields(Parts.of_record(records.decode(records.encode(columnar)), horizon))
    assert both == {"sessions": ["s1", "s2"], "experiments": ["exp", "exp"], "arms": ["A", "B"],
                    "served": [100.0, 160.0], "sizes": [2, 3], "scores": [1.0, 0.5, 2.0, 1.0, 0.25],
                    "relevant_sizes": [1, 0], "relevant": [1], "units": ["user1", None], "queries": ["q1", "q2"],
                    "satisfied": [True, False]}  # (unit None: a session of no split)
    for older in (nested, numbers):
        assert fields(Parts.of_record(records.decode(records.encode(older)), horizon)) == both
    first = {name: column[:1] for name, column in both.items()}
    first["scores"], first["relevant"] = [1.0, 0.5], [1]
    assert fields(Parts.of_record(one_part, horizon)) == first
    assert fields(Parts.of_record(oldest, horizon)) == {**first, "units": ["s1"]}
    for torn in (records.SessionParts(**{**common, "experiments": ["exp"]}, **flat, relevant=[[], []]),
                 records.SessionParts(**common, **flat, flat_relevant=[1, 2], relevant_sizes=[1, 0]),
                 records.SessionParts(**common, flat_scores=flat["flat_scores"], sizes=[2, 2], relevant=[[], []]),
                 records.SessionParts(**common, flat_scores=flat["flat_scores"], sizes=[6, -1], relevant=[[], []]),
                 records.SessionParts(**common, **flat, relevant=[[3], []]),  # (part 1 has 2 items)
                 records.SessionParts(**common, **flat, flat_relevant=[0], relevant_sizes=[1, 0]),
                 records.SessionPart(session="s1", experiment="exp", arm="A", scores=[1.0], relevant=[2], served=1.0)):
        with pytest.raises(ValueError):  # (columns of unequal lengths, a count below 0, a position outside its part:
            # an error, not a part left out or another's item marked)
            Parts.of_record(torn, horizon)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30_000), st.integers(0, 30_000)), max_size=2500),
       st.booleans(), st.sampled_from([64 << 10, 100]))
def test_records_are_cut_where_a_row_by_row_count_cuts_them(rows: list[tuple[int, int]], with_extra: bool,
                                                             bound: int) -> None:
    """``row_ranges`` cuts at the bounds a count row by row gives: at most UNIT_ROWS rows and UNIT_ID_CHARS
    characters a range, a row longer than that alone (its cuts are found by a search over cumulative sizes)."""
    from unittest.mock import patch

    from stream_eval.engine import regroup

    columns = [["x" * a for a, _ in rows], ["y" * (b % 7) for _, b in rows]]
    extra = [b for _, b in rows] if with_extra else None

    def counted() -> list[tuple[int, int]]:
        out, start, chars = [], 0, 0
        for i in range(len(rows)):
            size = len(columns[0][i]) + len(columns[1][i]) + (extra[i] if extra else 0)
            if i > start and (chars + size > bound or i - start == regroup.UNIT_ROWS):
                out.append((start, i))
                start, chars = i, 0
            chars += size
        return out + ([(start, len(rows))] if start < len(rows) else [])

    with patch.object(regroup, "UNIT_ID_CHARS", bound):
        assert regroup.row_ranges(columns, extra) == counted()


@settings(max_examples=50, deadline=None)
@given(arms=st.integers(0, 4), width=st.integers(1, 5), pre=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_a_shard_s_look_reads_back_bit_for_bit_in_either_form(arms: int, width: int, pre: bool, seed: int) -> None:
    """A look reported to stage partition 0 (``LookReport``) reads back bit for bit: written now (each arm's sums as
    one array's bytes, and each arm's requests per column), and as logs written before 2026-12-04 hold it (each sum
    a list of JSON numbers, no requests: read as not known)."""
    from stream_eval.engine.ab import ShardLook, look_from_json
    from stream_eval.stats import ArmSums

    rng = np.random.default_rng(seed)

    def random_arm() -> ArmSums:
        values = rng.normal(size=(16 if pre else 6, width)) * 10.0 ** rng.integers(-300, 300, size=(1, width))
        return ArmSums.from_terms(values)

    requests = {f"arm{k}": rng.integers(0, 10**9, size=width).astype(np.float64) for k in range(arms + 1)}
    look = ShardLook("exp", 7, [f"arm{k}" for k in range(arms)], [random_arm() for _ in range(arms)],
                     list(map(int, rng.integers(0, 10**6, size=arms))), 2, 3, requests)

    def arrays(read: ShardLook) -> list[bytes]:
        return [np.asarray(v, dtype=np.float64).tobytes() for s in read.sums
                for v in (*s._values(), *(() if s.pre is None else s.pre._values()))]

    written = records.decode(records.encode(records.LookReport(stage=1, time=60.0, looks=[look.to_json()])))
    now = look_from_json(written.looks[0])  # type: ignore[union-attr]  # a LookReport
    earlier = look_from_json(orjson.loads(orjson.dumps(
        [*look.to_json()[:3], [[v.tolist() for v in (*s._values(), *(() if s.pre is None else s.pre._values()))]
                               for s in look.sums], *look.to_json()[4:7]])))
    assert isinstance(now, ShardLook) and now.requests is not None and earlier.requests is None
    assert list(now.requests) == list(requests)
    assert all(np.array_equal(now.requests[arm], counted) for arm, counted in requests.items())
    for read in (now, earlier):
        assert isinstance(read, ShardLook)
        assert (read.experiment, read.shard, read.arms, read.units, read.conflicts, read.overflow) == (
            "exp", 7, look.arms, look.units, 2, 3)
        assert arrays(read) == arrays(look)
        assert [s.pre is None for s in read.sums] == [not pre] * arms
