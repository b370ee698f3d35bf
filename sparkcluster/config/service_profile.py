"""A profile of kind `service`: a program that is not vLLM, run beside the models on
a node (the al-engr.com Spark stack's stack: a Parakeet ASR service on :8765 beside Qwen on Spark 1, a Chatterbox TTS
service on :8882 beside Gemma on Spark 2, each with a `/health` its cron job pings).

What sparkcluster needs to know of one: its image, run as its owner runs it (the image's own
entrypoint and command kept; `args`, when given, are the command Docker appends to that entrypoint,
as `docker run IMAGE ARGS...` does), the port it answers on and any other port it listens on (host
networking, as every container here: all checked free at `up`), its health URL on that port, the
memory it reserves of the node (GB, counted by `up --beside`'s admission beside the engines' shares),
the OpenAI routes it answers (`/v1/audio/transcriptions`, `/v1/audio/speech`: the gateway sends it
those), with the model name it answers to where it has one; the folders and named volumes it mounts
(`[[binds]]`, read-only unless said), its secrets (`[[secrets]]`: from the same 0600 .env the engines'
come from, each written as a file into its container and named to the server by the variable it reads a
file from, never in its environment), and whether it uses the GPU (`gpu`).

Its supervisor runs beside it, not in it (container/service_container): a container of its own on the
node, from an image with `python3` (the image of a model's container on the node, or `[supervisor]
image`), with the node's Docker socket, that starts the service's container, asks its health URL and
restarts it on a failing check or an exit, within the same bounds as an engine's (`[supervisor]`).
The service's image needs no `python3`.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sparkcluster.config.secrets import SECRET_NAMES, SECRET_VALUE, SECRETISH_NAME
from sparkcluster.node.contract import Policy

KIND = "service"
# what the container is given when the profile says nothing: a service's own shared memory is small
DEFAULT_SHM = "2g"
_ROUTE = r"^/v1/[a-z0-9/_.-]+$"
_DEFAULT = Policy()
# where a secret's file is written in the service's container unless its profile says where
SECRETS_DIR = "/run/sparkcluster-secrets"
# a named volume as Docker takes one (`docker volume create`'s name: [a-zA-Z0-9][a-zA-Z0-9_.-]+)
_VOLUME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
# container paths a bind may not cover: the container's own system, and where its secrets go
_NOT_TARGETS = ("/", "/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", SECRETS_DIR)


def one_line_words(v: list[str]) -> list[str]:
    """A command's words as a profile gives them (a service's `args`, an engine's `extra_flags`): none
    may hold a newline or NUL, which would end the line a command is sent on."""
    for i, s in enumerate(v):
        if "\n" in s or "\x00" in s:
            raise ValueError(f"[{i}]: may not contain a newline or NUL")
    return v


class ServiceSupervisorSettings(BaseModel):
    """A service's `[supervisor]` table: the engine's bounds that apply to a service (node/contract
    Policy's names and defaults); the engine's wedge keys (stall, probe) do not: its health URL is
    the whole verdict."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # false: its supervisor starts it and journals what it sees, but never restarts or stops it
    enabled: bool = True
    # the image its supervisor's container runs (any with python3 3.8 or newer); None: the image of a
    # model's container on the node, the cluster's own (`up` says so when the node has none)
    image: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9._/:@-]*$")
    interval_s: float = Field(default=_DEFAULT.interval_s, ge=0.5)  # one health question per look
    # failed health answers in a row after it served once (a refused connection, a timeout of 3 s,
    # any status but 200): it is stopped and restarted
    health_failures: int = Field(default=_DEFAULT.health_failures, ge=1)
    # before a restart the node's MemAvailable must cover memory_gb and this floor, within memory_wait_s
    memory_floor_gib: float = Field(default=_DEFAULT.memory_floor_gib, ge=0)
    memory_wait_s: float = Field(default=_DEFAULT.memory_wait_s, ge=0)
    # at most max_restarts in restart_window_s, as an engine's (eugr/spark-vllm-docker#257: unbounded
    # restarts leaked memory until the host needed a physical reset)
    max_restarts: int = Field(default=_DEFAULT.max_restarts, ge=0)
    restart_window_s: float = Field(default=_DEFAULT.restart_window_s, ge=60)


