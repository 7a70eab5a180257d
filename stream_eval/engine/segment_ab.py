"""A/B rows per segment value (README, "Segment A/B rows"): what the A/B units know of segments.

* **A unit's value** (:meth:`SegmentRule.assign`): per experiment and segment field, a unit has the value of its
  first request applied to the experiment (in the ledger's (key, id) order: finalisation point, then request id),
  ``__missing__`` when that request's ``attributes`` have no such field. Later requests with another value count
  for the same unit and value. It is kept as a code per unit and field (2 bytes) into its shard's table of values,
  which holds the values listed in ``segment_values``, else the first ``segment_cap`` values met in the shard's
  order (a value beyond them is ``__other__``): the same wherever the shard is held.
* **What a shard reports** (:class:`SegmentLook`, at each look boundary): per field, value and arm the number of
  units and the sums of their :func:`~stream_eval.stats.ratio.unit_terms`, never anything per unit.
* **The groups** (:func:`segment_groups`): the looks of every shard added in shard order; per experiment and field
  the ``max_segment_values`` values with the most units shown (ties by name; every listed value), ``__missing__``,
  and ``__other__`` holding the others, their sums added in the order of their names; and each group's *rest*, the
  sums of every other group of the field, by prefix and suffix sums in that order (no subtraction). So the groups
  are a function of the shards' sums, the same in replay and on any number of workers, bit for bit.

Nothing here imports ``engine/ab.py``, which holds the units and the running state of the rows and calls these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import is_not
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from stream_eval.config import Config
from stream_eval.engine.labels import MISSING, OTHER, shown_segment_values
from stream_eval.engine.times import array_from_json, array_to_json
from stream_eval.stats import ArmSums, e_bh
from stream_eval.stats.ratio import group_sums, unit_terms

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
#: A unit whose value of a field is not set yet (no request of it applied: a session came first).
UNSET = -1


@dataclass(frozen=True)
class SegmentRule:
    """The segment fields of a config, which of their values are kept per shard, and how many are shown."""

    fields: tuple[str, ...]
    allowed: Mapping[str, frozenset[str]]  # the values listed per field (``segment_values``)
    cap: int  # values kept per field not listed, per shard of an experiment (``segment_cap``)
    shown: int  # values shown per field not listed (``max_segment_values``)

    @classmethod
    def of(cls, config: Config) -> SegmentRule | None:
        """The rule of ``config`` (None: no segments)."""
        if not config.segments:
            return None
        return cls(config.segments, config.segment_allowed(), config.segment_cap, config.max_segment_values)

    def code(self, table: dict[str, int], field: str, value: str | None) -> int:
        """The code of ``value`` of ``field`` in a shard's ``table`` of its values (added when new)."""
        if value is None:
            value = MISSING
        elif field in self.allowed:
            value = value if value in self.allowed[field] else OTHER
        elif value not in table and len(table) - (MISSING in table) - (OTHER in table) >= self.cap:
            value = OTHER
        code = table.get(value)
        if code is None:
            code = table[value] = len(table)
        return code

    def assign(self, codes: npt.NDArray[np.int16], tables: list[dict[str, int]], rows: Ints,
               values: Sequence[tuple[str | None, ...] | None]) -> None:
        """Set the codes of the units (``rows`` of ``codes``, -1: a contribution not counted) not set yet from the
        first of their contributions that is a request (``values``: its value of each field; None: a session)."""
        if not len(rows):
            return
        requests = np.fromiter(map(is_not, values, repeat(None)), dtype=np.bool_, count=len(values))
        candidates = np.flatnonzero((rows >= 0) & requests)
        if not len(candidates):
            return
        unset = codes[rows[candidates], 0] == UNSET
        candidates = candidates[unset]
        _, first = np.unique(rows[candidates], return_index=True)
        for k in candidates[np.sort(first)].tolist():
            given = values[k]
            assert given is not None  # (a request)
            row = int(rows[k])
            for f, field in enumerate(self.fields):
                codes[row, f] = self.code(tables[f], field, given[f])


def fit_codes(codes: npt.NDArray[np.int16], tables: list[dict[str, int]], capacity: int,
              fields: int) -> tuple[npt.NDArray[np.int16], list[dict[str, int]]]:
    """``codes`` and ``tables`` for ``capacity`` unit rows and ``fields`` fields: as they are when they fit, else
    grown (new rows unset), or started afresh for another number of fields (units so far take the value of their
    next request)."""
    if codes.ndim != 2 or codes.shape[1] != fields or len(tables) != fields:
        return np.full((capacity, fields), UNSET, dtype=np.int16), [{} for _ in range(fields)]
    if codes.shape[0] < capacity:
        grown = np.full((capacity, fields), UNSET, dtype=np.int16)
        grown[: codes.shape[0]] = codes
        return grown, tables
    return codes, tables


