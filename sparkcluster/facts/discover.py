"""Discovery for `sparkcluster init`: what each host has, and a draft inventory from it.

One small script per host (hostname, GPUs, `ip -j addr`, RoCE HCAs and their netdevs) over the
same strict-host-key SSH as every other command; everything after that is pure functions over the
parsed output, so it is unit-tested without hosts. The draft is written as TOML by hand (no TOML
writer is installed) and parsed back with `inventory.parse` before anything is written.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from sparkcluster.config import inventory
from sparkcluster.config.topology import Miscabled, Topology, classify
from sparkcluster.errors import InputError, SparkError
from sparkcluster.facts import access, parsers, probes
from sparkcluster.remote import fanout, ssh

LINK_LOCAL, DOCKER_DEFAULT_BRIDGE = probes.LINK_LOCAL, probes.DOCKER_DEFAULT_BRIDGE
_NAME = re.compile(inventory._NAME)
HEADER = "draft: review before use"


def discovery_script() -> str:
    """Read-only: nothing here changes the host."""
    return probes.script(
        [probes.HOSTNAME, probes.GPU, probes.IP, probes.HCA, probes.GIDS, access.ACCOUNT, probes.MEMINFO]
    )


@dataclass
class Discovered:
    target: str  # the ssh target the user gave
    hostname: str = ""
    gpus: list[parsers.Gpu] = field(default_factory=list)
    gpu_error: str = ""
    interfaces: dict[str, parsers.Interface] = field(default_factory=dict)
    hcas: dict[str, parsers.Hca] = field(default_factory=dict)
    gids: dict[str, list[parsers.Gid]] = field(default_factory=dict)
    account: access.Account | None = None  # the SSH user: its home holds the default HF cache
    mem_total: int = 0  # MemTotal in bytes (a 128 GB or a 64 GB Spark), 0 when unread


def parse_discovery(target: str, text: str) -> Discovered:
    s = probes.split_sections(text)
    d = Discovered(target, hostname=probes.output(probes.HOSTNAME, s))
    d.gpus = probes.value(probes.GPU, s, d.gpus)
    d.gpu_error = probes.failure(probes.GPU, s, "nvidia-smi")
    d.interfaces = probes.value(probes.IP, s, d.interfaces)
    d.hcas = probes.output(probes.HCA, s)
    d.gids = probes.output(probes.GIDS, s)
    d.account = probes.value(access.ACCOUNT, s)
    mem = probes.value(probes.MEMINFO, s)
    d.mem_total = mem.total if mem else d.mem_total
    return d


# --- pure choices -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    netdev: str
    hca: str
    addresses: tuple[parsers.Address, ...]  # usable IPv4 (no link-local, no docker bridge)
    mtu: int


def _hca_order(name: str) -> tuple[str, str]:
    # rocep1s0f0, rocep1s0f1, roceP2p1s0f0, roceP2p1s0f1: by port, not by ASCII case
    return name.lower(), name


def usable(addr: parsers.Address) -> bool:
    return addr.ip not in LINK_LOCAL and addr.ip not in DOCKER_DEFAULT_BRIDGE


def data_links(d: Discovered) -> tuple[list[Link], list[str]]:
    """HCA-to-netdev pairs, in HCA order: every ACTIVE RoCE HCA whose netdev exists. Also notes on
    what was left out, for the draft's comments."""
    links, notes = [], []
    for name in sorted(d.hcas, key=_hca_order):
        h = d.hcas[name]
        netdev = next((n for n in h.netdevs if n in d.interfaces), None)
        if netdev is None:
            notes.append(f"{name}: no netdev ({', '.join(h.netdevs) or 'none listed'}): left out")
            continue
        if not h.active:
            notes.append(f"{name} on {netdev}: port is '{h.state or 'unknown'}', not ACTIVE: left out (cable?)")
            continue
        iface = d.interfaces[netdev]
        links.append(Link(netdev, name, tuple(a for a in iface.addresses if usable(a)), iface.mtu))
    return links, notes


def _link_local(d: Discovered, netdev: str) -> list[parsers.Address]:
    i = d.interfaces.get(netdev)
    return [a for a in (i.addresses if i else []) if a.ip in LINK_LOCAL]