def _clean_path(v: str, what: str) -> str:
    """An absolute path, normalised, without `..` (which would leave the folder the owner named)."""
    if not v.startswith("/"):
        raise ValueError(f"{what} {v!r} must be an absolute path")
    if ".." in v.split("/"):
        raise ValueError(f"{what} {v!r} may not contain '..'")
    if any(c in v for c in ":,\n\x00"):
        raise ValueError(f"{what} {v!r} may not contain ':', ',', a newline or NUL (Docker's bind syntax)")
    return posixpath.normpath(v)


class ServiceBind(BaseModel):
    """One `[[binds]]` entry: a folder (or file) of the node, or a named Docker volume, mounted into
    the service's container at `target`, read-only unless `read_only = false` (a voice folder the
    server only reads; a model cache it fills)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # an absolute path on the node (a folder of its owner's), or a named volume's name
    source: str
    target: str  # an absolute path in the container; never `/`, its system folders or where secrets go
    read_only: bool = True  # false: the service writes there (a model cache, a config it saves)

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        if v.startswith("/"):
            path = _clean_path(v, "source")
            if path == "/":
                raise ValueError("source '/' would give the service the node's whole filesystem")
            return path
        if not _VOLUME.match(v):
            raise ValueError(
                f"source {v!r} is neither an absolute path on the node nor a named volume's name "
                "([a-zA-Z0-9][a-zA-Z0-9_.-]+)"
            )
        return v

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        path = _clean_path(v, "target")
        if path in _NOT_TARGETS or path.startswith(SECRETS_DIR + "/"):
            raise ValueError(f"target {path!r} would cover the container's own {path}; mount it elsewhere")
        return path

    @property
    def volume(self) -> bool:
        return not self.source.startswith("/")

    def docker_bind(self) -> str:
        """As `docker run -v` and the Engine API's HostConfig.Binds take it."""
        return f"{self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"


