"""The gateway's container on its node, through the Docker API over the node's SSH connection:
the actions the rollout's steps run (walked by the step engine), stop it (draining), and ask it
what it routes. Where it runs and its
config, read and written, are the registry's (deployment/gateway_registry)."""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import docker.errors
import httpx

from sparkcluster import redact
from sparkcluster.container.spec import files_tar
from sparkcluster.deployment import deployments, gateway_registry, server
from sparkcluster.errors import SparkError
from sparkcluster.labels import (
    PORT_LABEL,
    container_name,
)
from sparkcluster.remote import retry
from sparkcluster.steps import walk
from sparkcluster.steps.base import Step
from sparkcluster.steps.walk import CommandRun

from . import store
from .rollout import GatewayPlan, code_files, traces_probe_argv

READY_TIMEOUT_S = 60.0


def deployment_image(api, cluster: str) -> str | None:
    """The image a deployment's container on the node runs: the gateway's, since it has what it needs
    (an engine's: a service's image is its own, issue 60)."""
    return deployments.engine_image(api, cluster)


def wake_tokens(hosts: dict, inv, found, profiles: dict) -> dict[str, str]:
    """deployment key -> its token (a wake's on demand, the console's actions on every one), for every
    deployment whose head container answers: read from that container through the Docker API (never
    a command line), written only into the gateway's 0600 config. The head of the gateway gets no SSH
    trust and no other secret."""
    out = {}
    for d in found:
        if d.service:
            continue
        head = inv.only(list(d.nodes)).head.name
        if head not in hosts:
            continue
        name = container_name(inv.cluster.name, "head", head, d.slot)
        token = server.read_wake_token(hosts[head].docker().api, name)
        if token:
            out[d.key] = token
    return out


def write_config(api, container: str, plan: GatewayPlan) -> None:
    gateway_registry.write_doc(api, container, plan.config())


def stop(api, cid: str) -> None:
    """The gateway drained (`halt`), then its container removed."""
    halt(api, cid)
    remove(api, cid)


def halt(api, cid: str) -> None:
    """SIGTERM; the streams in flight drain for the container's own bound (its stop timeout, drain_s
    plus a margin, set when it was made), then Docker's SIGKILL. The container stays, stopped. That
    bound is passed on explicitly: without it docker-py waits on the HTTP call for its client timeout
    plus 10 s only, and a `--drain-s` past that broke the call while the gateway still drained."""
    try:
        bound = (api.inspect_container(cid).get("Config") or {}).get("StopTimeout")
        api.stop(cid, timeout=bound) if isinstance(bound, int) else api.stop(cid)
    except docker.errors.NotFound:
        pass


def remove(api, cid: str) -> None:
    try:
        api.remove_container(cid, force=True)
    except docker.errors.NotFound:
        pass


def create(api, plan: GatewayPlan) -> str:
    hc = api.create_host_config(**plan.host_config_kwargs())
    cid = api.create_container(host_config=hc, **plan.create_kwargs())["Id"]
    api.put_archive(cid, "/", files_tar(code_files()))
    api.put_archive(cid, "/", files_tar({gateway_registry.CONFIG_PATH: json.dumps(plan.config())}, mode=0o600))
    api.start(cid)
    return cid


def ask(address: str, port: int, key: str, timeout: float = 3.0, scheme: str = "http") -> dict:
    """What the gateway routes now (its /gateway/status); raises httpx.HTTPError when it does not answer."""
    r = httpx.get(
        f"{scheme}://{address}:{port}/gateway/status",
        headers={"Authorization": f"Bearer {key}"},
        timeout=timeout,
        verify=False,  # the owner's certificate may name another host; the key is what is checked
    )
    r.raise_for_status()
    return r.json()


def wait_ready(api, container: str, address: str, plan: GatewayPlan) -> dict:
    """Until the gateway answers and has judged every route at least once."""
    scheme = "https" if plan.tls else "http"
    last = "it has not opened its port yet"

    def ready() -> dict | None:
        nonlocal last
        try:
            got = ask(address, plan.port, plan.keys[0], scheme=scheme)
        except httpx.HTTPError as e:
            last = f"{type(e).__name__}: {e}"
            return None
        if any(r.get("reason") == "not looked at yet" for r in got.get("routes", [])):
            last = "it has not read every supervisor yet"
            return None
        return got

    got = retry.poll(ready, timeout=READY_TIMEOUT_S, interval=0.2, what="the gateway")
    if got is None:
        try:
            tail = api.logs(container, tail=20).decode(errors="replace")
        except docker.errors.APIError as e:
            tail = f"(could not read its log: {e})"
        raise SparkError(
            redact.mask(f"the gateway on {plan.node} did not answer within {READY_TIMEOUT_S:g}s: {last}"),
            f"see its log: docker logs {container} (on {plan.node})",
            details=redact.mask(tail).splitlines()[-10:],
        )
    return got


