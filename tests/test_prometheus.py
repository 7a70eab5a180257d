"""Prometheus export and rolling event-time windows, without Kafka: a fresh registry per test."""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support import AbstractTimeConfig as Config

from stream_eval.config import format_duration
from stream_eval.engine.delays import FeedbackDelays
from stream_eval.engine.engine import Engine, FinalisedBatch
from stream_eval.engine.labels import OTHER
from stream_eval.engine.replay import replay
from stream_eval.engine.windows import RollingWindows
from stream_eval.events.join import Join
from stream_eval.events.schema import Event, Feedback, Invalid, Judgment, Ranking, finish
from stream_eval.export import prometheus as export
from stream_eval.export.prometheus import EngineCollector, serve_metrics
from stream_eval.metrics.specs import GAUC, parse
from stream_eval.simulate import SimulationConfig, simulate_lines

SIMULATION = SimulationConfig(
    requests=3000, judgments=True, interleaving=True, label_rate=0.3, late_fraction=0.03,
    duplicate_fraction=0.03, orphan_fraction=0.02, invalid_fraction=0.01, shuffle_window=20.0, seed=11,
)
#: promtool's naming lint on the gauges whose names docs/contract.md §5 fixes (``stream_eval_window_sum`` / ``_count``).
CONTRACT_NAMED_GAUGES = {
    'stream_eval_window_count non-histogram and non-summary metrics should not have "_count" suffix',
    'stream_eval_window_sum non-histogram and non-summary metrics should not have "_sum" suffix',
}


def _log(tmp_path: Path, config: SimulationConfig = SIMULATION) -> str:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(simulate_lines(config)))
    return str(path)


def _events(events: list[Any], config: Config) -> list[Event | Invalid]:
    out = [finish(e, config) for e in events]
    assert not any(isinstance(e, Invalid) for e in out)
    return out


def _live(config: Config, width: float | None = 10.0) -> tuple[Engine, RollingWindows, CollectorRegistry]:
    engine = Engine(config)
    windows = RollingWindows(engine, width=width)
    FeedbackDelays(engine)
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    return engine, windows, registry


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


# -- finalised sums and counts -------------------------------------------------------------------------------
@pytest.mark.parametrize("empty", ["zero", "skip"])
def test_finalised_sums_and_counts_give_the_replay_report(tmp_path: Path, empty: str) -> None:
    config = Config(empty=empty, cutoffs=(5, 10))
    values: dict[tuple[str, str], list[list[float]]] = defaultdict(list)

    def keep(batch: FinalisedBatch) -> None:
        for record in batch.records():
            values[record["experiment"], record["arm"]].append(
                [math.nan if v is None else v for v in record["metrics"].values()]
            )

    engine = replay([_log(tmp_path)], config, on_finalised=keep)
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    report = engine.report()
    get = registry.get_sample_value
    assert len(report["groups"]) == 3  # control, treatment, interleaved
    for group in report["groups"]:
        labels = {"experiment": group["experiment"], "arm": group["arm"]}
        assert get("stream_eval_requests_total", labels) == group["requests"]
        rows = np.array(values[group["experiment"], group["arm"]])
        for name, mean in group["metrics"].items():
            if name == GAUC:
                auc = {**labels, "metric": "AUC"}
                total, count = get("stream_eval_metric_sum_total", auc), get("stream_eval_metric_count_total", auc)
                assert total / count == pytest.approx(mean, rel=1e-12)
                continue
            spec = parse(name)
            metric = {**labels, "metric": spec.name}
            total, count = get("stream_eval_metric_sum_total", metric), get("stream_eval_metric_count_total", metric)
            column = rows[:, engine.specs.index(spec)]
            assert count == np.count_nonzero(~np.isnan(column))
            assert count == group["requests"] - (group["empty"] if empty == "skip" else 0)
            assert total == pytest.approx(np.nansum(column), rel=1e-12)
            assert total / count == pytest.approx(mean, rel=1e-12)
    for kind, status in engine.counts:
        assert get("stream_eval_events_total", {"type": kind, "status": status}) == engine.counts[kind, status]
    assert sum(v for (name, _), v in _samples(registry).items() if name == "stream_eval_events_total") == sum(
        engine.counts.values()
    )
    # the invalid events by reason code add up, type by type, to the invalid events
    by_code: dict[str, float] = defaultdict(float)
    for (name, labels), v in _samples(registry).items():
        if name == "stream_eval_invalid_events_total":
            by_code[dict(labels)["type"]] += v
    invalid = {kind: n for (kind, status), n in engine.counts.items() if status == "invalid" and n}
    assert invalid and by_code == invalid
    for row in report["gsb"]:
        for verdict in ("good", "same", "bad"):
            labels = {"experiment": row["experiment"], "arm": row["treatment"] or "", "source": row["source"],
                      "verdict": verdict}
            assert get("stream_eval_gsb_total", labels) == row[verdict]
        labels = {"experiment": row["experiment"], "arm": row["treatment"] or "", "source": row["source"],
                  "window": "total"}
        assert get("stream_eval_gsb_score", labels) == pytest.approx(row["score"])
    assert {row["source"] for row in report["gsb"]} == {"judgment", "metric", "interleaving"}
    assert report["ab"]
    for row in report["ab"]:
        labels = {"experiment": row["experiment"], "metric": row["metric"], "arm": row["treatment"]}
        for field in ("delta", "ci_lower", "ci_upper"):
            assert get(f"stream_eval_ab_{field}", labels) == pytest.approx(row[field], nan_ok=True)


def test_counters_never_decrease_while_streaming(tmp_path: Path) -> None:
    config = Config()
    engine, _, registry = _live(config)
    lines = Path(_log(tmp_path)).read_bytes().splitlines(keepends=True)
    from stream_eval.events.schema import decode_chunk

    previous: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for start in range(0, len(lines), 1500):
        engine.process(decode_chunk(b"".join(lines[start : start + 1500]), config))
        now = _samples(registry)
        for (name, labels), value in previous.items():
            if name.endswith(("_total", "_bucket")) or name == "stream_eval_feedback_delay_seconds_count":
                assert now[name, labels] >= value, (name, labels)
        previous = now
    engine.flush()
    assert registry.get_sample_value("stream_eval_watermark_seconds") == engine.watermark
    assert math.isfinite(engine.watermark)


