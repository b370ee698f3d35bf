"""The fabric test's verdicts: which transport NCCL chose on each node, and whether the bus
bandwidth is what the cluster's cabling should give. Pure: parsed logs, results, the inventory's
expectations and per-node facts in, `checks.Result`s out (ids `fabric.transport`, `fabric.bandwidth`).

Why judge behaviour and not configuration: NCCL falls back from RoCE to TCP sockets without a
word (seed 002's worker lacked /dev/infiniband), and every configured fact can read right while the
fabric is still slow. The facts serve here only to name the likely cause of what NCCL did.

The figures, NCCL's all_gather bus bandwidth (nccl-tests' all_gather_perf, or this probe) between
DGX Sparks, judged at the largest size measured (1 GiB by default: `[fabric] max_bytes`), where
per-call latency no longer counts. WARN below the "healthy" line, FAIL below the "floor".
  - A pair on both PCIe halves of a 200G port (`rocep1s0f*` is one x4 half of the ConnectX-7,
    `roceP2p1s0f*` the other; each carries about 100 Gb/s: ServeTheHome on GB10's CX7, eugr
    spark-vllm-docker docs/NETWORKING.md): healthy pairs measure 20.1-20.4 GB/s at 1 GiB
    (MiaAI-Lab GLM-5.3 #118, tonyd2wild/dgx-spark PR #35); 23.7 GB/s at 16 GiB, where NVIDIA warns
    below 21.875 (dgx-spark-playbooks PR #103). The healthy line at 1 GiB is the lowest healthy
    1 GiB figure with NVIDIA's own margin (20.1 x 21.875 / 23.7 = 18.55); the floor is half that
    figure (10.05).
  - One PCIe half (one HCA per cable, or two HCAs of the same half, `rocep1s0f0`+`rocep1s0f1`):
    about 12.3 GB/s (tonyd2wild/dgx-spark PR #35): healthy 11.35 (with NVIDIA's margin), floor 6.15.
  - A ring or a three-node mesh: NVIDIA's setup script warns below 10 GB/s on three nodes
    (dgx-spark-playbooks PR #103), which is the FAIL line here; unpatched NCCL 2.30 measures about
    21 GB/s all_gather on a three-node mesh (eugr spark-vllm-docker #252), so healthy is 21 with
    NVIDIA's margin (19.4).
  - Broken paths: 3.04 GB/s with a wrong NCCL build (PR #103), TCP sockets about 3-4 GB/s (the H200
    captures in tests/captured/nccl/ read 3.55-3.86): far below every floor.
Each figure is for 200G ports; a port that negotiated less (a switch's 100G auto-negotiation, a
400G-to-4x100G breakout: the NVIDIA forum's eight-Spark CRS812 build, tonyd2wild GLM-5.3 4x PR #6)
scales both lines by its speed over 200G (one PCIe half by its speed over 100G, all it can carry),
the slowest port of the data plane setting the pace. The inventory may set its own `healthy_gbps`
and `floor_gbps` (the testbed does: gloo over veths); one node alone has no floor unless set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from sparkcluster.checks import Result
from sparkcluster.fabric import signatures
from sparkcluster.fabric.nccl_log import FabricLog, ProbeResult, largest

Topology = Literal["single", "pair", "half", "ring"]
TRANSPORT, BANDWIDTH, DIRECTION, CABLING = "fabric.transport", "fabric.bandwidth", "fabric.direction", "fabric.cabling"
LATENCY = "fabric.latency"
# The decode all-reduce (issue 59): local-inference-lab/b12x PR #295 measured NCCL's 48 KB all-reduce,
# the one GLM-5.3-Flash TP4 decode issues about 100 times a step, at 54-64 us per call (59 us as its
# headline) on four DGX Sparks over RoCE, against 8.8 us of wire time (ib_write_lat). A pair has
# fewer hops than that ring, so a call slower than the top of the published range is slower than the
# field's NCCL: WARN (the figure is four Sparks', not two: a WARN, never a FAIL).
NCCL_48K_US = (54.0, 64.0)
NCCL_48K_SOURCE = "NCCL 54-64 us per 48 KB all-reduce on four DGX Sparks, local-inference-lab/b12x PR #295"
# a direction slower than this share of the fastest one is a fault of its sender's egress (a healthy
# link carries the same rate both ways)
ASYMMETRY = 0.5
MiB = 1 << 20
PORT_MBPS = 200_000  # a ConnectX-7 port of a Spark, negotiated at full speed
HALF_MBPS = 100_000  # what one PCIe Gen5 x4 half of the controller carries
# NVIDIA's margin under its own healthy measurement (21.875 warning line / 23.7 GB/s, PR #103)
MARGIN = 21.875 / 23.7


@dataclass(frozen=True)
class Figures:
    healthy: float  # GB/s: below it, WARN
    floor: float  # GB/s: below it, FAIL
    source: str
    full_mbps: int = PORT_MBPS  # the port speed the figures are for


FIGURES: dict[str, Figures] = {
    "pair": Figures(
        round(20.1 * MARGIN, 2),
        10.05,
        "both PCIe halves of a 200G port: 20.1-20.4 GB/s at 1 GiB (MiaAI-Lab GLM-5.3 #118, tonyd2wild/dgx-spark "
        "PR #35) with NVIDIA's margin 21.875/23.7 (dgx-spark-playbooks PR #103); floor half of 20.1",
        PORT_MBPS,
    ),
    "half": Figures(
        round(12.3 * MARGIN, 2),
        6.15,
        "one PCIe half of the ConnectX-7 (about 100 Gb/s): about 12.3 GB/s (tonyd2wild/dgx-spark PR #35)",
        HALF_MBPS,
    ),
    "ring": Figures(
        round(21.0 * MARGIN, 2),
        10.0,
        "a ring or mesh: NVIDIA warns below 10 GB/s on three nodes (dgx-spark-playbooks PR #103); unpatched "
        "NCCL 2.30 gives about 21 GB/s all_gather on a three-node mesh (eugr spark-vllm-docker #252)",
        PORT_MBPS,
    ),
}


@dataclass(frozen=True)
class Expectation:
    """What the inventory says the fabric is."""

    roce: bool  # the cluster has RoCE links between its nodes
    topology: Topology = "pair"
    healthy_gbps: float | None = None  # the inventory's own figures, replacing FIGURES
    floor_gbps: float | None = None
    port_mbps: int | None = None  # the slowest data-plane port's negotiated speed (None: not known)


@dataclass(frozen=True)
class NodeFacts:
    """What can explain a fallback to sockets on one node (None: not known)."""

    infiniband_dev: bool | None = None  # /dev/infiniband inside the rank's container
    hca_gid_ok: dict[str, bool] = field(default_factory=dict)  # HCA of NCCL_IB_HCA -> usable RoCE v2 IPv4 GID
    env: dict[str, str] = field(default_factory=dict)  # the NCCL_* variables the rank gets


_HCA = re.compile(r"^roce(?P<half>.+)s0f(?P<port>\d+)$")


def pcie_half(hca: str) -> tuple[str, str] | None:
    """(PCIe half, port) of a Spark's RoCE HCA: `rocep1s0f0` -> ("p1", "0"), `roceP2p1s0f1` ->
    ("P2p1", "1"); None for a name that does not say (`mlx5_0`)."""
    m = _HCA.match(hca)
    return (m.group("half"), m.group("port")) if m else None


def halves(hcas: list[str]) -> int:
    """How many PCIe halves the HCAs span (an HCA of unknown shape counts as one of its own)."""
    return len({(pcie_half(h) or (h, ""))[0] for h in hcas})


def figures_kind(inv) -> str:
    """Which of the field's figures (FIGURES) the cabling is held to: a ring or a mesh (each cable
    joins two nodes) is a "ring"; a pair, or nodes through a switch, a "pair" when every node's
    HCAs span both PCIe halves of the controller, else "half" (two HCAs of one half are one x4
    link, about 100 Gb/s, not a pair)."""
    if len(inv.nodes) < 2:
        return "single"
    kind = inv.cluster.topology or ("direct" if len(inv.nodes) == 2 else "switch")
    if kind in ("ring", "mesh"):
        return "ring"
    return "pair" if min(halves(n.hcas) for n in inv.nodes) >= 2 else "half"


def one_twin_cables(node) -> list[str]:
    """A ring's or mesh's ports carried by one PCIe half only: the port's twin on the other half is
    not in data_plane, so the cable runs at half its rate."""
    ports: dict[str, set[str]] = {}
    for h in node.hcas:
        hp = pcie_half(h)
        if hp:
            ports.setdefault(hp[1], set()).add(hp[0])
    return [
        f"port {p} ({', '.join(sorted(f'roce{x}s0f{p}' for x in hs))})"
        for p, hs in sorted(ports.items())
        if len(hs) < 2
    ]


def judge_cabling(inv) -> list[Result]:
    """A ring or mesh cable carried by one twin only: WARN on its node (the figures hold it to
    the full cable)."""
    if figures_kind(inv) != "ring":
        return []
    out = []
    for n in inv.nodes:
        lone = one_twin_cables(n)
        if lone:
            out.append(
                Result(
                    CABLING,
                    n.name,
                    "warn",
                    f"{'; '.join(lone)} carried by one PCIe half only: that cable runs at about half its "
                    "200 Gb/s (each x4 half carries about 100 Gb/s: eugr spark-vllm-docker docs/NETWORKING.md)",
                    "list both twins of each cabled port in data_plane (rocep1s0fN and roceP2p1s0fN with their "
                    f"netdevs), or draft it again: {inv.init_again()}",
                )
            )
        else:
            out.append(Result(CABLING, n.name, "ok", "every cable on both PCIe halves"))
    return out


def thresholds(expect: Expectation) -> tuple[float | None, float | None, str]:
    """(healthy, floor, where they come from) for this cluster; None where nothing is known. The
    field's figures scale with the slowest port's negotiated speed below what they were measured at."""
    base = FIGURES.get(expect.topology)
    scale, why = 1.0, ""
    if base and expect.port_mbps and expect.port_mbps < base.full_mbps:
        scale = expect.port_mbps / base.full_mbps
        why = f", scaled to a {expect.port_mbps // 1000}G port ({scale:g} of {base.full_mbps // 1000}G)"
    healthy = expect.healthy_gbps if expect.healthy_gbps is not None else (base.healthy * scale if base else None)
    floor = expect.floor_gbps if expect.floor_gbps is not None else (base.floor * scale if base else None)
    own = expect.healthy_gbps is not None or expect.floor_gbps is not None
    src = "the inventory's figures" if own else (base.source + why if base else "no figures")
    return (round(healthy, 2) if healthy else healthy), (round(floor, 2) if floor else floor), src


def uses_sockets(log: FabricLog) -> bool:
    """NCCL moved data over NET/Socket, or chose the Socket network and no connection was logged."""
    kinds = {k for r in log.ranks for k in r.kinds()}
    if "NET/Socket" in kinds:
        return True
    return not kinds and any(r.network == "Socket" and (r.nnodes or 0) > 1 for r in log.ranks)


def _env(node: str, log: FabricLog | None, facts: dict[str, NodeFacts]) -> dict[str, str]:
    """The NCCL_* variables known for a node: its facts, else what NCCL reported as set."""
    if node in facts and facts[node].env:
        return facts[node].env
    return {k: v for r in (log.ranks if log else []) for k, v in r.env.items()}


def socket_causes(
    node: str, log: FabricLog | None, facts: dict[str, NodeFacts], logs: dict[str, FabricLog]
) -> list[tuple[str, str]]:
    """Each likely reason NCCL uses (or would use) sockets on `node`, as (cause, fix), most certain
    first: a missing device, an HCA without a GID, a variable set elsewhere but not here, NCCL's own."""
    f = facts.get(node, NodeFacts())
    out: list[tuple[str, str]] = []
    if f.infiniband_dev is False:
        out.append(
            (
                "no /dev/infiniband in the container",
                "create the container with --device=/dev/infiniband (and IPC_LOCK, memlock unlimited)",
            )
        )
    for hca, ok in sorted(f.hca_gid_ok.items()):
        if not ok:
            out.append(
                (
                    f"HCA {hca} of NCCL_IB_HCA has no usable RoCE v2 IPv4 GID",
                    f"give {hca}'s interface its IPv4 address (the GID follows it), or drop it from NCCL_IB_HCA",
                )
            )
    mine = _env(node, log, facts)
    for var in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"):
        elsewhere = sorted(n for n in set(logs) | set(facts) if n != node and var in _env(n, logs.get(n), facts))
        if var not in mine and elsewhere:
            out.append(
                (
                    f"{var} is not set on this node (set on {', '.join(elsewhere)})",
                    f"pass {var} to this node's ranks as to the others",
                )
            )
    if mine.get("NCCL_IB_DISABLE") == "1":
        out.append(("NCCL_IB_DISABLE=1", "unset NCCL_IB_DISABLE"))
    if log and any(r.ib_no_device for r in log.ranks):
        out.append(
            (
                "NCCL found no RDMA device (NET/IB : No device found)",
                "check /dev/infiniband in the container and that NCCL_IB_HCA names active ports",
            )
        )
    return out


