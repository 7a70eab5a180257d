"""Parquet input and output of ``stream-eval replay``: the same events in Parquet and in JSON Lines give the same
report, exactly; invalid rows are counted as invalid lines are; ``--per-request OUT.parquet`` holds the values of
``--per-request OUT.jsonl``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import run_cli
from test_segments import _attributes

from stream_eval.config import Config
from stream_eval.engine.replay import replay
from stream_eval.events.parquet import ColumnError, parse_columns
from stream_eval.simulate import SimulationConfig, write_jsonl

T0 = 1_767_225_600.0

#: The columns of an event table with a ``type`` column (a null cell: the field is absent).
SCHEMA = pa.schema([
    ("type", pa.string()), ("request_id", pa.string()), ("ts", pa.float64()), ("items", pa.list_(pa.string())),
    ("scores", pa.list_(pa.float64())), ("query_id", pa.string()), ("session_id", pa.string()),
    ("experiment", pa.string()), ("arm", pa.string()), ("unit_id", pa.string()), ("teams", pa.list_(pa.string())),
    ("subtopics", pa.list_(pa.list_(pa.string()))), ("item", pa.string()), ("kind", pa.string()),
    ("grade", pa.float64()), ("verdict", pa.string()), ("dwell", pa.float64()),
    ("attributes", pa.map_(pa.string(), pa.string())),
])


def write_parquet(rows: list[dict[str, Any]], path: Path, schema: pa.Schema = SCHEMA, row_group_size: int = 1000,
                  ) -> None:
    names = set(schema.names)
    table = pa.Table.from_pylist([{k: v for k, v in row.items() if k in names} for row in rows], schema=schema)
    pq.write_table(table, path, row_group_size=row_group_size)


def write_jsonl_rows(rows: list[dict[str, Any]], path: Path) -> None:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))


def reports(rows: list[dict[str, Any]], tmp: Path, config: Config | None = None, batch: int = 1000,
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The reports of replaying ``rows`` as JSON Lines and as Parquet."""
    config = config or Config()
    write_jsonl_rows(rows, tmp / "log.jsonl")
    write_parquet(rows, tmp / "log.parquet", row_group_size=batch)
    from_jsonl = replay([str(tmp / "log.jsonl")], config).report()
    from_parquet = replay([str(tmp / "log.parquet")], config).report()
    return from_jsonl, from_parquet


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Simulated traffic with interleaving and judgments, unit ids, and bad rows of several kinds."""
    path = tmp_path_factory.mktemp("sim") / "log.jsonl"
    write_jsonl(SimulationConfig(requests=3000, seed=3, interleaving=True, judgments=True, unit="user", behaviour=True),
                str(path))
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    bad = [
        {"type": "feedback", "request_id": "", "item": "x", "ts": T0},  # empty request id
        {"type": "feedback", "request_id": "r1", "item": "x", "kind": "label", "ts": T0},  # label without grade
        {"type": "feedback", "request_id": "r1", "item": "x", "grade": -1.0, "ts": T0},  # negative grade
        {"type": "feedback", "request_id": "r1", "item": "x", "kind": "purchase", "ts": T0},  # unknown kind
        {"type": "ranking", "request_id": "rx", "items": ["a", "a"], "ts": T0},  # repeated item
        {"type": "ranking", "request_id": "ry", "items": ["a", "b"], "scores": [1.0], "ts": T0},  # lengths
        {"type": "ranking", "request_id": "rz", "items": [], "ts": T0},  # no items: a zero-result request, valid
        {"type": "feedback", "request_id": "r1", "item": "x", "dwell": -1.0, "ts": T0},  # negative dwell
        {"type": "ranking", "request_id": "rt", "items": ["a"], "ts": 1.0},  # ts out of range
        {"type": "ranking", "request_id": "rn", "items": ["a"]},  # no ts
        {"type": "click", "request_id": "r1", "item": "x", "ts": T0},  # unknown type
        {"type": "ranking", "request_id": "ru", "items": ["caf\u00e9", 'say "hi"', "b\\c"], "ts": T0 + 5},  # odd
    ]
    for k, row in enumerate(bad):
        rows.insert(200 + 37 * k, row)
    return rows


@pytest.mark.slow
def test_parquet_report_equals_jsonl_report(simulated: list[dict[str, Any]], tmp_path: Path) -> None:
    from_jsonl, from_parquet = reports(simulated, tmp_path)
    assert from_parquet == from_jsonl
    assert from_jsonl["events"]["invalid"] == 10
    assert from_jsonl["events"]["judgment"] > 0 and from_jsonl["gsb"]


def test_parquet_behaviour_equals_jsonl(simulated: list[dict[str, Any]], tmp_path: Path) -> None:
    """Dwell (a float column), zero-result rankings (an empty list) and the behaviour measures."""
    from_jsonl, from_parquet = reports(simulated, tmp_path, Config(metrics=("nDCG@10", "behaviour")))
    assert from_parquet == from_jsonl
    metrics = from_jsonl["overall"]["metrics"]
    assert 0 < metrics["SatClick"] < 1 and 0 < metrics["ZeroResult"] < 1 and 0 < metrics["Reformulation"] < 1
    assert from_jsonl["events"]["judgment"] > 0 and from_jsonl["gsb"]


def test_parquet_in_several_batches_and_skip_policy(simulated: list[dict[str, Any]], tmp_path: Path) -> None:
    from_jsonl, from_parquet = reports(simulated, tmp_path, Config(empty="skip", cutoffs=(3, 10)), batch=257)
    assert from_parquet == from_jsonl


@pytest.mark.slow
def test_cli_columns_mapping_and_per_request_parquet(simulated: list[dict[str, Any]], tmp_path: Path) -> None:
    renamed = pa.schema([field.with_name({"request_id": "req_id", "items": "doc_ids"}.get(field.name, field.name))
                         for field in SCHEMA])
    rows = [{{"request_id": "req_id", "items": "doc_ids"}.get(k, k): v for k, v in row.items()} for row in simulated]
    write_parquet(rows, tmp_path / "log.parquet", renamed)
    write_jsonl_rows(simulated, tmp_path / "log.jsonl")
    parquet = run_cli("replay", str(tmp_path / "log.parquet"), "--columns", "request_id=req_id,items=doc_ids",
                      "--format", "json", "--per-request", str(tmp_path / "out.parquet"))
    jsonl = run_cli("replay", str(tmp_path / "log.jsonl"), "--format", "json", "--per-request",
                    str(tmp_path / "out.jsonl"))
    assert parquet.returncode == 0, parquet.stderr
    assert json.loads(parquet.stdout) == json.loads(jsonl.stdout)
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert len(table) == len(records) > 0
    for row, record in zip(table, records, strict=True):
        assert {k: row[k] for k in ("request_id", "experiment", "arm", "query_id", "session_id")} == {
            k: record[k] for k in ("request_id", "experiment", "arm", "query_id", "session_id")}
        assert {name: row[name] for name in record["metrics"]} == record["metrics"]


def test_per_request_parquet_without_requests_has_the_same_columns(simulated: list[dict[str, Any]],
                                                                  tmp_path: Path) -> None:
    """A run that finalises no request (an empty log, feedback only) writes a file with the metric columns too, as
    a run with rows does, so that the files of several runs read as one dataset; it had the id columns only."""
    write_jsonl_rows(simulated, tmp_path / "log.jsonl")
    write_jsonl_rows([row for row in simulated if row["type"] == "feedback"], tmp_path / "feedback.jsonl")
    schemas = []
    for name in ("log", "feedback"):
        out = tmp_path / f"{name}.parquet"
        result = run_cli("replay", str(tmp_path / f"{name}.jsonl"), "--format", "json", "--cutoffs", "3,5",
                         "--per-request", str(out))
        assert result.returncode == 0, result.stderr
        schemas.append(pq.read_schema(out))
    assert pq.read_table(tmp_path / "feedback.parquet").num_rows == 0
    assert "nDCG@5" in schemas[0].names and schemas[1] == schemas[0]


@pytest.mark.slow
def test_rows_without_type_column_and_timestamps(tmp_path: Path) -> None:
    """Without a ``type`` column a row with items is a ranking, one with an item feedback; ``ts`` a timestamp."""
    seconds = [T0, T0 + 1, T0 + 2, T0 + 3, T0 + 4]
    table = pa.table({
        "request_id": ["a", "b", "a", "b", "b"],
        "items": pa.array([["x", "y"], ["y", "z"], None, None, None], pa.list_(pa.string())),
        "item": [None, None, "y", "z", "y"],
        "kind": [None, None, None, "label", None],
        "grade": pa.array([None, None, None, 2, None], pa.int64()),
        "ts": pa.array([int(t * 1000) for t in seconds], pa.timestamp("ms")),
    })
    pq.write_table(table, tmp_path / "events.parquet")
    report = replay([str(tmp_path / "events.parquet")], Config()).report()
    assert report["events"] == {"ranking": 2, "feedback": 3, "judgment": 0, "invalid": 0, "late": 0,
                                "duplicate": 0, "orphan": 0}
    assert report["overall"]["metrics"]["MRR"] == pytest.approx((1 / 2 + 1) / 2)
    rows = [{"type": "ranking" if items else "feedback", "request_id": rid, "ts": ts,
             **({"items": items} if items else {"item": item}), **({"kind": kind, "grade": 2} if kind else {})}
            for rid, items, item, kind, ts in zip(*(table.column(c).to_pylist() for c in
                                                    ("request_id", "items", "item", "kind")), seconds, strict=True)]
    write_jsonl_rows(rows, tmp_path / "events.jsonl")
    assert replay([str(tmp_path / "events.jsonl")], Config()).report() == report


@pytest.mark.slow
def test_bad_columns_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ColumnError):
        parse_columns("request=req_id")
    with pytest.raises(ColumnError):
        parse_columns("request_id")
    with pytest.raises(ColumnError, match="request_id is given twice"):  # (the last one was taken)
        parse_columns("request_id=req,items=docs,request_id=rid")
    assert parse_columns("request_id=req,session_id=req,request_id=req") == {"request_id": "req", "session_id": "req"}
    pq.write_table(pa.table({"req": ["a"]}), tmp_path / "x.parquet")
    result = run_cli("replay", str(tmp_path / "x.parquet"), "--columns", "request_id=rid", "--format", "json")
    assert result.returncode == 2 and "no column 'rid'" in result.stderr
    result = run_cli("replay", str(tmp_path / "x.parquet"), "--format", "json")
    assert result.returncode == 2 and "nothing says what a row is" in result.stderr
    # JSON Lines name their fields: --columns was ignored without a word
    (tmp_path / "x.jsonl").write_text("")
    result = run_cli("replay", str(tmp_path / "x.jsonl"), "--columns", "request_id=x", "--per-request",
                     str(tmp_path / "out.jsonl"))
    assert result.returncode == 2 and "--columns maps the columns of Parquet inputs" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out.jsonl").exists()


@pytest.mark.slow
def test_damaged_parquet_keeps_what_was_read(tmp_path: Path) -> None:
    rows = [{"type": "ranking", "request_id": f"r{k}", "items": ["a", "b"], "ts": T0 + k} for k in range(200_000)]
    write_parquet(rows, tmp_path / "log.parquet", row_group_size=50_000)  # read a row group at a time
    data = (tmp_path / "log.parquet").read_bytes()
    cut = tmp_path / "cut.parquet"
    middle = len(data) // 2
    cut.write_bytes(data[:middle] + bytes(200) + data[middle + 200:])  # a row group in the middle overwritten
    result = run_cli("replay", str(cut), "--format", "json")
    assert result.returncode == 1
    assert "error:" in result.stderr
    assert 0 < json.loads(result.stdout)["events"]["ranking"] < 200_000


NAMES = st.text(alphabet="ab\u00e9\"\\,", min_size=0, max_size=3)


@st.composite
def event_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Rankings and feedback with odd names, grades, kinds and times, some invalid."""
    rows: list[dict[str, Any]] = []
    for k in range(draw(st.integers(1, 25))):
        ts = T0 + draw(st.floats(0, 4000, allow_nan=False))
        rid = draw(st.sampled_from(["r1", "r2", "r\u00e9", ""]))
        if draw(st.booleans()):
            items = draw(st.lists(NAMES, min_size=0, max_size=4))
            row: dict[str, Any] = {"type": "ranking", "request_id": rid, "ts": ts, "items": items}
            if draw(st.booleans()):
                row["scores"] = draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=len(items),
                                              max_size=len(items) + draw(st.integers(0, 1))))
            row["arm"] = draw(st.sampled_from([None, "a", "b\u00e9"]))
            # a map with any keys; a null value is invalid (bad_attributes) as JSON's null is
            row["attributes"] = draw(st.one_of(st.none(), st.dictionaries(NAMES, st.one_of(NAMES, st.none()),
                                                                          max_size=3)))
        else:
            row = {"type": "feedback", "request_id": rid, "ts": ts, "item": draw(NAMES),
                   "kind": draw(st.sampled_from([None, "click", "label", "view"])),
                   "grade": draw(st.sampled_from([None, 0.0, 1.0, 2.5, -1.0, 150.0]))}
        rows.append({key: value for key, value in row.items() if value is not None})
        del k
    return rows


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=event_rows())
def test_parquet_equals_jsonl_on_generated_rows(rows: list[dict[str, Any]], tmp_path: Path) -> None:
    from_jsonl, from_parquet = reports(rows, tmp_path, Config(attribution_window=600.0, segments=("a", "b")),
                                        batch=7)
    assert from_parquet == from_jsonl
    assert not math.isnan(from_jsonl["events"]["invalid"])


