"""What the controller and the node agent agree on: where the agent's files live in a container,
the supervisor's states (`State`: status shows them verbatim), its default bounds, and the two files
between them as typed records (`Desired`: desired.json; `Supervised`: the state file) with the one
judgement of whether a deployment serves (`Supervised.availability`).

Standard library only, like everything in this package: it is shipped into every container."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum

# the role of a service's container (issue 60 item 2: a profile of kind "service"), in its agent's
# config and its role label: its agent runs node/service's supervisor rather than an engine's
SERVICE_ROLE = "service"
AGENT_DIR = "/opt/sparkcluster"  # the package's files, as `node/`, and the launcher as `__main__.py`
CONFIG_PATH = "/etc/sparkcluster/agent.json"
DESIRED_PATH = "/etc/sparkcluster/serve-desired.json"
SECRETS_PATH = "/etc/sparkcluster/serve-secrets.json"
# on demand (issue 36): the one token that lets a caller (the gateway) ask the head agent to start a
# deployment on standby; 0600, written by `up`, opens nothing else (never the engine's environment)
WAKE_PATH = "/etc/sparkcluster/wake-token"
RECORD_PATH = "/run/sparkcluster/serve.json"
# exits 0 when the PID the record names still runs in the container: the shell's own kill (a slim
# image has no procps); read by `status` and by `up` (deployment/server.current) in one exec each
SERVER_ALIVE_SH = f'kill -0 "$(sed -n \'s/.*"pid": *\\([0-9][0-9]*\\).*/\\1/p\' {RECORD_PATH})"'
STATE_PATH = "/run/sparkcluster/supervisor.json"
RANK_PATH = "/run/sparkcluster/rank.json"  # executor "mp": a worker's rank, its epoch and exit (node/ranks)
JOURNAL_PATH = "/var/log/sparkcluster/journal.jsonl"
# the last fabric test's figures on this node, written by the controller (fabric/record), read by node/metrics
FABRIC_PATH = "/var/log/sparkcluster/fabric.json"
SERVE_LOG = "/var/log/sparkcluster/vllm-serve.log"
# the correctness canary (node/canary): the reference answers the controller leaves for the supervisor,
# and the last comparison (after a restart, or made by the controller), which `status` shows
CANARY_PATH = "/etc/sparkcluster/canary.json"
CANARY_CHECK_PATH = "/var/log/sparkcluster/canary-check.json"
# every rank's NCCL writes at init which transport it chose, to a file of its own (fabric/engine_nccl)
NCCL_LOG_DIR = "/var/log/sparkcluster"
NCCL_LOG_ENV = {
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
    "NCCL_DEBUG_FILE": f"{NCCL_LOG_DIR}/nccl.%h.%p.log",
}
# the operator's `sparkcluster fabric resume` (issue 75): a mark the head's supervisor reads at its next
# look; a fabric hold older than the mark ends (node/fabric_watch)
FABRIC_RESUME_PATH = "/etc/sparkcluster/fabric-resume"
JOURNAL_KEEP = 2000  # lines kept when the journal is trimmed
# Ray's state API (what `ray list nodes` reads), served by the dashboard on the head's loopback: the
# agent reads it from inside the head container, the controller from the head host (deployment/ray_members).
# One HTTP request: far cheaper than starting a Ray driver to ask. Only the live nodes, by Ray's own
# filter (`ray list nodes -f state=ALIVE`): DEAD rows stay in the GCS's table for its lifetime and
# the API sorts rows by node_id before it cuts them at `limit`, so an unfiltered read of 100 rows can
# leave a live node out; with each node's start (`detail`: NodeState's start_time_ms, the raylet's).
# The limit is far above any cluster's live nodes and below Ray's own cap (10000,
# RAY_MAX_LIMIT_FROM_API_SERVER). A DEAD node's row is read by its node_id (readings.ray_node_query).
DASHBOARD_PORT = 8265  # Ray's default dashboard port (`ray start --dashboard-port`); a later slot's moves


def state_api_url(dashboard_port: int = DASHBOARD_PORT) -> str:
    """The state API's live-nodes URL on a deployment's dashboard port (issue 60: one per slot)."""
    return (
        f"http://127.0.0.1:{int(dashboard_port)}/api/v0/nodes"
        "?filter_keys=state&filter_predicates=%3D&filter_values=ALIVE&detail=true&limit=1000"
    )


STATE_API_URL = state_api_url()


class State(str, Enum):  # noqa: UP042 (StrEnum is 3.11+: a service image may run an older python3)
    """The supervisor's states, each written once: the state file, `status` and the metrics' `state`
    label carry the value verbatim (a str, so what is on disk and what was compared before read the
    same). Renaming or adding one fails the tests that hold the alert rules and the metrics to it."""

    IDLE = "idle"
    WAITING = "waiting for nodes"
    STARTING = "starting"
    SERVING = "serving"
    RESTARTING = "restarting"
    # before a restart: every node's MemAvailable must cover the engine again
    MEMORY_WAIT = "waiting for memory to come back"
    LIMIT = "restart limit reached"
    MEMORY = "stopped: memory floor"
    FAILED = "failed to start"
    NO_MEMORY = "stopped: memory did not come back"
    # on demand (a profile's [on_demand]): the engine is not running and holds no memory until a wake;
    # a wake whose start did not fit a node's memory is refused (not final: the next wake asks again)
    STANDBY = "standby"
    REFUSED = "refused: not enough memory"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def of(cls, value: object) -> State | None:
        """The state a file says (its string), None for none or one this agent does not know."""
        try:
            return cls(value)
        except ValueError:
            return None

    @property
    def final(self) -> bool:
        """Nothing is started again until `up`."""
        return self in FINAL

    @property
    def wakeable(self) -> bool:
        """On demand: not running, and a request wakes it."""
        return self in WAKEABLE


IDLE, WAITING, STARTING, SERVING, RESTARTING = (
    State.IDLE,
    State.WAITING,
    State.STARTING,
    State.SERVING,
    State.RESTARTING,
)
LIMIT, MEMORY, FAILED = State.LIMIT, State.MEMORY, State.FAILED
MEMORY_WAIT, NO_MEMORY = State.MEMORY_WAIT, State.NO_MEMORY
FINAL = (LIMIT, MEMORY, FAILED, NO_MEMORY)  # nothing is started again until `up`
STANDBY, REFUSED = State.STANDBY, State.REFUSED
WAKEABLE = (STANDBY, REFUSED)
# the journal's event for a verdict, an engine's and a service's alike: its `kind` (dead, wedged,
# not-ready, memory, unhealthy) and `cause` are fields of it
VERDICT_EVENT = "verdict"


@dataclass(frozen=True)
class Policy:
    """The supervisor's bounds, each default written here once: a profile's `[supervisor]` table
    (config/bounds) starts from these, and the agent reads the bounds `up` hands it over them
    (`Policy.of`), so a bound the controller does not send keeps its default."""

    interval_s: float = 2.0  # one look at the engine and the nodes
    probe_interval_s: float = 15.0  # a one-token completion, while /health is 200
    probe_timeout_s: float = 20.0
    probe_failures: int = 2  # consecutive probe failures, each while the engine showed no progress
    stall_s: float = 60.0  # work running or waiting while no progress series moves (readings.PROGRESS)
    health_failures: int = 3  # consecutive failed /health after the engine served: gone
    memory_floor_gib: float = 6.0
    memory_samples: int = 3  # consecutive samples below the floor on any node
    # before a restart, every node's MemAvailable must leave the floor after the engine's share
    # (memory_need_fraction of MemTotal: the profile's gpu_memory_utilization), within this bound
    memory_wait_s: float = 300.0
    memory_need_fraction: float = 0.0
    max_restarts: int = 3
    restart_window_s: float = 3600.0
    # the wait before a restart, counted from the verdict (the stop's grace is part of it); doubled
    # per restart in the window whose engine never served (a crash loop), at most 60 s
    backoff_s: float = 5.0
    ready_timeout_s: float = 1800.0
    stop_grace_s: float = 30.0  # an orderly stop (down, up replacing the server, on demand's idle TTL)
    # a stop after a verdict: the engine is wedged, dead or out of memory, so what it holds cannot
    # finish; vLLM's SIGTERM waits on its requests, which never end (it took all 30 s every time)
    verdict_grace_s: float = 5.0
    # on demand: `up` leaves the engine on standby; a wake starts it after memory admission, and an
    # engine with no request of anyone but the supervisor's probes for idle_ttl_s goes back to standby
    on_demand: bool = False
    idle_ttl_s: float = 900.0
    # false: watched and journalled, never restarted or stopped by the supervisor (a profile's
    # `[supervisor] enabled = false`)
    act: bool = True
    # the fabric watched while serving (issue 75, node/fabric_watch): an unhealthy port, GID, speed or
    # AER storm on any node holds the deployment out of rotation (its engine left running); it comes
    # back after fabric_resume_polls healthy looks when fabric_auto_resume, else on `fabric resume`
    fabric_hold: bool = True
    fabric_resume_polls: int = 3
    fabric_auto_resume: bool = True
    # stop the engine for the hold rather than leave it running (and start it again when the hold ends)
    fabric_stop: bool = False

    @classmethod
    def of(cls, doc: dict | None) -> Policy:
        """The bounds in `doc` (desired.json's, a state file's) over the defaults; a name this
        agent does not know is left out, a value is read as its bound's type."""
        known = {f.name: f.type for f in fields(cls)}
        kinds = {"float": float, "int": int, "bool": bool}
        got = {k: kinds[known[k]](v) for k, v in (doc or {}).items() if k in known and v is not None}
        return cls(**got)

    def doc(self) -> dict:
        """As JSON carries it (desired.json, the state file)."""
        return asdict(self)


