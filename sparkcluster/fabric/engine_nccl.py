"""Which transport the serving engine's own NCCL chose, per rank: read from the files every rank's
NCCL writes at init (`NCCL_DEBUG=INFO`, `NCCL_DEBUG_SUBSYS=INIT,NET`, `NCCL_DEBUG_FILE`, set in every
container by `config/profile.container_env`), parsed by the fabric test's parser and judged by its
verdicts. The fabric test says what the links can do; this says what the engine actually does with
them (a rank that fell back to TCP sockets while the cluster has RoCE links is a problem `status`
shows). A CPU engine (the testbed's) runs no NCCL and writes no such file: nothing is said."""

from __future__ import annotations

from sparkcluster.config.inventory import Inventory
from sparkcluster.facts.probes import in_containers, read_containers
from sparkcluster.labels import CLUSTER_LABEL
from sparkcluster.node.container_status import nccl_reader


def section_script(cluster_label: str, bound_s: int) -> str:
    """A section: `nccl_reader` (node/container_status) in each of this node's running containers
    of the cluster."""
    return in_containers("nccl", nccl_reader(), cluster_label, bound_s)


def read_node(host, cluster: str) -> str:
    """One node's ranks' NCCL lines (`host`: its SSH connection), in one round trip; "" where none
    (a CPU engine writes none) or where the read did not finish."""
    return read_containers(host, f"{CLUSTER_LABEL}={cluster}", "nccl", nccl_reader())


def summaries(inv: Inventory, texts: dict[str, str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Per node, what its ranks' NCCL chose (nodes without an NCCL file are left out), and the
    problems: NCCL on sockets while the deployment has RoCE links between its nodes, or NCCL's own
    failure, as (node, what) pairs."""
    if not any(t.strip() for t in texts.values()):
        return {}, []
    from sparkcluster.fabric import judge, nccl_log  # only where an engine ran NCCL (status stays light)

    logs = {n: nccl_log.parse(t) for n, t in texts.items() if t.strip()}
    logs = {n: log for n, log in logs.items() if log.ranks}
    if not logs:
        return {}, []
    expect = judge.Expectation(roce=len(inv.nodes) > 1, topology=judge.figures_kind(inv))
    out, problems = {}, []
    for node, log in logs.items():
        r = judge.judge_node(node, log, expect, {}, logs)
        out[node] = "; ".join(sorted({x.summary() for x in log.ranks}))
        if r.status == "fail":
            problems.append((node, r.detail + (f" (fix: {r.fix})" if r.fix else "")))
    return out, problems


def versions(texts: dict[str, str]) -> dict[str, str]:
    """Per node, the NCCL version its ranks loaded ("2.28.9+cuda13.0"; several joined by ","), from
    the same files: what the known-good record keeps (issue 39). Nodes without a file are left out."""
    if not any(t.strip() for t in texts.values()):
        return {}
    from sparkcluster.fabric import nccl_log  # only where an engine ran NCCL (status stays light)

    out = {}
    for node, text in texts.items():
        found = sorted({r.version for r in nccl_log.parse(text).ranks if r.version})
        if found:
            out[node] = ",".join(found)
    return out
