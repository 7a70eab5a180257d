"""Deterministic generator of the benchmark event log (docs/contract.md §1 JSON Lines), numpy + orjson, chunked.

    python bench/generate.py --requests 1000000 --out bench/data/events.jsonl

What it writes, per request (all draws vectorised per chunk of requests, seeded per chunk):

* one ``ranking``: ``request_id`` ``r0000042``, 16-24 unique ``items`` (``d123456`` from a 1M-item
  catalogue; mean 20), descending ``scores`` (4 decimals; ``--score-share`` of the requests carry them),
  ``query_id`` (skewed pool of 200k ids, so popular queries appear in both arms),
  ``session_id`` (sessions of ~3 requests, mildly interleaved), ``experiment`` ``exp1``, ``arm``
  ``control`` / ``treatment`` assigned per session;
* ~4 ``feedback`` events: Poisson(3.1) clicks on distinct positions (position bias ~1/pos^0.8), 3% of
  them double-clicked (duplicates, docs/contract.md §1), and for 15% of the requests editorial ``label`` events with
  grades 0-4 for 3 shown items and 1-4 for 2 judged-but-unshown items.

Event time: requests arrive as a Poisson process of ``--rate`` requests per second of event time
(default 200/s) from 2026-11-20T00:00Z; feedback comes 0-300 s after its serve time. The file is in
event-time order (the way a log or a topic would deliver it), so the open state of a streaming
evaluator holds only the last ~``attribution_window`` of requests.

The output is cached: if ``OUT`` exists and ``OUT.meta.json`` records the same parameters (and generator
version), nothing is regenerated. ``--force`` regenerates.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import orjson

GENERATOR_VERSION = 2
CATALOGUE = 1_000_000
QUERIES = 200_000  # query pool, independent of the file length: the same traffic whatever --requests
CHUNK_REQUESTS = 50_000
MAX_ITEMS = 24
MIN_ITEMS = 16
T0 = 1795132800.0  # 2026-11-20T00:00:00Z
CLICKS_MEAN = 3.1
DOUBLE_CLICK = 0.03
LABEL_SHARE = 0.15
LABEL_SHOWN = 3
LABEL_UNSHOWN = 2
SHOWN_GRADE_P = np.array([0.35, 0.30, 0.20, 0.10, 0.05])  # grades 0..4 of labelled shown items
UNSHOWN_GRADE_P = np.array([0.0, 0.40, 0.30, 0.20, 0.10])  # pooled judging prefers relevant items
MAX_DELAY = 300.0

KIND_CLICK = 1
KIND_LABEL = 2


@dataclass(frozen=True)
class Params:
    requests: int = 1_000_000
    rate: float = 200.0
    seed: int = 20261122
    score_share: float = 1.0
    version: int = GENERATOR_VERSION


# -- draws ------------------------------------------------------------------------------------------------
@dataclass
class Chunk:
    """Requests ``first .. first + n - 1`` and their feedback (unordered)."""

    first: int
    ts: np.ndarray  # (n,) serve times
    n_items: np.ndarray  # (n,)
    items: np.ndarray  # (n, MAX_ITEMS) item ids, first n_items valid
    scores: np.ndarray  # (n, MAX_ITEMS)
    has_scores: np.ndarray  # (n,) bool
    query: np.ndarray  # (n,)
    session: np.ndarray  # (n,)
    arm: np.ndarray  # (n,) 0 control, 1 treatment
    fb_req: np.ndarray  # global request index
    fb_item: np.ndarray
    fb_kind: np.ndarray
    fb_grade: np.ndarray
    fb_ts: np.ndarray


def _unique_rows(rng: np.random.Generator, items: np.ndarray) -> None:
    """Redraw rows that hold a repeated id in place until every row is unique (rare with a 1M catalogue)."""
    while True:
        s = np.sort(items, axis=1)
        bad = np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1))
        if bad.size == 0:
            return
        items[bad] = rng.integers(0, CATALOGUE, (bad.size, items.shape[1]))


def _top_k_positions(
    rng: np.random.Generator, log_w: np.ndarray, valid: np.ndarray, k: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, ``k[row]`` distinct columns drawn without replacement with weights exp(log_w) (Gumbel top-k).

    Returns ``(rows, cols)`` of the chosen cells.
    """
    keys = log_w + rng.gumbel(size=valid.shape)
    keys[~valid] = -np.inf
    order = np.argsort(-keys, axis=1, kind="stable")
    take = np.arange(valid.shape[1])[None, :] < k[:, None]
    rows = np.nonzero(take)[0]
    cols = order[take]
    return rows, cols


