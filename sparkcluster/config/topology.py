"""How the Sparks are cabled, told from the subnets of their data-plane ports.

Each cable (or each rail through a switch) is a subnet of its own, so which nodes share a subnet
is the cabling: every node on every rail is a switch (or, with two nodes, a direct pair); each
subnet on exactly two nodes is a cable, and the cables of three nodes connecting each pair are a
mesh, those of four or more a ring whose order follows the cables. `init` writes what it found
into `[cluster] topology`; doctor's `net.topology` checks the facts still say so.

Pure: names and networks in, a `Topology` (or a `Miscabled` saying what does not fit) out.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

Kind = Literal["single", "direct", "switch", "mesh", "ring"]
KINDS: tuple[str, ...] = ("single", "direct", "switch", "mesh", "ring")
MAX_NODES = 8

# What NCCL needs of the cabling, in every node's container (the profile's own value wins where a
# variable is overridable; `nccl.topology_env` judges the rest):
# - every topology: route by subnet, as NVIDIA's own `spark_cluster_setup.py` exports it for any
#   cluster of Sparks (dgx-spark-playbooks) -- on a switch or a pair it changes nothing, on
#   point-to-point cables it is what lets a rank reach the neighbour on each cable's own subnet;
# - a ring or mesh (every cable a subnet between two nodes, none reaching every node: sparkrun sets
#   these for its three-node ring, missing, the first collective hangs: sparkrun#174, #208): keep
#   the two ports apart (NCCL_IB_MERGE_NICS=0, a default a profile may override with a WARN: one
#   field report runs TP=4 on a ring with it at 1, tonyd2wild GLM-5.3 TP4 #2) and NCCL's own IB
#   transport rather than a network plugin that expects a flat fabric;
# - a ring of four or more: rings only. NCCL builds trees as well as rings, a tree's edges include
#   the diagonals of the ring, which no cable joins, and their queue pairs time out at setup
#   (eugr spark-vllm-docker docs/NETWORKING.md and cluster_topology.py RING_ENV; MiaAI-Lab
#   DeepSeek-v4.1-Flash-DGX-Sparks PR #3, GLM-5.3 PR #244). A three-node mesh cables every pair,
#   so its trees have their edges: NCCL keeps its own choice there.
EVERY_TOPOLOGY_NCCL_ENV: dict[str, str] = {"NCCL_IB_SUBNET_AWARE_ROUTING": "1"}
POINT_TO_POINT_NCCL_ENV: dict[str, str] = {"NCCL_IB_MERGE_NICS": "0", "NCCL_NET_PLUGIN": "none"}
RING_NCCL_ENV: dict[str, str] = {"NCCL_ALGO": "Ring"}
# the variables above a profile may set otherwise (`nccl.topology_env` WARNs instead of FAILing)
OVERRIDABLE_NCCL: dict[str, str] = {
    "NCCL_IB_MERGE_NICS": "a field report runs a ring of four with NCCL_IB_MERGE_NICS=1 (tonyd2wild GLM-5.3 TP4 #2)"
}
# the largest ring the field has served a model on (TP=4 over four Sparks: the reports above);
# a larger ring is cabled and classified alike, but lint WARNs
FIELD_RING_NODES = 4


def nccl_env(kind: str | None) -> dict[str, str]:
    """The NCCL variables a topology needs in every node's container (the fabric probe's ranks run
    in those containers, so they get the same)."""
    env = dict(EVERY_TOPOLOGY_NCCL_ENV)
    if kind in ("mesh", "ring"):
        env.update(POINT_TO_POINT_NCCL_ENV)
    if kind == "ring":
        env.update(RING_NCCL_ENV)
    return env


def nodes_allowed(kind: str, n: int) -> str | None:
    """Why `n` nodes cannot be cabled as `kind`, or None."""
    need = {"single": (1, 1), "direct": (2, 2), "switch": (2, MAX_NODES), "mesh": (3, 3), "ring": (4, MAX_NODES)}[kind]
    if need[0] <= n <= need[1]:
        return None
    span = str(need[0]) if need[0] == need[1] else f"{need[0]} to {need[1]}"
    return f"a {kind} has {span} nodes, the inventory has {n}"


def subset(kind: str | None, order: list[str], chosen: list[str]) -> str | None:
    """What `chosen` (some nodes of a cluster cabled as `kind`, `order` its nodes in cable order) is
    cabled as on its own: one node is "single"; two nodes of a ring next to each other, or any two of
    a mesh, share one cable: a "direct" pair; all of them are what the whole is. Raises Miscabled for
    a part that no topology serves: two nodes of a ring no cable joins, or a stretch of a ring (a
    chain, whose NCCL ring would close over a pair no cable joins). A switch's part is a switch."""
    if len(chosen) == 1:
        return "single"
    if kind not in ("ring", "mesh") or len(chosen) == len(order):
        return "direct" if kind == "direct" or (kind in ("ring", "mesh") and len(chosen) == 2) else kind
    if kind == "mesh":
        return "direct"  # two of three: every pair of a mesh has its cable
    if len(chosen) == 2:
        i, j = sorted(order.index(n) for n in chosen)
        if j - i == 1 or (i == 0 and j == len(order) - 1):
            return "direct"
        raise Miscabled(
            f"{chosen[0]} and {chosen[1]} are not next to each other in the ring "
            f"({' - '.join(order)} - {order[0]}): no cable joins them"
        )
    raise Miscabled(
        f"{', '.join(chosen)} are {len(chosen)} of the ring's {len(order)} nodes: a stretch of a ring is a chain, "
        "and NCCL's ring over it would close across a pair no cable joins"
    )


