"""Facts about each host, gathered once per invocation, in parallel, in one round trip per host.

`probe_script()` builds one shell script that prints delimited sections; `parse()` turns the
sections into a typed `HostFacts` with the parsers in `parsers`. Checks (in `checks`) are pure
functions over the facts of all hosts, so they are unit-tested from captured output.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field, fields

from sparkcluster.config.inventory import Inventory, Node
from sparkcluster.errors import StageError, StepFailure
from sparkcluster.facts import access, image_nccl, parsers, probes
from sparkcluster.labels import CLUSTER_LABEL, is_gateway, slot_of
from sparkcluster.movement.layers import ImageLayers
from sparkcluster.remote.engine_api import EngineApi


def _probed(probe: probes.Probe, default=None, *, factory=None, any_exit=False, build=None):
    """A HostFacts field read from one probe, declared with the field: `parse` reads it with
    `probes.value` (the parsed output of a probe that exited 0, else the field's default), or with
    `probes.output` when `any_exit` (parsed whatever its exit: a loop over sysfs that found nothing
    still says so); `build(inv, node)` makes the probe the script runs where its command needs the
    inventory (`probe` is then that builder's probe with blank arguments: its name and parser)."""
    meta = {"probe": probe, "any_exit": any_exit, "build": build or (lambda inv, node: probe)}
    return field(default_factory=factory, metadata=meta) if factory else field(default=default, metadata=meta)


def _ports(inv: Inventory, node: Node) -> probes.Probe:
    return probes.listeners([inv.cluster.ray_port, inv.cluster.api_port, inv.cluster.master_port])


def _access(inv: Inventory, node: Node) -> probes.Probe:
    from sparkcluster.remote.lock import lock_path  # for start-up speed: facts load without paramiko

    return access.access(inv.cluster.hf_cache, lock_path(inv.cluster.name))


@dataclass
class HostFacts:
    """What one host answered. A field read from one probe names it here (`_probed`), and the probe
    (`probes`, `access`: its section, command and parser) is the fact's one definition: `probe_script`
    runs those probes and `parse` fills those fields, each naming none of them. The rest are read from
    several sections, or only when an image is named, and `parse` says how."""

    node: str
    hostname: str = _probed(probes.HOSTNAME, "", any_exit=True)
    clock_offset: float | None = None  # host clock minus controller clock, seconds
    gpus: list[parsers.Gpu] = _probed(probes.GPU, factory=list)
    gpu_error: str = ""
    docker: parsers.DockerInfo | None = _probed(probes.DOCKER)
    docker_error: str = ""
    docker_api: EngineApi | None = _probed(probes.DOCKER_API)  # the engine's release and the API range it accepts
    gpu_hook: str = _probed(probes.GPU_HOOK, "")
    interfaces: dict[str, parsers.Interface] = _probed(probes.IP, factory=dict)  # with carrier and speed
    hcas: dict[str, parsers.Hca] = _probed(probes.HCA, factory=dict, any_exit=True)
    # hca -> filled GID table entries
    gids: dict[str, list[parsers.Gid]] = _probed(probes.GIDS, factory=dict, any_exit=True)
    default_routes: list[str] = _probed(probes.ROUTE, factory=list)  # netdevs the default route(s) leave by
    mem: parsers.MemInfo | None = _probed(probes.MEMINFO)
    earlyoom: bool = _probed(probes.EARLYOOM, False)
    processes: list[parsers.Proc] = _probed(probes.PROCESSES, factory=list, any_exit=True)
    sshd_oom_score_adj: int | None = _probed(probes.SSHD_OOM)
    listeners: list[parsers.Listener] = _probed(probes.listeners([]), factory=list, any_exit=True, build=_ports)
    containers: list[parsers.Container] = _probed(probes.CONTAINERS, factory=list)
    # docker inspect of sparkcluster's deployment containers (the gateway's is none: labels.is_gateway)
    ours: list[parsers.ContainerInspect] = field(default_factory=list)
    # the other deployments' containers on the node (another slot's), never this run's
    beside: list[parsers.ContainerInspect] = field(default_factory=list)
    image_id: str | None = None
    image_ray: str | None = None  # `ray --version` output in the cluster image, if it runs
    image_ray_error: str = ""
    image_layers: ImageLayers | None = None  # the cluster image's diff IDs and layer sizes
    base: ImageLayers | None = None  # the profile's base image, when the node has it
    layer_chains: list[list[str]] = field(default_factory=list)  # diff IDs of every image on the node
    disks: dict[str, parsers.Disk] = _probed(
        probes.disk(""), factory=dict, any_exit=True, build=lambda inv, node: probes.disk(inv.cluster.hf_cache)
    )
    ray_sessions: list[str] = _probed(probes.RAY_SESSIONS, factory=list, any_exit=True)
    # phase 2: every path MTU probe from this node, one per (netdev, peer address): a passing probe
    # must never hide a failing one on the same netdev
    path_mtu: list[parsers.PingResult] = field(default_factory=list)
    path_mtu_error: str = ""  # the probes could not run at all (the node stopped answering, a timeout)
    account: access.Account | None = _probed(access.ACCOUNT)  # the SSH user: name, uid, gid, groups, home
    access: access.Access | None = _probed(access.access("", ""), build=_access)  # the HF cache, the lock
    image_nccl: image_nccl.ImageNccl | None = None  # the NCCL the cluster image loads
    traits: parsers.Traits = field(default_factory=parsers.Traits)  # what drifts: kernel, BIOS, HCA links


PROBED = tuple(f for f in fields(HostFacts) if "probe" in f.metadata)  # the fields read from one probe each


def probe_script(
    inv: Inventory,
    node: Node,
    image: str | None,
    ray_seen: dict[str, str] | None = None,
    base: str | None = None,
    ray: bool = True,
    nccl_seen: dict[str, str] | None = None,
) -> str:
    """One shell script for one host. Every value is quoted; nothing here comes from a user string
    that is not validated by the inventory model."""
    label = shlex.quote(f"{CLUSTER_LABEL}={inv.cluster.name}")
    parts = [
        p.script()
        for p in (
            probes.TIME,  # first: the clock's offset is judged against the round trip's midpoint
            *(f.metadata["build"](inv, node) for f in PROBED),
            probes.carrier([node.control_if, *node.netdevs]),
            probes.ours(f"{CLUSTER_LABEL}={inv.cluster.name}"),
            *probes.TRAITS,
        )
    ]
    if base:
        parts.append(probes.image_layers("base", base).script())
    if image:
        img = shlex.quote(image)
        # which layers a worker lacks: the image's layers here, and every layer chain this node holds
        parts += [probes.image_layers("image_layers", image).script(), probes.LAYER_CHAINS.script()]
        parts.append(probes.image_id(image).script())
        # the NCCL it loads and the driver it needs (issue 39); the base's where the image is not built yet
        parts.append(image_nccl.probe(image, nccl_seen, base).script())
        # our running container on this image runs `ray start` as its main process, which proves
        # Ray works in it; otherwise start `ray --version` in a throwaway container
        # an image ID Ray has already run in (ray_seen) needs no container: the ID is its content's digest
        seen = "".join(
            f"{shlex.quote(i)}) echo {shlex.quote(v + ' (ran in this image ID before)')}; exit 0;; "
            for i, v in (ray_seen or {}).items()
        )
        parts.append(image_ray(img, ray, seen, label).script())
    return "\n".join(parts) + "\n"


def image_ray(img: str, ray: bool = True, seen: str = "", label: str = "") -> probes.Probe:
    """The Ray in the image (`img` quoted): our running container on this image runs `ray start` as
    its main process, which proves Ray works in it; otherwise `ray --version` in a throwaway
    container; `seen`: the case arms of the image IDs Ray has already run in. Exits 3 when the image
    is absent."""
    if not ray:
        return probes.Probe("image_ray", "echo 'no Ray with executor mp'; exit 0", parsers.last_line)
    return probes.Probe(
        "image_ray",
        f"id=$(docker image inspect --format '{{{{.Id}}}}' {img} 2>/dev/null) || exit 3; "
        + (f'case "$id" in {seen}esac; ' if seen else "")
        + f"for c in $(docker ps -q --filter label={label} --filter status=running); do "
        '[ "$(docker inspect --format \'{{.Image}}\' $c)" = "$id" ] && { '
        f'echo "ray, version $(docker image inspect '
        f"--format '{{{{index .Config.Labels \"org.sparkcluster.ray-version\"}}}}' {img}) "
        '(running in $c)"; exit 0; }; done; '
        f"docker run --rm --network none --entrypoint ray {img} --version",
        parsers.last_line,
    )


def parse(node: Node, text: str, sent_at: float, received_at: float) -> HostFacts:
    s = probes.split_sections(text)
    f = HostFacts(node=node.name)
    value, output, failure = probes.value, probes.output, probes.failure
    for fact in PROBED:
        probe = fact.metadata["probe"]
        if fact.metadata["any_exit"]:
            setattr(f, fact.name, output(probe, s))
        else:
            setattr(f, fact.name, value(probe, s, getattr(f, fact.name)))
    clock = value(probes.TIME, s)
    if clock is not None:
        f.clock_offset = clock - (sent_at + received_at) / 2
    f.gpu_error = failure(probes.GPU, s, "nvidia-smi")
    f.docker_error = failure(probes.DOCKER, s, "docker info")
    for name, carrier, speed in output(probes.carrier([]), s):
        if name in f.interfaces:
            f.interfaces[name].carrier = carrier
            f.interfaces[name].speed_mbps = speed
    f.ours = [c for c in value(probes.ours(""), s, []) if not is_gateway(c.labels)]
    f.base = value(probes.image_layers("base", ""), s)
    f.image_layers = value(probes.image_layers("image_layers", ""), s)
    f.layer_chains = value(probes.LAYER_CHAINS, s, [])
    f.traits = probes.traits(s)
    f.image_nccl = value(image_nccl.probe(""), s)
    if probes.image_id("").name in s:
        f.image_id = value(probes.image_id(""), s)
        f.image_ray = value(image_ray(""), s, f.image_ray)
        if probes.reading(image_ray(""), s).rc != 3:  # 3: the image is absent, said by image_id
            f.image_ray_error = failure(image_ray(""), s)
    return f


def gather(
    host,
    inv: Inventory,
    image: str | None,
    timeout: float = 60.0,
    ray_seen: dict[str, str] | None = None,
    base: str | None = None,
    ray: bool = True,
    nccl_seen: dict[str, str] | None = None,
) -> HostFacts:
    sent = time.time()
    script = probe_script(inv, host.node, image, ray_seen, base, ray, nccl_seen)
    res = host.run(script, timeout=timeout, warn=True)
    received = time.time()
    if res.timed_out:
        raise StageError(
            "facts",
            [StepFailure(host.name, "gather facts", f"timed out after {timeout:g}s", "facts script", res.tail())],
        )
    got = parse(host.node, res.stdout, sent, received)
    # several deployments on one node (issue 60): this run's are those of its slot; the others' are
    # beside it (their memory and ports are theirs, never this run's to replace)
    got.beside = [c for c in got.ours if slot_of(c.labels) != inv.slot]
    got.ours = [c for c in got.ours if slot_of(c.labels) == inv.slot]
    if got.account and got.account.home:
        inv.set_home(host.node.name, got.account.home, got.account.owner)  # the HF cache's `~`, resolved on the node
    return got


# --- phase 2: path MTU, which needs the peers' addresses from phase 1 -----------------------------


@dataclass(frozen=True)
class PathMtuPing:
    """One don't-fragment ping of phase 2: out of `netdev` to a peer's address, `size` bytes of payload."""

    netdev: str
    peer_node: str
    peer_ip: str
    size: int


def path_mtu_probes(node: Node, facts: dict[str, HostFacts]) -> list[PathMtuPing]:
    """For each data-plane netdev of `node`, every peer address on one of its subnets on another
    node: one probe per direction and per peer (each node probes from its own side)."""
    mine = facts[node.name].interfaces
    out = []
    for netdev in node.netdevs:
        iface = mine.get(netdev)
        if not iface:
            continue
        for addr in iface.addresses:
            for other, of in facts.items():
                if other == node.name:
                    continue
                for oi in of.interfaces.values():
                    for oa in oi.addresses:
                        if oa.network == addr.network and oa.ip != addr.ip:
                            out.append(PathMtuPing(netdev, other, str(oa.ip), node.mtu - 28))
    return list(dict.fromkeys(out))


def _ping(p: PathMtuPing) -> probes.Probe:
    return probes.ping(p.netdev, p.peer_ip, p.size)


def ping_command(p: PathMtuPing) -> str:
    return _ping(p).command


def path_mtu_script(ps: list[PathMtuPing]) -> str:
    # the neighbour entry right after each ping says who answered (a third machine or a cluster node)
    return "\n".join(x for p in ps for x in (_ping(p).script(), probes.neigh(p.netdev, p.peer_ip).script())) + "\n"


def gather_path_mtu(host, ps: list[PathMtuPing], timeout: float = 20.0) -> list[parsers.PingResult]:
    if not ps:
        return []
    res = host.run(path_mtu_script(ps), timeout=timeout, warn=True)
    sections = probes.split_sections(res.stdout)
    out = []
    for p in ps:
        cut = probes.Section(124, "no result: the probe did not finish")
        mac = probes.value(probes.neigh(p.netdev, p.peer_ip), sections, "")
        out.append(
            parsers.PingResult(
                p.netdev,
                p.peer_node,
                p.peer_ip,
                p.size,
                probes.reading(_ping(p), sections, cut).rc == 0,
                probes.output(_ping(p), sections, cut),
                ping_command(p),
                mac,
            )
        )
    return out
