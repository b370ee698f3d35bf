"""What a peer without a key can hold of the gateway, measured (`make bench`; `python -m
perf.gateway_exposure` alone): loopback only, no testbed.

The gateway as its container runs it (`python -m sparkcluster.gateway.entrypoint CONFIG`: uvicorn with
gateway/exposure's bounds) in a process of its own whose file limit is NOFILE (1,024), in front of the
unit tests' stub engine (tests/unit/gateway_fakes' `Engine`, through perf/testbed) served by uvicorn in
a process of its own. Per repetition:
- the keyed answer's latency while FLOOD (1,100) connections that never show a key are open (target:
  under 2 s in every repetition; the client waits 10 s at most);
- how long a request whose headers never finish is held before the gateway closes it (under 30 s);
- the gateway's memory growth (its peak RSS, reset before, against its RSS before) over one keyed
  request with a 300 MiB body (under 20 MB: it is refused with 413 before it is buffered);
- `/metrics`' growth in bytes after 500 keyed requests naming models nobody serves (under 1 KB);
- the limits' cost: requests a second at concurrency 8 straight to the stub, through the gateway as
  shipped, and through the same app under plain uvicorn with gateway/exposure left out (BARE: the
  gateway has no switch that turns its limits off, so the bench starts that one itself), interleaved,
  the order reversed every other repetition. On two shared cores the load generator, the gateway and
  the stub contend for the CPUs, so the ratios are reported with their spread and judge nothing.
Writes perf/gateway_exposure.md (RESULTS) and prints it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from perf.figures import Figure, fmt, info, say

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).with_name("gateway_exposure.md")
NOFILE = 1024
FLOOD = 1100
REPS = int(os.environ.get("BENCH_REPS", "3"))
BODY_MIB = 300
UNKNOWN = 500
LOAD_S = 4.0  # each throughput arm's length
CONCURRENCY = 8
KEYED_S, HEADER_S, BODY_MB, METRICS_B = 2.0, 30.0, 20.0, 1024
MODEL = "bench-model"
KEY = "gw-exposure-bench-key-4f1d"  # the bench's own client key (test scaffolding)

GATEWAY = (
    "import resource, sys\n"
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({NOFILE}, {NOFILE}))\n"
    "from sparkcluster.gateway.entrypoint import main\n"
    "sys.exit(main(sys.argv[1]))\n"
)
# the same app under plain uvicorn, gateway/exposure's wrapper and knobs left out: the bench's own start,
# beside the shipped one, so that the limits' own cost is read (the gateway has no switch for it)
BARE = (
    "import json, resource, sys, uvicorn\n"
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({NOFILE}, {NOFILE}))\n"
    "from sparkcluster.gateway.app import Gateway\n"
    "cfg = json.load(open(sys.argv[1]))\n"
    "uvicorn.run(Gateway(cfg, sys.argv[1]).app(), host='127.0.0.1', port=int(sys.argv[2]), log_level='warning',\n"
    "            access_log=False, timeout_graceful_shutdown=5)\n"
)
STUB = (
    "import sys, uvicorn\n"
    "from perf.testbed import StubEngine\n"
    f"e = StubEngine([{MODEL!r}])\n"
    "e.release.set()\n"
    "e.seen = type('Dropped', (list,), {'append': lambda self, x: None})()  # holds no request\n"
    "uvicorn.run(e.app(), host='127.0.0.1', port=int(sys.argv[1]), log_level='warning', access_log=False)\n"
)
BEARER = {"Authorization": f"Bearer {KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(0.05)


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Rig:
    """The stub engine and the gateway in front of it, each a process of its own."""

    def __init__(self, work: Path):
        self.stub_port, self.port = free_port(), free_port()
        self.stub = subprocess.Popen([sys.executable, "-c", STUB, str(self.stub_port)], cwd=ROOT)
        self.direct = f"http://127.0.0.1:{self.stub_port}"
        until(lambda: self._up(f"{self.direct}/health"), 60, "the stub engine")
        cfg = {
            "host": "127.0.0.1",
            "port": self.port,
            "keys": [KEY],
            "poll_s": 0.5,
            "drain_s": 5,
            "deployments": [
                {
                    "key": f"{MODEL}@stub",
                    "names": [MODEL],
                    "upstream": self.direct,
                    "supervisor": f"{self.direct}/report",
                    "api_key": "upstream-key-of-the-stub",
                }
            ],
        }
        path = work / "gateway.json"
        path.write_text(json.dumps(cfg))
        path.chmod(0o600)
        self.gw = subprocess.Popen([sys.executable, "-c", GATEWAY, str(path)], cwd=ROOT, stdout=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        until(self._serving, 60, "the gateway to serve")
        self.bare_port = free_port()
        self.bare = subprocess.Popen(
            [sys.executable, "-c", BARE, str(path), str(self.bare_port)], cwd=ROOT, stdout=subprocess.DEVNULL
        )
        until(lambda: self._serving(f"http://127.0.0.1:{self.bare_port}", self.bare), 60, "the bare gateway to serve")

    @staticmethod
    def _up(url: str) -> bool:
        try:
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def _serving(self, url: str | None = None, proc: subprocess.Popen | None = None) -> bool:
        if (proc or self.gw).poll() is not None:
            raise SystemExit("bench: the gateway exited")
        try:
            got = httpx.get(f"{url or self.url}/gateway/status", headers=BEARER, timeout=5)
        except httpx.HTTPError:
            return False
        return got.status_code == 200 and all(r["in_rotation"] for r in got.json()["routes"])

    def stop(self) -> None:
        procs = [p for p in (getattr(self, "bare", None), self.gw, self.stub) if p is not None]
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def body_growth_mb(rig: Rig) -> tuple[float, int]:
    """The gateway's peak RSS over one keyed request with a BODY_MIB body, less its RSS before (MB),
    and the status it answered."""
    pid = rig.gw.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
    before = status_kb(pid, "VmRSS")
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {BODY_MIB << 20}\r\n\r\n"
    ).encode()
    piece = b"x" * (1 << 20)
    got = b""
    with socket.create_connection(("127.0.0.1", rig.port), timeout=60) as c:
        c.sendall(head)
        try:
            for _ in range(BODY_MIB):
                c.sendall(piece)
        except OSError:
            pass  # refused and closed before the whole body: what is measured
        try:
            while chunk := c.recv(65536):
                got += chunk
                if b"\r\n\r\n" in got:
                    break
        except OSError:
            pass
    status = int(got.split()[1]) if got.startswith(b"HTTP/1.1 ") else 0
    return (status_kb(pid, "VmHWM") - before) / 1024, status


def metrics_growth(rig: Rig, rep: int) -> int:
    """/metrics' bytes after UNKNOWN keyed requests naming models nobody serves, less before."""
    with httpx.Client(base_url=rig.url, headers=BEARER, timeout=30) as c:
        before = len(c.get("/metrics").content)
        for i in range(UNKNOWN):
            c.post("/v1/chat/completions", json={"model": f"nobody-serves-{rep}-{i}"})
        return len(c.get("/metrics").content) - before


