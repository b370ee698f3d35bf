"""A service as owners run them (issue 72 items 2 and 3), run by test_gateway on its pair's head: `testbed-keyed`, the keyed stand-in of
tests/testbed/images/Dockerfile.keyed-standin (busybox alone: an entrypoint of its own, no python3,
its voices from a mounted folder, its key from the file `API_KEY_FILE` names), beside the model the
head serves. Its `--dry-run` shows the steps and never the key; `up` makes its container from the
image as published (the entrypoint kept, the port appended as its command) and its supervisor beside
it, from the cluster's image, with the node's Docker socket. `docker inspect` of either shows the
key's file, never the key. Through the gateway, which sends the service its key, it answers the
mounted voice. With no controller connected (no sparkcluster command runs), a failing health check
is a verdict and its supervisor restarts its container; it answers again. `down --profile` removes
both containers and leaves the model serving.

Cost: the head's model is the pair's, serving already (`up` of it is then "nothing to do"); the image's build (busybox, once per testbed: seconds), the service's
start, the gateway's update and one restart (three failed looks at 2 s, then the 5 s backoff): under
1.5 min on a testbed already serving, not yet measured there; every wait is on a condition."""

from __future__ import annotations

import json

import httpx

from sparkcluster.labels import PROFILE_LABEL, ROLE_LABEL, SERVICE_ROLE
from tests.integration.helpers import HEAD, HEAD_LAN, listeners, ours, wait_for
from tests.testbed.artifacts import KEYED_IMAGE

SINGLE, HEAD_MODEL = "testbed-single", "testbed-tiny-single"
KEYED = "testbed-keyed"  # tests/testbed/profiles/testbed-keyed.toml
# slot 1 where the model alone holds slot 0 (the names are read back after `up`, whichever slot it got)
SUPERVISOR_C = f"sparkcluster-testbed-d1-service-{HEAD}"
SERVER_C = SUPERVISOR_C + "-server"  # the service's own container: its supervisor's name and "-server"
KEY = "sk-keyed-standin-7d1e5c93a0b24f68"  # the service's own key (not the engines', not a client's)
GW = f"http://{HEAD_LAN}:4000"
VOICES = "/tmp/sparkcluster-testbed-voices"  # the profile's bind source, on the head
VOICE = b"RIFF-keyed-stand-in-voice"  # what the mounted file holds (ASCII: written with printf on the head)


def speak(key: str) -> httpx.Response:
    body = {"model": "testbed-keyed", "input": "hello", "voice": "default"}
    return httpx.post(f"{GW}/v1/audio/speech", json=body, headers={"x-api-key": key}, timeout=30)


def supervisor_state(testbed) -> dict:
    out = testbed.sh(HEAD, f"docker exec {SUPERVISOR_C} cat /run/sparkcluster/supervisor.json", check=False).stdout
    return json.loads(out) if out.strip() else {}


def started_at(testbed) -> str:
    return testbed.sh(HEAD, f"docker inspect -f '{{{{.State.StartedAt}}}}' {SERVER_C}").stdout.strip()


def service_from_its_own_image(testbed, sc, env: dict, gw_key: str) -> None:
    """With the pair serving (its gateway's client key `gw_key`): the keyed service beside the head's
    model, then down again. Its secret comes from the environment, as load_secrets reads it. A failure
    takes the service down before it is reported, so the pair's later cases meet the head as they
    would have (a service left behind would ask every later `gateway up` for its key)."""
    env = {**env, "KEYED_STANDIN_KEY": KEY}
    try:
        _service_case(testbed, sc, env, gw_key)
    except BaseException:
        sc("down", "--profile", KEYED, env=env)
        raise


