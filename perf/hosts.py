"""What the bench reads on the hosts themselves: docker's and Ray's timestamps (the critical path of
`up` is timed by the hosts, not by the CLI), the serve record, what must not change when `up` finds
the cluster serving, and a readiness probe of the endpoint independent of `up`'s own polling.

Clocks: the testbed's hosts are namespaces of one machine, so their timestamps and the controller's
`time.time()` are one clock (on real Sparks: `facts.HostFacts.clock_offset`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime

import httpx

from perf import testbed


def rfc3339(ts: str) -> float:
    """Docker's RFC 3339 timestamps with nanoseconds -> epoch seconds."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", ts.strip())
    if not m:
        raise ValueError(ts)
    base = datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    return base.timestamp() + (float("0" + m.group(2)) if m.group(2) else 0.0)


def our_container(tb, host: str) -> str:
    names = tb.docker(host, "ps --filter label=org.sparkcluster.cluster=testbed --format '{{.Names}}'").stdout.split()
    if len(names) != 1:
        raise SystemExit(f"bench: expected one sparkcluster container on {host}, found {names}")
    return names[0]


def container_times(tb, host: str) -> dict[str, float]:
    """Created, started, and the moment its `ray start` said "Ray runtime started." (docker logs -t)."""
    name = our_container(tb, host)
    created, started = tb.docker(
        host, f"inspect --format '{{{{.Created}}}} {{{{.State.StartedAt}}}}' {name}"
    ).stdout.split()
    line = tb.sh(host, f"docker logs -t {name} 2>&1 | grep -m1 'Ray runtime started'", check=False).stdout.strip()
    if not line:
        raise SystemExit(f"bench: no 'Ray runtime started' in the log of {name} on {host}")
    return {"created": rfc3339(created), "started": rfc3339(started), "ray": rfc3339(line.split()[0])}


def serve_record(tb) -> dict:
    name = our_container(tb, "spark-head")
    return json.loads(tb.docker("spark-head", f"exec {name} cat /run/sparkcluster/serve.json").stdout)


def serving_identity(tb, hosts: tuple[str, ...] = testbed.HOSTS) -> dict:
    """What must not change when `up` finds the cluster already serving: container IDs on both
    hosts, the server's PID and that process's start time (so a reused PID is not mistaken)."""
    ids = {h: sorted(tb.docker(h, "ps -q --no-trunc").stdout.split()) for h in hosts}
    pid = serve_record(tb)["pid"]
    start = tb.sh("spark-head", f"cut -d' ' -f22 /proc/{int(pid)}/stat", check=False).stdout.strip()
    return {"containers": ids, "serve_pid": pid, "serve_pid_start": start}


class ReadyProbe:
    """Polls the endpoint every 50 ms from the controller: the first moment /health is 200 and a
    one-token completion succeeds, independent of up's own polling."""

    def __init__(self, base: str, model: str, api_key: str = testbed.API_KEY):
        self.base, self.model, self.api_key = base, model, api_key
        self.ready_at: float | None = None
        self.health_at: float | None = None
        self._stop = threading.Event()

    def __enter__(self) -> ReadyProbe:
        def loop():
            with httpx.Client(timeout=1.0) as c:
                while not self._stop.is_set() and self.ready_at is None:
                    try:
                        if c.get(f"{self.base}/health").status_code == 200:
                            if self.health_at is None:
                                self.health_at = time.time()
                            r = c.post(
                                f"{self.base}/v1/chat/completions",
                                timeout=30,
                                headers={"Authorization": f"Bearer {self.api_key}"},
                                json={
                                    "model": self.model,
                                    "max_tokens": 1,
                                    "messages": [{"role": "user", "content": "ping"}],
                                },
                            )
                            if r.status_code == 200:
                                self.ready_at = time.time()
                                return
                    except httpx.HTTPError:
                        pass
                    self._stop.wait(0.05)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