# -- rolling windows -----------------------------------------------------------------------------------------
def test_click_on_open_request_changes_its_window_and_finalisation_does_not_double_count() -> None:
    config = Config()
    engine, windows, registry = _live(config)
    get = registry.get_sample_value
    t0 = 1_767_225_600.0
    engine.process(_events([
        Ranking("r1", ["a", "b", "c"], ts=t0, experiment="e", arm="x"),
        Ranking("r2", ["a", "b"], ts=t0 + 170, experiment="e", arm="x"),
    ], config))
    mrr = {"experiment": "e", "arm": "x", "metric": "MRR", "window": "5m"}
    assert get("stream_eval_window_sum", mrr) == 0.0
    assert get("stream_eval_window_count", mrr) == 2.0
    # a click on r1, served three minutes before the watermark: its (and only its) bucket changes at once
    engine.process(_events([Feedback("r1", "b", ts=t0 + 180)], config))
    assert get("stream_eval_window_sum", mrr) == 0.5
    assert get("stream_eval_window_mean", mrr) == 0.25
    assert get("stream_eval_requests_total", {"experiment": "e", "arm": "x"}) == 0.0
    assert windows.open_rows == 2
    # a 1-minute window at this watermark starts after r1's serve time: r1's click is not in it
    narrow = RollingWindows(Engine(config), windows=(60.0,), width=10.0)
    assert narrow.start(t0 + 180, 60.0) > t0
    # finalisation replaces the open values by the same final values: nothing counted twice
    engine.process(_events([Feedback("r2", "a", ts=t0 + 200, kind="label", grade=2.0)], config))
    hour = {**mrr, "window": "1h"}
    assert get("stream_eval_window_sum", hour) == 1.5
    engine.process(_events([Judgment("e", "q", "good", ts=t0 + 2100)], config))  # moves event time past r1's end
    assert get("stream_eval_requests_total", {"experiment": "e", "arm": "x"}) == 2.0
    assert windows.open_rows == 0
    assert get("stream_eval_window_sum", hour) == 1.5
    assert get("stream_eval_window_count", hour) == 2.0
    assert get("stream_eval_window_count", mrr) == 0.0  # the 5m window has moved on
    assert math.isnan(get("stream_eval_window_mean", mrr) or 0.0)
    assert get("stream_eval_gsb_score", {"experiment": "e", "arm": "", "source": "judgment", "window": "total"}) == 1.0


def test_window_labels() -> None:
    assert [format_duration(s) for s in (300, 3600, 90, 86400)] == ["5m", "1h", "90s", "1d"]
    windows = RollingWindows(Engine(Config(windows=(90.0, 86400.0))))
    assert windows.labels == ("90s", "1d")
    assert windows.width == 3.0


def _brute_force(engine: Engine, windows: RollingWindows, joins: list[Join], final: dict[str, tuple[float, Any]]):
    """Window sums from scratch: current values of open requests and final values, by serve time."""
    rows: list[tuple[float, tuple[str, str], Any]] = list(final.values())  # type: ignore[arg-type]
    for join in joins:
        requests = join.current(join.open_slots())
        if not len(requests):
            continue
        current, _, _ = engine.evaluate_finalised(requests)
        for ranking, row in zip(requests.rankings, current, strict=True):
            key = engine.group_keys[engine.group_of(ranking.experiment, ranking.arm)]
            rows.append((ranking.ts, key, row))
    out: dict[tuple[str, str, str, str], tuple[float, float]] = {}
    wm = windows.watermark
    for seconds, label in zip(windows.windows, windows.labels, strict=True):
        start = windows.start(wm, seconds)
        for key in engine.group_keys:
            mine = [row for ts, k, row in rows if k == key and ts >= start]
            matrix = np.array(mine).reshape(-1, len(engine.specs))
            for j, spec in enumerate(engine.specs):
                column = matrix[:, j]
                out[key[0], key[1], spec.mean_name, label] = (
                    float(np.nansum(column)), float(np.count_nonzero(~np.isnan(column)))
                )
    return out


