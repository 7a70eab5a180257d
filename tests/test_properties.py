"""Hypothesis properties of the metric kernels, the mergeable aggregates and the engine."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from unittest.mock import patch

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import AbstractTimeConfig as Config

from stream_eval.engine.compiled import PAIRWISE, grouped_session_auc
from stream_eval.engine.engine import Engine, GroupStats
from stream_eval.events.join import Join
from stream_eval.events.schema import (
    Chunk,
    Feedback,
    Invalid,
    Ranking,
    decode_chunk_columns,
    decode_chunk_compact,
    finish,
)
from stream_eval.metrics.aggregates import Moments, grouped_moments
from stream_eval.metrics.alpha import alpha_ndcg
from stream_eval.metrics.auc import session_auc
from stream_eval.metrics.kernels import JudgedBatch, evaluate_batch, evaluate_request, pair_order

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NORMALISED = ("RR", "AP", "P", "R", "nDCG", "ERR")


# -- generated event logs ------------------------------------------------------------------------------------
@st.composite
def logs(draw, max_requests: int = 6, named_sessions: bool = True, tenths: bool = False):
    """A small log: requests (served lists with metadata) and feedback tuples, all within the window.

    With ``tenths``, times are in tenths of a second, so that event time also stops inside a second (the
    join and the sessions keep what is due by the whole second)."""
    scale = 10 if tenths else 1
    n_requests = draw(st.integers(1, max_requests))
    requests = []
    for r in range(n_requests):
        n_items = draw(st.integers(1, 6))
        scores = draw(st.none() | st.lists(st.integers(0, 10).map(lambda x: x / 10), min_size=n_items,
                                          max_size=n_items))
        subtopics = draw(st.none() | st.lists(st.lists(st.sampled_from("xyz"), max_size=3), min_size=n_items,
                                             max_size=n_items))
        requests.append({
            "request_id": f"r{r}",
            "items": [f"i{i}" for i in range(n_items)],
            "ts": draw(st.integers(0, 100 * scale)) / scale,
            "scores": scores,
            "subtopics": subtopics,
            "query_id": draw(st.sampled_from([None, "q0", "q1"])),
            "session_id": draw(st.sampled_from([None, "s0", "s1"])) if named_sessions else None,
            "experiment": draw(st.sampled_from(["e1", "e2"])),
            "arm": draw(st.sampled_from(["a", "b"])),
        })
    feedback = draw(st.lists(
        st.tuples(
            st.integers(0, n_requests - 1),
            st.integers(0, 7),  # item index; beyond the served list = a judged-but-unserved item
            st.sampled_from(["click", "label"]),
            st.sampled_from([0.0, 1.0, 2.0, 3.0, 4.0, 0.5, 2.5]),
            st.integers(-50 * scale, 100 * scale).map(lambda x: x / scale),  # offset from the serve time, inside
            # the attribution window
        ),
        max_size=30,
    ))
    return requests, feedback


def ranking_event(req):
    return Ranking(req["request_id"], list(req["items"]), ts=req["ts"], scores=req["scores"],
                   query_id=req["query_id"], session_id=req["session_id"], experiment=req["experiment"],
                   arm=req["arm"], subtopics=req["subtopics"])


def feedback_event(requests, fb):
    r, i, kind, grade, offset = fb
    req = requests[r]
    item = req["items"][i] if i < len(req["items"]) else f"u{i}"
    return Feedback(req["request_id"], item, kind=kind, grade=grade if kind == "label" else None,
                    ts=req["ts"] + offset)


def checked(events, config):
    out = [finish(e, config) for e in events]
    assert not any(isinstance(e, Invalid) for e in out)
    return out


def run(events, config, cuts=()):
    """The events through one engine, in one call or cut before each index of ``cuts`` (sorted)."""
    records = {}

    def collect(batch):
        for record in batch.records():
            records[record["request_id"]] = record

    engine = Engine(config, on_finalised=collect)
    for start, end in zip([0, *cuts], [*cuts, len(events)], strict=True):
        engine.process(checked(events[start:end], config))
    engine.flush()
    return engine, records


def assert_close(a, b, path="report"):
    """Recursive equality: ints and strings exactly, floats to 1e-12."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for key in a:
            assert_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert isinstance(b, float | int), path
        assert b == pytest.approx(a, rel=1e-12, abs=1e-12), path
    else:
        assert a == b, path


