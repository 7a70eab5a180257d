"""Layering: the metric core and the event schema never touch the streaming stack, and importing the package
(or its command line) never imports faust, let alone creates a ``faust.App``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import stream_eval

PACKAGE_DIR = Path(stream_eval.__file__).resolve().parent
STREAMING = ("faust", "aiokafka", "mode", "prometheus_client")
PURE_PACKAGES = ("stream_eval.metrics", "stream_eval.events", "stream_eval.stats")


def _run(code: str) -> dict[str, object]:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


_LOADED = """
    import importlib, json, pkgutil, sys
    STREAMING = {streaming!r}

    def loaded():
        return sorted(name for name in sys.modules if name.split(".")[0] in STREAMING)
"""


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_packages_import_no_streaming_module(package: str) -> None:
    out = _run(_LOADED.format(streaming=STREAMING) + f"""
    errors, modules = [], []
    root = importlib.import_module({package!r})
    modules.append(root.__name__)
    for info in pkgutil.walk_packages(root.__path__, root.__name__ + ".", onerror=errors.append):
        importlib.import_module(info.name)
        modules.append(info.name)
    print(json.dumps({{"modules": modules, "loaded": loaded(), "errors": errors}}))
    """)
    assert out["errors"] == []
    assert len(out["modules"]) > 1  # type: ignore[arg-type]
    assert out["loaded"] == [], f"importing {package} loads {out['loaded']}"


def _imports(path: Path) -> list[tuple[int, str]]:
    """Absolute module names imported anywhere in a file (also inside functions), with line numbers."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
            "import_module", "__import__",
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_packages_source_has_no_streaming_import(package: str) -> None:
    directory = PACKAGE_DIR / package.split(".")[1]
    files = sorted(directory.rglob("*.py"))
    assert files
    offending = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{line}: import {name}"
        for path in files
        for line, name in _imports(path)
        if name.split(".")[0] in STREAMING or name.startswith(("stream_eval.stream", "stream_eval.cli"))
    ]
    assert offending == []


def test_ast_scan_finds_streaming_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import faust\nfrom aiokafka.errors import KafkaError\n"
                      "def f():\n    import prometheus_client as p\n    from mode import Service\n")
    assert [name for _, name in _imports(sample)] == ["faust", "aiokafka.errors", "prometheus_client", "mode"]


def test_cli_does_not_import_faust() -> None:
    out = _run(_LOADED.format(streaming=STREAMING) + """
    import stream_eval, stream_eval.cli
    stream_eval.cli.build_parser()
    print(json.dumps({"loaded": loaded()}))
    """)
    assert not [name for name in out["loaded"] if name.split(".")[0] == "faust"], out  # type: ignore[union-attr]


ENTRY = "stream_eval.stream.entry"  # the one module `faust -A` loads: it builds the app on import (STYLE)


def test_importing_every_module_creates_no_faust_app() -> None:
    out = _run(_LOADED.format(streaming=STREAMING) + """
    created = []
    try:
        import faust
    except ImportError:
        faust = None
    if faust is not None:  # record every App construction, whichever module does it
        original = faust.App.__init__

        def spy(self, *args, **kwargs):
            created.append(repr(args[:1]))
            original(self, *args, **kwargs)

        faust.App.__init__ = spy
    import stream_eval
    errors, modules = [], []
    for info in pkgutil.walk_packages(stream_eval.__path__, "stream_eval.", onerror=errors.append):
        if info.name == "ENTRY_MODULE":
            continue
        try:
            importlib.import_module(info.name)
        except Exception as error:
            errors.append(f"{info.name}: {type(error).__name__}: {error}")
        modules.append(info.name)
    if faust is not None:
        import gc
        created += [repr(o) for o in gc.get_objects() if isinstance(o, faust.App)]
    print(json.dumps({"modules": modules, "errors": errors, "created": created}))
    """.replace("ENTRY_MODULE", ENTRY))
    assert "stream_eval.cli" in out["modules"]  # type: ignore[operator]
    assert out["errors"] == [], out["errors"]
    assert out["created"] == [], f"importing stream_eval modules creates faust apps: {out['created']}"


def test_the_faust_entry_module_builds_exactly_one_app() -> None:
    out = _run(_LOADED.format(streaming=STREAMING) + f"""
    import faust
    module = importlib.import_module({ENTRY!r})
    print(json.dumps({{"apps": [name for name, value in vars(module).items() if isinstance(value, faust.App)]}}))
    """)
    assert out["apps"] == ["app"]
