"""Synthetic search traffic from a click model over items with known true relevance grades.

A pure generator (stdlib and numpy only, no I/O except :func:`write_jsonl`) of the events of docs/contract.md §1.
It feeds ``stream-eval simulate``, the demo, the benchmarks and the examples, and gives the tests a ground truth:
:func:`true_grades` returns the relevance every click and label is drawn from, so a better ranker must score
better, and :func:`true_effects` each arm's expected metrics (it alone runs the replay engine, imported when
called).

The world:

* ``queries`` query ids ``q0 .. q{Q-1}``, asked with a mild Zipf popularity (``q0`` most often). Each query
  has a judged pool of ``catalogue`` items ``q{q}-d{j}`` whose true grades ``0..max_grade`` are skewed toward
  0 (``P(g)`` proportional to ``r**g``, ``r`` drawn per query in ``[0.2, 0.8]``, so queries differ in how
  many relevant items they have).
* Arms are rankers of quality ``q``: ``score_j = q * grade_j + (1 - q) * u_j * max_grade`` (``u`` uniform);
  the served list is the top ``items_per_request`` (varied by ±25 %) of the pool. The exported ``scores`` are a
  sigmoid of that score with a per-request offset, rounded to 4 decimals (descending; ties are rare).
* Users come in sessions of on average ``sessions_per_user_requests`` consecutive requests; the arm is
  assigned per session (user-level bucketing, uniform over the arms). With ``interleaving``,
  :data:`INTERLEAVE_SHARE` of the sessions get team-draft interleaved lists of the first two arms
  (``arm="interleaved"``, ``teams`` filled).
* With ``unit="user"``, sessions belong to users who come back: a session starts a new user with probability
  ``1 / sessions_per_user``, else it is a returning user drawn uniformly from those seen so far. The arm is
  assigned per user (a new user takes the arm drawn for its first session; a returning user keeps it), and
  rankings carry ``"unit_id": "u{k}"``, the A/B randomisation unit. Off by default (no ``unit_id``, the arm
  per session): the output is then the same as before the option existed.
* Clicks: ``cascade`` (the user scans from the top, clicks an item of grade ``g`` with probability
  :func:`click_probabilities`, and after a click stops with probability :data:`CASCADE_STOP_AFTER_CLICK`)
  or ``pbm`` (position ``i`` is examined with probability ``1 / i``, an examined item is clicked with the
  same grade-dependent probability). Click delays grow down the list and are capped at ``max_delay``.
* Labels: ``label_rate`` of the requests get editorial ``label`` feedback with the true grades for 2-4 shown
  items and 1-2 judged items of the pool that were not shown (relevant ones preferred, as a pooled judging
  process would).
* Judgments (``judgments=True``): :data:`JUDGMENT_RATE` of the requests produce a side-by-side verdict for
  their query, ``good`` / ``bad`` more likely the larger the quality difference of treatment vs control.
  Control and treatment are the first two arms, ordered by name as the evaluator does by default (docs/contract.md §3).

Behaviour (``behaviour=True``; off by default, so that every existing output stays byte for byte): each click
carries a ``dwell`` drawn from the click model (exponential, mean :data:`DWELL_SHORT` seconds for an irrelevant item
up to :data:`DWELL_LONG` for the most relevant, along the same ERR satisfaction probability as the clicks), and
:data:`ZERO_RESULT_RATE` of the requests serve an empty list. A session's next request follows at once with
another query, so a request without a click of at least ``sat_dwell`` (30 s) counts as reformulated: the better
ranker has more satisfied clicks and fewer abandoned and reformulated requests (README, "Behaviour measures").

Faults for robustness tests: ``late_fraction`` (feedback beyond the 30 min attribution window),
``duplicate_fraction`` (feedback sent twice), ``orphan_fraction`` (extra feedback for request ids
``r{requests + k}`` that never get a ranking), ``invalid_fraction`` (malformed lines, only in
:func:`simulate_lines`) and ``shuffle_window`` (bounded out-of-order delivery).

:func:`true_effects` gives the ground truth of an A/B comparison: each arm's expected metrics under the click
model, by a seeded Monte-Carlo run of this generator through the replay engine. The true delta is what the
evaluator's A/B delta converges to: with ``unit="user"`` the arm's mean is a ratio of sums over users, which
estimates the same per-request mean.

Events are generated in chunks of :data:`CHUNK_REQUESTS` requests with vectorised numpy draws and emitted in
event-time order: an event is released once every event generated later is known to have a ts at least as
large (the serve time of the last request generated so far bounds them all), so only a chunk plus the
events of the delay (and shuffle) horizon are buffered. The output is deterministic for a given config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import gzip
import itertools
import math
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from numpy.typing import NDArray

if TYPE_CHECKING:
    from stream_eval.config import Config

__all__ = [
    "ATTRIBUTION_WINDOW",
    "CASCADE_STOP_AFTER_CLICK",
    "CHUNK_REQUESTS",
    "INTERLEAVED_ARM",
    "INTERLEAVE_SHARE",
    "JUDGMENT_RATE",
    "MAX_PREFERENCE",
    "TRUE_EFFECT_REQUESTS",
    "UNITS",
    "SimulationConfig",
    "click_probabilities",
    "simulate",
    "simulate_lines",
    "true_effects",
    "true_grades",
    "write_jsonl",
]

ATTRIBUTION_WINDOW = 1800.0
"""Seconds after serve time within which feedback counts (the default of docs/contract.md §1); late feedback lands
beyond it."""

CHUNK_REQUESTS = 10_000
"""Requests generated per vectorised step."""

INTERLEAVED_ARM = "interleaved"
"""The ``arm`` of team-draft interleaved requests."""

INTERLEAVE_SHARE = 0.25
"""Share of sessions served interleaved lists when ``interleaving`` is on."""

JUDGMENT_RATE = 0.05
"""Probability that a request produces a side-by-side ``judgment`` event when ``judgments`` is on."""

JUDGMENT_SAME = 0.3
"""Probability of a ``same`` verdict; the rest splits into good/bad by the arms' quality difference."""

CASCADE_STOP_AFTER_CLICK = 0.2
"""Probability that a cascade user stops scanning after a click (tuned for ~3.5 feedback per request)."""

CLICK_FLOOR = 0.12
"""Click probability of an examined irrelevant (grade 0) item: snippets attract some wrong clicks."""

DWELL_SHORT = 8.0
"""Mean dwell (seconds) after a click on an irrelevant (grade 0) item, with ``behaviour``."""

DWELL_LONG = 90.0
"""Mean dwell (seconds) after a click on an item of the highest grade, with ``behaviour``."""

