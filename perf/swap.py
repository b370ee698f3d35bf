"""A swap on one Spark (models taking turns): the time from a request for a model on standby to its
first token, while the other on-demand model is awake and yields to it by the inventory's rule,
against a cold `up` of the same model (from nothing serving to its first token). Target: the swap at
most 0.6 of the cold start, with the compile caches warm.

On the testbed's head, made to read as a 128 GB Spark (the meminfo stand-in): two on-demand variants
of `testbed-single` (the real vLLM CPU engine, TP=1), each asking half of the node, so that one awake
leaves too little for the other, and the inventory's `[on_demand] rule = "lru"`; one gateway in front.
A swap: a streamed request for the sleeping one, timed from its sending to the first token's chunk
(the gateway holds it while the awake one drains and stops and the asked one starts). A cold start:
`down`, then `up --profile` of the same variant without `[on_demand]`, timed from the command's start
to the first token's chunk of a request straight to the engine (through the tests' door into the
head's network, where the engine listens on the control address). The CPU engine runs eager
(`enforce_eager`, TORCHDYNAMO_DISABLE: the testbed profile's), so its compile caches are warm by
construction; on a GPU the compile caches that the container contract keeps do the same.

`python -m perf.swap` on a testbed that is up (part of `make bench`; BENCH_REPS repetitions of each,
at least 3); writes perf/swap.md and perf/swap.json.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from perf import testbed
from perf.cli import CLI
from perf.figures import Figure, at_most_median, die, info, say

REPO = Path(__file__).resolve().parent.parent
HEAD = "spark-head"
SINGLE, MODEL = "testbed-single", "testbed-tiny-single"
A, B, COLD = "bench-swap-a", "bench-swap-b", "bench-swap-cold"
A_MODEL, B_MODEL = "bench-swap-tiny-a", "bench-swap-tiny-b"
GW_KEY = "gw-bench-swap-key-61d0"  # the bench's own client key (test scaffolding)
GW = f"http://{testbed.lan_ip(HEAD)}:4000"
BOUND = 0.6
MIN_REPS = 3


def profiles(folder: Path) -> None:
    """The two on-demand halves and the cold variant (B's model, not on demand), from testbed-single."""
    text = (testbed.PROFILES / f"{SINGLE}.toml").read_text()
    if f'served_name = "{MODEL}"' not in text or "gpu_memory_utilization = 0.2" not in text:
        die(f"{SINGLE}.toml no longer has the served name and memory share this bench edits")
    half = text.replace("gpu_memory_utilization = 0.2", "gpu_memory_utilization = 0.5")
    od = "\n[on_demand]\nenabled = true\nidle_ttl_s = 3600\n"
    (folder / f"{A}.toml").write_text(half.replace(MODEL, A_MODEL) + od)
    (folder / f"{B}.toml").write_text(half.replace(MODEL, B_MODEL) + od)
    (folder / f"{COLD}.toml").write_text(half.replace(MODEL, B_MODEL))


def inventory(tb, folder: Path) -> Path:
    text = tb.inventory_text().replace('ssh_config = "ssh_config"', f'ssh_config = "{tb.ssh_config}"')
    text = text.replace('known_hosts = "known_hosts"', f'known_hosts = "{tb.known_hosts}"')
    p = folder / "cluster.toml"
    p.write_text(text + '\n[on_demand]\nrule = "lru"\n')
    return p


def first_token_s(url: str, model: str, headers: dict, t0: float, timeout: float = 900) -> float:
    """Seconds from t0 to the first chunk of a streamed answer that carries a token."""
    body = {"model": model, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=timeout) as r:
        if r.status_code != 200:
            die(f"{model}: {r.status_code} {r.read().decode(errors='replace')[:300]}")
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: ") and '"content"' in line:
                took = time.time() - t0
                for _ in lines:  # read it to its end: the engine is idle for the next one
                    pass
                return took
    die(f"{model}: the stream ended with no token")
    return 0.0


def run(reps: int) -> dict:
    tb = testbed.connect()
    with tempfile.TemporaryDirectory(prefix="sparkcluster-swap-") as wd:
        work = Path(wd)
        (work / "profiles").mkdir()
        profiles(work / "profiles")
        inv = inventory(tb, work)
        sc = CLI(tb, work, inventory=inv)
        sc.env["SPARKCLUSTER_PROFILES"] = testbed.profiles_env(str(work / "profiles"))
        sc.env["GATEWAY_API_KEYS"] = GW_KEY
        gw_headers = {"Authorization": f"Bearer {GW_KEY}"}
        engine = testbed.door(HEAD, 8000)
        eng_headers = {"Authorization": f"Bearer {testbed.API_KEY}"}
        got: dict[str, list[float]] = {"cold_s": [], "swap_s": []}
        tb.set_memory(HEAD, 128)
        try:
            for i in range(reps):
                sc("down", "--node", HEAD, check=False, timeout=600)
                sc("gateway", "down", check=False)
                t0 = time.time()
                sc("up", "--profile", COLD, "--node", HEAD, timeout=900)
                got["cold_s"].append(first_token_s(engine, B_MODEL, eng_headers, t0))
                say(f"swap {i + 1}/{reps}: cold up to the first token {got['cold_s'][-1]:.1f}s")
            sc("down", "--node", HEAD, timeout=600)
            sc("up", "--profile", A, "--node", HEAD, timeout=900)
            sc("up", "--profile", B, "--node", HEAD, "--beside", timeout=900)
            sc("gateway", "up", timeout=300)
            first_token_s(GW, A_MODEL, gw_headers, time.time())  # A awake: B's request is the first swap
            for i in range(reps):
                model = B_MODEL if i % 2 == 0 else A_MODEL
                t0 = time.time()
                got["swap_s"].append(first_token_s(GW, model, gw_headers, t0))
                say(f"swap {i + 1}/{reps}: to {model} {got['swap_s'][-1]:.1f}s")
        finally:
            sc("down", check=False, timeout=600)
            sc("gateway", "down", check=False)
            tb.set_memory(HEAD, None)
    return got


def figures(got: dict) -> list[Figure]:
    cold = statistics.median(got["cold_s"])
    ratios = [s / cold for s in got["swap_s"]]
    return [
        at_most_median(
            "swap_over_cold",
            "a swap's request to first token / a cold up's start to first token",
            BOUND,
            ratios,
            "each swap over the cold starts' median",
        ),
        info("swap_s", "a swap: request to first token (the other model yielding)", "s", got["swap_s"]),
        info("cold_s", "a cold `up`: command start to first token", "s", got["cold_s"]),
    ]


def main() -> None:
    reps = max(MIN_REPS, int(os.environ.get("BENCH_REPS", "5")))
    if os.geteuid() != 0:
        die("the testbed needs root (make bench as root, after make testbed-up)")
    with testbed.locked():
        started = time.time()
        got = run(reps)
    figs = figures(got)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    doc = {"when": when, "reps": reps, "cpus": os.cpu_count(), "figures": [f.as_dict() for f in figs], "raw": got}
    (REPO / "perf" / "swap.json").write_text(json.dumps(doc, indent=1) + "\n")
    rows = [
        f"# A swap on one Spark against a cold start (`python -m perf.swap`)\n\n{when}, the testbed's head"
        f" ({os.cpu_count()} CPUs; {reps} repetitions of each, median, min-max). Method: perf/swap.py.\n",
        "| figure | median | min | max | unit | target | met |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for f in figs:
        met = "-" if f.ok is None else ("yes" if f.ok else "no")
        lo, hi = min(f.values), max(f.values)
        rows.append(f"| {f.title} | {f.median:.3f} | {lo:.3f} | {hi:.3f} | {f.unit} | {f.target} | {met} |")
    (REPO / "perf" / "swap.md").write_text("\n".join(rows) + "\n")
    say("perf/swap.md written")


if __name__ == "__main__":
    main()
