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
        # the engine listens only on the head's control address (engines_listen's default), where the
        # controller has no route: the load reaches it through the tests' door into the head's network
        self.endpoint = testbed.door("spark-head", self.prof.serve.port or self.inv.cluster.api_port)
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
        """A healthy cluster that takes the bench's API key. One serving under another key (make
        demo writes a random one) is brought down, so the bench's `up` starts it with its own."""
        import httpx

        r = self.sc("status", "--json", check=False)
        try:
            healthy = json.loads(r.stdout).get("state") == "healthy"
        except ValueError:
            return False
        if not healthy:
            return False
        try:
            code = httpx.get(
                f"{self.endpoint}/v1/models", headers={"Authorization": f"Bearer {testbed.API_KEY}"}, timeout=10
            ).status_code
        except httpx.HTTPError:
            return False
        if code in (401, 403):
            print(f"bench: the cluster serves under another API key ({code}): down, up with the bench's", flush=True)
            self.sc("down", timeout=300)
            return False
        return code == 200


def standalone(name: str, description: str, measure, figures, argv: list[str] | None = None) -> int:
    """`python -m perf.<name>`: one family of figures on the testbed that is up, without the rest of
    `make bench`: the testbed's lock held, a session of its own, `measure(session)`, then the table
    of `figures(raw)` (each row with its budget and met or not) printed and written to
    perf/<name>.md. BENCH_REPS sets the repetitions where the family repeats."""
    import argparse
    import tempfile
    import time

    from perf.cli import REPO
    from perf.figures import die, render

    argparse.ArgumentParser(prog=f"python -m perf.{name}", description=description).parse_args(argv)
    if os.geteuid() != 0:
        die("the testbed needs root (run it as root, after make testbed-up)")
    with testbed.locked():
        started = time.time()
        tb = testbed.connect()
        with tempfile.TemporaryDirectory(prefix="sparkcluster-bench-") as wd:
            s = Session(tb, Path(wd))
            measure(s)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    figs = figures(s.raw)
    reps = max((len(f.values) for f in figs), default=s.reps)  # a family may repeat more than BENCH_REPS
    table = render(figs, s.details, when, reps)
    (REPO / "perf" / f"{name}.md").write_text(table)
    (REPO / "perf" / f"{name}.json").write_text(
        json.dumps({"when": when, "details": s.details, "raw": s.raw}, indent=2)
    )
    print(table)
    return 0
