"""Monitoring on the testbed (issue 37): `sparkcluster monitor up` starts Prometheus and Alertmanager
on the head and node_exporter on both hosts from the testbed's monitoring image (Debian's packages,
tests/testbed/images/Dockerfile.monitor, named in the testbed inventory's [monitor]); one serving
cluster (the real vLLM CPU engine, TP=2 over Ray) walks through, in order:

- every target healthy: each node's agent, each node_exporter, the engine's /metrics;
- the dashboards' queries against this Prometheus: each returns data, except those whose source the
  testbed lacks (NVML power, clock and temperature; RDMA port counters; speculative decoding);
- the full-screen `status --watch` (an SVG), kept under SPARKCLUSTER_ARTIFACTS, else the testbed's
  folder's artifacts/, for README;
- rank 1's worker stopped (SIGSTOP) under load: /health stays 200 while `status` names the wedge;
  SparkEngineWedged reaches the owner's webhook (a receiver on the controller's side of the head's
  LAN link: the testbed's own address) within the profile's stall bound plus a scrape interval and
  the supervisor's probe bound; the supervisor's verdict is "wedged" and it restarts the engine (one
  restart more), which serves again, `status` healthy; the alert shows in `events` (this is also the
  supervisor's wedge case: test_supervisor, next in the serving tail, goes on from its restart);
- the worker's control link pulled: SparkNodeUnreachable for the worker;
- a planned `down`: no alert fires (silenced while it runs, and nothing it leaves is an alert);
- `monitor down` removes the containers and keeps the data volumes.

Needs: Debian's prometheus, prometheus-alertmanager and prometheus-node-exporter packages
downloadable on this machine (tests/testbed/artifacts.py, monitor_debs), as debootstrap's are.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from sparkcluster.config.profile import load_profile
from sparkcluster.monitor import dashboards
from tests.integration import helpers
from tests.integration.helpers import BASE, HEAD, WORKER, journal, sup_state
from tests.testbed.testbed import SPECS

# `make test` keeps the targets scraped healthy and the wedge alert at the webhook (issue 57); the rest is
# `make test-long`'s (tests/README.md)
pytestmark = pytest.mark.testbed
SCRAPE_S = 2.0  # the testbed inventory's [monitor] scrape_interval_s
PROM = ""  # Prometheus on the head's control IP (from the testbed inventory: `monitored`)
TB = None  # the testbed: Prometheus listens on the cluster's own addresses only, so it is asked from the head


def get_json(url: str):
    """GET on the head (curl in its namespaces): the controller has no route to the control network,
    as an owner's laptop has none to the QSFP link."""
    got = TB.sh(HEAD, "curl -sS --fail -m 10 " + shlex.quote(url), timeout=30)
    return json.loads(got.stdout)


# sources the testbed does not have: no NVML (CPU engine), no HCA counters, no draft model, and no
# NCCL transport (gloo carries the testbed's fabric test: its record has busbw, not a transport)
ABSENT_HERE = ("sparkcluster_gpu_", "node_infiniband_", "spec_decode_", "sparkcluster_fabric_transport_info")


class Receiver:
    """The owner's webhook: every Alertmanager notification, as it arrives."""

    def __init__(self, address: str):
        got: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                got.append({"at": time.time(), **json.loads(self.rfile.read(int(self.headers["Content-Length"])))})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.got = got
        self.httpd = ThreadingHTTPServer((address, 0), Handler)
        self.url = f"http://{address}:{self.httpd.server_port}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def firing(self, since: float, name: str | None = None) -> list[tuple[float, dict]]:
        return [
            (n["at"], a)
            for n in self.got
            if n["at"] >= since
            for a in n["alerts"]
            if a["status"] == "firing" and (name is None or a["labels"]["alertname"] == name)
        ]


def query(expr: str) -> list[dict]:
    url = f"{PROM}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    doc = get_json(url)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def targets() -> list[dict]:
    return get_json(f"{PROM}/api/v1/targets")["data"]["activeTargets"]


