"""The web console (sparkcluster/gateway/console) on loopback against stand-in head agents and engines
(console_fakes): the key entered once gives a session cookie (HttpOnly, SameSite=Strict, Secure under
TLS), pages are server-rendered and live (SSE), every action needs the session's CSRF token and an admin
key and goes to the deployment's head agent with its token and the key's name; the head agent's side
(node/console_calls, node/supervisor `ask`) reads the journal and the log with the secrets masked."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from console_fakes import ADMIN_KEY, KEY, SECRET, TOKEN_A, TOKEN_B, USER_KEY, start, until
from starlette.testclient import TestClient

from sparkcluster.gateway import console, console_view, keys, rollout
from sparkcluster.gateway.app import Gateway
from sparkcluster.node import console_calls, contract


@pytest.fixture
def cons(tmp_path):
    c = start(tmp_path)
    yield c
    c.stop()


def signed_in(c, key: str) -> httpx.Client:
    client = httpx.Client(base_url=c.url, timeout=10.0)
    got = client.post("/console/login", data={"key": key})
    assert got.status_code == 303, got.text
    return client


def csrf_of(page: str) -> str:
    return re.search(r"name='csrf' value='([^']+)'", page).group(1)


def test_without_a_session_the_console_asks_for_a_key_and_refuses_a_wrong_one(cons):
    with httpx.Client(base_url=cons.url) as client:
        got = client.get("/console")
        assert got.status_code == 303 and got.headers["location"] == "/console/login"
        form = client.get("/console/login")
        assert form.status_code == 200 and "type='password'" in form.text
        assert "default-src 'self'" in form.headers["content-security-policy"]
        wrong = client.post("/console/login", data={"key": "not-a-key-of-this-gateway"})
        assert wrong.status_code == 401 and "not one of this gateway" in wrong.text
        assert console.COOKIE not in wrong.headers.get("set-cookie", "")
        assert client.get("/console/live").status_code == 401


def test_a_key_entered_once_gives_an_httponly_strict_cookie_and_the_cluster(cons):
    with httpx.Client(base_url=cons.url) as client:
        got = client.post("/console/login", data={"key": ADMIN_KEY})
        cookie = got.headers["set-cookie"]
        assert got.status_code == 303 and cookie.startswith(console.COOKIE + "=")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
        assert "Secure" not in cookie  # plain HTTP here; under TLS: test_the_cookie_is_secure_under_tls
        assert ADMIN_KEY not in cookie
        page = client.get("/console").text
    # both deployments, their supervisor's state, the last verdict with its cause, the rotation, the nodes
    assert "reasoner@spark-a+spark-b" in page and "vision@spark-c" in page
    assert "state-serving" in page and "state-standby" in page
    assert "wedged</span>: no token generated for 120s with 2 requests running" in page
    assert "in rotation" in page and "spark-b" in page and "90.0 GiB of 119.0 GiB" in page
    assert "62 W" in page and "22.4 GB/s over IB" in page  # the head agent's own /metrics
    assert "SparkRestartLoop" in page and "SparkMemoryHeadroomLow" not in page  # firing only, not pending
    assert "owner (admin)" in page
    # a bench and a rollback: the exact commands to run from the controller (docs: security)
    assert "<code>sparkcluster bench --profile reasoner</code>" in page
    assert "<code>sparkcluster rollback --profile reasoner --node spark-a --node spark-b</code>" in page


def test_the_cookie_is_secure_under_tls(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / keys.KEYS_FILE).write_text(keys.render([keys.Entry("owner", keys.digest(ADMIN_KEY), admin=True)]))
    gw = Gateway({"keys": [KEY], "deployments": [], "data": str(data)})
    client = TestClient(gw.app(), base_url="https://gateway.example", follow_redirects=False)
    got = client.post("/console/login", data={"key": ADMIN_KEY})
    assert got.status_code == 303 and "Secure" in got.headers["set-cookie"]


def test_a_non_admin_key_sees_the_cluster_and_models_but_neither_acts_nor_reads_events_or_logs(cons):
    client = signed_in(cons, USER_KEY)
    page = client.get("/console").text
    assert "reasoner@spark-a+spark-b" in page and "/console/confirm" not in page and "Events" not in page
    assert "sparkcluster rollback" not in page
    assert client.get("/console/events").status_code == 403
    assert client.get("/console/confirm", params={"action": "restart", "deployment": "x"}).status_code == 403
    said = client.post(
        "/console/action", data={"csrf": csrf_of(page), "action": "restart", "deployment": "reasoner@spark-a+spark-b"}
    )
    assert said.status_code == 403 and "only an admin key" in said.text
    assert cons.a.asked == []
    model = client.get("/console/model/reasoner").text
    assert "Engine figures" in model and "Server log" not in model and SECRET not in model


def test_an_action_without_the_csrf_token_or_from_another_site_is_refused(cons):
    client = signed_in(cons, ADMIN_KEY)
    page = client.get("/console").text
    form = {"action": "restart", "deployment": "reasoner@spark-a+spark-b"}
    assert client.post("/console/action", data=form).status_code == 403
    assert client.post("/console/action", data={**form, "csrf": "wrong"}).status_code == 403
    other = client.post(
        "/console/action", data={**form, "csrf": csrf_of(page)}, headers={"origin": "https://evil.example"}
    )
    assert other.status_code == 403
    assert cons.a.asked == []
    # no session at all: nothing done either
    with httpx.Client(base_url=cons.url) as anon:
        assert anon.post("/console/action", data={**form, "csrf": csrf_of(page)}).status_code == 401
    assert cons.a.asked == []


def test_restart_is_confirmed_in_the_dry_runs_words_and_sent_with_the_token_and_the_keys_name(cons, capsys):
    client = signed_in(cons, ADMIN_KEY)
    page = client.get("/console").text
    assert "action=restart&amp;deployment=reasoner%40spark-a%2Bspark-b" in page
    confirm = client.get("/console/confirm", params={"action": "restart", "deployment": "reasoner@spark-a+spark-b"})
    assert confirm.status_code == 200
    assert "POST /restart" in confirm.text and "requests in flight fail" in confirm.text
    done = client.post(
        "/console/action",
        data={"csrf": csrf_of(confirm.text), "action": "restart", "deployment": "reasoner@spark-a+spark-b"},
        headers={"origin": cons.url},
    )
    assert done.status_code == 303 and done.headers["location"] == "/console"
    assert "restart of reasoner@spark-a+spark-b: asked" in client.get("/console").text
    assert "asked" not in client.get("/console").text  # said once
    assert "forged" not in client.get("/console", params={"said": "forged words"}).text
    assert cons.a.asked == [("restart", TOKEN_A, "owner")]
    assert cons.a.journal[-1]["by"] == "owner"
    logged = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert any(e["event"] == "console action" and e["key"] == "owner" and e["action"] == "restart" for e in logged)


def test_a_standby_is_woken_and_stopped_again_through_its_token(cons):
    client = signed_in(cons, ADMIN_KEY)
    csrf = csrf_of(client.get("/console").text)
    woke = client.post("/console/action", data={"csrf": csrf, "action": "wake", "deployment": "vision@spark-c"})
    assert woke.status_code == 303 and cons.b.wakes == [TOKEN_B]
    until(lambda: "Stop to standby" in client.get("/console").text, what="the woken deployment offers its standby")
    client.post("/console/action", data={"csrf": csrf, "action": "standby", "deployment": "vision@spark-c"})
    assert cons.b.asked == [("standby", TOKEN_B, "owner")]


def test_the_live_stream_sends_the_cluster_and_a_verdict_when_it_comes(cons):
    client = signed_in(cons, ADMIN_KEY)
    with client.stream("GET", "/console/live") as got:
        assert got.headers["content-type"].startswith("text/event-stream")
        lines = got.iter_lines()
        first = json.loads(next(x for x in lines if x.startswith("data: "))[6:])
        assert "reasoner@spark-a+spark-b" in first["deployments"] and "spark-b" in first["nodes"]
        cons.a.causes.append({"ts": time.time(), "kind": "wedged", "cause": "rank 1 stopped (SIGSTOP)"})
        cons.a.state = contract.RESTARTING
        seen = ""
        for x in lines:
            if x.startswith("data: "):
                seen = json.loads(x[6:])["deployments"]
                if "rank 1 stopped" in seen:
                    break
        assert "state-restarting" in seen


def test_the_model_page_shows_the_engines_figures_recent_events_and_the_masked_log(cons):
    client = signed_in(cons, ADMIN_KEY)
    client.get("/console/model/reasoner")
    time.sleep(console.FIGURES_S)
    page = client.get("/console/model/reasoner").text
    assert "Engine figures" in page and "25.0 %" in page and "3 + 1 waiting" in page
    assert "200 ms" in page and "20.0 ms" in page  # TTFT and ITL means between the two reads
    assert "Avg prompt throughput" in page and SECRET not in page and "******" in page
    assert "state: serving" in page  # the recent events
    assert client.get("/console/model/not-served").status_code == 404


def test_events_filtered_by_deployment_and_kind(cons):
    client = signed_in(cons, ADMIN_KEY)
    page = client.get("/console/events", params={"deployment": "vision@spark-c"}).text
    assert "state: standby" in page and "state: serving" not in page
    page = client.get("/console/events", params={"kind": "verdict", "minutes": "60"}).text
    assert "no token generated for 120s" in page and "state: standby" not in page


def test_a_revoked_or_rotated_key_ends_its_session_and_signing_out_needs_the_token(cons, tmp_path):
    user, admin = signed_in(cons, USER_KEY), signed_in(cons, ADMIN_KEY)
    assert user.post("/console/logout", data={}).status_code == 403
    assert "/console/confirm" in admin.get("/console").text
    # alice revoked; owner's key rotated to a new one under the same name, without grace
    (tmp_path / "gateway" / keys.KEYS_FILE).write_text(
        keys.render([keys.Entry("owner", keys.digest("sk-spark-a-new-key-for-owner-0123"), admin=True)])
    )
    until(lambda: user.get("/console").status_code == 303, what="the revoked key's session to end")
    assert admin.get("/console").status_code == 303
    # signing out with the token ends the session
    again = signed_in(cons, KEY)
    page = again.get("/console").text
    assert again.post("/console/logout", data={"csrf": csrf_of(page)}).status_code == 303
    assert again.get("/console").status_code == 303


def test_a_key_no_longer_admin_no_longer_acts(cons, tmp_path):
    admin = signed_in(cons, ADMIN_KEY)
    csrf = csrf_of(admin.get("/console").text)
    (tmp_path / "gateway" / keys.KEYS_FILE).write_text(keys.render([keys.Entry("owner", keys.digest(ADMIN_KEY))]))
    until(lambda: "/console/confirm" not in admin.get("/console").text, what="the key's rights read again")
    form = {"csrf": csrf, "action": "restart", "deployment": "reasoner@spark-a+spark-b"}
    assert admin.post("/console/action", data=form).status_code == 403 and cons.a.asked == []


def print_rules(css: str) -> str:
    """The body of the stylesheet's `@media print { ... }` block (its nested braces matched)."""
    start = css.index("{", css.index("@media print")) + 1
    depth, at = 1, start
    while depth:
        depth += {"{": 1, "}": -1}.get(css[at], 0)
        at += 1
    return css[start : at - 1]