configs = st.builds(
    Config,
    gain=st.sampled_from(["exp", "linear"]),
    cutoffs=st.just((2, 10)),
    empty=st.sampled_from(["zero", "skip"]),
    gauc_weight=st.sampled_from(["impressions", "clicks", "uniform"]),
    rel_threshold=st.sampled_from([1.0, 2.0, 0.5]),
)


# -- (a) the order of feedback does not matter ---------------------------------------------------------------
@SETTINGS
@given(log=logs(), config=configs, data=st.data())
def test_feedback_order_does_not_change_values_or_report(log, config, data):
    requests, feedback = log
    perm = data.draw(st.permutations(range(len(feedback))), label="permutation")
    early = data.draw(st.integers(0, len(feedback)), label="arrive before the rankings")
    rankings = [ranking_event(req) for req in requests]

    base_events = rankings + [feedback_event(requests, fb) for fb in feedback]
    shuffled_fb = [feedback_event(requests, feedback[p]) for p in perm]
    shuffled_events = shuffled_fb[:early] + [ranking_event(req) for req in requests] + shuffled_fb[early:]

    engine_a, records_a = run(base_events, config)
    engine_b, records_b = run(shuffled_events, config)
    assert records_a == records_b  # per-request values: exactly equal
    assert len(records_a) == len(requests)
    assert_close(engine_a.report(), engine_b.report())


