"""What `sparkcluster gateway up` does, as steps made from the inventory, the deployments found
on the hosts, their profiles and the secrets; `--dry-run` prints them (keys masked) and the command
walks those same steps.

The gateway runs on the head (or the node the owner names) in a container of its own, made from
the image a deployment there already runs (vLLM's image has Starlette, uvicorn, httpx and
prometheus-client), with host networking so it reaches every deployment's head at its control
address, and Docker's restart policy as the engines' containers have. Its code is shipped into the
container as the node agent's is; its config (routes, the client keys, the deployments' own
`VLLM_API_KEY`) is a 0600 file written through the Docker API, renamed into place, so keys never
reach a command line, `docker inspect` or a log. A config that changed while the code, image and
port did not is written in place and re-read by the running gateway (no stream is dropped);
anything else replaces the container, which drains its streams for `drain_s` on the way out. Either
way the new config keeps the holds of the running gateway's (an upgrade under way: deployment/gateway_hold),
their deadlines unchanged.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from sparkcluster import programs, redact
from sparkcluster.config.inventory import Inventory
from sparkcluster.config.secrets import GATEWAY_KEYS
from sparkcluster.config.service_profile import is_service
from sparkcluster.deployment.gateway_registry import CONFIG_PATH
from sparkcluster.errors import InputError, SparkError
from sparkcluster.labels import CLUSTER_LABEL, CONFIG_LABEL, GATEWAY_ROLE, PORT_LABEL, ROLE_LABEL, gateway_name
from sparkcluster.redact import set_fix
from sparkcluster.steps.base import Step

from . import tracing

CODE_DIR = "/opt/sparkcluster-gateway"  # `python3 CODE_DIR CONFIG` runs its __main__.py
DEFAULT_PORT = 4000  # LiteLLM's and sparkrun's proxy port: clients configured for those find it
DEFAULT_DRAIN_S = 30
RESTART_POLICY = {"Name": "unless-stopped"}
DATA_MOUNT = "/var/lib/sparkcluster-gateway"  # its folder on the node (gateway/store): key file, usage ledger
LAUNCHER = (
    '"""The gateway container\'s entry point (sparkcluster/gateway/rollout.py ships it)."""\n'
    "import sys\n\nfrom sparkcluster.gateway.entrypoint import main\n\nsys.exit(main(*sys.argv[1:]))\n"
)


ASSETS = (("sparkcluster.gateway", "console_assets"),)  # (package, folder): shipped as they are (gateway/console)


def code_files() -> dict[str, str]:
    """The gateway's modules as its container holds them: a package `sparkcluster` with only the
    gateway's entry point and what it imports (the node contract it reads the supervisor's states
    from among them: standard library, plus what vLLM's image has), found by `programs.modules`."""
    entry = f"{__package__}.entrypoint"
    shipped = {__package__, *programs.modules(entry)}
    files = programs.files(CODE_DIR, programs.layout(shipped, "sparkcluster", "sparkcluster"))
    files[f"{CODE_DIR}/sparkcluster/__init__.py"] = '"""The parts of sparkcluster the gateway runs."""\n'
    for package in sorted({m.rpartition(".")[0] for m in shipped} - {"sparkcluster", __package__}):  # node/
        files[f"{CODE_DIR}/{package.replace('.', '/')}/__init__.py"] = '"""Only the modules the gateway imports."""\n'
    files[f"{CODE_DIR}/__main__.py"] = LAUNCHER
    for package, sub in ASSETS:  # what is no module: the console's script and styles
        files.update(programs.assets(CODE_DIR, package, sub))
    return files


@dataclass(frozen=True)
class Upstream:
    """One deployment as the gateway routes to it (no secret here)."""

    key: str
    names: tuple[str, ...]
    url: str  # its head's endpoint at the control address
    supervisor: str  # its head agent's report
    nodes: tuple[str, ...] = ()  # where it runs: a refused start names what else serves there
    on_demand: bool = False  # on standby until a request wakes it (a profile's [on_demand])
    paths: tuple[str, ...] = ()  # a service's routes (issue 60): routed by path
    # a service's key (the name of its `bearer` secret): sent to it as `Authorization: Bearer`; the
    # engines' key never goes to a service
    bearer: str | None = None


