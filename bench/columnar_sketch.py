"""A sketch of the columnar join (docs/design.md), written to size it. It is not the product.

It computes the per-request metrics of a JSON Lines file with the join done on columns instead of per-event
objects. Each chunk's feedback becomes arrays. Lateness is one array comparison. Duplicates and each item's best
grade come from sorting the rows of the requests being finalised. Each graded item is searched once in its
ranking's item text, and the metric kernels run on the result. It prints the CPU time and the overall means,
beside those of ``replay()`` when ``--check`` is given.

It assumes what ``bench/generate.py``'s files satisfy:

* every line is a valid ranking or feedback in the simple form. Only msgspec's types check this: the sketch
  skips the SPEC's other checks;
* every ranking arrives before its feedback;
* no request id is served twice;
* serve times never go back.

It stops if one of the last three fails.

It leaves out pending and orphan feedback, remembered ids, sessions, GAUC, GSB, groups and A/B. Those are the
rest of the work the real design must fit in its time budget.

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
from stream_eval.events.schema import SEP, Feedback, _RawRanking
from stream_eval.metrics.kernels import JudgedBatch, evaluate_batch
from stream_eval.metrics.specs import request_specs

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
        self.item_ids: dict[str, int] = {}
        self.item_names: list[str] = []
        self.kind_ids: dict[str, int] = {}
        # feedback rows of open requests by block of BLOCK slots: (slot, item id, kind id, grade) arrays
        # (late rows are never stored); a block is finalised once every request of it is due
        self.blocks: dict[int, list[tuple[np.ndarray, ...]]] = {}
        self.next_block = 0
        self.watermark = -math.inf
        self.counts = {"ok": 0, "late": 0, "duplicate": 0}
        self.sums = np.zeros(len(self.specs))
        self.n = np.zeros(len(self.specs), dtype=np.int64)

    def _grow(self, size: int) -> None:
        while size > self.serve.shape[0]:
            self.serve = np.concatenate((self.serve, np.empty(self.serve.shape[0])))
            self.n_shown = np.concatenate((self.n_shown, np.empty(self.n_shown.shape[0], dtype=np.int64)))

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
        texts = ['",' + bytes(e.items).decode()[1:-1] + ',"' for e in rankings]
        self.texts += texts
        self.n_shown[first : first + len(rankings)] = [text.count(SEP) - 1 for text in texts]
        serve = ts[is_ranking]
        self.serve[first : first + len(rankings)] = serve
        if (np.diff(self.serve[max(first - 1, 0) : first + len(rankings)]) < 0).any():
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
            grade = np.array([e.grade if e.grade is not None else self.default_grade[e.kind] for e in feedback])
            items = [e.item for e in feedback]
            ids = list(map(self.item_ids.get, items))
            if None in ids:
                for k, item in enumerate(items):
                    if ids[k] is None:
                        ids[k] = self.item_ids.setdefault(item, len(self.item_ids))
                        if ids[k] == len(self.item_names):
                            self.item_names.append(item)
            kinds = [self.kind_ids.setdefault(e.kind, len(self.kind_ids)) for e in feedback]
            keep = ~late
            new = (slot[keep], np.array(ids, dtype=np.int64)[keep], np.array(kinds, dtype=np.int64)[keep],
                   grade[keep])
            block = new[0] // BLOCK
            order = np.argsort(block, kind="stable")
            cuts = np.flatnonzero(np.diff(block[order])) + 1
            for part in np.split(order, cuts):
                if part.shape[0]:
                    self.blocks.setdefault(int(block[part[0]]), []).append(tuple(c[part] for c in new))
        self.watermark = max(self.watermark, float(ts.max()))
        # requests whose deadline serve + horizon the watermark has reached (serve times are sorted)
        end = first + len(rankings)
        ready = int(np.searchsorted(self.serve[:end] + self.horizon, self.watermark, side="right"))
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
        starts = np.flatnonzero(pair_start)
        best_grade = np.maximum.reduceat(grade, starts) if starts.shape[0] else np.empty(0)
        graded = best_grade > 0.0
        req, item_of, best_grade = slot[starts][graded], item[starts][graded], best_grade[graded]
        texts, names = self.texts, self.item_names
        found = [texts[lo + r].find(f'","{names[i]}","') for r, i in zip(req.tolist(), item_of.tolist(), strict=True)]
        pos = np.array([texts[lo + r].count(SEP, 0, at) + 1 if at >= 0 else 0
                        for r, at in zip(req.tolist(), found, strict=True)], dtype=np.int64)
        shown = pos > 0
        batch = JudgedBatch(self.n_shown[lo:end].copy(), req[shown], pos[shown], best_grade[shown], req[~shown],
                            best_grade[~shown])
        values = evaluate_batch(batch, self.config, self.specs).values
        self.sums += np.nansum(values, axis=0)
        self.n += (~np.isnan(values)).sum(axis=0)
        self.texts[lo:end] = [None] * (end - lo)
        self.next_block = number + 1

    def flush(self) -> None:
        while self.next_block * BLOCK < len(self.texts):
            self.finalise(self.next_block)

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


if __name__ == "__main__":
    main()
