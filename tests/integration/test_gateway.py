"""One endpoint for two deployments on the testbed, with the real engine (issue 36): `testbed-single`
on the head and a variant of it serving another name (and an alias) on the worker, behind one
gateway on the head. Both answer through it by chat, completions and `/v1/messages`, streaming;
a wrong key gets 401; keys never reach argv, `docker inspect` or `--dry-run`; `down --node` leaves the
gateway routing the rest; `down` removes it with everything else. The worker's engine stopped
(SIGSTOP), its model answered 503 with Retry-After once the supervisor's verdict says so while the
head's keeps answering, and back in rotation once the supervisor serves it again: the console's case
on the same pair, whose wedge it is (console_case.py).

The only door (item 2, its own test): with the inventory's engines_listen = "control" the engine
listens on the head's control address only; the laptop cannot reach it at the head's address, the
gateway can; `status`, `bench` and a second `up` still work (through the head's SSH connection).

On demand (item 4, its own test): a variant on the worker left on standby by `up`; with the
worker's MemAvailable stood in low (the testbed's meminfo stand-in) its start is refused for memory,
naming what holds it, no engine starts, and the request that woke it is held by the gateway; with
memory back, that request and concurrent others start it once and are answered through the gateway,
and after its idle TTL it is stopped again (container kept).

On the same pair and gateway, before the one endpoint: team keys (named keys, their limits and the usage
ledger: tests/integration/gateway_keys.py), a service from its own image beside the head's model
(service_image.py) and the web console in Chromium (console_case.py). One shared cluster for the four
cases (two engine starts and the worker's restart after the console's wedge); every wait is on a
condition.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests import console_browser
from tests.integration import console_case, gateway_keys, service_image
from tests.integration.helpers import (
    API_KEY,
    HEAD,
    HEAD_C,
    HEAD_LAN,
    LAN_BASE,
    WORKER,
    inventory_variant,
    listeners,
    ours,
    popen_sc,
    wait_for,
)
from tests.testbed import PROFILES as TESTBED_PROFILES

# `make test` keeps one endpoint for two one-node deployments (issue 57); on demand and the only door are
# `make test-long`'s (tests/README.md)
pytestmark = pytest.mark.testbed
SINGLE = "testbed-single"
VARIANT = "testbed-single-vision"  # testbed-single under another served name, with an alias
ON_DEMAND = "testbed-single-od"  # testbed-single under another served name, on demand
OD_MODEL, OD_TTL_S = "testbed-tiny-od", 20
HEAD_MODEL, WORKER_MODEL, ALIAS = "testbed-tiny-single", "testbed-tiny-vision", "vision"
GW_KEY, GW_KEY2 = "gw-testbed-key-7d3a9e01", "gw-second-key-55b2c7e4"
GW = f"http://{HEAD_LAN}:4000"  # the head's address, as the laptop reaches it
GW_CONTAINER = "sparkcluster-testbed-gateway"


def chat(model: str, key: str = GW_KEY, stream: bool = False, **kw) -> httpx.Response:
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    kw.setdefault("timeout", 60)
    return httpx.post(f"{GW}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, **kw)


def routes() -> dict:
    r = httpx.get(f"{GW}/gateway/status", headers={"x-api-key": GW_KEY}, timeout=5)
    return {x["deployment"]: x for x in r.json()["routes"]}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The variant profile in a profiles folder of its own, and the gateway's keys."""

    folder = tmp_path_factory.mktemp("profiles")
    text = (TESTBED_PROFILES / f"{SINGLE}.toml").read_text()
    text = text.replace(f'served_name = "{HEAD_MODEL}"', f'served_name = "{WORKER_MODEL}"\naliases = ["{ALIAS}"]')
    (folder / f"{VARIANT}.toml").write_text(text)
    od = (TESTBED_PROFILES / f"{SINGLE}.toml").read_text()
    od = od.replace(f'served_name = "{HEAD_MODEL}"', f'served_name = "{OD_MODEL}"')
    (folder / f"{ON_DEMAND}.toml").write_text(od + f"\n[on_demand]\nenabled = true\nidle_ttl_s = {OD_TTL_S}\n")
    return {"SPARKCLUSTER_PROFILES": str(folder), "GATEWAY_API_KEYS": f"{GW_KEY},{GW_KEY2}"}


