"""A service's container (issue 60 item 2: a profile of kind "service", config/service_profile): the
same kind of container as an engine's (host networking, the GPUs, `unless-stopped`, tini, our labels),
from the service's own image, whose foreground process is the node agent in its service role
(node/service_supervisor): it runs the profile's `args` and supervises them."""

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
    SERVICE_ROLE,
    SLOT_LABEL,
    container_name,
)
from sparkcluster.node import contract, memory_fit


def service_config(inv: Inventory, svc: ServiceProfile, node: Node) -> dict:
    """The agent's config in a service's container: the report endpoint on the slot's report port
    (the gateway reads its verdict there, monitoring scrapes it), and what it supervises. No secret."""
    policy = {
        **{k: v for k, v in svc.supervisor.model_dump().items() if k != "enabled"},
        "act": svc.supervisor.enabled,
        "ready_timeout_s": float(svc.ready_timeout_s),
    }
    return {
        **agent_config(inv.only([node.name]), node, ray=False),
        "role": SERVICE_ROLE,
        "service": {
            "argv": list(svc.args),
            "health_url": svc.health_url(),
            "reserved_bytes": int(svc.memory_gb * memory_fit.GB),
            "policy": policy,
            "generation": svc.name,
        },
    }


def service_spec(inv: Inventory, svc: ServiceProfile, node: Node) -> ContainerSpec:
    """`inv` is the service's own inventory, at its slot (its report port)."""
    return ContainerSpec(
        node=node.name,
        role=SERVICE_ROLE,
        name=container_name(inv.cluster.name, SERVICE_ROLE, node.name, inv.slot),
        image=svc.image,
        command=list(svc.args),
        env=dict(svc.env),
        labels={
            CLUSTER_LABEL: inv.cluster.name,
            ROLE_LABEL: SERVICE_ROLE,
            PROFILE_LABEL: svc.name,
            NODES_LABEL: node.name,
            PORT_LABEL: str(svc.port),
            **({SLOT_LABEL: str(inv.slot)} if inv.slot else {}),
            RESERVED_LABEL: f"{svc.memory_gb:g}",
        },
        shm_size=svc.shm_size,
        binds={},
        files={
            **AGENT_FILES,
            contract.CONFIG_PATH: json.dumps(service_config(inv, svc, node), sort_keys=True),
        },
        # the agent replaces the service image's own start, which it runs as `args` (a service's image
        # is not NGC's: nothing of its start-up is for the agent to inherit)
        image_entrypoint=False,
    )
