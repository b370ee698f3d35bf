"""Cabling checks across N nodes (issue 27): the data-plane subnets still describe the inventory's
topology, each node reaching the neighbours it must (every node on every rail through a switch, the
two next to it in a ring, each other in a mesh or a pair), and a ring or mesh carrying the NCCL
variables point-to-point cabling needs, in the profile and in the running containers; and each ring or
mesh cable joining port 0 of one node to port 1 of the next (issue 35)."""

from __future__ import annotations

import ipaddress
import re

from sparkcluster.checks.registry import Context, Report, check
from sparkcluster.config import topology
from sparkcluster.config.inventory import Node
from sparkcluster.facts import HostFacts
from sparkcluster.facts.probes import LINK_LOCAL


def rails(f: HostFacts, node: Node) -> list[ipaddress.IPv4Network]:
    """The subnets of the node's data-plane netdevs (link-local ones are no cable of their own)."""
    return [
        a.network
        for nd in node.netdevs
        for a in (f.interfaces[nd].addresses if nd in f.interfaces else [])
        if a.ip not in LINK_LOCAL
    ]


def must_reach(kind: str, names: list[str], node: str) -> list[str]:
    """Whom `node` must share a data-plane subnet with: every node through a switch, in a mesh and a
    pair; in a ring the two next to it in inventory order (the order init found along the cables)."""
    if kind == "ring":
        i = names.index(node)
        return list(dict.fromkeys([names[i - 1], names[(i + 1) % len(names)]]))
    return [n for n in names if n != node]


@check("net.topology", "The data-plane subnets fit the inventory's topology")
def net_topology(ctx: Context, r: Report) -> None:
    nodes = ctx.nodes()
    if len(ctx.inventory.nodes) < 2:
        for n in nodes:
            r.skip(n.name, "one node: no cabling to judge")
        return
    have = {n.name: rails(ctx.facts[n.name], n) for n in nodes}
    declared = ctx.inventory.cluster.topology
    try:
        found = topology.classify(have) if len(have) == len(ctx.inventory.nodes) else None
    except topology.Miscabled:
        found = None
    names = [n.name for n in ctx.inventory.nodes]
    kind = declared or (found.kind if found else ("direct" if len(names) == 2 else "switch"))
    count: dict[ipaddress.IPv4Network, int] = {}
    for nets in have.values():
        for net in set(nets):
            count[net] = count.get(net, 0) + 1
    for node in nodes:
        mine = set(have[node.name])
        missing = [m for m in must_reach(kind, names, node.name) if m in have and not mine & set(have[m])]
        # through a switch every rail reaches every node: a subnet most nodes have and this one lacks
        # is this node's fault, not theirs
        lacking = (
            [str(net) for net, c in count.items() if net not in mine and c > len(have) / 2] if kind == "switch" else []
        )
        if lacking or missing:
            what = (
                f"lacks {', '.join(lacking)}, which the other nodes' rails are on"
                if lacking
                else f"shares no data-plane subnet with {', '.join(missing)}"
            )
            r.fail(
                node.name,
                f"{kind} cabling: {node.name} {what}",
                "through a switch every node needs an address on every rail's subnet; in a ring or mesh each "
                "cable is a /24 of its own with both ends on it: check the cable and the port's address, or if "
                f"the cabling changed draft the inventory again: {ctx.inventory.init_again()}",
            )
        elif found is not None and declared and found.kind != declared:
            r.fail(
                node.name,
                f"the inventory says {declared}, the subnets say {found.kind} ({found.why})",
                f'set topology = "{found.kind}" in [cluster] (or draft it again: {ctx.inventory.init_again()})',
            )
        else:
            r.ok(node.name, f"{kind}: reaches {', '.join(must_reach(kind, names, node.name))}")


def port_of(hca: str, netdev: str) -> str | None:
    """Which QSFP port a data-plane link is: the HCA's `s0fN` (rocep1s0f1, roceP2p1s0f1: port 1),
    else the netdev's (enp1s0f1np1); None when neither name says."""
    for name in (hca, netdev):
        m = _PORT.search(name)
        if m:
            return m.group(1)
    return None


_PORT = re.compile(r"s0f(\d+)(?:np\d+)?$")


