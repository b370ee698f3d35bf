"""The documentation (README, the site under docs/, mkdocs.yml) against the code (issue 55).

- The site builds with `mkdocs build --strict` (a broken link or anchor, a page left out of the nav,
  a missing included file fails it).
- The reference pages are what `python -m docs.gen` makes from the code now: a command, option, key,
  check, lint rule or known-bad entry changed without `make docs` fails here.
- Every `sparkcluster ...` line of README's and the guides' shell blocks parses against the command
  tree (an option renamed in the code fails here), and those that can run here, offline, are run in
  process as written. Where a line needs a Spark, the test runs it as `--dry-run --offline` instead
  when that exists (SUBSTITUTED lists the rule); the rest are parsed only, except README's: each of
  those runs as written up to the connection, which is refused at once (no Spark here), and must end
  in exit 4 naming the nodes it could not reach, without a traceback.
- No page says "seed NNN" or "issue NN": an owner cannot follow either; the public document a claim
  comes from is named instead.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import click
import pytest

from sparkcluster.config import profile as profile_mod

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
GUIDES = sorted((REPO / "docs" / "guides").glob("*.md"))
SHIPPED = {p.stem for p in (REPO / "env-profiles").glob("*.toml") if not p.name.endswith(".perf.toml")}

# commands that read only the inventory, the profiles and the code: run as written
OFFLINE = {
    ("profile", "list"),
    ("profile", "show"),
    ("profile", "lint"),
    ("profile", "copy"),
    ("monitor", "config"),
    ("monitor", "dashboards"),
}
# the substitution for a line that needs a Spark: `up` (of a shipped profile) runs as its own plan,
# `up ... --dry-run --offline`, which reads the same inventory, profile and secrets and connects nowhere
SUBSTITUTED = {("up",): ["--dry-run", "--offline"]}


def test_the_site_builds_strictly(tmp_path):
    site = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(REPO / "mkdocs.yml"), "-d", str(site)],
        cwd=REPO,  # the included pages (pymdownx.snippets) are named from the repository's root
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "reference" / "cli.html").is_file() and (site / "testbed" / "hosts.html").is_file()
    # the pages beside their code are included, not copied
    assert "The testbed: two simulated Sparks" in (site / "testbed" / "hosts.html").read_text()


def test_the_reference_pages_are_what_the_code_makes(tmp_path, capsys):
    from docs import gen

    assert gen.main(["--out", str(tmp_path)]) == 0
    committed = {p.name: p.read_text() for p in (REPO / "docs" / "reference").glob("*.md")}
    made = {p.name: p.read_text() for p in tmp_path.glob("*.md")}
    assert set(made) == set(committed), sorted(set(made) ^ set(committed))
    stale = sorted(n for n in made if made[n] != committed[n])
    assert not stale, f"docs/reference/{', '.join(stale)} differ from the code: run `make docs` (python -m docs.gen)"


def test_the_module_map_names_every_module():
    """docs/reference/modules.md (docs.gen from the docstrings) names every module of the package under its
    package, each with what its docstring says, and leaves the tracker's numbers out as the site does."""
    page = (REPO / "docs" / "reference" / "modules.md").read_text()
    sections = {m.group(1): m.end() for m in re.finditer(r"^## `sparkcluster/(.*?)/?`$", page, re.M)}
    package = REPO / "sparkcluster"
    missing = []
    for p in sorted(package.rglob("*.py")):
        folder = p.parent.relative_to(package).as_posix()
        folder = "" if folder == "." else folder
        start = sections.get(folder)
        body = page[start : page.find("\n## ", start)] if start is not None else ""
        if not re.search(rf"^\| `{re.escape(p.stem)}` \| \S", body, re.M):
            missing.append(str(p.relative_to(REPO)))
    assert missing == []
    assert not re.search(r"\b(?:issue|seed) #?\d", page, re.I)


def test_the_cli_reference_names_every_command_and_option():
    from sparkcluster.cli.main import cli

    page = (REPO / "docs" / "reference" / "cli.md").read_text()

    def walk(cmd, path, ctx):
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                yield from walk(sub, [*path, name], click.Context(sub, info_name=name, parent=ctx))

    seen = 0
    for path, cmd in walk(cli, ["sparkcluster"], click.Context(cli, info_name="sparkcluster")):
        assert f"## {' '.join(path)} {{#" in page, path
        section = page.split(f"## {' '.join(path)} {{#", 1)[1].split("\n## ", 1)[0]
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                assert all(f"`{o}`" in section for o in p.opts), (path, p.opts)
        seen += 1
    assert seen >= 25
    for code in (0, 1, 2, 3, 4, 70, 130):
        assert f"\n| {code} | `EXIT_" in page


def test_readmes_links_lead_somewhere():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (REPO / target).exists(), target


def test_readme_is_an_owners_guide_that_keeps_the_set_up_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "make demo   #" in text and "make test   #" in text
    for section in ("## What you need", "## Install", "## One inventory", "## Check the cluster: `doctor`"):
        assert section in text
    assert "## Serve: `up`" in text and "curl " in text and "## Three setups" in text


