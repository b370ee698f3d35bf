"""The gateway's budgets for `make bench` (issue 36): what a request pays for going through the
gateway rather than straight to the engine, and what the gateway holds while idle.

`testbed-single` on the head, the gateway in front of it (`gateway up`, the bench's own client key).
Per repetition, the same `vllm bench serve` (sparkcluster's own argv, bench/sweep) runs inside the
head container against the engine (`http://CONTROL_IP:8000`) and through the gateway
(`http://CONTROL_IP:4000`), the two interleaved and their order alternating: a TTFT level at
concurrency 1 and a throughput level at concurrency 8. Figures, each a per-repetition pair (same
minute, same machine load) judged on the median of the pairs:
- p50 TTFT through the gateway minus direct: at most 5 ms;
- the gateway's idle memory: the PSS of its container's processes (shared pages counted once),
  once it has judged its route and before any request: under 100 MB.
The output throughput at concurrency 8, through the gateway / direct, is reported with its spread
(min-max over the repetitions, and max - min as a row of its own) but judges nothing (issue 63): on
two shared cores the relay, the engine's ranks and the load generator contend for the same CPUs, so
the ratio measures that contention, and its spread (0.50-1.15 on 2026-11-28) exceeds a 3 % budget.
The throughput budget is judged instead on the figure that carries to a Spark, read from the GPU
machine's record (GPU_RECORD, written by perf/gateway_gpu.py; perf/gateway.md): the number of
streams, each at the fastest shipped single-Spark decode rate, at which the gateway's one core would
cost more than 3 % of the throughput, at least 128 (the highest concurrency measured there).
Beside them, for comparison: the same c=8 level through a bare byte relay (uvloop, no HTTP parsed,
the bytes copied from one socket to the other) in the gateway's container, `http://CONTROL_IP:4001`,
interleaved with the other two (the gateway always in the middle). It pays per SSE event what any
Python proxy pays (a wake, a read and a write) and nothing more, so its ratio to direct shows what a
relay of any kind costs on the testbed, where the CPU engine (its worker pinned to core 0) and the
load generator already take both cores, and how large the run-to-run noise is: on 2026-11-27 the
same arm varied by up to 30 % between repetitions minutes apart (direct 825, 677 and 591 tok/s),
so a 3 % budget needs many repetitions to be judged.
Leaves the cluster down.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import statistics
import time
from pathlib import Path

from perf import testbed
from perf.bare_relay import BARE_RELAY
from perf.figures import Figure, info, say
from perf.session import standalone
from sparkcluster.bench import results, sweep
from sparkcluster.config import profile as profiles

PROFILE = "testbed-single"
HEAD = "spark-head"
GW_CONTAINER = "sparkcluster-testbed-gateway"
GW_PORT = 4000
RELAY_PORT = 4001
GW_KEY = "gw-bench-key-5e0c93a1"  # the bench's own client key (test scaffolding, like the testbed's)
IDLE_SETTLE_S = 5.0  # a few of its looks at the supervisor after `gateway up` returned
ADDED_TTFT_MS, IDLE_MB = 5.0, 100.0
GPU_RECORD = Path(__file__).with_name("gateway_gpu.json")  # perf/gateway_gpu.py's output, committed
COST = 0.03  # the share of a Spark's throughput the gateway may cost (issue 63)
MIN_STREAMS = 128  # ... at no fewer concurrent streams than this (the GPU machine's top level)
MIN_REPS = 9  # the issue asks for five; the testbed's noise (below) asks for more to judge 3 %


LEVELS = {
    "ttft": sweep.Level(concurrency=1, num_prompts=20, input_len=64, output_len=16),
    # 256 prompts: about 20 s of generation a level; at 64 (5 s) one level's throughput varied by
    # +-10 % between runs of the same arm on two shared cores, more than the budget's 3 %
    "c8": sweep.Level(concurrency=8, num_prompts=256, input_len=64, output_len=64),
}


def run_level(tb, container: str, target, level, key: str, run_id: str, cpus: str | None = None) -> dict:
    """One `vllm bench serve` level inside `container` on the head; its row (bench/results). The key
    reaches the exec's environment from stdin, never a command line. `cpus`: the load generator
    kept on those cores (taskset)."""
    folder = sweep.level_dir(run_id, level)
    argv = sweep.exec_argv(folder, sweep.bench_argv(level, target, folder))
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    cmd = "read -r k; OPENAI_API_KEY=$k docker exec -e OPENAI_API_KEY -e HF_HUB_OFFLINE=1 " + shlex.join(
        [container, *argv]
    )
    tb.sh(HEAD, cmd, input=key + "\n", timeout=900)
    doc = json.loads(tb.sh(HEAD, f"docker exec {container} cat {folder}/{sweep.RESULT_FILE}").stdout)
    tb.sh(HEAD, f"docker exec {container} rm -rf {shlex.quote(folder)}", check=False)
    return results.row_from_result(doc, level)


GATEWAY_PSS = (
    "t=0; for p in $(docker top {c} -eo pid | tail -n +2); do "
    "k=$(awk '/^Pss:/{{print $2}}' \"/proc/$p/smaps_rollup\" 2>/dev/null); t=$((t + ${{k:-0}})); done; echo $t"
)


def start_bare_relay(tb, listen: str, upstream: str, upstream_port: int) -> None:
    argv = ["python3", "-c", BARE_RELAY, listen, str(RELAY_PORT), upstream, str(upstream_port)]
    tb.sh(HEAD, "docker exec -d " + shlex.join([GW_CONTAINER, *argv]))
    for _ in range(100):  # listening within seconds; each look is one short exec
        if tb.sh(HEAD, f"bash -c 'exec 3<>/dev/tcp/{listen}/{RELAY_PORT}'", check=False).returncode == 0:
            return
    raise RuntimeError(f"the bare relay did not listen on {listen}:{RELAY_PORT}")


def gateway_pss_mb(tb) -> float:
    return int(tb.sh(HEAD, GATEWAY_PSS.format(c=GW_CONTAINER)).stdout.strip() or 0) / 1024


def measure(s) -> None:
    """On session `s`: testbed-single and the gateway up, then REPS interleaved pairs; cluster down after."""
    s.sc("down", timeout=180)
    s.sc("up", "--profile", PROFILE, "--node", HEAD, timeout=900)
    s.sc.env["GATEWAY_API_KEYS"] = GW_KEY
    try:
        s.sc("gateway", "up", timeout=300)
        time.sleep(IDLE_SETTLE_S)
        s.rec("gw_idle_pss_mb", gateway_pss_mb(s.tb))
        prof = profiles.load_profile(PROFILE)
        ctl = str(s.head.control_ip)
        engine = sweep.target_for(prof, s.inv.cluster.api_port)
        port = prof.serve.port or s.inv.cluster.api_port
        direct = dataclasses.replace(engine, base_url=f"http://{ctl}:{port}")
        through = dataclasses.replace(engine, base_url=f"http://{ctl}:{GW_PORT}")
        relayed = dataclasses.replace(engine, base_url=f"http://{ctl}:{RELAY_PORT}")
        start_bare_relay(s.tb, ctl, ctl, port)
        container = "sparkcluster-testbed-head"
        ways = {"direct": (direct, testbed.API_KEY), "gateway": (through, GW_KEY), "relay": (relayed, testbed.API_KEY)}
        for i in range(max(s.reps, MIN_REPS)):
            rows: dict[str, dict[str, dict]] = {}
            order = ("direct", "gateway", "relay") if i % 2 == 0 else ("relay", "gateway", "direct")
            for name, level in LEVELS.items():
                for way in order:
                    if way == "relay" and name != "c8":
                        continue
                    target, key = ways[way]
                    rows.setdefault(way, {})[name] = run_level(
                        s.tb, container, target, level, key, f"perf-gw-{i}-{way}"
                    )
            d, g = rows["direct"], rows["gateway"]
            s.rec("gw_direct_ttft_p50_ms", d["ttft"]["ttft_p50_ms"])
            s.rec("gw_through_ttft_p50_ms", g["ttft"]["ttft_p50_ms"])
            s.rec("gw_direct_c8_tok_s", d["c8"]["output_tok_s"])
            s.rec("gw_through_c8_tok_s", g["c8"]["output_tok_s"])
            s.rec("gw_relay_c8_tok_s", rows["relay"]["c8"]["output_tok_s"])
            say(
                f"  gateway #{i}: p50 TTFT {d['ttft']['ttft_p50_ms']:.1f} ms direct, "
                f"{g['ttft']['ttft_p50_ms']:.1f} ms through; c=8 {d['c8']['output_tok_s']:.1f} tok/s direct, "
                f"{g['c8']['output_tok_s']:.1f} through, {rows['relay']['c8']['output_tok_s']:.1f} bare relay"
            )
    finally:
        s.sc("gateway", "down", timeout=120, check=False)
        s.sc.env.pop("GATEWAY_API_KEYS", None)
        s.sc("down", timeout=180, check=False)


def figures(R: dict) -> list[Figure]:
    """The gateway's rows; none from a results.json written before this family existed."""
    if not R.get("gw_direct_ttft_p50_ms"):
        return []
    added = [g - d for g, d in zip(R["gw_through_ttft_p50_ms"], R["gw_direct_ttft_p50_ms"])]
    ratio = [g / d for g, d in zip(R["gw_through_c8_tok_s"], R["gw_direct_c8_tok_s"])]
    medians = (
        f"medians: direct {statistics.median(R['gw_direct_ttft_p50_ms']):.1f} ms, "
        f"through {statistics.median(R['gw_through_ttft_p50_ms']):.1f} ms"
    )
    return [
        Figure(
            "gateway_ttft_added",
            "gateway: p50 TTFT added (through - direct, concurrency 1, interleaved)",
            "ms",
            f"<= {ADDED_TTFT_MS:g}",
            added,
            statistics.median(added) <= ADDED_TTFT_MS,
            note=medians,
        ),
        *gpu_figures(),
        info(
            "gateway_throughput", "... output throughput at concurrency 8, through / direct (testbed)", "ratio", ratio
        ),
        info(
            "gateway_throughput_spread",
            "... its spread over the repetitions (max - min)",
            "ratio",
            [max(ratio) - min(ratio)],
        ),
        Figure(
            "gateway_idle_pss",
            "gateway: idle memory (PSS of its container)",
            "MB",
            f"< {IDLE_MB:g}",
            R["gw_idle_pss_mb"],
            max(R["gw_idle_pss_mb"]) < IDLE_MB,
        ),
        *(
            [
                info(
                    "gateway_bare_relay",
                    "... for comparison: throughput at c=8 through a bare byte relay / direct",
                    "ratio",
                    [r / d for r, d in zip(R["gw_relay_c8_tok_s"], R["gw_direct_c8_tok_s"])],
                )
            ]
            if R.get("gw_relay_c8_tok_s")
            else []
        ),
        info(
            "gateway_direct_ttft",
            "... p50 TTFT straight to the engine (concurrency 1)",
            "ms",
            R["gw_direct_ttft_p50_ms"],
        ),
    ]


