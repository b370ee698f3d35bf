"""Where the fabric test runs: one rank per GPU, in a container of the cluster image on every node,
with exactly the environment, devices and flags the serving ranks get.

The serving containers are used when they run and no server does (a server would compete for the
links and the GPUs, and its figures would not be the fabric's); when a node has none, a throwaway
container is made from the same specification (`up/spec_for`) with a sleep as its
foreground process, and removed afterwards, whatever happened. Each rank is a `docker exec` of the
standard-library-plus-torch probe (`node/fabric_probe.py`), started on every node at once; its
output (NCCL's INFO log and the probe's result lines) comes back as a value per rank.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

import docker

from sparkcluster import log, programs
from sparkcluster.config import profile as profiles
from sparkcluster.config.inventory import Inventory
from sparkcluster.container.spec import ContainerSpec, files_tar, spec_for
from sparkcluster.deployment import server
from sparkcluster.errors import SparkError
from sparkcluster.fabric.nccl_log import MARKER
from sparkcluster.labels import CLUSTER_LABEL, ROLE_LABEL
from sparkcluster.remote.dockerapi import run_in
from sparkcluster.remote.fanout import ConnectedHosts, run_each

_log = log.get(__name__)

PROBE_DIR = "/tmp/sparkcluster-fabric"
PROBE_PATH = f"{PROBE_DIR}/fabric_probe.py"
# the probe runs CUDA and NCCL: under bash, whose BASH_ENV re-runs an NGC image's /etc/shinit_v2 (its
# forward-compatibility switch), which a `docker exec` does not inherit from the container's start-up
# (NVIDIA's two-Spark playbook serves with `docker exec ... bash -c` for the same reason:
# NVIDIA/dgx-spark-playbooks nvidia/vllm/README.md; container/spec.keeps_entrypoint)
IN_START_UP = ["bash", "-c", 'unset NCCL_DEBUG_FILE; exec python3 "$@"', "bash", PROBE_PATH]
FABRIC_LABEL = "org.sparkcluster.fabric"  # a throwaway container of the fabric test, never a serving one
# the probe's NCCL lines on its own output: INIT and NET say which transport NCCL chose, ENV which
# variables it read (the container's NCCL_DEBUG_FILE is the engine's, unset for the probe); the
# container's own variables (the profile's, the cabling's NCCL_ALGO and routing) pass through, and
# NCCL_CUMEM_ENABLE=0 as vLLM sets it in the engine (the probe sets it itself too, as vLLM does)
PROBE_NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV", "NCCL_CUMEM_ENABLE": "0"}


# a slim image may carry no procps: the probe's processes are found through /proc, this shell excepted
KILL_PROBES = (
    'for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] && continue; '
    f'case "$(tr "\\0" " " < "$p/cmdline" 2>/dev/null)" in *{PROBE_PATH}*) kill -9 "${{p#/proc/}}";; esac; '
    f"done; rm -rf {PROBE_DIR}; true"
)


def probe_source() -> str:
    return programs.source("sparkcluster.node.fabric_probe")


@dataclass(frozen=True)
class Placement:
    """Where one node's ranks run."""

    node: str
    container: str  # ID
    throwaway: bool
    has_ib_devices: bool  # /dev/infiniband with a uverbs device, as NCCL's IB transport needs it


@dataclass
class RankOutput:
    node: str
    rank: int
    exit_code: int
    output: str  # stdout and stderr together: NCCL's log lines and the probe's result lines


@dataclass
class FabricTest:
    """One fabric test as it ran: where each node's ranks were placed and what each rank printed."""

    placements: dict[str, Placement] = field(default_factory=dict)
    ranks: list[RankOutput] = field(default_factory=list)
    # per node, the seconds of the probe's fixed GPU workload (None: it did not run or say)
    gpu_seconds: dict[str, float | None] = field(default_factory=dict)


class ServerRunning(SparkError):
    pass


