"""The programs sparkcluster runs on a host or in a container, as modules of this package, and the
one way they are shipped there.

A program is a module here with a `main` run under `if __name__ == "__main__"`; a host's program uses
the standard library only (nothing is installed on the hosts: every DGX OS host has python3), a
container's may use what the image has. It runs as `python3 -c <boot> <module> <args> <bundle>`:
`boot` is this package's `boot.py`, the bundle the sources of the module and of the modules of this
package it imports (base64 of zlib of JSON), so one command line carries everything and nothing is
left on the node. What the node agent and the gateway run as long-lived processes is shipped as
files (`files`): they live in a container, which holds them for its life. The module's name and
arguments come before the bundle, within the first 4 KB of the command line, so `ps` and `pgrep -f`
(which may read only the start of a long command line) find a program by them.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import shlex
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).parent
PACKAGE_ROOT = HERE.parent.parent  # the folder that holds `sparkcluster/`


def source(module: str) -> str:
    """The text of one of the package's modules (`sparkcluster.node.contract`)."""
    path = PACKAGE_ROOT.joinpath(*module.split("."))
    return (path / "__init__.py").read_text() if path.is_dir() else path.with_suffix(".py").read_text()


def is_module(module: str) -> bool:
    """Whether `module` (`sparkcluster.node.contract`, `sparkcluster.node`) is one of the package's
    modules or packages."""
    path = PACKAGE_ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


# a module's imports of the package's modules, absolute (`from sparkcluster.programs import a, b`,
# `from sparkcluster.programs.a import x`) or relative (`from . import a`, `from ..node import
# contract`), at any indentation, one statement as the formatter leaves it (test_programs checks this
# reading against the parsed module); read without parsing, so packing a bundle costs little
_IMPORTS = re.compile(
    r"^[ \t]*from (sparkcluster(?:\.\w+)*|\.+(?:\w+(?:\.\w+)*)?) import (?:\(([^)]*)\)|([\w, ]+))", re.M
)


def _ours(module: str) -> list[str]:
    """The modules of the package that `module` imports (its first level): a name imported from a
    package is the module of that name where there is one, else the package's own `__init__`."""
    package = (
        module if (PACKAGE_ROOT.joinpath(*module.split(".")) / "__init__.py").is_file() else module.rpartition(".")[0]
    )
    out = []
    for base, grouped, names in _IMPORTS.findall(source(module)):
        if base.startswith("."):
            dots = len(base) - len(base.lstrip("."))
            parts = package.split(".")[: len(package.split(".")) - (dots - 1)]
            base = ".".join([*parts, *([base.lstrip(".")] if base.lstrip(".") else [])])
        for name in (n.split()[0] for n in (grouped or names).split(",") if n.strip()):
            out.append(f"{base}.{name}" if is_module(f"{base}.{name}") else base)
    return list(dict.fromkeys(out))


@functools.cache
def modules(module: str) -> tuple[str, ...]:
    """`module` and every module of the package it reaches, in a stable order."""
    seen: list[str] = []
    todo = [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.append(m)
            todo += _ours(m)
    return tuple(sorted(seen))


_PACKED: dict[str, str] = {}
_PACKING = threading.Lock()


def bundle(module: str) -> str:
    """The sources `module` runs with, packed for the boot (a text safe on any command line). Packed
    once per run, under a lock: the steps of one batch that run a program on every node at once
    wait for the first to pack it rather than each packing it again."""
    with _PACKING:
        if module not in _PACKED:
            packed = json.dumps({m: source(m) for m in modules(module)}, sort_keys=True).encode()
            _PACKED[module] = base64.b64encode(zlib.compress(packed, 9)).decode("ascii")
        return _PACKED[module]


def argv(module: str, *args: str, python: str = "python3") -> list[str]:
    """The program `module` (`sparkcluster.programs.receiver`) with its arguments, as an argv."""
    if not module.startswith(__name__ + "."):
        raise ValueError(f"not one of the programs: {module!r}")
    return [python, "-c", source(f"{__name__}.boot"), module, *args, bundle(module)]


def command(module: str, *args: str) -> str:
    """The same as one shell command (every word quoted)."""
    return shlex.join(argv(module, *args))


def files(folder: str, modules: dict[str, str]) -> dict[str, str]:
    """Files a container holds: `modules` maps a path under `folder` to the module it is the text of."""
    return {f"{folder}/{path}": source(m) for path, m in modules.items()}


def assets(folder: str, package: str, sub: str) -> dict[str, str]:
    """Files a container holds beside the modules: every file of the package's folder `sub`
    (`sparkcluster.gateway`, "console_assets": its scripts and styles), as text, under `folder` where
    `layout` puts the package. A wheel carries them as package data (pyproject.toml)."""
    base = PACKAGE_ROOT.joinpath(*package.split("."), sub)
    where = "/".join([folder, *package.split("."), sub])
    return {f"{where}/{p.name}": p.read_text() for p in sorted(base.iterdir()) if p.is_file()}


def layout(modules: Iterable[str], package: str, folder: str) -> dict[str, str]:
    """Where each of `modules` (those under `package`) lies in a folder that holds `package` as
    `folder`: {"node/agent.py": "sparkcluster.node.agent", "node/__init__.py": "sparkcluster.node"}."""
    out = {}
    for m in sorted(modules):
        if m != package and not m.startswith(package + "."):
            raise ValueError(f"{m} is not under {package}")
        rel = "/".join([folder, *m[len(package) + 1 :].split(".")]) if m != package else folder
        out[
            f"{rel}/__init__.py" if (PACKAGE_ROOT.joinpath(*m.split(".")) / "__init__.py").is_file() else f"{rel}.py"
        ] = m
    return out
