"""A newcomer's first hour at the command line (issue 56), loopback only: a closed port on
127.0.0.1, a listener that never speaks, a private sshd in this process (tests/unit/sshd_fake).
Each test first produces the bad case the issue found, then checks what is said and the exit code."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from sparkcluster.config import inventory
from sparkcluster.errors import AuthError, ConnectError, HostKeyError
from sparkcluster.remote import ssh
from tests.unit.sshd_fake import FakeSshd, keygen, known_line
from tests.unit.test_first_hour import home, pair_toml, silent, sparkcluster, write  # noqa: F401 (fixtures)


def one_toml(target: str, cluster_extra: str = "") -> str:
    return f"""
[cluster]
name = "solo"
{cluster_extra}

[[nodes]]
name = "spark-a"
role = "head"
ssh = "{target}"
control_if = "enp1s0f1np1"
control_ip = "192.168.100.10"
data_plane = [{{ netdev = "enp1s0f1np1", hca = "rocep1s0f1" }}]
"""


@pytest.fixture
def sshd(tmp_path):
    d = FakeSshd(keygen(tmp_path / "host_key"))
    yield d
    d.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def connect(tmp_path, target: str, known: str, ssh_config: str = "", timeout: int = 3):
    kh = tmp_path / "known_hosts"
    kh.write_text(known)
    extra = f'known_hosts = "{kh}"\nconnect_timeout = {timeout}\nconnect_attempts = 1\n'
    if ssh_config:
        (tmp_path / "ssh_config").write_text(ssh_config)
        extra += f'ssh_config = "{tmp_path / "ssh_config"}"\n'
    p = tmp_path / "solo.toml"
    p.write_text(one_toml(target, extra))
    inv = inventory.load(p)
    return ssh.connect(inv.nodes[0], ssh.Settings.from_inventory(inv))


# --- 1. known_hosts lines paramiko cannot parse -----------------------------------------------------

UNPARSEABLE = [
    "@cert-authority *.example.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    "damaged-host ssh-ed25519 AAAA!!not-base64",
    "half a line",
]


class Said:
    def __init__(self):
        self.lines: list[str] = []

    def warning(self, msg, **kw):
        self.lines.append(msg)

    def __getattr__(self, name):
        return lambda *a, **kw: None


def test_unparseable_known_hosts_lines_are_skipped_with_a_warning_and_keys_still_checked(sshd, tmp_path, monkeypatch):
    """paramiko #771/#490: one such line made every command exit 70 ("unexpected InvalidHostKey");
    OpenSSH skips it and goes on to authentication, and so do we (pyinfra PR #1926 likewise)."""
    good = known_line(f"[127.0.0.1]:{sshd.port}", sshd.host_key)
    target = f"spark@127.0.0.1:{sshd.port}"
    log = Said()
    monkeypatch.setattr(ssh, "_log", log)
    keygen(tmp_path / "id")
    cfg = f"Host *\n  IdentityFile {tmp_path / 'id'}\n  IdentityAgent none\n"
    # past the host key check to authentication, which this sshd refuses
    with pytest.raises(AuthError, match="authentication refused"):
        connect(tmp_path, target, "\n".join([*UNPARSEABLE, good]) + "\n", cfg)
    said = [line for line in log.lines if "known_hosts line skipped" in line]
    assert any(f"{tmp_path / 'known_hosts'}:1:" in m and "@cert-authority" in m for m in said), said
    assert any(":2:" in m for m in said) and any(":3:" in m for m in said), said
    # still strict: the same file without the host's line refuses it, with a fix that runs as printed
    with pytest.raises(HostKeyError, match="not in known_hosts") as e:
        connect(tmp_path, target, "\n".join(UNPARSEABLE) + "\n")
    assert f"ssh-keyscan -t ed25519 -p {sshd.port} 127.0.0.1 >> " in e.value.fix
    # another key under the host's name is a CHANGED key; the ssh-keygen line is quoted for any shell
    other = keygen(tmp_path / "other")
    with pytest.raises(HostKeyError, match="CHANGED") as e:
        connect(tmp_path, target, "\n".join([*UNPARSEABLE, known_line(f"[127.0.0.1]:{sshd.port}", other)]) + "\n")
    assert f"-R '[127.0.0.1]:{sshd.port}'" in e.value.fix
    # a key marked @revoked is refused even where a plain line lists it
    revoked = f"@revoked * {sshd.host_key.get_name()} {sshd.host_key.get_base64()}"
    with pytest.raises(HostKeyError, match="@revoked"):
        connect(tmp_path, target, f"{good}\n{revoked}\n")


def test_status_doctor_init_with_a_cert_authority_line_reach_authentication(sshd, home):  # noqa: F811
    kh = home["home"] / ".ssh" / "known_hosts"
    lines = [known_line(f"[{h}]:{sshd.port}", sshd.host_key) for h in ("127.0.0.1", "localhost")]
    kh.write_text("\n".join([*UNPARSEABLE, *lines]) + "\n")
    inv = write(home, "pair.toml", pair_toml(sshd.port, "connect_timeout = 3"))
    head, worker = f"spark@127.0.0.1:{sshd.port}", f"spark@localhost:{sshd.port}"
    out_toml = str(home["dir"] / "new.toml")
    for argv in (
        ["-i", str(inv), "status"],
        ["-i", str(inv), "doctor"],
        ["init", "--head", head, "--worker", worker, "-o", out_toml],
    ):
        rc, out, err, _ = sparkcluster(home, *argv)
        assert rc == 4, (argv, rc, out, err)  # a node could not be reached: no key to offer this sshd
        assert "error: unexpected" not in err and "InvalidHostKey" not in out + err, (argv, err)
        assert "no SSH key to offer" in out + err, (argv, out, err)
        # one warning a line, however many nodes read the file
        assert f"{kh}:1: known_hosts line skipped" in err and err.count(f"{kh}:1:") == 1, err


# --- 4. every printed fix runs as printed -----------------------------------------------------------


def test_each_cause_gets_its_own_fix_that_runs_as_printed(tmp_path, silent):  # noqa: F811
    port = closed_port()
    with pytest.raises(ConnectError) as e:
        connect(tmp_path, f"owner@127.0.0.1:{port}", "")
    assert "nothing listens on 127.0.0.1" in e.value.message and "connection refused" in e.value.message
    assert f"ssh -p {port} owner@127.0.0.1" in e.value.fix and "127.0.0.1:" not in e.value.fix
    with pytest.raises(ConnectError) as e:
        connect(tmp_path, f"owner@127.0.0.1:{silent.port}", "", timeout=1)
    assert "never sent its SSH greeting" in e.value.message and "systemctl status ssh" in e.value.fix
    assert ssh.ssh_command("owner@127.0.0.1:2222") == "ssh -p 2222 owner@127.0.0.1"
    assert ssh.ssh_command("spark-a") == "ssh spark-a"
    assert ssh.ssh_command("me@[::1]:2222") == "ssh -p 2222 me@::1"


def test_a_refused_key_and_a_locked_key_are_told_apart(sshd, tmp_path):
    good = known_line(f"[127.0.0.1]:{sshd.port}", sshd.host_key) + "\n"
    target = f"spark@127.0.0.1:{sshd.port}"
    key = tmp_path / "id_plain"
    keygen(key)
    cfg = f"Host *\n  IdentityFile {key}\n  IdentitiesOnly yes\n  IdentityAgent none\n"
    with pytest.raises(AuthError) as e:
        connect(tmp_path, target, good, cfg)
    assert e.value.fix.endswith(f"ssh-copy-id -i {key} -p {sshd.port} spark@127.0.0.1"), e.value.fix
    locked = tmp_path / "id_locked"
    sshd.accept.add(keygen(locked, passphrase="correct horse").asbytes())
    cfg = f"Host *\n  IdentityFile {locked}\n  IdentitiesOnly yes\n  IdentityAgent none\n"
    with pytest.raises(AuthError) as e:
        connect(tmp_path, target, good, cfg)
    assert "needs its passphrase" in e.value.message and f"ssh-add {locked}" in e.value.fix, e.value
    # the fix as printed, then the connection as sparkcluster makes it, through the agent
    if not shutil_which("ssh-agent"):
        pytest.skip("no ssh-agent here")
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True).stdout
    env = dict(line.split(";")[0].split("=", 1) for line in agent.splitlines() if "=" in line.split(";")[0])
    try:
        subprocess.run(
            ["ssh-add", str(locked)],
            env={**os.environ, **env, "SSH_ASKPASS_REQUIRE": "never"},
            input="correct horse\n",
            capture_output=True,
            text=True,
            check=False,
        )
        added = subprocess.run(["ssh-add", "-l"], env={**os.environ, **env}, capture_output=True, text=True)
        if added.returncode != 0:
            pytest.skip("ssh-add reads a passphrase from a terminal only here")
        old = os.environ.get("SSH_AUTH_SOCK")
        os.environ["SSH_AUTH_SOCK"] = env["SSH_AUTH_SOCK"]
        try:
            for only in ("no", "yes"):  # IdentitiesOnly: the agent's copy of that key, and no other
                connect(tmp_path, target, good, f"Host *\n  IdentityFile {locked}\n  IdentitiesOnly {only}\n").close()
        finally:
            os.environ.pop("SSH_AUTH_SOCK") if old is None else os.environ.update(SSH_AUTH_SOCK=old)
    finally:
        subprocess.run(["kill", env["SSH_AGENT_PID"]], check=False)


