"""Three to eight Sparks (issue 27): the cabling told from the data-plane subnets (config/topology),
and `init`'s draft for a switch, a mesh and a ring, from what each host's probes print."""

from __future__ import annotations

import ipaddress

import pytest
from test_discover_cabling import LINKS, out

from sparkcluster.config import inventory, topology
from sparkcluster.errors import SparkError
from sparkcluster.facts import discover

N = ipaddress.IPv4Network
R1, R2, C_AB, C_BC, C_CD, C_DA, C_AC, C_BD = (N(f"198.19.{k}.0/24") for k in (1, 2, 10, 11, 12, 13, 14, 15))


def test_one_node_is_single():
    assert topology.classify({"a": []}).kind == "single"


def test_a_pair_is_direct():
    t = topology.classify({"a": [R1, R2], "b": [R1, R2]})
    assert t.kind == "direct" and t.neighbours("a") == ["b"]


def test_every_rail_on_every_node_is_a_switch():
    t = topology.classify({n: [R1, R2] for n in "abcd"})
    assert t.kind == "switch" and t.neighbours("c") == ["a", "b", "d"] and "2 rail(s)" in t.why


def test_three_nodes_cabled_pairwise_are_a_mesh():
    t = topology.classify({"a": [C_AB, C_AC], "b": [C_AB, C_BC], "c": [C_BC, C_AC]})
    assert t.kind == "mesh"


def test_a_ring_is_ordered_along_its_cables():
    # listed a, c, b, d; cabled a-b, b-c, c-d, d-a
    t = topology.classify({"a": [C_AB, C_DA], "c": [C_BC, C_CD], "b": [C_AB, C_BC], "d": [C_CD, C_DA]})
    assert t.kind == "ring" and t.order in (("a", "b", "c", "d"), ("a", "d", "c", "b"))
    assert t.neighbours("a") == sorted(["b", "d"], key=t.order.index)


def test_twins_of_one_cable_are_one_neighbour():
    # each QSFP port is two netdevs (twins), each on a subnet of its own: one cable, two subnets
    nets = {k: (N(f"198.19.{2 * k}.0/24"), N(f"198.19.{2 * k + 1}.0/24")) for k in range(4)}
    rails = {"a": [*nets[0], *nets[3]], "b": [*nets[0], *nets[1]], "c": [*nets[1], *nets[2]], "d": [*nets[2], *nets[3]]}
    t = topology.classify(rails)
    assert t.kind == "ring" and len(t.cables) == 8


@pytest.mark.parametrize(
    "rails, words",
    [
        ({"a": [C_AB], "b": [C_AB], "c": [R1]}, "c share(s) no data-plane subnet"),
        ({"a": [C_AB, C_AC], "b": [C_AB, C_BC], "c": [C_BC]}, "a-c share no cable"),
        ({"a": [R1, C_AB], "b": [R1, C_AB], "c": [R1]}, "reaches a, b only"),
        ({"a": [C_AB, C_DA], "b": [C_AB], "c": [C_CD], "d": [C_CD, C_DA]}, "b has 1 neighbour(s)"),
        ({n: [C_AB] for n in "ab"} | {n: [C_CD] for n in "cd"}, "each node cabled to two others"),
        ({"a": [], "b": []}, "not cabled to each other"),
    ],
)
def test_cablings_that_fit_nothing_say_which_node_and_how(rails, words):
    with pytest.raises(topology.Miscabled) as e:
        topology.classify(rails)
    assert words in str(e.value)


def test_two_loops_are_not_one_ring():
    nets = [N(f"198.19.{k}.0/24") for k in range(20, 26)]
    # a-b-c-a and d-e-f-d: each node has two neighbours, yet no single ring
    rails = {
        "a": [nets[0], nets[2]],
        "b": [nets[0], nets[1]],
        "c": [nets[1], nets[2]],
        "d": [nets[3], nets[5]],
        "e": [nets[3], nets[4]],
        "f": [nets[4], nets[5]],
    }
    with pytest.raises(topology.Miscabled, match="more than one loop"):
        topology.classify(rails)


