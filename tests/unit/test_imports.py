"""The package's imports, read with ast (nothing imported): the floors hold and nothing goes round.

No import circle (an import under `if TYPE_CHECKING:` is for the type checker only and does not
count; a lazy import inside a function does); every package on its floor (`FLOORS`), importing only
from the floors below it, so no arrow goes up and no two packages go round; a lazy import says why it
is lazy; and no alias hides the module or name it stands for from grep.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from sparkcluster import programs

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkcluster"
# The floors of the house, lowest first. A package imports from the floors below its own and from
# itself, never from a package on its own floor (the commands are peers: the CLI composes them) nor
# from one above. `sparkcluster` is the package's own `__init__` (its version); `__main__` the entry.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("sparkcluster", "errors", "labels", "redact", "node", "programs"),  # the words everyone shares; node-side code
    ("log", "movement"),  # the structured log; what moves between nodes
    ("config",),  # inventory and profile, validated before any connection
    ("remote", "container"),  # the connections; what each node's container is
    ("facts",),  # what the hosts are, gathered once
    ("checks", "steps"),  # the checks over the facts; the step engine (Stage, the walk, progress, Run)
    ("deployment",),  # the deployment's domain: server, endpoint, supervision, teardown, the records
    ("fabric",),  # the NCCL fabric measured and judged, the engine's own NCCL read (doctor, up, bench, status)
    ("up", "upgrade", "gateway", "monitor", "bench", "status", "importer"),  # the commands: peers
    ("cli",),  # the command line, which composes them
    ("__main__",),  # `python -m sparkcluster`
)
FLOOR = {p: i for i, floor in enumerate(FLOORS) for p in floor}


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under `if TYPE_CHECKING:`."""
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            out |= {id(x) for x in ast.walk(n)}
    return out


def _imports(module: str, path: Path) -> list[tuple[ast.stmt, str, str, str | None]]:
    """(statement, imported module, imported name, alias) for every import not under TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    skip = _type_only(tree)
    out = []
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            out += [(n, a.name, a.name.rpartition(".")[2], a.asname) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(n.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            out += [(n, base, a.name, a.asname) for a in n.names]
    return out


def _target(base: str, name: str) -> str | None:
    """The package module an import reaches: `from a import b` reaches a.b when that is a module."""
    for cand in (f"{base}.{name}", base):
        while cand and cand not in MODULES:
            cand = cand.rpartition(".")[0]
        if cand:
            return cand
    return None


def graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {m: set() for m in MODULES}
    for m, p in MODULES.items():
        for _, base, name, _ in _imports(m, p):
            if base.split(".")[0] == "sparkcluster":
                t = _target(base, name)
                if t and t != m:
                    g[m].add(t)
    return g


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    g = graph()
    assert circles(g) == [], {tuple(c): sorted(f"{a} -> {b}" for a in c for b in g[a] if b in c) for c in circles(g)}


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def package(module: str) -> str:
    """The package a module belongs to: `sparkcluster.up.stages.serve` -> `up`; a top-level module
    (`sparkcluster.errors`) is its own; the package's `__init__` is `sparkcluster`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph() -> dict[str, dict[str, list[str]]]:
    """package -> package it imports -> the module arrows that make it (lazy imports included)."""
    out: dict[str, dict[str, list[str]]] = {}
    for m, targets in graph().items():
        for t in targets:
            a, b = package(m), package(t)
            if a != b:
                out.setdefault(a, {}).setdefault(b, []).append(f"{m} -> {t}")
    return out


def test_the_floor_table_names_every_package():
    on_disk = {package(m) for m in MODULES}
    assert sorted(on_disk - set(FLOOR)) == []
    assert sorted(set(FLOOR) - on_disk) == []


def test_no_arrow_goes_up_or_sideways():
    """A package imports only from the floors below its own; the commands do not import one another."""
    wrong = {(a, b): sorted(why) for a, to in package_graph().items() for b, why in to.items() if FLOOR[b] >= FLOOR[a]}
    assert wrong == {}


