"""The CLI starts without importing what its commands use: `--help` and `--version` load no command
module, no structlog, pydantic or docker SDK (issue 23: the CLI starts in well under 0.3 s; the
figure itself is measured by `make bench`, never asserted here)."""

import subprocess
import sys

PROBE = (
    "import sys; from sparkcluster.cli.main import main; rc = main({argv!r}); "
    "heavy = sorted(m for m in sys.modules if m.endswith('_cmd') or m.split('.')[0] in "
    "('structlog', 'pydantic', 'docker', 'paramiko', 'rich', 'httpx')); print(heavy)"
)


def loaded(argv: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, check=True)
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 (our own repr of a list of names)


def test_help_and_version_import_no_command():
    assert loaded(["--help"]) == []
    assert loaded(["--version"]) == []


def test_help_lists_every_command_with_its_line():
    from sparkcluster.cli.main import _LazyGroup

    out = subprocess.run(
        [sys.executable, "-m", "sparkcluster", "--help"], capture_output=True, text=True, check=True
    ).stdout
    flat = " ".join(out.split())
    for name, line in _LazyGroup.COMMANDS.items():
        assert f"{name} {line}" in flat


def test_a_command_imports_only_its_own_module():
    mods = loaded(["profile", "list"])
    assert [m for m in mods if m.endswith("_cmd")] == ["sparkcluster.cli.profile_cmd"]