def test_a_ring_gets_rings_only_a_mesh_the_point_to_point_variables_every_topology_subnet_routing():
    p2p = {"NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_IB_MERGE_NICS": "0", "NCCL_NET_PLUGIN": "none"}
    assert topology.nccl_env("mesh") == p2p
    assert topology.nccl_env("ring") == {**p2p, "NCCL_ALGO": "Ring"}
    every = {"NCCL_IB_SUBNET_AWARE_ROUTING": "1"}  # as NVIDIA's spark_cluster_setup.py exports it
    assert topology.nccl_env("switch") == topology.nccl_env("direct") == topology.nccl_env(None) == every


@pytest.mark.parametrize(
    "kind, n, ok",
    [
        ("direct", 2, True),
        ("direct", 3, False),
        ("mesh", 3, True),
        ("ring", 3, False),
        ("ring", 8, True),
        ("switch", 5, True),
    ],
)
def test_the_inventory_refuses_a_topology_its_node_count_cannot_have(kind, n, ok):
    assert (topology.nodes_allowed(kind, n) is None) == ok


# --- init on N hosts -----------------------------------------------------------------------------

PORT0, PORT1 = LINKS[0], LINKS[1]  # enp1s0f0np0, enp1s0f1np1


def _host(i: int, addrs=None, active=(PORT0, PORT1)):
    return discover.parse_discovery(f"spark-{i}", out(f"spark-{i}", i, list(active), addrs=addrs))


def test_init_drafts_four_through_a_switch():
    found = [_host(i) for i in range(1, 5)]
    text, inv = discover.render(discover.draft("four", found), source="draft.toml")
    assert inv.cluster.topology == "switch" and [n.name for n in inv.nodes] == [f"spark-{i}" for i in range(1, 5)]
    assert "# cabling: switch, from the data-plane subnets: 2 rail(s) reaching every node" in text
    assert {n.control_if for n in inv.nodes} == {"enp1s0f0np0"}  # a rail every node has


def test_init_drafts_a_ring_in_cable_order_with_the_lan_as_control():
    # cabled 1-2, 2-3, 3-4, 4-1; port 0 to the next node, port 1 to the previous; given as 1, 3, 2, 4
    def addrs(i):
        nxt, prev = i % 4 + 1, (i - 2) % 4 + 1
        return {
            PORT0[0]: [(f"198.19.{10 + min(i, nxt)}{max(i, nxt)}.{i}", 24)],
            PORT1[0]: [(f"198.19.{10 + min(i, prev)}{max(i, prev)}.{i}", 24)],
        }

    found = [_host(i, addrs(i)) for i in (1, 3, 2, 4)]
    text, inv = discover.render(discover.draft("ring", found), source="draft.toml")
    assert inv.cluster.topology == "ring"
    assert [n.name for n in inv.nodes] in (
        ["spark-1", "spark-2", "spark-3", "spark-4"],
        ["spark-1", "spark-4", "spark-3", "spark-2"],
    )
    assert inv.nodes[0].role == "head" and all(n.role == "worker" for n in inv.nodes[1:])
    # no data-plane subnet reaches every node: the 10 GbE LAN carries Ray's and vLLM's control traffic
    assert {n.control_if for n in inv.nodes} == {"enP7s7"}
    assert all(len(n.data_plane) == 2 for n in inv.nodes)
    assert "one loop" in text


def test_init_refuses_a_half_ring_naming_the_node():
    def addrs(i):  # 1-2, 2-3, 3-4 cabled; 4-1 not
        a = {}
        if i < 4:
            a[PORT0[0]] = [(f"198.19.{20 + i}.{i}", 24)]
        if i > 1:
            a[PORT1[0]] = [(f"198.19.{19 + i}.{i}", 24)]
        return a

    with pytest.raises(SparkError) as e:
        discover.draft("half", [_host(i, addrs(i)) for i in range(1, 5)])
    assert "spark-1 has 1 neighbour(s) (spark-2)" in str(e.value) and "ring" in e.value.fix


def test_nine_nodes_are_refused():
    text = "[cluster]\nname='x'\n" + "".join(
        f"[[nodes]]\nname='n{i}'\nrole='{'head' if i == 0 else 'worker'}'\nssh='n{i}'\ncontrol_if='e'\n"
        f"control_ip='10.0.0.{i + 1}'\ndata_plane=[{{netdev='e', hca='h'}}]\n"
        for i in range(9)
    )
    with pytest.raises(Exception) as e:
        inventory.parse(text)
    assert "nodes" in str(getattr(e.value, "details", e.value))