def _cabling(expect: Expectation) -> str:
    """The topology a signature is read for: point-to-point cables or not."""
    return "ring" if expect.topology == "ring" else ("single" if expect.topology == "single" else "direct")


def named_cause(log: FabricLog, expect: Expectation) -> tuple[str, str] | None:
    """(cause, fix) when NCCL's own words name a known cause (fabric/signatures)."""
    text = "\n".join(log.failures() + log.python_errors + log.probe_errors)
    return signatures.fix_for(text, _cabling(expect))


def _nccl_fix(failures: list[str]) -> str:
    text = " ".join(failures)
    if "Duplicate GPU" in text:
        return "give each rank its own GPU (CUDA_VISIBLE_DEVICES / LOCAL_RANK per rank)"
    if "NET plugin" in text or "No device found" in text:
        return "NCCL was told to use a network it cannot open: check NCCL_NET/NCCL_IB_HCA and /dev/infiniband"
    return "read the rank's NCCL log (NCCL_DEBUG=INFO) for the first WARN"


def judge_node(
    node: str, log: FabricLog | None, expect: Expectation, facts: dict[str, NodeFacts], logs: dict[str, FabricLog]
) -> Result:
    """The transport verdict for one node."""
    if log is None or not log.ranks:  # gloo, or no NCCL output: judge the facts alone
        causes = socket_causes(node, None, facts, logs) if expect.roce else []
        if causes:
            return Result(
                TRANSPORT,
                node,
                "fail",
                "no NCCL log here, but NCCL would fall back to sockets: " + "; ".join(c for c, _ in causes),
                causes[0][1],
            )
        return Result(TRANSPORT, node, "ok", "no NCCL on this node's ranks (gloo backend)")
    failures = log.failures()
    named = named_cause(log, expect)
    if named is not None:
        first = next((f for f in failures if signatures.causes(f, _cabling(expect))), None) or (
            failures[0] if failures else "see the rank's log"
        )
        return Result(TRANSPORT, node, "fail", f"NCCL failed: {first}; cause: {named[0]}", named[1])
    if failures and not any(r.init_complete for r in log.ranks) and not log.results:
        why = "; ".join(failures)
        if expect.roce and any("NET plugin" in f for f in failures):
            causes = socket_causes(node, log, facts, logs)
            fix = causes[0][1] if causes else _nccl_fix(failures)
            return Result(TRANSPORT, node, "fail", f"NCCL could not start: {why}", fix)
        return Result(TRANSPORT, node, "fail", f"NCCL could not start: {why}", _nccl_fix(failures))
    summary = "; ".join(sorted({r.summary() for r in log.ranks}))
    version = next((r.version for r in log.ranks if r.version), "?")
    if uses_sockets(log):
        if not expect.roce:
            return Result(TRANSPORT, node, "ok", f"NCCL {version}: {summary} (no RoCE links in the inventory)")
        causes = socket_causes(node, log, facts, logs)
        cause = "; ".join(c for c, _ in causes) or "no cause found in the facts"
        fix = causes[0][1] if causes else "run `sparkcluster doctor` on this node (rdma.*, containers.*)"
        return Result(
            TRANSPORT,
            node,
            "fail",
            f"NCCL {version} uses TCP sockets though the inventory has RoCE links ({summary}); likely cause: {cause}",
            fix,
        )
    ib = {d.name for r in log.ranks for d in r.ib_devices}
    if expect.topology == "pair" and expect.roce and any("NET/IB" in r.kinds() for r in log.ranks) and halves(ib) < 2:
        return Result(
            TRANSPORT,
            node,
            "warn",
            f"NCCL {version}: {summary}: one PCIe half of the pair only",
            "list both twins (rocep1s0fN and roceP2p1s0fN) in NCCL_IB_HCA and check the other's port is ACTIVE",
        )
    return Result(TRANSPORT, node, "ok", f"NCCL {version}: {summary}")