def test_the_printable_view_and_the_assets(cons):
    client = signed_in(cons, ADMIN_KEY)  # an admin's cluster page has actions; its printable one has none
    printed = client.get("/console/print").text
    assert "reasoner@spark-a+spark-b" in printed and "vision@spark-c" in printed and "spark-b" in printed
    # read once: no script, no stream to follow, no action to take
    assert "<script" not in printed and "data-live" not in printed and "/console/live" not in printed
    assert "/console/confirm" not in printed and "/console/confirm" in client.get("/console").text
    assert "<script src='/console/static/console.js' defer>" in client.get("/console").text  # the live page's
    css = client.get("/console/static/console.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    rules = print_rules(css.text)
    hidden = re.search(r"([^{}]*)\{\s*display:\s*none", rules).group(1)
    assert {"header nav", ".skip", ".act", "form", "button"} <= {x.strip() for x in hidden.split(",")}
    assert "thead { display: table-header-group; }" in rules and "break-inside: avoid" in rules
    # a narrow sheet of paper keeps the tables: the phone's cards are for a screen only
    assert "@media (max-width" not in css.text and "@media screen and (max-width: 640px)" in css.text
    js = client.get("/console/static/console.js")
    assert (
        js.status_code == 200 and "EventSource" in js.text and js.headers["content-type"].startswith("text/javascript")
    )
    assert client.get("/console/static/..%2Fconsole.py").status_code == 404
    assert client.get("/console/static/console.py").status_code == 404


def test_the_gateways_container_carries_the_consoles_assets():
    files = rollout.code_files()
    for name in ("console.js", "console.css"):
        assert f"{rollout.CODE_DIR}/sparkcluster/gateway/console_assets/{name}" in files
    assert f"{rollout.CODE_DIR}/sparkcluster/gateway/console.py" in files


def test_figures_between_two_reads():
    before = {console_view.GENERATED: 100.0, f"{console_view.TTFT}_sum": 1.0, f"{console_view.TTFT}_count": 10}
    now = {console_view.GENERATED: 300.0, f"{console_view.TTFT}_sum": 2.0, f"{console_view.TTFT}_count": 15}
    f = console_view.figures(now, before, 2.0)
    assert f.tokens_per_s == 100.0 and f.ttft_s == pytest.approx(0.2) and f.itl_s is None
    assert console_view.figures(now, None, 0).tokens_per_s is None
    text = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\nvllm:kv_cache_usage_perc{engine="1"} 0.25\n'
    assert console_view.samples(text)[console_view.KV] == 0.75


def test_every_value_is_escaped():
    page = console_view.events_table([{"ts": 1, "event": "<script>alert(1)</script>", "deployment": "x"}])
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_the_head_agent_reads_the_journal_and_the_log_with_the_secrets_masked(tmp_path, monkeypatch):
    token, journal, log, secrets = (tmp_path / n for n in ("token", "journal", "log", "secrets"))
    token.write_text("the-token-0123456789\n")
    journal.write_text("\n".join(json.dumps({"ts": t, "event": f"e{t}"}) for t in (1, 2, 3)) + "\nnot json\n")
    log.write_text(f"line one\nHF_TOKEN={SECRET}\n")
    secrets.write_text(json.dumps({"HF_TOKEN": SECRET}))
    for name, path in (("WAKE_PATH", token), ("JOURNAL_PATH", journal), ("SERVE_LOG", log), ("SECRETS_PATH", secrets)):
        monkeypatch.setattr(console_calls, name, str(path))
    assert console_calls.read("/journal", "wrong", {})[0] == 401
    code, doc = console_calls.read("/journal", "the-token-0123456789", {"since": "1"})
    assert code == 200 and [e["event"] for e in doc["entries"]] == ["e2", "e3"]
    code, doc = console_calls.read("/log", "the-token-0123456789", {"lines": "5"})
    assert doc["lines"] == ["line one", "HF_TOKEN=******"]
    assert console_calls.tail(str(log), 1) == [f"HF_TOKEN={SECRET}"]


AGENT_TOKEN = "wake-token-3f9c2e7a"
ON_DEMAND = {"on_demand": True, "idle_ttl_s": 600.0, "memory_need_fraction": 0.0, "memory_wait_s": 3600.0}


def _journal(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "journal").read_text().splitlines()]


