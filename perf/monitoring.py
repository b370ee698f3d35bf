"""Monitoring's budgets (issue 37), for `make bench` and alone (`python -m perf.monitoring` on the
testbed that is up): what the metrics cost a serving node, how long a scrape of every node takes,
and the serving throughput with monitoring on against off.

Method. The cluster serves the testbed profile under a steady load (perf/load.py: four requests in
flight, 64 tokens each with ignore_eos). `sparkcluster monitor up` once (the testbed's monitoring
image, Debian's packages); then per repetition, interleaved (the order alternates), one window of
WINDOW_S with monitoring on and one with it off, "off" being every monitoring container stopped
(`docker stop`, so nothing scrapes and no node_exporter runs; `docker start` brings them back, and
the window begins once Prometheus has scraped every target healthy again). In each window:
- per node, the CPU time (utime+stime, /proc/PID/stat) and resident memory (VmRSS) of the node's
  agent (which serves sparkcluster's /metrics) and, when on, of every process of the node's
  node_exporter container (`docker top`);
- the engine's generated tokens a second, from its own counter at both ends of the window.
Figures:
- per node, (agent + node_exporter when on) - (agent when off), as a percent of one core and in MB;
  budgets < 1 % of a core and < 50 MB (median over the repetitions). Prometheus and Alertmanager
  on the head are the monitoring server, not the node's metrics: shown beside, not in the budget;
- a scrape of every node: the longest `scrape_duration_seconds` of any target over the window
  (Prometheus' own figure: each node's agent, its node_exporter, the engine), budget < 1 s in every
  repetition;
- throughput on / off per repetition, budget >= 0.98 on the median.
An agent keeps the memory it grew to serving /metrics once, so after the first scrape its "off"
RSS is no lower than its "on": the agents' RSS before any scrape (when monitoring was down at the
start) is kept in the details (`agent_rss_mb_never_scraped`) to compare.
The testbed's inventory scrapes every 2 s (`scrape_interval_s`, so that its alert tests wait
seconds, not tens of them); an owner's scrapes every 10 s, the default. The budgets are an owner's,
so monitoring is brought up through a copy of the inventory at the default interval (the same
cluster, nodes and images; only `[monitor]`'s interval differs), and `SCRAPE_S` in the environment
sets another. Ends as it found monitoring: down (`monitor down`) if it was not running at the start,
else brought back through the testbed's own inventory.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import time
import urllib.parse
from pathlib import Path

from perf import load, supervisor
from perf.cli import CLI
from perf.figures import Figure, info, say
from perf.session import PROFILE, standalone

WINDOW_S = 30.0
SCRAPE_S = float(os.environ.get("SCRAPE_S", "10"))  # an owner's inventory: [monitor] scrape_interval_s' default
MIN_REPS = 9  # the issue asks for at least five, interleaved; 30 s windows on two shared cores vary
# +-10 % (0.86-1.05 at five), more than the 2 % to judge
CPU_BUDGET_PCT, RSS_BUDGET_MB, SCRAPE_BUDGET_S, THROUGHPUT_BUDGET = 1.0, 50.0, 1.0, 0.98


def prometheus(s) -> str:
    return f"http://{s.inv.head.control_ip}:{s.inv.monitor.prometheus_port}"


def get_json(s, path: str):
    """A GET of Prometheus' API from the head (curl in its namespaces): it listens on the cluster's
    own addresses, which the controller has no route to, as an owner's laptop has none."""
    got = s.tb.sh("spark-head", "curl -sS --fail -m 10 " + shlex.quote(prometheus(s) + path), timeout=30, check=False)
    if got.returncode != 0:
        raise OSError(f"Prometheus at {prometheus(s)} did not answer {path}: {got.stderr.strip()}")
    return json.loads(got.stdout)


