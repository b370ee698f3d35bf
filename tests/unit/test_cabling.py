"""The testbed's cabling modes as pure functions (tests/testbed/cabling.py): addresses, states, GID
tables and the inventory per mode, and the shell they produce run locally against a fake tree.
Also: what sparkcluster's probes and checks make of each mode's sysfs and addresses."""

from __future__ import annotations

import subprocess

import pytest

from sparkcluster.config import inventory
from sparkcluster.facts import parsers
from sparkcluster.facts.probes import GIDS
from tests.testbed import cabling

H, W = ("spark-head", "head", 1), ("spark-worker", "worker", 2)
NAMES = {"spark-head": list(cabling.NETDEVS), "spark-worker": list(cabling.NETDEVS)}


def inv(mode: cabling.Mode, names=None) -> inventory.Inventory:
    text = "\n".join(["[cluster]", 'name = "testbed"', ""] + cabling.inventory_nodes(mode, [H, W], names or NAMES))
    return inventory.parse(text)


def test_parse_modes():
    assert cabling.parse(None) == cabling.parse("") == cabling.Mode("one-cable", 9000)
    assert cabling.parse("two-cables@9216") == cabling.Mode("two-cables", 9216)
    assert cabling.parse("link-local@1500").spec == "link-local@1500"
    for bad in ("three-cables", "one-cable@9100"):
        with pytest.raises(ValueError):
            cabling.parse(bad)


def test_default_one_cable_on_port_1():
    m = cabling.parse(None)
    assert [cabling.cabled(m, k) for k in range(4)] == [False, True, False, True]
    assert [cabling.addresses(m, k, 1) for k in range(4)] == [[], ["198.19.2.1/24"], [], ["198.19.4.1/24"]]
    assert [cabling.hca_state(m, k)[0] for k in range(4)] == ["1: DOWN", "4: ACTIVE", "1: DOWN", "4: ACTIVE"]
    assert cabling.control(m, 1) == ("enp1s0f1np1", "198.19.2.1") and cabling.control(m, 2) == (
        "enp1s0f1np1",
        "198.19.2.2",
    )
    i = inv(m)
    for n in i.nodes:
        assert [(x.netdev, x.hca) for x in n.data_plane] == [
            ("enp1s0f1np1", "rocep1s0f1"),
            ("enP2p1s0f1np1", "roceP2p1s0f1"),
        ]
        assert n.mtu == 9000


def test_two_cables_is_the_old_testbed():
    m = cabling.parse("two-cables")
    assert [cabling.addresses(m, k, 2) for k in range(4)] == [[f"198.19.{k}.2/24"] for k in range(1, 5)]
    assert inv(m).head.netdevs == list(cabling.NETDEVS)


def test_link_local_one_subnet_and_twin_without_ipv4():
    ll = cabling.parse("link-local")
    assert cabling.addresses(ll, 1, 1) == ["169.254.2.1/16"] and cabling.addresses(ll, 3, 2) == ["169.254.4.2/16"]
    assert str(inv(ll).node("spark-worker").control_ip) == "169.254.2.2"
    one = cabling.parse("one-subnet")
    assert cabling.addresses(one, 1, 1) == ["198.19.2.1/24"] and cabling.addresses(one, 3, 1) == ["198.19.2.3/24"]
    assert cabling.addresses(one, 3, 2) == ["198.19.2.4/24"]
    no4 = cabling.parse("twin-no-ipv4")
    assert cabling.cabled(no4, 3) and cabling.addresses(no4, 3, 1) == []
    assert inv(no4).head.netdevs == ["enp1s0f1np1"]  # what init writes for it


def test_mtu_variants_reach_links_and_inventory():
    m = cabling.parse("one-cable@9216")
    assert inv(m).head.mtu == 9216
    assert "ip link set dev enp1s0f1np1 mtu 9216 up" in cabling.host_commands(m, 1, list(cabling.NETDEVS), {})
    assert "ip link set dev enp1s0f0np0 mtu 9216 down" in cabling.host_commands(m, 1, list(cabling.NETDEVS), {})


def test_gids_as_the_driver_orders_them():
    assert cabling.mapped_gid("198.19.2.1") == "0000:0000:0000:0000:0000:ffff:c613:0201"
    # EUI-64: the universal/local bit flipped, ff:fe in the middle
    assert cabling.link_local_gid("4c:bb:47:21:00:02") == "fe80:0000:0000:0000:4ebb:47ff:fe21:0002"
    rows = cabling.gid_entries("enp1s0f1np1", "4c:bb:47:21:00:02", ["198.19.2.1/24"])
    assert [r[1] for r in rows[:4]] == ["IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"]
    assert rows[3][0] == cabling.mapped_gid("198.19.2.1") and rows[3][2] == "enp1s0f1np1"
    assert rows[4:] == [(cabling.ZERO_GID, None, None)] * (cabling.GID_SLOTS - 4)
    # a twin without IPv4 has no IPv4 GID; a netdev that is down has none at all
    assert all(
        r[0].startswith("fe80") or r[0] == cabling.ZERO_GID for r in cabling.gid_entries("x", "4c:bb:47:21:00:02", [])
    )
    assert {r[0] for r in cabling.gid_entries("x", None, [])} == {cabling.ZERO_GID}


def _run_in(tmp_path, cmds: list[str]) -> None:
    script = " && ".join(cmds).replace("/sys/class/infiniband", f"{tmp_path}/sys/class/infiniband")
    subprocess.run(["bash", "-c", script], check=True, timeout=20)