def _size(nbytes: int) -> str:
    if nbytes < MiB:
        return f"{nbytes / 1024:g} KiB"
    return f"{nbytes / 1024 / MiB:g} GiB" if nbytes >= 1024 * MiB else f"{nbytes / MiB:g} MiB"


# A ConnectX-7 that came up degraded (NVIDIA/dgx-spark-playbooks PR #108): the port negotiated 200 Gb/s
# and PCIe Gen5 x4, yet TCP and raw RDMA were capped near 13 Gb/s (12.86 and 13.23 Gb/s, clean link
# counters, DGX OS 7.5.0, firmware 28.45.4028); the PR's check calls "the characteristic 8-25 Gb/s
# result when the physical and PCIe links are otherwise healthy" its own status. Per rail, in Gb/s.
DEGRADED_INIT_GBITS = (8.0, 25.0)
DEGRADED_INIT = "NVIDIA/dgx-spark-playbooks PR #108"


def degraded_init(busbw_gbps: float, rails: int, port_mbps: int | None) -> bool:
    """Whether an all_gather over RDMA at `busbw_gbps` (GB/s) on `rails` rails reads as PR #108's
    degraded ConnectX-7: each rail in the characteristic range while the port negotiated its full 200G."""
    if rails < 1 or (port_mbps is not None and port_mbps < 200000):
        return False
    per_rail = busbw_gbps * 8 / rails
    return DEGRADED_INIT_GBITS[0] <= per_rail <= DEGRADED_INIT_GBITS[1]


