"""Stopping a process group this agent started (`vllm serve`, a rank): SIGTERM, then SIGKILL after
the grace; SIGCONT after each, since a stopped (SIGSTOP) process acts on neither until it runs.
Standard library only: shipped into the containers with the rest of node/."""

from __future__ import annotations

import os
import signal
import subprocess

from .contract import STOP_KILL_WAIT_S


def stop_group(proc: subprocess.Popen, grace_s: float, kill_wait_s: float = STOP_KILL_WAIT_S) -> int | None:
    """Ends `proc`'s process group (started with start_new_session); returns its exit status."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        try:
            os.killpg(proc.pid, sig)
            os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()
