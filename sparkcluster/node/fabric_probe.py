"""The fabric test's rank program: one process per GPU runs all_gather and all_reduce through
`torch.distributed` and rank 0 prints the bus bandwidth per size.

Why it exists: NCCL falls back from RoCE to TCP sockets without complaint, and configuration that
reads right can still move data slowly. Only a collective run with the ranks' own environment,
devices and flags shows what the fabric does; this is that collective, small enough to ship into a
container as one file.

Standard library and torch only (the NGC/vLLM image carries PyTorch): this file is copied into the
cluster's containers and run there with the image's python, so it imports nothing of sparkcluster.

Environment, as torchrun sets it (the controller sets the same itself, one process per GPU):
RANK, WORLD_SIZE, LOCAL_RANK (default 0), MASTER_ADDR, MASTER_PORT. NCCL's own variables
(NCCL_DEBUG, NCCL_DEBUG_FILE, NCCL_IB_HCA, the cabling's NCCL_ALGO, ...) pass through untouched,
except NCCL_CUMEM_ENABLE, set to 0 as vLLM sets it in the engine (ENGINE_NCCL_ENV).

Sizes: powers of 4 from 1 MiB up to --max-bytes (1, 4, 16, 64, 256 MiB, 1 GiB by default), the
largest always included. A size is what nccl-tests calls it: for all_gather the gathered (output)
bytes, each rank contributing size/n; for all_reduce the bytes of the buffer every rank holds.
Bus bandwidth as nccl-tests computes it (its doc/PERFORMANCE.md): algbw = size / time;
all_gather busbw = algbw * (n-1)/n; all_reduce busbw = algbw * 2(n-1)/n. The time of one size is
the slowest rank's mean over the timed iterations (a collective ends when its last rank does).

Latency (issue 59): decode does not move large buffers. Every step of a TP decode issues about a hundred
all-reduces of tens of KB (48 KB for GLM-5.3-Flash TP4: local-inference-lab/b12x PR #295), where the
time per call, not the bandwidth, is what counts. After the bandwidth sizes, one all_reduce of
--latency-bytes (48 KiB by default) runs --latency-iters times (200 by default, within its part of
the budget) and rank 0 prints it as op "latency" with its mean time per call in microseconds.

Output: rank 0 prints one line per (op, size), `SPARKCLUSTER_FABRIC {json}`, then
`SPARKCLUSTER_FABRIC {"done": true, ...}`; the marker sets them apart from NCCL's INFO lines on the
same stream. A rank that fails prints `SPARKCLUSTER_FABRIC {"error": ..., "rank": r}` and exits
non-zero: 2 when it could not join its peers (a variable missing, a peer out of reach within
--init-timeout, NCCL refusing to start), 1 when a collective failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

MARKER = "SPARKCLUSTER_FABRIC "
MiB = 1 << 20
GiB = 1 << 30
OPS = ("all_gather", "all_reduce")  # collectives, at every size
LATENCY_BYTES = "48K"  # the decode all-reduce of b12x PR #295 (GLM-5.3-Flash TP4: 48 KB, ~100 per step)
LATENCY_ITERS = 200
P2P_MAX_BYTES = 64 << 20  # one direction's transfer (p2p): enough to leave latency behind
FLOAT_BYTES = 4  # float32 elements
# What vLLM sets in every one of its processes before NCCL loads (vllm/env_override.py: cuMem-backed
# buffers broke collectives and memory accounting, NVIDIA/nccl #1721, #2379): the engine's NCCL runs
# without cuMem, so the probe's does too, or it would measure a transport the engine never uses.
ENGINE_NCCL_ENV = {"NCCL_CUMEM_ENABLE": "0"}


def default_sizes(max_bytes: int, min_bytes: int = MiB) -> list[int]:
    """Powers of 4 from `min_bytes` up to `max_bytes`, the largest always included."""
    sizes, size = [], min_bytes
    while size < max_bytes:
        sizes.append(size)
        size *= 4
    sizes.append(max_bytes)
    return sizes


def parse_size(text: str) -> int:
    """'1M', '256MiB', '1G', '4096' -> bytes (binary units: the figures nccl-tests prints)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": MiB, "G": GiB}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for `n` ranks."""
    if n <= 1:
        return 0.0
    return (n - 1) / n if op == "all_gather" else 2 * (n - 1) / n