class ServiceSecret(BaseModel):
    """One `[[secrets]]` entry: a secret read, like the engines', from the environment or the 0600
    .env by its `name`, written before the service starts as a file in its container (at `path`, by
    default `/run/sparkcluster-secrets/NAME`), never into its environment or onto a command line,
    where `docker inspect` and `ps` show them. The server learns where the file is from the variable `file_env`
    (the `*_FILE` convention: the variable holds the file's path, not the secret), or reads it at
    `path` by its own convention. `bearer`: the gateway sends it as the `Authorization: Bearer` key
    of the requests it forwards to this service (a server that asks its clients for that key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")  # its name in the .env or the environment
    # the server's variable that names the file (`API_KEY_FILE`, `HF_TOKEN_PATH`): it holds the path
    file_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
    path: str | None = None  # where the file goes in the container; unset: /run/sparkcluster-secrets/NAME
    bearer: bool = False  # the gateway sends it to the service as `Authorization: Bearer`

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is None:
            return v
        path = _clean_path(v, "path")
        if path.endswith("/") or path == "/":
            raise ValueError(f"path {v!r} must name a file")
        return path

    @property
    def file(self) -> str:
        """Where its file is in the container."""
        return self.path or f"{SECRETS_DIR}/{self.name}"


class ServiceProfile(BaseModel):
    """A profile of kind "service" (`kind = "service"`): what runs, where it answers, what it holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$")
    kind: Literal["service"] = KIND
    description: str = ""
    # the model name a request's `model` may carry for it (the gateway routes by route, then by this
    # name where two services answer one route); None: it answers its routes whatever model is named
    served_name: str | None = Field(default=None, pattern=r"^[^\s,]+$")
    image: str = Field(pattern=r"^[a-z0-9][a-z0-9._/:@-]*$")  # as `docker pull` takes it
    # appended to the image's own entrypoint as its command (Docker's CMD); empty: the image's own
    args: list[str] = Field(default_factory=list)
    port: int = Field(ge=1, le=65535)  # where it answers (host networking: the node's own port)
    # the other ports it listens on (a second API, a metrics page): checked free at `up` with `port`
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(default_factory=list)
    # the GPUs given to its container (`--gpus all`): false for a server that runs on the CPU
    gpu: bool = True
    binds: list[ServiceBind] = Field(default_factory=list)
    secrets: list[ServiceSecret] = Field(default_factory=list)
    health: str = Field(default="/health", pattern=r"^/[^\s]*$")  # a path on `port`, 200 when it serves
    memory_gb: float = Field(gt=0, le=1024)  # what it holds of the node's memory (GB, 10^9), counted by admission
    # the OpenAI routes it answers (`/v1/audio/transcriptions`, `/v1/audio/speech`): the gateway sends it those
    routes: list[Annotated[str, Field(pattern=_ROUTE)]] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)  # in its container at start
    shm_size: str = Field(default=DEFAULT_SHM, pattern=r"^[0-9]+[bkmgBKMG]?$")
    # how long `up` waits for its first healthy answer (a model load), and the supervisor for a restart's
    ready_timeout_s: int = Field(default=600, ge=10)
    supervisor: ServiceSupervisorSettings = Field(default_factory=ServiceSupervisorSettings)

    @field_validator("args")
    @classmethod
    def _no_newlines(cls, v: list[str]) -> list[str]:
        return one_line_words(v)

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, v: dict[str, str]) -> dict[str, str]:
        # a service's variables are its container's (`docker inspect` shows them): no secret goes there
        for name, value in v.items():
            # a variable that names a file (`API_KEY_FILE = "/run/..."`) holds a path, not the secret
            names_a_file = name.endswith(("_FILE", "_PATH")) and value.startswith("/")
            secretish = name in SECRET_NAMES or (SECRETISH_NAME.search(name) and not names_a_file)
            if secretish or SECRET_VALUE.search(value):
                raise ValueError(f"{name}: a secret in a service's env would show in docker inspect; leave it out")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ServiceProfile:
        targets = [b.target for b in self.binds]
        twice = sorted({t for t in targets if targets.count(t) > 1})
        if twice:
            raise ValueError(f"binds: target mounted more than once: {', '.join(twice)}")
        names = [s.name for s in self.secrets]
        if len(set(names)) != len(names):
            raise ValueError("secrets: a name is listed more than once")
        files = [s.file for s in self.secrets]
        if len(set(files)) != len(files):
            raise ValueError("secrets: two secrets would be written to one file")
        for s in self.secrets:
            if any(s.file == t or s.file.startswith(t.rstrip("/") + "/") for t in targets):
                raise ValueError(f"secrets: {s.name}'s file {s.file} is under a bind's target; a mount would hide it")
            if s.file_env and s.file_env in self.env:
                raise ValueError(f"secrets: {s.name}'s file_env {s.file_env} is also set in env")
        if sum(s.bearer for s in self.secrets) > 1:
            raise ValueError("secrets: at most one is the gateway's bearer key")
        if self.port in self.ports or len(set(self.ports)) != len(self.ports):
            raise ValueError("ports: a port is listed twice (`port` is checked already)")
        return self

    @field_validator("routes")
    @classmethod
    def _once(cls, v: list[str]) -> list[str]:
        twice = sorted({r for r in v if v.count(r) > 1})
        if twice:
            raise ValueError(f"named more than once: {', '.join(twice)}")
        return v

    @property
    def served_names(self) -> list[str]:
        return [self.served_name] if self.served_name else []

    @property
    def served_model_name(self) -> str:
        """What `up` prints as the thing it serves: its model name, else the profile's."""
        return self.served_name or self.name

    @property
    def all_ports(self) -> list[int]:
        """Every port it listens on on its node: `port`, then `ports`."""
        return [self.port, *self.ports]

    @property
    def bearer(self) -> ServiceSecret | None:
        return next((s for s in self.secrets if s.bearer), None)

    def health_url(self) -> str:
        """Where the supervisor asks, inside the container (host networking: the node's loopback)."""
        return f"http://127.0.0.1:{self.port}{self.health}"


def is_service(prof) -> bool:
    return isinstance(prof, ServiceProfile)