# -- (e) two engines split by request merge into one ---------------------------------------------------------
@SETTINGS
@given(log=logs(max_requests=8, named_sessions=False), config=configs, data=st.data())
def test_split_by_request_merges_to_one_engine(log, config, data):
    requests, feedback = log
    split = data.draw(st.integers(0, len(requests)), label="split")

    def events_of(indices):
        chosen = set(indices)
        out = [ranking_event(requests[r]) for r in sorted(chosen)]
        out += [feedback_event(requests, fb) for fb in feedback if fb[0] in chosen]
        return out

    whole, _ = run(events_of(range(len(requests))), config)
    first, _ = run(events_of(range(split)), config)
    second, _ = run(events_of(range(split, len(requests))), config)

    size = len(whole.specs)
    merged: dict[tuple[str, str], GroupStats] = {}
    for engine in (first, second):
        for key, stats in zip(engine.group_keys, engine.groups, strict=True):
            merged.setdefault(key, GroupStats(size))
            merged[key] += stats
    assert sorted(merged) == sorted(whole.group_keys)
    for key, stats in zip(whole.group_keys, whole.groups, strict=True):
        mine = merged[key]
        assert (mine.requests, mine.empty, mine.sessions, mine.single_class) == (
            stats.requests, stats.empty, stats.sessions, stats.single_class)
        assert mine.moments.count.tolist() == stats.moments.count.tolist()
        np.testing.assert_allclose(mine.moments.mean(), stats.moments.mean(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(mine.gauc.mean(), stats.gauc.mean(), rtol=1e-12, atol=1e-12)
    total = GroupStats(size)
    for stats in merged.values():
        total += stats
    np.testing.assert_allclose(total.moments.mean(), whole.overall().moments.mean(), rtol=1e-12, atol=1e-12)
    assert whole.overall().requests == len(requests)


# -- (b) Moments ---------------------------------------------------------------------------------------------
values_or_nan = st.one_of(st.floats(-10, 10), st.just(math.nan))


@st.composite
def rows(draw, min_rows: int = 0):
    width = draw(st.integers(1, 4))
    n = draw(st.integers(min_rows, 12))
    matrix = draw(st.lists(st.lists(values_or_nan, min_size=width, max_size=width), min_size=n, max_size=n))
    weights = draw(st.lists(st.floats(0.1, 10), min_size=n, max_size=n))
    return np.array(matrix, dtype=np.float64).reshape(n, width), np.array(weights, dtype=np.float64)


def assert_same_moments(a: Moments, b: Moments) -> None:
    assert a.count.tolist() == b.count.tolist()
    for x, y in zip(a.state()[1:], b.state()[1:], strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


@SETTINGS
@given(data=rows(min_rows=0), extra=st.data())
def test_moments_update_then_revert_restores(data, extra):
    matrix, weights = data
    m = Moments(matrix.shape[1])
    m.update_many(matrix, weights)
    before = m.copy()
    row = np.array(extra.draw(st.lists(values_or_nan, min_size=m.size, max_size=m.size)), dtype=np.float64)
    weight = extra.draw(st.floats(0.1, 10))
    m.update(row, weight)
    m.revert(row, weight)
    assert_same_moments(m, before)
    np.testing.assert_allclose(m.mean(), before.mean(), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(data=rows(), split=st.integers(0, 12), weighted=st.booleans())
def test_moments_sum_of_halves_is_one_stream(data, split, weighted):
    matrix, weights = data
    split = min(split, matrix.shape[0])
    w = weights if weighted else None
    a, b, whole, loop = (Moments(matrix.shape[1]) for _ in range(4))
    a.update_many(matrix[:split], None if w is None else w[:split])
    b.update_many(matrix[split:], None if w is None else w[split:])
    whole.update_many(matrix, w)
    for i, row in enumerate(matrix):
        loop.update(row, 1.0 if w is None else float(w[i]))
    assert_same_moments(a + b, whole)
    assert_same_moments(whole, loop)
    assert_same_moments(whole - b, a)  # - reverts a part
    first = a.copy()
    a += b
    assert_same_moments(a, whole)
    a -= b
    assert_same_moments(a, first)
    np.testing.assert_allclose((first + b).mean(), whole.mean(), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(data=rows(min_rows=2))
def test_moments_mean_and_variance_match_numpy(data):
    matrix, _ = data
    m = Moments(matrix.shape[1])
    m.update_many(matrix)
    for j in range(matrix.shape[1]):
        column = matrix[:, j][~np.isnan(matrix[:, j])]
        if column.size == 0:
            assert math.isnan(m.mean()[j])
            continue
        assert m.mean()[j] == pytest.approx(column.mean(), rel=1e-9, abs=1e-9)
        if column.size > 1:
            assert m.variance()[j] == pytest.approx(column.var(ddof=1), rel=1e-7, abs=1e-9)
        else:
            assert math.isnan(m.variance()[j])


@SETTINGS
@given(data=rows(), n_groups=st.integers(1, 4), extra=st.data(), weighted=st.booleans())
def test_grouped_moments_equal_per_group_updates(data, n_groups, extra, weighted):
    matrix, weights = data
    group = np.array(extra.draw(st.lists(st.integers(0, n_groups - 1), min_size=matrix.shape[0],
                                         max_size=matrix.shape[0])), dtype=np.int64)
    grouped = grouped_moments(group, matrix, n_groups, weights if weighted else None)
    assert len(grouped) == n_groups
    for g in range(n_groups):
        expected = Moments(matrix.shape[1])
        for i in np.flatnonzero(group == g):
            expected.update(matrix[i], float(weights[i]) if weighted else 1.0)
        assert_same_moments(grouped[g], expected)


# -- (c) normalised metrics lie in [0, 1] --------------------------------------------------------------------
grades = st.lists(st.one_of(st.integers(0, 10), st.floats(0, 10)), max_size=25)


@st.composite
def metric_configs(draw):
    cutoffs = tuple(sorted(draw(st.sets(st.integers(1, 15), min_size=1, max_size=3))))
    return Config(
        gain=draw(st.sampled_from(["exp", "linear"])),
        cutoffs=cutoffs,
        max_grade=draw(st.floats(0.1, 10)),
        rel_threshold=draw(st.floats(0.01, 10)),
        empty=draw(st.sampled_from(["zero", "skip"])),
    )


@SETTINGS
@given(shown=grades.filter(bool), unshown=grades, config=metric_configs())
def test_normalised_metrics_in_unit_interval(shown, unshown, config):
    values = evaluate_request(shown, config, unshown=unshown)
    empty = not any(g >= config.rel_threshold for g in list(shown) + list(unshown))
    for name, value in values.items():
        family = name.split("@")[0]
        if family == "alpha-nDCG":  # needs subtopics: filled by the engine, tested below via alpha_ndcg
            continue
        if empty and config.empty == "skip":
            assert math.isnan(value), name
            continue
        assert not math.isnan(value), name
        if family in NORMALISED:
            assert 0.0 <= value <= 1.0, (name, value)
        else:
            assert value >= 0.0, (name, value)  # DCG


@SETTINGS
@given(
    subtopics=st.lists(st.lists(st.sampled_from("abcde"), max_size=4), min_size=1, max_size=10),
    data=st.data(),
    k=st.integers(1, 12),
)
def test_alpha_ndcg_in_unit_interval(subtopics, data, k):
    relevant = data.draw(st.lists(st.booleans(), min_size=len(subtopics), max_size=len(subtopics)))
    value = alpha_ndcg(subtopics, relevant, k, 0.5)  # the default alpha (docs/contract.md §2)
    assert 0.0 <= value <= 1.0


@SETTINGS
@given(
    pairs=st.lists(st.tuples(st.integers(0, 5), st.floats(-1e6, 1e6), st.booleans()), max_size=60),
)
def test_session_auc_in_unit_interval(pairs):
    session = np.array([p[0] for p in pairs], dtype=np.int64)
    scores = np.array([p[1] for p in pairs], dtype=np.float64)
    labels = np.array([p[2] for p in pairs], dtype=np.bool_)
    auc, positives, negatives = session_auc(session, scores, labels, 6)
    for s in range(6):
        if positives[s] and negatives[s]:
            assert 0.0 <= auc[s] <= 1.0
        else:
            assert math.isnan(auc[s])


@SETTINGS
@given(
    pairs=st.lists(st.tuples(st.integers(0, 5), st.integers(-3, 3), st.booleans()), max_size=80),
    pairwise=st.sampled_from([0, 2, PAIRWISE]),
)
def test_compiled_session_auc_equals_numpy(pairs, pairwise):
    """The engine's compiled session AUC gives the numpy definition's floats exactly, sorted or pair by pair
    (few distinct scores: many ties)."""
    pairs.sort(key=lambda p: p[0])
    session = np.array([p[0] for p in pairs], dtype=np.int64)
    scores = np.array([p[1] / 2 for p in pairs], dtype=np.float64)
    labels = np.array([p[2] for p in pairs], dtype=np.bool_)
    expected = session_auc(session, scores, labels, 6)
    got = grouped_session_auc(np.searchsorted(session, np.arange(7)), scores, labels, pairwise)
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("pairwise", [0, PAIRWISE])
def test_compiled_session_auc_equals_numpy_on_long_sessions(pairwise):
    """Sessions with more than PAIRWISE items of each class (the sorted path as shipped), many ties, and -0.0
    next to 0.0 (equal scores: a tie), bit for bit against the numpy definition."""
    rng = np.random.default_rng(5)
    sizes = rng.integers(0, 400, 60)
    session = np.repeat(np.arange(60), sizes)
    scores = rng.integers(-5, 6, session.shape[0]) / 4.0
    scores[scores == 0.0] *= rng.choice([-1.0, 1.0], int((scores == 0.0).sum()))  # -0.0 and 0.0
    labels = rng.random(session.shape[0]) < rng.uniform(0.2, 0.8, 60)[session]
    expected = session_auc(session, scores, labels, 60)
    got = grouped_session_auc(np.searchsorted(session, np.arange(61)), scores, labels, pairwise)
    assert (np.minimum(expected[1], expected[2]) > PAIRWISE).sum() > 20
    assert (np.signbit(scores) & (scores == 0.0)).any() and (~np.signbit(scores) & (scores == 0.0)).any()
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_array_equal(mine, theirs)


@SETTINGS
@given(
    pairs=st.lists(st.tuples(st.integers(-3, 3), st.integers(-5, 5)), max_size=40),
    big=st.sampled_from([0, 2**40]),  # 2**40: the combined key would overflow, lexsort instead
    presorted=st.booleans(),
)
def test_pair_order_sorts_as_lexsort(pairs, big, presorted):
    if presorted:
        pairs.sort()
    major = np.array([p[0] for p in pairs], dtype=np.int64) * (big or 1)
    minor = np.array([p[1] for p in pairs], dtype=np.int64) * (big or 1)
    expected = np.lexsort((minor, major))
    np.testing.assert_array_equal(pair_order(major, minor), expected)  # stable: the same permutation
    unstable = pair_order(major, minor, stable=False)
    assert sorted(unstable.tolist()) == list(range(len(pairs)))
    np.testing.assert_array_equal(major[unstable], major[expected])
    np.testing.assert_array_equal(minor[unstable], minor[expected])


def test_pair_order_examples():
    assert pair_order(np.array([1, 0]), np.array([0, 0])).tolist() == [1, 0]  # descending
    assert pair_order(np.array([0, 0, 1]), np.array([3, 3, 0])).tolist() == [0, 1, 2]  # in order, with a tie
    major, minor = np.array([4, 0, 4]), np.array([2**61, 0, 0])  # 4 * (2**61 + 1) + 2**61 > 2**63: lexsort
    assert pair_order(major, minor).tolist() == [1, 2, 0]


# -- (d) ideal order gives nDCG = 1 --------------------------------------------------------------------------
@SETTINGS
@given(shown=grades.filter(bool), config=metric_configs())
def test_ndcg_is_one_in_ideal_order(shown, config):
    ordered = sorted(shown, reverse=True)
    if ordered[0] < config.rel_threshold:  # no relevant item: an empty request, not this property
        ordered[0] = config.rel_threshold
    values = evaluate_request(ordered, config)
    for k in config.cutoffs:
        assert values[f"nDCG@{k}"] == 1.0, (k, ordered)


# -- (f) a request's values do not depend on the rest of the batch -------------------------------------------
request_strategy = st.tuples(
    st.lists(st.one_of(st.integers(0, 4), st.floats(0, 6)), min_size=1, max_size=15),
    st.lists(st.one_of(st.integers(0, 4), st.floats(0, 6)), max_size=4),
)


def batch_of(requests, rng):
    shown, unshown = [], []
    for r, (grades_, hidden) in enumerate(requests):
        shown += [(r, i + 1, float(g)) for i, g in enumerate(grades_)]
        unshown += [(r, float(g)) for g in hidden]
    rng.shuffle(shown)  # a batch may list its entries in any order
    rng.shuffle(unshown)
    return JudgedBatch.from_lists([len(g) for g, _ in requests], shown, unshown)


@SETTINGS
@given(
    target=request_strategy,
    others=st.lists(request_strategy, max_size=8),
    where=st.integers(0, 8),
    seed=st.integers(0, 2**16),
    config=metric_configs(),
)
def test_kernel_values_independent_of_batch(target, others, where, seed, config):
    rng = np.random.RandomState(seed)
    where = min(where, len(others))
    alone = evaluate_batch(batch_of([target], rng), config)
    together = evaluate_batch(batch_of(others[:where] + [target] + others[where:], rng), config)
    assert np.array_equal(alone.values[0], together.values[where], equal_nan=True)
    assert alone.empty[0] == together.empty[where]
    assert alone.n_relevant[0] == together.n_relevant[where]
    via_request = evaluate_request(target[0], config, unshown=target[1])
    assert np.array_equal(np.array(list(via_request.values())), alone.values[0], equal_nan=True)


# -- alpha-nDCG is the same number in every process ----------------------------------------------------------
ALPHA_SCRIPT = """
from stream_eval.metrics.alpha import alpha_ndcg
subtopics = [["2", "1", "5", "0", "4"], ["3", "4", "5", "6", "2"], ["6", "1"], [], ["3", "1"]]
print(repr(alpha_ndcg(subtopics, [True] * 5, 2, 0.1)))
"""


def test_alpha_ndcg_does_not_depend_on_hash_seed():
    # The served order is the greedy ideal order (the first two items have the largest gains, ties go to
    # the earlier item), so alpha-nDCG@2 is exactly 1 -- in every process, whatever PYTHONHASHSEED is.
    outputs = set()
    for seed in range(8):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        done = subprocess.run([sys.executable, "-c", ALPHA_SCRIPT], env=env, capture_output=True, text=True,
                              check=True)
        outputs.add(done.stdout.strip())
    assert outputs == {"1.0"}


# -- (f) how often finalisation runs does not matter -----------------------------------------------------------
@SETTINGS
@given(log=logs(max_requests=8, tenths=True), data=st.data(), gap=st.sampled_from([5.0, 10.0, 30.0]))
def test_chunking_does_not_change_values_or_report(log, data, gap):
    """Events fed in one call or cut into chunks (event time advancing after each) give the same values and
    report: short windows and session gaps, so that requests finalise and named sessions close (and split,
    when a request comes more than ``session_gap`` after the session's last one) during the stream."""
    config = Config(attribution_window=30.0, allowed_lateness=5.0, session_gap=gap, gsb_window=20.0)
    requests, feedback = log
    events = sorted([ranking_event(req) for req in requests] + [feedback_event(requests, fb) for fb in feedback],
                    key=lambda e: (e.ts, type(e) is Feedback))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(events) - 1))), label="cuts"))
    engine_a, records_a = run(events, config)
    engine_b, records_b = run(events, config, cuts)
    assert records_a == records_b
    assert_close(engine_a.report(), engine_b.report())


