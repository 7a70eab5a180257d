"""``bench/scale.py``'s arithmetic: the examples in its docstrings run (what the machine leaves two workers, from
each run's cores)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_scale_bench_s_examples_run() -> None:
    done = subprocess.run([sys.executable, "-m", "doctest", "-v", "bench/scale.py"], capture_output=True, cwd=ROOT,
                          timeout=300)
    out = done.stdout.decode()
    assert done.returncode == 0, out[-3000:] + done.stderr.decode()[-3000:]
    assert "0 failed" in out and "ceilings" in out, out[-3000:]
