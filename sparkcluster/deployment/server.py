"""`vllm serve` inside the head container: start it detached, record its PID, wait until it
really answers, stop it by PID.

Secrets reach it only through the environment of the Docker API's exec call: never argv (which
`ps` shows), never a log line. Readiness is a one-token completion, because `/health` answers 200
while an engine is stuck (docs/field-notes.md, "Readiness").
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

import docker.errors
import httpx

from sparkcluster import log, redact
from sparkcluster.container.spec import files_tar
from sparkcluster.deployment import supervision
from sparkcluster.deployment.endpoint import headers, health, one_token
from sparkcluster.errors import SparkError
from sparkcluster.node import contract
from sparkcluster.remote import retry
from sparkcluster.remote.dockerapi import run_in

LOG_PATH = contract.SERVE_LOG
RECORD_PATH = contract.RECORD_PATH
RUNNING_EVERY_S = 1.0  # how often wait_ready asks whether the server's process still runs
STARTED_TIMEOUT_S = 30.0  # the supervisor looks every interval_s (2 s), then waits for Ray membership

_log = log.get(__name__)


@dataclass(frozen=True)
class ServeSpec:
    container: str
    argv: list[str]
    secret_names: list[str]
    model: str  # the served model name clients ask for
    port: int
    plugin: tuple[str, str] | None  # (url, path in container)
    # executor "mp" (issue 28): (node, container, argv) of each worker's rank, run by its own agent
    ranks: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    # where the supervisor asks the engine from inside the head (host networking): loopback for a
    # wildcard bind, the head's control address when engines listen only there (issue 36)
    host: str = "127.0.0.1"

    def describe(self) -> str:
        import shlex

        # only the secrets this run has: a missing one is the plan's warning, never claimed here
        env = ", ".join(f"{n}=******" for n in self.secret_names)
        secrets = f" ({env} from a 0600 file)" if env else " (no secret)"
        out = f"the supervisor in {self.container} runs{secrets}: " + shlex.join(self.argv)
        for node, container, argv in self.ranks:
            out += f"; then the agent in {container} ({node}) runs its rank, no secret: " + shlex.join(argv)
        return out


@dataclass(frozen=True)
class Record:
    pid: int
    exec_id: str
    profile: str
    model: str
    port: int
    started_at: float
    # a salted digest of the secrets the server was started with: a changed API key or token
    # means the running server is not what the user asked for, without storing the secret
    salt: str = ""
    secrets_digest: str = ""
    generation: str = ""
    policy: dict | None = None  # the supervisor's bounds it runs under
    host: str = ""  # where the supervisor asks it ("": loopback, before the only door)
    container: str = ""  # where it runs (not stored: the record is read from the container)

    def started_with(self, secrets: dict[str, str]) -> bool:
        return self.secrets_digest == secrets_digest(secrets, self.salt)


def secrets_digest(secrets: dict[str, str], salt: str) -> str:
    import hashlib

    text = "\0".join(f"{k}={v}" for k, v in sorted(secrets.items()))
    return hashlib.sha256((salt + "\0" + text).encode()).hexdigest()


def token_file_command(hf_cache: str) -> str:
    """Writes stdin to HF_HOME/token (mode 0600), where huggingface_hub looks for the token."""
    import shlex

    d = shlex.quote(hf_cache)
    return f"umask 077; mkdir -p {d} && cat > {d}/token.part && mv -f {d}/token.part {d}/token"


def stage_plugin_command(url: str, path: str) -> list[str]:
    # fetched once into the mounted HF cache, so restarts reuse it (docs/field-notes.md, "Bring-up")
    return [
        "sh",
        "-c",
        'test -s "$2" || curl -fsSL --retry 3 -o "$2.part" "$1" && mv -f "$2.part" "$2" 2>/dev/null; test -s "$2"',
        "sh",
        url,
        path,
    ]


def _hand_over(api, spec: ServeSpec, secrets: dict[str, str], profile: str, policy: dict, rank_apis) -> str:
    """The secrets first, into a 0600 file the supervisor reads at each start (a reboot brings the
    server back without the controller); then the desired state, written aside and renamed, so the
    supervisor never reads half of it. Returns the new generation."""
    from secrets import token_hex  # the standard library's; a parameter here is called secrets

    env = {k: v for k, v in secrets.items() if k in spec.secret_names}
    salt, generation = token_hex(8), token_hex(8)
    desired = contract.Desired(
        generation=generation,
        argv=tuple(spec.argv),
        model=spec.model,
        port=spec.port,
        host=spec.host,
        profile=profile,
        salt=salt,
        secrets_digest=secrets_digest(env, salt),
        policy=policy,
    )
    for node, container, argv in spec.ranks:  # executor "mp": each worker's agent first, no secret
        hand(rank_apis[node], container, replace(desired, argv=tuple(argv), salt="", secrets_digest=""))
    api.put_archive(spec.container, "/", files_tar({contract.SECRETS_PATH: json.dumps(env)}, mode=0o600))
    hand(api, spec.container, desired)
    return generation


def start(
    api,
    spec: ServeSpec,
    secrets: dict[str, str],
    profile: str,
    policy: dict,
    timeout: float = STARTED_TIMEOUT_S,
    rank_apis: dict | None = None,
) -> Record:
    """Hand the server to the head's supervisor (node/), which starts it and records its PID. The
    deployment's token first (what the gateway's console acts with, as a wake does on demand)."""
    ensure_wake_token(api, spec.container)
    generation = _hand_over(api, spec, secrets, profile, policy, rank_apis)

    def started() -> Record | None:
        rec = read_record(api, spec.container)
        return rec if rec is not None and rec.generation == generation else None

    rec = _until(api, spec.container, started, timeout, "start vllm serve")
    _log.info("vllm serve started", container=spec.container, pid=rec.pid)
    return rec


def _until(api, container: str, got, timeout: float, what: str):
    """What `got()` returns once it is not None, looked at every 0.2 s; NotReady with the
    supervisor's last lines when `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = got()
        if found is not None:
            return found
        time.sleep(0.2)
    raise NotReady(f"the supervisor in {container} did not {what} within {timeout:g}s", supervisor_tail(api, container))


