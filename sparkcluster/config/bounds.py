"""The supervisor's bounds: a profile's `[supervisor]` table, and the policy the node agent reads
(node/contract.py DEFAULT_POLICY's names). Pure configuration: nothing here talks to a host."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SupervisorSettings(BaseModel):
    """A profile's `[supervisor]` table; the defaults are the seeds' watchdog lines."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # false: the supervisor starts the server when `up` asks and journals what it sees, but never
    # restarts or stops it on its own, and brings nothing back after a reboot
    enabled: bool = True
    # wedged: requests running while no token is generated for stall_s, or a one-token completion
    # (every probe_interval_s) not returning within probe_timeout_s while /health is 200
    stall_s: float = Field(default=60.0, ge=5)
    probe_interval_s: float = Field(default=15.0, ge=2)
    probe_timeout_s: float = Field(default=20.0, ge=1)
    # MemAvailable on any node below this for memory_samples looks in a row: the server is stopped
    # for good (seed 000: +47 GB in 6 s on unified memory, and the host stopped answering SSH)
    memory_floor_gib: float = Field(default=6.0, ge=0)
    memory_samples: int = Field(default=3, ge=1)
    # restarts of a wedged or dead engine, at most max_restarts in restart_window_s (eugr/spark-vllm-
    # docker#257: unbounded restarts leaked memory until the host needed a physical reset)
    max_restarts: int = Field(default=3, ge=0)
    restart_window_s: float = Field(default=3600.0, ge=60)


def policy(settings: SupervisorSettings, ready_timeout_s: float) -> dict:
    """The bounds as the agent reads them (contract.DEFAULT_POLICY's names)."""
    doc = settings.model_dump()
    return {**{k: v for k, v in doc.items() if k != "enabled"}, "act": settings.enabled,
            "ready_timeout_s": float(ready_timeout_s)}