def streams_at_cost(doc: dict, cost: float = COST) -> dict:
    """From the GPU machine's record: the streams at which the gateway would cost more than `cost` of
    a Spark's throughput (perf/gateway.md, "From the figures to a Spark"). The gateway is one event
    loop on one core; at its highest measured level every event cost it b CPU seconds, per-request
    work included, so it passes at most 1/b events a second, and a Spark whose streams produce E
    events a second loses 1 - 1/(b E) of them once E > 1/b: more than `cost` once
    E > 1/((1 - cost) b). Each stream at the record's single-stream decode rate r (an upper bound:
    a batch's streams decode slower, never faster) gives E = c r, so c = 1/((1 - cost) b r)."""
    top = max((r for r in doc["rows"] if r["arm"] == "gateway"), key=lambda r: r["concurrency"])
    b = top["cpu_s"] / top["events"]
    rate = doc["info"]["rates"]["decode_tok_s"]
    return {"streams": 1.0 / ((1.0 - cost) * b * rate), "us_per_event": b * 1e6, "at": top["concurrency"]}


def gpu_figures(path: Path | None = None) -> list[Figure]:
    """The budget that carries to a Spark, from the committed GPU-machine record; none without it."""
    path = path or GPU_RECORD
    if not path.exists():
        return []
    got = streams_at_cost(json.loads(path.read_text()))
    return [
        Figure(
            "gateway_streams_at_3pct",
            f"gateway: streams at which it would cost {COST:.0%} of a Spark's throughput (GPU machine, {path.name})",
            "count",
            f">= {MIN_STREAMS}",
            [round(got["streams"])],
            got["streams"] >= MIN_STREAMS,
            note=f"{got['us_per_event']:.1f} us of CPU per event at concurrency {got['at']}",
        )
    ]


def main(argv: list[str] | None = None) -> int:
    return standalone(
        "gateway",
        "The gateway's budgets (issue 36): TTFT added, throughput at c=8 through / direct, idle memory.",
        measure,
        figures,
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
