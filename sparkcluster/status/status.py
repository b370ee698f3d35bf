"""What runs, from the controller: per node the container, Ray membership, the endpoint, memory.

One SSH round trip per node (container state, Ray's state API on the head, uptime, MemAvailable;
what only the container knows, such as the server's record and the supervisor's state and journal
on the head, read by the container's own agent) plus the endpoint's answers, all in parallel and
each bounded: fast enough to poll every second, and no Docker API client to import or to wait on.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field

import httpx

from sparkcluster import log
from sparkcluster.config import compile_cache
from sparkcluster.config.inventory import Inventory
from sparkcluster.deployment import deployments, engine_ranks, known_good, ray_members
from sparkcluster.deployment import endpoint as endpoint_mod
from sparkcluster.errors import EXIT_UNREACHABLE, failure, problem
from sparkcluster.fabric import engine_nccl
from sparkcluster.facts import parsers
from sparkcluster.facts.probes import SECTION, section, split_sections
from sparkcluster.labels import (
    CLUSTER_LABEL,
    EXECUTOR_LABEL,
    PORT_LABEL,
    PROFILE_LABEL,
    SERVICE_ROLE,
    container_name,
    is_gateway,
    slot_of,
)
from sparkcluster.node import container_status, contract, engine_log, hwmon, readings
from sparkcluster.remote.fanout import Background, connect_reachable

_log = log.get(__name__)


@dataclass
class NodeStatus:
    node: str
    reachable: bool = True
    error: str = ""
    container: str = ""  # name
    state: str = "absent"  # running | exited | absent | docker not answering (DOCKER_SILENT) | unreachable
    started_at: str = ""
    profile: str = ""
    uptime_s: float | None = None  # the container's, by the node's own clock
    host_uptime_s: float | None = None  # since the node booted (a reboot shows here)
    mem_available_gib: float | None = None
    ray_alive: bool | None = None  # this node's control IP is alive in Ray
    executor: str = ""  # the container's label: "mp" runs without Ray (issue 28)
    rank: str = ""  # executor "mp": "rank N alive" / "rank N exited (...)", from the head supervisor's reports
    kernel: str = ""  # what the known-good record compares (issue 39)
    image_id: str = ""  # our container's image
    compile_cache: str = ""  # the compile cache's key its container mounts (config/compile_cache)
    compile_cache_gib: float | None = None  # that key's size on the node
    compile_caches_gib: float | None = None  # every key's on the node (the cap's subject)
    # its ConnectX-7 and NVMe sensors with their thresholds, read from the host's sysfs (node/hwmon)
    temperatures: list[dict] = field(default_factory=list)


@dataclass
class ClusterStatus:
    cluster: str
    state: str  # healthy | degraded | down | unreachable (no node answered: nothing is known)
    nodes: list[NodeStatus]
    profile: str = ""  # the deployment's (from its containers' labels); "" when down
    deployment: str = ""  # PROFILE@NODE+NODE
    ray_nodes: int | None = None
    ray_gpus: float | None = None
    endpoint: str = ""
    health: int | None = None
    models: list[str] = field(default_factory=list)
    server_pid: int | None = None
    engine_responds: bool | None = None  # a one-token completion answered within its bound
    metrics: dict[str, float] = field(default_factory=dict)  # from /metrics, by endpoint.METRICS
    supervisor: dict | None = None  # the head supervisor's state file (node/), None: none written
    nccl: dict[str, str] = field(default_factory=dict)  # node -> what its ranks' NCCL chose (engine_nccl)
    # the backend that serves the TP all-reduce as the ranks' logs name it ("not reported": a CPU engine)
    all_reduce: str = ""
    phases: dict[str, str] = field(default_factory=dict)  # rank -> its warm-up phase, while the engine starts
    journal: list[dict] = field(default_factory=list)  # its last entries
    # the last correctness-canary check in the head container (node/canary's check_doc), None: none yet
    canary: dict | None = None
    problems: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)  # since the deployment's last good serve (issue 39)
    fix: str = ""  # what to do about the nodes that did not answer, each named
    # the cluster's gateway (issue 36), the same for every deployment: node, container, state, port
    gateway: dict | None = None
    service: bool = False  # a service (issue 60: a profile of kind "service"), judged by judge_service

    def as_json(self) -> str:
        return json.dumps(self.as_doc(), indent=2)

    def as_doc(self) -> dict:
        """The status as `--json` prints it; where no node answered, nothing is known: the failure
        shape every `--json` shares (errors.failure), each node's problem its connection's."""
        if self.state != UNREACHABLE:
            return asdict(self)
        problems = [problem(n.node, f"{n.node}: {n.error or UNREACHABLE}") for n in self.nodes if not n.reachable]
        said = f"no node of {self.cluster} answered"
        doc = failure(said, self.fix or None, problems, EXIT_UNREACHABLE, [p["error"] for p in problems])
        return {**doc, "cluster": self.cluster, "state": self.state, "nodes": [asdict(n) for n in self.nodes]}


DOCKER_SILENT = "docker not answering"
UNREACHABLE = "unreachable"  # a node (or every node: the cluster) that SSH did not reach
DOCKER_BOUND_S = 8  # each docker command on a node; the whole round trip is bounded by SSH_BOUND_S
AGENT_BOUND_S = 3  # the agent's `/status`; then the same readings by `docker exec`
SSH_BOUND_S = 12  # status answers within 15 s whatever a node's daemon does


def node_script(inv: Inventory, node: str) -> str:
    """Every node answers as a possible head (deployments decide which node heads which), so one
    round trip per node serves every deployment: Ray's state API and the head container's sections
    simply print nothing where there is no such head. What only the container knows comes from its
    agent (`container_readings`)."""
    label = shlex.quote(f"{CLUSTER_LABEL}={inv.cluster.name}")
    docker = f"timeout -k 1 {DOCKER_BOUND_S} docker"
    parts = [
        section("uptime", "cat /proc/uptime; date +%s.%N"),
        section("meminfo", "cat /proc/meminfo"),
        section("kernel", "cat /proc/sys/kernel/osrelease"),
        section("hwmon", f"timeout -k 1 3 sh -c {shlex.quote(hwmon.shell())}"),  # CX7 and NVMe temperatures
        # `docker ps` failing (daemon down) or not returning (daemon hung) fails the section: that
        # is "docker not answering", never "no container"
        section(
            "ours",
            f"ids=$({docker} ps -aq --filter label={label}) || exit $?; "
            f"[ -z \"$ids\" ] && echo '[]' || {docker} inspect $ids",
        ),
        section("ray", ray_members.state_api_command(inv), stderr=False),
        container_readings(inv, node),
        # each compile cache's size (deployment/compile_caches has the listing with what each is for)
        section(
            "compile_cache", f"timeout -k 1 3 du -sk {compile_cache_glob(inv.cluster.compile_cache)} 2>/dev/null; true"
        ),
    ]
    return "\n".join(parts) + "\n"


def compile_cache_glob(root: str) -> str:
    """The compile caches' key folders for the shell, `~` being the SSH user's home there."""
    if root.startswith("~/"):
        return f'"$HOME"/{shlex.quote(root[2:].rstrip("/"))}/*/'
    return f"{shlex.quote(root.rstrip('/'))}/*/"


def compile_cache_sizes(out: str) -> dict[str, float]:
    """key -> GiB, from `du -sk ROOT/*/`."""
    sizes = {}
    for line in out.splitlines():
        kib, _, path = line.partition("\t")
        k = path.rstrip("/").rsplit("/", 1)[-1]
        if kib.strip().isdigit() and compile_cache.KEY_RE.match(k):
            sizes[k] = int(kib) / 2**20
    return sizes


def mounted_key(container: parsers.ContainerInspect) -> str:
    """The compile cache's key a container was created with (its VLLM_CACHE_ROOT), or ""."""
    root = container.env.get("VLLM_CACHE_ROOT")
    if not root:
        return ""
    k = root.rstrip("/").rsplit("/", 2)[-2:][0]
    return k if compile_cache.KEY_RE.match(k) else ""


