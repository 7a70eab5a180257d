"""Replay throughput from Parquet against JSON Lines, on the same events (the benchmark log of bench/generate.py).

    python bench/parquet.py              # 1M requests (~5M events); ~10-15 min on 2 cores, data generated once
    python bench/parquet.py --quick      # 50k requests, smoke run

The JSON Lines log is the one ``bench/run.py`` replays (generated and cached in ``--data-dir``); its Parquet twin
(one table, a ``type`` column, a row per event, the same order, row groups of 64k rows, Snappy) is written next
to it once, by Arrow's JSON reader. Each run is ``replay([FILE], Config())`` + ``report()`` timed inside a fresh
child process (after one untimed warm-up run of each, which loads numba's cache); the two formats alternate run
by run so that noise on a shared machine hits both alike. Reported: events/s per run as median (min-max), the
ratio Parquet / JSON Lines per pair of runs, and a check that both reports agree (floats to 1e-12 relative: the
means are summed per batch of finalised requests, whose bounds follow the reader's chunks). Results go to stdout and
``bench/out/parquet.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one core, before numpy loads
    os.environ.setdefault(_var, "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import generate as gen  # noqa: E402  (bench/ is not a package)

ROW_GROUP_ROWS = 65_536

CHILD = """
import json, sys, time
from stream_eval.config import Config
from stream_eval.engine.replay import replay
start = time.perf_counter()
report = replay([sys.argv[1]], Config()).report()
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "report": report}))
"""


def event_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("type", pa.string()), ("request_id", pa.string()), ("ts", pa.float64()), ("items", pa.list_(pa.string())),
        ("scores", pa.list_(pa.float64())), ("query_id", pa.string()), ("session_id", pa.string()),
        ("experiment", pa.string()), ("arm", pa.string()), ("item", pa.string()), ("kind", pa.string()),
        ("grade", pa.float64()),
    ])


def to_parquet(jsonl: Path, out: Path) -> None:
    """``jsonl`` as a Parquet table of its events in order (skipped when ``out`` is newer than ``jsonl``)."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    if out.exists() and out.stat().st_mtime >= jsonl.stat().st_mtime:
        print(f"parquet: {out} is up to date", file=sys.stderr)
        return
    start = time.perf_counter()
    schema = event_schema()
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    tmp = out.with_name(out.name + ".tmp")
    with pj.open_json(jsonl, parse_options=options, read_options=pj.ReadOptions(block_size=16 << 20)) as reader, \
            pq.ParquetWriter(tmp, schema) as writer:
        for batch in reader:
            writer.write_batch(batch, row_group_size=ROW_GROUP_ROWS)
    os.replace(tmp, out)
    print(f"parquet: wrote {out} ({out.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - start:.1f} s",
          file=sys.stderr)


def run_child(path: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=gen.Params.requests)
    parser.add_argument("--quick", action="store_true", help="50k requests, smoke run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data-dir", default=str(HERE / "data"))
    parser.add_argument("--out", default=str(HERE / "out" / "parquet.json"))
    args = parser.parse_args(argv)
    requests = 50_000 if args.quick else args.requests
    params = gen.Params(requests=requests)
    data = Path(args.data_dir)
    jsonl = data / "events.jsonl" if params == gen.Params() else data / f"events-{requests}-{params.rate:g}ps.jsonl"
    meta = gen.ensure(params, jsonl)
    parquet = jsonl.with_suffix(".parquet")
    to_parquet(jsonl, parquet)
    events = int(meta["lines"])  # type: ignore[call-overload]  # an int in the metadata
    for path in (jsonl, parquet):  # warm-up: numba's cache and the page cache
        run_child(path)
    rates: dict[str, list[float]] = {"jsonl": [], "parquet": []}
    reports: dict[str, Any] = {}
    for rep in range(args.repeat):
        for name, path in (("jsonl", jsonl), ("parquet", parquet)):
            result = run_child(path)
            rates[name].append(events / result["seconds"])
            reports[name] = result["report"]
            print(f"run {rep + 1} {name}: {result['seconds']:.2f} s, {rates[name][-1]:,.0f} events/s", file=sys.stderr)
    ratios = [p / j for p, j in zip(rates["parquet"], rates["jsonl"], strict=True)]
    same = agree(reports["jsonl"], reports["parquet"])

    def summary(values: list[float]) -> dict[str, float]:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "events": events, "requests": requests,
        "bytes": {"jsonl": jsonl.stat().st_size, "parquet": parquet.stat().st_size},
        "events_per_s": {name: summary(values) for name, values in rates.items()}, "ratio": summary(ratios),
        "reports_agree": same, "cpu": _cpu(), "cores": os.cpu_count(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"\n{events:,} events ({requests:,} requests); {results['cpu']}, {results['cores']} cores")
    print(f"| input | size | events/s, median (min-max) of {args.repeat} |\n|---|---|---|")
    for name in ("jsonl", "parquet"):
        s = results["events_per_s"][name]
        size = results["bytes"][name] / 1e6
        print(f"| {name} | {size:.0f} MB | {s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f}) |")
    r = results["ratio"]
    print(f"\nParquet / JSON Lines, per pair of runs: {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}); "
          f"reports agree: {same}")
    return 0 if same else 1


def agree(a: Any, b: Any) -> bool:
    """Whether two reports are equal, their floats to 1e-12 relative: the per-request values are the same, but the
    means are sums taken per batch of finalised requests, whose bounds follow the reader's chunks (JSON Lines with
    another ``CHUNK_BYTES`` differs in the same last digits)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(agree(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(agree(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-12 * max(abs(a), abs(b), 1e-300)
    return bool(a == b)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
