"""``--input-format ubi``: OpenSearch User Behavior Insights logs (``ubi_queries``, ``ubi_events``) as events.

The test data are written to the published UBI 1.3.0 schemas (tests/data/ubi) and checked against them. A UBI log
replays to the report of the same events converted by hand here (an independent conversion, not the production
one); Parquet, search-hit and bulk exports to the report of JSON Lines; bad records are counted with their reason
codes; and ``produce --input-format ubi`` gives a worker the replay's numbers.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jsonschema import Draft202012Validator, FormatChecker
from support import run_cli

from stream_eval.config import Config
from stream_eval.events.schema import Invalid
from stream_eval.events.ubi import UbiConverter, UbiLine, decoded, read_records

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = Path(__file__).resolve().parent / "data" / "ubi"
EXAMPLES = ROOT / "examples" / "ubi"
KINDS = "[kinds]\nadd_to_cart = 2\npurchase = 3\n"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
PLUS_TWO = timezone(timedelta(hours=2))


def _validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    action = schema["properties"].get("action_name")
    if action is not None:
        # The published schema's action_name is a oneOf of an enumeration of common names and of any string. The two
        # branches overlap, so a common name ("click") matches both and fails oneOf, which wants exactly one: read as
        # anyOf, what its description ("you can pass in whatever you want") says (tests/data/ubi/README.md).
        action["anyOf"] = action.pop("oneOf")
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=FormatChecker())


QUERY_SCHEMA = _validator("query.request.schema.json")
EVENT_SCHEMA = _validator("event.schema.json")


def assert_valid(queries: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
    for schema, records in ((QUERY_SCHEMA, queries), (EVENT_SCHEMA, events)):
        for record in records:
            errors = [error.message for error in schema.iter_errors(record)]
            assert not errors, (record, errors)


def jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def replayed(*args: str | Path) -> tuple[dict[str, Any], str]:
    """The JSON report of ``stream-eval replay ARGS`` and its stderr."""
    result = run_cli("replay", *args, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def ubi_replayed(queries: Path, events: Path, *args: str | Path) -> tuple[dict[str, Any], str]:
    return replayed("--input-format", "ubi", queries, events, *args)


# -- a UBI log written to the schemas ----------------------------------------------------------------------------

def _iso(moment: datetime, rng: random.Random) -> str:
    """A timestamp as UBI clients write them: UTC with Z or +00:00, or another offset."""
    style = rng.random()
    if style < 0.6:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    if style < 0.8:
        return moment.isoformat(timespec="milliseconds")
    return moment.astimezone(PLUS_TWO).isoformat(timespec="milliseconds")


def ubi_log(seed: int, n_queries: int = 160) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Queries and events of a shop's search with two arms: clients with sessions, queries typed in several ways,
    impressions and hovers (ignored), clicks with and without dwell time, add-to-cart and purchases, events without a
    session, late clicks, clicks given by ordinal only."""
    rng = random.Random(seed)
    topics = {name: [f"{name[:3].upper()}-{k:04d}" for k in rng.sample(range(10_000), 12)]
              for name in ("running shoes", "yoga mat", "coffee grinder", "desk lamp", "rain jacket")}
    clients = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(24)]
    sessions = {client: uuid.UUID(int=rng.getrandbits(128), version=4).hex for client in clients}
    queries: list[dict[str, Any]] = []
    events: list[tuple[datetime, dict[str, Any]]] = []
    moment = T0
    for n in range(n_queries):
        moment += timedelta(milliseconds=rng.randint(200, 20_000))
        client = rng.choice(clients)
        topic = rng.choice(list(topics))
        hits = rng.sample(topics[topic], rng.randint(3, 10))
        query_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        text = rng.choice([topic, topic.upper(), f"  {topic.title()} ", topic.replace(" ", "  ")])
        query: dict[str, Any] = {"query_id": query_id, "client_id": client, "user_query": text,
                                 "query_response_hit_ids": hits, "timestamp": _iso(moment, rng),
                                 "application": "shop-search", "object_id_field": "sku"}
        if n % 7:  # the rest: no experiment
            query["query_attributes"] = {"experiment": "ranker-v2", "page": 1,
                                         "arm": "treatment" if clients.index(client) % 2 else "control"}
        queries.append(query)
        with_session = rng.random() < 0.85

        def event(action: str, at: datetime, ordinal: int, item: str | None, session: bool = True,
                  **attributes: Any) -> None:
            record: dict[str, Any] = {"application": "shop-search", "action_name": action, "query_id": query_id,  # noqa: B023
                                      "client_id": client, "timestamp": _iso(at, rng), "message_type": "INFO",  # noqa: B023
                                      "event_attributes": {"position": {"ordinal": ordinal}, **attributes}}
            if item is not None:
                record["event_attributes"]["object"] = {"object_id": item, "object_id_field": "sku"}
            if session and with_session:  # noqa: B023
                record["session_id"] = sessions[client]  # noqa: B023
            events.append((at, record))

        at = moment + timedelta(milliseconds=rng.randint(100, 900))
        event("impression", at, 1, hits[0])
        for position, item in enumerate(hits, 1):
            if rng.random() < 0.25:
                at += timedelta(seconds=rng.randint(1, 40))
                if rng.random() < 0.3:
                    event("hover", at - timedelta(seconds=1), position, item)
                action = rng.choice(["click", "click", "click", "click_through", "add_to_cart", "purchase"])
                extra: dict[str, Any] = {"dwell_time": round(rng.uniform(0, 120), 2)} if rng.random() < 0.5 else {}
                event(action, at, position, None if rng.random() < 0.1 else item, **extra)
        if rng.random() < 0.05:  # a click long after: late (no session: the ranking is out by then)
            event("click", moment + timedelta(minutes=rng.randint(35, 50)), 1, hits[0], session=False)
    events.sort(key=lambda pair: pair[0])
    return queries, [record for _, record in events]