def addressed_links(found: list[Discovered], per_host: list[list[Link]]) -> list[tuple[list[Link], list[str]]]:
    """Of each host's ACTIVE links, those NCCL can use: a static IPv4 address on a subnet another host
    also has (a RoCE v2 IPv4 GID needs the address; a cable or rail needs both ends), one port per subnet
    (twins on one subnet break routing, eugr/spark-vllm-docker#270). The rest are left out, each with
    a note for the draft saying why."""
    nets = [{a.network for x in links for a in x.addresses} for links in per_host]
    out = []
    for i, (d, links) in enumerate(zip(found, per_host)):
        others = [n for j, n in enumerate(nets) if j != i]
        kept, notes, seen = [], [], {}
        for x in links:
            ll = _link_local(d, x.netdev)
            if not x.addresses:
                why = (
                    f"only link-local {', '.join(f'{a.ip}/{a.network.prefixlen}' for a in ll)}"
                    if ll
                    else "up without an IPv4 address"
                )
                notes.append(
                    f"{x.hca} on {x.netdev}: {why}: left out (NCCL needs a RoCE v2 IPv4 GID, which comes "
                    "from a static address; give it one on a /24 of its own to use this rail)"
                )
                continue
            shared = [a for a in x.addresses if any(a.network in n for n in others)]
            if not shared:
                notes.append(
                    f"{x.hca} on {x.netdev}: {', '.join(str(a.network) for a in x.addresses)} is on no other "
                    "host: left out (the far end has no address there, or the port is cabled elsewhere)"
                )
                continue
            twin = next((seen[a.network] for a in shared if a.network in seen), None)
            if twin is not None:
                notes.append(
                    f"{x.hca} on {x.netdev}: shares {shared[0].network} with {twin}: left out (one subnet per "
                    "netdev, or the kernel sends both rails' traffic out of one port; eugr/spark-vllm-docker#270)"
                )
                continue
            for a in shared:
                seen[a.network] = x.netdev
            kept.append(x)
        out.append((kept, notes))
    return out


def link_local_error(found: list[Discovered], per_host: list[list[Link]]) -> SparkError:
    """Every ACTIVE port carries only link-local addresses (NVIDIA's default): say what was found and
    why a static scheme is proposed instead."""
    seen = "; ".join(
        f"{d.target}: "
        + ", ".join(f"{x.netdev} {a.ip}/{a.network.prefixlen}" for x in links for a in _link_local(d, x.netdev))
        for d, links in zip(found, per_host)
    )
    twins = sorted({x.netdev for links in per_host for x in links}, key=str.lower)  # port order
    scheme = ", ".join(f"{nd} 198.19.{k + 1}.N/24" for k, nd in enumerate(twins))
    return SparkError(
        f"the ConnectX-7 ports have only link-local addresses ({seen}): they work for a quick test, but "
        "they are picked anew at each boot (so an inventory naming them goes stale) and every port "
        "shares the one 169.254.0.0/16 route, so traffic can leave by the wrong port",
        f"give each port a static address on a /24 of its own, N = 1 on the head, 2 on the worker "
        f"({scheme}), e.g. with netplan, then run init again",
    )


def node_gid_index(d: Discovered, links: list[Link]) -> int | None:
    """The one GID index holding a RoCE v2 IPv4 GID on every chosen HCA of this host, else None. Each
    host has its own: the index may differ between nodes (issue 24), NCCL_IB_GID_INDEX is per node."""
    sets = [{g.index for g in d.gids.get(x.hca, []) if g.roce_v2 and g.ipv4 is not None} for x in links]
    common = set.intersection(*sets) if sets and all(sets) else set()
    return min(common) if common else None


@dataclass(frozen=True)
class Control:
    netdev: str
    ip: ipaddress.IPv4Address
    network: ipaddress.IPv4Network
    mtu: int