@dataclass(frozen=True)
class Desired:
    """desired.json (DESIRED_PATH): the server `up` asks for, written by the controller
    (deployment/server) and read by the head's supervisor and, executor "mp", each worker's rank
    keeper, each through this record. Its JSON names are these fields'; a name this agent does not
    know is left out, one missing reads as None (`argv` as none)."""

    generation: str | None = None  # a new one for every start `up` asks for
    argv: tuple[str, ...] = ()  # `vllm serve ...` (a worker's: its headless rank)
    model: str | None = None  # the served model name, as the one-token probe asks for it
    port: int | None = None
    host: str | None = None  # where the engine listens: the control address, else 127.0.0.1
    profile: str | None = None
    salt: str | None = None  # the secrets' digest's salt ("" for a worker's rank: no secret)
    secrets_digest: str | None = None
    policy: dict | None = None  # the supervisor's bounds (Policy.of)

    @classmethod
    def of(cls, doc: dict | None) -> Desired | None:
        """The record in a desired.json document; None for none (no server is wanted)."""
        if not isinstance(doc, dict):
            return None
        known = {f.name for f in fields(cls)}
        got = {k: v for k, v in doc.items() if k in known}
        got["argv"] = tuple(got.get("argv") or ())
        return cls(**got)

    def doc(self) -> dict:
        """As desired.json carries it (every field, argv a list)."""
        return {**asdict(self), "argv": list(self.argv)}

    @property
    def base_url(self) -> str:
        """Where the engine answers, from inside its container."""
        return f"http://{self.host or '127.0.0.1'}:{self.port}"


