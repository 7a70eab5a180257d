"""The join of rankings and feedback (``stream_eval.events.join``): a state machine on event time.

Settings used throughout: attribution window 10 s, allowed lateness 5 s, so a request served at ``t`` is
finalised when the watermark reaches ``t + 15``, and feedback waiting for a ranking expires at ``ts + 15``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from typing import Any
from unittest.mock import patch

import numba as nb
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from support import AbstractTimeConfig as Config

from stream_eval.engine.engine import Engine
from stream_eval.events import compiled
from stream_eval.events import join as join_module
from stream_eval.events.join import EventCounts, Finalised, Join
from stream_eval.events.schema import CompactRanking, Feedback, Ranking, item_list, validate

WINDOW = 10.0
LATENESS = 5.0
HORIZON = WINDOW + LATENESS
CONFIG = Config(attribution_window=WINDOW, allowed_lateness=LATENESS)


def rank(rid: str, ts: float, items: Iterable[str] = ("a", "b", "c")) -> Ranking:
    return Ranking(rid, list(items), ts=float(ts))


def click(rid: str, item: str, ts: float, kind: str = "click", grade: float | None = None) -> Feedback:
    event = Feedback(rid, item, kind=kind, grade=grade, ts=float(ts))
    validate(event, CONFIG)  # a click without grade gets grade 1
    return event


#: Key of a request's grades of judged items that were not served (only their grades count, not their names).
NOT_SERVED = "(not served)"


class Driver:
    """Feeds a Join the way the engine does, one event per :meth:`Join.add`: the watermark is the max event ts
    seen so far. An event's status (``ok``, ``late``, ``duplicate``, ``orphan``; ``pending`` for feedback that
    waits) is read from the counts it moved.

    ``eager`` calls :meth:`Join.advance` after every event; otherwise the watermark is only recorded (as
    :meth:`Engine.process` does inside a chunk) and ``advance`` runs once, at :meth:`finish`.
    """

    def __init__(self, config: Config = CONFIG, eager: bool = True) -> None:
        self.counts = EventCounts()
        self.join = Join(config, self.counts)
        self.eager = eager
        # each request finalised, its served items and its grades (by item; those not served as NOT_SERVED)
        self.finalised: list[tuple[CompactRanking, list[str], dict[str, object]]] = []
        self.statuses: list[str] = []
        self._items: dict[int, list[str]] = {}  # the items of each ranking given to the join (it keeps them as bytes)

    def take(self, finalised: Finalised) -> None:
        unshown = finalised.unshown_grades()
        for ranking, grades, others in zip(finalised.rankings, finalised.shown_grades(), unshown, strict=True):
            items = self._items[id(ranking)]
            named: dict[str, object] = {items[position - 1]: grade for position, grade in grades.items()}
            self.finalised.append((ranking, items, {**named, NOT_SERVED: others} if others else named))

    def __call__(self, *events: Ranking | Feedback) -> list[str]:
        out = []
        for event in events:
            kind = "ranking" if isinstance(event, Ranking) else "feedback"
            before = {status: self.counts[kind, status] for status in ("ok", "late", "duplicate", "orphan")}
            if isinstance(event, Ranking):
                event = CompactRanking.of(event)
                self._items[id(event)] = item_list(event.items)
            self.join.add([event], np.array([self.join.watermark]))
            moved = [status for status, n in before.items() if self.counts[kind, status] > n]
            out.append(moved[0] if moved else "pending")
            ts: float = event.ts  # type: ignore[assignment]
            if self.eager:
                self.take(self.join.advance(ts))
            elif ts > self.join.watermark:
                self.join.watermark = ts
        self.statuses += out
        return out

    def finish(self) -> dict[str, dict[str, object]]:
        self.end()
        return self.grades()

    def end(self) -> None:
        self.take(self.join.advance(self.join.watermark))
        self.take(self.join.flush())

    def items(self, rid: str) -> list[list[str]]:
        """The served items of each finalised request with this id, in order."""
        return [items for ranking, items, _ in self.finalised if ranking.request_id == rid]

    def grades(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {}
        for ranking, _, grades in self.finalised:
            rid = ranking.request_id
            # A request_id may come back as a new request once the first is forgotten (see join.py).
            key = rid if rid not in out else f"{rid}#{sum(k.split('#')[0] == rid for k in out) + 1}"
            out[key] = grades
        return out

    def feedback_counts(self) -> dict[str, int]:
        return {status: n for (kind, status), n in self.counts.items() if kind == "feedback" and n}


def test_feedback_before_ranking_waits_then_applies() -> None:
    run = Driver()
    assert run(click("r1", "b", 5)) == ["pending"]
    assert run.join.pending and not run.feedback_counts()
    assert run(rank("r1", 1)) == ["ok"]
    assert not run.join.pending
    assert run.feedback_counts() == {"ok": 1}
    assert run.finish() == {"r1": {"b": 1.0}}


def test_feedback_before_ranking_with_its_ts_earlier_than_serve_time() -> None:
    run = Driver()
    run(click("r1", "a", 3), rank("r1", 4))
    assert run.finish() == {"r1": {"a": 1.0}}


def test_grade_is_the_max_over_feedback() -> None:
    run = Driver()
    run(rank("r1", 0))
    run(click("r1", "a", 1, "label", 2.0), click("r1", "a", 2), click("r1", "a", 3, "label", 3.0),
        click("r1", "a", 4, "label", 1.0), click("r1", "b", 5, "label", 0.0), click("r1", "c", 6))
    run(click("r1", "z", 6, "label", 2.0))  # judged, not shown: kept (it counts in R and IDCG)
    assert run.feedback_counts() == {"ok": 7}
    # b is judged non-relevant (grade 0): kept, for Judged@k and the RBP residual
    assert run.finish() == {"r1": {"a": 3.0, "b": 0.0, "c": 1.0, NOT_SERVED: [2.0]}}


def test_late_by_attribution_window() -> None:
    run = Driver()
    run(rank("r1", 100))
    assert run(click("r1", "a", 110)) == ["ok"]  # exactly the window: still counts
    assert run(click("r1", "b", 110.5)) == ["late"]
    assert run.feedback_counts() == {"ok": 1, "late": 1}
    assert run.finish() == {"r1": {"a": 1.0}}


def test_late_by_window_even_when_it_arrived_before_its_ranking() -> None:
    run = Driver()
    run(click("r1", "a", 20), rank("r1", 6))  # (6 + 15 > 20: the ranking itself is in time)
    assert run.feedback_counts() == {"late": 1}
    assert run.finish() == {"r1": {}}


def test_a_ranking_past_its_own_finalisation_point_is_late() -> None:
    """A ranking that comes once event time has passed its serve time + window + lateness is late: counted, and left
    out of the metrics, as late feedback is. It was counted ok and finalised at once, a request with little or no
    feedback (what waited for it given up by then): a log whose rankings lag their feedback by more than the
    horizon read as a collapse of every metric, with nothing but the orphans to say why. It still opens its request
    (remembered: feedback after it is late, a ranking of its id a duplicate), which is never handed over."""
    for eager in (True, False):
        run = Driver(eager=eager)
        assert run(click("r1", "a", 20)) == ["pending"]
        assert run(rank("r1", 5)) == ["late"]  # 5 + 15 <= 20; its waiting click, 15 s after it, is late
        assert run(rank("r2", 6)) == ["ok"]  # in time: 6 + 15 > 20
        assert run(rank("r2", 1)) == ["duplicate"]  # a duplicate first, however late
        assert run(rank("r3", 4.5)) == ["late"]
        assert run(click("r3", "a", 12)) == ["late"]  # feedback of a late ranking's request
        assert run(rank("r1", 7)) == ["duplicate"]
        assert run.counts["ranking", "late"] == 2 and run.counts["ranking", "ok"] == 1
        assert run.finish() == {"r2": {}}
        assert run.feedback_counts() == {"late": 2}


def test_late_after_finalisation() -> None:
    for eager in (True, False):
        run = Driver(eager=eager)
        run(rank("r1", 0), rank("r2", 15))  # watermark 15 = r1's finalisation point
        assert run(click("r1", "a", 3)) == ["late"]  # within the window, but out of order beyond lateness
        assert run(click("r2", "a", 16)) == ["ok"]
        assert run.feedback_counts() == {"late": 1, "ok": 1}
        assert run.finish() == {"r1": {}, "r2": {"a": 1.0}}


def test_allowed_lateness_lets_moderately_out_of_order_feedback_count() -> None:
    events = [rank("r1", 0), rank("r2", 12), click("r1", "a", 8)]  # 4 s out of order
    run = Driver()
    assert run(*events) == ["ok", "ok", "ok"]
    assert run.finish()["r1"] == {"a": 1.0}
    strict = Driver(Config(attribution_window=WINDOW, allowed_lateness=0.0))
    assert strict(*events) == ["ok", "ok", "late"]
    assert strict.finish()["r1"] == {}


def test_finalisation_point() -> None:
    run = Driver()
    run(rank("r1", 0))
    assert not len(run.join.advance(14.999))
    finalised = run.join.advance(15.0)
    assert [r.request_id for r in finalised.rankings] == ["r1"]
    assert not len(run.join.advance(1000.0))


def test_finalisation_point_inside_a_second() -> None:
    """Open requests are kept by the whole second of their finalisation point: event time stopping inside
    that second finalises the ones due by then and keeps the rest, whose feedback still counts."""
    run = Driver()
    run(rank("r1", 0.5), rank("r2", 0.1))
    assert [r.request_id for r in run.join.advance(15.2).rankings] == ["r2"]
    assert run(click("r1", "a", 3.0)) == ["ok"]  # out of order, inside the window and not final yet
    finalised = run.join.advance(15.5)
    assert [r.request_id for r in finalised.rankings] == ["r1"] and finalised.shown_grades() == [{1: 1.0}]


def test_session_close_point_inside_a_second() -> None:
    """A named session closes when event time passes its last request's finalisation point + session_gap,
    to the fraction of a second: a request finalised just before that joins it, one just after starts a new
    session. Each request alone has both classes, so the session count says which happened."""
    config = Config(attribution_window=WINDOW, allowed_lateness=LATENESS, session_gap=5.0)

    def session_count(second_ts: float) -> int:
        engine = Engine(config)
        a = Ranking("a", ["x", "y"], ts=0.5, session_id="s")  # finalised at 15.5: the session closes at 20.5
        b = Ranking("b", ["x", "y"], ts=second_ts, session_id="s")
        engine.process([a, click("a", "x", 1.0), b, click("b", "x", second_ts + 1)], event_time=False)
        for watermark in (20.3, 20.45, 20.7):  # a is finalised at 20.3; its session is open until 20.5
            engine.advance(watermark)
        engine.flush()
        return engine.report()["overall"]["sessions"]

    assert session_count(5.4) == 1  # b finalised at 20.4, before the session closed at 20.5: joins it
    assert session_count(5.6) == 2  # finalised at 20.6, after: a session of its own


def test_duplicate_feedback() -> None:
    run = Driver()
    run(rank("r1", 0))
    assert run(click("r1", "a", 1), click("r1", "a", 2)) == ["ok", "duplicate"]  # a double click
    assert run(click("r1", "a", 3, "label", 2.0), click("r1", "a", 4, "label", 2.0)) == ["ok", "duplicate"]
    assert run(click("r1", "a", 5, "label", 1.0)) == ["ok"]  # label grade 1 is not the click grade 1
    assert run(click("r1", "a", 6, "click", 2.0)) == ["ok"]  # other grade
    assert run.feedback_counts() == {"ok": 4, "duplicate": 2}
    assert run.finish() == {"r1": {"a": 2.0}}


def test_duplicate_feedback_while_waiting_for_its_ranking() -> None:
    run = Driver()
    run(click("r1", "a", 1), click("r1", "a", 1), rank("r1", 0))
    assert run.feedback_counts() == {"ok": 1, "duplicate": 1}


def test_duplicate_ranking_first_stands() -> None:
    run = Driver()
    assert run(rank("r1", 0, ["a", "b"])) == ["ok"]
    assert run(rank("r1", 1, ["x", "y"])) == ["duplicate"]
    assert run(click("r1", "x", 2), click("r1", "b", 3)) == ["ok", "ok"]
    run.finish()
    [(ranking, items, grades)] = run.finalised
    assert items == ["a", "b"] and ranking.ts == 0.0
    assert grades == {"b": 1.0, NOT_SERVED: [1.0]}  # x was served by the duplicate only
    assert run.counts["ranking", "ok"] == 1 and run.counts["ranking", "duplicate"] == 1


def test_duplicate_ranking_after_finalisation() -> None:
    run = Driver()
    run(rank("r1", 0, ["a"]), rank("r2", 20), rank("r1", 21, ["z"]))
    assert run.statuses == ["ok", "ok", "duplicate"]
    assert set(run.finish()) == {"r1", "r2"}


def test_orphan_after_expiry() -> None:
    run = Driver()
    assert run(click("rX", "a", 10)) == ["pending"]
    run.join.advance(24.9)
    assert run.feedback_counts() == {}
    run.join.advance(25.0)  # ts + window + lateness
    assert run.feedback_counts() == {"orphan": 1}
    assert not run.join.pending
    assert run(rank("rX", 11)) == ["ok"]  # too late for its waiting feedback: nothing is applied
    assert run.finish() == {"rX": {}}
    assert run.feedback_counts() == {"orphan": 1}


def test_orphan_when_its_ranking_arrives_after_expiry_without_advance() -> None:
    run = Driver(eager=False)
    run(click("rX", "a", 10), rank("rY", 40), rank("rX", 30))
    assert run.feedback_counts() == {"orphan": 1}
    assert run.finish() == {"rX": {}, "rY": {}}


def test_orphan_expiry_keeps_younger_feedback_waiting() -> None:
    run = Driver()
    run(click("rX", "a", 10), click("rX", "b", 20))
    run.join.advance(26.0)
    assert run.feedback_counts() == {"orphan": 1}
    run(rank("rX", 19))
    assert run.feedback_counts() == {"orphan": 1, "ok": 1}
    assert run.finish() == {"rX": {"b": 1.0}}


def test_orphan_at_flush() -> None:
    run = Driver()
    run(rank("r1", 0), click("rX", "a", 1), click("rX", "b", 2), click("rY", "a", 3))
    assert run.feedback_counts() == {}
    assert run.finish() == {"r1": {}}
    assert run.feedback_counts() == {"orphan": 3}
    assert not run.join.pending and not run.join.open_slots().size


def test_advance_never_moves_back() -> None:
    run = Driver()
    run.join.advance(100.0)
    run.join.advance(50.0)
    assert run.join.watermark == 100.0


def test_flush_finalises_in_deadline_order() -> None:
    run = Driver(eager=False)
    run(rank("r3", 30), rank("r1", 16), rank("r2", 20))  # (16 + 15 > 30: in time)
    assert [r.request_id for r in run.join.flush().rankings] == ["r1", "r2", "r3"]


# -- lazy finalisation is exact -----------------------------------------------------------------------------

RIDS = ["r0", "r1", "r2", "r3"]
ITEMS = ["a", "b", "c", "d", "e"]


@st.composite
def logs(draw: st.DrawFn, max_ts: float = 80.0) -> list[Ranking | Feedback]:
    """Small logs: a few requests, feedback on shown and unshown items, random out-of-order ts."""
    events: list[Ranking | Feedback] = []
    for _ in range(draw(st.integers(0, 30))):
        rid = draw(st.sampled_from(RIDS))
        ts = draw(st.integers(0, int(max_ts * 2)).map(lambda t: t / 2))
        if draw(st.integers(0, 3)) == 0:
            items = draw(st.lists(st.sampled_from(ITEMS), min_size=1, max_size=4, unique=True))
            events.append(rank(rid, ts, items))
        else:
            item = draw(st.sampled_from(ITEMS))
            kind, grade = draw(st.sampled_from([("click", None), ("click", None), ("label", 0.0), ("label", 1.0),
                                                ("label", 2.0), ("label", 3.0)]))
            events.append(click(rid, item, ts, kind, grade))
    return events


def _copy(events: list[Ranking | Feedback]) -> list[Ranking | Feedback]:
    return [rank(e.request_id, e.ts, e.items) if isinstance(e, Ranking)  # type: ignore[arg-type]
            else click(e.request_id, e.item, e.ts, e.kind, e.grade) for e in events]  # type: ignore[arg-type]


def _run(events: list[Ranking | Feedback], eager: bool) -> Driver:
    run = Driver(eager=eager)
    run(*_copy(events))
    run.end()
    return run


def _check_counts_add_up(run: Driver, events: list[Ranking | Feedback]) -> None:
    n_feedback = sum(isinstance(e, Feedback) for e in events)
    counts = run.feedback_counts()
    assert set(counts) <= {"ok", "late", "duplicate", "orphan"}
    assert sum(counts.values()) == n_feedback, counts
    n_ranking = sum(isinstance(e, Ranking) for e in events)
    assert run.counts["ranking", "ok"] + run.counts["ranking", "duplicate"] + run.counts["ranking", "late"] == n_ranking
    assert len(run.finalised) == run.counts["ranking", "ok"]
    assert not run.join.pending and not run.join.open_slots().size


def _compare(events: list[Ranking | Feedback]) -> None:
    eager, lazy = _run(events, True), _run(events, False)
    _check_counts_add_up(eager, events)
    _check_counts_add_up(lazy, events)
    assert lazy.grades() == eager.grades()
    assert {r.request_id: items for r, items, _ in lazy.finalised} == {
        r.request_id: items for r, items, _ in eager.finalised}
    assert lazy.counts == eager.counts


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(logs(max_ts=2 * HORIZON - 1))
def test_lazy_finalisation_equals_eager_within_two_horizons(events: list[Ranking | Feedback]) -> None:
    """Logs spanning less than two horizons of event time (closed requests are still remembered)."""
    _compare(events)


# no shrinking (it takes seconds): the shrunk counterexamples are written out as the tests further below
@pytest.mark.slow
@settings(max_examples=150, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(logs(max_ts=80.0))
def test_lazy_finalisation_equals_eager(events: list[Ranking | Feedback]) -> None:
    """``advance`` after every event or only at the end (then flush): same grades, same counts."""
    _compare(events)


@settings(max_examples=100, deadline=None)
@given(logs(max_ts=80.0), st.integers(1, 7))
def test_counts_add_up_with_advance_every_few_events(events: list[Ranking | Feedback], every: int) -> None:
    run = Driver(eager=False)
    for start in range(0, len(events), every):
        run(*_copy(events[start : start + every]))
        run.take(run.join.advance(run.join.watermark))
    run.end()
    _check_counts_add_up(run, events)


# The two examples below are the shrunk failures of test_lazy_finalisation_equals_eager, written out.


def test_feedback_for_a_forgotten_request_is_an_orphan_whenever_advance_runs() -> None:
    """A click 40 s after serve time (window 10 s, lateness 5 s): the request was finalised at 15 and
    forgotten at 30, so the click waits as if its ranking never came and ends as an orphan, whether
    ``advance`` runs after every event or only at the end."""
    events = [rank("r1", 0), rank("r2", 40), click("r1", "a", 40)]
    lazy, eager = _run(events, False), _run(events, True)
    assert lazy.feedback_counts() == {"orphan": 1}
    assert eager.feedback_counts() == {"orphan": 1}


def test_feedback_for_a_remembered_finalised_request_is_late() -> None:
    events = [rank("r1", 0), rank("r2", 20), click("r1", "a", 20)]  # finalised at 15, remembered until 30
    for eager in (False, True):
        assert _run(events, eager).feedback_counts() == {"late": 1}


def test_duplicate_ranking_while_remembered_is_a_duplicate() -> None:
    """docs/contract.md §1: a ranking whose request_id was already seen is a duplicate; the first one stands."""
    events = [rank("r1", 0, ["a"]), rank("r2", 20), rank("r1", 20, ["z"]), click("r1", "z", 21)]
    for eager in (False, True):
        run = _run(events, eager)
        assert run.counts["ranking", "duplicate"] == 1, f"eager={eager}"
        assert run.items("r1") == [["a"]]


def test_ranking_repeated_after_memory_ends_is_a_new_request_whenever_advance_runs() -> None:
    """Memory is bounded: past ``deadline + attribution_window + allowed_lateness`` a repeated id is new."""
    events = [rank("r1", 0, ["a"]), rank("r2", 40), rank("r1", 40, ["z"]), click("r1", "z", 41)]
    for eager in (False, True):
        run = _run(events, eager)
        assert run.counts["ranking", "duplicate"] == 0, f"eager={eager}"
        assert run.items("r1") == [["a"], ["z"]]


def test_engine_numbers_do_not_depend_on_how_events_are_batched() -> None:
    """The same log through :meth:`Engine.process` in one call (one replay chunk) and one event per call
    (as a stream worker would): the reports must be equal."""
    config = Config(attribution_window=WINDOW, allowed_lateness=LATENESS)
    log = [rank("r1", 0, ["a", "b"]), click("r1", "b", 1), rank("r2", 40, ["a", "b"]), click("r1", "a", 40),
           rank("r1", 41, ["b", "a"]), click("r1", "b", 42), click("r2", "a", 43)]
    whole, single = Engine(config), Engine(config)
    whole.process(_copy(log))
    for event in _copy(log):
        single.process([event])
    whole.flush()
    single.flush()
    assert single.report()["events"] == whole.report()["events"]
    assert single.report() == whole.report()
    # r1 (RR 1/2) is forgotten at 30; the r1 served at 41 is a new request (RR 1), r2 has RR 1.
    assert math.isclose(whole.report()["overall"]["metrics"]["MRR"], (0.5 + 1.0 + 1.0) / 3)


def test_duplicates_detected_past_the_short_list_of_seen_feedback() -> None:
    """Many feedback keys on one request, of two kinds: every repeat is caught."""
    run = Driver()
    items = [f"i{k}" for k in range(20)]
    run(rank("r1", 0, items))
    first = run(*[click("r1", item, 1) for item in items], *[click("r1", item, 1, "label", 2.0) for item in items])
    again = run(*[click("r1", item, 2) for item in items], *[click("r1", item, 2, "label", 2.0) for item in items])
    assert first == ["ok"] * 40 and again == ["duplicate"] * 40
    assert run.finish()["r1"] == {item: 2.0 for item in items}


def test_duplicate_feedback_never_confuses_items_that_contain_one_another() -> None:
    """An item that is a prefix, a suffix or a part of another, or holds a quote or the separator of compact
    item lists, is never taken for another, before and after feedback of another kind arrives."""
    run = Driver()
    plain, quoted = ["ab", "a", "b", "", "a,b"], ['a","b', '","']
    run(rank("r1", 0, plain + quoted))
    assert run(*[click("r1", item, 1) for item in plain]) == ["ok"] * 5
    assert run(*[click("r1", item, 2) for item in reversed(plain)]) == ["duplicate"] * 5
    assert run(*[click("r1", item, 3) for item in quoted]) == ["ok"] * 2
    assert run(*[click("r1", item, 4) for item in plain + quoted]) == ["duplicate"] * 7
    assert run(click("r1", "a", 5, "label", 2.0), click("r1", "a", 6, "label", 2.0)) == ["ok", "duplicate"]
    assert run.feedback_counts() == {"ok": 8, "duplicate": 13}
    assert run.finish()["r1"] == {**{item: 1.0 for item in plain + quoted}, "a": 2.0}


def _held_bytes(join: Join) -> int:
    """Bytes of the join's arrays and buffers (its columns, tables, rows and byte buffers)."""
    arrays = [value for value in vars(join).values() if isinstance(value, np.ndarray)]
    arrays += [join._ids.data, join._texts.data, join._unshown_items.data]
    arrays += [column for parts in join._rows.values() for part in parts for column in part]
    return sum(array.nbytes for array in arrays)