def test_recipes_write_secrets_where_the_tool_reads_them():
    """No recipe appends to ./.env; those that write a .env write ~/.config/sparkcluster/.env."""
    for page in [README, *GUIDES, *(REPO / "docs").glob("*/*.md")]:
        for line in page.read_text().splitlines():
            if re.search(r">>?\s*\.env\b", line):
                pytest.fail(f"{page.relative_to(REPO)} writes ./.env: {line.strip()}")
            if ">> " in line and ".env" in line:
                assert "~/.config/sparkcluster/.env" in line, line


def test_readmes_secrets_recipe_makes_a_file_the_tool_reads(tmp_path, monkeypatch):
    """README's recipe, run as written by bash with HOME in tmp_path: a 0600 .env that load_secrets reads."""
    from sparkcluster.config import secrets

    block = README.read_text().split("## Secrets", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    r = subprocess.run(["bash", "-euc", block], env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]}, timeout=30)
    assert r.returncode == 0
    env = tmp_path / ".config" / "sparkcluster" / ".env"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(secrets.ENV_FILE_VAR, raising=False)
    got = secrets.load_secrets(names=["HF_TOKEN", "VLLM_API_KEY"], environ={}, required=True)
    assert got == {"HF_TOKEN": "hf_your_token", "VLLM_API_KEY": "a-long-random-key"}


# --- the guides' commands --------------------------------------------------------------------------


def _shell_lines(page: Path) -> list[str]:
    """The lines of a page's ```sh blocks, continuation lines joined."""
    out, inside, held = [], False, ""
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside and line.strip() in ("```sh", "```bash")
            continue
        if inside:
            if line.rstrip().endswith("\\"):
                held += line.rstrip()[:-1] + " "
                continue
            out.append(held + line)
            held = ""
    return out


def _commands() -> list[tuple[str, str, list[str]]]:
    """(page, line as written, argv) of every `sparkcluster ...` line; `[--x]` and `<a|b>` are the
    guides' own notation for an optional part and a value: the option is kept, the value stood in."""
    found = []
    for page in [README, *GUIDES]:
        for line in _shell_lines(page):
            if not line.startswith("sparkcluster "):
                continue
            argv = []
            for tok in shlex.split(line, comments=True)[1:]:
                tok = tok.strip("[]")
                if tok.startswith("<") and tok.endswith(">"):
                    tok = "v1"
                if tok:
                    argv.append(tok)
            found.append((page.relative_to(REPO).as_posix(), line.split("  #")[0].strip(), argv))
    return found


COMMANDS = _commands()


def _resolve(argv: list[str]) -> tuple[tuple[str, ...], click.Command]:
    """The command an argv names, its options parsed by click's own parser (an unknown or renamed
    option, or one missing its value, raises)."""
    from sparkcluster.cli.main import cli

    ctx = click.Context(cli, info_name="sparkcluster")
    cmd, path, args = cli, (), list(argv)
    while True:
        _opts, rest, _ = cmd.make_parser(ctx).parse_args(args=list(args))
        if not isinstance(cmd, click.Group) or not rest:
            return path, cmd
        sub = cmd.get_command(ctx, rest[0])
        assert sub is not None, f"no command {rest[0]!r} under {' '.join(('sparkcluster', *path))}"
        ctx = click.Context(sub, info_name=rest[0], parent=ctx)
        cmd, path, args = sub, (*path, rest[0]), rest[1:]


def test_the_guides_have_commands_to_check():
    pages = {page for page, _, _ in COMMANDS}
    assert "README.md" in pages and len(COMMANDS) >= 60


@pytest.mark.parametrize("page,line,argv", COMMANDS, ids=[f"{p}: {line}" for p, line, _ in COMMANDS])
def test_every_command_in_the_guides_parses(page, line, argv):
    _resolve(argv)


def _plan(argv: list[str]) -> tuple[str, list[str]] | None:
    """How a line runs here: ("as written", argv), ("substituted", argv) or None (parsed only)."""
    path, _ = _resolve(argv)
    prof = argv[argv.index("--profile") + 1] if "--profile" in argv else None
    if prof is not None and prof not in SHIPPED:
        return None  # a placeholder (`P`, `big-model`) or the testbed's own profiles
    if argv == ["--version"] or path in OFFLINE or {"--dry-run", "--offline"} <= set(argv):
        return "as written", argv
    if path in SUBSTITUTED:
        return "substituted", argv + [a for a in SUBSTITUTED[path] if a not in argv]
    return None


RUNS = [(page, line, *plan) for page, line, argv in COMMANDS if (plan := _plan(argv)) is not None]


