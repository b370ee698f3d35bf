"""Model profiles (`$SPARKCLUSTER_PROFILES`, the shipped ones: `env-profiles/NAME.toml`, then
`~/.config/sparkcluster/profiles/`: `search_places`),
validated by pydantic with unknown keys refused: the model and image, the variables forwarded to every
container at start (equal on every node: `required_env_names`), the `vllm serve` arguments as typed
fields (`flags.serve_argv`), the executor, the secrets' names (never values). Per-host variables are
computed per node (`per_host_env`) and kept out of what Ray's executor copies (sparkrun#135)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkcluster.config import shipped
from sparkcluster.config.bounds import OnDemandSettings, SupervisorSettings
from sparkcluster.config.inventory import describe_validation_error
from sparkcluster.config.secrets import SECRET_NAMES, passed_names, register_written
from sparkcluster.config.service_profile import KIND as SERVICE_KIND
from sparkcluster.config.service_profile import ServiceProfile, one_line_words
from sparkcluster.config.topology import nccl_env
from sparkcluster.errors import InputError
from sparkcluster.movement.hfcache import is_hub_model
from sparkcluster.node.contract import NCCL_LOG_ENV

if TYPE_CHECKING:  # pragma: no cover
    from sparkcluster.config.inventory import Inventory, Node

PROFILES_ENV_VAR = "SPARKCLUSTER_PROFILES"
USER_PROFILES = Path("~/.config/sparkcluster/profiles")

SecretName = Literal["HF_TOKEN", "VLLM_API_KEY"]

# Per-host variables from the inventory: interface and HCA names, VLLM_HOST_IP = the node's control IP,
# NCCL_IB_GID_INDEX: never set (NCCL picks each HCA's index at start: checks/rdma), listed so that a
# profile cannot forward one and vLLM never copies one from the driver. field-notes.
PER_HOST_VARS: tuple[str, ...] = (
    "VLLM_HOST_IP",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "UCX_NET_DEVICES",
    "OMPI_MCA_btl_tcp_if_include",
    "NCCL_IB_GID_INDEX",
)
NON_CARRY_OVER_FILENAME = "ray_non_carry_over_env_vars.json"
# Set by sparkcluster in every container; a profile may not forward these by hand.
MANAGED_VARS: tuple[str, ...] = PER_HOST_VARS + ("VLLM_CONFIG_ROOT", "RAY_memory_usage_threshold")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PROFILE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$")
_DOCKER_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_RAY_VERSION = re.compile(r"^[0-9]+(\.[0-9]+){1,2}([a-z0-9.]*)?$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Image(_Strict):
    """The base image the cluster image is built FROM, and what it ships."""

    base: str = Field(pattern=r"^[a-z0-9][a-z0-9._/:-]*$")  # repository, without the tag
    tag: str = Field(pattern=_DOCKER_TAG.pattern)
    # None: the profile's source does not say which vLLM the tag ships (seed 004 names neither of its
    # images' versions); version gates then judge only by the NGC release in the tag.
    # a PEP 440 local part is allowed: NVIDIA's recipes name builds such as 0.26.1rc1.dev1231+g7a9993878
    vllm_version: str | None = Field(
        default=None, pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?([.+-]?[a-zA-Z0-9.]*)?(\+[a-zA-Z0-9.]+)?$"
    )
    # ngc: pass-through entrypoint, takes the full `vllm serve ...`;
    # vllm-openai: `vllm serve` is the entrypoint, takes only model + flags (docs/field-notes.md).
    kind: Literal["ngc", "vllm-openai"] | None = None
    # the registry digest the tag pointed at when pinned (`profile import --pin`: a source's lock, or
    # the digest its published figures were measured on): every node pulls base@digest, whatever
    # the tag points at later. None: the tag as it is
    digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _kind(self) -> Image:
        if self.kind is None:
            guessed = guess_image_kind(self.base)
            if guessed is None:
                raise ValueError(
                    f'kind: cannot tell the image kind from base {self.base!r}; set kind = "ngc" or "vllm-openai"'
                )
            object.__setattr__(self, "kind", guessed)
        return self

    @property
    def ref(self) -> str:
        return f"{self.base}@{self.digest}" if self.digest else f"{self.base}:{self.tag}"


def guess_image_kind(base: str) -> Literal["ngc", "vllm-openai"] | None:
    if base.startswith("nvcr.io/nvidia/vllm"):
        return "ngc"
    if base.split("/")[-1] == "vllm-openai":
        return "vllm-openai"
    return None


AUTOTUNE_SYNC_VAR = "VLLM_FLASHINFER_AUTOTUNE_DISTRIBUTED_SYNC"  # vllm-project/vllm PR #52292


class EnvSettings(_Strict):
    # in every container at start, equal on every node (docs/field-notes.md, "Bring-up")
    forward: dict[str, str] = Field(default_factory=dict)
    # Ray's memory monitor counts GPU-resident weights as host memory on unified memory and kills
    # workers at 0.95 (docs/field-notes.md, "Memory on a unified-memory machine").
    ray_memory_usage_threshold: float = Field(default=1.0, gt=0, le=1.0)
    # Where vLLM reads ray_non_carry_over_env_vars.json inside the container.
    vllm_config_root: str = Field(default="/etc/sparkcluster/vllm", pattern=r"^/[A-Za-z0-9._/-]*$")
    # FlashInfer's autotune across the ranks (issue 59). vLLM hands its world CPU group to FlashInfer's
    # autotuner (`set_autotune_process_group`, flashinfer-ai/flashinfer PR #3187; wired in by
    # vllm-project/vllm PR #50892) so every rank averages its timings with its peers'. On GB10 pairs
    # whose inter-node NCCL is host-staged that deadlocks or drifts the ranks until the 1800 s gloo
    # barrier (vllm-project/vllm#52291; getainode/ainode#134, PR #136). vllm-project/vllm PR #52292 adds
    # VLLM_FLASHINFER_AUTOTUNE_DISTRIBUTED_SYNC (default 1; 0: every rank tunes alone, no cross-rank
    # collective while tuning). None: not set (the image's default); True/False: 1/0 in every container.
    # An image whose vLLM predates that PR ignores the variable.
    flashinfer_autotune_sync: bool | None = None

    @model_validator(mode="after")
    def _sync_once(self) -> EnvSettings:
        if self.flashinfer_autotune_sync is not None and AUTOTUNE_SYNC_VAR in self.forward:
            raise ValueError(f"env.flashinfer_autotune_sync sets {AUTOTUNE_SYNC_VAR}: remove it from env.forward")
        return self

    def variables(self) -> dict[str, str]:
        """What every container gets: `forward`, and the autotune setting where the profile sets it."""
        out = dict(self.forward)
        if self.flashinfer_autotune_sync is not None:
            out[AUTOTUNE_SYNC_VAR] = "1" if self.flashinfer_autotune_sync else "0"
        return out

    @field_validator("forward", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> Any:
        # TOML lets people write VLLM_USE_FLASHINFER_MOE_FP4 = 0; the container sees a string.
        if isinstance(v, dict):
            out = {}
            for k, val in v.items():
                if isinstance(val, bool):
                    raise ValueError(f'{k}: write the value as a string ("1" or "0"), not a boolean')
                out[k] = str(val) if isinstance(val, (int, float)) else val
            return out
        return v

    @field_validator("forward")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not _ENV_NAME.match(k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
            if "\n" in val or "\x00" in val:
                raise ValueError(f"{k}: value may not contain a newline or NUL")
        return v


class Serve(_Strict):
    """`vllm serve` arguments. None means: do not pass the flag (vLLM's default applies)."""

    tensor_parallel_size: int = Field(default=2, ge=1, le=64)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64)
    # TP across two hosts runs on Ray (docs/field-notes.md, "Bring-up"); a single rank gets no flag
    # unless the profile names a backend (seed 000 passes none at TP=1): `_single_rank_executor`
    distributed_executor_backend: Literal["ray", "mp"] | None = "ray"
    max_model_len: int | None = Field(default=None, ge=1)
    # vLLM's 0.9 default starves a unified-memory host (docs/field-notes.md, "Memory on a unified-memory machine").
    gpu_memory_utilization: float = Field(default=0.75, gt=0, le=1.0)
    dtype: str | None = Field(default=None, pattern=r"^[a-z0-9_]+$")
    kv_cache_dtype: str | None = Field(default=None, pattern=r"^[a-z0-9_]+$")
    quantization: str | None = Field(default=None, pattern=r"^[a-z0-9_-]+$")
    # tokenizer from another repo than the weights: a quantized re-upload may lack the original's
    # (seed 004 serves RedHatAI's NVFP4 weights with --tokenizer Qwen/Qwen3.6-35B-A3B)
    tokenizer: str | None = Field(default=None, min_length=1, pattern=r"^[^\s]+$")
    # --attention-backend, e.g. TRITON_ATTN (seed 004 names it for Gemma 4, whose mixed head sizes
    # FlashInfer does not support); no version gate: neither the seeds nor the field notes give one
    attention_backend: str | None = Field(default=None, pattern=r"^[A-Z0-9_]+$")
    moe_backend: str | None = Field(default=None, pattern=r"^[a-z0-9_]+$")
    mamba_ssm_cache_dtype: str | None = Field(default=None, pattern=r"^[a-z0-9_]+$")
    max_cudagraph_capture_size: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    async_scheduling: bool = False
    enforce_eager: bool = False
    trust_remote_code: bool = False
    reasoning_parser: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    # a Python file staged once into the (mounted) HF cache, passed with --reasoning-parser-plugin
    reasoning_parser_plugin_url: str | None = Field(default=None, pattern=r"^https://[^\s]+\.py$")
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    speculative_config: dict[str, Any] | None = None
    host: str = Field(default="0.0.0.0", pattern=r"^[0-9a-fA-F.:]+$|^[a-zA-Z0-9.-]+$")
    port: int | None = Field(default=None, ge=1, le=65535)  # None: the inventory's api_port
    extra_flags: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _single_rank_executor(self) -> Serve:
        # The "ray" default is for the pair; one rank on one node needs no executor flag. A backend
        # the profile names explicitly is kept (lint judges it).
        single = self.tensor_parallel_size * self.pipeline_parallel_size == 1
        if single and "distributed_executor_backend" not in self.model_fields_set:
            object.__setattr__(self, "distributed_executor_backend", None)
        return self

    @field_validator("extra_flags")
    @classmethod
    def _no_newlines(cls, v: list[str]) -> list[str]:
        return one_line_words(v)