@pytest.fixture(scope="module")
def pair(testbed, sc, env_file, env):
    """The two one-node deployments, started side by side (each `up` locks its own node), shared by this
    module's cases: team keys first, then the one endpoint, which ends with `down`."""
    sc("down", env=env)
    procs = {
        HEAD: popen_sc(testbed, sc, env_file, "up", "--profile", SINGLE, "--node", HEAD, env=env),
        WORKER: popen_sc(testbed, sc, env_file, "up", "--profile", VARIANT, "--node", WORKER, env=env),
    }
    for node, p in procs.items():
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, f"{node}: {out}{err}"
    yield
    sc("down", env=env)


def test_named_keys_limits_and_usage(testbed, sc, env, pair):
    """Team keys on the pair's gateway (tests/integration/gateway_keys.py): limits, models, usage, revocation."""
    gateway_keys.named_keys_limits_and_usage(testbed, sc, env, HEAD_MODEL, WORKER_MODEL)


def test_a_service_from_an_image_without_python3_answers_through_the_gateway_and_is_restarted_alone(
    testbed, sc, env, pair
):
    """A service from its own image beside the pair's head model (tests/integration/service_image.py)."""
    service_image.service_from_its_own_image(testbed, sc, env, GW_KEY)


@pytest.mark.skipif(console_browser.missing() is not None, reason=console_browser.missing() or "")
def test_the_console_on_the_testbed(testbed, sc, env, pair):
    """The web console in Chromium on the pair (tests/integration/console_case.py)."""
    console_case.console_on_the_pair(testbed, sc, env)