# -- rankings read by the line reader join as the same requests --------------------------------------------------
ODD_LINES = [
    b'{"type":"ranking","request_id":"r0","ts":3,"items":["x\\"y","z"],"experiment":"e1","arm":"a"}',  # a quote
    b'{"type":"judgment","query_id":"q0","item":"i1","grade":2}',
    b'{"type":"ranking","request_id":"r1","ts":4,"items":["i0"],"teams":["a"],"experiment":"e2","arm":"a"}',
    b"{broken",
    b'{"type":"watermark","ts":40,"end":true}',  # the end of a partition: the chunk goes as objects
]


@pytest.mark.slow
@SETTINGS
@given(log=logs(max_requests=8, tenths=True), data=st.data())
def test_rankings_read_from_bytes_join_as_decoded_ones(log, data):
    """Replay's chunks leave the items of the rankings the line reader read in the chunk's bytes, for the join
    to copy; the same lines decoded into objects give the same requests and report: with repeated request ids
    (duplicate rankings, ids taken again), rankings left to msgspec and other events in the same chunk."""
    config = Config(attribution_window=30.0, allowed_lateness=5.0, session_gap=10.0, gsb_window=20.0)
    requests, feedback = log
    requests = [{**req, "subtopics": None} for req in requests]  # (a ranking with subtopics goes to msgspec)
    events = sorted([ranking_event(req) for req in requests] + [feedback_event(requests, fb) for fb in feedback],
                    key=lambda e: (e.ts, type(e) is Feedback))
    lines = [msgspec.json.encode(e) for e in events]
    served = [k for k, e in enumerate(events) if type(e) is Ranking]
    repeated = data.draw(st.lists(st.sampled_from(served), max_size=4), label="repeated")
    for k in repeated:
        # a ranking again, later (before other rankings): a duplicate, or (after its horizon) a new request
        lines.insert(data.draw(st.integers(k + 1, len(lines)), label="again at"), lines[k])
    for line in data.draw(st.lists(st.sampled_from(ODD_LINES), max_size=3), label="odd"):
        lines.insert(data.draw(st.integers(0, len(lines)), label="at"), line)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(lines) - 1))), label="cuts"))
    chunks = [b"\n".join(lines[a:b]) for a, b in zip([0, *cuts], [*cuts, len(lines)], strict=True)]

    def replayed(decode):
        records = []
        engine = Engine(config, on_finalised=lambda batch: records.extend(batch.records()))
        for chunk in chunks:
            engine.process(decode(chunk))
        engine.flush()
        return records, engine.report()

    took_bytes = []
    add_columns = Join.add_columns

    def spied(self, *args, **kwargs):
        took_bytes.append(len(args) > 5 and args[5] is not None)
        return add_columns(self, *args, **kwargs)

    with patch.object(Join, "add_columns", spied):
        from_bytes = replayed(lambda chunk: decode_chunk_columns(chunk, config))
    assert from_bytes == replayed(lambda chunk: Chunk.of(decode_chunk_compact(chunk, config)))
    if len(lines) == len(events) + len(repeated):  # no other lines: every chunk's rankings came from bytes
        assert any(took_bytes)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"").replace(b"\x1f", b"")), max_size=30),
       last_newline=st.booleans(), size=st.integers(1, 40), bom=st.booleans())
