"""The cost floor of a columnar replay: what any design that keeps msgspec decoding must spend.

Decodes a JSON Lines file chunk by chunk as replay does, puts each chunk's feedback into columns (request slot
found with one C-level ``map(dict.get)``, ts, item, kind) and gives each ranking a slot; no validation, no join
rules, no finalisation. Compare its CPU time with ``stream-eval replay`` on the same file (docs/design.md,
"The join on columns").

    python bench/floor.py bench/data/events.jsonl
"""

from __future__ import annotations

import gc
import sys
import time
from itertools import islice

import msgspec
import numpy as np

from stream_eval.engine.replay import read_chunks
from stream_eval.events.schema import Feedback, Judgment, Watermark, _RawRanking

#: Slots kept (the open requests of the main file are ~370k); the oldest are dropped in steps of ``DROP``.
OPEN = 400_000
DROP = 100_000


def floor(path: str) -> dict[str, float]:
    decoder = msgspec.json.Decoder(_RawRanking | Feedback | Judgment | Watermark)
    slot_of: dict[str, int] = {}
    rankings = rows = 0
    gc.disable()
    start = time.process_time()
    for chunk, _, _ in read_chunks(path):
        events = decoder.decode_lines(chunk)
        ranked = [e for e in events if type(e) is _RawRanking]
        feedback = [e for e in events if type(e) is Feedback]
        for event in ranked:
            slot_of[event.request_id] = rankings
            rankings += 1
        serve_ts = np.array([e.ts for e in ranked], dtype=np.float64)  # noqa: F841  # the columns themselves
        items_text = [bytes(e.items) for e in ranked]  # noqa: F841
        slots = np.array(list(map(slot_of.get, [e.request_id for e in feedback])), dtype=np.float64)  # noqa: F841
        ts = np.array([e.ts for e in feedback], dtype=np.float64)  # noqa: F841
        items = [e.item for e in feedback]  # noqa: F841
        kinds = [e.kind for e in feedback]  # noqa: F841
        rows += len(feedback)
        if len(slot_of) > OPEN + DROP:
            for rid in list(islice(slot_of, DROP)):
                del slot_of[rid]
    seconds = time.process_time() - start
    gc.enable()
    return {"cpu_s": seconds, "rankings": rankings, "feedback_rows": rows,
            "events_per_s": (rankings + rows) / seconds}


if __name__ == "__main__":
    result = floor(sys.argv[1])
    print(f"columnar floor: {result['cpu_s']:.1f} s CPU, {result['rankings']:,} rankings and "
          f"{result['feedback_rows']:,} feedback rows, {result['events_per_s'] / 1e3:.0f}k events/s")
