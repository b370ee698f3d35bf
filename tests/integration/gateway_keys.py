"""Named keys, their limits and the usage ledger on the testbed, with the real engine behind the gateway
on the head, run by test_gateway on its pair of one-node deployments (two models, one gateway):
a key of 2 requests a minute gets 429 with Retry-After on its third; a key held to one model gets
404 `model_not_found` for the other; after ten requests of one key, half of them streamed without
`include_usage`, `gateway usage --csv` shows exactly the tokens the engine reported; a revoked key is
refused within one reload (a second); the counts survive `gateway down` and `gateway up` again, and
`gateway down --purge-usage` removes them. The key file is 0600 in a 0700 folder, holds no key, and no
key reaches a command line.

No engine start of its own: the pair's gateway is the one under test; every wait is on a condition.
"""

from __future__ import annotations

import csv
import io
import json

import httpx

from tests.integration.helpers import HEAD, HEAD_LAN, wait_for

MAX_TOKENS = 3  # with ignore_eos (vLLM's sampling parameter) every answer is exactly this long
GW = f"http://{HEAD_LAN}:4000"


def ask(key: str, model: str, stream: bool = False) -> httpx.Response:
    body = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": stream,
        "messages": [{"role": "user", "content": "count"}],
    }
    return httpx.post(f"{GW}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def added(sc, env, *args: str) -> str:
    """`gateway keys add ...`: the key it printed (its last line), once."""
    sc("gateway", "keys", "revoke", args[0], env=env)  # an earlier run's of that name (a testbed kept)
    res = sc("gateway", "keys", "add", *args, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.strip().splitlines()[-1]


def usage(sc, env, key: str) -> list[dict]:
    res = sc("gateway", "usage", "--csv", "--key", key, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return list(csv.DictReader(io.StringIO(res.stdout)))


def totals(rows: list[dict]) -> tuple[int, int, int]:
    return tuple(sum(int(r[c]) for r in rows) for c in ("requests", "prompt_tokens", "completion_tokens"))


def named_keys_limits_and_usage(testbed, sc, env, model: str, other: str) -> None:
    """With `model` and `other` serving: the gateway from an empty ledger, then the keys' cases; it ends
    with the gateway down and its ledger purged."""
    sc("gateway", "down", "--purge-usage", env=env)
    res = sc("gateway", "up", env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr

    two = added(sc, env, "two-a-minute", "--requests-per-minute", "2")
    one = added(sc, env, "one-model", "--models", model)
    meter = added(sc, env, "metered")
    # the key file: 0600 in a 0700 folder, hashes only; no key on any command line
    listed = json.loads(sc("gateway", "keys", "list", "--json", env=env).stdout)
    folder = listed["folder"]
    modes = testbed.sh(HEAD, f"stat -c %a {folder} {folder}/keys.json").stdout.split()
    assert modes == ["700", "600"], modes
    text = testbed.sh(HEAD, f"cat {folder}/keys.json").stdout + testbed.sh(HEAD, "ps -eo args").stdout
    for k in (two, one, meter):
        assert k not in text and k not in json.dumps(listed)

    # taken without a restart: the gateway reads its key file again within a poll
    assert wait_for(lambda: ask(two, model).status_code == 200, 10, step=0.5)
    assert ask(two, model).status_code == 200
    third = ask(two, model)
    assert third.status_code == 429 and int(third.headers["retry-after"]) >= 1, third.text
    assert third.json()["error"]["code"] == "rate_limit_exceeded"

    assert ask(one, model).status_code == 200
    refused = ask(one, other)
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found", refused.text

    # ten requests, half streamed without include_usage: the ledger holds exactly what the engine reported
    prompt = 0
    for i in range(10):
        if i % 2:
            r = ask(meter, model, stream=True)
            assert r.status_code == 200 and '"usage"' not in r.text and r.text.rstrip().endswith("data: [DONE]")
        else:
            r = ask(meter, model)
            assert r.status_code == 200, r.text
            u = r.json()["usage"]
            assert u["completion_tokens"] == MAX_TOKENS
            prompt = u["prompt_tokens"]
    expected = (10, 10 * prompt, 10 * MAX_TOKENS)
    assert wait_for(lambda: totals(usage(sc, env, "metered")) == expected, 10, step=1), usage(sc, env, "metered")

    # revoked: refused within one reload
    res = sc("gateway", "keys", "revoke", "one-model", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert wait_for(lambda: ask(one, model).status_code == 401, 5, step=0.2)

    # the counts survive the gateway going down and up again; --purge-usage alone removes them
    assert sc("gateway", "down", env=env).returncode == 0
    assert sc("gateway", "up", env=env, timeout=300).returncode == 0
    assert totals(usage(sc, env, "metered")) == expected
    assert ask(meter, model).status_code == 200  # the key file stayed too
    assert sc("gateway", "down", "--purge-usage", env=env).returncode == 0
    assert usage(sc, env, "metered") == []