def test_no_package_circle():
    g = {a: set(to) for a, to in package_graph().items()}
    g.update({p: set() for p in FLOOR if p not in g})
    assert circles(g) == []


def test_a_lazy_import_says_why():
    """An import inside a function is there for start-up speed or for one flag's sake, and says so
    on its line or the line above; one that would close a circle is caught by the test above."""
    silent = []
    for m, p in MODULES.items():
        lines = p.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        skip = _type_only(tree)
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for n in ast.walk(fn):
                if id(n) in skip or not isinstance(n, (ast.Import, ast.ImportFrom)):
                    continue
                names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
                if not any(x.split(".")[0] == "sparkcluster" for x in names):
                    continue
                here, above = lines[n.lineno - 1], lines[n.lineno - 2].strip()
                if "#" not in here and not above.startswith("#"):
                    silent.append(f"{m}:{n.lineno}: {here.strip()}")
    assert silent == []


def test_no_alias_hides_a_module():
    """`import x as y` only where y still says x (`profile as profiles`, `main as cli_main`): an
    alias such as `w` or `P` defeats grep. Third-party conventions (`torch.distributed as dist`)
    are not ours to rename."""
    hidden = []
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "perf").rglob("*.py")]
    for p in files:
        if "testbed" in p.relative_to(ROOT).parts and "hub" in p.parts:
            continue
        module = _name(p) if p.is_relative_to(PACKAGE) else ""
        for n, base, name, alias in _imports(module, p):
            ours = base.split(".")[0] in ("sparkcluster", "tests", "perf") or n.__class__ is ast.ImportFrom and n.level
            stem = name.lower().strip("_")[: max(3, len(name.strip("_")) - 1)]  # inventory as inventories
            if alias and ours and stem not in alias.lower():
                hidden.append(f"{p.relative_to(ROOT)}:{n.lineno}: {name} as {alias}")
    assert hidden == []


def test_no_two_modules_with_one_name():
    """docs/explanation/how-it-works.md: one module per job, no two modules with one name (a package's `__init__` aside)."""
    seen: dict[str, list[str]] = {}
    for m, p in MODULES.items():
        if p.name != "__init__.py":
            seen.setdefault(p.stem, []).append(m)
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def test_the_container_spec_stands_on_config_labels_and_node_only():
    """`container/` is read by up, checks, fabric and the deployment: it reaches none of them, nor facts or remote
    (`programs` ships the node agent's files, as it ships every program)."""
    allowed = (
        "sparkcluster.config",
        "sparkcluster.labels",
        "sparkcluster.node",
        "sparkcluster.container",
        "sparkcluster.programs",
    )
    g = graph()
    reached = {t for m in g if m.startswith("sparkcluster.container") for t in g[m]}
    outside = sorted(t for t in reached if not any(t == a or t.startswith(a + ".") for a in allowed))
    assert reached and outside == []


def test_a_program_imports_only_the_standard_library_and_its_siblings():
    """A program of `programs/` runs on a host under its python3, or in a container under the image's,
    from a bundle of its own modules (programs.bundle): it reaches no other module of the package,
    and imports nothing outside the standard library but what the image has (huggingface_hub, in
    the download that runs there). The package's `__init__` (the shipping, on the controller) is never
    shipped."""
    image_only = {"huggingface_hub"}
    wrong = []
    for m, p in MODULES.items():
        if not m.startswith("sparkcluster.programs.") or p.name == "__init__.py":
            continue
        for _, base, name, _ in _imports(m, p):
            top = base.split(".")[0]
            if top == "sparkcluster":
                if not (base.startswith("sparkcluster.programs") and f"{base}.{name}" != "sparkcluster.programs"):
                    wrong.append(f"{m}: {base}.{name}")
            elif top not in sys.stdlib_module_names and top not in image_only:
                wrong.append(f"{m}: {base}")
        assert all(x.startswith("sparkcluster.programs.") for x in programs.modules(m)), m
    assert wrong == []
