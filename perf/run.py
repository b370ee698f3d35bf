"""`make bench` (python -m perf.run): sparkcluster's performance figures on the testbed.

Every figure is a ratio, a count or a duration measured in this run, the median of REPS
repetitions (default 5, `BENCH_REPS`), with min and max. Method per figure: bench/README.md.
Writes perf/results.json (git-ignored) and perf/results.md, and prints the table.

The whole run holds the testbed's cooperative lock (/tmp/sparkcluster-testbed.lock). It uses the
testbed's cluster as its own: it takes it down and up several times, removes the cluster image on
the worker (sparkcluster sends it again), and runs a throwaway second sshd on the worker's
control address for the save-ssh-load baseline, removed at the end. At the end the cluster is
left serving if it was serving at the start, down otherwise.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx

from perf import supervisor

REPO = Path(__file__).resolve().parents[1]
LOCK_PATH = "/tmp/sparkcluster-testbed.lock"
REPS = int(os.environ.get("BENCH_REPS", "5"))
PROFILE = "testbed"
API_KEY = "sk-testbed-4f9c1e2a7b"  # the testbed's test secrets (tests/integration/helpers.py)
HF_TOKEN = "hf_testbedTOKEN1234567890"
BASELINE_DIR = "/tmp/sparkcluster-bench-baseline"  # on each host (each host has a private /tmp)
BASELINE_PORT = 2222
RESULTS_JSON = REPO / "perf" / "results.json"
RESULTS_MD = REPO / "perf" / "results.md"
SAMPLE_S = 0.02  # counter sampling period
LINK_NOISE = 64 * 1024  # bytes on a link that are not a transfer (ARP, ND)


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr)
    sys.exit(2)


# --- the lock ------------------------------------------------------------------------------------


@contextmanager
def testbed_lock():
    with open(LOCK_PATH, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for the testbed lock ({LOCK_PATH}): another run is using the testbed")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- statistics ----------------------------------------------------------------------------------


@dataclass
class Figure:
    key: str
    title: str
    unit: str
    target: str  # human text
    values: list[float]
    ok: bool | None  # None: informational
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "title": self.title,
            "unit": self.unit,
            "target": self.target,
            "median": self.median,
            "min": min(self.values),
            "max": max(self.values),
            "n": len(self.values),
            "values": self.values,
            "met": self.ok,
            "note": self.note,
        }


def fmt(x: float, unit: str) -> str:
    if unit == "bytes":
        return f"{x:,.0f}"
    if unit == "MB/s":
        return f"{x:.1f}"
    if unit == "count":
        return f"{x:g}"
    if unit in ("s",):
        return f"{x:.2f}"
    return f"{x:.3f}"


# --- the testbed and the CLI ---------------------------------------------------------------------


def testbed():
    from tests.testbed.testbed import Testbed

    tb = Testbed()
    st = tb._state()
    if not st or st.get("phase") != "up":
        die("the testbed is not up: run `make testbed-up` first (then `make bench`)")
    problems = tb.problems()
    if problems:
        die(
            "the testbed is up but unhealthy:\n  "
            + "\n  ".join(problems)
            + "\nfix it (or ask whoever is using it) before `make bench`"
        )
    return tb


@dataclass
class Run:
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
    def __init__(self, tb, workdir: Path):
        self.tb = tb
        env_file = workdir / ".env"
        env_file.write_text(f"VLLM_API_KEY={API_KEY}\nHF_TOKEN={HF_TOKEN}\n")
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

    def __call__(self, *args: str, check: bool = True, on_line=None, timeout: float = 600) -> Run:
        argv = [sys.executable, "-m", "sparkcluster", "--inventory", str(self.tb.inventory), *args]
        before = {h: self.tb.connections_logged(h) for h in HOSTS}
        out: list[str] = []
        lines: list[tuple[float, str]] = []
        t0 = time.time()
        p = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env, cwd=str(REPO), bufsize=1
        )
        reader = threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True)
        reader.start()
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        try:
            for line in p.stderr:
                lines.append((time.time(), line.rstrip("\n")))
                if on_line:
                    on_line(line, p)
            rc = p.wait()
        finally:
            timer.cancel()
        t1 = time.time()
        reader.join()
        time.sleep(0.05)  # sshd writes its log line at authentication; this is long after, but be sure
        r = Run(args, rc, t0, t1, "".join(out), lines)
        r.conns = {h: self.tb.connections_logged(h) - before[h] for h in HOSTS}
        if check and rc != 0:
            raise SystemExit(f"bench: sparkcluster {' '.join(args)} exited {rc}\n{r.stdout}\n{r.stderr}")
        return r


HOSTS: tuple[str, ...] = ("spark-head", "spark-worker")


# --- counters ------------------------------------------------------------------------------------


def sysfs_bytes(ifname: str) -> int:
    base = Path("/sys/class/net") / ifname / "statistics"
    return int((base / "rx_bytes").read_text()) + int((base / "tx_bytes").read_text())


def netns_dev_bytes(pid: int, ifname: str) -> tuple[int, int]:
    """(rx, tx) of ifname in the network namespace of pid, read from the root namespace."""
    for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == ifname:
            f = rest.split()
            return int(f[0]), int(f[8])
    raise KeyError(ifname)


class Sampler:
    """Samples, every SAMPLE_S: the worker's control-link rx+tx (the head->worker path) and the
    controller-side LAN veths (everything between the controller and the hosts)."""

    def __init__(self, worker_pid: int, worker_if: str, lan_ifs: list[str]):
        self.worker_pid, self.worker_if, self.lan_ifs = worker_pid, worker_if, lan_ifs
        self.samples: list[tuple[float, int, int]] = []  # (t, link bytes, lan bytes)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> tuple[float, int, int]:
        rx, tx = netns_dev_bytes(self.worker_pid, self.worker_if)
        return time.time(), rx + tx, sum(sysfs_bytes(i) for i in self.lan_ifs)

    def __enter__(self) -> "Sampler":
        self.samples = [self.sample()]
        self._stop.clear()

        def loop():
            while not self._stop.wait(SAMPLE_S):
                self.samples.append(self.sample())

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.sample())

    def value_at(self, t: float) -> tuple[int, int]:
        """Counters at the last sample taken at or before t."""
        best = self.samples[0]
        for s in self.samples:
            if s[0] <= t:
                best = s
            else:
                break
        return best[1], best[2]

    def delta(self, ta: float, tb: float) -> tuple[int, int]:
        a, b = self.value_at(ta), self.value_at(tb)
        return b[0] - a[0], b[1] - a[1]

    def window(self, ta: float, tb: float) -> tuple[float, float, int] | None:
        """The span in [ta, tb] during which the link counter rose: (start, end, bytes).

        start: the last sample before the counter left its value at ta (by more than noise);
        end: the first sample at which it reached its value at tb (within noise)."""
        inside = [s for s in self.samples if ta <= s[0] <= tb]
        if len(inside) < 2:
            return None
        base, final = inside[0][1], inside[-1][1]
        if final - base < LINK_NOISE:
            return None
        start = next(i for i, s in enumerate(inside) if s[1] - base > LINK_NOISE)
        end = next(i for i, s in enumerate(inside) if final - s[1] <= LINK_NOISE)
        return inside[max(start - 1, 0)][0], inside[end][0], final - base


# --- host timestamps -----------------------------------------------------------------------------


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


# proportional set size of every process in a docker container of the host (Ray, vLLM's API
# server, engine core and rank): what serving costs the one machine both hosts share, shared pages
# counted once
PSS_OF_CONTAINERS = (
    't=0; for p in /proc/[0-9]*; do grep -qs docker "$p/cgroup" || continue; '
    "k=$(awk '/^Pss:/{print $2}' \"$p/smaps_rollup\" 2>/dev/null); t=$((t + ${k:-0})); done; echo $t"
)


def containers_pss_bytes(tb, host: str) -> int:
    return int(tb.sh(host, PSS_OF_CONTAINERS).stdout.strip() or 0) * 1024


def serve_record(tb) -> dict:
    name = our_container(tb, "spark-head")
    return json.loads(tb.docker("spark-head", f"exec {name} cat /run/sparkcluster/serve.json").stdout)


def serving_identity(tb) -> dict:
    """What must not change when `up` finds the cluster already serving: container IDs on both
    hosts, the server's PID and that process's start time (so a reused PID is not mistaken)."""
    ids = {h: sorted(tb.docker(h, "ps -q --no-trunc").stdout.split()) for h in HOSTS}
    pid = serve_record(tb)["pid"]
    start = tb.sh("spark-head", f"cut -d' ' -f22 /proc/{int(pid)}/stat", check=False).stdout.strip()
    return {"containers": ids, "serve_pid": pid, "serve_pid_start": start}


class ReadyProbe:
    """Polls the endpoint every 50 ms from the controller: the first moment /health is 200 and a
    one-token completion succeeds, independent of up's own polling."""

    def __init__(self, base: str, model: str):
        self.base, self.model = base, model
        self.ready_at: float | None = None
        self.health_at: float | None = None
        self._stop = threading.Event()

    def __enter__(self) -> "ReadyProbe":
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
                                headers={"Authorization": f"Bearer {API_KEY}"},
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


