"""SSH failures named on the host where they happen, loopback only: a ProxyJump hop that does not
resolve (the resolver faked for a `.invalid` name, RFC 6761, so no query leaves this machine), a jump
port where nothing listens, a private sshd in this process (tests/unit/sshd_fake) as a jump host that
refuses to forward, and an IdentityFile that is not there. Each was told as the target's problem, or
retried: the jump's name resolved as "add Host 127.0.0.1", its closed port as "[Errno None] Unable to
connect", a missing key three times over and then "check that spark-a is up"."""

from __future__ import annotations

import socket

import pytest

from sparkcluster.errors import AuthError, ConnectError, HostKeyError
from tests.unit.sshd_fake import keygen, known_line
from tests.unit.test_newcomer import closed_port, connect, one_toml, sshd  # noqa: F401 (fixture)


@pytest.fixture
def no_dns(monkeypatch):
    """`.invalid` names fail as the resolver fails them (EAI_NONAME), without asking one."""
    real = socket.getaddrinfo

    def fake(host, *a, **kw):
        if str(host).endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", fake)


def test_a_proxyjump_that_does_not_resolve_is_the_jump_hosts_problem(tmp_path, no_dns):
    cfg = f"Host spark-a\n  HostName 127.0.0.1\n  Port {closed_port()}\n  ProxyJump bastion.invalid\n"
    with pytest.raises(ConnectError) as e:
        connect(tmp_path, "spark-a", "", cfg)
    msg, fix = e.value.message, e.value.fix
    assert "its ProxyJump host bastion.invalid does not resolve" in msg, msg
    assert "'127.0.0.1' does not resolve" not in msg and "Host 127.0.0.1" not in fix, (msg, fix)
    assert "add `Host bastion.invalid` with its HostName" in fix and "ProxyJump of `Host spark-a`" in fix, fix
    assert "attempt" not in msg  # the resolver has answered: not retried
    # a hop named by its own Host entry, whose HostName does not resolve: both names said
    cfg = (
        f"Host spark-a\n  HostName 127.0.0.1\n  ProxyJump bastion\n"
        f"Host bastion\n  HostName gate.invalid\n  Port {closed_port()}\n"
    )
    with pytest.raises(ConnectError) as e:
        connect(tmp_path, "spark-a", "", cfg)
    assert "its ProxyJump host bastion (HostName gate.invalid) does not resolve" in e.value.message, e.value


def test_a_closed_jump_port_names_the_jump_host_and_its_port(tmp_path):
    port = closed_port()
    cfg = f"Host spark-a\n  HostName 127.0.0.1\n  ProxyJump jumper@127.0.0.1:{port}\n"
    with pytest.raises(ConnectError) as e:
        connect(tmp_path, "spark-a", "", cfg)
    msg, fix = e.value.message, e.value.fix
    assert f"nothing listens on its ProxyJump host jumper@127.0.0.1:{port} at 127.0.0.1:{port}" in msg, msg
    assert "connection refused" in msg and "Errno None" not in msg and "127.0.0.1:22" not in msg, msg
    assert "start sshd on the jump host" in fix and fix.endswith(f"then try: ssh -p {port} jumper@127.0.0.1"), fix
    assert "check that spark-a is up" not in fix


def test_a_jump_host_that_cannot_reach_the_target_says_so(sshd, tmp_path):  # noqa: F811
    """The hop answers and lets us in; it refuses to forward onward (the fake sshd opens no channel):
    the jump host and the address it was asked for are named."""
    key = tmp_path / "id"
    sshd.accept.add(keygen(key).asbytes())
    known = known_line(f"[127.0.0.1]:{sshd.port}", sshd.host_key) + "\n"
    cfg = (
        f"Host spark-a\n  HostName 10.9.8.7\n  Port 2222\n  ProxyJump bastion\n"
        f"Host bastion\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User gate\n  IdentityFile {key}\n"
        "  IdentityAgent none\n"
    )
    with pytest.raises(ConnectError) as e:
        connect(tmp_path, "spark-a", known, cfg)
    msg, fix = e.value.message, e.value.fix
    assert "its ProxyJump host bastion could not open a connection to 10.9.8.7:2222" in msg, msg
    assert "10.9.8.7:2222 is where bastion reaches spark-a's sshd" in fix, fix
    assert f"ssh -p {sshd.port} gate@127.0.0.1, then from there ssh -p 2222 10.9.8.7" in fix, fix
    # the jump host's key unknown: refused as the jump host's, with the keyscan of the jump host
    with pytest.raises(HostKeyError) as e:
        connect(tmp_path, "spark-a", "", cfg)
    assert e.value.message.startswith(f"spark-a: its ProxyJump host bastion: host key for [127.0.0.1]:{sshd.port}")
    assert f"ssh-keyscan -t ed25519 -p {sshd.port} 127.0.0.1 >> " in e.value.fix, e.value.fix