ZERO_RESULT_RATE = 0.02
"""Share of requests that serve an empty list, with ``behaviour``."""

MAX_PREFERENCE = 50.0
"""The largest ``preference``: ``exp(preference * z)`` stays a float64 for every ``z`` a normal draw gives."""

N_SUBTOPICS = 6
"""Number of subtopics per query when ``subtopics`` is on (``t1 .. t6``)."""

QUERY_ZIPF = 0.7
"""Exponent of the query popularity (weight of the k-th query proportional to ``1 / k**QUERY_ZIPF``)."""

SCORE_STEPS = 10_000
"""Model scores are multiples of ``1 / SCORE_STEPS`` in ``[0, 1]`` (4 decimals)."""

_SCORE_VALUES: NDArray[np.object_] = np.array([k / SCORE_STEPS for k in range(SCORE_STEPS + 1)], dtype=object)
_NAME_TABLE_LIMIT = 2_000_000
_STREAM_GRADES = 1
_STREAM_TRAFFIC = 2
_STREAM_FAULTS = 3
_STREAM_SHUFFLE = 4
_STREAM_INVALID = 5
_STREAM_EXTRAS = 6
_STREAM_SUBTOPICS = 7
_STREAM_UNITS = 8
_STREAM_BEHAVIOUR = 9
_STREAM_PREFERENCE = 10

UNITS = ("session", "user")
"""Values of ``SimulationConfig.unit``: what the arm is assigned per (``user`` also fills ``unit_id``)."""

TRUE_EFFECT_REQUESTS = 25_000
"""Requests per arm of the Monte-Carlo run of :func:`true_effects` (enough for the demo's truth, quick enough to
compute while the broker starts; its time: docs/benchmarks.md)."""

Event = dict[str, Any]
FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


@dataclasses.dataclass(frozen=True)
class SimulationConfig:
    """Parameters of the synthetic traffic; every field has a default that makes a small realistic run.

    Attributes:
        requests: Number of ranking events.
        items_per_request: Served list length, varied by ±25 % per request (at least 1, at most ``catalogue``).
        catalogue: Candidate (judged) items per query; item ids ``q{q}-d{j}`` are unique per query.
        queries: Distinct ``query_id`` values; each is asked many times.
        arms: ``(name, quality)`` pairs; quality in ``[0, 1]`` (1 = sorted by true grade, 0 = random).
        experiment: The ``experiment`` of every ranking and judgment.
        click_model: ``"cascade"`` or ``"pbm"`` (position-based, examination probability ``1 / i``).
        max_grade: True grades are ``0..max_grade``, skewed toward 0.
        label_rate: Fraction of requests that also get editorial ``label`` feedback for shown and unshown items.
        sessions_per_user_requests: Mean number of consecutive requests per session.
        interleaving: Serve team-draft interleaved lists of the first two arms to a share of the sessions.
        judgments: Emit side-by-side ``judgment`` events.
        rate: Requests per second of event time.
        start_ts: Event time of the first request (epoch seconds).
        max_delay: Cap of the feedback delay after serve time, in seconds (keep it below the 30 min attribution
            window, or ordinary feedback becomes late too).
        seed: Seed of every random draw (non-negative).
        late_fraction: Fraction of feedback events moved beyond the 30 min attribution window.
        duplicate_fraction: Fraction of feedback events emitted twice.
        orphan_fraction: Extra feedback events, as a fraction of the feedback, for requests never ranked.
        invalid_fraction: Extra malformed lines, as a fraction of the valid lines (:func:`simulate_lines` only).
        shuffle_window: If > 0, events are emitted out of order by up to this many seconds of event time.
        subtopics: Rankings carry ``subtopics`` (each item has 1-3 of 6 subtopics).
        endless: Ignore ``requests`` and generate chunks forever (live traffic; not with ``orphan_fraction``).
        unit: The randomisation unit, one of :data:`UNITS`: ``"session"`` (default: the arm per session, no
            ``unit_id``) or ``"user"`` (the arm per returning user, rankings carry ``unit_id``).
        sessions_per_user: With ``unit="user"``: mean number of sessions per user (>= 1).
        behaviour: Clicks carry a ``dwell`` from the click model and :data:`ZERO_RESULT_RATE` of the requests serve
            nothing (module docstring); off: the output is the same as before the option existed.
        pre_period: Seconds of event time from ``start_ts`` before the experiment starts: requests served then
            carry no ``experiment`` and ``arm`` (pre-experiment traffic, served by the first arm's ranker); the
            units that come back later have a pre-period (CUPED's covariate). 0: none.
        preference: With ``unit="user"``: the spread of each user's persistent click propensity (a user's chance
            to click an examined item is ``1 - (1 - p) ** exp(preference * z)``, ``z ~ N(0, 1)`` drawn once per
            user), so that a user's metrics before the experiment predict them during it. 0: none; at most
            :data:`MAX_PREFERENCE`.
        dwell_scale: With ``behaviour``: ``(arm, factor)`` pairs scaling the mean dwell after every click on a list
            the arm served (an item of an interleaved list: its team's arm), e.g. ``(("clickbait", 0.4),)``: a ranker
            that puts items first whose pages users leave quickly. Its clicks, and so its relevance measures, stay
            as its quality makes them; its satisfied clicks fall and its reformulations rise. Arms not named keep
            1; empty (the default): the output is the same as before the option existed.
        segments: ``(field, values)`` pairs: every ranking carries ``attributes`` with one value of each field, the
            same for all of a unit's rankings (its ``unit_id``, else its session: a user is on one platform), drawn
            by a hash of the field and the unit, so that each value has about ``1 / len(values)`` of the units.
            Empty (the default): no attributes.
        id_prefix: Put before every request, session and user id (``r{k}``, ``s{k}``, ``u{k}``), so that runs into
            the same topics do not reuse ids (``simulate --broker`` gives each run its own). Empty (the default):
            the output is the same as before the option existed.
    """

    requests: int = 1000
    items_per_request: int = 20
    catalogue: int = 50
    queries: int = 200
    arms: tuple[tuple[str, float], ...] = (("control", 0.55), ("treatment", 0.7))
    experiment: str = "exp1"
    click_model: str = "cascade"
    max_grade: int = 4
    label_rate: float = 0.1
    sessions_per_user_requests: int = 3
    interleaving: bool = False
    judgments: bool = False
    rate: float = 50.0
    start_ts: float = 1_767_225_600.0
    max_delay: float = 120.0
    seed: int = 0
    late_fraction: float = 0.0
    duplicate_fraction: float = 0.0
    orphan_fraction: float = 0.0
    invalid_fraction: float = 0.0
    shuffle_window: float = 0.0
    subtopics: bool = False
    endless: bool = False
    unit: str = "session"
    sessions_per_user: float = 4.0
    behaviour: bool = False
    pre_period: float = 0.0
    preference: float = 0.0
    dwell_scale: tuple[tuple[str, float], ...] = ()
    segments: tuple[tuple[str, tuple[str, ...]], ...] = ()
    id_prefix: str = ""

    def __post_init__(self) -> None:
        """Reject configurations the generator cannot honour.

        Raises:
            ValueError: A field is out of range, or interleaving/judgments are asked for with fewer than two arms.
        """
        if self.requests < 0:
            raise ValueError("requests must be >= 0")
        if self.items_per_request < 1 or self.catalogue < 1 or self.queries < 1:
            raise ValueError("items_per_request, catalogue and queries must be >= 1")
        if not self.arms:
            raise ValueError("at least one arm is needed")
        names = [name for name, _ in self.arms]
        if len(set(names)) != len(names):
            raise ValueError("arm names must be unique")
        for name, quality in self.arms:
            if not 0.0 <= quality <= 1.0:
                raise ValueError(f"arm {name!r}: quality {quality} not in [0, 1]")
        if self.click_model not in ("cascade", "pbm"):
            raise ValueError(f"click_model must be 'cascade' or 'pbm', not {self.click_model!r}")
        if self.max_grade < 1:
            raise ValueError("max_grade must be >= 1")
        fractions = {
            "label_rate": self.label_rate,
            "late_fraction": self.late_fraction,
            "duplicate_fraction": self.duplicate_fraction,
            "orphan_fraction": self.orphan_fraction,
            "invalid_fraction": self.invalid_fraction,
        }
        for field, value in fractions.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{field} must be in [0, 1]")
        if self.sessions_per_user_requests < 1:
            raise ValueError("sessions_per_user_requests must be >= 1")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, not {self.unit!r}")
        if not (self.sessions_per_user >= 1 and math.isfinite(self.sessions_per_user)):
            raise ValueError("sessions_per_user must be >= 1")
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError("rate must be a positive number")
        if not math.isfinite(self.start_ts):
            raise ValueError("start_ts must be finite")
        if not (self.max_delay >= 0 and math.isfinite(self.max_delay)):
            raise ValueError("max_delay must be >= 0")
        if not (self.shuffle_window >= 0 and math.isfinite(self.shuffle_window)):
            raise ValueError("shuffle_window must be >= 0")
        if self.seed < 0:
            raise ValueError("seed must be >= 0")
        if (self.interleaving or self.judgments) and len(self.arms) < 2:
            raise ValueError("interleaving and judgments need at least two arms")
        if self.endless and self.orphan_fraction > 0:
            raise ValueError("orphan_fraction needs a finite number of requests (orphan ids follow the last one)")
        if not (self.pre_period >= 0 and math.isfinite(self.pre_period)):
            raise ValueError("pre_period must be >= 0")
        if self.pre_period > 0 and not self.endless and self.requests / self.rate <= self.pre_period:
            span = self.requests / self.rate
            raise ValueError(f"all {self.requests:,} requests fall in the pre-period ({span:,.0f} s of event time at "
                             f"{self.rate:g} requests/s, pre-period {self.pre_period:,.0f} s): no experiment "
                             "traffic; ask for more requests or a shorter pre-period")
        if not 0 <= self.preference <= MAX_PREFERENCE:  # (above it, exp(preference * z) leaves float64)
            raise ValueError(f"preference must be between 0 and {MAX_PREFERENCE:g} (e.g. 0.8)")
        if self.preference > 0 and self.unit != "user":
            raise ValueError("preference needs unit='user' (a preference belongs to a returning user)")
        if self.interleaving and INTERLEAVED_ARM in names:
            raise ValueError(f"arm name {INTERLEAVED_ARM!r} is reserved for interleaved requests")
        if self.dwell_scale and not self.behaviour:
            raise ValueError("dwell_scale needs behaviour (dwell times)")
        for name, factor in self.dwell_scale:
            if name not in names:
                raise ValueError(f"dwell_scale: {name!r} is not an arm (arms: {', '.join(names)})")
            if not (factor > 0 and math.isfinite(factor)):
                raise ValueError(f"dwell_scale: the factor of {name!r} must be a positive number, not {factor}")
        fields = [field for field, _ in self.segments]
        if len(set(fields)) != len(fields):
            raise ValueError("segments: each field once")
        for field, values in self.segments:
            if not field or not values or not all(values) or len(set(values)) != len(values):
                raise ValueError(f"segments: {field!r} needs a name and distinct, non-empty values")


