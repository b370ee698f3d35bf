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


@pytest.mark.parametrize("rails, words", [
    ({"a": [C_AB], "b": [C_AB], "c": [R1]}, "c share(s) no data-plane subnet"),
    ({"a": [C_AB, C_AC], "b": [C_AB, C_BC], "c": [C_BC]}, "a-c share no cable"),
    ({"a": [R1, C_AB], "b": [R1, C_AB], "c": [R1]}, "reaches a, b only"),
    ({"a": [C_AB, C_DA], "b": [C_AB], "c": [C_CD], "d": [C_CD, C_DA]}, "b has 1 neighbour(s)"),
    ({n: [C_AB] for n in "ab"} | {n: [C_CD] for n in "cd"}, "each node cabled to two others"),
    ({"a": [], "b": []}, "not cabled to each other"),
])
def test_cablings_that_fit_nothing_say_which_node_and_how(rails, words):
    with pytest.raises(topology.Miscabled) as e:
        topology.classify(rails)
    assert words in str(e.value)


def test_two_loops_are_not_one_ring():
    nets = [N(f"198.19.{k}.0/24") for k in range(20, 26)]
    # a-b-c-a and d-e-f-d: each node has two neighbours, yet no single ring
    rails = {"a": [nets[0], nets[2]], "b": [nets[0], nets[1]], "c": [nets[1], nets[2]],
             "d": [nets[3], nets[5]], "e": [nets[3], nets[4]], "f": [nets[4], nets[5]]}
    with pytest.raises(topology.Miscabled, match="more than one loop"):
        topology.classify(rails)


def test_only_a_ring_or_mesh_gets_the_point_to_point_nccl_variables():
    assert topology.nccl_env("ring") == topology.nccl_env("mesh") == {
        "NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_IB_MERGE_NICS": "0", "NCCL_NET_PLUGIN": "none"}
    assert topology.nccl_env("switch") == topology.nccl_env("direct") == topology.nccl_env(None) == {}


@pytest.mark.parametrize("kind, n, ok", [("direct", 2, True), ("direct", 3, False), ("mesh", 3, True),
                                         ("ring", 3, False), ("ring", 8, True), ("switch", 5, True)])
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
        return {PORT0[0]: [(f"198.19.{10 + min(i, nxt)}{max(i, nxt)}.{i}", 24)],
                PORT1[0]: [(f"198.19.{10 + min(i, prev)}{max(i, prev)}.{i}", 24)]}
    found = [_host(i, addrs(i)) for i in (1, 3, 2, 4)]
    text, inv = discover.render(discover.draft("ring", found), source="draft.toml")
    assert inv.cluster.topology == "ring"
    assert [n.name for n in inv.nodes] in (["spark-1", "spark-2", "spark-3", "spark-4"],
                                           ["spark-1", "spark-4", "spark-3", "spark-2"])
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
        f"control_ip='10.0.0.{i + 1}'\ndata_plane=[{{netdev='e', hca='h'}}]\n" for i in range(9))
    with pytest.raises(Exception) as e:
        inventory.parse(text)
    assert "nodes" in str(getattr(e.value, "details", e.value))