def keyed_under_flood_s(rig: Rig) -> float:
    """A keyed request's latency with FLOOD keyless connections open; the flood closed after, and
    the gateway's files back to what it held before."""
    before = files(rig.gw.pid)
    flood = []
    try:
        for _ in range(FLOOD):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", rig.port))
            flood.append(s)
        t = time.monotonic()
        try:
            got = httpx.post(
                f"{rig.url}/v1/chat/completions", json={"model": MODEL}, headers=BEARER, timeout=10
            ).status_code
        except httpx.HTTPError:
            got = 0
        took = time.monotonic() - t
    finally:
        for s in flood:
            s.close()
    until(lambda: files(rig.gw.pid) <= before + 2, 90, "the gateway to let the flood go")
    return took if got == 200 else float("inf")


def header_held_s(rig: Rig) -> float:
    """How long a keyed request whose headers never finish is held before the gateway closes it."""
    with socket.create_connection(("127.0.0.1", rig.port), timeout=120) as c:
        c.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nX-Slow: ".encode())
        t = time.monotonic()
        try:
            while c.recv(4096):
                pass
        except OSError:
            pass
        return time.monotonic() - t


async def _answer(r: asyncio.StreamReader) -> int:
    """One HTTP/1.1 answer read off a kept-alive connection (a length, or chunks); its status."""
    head = await r.readuntil(b"\r\n\r\n")
    status = int(head.split(None, 2)[1])
    lines = head.lower().split(b"\r\n")
    length = next((int(x.split(b":", 1)[1]) for x in lines if x.startswith(b"content-length:")), None)
    if length is not None:
        await r.readexactly(length)
        return status
    while True:  # chunked
        n = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
        await r.readexactly(n + 2)
        if not n:
            return status


async def _load(port: int, headers: dict) -> float:
    """Requests a second at CONCURRENCY for LOAD_S: small non-streaming chat requests, each worker on
    a kept-alive connection of its own, written and read with asyncio's streams (a generator that
    costs far less than an HTTP client library, on cores the gateway and the stub share)."""
    body = json.dumps({"model": MODEL, "messages": []}).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    req = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n{extra}Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    done = 0
    end = time.monotonic() + LOAD_S

    async def one() -> None:
        nonlocal done
        r, w = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < end:
                w.write(req)
                if await _answer(r) == 200:
                    done += 1
        finally:
            w.close()

    t = time.monotonic()
    await asyncio.gather(*(one() for _ in range(CONCURRENCY)))
    return done / (time.monotonic() - t)