@st.composite
def streams(draw):
    """Rankings and feedback on a few requests, shuffled, cut into batches, spread over partitions."""
    n = draw(st.integers(1, 8))
    events: list[Any] = []
    for r in range(n):
        ts = float(draw(st.integers(0, 400)))
        n_items = draw(st.integers(1, 4))
        events.append(Ranking(f"r{r}", [f"i{i}" for i in range(n_items)], ts=ts,
                              experiment="e", arm=draw(st.sampled_from(["a", "b"]))))
        if draw(st.booleans()):
            events.append(Ranking(f"r{r}", ["z"], ts=ts + 1))  # a duplicate ranking
        for _ in range(draw(st.integers(0, 4))):
            kind = draw(st.sampled_from(["click", "label"]))
            events.append(Feedback(f"r{r}", f"i{draw(st.integers(0, 5))}", kind=kind, ts=ts + draw(st.integers(0, 150)),
                                   grade=draw(st.sampled_from([0.0, 1.0, 3.0])) if kind == "label" else None))
    order = draw(st.permutations(range(len(events))))
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(events) - 1)), max_size=4)))
    partitions = draw(st.integers(1, 2))
    return [events[i] for i in order], cuts, partitions


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), empty=st.sampled_from(["zero", "skip"]))
def test_window_sums_equal_current_values_of_requests_served_in_the_window(stream: Any, empty: str) -> None:
    events, cuts, partitions = stream
    config = Config(attribution_window=120.0, allowed_lateness=10.0, windows=(60.0, 300.0), empty=empty)
    final: dict[str, tuple[float, tuple[str, str], Any]] = {}

    def keep(batch: FinalisedBatch) -> None:
        for state, row in zip(batch.states, batch.values, strict=True):
            key = engine.group_keys[engine.group_of(state.experiment, state.arm)]
            final[f"{state.request_id}#{len(final)}"] = (state.ts, key, row.copy())

    engine = Engine(config, on_finalised=keep)
    windows = RollingWindows(engine, width=10.0)
    joins = [engine.new_join() for _ in range(partitions)]
    checked = _events(events, config)
    bounds = [0, *cuts, len(checked)]
    for start, end in zip(bounds, bounds[1:], strict=False):
        for p, join in enumerate(joins):
            mine = [e for e in checked[start:end] if int(e.request_id[1:]) % partitions == p]  # type: ignore[union-attr]
            engine.process(mine, join)
        engine.close(min(join.watermark for join in joins))
        if not math.isfinite(windows.watermark):
            continue
        expected = _brute_force(engine, windows, joins, final)
        got = windows.snapshot()
        for key, (total, count) in expected.items():
            if key not in got:  # alpha-nDCG is exported once a ranking with subtopics is seen
                assert key[2].startswith("alpha-nDCG") and count == 0, key
                continue
            assert got[key][1] == count, key
            assert got[key][0] == pytest.approx(total, abs=1e-9), key
    for join in joins:
        engine.flush(join)
    engine.close(math.inf)
    assert windows.open_rows == 0


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=2, max_size=6),
    cutoffs=st.lists(st.integers(1, 30), min_size=1, max_size=3, unique=True),
    empty=st.sampled_from(["zero", "skip"]),
    gain=st.sampled_from(["exp", "linear"]),
    with_scores=st.booleans(),
)
def test_requests_without_grades_all_have_the_values_the_windows_keep_once(
    lengths: list[int], cutoffs: list[int], empty: str, gain: str, with_scores: bool
) -> None:
    """The windows hold one row for every open request without grades or subtopics: it must not depend on
    the request (its length, items, scores, arm)."""
    config = Config(cutoffs=tuple(cutoffs), empty=empty, gain=gain)
    engine = Engine(config)
    join = engine.new_join()
    events: list[Ranking | Feedback] = []
    for i, n in enumerate(lengths):
        scores = [float(n - j) for j in range(n)] if with_scores else None
        events.append(Ranking(f"r{i}", [f"d{i}-{j}" for j in range(n)], ts=float(i), scores=scores, arm=f"a{i % 2}"))
        events.append(Feedback(f"r{i}", "unjudged", kind="label", grade=0.0, ts=float(i)))  # a grade 0 changes nothing
    join.add(events)
    requests = join.current(join.open_slots())
    assert len(requests) == len(lengths) and not requests.graded.any()
    values, _, _ = engine.evaluate_finalised(requests)
    np.testing.assert_array_equal(values, np.tile(values[0], (len(requests), 1)))


def test_dropping_a_partition_takes_its_open_requests_out_of_the_windows() -> None:
    config = Config()
    engine, windows, registry = _live(config)
    kept, dropped = engine.new_join(), engine.new_join()
    engine.process(_events([Ranking("r1", ["a"], ts=100.0), Feedback("r1", "a", ts=101.0)], config), kept)
    engine.process(_events([Ranking("r2", ["a"], ts=100.0), Feedback("r2", "a", ts=102.0)], config), dropped)
    engine.close(102.0)
    mrr = {"experiment": "default", "arm": "default", "metric": "MRR", "window": "5m"}
    assert registry.get_sample_value("stream_eval_window_count", mrr) == 2.0
    windows.drop(dropped)
    assert registry.get_sample_value("stream_eval_window_count", mrr) == 1.0
    assert registry.get_sample_value("stream_eval_window_sum", mrr) == 1.0
    assert windows.open_rows == 1
    # a new owner rebuilding the partition muted adds its open requests once it runs unmuted
    rebuilt = engine.new_join()
    with engine.muted(rebuilt):
        engine.process(_events([Ranking("r2", ["a"], ts=100.0), Feedback("r2", "a", ts=102.0)], config), rebuilt)
    assert registry.get_sample_value("stream_eval_window_count", mrr) == 1.0
    engine.process([], rebuilt)
    assert registry.get_sample_value("stream_eval_window_count", mrr) == 2.0
    assert registry.get_sample_value("stream_eval_events_total", {"type": "ranking", "status": "ok"}) == 2.0


def test_window_gauc_and_gsb_hold_what_closed_in_the_window() -> None:
    config = Config(attribution_window=60.0, allowed_lateness=0.0)
    engine, windows, registry = _live(config)
    engine.process(_events([
        Ranking("r1", ["a", "b", "c"], ts=0.0, scores=[3.0, 2.0, 1.0]),
        Feedback("r1", "b", ts=10.0),
        Judgment("default", "q", "bad", ts=20.0),
        Ranking("r2", ["a", "b"], ts=1000.0),
    ], config))
    stats = engine.groups[0]
    assert stats.sessions == 1  # r1 closed as a session of its own
    gauc = {"experiment": "default", "arm": "default", "metric": GAUC, "window": "5m"}
    assert registry.get_sample_value("stream_eval_window_sum", gauc) == pytest.approx(stats.gauc.total[0])
    assert registry.get_sample_value("stream_eval_window_mean", gauc) == pytest.approx(0.5)
    score = {"experiment": "default", "arm": "", "source": "judgment", "window": "5m"}
    assert registry.get_sample_value("stream_eval_gsb_score", score) == -1.0
    engine.process(_events([Ranking("r3", ["a"], ts=2000.0)], config))
    assert registry.get_sample_value("stream_eval_window_count", gauc) == 0.0
    assert math.isnan(registry.get_sample_value("stream_eval_gsb_score", score) or 0.0)
    assert registry.get_sample_value("stream_eval_gsb_score", {**score, "window": "1h"}) == -1.0
    assert registry.get_sample_value("stream_eval_metric_count_total",
                                     {"experiment": "default", "arm": "default", "metric": "AUC"}) == 3.0


# -- labels, delays, exposition, endpoint ---------------------------------------------------------------------
def test_label_values_are_bounded() -> None:
    config = Config(max_label_values=2)
    engine, _, registry = _live(config)
    events = [Ranking(f"r{i}", ["a"], ts=float(i), experiment=f"e{i % 5}", arm=f"a{i % 3}") for i in range(30)]
    engine.process(_events(events, config))
    engine.flush()
    experiments, arms = set(), set()
    for family in registry.collect():
        for sample in family.samples:
            experiments.add(sample.labels.get("experiment"))
            arms.add(sample.labels.get("arm"))
    assert experiments - {None} == {"e0", "e1", OTHER}
    assert arms - {None} == {"a0", "a1", OTHER}
    assert registry.get_sample_value("stream_eval_requests_total", {"experiment": OTHER, "arm": OTHER}) > 0
    assert registry.get_sample_value("stream_eval_label_overflow_total", {"label": "experiment"}) > 0