@pytest.mark.parametrize(
    "spec,want",
    [
        ("one-cable", {"rocep1s0f1": 3, "roceP2p1s0f1": 3}),
        ("two-cables", {"rocep1s0f0": 3, "rocep1s0f1": 3, "roceP2p1s0f0": 3, "roceP2p1s0f1": 3}),
        ("twin-no-ipv4", {"rocep1s0f1": 3}),
        ("link-local", {"rocep1s0f1": 3, "roceP2p1s0f1": 3}),
    ],
)
def test_gid_tables_written_by_the_mode_read_back_by_the_probe(tmp_path, spec, want):
    m = cabling.parse(spec)
    macs = {nd: f"4c:bb:47:2{k}:00:01" for k, nd in enumerate(cabling.NETDEVS)}
    cmds = []
    for k, nd in enumerate(cabling.NETDEVS):
        cmds += cabling.gid_commands(
            cabling.HCA_OF[nd], nd, macs[nd] if cabling.cabled(m, k) else None, cabling.addresses(m, k, 1)
        )
    _run_in(tmp_path, cmds)
    out = subprocess.run(
        ["bash", "-c", GIDS.command.replace("/sys/class/infiniband", f"{tmp_path}/sys/class/infiniband")],
        capture_output=True,
        text=True,
        timeout=20,
    ).stdout
    got = parsers.gid_lines(out)
    v4 = {
        h: min(g.index for g in gs if g.roce_v2 and g.ipv4)
        for h, gs in got.items()
        if any(g.roce_v2 and g.ipv4 for g in gs)
    }
    assert v4 == want
    # the twin without IPv4 still has its link-local GIDs (it is up), but no IPv4 one
    if spec == "twin-no-ipv4":
        assert [g.index for g in got["roceP2p1s0f1"]] == [0, 1]


def test_address_commands_are_idempotent_and_never_flush():
    cmds = cabling.address_commands("enp1s0f1np1", ["198.19.2.1/24"])
    assert not any("flush" in c for c in cmds)
    assert cmds[-1] == "ip addr replace 198.19.2.1/24 dev enp1s0f1np1"


def test_recabled_worker_names_follow_the_link():
    crossed = ["enP2p1s0f0np0", "enP2p1s0f1np1", "enp1s0f0np0", "enp1s0f1np1"]
    i = inv(cabling.parse(None), {**NAMES, "spark-worker": crossed})
    w = i.node("spark-worker")
    # head link 2 (enp1s0f1np1, the control link) ends at the worker's enP2p1s0f1np1
    assert (w.control_if, str(w.control_ip)) == ("enP2p1s0f1np1", "198.19.2.2")
    assert [(x.netdev, x.hca) for x in w.data_plane] == [
        ("enP2p1s0f1np1", "roceP2p1s0f1"),
        ("enp1s0f1np1", "rocep1s0f1"),
    ]
    cmds = cabling.host_commands(cabling.parse(None), 2, crossed, {})
    assert "echo '4: ACTIVE' > /sys/class/infiniband/roceP2p1s0f1/ports/1/state" in cmds
    assert "echo '1: DOWN' > /sys/class/infiniband/rocep1s0f0/ports/1/state" in cmds


def test_third_machine_plug_and_unplug():
    plug = cabling.third_plug_commands("spark-head", "enp1s0f0np0", "spark-worker", "enp1s0f0np0", 9000)
    assert plug[0] == ["ip", "netns", "add", cabling.THIRD_NS]
    assert ["ip", "-n", "spark-head", "addr", "add", f"{cabling.THIRD_NET}.1/24", "dev", "enp1s0f0np0"] in plug
    # the worker's port keeps an interface (no carrier) so its name stays
    assert ["ip", "-n", "spark-worker", "link", "set", "tbtmp-o", "name", "enp1s0f0np0"] in plug
    unplug = cabling.third_unplug_commands("spark-head", "enp1s0f0np0", "spark-worker", "enp1s0f0np0", 9000)
    assert ["ip", "netns", "del", cabling.THIRD_NS] in unplug and unplug[-1][-1] == "enp1s0f0np0"
    assert cabling.rebind_speed([("enp1s0f0np0", "enp1s0f0np0")]).endswith(
        "mount --bind /run/testbed/speed/enp1s0f0np0 /sys/class/net/enp1s0f0np0/speed"
    )


def test_mac_query_round_trip():
    out = subprocess.run(["bash", "-c", cabling.mac_query(["lo"])], capture_output=True, text=True, timeout=10).stdout
    assert cabling.parse_macs(out) == {"lo": "00:00:00:00:00:00"}


def test_an_ipv6_address_first_moves_the_ipv4_gid_to_index_5():
    rows = cabling.gid_entries("enp1s0f1np1", "4c:bb:47:21:00:02", ["198.19.2.2/24"], ("fd00:19::2:2",))
    assert rows[2][0] == "fd00:0019:0000:0000:0000:0000:0002:0002"
    assert [i for i, r in enumerate(rows) if r[1] == "RoCE v2" and r[0] == cabling.mapped_gid("198.19.2.2")] == [5]


def test_ring_of_four_each_cable_a_pair_of_subnets_shared_by_its_two_ends_only():
    """Host i's port 0 twins meet host i+1's port 1 twins (the last meets the first): each subnet on
    exactly two hosts, what config/topology reads as a ring in the hosts' order."""
    import ipaddress

    from sparkcluster.config import topology

    m = cabling.parse("ring")
    rails = {
        o: [ipaddress.ip_interface(a).network for k in range(4) for a in cabling.addresses(m, k, o, 4)]
        for o in (1, 2, 3, 4)
    }
    assert all(len(nets) == 4 for nets in rails.values())
    t = topology.classify({f"h{o}": nets for o, nets in rails.items()})
    assert t.kind == "ring" and t.order == ("h1", "h2", "h3", "h4")
    assert cabling.control(m, 3) == ("lan0", "198.19.200.3")
    assert cabling.data_plane(m) == [0, 1, 2, 3]