def choose_control(chosen: list[list[Link]], found: list[Discovered]) -> list[Control]:
    """One control link per host (head first). The first head data-plane link (in HCA order) with an
    IPv4 address on a subnet every other host has on a data-plane link; where no data-plane subnet
    reaches every host (a ring or a mesh: each cable joins two), the first other interface whose
    subnet every host has (the LAN, as owners of rings run Ray and vLLM's control traffic)."""

    def lan(d: Discovered, data: list[Link]) -> list[Link]:
        return [
            Link(n, "", tuple(a for a in i.addresses if usable(a)), i.mtu)
            for n, i in sorted(d.interfaces.items())
            if n not in {x.netdev for x in data} and n != "lo" and i.up and not n.startswith(("docker", "br-", "veth"))
        ]

    for candidates in (chosen, [lan(d, data) for d, data in zip(found, chosen)]):
        for link in candidates[0]:
            for addr in link.addresses:
                picks = []
                for wl in candidates[1:]:
                    match = next(
                        ((x, a) for x in wl for a in x.addresses if a.network == addr.network and a.ip != addr.ip), None
                    )
                    if match is None:
                        break
                    picks.append(Control(match[0].netdev, match[1].ip, match[1].network, match[0].mtu))
                else:
                    return [Control(link.netdev, addr.ip, addr.network, link.mtu), *picks]
    raise SparkError(
        "no subnet is shared by the head and every worker, on the ConnectX-7 links or any other",
        "give the ConnectX-7 links static IPv4 addresses, one subnet per cable (e.g. 198.19.k.1/24 "
        "and 198.19.k.2/24), and for a ring put every node on one LAN subnet; then run init again",
    )


def topology_of(names: list[str], chosen: list[list[Link]]) -> Topology:
    """The cabling the chosen links' subnets describe (config/topology), as a SparkError when they fit none."""
    try:
        return classify({n: [a.network for x in links for a in x.addresses] for n, links in zip(names, chosen)})
    except Miscabled as e:
        raise SparkError(
            f"the data-plane cabling fits no topology sparkcluster knows: {e}",
            "cable a pair directly, three to eight nodes through a switch (every rail on every node), "
            "three as a mesh or four or more as a ring (each cable a subnet of its own); then run "
            "init again",
        ) from None


def node_names(found: list[Discovered]) -> list[str]:
    """Each host's hostname when it is a valid, unique node name; else spark-head / spark-worker-N."""
    names: list[str] = []
    for i, d in enumerate(found):
        fallback = "spark-head" if i == 0 else ("spark-worker" if len(found) == 2 else f"spark-worker-{i}")
        name = d.hostname if _NAME.match(d.hostname or "") else fallback
        if name in names:
            name = fallback if fallback not in names else f"{fallback}-{i}"
        names.append(name)
    return names


@dataclass
class DraftNode:
    name: str
    role: str
    ssh: str
    control: Control
    links: list[Link]
    gpus: int
    comments: list[str] = field(default_factory=list)
    gid_index: int | None = None
    memory_gb: float | None = None  # MemTotal in GB (10^9), what lint judges a profile against


@dataclass
class Draft:
    name: str
    nodes: list[DraftNode]
    ssh_config: Path | None = None
    known_hosts: Path | None = None
    topology: Topology | None = None


def draft(name: str, found: list[Discovered], ssh_config: Path | None = None, known_hosts: Path | None = None) -> Draft:
    """found[0] is the head, the rest are workers."""
    if len(found) == 1:
        return _draft_one(name, found[0], ssh_config, known_hosts)
    per_host = [data_links(d) for d in found]
    for d, (links, notes) in zip(found, per_host):
        if not links:
            raise SparkError(
                f"{d.target}: no ACTIVE RoCE HCA with a netdev found"
                + (f" ({'; '.join(notes)})" if notes else " (/sys/class/infiniband is empty)"),
                "check the QSFP cables and that the ConnectX-7 driver (mlx5_ib) is loaded "
                "(`ibdev2netdev` on the host shows the pairs)",
            )
    active = [links for links, _ in per_host]
    usable_per_host = addressed_links(found, active)
    if all(not kept for kept, _ in usable_per_host) and any(
        _link_local(d, x.netdev) for d, links in zip(found, active) for x in links
    ):
        raise link_local_error(found, active)
    for d, (kept, left_out) in zip(found, usable_per_host):
        if not kept:
            raise SparkError(
                f"{d.target}: no ACTIVE ConnectX-7 port has a static IPv4 address on a subnet the other "
                f"host(s) share ({'; '.join(left_out)})",
                "give the ConnectX-7 links static IPv4 addresses, one subnet per cable (e.g. 198.19.k.1/24 "
                "and 198.19.k.2/24), then run init again",
            )
    chosen = [kept for kept, _ in usable_per_host]
    names = node_names(found)
    cabling = topology_of(names, chosen)
    nodes = []
    for i, (d, (_, notes), (links, left_out), ctl, nm) in enumerate(
        zip(found, per_host, usable_per_host, choose_control(chosen, found), names)
    ):
        comments = list(notes) + left_out
        gid = node_gid_index(d, links)
        lacking = [x.hca for x in links if not any(g.roce_v2 and g.ipv4 is not None for g in d.gids.get(x.hca, []))]
        if d.gids and lacking:
            comments.append(
                f"{', '.join(lacking)} has no RoCE v2 IPv4 GID yet (doctor's rdma.gid checks it; NCCL picks "
                "each HCA's GID index itself at every start)"
            )
        comments.append(_gpu_comment(d))
        nodes.append(
            DraftNode(
                nm,
                "head" if i == 0 else "worker",
                d.target,
                ctl,
                links,
                max(1, len(d.gpus)),
                comments,
                gid,
                round(d.mem_total / 1e9, 1) if d.mem_total else None,
            )
        )
    if cabling.kind == "ring":  # the inventory lists a ring's nodes in cable order, the head first
        nodes = [next(n for n in nodes if n.name == name) for name in cabling.order]
    return Draft(name, nodes, ssh_config, known_hosts, cabling)


