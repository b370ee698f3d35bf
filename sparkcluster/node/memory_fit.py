"""The unified-memory arithmetic, written once (issue 52): what one rank of a profile needs of a
node's memory and whether the node has it. `doctor`'s mem.fit and mem.headroom, `lint`, `up`'s
preflight, the supervisor's restart gate and on-demand admission all read it here.

On a DGX Spark the GPU and the CPU share one pool (docs/field-notes.md, "Memory on a unified-memory
machine"); vLLM's `--gpu-memory-utilization` is a fraction of that whole pool, so of MemTotal. Within
that budget the engine must hold its rank's weights and at least one `max_model_len` sequence of KV
cache, or it refuses to start (vLLM: "No available memory for the cache blocks", or "the model's max
seq len ... is larger than the maximum number of tokens that can be stored in KV cache"). Outside the
budget MemAvailable must keep the floor the field's watchdog warns at.

Sizes a node's memory comes in: 128 GB (MemTotal about 119-121 GiB) and 64 GB (NVIDIA's vllm-cluster
page: "2 x DGX Spark, 64GB each ... use two Sparks of the same memory size").

Standard library only: this file is shipped into every container (the supervisor reads it there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 10**9
GiB = 2**30
# what `lint` assumes of a node whose memory the inventory does not state: the DGX Spark most owners
# have (docs/field-notes.md, "The hardware": 128 GB)
DEFAULT_MEMORY_GB = 128.0
# two nodes whose MemTotal differs by more than this are of different memory sizes (a 128 GB Spark
# reads 119-121 GiB; a 64 GB one about half)
SIZE_TOLERANCE = 0.15

# the files of a repository the engine loads as weights (safetensors, PyTorch's pickles, GGUF)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")

# bytes per element of the KV cache: vLLM's --kv-cache-dtype, "auto" taking the model's dtype
_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
    "nvfp4": 0.5,
}


def gb(n: float | None) -> str:
    """Bytes as the field writes memory sizes (GB, 10^9), or "unknown"."""
    return "unknown" if n is None else f"{n / GB:.1f} GB"


def weight_bytes(files) -> int:
    """The weights of a repository listing, `files` being (path, size) pairs: the weight files'
    sizes when it lists any, else every file's (a repository of one other format)."""
    files = list(files)
    weights = [s for p, s in files if p.lower().endswith(WEIGHT_SUFFIXES)]
    return sum(weights) if weights else sum(s for _, s in files)


def weights_per_rank(total: int, tp: int, pp: int) -> int:
    """One rank's share of the weights: tensor parallel splits every layer, pipeline parallel the
    layers (an even split; embeddings and the head are not singled out)."""
    return math.ceil(total / max(1, tp * pp))


@dataclass(frozen=True)
class KvMin:
    """The KV cache one `max_model_len` sequence takes on one rank, or None and why it is unknown."""

    bytes: int | None
    how: str


def text_config(config: dict) -> dict:
    """A multimodal model's text part where it has one (as config/lint.model_shape reads it)."""
    c = config.get("text_config") or config.get("llm_config") or config
    return c if isinstance(c, dict) else {}


def _unknown_kind(c: dict) -> str | None:
    """Why a plain-attention formula would be a guess for this config, or None."""
    if c.get("kv_lora_rank") is not None:
        return "MLA (kv_lora_rank): the cache holds a compressed latent, not K and V heads"
    types = c.get("layer_types") or c.get("layers_block_type") or []
    kinds = {str(t).lower() for t in types} if isinstance(types, list) else set()
    if kinds and kinds <= {"attention", "full_attention", "sliding_attention"} and "sliding_attention" in kinds:
        return "sliding-window attention on some layers (layer_types)"
    if c.get("hybrid_override_pattern") or any(k not in ("attention", "full_attention") for k in kinds):
        return "hybrid layers (" + (", ".join(sorted(kinds)) or "hybrid_override_pattern") + ")"
    if any(k.startswith(("mamba", "ssm_")) for k in c):
        return "Mamba state"
    window = c.get("sliding_window")
    if window and c.get("use_sliding_window", True) is not False:
        return f"sliding-window attention ({window})"
    return None


def dtype_bytes(kv_cache_dtype: str, config: dict) -> float | None:
    """Bytes per KV element: the profile's kv_cache_dtype, or the model's own dtype for "auto"."""
    name = (kv_cache_dtype or "auto").lower()
    if name == "auto":
        c = text_config(config)
        name = str(c.get("torch_dtype") or c.get("dtype") or config.get("torch_dtype") or config.get("dtype") or "")
    return _DTYPE_BYTES.get(name.lower().removeprefix("torch."))