@dataclass
class SegmentLook:
    """One shard's units of one experiment at a look, per value of one segment field: ``units[v, a]`` of value ``v``
    in arm ``arms[a]`` and the sums of their terms ``sums[v, a]`` (Q × K: :func:`~stream_eval.stats.ratio.unit_terms`,
    Q = 6, or 16 with CUPED's pre-period)."""

    experiment: str
    shard: int
    field: str
    arms: list[str]
    values: list[str]
    units: Ints
    sums: Floats

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (the arrays as their bytes: read back bit for bit). A dict, where a ShardLook is a list."""
        return {"e": self.experiment, "s": self.shard, "f": self.field, "a": self.arms, "v": self.values,
                "u": array_to_json(self.units), "t": array_to_json(self.sums)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SegmentLook:
        return cls(str(data["e"]), int(data["s"]), str(data["f"]), [str(a) for a in data["a"]],
                   [str(v) for v in data["v"]], array_from_json(data["u"]), array_from_json(data["t"]))


class ShardUnits(NamedTuple):
    """A shard's units as its segment looks read them: their arm codes into ``arms``, value codes per field into
    ``tables`` (:meth:`SegmentRule.assign`), sums and counts, and with CUPED their pre-period's (else None)."""

    experiment: str
    shard: int
    arms: list[str]
    unit_arm: npt.NDArray[np.int16]
    codes: npt.NDArray[np.int16]
    tables: list[dict[str, int]]
    y: Floats
    n: Floats
    x: Floats | None
    q: Floats | None


def segment_looks(rule: SegmentRule, shards: Sequence[ShardUnits]) -> list[SegmentLook]:
    """The looks of ``shards`` per field (a shard's in field order, the shards in their order; none of a shard
    without units), from their units' :func:`~stream_eval.stats.ratio.unit_terms`.

    The shards are taken together: their units' terms made at once and summed per (shard, value, arm) group, each
    group's units in their order, so each look is bit for bit what its shard's units alone give; one pass instead of
    one per shard (a look boundary changes tens of shards of a few hundred units each).
    """
    out: list[list[SegmentLook]] = [[] for _ in shards]
    for pre in (False, True):
        picked = [i for i, s in enumerate(shards) if len(s.unit_arm) and (s.x is not None) == pre]
        if picked:
            for i, looks in zip(picked, _looks_together(rule, [shards[i] for i in picked]), strict=True):
                out[i] = looks
    return [look for looks in out for look in looks]


