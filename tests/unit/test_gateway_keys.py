"""Named keys, their limits and the usage ledger (sparkcluster/gateway/keys, quota, metering,
programs/gateway_usage), against the gateway as its container serves it, on loopback in front of a
stub engine that answers with `usage` as vLLM does: a whole answer carries it, a chat stream carries
it in one more chunk (`choices` empty) before `data: [DONE]` only when `stream_options.include_usage`
asked for it (OpenAI's API reference, Create chat completion, `stream_options`; vLLM's
`ChatCompletionStreamResponse` the same), an Anthropic answer as `input_tokens`/`output_tokens`."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import subprocess
import time

import httpx
import pytest
from conftest import make_inventory
from gateway_fakes import KEY, Engine, Served, config, in_rotation, start_gateway, until
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from sparkcluster import programs
from sparkcluster.cli import gateway_cmd, gateway_keys_cmd, main
from sparkcluster.gateway import keys, metering
from sparkcluster.gateway.app import FORWARDED
from sparkcluster.programs import gateway_usage

PROMPT, WORDS = 11, 4  # what the stub engine reports per request: prompt tokens, completion tokens


class Counting(Engine):
    """The stub engine, answering with token counts (PROMPT prompt tokens, one completion token per
    word; `n_words` in the body changes it) where and as vLLM does."""

    def app(self) -> Starlette:
        base = super().app()

        async def chat(request: Request):
            body = await request.body()
            self.seen.append({"path": request.url.path, "body": body, "headers": dict(request.headers)})
            doc = json.loads(body)
            n = int(doc.get("n_words", WORDS))
            usage = {"prompt_tokens": PROMPT, "completion_tokens": n, "total_tokens": PROMPT + n}
            if request.url.path == "/v1/messages":
                return JSONResponse({"type": "message", "usage": {"input_tokens": PROMPT, "output_tokens": n}})
            if not doc.get("stream"):
                return JSONResponse({"object": "chat.completion", "choices": [{"index": 0}], "usage": usage})

            async def events():
                for i in range(n):
                    yield f'data: {{"choices":[{{"index":0,"delta":{{"content":"w{i}"}}}}]}}\n\n'.encode()
                    while i == 0 and doc.get("hold") and not self.release.is_set():
                        await asyncio.sleep(0.01)
                if (doc.get("stream_options") or {}).get("include_usage"):
                    yield f"data: {json.dumps({'choices': [], 'usage': usage}, separators=(',', ':'))}\n\n".encode()
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        routes = [Route(p, chat, methods=["POST"]) for p in FORWARDED]
        return Starlette(routes=routes + [r for r in base.routes if r.path not in FORWARDED])


def key_file(folder, *entries: keys.Entry) -> None:
    """The key file as `sparkcluster gateway keys` writes it: aside, then renamed into place."""
    (folder / "keys.json.new").write_text(keys.render(list(entries)))
    (folder / "keys.json.new").replace(folder / "keys.json")


def named(name: str, key: str, **limits) -> keys.Entry:
    return keys.Entry(name, keys.digest(key), created=time.time(), **limits)


@pytest.fixture
def stack(tmp_path):
    """A Counting engine serving `chat` and `other`, and a way to start (and restart) the gateway
    over one folder, its key file and usage ledger in it."""
    e = Counting(["chat"])
    o = Counting(["other"])
    s, so = Served(e.app()), Served(o.app())
    running = []

    def start():
        cfg = config({"chat@spark-a": (e, s), "other@spark-b": (o, so)}, data=str(tmp_path))
        gw, sg = start_gateway(cfg)
        until(lambda: in_rotation(gw, "chat@spark-a") and in_rotation(gw, "other@spark-b"), what="in rotation")
        running.append(sg)
        return gw, sg

    yield tmp_path, e, start
    for sg in running:
        sg.stop()
    s.stop()
    so.stop()


def post(sg, key: str, path: str = "/v1/chat/completions", **body):
    headers = {"x-api-key": key} if path.startswith("/v1/messages") else {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{sg.url}{path}", json={"model": "chat", **body}, headers=headers, timeout=30)


def ledger(folder, **filters) -> list[dict]:
    """The usage ledger as `sparkcluster gateway usage` reads it on the node: the program run
    through the boot, from its bundle alone."""
    argv = programs.argv(
        "sparkcluster.programs.gateway_usage",
        str(folder / gateway_usage.USAGE_DIR),
        "0",
        filters.get("key", ""),
        filters.get("model", ""),
    )
    got = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    return gateway_keys_cmd.usage_rows(json.loads(got.stdout))


def test_a_key_of_two_requests_a_minute_gets_429_with_retry_after_on_its_third(stack):
    folder, _e, start = stack
    key_file(folder, named("two-a-minute", "k-two", requests_per_minute=2))
    _gw, sg = start()
    assert [post(sg, "k-two").status_code for _ in range(2)] == [200, 200]
    third = post(sg, "k-two")
    assert third.status_code == 429 and 1 <= int(third.headers["retry-after"]) <= 30
    err = third.json()["error"]  # OpenAI's shape: its clients raise RateLimitError on it
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests" and "two-a-minute" in err["message"]
    anth = post(sg, "k-two", "/v1/messages")
    assert anth.status_code == 429 and anth.json()["type"] == "error"
    assert anth.json()["error"]["type"] == "rate_limit_error" and "retry-after" in anth.headers
    assert post(sg, KEY).status_code == 200  # GATEWAY_API_KEYS' keys have no limit


def test_the_limit_holds_under_concurrency(stack):
    """Twenty requests of a key of five a minute at once: five pass, fifteen get 429, whatever the order."""
    from concurrent.futures import ThreadPoolExecutor

    folder, _e, start = stack
    key_file(folder, named("five", "k-five", requests_per_minute=5))
    _gw, sg = start()
    with ThreadPoolExecutor(20) as pool:
        codes = sorted(pool.map(lambda _: post(sg, "k-five").status_code, range(20)))
    assert codes == [200] * 5 + [429] * 15


def test_a_key_for_one_model_gets_404_model_not_found_for_another_naming_none(stack):
    folder, _e, start = stack
    key_file(folder, named("chat-only", "k-chat", models=["chat"]))
    _gw, sg = start()
    assert post(sg, "k-chat").status_code == 200
    for model in ("other", "made-up"):  # served or not, the same answer: nothing learnt of what is served
        r = post(sg, "k-chat", model=model)
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "model_not_found" and "chat" not in r.json()["error"]["message"]
    listed = httpx.get(f"{sg.url}/v1/models", headers={"Authorization": "Bearer k-chat"}, timeout=30).json()
    assert [m["id"] for m in listed["data"]] == ["chat"]


def test_usage_holds_exactly_the_engines_tokens_half_streamed_without_include_usage(stack):
    folder, e, start = stack
    key_file(folder, named("alice", "k-alice"))
    _gw, sg = start()
    streamed = []
    for i in range(10):
        if i % 2:
            r = post(sg, "k-alice", stream=True, n_words=i)
            assert r.status_code == 200
            streamed.append(r.text)
        else:
            assert post(sg, "k-alice", n_words=i).status_code == 200
    # the gateway asked the engine for usage on every stream, and the client that did not ask saw none
    asked = [json.loads(s["body"]) for s in e.seen if json.loads(s["body"]).get("stream")]
    assert len(asked) == 5 and all(d["stream_options"] == {"include_usage": True} for d in asked)
    for text in streamed:
        assert '"usage"' not in text and text.endswith("data: [DONE]\n\n") and text.count("data: ") >= 2
    sg.stop()  # the gateway writes what is left when it stops
    (row,) = ledger(folder, key="alice")
    assert row["requests"] == 10 and row["errors"] == 0 and row["model"] == "chat"
    assert (row["prompt_tokens"], row["completion_tokens"]) == (10 * PROMPT, sum(range(10)))
    assert row["ttft_avg_s"] is not None  # the streamed ones' time to the first token
    csv_text = gateway_keys_cmd.render_csv(ledger(folder))
    assert csv_text.splitlines()[0] == ",".join(gateway_keys_cmd.FIELDS)
    assert f",alice,chat,10,{10 * PROMPT},{sum(range(10))},0," in csv_text


def test_a_client_that_asked_for_usage_keeps_its_chunk(stack):
    folder, _e, start = stack
    _gw, sg = start()
    r = post(sg, KEY, stream=True, stream_options={"include_usage": True})
    events = [x for x in r.text.split("\n\n") if x]
    assert json.loads(events[-2].removeprefix("data: "))["usage"]["completion_tokens"] == WORDS
    sg.stop()
    (row,) = ledger(folder, key="env:1")  # GATEWAY_API_KEYS' first, named as usage names it
    assert (row["prompt_tokens"], row["completion_tokens"]) == (PROMPT, WORDS)


def test_a_revoked_key_is_refused_after_one_reload_and_a_stream_under_way_finishes(stack):
    folder, e, start = stack
    key_file(folder, named("bob", "k-bob"), named("carol", "k-carol"))
    gw, sg = start()
    assert post(sg, "k-bob").status_code == 200
    with httpx.Client(timeout=30) as c:
        with c.stream(
            "POST",
            f"{sg.url}/v1/chat/completions",
            json={"model": "chat", "stream": True, "hold": True},
            headers={"Authorization": "Bearer k-bob"},
        ) as held:
            raw = held.iter_raw()
            first = next(raw)
            key_file(folder, named("carol", "k-carol"))  # bob revoked
            gw.keyring.reload_if_changed()  # the gateway's next look (its watcher looks every poll too)
            assert post(sg, "k-bob").status_code == 401
            assert post(sg, "k-carol").status_code == 200
            e.release.set()
            rest = b"".join(raw)
    assert first.startswith(b"data: ") and rest.endswith(b"data: [DONE]\n\n")


def test_counts_and_limits_survive_a_restart_of_the_gateway(stack):
    folder, _e, start = stack
    key_file(folder, named("dave", "k-dave", requests_per_minute=2), named("erin", "k-erin", tokens_per_day=20))
    _gw, sg = start()
    assert post(sg, "k-dave").status_code == 200
    assert post(sg, "k-erin").status_code == 200  # 15 tokens of its 20
    sg.stop()
    _gw, sg = start()  # a new gateway over the same folder
    assert post(sg, "k-dave").status_code == 200
    assert post(sg, "k-dave").status_code == 429  # its bucket as it was: two a minute, restart or not
    assert post(sg, "k-erin").status_code == 200  # 15 < 20: admitted (an answer in flight is never cut)
    over = post(sg, "k-erin")
    assert over.status_code == 429 and over.json()["error"]["type"] == "tokens"
    assert int(over.headers["retry-after"]) <= 86400
    sg.stop()
    rows = {r["key"]: r for r in ledger(folder)}
    assert rows["dave"]["requests"] == 3 and rows["dave"]["errors"] == 1  # its 429 counted, as an error
    assert rows["erin"]["prompt_tokens"] + rows["erin"]["completion_tokens"] == 2 * (PROMPT + WORDS)


def test_concurrency_is_held_per_key(stack):
    folder, e, start = stack
    key_file(folder, named("one-at-a-time", "k-one", max_concurrent=1))
    _gw, sg = start()
    with httpx.Client(timeout=30) as c:
        with c.stream(
            "POST",
            f"{sg.url}/v1/chat/completions",
            json={"model": "chat", "stream": True, "hold": True},
            headers={"Authorization": "Bearer k-one"},
        ) as held:
            raw = held.iter_raw()
            next(raw)
            second = post(sg, "k-one")
            assert second.status_code == 429 and second.headers["retry-after"] == "1"
            e.release.set()
            b"".join(raw)
    assert post(sg, "k-one").status_code == 200


def test_only_the_controllers_and_admin_keys_read_the_gateways_pages_and_metrics_count_by_key(stack):
    folder, _e, start = stack
    key_file(folder, named("user", "k-user"), named("root", "k-root", admin=True))
    _gw, sg = start()
    assert post(sg, "k-user").status_code == 200
    for page in ("/metrics", "/gateway/status"):
        assert httpx.get(f"{sg.url}{page}", headers={"Authorization": "Bearer k-user"}).status_code == 403
        assert httpx.get(f"{sg.url}{page}", headers={"Authorization": "Bearer k-root"}).status_code == 200
        assert httpx.get(f"{sg.url}{page}", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    text = httpx.get(f"{sg.url}/metrics", headers={"Authorization": "Bearer k-root"}).text
    assert 'sparkcluster_gateway_key_requests_total{code="200",key="user"} 1.0' in text
    assert f'sparkcluster_gateway_key_tokens_total{{key="user",kind="prompt"}} {float(PROMPT)}' in text


def test_an_expired_or_rotated_out_key_is_refused_and_a_grace_keeps_the_old_one():
    now = 1_000_000.0
    old = named("frank", "k-old")
    keys.rotate(old, "k-new", 60, now)
    ring = keys.Keyring(["env-key"])
    ring.named = [(old.sha256.encode(), float("inf"), 0.0, old.identity())]
    ring.named += [(p["sha256"].encode(), p["until"], 0.0, old.identity()) for p in old.previous]
    assert ring.identify("k-new", now).name == "frank" and ring.identify("k-old", now + 59).name == "frank"
    assert ring.identify("k-old", now + 61) is None and ring.identify("env-key", now).name == "env:1"
    gone = named("gone", "k-gone", expires=now - 1)
    ring.named = [(gone.sha256.encode(), float("inf"), gone.expires, gone.identity())]
    assert ring.identify("k-gone", now) is None


@pytest.mark.parametrize("cut", [1, 7, 30, 61, 90])
def test_the_meter_drops_the_usage_chunk_wherever_the_bytes_are_cut(cut):
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    stream = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n' + usage + b"data: [DONE]\n\n"
    m = metering.Meter(drop_usage_chunk=True, started=0.0)
    m.begin("text/event-stream", None)
    out = b"".join(m.feed(stream[i : i + cut]) for i in range(0, len(stream), cut)) + m.end()
    assert out == stream.replace(usage, b"") and m.tokens() == (3, 2)
    kept = metering.Meter(drop_usage_chunk=False, started=0.0)
    kept.begin("text/event-stream", None)
    out = b"".join(kept.feed(stream[i : i + cut]) for i in range(0, len(stream), cut)) + kept.end()
    assert out == stream and kept.tokens() == (3, 2)


def test_the_meter_reads_anthropics_stream_counts():
    events = (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":9,"output_tokens":1}}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":14}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    m = metering.Meter(drop_usage_chunk=False, started=0.0)
    m.begin("text/event-stream; charset=utf-8", None)
    assert m.feed(events) == events and m.tokens() == (9, 14)


# ---- the commands, against a node whose shell is this machine's (HOME a folder of the test's) -------


class LocalHost:
    """A node as the commands use it: its shell commands run here, under a HOME of the test's, and
    its Engine API lists no gateway (the keys then live on the head)."""

    name, address = "spark-a", "127.0.0.1"

    def __init__(self, home, ran: list):
        self.home, self.ran = home, ran

    def docker(self):
        return self

    @property
    def api(self):
        return self

    def containers(self, all=False, filters=None):
        return []

    def run(self, cmd, timeout=30.0, stdin=None, *, warn=False):
        self.ran.append(cmd)
        got = subprocess.run(
            ["sh", "-c", cmd],
            input=stdin,
            capture_output=True,
            timeout=timeout,
            env={"HOME": str(self.home), "PATH": "/usr/bin:/bin"},
        )
        done = type("Done", (), {})()
        done.exit_code, done.ok = got.returncode, got.returncode == 0
        done.stdout, done.stderr = got.stdout.decode(), got.stderr.decode()
        assert warn or done.ok, done.stderr
        return done


class Cluster:
    def __init__(self, hosts):
        self.hosts = hosts

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def close(self):
        pass


@pytest.fixture
def commands(tmp_path, monkeypatch, capsys):

    inv = make_inventory()
    head = inv.head.name
    ran: list = []
    host = LocalHost(tmp_path / "home", ran)
    host.name = head
    (tmp_path / "home").mkdir()
    cluster = Cluster({head: host})
    for module in (gateway_keys_cmd, gateway_cmd):
        monkeypatch.setattr(module, "connect_reachable", lambda inventory: (cluster, {}))
    monkeypatch.setattr(gateway_keys_cmd, "NodeLocks", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(main.Invocation, "inventory", lambda self: inv)

    def sc(*argv):
        rc = main.main(["gateway", *argv])
        out = capsys.readouterr()
        return rc, out.out, out.err

    folder = tmp_path / "home" / ".local/share/sparkcluster/gateway" / inv.cluster.name
    return sc, folder, ran


def test_keys_are_printed_once_stored_hashed_0600_and_never_on_a_command_line(commands):
    sc, folder, ran = commands
    rc, out, _ = sc("keys", "add", "alice", "--requests-per-minute", "2", "--models", "chat")
    assert rc == 0, out
    key = out.strip().splitlines()[-1]
    assert key.startswith(keys.PREFIX) and len(key) > 40
    text = (folder / keys.KEYS_FILE).read_text()
    assert key not in text and keys.digest(key) in text
    assert oct((folder / keys.KEYS_FILE).stat().st_mode & 0o777) == "0o600"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert (folder / "usage").is_dir()
    rc, out, err = sc("keys", "add", "alice")
    assert rc == 2 and "exists" in err and "sparkcluster gateway keys rotate alice" in err
    rc, out, _ = sc("keys", "rotate", "alice", "--grace", "10m")
    new = out.strip().splitlines()[-1]
    (entry,) = keys.parse((folder / keys.KEYS_FILE).read_text())
    assert entry.sha256 == keys.digest(new) and entry.previous[0]["sha256"] == keys.digest(key)
    rc, out, _ = sc("keys", "list")
    assert rc == 0 and "alice: models chat; limits 2 requests/min" in out and "previous key valid until" in out
    assert key not in out and new not in out and keys.digest(new) not in out
    assert not [c for c in ran if key in c or new in c]  # never on a command line: stdin only
    rc, out, _ = sc("keys", "revoke", "alice")
    assert rc == 0 and keys.parse((folder / keys.KEYS_FILE).read_text()) == []
    rc, _, err = sc("keys", "revoke", "alice")
    assert rc == 2 and "no key named 'alice'" in err


def test_usage_is_read_on_the_node_and_only_purge_usage_deletes_it(commands):
    sc, folder, _ran = commands
    (folder / "usage").mkdir(parents=True)
    led = gateway_usage.Ledger(str(folder / "usage"))
    now = time.time()
    led.record("alice", "chat", now, prompt=11, completion=4, ttft_s=0.5)
    led.record("alice", "chat", now, prompt=11, completion=6, error=True)
    led.record("env:1", "other", now, prompt=3, completion=1)
    led.close()
    rc, out, _ = sc("usage", "--csv", "--key", "alice")
    assert rc == 0
    (row,) = list(csv.DictReader(io.StringIO(out)))
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"], row["errors"]) == ("2", "22", "10", "1")
    assert row["ttft_avg_s"] == "0.5"
    rc, out, _ = sc("usage", "--json", "--model", "other")
    assert rc == 0 and [r["key"] for r in json.loads(out)] == ["env:1"]
    rc, out, _ = sc("usage", "--since", "1h")
    assert rc == 0 and "alice chat: 2 requests, 22 prompt + 10 completion tokens, 1 errors" in out
    rc, out, _ = sc("down")
    assert (folder / "usage" / gateway_usage.FILENAME).is_file()  # kept by down
    rc, out, _ = sc("down", "--purge-usage")
    assert "deleted the usage ledger" in out and not (folder / "usage").exists()
    rc, out, _ = sc("usage")
    assert rc == 0 and "no usage since" in out