def upstreams(inv: Inventory, found, profiles: dict) -> list[Upstream]:
    """Pure: the deployments found on the hosts (deployment/deployments) -> what the gateway routes, in
    the order found. `profiles` maps a profile name to its loaded profile."""
    out = []
    for d in found:
        prof = profiles[d.profile]
        sub = d.inventory(inv)  # its own port block where it shares its nodes (issue 60)
        head = sub.head
        if is_service(prof):  # a service (issue 60): at its own port, by its routes
            url = f"http://{head.control_ip}:{prof.port}"
            agent = f"http://{head.control_ip}:{sub.cluster.agent_port}/"
            bearer = prof.bearer.name if prof.bearer else None
            out.append(
                Upstream(
                    d.key, tuple(prof.served_names), url, agent, tuple(d.nodes), paths=tuple(prof.routes), bearer=bearer
                )
            )
            continue
        port = prof.serve.port or sub.cluster.api_port
        out.append(
            Upstream(
                d.key,
                tuple(prof.served_names),
                f"http://{sub.engine_address()}:{port}",  # loopback on a one-node cluster (engines_listen)
                f"http://{head.control_ip}:{sub.cluster.agent_port}/",
                tuple(d.nodes),
                prof.on_demand.enabled,
            )
        )
    return out


def duplicates(ups: list[Upstream]) -> dict[str, list[str]]:
    """name -> the deployments serving it, where more than one does (replicas to the gateway)."""
    seen: dict[str, list[str]] = {}
    for u in ups:
        for n in u.names:
            seen.setdefault(n, []).append(u.key)
    return {n: keys for n, keys in seen.items() if len(keys) > 1}