def bandwidth(op: str, nbytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes, as nccl-tests prints them)."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * bus_factor(op, n)


def rounded_size(nbytes: int, n: int) -> int:
    """The size made a whole number of float32 elements per rank (all_gather splits it n ways)."""
    unit = FLOAT_BYTES * n
    return max(unit, nbytes // unit * unit)


def rank_env(environ=os.environ) -> dict:
    """The rendezvous variables, checked here so a missing one is named instead of a KeyError."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not environ.get(k)]
    if missing:
        raise ValueError(f"{', '.join(missing)} not set (set them as torchrun does)")
    return {
        "rank": int(environ["RANK"]),
        "world": int(environ["WORLD_SIZE"]),
        "local_rank": int(environ.get("LOCAL_RANK", "0")),
        "addr": environ["MASTER_ADDR"],
        "port": environ["MASTER_PORT"],
    }


def emit(record: dict) -> None:
    print(MARKER + json.dumps(record, sort_keys=True), flush=True)


def arguments(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="all_gather/all_reduce bus bandwidth between the ranks")
    p.add_argument("--backend", choices=("nccl", "gloo"), help="default: nccl with a GPU, else gloo")
    p.add_argument("--max-bytes", default="1G", help="largest size (default 1G)")
    p.add_argument("--sizes", help="comma-separated sizes instead (e.g. 1M,16M)")
    p.add_argument("--iters", type=int, default=10, help="timed iterations per size")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations per size first")
    p.add_argument(
        "--ops",
        default=",".join(OPS),
        help="all_gather,all_reduce[,p2p] (p2p: each rank to the next, one direction at a time)",
    )
    p.add_argument(
        "--latency-bytes",
        default=LATENCY_BYTES,
        help="the small all_reduce timed per call after the bandwidth sizes (default 48K, the decode size); 0: none",
    )
    p.add_argument("--latency-iters", type=int, default=LATENCY_ITERS, help="timed calls of the small all_reduce")
    p.add_argument(
        "--budget",
        type=float,
        default=40.0,
        help="seconds for every measurement after the rendezvous; fewer iterations on a slow link, "
        "and the largest sizes skipped once it is spent",
    )
    p.add_argument(
        "--init-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for every rank to join (and for one collective)",
    )
    p.add_argument(
        "--gpu-time",
        action="store_true",
        help="instead: time a fixed GPU workload on this node alone (matrix products) and print the seconds",
    )
    args = p.parse_args(argv)
    args.sizes = (
        [parse_size(s) for s in args.sizes.split(",")] if args.sizes else default_sizes(parse_size(args.max_bytes))
    )
    args.latency_bytes = parse_size(args.latency_bytes)
    args.ops = [o for o in args.ops.split(",") if o]
    if any(o not in (*OPS, "p2p") for o in args.ops):
        p.error(f"--ops: choose from {', '.join(OPS)}, p2p")
    return args


class Bench:
    """The collectives on one process group, timed the same way on every rank."""

    def __init__(self, torch, dist, device, world: int):
        self.torch, self.dist, self.device, self.world = torch, dist, device, world

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def collective(self, op: str, nbytes: int):
        """A callable running `op` once at `nbytes`, and the buffers it holds."""
        t = self.torch
        if op == "all_gather":
            out = t.empty(nbytes // FLOAT_BYTES, dtype=t.float32, device=self.device)
            inp = t.ones(nbytes // FLOAT_BYTES // self.world, dtype=t.float32, device=self.device)
            if self.device.type == "cuda":
                return (lambda: self.dist.all_gather_into_tensor(out, inp)), (out, inp)
            parts = list(out.chunk(self.world))  # gloo in older torch lacks the one-tensor form
            return (lambda: self.dist.all_gather(parts, inp)), (out, inp)
        buf = t.ones(nbytes // FLOAT_BYTES, dtype=t.float32, device=self.device)
        return (lambda: self.dist.all_reduce(buf)), (buf,)

    def directions(self, rank: int, nbytes: int, iters: int, budget_s: float) -> list[float]:
        """Seconds per transfer of `nbytes` from each rank to the next (rank r's entry: r -> r+1),
        one direction at a time, timed by the receiver. A collective's figure is the cluster's; a
        direction's names the node whose sending is slow (a rate-limited or half-broken egress)."""
        t, n = self.torch, self.world
        buf = t.ones(max(1, nbytes // FLOAT_BYTES), dtype=t.float32, device=self.device)
        times = t.zeros(n, dtype=t.float64, device=self.device)
        for src in range(n):
            dst = (src + 1) % n
            self.slowest(0.0)  # nobody starts the next direction before the last one is done
            if rank not in (src, dst):
                continue
            peer = dst if rank == src else src
            start = time.perf_counter()
            self.dist.send(buf, peer) if rank == src else self.dist.recv(buf, peer)  # warm-up, timed
            self.sync()
            first = time.perf_counter() - start
            # how many fit this direction's part of the budget: the receiver's count, sent to the sender
            count = t.tensor(
                [max(1, min(iters, int(budget_s / n / first) if first > 0 else iters))],
                dtype=t.int64,
                device=self.device,
            )
            self.dist.send(count, peer) if rank == dst else self.dist.recv(count, peer)
            self.sync()
            start = time.perf_counter()
            for _ in range(int(count.item())):
                self.dist.send(buf, peer) if rank == src else self.dist.recv(buf, peer)
            self.sync()
            if rank == dst:
                times[src] = (time.perf_counter() - start) / int(count.item())
        self.dist.all_reduce(times)  # every entry was written by one receiver only
        return [float(x) for x in times.tolist()]

    def slowest(self, seconds: float) -> float:
        """The largest of every rank's time (a collective lasts until its last rank is done)."""
        v = self.torch.tensor([seconds], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(v, op=self.dist.ReduceOp.MAX)
        return float(v.item())

    def measure(self, op: str, nbytes: int, iters: int, warmup: int, budget_s: float) -> float:
        """Mean seconds per iteration of `op` at `nbytes`, the slowest rank's. The first call, timed,
        decides how many more fit in `budget_s` (at least one timed, at most `warmup` + `iters`), the
        same on every rank since every rank takes the slowest's time: a slow link shortens the test
        instead of stretching it past its bound."""
        run, buffers = self.collective(op, nbytes)
        self.slowest(0.0)
        start = time.perf_counter()
        run()
        self.sync()
        first = self.slowest(time.perf_counter() - start)
        fits = int(budget_s / first) if first > 0 else warmup + iters
        warm, timed = min(warmup - 1, max(0, fits - iters)), max(1, min(iters, fits - 1))
        for _ in range(max(0, warm)):
            run()
        self.sync()
        self.slowest(0.0)  # every rank starts the timed loop together
        start = time.perf_counter()
        for _ in range(timed):
            run()
        self.sync()
        elapsed = (time.perf_counter() - start) / timed
        del buffers, run
        return self.slowest(elapsed)


# the fixed workload of --gpu-time (issue 39 item 3): square matrix products, the same on every node,
# so that a GB10 held in a low-power state that nvidia-smi does not show is named by its time alone.
# Without a GPU, on one CPU thread: with every core, a round's time said whether another core was free
# at that moment (a 2-core machine's other work made a healthy node 1.3x its peer), not the node's own
# pace; and 768 (about 0.11 s a round on one core) keeps a round longer than a CPU quota's slice, so
# a node held to a share of a CPU cannot finish a round inside one period unthrottled
GPU_SIDE, GPU_CPU_SIDE, GPU_ITERS, GPU_WARMUP, GPU_ROUNDS = 4096, 768, 10, 3, 3


def gpu_time(torch) -> dict:
    """Seconds for GPU_ITERS products of two fixed square matrices on GPU 0 (the CPU's one thread,
    smaller, without one), after GPU_WARMUP untimed ones, the best of GPU_ROUNDS; synchronised so the time is the
    device's, not the launch's."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(1)
    side = GPU_SIDE if cuda else GPU_CPU_SIDE
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.rand(side, side, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    b = torch.rand(side, side, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    for _ in range(GPU_WARMUP):
        a @ b
    if cuda:
        torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(GPU_ROUNDS):  # the best round: a moment's interference on the host is not the GPU's pace
        t = time.perf_counter()
        for _ in range(GPU_ITERS):
            a @ b
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t)
    return {"gpu_seconds": round(best, 6), "device": str(device), "side": side}


def main(argv=None) -> int:
    args = arguments(argv)
    if args.gpu_time:
        import torch

        emit(gpu_time(torch))
        return 0
    try:
        env = rank_env()
    except ValueError as exc:
        print(f"fabric_probe: {exc}", file=sys.stderr, flush=True)
        return 2
    os.environ.update(ENGINE_NCCL_ENV)  # as vLLM does, unconditionally, before torch loads NCCL
    import torch
    import torch.distributed as dist

    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", env["local_rank"])
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=args.init_timeout)
    try:
        kwargs = {"device_id": device} if backend == "nccl" else {}  # NCCL's init now, not lazily
        dist.init_process_group(
            backend, init_method="env://", rank=env["rank"], world_size=env["world"], timeout=timeout, **kwargs
        )
    except Exception as exc:  # a peer that never came, an address out of reach, NCCL's own refusal
        why = (
            f"rank {env['rank']} of {env['world']} could not start {backend} with "
            f"{env['addr']}:{env['port']} (timeout {args.init_timeout:g}s): {exc}"
        )
        emit({"error": why, "rank": env["rank"], "stage": "init"})
        print(f"fabric_probe: {why}", file=sys.stderr, flush=True)
        if dist.is_initialized():  # a group NCCL refused still holds its store and watchdog
            dist.destroy_process_group()
        return 2
    bench = Bench(torch, dist, device, env["world"])
    count, code = 0, 0
    try:
        started = time.monotonic()
        collectives = [(op, size) for op in args.ops if op in OPS for size in args.sizes]
        latency = args.latency_bytes > 0 and env["world"] > 1
        share = args.budget / (len(collectives) + ("p2p" in args.ops) + latency)  # each measurement's part of it
        for op, size in collectives:
            if bench.slowest(time.monotonic() - started) > args.budget:  # every rank stops together
                if env["rank"] == 0:
                    emit({"skipped": f"{op} at {size} bytes: the {args.budget:g}s budget is spent"})
                continue
            nbytes = rounded_size(size, env["world"])
            seconds = bench.measure(op, nbytes, args.iters, args.warmup, share)
            algbw, busbw = bandwidth(op, nbytes, seconds, env["world"])
            count += 1
            if env["rank"] == 0:
                emit(
                    {
                        "op": op,
                        "bytes": nbytes,
                        "ranks": env["world"],
                        "backend": backend,
                        "time_us": round(seconds * 1e6, 1),
                        "algbw_GBps": round(algbw, 3),
                        "busbw_GBps": round(busbw, 3),
                    }
                )
        if latency:
            nbytes = rounded_size(args.latency_bytes, 1)
            seconds = bench.measure("all_reduce", nbytes, max(1, args.latency_iters), args.warmup * 10, share)
            algbw, busbw = bandwidth("all_reduce", nbytes, seconds, env["world"])
            count += 1
            if env["rank"] == 0:
                emit(
                    {
                        "op": "latency",
                        "collective": "all_reduce",
                        "bytes": nbytes,
                        "ranks": env["world"],
                        "backend": backend,
                        "time_us": round(seconds * 1e6, 2),
                        "algbw_GBps": round(algbw, 3),
                        "busbw_GBps": round(busbw, 3),
                    }
                )
        if "p2p" in args.ops and env["world"] > 1:
            nbytes = rounded_size(min(args.sizes[-1], P2P_MAX_BYTES), 1)
            for src, seconds in enumerate(bench.directions(env["rank"], nbytes, max(1, args.iters // 2), share)):
                count += 1
                if env["rank"] == 0:
                    emit(
                        {
                            "op": "p2p",
                            "src": src,
                            "dst": (src + 1) % env["world"],
                            "bytes": nbytes,
                            "ranks": env["world"],
                            "backend": backend,
                            "time_us": round(seconds * 1e6, 1),
                            "algbw_GBps": round(nbytes / seconds / 1e9 if seconds > 0 else 0.0, 3),
                            "busbw_GBps": round(nbytes / seconds / 1e9 if seconds > 0 else 0.0, 3),
                        }
                    )
        if env["rank"] == 0:
            emit({"done": True, "ranks": env["world"], "backend": backend, "results": count})
    except Exception as exc:
        emit({"error": f"rank {env['rank']}: {type(exc).__name__}: {exc}", "rank": env["rank"], "stage": "collective"})
        print(f"fabric_probe: rank {env['rank']}: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        try:
            dist.destroy_process_group()
        finally:
            if backend == "nccl":
                torch.cuda.empty_cache()
    return code


if __name__ == "__main__":
    sys.exit(main())
