"""Network checks (net.*): the control IP and VLLM_HOST_IP, the data-plane links (state, MTU,
path MTU, speed), and cabling as Sparks have it (port twins, far ends, the default route)."""

from __future__ import annotations

import ipaddress
import re

from sparkcluster.checks.registry import Context, Report, check
from sparkcluster.config import engine_traits
from sparkcluster.facts import HostFacts
from sparkcluster.facts.probes import CX7_SPEED_MBPS, DOCKER_DEFAULT_BRIDGE, LINK_LOCAL

# --- control plane ------------------------------------------------------------------------------

# what a link-local address really risks (NVIDIA's two-Spark guide uses them, and they do carry
# traffic): the address is picked again at each boot, and every link-local port shares one route
LINK_LOCAL_RISK = (
    "it is chosen anew at each boot (so the inventory goes stale) and every port with one shares "
    "the single 169.254.0.0/16 route, so the kernel may send the traffic out of another port"
)


def _bridge_networks(f: HostFacts) -> list[ipaddress.IPv4Network]:
    nets = [DOCKER_DEFAULT_BRIDGE]
    for name, iface in f.interfaces.items():
        if name == "docker0" or name.startswith("br-"):
            nets += [a.network for a in iface.addresses]
    return nets


@check("net.control_ip", "Control IP on its interface, unique, routable")
def net_control_ip(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        ip = node.control_ip
        iface = f.interfaces.get(node.control_if)
        if ip in LINK_LOCAL:
            r.fail(
                node.name,
                f"control IP {ip} is link-local (169.254/16): {LINK_LOCAL_RISK}",
                f"give {node.control_if} a static address on the link between the nodes (one /24 per cable, "
                "e.g. 198.19.k.1 and 198.19.k.2) and put it in control_ip",
            )
        elif any(ip in net for net in _bridge_networks(f)):
            r.fail(
                node.name,
                f"control IP {ip} is a docker bridge address",
                f"use the address of {node.control_if} (the link between the nodes), not docker0's",
            )
        elif iface is None:
            r.fail(
                node.name,
                f"interface {node.control_if} does not exist",
                f"fix control_if for {node.name} in the inventory (see `ip -br addr` on the node)",
            )
        elif ip not in [a.ip for a in iface.addresses]:
            have = ", ".join(str(a.ip) for a in iface.addresses) or "no IPv4 address"
            r.fail(
                node.name,
                f"{ip} is not on {node.control_if} ({have})",
                f"set control_ip for {node.name} to the address of {node.control_if}, or assign {ip} to it",
            )
        else:
            elsewhere = [
                o
                for o, of in ctx.facts.items()
                if o != node.name and any(a.ip == ip for i in of.interfaces.values() for a in i.addresses)
            ]
            if elsewhere:
                r.fail(
                    node.name,
                    f"{ip} is also configured on {', '.join(elsewhere)}",
                    "every node needs its own control IP, or vLLM sees fewer unique IPs than nodes",
                )
            else:
                r.ok(node.name, f"{ip} on {node.control_if}")


@check("net.vllm_host_ip", "VLLM_HOST_IP equals the control IP")
def net_vllm_host_ip(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        planned = ctx.expect.per_host_env.get(node.name, {}).get("VLLM_HOST_IP")
        running = [c.env.get("VLLM_HOST_IP") for c in ctx.ours(node.name) if c.running]
        values = [v for v in [planned, *running] if v is not None]
        bad = [v for v in values if v != str(node.control_ip)]
        if bad:
            where = "in the running container" if bad[0] in running else "in the profile"
            why = ""
            if ctx.expect.vllm_version:
                why = (
                    "; " + engine_traits.traits(ctx.expect.vllm_version, ctx.expect.forwarded_env).node_ip_consequence()
                )
            r.fail(
                node.name,
                f"VLLM_HOST_IP is {bad[0]} {where}, but {node.name}'s control IP is {node.control_ip}{why}",
                "VLLM_HOST_IP is computed per node by sparkcluster: remove it from the profile's forwarded "
                "variables, then `sparkcluster down && sparkcluster up`",
            )
        elif values:
            r.ok(node.name, str(node.control_ip))


# --- data plane ---------------------------------------------------------------------------------


@check("net.link", "Data-plane links exist, up, carrier")
def net_link(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        problems = []
        for name in dict.fromkeys([node.control_if, *node.netdevs]):
            i = f.interfaces.get(name)
            if i is None:
                problems.append(f"{name} missing")
            elif not i.up:
                problems.append(f"{name} administratively down")
            elif i.carrier is False or not i.lower_up:
                problems.append(f"{name} has no carrier")
        if problems:
            r.fail(
                node.name,
                "; ".join(problems),
                "check the QSFP cables and `ip link set IF up`; interface names must match the inventory "
                "(they differ between nodes when cables sit in other ports)",
            )
        else:
            r.ok(node.name, f"{len(node.netdevs)} links up")


@check("net.mtu", "Interface MTU as expected")
def net_mtu(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        bad = [
            f"{n} is {f.interfaces[n].mtu}"
            for n in node.netdevs
            if n in f.interfaces and f.interfaces[n].mtu != node.mtu
        ]
        if bad:
            r.fail(
                node.name,
                f"MTU {', '.join(bad)}, expected {node.mtu}",
                f"ip link set dev IF mtu {node.mtu} (and persist it in netplan/NetworkManager) on both ends",
            )
        elif any(n in f.interfaces for n in node.netdevs):
            r.ok(node.name, f"{node.mtu} on every data-plane link")


@check("net.path_mtu", "Path MTU on every link, both directions")
def net_path_mtu(ctx: Context, r: Report) -> None:
    # each node probes its own direction; every failing probe is named (one netdev may have several)
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        if f.path_mtu_error:
            r.fail(
                node.name,
                f"the path-MTU probes did not run: {f.path_mtu_error}",
                f"check that {node.name} answers over SSH (sparkcluster doctor again); the probes are pings "
                "from each data-plane netdev to every peer address on its subnet",
            )
            continue
        pings = f.path_mtu
        if not pings:
            r.skip(
                node.name,
                "no data-plane netdev with an address on a peer's subnet: nothing to probe "
                "(net.link and net.peer say why)",
            )
            continue
        bad = [p for p in pings if not p.ok]
        if bad:
            each = "; ".join(
                f"{p.netdev} -> {p.peer_node} {p.peer_ip}: `{p.command}` -> {p.detail or 'no reply'}" for p in bad
            )
            r.fail(
                node.name,
                f"{len(bad)} of {len(pings)} probe(s) drop {bad[0].size + 28}-byte frames: {each}",
                f"set MTU {node.mtu} on both ends of each link (and on any switch between them)",
            )
        else:
            r.ok(node.name, f"{len(pings)} probes pass {node.mtu}-byte frames unfragmented")


# --- cabling as Sparks have it (issue 17) --------------------------------------------------------

_CX7 = re.compile(r"^en(?:P\d+)?p\d+s\d+f\d+np\d+$")


def is_cx7(netdev: str) -> bool:
    """A ConnectX-7 port's netdev as a Spark names it (enp1s0f1np1, enP2p1s0f1np1)."""
    return bool(_CX7.match(netdev))


def twin_key(netdev: str) -> str:
    """Both netdevs of one QSFP port ("twins": the enP2 one reaches the second PCIe domain) share it."""
    return re.sub(r"^enP\d+p", "enp", netdev)


@check("net.twins", "Twins of one port (and every data-plane port) on subnets of their own")
def net_twins(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        ports = [n for n in dict.fromkeys([*node.netdevs, *sorted(f.interfaces)]) if n in node.netdevs or is_cx7(n)]
        by_net: dict[ipaddress.IPv4Network, list[str]] = {}
        for n in ports:
            i = f.interfaces.get(n)
            for a in i.addresses if i else []:
                by_net.setdefault(a.network, [])
                if n not in by_net[a.network]:
                    by_net[a.network].append(n)
        shared = {net: ns for net, ns in by_net.items() if len(ns) > 1}
        if not shared:
            r.ok(node.name, f"{len(by_net)} subnet(s), one port each")
            continue
        parts = []
        for net, ns in shared.items():
            twins = len({twin_key(n) for n in ns}) == 1
            what = "twins of one port" if twins else "ports"
            parts.append(
                f"{' and '.join(ns)} ({what}) share {net}"
                + (f": link-local, {LINK_LOCAL_RISK}" if net.subnet_of(LINK_LOCAL) else "")
            )
        r.fail(
            node.name,
            "; ".join(parts) + ": the kernel answers and sends on one of them only, so the other "
            "rail's RoCE traffic takes the wrong port (eugr/spark-vllm-docker#270)",
            "give each netdev its own subnet, one /24 per twin with the same /24 on the peer's twin "
            "(e.g. 198.19.1.x on enp1s0f1np1, 198.19.2.x on enP2p1s0f1np1), or remove the address from the unused one",
        )


@check("net.speed", "Data-plane links at full rate")
def net_speed(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        known = {
            link.netdev: f.interfaces[link.netdev].speed_mbps
            for link in node.data_plane
            if link.netdev in f.interfaces and f.interfaces[link.netdev].speed_mbps
        }
        if not known:
            continue
        slow = [
            f"{link.hca}/{link.netdev} at {known[link.netdev] // 1000} Gb/s"
            for link in node.data_plane
            if known.get(link.netdev, CX7_SPEED_MBPS) < CX7_SPEED_MBPS
        ]
        if slow:
            r.warn(
                node.name,
                f"rail {'; rail '.join(slow)}, below {CX7_SPEED_MBPS // 1000} Gb/s: NCCL runs every "
                "rail at the pace of the slowest",
                "reseat or replace the cable of that port; if the link is 200G but slow, update the firmware "
                "(older BIOS wires the second controller at PCIe Gen5 x2: fwupdmgr update)",
            )
        else:
            r.ok(node.name, f"{len(known)} link(s) at {CX7_SPEED_MBPS // 1000} Gb/s")


def _cluster_macs(ctx: Context) -> dict[str, str]:
    return {i.mac: n for n, f in ctx.facts.items() for i in f.interfaces.values() if i.mac}


@check("net.peer", "Each data-plane link's far end is a cluster node")
def net_peer(ctx: Context, r: Report) -> None:
    macs = _cluster_macs(ctx)
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        others = [of for o, of in ctx.facts.items() if o != node.name]
        problems = []
        # a data-plane port is judged by who answered its path MTU probe (the MAC): the subnet alone
        # cannot say which end is wrong. A cabled ConnectX-7 port outside the data plane on a subnet
        # no cluster node has is what a third machine looks like from here (eugr#40).
        for n in sorted(x for x in f.interfaces if others and is_cx7(x) and x not in node.netdevs):
            i = f.interfaces.get(n)
            if i is None or not i.up or not i.lower_up or i.carrier is False or not i.addresses:
                continue  # no cable or no address: net.link and rdma.gid judge those
            nets = {a.network for a in i.addresses if a.ip not in LINK_LOCAL}
            if nets and not any(
                a.network in nets for of in others for oi in of.interfaces.values() for a in oi.addresses
            ):
                problems.append(
                    f"{n} ({', '.join(map(str, sorted(nets)))}) has a cable but no cluster node has an "
                    "address on its subnet: its far end is another machine"
                )
        for p in f.path_mtu:
            if p.peer_mac and p.peer_node in ctx.facts and p.peer_mac not in macs:
                problems.append(
                    f"{p.peer_ip} on {p.netdev} is answered by {p.peer_mac}, which is no port of a cluster "
                    f"node (not {p.peer_node})"
                )
        if problems:
            # on a data-plane port NCCL would talk to a stranger: that cannot work; elsewhere it is a note
            report = r.fail if any(f" on {n} " in p for p in problems for n in node.netdevs) else r.warn
            report(
                node.name,
                "; ".join(dict.fromkeys(problems)),
                "a port cabled to a third machine must stay out of data_plane (NCCL_IB_HCA) and off the cluster's "
                "subnets; cable the data plane node to node",
            )
        else:
            r.ok(node.name, "every cabled port reaches a cluster node")


@check("net.default_route", "Default route not on a ConnectX-7 port")
def net_default_route(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        # a ring's control plane is the LAN (no cable reaches every node): a default route there is right
        bad = [d for d in f.default_routes if d in node.netdevs or is_cx7(d)]
        if bad:
            r.warn(
                node.name,
                f"the default route leaves by {', '.join(dict.fromkeys(bad))}, a ConnectX-7 port: "
                "internet traffic (model downloads, pip) competes with NCCL, and the data plane "
                "depends on a gateway",
                "route the default through the 10 GbE/Wi-Fi port (`ip route`; in netplan drop `gateway4`/"
                "`routes: to: default` from the QSFP interfaces)",
            )
        else:
            r.ok(node.name, f"via {', '.join(f.default_routes) or 'no default route'}")