@dataclass
class GatewayPlan:
    inventory: Inventory
    node: str
    image: str
    port: int
    drain_s: int
    routes: list[Upstream]
    keys: list[str] = field(repr=False)
    upstream_key: str | None = field(default=None, repr=False)
    tls: dict[str, str] = field(default_factory=dict)  # cert/key: paths on the node, mounted read-only
    running: dict | None = None  # the gateway container there now (the Engine API's list entry)
    # deployment key -> its token (read from its head container, never shown): on demand a wake's, and
    # on every deployment the console's actions' (gateway/console)
    wake_tokens: dict[str, str] = field(default_factory=dict, repr=False)
    # deployment key -> its hold's deadline (deployment/gateway_hold), kept from the running gateway's config
    held: dict[str, float] = field(default_factory=dict)
    data_dir: str = ""  # its folder on the node (gateway/store), bound read-write at DATA_MOUNT
    # a service's key by its secret's name (its profile's `bearer` secret), written only into the config
    service_keys: dict[str, str] = field(default_factory=dict, repr=False)
    _steps: list[Step] = field(default_factory=list, repr=False)

    @property
    def container(self) -> str:
        return gateway_name(self.inventory.cluster.name)

    def alerts_url(self) -> str:
        """Prometheus' alerts API on the head, where `monitor up` runs it (monitor/scrape.reach_ip's address:
        the head's control IP unless the owner chose one), as Prometheus' HTTP API documents `/api/v1/alerts`."""
        inv = self.inventory
        listen = inv.monitor.listen
        ip = str(inv.head.control_ip) if listen in ("control", "0.0.0.0") else listen
        return f"http://{ip}:{inv.monitor.prometheus_port}/api/v1/alerts"

    def config(self) -> dict:
        """The gateway's config file, secrets included: only ever written into its container."""
        return {
            "host": "0.0.0.0",
            "port": self.port,
            "drain_s": self.drain_s,
            "poll_s": 1.0,
            "keys": list(self.keys),
            **({"tls": {k: f"/etc/sparkcluster/tls/{Path(v).name}" for k, v in self.tls.items()}} if self.tls else {}),
            "deployments": [
                {
                    "key": u.key,
                    "names": list(u.names),
                    "upstream": u.url,
                    "supervisor": u.supervisor,
                    # the engines' key is no service's; a service's own, where it has one
                    "api_key": self.service_keys.get(u.bearer or "") if u.paths else self.upstream_key,
                    "nodes": list(u.nodes),
                    **({"paths": list(u.paths)} if u.paths else {}),
                    **({"wake_token": self.wake_tokens[u.key]} if u.on_demand and u.key in self.wake_tokens else {}),
                    **({"agent_token": self.wake_tokens[u.key]} if u.key in self.wake_tokens else {}),
                }
                for u in self.routes
            ],
            **({"held_until": dict(self.held)} if self.held else {}),
            **({"data": DATA_MOUNT} if self.data_dir else {}),
            "alerts": self.alerts_url(),  # what the console shows firing (Prometheus', where `monitor up` ran)
            # on demand across deployments (issue 60): which idle one yields to a woken one that does not fit
            **({"yield": self.inventory.on_demand.model_dump()} if self.inventory.on_demand.rule != "never" else {}),
            **self.traces(),
        }

    def traces(self) -> dict:
        """Request traces (gateway/tracing): the inventory's `[gateway]` OTLP settings, none when off."""
        g = self.inventory.gateway
        return {"otlp_endpoint": g.otlp_endpoint, "otlp_protocol": g.otlp_protocol} if g.otlp_endpoint else {}

    def binds(self) -> dict[str, str]:
        out = {str(Path(p).parent): "/etc/sparkcluster/tls" for p in self.tls.values()}
        return {**out, self.data_dir: DATA_MOUNT} if self.data_dir else out

    @staticmethod
    def bind_mode(container_path: str) -> str:
        return "rw" if container_path == DATA_MOUNT else "ro"  # only its own folder is written

    def config_hash(self) -> str:
        """What needs a new container when it changes: image, code, port, drain, TLS. Routes and
        keys do not: the running gateway re-reads its config file."""
        doc = json.dumps(
            {
                "image": self.image,
                "files": code_files(),
                "port": self.port,
                "drain": self.drain_s,
                "tls": self.tls,
                **({"data": self.data_dir} if self.data_dir else {}),
                **self.traces(),  # read once, when the gateway starts
            },
            sort_keys=True,
        )
        return hashlib.sha256(doc.encode()).hexdigest()[:16]

    def labels(self) -> dict[str, str]:
        return {
            CLUSTER_LABEL: self.inventory.cluster.name,
            ROLE_LABEL: GATEWAY_ROLE,
            PORT_LABEL: str(self.port),
            CONFIG_LABEL: self.config_hash(),
        }

    def keep_running(self) -> bool:
        r = self.running
        return (
            bool(r) and r.get("State") == "running" and (r.get("Labels") or {}).get(CONFIG_LABEL) == self.config_hash()
        )

    def command(self) -> list[str]:
        return ["python3", CODE_DIR, CONFIG_PATH]

    def create_kwargs(self) -> dict:
        return {
            "image": self.image,
            "name": self.container,
            "command": self.command(),
            # emptied on purpose: the gateway is Python and sockets, no CUDA and no GPU, so NGC's start-up
            # (forward compatibility, nvidia-smi, the banner) has nothing to set up for it
            # (container/spec.keeps_entrypoint is the engine's rule)
            "entrypoint": [],
            "labels": self.labels(),
            "detach": True,
            "stop_signal": "SIGTERM",
            "stop_timeout": self.drain_s + 5,  # uvicorn drains for drain_s, then Docker's SIGKILL
        }

    def host_config_kwargs(self) -> dict:
        return {
            "network_mode": "host",
            "restart_policy": dict(RESTART_POLICY),
            "init": True,
            "binds": {h: {"bind": c, "mode": self.bind_mode(c)} for h, c in self.binds().items()},
        }

    def docker_run_equivalent(self) -> str:
        argv = ["docker", "run", "-d", "--name", self.container, "--network", "host", "--restart", "unless-stopped"]
        argv += ["--init", "--stop-timeout", str(self.drain_s + 5)]
        for h, c in self.binds().items():
            argv += ["-v", f"{h}:{c}:{self.bind_mode(c)}"]
        for k, v in self.labels().items():
            argv += ["--label", f"{k}={v}"]
        return shlex.join([*argv, "--entrypoint", "", self.image, *self.command()])

    def describe_routes(self) -> list[str]:
        lines = []
        for u in self.routes:
            line = f"{', '.join((*u.names, *u.paths))} -> {u.key} at {u.url}"
            if u.on_demand:
                line += (
                    " (on demand: a request wakes it through its head's agent)"
                    if u.key in self.wake_tokens
                    else " (on demand, but its wake token could not be read: it is not woken; sparkcluster up "
                    "--profile ... again writes one)"
                )
            lines.append(line)
        for name, keys in duplicates(self.routes).items():
            lines.append(
                f"'{name}' is served by {len(keys)} deployments ({', '.join(keys)}): replicas, fewest in flight"
            )
        return lines

    def steps(self) -> list[Step]:
        return list(self._steps)

    def render(self) -> str:
        where = f"{self.node} port {self.port}"
        lines = [f"gateway plan on cluster '{self.inventory.cluster.name}' ({where}, image {self.image}):"]
        lines += [f"  route: {r}" for r in self.describe_routes()] or ["  route: none (no deployment runs)"]
        for s in self._steps:
            s.runnable()
            lines.append(f"  {s.id}: {s.what}")
            if s.detail:
                lines.append(f"      {s.detail}")
        return redact.mask("\n".join(lines))

    def as_json(self) -> str:
        return redact.mask(json.dumps([s.public() for s in self._steps], indent=2))