def shutil_which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


def test_doctor_names_the_cause_as_status_does_and_exits_4(home):  # noqa: F811
    port = closed_port()
    inv = write(home, "solo.toml", one_toml(f"owner@127.0.0.1:{port}", "connect_timeout = 2"))
    rc, out, err, _ = sparkcluster(home, "-i", str(inv), "doctor", "--json")
    assert rc == 4, (rc, out, err)
    row = next(r for r in json.loads(out)["checks"] if r["id"] == "ssh.reachable")
    assert "nothing listens on" in row["detail"] and f"ssh -p {port} owner@127.0.0.1" in row["fix"], row
    rc2, out2, err2, _ = sparkcluster(home, "-i", str(inv), "status", "--json")
    assert rc2 == 4 and row["fix"] in json.loads(out2)["fix"], out2
    assert shlex.split(row["fix"].rsplit("try: ", 1)[1])[:3] == ["ssh", "-p", str(port)]


# --- 2. init on names that do not resolve ------------------------------------------------------------


def test_init_on_a_name_that_does_not_resolve_says_so_and_points_to_ssh_config(home):  # noqa: F811
    # .invalid never resolves (RFC 6761), so no address other than loopback is ever tried
    rc, out, err, _ = sparkcluster(home, "init", "--head", "spark-a.invalid", "-o", str(home["dir"] / "x.toml"))
    assert rc == 4, (rc, out, err)
    assert "'spark-a.invalid' does not resolve" in err and "Host entry in ~/.ssh/config" in err, err
    assert "fix: add `Host spark-a.invalid` with its HostName (and User) to ~/.ssh/config" in err, err
    assert "sshd listens on port 22" not in err and "after" not in err.splitlines()[0]  # not retried