@pytest.fixture(scope="module")
def receiver(testbed):
    return Receiver(SPECS[HEAD].ctl_ip)


@pytest.fixture(scope="module")
def monitored(testbed, sc, receiver):
    global PROM, TB
    from sparkcluster.config import inventory

    PROM = f"http://{inventory.load(testbed.inventory).head.control_ip}:9090"
    TB = testbed
    testbed.monitor_image()
    helpers.up_unless_serving(testbed, sc)
    res = sc("monitor", "up", env={"ALERT_WEBHOOK_URL": receiver.url}, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert receiver.url not in res.stdout + res.stderr
    yield
    sc("monitor", "down", timeout=300)


def test_every_target_is_scraped_healthy(testbed, sc, monitored):
    def healthy():
        ts = targets()
        jobs = sorted((t["labels"]["job"], t["labels"]["node"]) for t in ts if t["health"] == "up")
        return jobs if len(jobs) == len(ts) == 5 else None

    got = helpers.wait_for(healthy, 60, step=1.0)
    assert got == [
        ("node-exporter", HEAD),
        ("node-exporter", WORKER),
        ("sparkcluster-node", HEAD),
        ("sparkcluster-node", WORKER),
        ("vllm", HEAD),
    ], [(t["labels"], t["health"], t.get("lastError")) for t in targets()]
    assert {r["metric"]["node"] for r in query("sparkcluster_node_mem_available_bytes")} == {HEAD, WORKER}
    assert query('sparkcluster_supervisor_state{state="serving"} == 1')
    # `monitor status` (issue 56) reads the same through the head's SSH connection
    res = sc("monitor", "status", "--json", timeout=120)
    body = json.loads(res.stdout)
    assert sorted((t["job"], t["health"]) for t in body["targets"]).count(("vllm", "up")) == 1, body
    assert len(body["targets"]) == 5 and body["prometheus"].startswith("http://"), body
    assert res.returncode == (1 if body["firing"] else 0), res.stdout + res.stderr


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_the_dashboards_queries_return_data_where_the_testbed_has_the_source(testbed, monitored):
    stop = threading.Event()
    helpers.load(stop)
    try:
        # a rate and a quantile need scrapes of traffic in their window (1 m here)
        assert helpers.wait_for(
            lambda: query("vllm:time_to_first_token_seconds_count > 0 and rate(vllm:generation_tokens_total[1m]) > 0"),
            60,
            step=1.0,
        )
        empty, absent = [], []
        for d in (dashboards.serving(), dashboards.cluster()):
            for where, expr in dashboards.queries(d):
                if where.startswith("annotation"):
                    continue  # restarts: none happened
                e = (
                    expr.replace("$__rate_interval", "1m")
                    .replace("$cluster", "testbed")
                    .replace("$deployment", ".*")
                    .replace("$node", ".*")
                )
                has = bool(query(e))
                if any(a in expr for a in ABSENT_HERE):
                    absent.append((d["uid"], where, has))
                elif not has:
                    empty.append((d["uid"], where, e))
    finally:
        stop.set()
    assert not empty, empty
    print("queries without a source here:", absent)


def artifacts(testbed) -> Path:
    d = Path(os.environ.get("SPARKCLUSTER_ARTIFACTS") or testbed.dir / "artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_the_live_view_renders_the_testbeds_status(testbed, monitored):
    import asyncio

    from sparkcluster.config import inventory
    from sparkcluster.status import live
    from sparkcluster.status import status as status_mod

    inv = inventory.load(testbed.inventory)

    async def drive() -> str:
        app = live.LiveView(lambda: status_mod.collect_all(inv, helpers.API_KEY), interval=1.0)
        async with app.run_test(size=(140, 40)) as pilot:
            for _ in range(200):
                await pilot.pause(0.1)
                if app.refreshes >= 3:
                    break
            assert app.refreshes >= 3
            return app.export_screenshot()

    svg = asyncio.run(drive())
    assert "spark-head" in svg and "spark-worker" in svg
    (artifacts(testbed) / "status-watch.svg").write_text(svg)


def test_a_stopped_rank_fires_the_wedge_alert_to_the_webhook(testbed, sc, monitored, receiver):
    """A rank stopped under load: the wedge alert at the webhook. Before it, a captured real Xid line
    written in the worker's kernel-log stand-in (issue 75: tests/captured/kernel/xid79-nvsentinel-155.dmesg)
    shows in `events` (the head journals every node's kernel events), fires SparkGpuXid at the webhook,
    and is named in the wedge verdict's cause, on this one wedge and this one `monitor up`."""
    prof = load_profile("testbed").supervisor
    pids = testbed.sh(WORKER, "pgrep -f 'RayWorkerProc' || true").stdout.split()
    assert pids
    t_xid = time.time()
    testbed.kernel_captured(WORKER, "xid79-nvsentinel-155.dmesg")

    def xid_journalled():
        return [
            e for e in journal(testbed) if e["event"] == "kernel event" and e["ts"] > t_xid and e.get("node") == WORKER
        ]

    xid = helpers.wait_for(xid_journalled, 30, step=1.0)
    assert xid and xid[0]["code"] == "79", journal(testbed)[-8:]
    assert xid[0]["meaning"] == "the GPU has fallen off the bus"
    stop = threading.Event()
    helpers.load(stop)
    assert helpers.wait_for(lambda: query("vllm:num_requests_running > 0"), 30, step=0.5)
    restarts = len(sup_state(testbed).get("restarts") or [])
    t = time.time()
    try:
        testbed.sh(WORKER, "kill -STOP " + " ".join(pids))
        # what vLLM says (/health does no round trip to the engine), and what `status` says: its own
        # probe's bound (10 s) is below the supervisor's (15 s), so it names the wedge first
        assert httpx.get(BASE + "/health", timeout=5).status_code == 200
        st = sc("status", "--json")
        doc = json.loads(st.stdout)
        assert st.returncode != 0 and doc["state"] == "degraded", doc
        assert any(p.startswith("engine wedged: /health is 200 but") for p in doc["problems"]), doc["problems"]
        # the stall clock's bound, or the probe's (whichever the supervisor reaches first), a scrape,
        # and the rules' evaluation at that scrape; Alertmanager sends a page without waiting
        bound = max(prof.stall_s, prof.probe_interval_s + 2 * prof.probe_timeout_s) + SCRAPE_S
        got = helpers.wait_for(lambda: receiver.firing(t, "SparkEngineWedged"), bound + 15, step=0.5)
        assert got, (receiver.got, journal(testbed)[-8:])
        took = got[0][0] - t
        print(f"SIGSTOP to the webhook: {took:.1f}s (bound {bound:.0f}s + 15 s slack)")
        assert got[0][1]["labels"]["node"] == HEAD and got[0][1]["labels"]["severity"] == "page"
        verdicts = helpers.wait_for(
            lambda: [e for e in journal(testbed) if e["event"] == "verdict" and e["ts"] > t], 30
        )
        assert verdicts, journal(testbed)[-12:]
        assert verdicts[0]["kind"] == "wedged", verdicts
        # the stopped rank stops every progress series and the probes: whichever bound comes first
        assert (
            "one-token completion did not return within 15s" in verdicts[0]["cause"]
            or "no progress of any kind" in verdicts[0]["cause"]
        ), verdicts
        assert f"the kernel reported {WORKER}: Xid 79 (the GPU has fallen off the bus)" in verdicts[0]["cause"]
    finally:
        testbed.sh(WORKER, "kill -CONT " + " ".join(pids) + " 2>/dev/null || true", check=False)
        stop.set()
    paged = helpers.wait_for(lambda: receiver.firing(t_xid, "SparkGpuXid"), 30, step=0.5)
    assert paged, receiver.got[-3:]
    assert paged[0][1]["labels"]["node"] == WORKER and paged[0][1]["labels"]["code"] == "79"
    helpers.serving_again(testbed, t, 240)
    # restarted by the supervisor (one restart more, in its window), healthy again by `status`
    assert len(sup_state(testbed)["restarts"]) == restarts + 1
    st = sc("status", "--json")
    doc = json.loads(st.stdout)
    assert st.returncode == 0 and doc["state"] == "healthy" and doc["supervisor"]["state"] == "serving", doc["problems"]
    events = sc("events", "--last", "200")  # back to the Xid, before the verdict and the restart's entries
    assert "alert SparkEngineWedged" in events.stdout, events.stdout + events.stderr
    assert "kernel event" in events.stdout and "code=79" in events.stdout, events.stdout


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_a_worker_whose_link_goes_down_is_unreachable(testbed, monitored, receiver):
    """The worker's control link pulled: Prometheus on the head scrapes over the cluster's own
    addresses, so that cable (not the LAN's, which only the controller uses) is what makes a node
    unreachable to it."""
    t = time.time()
    link = testbed.worker_netdevs()[1]  # the far end of the head's enp1s0f1np1: the control network
    testbed.link_down(WORKER, link)
    try:
        got = helpers.wait_for(lambda: receiver.firing(t, "SparkNodeUnreachable"), 30 + 4 * SCRAPE_S + 20, step=0.5)
        assert got and {a["labels"]["node"] for _, a in got} == {WORKER}, receiver.got[-3:]
    finally:
        testbed.link_up(WORKER, link)
    # serving once the cable is back: a restart if the outage broke the ranks (a request in flight,
    # Ray's health checks), none where it did not (idle ranks exchange nothing: seen 2026-11-27, the
    # engine answered through a 35 s outage with no verdict), so no new serving state is asked for
    assert helpers.wait_for(
        lambda: helpers.sup_state(testbed).get("state") == "serving" and helpers.answers(helpers.BASE, "testbed-tiny"),
        300,
        step=2.0,
    ), helpers.journal(testbed)[-12:]


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_a_planned_down_fires_nothing(testbed, sc, monitored, receiver):
    # the wedge verdict of the test before keeps its alert two minutes, the engine's restart a little
    # longer; the two restarts the cases before caused (the stopped rank, and the pulled cable where
    # the outage broke the ranks) rightly keep SparkRestartLoop firing for the restart window (an hour):
    # the `down` silences it with the rest of the head, so it must not be notified again either
    # (SparkGpuXid too: the wedge case's Xid keeps it firing for its five minutes, notified before
    # and silenced by the `down` with the rest)
    def quiet():
        keep = ("SparkRestartLoop", "SparkGpuXid")
        return not [a for a in query("ALERTS{alertstate='firing'}") if a["metric"]["alertname"] not in keep]

    assert helpers.wait_for(quiet, 300, step=2.0), query("ALERTS{alertstate='firing'}")
    t = time.time()
    res = sc("down", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    time.sleep(30 + 5 * SCRAPE_S)  # the longest `for` of the rules, and some evaluations
    assert receiver.firing(t) == [], receiver.firing(t)
    silences = get_json(PROM.replace(":9090", ":9093") + "/api/v2/silences")
    assert any(s["comment"] == "sparkcluster down" and s["createdBy"] == "sparkcluster" for s in silences), silences
    res = sc("up", "--profile", "testbed", timeout=900)  # the next tests find it serving
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_monitor_down_keeps_the_data(testbed, sc, monitored):
    res = sc("monitor", "down", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sparkcluster-testbed-prometheus" in res.stdout
    vols = testbed.docker(HEAD, "volume ls --format '{{.Name}}'").stdout.split()
    assert "sparkcluster-testbed-prometheus-data" in vols and "sparkcluster-testbed-alertmanager-data" in vols
    for h in (HEAD, WORKER):
        assert not [n for n in testbed.docker(h, "ps -a --format '{{.Names}}'").stdout.split() if "node-exporter" in n]