def test_read_chunks_gives_whole_lines_in_order(tmp_path_factory, lines, last_newline, size, bom):
    """Replay's reader cuts a file into chunks of whole lines, whatever the read size: together they are the file
    (a blank unterminated tail left out; a UTF-8 byte order mark at its start left out), each numbered by its first
    line. (No 0x1f byte: a file that starts with the gzip magic is read as gzip.)"""
    from stream_eval.engine.replay import BOM, read_chunks

    text = b"\n".join(lines) + (b"\n" if last_newline and lines else b"")
    path = tmp_path_factory.mktemp("chunks") / "log.jsonl"
    path.write_bytes(BOM + text if bom else text)
    if not bom:  # (one the lines themselves start with is the file's; after the file's own, it is text)
        text = text.removeprefix(BOM)
    chunks = list(read_chunks(str(path), max(size, len(BOM))))
    joined = b"".join(chunk for chunk, _, _ in chunks)
    tail = text[text.rfind(b"\n") + 1:]
    assert joined == (text if tail.strip() else text[: len(text) - len(tail)])
    assert all(chunk.endswith(b"\n") for chunk, _, _ in chunks[:-1])
    for k, (_, first, _) in enumerate(chunks):
        assert first == 1 + b"".join(chunk for chunk, _, _ in chunks[:k]).count(b"\n")


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_byte_order_mark_at_the_start_changes_nothing(tmp_path, gzipped: bool) -> None:
    """A log saved with a UTF-8 byte order mark (PowerShell's ``Out-File -Encoding utf8``, Excel's "CSV UTF-8")
    lost its first event as ``bad_json`` ("invalid character (byte 0)"). It is now read as the log without it."""
    import gzip

    from stream_eval.config import Config
    from stream_eval.engine.replay import BOM, replay
    from stream_eval.simulate import SimulationConfig, simulate_lines

    text = b"".join(simulate_lines(SimulationConfig(requests=50, seed=3)))
    reports = []
    for name, data in (("plain.jsonl", text), ("bom.jsonl", BOM + text)):
        path = tmp_path / (name + (".gz" if gzipped else ""))
        path.write_bytes(gzip.compress(data) if gzipped else data)
        reports.append(replay([str(path)], Config()).report())
    assert reports[1]["events"]["invalid"] == 0 and reports[1]["events"]["ranking"] == 50
    assert reports[1] == reports[0]