# --- the baseline: docker save | ssh | docker load over the same control link --------------------


class Baseline:
    """A throwaway second sshd on the worker, bound to its control address only, that accepts one
    throwaway key kept on the head; removed (process, keys, config) at exit."""

    def __init__(self, tb, head_ip: str, worker_ip: str):
        self.tb, self.head_ip, self.worker_ip = tb, head_ip, worker_ip

    def __enter__(self) -> "Baseline":
        d, tb, W, H = BASELINE_DIR, self.tb, "spark-worker", "spark-head"
        self.__exit__()
        pub = tb.sh(
            H,
            f"mkdir -p -m 700 {d} && ssh-keygen -q -t ed25519 -N '' -C sparkcluster-bench -f {d}/id && cat {d}/id.pub",
        ).stdout
        tb.sh(W, f"mkdir -p -m 700 {d} && ssh-keygen -q -t ed25519 -N '' -f {d}/host_key")
        tb.sh(W, f"cat > {d}/authorized_keys && chmod 600 {d}/authorized_keys", input=pub)
        tb.sh(
            W,
            f"cat > {d}/sshd_config",
            input=f"""# sparkcluster bench: save-ssh-load baseline only
ListenAddress {self.worker_ip}:{BASELINE_PORT}
HostKey {d}/host_key
PidFile {d}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
""",
        )
        tb.sh(
            W,
            f"/usr/sbin/sshd -t -f {d}/sshd_config && /usr/sbin/sshd -f {d}/sshd_config -E {d}/sshd.log && "
            f"for i in $(seq 100); do ss -Hltn 'sport = :{BASELINE_PORT}' | grep -q . && break; sleep 0.05; done",
        )
        kt, key = tb.sh(W, f"cat {d}/host_key.pub").stdout.split()[:2]
        tb.sh(H, f"cat > {d}/known_hosts", input=f"[{self.worker_ip}]:{BASELINE_PORT} {kt} {key}\n")
        self.ssh = (
            f"ssh -i {d}/id -o BatchMode=yes -o IdentitiesOnly=yes -o UserKnownHostsFile={d}/known_hosts "
            f"-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -b {self.head_ip} "
            f"-p {BASELINE_PORT} root@{self.worker_ip}"
        )
        tb.sh(H, f"{self.ssh} true", timeout=30)
        return self

    def command(self, image: str) -> str:
        return f"set -o pipefail; docker save {image} | {self.ssh} docker load -q"

    def __exit__(self, *exc) -> None:
        d = BASELINE_DIR
        self.tb.sh("spark-worker", f"[ -f {d}/sshd.pid ] && kill $(cat {d}/sshd.pid); rm -rf {d}", check=False)
        self.tb.sh("spark-head", f"rm -rf {d}", check=False)