# One look reads /health and /metrics (3 s each at most) and, with Ray, Ray's table of live nodes
# and, when a node the engine runs on has left it, that node's own row (1 s each at most); the
# one-token probe runs on a thread of its own and holds no look back. The state file is rewritten
# after every look.
LOOK_BLOCKS_S = 8.0
PEER_READ_S = 1.0  # a look's read of each peer's memory report (node/memreport.peer_memory's timeout)
STOP_KILL_WAIT_S = 10.0  # a stop's wait after SIGKILL, once its grace is spent (node/procgroup)


@dataclass(frozen=True)
class Availability:
    """Whether a deployment is in rotation, judged from its supervisor's state file alone: why not
    (`reason`, what a client and `status` are told), when to ask again (`retry_after`, a client's
    Retry-After in seconds), whether a request wakes it (on demand) and whether only `up` brings it
    back (`final`). `why` names the branch: serving, stopping, stale, fabric hold, memory unknown,
    restarting, starting, standby, refused, final, none."""

    up: bool
    reason: str = ""
    retry_after: int = 5
    wake: bool = False
    final: bool = False
    why: str = ""
    # on standby, refused or starting: how long its start may take (the profile's ready_timeout_s),
    # so how long the gateway may hold a request that woke it before answering 503
    start_s: float = 0.0


REFUSED_REASON = "its last start was refused"  # the reason of a start refused for memory (on demand)
FABRIC_HOLD = "fabric hold"  # Availability.why while the fabric holds a serving deployment out (issue 75)