def throughput(rig: Rig, rep: int) -> dict[str, float]:
    """Requests a second straight to the stub, through the gateway as shipped and through the same
    app with its limits left out, interleaved, the order reversed every other repetition."""
    arms = {"direct": (rig.stub_port, {}), "gateway": (rig.port, BEARER), "bare": (rig.bare_port, BEARER)}
    order = list(arms) if rep % 2 == 0 else list(reversed(arms))
    return {a: asyncio.run(_load(*arms[a])) for a in order}


def within(key: str, title: str, unit: str, bound: float, values: list[float]) -> Figure:
    """A bound that must hold in every repetition."""
    return Figure(key, title, unit, f"< {fmt(bound, unit)} {unit}", values, max(values) < bound)


def render(figs: list[Figure], when: str, statuses: list[int], load: tuple[float, float] = (0.0, 0.0)) -> str:
    out = [
        "# What a peer without a key can hold of the gateway (`python -m perf.gateway_exposure`)",
        "",
        f"{when}, on this machine ({os.cpu_count()} cores, shared); loopback only, no testbed. The gateway as its",
        f"container runs it (`sparkcluster.gateway.entrypoint`, uvicorn), its file limit {NOFILE:,}, in front of",
        "the unit tests' stub engine, each a process of its own. Median of "
        f"{len(figs[0].values)} repetitions, min-max; a bound must hold in every repetition. The machine's",
        f"1-minute load average was {load[0]:.1f} at the start and {load[1]:.1f} at the end (other work on it).",
        "",
        "| figure | median | min | max | unit | target | met |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for f in figs:
        met = "-" if f.ok is None else ("yes" if f.ok else "**no**")
        out.append(
            f"| {f.title} | {fmt(f.median, f.unit)} | {fmt(min(f.values), f.unit)} | {fmt(max(f.values), f.unit)} "
            f"| {f.unit} | {f.target} | {met} |"
        )
    out += [
        "",
        f"The {BODY_MIB} MiB body was answered {', '.join(str(s) for s in statuses)} (413: refused past the",
        "route's limit before it was buffered or forwarded). The gateway has no switch that turns its limits",
        'off (they are the protocol uvicorn runs, gateway/exposure), so "limits left out" is the bench\'s own',
        "start of the same app under plain uvicorn, beside the shipped one; the three arms are interleaved,",
        "the order reversed every other repetition. On two shared cores the load generator, the gateway and",
        "the stub contend for the CPUs: the ratios say what a Python relay costs here; the limits' own cost",
        "is the gap between the two ratios, against the spread of the limits-off one.",
    ]
    return "\n".join(out) + "\n"


def main() -> int:
    say(f"gateway exposure: loopback, file limit {NOFILE}, {REPS} repetitions")
    load0 = os.getloadavg()[0]
    rows: dict[str, list[float]] = {k: [] for k in ("flood", "header", "body", "metrics", "direct", "gateway", "bare")}
    statuses: list[int] = []
    with tempfile.TemporaryDirectory() as d:
        rig = Rig(Path(d))
        try:
            for rep in range(REPS):
                mb, st = body_growth_mb(rig)
                rows["body"].append(mb)
                statuses.append(st)
                rows["metrics"].append(metrics_growth(rig, rep))
                rows["flood"].append(keyed_under_flood_s(rig))
                rows["header"].append(header_held_s(rig))
                for arm, rate in throughput(rig, rep).items():
                    rows[arm].append(rate)
                say(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.3g}" for k, v in rows.items()))
        finally:
            rig.stop()
    ratio = [g / d for g, d in zip(rows["gateway"], rows["direct"])]
    bare = [b / d for b, d in zip(rows["bare"], rows["direct"])]
    figs = [
        within("keyed_flood_s", f"keyed answer under {FLOOD:,} keyless connections", "s", KEYED_S, rows["flood"]),
        within("header_held_s", "an unfinished header held for", "s", HEADER_S, rows["header"]),
        within("body_growth_mb", f"gateway memory growth, one {BODY_MIB} MiB body", "MB", BODY_MB, rows["body"]),
        within(
            "metrics_growth_b", f"/metrics growth, {UNKNOWN} unknown model names", "bytes", METRICS_B, rows["metrics"]
        ),
        info("c8_direct", f"c{CONCURRENCY} requests/s straight to the stub", "req/s", rows["direct"]),
        info("c8_gateway", f"c{CONCURRENCY} requests/s through the gateway (limits on)", "req/s", rows["gateway"]),
        info("c8_bare", f"c{CONCURRENCY} requests/s through the same app, limits left out", "req/s", rows["bare"]),
        info("c8_ratio", "through / direct, limits on", "ratio", ratio),
        info("c8_ratio_bare", "through / direct, limits left out", "ratio", bare),
        info("c8_ratio_spread", "through / direct, limits left out: max - min", "ratio", [max(bare) - min(bare)]),
    ]
    text = render(figs, time.strftime("%Y-%m-%d"), statuses, (load0, os.getloadavg()[0]))
    RESULTS.write_text(text)
    print(text)
    return 0 if all(f.ok is not False for f in figs) else 1


if __name__ == "__main__":
    sys.exit(main())
