"""Preflight checks: pure functions from the facts of all hosts to one result per node.

Each check has a stable id (used by `doctor --json` and by `up`'s preflight) and records its
results in a `Report` that stamps them with that id. A check reports only on the nodes it can
judge; `run_checks` marks the rest SKIP. Every WARN or FAIL has a one-line cause (`detail`) and a
one-line `fix`.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Callable, Literal

from . import engine_traits
from .facts import HostFacts
from .inventory import Inventory, Node
from .labels import CLUSTER_LABEL, ROLE_LABEL
from .probes import CX7_SPEED_MBPS, DOCKER_DEFAULT_BRIDGE, LINK_LOCAL

Status = Literal["ok", "warn", "fail", "skip"]
GiB = 1024**3
MEM_HEADROOM_FLOOR = 6 * GiB  # seed 002's watchdog warns under 6 GB of MemAvailable


@dataclass(frozen=True)
class Result:
    id: str
    node: str
    status: Status
    detail: str = ""
    fix: str = ""

    def as_json(self) -> dict:
        return {"id": self.id, "node": self.node, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class Expect:
    """What the profile will need, so checks can judge against it. All optional."""

    image: str | None = None
    base_image: str | None = None  # the profile's base (NGC) image the cluster image is built from
    forwarded_env: dict[str, str] = field(default_factory=dict)
    per_host_env: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> env
    gpu_memory_utilization: float | None = None
    image_disk_bytes: int = 30 * GiB  # NGC vLLM base ~9 GB + Ray; a build needs room twice over
    model_disk_bytes: int = 0
    vllm_version: str | None = None  # of the image to be served: decides what vLLM checks itself
    # docker flags every container must carry, and which must be identical across nodes
    container_flags: dict[str, object] = field(default_factory=dict)


@dataclass
class Context:
    inventory: Inventory
    facts: dict[str, HostFacts]  # reachable nodes only
    unreachable: dict[str, str]  # node -> reason
    expect: Expect = field(default_factory=Expect)

    def nodes(self) -> list[Node]:
        return [n for n in self.inventory.nodes if n.name in self.facts]

    def ours(self, node: str) -> list[dict]:
        return [c for c in self.facts[node].ours
                if c.get("Config", {}).get("Labels", {}).get(CLUSTER_LABEL) == self.inventory.cluster.name]


class Report:
    """Where one check records its results; each is stamped with the check's id."""

    def __init__(self, check_id: str):
        self.check_id = check_id
        self.results: list[Result] = []

    def ok(self, node: str, detail: str = "") -> None:
        self.results.append(Result(self.check_id, node, "ok", detail))

    def warn(self, node: str, detail: str, fix: str) -> None:
        self.results.append(Result(self.check_id, node, "warn", detail, fix))

    def fail(self, node: str, detail: str, fix: str) -> None:
        self.results.append(Result(self.check_id, node, "fail", detail, fix))


CheckFn = Callable[[Context], list[Result]]
REGISTRY: list[tuple[str, str, CheckFn]] = []


def check(check_id: str, title: str):
    """Register `fn(ctx, report)` under `check_id`; the registered function returns its results."""
    def deco(fn: Callable[[Context, Report], None]) -> CheckFn:
        @functools.wraps(fn)
        def run(ctx: Context) -> list[Result]:
            report = Report(check_id)
            fn(ctx, report)
            return report.results
        REGISTRY.append((check_id, title, run))
        return run
    return deco


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


# --- reachability and GPU -----------------------------------------------------------------------

@check("ssh.reachable", "SSH reachable")
def ssh_reachable(ctx: Context, r: Report) -> None:
    for n in ctx.facts:
        r.ok(n, ctx.facts[n].hostname)
    for n, why in ctx.unreachable.items():
        r.fail(n, why, "check the host is up and `ssh <target>` works from this machine")


