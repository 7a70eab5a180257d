"""A snapshot of what the regroup stage holds since each experiment's first event, so that a new owner of the
stage need not re-read the regroup log from its start.

The A/B units (``engine/ab.py``: every experiment's units, sums, pending contributions and running looks), the
verdicts kept for the sign tests (``GsbTracker.complete`` and the interleaving credits) and the teams seen are
cumulative: without a snapshot a new owner rebuilds them from the log's first record. :func:`take` writes them
as JSON followed by the raw bytes of its arrays (every float comes back bit for bit), compressed; :func:`restore`
puts them into a fresh engine, and still reads the snapshots written before 2026-12-05 (compressed JSON alone, the
arrays' bytes in base64 within it). The stage records with the snapshot the log offset it covers (every record
before it is in the snapshot), and on a rebuild leaves the snapshot's state alone for the records before that offset
(``engine/regroup.py``).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from stream_eval.engine.ab import UnitHistory, UnitLedger, _Experiment, _Pending, _shard_limit
from stream_eval.engine.gsb import Credit, GsbKey, gsb_key
from stream_eval.engine.segment_ab import fit_codes
from stream_eval.engine.times import array_from_json, time_to_json
from stream_eval.metrics.gsb import GsbCounts

if TYPE_CHECKING:
    from stream_eval.engine.engine import Engine

#: Bytes of a snapshot per Kafka record (below the 1 MB default message size).
CHUNK_BYTES = 900_000
#: The first bytes of a snapshot of this format: then, compressed, the length of its JSON (8 bytes, little-endian),
#: the JSON, and the bytes of the arrays it refers to (``{"dtype", "shape", "at"}``: their offset after the JSON).
MAGIC = b"stream-eval snapshot 2\n"
#: zlib's run-length strategy at level 1: the units' counts and the tables' empty slots shrink, the sums' mantissas
#: are not searched for matches (docs/benchmarks.md, "Snapshots in binary").
_LEVEL, _STRATEGY = 1, zlib.Z_RLE


class _Arrays:
    """The arrays of a snapshot being written (C-contiguous, compressed from their memory): each one's bytes come
    after those before it."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray[Any, Any]] = []
        self.size = 0

    def ref(self, value: np.ndarray[Any, Any]) -> dict[str, Any]:
        data = np.ascontiguousarray(value)
        self.parts.append(data)
        ref = {"dtype": data.dtype.str, "shape": list(data.shape), "at": self.size}
        self.size += data.nbytes
        return ref


def _fields(obj: Any, arrays: _Arrays) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out[f.name] = arrays.ref(value) if isinstance(value, np.ndarray) else value
    return out


