"""The programs sparkcluster runs on a host or in a container (sparkcluster/programs): none hides in
a string literal, each ships as its own modules through the boot, and their shared parts (the one
tar reader) hold on archives made by Python's tarfile."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from sparkcluster import programs
from sparkcluster.node import contract
from sparkcluster.programs import boot, tar

PACKAGE = Path(__file__).resolve().parents[2] / "sparkcluster"
FEW = 5  # statements of Python, or lines of shell: more is a program, and belongs in programs/
PYTHON = re.compile(r"^\s*(import \w|from [\w.]+ import |def \w+\(|class \w+)", re.M)  # one that does not parse
SHELL = re.compile(r"(^|\s)(then|do|done|fi|esac)(\s|;|$)|\$\(| && | \|\| ", re.M)


def _text(node: ast.AST) -> str | None:
    """The text of a string literal, of a chain of literals joined by `+`, or of an f-string (its
    fields as a name); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return left + right if left is not None and right is not None else None
    return None


def is_program(text: str) -> bool:
    """More than a few statements of Python (flag lists and prose parse to expressions only, or not
    at all), more than a few lines of what reads as Python but does not parse (a template), or more
    than a few lines of shell."""
    try:
        tree = ast.parse(textwrap.dedent(text))
    except (SyntaxError, ValueError):
        tree = None
    if tree is not None:
        stmts = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
        if len(stmts) > FEW and any(not isinstance(n, ast.Expr) for n in stmts):
            return True
    lines = [x for x in text.splitlines() if x.strip() and not x.strip().startswith("#")]
    return len(lines) > FEW and bool(SHELL.search(text) or PYTHON.search(text))


def programs_in_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
    }
    found = []
    for n in ast.walk(tree):
        text = None if id(n) in docstrings else _text(n)
        if text is not None and is_program(text):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{n.lineno}: {text.strip().splitlines()[0][:60]}")
    return sorted(set(found))


def test_no_program_hides_in_a_string_literal():
    """Issue 54: what runs on a node is a module of sparkcluster/programs, linted and tested like
    the rest, never the text of a string."""
    found = [f for p in sorted(PACKAGE.rglob("*.py")) for f in programs_in_literals(p)]
    assert found == []


@pytest.mark.parametrize(
    "text",
    [
        "import json, sys\nfor a in sys.argv:\n    print(a)\nx = 1\ny = 2\nz = 3\n",
        "import os; a = 1; b = 2; c = 3; d = 4; print(a, b, c, d)",
        "import json\nKEY = @KEY@\nfor a in b:\n    pass\nc = 1\nd = 2\n",  # a template
        "for d in /sys/x/*; do\n  a=$(cat $d)\n  b=1\n  c=2\n  d=3\n  echo $a\ndone\n",
    ],
)
def test_the_finder_finds_a_program(text):
    assert is_program(text)


@pytest.mark.parametrize(
    "text",
    [
        "--allow-credentials --allowed-headers\n--a --b\n--c\n--d\n--e\n--f\n",  # a flag list parses as Python
        "body { font: 14px; }\n.a { b: c; }\n.d { e: f; }\n.g { h: i; }\n.j { k: l; }\n.m { n: o; }\n",
        "import time; print(time.time())",
        "sh -c 'kill -0 \"$1\"'",
    ],
)
def test_the_finder_leaves_data_and_one_liners(text):
    assert not is_program(text)


# ---- shipping ----------------------------------------------------------------------------------


def test_a_program_ships_with_its_own_modules_only():
    assert programs.modules("sparkcluster.programs.image_sender") == (
        "sparkcluster.programs.framing",
        "sparkcluster.programs.image_sender",
        "sparkcluster.programs.pipes",
        "sparkcluster.programs.tar",
    )
    assert set(boot.unpack(programs.bundle("sparkcluster.programs.hub_fetch"))) == {"sparkcluster.programs.hub_fetch"}
    with pytest.raises(ValueError):
        programs.argv("sparkcluster.node.agent")