def judge_bandwidth(
    results: list[ProbeResult],
    expect: Expectation,
    nodes: list[str],
    failed: bool = False,
    rdma_rails: int = 0,
) -> Result:
    """The bandwidth verdict, on the largest all_gather's bus bandwidth; one result for the cluster
    (named after its nodes: a collective's speed belongs to no single node). `rdma_rails`: the PCIe
    halves NCCL moved data over RDMA on, 0 where it did not (or the transport is not known)."""
    where = "+".join(nodes)
    top = largest(results)
    if top is None:
        if failed:
            return Result(BANDWIDTH, where, "skip", "no figures: NCCL did not start (see fabric.transport)")
        return Result(
            BANDWIDTH,
            where,
            "fail",
            "the test produced no all_gather figure",
            "run the probe by hand with NCCL_DEBUG=INFO and read its output",
        )
    healthy, floor, source = thresholds(expect)
    figure = f"all_gather busbw {top.busbw_gbps:g} GB/s at {_size(top.nbytes)}"
    if floor is not None and top.busbw_gbps < floor:
        if rdma_rails and degraded_init(top.busbw_gbps, rdma_rails, expect.port_mbps):
            per_rail = top.busbw_gbps * 8 / rdma_rails
            return Result(
                BANDWIDTH,
                where,
                "fail",
                f"{figure}, below the floor {floor:g} GB/s ({source}): {per_rail:.1f} Gb/s per rail over RDMA on "
                f"ports at 200G, the signature of a ConnectX-7 that initialized degraded ({DEGRADED_INIT}: "
                "RDMA capped near 13 Gb/s with the link and PCIe healthy)",
                "the adapter must initialize again: reboot the node whose ports read slow (a per-rail "
                "`ib_write_bw` tells which), then run `sparkcluster doctor --fabric` again",
            )
        return Result(
            BANDWIDTH,
            where,
            "fail",
            f"{figure}, below the floor {floor:g} GB/s ({source})",
            "check the transport (sockets or a mismatched NCCL give about 3 GB/s), the links' speed "
            "and MTU 9000 on both twins",
        )
    if healthy is not None and top.busbw_gbps < healthy:
        return Result(
            BANDWIDTH,
            where,
            "warn",
            f"{figure}, below the healthy {healthy:g} GB/s ({source})",
            "check MTU 9000 on both twins and that NCCL_IB_HCA lists both HCAs of the pair",
        )
    return Result(BANDWIDTH, where, "ok", f"{figure}" + (f" (healthy from {healthy:g} GB/s)" if healthy else ""))


