"""A profile of kind `service`: a program that is not vLLM, run beside the models on
a node (the al-engr.com Spark stack's stack: a Parakeet ASR service on :8765 beside Qwen on Spark 1, a Chatterbox TTS
service on :8882 beside Gemma on Spark 2, each with a `/health` its cron job pings).

What sparkcluster needs to know of one: its image, the command the container runs (`args`, the whole
argv: the container's foreground process is the node agent, which runs it), the port it answers on
(host networking, as every container here), its health URL on that port, the memory it reserves of
the node (GB, counted by `up --beside`'s admission beside the engines' shares), and the OpenAI routes
it answers (`/v1/audio/transcriptions`, `/v1/audio/speech`: the gateway sends it those), with the
model name it answers to where it has one. The agent in its container supervises it: a failing health
check or an exit restarts it, within the same bounds as an engine's (`[supervisor]`). The image must
carry `python3` (3.8 or newer) for that agent, as every Python serving image does.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sparkcluster.config.secrets import SECRET_NAMES, SECRET_VALUE, SECRETISH_NAME
from sparkcluster.node.contract import Policy

KIND = "service"
# what the container is given when the profile says nothing: a service's own shared memory is small
DEFAULT_SHM = "2g"
_ROUTE = r"^/v1/[a-z0-9/_.-]+$"
_DEFAULT = Policy()


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
    args: list[str] = Field(min_length=1)  # the command the container runs (its image's entrypoint is not)
    port: int = Field(ge=1, le=65535)  # where it answers (host networking: the node's own port)
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
            if name in SECRET_NAMES or SECRETISH_NAME.search(name) or SECRET_VALUE.search(value):
                raise ValueError(f"{name}: a secret in a service's env would show in docker inspect; leave it out")
        return v

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

    def health_url(self) -> str:
        """Where the supervisor asks, inside the container (host networking: the node's loopback)."""
        return f"http://127.0.0.1:{self.port}{self.health}"


def is_service(prof) -> bool:
    return isinstance(prof, ServiceProfile)