# --- 5. the command line ---------------------------------------------------------------------------


def test_global_options_work_after_the_subcommand_too(home):  # noqa: F811
    missing = str(home["dir"] / "nowhere.toml")
    for argv in (["status", "-i", missing], ["gateway", "status", "--inventory", missing], ["-i", missing, "status"]):
        rc, out, err, _ = sparkcluster(home, *argv)
        assert rc == 2 and f"error: no inventory at {missing}" in err, (argv, err)
    inv = write(home, "solo.toml", one_toml(f"owner@127.0.0.1:{closed_port()}", "connect_timeout = 1"))
    rc, out, err, _ = sparkcluster(home, "status", "--json", "-i", str(inv), "-vv", "--log-format", "json")
    assert rc == 4 and json.loads(out)["state"] == "unreachable", err
    # -v after the command shows what the default level hides (the retry), in the format asked for after it
    assert any(json.loads(line).get("event") == "retrying" for line in err.splitlines() if line.startswith("{")), err
    # a subcommand's own option of that name still wins: profile show's -i is its inventory too
    rc, out, err, _ = sparkcluster(home, "profile", "show", "testbed", "-i", missing)
    assert rc == 2 and missing in err, err


def test_bare_sparkcluster_prints_the_help_and_exits_0(home):  # noqa: F811
    rc, out, err, _ = sparkcluster(home)
    assert rc == 0 and out.startswith("Usage: sparkcluster") and "Commands:" in out and not err, (out, err)