def test_the_supervisor_restarts_on_the_consoles_ask_journalling_the_keys_name(tmp_path, monkeypatch):
    from conftest import on_demand_supervisor

    sup = on_demand_supervisor(tmp_path, monkeypatch, {**ON_DEMAND, "on_demand": False}, AGENT_TOKEN)
    monkeypatch.setattr(sup, "node_memory", lambda: {})
    try:
        assert sup.ask("restart", AGENT_TOKEN, "owner")[0] == 409  # nothing runs yet
        sup.tick()
        assert sup.proc is not None
        first = sup.proc.pid
        assert sup.ask("restart", "wrong", "owner")[0] == 401
        assert sup.ask("standby", AGENT_TOKEN, "owner")[0] == 409  # not on demand: no standby
        assert sup.ask("restart", AGENT_TOKEN, "owner")[0] == 202
        monkeypatch.setattr(sup, "memory_before_restart", lambda policy: False)
        sup.tick()  # the ask: stopped, restarting
        assert sup.proc is None and sup.state == contract.RESTARTING and sup.restarts == []
        sup.tick()  # started again at once
        assert sup.proc is not None and sup.proc.pid != first
        asked = [e for e in _journal(tmp_path) if e["event"] == "console: restart"]
        assert asked and asked[0]["by"] == "owner"
    finally:
        sup.stop("test")


