"""The compile and autotune caches a node keeps for its serving containers, so that a restart (the
supervisor's, an upgrade's canary, a worker's reboot, `down` then `up`) loads what the last start
compiled instead of compiling it again: torch.compile/AOT, inductor, Triton, FlashInfer JIT and
autotune. On GB10 that compile is minutes per start.

One folder per node and SSH user, beside the HF cache (`~/.cache/sparkcluster/compile`, the
inventory's `compile_cache`), with one subfolder per key. The key is what decides whether compiled
code may be reused:

- the image: its reference and its ID (vLLM, torch, Triton, FlashInfer and CUDA versions all come
  with it). Profiles pin mutable tags (`latest`, `nightly`), so the tag alone would hand a new image
  the old one's kernels; the ID is its content's digest. Where the head lacks the image, the ID is
  known only once the image stage has built it: the plan (and `--dry-run`) shows the key as pending
  (`PENDING`), and the containers stage computes it from the built image before it makes the folder;
- the model and its revision;
- the `vllm serve` arguments except those that cannot change compiled code (where it listens, what
  it calls the model, logging, tool and reasoning parsers, the tokenizer); everything else counts,
  even where vLLM's hash would ignore it, because a needless miss costs one compile and a wrong
  hit costs a wrong kernel or a hang (cache-key drift: ai-dynamo/dynamo#10695);
- the profile's forwarded variables that reach the compilers (VLLM_*, TORCH*, TRITON_*,
  FLASHINFER_*, PYTORCH_*, CUDA_*), less vLLM's own location and logging ones (vLLM 0.32 ignores
  them in its hash too: `vllm/envs.py`, the list beside VLLM_CACHE_ROOT).

Only the key's own folder is mounted into the container: a cache of another image or other flags
is never seen by the engine, let alone used. Inside it each tool gets its folder through its own
variable (`ENV`). vLLM 0.32 moves inductor's itself, into VLLM_CACHE_ROOT's and so inside the mount
too: where it AOT-compiles (VLLM_USE_AOT_COMPILE, on by default with torch >= 2.10, every platform)
to `torch_compile_cache/torch_aot_compile/<hash>/inductor_cache` beside the `rank_i_j/model`
artifact (`vllm/compilation/decorators.py:576-580`), and where its own backend compiles (GPUs) to
`torch_compile_cache/<hash>/inductor_cache` (`vllm/compilation/compiler_interface.py:467`). Only
the CPU build with AOT off leaves inductor in the `inductor` folder given here.

vLLM 0.32's CPU build cannot load its own AOT artifact: it compiles with plain inductor
(DYNAMO_TRACE_ONCE, `vllm/platforms/cpu.py:364-367`), whose artifact torch reloads wrapping a
plain function (`torch/_dynamo/aot_compile_types.py:218`), and vLLM's loader then calls
`finalize_loading` on it (`decorators.py:315`), which only vLLM's own backend's artifact has
(`vllm/compilation/caching.py:382`). Every restart logs "Compiling model again due to a load
failure ... 'function' object has no attribute 'finalize_loading'" and writes the artifact again.
The testbed-compile profile forwards VLLM_USE_AOT_COMPILE=0: then inductor's own FX graph cache
(in `inductor`) serves a restart every kernel the first start compiled.

GB10's other JIT caches are kept beside the rest, each where its tool looks: CUDA's PTX JIT cache
(`CUDA_CACHE_PATH`: GB10 JIT-compiles the sm_80 PTX of some kernels at every start, vllm#47397),
TVM-FFI's built modules (`TVM_FFI_CACHE_DIR`, which FlashInfer's CuTe-DSL kernels load through), torch
C++ extensions (`TORCH_EXTENSIONS_DIR`), the CuTe DSL's own file cache (`CUTE_DSL_CACHE_DIR`; b12x's
NVFP4 MoE kernels took 15-40 s per shape per start before flashinfer#4331 put them on disk,
flashinfer#4317) and b12x's compiled kernels (`B12X_COMPILE_CACHE_DIR`, `~/.cache/b12x/compile`
otherwise: local-inference-lab/b12x; field launchers keep `~/.cache/b12x`, docs/field-notes.md).
b12x's one torch-extension build stays in the container (`B12X_TRELLIS_BUILD_DIR` at its default), so
it is built again in each new container: b12x takes a build folder only where every ancestor is root's
or the engine user's and the folder itself is the engine user's (root in the container) with mode 0700
(b12x's trellis JIT binding, `_validate_secure_build_dir`). Kept in the key's folder it would be refused:
the SSH user's folders are above it, and the folder itself is the SSH user's, since CacheOwner
(node/compile_reading) hands everything in the key's folder to that user so that it can evict it. Kept
root's 0700 (mounted at the default path) it would stop that: the SSH user could neither list nor remove
it, and nothing on the host runs as root to do it instead (no sudo during `up`).

A key's first start is seeded from the caches the image ships (NGC vLLM 26.10's release notes,
docs.nvidia.com/deeplearning/frameworks/vllm-release-notes/rel-26-10.html: "prebuilt Qwen3.8 kernel,
compilation and autotuning caches" for some configurations on DGX Spark): before the engine starts, the
node agent copies what the image holds at each tool's default place (`SEEDS`) into an empty key
folder, once (`SEEDED` says what it copied). A profile can instead say `compile_cache = "image"`:
nothing is mounted and no variable is set, so the engine uses the image's caches in place, wherever
the image keeps them; what it compiles then dies with the container.

The folders' total is capped per node (`compile_cache_max_gb`); before a start the oldest keys
(by their last start) go first, never the key being started, and never a key a running container
uses: each node agent holds a shared lock on its key's `IN_USE` file for its whole life, and eviction
(deployment/compile_caches) skips a key whose lock it cannot take.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from sparkcluster.config.flags import supervised_argv

if TYPE_CHECKING:  # pragma: no cover
    from sparkcluster.config.inventory import Inventory
    from sparkcluster.config.profile import Profile

KEY_LEN = 16
KEY_RE = re.compile(rf"^[0-9a-f]{{{KEY_LEN}}}$")
STAMP = ".last-start"  # touched by `up` before each start, as the SSH user: eviction's age
ABOUT = "key.json"  # what the key stands for, for `weights status` and people
IN_USE = ".in-use"  # flock'd (shared) by each node agent whose container mounts the key
SEEDED = ".seeded"  # written by the node agent once it has seeded the key from the image
# where the key goes while the image's ID is not known (the head lacks the image: the image stage
# builds it); never a folder anyone makes
PENDING = "KEY-PENDING-IMAGE-ID"

# `vllm serve` flags that cannot change compiled code, with whether they take a value
RUNTIME_ONLY_FLAGS: dict[str, bool] = {
    "--host": True,
    "--port": True,
    "--served-model-name": True,
    "--tokenizer": True,
    "--reasoning-parser": True,
    "--reasoning-parser-plugin": True,
    "--tool-call-parser": True,
    "--enable-auto-tool-choice": False,
    "--uvicorn-log-level": True,
    "--disable-log-requests": False,
    "--enable-log-requests": False,
    "--disable-log-stats": False,
    "--api-key": True,
}
COMPILER_ENV_PREFIXES = ("VLLM_", "TORCH", "TRITON_", "FLASHINFER_", "PYTORCH_", "CUDA_")
LOCATION_OR_LOG_ENV = frozenset(
    {
        "VLLM_CACHE_ROOT",
        "VLLM_CONFIG_ROOT",
        "VLLM_HOST_IP",
        "VLLM_PORT",
        "VLLM_API_KEY",
        "VLLM_LOGGING_LEVEL",
        "VLLM_LOGGING_PREFIX",
        "VLLM_LOGGING_STREAM",
        "VLLM_LOGGING_CONFIG_PATH",
        "VLLM_LOGGING_COLOR",
        "VLLM_NO_USAGE_STATS",
        "VLLM_DO_NOT_TRACK",
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "FLASHINFER_WORKSPACE_BASE",
        "CUDA_CACHE_PATH",
        "TVM_FFI_CACHE_DIR",
        "TORCH_EXTENSIONS_DIR",
        "CUTE_DSL_CACHE_DIR",
        "B12X_COMPILE_CACHE_DIR",
        "B12X_TRELLIS_BUILD_DIR",
    }
)

# variable -> subfolder of the key's folder (inside the container at the same path as on the host)
ENV: dict[str, str] = {
    "VLLM_CACHE_ROOT": "vllm",  # torch_compile_cache/<hash>/rank_i_j; with AOT, its inductor_cache too
    "TORCHINDUCTOR_CACHE_DIR": "inductor",  # the CPU build's inductor with AOT off (vLLM resets it otherwise)
    "TRITON_CACHE_DIR": "triton",  # ~/.triton/cache otherwise
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",  # its JIT modules go to <base>/.cache/flashinfer
    "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "flashinfer-autotune",
    # the CUDA driver's PTX JIT cache (CUDA C++ Programming Guide, "CUDA Environment Variables";
    # ~/.nv/ComputeCache otherwise): GB10 runs the sm_80 PTX of some kernels (vllm#47397)
    "CUDA_CACHE_PATH": "cuda",
    # TVM-FFI's built modules (apache/tvm-ffi python/tvm_ffi/cpp/extension.py; ~/.cache/tvm-ffi otherwise)
    "TVM_FFI_CACHE_DIR": "tvm-ffi",
    # torch C++/CUDA extensions built at run time (torch/utils/cpp_extension.py; ~/.cache/torch_extensions)
    "TORCH_EXTENSIONS_DIR": "torch-extensions",
    # the CuTe DSL's file cache (nvidia-cutlass-dsl; <tmp>/<user>/cutlass_python_cache otherwise), the
    # b12x NVFP4 MoE kernels' 15-40 s per shape (flashinfer#4317; on disk since flashinfer#4331)
    "CUTE_DSL_CACHE_DIR": "cute-dsl",
    # b12x's compiled CuTe kernels (b12x/_lib/compiler.py _cute_compile_cache_dir: ~/.cache/b12x/compile
    # otherwise)
    "B12X_COMPILE_CACHE_DIR": "b12x",
}

# variables set to a path inside the container, never the key's folder. b12x builds its trellis
# extension under B12X_TRELLIS_BUILD_DIR, else beside B12X_COMPILE_CACHE_DIR, and refuses a folder
# whose ancestors are neither root's nor the process's user's (b12x's trellis JIT binding,
# _validate_secure_build_dir): the SSH user's home is neither, so it keeps its default for root.
FIXED_ENV: dict[str, str] = {"B12X_TRELLIS_BUILD_DIR": "/root/.cache/b12x/trellis_build"}


# container path -> subfolder of the key's folder, for what a compiler keeps where no variable moves
# it. Inductor precompiles the headers of its CPU kernels into its *default* folder whatever
# TORCHINDUCTOR_CACHE_DIR says (`_HEADER_DIR = default_cache_dir()/precompiled_headers`, global by
# design: torch/_inductor/codecache.py), that is /tmp/torchinductor_<user>, and every start looks for
# the header before it looks for a kernel's cached library. A new container's /tmp lacked it, so a
# start after `down`/`up` ran g++ on the header again, 10 s of its 15 s compile figure on the testbed
# where a supervisor restart in the same container took 5. The engine runs as the
# image's user, root in NGC's image (and the testbed's stand-in).
DEFAULT_DIRS: dict[str, str] = {"/tmp/torchinductor_root": "inductor-default"}

# container path where the image's user (root) keeps a tool's cache when its variable is unset ->
# the path inside the key's folder where that tool looks once ENV points it there. A key's first
# start copies what the image ships there (node/compile_reading.seed). The DEFAULT_DIRS folders are
# mounted over the image's own, so the image's copy there cannot be read and is not seeded.
SEEDS: dict[str, str] = {
    "/root/.cache/vllm": "vllm",  # vllm/envs.py: VLLM_CACHE_ROOT defaults to XDG_CACHE_HOME/vllm
    "/root/.triton/cache": "triton",  # triton/runtime/cache.py default_cache_dir
    # <FLASHINFER_WORKSPACE_BASE or home>/.cache/flashinfer/<version>/<archs>/cached_ops: its nvcc and
    # CuTe-DSL modules (flashinfer docs/design_docs/cute_dsl_kernel_cache.md)
    "/root/.cache/flashinfer": "flashinfer/.cache/flashinfer",
    "/root/.nv/ComputeCache": "cuda",
    "/root/.cache/tvm-ffi": "tvm-ffi",
    "/root/.cache/torch_extensions": "torch-extensions",
    "/tmp/root/cutlass_python_cache": "cute-dsl",
    "/root/.cache/b12x/compile": "b12x",
}


def subfolders() -> list[str]:
    """Every folder made in a key's folder before a start (as the SSH user, so Docker does not make
    them root's)."""
    return sorted({*ENV.values(), *DEFAULT_DIRS.values()})


