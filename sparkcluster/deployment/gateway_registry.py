"""The gateway's registry, from the controller: where a cluster's gateway runs on a node (its container,
its port) and its config (the routes, the keys, the wake tokens, the holds), read and written through
the Docker API over the node's SSH connection. `up` hands a new wake token over through it, monitoring
finds the gateway to scrape, an upgrade holds its traffic (deployment/gateway_hold), and the gateway's
own rollout (gateway/deploy) writes its config through it. Controller-side only: nothing here is
shipped into the gateway's container (gateway/entrypoint reads the same path there)."""

from __future__ import annotations

import json

import docker.errors

from sparkcluster.container.spec import files_tar
from sparkcluster.deployment import supervision
from sparkcluster.errors import SparkError
from sparkcluster.labels import CLUSTER_LABEL, PORT_LABEL, is_gateway
from sparkcluster.remote.dockerapi import run_in

CONFIG_PATH = "/etc/sparkcluster/gateway.json"


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
    Docker API's archive, so a stopped gateway's is read too (gateway/deploy.apply's replace reads it once the
    old gateway has drained)."""
    text = supervision.read_file(api, container, CONFIG_PATH)
    if text is None:
        raise SparkError(
            f"could not read the gateway's config {CONFIG_PATH} in {container}: no such container or file",
            "sparkcluster gateway status shows where it runs; sparkcluster gateway up writes a new one",
        )
    return json.loads(text)


def holds(api, running: dict | None) -> dict[str, float] | None:
    """The holds in the gateway's config (deployment -> its deadline, deployment/gateway_hold), running or
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