def port_holder(host, port: int) -> str:
    """What listens on the port on the node (`ss`), "" when nothing does."""
    return host.run(f"ss -Htln '( sport = :{int(port)} )'", timeout=10, warn=True).stdout.strip()


@dataclass
class GatewayRun(CommandRun):
    """What the gateway's steps share: the node's Docker API and SSH connection (`api`, `host`: the
    gateway's node for `up`; `apis` per node for `down`), and the container actions they perform
    (this module, looked up when a step runs)."""

    api: Any = None
    host: Any = None
    apis: dict[str, Any] = field(default_factory=dict)
    actions: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.actions = self.actions or sys.modules[__name__]


def walk_said(r: CommandRun, steps: list[Step], say=lambda line: None) -> list[tuple[Step, Any]]:
    """Walk the steps one by one through the step engine, saying each one done with its time."""
    done = []
    r.stage = "gateway"
    for step in steps:
        started = time.monotonic()
        done += walk.walk(r, [step])
        said = done[-1][1] if done else None  # a step that finds something says it (traces: the image's SDK)
        say(f"{step.id}: {said}" if isinstance(said, str) else f"{step.id}: done ({time.monotonic() - started:.1f}s)")
    return done


def apply(api, plan: GatewayPlan, host, say=lambda line: None) -> dict:
    """Walk the plan's steps on the node (`host`, its SSH connection): exactly those `--dry-run`
    prints; what the gateway routes once it is ready (its last step's value)."""
    done = walk_said(GatewayRun(api=api, host=host), plan.steps(), say)
    return next((v for s, v in reversed(done) if s.action == "ready"), None) or {}


def prepare_data(host, data_dir: str) -> None:
    """The gateway's folder on its node (its key file and usage ledger: gateway/store)."""
    store.prepare(host, data_dir)


def traces_in_image(host, plan: GatewayPlan) -> str:
    """Whether the gateway's image has what request traces need (rollout.traces_step), in words."""
    t = plan.traces()
    argv = traces_probe_argv(plan.image, t["otlp_protocol"])
    got = host.run(shlex.join(argv), timeout=120, warn=True)
    if got.ok:
        return f"the image has the OpenTelemetry SDK: traces go to {t['otlp_endpoint']} ({t['otlp_protocol']})"
    said = (got.stderr or got.stdout or "").strip().splitlines()
    return (
        f"traces OFF: {plan.image} lacks the OpenTelemetry SDK or its OTLP exporter "
        f"({said[-1] if said else f'exit {got.exit_code}'}); the gateway runs without them "
        "(an image with opentelemetry-sdk and opentelemetry-exporter-otlp has them: vLLM's bundles both)"
    )


def keep_holds(api, plan: GatewayPlan) -> None:
    """The gateway's holds, read again just before its config is replaced: one released since the
    plan was made stays released, one taken since is kept."""
    got = gateway_registry.holds(api, plan.running)
    if got is not None:
        plan.held = got


def down_steps(found: dict[str, dict]) -> list[Step]:
    """`gateway down`: for each node where a gateway container was found (node -> the Engine API's
    list entry), one step that drains and removes it."""
    out = []
    for node, c in sorted(found.items()):
        name = (c.get("Names") or ["?"])[0].lstrip("/")
        port = (c.get("Labels") or {}).get(PORT_LABEL)
        out.append(
            Step(
                "gateway",
                node,
                "stop",
                f"stop {name} (port {port}; its streams drain first), then remove it",
                f"docker stop {name} && docker rm {name}",
                run=lambda r, node=node, cid=c["Id"], name=name, port=port: (
                    r.actions.stop(r.apis[node], cid) or f"{node}: removed {name} (port {port})"
                ),
            )
        )
    return out


def journal(api, cid: str) -> list[dict]:
    """The gateway's events (JSON lines on its stdout, which Docker keeps as the container's log)."""
    out = []
    for line in api.logs(cid, stdout=True, stderr=False).decode(errors="replace").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and "event" in e:
            out.append(e)
    return out