def kv_min(config: dict | None, max_model_len: int | None, kv_cache_dtype: str, tp: int, pp: int = 1) -> KvMin:
    """One sequence of `max_model_len` tokens of KV cache on one rank, for plain (full) attention:
    2 (K and V) x layers per stage x KV heads per rank x head_dim x bytes per element x tokens.
    vLLM splits KV heads across tensor parallel and replicates them below it (at least one per
    rank). MLA, hybrid (Mamba, linear attention) and sliding-window models are "unknown", said so,
    not guessed."""
    if not isinstance(config, dict) or not config:
        return KvMin(None, "no config.json")
    if not max_model_len:
        return KvMin(None, "max_model_len not set (vLLM takes the model's own)")
    c = text_config(config)
    why = _unknown_kind(c)
    if why:
        return KvMin(None, why)
    layers, heads = c.get("num_hidden_layers"), c.get("num_attention_heads")
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or (c.get("hidden_size") // heads if c.get("hidden_size") and heads else None)
    size = dtype_bytes(kv_cache_dtype, config)
    if not all(isinstance(v, int) and v > 0 for v in (layers, kv_heads, head_dim)) or not size:
        return KvMin(None, "config.json lacks num_hidden_layers, num_key_value_heads, head_dim or dtype")
    per_rank_layers = math.ceil(layers / max(1, pp))
    per_rank_heads = max(1, kv_heads // max(1, tp))
    n = int(2 * per_rank_layers * per_rank_heads * head_dim * size * max_model_len)
    return KvMin(
        n,
        f"2 x {per_rank_layers} layers x {per_rank_heads} KV heads x {head_dim} x {size:g} B x {max_model_len} tokens",
    )


def headroom(total: int, available: int, fraction: float, running: bool = False) -> tuple[int, int]:
    """(need, left) in bytes: what the engine takes when it starts (gpu_memory_utilization is a
    fraction of the whole unified pool, so of MemTotal; nothing more while it already runs), and
    what MemAvailable leaves after it. doctor's `mem.headroom`, the supervisor's wait before a
    restart and on-demand admission (issue 35)."""
    need = 0 if running else int(fraction * total)
    return need, available - need


@dataclass(frozen=True)
class Fit:
    """One rank of a profile on one node: does the engine's budget (utilization x MemTotal) hold
    the rank's weights and the minimum KV cache? `weights` None: the listing was not seen."""

    weights: int | None  # bytes, one rank's share
    kv: KvMin
    utilization: float
    mem_total: int | None
    mem_available: int | None = None
    floor: int = 6 * GiB  # seed 002's watchdog warns under 6 GB of MemAvailable

    @property
    def budget(self) -> int | None:
        return None if self.mem_total is None else int(self.utilization * self.mem_total)

    @property
    def need(self) -> int | None:
        return None if self.weights is None else self.weights + (self.kv.bytes or 0)

    @property
    def fits(self) -> bool | None:
        """False when it cannot fit, True when it fits, None when the weights or MemTotal are unknown.
        An unknown KV minimum counts as zero: the weights alone already decide a refusal."""
        if self.need is None or self.budget is None:
            return None
        return self.need <= self.budget

    def arithmetic(self) -> str:
        """The sum as printed: weights + KV minimum against utilization x MemTotal."""
        kv = gb(self.kv.bytes) if self.kv.bytes is not None else f"unknown ({self.kv.how})"
        left = f" = {gb(self.budget)}" if self.budget is not None else ""
        verdict = ""
        if self.fits is False:
            verdict = f": {gb(self.need - self.budget)} short"
        elif self.fits:
            verdict = f": fits, {gb(self.budget - self.need)} for more KV cache"
        return (
            f"weights per rank {gb(self.weights)} + KV for one max_model_len sequence {kv} "
            f"against gpu_memory_utilization {self.utilization:g} x MemTotal {gb(self.mem_total)}{left}{verdict}"
        )


def same_size(totals: dict[str, int]) -> bool:
    """Whether every node's MemTotal is of one memory size (within SIZE_TOLERANCE of the largest)."""
    known = [t for t in totals.values() if t]
    return not known or min(known) >= (1 - SIZE_TOLERANCE) * max(known)


@dataclass(frozen=True)
class Held:
    """A deployment's claim on one node's memory (issue 60): its engine's gpu_memory_utilization, a
    fraction of MemTotal (vLLM's flag, see the top of this file). None: not known (a container
    made before its label, of a profile not on this machine)."""

    deployment: str
    fraction: float | None
    # a service's reservation in bytes (issue 60 item 2: a profile of kind "service" states what it
    # holds in GB, not as a fraction of MemTotal); when set, it is the claim and `fraction` is unused
    reserved: int | None = None

    def bytes_of(self, total: int) -> int | None:
        if self.reserved is not None:
            return self.reserved
        return None if self.fraction is None else int(self.fraction * total)

    def said(self, total: int) -> str:
        """How its claim is reckoned, as a refusal says it."""
        if self.reserved is not None:
            return "its reservation"
        return f"gpu_memory_utilization {self.fraction or 0:g} x MemTotal {gb(total)}"


def admit(total: int, held: list[Held], want: Held, floor: int) -> str | None:
    """Several deployments on one node (issue 60): each engine takes its fraction of MemTotal when
    it starts (a service its reservation), so the node holds them all only when the claims together
    leave the floor. None when `want` is admitted beside `held`; else the refusal, naming who holds
    how much."""
    unknown = [h.deployment for h in held if h.bytes_of(total) is None]
    shares = [(h.deployment, h.bytes_of(total)) for h in held if h.bytes_of(total) is not None]
    need = want.bytes_of(total) or 0
    taken = sum(n for _, n in shares)
    who = ", ".join(f"{d} holds {gb(n)}" for d, n in shares)
    if unknown:
        who = ", ".join(x for x in (who, *(f"{d} holds an unknown share" for d in unknown)) if x)
        return f"{want.deployment} needs {gb(need)} of MemTotal {gb(total)}; {who}: its share cannot be counted"
    if taken + need + floor <= total:
        return None
    return (
        f"{want.deployment} needs {gb(need)} ({want.said(total)}); "
        f"{who}; with the floor of {gb(floor)} that is {gb(taken + need + floor)}: "
        f"{gb(taken + need + floor - total)} short"
    )