def hand_converted(queries: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of a UBI log as README's mapping table says, written independently of events/ubi.py."""
    kinds = {"click": "click", "click_through": "click", "add_to_cart": "add_to_cart", "purchase": "purchase"}
    session_of: dict[str, str] = {}
    for record in events:
        if "session_id" in record:
            session_of.setdefault(record["query_id"], record["session_id"])
    hits_of = {query["query_id"]: query["query_response_hit_ids"] for query in queries}
    out: list[tuple[float, int, dict[str, Any]]] = []
    for query in queries:
        ranking = {"type": "ranking", "request_id": query["query_id"],
                   "ts": datetime.fromisoformat(query["timestamp"]).timestamp(),
                   "items": query["query_response_hit_ids"],
                   "query_id": " ".join(query["user_query"].lower().split()),
                   "unit_id": query["client_id"],
                   "experiment": query.get("query_attributes", {}).get("experiment", "default"),
                   "arm": query.get("query_attributes", {}).get("arm", "default")}
        attributes = {key: value if isinstance(value, str) else json.dumps(value)
                      for key, value in query.get("query_attributes", {}).items()
                      if value not in ("", None) and not isinstance(value, dict | list)}
        if attributes:
            ranking["attributes"] = attributes
        if query["query_id"] in session_of:
            ranking["session_id"] = session_of[query["query_id"]]
        out.append((ranking["ts"], 0, ranking))
    for record in events:
        if record["action_name"] not in kinds:
            continue
        attributes = record["event_attributes"]
        item = attributes["object"]["object_id"] if "object" in attributes else \
            hits_of[record["query_id"]][attributes["position"]["ordinal"] - 1]
        feedback = {"type": "feedback", "request_id": record["query_id"], "item": item,
                    "kind": kinds[record["action_name"]], "ts": datetime.fromisoformat(record["timestamp"]).timestamp()}
        if "dwell_time" in attributes:
            feedback["dwell"] = attributes["dwell_time"]
        out.append((feedback["ts"], 1, feedback))
    out.sort(key=lambda entry: entry[:2])  # stable: ties in the order read
    return [event for _, _, event in out]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[dict[str, Any]], list[dict[str, Any]]]:
    queries, events = ubi_log(seed=11)
    assert_valid(queries, events)
    directory = tmp_path_factory.mktemp("ubi")
    paths = jsonl(directory / "ubi_queries.jsonl", queries), jsonl(directory / "ubi_events.jsonl", events)
    return *paths, queries, events