def load(data: bytes) -> dict[str, Any]:
    """The state a snapshot holds, as :func:`take` put it, its arrays (the fields of the units' shards and CUPED
    histories, the pending contributions' columns) as arrays, writable; a snapshot written before 2026-12-05 gives
    them as :func:`~stream_eval.engine.times.array_to_json` wrote them, which :func:`restore` reads as well."""
    if not data.startswith(MAGIC):
        return orjson.loads(zlib.decompress(data))  # type: ignore[no-any-return]  # (a JSON object)
    body = zlib.decompress(memoryview(data)[len(MAGIC) :])
    length = int.from_bytes(body[:8], "little")
    state: dict[str, Any] = orjson.loads(memoryview(body)[8 : 8 + length])
    start = 8 + length

    def array(ref: dict[str, Any]) -> np.ndarray[Any, Any]:
        dtype, shape = np.dtype(ref["dtype"]), tuple(ref["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(body, dtype, count, start + int(ref["at"])).reshape(shape).copy()

    def arrays_of(fields: dict[str, Any], names: tuple[str, ...]) -> None:  # (other values may be users' names)
        for name in names:
            if name in fields:
                fields[name] = array(fields[name])

    saved = state["ledger"]
    for shards, names in [(shards, _EXPERIMENT_ARRAYS) for shards in saved["experiments"].values()] + [
            (saved["history"], _HISTORY_ARRAYS)]:
        for fields in shards.values():
            arrays_of(fields, names)
    for pending in saved["pending"]:
        arrays_of(pending, _PENDING_ARRAYS)
    return state


def _unarray(value: Any) -> np.ndarray[Any, Any]:
    """An array of :func:`load`'s state (one of a snapshot before 2026-12-05: from its JSON form)."""
    return value if isinstance(value, np.ndarray) else array_from_json(value)


def _array_fields(obj: Any) -> tuple[str, ...]:
    """The fields of the dataclass ``obj`` that hold arrays (known by the field: the keys of a value that is a table
    of names are users' strings, and an arm may be called "dtype")."""
    return tuple(f.name for f in dataclasses.fields(obj) if isinstance(getattr(obj, f.name), np.ndarray))


_EXPERIMENT_ARRAYS = _array_fields(_Experiment(1))
_HISTORY_ARRAYS = _array_fields(UnitHistory(1, 1))
_PENDING_ARRAYS = ("keys", "y", "n")


def _experiment(data: dict[str, Any]) -> _Experiment:
    experiment = _Experiment(data["width"])
    _set_fields(experiment, data, _EXPERIMENT_ARRAYS)
    experiment.counts_requests = "requests" in data and bool(data.get("counts_requests", True))
    return experiment


def _history(data: dict[str, Any]) -> UnitHistory:
    history = UnitHistory(data["width"], data["buckets"])
    _set_fields(history, data, _HISTORY_ARRAYS)
    return history


def _set_fields(obj: Any, data: dict[str, Any], arrays: tuple[str, ...]) -> None:
    """Set the dataclass ``obj``'s fields found in ``data``, those named in ``arrays`` as arrays."""
    for f in dataclasses.fields(obj):
        if f.name in data:
            value = data[f.name]
            setattr(obj, f.name, _unarray(value) if f.name in arrays else value)


def take(engine: Engine) -> bytes:
    """The stage-held state of ``engine``, compressed."""
    ledger, gsb = engine.ledger, engine.gsb
    arrays = _Arrays()
    state = {
        "ledger": {
            "experiments": {name: {str(shard): _fields(e, arrays) for shard, e in shards.items()}
                            for name, shards in ledger.experiments.items()},
            "pending": [{"keys": arrays.ref(p.keys), "ids": p.ids.tolist(), "experiments": p.experiments.tolist(),
                         "arms": p.arms.tolist(), "units": p.units.tolist(), "y": arrays.ref(p.y),
                         "n": arrays.ref(p.n), "segments": p.segments}
                        for p in ledger._pending],
            "segment_fields": list(engine.config.segments),
            "merger": ledger.merger.state_to_json(),
            "history": {str(shard): _fields(h, arrays) for shard, h in ledger.history.items()},
            "changed": sorted(ledger._changed),
            "times": [None if ledger.open_look is None else time_to_json(ledger.open_look),
                      time_to_json(ledger.released), time_to_json(ledger.last_key)],
        },
        "gsb": counts_to_json(gsb.complete),
        "interleaving_credits": tallies_to_json(gsb._interleaving_complete),
        "teams": {e: sorted(t) for e, t in engine.teams_seen.items()},
    }
    text = orjson.dumps(state, option=orjson.OPT_SERIALIZE_NUMPY)
    packer = zlib.compressobj(_LEVEL, zlib.DEFLATED, 15, 9, _STRATEGY)
    packed = [packer.compress(len(text).to_bytes(8, "little")), packer.compress(text)]
    packed += [packer.compress(part.reshape(-1).view(np.uint8).data) for part in arrays.parts]
    return b"".join([MAGIC, *packed, packer.flush()])


def restore(engine: Engine, data: bytes) -> None:
    """Put a :func:`take` snapshot into ``engine`` (its ledger, complete GSB tallies and teams are replaced)."""
    state = load(data)
    saved = state["ledger"]
    ledger = UnitLedger(engine.config, engine.ledger.names[:-1], engine.ledger.names[-1])
    if any("width" in shards for shards in saved["experiments"].values()):
        raise ValueError("a snapshot of the A/B units written before they were kept in shards (2026-11-26) cannot "
                         "be read: start the group's regroup stage afresh (a new --group)")
    ledger.experiments = {name: {int(shard): _experiment(e) for shard, e in shards.items()}
                          for name, shards in saved["experiments"].items()}
    # the units' segment values, kept for the same fields only (else each takes the value of its next request)
    fields = len(engine.config.segments) if saved.get("segment_fields", []) == list(engine.config.segments) else 0
    for name, shards in ledger.experiments.items():
        for experiment in shards.values():
            capacity = experiment.unit_key.shape[0]
            if not fields:
                experiment.segment, experiment.segment_codes = fit_codes(experiment.segment, [], capacity, 0)
            experiment.fields = len(engine.config.segments)
            experiment.segment, experiment.segment_codes = fit_codes(experiment.segment, experiment.segment_codes,
                                                                     capacity, experiment.fields)
            experiment.limit = _shard_limit(engine.config)  # the setting in force now, not the snapshot's
            if name in ledger.cuped and not experiment.pre:  # CUPED turned on since: units so far get no covariate
                experiment.pre = True
                experiment.x = np.zeros((experiment.unit_key.shape[0], experiment.width))
                experiment.q = np.zeros((experiment.unit_key.shape[0], experiment.width))
    if ledger.buckets > 0:  # (CUPED's pre-period history: kept again only with the same ring of days)
        for shard, fields in saved.get("history", {}).items():
            history = _history(fields)
            if history.buckets == ledger.buckets and history.width == ledger.width:
                ledger.history[int(shard)] = history
    ledger._pending = [_Pending.of(_unarray(p["keys"]), p["ids"], p["experiments"], p["arms"], p["units"],
                                   _unarray(p["y"]), _unarray(p["n"]),
                                   None if p.get("segments") is None else
                                   [None if g is None else tuple(g) for g in p["segments"]])
                       for p in saved["pending"]]
    ledger.merger = engine.ledger.merger  # (sources and listener as set up; its state from the snapshot)
    ledger.merger.restore_json(saved["merger"])
    ledger.on_shard_look, ledger.on_progress = engine.ledger.on_shard_look, engine.ledger.on_progress
    ledger._changed = {(str(name), int(shard)) for name, shard in saved["changed"]}
    open_look, released, last_key = saved["times"]
    ledger.open_look = None if open_look is None else float(open_look)
    ledger.released, ledger.last_key = float(released), float(last_key)
    engine.ledger = ledger
    gsb = engine.gsb
    gsb.complete = counts_from_json(state["gsb"])
    gsb._interleaving_complete = tallies_from_json(state)
    for experiment, teams in state["teams"].items():
        engine.teams_seen.setdefault(experiment, set()).update(teams)


def counts_to_json(table: dict[GsbKey, GsbCounts]) -> list[list[Any]]:
    """GSB verdict counts per (experiment, treatment, source), for JSON (:func:`counts_from_json` reads them
    back)."""
    return [[*key, c.good, c.same, c.bad] for key, c in table.items()]


def counts_from_json(rows: list[list[Any]]) -> dict[GsbKey, GsbCounts]:
    """What :func:`counts_to_json` wrote (or, before A/B/n, rows without the treatment)."""
    table = {}
    for *key, good, same, bad in rows:
        counts = table[gsb_key(key)] = GsbCounts()
        counts.good, counts.same, counts.bad = good, same, bad
    return table


def tallies_to_json(tallies: dict[str, Counter[Credit]]) -> dict[str, list[list[Any]]]:
    """Interleaving credits per experiment, for JSON (:func:`tallies_from_json` reads them back)."""
    return {e: [[list(map(list, credit)), n] for credit, n in tally.items()] for e, tally in tallies.items()}


def tallies_from_json(state: dict[str, Any]) -> dict[str, Counter[Credit]]:
    """The interleaving credits of a snapshot or share ``state``. Those written before 2026-11-28 (under
    ``interleaving``) list only the teams credited; every team seen in the experiment (``teams``) is added with 0, as
    in the credits written since (``interleaving_credits``: every team of the request), so that a team credited with
    nothing is still one that took part."""
    if "interleaving_credits" in state:
        return {e: Counter({tuple(map(tuple, credit)): n for credit, n in tally})
                for e, tally in state["interleaving_credits"].items()}
    out: dict[str, Counter[Credit]] = {}
    for e, tally in state["interleaving"].items():
        teams = dict.fromkeys(state["teams"].get(e, ()), 0)
        out[e] = Counter()
        for credit, n in tally:
            out[e][tuple(sorted({**teams, **{str(team): int(k) for team, k in credit}}.items()))] += n
    return out


def chunks(data: bytes, size: int = CHUNK_BYTES) -> list[bytes]:
    """``data`` in pieces of at most ``size`` bytes (at least one piece)."""
    return [data[k : k + size] for k in range(0, max(len(data), 1), size)]
