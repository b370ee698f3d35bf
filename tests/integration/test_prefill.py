"""Issue 25 on the real engine (vLLM 0.32 CPU build, TP=2 over Ray): a prompt long enough, with a
small `max_num_batched_tokens`, keeps the engine in a chunked prefill for several times the
profile's `stall_s` and probe bound. The token counters stand still meanwhile and the supervisor's
probes wait behind the prefill; the KV cache grows with every chunk. The supervisor calls it
"prefilling" and restarts nothing; the request completes. Then rank 1 stopped in the middle of a
long prefill is still a wedge, caught within the bound, and restarted.

One `up` of a variant of the `testbed` profile: 4096-token context (the tiny Llama's whole), 2 tokens
per scheduler step, so a 4000-token prompt is 2000 steps: 6.7 s at 8 tokens per step on the
2026-11-24 CI machine was too short to outlast stall_s twice.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.helpers import API_KEY, BASE, HEAD_C, WORKER, journal, sup_state, wait_for
from tests.integration.test_supervisor import rank1_pids, serving_again
from tests.testbed import PROFILES as TESTBED_PROFILES

# `make test` keeps the long prefill that is progress (issue 57); the wedge mid-prefill is `make test-long`'s
# (tests/README.md)
pytestmark = pytest.mark.testbed
PROFILES = TESTBED_PROFILES
STALL_S, PROBE_S = 5, 2
PROMPT_TOKENS = 4000


def variant(tmp_path: Path) -> dict:
    text = (PROFILES / "testbed.toml").read_text()
    text = text.replace("max_model_len = 1024", "max_model_len = 4096\nmax_num_batched_tokens = 2\nmax_num_seqs = 2")
    # float32, not the tiny Llama's bfloat16: vLLM 0.32's CPU attention takes its AMX kernel for bfloat16
    # wherever torch reports `amx_tile` (`_get_attn_isa` in vllm/v1/attention/backends/cpu_attn.py),
    # and on hosts of this machine kind that list `amx_tile` without `amx_bf16` that kernel dies with
    # SIGILL on these short chunks (issue 62 item 4; tests/testbed/README.md). In float32 it takes its
    # AVX-512 `vec` kernel on every x86 host.
    text = text.replace("max_model_len = 4096", 'max_model_len = 4096\ndtype = "float32"', 1)
    head, _, _ = text.partition("[supervisor]")
    text = head + (
        f"[supervisor]\nprobe_interval_s = 2\nprobe_timeout_s = {PROBE_S}\nstall_s = {STALL_S}\n"
        "probe_failures = 2\nmax_restarts = 2\nprefill_floor_tok_s = 2000\n"
    )
    d = tmp_path / "profiles"
    d.mkdir(exist_ok=True)
    (d / "testbed-prefill.toml").write_text(text)
    return {"SPARKCLUSTER_PROFILES": str(d)}


def long_completion(out: dict, seed: int) -> None:
    # a prompt of its own per test: vLLM's prefix cache would serve a repeated one without a prefill
    rnd = random.Random(seed)
    ids = [rnd.randrange(10, 2000) for _ in range(PROMPT_TOKENS)]
    t = time.monotonic()
    try:
        r = httpx.post(
            f"{BASE}/v1/completions",
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=600,
            json={"model": "testbed-tiny", "prompt": ids, "max_tokens": 4},
        )
        out["status"], out["body"] = r.status_code, r.text[:300]
    except httpx.HTTPError as e:
        out["status"], out["body"] = None, str(e)
    out["seconds"] = time.monotonic() - t


@pytest.fixture(scope="module")
def prefill_cluster(testbed, sc, tmp_path_factory):
    env = variant(tmp_path_factory.mktemp("prefill"))
    res = sc("up", "--profile", "testbed-prefill", "--replace", env=env, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    yield env
    sc("down", env=env)


def test_a_long_prefill_is_progress_not_a_wedge(testbed, sc, prefill_cluster):
    t0 = time.time()
    got: dict = {}
    th = threading.Thread(target=long_completion, args=(got, 7), daemon=True)
    th.start()
    seen = wait_for(lambda: [e for e in journal(testbed) if e["event"] == "prefilling" and e["ts"] > t0], 60, step=1)
    assert seen, journal(testbed)[-10:]
    assert "kv_cache_usage_perc" in seen[0]["evidence"], seen[0]
    mid = json.loads(sc("status", "--json", env=prefill_cluster, timeout=60).stdout)
    th.join(600)
    assert got.get("status") == 200, got
    # the scenario held: the prefill outlasted stall_s twice and the probe bound five times over
    assert got["seconds"] > 2 * STALL_S and got["seconds"] > 5 * PROBE_S, got  # steps of 8: 6.7-22 s seen
    events = [e for e in journal(testbed) if e["ts"] > t0]
    assert not [e for e in events if e["event"] in ("verdict", "vllm serve stopped")], events
    st = sup_state(testbed)
    assert st["state"] == "serving" and st["restarts"] == [], st
    print(f"prefill of {PROMPT_TOKENS} tokens: {got['seconds']:.0f}s; status meanwhile: {mid.get('problems')}")
    assert not [p for p in mid["problems"] if p.startswith("engine wedged")], mid["problems"]


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_a_wedge_in_the_middle_of_a_long_prefill_is_still_caught(testbed, sc, prefill_cluster):
    t0 = time.time()
    got: dict = {}
    threading.Thread(target=long_completion, args=(got, 11), daemon=True).start()
    assert wait_for(lambda: [e for e in journal(testbed) if e["event"] == "prefilling" and e["ts"] > t0], 60, step=1)
    pids = rank1_pids(testbed)
    stopped = time.time()
    try:
        testbed.sh(WORKER, "kill -STOP " + " ".join(pids))
        wedged = wait_for(
            lambda: [
                e
                for e in journal(testbed)
                if (e["event"], e.get("kind")) == ("verdict", "wedged") and e["ts"] > stopped
            ],
            STALL_S + 4 * PROBE_S + 30,
            step=1,
        )
        assert wedged, journal(testbed)[-12:]
    finally:
        testbed.sh(WORKER, "kill -CONT " + " ".join(pids) + " 2>/dev/null || true", check=False)
    serving_again(testbed, stopped)
    assert len(sup_state(testbed)["restarts"]) == 1
    assert HEAD_C  # the head container kept its name: the supervisor restarted the server inside it
