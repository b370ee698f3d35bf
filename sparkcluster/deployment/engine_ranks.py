"""The controller's read of what every rank's log says (issue 59): the all-reduce backend each rank
chose and the warm-up phase each is in, from the serve log of every container of the deployment
(node/engine_log parses, node/container_status.engine_reader reads). One `docker exec` per container,
bounded, like the engine's NCCL files (fabric/engine_nccl)."""

from __future__ import annotations

from sparkcluster.facts.probes import in_containers, read_containers
from sparkcluster.labels import CLUSTER_LABEL
from sparkcluster.node import container_status, engine_log


def section_script(cluster_label: str, bound_s: int) -> str:
    return in_containers("engine", container_status.engine_reader(), cluster_label, bound_s)


def read_node(host, cluster: str) -> str:
    """One node's section (`host`: its SSH connection); "" where nothing was read."""
    return read_containers(host, f"{CLUSTER_LABEL}={cluster}", "engine", container_status.engine_reader())


def split(outs: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Every node's section -> (the variables the containers run with, every node's log lines)."""
    env: dict[str, str] = {}
    texts = {}
    for node, out in outs.items():
        e, text = container_status.engine_text(out)
        env.update({k: v for k, v in e.items() if v})
        texts[node] = text
    return env, texts


def all_reduce(outs: dict[str, str]) -> tuple[str, str, str, str]:
    """(status, the backend that serves, what, fix) for the deployment's TP all-reduce."""
    env, texts = split(outs)
    ar = engine_log.all_reduce(texts)
    status, what, fix = engine_log.judge_all_reduce(ar, env)
    return status, ar.serving() if status != "unknown" else "not reported", what, fix
