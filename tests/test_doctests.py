"""The examples in the package's docstrings run, and every ``>>>`` line of the package is one of them (an example
the doctest finder cannot see, in a compiled function or a comment, would never run)."""

from __future__ import annotations

import doctest
import importlib
import io
from pathlib import Path

import pytest

import stream_eval

PACKAGE_DIR = Path(stream_eval.__file__).resolve().parent
WITH_EXAMPLES = sorted(
    path for path in PACKAGE_DIR.rglob("*.py") if any(line.lstrip().startswith(">>>")
                                                      for line in path.read_text().splitlines())
)


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)


def test_the_package_has_examples() -> None:
    assert len(WITH_EXAMPLES) > 20


@pytest.mark.parametrize("path", WITH_EXAMPLES, ids=_module)
def test_docstring_examples(path: Path) -> None:
    module = importlib.import_module(_module(path))
    tests = doctest.DocTestFinder().find(module)
    out = io.StringIO()
    runner = doctest.DocTestRunner()
    for test in tests:
        runner.run(test, out=out.write)
    lines = sum(line.lstrip().startswith(">>>") for line in path.read_text().splitlines())
    assert runner.tries == lines, f"{lines} '>>>' lines in {path.name}, {runner.tries} examples found"
    assert runner.failures == 0, out.getvalue()
