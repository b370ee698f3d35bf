"""Executors of the test double: a Ray one (placement group + one rank actor per GPU bundle, as
vLLM's RayDistributedExecutor) and an in-process one for world size 1 without Ray.

`ray` is imported only here, only when the Ray executor starts.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from vllm_standin import checks, knobs, ray_env
from vllm_standin.logger import init_logger
from vllm_standin.network_utils import get_ip
from vllm_standin.worker import RankWorker

logger = init_logger(__name__)


# Per-host settings worth showing per rank (a head value copied over a worker's shows up here).
PER_HOST_VARS = (
    "VLLM_HOST_IP",
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_IB_DISABLE",
    "UCX_NET_DEVICES",
    "GLOO_SOCKET_IFNAME",
)


class Interrupted(Exception):
    """SIGTERM/SIGINT arrived while the engine was starting."""


class EngineDeadError(RuntimeError):
    pass


def _worker_prefix(r: dict) -> str:
    return f"(RayWorkerWrapper pid={r['pid']}, ip={r['node_ip']})"


class BaseExecutor:
    world_size: int = 1
    reports: list[dict]

    def __init__(self, args, stop: threading.Event):
        self.args = args
        self.stop = stop
        self.model = args.model
        self.reports = []
        self._killed: set[int] = set()

    # -- checks shared by both executors ------------------------------------------------------
    def _log_reports(self) -> None:
        for r in self.reports:
            logger.info(
                "Worker rank %d: hostname=%s pid=%d ip=%s ray_node_ip=%s node_id=%s",
                r["rank"],
                r["hostname"],
                r["pid"],
                r["ip"],
                r["node_ip"],
                r["node_id"][:12],
            )
            shown = {k: r["env"].get(k) for k in PER_HOST_VARS if k in r["env"]}
            logger.info("Worker rank %d network environment: %s", r["rank"], shown)

    def _check_nccl(self) -> None:
        if self.world_size <= 1:
            return
        for r in sorted(self.reports, key=lambda r: r["rank"]):
            for level, text in r["nccl"]["lines"]:
                print(
                    f"{_worker_prefix(r)} {r['hostname']}:{r['pid']}:{r['pid']} [0] NCCL {level} {text}",
                    file=sys.stderr,
                    flush=True,
                )
        for r in sorted(self.reports, key=lambda r: r["rank"]):
            if r["nccl"]["error"]:
                from vllm_standin.nccl import DistBackendError

                raise DistBackendError(f"rank {r['rank']} ({r['ip']}): {r['nccl']['error']}")
        transports = {r["rank"]: r["nccl"]["transport"] for r in self.reports}
        logger.info("NCCL transport per rank: %s", transports)

    def _sleep(self, seconds: float) -> None:
        if self.stop.wait(max(0.0, float(seconds))):
            raise Interrupted()

    def _load_weights(self) -> None:
        k = knobs.load()
        t0 = time.time()
        logger.info("Starting to load model %s...", self.model)
        self._sleep(k["load_seconds"])
        took = time.time() - t0
        logger.info("Loading weights took %.2f seconds", took)
        logger.info("Model loading took 0.01 GiB memory and %.6f seconds", took)

    def _check_required_env(self) -> None:
        err = checks.required_env_error(self.model, self.reports)
        if err:
            raise RuntimeError(err)

    def start(self) -> None:
        raise NotImplementedError

    def step_all(self, step: int, seed: int, timeout: float) -> str:
        raise NotImplementedError

    def kill_rank(self, k: int) -> None:
        pass

    def shutdown(self) -> None:
        pass


class UniExecutor(BaseExecutor):
    """World size 1 without Ray: the single rank lives in this process."""

    def start(self) -> None:
        self.worker = RankWorker(0, self.model)
        self.reports = [self.worker.probe(list(checks.required_env(self.model)))]
        self._log_reports()
        self._load_weights()
        self._check_required_env()

    def step_all(self, step: int, seed: int, timeout: float) -> str:
        if 0 in self._killed:
            raise EngineDeadError("EngineCore died")
        return self.worker.step(step, seed)

    def kill_rank(self, k: int) -> None:
        self._killed.add(k)


class RayExecutor(BaseExecutor):
    def __init__(self, args, stop: threading.Event):
        super().__init__(args, stop)
        self.world_size = args.tensor_parallel_size * args.pipeline_parallel_size
        self.pg = None
        self.actors: list = []
        self.ray = None

    def start(self) -> None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray = ray
        driver_ip = get_ip()
        if ray.is_initialized():
            logger.info("Ray is already initialized. Skipping Ray initialization.")
        else:
            # ray.init installs its own SIGTERM/SIGINT handlers (the C++ one kills the process on
            # the spot); keep ours, so that SIGTERM is a graceful shutdown as in vLLM.
            saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
            ray.init(address="auto", logging_level="WARNING", log_to_driver=True)
            for s, h in saved.items():
                if h is not None:
                    signal.signal(s, h)
        logger.info("Connected to Ray cluster; driver ip %s", driver_ip)

        # The driver's node must have a GPU (vLLM pins bundle 0 to it with `node:<driver ip>`).
        node_id = ray.get_runtime_context().get_node_id()
        node = next((n for n in ray.nodes() if n["NodeID"] == node_id), {})
        node_res = dict(node.get("Resources", {}))
        if node_res.get("GPU", 0) < 1:
            raise ValueError(
                f"Current node has no GPU available. current_node_resource={node_res}. vLLM "
                "engine cannot start without GPU. Make sure you have at least 1 GPU available "
                f"in a node current_node_id={node_id!r} current_ip={driver_ip!r}."
            )
        if ray.cluster_resources().get("GPU", 0) < self.world_size:
            logger.warning(
                "The number of required GPUs exceeds the total number of available GPUs in the placement group."
            )

        specs: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(self.world_size)]
        specs[0][f"node:{driver_ip}"] = 0.001
        self.pg = placement_group(specs, strategy="PACK")
        self._wait_pg(specs)

        plan = ray_env.get_env_vars_to_copy(destination="workers")
        RemoteRank = ray.remote(num_cpus=0, num_gpus=1)(RankWorker)
        for rank in range(self.world_size):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self.pg,
                placement_group_capture_child_tasks=True,
                placement_group_bundle_index=rank,
            )
            self.actors.append(
                RemoteRank.options(
                    scheduling_strategy=strategy,
                    runtime_env={"env_vars": dict(plan.copied)},
                ).remote(rank, self.model)
            )
        required = list(checks.required_env(self.model))
        refs = [a.probe.remote(required) for a in self.actors]
        self.reports = self._get(refs, timeout=180.0)
        self._log_reports()

        n_nodes = len({r["node_id"] for r in self.reports})
        logger.info(
            "Ranks are hosted by %d Ray node(s) %s; rank IPs %s; driver IP %s",
            n_nodes,
            sorted({r["node_ip"] for r in self.reports}),
            [r["ip"] for r in self.reports],
            driver_ip,
        )
        err = checks.unique_ip_error(self.reports, driver_ip)
        if err:
            raise RuntimeError(err)
        err = checks.ip_node_mismatch_error(self.reports)
        if err:
            raise RuntimeError(err)
        self._check_nccl()
        self._load_weights()
        self._check_required_env()

    def _get(self, refs, timeout: float):
        ray = self.ray
        deadline = time.time() + timeout
        pending = list(refs)
        while pending:
            if self.stop.is_set():
                raise Interrupted()
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            if time.time() > deadline:
                raise TimeoutError(f"rank workers did not answer within {timeout:.0f} seconds")
        return ray.get(refs)

    def _wait_pg(self, specs) -> None:
        ray = self.ray
        limit = float(knobs.load()["pg_wait_seconds"])
        s = time.time()
        ready_ref = self.pg.ready()
        next_log, interval = s + 10, 10
        while time.time() - s < limit:
            if self.stop.is_set():
                raise Interrupted()
            ready, _ = ray.wait([ready_ref], timeout=0.5)
            if ready:
                logger.info("Placement group of %d GPU bundles is ready: %s", len(specs), specs)
                return
            if time.time() >= next_log:
                interval *= 2
                next_log = time.time() + interval
                logger.info(
                    "Waiting for creating a placement group of specs for %d seconds. specs=%s. "
                    "Check `ray status` and `ray list nodes` to see if you have enough resources, "
                    "and make sure the IP addresses used by ray cluster are the same as "
                    "VLLM_HOST_IP environment variable specified in each node if you are running "
                    "on a multi-node.",
                    int(time.time() - s),
                    specs,
                )
        total = sum(sp.get("GPU", 0) for sp in specs)
        if total > 1:
            raise ValueError(
                f"Cannot provide a placement group requiring {total:g} GPUs "
                f"(placement_group_specs={specs}) within {limit:g} seconds.\n"
                "Tensor parallel size may exceed available GPUs in your cluster. Check resources "
                "with `ray status` and `ray list nodes`.\n"
                "If running on K8s with limited GPUs, consider reducing --tensor-parallel-size to "
                "match available GPU resources."
            )
        raise ValueError(
            f"Cannot provide a placement group of placement_group_specs={specs} within "
            f"{limit:g} seconds. See `ray status` and `ray list nodes` to make sure the cluster "
            "has enough resources."
        )

    def step_all(self, step: int, seed: int, timeout: float) -> str:
        ray = self.ray
        try:
            outs = ray.get([a.step.remote(step, seed) for a in self.actors], timeout=timeout)
        except Exception as e:  # RayActorError, GetTimeoutError, ...
            raise EngineDeadError(f"{type(e).__name__}: {e}") from e
        return outs[0]

    def kill_rank(self, k: int) -> None:
        if 0 <= k < len(self.actors) and k not in self._killed:
            self._killed.add(k)
            logger.warning("Test knob kill_rank=%d: making rank %d's worker exit", k, k)
            self.actors[k].die.remote()

    def shutdown(self) -> None:
        ray = self.ray
        if ray is None:
            return
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        if self.actors:
            logger.info("Killed %d rank worker actor(s)", len(self.actors))
        self.actors = []
        if self.pg is not None:
            try:
                ray.util.remove_placement_group(self.pg)
                logger.info("Removed placement group %s", self.pg.id.hex())
            except Exception:
                pass
            self.pg = None
        try:
            ray.shutdown()
        except Exception:
            pass


def make_executor(args, stop: threading.Event) -> BaseExecutor:
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    backend = args.distributed_executor_backend
    if backend is None:
        backend = "ray" if world > 1 else "uni"
        if world > 1:
            logger.info("Defaulting to use %s for distributed inference", backend)
    args.distributed_executor_backend = backend
    if backend == "ray":
        return RayExecutor(args, stop)
    if world > 1:
        raise RuntimeError(
            f"The test double runs world size {world} only with "
            "--distributed-executor-backend ray (a DGX Spark has one GPU per node)."
        )
    return UniExecutor(args, stop)