def test_did_you_mean_for_commands_profiles_and_keys(home):  # noqa: F811
    inv = write(home, "solo.toml", one_toml("owner@127.0.0.1:1"))
    cases = [
        (["-i", str(inv), "stauts", "--json"], "no command 'stauts'", f"sparkcluster -i {inv} status --json"),
        (["gateway", "evnets"], "did you mean 'events'?", "sparkcluster gateway events"),
        (["profile", "show", "tesbed"], "no profile named 'tesbed': did you mean 'testbed'", None),
    ]
    for argv, said, fix in cases:
        rc, out, err, _ = sparkcluster(home, *argv)
        assert rc == 2 and said in err, (argv, err)
        assert err.strip().splitlines()[-1] == f"fix: {fix or 'sparkcluster profile show testbed'}", err
    rc, out, err, _ = sparkcluster(home, "profile", "show", "no-such-thing-at-all")
    assert rc == 2 and len(err) < 300 and "fix: see the " in err and "sparkcluster profile list" in err, err
    bad = write(home, "bad.toml", one_toml("a").replace('role = "head"', 'role = "head"\nconrtol_mtu = 1'))
    bad.write_text(bad.read_text().replace("[cluster]", "[cluster]\nconect_timeout = 3"))
    rc, out, err, _ = sparkcluster(home, "-i", str(bad), "status")
    assert rc == 2 and "cluster.conect_timeout: unknown key: did you mean 'connect_timeout'?" in err, err
    from tests.testbed import PROFILES

    text = (PROFILES / "testbed.toml").read_text()
    prof = write(home, "typo.toml", "descripton = 'x'\n" + text)
    rc, out, err, _ = sparkcluster(home, "profile", "show", str(prof))
    assert rc == 2 and "descripton: unknown key: did you mean 'description'?" in err, err


# --- 3. gateway and monitor on an unreachable cluster --------------------------------------------------


def test_gateway_and_monitor_on_unreachable_nodes_say_so_and_exit_4(home):  # noqa: F811
    port = closed_port()
    inv = write(home, "pair.toml", pair_toml(port, "connect_timeout = 1\nconnect_attempts = 1"))
    rc, out, err, _ = sparkcluster(home, "gateway", "status", "-i", str(inv))
    assert rc == 4 and "spark-a: UNREACHABLE" in out and "spark-b: UNREACHABLE" in out, (rc, out, err)
    assert "no gateway on the nodes that answer" in out and "no gateway: sparkcluster gateway up" not in out
    rc, out, err, _ = sparkcluster(home, "gateway", "status", "--json", "-i", str(inv))
    body = json.loads(out)
    assert rc == 4 and body["gateways"] == [] and [u["node"] for u in body["unreachable"]] == ["spark-a", "spark-b"]
    assert all(f"ssh -p {port} spark@" in u["fix"] for u in body["unreachable"]), body
    rc, out, err, _ = sparkcluster(home, "gateway", "events", "--json", "-i", str(inv))
    body = json.loads(out)
    assert rc == 4 and body["exit_code"] == 4 and "no gateway on the nodes that answer" in body["error"], body
    assert [p["node"] for p in body["problems"]] == ["spark-a", "spark-b"], body
    assert all(f"ssh -p {port} spark@" in p["fix"] for p in body["problems"]), body
    rc, out, err, _ = sparkcluster(home, "gateway", "events", "--last", "-5", "-i", str(inv))
    assert rc == 2 and "--last" in err and "-5" in err, err
    rc, out, err, _ = sparkcluster(home, "monitor", "status", "-i", str(inv))
    assert rc == 4 and "spark-a: the head does not answer" in err, err
    rc, out, err, _ = sparkcluster(home, "gateway", "down", "-i", str(inv))  # --help's 4, not 1
    assert rc == 4 and "spark-a: UNREACHABLE" in out, (rc, out, err)