@dataclass(frozen=True)
class Cable:
    """One subnet of the data plane and the nodes with an address on it, in node order."""

    network: ipaddress.IPv4Network
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Topology:
    kind: Kind
    order: tuple[str, ...]  # the nodes: inventory order, or the ring's order along its cables
    cables: tuple[Cable, ...]
    why: str  # one line: what was found that makes it this kind

    def neighbours(self, node: str) -> list[str]:
        """The nodes `node` shares a cable (or a rail) with."""
        return sorted({m for c in self.cables if node in c.nodes for m in c.nodes if m != node}, key=self.order.index)


class Miscabled(ValueError):
    """The subnets fit no topology; the message says which node does not fit and how."""


def classify(rails: dict[str, list[ipaddress.IPv4Network]]) -> Topology:
    """`rails`: node -> the subnets of its data-plane ports, nodes in inventory order (head first).
    A subnet on a single node is no cable (init leaves such ports out; net.peer judges them)."""
    names = list(rails)
    where: dict[ipaddress.IPv4Network, list[str]] = {}
    for n in names:
        for net in dict.fromkeys(rails[n]):
            where.setdefault(net, []).append(n)
    cables = tuple(Cable(net, tuple(ns)) for net, ns in where.items() if len(ns) > 1)
    if len(names) == 1:
        return Topology("single", tuple(names), (), "one node: no cables")
    if not cables:
        raise Miscabled(
            "no data-plane subnet is shared by two nodes: the nodes are not cabled to each other "
            "(or their ports have no addresses)"
        )
    lonely = [n for n in names if not any(n in c.nodes for c in cables)]
    if lonely:
        raise Miscabled(f"{', '.join(lonely)} share(s) no data-plane subnet with any other node")
    full = [c for c in cables if len(c.nodes) == len(names)]
    if len(full) == len(cables):
        kind: Kind = "direct" if len(names) == 2 else "switch"
        what = "cable(s) between the two nodes" if kind == "direct" else "rail(s) reaching every node"
        return Topology(kind, tuple(names), cables, f"{len(cables)} {what}: {_nets(cables)}")
    partial = [c for c in cables if 2 < len(c.nodes) < len(names)]
    if full or partial:
        odd = (partial or [c for c in cables if len(c.nodes) == 2])[0]
        raise Miscabled(
            f"{odd.network} reaches {', '.join(odd.nodes)} only, while "
            f"{'other rails reach every node' if full else 'a cable joins two nodes'}: a switch must "
            "reach every node on every rail, a ring or mesh cable exactly two"
        )
    links: dict[str, list[str]] = {n: [] for n in names}
    for c in cables:
        a, b = c.nodes
        for x, y in ((a, b), (b, a)):
            if y not in links[x]:
                links[x].append(y)
    if len(names) == 3:
        missing = [f"{a}-{b}" for i, a in enumerate(names) for b in names[i + 1 :] if b not in links[a]]
        if missing:
            raise Miscabled(
                f"three nodes with point-to-point cables form a mesh, but {', '.join(missing)} share no "
                "cable: cable every pair (each Spark has two ports)"
            )
        return Topology(
            "mesh", tuple(names), cables, f"{len(cables)} cables, every pair of the three joined: {_nets(cables)}"
        )
    wrong = [
        f"{n} has {len(links[n])} neighbour(s) ({', '.join(links[n]) or 'none'})" for n in names if len(links[n]) != 2
    ]
    if wrong:
        raise Miscabled(f"a ring of {len(names)} needs each node cabled to two others: {'; '.join(wrong)}")
    order = [names[0]]
    while len(order) < len(names):
        nxt = next((m for m in links[order[-1]] if m not in order), None)
        if nxt is None:
            break
        order.append(nxt)
    if len(order) != len(names):
        raise Miscabled(
            f"the cables form more than one loop ({' - '.join(order)} closes without "
            f"{', '.join(n for n in names if n not in order)}): cable the nodes as one ring"
        )
    return Topology("ring", tuple(order), cables, f"{len(cables)} cables, one loop: {' - '.join(order)} - {order[0]}")


def _nets(cables: tuple[Cable, ...]) -> str:
    return ", ".join(str(c.network) for c in cables)