def binds(folder: str) -> dict[str, str]:
    """Host path -> container path: the key's folder at its own path (where ENV points), and each
    DEFAULT_DIRS subfolder where its compiler looks."""
    return {folder: folder, **{str(PurePosixPath(folder) / sub): path for path, sub in DEFAULT_DIRS.items()}}


def compiled_argv(argv: list[str]) -> list[str]:
    """`argv` without the flags (and their values) that cannot change compiled code."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in RUNTIME_ONLY_FLAGS:
            skip = RUNTIME_ONLY_FLAGS[name] and "=" not in a
            continue
        out.append(a)
    return out


def compiler_env(forward: dict[str, str]) -> dict[str, str]:
    return {
        k: v for k, v in sorted(forward.items()) if k.startswith(COMPILER_ENV_PREFIXES) and k not in LOCATION_OR_LOG_ENV
    }


def known_id(image_id: str | None) -> str | None:
    """The image's ID where it is one (a content digest), else None: not known yet."""
    return image_id if image_id and image_id.startswith("sha256:") else None


def factors(prof: Profile, image: str, image_id: str | None) -> dict:
    """What the key is the hash of (also written beside the cache as ABOUT)."""
    argv = supervised_argv(prof)
    return {
        "image": image,
        "image_id": known_id(image_id),
        "model": prof.model,
        "revision": prof.revision or "main",
        "argv": compiled_argv(argv[3:]),  # past `vllm serve MODEL`
        "env": compiler_env(prof.forwarded_env()),
    }