def test_feedback_delay_histogram() -> None:
    config = Config()
    engine, _, registry = _live(config)
    engine.process(_events([
        Ranking("r1", ["a", "b"], ts=100.0),
        Feedback("r1", "a", ts=103.0),   # 3 s
        Feedback("r1", "a", ts=104.0),   # duplicate: not observed
        Feedback("r1", "b", ts=100.0 + 700),  # 700 s
        Feedback("r1", "b", ts=100.0 + 5000),  # late: not observed
        Feedback("r9", "b", ts=100.0),  # waits for its ranking
    ], config))
    other = engine.new_join()
    engine.process(_events([Ranking("r2", ["a"], ts=50.0), Feedback("r2", "a", ts=40.0)], config), other)  # skew: 0
    get = registry.get_sample_value
    assert get("stream_eval_feedback_delay_seconds_count") == 3.0
    assert get("stream_eval_feedback_delay_seconds_sum") == 703.0
    assert get("stream_eval_feedback_delay_seconds_bucket", {"le": "1"}) == 1.0
    assert get("stream_eval_feedback_delay_seconds_bucket", {"le": "5"}) == 2.0
    assert get("stream_eval_feedback_delay_seconds_bucket", {"le": "600"}) == 2.0
    assert get("stream_eval_feedback_delay_seconds_bucket", {"le": "900"}) == 3.0
    assert get("stream_eval_feedback_delay_seconds_bucket", {"le": "+Inf"}) == 3.0


@pytest.mark.slow
def test_exposition_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is needed (Debian/Ubuntu: apt-get install prometheus)"
    config = Config(cutoffs=(5, 10))
    engine, _, registry = _live(config)
    from stream_eval.events.schema import decode_chunk

    simulation = SimulationConfig(requests=1500, rate=0.5, judgments=True, interleaving=True, subtopics=True,
                                  invalid_fraction=0.02)
    engine.process(decode_chunk(Path(_log(tmp_path, simulation)).read_bytes(), config))  # the last hour still open
    assert engine.join.open_slots().size and engine.groups[0].requests
    exposition = generate_latest(registry)
    assert export.exposition(registry.collect()) == exposition  # what /metrics serves: the same bytes
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=60)
    problems = set((result.stdout + result.stderr).decode().strip().splitlines())
    # Exit 3 = lint findings only; the two allowed are names docs/contract.md §5 fixes for the window gauges.
    assert result.returncode in (0, 3), problems
    assert problems <= CONTRACT_NAMED_GAUGES, problems - CONTRACT_NAMED_GAUGES
    names = {family.name for family in text_string_to_metric_families(exposition.decode())}
    assert {"stream_eval_requests", "stream_eval_metric_sum", "stream_eval_metric_count", "stream_eval_window_sum",
            "stream_eval_window_count", "stream_eval_window_mean", "stream_eval_gsb", "stream_eval_gsb_score",
            "stream_eval_ab_delta", "stream_eval_ab_ci_lower", "stream_eval_ab_ci_upper", "stream_eval_events",
            "stream_eval_feedback_delay_seconds", "stream_eval_watermark_seconds"} <= names
    text = exposition.decode()
    for series in ("stream_eval_requests_total{", "stream_eval_metric_sum_total{", "stream_eval_metric_count_total{",
                   "stream_eval_gsb_total{", "stream_eval_events_total{", 'metric="alpha-nDCG@10"'):
        assert series in text


def test_collector_reads_under_the_workers_lock() -> None:
    lock = threading.Lock()
    registry = CollectorRegistry()
    EngineCollector(Engine(Config()), registry, lock=lock)
    done = threading.Event()

    def scrape() -> None:
        generate_latest(registry)
        done.set()

    with lock:
        thread = threading.Thread(target=scrape)
        thread.start()
        assert not done.wait(0.2)  # blocked while the worker holds the lock
    assert done.wait(5)
    thread.join()


def test_serve_metrics_serves_the_registry() -> None:
    import gzip

    engine, _, registry = _live(Config())
    engine.process(_events([Ranking("r1", ["a"], ts=5.0)], engine.config))
    expected = generate_latest(registry)
    server = serve_metrics(registry, 0, host="127.0.0.1")
    url = f"http://127.0.0.1:{server.port}/metrics"

    def get(url: str, **headers: str) -> tuple[dict[str, str], bytes]:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310  # the local server
            return dict(response.headers), response.read()

    try:
        headers, body = get(url)
        zipped_headers, zipped = get(url, **{"Accept-Encoding": "gzip"})  # as Prometheus asks
        _, some = get(url + "?name[]=stream_eval_watermark_seconds&name[]=stream_eval_events_total")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=5)  # noqa: S310
    finally:
        server.stop()
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert body == expected
    assert 'stream_eval_events_total{status="ok",type="ranking"} 1.0' in body.decode()
    assert "stream_eval_watermark_seconds 5.0" in body.decode()
    assert zipped_headers["Content-Encoding"] == "gzip" and gzip.decompress(zipped) == body
    assert {f.name for f in text_string_to_metric_families(some.decode())} == {"stream_eval_watermark_seconds",
                                                                                "stream_eval_events"}
    assert refused.value.code == 405


_LABEL_TEXT = st.text(st.characters(codec="utf-8"), max_size=8) | st.sampled_from(['a"b', "c\\d", "e\nf", "\\n", ""])
_VALUES = st.floats() | st.integers(-(2**60), 2**60) | st.sampled_from([1e6, 1234567.0, 1e22, 5e-324, -0.0])


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.tuples(_LABEL_TEXT, _LABEL_TEXT, _VALUES), max_size=6), doc=_LABEL_TEXT,
       created=st.none() | st.floats(0, 2e9), buckets=st.lists(st.floats(0, 1e9), max_size=4))