def test_the_supervisor_goes_back_to_standby_on_the_consoles_ask(tmp_path, monkeypatch):
    from conftest import on_demand_supervisor

    sup = on_demand_supervisor(tmp_path, monkeypatch, ON_DEMAND, AGENT_TOKEN)
    monkeypatch.setattr(sup, "node_memory", lambda: {"spark-head": (100 * 2**30, 90 * 2**30)})
    try:
        sup.tick()
        assert sup.state == contract.STANDBY and sup.ask("standby", AGENT_TOKEN, "owner")[0] == 409
        sup.wake(AGENT_TOKEN)
        sup.tick()
        assert sup.proc is not None
        assert sup.ask("standby", AGENT_TOKEN, "owner")[0] == 202
        sup.tick()
        assert sup.proc is None and sup.state == contract.STANDBY
        assert any(e["event"] == "console: standby" and e["by"] == "owner" for e in _journal(tmp_path))
    finally:
        sup.stop("test")


def test_the_head_agents_report_server_routes_the_consoles_calls(tmp_path, monkeypatch):
    from sparkcluster.node import memreport

    token = tmp_path / "token"
    token.write_text("the-token-0123456789")
    monkeypatch.setattr(console_calls, "WAKE_PATH", str(token))
    monkeypatch.setattr(console_calls, "JOURNAL_PATH", str(tmp_path / "journal"))
    (tmp_path / "journal").write_text(json.dumps({"ts": 5, "event": "state: serving"}) + "\n")
    asked = []

    def ask(what, tok, who):
        asked.append((what, tok, who))
        return 202, {"state": "serving"}

    httpd = memreport.serve_reports("127.0.0.1", 0, lambda: {"node": "n"}, console=console_calls.read, ask=ask)
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        bearer = {"authorization": "Bearer the-token-0123456789"}
        assert httpx.get(f"{base}/journal").status_code == 401
        got = httpx.get(f"{base}/journal", params={"since": "1"}, headers=bearer)
        assert got.status_code == 200 and got.json()["entries"][0]["event"] == "state: serving"
        done = httpx.post(f"{base}/restart", headers={**bearer, "x-sparkcluster-by": "owner"})
        assert done.status_code == 202 and asked == [("restart", "the-token-0123456789", "owner")]
        assert httpx.post(f"{base}/other", headers=bearer).status_code == 404
        assert httpx.get(f"{base}/").json() == {"node": "n"}
    finally:
        httpd.shutdown()


