"""What a named key's limits cost the gateway (team keys, item 6): output throughput at
concurrency 8 through the gateway / straight to the engine, with a key held to limits (requests per
minute and tokens per day, both far above what the run asks, so nothing is refused: the cost is the
admission's look at the bucket and the day's tokens, and the settling) against a key with none.

On loopback, no testbed: the stand-in engine of perf/gateway_gpu.py (vLLM's OpenAI stream, chunked
SSE, one event a token), the gateway as shipped (`python -m sparkcluster.gateway.entrypoint CONFIG`,
its folder with the key file and the usage ledger, as `gateway up` gives it one), and
perf/gateway_gpu.py's closed-loop load (one process, 8 streams, each request read to its end). The
stand-in decodes at DECODE_TOK_S with no prefill wait, faster than the machine's cores can carry
through the gateway: the throughput is bound by CPU, so what the gateway spends per request and per
event shows in it. One gateway serves both keys, so the two arms differ only in the key: `limits
off`, a key of GATEWAY_API_KEYS (no limits; metered all the same); `limits on`, a named key with
requests_per_minute and tokens_per_day. Per repetition the three arms (direct, off, on) run for
WINDOW_S each, the order alternating. Figures: through / direct per repetition for each key; the
budget: the median with limits on is no lower than the lowest with limits off (within the spread of
limits off, on the side that costs). Beside it, the gateway's own CPU per request in each window
(perf/gateway_gpu.cpu_ns), on / off: what the machine's other load moves much less than a throughput.
Run 2026-11-29 (perf/gateway_limits.md, 2 shared CPUs, 9 repetitions): through / direct 0.431 with
limits on, 0.449 off (0.19-0.51), met; the gateway's CPU per request on / off 0.976 (0.89-1.08).

`python -m perf.gateway_limits` (part of `make bench`; BENCH_REPS repetitions, at least MIN_REPS);
writes perf/gateway_limits.md and .json. On two shared cores, the engine, the gateway and the load
contend for the same CPUs (perf/gateway.py says what that does to a ratio's spread).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perf import gateway_gpu
from perf.figures import Figure, info, render, say
from sparkcluster.gateway import keys

REPO = Path(__file__).resolve().parent.parent
OFF_KEY = "gw-limits-off-key-3b9e"  # the bench's own client keys (test scaffolding)
ON_KEY = "gw-limits-on-key-84c2"
ON_NAME = "bench-limited"
RPM, TPD = 10_000_000, 10**12  # far above what a run asks: never refused
CONCURRENCY, OUT_TOKENS = 8, 64  # perf/gateway.py's c8 level: 64 tokens an answer
DECODE_TOK_S = 20000.0  # the stand-in's pace: far above what two cores carry through a relay
WINDOW_S, WARM_S = 6.0, 2.0
MIN_REPS = 9


def rates() -> dict:
    """The stand-in's pace (its input length from perf/gateway_gpu's record, the prompt's size)."""
    got = gateway_gpu.record_rates()
    return {**got, "decode_tok_s": DECODE_TOK_S, "output_tokens": OUT_TOKENS}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gateway_config(port: int, engine_port: int, folder: Path) -> dict:
    return {
        "host": "127.0.0.1",
        "port": port,
        "drain_s": 5,
        "poll_s": 1.0,
        "keys": [OFF_KEY],
        "data": str(folder),
        "deployments": [
            {
                "key": "standin@spark-head",
                "names": [gateway_gpu.MODEL],
                "upstream": f"http://127.0.0.1:{engine_port}",
                "supervisor": f"http://127.0.0.1:{engine_port}/report",
                "api_key": gateway_gpu.ENGINE_KEY,
                "nodes": ["spark-head"],
            }
        ],
    }


def key_file(folder: Path) -> None:
    """The named key as `sparkcluster gateway keys add` writes it (hashed, 0600)."""
    entry = keys.Entry(ON_NAME, keys.digest(ON_KEY), created=time.time(), requests_per_minute=RPM, tokens_per_day=TPD)
    path = folder / keys.KEYS_FILE
    path.write_text(keys.render([entry]))
    path.chmod(0o600)


def load(port: int, key: str, seconds: float, folder: Path) -> dict:
    """One closed-loop window of CONCURRENCY streams (perf/gateway_gpu's load, one process)."""
    result = folder / f"load-{port}-{time.monotonic_ns()}.json"
    argv = [sys.executable, "-m", "perf.gateway_limits", "load", str(port), key, str(seconds), str(result)]
    subprocess.run(argv, check=True, cwd=REPO, timeout=seconds + 120)
    got = json.loads(result.read_text())
    result.unlink()
    # a token is an event of the stream (the role, the finish and [DONE] events aside: three a request)
    tokens = got["events"] - 3 * got["requests"]
    return {"tok_s": tokens / got["wall_s"], "requests": got["requests"], "errors": got["errors"]}


