"""Names and labels that mark what sparkcluster owns on a host. Nothing is removed without them."""

LABEL_PREFIX = "org.sparkcluster"
CLUSTER_LABEL = f"{LABEL_PREFIX}.cluster"
ROLE_LABEL = f"{LABEL_PREFIX}.role"
PROFILE_LABEL = f"{LABEL_PREFIX}.profile"
NODES_LABEL = f"{LABEL_PREFIX}.nodes"  # the deployment's node set, comma-separated
CONFIG_LABEL = f"{LABEL_PREFIX}.config-hash"  # hash of everything that shaped the container
EXECUTOR_LABEL = f"{LABEL_PREFIX}.executor"  # "ray" or "mp": how the deployment's ranks span its nodes
PORT_LABEL = f"{LABEL_PREFIX}.port"  # the port the gateway, or a service (issue 60), answers on its node
# the deployment's slot on its nodes (issue 60): several deployments share a node, each with its own
# container names and port block. Slot 0 (no label: what every container made before issue 60 is)
# keeps the names and ports sparkcluster always used, so an upgrade recreates nothing.
SLOT_LABEL = f"{LABEL_PREFIX}.slot"
# the deployment's engine's gpu_memory_utilization (a fraction of MemTotal): what it holds of each of
# its nodes' memory when another deployment asks to start beside it (issue 60's admission)
MEMORY_LABEL = f"{LABEL_PREFIX}.memory-fraction"
# "1" on a deployment whose engine starts on demand: it takes turns with the others on demand on its
# nodes (each start admitted by its supervisor against the memory as it is then, an idle one yielding
# by the inventory's rule), so a new one on demand beside it need not fit beside its share too
ON_DEMAND_LABEL = f"{LABEL_PREFIX}.on-demand"
# a service's reservation (issue 60 item 2: a profile of kind "service"), in GB of each of its nodes'
# memory: what it holds when another deployment asks to start beside it
RESERVED_LABEL = f"{LABEL_PREFIX}.memory-gb"
# ROLE_LABEL of a service's supervisor container: one per node it runs on, no head, no Ray, its agent
# supervising the service's own container beside it. The word its agent's config carries too
# (node/contract.SERVICE_ROLE: node/ ships alone, so it cannot import this module;
# tests/unit/test_service.py holds the two equal)
SERVICE_ROLE = "service"
# ROLE_LABEL of the service's own container (its image, its entrypoint): one deployment's with its
# supervisor (the same profile, node and slot labels), so `down` removes both; no agent in it
SERVER_ROLE = "service-server"
SERVER_SUFFIX = "-server"  # its name: its supervisor's, and this
GATEWAY_ROLE = "gateway"  # ROLE_LABEL of the gateway's container: no deployment, kept by `down --node`


def container_name(cluster: str, role: str, node: str, slot: int = 0) -> str:
    """A deployment's container on `node`: slot 0's names are those of before issue 60; a later slot's
    carry `d<slot>` so that two deployments on one node never share a name. A service's (issue 60)
    says so and names its node, in whichever slot."""
    base = f"sparkcluster-{cluster}" + (f"-d{slot}" if slot else "")
    return f"{base}-{role}-{node}" if role in ("worker", SERVICE_ROLE) else f"{base}-head"


def slot_of(labels: dict | None) -> int:
    """A container's deployment slot: its label, 0 where it has none (made before issue 60)."""
    v = (labels or {}).get(SLOT_LABEL, "0")
    return int(v) if str(v).isdigit() else 0


# monitoring's containers (sparkcluster/monitor): their own label, so that `down` (which removes what
# carries CLUSTER_LABEL) leaves monitoring running, and deployments never count them
MONITOR_LABEL = f"{LABEL_PREFIX}.monitor"


def is_gateway(labels: dict | None) -> bool:
    """The gateway's container (issue 36) carries the cluster's label but is no deployment's: `up`,
    the checks and `down --node` leave it alone; `down` of everything removes it."""
    return (labels or {}).get(ROLE_LABEL) == GATEWAY_ROLE


def gateway_name(cluster: str) -> str:
    return f"sparkcluster-{cluster}-gateway"
