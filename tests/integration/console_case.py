"""The web console on the testbed, run by test_gateway on its pair, in Chromium (tests/console_browser: Debian's package through
Playwright; axe-core for accessibility), against the gateway on the head with the real engine: the page
refuses a missing or wrong key; shows the deployments (`testbed-single` on the head, serving, the
pair's variant on the worker, serving, and the on-demand variant `up` puts beside it, on standby); shows
the worker engine's wedge (SIGSTOP) within two live refreshes of the gateway reading the supervisor's
verdict; runs a restart of the worker's deployment and a wake and a stop back to standby of the
standby, each journalled by that deployment's agent with the admin key's name; refuses an action
without the CSRF token, and one from a key that is not an admin's; axe-core finds no serious violation.

The same wedge is the one endpoint's (test_gateway): while the worker's model is out of rotation the
gateway answers it 503 with Retry-After, naming the deployment, and the head's model keeps answering;
it is back in rotation once its supervisor serves it again, and `gateway events` says both.

Cost: no engine start of its own (the pair serves; the standby is only registered), the worker's restart
after the verdict (the console's restart is asked while that one starts, so the two share one wait), and
a start on demand on the worker stopped back to standby as soon as it is starting (never waited for); the
standby is taken down at the end. Every wait is on a condition.
"""

from __future__ import annotations

import json
import time

import httpx

from tests import console_browser
from tests.integration.helpers import HEAD, HEAD_C, HEAD_LAN, WORKER, wait_for

# test_gateway's (its profiles folder holds the latter two)
SINGLE, VARIANT, ON_DEMAND = "testbed-single", "testbed-single-vision", "testbed-single-od"
HEAD_MODEL, WORKER_MODEL = "testbed-tiny-single", "testbed-tiny-vision"
HEAD_KEY, WORKER_KEY, OD_KEY = f"{SINGLE}@{HEAD}", f"{VARIANT}@{WORKER}", f"{ON_DEMAND}@{WORKER}"
GW = f"http://{HEAD_LAN}:4000"
OD_C = "sparkcluster-testbed-d1-head"  # the standby's head container on the worker (slot 1: the pair's holds 0)


def added(sc, environ: dict, *args: str) -> str:
    sc("gateway", "keys", "revoke", args[0], env=environ)  # an earlier run's of that name (a testbed kept)
    res = sc("gateway", "keys", "add", *args, env=environ)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.strip().splitlines()[-1]


def signs_in(key: str) -> bool:
    return httpx.post(f"{GW}/console/login", data={"key": key}, timeout=5).status_code == 303


def worker_journal(testbed, container: str = HEAD_C) -> list[dict]:
    """A one-node deployment's journal on the worker: the pair's (its head container, slot 0) by default,
    the standby's in slot 1 beside it."""
    out = testbed.sh(WORKER, f"docker exec {container} cat /var/log/sparkcluster/journal.jsonl", check=False).stdout
    return [json.loads(x) for x in out.splitlines() if x.strip()]


def worker_state(testbed) -> dict:
    """The worker deployment's supervisor state file ({} when it cannot be read)."""
    out = testbed.sh(WORKER, f"docker exec {HEAD_C} cat /run/sparkcluster/supervisor.json", check=False).stdout
    try:
        return json.loads(out) if out.strip() else {}
    except ValueError:
        return {}


def state(key: str) -> str:
    from tests.integration.test_gateway import routes

    return routes()[key]["reason"]