# --- doctor across four nodes: each cabling healthy, then broken on one node ---------------------

from sparkcluster import checks, facts  # noqa: E402
from sparkcluster.facts import parsers  # noqa: E402


def _four(kind: str, addrs) -> tuple[inventory.Inventory, dict[str, facts.HostFacts]]:
    names = [f"spark-{i}" for i in range(1, 5)]
    inv = inventory.Inventory.model_validate(
        {
            "cluster": {"name": "four", "topology": kind},
            "nodes": [
                {
                    "name": n,
                    "role": "head" if i == 1 else "worker",
                    "ssh": n,
                    "control_if": "enP7s7",
                    "control_ip": f"192.168.1.{10 + i}",
                    "data_plane": [{"netdev": PORT0[0], "hca": PORT0[1]}, {"netdev": PORT1[0], "hca": PORT1[1]}],
                }
                for i, n in zip(range(1, 5), names)
            ],
        }
    )
    found = {}
    for i, n in zip(range(1, 5), names):
        d = _host(i, addrs(i))
        f = facts.HostFacts(node=n, hostname=n)
        f.interfaces = d.interfaces
        found[n] = f
    return inv, found


def _switch(i):
    return None  # the conftest's Spark: 198.19.k.i/24 on every port, a rail per port


def _ring(i):
    nxt, prev = i % 4 + 1, (i - 2) % 4 + 1
    return {
        PORT0[0]: [(f"198.19.{10 + min(i, nxt)}{max(i, nxt)}.{i}", 24)],
        PORT1[0]: [(f"198.19.{10 + min(i, prev)}{max(i, prev)}.{i}", 24)],
    }


def _doctor(inv, found, env=None):
    for n, f in found.items():
        f.ours = (
            [
                parsers.container_inspect(
                    {
                        "Config": {
                            "Labels": {"org.sparkcluster.cluster": "four"},
                            "Env": [f"{k}={v}" for k, v in (env or {}).get(n, {}).items()],
                        },
                        "State": {"Running": True},
                    }
                )
            ]
            if env
            else []
        )
    ctx = checks.Context(inv, found, {}, checks.Expect())
    return {(r.id, r.node): r for r in checks.run_checks(ctx, only={"net.topology", "nccl.topology_env"})}


@pytest.mark.parametrize("kind, addrs", [("switch", _switch), ("ring", _ring)])
def test_four_nodes_healthy(kind, addrs):
    got = _doctor(*_four(kind, addrs))
    assert {r.status for r in got.values()} == {"ok"}, got
    if kind == "ring":
        assert got[("net.topology", "spark-1")].detail == "ring: reaches spark-4, spark-2"


def test_switch_rail_on_a_wrong_subnet_fails_that_node_only():
    inv, found = _four("switch", _switch)
    found["spark-3"].interfaces[PORT1[0]].addresses = [
        parsers.Address(ipaddress.IPv4Address("198.19.99.3"), N("198.19.99.0/24"))
    ]
    got = _doctor(inv, found)
    bad = {k: r for k, r in got.items() if r.status != "ok"}
    assert list(bad) == [("net.topology", "spark-3")], bad
    assert "lacks 198.19.2.0/24" in bad[("net.topology", "spark-3")].detail


def test_ring_cable_unaddressed_fails_its_two_ends_only():
    inv, found = _four("ring", _ring)
    found["spark-3"].interfaces[PORT0[0]].addresses = []  # the 3-4 cable, on 3's side
    got = _doctor(inv, found)
    bad = sorted(k for k, r in got.items() if r.status != "ok")
    assert bad == [("net.topology", "spark-3"), ("net.topology", "spark-4")]
    assert "shares no data-plane subnet with spark-4" in got[("net.topology", "spark-3")].detail


def test_inventory_says_switch_where_the_cables_are_a_ring():
    inv, found = _four("ring", _ring)
    inv = inv.model_copy(update={"cluster": inv.cluster.model_copy(update={"topology": None})})
    assert _doctor(inv, found)[("net.topology", "spark-2")].detail.startswith("ring: reaches")
    inv = inv.model_copy(update={"cluster": inv.cluster.model_copy(update={"topology": "switch"})})
    got = _doctor(inv, found)
    assert all(got[("net.topology", n)].status == "fail" for n in found)


