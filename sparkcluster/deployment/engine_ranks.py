"""The controller's read of what every rank's log says (issue 59): the all-reduce backend each rank
chose and the warm-up phase each is in, from the serve log of every container of the deployment
(node/engine_log parses, node/container_status.engine_reader reads). One `docker exec` per container,
bounded, like the engine's NCCL files (fabric/engine_nccl)."""

from __future__ import annotations

import shlex

from sparkcluster.facts.probes import section, split_sections
from sparkcluster.labels import CLUSTER_LABEL
from sparkcluster.node import container_status, engine_log


def section_script(cluster_label: str, bound_s: int) -> str:
    docker = f"timeout -k 1 {bound_s} docker"
    return section(
        "engine",
        f"for c in $({docker} ps -q --filter label={shlex.quote(cluster_label)}); do "
        f"{docker} exec $c sh -c {shlex.quote(container_status.engine_reader())}; done; true",
    )


def read_node(host, cluster: str) -> str:
    """One node's section (`host`: its SSH connection); "" where nothing was read."""
    got = split_sections(host.run(section_script(f"{CLUSTER_LABEL}={cluster}", 8), timeout=20, warn=True).stdout).get(
        "engine"
    )
    return got.out if got is not None and got.rc == 0 else ""


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
