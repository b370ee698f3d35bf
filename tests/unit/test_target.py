"""`remote.target`: a node's `ssh` target resolved through ssh_config as OpenSSH resolves it."""

from pathlib import Path

from sparkcluster.remote.target import SshConnection, load_config, parse_target

CONFIG = """
Host spark-a
  HostName 192.168.1.50
  User owner
  Port 2222
  IdentityFile ~/.ssh/spark_ed25519
  IdentitiesOnly yes
  ProxyJump bastion

Host spark-b
  HostName 192.168.1.51
  ProxyCommand nc %h %p
"""


def _conn(tmp_path: Path, target: str) -> SshConnection:
    (tmp_path / "config").write_text(CONFIG)
    seen = []
    conn = SshConnection.resolve(target, load_config(tmp_path / "config"), 5.0, seen.append)
    assert seen == [conn.client]  # host keys and their policy are set on the client it opens
    return conn


def test_an_alias_takes_hostname_user_port_and_key_from_the_config(tmp_path):
    conn = _conn(tmp_path, "spark-a")
    assert (conn.host, conn.port, conn.user) == ("192.168.1.50", 2222, "owner")
    assert conn.connect_kwargs["key_filename"] == [str(Path("~/.ssh/spark_ed25519").expanduser())]
    assert conn.connect_kwargs["look_for_keys"] is False and conn.connect_kwargs["allow_agent"] is False
    assert conn.options["proxyjump"] == "bastion"


def test_the_inventorys_own_user_and_port_win_over_the_config(tmp_path):
    conn = _conn(tmp_path, "root@spark-a:22")
    assert (conn.host, conn.port, conn.user) == ("192.168.1.50", 22, "root")
    assert parse_target("[fe80::1]:2200") == (None, "fe80::1", 2200)


def test_proxycommand_is_expanded_and_an_unknown_alias_is_its_own_address(tmp_path):
    conn = _conn(tmp_path, "spark-b")
    assert conn.options["proxycommand"] == "nc 192.168.1.51 22"
    plain = _conn(tmp_path, "10.0.0.9")
    assert (plain.host, plain.port) == ("10.0.0.9", 22) and plain._sock() is None