def _gpu_comment(d: Discovered) -> str:
    if d.gpus:
        g = d.gpus[0]
        return f"GPU: {len(d.gpus)} x {g.name}, driver {g.driver}, compute capability {g.compute_cap}"
    return f"GPU: nvidia-smi found none ({d.gpu_error or 'no output'}); gpus = 1 assumed: check the driver"


def _draft_one(name: str, d: Discovered, ssh_config: Path | None, known_hosts: Path | None) -> Draft:
    """One Spark: no cable, so no data-plane subnet to share. Its ConnectX-7 ports are listed as found
    (ACTIVE ones, else every one with a netdev: a port waiting for a second Spark is down), and the
    control address is its LAN's, where clients and its own Ray and vLLM reach it."""
    links, notes = data_links(d)
    if not links:
        links = [
            Link(nd, hca, tuple(a for a in d.interfaces[nd].addresses if usable(a)), d.interfaces[nd].mtu)
            for hca in sorted(d.hcas, key=_hca_order)
            for nd in [next((n for n in d.hcas[hca].netdevs if n in d.interfaces), None)]
            if nd is not None
        ]
        notes = ["no ConnectX-7 port is ACTIVE (no cable): listed for a second Spark, unused by one"] if links else []
    if not links:
        raise SparkError(
            f"{d.target}: no RoCE HCA with a netdev found (/sys/class/infiniband lists none)",
            "check that the ConnectX-7 driver (mlx5_ib) is loaded (`ibdev2netdev` on the host shows the pairs)",
        )
    bare = [Link(x.netdev, x.hca, (), x.mtu) for x in links]  # the LAN first: data-plane ports are not it
    try:
        control = choose_control([bare], [d])[0]
    except SparkError:
        control = choose_control([links], [d])[0]
    comments = [*notes, _gpu_comment(d)]
    nm = node_names([d])[0]
    node = DraftNode(nm, "head", d.target, control, links, max(1, len(d.gpus)), comments, node_gid_index(d, links))
    return Draft(name, [node], ssh_config, known_hosts, topology_of([nm], [links]))


# --- TOML ---------------------------------------------------------------------------------------


def _s(v: object) -> str:
    """A TOML basic string (JSON string escapes are valid TOML)."""
    return json.dumps(str(v), ensure_ascii=False)


