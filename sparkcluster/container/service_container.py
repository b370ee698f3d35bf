"""A service's two containers (a profile of kind "service", config/service_profile), on its one node:

- its own (`server_spec`): its image as its owner runs it, the image's entrypoint and command kept
  (the profile's `args`, when given, are the command Docker appends to that entrypoint), host
  networking, the GPUs where the profile says so, its binds (read-only unless said), its secrets
  written as files (mode 0444: the server's user is the image's, unknown here) before it starts,
  each named to the server by its `file_env` variable, which holds the file's path, never the
  secret. Docker's restart policy is "no": its supervisor starts and restarts it. No agent in it,
  no `python3` needed.
- its supervisor (`service_spec`): the container that carries the role "service" (what the
  gateway, `status`, `events` and monitoring read, as before), from an image with `python3` (the
  node's model container's image, the cluster's own, or the profile's `[supervisor] image`),
  running the node agent in its service role (node/service_supervisor) with the node's Docker
  socket mounted: it starts the service's container, asks its health URL and restarts it. It runs
  on the node with no controller connected (`unless-stopped`: after a reboot it comes back and
  starts the service again).

The Docker socket is root on the node: whoever holds it can start a privileged container. The
supervisor holds it to inspect, start, stop and restart one container, the one named in its config;
nothing else in sparkcluster's code asks it for more (node/docker_socket), and the security page
says so.
"""

from __future__ import annotations

import json

from sparkcluster.config.inventory import Inventory, Node
from sparkcluster.config.service_profile import ServiceProfile
from sparkcluster.container.spec import AGENT_FILES, ContainerSpec, agent_config
from sparkcluster.labels import (
    CLUSTER_LABEL,
    NODES_LABEL,
    PORT_LABEL,
    PROFILE_LABEL,
    RESERVED_LABEL,
    ROLE_LABEL,
    SERVER_ROLE,
    SERVER_SUFFIX,
    SERVICE_ROLE,
    SLOT_LABEL,
    container_name,
)
from sparkcluster.node import contract, docker_socket, memory_fit

# the Docker socket on the node, and where the supervisor sees it (the same path: the Engine API's default)
DOCKER_SOCKET = docker_socket.SOCKET
SECRET_MODE = 0o444  # readable by the server's user, whichever the image runs as; the container's alone
SUPERVISOR_SHM = "64m"  # the supervisor's own: a loop, a small HTTP endpoint


def server_name(inv: Inventory, node: Node) -> str:
    return container_name(inv.cluster.name, SERVICE_ROLE, node.name, inv.slot) + SERVER_SUFFIX


def _labels(inv: Inventory, svc: ServiceProfile, node: Node, role: str) -> dict[str, str]:
    return {
        CLUSTER_LABEL: inv.cluster.name,
        ROLE_LABEL: role,
        PROFILE_LABEL: svc.name,
        NODES_LABEL: node.name,
        PORT_LABEL: str(svc.port),
        **({SLOT_LABEL: str(inv.slot)} if inv.slot else {}),
        RESERVED_LABEL: f"{svc.memory_gb:g}",
    }


def server_spec(inv: Inventory, svc: ServiceProfile, node: Node, secrets: dict[str, str]) -> ContainerSpec:
    """The service's own container. `secrets`: name -> value, as config/secrets.load_secrets read
    them (each of the profile's `[[secrets]]`); they go into files, never into env or argv."""
    env = {**svc.env, **{s.file_env: s.file for s in svc.secrets if s.file_env}}
    return ContainerSpec(
        node=node.name,
        role=SERVER_ROLE,
        name=server_name(inv, node),
        image=svc.image,
        command=list(svc.args),
        env=env,
        labels=_labels(inv, svc, node, SERVER_ROLE),
        shm_size=svc.shm_size,
        binds={b.source: b.target + (":ro" if b.read_only else "") for b in svc.binds},
        image_entrypoint=True,
        gpus=svc.gpu,
        fabric=False,
        agent=False,
        restart="no",
        secret_files={s.file: (secrets[s.name], SECRET_MODE) for s in svc.secrets if s.name in secrets},
    )


def service_config(inv: Inventory, svc: ServiceProfile, node: Node, server: str | None = None) -> dict:
    """The agent's config in a service's supervisor container: the report endpoint on the slot's
    report port (the gateway reads its verdict there, monitoring scrapes it), and what it
    supervises: the service's container by name. No secret."""
    policy = {
        **{k: v for k, v in svc.supervisor.model_dump().items() if k not in ("enabled", "image")},
        "act": svc.supervisor.enabled,
        "ready_timeout_s": float(svc.ready_timeout_s),
    }
    return {
        **agent_config(inv.only([node.name]), node, ray=False),
        "role": SERVICE_ROLE,
        "service": {
            "container": server or server_name(inv, node),
            "socket": DOCKER_SOCKET,
            "health_url": svc.health_url(),
            "reserved_bytes": int(svc.memory_gb * memory_fit.GB),
            "policy": policy,
            "generation": svc.name,
        },
    }


def service_spec(inv: Inventory, svc: ServiceProfile, node: Node, image: str, server_hash: str = "") -> ContainerSpec:
    """The service's supervisor. `inv` is the service's own inventory, at its slot (its report
    port); `image` one with python3 (the cluster's own); `server_hash` the service container's
    configuration hash, so that a change of the service makes its supervisor anew too."""
    return ContainerSpec(
        node=node.name,
        role=SERVICE_ROLE,
        name=container_name(inv.cluster.name, SERVICE_ROLE, node.name, inv.slot),
        image=image,
        command=[],
        env={},
        labels=_labels(inv, svc, node, SERVICE_ROLE),
        shm_size=SUPERVISOR_SHM,
        binds={docker_socket.NODE_SOCKET: DOCKER_SOCKET},
        files={
            **AGENT_FILES,
            contract.CONFIG_PATH: json.dumps(
                {**service_config(inv, svc, node), "server_hash": server_hash}, sort_keys=True
            ),
        },
        # the agent is its foreground process (an NGC image's CUDA start-up is nothing it needs)
        image_entrypoint=False,
        gpus=False,
        fabric=False,
    )
