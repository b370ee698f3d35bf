"""Names and labels that mark what sparkcluster owns on a host. Nothing is removed without them."""

LABEL_PREFIX = "org.sparkcluster"
CLUSTER_LABEL = f"{LABEL_PREFIX}.cluster"
ROLE_LABEL = f"{LABEL_PREFIX}.role"
PROFILE_LABEL = f"{LABEL_PREFIX}.profile"
NODES_LABEL = f"{LABEL_PREFIX}.nodes"  # the deployment's node set, comma-separated
CONFIG_LABEL = f"{LABEL_PREFIX}.config-hash"  # hash of everything that shaped the container
EXECUTOR_LABEL = f"{LABEL_PREFIX}.executor"  # "ray" or "mp": how the deployment's ranks span its nodes
PORT_LABEL = f"{LABEL_PREFIX}.port"  # the gateway's port on its node
GATEWAY_ROLE = "gateway"  # ROLE_LABEL of the gateway's container: no deployment, kept by `down --node`


def container_name(cluster: str, role: str, node: str) -> str:
    return f"sparkcluster-{cluster}-{role}-{node}" if role == "worker" else f"sparkcluster-{cluster}-head"


# monitoring's containers (sparkcluster/monitor): their own label, so that `down` (which removes what
# carries CLUSTER_LABEL) leaves monitoring running, and deployments never count them
MONITOR_LABEL = f"{LABEL_PREFIX}.monitor"


def is_gateway(labels: dict | None) -> bool:
    """The gateway's container (issue 36) carries the cluster's label but is no deployment's: `up`,
    the checks and `down --node` leave it alone; `down` of everything removes it."""
    return (labels or {}).get(ROLE_LABEL) == GATEWAY_ROLE


def gateway_name(cluster: str) -> str:
    return f"sparkcluster-{cluster}-gateway"