class _Request:
    def __init__(self, request_id: str, experiment: str, arm: str, query_id: str | None, session_id: str | None):
        self.request_id, self.experiment, self.arm = request_id, experiment, arm
        self.query_id, self.session_id = query_id, session_id


class _Spec:
    def __init__(self, name: str) -> None:
        self.name = name


# ids and names holding what separates the pieces (quotes, commas, brackets), escapes, % and other characters
HOSTILE = st.text(max_size=12) | st.sampled_from(['","', '"', "\\", '\\"', "],[", "%b", "%", "\u2028", ""])


@pytest.mark.parametrize("arm", ['",', 'b",', '\\', 'x\\', '"', '","'])
def test_an_id_ending_in_a_quote_and_a_comma_keeps_its_record_whole(arm: str) -> None:
    """Found by the property below: an arm ending in ``",`` was cut at its escaped quote (``\\","`` reads as the
    separator ``","``), and every later field of the request's record moved by one: wrong JSON on the
    request-metrics topic and in ``--per-request``."""
    import orjson

    from stream_eval.engine.engine import FinalisedBatch

    ids = [("r1", "e", "", None, None), ("r2", "e", arm, "q", "s"), ("r3", "e", "a", None, None)]
    batch = FinalisedBatch([_Request(*row) for row in ids], (_Spec("RR"),),  # type: ignore[misc]
                           np.array([[0.5], [1.0], [0.25]]))
    encoded = batch.encoded()
    assert encoded == [orjson.dumps(record) for record in batch.records()]
    assert orjson.loads(encoded[1])["arm"] == arm


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(HOSTILE, HOSTILE, HOSTILE, st.none() | HOSTILE, st.none() | HOSTILE), max_size=6),
       st.lists(HOSTILE, max_size=3, unique=True), st.data())
def test_a_batch_encoded_a_column_at_a_time_is_each_record_encoded(
        ids: list[tuple[str, str, str, str | None, str | None]], names: list[str], data: st.DataObject) -> None:
    """``FinalisedBatch.encoded`` builds the per-request records from columns encoded at once: the same bytes as
    each record's own ``orjson.dumps``, whatever the ids and metric names hold (NaN and infinities as null)."""
    import orjson

    from stream_eval.engine.engine import FinalisedBatch

    number = st.floats(width=64) | st.sampled_from([math.nan, math.inf, -0.0, 1e-7, 1e22])
    values = np.array(data.draw(st.lists(st.lists(number, min_size=len(names), max_size=len(names)),
                                         min_size=len(ids), max_size=len(ids))),
                      dtype=np.float64).reshape(len(ids), len(names))
    if data.draw(st.booleans()):
        values = np.asfortranarray(values)  # (as a column-wise computation leaves them)
    batch = FinalisedBatch([_Request(*row) for row in ids], tuple(_Spec(n) for n in names),  # type: ignore[misc]
                           values)
    assert batch.encoded() == [orjson.dumps(record) for record in batch.records()]