def measure(reps: int, folder: Path) -> dict:
    r = rates()
    engine_port, gw_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    data = folder / "gateway"
    data.mkdir(mode=0o700)
    key_file(data)
    cfg = folder / "gateway.json"
    cfg.write_text(json.dumps(gateway_config(gw_port, engine_port, data)))
    procs = []
    raw: dict[str, list] = {"direct": [], "off": [], "on": [], "refused": [], "cpu_off": [], "cpu_on": []}
    try:
        engine = [sys.executable, "-m", "perf.gateway_limits", "engine", str(engine_port), json.dumps(r)]
        procs.append(subprocess.Popen(engine, env=env, cwd=REPO))
        gateway_gpu.wait_port(engine_port)
        log = open(folder / "gateway.log", "w")
        gw = [sys.executable, "-m", "sparkcluster.gateway.entrypoint", str(cfg)]
        gateway = subprocess.Popen(gw, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        procs.append(gateway)
        gateway_gpu.wait_port(gw_port)
        gateway_gpu.wait_in_rotation(gw_port)
        arms = {"direct": (engine_port, gateway_gpu.ENGINE_KEY), "off": (gw_port, OFF_KEY), "on": (gw_port, ON_KEY)}
        for port, key in arms.values():  # warm: connections, imports, the first requests' paths
            load(port, key, WARM_S, folder)
        for i in range(reps):
            order = ("direct", "off", "on") if i % 2 == 0 else ("on", "off", "direct")
            got = {}
            for a in order:  # the gateway's own CPU over each window (it serves one arm at a time)
                c0 = gateway_gpu.cpu_ns(gateway.pid)
                got[a] = load(*arms[a], WINDOW_S, folder)
                got[a]["cpu_ms"] = (gateway_gpu.cpu_ns(gateway.pid) - c0) / 1e6 / max(got[a]["requests"], 1)
            for a in arms:
                raw[a].append(got[a]["tok_s"])
            raw["cpu_off"].append(got["off"]["cpu_ms"])
            raw["cpu_on"].append(got["on"]["cpu_ms"])
            raw["refused"].append(got["on"]["errors"] + got["off"]["errors"])
            say(
                f"  limits #{i}: c={CONCURRENCY} {got['direct']['tok_s']:.0f} tok/s direct, "
                f"{got['off']['tok_s']:.0f} through with limits off, {got['on']['tok_s']:.0f} with limits on"
            )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
    return raw


def figures(R: dict) -> list[Figure]:
    off = [o / d for o, d in zip(R["off"], R["direct"])]
    on = [o / d for o, d in zip(R["on"], R["direct"])]
    return [
        Figure(
            "gateway_limits_on",
            f"gateway, a key with limits on (rpm, tokens/day): c={CONCURRENCY} throughput through / direct",
            "ratio",
            f">= {min(off):.3f} (limits off's lowest)",
            on,
            statistics.median(on) >= min(off),
            note="within the spread of limits off, on the side that costs",
        ),
        info("gateway_limits_off", "... a key with no limits: through / direct", "ratio", off),
        info("gateway_limits_off_spread", "... its spread (max - min)", "ratio", [max(off) - min(off)]),
        info(
            "gateway_limits_on_vs_off",
            "... limits on / limits off, per repetition",
            "ratio",
            [a / b for a, b in zip(R["on"], R["off"])],
        ),
        info(
            "gateway_limits_cpu",
            "... the gateway's CPU per request, limits on / limits off, per repetition",
            "ratio",
            [a / b for a, b in zip(R["cpu_on"], R["cpu_off"])],
        ),
        info("gateway_limits_cpu_off", "... the gateway's CPU per request, limits off", "ms", R["cpu_off"]),
        info("gateway_limits_cpu_on", "... the gateway's CPU per request, limits on", "ms", R["cpu_on"]),
        info("gateway_limits_direct", f"... straight to the stand-in engine, c={CONCURRENCY}", "tok/s", R["direct"]),
        info("gateway_limits_refused", "... requests refused or failed (none expected)", "count", R["refused"]),
    ]


def run_loop(coro):
    """uvloop where it is installed (vLLM's image has it, as perf/gateway_gpu.py's machine), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def serve_engine(port: int, pace: dict) -> None:
    """The stand-in engine (perf/gateway_gpu.Engine) on one port."""
    server = await asyncio.get_running_loop().create_server(
        lambda: gateway_gpu.Engine(pace), "127.0.0.1", port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m perf.gateway_limits", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="role")
    e = sub.add_parser("engine")
    e.add_argument("port", type=int)
    e.add_argument("pace")
    ld = sub.add_parser("load")
    ld.add_argument("port", type=int)
    ld.add_argument("key")
    ld.add_argument("seconds", type=float)
    ld.add_argument("result", type=Path)
    a = ap.parse_args(argv)
    if a.role == "engine":
        run_loop(serve_engine(a.port, json.loads(a.pace)))
        return 0
    if a.role == "load":
        body = gateway_gpu.request_body(rates(), OUT_TOKENS, 0.0)
        url = f"http://127.0.0.1:{a.port}/v1/chat/completions"
        a.result.write_text(json.dumps(run_loop(gateway_gpu.load_main(url, a.key, CONCURRENCY, a.seconds, body))))
        return 0
    reps = max(int(os.environ.get("BENCH_REPS", "5")), MIN_REPS)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="sparkcluster-gw-limits-") as wd:
        raw = measure(reps, Path(wd))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    figs = figures(raw)
    table = render(figs, {}, when, reps).replace("(testbed,", "(loopback, stand-in engine,", 1)
    (REPO / "perf" / "gateway_limits.md").write_text(table)
    (REPO / "perf" / "gateway_limits.json").write_text(json.dumps({"when": when, "raw": raw}, indent=2) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
