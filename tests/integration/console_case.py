"""The web console on the testbed, run by test_gateway on its pair, in Chromium (tests/console_browser: Debian's package through
Playwright; axe-core for accessibility), against the gateway on the head with the real engine: the page
refuses a missing or wrong key; shows the deployments (`testbed-single` on the head, serving, and the
on-demand variant `up` puts beside the pair's on the worker, on standby); shows the head engine's wedge (SIGSTOP) within two live
refreshes of the gateway reading the supervisor's verdict; runs a restart of the head's deployment and
a wake and a stop back to standby of the worker's, each journalled by the head agent with the admin
key's name; refuses an action without the CSRF token, and one from a key that is not an admin's; axe-core
finds no serious violation.

Cost: no engine start of its own (the pair serves; the standby is only registered), the head's restart after the verdict (the console's restart is asked
while that one starts, so the two share one wait), and a start on demand on the worker stopped back to
standby as soon as it is starting (never waited for); the standby is taken down at the end. Every wait is on
a condition.
"""

from __future__ import annotations

import json
import time

import httpx

from tests import console_browser
from tests.integration.helpers import HEAD, HEAD_LAN, WORKER, journal, sup_state, wait_for

SINGLE, ON_DEMAND = "testbed-single", "testbed-single-od"  # test_gateway's (its profiles folder holds the latter)
HEAD_KEY, OD_KEY = f"{SINGLE}@{HEAD}", f"{ON_DEMAND}@{WORKER}"
GW = f"http://{HEAD_LAN}:4000"
OD_C = "sparkcluster-testbed-d1-head"  # the standby's head container on the worker (slot 1: the pair's holds 0)


def added(sc, environ: dict, *args: str) -> str:
    res = sc("gateway", "keys", "add", *args, env=environ)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.strip().splitlines()[-1]


def signs_in(key: str) -> bool:
    return httpx.post(f"{GW}/console/login", data={"key": key}, timeout=5).status_code == 303


def od_journal(testbed) -> list[dict]:
    """The standby's supervisor journal: its head container on the worker, in slot 1 beside the pair's."""
    out = testbed.sh(WORKER, f"docker exec {OD_C} cat /var/log/sparkcluster/journal.jsonl", check=False).stdout
    return [json.loads(x) for x in out.splitlines() if x.strip()]


def state(key: str) -> str:
    from tests.integration.test_gateway import routes

    return routes()[key]["reason"]


def console_on_the_pair(testbed, sc, env) -> None:
    """With test_gateway's pair serving: the on-demand variant beside the worker's, on standby, the
    gateway's routes for all three, then the console's cases; the standby taken down at the end."""
    from tests.integration.test_gateway import routes

    standby = sc("up", "--profile", ON_DEMAND, "--node", WORKER, "--beside", env=env, timeout=600)
    assert standby.returncode == 0 and "on standby" in standby.stdout, standby.stdout + standby.stderr
    up = sc("gateway", "up", env=env, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    owner = added(sc, env, "owner", "--admin")
    viewer = added(sc, env, "viewer")
    # the gateway reads its key file again within a poll
    assert wait_for(lambda: signs_in(owner) and signs_in(viewer), 10, step=0.5)
    assert wait_for(lambda: routes()[HEAD_KEY]["in_rotation"], 60, step=0.5), routes()
    pids = testbed.sh(HEAD, "pgrep -f 'VLLM::[E]ngineCore' || true").stdout.split()
    assert pids, testbed.sh(HEAD, "ps -eo pid,args").stdout
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
            assert page.is_visible(f"tr[data-deployment='{OD_KEY}']")
            assert console_browser.serious(page) == []
            assert wait_for(lambda: console_browser.refreshes(page) >= 1, 10, step=0.2)

            # the head's engine stopped: its wedge on the page within two refreshes of the gateway's verdict
            testbed.sh(HEAD, "kill -STOP " + " ".join(pids))
            assert wait_for(lambda: not routes()[HEAD_KEY]["in_rotation"], 180, step=0.25), routes()
            seen_at = console_browser.refreshes(page)
            assert wait_for(lambda: "wedged" in page.inner_text("#deployments"), 10, step=0.2)
            assert console_browser.refreshes(page) - seen_at <= 2, (seen_at, console_browser.refreshes(page))
            testbed.sh(HEAD, "kill -CONT " + " ".join(pids) + " 2>/dev/null || true", check=False)

            # the console's restart, asked as soon as the supervisor's own restart starts the engine again
            # (offered while an engine runs: starting or serving)
            row = f"tr[data-deployment='{HEAD_KEY}']"
            verdict_at = time.time()
            assert wait_for(
                lambda: (st := sup_state(testbed)).get("state") == "starting" and st.get("since", 0) > verdict_at - 5,
                300,
                step=0.5,
            ), sup_state(testbed)
            page.wait_for_selector(f"{row} a.act:text('Restart')", timeout=30_000)
            page.click(f"{row} a.act:text('Restart')")
            assert "POST /restart" in page.inner_text("ol.plan")
            page.click("button.danger")
            assert "asked" in page.inner_text("[role=status]"), page.inner_text("main")
            assert wait_for(
                lambda: any(
                    e["event"] == "console: restart" and e.get("by") == "owner" for e in journal(testbed, HEAD)
                ),
                30,
            ), journal(testbed, HEAD)[-10:]

            # the standby: woken, then stopped back as soon as it starts
            row = f"tr[data-deployment='{OD_KEY}']"
            page.click(f"{row} a.act:text('Wake')")
            page.click("button.danger")
            page.wait_for_selector(f"{row} a.act:text('Stop to standby')", timeout=120_000)
            page.click(f"{row} a.act:text('Stop to standby')")
            page.click("button.danger")
            assert wait_for(lambda: "on standby" in state(OD_KEY), 120, step=0.5), routes()
            said = [e for e in od_journal(testbed) if e["event"] == "console: standby"]
            assert said and said[-1]["by"] == "owner", od_journal(testbed)[-10:]

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
        assert sum(e["event"] == "console: restart" for e in journal(testbed, HEAD)) == 1
        events = [json.loads(x) for x in sc("gateway", "events", "--json", "--last", "0", env=env).stdout.splitlines()]
        acts = [e for e in events if e.get("event") == "console action"]
        assert {(e["action"], e["key"]) for e in acts} >= {
            ("restart", "owner"),
            ("wake", "owner"),
            ("standby", "owner"),
        }
        assert wait_for(lambda: routes()[HEAD_KEY]["in_rotation"], 300, step=1), routes()
    finally:
        testbed.sh(HEAD, "kill -CONT " + " ".join(pids) + " 2>/dev/null || true", check=False)
        t = time.time()
        sc("down", "--profile", ON_DEMAND, env=env)
        print(f"down of the standby: {time.time() - t:.0f}s")
