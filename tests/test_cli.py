"""``stream-eval`` end to end, in subprocesses: docs/contract.md §4 (replay, its report, its options) on small logs."""

from __future__ import annotations

import gzip
import json
import math
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from support import clean_env, run_cli

from stream_eval.engine.replay import CHUNK_BYTES

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z


def ev(**fields: Any) -> str:
    return json.dumps(fields)


def ranking(rid: str, dt: float, items: list[str], **extra: Any) -> str:
    return ev(type="ranking", request_id=rid, ts=T0 + dt, items=items, experiment="e", **extra)


def click(rid: str, item: str, dt: float, **extra: Any) -> str:
    return ev(type="feedback", request_id=rid, item=item, ts=T0 + dt, **extra)


def label(rid: str, item: str, grade: float, dt: float) -> str:
    return ev(type="feedback", request_id=rid, item=item, kind="label", grade=grade, ts=T0 + dt)


# A log in event-time order: 5 requests (e/A: r1 r2 in session s1; e/B: r3 in s2, r4 in s3 without feedback;
# e/il: r5 interleaved), a duplicate click, an orphan click, a late click, a judgment, 4 bad lines and blanks.
GOOD_AND_BAD: list[tuple[str, bool]] = [
    (ranking("r1", 0, ["a", "b", "c", "d"], arm="A", session_id="s1", query_id="q1",
             scores=[0.9, 0.8, 0.7, 0.6]), True),
    (click("r1", "b", 3), True),
    ("this is not json", False),
    (click("r1", "b", 4), True),  # duplicate (a double click)
    (label("r1", "c", 3, 20), True),  # 20 s after serve: late only with a 10 s window
    (ranking("r2", 30, ["a", "e", "f"], arm="A", session_id="s1", query_id="q2"), True),
    (click("r2", "a", 32), True),
    (ev(type="ranking", request_id="bad", ts=T0 + 40, items=["a", "a"]), False),  # an item twice
    (ranking("r3", 50, ["x", "y", "z"], arm="B", session_id="s2", query_id="q1"), True),
    (label("r3", "y", 2, 55), True),
    (label("r3", "w", 3, 58), True),  # judged, not shown
    ("", None),
    (ranking("r4", 60, ["p", "q"], arm="B", session_id="s3", query_id="q4"), True),
    (click("rX", "a", 75), True),  # orphan: rX never ranked
    (ev(type="feedback", request_id="r4", item="p", kind="label", grade=-1, ts=T0 + 76), False),
    (ranking("r5", 80, ["m", "n", "o"], arm="il", teams=["A", "B", "A"]), True),
    (click("r5", "n", 85), True),
    ("   ", None),
    (ev(type="bogus", request_id="r1", ts=T0 + 90), False),
    (ev(type="judgment", experiment="e", query_id="q1", verdict="good", ts=T0 + 110), True),
    (click("r1", "d", 2000), True),  # late: 2000 s > 30 min after serve
]
BAD_LINE_NUMBERS = [k for k, (_, good) in enumerate(GOOD_AND_BAD, 1) if good is False]
EXPECTED_EVENTS = {"ranking": 5, "feedback": 9, "judgment": 1, "invalid": 4, "late": 1, "duplicate": 1,
                   "orphan": 1}
TOP_KEYS = {"config", "events", "overall", "groups", "gsb", "ab", "srm", "overflow", "experiments"}
SRM_KEYS = {"experiment", "units", "expected", "chi2", "p_value", "sequential_p_value", "mismatch", "unit_conflicts"}
EVENT_KEYS = {"ranking", "feedback", "judgment", "invalid", "late", "duplicate", "orphan"}
SECTION_KEYS = {"requests", "empty", "sessions", "single_class_sessions", "metrics"}
GROUP_KEYS = {"experiment", "arm"} | SECTION_KEYS
GSB_KEYS = {"experiment", "treatment", "source", "good", "same", "bad", "score", "p_value", "cs_lower", "cs_upper",
            "decision"}
AB_KEYS = {"experiment", "control", "treatment", "metric", "delta", "ci_lower", "ci_upper", "n_control",
           "n_treatment", "units_control", "units_treatment", "cs_lower", "cs_upper", "p_value", "decision", "lift",
           "lift_ci_lower", "lift_ci_upper", "lift_cs_lower", "lift_cs_upper", "guardrail", "cuped"}
PER_REQUEST_KEYS = {"request_id", "experiment", "arm", "query_id", "session_id", "metrics"}


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("logs") / "log.jsonl", [text for text, _ in GOOD_AND_BAD])


@pytest.fixture(scope="module")
def clean_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("logs") / "clean.jsonl", [text for text, good in GOOD_AND_BAD if good])


@pytest.fixture(scope="module")
def default_report(log: Path) -> dict[str, Any]:
    """The report of ``log`` with default settings (computed once; tests must not modify it)."""
    return report(log)


