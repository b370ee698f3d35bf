"""The web console in Chromium (tests/console_browser: Debian's package through Playwright), against the
gateway on loopback with fixture data (console_fakes; no testbed): the page asks for a key and refuses a
wrong one, shows both deployments, shows a new verdict within two live refreshes of the gateway reading
it, runs a restart and a standby's wake and stop through confirm pages, refuses a forged action, works
by keyboard and on a phone's width, and axe-core finds no serious violation on any page."""

from __future__ import annotations

import time

import pytest
from console_fakes import ADMIN_KEY, TOKEN_A, TOKEN_B, USER_KEY, start, until

from sparkcluster.node import contract
from tests import console_browser

pytestmark = pytest.mark.skipif(console_browser.missing() is not None, reason=console_browser.missing() or "")
A, B = "reasoner@spark-a+spark-b", "vision@spark-c"


@pytest.fixture
def cons(tmp_path):
    c = start(tmp_path)
    yield c
    c.stop()


@pytest.fixture
def chromium():
    with console_browser.browser() as b:
        yield b


def test_the_console_in_chromium(cons, chromium):
    page = chromium.new_page()
    page.goto(f"{cons.url}/console")
    assert page.url.endswith("/console/login") and page.is_visible("#key")
    assert console_browser.serious(page) == []
    console_browser.shot(page, "sign-in")
    page.fill("#key", "not-a-key")
    page.click("button[type=submit]")
    assert "not one of this gateway" in page.inner_text("[role=alert]")

    console_browser.sign_in(page, cons.url, ADMIN_KEY)
    page.wait_for_selector(f"tr[data-deployment='{A}']")
    assert page.is_visible(f"tr[data-deployment='{B}']")
    until(lambda: console_browser.refreshes(page) >= 1, what="the live stream's first update")
    assert console_browser.serious(page) == []
    console_browser.shot(page, "cluster")

    # a verdict: shown within two live refreshes of the gateway reading it
    cons.a.causes.append({"ts": time.time(), "kind": "wedged", "cause": "rank 0 made no progress for 30s"})
    cons.a.state = contract.RESTARTING
    until(lambda: any(r.key == A and not r.up for r in cons.gw.table.routes), what="the gateway to read the verdict")
    seen_at = console_browser.refreshes(page)
    until(lambda: "rank 0 made no progress" in page.inner_text("#deployments"), what="the verdict on the page")
    assert console_browser.refreshes(page) - seen_at <= 2
    cons.a.state, cons.a.since = contract.SERVING, time.time()  # serving again after the verdict

    # restart: confirmed in the dry run's words, sent with the key's name
    page.wait_for_selector(f"tr[data-deployment='{A}'] a.act:text('Restart')")
    page.click(f"tr[data-deployment='{A}'] a.act:text('Restart')")
    assert "POST /restart" in page.inner_text("ol.plan")
    assert console_browser.serious(page) == []
    console_browser.shot(page, "confirm")
    page.click("button.danger")
    assert "restart of " + A in page.inner_text("[role=status]")
    assert cons.a.asked == [("restart", TOKEN_A, "owner")]

    # a standby: woken, then stopped back
    page.click(f"tr[data-deployment='{B}'] a.act:text('Wake')")
    page.click("button.danger")
    assert cons.b.wakes == [TOKEN_B]
    cons.b.state = contract.SERVING
    page.goto(f"{cons.url}/console")
    page.wait_for_selector(f"tr[data-deployment='{B}'] a.act:text('Stop to standby')")
    page.click(f"tr[data-deployment='{B}'] a.act:text('Stop to standby')")
    page.click("button.danger")
    assert cons.b.asked == [("standby", TOKEN_B, "owner")]

    # a forged action (no CSRF token) from the page itself is refused
    status = page.evaluate(
        "fetch('/console/action', {method: 'POST', headers: {'content-type': 'application/x-www-form-urlencoded'},"
        f" body: 'action=restart&deployment={A}'}}).then(r => r.status)"
    )
    assert status == 403 and len(cons.a.asked) == 1

    # the model's page and the journal
    page.goto(f"{cons.url}/console/model/reasoner")
    until(lambda: " ms" in page.inner_text("#figures"), what="the engine's figures between two reads")
    assert "25.0 %" in page.inner_text("#figures")
    assert console_browser.serious(page) == []
    console_browser.shot(page, "model")
    page.goto(f"{cons.url}/console/events?kind=console")
    assert "console: restart" in page.inner_text("table.events")
    assert console_browser.serious(page) == []
    console_browser.shot(page, "events")

    # speed (the bench runs, as charts, with the standing and its causes) and upgrades
    page.goto(f"{cons.url}/console/speed")
    assert page.locator("svg[role=img]").count() == 1 and "NCCL chose Socket" in page.inner_text("main")
    assert console_browser.serious(page) == []
    console_browser.shot(page, "speed")
    page.goto(f"{cons.url}/console/upgrades")
    assert "rolled back" in page.inner_text("main")
    assert console_browser.serious(page) == []


def test_a_user_key_by_keyboard_and_on_a_phone(cons, chromium):
    page = chromium.new_page(viewport=console_browser.PHONE)
    page.goto(f"{cons.url}/console/login")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip"
    page.focus("#key")
    page.keyboard.type(USER_KEY)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{cons.url}/console")
    assert page.is_visible(f"tr[data-deployment='{A}']") and page.locator("a.act").count() == 0
    assert not console_browser.overflows(page)
    assert console_browser.serious(page) == []
    console_browser.shot(page, "phone")
    page.goto(f"{cons.url}/console/events")
    assert "only an admin key" in page.inner_text("[role=alert]")