def connect_retrying(tmp_path, target: str, known: str, ssh_config: str):
    """As `connect`, with the three attempts of the inventory's default: what is retried shows."""
    from sparkcluster.config import inventory
    from sparkcluster.remote import ssh

    (tmp_path / "known_hosts").write_text(known)
    (tmp_path / "ssh_config").write_text(ssh_config)
    extra = (
        f'known_hosts = "{tmp_path / "known_hosts"}"\nssh_config = "{tmp_path / "ssh_config"}"\n'
        "connect_timeout = 5\nconnect_attempts = 3\n"
    )
    p = tmp_path / "solo.toml"
    p.write_text(one_toml(target, extra))
    inv = inventory.load(p)
    return ssh.connect(inv.nodes[0], ssh.Settings.from_inventory(inv))


def test_a_missing_identity_file_is_named_and_not_retried(sshd, tmp_path):  # noqa: F811
    missing = tmp_path / "keys" / "id_spark"
    known = known_line(f"[127.0.0.1]:{sshd.port}", sshd.host_key) + "\n"
    only = "  IdentitiesOnly yes\n  IdentityAgent none\n"  # this machine's own keys and agent stay out of it
    cfg = f"Host spark-a\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User spark\n  IdentityFile {missing}\n{only}"
    with pytest.raises(AuthError) as e:
        connect_retrying(tmp_path, "spark-a", known, cfg)
    msg, fix = e.value.message, e.value.fix
    assert f"IdentityFile {missing} does not exist" in msg and "Host spark-a" in msg, msg
    assert "spark@127.0.0.1 accepted no other key" in msg, msg
    assert "attempt" not in msg and "check that spark-a is up" not in fix, msg
    assert f"ssh-keygen -t ed25519 -f {missing} && ssh-copy-id -i {missing} -p {sshd.port} spark@127.0.0.1" in fix
    assert len(sshd._transports) == 1, "one connection: never retried"
    # as OpenSSH does, a missing file is skipped where another key gets in
    good = tmp_path / "id_good"
    sshd.accept.add(keygen(good).asbytes())
    connect_retrying(tmp_path, "spark-a", known, cfg.replace(only, f"  IdentityFile {good}\n{only}")).close()
    # the jump host's own IdentityFile: named as the jump host's
    cfg = (
        f"Host spark-a\n  HostName 127.0.0.1\n  ProxyJump bastion\n"
        f"Host bastion\n  HostName 127.0.0.1\n  Port {sshd.port}\n  IdentityFile {missing}\n{only}"
    )
    with pytest.raises(AuthError) as e:
        connect(tmp_path, "spark-a", known, cfg)
    assert f"its ProxyJump host bastion: IdentityFile {missing} does not exist" in e.value.message, e.value
    assert "under `Host bastion`" in e.value.fix, e.value.fix


def test_a_key_held_by_the_agent_needs_only_its_pub_file(tmp_path):
    """IdentitiesOnly with an agent: OpenSSH offers the agent's copy of the key its .pub names, with
    no private file on disk (a hardware key, a password manager's agent): not a missing key."""
    from sparkcluster.remote.target import SshConnection, load_config

    pub = tmp_path / "id_agent"
    (tmp_path / "id_agent.pub").write_text(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    )
    (tmp_path / "c").write_text(f"Host x\n  IdentityFile {pub}\n  IdentitiesOnly yes\n")
    conn = SshConnection.resolve("x", load_config(tmp_path / "c"), 1.0, lambda c: None)
    assert conn.missing_key() is None
    (tmp_path / "c").write_text(f"Host x\n  IdentityFile {pub}\n  IdentitiesOnly yes\n  IdentityAgent none\n")
    conn = SshConnection.resolve("x", load_config(tmp_path / "c"), 1.0, lambda c: None)
    assert conn.missing_key() == str(pub)
