"""The head's supervisor: starts `vllm serve` when `up` asks (desired state file, secrets in a 0600
file beside it), waits until every node is a Ray member before any (re)start (executor "mp": until
every worker's agent holds the server, node/ranks), looks at the engine every interval, and acts on
the verdict (verdict.py) within its bounds: restart with backoff (with "mp", the whole set: each start
is a new epoch the workers' agents follow), stop for good when a node runs short of memory.

With Ray (node/raynodes) a start also waits while two Ray nodes are live at one node's IP (a
replaced container whose old node Ray has not declared dead yet; past a minute, the cause names a
stray raylet and how to find it) or while the one there started before the node's agent (the
previous container's raylet), then records the node_id of the Ray node each node's ranks run on. A
look reads Ray's table of live nodes at most once per interval: a recorded node Ray marks DEAD or no
longer lists is a "dead" verdict; another node live at a recorded node's IP is journalled once and
left alone.

On demand (issue 36; a profile's [on_demand], policy "on_demand"): the server `up` hands over stays
on standby (no engine, no memory held) until a wake (`wake`, from the agent's `POST /wake` with the
deployment's wake token); the start it leads to is admitted only when every node has the headroom
the profile's memory arithmetic asks for, else refused naming what holds the memory; an engine
with no request but the supervisor's own probes for idle_ttl_s is stopped and back on standby.
Wakes while it starts or serves change nothing, so concurrent first requests start it once.

The one-token probe runs on a thread of its own (ProbeRun): a look starts it when it is due and
none of this start's is in flight, and takes its answer at the first look after it returned, so a
probe into a stopped rank never holds the looks (and the stall clock, and the state file) back for
its timeout; an answer belongs to the start it was sent to, and one from an earlier start is dropped."""

from __future__ import annotations

import hmac
import http.client
import os
import threading
import time
import urllib.request
from secrets import token_hex

from . import aer, canary, engine_failure, engine_log, kernel_log
from .compile_reading import StartReading, log_lines, log_size
from .contract import (
    DESIRED_PATH,
    FABRIC_RESUME_PATH,
    FAILED,
    FINAL,
    IDLE,
    LIMIT,
    MEMORY,
    NO_MEMORY,
    RECORD_PATH,
    REFUSED,
    RESTARTING,
    SECRETS_PATH,
    SERVE_LOG,
    SERVING,
    STANDBY,
    STARTING,
    STATE_PATH,
    VERDICT_EVENT,
    WAITING,
    WAKE_PATH,
    WAKEABLE,
    Desired,
    Policy,
    Supervised,
)
from .energy import Energy, power_report
from .journal import Journal, read_json, write_json
from .lifecycle import Lifecycle, spawn
from .memreport import peer_memory
from .ranks import rank_problem, ranks_waiting
from .raynodes import (
    STRAY_AFTER_S,
    engine_nodes,
    node_lost,
    older_than_agent,
    others_at_ip,
    two_at_one_ip,
    waiting_on_two,
)
from .readings import (
    alive_gpus,
    engine_figures,
    held,
    http_status,
    mem_available,
    mem_total,
    one_token,
    progress_figures,
    ray_listing,
    ray_node_query,
)
from .verdict import (
    Look,
    Watch,
    admission,
    decide,
    idle_for,
    memory_for_restart,
    verdict,
)

RAY_READ_S = 1.0  # the timeout of a look's read of Ray's node table (contract.LOOK_BLOCKS_S counts it)
RAY_START_READ_S = 3.0  # the timeout of the read before a start (the start waits on it anyway)


class ProbeRun:
    """One one-token probe on a thread of its own, tagged with the start it was sent to (that
    start's Watch): `answer` is "" when it returned in time, else why not, an exception inside it
    included; `done` is set once it has an answer, whatever happened."""

    def __init__(self, watch: Watch, send):
        self.watch = watch
        self.answer, self.seconds = "", 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(send,), name="sparkcluster-probe", daemon=True)

    def _run(self, send) -> None:
        t0, answer = time.monotonic(), "the one-token probe ended without an answer"
        try:
            answer = send()
        except Exception as e:  # a failure the verdict counts, never a probe that stays in flight
            answer = f"the one-token probe failed: {type(e).__name__}: {e}"
        finally:
            self.answer, self.seconds = answer, time.monotonic() - t0
            self.done.set()


