"""A sketch of the columnar join (docs/design.md), written to size it. It is not the product.

It computes a replay's main numbers from a JSON Lines file, with the join done on columns instead of per-event
objects:

* each chunk's feedback becomes arrays;
* lateness is one array comparison;
* duplicates and each item's best grade come from sorting the rows of a block of requests when the block is
  finalised;
* each graded item is searched once in its ranking's item text;
* the metric kernels are today's;
* group moments, session AUC over the served items, and per-query GSB verdicts are computed from columns.

Rankings pass through replay's own validation (``Validator.compact``). With ``--check`` it also prints replay()'s
numbers beside its own: the overall means, the duplicate count, sessions, GAUC and the metric GSB verdicts.

It assumes what ``bench/generate.py``'s files satisfy, and it stops if any of these fails:

* every line is a ranking or feedback in the simple form;
* every ranking arrives before its feedback;
* no request id is served twice;
* serve times never go back;
* the arms are called ``control`` and ``treatment``.

It leaves out pending and orphan feedback, remembered ids, ending a session on its gap (sessions are scored at
the end), interleaving and judgment GSB, the A/B intervals and the report's assembly.

    python bench/columnar_sketch.py bench/data/events.jsonl --check
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time

import msgspec
import numpy as np

from stream_eval.config import Config
from stream_eval.engine.replay import read_chunks, replay
from stream_eval.events.schema import SCORES_DECODER, SEP, Feedback, _RawRanking, validator
from stream_eval.metrics.aggregates import grouped_moments
from stream_eval.metrics.auc import gauc_weights, session_auc
from stream_eval.metrics.gsb import metric_verdict
from stream_eval.metrics.kernels import JudgedBatch, evaluate_batch
from stream_eval.metrics.specs import parse, request_specs

#: Requests per block of feedback rows (finalised together).
BLOCK = 8192


class Sketch:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.window = config.attribution_window
        self.horizon = config.attribution_window + config.allowed_lateness
        self.specs = request_specs(config, subtopics=False)
        self.default_grade = config.kind_grades
        self.decoder = msgspec.json.Decoder(_RawRanking | Feedback)
        self.slot_of: dict[str, int] = {}
        self.serve = np.empty(1 << 16)
        self.n_shown = np.empty(1 << 16, dtype=np.int64)
        self.texts: list[str | None] = []
        self.item_ids: dict[str, int] = {}  # items that were not served, by name
        self.kind_ids: dict[str, int] = {}
        # feedback rows of open requests by block of BLOCK slots: (slot, item id, kind id, grade) arrays
        # (late rows are never stored); a block is finalised once every request of it is due
        self.blocks: dict[int, list[tuple[np.ndarray, ...]]] = {}
        self.next_block = 0
        self.watermark = -math.inf
        self.counts = {"ok": 0, "late": 0, "duplicate": 0}
        self.sums = np.zeros(len(self.specs))
        self.n = np.zeros(len(self.specs), dtype=np.int64)
        # the rest of a report, as columns: validation, groups, sessions and GAUC, per-query GSB
        self.compact = validator(config).compact
        self.scores: list[bytes | None] = []
        self.group = np.empty(1 << 16, dtype=np.int64)
        self.session = np.empty(1 << 16, dtype=np.int64)
        self.query = np.empty(1 << 16, dtype=np.int64)
        self.group_ids: dict[tuple[str, str], int] = {}
        self.session_ids: dict[str, int] = {}
        self.query_ids: dict[tuple[str, str], int] = {}
        self.moments: list = []  # per block: group moments (kept only so that their cost is counted)
        self.gsb_column = self.specs.index(parse(config.gsb_metric))
        self.gsb_sums: list[np.ndarray] = []  # per block: (query bucket key, group, value) rows
        self.items_session: list[np.ndarray] = []  # per block: session code of each served item
        self.items_score: list[np.ndarray] = []
        self.items_label: list[np.ndarray] = []

    def _grow(self, size: int) -> None:
        while size > self.serve.shape[0]:
            self.serve = np.concatenate((self.serve, np.empty(self.serve.shape[0])))
            self.n_shown = np.concatenate((self.n_shown, np.empty(self.n_shown.shape[0], dtype=np.int64)))
            for name in ("group", "session", "query"):
                column = getattr(self, name)
                setattr(self, name, np.concatenate((column, np.empty(column.shape[0], dtype=np.int64))))

    def chunk(self, chunk: bytes) -> None:
        events = self.decoder.decode_lines(chunk)
        ts = np.array([e.ts for e in events], dtype=np.float64)
        arrival = np.maximum.accumulate(np.concatenate(([self.watermark], ts[:-1])))  # watermark before each event
        is_ranking = np.fromiter((type(e) is _RawRanking for e in events), dtype=np.bool_, count=len(events))
        rankings = [e for e in events if type(e) is _RawRanking]
        first = len(self.texts)
        self._grow(first + len(rankings))
        for offset, event in enumerate(rankings):
            if self.slot_of.setdefault(event.request_id, first + offset) != first + offset:
                sys.exit(f"assumption failed: {event.request_id} served twice")
        checked = [self.compact(e) for e in rankings]  # the SPEC's checks, as replay does them
        if None in checked:
            sys.exit("assumption failed: a ranking not in the simple form")
        self.texts += [c.items for c in checked]  # type: ignore[union-attr]
        self.scores += [c.scores for c in checked]  # type: ignore[union-attr]
        span = slice(first, first + len(rankings))
        self.n_shown[span] = [c.n for c in checked]  # type: ignore[union-attr]
        group_ids, session_ids, query_ids = self.group_ids, self.session_ids, self.query_ids
        self.group[span] = [group_ids.setdefault((c.experiment, c.arm), len(group_ids)) for c in checked]  # type: ignore[union-attr]
        self.session[span] = [session_ids.setdefault(c.session_id or c.request_id, len(session_ids))  # type: ignore[union-attr]
                              for c in checked]
        self.query[span] = [-1 if c.query_id is None else query_ids.setdefault((c.experiment, c.query_id),  # type: ignore[union-attr]
                                                                             len(query_ids)) for c in checked]
        self.serve[span] = ts[is_ranking]
        if (np.diff(self.serve[max(first - 1, 0) : span.stop]) < 0).any():
            sys.exit("assumption failed: serve times go back")
        feedback = [e for e in events if type(e) is Feedback]
        if feedback:
            found = list(map(self.slot_of.get, [e.request_id for e in feedback]))
            if None in found:
                sys.exit("assumption failed: feedback before its ranking")
            slot = np.array(found, dtype=np.int64)
            where = ~is_ranking
            fb_ts, fb_arrival = ts[where], arrival[where]
            served = self.serve[slot]
            late = (fb_ts - served > self.window) | (served + self.horizon <= fb_arrival)
            self.counts["late"] += int(late.sum())
            keep = ~late
            kept = np.flatnonzero(keep).tolist()
            grade = np.array([e.grade if e.grade is not None else self.default_grade[e.kind] for e in feedback])
            # an item is known by its served position, looked up now (one read of the request's item text); an
            # item that was not served, by -1 - its id in a table of such items
            texts = self.texts
            kept_slots = slot[keep].tolist()
            kept_items = [feedback[k].item for k in kept]
            at = [texts[r].find(f'","{item}","') if '"' not in item else -1  # type: ignore[union-attr]
                  for r, item in zip(kept_slots, kept_items, strict=True)]
            code = [texts[r].count(SEP, 0, a) + 1 if a >= 0 else -1 - self.item_ids.setdefault(item, len(self.item_ids))  # type: ignore[union-attr]
                    for r, item, a in zip(kept_slots, kept_items, at, strict=True)]
            kinds = [self.kind_ids.setdefault(feedback[k].kind, len(self.kind_ids)) for k in kept]
            new = (slot[keep], np.array(code, dtype=np.int64), np.array(kinds, dtype=np.int64), grade[keep])
            block = new[0] // BLOCK
            order = np.argsort(block, kind="stable")
            cuts = np.flatnonzero(np.diff(block[order])) + 1
            for part in np.split(order, cuts):
                if part.shape[0]:
                    self.blocks.setdefault(int(block[part[0]]), []).append(tuple(c[part] for c in new))
        self.watermark = max(self.watermark, float(ts.max()))
        # requests whose deadline serve + horizon the watermark has reached (serve times are sorted)
        ready = int(np.searchsorted(self.serve[: span.stop] + self.horizon, self.watermark, side="right"))
        while (self.next_block + 1) * BLOCK <= ready:
            self.finalise(self.next_block)

    def finalise(self, number: int) -> None:
        lo, end = number * BLOCK, min((number + 1) * BLOCK, len(self.texts))
        parts = self.blocks.pop(number, [])
        slot, item, kind, grade = (np.concatenate(c) for c in zip(*parts, strict=True)) if parts else (
            np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0))
        slot = slot - lo
        order = np.lexsort((grade, kind, item, slot))
        slot, item, kind, grade = slot[order], item[order], kind[order], grade[order]
        new_key = np.ones(slot.shape[0], dtype=np.bool_)
        new_key[1:] = (np.diff(slot) != 0) | (np.diff(item) != 0) | (np.diff(kind) != 0) | (np.diff(grade) != 0)
        self.counts["ok"] += int(new_key.sum())
        self.counts["duplicate"] += int((~new_key).sum())
        # the best grade of each (request, item)
        pair_start = np.ones(slot.shape[0], dtype=np.bool_)
        pair_start[1:] = (np.diff(slot) != 0) | (np.diff(item) != 0)
        pairs = np.flatnonzero(pair_start)
        best_grade = np.maximum.reduceat(grade, pairs) if pairs.shape[0] else np.empty(0)
        graded = best_grade > 0.0
        req, pos, best_grade = slot[pairs][graded], item[pairs][graded], best_grade[graded]
        shown = pos > 0
        batch = JudgedBatch(self.n_shown[lo:end].copy(), req[shown], pos[shown], best_grade[shown], req[~shown],
                            best_grade[~shown])
        values = evaluate_batch(batch, self.config, self.specs).values
        self.sums += np.nansum(values, axis=0)
        self.n += (~np.isnan(values)).sum(axis=0)
        group = self.group[lo:end]
        self.moments.append(grouped_moments(group, values, len(self.group_ids)))
        # per-query GSB: (experiment, query, gsb_window bucket) of each request with a query, its arm and value
        bucket = (self.serve[lo:end] // self.config.gsb_window).astype(np.int64)
        with_query = self.query[lo:end] >= 0
        self.gsb_sums.append(np.stack((self.query[lo:end][with_query], bucket[with_query], group[with_query],
                                       values[with_query, self.gsb_column])))
        # impressions of the block for session AUC: scores (one decode for the block) and relevant labels
        n = self.n_shown[lo:end]
        starts = np.zeros(end - lo + 1, dtype=np.int64)
        np.cumsum(n, out=starts[1:])
        texts = [t[1:-1] for t in self.scores[lo:end]]  # type: ignore[index]
        scores = np.array(SCORES_DECODER.decode(b"[" + b",".join(texts) + b"]"))
        labels = np.zeros(int(starts[-1]), dtype=np.bool_)
        relevant = best_grade[shown] >= self.config.rel_threshold
        labels[starts[req[shown][relevant]] + pos[shown][relevant] - 1] = True
        self.items_session.append(np.repeat(self.session[lo:end], n))
        self.items_score.append(scores)
        self.items_label.append(labels)
        self.scores[lo:end] = [None] * (end - lo)
        self.texts[lo:end] = [None] * (end - lo)
        self.next_block = number + 1

    def flush(self) -> None:
        while self.next_block * BLOCK < len(self.texts):
            self.finalise(self.next_block)

    def rest(self) -> dict[str, object]:
        """GAUC over all sessions (closed at the end: no session gap) and the per-query GSB verdicts."""
        session = np.concatenate(self.items_session)
        auc, positives, negatives = session_auc(session, np.concatenate(self.items_score),
                                                np.concatenate(self.items_label), len(self.session_ids))
        weight = gauc_weights(positives, negatives, self.config.gauc_weight)
        counted = ~np.isnan(auc) & (weight > 0)
        gauc = float((auc[counted] * weight[counted]).sum() / weight[counted].sum())
        query, bucket, group, value = np.concatenate(self.gsb_sums, axis=1)
        keep = ~np.isnan(value)
        key = (query[keep] * (1 << 20) + bucket[keep]).astype(np.int64) * len(self.group_ids) + group[keep]
        unique, inverse = np.unique(key, return_inverse=True)
        sums = np.bincount(inverse, weights=value[keep])
        counts = np.bincount(inverse)
        arms = {arm: g for (_, arm), g in self.group_ids.items()}
        control, treatment = arms["control"], arms["treatment"]
        per_query: dict[int, dict[int, float]] = {}
        for k, s_, c in zip(unique.tolist(), sums.tolist(), counts.tolist(), strict=True):
            per_query.setdefault(k // len(self.group_ids), {})[k % len(self.group_ids)] = s_ / c
        verdicts = {"good": 0, "same": 0, "bad": 0}
        for arms_of in per_query.values():
            if control in arms_of and treatment in arms_of:
                verdicts[metric_verdict(arms_of[treatment], arms_of[control], self.config.gsb_epsilon)] += 1
        return {"sessions": int(counted.sum()), "GAUC": gauc, "gsb metric": verdicts}

    def means(self) -> dict[str, float]:
        return {spec.mean_name: float(s / n) for spec, s, n in zip(self.specs, self.sums, self.n, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--check", action="store_true", help="also run replay() and compare the overall means")
    args = parser.parse_args()
    config = Config()
    sketch = Sketch(config)
    gc.disable()
    start = time.process_time()
    for chunk, _, _ in read_chunks(args.path):
        sketch.chunk(chunk)
    sketch.flush()
    rest = sketch.rest()
    seconds = time.process_time() - start
    gc.enable()
    events = len(sketch.texts) + sum(sketch.counts.values())
    print(f"columnar sketch: {seconds:.1f} s CPU, {events / seconds / 1e3:.0f}k events/s; feedback {sketch.counts}")
    if args.check:
        start = time.process_time()
        report = replay([args.path], config).report()
        seconds = time.process_time() - start
        print(f"replay():        {seconds:.1f} s CPU; events {report['events']}")
        ours = sketch.means()
        theirs = report["overall"]["metrics"]
        worst = max(abs(ours[name] - theirs[name]) for name in ours)
        print(f"overall means: max |sketch - replay| = {worst:.2e} over {', '.join(ours)}")
        gsb = next((g for g in report["gsb"] if g["source"] == "metric"), {})
        print(f"sketch: {rest}")
        print(f"replay: sessions {report['overall']['sessions']}, GAUC {report['overall']['metrics']['GAUC']}, "
              f"gsb metric {dict((k, gsb.get(k)) for k in ('good', 'same', 'bad'))}")


if __name__ == "__main__":
    main()