def query(s, expr: str) -> list[dict]:
    return get_json(s, "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["data"]["result"]


def targets(s) -> list[dict]:
    return get_json(s, "/api/v1/targets")["data"]["activeTargets"]


def containers(s, host: str) -> list[str]:
    from sparkcluster.labels import MONITOR_LABEL

    out = s.tb.docker(host, f"ps -aq --filter label={MONITOR_LABEL}={s.inv.cluster.name}").stdout
    return out.split()


def switch(s, on: bool) -> None:
    """Every monitoring container started (then every target scraped healthy since) or stopped."""
    for h in s.hosts:
        ids = containers(s, h)
        if ids:
            s.tb.docker(h, f"{'start' if on else 'stop'} {' '.join(ids)}", timeout=120)
    if on:
        since, end = time.time(), time.monotonic() + 120
        while time.monotonic() < end:
            try:
                ts = targets(s)
            except OSError:
                ts = []
            if ts and all(t["health"] == "up" and scraped_at(t) > since for t in ts):
                return
            time.sleep(1.0)
        raise SystemExit(f"bench: Prometheus did not scrape every target healthy within 120s: {ts}")


def scraped_at(t: dict) -> float:
    from perf.hosts import rfc3339

    try:
        return rfc3339(t.get("lastScrape") or "")
    except ValueError:
        return 0.0


def exporter_pids(s, host: str) -> list[str]:
    from sparkcluster.monitor import stack

    name = stack.container(s.inv, stack.NODE_EXPORTER)
    out = s.tb.docker(host, f"top {name} -eo pid", check=False)
    return [p for p in out.stdout.split()[1:] if p.isdigit()] if out.returncode == 0 else []


def server_pids(s) -> list[str]:
    from sparkcluster.monitor import stack

    pids = []
    for c in (stack.PROMETHEUS, stack.ALERTMANAGER):
        out = s.tb.docker("spark-head", f"top {stack.container(s.inv, c)} -eo pid", check=False)
        pids += [p for p in out.stdout.split()[1:] if p.isdigit()] if out.returncode == 0 else []
    return pids


def window(s, on: bool) -> dict:
    """One window: per node {agent, exporter} x {cpu %, rss MB}, the head's server, the throughput,
    and (on) the longest scrape of any target."""
    tb = s.tb
    procs = {
        h: {"agent": [supervisor.agent_pid(tb, h)], "exporter": exporter_pids(s, h) if on else []} for h in s.hosts
    }
    if on:
        procs["spark-head"]["server"] = server_pids(s)
    hz = {h: supervisor.clock_ticks(tb, h) for h in s.hosts}
    before = {h: {k: supervisor.cpu_ticks(tb, h, p) if p else 0 for k, p in ps.items()} for h, ps in procs.items()}
    t0 = time.monotonic()
    tput = load.throughput(s.endpoint, s.prof.served_model_name, WINDOW_S)
    t1 = time.monotonic()
    out: dict = {"tput": tput, "nodes": {}}
    for h, ps in procs.items():
        out["nodes"][h] = {
            k: {
                "cpu_pct": 100.0 * ((supervisor.cpu_ticks(tb, h, p) if p else 0) - before[h][k]) / hz[h] / (t1 - t0),
                "rss_mb": (supervisor.rss_kb(tb, h, p) if p else 0) / 1024,
            }
            for k, p in ps.items()
        }
    if on:
        got = query(s, f"max_over_time(scrape_duration_seconds[{int(t1 - t0)}s])")
        if not got:
            raise SystemExit(f"bench: Prometheus at {prometheus(s)} has no scrape_duration_seconds")
        out["scrape_s"] = {
            f"{r['metric'].get('job')}@{r['metric'].get('node', '?')}": float(r["value"][1]) for r in got
        }
    return out


def measure(s) -> None:
    """Monitoring on against off, interleaved; ends as it found monitoring (up or down)."""
    if not s.serving():
        s.sc("up", "--profile", PROFILE, timeout=900)
    was_up = bool(containers(s, "spark-head"))
    if not was_up:  # the agents' memory before any scrape: a process keeps what it grew to
        s.details["agent_rss_mb_never_scraped"] = {
            h: supervisor.rss_kb(s.tb, h, [supervisor.agent_pid(s.tb, h)]) / 1024 for h in s.hosts
        }
    s.tb.monitor_image()
    mon = at_interval(s, SCRAPE_S)
    mon("monitor", "up", timeout=600)
    s.details["mon_scrape_interval_s"] = SCRAPE_S
    reps = max(s.reps, MIN_REPS)
    try:
        for i in range(reps):
            got = {}
            for on in (False, True) if i % 2 == 0 else (True, False):
                switch(s, on)
                got[on] = window(s, on)
            rec(s, got[True], got[False])
            say(
                f"  #{i}: throughput on / off {s.last('mon_tput_ratio'):.3f} "
                f"({got[True]['tput']:.1f} / {got[False]['tput']:.1f} tok/s); longest scrape "
                f"{s.last('mon_scrape_s'):.3f}s; per node "
                + ", ".join(f"{h} +{c:.2f}% +{m:.1f} MB" for h, (c, m) in s.last("mon_node_cost").items())
            )
    finally:
        switch(s, True)
        if not was_up:
            s.sc("monitor", "down", timeout=300, check=False)
        else:  # as it was: the testbed inventory's interval
            s.sc("monitor", "up", timeout=600, check=False)
        Path(mon.inventory).unlink(missing_ok=True)


def at_interval(s, seconds: float) -> CLI:
    """The CLI through a copy of the testbed's inventory whose [monitor] scrapes every `seconds`."""
    text = Path(s.tb.inventory).read_text()
    text, n = re.subn(r"(?m)^scrape_interval_s = .*$", f"scrape_interval_s = {seconds:g}", text)
    if n != 1:
        raise SystemExit(f"bench: no single scrape_interval_s line in {s.tb.inventory}")
    # beside the testbed's own: its paths (ssh_config, keys) are relative to the inventory's folder;
    # measure() removes it
    inv = Path(s.tb.inventory).with_name(f".bench-scrape-{seconds:g}s-{s.workdir.name}.toml")
    inv.write_text(text)
    return CLI(s.tb, s.workdir, inventory=inv)


def rec(s, on: dict, off: dict) -> None:
    """One repetition's figures from its two windows."""
    cost = {}
    for h in off["nodes"]:
        a_on, a_off, ex = on["nodes"][h]["agent"], off["nodes"][h]["agent"], on["nodes"][h]["exporter"]
        cost[h] = (
            a_on["cpu_pct"] + ex["cpu_pct"] - a_off["cpu_pct"],
            a_on["rss_mb"] + ex["rss_mb"] - a_off["rss_mb"],
        )
    s.rec("mon_node_cost", cost)
    s.rec("mon_cpu_pct", max(c for c, _ in cost.values()))
    s.rec("mon_rss_mb", max(m for _, m in cost.values()))
    server = on["nodes"]["spark-head"].get("server", {"cpu_pct": 0.0, "rss_mb": 0.0})
    s.rec("mon_server_cpu_pct", server["cpu_pct"])
    s.rec("mon_server_rss_mb", server["rss_mb"])
    s.rec("mon_scrape_s", max(on["scrape_s"].values()))
    s.rec("mon_scrapes", on["scrape_s"])
    s.rec("mon_tput_on", on["tput"])
    s.rec("mon_tput_off", off["tput"])
    s.rec("mon_tput_ratio", on["tput"] / off["tput"])


def figures(R: dict) -> list[Figure]:
    if R.get("mon_error"):  # `make bench` went on without these: a row that says so, not met
        return [
            Figure(
                "mon_error", "monitoring: not measured (the bench's log says why)", "count", "measured", [0.0], False
            )
        ]
    if not R.get("mon_tput_ratio"):
        return []
    per_node = {h: [c[h] for c in R["mon_node_cost"]] for h in R["mon_node_cost"][0]}
    F = []
    for h, xs in per_node.items():
        cpu, rss = [c for c, _ in xs], [m for _, m in xs]
        F += [
            Figure(
                f"mon_cpu_{h}",
                f"metrics on {h} (agent's /metrics + node_exporter, scraped every {SCRAPE_S:g}s), serving: "
                "CPU more than without",
                "% of a core",
                f"< {CPU_BUDGET_PCT:g}",
                cpu,
                statistics.median(cpu) < CPU_BUDGET_PCT,
            ),
            Figure(
                f"mon_rss_{h}",
                f"metrics on {h}: memory (RSS) more than without",
                "MB",
                f"< {RSS_BUDGET_MB:g}",
                rss,
                statistics.median(rss) < RSS_BUDGET_MB,
            ),
        ]
    F += [
        info(
            "mon_server_cpu",
            "  ... Prometheus + Alertmanager on the head (not in the budget): CPU",
            "% of a core",
            R["mon_server_cpu_pct"],
        ),
        info(
            "mon_server_rss", "  ... Prometheus + Alertmanager on the head: memory (RSS)", "MB", R["mon_server_rss_mb"]
        ),
        Figure(
            "mon_scrape",
            "a scrape of every node: the longest scrape_duration_seconds of any target",
            "s",
            f"< {SCRAPE_BUDGET_S:g}",
            R["mon_scrape_s"],
            max(R["mon_scrape_s"]) < SCRAPE_BUDGET_S,
        ),
        Figure(
            "mon_throughput",
            "serving throughput, monitoring on / off (interleaved)",
            "ratio",
            f">= {THROUGHPUT_BUDGET:.2f}",
            R["mon_tput_ratio"],
            statistics.median(R["mon_tput_ratio"]) >= THROUGHPUT_BUDGET,
        ),
        info("mon_tput_on", "  ... throughput with monitoring on", "tok/s", R["mon_tput_on"]),
        info("mon_tput_off", "  ... throughput with monitoring off", "tok/s", R["mon_tput_off"]),
    ]
    return F


def main(argv: list[str] | None = None) -> int:
    return standalone(
        "monitoring",
        "Monitoring's budgets (issue 37): its cost on a serving node, scrape time, throughput on / off.",
        measure,
        figures,
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
