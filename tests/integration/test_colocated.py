"""Two models and a service on one node (issue 60), with the real engine: `testbed-single` on the
head, then a variant of it under another served name started beside it (`up --beside`) in a slot of
its own: its own containers (`sparkcluster-testbed-d1-head`), its own API port (8010) and agent
(8307); then a service beside both (item 2: `testbed-audio`, the audio stand-in of
tests/testbed/images/Dockerfile.audio-standin: espeak-ng and pocketsphinx behind OpenAI's audio
routes) in slot 2 (its agent on 8317), on its own port (8765). All three answer behind the one
gateway, the service by its routes (speech, then the speech transcribed); `status --all` lists each;
a third model, asking more of the node's memory than is left beside them, is refused naming each
holder and what it holds, and nothing of it starts; `events --profile` reads each one's own journal;
the second model's engine killed is taken out of rotation by its supervisor's verdict while the first
model and the service stay in it and answer;
`down --profile` of the second model leaves the first and the service serving, their containers and
routes, and `down --profile` of the service leaves the first model. The first model's `up` and a
restart of its container by Docker are also the container contract's one-node cases
(tests/integration/contract_case.py).

The head is made to read as a 128 GB Spark (Testbed.set_memory, the meminfo stand-in at the OS
boundary): the admission's sums are then those of a Spark (0.2 x 128 GB = 25.6 GB each), not of the
testbed's small machine, and doctor's headroom check, which reads MemAvailable, leaves the refusal
to the admission. testbed-single runs without Ray (TP=1 on one node), so a later slot's Ray ports
are the unit tests' (tests/unit/test_colocated.py), not this test's.

Two engine starts, one after the other (both on the head: each `up` locks the node), and a service
start (the audio image built once per testbed); every wait is on a condition. A service's restart by
its own supervisor, with no controller connected, is test_gateway's (tests/integration/service_image.py),
so it is not repeated here."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.integration import contract_case
from tests.integration.helpers import HEAD, HEAD_C, HEAD_LAN, inventory_variant, listeners, ours, wait_for
from tests.testbed import PROFILES as TESTBED_PROFILES
from tests.testbed.artifacts import AUDIO_IMAGE

pytestmark = pytest.mark.testbed
SINGLE, BESIDE, BIG = "testbed-single", "testbed-single-beside", "testbed-single-big"
HEAD_MODEL, BESIDE_MODEL, BIG_MODEL = "testbed-tiny-single", "testbed-tiny-beside", "testbed-tiny-big"
BESIDE_C = "sparkcluster-testbed-d1-head"
GW_KEY = "gw-colocated-key-3b81f0d2"
GW = f"http://{HEAD_LAN}:4000"
GW_C = "sparkcluster-testbed-gateway"
AUDIO, AUDIO_MODEL = "testbed-audio", "testbed-audio"  # the service (tests/testbed/profiles/testbed-audio.toml)
AUDIO_C = f"sparkcluster-testbed-d2-service-{HEAD}"  # slot 2: the two models hold 0 and 1; its supervisor
AUDIO_SERVER_C = AUDIO_C + "-server"  # the service's own container (its image, beside its supervisor)


def engines(testbed) -> list[str]:
    """The engines' containers on the head (the gateway's is no deployment's, the service's no engine's)."""
    return sorted(x for x in ours(testbed, HEAD) if x not in (GW_C, AUDIO_C, AUDIO_SERVER_C))


def chat(model: str, timeout: float = 60) -> httpx.Response:
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{GW}/v1/chat/completions", json=body, headers={"x-api-key": GW_KEY}, timeout=timeout)


def speak(text: str) -> httpx.Response:
    body = {"model": AUDIO_MODEL, "input": text, "response_format": "wav"}
    return httpx.post(f"{GW}/v1/audio/speech", json=body, headers={"x-api-key": GW_KEY}, timeout=60)


def transcribe(wav: bytes) -> httpx.Response:
    files, form = {"file": ("speech.wav", wav, "audio/wav")}, {"model": AUDIO_MODEL}
    return httpx.post(
        f"{GW}/v1/audio/transcriptions", files=files, data=form, headers={"x-api-key": GW_KEY}, timeout=120
    )


OD_A, OD_B = "testbed-single-od-a", "testbed-single-od-b"
OD_A_MODEL, OD_B_MODEL = "testbed-tiny-od-a", "testbed-tiny-od-b"