def console_on_the_pair(testbed, sc, env) -> None:
    """With test_gateway's pair serving: the on-demand variant beside the worker's, on standby, the
    gateway's routes for all three, then the console's cases; the standby taken down at the end."""
    from tests.integration.test_gateway import chat, routes

    standby = sc("up", "--profile", ON_DEMAND, "--node", WORKER, "--beside", env=env, timeout=600)
    assert standby.returncode == 0 and "on standby" in standby.stdout, standby.stdout + standby.stderr
    up = sc("gateway", "up", env=env, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    owner = added(sc, env, "owner", "--admin")
    viewer = added(sc, env, "viewer")
    # the gateway reads its key file again within a poll
    assert wait_for(lambda: signs_in(owner) and signs_in(viewer), 10, step=0.5)
    assert wait_for(lambda: routes()[WORKER_KEY]["in_rotation"], 60, step=0.5), routes()
    # the worker engine's process as the worker host sees it (the standby beside it runs none yet;
    # [E]: the pattern never matches this shell's own line)
    pids = testbed.sh(WORKER, "pgrep -f 'VLLM::[E]ngineCore' || true").stdout.split()
    assert pids, testbed.sh(WORKER, "ps -eo pid,args").stdout
    try:
        with console_browser.browser() as browser:
            page = browser.new_page()
            # no key: the sign-in form; a wrong key: refused
            page.goto(f"{GW}/console")
            assert page.url.endswith("/console/login")
            page.fill("#key", "not-a-key")
            page.click("button[type=submit]")
            assert "not one of this gateway" in page.inner_text("[role=alert]")
            assert httpx.get(f"{GW}/console/live", timeout=5).status_code == 401

            # both deployments, live
            console_browser.sign_in(page, GW, owner)
            page.wait_for_selector(f"tr[data-deployment='{HEAD_KEY}']")
            assert page.is_visible(f"tr[data-deployment='{WORKER_KEY}']")
            assert page.is_visible(f"tr[data-deployment='{OD_KEY}']")
            assert console_browser.serious(page) == []
            assert wait_for(lambda: console_browser.refreshes(page) >= 1, 10, step=0.2)

            # the worker's engine stopped (/health stays 200): its wedge on the page within two refreshes
            # of the gateway's verdict; the gateway refuses its model for now, the head's answers
            testbed.sh(WORKER, "kill -STOP " + " ".join(pids))
            assert wait_for(lambda: not routes()[WORKER_KEY]["in_rotation"], 180, step=0.25), routes()
            seen_at = console_browser.refreshes(page)
            assert wait_for(lambda: "wedged" in page.inner_text("#deployments"), 10, step=0.2)
            assert console_browser.refreshes(page) - seen_at <= 2, (seen_at, console_browser.refreshes(page))
            refused = chat(WORKER_MODEL)
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0, refused.text
            assert WORKER_KEY in refused.json()["error"]["message"]
            assert chat(HEAD_MODEL).status_code == 200
            testbed.sh(WORKER, "kill -CONT " + " ".join(pids) + " 2>/dev/null || true", check=False)

            # the console's restart, asked as soon as the supervisor's own restart starts the engine again
            # (offered while an engine runs: starting or serving)
            row = f"tr[data-deployment='{WORKER_KEY}']"
            verdict_at = time.time()
            assert wait_for(
                lambda: (
                    (st := worker_state(testbed)).get("state") == "starting" and st.get("since", 0) > verdict_at - 5
                ),
                300,
                step=0.5,
            ), worker_state(testbed)
            page.wait_for_selector(f"{row} a.act:text('Restart')", timeout=30_000)
            page.click(f"{row} a.act:text('Restart')")
            assert "POST /restart" in page.inner_text("ol.plan")
            page.click("button.danger")
            assert "asked" in page.inner_text("[role=status]"), page.inner_text("main")
            assert wait_for(
                lambda: any(
                    e["event"] == "console: restart" and e.get("by") == "owner" for e in worker_journal(testbed)
                ),
                30,
            ), worker_journal(testbed)[-10:]

            # the standby: woken, then stopped back as soon as it starts
            row = f"tr[data-deployment='{OD_KEY}']"
            page.click(f"{row} a.act:text('Wake')")
            page.click("button.danger")
            page.wait_for_selector(f"{row} a.act:text('Stop to standby')", timeout=120_000)
            page.click(f"{row} a.act:text('Stop to standby')")
            page.click("button.danger")
            assert wait_for(lambda: "on standby" in state(OD_KEY), 120, step=0.5), routes()
            said = [e for e in worker_journal(testbed, OD_C) if e["event"] == "console: standby"]
            assert said and said[-1]["by"] == "owner", worker_journal(testbed, OD_C)[-10:]

            # refused: an action without the CSRF token; an action from a key that is not an admin's
            forged = page.evaluate(
                "fetch('/console/action', {method: 'POST', headers: {'content-type': "
                f"'application/x-www-form-urlencoded'}}, body: 'action=restart&deployment={HEAD_KEY}'}})"
                ".then(r => r.status)"
            )
            assert forged == 403
            other = browser.new_page()
            console_browser.sign_in(other, GW, viewer)
            assert other.locator("a.act").count() == 0
            csrf = other.locator("input[name=csrf]").first.get_attribute("value")  # the sign-out form's
            assert csrf
            status = other.evaluate(
                "fetch('/console/action', {method: 'POST', headers: {'content-type': "
                f"'application/x-www-form-urlencoded'}}, body: 'csrf={csrf}&action=restart&deployment={HEAD_KEY}'}})"
                ".then(r => r.status)"
            )
            assert status == 403
            assert console_browser.serious(other) == []
        assert sum(e["event"] == "console: restart" for e in worker_journal(testbed)) == 1
        events = [json.loads(x) for x in sc("gateway", "events", "--json", "--last", "0", env=env).stdout.splitlines()]
        acts = [e for e in events if e.get("event") == "console action"]
        assert {(e["action"], e["key"]) for e in acts} >= {
            ("restart", "owner"),
            ("wake", "owner"),
            ("standby", "owner"),
        }
        # the worker's model back in rotation once its supervisor serves it again (the one endpoint's
        # case finds both serving); the gateway's events say it went and came back, and why
        assert wait_for(lambda: routes()[WORKER_KEY]["in_rotation"], 300, step=1), routes()
        assert chat(WORKER_MODEL).status_code == 200
        said = sc("gateway", "events", env=env).stdout
        assert "out of rotation" in said and "wedged" in said and "in rotation" in said, said
    finally:
        testbed.sh(WORKER, "kill -CONT " + " ".join(pids) + " 2>/dev/null || true", check=False)
        t = time.time()
        sc("down", "--profile", ON_DEMAND, env=env)
        print(f"down of the standby: {time.time() - t:.0f}s")