def test_exposition_is_prometheus_clients_text_byte_for_byte(values: list[tuple[str, str, float]], doc: str,
                                                             created: float | None, buckets: list[float]) -> None:
    """What /metrics serves (``export.exposition``) against prometheus_client's own text export, the oracle: label
    values and help texts to be escaped, special and large floats, every family type and OpenMetrics samples, and
    the collector's own rows (``Rows``), whose lines are kept from one scrape to the next."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeHistogramMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        InfoMetricFamily,
        Metric,
        UnknownMetricFamily,
    )

    def families() -> list[Metric]:
        counter = CounterMetricFamily("c", doc, labels=["b", "a"])
        gauge = GaugeMetricFamily("g", doc, labels=["x", "le"])
        unknown = UnknownMetricFamily("u", doc, labels=["a", "b"])
        for a, b, value in values:
            counter.add_metric([b, a], abs(value), created=created)
            gauge.add_metric([a, b], value, timestamp=created)
            unknown.add_metric([a, b], value)
        cumulative = [(export.floatToGoString(bound), float(i)) for i, bound in enumerate(sorted(buckets))]
        histogram = HistogramMetricFamily("h", doc, labels=["a"])
        histogram.add_metric(["x"], [*cumulative, ("+Inf", len(buckets))], sum_value=1.5)
        gauge_histogram = GaugeHistogramMetricFamily("gh", doc, labels=["a"])
        gauge_histogram.add_metric(["x"], [*cumulative, ("+Inf", len(buckets))], gsum_value=2.5)
        info = InfoMetricFamily("i", doc, labels=["a"])
        info.add_metric(["y"], {"version": doc})
        rows = sorted({(b, a): abs(value) for a, b, value in values}.items())  # (the collector's rows: sorted, unique)
        return [counter, gauge, unknown, histogram, gauge_histogram, info,
                GaugeMetricFamily("plain", doc, value=values[0][2] if values else 0.0),
                export.Rows("rows_counter", doc, "counter", ["z", "a"], rows, lines),
                export.Rows("rows_gauge", doc, "gauge", ["x", "y"], [(key, -value) for key, value in rows], lines),
                export.Rows("rows_plain", doc, "gauge", [], [((), 1.5)], lines)]

    class Families:
        def collect(self) -> list[Metric]:
            return families()

    lines = export.LineCache()
    registry = CollectorRegistry()
    registry.register(Families())
    for _ in range(2):  # the second time with every line's label part from the cache
        lines.turn()
        assert export.exposition(registry.collect()) == generate_latest(registry)


# -- readouts: what a worker's /metrics shows between its batches --------------------------------------------
def _scrape_in_thread(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of a scrape from another thread (as the HTTP server's), failing instead of hanging."""
    out: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []
    thread = threading.Thread(target=lambda: out.append(_samples(registry)), daemon=True)
    thread.start()
    thread.join(5)
    assert out, "the scrape waited for the worker's lock"
    return out[0]


def test_a_readout_younger_than_max_age_is_shown_without_the_lock() -> None:
    now = [100.0]
    lock = threading.Lock()
    engine = Engine(Config())
    registry = CollectorRegistry()
    collector = EngineCollector(engine, registry, lock=lock, refresh_every=1.0, max_age=1.5, clock=lambda: now[0])
    watermark = ("stream_eval_watermark_seconds", ())
    engine.process(_events([Ranking("r1", ["a"], ts=5.0)], engine.config))
    collector.refresh()  # the worker, between two batches
    engine.process(_events([Ranking("r2", ["a"], ts=6.0)], engine.config))
    with lock:  # the worker in its next batch: the scrape shows the readout, and does not wait
        assert _scrape_in_thread(registry)[watermark] == 5.0
    now[0] = 100.9
    collector.refresh()  # younger than refresh_every: kept
    assert _scrape_in_thread(registry)[watermark] == 5.0
    now[0] = 101.0
    collector.refresh()
    assert _scrape_in_thread(registry)[watermark] == 6.0
    engine.process(_events([Ranking("r3", ["a"], ts=7.0)], engine.config))
    now[0] = 102.6  # no refresh for longer than max_age (the worker in a long batch): the scrape reads the engine
    assert _scrape_in_thread(registry)[watermark] == 7.0
    with lock:
        assert _scrape_in_thread(registry)[watermark] == 7.0  # and keeps what it read, as fresh


def test_periodic_readouts_re_evaluate_the_open_requests_once_open_every_has_passed() -> None:
    """A busy worker's periodic readouts (``refresh``) leave the live windows' open requests as last evaluated until
    ``open_every`` has passed; counters are fresh in each, and the readout a worker takes as it goes idle
    (``refresh_soon``) re-evaluates them."""
    now = [100.0]
    config = Config()
    engine = Engine(config)
    RollingWindows(engine, width=10.0)
    registry = CollectorRegistry()
    collector = EngineCollector(engine, registry, lock=threading.Lock(), refresh_every=1.0, max_age=1.5,
                                clock=lambda: now[0], open_every=5.0)
    t0 = 1_767_225_600.0
    mrr = ("stream_eval_window_sum", (("arm", "x"), ("experiment", "e"), ("metric", "MRR"), ("window", "5m")))
    count = ("stream_eval_window_count", mrr[1])
    watermark = ("stream_eval_watermark_seconds", ())
    engine.process(_events([Ranking("r1", ["a", "b", "c"], ts=t0, experiment="e", arm="x")], config))
    collector.refresh()  # the first: re-evaluated
    assert (_samples(registry)[mrr], _samples(registry)[count]) == (0.0, 1.0)
    engine.process(_events([Feedback("r1", "b", ts=t0 + 1), Ranking("r2", ["a"], ts=t0 + 2, experiment="e",
                                                                          arm="x")], config))
    now[0] = 101.0
    collector.refresh()  # periodic, within open_every: the open requests as last evaluated, the rest fresh
    shown = _samples(registry)
    assert (shown[mrr], shown[count], shown[watermark]) == (0.0, 1.0, t0 + 2)
    now[0] = 105.0
    collector.refresh()  # open_every since the last re-evaluation
    assert (_samples(registry)[mrr], _samples(registry)[count]) == (0.5, 2.0)
    engine.process(_events([Feedback("r2", "a", ts=t0 + 3)], config))
    now[0] = 106.0
    collector.refresh()
    assert _samples(registry)[mrr] == 0.5
    now[0] = 106.5
    assert collector.refresh_soon()  # the worker gone idle: re-evaluated
    assert _samples(registry)[mrr] == 1.5


