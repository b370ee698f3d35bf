"""Unit-test helpers: captured output and a two-Spark cluster in the shapes real commands print.

The pair: spark-head and spark-worker, four ConnectX-7 netdevs each, 198.19.k.1 (head) and
198.19.k.2 (worker) on link k, control plane on enp1s0f1np1.
"""

from __future__ import annotations

import copy
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sparkcluster.config import inventory


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path_factory, monkeypatch):
    """What sparkcluster keeps on the controller (the known-good record, ray_seen, the debug log) goes
    to a folder of the test's own, never the user's ~/.local/state."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


CAPTURED = Path(__file__).resolve().parents[1] / "captured"

# netdev, HCA, subnet index k (198.19.k.0/24)
LINKS = [
    ("enp1s0f0np0", "rocep1s0f0", 1),
    ("enp1s0f1np1", "rocep1s0f1", 2),
    ("enP2p1s0f0np0", "roceP2p1s0f0", 3),
    ("enP2p1s0f1np1", "roceP2p1s0f1", 4),
]
CONTROL_IF = "enp1s0f1np1"
NODES = [("spark-head", "head", 1), ("spark-worker", "worker", 2)]


def cap(name: str) -> str:
    return (CAPTURED / name).read_text()


def link_ip(k: int, host: int) -> str:
    return f"198.19.{k}.{host}"


def control_ip(host: int) -> str:
    return link_ip(dict((n, k) for n, _, k in LINKS)[CONTROL_IF], host)


def inventory_dict() -> dict:
    """The testbed-like inventory as plain data (mutate, then `inventory.Inventory.model_validate`)."""
    return {
        "cluster": {"name": "pair"},
        "nodes": [
            {
                "name": name,
                "role": role,
                "ssh": f"spark@{name}",
                "control_if": CONTROL_IF,
                "control_ip": control_ip(host),
                "mtu": 9000,
                "gpus": 1,
                "data_plane": [{"netdev": nd, "hca": hca} for nd, hca, _ in LINKS],
            }
            for name, role, host in NODES
        ],
    }


# the SSH user on every node, as the facts find it on a Spark: an ordinary account in `docker`
ACCOUNT_HOME, ACCOUNT_OWNER = "/home/spark", "1000:1000"
HF_CACHE = ACCOUNT_HOME + "/.cache/huggingface"


def make_inventory(data: dict | None = None, homes: bool = True) -> inventory.Inventory:
    """The inventory, with the SSH user's home on each node learnt (as gathering facts does)
    unless `homes` is False."""
    inv = inventory.Inventory.model_validate(copy.deepcopy(data or inventory_dict()))
    if homes:
        for n in inv.nodes:
            inv.set_home(n.name, ACCOUNT_HOME, ACCOUNT_OWNER)
    return inv


def _iface(
    index: int, name: str, mtu: int, flags: list[str], operstate: str, mac: str, addrs: list[tuple[str, int]]
) -> dict:
    # the shape `ip -j addr show` prints (see tests/captured/vm-ip-addr.json)
    info = [
        {
            "family": "inet",
            "local": a,
            "prefixlen": p,
            "broadcast": "",
            "scope": "global",
            "label": name,
            "valid_life_time": 4294967295,
            "preferred_life_time": 4294967295,
        }
        for a, p in addrs
    ]
    info.append(
        {
            "family": "inet6",
            "local": f"fe80::{index}",
            "prefixlen": 64,
            "scope": "link",
            "valid_life_time": 4294967295,
            "preferred_life_time": 4294967295,
        }
    )
    return {
        "ifindex": index,
        "ifname": name,
        "flags": flags,
        "mtu": mtu,
        "qdisc": "mq",
        "operstate": operstate,
        "group": "default",
        "txqlen": 1000,
        "link_type": "ether",
        "address": mac,
        "broadcast": "ff:ff:ff:ff:ff:ff",
        "addr_info": info,
    }


def spark_ip_json(host: int, links=None, mtu: int = 9000) -> str:
    """`ip -j addr show` of a Spark: lo, the 10 GbE management port, docker0, four CX-7 netdevs."""
    links = LINKS if links is None else links
    up = ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"]
    out = json.loads(cap("vm-ip-addr.json"))[:1]  # the real lo entry
    out.append(_iface(2, "enP7s7", 1500, up, "UP", f"4c:bb:47:00:00:0{host}", [(f"192.168.1.{10 + host}", 24)]))
    for i, (nd, _hca, k) in enumerate(links):
        out.append(_iface(3 + i, nd, mtu, up, "UP", f"4c:bb:47:2{i}:00:0{host}", [(link_ip(k, host), 24)]))
    out.append(
        _iface(
            9,
            "docker0",
            1500,
            ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"],
            "DOWN",
            "02:42:ac:11:00:01",
            [("172.17.0.1", 16)],
        )
    )
    return json.dumps(out)


def hca_text(links=None, state: str = "4: ACTIVE") -> str:
    """What the probe's hca section prints: `<hca>|<ports/1/state>|<netdevs> `."""
    links = LINKS if links is None else links
    return "".join(f"{hca}|{state}|{nd} \n" for nd, hca, _ in links)


