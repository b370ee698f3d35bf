"""NCCL failures that name their cause, each mapped to one fix (issue 35 item 5).

NCCL reports a failed verbs call as one WARN line (src/misc/ibvwrap.cc: "Call to ibv_X failed with
[error] N TEXT ..."), and the same call fails for different reasons on different cablings. Each
signature here is the text NCCL prints, the cause it means on DGX Sparks, and one fix: the fabric
test's verdict and the engine's NCCL log read the same table, so a cause is worded once.

Matched on raw text (a line NCCL printed, whatever came before it: a timestamp, a redacted host),
so output pasted from elsewhere is read as well as our own ranks' logs. Pure.

The published output the tests read is in tests/captured/nccl/published-*.txt (sources in
tests/captured/README.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    cause: str  # id, stable: tests and the known-bad list name it
    pattern: re.Pattern[str]
    what: str  # the cause, one line
    fix: str
    # topologies where this reading holds (None: any); elsewhere the line matches no cause here
    topologies: tuple[str, ...] | None = None


SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "kernel-cma-regmr",
        re.compile(r"ibv_reg_mr(?:_iova2)? failed with (?:error )?(?:12 )?Cannot allocate memory"),
        "registering memory with the HCA failed (ENOMEM): the 7.0 kernel's Kexec HandOver scratch area is "
        "handed to the page allocator as CMA pageblocks that cannot be pinned (MiaAI-Lab "
        "DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259, DeepSeek-v4.1-Flash-DGX-Sparks#14)",
        "boot every node with `kho=off` on the kernel command line, or into the 6.17 kernel; "
        "`ulimit -l` unlimited in the container is needed as well (containers.* checks it)",
    ),
    Signature(
        "qp-timeout-point-to-point",
        re.compile(r"ibv_modify_qp failed with (?:error )?110\b|ibv_modify_qp failed with error Connection timed out"),
        "queue-pair setup timed out between two nodes no cable joins: a crossed cable (port 0 to port 0), "
        "or NCCL's tree reaching across the ring's diagonal",
        "each cable joins port 0 of one node to port 1 of the next (NVIDIA connect-three-sparks step 2; "
        "`sparkcluster doctor` net.crossing); a ring runs with NCCL_ALGO=Ring and "
        "NCCL_IB_SUBNET_AWARE_ROUTING=1 (sparkcluster sets both: do not override them in the profile)",
        ("ring", "mesh"),
    ),
    Signature(
        "qp-timeout-pair",
        re.compile(r"ibv_modify_qp failed with (?:error )?110\b|ibv_modify_qp failed with error Connection timed out"),
        "queue-pair setup timed out: the HCAs NCCL paired are not the two ends of one cable",
        "order data_plane so entry k of every node is on the same cable (`sparkcluster doctor` rdma.hca), "
        "and check MTU 9000 on both ends",
        ("direct", "switch", "single"),
    ),
    Signature(
        "gid-missing",
        re.compile(
            r"ibv_modify_qp failed with (?:error )?61\b|ibv_query_gid failed|"
            r"ibv_modify_qp failed with (?:error )?No data available"
        ),
        "NCCL used a GID that does not exist (ENODATA): a pinned NCCL_IB_GID_INDEX after the GID table moved "
        "(reboots and link events shift it: tonyd2wild DeepSeek-v4-Flash-Vision-Exp #38, NVIDIA/nccl#2157), "
        "or an HCA whose netdev lost its IPv4 address",
        "leave NCCL_IB_GID_INDEX unset (NCCL >= 2.21 picks each HCA's RoCE v2 IPv4 GID itself at every "
        "start; never set it empty, which means index 0); give each data-plane netdev its IPv4 address "
        "(`sparkcluster doctor` rdma.gid)",
    ),
)


def causes(text: str, topology: str | None = None) -> list[Signature]:
    """The signatures found in `text`, each once, in table order; a signature tied to other
    topologies does not count (None: the topology is not known, every reading counts once)."""
    out: list[Signature] = []
    seen_patterns: set[str] = set()
    for sig in SIGNATURES:
        if topology is not None and sig.topologies is not None and topology not in sig.topologies:
            continue
        if sig.pattern.pattern in seen_patterns:
            continue  # the same line read for another topology
        if sig.pattern.search(text):
            out.append(sig)
            seen_patterns.add(sig.pattern.pattern)
    return out


def fix_for(text: str, topology: str | None = None) -> tuple[str, str] | None:
    """(cause, fix) of the first signature in `text`, or None."""
    found = causes(text, topology)
    return (found[0].what, found[0].fix) if found else None
