"""The fabric test from start to verdict, as `doctor --fabric` and `up` run it: the ranks launched
in the cluster's containers (`launch`), their output parsed (`nccl_log`), judged (`judge`) against
what the inventory says the fabric is, with the facts `doctor` gathered naming a likely cause."""

from __future__ import annotations

from sparkcluster.checks import Result, rdma
from sparkcluster.config import profile as profiles
from sparkcluster.config.images import image_ref
from sparkcluster.config.inventory import Inventory
from sparkcluster.errors import SparkError
from sparkcluster.fabric import judge, launch, nccl_log, record
from sparkcluster.facts import HostFacts
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.steps import walk
from sparkcluster.steps.base import Step
from sparkcluster.steps.walk import CommandRun

RUN = "fabric.run"
STAGE = "fabric"


def port_mbps(inv: Inventory, facts: dict[str, HostFacts] | None) -> int | None:
    """The slowest negotiated speed among the data-plane ports (sysfs `speed`, in the facts), or
    None when no port's speed is known."""
    speeds = [
        f.interfaces[link.netdev].speed_mbps
        for n in inv.nodes
        if (f := (facts or {}).get(n.name)) is not None
        for link in n.data_plane
        if link.netdev in f.interfaces and f.interfaces[link.netdev].speed_mbps
    ]
    return min(speeds) if speeds else None


def expectation(inv: Inventory, facts: dict[str, HostFacts] | None = None) -> judge.Expectation:
    """The inventory's fabric: RoCE links when there is a peer to reach, and the figures its cabling
    is held to (`judge.figures_kind`, scaled by the ports' negotiated speed) unless the inventory's
    [fabric] sets its own."""
    return judge.Expectation(
        roce=len(inv.nodes) > 1,
        topology=judge.figures_kind(inv),
        healthy_gbps=inv.fabric.healthy_gbps,
        floor_gbps=inv.fabric.floor_gbps,
        port_mbps=port_mbps(inv, facts),
    )


def node_facts(
    inv: Inventory, prof: profiles.Profile, facts: dict[str, HostFacts], placements: dict[str, launch.Placement]
) -> dict[str, judge.NodeFacts]:
    """What can explain a fallback to sockets, per node: the rank container's devices, each HCA's
    RoCE v2 IPv4 GID (from the facts), and the NCCL variables the ranks get."""
    out = {}
    for n in inv.nodes:
        f = facts.get(n.name)
        gid_ok = {h: bool(rdma.gid_v4(f, h)) for h in n.hcas} if f else {}
        env = {k: v for k, v in profiles.container_env(prof, inv, n).items() if k.startswith("NCCL_")}
        p = placements.get(n.name)
        out[n.name] = judge.NodeFacts(infiniband_dev=p.has_ib_devices if p else None, hca_gid_ok=gid_ok, env=env)
    return out


def probe_args(inv: Inventory) -> list[str]:
    # a third of the test's bound for the rendezvous, half for the measurements (the probe takes fewer
    # iterations on a slow link and skips the largest sizes once that is spent), the rest for
    # starting the interpreter and torch in each rank
    t = inv.fabric.timeout_s
    return [
        "--max-bytes",
        str(inv.fabric.max_bytes),
        "--ops",
        "all_gather,all_reduce,p2p",
        "--init-timeout",
        f"{max(10.0, t / 3):g}",
        "--budget",
        f"{t / 2:g}",
    ]


def summarise(run: launch.FabricTest) -> dict[str, nccl_log.FabricLog]:
    """Each node's ranks' output, parsed together (a node's ranks share its transports)."""
    by_node: dict[str, list[str]] = {}
    for r in run.ranks:
        by_node.setdefault(r.node, []).append(r.output)
    return {node: nccl_log.parse_many(texts) for node, texts in by_node.items()}