@dataclass(frozen=True)
class Standby:
    """A server handed to the supervisor on demand (issue 36): on standby, nothing started."""

    generation: str
    container: str


def standby(
    api,
    spec: ServeSpec,
    secrets: dict[str, str],
    profile: str,
    policy: dict,
    timeout: float = STARTED_TIMEOUT_S,
    rank_apis: dict | None = None,
) -> Standby:
    """Hand the server over on demand: the deployment's wake token first (kept when one is there,
    so a gateway configured before still wakes it), then the secrets and the desired state; returns
    once the supervisor says standby for this generation."""
    ensure_wake_token(api, spec.container)
    generation = _hand_over(api, spec, secrets, profile, policy, rank_apis)

    def on_standby() -> Standby | None:
        st = _supervisor_state(api, spec.container)
        if st and st.generation == generation and st.kind in contract.WAKEABLE:
            return Standby(generation, spec.container)
        return None

    got = _until(api, spec.container, on_standby, timeout, "take the server on standby")
    _log.info("vllm serve on standby", container=spec.container)
    return got


def _supervisor_state(api, container: str) -> contract.Supervised | None:
    return supervision.state(api, container)


def read_wake_token(api, container: str) -> str | None:
    """The deployment's wake token, from its head container (None: not on demand, or no container).
    Read through the Docker API: it never reaches a command line."""
    try:
        text = supervision.read_file(api, container, contract.WAKE_PATH)
    except docker.errors.APIError:
        return None
    return text.strip() if text and text.strip() else None


def ensure_wake_token(api, container: str) -> str:
    """The wake token in the head container (0600), made once: random, 192 bits."""
    from secrets import token_urlsafe

    got = read_wake_token(api, container)
    if got:
        return got
    token = token_urlsafe(24)
    api.put_archive(container, "/", files_tar({contract.WAKE_PATH: token}, mode=0o600))
    return token


def hand(api, container: str, desired: contract.Desired) -> None:
    """The desired state into a container, written aside and renamed (never read half-written)."""
    api.put_archive(container, "/", files_tar({contract.DESIRED_PATH + ".new": json.dumps(desired.doc())}))
    run_in(api, container, ["mv", "-f", contract.DESIRED_PATH + ".new", contract.DESIRED_PATH])


def disable(api, container: str) -> None:
    """Tell the supervisor no server is wanted (first, so it does not bring a stopped one back).
    Fails loudly: a supervisor left enabled would bring back the server `down` stops."""
    run_in(api, container, ["rm", "-f", contract.DESIRED_PATH, contract.SECRETS_PATH, contract.WAKE_PATH])


