"""The chain the image and the weights travel along when several workers need them (issue 27):
head -> w1 -> w2 -> ..., each worker's receiver forwarding to the next as it receives, so the head's
port carries one copy whatever the number of workers.

The order follows the inventory (a ring's inventory is in cable order, so each hop is a cable);
each hop is addressed on a data-plane subnet its two nodes share (through a switch: the rail; in a
ring: the cable between them), else on their control IPs. Pure: inventory and facts in, hops out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkcluster.config.inventory import Inventory
    from sparkcluster.facts import HostFacts


@dataclass(frozen=True)
class Hop:
    """One link of the chain: `src` sends from `src_ip` to `dst`'s receiver on `dst_ip`."""

    src: str
    src_ip: str
    dst: str
    dst_ip: str
    via: str  # the shared subnet, or "the control link"


def order(inv: Inventory, workers: list[str] | tuple[str, ...]) -> list[str]:
    """The workers that receive, in inventory order (a ring's cable order)."""
    want = set(workers)
    return [n.name for n in inv.workers if n.name in want]


def hop(inv: Inventory, facts: dict[str, HostFacts], a: str, b: str) -> Hop:
    """The addresses of `a` and `b` on the first data-plane subnet they share (in `a`'s port
    order), else their control IPs."""
    na, nb = inv.node(a), inv.node(b)
    fa, fb = facts.get(a), facts.get(b)
    if fa is not None and fb is not None:
        theirs = [addr for nd in nb.netdevs if nd in fb.interfaces for addr in fb.interfaces[nd].addresses]
        for nd in na.netdevs:
            iface = fa.interfaces.get(nd)
            for mine in iface.addresses if iface else []:
                for other in theirs:
                    if other.network == mine.network and other.ip != mine.ip:
                        return Hop(a, str(mine.ip), b, str(other.ip), str(mine.network))
    return control(inv, a, b)


def control(inv: Inventory, a: str, b: str) -> Hop:
    """`a` to `b` over their control IPs: a single worker's stream, and a chain's fallback."""
    return Hop(a, str(inv.node(a).control_ip), b, str(inv.node(b).control_ip), "the control link")


def plan(inv: Inventory, facts: dict[str, HostFacts], workers: list[str] | tuple[str, ...]) -> list[Hop]:
    """The hops head -> w1 -> w2 -> ... over the workers that need the data."""
    names = [inv.head.name, *order(inv, workers)]
    return [hop(inv, facts, a, b) for a, b in zip(names, names[1:])]


def describe(hops: list[Hop], i: int) -> str:
    """What hop i's receiving node does: from whom, over which addresses, forwarding to whom."""
    h = hops[i]
    nxt = hops[i + 1] if i + 1 < len(hops) else None
    return f"from {h.src} over {h.src_ip} -> {h.dst_ip} ({h.via})" + (
        f", forwarding to {nxt.dst} over {nxt.src_ip} -> {nxt.dst_ip} ({nxt.via}) as it arrives"
        if nxt
        else ", the end of the chain"
    )