def make(
    inv: Inventory,
    node: str,
    found,
    profiles: dict,
    secrets: dict[str, str],
    keys: list[str],
    image: str | None,
    running: dict | None,
    port: int = DEFAULT_PORT,
    drain_s: int = DEFAULT_DRAIN_S,
    tls: dict[str, str] | None = None,
    wake_tokens: dict[str, str] | None = None,
    held: dict[str, float] | None = None,
    data_dir: str = "",
) -> GatewayPlan:
    """Pure: the plan and its steps, each with its run (which takes the command's run:
    `deploy.GatewayRun`)."""
    if not keys:
        raise InputError(
            "the gateway needs at least one client key",
            set_fix(GATEWAY_KEYS, "KEY[,KEY...]"),
        )
    if image is None:
        raise InputError(
            f"no sparkcluster image on {node} to run the gateway from",
            f"bring a deployment up on {node} first, or pass --image IMAGE "
            "(one with what vLLM's has: Python, Starlette, uvicorn, httpx, aiohttp)",
        )
    if tls and len({str(Path(v).parent) for v in tls.values()}) > 1:
        raise InputError(
            "--tls-cert and --tls-key are in different folders", "put both in one folder (it is mounted read-only)"
        )
    p = GatewayPlan(
        inv, node, image, port, drain_s, upstreams(inv, found, profiles), keys, secrets.get("VLLM_API_KEY"), tls or {}
    )
    p.running = running
    p.service_keys = {u.bearer: secrets[u.bearer] for u in p.routes if u.bearer and secrets.get(u.bearer)}
    p.wake_tokens = {k: v for k, v in (wake_tokens or {}).items() if v}
    p.held = dict(held or {})
    p.data_dir = data_dir
    n_keys = f"{len(keys)} client key(s) ******"
    if p.held:  # an upgrade under way: its hold (and deadline) stays in the config written
        n_keys += f", the hold of {', '.join(sorted(p.held))} kept"
    where = f"{CONFIG_PATH} in {p.container} (mode 0600, through the Docker API)"
    p._steps = _steps(p, n_keys, where)
    return p