@pytest.mark.slow
def test_memory_does_not_grow_with_finished_requests() -> None:
    """In steady state (one request a second, each finalised 15 s later) what the join holds stays the same
    whether 4,000 or 8,000 requests have been finalised: labels on items not served, duplicates and clicks.
    (Slots are dropped TRIM at a time and item texts once they pass TEXT_CUT bytes: both made small here, so
    that the steady state comes within the test.)"""
    with patch.multiple(join_module, TRIM=64, TEXT_CUT=0):
        run = Driver()
        held = []
        for second in range(8000):
            events = [rank(f"r{second}", second, ["a", "b", "c"]), click(f"r{second}", "b", second),
                      click(f"r{second}", "b", second)]
            events += [click(f"r{second}", f"other{k}", second, "label", 2.0) for k in range(3)]
            run(*events)
            if second in (3999, 7999):
                held.append(_held_bytes(run.join))
    assert held[1] <= held[0] * 1.05, held



@pytest.mark.slow
def test_the_join_arrays_are_sized_by_the_requests_held() -> None:
    """The join's columns grow only when no finalised and forgotten slot can be dropped to make room: at an
    uneven rate (0 to 3 requests a second), their capacity stays within one growth step of the requests open
    or remembered at once, plus one block of slots that are dropped together. (Trimming only when the arrays had
    doubled let a peak of arrivals just after a trim push them a growth step further: 2,294 slots here, against
    1,529 now.)"""
    rng = random.Random(7)
    config = Config(attribution_window=300.0, allowed_lateness=0.0)
    memory = 2 * (config.attribution_window + config.allowed_lateness)  # a slot is forgotten this long after it opens
    trim = 256  # slots dropped together
    with patch.multiple(join_module, TRIM=trim, TEXT_CUT=0, FIRST_CAPACITY=16):
        run = Driver(config)
        served: list[float] = []
        most_held = most_new = 0
        for second in range(12000):
            new = rng.choice([0, 1, 1, 2, 3])
            run(*[rank(f"r{len(served) + k}", second, ["a", "b"]) for k in range(new)])
            served += [float(second)] * new
            most_held = max(most_held, sum(1 for ts in served[-4 * int(memory):] if ts + memory > second))
            most_new = max(most_new, new)
        capacity = run.join._serve.shape[0]
    assert capacity <= 1.5 * (most_held + trim + most_new) + 2, (capacity, most_held)


