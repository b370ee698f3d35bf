"""One `make bench` run's shared state: the testbed, the CLI, the inventory and profile as
sparkcluster loads them, the cluster image, the byte counters, and the raw repetitions every family
module (doctor, up, image, ...) records into (`rec`), from which perf/results.json and the table
are made.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from perf import testbed
from perf.cli import CLI
from perf.counters import Sampler

PROFILE = "testbed"
REPS = int(os.environ.get("BENCH_REPS", "5"))


class Session:
    def __init__(self, tb, workdir: Path, reps: int = REPS):
        from sparkcluster import log
        from sparkcluster.config import inventory as inventories
        from sparkcluster.config import profile as profiles
        from sparkcluster.config.images import image_ref

        self.tb, self.workdir, self.reps = tb, workdir, reps
        self.hosts = testbed.HOSTS
        self.sc = CLI(tb, workdir)
        os.environ["XDG_STATE_HOME"] = str(workdir / "state-inprocess")  # the in-process debug log
        log.configure("warning")
        self.inv = inventories.load(tb.inventory)
        self.prof = profiles.load_profile(PROFILE)
        self.image = image_ref(self.inv, self.prof)
        self.head, self.worker = self.inv.head, self.inv.workers[0]
        self.endpoint = f"http://{testbed.lan_ip('spark-head')}:{self.prof.serve.port or self.inv.cluster.api_port}"
        self.sampler = Sampler(
            tb.pid("spark-worker"), self.worker.control_if, [testbed.lan_veth(h) for h in self.hosts]
        )
        self.raw: dict[str, list] = {}
        self.details: dict = {}
        self.floor_imports: dict[str, list[str]] = {}  # what each short command imports (perf/floors.py)

    def rec(self, key: str, value) -> None:
        self.raw.setdefault(key, []).append(value)

    def last(self, key: str):
        return self.raw[key][-1]

    def serving(self) -> bool:
        r = self.sc("status", "--json", check=False)
        try:
            return json.loads(r.stdout).get("state") == "healthy"
        except ValueError:
            return False
