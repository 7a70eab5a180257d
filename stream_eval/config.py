"""Evaluation settings, read from defaults, a TOML file, ``STREAM_EVAL_*`` variables and flags.

Precedence, lowest to highest: built-in defaults < ``--config FILE`` < environment < command-line flags.
The same :class:`Config` drives ``replay`` and the streaming worker, so both compute the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from typing import Any

from stream_eval.engine.labels import MISSING, OTHER
from stream_eval.metrics.specs import DEFAULT_METRICS, GAUC, MetricNameError, MetricSpec, parse, select, split_names

GAINS = ("exp", "linear")
EMPTY_POLICIES = ("zero", "skip")
GAUC_WEIGHTS = ("impressions", "clicks", "uniform")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


#: The event times a real log can hold (docs/contract.md §1): 2000-01-01 and 2100-01-01, UTC, as epoch seconds.
#: The largest grade an event, ``max_grade`` or a kind may carry: the exp gain 2^grade of a request's items, summed
#: and squared over many requests (the intervals' variances), stays a finite double (2^1024 is not)
MAX_GRADE = 100
MIN_TS = 946_684_800.0
MAX_TS = 4_102_444_800.0
#: The latest ``max_ts`` allowed: year 9999, whose milliseconds still fit a Kafka record timestamp (int64).
_LATEST_TS = 253_402_300_799.0
#: The earliest ``min_ts`` allowed: 0001-01-01T00:00:00Z, the first moment a date (a reason's bounds) can name.
_EARLIEST_TS = -62_135_596_800.0


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names the setting."""