def to_toml(dr: Draft, when: str = "") -> str:
    lines = [
        f"# sparkcluster inventory -- {HEADER}.",
        f"# Written by `sparkcluster init`{' on ' + when if when else ''} from what the hosts reported.",
        "# Review before use:",
        "#  - control_if / control_ip: the first data-plane link (in HCA order) with an IPv4 address on a",
        "#    subnet the head and the worker(s) share (in a ring or mesh, where each cable joins two nodes,",
        "#    a LAN subnet every node has). Ray and vLLM register this address (VLLM_HOST_IP).",
        "#  - data_plane: every ACTIVE RoCE HCA whose netdev has a static IPv4 address on a subnet of its",
        "#    own that the other node(s) share, in HCA order; the comments say why any other was left out. "
        "NCCL pairs HCAs",
        "#    by list position (NCCL_IB_HCA). Names can differ between nodes when cables sit in other ports.",
        "#  - mtu: the control link's MTU as found; every data-plane link is checked against it.",
        "#  - no gid_index: NCCL finds each HCA's RoCE v2 IPv4 GID itself at every start (a pinned",
        "#    NCCL_IB_GID_INDEX goes stale when reboots move the GID table).",
        "",
        "[cluster]",
        f"name = {_s(dr.name)}",
    ]
    if dr.ssh_config:
        lines.append(f"ssh_config = {_s(dr.ssh_config)}")
    if dr.known_hosts:
        lines.append(f"known_hosts = {_s(dr.known_hosts)}")
    if dr.topology is not None and len(dr.nodes) > 1:
        lines += [
            f"# cabling: {dr.topology.kind}, from the data-plane subnets: {dr.topology.why}",
            f"topology = {_s(dr.topology.kind)}",
        ]
    for n in dr.nodes:
        lines += ["", "[[nodes]]"]
        lines += [f"# {c}" for c in n.comments]
        lines += [
            f"name = {_s(n.name)}",
            f"role = {_s(n.role)}",
            f"ssh = {_s(n.ssh)}",
            f"# review: control plane on {n.control.network}",
            f"control_if = {_s(n.control.netdev)}",
            f"control_ip = {_s(n.control.ip)}",
            f"mtu = {n.control.mtu}",
            f"gpus = {n.gpus}",
        ]
        if n.memory_gb:
            lines.append(f"memory_gb = {n.memory_gb}  # MemTotal as read here: what `profile lint` judges against")
        lines += ["data_plane = ["]
        for link in n.links:
            where = ", ".join(f"{a.ip}/{a.network.prefixlen}" for a in link.addresses) or "no IPv4 address"
            lines.append(f"  {{ netdev = {_s(link.netdev)}, hca = {_s(link.hca)} }},  # {where}, MTU {link.mtu}")
        lines.append("]")
    return "\n".join(lines) + "\n"


def render(dr: Draft, source: str, when: str = "") -> tuple[str, inventory.Inventory]:
    """The TOML text and the inventory it parses back to (InputError if it would not load)."""
    text = to_toml(dr, when)
    return text, inventory.parse(text, source=source)


# --- I/O: connect and run the script ------------------------------------------------------------


def provisional_node(target: str, role: str, index: int) -> inventory.Node:
    """A Node good enough for ssh.connect (which uses only name and ssh) before anything is known;
    named after the target's host so messages say which host they are about."""
    m = inventory._TARGET.match(target)
    if not m:
        raise InputError(
            f"--{role} {target!r} is not an ssh config alias or user@host[:port]",
            "pass a Host alias from your ssh config, or user@host[:port]",
        )
    host = m.group("host").strip("[]")
    name = host if _NAME.match(host) else (f"worker-{index}" if role == "worker" else "head")
    try:
        return inventory.Node.model_validate(
            {
                "name": name,
                "role": role,
                "ssh": target,
                "control_if": "unknown",
                "control_ip": "192.0.2.1",  # TEST-NET-1: a placeholder, never used (the facts tell)
                "data_plane": [{"netdev": "unknown", "hca": "unknown"}],
            }
        )
    except ValidationError as e:  # the target itself (an over-long host name)
        lines = inventory.describe_validation_error(f"--{role} {target[:40]!r}", e)
        raise InputError(lines[0], "pass a Host alias from your ssh config, or user@host[:port]") from None


def discover_hosts(targets: list[str], settings: ssh.Settings, timeout: float = 30.0) -> list[Discovered]:
    """targets[0] is the head. Connects to all at once (strict host keys), runs the script, closes."""
    nodes = [provisional_node(t, "head" if i == 0 else "worker", i) for i, t in enumerate(targets)]
    seen: set[str] = set()
    for i, n in enumerate(nodes):  # user@h:22 and h:2222 are two targets on one name: keep names unique
        if n.name in seen:
            nodes[i] = n.model_copy(update={"name": f"{n.name}-{i}"})
        seen.add(nodes[i].name)
    res = fanout.run_each(((n.name, n) for n in nodes), lambda n: ssh.connect(n, settings))
    hosts = res.succeeded
    try:
        if res.failed:
            raise fanout.unreachable_error(res.failed)
        script = discovery_script()

        def one(h: ssh.Host) -> Discovered:
            r = h.run(script, timeout=timeout, warn=True)
            if r.timed_out:
                raise SparkError(f"{h.name}: discovery timed out after {timeout:g}s", "check the host's load and retry")
            return parse_discovery(h.node.ssh, r.stdout)

        got = fanout.run_each(((h.name, h) for h in hosts.values()), one).values_or_raise("discover")
        return [got[n.name] for n in nodes]
    finally:
        for h in hosts.values():
            h.close()
