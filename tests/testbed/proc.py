"""Running commands on the controller for the testbed: one error type, one log line format."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time


class TestbedError(RuntimeError):
    __test__ = False  # not a pytest class


def log(msg: str) -> None:
    print(f"[testbed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, check=True, input=None, timeout=None, capture=True, env=None, cwd=None, text=True):
    if isinstance(cmd, str):
        cmd = ["bash", "-c", cmd]
    p = subprocess.run(
        cmd,
        input=input,
        timeout=timeout,
        env=env,
        cwd=cwd,
        text=text,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
    )
    if check and p.returncode != 0:
        raise TestbedError(
            f"command failed ({p.returncode}): {cmd if isinstance(cmd, str) else shlex.join(cmd)}\n"
            f"stdout: {(p.stdout or '')[-2000:]}\nstderr: {(p.stderr or '')[-2000:]}"
        )
    return p