def parse_duration(value: object, name: str = "duration") -> float:
    """Seconds from ``30``, ``30.5``, ``"90s"``, ``"30m"``, ``"1h"``, ``"250ms"``.

    >>> parse_duration("30m")
    1800.0
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ConfigError(f"{name}: cannot read {value!r} as a duration (e.g. 30m, 90s, 1h)")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds < 0:
        raise ConfigError(f"{name}: must not be negative, got {value!r}")
    if not math.isfinite(seconds):  # (nan, inf and 1e400 are TOML floats)
        raise ConfigError(f"{name}: must be a finite duration, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The short label used for windows: ``300 -> "5m"``, ``3600 -> "1h"``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclasses.dataclass(frozen=True, slots=True)
class ArmPair:
    """Which arm of an experiment is the control and which the treatment."""

    control: str
    treatment: str


@dataclasses.dataclass(frozen=True, slots=True)
class Arms:
    """The control of an experiment and its treatments, each compared with the control (A/B/n)."""

    control: str
    treatments: tuple[str, ...]

    def pairs(self) -> list[ArmPair]:
        """Each treatment with the control, in the order of :attr:`treatments`."""
        return [ArmPair(self.control, treatment) for treatment in self.treatments]

    def side(self, arm: str) -> int:
        """0 for the control, ``k + 1`` for treatment ``k``, -1 for any other arm."""
        if arm == self.control:
            return 0
        return self.treatments.index(arm) + 1 if arm in self.treatments else -1


@dataclasses.dataclass(frozen=True, slots=True)
class Tolerance:
    """A guardrail's tolerated loss: ``value`` (negative: a fall tolerated, positive: a rise) on the relative
    lift (``relative``, ``"-1%"`` = -0.01) or on the absolute delta (``-0.005``)."""

    value: float
    relative: bool

    def label(self) -> str:
        """As written in the config: ``-1%`` or ``-0.005``."""
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g}"


#: Values of a segment field (not listed) tracked exactly per value shown: ``segment_cap`` = this ×
#: ``max_segment_values``.
SEGMENT_CAP_FACTOR = 4

#: The experiment of a ranking that names none (docs/contract.md §1): the traffic outside any experiment.
NO_EXPERIMENT = "default"

#: The default ``cuped_lookback``: 14 days of event time before a unit entered the experiment.
CUPED_LOOKBACK = 14 * 86400.0


@dataclasses.dataclass(frozen=True, slots=True)
class ExperimentSettings:
    """One ``[experiments.NAME]`` table.

    ``control`` (None: the first of the sorted arms); ``treatments`` (empty: every other arm; a two-arm config
    names one with ``treatment``); ``split`` (the arms and each one's expected share; empty: the arms seen, equal);
    ``primary``, the goal metrics of the false-discovery family (empty: every metric not a guardrail);
    ``guardrails``, metric -> tolerated loss; ``cuped``, regression adjustment on each unit's pre-period value
    (README, "CUPED"), taken from the stream over ``cuped_lookback`` seconds before the unit entered, or from the
    Parquet file ``cuped_table`` (columns unit, metric, value) when one is named."""

    control: str | None = None
    treatments: tuple[str, ...] = ()
    split: tuple[tuple[str, float], ...] = ()
    primary: tuple[str, ...] = ()
    guardrails: tuple[tuple[str, Tolerance], ...] = ()
    cuped: bool = False
    cuped_lookback: float = CUPED_LOOKBACK
    cuped_table: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """All settings of an evaluation. Frozen: one value is shared by every component."""

    cutoffs: tuple[int, ...] = (10,)
    gain: str = "exp"
    max_grade: float = 4.0
    rel_threshold: float = 1.0
    empty: str = "zero"
    gauc_weight: str = "impressions"
    attribution_window: float = 1800.0
    allowed_lateness: float = 60.0
    session_gap: float = 1800.0
    alpha: float = 0.5
    max_items: int = 1000
    gsb_metric: str = ""
    gsb_epsilon: float = 0.0
    gsb_window: float = 3600.0
    confidence: float = 0.95
    sequential_n: float = 10_000.0
    look_every: float = 3600.0
    srm_alpha: float = 0.001
    ab: bool = True
    kinds: tuple[tuple[str, float], ...] = ()
    experiments: tuple[tuple[str, ExperimentSettings], ...] = ()
    windows: tuple[float, ...] = (300.0, 3600.0)
    idle_timeout: float = 30.0
    max_label_values: int = 100
    #: segments: fields of a ranking's ``attributes`` whose values slice the report, series, windows and A/B rows
    segments: tuple[str, ...] = ()
    #: values shown per segment field (the most traffic, ties by name); the rest are ``__other__`` (README, "Segments")
    max_segment_values: int = 20
    #: the values of a segment field, listed (``segment_values = {platform = ["ios", "web"]}``): a listed field shows
    #: exactly those, every other value is ``__other__``
    segment_values: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # bounds on state that distinct ids would grow (README, "Bounded state"): beyond them, overflow is counted
    max_open_sessions: int = 300_000  # open named sessions (~1 KB each with 20 items)
    max_open_queries: int = 500_000  # distinct query ids per GSB bucket (~140 bytes each)
    max_units: int = 1_000_000  # A/B units per experiment (~360 bytes each with 9 metric columns)
    max_waiting_feedback: int = 100_000  # feedback waiting for its ranking, per join (~900 bytes each)
    min_ts: float = MIN_TS
    max_ts: float = MAX_TS
    max_clock_skew: float = 300.0
    #: behaviour measures (README, "Behaviour measures"): a click is satisfied from this dwell on (seconds) ...
    sat_dwell: float = 30.0
    #: ... and feedback of these kinds on a served item is satisfying whatever its dwell (``purchase``)
    sat_kinds: tuple[str, ...] = ()
    #: a request of a session is reformulated when the session's next request, another query, follows within this
    reformulation_gap: float = 60.0
    #: the measures that run, as named (``--metrics``; empty: :data:`DEFAULT_METRICS` at every cutoff)
    metrics: tuple[str, ...] = ()
    #: ``metrics`` parsed, once: the per-request measures in report order
    specs: tuple[MetricSpec, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.cutoffs or any(k < 1 for k in self.cutoffs):
            raise ConfigError(f"cutoffs: need one or more positive integers, got {list(self.cutoffs)}")
        if self.gain not in GAINS:
            raise ConfigError(f"gain: must be one of {', '.join(GAINS)}, got {self.gain!r}")
        if self.empty not in EMPTY_POLICIES:
            raise ConfigError(f"empty: must be one of {', '.join(EMPTY_POLICIES)}, got {self.empty!r}")
        if self.gauc_weight not in GAUC_WEIGHTS:
            raise ConfigError(f"gauc_weight: must be one of {', '.join(GAUC_WEIGHTS)}, got {self.gauc_weight!r}")
        if not 0 < self.max_grade <= MAX_GRADE:
            raise ConfigError(f"max_grade: must be positive and at most {MAX_GRADE}, got {self.max_grade}")
        if not self.gsb_epsilon >= 0:
            raise ConfigError(f"gsb_epsilon: must not be negative, got {self.gsb_epsilon}")
        if not self.rel_threshold > 0:
            raise ConfigError(f"rel_threshold: must be positive, got {self.rel_threshold}")
        if not 0.0 <= self.alpha < 1.0:
            raise ConfigError(f"alpha: must lie in [0, 1), got {self.alpha}")
        if self.max_items < 1:
            raise ConfigError(f"max_items: must be positive, got {self.max_items}")
        if not 0.0 < self.confidence < 1.0:
            raise ConfigError(f"confidence: must lie in (0, 1), got {self.confidence}")
        if not (self.sequential_n >= 1 and math.isfinite(self.sequential_n)):
            raise ConfigError(f"sequential_n: must be a number of units >= 1, got {self.sequential_n}")
        if not self.look_every > 0:
            raise ConfigError(f"look_every: must be positive, got {self.look_every}")
        if not 0.0 < self.srm_alpha < 1.0:
            raise ConfigError(f"srm_alpha: must lie in (0, 1), got {self.srm_alpha}")
        named = [name for name in self.metrics if name != GAUC]  # (GAUC, of sessions, is reported whatever is named)
        if self.metrics and not named:
            raise ConfigError("metrics: GAUC is always reported; name the per-request measures to run with it, e.g. "
                              "nDCG@10,GAUC")
        try:
            specs = select(named or DEFAULT_METRICS, self.cutoffs)
        except MetricNameError as exc:
            raise ConfigError(f"metrics: {exc}") from None
        object.__setattr__(self, "specs", specs)
        if not specs:
            raise ConfigError("metrics: need one or more measures")
        if not self.gsb_metric:
            # nDCG at 10 when 10 is a cutoff, else at the first cutoff: the default follows --cutoffs; else the
            # first measure that runs
            k = 10 if 10 in self.cutoffs else self.cutoffs[0]
            default = MetricSpec("nDCG", k)
            per_request = [s for s in specs if not (s.needs_subtopics or s.per_session)]
            if not per_request:
                raise ConfigError("metrics: need a measure valued for every request, for GSB (session measures are "
                                  "valued per session, alpha-nDCG only for requests with subtopics): add one, e.g. "
                                  "nDCG@10")
            object.__setattr__(self, "gsb_metric", (default if default in specs else per_request[0]).name)
        try:
            gsb_metric = parse(self.gsb_metric)
        except MetricNameError as exc:
            raise ConfigError(f"gsb_metric: {exc}") from None
        if gsb_metric not in specs or gsb_metric.needs_subtopics or gsb_metric.per_session:
            raise ConfigError(f"gsb_metric: {self.gsb_metric!r} is not a computed per-request measure (one of "
                              f"{', '.join(s.name for s in specs if not (s.needs_subtopics or s.per_session))})")
        if not _EARLIEST_TS <= self.min_ts < self.max_ts <= _LATEST_TS:
            raise ConfigError(f"min_ts, max_ts: need min_ts < max_ts, both within years 1 to 9999, got {self.min_ts}, "
                              f"{self.max_ts}")
        if not 1 <= self.max_segment_values <= 8000:  # (a unit's value of a field is a 2-byte code: segment_ab.py)
            raise ConfigError(f"max_segment_values: must be from 1 to 8,000, got {self.max_segment_values}")
        if len(set(self.segments)) != len(self.segments):
            raise ConfigError(f"segments: a field is named twice in {list(self.segments)}")
        for segment_field, values in self.segment_values:
            if segment_field not in self.segments:
                raise ConfigError(f"segment_values.{segment_field}: not a field of segments ({list(self.segments)})")
            if not 0 < len(set(values)) == len(values) <= 32_000 or {"", OTHER, MISSING} & set(values):
                raise ConfigError(f"segment_values.{segment_field}: need 1 to 32,000 distinct values, none empty, "
                                  f"__other__ or __missing__, got {list(values)[:10]}")
        for name in ("max_open_sessions", "max_open_queries", "max_units", "max_waiting_feedback"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must not be negative, got {getattr(self, name)}")
        for kind, grade in self.kinds:
            if not 0 <= grade <= MAX_GRADE:
                raise ConfigError(f"kinds.{kind}: grade must be from 0 to {MAX_GRADE}, got {grade}")
        for name in ("sat_dwell", "reformulation_gap"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                raise ConfigError(f"{name}: must be a finite duration >= 0, got {getattr(self, name)}")
        self._check_experiments(specs)
        unknown = [kind for kind in self.sat_kinds if kind not in self.kind_grades]
        if unknown:
            raise ConfigError(f"sat_kinds: {', '.join(map(repr, unknown))} is not click or a kind of [kinds] "
                              f"(known: {', '.join(sorted(self.kind_grades))})")

    def _check_experiments(self, specs: tuple[MetricSpec, ...]) -> None:
        """``primary`` and ``guardrails`` name metrics of the A/B rows; a tolerated loss goes the worse way."""
        lower = {spec.mean_name: spec.definition.lower_is_better for spec in specs} | {"GAUC": False}
        for name, settings in self.experiments:
            for metric in [*settings.primary, *(metric for metric, _ in settings.guardrails)]:
                if metric not in lower:
                    try:
                        measured = parse(metric).mean_name == metric  # (a measure, but not one of `metrics`)
                    except MetricNameError:
                        measured = False
                    hint = (f"; it is a measure, not among `metrics`: add it there (metrics = [\"default\", "
                            f"\"{metric}\"])" if measured else "")
                    raise ConfigError(f"experiments.{name}: {metric!r} is not a metric of the A/B rows (one of "
                                      f"{', '.join(lower)}){hint}")
            for metric, tolerance in settings.guardrails:
                if (tolerance.value > 0) != lower[metric]:
                    way = "a rise (positive)" if lower[metric] else "a fall (negative)"
                    raise ConfigError(f"experiments.{name}.guardrails.{metric}: the tolerated loss of this metric is "
                                      f"{way}, got {tolerance.label()}")

    @property
    def segment_cap(self) -> int:
        """Distinct values of a segment field not listed in ``segment_values`` whose sums are kept exactly, the first
        met: :data:`SEGMENT_CAP_FACTOR` × ``max_segment_values`` (README, "Segments")."""
        return SEGMENT_CAP_FACTOR * self.max_segment_values

    def segment_allowed(self) -> dict[str, frozenset[str]]:
        """The values listed per segment field (``segment_values``; a field not listed is absent)."""
        return {segment_field: frozenset(values) for segment_field, values in self.segment_values}

    @property
    def kind_grades(self) -> dict[str, float]:
        """Grade of each feedback kind that carries no grade of its own (``click`` = 1)."""
        return {"click": 1.0, **dict(self.kinds)}

    def settings_of(self, experiment: str) -> ExperimentSettings:
        """The ``[experiments.NAME]`` table of ``experiment`` (the defaults when there is none)."""
        return dict(self.experiments).get(experiment, _NO_SETTINGS)

    def compares(self, experiment: str) -> bool:
        """Whether the arms of ``experiment`` are compared (A/B and SRM rows, metric and interleaving GSB, its units
        on ``/metrics``): those of every experiment, except the traffic outside any experiment (:data:`NO_EXPERIMENT`,
        ``default``: a pre-period, unrandomised traffic) once the config names experiments and not ``default``.

        >>> Config().compares("default"), Config(experiments=(("e", ExperimentSettings()),)).compares("default")
        (True, False)
        """
        return experiment != NO_EXPERIMENT or not self.experiments or NO_EXPERIMENT in dict(self.experiments)

    def arms_for(self, experiment: str, arms_seen: set[str] | frozenset[str]) -> Arms | None:
        """Control and treatments of ``experiment``, among its arms: those of its ``split`` when one is configured
        (seen or not; an arm seen outside it is no arm of the experiment, and the SRM test flags its traffic), else
        the arms seen. The control is configured (``control``), else the first of the sorted arms. The treatments
        are the configured ``treatment``, else every other arm, sorted. None: no treatment, or an experiment not
        compared (:meth:`compares`).

        >>> config = Config(experiments=(("e", ExperimentSettings(control="b")),
        ...                              ("s", ExperimentSettings(split=(("x", 0.5), ("y", 0.5))))))
        >>> config.arms_for("e", {"a", "b", "c"}), config.arms_for("f", {"a", "b", "c"})
        (Arms(control='b', treatments=('a', 'c')), Arms(control='a', treatments=('b', 'c')))
        >>> config.arms_for("s", {"a", "x"})
        Arms(control='x', treatments=('y',))
        """
        if not self.compares(experiment):
            return None
        settings = self.settings_of(experiment)
        # (``__other__``, the arms beyond ``max_label_values`` folded together, is no arm: SRM flags its units)
        arms = {arm for arm, _ in settings.split} if settings.split else set(arms_seen) - {OTHER}
        control = settings.control
        if control is None:
            if not arms:
                return None
            control = min(arms)
        treatments = settings.treatments or tuple(sorted(arms - {control}))
        if not treatments:
            return None
        return Arms(control, treatments)

    def split_for(self, experiment: str, arms_seen: set[str] | frozenset[str]) -> dict[str, float]:
        """The expected share of units of each arm: configured (``split``), else equal over the arms seen."""
        configured = self.settings_of(experiment).split
        if configured:
            return dict(configured)
        arms = sorted(set(arms_seen) - {OTHER})
        return {arm: 1.0 / len(arms) for arm in arms}

    def to_json(self) -> dict[str, Any]:
        """The settings as they appear in the report's ``config`` section."""
        return {
            "cutoffs": list(self.cutoffs),
            "gain": self.gain,
            "max_grade": self.max_grade,
            "rel_threshold": self.rel_threshold,
            "empty": self.empty,
            "gauc_weight": self.gauc_weight,
            "attribution_window": self.attribution_window,
            "allowed_lateness": self.allowed_lateness,
            "session_gap": self.session_gap,
            "alpha": self.alpha,
            "max_items": self.max_items,
            "gsb_metric": self.gsb_metric,
            "gsb_epsilon": self.gsb_epsilon,
            "gsb_window": self.gsb_window,
            "confidence": self.confidence,
            "sequential_n": self.sequential_n,
            "look_every": self.look_every,
            "srm_alpha": self.srm_alpha,
            "ab": self.ab,
            "min_ts": self.min_ts,
            "max_ts": self.max_ts,
            "kinds": dict(self.kinds),
            "sat_dwell": self.sat_dwell,
            "sat_kinds": list(self.sat_kinds),
            "reformulation_gap": self.reformulation_gap,
            "experiments": {name: _settings_json(settings) for name, settings in self.experiments},
            **({"segments": list(self.segments), "max_segment_values": self.max_segment_values,
                "segment_values": {f: list(values) for f, values in self.segment_values}}
               if self.segments else {}),
            "metrics": [spec.name for spec in self.specs],
        }


_NO_SETTINGS = ExperimentSettings()


def _settings_json(settings: ExperimentSettings) -> dict[str, Any]:
    """An ``[experiments.NAME]`` table as the report's ``config`` shows it (the settings given)."""
    out: dict[str, Any] = {}
    if settings.control is not None:
        out["control"] = settings.control
    if len(settings.treatments) == 1:
        out["treatment"] = settings.treatments[0]
    elif settings.treatments:
        out["treatments"] = list(settings.treatments)
    if settings.split:
        out["split"] = dict(settings.split)
    if settings.primary:
        out["primary"] = list(settings.primary)
    if settings.guardrails:
        # relative as written ("-1%"), absolute as the number it is
        out["guardrails"] = {metric: tolerance.label() if tolerance.relative else tolerance.value
                             for metric, tolerance in settings.guardrails}
    if settings.cuped:
        out["cuped"] = True
        out["cuped_lookback"] = settings.cuped_lookback
        if settings.cuped_table:
            out["cuped_table"] = settings.cuped_table
    return out


# Settings that a file, the environment or a flag may set, and how to read each from text or TOML.
def _cutoffs(value: object) -> tuple[int, ...]:
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    try:
        cutoffs = tuple(sorted({int(str(item).strip()) for item in items if str(item).strip()}))
    except ValueError as exc:
        raise ConfigError(f"cutoffs: expected integers like 5,10,20, got {value!r}") from exc
    return cutoffs


def _metric_names(value: object) -> tuple[str, ...]:
    """Measure names from a TOML list or comma-separated text; parsed (once) when the Config is built."""
    if isinstance(value, list | tuple):
        return tuple(str(item).strip() for item in value if str(item).strip())
    return tuple(split_names(str(value)))


def _number(name: str) -> Any:
    def read(value: object) -> float:
        try:
            number = float(value)  # type: ignore[arg-type]  # str or number; ValueError is reported
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{name}: expected a number, got {value!r}") from exc
        if not math.isfinite(number):  # (nan, inf and 1e400 are TOML floats)
            raise ConfigError(f"{name}: expected a finite number, got {value!r}")
        return number

    return read


def _integer(name: str) -> Any:
    def read(value: object) -> int:
        try:
            return int(str(value))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{name}: expected an integer, got {value!r}") from exc

    return read


def _duration(name: str) -> Any:
    return lambda value: parse_duration(value, name)


def _moment(name: str) -> Any:
    def read(value: object) -> float:
        if isinstance(value, str) and not re.fullmatch(r"\s*-?\d+(\.\d*)?\s*", value):
            from datetime import datetime

            try:
                moment = datetime.fromisoformat(value)
            except ValueError as exc:
                raise ConfigError(f"{name}: expected epoch seconds or an ISO-8601 time, got {value!r}") from exc
            if moment.tzinfo is None:
                raise ConfigError(f"{name}: {value!r} has no UTC offset (add Z or +hh:mm)")
            return moment.timestamp()
        if hasattr(value, "timestamp") and not isinstance(value, int | float):  # a TOML date-time
            if getattr(value, "tzinfo", None) is None:
                raise ConfigError(f"{name}: {value!r} has no UTC offset (add Z or +hh:mm)")
            return float(value.timestamp())
        return _number(name)(value)  # type: ignore[no-any-return]  # float

    return read


def parse_boolean(value: object, name: str = "setting") -> bool:
    """``true``/``false`` from a TOML boolean or text (``1``, ``yes``, ``on``, ...).

    >>> parse_boolean("off"), parse_boolean(True)
    (False, True)
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def _boolean(name: str) -> Any:
    return lambda value: parse_boolean(value, name)


def _windows(value: object) -> tuple[float, ...]:
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    return tuple(parse_duration(item, "windows") for item in items if str(item).strip())


def _kinds(value: object) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, Mapping):
        raise ConfigError("kinds: expected a table of kind = grade, e.g. [kinds] purchase = 3")
    return tuple((str(k), _number(f"kinds.{k}")(v)) for k, v in value.items())


def _segment_values(value: object) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``{platform = ["ios", "android"], ...}``: the values of each listed segment field."""
    if not isinstance(value, Mapping) or not all(isinstance(v, list | tuple) for v in value.values()):
        raise ConfigError('segment_values: expected a table of field = [values], e.g. {platform = ["ios", "web"]}')
    return tuple((str(k), tuple(str(item) for item in v)) for k, v in value.items())


def _names(name: str) -> Any:
    def read(value: object) -> tuple[str, ...]:
        items = value if isinstance(value, list | tuple) else str(value).split(",")
        return tuple(str(item).strip() for item in items if str(item).strip())

    return read


def _experiments(value: object) -> tuple[tuple[str, ExperimentSettings], ...]:
    """``[experiments.NAME]`` tables: ``control`` (the others are treatments), ``treatment`` (with ``control``: the
    one treatment of a two-arm config), ``split``, ``primary``, ``guardrails``, ``cuped``, ``cuped_lookback``,
    ``cuped_table``; each optional."""
    if not isinstance(value, Mapping):
        raise ConfigError('experiments: expected tables like [experiments.exp1] control = "a"')
    out = []
    for name, table in value.items():
        if not isinstance(table, Mapping):
            raise ConfigError(f'experiments.{name}: expected a table like control = "a"')
        known = ("control", "treatment", "split", "primary", "guardrails", "cuped", "cuped_lookback", "cuped_table")
        unknown = set(table) - set(known)
        if unknown:
            raise ConfigError(f"experiments.{name}: unknown setting(s) {', '.join(sorted(unknown))} (known: "
                              f"{', '.join(known)})")
        if "treatment" in table and "control" not in table:
            raise ConfigError(f"experiments.{name}: a treatment needs its control")
        control = str(table["control"]) if "control" in table else None
        treatments = _names(f"experiments.{name}.treatment")(table.get("treatment", ()))
        if control in treatments:
            raise ConfigError(f"experiments.{name}: the control {control!r} cannot be a treatment too")
        split = _split(str(name), table["split"]) if "split" in table else ()
        arms = {arm for arm, _ in split}
        if split and (control is not None and control not in arms or not set(treatments) <= arms):
            raise ConfigError(f"experiments.{name}: control and treatment must be arms of the split "
                              f"({', '.join(sorted(arms))})")
        primary = _names(f"experiments.{name}.primary")(table.get("primary", ()))
        guardrails = _guardrails(str(name), table.get("guardrails", {}))
        both = set(primary) & {metric for metric, _ in guardrails}
        if both:
            raise ConfigError(f"experiments.{name}: {', '.join(sorted(both))} cannot be both primary and a guardrail")
        cuped = parse_boolean(table.get("cuped", False), f"experiments.{name}.cuped")
        lookback = parse_duration(table.get("cuped_lookback", CUPED_LOOKBACK), f"experiments.{name}.cuped_lookback")
        if not (lookback > 0 and math.isfinite(lookback)):
            raise ConfigError(f"experiments.{name}.cuped_lookback: must be a positive duration, got {lookback}")
        cuped_table = str(table.get("cuped_table", ""))
        if cuped_table and not cuped:
            raise ConfigError(f"experiments.{name}: cuped_table needs cuped = true")
        out.append((str(name), ExperimentSettings(control, treatments, split, primary, guardrails, cuped, lookback,
                                                  cuped_table)))
    return tuple(out)


def _guardrails(name: str, value: object) -> tuple[tuple[str, Tolerance], ...]:
    """``{"ERR@10" = "-1%", "GAUC" = -0.005}``: a tolerated relative loss (text ending in %) or absolute one."""
    if not isinstance(value, Mapping):
        raise ConfigError(f'experiments.{name}.guardrails: expected a table like {{"ERR@10" = "-1%", '
                          '"GAUC" = -0.005}')
    out = []
    for metric, raw in value.items():
        setting = f"experiments.{name}.guardrails.{metric}"
        text = raw.strip() if isinstance(raw, str) else None
        relative = text is not None and text.endswith("%")
        amount = _number(setting)(text[:-1] if relative and text is not None else raw)
        if isinstance(raw, bool) or not math.isfinite(amount) or amount == 0:
            raise ConfigError(f"{setting}: expected a tolerated loss like \"-1%\" or -0.005, got {raw!r}")
        if relative and amount <= -100:  # (every measure is >= 0: its lift is never below -100 %)
            raise ConfigError(f"{setting}: a relative loss of {raw!r} can never be breached (a lift is never "
                              "below -100%)")
        out.append((str(metric), Tolerance(amount / 100 if relative else amount, relative)))
    return tuple(out)


MIN_SHARE = 1e-9
"""The smallest share of the units a ``split`` may give an arm (of the total; a sample-ratio test needs some)."""


def _split(name: str, value: object) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, Mapping) or len(value) < 2:
        raise ConfigError(f"experiments.{name}.split: expected a table of two or more arm = share, e.g. "
                          "{a = 0.5, b = 0.5}")
    shares = {str(arm): _number(f"experiments.{name}.split.{arm}")(share) for arm, share in value.items()}
    if any(not share > 0 for share in shares.values()):
        raise ConfigError(f"experiments.{name}.split: every share must be positive, got {shares}")
    if max(shares.values()) <= 1.0 and math.isclose(math.fsum(shares.values()), 1.0, rel_tol=1e-12):
        # (kept as written: 0.34, not 0.33999999999999997)
        scaled = shares
    else:
        largest = max(shares.values())  # (scaled to it first: shares of 1e308 do not sum to inf)
        relative = {arm: share / largest for arm, share in shares.items()}
        total = sum(relative.values())
        scaled = {arm: share / total for arm, share in relative.items()}
    smallest = min(scaled, key=scaled.__getitem__)
    if scaled[smallest] < MIN_SHARE:
        raise ConfigError(f"experiments.{name}.split: {smallest!r} would get {scaled[smallest]:.3g} of the units; "
                          f"every share must be at least {MIN_SHARE:g} of the total")
    return tuple(sorted(scaled.items()))


