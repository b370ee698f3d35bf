"""One failure shape for `--json`, every command's (docs/reference/cli.md, "Failures under --json"):
each command that takes `--json` is run to a failure (an inventory whose nodes do not answer, a
profile that does not exist, an option that does not exist) and prints `ok` false, `error`, `fix`,
`problems` (each node's own: node, error, fix), `exit_code` (the exit code it ends with) and
`details`; a command whose failure keeps a report prints it beside these. The commands are read
from the command tree, so a new command with `--json` is run here too."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import click

from sparkcluster.cli.main import cli
from sparkcluster.errors import EXIT_UNREACHABLE
from tests.unit.test_first_hour import home, pair_toml, sparkcluster, write  # noqa: F401 (fixtures)

SHAPE = {"ok", "error", "fix", "problems", "exit_code", "details"}


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def json_commands() -> list[str]:
    """Every command (group and subcommand) that takes `--json`, from the command tree."""
    ctx = click.Context(cli, info_name="sparkcluster")
    out = []

    def visit(cmd, path):
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                visit(cmd.get_command(ctx, name), [*path, name])
        elif any("--json" in getattr(p, "opts", []) for p in cmd.params):
            out.append(" ".join(path))

    visit(cli, [])
    return out


# each command's failure (its arguments after the command words); every node of the inventory is
# out of reach, so a command that connects fails on that, naming each node
FAILURES = {
    "bench": ["--profile", "testbed"],
    "doctor": [],
    "down": [],
    "down --dry-run": [],
    "events": [],
    "fabric resume": [],
    "gateway down": [],
    "gateway events": [],
    "gateway keys list": [],
    "gateway status": [],
    "gateway up": [],
    "gateway usage": [],
    "init": ["--head", "spark-a.invalid"],
    "monitor down": [],
    "monitor status": [],
    "monitor up": [],
    "profile import": ["/no/such/recipe.yaml"],
    "profile lint": ["no-such-profile"],
    "profile list": ["--no-such-option"],
    "profile show": ["no-such-profile"],
    "rollback": ["--profile", "testbed"],
    "status": [],
    "up": ["--profile", "testbed"],
    "upgrade": ["--profile", "testbed", "--image", "nvcr.io/nvidia/vllm:26.01-py3"],
    "weights pull": ["--profile", "testbed"],
    "weights rm": ["org/model", "--yes"],
    "weights status": [],
}


def test_every_command_with_json_fails_in_one_shape(home):  # noqa: F811
    assert sorted(set(json_commands()) - {c.removesuffix(" --dry-run") for c in FAILURES}) == []
    inv = write(home, "pair.toml", pair_toml(closed_port(), "connect_timeout = 1\nconnect_attempts = 1"))
    env = {"GATEWAY_API_KEYS": "a-client-key-0123456789"}

    def run(command: str):
        argv = ["-i", str(inv), *command.split(), *FAILURES[command], "--json"]
        if command == "init":
            argv += ["-o", str(home["dir"] / "draft.toml")]
        return sparkcluster(home, *argv, env=env)

    with ThreadPoolExecutor(4) as pool:  # each run waits on its connect timeout: side by side
        runs = dict(zip(FAILURES, pool.map(run, FAILURES)))
    wrong = {}
    for command, (rc, out, err, _) in runs.items():
        try:
            body = json.loads(out)
        except ValueError:
            wrong[command] = f"not JSON (rc {rc}): {out!r} {err[-300:]!r}"
            continue
        if not (rc != 0 and SHAPE <= set(body) and body["ok"] is False and body["exit_code"] == rc):
            wrong[command] = (rc, body)
            continue
        if not (isinstance(body["error"], str) and body["error"] and isinstance(body["details"], list)):
            wrong[command] = body
        elif any(set(p) != {"node", "error", "fix"} for p in body["problems"]):
            wrong[command] = body["problems"]
        elif (rc == EXIT_UNREACHABLE or "unreachable" in body["error"]) and not body["problems"]:
            wrong[command] = ("no node named among the problems", body)
    assert wrong == {}