def container_readings(inv: Inventory, node: str) -> str:
    """Shell printing node/container_status's sections for our container on `node`: its agent's
    `/status` (a process start in the container), or where that does not answer whole (no agent
    there, or one made by an earlier sparkcluster, whose report answers any path), the same script
    by `docker exec` in the container that runs. No container of ours runs: no sections, so no
    server."""
    label = shlex.quote(f"{CLUSTER_LABEL}={inv.cluster.name}")
    docker = f"timeout -k 1 {DOCKER_BOUND_S} docker"
    n = inv.node(node)
    url = shlex.quote(f"http://{n.control_ip}:{inv.cluster.agent_port}/status")
    whole = f"{SECTION} {container_status.WHOLE} rc=0"
    head = shlex.quote(container_name(inv.cluster.name, "head", node, inv.slot))
    worker = shlex.quote(container_name(inv.cluster.name, "worker", node, inv.slot))
    service = shlex.quote(container_name(inv.cluster.name, SERVICE_ROLE, node, inv.slot))  # issue 60: as a head
    exec_ = (
        f"for c in $({docker} ps --filter label={label} --filter status=running --format '{{{{.Names}}}}' "
        f'2>/dev/null); do case "$c" in '
        f"{head}) {docker} exec $c sh -c {shlex.quote(container_status.script(head=True))} 2>/dev/null;; "
        f"{worker}) {docker} exec $c sh -c {shlex.quote(container_status.script(head=False))} 2>/dev/null;; "
        f"{service}) {docker} exec $c sh -c {shlex.quote(container_status.script(head=True))} 2>/dev/null;; "
        "esac; done"
    )
    return (
        f"_st=$(curl -s --noproxy '*' -m {AGENT_BOUND_S} {url} 2>/dev/null); "
        f'case "$_st" in *{shlex.quote(whole)}*) printf "%s\\n" "$_st";; *) {exec_};; esac'
    )