READERS: dict[str, Any] = {
    "cutoffs": _cutoffs,
    "metrics": _metric_names,
    "gain": str,
    "max_grade": _number("max_grade"),
    "rel_threshold": _number("rel_threshold"),
    "empty": str,
    "gauc_weight": str,
    "attribution_window": _duration("attribution_window"),
    "allowed_lateness": _duration("allowed_lateness"),
    "session_gap": _duration("session_gap"),
    "alpha": _number("alpha"),
    "max_items": _integer("max_items"),
    "gsb_metric": str,
    "gsb_epsilon": _number("gsb_epsilon"),
    "gsb_window": _duration("gsb_window"),
    "confidence": _number("confidence"),
    "sequential_n": _number("sequential_n"),
    "look_every": _duration("look_every"),
    "srm_alpha": _number("srm_alpha"),
    "ab": _boolean("ab"),
    "kinds": _kinds,
    "experiments": _experiments,
    "windows": _windows,
    "idle_timeout": _duration("idle_timeout"),
    "max_label_values": _integer("max_label_values"),
    "segments": _names("segments"),
    "max_segment_values": _integer("max_segment_values"),
    "segment_values": _segment_values,
    "max_open_sessions": _integer("max_open_sessions"),
    "max_open_queries": _integer("max_open_queries"),
    "max_units": _integer("max_units"),
    "max_waiting_feedback": _integer("max_waiting_feedback"),
    "min_ts": _moment("min_ts"),
    "max_ts": _moment("max_ts"),
    "max_clock_skew": _duration("max_clock_skew"),
    "sat_dwell": _duration("sat_dwell"),
    "sat_kinds": _names("sat_kinds"),
    "reformulation_gap": _duration("reformulation_gap"),
}
ENV_PREFIX = "STREAM_EVAL_"