def judge_directions(results: list[ProbeResult], rank_node: dict[int, str]) -> list[Result]:
    """One result per node that sends: the rate of each rank-to-next transfer, one direction at a
    time (the probe's p2p). A node whose sending is much slower than the fastest direction is named:
    the collective's figure alone cannot say which end of a link is slow."""
    p2p = [r for r in results if r.op == "p2p" and r.src is not None and r.dst is not None]
    if not p2p:
        return []
    best = max(r.algbw_gbps for r in p2p)
    out: dict[str, Result] = {}
    for r in sorted(p2p, key=lambda x: x.algbw_gbps):
        src, dst = rank_node.get(r.src, f"rank {r.src}"), rank_node.get(r.dst, f"rank {r.dst}")
        if src == dst or src in out:
            continue
        line = f"{src} -> {dst}: {r.algbw_gbps:g} GB/s ({_size(r.nbytes)}, the fastest direction {best:g})"
        if best > 0 and r.algbw_gbps < ASYMMETRY * best:
            out[src] = Result(
                DIRECTION,
                src,
                "fail",
                f"sending is slow: {line}",
                f"check {src}'s egress: the link's speed and any traffic shaping (tc qdisc) on its "
                "interfaces, the cable, and the port's error counters",
            )
        else:
            out[src] = Result(DIRECTION, src, "ok", line)
    return [out[n] for n in sorted(out)]


