"""The CLI's error paths without a testbed (issue 7): whatever goes wrong, no secret reaches the
terminal or the debug log, and bad input is refused before any connection with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from sparkcluster import redact
from sparkcluster.cli import main as cli_main
from tests.testbed import PROFILES as TESTBED_PROFILES

SECRET = "hf_unitTESTsecret0987654321"
API_KEY = "sk-unit-1a2b3c4d5e"
ROOT = Path(__file__).resolve().parents[2]


def inventory_toml(extra_cluster: str = "", head_ip: str = "198.19.2.1", extra_node: str = "") -> str:
    nodes = []
    for name, role, ip in (("spark-head", "head", head_ip), ("spark-worker", "worker", "198.19.2.2")):
        nodes.append(f"""
[[nodes]]
name = "{name}"
role = "{role}"
ssh = "root@{name}"
control_if = "enp1s0f1np1"
control_ip = "{ip}"
{extra_node if role == "head" else ""}
data_plane = [{{ netdev = "enp1s0f1np1", hca = "rocep1s0f1" }}]
""")
    return f'[cluster]\nname = "pair"\n{extra_cluster}\n' + "".join(nodes)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A state dir for the debug log, a 0600 .env, and no way to open an SSH connection."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(TESTBED_PROFILES))  # the testbed's, nothing of yours
    envf = tmp_path / ".env"
    envf.write_text(f"VLLM_API_KEY={API_KEY}\nHF_TOKEN={SECRET}\n")
    envf.chmod(0o600)
    monkeypatch.setenv("SPARKCLUSTER_ENV_FILE", str(envf))
    monkeypatch.chdir(tmp_path)
    connects: list[str] = []

    def no_connect(node, settings):
        connects.append(node.name)
        raise AssertionError(f"connection attempted to {node.name}")

    monkeypatch.setattr("sparkcluster.remote.ssh.connect", no_connect)
    inv = tmp_path / "cluster.toml"
    inv.write_text(inventory_toml())
    yield {
        "dir": tmp_path,
        "env_file": envf,
        "inventory": inv,
        "connects": connects,
        "debug_log": tmp_path / "state" / "sparkcluster" / "debug.log",
    }
    with redact._lock:
        redact._values.discard(SECRET)
        redact._values.discard(API_KEY)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli_main.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def no_secret(*texts: str) -> None:
    for t in texts:
        assert SECRET not in t and API_KEY not in t, t


def test_unexpected_error_masks_secrets_in_message_and_traceback(env, capsys):
    """A bug whose exception message carries a secret: one masked line, a masked traceback."""
    redact.register(SECRET)

    @click.command("explode")
    def explode() -> None:
        raise RuntimeError(f"token {SECRET} rejected by something unexpected")

    cli_main.cli.add_command(explode)
    try:
        rc, out, err = run(capsys, "explode")
    finally:
        cli_main.cli.commands.pop("explode", None)
    assert rc == 70
    assert "error: unexpected RuntimeError: token ****** rejected" in err
    assert f"details: {env['debug_log']}" in err
    tb = env["debug_log"].read_text()
    assert "Traceback" in tb and "RuntimeError" in tb and redact.MASK in tb
    no_secret(out, err, tb)


def test_spark_error_with_secret_is_masked(env, capsys):
    from sparkcluster.errors import SparkError

    redact.register(SECRET)

    @click.command("fail")
    def fail() -> None:
        raise SparkError(f"bad {SECRET}", f"fix {SECRET}", details=[f"detail {SECRET}"])

    cli_main.cli.add_command(fail)
    try:
        rc, out, err = run(capsys, "fail")
    finally:
        cli_main.cli.commands.pop("fail", None)
    assert rc == 1
    assert err.count(redact.MASK) == 3
    no_secret(out, err)


def test_world_readable_env_refused_before_any_connection(env, capsys):
    env["env_file"].chmod(0o644)
    rc, out, err = run(capsys, "--inventory", str(env["inventory"]), "up", "--profile", "testbed")
    assert rc == 2
    assert "readable by group or others (mode 0644)" in err
    assert f"fix: chmod 600 {env['env_file']}" in err
    assert env["connects"] == []
    no_secret(out, err)


def test_newline_in_forwarded_value_refused_in_one_line(env, capsys, monkeypatch):
    profiles = env["dir"] / "profiles"
    profiles.mkdir()
    text = (TESTBED_PROFILES / "testbed.toml").read_text()
    text = text.replace("[env.forward]\n", '[env.forward]\nSC_MULTILINE = "first\\nsecond"\n')
    (profiles / "testbed-newline.toml").write_text(text)
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(profiles))
    for cmd in (["up", "--profile", "testbed-newline"], ["up", "--profile", "testbed-newline", "--dry-run"]):
        rc, out, err = run(capsys, "--inventory", str(env["inventory"]), *cmd)
        assert rc == 2, err
        problems = [line for line in err.splitlines() if "SC_MULTILINE" in line]
        assert len(problems) == 1 and "may not contain a newline" in problems[0], err
        assert "second" not in err  # the value is not echoed
    assert env["connects"] == []


def test_malformed_inventory_one_line_per_problem(env, capsys):
    bad = env["dir"] / "bad.toml"
    bad.write_text(
        inventory_toml(
            extra_cluster=f'api_token = "{SECRET}"', head_ip="198.19.2.300", extra_node=f'password = "{API_KEY}"'
        )
    )
    for cmd in (["up", "--profile", "testbed"], ["doctor"], ["up", "--profile", "testbed", "--dry-run"]):
        rc, out, err = run(capsys, "--inventory", str(bad), *cmd)
        assert rc == 2, err
        lines = err.splitlines()
        assert "3 problem(s) in the inventory" in lines[0]
        assert sum("cluster.api_token: unknown key" in x for x in lines) == 1
        assert sum("nodes[0].password: unknown key" in x for x in lines) == 1
        assert sum("nodes[0].control_ip:" in x and "IPv4" in x for x in lines) == 1
        assert "198.19.2.300" not in err
        no_secret(out, err)
    assert env["connects"] == []


def test_tp_not_matching_gpus_refused_before_any_connection(env, capsys, monkeypatch):
    profiles = env["dir"] / "profiles"
    profiles.mkdir()
    text = (
        (TESTBED_PROFILES / "testbed.toml").read_text().replace("tensor_parallel_size = 2", "tensor_parallel_size = 4")
    )
    (profiles / "testbed-tp4.toml").write_text(text)
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(profiles))
    rc, out, err = run(capsys, "--inventory", str(env["inventory"]), "up", "--profile", "testbed-tp4")
    assert rc == 2, err
    assert "fails lint" in err
    assert sum("4 x 1 = 4, but the cluster has 2 GPU(s)" in x for x in err.splitlines()) == 1
    assert env["connects"] == []
    no_secret(out, err)


def test_json_log_masks_registered_secret(env, capsys):
    """Whatever a log call carries, both sinks (stderr JSON, the debug log) get it masked."""
    from sparkcluster import log

    redact.register(SECRET)
    log.configure(level="debug", fmt="json")
    log.get("test").info("event", header=f"Bearer {SECRET}", nested={"k": [SECRET]})
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if '"event"' in x)
    assert json.loads(line)["header"] == "Bearer ******"
    no_secret(err, env["debug_log"].read_text())


def test_a_subcommand_imports_only_its_own_module():
    """`status` must not pay for `up`'s or `doctor`'s imports (start-up is most of its time)."""
    code = (
        "import sys; from sparkcluster.cli.main import main; main(['status', '--help']); "
        "print(sorted(m for m in sys.modules if m.startswith('sparkcluster.cli.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = out.strip().splitlines()[-1]
    assert "sparkcluster.cli.status_cmd" in loaded
    for other in ("up", "doctor", "init", "profile", "logs", "down"):
        assert f"sparkcluster.cli.{other}'" not in loaded, loaded


def test_gateway_up_without_a_client_key_is_refused_before_any_connection(env, capsys):
    rc, out, err = run(capsys, "--inventory", str(env["inventory"]), "gateway", "up", "--dry-run")
    assert rc == 2 and "the gateway needs at least one client key" in err and "GATEWAY_API_KEYS" in err
    assert env["connects"] == []
    no_secret(out, err)
