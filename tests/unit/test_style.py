"""The repository keeps one format and one lint rule set (issue 33 item 6): `ruff format --check` and
`ruff check` over the whole tree, with the configuration in pyproject.toml ([tool.ruff], the rules
named in [tool.ruff.lint]).

ruff is pinned in the dev extras; it is looked for beside the interpreter running the tests (the
virtual environment's bin/), then on PATH, so that the version that judges is the pinned one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def ruff() -> str:
    beside = Path(sys.executable).parent / "ruff"
    if beside.is_file():
        return str(beside)
    found = shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return found


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ruff(), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_the_pinned_ruff_judges():
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    pin = next(re.fullmatch(r"ruff==(\S+)", d).group(1) for d in dev if d.startswith("ruff=="))
    found = _run("--version").stdout.split()[-1]
    assert found == pin, f"ruff {found} found, pyproject.toml pins {pin}: pip install -e '.[dev]'"


def test_formatted():
    r = _run("format", "--check", "--no-cache", ".")
    assert r.returncode == 0, f"run `ruff format .`:\n{r.stdout}{r.stderr}"


def test_lint():
    r = _run("check", "--no-cache", "--output-format", "concise", ".")
    assert r.returncode == 0, f"`ruff check .` (rules in pyproject.toml [tool.ruff.lint]):\n{r.stdout}{r.stderr}"
