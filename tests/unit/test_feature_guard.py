"""Every feature keeps an end-to-end case in `make test` (issue 57).

tests/README.md keeps a table, "Which case guards which feature", of the features whose end-to-end
tests had drifted into `make test-long`, each with the cases that guard it in `make test` and those
left to `make test-long`. This test reads that table and the test modules' source (ast, nothing
imported or run): every feature has at least one case in `make test`, every case named exists, and a
case named under `make test` is not marked `long`, neither by its module's `pytestmark` nor by its
own decorator.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "tests" / "README.md"
INTEGRATION = ROOT / "tests" / "integration"
HEADING = "## Which case guards which feature"
# issue 57's list, in its priority order: the table must name each of them
FEATURES = (
    "upgrade and rollback",
    "the gateway",
    "executor `mp`",
    "image layers",
    "monitoring and its alerts",
    "the canary and `--compare`",
    "compile caches",
    "one model per Spark",
    "prefill against a wedge",
    "the traps",
    "key rotation",
    "drift",
    "the container contract (NGC's start-up kept)",  # since: an NGC image's entrypoint kept
    "engines behind a key and the control address",  # since: exposed safely on the LAN
    "node-to-node streams authenticated",
    "team keys (named keys, limits, usage)",
    "models taking turns on one Spark",
    "node health and the fabric while serving",  # since: kernel events, GPU power, the fabric watched
    "services from their own images",  # since: a service's image runs as published, supervised beside it
    "the web console",  # since: the console at /console, tested in Chromium
)
CASE = re.compile(r"`(test_\w+)\.py::(test_\w+)`")


def table() -> dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]]:
    text = README.read_text()
    assert HEADING in text, f"tests/README.md lost its section {HEADING!r}"
    rows: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {}
    for line in text.split(HEADING, 1)[1].splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not line.startswith("|") or set(cells[0]) <= {"-", " "} or cells[0] == "feature":
            continue
        rows[cells[0]] = (CASE.findall(cells[1]), CASE.findall(cells[2]))
    return rows


def _is_long(node: ast.expr) -> bool:
    """`pytest.mark.long` itself, or a list of marks holding it (a parameter's own `marks=` is not the case's)."""
    marks = node.elts if isinstance(node, ast.List | ast.Tuple) else [node]
    return any(ast.unparse(m) == "pytest.mark.long" for m in marks)


def module_cases(module: str) -> tuple[bool, dict[str, bool]]:
    """(whether the whole module is `long`, {test name: whether that case is `long`})."""
    tree = ast.parse((INTEGRATION / f"{module}.py").read_text())
    module_long = any(
        isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets) and _is_long(n.value)
        for n in tree.body
    )
    cases = {
        n.name: any(_is_long(d) for d in n.decorator_list)
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
    }
    return module_long, cases


def test_the_table_names_every_feature_of_issue_57():
    assert list(table()) == list(FEATURES)


def test_every_feature_has_a_case_in_make_test_and_every_case_named_exists():
    problems = []
    for feature, (in_test, in_long) in table().items():
        if not in_test:
            problems.append(f"{feature}: no case in `make test`")
        for module, case in in_test + in_long:
            module_long, cases = module_cases(module)
            if case not in cases:
                problems.append(f"{feature}: {module}.py has no {case}")
            elif (module, case) in in_test and (module_long or cases[case]):
                problems.append(f"{feature}: {module}.py::{case} is marked long, so `make test` does not run it")
    assert not problems, "\n".join(problems)