def draw_chunk(
    params: Params, index: int, first: int, n: int, t_start: float, session_start: int
) -> tuple[Chunk, float, int]:
    """One chunk of requests; returns it with the last serve time and the next free session number."""
    rng = np.random.default_rng([params.seed, index])
    ts = t_start + np.cumsum(rng.exponential(1.0 / params.rate, n))
    ts = np.round(ts, 3)
    n_items = rng.integers(MIN_ITEMS, MAX_ITEMS + 1, n)
    items = rng.integers(0, CATALOGUE, (n, MAX_ITEMS))
    _unique_rows(rng, items)
    scores = np.round(-np.sort(-rng.random((n, MAX_ITEMS)), axis=1), 4)
    has_scores = rng.random(n) < params.score_share
    query = (QUERIES * rng.random(n) ** 2).astype(np.int64)  # q0 most popular; popular ones appear in both arms
    # Sessions of ~3 consecutive requests, then mildly interleaved within blocks of 64 requests.
    starts = rng.random(n) < 1.0 / 3.0
    if index == 0:
        starts[0] = True
    session = session_start + np.cumsum(starts) - 1
    # (when a chunk does not start a session, its first requests continue the previous chunk's last one)
    block = 64
    for b in range(0, n, block):
        rng.shuffle(session[b : b + block])
    next_session = session_start + int(starts.sum())
    arm = ((session * 2654435761) >> 11) & 1

    # Clicks: distinct positions, position bias 1/pos^0.8.
    valid = np.arange(MAX_ITEMS)[None, :] < n_items[:, None]
    pos_weight = -0.8 * np.log(np.arange(1, MAX_ITEMS + 1, dtype=np.float64))
    n_clicks = np.minimum(rng.poisson(CLICKS_MEAN, n), n_items)
    c_rows, c_cols = _top_k_positions(rng, np.broadcast_to(pos_weight, valid.shape), valid, n_clicks)
    c_delay = np.minimum(rng.exponential(40.0, c_rows.size) + 2.0 * c_cols, MAX_DELAY)
    c_ts = ts[c_rows] + c_delay
    double = rng.random(c_rows.size) < DOUBLE_CLICK
    d_rows, d_cols = c_rows[double], c_cols[double]
    d_ts = c_ts[double] + rng.uniform(0.1, 2.0, d_rows.size)

    # Labels: 3 shown items with grades 0-4 and 2 judged items that were not shown.
    labelled = np.flatnonzero(rng.random(n) < LABEL_SHARE)
    l_valid = valid[labelled]
    l_rows, l_cols = _top_k_positions(rng, np.zeros(l_valid.shape), l_valid, np.full(labelled.size, LABEL_SHOWN))
    l_rows = labelled[l_rows]
    l_grade = rng.choice(5, l_rows.size, p=SHOWN_GRADE_P)
    l_ts = ts[l_rows] + rng.uniform(0.0, MAX_DELAY, l_rows.size)
    u_rows = np.repeat(labelled, LABEL_UNSHOWN)
    u_item = rng.integers(0, CATALOGUE, u_rows.size)
    shown_here = (items[u_rows] == u_item[:, None]).any(axis=1)
    u_item[shown_here] = (u_item[shown_here] + 1) % CATALOGUE  # still unshown unless two neighbours were shown
    shown_here = (items[u_rows] == u_item[:, None]).any(axis=1)
    u_item, u_rows = u_item[~shown_here], u_rows[~shown_here]
    u_grade = rng.choice(5, u_rows.size, p=UNSHOWN_GRADE_P)
    u_ts = ts[u_rows] + rng.uniform(0.0, MAX_DELAY, u_rows.size)

    fb_req = np.concatenate([c_rows, d_rows, l_rows, u_rows])
    fb_item = np.concatenate([items[c_rows, c_cols], items[d_rows, d_cols], items[l_rows, l_cols], u_item])
    fb_kind = np.concatenate(
        [
            np.full(c_rows.size + d_rows.size, KIND_CLICK, dtype=np.int8),
            np.full(l_rows.size + u_rows.size, KIND_LABEL, dtype=np.int8),
        ]
    )
    fb_grade = np.concatenate([np.ones(c_rows.size + d_rows.size, dtype=np.int64), l_grade, u_grade])
    fb_ts = np.round(np.concatenate([c_ts, d_ts, l_ts, u_ts]), 3)
    chunk = Chunk(
        first,
        ts,
        n_items,
        items,
        scores,
        has_scores,
        query,
        session,
        arm,
        fb_req + first,
        fb_item,
        fb_kind,
        fb_grade,
        fb_ts,
    )
    return chunk, float(ts[-1]), next_session


# -- serialisation ------------------------------------------------------------------------------------------
_NAMES: list[str] | None = None


def item_names() -> list[str]:
    global _NAMES
    if _NAMES is None:
        _NAMES = [f"d{j:06d}" for j in range(CATALOGUE)]
    return _NAMES


ARMS = ("control", "treatment")
NL = b"\n"


def ranking_lines(chunk: Chunk) -> list[bytes]:
    names = item_names()
    dumps = orjson.dumps
    out = []
    items = chunk.items.tolist()
    scores = chunk.scores.tolist()
    for k, (n, ts, q, s, arm, has) in enumerate(
        zip(
            chunk.n_items.tolist(),
            chunk.ts.tolist(),
            chunk.query.tolist(),
            chunk.session.tolist(),
            chunk.arm.tolist(),
            chunk.has_scores.tolist(),
            strict=True,
        )
    ):
        event = {
            "type": "ranking",
            "request_id": f"r{chunk.first + k:07d}",
            "ts": ts,
            "items": [names[j] for j in items[k][:n]],
        }
        if has:
            event["scores"] = scores[k][:n]
        event["query_id"] = f"q{q}"
        event["session_id"] = f"s{s}"
        event["experiment"] = "exp1"
        event["arm"] = ARMS[arm]
        out.append(dumps(event) + NL)  # + NL also copies orjson's 4 KiB output buffer into a right-sized one
    return out


