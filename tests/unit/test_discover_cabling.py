"""`init` on every cabling mode the testbed has (issue 17): the draft it writes loads, lists the
ports NCCL can use, pairs them by position, and says why it left the others out."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import LINKS, cap, gid_text, hca_text, link_ip, spark_ip_json

from sparkcluster.errors import SparkError
from sparkcluster.facts import discover, probes

PORT1 = [link for link in LINKS if link[0].endswith("np1")]
PORT0 = [link for link in LINKS if link[0].endswith("np0")]


def _ip_json(host: int, addressed, down=(), addrs=None) -> str:
    """A Spark's `ip -j addr`: every CX7 netdev present; `addressed` links carry 198.19.k.host/24
    (or what `addrs` gives per netdev), `down` ones are admin-down without an address."""
    data = json.loads(spark_ip_json(host, LINKS))
    for d in data:
        nd = d["ifname"]
        if nd not in {x[0] for x in LINKS}:
            continue
        keep = [a for a in d["addr_info"] if a["family"] == "inet6"]
        if addrs and nd in addrs:
            keep += [{"family": "inet", "local": ip, "prefixlen": p, "scope": "global"} for ip, p in addrs[nd]]
        elif nd in {x[0] for x in addressed}:
            keep = d["addr_info"]
        d["addr_info"] = keep
        if nd in {x[0] for x in down}:
            d["flags"], d["operstate"] = ["BROADCAST", "MULTICAST"], "DOWN"
    return json.dumps(data)


def _hcas(active) -> str:
    names = {x[1] for x in active}
    return "".join(hca_text([x], "4: ACTIVE" if x[1] in names else "1: DOWN") for x in LINKS)


def out(hostname: str, host: int, active, addressed=None, addrs=None) -> str:
    addressed = active if addressed is None else addressed
    down = [x for x in LINKS if x not in active]
    gids = gid_text(host, [x for x in addressed])
    return "".join(
        f"{probes.SECTION} {n}\n{o}\n{probes.SECTION} {n} rc={r}\n"
        for n, r, o in [
            ("hostname", 0, hostname),
            ("gpu", 0, cap("gb10-nvidia-smi.csv").strip()),
            ("ip", 0, _ip_json(host, addressed, down, addrs)),
            ("hca", 0, _hcas(active)),
            ("gids", 0, gids),
        ]
    )


def pair(active, addressed=None, worker_addressed=None, addrs=None, worker_addrs=None):
    h = discover.parse_discovery("spark-head", out("spark-head", 1, active, addressed, addrs))
    w = discover.parse_discovery(
        "root@spark-worker",
        out("spark-worker", 2, active, addressed if worker_addressed is None else worker_addressed, worker_addrs),
    )
    return [h, w]


def render(found):
    return discover.render(discover.draft("pair", found), source="draft.toml")


def test_one_cable_on_port_1():
    text, inv = render(pair(PORT1))
    for n, host in zip(inv.nodes, (1, 2)):
        assert [(x.hca, x.netdev) for x in n.data_plane] == [
            ("rocep1s0f1", "enp1s0f1np1"),
            ("roceP2p1s0f1", "enP2p1s0f1np1"),
        ]
        assert (n.control_if, str(n.control_ip)) == ("enp1s0f1np1", link_ip(2, host))
        assert n.gid_index is None  # never drafted: NCCL picks the GID index at every start
    # port 0's HCAs are DOWN: left out, and the draft says so
    assert "rocep1s0f0 on enp1s0f0np0: port is '1: DOWN', not ACTIVE: left out (cable?)" in text
    assert "gid_index =" not in text


def test_two_cables():
    _, inv = render(pair(LINKS))
    for n in inv.nodes:
        assert n.hcas == ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"]


def test_a_twin_without_ipv4_is_left_out_on_both_nodes_with_the_reason():
    twin = [("enp1s0f1np1", "rocep1s0f1", 2)]  # enP2p1s0f1np1 is up but has no IPv4, on both nodes
    text, inv = render(pair(PORT1, addressed=twin))
    for n in inv.nodes:
        assert n.netdevs == ["enp1s0f1np1"]
    assert "roceP2p1s0f1 on enP2p1s0f1np1: up without an IPv4 address: left out" in text


def test_a_twin_addressed_on_one_node_only_is_left_out_on_both():
    twin = [("enp1s0f1np1", "rocep1s0f1", 2)]
    text, inv = render(pair(PORT1, worker_addressed=twin))
    # NCCL pairs HCAs by position: a rail exists only when both ends have an address on its subnet
    assert [n.netdevs for n in inv.nodes] == [["enp1s0f1np1"], ["enp1s0f1np1"]]
    assert "roceP2p1s0f1 on enP2p1s0f1np1: 198.19.4.0/24 is on no other host: left out" in text


def test_twins_on_one_subnet_keep_one_and_say_why():
    addrs = {"enp1s0f1np1": [("198.19.2.1", 24)], "enP2p1s0f1np1": [("198.19.2.3", 24)]}
    waddrs = {"enp1s0f1np1": [("198.19.2.2", 24)], "enP2p1s0f1np1": [("198.19.2.4", 24)]}
    text, inv = render(pair(PORT1, addrs=addrs, worker_addrs=waddrs))
    assert [n.netdevs for n in inv.nodes] == [["enp1s0f1np1"], ["enp1s0f1np1"]]
    assert "shares 198.19.2.0/24 with enp1s0f1np1: left out" in text and "eugr/spark-vllm-docker#270" in text


def test_link_local_only_says_what_it_found_and_why_it_proposes_static():
    addrs = {"enp1s0f1np1": [("169.254.41.7", 16)], "enP2p1s0f1np1": [("169.254.200.9", 16)]}
    waddrs = {"enp1s0f1np1": [("169.254.3.30", 16)], "enP2p1s0f1np1": [("169.254.77.1", 16)]}
    with pytest.raises(SparkError) as e:
        render(pair(PORT1, addrs=addrs, worker_addrs=waddrs))
    msg = e.value.message
    assert "spark-head: enp1s0f1np1 169.254.41.7/16, enP2p1s0f1np1 169.254.200.9/16" in msg
    assert "root@spark-worker: enp1s0f1np1 169.254.3.30/16" in msg
    assert "anew at each boot" in msg and "169.254.0.0/16 route" in msg
    assert "enp1s0f1np1 198.19.1.N/24, enP2p1s0f1np1 198.19.2.N/24" in e.value.fix


def test_link_local_twin_beside_a_static_one_is_noted_not_dropped_silently():
    addrs = {"enp1s0f1np1": [("198.19.2.1", 24)], "enP2p1s0f1np1": [("169.254.200.9", 16)]}
    waddrs = {"enp1s0f1np1": [("198.19.2.2", 24)], "enP2p1s0f1np1": [("169.254.77.1", 16)]}
    text, inv = render(pair(PORT1, addrs=addrs, worker_addrs=waddrs))
    assert [n.netdevs for n in inv.nodes] == [["enp1s0f1np1"], ["enp1s0f1np1"]]
    assert "roceP2p1s0f1 on enP2p1s0f1np1: only link-local 169.254.200.9/16: left out" in text


def test_an_hca_without_a_v4_roce_gid_is_noted_on_its_node():
    f = pair(PORT1)
    f[1].gids = {h: [g for g in gs if g.index != 3] for h, gs in f[1].gids.items()}  # only the v1 IPv4 GID
    text, inv = render(f)
    assert [n.gid_index for n in inv.nodes] == [None, None]
    assert text.count("has no RoCE v2 IPv4 GID yet") == 1


def test_no_gid_index_is_drafted_where_the_nodes_differ_either():
    # issue 24's 3 on the head and 5 on the worker, and issue 35's drift: NCCL finds it at each start
    f = pair(PORT1)
    f[1].gids = {
        h: [dataclasses.replace(g, index=g.index + 2) if g.ipv4 else g for g in gs] for h, gs in f[1].gids.items()
    }
    text, inv = render(f)
    assert [n.gid_index for n in inv.nodes] == [None, None]
    assert "gid_index =" not in text and "has no RoCE v2 IPv4 GID" not in text
