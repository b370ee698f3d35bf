"""Cluster-consistency checks the driver runs on what the ranks report (pure, no Ray).

Each rank report is a dict: rank, ip (vLLM's get_ip() in the rank), node_ip (Ray's node IP),
node_id, hostname, pid, env (selected variables of the rank's own process).
"""

from __future__ import annotations

from collections.abc import Iterable

# Variables a served model needs on every rank, identical everywhere (the test double's table).
MODEL_REQUIRED_ENV: dict[str, tuple[str, ...]] = {
    "sparkcluster/testbed-tiny": (
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
        "FLASHINFER_DISABLE_VERSION_CHECK",
    ),
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4": (
        "VLLM_NVFP4_GEMM_BACKEND",
        "VLLM_FLASHINFER_ALLREDUCE_BACKEND",
        "VLLM_USE_FLASHINFER_MOE_FP4",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
    ),
}

# max_position_embeddings of the model's config.json, where the double knows it.
MODEL_DERIVED_MAX_LEN: dict[str, int] = {"sparkcluster/testbed-tiny": 4096}


def max_model_len_error(model: str, max_model_len: int | None, environ: dict[str, str]) -> str | None:
    """vLLM refuses --max-model-len above the model's own limit unless VLLM_ALLOW_LONG_MAX_MODEL_LEN."""
    derived = MODEL_DERIVED_MAX_LEN.get(model)
    if derived is None or not max_model_len or max_model_len <= derived:
        return None
    if environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in ("1", "true"):
        return None
    return (
        f"User-specified max_model_len ({max_model_len}) is greater than the derived "
        f"max_model_len (max_position_embeddings={derived} or model_max_length=None in model's "
        "config.json). To allow overriding this maximum, set the env var "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme "
        "caution. If the model uses relative position encoding (RoPE), positions exceeding "
        "derived_max_model_len lead to nan. If the model uses absolute position encoding, "
        "positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error."
    )


# Prefixes/names a rank reports back to the driver (diagnostics and the checks above).
REPORTED_PREFIXES = ("VLLM_", "NCCL_", "UCX_", "HF_", "GLOO_", "FLASHINFER_", "CUTE_DSL_", "OMPI_")


def required_env(model: str) -> tuple[str, ...]:
    return MODEL_REQUIRED_ENV.get(model, ())


def reported_env(environ: dict[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    names = set(extra)
    return {k: v for k, v in environ.items() if k.startswith(REPORTED_PREFIXES) or k in names}


def unique_ip_error(reports: list[dict], driver_ip: str | None = None) -> str | None:
    """vLLM: the number of Ray nodes hosting ranks must equal the number of distinct IPs."""
    n_nodes = len({r["node_id"] for r in reports})
    ips = {r["ip"] for r in reports}
    if driver_ip:
        ips.add(driver_ip)
    if n_nodes != len(ips):
        return (
            f"Every node should have a unique IP address. Got {n_nodes} nodes with "
            f"{len(ips)} unique IP addresses. Please check your network configuration. "
            "If you set `VLLM_HOST_IP` environment variable, make sure it is unique for each node."
        )
    return None


def ip_node_mismatch_error(reports: list[dict]) -> str | None:
    for r in sorted(reports, key=lambda r: r["rank"]):
        if r["ip"] != r["node_ip"]:
            source = "VLLM_HOST_IP" if r.get("env", {}).get("VLLM_HOST_IP") else "its default-route interface"
            return (
                f"Worker rank {r['rank']} on {r.get('hostname', '?')} reports IP {r['ip']} "
                f"(from {source}) but its Ray node registered with IP {r['node_ip']}. "
                "Make sure the IP addresses used by ray cluster are the same as VLLM_HOST_IP "
                "environment variable specified in each node if you are running on a multi-node."
            )
    return None


_CRASH = "ranks selected different kernels and the first all-reduce failed"


def required_env_error(model: str, reports: list[dict]) -> str | None:
    names = required_env(model)
    ranks = sorted(reports, key=lambda r: r["rank"])
    if not names or not ranks:
        return None
    r0 = ranks[0]
    for name in names:
        vals = [r.get("env", {}).get(name) for r in ranks]
        if all(v is None for v in vals):
            return (
                f"rank {r0['rank']} ({r0['ip']}): {name} is unset on all {len(ranks)} rank(s); "
                f"{model} needs it on every rank and the first all-reduce failed"
            )
        for r, v in zip(ranks[1:], vals[1:]):
            if v == vals[0]:
                continue
            if v is None:
                return (
                    f"rank {r['rank']} ({r['ip']}): {name} is unset while rank {r0['rank']} has {vals[0]!r}; {_CRASH}"
                )
            if vals[0] is None:
                return f"rank {r0['rank']} ({r0['ip']}): {name} is unset while rank {r['rank']} has {v!r}; {_CRASH}"
            return f"rank {r['rank']} ({r['ip']}): {name}={v!r} while rank {r0['rank']} has {vals[0]!r}; {_CRASH}"
    return None
