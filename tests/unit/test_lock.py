"""The cluster lock command, run locally with bash (LOCK_DIR in a temporary folder), and the
teardown shell commands that stop `vllm serve` by PID (run locally against real processes)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import threading
import time

import pytest
from conftest import StderrLines

from sparkcluster.deployment import teardown
from sparkcluster.remote import lock

HOLDER = "alice@ctl pid 42 since 2026-11-22T03:00:00Z (up --profile 'x' \"y\" $(touch pwned) `id` ; exit 3)"


needs_flock = pytest.mark.skipif(shutil.which("flock") is None, reason="flock (util-linux) not installed")


@pytest.fixture
def lockdir(tmp_path, monkeypatch):
    d = tmp_path / "run"
    monkeypatch.setattr(lock, "LOCK_DIR", str(d))
    return d


class Holder(StderrLines):
    """A local run of the lock command; it holds the lock until its stdin closes."""

    def __init__(self, cluster: str, holder: str, cwd, as_uid: int | None = None):
        pre = [] if as_uid is None else ["setpriv", f"--reuid={as_uid}", f"--regid={as_uid}", "--clear-groups"]
        super().__init__(
            [*pre, "bash", "-c", lock.lock_command(cluster, holder)],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )

    def release(self) -> int:
        self.p.stdin.close()
        return self.wait()

    def kill(self):
        """Like a controller killed mid-run: the shell dies and our end of its stdin closes."""
        super().kill()
        if not self.p.stdin.closed:
            self.p.stdin.close()


@needs_flock
def test_lock_is_exclusive_and_released_with_stdin(lockdir, tmp_path):
    first = Holder("pair", HOLDER, tmp_path)
    try:
        first.wait_for("@@locked")
        time.sleep(0.2)
        assert first.p.poll() is None, "the holder blocks on its stdin"

        t0 = time.monotonic()
        second = Holder("pair", "bob@other pid 7 since now (down)", tmp_path)
        assert second.wait() == lock.BUSY == 75
        assert time.monotonic() - t0 < 3
        held = second.wait_for("@@held ")
        assert held == f"@@held {HOLDER}"
        assert "@@locked" not in second.lines

        assert first.release() == 0
        third = Holder("pair", "carol@ctl pid 9 since later (up)", tmp_path)
        try:
            third.wait_for("@@locked")
            assert (lockdir / f"pair.holder.{os.getuid()}").read_text() == "carol@ctl pid 9 since later (up)\n"
        finally:
            assert third.release() == 0
    finally:
        first.kill()
    assert not (tmp_path / "pwned").exists()


@needs_flock
def test_holder_text_is_stored_verbatim(lockdir, tmp_path):
    first = Holder("pair", HOLDER, tmp_path)
    try:
        first.wait_for("@@locked")
        assert (lockdir / f"pair.holder.{os.getuid()}").read_text() == HOLDER + "\n"
    finally:
        first.kill()
    assert not (tmp_path / "pwned").exists()


@needs_flock
def test_killed_holder_releases(lockdir, tmp_path):
    first = Holder("pair", HOLDER, tmp_path)
    first.wait_for("@@locked")
    first.kill()  # like a controller whose SSH connection dropped
    second = None
    deadline = time.monotonic() + 5  # flock's children see EOF and exit right after
    while time.monotonic() < deadline:
        second = Holder("pair", "bob (up)", tmp_path)
        if second.wait_for("@@", 5).startswith("@@locked"):
            break
        second.wait()
        time.sleep(0.05)
    try:
        second.wait_for("@@locked")
    finally:
        assert second.release() == 0


@needs_flock
def test_locks_are_per_cluster(lockdir, tmp_path):
    a = Holder("pair", "a (up)", tmp_path)
    b = Holder("other", "b (up)", tmp_path)
    try:
        a.wait_for("@@locked")
        b.wait_for("@@locked")
    finally:
        a.kill()
        b.kill()


@needs_flock
def test_lock_dir_not_writable_is_not_busy(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(lock, "LOCK_DIR", str(blocker / "sub"))  # mkdir -p fails
    h = Holder("pair", "x", tmp_path)
    rc = h.wait()
    assert rc not in (0, lock.BUSY)
    assert not any(x.startswith(("@@locked", "@@held")) for x in h.lines)


def test_lock_command_quotes_the_holder():
    cmd = lock.lock_command("pair", HOLDER)
    assert shlex.quote(HOLDER) in cmd
    assert "/tmp/sparkcluster/pair.lock" in cmd


def test_holder_text_names_the_command():
    text = lock.holder_text("up --profile testbed")
    assert text.endswith("(up --profile testbed)")
    assert f"pid {os.getpid()} " in text


# ---- teardown: stop vllm serve by PID -----------------------------------------------------------


def reaped(argv: list[str]) -> subprocess.Popen:
    """A child whose exit is reaped at once (as the container's shim reaps an exec'd process)."""
    p = subprocess.Popen(argv, start_new_session=True)
    threading.Thread(target=p.wait, daemon=True).start()
    return p


def run_kill(pid: int, grace: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", teardown.kill_command(pid, grace)], capture_output=True, text=True, timeout=30)


def test_kill_command_term_stops_a_plain_process():
    p = reaped(["sleep", "60"])
    try:
        time.sleep(0.1)
        t0 = time.monotonic()
        res = run_kill(p.pid, 5.0)
        assert res.returncode == 0
        assert res.stdout.strip() == "stopped"
        assert time.monotonic() - t0 < 4
        assert p.wait(5) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def test_kill_command_kills_a_process_that_ignores_term():
    p = reaped(["bash", "-c", 'trap "" TERM; sleep 60'])
    try:
        time.sleep(0.3)  # let bash install the trap
        t0 = time.monotonic()
        res = run_kill(p.pid, 0.5)
        took = time.monotonic() - t0
        assert res.returncode == 0
        assert res.stdout.strip() == "killed"
        assert 0.4 < took < 5
        assert p.wait(5) == -signal.SIGKILL
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the orphaned sleep, too
        except ProcessLookupError:
            pass


def test_kill_command_on_a_gone_pid_is_quiet():
    p = subprocess.Popen(["true"])
    p.wait()
    res = run_kill(p.pid, 0.5)
    assert res.returncode == 0
    assert res.stdout == ""


def test_kill_command_pid_must_be_an_integer():
    with pytest.raises(ValueError):
        teardown.kill_command("1; reboot", 1.0)  # type: ignore[arg-type]
    assert "kill -TERM 123 " in teardown.kill_command(123, 30)


def test_purge_gcs_command():
    cmd = teardown.purge_gcs_command(6379)
    assert cmd == ("rm -rf /tmp/ray/session_* /tmp/ray/session_latest 2>/dev/null; ss -Htlnp '( sport = :6379 )'")
    assert "'( sport = :6400 )'" in teardown.purge_gcs_command(6400)
    with pytest.raises(ValueError):
        teardown.purge_gcs_command("6379 ); reboot; (")  # type: ignore[arg-type]


@pytest.fixture
def request_cleanup():
    paths: list = []
    yield paths
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


needs_two_accounts = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root to run the lock as two different accounts (setpriv)",
)


@needs_flock
@needs_two_accounts
@pytest.mark.parametrize("first_uid,second_uid", [(0, 1000), (1000, 0), (1000, 1001)])
def test_two_accounts_exclude_each_other(tmp_path, monkeypatch, first_uid, second_uid, request_cleanup):
    """Two different SSH accounts of one cluster share the lock: whoever made /tmp/sparkcluster (and
    the lock directory in it) first, the other opens it, holds it, and names the holder when it is
    held. A sticky world-writable parent as /tmp is, with fs.protected_regular's rule for regular files
    not applying to the lock directory."""
    import tempfile
    from pathlib import Path

    # under /tmp itself: pytest's own folders are closed to other accounts
    top = Path(tempfile.mkdtemp(prefix="sc-lock-"))
    top.chmod(0o1777)
    request_cleanup.append(top)
    monkeypatch.setattr(lock, "LOCK_DIR", str(top / "sparkcluster"))
    for turn in range(2):  # the second round: both holder files exist, each owned by its account
        a = Holder("pair", f"first {turn}", tmp_path, as_uid=first_uid)
        try:
            a.wait_for("@@locked")
            b = Holder("pair", f"second {turn}", tmp_path, as_uid=second_uid)
            assert b.wait() == lock.BUSY
            assert b.wait_for("@@held ") == f"@@held first {turn}"
        finally:
            a.kill()
        a.wait()
        b = Holder("pair", f"second {turn}", tmp_path, as_uid=second_uid)
        try:
            b.wait_for("@@locked")
            c = Holder("pair", "third", tmp_path, as_uid=first_uid)
            assert c.wait() == lock.BUSY
            assert c.wait_for("@@held ") == f"@@held second {turn}"
        finally:
            b.kill()
        b.wait()
    assert oct((top / "sparkcluster").stat().st_mode & 0o7777) == "0o1777"


def test_a_holder_that_ran_here_and_ended_is_named_as_ended():
    """After a cable is pulled mid-run the node keeps the dead run's session (and its lock) until the
    controller's close reaches it; the fix says that run ended rather than "wait for it to finish"."""
    import getpass
    import socket
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    me = f"{getpass.getuser()}@{socket.gethostname()}"
    ended = lock.held_fix(f"{me} pid {gone.pid} since 2026-11-28T11:47:18Z (up --profile p)", "spark-worker")
    assert f"pid {gone.pid} is gone here" in ended and "spark-worker" in ended
    alive = lock.held_fix(f"{me} pid {os.getpid()} since 2026-11-28T11:47:18Z (up)", "spark-worker")
    assert alive == "wait for that run to finish (the lock goes with its SSH connection)"
    elsewhere = lock.held_fix(f"ann@laptop pid {gone.pid} since 2026-11-28T11:47:18Z (up)", "spark-worker")
    assert elsewhere == alive