def _service_case(testbed, sc, env: dict, gw_key: str) -> None:
    assert testbed.keyed_image() == KEYED_IMAGE
    testbed.sh(HEAD, f"mkdir -p {VOICES} && printf '%s' '{VOICE.decode()}' > {VOICES}/default.wav")
    sc("down", "--profile", KEYED, env=env)  # an earlier run's, if any: its restarts start from none
    model = sc("up", "--profile", SINGLE, "--node", HEAD, env=env, timeout=900)  # reused when it serves
    if model.returncode != 0:  # another deployment holds the head (an earlier module's): the model alone
        sc("down", env=env)
        model = sc("up", "--profile", SINGLE, "--node", HEAD, env=env, timeout=900)
    assert model.returncode == 0, model.stdout + model.stderr

    # the dry run: its steps, the Docker socket said, the key nowhere (--json: each command whole)
    dry = sc("up", "--profile", KEYED, "--node", HEAD, "--beside", "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    steps = {s["id"].rsplit("/", 1)[1]: s for s in json.loads(dry.stdout)}
    assert {"create-server", "create-supervisor"} <= set(steps), list(steps)
    assert "/var/run/docker.sock" in json.dumps(steps["create-supervisor"])
    assert "API_KEY_FILE=/run/sparkcluster-secrets/KEYED_STANDIN_KEY" in json.dumps(steps["create-server"])
    assert KEY not in dry.stdout + dry.stderr
    plain = sc("up", "--profile", KEYED, "--node", HEAD, "--beside", "--dry-run", env=env)
    assert plain.returncode == 0 and KEY not in plain.stdout + plain.stderr and "docker.sock" in plain.stdout

    up = sc("up", "--profile", KEYED, "--node", HEAD, "--beside", env=env, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    global SUPERVISOR_C, SERVER_C  # noqa: PLW0603 (the slot `up` chose, for the helpers above)
    mine = f"--filter label={PROFILE_LABEL}={KEYED} --filter label={ROLE_LABEL}={SERVICE_ROLE}"
    SUPERVISOR_C = testbed.sh(HEAD, f"docker ps -a {mine} --format '{{{{.Names}}}}'").stdout.strip()
    SERVER_C = SUPERVISOR_C + "-server"
    assert KEY not in up.stdout + up.stderr
    assert {SUPERVISOR_C, SERVER_C} <= set(ours(testbed, HEAD)) and listeners(testbed, HEAD, 8766)

    # the image as published: its entrypoint kept, the port its command; no python3 in it
    server = json.loads(testbed.sh(HEAD, f"docker inspect {SERVER_C}").stdout)[0]
    image = json.loads(testbed.sh(HEAD, f"docker image inspect {KEYED_IMAGE}").stdout)[0]
    assert server["Config"]["Entrypoint"] == image["Config"]["Entrypoint"] and server["Config"]["Cmd"] == ["8766"]
    assert testbed.sh(HEAD, f"docker exec {SERVER_C} sh -c 'command -v python3'", check=False).returncode != 0
    mounts = {m["Destination"]: m for m in server["Mounts"]}
    assert mounts["/voices"]["Source"] == VOICES and mounts["/voices"]["RW"] is False
    # the key: a file in its container, its path in API_KEY_FILE; in no inspect, label, argv or env
    assert "API_KEY_FILE=/run/sparkcluster-secrets/KEYED_STANDIN_KEY" in server["Config"]["Env"]
    for c in (SERVER_C, SUPERVISOR_C):
        assert KEY not in testbed.sh(HEAD, f"docker inspect {c}").stdout
    assert KEY not in testbed.sh(HEAD, "ps -eo args").stdout
    # the supervisor: the cluster's image, the Docker socket, the agent; the service's own has none of it
    sup = json.loads(testbed.sh(HEAD, f"docker inspect {SUPERVISOR_C}").stdout)[0]
    assert {("/var/run/docker.sock", "/run/docker.sock")} <= {(m["Source"], m["Destination"]) for m in sup["Mounts"]}
    assert sup["Config"]["Image"] != KEYED_IMAGE and sup["Config"]["Cmd"][0] == "python3"

    # through the gateway, which sends the service its own key: the mounted voice
    gw = sc("gateway", "up", env=env, timeout=300)
    assert gw.returncode == 0, gw.stdout + gw.stderr
    said = speak(gw_key)
    assert said.status_code == 200 and said.content == VOICE, (said.status_code, said.content[:80])
    # the service refuses a request without its key: the gateway's is what let the one above in
    direct = httpx.post(f"http://{HEAD_LAN}:8766/v1/audio/speech", json={"input": "hi"}, timeout=10)
    assert direct.status_code == 401, direct.text

    # no controller connected from here: its health fails (the stand-in's fault file, which its
    # entrypoint removes at the next start); its supervisor stops and starts the container
    before = started_at(testbed)
    testbed.sh(HEAD, f"docker exec {SERVER_C} touch /tmp/keyed-standin-unhealthy")
    assert wait_for(lambda: (supervisor_state(testbed).get("causes") or [{}])[-1].get("kind") == "unhealthy", 60, 0.5)

    # (the state file says "serving" with a "stopping" beside it while Docker stops the container:
    # the restart is done when it serves again with the restart recorded)
    def served_again() -> bool:
        st = supervisor_state(testbed)
        return st.get("state") == "serving" and not st.get("stopping") and bool(st.get("restarts"))

    assert wait_for(served_again, 60, 0.5), supervisor_state(testbed)
    assert len(supervisor_state(testbed)["restarts"]) == 1 and started_at(testbed) != before
    assert wait_for(lambda: speak(gw_key).status_code == 200, 30, 0.5)
    ev = sc("events", "--node", HEAD, "--profile", KEYED, "--json", env=env)
    assert ev.returncode == 0 and "service started" in ev.stdout and "service stopped" in ev.stdout, ev.stdout

    # down of the service: both containers go, the model stays
    down = sc("down", "--profile", KEYED, env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    left = ours(testbed, HEAD)
    assert SUPERVISOR_C not in left and SERVER_C not in left and not listeners(testbed, HEAD, 8766)
    st = json.loads(sc("status", "--all", "--json", env=env).stdout)
    names = [d["deployment"] for d in st["deployments"]]
    assert f"{SINGLE}@{HEAD}" in names and f"{KEYED}@{HEAD}" not in names, st