@check("gpu.gb10", "GPU present, a GB10")
def gpu_gb10(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        if not f.gpus:
            r.fail(n, f"nvidia-smi found no GPU: {f.gpu_error or 'no output'}",
                   "check the NVIDIA driver on this node (nvidia-smi must list the GB10)")
        elif not all("GB10" in g.name for g in f.gpus):
            r.fail(n, f"GPU is {', '.join(g.name for g in f.gpus)}, not a GB10",
                   "sparkcluster targets DGX Spark (GB10); check the inventory points at the Sparks")
        else:
            # memory.total is [N/A] on GB10 (unified memory): expected, not an error
            r.ok(n, f"{f.gpus[0].name}, sm {f.gpus[0].compute_cap}")


@check("gpu.driver", "Same NVIDIA driver on every node")
def gpu_driver(ctx: Context, r: Report) -> None:
    drivers = {n: f.gpus[0].driver for n, f in ctx.facts.items() if f.gpus}
    if not drivers:
        return
    head = ctx.inventory.head.name
    ref = drivers.get(head) or next(iter(drivers.values()))
    for n, d in drivers.items():
        if d == ref:
            r.ok(n, d)
        else:
            r.fail(n, f"driver {d} differs from {head}'s {ref}",
                   f"install driver {ref} on {n} (or upgrade both) so every rank runs the same CUDA stack")


# --- docker and image ---------------------------------------------------------------------------

@check("docker.engine", "Docker engine reachable")
def docker_engine(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        if f.docker:
            r.ok(n, f"Docker {f.docker.server_version}")
        else:
            r.fail(n, f"docker info failed: {f.docker_error}",
                   "start the Docker daemon (systemctl start docker) and make sure this user may use it")


@check("docker.gpu_runtime", "GPU runtime usable by Docker")
def docker_gpu_runtime(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        if not f.docker:
            continue
        if f.gpu_hook or "nvidia" in f.docker.runtimes:
            r.ok(n, f.gpu_hook or "nvidia runtime")
        else:
            r.fail(n, "neither nvidia-container-runtime-hook nor an nvidia runtime found",
                   "install the NVIDIA Container Toolkit (nvidia-container-toolkit) and restart Docker")


@check("image.same", "Cluster image present, same ID everywhere")
def image_same(ctx: Context, r: Report) -> None:
    img = ctx.expect.image
    if not img:
        return
    ids = {n: f.image_id for n, f in ctx.facts.items() if f.docker}
    head = ctx.inventory.head.name
    ref = ids.get(head)
    for n, i in ids.items():
        if i is None:
            r.warn(n, f"{img} is not on this node yet",
                   "sparkcluster up builds it on the head and sends it to the workers")
        elif ref is not None and i != ref:
            r.fail(n, f"{img} is {i[:19]} here but {ref[:19]} on {head}",
                   "run sparkcluster up: it re-sends the head's image to nodes whose image ID differs")
        else:
            r.ok(n, i[:19])


@check("image.base-same", "Base image, where present, has the same ID on every node")
def image_base_same(ctx: Context, r: Report) -> None:
    # a tag re-pushed upstream and pulled on different days is another base: the worker then holds
    # none of the cluster image's layers above the first difference, the whole image moves, and
    # anything built on each node drifts apart
    base = ctx.expect.base_image
    if not base:
        return
    ids = {n: f.base.id for n, f in ctx.facts.items() if f.docker and f.base is not None}
    if not ids:
        return
    head = ctx.inventory.head.name
    ref = ids.get(head) or sorted(ids.values())[0]
    where = head if head in ids else "another node"
    for n, i in ids.items():
        if i != ref:
            r.warn(n, f"{base} is {i[:19]} here but {ref[:19]} on {where}: the whole cluster image will move to it",
                   f"on every node: docker pull {base} (or docker save {base} on {where} and docker load it here), "
                   "then sparkcluster doctor")
        else:
            r.ok(n, i[:19])


@check("image.ray", "`ray` runs in the cluster image")
def image_ray(ctx: Context, r: Report) -> None:
    if not ctx.expect.image:
        return
    for n, f in ctx.facts.items():
        if f.image_id is None:
            continue
        if f.image_ray:
            r.ok(n, f.image_ray)
        else:
            r.fail(n, f"`ray --version` failed in {ctx.expect.image}: {f.image_ray_error}",
                   "rebuild with images/Dockerfile.vllm-ray (NGC 26.05 dropped Ray): sparkcluster up does this")


# --- control plane ------------------------------------------------------------------------------

# what a link-local address really risks (NVIDIA's two-Spark guide uses them, and they do carry
# traffic): the address is picked again at each boot, and every link-local port shares one route
LINK_LOCAL_RISK = ("it is chosen anew at each boot (so the inventory goes stale) and every port with one shares "
                   "the single 169.254.0.0/16 route, so the kernel may send the traffic out of another port")


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
            r.fail(node.name, f"control IP {ip} is link-local (169.254/16): {LINK_LOCAL_RISK}",
                   f"give {node.control_if} a static address on the link between the nodes (one /24 per cable, "
                   "e.g. 198.19.k.1 and 198.19.k.2) and put it in control_ip")
        elif any(ip in net for net in _bridge_networks(f)):
            r.fail(node.name, f"control IP {ip} is a docker bridge address",
                   f"use the address of {node.control_if} (the link between the nodes), not docker0's")
        elif iface is None:
            r.fail(node.name, f"interface {node.control_if} does not exist",
                   f"fix control_if for {node.name} in the inventory (see `ip -br addr` on the node)")
        elif ip not in [a.ip for a in iface.addresses]:
            have = ", ".join(str(a.ip) for a in iface.addresses) or "no IPv4 address"
            r.fail(node.name, f"{ip} is not on {node.control_if} ({have})",
                   f"set control_ip for {node.name} to the address of {node.control_if}, or assign {ip} to it")
        else:
            elsewhere = [o for o, of in ctx.facts.items() if o != node.name
                         and any(a.ip == ip for i in of.interfaces.values() for a in i.addresses)]
            if elsewhere:
                r.fail(node.name, f"{ip} is also configured on {', '.join(elsewhere)}",
                       "every node needs its own control IP, or vLLM sees fewer unique IPs than nodes")
            else:
                r.ok(node.name, f"{ip} on {node.control_if}")


@check("net.vllm_host_ip", "VLLM_HOST_IP equals the control IP")
def net_vllm_host_ip(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        planned = ctx.expect.per_host_env.get(node.name, {}).get("VLLM_HOST_IP")
        running = [_env(c).get("VLLM_HOST_IP") for c in ctx.ours(node.name) if _running(c)]
        values = [v for v in [planned, *running] if v is not None]
        bad = [v for v in values if v != str(node.control_ip)]
        if bad:
            where = "in the running container" if bad[0] in running else "in the profile"
            why = ""
            if ctx.expect.vllm_version:
                why = "; " + engine_traits.traits(ctx.expect.vllm_version, ctx.expect.forwarded_env).node_ip_consequence()
            r.fail(node.name, f"VLLM_HOST_IP is {bad[0]} {where}, but {node.name}'s control IP is {node.control_ip}{why}",
                   "VLLM_HOST_IP is computed per node by sparkcluster: remove it from the profile's forwarded "
                   "variables, then `sparkcluster down && sparkcluster up`")
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
            r.fail(node.name, "; ".join(problems),
                   "check the QSFP cables and `ip link set IF up`; interface names must match the inventory "
                   "(they differ between nodes when cables sit in other ports)")
        else:
            r.ok(node.name, f"{len(node.netdevs)} links up")


@check("net.mtu", "Interface MTU as expected")
def net_mtu(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        bad = [f"{n} is {f.interfaces[n].mtu}" for n in node.netdevs
               if n in f.interfaces and f.interfaces[n].mtu != node.mtu]
        if bad:
            r.fail(node.name, f"MTU {', '.join(bad)}, expected {node.mtu}",
                   f"ip link set dev IF mtu {node.mtu} (and persist it in netplan/NetworkManager) on both ends")
        elif any(n in f.interfaces for n in node.netdevs):
            r.ok(node.name, f"{node.mtu} on every data-plane link")


@check("net.path_mtu", "Path MTU on every link, both directions")
def net_path_mtu(ctx: Context, r: Report) -> None:
    # each node probes its own direction; every failing probe is named (one netdev may have several)
    for node in ctx.nodes():
        pings = ctx.facts[node.name].path_mtu
        if not pings:
            continue
        bad = [p for p in pings if not p.ok]
        if bad:
            each = "; ".join(f"{p.netdev} -> {p.peer_node} {p.peer_ip}: `{p.command}` -> {p.detail or 'no reply'}"
                             for p in bad)
            r.fail(node.name, f"{len(bad)} of {len(pings)} probe(s) drop {bad[0].size + 28}-byte frames: {each}",
                   f"set MTU {node.mtu} on both ends of each link (and on any switch between them)")
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
            for a in (i.addresses if i else []):
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
            parts.append(f"{' and '.join(ns)} ({what}) share {net}"
                         + (f": link-local, {LINK_LOCAL_RISK}" if net.subnet_of(LINK_LOCAL) else ""))
        r.fail(node.name, "; ".join(parts) + ": the kernel answers and sends on one of them only, so the other "
               "rail's RoCE traffic takes the wrong port (eugr/spark-vllm-docker#270)",
               "give each netdev its own subnet, one /24 per twin with the same /24 on the peer's twin "
               "(e.g. 198.19.1.x on enp1s0f1np1, 198.19.2.x on enP2p1s0f1np1), or remove the address from the unused one")


def _gid_v4(f: HostFacts, hca: str) -> list:
    """The HCA's RoCE v2 GIDs that carry an IPv4 address, lowest index first."""
    return [g for g in f.gids.get(hca, []) if g.roce_v2 and g.ipv4 is not None]


def gid_index(f: HostFacts, node: Node) -> int | None:
    """The one RoCE v2 IPv4 GID index every data-plane HCA of the node has, else None. An HCA the
    node lacks is rdma.hca's to report, not counted here."""
    idx = [{g.index for g in _gid_v4(f, h)} for h in node.hcas if h in f.hcas]
    common = set.intersection(*idx) if idx and all(idx) else set()
    return min(common) if common else None


@check("rdma.gid", "RoCE v2 IPv4 GID on every HCA in NCCL_IB_HCA, same index on every node")
def rdma_gid(ctx: Context, r: Report) -> None:
    found: dict[str, int] = {}
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        if not any(h in f.hcas for h in node.hcas):
            continue  # none of its HCAs exist: rdma.hca says so
        problems = []
        for link in node.data_plane:
            i = f.interfaces.get(link.netdev)
            if i is not None and i.up and not i.addresses:
                problems.append(f"{link.hca}: its netdev {link.netdev} is up without an IPv4 address, so the HCA "
                                "has no RoCE v2 IPv4 GID")
            elif link.hca in f.hcas and not _gid_v4(f, link.hca):
                kinds = sorted({g.type for g in f.gids.get(link.hca, [])}) or ["an empty GID table"]
                problems.append(f"{link.hca} has no RoCE v2 IPv4 GID (has {', '.join(kinds)})")
        if problems:
            r.fail(node.name, "; ".join(problems),
                   "give each data-plane netdev a static IPv4 address (the kernel then adds the RoCE v2 GID), "
                   "or drop the HCA from data_plane; check with `cat /sys/class/infiniband/HCA/ports/1/gid_attrs/types/3`")
            continue
        idx = gid_index(f, node)
        if idx is None:
            per = ", ".join(f"{h}: {sorted(g.index for g in _gid_v4(f, h))}" for h in node.hcas if h in f.hcas)
            r.fail(node.name, f"no one GID index holds a RoCE v2 IPv4 GID on every HCA ({per})",
                   "NCCL_IB_GID_INDEX is one number for all HCAs: configure the addresses alike on every port")
            continue
        found[node.name] = idx
    head = ctx.inventory.head.name
    ref = found.get(head, next(iter(found.values()), None))
    for node in ctx.nodes():
        if node.name not in found:
            continue
        idx = found[node.name]
        if idx != ref:
            r.fail(node.name, f"RoCE v2 IPv4 GID index is {idx} here but {ref} on {head}: one NCCL_IB_GID_INDEX "
                              "cannot serve both", "configure the data-plane addresses alike on every node "
                                                   "(an extra address or IPv6 on one node shifts the index)")
        elif node.gid_index is not None and node.gid_index != idx:
            r.fail(node.name, f"the inventory's gid_index {node.gid_index} (NCCL_IB_GID_INDEX) is not the RoCE v2 "
                              f"IPv4 GID, which sits at index {idx}",
                   f"set gid_index = {idx} for {node.name} in the inventory, then sparkcluster down && sparkcluster up")
        else:
            r.ok(node.name, f"index {idx} on {', '.join(h for h in node.hcas if h in f.hcas)}")


@check("net.speed", "Data-plane links at full rate")
def net_speed(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        known = {link.netdev: f.interfaces[link.netdev].speed_mbps for link in node.data_plane
                 if link.netdev in f.interfaces and f.interfaces[link.netdev].speed_mbps}
        if not known:
            continue
        slow = [f"{link.hca}/{link.netdev} at {known[link.netdev] // 1000} Gb/s" for link in node.data_plane
                if known.get(link.netdev, CX7_SPEED_MBPS) < CX7_SPEED_MBPS]
        if slow:
            r.warn(node.name, f"rail {'; rail '.join(slow)}, below {CX7_SPEED_MBPS // 1000} Gb/s: NCCL runs every "
                              "rail at the pace of the slowest",
                   "reseat or replace the cable of that port; if the link is 200G but slow, update the firmware "
                   "(older BIOS wires the second controller at PCIe Gen5 x2: fwupdmgr update)")
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
            if nets and not any(a.network in nets for of in others for oi in of.interfaces.values() for a in oi.addresses):
                problems.append(f"{n} ({', '.join(map(str, sorted(nets)))}) has a cable but no cluster node has an "
                                "address on its subnet: its far end is another machine")
        for p in f.path_mtu:
            if p.peer_mac and p.peer_node in ctx.facts and p.peer_mac not in macs:
                problems.append(f"{p.peer_ip} on {p.netdev} is answered by {p.peer_mac}, which is no port of a cluster "
                                f"node (not {p.peer_node})")
        if problems:
            # on a data-plane port NCCL would talk to a stranger: that cannot work; elsewhere it is a note
            report = r.fail if any(f" on {n} " in p for p in problems for n in node.netdevs) else r.warn
            report(node.name, "; ".join(dict.fromkeys(problems)),
                   "a port cabled to a third machine must stay out of data_plane (NCCL_IB_HCA) and off the cluster's "
                   "subnets; cable the data plane node to node")
        else:
            r.ok(node.name, "every cabled port reaches a cluster node")


@check("net.default_route", "Default route not on a ConnectX-7 port")
def net_default_route(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        bad = [d for d in f.default_routes if d in node.netdevs or d == node.control_if or is_cx7(d)]
        if bad:
            r.warn(node.name, f"the default route leaves by {', '.join(dict.fromkeys(bad))}, a ConnectX-7 port: "
                              "internet traffic (model downloads, pip) competes with NCCL, and the data plane "
                              "depends on a gateway",
                   "route the default through the 10 GbE/Wi-Fi port (`ip route`; in netplan drop `gateway4`/"
                   "`routes: to: default` from the QSFP interfaces)")
        else:
            r.ok(node.name, f"via {', '.join(f.default_routes) or 'no default route'}")


def _subnets(f: HostFacts, netdev: str) -> set:
    i = f.interfaces.get(netdev)
    return {a.network for a in i.addresses} if i else set()


@check("rdma.hca", "RoCE HCAs for NCCL_IB_HCA: present, ACTIVE, on the right netdev")
def rdma_hca(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
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
        crossed = []
        head = ctx.inventory.head
        if node.name != head.name and head.name in ctx.facts:
            hf = ctx.facts[head.name]
            for k, mine in enumerate(node.data_plane):
                a = _subnets(f, mine.netdev)
                peer = [j for j, ref in enumerate(head.data_plane) if a & _subnets(hf, ref.netdev)]
                if peer and k not in peer:
                    ref = head.data_plane[peer[0]]
                    crossed.append(f"entry {k + 1} {mine.hca}/{mine.netdev} is cabled to {head.name}'s entry {peer[0] + 1} "
                                   f"{ref.hca}/{ref.netdev} ({', '.join(map(str, sorted(a)))}), not to its entry {k + 1}")
        problems += crossed
        if problems:
            # every HCA's state, so a cable in the other port shows at a glance
            mapping = ", ".join(f"{h.name}->{'/'.join(h.netdevs)} {h.state or '?'}" for h in f.hcas.values()) or "none found"
            moved = _other_port_active(f, node, down)
            if moved:
                problems.append(f"likely cause: the cable sits in the other port ({', '.join(moved)} ACTIVE, not in data_plane)")
            fix = ("fix data_plane for this node in the inventory (`ibdev2netdev` on the node shows the pairs); "
                   "NCCL pairs HCAs by list position, one wrong entry gives ibv_modify_qp timeouts")
            if crossed and len(crossed) == len(problems):
                fix = (f"order data_plane for {node.name} as its ports are cabled: entry k must share a subnet with "
                       f"{head.name}'s entry k (`ip -br addr` on both nodes); NCCL pairs HCAs by list position")
            elif down and moved and len(down) + 1 == len(problems):
                fix = (f"move the cable to the port data_plane names, or run `sparkcluster init` again to list "
                       f"{', '.join(moved)} instead (NCCL pairs HCAs by list position)")
            elif down and len(down) == len(problems):
                # the pairing is right, the port is not up: the inventory is not what to change
                fix = (f"bring the RoCE port up: check the cable of {', '.join(link.netdev for link in down)} and "
                       "`ip link set IF up` (`ibdev2netdev` must show it Up, port state 4: ACTIVE)")
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


# --- memory -------------------------------------------------------------------------------------

@check("mem.headroom", "MemAvailable covers the profile's memory")
def mem_headroom(ctx: Context, r: Report) -> None:
    frac = ctx.expect.gpu_memory_utilization
    for n, f in ctx.facts.items():
        if not f.mem:
            continue
        if any(_running(c) for c in ctx.ours(n)):
            # already serving: the model's memory is in use, MemAvailable is what is left
            need = 0
        else:
            need = int((frac or 0) * f.mem.total)
        left = f.mem.available - need
        detail = f"MemAvailable {_gib(f.mem.available)}" + (f", profile needs {_gib(need)}, leaves {_gib(left)}" if need else "")
        if left < 0:
            r.fail(n, detail, "lower gpu_memory_utilization in the profile or free memory on the node "
                              "(MemAvailable, not MemFree, is what counts; drop caches with `sync; echo 3 > /proc/sys/vm/drop_caches`)")
        elif left < MEM_HEADROOM_FLOOR:
            r.warn(n, detail + " (under the 6 GiB floor)",
                   "lower gpu_memory_utilization (0.70-0.80 survives on unified memory) or stop other work on the node")
        else:
            r.ok(n, detail)


@check("mem.earlyoom", "earlyoom running")
def mem_earlyoom(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        if f.earlyoom:
            r.ok(n, "running")
        else:
            r.warn(n, "earlyoom is not running: a memory spike can freeze the host until sshd stops answering",
                   "apt install earlyoom && systemctl enable --now earlyoom")


@check("mem.sshd_oom", "sshd protected from the OOM killer")
def mem_sshd_oom(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        v = f.sshd_oom_score_adj
        if v is not None and v < 0:
            r.ok(n, f"oom_score_adj {v}")
        else:
            r.warn(n, f"sshd oom_score_adj is {v if v is not None else 'unknown'}",
                   "systemctl edit ssh: [Service] OOMScoreAdjust=-1000, then systemctl restart ssh")


# --- ports, stale state, disk, clock ------------------------------------------------------------

def _env(c: dict) -> dict[str, str]:
    return dict(e.split("=", 1) for e in (c.get("Config", {}).get("Env") or []) if "=" in e)


def _running(c: dict) -> bool:
    return bool(c.get("State", {}).get("Running"))


@check("ports.free", "Ray and API ports free or ours")
def ports_free(ctx: Context, r: Report) -> None:
    wanted = {ctx.inventory.cluster.ray_port: "Ray GCS", ctx.inventory.cluster.api_port: "vLLM API"}
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        ours = {c.get("Id", "") for c in ctx.ours(node.name)}
        bad = []
        for ls in f.listeners:
            if ls.port not in wanted:
                continue
            if ls.container and ls.container in ours:
                continue
            who = f"{ls.process} (pid {ls.pid})" if ls.pid else ls.process
            where = f" in container {ls.container[:12]}" if ls.container else ""
            bad.append(f"{ls.port} ({wanted[ls.port]}) is held by {who}{where}")
        if bad:
            r.fail(node.name, "; ".join(sorted(set(bad))),
                   "stop that process or container yourself (sparkcluster never kills what it did not start); "
                   "a stale Ray head from an earlier run: sparkcluster down --purge-gcs")
        else:
            r.ok(node.name, ", ".join(str(p) for p in wanted))


@check("ray.stale", "No stale Ray containers or sessions")
def ray_stale(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        f = ctx.facts[node.name]
        ours = {c.get("Id", "") for c in ctx.ours(node.name)}
        foreign = [c for c in f.containers if c.state == "running" and c.id not in ours and "ray start" in c.command
                   and CLUSTER_LABEL not in c.labels]
        exited = [c.get("Name", "").lstrip("/") for c in ctx.ours(node.name) if not _running(c)]
        if foreign:
            r.fail(node.name, f"Ray runs in a container sparkcluster did not start: {', '.join(c.name for c in foreign)}",
                   f"stop it if it is yours to stop (docker rm -f {foreign[0].name}); two Ray heads cannot share port 6379")
        elif exited:
            r.warn(node.name, f"stopped sparkcluster container(s) left behind: {', '.join(exited)}",
                   "sparkcluster down --purge-gcs")
        elif f.ray_sessions and not any(_running(c) for c in ctx.ours(node.name)):
            r.warn(node.name, f"{len(f.ray_sessions)} Ray session dir(s) in /tmp/ray with no Ray running",
                   "sparkcluster down --purge-gcs removes them")
        else:
            r.ok(node.name)


@check("disk.free", "Free disk for the image and the model cache")
def disk_free(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        if not f.disks:
            continue
        root = f.docker.root_dir if f.docker else "/var/lib/docker"
        # df reports each path's mount point; the docker root is the first line, the HF cache the last
        disks = list(f.disks.values())
        docker_disk, cache_disk = disks[0], disks[-1]
        image_ready = f.image_id is not None
        problems = []
        if not image_ready and docker_disk.available < ctx.expect.image_disk_bytes:
            problems.append(f"{root} has {_gib(docker_disk.available)} free, the image needs {_gib(ctx.expect.image_disk_bytes)}")
        if cache_disk.available < ctx.expect.model_disk_bytes:
            problems.append(f"{cache_disk.mount} has {_gib(cache_disk.available)} free, the model needs {_gib(ctx.expect.model_disk_bytes)}")
        if problems:
            r.fail(n, "; ".join(problems), "free space (docker system prune, old models in the HF cache) on this node")
        else:
            r.ok(n, f"{_gib(docker_disk.available)} free for images")


@check("clock.skew", "Clocks agree")
def clock_skew(ctx: Context, r: Report) -> None:
    offsets = {n: f.clock_offset for n, f in ctx.facts.items() if f.clock_offset is not None}
    if len(offsets) < 2:
        return
    head = ctx.inventory.head.name
    ref = offsets.get(head, next(iter(offsets.values())))
    for n, off in offsets.items():
        skew = abs(off - ref)
        if skew > 30:
            r.fail(n, f"clock is {skew:.1f}s off {head}", "enable NTP on both nodes (timedatectl set-ntp true)")
        elif skew > 1:
            r.warn(n, f"clock is {skew:.1f}s off {head}", "enable NTP on both nodes (timedatectl set-ntp true)")
        else:
            r.ok(n, f"{skew * 1000:.0f} ms")


# --- running containers -------------------------------------------------------------------------

@check("containers.forwarded_env", "Forwarded variables present and equal in every container")
def containers_forwarded_env(ctx: Context, r: Report) -> None:
    want = ctx.expect.forwarded_env
    for node in ctx.nodes():
        running = [c for c in ctx.ours(node.name) if _running(c)]
        if not running or not want:
            continue
        env = _env(running[0])
        missing = [k for k in want if k not in env]
        wrong = [k for k in want if k in env and env[k] != want[k]]
        if missing or wrong:
            detail = "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                           f"different {', '.join(wrong)}" if wrong else "") if x)
            r.fail(node.name, detail + " in the container (set at its start)",
                   "these must be in every container at start; docker exec -e reaches rank 0 only: "
                   "sparkcluster down && sparkcluster up")
        else:
            r.ok(node.name, f"{len(want)} variables")


@check("containers.per_host_env", "Per-host variables right for each node")
def containers_per_host_env(ctx: Context, r: Report) -> None:
    for node in ctx.nodes():
        running = [c for c in ctx.ours(node.name) if _running(c)]
        want = ctx.expect.per_host_env.get(node.name, {})
        if not running or not want:
            continue
        env = _env(running[0])
        # VLLM_HOST_IP is judged by net.vllm_host_ip (with its own fix); not reported twice
        wrong = [f"{k}={env.get(k, '(unset)')} (want {v})" for k, v in want.items()
                 if k != "VLLM_HOST_IP" and env.get(k) != v]
        if wrong:
            r.fail(node.name, "; ".join(wrong),
                   "per-host values come from the inventory; fix it, then sparkcluster down && sparkcluster up")
        else:
            r.ok(node.name, f"{len(want)} variables")


FLAG_KEYS = ("Devices", "CapAdd", "Ulimits", "NetworkMode", "IpcMode", "ShmSize", "DeviceRequests", "Memory", "Privileged")


def container_flags(c: dict) -> dict[str, object]:
    hc = c.get("HostConfig", {}) or {}
    flags = {k: hc.get(k) for k in FLAG_KEYS}
    flags["Devices"] = sorted((d.get("PathOnHost"), d.get("PathInContainer")) for d in (flags["Devices"] or []))
    # the docker CLI stores --cap-add=IPC_LOCK as "CAP_IPC_LOCK", the Engine API as given: same flag
    flags["CapAdd"] = sorted(c.upper().removeprefix("CAP_") for c in (flags["CapAdd"] or []))
    flags["Ulimits"] = sorted((u.get("Name"), u.get("Soft"), u.get("Hard")) for u in (flags["Ulimits"] or []))
    flags["DeviceRequests"] = sorted(str(sorted((k, str(v)) for k, v in d.items())) for d in (flags["DeviceRequests"] or []))
    return flags


@check("containers.flags", "Docker flags identical on every node")
def containers_flags(ctx: Context, r: Report) -> None:
    per_node = {}
    for node in ctx.nodes():
        running = [c for c in ctx.ours(node.name) if _running(c)]
        if running:
            per_node[node.name] = container_flags(running[0])
    if not per_node:
        return
    head = ctx.inventory.head.name
    ref = per_node.get(head) or next(iter(per_node.values()))
    want = ctx.expect.container_flags
    for n, flags in per_node.items():
        # a --memory cap is judged on each node by itself: one on the head must not fail the worker
        diff = [k for k in FLAG_KEYS if k != "Memory" and flags.get(k) != ref.get(k)]
        unexpected = [k for k, v in want.items() if flags.get(k) != v]
        if flags.get("Memory"):
            r.fail(n, f"the container has a --memory cap ({flags['Memory']} bytes)",
                   "never cap memory on unified-memory Sparks: sparkcluster down && sparkcluster up")
        elif diff or unexpected:
            keys = sorted(set(diff + unexpected))
            r.fail(n, f"{', '.join(keys)} differ from {head if diff else 'what the profile needs'}",
                   "the worker once lacked --device/--cap-add/--ulimit and NCCL fell back to TCP silently: "
                   "sparkcluster down && sparkcluster up recreates both with identical flags")
        else:
            r.ok(n, "identical")


# --- running them -------------------------------------------------------------------------------

def run_checks(ctx: Context, only: set[str] | None = None) -> list[Result]:
    results = []
    names = [n.name for n in ctx.inventory.nodes]
    for cid, _title, fn in REGISTRY:
        if only is not None and cid not in only:
            continue
        got = {r.node: r for r in fn(ctx)}
        for n in names:
            results.append(got.get(n) or Result(cid, n, "skip", "unreachable" if n in ctx.unreachable else ""))
    return results


def titles() -> dict[str, str]:
    return {cid: title for cid, title, _ in REGISTRY}


__all__ = ["Result", "Expect", "Context", "REGISTRY", "run_checks", "titles", "container_flags", "ROLE_LABEL"]
