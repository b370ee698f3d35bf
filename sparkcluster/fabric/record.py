"""The last fabric test's figures, written where each node's agent reads them (node/contract
FABRIC_PATH in the node's sparkcluster container) and exports them to Prometheus (node/metrics):
the all_gather bus bandwidth at the largest size, the floor it is judged against, and the transport
NCCL chose on that node. Written by the test itself (fabric/measure), so `up`'s fabric stage and
`doctor --fabric` both leave them; a container made only for the test (throwaway) gets none."""

from __future__ import annotations

import io
import json
import tarfile
import time

from sparkcluster import log
from sparkcluster.fabric import judge
from sparkcluster.fabric.nccl_log import FabricLog, largest
from sparkcluster.node.contract import FABRIC_PATH

_log = log.get(__name__)


def figures(logs: dict[str, FabricLog], expect: judge.Expectation, now: float | None = None) -> dict[str, dict]:
    """node -> {busbw_gbps, floor_gbps, transport, ts}; the bus bandwidth is the cluster's (one
    collective), the transport each node's own (its network transports, else whatever it used)."""
    results = [r for lg in logs.values() for r in lg.results if r.op != "p2p"]
    top = largest(results)
    _, floor, _ = judge.thresholds(expect)
    out = {}
    for node, lg in logs.items():
        kinds = sorted({k for r in lg.ranks for k in r.kinds()})  # every rank of the node's log
        net = [k for k in kinds if k.startswith(("NET/", "COLLNET/"))]
        out[node] = {
            "busbw_gbps": top.busbw_gbps if top else None,
            "floor_gbps": floor,
            "transport": ",".join(net or kinds),
            "ts": time.time() if now is None else now,
        }
    return out


def _tar(doc: dict) -> bytes:
    data = json.dumps(doc).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(FABRIC_PATH.lstrip("/"))
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write(cluster, placements: dict, found: dict[str, dict]) -> None:
    """Each node's figures into its (kept) container; a failure is logged, never the test's."""
    for node, doc in found.items():
        p = placements.get(node)
        host = cluster.hosts.get(node)
        if p is None or p.throwaway or host is None:
            continue
        try:
            host.docker().api.put_archive(p.container, "/", _tar(doc))
        except Exception as e:  # noqa: BLE001 - the figures are for monitoring; the verdicts stand
            _log.warning("fabric figures not recorded", node=node, error=str(e))