@check("net.crossing", "Ring and mesh cables join port 0 of one node to port 1 of the next")
def net_crossing(ctx: Context, r: Report) -> None:
    kind = ctx.inventory.cluster.topology
    nodes = ctx.nodes()
    if kind not in ("ring", "mesh"):
        for n in nodes:
            r.ok(n.name, f"{kind or 'no'} topology: ports are paired by position (rdma.hca)")
        return
    # each cable's subnet -> (node, port) of its ends
    ends: dict[ipaddress.IPv4Network, list[tuple[str, str | None]]] = {}
    for n in ctx.inventory.nodes:
        f = ctx.facts.get(n.name)
        if f is None:
            continue
        for link in n.data_plane:
            i = f.interfaces.get(link.netdev)
            for a in i.addresses if i else []:
                if a.ip not in LINK_LOCAL:
                    ends.setdefault(a.network, [])
                    if (n.name, port_of(link.hca, link.netdev)) not in ends[a.network]:
                        ends[a.network].append((n.name, port_of(link.hca, link.netdev)))
    crossed: dict[str, list[str]] = {}
    for net, on in ends.items():
        if len(on) != 2 or None in (on[0][1], on[1][1]) or on[0][0] == on[1][0]:
            continue  # no cable between two nodes here (net.topology judges that), or names that do not say
        (a, pa), (b, pb) = on
        if pa == pb:
            line = f"the cable on {net} joins {a}'s port {pa} to {b}'s port {pb}"
            crossed.setdefault(a, []).append(line)
            crossed.setdefault(b, []).append(line)
    for n in nodes:
        if n.name in crossed:
            r.fail(
                n.name,
                "; ".join(crossed[n.name]) + ": port to the same port, so NCCL's queue pairs time out "
                "(ibv_modify_qp error 110)",
                "move one end of that cable to the other port: each cable joins port 0 of one node to port 1 of "
                "the next (NVIDIA connect-three-sparks, step 2), then draft the inventory again: "
                + ctx.inventory.init_again(),
            )
        else:
            r.ok(n.name, "every cable port 0 to port 1")


@check("nccl.topology_env", "NCCL variables a ring or mesh needs, in the profile and the containers")
def nccl_topology_env(ctx: Context, r: Report) -> None:
    kind = ctx.inventory.cluster.topology
    # what the cabling cannot do without: on a switch or a pair sparkcluster still sets subnet-aware
    # routing (NVIDIA does), but nothing fails without it
    need = topology.nccl_env(kind) if kind in ("ring", "mesh") else {}
    for node in ctx.nodes():
        if not need:
            r.ok(node.name, f"{kind or 'no'} topology: none needed")
            continue
        forwarded = {k: v for k, v in ctx.expect.forwarded_env.items() if k in need and v != need[k]}
        overridden = {k: v for k, v in forwarded.items() if k in topology.OVERRIDABLE_NCCL}
        planned = {k: v for k, v in forwarded.items() if k not in overridden}
        running = [c.env for c in ctx.ours(node.name) if c.running]
        stale = sorted({k for env in running for k in need if env.get(k) not in (need[k], overridden.get(k, need[k]))})
        if planned:
            r.fail(
                node.name,
                f"the profile forwards {', '.join(f'{k}={v}' for k, v in planned.items())}, but a "
                f"{kind} needs {', '.join(f'{k}={need[k]}' for k in planned)} "
                "(without them the first collective hangs: sparkrun#174, #208; a ring's NCCL trees cross "
                "its diagonals: eugr spark-vllm-docker RING_ENV)",
                "remove those variables from the profile's [env.forward]: sparkcluster sets them for the cabling",
            )
        elif stale:
            r.fail(
                node.name,
                f"the running container lacks {', '.join(f'{k}={need[k]}' for k in stale)}, which a "
                f"{kind} needs (started before the topology was set?)",
                "sparkcluster down && sparkcluster up (the containers are started with them)",
            )
        elif overridden:
            r.warn(
                node.name,
                f"the profile forwards {', '.join(f'{k}={v}' for k, v in overridden.items())} where a {kind} "
                f"defaults to {', '.join(f'{k}={need[k]}' for k in overridden)}: "
                + "; ".join(topology.OVERRIDABLE_NCCL[k] for k in overridden)
                + ", while sparkrun#174 hangs without the default",
                "keep it only if this cluster serves with it; else remove it from [env.forward]",
            )
        else:
            r.ok(node.name, ", ".join(f"{k}={v}" for k, v in need.items()))