def head_container_view(s: dict) -> tuple[int | None, dict | None, list[dict]]:
    """(the server's PID when it still runs, the supervisor's state, its last journal entries)."""
    pid = None
    if "record" in s and s["record"].rc == 0 and "alive" in s and s["alive"].rc == 0:
        pid = (parsers.json_object(s["record"].out) or {}).get("pid")
    sup = parsers.json_object(s["supervisor"].out) if "supervisor" in s and s["supervisor"].rc == 0 else None
    journal = (
        [e for e in (parsers.json_object(x) for x in s["journal"].out.splitlines()) if e]
        if "journal" in s and s["journal"].rc == 0
        else []
    )
    return pid, sup or None, journal


@dataclass
class NodeReport:
    """What one node's round trip said: its row, its containers, and as a possible head Ray's
    members and the head container's server, supervisor state and journal."""

    status: NodeStatus
    containers: list[parsers.ContainerInspect] | None  # docker inspect of ours; None when its Docker did not answer
    ray: list[dict] | None = None
    head_view: tuple = (None, None, [])
    nccl: str = ""  # the telling lines of its ranks' NCCL files
    gateway: dict | None = None  # the gateway's container on this node, if it runs here
    canary: dict | None = None  # the head container's last canary check
    engine: str = ""  # this start's telling lines of its serve log, and the env lines (container_status.engine_reader)