# the bytes of each layer as docker save emits it (its tar), by diff ID: what "the layers the
# worker lacks" weigh on the wire before TCP/IP. Run on the head, reading docker save.
LAYER_TAR_SIZES = r"""
import hashlib, json, sys, tarfile
out = {}
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as t:
    for m in t:
        if m.isfile() and (m.name.endswith("/layer.tar") or "/blobs/sha256/" in "/" + m.name):
            h, f = hashlib.sha256(), t.extractfile(m)
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                h.update(b)
            out["sha256:" + h.hexdigest()] = m.size
print(json.dumps(out))
"""


# --- the bench -----------------------------------------------------------------------------------


class Bench:
    def __init__(self, tb, workdir: Path):
        from sparkcluster import log
        from sparkcluster.config import inventory as inventories
        from sparkcluster.config import profile as profiles
        from sparkcluster.config.images import image_ref

        self.tb = tb
        self.workdir = workdir
        self.sc = CLI(tb, workdir)
        os.environ["XDG_STATE_HOME"] = str(workdir / "state-inprocess")  # the in-process debug log
        log.configure("warning")
        self.inv = inventories.load(tb.inventory)
        self.prof = profiles.load_profile(PROFILE)
        self.image = image_ref(self.inv, self.prof)
        self.head, self.worker = self.inv.head, self.inv.workers[0]
        from tests.testbed.testbed import SPECS

        self.endpoint = f"http://{SPECS['spark-head'].lan_ip}:{self.prof.serve.port or self.inv.cluster.api_port}"
        self.sampler = Sampler(tb.pid("spark-worker"), self.worker.control_if, ["sctb-head", "sctb-worker"])
        self.raw: dict[str, list] = {}
        self.figures: list[Figure] = []
        self.aliases: set[str] = set()  # the worker's other tags of the cluster image, put back at the end
        self.details: dict = {}

    def rec(self, key: str, value) -> None:
        self.raw.setdefault(key, []).append(value)

    def image_size(self) -> int:
        return int(self.tb.docker("spark-head", f"image inspect --format '{{{{.Size}}}}' {self.image}").stdout)

    def loaded_at(self, since: float) -> float | None:
        """When the worker's dockerd finished loading the image: its `load` image event."""
        out = self.tb.docker(
            "spark-worker",
            f"events --since {int(since) - 1} --until {int(time.time()) + 2} "
            "--filter type=image --filter event=load --format '{{.TimeNano}}'",
            check=False,
        ).stdout.split()
        times = [int(x) / 1e9 for x in out if x.isdigit() and int(x) / 1e9 >= since]
        return min(times) if times else None

    def worker_rmi(self) -> None:
        """The cluster image off the worker: its tag, and any other tag of the same image ID (the
        testbed's own cache tag), or `docker rmi` only untags and every layer stays; those tags
        are put back by `restore_aliases`."""
        iid = self.tb.image_id("spark-worker", self.image)
        if not iid:  # the worker may lack it already (set aside with every image sharing its layers)
            return
        tags = json.loads(
            self.tb.docker("spark-worker", f"image inspect --format '{{{{json .RepoTags}}}}' {iid}").stdout
        )
        others = [t for t in tags or [] if t != self.image]
        self.aliases.update(others)
        self.tb.docker("spark-worker", " ".join(["rmi", self.image, *others]))

    def restore_aliases(self) -> None:
        for tag in sorted(self.aliases):
            if self.tb.image_id("spark-worker", self.image) and not self.tb.image_id("spark-worker", tag):
                self.tb.docker("spark-worker", f"tag {self.image} {tag}")

    def serving(self) -> bool:
        r = self.sc("status", "--json", check=False)
        try:
            return json.loads(r.stdout).get("state") == "healthy"
        except ValueError:
            return False

    # 3 (and 2: up from down; 5: image stage with identical image IDs)
    def up_from_down(self, i: int) -> None:
        self.sc("down", timeout=120)
        with self.sampler, ReadyProbe(self.endpoint, self.prof.served_model_name) as probe:
            r = self.sc("up", "--profile", PROFILE, timeout=600)
        hc, wc, sv = (
            container_times(self.tb, "spark-head"),
            container_times(self.tb, "spark-worker"),
            serve_record(self.tb),
        )
        if probe.ready_at is None:
            raise SystemExit("bench: the 50 ms readiness probe never saw the server ready")
        t_pre, t_pre_ok = r.at("▸ preflight"), r.at("✓ preflight")
        t_img, t_img_ok = r.at("▸ image"), r.at("✓ image")
        t_ray_ok, t_serve_ok = r.at("✓ ray"), r.at("✓ serve")
        t_fab, t_fab_ok = r.at("▸ fabric"), r.at("✓ fabric")
        segs = {
            "head: create -> Ray head started": hc["ray"] - hc["created"],
            "worker: create -> joined Ray": wc["ray"] - wc["created"],
            # the collective test (issue 26) is work on the hosts that must finish before the server
            # starts; its ranks' own clocks are not read, so the stage as the CLI timed it
            "fabric: the collective test (stage)": (t_fab_ok - t_fab) if t_fab and t_fab_ok else 0.0,
            "server: exec -> answers a completion": probe.ready_at - sv["started_at"],
        }
        cp = sum(segs.values())
        gaps = {
            "CLI start-up (interpreter, imports)": t_pre - r.t0,
            "preflight (connect, lock, facts, checks)": t_pre_ok - t_pre,
            "image stage (IDs equal)": t_img_ok - t_pre_ok,
            "before the head container": hc["created"] - t_img_ok,
            "Ray head started -> worker create (0.25 s poll)": wc["created"] - hc["ray"],
            "worker joined -> ray stage done (0.25 s poll)": t_ray_ok - wc["ray"],
            "probe, then serve exec": sv["started_at"] - t_ray_ok - segs["fabric: the collective test (stage)"],
            "server ready -> serve done (0.1 s poll, supervisor, warm-up)": t_serve_ok - probe.ready_at,
            "summary and exit": r.t1 - t_serve_ok,
        }
        link, lan = self.sampler.delta(t_img, t_img_ok)
        self.rec("up_down_wall", r.wall)
        self.rec("up_down_cp", cp)
        self.rec("up_down_ratio", r.wall / cp)
        self.rec("up_down_segments", segs)
        self.rec("up_down_gaps", gaps)
        self.rec("up_down_stages", {k: float(v) for k, v in re.findall(r"✓ (\w+) ([\d.]+)s", r.stderr)})
        self.rec("image_same_s", t_img_ok - t_img)
        self.rec("image_same_link_bytes", link)
        self.rec("conns_up_down", r.conns)
        say(
            f"  up from down #{i}: {r.wall:.2f}s, critical path {cp:.2f}s ({r.wall / cp:.2f}); "
            f"image stage {t_img_ok - t_img:.2f}s, {link} B on the link; ssh {r.conns}"
        )

    # 1, 2, 4, 6 on a serving cluster
    def on_serving(self, i: int) -> None:
        r = self.sc("doctor", check=False)
        if r.rc not in (0, 1):
            raise SystemExit(f"bench: doctor exited {r.rc}\n{r.stderr}")
        self.rec("doctor_cli_wall", r.wall)
        self.rec("conns_doctor", r.conns)

        r = self.sc("status", "--json", check=False)
        st = json.loads(r.stdout)
        if st.get("state") != "healthy":
            raise SystemExit(f"bench: status says {st.get('state')}: {st.get('problems')}")
        self.rec("status_wall", r.wall)
        self.rec("conns_status", r.conns)

        before = serving_identity(self.tb)
        r = self.sc("up", "--profile", PROFILE)
        after = serving_identity(self.tb)
        if "nothing to do" not in r.stdout:
            raise SystemExit(f"bench: up on a serving cluster did something:\n{r.stdout}\n{r.stderr}")
        self.rec("up_serving_wall", r.wall)
        self.rec("up_serving_unchanged", 1.0 if before == after else 0.0)
        self.rec("conns_up_serving", r.conns)

        from sparkcluster.day2 import status as status_mod

        t = time.time()
        status_mod.collect_all(self.inv, API_KEY)
        self.rec("status_inprocess", time.time() - t)
        self.rec("serving_pss_gib", sum(containers_pss_bytes(self.tb, h) for h in HOSTS) / 2**30)

        both, single = self.fanout(i)
        say(
            f"  serving #{i}: doctor {self.raw['doctor_cli_wall'][-1]:.2f}s, status {self.raw['status_wall'][-1]:.2f}s, "
            f"up {r.wall:.2f}s (unchanged: {before == after}); in-process both {both:.2f}s vs single "
            + ", ".join(f"{k} {v:.2f}s" for k, v in single.items())
        )

    def fanout(self, i: int) -> tuple[float, dict[str, float]]:
        """The doctor's work in-process: all nodes through preflight.run (parallel), and each node
        alone (its own connection, the same probe script, its path-MTU pings) one after the other."""
        from sparkcluster import facts
        from sparkcluster.checks import preflight
        from sparkcluster.remote.fanout import connect_all

        expect = preflight.expectations(self.inv, self.prof)

        def both() -> tuple[float, dict]:
            t = time.time()
            rep, cluster = preflight.run(self.inv, self.prof)
            if cluster:
                cluster.close()
            return time.time() - t, rep.facts

        def alone(node, ref) -> float:
            t = time.time()
            res = connect_all(self.inv, [node])
            h = res.values_or_raise("connect")[node.name]
            try:
                facts.gather(h, self.inv, expect.image)
                facts.gather_path_mtu(h, facts.path_mtu_probes(node, ref))
            finally:
                h.close()
            return time.time() - t

        _, ref = both()  # facts for the path-MTU probes, and a warm start
        single: dict[str, float] = {}
        order = list(self.inv.nodes) if i % 2 == 0 else list(reversed(self.inv.nodes))
        if i % 2 == 0:
            t_both, _ = both()
        for node in order:
            single[node.name] = alone(node, ref)
        if i % 2 == 1:
            t_both, _ = both()
        self.rec("fanout_both", t_both)
        self.rec("fanout_single", single)
        self.rec("fanout_ratio", t_both / max(single.values()))
        return t_both, single

    def worker_layers(self) -> list[list[str]]:
        out = self.tb.sh(
            "spark-worker",
            'ids=$(docker image ls -q --no-trunc | sort -u); [ -z "$ids" ] || '
            "docker image inspect --format '{{json .RootFS.Layers}}' $ids",
        ).stdout
        return [json.loads(x) or [] for x in out.split()]

    def lacking_bytes(self) -> tuple[int, int, int]:
        """(tar bytes of the cluster image's layers the worker lacks, layers lacking, layers): the
        worker's holdings as sparkcluster sees them (the longest bottom-up prefix of any image)."""
        from sparkcluster.movement import layers

        mine = self._head_layers()
        if not hasattr(self, "_tar_sizes"):
            self._tar_sizes = json.loads(
                self.tb.sh(
                    "spark-head",
                    f"set -o pipefail; docker save {self.image} | python3 -c {shlex.quote(LAYER_TAR_SIZES)}",
                    timeout=600,
                ).stdout
            )
        held = layers.held_prefix(mine, self.worker_layers())
        return sum(self._tar_sizes[d] for d in mine[held:]), len(mine) - held, len(mine)

    # 5b: the base on both hosts (as after docker pull on each Spark): only the Ray layers move
    def delta(self, i: int) -> None:
        def stop_after_image(line: str, p) -> None:
            if line.startswith("✓ image"):
                p.send_signal(signal.SIGINT)

        self.worker_rmi()
        lacking, n_lack, n_all = self.lacking_bytes()
        if not n_lack:
            raise SystemExit("bench: the worker still holds every layer of the cluster image after its rmi")
        with self.sampler:
            r = self.sc("up", "--profile", PROFILE, check=False, on_line=stop_after_image)
        t_img, t_img_ok = r.at("▸ image"), r.at("✓ image")
        if t_img_ok is None:
            raise SystemExit(f"bench: up did not finish its image stage\n{r.stderr}")
        link, _ = self.sampler.delta(t_img, t_img_ok)
        if self.tb.image_id("spark-worker", self.image) != self.tb.image_id("spark-head", self.image):
            raise SystemExit("bench: the worker's image ID differs from the head's after the transfer")
        self.rec("delta_link_bytes", link)
        self.rec("delta_lacking_bytes", lacking)
        self.rec("delta_ratio", link / max(lacking, 1))
        self.rec("delta_stage_s", t_img_ok - t_img)
        self.details["delta_layers"] = {"lacking": n_lack, "of": n_all}
        say(
            f"  delta #{i}: {n_lack} of {n_all} layers lacking, {lacking:,} B of layer tars; {link:,} B on the link "
            f"({link / max(lacking, 1):.3f}), image stage {t_img_ok - t_img:.2f}s"
        )

    def worker_bare(self, aside: Path) -> None:
        """The worker lacks every layer of the cluster image: the images sharing any are set aside
        (docker save to the controller, then removed); `restore_worker` loads them back."""
        if self.tb.image_id("spark-worker", self.image):
            self.worker_rmi()
        # the cluster image is gone from the worker first, so its layers are named from the head
        mine = set(self._head_layers())
        tags = [t for t in self._worker_tags() if set(self._layers_on("spark-worker", t)) & mine]
        self.tb.set_images_aside("spark-worker", tags, aside)
        lacking, n_lack, n_all = self.lacking_bytes()
        if n_lack != n_all:
            raise SystemExit(f"bench: the worker still holds {n_all - n_lack} of the image's layers")
        say(f"  worker set bare: {', '.join(tags) or 'nothing to set aside'}")

    def _worker_tags(self) -> list[str]:
        out = self.tb.docker("spark-worker", "images --format '{{.Repository}}:{{.Tag}}'").stdout.split()
        return [t for t in out if "<none>" not in t]

    def _layers_on(self, host: str, ref: str) -> list[str]:
        out = self.tb.docker(host, f"image inspect --format '{{{{json .RootFS.Layers}}}}' {shlex.quote(ref)}").stdout
        return json.loads(out) or []

    def _head_layers(self) -> list[str]:
        return self._layers_on("spark-head", self.image)

    def restore_worker(self, aside: Path) -> None:
        self.tb.restore_images("spark-worker", aside)

    # 5: the image goes head -> worker
    def transfer(self, i: int, baseline: Baseline) -> None:
        def ours() -> None:
            def stop_after_image(line: str, p) -> None:
                if line.startswith("✓ image"):
                    p.send_signal(signal.SIGINT)  # only the image stage is measured: Ctrl-C, rolled back

            self.worker_rmi()
            with self.sampler:
                r = self.sc("up", "--profile", PROFILE, check=False, on_line=stop_after_image)
            t_img, t_img_ok = r.at("▸ image"), r.at("✓ image")
            if t_img_ok is None:
                raise SystemExit(f"bench: up did not finish its image stage\n{r.stderr}")
            win = self.sampler.window(t_img, t_img_ok)
            link, lan = self.sampler.delta(t_img, t_img_ok)
            if win is None:
                raise SystemExit("bench: no transfer seen on the control link during the image stage")
            loaded = self.loaded_at(t_img)
            if loaded is None:
                raise SystemExit("bench: no `load` event from the worker's dockerd")
            self.rec("xfer_sc_s", loaded - t_img)
            self.rec("xfer_sc_link_s", win[1] - win[0])
            self.rec("xfer_sc_link_bytes", link)
            self.rec("xfer_sc_lan_bytes", lan)
            self.rec("xfer_sc_stage_s", t_img_ok - t_img)
            say(
                f"  transfer #{i} sparkcluster: {loaded - t_img:.2f}s to loaded, {win[1] - win[0]:.2f}s on the link "
                f"({link:,} B), image stage {t_img_ok - t_img:.2f}s, controller LAN {lan:,} B"
            )

        def theirs() -> None:
            self.worker_rmi()
            with self.sampler:
                t0 = time.time()
                self.tb.sh("spark-head", baseline.command(self.image), timeout=600)
                t1 = time.time()
            win = self.sampler.window(t0, t1)
            if win is None:
                raise SystemExit("bench: no transfer seen on the control link for the baseline")
            loaded = self.loaded_at(t0)
            if loaded is None:
                raise SystemExit("bench: no `load` event from the worker's dockerd")
            self.rec("xfer_base_s", loaded - t0)
            self.rec("xfer_base_link_s", win[1] - win[0])
            self.rec("xfer_base_wall", t1 - t0)
            say(
                f"  transfer #{i} save-ssh-load: {loaded - t0:.2f}s to loaded, {win[1] - win[0]:.2f}s on the link, "
                f"{t1 - t0:.2f}s wall"
            )

        for step in (ours, theirs) if i % 2 == 0 else (theirs, ours):
            step()
        if self.tb.image_id("spark-worker", self.image) != self.tb.image_id("spark-head", self.image):
            raise SystemExit("bench: the worker's image ID differs from the head's after the transfer")
        self.rec("xfer_ratio", self.raw["xfer_base_s"][-1] / self.raw["xfer_sc_s"][-1])

    def run(self) -> None:
        tb = self.tb
        was_serving = self.serving()
        self.details["started_serving"] = was_serving
        if tb.image_id("spark-head", self.image) is None:
            say("the cluster image is not on the head: one unmeasured up builds it")
            self.sc("up", "--profile", PROFILE, timeout=1800)
        if tb.image_id("spark-worker", self.image) != tb.image_id("spark-head", self.image):
            say("the worker's image differs: copying it first (unmeasured)")
            self.sc("down", timeout=120)
            if tb.image_id("spark-worker", self.image):
                self.worker_rmi()
            tb.copy_image(self.image)
        size = self.image_size()
        self.details["image"] = {"ref": self.image, "size_bytes": size}

        say(f"up from a cluster that is down, image in place ({REPS}x)")
        for i in range(REPS):
            self.up_from_down(i)
        say(f"on a serving cluster: doctor, status --json, up, in-process fan-out ({REPS}x)")
        for i in range(REPS):
            self.on_serving(i)
        # once each whatever REPS: the testbed profile allows two restarts per hour
        say("supervisor: its own CPU and memory while serving, then a wedge and a worker reboot to serving again")
        cpu, rss = supervisor.agent_cost(tb)
        self.rec("agent_cpu_pct", cpu)
        self.rec("agent_rss_mb", rss)
        self.rec("wedge_to_serving_s", supervisor.wedge_to_serving(tb, API_KEY))
        self.rec("reboot_to_serving_s", supervisor.worker_reboot_to_serving(tb, API_KEY))
        say(
            f"  agent {cpu:.2f}% of a core, {rss:.0f} MB; wedge to serving {self.raw['wedge_to_serving_s'][-1]:.0f}s, "
            f"worker reboot to serving {self.raw['reboot_to_serving_s'][-1]:.0f}s"
        )
        say(f"executors: up from down, memory and idle CPU of both hosts, with ray and with mp ({REPS}x)")
        from perf import executors

        self.details["executors"] = executors.measure(tb, self.sc, HOSTS, containers_pss_bytes, REPS)
        (REPO / "perf" / "executors.md").write_text(
            executors.render(self.details["executors"], HOSTS, time.strftime("%Y-%m-%d %H:%M UTC"), REPS)
        )
        say(f"image transfer, base on both hosts: bytes on the link / bytes of the layers the worker lacks ({REPS}x)")
        self.sc("down", timeout=120)
        try:
            for i in range(REPS):
                self.delta(i)
        finally:
            self.sc("down", timeout=120, check=False)
            if tb.image_id("spark-worker", self.image) is None:
                tb.copy_image(self.image)
        say(f"image transfer, worker lacks every layer: sparkcluster vs docker save | ssh | docker load ({REPS}x)")
        head_ip, worker_ip = str(self.head.control_ip), str(self.worker.control_ip)
        aside = self.workdir / "worker-images.tar"
        try:
            self.worker_bare(aside)
            with Baseline(tb, head_ip, worker_ip) as baseline:
                for i in range(REPS):
                    self.transfer(i, baseline)
        finally:
            self.sc("down", timeout=120, check=False)  # what a Ctrl-C'd up may have left
            self.restore_worker(aside)
            if tb.image_id("spark-worker", self.image) is None:
                tb.copy_image(self.image)
        self.restore_aliases()
        if was_serving:
            say("leaving the cluster serving, as it was")
            self.sc("up", "--profile", PROFILE, timeout=600)
        self.figures = self.make_figures(size)

    def make_figures(self, size: int) -> list[Figure]:
        R, F = self.raw, []

        def conns(cmd: str, title: str) -> None:
            for h in HOSTS:
                v = [float(c[h]) for c in R[cmd]]
                F.append(
                    Figure(f"{cmd}_{h}", f"SSH connections to {h}: {title}", "count", "1", v, all(x == 1 for x in v))
                )

        F.append(
            Figure(
                "doctor_fanout",
                "doctor fan-out: both nodes / slower node alone (in-process)",
                "ratio",
                "<= 1.25",
                R["fanout_ratio"],
                statistics.median(R["fanout_ratio"]) <= 1.25,
            )
        )
        F.append(Figure("doctor_cli_wall", "doctor wall time, CLI, both nodes", "s", "-", R["doctor_cli_wall"], None))
        conns("conns_doctor", "doctor")
        conns("conns_up_serving", "up on a serving cluster")
        conns("conns_up_down", "up from down")
        conns("conns_status", "status")
        F.append(
            Figure(
                "up_overhead",
                "up from down: wall / critical path",
                "ratio",
                "<= 1.10",
                R["up_down_ratio"],
                statistics.median(R["up_down_ratio"]) <= 1.10,
            )
        )
        F.append(Figure("up_down_wall", "up from down: wall time", "s", "-", R["up_down_wall"], None))
        F.append(
            Figure(
                "serving_pss",
                "memory of both hosts' containers while serving (PSS)",
                "GiB",
                "<= 6",
                R["serving_pss_gib"],
                all(x <= 6 for x in R["serving_pss_gib"]),
            )
        )
        F.append(Figure("up_down_cp", "up from down: critical path (host timestamps)", "s", "-", R["up_down_cp"], None))
        F.append(
            Figure(
                "up_serving_wall",
                "up on a cluster already serving: wall time",
                "s",
                "< 2",
                R["up_serving_wall"],
                max(R["up_serving_wall"]) < 2,
            )
        )
        F.append(
            Figure(
                "up_serving_unchanged",
                "  ... containers and server PID unchanged (1 = yes)",
                "count",
                "1",
                R["up_serving_unchanged"],
                all(x == 1 for x in R["up_serving_unchanged"]),
            )
        )
        F.append(
            Figure(
                "image_controller_bytes",
                "image transfer: bytes on the controller's LAN veths",
                "bytes",
                f"0 image bytes (< {size // 1000:,} = 0.1% of the image)",
                [float(x) for x in R["xfer_sc_lan_bytes"]],
                max(R["xfer_sc_lan_bytes"]) < size / 1000,
                note=f"image {size:,} B; these bytes are the SSH session's own traffic (an upper bound)",
            )
        )
        F.append(
            Figure(
                "image_link_bytes",
                "image transfer: bytes on the head-worker control link",
                "bytes",
                "-",
                [float(x) for x in R["xfer_sc_link_bytes"]],
                None,
            )
        )
        if R.get("delta_ratio"):
            F.append(
                Figure(
                    "image_delta_ratio",
                    "image transfer, base on both: link bytes / bytes of the layers the worker lacks",
                    "ratio",
                    "<= 1.05",
                    R["delta_ratio"],
                    statistics.median(R["delta_ratio"]) <= 1.05,
                    note="denominator: those layers' tars as docker save emits them; the link counts "
                    "TCP/IP and ACKs both ways",
                )
            )
            F.append(
                Figure(
                    "image_delta_bytes",
                    "  ... bytes on the link",
                    "bytes",
                    "-",
                    [float(x) for x in R["delta_link_bytes"]],
                    None,
                )
            )
            F.append(
                Figure(
                    "image_delta_lacking",
                    "  ... bytes of the layers the worker lacks",
                    "bytes",
                    "-",
                    [float(x) for x in R["delta_lacking_bytes"]],
                    None,
                )
            )
            F.append(Figure("image_delta_stage_s", "  ... image stage time", "s", "-", R["delta_stage_s"], None))
        F.append(
            Figure(
                "image_throughput",
                "image transfer, worker lacks all: sparkcluster / save-ssh-load throughput",
                "ratio",
                ">= 0.90",
                R["xfer_ratio"],
                statistics.median(R["xfer_ratio"]) >= 0.90,
            )
        )
        F.append(
            Figure(
                "image_sc_mbps",
                "image transfer: sparkcluster, stage start to loaded",
                "MB/s",
                "-",
                [size / s / 1e6 for s in R["xfer_sc_s"]],
                None,
            )
        )
        F.append(
            Figure(
                "image_base_mbps",
                "image transfer: save-ssh-load, start to loaded",
                "MB/s",
                "-",
                [size / s / 1e6 for s in R["xfer_base_s"]],
                None,
            )
        )
        F.append(
            Figure(
                "image_sc_link_mbps",
                "  ... sparkcluster, bytes on the wire only",
                "MB/s",
                "-",
                [size / s / 1e6 for s in R["xfer_sc_link_s"]],
                None,
            )
        )
        F.append(
            Figure(
                "image_base_link_mbps",
                "  ... save-ssh-load, bytes on the wire only",
                "MB/s",
                "-",
                [size / s / 1e6 for s in R["xfer_base_link_s"]],
                None,
            )
        )
        F.append(
            Figure(
                "image_same_s",
                "identical image IDs: image stage time",
                "s",
                "< 1",
                R["image_same_s"],
                max(R["image_same_s"]) < 1,
            )
        )
        F.append(
            Figure(
                "image_same_bytes",
                "identical image IDs: bytes on the control link",
                "bytes",
                f"0 (< {LINK_NOISE // 1024} KiB: no image moved)",
                [float(x) for x in R["image_same_link_bytes"]],
                max(R["image_same_link_bytes"]) < LINK_NOISE,
            )
        )
        if R.get("agent_cpu_pct"):
            F.append(
                Figure(
                    "agent_cpu",
                    "supervisor on the head, serving idle: CPU",
                    "% of a core",
                    "< 1",
                    R["agent_cpu_pct"],
                    max(R["agent_cpu_pct"]) < 1,
                )
            )
            F.append(
                Figure(
                    "agent_rss",
                    "supervisor on the head: memory (RSS)",
                    "MB",
                    "< 100",
                    R["agent_rss_mb"],
                    max(R["agent_rss_mb"]) < 100,
                )
            )
            F.append(
                Figure(
                    "wedge_to_serving",
                    "rank 1 stopped (SIGSTOP) to serving again, no controller",
                    "s",
                    "-",
                    R["wedge_to_serving_s"],
                    None,
                )
            )
            F.append(
                Figure(
                    "reboot_to_serving",
                    "worker reboot to serving again, no controller",
                    "s",
                    "-",
                    R["reboot_to_serving_s"],
                    None,
                )
            )
        F.append(
            Figure(
                "status_wall",
                "status --json on a serving cluster: wall time",
                "s",
                "< 1",
                R["status_wall"],
                max(R["status_wall"]) < 1,
            )
        )
        F.append(
            Figure(
                "status_inprocess",
                "  ... the same status, in-process (no interpreter start-up)",
                "s",
                "-",
                R["status_inprocess"],
                None,
            )
        )
        return F