def click_probabilities(max_grade: int) -> FloatArray:
    """Click probability of an examined item by true grade.

    The relevance part is the ERR satisfaction probability ``(2**g - 1) / 2**max_grade``; a floor of
    :data:`CLICK_FLOOR` adds clicks on attractive but irrelevant snippets.

    Args:
        max_grade: The highest grade.

    Returns:
        Array of length ``max_grade + 1``, indexed by grade.
    """
    grades = np.arange(max_grade + 1, dtype=np.float64)
    relevance = (2.0**grades - 1.0) / 2.0**max_grade
    return np.asarray(CLICK_FLOOR + (1.0 - CLICK_FLOOR) * relevance, dtype=np.float64)


def _rng(config: SimulationConfig, stream: int) -> np.random.Generator:
    """An independent random stream of the config's seed, so one option does not perturb the others' draws."""
    return np.random.default_rng([config.seed, stream])


def _grade_matrix(config: SimulationConfig) -> NDArray[np.int8]:
    """True grades, shape ``(queries, catalogue)``; depends only on seed, queries, catalogue and max_grade."""
    rng = _rng(config, _STREAM_GRADES)
    n_q, n_c, top = config.queries, config.catalogue, config.max_grade
    richness = rng.uniform(0.2, 0.8, size=n_q)
    powers = np.arange(top + 1, dtype=np.float64)
    grades = np.empty((n_q, n_c), dtype=np.int8)
    step = max(1, 2_000_000 // (n_c * (top + 1)))
    for lo in range(0, n_q, step):
        hi = min(n_q, lo + step)
        probs = richness[lo:hi, None] ** powers[None, :]
        cdf = np.cumsum(probs / probs.sum(axis=1, keepdims=True), axis=1)
        u = rng.random((hi - lo, n_c))
        drawn = (u[:, :, None] >= cdf[:, None, :]).sum(axis=2)
        grades[lo:hi] = np.minimum(drawn, top)
    return grades


def true_grades(config: SimulationConfig) -> dict[str, dict[str, int]]:
    """The true relevance grades clicks and labels are drawn from.

    Args:
        config: The simulation (only ``seed``, ``queries``, ``catalogue`` and ``max_grade`` matter).

    Returns:
        ``query_id -> {item: true grade}`` for every query and every item of its judged pool.
    """
    grades = _grade_matrix(config).tolist()
    return {f"q{q}": {f"q{q}-d{j}": g for j, g in enumerate(row)} for q, row in enumerate(grades)}


class _World:
    """Static per-query data shared by all chunks: grades, names, popularity, subtopics."""

    def __init__(self, config: SimulationConfig) -> None:
        self.grades = _grade_matrix(config)
        n_q, n_c = config.queries, config.catalogue
        self.query_names = [f"q{q}" for q in range(n_q)]
        self.names: NDArray[np.object_] | None = None
        if n_q * n_c <= _NAME_TABLE_LIMIT:
            table = np.empty((n_q, n_c), dtype=object)
            table[:, :] = [[f"q{q}-d{j}" for j in range(n_c)] for q in range(n_q)]
            self.names = table
        weights = 1.0 / np.arange(1, n_q + 1, dtype=np.float64) ** QUERY_ZIPF
        self.query_cdf = np.cumsum(weights / weights.sum())
        self.query_cdf[-1] = 1.0
        self.subtopics: list[list[tuple[str, ...]]] | None = None
        if config.subtopics:
            rng = _rng(config, _STREAM_SUBTOPICS)
            labels = [f"t{k + 1}" for k in range(N_SUBTOPICS)]
            counts = rng.integers(1, 4, size=(n_q, n_c))
            keys = rng.random((n_q, n_c, N_SUBTOPICS)).argsort(axis=2)
            self.subtopics = [
                [tuple(labels[k] for k in sorted(keys[q, j, : counts[q, j]].tolist())) for j in range(n_c)]
                for q in range(n_q)
            ]

    def item_names(self, queries: IntArray, items: IntArray) -> list[list[str]]:
        """Item ids of a ``(rows, width)`` index matrix, row ``r`` belonging to query ``queries[r]``."""
        if self.names is not None:
            rows: list[list[str]] = self.names[queries[:, None], items].tolist()
            return rows
        return [[f"q{q}-d{j}" for j in row] for q, row in zip(queries.tolist(), items.tolist(), strict=True)]

    def flat_names(self, queries: IntArray, items: IntArray) -> list[str]:
        """Item ids of parallel 1-d arrays of query and item indices."""
        if self.names is not None:
            flat: list[str] = self.names[queries, items].tolist()
            return flat
        return [f"q{q}-d{j}" for q, j in zip(queries.tolist(), items.tolist(), strict=True)]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a chunk is built.

    A chunk allocates some 10^5 dicts and lists, none in a reference cycle; left on, the collector would rescan
    the buffered events again and again and double the generation time. It is paused only inside the
    generator's own work, never while the consumer runs, and restored as it was.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _round_ms(values: FloatArray) -> FloatArray:
    return np.round(values, 3)


def _team_draft(first: list[int], second: list[int], n: int, coin: list[bool]) -> tuple[list[int], list[int]]:
    """Team-draft interleaving (Radlinski et al. 2008) of two full rankings of the same pool.

    Args:
        first: Item indices of the first arm's ranking, best first.
        second: Item indices of the second arm's ranking, best first.
        n: Length of the interleaved list.
        coin: Coin flips (True: first arm picks first) used when both teams have the same size.

    Returns:
        The interleaved item indices and, per position, 0 or 1 for the team that contributed it.
    """
    picked: list[int] = []
    teams: list[int] = []
    used: set[int] = set()
    pointers = [0, 0]
    rankings = (first, second)
    sizes = [0, 0]
    flip = 0
    while len(picked) < n:
        if sizes[0] < sizes[1]:
            team = 0
        elif sizes[1] < sizes[0]:
            team = 1
        else:
            team = 0 if coin[flip % len(coin)] else 1
            flip += 1
        ranking = rankings[team]
        pointer = pointers[team]
        while ranking[pointer] in used:
            pointer += 1
        item = ranking[pointer]
        pointers[team] = pointer + 1
        used.add(item)
        picked.append(item)
        teams.append(team)
        sizes[team] += 1
    return picked, teams


class _Generator:
    """Chunked event generation with the event-time ordering buffer."""

    def __init__(self, config: SimulationConfig) -> None:
        self.config = config
        self.world = _World(config)
        self.rng = _rng(config, _STREAM_TRAFFIC)
        self.faults = _rng(config, _STREAM_FAULTS)
        self.shuffle = _rng(config, _STREAM_SHUFFLE)
        self.extras = _rng(config, _STREAM_EXTRAS)
        self.arm_names = [name for name, _ in config.arms]
        qualities = [quality for _, quality in config.arms]
        # Code len(arms) is the interleaved arm; its base ranker is the first arm.
        self.quality = np.array([*qualities, qualities[0]], dtype=np.float64)
        self.click_p = click_probabilities(config.max_grade)
        scale = dict(config.dwell_scale)
        # Code len(arms) (interleaved) has no factor of its own: a click takes its item's team's (_chunk).
        self.dwell_scale: FloatArray | None = (
            np.array([scale.get(name, 1.0) for name in self.arm_names] + [1.0], dtype=np.float64) if scale else None
        )
        pair = sorted(config.arms[:2], key=lambda arm: arm[0])
        self.quality_gap = pair[1][1] - pair[0][1] if len(pair) == 2 else 0.0
        self.next_ts = config.start_ts
        self.session = -1
        self.session_arm = 0
        self.units = _rng(config, _STREAM_UNITS)
        self.behave = _rng(config, _STREAM_BEHAVIOUR)
        self.users = 0
        self.session_user = 0
        self.user_arm: IntArray = np.empty(0, dtype=np.int64)
        self.preferences = _rng(config, _STREAM_PREFERENCE)
        self.user_propensity: FloatArray = np.empty(0, dtype=np.float64)  # exp(preference * z) per user
        self.orphans = 0
        self.pending_keys: FloatArray = np.empty(0, dtype=np.float64)
        self.pending: list[Event] = []

    def batches(self) -> Iterator[list[Event]]:
        """Events in emission order, one list per generated chunk (the last one also flushes the buffer)."""
        total = self.config.requests
        starts: Iterable[int] = (
            itertools.count(0, CHUNK_REQUESTS) if self.config.endless else range(0, total, CHUNK_REQUESTS)
        )
        for start in starts:
            m = CHUNK_REQUESTS if self.config.endless else min(CHUNK_REQUESTS, total - start)
            with _gc_paused():
                events, keys, bound = self._chunk(start, m)
                batch = self._release(events, keys, bound)
            if batch:
                yield batch
        batch = self._release([], np.empty(0, dtype=np.float64), math.inf)
        if batch:
            yield batch

    def _release(self, events: list[Event], keys: FloatArray, bound: float) -> list[Event]:
        """Merge new events into the buffer and release those with a sort key <= bound, in key order."""
        all_keys = np.concatenate([self.pending_keys, keys])
        all_events = self.pending + events
        order = np.argsort(all_keys, kind="stable")
        sorted_keys = all_keys[order]
        cut = int(np.searchsorted(sorted_keys, bound, side="right"))
        idx = order.tolist()
        released = [all_events[i] for i in idx[:cut]]
        self.pending = [all_events[i] for i in idx[cut:]]
        self.pending_keys = sorted_keys[cut:]
        return released

    def _sessions(self, m: int, first_chunk: bool) -> tuple[IntArray, IntArray, IntArray | None]:
        """Session index, arm code and (``unit="user"``) user index per request; sessions run on across chunks."""
        cfg = self.config
        rng = self.rng
        new = rng.random(m) < 1.0 / cfg.sessions_per_user_requests
        if first_chunk:
            new[0] = True
        local = np.cumsum(new)
        n_new = int(local[-1])
        n_arms = len(cfg.arms)
        drawn = rng.integers(0, n_arms, size=n_new)
        if cfg.interleaving:
            drawn = np.where(rng.random(n_new) < INTERLEAVE_SHARE, n_arms, drawn)
        request_user: IntArray | None = None
        if cfg.unit == "user":
            user, drawn = self._users(drawn)
            users_ext = np.concatenate([[self.session_user], user]).astype(np.int64)
            request_user = users_ext[local]
            self.session_user = int(users_ext[-1])
        arms_ext = np.concatenate([[self.session_arm], drawn]).astype(np.int64)
        arm_code = arms_ext[local]
        session = self.session + local
        self.session += n_new
        self.session_arm = int(arms_ext[-1])
        return session.astype(np.int64), arm_code, request_user

    def _users(self, drawn: IntArray) -> tuple[IntArray, IntArray]:
        """The user of each new session and the arm it gets: its user's, drawn at the user's first session.

        A session is a returning user's with probability ``1 - 1 / sessions_per_user``, the user drawn uniformly
        from those seen before it (new users earlier in the same chunk included).
        """
        n_new = drawn.size
        units = self.units
        new_user = units.random(n_new) < 1.0 / self.config.sessions_per_user
        if self.users == 0 and n_new:
            new_user[0] = True  # the first session has nobody to return
        seen = self.users + np.cumsum(new_user, dtype=np.int64)  # users known once each session has started
        before = seen - new_user
        returning = np.floor(units.random(n_new) * before).astype(np.int64)
        user = np.where(new_user, seen - 1, returning)
        self.user_arm = np.concatenate([self.user_arm, drawn[new_user]]).astype(np.int64)
        if self.config.preference > 0:
            z = self.preferences.normal(0.0, 1.0, int(new_user.sum()))
            self.user_propensity = np.concatenate([self.user_propensity, np.exp(self.config.preference * z)])
        self.users = int(seen[-1]) if n_new else self.users
        return user, self.user_arm[user]

    def _click_arms(self, arm_code: IntArray, rows: IntArray, positions: IntArray,
                    teams_rows: dict[int, list[str]]) -> IntArray:
        """The arm code each click is credited to: its request's arm, or on an interleaved list its item's team."""
        arms = arm_code[rows].copy()
        for k in np.flatnonzero(arms == len(self.arm_names)).tolist():
            arms[k] = self.arm_names.index(teams_rows[int(rows[k])][int(positions[k])])
        return arms

    def _rank(self, grades: FloatArray, quality: FloatArray) -> tuple[IntArray, IntArray]:
        """Full ranking of each row's pool by a ranker of the row's quality, and the model score per item.

        Scores are returned in units of 1e-4 (``0..SCORE_STEPS``): the exported score is
        ``_SCORE_VALUES[k]``, a shared float object, so a million rankings do not allocate twenty million floats.
        """
        cfg = self.config
        rng = self.rng
        top = float(cfg.max_grade)
        q = quality[:, None]
        noise = rng.random(grades.shape)
        raw = q * grades + (1.0 - q) * noise * top + 1e-6 * rng.random(grades.shape)
        order = np.argsort(-raw, axis=1).astype(np.int64)
        offset = rng.normal(0.0, 0.5, size=(grades.shape[0], 1))
        score = np.rint(SCORE_STEPS / (1.0 + np.exp(-((raw / top - 0.5) * 6.0 + offset)))).astype(np.int64)
        return order, score

    def _chunk(self, start: int, m: int) -> tuple[list[Event], FloatArray, float]:
        """Generate the events of requests ``start .. start + m - 1``.

        Returns:
            The events, their sort keys (ts plus shuffle jitter) and the bound below which no later event falls.
        """
        cfg = self.config
        rng = self.rng
        world = self.world
        n_arms = len(cfg.arms)
        n_c = cfg.catalogue

        gaps = rng.exponential(1.0 / cfg.rate, size=m)
        if start == 0:
            gaps[0] = 0.0
        serve_raw = self.next_ts + np.cumsum(gaps)
        self.next_ts = float(serve_raw[-1])
        serve = _round_ms(serve_raw)
        session, arm_code, request_user = self._sessions(m, start == 0)
        queries = np.searchsorted(world.query_cdf, rng.random(m), side="right").astype(np.int64)
        queries = np.minimum(queries, cfg.queries - 1)
        lengths = np.rint(cfg.items_per_request * rng.uniform(0.75, 1.25, size=m)).astype(np.int64)
        lengths = np.clip(lengths, 1, n_c)
        if cfg.behaviour:
            lengths[self.behave.random(m) < ZERO_RESULT_RATE] = 0
        width = max(int(lengths.max()), 1)

        grades_int = world.grades[queries].astype(np.int64)
        grades = grades_int.astype(np.float64)
        before = serve_raw < cfg.start_ts + cfg.pre_period  # pre-experiment traffic: the first arm's ranker
        if cfg.pre_period > 0:
            arm_code = np.where(before, 0, arm_code)
        order, score = self._rank(grades, self.quality[arm_code])
        shown = np.ascontiguousarray(order[:, :width])
        shown_scores = np.take_along_axis(score, shown, axis=1)

        teams_rows: dict[int, list[str]] = {}
        interleaved = np.flatnonzero(arm_code == n_arms)
        if interleaved.size:
            second_q = np.full(interleaved.size, cfg.arms[1][1], dtype=np.float64)
            order_b, score_b = self._rank(grades[interleaved], second_q)
            coins = (self.extras.random((interleaved.size, 8)) < 0.5).tolist()
            pair = self.arm_names[:2]
            for k, r in enumerate(interleaved.tolist()):
                n = int(lengths[r])
                picked, teams = _team_draft(order[r].tolist(), order_b[k].tolist(), n, coins[k])
                shown[r, :n] = picked
                # Each item keeps its own team's score, nudged so the list stays strictly descending.
                own = [score[r, j] if t == 0 else score_b[k, j] for j, t in zip(picked, teams, strict=True)]
                previous = SCORE_STEPS + 1
                for pos, value in enumerate(own):
                    previous = max(0, min(int(value), previous - 1))
                    shown_scores[r, pos] = previous
                teams_rows[r] = [pair[t] for t in teams]

        positions = np.arange(width)
        visible = positions[None, :] < lengths[:, None]
        shown_grades = np.take_along_axis(grades_int, shown, axis=1)

        # Clicks.
        p_click = self.click_p[shown_grades]
        if cfg.preference > 0 and request_user is not None:
            p_click = 1.0 - (1.0 - p_click) ** self.user_propensity[request_user][:, None]
        attracted = rng.random((m, width)) < p_click
        if cfg.click_model == "cascade":
            stops = attracted & (rng.random((m, width)) < CASCADE_STOP_AFTER_CLICK)
            stopped_before: IntArray = np.cumsum(stops, axis=1, dtype=np.int64) - stops
            clicks = attracted & (stopped_before == 0) & visible
        else:
            examined = rng.random((m, width)) < 1.0 / (positions[None, :] + 1.0)
            clicks = attracted & examined & visible
        min_delay = min(0.5, cfg.max_delay)
        click_gaps = rng.exponential(max(cfg.max_delay, 1e-9) / 10.0, size=(m, width))
        click_delay = np.minimum(min_delay + np.cumsum(np.where(clicks, click_gaps, 0.0), axis=1), cfg.max_delay)
        c_rows, c_pos = np.nonzero(clicks)
        c_items = shown[c_rows, c_pos]
        c_delay = click_delay[c_rows, c_pos]
        c_dwell = np.full(c_rows.size, np.nan)
        if cfg.behaviour:  # dwell after a click: longer on more relevant items
            satisfaction = (2.0 ** shown_grades[c_rows, c_pos] - 1.0) / 2.0**cfg.max_grade
            mean = DWELL_SHORT + (DWELL_LONG - DWELL_SHORT) * satisfaction
            if self.dwell_scale is not None:
                mean = mean * self.dwell_scale[self._click_arms(arm_code, c_rows, c_pos, teams_rows)]
            c_dwell = np.round(self.behave.exponential(mean), 1)

        # Editorial labels for shown and unshown judged items.
        labelled = np.flatnonzero(rng.random(m) < cfg.label_rate)
        n_l = labelled.size
        l_len = lengths[labelled]
        k_shown = np.minimum(rng.integers(2, 5, size=n_l), l_len)
        keys = np.where(visible[labelled], rng.random((n_l, width)), np.inf)
        pick = np.argsort(keys, axis=1)
        take = positions[None, :] < k_shown[:, None]
        ls_rows, ls_col = np.nonzero(take)
        ls_req = labelled[ls_rows]
        ls_items = shown[ls_req, pick[ls_rows, ls_col]]
        k_unshown = np.minimum(rng.integers(1, 3, size=n_l), n_c - l_len)
        on_list = np.zeros((n_l, n_c), dtype=bool)
        v_rows, v_pos = np.nonzero(visible[labelled])
        on_list[v_rows, shown[labelled[v_rows], v_pos]] = True
        gumbel = -np.log(-np.log(rng.random((n_l, n_c)) + 1e-300) + 1e-300)
        prefer = np.where(on_list, -np.inf, np.log1p(grades[labelled]) + gumbel)
        pick_u = np.argsort(-prefer, axis=1)
        take_u = np.arange(n_c)[None, :] < k_unshown[:, None]
        lu_rows, lu_col = np.nonzero(take_u)
        lu_req = labelled[lu_rows]
        lu_items = pick_u[lu_rows, lu_col]
        l_req = np.concatenate([ls_req, lu_req])
        l_items = np.concatenate([ls_items, lu_items])
        l_delay = rng.uniform(min_delay, cfg.max_delay, size=l_req.size)

        # All feedback of the chunk: clicks then labels.
        f_req = np.concatenate([c_rows, l_req]).astype(np.int64)
        f_item = np.concatenate([c_items, l_items]).astype(np.int64)
        f_grade = np.concatenate([np.full(c_rows.size, -1, dtype=np.int64), grades_int[l_req, l_items]])
        f_ts = serve_raw[f_req] + np.concatenate([c_delay, l_delay])
        f_dwell = np.concatenate([c_dwell, np.full(l_req.size, np.nan)])
        n_f = f_req.size

        faults = self.faults
        if cfg.late_fraction > 0:
            late = faults.random(n_f) < cfg.late_fraction
            f_ts = np.where(late, serve_raw[f_req] + ATTRIBUTION_WINDOW + faults.uniform(1.0, 600.0, n_f), f_ts)
        if cfg.duplicate_fraction > 0:
            dup = np.flatnonzero(faults.random(n_f) < cfg.duplicate_fraction)
            f_req = np.concatenate([f_req, f_req[dup]])
            f_item = np.concatenate([f_item, f_item[dup]])
            f_grade = np.concatenate([f_grade, f_grade[dup]])
            f_dwell = np.concatenate([f_dwell, f_dwell[dup]])
            f_ts = np.concatenate([f_ts, f_ts[dup] + faults.uniform(0.05, 2.0, dup.size)])
        f_ts = _round_ms(f_ts)

        # Assemble the events.
        experiment = cfg.experiment
        ids = cfg.id_prefix
        request_ids = [f"{ids}r{start + i}" for i in range(m)]
        query_names = world.query_names
        # Served lists as flat lists, sliced per request (no per-row intermediate lists).
        flat_items = world.flat_names(np.repeat(queries, lengths), shown[visible])
        flat_scores: list[float] = _SCORE_VALUES[shown_scores[visible]].tolist()
        ends = np.cumsum(lengths)
        starts = (ends - lengths).tolist()
        subtopic_table = world.subtopics
        q_list = queries.tolist()
        events: list[Event] = []
        arm_labels = [*self.arm_names, INTERLEAVED_ARM]
        unit_ids = None if request_user is None else [f"{ids}u{user}" for user in request_user.tolist()]
        # each field's values, and the start of its hash (a field of its own: fields drawn independently)
        segments = [(field, values, zlib.crc32(field.encode())) for field, values in cfg.segments]
        pre_rows = before.tolist() if cfg.pre_period > 0 else None
        for i, (rid, ts, lo, n, q, sess, code) in enumerate(
            zip(
                request_ids,
                serve.tolist(),
                starts,
                lengths.tolist(),
                q_list,
                session.tolist(),
                arm_code.tolist(),
                strict=True,
            )
        ):
            event: Event = {
                "type": "ranking",
                "request_id": rid,
                "ts": ts,
                "items": flat_items[lo : lo + n],
                "scores": flat_scores[lo : lo + n],
                "query_id": query_names[q],
                "session_id": f"{ids}s{sess}",
                "experiment": experiment,
                "arm": arm_labels[code],
            }
            if pre_rows is not None and pre_rows[i]:
                del event["experiment"], event["arm"]
            if unit_ids is not None:
                event["unit_id"] = unit_ids[i]
            if segments:
                unit = (event.get("unit_id") or event["session_id"]).encode()
                event["attributes"] = {field: values[zlib.crc32(unit, seed) % len(values)]
                                       for field, values, seed in segments}
            if code == n_arms:
                event["teams"] = teams_rows[i]
            if subtopic_table is not None:
                row = subtopic_table[q]
                event["subtopics"] = [list(row[j]) for j in shown[i, :n].tolist()]
            events.append(event)

        f_names = world.flat_names(queries[f_req], f_item)
        for r, item, grade, ts, dwell in zip(f_req.tolist(), f_names, f_grade.tolist(), f_ts.tolist(),
                                             f_dwell.tolist(), strict=True):
            if grade < 0:
                click: Event = {"type": "feedback", "request_id": request_ids[r], "item": item, "kind": "click",
                                "ts": ts}
                if dwell == dwell:
                    click["dwell"] = dwell
                events.append(click)
            else:
                events.append(
                    {
                        "type": "feedback",
                        "request_id": request_ids[r],
                        "item": item,
                        "kind": "label",
                        "grade": grade,
                        "ts": ts,
                    }
                )
        all_ts = [serve, f_ts]

        if cfg.orphan_fraction > 0:
            n_o = int(faults.binomial(n_f, cfg.orphan_fraction))
            o_q = faults.integers(0, cfg.queries, size=n_o).astype(np.int64)
            o_item = faults.integers(0, n_c, size=n_o).astype(np.int64)
            o_ts = _round_ms(faults.uniform(float(serve_raw[0]), float(serve_raw[-1]), size=n_o))
            o_names = world.flat_names(o_q, o_item)
            base = cfg.requests + self.orphans
            self.orphans += n_o
            for k, (item, ts) in enumerate(zip(o_names, o_ts.tolist(), strict=True)):
                events.append(
                    {"type": "feedback", "request_id": f"{ids}r{base + k}", "item": item, "kind": "click", "ts": ts}
                )
            all_ts.append(o_ts)

        if cfg.judgments:
            extras = self.extras
            judged = np.flatnonzero(extras.random(m) < JUDGMENT_RATE)
            p_good = (1.0 - JUDGMENT_SAME) * min(1.0, max(0.0, 0.5 + self.quality_gap))
            u = extras.random(judged.size)
            j_ts = _round_ms(serve_raw[judged] + extras.uniform(0.0, cfg.max_delay, size=judged.size))
            for r, draw, ts in zip(judged.tolist(), u.tolist(), j_ts.tolist(), strict=True):
                verdict = "same" if draw < JUDGMENT_SAME else "good" if draw < JUDGMENT_SAME + p_good else "bad"
                events.append(
                    {
                        "type": "judgment",
                        "experiment": experiment,
                        "query_id": query_names[q_list[r]],
                        "verdict": verdict,
                        "ts": ts,
                    }
                )
            all_ts.append(j_ts)

        keys = np.concatenate(all_ts)
        if cfg.shuffle_window > 0:
            keys = keys + self.shuffle.uniform(0.0, cfg.shuffle_window, size=keys.size)
        return events, keys, float(serve[-1])


def _batches(config: SimulationConfig) -> Iterator[list[Event]]:
    return _Generator(config).batches()


def simulate(config: SimulationConfig) -> Iterator[dict[str, Any]]:
    """Generate the synthetic events.

    Args:
        config: The simulation parameters.

    Yields:
        Events as dicts with ``"type"`` in ``{"ranking", "feedback", "judgment"}`` and the fields of
        docs/contract.md §1, ordered by event time (except for the bounded disorder of ``shuffle_window``). The
        sequence is deterministic for a given config. Malformed events (``invalid_fraction``) only appear in
        :func:`simulate_lines`.
    """
    for batch in _batches(config):
        yield from batch


def _malformed(kind: int, n: int, ts: float, good_line: bytes, experiment: str) -> bytes:
    """One malformed JSON line of the given kind (0-5), with a request id ``bad{n}`` that is never used."""
    rid = f"bad{n}"
    body: dict[str, Any]
    if kind == 0:  # broken JSON: a valid line cut short (an object prefix never parses)
        return good_line[: max(1, (len(good_line) - 1) // 2)] + b"\n"
    if kind == 1:  # missing request_id
        body = {"type": "feedback", "item": "q0-d0", "kind": "click", "ts": ts}
    elif kind == 2:  # items not a list
        body = {"type": "ranking", "request_id": rid, "ts": ts, "items": "q0-d0", "experiment": experiment}
    elif kind == 3:  # negative grade
        body = {"type": "feedback", "request_id": rid, "item": "q0-d0", "kind": "label", "grade": -1, "ts": ts}
    elif kind == 4:  # unknown type
        body = {"type": "impression", "request_id": rid, "item": "q0-d0", "ts": ts}
    else:  # duplicate items in a ranking
        body = {
            "type": "ranking",
            "request_id": rid,
            "ts": ts,
            "items": ["q0-d0", "q0-d1", "q0-d0"],
            "scores": [0.9, 0.8, 0.7],
            "experiment": experiment,
        }
    return orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE)


def _lines(config: SimulationConfig) -> Iterator[bytes]:
    """JSON lines of the events with malformed lines mixed in; each line is handed on at once.

    Lines are not collected into lists: orjson's output buffers are cheap to allocate and free one at a time but
    slow to keep by the hundred thousand, so encoding stays streaming all the way to the writer.
    """
    dumps = orjson.dumps
    option = orjson.OPT_APPEND_NEWLINE
    fraction = config.invalid_fraction
    rng = _rng(config, _STREAM_INVALID)
    made = 0
    for batch in _batches(config):
        if fraction <= 0:
            for event in batch:
                yield dumps(event, option=option)
            continue
        after = np.flatnonzero(rng.random(len(batch)) < fraction).tolist()
        kinds = rng.integers(0, 6, size=len(after)).tolist()
        prev = 0
        for at, kind in zip(after, kinds, strict=True):
            for event in batch[prev:at]:
                yield dumps(event, option=option)
            line = dumps(batch[at], option=option)
            yield line
            yield _malformed(kind, made, float(batch[at]["ts"]), line, config.experiment)
            made += 1
            prev = at + 1
        for event in batch[prev:]:
            yield dumps(event, option=option)


def simulate_lines(config: SimulationConfig) -> Iterator[bytes]:
    """The events of :func:`simulate` as JSON Lines.

    Args:
        config: The simulation parameters.

    Returns:
        An iterator of compact JSON lines (bytes, each ending in ``b"\\n"``). When ``invalid_fraction > 0``,
        a malformed line follows each valid line with that probability: broken JSON, a feedback without
        ``request_id``, ``items`` not a list, a negative grade, an unknown ``type``, or duplicate items in a
        ranking.
    """
    return _lines(config)


def _write_all(config: SimulationConfig, write: Callable[[bytearray], object]) -> int:
    count = 0
    buffer = bytearray()
    for line in _lines(config):
        buffer += line
        count += 1
        if len(buffer) >= 1 << 20:
            write(buffer)
            buffer.clear()
    if buffer:
        write(buffer)
    return count


def write_jsonl(config: SimulationConfig, path: str) -> int:
    """Write :func:`simulate_lines` to a file.

    Args:
        config: The simulation parameters.
        path: Output file; a name ending in ``.gz`` is gzip-compressed (level 1: much faster than the default
            level for a slightly larger file; docs/benchmarks.md).

    Returns:
        The number of lines written (valid and malformed).
    """
    # No user code runs until the file is written, so the collector can stay paused throughout.
    with _gc_paused():
        if path.endswith(".gz"):
            with gzip.open(path, "wb", compresslevel=1) as gz:
                return _write_all(config, gz.write)
        with open(path, "wb") as fh:
            return _write_all(config, fh.write)


def true_effects(
    config: SimulationConfig, requests: int = TRUE_EFFECT_REQUESTS, evaluation: Config | None = None
) -> dict[str, dict[str, float]]:
    """Each arm's true expected metrics under the click model: the values its estimates converge to.

    A Monte-Carlo run: for every arm, ``requests`` requests of this generator served by that arm alone go through
    the replay engine (:class:`~stream_eval.engine.engine.Engine`, the code of ``stream-eval replay`` and of the
    worker), so a value here is the same function of the events as the one the evaluator reports. Every arm sees
    the same seeded queries, noise and click draws (common random numbers): the arms differ only by their ranker,
    so the difference of two arms is far less noisy than two independent runs would make it (the standard error
    of the nDCG@10 delta of the default arms is about 0.001 at the default size). The truth is of the click model
    itself: interleaving, judgments, the pre-period and every fault (late, duplicate, orphan, invalid, shuffled events)
    are off; the rest of ``config`` (arms, lists, queries, click model, labels, preference, seed) is used as given.

    Args:
        config: The simulation whose arms are measured.
        requests: Requests per arm; the run's time grows with it (docs/benchmarks.md).
        evaluation: The evaluation settings (cutoffs, gain, ...); default: the defaults of docs/contract.md §2-3.

    Returns:
        ``arm -> {mean name: value}``, the report's means (``MRR``, ``MAP``, ``nDCG@10``, ``ERR@10``, ``GAUC``,
        ...); a mean with no value (e.g. GAUC without a two-class session) is left out.

    Example:
        >>> truth = true_effects(SimulationConfig(), requests=4000)
        >>> truth["treatment"]["nDCG@10"] > truth["control"]["nDCG@10"]
        True
    """
    from stream_eval.config import Config

    # Each arm runs alone, so there is nothing to compare: the A/B statistics are off (an experiment configured
    # with a control would otherwise be tested on one arm).
    settings = dataclasses.replace(evaluation if evaluation is not None else Config(), ab=False, experiments=())
    effects: dict[str, dict[str, float]] = {}
    for name, quality in config.arms:
        alone = dataclasses.replace(
            config,
            requests=requests,
            arms=((name, quality),),
            dwell_scale=tuple(pair for pair in config.dwell_scale if pair[0] == name),
            endless=False,
            interleaving=False,
            judgments=False,
            late_fraction=0.0,
            duplicate_fraction=0.0,
            orphan_fraction=0.0,
            invalid_fraction=0.0,
            shuffle_window=0.0,
            pre_period=0.0,
        )
        effects[name] = _evaluate(alone, settings).get((config.experiment, name), {})
    return effects


def _evaluate(config: SimulationConfig, settings: Config) -> dict[tuple[str, str], dict[str, float]]:
    """The replay engine's means per ``(experiment, arm)`` of the simulated events (undefined means left out)."""
    from stream_eval.engine.engine import Engine
    from stream_eval.events.schema import decode_chunk_columns

    engine = Engine(settings, None)
    line = 1
    with _gc_paused():
        for chunk in _chunked(_lines(config), 1 << 21):  # about the replay's own chunk size
            engine.process(decode_chunk_columns(chunk, settings, line, "simulation"))
            line += chunk.count(b"\n")
        engine.flush()
    means: dict[tuple[str, str], dict[str, float]] = {}
    for group in engine.report()["groups"]:
        values = group["metrics"].items()
        means[group["experiment"], group["arm"]] = {name: float(value) for name, value in values if value is not None}
    return means


def _chunked(lines: Iterable[bytes], size: int) -> Iterator[bytes]:
    """Lines joined into chunks of at least ``size`` bytes (the last one shorter)."""
    buffer = bytearray()
    for line in lines:
        buffer += line
        if len(buffer) >= size:
            yield bytes(buffer)
            buffer.clear()
    if buffer:
        yield bytes(buffer)
