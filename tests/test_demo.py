"""`stream-eval demo` end to end: broker, worker and traffic start; per-arm metrics move; Ctrl-C stops all."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

from stream_eval.stream.broker import free_port
from stream_eval.stream.demo import scrape


def _finalised(url: str) -> dict[str, float]:
    try:
        samples = scrape(url)
    except OSError:
        return {}
    return {labels["arm"]: value for labels, value in samples.get("stream_eval_requests_total", [])}


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_demo_shows_both_arms_and_stops_cleanly_on_ctrl_c() -> None:
    port, metrics_port = free_port(), free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "stream_eval.cli", "demo", "--port", str(port), "--metrics-port", str(metrics_port),
         "--rate", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        deadline = time.monotonic() + 120
        finalised: dict[str, float] = {}
        while time.monotonic() < deadline and demo.poll() is None:
            finalised = _finalised(url)
            if finalised.get("control", 0) > 0 and finalised.get("treatment", 0) > 0:
                break
            time.sleep(1)
        assert finalised.get("control", 0) > 0 and finalised.get("treatment", 0) > 0, finalised
        samples = scrape(url)
        windows = {(s["arm"], s["metric"], s["window"]) for s, _ in samples["stream_eval_window_mean"]}
        for arm in ("control", "treatment"):
            for metric in ("MRR", "nDCG@10", "ERR@10"):
                assert (arm, metric, "5m") in windows
        assert any(labels["source"] == "judgment" for labels, _ in samples["stream_eval_gsb_total"])
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    assert demo.returncode == 0, err.decode()
    view = out.decode()
    assert "exp1 / control" in view and "exp1 / treatment" in view and "GSB exp1" in view
    assert not _listening(port) and not _listening(metrics_port)  # broker and worker are gone
