"""RDMA checks (rdma.*): each data-plane HCA has a RoCE v2 IPv4 GID, and is present, ACTIVE, on its
netdev and paired with the head's HCAs in cabling order.

Which index holds that GID is NCCL's to find (issue 35): since NCCL 2.21.5 (src/transport/net_ib
connect.cc `ncclIbGetGidIndex`), with NCCL_IB_GID_INDEX unset, NCCL walks each HCA's GID table when
a communicator is made and takes the RoCE v2 entry of the IPv4 family (NCCL_IB_ADDR_FAMILY,
NCCL_IB_ROCE_VERSION_NUM default to exactly that), reading `gid_attrs/types` from sysfs: per HCA,
at every rank start. A number pinned at `init` goes stale when reboots and link events move the
table (tonyd2wild DeepSeek-v4-Flash-Vision-Exp #38: 3 to 4 within 30 minutes; NVIDIA/nccl #1333,
#2157), and one number cannot suit two HCAs whose tables differ. So sparkcluster sets none, and
this check asks only that every HCA has such a GID."""

from __future__ import annotations

import re

from sparkcluster.checks.registry import Context, Report, check
from sparkcluster.config.inventory import Node
from sparkcluster.facts import HostFacts


def gid_v4(f: HostFacts, hca: str) -> list:
    """The HCA's RoCE v2 GIDs that carry an IPv4 address, lowest index first."""
    return [g for g in f.gids.get(hca, []) if g.roce_v2 and g.ipv4 is not None]


