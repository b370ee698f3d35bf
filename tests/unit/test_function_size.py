"""No function in sparkcluster/ over 120 lines (issue 54): a longer one holds several jobs that a
newcomer has to read whole to change one of them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sparkcluster"
LIMIT = 120


def test_no_function_is_longer_than_the_limit():
    long = []
    for p in sorted(PACKAGE.rglob("*.py")):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > LIMIT:
                long.append(
                    f"{p.relative_to(PACKAGE.parent)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
                )
    assert long == []