_COMMIT = r"^[0-9a-f]{40}$"


class SourceContainer(_Strict):
    """The container options of the source's own `docker run` (or compose file), as it writes them.
    Unset: the source passes no such option (Docker's default)."""

    # where the docker command is written, when not in the document [source] names (a build log whose
    # repository holds the script): a URL, or repo + path + commit
    url: str | None = Field(default=None, pattern=r"^https://[^\s]+$")
    repo: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    path: str | None = Field(default=None, pattern=r"^[^\s]+$")
    commit: str | None = Field(default=None, pattern=_COMMIT)
    privileged: bool = False
    gpus: str | None = None  # --gpus
    network: str | None = None  # --network; unset: Docker's bridge network
    ipc: str | None = None  # --ipc; unset: Docker's default
    shm_size: str | None = None  # --shm-size, as written
    # --ulimit NAME=VALUE, as written (soft[:hard]; a hard limit not written is the soft one:
    # docker/go-units ulimit.go, ParseUlimit)
    ulimits: dict[str, str] = Field(default_factory=dict)
    devices: list[str] = Field(default_factory=list)  # --device
    cap_add: list[str] = Field(default_factory=list)  # --cap-add
    security_opt: list[str] = Field(default_factory=list)  # --security-opt
    entrypoint: str | None = None  # --entrypoint; unset: the image's own
    command: str = Field(min_length=1)  # what the container runs, in words (the source's command line)

    @model_validator(mode="after")
    def _where(self) -> SourceContainer:
        _one_place(self, "source.container", optional=True)
        return self


