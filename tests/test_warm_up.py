"""``warm_up``: a worker loads every compiled loop its batches call, with each kind of array they pass it, before it
joins its group, so that no first batch waits for numba (a loop compiled, or loaded from the cache, takes up to a
second or two; with an empty cache a first run through Kafka took 7.7 CPU-s against 3.4, and a first batch held
its group that long). The worker's path is ``bench/worker_path.py``'s, which builds the worker's engines, stage and
records as the worker does, on traffic other than warm_up's own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stream_eval.simulate import SimulationConfig, simulate_lines

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = r"""
import json, sys
from pathlib import Path
import numba
sys.path.insert(0, sys.argv[1])
from stream_eval.config import Config, load_config
from stream_eval.stream.worker import warm_up
config = load_config(sys.argv[3]) if sys.argv[3] else Config()
warm_up(config)

def signatures():
    found = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("stream_eval"):
            for attr, value in list(vars(module).items()):
                if isinstance(value, numba.core.registry.CPUDispatcher):
                    found[f"{value.py_func.__module__}.{attr}"] = [str(s) for s in value.signatures]
    return found

before = signatures()
import worker_path
worker_path.measure(Path(sys.argv[2]), config, 2000, 4000, 5000, stage_count=4)
after = signatures()
print(json.dumps({name: [s for s in sigs if s not in before.get(name, [])] for name, sigs in after.items()
                  if set(sigs) - set(before.get(name, []))}))
"""


#: Traffic whose tables grow past what warm_up's own fills: an A/B shard's unit slots (one-request sessions, ~125
#: units a shard) and the join's table of items not served (labels on every request's unshown items), rebuilt.
_GROWING = SimulationConfig(requests=8000, seed=17, label_rate=1.0, sessions_per_user_requests=1)


@pytest.mark.slow
@pytest.mark.parametrize(("config", "growing"), [("", False), ("bench/all-on.toml", False), ("", True)],
                         ids=["defaults", "all-on", "growing-tables"])
def test_nothing_compiles_after_warm_up_on_a_worker_s_batches(tmp_path: Path, config: str, growing: bool) -> None:
    sim = _GROWING if growing else SimulationConfig(
        requests=3000, seed=17, judgments=True, interleaving=True, behaviour=True, unit="user", pre_period=20.0,
        arms=(("control", 0.5), ("better", 0.7), ("worse", 0.3)), segments=(("platform", ("ios", "android", "web")),),
        late_fraction=0.02, orphan_fraction=0.02, duplicate_fraction=0.02, shuffle_window=5.0)
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"".join(simulate_lines(sim)))
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT / "bench"), str(log), str(ROOT / config) if config
                           else ""], capture_output=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert json.loads(done.stdout.decode().splitlines()[-1]) == {}
