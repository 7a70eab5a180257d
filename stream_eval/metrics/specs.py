"""Metric specifications: immutable values with one canonical name (``nDCG@10``, ``RR``).

The canonical name is the dict key of every per-request value, the JSON key of the report and the
``metric`` label in Prometheus. Names are parsed and checked in one place, :func:`parse`.
"""

from __future__ import annotations

import dataclasses

from stream_eval.config import Config

#: Per-request families and whether they take a cutoff ``@k``.
FAMILIES: dict[str, bool] = {
    "RR": False,
    "AP": False,
    "P": True,
    "R": True,
    "DCG": True,
    "nDCG": True,
    "ERR": True,
    "alpha-nDCG": True,
}
#: Means that have a name of their own (SPEC §3); every other mean keeps its metric's name.
MEAN_NAMES: dict[str, str] = {"RR": "MRR", "AP": "MAP"}
PER_REQUEST_OF_MEAN: dict[str, str] = {mean: metric for metric, mean in MEAN_NAMES.items()}
#: Families set to 0 (policy ``zero``) for requests with no relevant judged item (SPEC §2).
ZEROED_WHEN_EMPTY = frozenset({"RR", "AP", "R", "nDCG", "ERR", "alpha-nDCG"})
#: The mean of session AUCs.
GAUC = "GAUC"


class MetricNameError(ValueError):
    """A metric name that is not one of the known families, or a cutoff that is not a positive integer."""


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class MetricSpec:
    """One per-request metric: a family and, for the ``@k`` families, a cutoff.

    >>> MetricSpec("nDCG", 10).name
    'nDCG@10'
    >>> parse("MRR")
    MetricSpec(family='RR', k=None)
    """

    family: str
    k: int | None = None

    def __post_init__(self) -> None:
        takes_cutoff = FAMILIES.get(self.family)
        if takes_cutoff is None:
            raise MetricNameError(f"unknown metric {self.family!r} (known: {', '.join(FAMILIES)})")
        if takes_cutoff != (self.k is not None) or (self.k is not None and self.k < 1):
            expected = f"{self.family}@k with k >= 1" if takes_cutoff else self.family
            raise MetricNameError(f"metric {self.family!r} is written {expected}")

    @property
    def name(self) -> str:
        """Canonical per-request name: ``RR``, ``nDCG@10``."""
        return self.family if self.k is None else f"{self.family}@{self.k}"

    @property
    def mean_name(self) -> str:
        """Name of the mean over requests: ``MRR`` for ``RR``, ``MAP`` for ``AP``, else the same name."""
        return MEAN_NAMES.get(self.name, self.name)

    def __str__(self) -> str:
        return self.name


def parse(name: str) -> MetricSpec:
    """A spec from its canonical name or its mean's name (``MRR`` -> ``RR``)."""
    name = PER_REQUEST_OF_MEAN.get(name.strip(), name.strip())
    family, _, cutoff = name.partition("@")
    if not cutoff:
        return MetricSpec(family)
    try:
        k = int(cutoff)
    except ValueError:
        raise MetricNameError(f"metric {name!r}: cutoff {cutoff!r} is not an integer") from None
    return MetricSpec(family, k)


def request_specs(config: Config, subtopics: bool = True) -> tuple[MetricSpec, ...]:
    """The per-request metrics a run computes, in report order."""
    specs = [MetricSpec("RR"), MetricSpec("AP")]
    for family in ("P", "R", "DCG", "nDCG", "ERR", "alpha-nDCG"):
        if family == "alpha-nDCG" and not subtopics:
            continue
        specs.extend(MetricSpec(family, k) for k in config.cutoffs)
    return tuple(specs)