def _serving_container(api, cluster_name: str, role: str) -> str | None:
    """The running container of this cluster on the node (by label), if any."""
    for c in api.containers(filters={"label": [f"{CLUSTER_LABEL}={cluster_name}", f"{ROLE_LABEL}={role}"]}):
        if FABRIC_LABEL not in (c.get("Labels") or {}):
            return c["Id"]
    return None


def throwaway_spec(inv: Inventory, prof: profiles.Profile, node, image: str) -> ContainerSpec:
    """The node's serving container as `up` would make it, renamed, with a sleep for its process, and
    without the compile cache's mount: it compiles nothing, and Docker would make a missing folder
    there as root (up makes it as the SSH user, in the containers stage)."""
    spec = spec_for(inv, prof, node, image)
    hf = inv.hf_cache(node.name)
    return ContainerSpec(
        node=spec.node,
        role=spec.role,
        name=f"{spec.name}-fabric",
        image=spec.image,
        command=[],
        env=spec.env,
        labels={**spec.labels, FABRIC_LABEL: "1"},
        shm_size=spec.shm_size,
        binds={h: c for h, c in spec.binds.items() if h == hf},
        files={},
        ulimit_stack=spec.ulimit_stack,
        ulimit_nofile=spec.ulimit_nofile,
        image_entrypoint=spec.image_entrypoint,  # NGC's start-up, as the serving container's
    )


def _create_throwaway(api, spec: ContainerSpec, created) -> str:
    host_config = {**spec.host_config_kwargs(), "restart_policy": None, "init": True}
    hc = api.create_host_config(**host_config)
    kwargs = {**spec.create_kwargs(), "command": ["sleep", "infinity"]}  # the spec's labels mark it a throwaway
    c = api.create_container(host_config=hc, **kwargs)
    created(c["Id"])
    api.start(c["Id"])
    return c["Id"]


def place(
    cluster: ConnectedHosts, inv: Inventory, prof: profiles.Profile, image: str, made: dict[str, str]
) -> dict[str, Placement]:
    """A container for every node's ranks. `made` hears each throwaway container as soon as it
    exists (node -> ID), so the caller removes it whatever fails later."""
    lock = threading.Lock()

    def one(n) -> Placement:
        api = cluster.hosts[n.name].docker().api
        cid = _serving_container(api, inv.cluster.name, n.role)
        throwaway = False
        if cid is not None and n.role == "head":
            rec = server.current(api, cid)
            if rec is not None:
                raise ServerRunning(
                    f"{n.name}: vllm serve (pid {rec.pid}) is running; the fabric test would compete "
                    "with it for the links and the GPUs",
                    "run `sparkcluster down` first, or test while nothing serves",
                )
        if cid is None:
            stale = api.containers(all=True, filters={"label": [f"{CLUSTER_LABEL}={inv.cluster.name}", FABRIC_LABEL]})
            for c in stale:  # an earlier test killed before its clean-up
                api.remove_container(c["Id"], force=True)

            def remember(x: str) -> None:
                with lock:
                    made[n.name] = x

            cid = _create_throwaway(api, throwaway_spec(inv, prof, n, image), remember)
            throwaway = True
        api.put_archive(cid, "/", files_tar({PROBE_PATH: probe_source()}))
        devs = run_in(api, cid, ["sh", "-c", "ls /dev/infiniband 2>/dev/null"], warn=True)
        return Placement(n.name, cid, throwaway, "uverbs" in devs.stdout)

    return run_each(((n.name, n) for n in inv.nodes), one).values_or_raise("fabric")


def rank_env(inv: Inventory, port: int) -> dict[str, dict[int, dict[str, str]]]:
    """Per node, per global rank: the variables a rank of the probe is started with (on top of the
    container's own, which are the serving ranks')."""
    out: dict[str, dict[int, dict[str, str]]] = {}
    world = inv.gpu_count
    rank = 0
    for n in inv.nodes:
        out[n.name] = {}
        for local in range(n.gpus):
            out[n.name][rank] = {
                **PROBE_NCCL_ENV,
                "RANK": str(rank),
                "LOCAL_RANK": str(local),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(n.gpus),
                "MASTER_ADDR": str(inv.head.control_ip),
                "MASTER_PORT": str(port),
            }
            rank += 1
    return out