@dataclass(frozen=True)
class Supervised:
    """The supervisor's state file (STATE_PATH), as read: written by node/lifecycle after every look
    and change, served raw in the agent's report, read by the gateway, `status`, `up` and the agent
    after a container restart, each through this record. The fields every supervisor writes are
    typed here; the rest of the file (an engine's figures, a service's own) is `rest`, as written."""

    state: str | None = None  # the State's value (`kind` is the State; None: one this agent does not know)
    since: float = 0.0  # when it entered the state (the head's clock)
    updated: float | None = None  # when it last wrote the file
    generation: str | None = None
    pid: int | None = None
    restarts: tuple[float, ...] = ()  # within the restart window
    causes: tuple[dict, ...] = ()  # the last verdicts: ts, kind, cause
    policy: dict | None = None  # its bounds (`bounds` reads them)
    stopping: dict | None = None  # a stop in progress: why, since, grace_s
    memory_unknown: dict | None = None  # peer -> why its memory could not be read
    refusal: str = ""  # on demand: why the last start was refused
    # an engine's: its generation rate, a prefill's evidence of progress, executor "mp"'s epoch and ranks
    tokens_per_s: float | None = None
    activity: str = ""
    epoch: str | None = None
    ranks: dict | None = None
    # the fabric watched while serving (issue 75): since, why, nodes, healthy_polls, resume; None: none
    fabric_hold: dict | None = None
    rest: dict | None = None  # the rest of the file, as written (a service's `service`, `ray_nodes`, ...)

    @classmethod
    def of(cls, doc: dict | None) -> Supervised | None:
        """The record of a state file's document; None for none."""
        if not isinstance(doc, dict):
            return None
        typed = {f.name for f in fields(cls)} - {"rest"}
        causes = tuple(c for c in (doc.get("causes") or []) if isinstance(c, dict))
        stop = doc.get("stopping")
        return cls(
            state=doc.get("state"),
            since=float(doc.get("since") or 0),
            updated=doc.get("updated") if isinstance(doc.get("updated"), (int, float)) else None,
            generation=doc.get("generation"),
            pid=doc.get("pid"),
            restarts=tuple(doc.get("restarts") or ()),
            causes=causes,
            policy=doc.get("policy") if isinstance(doc.get("policy"), dict) else None,
            stopping=(dict(stop) if isinstance(stop, dict) else {"why": str(stop)}) if stop else None,
            memory_unknown=dict(doc.get("memory_unknown") or {}),
            refusal=doc.get("refusal") or "",
            tokens_per_s=doc.get("tokens_per_s"),
            activity=doc.get("activity") or "",
            epoch=doc.get("epoch"),
            ranks=doc.get("ranks") if isinstance(doc.get("ranks"), dict) else None,
            fabric_hold=doc.get("fabric_hold") if isinstance(doc.get("fabric_hold"), dict) else None,
            rest={k: v for k, v in doc.items() if k not in typed},
        )

    @property
    def kind(self) -> State | None:
        return State.of(self.state)

    @property
    def bounds(self) -> Policy:
        return Policy.of(self.policy)

    @property
    def newest(self) -> dict:
        """The last verdict ({} for none)."""
        return self.causes[-1] if self.causes else {}

    @property
    def last_cause(self) -> str:
        return self.newest.get("cause", "")

    def age(self, now: object) -> float | None:
        """How old the file is at `now` (the head's clock); None where either is not known."""
        return now - self.updated if isinstance(now, (int, float)) and self.updated is not None else None

    def verdict_pending(self) -> bool:
        """It published a verdict on a running engine (a cause newer than its state, which is still
        starting or serving) and, acting on its verdicts, is stopping it."""
        return (
            self.bounds.act
            and self.state in (STARTING, SERVING)
            and float(self.newest.get("ts") or 0) >= self.since > 0
        )

    def is_stopping(self) -> bool:
        """It is stopping an engine now: its last write says so (`stopping`, written by every stop
        before it blocks), or published a verdict on a running engine (`verdict_pending`)."""
        return self.stopping is not None or self.verdict_pending()

    def stale_after_s(self) -> float:
        """A state file older than this is not current: the supervisor has stopped looking (crash-
        looping, hung), and what it last wrote is history. Three looks, plus the longest a look may
        block on reads that do not answer (/health, /metrics, Ray's table, and a second for each peer
        whose memory report did not answer last time); never under 15 s. The one-token probe is not
        among them: it runs beside the looks, so a probe into a stopped rank leaves the file fresh.
        While the supervisor stops an engine (the state file says so, or says the verdict), the stop's
        grace and the kill's wait are added: it is acting, not hung."""
        policy = self.bounds
        busy = LOOK_BLOCKS_S + PEER_READ_S * len(self.memory_unknown or {})
        if self.is_stopping():
            grace = (self.stopping or {}).get("grace_s")
            busy += float(grace if grace is not None else policy.stop_grace_s) + STOP_KILL_WAIT_S
        return max(3 * policy.interval_s + busy, 15.0)

    def stale(self, age_s: object) -> bool:
        """Whether the file, `age_s` seconds old by the head's own clock, is history (older than
        `stale_after_s`). An age not known (not a number) is not stale."""
        return isinstance(age_s, (int, float)) and age_s > self.stale_after_s()

    def availability(self, age_s: object = None) -> Availability:
        """Pure: the one judgement of "is it serving?" (`age_s`: how old the file is by the head's
        clock, None where not known), read by the gateway, `status` and a service's `up` alike, so
        that they agree at any instant. Serving means serving freshly: a verdict newer than "serving"
        (the supervisor publishes it before it stops the engine, which may take its stop grace) or a
        state gone stale takes it out at once."""
        state, newest, last = self.kind, self.newest, self.last_cause
        if state == SERVING and self.verdict_pending():
            # it will restart the engine or give up; either way it serves nothing now
            reason = f"{newest.get('kind', 'fault')}: {last}; the supervisor is stopping it"
            return Availability(False, reason, 10, why="stopping")
        if self.stale(age_s):
            reason = f"its supervisor is stale ({self.state}, {age_s:.0f}s old): it is not watching"
            return Availability(False, reason, 10, why="stale")
        # the verdict's kind first (wedged, dead, not-ready, memory): what a client and the journal are told
        after = f" (after {newest.get('kind') or 'a verdict'}: {last})" if last else ""
        if self.fabric_hold and state in (SERVING, WAITING):  # out of rotation (its engine running, or
            # stopped where the profile says so): back when the fabric is
            return Availability(False, fabric_hold_reason(self.fabric_hold), 30, why=FABRIC_HOLD)
        if state == SERVING:
            if self.memory_unknown:
                reason = "degraded: memory unknown on " + ", ".join(sorted(self.memory_unknown))
                return Availability(False, reason, 10, why="memory unknown")
            return Availability(True, "serving", 0, why="serving")
        if state == RESTARTING:
            return Availability(False, f"restarting{after}", 10, why="restarting")
        start_s = self.bounds.ready_timeout_s
        if state in (STARTING, WAITING):
            return Availability(False, f"{state}{after}", 10, why="starting", start_s=start_s)
        if state == STANDBY:
            said = "on standby: a request starts it on demand"
            return Availability(False, said, 10, wake=True, why="standby", start_s=start_s)
        if state == REFUSED:
            reason = f"{REFUSED_REASON}: {self.refusal or last}"
            return Availability(False, reason, 30, wake=True, why="refused", start_s=start_s)
        if state is not None and state.final:
            return Availability(False, f"{state}{after}; sparkcluster up brings it back", 60, final=True, why="final")
        return Availability(False, f"not serving ({self.state or 'no state'})", 30, why="none")


def fabric_hold_reason(hold: dict) -> str:
    """What a client and `status` are told while the fabric holds a deployment out (pure)."""
    back = (
        f"back after {hold.get('polls', 3)} healthy looks or on sparkcluster fabric resume"
        if hold.get("auto", True)
        else "back on sparkcluster fabric resume"
    )
    return f"held: the fabric is unhealthy ({hold.get('why') or 'see sparkcluster events'}); {back}"


NOT_ASKED = Availability(False, "no server asked for (sparkcluster up has not started one)", 30, why="none")


def availability(sup: Supervised | None, age_s: object = None) -> Availability:
    """`Supervised.availability`, with no state file at all judged too (no server asked for)."""
    return sup.availability(age_s) if sup is not None else NOT_ASKED