def median_dicts(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def render(figures: list[Figure], details: dict, when: str) -> str:
    out = [
        f"sparkcluster bench, {when} (testbed, {os.cpu_count()} CPUs; median of {REPS} repetitions, min-max)",
        "",
        "| figure | median | min | max | unit | target | met |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for f in figures:
        met = "-" if f.ok is None else ("yes" if f.ok else "**no**")
        out.append(
            f"| {f.title} | {fmt(f.median, f.unit)} | {fmt(min(f.values), f.unit)} | {fmt(max(f.values), f.unit)} "
            f"| {f.unit} | {f.target} | {met} |"
        )
    if "up_down_breakdown" in details:
        b = details["up_down_breakdown"]
        out += [
            "",
            "Where `up` from down spends its time (medians, seconds; the critical path's segments are",
            "from the hosts' own timestamps, the rest is sparkcluster's overhead):",
            "",
            "| part | s |",
            "|---|---:|",
        ]
        for k, v in b["critical_path"].items():
            out.append(f"| critical path: {k} | {v:.2f} |")
        for k, v in b["overhead"].items():
            out.append(f"| overhead: {k} | {v:.2f} |")
    return "\n".join(out) + "\n"


def rerender() -> None:
    """`python -m perf.run --render`: perf/results.md again from perf/results.json (no testbed)."""
    d = json.loads(RESULTS_JSON.read_text())
    b = Bench.__new__(Bench)
    b.raw = d["raw"]
    table = render(b.make_figures(d["details"]["image"]["size_bytes"]), d["details"], d["when"])
    RESULTS_MD.write_text(table)
    print(table)


def executors_only() -> None:
    """`python -m perf.run --executors`: only the ray / mp comparison (issue 28), to perf/executors.md."""
    from perf import executors

    with testbed_lock():
        started = time.time()
        tb = testbed()
        with tempfile.TemporaryDirectory(prefix="sparkcluster-bench-") as wd:
            raw = executors.measure(tb, CLI(tb, Path(wd)), HOSTS, containers_pss_bytes, REPS)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    table = executors.render(raw, HOSTS, when, REPS)
    (REPO / "perf" / "executors.md").write_text(table)
    print(table)


def main() -> None:
    if "--render" in sys.argv[1:]:
        return rerender()
    if os.geteuid() != 0:
        die("the testbed needs root (make bench as root, after make testbed-up)")
    if "--executors" in sys.argv[1:]:
        return executors_only()
    sys.path.insert(0, str(REPO))
    started = time.time()
    with testbed_lock():
        started = time.time()  # the run proper, after any wait for the lock
        tb = testbed()
        with tempfile.TemporaryDirectory(prefix="sparkcluster-bench-") as wd:
            b = Bench(tb, Path(wd))
            b.run()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    details = dict(b.details)
    details["up_down_breakdown"] = {
        "critical_path": median_dicts(b.raw["up_down_segments"]),
        "overhead": median_dicts(b.raw["up_down_gaps"]),
        "stages": median_dicts(b.raw["up_down_stages"]),
    }
    details["fanout_single_s"] = b.raw["fanout_single"]
    details["fanout_both_s"] = b.raw["fanout_both"]
    details["baseline_wall_s"] = b.raw["xfer_base_wall"]
    details["transfer_image_stage_s"] = b.raw["xfer_sc_stage_s"]
    details["bench_seconds"] = round(time.time() - started, 1)
    RESULTS_JSON.write_text(
        json.dumps(
            {
                "when": when,
                "reps": REPS,
                "cpus": os.cpu_count(),
                "figures": [f.as_dict() for f in b.figures],
                "details": details,
                "raw": b.raw,
            },
            indent=2,
        )
    )
    table = render(b.figures, details, when)
    RESULTS_MD.write_text(table)
    print(table)
    say(
        f"done in {time.time() - started:.0f}s; wrote {RESULTS_JSON.relative_to(REPO)} and {RESULTS_MD.relative_to(REPO)}"
    )


if __name__ == "__main__":
    main()
