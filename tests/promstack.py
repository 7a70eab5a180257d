"""A real Prometheus and Alertmanager for tests, on 127.0.0.1 and free ports, plus the webhook they deliver to.

Imported as ``promstack`` (pytest puts this directory on ``sys.path``). Each server is a subprocess with its own
temporary directory (config, storage, log), started with :meth:`start` (which waits until it says it is ready)
and stopped with :meth:`stop` (SIGTERM, then SIGKILL); both are context managers::

    with Webhook() as webhook, Alertmanager(tmp / "am", alertmanager_config(SHIPPED, webhook.url)) as am, \\
            Prometheus(tmp / "prom", ["127.0.0.1:9464"], rule_files, alertmanager=am.address) as prom:
        prom.wait_for(lambda: prom.query("up == 1"), 30, "the target to be scraped")
        webhook.wait_for_alert({"alertname": "StreamEvalTreatmentWorse"}, 60)

The binaries come from the Debian packages ``prometheus`` and ``prometheus-alertmanager`` (``scripts/test``
installs them); :func:`require_binary` fails under CI (``CI=true``) when one is missing and skips otherwise.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TypeVar

import pytest
import yaml
from ci import in_ci

from stream_eval.stream.broker import die_with_parent, free_port, stop_process

HOST = "127.0.0.1"
STOP_GRACE = 10.0
"""Seconds between SIGTERM and SIGKILL in :meth:`Server.stop`."""

_T = TypeVar("_T")


def require_binary(*names: str, package: str) -> str:
    """Path of the first of ``names`` on ``PATH``; otherwise fail under CI, skip (with the reason) locally."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    reason = (f"{' / '.join(names)} not on PATH: install the Debian package {package} "
              f"(scripts/test does: apt-get install {package})")
    if in_ci():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)
    raise AssertionError("unreachable")  # pytest.skip raises


def wait_for(condition: Callable[[], _T], timeout: float, what: str, interval: float = 0.5) -> _T:
    """Call ``condition`` until it returns something truthy (returned) or ``timeout`` seconds pass (AssertionError).

    An ``OSError`` from ``condition`` (a server still starting) counts as not yet.
    """
    deadline = time.monotonic() + timeout
    last_error: OSError | None = None
    while True:
        try:
            result = condition()
        except OSError as error:
            last_error = error
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error})" if last_error is not None else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{detail}")
        time.sleep(interval)


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310  # our own local servers
        return json.loads(response.read())