def routes() -> dict:
    r = httpx.get(f"{GW}/gateway/status", headers={"x-api-key": GW_KEY}, timeout=5)
    return {x["deployment"]: x for x in r.json()["routes"]}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Two variants of testbed-single in a profiles folder of their own: another served name, and
    another served name asking 0.6 of MemTotal (more than 128 GB leaves beside two at 0.2 and the
    6 GiB floor: 76.8 + 51.2 + 6.4 GB > 128 GB)."""
    folder = tmp_path_factory.mktemp("profiles")
    text = (TESTBED_PROFILES / f"{SINGLE}.toml").read_text()
    assert f'served_name = "{HEAD_MODEL}"' in text and "gpu_memory_utilization = 0.2" in text
    (folder / f"{BESIDE}.toml").write_text(text.replace(HEAD_MODEL, BESIDE_MODEL))
    big = text.replace(HEAD_MODEL, BIG_MODEL).replace("gpu_memory_utilization = 0.2", "gpu_memory_utilization = 0.6")
    (folder / f"{BIG}.toml").write_text(big)
    for name, model in ((OD_A, OD_A_MODEL), (OD_B, OD_B_MODEL)):  # on demand, an idle TTL far beyond the test
        # half of the node each: one awake leaves the other too little, so they take turns
        half = text.replace(HEAD_MODEL, model).replace("gpu_memory_utilization = 0.2", "gpu_memory_utilization = 0.5")
        (folder / f"{name}.toml").write_text(half + "\n[on_demand]\nenabled = true\nidle_ttl_s = 900\n")
    return {"SPARKCLUSTER_PROFILES": str(folder), "GATEWAY_API_KEYS": GW_KEY}


@pytest.fixture
def spark_memory(testbed, sc, env):
    sc("down", env=env)
    testbed.set_memory(HEAD, 128)
    yield
    sc("down", env=env)
    testbed.set_memory(HEAD, None)


def test_two_models_on_one_node_a_third_refused_and_one_taken_down(testbed, sc, env, spark_memory):
    first = sc("up", "--profile", SINGLE, "--node", HEAD, env=env, timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    contract_case.served_through_its_start_up(testbed, first)  # the container contract's one-node start
    # without --beside, what runs there is never shared silently: the refusal says how to ask
    refused = sc("up", "--profile", BESIDE, "--node", HEAD, env=env)
    assert refused.returncode != 0 and "--beside" in refused.stderr, refused.stderr
    second = sc("up", "--profile", BESIDE, "--node", HEAD, "--beside", env=env, timeout=900)
    assert second.returncode == 0, second.stdout + second.stderr
    assert engines(testbed) == sorted([HEAD_C, BESIDE_C])
    assert listeners(testbed, HEAD, 8000) and listeners(testbed, HEAD, 8010)
    # its own agent, on its own report port (the first's answers on 8297)
    assert listeners(testbed, HEAD, 8307) and listeners(testbed, HEAD, 8297)
    # a second `up` of it finds it serving in its slot: nothing is recreated
    again = sc("up", "--profile", BESIDE, "--node", HEAD, env=env, timeout=300)
    assert again.returncode == 0 and f"already serves '{BESIDE}'" in again.stdout, again.stdout + again.stderr

    # a service beside both (item 2): its own slot, port and agent, admitted by its reservation
    assert testbed.audio_image() == AUDIO_IMAGE
    svc = sc("up", "--profile", AUDIO, "--node", HEAD, "--beside", env=env, timeout=300)
    assert svc.returncode == 0 and f"serving service '{AUDIO}'" in svc.stdout, svc.stdout + svc.stderr
    assert AUDIO_C in ours(testbed, HEAD) and listeners(testbed, HEAD, 8765) and listeners(testbed, HEAD, 8317)
    again = sc("up", "--profile", AUDIO, "--node", HEAD, env=env, timeout=300)
    assert again.returncode == 0 and f"already serves '{AUDIO}'" in again.stdout, again.stdout + again.stderr

    gw = sc("gateway", "up", env=env, timeout=300)
    assert gw.returncode == 0 and gw.stdout.count("in rotation") == 3, gw.stdout + gw.stderr
    for model in (HEAD_MODEL, BESIDE_MODEL):
        r = chat(model)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, (model, r.text)
    said = speak("the testbed speaks")  # by route: the body names the service's model, as OpenAI's clients do
    assert said.status_code == 200 and said.headers["content-type"] == "audio/wav", said.text
    assert said.content[:4] == b"RIFF", said.content[:64]
    heard = transcribe(said.content)  # a multipart upload, through the gateway untouched
    assert heard.status_code == 200 and isinstance(heard.json()["text"], str), heard.text

    st = sc("status", "--all", "--json", env=env)
    doc = json.loads(st.stdout)
    want = sorted([f"{SINGLE}@{HEAD}", f"{BESIDE}@{HEAD}", f"{AUDIO}@{HEAD}"])
    assert sorted(d["deployment"] for d in doc["deployments"]) == want, doc
    assert all(d["state"] == "healthy" for d in doc["deployments"]), doc

    # a third that does not fit: refused by the admission, naming who holds the memory and how much
    big = sc("up", "--profile", BIG, "--node", HEAD, "--beside", env=env, timeout=300)
    assert big.returncode != 0, big.stdout + big.stderr
    said = big.stderr
    # the node's memory as it is (stacks issue item 1): MemAvailable, which the two engines' shares have
    # taken (the testbed's memory view, as unified memory does), does not hold its 0.6 of 128 GB; the
    # refusal names every holder, the service by its reservation
    assert "mem.headroom" in said and "profile needs 71.5 GiB" in said, said
    assert f"'{SINGLE}' (sparkcluster) 23.8 GiB" in said and f"'{BESIDE}' (sparkcluster) 23.8 GiB" in said, said
    assert f"'{AUDIO}' (sparkcluster)" in said, said
    assert engines(testbed) == sorted([HEAD_C, BESIDE_C])

    # each deployment's own journal, the service's among them
    ev = sc("events", "--node", HEAD, "--profile", BESIDE, "--json", env=env)
    assert ev.returncode == 0 and ev.stdout.strip(), ev.stdout + ev.stderr
    ev = sc("events", "--node", HEAD, "--profile", AUDIO, "--json", env=env)
    assert ev.returncode == 0 and "service started" in ev.stdout, ev.stdout + ev.stderr

    # a fault in one model (its engine killed: vLLM's API server exits, its supervisor's verdict comes
    # in seconds; a wedge's, which waits out the stall bound, is test_gateway's) is that model's alone:
    # the verdict takes it out of the gateway's rotation while the other model and the service stay in
    # it and answer (item 5)
    top = testbed.sh(HEAD, f"docker top {BESIDE_C} -eo pid,args").stdout.splitlines()[1:]
    pids = [line.split()[0] for line in top if "VLLM::EngineCore" in line]
    assert pids, top
    beside_key, head_key, audio_key = f"{BESIDE}@{HEAD}", f"{SINGLE}@{HEAD}", f"{AUDIO}@{HEAD}"
    testbed.sh(HEAD, "kill -KILL " + " ".join(pids))
    assert wait_for(lambda: not routes()[beside_key]["in_rotation"], 120, step=0.5), routes()
    now = routes()
    assert now[head_key]["in_rotation"] and now[audio_key]["in_rotation"], now
    assert chat(HEAD_MODEL).status_code == 200 and speak("still answering").status_code == 200
    assert chat(BESIDE_MODEL).status_code == 503

    # one model taken down: the other and the service keep their containers, processes and routes
    down = sc("down", "--profile", BESIDE, env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert engines(testbed) == [HEAD_C] and GW_C in ours(testbed, HEAD) and AUDIO_C in ours(testbed, HEAD)
    assert chat(HEAD_MODEL).status_code == 200 and speak("still here").status_code == 200
    assert wait_for(lambda: chat(BESIDE_MODEL).status_code in (404, 503), 30, step=0.5), chat(BESIDE_MODEL).text
    # the service taken down: the first model stays
    down = sc("down", "--profile", AUDIO, env=env)
    gone = not {AUDIO_C, AUDIO_SERVER_C} & set(ours(testbed, HEAD))
    assert down.returncode == 0 and gone, down.stdout + down.stderr
    assert not listeners(testbed, HEAD, 8765) and chat(HEAD_MODEL).status_code == 200
    assert wait_for(lambda: speak("gone").status_code in (404, 503), 30, step=0.5)
    doc = json.loads(sc("status", "--all", "--json", env=env).stdout)
    assert [d["deployment"] for d in doc["deployments"]] == [f"{SINGLE}@{HEAD}"], doc

    # memory held by a process sparkcluster did not start (stacks issue item 1): the head made to read
    # as a node whose claims still hold a second model (2 x 0.2 of MemTotal and the floor) but whose
    # MemAvailable, once a process of the owner's holds a few GB more, does not hold its share. The
    # `--beside` start is refused before anything starts, naming that process as a holder.
    refused_beside_by_a_process_not_ours(testbed, sc, env)
    # the container contract: the head's container restarted by Docker, its engine again through NGC's
    # start-up (tests/integration/contract_case.py)
    contract_case.restarted_by_docker(testbed)


def refused_beside_by_a_process_not_ours(testbed, sc, env) -> None:
    view_gb = 11.0  # 0.4 x 11 + 6.44 (the floor, 6 GiB) = 10.84 GB: the claims still admit the second model
    meminfo = testbed.sh(HEAD, "cat /proc/meminfo").stdout
    kib = {
        x.split(":")[0]: int(x.split()[1]) for x in meminfo.splitlines() if x.split()[1:2] and x.split()[1].isdigit()
    }
    # what the machine holds, the view aside: the view (128 GB now) also takes the serving engine's share
    used_gb = (kib["MemTotal"] - kib["MemAvailable"]) * 1024 / 1e9 - 0.2 * 128
    # MemAvailable in a view of view_gb is at most view_gb - used (less the engine's share while it
    # serves): a hog of `hog_gb` leaves less than the 0.2 x view_gb the second asks, with or without it
    hog_gb = max(2.0, 0.8 * view_gb - used_gb + 1.0)
    testbed.set_memory(HEAD, view_gb)
    hog = "/tmp/owners-memhog"  # its own executable name, the comm that ps shows
    try:
        testbed.sh(HEAD, f'cp "$(command -v python3)" {hog}')
        prog = f"import time; b = b'x' * {int(hog_gb * 1e9)}; open('{hog}.ready', 'w').close(); time.sleep(600)"
        testbed.sh(HEAD, f'rm -f {hog}.ready; {{ setsid {hog} -c "{prog}" </dev/null >/dev/null 2>&1 & }}')
        assert wait_for(lambda: testbed.sh(HEAD, f"test -e {hog}.ready", check=False).returncode == 0, 60, step=0.5)
        refused = sc("up", "--profile", BESIDE, "--node", HEAD, "--beside", env=env, timeout=300)
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0 and "mem.headroom" in said, said
        assert "owners-memhog (pid " in said and f"'{SINGLE}' (sparkcluster)" in said, said
        assert engines(testbed) == [HEAD_C]
    finally:
        testbed.sh(HEAD, f"pkill -f {hog} ; rm -f {hog} {hog}.ready", check=False)
        testbed.set_memory(HEAD, 128)


def test_two_models_take_turns_on_one_node_every_request_answered_on_its_first_try(
    testbed, sc, env, spark_memory, tmp_path
):
    """Models taking turns on one Spark (stacks issue item 4): two on-demand deployments on the head,
    each asking half of its 128 GB (so one awake leaves too little for the other: the testbed's
    memory view takes an engine's share while it serves, as a Spark's unified memory does), the
    inventory's `[on_demand] rule = "lru"`. Requests alternate A, then B through the gateway: each is
    held while the asked model starts (the other, idle, yielding to it by the rule) and answered on
    its first try, with no client retry; the swap is journalled, and `status` says who is awake. (A
    third request, for A again, swaps back the same way: one engine start more, left out of make test.)"""
    inv = inventory_variant(testbed, tmp_path, lambda t: t + '\n[on_demand]\nrule = "lru"\n')
    for args in (("--profile", OD_A, "--node", HEAD), ("--profile", OD_B, "--node", HEAD, "--beside")):
        res = sc("up", *args, env=env, inventory=inv, timeout=900)
        assert res.returncode == 0 and "on standby" in res.stdout, res.stdout + res.stderr
    gw = sc("gateway", "up", env=env, inventory=inv, timeout=300)
    assert gw.returncode == 0, gw.stdout + gw.stderr
    a_key, b_key = f"{OD_A}@{HEAD}", f"{OD_B}@{HEAD}"
    for model, awake, asleep in ((OD_A_MODEL, a_key, b_key), (OD_B_MODEL, b_key, a_key)):
        r = chat(model, timeout=600)  # one try: held by the gateway while the model starts
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, (model, r.text)
        now = routes()
        assert now[awake]["in_rotation"] and not now[asleep]["in_rotation"], now
        doc = json.loads(sc("status", "--all", "--json", env=env, inventory=inv).stdout)
        said = {d["deployment"]: d for d in doc["deployments"]}
        assert said[awake]["state"] == "healthy" and said[asleep]["supervisor"]["state"] == "standby", said
    gw_log = testbed.sh(HEAD, f"docker logs {GW_C} 2>&1").stdout
    events = [json.loads(x) for x in gw_log.splitlines() if x.startswith("{")]
    held = [e for e in events if e["event"] == "held for a start on demand"]
    assert len(held) == 2 and all(e["served"] for e in held), held
    asked = [(e["deployment"], e["to"]) for e in events if e["event"] == "asked to yield"]
    assert (a_key, b_key) in asked, asked
    journal = testbed.sh(HEAD, f"docker exec {HEAD_C} cat /var/log/sparkcluster/journal.jsonl").stdout
    assert "yielded: stopped for another deployment" in journal  # A, by its own supervisor