def _one(host, inv: Inventory) -> NodeReport:
    st = NodeStatus(host.name)
    res = host.run(node_script(inv, host.name), timeout=SSH_BOUND_S, warn=True)
    s = split_sections(res.stdout)
    now = None
    if "uptime" in s and s["uptime"].rc == 0:
        st.host_uptime_s, now = parsers.uptime_and_clock(s["uptime"].out)
    if "meminfo" in s and s["meminfo"].rc == 0:
        st.mem_available_gib = round(parsers.meminfo(s["meminfo"].out).available / 2**30, 1)
    if "kernel" in s and s["kernel"].rc == 0:
        st.kernel = s["kernel"].out.strip()
    if "hwmon" in s:  # whatever it read before a timeout still counts
        st.temperatures = hwmon.sensors(hwmon.listing(s["hwmon"].out))
    if "ours" not in s or s["ours"].rc != 0:
        st.state = DOCKER_SILENT
        got = s["ours"] if "ours" in s else None
        st.error = (
            f"`docker ps` did not return within {DOCKER_BOUND_S}s"
            if got is None or got.rc in (124, 137)
            else (parsers.last_line(got.out) or f"`docker ps` exited {got.rc}")
        )
        return NodeReport(st, None)
    ours, gateway = [], None
    for c in parsers.docker_inspect_json(s["ours"].out):  # the gateway is no node's deployment container
        if is_gateway(c.labels):
            gateway = {
                "node": host.name,
                "container": c.name,
                "state": c.status,
                "port": int(c.labels.get(PORT_LABEL) or 0),
            }
        else:
            ours.append(c)
    # the row's container is this deployment's slot's (issue 60: several deployments share a node);
    # every container still goes back, for the grouping into deployments
    mine = [c for c in ours if slot_of(c.labels) == inv.slot]
    if mine:
        c = mine[0]
        st.container = c.name
        st.state = c.status
        st.started_at = c.started_at
        st.profile = c.labels.get(PROFILE_LABEL, "")
        st.executor = c.labels.get(EXECUTOR_LABEL, "ray")
        st.image_id = c.image_id
        started = parsers.rfc3339(st.started_at)
        if st.state == "running" and started is not None and now is not None:
            st.uptime_s = round(max(now - started, 0.0), 1)
    if "compile_cache" in s and s["compile_cache"].rc == 0:
        sizes = compile_cache_sizes(s["compile_cache"].out)
        st.compile_caches_gib = round(sum(sizes.values()), 2)
        st.compile_cache = mounted_key(mine[0]) if mine else ""
        st.compile_cache_gib = round(sizes[st.compile_cache], 2) if st.compile_cache in sizes else None
    ray = ray_members.parse_state_api(s["ray"].out) if "ray" in s else None
    view = head_container_view(s)
    written = contract.Supervised.of(view[1])
    if written is not None and written.age(now) is not None:
        view[1]["age_s"] = round(written.age(now), 1)  # both by the head's own clock
    nccl = s["nccl"].out if "nccl" in s and s["nccl"].rc == 0 else ""
    check = parsers.json_object(s["canary"].out) if "canary" in s and s["canary"].rc == 0 else None
    engine = s["engine"].out if "engine" in s and s["engine"].rc == 0 else ""
    return NodeReport(st, ours, ray, view, nccl, gateway, check or None, engine)


def _look_key(sub: Inventory) -> tuple[str, int]:
    """A deployment's endpoint look: by its head and its slot (two deployments may share a head)."""
    return sub.head.name, sub.slot


def collect_all(inv: Inventory, api_key: str | None = None) -> list[ClusterStatus]:
    """Every deployment on the inventory's nodes, from one bounded round trip per node (and the
    endpoint's answers); the whole inventory as one, down, when none runs."""
    cluster, unreachable = connect_reachable(inv)
    with cluster:
        addresses = {n: h.address for n, h in cluster.hosts.items()}
        # the inventory's head is the usual deployment's head: its endpoint is asked meanwhile
        early = Background(_look, cluster.hosts.get(inv.head.name), inv, inv.cluster.api_port, api_key)
        per_node = cluster.each(lambda h: _one(h, inv))
        reports = {n: o.value if o.ok else o.error for n, o in per_node.items()}
        found = deployments.group(
            inv,
            {n: r.containers for n, r in reports.items() if isinstance(r, NodeReport) and r.containers is not None},
        )
        subs = [d.inventory(inv) for d in found] or [inv]
        # a deployment in a later slot (issue 60): its own round trip on its nodes, for its own
        # containers, agents and Ray (the first read slot 0's)
        slotted = {
            _look_key(sub): {
                n: o.value if o.ok else o.error
                for n, o in cluster.each(
                    lambda h, sub=sub: _one(h, sub),
                    [cluster.hosts[x.name] for x in sub.nodes if x.name in cluster.hosts],
                ).items()
            }
            for sub in subs
            if sub.slot
        }
        looks = {
            _look_key(sub): (
                early
                if (sub.head.name, sub.slot) == (inv.head.name, 0)
                else Background(_look, cluster.hosts.get(sub.head.name), sub, sub.cluster.api_port, api_key)
            )
            for sub, d in zip(subs, found or [None])
            if d is None or not d.service or (sub.head.name, sub.slot) == (inv.head.name, 0)
        }
        gateway = next((r.gateway for r in reports.values() if isinstance(r, NodeReport) and r.gateway), None)
        routed = (
            Background(_routed, addresses.get(gateway["node"]), gateway["port"])
            if gateway and gateway["state"] == "running"
            else None
        )
        out = []
        for sub, d in zip(subs, found or [None]):
            st = _judge_reports(
                sub,
                slotted.get(_look_key(sub), reports),
                unreachable,
                addresses,
                # a service has no engine to ask: its supervisor's state is its health (judge_service)
                looks[_look_key(sub)].result() if _look_key(sub) in looks else endpoint_mod.EngineView(),
                d.port if d is not None and d.service else None,
            )
            if d is not None:
                st.profile, st.deployment = d.profile, d.key
                st.drift = _drift(inv.cluster.name, st)
            st.gateway = gateway
            out.append(st)
        if routed is not None:
            gateway["models"] = routed.result()
    return out


