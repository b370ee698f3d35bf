"""The checks issue 17 added, on a pair cabled as owners have it: one cable on port 1 (its twins
ACTIVE on separate /24s, port 0's twins admin-down without addresses, their HCAs `1: DOWN`)."""

from __future__ import annotations

import dataclasses

from conftest import LINKS, cap, link_ip
from test_checks import H, W, _addr, healthy, results

from sparkcluster import checks, facts
from sparkcluster.config import profile as profiles
from sparkcluster.facts import parsers

PORT1 = [link for link in LINKS if link[0].endswith("np1")]  # enp1s0f1np1, enP2p1s0f1np1
PORT0 = [link for link in LINKS if link[0].endswith("np0")]


def one_cable():
    s = healthy()
    for n in s.inv["nodes"]:
        n["data_plane"] = [{"netdev": nd, "hca": hca} for nd, hca, _ in PORT1]
    for f in s.facts.values():
        for nd, hca, _ in PORT0:
            i = f.interfaces[nd]
            i.up, i.lower_up, i.operstate, i.addresses, i.carrier, i.speed_mbps = False, False, "DOWN", [], False, None
            f.hcas[hca] = dataclasses.replace(f.hcas[hca], state="1: DOWN")
            f.gids[hca] = [g for g in f.gids[hca] if g.ipv4 is None]
        f.path_mtu = [p for p in f.path_mtu if p.netdev in {nd for nd, _, _ in PORT1}]
        s.set_env(f.node, "NCCL_IB_HCA", ",".join(hca for _, hca, _ in PORT1))  # what up started it with
    return s


def test_one_cable_healthy_is_all_ok():
    got = results(one_cable())
    assert [r for r in got.values() if r.status != "ok"] == []
    assert got[("rdma.gid", W)].detail == "index 3 on rocep1s0f1, roceP2p1s0f1"


def test_path_mtu_reports_every_failing_probe_even_after_a_passing_one():
    s = healthy()
    pings = s.facts[W].path_mtu
    first = pings[0]
    tl = parsers.ping_reason(cap("vm-ping-eth0-1472-toolarge.txt"))
    # two probes out of one netdev: a failing one, then a passing one to a second peer address
    s.facts[W].path_mtu = [
        dataclasses.replace(first, ok=False, detail=tl),
        dataclasses.replace(first, peer_ip="198.19.1.9"),
        dataclasses.replace(pings[2], ok=False, detail=""),
    ]
    r = results(s)[("net.path_mtu", W)]
    assert r.status == "fail"
    assert r.detail.startswith("2 of 3 probe(s)")
    assert f"{first.netdev} -> {H} {first.peer_ip}" in r.detail and "mtu=1400" in r.detail
    assert f"{pings[2].netdev} -> {H} {pings[2].peer_ip}" in r.detail and "no reply" in r.detail
    assert results(s)[("net.path_mtu", H)].status == "ok"


def test_twins_on_one_subnet_names_both_and_the_fix():
    s = one_cable()
    # eugr/spark-vllm-docker#270: both twins of port 1 on 198.19.2.0/24
    s.facts[W].interfaces["enP2p1s0f1np1"].addresses = [_addr("198.19.2.3", 24)]
    r = results(s)[("net.twins", W)]
    assert r.status == "fail"
    assert "enp1s0f1np1 and enP2p1s0f1np1 (twins of one port) share 198.19.2.0/24" in r.detail
    assert "its own subnet" in r.fix


def test_link_local_twins_state_the_real_risk():
    s = one_cable()
    for nd, _, _ in PORT1:
        s.facts[W].interfaces[nd].addresses.append(_addr(f"169.254.{len(nd)}.7", 16))
    r = results(s)[("net.twins", W)]
    assert r.status == "fail" and "169.254.0.0/16: link-local" in r.detail and "each boot" in r.detail