def test_rows_too_large_are_invalid_as_their_json_lines_are(tmp_path: Path) -> None:
    """A row whose JSON line would pass 256 KiB (a long request id in feedback and in a plain ranking, long items,
    long subtopics) is ``too_large`` in Parquet as in JSON Lines; rows just under it are read as usual."""
    from stream_eval.events.scan import MAX_EVENT_BYTES

    big, small = "r" * (MAX_EVENT_BYTES + 10), "s" * (MAX_EVENT_BYTES - 2000)
    rows: list[dict[str, Any]] = [
        {"type": "ranking", "request_id": "ok", "ts": T0, "items": ["a", "b"]},
        {"type": "feedback", "request_id": big, "item": "a", "ts": T0 + 1},
        {"type": "ranking", "request_id": big, "ts": T0 + 2, "items": ["a"]},
        {"type": "ranking", "request_id": "long-items", "ts": T0 + 3,
         "items": [f"{i:06d}" + "x" * 3000 for i in range(90)]},
        {"type": "ranking", "request_id": "long-subtopics", "ts": T0 + 4, "items": ["a"], "subtopics": [[big[:-20]]]},
        {"type": "ranking", "request_id": small, "ts": T0 + 5, "items": ["a"]},
        {"type": "feedback", "request_id": "ok", "item": "a", "ts": T0 + 6},
    ]
    from_jsonl, from_parquet = reports(rows, tmp_path)
    assert from_parquet == from_jsonl
    assert from_jsonl["events"]["invalid"] == 4 and from_jsonl["overall"]["requests"] == 2