def _drift(cluster: str, st: ClusterStatus) -> list[str]:
    """What changed on the deployment's nodes since its last good serve (kernel and image: what the
    one round trip reads; `doctor` compares the rest)."""
    rec = known_good.last_for(known_good.load(cluster), st.deployment)
    if rec is None:
        return []
    now = {n.node: known_good.NodeRecord(kernel=n.kernel, image_id=n.image_id) for n in st.nodes}
    return [c.line() for c in known_good.drift(rec, now)]


def _routed(address: str | None, port: int) -> dict[str, bool] | None:
    """The gateway's models, each in rotation or not (its /health, which needs no key); None when
    it does not answer."""
    if not address:
        return None
    try:
        got = httpx.get(f"http://{address}:{port}/health", timeout=2.0).json().get("models")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return {str(k): bool(v) for k, v in got.items()} if isinstance(got, dict) else None


def _look(host, inv: Inventory, port: int, api_key: str | None) -> endpoint_mod.EngineView:
    """The engine of the deployment `inv` headed by `host` (its SSH connection; None: unreachable),
    asked where the controller reaches it (endpoint.reached: through that connection when engines
    listen only on the cluster's addresses)."""
    if host is None:
        return endpoint_mod.EngineView()
    with endpoint_mod.reached(host, inv, port) as base:
        return endpoint_mod.look(base, api_key)


def _judge_reports(
    inv: Inventory,
    reports: dict,
    unreachable: dict,
    addresses: dict,
    engine: endpoint_mod.EngineView,
    service_port: int | None = None,
) -> ClusterStatus:
    """`service_port`: the deployment is a service (issue 60) answering there, judged by judge_service."""
    nodes, ray_rows, pid, sup, journal, nccl, check, logs = [], None, None, None, [], {}, None, {}
    for n in inv.nodes:
        if n.name in unreachable:
            error = unreachable[n.name].message.removeprefix(f"{n.name}: ")
            nodes.append(NodeStatus(n.name, reachable=False, error=error, state=UNREACHABLE))
            continue
        r = reports.get(n.name)
        if not isinstance(r, NodeReport):
            nodes.append(NodeStatus(n.name, reachable=False, error=str(r), state=UNREACHABLE))
            continue
        nodes.append(r.status)
        nccl[n.name] = r.nccl
        logs[n.name] = r.engine
        if n.name == inv.head.name:
            ray_rows = r.ray
            if r.status.state == "running":
                pid, sup, journal = r.head_view
                check = r.canary
    address = addresses.get(inv.head.name)
    if service_port is not None:
        return judge_service(inv, nodes, f"http://{address}:{service_port}" if address else "", pid, sup, journal)
    endpoint = f"http://{address}:{inv.cluster.api_port}" if address else ""
    st = judge(inv, nodes, ray_rows, endpoint, engine, pid, sup, journal)
    st.canary = check
    fixes = [
        e.fix for name, e in unreachable.items() if getattr(e, "fix", None) and name in {n.name for n in inv.nodes}
    ]
    st.fix = "; ".join(dict.fromkeys(fixes))
    if pid is not None:  # only a running server's ranks: an old server's files say nothing of now
        st.nccl, problems = engine_nccl.summaries(inv, nccl)
        st.problems += [f"{node}: the engine's NCCL: {what}" for node, what in problems]
        if problems and st.state == "healthy":
            st.state = "degraded"
        ranks_read(st, logs, sup)
    return st


