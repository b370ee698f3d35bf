"""The gateway's own cost where cores are not the bound (issue 63): CPU per streamed event and per
request, and latency added per event, at concurrency 1, 8, 32 and 128, on a machine with cores to
spare (the 16-core GPU machine the project borrows), against a bare byte relay in the same run.

Every part is a process on its own cores (taskset), talking over loopback:
- the stand-in engine (one process per ENGINE_CORES core, on one port, SO_REUSEPORT): answers a streamed chat
  completion as vLLM's OpenAI server does (HTTP/1.1, `transfer-encoding: chunked`, one SSE event
  `data: {chat.completion.chunk}` per chunk: vLLM's ChatCompletionStreamResponse,
  vllm/entrypoints/openai/protocol.py, written per token by serving_chat.py, then `data: [DONE]`)
  at the rates of a GB10 from a shipped performance record (RECORD: the fastest single-Spark decode
  sparkcluster ships, NVIDIA's published run): the first token after input_tokens / prefill_tok_s,
  then one token per 1 / decode_tok_s. Every stream runs at that single-stream rate whatever the
  concurrency: on a real engine a batch's streams run slower, never faster, so the event rates here
  are upper bounds for a Spark. It also answers the head agent's report (supervisor: serving), so
  the gateway takes the route into rotation. Each content event carries the monotonic time (us) it
  was written in its `content` (a token's text), so a client on the same host reads its latency;
- the gateway as shipped (`python -m sparkcluster.gateway.entrypoint CONFIG`: uvicorn, Starlette,
  the aiohttp relay of gateway/proxy.py), on GATEWAY_CORE;
- with --compare DIR, the gateway of another checkout beside it (COMPARE_CORE): before and after a
  change, in the same run; and one run of the gateway under cProfile (the short level, below);
- the bare byte relay of perf/bare_relay.py (uvloop, bytes copied, nothing parsed), on RELAY_CORE;
- the load: up to 8 client processes (aiohttp), each on its own core, closed loop: every stream
  sends the record's request (input_tokens of text, ~4 characters a token: OpenAI's rule of thumb,
  help.openai.com/en/articles/4936856) and reads the answer to its end, again and again.

Per level and arm, the gateway's (or relay's) CPU is the sum of its threads' run time
(/proc/PID/task/*/schedstat, ns) over the level, the idle rate (its looks at the supervisor)
taken off. Figures: CPU seconds per thousand events and per request, the events delivered per
second against direct, the per-event latency (p50, p99) and TTFT against direct. A short level
(one token per answer, no prefill wait) separates the per-request cost from the per-event one.

Usage (from the checkout's root, on 16 or more cores, python3 with aiohttp, uvloop, uvicorn,
starlette, httpx and prometheus-client): `python3 perf/gateway_gpu.py run OUTDIR [--seconds S]
[--compare OTHER_CHECKOUT] [--short-reps N]`; about 4 minutes at 6 s a level (the default 10 s:
6 minutes; the run for perf/gateway.md used 6). Run it pinned itself (`taskset -c 0`): core 0 is the
orchestra's. Prints the table (markdown) and writes OUTDIR/gateway_gpu.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "env-profiles" / "nemotron35-lightning-nvfp4-single.perf.toml"
MODEL = "stand-in"
GW_KEY = "gw-perf-key-1d4e"  # the bench's own client key (test scaffolding)
ENGINE_KEY = "engine-perf-key-77b2"
ENGINE_PORT, GW_PORT, RELAY_PORT, PROFILE_PORT, COMPARE_PORT = 18000, 14000, 14001, 14003, 14004
GATEWAY_CORE, RELAY_CORE, COMPARE_CORE = 2, 3, 1
ENGINE_CORES = (4, 5, 6)
LOAD_CORES = (8, 9, 10, 11, 12, 13, 14, 15)
LEVELS = (1, 8, 32, 128)
CHARS_PER_TOKEN = 4


def record_rates(path: Path = RECORD) -> dict:
    import tomllib

    doc = tomllib.loads(path.read_text())
    run = doc["runs"][0]
    return {
        "record": str(path.relative_to(ROOT)),
        "source": doc["source"]["url"],
        "decode_tok_s": float(run["figures"]["decode_tok_s"]),
        "prefill_tok_s": float(run["figures"]["prefill_tok_s"]),
        "input_tokens": int(run["conditions"]["input_tokens"]),
        "output_tokens": int(run["conditions"]["output_tokens"]),
    }


# -- the stand-in engine -------------------------------------------------------------------------

CHUNK_HEAD = (
    b'data: {"id":"chatcmpl-%s","object":"chat.completion.chunk","created":%d,"model":"' + MODEL.encode() + b'",'
)


def sse_chunk(rid: bytes, created: int, delta: bytes, finish: bytes = b"null") -> bytes:
    event = (
        CHUNK_HEAD % (rid, created)
        + b'"choices":[{"index":0,"delta":'
        + delta
        + b',"logprobs":null,"finish_reason":'
        + finish
        + b"}]}\n\n"
    )
    return b"%x\r\n%s\r\n" % (len(event), event)


def sse_done() -> bytes:
    event = b"data: [DONE]\n\n"
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event)


class Engine(asyncio.Protocol):
    """One connection to the stand-in: HTTP/1.1 keep-alive, one request at a time."""

    def __init__(self, rates: dict):
        self.rates, self.buf, self.t, self.busy = rates, b"", None, False

    def connection_made(self, transport):
        self.t = transport

    def connection_lost(self, exc):
        self.t = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.busy:
            return
        head, sep, rest = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return
        lines = head.split(b"\r\n")
        method, path = lines[0].split(b" ")[:2]
        length = 0
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        if len(rest) < length:
            return
        body, self.buf = rest[:length], rest[length:]
        if method == b"GET" and path.startswith(b"/report"):
            now = time.time()
            doc = json.dumps(
                {"ts": now, "supervisor": {"state": "serving", "since": now - 60, "updated": now, "causes": []}}
            ).encode()
            self.t.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(doc), doc)
            )
            return
        doc = json.loads(body)
        self.busy = True
        asyncio.get_running_loop().create_task(self.stream(doc))

    async def stream(self, doc: dict) -> None:
        r = self.rates
        out = int(doc.get("max_tokens") or r["output_tokens"])
        prefill = float(doc.get("prefill_s", r["input_tokens"] / r["prefill_tok_s"]))
        step = 1.0 / r["decode_tok_s"]
        rid = b"%032x" % random.getrandbits(128)
        created = int(time.time())
        self.t.write(
            b"HTTP/1.1 200 OK\r\ndate: %s\r\nserver: uvicorn\r\n"
            b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
            % time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()).encode()
        )
        loop = asyncio.get_running_loop()
        start = loop.time() + prefill
        await asyncio.sleep(prefill)
        if self.t is None:
            return
        self.t.write(sse_chunk(rid, created, b'{"role":"assistant","content":""}'))
        for k in range(out):
            delay = start + k * step - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.t is None:  # the client went away: stop, as vLLM aborts
                return
            stamp = time.monotonic_ns() // 1000
            self.t.write(sse_chunk(rid, created, b'{"content":" t%d"}' % stamp))
        if self.t is None:
            return
        self.t.write(sse_chunk(rid, created, b'{"content":""}', b'"length"'))
        self.t.write(sse_done())
        self.busy = False
        if self.buf:
            self.data_received(b"")


def engine_main(port: int, rates: dict) -> None:
    import uvloop

    async def serve():
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        server = await asyncio.get_running_loop().create_server(lambda: Engine(rates), sock=sock, backlog=1024)
        async with server:
            await server.serve_forever()

    uvloop.run(serve())


# -- the load -------------------------------------------------------------------------------------

MARK = b'"content":" t'


def request_body(rates: dict, out: int | None, prefill_s: float | None) -> bytes:
    rnd = random.Random(63)
    words = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 9))) for _ in range(2000)]
    text, n = [], 0
    while n < rates["input_tokens"] * CHARS_PER_TOKEN:
        w = rnd.choice(words)
        text.append(w)
        n += len(w) + 1
    doc = {
        "model": MODEL,
        "messages": [{"role": "user", "content": " ".join(text)}],
        "stream": True,
        "max_tokens": out or rates["output_tokens"],
    }
    if prefill_s is not None:
        doc["prefill_s"] = prefill_s  # the stand-in's own knob (the short level)
    return json.dumps(doc).encode()


async def load_main(url: str, key: str, streams: int, seconds: float, body: bytes) -> dict:
    import aiohttp

    lat, ttft = [], []
    counts = {"events": 0, "requests": 0, "errors": 0}
    end = time.monotonic() + seconds
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}

    async def one(session) -> None:
        sent = time.monotonic_ns() // 1000
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                counts["errors"] += 1
                await resp.read()
                return
            buf, first = b"", True
            async for chunk in resp.content.iter_any():
                now = time.monotonic_ns() // 1000
                if first:
                    ttft.append(now - sent)
                    first = False
                buf += chunk
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    counts["events"] += 1
                    i = ev.find(MARK)
                    if i >= 0:
                        j = ev.index(b'"', i + len(MARK))
                        lat.append(now - int(ev[i + len(MARK) : j]))
        counts["requests"] += 1

    async def worker(session) -> None:
        while time.monotonic() < end:
            try:
                await one(session)
            except aiohttp.ClientError:
                counts["errors"] += 1
                await asyncio.sleep(0.1)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        t = time.monotonic()
        await asyncio.gather(*(worker(session) for _ in range(streams)))
        wall = time.monotonic() - t
    return {**counts, "wall_s": wall, "lat_us": lat, "ttft_us": ttft}


# -- the orchestra --------------------------------------------------------------------------------


def pinned(core, *argv: str, env: dict | None = None, cwd: Path = ROOT, **kw) -> subprocess.Popen:
    cores = ",".join(map(str, core)) if isinstance(core, (tuple, list)) else str(core)
    return subprocess.Popen(["taskset", "-c", cores, *argv], env={**os.environ, **(env or {})}, cwd=cwd, **kw)


def cpu_ns(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def wait_port(port: int, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def wait_in_rotation(port: int, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if json.load(r).get("models", {}).get(MODEL):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the gateway on {port} never took the route into rotation")


def pct(xs: list, q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def run_load(port: int, key: str, conc: int, seconds: float, out: int | None, prefill_s: float | None) -> dict:
    procs = min(len(LOAD_CORES), conc)
    per = [conc // procs + (1 if i < conc % procs else 0) for i in range(procs)]
    argv = [sys.executable, __file__, "load", str(port), key, "--seconds", str(seconds)]
    if out:
        argv += ["--out", str(out)]
    if prefill_s is not None:
        argv += ["--prefill-s", str(prefill_s)]
    files = [Path(f"/tmp/gateway_gpu-load-{os.getpid()}-{i}.json") for i in range(procs)]
    ps = [pinned(LOAD_CORES[i], *argv, "--streams", str(n), "--result", str(files[i])) for i, n in enumerate(per)]
    for p in ps:
        p.wait()
    got = [json.loads(f.read_text()) for f in files]
    for f in files:
        f.unlink()
    return {
        "events": sum(g["events"] for g in got),
        "requests": sum(g["requests"] for g in got),
        "errors": sum(g["errors"] for g in got),
        "wall_s": max(g["wall_s"] for g in got),
        "lat_us": [x for g in got for x in g["lat_us"]],
        "ttft_us": [x for g in got for x in g["ttft_us"]],
    }


def arm(name: str, port: int, key: str, pid: int | None, idle_ns_s: float, conc: int, seconds: float, **kw) -> dict:
    c0 = cpu_ns(pid) if pid else 0
    t0 = time.monotonic()
    got = run_load(port, key, conc, seconds, **kw)
    wall = time.monotonic() - t0
    cpu = (cpu_ns(pid) - c0 - idle_ns_s * wall) / 1e9 if pid else None
    row = {
        "arm": name,
        "concurrency": conc,
        "events": got["events"],
        "requests": got["requests"],
        "errors": got["errors"],
        "wall_s": round(wall, 3),
        "events_s": got["events"] / got["wall_s"],
        "lat_p50_us": pct(got["lat_us"], 0.5),
        "lat_p99_us": pct(got["lat_us"], 0.99),
        "ttft_p50_ms": pct(got["ttft_us"], 0.5) / 1000,
        "cpu_s": cpu,
    }
    if cpu is not None and got["events"]:
        row["cpu_s_per_1k_events"] = cpu / got["events"] * 1000
        row["cpu_ms_per_request"] = cpu / max(got["requests"], 1) * 1000
        row["core_share"] = cpu / wall
    print(json.dumps({k: v for k, v in row.items()}), flush=True)
    return row


def idle_rate(pid: int, seconds: float = 3.0) -> float:
    c0 = cpu_ns(pid)
    time.sleep(seconds)
    return (cpu_ns(pid) - c0) / seconds


def gateway_config(port: int) -> dict:
    return {
        "host": "127.0.0.1",
        "port": port,
        "drain_s": 5,
        "poll_s": 1.0,
        "keys": [GW_KEY],
        "deployments": [
            {
                "key": "standin@spark-head",
                "names": [MODEL],
                "upstream": f"http://127.0.0.1:{ENGINE_PORT}",
                "supervisor": f"http://127.0.0.1:{ENGINE_PORT}/report",
                "api_key": ENGINE_KEY,
                "nodes": ["spark-head"],
            }
        ],
    }


def start_gateway(out: Path, port: int, core: int, how: str, tree: Path = ROOT) -> subprocess.Popen:
    cfg = out / f"gateway-{port}.json"
    cfg.write_text(json.dumps(gateway_config(port)))
    log = open(out / f"gateway-{port}.log", "w")
    if how == "shipped":
        argv = [sys.executable, "-m", "sparkcluster.gateway.entrypoint", str(cfg)]
    else:  # profile
        argv = [sys.executable, __file__, "profiled", str(cfg), str(out / f"profile-{port}.txt")]
    p = pinned(core, *argv, stdout=log, stderr=subprocess.STDOUT, cwd=tree)
    wait_port(port)
    wait_in_rotation(port)
    return p


def gateway_profiled(cfg_path: str, profile_out: str) -> None:
    """The shipped app (the entrypoint's uvicorn settings but TLS) under cProfile; the statistics go
    to `profile_out` when it stops (SIGTERM)."""
    import cProfile
    import pstats

    import uvicorn

    from sparkcluster.gateway.app import Gateway

    cfg = json.loads(Path(cfg_path).read_text())
    app = Gateway(cfg, cfg_path).app()
    import signal

    def leave(*_):
        raise SystemExit(0)

    # uvicorn restores this handler after its shutdown and raises the signal it caught again
    signal.signal(signal.SIGTERM, leave)
    prof = cProfile.Profile()
    prof.enable()
    try:
        uvicorn.run(app, host=cfg["host"], port=cfg["port"], log_level="warning", access_log=False)
    finally:
        prof.disable()
        with open(profile_out, "w") as f:
            st = pstats.Stats(prof, stream=f)
            st.sort_stats("tottime").print_stats(40)
            st.sort_stats("cumulative").print_stats(30)


def versions() -> dict:
    import importlib.metadata as md

    got = {"python": sys.version.split()[0]}
    for name in ("aiohttp", "uvicorn", "starlette", "httptools", "uvloop", "httpx", "anyio"):
        try:
            got[name] = md.version(name)
        except md.PackageNotFoundError:
            got[name] = None
    try:
        got["cpu"] = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except StopIteration:
        got["cpu"] = "unknown"
    got["cores"] = os.cpu_count()
    return got


def table(rows: list[dict], short: list[dict], fit: dict, info: dict) -> str:
    direct = {r["concurrency"]: r for r in rows if r["arm"] == "direct"}
    lines = [
        f"stand-in engine: {info['rates']['decode_tok_s']} tok/s a stream, first token after "
        f"{info['rates']['input_tokens']}/{info['rates']['prefill_tok_s']} s, "
        f"{info['rates']['output_tokens']} tokens an answer ({info['rates']['record']})",
        f"machine: {info['versions']['cpu']}, {info['versions']['cores']} cores; "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items() if k not in ("cpu", "cores")),
        "",
        "| arm | c | events/s | / direct | CPU s per 1k events | CPU ms per request | core share "
        "| event latency p50 / p99 (us) | added p50 / p99 (us) | TTFT p50 (ms) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        d = direct.get(r["concurrency"], r)
        cpu = r.get("cpu_s_per_1k_events")
        lines.append(
            f"| {r['arm']} | {r['concurrency']} | {r['events_s']:.0f} | {r['events_s'] / d['events_s']:.3f} | "
            + (
                f"{cpu:.4f} | {r['cpu_ms_per_request']:.2f} | {r['core_share']:.3f} | "
                if cpu is not None
                else "- | - | - | "
            )
            + f"{r['lat_p50_us']:.0f} / {r['lat_p99_us']:.0f} | "
            + f"{r['lat_p50_us'] - d['lat_p50_us']:+.0f} / {r['lat_p99_us'] - d['lat_p99_us']:+.0f} | "
            + f"{r['ttft_p50_ms']:.2f} | {r['errors']} |"
        )
    lines += ["", "short answers (1 token, no prefill wait; per-request cost):", ""]
    lines += ["| arm | c | requests/s | CPU ms per request | core share |", "|---|---:|---:|---:|---:|"]
    for r in short:
        if r.get("cpu_s") is None:
            lines.append(f"| {r['arm']} | {r['concurrency']} | {r['requests'] / r['wall_s']:.0f} | - | - |")
        else:
            lines.append(
                f"| {r['arm']} | {r['concurrency']} | {r['requests'] / r['wall_s']:.0f} | "
                f"{r['cpu_ms_per_request']:.3f} | {r['core_share']:.3f} |"
            )
    lines += ["", "fit (CPU = a * requests + b * events, from c=32 and the short level):", ""]
    for name, f in fit.items():
        lines.append(
            f"- {name}: a = {f['a_ms_per_request']:.3f} ms per request, b = {f['b_us_per_event']:.1f} us per event"
        )
    return "\n".join(lines)


def solve(long: dict, short: dict) -> dict:
    """CPU = a*R + b*E from two levels (2x2, Cramer)."""
    r1, e1, c1 = long["requests"], long["events"], long["cpu_s"]
    r2, e2, c2 = short["requests"], short["events"], short["cpu_s"]
    det = r1 * e2 - r2 * e1
    a = (c1 * e2 - c2 * e1) / det
    b = (r1 * c2 - r2 * c1) / det
    return {"a_ms_per_request": a * 1000, "b_us_per_event": b * 1e6}


def run_main(
    out: Path, seconds: float, levels: tuple[int, ...], profile: bool, compare: Path | None, short_reps: int
) -> int:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rates = record_rates()
    info = {"rates": rates, "versions": versions(), "seconds": seconds}
    print(json.dumps(info), flush=True)
    env_py = {"PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen] = []
    try:
        for core in ENGINE_CORES:
            procs.append(
                pinned(core, sys.executable, __file__, "engine", str(ENGINE_PORT), json.dumps(rates), env=env_py)
            )
        wait_port(ENGINE_PORT)
        from perf.bare_relay import BARE_RELAY

        relay = pinned(
            RELAY_CORE, sys.executable, "-c", BARE_RELAY, "127.0.0.1", str(RELAY_PORT), "127.0.0.1", str(ENGINE_PORT)
        )
        procs.append(relay)
        gw = start_gateway(out, GW_PORT, GATEWAY_CORE, "shipped")
        procs.append(gw)
        wait_port(RELAY_PORT)
        extra = []
        if compare is not None:  # the shipped entrypoint of another checkout (before / after a change)
            other = start_gateway(out, COMPARE_PORT, COMPARE_CORE, "shipped", compare.resolve())
            procs.append(other)
            extra = [(f"gateway@{compare.name}", COMPARE_PORT, GW_KEY, other.pid)]
        idle = {pid: idle_rate(pid) for pid in (gw.pid, relay.pid, *(e[3] for e in extra))}
        info["idle_cpu_ms_s"] = {str(k): v / 1e6 for k, v in idle.items()}
        arms = [
            ("direct", ENGINE_PORT, ENGINE_KEY, None),
            ("gateway", GW_PORT, GW_KEY, gw.pid),
            ("relay", RELAY_PORT, ENGINE_KEY, relay.pid),
            *extra,
        ]
        for _name, port, key, _ in arms:  # warm: connections, imports, the first requests' paths
            run_load(port, key, 8, 2.0, 16, 0.0)
        rows = []
        for i, conc in enumerate(levels):
            for name, port, key, pid in arms if i % 2 == 0 else arms[::-1]:
                rows.append(arm(name, port, key, pid, idle.get(pid, 0), conc, seconds, out=None, prefill_s=None))
        short = []
        for i in range(short_reps):  # the per-request cost: repeated, the order alternating
            for name, port, key, pid in arms if i % 2 == 0 else arms[::-1]:
                short.append(arm(name, port, key, pid, idle.get(pid, 0), 8, max(seconds / 2, 4), out=1, prefill_s=0.0))
        by = {(r["arm"], r["concurrency"]): r for r in rows}
        base = 32 if 32 in levels else levels[-1]
        fit = {}
        for name, _, _, pid in arms:
            if pid:
                mine = [r for r in short if r["arm"] == name]
                summed = {k: sum(r[k] for r in mine) for k in ("requests", "events", "cpu_s")}
                fit[name] = solve(by[(name, base)], summed)
        if profile:
            for p in (gw,):
                p.terminate()
                p.wait(timeout=15)
            prof = start_gateway(out, PROFILE_PORT, GATEWAY_CORE, "profile")
            procs.append(prof)
            # what a request costs, apart from its events: the short level, under the profiler
            arm("gateway-cprofile", PROFILE_PORT, GW_KEY, prof.pid, 0, 8, max(seconds / 2, 4), out=1, prefill_s=0.0)
            prof.terminate()
            prof.wait(timeout=30)
        text = table(sorted(rows, key=lambda r: (r["concurrency"], r["arm"])), short, fit, info)
        (out / "gateway_gpu.json").write_text(json.dumps({"info": info, "rows": rows, "short": short, "fit": fit}))
        (out / "gateway_gpu.md").write_text(text + "\n")
        print(text, flush=True)
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="role", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--seconds", type=float, default=10.0)
    r.add_argument("--levels", default=",".join(map(str, LEVELS)))
    r.add_argument("--no-profile", action="store_true")
    r.add_argument("--compare", type=Path, default=None, help="another checkout whose gateway runs beside")
    r.add_argument("--short-reps", type=int, default=3)
    e = sub.add_parser("engine")
    e.add_argument("port", type=int)
    e.add_argument("rates")
    g = sub.add_parser("profiled")
    g.add_argument("config")
    g.add_argument("profile_out")
    ld = sub.add_parser("load")
    ld.add_argument("port", type=int)
    ld.add_argument("key")
    ld.add_argument("--streams", type=int, default=1)
    ld.add_argument("--seconds", type=float, default=10.0)
    ld.add_argument("--out", type=int, default=None)
    ld.add_argument("--prefill-s", type=float, default=None)
    ld.add_argument("--result", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.role == "run":
        levels = tuple(int(x) for x in a.levels.split(","))
        return run_main(a.out, a.seconds, levels, not a.no_profile, a.compare, a.short_reps)
    if a.role == "engine":
        engine_main(a.port, json.loads(a.rates))
        return 0
    if a.role == "profiled":
        gateway_profiled(a.config, a.profile_out)
        return 0
    import uvloop

    rates = record_rates()
    body = request_body(rates, a.out, a.prefill_s)
    url = f"http://127.0.0.1:{a.port}/v1/chat/completions"
    got = uvloop.run(load_main(url, a.key, a.streams, a.seconds, body))
    a.result.write_text(json.dumps(got))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
