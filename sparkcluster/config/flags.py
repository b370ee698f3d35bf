"""The `vllm serve` flag table, with the versions that accept each flag, and the argv builder.

Each typed field of `profile.Serve` maps to one flag. A flag may carry a `Gate`: the vLLM versions
(or NGC image releases) that accept it (docs/field-notes.md, "Version-dependent flags"):

- `--swap-space` removed in NGC 26.05+; `--async-scheduling`, `--moe-backend`,
  `--max-cudagraph-capture-size`, `--reasoning-parser-plugin`, `--mamba-ssm-cache-dtype float16` and
  the `super_v3` reasoning parser absent from NGC 25.11.
- vLLM 0.23 ignores `VLLM_USE_FLASHINFER_MOE_FP4` and its siblings ("Unknown vLLM environment
  variable detected"); `--moe-backend` replaces them.
- NGC 26.05.post1 ships vLLM 0.21.0.

`serve_argv` is pure and never sees a secret: the API key reaches vLLM through the environment of
the `docker exec`, not the `--api-key` flag (docs/field-notes.md, "Secrets").
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

# one direction only: the profile is data, the flags are built from it (profile never imports flags)
from sparkcluster.config.profile import Profile, reasoning_plugin

Version = tuple[int, int, int]
NgcRelease = tuple[int, int]


def parse_version(v: str) -> Version:
    """'0.21.0' -> (0, 21, 0); '0.23.1rc1', '0.18.2-dev', 'v0.20.0' -> their first three numbers."""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", v.strip())
    if not m:
        raise ValueError(f"not a version: {v!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def ngc_release(tag: str) -> NgcRelease | None:
    """NGC tag '26.05.post1-py3' -> (26, 5); None for tags that are not NGC YY.MM releases."""
    m = re.match(r"^(\d{2})\.(\d{2})(?:[.-]|$)", tag)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _fmt_ngc(r: NgcRelease) -> str:
    return f"{r[0]:02d}.{r[1]:02d}"


def _fmt_ver(v: Version) -> str:
    return ".".join(map(str, v))


@dataclass(frozen=True)
class Gate:
    """Which images accept a flag (or a flag value, or an environment variable).

    since/until: vLLM versions, [since, until). ngc_absent_through: the newest NGC release known
    to lack it (older releases lack it too). ngc_removed_from: the first NGC release without it.
    """

    since: Version | None = None
    until: Version | None = None
    ngc_absent_through: NgcRelease | None = None
    ngc_removed_from: NgcRelease | None = None
    source: str = ""
    verb: str = "rejects"  # "rejects" a flag; "ignores" an environment variable

    def refusal(self, vllm_version: str | None, image_kind: str, tag: str) -> str | None:
        """Why this image does not accept the item, or None when it does.

        vllm_version None (not stated by the profile's source): only the NGC release is judged.
        """
        if vllm_version:
            why = self._version_refusal(vllm_version)
            if why:
                return why
        rel = ngc_release(tag) if image_kind == "ngc" else None
        if rel and self.ngc_absent_through and rel <= self.ngc_absent_through:
            return (
                f"NGC image {tag} {self.verb} it (absent from NGC "
                f"{_fmt_ngc(self.ngc_absent_through)} and older; {self.source})"
            )
        if rel and self.ngc_removed_from and rel >= self.ngc_removed_from:
            return (
                f"NGC image {tag} {self.verb} it (removed from NGC {_fmt_ngc(self.ngc_removed_from)} on; {self.source})"
            )
        return None

    def _version_refusal(self, vllm_version: str) -> str | None:
        v = parse_version(vllm_version)
        if self.since and v < self.since:
            return f"vLLM {vllm_version} {self.verb} it (needs vLLM >= {_fmt_ver(self.since)}; {self.source})"
        if self.until and v >= self.until:
            return f"vLLM {vllm_version} {self.verb} it (gone from vLLM {_fmt_ver(self.until)}; {self.source})"
        return None


# absent from nvcr.io/nvidia/vllm:25.11-py3 (docs/field-notes.md, "Version-dependent flags")
_NEWER_THAN_25_11 = Gate(ngc_absent_through=(25, 11), source="seed 002")
# executor "mp" across nodes (issue 28): --nnodes/--node-rank/--master-addr/--master-port came with the
# mp executor's multi-node mode (vllm#23691, merged 2025-11-14: first in 0.12.0; NGC 25.11 ships
# 0.11); --headless is older (data parallel) but starts TP/PP ranks only from that release on
MP_MULTI_NODE = Gate(since=(0, 12, 0), ngc_absent_through=(25, 11), source="vllm#23691")


@dataclass(frozen=True)
class FlagSpec:
    field: str | None  # the Serve field, or None for flags only seen in extra_flags
    flag: str
    style: str = "value"  # value | bool (flag when true) | optbool (--x / --no-x) | json
    gate: Gate | None = None
    # value -> gate, for values newer than the flag itself
    value_gates: dict[str, Gate] = field(default_factory=dict)


# Order here is the order in the argv.
FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec("tensor_parallel_size", "--tensor-parallel-size"),
    FlagSpec("pipeline_parallel_size", "--pipeline-parallel-size"),
    FlagSpec("distributed_executor_backend", "--distributed-executor-backend"),
    FlagSpec("tokenizer", "--tokenizer"),
    FlagSpec("quantization", "--quantization"),
    FlagSpec("moe_backend", "--moe-backend", gate=_NEWER_THAN_25_11),
    FlagSpec("dtype", "--dtype"),
    FlagSpec("kv_cache_dtype", "--kv-cache-dtype"),
    FlagSpec("attention_backend", "--attention-backend"),
    # 25.11 accepts only auto|float32
    FlagSpec("mamba_ssm_cache_dtype", "--mamba-ssm-cache-dtype", value_gates={"float16": _NEWER_THAN_25_11}),
    FlagSpec("max_model_len", "--max-model-len"),
    FlagSpec("gpu_memory_utilization", "--gpu-memory-utilization"),
    FlagSpec("max_cudagraph_capture_size", "--max-cudagraph-capture-size", gate=_NEWER_THAN_25_11),
    FlagSpec("max_num_seqs", "--max-num-seqs"),
    FlagSpec("max_num_batched_tokens", "--max-num-batched-tokens"),
    FlagSpec("enable_chunked_prefill", "--enable-chunked-prefill", style="optbool"),
    FlagSpec("enable_prefix_caching", "--enable-prefix-caching", style="optbool"),
    FlagSpec("async_scheduling", "--async-scheduling", style="bool", gate=_NEWER_THAN_25_11),
    FlagSpec("enforce_eager", "--enforce-eager", style="bool"),
    FlagSpec("trust_remote_code", "--trust-remote-code", style="bool"),
    FlagSpec("speculative_config", "--speculative-config", style="json"),
    # the plugin path is computed (reasoning_plugin); --reasoning-parser-plugin is absent from 25.11
    FlagSpec(None, "--reasoning-parser-plugin", gate=_NEWER_THAN_25_11),
    FlagSpec("reasoning_parser", "--reasoning-parser", value_gates={"super_v3": _NEWER_THAN_25_11}),
    FlagSpec("enable_auto_tool_choice", "--enable-auto-tool-choice", style="bool"),
    FlagSpec("tool_call_parser", "--tool-call-parser"),
    FlagSpec(None, "--nnodes", gate=MP_MULTI_NODE),
    FlagSpec(None, "--node-rank", gate=MP_MULTI_NODE),
    FlagSpec(None, "--master-addr", gate=MP_MULTI_NODE),
    FlagSpec(None, "--headless", gate=MP_MULTI_NODE),
    # removed from the 26.05 NGC image, which ships vLLM 0.21.0
    FlagSpec(None, "--swap-space", gate=Gate(until=(0, 21, 0), ngc_removed_from=(26, 5), source="seed 002")),
)
BY_FLAG: dict[str, FlagSpec] = {f.flag: f for f in FLAGS}

# Environment variables a vLLM version ignores (docs/field-notes.md, "Version-dependent flags"): vLLM 0.23 deprecated
# VLLM_USE_FLASHINFER_MOE_FP4, VLLM_USE_FLASHINFER_MOE_FP8, ... (the VLLM_USE_FLASHINFER_MOE_*
# family) in favour of --moe-backend; they log "Unknown vLLM environment variable" and do nothing.
ENV_GATES: tuple[tuple[Callable[[str], bool], str, Gate], ...] = (
    (
        lambda n: n.startswith("VLLM_USE_FLASHINFER_MOE_"),
        "VLLM_USE_FLASHINFER_MOE_*",
        Gate(until=(0, 23, 0), source="seed 001", verb="ignores"),
    ),
)


def _fmt_value(v) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _as_args(spec: FlagSpec, value) -> list[str]:
    if value is None:
        return []
    if spec.style == "bool":
        return [spec.flag] if value else []
    if spec.style == "optbool":
        return [spec.flag] if value else ["--no-" + spec.flag[2:]]
    if spec.style == "json":
        return [spec.flag, json.dumps(value, separators=(",", ":"))]
    return [spec.flag, _fmt_value(value)]


def serve_argv(
    profile: Profile,
    image_kind: str | None = None,
    *,
    port: int | None = None,
    hf_cache: str = "/root/.cache/huggingface",
    host: str | None = None,
) -> list[str]:
    """The `vllm serve ...` argv for the profile.

    image_kind: "ngc" (default from the profile's image) prefixes `vllm serve`; "vllm-openai"
    (whose entrypoint is `vllm serve`) gives only the model and flags. port: the inventory's
    api_port when the profile sets none (8000 otherwise). hf_cache: where the HF cache is mounted in
    the container (the reasoning-parser plugin is staged there). No secret is ever part of it.
    """
    kind = image_kind or profile.image.kind
    if kind not in ("ngc", "vllm-openai"):
        raise ValueError(f"unknown image kind {kind!r}")
    s = profile.serve
    argv = ["vllm", "serve"] if kind == "ngc" else []
    argv.append(profile.model)
    if profile.revision:
        argv += ["--revision", profile.revision]
    if profile.served_name or profile.aliases:
        argv += ["--served-model-name", profile.served_model_name, *profile.aliases]
    argv += ["--host", host or s.host, "--port", str(s.port or port or 8000)]
    plugin = reasoning_plugin(profile, hf_cache)
    for spec in FLAGS:
        if spec.flag == "--reasoning-parser-plugin":
            if plugin:
                argv += [spec.flag, plugin[1]]
            continue
        if spec.field is None:
            continue
        argv += _as_args(spec, getattr(s, spec.field))
    argv += list(s.extra_flags)
    return argv


def engine_host(inv, profile: Profile) -> str:
    """The address a deployment's engine listens on (vLLM's --host). With the inventory's
    `engines_listen = "control"` (the default) its head's control address, or loopback when the
    cluster is one node (nothing else needs to reach it: the gateway and Prometheus run on that
    node); with "all", the profile's serve.host. `inv` is the deployment's inventory (its head is the
    engine's)."""
    if inv.cluster.engines_listen != "control":
        return profile.serve.host
    return inv.engine_address()


def reached_at(host: str) -> str:
    """Where the engine bound to `host` is asked from its own node (host networking): a wildcard
    bind answers on loopback; an IPv6 address in brackets, as a URL wants it."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def supervised_argv(profile: Profile, **kw) -> list[str]:
    """The argv the supervisor runs in the head container: always with `vllm serve`.

    The container's foreground process is the node agent, never the image's entrypoint, so even a
    vllm/vllm-openai image (entrypoint `vllm serve`) needs the prefix.
    """
    return serve_argv(profile, "ngc", **kw)


def rank_args(nnodes: int, rank: int, master_addr: str, master_port: int) -> list[str]:
    """What executor "mp" adds to one node's `vllm serve`: its rank among the nodes and the head's
    rendezvous; every node but the head runs headless (its ranks only, no API server)."""
    argv = [
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(rank),
        "--master-addr",
        master_addr,
        "--master-port",
        str(master_port),
    ]
    return argv + (["--headless"] if rank > 0 else [])


def flag_names(argv: list[str]) -> list[str]:
    """The `--flag` names in an argv ('--x=1' counts as '--x')."""
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value given to `flag` in argv (last one wins), or None."""
    val = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            val = argv[i + 1]
        elif a.startswith(flag + "="):
            val = a.split("=", 1)[1]
    return val


@dataclass(frozen=True)
class Refusal:
    item: str  # '--moe-backend', '--reasoning-parser super_v3', 'VLLM_USE_FLASHINFER_MOE_FP4'
    reason: str
    kind: str  # "flag" | "value" | "env"


def refusals(profile: Profile) -> list[Refusal]:
    """Every flag, flag value or forwarded variable the profile's image does not accept."""
    img = profile.image
    argv = serve_argv(profile, "vllm-openai")
    if profile.executor == "mp" and profile.world_size > 1:  # the flags each node's rank gets
        argv += rank_args(2, 1, "0.0.0.0", 1)
    out: list[Refusal] = []
    seen: set[str] = set()
    for name in flag_names(argv):
        spec = BY_FLAG.get(name)
        if spec is None or name in seen:
            continue
        seen.add(name)
        if spec.gate:
            why = spec.gate.refusal(img.vllm_version, img.kind, img.tag)
            if why:
                out.append(Refusal(name, why, "flag"))
                continue
        val = flag_value(argv, name)
        if val is not None and val in spec.value_gates:
            why = spec.value_gates[val].refusal(img.vllm_version, img.kind, img.tag)
            if why:
                out.append(Refusal(f"{name} {val}", why, "value"))
    for var in profile.env.forward:
        for match, _label, gate in ENV_GATES:
            if match(var):
                why = gate.refusal(img.vllm_version, img.kind, img.tag)
                if why:
                    out.append(Refusal(var, why, "env"))
    return out
