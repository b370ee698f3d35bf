"""Every package the controller imports at run time is declared (issue 53): what the CLI's commands
reach through sparkcluster's own imports, at the top of a module or inside a function, is either a
dependency or in the extra that names it. Modules that run elsewhere (the gateway's server in the
cluster's image, the node agent, the GPU probe) are reached only by their own entry points."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sparkcluster"


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    for candidate in (
        PACKAGE.parent.joinpath(*parts).with_suffix(".py"),
        PACKAGE.parent.joinpath(*parts, "__init__.py"),
    ):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, module: str) -> set[str]:
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import module`
    return names


def reached_third_party() -> dict[str, set[str]]:
    """Top-level third-party name -> the sparkcluster modules that import it, from the CLI's commands."""
    todo = ["sparkcluster.cli.main"] + [f"sparkcluster.cli.{p.stem}" for p in (PACKAGE / "cli").glob("*_cmd.py")]
    seen: set[str] = set()
    found: dict[str, set[str]] = {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_file(module)
        if path is None:
            continue
        for name in _imports(path, module):
            top = name.split(".")[0]
            if top == "sparkcluster":
                todo.append(name)
            elif top and top not in sys.stdlib_module_names:
                found.setdefault(top, set()).add(module)
    return found


def _declared() -> dict[str, set[str]]:
    """Distribution names, normalised, by where declared: "" for the dependencies, else the extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}

    out = {"": names(project["dependencies"])}
    out.update({extra: names(reqs) for extra, reqs in project["optional-dependencies"].items() if extra != "dev"})
    return out


def test_every_run_time_import_is_declared():
    declared = _declared()
    dists = importlib.metadata.packages_distributions()
    missing = []
    for top, where in sorted(reached_third_party().items()):
        wanted = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
        if not any(wanted & names for names in declared.values()):
            missing.append(f"{top} ({', '.join(sorted(wanted))}), imported by {', '.join(sorted(where))}")
    assert missing == []


def test_the_core_dependencies_are_what_the_commands_import():
    reached = reached_third_party()
    assert {"click", "paramiko", "pydantic", "docker", "requests", "rich", "structlog", "httpx"} <= set(reached)