def test_speed_and_upgrades_read_the_records_the_controller_copied(cons):
    client = signed_in(cons, USER_KEY)
    speed = client.get("/console/speed").text
    assert "<svg role='img'" in speed and "c8: 212.4 tokens/s" in speed
    assert "Against the published: short" in speed and "NCCL chose Socket, not IB" in speed
    ups = client.get("/console/upgrades").text
    assert "rolled back" in ups and "the canary" in ups and "vllm:0.33.0" in ups


def test_the_records_go_to_the_gateways_folder_aside_and_renamed():
    from types import SimpleNamespace

    from sparkcluster.deployment import head_records
    from sparkcluster.gateway import store

    ran = []

    def run(cmd, timeout=None, warn=False, stdin=None):
        ran.append((cmd, stdin))
        return SimpleNamespace(stdout="/home/owner" if "HOME" in cmd else "", stderr="", exit_code=0, ok=True)

    host = SimpleNamespace(name="spark-a", address="a", run=run)
    path = head_records.write(host, "pair", "bench/20261129T100000Z", {"rows": []})
    assert path == f"/home/owner/{store.FOLDER}/pair/{console.RECORDS}/bench/20261129T100000Z.json"
    write = ran[1][0]
    assert write.startswith("umask 077 && mkdir -p") and f"cat > {path}.new && mv -f {path}.new {path}" in write
    assert json.loads(ran[1][1]) == {"rows": []}
    assert "tail -n +31" in ran[2][0]  # the newest 30 runs kept
    said = []
    head_records.publish(SimpleNamespace(name="spark-a", run=None), "pair", "upgrades", {}, said.append)
    assert said and "not written on spark-a" in said[0]


