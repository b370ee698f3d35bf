"""The node agent: the foreground process of every sparkcluster container, and on the head the
supervisor that keeps `vllm serve` serving without the controller.

Why it lives here: the container is what Docker restarts (restart policy `unless-stopped`), so a
reboot of a node brings back Ray and this agent together, with no unit file on the host and nothing
to install beside the image. On every node it owns `ray start --block` (when Ray exits, the agent
exits and Docker restarts the container, which re-joins Ray at the node's control IP), reports the
node's MemAvailable on a read-only HTTP endpoint at the node's control IP, and removes the
/dev/shm segments its container's processes mapped once none of them maps them any more. On the
head it also supervises the engine: it starts `vllm serve` when `up` asks (desired state in
DESIRED_PATH, secrets in a 0600 file beside it), waits until every node is a Ray member before
any (re)start, watches progress rather than liveness, restarts within bounds, and stops the engine
for good when a node runs short of memory. What it sees and does goes to a journal (JOURNAL_PATH).

Why not Ray for the worker's memory: Ray reports a container's cgroup usage, not the node's
MemAvailable (ray/_private/utils.py `get_used_memory`), and asking Ray anything else needs a driver
of a few hundred MB in this process. The endpoint answers only figures; it takes no input.

This file runs inside the image's own Python: standard library only. It is shipped into every
container as a file, so a change here changes the container's configuration hash.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

AGENT_PATH = "/opt/sparkcluster/agent.py"
CONFIG_PATH = "/etc/sparkcluster/agent.json"
DESIRED_PATH = "/etc/sparkcluster/serve-desired.json"
SECRETS_PATH = "/etc/sparkcluster/serve-secrets.json"
RECORD_PATH = "/run/sparkcluster/serve.json"
STATE_PATH = "/run/sparkcluster/supervisor.json"
JOURNAL_PATH = "/var/log/sparkcluster/journal.jsonl"
SERVE_LOG = "/var/log/sparkcluster/vllm-serve.log"
JOURNAL_KEEP = 2000  # lines kept when the journal is trimmed

# supervisor states (status shows them verbatim)
IDLE, WAITING, STARTING, SERVING, RESTARTING = "idle", "waiting for nodes", "starting", "serving", "restarting"
LIMIT, MEMORY, FAILED = "restart limit reached", "stopped: memory floor", "failed to start"

DEFAULT_POLICY = {
    "interval_s": 2.0,  # one look at the engine and the nodes
    "probe_interval_s": 15.0,  # a one-token completion, while /health is 200
    "probe_timeout_s": 20.0,
    "stall_s": 60.0,  # requests running while the generated-token counter does not move
    "health_failures": 3,  # consecutive failed /health after the engine served: gone
    "memory_floor_gib": 6.0,
    "memory_samples": 3,  # consecutive samples below the floor on any node
    "max_restarts": 3,
    "restart_window_s": 3600.0,
    "backoff_s": 5.0,  # doubled per restart in the window, at most 60 s
    "ready_timeout_s": 1800.0,
    "stop_grace_s": 30.0,
}


# ---------------------------------------------------------------- what one look saw, and the verdict
@dataclass
class Look:
    """One observation of the engine and the nodes; every field a plain fact."""

    now: float
    alive: bool  # the server's process still runs
    health: int | None = None
    running: float | None = None  # vllm:num_requests_running
    generated: float | None = None  # vllm:generation_tokens_total
    probe: str | None = None  # None: not probed this time; "" ok; else why it failed
    low_memory: dict[str, int] = field(default_factory=dict)  # node -> MemAvailable bytes, below the floor


@dataclass
class Watch:
    """What the supervisor remembers about the engine it started (one per start)."""

    started: float
    ready: bool = False
    health_failures: int = 0
    last_generated: float | None = None
    generated_moved_at: float = 0.0
    low_memory_samples: int = 0


def verdict(w: Watch, look: Look, policy: dict) -> tuple[str, str] | None:
    """None while the engine is fine (or still starting within its bound), else (kind, cause):
    kind is "memory" (stop, never restart), "dead", "wedged" or "not-ready" (restart within bounds).
    Updates `w` with what this look adds."""
    if look.low_memory:
        w.low_memory_samples += 1
        if w.low_memory_samples >= int(policy["memory_samples"]):
            nodes = ", ".join(f"{n} {v / 2**30:.1f} GiB" for n, v in sorted(look.low_memory.items()))
            return "memory", (f"MemAvailable below the floor of {policy['memory_floor_gib']:g} GiB for "
                              f"{w.low_memory_samples} samples ({nodes})")
    else:
        w.low_memory_samples = 0
    if not look.alive:
        return "dead", "the vllm serve process exited"
    if not w.ready:
        if look.health == 200 and look.probe == "":
            w.ready, w.generated_moved_at = True, look.now
        elif look.now - w.started > float(policy["ready_timeout_s"]):
            return "not-ready", f"not serving {policy['ready_timeout_s']:g}s after its start"
        return None
    if look.health != 200:
        w.health_failures += 1
        if w.health_failures >= int(policy["health_failures"]):
            return "dead", f"/health failed {w.health_failures} times in a row ({look.health or 'no answer'})"
        return None
    w.health_failures = 0
    if look.probe:
        return "wedged", f"/health is 200 but {look.probe}"
    if look.generated is not None:
        if look.generated != w.last_generated or not look.running:
            w.last_generated, w.generated_moved_at = look.generated, look.now
        elif look.now - w.generated_moved_at >= float(policy["stall_s"]):
            return "wedged", (f"{look.running:g} request(s) running and no token generated for "
                              f"{look.now - w.generated_moved_at:.0f}s")
    return None


def restarts_left(restarts: list[float], now: float, policy: dict) -> int:
    recent = [t for t in restarts if now - t < float(policy["restart_window_s"])]
    return int(policy["max_restarts"]) - len(recent)


def backoff(restarts: list[float], now: float, policy: dict) -> float:
    recent = [t for t in restarts if now - t < float(policy["restart_window_s"])]
    return min(60.0, float(policy["backoff_s"]) * 2 ** max(0, len(recent) - 1))


# ---------------------------------------------------------------- small readers (pure over text)
def mem_available(meminfo: str) -> int | None:
    m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", meminfo, re.M)
    return int(m.group(1)) * 1024 if m else None


_METRIC = re.compile(r"^(vllm:num_requests_running|vllm:generation_tokens_total)(?:\{[^}]*\})?\s+([-+0-9.eE]+)\s*$")


def engine_figures(metrics: str) -> tuple[float | None, float | None]:
    """(requests running, generated tokens total) from vLLM's Prometheus text, summed over labels."""
    got: dict[str, float] = {}
    for line in metrics.splitlines():
        m = _METRIC.match(line.strip())
        if m:
            got[m.group(1)] = got.get(m.group(1), 0.0) + float(m.group(2))
    return got.get("vllm:num_requests_running"), got.get("vllm:generation_tokens_total")