def ranks_read(st: ClusterStatus, engine: dict[str, str], sup: dict | None) -> None:
    """What the ranks' own logs say (issue 59): the all-reduce backend that serves, judged against
    the variables the containers run with, and each rank's warm-up phase while the engine starts."""
    env, texts = engine_ranks.split(engine)
    ar = engine_log.all_reduce(texts)
    status, what, fix = engine_log.judge_all_reduce(ar, env)
    st.all_reduce = ar.serving() if status == "ok" else ("not reported" if status == "unknown" else "")
    if status == "fail":
        st.problems.append(f"all-reduce: {what} (fix: {fix})")
        if st.state == "healthy":
            st.state = "degraded"
    rec = contract.Supervised.of(sup)
    if (rec and rec.kind in (contract.STARTING, contract.WAITING)) or st.engine_responds is False:
        st.phases = engine_log.phases(texts)


def supervisor_shown(sup: dict | None) -> str:
    """The supervisor's state as `status` and its live view show it: the state file's, except while
    the supervisor stops a serving engine after its verdict, which the gateway has already taken out
    of rotation (`contract.availability`): then not "serving"."""
    rec = contract.Supervised.of(sup)
    if not sup or rec is None:
        return "no supervisor"
    judged = rec.availability(sup.get("age_s"))
    if judged.why == "stopping":
        return f"stopping after a verdict (was {rec.state})"
    if judged.why == contract.FABRIC_HOLD:  # out of rotation, its engine running (issue 75)
        return f"held: fabric unhealthy (engine {rec.state})"
    return str(rec.state) if rec.state is not None else "no supervisor"


def energy_shown(sup: dict | None) -> str:
    """The deployment's GPU power and energy per 1,000 generated tokens, as the supervisor last
    computed them from every node's power (node/energy, issue 75); "" where either is unknown."""
    rec = contract.Supervised.of(sup)
    rest = (rec.rest or {}) if rec else {}
    power, per_1k = rest.get("power_w"), rest.get("joules_per_1k_tokens")
    if not isinstance(power, (int, float)):
        return ""
    shown = f"GPU power {power:.1f} W"
    return shown + (f", {per_1k:,.0f} J per 1,000 tokens" if isinstance(per_1k, (int, float)) else "")


def temperatures_shown(temps: list[dict]) -> list[tuple[str, str]]:
    """One node's sensors (node/hwmon.sensors) as `status` prints them, each with what the alerts
    would say of it ("", "warning", "critical"): "mlx5_0 asic 65 C", "nvme0 Composite 91 C (warning
    at 89.85 C)"."""
    out = []
    for t in temps:
        hot = hwmon.hot(t)
        text = f"{t.get('device')} {t.get('sensor')} {t['celsius']:.0f} C"
        if hot:
            text += f" ({hot} at {t['crit_c' if hot == 'critical' else 'max_c']:g} C)"
        out.append((text, hot))
    return out


def supervisor_problem(sup: dict | None) -> str | None:
    """What the supervisor's state adds to the problems: it has stopped looking, given up, is
    bringing the server back, or cannot see a node's memory."""
    rec = contract.Supervised.of(sup)
    if not sup or rec is None:
        return None
    age = sup.get("age_s")  # the controller's: how old the file is by the head's clock (status reads it)
    judged = rec.availability(age)  # the gateway's judgement, at the same instant
    if judged.why == "stale":
        return (
            f"supervisor: stale: its last state ({rec.state}) is {age:.0f}s old, so it is not "
            f"watching; see sparkcluster events and the head container's log"
        )
    if judged.why in ("stopping", contract.FABRIC_HOLD):  # out of rotation already (a verdict, the fabric)
        return f"supervisor: {judged.reason}"
    said = [x for x in (_state_problem(rec), _memory_unknown(rec)) if x]
    return "; ".join(said) or None