def test_control_link_local_message_is_accurate():
    s = healthy()
    s.node(W)["control_ip"] = "169.254.33.2"
    s.facts[W].interfaces["enp1s0f1np1"].addresses.append(_addr("169.254.33.2", 16))
    r = results(s)[("net.control_ip", W)]
    assert r.status == "fail"
    assert "chosen anew at each boot" in r.detail and "169.254.0.0/16 route" in r.detail
    assert "cannot use" not in r.detail  # the old message claimed the address is unusable: it is not


def test_twin_up_without_ipv4_names_the_hca():
    s = one_cable()
    s.facts[W].interfaces["enP2p1s0f1np1"].addresses = []
    s.facts[W].gids["roceP2p1s0f1"] = [g for g in s.facts[W].gids["roceP2p1s0f1"] if g.ipv4 is None]
    r = results(s)[("rdma.gid", W)]
    assert r.status == "fail"
    assert r.detail.startswith("roceP2p1s0f1: its netdev enP2p1s0f1np1 is up without an IPv4 address")
    assert results(s)[("rdma.gid", H)].status == "ok"


def test_an_old_inventorys_gid_index_is_never_exported_and_warns():
    """issue 35: a GID index pinned at init goes stale when the table moves (tonyd2wild #38); NCCL
    >= 2.21 finds each HCA's RoCE v2 IPv4 GID itself, so the containers get none."""
    s = one_cable()
    for n in s.inv["nodes"]:
        n["gid_index"] = 3
    ctx = s.ctx()
    assert "NCCL_IB_GID_INDEX" not in profiles.per_host_env(None, ctx.inventory, W)
    got = {(r.id, r.node): r for r in checks.run_checks(ctx, only={"rdma.gid"})}
    assert got[("rdma.gid", W)].status == "warn" and "remove gid_index" in got[("rdma.gid", W)].fix
    assert "ignored" in got[("rdma.gid", W)].detail


def test_gid_index_differs_between_nodes_or_moves_and_nothing_is_pinned():
    # issue 24: index 3 on the head, 5 on the worker (an IPv6 address came first there); issue 35: a
    # table that moved between two `up`s. Every HCA still has its RoCE v2 IPv4 GID: ok, and no container
    # is told an index (the name stays out of what vLLM copies from the driver, in case one is set)
    s = one_cable()
    s.facts[W].gids = {
        h: [dataclasses.replace(g, index=g.index + 2) if g.ipv4 else g for g in gs] for h, gs in s.facts[W].gids.items()
    }
    got = results(s)
    assert got[("rdma.gid", W)].status == "ok" and got[("rdma.gid", W)].detail.startswith("index 5 on ")
    assert got[("rdma.gid", H)].status == "ok" and got[("rdma.gid", H)].detail.startswith("index 3 on ")
    ctx = s.ctx()
    assert all("NCCL_IB_GID_INDEX" not in profiles.per_host_env(None, ctx.inventory, n) for n in (H, W))
    assert "NCCL_IB_GID_INDEX" in profiles.non_carry_over_vars(None)


def test_degraded_rail_warns_naming_it():
    s = one_cable()
    s.facts[H].interfaces["enP2p1s0f1np1"].speed_mbps = 100000
    got = results(s)
    r = got[("net.speed", H)]
    assert r.status == "warn" and "rail roceP2p1s0f1/enP2p1s0f1np1 at 100 Gb/s" in r.detail
    assert got[("net.speed", W)].status == "ok"


def test_hca_down_shows_all_four_states_and_the_other_port():
    # the worker's cable sits in port 0 while the inventory lists port 1
    s = one_cable()
    f = s.facts[W]
    for _nd, hca, _ in PORT1:
        f.hcas[hca] = dataclasses.replace(f.hcas[hca], state="1: DOWN")
    for _nd, hca, _ in PORT0:
        f.hcas[hca] = dataclasses.replace(f.hcas[hca], state="4: ACTIVE")
    r = results(s)[("rdma.hca", W)]
    assert r.status == "fail"
    for _, hca, _ in LINKS:
        assert hca in r.detail
    assert "rocep1s0f0->enp1s0f0np0 4: ACTIVE" in r.detail and "rocep1s0f1->enp1s0f1np1 1: DOWN" in r.detail
    assert "cable sits in the other port (rocep1s0f0, roceP2p1s0f0 ACTIVE" in r.detail
    assert "move the cable" in r.fix
    assert results(s)[("rdma.hca", H)].status == "ok"