@pytest.fixture
def owner(tmp_path, monkeypatch):
    """A laptop of its own: HOME and XDG folders in tmp_path, README's pair inventory written where
    the tool reads it, a 0600 .env with both secrets."""
    home = tmp_path / "home"
    cfg = home / ".config" / "sparkcluster"
    cfg.mkdir(parents=True)
    text = README.read_text()
    pair = re.search(r"```toml\n(.*?)```", text.split("### A complete inventory: the pair", 1)[1], re.S).group(1)
    (cfg / "cluster.toml").write_text(pair)
    env = cfg / ".env"
    env.write_text("HF_TOKEN=hf_docs_test_token\nVLLM_API_KEY=docs-test-key\n")
    env.chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    for var in ("SPARKCLUSTER_INVENTORY", "SPARKCLUSTER_ENV_FILE", profile_mod.PROFILES_ENV_VAR, "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def test_the_commands_that_run_here_are_the_ones_expected():
    """What runs, and the substitutions, stated: a guide's new command is classified by the rule above."""
    ran = {(how, line) for _, line, how, _ in RUNS}
    assert ("as written", "sparkcluster up --profile nemotron --dry-run --offline") in ran
    assert ("as written", "sparkcluster profile list") in ran
    assert ("substituted", "sparkcluster up --profile nemotron") in ran
    assert ("substituted", "sparkcluster up --profile qwen36-35b-fp8-single --node spark-a") in ran


@pytest.mark.parametrize(
    "page,line,how,argv", RUNS, ids=[f"{p}: {line} ({how}: {' '.join(a)})" for p, line, how, a in RUNS]
)
def test_the_guides_commands_that_can_run_here_run(owner, capsys, page, line, how, argv):
    from sparkcluster.cli.main import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 0, f"{page}: {line} ({how}: sparkcluster {' '.join(argv)}) exited {rc}\n{out}\n{err}"


README_REACHING = [(line, argv) for page, line, argv in COMMANDS if page == "README.md" and _plan(argv) is None]


def test_every_readme_command_runs_here_one_way_or_the_other():
    ran = {line for page, line, _, _ in RUNS if page == "README.md"}
    reaching = {line for line, _ in README_REACHING}
    readme = {line for page, line, _ in COMMANDS if page == "README.md"}
    assert readme == ran | reaching and not ran & reaching
    assert {"sparkcluster doctor", "sparkcluster status", "sparkcluster down"} <= reaching
    assert "sparkcluster profile copy nemotron" in ran


@pytest.mark.parametrize("line,argv", README_REACHING, ids=[line for line, _ in README_REACHING])
def test_readmes_commands_that_need_a_spark_run_up_to_the_connection(owner, capsys, monkeypatch, line, argv):
    """README's pair inventory as written, the connection refused at once: the command loads what it
    needs, asks for its nodes and ends in one clear unreachable report (exit 4)."""
    from sparkcluster.cli.main import main
    from sparkcluster.errors import ConnectError
    from sparkcluster.remote import ssh

    asked = []

    def no_spark_here(node, settings):
        asked.append(node.name)
        raise ConnectError(node.name, f"no Spark in the docs test ({node.ssh})", "none: a test")

    monkeypatch.setattr(ssh, "connect", no_spark_here)
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 4, f"README: {line} exited {rc}\n{out}\n{err}"
    assert asked and set(asked) <= {"spark-a", "spark-b"}
    assert "no Spark in the docs test" in out + err and "Traceback" not in out + err


INTERNAL = re.compile(r"seed [0-9]{3}|issue [0-9]+", re.I)


def test_no_page_cites_an_internal_seed_or_issue_number():
    """What an owner reads names public documents (the build log, NVIDIA's playbooks, a forum
    thread), never this project's seed files or issue numbers."""
    pages = [README, *sorted((REPO / "docs").rglob("*.md"))]
    hits = [
        f"{page.relative_to(REPO)}:{n}: {m.group(0)}"
        for page in pages
        for n, text in enumerate(page.read_text().splitlines(), 1)
        for m in INTERNAL.finditer(text)
    ]
    assert not hits, "\n".join(hits)


def test_readmes_one_spark_inventory_is_the_least_that_loads_and_plans_a_serve(owner, capsys):
    """README's one-Spark inventory: one node, no data_plane (nothing crosses a cable), and a
    one-node profile plans on it as printed."""
    from sparkcluster.cli.main import main
    from sparkcluster.config import inventory

    block = re.search(r"```toml\n(.*?)```", README.read_text().split("### One Spark", 1)[1], re.S).group(1)
    inv = inventory.parse(block, source="README")
    assert [n.name for n in inv.nodes] == ["spark-a"] and inv.head.data_plane == []
    import tomllib

    from pydantic import ValidationError

    data = tomllib.loads(block)
    for key in ("name", "role", "ssh", "control_if", "control_ip"):  # each one the least that loads needs
        short = {**data, "nodes": [{k: v for k, v in data["nodes"][0].items() if k != key}]}
        with pytest.raises(ValidationError):
            inventory.Inventory.model_validate(short)
    one = owner / "one.toml"
    one.write_text(block)
    rc = main(["-i", str(one), "up", "--profile", "qwen36-35b-fp8-single", "--dry-run", "--offline"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert out.startswith("plan for profile 'qwen36-35b-fp8-single' on cluster 'one'")