class Source(_Strict):
    """The public document a profile follows: a URL, or a repository path at a commit."""

    url: str | None = Field(default=None, pattern=r"^https://[^\s]+$")
    repo: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    path: str | None = Field(default=None, pattern=r"^[^\s]+$")
    commit: str | None = Field(default=None, pattern=_COMMIT)
    # the sha256 of the source file's bytes as read (`profile import` records it; a test compares the
    # shipped profile with what the importer makes of the file that has it)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    container: SourceContainer
    # an option where the profile's container differs from the source's on purpose (beyond what every
    # container of sparkcluster carries: container/conformance HOUSE), with its reason
    diverges: dict[str, Annotated[str, Field(min_length=1)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _where(self) -> Source:
        _one_place(self, "source", optional=False)
        return self


def _one_place(where: Source | SourceContainer, name: str, optional: bool) -> None:
    """A source is named by a URL, or by repo, path and commit together, not both."""
    parts = (where.repo, where.path, where.commit)
    if where.url and any(parts):
        raise ValueError(f"{name}: give url, or repo + path + commit, not both")
    if any(parts) and not all(parts):
        raise ValueError(f"{name}: repo, path and commit go together")
    if not optional and not (where.url or all(parts)):
        raise ValueError(f"{name}: give url, or repo + path + commit")


def source_address(where: Source | SourceContainer) -> str | None:
    """The source as one address: its URL, or `repo path@commit`."""
    if where.url:
        return where.url
    return f"{where.repo} {where.path}@{where.commit}" if where.repo else None


class Profile(_Strict):
    name: str = Field(pattern=_PROFILE_NAME.pattern)
    description: str = ""
    model: str = Field(min_length=1, pattern=r"^[^\s]+$")  # HF id or a path inside the container
    served_name: str | None = Field(default=None, pattern=r"^[^\s]+$")
    # more names the engine answers to (vLLM's --served-model-name takes several): the gateway routes
    # each of them to this deployment, and the request body passes through untouched (issue 36)
    aliases: list[Annotated[str, Field(pattern=r"^[^\s,]+$")]] = Field(default_factory=list)
    # the hub revision to serve (branch, tag or commit); unset: main. The weights stage resolves it
    revision: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
    # how the checkpoint is quantized: decides what --quantization must be
    checkpoint_format: Literal["auto", "modelopt", "compressed-tensors", "fp8", "bf16"] = "auto"
    # Mamba/hybrid model: prefix caching forces an aligned block size (docs/field-notes.md)
    hybrid: bool = False
    allow_high_gpu_memory_utilization: bool = False
    drop_page_cache: bool = False  # sync; echo 3 > /proc/sys/vm/drop_caches before the load
    # the compile caches (config/compile_cache): "keyed" keeps them on each node, one folder per key
    # of image ID, model and compiling flags, seeded from the image's own on a key's first start;
    # "image" mounts none and lets the engine use the caches the image ships in place (NGC 26.10's
    # release notes: prebuilt kernel, compilation and autotuning caches for some models on DGX Spark);
    # what it compiles then is lost with the container
    compile_cache: Literal["keyed", "image"] = "keyed"
    fabric_test: bool = True  # `up` runs doctor --fabric's test when it creates containers; FAIL stops it
    # issue 28: how the ranks span the nodes. ray: a Ray cluster (the image gains a pinned Ray); mp:
    # vLLM's own multi-node launch (--nnodes/--node-rank/--master-addr, --headless on workers), the base
    # image served as it is. `serve.distributed_executor_backend` follows it
    executor: Literal["ray", "mp"] = "ray"
    # free disk the preflight asks for: the built image (NGC vLLM ~9 GB base plus Ray, room to
    # build) and the model in the HF cache (0: already there, or not ours to judge)
    image_disk_gb: float = Field(default=30.0, ge=0)
    model_disk_gb: float = Field(default=0.0, ge=0)
    # how long `up` waits for the endpoint to answer: 120B-class models take 10-15 min to load
    # (docs/field-notes.md) plus 25-60 s of first-request JIT
    ready_timeout_s: int = Field(default=1800, ge=10)
    # ranks in different warm-up phases (weights, compile, profiling, autotuning, graph capture: read
    # from each rank's log) for this long are a verdict naming each rank's phase, before the 1800 s
    # gloo barrier kills the pair (getainode/ainode#134: ranks 7 min 18 s apart in autotune, then
    # killed at the barrier; PR #136). 0: not judged (issue 59)
    warmup_drift_s: int = Field(default=300, ge=0)
    # single-stream decode tok/s a pair of real Sparks reaches with this profile, from a published
    # measurement cited next to the value in the profile's TOML (model, quantization, TP and vLLM
    # version must match). `bench.smoke` (behind `up --smoke`) warns well below it. None: no
    # published figure for this exact setup, so nothing to compare against.
    expected_decode_tok_s: float | None = Field(default=None, gt=0)
    shm_size: str = Field(default="16g", pattern=r"^[0-9]+[bkmgBKMG]?$")  # what Spark pairs run with
    # the container's stack ulimit in bytes (soft = hard), as `docker run --ulimit stack=N`; None:
    # Docker's default. Seed 004 runs both its containers with stack=67108864.
    ulimit_stack: int | None = Field(default=None, ge=1)
    # container options NVIDIA's current Spark recipes pass (issue 51): `docker run --security-opt`
    # values ("seccomp=unconfined", "apparmor=unconfined": vLLM's io_uring loading, which Docker's
    # default seccomp profile blocks since moby/moby#46762) and `--privileged`. Both widen the
    # container's rights; `profile lint` warns. AppArmor applies only where the host runs it.
    security_opt: list[str] = Field(default_factory=list)
    privileged: bool = False
    # the container's open-files ulimit (soft = hard), as `docker run --ulimit nofile=N:N`; None:
    # Docker's default. NVIDIA's two-Spark recipes pass nofile=1048576:1048576.
    ulimit_nofile: int | None = Field(default=None, ge=1)
    # the lowest NVIDIA driver the image runs on, where the profile's source states one (seed 001: its
    # image is built for >= 590.44); doctor FAILs a node below it. None: only differences are warned.
    min_driver: str | None = Field(default=None, pattern=r"^[0-9]+(\.[0-9]+){0,2}$")
    # the secrets passed to `vllm serve` (its exec's environment); VLLM_API_KEY is passed whatever
    # this lists: `up` generates one when none is set (config/secrets.generate_api_key)
    secrets: list[SecretName] = Field(default_factory=lambda: list(SECRET_NAMES))
    image: Image
    env: EnvSettings = Field(default_factory=EnvSettings)
    serve: Serve = Field(default_factory=Serve)
    supervisor: SupervisorSettings = Field(default_factory=SupervisorSettings)
    on_demand: OnDemandSettings = Field(default_factory=OnDemandSettings)
    # where the profile comes from and the container options its `docker run` uses (container/conformance
    # compares them with what `up` creates); nothing here is served, so profile_hash leaves it out
    source: Source | None = None
    path: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _executor(self) -> Profile:
        backend = self.serve.distributed_executor_backend
        if self.executor == "mp" and self.world_size > 1 and backend != "mp":
            if "distributed_executor_backend" in self.serve.model_fields_set:
                raise ValueError(
                    f'executor = "mp" runs vLLM\'s mp backend: remove serve.distributed_executor_backend ({backend})'
                )
            object.__setattr__(self, "serve", self.serve.model_copy(update={"distributed_executor_backend": "mp"}))
        return self

    @model_validator(mode="after")
    def _on_demand(self) -> Profile:
        if self.on_demand.enabled and not self.supervisor.enabled:
            raise ValueError(
                "[on_demand] enabled needs the supervisor: it starts and stops the engine "
                "(set [supervisor] enabled = true, or turn [on_demand] off)"
            )
        return self

    def forwarded_env(self) -> dict[str, str]:
        """The variables every container gets at start, identical on every node."""
        return self.env.variables()

    def image_tag(self, ray_version: str) -> str:
        """Tag of the image built FROM the base with Ray added, e.g. 26.05.post1-py3-ray2.60.0."""
        if not _RAY_VERSION.match(ray_version):
            raise InputError(f"not a Ray version: {ray_version!r}", "use a version such as 2.60.0")
        tag = f"{self.image.tag}-ray{ray_version}"
        if not _DOCKER_TAG.match(tag):
            raise InputError(f"image tag {tag!r} is not a valid Docker tag", "shorten image.tag")
        return tag

    @property
    def served_model_name(self) -> str:
        return self.served_name or self.model

    @property
    def served_names(self) -> list[str]:
        """Every name the engine answers to: the served name, then the aliases (issue 36)."""
        return list(dict.fromkeys([self.served_model_name, *self.aliases]))

    @property
    def world_size(self) -> int:
        return self.serve.tensor_parallel_size * self.serve.pipeline_parallel_size


def per_host_env(profile: Profile, inventory: Inventory, node: Node | str) -> dict[str, str]:
    """The variables whose values differ per node, from the inventory."""
    if isinstance(node, str):
        node = inventory.node(node)
    env = {
        "VLLM_HOST_IP": str(node.control_ip),
        "NCCL_SOCKET_IFNAME": node.control_if,
        "GLOO_SOCKET_IFNAME": node.control_if,
        # NCCL pairs HCAs by list position: keep the inventory's order
        "NCCL_IB_HCA": ",".join(node.hcas),
        "UCX_NET_DEVICES": node.control_if,
        "OMPI_MCA_btl_tcp_if_include": node.control_if,
    }
    # NCCL_IB_GID_INDEX is never set (issue 35): NCCL >= 2.21 finds each HCA's RoCE v2 IPv4 GID at
    # every start, where a number pinned at init goes stale when the GID table moves (checks/rdma)
    return env


def container_env(profile: Profile, inventory: Inventory, node: Node | str) -> dict[str, str]:
    """Everything a node's container is started with (no secrets: those go to the exec)."""
    env = profile.forwarded_env()
    env.update(per_host_env(profile, inventory, node))
    if profile.executor == "ray":  # Ray's memory monitor: nothing to set where no Ray runs
        env["RAY_memory_usage_threshold"] = repr(float(profile.env.ray_memory_usage_threshold))
    env["VLLM_CONFIG_ROOT"] = profile.env.vllm_config_root
    # the engine's NCCL log (read by status) and what the cabling needs of NCCL: the profile's value wins
    for k, v in {**NCCL_LOG_ENV, **nccl_env(inventory.cluster.topology)}.items():
        env.setdefault(k, v)
    if is_hub_model(profile.model):
        # the weights stage staged the snapshot on every node: no rank may reach for the hub
        env["HF_HUB_OFFLINE"] = "1"
    return env


def required_env_names(profile: Profile) -> list[str]:
    """Names the probe must find present and equal in every node's container."""
    managed = {"VLLM_CONFIG_ROOT"} | ({"RAY_memory_usage_threshold"} if profile.executor == "ray" else set())
    return sorted(set(profile.forwarded_env()) | managed)


def non_carry_over_vars(profile: Profile) -> list[str]:
    # The secrets too: vLLM would copy VLLM_API_KEY and HF_TOKEN from the driver into the ranks'
    # Ray runtime_env, which Ray passes on the worker's setup_worker.py command line (`ps`).
    # No rank needs the API key; a worker rank finds the weights in its own HF cache.
    return list(PER_HOST_VARS) + list(SECRET_NAMES)


def non_carry_over_file(profile: Profile) -> tuple[str, str]:
    """(path inside the container, JSON text) of vLLM's ray_non_carry_over_env_vars.json."""
    path = str(PurePosixPath(profile.env.vllm_config_root) / NON_CARRY_OVER_FILENAME)
    return path, json.dumps(non_carry_over_vars(profile)) + "\n"


def container_files(profile: Profile) -> dict[str, str]:
    """Files whoever starts a container writes into it: {path: content}."""
    path, text = non_carry_over_file(profile)
    return {path: text}


def profile_hash(prof) -> str:
    # the validated fields, not the file's text: comments and key order change nothing served
    # (the source is documentation: it changes nothing served); an unset ulimit_nofile is left out so
    # that a profile without it keeps the hash it had before the field existed
    # (image.digest likewise)
    exclude: dict = {"source": True}
    if getattr(prof, "ulimit_nofile", None) is None:
        exclude["ulimit_nofile"] = True
    if getattr(getattr(prof, "image", None), "digest", "") is None:
        exclude["image"] = {"digest"}
    return hashlib.sha256(prof.model_dump_json(exclude=exclude).encode()).hexdigest()


def secret_env_names(profile: Profile) -> list[str]:
    """Names passed in the environment of the `vllm serve` exec (values from secrets.load_secrets):
    the profile's `secrets`, and VLLM_API_KEY whatever they list."""
    return passed_names(profile.secrets)


def reasoning_plugin(profile: Profile, hf_cache: str = "/root/.cache/huggingface") -> tuple[str, str] | None:
    """(URL, path inside the container) of the reasoning-parser plugin to stage, or None.

    The file goes into the mounted HF cache so it survives container restarts (docs/field-notes.md, "Bring-up").
    """
    url = profile.serve.reasoning_parser_plugin_url
    if not url:
        return None
    return url, str(PurePosixPath(hf_cache) / url.rsplit("/", 1)[-1])


def search_places() -> list[tuple[Path, str]]:
    """Where profiles are looked for, in order, first match wins, each with where it comes from: each
    folder of $SPARKCLUSTER_PROFILES (os.pathsep between them; these override the shipped profiles), the
    profiles that ship with the package (config/shipped: inside an installed package, env-profiles/ in
    a checkout), then ~/.config/sparkcluster/profiles/ (names of your own; a shipped name wins)."""
    places: list[tuple[Path, str]] = []
    env = os.environ.get(PROFILES_ENV_VAR)
    if env:
        places.extend((Path(p).expanduser(), f"${PROFILES_ENV_VAR}") for p in env.split(os.pathsep) if p)
    places.append((shipped.profiles_dir(), "shipped with sparkcluster"))
    places.append((USER_PROFILES.expanduser(), "yours"))
    return places


def search_path() -> list[Path]:
    return [d for d, _ in search_places()]


def available() -> dict[str, Path]:
    """Profile name -> file; an earlier directory in the search path shadows a later one."""
    found: dict[str, Path] = {}
    for d in search_path():
        if not d.is_dir():
            continue
        for f in sorted(d.glob("*.toml")):
            if f.name.endswith(".perf.toml"):  # a profile's performance record, beside it (bench/perf_record.py)
                continue
            found.setdefault(f.stem, f)
    return dict(sorted(found.items()))


def find(name: str) -> Path:
    if name.endswith(".toml") or "/" in name:
        p = Path(name).expanduser()
        if not p.is_file():
            raise InputError(f"no profile file at {p}", "check the path")
        return p
    if not _PROFILE_NAME.match(name):
        raise InputError(f"not a profile name: {name!r}", "use letters, digits, '.', '_' or '-'")
    for d in search_path():
        p = d / f"{name}.toml"
        if p.is_file():
            return p
    import difflib

    names = list(available())
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    where = ", ".join(str(d) for d in search_path())
    if close:
        err = InputError(
            f"no profile named {name!r}: did you mean {' or '.join(map(repr, close))}?", f"use {close[0]!r}"
        )
        err.replace = (name, close[0])  # the CLI prints the command line with it in place
        raise err
    raise InputError(
        f"no profile named {name!r} (searched: {where})",
        f"see the {len(names)} there are: sparkcluster profile list" if names else "write one: see README, Profiles",
    )


def parse(text: str, name: str, source: str = "profile", path: Path | None = None) -> Profile | ServiceProfile:
    """A profile's TOML, validated: a model's (no `kind`, or `kind = "model"`) or a service's
    (`kind = "service"`, issue 60: config/service)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{source}: not valid TOML: {e}", "fix the syntax at the position shown") from None
    lines = [f"{source}: {k}: set from the file name/location, remove it" for k in ("name", "path") if k in data]
    kind = data.pop("kind", "model")
    if kind not in ("model", SERVICE_KIND):
        raise InputError(f"{source}: kind: {kind!r} is not a profile kind", 'set kind = "model" or kind = "service"')
    model = ServiceProfile if kind == SERVICE_KIND else Profile
    rest = {k: v for k, v in data.items() if k not in ("name", "path")}
    try:
        prof = model.model_validate({**rest, "name": name, **({"path": path} if model is Profile else {})})
    except ValidationError as e:
        lines += describe_validation_error(source, e, model)
    if lines:
        raise InputError(
            f"{source}: {len(lines)} problem(s) in the profile", "correct the fields listed above", details=lines
        )
    if model is Profile:
        register_written(prof)
    return prof


def load_profile(name: str, service: bool = False) -> Profile | ServiceProfile:
    """Load a profile by name (search path) or by a path to a .toml file. A service's profile (issue
    60) only where the caller takes one (`service`: up, the gateway, monitoring); elsewhere it is
    refused in one line that says which commands take it."""
    prof = _load(name)
    if isinstance(prof, ServiceProfile) and not service:
        raise InputError(
            f"profile '{prof.name}' is a service (kind = \"service\"): this command takes a model's profile",
            f"a service is started with sparkcluster up --profile {prof.name} --node NODE --beside, shown by "
            "status and events, routed by the gateway, stopped by down --profile",
        )
    return prof


def _load(name: str) -> Profile | ServiceProfile:
    path = find(name)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}", "check the file's permissions") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start}); TOML files are UTF-8", "save it as UTF-8") from None
    return parse(text, name=path.stem, source=str(path), path=path.resolve())
