"""What the behaviour measures cost: ``stream-eval replay`` events/s with them on and off, on the main benchmark file.

    python bench/behaviour.py                    # 1M requests (~5M events), 3 interleaved runs of each: ~10 min
    python bench/behaviour.py --requests 200000  # a quicker look

Two files: the main benchmark file (``bench/generate.py``, cached in ``bench/data``), whose clicks have no dwell, and
the same file with a ``dwell`` on every click (seconds, 0-120, a fixed function of the line number), so that the line
reader's cost of the field is measured too. Each file is replayed as a child process
(``stream-eval replay FILE --metrics M --format json -o /dev/null --no-progress``) with ``M`` = ``default`` (off: the
join keeps nothing of behaviour) and ``default,behaviour`` (on: every behaviour and session measure), the four runs
interleaved, ``--repeat`` times, so that the noise of a shared machine hits both alike. Reported: median (min-max)
events/s of each, CPU seconds and peak RSS, and the cost of turning the measures on, from the medians.

On a shared machine wall time (and even CPU time) moves with what else runs; ``--instructions N`` also counts the
instructions of one replay of N requests each way under valgrind's cachegrind, which do not, and of a replay of the
warm-up file, the start-up they share.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import generate as gen  # noqa: E402  (bench/ is not a package)
from run import count_instructions, machine_info  # noqa: E402

MODES = {"off": "default", "on": "default,behaviour"}


def with_dwell(source: Path, target: Path) -> int:
    """``source`` with ``"dwell": seconds`` on every click (0-120 s, from the line number); returns the lines."""
    if target.exists() and target.stat().st_mtime >= source.stat().st_mtime:
        return sum(1 for _ in target.open("rb"))
    lines = 0
    tmp = target.with_name(target.name + ".tmp")
    with source.open("rb") as read, tmp.open("wb", buffering=1 << 22) as write:
        for number, line in enumerate(read):
            if b'"kind":"click"' in line:
                line = line[:-2] + b',"dwell":%d.%d}\n' % divmod(number * 7919 % 1201, 10)
            write.write(line)
            lines += 1
    os.replace(tmp, target)
    return lines


def instructions(path: Path, metrics: str) -> int:
    """Instructions of one ``stream-eval replay`` (valgrind's cachegrind, without the cache simulation)."""
    return count_instructions([sys.executable, "-m", "stream_eval.cli", "replay", str(path), "--metrics", metrics,
                               "--format", "json", "-o", os.devnull, "--no-progress"])


def replay_once(path: Path, metrics: str) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one ``stream-eval replay`` child."""
    command = [sys.executable, "-m", "stream_eval.cli", "replay", str(path), "--metrics", metrics, "--format", "json",
               "-o", os.devnull, "--no-progress"]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command)} failed")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data-dir", default=str(HERE / "data"))
    parser.add_argument("--instructions", type=int, metavar="N",
                        help="also count instructions (cachegrind) of a replay of N requests each way")
    args = parser.parse_args(argv)
    info = machine_info()
    data = Path(args.data_dir)
    plain = data / f"events-{args.requests}.jsonl"
    meta = gen.ensure(gen.Params(requests=args.requests), plain)
    events = int(meta["lines"])  # type: ignore[call-overload]  # an int in the metadata
    dwell = data / f"events-{args.requests}-dwell.jsonl"
    with_dwell(plain, dwell)
    files = {"no dwell": plain, "dwell on clicks": dwell}
    small = data / "warm-up.jsonl"  # compiles numba's loops before anything is timed
    gen.ensure(gen.Params(requests=2000), small, quiet=True)
    for metrics in MODES.values():
        replay_once(small, metrics)
    runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for rep in range(args.repeat):
        for name, path in files.items():
            for mode, metrics in MODES.items():
                result = replay_once(path, metrics)
                runs.setdefault((name, mode), []).append(result)
                print(f"run {rep + 1} {name:<16} behaviour {mode:<3} {events / result[0]:>9,.0f} events/s "
                      f"(wall {result[0]:.1f} s, cpu {result[1]:.1f} s, peak RSS {result[2]:.0f} MB)", file=sys.stderr)
    print(f"\n{info['date']}, {info['cpu']}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"stream_eval at {info['commit']}; {args.requests:,} requests, {events:,} events; median (min-max) of "
          f"{args.repeat} interleaved runs; load average {info['loadavg_start'][0]:.1f} at the start\n")
    print("| file | behaviour measures | events/s | CPU s | peak RSS MB |\n|---|---|---|---|---|")
    medians: dict[tuple[str, str], float] = {}
    for (name, mode), results in runs.items():
        rates = [events / wall for wall, _, _ in results]
        medians[name, mode] = statistics.median(rates)
        print(f"| {name} | {mode} | {medians[name, mode]:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | "
              f"{statistics.median(r[1] for r in results):.1f} | {statistics.median(r[2] for r in results):.0f} |")
    for name in files:
        cost = 1 - medians[name, "on"] / medians[name, "off"]
        cpu = {mode: statistics.median(r[1] for r in runs[name, mode]) for mode in MODES}
        print(f"\n{name}: turning the behaviour measures on costs {100 * cost:.1f} % of replay events/s, "
              f"{100 * (cpu['on'] / cpu['off'] - 1):.1f} % more CPU time")
    if args.instructions:
        counted = data / f"events-{args.instructions}.jsonl"
        gen.ensure(gen.Params(requests=args.instructions), counted, quiet=True)
        for metrics in MODES.values():  # numba caches its code per CPU: valgrind's is another one
            instructions(small, metrics)
        start = instructions(small, MODES["off"])
        count = {mode: instructions(counted, metrics) for mode, metrics in MODES.items()}
        extra = count["on"] - count["off"]
        print(f"\ninstructions, {args.instructions:,} requests: off {count['off'] / 1e9:.2f} G, on "
              f"{count['on'] / 1e9:.2f} G (+{100 * extra / count['off']:.1f} %); without the "
              f"{start / 1e9:.2f} G of a replay of the 2,000-request warm-up file (start-up): "
              f"+{100 * extra / (count['off'] - start):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
