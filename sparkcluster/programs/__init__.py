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
from pathlib import Path

HERE = Path(__file__).parent
PACKAGE_ROOT = HERE.parent.parent  # the folder that holds `sparkcluster/`


def source(module: str) -> str:
    """The text of one of the package's modules (`sparkcluster.node.contract`)."""
    path = PACKAGE_ROOT.joinpath(*module.split("."))
    return (path / "__init__.py").read_text() if path.is_dir() else path.with_suffix(".py").read_text()


# `from sparkcluster.programs import a, b`, `from sparkcluster.programs.a import x`: a program's
# imports of its siblings, one a line as the formatter leaves them (test_programs checks this reading
# against the parsed module); read without parsing, so packing a bundle costs little
_SIBLINGS = re.compile(r"^from sparkcluster\.programs(?:\.(\w+))? import ([\w, ]+)$", re.M)


def _ours(module: str) -> list[str]:
    """The modules of this package that `module` imports (its first level)."""
    out = []
    for sub, names in _SIBLINGS.findall(source(module)):
        out += [f"{__name__}.{sub}"] if sub else [f"{__name__}.{n.strip()}" for n in names.split(",")]
    return out


@functools.cache
def modules(module: str) -> tuple[str, ...]:
    """`module` and every module of this package it reaches, in a stable order."""
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
