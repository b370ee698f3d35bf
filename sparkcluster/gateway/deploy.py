"""The gateway's container on its node, through the Docker API over the node's SSH connection:
find it, carry out the rollout's steps, stop it (draining), and ask it what it routes."""

from __future__ import annotations

import json
import time

import docker.errors
import httpx

from sparkcluster import redact
from sparkcluster.container.spec import files_tar
from sparkcluster.deployment import server, supervision
from sparkcluster.errors import SparkError
from sparkcluster.labels import CLUSTER_LABEL, PORT_LABEL, container_name, is_gateway
from sparkcluster.remote import retry
from sparkcluster.remote.dockerapi import run_in

from .rollout import CONFIG_PATH, GatewayPlan, code_files

READY_TIMEOUT_S = 60.0


def find(api, cluster: str) -> dict | None:
    """The gateway container of this cluster on the node (the Engine API's list entry), or None."""
    ours = api.containers(all=True, filters={"label": f"{CLUSTER_LABEL}={cluster}"})
    return next((c for c in ours if is_gateway(c.get("Labels"))), None)


def ports(hosts: dict, cluster: str) -> dict[str, int]:
    """node -> the gateway's port, where one runs (`hosts`: the connected hosts by name): monitoring
    scrapes its /metrics there."""
    out = {}
    for name, host in hosts.items():
        c = find(host.docker().api, cluster)
        if c is not None and c.get("State") == "running":
            out[name] = int((c.get("Labels") or {}).get(PORT_LABEL) or 0)
    return {n: p for n, p in out.items() if p}


def deployment_image(api, cluster: str) -> str | None:
    """The image a deployment's container on the node runs: the gateway's, since it has what it needs."""
    for c in api.containers(all=True, filters={"label": f"{CLUSTER_LABEL}={cluster}"}):
        if not is_gateway(c.get("Labels")) and c.get("Image"):
            return c["Image"]
    return None


def wake_tokens(hosts: dict, inv, found, profiles: dict) -> dict[str, str]:
    """deployment key -> its wake token, for every on-demand deployment whose head container
    answers: read from that container through the Docker API (never a command line), written only
    into the gateway's 0600 config. The head of the gateway gets no SSH trust and no other secret."""
    out = {}
    for d in found:
        if not profiles[d.profile].on_demand.enabled:
            continue
        head = inv.only(list(d.nodes)).head.name
        if head not in hosts:
            continue
        token = server.read_wake_token(hosts[head].docker().api, container_name(inv.cluster.name, "head", head))
        if token:
            out[d.key] = token
    return out


def write_config(api, container: str, plan: GatewayPlan) -> None:
    write_doc(api, container, plan.config())


def write_doc(api, container: str, doc: dict) -> None:
    """The config (secrets inside) as a 0600 file, written aside and renamed, so the running gateway
    never reads half of it."""
    api.put_archive(container, "/", files_tar({CONFIG_PATH + ".new": json.dumps(doc)}, mode=0o600))
    run_in(api, container, ["mv", "-f", CONFIG_PATH + ".new", CONFIG_PATH])


def routing(api, cluster: str, deployment: str) -> tuple[str, dict] | None:
    """The running gateway on this node that routes `deployment`, with its config (secrets inside:
    never printed); None where none does."""
    found = find(api, cluster)
    if found is None or found.get("State") != "running":
        return None
    container = found["Names"][0].lstrip("/")
    doc = read_doc(api, container)
    if not any(d.get("key") == deployment for d in doc.get("deployments", [])):
        return None
    return container, doc


def read_doc(api, container: str) -> dict:
    """The gateway's config, as `write_doc` left it (secrets inside: never printed), read through the
    Docker API's archive, so a stopped gateway's is read too (`apply`'s replace reads it once the
    old gateway has drained)."""
    text = supervision.read_file(api, container, CONFIG_PATH)
    if text is None:
        raise SparkError(
            f"could not read the gateway's config {CONFIG_PATH} in {container}: no such container or file",
            "sparkcluster gateway status shows where it runs; sparkcluster gateway up writes a new one",
        )
    return json.loads(text)


def holds(api, running: dict | None) -> dict[str, float] | None:
    """The holds in the gateway's config (deployment -> its deadline, gateway/hold), running or
    stopped: an upgrade under way holds one, and a new config keeps them, deadlines unchanged; None
    where they cannot be read (no gateway container, or its config unreadable)."""
    if not running:
        return None
    try:
        held = read_doc(api, running["Id"]).get("held_until")
    except (SparkError, docker.errors.DockerException, ValueError, AttributeError):
        return None
    if not isinstance(held, dict):
        return {}
    return {k: float(v) for k, v in held.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


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
    api.put_archive(cid, "/", files_tar({CONFIG_PATH: json.dumps(plan.config())}, mode=0o600))
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


def apply(api, plan: GatewayPlan, host, say=lambda line: None) -> dict:
    """Walk the plan's steps on the node (`host`, its SSH connection); what the gateway routes once
    it is ready."""
    container = plan.container
    for step in plan.steps():
        started = time.monotonic()
        if step.action == "port":
            held = port_holder(host, plan.port)
            if held:
                raise SparkError(
                    f"port {plan.port} on {plan.node} is held by another program: {held}",
                    "choose another with sparkcluster gateway up --port N",
                )
        elif step.action == "config":
            _keep_holds(api, plan)
            write_config(api, container, plan)
        elif step.action == "replace":
            # the old gateway drains first (up to drain_s), and the holds the new container's config
            # carries are read after, from the stopped one: an upgrade's hold or release written into
            # it while it drained counts; one written once it has stopped fails (it no longer runs)
            halt(api, plan.running["Id"])
            _keep_holds(api, plan)
            remove(api, plan.running["Id"])
        elif step.action == "create":
            create(api, plan)
        elif step.action == "ready":
            got = wait_ready(api, container, host.address, plan)
            say(f"{step.id}: done ({time.monotonic() - started:.1f}s)")
            return got
        say(f"{step.id}: done ({time.monotonic() - started:.1f}s)")
    return {}


def _keep_holds(api, plan: GatewayPlan) -> None:
    """The gateway's holds, read again just before its config is replaced: one released since the
    plan was made stays released, one taken since is kept."""
    got = holds(api, plan.running)
    if got is not None:
        plan.held = got


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