@pytest.fixture(scope="module")
def expected(log: tuple[Path, Path, Any, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The report of the hand-converted events."""
    directory = tmp_path_factory.mktemp("hand")
    path = jsonl(directory / "events.jsonl", hand_converted(log[2], log[3]))
    (directory / "kinds.toml").write_text(KINDS)
    report, _ = replayed(path, "--config", directory / "kinds.toml")
    return report


def table(records: list[dict[str, Any]]) -> pa.Table:
    """Records as a table with a column for every field any of them has (nested objects as structs)."""
    return pa.Table.from_struct_array(pa.array(records))


def without_ubi(report: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in report.items() if key != "ubi"}


# -- tests -------------------------------------------------------------------------------------------------------

def test_the_schemas_check_formats_and_reject_what_they_should() -> None:
    assert "date-time" in FormatChecker().checkers  # without it jsonschema would pass any timestamp
    assert not EVENT_SCHEMA.is_valid({"action_name": "click", "timestamp": "yesterday"})
    assert not EVENT_SCHEMA.is_valid({"action_name": "click", "timestamp": "2026-03-02T09:00:00Z",
                                      "event_attributes": {"object": {"object_id": "x"}}})  # no position
    assert EVENT_SCHEMA.is_valid({"action_name": "click", "timestamp": "2026-03-02T09:00:00Z"})
    assert not QUERY_SCHEMA.is_valid({"query_id": "q1"})  # user_query is required


def test_the_example_is_valid_ubi() -> None:
    assert_valid(read_jsonl(EXAMPLES / "ubi_queries.jsonl"), read_jsonl(EXAMPLES / "ubi_events.jsonl"))


def test_replay_of_ubi_equals_replay_of_the_events_converted_by_hand(
        log: tuple[Path, Path, Any, Any], expected: dict[str, Any], tmp_path: Path) -> None:
    report, stderr = ubi_replayed(log[0], log[1], "--per-request", tmp_path / "ubi.jsonl")
    assert without_ubi(report) == expected
    assert report["events"]["late"] > 0 and report["overall"]["sessions"] > 0 and report["ab"] and report["gsb"]
    assert report["events"]["invalid"] == 0 and report["ubi"]["invalid"] == {}
    events = log[3]
    ignored = [e["action_name"] for e in events if e["action_name"] in ("impression", "hover")]
    assert report["ubi"]["ignored_actions"] == {"impression": ignored.count("impression"),
                                                "hover": ignored.count("hover")}
    assert report["ubi"]["feedback"] == report["events"]["feedback"] == len(events) - len(ignored)
    assert "ubi: read 160 queries" in stderr
    # the per-request records carry the user's query, normalised, and the session of the query's events
    records = {r["request_id"]: r for r in read_jsonl(tmp_path / "ubi.jsonl")}
    first = log[2][0]
    assert records[first["query_id"]]["query_id"] == " ".join(first["user_query"].lower().split())
    sessions = {e["query_id"]: e["session_id"] for e in reversed(events) if "session_id" in e}
    # (a request without a session is a session of its own, named by its request id)
    assert {rid: r["session_id"] for rid, r in records.items() if r["session_id"] != rid} == sessions


def test_dwell_is_passed_on_where_the_event_has_it(log: tuple[Path, Path, Any, Any]) -> None:
    converter = UbiConverter(Config())
    lines = [json.loads(item.line) for item in converter.convert(read_records(str(log[0])), read_records(str(log[1])))
             if isinstance(item, UbiLine)]
    feedback = [line for line in lines if line["type"] == "feedback"]
    with_dwell = [e for e in log[3] if "dwell_time" in e["event_attributes"] and e["action_name"] not in (
        "impression", "hover")]
    assert sorted(line["dwell"] for line in feedback if "dwell" in line) == sorted(
        e["event_attributes"]["dwell_time"] for e in with_dwell)
    assert len(with_dwell) < len(feedback)


def test_parquet_exports_equal_json_lines(log: tuple[Path, Path, Any, Any], tmp_path: Path) -> None:
    reference, _ = ubi_replayed(log[0], log[1])
    queries, events = log[2], log[3]
    pq.write_table(table(queries), tmp_path / "queries.parquet", row_group_size=50)
    pq.write_table(table(events), tmp_path / "events.parquet", row_group_size=100)
    assert ubi_replayed(tmp_path / "queries.parquet", tmp_path / "events.parquet")[0] == reference
    # a timestamp column instead of text, and the events still in JSON Lines
    timed = table(queries)
    moments = [datetime.fromisoformat(q["timestamp"]) for q in queries]
    timed = timed.set_column(timed.schema.get_field_index("timestamp"), "timestamp",
                             pa.array(moments, pa.timestamp("ms", tz="UTC")))
    pq.write_table(timed, tmp_path / "timed.parquet")
    assert ubi_replayed(tmp_path / "timed.parquet", log[1])[0] == reference


def _flattened(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A record as a warehouse or ``pandas.json_normalize`` flattens it: nested objects' keys joined by dots."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if type(value) is dict:
            flat.update(_flattened(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def test_flattened_events_integer_query_ids_and_sat_kinds_of_ubi(log: tuple[Path, Path, Any, Any],
                                                                   tmp_path: Path) -> None:
    """Events flattened (keys ``event_attributes.object.object_id``, ``event_attributes.position.ordinal``, ...),
    in JSON Lines and Parquet, give the nested export's report (until 2026-12-02 every click of a flattened export
    was ``missing_object``); query ids written as integers in both exports are their text (they were
    ``missing_query_id``); and ``--sat-kinds purchase`` is taken on UBI input without a ``[kinds]`` table (it was
    refused: ``purchase`` was not a kind yet when the settings were checked)."""
    reference, _ = ubi_replayed(log[0], log[1])
    flat = [_flattened(event) for event in log[3]]
    assert any("event_attributes.object.object_id" in event for event in flat)
    assert ubi_replayed(log[0], jsonl(tmp_path / "flat.jsonl", flat))[0] == reference
    pq.write_table(table(flat), tmp_path / "flat.parquet")
    assert ubi_replayed(log[0], tmp_path / "flat.parquet")[0] == reference
    numbered = {query["query_id"]: 1000 + k for k, query in enumerate(log[2])}
    queries = [{**query, "query_id": numbered[query["query_id"]]} for query in log[2]]
    events = [{**event, "query_id": numbered.get(event["query_id"], event["query_id"])} for event in log[3]]
    as_numbers, _ = ubi_replayed(jsonl(tmp_path / "q.jsonl", queries), jsonl(tmp_path / "e.jsonl", events))
    assert as_numbers["overall"] == reference["overall"] and as_numbers["events"] == reference["events"]
    satisfied = ("--sat-kinds", "purchase", "--metrics", "SatClick")
    purchases, _ = ubi_replayed(log[0], log[1], *satisfied)
    (tmp_path / "kinds.toml").write_text(KINDS)  # the hand-converted events need [kinds]
    hand, _ = replayed(jsonl(tmp_path / "hand.jsonl", hand_converted(log[2], log[3])), "--config",
                       tmp_path / "kinds.toml", *satisfied)
    assert purchases["config"]["sat_kinds"] == ["purchase"]
    assert purchases["overall"] == hand["overall"] and 0 < purchases["overall"]["metrics"]["SatClick"] < 1


def test_segments_come_from_query_attributes(log: tuple[Path, Path, Any, Any], tmp_path: Path) -> None:
    """``segments = ["platform", "page"]`` finds ``query_attributes.platform`` (and the number ``page`` as its JSON
    text): the segment groups and A/B rows of the hand-converted JSON Lines, from UBI JSON Lines and Parquet, and
    from a flattened export (keys ``query_attributes.platform``)."""
    queries = [dict(query) for query in log[2]]
    for k, query in enumerate(queries):
        if "query_attributes" in query and k % 5:  # the rest: no platform (__missing__)
            query["query_attributes"] = {**query["query_attributes"], "platform": ("ios", "android", "web")[k % 3],
                                         "nested": {"no": "segment"}}
    (tmp_path / "seg.toml").write_text('segments = ["platform", "page"]\n' + KINDS)
    config = ("--config", tmp_path / "seg.toml")
    hand = jsonl(tmp_path / "hand.jsonl", hand_converted(queries, log[3]))
    expected, _ = replayed(hand, *config)
    assert {row["segment"]["value"] for row in expected["segment_ab"]} >= {"ios", "android", "web", "__missing__"}
    assert {s["segment"]["value"] for s in expected["segments"] if s["segment"]["field"] == "page"} >= {"1"}
    ubi_queries = jsonl(tmp_path / "queries.jsonl", queries)
    assert without_ubi(ubi_replayed(ubi_queries, log[1], *config)[0]) == expected
    pq.write_table(table(queries), tmp_path / "queries.parquet", row_group_size=50)  # query_attributes: a struct
    assert without_ubi(ubi_replayed(tmp_path / "queries.parquet", log[1], *config)[0]) == expected
    flattened = [{**{k: v for k, v in q.items() if k != "query_attributes"},
                  **{f"query_attributes.{k}": v for k, v in q.get("query_attributes", {}).items()}} for q in queries]
    flat_queries = jsonl(tmp_path / "flat.jsonl", flattened)
    assert without_ubi(ubi_replayed(flat_queries, log[1], *config)[0]) == expected


def test_search_hits_bulk_bodies_responses_and_epoch_milliseconds_equal_plain_records(
        log: tuple[Path, Path, Any, Any], tmp_path: Path) -> None:
    reference, _ = ubi_replayed(log[0], log[1])
    queries, events = log[2], log[3]
    hits = [{"_index": "ubi_queries", "_id": str(n), "_score": 1.0, "_source": q} for n, q in enumerate(queries)]
    jsonl(tmp_path / "hits.jsonl", hits)
    bulk = [line for n, e in enumerate(events) for line in ({"index": {"_index": "ubi_events", "_id": str(n)}}, e)]
    jsonl(tmp_path / "bulk.jsonl", bulk)
    assert ubi_replayed(tmp_path / "hits.jsonl", tmp_path / "bulk.jsonl")[0] == reference
    response = {"took": 3, "timed_out": False, "hits": {"total": {"value": len(hits), "relation": "eq"},
                                                        "max_score": 1.0, "hits": hits}}
    (tmp_path / "response.json").write_text(json.dumps(response, indent=2))
    assert ubi_replayed(tmp_path / "response.json", log[1])[0] == reference
    # the same response written with a hit per line: its first line is not "{" alone, and was read line by line
    compact = json.dumps({**response, "hits": {**response["hits"], "hits": []}}).replace('"hits": []}}', '"hits": [')
    (tmp_path / "per-line.json").write_text(compact + "\n" + ",\n".join(map(json.dumps, hits)) + "\n]}}\n")
    assert ubi_replayed(tmp_path / "per-line.json", log[1])[0] == reference
    (tmp_path / "array.json").write_text(json.dumps(queries, indent=1))  # an array, indented
    assert ubi_replayed(tmp_path / "array.json", log[1])[0] == reference
    (tmp_path / "arrays.jsonl").write_text(json.dumps(queries[:50]) + "\n" + json.dumps(queries[50:]) + "\n")
    assert ubi_replayed(tmp_path / "arrays.jsonl", log[1])[0] == reference
    (tmp_path / "queries.jsonl.gz").write_bytes(gzip.compress(log[0].read_bytes()))
    assert ubi_replayed(tmp_path / "queries.jsonl.gz", log[1])[0] == reference
    # epoch milliseconds, as the plugin wrote before UBI 1.0 (numbers, or text of digits)
    millis = [{**q, "timestamp": round(datetime.fromisoformat(q["timestamp"]).timestamp() * 1000)} for q in queries]
    for n, query in enumerate(millis[::3]):
        query["timestamp"] = str(query["timestamp"]) if n % 2 else query["timestamp"]
    assert ubi_replayed(jsonl(tmp_path / "millis.jsonl", millis), log[1])[0] == reference


def test_inputs_out_of_order_within_the_hold_give_the_same_report(log: tuple[Path, Path, Any, Any],
                                                                  tmp_path: Path) -> None:
    reference, _ = ubi_replayed(log[0], log[1])
    rng = random.Random(3)
    events = list(log[3])
    for k in range(0, len(events) - 8, 8):  # shuffled within runs of 8 (seconds to minutes apart)
        run = events[k : k + 8]
        rng.shuffle(run)
        events[k : k + 8] = run
    queries = list(log[2])
    queries[0::2], queries[1::2] = queries[1::2], queries[0::2]  # pairs swapped
    shuffled, _ = ubi_replayed(jsonl(tmp_path / "q.jsonl", queries), jsonl(tmp_path / "e.jsonl", events))
    assert shuffled == reference


def _bad_log(tmp_path: Path) -> tuple[Path, Path]:
    at = "2026-03-02T09:00:00.000Z"
    later = "2026-03-02T09:00:10.000Z"
    hits = ["A", "B", "C"]
    good = {"query_id": "q1", "user_query": "lamp", "client_id": "c1", "query_response_hit_ids": hits, "timestamp": at,
            "object_id_field": "sku"}
    queries = [
        good,
        {**good, "query_id": "q-none", "query_response_hit_ids": []},  # no hits: a zero-result ranking
        {key: value for key, value in good.items() if key != "query_response_hit_ids"} | {
            "query_id": "q-unlisted"},  # no list of hits: nothing to evaluate, left out
        {key: value for key, value in good.items() if key != "query_id"},  # missing_query_id
        {**good, "query_id": "q-bad-ts", "timestamp": "yesterday"},  # bad_ts
        {**good, "query_id": "q-naive-ts", "timestamp": "2026-03-02T09:00:00"},  # bad_ts: no offset
        {**good, "query_id": "q-bad-hits", "query_response_hit_ids": "A,B"},  # bad_hits
        {**good, "query_id": "q-twice", "query_response_hit_ids": ["A", "A"]},  # bad_items (the standard check)
        {**good, "query_id": "q-1999", "timestamp": "1999-12-31T23:00:00Z"},  # ts_out_of_range
    ]
    assert_valid([q for q in queries if "query_id" not in q or q["query_id"] not in (
        "q-bad-ts", "q-naive-ts", "q-bad-hits")], [])

    def click(**fields: Any) -> dict[str, Any]:
        position = fields.pop("ordinal", 2)
        attributes: dict[str, Any] = {"position": {"ordinal": position},
                                      "object": {"object_id": "B", "object_id_field": "sku"}}
        record: dict[str, Any] = {"action_name": "click", "query_id": "q1", "client_id": "c1", "session_id": "s1",
                                  "timestamp": later, "event_attributes": attributes}
        for key, value in fields.items():
            if key in ("object", "dwell_time"):
                attributes[key] = value
            else:
                record[key] = value
        return record

    events = [
        click(),  # fine: B at ordinal 2
        click(action_name="hover"),  # ignored
        click(object={"object_id": "Z", "object_id_field": "sku"}, ordinal=1),  # unknown_hit
        click(ordinal=3),  # ordinal_mismatch: C is third
        click(query_id=None),  # missing_query_id (null)
        click(timestamp="not a time"),  # bad_ts
        click(action_name="purchase", object={"object_id": "B", "object_id_field": "ean"}),  # id_field_mismatch
        click(dwell_time=-3),  # bad_dwell
        click(action_name=None),  # missing_action
        click(query_id="q-none"),  # of a query without hits: ignored
        click(object=None, ordinal=1),  # no object_id: A, by its ordinal
        click(query_id="q-never"),  # no such query: an orphan for the engine
    ]
    events = [{k: v for k, v in e.items() if v is not None} for e in events]
    for e in events:
        if e["event_attributes"].get("object") is None:
            e["event_attributes"].pop("object", None)
    assert_valid([], [events[k] for k in (0, 1, 2, 3, 4, 6, 9, 10, 11)])
    queries_path = tmp_path / "ubi_queries.jsonl"
    queries_path.write_text("".join(json.dumps(q) + "\n" for q in queries) + '{"query_id": "q-cut", "user_q\n')
    return queries_path, jsonl(tmp_path / "ubi_events.jsonl", events)


def test_bad_records_are_counted_with_reason_codes_and_never_stop_a_run(tmp_path: Path) -> None:
    queries, events = _bad_log(tmp_path)
    report, stderr = ubi_replayed(queries, events)
    assert report["ubi"]["invalid"] == {
        "ranking: missing_query_id": 1, "ranking: bad_ts": 2, "ranking: bad_hits": 1, "ranking: ts_out_of_range": 1,
        "ranking: bad_json": 1, "feedback: unknown_hit": 1, "feedback: ordinal_mismatch": 1,
        "feedback: missing_query_id": 1, "feedback: bad_ts": 1, "feedback: id_field_mismatch": 1,
        "feedback: bad_dwell": 1, "feedback: missing_action": 1}
    # the converted events are checked as any log's: a hit listed twice is bad_items, where the query is
    assert report["events"]["invalid"] == 13 + 1
    assert "feedback: unknown_hit x1" in stderr and "ranking: bad_items x1" in stderr
    rejected = {(e.where, e.code) for batch in decoded(UbiConverter(Config(kinds=(("purchase", 3.0),))).convert(
        read_records(str(queries)), read_records(str(events))), Config(kinds=(("purchase", 3.0),)))
        for e in batch if isinstance(e, Invalid)}
    assert {(f"{queries}:8", "bad_items"), (f"{queries}:10", "bad_json"), (f"{events}:3", "unknown_hit"),
            (f"{events}:4", "ordinal_mismatch")} <= rejected and len(rejected) == 14
    assert report["ubi"]["ignored_actions"] == {"hover": 1}
    assert report["ubi"]["queries_without_hits"] == 2 and report["ubi"]["zero_result_rankings"] == 1
    assert report["ubi"]["events_of_queries_without_hits"] == 1
    # q1 is evaluated with B clicked (the first event) and A (given by its ordinal); the click on q-never: orphan
    # (the query without hits is a zero-result ranking)
    assert report["events"]["ranking"] == 2 and report["events"]["feedback"] == 3 and report["events"]["orphan"] == 1
    assert report["overall"]["metrics"]["MRR"] == 1.0 and report["overall"]["metrics"]["P@10"] == pytest.approx(0.2)


def test_a_query_without_hits_is_a_zero_result_ranking(tmp_path: Path) -> None:
    """A query whose search found nothing was left out, so that ``ZeroResult`` was 0 on every UBI log and the
    reformulations through it were not seen. It is a ranking of an empty list, as in an event log: the report
    equals that of the same events written by hand; its events are left out, counted."""
    def at(seconds: float) -> str:
        return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")

    texts = {"q1": "shoes", "q2": "red shoes", "q3": "blue shoes", "q4": "socks"}
    hits = {"q1": ["A", "B", "C"], "q2": [], "q3": ["D", "E"], "q4": ["F"]}
    queries = [{"query_id": q, "client_id": "c1", "user_query": texts[q], "query_response_hit_ids": hits[q],
                "timestamp": at(10 * k), **({"session_id": "s1"} if q != "q4" else {})}
               for k, q in enumerate(texts)]
    clicks = [("q1", "B", 2, 3), ("q2", "X", 1, 13), ("q3", "D", 1, 23)]
    events = [{"action_name": "click", "query_id": q, "client_id": "c1", "timestamp": at(t), "session_id": "s1",
               "event_attributes": {"object": {"object_id": item}, "position": {"ordinal": ordinal}}}
              for q, item, ordinal, t in clicks]
    assert_valid(queries, events)
    by_hand = [{"type": "ranking", "request_id": q["query_id"],
                "ts": datetime.fromisoformat(q["timestamp"]).timestamp(), "items": q["query_response_hit_ids"],
                "query_id": q["user_query"], "unit_id": "c1",
                "experiment": "default", "arm": "default", **({"session_id": "s1"} if "session_id" in q else {})}
               for q in queries]
    by_hand += [{"type": "feedback", "request_id": q, "item": item, "kind": "click",
                 "ts": datetime.fromisoformat(at(t)).timestamp()} for q, item, _, t in clicks if q != "q2"]
    by_hand.sort(key=lambda event: event["ts"])
    metrics = ("--metrics", "default,behaviour")
    report, stderr = ubi_replayed(jsonl(tmp_path / "q.jsonl", queries), jsonl(tmp_path / "e.jsonl", events), *metrics)
    expected, _ = replayed(jsonl(tmp_path / "hand.jsonl", by_hand), *metrics)
    del report["config"]["kinds"], expected["config"]["kinds"]  # (UBI's action names are kinds of their own)
    assert without_ubi(report) == expected
    assert report["overall"]["requests"] == 4 and report["overall"]["metrics"]["ZeroResult"] == 0.25
    assert report["overall"]["metrics"]["Reformulation"] == 0.5  # q1 -> q2 -> q3 within the gap, unsatisfied
    assert report["ubi"]["queries_without_hits"] == report["ubi"]["zero_result_rankings"] == 1
    assert report["ubi"]["events_of_queries_without_hits"] == 1
    assert "1 queries without hits (1 zero-result rankings, 0 without a list of hits left out; their 1 events" in stderr


def test_ordinal_checks_and_settings_from_the_config(tmp_path: Path) -> None:
    queries, events = _bad_log(tmp_path)
    config = tmp_path / "ubi.toml"
    config.write_text('[kinds]\npurchase = 4\n[ubi]\ncheck_ordinal = false\nexperiment_field = "application"\n'
                      'arm_field = "client_id"\nnormalise_query = false\n[ubi.actions]\nclick = "click"\n'
                      'hover = "click"\n')
    report, _ = ubi_replayed(queries, events, "--config", config, "--per-request", tmp_path / "pr.jsonl")
    invalid = report["ubi"]["invalid"]
    assert "feedback: ordinal_mismatch" not in invalid and "feedback: id_field_mismatch" not in invalid
    assert report["ubi"]["ignored_actions"] == {"purchase": 1}
    assert report["config"]["kinds"] == {"purchase": 4.0}
    record = read_jsonl(tmp_path / "pr.jsonl")[0]
    assert (record["experiment"], record["arm"], record["query_id"]) == ("default", "c1", "lamp")
    config.write_text('[ubi.actions]\nwatch = "watch"\n')
    result = run_cli("replay", "--input-format", "ubi", queries, events, "--config", config)
    assert result.returncode == 2 and "the kind 'watch' has no grade" in result.stderr
    config.write_text("[ubi]\ncolour = 1\n")
    result = run_cli("replay", "--input-format", "ubi", queries, events, "--config", config)
    assert result.returncode == 2 and "unknown setting(s) colour" in result.stderr
    result = run_cli("replay", "--input-format", "ubi", queries)
    assert result.returncode == 2 and "give two inputs" in result.stderr


def test_unreadable_inputs_are_clear_errors(log: tuple[Path, Path, Any, Any], tmp_path: Path) -> None:
    result = run_cli("replay", "--input-format", "ubi", tmp_path / "none.jsonl", log[1])
    assert result.returncode == 2 and f"{tmp_path / 'none.jsonl'}: no such file" in result.stderr
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    result = run_cli("replay", "--input-format", "ubi", tmp_path / "broken.parquet", log[1], "--format", "json")
    assert result.returncode == 1 and f"error: {tmp_path / 'broken.parquet'}: " in result.stderr
    assert json.loads(result.stdout)["ubi"]["events"] == len(log[3])  # the other input was read


def test_cli_replays_the_example_and_prints_mrr_and_ndcg() -> None:
    result = run_cli("replay", "--input-format", "ubi", EXAMPLES / "ubi_queries.jsonl",
                     EXAMPLES / "ubi_events.jsonl", "--format", "table")
    assert result.returncode == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if line.startswith("experiment"))
    assert "MRR" in header and "nDCG@10" in header
    assert "ranker-v2" in result.stdout and "treatment" in result.stdout
    report, stderr = replayed("--input-format", "ubi", EXAMPLES / "ubi_queries.jsonl",
                              EXAMPLES / "ubi_events.jsonl", "--config", EXAMPLES / "ubi.toml")
    assert report["events"] == {"ranking": 16, "feedback": 35, "judgment": 0, "invalid": 0, "late": 0,
                                "duplicate": 0, "orphan": 0}
    metrics = report["overall"]["metrics"]
    assert 0 < metrics["MRR"] <= 1 and 0 < metrics["nDCG@10"] <= 1
    assert "ignored 29 events" in stderr


def test_produce_gives_a_worker_the_replay_numbers(broker: str, tmp_path: Path) -> None:
    from stream_eval.stream.broker import free_port, stop_process
    from stream_eval.stream.demo import scrape

    config = EXAMPLES / "ubi.toml"
    files = (EXAMPLES / "ubi_queries.jsonl", EXAMPLES / "ubi_events.jsonl")
    expected, _ = replayed("--input-format", "ubi", *files, "--config", config)
    prefix = f"ubi{uuid.uuid4().hex[:8]}."
    port = free_port()
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "stream_eval.cli", "worker", "--broker", broker,
                                   "--topic-prefix", prefix, "--group", "ubi", "--metrics-port", str(port),
                                   "--config", str(config)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/metrics"

    def total(name: str, **labels: str) -> float:
        try:
            samples = scrape(url).get(name, [])
        except OSError:
            return -1.0
        return sum(v for found, v in samples if all(found.get(k) == w for k, w in labels.items()))

    try:
        sent = subprocess.run([sys.executable, "-m", "stream_eval.cli", "produce", "--input-format", "ubi",
                               *map(str, files), "--broker", broker, "--topic-prefix", prefix, "--config", str(config)],
                              capture_output=True, text=True, timeout=120)
        assert sent.returncode == 0, sent.stderr
        assert "sent 51 events" in sent.stderr and "ignored 29 events" in sent.stderr
        requests = expected["overall"]["requests"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and total("stream_eval_requests_total") < requests:
            assert worker.poll() is None, log.read_text()
            time.sleep(0.5)
        assert total("stream_eval_requests_total") == requests
        for metric, mean in (("RR", "MRR"), ("nDCG@10", "nDCG@10")):
            value = total("stream_eval_metric_sum_total", metric=metric) / total("stream_eval_metric_count_total",
                                                                                 metric=metric)
            assert value == pytest.approx(expected["overall"]["metrics"][mean], rel=1e-12)
        invalid = total("stream_eval_events_total", status="invalid")
        assert invalid == 0
    finally:
        code = stop_process(worker, grace=30)
    assert code == 0, log.read_text()


def _merged(queries: Path, events: Path) -> list[tuple[int, bytes, bytes | None]]:
    """The records of two UBI exports as a live application sends them: in timestamp order, each as (0 for the queries
    topic and 1 for the events topic, the record, its key: ``query_id``, as a UBI producer must key them)."""
    records = []
    for k, path in enumerate((queries, events)):
        for line in path.read_bytes().splitlines():
            record = json.loads(line)
            key = record.get("query_id")
            records.append((datetime.fromisoformat(record["timestamp"]).timestamp(), k, line,
                            None if key is None else key.encode()))
    records.sort(key=lambda record: record[:2])
    return [(k, line, key) for _, k, line, key in records]


async def _produce_ubi(broker: str, records: list[tuple[int, bytes, bytes | None]], topics: Any, partitions: int,
                       end: bool) -> None:
    """``records`` to the UBI topics (the rankings and feedback topics of ``topics``), one a message, with Kafka's
    default partitioner; with ``end``, then an end watermark to every partition of both."""
    from aiokafka import AIOKafkaProducer

    from stream_eval.stream.kafka import ensure_topics
    from stream_eval.stream.produce import END_WATERMARK

    names = (topics.rankings, topics.feedback)
    await ensure_topics([broker], topics.inputs, partitions)
    producer = AIOKafkaProducer(bootstrap_servers=broker)
    await producer.start()
    try:
        for k, line, key in records:
            await producer.send(names[k], line, key=key)
        for topic in names if end else ():
            for partition in range(partitions):
                await producer.send(topic, END_WATERMARK, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


@pytest.mark.parametrize("source", ["example", "generated"])
def test_the_worker_reading_the_ubi_topics_gives_the_replay_numbers(broker: str, tmp_path: Path,
                                                                     log: tuple[Path, Path, Any, Any],
                                                                     source: str) -> None:
    """``worker --input-format ubi``: the records of ``ubi_queries`` and ``ubi_events`` converted in the worker give
    the totals, A/B, sessions and request-metrics records of ``replay --input-format ubi`` of the same exports,
    sent in two halves (the example; and the generated log with a hold of 2 minutes, so that records are released
    while the worker reads, each query with the session its events, read later, name)."""
    import asyncio

    from support import approx, read_topic
    from test_stream import PARTITIONS, Records, _done, _running, _stop, _until

    from stream_eval.commands import _replay_ubi
    from stream_eval.config import load_config
    from stream_eval.events.ubi import ubi_config, ubi_settings
    from stream_eval.stream.settings import WorkerSettings
    from stream_eval.stream.worker import StreamWorker

    if source == "example":
        files, config_path = (EXAMPLES / "ubi_queries.jsonl", EXAMPLES / "ubi_events.jsonl"), EXAMPLES / "ubi.toml"
    else:
        files, config_path = (log[0], log[1]), tmp_path / "ubi.toml"
        config_path.write_text(KINDS + '[ubi]\nhold = "2m"\n')
    settings = ubi_settings(str(config_path))
    config = load_config(str(config_path))
    records = Records()
    expected, counts = _replay_ubi([str(path) for path in files], ubi_config(config, settings), settings, records,
                                   None, None, None)
    prefix = f"ubiworker{uuid.uuid4().hex[:8]}."
    worker_settings = WorkerSettings([broker], prefix=prefix, group=f"ubi-{source}", partitions=PARTITIONS,
                                     input_format="ubi", ubi=settings)
    assert (worker_settings.topics.rankings, worker_settings.topics.feedback) == (f"{prefix}ubi_queries",
                                                                                 f"{prefix}ubi_events")

    merged = _merged(*files)
    half = len(merged) // 2

    async def main() -> None:
        worker = StreamWorker(worker_settings, config)
        running = await _running(worker)
        await _produce_ubi(broker, merged[:half], worker_settings.topics, PARTITIONS, end=False)
        await _until(lambda: worker.events_seen >= half, 120, "the worker to read the first half")
        if source == "generated":  # held 2 minutes of event time, not to the end: the first rankings are in
            await _until(lambda: worker.totals().counts.summary()["ranking"] > 0, 30, "the first rankings")
        await _produce_ubi(broker, merged[half:], worker_settings.topics, PARTITIONS, end=True)
        await _until(lambda: _done(expected, worker), 120, "the end of every partition, regrouped sessions included")
        report, want = worker.totals().report(), expected.report()
        await _stop(running)
        assert want["overall"]["requests"] > 0 and want["overall"]["sessions"] > 0 and want["ab"]
        for section in ("events", "overall", "groups", "gsb", "ab"):
            assert report[section] == approx(want[section]), section
        assert report["ab"] == want["ab"] and report["srm"] == want["srm"]
        found = await read_topic(broker, worker_settings.topics.request_metrics, len(records.by_id))
        by_id = {r.key.decode(): json.loads(r.value) for r in found}
        assert len(found) == len(by_id) == len(records.by_id)
        assert by_id == records.by_id
        assert worker.ubi is not None and worker.ubi.counts.summary() == counts.summary()

    asyncio.run(main())


def test_the_worker_holds_ubi_records_and_passes_each_topic_on_in_offset_order() -> None:
    """stream/ubi_topics.py on its own: a query waits ``hold`` of the partition's event time (the smaller of the two
    topics') and then takes the session its event, read meanwhile, names; what is passed on is a prefix of each
    topic in offset order (an invalid record at its place, with its message's bytes); a message delivered again is
    read once; an end watermark releases everything; a new task of the partition starts afresh."""
    from types import SimpleNamespace

    from stream_eval.events.ubi import UbiSettings
    from stream_eval.stream.ubi_topics import UbiTopics

    def message(offset: int, record: dict[str, Any] | bytes) -> SimpleNamespace:
        value = record if isinstance(record, bytes) else json.dumps(record).encode()
        return SimpleNamespace(offset=offset, value=value, timestamp=0)

    def query(n: int, at: float) -> dict[str, Any]:
        return {"query_id": f"q{n}", "client_id": "c", "user_query": "Yoga  Mat", "timestamp": int(at * 1000),
                "query_response_hit_ids": ["a", "b", "c"]}

    def event(n: int, at: float, action: str = "click", item: str = "b") -> dict[str, Any]:
        return {"action_name": action, "query_id": f"q{n}", "session_id": f"s{n}", "timestamp": int(at * 1000),
                "event_attributes": {"object": {"object_id": item}, "position": {"ordinal": 2}}}

    t0, now = 1_770_000_000.0, [0.0]
    ubi = UbiTopics(Config(), UbiSettings(hold=60.0), clock=lambda: now[0])
    task = object()

    def read(kind: str, *messages: SimpleNamespace) -> list[tuple[str, list[int], list[Any]]]:
        return ubi.read(task, 3, kind, "ubi_" + kind, list(messages))

    assert read("ranking", message(0, query(1, t0)), message(1, b"{not json"), message(2, query(2, t0 + 65))) == []
    # the events topic at t0 + 95: q1 (t0) is 60 s behind both topics, and its invalid neighbour goes with it
    released = read("feedback", message(0, event(1, t0 + 5, "impression")), message(1, event(1, t0 + 30)),
                    message(2, event(2, t0 + 95, "hover")))
    assert [(kind, offsets) for kind, offsets, _ in released] == [("ranking", [0, 1])]
    ranking, invalid = released[0][2]
    assert (ranking.request_id, ranking.session_id, ranking.query_id) == ("q1", "s1", "yoga mat")
    assert (invalid.code, invalid.where, invalid.raw) == ("bad_json", "ubi_ranking/3@1", b"{not json")
    assert read("feedback", message(1, event(1, t0 + 30))) == []  # delivered again: read once
    # the queries topic at t0 + 100: the click of q1 (t0 + 30) is due; q2 (t0 + 65) is not yet
    released = read("ranking", message(3, query(3, t0 + 100)))
    assert [(kind, offsets) for kind, offsets, _ in released] == [("feedback", [1])]
    assert (released[0][2][0].request_id, released[0][2][0].item) == ("q1", "b")
    end = b'{"type":"watermark","end":true}'
    assert read("ranking", message(4, end)) == []
    released = read("feedback", message(3, event(3, t0 + 101, item="z")), message(4, end))
    assert [(kind, offsets) for kind, offsets, _ in released] == [("ranking", [2, 3, 4]), ("feedback", [3, 4])]
    assert [type(e).__name__ for e in released[0][2]] == ["CompactRanking", "CompactRanking", "Watermark"]
    assert [(type(e).__name__, getattr(e, "code", None)) for e in released[1][2]] == [
        ("Invalid", "unknown_hit"), ("Watermark", None)]  # z is not among q3's hits
    assert ubi.counts.summary()["ignored_actions"] == {"impression": 1, "hover": 1}
    assert ubi.release({3: task}) == [] and ubi.release({3: object()}) == [] and not ubi.partitions
    # a topic silent for idle_timeout (30 s) holds the other back no more
    assert ubi.read(task, 5, "ranking", "q", [message(0, query(7, t0))]) == []
    now[0] = 40.0
    released = ubi.read(task, 5, "ranking", "q", [message(1, query(8, t0 + 100))])
    assert [(kind, offsets) for kind, offsets, _ in released] == [("ranking", [0])]


def test_worker_cli_takes_the_ubi_topics_and_the_ubi_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import stream_eval.stream.app as app
    from stream_eval.cli import main

    config_path = tmp_path / "ubi.toml"
    config_path.write_text('[ubi]\narm_field = "application"\n')
    started: list[Any] = []
    monkeypatch.setattr(app, "run_worker", lambda settings, config, *args, **kwargs: started.append(settings) or 0)
    assert main(["worker", "--input-format", "ubi", "--topic-prefix", "shop.", "--ubi-events-topic", "events-v1",
                 "--config", str(config_path)]) == 0
    settings = started[0]
    assert (settings.input_format, settings.ubi.arm_field) == ("ubi", "application")
    assert settings.topics.inputs == ("shop.ubi_queries", "shop.events-v1", "shop.judgments")
    assert main(["worker"]) == 0 and started[1].input_format == "events"
    assert started[1].topics.inputs == ("rankings", "feedback", "judgments")


def test_inputs_given_in_the_wrong_order_get_a_hint() -> None:
    """The events' export first and the queries' second: no ranking, every record rejected for its missing
    action_name; the terminal line says the inputs look swapped (in the right order, it does not)."""
    queries, events = EXAMPLES / "ubi_queries.jsonl", EXAMPLES / "ubi_events.jsonl"
    swapped = run_cli("replay", "--input-format", "ubi", events, queries, "-o", os.devnull, "--no-progress")
    assert swapped.returncode == 0 and "are the two inputs swapped?" in swapped.stderr
    right = run_cli("replay", "--input-format", "ubi", queries, events, "-o", os.devnull, "--no-progress")
    assert right.returncode == 0 and "swapped" not in right.stderr


def test_exports_in_descending_time_order_get_a_hint(log: tuple[Path, Path, Any, Any], tmp_path: Path) -> None:
    """Exports sorted by timestamp descending (a ``_search`` sorted newest first): queries and events meet late or
    not at all, and the report was silently wrong. The terminal line says which export is in descending order;
    in ascending order it does not."""
    newest_first = jsonl(tmp_path / "q.jsonl", sorted(log[2], key=lambda q: datetime.fromisoformat(q["timestamp"]),
                                                      reverse=True))
    done = run_cli("replay", "--input-format", "ubi", newest_first, log[1], "-o", os.devnull, "--no-progress")
    assert done.returncode == 0 and "the ubi_queries export is mostly in descending time order" in done.stderr
    assert "ubi_events export" not in done.stderr
    right = run_cli("replay", "--input-format", "ubi", log[0], log[1], "-o", os.devnull, "--no-progress")
    assert right.returncode == 0 and "descending" not in right.stderr


def test_epoch_seconds_get_a_hint(tmp_path: Path) -> None:
    """UBI numbers are epoch milliseconds: epoch seconds are out of range, and the reason now says what they look
    like (a new user's export of seconds gave only ``ts_out_of_range``)."""
    queries = [{"query_id": "q1", "user_query": "a", "timestamp": 1772442006, "query_response_hit_ids": ["a", "b"]}]
    events = [{"action_name": "click", "query_id": "q1", "timestamp": "1772442010",
               "event_attributes": {"object": {"object_id": "a"}}}]
    result = run_cli("replay", "--input-format", "ubi", jsonl(tmp_path / "q.jsonl", queries),
                     jsonl(tmp_path / "e.jsonl", events), "-o", os.devnull, "--no-progress")
    assert result.returncode == 0 and result.stderr.count("epoch seconds? a number is read as epoch milliseconds") == 2