def test_owner_published_ibstat_one_cable_in_port_0():
    # real: geerlingguy/sbc-reviews#92, ibstat on a Dell Pro Max GB10 (cable in port 0)
    states = parsers.ibstat_states(cap("gb10-ibstat-one-cable.txt"))
    assert states == {"roceP2p1s0f0": "4: ACTIVE", "roceP2p1s0f1": "1: DOWN", "rocep1s0f0": "4: ACTIVE"}
    s = one_cable()  # the inventory lists port 1's HCAs
    f = s.facts[W]
    for hca, state in states.items():
        f.hcas[hca] = dataclasses.replace(f.hcas[hca], state=state)
    r = results(s)[("rdma.hca", W)]
    assert r.status == "fail" and "roceP2p1s0f1 port 1 is '1: DOWN'" in r.detail
    assert "roceP2p1s0f0 ACTIVE" in r.detail


def test_third_machine_on_a_spare_port_is_flagged_on_its_node_only():
    s = one_cable()
    i = s.facts[H].interfaces["enp1s0f0np0"]  # head's port 0, cabled to a third machine (eugr#40)
    i.up, i.lower_up, i.carrier, i.operstate = True, True, True, "UP"
    i.addresses = [_addr("10.77.0.1", 24)]
    got = results(s)
    r = got[("net.peer", H)]
    assert r.status == "warn" and "enp1s0f0np0 (10.77.0.0/24)" in r.detail
    assert got[("net.peer", W)].status == "ok"


def test_third_machine_answering_on_a_data_plane_link_fails_there():
    s = one_cable()
    k = next(i for i, p in enumerate(s.facts[H].path_mtu) if p.netdev == "enP2p1s0f1np1")
    s.facts[H].path_mtu[k] = dataclasses.replace(s.facts[H].path_mtu[k], peer_mac="b8:ce:f6:01:02:03")
    got = results(s)
    assert got[("net.peer", H)].status == "fail" and "b8:ce:f6:01:02:03" in got[("net.peer", H)].detail
    assert got[("net.peer", W)].status == "ok"


def test_default_route_on_a_cx7_port_warns():
    s = one_cable()
    s.facts[H].default_routes = ["enP2p1s0f1np1"]
    got = results(s)
    assert got[("net.default_route", H)].status == "warn" and "enP2p1s0f1np1" in got[("net.default_route", H)].detail
    assert got[("net.default_route", W)].status == "ok"


def test_probes_pair_each_twin_with_its_peer_twin():
    s = one_cable()
    inv = s.ctx().inventory
    got = {(p.netdev, p.peer_ip) for p in facts.path_mtu_probes(inv.node(W), s.facts)}
    assert got == {(nd, link_ip(k, 1)) for nd, _, k in PORT1}


def test_path_mtu_probes_that_could_not_run_fail_with_their_output_on_that_node_only():
    """Issue 23: a failed path-MTU probe is never dropped (it used to read as a skip with no reason)."""
    s = healthy()
    s.facts[W].path_mtu, s.facts[W].path_mtu_error = [], "spark-worker: command timed out after 20s: ping -M do ..."
    got = results(s)
    r = got[("net.path_mtu", W)]
    assert r.status == "fail" and "did not run: spark-worker: command timed out after 20s" in r.detail and r.fix
    assert got[("net.path_mtu", H)].status == "ok"


def test_path_mtu_with_nothing_to_probe_skips_with_a_reason():
    s = healthy()
    s.facts[W].path_mtu = []
    r = results(s)[("net.path_mtu", W)]
    assert r.status == "skip" and "nothing to probe" in r.detail