def judge_latency(results: list[ProbeResult], nodes: list[str]) -> Result | None:
    """The decode-size all-reduce's time per call (the probe's op "latency"), beside the bandwidth; one
    result for the cluster. None where the probe printed none (an older probe, or one rank)."""
    found = [r for r in results if r.op == "latency"]
    if not found:
        return None
    r, where = found[-1], "+".join(nodes)
    figure = f"all_reduce of {_size(r.nbytes)}: {r.time_us:g} us per call"
    if r.backend and r.backend != "nccl":
        return Result(LATENCY, where, "skip", f"{figure} over {r.backend}, not NCCL: the field's figure is NCCL's")
    if r.time_us > NCCL_48K_US[1]:
        return Result(
            LATENCY,
            where,
            "warn",
            f"{figure}, above {NCCL_48K_SOURCE}: decode issues about 100 such calls a step",
            "check NCCL_IB_HCA names the RoCE devices (sockets or a proxy thread starved of CPU add tens of "
            "us a call); a profile may move decode off NCCL with VLLM_ENABLE_ROCE_ALLREDUCE=1 where the "
            "image carries b12x's RoCEnante (b12x PR #295)",
        )
    return Result(LATENCY, where, "ok", f"{figure} ({NCCL_48K_SOURCE})")


def judge(
    logs: dict[str, FabricLog],
    expect: Expectation,
    facts: dict[str, NodeFacts] | None = None,
    results: list[ProbeResult] | None = None,
    rank_node: dict[int, str] | None = None,
) -> list[Result]:
    """Every verdict of one fabric test: a transport result per node (in the order given), then the
    bandwidth. `results` default to the probe's lines found in the logs (rank 0's node prints them)."""
    facts = facts or {}
    out = [judge_node(node, log, expect, facts, logs) for node, log in logs.items()]
    if results is None:
        results = [res for log in logs.values() for res in log.results]
    failed = any(r.status == "fail" for r in out)
    # the PCIe halves NCCL moved data over RDMA on, where every node did (PR #108's signature needs RDMA)
    rdma = all(log.ranks and not uses_sockets(log) for log in logs.values()) and any(
        "NET/IB" in r.kinds() for log in logs.values() for r in log.ranks
    )
    rails = min((halves({d.name for r in log.ranks for d in r.ib_devices}) for log in logs.values()), default=0)
    rails = rails if rdma else 0
    sizes = [r for r in results if r.op not in ("p2p", "latency")]
    out.append(judge_bandwidth(sizes, expect, list(logs), failed, rails))
    latency = judge_latency(results, list(logs))
    out += [latency] if latency is not None else []
    out += judge_directions(results, rank_node or {})
    return out