def _memory_unknown(sup: contract.Supervised) -> str | None:
    unknown = sup.memory_unknown or {}
    return (
        "supervisor: memory unknown on " + "; ".join(f"{n}: {why}" for n, why in sorted(unknown.items()))
        if unknown
        else None
    )


def _state_problem(sup: contract.Supervised) -> str | None:
    state, causes = sup.state, list(sup.causes)
    last = sup.last_cause
    if state == contract.LIMIT:
        return (
            f"supervisor: restart limit reached ({len(sup.restarts)} restarts); last causes: "
            + "; ".join(f"{c.get('kind')}: {c.get('cause')}" for c in causes[-3:])
            + ". Fix the cause, then sparkcluster up"
        )
    if state == contract.MEMORY:
        return (
            f"supervisor: vllm serve stopped and not restarted: {last}. Lower gpu_memory_utilization "
            "or set enforce_eager in the profile, then sparkcluster up"
        )
    if state == contract.FAILED:
        return f"supervisor: vllm serve failed to start: {last}; see sparkcluster logs and sparkcluster events"
    if state == contract.NO_MEMORY:
        return (
            f"supervisor: vllm serve not restarted: {last}. Find what holds the memory (a leftover "
            "process, /dev/shm, the page cache), then sparkcluster up"
        )
    if state in (contract.RESTARTING, contract.WAITING, contract.MEMORY_WAIT) or (
        state == contract.STARTING and causes
    ):
        return f"supervisor: {state} (after: {last})" if last else f"supervisor: {state}"
    return None


def _settled(st: ClusterStatus, nodes: list[NodeStatus]) -> ClusterStatus:
    """`st` with the cluster's state from its nodes and problems: unreachable when no node answered,
    down when every node answered with no container, degraded when a problem was found; else as it
    was."""
    if not any(ns.reachable for ns in nodes):
        st.state = UNREACHABLE
    elif all(ns.reachable and ns.state == "absent" for ns in nodes):
        st.state = "down"
    elif st.problems:
        st.state = "degraded"
    return st


def judge_service(
    inv: Inventory,
    nodes: list[NodeStatus],
    endpoint: str,
    pid: int | None,
    sup: dict | None,
    journal: list[dict] | None = None,
) -> ClusterStatus:
    """Pure: a service (issue 60) is healthy when its container runs and its supervisor, which asks
    its health URL every look, says serving, freshly. No Ray, no engine to probe: its health is the
    supervisor's to judge, as the gateway reads it."""
    st = ClusterStatus(inv.cluster.name, "healthy", nodes, endpoint=endpoint, server_pid=pid, supervisor=sup)
    st.service = True
    st.journal = list(journal or [])
    for ns in nodes:
        if not ns.reachable:
            st.problems.append(f"{ns.node} unreachable: {ns.error}")
        elif ns.state != "running":
            st.problems.append(f"{ns.node}: {ns.state if ns.state == DOCKER_SILENT else f'container {ns.state}'}")
    if any(ns.state == "running" for ns in nodes):
        rec = contract.Supervised.of(sup)
        state = rec.state if rec else None
        said = supervisor_problem(sup)
        if said:
            st.problems.append(said.replace("vllm serve", "the service"))
        elif state != contract.SERVING:
            st.problems.append(f"service: {state or 'its supervisor has written no state yet'}")
    return _settled(st, nodes)


def _judge_ranks(inv: Inventory, nodes: list[NodeStatus], st: ClusterStatus, pid: int | None) -> None:
    """Executor "mp": each worker's rank as the head's supervisor last saw it in its agent's report."""
    rec = contract.Supervised.of(st.supervisor)
    ranks, epoch = (rec.ranks or {}, rec.epoch) if rec else ({}, None)
    for n, ns in zip(inv.nodes, nodes):
        if n.name == inv.head.name:
            ns.rank = "rank 0 " + ("alive" if pid else "not running")
            continue
        r = ranks.get(n.name)
        if not r:
            ns.rank = "unknown"
            continue
        alive = r.get("alive") and r.get("epoch") == epoch
        ns.rank = f"rank {r.get('rank')} " + (
            "alive" if alive else f"not running ({r.get('exit')})" if r.get("exit") is not None else "not running"
        )
        if pid and epoch and not alive and ns.state == "running":
            st.problems.append(f"{n.name}: {ns.rank}")