SEGMENTED = Config(segments=("platform", "locale"), max_segment_values=3)


def _with_attributes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` whose rankings carry attributes (:func:`test_segments._attributes`), a few of them invalid ones."""
    out = []
    for k, row in enumerate(rows):
        if row.get("type") == "ranking" and isinstance(row.get("request_id"), str):
            row = {**row, "attributes": _attributes(row["request_id"])}
            if k % 401 == 0:  # null is not a value (bad_attributes, in JSON Lines as in Parquet)
                row["attributes"] = {**row["attributes"], "platform": None}
        out.append(row)
    return out


def test_parquet_attributes_give_the_jsonl_segments(simulated: list[dict[str, Any]], tmp_path: Path) -> None:
    """A ``map<string, string>`` column of attributes: the segment groups and the segment A/B rows of the JSON
    Lines log, exactly (rankings with attributes in the fast path and in the slow one: interleaved ones)."""
    rows = _with_attributes(simulated)
    from_jsonl, from_parquet = reports(rows, tmp_path, SEGMENTED, batch=513)
    assert from_parquet == from_jsonl
    values = {(s["segment"]["field"], s["segment"]["value"]) for s in from_jsonl["segments"]}
    assert {("platform", p) for p in ("ios", "android", "web")} <= values and ("locale", "__missing__") in values
    assert {row["segment"]["value"] for row in from_jsonl["segment_ab"]} >= {"ios", "android", "web"}
    assert from_jsonl["events"]["invalid"] > 10  # the null attributes


def test_struct_attributes_as_pyarrow_json_reads_them(simulated: list[dict[str, Any]], tmp_path: Path) -> None:
    """The README's conversion (``pyarrow.json.read_json``) makes ``attributes`` a struct of the keys met: its null
    fields are absent keys, so the report is the JSON Lines log's."""
    import pyarrow.json as pj

    rows = [row for row in _with_attributes(simulated)  # (a struct cannot tell a null value from an absent key)
            if None not in (row.get("attributes") or {}).values()]
    write_jsonl_rows(rows, tmp_path / "log.jsonl")
    table = pj.read_json(tmp_path / "log.jsonl")
    assert pa.types.is_struct(table.schema.field("attributes").type)
    pq.write_table(table, tmp_path / "log.parquet", row_group_size=700)
    from_jsonl = replay([str(tmp_path / "log.jsonl")], SEGMENTED).report()
    assert replay([str(tmp_path / "log.parquet")], SEGMENTED).report() == from_jsonl
    assert from_jsonl["segment_ab"]


def test_attributes_of_another_type_are_invalid_as_in_json(tmp_path: Path) -> None:
    """A text column of attributes (JSON text, say) is ``bad_attributes``, as a string is in a JSON line; a map of
    a key given twice keeps its last value, as a JSON object does."""
    table = pa.table({"type": ["ranking", "ranking"], "request_id": ["a", "b"], "ts": [T0, T0 + 1],
                      "items": [["x"], ["y"]], "attributes": ['{"platform": "ios"}', None]})
    pq.write_table(table, tmp_path / "text.parquet")
    report = replay([str(tmp_path / "text.parquet")], SEGMENTED).report()
    assert report["events"]["invalid"] == 1 and report["events"]["ranking"] == 1
    twice = pa.array([[("platform", "ios"), ("platform", "web")]], pa.map_(pa.string(), pa.string()))
    pq.write_table(pa.table({"request_id": ["a"], "ts": [T0], "items": [["x"]], "attributes": twice}),
                   tmp_path / "twice.parquet")
    (tmp_path / "twice.jsonl").write_bytes(b'{"type": "ranking", "request_id": "a", "ts": %d, "items": ["x"], '
                                           b'"attributes": {"platform": "ios", "platform": "web"}}\n' % T0)
    from_parquet = replay([str(tmp_path / "twice.parquet")], SEGMENTED).report()
    assert from_parquet == replay([str(tmp_path / "twice.jsonl")], SEGMENTED).report()
    assert [s["segment"]["value"] for s in from_parquet["segments"] if s["segment"]["field"] == "platform"] == ["web"]


def test_a_time_that_is_not_finite_is_out_of_range_as_the_contract_says(tmp_path: Path) -> None:
    """A Parquet column holds NaN and infinities, which no JSON line can: a ``ts`` of them is a time no real log
    holds (``ts_out_of_range``, docs/contract.md §1), a grade of them a bad grade."""
    table = pa.table({"type": ["ranking", "ranking", "ranking", "feedback"], "request_id": ["a", "b", "c", "c"],
                      "ts": [float("nan"), float("inf"), T0, T0 + 1], "items": [["x"], ["x"], ["x"], None],
                      "item": [None, None, None, "x"], "grade": [None, None, None, float("nan")]})
    pq.write_table(table, tmp_path / "odd.parquet")
    engine = replay([str(tmp_path / "odd.parquet")], Config())
    assert engine.invalid_reasons == {"ranking: ts_out_of_range": 2, "feedback: bad_grade": 1}
    # a NaN score: named as what it is (it used to read "Expected `float`, got `null`", the NaN written as null)
    pq.write_table(pa.table({"request_id": ["a"], "ts": [T0], "items": [["x", "y"]], "scores": [[1.0, math.nan]]}),
                   tmp_path / "score.parquet")
    engine = replay([str(tmp_path / "score.parquet")], Config())
    assert [e.reason for e in engine.invalid_examples] == ["scores: not a finite number (NaN or infinite) in the list"]


def test_a_damaged_row_group_keeps_the_row_groups_before_it(tmp_path: Path) -> None:
    """Row groups are read in runs of up to 65,536 rows: a damaged group lost the whole run before it, here every
    row (small groups of 2,000). Now the run's groups before the damaged one are read."""
    rows = [{"type": "ranking", "request_id": f"r{k}", "items": ["a", "b"], "ts": T0 + k} for k in range(16_000)]
    write_parquet(rows, tmp_path / "log.parquet", row_group_size=2_000)
    data = (tmp_path / "log.parquet").read_bytes()
    middle = len(data) // 2
    (tmp_path / "cut.parquet").write_bytes(data[:middle] + bytes(2_000) + data[middle + 2_000:])
    result = run_cli("replay", str(tmp_path / "cut.parquet"), "--format", "json")
    assert result.returncode == 1 and "error:" in result.stderr
    read = json.loads(result.stdout)["events"]["ranking"]
    assert read % 2_000 == 0 and 2_000 <= read < 16_000, read


@pytest.mark.parametrize("content", [b"", b"PAR1garbage", b"not parquet at all\n"])
def test_a_file_that_is_not_parquet_is_an_error_not_a_traceback(content: bytes, tmp_path: Path) -> None:
    (tmp_path / "bad.parquet").write_bytes(content)
    result = run_cli("replay", str(tmp_path / "bad.parquet"), "--format", "json")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "bad.parquet: cannot be read as Parquet" in result.stderr
    assert json.loads(result.stdout)["events"]["ranking"] == 0


def test_empty_ids_and_names_are_ones_not_given(tmp_path: Path) -> None:
    """A ranking's ``session_id``, ``unit_id`` or ``query_id`` of ``""`` (a producer's zero value for "none") was an
    id like any other: every such request of the log fell into one session and one A/B unit (a unit in every arm,
    counted as a conflict), and ``experiment`` or ``arm`` ``""`` made a group of that name. Empty, each is now the
    field not given, on every reading path: compact and spaced JSON lines (the compiled reader and msgspec), Parquet."""
    path = tmp_path / "sim.jsonl"
    write_jsonl(SimulationConfig(requests=600, seed=7, unit="user"), str(path))
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    fields = ("session_id", "unit_id", "query_id", "experiment", "arm")
    emptied, absent = [], []
    rankings = 0
    for row in rows:
        if row["type"] == "ranking":
            rankings += 1
            if rankings % 3 == 0:  # a third of the rankings: one field empty in turn, all of them every 15th
                chosen = fields if rankings % 15 == 0 else (fields[rankings // 3 % len(fields)],)
                emptied.append({**row, **{field: "" for field in chosen}})
                absent.append({key: value for key, value in row.items() if key not in chosen})
                continue
        emptied.append(row)
        absent.append(row)
    expected = replay([str(_written(absent, tmp_path / "absent.jsonl"))], Config()).report()
    assert expected["events"]["invalid"] == 0
    compact = _written(emptied, tmp_path / "compact.jsonl")
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_text("".join(json.dumps(row) + "\n" for row in emptied))  # (", " and ": ": msgspec reads these)
    write_parquet(emptied, tmp_path / "log.parquet")
    for log in (compact, spaced, tmp_path / "log.parquet"):
        assert replay([str(log)], Config()).report() == expected, log.name


def _written(rows: list[dict[str, Any]], path: Path) -> Path:
    write_jsonl_rows(rows, path)
    return path
