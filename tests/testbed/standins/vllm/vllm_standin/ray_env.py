"""Which driver environment variables reach the Ray ranks (as vLLM's vllm/ray/ray_env.py).

Copied: names starting with VLLM_, NCCL_, UCX_, HF_ (plus HUGGING_FACE_, LMCACHE_ and
PYTHONHASHSEED, which real vLLM copies too). Never copied: worker-specific names (VLLM_HOST_IP,
VLLM_HOST_PORT, LOCAL_RANK, CUDA_VISIBLE_DEVICES) and every name listed in
`$VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json` (VLLM_CONFIG_ROOT defaults to
~/.config/vllm). Anything else (GLOO_*, OMPI_*, FLASHINFER_*, CUTE_DSL_*, ...) a rank has only if
the `ray start` of its own node had it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from vllm_standin.logger import init_logger

logger = init_logger(__name__)

DEFAULT_ENV_VAR_PREFIXES = ("VLLM_", "NCCL_", "UCX_", "HF_", "HUGGING_FACE_", "LMCACHE_")
DEFAULT_EXTRA_ENV_VARS = ("PYTHONHASHSEED",)
WORKER_SPECIFIC_ENV_VARS = frozenset({"VLLM_HOST_IP", "VLLM_HOST_PORT", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"})


def config_root(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    if env.get("VLLM_CONFIG_ROOT"):
        return os.path.expanduser(env["VLLM_CONFIG_ROOT"])
    xdg = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(xdg, "vllm")


def non_carry_over_file(environ: dict[str, str] | None = None) -> str:
    return os.path.join(config_root(environ), "ray_non_carry_over_env_vars.json")


def load_non_carry_over(path: str) -> set[str]:
    try:
        if os.path.exists(path):
            with open(path) as f:
                return set(json.load(f))
        return set()
    except (json.JSONDecodeError, TypeError):
        logger.warning("Failed to parse %s. Using an empty set for non-carry-over env vars.", path)
        return set()


@dataclass
class EnvCopyPlan:
    copied: dict[str, str] = field(default_factory=dict)
    skipped_non_carry_over: list[str] = field(default_factory=list)
    skipped_worker_specific: list[str] = field(default_factory=list)
    non_carry_over: set[str] = field(default_factory=set)
    file: str = ""


def plan_env_copy(environ: dict[str, str], non_carry_over: set[str], file: str = "") -> EnvCopyPlan:
    """Pure: from the driver's environment, what goes to the ranks' runtime_env."""
    plan = EnvCopyPlan(non_carry_over=set(non_carry_over), file=file)
    for name in sorted(environ):
        if not (name.startswith(DEFAULT_ENV_VAR_PREFIXES) or name in DEFAULT_EXTRA_ENV_VARS):
            continue
        if name in WORKER_SPECIFIC_ENV_VARS:
            plan.skipped_worker_specific.append(name)
        elif name in non_carry_over:
            plan.skipped_non_carry_over.append(name)
        else:
            plan.copied[name] = environ[name]
    return plan


def get_env_vars_to_copy(environ: dict[str, str] | None = None, destination: str = "workers") -> EnvCopyPlan:
    env = dict(os.environ if environ is None else environ)
    path = non_carry_over_file(env)
    plan = plan_env_copy(env, load_non_carry_over(path), path)
    logger.info("Env var prefixes to copy: %s", sorted(DEFAULT_ENV_VAR_PREFIXES))
    logger.info("Copying the following environment variables to %s: %s", destination, sorted(plan.copied))
    if plan.non_carry_over:
        logger.info("RAY_NON_CARRY_OVER_ENV_VARS from config: %s", sorted(plan.non_carry_over))
    if plan.skipped_non_carry_over:
        logger.info(
            "Not copying environment variables listed in %s: %s",
            path,
            plan.skipped_non_carry_over,
        )
    logger.info("To exclude env vars from copying, add them to %s", path)
    return plan