def run_ranks(
    cluster: ConnectedHosts, inv: Inventory, placements: dict[str, Placement], port: int, probe_args: list[str]
) -> list[RankOutput]:
    """Every rank at once (a collective needs them all), each a `docker exec` that returns when the
    probe exits; the probe bounds its own rendezvous and collectives."""
    jobs = {f"{n}#{r}": (n, r, env) for n, ranks in rank_env(inv, port).items() for r, env in ranks.items()}
    argv = [*IN_START_UP, *probe_args]

    def one(job) -> RankOutput:
        n, r, env = job
        res = run_in(cluster.hosts[n].docker().api, placements[n].container, argv, warn=True, environment=env)
        return RankOutput(n, r, res.exit_code, res.stdout)

    got = run_each(jobs.items(), one)
    outs = [
        o.value if o.ok else RankOutput(jobs[key][0], jobs[key][1], -1, f"the rank could not be run: {o.error}")
        for key, o in got.items()
    ]
    return sorted(outs, key=lambda x: x.rank)


def parse_gpu_time(output: str) -> float | None:
    """The seconds `fabric_probe.py --gpu-time` printed, or None."""
    for line in output.splitlines():
        if line.startswith(MARKER):
            try:
                got = json.loads(line[len(MARKER) :]).get("gpu_seconds")
            except ValueError:
                continue
            if isinstance(got, (int, float)) and got > 0:
                return float(got)
    return None


def time_gpus(cluster: ConnectedHosts, placements: dict[str, Placement]) -> dict[str, float | None]:
    """The fixed GPU workload on each node, one node at a time (nothing else on the machine's links or
    GPUs competes with it), after the collective."""
    out: dict[str, float | None] = {}
    for n, p in placements.items():
        try:
            res = run_in(cluster.hosts[n].docker().api, p.container, [*IN_START_UP, "--gpu-time"], warn=True)
            out[n] = parse_gpu_time(res.stdout) if res.exit_code == 0 else None
        except Exception as e:  # noqa: BLE001 - a node whose time is unknown is skipped, never judged
            _log.warning("the GPU workload could not be timed", node=n, error=str(e))
            out[n] = None
    return out


def clean_up(cluster: ConnectedHosts, placements: dict[str, Placement], made: dict[str, str]) -> list[str]:
    """Remove every throwaway container; in a serving container, stop any probe still running.
    Returns what could not be cleaned (never raises: the verdict is already in hand)."""
    problems = []
    for n, cid in made.items():
        try:
            cluster.hosts[n].docker().api.remove_container(cid, force=True)
        except docker.errors.NotFound:
            pass
        except Exception as e:  # noqa: BLE001 - reported, the caller goes on
            problems.append(f"{n}: the fabric test's container {cid[:12]} was not removed: {e}")
    for n, p in placements.items():
        if p.throwaway:
            continue
        try:
            api = cluster.hosts[n].docker().api
            run_in(api, p.container, ["sh", "-c", KILL_PROBES], warn=True)
        except Exception as e:  # noqa: BLE001
            problems.append(f"{n}: could not clean the fabric probe out of {p.container[:12]}: {e}")
    return problems


def run(
    cluster: ConnectedHosts, inv: Inventory, prof: profiles.Profile, image: str, port: int, probe_args: list[str]
) -> FabricTest:
    made: dict[str, str] = {}
    out = FabricTest()
    try:
        out.placements = place(cluster, inv, prof, image, made)
        out.ranks = run_ranks(cluster, inv, out.placements, port, probe_args)
        out.gpu_seconds = time_gpus(cluster, out.placements)
    finally:
        for line in clean_up(cluster, out.placements, made):
            _log.warning("fabric clean-up", problem=line)
    return out