def test_gateway_status_names_the_url_clients_use_and_monitor_status_reads_prometheus():
    from sparkcluster.cli import gateway_read_cmd, monitor_read_cmd

    assert gateway_read_cmd.client_url("spark-a", {"Mounts": []}, 4000) == "http://spark-a:4000/v1"
    tls = {"Mounts": [{"Destination": "/etc/sparkcluster/tls"}]}
    assert gateway_read_cmd.client_url("10.0.0.1", tls, 4443) == "https://10.0.0.1:4443/v1"
    targets = {
        "data": {
            "activeTargets": [
                {"labels": {"job": "agent", "instance": "10.0.0.1:9400"}, "health": "up", "lastError": ""},
                {"labels": {"job": "vllm", "instance": "10.0.0.2:8000"}, "health": "down", "lastError": "refused"},
            ]
        }
    }
    alerts = {
        "data": {
            "alerts": [
                {"labels": {"alertname": "EngineDown", "node": "spark-b"}, "state": "firing", "activeAt": "t"},
                {"labels": {"alertname": "Slow"}, "state": "pending", "activeAt": "t"},
            ]
        }
    }
    rows, firing = monitor_read_cmd.summary(targets, alerts)
    assert [(r["job"], r["health"]) for r in rows] == [("agent", "up"), ("vllm", "down")]
    assert firing == [{"name": "EngineDown", "labels": {"node": "spark-b"}, "since": "t"}]