@pytest.fixture(scope="module")
def default_rows(log: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The ``--per-request`` records of ``log`` with default settings, by request_id."""
    return per_request(tmp_path_factory.mktemp("rows"), log)


def cli(*args: str | Path, stdin: bytes | None = None, env: dict[str, str] | None = None,
        cwd: Path | None = None, script: bool = False) -> subprocess.CompletedProcess[bytes]:
    """``stream-eval ARGS`` without the caller's ``STREAM_EVAL_*`` variables (``env``: the ones to set): in this
    process (``support.run_cli``), or with ``cwd`` or ``script`` (the console script) in a process of its own."""
    if cwd is None and not script:
        done = run_cli(*args, stdin=stdin or b"", env=env)
        return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.encode(), done.stderr.encode())
    command = [_script()] if script else [sys.executable, "-m", "stream_eval.cli"]
    return subprocess.run(
        [*command, *map(str, args)], input=stdin if stdin is not None else b"", capture_output=True,
        env=clean_env(**(env or {})), cwd=cwd, timeout=60,
    )


def _script() -> str:
    candidate = Path(sysconfig.get_path("scripts")) / "stream-eval"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("stream-eval")
    assert found, "the stream-eval console script is not installed"
    return found


def report(*args: str | Path, **kwargs: Any) -> dict[str, Any]:
    result = cli("replay", *args, "--format", "json", **kwargs)
    assert result.returncode == 0, result.stderr.decode()
    assert b"Traceback" not in result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def metrics(rep: dict[str, Any]) -> dict[str, Any]:
    return rep["overall"]["metrics"]  # type: ignore[no-any-return]


def group(rep: dict[str, Any], arm: str) -> dict[str, Any]:
    [found] = [g for g in rep["groups"] if g["arm"] == arm]
    return found  # type: ignore[no-any-return]


def without_invalid(rep: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(rep))
    del out["events"]["invalid"]
    return out  # type: ignore[no-any-return]


def per_request(tmp_path: Path, log: Path, *args: str) -> dict[str, dict[str, Any]]:
    out = tmp_path / "per-request.jsonl"
    report(log, "--per-request", out, *args)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_id = {row["request_id"]: row for row in rows}
    assert len(by_id) == len(rows), "a request was written twice"
    return by_id


# -- the report -----------------------------------------------------------------------------------------------


def test_replay_report_shape_and_counts(default_report: dict[str, Any]) -> None:
    rep = default_report
    assert set(rep) == TOP_KEYS
    assert set(rep["events"]) == EVENT_KEYS
    assert rep["events"] == EXPECTED_EVENTS
    assert set(rep["overall"]) == SECTION_KEYS
    assert rep["overall"]["requests"] == 5 and rep["overall"]["empty"] == 1
    assert rep["overall"]["sessions"] == 3  # s1, s2 and r5's own; s3 has no positive
    assert rep["overall"]["single_class_sessions"] == 1  # s3
    assert {"MRR", "MAP", "P@10", "R@10", "nDCG@10", "ERR@10", "GAUC"} <= set(metrics(rep))
    assert [(g["experiment"], g["arm"]) for g in rep["groups"]] == [("e", "A"), ("e", "B"), ("e", "il")]
    for g in rep["groups"]:
        assert set(g) == GROUP_KEYS
        assert set(g["metrics"]) == set(metrics(rep))
    assert [g["requests"] for g in rep["groups"]] == [2, 2, 1]
    assert group(rep, "B")["empty"] == 1
    assert rep["gsb"], "a judgment and an interleaved request were logged"
    for row in rep["gsb"]:
        assert set(row) == GSB_KEYS
    # judgment: one good; interleaving: r5's click is on a B item; metric: q1 served by both arms, nDCG@10 of
    # B's r3 (0.21) is below A's r1 (0.54)
    assert [(g["experiment"], g["source"], g["good"], g["same"], g["bad"], g["score"]) for g in rep["gsb"]] == [
        ("e", "interleaving", 1, 0, 0, 1.0), ("e", "judgment", 1, 0, 0, 1.0), ("e", "metric", 0, 0, 1, -1.0)]
    assert rep["ab"]
    for row in rep["ab"]:
        assert set(row) == AB_KEYS
        assert (row["experiment"], row["control"], row["treatment"]) == ("e", "A", "B")
    assert {row["metric"] for row in rep["ab"]} >= {"MRR", "nDCG@10"}
    [mrr] = [row for row in rep["ab"] if row["metric"] == "MRR"]
    assert math.isclose(mrr["delta"], 0.25 - 0.75) and (mrr["n_control"], mrr["n_treatment"]) == (2, 2)
    # the unit is the session (no unit_id): A's r1 and r2 share s1; the interleaved r5 is no arm of the split.
    # One unit in control: no variance, so no interval and no decision.
    assert (mrr["units_control"], mrr["units_treatment"]) == (1, 2)
    assert mrr["decision"] == "inconclusive" and mrr["cs_lower"] is None and mrr["p_value"] is None
    [srm] = rep["srm"]
    assert set(srm) == SRM_KEYS
    assert (srm["experiment"], srm["units"], srm["expected"]) == ("e", {"A": 1, "B": 2}, {"A": 0.5, "B": 0.5})
    assert math.isclose(srm["chi2"], 2 * 0.5**2 / 1.5) and srm["mismatch"] is False
    assert set(rep["config"]) >= {"cutoffs", "gain", "max_grade", "rel_threshold", "empty", "gauc_weight",
                                  "attribution_window"}
    # RR: r1 b@2, r2 a@1, r3 y@2, r4 none, r5 n@2
    assert math.isclose(metrics(rep)["MRR"], (0.5 + 1 + 0.5 + 0 + 0.5) / 5)
    assert math.isclose(group(rep, "A")["metrics"]["MRR"], 0.75)


@pytest.mark.slow
def test_bad_lines_are_counted_reported_and_change_no_number(log: Path, clean_log: Path) -> None:
    result = cli("replay", log, "--format", "json")
    assert result.returncode == 0
    stderr = result.stderr.decode()
    assert "Traceback" not in stderr
    for number in BAD_LINE_NUMBERS:
        assert f"{log}:{number}" in stderr, stderr
    assert "malformed" in stderr.lower()
    assert "items" in stderr and "grade" in stderr and "bogus" in stderr
    rep = json.loads(result.stdout)
    assert rep["events"] == EXPECTED_EVENTS
    clean = report(clean_log)
    assert clean["events"]["invalid"] == 0
    assert without_invalid(rep) == without_invalid(clean)


def test_table_format(log: Path) -> None:
    result = cli("replay", log, "--format", "table")
    assert result.returncode == 0
    text = result.stdout.decode()
    assert text.startswith("events:")
    assert "invalid 4" in text and "late 1" in text and "orphan 1" in text
    assert "MRR" in text and "nDCG@10" in text and "(all)" in text
    assert "0.5000" in text  # overall MRR
    assert "GSB" in text and "judgment" in text
    # the A/B decisions as the JSON report has them: sequence, p, decision, units; and the sample ratio
    assert "95% confidence sequence" in text and "inconclusive" in text and "1/2" in text  # units c/t
    assert "Sample ratio" in text and "A 1 B 2" in text and "ok" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


@pytest.mark.slow
def test_default_format_off_a_terminal_is_json(log: Path) -> None:
    result = cli("replay", log)
    assert result.returncode == 0
    assert json.loads(result.stdout)["events"] == EXPECTED_EVENTS


def test_console_script(log: Path) -> None:
    result = cli("replay", log, "--format", "json", script=True)
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["events"] == EXPECTED_EVENTS
    assert cli("--help", script=True).returncode == 0


@pytest.mark.slow
def test_stdin(log: Path, default_report: dict[str, Any]) -> None:
    result = cli("replay", "-", "--format", "json", stdin=log.read_bytes())
    assert result.returncode == 0
    assert json.loads(result.stdout) == default_report
    assert f"stdin:{BAD_LINE_NUMBERS[0]}" in result.stderr.decode()


@pytest.mark.slow
def test_gzip_input_equals_plain(tmp_path: Path, log: Path, default_report: dict[str, Any]) -> None:
    packed = tmp_path / "log.jsonl.gz"
    packed.write_bytes(gzip.compress(log.read_bytes()))
    assert report(packed) == default_report


@pytest.mark.slow
def test_gzip_on_stdin_equals_plain(log: Path, default_report: dict[str, Any]) -> None:
    result = cli("replay", "-", "--format", "json", stdin=gzip.compress(log.read_bytes()))
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout) == default_report


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["cut", "corrupt"])
def test_damaged_gzip_reports_what_was_read_and_fails(tmp_path: Path, damage: str) -> None:
    """A gzip file cut short (a log still being copied) or corrupt in the middle: the events before the damage are
    evaluated and reported, the reason is printed, and the exit status is 1."""
    lines = [ranking(f"r{k}", k, ["a", "b"], arm="A") for k in range(3000)]
    packed = gzip.compress(("\n".join(lines) + "\n").encode())
    broken = packed[: len(packed) // 2] if damage == "cut" else (
        packed[: len(packed) // 2] + bytes(b ^ 0xFF for b in packed[len(packed) // 2 : len(packed) // 2 + 64])
        + packed[len(packed) // 2 + 64 :])
    path = tmp_path / "log.jsonl.gz"
    path.write_bytes(broken)
    result = cli("replay", path, "--format", "json")
    assert result.returncode == 1
    assert f"stream-eval: error: {path}: " in result.stderr.decode()
    read = json.loads(result.stdout)["events"]
    assert 0 < read["ranking"] < 3000  # what came before the damage
    if damage == "cut":  # the line the cut went through is left out, not counted invalid
        assert read["invalid"] == 0 and b"cut there, left out" in result.stderr, result.stderr.decode()
        # only the trailer cut (every line there), the last without a line end: it is whole, and read
        whole = gzip.compress("\n".join(lines).encode())[:-4]
        path.write_bytes(whole)
        result = cli("replay", path, "--format", "json")
        assert result.returncode == 1 and b"left out" not in result.stderr, result.stderr.decode()
        assert json.loads(result.stdout)["events"]["ranking"] == 3000


@pytest.mark.slow
def test_several_files_are_their_concatenation(tmp_path: Path, log: Path, default_report: dict[str, Any]) -> None:
    lines = log.read_text().splitlines()
    first = tmp_path / "part1.jsonl"
    first.write_text("\n".join(lines[:9]))  # no newline at the end of the first file
    second = write(tmp_path / "part2.jsonl", lines[9:15])
    third = tmp_path / "part3.jsonl.gz"
    third.write_bytes(gzip.compress("".join(line + "\n" for line in lines[15:]).encode()))
    assert report(first, second, third) == default_report


@pytest.mark.slow
def test_long_file_read_in_several_chunks(tmp_path: Path) -> None:
    """More than one read chunk (CHUNK_BYTES): line numbers run on across chunks, and the numbers do not depend
    on where the chunks end. r1 is finalised at 1860 s and forgotten one horizon later (join.py), so r1 served
    again two hours after is a new request, and the clicks that follow it count for the new one."""
    n = 12_000 * CHUNK_BYTES // (1 << 20)  # ~1.2 chunks of lines
    lines = [ranking("r1", 0, ["a", "b"], arm="A")]
    lines += [ranking(f"f{k}", k, [f"i{j}" for j in range(8)], arm="A") for k in range(1, n + 1)]
    lines.insert(n - 1000, "{broken")
    lines += [click("r1", "a", n), ranking("r1", n, ["a", "b"], arm="A"), click("r1", "b", n + 1)]
    path = write(tmp_path / "long.jsonl", lines)
    assert path.stat().st_size > 1.2 * CHUNK_BYTES
    result = cli("replay", path, "--format", "json")
    assert result.returncode == 0, result.stderr.decode()
    assert f"{path}:{n - 999}" in result.stderr.decode()
    rep = json.loads(result.stdout)
    assert rep["events"] == {"ranking": n + 2, "feedback": 2, "judgment": 0, "invalid": 1, "late": 0,
                             "duplicate": 0, "orphan": 0}
    assert rep["overall"]["requests"] == n + 2


@pytest.mark.slow
def test_per_request_output(default_rows: dict[str, dict[str, Any]]) -> None:
    rows = default_rows
    assert set(rows) == {"r1", "r2", "r3", "r4", "r5"}
    for row in rows.values():
        assert set(row) == PER_REQUEST_KEYS
        assert {"RR", "AP", "P@10", "R@10", "nDCG@10", "ERR@10"} <= set(row["metrics"])
    r1 = rows["r1"]
    assert (r1["experiment"], r1["arm"], r1["query_id"], r1["session_id"]) == ("e", "A", "q1", "s1")
    assert rows["r5"]["query_id"] == "r5" and rows["r5"]["session_id"] == "r5"  # defaults: the request_id
    assert r1["metrics"]["RR"] == 0.5 and rows["r2"]["metrics"]["RR"] == 1.0
    assert rows["r4"]["metrics"]["RR"] == 0.0  # empty = zero
    # no subtopics were logged: alpha-nDCG is undefined for every request
    assert all(row["metrics"].get("alpha-nDCG@10", None) is None for row in rows.values())


@pytest.mark.slow
def test_per_request_nulls_for_skipped_empty_requests(tmp_path: Path, log: Path) -> None:
    rows = per_request(tmp_path, log, "--empty", "skip")
    assert set(rows) == {"r1", "r2", "r3", "r4", "r5"}
    assert all(value is None for value in rows["r4"]["metrics"].values())
    assert rows["r1"]["metrics"]["RR"] == 0.5


# -- options ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cutoffs(tmp_path: Path, log: Path) -> None:
    rep = report(log, "--cutoffs", "5,10")
    names = set(metrics(rep))
    for family in ("P", "R", "DCG", "nDCG", "ERR"):
        assert {f"{family}@5", f"{family}@10"} <= names
    assert rep["config"]["cutoffs"] == [5, 10]
    assert math.isclose(metrics(rep)["P@5"], (2 + 1 + 1 + 0 + 1) / 5 / 5)  # r1 has b and c in its top 5
    rows = per_request(tmp_path, log, "--cutoffs", "5,10")
    assert {"P@5", "P@10", "nDCG@5"} <= set(rows["r1"]["metrics"])


@pytest.mark.slow
def test_gain(tmp_path: Path, log: Path, default_rows: dict[str, dict[str, Any]],
              default_report: dict[str, Any]) -> None:
    exp_rows = default_rows
    linear_rows = per_request(tmp_path, log, "--gain", "linear")
    inv = 1 / math.log2(3)
    # r1: b (grade 1) at 2, c (grade 3) at 3
    assert math.isclose(exp_rows["r1"]["metrics"]["nDCG@10"], (inv + 7 / 2) / (7 + inv))
    assert math.isclose(linear_rows["r1"]["metrics"]["nDCG@10"], (inv + 3 / 2) / (3 + inv))
    linear = report(log, "--gain", "linear")
    assert linear["config"]["gain"] == "linear"
    assert metrics(linear)["nDCG@10"] != metrics(default_report)["nDCG@10"]


@pytest.mark.slow
def test_max_grade(tmp_path: Path, log: Path, default_rows: dict[str, dict[str, Any]],
                   default_report: dict[str, Any]) -> None:
    def err(max_grade: float) -> float:
        r_b, r_c = 1 / 2**max_grade, 7 / 2**max_grade
        return r_b / 2 + (1 - r_b) * r_c / 3

    assert math.isclose(default_rows["r1"]["metrics"]["ERR@10"], err(4))
    assert math.isclose(per_request(tmp_path, log, "--max-grade", "3")["r1"]["metrics"]["ERR@10"], err(3))
    three = report(log, "--max-grade", "3")
    assert three["config"]["max_grade"] == 3
    assert metrics(three)["ERR@10"] > metrics(default_report)["ERR@10"]


@pytest.mark.slow
def test_rel_threshold(log: Path) -> None:
    rep = report(log, "--rel-threshold", "2")
    # relevant now: r1 c@3, r3 y@2; r2, r4 and r5 have no relevant item
    assert math.isclose(metrics(rep)["MRR"], (1 / 3 + 0.5) / 5)
    assert rep["overall"]["empty"] == 3
    assert rep["config"]["rel_threshold"] == 2


@pytest.mark.slow
def test_empty_policy(log: Path, default_report: dict[str, Any]) -> None:
    zero, skip = default_report, report(log, "--empty", "skip")
    assert math.isclose(metrics(zero)["MRR"], 2.5 / 5)
    assert math.isclose(metrics(skip)["MRR"], 2.5 / 4)
    for rep in (zero, skip):
        assert rep["overall"]["requests"] == 5
        assert rep["overall"]["empty"] == 1
        assert group(rep, "B")["empty"] == 1
    assert math.isclose(group(skip, "B")["metrics"]["MRR"], 0.5)
    assert math.isclose(group(zero, "B")["metrics"]["MRR"], 0.25)


@pytest.mark.slow
def test_gauc_weight(log: Path, default_report: dict[str, Any]) -> None:
    # session AUCs: s1 = 8/12 (3 positives, 7 items), s2 = 1/2 (1 of 3), r5 = 1/2 (1 of 3); s3 one class only
    expected = {
        "impressions": (7 * 8 / 12 + 3 * 0.5 + 3 * 0.5) / 13,
        "clicks": (3 * 8 / 12 + 0.5 + 0.5) / 5,
        "uniform": (8 / 12 + 0.5 + 0.5) / 3,
    }
    for weight, value in expected.items():
        rep = report(log, "--gauc-weight", weight) if weight != "impressions" else default_report
        assert math.isclose(metrics(rep)["GAUC"], value), weight
        assert rep["config"]["gauc_weight"] == weight
    assert math.isclose(metrics(report(log, "--gauc-weight", "impressions"))["GAUC"], expected["impressions"])


@pytest.mark.slow
def test_attribution_window(log: Path, default_report: dict[str, Any]) -> None:
    rep = report(log, "--attribution-window", "10s")
    assert rep["events"] == {**EXPECTED_EVENTS, "late": 2}  # r1's label at +20 s is late now
    assert rep["config"]["attribution_window"] == 10
    default = default_report
    assert metrics(rep)["nDCG@10"] != metrics(default)["nDCG@10"]
    assert math.isclose(metrics(rep)["MRR"], metrics(default)["MRR"])  # r1 keeps its click on b


SETTINGS_FLAGS = ["--cutoffs", "5,10", "--gain", "linear", "--max-grade", "3", "--rel-threshold", "2",
                  "--empty", "skip", "--gauc-weight", "uniform", "--attribution-window", "10s"]
SETTINGS_TOML = """
cutoffs = [5, 10]
gain = "linear"
max_grade = 3
rel_threshold = 2
empty = "skip"
gauc_weight = "uniform"
attribution_window = "10s"
"""


@pytest.mark.slow
def test_config_file_equals_flags(tmp_path: Path, log: Path, default_report: dict[str, Any]) -> None:
    from_flags = report(log, *SETTINGS_FLAGS)
    plain = tmp_path / "plain.toml"
    plain.write_text(SETTINGS_TOML)
    assert report(log, "--config", plain) == from_flags
    table = tmp_path / "table.toml"
    table.write_text("[stream_eval]\n" + SETTINGS_TOML)
    assert report(log, "--config", table) == from_flags
    assert from_flags["config"]["gain"] == "linear" and from_flags["config"]["empty"] == "skip"
    assert from_flags != default_report


@pytest.mark.slow
def test_experiment_arms_from_the_config_file(tmp_path: Path, log: Path) -> None:
    toml = tmp_path / "arms.toml"
    toml.write_text('[experiments.e]\ncontrol = "B"\ntreatment = "A"\n')
    rep = report(log, "--config", toml)
    assert {(row["control"], row["treatment"]) for row in rep["ab"]} == {("B", "A")}
    [mrr] = [row for row in rep["ab"] if row["metric"] == "MRR"]
    assert math.isclose(mrr["delta"], 0.75 - 0.25)
    [metric_gsb] = [g for g in rep["gsb"] if g["source"] == "metric"]
    assert (metric_gsb["good"], metric_gsb["bad"]) == (1, 0)


@pytest.mark.slow
def test_environment_variables(log: Path) -> None:
    rep = report(log, env=clean_env(STREAM_EVAL_GAIN="linear", STREAM_EVAL_EMPTY="skip",
                                    STREAM_EVAL_ATTRIBUTION_WINDOW="10s"))
    assert rep["config"]["gain"] == "linear" and rep["config"]["empty"] == "skip"
    assert rep["config"]["attribution_window"] == 10 and rep["events"]["late"] == 2
    assert math.isclose(metrics(rep)["MRR"], 2.5 / 4)


@pytest.mark.slow
def test_feedback_kinds_from_the_config_file(tmp_path: Path) -> None:
    path = write(tmp_path / "kinds.jsonl", [
        ranking("r1", 0, ["a", "b"], arm="A"),
        click("r1", "b", 1, kind="purchase"),
    ])
    plain = report(path, "--rel-threshold", "2")
    assert plain["events"]["invalid"] == 1 and plain["overall"]["empty"] == 1
    toml = tmp_path / "kinds.toml"
    toml.write_text("[kinds]\npurchase = 3\n")
    rep = report(path, "--rel-threshold", "2", "--config", toml)
    assert rep["events"]["invalid"] == 0 and rep["events"]["feedback"] == 1
    assert rep["config"]["kinds"] == {"purchase": 3}
    assert metrics(rep)["MRR"] == 0.5  # grade 3 >= 2: relevant at position 2


@pytest.mark.slow
def test_environment_cutoffs(log: Path) -> None:
    rep = report(log, env=clean_env(STREAM_EVAL_CUTOFFS="5"))
    assert rep["config"]["cutoffs"] == [5]
    assert {"P@5", "nDCG@5", "ERR@5"} <= set(metrics(rep))
    assert "P@10" not in metrics(rep)


@pytest.mark.slow
def test_precedence_flag_over_env_over_file(tmp_path: Path, log: Path) -> None:
    toml = tmp_path / "settings.toml"
    toml.write_text('cutoffs = [3, 10]\ngain = "linear"\nempty = "skip"\n')
    env = clean_env(STREAM_EVAL_CUTOFFS="4,10", STREAM_EVAL_GAIN="exp")
    only_file = report(log, "--config", toml)
    assert only_file["config"]["cutoffs"] == [3, 10] and only_file["config"]["gain"] == "linear"
    env_over_file = report(log, "--config", toml, env=env)
    assert env_over_file["config"]["cutoffs"] == [4, 10]
    assert env_over_file["config"]["gain"] == "exp"
    assert env_over_file["config"]["empty"] == "skip"  # from the file: nothing overrides it
    assert "P@4" in metrics(env_over_file) and "P@3" not in metrics(env_over_file)
    flag_over_all = report(log, "--config", toml, "--cutoffs", "7,10", "--gain", "linear", env=env)
    assert flag_over_all["config"]["cutoffs"] == [7, 10]
    assert flag_over_all["config"]["gain"] == "linear"
    assert "P@7" in metrics(flag_over_all)


# -- errors ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, mentions",
    [
        (["--cutoffs", "ten"], "cutoffs"),
        (["--cutoffs", "0"], "cutoffs"),
        (["--gain", "cubic"], "gain"),
        (["--max-grade", "-1"], "max"),
        (["--max-grade", "high"], "max_grade"),
        (["--rel-threshold", "x"], "rel_threshold"),
        (["--empty", "maybe"], "empty"),
        (["--gauc-weight", "heavy"], "gauc"),
        (["--attribution-window", "soon"], "attribution_window"),
        (["--attribution-window=-5s"], "attribution_window"),
    ],
)
def test_bad_option_value(log: Path, args: list[str], mentions: str) -> None:
    result = cli("replay", log, *args)
    assert result.returncode == 2
    stderr = result.stderr.decode()
    assert "Traceback" not in stderr
    assert mentions in stderr, stderr
    assert result.stdout == b""


@pytest.mark.slow
def test_bad_environment_value(log: Path) -> None:
    result = cli("replay", log, env={"STREAM_EVAL_GAIN": "cubic"})
    assert result.returncode == 2
    assert "gain" in result.stderr.decode() and b"Traceback" not in result.stderr


@pytest.mark.slow
def test_bad_config_file(tmp_path: Path, log: Path) -> None:
    missing = cli("replay", log, "--config", tmp_path / "nope.toml")
    assert missing.returncode == 2 and "nope.toml" in missing.stderr.decode()
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("colour = 'blue'\n")
    result = cli("replay", log, "--config", unknown)
    assert result.returncode == 2 and "colour" in result.stderr.decode()
    broken = tmp_path / "broken.toml"
    broken.write_text("cutoffs = [\n")
    result = cli("replay", log, "--config", broken)
    assert result.returncode == 2 and b"Traceback" not in result.stderr


def test_missing_file(tmp_path: Path, log: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    for args in ([missing], [log, missing]):
        result = cli("replay", *args, "--format", "json")
        assert result.returncode == 2
        stderr = result.stderr.decode()
        assert str(missing) in stderr and "Traceback" not in stderr


def test_no_files_is_a_usage_error() -> None:
    assert cli("replay").returncode == 2


# -- simulate then replay ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_simulate_then_replay(tmp_path: Path) -> None:
    out = tmp_path / "sim.jsonl"
    result = cli("simulate", "--requests", "200", "-o", out)
    assert result.returncode == 0, result.stderr.decode()
    assert out.stat().st_size > 0
    rep = report(out)
    assert rep["events"]["ranking"] == 200
    assert rep["overall"]["requests"] == 200
    assert rep["events"]["invalid"] == 0
    assert rep["events"]["feedback"] > 0
    assert metrics(rep)["MRR"] is not None and 0 < metrics(rep)["MRR"] <= 1
    assert 0 <= metrics(rep)["nDCG@10"] <= 1
    again = tmp_path / "again.jsonl"
    assert cli("simulate", "--requests", "200", "-o", again).returncode == 0
    assert again.read_bytes() == out.read_bytes()  # deterministic for a seed


def test_simulate_settings_it_cannot_use_are_a_message_not_a_traceback(tmp_path: Path) -> None:
    """A pre-period that would hold every request (no experiment traffic), a preference without users, one so
    large that the propensities overflowed (a numpy warning, then users who always or never click): exit 2 with
    the reason, and no file written."""
    out = tmp_path / "sim.jsonl"
    result = cli("simulate", "--unit", "user", "--pre-period", "1d", "--preference", "0.8", "-o", out)
    assert result.returncode == 2 and b"all 1,000 requests fall in the pre-period" in result.stderr
    assert b"Traceback" not in result.stderr and not out.exists()
    result = cli("simulate", "--preference", "0.8", "-o", out)
    assert result.returncode == 2 and b"preference needs unit='user'" in result.stderr
    result = cli("simulate", "--unit", "user", "--preference", "1000", "-o", out)
    assert result.returncode == 2 and b"preference must be between 0 and 50" in result.stderr
    assert b"Warning" not in result.stderr and not out.exists()


def test_simulate_writes_the_arms_and_segments_asked_for(tmp_path: Path) -> None:
    """``--arms`` names the experiment's arms with their rankers' quality, ``--segment`` a field of the rankings'
    attributes: a three-arm experiment with a segment, as the README's A/B/n section has a user try it."""
    out = tmp_path / "abn.jsonl"
    result = cli("simulate", "--requests", "600", "--unit", "user", "--arms", "control:0.55,better:0.9,worse:0.1",
                 "--segment", "platform=ios,web", "-o", out)
    assert result.returncode == 0, result.stderr.decode()
    rankings = [json.loads(line) for line in out.read_bytes().splitlines() if b'"ranking"' in line]
    assert {r["arm"] for r in rankings} == {"control", "better", "worse"}
    assert {r["attributes"]["platform"] for r in rankings} == {"ios", "web"}
    for bad, said in ((["--arms", "control,better:0.7"], b"NAME:QUALITY"), (["--arms", "a:1.5"], b"NAME:QUALITY"),
                      (["--segment", "platform"], b"FIELD=VALUE"), (["--segment", "p=a,a"], b"distinct")):
        result = cli("simulate", "--requests", "5", "-o", tmp_path / "x.jsonl", *bad)
        assert result.returncode == 2 and said in result.stderr, (bad, result.stderr)


@pytest.mark.parametrize("options", [["--rate", "500"], ["--topic-prefix", "x", "--no-flush", "--security-protocol",
                                                        "SSL", "--no-ssl-check-hostname", "--partitions", "2"],
                                     ["--broker-timeout", "3"]])
def test_simulate_refuses_kafka_options_without_a_broker(options: list[str], tmp_path: Path) -> None:
    """``--rate`` (and the other options of sending to Kafka) without ``--broker`` were ignored without a word: a
    file written at full speed for a user who asked for a paced stream."""
    out = tmp_path / "sim.jsonl"
    result = cli("simulate", "--requests", "5", "-o", out, *options)
    assert result.returncode == 2, result.stderr.decode()
    named = [option for option in options if option.startswith("--")]
    assert f"simulate: {', '.join(named)}: only with --broker".encode() in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("given", ["0", "65"])
def test_stage_partitions_beyond_the_shards_are_refused(given: str) -> None:
    """The A/B units have 64 shards: --stage-partitions 65 was cut to 64 without a word."""
    from stream_eval.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--stage-partitions", given])
    assert build_parser().parse_args(["worker", "--stage-partitions", "64"]).stage_partitions == 64


def test_snapshot_interval_is_a_worker_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/operations.md told operators to raise ``snapshot_interval`` where the A/B state is large, a setting no
    option, variable or file reached."""
    import stream_eval.stream.app as app
    from stream_eval.cli import build_parser, main

    seen: list[Any] = []
    monkeypatch.setattr(app, "run_worker", lambda settings, *args, **kwargs: seen.append(settings) or 0)
    assert main(["worker", "--broker", "kafka://localhost:1", "--snapshot-interval", "5m"]) == 0
    assert seen[0].snapshot_interval == 300.0
    assert build_parser().parse_args(["worker"]).snapshot_interval == 60.0
    for given in ("0s", "2d", "soon"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["worker", "--snapshot-interval", given])


@pytest.mark.parametrize("setting", ["session_gap = nan", "gsb_window = nan", "max_grade = inf", "gsb_epsilon = nan",
                                     "gsb_epsilon = -1", "rel_threshold = inf", "attribution_window = inf",
                                     "allowed_lateness = 1e400", "max_grade = 1100", "[kinds]\nkinds.purchase = 1e9"])
def test_config_values_it_cannot_use_are_refused_before_any_work(setting: str, tmp_path: Path, log: Path) -> None:
    """TOML has nan and inf: they passed the checks and changed results silently (or raised OverflowError); a
    negative gsb_epsilon made every query good; a grade whose exp gain overflows made ERR 0."""
    config = tmp_path / "bad.toml"
    table, _, line = setting.rpartition("\n")  # "[kinds]\nkinds.purchase = ...": the setting's name as reported
    config.write_text(f"{table}\n{line.removeprefix('kinds.')}\n")
    result = cli("replay", log, "--config", config, "--format", "json")
    assert result.returncode == 2, result.stderr.decode()
    assert b"Traceback" not in result.stderr and result.stdout == b""
    assert line.split("=")[0].strip().encode() in result.stderr


def test_a_config_file_that_is_not_utf8_is_a_message(tmp_path: Path, log: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_bytes(b"\xff\xfe")
    result = cli("replay", log, "--config", config)
    assert result.returncode == 2 and b"not UTF-8" in result.stderr and b"Traceback" not in result.stderr


def test_paths_it_cannot_use_are_refused_before_the_replay(tmp_path: Path, log: Path) -> None:
    """A directory as input, and an output in a directory that does not exist, fail at once with exit 2 (they
    failed with a traceback, or after the whole replay with its report printed)."""
    missing = tmp_path / "nowhere"
    for args in ([tmp_path], [log, "-o", missing / "r.json"], [log, "--html", missing / "r.html"],
                 [log, "--per-request", missing / "r.parquet"], [log, "-o", tmp_path]):
        result = cli("replay", *args, "--format", "json")
        assert result.returncode == 2, (args, result.stderr.decode())
        assert result.stdout == b"" and b"Traceback" not in result.stderr, args
        assert str(args[-1]).encode() in result.stderr, (args, result.stderr)


def test_an_output_that_is_an_input_or_another_output_is_refused(tmp_path: Path, log: Path) -> None:
    """``--per-request`` (or ``--ab-trace``) naming the input emptied the log before it was read: exit 0, an empty
    report and the log gone; ``-o`` naming it overwrote it after; two outputs of one file overwrote each other.
    They are refused before any work (exit 2), the input untouched; ``-o -`` is standard output (it made a file
    ``-``), and another output to ``-`` is refused."""
    victim = tmp_path / "victim.jsonl"
    victim.write_bytes(log.read_bytes())
    packed = tmp_path / "victim.jsonl.gz"
    packed.write_bytes(gzip.compress(log.read_bytes()))
    for args in ([victim, "--per-request", victim], [victim, "--ab-trace", victim], [victim, "-o", victim],
                 [packed, "--per-request", packed], [victim, "--per-request", tmp_path / "." / "victim.jsonl"],
                 [victim, "-o", tmp_path / "same", "--per-request", tmp_path / "same"],
                 [victim, "--per-request", "-"]):
        result = cli("replay", *args, "--format", "json")
        assert result.returncode == 2 and b"Traceback" not in result.stderr, (args, result.stderr)
        assert b"write the output to another file" in result.stderr or b"give --per-request a file" in \
            result.stderr, result.stderr
    assert victim.read_bytes() == log.read_bytes() and gzip.decompress(packed.read_bytes()) == log.read_bytes()
    assert not (tmp_path / "same").exists()
    result = cli("replay", victim, "-o", "-", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0 and json.loads(result.stdout)["overall"] and not (tmp_path / "-").exists()


def test_inputs_in_another_shape_get_a_hint(tmp_path: Path) -> None:
    """Found by a new user: one JSON array of events (not JSON Lines), and a UTF-16 file (a PowerShell redirect),
    gave an empty report with exit 0 and no word why; epoch milliseconds were out of range without a hint."""
    events = [{"type": "ranking", "request_id": "r1", "ts": T0, "items": ["a", "b"]},
              {"type": "feedback", "request_id": "r1", "item": "a", "kind": "click", "ts": T0 + 1}]
    array = tmp_path / "events.json"
    array.write_text(json.dumps(events, indent=2))
    result = cli("replay", array, "--format", "json")
    assert result.returncode == 0 and b"starts with '[': if it is one JSON array" in result.stderr, result.stderr
    assert b"jq -c '.[]'" in result.stderr
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-16")
    result = cli("replay", utf16, "--format", "json")
    assert result.returncode == 2 and b"is UTF-16 text; replay reads UTF-8" in result.stderr, result.stderr
    lines = tmp_path / "ms.jsonl"
    lines.write_text(json.dumps({**events[0], "ts": T0 * 1000}) + "\n")
    result = cli("replay", lines, "--format", "json")
    assert result.returncode == 0 and b"epoch milliseconds? ts is in seconds" in result.stderr, result.stderr
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert b"hint" not in cli("replay", plain, "--format", "json").stderr


def test_a_directory_as_input_is_named_with_the_files_it_holds(tmp_path: Path) -> None:
    """The message for a directory given as an input suggested ``DIR/*.parquet`` whatever the directory held, and
    did so for ``trec``'s QRELS and RUN too, which are one file each."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("day1.jsonl.gz", "day2.jsonl.gz", "notes.txt", ".hidden.parquet"):
        (logs / name).write_bytes(b"")
    result = cli("replay", logs, "--format", "json")
    assert result.returncode == 2 and f"e.g. {logs / '*.jsonl.gz'})".encode() in result.stderr, result.stderr
    run = tmp_path / "run"
    run.write_text("1 Q0 d1 1 1.0 r\n")
    result = cli("trec", logs, run)
    assert result.returncode == 2 and b"is a directory, not a file to read" in result.stderr, result.stderr
    # produce said "no such file" of a directory
    result = cli("produce", logs, "--broker", "kafka://localhost:1")
    assert result.returncode == 2 and f"e.g. {logs / '*.jsonl.gz'})".encode() in result.stderr, result.stderr


@pytest.mark.slow
def test_simulate_to_a_broker_that_does_not_answer_gives_up_after_its_timeout() -> None:
    """``simulate --broker`` had no ``--broker-timeout``: to a broker that never answers it waited its 300 s, as
    "stream-eval produce"."""
    result = cli("simulate", "--broker", "kafka://localhost:1", "--requests", "10", "--broker-timeout", "2")
    assert result.returncode == 1 and b"gave up after --broker-timeout 2 s" in result.stderr, result.stderr
    assert b"stream-eval produce" not in result.stderr


def test_outputs_that_name_directories_are_refused_by_every_command(tmp_path: Path, log: Path) -> None:
    """An output that is a directory, or ends in ``/``, gave a traceback (IsADirectoryError), in replay only after
    the whole replay; ``simulate -o`` and ``trec -o`` were not checked at all."""
    qrels, run = tmp_path / "qrels", tmp_path / "run"
    qrels.write_text("1 0 d1 1\n")
    run.write_text("1 Q0 d1 1 1.0 r\n")
    for args in (["replay", log, "-o", f"{tmp_path / 'nowhere'}/"], ["replay", log, "--ab-trace", f"{tmp_path}/"],
                 ["simulate", "--requests", "5", "-o", tmp_path], ["trec", qrels, run, "-o", tmp_path]):
        result = cli(*args)
        assert result.returncode == 2, (args, result.stderr.decode())
        assert b"is a directory, not a file to write" in result.stderr and b"Traceback" not in result.stderr, args
    assert cli("trec", qrels, run, "-o", tmp_path / "out.txt").returncode == 0