def first_failure(path: str, cap: int = 2 * 1024 * 1024) -> dict:
    """The first failure the server's log reports (node/engine_failure), as journal fields: the line,
    the rank that wrote it and the known cause; none where the log says none or cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - cap))
            text = f.read().decode(errors="replace")
    except OSError:
        return {}
    found = engine_failure.read(text)
    if found is None:
        return {}
    cause = found.cause()
    return {
        "first_failure": found.first.text,
        **({"rank": found.first.proc} if found.first.proc else {}),
        **({"rank_ip": found.first.ip} if found.first.ip else {}),
        **({"known_cause": cause.id, "fix": cause.fix} if cause else {}),
    }


class Supervisor(Lifecycle):
    child_name = "vllm serve"

    def __init__(self, cfg: dict, journal: Journal, agent_started: float | None = None):
        super().__init__(cfg, journal, STATE_PATH, RECORD_PATH)
        self.agent_started = agent_started  # when this node's agent started (before its Ray), if known
        self.watch: Watch | None = None
        self.last_probe = 0.0  # when the last probe was sent (a look's `now`)
        self.probe_run: ProbeRun | None = None  # the probe sent last, until a look takes its answer
        self.rate: float | None = None  # generated tokens per second over the last interval
        self._last_count: tuple[float, float] | None = None
        self._policy = Policy()
        self.memory_unknown: dict[str, str] = {}  # peer -> why its memory is not known now
        self.mp = cfg.get("executor") == "mp"  # every node runs its own rank(s): node/ranks
        self.epoch: str | None = None  # executor "mp": this start of the set (a fresh token per start)
        self.reports: dict[str, dict | None] = {}  # peer -> its last report (None: unanswered)
        self._peer_reads: dict[str, tuple[int | None, str]] | None = None  # within a tick: read_peer's
        self.reading: StartReading | None = None  # this start's compile cache, journalled at serving
        # on demand: a wake asked for a start (set from the report server's thread), whether an
        # engine is wanted now (from a wake's admitted start until the idle TTL), the last refusal
        self.woken = threading.Event()
        self.yielding = threading.Event()  # the gateway asked this engine to yield (issue 60)
        # the console's asks (node/console_calls): (what, who asked), acted on by the next tick
        self.owner_ask: tuple[str, str] | None = None
        self.wanted = False
        self.refusal = ""
        self.held: dict[str, dict] = {}  # node -> what holds its memory (readings.held), as last read
        # executor "ray": node -> {ip, node_id} of the Ray node each node's ranks run on, recorded at
        # this start (node/raynodes); Ray's node table is read against it at most once per interval_s
        # (ray_read_at: time.monotonic()); a second Ray node live at a recorded node's IP is journalled
        # once per start (ray_others: their node_ids); the start's wait while two Ray nodes are live
        # at one IP (two_ids: theirs, two_since: time.monotonic() since when)
        self.ray_nodes: dict[str, dict] = {}
        self.ray_read_at = float("-inf")
        self.ray_others: set[str] = set()
        self.two_ids: frozenset[str] = frozenset()
        self.two_since = 0.0
        self.older: str | None = None  # the start's wait on a raylet older than its agent, and since when
        self.older_since = 0.0
        self.log_offset = 0  # where this start's lines begin in SERVE_LOG (its all-reduce lines, issue 59)
        # every node's CX7 AER counters as last read (issue 59): sysfs path -> counters; a rise is journalled
        self.aer_seen: dict[str, dict[str, dict]] = {}
        self.aer_read_at = float("-inf")
        # issue 75: this node's kernel log reader and NVML (the agent's, set after construction; None
        # where none), and this start's power and energy per token (node/energy)
        self.kernel: kernel_log.KernelWatch | None = None
        self.nvml = None
        self.energy = Energy()
        self.fabric = None  # this node's node/fabric_watch.FabricWatch (the agent's); None: no data plane
        self.fabric_hold: dict | None = None  # out of rotation while the fabric is unhealthy (issue 75)
        self.kernel_seen: dict[str, float] = {}  # peer -> the newest of its kernel events journalled here

    # -- state
    def clock(self) -> float:
        """The wall clock."""
        return time.time()

    def state_fields(self, policy: Policy) -> dict:
        """What the engine's state file holds beside the fields every supervisor's holds."""
        return {
            "tokens_per_s": self.rate if self.proc else None,
            "policy": policy.doc(),
            "memory_unknown": self.memory_unknown,
            "epoch": self.epoch if self.proc else None,
            **({"ray_nodes": self.ray_node_ids()} if self.proc and self.ray_nodes else {}),
            **(
                {"executor": "mp", "ranks": {n: (r or {}).get("rank") for n, r in self.reports.items()}}
                if self.mp
                else {}
            ),
            "activity": self.watch.activity if self.watch else "",
            **({"refusal": self.refusal} if self.refusal else {}),
            **(
                {"power_w": self.energy.power_w, "joules_per_1k_tokens": self.energy.joules_per_1k} if self.proc else {}
            ),
            **({"fabric_hold": self.fabric_hold} if self.fabric_hold else {}),
        }

    def set_report(self) -> dict:
        """What the workers' agents follow (executor "mp"): the server, this start's epoch, and
        whether a set runs now (its ranks are wanted)."""
        return {"generation": self.generation, "epoch": self.epoch, "run": self.proc is not None}

    def policy(self, desired: Desired | None = None) -> Policy:
        """The bounds of the desired state just read (each tick reads it once), else the last known."""
        if desired is not None:
            self._policy = Policy.of(desired.policy)
        return self._policy

    def adopt(self, desired: Desired) -> None:
        """A server `up` asked for, or (after this container restarted: a reboot, a crash) the one
        it asked for before, whose restart count and final verdicts carry over: a reboot does not
        reset the bound, and a server stopped for memory stays stopped."""
        self.stop("replaced by a new start from sparkcluster up")
        before = Supervised.of(read_json(self.state_path))
        self.generation, self.next_start = desired.generation, 0.0
        if not self.resume(before):
            self.restarts, self.causes, self.first_start = [], [], True
            if self.state in FINAL:
                self.state = IDLE
        self.memory_wait_since = None
        self.wanted, self.refusal = False, ""  # on demand: on standby until a wake
        self.woken.clear()

    # -- on demand
    def wake(self, token: str) -> tuple[int, dict]:
        """A caller asks for the engine (the report server's `POST /wake`, another thread): (HTTP
        status, answer). Only with the deployment's wake token, compared in constant time; only for
        a server on demand. It sets a flag the next tick acts on: a wake while the engine starts or
        serves is a no-op, so many wakes start it once."""
        code, doc = self.wake_token_ok(token)
        if code != 202:
            return code, doc
        self.woken.set()
        return 202, {"state": self.state}

    def yield_(self, token: str) -> tuple[int, dict]:
        """The gateway asks this engine on demand to stop for another deployment on its nodes (the
        report server's `POST /yield`, another thread; issue 60): (HTTP status, answer). The same
        token as a wake; only for a server on demand. The next tick stops an engine that serves and
        has no request running (`yield_stop`); one starting or busy keeps on."""
        code, doc = self.wake_token_ok(token)
        if code != 202:
            return code, doc
        if self.proc is None:  # nothing runs, nothing is held: nothing to yield (never a later start's)
            return 409, {"error": "no engine runs here", "state": self.state}
        self.yielding.set()
        return 202, {"state": self.state}

    def ask(self, what: str, token: str, who: str) -> tuple[int, dict]:
        """The console's action (the report server's `POST /restart` or `POST /standby`, another
        thread; node/console_calls): (HTTP status, answer). The deployment's token, as a wake's; a
        restart needs an engine that runs, a return to standby an engine on demand that runs. The
        next tick acts on it and journals it with `who` (the console key's name)."""
        code, doc = self.token_ok(token)
        if code != 202:
            return code, doc
        if what == "standby" and not self._policy.on_demand:
            return 409, {"error": "this deployment is not on demand: it has no standby", "state": self.state}
        if self.proc is None:
            return 409, {"error": "no engine runs here", "state": self.state}
        self.owner_ask = (what, who)
        self.woken.set()  # acted on at once, not at the next look
        return 202, {"state": self.state}

    @staticmethod
    def _token_matches(token: str) -> bool:
        """`token` is the deployment's (WAKE_PATH), compared in constant time; none written: no match."""
        try:
            with open(WAKE_PATH) as f:
                want = f.read().strip()
        except OSError:
            want = ""
        return bool(want) and hmac.compare_digest(token.encode(), want.encode())

    def token_ok(self, token: str) -> tuple[int, dict]:
        """The deployment's token, with a server wanted here."""
        if not self._token_matches(token):
            return 401, {"error": "missing or wrong token"}
        if self.generation is None:
            return 409, {"error": "no server is wanted here", "state": self.state}
        return 202, {}

    def owner_act(self) -> bool:
        """The console's ask (`ask`), if any, carried out on a running engine: a restart stops it and
        starts it again at once (memory back first, as after a verdict; not counted against the
        restart bound, which is for the engine's own faults); a return to standby stops it. True
        when it acted."""
        asked, self.owner_ask = self.owner_ask, None
        if asked is None or self.proc is None:
            return False
        what, who = asked
        self.journal.write(f"console: {what}", by=who)
        self.stop(f"asked from the console by {who}: {what}")
        if what == "standby":
            self.wanted = False
            self.set_state(STANDBY, why=f"stopped from the console by {who}")
        else:
            self.next_start = 0.0
            self.set_state(RESTARTING, cause=f"restarted from the console by {who}")
        return True

    def wake_token_ok(self, token: str) -> tuple[int, dict]:
        if not self._token_matches(token):
            return 401, {"error": "missing or wrong wake token"}
        if not self._policy.on_demand or self.generation is None:
            return 409, {"error": "no server on demand here", "state": self.state}
        return 202, {}

    def yield_stop(self, busy: bool) -> bool:
        """A yield asked for (`yield_`): an engine serving with no request running is stopped (its
        container stays) and back on standby; True when it stopped. Consumes the ask either way: the
        gateway asks again if the woken one still does not fit."""
        if not self.yielding.is_set():
            return False
        self.yielding.clear()
        if busy or not self.watch.ready:
            self.journal.write("yield declined: the engine is busy or not serving yet")
            return False
        self.stop("yielding its memory to another deployment on its nodes")
        self.wanted = False
        self.journal.write("yielded: stopped for another deployment")
        self.set_state(STANDBY, why="yielded")
        return True

    def admit(self, policy: Policy) -> bool:
        """A wake's start, admitted only when every node has the profile's headroom; else the state
        says refused and why (journalled when the refusal changes). Consumes the wake."""
        self.woken.clear()
        ok, why = admission(self.node_memory(), self.held, policy)
        if ok:
            self.yielding.clear()  # an ask for the engine before this start is not this start's
            self.wanted, self.refusal = True, ""
            self.journal.write("woken on demand", generation=self.generation)
            return True
        if why != self.refusal:
            self.causes.append({"ts": time.time(), "kind": "admission", "cause": why})
            self.journal.write("start refused: not enough memory", cause=why)
        self.refusal = why
        self.set_state(REFUSED, cause=why)
        return False

    # -- the engine
    def start(self, desired: Desired) -> None:
        secrets = read_json(SECRETS_PATH) or {}
        env = {**os.environ, **{k: str(v) for k, v in secrets.items()}}
        self.reading = StartReading(self.cfg.get("compile_cache"), SERVE_LOG)
        self.log_offset = log_size(SERVE_LOG)
        self.epoch = token_hex(4) if self.mp else None
        self.proc = spawn(list(desired.argv), SERVE_LOG, engine_log.SERVE_MARK, env)
        record = {
            k: getattr(desired, k)
            for k in ("profile", "model", "port", "host", "salt", "secrets_digest", "generation", "policy")
        }
        ray = {"ray_nodes": self.ray_node_ids()} if self.ray_nodes else {}  # what its ranks run on
        write_json(self.record_path, {**record, "pid": self.proc.pid, "exec_id": "", "started_at": time.time(), **ray})
        self.watch = Watch(started=time.time())
        self.energy = Energy()
        self.ray_read_at, self.ray_others = float("-inf"), set()
        self.journal.write(
            f"{self.child_name} started",
            pid=self.proc.pid,
            generation=desired.generation,
            **({"epoch": self.epoch} if self.mp else {}),
            **ray,
        )
        self.set_state(STARTING)

    def stop(self, why: str, verdict: bool = False) -> None:
        """Stops the engine (Lifecycle.stop); the Ray nodes recorded at its start go with it, and so
        does a console's ask for it (`ask`): it was for the engine that stops."""
        self.owner_ask = None
        if self.proc is None:
            return
        super().stop(why, verdict)
        self.ray_nodes = {}

    # -- looks
    def nodes_ready(self) -> str | None:
        """None when every node is a live Ray member with its GPUs, else what is missing. With Ray,
        also records which Ray node each node's ranks will run on (self.ray_nodes: node/raynodes),
        once that is unambiguous: one live Ray node at each node's IP, started after its agent."""
        self.ray_nodes = {}
        if self.mp:
            self.read_reports()
            return ranks_waiting(self.cfg, self.reports, self.generation)
        if not self.cfg.get("ray_argv"):  # one node, no Ray: nothing to wait for
            return None
        rows, complete, why = self.ray_table(self.cfg["state_api"], RAY_START_READ_S)
        if not rows:
            return "Ray's state API does not answer yet" + (f" ({why})" if why else "")
        for want in self.cfg["nodes"]:
            if alive_gpus(rows, want["ip"]) < want["gpus"]:
                if not complete:
                    return (
                        f"{want['name']} ({want['ip']}) is not among the {len(rows)} live Ray nodes the state API "
                        "returned: it cut its table at the request's limit, so whether it is a member is unknown"
                    )
                return f"{want['name']} is not a Ray member at {want['ip']} with {want['gpus']} GPU(s)"
        self.read_reports()
        agents = self.agents_started()
        two = two_at_one_ip(rows, self.cfg["nodes"])
        ids = frozenset(r.get("node_id") or "" for r in two[1]) if two else frozenset()
        if ids != self.two_ids:
            self.two_ids, self.two_since = ids, time.monotonic()
        if two:
            return waiting_on_two(*two, time.monotonic() - self.two_since, agents)
        older = older_than_agent(rows, self.cfg["nodes"], agents)
        if older != self.older:
            self.older, self.older_since = older, time.monotonic()
        if older and time.monotonic() - self.older_since < STRAY_AFTER_S:
            return older
        if older:  # Ray declares a replaced raylet dead within 13-30 s: this one is the node's own
            self.journal.write(
                "a Ray node that started before its agent is taken as the node's own",
                why=older,
                waited_s=round(time.monotonic() - self.older_since, 1),
                hint="the host's clock stepped back between the agent's start and the raylet's (NTP at boot?)",
            )
            self.older = None
        self.ray_nodes = engine_nodes(rows, self.cfg["nodes"])
        return None

    def read_peer(self, peer: dict) -> tuple[int | None, str]:
        """A peer's MemAvailable, or (None, why not), its report kept in self.reports (None:
        unanswered). Read once per tick whoever asks (the memory wait, then the start's readiness):
        a peer that does not answer costs its timeout once, not once per reader."""
        memo = self._peer_reads
        if memo is not None and peer["name"] in memo:
            return memo[peer["name"]]
        got: dict = {}
        read = peer_memory(peer["ip"], self.cfg["report_port"], seen=got)
        self.reports[peer["name"]] = got.get("report")
        if memo is not None:
            memo[peer["name"]] = read
        return read

    def read_reports(self) -> None:
        """Every peer's last report (memreport.node_report) into self.reports (None: unanswered)."""
        for peer in self.cfg.get("peers", []):
            self.read_peer(peer)

    def agents_started(self) -> dict[str, float]:
        """node -> when its agent started, where known: this node's own, and each peer's from its last
        report (an older agent's report does not say)."""
        out = {self.cfg["node"]: self.agent_started}
        for peer, rep in self.reports.items():
            out[peer] = (rep or {}).get("agent_started")
        return {n: t for n, t in out.items() if isinstance(t, (int, float)) and not isinstance(t, bool)}

    def ray_table(self, url: str, timeout: float) -> tuple[list[dict], bool, str]:
        """Ray's node table at `url` (contract.STATE_API_URL: the live nodes; or one node by its
        node_id, readings.ray_node_query) as (rows, complete: readings.ray_listing, why not: "" when
        it answered). A dashboard that is starting or restarting refuses, resets or cuts its answer
        short (OSError, or http.client's IncompleteRead, BadStatusLine): no rows, no judgement."""
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                rows, complete = ray_listing(r.read().decode(errors="replace"))
        except (OSError, http.client.HTTPException) as e:
            return [], False, f"{type(e).__name__}: {e}"
        return rows, complete, ""

    def ray_node_ids(self) -> dict[str, str]:
        return {name: rec["node_id"] for name, rec in self.ray_nodes.items()}

    def ray_node_lost(self, mono: float, policy: Policy) -> dict:
        """Executor "ray": the verdict's evidence when a Ray node the engine's ranks run on is DEAD
        or gone since this start (node/raynodes.node_lost), else {}. Ray's table of live nodes is read
        from the dashboard on loopback at most once per look interval (`mono`: time.monotonic()):
        about 1 ms of this process's CPU per read (tests/captured/ray-2.60/README.md); a recorded
        node not in it is then read by its node_id, for Ray's state and reason. A second node live
        at a recorded node's IP is journalled once (node/raynodes.others_at_ip), not judged. No
        answer judges nothing."""
        if not self.ray_nodes or mono - self.ray_read_at < policy.interval_s:
            return {}
        self.ray_read_at = mono
        rows, complete, _ = self.ray_table(self.cfg["state_api"], RAY_READ_S)
        if not rows:
            return {}
        listed = {r.get("node_id") for r in rows}
        gone = [rec["node_id"] for _, rec in sorted(self.ray_nodes.items()) if rec["node_id"] not in listed]
        if gone:  # its own row, whatever its state: the first such node's (the verdict names one)
            own, _, _ = self.ray_table(ray_node_query(self.cfg["state_api"], gone[0]), RAY_READ_S)
            rows = rows + [r for r in own if r.get("node_id") == gone[0]]
        for other in others_at_ip(rows, self.ray_nodes):
            if other["other_node_id"] not in self.ray_others:
                self.ray_others.add(other["other_node_id"])
                self.journal.write("another Ray node at an engine node's IP", **other)
        return node_lost(rows, complete, self.ray_nodes)

    def low_memory(self, policy: Policy) -> dict[str, int]:
        floor = policy.memory_floor_gib * 2**30
        seen: dict[str, int | None] = {}
        with open("/proc/meminfo") as f:
            seen[self.cfg["node"]] = mem_available(f.read())
        unknown = {}
        for peer in self.cfg.get("peers", []):
            seen[peer["name"]], why = self.read_peer(peer)
            if why:
                unknown[peer["name"]] = why
        if set(unknown) != set(self.memory_unknown):  # journalled when it changes, not every look
            self.journal.write(
                "memory unknown" if unknown else "memory known again",
                nodes=sorted(unknown) or sorted(self.memory_unknown),
                why=unknown or None,
            )
        self.memory_unknown = unknown
        self.memory_seen = dict(seen)
        return {n: v for n, v in seen.items() if v is not None and v < floor}

    def node_memory(self) -> dict[str, tuple[int | None, int | None]]:
        """Every node's (MemTotal, MemAvailable): this node's /proc/meminfo, the peers' reports."""
        with open("/proc/meminfo") as f:
            text = f.read()
        out = {self.cfg["node"]: (mem_total(text), mem_available(text))}
        holders = {self.cfg["node"]: held(text)}
        for peer in self.cfg.get("peers", []):
            avail, _ = self.read_peer(peer)
            report = self.reports.get(peer["name"]) or {}
            total = report.get("mem_total")
            out[peer["name"]] = (total if isinstance(total, int) else None, avail)
            holders[peer["name"]] = report.get("mem_held") or {}
        self.held = holders
        return out

    def memory_before_restart(self, policy: Policy) -> bool:
        """True while a restart must wait for memory (journalled when the wait starts and ends);
        past the bound, the server is stopped for good with what was seen."""
        covered, seen = memory_for_restart(self.node_memory(), policy)
        now = time.time()
        step = self.memory_wait_step(covered, seen, policy, now)
        if step == "give-up":
            cause = f"memory did not come back within {policy.memory_wait_s:g}s: " + "; ".join(
                f"{n}: {v}" for n, v in sorted(seen.items())
            )
            self.causes.append({"ts": now, "kind": "memory-wait", "cause": cause})
            self.journal.write("memory did not come back", waited_s=round(now - self.memory_wait_since, 1), seen=seen)
            self.memory_wait_since = None
            self.set_state(
                NO_MEMORY,
                cause=cause,
                fix="find what holds the memory (a leftover process, /dev/shm, the page cache), then sparkcluster up",
            )
        return step != "go"

    def look(self, desired: Desired, policy: Policy) -> Look:
        # the engine's own address: loopback, or the head's control address when it listens only there
        base = desired.base_url
        look = Look(
            now=time.time(),
            alive=self.proc is not None and self.proc.poll() is None,
            low_memory=self.low_memory(policy),
        )
        if not look.alive:
            return look
        if self.mp:
            look.ranks_gone = rank_problem(self.cfg, self.reports, self.epoch, self.watch.started, look.now)
        look.ray_lost = self.ray_node_lost(time.monotonic(), policy)
        look.health = http_status(f"{base}/health", 3)
        if look.health != 200:
            return look
        # taken before /metrics is read: a probe that returned before this look is in this reading's
        # request counter (verdict.idle_for counts it as the supervisor's own)
        look.probe = self.probe_answer()
        look.probe_in_flight = int(self.probe_run is not None and self.probe_run.watch is self.watch)
        try:
            with urllib.request.urlopen(f"{base}/metrics", timeout=3) as r:
                text = r.read().decode(errors="replace")
            look.running, look.generated = engine_figures(text)
            look.progress = progress_figures(text)
        except (OSError, ValueError):
            pass
        if look.generated is not None:
            if self._last_count and look.now > self._last_count[0]:
                self.rate = max(0.0, (look.generated - self._last_count[1]) / (look.now - self._last_count[0]))
            self._last_count = (look.now, look.generated)
        due = not self.watch.ready or look.now - self.last_probe >= policy.probe_interval_s
        if due and self.probe_run is None:  # probe_answer left only this start's, still in flight
            self.last_probe = look.now
            self.send_probe(base, desired.model, policy.probe_timeout_s)
        return look

    def send_probe(self, base: str, model: str, timeout: float) -> None:
        """Starts this start's one-token probe on its own thread; a look takes its answer."""

        def send() -> str:
            return one_token(base, model, (read_json(SECRETS_PATH) or {}).get("VLLM_API_KEY"), timeout)

        self.probe_run = ProbeRun(self.watch, send)
        self.probe_run.thread.start()

    def probe_answer(self) -> str | None:
        """The answer of this start's probe if it returned since the last look (counted, with its
        duration, for node/metrics), else None. A probe sent to an earlier start is dropped, in
        flight or not: its answer is not this engine's, and it holds back none of this one's."""
        run = self.probe_run
        if run is None:
            return None
        if run.watch is not self.watch:
            self.probe_run = None
            return None
        if not run.done.is_set():
            return None
        self.probe_run = None
        self.last_probe_s, self.last_probe_ok = run.seconds, run.answer == ""
        self.count("probe:ok" if run.answer == "" else "probe:failed")
        return run.answer

    def idle_stop(self, idle: float, policy: Policy) -> None:
        """On demand: an engine ready and idle for the TTL is stopped (its container stays) and the
        server is back on standby until the next wake."""
        ttl = policy.idle_ttl_s
        if not self.watch.ready or idle < ttl:
            return
        self.stop(f"idle for {idle:.0f}s (on demand's TTL is {ttl:g}s)")
        self.wanted = False
        self.journal.write("idle: stopped after TTL", idle_s=round(idle, 1), ttl_s=ttl)
        self.set_state(STANDBY, why="idle TTL")

    def journal_all_reduce(self) -> None:
        """The all-reduce backend this start's ranks chose, as this node's serve log says (every rank's
        under Ray, this node's under `mp`), judged against the environment the profile gave the engine."""
        ar = engine_log.all_reduce({self.cfg["node"]: "\n".join(log_lines(SERVE_LOG, self.log_offset))})
        status, what, fix = engine_log.judge_all_reduce(ar, dict(os.environ))
        if status == "unknown":
            return
        self.journal.write(
            "all-reduce", status=status, backend=ar.serving(), detail=what, **({"fix": fix} if fix else {})
        )

    def watch_aer(self, now: float) -> None:
        """Every node's CX7 AER counters (this node's from sysfs, each peer's from its last report),
        at most every AER_EVERY_S; a counter that rose since the last read is journalled (issue 59)."""
        if now - self.aer_read_at < aer.AER_EVERY_S:
            return
        self.aer_read_at = now
        counters = {self.cfg["node"]: aer.read()}
        for peer, rep in self.reports.items():
            if isinstance((rep or {}).get("aer"), dict):
                counters[peer] = rep["aer"]
        for node, now_seen in counters.items():
            for rise in aer.rises(self.aer_seen.get(node), now_seen):
                self.journal.write("cx7 aer", node=node, **rise)
                self.count("aer:" + rise["severity"])
            self.aer_seen[node] = now_seen

    def watch_power(self, look) -> None:
        """Every node's GPU power (this node's NVML, each peer's report) into this start's energy per
        token and the "busy but low power" signal, journalled when it begins (node/energy)."""
        own = power_report(self.nvml.readings()).get("gpu_power_w") if self.nvml is not None else None
        if self.nvml is None or own is None:
            return  # no NVML here (the agent's stand-in without one): no power, no figure
        powers = {self.cfg["node"]: own}
        for peer in self.cfg.get("peers", []):
            powers[peer["name"]] = (self.reports.get(peer["name"]) or {}).get("gpu_power_w")
        running = look.progress.get("vllm:num_requests_running", look.running or 0.0)
        if self.energy.update(look.now, powers, look.generated, busy=bool(running)):
            self.journal.write("busy but low power", evidence=self.energy.signal(), power_w=powers)

    def fabric_problems(self) -> dict[str, list[str]]:
        """node -> what its fabric watch found unhealthy at its last look (this node's, each peer's report)."""
        healths = {self.cfg["node"]: self.fabric.last if self.fabric is not None else None}
        for peer in self.cfg.get("peers", []):
            healths[peer["name"]] = (self.reports.get(peer["name"]) or {}).get("fabric_health")
        return {
            n: list(h.get("problems") or []) for n, h in healths.items() if isinstance(h, dict) and h.get("problems")
        }

    def watch_fabric(self, policy: Policy, now: float) -> None:
        """The fabric hold (issue 75): begun at the first look that finds any node's fabric unhealthy,
        ended by `sparkcluster fabric resume` (a mark newer than the hold) or, with auto resume, after
        fabric_resume_polls looks in a row with every node healthy. The engine keeps running (with the
        profile's fabric_stop it is stopped, and started again once the hold ends); the state file
        carries the hold, and with it the gateway's and status' judgement (contract.availability)."""
        problems = self.fabric_problems()
        why = "; ".join(f"{n}: {', '.join(p)}" for n, p in sorted(problems.items()))
        hold = self.fabric_hold
        if hold is None:
            if problems and policy.fabric_hold:
                self.fabric_hold = {
                    "since": now,
                    "why": why,
                    "nodes": sorted(problems),
                    "healthy_polls": 0,
                    "polls": policy.fabric_resume_polls,
                    "auto": policy.fabric_auto_resume,
                }
                self.count("fabric:hold")
                stop = policy.fabric_stop and self.proc is not None
                self.journal.write(
                    "fabric hold", why=why, nodes=sorted(problems), engine="stopped" if stop else "left running"
                )
                if stop:  # the profile's choice: the engine stops, and starts again when the hold ends
                    self.fabric_hold["stopped"] = True
                    self.stop(f"the fabric is unhealthy: {why}")
                    self.set_state(WAITING, missing=f"the fabric hold: {why}")
            elif problems and self.state == SERVING:
                self.journal.write("fabric unhealthy (hold off in the profile)", why=why)
            return
        try:
            resumed = os.stat(FABRIC_RESUME_PATH).st_mtime >= hold["since"]
        except OSError:
            resumed = False
        if resumed:
            return self.end_fabric_hold("sparkcluster fabric resume")
        if problems:
            hold.update(why=why, nodes=sorted(set(hold["nodes"]) | set(problems)), healthy_polls=0)
            return
        hold["healthy_polls"] += 1
        if hold.get("auto") and hold["healthy_polls"] >= hold.get("polls", policy.fabric_resume_polls):
            self.end_fabric_hold(f"{hold['healthy_polls']} healthy looks")

    def watch_nodes(self, look, policy: Policy) -> None:
        """What a look reads of the nodes beside the engine: their CX7 AER counters, GPU power, fabric
        and kernel events (issue 59, issue 75)."""
        self.watch_aer(time.monotonic())
        self.watch_power(look)
        self.watch_fabric(policy, look.now)
        self.watch_peer_kernels()

    def fabric_stopped(self, policy: Policy) -> bool:
        """True while a hold under the profile's fabric_stop keeps the engine stopped: every node's
        fabric is read again (the peers' reports), and the hold ends as a running engine's does."""
        if self.fabric_hold is None or not self.fabric_hold.get("stopped"):
            return False
        self.read_reports()
        self.watch_fabric(policy, time.time())
        if self.fabric_hold is None:
            return False
        self.save()
        return True

    def end_fabric_hold(self, by: str) -> None:
        hold, self.fabric_hold = self.fabric_hold or {}, None
        held = round(time.time() - float(hold.get("since") or time.time()), 1)
        self.journal.write("fabric resumed", by=by, held_s=held, was=hold.get("why", ""))

    def watch_peer_kernels(self) -> None:
        """Each peer's kernel events (its report's `kernel.recent`) journalled here as it journals
        them there, so `events`, which reads the head's journal, shows every node's (issue 75). The
        first report of a peer sets where its events start: what it journalled before is its own."""
        for peer, rep in sorted(self.reports.items()):
            recent = ((rep or {}).get("kernel") or {}).get("recent") or []
            stamps = [float(e.get("ts") or 0) for e in recent]
            if peer not in self.kernel_seen:
                self.kernel_seen[peer] = max(stamps, default=0.0) if recent else 0.0
                if recent:
                    continue
            for ev, ts in zip(recent, stamps):
                if ts > self.kernel_seen[peer]:
                    fields = {("at" if k == "ts" else k): v for k, v in ev.items()}
                    self.journal.write("kernel event", node=peer, **fields)
            self.kernel_seen[peer] = max([self.kernel_seen[peer], *stamps])

    def kernel_faults(self, since: float) -> dict[str, list[dict]]:
        """Each node's Xid and OOM-kill events since `since` (this node's reader, each peer's report)."""
        out: dict[str, list[dict]] = {}
        if self.kernel is not None:
            out[self.cfg["node"]] = kernel_log.fresh_faults(self.kernel.report()["recent"], since)
        for peer, rep in self.reports.items():
            recent = ((rep or {}).get("kernel") or {}).get("recent") or []
            out[peer] = kernel_log.fresh_faults(recent, since)
        return out

    def with_evidence(self, kind: str, cause: str, judged: float) -> str:
        """A verdict's cause with what the kernel reported on any node since this start (an Xid, an OOM
        kill, within the last FRESH_S) and, for a wedge, the busy-but-low-power signal."""
        if kind == "wedged" and self.energy.low:
            cause = f"{cause}; {self.energy.signal()}"
        since = max(self.watch.started if self.watch else 0.0, judged - kernel_log.FRESH_S)
        return kernel_log.with_kernel(cause, self.kernel_faults(since))

    # -- one turn of the loop
    def tick(self) -> None:
        self._peer_reads = {}  # this tick's read of each peer (read_peer)
        try:
            self._tick()
        finally:
            self._peer_reads = None

    def _tick(self) -> None:
        raw = read_json(DESIRED_PATH)
        if raw is None and os.path.exists(DESIRED_PATH):  # caught mid-write: the next look has it
            return
        desired = Desired.of(raw)
        if desired is None or not desired.argv:
            if self.proc is not None:
                self.stop("disabled (sparkcluster down, or up replacing the server)")
            self.generation, self.wanted, self.refusal = None, False, ""
            self.set_state(IDLE)
            return
        policy = self.policy(desired)
        if desired.generation != self.generation:
            self.adopt(desired)
        if self.state in FINAL:
            self.save()
            return
        if self.proc is None:
            if policy.on_demand and not self.wanted:
                if not self.woken.is_set():  # on standby: nothing runs, nothing is held
                    if self.state not in WAKEABLE:
                        self.set_state(STANDBY)
                    else:
                        self.save()
                    return
                if not self.admit(policy):
                    return
            if self.fabric_stopped(policy):  # the profile's fabric stop: no start until the hold ends
                return
            if time.time() < self.next_start:  # the backoff: still watching, as the state file says
                self.save()
                return
            if not self.first_start and not policy.act:
                self.set_state(IDLE, why="supervision is off in the profile: nothing is restarted")
                return
            # a restart (after a verdict, or this container's own restart) waits until the killed
            # engine's memory is back on every node: relaunching into it wedges hosts (issue 35)
            if not self.first_start and self.memory_before_restart(policy):
                return
            missing = self.nodes_ready()
            if missing:
                self.set_state(WAITING, missing=missing)
                return
            if read_json(DESIRED_PATH) is None:  # `down` won the race
                return
            self.start(desired)
            return
        self.woken.clear()  # a wake while it starts or serves: nothing to do
        if self.owner_act():
            return
        look = self.look(desired, policy)
        self.watch_nodes(look, policy)
        if self.proc is None:  # the profile's fabric stop stopped the engine at this look
            return
        self.last_look = look.now
        before = self.watch.activity
        found = verdict(self.watch, look, policy)
        if self.watch.activity and not before:  # journalled when it starts, with its evidence
            self.journal.write("prefilling", evidence=self.watch.activity)
        if found is None:
            if self.watch.ready:
                if self.state != SERVING and not self.first_start:  # a restart serves again: its answers (issue 38)
                    canary.after_restart(self.journal, desired)
                self.first_start = False
                if self.reading is not None:  # once per start: hit or miss, compile seconds
                    self.reading.done(self.journal)
                    self.reading = None
                if self.state != SERVING:  # after `up`'s start and after every restart (issue 59)
                    self.journal_all_reduce()
                self.set_state(SERVING)
            else:
                self.save()
            if policy.on_demand:
                idle = idle_for(self.watch, look)  # 0 while a request runs or waits
                if not self.yield_stop(busy=idle <= 0):
                    self.idle_stop(idle, policy)
            return
        kind, cause = found
        # the evidence a verdict rests on, journalled beside its cause (a Ray node's old and new node_id)
        evidence = (
            {k: v for k, v in look.ray_lost.items() if k != "cause"} if look.ray_lost.get("cause") == cause else {}
        )
        judged = time.time()
        cause = self.with_evidence(kind, cause, judged)
        served = self.watch.ready
        decision = decide(kind, policy, self.first_start, self.restarts, judged, served)
        if decision.action == "watch":  # watched, journalled once, left alone
            if not self.causes or self.causes[-1]["cause"] != cause:
                self.causes.append({"ts": time.time(), "kind": kind, "cause": cause})
                self.journal.write(
                    VERDICT_EVENT, kind=kind, cause=cause, action="none: supervision is off in the profile", **evidence
                )
                self.count(f"verdict:{kind}")
            self.save()
            return
        self.causes.append({"ts": judged, "kind": kind, "cause": cause})
        if kind == "dead":  # what the engine itself said first, beside the supervisor's cause (issue 62)
            evidence.update(first_failure(SERVE_LOG))
        self.journal.write(VERDICT_EVENT, kind=kind, cause=cause, **evidence)
        self.count(f"verdict:{kind}")
        # published before the stop, which may take verdict_grace_s: the gateway acts on the verdict now
        self.save()
        self.stop(cause, verdict=True)
        if decision.state == MEMORY:
            self.set_state(
                MEMORY,
                cause=cause,
                fix="lower gpu_memory_utilization or add enforce_eager in the profile, then sparkcluster up",
            )
        elif decision.state == FAILED:
            self.set_state(FAILED, cause=cause)
        elif decision.state == LIMIT:
            self.set_state(LIMIT, cause=cause, restarts=len(self.restarts))
        else:
            self.restarts.append(time.time())
            self.count("restarts")
            self.next_start = judged + decision.wait_s
            self.set_state(RESTARTING, cause=cause, attempt=len(self.restarts))