def judge(
    inv: Inventory,
    nodes: list[NodeStatus],
    ray_rows: list[dict] | None,
    endpoint: str,
    engine: endpoint_mod.EngineView,
    pid: int | None,
    sup: dict | None = None,
    journal: list[dict] | None = None,
) -> ClusterStatus:
    """Pure: healthy only when every node's container runs, Ray has every node alive at its
    control IP with its GPUs, and the endpoint answers with the model."""
    st = ClusterStatus(
        inv.cluster.name,
        "healthy",
        nodes,
        endpoint=f"{endpoint}/v1" if endpoint else "",
        health=engine.health,
        models=engine.models,
        server_pid=pid,
        engine_responds=engine.responds,
        metrics=engine.metrics,
        supervisor=sup,
        journal=list(journal or []),
    )
    mp = any(ns.executor == "mp" for ns in nodes)
    if len(inv.nodes) == 1 or mp:  # one node, or vLLM's own launch (issue 28): no Ray to judge
        ray_rows = None
    if mp:
        _judge_ranks(inv, nodes, st, pid)
    alive = [r for r in (ray_rows or []) if r.get("state") == "ALIVE"]
    if ray_rows is not None:
        st.ray_nodes = len(alive)
        st.ray_gpus = sum(float(r.get("resources_total", {}).get("GPU", 0)) for r in alive)
    alive_ips = {r.get("node_ip") for r in alive}
    for n, ns in zip(inv.nodes, nodes):
        if ray_rows is not None:
            ns.ray_alive = str(n.control_ip) in alive_ips
        if not ns.reachable:
            st.problems.append(f"{n.name} unreachable: {ns.error}")
        elif ns.state == DOCKER_SILENT:
            st.problems.append(f"{n.name}: {DOCKER_SILENT}: {ns.error}")
        elif ns.state != "running":
            st.problems.append(f"{n.name}: container {ns.state}")
        elif ns.ray_alive is False:
            st.problems.append(f"{n.name} is not alive in Ray at {n.control_ip}")
        elif ns.ray_alive:
            gpus = readings.alive_gpus(alive, str(n.control_ip))
            if gpus != n.gpus:
                st.problems.append(f"{n.name} reports {gpus:g} GPU(s) in Ray, expected {n.gpus}")
    if ray_rows is None and len(inv.nodes) > 1 and not mp and any(ns.state == "running" for ns in nodes):
        st.problems.append("Ray does not answer on the head")
    rec = contract.Supervised.of(sup)
    standby = rec is not None and rec.kind in contract.WAKEABLE and bool((rec.policy or {}).get("on_demand"))
    if any(ns.state == "running" for ns in nodes) and standby and pid is None:
        # on demand (issue 36): no engine until a request wakes it; healthy unless a start was refused
        if rec.kind == contract.REFUSED:
            st.problems.append(f"on demand: its last start was refused: {rec.refusal or 'not enough memory'}")
    elif any(ns.state == "running" for ns in nodes):
        if engine.health != 200 and pid is None:
            # vLLM's API server exits 0 when a rank dies: its exit status proves nothing
            st.problems.append(
                f"vllm serve is not running (endpoint /health: {engine.health or 'no answer'}); "
                "see why with: sparkcluster logs --node " + inv.head.name
            )
        elif engine.health != 200:
            st.problems.append(f"endpoint /health: {engine.health or 'no answer'}")
        elif engine.responds is False and not (rec and rec.activity):
            # a probe waits behind a long prefill: the supervisor's evidence of progress wins
            st.problems.append(f"engine wedged: /health is 200 but {engine.probe}")
        elif pid is None:
            st.problems.append("vllm serve is not running")
    said = supervisor_problem(sup)
    if said and any(ns.state == "running" for ns in nodes):
        st.problems.append(said)
    return _settled(st, nodes)