def key(prof: Profile, image: str, image_id: str | None) -> str | None:
    """The key of this profile on this image, or None while the image's ID is not known."""
    if known_id(image_id) is None:
        return None
    doc = json.dumps(factors(prof, image, image_id), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()[:KEY_LEN]


def in_place(prof: Profile) -> bool:
    """The profile uses the image's own caches in place (`compile_cache = "image"`): nothing mounted."""
    return prof.compile_cache == "image"


def folder(root: str, prof: Profile, image: str, image_id: str | None) -> str:
    """The key's folder, or where it will be (`root/PENDING`) while the image's ID is not known."""
    k = key(prof, image, image_id)
    return key_dir(root, k) if k else str(PurePosixPath(root) / PENDING)


def pending(path: str) -> bool:
    return PurePosixPath(path).name == PENDING


def key_dir(root: str, k: str) -> str:
    if not KEY_RE.match(k):
        raise ValueError(f"not a compile-cache key: {k!r}")
    return str(PurePosixPath(root) / k)


def env(folder: str) -> dict[str, str]:
    """The variables that send each compiler's cache into the key's folder (and FIXED_ENV's)."""
    return {**{var: str(PurePosixPath(folder) / sub) for var, sub in ENV.items()}, **FIXED_ENV}


def max_bytes(inv: Inventory) -> int:
    return int(inv.cluster.compile_cache_max_gb * 2**30)