def feedback_lines(
    req: np.ndarray, item: np.ndarray, kind: np.ndarray, grade: np.ndarray, ts: np.ndarray
) -> list[bytes]:
    names = item_names()
    dumps = orjson.dumps
    out = []
    for r, i, k, g, t in zip(req.tolist(), item.tolist(), kind.tolist(), grade.tolist(), ts.tolist(), strict=True):
        if k == KIND_CLICK:
            out.append(
                dumps({"type": "feedback", "request_id": f"r{r:07d}", "item": names[i], "kind": "click", "ts": t}) + NL
            )
        else:
            out.append(
                dumps(
                    {
                        "type": "feedback",
                        "request_id": f"r{r:07d}",
                        "item": names[i],
                        "kind": "label",
                        "grade": g,
                        "ts": t,
                    }
                )
                + NL
            )
    return out


def iter_chunks(params: Params) -> Iterator[Chunk]:
    """The chunks of requests in order (each drawn from its own seed, chained on time and session numbers)."""
    t_last = T0
    session = 0
    for index, first in enumerate(range(0, params.requests, CHUNK_REQUESTS)):
        n = min(CHUNK_REQUESTS, params.requests - first)
        chunk, t_last, session = draw_chunk(params, index, first, n, t_last, session)
        yield chunk


def generate_lines(params: Params) -> Iterator[bytes]:
    """Blocks of newline-terminated JSON lines, in event-time order (ties: rankings first, then by draw)."""
    pending: tuple[np.ndarray, ...] | None = None  # feedback not yet released: req, item, kind, grade, ts
    n_chunks = (params.requests + CHUNK_REQUESTS - 1) // CHUNK_REQUESTS
    for index, chunk in enumerate(iter_chunks(params)):
        t_last = float(chunk.ts[-1])
        fb = (chunk.fb_req, chunk.fb_item, chunk.fb_kind, chunk.fb_grade, chunk.fb_ts)
        if pending is not None:
            fb = tuple(np.concatenate([a, b]) for a, b in zip(pending, fb, strict=True))
        # Every later event has ts >= the last serve time of this chunk: release what is not after it.
        release = np.ones(fb[4].size, dtype=bool) if index == n_chunks - 1 else fb[4] <= t_last
        pending = tuple(a[~release] for a in fb)
        out = tuple(a[release] for a in fb)
        lines = ranking_lines(chunk) + feedback_lines(*out)
        all_ts = np.concatenate([chunk.ts, out[4]])
        order = np.argsort(all_ts, kind="stable")
        yield b"".join([lines[k] for k in order.tolist()])


def meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


def ensure(params: Params, out: Path, force: bool = False, quiet: bool = False) -> dict[str, object]:
    """Write ``out`` unless it exists with the same parameters; returns its metadata."""
    meta_file = meta_path(out)
    wanted = asdict(params)
    if not force and out.exists() and meta_file.exists():
        meta = json.loads(meta_file.read_text())
        if meta.get("params") == wanted and meta.get("bytes") == out.stat().st_size:
            if not quiet:
                print(f"generate: {out} is up to date ({meta['lines']:,} events)", file=sys.stderr)
            return meta
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    start = time.perf_counter()
    lines = 0
    counts = {"ranking": params.requests, "feedback": 0}
    item_names()
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()  # only acyclic dicts, lists and strings are made: the collector would just rescan them
    try:
        with open(tmp, "wb", buffering=1 << 22) as f:
            for block in generate_lines(params):
                f.write(block)
                lines += block.count(b"\n")
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()
    counts["feedback"] = lines - params.requests
    os.replace(tmp, out)
    meta = {
        "params": wanted,
        "lines": lines,
        "events": counts,
        "bytes": out.stat().st_size,
        "seconds": round(time.perf_counter() - start, 2),
    }
    meta_file.write_text(json.dumps(meta, indent=1) + "\n")
    if not quiet:
        print(
            f"generate: wrote {lines:,} events ({meta['bytes'] / 1e6:.0f} MB) to {out} in {meta['seconds']} s",
            file=sys.stderr,
        )
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=Params.requests)
    parser.add_argument("--rate", type=float, default=Params.rate, help="requests per second of event time")
    parser.add_argument("--seed", type=int, default=Params.seed)
    parser.add_argument(
        "--score-share",
        type=float,
        default=Params.score_share,
        help="share of rankings that carry model scores (default 1)",
    )
    parser.add_argument("--out", default="bench/data/events.jsonl")
    parser.add_argument("--force", action="store_true", help="regenerate even if the cached file matches")
    args = parser.parse_args(argv)
    ensure(Params(args.requests, args.rate, args.seed, args.score_share), Path(args.out), args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
