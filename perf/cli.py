"""sparkcluster's CLI as a user runs it, timed: a fresh `python -m sparkcluster` process each time,
the testbed's inventory, secrets in a 0600 `.env`, its own state directory. Each invocation keeps
its stderr lines with their arrival times (the stage lines `▸ image`, `✓ image` time the stages)
and the SSH connections each host's sshd logged meanwhile.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from perf import testbed

REPO = Path(__file__).resolve().parents[1]


@dataclass
class CliRun:
    """One finished CLI process: exit status, wall time (process start to exit), output."""

    args: tuple
    rc: int
    t0: float
    t1: float
    stdout: str
    lines: list[tuple[float, str]]  # stderr lines with their arrival time (time.time())
    conns: dict[str, int] = field(default_factory=dict)  # SSH connections per host, from sshd logs

    @property
    def wall(self) -> float:
        return self.t1 - self.t0

    @property
    def stderr(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def at(self, prefix: str) -> float | None:
        """Arrival time of the first stderr line that starts with prefix."""
        for t, line in self.lines:
            if line.lstrip().startswith(prefix):
                return t
        return None


class CLI:
    def __init__(self, tb, workdir: Path, hosts: tuple[str, ...] = testbed.HOSTS, inventory: Path | None = None):
        self.tb, self.hosts = tb, hosts
        self.inventory = inventory or tb.inventory  # another inventory of the same testbed (perf/weights_scale)
        env_file = workdir / ".env"
        env_file.write_text(f"VLLM_API_KEY={testbed.API_KEY}\nHF_TOKEN={testbed.HF_TOKEN}\n")
        env_file.chmod(0o600)
        self.env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "HF_TOKEN")}
        self.env.update(
            {
                "SPARKCLUSTER_ENV_FILE": str(env_file),
                "XDG_STATE_HOME": str(workdir / "state"),
                "COLUMNS": "200",
                "PYTHONUNBUFFERED": "1",
            }
        )

    def argv(self, *args: str, python_flags: tuple[str, ...] = ()) -> list[str]:
        return [sys.executable, *python_flags, "-m", "sparkcluster", "--inventory", str(self.inventory), *args]

    def __call__(
        self,
        *args: str,
        check: bool = True,
        on_line=None,
        timeout: float = 600,
        python_flags: tuple[str, ...] = (),
        merged: bool = False,
    ) -> CliRun:
        """`merged`: stdout joins stderr, so its lines get arrival times too (`lines`; `stdout` stays empty)."""
        argv = self.argv(*args, python_flags=python_flags)
        before = {h: self.tb.connections_logged(h) for h in self.hosts}
        out: list[str] = []
        lines: list[tuple[float, str]] = []
        t0 = time.time()
        p = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=str(REPO),
            bufsize=1,
        )
        reader = threading.Thread(target=lambda: out.append("" if merged else p.stdout.read()), daemon=True)
        reader.start()
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        try:
            for line in p.stdout if merged else p.stderr:
                lines.append((time.time(), line.rstrip("\n")))
                if on_line:
                    on_line(line, p)
            rc = p.wait()
        finally:
            timer.cancel()
        t1 = time.time()
        reader.join()
        time.sleep(0.05)  # sshd writes its log line at authentication; this is long after, but be sure
        r = CliRun(args, rc, t0, t1, "".join(out), lines)
        r.conns = {h: self.tb.connections_logged(h) - before[h] for h in self.hosts}
        if check and rc != 0:
            raise SystemExit(f"bench: sparkcluster {' '.join(args)} exited {rc}\n{r.stdout}\n{r.stderr}")
        return r