def test_ring_container_without_the_point_to_point_variables_fails_there_only():
    inv, found = _four("ring", _ring)
    need = topology.nccl_env("ring")
    env = {n: dict(need) for n in found}
    env["spark-2"].pop("NCCL_IB_SUBNET_AWARE_ROUTING")
    got = _doctor(inv, found, env)
    bad = sorted(k for k, r in got.items() if r.status != "ok")
    assert bad == [("nccl.topology_env", "spark-2")]
    assert "NCCL_IB_SUBNET_AWARE_ROUTING=1" in got[("nccl.topology_env", "spark-2")].detail


def test_a_profile_overriding_a_ring_variable_is_named():
    inv, found = _four("ring", _ring)
    for f in found.values():
        f.ours = []
    ctx = checks.Context(inv, found, {}, checks.Expect(forwarded_env={"NCCL_ALGO": "Tree"}))
    got = {(r.id, r.node): r for r in checks.run_checks(ctx, only={"nccl.topology_env"})}
    assert all(got[("nccl.topology_env", n)].status == "fail" for n in found)
    assert "NCCL_ALGO=Tree" in got[("nccl.topology_env", "spark-1")].detail


def test_merge_nics_on_a_ring_is_an_overridable_default_that_warns():
    """One field report runs TP=4 on a ring with NCCL_IB_MERGE_NICS=1 (tonyd2wild GLM-5.3 TP4 #2): the
    profile's value wins (the container gets it) and doctor WARNs, naming the report."""
    from sparkcluster.config import profile as profiles

    inv, found = _four("ring", _ring)
    need = topology.nccl_env("ring")
    env = {n: {**need, "NCCL_IB_MERGE_NICS": "1"} for n in found}
    _doctor(inv, found, env)  # the running containers carry the override
    ctx = checks.Context(inv, found, {}, checks.Expect(forwarded_env={"NCCL_IB_MERGE_NICS": "1"}))
    got = {(r.id, r.node): r for r in checks.run_checks(ctx, only={"nccl.topology_env"})}
    assert all(got[("nccl.topology_env", n)].status == "warn" for n in found), got
    assert "GLM-5.3 TP4 #2" in got[("nccl.topology_env", "spark-1")].detail
    prof = profiles.load_profile("testbed")
    prof = prof.model_copy(
        update={"env": prof.env.model_copy(update={"forward": {**prof.env.forward, "NCCL_IB_MERGE_NICS": "1"}})}
    )
    assert profiles.container_env(prof, inv, "spark-2")["NCCL_IB_MERGE_NICS"] == "1"


def test_ring_containers_get_the_variables_from_the_topology():
    from sparkcluster.config import profile as profiles

    inv, _ = _four("ring", _ring)
    prof = profiles.load_profile("testbed")
    env = profiles.container_env(prof, inv, "spark-3")
    assert {k: env[k] for k in topology.nccl_env("ring")} == topology.nccl_env("ring")


def test_the_fabric_test_holds_a_ring_to_nvidias_ring_figure_and_a_switch_to_a_pairs():
    from sparkcluster.fabric import judge

    ring, _ = _four("ring", _ring)
    switch = ring.model_copy(update={"cluster": ring.cluster.model_copy(update={"topology": "switch"})})
    assert judge.figures_kind(ring) == "ring" and judge.thresholds(judge.Expectation(True, "ring"))[:2] == (19.38, 10.0)
    # rocep1s0f0 and rocep1s0f1 are the two ports of ONE PCIe half (about 100 Gb/s): not a pair
    assert judge.figures_kind(switch) == "half"


def test_a_rings_ports_are_not_paired_by_position_with_the_heads():
    """rdma.hca's pairing of entry k with the head's entry k holds for a pair or a switch; in a ring
    a worker's port 1 meets the previous node's port 0, and NCCL routes by subnet."""
    inv, found = _four("ring", _ring)
    for f in found.values():
        f.hcas = {
            PORT0[1]: parsers.Hca(PORT0[1], "4: ACTIVE", [PORT0[0]]),
            PORT1[1]: parsers.Hca(PORT1[1], "4: ACTIVE", [PORT1[0]]),
        }
    ctx = checks.Context(inv, found, {}, checks.Expect())
    got = {(r.id, r.node): r for r in checks.run_checks(ctx, only={"rdma.hca"})}
    assert {r.status for r in got.values()} == {"ok"}, got