def test_the_boot_runs_a_program_from_its_bundle_alone(tmp_path):
    """Run as a host runs it: python3 -c, in an empty folder, with no sparkcluster to import (-I:
    no user site, no PYTHONPATH): every module comes from the bundle."""
    hub = tmp_path / "hub"
    blobs = hub / "models--org--m" / "blobs"
    blobs.mkdir(parents=True)
    argv = programs.argv("sparkcluster.programs.weights_cache", "status", str(hub), python=sys.executable)
    argv.insert(1, "-I")
    got = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=60, check=True)
    assert json.loads(got.stdout) == []


def test_the_boot_passes_arguments_and_exit_status_through(tmp_path):
    argv = programs.argv("sparkcluster.programs.hang_up", "127.0.0.1", "1", "127.0.0.1", python=sys.executable)
    got = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert got.returncode == 1 and "ConnectionRefusedError" in got.stderr  # nothing listens on port 1


def test_container_files_are_the_modules_text():
    files = programs.files("/opt/x", {"node/contract.py": "sparkcluster.node.contract"})
    assert files == {"/opt/x/node/contract.py": (PACKAGE / "node" / "contract.py").read_text()}


# ---- the one tar reader ------------------------------------------------------------------------


def _archive(fmt: int, members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, data in members.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _walk(raw: bytes) -> list[tuple[str, bytes, bool]]:
    f = io.BytesIO(raw)

    def read(n):
        b = f.read(n)
        if len(b) != n:
            raise EOFError
        return b

    out = []
    for e in tar.entries(read):
        if e.end:
            out.append(("", b"", True))
            break
        out.append((e.name, read(tar.blocks(e.size))[: e.size], e.regular))
    return out


LONG = "blobs/sha256/" + "a" * 64 + "/" + "n" * 120  # over ustar's 100 bytes of name


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_the_tar_reader_names_every_entry_as_tarfile_wrote_it(fmt):
    members = {"manifest.json": b"[]", "x" * 99: b"1" * 513}
    if fmt != tarfile.USTAR_FORMAT:
        members[LONG] = b"long"
    else:
        members["dir/" * 30 + "file"] = b"p"  # ustar's prefix field
    got = _walk(_archive(fmt, members))
    assert got[:-1] == [(name, data, True) for name, data in members.items()]
    assert got[-1] == ("", b"", True)


def test_the_tar_reader_reads_a_base_256_size():
    h = bytearray(512)
    h[124:136] = b"\x80" + (8 << 30).to_bytes(11, "big")
    assert tar.size(bytes(h)) == 8 << 30
    h[124:136] = b"%011o\0" % 513
    assert tar.size(bytes(h)) == 513 and tar.blocks(513) == 1024


def test_the_tar_reader_stops_where_the_stream_is_cut():
    raw = _archive(tarfile.GNU_FORMAT, {"a": b"x" * 600})
    with pytest.raises(EOFError):
        _walk(raw[:700])


def _parsed_imports(module: str, path: Path) -> set[str]:
    """The package's modules `module` imports, as Python resolves its import statements."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            assert not any(a.name.startswith("sparkcluster") for a in n.names), path
        elif isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("sparkcluster")):
            parts = package.split(".")[: len(package.split(".")) - n.level + 1] if n.level else []
            base = ".".join([*parts, *([n.module] if n.module else [])])
            out |= {f"{base}.{a.name}" if programs.is_module(f"{base}.{a.name}") else base for a in n.names}
    return out


@pytest.mark.parametrize("folder", ["programs", "node", "gateway"])
def test_a_modules_imports_are_read_as_python_reads_them(folder):
    """programs._ours reads a module's imports of the package's modules without parsing it (absolute
    or relative, at any indentation): the same as the parsed module's, for every program and every
    module shipped as files (the node agent's, the gateway's)."""
    for p in sorted((PACKAGE / folder).glob("*.py")):
        module = f"sparkcluster.{folder}" if p.name == "__init__.py" else f"sparkcluster.{folder}.{p.stem}"
        assert set(programs._ours(module)) == _parsed_imports(module, p), p.name


def test_the_agent_and_the_gateway_ship_what_they_import():
    """The files of the node agent and of the gateway are their entry points and what those import
    (programs.modules), laid out as the package is: every node module reaches the agent's folder (the
    fabric test's rank program named beside the agent), the gateway's container gets its own modules,
    the node contract, the journal's reader and the usage ledger's module, and nothing else of the package."""
    from sparkcluster.container.spec import AGENT_FILES
    from sparkcluster.gateway.rollout import CODE_DIR, code_files

    node = {f"node/{p.name}" for p in (PACKAGE / "node").glob("*.py") if p.name != "launcher.py"}
    assert {k.removeprefix(contract.AGENT_DIR + "/") for k in AGENT_FILES} == {*node, "__main__.py"}
    gateway = {f"sparkcluster/gateway/{p.name}" for p in (PACKAGE / "gateway").glob("*.py")}
    controller = {
        "sparkcluster/gateway/rollout.py",
        "sparkcluster/gateway/deploy.py",
        "sparkcluster/gateway/litellm.py",
        "sparkcluster/gateway/gateway_steps.py",  # gateway up/down as steps
        "sparkcluster/gateway/keys_place.py",  # where the keys are kept, edited from the controller
        "sparkcluster/gateway/store.py",
    }
    assert {k.removeprefix(CODE_DIR + "/") for k in code_files()} == {
        *(gateway - controller),
        "sparkcluster/__init__.py",
        "sparkcluster/node/__init__.py",
        "sparkcluster/node/contract.py",
        "sparkcluster/node/journal.py",  # read_json: the console reads the records the head keeps
        # the console's script and styles: the one folder of assets shipped beside the modules
        "sparkcluster/gateway/console_assets/console.js",
        "sparkcluster/gateway/console_assets/console.css",
        "sparkcluster/programs/__init__.py",
        "sparkcluster/programs/gateway_usage.py",  # the usage ledger: the gateway writes it, the host reads it
        "__main__.py",
    }
    assert programs.layout(["sparkcluster.node", "sparkcluster.node.agent"], "sparkcluster.node", "node") == {
        "node/__init__.py": "sparkcluster.node",
        "node/agent.py": "sparkcluster.node.agent",
    }


# ---- the programs' own functions, imported as the package's modules ----------------------------


def test_the_image_sender_names_a_v1_layer_by_its_json():
    """moby's v1.CreateID: the digest of the directory's json with its id left out and its layer's
    chain ID added names the layer it holds (image/v1/imagev1.go)."""
    import hashlib

    from sparkcluster.programs import image_sender

    diffs = [hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()]
    chains = image_sender.chain_ids(diffs)
    assert chains[0] == diffs[0]
    assert chains[1] == hashlib.sha256(f"sha256:{diffs[0]} sha256:{diffs[1]}".encode()).hexdigest()
    fields = '{"created":"2026-01-01T00:00:00Z","layer_id":"sha256:' + chains[1] + '"}'
    v1 = hashlib.sha256(fields.encode()).hexdigest()
    saved = json.dumps({"id": v1, "created": "2026-01-01T00:00:00Z"}, separators=(",", ":")).encode()
    assert image_sender.v1_layer(v1, saved, diffs, chains) == diffs[1]
    assert image_sender.v1_layer("0" * 64, saved, diffs, chains) is None
    assert image_sender.members('{"a": 1, "b" : [1, 2]}') == {"a": "1", "b": "[1, 2]"}


def test_the_compile_dirs_keep_the_cap_oldest_start_first(tmp_path):
    from sparkcluster.programs import compile_dirs

    lay = compile_dirs.Layout(
        {"key_len": 4, "stamp": ".last-start", "about": "key.json", "in_use": ".in-use", "subs": ["a", "b/c"]}
    )
    for key, age in (("aaaa", 30), ("bbbb", 20)):
        compile_dirs.prepare(lay, str(tmp_path), key, 1 << 30, {"k": key})
        (tmp_path / key / "a" / "blob").write_bytes(b"x" * 1000)
        os.utime(tmp_path / key / ".last-start", (time.time() - age, time.time() - age))
    (tmp_path / "not-a-key").mkdir()
    got = compile_dirs.prepare(lay, str(tmp_path), "cccc", 1500, {})
    assert [e["key"] for e in got["evicted"]] == ["aaaa"] and got["errors"] == []
    assert sorted(k["key"] for k in compile_dirs.keys(lay, str(tmp_path))) == ["bbbb", "cccc"]
    assert (tmp_path / "cccc" / "b" / "c").is_dir()
    assert [e["key"] for e in compile_dirs.purge(lay, str(tmp_path))["removed"]] == ["bbbb", "cccc"]
    assert (tmp_path / "not-a-key").is_dir()