@check("rdma.gid", "RoCE v2 IPv4 GID on every HCA in NCCL_IB_HCA (NCCL picks its index at each start)")
def rdma_gid(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        if not any(h in f.hcas for h in node.hcas):
            continue  # none of its HCAs exist: rdma.hca says so
        problems = []
        for link in node.data_plane:
            i = f.interfaces.get(link.netdev)
            if i is not None and i.up and not i.addresses:
                problems.append(
                    f"{link.hca}: its netdev {link.netdev} is up without an IPv4 address, so the HCA "
                    "has no RoCE v2 IPv4 GID"
                )
            elif link.hca in f.hcas and not gid_v4(f, link.hca):
                kinds = sorted({g.type for g in f.gids.get(link.hca, [])}) or ["an empty GID table"]
                problems.append(f"{link.hca} has no RoCE v2 IPv4 GID (has {', '.join(kinds)})")
        if problems:
            r.fail(
                node.name,
                "; ".join(problems),
                "give each data-plane netdev a static IPv4 address (the kernel then adds the RoCE v2 GID), "
                "or drop the HCA from data_plane; check with `cat /sys/class/infiniband/HCA/ports/1/gid_attrs/types/3`",
            )
            continue
        by_index: dict[int, list[str]] = {}
        for h in node.hcas:
            if gid_v4(f, h):
                by_index.setdefault(min(g.index for g in gid_v4(f, h)), []).append(h)
        where = "; ".join(f"index {i} on {', '.join(hs)}" for i, hs in sorted(by_index.items()))
        if node.gid_index is not None:
            r.warn(
                node.name,
                f"the inventory's gid_index {node.gid_index} is ignored: NCCL finds each HCA's RoCE v2 IPv4 GID "
                f"itself at every start (now {where}); a pinned index goes stale when the table moves",
                f"remove gid_index from {node.name} in the inventory",
            )
        else:
            r.ok(node.name, where)  # the index NCCL will find now; none is pinned


def _subnets(f: HostFacts, netdev: str) -> set:
    i = f.interfaces.get(netdev)
    return {a.network for a in i.addresses} if i else set()


@check("rdma.hca", "RoCE HCAs for NCCL_IB_HCA: present, ACTIVE, on the right netdev")
def rdma_hca(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        if not node.data_plane:
            continue  # one node alone: nothing crosses a cable, the inventory names no HCA (SKIP)
        f = ctx.facts[node.name]
        problems, down = [], []
        for link in node.data_plane:
            h = f.hcas.get(link.hca)
            if h is None:
                problems.append(f"{link.hca} missing")
            elif not h.active:
                problems.append(f"{link.hca} port 1 is '{h.state}'")
                down.append(link)
            elif link.netdev not in h.netdevs:
                problems.append(f"{link.hca} sits on {', '.join(h.netdevs) or 'no netdev'}, not {link.netdev}")
        # NCCL pairs the HCAs of two nodes by list position: entry k must be the two ends of one cable
        # (same subnet), or the pairs time out. A port on the subnet of another of the head's entries
        # is cabled in another order than listed (re-cabled, inventory not updated).
        # In a ring or mesh each port meets a different neighbour and NCCL routes by subnet
        # (NCCL_IB_SUBNET_AWARE_ROUTING, nccl.topology_env): there is no position to pair.
        crossed = []
        head = ctx.inventory.head
        by_position = ctx.inventory.cluster.topology not in ("ring", "mesh")
        if by_position and node.name != head.name and head.name in ctx.facts:
            hf = ctx.facts[head.name]
            head_nets = set().union(*(_subnets(hf, ref.netdev) for ref in head.data_plane))
            # a pair cut from a ring (`--node` of two neighbours): one cable joins them, each node's
            # other port faces a third node; NCCL routes by subnet there, no position to pair
            by_position = all(_subnets(f, mine.netdev) & head_nets for mine in node.data_plane)
        if by_position and node.name != head.name and head.name in ctx.facts:
            for k, mine in enumerate(node.data_plane):
                a = _subnets(f, mine.netdev)
                peer = [j for j, ref in enumerate(head.data_plane) if a & _subnets(hf, ref.netdev)]
                if peer and k not in peer:
                    ref = head.data_plane[peer[0]]
                    crossed.append(
                        f"entry {k + 1} {mine.hca}/{mine.netdev} is cabled to {head.name}'s entry {peer[0] + 1} "
                        f"{ref.hca}/{ref.netdev} ({', '.join(map(str, sorted(a)))}), not to its entry {k + 1}"
                    )
        problems += crossed
        if problems:
            # every HCA's state, so a cable in the other port shows at a glance
            mapping = (
                ", ".join(f"{h.name}->{'/'.join(h.netdevs)} {h.state or '?'}" for h in f.hcas.values()) or "none found"
            )
            moved = _other_port_active(f, node, down)
            if moved:
                problems.append(
                    f"likely cause: the cable sits in the other port ({', '.join(moved)} ACTIVE, not in data_plane)"
                )
            fix = (
                "fix data_plane for this node in the inventory (`ibdev2netdev` on the node shows the pairs); "
                "NCCL pairs HCAs by list position, one wrong entry gives ibv_modify_qp timeouts"
            )
            if crossed and len(crossed) == len(problems):
                fix = (
                    f"order data_plane for {node.name} as its ports are cabled: entry k must share a subnet with "
                    f"{head.name}'s entry k (`ip -br addr` on both nodes); NCCL pairs HCAs by list position"
                )
            elif down and moved and len(down) + 1 == len(problems):
                fix = (
                    f"move the cable to the port data_plane names, or list {', '.join(moved)} instead (NCCL "
                    f"pairs HCAs by list position): {ctx.inventory.init_again()} drafts it"
                )
            elif down and len(down) == len(problems):
                # the pairing is right, the port is not up: the inventory is not what to change
                fix = (
                    f"bring the RoCE port up: check the cable of {', '.join(link.netdev for link in down)} and "
                    "`ip link set IF up` (`ibdev2netdev` must show it Up, port state 4: ACTIVE)"
                )
            r.fail(node.name, "; ".join(problems) + f" (on this node: {mapping})", fix)
        else:
            r.ok(node.name, ",".join(node.hcas))


def other_port_hca(hca: str) -> str:
    """The HCA of the other QSFP port on the same controller: rocep1s0f1 <-> rocep1s0f0."""
    return re.sub(r"f([01])$", lambda m: f"f{1 - int(m.group(1))}", hca)


def _other_port_active(f: HostFacts, node: Node, down: list) -> list[str]:
    """ACTIVE HCAs of the other port of each DOWN one, that the inventory does not list."""
    out = []
    for link in down:
        o = f.hcas.get(other_port_hca(link.hca))
        if o is not None and o.active and o.name not in node.hcas:
            out.append(o.name)
    return out