class Server:
    """A server subprocess with a working directory and a log; subclasses say how to start it and when it is up."""

    name = "server"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.port = port or free_port(HOST)
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / f"{self.name}.log"
        self._log: IO[bytes] | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:port``."""
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        """True once the server answers ``/-/ready`` (both Prometheus and Alertmanager have it)."""
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0) as response:  # noqa: S310  # local
                return bool(response.status == 200)
        except (OSError, urllib.error.HTTPError):
            return False

    def start(self, timeout: float = 30.0) -> Self:
        """Start the process and wait until it is ready; on failure, raise with the end of its log."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = self.command()
        self._log = open(self.log_path, "ab")  # noqa: SIM115  # closed in stop()
        self.process = subprocess.Popen(command, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=self._log,
                                        stderr=subprocess.STDOUT, preexec_fn=die_with_parent())
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not come up on {self.address} within {timeout:g}s: "
                                   f"{' '.join(command)}\n{self.log_tail()}")
            time.sleep(0.1)
        return self

    def stop(self) -> int | None:
        """SIGTERM, wait, SIGKILL after :data:`STOP_GRACE`; the exit code (None if it was not started)."""
        process, self.process = self.process, None
        code = None
        if process is not None:
            code = stop_process(process, STOP_GRACE)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def log_tail(self, limit: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


class Prometheus(Server):
    """``prometheus`` scraping ``targets`` (job ``stream-eval``) every ``scrape_interval``, evaluating
    ``rule_files`` every ``evaluation_interval`` and sending alerts to ``alertmanager`` (``host:port``)."""

    name = "prometheus"

    def __init__(self, workdir: Path, targets: Iterable[str], rule_files: Iterable[Path] = (), *,
                 alertmanager: str | None = None, scrape_interval: str = "1s", evaluation_interval: str = "1s",
                 job: str = "stream-eval", port: int | None = None) -> None:
        super().__init__(workdir, port)
        self.binary = require_binary("prometheus", package="prometheus")
        self.config: dict[str, Any] = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
            "rule_files": [str(Path(p).resolve()) for p in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}],
        }
        if alertmanager is not None:
            self.config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}

    def command(self) -> list[str]:
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config, sort_keys=False))
        return [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address={self.address}",
                # alerts go out as soon as they fire, and are re-sent every second while they do
                "--rules.alert.resend-delay=1s"]

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>?params``'s ``data``; raises AssertionError when Prometheus says error."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            body = _get_json(url)
        except urllib.error.HTTPError as error:  # 400/422: a bad query; the body says why
            body = json.loads(error.read() or b"{}")
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query: the result list (``[{"metric": {...}, "value": [ts, "str"]}, ...]`` for a vector; a
        scalar or string comes back as one item with an empty ``metric``)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def values(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Instant query as ``{sorted label pairs: value}``."""
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in self.query(expr)}

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing) as Prometheus sees them."""
        return list(self.api("alerts")["alerts"])

    def rule_health(self) -> list[tuple[str, str, str]]:
        """``(rule name, health, last error)`` of every loaded rule."""
        return [(rule["name"], rule.get("health", ""), rule.get("lastError", ""))
                for group in self.api("rules")["groups"] for rule in group["rules"]]

    def targets_up(self) -> bool:
        active = self.api("targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def wait_for(self, condition: Callable[[], _T], timeout: float, what: str) -> _T:
        return wait_for(condition, timeout, what)


class Alertmanager(Server):
    """``alertmanager`` (or Debian's ``prometheus-alertmanager``) with ``config``, clustering off."""

    name = "alertmanager"

    def __init__(self, workdir: Path, config: Mapping[str, Any], port: int | None = None) -> None:
        super().__init__(workdir, port)
        self.binary = require_binary("alertmanager", "prometheus-alertmanager", package="prometheus-alertmanager")
        self.config = dict(config)

    def command(self) -> list[str]:
        config = self.workdir / "alertmanager.yml"
        config.write_text(yaml.safe_dump(self.config, sort_keys=False))
        return [self.binary, f"--config.file={config}", f"--storage.path={self.workdir / 'data'}",
                f"--web.listen-address={self.address}", "--cluster.listen-address="]

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts Alertmanager holds (``GET /api/v2/alerts``)."""
        return list(_get_json(f"{self.url}/api/v2/alerts"))


def alertmanager_config(shipped: Path, webhook_url: str, *, group_wait: str = "1s",
                        group_interval: str = "1s") -> dict[str, Any]:
    """The shipped Alertmanager config with every receiver replaced by the test webhook (``webhook_url/<name>``,
    resolved alerts included) and short grouping delays, so its routes and inhibitions are what gets tested."""
    config = copy.deepcopy(yaml.safe_load(shipped.read_text()))
    for receiver in config.get("receivers", []):
        name = receiver["name"]
        for key in [k for k in receiver if k.endswith("_configs")]:
            del receiver[key]
        receiver["webhook_configs"] = [{"url": f"{webhook_url}/{name}", "send_resolved": True}]
    routes = [config["route"]]
    while routes:
        route = routes.pop()
        for key, value in (("group_wait", group_wait), ("group_interval", group_interval)):
            if key in route or route is config["route"]:
                route[key] = value
        routes.extend(route.get("routes", []))
    return config  # type: ignore[no-any-return]


_FOR = re.compile(r"^(\s*for:\s*)(\S+)(.*)$", re.M)


def copy_rules(source: Path, target: Path, for_duration: str = "2s") -> list[Path]:
    """Copy the rule files of ``source`` to ``target`` with every ``for:`` set to ``for_duration``.

    The rules' expressions stay as shipped; only the time an alert must stay true before it fires is shortened
    so that an end-to-end test sees it within seconds (the ``for:`` of the A/B alerts only rides out scrape
    glitches: the statistics behind them are valid at every look).
    """
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in sorted(source.glob("*.yml")):
        text = _FOR.sub(lambda m: f"{m.group(1)}{for_duration}{m.group(3)}", path.read_text())
        out = target / path.name
        out.write_text(text)
        copied.append(out)
    return copied


class Webhook:
    """An HTTP server on 127.0.0.1 that records the JSON bodies POSTed to it (Alertmanager's webhook payloads)."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        received = self.payloads
        lock = self._lock

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  # the name http.server calls
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    payload = json.loads(body)
                except ValueError:
                    payload = {"invalid": body.decode(errors="replace")}
                payload["_path"] = self.path
                with lock:
                    received.append(payload)
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  # the signature of the base
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="webhook", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server.server_address[1]}"

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def alerts(self, status: str | None = "firing") -> list[dict[str, Any]]:
        """Every alert of every payload so far (``status`` None = firing and resolved), each with the
        payload's ``receiver`` added."""
        with self._lock:
            payloads = list(self.payloads)
        return [{**alert, "receiver": payload.get("receiver")} for payload in payloads
                for alert in payload.get("alerts", []) if status is None or alert.get("status") == status]

    def matching(self, labels: Mapping[str, str], status: str | None = "firing") -> list[dict[str, Any]]:
        """Alerts whose labels include ``labels``."""
        return [a for a in self.alerts(status) if all(a["labels"].get(k) == v for k, v in labels.items())]

    def wait_for_alert(self, labels: Mapping[str, str], timeout: float) -> dict[str, Any]:
        """The first firing alert with ``labels``, waiting up to ``timeout`` seconds."""
        found = wait_for(lambda: self.matching(labels), timeout,
                         f"an alert {dict(labels)} at the webhook (got: {self.summary()})")
        return found[0]

    def summary(self) -> list[str]:
        """One line per distinct alert received: ``receiver alertname {labels}``, for error messages."""
        lines = {f"{a['receiver']} {a['status']} {a['labels'].get('alertname')} "
                 f"{ {k: v for k, v in a['labels'].items() if k != 'alertname'} }" for a in self.alerts(None)}
        return sorted(lines)