def test_a_busy_workers_readouts_soon_re_evaluate_the_open_requests_once_settled() -> None:
    """A readout soon for new work (``refresh_soon(False)``: the start of a backlog, before the worker finds it is
    behind the broker) leaves the open requests as last evaluated while the worker is busy, as its periodic readouts
    do, until ``open_every`` has passed; one for a worker not busy (live traffic), or one that has gone idle
    (``refresh_soon(True)``), re-evaluates them."""
    now, cpu = [100.0], [0.0]
    config = Config()
    engine = Engine(config)
    RollingWindows(engine, width=10.0)
    registry = CollectorRegistry()
    collector = EngineCollector(engine, registry, lock=threading.Lock(), refresh_every=1.0, max_age=1.5,
                                clock=lambda: now[0], cpu_clock=lambda: cpu[0], open_every=5.0)
    t0 = 1_767_225_600.0
    mrr = ("stream_eval_window_sum", (("arm", "x"), ("experiment", "e"), ("metric", "MRR"), ("window", "5m")))
    served = 0

    def graded(busy: bool) -> None:  # a request served, its first item clicked; a second of work, busy or not
        nonlocal served
        engine.process(_events([Ranking(f"r{served}", ["a"], ts=t0 + served, experiment="e", arm="x"),
                                Feedback(f"r{served}", "a", ts=t0 + served + 0.5)], config))
        served += 1
        now[0] += 1.0
        cpu[0] += 0.9 if busy else 0.05

    graded(busy=False)
    assert collector.refresh_soon(False) and _samples(registry)[mrr] == 1.0  # the first: no work seen before
    graded(busy=True)
    assert collector.refresh_soon(False) and _samples(registry)[mrr] == 1.0  # busy: as last evaluated
    graded(busy=True)
    assert collector.refresh_soon(False) and _samples(registry)[mrr] == 1.0
    graded(busy=False)
    assert collector.refresh_soon(False) and _samples(registry)[mrr] == 4.0  # not busy: re-evaluated
    graded(busy=True)
    assert collector.refresh_soon(True) and _samples(registry)[mrr] == 5.0  # settled, busy or not
    for _ in range(4):
        graded(busy=True)
        assert collector.refresh_soon(False) and _samples(registry)[mrr] == 5.0
    graded(busy=True)
    assert collector.refresh_soon(False) and _samples(registry)[mrr] == 10.0  # open_every since the last


def test_scrapes_of_one_readout_write_its_families_once_and_read_the_broker_each_time(monkeypatch: Any) -> None:
    """Scrapes between two readouts (Prometheus pairs, dashboards, the demo's view) export the families made for the
    readout again, written once; the broker's health is read at every scrape; the text is prometheus_client's."""
    from stream_eval.stream.backoff import BrokerHealth

    now = [100.0]
    engine = Engine(Config())
    FeedbackDelays(engine)
    RollingWindows(engine, width=10.0)
    registry = CollectorRegistry()
    health = BrokerHealth("test", "nowhere")
    collector = EngineCollector(engine, registry, lock=threading.Lock(), refresh_every=1.0, max_age=1.5,
                                clock=lambda: now[0], broker=health)
    made: list[int] = []
    families = EngineCollector._families
    monkeypatch.setattr(EngineCollector, "_families", lambda self, s: (made.append(1), families(self, s))[1])
    rows_written: list[int] = []
    text = export.Rows.text
    monkeypatch.setattr(export.Rows, "text", lambda self: (rows_written.append(self._text is None), text(self))[1])
    engine.process(_events([Ranking("r1", ["a", "b"], ts=5.0), Feedback("r1", "a", ts=6.0)],
                           engine.config))
    collector.refresh()
    health.up = True
    first = export.exposition(registry.collect())
    written = sum(rows_written)
    again = export.exposition(registry.collect())
    assert again == first == generate_latest(registry) and len(made) == 1
    assert sum(rows_written) == written + 2  # (only the broker's two families are new rows)
    health.up, health.errors = False, {"fetch": 3}
    down = export.exposition(registry.collect()).decode()
    assert "stream_eval_broker_up 0.0" in down and 'stream_eval_broker_errors_total{operation="fetch"} 3.0' in down
    assert len(made) == 1 and down.replace("stream_eval_broker_up 0.0", "stream_eval_broker_up 1.0").startswith(
        first.decode().split("# HELP stream_eval_broker_up")[0])
    names = ["stream_eval_watermark_seconds", "stream_eval_requests_total", "stream_eval_window_mean"]
    some = export.exposition(registry.restricted_registry(names).collect()).decode()
    assert some == generate_latest(registry.restricted_registry(names)).decode()
    assert {f.name for f in text_string_to_metric_families(some)} == {"stream_eval_watermark_seconds",
                                                                      "stream_eval_requests", "stream_eval_window_mean"}
    engine.process(_events([Ranking("r2", ["a"], ts=9.0)], engine.config))
    now[0] = 101.0
    collector.refresh()  # a new readout: its families are made
    assert "stream_eval_watermark_seconds 9.0" in export.exposition(registry.collect()).decode() and len(made) == 2


def _clocked(**options: Any) -> tuple[list[float], threading.Lock, Engine, CollectorRegistry, EngineCollector]:
    """A collector of a new engine, as a worker's (a lock, ``refresh_every`` 1 s, ``max_age`` 1.5 s, and
    ``options``), on a clock at 100 s that the test moves (``now[0]``)."""
    now = [100.0]
    lock = threading.Lock()
    engine = Engine(Config())
    registry = CollectorRegistry()
    collector = EngineCollector(engine, registry, lock=lock, clock=lambda: now[0],
                                **{"refresh_every": 1.0, "max_age": 1.5, **options})
    return now, lock, engine, registry, collector