_SHM = re.compile(r"/dev/shm/psm_[0-9a-zA-Z_]+")


def shm_in_use(proc: str = "/proc") -> set[str]:
    """The multiprocessing segments this container's processes map or hold open now."""
    names: set[str] = set()
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(f"{proc}/{pid}/maps", errors="replace") as f:
                names.update(_SHM.findall(f.read()))
            for fd in os.listdir(f"{proc}/{pid}/fd"):
                target = os.readlink(f"{proc}/{pid}/fd/{fd}")
                if _SHM.fullmatch(target):
                    names.add(target)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return names


# ---------------------------------------------------------------- files
def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def write_json(path: str, doc: dict, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


class Journal:
    def __init__(self, path: str = JOURNAL_PATH):
        self.path = path
        self.lines = 0

    def write(self, event: str, **detail) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        entry = {"ts": round(time.time(), 3), "event": event, **detail}
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
        print(f"sparkcluster-agent: {event} {json.dumps(detail)}", flush=True)
        self.lines += 1
        if self.lines % 200 == 0:
            self._trim()

    def _trim(self) -> None:
        with open(self.path) as f:
            kept = f.readlines()[-JOURNAL_KEEP:]
        with open(self.path + ".tmp", "w") as f:
            f.writelines(kept)
        os.replace(self.path + ".tmp", self.path)


# ---------------------------------------------------------------- the node's own duties
class ShmJanitor:
    """Removes a segment this container's processes mapped once none has mapped it for two looks
    in a row: what a stopped or killed engine leaves in the host's /dev/shm (--ipc host) would
    otherwise hold memory until the host reboots. Another program's segments are never touched."""

    def __init__(self, journal: Journal):
        self.seen: set[str] = set()
        self.unmapped_once: set[str] = set()
        self.journal = journal

    def look(self) -> None:
        now = shm_in_use()
        gone = {n for n in self.seen - now if os.path.exists(n)}
        doomed = gone & self.unmapped_once
        for name in sorted(doomed):
            try:
                os.unlink(name)
            except OSError:
                continue
        if doomed:
            self.journal.write("shm removed", segments=len(doomed))
        self.unmapped_once = gone - doomed
        self.seen = (self.seen | now) - doomed - {n for n in self.seen if not os.path.exists(n)}


def node_report(node: str, ray: subprocess.Popen) -> dict:
    with open("/proc/meminfo") as f:
        avail = mem_available(f.read())
    return {"node": node, "mem_available": avail, "ray_alive": ray.poll() is None, "ts": time.time()}


def serve_reports(address: str, port: int, report) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps(report()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # one line per poll would drown the container's log
            pass

    httpd = ThreadingHTTPServer((address, port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()


# ---------------------------------------------------------------- the head's supervisor
class Supervisor:
    def __init__(self, cfg: dict, journal: Journal):
        self.cfg, self.journal = cfg, journal
        self.proc: subprocess.Popen | None = None
        self.generation: str | None = None
        self.watch: Watch | None = None
        self.restarts: list[float] = []
        self.causes: list[dict] = []
        self.state, self.since = IDLE, time.time()
        self.next_start = 0.0
        self.last_probe = 0.0
        self.first_start = True  # the start `up` asked for is not retried: a bad flag stays visible
        self.rate: float | None = None  # generated tokens per second over the last interval
        self._last_count: tuple[float, float] | None = None
        self._policy: dict = dict(DEFAULT_POLICY)

    # -- state
    def set_state(self, state: str, **detail) -> None:
        if state != self.state:
            self.state, self.since = state, time.time()
            self.journal.write(f"state: {state}", **detail)
        self.save()

    def save(self) -> None:
        policy = self.policy()
        self.restarts = [t for t in self.restarts if time.time() - t < float(policy["restart_window_s"])]
        write_json(STATE_PATH, {"state": self.state, "since": self.since, "updated": time.time(),
                                "generation": self.generation, "pid": self.proc.pid if self.proc else None,
                                "restarts": self.restarts, "causes": self.causes[-5:],
                                "tokens_per_s": self.rate if self.proc else None, "policy": policy})

    def policy(self, desired: dict | None = None) -> dict:
        """The bounds of the desired state just read (each tick reads it once), else the last known."""
        if desired is not None:
            self._policy = {**DEFAULT_POLICY, **(desired.get("policy") or {})}
        return self._policy

    def adopt(self, desired: dict) -> None:
        """A server `up` asked for, or (after this container restarted: a reboot, a crash) the one
        it asked for before, whose restart count and final verdicts carry over: a reboot does not
        reset the bound, and a server stopped for memory stays stopped."""
        self.stop("replaced by a new start from sparkcluster up")
        before = read_json(STATE_PATH) or {}
        self.generation, self.next_start = desired.get("generation"), 0.0
        if before.get("generation") == self.generation:
            self.restarts, self.causes = list(before.get("restarts") or []), list(before.get("causes") or [])
            self.first_start = False
            self.state = before.get("state") if before.get("state") in (LIMIT, MEMORY, FAILED) else self.state
            self.journal.write("resumed after the container restarted", state=self.state, restarts=len(self.restarts))
        else:
            self.restarts, self.causes, self.first_start = [], [], True
            if self.state in (LIMIT, MEMORY, FAILED):
                self.state = IDLE

    # -- the engine
    def start(self, desired: dict) -> None:
        secrets = read_json(SECRETS_PATH) or {}
        env = {**os.environ, **{k: str(v) for k, v in secrets.items()}}
        os.makedirs(os.path.dirname(SERVE_LOG), exist_ok=True)
        log = open(SERVE_LOG, "ab")
        self.proc = subprocess.Popen(desired["argv"], env=env, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        record = {k: desired.get(k) for k in ("profile", "model", "port", "salt", "secrets_digest", "generation", "policy")}
        write_json(RECORD_PATH, {**record, "pid": self.proc.pid, "exec_id": "", "started_at": time.time()})
        self.watch = Watch(started=time.time())
        self.journal.write("vllm serve started", pid=self.proc.pid, generation=desired.get("generation"))
        self.set_state(STARTING)

    def stop(self, why: str) -> None:
        if self.proc is None:
            return
        grace = float(self.policy()["stop_grace_s"])
        pid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.journal.write("vllm serve stopped", pid=pid, why=why, exit=self.proc.poll())
        self.proc = None
        try:
            os.unlink(RECORD_PATH)  # a stale record would name a PID that may be reused
        except FileNotFoundError:
            pass

    # -- looks
    def nodes_ready(self) -> str | None:
        """None when every node is a live Ray member with its GPUs, else what is missing."""
        if not self.cfg.get("ray_argv"):  # one node, no Ray: nothing to wait for
            return None
        try:
            with urllib.request.urlopen(self.cfg["state_api"], timeout=3) as r:
                doc = json.loads(r.read())
            rows = doc["data"]["result"]["result"]
        except (OSError, ValueError, KeyError, TypeError):
            return "Ray's state API does not answer yet"
        alive = [r for r in rows if r.get("state") == "ALIVE"]
        for want in self.cfg["nodes"]:
            gpus = sum(float(r.get("resources_total", {}).get("GPU", 0)) for r in alive if r.get("node_ip") == want["ip"])
            if gpus < want["gpus"]:
                return f"{want['name']} is not a Ray member at {want['ip']} with {want['gpus']} GPU(s)"
        return None

    def low_memory(self, policy: dict) -> dict[str, int]:
        floor = float(policy["memory_floor_gib"]) * 2**30
        seen: dict[str, int | None] = {}
        with open("/proc/meminfo") as f:
            seen[self.cfg["node"]] = mem_available(f.read())
        for peer in self.cfg.get("peers", []):
            try:
                with urllib.request.urlopen(f"http://{peer['ip']}:{self.cfg['report_port']}/", timeout=1) as r:
                    seen[peer["name"]] = json.loads(r.read()).get("mem_available")
            except (OSError, ValueError):
                continue  # a node that does not answer is Ray's membership question, not memory
        return {n: v for n, v in seen.items() if v is not None and v < floor}

    def look(self, desired: dict, policy: dict) -> Look:
        base = f"http://127.0.0.1:{desired['port']}"
        look = Look(now=time.time(), alive=self.proc is not None and self.proc.poll() is None,
                    low_memory=self.low_memory(policy))
        if not look.alive:
            return look
        look.health = http_status(f"{base}/health", 3)
        if look.health != 200:
            return look
        try:
            with urllib.request.urlopen(f"{base}/metrics", timeout=3) as r:
                look.running, look.generated = engine_figures(r.read().decode(errors="replace"))
        except (OSError, ValueError):
            pass
        if look.generated is not None:
            if self._last_count and look.now > self._last_count[0]:
                self.rate = max(0.0, (look.generated - self._last_count[1]) / (look.now - self._last_count[0]))
            self._last_count = (look.now, look.generated)
        due = not self.watch.ready or look.now - self.last_probe >= float(policy["probe_interval_s"])
        if due:
            self.last_probe = look.now
            look.probe = one_token(base, desired["model"], (read_json(SECRETS_PATH) or {}).get("VLLM_API_KEY"),
                                   float(policy["probe_timeout_s"]))
        return look

    # -- one turn of the loop
    def tick(self) -> None:
        desired = read_json(DESIRED_PATH)
        if desired is None and os.path.exists(DESIRED_PATH):  # caught mid-write: the next look has it
            return
        if desired is None or not desired.get("argv"):
            if self.proc is not None:
                self.stop("disabled (sparkcluster down, or up replacing the server)")
            self.generation = None
            self.set_state(IDLE)
            return
        policy = self.policy(desired)
        if desired.get("generation") != self.generation:
            self.adopt(desired)
        if self.state in (LIMIT, MEMORY, FAILED):
            self.save()
            return
        if self.proc is None:
            if time.time() < self.next_start:
                return
            if not self.first_start and not policy.get("act", True):
                self.set_state(IDLE, why="supervision is off in the profile: nothing is restarted")
                return
            missing = self.nodes_ready()
            if missing:
                self.set_state(WAITING, missing=missing)
                return
            if read_json(DESIRED_PATH) is None:  # `down` won the race
                return
            self.start(desired)
            return
        look = self.look(desired, policy)
        found = verdict(self.watch, look, policy)
        if found is None:
            if self.watch.ready:
                self.first_start = False
                self.set_state(SERVING)
            else:
                self.save()
            return
        kind, cause = found
        if not policy.get("act", True):  # watched, journalled once, left alone
            if not self.causes or self.causes[-1]["cause"] != cause:
                self.causes.append({"ts": time.time(), "kind": kind, "cause": cause})
                self.journal.write(kind, cause=cause, action="none: supervision is off in the profile")
            self.save()
            return
        self.causes.append({"ts": time.time(), "kind": kind, "cause": cause})
        self.journal.write(kind, cause=cause)
        self.stop(cause)
        if kind == "memory":
            self.set_state(MEMORY, cause=cause, fix="lower gpu_memory_utilization or add enforce_eager in the "
                           "profile, then sparkcluster up")
        elif self.first_start:
            self.set_state(FAILED, cause=cause)
        elif restarts_left(self.restarts, time.time(), policy) <= 0:
            self.set_state(LIMIT, cause=cause, restarts=len(self.restarts))
        else:
            self.restarts.append(time.time())
            self.next_start = time.time() + backoff(self.restarts, time.time(), policy)
            self.set_state(RESTARTING, cause=cause, attempt=len(self.restarts))


def http_status(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def one_token(base: str, model: str, api_key: str | None, timeout: float) -> str:
    """"" when a one-token completion returns within `timeout`, else why not."""
    body = json.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {api_key}"} if api_key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout):
            return ""
    except urllib.error.HTTPError as e:
        return "" if e.code == 401 else f"a one-token completion answered HTTP {e.code}"
    except OSError:  # timeouts included
        return f"a one-token completion did not return within {timeout:g}s"


# ---------------------------------------------------------------- main
def main(config_path: str = CONFIG_PATH) -> int:
    with open(config_path) as f:
        cfg = json.load(f)
    journal = Journal()
    journal.write("agent started", node=cfg["node"], role=cfg["role"])
    # no Ray (a one-node deployment): a stand-in that never exits, so the loop below reads the same
    ray = subprocess.Popen(cfg["ray_argv"]) if cfg.get("ray_argv") else subprocess.Popen(["sleep", "infinity"])
    stopping = threading.Event()

    def on_term(signum, frame):
        stopping.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        serve_reports(cfg["report_ip"], cfg["report_port"], lambda: node_report(cfg["node"], ray))
    except OSError as e:  # the head then judges this node's memory blind: say so, keep Ray and the server
        journal.write("memory report not served", address=f"{cfg['report_ip']}:{cfg['report_port']}", error=str(e))
    janitor = ShmJanitor(journal)
    sup = Supervisor(cfg, journal) if cfg["role"] == "head" else None
    last_janitor = 0.0
    while not stopping.is_set():
        if ray.poll() is not None:
            journal.write("ray exited", code=ray.returncode)
            break
        if sup is not None:
            try:
                sup.tick()
            except Exception as e:  # a bug here must not take Ray and the container down with it
                journal.write("supervisor error", error=f"{type(e).__name__}: {e}")
        if time.time() - last_janitor >= 10:
            last_janitor = time.time()
            janitor.look()
        interval = float(sup.policy()["interval_s"]) if sup else 5.0
        stopping.wait(interval)
    if sup is not None:
        sup.stop("the container is stopping")
    if ray.poll() is None:
        ray.terminate()
        try:
            ray.wait(30)
        except subprocess.TimeoutExpired:
            ray.kill()
    return 1 if ray.returncode not in (0, None) or not stopping.is_set() else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
