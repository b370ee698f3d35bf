"""`status --watch` as a pipe, a file and a terminal see it, loopback only (a pair whose ports are
closed: every refresh finds both nodes unreachable at once). Off a terminal it printed nothing until
it exited (a `timeout` kill left 0 bytes); Ctrl-C exited 4, not README's 130; rich's highlighter
coloured the digits and addresses of every line."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import threading
import time

import click
import pytest

from sparkcluster.status.status import ClusterStatus, NodeStatus
from tests.unit.test_first_hour import home, pair_toml, write  # noqa: F401 (fixture)
from tests.unit.test_newcomer import closed_port

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def watch(home, out, env: dict | None = None) -> subprocess.Popen:  # noqa: F811
    inv = write(home, "pair.toml", pair_toml(closed_port(), "connect_timeout = 1\nconnect_attempts = 1"))
    return subprocess.Popen(
        [sys.executable, "-m", "sparkcluster", "-i", str(inv), "status", "--watch", "--interval", "0.5"],
        cwd=home["cwd"],
        env={**home["env"], **(env or {})},
        stdout=out,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(check, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def interrupted(home, env: dict) -> tuple[bool, int, str, str]:  # noqa: F811
    """The watch read as it draws, then one SIGINT once it has drawn twice: (drawn, rc, out, err)."""
    p = watch(home, subprocess.PIPE, env)
    chunks: list[str] = []
    try:
        threading.Thread(target=lambda: chunks.extend(iter(lambda: p.stdout.read(1), "")), daemon=True).start()
        drawn = wait_for(lambda: ANSI.sub("", "".join(chunks)).count("cluster pair: unreachable") >= 2)
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    return drawn, rc, "".join(chunks), p.stderr.read()


def test_off_a_terminal_each_refresh_is_a_plain_frame_written_at_once(home):  # noqa: F811
    """stdout a file, the watch then killed as `timeout` kills it (SIGTERM, no chance to flush): every
    frame drawn so far is in the file, plain text."""
    path = home["dir"] / "watch.txt"
    with path.open("w") as f:
        p = watch(home, f)
        try:
            drawn = wait_for(lambda: path.read_text().count("cluster pair: unreachable") >= 2)
        finally:
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=30)
    text = path.read_text()
    assert drawn and p.returncode == -signal.SIGTERM, (p.returncode, text)
    frames = [f for f in re.split(r"^--- \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", text, flags=re.M) if f.strip()]
    assert len(frames) >= 2 and all("spark-a  -          unreachable" in f for f in frames), text
    assert not ANSI.search(text), repr(text[:300])


def test_ctrl_c_ends_the_watch_with_130_on_a_pipe_and_on_a_terminal(home):  # noqa: F811
    """README's exit codes: 130 Ctrl-C, whatever the cluster was (here: unreachable, which a plain
    `status` ends with 4). On a terminal (as rich takes one: TTY_COMPATIBLE, the way the lifecycle test
    drives it) the table is drawn in place with its state colours and no other: an address or a number
    is not coloured by rich's highlighter."""
    terminal = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "TERM": "xterm-256color", "COLUMNS": "200"}
    for env in ({}, terminal):
        drawn, rc, out, err = interrupted(home, env)
        assert drawn, (env, out[-2000:], err)
        assert rc == 130 and "interrupted" in err and "Traceback" not in err, (env, rc, err)
        if env:
            assert ANSI.search(out), "drawn in place, with the state's colour"
            assert "nothing listens on 127.0.0.1:" in out and "(after 1 attempt(s))" in out, repr(out[-1500:])
        else:
            assert not ANSI.search(out)


def test_the_full_screen_view_is_interrupted_by_ctrl_c_and_quit_by_q():
    """Ctrl-C in the Textual view (where the terminal sends it as a key, not a signal) interrupts;
    q quits, ending as a plain `status` would on what the view showed last (unreachable: 4)."""
    from sparkcluster.cli import status_cmd
    from sparkcluster.status import live

    unreachable = [ClusterStatus("pair", "unreachable", [NodeStatus("spark-a", state="unreachable")])]

    async def drive(key: str) -> live.LiveView:
        app = live.LiveView(lambda: unreachable, interval=0.05)
        async with app.run_test(size=(100, 30)) as pilot:
            for _ in range(100):
                await pilot.pause(0.05)
                if app.refreshes:
                    break
            await pilot.press(key)
            await pilot.pause(0.05)
        return app

    app = asyncio.run(drive("ctrl+c"))
    assert app.interrupted and app.last == unreachable
    app = asyncio.run(drive("q"))
    assert not app.interrupted
    with pytest.raises(click.exceptions.Exit) as e:
        status_cmd.watch_ended(app.last)
    assert e.value.exit_code == 4
