"""Restarts that do not recompile (issue 40 item 3), on the real engine with torch.compile on (the
testbed-compile profile: vLLM 0.32.0's CPU build, inductor with the image's g++), on one node:

- the first `up` finds no cache: the journal says "compile cache" with result miss and the compile
  seconds; the key's folder on the node is the SSH user's, files and all, and `status` and
  `weights status` show it with its size;
- `down` keeps it; `up` again loads it: result hit;
- a supervisor restart (the engine killed) is a hit too;
- `down --purge-caches` removes it.

Timings are `make bench`'s (perf/compile_cache.py); here only what happened is asserted.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.integration import helpers
from tests.integration.helpers import HEAD, HEAD_C, as_user, journal

# in `make test` since issue 57 (about 2 min on this machine kind: tests/README.md)
pytestmark = pytest.mark.testbed
PROFILE = "testbed-compile"
MODEL = "testbed-tiny-compile"
UP_TIMEOUT_S = 1200
KILL_ENGINE = (
    "python3 -c 'import json, os, signal; "
    'os.kill(json.load(open("/run/sparkcluster/serve.json"))["pid"], signal.SIGKILL)\''
)  # a cold compile on two shared cores, after the image stage


def endpoint(stdout: str) -> str:
    m = re.search(r"^endpoint: (\S+)/v1$", stdout, re.M)
    assert m, stdout
    return helpers.reached(m.group(1))  # it listens on the cluster's side: the tests' door to it


def cache_entries(testbed) -> list[dict]:
    return [e for e in journal(testbed) if e.get("event") == "compile cache"]


def cache_root() -> str:
    return os.path.join(helpers.account()["home"], ".cache/sparkcluster/compile")


def keys_on(testbed) -> list[str]:
    out = testbed.sh(HEAD, as_user(f"ls {cache_root()} 2>/dev/null || true"), check=False).stdout
    return [k for k in out.split() if re.fullmatch(r"[0-9a-f]{16}", k)]


def up(sc) -> str:
    res = sc("up", "--profile", PROFILE, "--node", HEAD, timeout=UP_TIMEOUT_S)
    assert res.returncode == 0, res.stdout + res.stderr
    base = endpoint(res.stdout)
    assert helpers.answers(base, MODEL), res.stdout
    return base


def wait_entry(testbed, count: int, timeout: float = 600) -> dict:
    got = helpers.wait_for(lambda: len(cache_entries(testbed)) >= count and cache_entries(testbed), timeout, step=2)
    assert got, "\n".join(json.dumps(e) for e in journal(testbed)[-12:])
    return got[count - 1]


def test_a_restart_loads_what_the_first_start_compiled(testbed, sc):
    sc("down", "--purge-caches")  # from nothing: every key of every earlier run gone
    assert keys_on(testbed) == []
    up(sc)
    first = wait_entry(testbed, 1)
    assert first["result"] == "miss", first
    assert first["compile_s"] and first["compile_s"] > 0, first
    assert first["files_added"] > 0, first
    (key,) = keys_on(testbed)
    assert first["key"] == key

    # the user's, every file of it, once the agent handed them over (it looks every 30 s)
    a = helpers.account()
    not_users = f"find {cache_root()}/{key} ! -uid {int(a['uid'])} | head -3"
    assert helpers.wait_for(lambda: testbed.sh(HEAD, not_users).stdout.strip() == "", 60, step=2), testbed.sh(
        HEAD, not_users
    ).stdout

    # status and weights status show it, with its size
    st = json.loads(sc("status", "--json").stdout)
    head = next(n for n in st["nodes"] if n["node"] == HEAD)
    assert head["compile_cache"] == key and head["compile_cache_gib"] is not None, head
    ws = sc("weights", "status")
    assert ws.returncode == 0 and key in ws.stdout and "compile caches in" in ws.stdout, ws.stdout

    # down keeps it; up again hits it
    res = sc("down")
    assert res.returncode == 0 and keys_on(testbed) == [key], res.stdout
    up(sc)
    second = wait_entry(testbed, 1)  # a new container: a new journal
    assert (second["result"], second["key"]) == ("hit", key), second
    assert "unloaded" not in second, second  # vLLM did not compile again (the profile's AOT off)

    # a supervisor restart: the engine killed, started again by the supervisor, a hit as well
    since = helpers.sup_state(testbed).get("since", 0)
    testbed.sh(HEAD, f"docker exec {HEAD_C} {KILL_ENGINE}")  # `vllm serve` by its recorded PID
    assert helpers.wait_for(
        lambda: (st := helpers.sup_state(testbed)).get("state") == "serving" and st.get("since", 0) > since,
        600,
        step=2,
    ), journal(testbed)[-12:]
    third = wait_entry(testbed, 2)
    assert third["result"] == "hit" and "unloaded" not in third, third

    # another flag is another key: the old one is never mounted (kept until the cap or a purge)
    # (test_compile_cache.py in tests/unit covers the key; here the purge)
    res = sc("down", "--purge-caches")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"compile cache {key}" in res.stdout, res.stdout
    assert keys_on(testbed) == []
