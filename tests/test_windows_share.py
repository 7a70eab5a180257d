"""The rolling windows' share (engine/windows.py, "Checkpoints"): a new owner restored from a full share and its
latest delta, with its open requests rebuilt, has the windows the dead owner would have had."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import orjson
import pytest
from support import AbstractTimeConfig as Config
from support import approx

from stream_eval.engine.engine import Engine
from stream_eval.engine.times import array_from_json as _unarray
from stream_eval.engine.windows import RollingWindows
from stream_eval.events.schema import decode_chunk_columns
from stream_eval.simulate import SimulationConfig, simulate_lines

#: Requests finalise 70 s after serve time, sessions close after 60 s without a request, GSB buckets after 60 s:
#: a log of a few hundred seconds fills the windows with final values, scored sessions and verdicts.
CONFIG = Config(attribution_window=60.0, allowed_lateness=10.0, session_gap=60.0, gsb_window=60.0,
                windows=(60.0, 300.0))
WIDTH = 10.0
SIMULATION = SimulationConfig(
    requests=2500, rate=5.0, max_delay=50.0, judgments=True, interleaving=True, label_rate=0.3,
    late_fraction=0.03, duplicate_fraction=0.03, orphan_fraction=0.02, invalid_fraction=0.01, shuffle_window=20.0,
)


def _pieces(lines: list[bytes], rng: random.Random, most: int = 300) -> list[bytes]:
    """The log in pieces of 1 to ``most`` lines (the batches an engine is fed)."""
    out, k = [], 0
    while k < len(lines):
        n = rng.randint(1, most)
        out.append(b"".join(lines[k : k + n]))
        k += n
    return out


def _feed(engine: Engine, piece: bytes, config: Any = CONFIG) -> None:
    engine.process(decode_chunk_columns(piece, config, 1, "log"))  # as replay reads it


def _json(share: dict[str, Any]) -> dict[str, Any]:
    """``share`` as a checkpoint stores and reads it back."""
    data: dict[str, Any] = orjson.loads(orjson.dumps(share))
    return data


def _content(share: dict[str, Any]) -> dict[Any, Any]:
    """What a full share holds, keyed by group names, not indices (another engine numbers groups otherwise)."""
    groups = [tuple(key) for key in share["groups"]]
    out: dict[Any, Any] = {}
    for kind in ("final", "sessions"):
        part = share[kind]
        count, sums = _unarray(part["count"]).tolist(), _unarray(part["sums"]).tolist()
        for i, (b, g) in enumerate(zip(part["bucket"], part["group"], strict=True)):
            out[kind, b, groups[g]] = (count[i], sums[i])  # floats compared exactly
    for b, experiment, source, *counts in share["verdicts"]:
        out["verdicts", b, experiment, source] = counts
    seen = share["gauc_seen"]
    count, sums = _unarray(seen["count"]).tolist(), _unarray(seen["sums"]).tolist()
    for i, g in enumerate(seen["group"]):
        out["gauc_seen", groups[g]] = (count[i], sums[i])
    for experiment, source, *counts in share["gsb_seen"]:
        out["gsb_seen", experiment, source] = counts
    for key in ("watermark", "current", "floor", "with_subtopics", "buckets"):
        out[key] = share[key]
    return out


def _sums(windows: RollingWindows, watermark: float | None = None) -> dict[Any, Any]:
    return {key: list(value) for key, value in windows.snapshot(watermark).items()}


def _assert_same_windows(a: RollingWindows, b: RollingWindows) -> None:
    """``b`` gives ``a``'s window sums (to 1e-12: open requests' values are added in another order) and verdicts,
    at the watermark and at a few others."""
    assert b.watermark == a.watermark
    for watermark in (None, a.watermark - 35.0, a.watermark + 55.0, a.watermark + 400.0):
        if watermark is not None and not math.isfinite(watermark):
            continue
        assert _sums(b, watermark) == approx(_sums(a, watermark))
        assert b.verdicts(watermark) == a.verdicts(watermark)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_a_restored_owner_has_the_windows_the_dead_owner_would_have_had(seed: int) -> None:
    """Seeds 4 and 5 with the behaviour and session measures (their sessions' columns follow GAUC's)."""
    rng = random.Random(seed)
    behaviour = seed >= 4
    sim = replace(SIMULATION, seed=seed, subtopics=seed % 3 == 2, behaviour=behaviour)
    config = replace(CONFIG, metrics=("default", "behaviour")) if behaviour else CONFIG
    pieces = _pieces(list(simulate_lines(sim)), rng)
    cut = rng.randrange(len(pieces) // 3, len(pieces) * 3 // 4)
    a = Engine(config)
    wa = RollingWindows(a, width=WIDTH)
    full: dict[str, Any] | None = None
    for piece in pieces[:cut]:  # checkpoints: a delta now and then, a full share more rarely
        _feed(a, piece, config)
        if full is None or rng.random() < 0.03:
            full = _json(wa.share(full=True))
        elif rng.random() < 0.3:
            wa.share(full=False)  # a checkpoint overwritten by the next
    assert full is not None
    # A is killed right after its last checkpoint: a delta of its last full share (or, now and then, a full share)
    delta = _json(wa.share(full=False)) if seed % 4 else None
    if delta is None:
        full = _json(wa.share(full=True))
    expected = _content(wa.share(full=True))
    assert expected["buckets"] and any(k[0] == "sessions" for k in expected)  # something to lose
    assert any(k[0] == "final" for k in expected) and any(k[0] == "verdicts" for k in expected)
    if behaviour:  # the sessions' cells: GAUC, QueriesPerSession and Reformulation, the last two counted
        assert any(k[0] == "sessions" and len(v[0]) == 3 and v[0][1] and v[0][2] for k, v in expected.items())
    if seed % 4:
        assert full["watermark"] < delta["watermark"]  # type: ignore[index]  # the delta is needed

    # B: the engine's counted state as A's (restored by the caller: here B reads what A read, without windows),
    # groups numbered otherwise; its windows from the shares only
    b = Engine(config)
    for key in reversed(a.group_keys):
        b.group_of(*key)
    assert b.group_keys != a.group_keys
    for piece in pieces[:cut]:
        _feed(b, piece, config)
    wb = RollingWindows(b, width=WIDTH)
    wb.restore(full, delta)
    assert wb.open_rows == 0
    assert _content(wb.share(full=True)) == expected  # bit for bit: the finalised part is A's
    b.process([])  # the first unmuted advance: B's open requests enter its windows
    assert wb.open_rows == wa.open_rows > 0
    _assert_same_windows(wa, wb)
    for k, piece in enumerate(pieces[cut:]):
        _feed(a, piece, config)
        _feed(b, piece, config)
        if k % 3 == 0:
            _assert_same_windows(wa, wb)
    a.flush()
    b.flush()
    assert wa.open_rows == wb.open_rows == 0
    _assert_same_windows(wa, wb)


def _halves(most: int = 300) -> tuple[list[bytes], int]:
    """The simulated log in pieces, and the middle piece."""
    pieces = _pieces(list(simulate_lines(SIMULATION)), random.Random(SIMULATION.seed), most)
    return pieces, len(pieces) // 2


def test_a_share_round_trips_through_orjson_bit_for_bit() -> None:
    pieces, cut = _halves()
    a, b = Engine(CONFIG), Engine(CONFIG)
    wa = RollingWindows(a, width=WIDTH)
    for piece in pieces[:cut]:
        _feed(a, piece)
    for key in a.group_keys:  # the groups numbered as A's (the windows number them as requests open, not finalise)
        b.group_of(*key)
    for piece in pieces[:cut]:
        _feed(b, piece)
    share = wa.share(full=True)
    data = orjson.dumps(share)
    assert orjson.loads(data) == share
    wb = RollingWindows(b, width=WIDTH)
    wb.restore(orjson.loads(data))
    again, restored = wa.share(full=True), wb.share(full=True)
    assert again.pop("id") != restored.pop("id")
    assert restored == again  # arrays as base64 of their bytes: equal strings are equal floats
    assert restored["final"]["bucket"] and restored["sessions"]["bucket"] and restored["verdicts"]


@pytest.mark.slow
def test_a_delta_is_much_smaller_than_a_full_share_on_a_long_log() -> None:
    """The default windows (5m and 1h in 360 buckets of 10 s) over 70 minutes of traffic."""
    config = Config(attribution_window=60.0, allowed_lateness=10.0, session_gap=60.0, gsb_window=60.0)
    sim = replace(SIMULATION, requests=4300, rate=1.0, seed=7, late_fraction=0.0)  # late feedback ends the log
    pieces = _pieces(list(simulate_lines(sim)), random.Random(7), most=40)
    a, b = Engine(config), Engine(config)
    wa = RollingWindows(a)
    assert wa.width == 10.0
    sizes: list[tuple[int, int]] = []
    full: dict[str, Any] = {}
    last = -math.inf
    for piece in pieces:
        _feed(a, piece, config)
        _feed(b, piece, config)
        if wa.watermark >= last + 60.0:  # a full share every minute of event time, a delta for each piece
            full, last = _json(wa.share(full=True)), wa.watermark
            full_bytes = len(orjson.dumps(full))
        else:
            sizes.append((len(orjson.dumps(wa.share(full=False))), full_bytes))
    delta = _json(wa.share(full=False))
    assert len(full["buckets"]) > 300
    late = sizes[len(sizes) // 2 :]
    assert max(d for d, _ in late) * 5 < min(f for _, f in late)
    assert sum(d for d, _ in late) * 20 < sum(f for _, f in late)
    wb = RollingWindows(b)
    wb.restore(full, delta)
    assert _content(wb.share(full=True)) == _content(wa.share(full=True))


@pytest.mark.slow
def test_the_new_owner_goes_on_with_deltas_of_the_full_share_it_restored() -> None:
    """B, restored from A's full share and delta, stores deltas of that full share: they hold what A's delta held
    and what B changed since, and drop the buckets of the full share that left the windows."""
    pieces, _ = _halves(most=60)
    first, second = len(pieces) // 5, len(pieces) // 2
    a, b = Engine(CONFIG), Engine(CONFIG)
    wa = RollingWindows(a, width=WIDTH)

    def feed(part: list[bytes]) -> None:
        for piece in part:
            _feed(a, piece)
            _feed(b, piece)

    def restored(delta: dict[str, Any]) -> dict[Any, Any]:
        engine = Engine(CONFIG)
        for piece in pieces[:done]:
            _feed(engine, piece)
        windows = RollingWindows(engine, width=WIDTH)
        windows.restore(full, delta)
        return _content(windows.share(full=True))

    feed(pieces[:first])
    full = _json(wa.share(full=True))
    feed(pieces[first:second])
    delta = _json(wa.share(full=False))
    wa.share(full=True)  # from here A's deltas tell what changed since the restore
    wb = RollingWindows(b, width=WIDTH)
    wb.restore(full, delta)
    b.process([])
    done = second + 5
    feed(pieces[second:done])
    later = _json(wb.share(full=False))
    assert later["base"] == full["id"]
    kept = {bucket for bucket in delta["buckets"] if bucket >= later["floor"]}
    assert kept <= set(later["buckets"])
    assert kept - set(wa.share(full=False)["buckets"])  # buckets B's delta has only from A's
    assert restored(later) == _content(wa.share(full=True))  # (a full share of B's would start its deltas afresh)
    done = len(pieces)
    feed(pieces[second + 5 :])
    last = _json(wb.share(full=False))
    assert last["base"] == full["id"] and last["floor"] > max(full["buckets"])  # the full share's buckets left
    assert restored(last) == _content(wb.share(full=True)) == _content(wa.share(full=True))


def test_shares_that_do_not_fit_are_refused() -> None:
    pieces, cut = _halves()
    a = Engine(CONFIG)
    wa = RollingWindows(a, width=WIDTH)
    with pytest.raises(ValueError, match="full share"):
        wa.share(full=False)  # no full share to build on
    for piece in pieces[:cut]:
        _feed(a, piece)
    old = _json(wa.share(full=True))
    old_delta = _json(wa.share(full=False))
    _feed(a, pieces[cut])
    new = _json(wa.share(full=True))
    new_delta = _json(wa.share(full=False))

    def fresh(width: float = WIDTH, config: Any = CONFIG) -> RollingWindows:
        return RollingWindows(Engine(config), width=width)

    with pytest.raises(ValueError, match="full share"):
        fresh().restore(new_delta)
    with pytest.raises(ValueError, match="not a change of this full share"):
        fresh().restore(new, old_delta)  # a delta older than the full share
    with pytest.raises(ValueError, match="not a change of this full share"):
        fresh().restore(old, new_delta)  # a delta of a later full share
    with pytest.raises(ValueError, match="not a change of this full share"):
        fresh().restore(old, new)
    with pytest.raises(ValueError, match="buckets of"):
        fresh(width=5.0).restore(new, new_delta)
    with pytest.raises(ValueError, match="metrics"):
        fresh(config=replace(CONFIG, cutoffs=(5, 10))).restore(new, new_delta)
    with pytest.raises(ValueError, match="format"):
        fresh().restore({**new, "version": 99})
    with pytest.raises(ValueError, match="fresh windows"):
        wa.restore(new, new_delta)  # these hold open requests and final values
    windows = fresh()
    windows.restore(new, new_delta)
    with pytest.raises(ValueError, match="fresh windows"):
        windows.restore(new, new_delta)  # restored once already


def test_an_empty_share_restores_empty_windows() -> None:
    a = RollingWindows(Engine(CONFIG), width=WIDTH)
    full = _json(a.share(full=True))
    assert full["watermark"] is None and full["current"] is None and not full["buckets"]
    b = RollingWindows(Engine(CONFIG), width=WIDTH)
    b.restore(full, _json(a.share(full=False)))
    assert b.watermark == -math.inf and b.snapshot() == {} and b.verdicts() == {}
    assert _content(b.share(full=True)) == _content(full)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_windows_read_now_and_then_hold_what_windows_refreshed_after_every_batch_hold(seed: int) -> None:
    """The open requests are re-evaluated when the windows are read, not after every batch (``sync``): read at
    random moments, they show what windows evaluated after every batch show, up to the order of additions."""
    lines = list(simulate_lines(replace(SIMULATION, seed=seed)))
    rng = random.Random(seed)
    every, lazy = Engine(CONFIG), Engine(CONFIG)
    eager, late = RollingWindows(every, width=WIDTH), RollingWindows(lazy, width=WIDTH)
    reads = 0
    for piece in _pieces(lines, rng):
        _feed(every, piece)
        eager.sync()  # as every batch did before
        _feed(lazy, piece)
        if rng.random() < 0.1:
            reads += 1
            assert _sums(late) == approx(_sums(eager))
            assert late.open_rows == eager.open_rows
    assert reads > 5
    assert _sums(late) == approx(_sums(eager))
    for engine in (every, lazy):
        engine.flush()
    assert _sums(late) == approx(_sums(eager))
    assert late.open_rows == eager.open_rows == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_windows_read_without_their_open_requests_re_evaluated_catch_up_at_the_next_sync(seed: int) -> None:
    """Read without re-evaluating the open requests (``snapshot(sync=False)``: a busy worker's periodic readouts),
    the windows lag by the open requests' changes only: the next read that re-evaluates them, and the finalisation
    of everything, show what windows re-evaluated after every batch show."""
    lines = list(simulate_lines(replace(SIMULATION, seed=seed)))
    rng = random.Random(seed)
    every, lazy = Engine(CONFIG), Engine(CONFIG)
    eager, skipping = RollingWindows(every, width=WIDTH), RollingWindows(lazy, width=WIDTH)
    stale = synced = 0
    for piece in _pieces(lines, rng):
        _feed(every, piece)
        eager.sync()
        _feed(lazy, piece)
        if rng.random() < 0.3:  # a readout that leaves the open requests as last evaluated
            stale += _sums(eager) != approx({key: list(value) for key, value in skipping.snapshot(sync=False).items()})
        if rng.random() < 0.05:
            synced += 1
            assert _sums(skipping) == approx(_sums(eager))
    assert stale > 0 and synced > 2  # (the reads without a sync did lag)
    for engine in (every, lazy):
        engine.flush()
    assert {key: list(value) for key, value in skipping.snapshot(sync=False).items()} == approx(_sums(eager))
    assert skipping.open_rows == eager.open_rows == 0
