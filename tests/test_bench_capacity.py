"""``bench/capacity.py``, the source of docs/capacity.md's figures, on a small backlog: each section still measures the
worker's objects as they are (it had stopped at an attribute the delivery seam moved, and its stage had held every
session part to the end of the traffic, the worker's clock standing still without a broker)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import capacity
stages = capacity.child_stages(3000, 5000, 2)
state = capacity.child_stage_state(20000, 20000, 20.0)
print(json.dumps({"stages": stages, "state": state}, default=str))
"""


def test_capacity_sections_measure_the_worker_s_objects() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT / "bench")], capture_output=True, timeout=600,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    found = json.loads(done.stdout.decode().splitlines()[-1])
    stages, state = found["stages"], found["state"]
    assert stages["finalised"] == stages["requests"] == 3000
    for section in ("decode", "join", "finalise", "outputs", "A/B records", "stage", "A/B units", "checkpoints"):
        assert stages["own"][section] > 0, section  # each section's code is reached and timed
    assert stages["calls"]["outputs"] > 0 and stages["units"] > 0 and stages["reread"]["rebuilt"]
    # requests finalised while the traffic runs reach the stage then: sessions open, units counted, few parts wait
    assert 0 < state["finalised"] < state["requests"]
    assert state["open_sessions"] > 0 and state["units"] > 0
    assert state["waiting"] < state["finalised"] / 10