def failed_ranks(run: launch.FabricTest, logs: dict[str, nccl_log.FabricLog], inv: Inventory) -> list[Result]:
    """A rank that exited non-zero with nothing NCCL said to explain it: the probe's own last lines."""
    out = []
    for r in run.ranks:
        log = logs.get(r.node)
        if r.exit_code == 0 or (log is not None and log.failures()):
            continue  # judge names NCCL's reason
        tail = "\n".join(r.output.strip().splitlines()[-6:]) or "(no output)"
        out.append(
            Result(
                RUN,
                r.node,
                "fail",
                f"rank {r.rank} exited {r.exit_code}: {tail}",
                f"every rank must reach {inv.head.control_ip}:{inv.fabric.port} (the head's control IP, "
                "[fabric] port): check the control links and that the port is free on the head",
            )
        )
    return out


def rank_nodes(inv: Inventory) -> dict[int, str]:
    return {rank: node for node, ranks in launch.rank_env(inv, 0).items() for rank in ranks}


def run(
    cluster: ConnectedHosts, inv: Inventory, prof: profiles.Profile, image: str, facts: dict[str, HostFacts]
) -> list[Result]:
    """The test on every node of `inv`, judged. Never leaves a container or a process behind."""
    try:
        r = launch.run(cluster, inv, prof, image, inv.fabric.port, probe_args(inv))
    except SparkError as e:  # it could not run (a server running, an engine refusing): one FAIL, its fix
        return [Result(RUN, "+".join(n.name for n in inv.nodes), "fail", e.message, e.fix)]
    logs = summarise(r)
    out = failed_ranks(r, logs, inv)
    expect = expectation(inv, facts)
    out += judge.judge(logs, expect, node_facts(inv, prof, facts, r.placements), rank_node=rank_nodes(inv))
    out += judge.judge_gpu_speed(r.gpu_seconds)
    record.write(cluster, r.placements, record.figures(logs, expect))  # for node/metrics
    return out + judge.judge_cabling(inv)


def test_steps(
    cluster: ConnectedHosts, inv: Inventory, prof: profiles.Profile, image: str, facts: dict[str, HostFacts]
) -> list[Step]:
    """`doctor --fabric`'s test as the step its dry run prints and the walk runs: a throwaway
    container of the cluster image on each node (or the deployment's own, where one runs and does
    not serve), every rank at once, the GPU workload node by node, every throwaway removed."""
    f = inv.fabric
    return [
        Step(
            STAGE,
            inv.head.name,
            "test",
            f"measure the fabric between {len(inv.nodes)} nodes in a throwaway container of {image} on each "
            "(the deployment's own where one runs), removed after",
            f"all_gather, all_reduce up to {f.max_bytes >> 20} MiB and each direction, one rank per GPU "
            f"(rendezvous {inv.head.control_ip}:{f.port}, within {f.timeout_s:g}s), then the GPU workload "
            "on each node in turn",
            run=lambda r: run(cluster, inv, prof, image, facts),
        )
    ]


def walk_test(steps: list[Step]) -> list[Result]:
    """The test's steps walked by the step engine; its results."""
    return [x for _, results in walk.walk(CommandRun(stage=STAGE), steps) for x in results]


def preconditions(inv: Inventory, prof: profiles.Profile | None, rep) -> Result | None:
    """Why the test cannot run at all (one FAIL for the cluster), or None."""
    where = "+".join(n.name for n in inv.nodes)
    if prof is None:
        return Result(
            RUN,
            where,
            "fail",
            "the fabric test runs in the cluster's containers, which a profile shapes",
            "pass --profile NAME (or set cluster.profile in the inventory)",
        )
    if rep.unreachable:
        return Result(
            RUN,
            where,
            "fail",
            f"not every node answers ({', '.join(sorted(rep.unreachable))})",
            "fix ssh.reachable first: a collective needs every node",
        )
    image = image_ref(inv, prof)
    missing = sorted(n for n, f in rep.facts.items() if not f.image_id)
    if missing:
        return Result(
            RUN,
            where,
            "fail",
            f"the cluster image {image} is not on {', '.join(missing)}",
            f"`sparkcluster up --profile {prof.name}` builds and distributes it (and runs this test)",
        )
    return None
