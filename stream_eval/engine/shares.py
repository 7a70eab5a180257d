"""What an engine has counted, as data: a partition's share of the totals, stored with its checkpoint.

When streaming, each input partition has an engine of its own (``engine/partitions.py``) and the regroup stage
has one more. Everything such an engine has *counted* — its groups' request counts and metric moments, the
sessions it scored, its event counts and invalid reasons, GSB verdicts and interleaving tallies, overflow
counts, the feedback delay histogram and the finalised part of its rolling windows — is its *share* of the
worker's totals. :func:`take` writes it as JSON-ready data at a checkpoint; :func:`restore` puts it into the
fresh engine of the partition's next owner, which rebuilds its open state muted and counts on from there. So the
totals summed over live workers survive any owner, however it stopped: a worker killed with ``kill -9`` takes
with it only what it counted after its last checkpoint, and its successor counts that again.

Floats travel as JSON numbers (orjson writes the shortest representation that reads back to the same double),
so a restored share is bit for bit the one taken.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from stream_eval.engine.snapshot import counts_from_json, counts_to_json, tallies_from_json, tallies_to_json
from stream_eval.metrics.aggregates import Moments
from stream_eval.metrics.gsb import GsbCounts

if TYPE_CHECKING:
    from stream_eval.engine.engine import Engine

_MOMENT_FIELDS = ("count", "weight", "weight_sq", "total", "total_sq")


def _moments(m: Moments) -> list[list[float]]:
    return [getattr(m, name).tolist() for name in _MOMENT_FIELDS]


def _unmoments(data: list[list[float]]) -> Moments:
    m = Moments(len(data[0]))
    m.count = np.array(data[0], dtype=np.int64)
    for name, values in zip(_MOMENT_FIELDS[1:], data[1:], strict=True):
        setattr(m, name, np.array(values, dtype=np.float64))
    return m


def take(engine: Engine, windows: bool | None = False) -> dict[str, Any]:
    """``engine``'s counted totals; with its rolling windows' finalised part (``windows``: True for all of it,
    False for what changed since the last full one, None for none)."""
    gsb = engine.gsb
    delays = engine.delays
    data: dict[str, Any] = {
        "groups": [[e, a, s.requests, s.empty, s.sessions, s.single_class, _moments(s.moments), _moments(s.gauc)]
                   for (e, a), s in zip(engine.group_keys, engine.groups, strict=True)],
        "segments": [[e, a, f, v, s.requests, s.empty, _moments(s.moments)]
                     for (e, a, f, v), s in zip(engine.segment_keys, engine.segment_groups, strict=True)],
        "counts": [[kind, status, n] for (kind, status), n in engine.counts.items()],
        "reasons": dict(engine.invalid_reasons),
        "subtopics": engine.with_subtopics,
        "arms": {e: sorted(arms) for e, arms in engine.arms_seen.items()},
        "teams": {e: sorted(teams) for e, teams in engine.teams_seen.items()},
        "gsb": counts_to_json(gsb.counts),
        "interleaving_credits": tallies_to_json(gsb._interleaving),
        "overflow": [engine.sessions.overflow, gsb.overflow],
        "delays": None if delays is None else [delays.counts.tolist(), delays.total, delays.count],
        "windows": None,
    }
    if windows is not None and engine.windows is not None:
        data["windows"] = engine.windows.share(full=windows)
    return data


def restore(engine: Engine, data: dict[str, Any], windows: dict[str, Any] | None = None) -> None:
    """Put a share taken by :func:`take` into a fresh ``engine`` (nothing counted yet). ``windows``: the full
    windows share the checkpoint's (delta) share builds on, if it is not the full one itself."""
    from stream_eval.engine.engine import GroupStats

    for e, a, requests, empty, sessions, single_class, moments, gauc in data["groups"]:
        stats = GroupStats(len(engine.specs))
        stats.requests, stats.empty, stats.sessions, stats.single_class = requests, empty, sessions, single_class
        stats.moments, stats.gauc = _unmoments(moments), _unmoments(gauc)
        engine.groups[engine.group_of(e, a)] += stats
    for e, a, f, v, requests, empty, moments in data.get("segments", ()):  # (older checkpoints have none)
        stats = GroupStats(len(engine.specs))
        stats.requests, stats.empty, stats.moments = requests, empty, _unmoments(moments)
        engine.segment_groups[engine.segment_of(e, a, f, v)] += stats
    for kind, status, n in data["counts"]:
        engine.counts[kind, status] += n
    engine.invalid_reasons.update(data["reasons"])
    engine.with_subtopics += data["subtopics"]
    for source, target in ((data["arms"], engine.arms_seen), (data["teams"], engine.teams_seen)):
        for experiment, names in source.items():
            target.setdefault(experiment, set()).update(names)
    gsb = engine.gsb
    for key, counts in counts_from_json(data["gsb"]).items():
        gsb.counts[key] = gsb.counts.get(key, GsbCounts()) + counts
    for experiment, tally in tallies_from_json(data).items():
        gsb._interleaving.setdefault(experiment, Counter()).update(tally)
    sessions, queries = data["overflow"]
    engine.sessions.overflow += sessions
    gsb.overflow += queries
    delays = engine.delays
    if data["delays"] is not None and delays is not None:
        counts, total, count = data["delays"]
        delays.counts += np.array(counts, dtype=np.int64)
        delays.total += total
        delays.count += count
    if engine.windows is not None:
        share = data["windows"]
        if windows is not None:
            engine.windows.restore(windows, share)
        elif share is not None:
            engine.windows.restore(share)
