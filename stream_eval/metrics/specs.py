"""Measures as values, and the one registry of measure families.

A measure is an immutable value with one canonical name, spelled as ir_measures spells it where it has the measure:
``FAMILY[(param=value,...)][@k]``, e.g. ``nDCG@10``, ``nDCG(gain=linear)@10``, ``P(rel=2)@5``, ``RR(rel=2)``,
``RBP(p=0.8)``, ``R-Prec``. The canonical name is the dict key of every per-request value, the JSON key of the
report, the ``metric`` label in Prometheus and the A/B row's ``metric``. Names are parsed in one place,
:func:`parse`; a parameter a name does not give takes the global setting (``rel`` <- ``rel_threshold``, ``gain``
<- ``gain``, ...), so every name of docs/contract.md §2 keeps its meaning.

:data:`REGISTRY` holds one :class:`Family` per measure family: its cutoff rule, its parameters, its kernel, whether
it is zeroed for empty requests and the oracle it is tested against. Adding a measure adds one entry here (and its
kernel in :mod:`stream_eval.metrics.kernels`) and one oracle test (README, "Adding a measure").
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from stream_eval.metrics import kernels

if TYPE_CHECKING:
    from stream_eval.config import Config

ParamValue = float | str


class MetricNameError(ValueError):
    """A measure name that does not parse, names no registered family, or has a parameter it does not take."""


# -- parameters -------------------------------------------------------------------------------------------------
def _number(name: str, text: ParamValue, low: float, high: float, low_open: bool, high_open: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise MetricNameError(f"parameter {name}: {text!r} is not a number") from None
    if not ((low < value if low_open else low <= value) and (value < high if high_open else value <= high)):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise MetricNameError(f"parameter {name}: {text!r} is not in {interval}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class Param:
    """A measure parameter: how to read it from a name, and its default (a :class:`Config` setting or a constant)."""

    read: Callable[[ParamValue], ParamValue]
    setting: str | None = None
    constant: ParamValue | None = None

    def default(self, config: Config) -> ParamValue:
        value = getattr(config, self.setting) if self.setting is not None else self.constant
        assert value is not None
        return value


def _choice(name: str, choices: tuple[str, ...]) -> Callable[[ParamValue], ParamValue]:
    def read(text: ParamValue) -> ParamValue:
        if text not in choices:
            raise MetricNameError(f"parameter {name}: {text!r} is not one of {', '.join(choices)}")
        return str(text)

    return read


PARAMS: dict[str, Param] = {
    "rel": Param(lambda v: _number("rel", v, 0.0, float("inf"), True, True), setting="rel_threshold"),
    "gain": Param(_choice("gain", ("exp", "linear")), setting="gain"),
    "max_grade": Param(lambda v: _number("max_grade", v, 0.0, float("inf"), True, True), setting="max_grade"),
    "alpha": Param(lambda v: _number("alpha", v, 0.0, 1.0, False, True), setting="alpha"),
    "p": Param(lambda v: _number("p", v, 0.0, 1.0, True, True), constant=0.8),
}


# -- the registry -----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Family:
    """One measure family: everything the code needs to know about it, in one place.

    ``cutoff``: ``required`` (``P@k``), ``none`` (``RR``) or ``optional`` (``Judged``, whole list without).
    ``kernel``: the batch kernel; ``None`` for alpha-nDCG, which needs the items' subtopics (the engine fills it).
    ``zeroed``: set to 0 for empty requests under ``empty = zero`` (docs/contract.md §2). ``oracle``: what the tests
    check it against (``tests/test_measures.py`` fails for a family that no ``@oracle_for`` test covers).

    ``scope``: ``relevance`` (a value of the request's grades; undefined for a request that served nothing),
    ``behaviour`` (a value of the request's clicks, dwell and feedback kinds: the ``empty`` policy does not apply)
    or ``session`` (known when the request's session closes, where GAUC is: not in the per-request records).
    ``lower_is_better``: the A/B decision calls a fall ``better`` (``Abandoned``, ``TimeToFirstClick``, ...).
    """

    name: str
    cutoff: str
    params: tuple[str, ...]
    kernel: kernels.Kernel | None
    zeroed: bool
    oracle: str
    mean: str | None = None  # the mean's own name (docs/contract.md §3: MRR, MAP); otherwise the measure's name
    alias: str | None = None  # another spelling read by parse (ir_measures': Rprec, alpha_nDCG)
    companion: str | None = None  # a family that runs along with this one, with the parameters it takes
    scope: str = "relevance"
    lower_is_better: bool = False

    @property
    def relevance(self) -> bool:
        """Whether the family is binary in relevance (has ``rel``): empty is then judged at its own ``rel``."""
        return "rel" in self.params


_BEHAVIOUR_ORACLE = "a plain loop over the log's events, request by request (tests/test_behaviour.py)"
_FAMILIES = (
    Family("RR", "none", ("rel",), kernels.reciprocal_rank, True, "pytrec_eval recip_rank", mean="MRR"),
    Family("AP", "optional", ("rel",), kernels.average_precision, True, "pytrec_eval map and map_cut", mean="MAP"),
    Family("P", "required", ("rel",), kernels.precision, False, "pytrec_eval P"),
    Family("R", "required", ("rel",), kernels.recall, True, "pytrec_eval recall"),
    Family("R-Prec", "none", ("rel",), kernels.r_precision, True, "pytrec_eval Rprec", alias="Rprec"),
    Family("Success", "required", ("rel",), kernels.success, False, "pytrec_eval success"),
    Family("DCG", "required", ("gain",), kernels.dcg, False, "the seeds' worked example (DCG@6 = 6.861)"),
    Family("nDCG", "required", ("gain",), kernels.ndcg, True, "pytrec_eval ndcg_cut (gain=linear)"),
    Family("ERR", "required", ("max_grade",), kernels.expected_reciprocal_rank, True,
           "the seeds' worked example and a position-by-position loop"),
    Family("alpha-nDCG", "required", ("alpha",), None, True, "the seeds' worked example (Clarke et al. 2008)",
           alias="alpha_nDCG"),
    Family("Judged", "optional", (), kernels.judged, False, "ir_measures Judged"),
    Family("RBP", "none", ("p", "rel"), kernels.rank_biased_precision, False, "ir_measures RBP (cwl_eval)",
           companion="RBP-Res"),
    Family("RBP-Res", "none", ("p",), kernels.rank_biased_residual, False,
           "ir_measures RBP (cwl_eval) with unjudged and unseen items relevant, minus RBP"),
    # behaviour: what users did with the list (README, "Behaviour measures"); undefined where nothing was served
    Family("CTR", "required", (), kernels.click_through, False, _BEHAVIOUR_ORACLE, scope="behaviour"),
    Family("Clicks", "optional", (), kernels.clicks, False, _BEHAVIOUR_ORACLE, scope="behaviour"),
    Family("Abandoned", "none", (), kernels.abandoned, False, _BEHAVIOUR_ORACLE, scope="behaviour",
           lower_is_better=True),
    Family("ZeroResult", "none", (), kernels.zero_result, False, _BEHAVIOUR_ORACLE, scope="behaviour",
           lower_is_better=True),
    Family("TimeToFirstClick", "none", (), kernels.time_to_first_click, False, _BEHAVIOUR_ORACLE,
           scope="behaviour", lower_is_better=True),
    Family("SatClick", "none", (), kernels.sat_click, False, _BEHAVIOUR_ORACLE, scope="behaviour"),
    # per session, scored when the session closes (engine/sessions.py)
    Family("QueriesPerSession", "none", (), None, False, _BEHAVIOUR_ORACLE, scope="session"),
    Family("Reformulation", "none", (), None, False, _BEHAVIOUR_ORACLE, scope="session", lower_is_better=True),
)
#: Every measure family by name: the one place a measure is defined.
REGISTRY: dict[str, Family] = {family.name: family for family in _FAMILIES}
#: Other spellings parse reads: the means' names (``MRR`` -> ``RR``) and ir_measures' (``Rprec`` -> ``R-Prec``).
ALIASES: dict[str, str] = {a: f.name for f in _FAMILIES for a in (f.mean, f.alias) if a is not None}
#: What runs when ``metrics`` is not set: today's set, every cutoff family at every cutoff, in this order.
DEFAULT_METRICS = ("RR", "AP", "P", "R", "DCG", "nDCG", "ERR", "alpha-nDCG")
#: The behaviour and session measures (``--metrics`` takes ``behaviour`` for all of them): off by default
#: (README, "Behaviour measures", says why).
BEHAVIOUR_METRICS = ("CTR", "Clicks", "Abandoned", "ZeroResult", "TimeToFirstClick", "SatClick", "QueriesPerSession",
                     "Reformulation")
#: Names that stand for a set of measures in ``metrics``.
GROUPS: dict[str, tuple[str, ...]] = {"default": DEFAULT_METRICS, "behaviour": BEHAVIOUR_METRICS}
#: The mean of session AUCs (a per-session measure, not a per-request one).
GAUC = "GAUC"


def _canonical(value: ParamValue) -> str:
    if isinstance(value, str):
        return value
    return str(int(value)) if value.is_integer() else repr(value)


@dataclasses.dataclass(frozen=True, slots=True)
class MetricSpec:
    """One per-request measure: a family, its cutoff ``k`` and the parameters its name gives.

    >>> MetricSpec("nDCG", 10).name
    'nDCG@10'
    >>> parse("MRR")
    MetricSpec(family='RR', k=None, params=())
    >>> parse("nDCG(gain='linear')@10").name, parse("RBP(rel=2, p=0.5)").name, parse("Rprec").name
    ('nDCG(gain=linear)@10', 'RBP(p=0.5,rel=2)', 'R-Prec')
    """

    family: str
    k: int | None = None
    params: tuple[tuple[str, ParamValue], ...] = ()

    def __post_init__(self) -> None:
        definition = REGISTRY.get(self.family)
        if definition is None:
            raise MetricNameError(f"unknown measure {self.family!r} (known: {', '.join(REGISTRY)})")
        given = dict(self.params)
        if len(given) != len(self.params) or not set(given) <= set(definition.params):
            takes = ", ".join(definition.params) or "no parameters"
            raise MetricNameError(f"measure {self.family!r} takes {takes}, got {', '.join(k for k, _ in self.params)}")
        # parameters in the family's order, values read and checked: one spelling per measure
        ordered = tuple((key, PARAMS[key].read(given[key])) for key in definition.params if key in given)
        object.__setattr__(self, "params", ordered)
        if self.k is not None and (definition.cutoff == "none" or self.k < 1):
            raise MetricNameError(f"measure {self.family!r} takes no cutoff" if definition.cutoff == "none"
                                  else f"measure {self.family!r}: cutoff must be >= 1, got {self.k}")
        if self.k is None and definition.cutoff == "required":
            raise MetricNameError(f"measure {self.family!r} is written {self.family}@k (k >= 1)")

    @property
    def definition(self) -> Family:
        return REGISTRY[self.family]

    def _spelled(self, family: str) -> str:
        params = f"({','.join(f'{k}={_canonical(v)}' for k, v in self.params)})" if self.params else ""
        return f"{family}{params}" + ("" if self.k is None else f"@{self.k}")

    @property
    def name(self) -> str:
        """Canonical per-request name: ``RR``, ``nDCG@10``, ``P(rel=2)@5``."""
        return self._spelled(self.family)

    @property
    def mean_name(self) -> str:
        """Name of the mean over requests: ``MRR`` for ``RR``, ``MAP(rel=2)`` for ``AP(rel=2)``, else the name."""
        return self._spelled(self.definition.mean or self.family)

    @property
    def needs_subtopics(self) -> bool:
        """alpha-nDCG: computed by the engine from the items' subtopics, reported once a ranking had them."""
        return self.definition.kernel is None and self.definition.scope == "relevance"

    @property
    def per_session(self) -> bool:
        """A session measure: valued when the request's session closes, not when the request is finalised."""
        return self.definition.scope == "session"

    def resolve(self, config: Config) -> dict[str, ParamValue]:
        """Every parameter of the family: as the name gives it, else the global setting (or constant)."""
        given = dict(self.params)
        return {key: given[key] if key in given else PARAMS[key].default(config) for key in self.definition.params}

    def __str__(self) -> str:
        return self.name


_NAME = re.compile(r"^(?P<family>[A-Za-z][\w-]*?)(?:\((?P<params>[^()]*)\))?(?:@(?P<k>[^@]*))?$")


def _parts(name: str) -> tuple[str, int | None, tuple[tuple[str, ParamValue], ...]]:
    match = _NAME.match(name.strip())
    if match is None:
        raise MetricNameError(f"cannot read {name!r} as a measure (FAMILY, FAMILY@k or FAMILY(param=value,...)@k)")
    family = ALIASES.get(match["family"], match["family"])
    params: list[tuple[str, ParamValue]] = []
    for part in (match["params"] or "").split(","):
        if not part.strip():
            continue
        key, equals, value = part.partition("=")
        if not equals:
            raise MetricNameError(f"measure {name!r}: parameter {part.strip()!r} is not written name=value")
        params.append((key.strip(), value.strip().strip("'\"")))
    k = None
    if match["k"] is not None:
        try:
            k = int(match["k"])
        except ValueError:
            raise MetricNameError(f"measure {name!r}: cutoff {match['k']!r} is not an integer") from None
    return family, k, tuple(params)


def parse(name: str) -> MetricSpec:
    """The measure of a name, or of its mean's name (``MRR`` -> ``RR``); raises :class:`MetricNameError`."""
    family, k, params = _parts(name)
    return MetricSpec(family, k, params)


def lower_is_better(name: str) -> bool:
    """Whether a fall of the measure (per-request or mean name) is an improvement; ``False`` for names that are no
    measure of the registry (``GAUC``).

    >>> lower_is_better("Abandoned"), lower_is_better("MRR"), lower_is_better("GAUC")
    (True, False, False)
    """
    try:
        return parse(name).definition.lower_is_better
    except MetricNameError:
        return False


def split_names(text: str) -> list[str]:
    """Measure names from a comma-separated list whose names may hold commas in parentheses.

    >>> split_names("nDCG@10, RBP(p=0.8,rel=2),RR")
    ['nDCG@10', 'RBP(p=0.8,rel=2)', 'RR']
    """
    return [name.strip() for name in re.findall(r"(?:[^,(]|\([^)]*\))+", text) if name.strip()]


def select(names: Iterable[str | MetricSpec], cutoffs: Iterable[int]) -> tuple[MetricSpec, ...]:
    """The measures a run computes, in the order given, each once. A family that takes a cutoff named without one
    (``nDCG``, ``P(rel=2)``) runs at every cutoff of ``cutoffs``.

    A measure with a companion brings it along: ``RBP(p=0.8)`` its residual ``RBP-Res(p=0.8)``. A name of
    :data:`GROUPS` stands for its measures: ``default`` (what runs without ``metrics``) and ``behaviour``.

    >>> [s.name for s in select(["RR", "nDCG", "P(rel=2)@5", "MRR", "RBP(p=0.5,rel=2)"], (5, 10))]
    ['RR', 'nDCG@5', 'nDCG@10', 'P(rel=2)@5', 'RBP(p=0.5,rel=2)', 'RBP-Res(p=0.5)']
    >>> [s.name for s in select(["nDCG", "behaviour"], (10,))]  # doctest: +NORMALIZE_WHITESPACE
    ['nDCG@10', 'CTR@10', 'Clicks', 'Abandoned', 'ZeroResult', 'TimeToFirstClick', 'SatClick', 'QueriesPerSession',
     'Reformulation']
    """
    chosen: dict[MetricSpec, None] = {}
    for name in [n for given in names for n in (GROUPS.get(given, (given,)) if isinstance(given, str) else (given,))]:
        if isinstance(name, MetricSpec):
            family, k, params = name.family, name.k, name.params
        else:
            family, k, params = _parts(name)
        definition = REGISTRY.get(family)
        at = (None,) if k is not None or definition is None or definition.cutoff != "required" else tuple(cutoffs)
        for cutoff in at:
            spec = MetricSpec(family, k if cutoff is None else cutoff, params)
            chosen.setdefault(spec)
            companion = spec.definition.companion
            if companion is not None:
                takes = REGISTRY[companion].params
                chosen.setdefault(MetricSpec(companion, spec.k, tuple(p for p in spec.params if p[0] in takes)))
    return tuple(chosen)


def request_specs(config: Config, subtopics: bool = True) -> tuple[MetricSpec, ...]:
    """The per-request measures a run computes (``metrics``, default :data:`DEFAULT_METRICS`), in report order."""
    return tuple(spec for spec in config.specs if subtopics or not spec.needs_subtopics)

