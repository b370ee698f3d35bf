"""The supervisor's bounds: a profile's `[supervisor]` table, and the policy the node agent reads
(node/contract.py Policy's names, whose defaults the table's are). Pure configuration: nothing here
talks to a host."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sparkcluster.node.contract import Policy

_DEFAULT = Policy()


class SupervisorSettings(BaseModel):
    """A profile's `[supervisor]` table; the defaults are the seeds' watchdog lines, written once in
    node/contract.Policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # false: the supervisor starts the server when `up` asks and journals what it sees, but never
    # restarts or stops it on its own, and brings nothing back after a reboot
    enabled: bool = True
    # wedged: work running or waiting while no progress series moves for stall_s (tokens, KV cache,
    # queue: node/readings.PROGRESS), or a one-token completion (every probe_interval_s) not returning
    # within probe_timeout_s probe_failures times in a row, each with no progress, while /health is 200.
    # A long prefill moves the KV cache with every chunk: it is progress, never a wedge.
    stall_s: float = Field(default=_DEFAULT.stall_s, ge=5)
    probe_interval_s: float = Field(default=_DEFAULT.probe_interval_s, ge=2)
    probe_timeout_s: float = Field(default=_DEFAULT.probe_timeout_s, ge=1)
    probe_failures: int = Field(default=_DEFAULT.probe_failures, ge=1)
    # the slowest prefill this setup may see, in prompt tokens per second: lint checks that one
    # scheduler step (max_num_batched_tokens at this rate) fits well within stall_s. 500 tok/s is
    # the vLLM-on-Spark practical guide's dense ~90B model at large context (~133 s to the first token); small-active
    # MoE
    # models prefill at ~6,000 tok/s on a Spark (the same guide)
    prefill_floor_tok_s: float = Field(default=500.0, gt=0)
    # MemAvailable on any node below this for memory_samples looks in a row: the server is stopped
    # for good (the corti.com Qwen3.6-35B field report: +47 GB in 6 s on unified memory, and the host stopped
    # answering SSH)
    memory_floor_gib: float = Field(default=_DEFAULT.memory_floor_gib, ge=0)
    memory_samples: int = Field(default=_DEFAULT.memory_samples, ge=1)
    # before any restart, wait at most this long until every node's MemAvailable covers the engine's
    # gpu_memory_utilization of MemTotal plus memory_floor_gib (doctor's mem.headroom arithmetic):
    # a killed engine's shared and CUDA memory takes seconds to tens of seconds to come back, and a
    # relaunch into that window is how Spark hosts wedge (MiaAI-Lab GLM-5.3 #193;
    # NVIDIA/open-gpu-kernel-modules#1358). Never back within it: stopped, the state says so
    memory_wait_s: float = Field(default=_DEFAULT.memory_wait_s, ge=0)
    # restarts of a wedged or dead engine, at most max_restarts in restart_window_s (eugr/spark-vllm-
    # docker#257: unbounded restarts leaked memory until the host needed a physical reset)
    max_restarts: int = Field(default=_DEFAULT.max_restarts, ge=0)
    restart_window_s: float = Field(default=_DEFAULT.restart_window_s, ge=60)
    # the fabric watched while serving: a data port down, its GID lost, its speed dropped
    # or an AER storm on any node takes the deployment out of the gateway's rotation (503 with
    # Retry-After; the engine keeps running); back after fabric_resume_polls healthy looks (with
    # fabric_auto_resume) or on `sparkcluster fabric resume`. false: journalled and alerted only
    fabric_hold: bool = _DEFAULT.fabric_hold
    fabric_resume_polls: int = Field(default=_DEFAULT.fabric_resume_polls, ge=1)
    fabric_auto_resume: bool = _DEFAULT.fabric_auto_resume
    # true: the hold stops the engine (its memory freed, as sparkring does) and starts it again when
    # the hold ends, rather than leaving it running out of rotation
    fabric_stop: bool = _DEFAULT.fabric_stop


class OnDemandSettings(BaseModel):
    """A profile's `[on_demand]` table: `up` leaves the deployment on standby (image,
    weights and containers in place, no engine, no memory held); a request through the gateway
    wakes it through the head's agent, admitted against every node's memory; an engine with no
    request for idle_ttl_s is stopped again (its containers stay)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    idle_ttl_s: float = Field(default=900.0, ge=10)


def policy(
    settings: SupervisorSettings,
    ready_timeout_s: float,
    gpu_memory_utilization: float = 0.0,
    on_demand: OnDemandSettings | None = None,
) -> dict:
    """The bounds as the agent reads them (contract.Policy's names); on demand's only when
    it is on, so a server not on demand runs under the bounds it always did."""
    doc = settings.model_dump()
    return {
        **{k: v for k, v in doc.items() if k not in ("enabled", "prefill_floor_tok_s")},
        "act": settings.enabled,
        "ready_timeout_s": float(ready_timeout_s),
        "memory_need_fraction": float(gpu_memory_utilization),
        **({"on_demand": True, "idle_ttl_s": float(on_demand.idle_ttl_s)} if on_demand and on_demand.enabled else {}),
    }


def profile_policy(prof) -> dict:
    """The bounds a profile's server runs under: what the serve stage hands the supervisor and what
    `up` compares with the running server's record to tell "already serving" (one reading, so the
    two never disagree)."""
    return policy(prof.supervisor, prof.ready_timeout_s, prof.serve.gpu_memory_utilization, prof.on_demand)