def test_what_each_deployment_offers():
    row = console_view.Row("m@a", ("m",), ("a",), True, "serving", 0, on_demand=True, state=contract.SERVING)
    assert [a for a, _ in console_view.actions_for(row)] == ["restart", "standby"]
    row.stopping = True  # a verdict published, the engine being stopped: nothing to ask of it
    assert console_view.actions_for(row) == []
    row.stopping, row.state = False, contract.STANDBY
    assert [a for a, _ in console_view.actions_for(row)] == ["wake"]
    row.state, row.on_demand = contract.RESTARTING, False  # no engine runs while it waits to restart
    assert console_view.actions_for(row) == []


def test_a_live_stream_ends_within_its_life_and_tells_the_browser_to_come_back(cons, monkeypatch):
    monkeypatch.setattr(console, "STREAM_S", 1.5)
    client = signed_in(cons, USER_KEY)
    t = time.monotonic()
    with client.stream("GET", "/console/live") as got:
        lines = list(got.iter_lines())
    assert time.monotonic() - t < 5 and lines[0] == f"retry: {console.RETRY_MS}"
    assert any(x.startswith("data: ") for x in lines)


def test_the_events_page_is_live_for_an_admin_only(cons):
    admin, user = signed_in(cons, ADMIN_KEY), signed_in(cons, USER_KEY)
    assert user.get("/console/live/events").status_code == 403
    page = admin.get("/console/events", params={"kind": "state", "deployment": "vision@spark-c"}).text
    assert "data-live='/console/live/events?deployment=vision%40spark-c&amp;kind=state&amp;minutes=60'" in page
    with admin.stream("GET", "/console/live/events", params={"kind": "state", "deployment": "vision@spark-c"}) as got:
        lines = got.iter_lines()
        first = json.loads(next(x for x in lines if x.startswith("data: "))[6:])
        assert "state: standby" in first["journal"] and "state: serving" not in first["journal"]
        cons.b.journal.append({"ts": time.time(), "event": "state: starting"})
        for x in lines:
            if x.startswith("data: ") and "state: starting" in x:
                break
        else:
            raise AssertionError("the new entry never came")