GPU_SPEED = "fabric.gpu_speed"
# a node whose fixed GPU workload takes this many times the median node's is named: a GB10 stuck in a
# low-power state paced a whole TP group at 63 against 94 ms per step (tonyd2wild DeepSeek-V4.1 #1),
# about 1.5x, with nvidia-smi showing nothing; run-to-run noise of the same product is a few percent
SLOW_GPU_FACTOR = 1.3


def judge_gpu_speed(seconds: dict[str, float | None], factor: float = SLOW_GPU_FACTOR) -> list[Result]:
    """One row per node: WARN naming a node whose GPU workload took more than `factor` times the median
    node's (the TP group runs at its slowest GPU's pace), OK otherwise; skipped without two timed nodes."""
    known = {n: s for n, s in seconds.items() if s}
    if len(known) < 2:
        return [Result(GPU_SPEED, n, "skip", "fewer than two nodes timed: nothing to compare with") for n in seconds]
    ordered = sorted(known.values())
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    out = []
    for n, s in seconds.items():
        if not s:
            out.append(Result(GPU_SPEED, n, "skip", "the GPU workload was not timed here"))
        elif s > factor * median:
            out.append(
                Result(
                    GPU_SPEED,
                    n,
                    "warn",
                    f"the fixed GPU workload took {s:.3f}s here, {s / median:.1f}x the median node's {median:.3f}s: "
                    "this GPU will pace the whole TP group (a GB10 held in a low-power state shows nothing in "
                    "nvidia-smi; tonyd2wild DeepSeek-V4.1 #1)",
                    f"on {n}: nvidia-smi -q -d PERFORMANCE,CLOCK (clock event reasons), check its cooling and power "
                    "supply, then reboot it; sparkcluster doctor --fabric times it again",
                )
            )
        else:
            out.append(Result(GPU_SPEED, n, "ok", f"{s:.3f}s for the fixed GPU workload (median {median:.3f}s)"))
    return out
