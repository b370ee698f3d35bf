"""The lifecycle an engine's supervisor (node/supervisor) and a service's (node/service_supervisor)
share: one child in a process group of its own, its output appended to a log; its state and since
when, in the state file at every change and every look; its stop, which the state file announces
before it blocks and which removes the child's record; the wait for memory before a restart; and,
after the container restarted, the restarts and final verdict that carry over. Each supervisor
keeps its own start, its own looks and verdicts, and what its state file holds beside the fields
written here.

Standard library only: shipped into the container with the rest of node/."""

from __future__ import annotations

import os
import subprocess
import time

from .contract import FINAL, IDLE, MEMORY_WAIT, Policy, Supervised
from .journal import Journal, write_json
from .procgroup import stop_group
from .verdict import memory_wait


def spawn(argv: list[str], log_path: str, mark: str, env: dict | None = None) -> subprocess.Popen:
    """Starts `argv` in a process group of its own (stop_group stops the whole group), its output
    appended to `log_path` after a line that marks this start: `mark` and the UTC time."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"{mark} {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode())
        log.flush()
        return subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


class Lifecycle:
    """The base of both supervisors. A subclass provides `clock()` (the time, in seconds since the
    epoch), `policy()` (its bounds) and `state_fields(policy)` (what its state file holds beside the
    shared fields), and names its child in the journal (`child_name`: "<child_name> started",
    "<child_name> stopped"). The state file and the child's record are the files at `state_path`
    and `record_path`."""

    child_name = ""

    def __init__(self, cfg: dict, journal: Journal, state_path: str, record_path: str):
        self.cfg, self.journal = cfg, journal
        self.state_path, self.record_path = state_path, record_path
        self.proc: subprocess.Popen | None = None
        self.generation: str | None = None
        self.state, self.since = IDLE, self.clock()
        self.restarts: list[float] = []
        self.causes: list[dict] = []
        self.next_start = 0.0
        self.first_start = True  # the first start is not retried: a wrong argument or flag stays visible
        self.stopping: dict | None = None  # while stop() blocks: why, and its grace
        self.memory_wait_since: float | None = None  # a restart waiting for memory to come back
        # what node/metrics exports beside the state file: counters since this container started,
        # the last probe (a service's: its last health answer), the last look, every node's
        # MemAvailable as last read (None: unanswered)
        self.counts: dict[str, int] = {}
        self.last_probe_s: float | None = None
        self.last_probe_ok: bool | None = None
        self.last_look: float | None = None
        self.memory_seen: dict[str, int | None] = {}

    def clock(self) -> float:
        raise NotImplementedError

    def policy(self) -> Policy:
        raise NotImplementedError

    def state_fields(self, policy: Policy) -> dict:
        raise NotImplementedError

    # -- state
    def set_state(self, state: str, **detail) -> None:
        """Enters `state` (journalled with `detail` when it changes), then saves the state file."""
        if state != self.state:
            self.state, self.since = state, self.clock()
            self.journal.write(f"state: {state}", **detail)
        self.save()

    def save(self) -> None:
        """Writes the state file: the shared fields, this supervisor's (state_fields), and what a
        stop in progress is doing. Restarts older than the restart window are dropped first."""
        policy = self.policy()
        now = self.clock()
        self.restarts = [t for t in self.restarts if now - t < policy.restart_window_s]
        write_json(
            self.state_path,
            {
                "state": self.state,
                "since": self.since,
                "updated": now,
                "generation": self.generation,
                "pid": self.proc.pid if self.proc else None,
                "restarts": self.restarts,
                "causes": self.causes[-5:],
                **self.state_fields(policy),
                **({"stopping": self.stopping} if self.stopping else {}),
            },
        )

    def resume(self, before: Supervised | None) -> bool:
        """After the container restarted (a reboot, a crash), the state file it left (`before`): for
        the same generation, its restarts and a final verdict carry over, so a reboot does not reset
        the bound and a supervisor stopped for good stays stopped. True when they did."""
        if before is None or before.generation != self.generation:
            return False
        self.restarts, self.causes = list(before.restarts), list(before.causes)
        self.first_start = False
        if before.kind in FINAL:
            self.state = before.kind
        self.journal.write("resumed after the container restarted", state=self.state, restarts=len(self.restarts))
        return True

    def count(self, key: str) -> None:
        self.counts = {**self.counts, key: self.counts.get(key, 0) + 1}  # a new dict: /metrics reads it

    # -- the child
    def stop(self, why: str, verdict: bool = False) -> None:
        """Stops the child: SIGTERM to its process group, then SIGKILL after the grace
        (verdict_grace_s after a verdict, stop_grace_s for an orderly stop). The state file says so
        before it blocks, so `status` and the gateway read a supervisor that is acting, not a stale
        one. The child's record goes with it."""
        if self.proc is None:
            return
        policy = self.policy()
        grace = float(policy.verdict_grace_s if verdict else policy.stop_grace_s)
        pid = self.proc.pid
        self.stopping = {"why": why, "grace_s": grace}
        self.save()
        try:
            code = self.halt(grace)
        finally:
            self.stopping = None
        self.journal.write(f"{self.child_name} stopped", pid=pid, why=why, exit=code, grace_s=grace)
        self.proc = None
        try:
            os.unlink(self.record_path)  # a stale record would name a PID that may be reused
        except FileNotFoundError:
            pass

    def halt(self, grace: float) -> int | None:
        """Ends the child, SIGKILL after `grace`; its exit status. A process group here; a service's
        supervisor ends a container instead (node/service_supervisor)."""
        return stop_group(self.proc, grace)

    # -- the wait for memory before a restart
    def memory_wait_step(self, covered: bool, seen: dict, policy: Policy, now: float) -> str:
        """verdict.memory_wait's step at `now`, acted on but for "give-up", which is the caller's:
        "go" ends a wait ("memory came back"), "wait" starts one (journalled once) and sets the
        state MEMORY_WAIT with what was `seen`."""
        step = memory_wait(self.memory_wait_since, now, covered, policy)
        if step == "go":
            if self.memory_wait_since is not None:
                self.journal.write("memory came back", waited_s=round(now - self.memory_wait_since, 1), seen=seen)
            self.memory_wait_since = None
        elif step == "wait":
            if self.memory_wait_since is None:
                self.memory_wait_since = now
                self.journal.write("waiting for memory to come back", seen=seen, bound_s=policy.memory_wait_s)
            self.set_state(MEMORY_WAIT, seen=seen)
        return step