def test_a_scrape_waits_at_most_max_wait_for_the_lock_then_shows_the_older_readout() -> None:
    """A busy worker takes its lock back batch after batch; a scrape of a readout older than ``max_age`` waits for
    it ``max_wait`` at most, then shows the latest readout after all (and, without any readout, waits)."""
    now, lock, engine, registry, collector = _clocked(max_wait=0.05)
    watermark = ("stream_eval_watermark_seconds", ())
    engine.process(_events([Ranking("r1", ["a"], ts=5.0)], engine.config))
    collector.refresh()
    engine.process(_events([Ranking("r2", ["a"], ts=6.0)], engine.config))
    now[0] = 102.6  # older than max_age, and the worker in a batch
    with lock:
        assert _scrape_in_thread(registry)[watermark] == 5.0
    assert _scrape_in_thread(registry)[watermark] == 6.0  # the lock free: read now
    empty = CollectorRegistry()
    EngineCollector(engine, empty, lock=lock, refresh_every=1.0, max_age=1.5, max_wait=0.05)
    lock.acquire()
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(_samples(empty)), daemon=True)
    thread.start()
    thread.join(0.3)
    assert not out  # no readout to show: it waits for the lock
    lock.release()
    thread.join(5)
    assert out and out[0][watermark] == 6.0


def _counting_reads(collector: EngineCollector, monkeypatch: Any) -> list[float]:
    """The clock of each readout ``collector`` takes from now on."""
    reads: list[float] = []
    original = collector._reader.read

    def read(*args: Any) -> Any:
        reads.append(collector.clock())
        return original(*args)

    monkeypatch.setattr(collector._reader, "read", read)
    return reads


def test_readouts_between_batches_only_while_scraped_within_watched_for(monkeypatch: Any) -> None:
    """A worker nobody scrapes, or scraped less often than every ``watched_for`` (Prometheus every 15 s), takes no
    readouts between its batches: a scrape reads the engine itself when the latest readout is older than ``max_age``.
    Scraped more often (a live view), it takes them, until ``watched_for`` after the last scrape."""
    now = [100.0]
    engine = Engine(Config())
    registry = CollectorRegistry()
    collector = EngineCollector(engine, registry, lock=threading.Lock(), refresh_every=1.0, max_age=1.5,
                                max_wait=0.05, watched_for=5.0, clock=lambda: now[0], cpu_clock=lambda: 0.0)
    reads = _counting_reads(collector, monkeypatch)
    watermark = ("stream_eval_watermark_seconds", ())
    assert collector.take() and reads == [100.0]  # the worker's first, scraped or not
    engine.process(_events([Ranking("r1", ["a"], ts=5.0)], engine.config))
    for now[0] in (101.0, 102.0, 103.0):
        collector.refresh()
        assert collector.refresh_soon()  # (none wanted: not "due later", which would have the worker poll faster)
    assert reads == [100.0]
    now[0] = 110.0
    assert _scrape_in_thread(registry)[watermark] == 5.0  # 10 s old: read now, under the lock
    assert reads == [100.0, 110.0]
    now[0] = 112.0
    collector.refresh()
    assert collector.refresh_soon() and reads == [100.0, 110.0]  # one scrape: not watched
    now[0] = 125.0
    _scrape_in_thread(registry)  # 15 s after the last: read at the scrape, and still not watched
    now[0] = 127.0
    collector.refresh()
    assert reads == [100.0, 110.0, 125.0]
    engine.process(_events([Ranking("r2", ["a"], ts=6.0)], engine.config))
    now[0] = 128.0
    assert _scrape_in_thread(registry)[watermark] == 6.0  # read (3 s old); and 3 s after the last: watched
    now[0] = 129.0
    collector.refresh()
    assert reads[-1] == 129.0  # the periodic readouts again
    now[0] = 129.5
    assert _scrape_in_thread(registry)[watermark] == 6.0  # (without the lock: 0.5 s old)
    now[0] = 134.0  # 4.5 s after it
    collector.refresh()
    assert reads[-1] == 134.0
    now[0] = 135.5  # 6 s after it
    count = len(reads)
    collector.refresh()
    assert collector.refresh_soon() and len(reads) == count


def test_a_scrape_that_cannot_have_the_lock_asks_the_worker_for_a_readout(monkeypatch: Any) -> None:
    """Unwatched, the worker takes readouts only when asked: a scrape of an old readout that cannot have the lock
    within ``max_wait`` (the worker in a long batch) shows it, and the worker's next refresh takes one at once, which
    the next scrape shows."""
    now, lock, engine, registry, collector = _clocked(max_wait=0.05, watched_for=5.0)
    reads = _counting_reads(collector, monkeypatch)
    watermark = ("stream_eval_watermark_seconds", ())
    engine.process(_events([Ranking("r1", ["a"], ts=5.0)], engine.config))
    collector.take()
    engine.process(_events([Ranking("r2", ["a"], ts=6.0)], engine.config))
    now[0] = 130.0
    with lock:  # the worker in a batch
        assert _scrape_in_thread(registry)[watermark] == 5.0
    now[0] = 140.0  # 10 s after that scrape: not watched, but asked
    collector.refresh()
    assert reads == [100.0, 140.0]
    now[0] = 140.5
    with lock:
        assert _scrape_in_thread(registry)[watermark] == 6.0
    now[0] = 150.0
    collector.refresh()  # asked once only
    assert reads == [100.0, 140.0]


def test_a_readout_soon_is_taken_after_a_quarter_of_refresh_every() -> None:
    """The worker asks for a readout sooner when it starts counting or goes idle after new work: taken once the
    latest is a quarter of ``refresh_every`` old, not before."""
    now = [100.0]
    engine = Engine(Config())
    registry = CollectorRegistry()
    collector = EngineCollector(engine, registry, lock=threading.Lock(), refresh_every=1.0, max_age=1.5,
                                clock=lambda: now[0], cpu_clock=lambda: 0.0)  # (a worker that was idle)
    watermark = ("stream_eval_watermark_seconds", ())
    assert collector.refresh_soon()  # none yet
    engine.process(_events([Ranking("r1", ["a"], ts=5.0)], engine.config))
    now[0] = 100.2
    assert not collector.refresh_soon()
    collector.refresh()  # (nor the periodic one)
    with collector.lock:  # type: ignore[union-attr]
        assert math.isnan(_scrape_in_thread(registry)[watermark])
    now[0] = 100.25
    assert collector.refresh_soon()
    with collector.lock:  # type: ignore[union-attr]
        assert _scrape_in_thread(registry)[watermark] == 5.0
    collector._read_seconds = 0.2  # a large state: readouts of 0.2 s are taken 0.8 s apart at the soonest
    now[0] = 100.9
    assert not collector.refresh_soon()
    now[0] = 101.1
    assert collector.refresh_soon()