# Each step's run takes the command's run (`deploy.GatewayRun`: the node's Docker API, its SSH
# connection, and the container actions of `deploy`, reached through the run so that this module
# stays pure and below `deploy`).


def _port(p: GatewayPlan):
    def run(r) -> None:
        held = r.actions.port_holder(r.host, p.port)
        if held:
            raise SparkError(
                f"port {p.port} on {p.node} is held by another program: {held}",
                "choose another with sparkcluster gateway up --port N",
            )

    return run


def _config(p: GatewayPlan):
    def run(r) -> None:
        r.actions.keep_holds(r.api, p)
        r.actions.write_config(r.api, p.container, p)

    return run


def _replace(p: GatewayPlan):
    def run(r) -> None:
        # the old gateway drains first (up to drain_s), and the holds the new container's config
        # carries are read after, from the stopped one: an upgrade's hold or release written into
        # it while it drained counts; one written once it has stopped fails (it no longer runs)
        r.actions.halt(r.api, p.running["Id"])
        r.actions.keep_holds(r.api, p)
        r.actions.remove(r.api, p.running["Id"])

    return run


def _steps(p: GatewayPlan, n_keys: str, where: str) -> list[Step]:
    node, port = p.node, p.port
    out = []
    if p.data_dir:  # the key file and the usage ledger (gateway/store), kept by `gateway down`
        what = f"make {p.data_dir} on {node} (mode 0700): its key file and usage ledger, kept across up and down"
        out.append(Step("gateway", node, "data", what, run=lambda r: r.actions.prepare_data(r.host, p.data_dir)))
    if p.traces():  # request traces: whether the image has what they need, said before it runs
        out.append(traces_step(p))
    if p.keep_running():
        out.append(
            Step(
                "gateway",
                node,
                "config",
                f"write the config ({len(p.routes)} route(s), {n_keys}) to {where}; the running gateway re-reads it",
                run=_config(p),
            )
        )
    else:
        if p.running:
            out.append(
                Step(
                    "gateway",
                    node,
                    "replace",
                    f"stop {p.container} (its streams drain for up to {p.drain_s}s), then remove it",
                    run=_replace(p),
                )
            )
        out.append(
            Step("gateway", node, "port", f"check that nothing else listens on port {port} on {node}", run=_port(p))
        )
        out.append(
            Step(
                "gateway",
                node,
                "create",
                f"create {p.container}, write its code under {CODE_DIR} and its config ({n_keys}) to {where}, start it",
                p.docker_run_equivalent(),
                run=lambda r: r.actions.create(r.api, p),
            )
        )
    out.append(
        Step(
            "gateway",
            node,
            "ready",
            f"wait until the gateway answers on {node} port {port} and has read every deployment's supervisor",
            run=lambda r: r.actions.wait_ready(r.api, p.container, r.host.address, p),
        )
    )
    return out


def traces_step(p: GatewayPlan) -> Step:
    """The look for the OpenTelemetry SDK and its OTLP exporter in the gateway's image (gateway/deploy
    runs it): without them the gateway runs, its traces off."""
    t = p.traces()
    return Step(
        "gateway",
        p.node,
        "traces",
        f"check that {p.image} has the OpenTelemetry SDK and its OTLP exporter; traces to {t['otlp_endpoint']} "
        f"({t['otlp_protocol']}) if so, else the gateway runs without them",
        shlex.join(traces_probe_argv(p.image, t["otlp_protocol"])),
        run=lambda r: r.actions.traces_in_image(r.host, p),
    )


def traces_probe_argv(image: str, protocol: str) -> list[str]:
    """A throwaway container of the image, no network, asked to import what traces need."""
    probe = tracing.probe_source(protocol)
    return ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", probe]