def mapped_gid(ip: str) -> str:
    """The RoCE v2 GID the kernel derives from an IPv4 address (::ffff:a.b.c.d, written out in full)."""
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def gid_text(host: int, links=None) -> str:
    """What the probe's gids section prints for a Spark with one IPv4 address per netdev: the two
    link-local IPv6 GIDs (v1, v2) at 0-1, then the IPv4 ones (v1, v2) at 2-3, as the mlx5 driver orders them."""
    links = LINKS if links is None else links
    out = []
    for i, (nd, hca, k) in enumerate(links):
        ll = f"fe80:0000:0000:0000:4ebb:47ff:fe2{i}:000{host}"
        v4 = mapped_gid(link_ip(k, host))
        out += [
            f"{hca}|0|{ll}|IB/RoCE v1|{nd}",
            f"{hca}|1|{ll}|RoCE v2|{nd}",
            f"{hca}|2|{v4}|IB/RoCE v1|{nd}",
            f"{hca}|3|{v4}|RoCE v2|{nd}",
        ]
    return "\n".join(out) + "\n"


def carrier_text(links=None) -> str:
    links = LINKS if links is None else links
    return "".join(f"{nd} 1 200000\n" for nd, _, _ in links)


# a node-to-node stream's key (programs/framing), as movement/stream hands one to each end on stdin
STREAM_KEY = "5e" * 32


def key_line(key: str = STREAM_KEY) -> bytes:
    return f"{key}\n".encode()


class StderrLines:
    """A local process whose stderr lines a thread collects, so a test can wait for one of them.
    `key`: the stream key written first on its stdin (a pipe then; closed after the key when no
    other stdin was asked for, else left open for the test's bytes)."""

    def __init__(self, argv: list[str], *, stdin=subprocess.DEVNULL, key: str | None = None, **popen):
        more = stdin is not subprocess.DEVNULL
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE if key else stdin, stderr=subprocess.PIPE, **popen)
        if key:
            self.p.stdin.write(key_line(key))
            self.p.stdin.flush()
            if not more:
                self.p.stdin.close()
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        for raw in self.p.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def wait_for(self, prefix: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = [x for x in self.lines if x.startswith(prefix)]
            if hit:
                return hit[0]
            if self.p.poll() is not None and not self._t.is_alive():
                break
            time.sleep(0.01)
        raise AssertionError(f"no {prefix!r} line; stderr {self.lines}, rc {self.p.poll()}")

    def wait(self, timeout: float = 20.0) -> int:
        rc = self.p.wait(timeout)
        self._t.join(5)
        return rc

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(5)


def on_demand_supervisor(tmp_path: Path, monkeypatch, policy: dict, token: str):
    """A head's supervisor handed an on-demand server (issue 36; test_on_demand, test_yield): the node's
    files under `tmp_path`, the deployment's wake token, a desired state whose engine is a sleeping
    process, and the journal in `tmp_path / "journal"`. The caller stubs its node memory."""
    import sys

    from sparkcluster.node import supervisor
    from sparkcluster.node.journal import Journal

    for name in ("SERVE_LOG", "RECORD_PATH", "STATE_PATH", "SECRETS_PATH", "DESIRED_PATH", "WAKE_PATH"):
        monkeypatch.setattr(supervisor, name, str(tmp_path / name.lower()))
    Path(supervisor.WAKE_PATH).write_text(token + "\n")
    desired = {
        "generation": "g1",
        "argv": [sys.executable, "-c", "import time; time.sleep(60)"],
        "model": "m",
        "port": 1,
        "policy": policy,
    }
    Path(supervisor.DESIRED_PATH).write_text(json.dumps(desired))
    return supervisor.Supervisor({"node": "spark-head", "nodes": [], "peers": []}, Journal(str(tmp_path / "journal")))