def test_an_id_whose_hash_another_entry_shares_is_still_found() -> None:
    """find_ids takes the first entry with the key's hash as its candidate and compares bytes afterwards; an entry
    of another id with the same hash (forged here: two 64-bit hashes practically never collide) sends the key
    back to probing, which finds its own entry further on."""
    arena = np.frombuffer(b"ab", dtype=np.uint8)
    first, last = np.array([0, 1]), np.array([1, 2])  # slot 0 is "a", slot 1 is "b"
    table = compiled.empty_table(4)
    mask = table.shape[0] // 2 - 1
    h = int(np.int64(compiled._hash(arena, 1, 2)))  # the hash of "b"
    home = h & mask
    table[2 * home], table[2 * home + 1] = 0, h  # "a" filed under the hash of "b"
    table[2 * ((home + 1) & mask)], table[2 * ((home + 1) & mask) + 1] = 1, h
    keys = np.frombuffer(b"bac", dtype=np.uint8)
    found = compiled.find_ids(table, arena, first, last, 0, keys, np.array([0, 1, 2]), np.array([1, 2, 3]))
    assert found.tolist() == [1, -1, -1]  # "a" is only filed under another hash; "c" is not there


def test_due_times_beyond_int64_seconds_keep_their_order() -> None:
    """Deadlines are grouped by whole second with numpy; a time past 2**63 s (valid JSON, absurd) is grouped with
    Python's integers instead of wrapping around, so it is not due before its time."""
    due = join_module.DueBySecond[str]()
    due.add_many(np.array([1e19, 5.5, 5.2, 2e19]), ["far", "b", "a", "farther"])
    assert due.pop_due(6.0, lambda entry: {"far": 1e19, "b": 5.5, "a": 5.2, "farther": 2e19}[entry]) == ["b", "a"]
    assert due.pop_due(1.5e19, lambda entry: {"far": 1e19, "farther": 2e19}[entry]) == ["far"]