def test_long_readouts_are_taken_and_shown_further_apart(monkeypatch: Any) -> None:
    """Readouts that take long (A/B units by the million) are taken at most a quarter of the time: the periodic ones
    their own time divided by a quarter apart, and a scrape shows one that old without reading the engine."""
    now, lock, engine, registry, collector = _clocked(max_wait=0.05)
    reads = _counting_reads(collector, monkeypatch)
    watermark = ("stream_eval_watermark_seconds", ())
    collector.take()
    collector._read_seconds = 0.5  # (as the readouts of a large state take)
    engine.process(_events([Ranking("r1", ["a"], ts=5.0)], engine.config))
    now[0] = 101.5
    collector.refresh()
    assert reads == [100.0] and collector.spacing == 2.0
    now[0] = 101.9
    with lock:  # older than max_age, younger than four times a readout: shown without the lock
        assert math.isnan(_scrape_in_thread(registry)[watermark])
    now[0] = 102.0
    collector.refresh()
    assert reads == [100.0, 102.0]
    collector._read_seconds = 0.01
    now[0] = 103.0
    collector.refresh()
    assert reads == [100.0, 102.0, 103.0] and collector.spacing == 1.0


def test_a_readout_soon_is_taken_at_once_after_busy_work() -> None:
    """A worker that worked half of the last quarter of ``refresh_every`` (the end of a backlog) gets its readout
    soon without waiting that long after the latest; still no sooner than the readouts' own share allows, and a
    trickle of work waits."""
    now, cpu = [100.0], [10.0]

    def collector() -> EngineCollector:
        return EngineCollector(Engine(Config()), CollectorRegistry(), lock=threading.Lock(), refresh_every=1.0,
                               clock=lambda: now[0], cpu_clock=lambda: cpu[0])

    trickle = collector()
    assert trickle.refresh_soon()  # none yet
    for now[0], cpu[0], taken in [(100.1, 10.02, False), (100.2, 10.04, False), (100.25, 10.05, True)]:
        assert trickle.refresh_soon() is taken  # 20 % busy: a quarter of refresh_every apart
    now[0], cpu[0] = 100.0, 10.0
    busy = collector()
    assert busy.refresh_soon()
    now[0], cpu[0] = 100.1, 10.06  # 60 % busy
    assert busy.refresh_soon()
    busy._read_seconds = 0.02  # readouts of 20 ms: at most a quarter of the time, 80 ms apart
    now[0], cpu[0] = 100.15, 10.09
    assert not busy.refresh_soon()
    now[0], cpu[0] = 100.19, 10.14
    assert busy.refresh_soon()
    # a last small batch after a busy stretch: 100.19 to 100.28 was idle, the quarter second before it was not
    now[0], cpu[0] = 100.28, 10.141
    assert busy.refresh_soon()


def test_a_readout_exports_what_a_scrape_of_the_engine_does(tmp_path: Path) -> None:
    config = Config()
    engine = replay([_log(tmp_path, SimulationConfig(requests=2000, unit="user", judgments=True, seed=3))], config)
    live, later = CollectorRegistry(), CollectorRegistry()
    EngineCollector(engine, live)
    collector = EngineCollector(engine, later, refresh_every=1.0, max_age=60.0)
    collector.refresh()
    assert _samples(later) == pytest.approx(_samples(live), nan_ok=True)
    assert [(f.name, f.type) for f in later.collect()] == [(f.name, f.type) for f in live.collect()]


def test_ab_rows_are_computed_again_only_when_the_ledger_changes(tmp_path: Path, monkeypatch: Any) -> None:
    config = Config(attribution_window=10.0, allowed_lateness=2.0, session_gap=10.0, look_every=30.0)
    lines = Path(_log(tmp_path, SimulationConfig(requests=3000, unit="user", seed=5))).read_bytes().splitlines(
        keepends=True)
    from stream_eval.events.schema import decode_chunk

    engine = Engine(config)
    engine.process(decode_chunk(b"".join(lines[: len(lines) // 2]), config))
    calls: list[str] = []

    original = engine.ab_results
    monkeypatch.setattr(engine, "ab_results", lambda: (calls.append("ab_results"), original())[1])
    registry = CollectorRegistry()
    EngineCollector(engine, registry)
    first = _samples(registry)
    assert any(name == "stream_eval_ab_delta" for name, _ in first) and calls == ["ab_results"]  # once
    engine.process(decode_chunk(b"", config))  # nothing new: the ledger as it was
    assert _samples(registry) == pytest.approx(first, nan_ok=True) and calls == ["ab_results"]
    engine.process(decode_chunk(b"".join(lines[len(lines) // 2 :]), config))
    engine.flush()
    second = _samples(registry)
    assert calls == ["ab_results"] * 2
    fresh = CollectorRegistry()
    EngineCollector(engine, fresh)
    assert _samples(fresh) == pytest.approx(second, nan_ok=True)
    assert _samples(registry) == pytest.approx(second, nan_ok=True) and len(calls) == 3  # (1 of them: fresh's)
    engine.ledger.look(engine.watermark)  # a look alone changes the running p-values and sequences
    _samples(registry)
    assert len(calls) == 4


def test_a_failing_readout_does_not_stop_the_worker(monkeypatch: Any) -> None:
    engine = Engine(Config())
    registry = CollectorRegistry()
    collector = EngineCollector(engine, registry, refresh_every=1.0, max_age=1.5)

    def fail(*_: Any) -> None:
        raise RuntimeError("broken")

    monkeypatch.setattr(collector._reader, "read", fail)
    collector.refresh()  # logged, not raised: the worker's loop goes on
    collector.refresh()
    with pytest.raises(RuntimeError):  # the scrape reads the engine itself, and fails where it is seen
        _samples(registry)