def _read(settings: Mapping[str, object], origin: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, raw in settings.items():
        name = key.replace("-", "_")
        reader = READERS.get(name)
        if reader is None:
            raise ConfigError(f"{origin}: unknown setting {key!r} (known: {', '.join(sorted(READERS))})")
        values[name] = reader(raw)
    return values


def load_config(
    path: str | None = None,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    kinds: Callable[[tuple[tuple[str, float], ...]], tuple[tuple[str, float], ...]] | None = None,
) -> Config:
    """Build a :class:`Config` from a TOML file, ``STREAM_EVAL_*`` variables and explicit overrides; ``kinds``
    completes ``[kinds]`` (the input's own kinds: UBI's ``purchase``, ...) before the settings are checked.

    >>> load_config(overrides={"cutoffs": "5,10", "gain": "linear"}, environ={}).cutoffs
    (5, 10)
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                document = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"--config {path}: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--config {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
        document = document.get("stream_eval", document)
        # the [kafka] table holds the connection settings (stream/kafka.py reads it), [ubi] how UBI logs become
        # events (events/ubi.py reads it): neither is an evaluation setting
        values.update(_read({k: v for k, v in document.items() if k not in ("kafka", "ubi")}, f"--config {path}"))
    env = os.environ if environ is None else environ
    from_env = {k[len(ENV_PREFIX):].lower(): v for k, v in env.items() if k.startswith(ENV_PREFIX)}
    from_env = {k: v for k, v in from_env.items() if k in READERS}
    values.update(_read(from_env, "environment"))
    if overrides:
        values.update(_read({k: v for k, v in overrides.items() if v is not None}, "command line"))
    if kinds is not None:
        values["kinds"] = kinds(tuple(values.get("kinds", ())))
    return Config(**values)