def test_rankings_read_after_their_feedback_are_late_not_empty_requests(tmp_path) -> None:
    """``stream-eval replay feedback.jsonl rankings.jsonl`` (files are read in the order given): the rankings come
    when event time is past their finalisation points. They were counted as requests without feedback, every metric
    at zero; now they are late rankings, and no request is evaluated."""
    import orjson

    from stream_eval.config import Config as Settings
    from stream_eval.engine.replay import replay
    from stream_eval.simulate import SimulationConfig, simulate_lines

    lines = list(simulate_lines(SimulationConfig(requests=300, seed=2, rate=0.05)))  # 300 requests over ~100 min
    log, rankings, feedback = tmp_path / "log.jsonl", tmp_path / "rankings.jsonl", tmp_path / "feedback.jsonl"
    log.write_bytes(b"".join(lines))
    rankings.write_bytes(b"".join(line for line in lines if orjson.loads(line)["type"] == "ranking"))
    feedback.write_bytes(b"".join(line for line in lines if orjson.loads(line)["type"] == "feedback"))
    right = replay([str(log)], Settings()).report()
    wrong = replay([str(feedback), str(rankings)], Settings()).report()
    assert right["events"]["late"] == 0 and right["overall"]["requests"] == 300
    requests = wrong["overall"]["requests"]  # (the first half hour's rankings are in time)
    assert requests < 100 and wrong["events"]["late"] >= 300 - requests  # (late: rankings and feedback)
    assert wrong["events"]["ranking"] == 300 and wrong["events"]["orphan"] > 0


@nb.njit
def _copy_bytes(target: Any, at: int, source: Any, start: int, size: int) -> None:
    compiled.copy_bytes(target, at, source, start, size)


@settings(max_examples=200, deadline=None)
@given(source=st.binary(max_size=64), target_size=st.integers(0, 64), at=st.integers(0, 64), start=st.integers(0, 64),
       size=st.integers(-3, 64))
def test_the_compiled_byte_copy_is_the_slice_assignment(source: bytes, target_size: int, at: int, start: int,
                                                        size: int) -> None:
    """``copy_bytes`` (one memcpy in the compiled loops: the join's arenas, the fetched and produced batches) writes
    what ``target[at:at + size] = source[start:start + size]`` writes, ranges within both arrays; a size of 0 or
    less writes nothing, as the empty slices did."""
    size = min(size, len(source) - start, target_size - at)
    target = np.arange(target_size, dtype=np.uint8)
    expected = target.copy()
    src = np.frombuffer(source, dtype=np.uint8)  # (read-only, as a fetched buffer is)
    if size > 0:
        expected[at:at + size] = src[start:start + size]
    _copy_bytes(target, at, src, start, size)
    assert target.tolist() == expected.tolist()