def _looks_together(rule: SegmentRule, shards: list[ShardUnits]) -> list[list[SegmentLook]]:
    """:func:`segment_looks` of shards with units, all with or all without a pre-period."""
    sizes = [len(s.unit_arm) for s in shards]
    shard_of = np.repeat(np.arange(len(shards)), sizes)
    pre = shards[0].x is not None
    terms = unit_terms(np.concatenate([s.y for s in shards]), np.concatenate([s.n for s in shards]),
                       *((np.concatenate([s.x for s in shards if s.x is not None]),
                          np.concatenate([s.q for s in shards if s.q is not None])) if pre else ()))
    unit_arm = np.concatenate([s.unit_arm for s in shards]).astype(np.int64)
    n_arms = max(len(s.arms) for s in shards)
    out: list[list[SegmentLook]] = [[] for _ in shards]
    for f, field in enumerate(rule.fields):
        # each shard's value names: its table's, then __missing__ (a unit not set has it) when the table has none
        names = [[*s.tables[f], *(() if MISSING in s.tables[f] else (MISSING,))] for s in shards]
        missing = np.array([s.tables[f].get(MISSING, len(s.tables[f])) for s in shards], dtype=np.int64)
        n_values = max(len(v) for v in names)
        codes = np.concatenate([s.codes[:, f] for s in shards]).astype(np.int64)
        value = np.where(codes == UNSET, missing[shard_of], codes)
        groups, units_in, sums = group_sums(terms, (shard_of * n_values + value) * n_arms + unit_arm)
        pairs, inverse = np.unique(groups // n_arms, return_inverse=True)  # the (shard, value) pairs present
        units = np.zeros((len(pairs), n_arms), dtype=np.int64)
        summed = np.zeros((len(pairs), n_arms, *terms.shape[1:]))
        units[inverse, groups % n_arms] = units_in
        summed[inverse, groups % n_arms] = sums
        bounds = np.searchsorted(pairs // n_values, np.arange(len(shards) + 1)).tolist()
        pair_values = (pairs % n_values).tolist()
        for i, s in enumerate(shards):
            lo, hi, arms = bounds[i], bounds[i + 1], len(s.arms)
            out[i].append(SegmentLook(s.experiment, s.shard, field, list(s.arms),
                                      [names[i][v] for v in pair_values[lo:hi]], units[lo:hi, :arms].copy(),
                                      summed[lo:hi, :arms].copy()))
    return out


@dataclass(frozen=True)
class SegmentGroup:
    """A value of a segment field as the rows show it: the values it holds (``members``: itself, or for
    ``__other__`` every value folded into it, in name order), its units' sums per arm, and those of the rest of the
    experiment's units (every other group of the field)."""

    field: str
    value: str
    members: tuple[str, ...]
    sums: Mapping[str, ArmSums]
    rest: Mapping[str, ArmSums]
    units: int  # units of every arm


def segment_groups(looks: Mapping[tuple[int, str], SegmentLook], rule: SegmentRule,
                   terms: int) -> list[SegmentGroup]:
    """The groups of every field of an experiment from its shards' latest looks (by (shard, field)); ``terms``: Q of
    the sums (6, or 16 with CUPED: sums of another Q, from a shard kept before CUPED was turned on or off, are padded
    with zeros or cut)."""
    out: list[SegmentGroup] = []
    for field in rule.fields:
        shards = sorted((shard, look) for (shard, f), look in looks.items() if f == field)
        arms = sorted({arm for _, look in shards for arm in look.arms})
        if not arms:
            continue
        column = {arm: a for a, arm in enumerate(arms)}
        width = shards[0][1].sums.shape[3]
        per_value: dict[str, tuple[Floats, Ints]] = {}
        for _, look in shards:
            at = np.array([column[arm] for arm in look.arms], dtype=np.int64)
            sums = look.sums[:, :, :terms]  # (a CUPED experiment's shards without pre-period sums: zeros)
            if sums.shape[2] < terms:
                sums = np.concatenate([sums, np.zeros((*sums.shape[:2], terms - sums.shape[2], width))], axis=2)
            for v, value in enumerate(look.values):
                if value not in per_value:
                    per_value[value] = (np.zeros((len(arms), terms, width)), np.zeros(len(arms), dtype=np.int64))
                total, units = per_value[value]
                total[at] += sums[v]
                units[at] += look.units[v]
        traffic = {value: float(units.sum()) for value, (_, units) in per_value.items()}
        shown = shown_segment_values(traffic, None if field in rule.allowed else rule.shown)
        members: dict[str, list[str]] = {}
        for value in sorted(per_value):
            members.setdefault(value if value in shown else OTHER, []).append(value)
        names = sorted(members)
        group_terms = np.zeros((len(names), len(arms), terms, width))
        group_units = np.zeros(len(names), dtype=np.int64)
        for g, name in enumerate(names):
            for value in members[name]:
                group_terms[g] += per_value[value][0]
                group_units[g] += int(per_value[value][1].sum())
        before = np.concatenate([np.zeros((1, *group_terms.shape[1:])), np.cumsum(group_terms, axis=0)])
        after = np.concatenate([np.cumsum(group_terms[::-1], axis=0)[::-1], np.zeros((1, *group_terms.shape[1:]))])
        for g, name in enumerate(names):
            rest = before[g] + after[g + 1]
            out.append(SegmentGroup(field, name, tuple(members[name]),
                                    {arm: ArmSums.from_terms(group_terms[g, a]) for arm, a in column.items()},
                                    {arm: ArmSums.from_terms(rest[a]) for arm, a in column.items()},
                                    int(group_units[g])))
    return out


def families_rejected(log_e: Sequence[float], families: Sequence[Sequence[int]], alpha: float) -> list[bool]:
    """e-BH at level ``alpha`` within each family (indexes into ``log_e``): whether each index is rejected (an index
    in no family: never)."""
    rejected = [False] * len(log_e)
    for members in families:
        if members:
            for k, kept in zip(members, e_bh([log_e[k] for k in members], alpha).tolist(), strict=True):
                rejected[k] = kept
    return rejected
