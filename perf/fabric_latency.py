"""Small-message all-reduce latency with real NCCL, two ranks (issue 59, item 2's measurement).

Decode on a tensor-parallel pair lives on all-reduces of tens of KB (one per layer and token: the
hidden state of the tokens in the step, bf16), so what counts there is the time of one small
all-reduce, not the bandwidth of a large one. This program is one rank; `perf/fabric_latency.sh`
starts two, each with its own environment as a node's would be. Standard library and torch only.

Per size (bytes of the bf16 buffer every rank holds), after WARMUP all-reduces:
- `p50_us`, `p99_us`: one all-reduce at a time, `torch.cuda.synchronize()` after each, wall time
  per op on this rank (what a decode step waits for; launch overhead included);
- `loop_us`: ITERS all-reduces back to back on the stream, one synchronize at the end, divided by
  ITERS (how nccl-tests reports time per op: its doc/PERFORMANCE.md);
- `graph_us`: GRAPH_OPS all-reduces captured in one CUDA graph, replayed GRAPH_REPLAYS times, the
  time divided by the all-reduces: no Python and no launch per op, as vLLM's decode runs them (its
  CUDA graphs hold the layers' all-reduces). `graph_error` instead where the capture failed.
Both ranks barrier before each size. Rank 0 prints one `SPARKCLUSTER_LATENCY {json}` line per size,
then one with the NCCL version and the world.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

MARKER = "SPARKCLUSTER_LATENCY "
# bytes: 8 KB to 1 MiB, with 48 KB (issue 59 cites RoCEnante's 48 KB all-reduce, b12x PR#295)
DEFAULT_SIZES = "8K,16K,32K,48K,64K,128K,256K,1M"
WARMUP, SINGLE, ITERS = 30, 300, 300
GRAPH_OPS, GRAPH_REPLAYS = 50, 20


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def graphed_us(torch, dist, buf) -> float:
    """Microseconds per all-reduce replayed from a CUDA graph (both ranks replay alike)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm on the capture's kind of stream, as PyTorch's docs ask
        for _ in range(3):
            dist.all_reduce(buf)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_OPS):
            dist.all_reduce(buf)
    g.replay()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(GRAPH_REPLAYS):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / (GRAPH_REPLAYS * GRAPH_OPS) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES)
    ap.add_argument("--single", type=int, default=SINGLE)
    ap.add_argument("--iters", type=int, default=ITERS)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")  # as vLLM's engine runs NCCL (sparkcluster/node/fabric_probe.py)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60), device_id=dev)
    try:
        for size in (parse_size(s) for s in args.sizes.split(",")):
            buf = torch.ones(size // 2, dtype=torch.bfloat16, device=dev)
            for _ in range(WARMUP):
                dist.all_reduce(buf)
            torch.cuda.synchronize()
            dist.barrier()
            times = []
            for _ in range(args.single):
                t = time.perf_counter()
                dist.all_reduce(buf)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            dist.barrier()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce(buf)
            torch.cuda.synchronize()
            loop = (time.perf_counter() - t) / args.iters
            graph, graph_error = None, None
            try:
                graph = graphed_us(torch, dist, buf)
            except Exception as e:  # noqa: BLE001 (reported, the other figures stand)
                graph_error = f"{type(e).__name__}: {e}"[:300]
            times.sort()
            if rank == 0:
                row = {
                    "bytes": size,
                    "p50_us": round(statistics.median(times) * 1e6, 1),
                    "p99_us": round(times[int(len(times) * 0.99) - 1] * 1e6, 1),
                    "min_us": round(times[0] * 1e6, 1),
                    "loop_us": round(loop * 1e6, 1),
                    **({"graph_us": round(graph, 1)} if graph is not None else {"graph_error": graph_error}),
                }
                print(MARKER + json.dumps(row), flush=True)
        if rank == 0:
            v = torch.cuda.nccl.version()
            print(
                MARKER
                + json.dumps(
                    {
                        "done": True,
                        "nccl": ".".join(map(str, v)) if isinstance(v, tuple) else str(v),
                        "torch": torch.__version__,
                        "world": world,
                        "gpu": torch.cuda.get_device_name(dev),
                    }
                ),
                flush=True,
            )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