def test_ctrl_c_on_an_unreachable_watch_exits_130_as_readme_says(home):  # noqa: F811
    import signal
    import sys
    import time

    inv = write(home, "pair.toml", pair_toml(closed_port(), "connect_timeout = 1\nconnect_attempts = 1"))
    p = subprocess.Popen(
        [sys.executable, "-m", "sparkcluster", "-i", str(inv), "status", "--watch", "--interval", "0.5"],
        cwd=home["cwd"],
        env=home["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(4)  # a few rounds, each finding both nodes unreachable at once (nothing listens)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    # Ctrl-C interrupts whatever the watch showed (README's exit codes: 130); tests/unit/test_watch.py
    assert p.returncode == 130 and "interrupted" in err, (p.returncode, out, err)


def test_rollback_history_json_prints_the_records(home):  # noqa: F811
    inv = write(home, "solo.toml", one_toml("a"))
    rc, out, err, _ = sparkcluster(home, "-i", str(inv), "rollback", "--history", "--json")
    assert rc == 0 and json.loads(out) == {"good": [], "upgrades": []}, (out, err)


def test_old_option_names_work_for_one_release_and_say_so(home):  # noqa: F811
    from sparkcluster.cli.main import _old_names

    assert _old_names(["-i", "f.toml", "logs", "spark-b", "--tail", "5"]) == [
        "-i", "f.toml", "logs", "--node", "spark-b", "--last", "5",
    ]  # fmt: skip
    assert _old_names(["gateway", "export", "--litellm", "--out=x.yaml"])[-1] == "--output=x.yaml"
    assert _old_names(["status", "--out", "x"]) == ["status", "--out", "x"]  # only where it was a name
    inv = write(home, "pair.toml", pair_toml(closed_port(), "connect_timeout = 1\nconnect_attempts = 1"))
    rc, out, err, _ = sparkcluster(home, "-i", str(inv), "logs", "spark-b", "--tail", "5")
    assert rc == 4 and "warning: --tail is now --last" in err and "`logs NODE` is now `logs --node NODE`" in err
    assert "spark-b" in err and "spark-a" not in err.split("warning")[-1].splitlines()[-1], err
    for argv in (["down", "--help"], ["logs", "--help"], ["gateway", "export", "--help"], ["bench", "--help"]):
        rc, out, err, _ = sparkcluster(home, *argv)
        assert rc == 0 and "--tail" not in out and "--out " not in out and "--out," not in out, (argv, out)
    rc, out, err, _ = sparkcluster(home, "down", "--help")
    assert "-p, --profile" in out


def test_shell_completion_completes_profile_and_node_names(home):  # noqa: F811
    inv = write(home, "pair.toml", pair_toml(22))

    def complete(line: str) -> list[str]:
        env = {"_SPARKCLUSTER_COMPLETE": "bash_complete", "COMP_WORDS": line, "COMP_CWORD": str(len(line.split()) - 1)}
        rc, out, err, _ = sparkcluster(home, env=env)
        assert rc == 0, err
        return [x.split(",", 1)[1] for x in out.split()]

    assert complete("sparkcluster up --profile testbed-s") == ["testbed-single", "testbed-standin"]
    assert complete("sparkcluster profile show testbed-p") == ["testbed-pp"]
    assert complete(f"sparkcluster -i {inv} down --node spark-") == ["spark-a", "spark-b"]
    assert complete(f"sparkcluster logs -i {inv} --node spark-b") == ["spark-b"]
    assert "status" in complete("sparkcluster sta")
    readme = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "first-steps.md").read_text()
    assert "_SPARKCLUSTER_COMPLETE=bash_source sparkcluster" in readme


SHAPE = {"ok", "error", "fix", "problems", "exit_code", "details"}  # docs/reference/cli.md


def test_json_on_every_command_that_prints_a_result_with_one_failure_shape(home):  # noqa: F811
    inv = write(home, "pair.toml", pair_toml(closed_port(), "connect_timeout = 1\nconnect_attempts = 1"))
    i = ["-i", str(inv)]
    for argv in (
        ["profile", "list"], ["profile", "lint", "x"], ["init"], ["down"], ["weights", "pull"], ["weights", "rm", "x"],
        ["monitor", "up"], ["monitor", "down"], ["monitor", "status"], ["gateway", "status"], ["rollback"],
    ):  # fmt: skip
        rc, out, err, _ = sparkcluster(home, *argv, "--help")
        assert rc == 0 and "--json" in out, argv
    # results
    rc, out, err, _ = sparkcluster(home, "profile", "list", "--json")
    assert rc == 0 and "testbed" in [p["name"] for p in json.loads(out)["profiles"]], out
    rc, out, err, _ = sparkcluster(home, "profile", "lint", "testbed", "--json", *i)
    body = json.loads(out)
    assert body["profile"] == "testbed" and rc == (0 if body["ok"] else 1) and body["skipped_cluster_rules"] == []
    # failures: one shape on stdout, the exit code the docs promise
    for argv, code in (
        ([*i, "down", "--json"], 4),
        ([*i, "weights", "pull", "--profile", "testbed", "--json"], 4),
        ([*i, "weights", "rm", "org/model", "--yes", "--json"], 4),
        ([*i, "monitor", "up", "--json"], 4),
        (["init", "--head", "spark-a.invalid", "--json", "-o", str(home["dir"] / "n.toml")], 4),
        ([*i, "weights", "rm", "org/model", "--json"], 2),  # --json cannot answer the question
    ):
        rc, out, err, _ = sparkcluster(home, *argv)
        body = json.loads(out)
        assert set(body) == SHAPE and body["ok"] is False and body["exit_code"] == rc == code, (argv, out, err)
    rc, out, err, _ = sparkcluster(home, *i, "monitor", "down", "--json")
    body = json.loads(out)
    assert rc == 4 and body["ok"] is False and {r["state"] for r in body["nodes"]} == {"unreachable"}, out


def test_profile_show_shows_the_published_record_beside_the_profile(home):  # noqa: F811
    rc, out, err, _ = sparkcluster(home, "profile", "show", "testbed")
    assert rc == 0 and "published record: " in out and "testbed.perf.toml" in out, out
    assert "sparkcluster bench --profile testbed --compare published" in out
    rc, out, err, _ = sparkcluster(home, "profile", "show", "testbed", "--json")
    pub = json.loads(out)["published"]
    assert pub["path"].endswith("testbed.perf.toml") and pub["runs"], pub
    rc, out, err, _ = sparkcluster(home, "profile", "show", "testbed-pp")
    assert "published record: none beside this profile" in out, out


def test_a_mistyped_node_name_gets_the_close_one(home):  # noqa: F811
    inv = write(home, "pair.toml", pair_toml(1))
    rc, out, err, _ = sparkcluster(home, "-i", str(inv), "down", "--node", "sprak-b", "--json")
    body = json.loads(out)
    assert rc == 2 and "did you mean 'spark-b'?" in body["error"], body
    assert body["fix"] == f"sparkcluster -i {inv} down --node spark-b --json", body