def test_one_endpoint_for_two_deployments(testbed, sc, env, pair):
    sc("gateway", "down", env=env)  # from no gateway: the earlier cases' is not this one's plan to make
    # the plan names both routes and shows no key
    dry = sc("gateway", "up", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"gateway/{HEAD}/create" in dry.stdout and WORKER_MODEL in dry.stdout and ALIAS in dry.stdout
    for secret in (GW_KEY, GW_KEY2, API_KEY):
        assert secret not in dry.stdout + dry.stderr
    up = sc("gateway", "up", env=env, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stdout.count("in rotation") == 2, up.stdout
    # the keys are in the 0600 config inside the container only: not in argv, labels or environment
    inspect = testbed.sh(HEAD, f"docker inspect {GW_CONTAINER}").stdout
    ps = testbed.sh(HEAD, "ps -eo args").stdout
    for secret in (GW_KEY, GW_KEY2, API_KEY):
        assert secret not in inspect and secret not in ps and secret not in up.stdout + up.stderr

    # both models through one endpoint: chat, completions, Anthropic's messages, streaming
    for model in (HEAD_MODEL, WORKER_MODEL, ALIAS):
        r = chat(model)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, (model, r.text)
    r = httpx.post(
        f"{GW}/v1/completions",
        json={"model": WORKER_MODEL, "prompt": "hi", "max_tokens": 2},
        headers={"x-api-key": GW_KEY2},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{GW}/v1/messages",
        json={"model": HEAD_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": GW_KEY, "anthropic-version": "2023-06-01"},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["type"] == "message", r.text
    with httpx.stream(
        "POST",
        f"{GW}/v1/chat/completions",
        json={"model": WORKER_MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {GW_KEY}"},
        timeout=60,
    ) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        events = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3, events
    assert chat(HEAD_MODEL, key="wrong").status_code == 401
    missing = chat("no-such-model")
    assert missing.status_code == 404 and HEAD_MODEL in missing.text and WORKER_MODEL in missing.text
    models = httpx.get(f"{GW}/v1/models", headers={"x-api-key": GW_KEY}, timeout=10).json()["data"]
    assert {m["id"] for m in models} == {HEAD_MODEL, WORKER_MODEL, ALIAS}
    # the gateway's metrics take a key (a peer on the LAN reads nothing); labels only for served models
    assert httpx.get(f"{GW}/metrics", timeout=5).status_code == 401
    metrics = httpx.get(f"{GW}/metrics", headers={"x-api-key": GW_KEY}, timeout=5).text
    assert f'sparkcluster_gateway_request_seconds_count{{model="{WORKER_MODEL}"}}' in metrics
    assert 'model="no-such-model"' not in metrics
    st = sc("status", "--all", env=env)
    line = f"gateway: {GW_CONTAINER} on {HEAD} port 4000: running  models: {HEAD_MODEL}, {WORKER_MODEL}, {ALIAS}"
    assert line in st.stdout, st.stdout
    gst = sc("gateway", "status", env=env)
    assert gst.returncode == 0 and gst.stdout.count("in rotation") == 2, gst.stdout + gst.stderr
    assert f"clients use: {GW}/v1 " in gst.stdout, gst.stdout  # the URL a client is given (issue 56)
    export = sc("gateway", "export", "--litellm", env=env)
    assert export.returncode == 0 and f'"openai/{ALIAS}"' in export.stdout and API_KEY not in export.stdout

    # one deployment down: the gateway stays and routes the other; down removes it with the rest
    res = sc("down", "--node", WORKER, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert GW_CONTAINER in ours(testbed, HEAD) and ours(testbed, WORKER) == []
    assert chat(HEAD_MODEL).status_code == 200
    gone = wait_for(lambda: chat(WORKER_MODEL).status_code == 503, 30, step=0.5)
    assert gone, chat(WORKER_MODEL).text
    res = sc("down", env=env)
    assert res.returncode == 0 and ours(testbed, HEAD) == [], res.stdout + res.stderr
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{GW}/health", timeout=3)


def _engine_pids(testbed, host: str) -> list[str]:
    return testbed.sh(host, "pgrep -f 'VLLM::[E]ngineCore' || true").stdout.split()


def _od_journal(testbed) -> list[dict]:
    """The on-demand deployment's supervisor journal (its head container on the worker)."""
    out = testbed.sh(WORKER, f"docker exec {HEAD_C} cat /var/log/sparkcluster/journal.jsonl", check=False).stdout
    return [json.loads(x) for x in out.splitlines() if x.strip()]


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_on_demand_standby_started_once_admitted_and_stopped_when_idle(testbed, sc, env_file, env):
    import concurrent.futures

    sc("down", env=env)
    procs = {
        HEAD: popen_sc(testbed, sc, env_file, "up", "--profile", SINGLE, "--node", HEAD, env=env),
        WORKER: popen_sc(testbed, sc, env_file, "up", "--profile", ON_DEMAND, "--node", WORKER, env=env),
    }
    for node, p in procs.items():
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, f"{node}: {out}{err}"
        if node == WORKER:
            assert "on standby" in out, out
    od_key = f"{ON_DEMAND}@{WORKER}"
    try:
        # up left it on standby: containers in place, no engine, healthy
        assert ours(testbed, WORKER) and _engine_pids(testbed, WORKER) == []
        st = sc("status", "--all", env=env)
        assert st.returncode == 0, st.stdout + st.stderr
        up = sc("gateway", "up", env=env, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "on demand: a request wakes it" in up.stdout and routes()[od_key]["on_demand"], up.stdout
        token = testbed.sh(WORKER, f"docker exec {HEAD_C} cat /etc/sparkcluster/wake-token").stdout.strip()
        assert token and token not in up.stdout + up.stderr
        assert token not in testbed.sh(HEAD, f"docker inspect {GW_CONTAINER}").stdout
        assert token not in testbed.sh(HEAD, "ps -eo args").stdout

        # admission: the worker's MemAvailable stood in below the engine's share plus the floor
        meminfo = testbed.sh(WORKER, f"docker exec {HEAD_C} cat /proc/meminfo").stdout
        total_kib = int(next(x for x in meminfo.splitlines() if x.startswith("MemTotal:")).split()[1])
        need_kib = int(0.2 * total_kib)  # testbed-single's gpu_memory_utilization
        testbed.set_meminfo(WORKER, HEAD_C, need_kib)  # the engine's share, without the 6 GiB floor
        pool = concurrent.futures.ThreadPoolExecutor(8)
        try:
            # the first request is held by the gateway while the start is refused (its wakes repeated)
            first = pool.submit(chat, OD_MODEL, timeout=600)
            assert wait_for(lambda: "refused" in routes()[od_key]["reason"], 30, step=0.5), routes()
            said = routes()[od_key]["reason"]
            assert f"its last start was refused: {WORKER}: MemAvailable" in said and "GiB short" in said, said
            assert "held by" in said, said
            assert _engine_pids(testbed, WORKER) == [] and not first.done()
            st = sc("status", "--all", env=env)
            assert st.returncode == 1 and "its last start was refused" in st.stdout, st.stdout
        finally:
            testbed.set_meminfo(WORKER, HEAD_C, None)

        # memory back: the held request and concurrent others, one start, each answered through the gateway
        started = time.time()
        with pool:
            codes = [first.result().status_code, *pool.map(lambda _: chat(OD_MODEL, timeout=600).status_code, range(8))]
        assert codes == [200] * 9, codes
        assert wait_for(lambda: routes()[od_key]["in_rotation"], 300, step=1), routes()
        took = time.time() - started
        r = chat(OD_MODEL)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
        events = [e["event"] for e in _od_journal(testbed) if e["ts"] >= started - 1]
        assert events.count("vllm serve started") == 1 and events.count("woken on demand") == 1, events
        assert chat(HEAD_MODEL).status_code == 200  # the other deployment was never touched

        # idle: stopped after its TTL, back on standby, the container kept; a request wakes it again
        assert wait_for(lambda: "on standby" in routes()[od_key]["reason"], OD_TTL_S + 60, step=1), routes()
        assert wait_for(lambda: _engine_pids(testbed, WORKER) == [], 60, step=1)
        assert ours(testbed, WORKER) and "idle: stopped after TTL" in [e["event"] for e in _od_journal(testbed)]
        print(json.dumps({"on_demand_start_s": round(took, 1)}))
    finally:
        res = sc("down", env=env)
        assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_the_gateway_as_the_only_door(testbed, sc, env, tmp_path):
    import tomllib

    inv = inventory_variant(
        testbed,
        tmp_path,
        lambda t: t.replace('name = "testbed"\n', 'name = "testbed"\nengines_listen = "control"\n', 1),
    )
    ctl = next(n["control_ip"] for n in tomllib.loads(inv.read_text())["nodes"] if n["name"] == HEAD)
    sc("down", env=env)
    try:
        res = sc("up", "--profile", SINGLE, "--node", HEAD, inventory=inv, env=env, timeout=900)
        assert res.returncode == 0 and "door:" in res.stdout, res.stdout + res.stderr
        held = listeners(testbed, HEAD, 8000)
        assert f"{ctl}:8000" in held and "0.0.0.0:8000" not in held and "*:8000" not in held, held
        with pytest.raises(httpx.HTTPError):  # the head's own address: nothing listens there
            httpx.get(f"{LAN_BASE}/health", timeout=3)
        st = sc("status", "--all", inventory=inv, env=env)
        assert st.returncode == 0 and "healthy" in st.stdout, st.stdout + st.stderr
        again = sc("up", "--profile", SINGLE, "--node", HEAD, inventory=inv, env=env)
        assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
        b = sc(
            "bench",
            "--concurrency",
            "1",
            "--num-prompts",
            "2",
            "--input-len",
            "16",
            "--output-len",
            "4",
            inventory=inv,
            env=env,
            timeout=600,
        )
        assert b.returncode == 0, b.stdout + b.stderr
        up = sc("gateway", "up", inventory=inv, env=env, timeout=300)
        assert up.returncode == 0 and "in rotation" in up.stdout, up.stdout + up.stderr
        r = chat(HEAD_MODEL)  # the door: the gateway on the head's address
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    finally:
        res = sc("down", inventory=inv, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