def supervisor_tail(api, container: str, lines: int = 10) -> str:
    try:
        return redact.mask(run_in(api, container, ["tail", "-n", str(lines), contract.JOURNAL_PATH], warn=True).stdout)
    except (SparkError, docker.errors.APIError) as e:  # best effort, for an error message
        return f"(could not read {contract.JOURNAL_PATH}: {e})"


def read_record(api, container: str) -> Record | None:
    import io
    import tarfile

    try:
        stream, _ = api.get_archive(container, RECORD_PATH)
    except docker.errors.NotFound:  # no record (or no container): nothing was started there
        return None
    data = b"".join(stream)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.getmembers()[0]
        return _record(json.loads(tar.extractfile(member).read()), container)


def _record(doc: dict, container: str) -> Record:
    doc["container"] = container
    return Record(**{k: v for k, v in doc.items() if k in Record.__dataclass_fields__})


def _exec_if_running(api, container: str, argv: list[str]):
    """`docker exec` of argv (its result, whatever its exit), or None when the container is gone or
    not running."""
    try:
        return run_in(api, container, argv, warn=True)
    except docker.errors.NotFound:  # the container is gone
        return None
    except docker.errors.APIError as e:
        if e.response is not None and e.response.status_code == 409:  # the container is not running
            return None
        raise


def running(api, rec: Record) -> bool:
    """The recorded PID still runs in its container (PIDs are the container's own)."""
    # the shell's own kill: a slim image (vllm/vllm-openai on Ubuntu) may have no procps
    res = _exec_if_running(api, rec.container, ["sh", "-c", 'kill -0 "$1"', "sh", str(int(rec.pid))])
    return res is not None and res.ok


def current(api, container: str) -> Record | None:
    """The server recorded in `container` when it still runs, else None (no record, its PID gone, or
    the container stopped or absent). An engine that does not answer raises (EngineUnreachable): it
    is never taken for "no server". One exec reads the record and checks its PID (the record's
    archive, then an exec, cost `up` on a serving cluster another 0.1-0.2 s: issue 40 item 6)."""
    res = _exec_if_running(api, container, ["sh", "-c", f"cat {contract.RECORD_PATH} && {contract.SERVER_ALIVE_SH}"])
    if res is None or not res.ok:
        return None
    try:
        return _record(json.loads(res.stdout), container)
    except (ValueError, TypeError):  # half-written while a server starts: not a server that runs yet
        return None


def log_tail(api, container: str, lines: int = 20) -> str:
    try:
        return redact.mask(run_in(api, container, ["tail", "-n", str(lines), LOG_PATH], warn=True).stdout)
    except (SparkError, docker.errors.APIError) as e:  # best effort, for an error message
        return f"(could not read {LOG_PATH}: {e})"


class NotReady(Exception):
    def __init__(self, reason: str, tail: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.tail = tail


def wait_ready(
    api, rec: Record, spec: ServeSpec, base: str, secrets: dict[str, str], timeout: float, on_wait=None
) -> float:
    """Block until /health is 200 AND a one-token completion succeeds; returns the seconds waited.

    Raises NotReady with the reason when the server dies or the bound passes.
    """
    hdrs = headers(secrets)
    started = time.monotonic()
    deadline = started + timeout
    last = "the server has not opened its port yet"
    looked = 0.0
    with httpx.Client() as client:

        def answered() -> float | None:
            nonlocal last, looked
            # whether the process still runs is a `docker exec` on the head: once a second, not at
            # every poll, so the node starting the engine does not spend a core on being asked
            if time.monotonic() - looked >= RUNNING_EVERY_S:
                looked = time.monotonic()
                if not running(api, rec):
                    raise NotReady("vllm serve exited", log_tail(api, spec.container))
            code = health(client, base)
            if code == 200:
                ok, why = one_token(
                    client, base, spec.model, hdrs, timeout=min(30.0, max(1.0, deadline - time.monotonic()))
                )
                if ok:
                    return time.monotonic() - started
                last = f"/health answers 200 but {why}"
                if "HTTP 401" in why:
                    raise NotReady(last + " (the API key given does not match the server's)")
            elif code is not None:
                last = f"/health answers HTTP {code}"
            if on_wait:
                on_wait(last, time.monotonic() - started)
            return None

        took = retry.poll(answered, timeout=timeout, interval=0.1, what="vllm serve")
    if took is None:
        raise NotReady(f"not ready after {timeout:g}s: {last}", log_tail(api, spec.container))
    return took
