"""The NCCL library an image will load and the NVIDIA driver its CUDA needs, read once per image ID
and remembered on the controller (issue 39).

NCCL: its version, and whether it is the pip wheel (`nvidia-nccl-cu*`, which pip-installed PyTorch
loads from its own site-packages) or the system `libnccl2` package (which NGC images load: they carry
no wheel). The known-bad list holds versions with known hangs, one entry per build where the fix
differs: 2.28.9 deadlocks a CUDA-graph replay across two Sparks (vllm#52504, which does not say which
build), and a pair that hung on the pip wheel's 2.28.9 did not on DGX OS's system build (vllm#41725).
A wheel is upgraded with pip; a system libnccl2 only by serving another image.

The driver: an image says what it needs in its environment, by one of two conventions.
- NGC images (nvcr.io/nvidia/*, and the Spark images built on them) carry `CUDA_DRIVER_VERSION`, the
  driver release their CUDA was built with, beside `CUDA_VERSION`. Their entrypoint compares the
  host driver's branch (the number before the first dot) with it and, where the host's is older,
  runs in forward compatibility ("NOTE: CUDA Forward Compatibility mode ENABLED"), else in minor
  version compatibility (same CUDA major, older minor), else prints "This container was built for
  NVIDIA Driver Release 590.48 or later, but version 580.159.03 was detected and compatibility mode
  is UNAVAILABLE" (NVIDIA's entrypoint.d driver check, e.g. as copied in gbxu/EnvDeployment
  system_check/52-gpu-driver-version-check.sh; on a Spark: eugr/spark-vllm-docker#266).
- The CUDA base images (nvidia/cuda, gitlab.com/nvidia/container-images/cuda) carry
  `NVIDIA_REQUIRE_CUDA="cuda>=13.0 brand=...,driver>=...,driver<... ..."`, which the container
  toolkit (libnvidia-container) checks before the container starts; only its `cuda>=` term is read.

What the field observes (issue 51) is judged by `judge_driver`: NVIDIA's 26.0x vLLM images are built
for the 595 branch and run on DGX OS 7.5's 580 (26.03 on 580.142 printed "CUDA Forward Compatibility
mode ENABLED. Using CUDA 13.2 driver version 595.45.04 with kernel driver version 580.142", a public
Spark setup note found by code search; a README of images built on 26.07 calls the 595.58 banner
"non-fatal" on 580.126.09). So an image of the node driver's CUDA major is not failed before it
starts: a WARN that only the image's own start-up makes it run well there (sparkcluster keeps an NGC
image's entrypoint for that: container/spec.keeps_entrypoint), and that code its newer toolchain left
as PTX cannot be JIT-compiled by the older driver without it (vllm-project/vllm#47397: nvcc 13.3
against 580.159.03, cudaErrorUnsupportedPtxVersion). An image of a newer CUDA major fails (minor
version compatibility holds within one major: NVIDIA's CUDA Compatibility guide).

What a container actually got is judged by `judge_boot`, once it has started (`up`'s probe stage), from
the lines its start-up printed and the agent's own environment: the forward-compatibility banner or
`_CUDA_COMPAT_STATUS=CUDA Driver OK` confirms; "compatibility mode is UNAVAILABLE" (an image built for
590.48 on 580.159.03: eugr/spark-vllm-docker#266) fails the start before `vllm serve`, naming the
driver the image was built for; "Minor Version Compatibility mode ENABLED" is the PTX JIT risk above.

Reading it needs a throwaway container of the image (`--network none`, no GPU), so only an image ID
not seen before costs one; an image ID is its content's digest, so what was read holds wherever the
image is loaded (as `ray_seen` reasons for Ray).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from sparkcluster.facts.image_memo import IMAGE_ID, ImageMemo
from sparkcluster.facts.probes import Probe

NAME = "image_nccl"
KEEP = 20
_MEMO = ImageMemo("nccl-in-images.json", KEEP)

# inside the image: each site-packages Python knows (else the usual places), the pip wheel's
# METADATA; the Debian package's version; the CUDA the image was built for and the driver it needs
INSIDE = (
    "d=$(python3 -c 'import sys; print(\" \".join(p for p in sys.path if p))' 2>/dev/null) || "
    "d=$(echo /usr/lib/python3*/dist-packages /usr/local/lib/python3*/dist-packages "
    "/usr/local/lib/python3*/site-packages); "
    'for p in $d; do for m in "$p"/nvidia_nccl_cu*.dist-info/METADATA; do '
    '[ -f "$m" ] && sed -n \'s/^Version: /pip /p\' "$m"; '
    "done; done; v=$(dpkg-query -W -f '${Version}' libnccl2 2>/dev/null) && echo \"system $v\"; "
    'echo "cuda ${CUDA_VERSION:-}"; echo "driver ${CUDA_DRIVER_VERSION:-}"; '
    'echo "require ${NVIDIA_REQUIRE_CUDA:-}"; echo "cudacache ${CUDA_CACHE_DISABLE:-}"; true'
)


@dataclass(frozen=True)
class ImageNccl:
    image_id: str
    version: str  # "2.28.9", "" when the image carries no NCCL
    build: str  # "pip" | "system" | ""
    cuda: str  # the image's CUDA_VERSION, "" when it does not say
    cuda_driver: str = ""  # the image's CUDA_DRIVER_VERSION (NGC's convention), "" when it does not say
    require_cuda: str = ""  # the image's NVIDIA_REQUIRE_CUDA (the CUDA base images' convention)
    cuda_cache_disable: str = ""  # the image's CUDA_CACHE_DISABLE, "" when it does not set it (`cuda_cache`)


def parse(text: str) -> ImageNccl | None:
    """`id <image ID>`, then `pip <version>` / `system <deb version>` / `cuda <version>` / `driver
    <version>` / `require <constraint>` / `cudacache <CUDA_CACHE_DISABLE>` lines. The pip wheel wins: a
    pip-installed PyTorch loads its own wheel's library, not the system one."""
    kv: dict[str, str] = {}
    for line in text.splitlines():
        k, _, v = line.strip().partition(" ")
        if k in ("id", "pip", "system", "cuda", "driver", "require", "cudacache") and k not in kv:
            kv[k] = v.strip()
    if not IMAGE_ID.fullmatch(kv.get("id", "")):
        return None
    if kv.get("pip"):
        version, build = kv["pip"], "pip"
    elif kv.get("system"):
        version, build = kv["system"].split("-")[0], "system"  # 2.28.9-1+cuda13.0 -> 2.28.9
    else:
        version, build = "", ""
    return ImageNccl(
        kv["id"],
        version,
        build,
        kv.get("cuda", ""),
        kv.get("driver", ""),
        " ".join(kv.get("require", "").split()),
        kv.get("cudacache", ""),
    )


# What CUDA_CACHE_DISABLE means (CUDA Programming Guide, "CUDA Environment Variables",
# https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html): 1 stops
# the driver adding to or reading its just-in-time compilation cache, 0 (its default) keeps it. That cache
# is where config/compile_cache points CUDA_CACHE_PATH, the key's `cuda` folder: the PTX GB10 JIT-compiles
# at a start (the sm_80 PTX of some kernels, vllm-project/vllm#47397) is kept there for the next one.
CUDA_CACHE_SOURCE = "CUDA Programming Guide, CUDA Environment Variables"


def cuda_cache(found: ImageNccl, forwarded: str | None = None) -> tuple[bool, str]:
    """Whether the CUDA driver's JIT cache is on in the serving container, and what that means for the
    compile cache. `forwarded` is the profile's CUDA_CACHE_DISABLE, which replaces the image's."""
    value, who = (forwarded, "the profile forwards") if forwarded is not None else (found.cuda_cache_disable, "")
    said = (
        f"{who or 'the image sets'} CUDA_CACHE_DISABLE={value}"
        if value
        else "the image leaves CUDA_CACHE_DISABLE unset"
    )
    if value.strip() in ("", "0"):
        return True, (
            f"{said}: the CUDA driver keeps the PTX it JIT-compiles in CUDA_CACHE_PATH (the compile cache's "
            "cuda folder), so a restart does not compile it again"
        )
    return False, (
        f"{said}: the CUDA driver neither adds to nor reads its JIT cache ({CUDA_CACHE_SOURCE}), so the compile "
        "cache's cuda folder (CUDA_CACHE_PATH) stays empty and every start JIT-compiles the PTX again "
        "(GB10 runs some kernels from sm_80 PTX: vllm-project/vllm#47397)"
    )


# the lowest Linux driver of each CUDA release, from the CUDA Toolkit release notes' table "CUDA
# Toolkit and Corresponding Driver Versions" (the GA's driver: a driver reports the CUDA release it
# supports as major.minor, which is what `cuda>=` compares); a newer release not listed is not judged
CUDA_MIN_DRIVER = {(12, 8): "570.26", (12, 9): "575.51.03", (13, 0): "580.65.06", (13, 1): "590.44.01"}
_REQUIRE = re.compile(r"(?:^|\s)cuda>=\s*(\d+)\.(\d+)")


def _version(v: str) -> tuple[int, ...]:
    """`580.95.05` -> (580, 95, 5); () when it is not a dotted version."""
    v = v.strip()
    return tuple(int(x) for x in v.split(".")) if re.fullmatch(r"\d+(\.\d+)*", v) else ()


@dataclass(frozen=True)
class DriverNeed:
    """The lowest driver an image's CUDA starts on, as the image says it."""

    said: str  # what the image says: "CUDA_DRIVER_VERSION=590.48.01", "NVIDIA_REQUIRE_CUDA cuda>=13.1"
    driver: str  # the lowest driver: "590" (a branch) or "590.44.01"; "" when not known
    branch: bool  # compared by branch only (NGC's entrypoint compares the number before the first dot)
    cuda: tuple[int, ...] = ()  # the CUDA release a `cuda>=` term requires, () for CUDA_DRIVER_VERSION

    def met_by(self, driver: str) -> bool | None:
        """Whether a node's driver (as nvidia-smi prints it) meets it; None when either is unknown."""
        have, need = _version(driver), _version(self.driver)
        if not have or not need:
            return None
        return have[:1] >= need[:1] if self.branch else have >= need


def driver_needs(found: ImageNccl) -> list[DriverNeed]:
    """What the image says its CUDA needs of the driver: NGC's CUDA_DRIVER_VERSION (by branch) and the
    `cuda>=` term of NVIDIA_REQUIRE_CUDA (through CUDA_MIN_DRIVER); [] when it says neither."""
    out = []
    if _version(found.cuda_driver):
        out.append(DriverNeed(f"CUDA_DRIVER_VERSION={found.cuda_driver}", found.cuda_driver.split(".")[0], True))
    m = _REQUIRE.search(found.require_cuda)
    cuda = (int(m.group(1)), int(m.group(2))) if m else None
    # an older CUDA than the table's (NGC images say `cuda>=9.0`) is supported by every driver that
    # drives a GB10 (580 and later): no requirement worth judging
    if cuda and cuda >= min(CUDA_MIN_DRIVER):
        out.append(
            DriverNeed(f"NVIDIA_REQUIRE_CUDA cuda>={cuda[0]}.{cuda[1]}", CUDA_MIN_DRIVER.get(cuda, ""), False, cuda)
        )
    return out


# the lowest driver branch of each CUDA major, under which an application built with any minor of
# that major runs (minor version compatibility): NVIDIA's CUDA Compatibility guide, "Minor Version
# Compatibility", Table 1 ("CUDA 13.x >= 580", "CUDA 12.x >= 525", "CUDA 11.x >= 450")
CUDA_MAJOR_MIN_BRANCH = {11: 450, 12: 525, 13: 580}
# what an NGC entrypoint prints when it gives up, and when it runs in compatibility (module docstring)
REFUSED = "compatibility mode is UNAVAILABLE"
ENABLED = "Compatibility mode ENABLED"
PTX_JIT = "vllm-project/vllm#47397"


def driver_cuda(driver: str) -> tuple[int, int] | None:
    """The newest CUDA release a driver supports natively, from CUDA_MIN_DRIVER (580.142 -> (13, 0));
    None when the driver is below the table or not a version."""
    have = _version(driver)
    if not have:
        return None
    ok = [c for c, d in CUDA_MIN_DRIVER.items() if have >= _version(d)]
    return max(ok) if ok else None


def driver_cuda_major(driver: str) -> int | None:
    """The newest CUDA major a driver runs under minor version compatibility (580.142 -> 13, 570.x -> 12)."""
    have = _version(driver)
    if not have:
        return None
    ok = [m for m, b in CUDA_MAJOR_MIN_BRANCH.items() if have[0] >= b]
    return max(ok) if ok else None


def image_cuda_major(found: ImageNccl) -> int | None:
    """The CUDA major the image was built with: its CUDA_VERSION, else the `cuda>=` term it requires."""
    v = _version(found.cuda)
    if v:
        return v[0]
    m = _REQUIRE.search(found.require_cuda)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class DriverVerdict:
    """How an image's CUDA fares on one node's driver: `status` ok | warn | fail | skip, `case`
    met | compat | refused | newer-major | unknown, the detail (naming its source) and a fix that exists."""

    status: str
    case: str
    detail: str
    fix: str = ""


def judge_driver(found: ImageNccl, driver: str, read_on: str = "") -> DriverVerdict:
    """Pure: the image's driver need against a node's driver (as nvidia-smi prints it), as the field
    observes it (module docstring), before any container of it runs (what one got: `judge_boot`);
    `read_on` is appended to what the image said (" (read on spark-head)")."""
    needs = driver_needs(found)
    if not needs:
        return DriverVerdict(
            "skip",
            "unknown",
            f"the image states no driver requirement (no CUDA_DRIVER_VERSION, no NVIDIA_REQUIRE_CUDA){read_on}",
        )
    if not _version(driver):
        return DriverVerdict("skip", "unknown", "nvidia-smi reported no driver here (gpu.gb10 says why)")
    said = ", ".join(x.said for x in needs) + read_on
    node_major, img_major = driver_cuda_major(driver), image_cuda_major(found)
    node_cuda = driver_cuda(driver)
    serve_own = (
        f"serve an image built for CUDA {node_major}.x (NGC's vLLM 26.0x images are CUDA 13.2 and run on the "
        "580 driver in compatibility mode)"
        if node_major
        else "serve an image built for this driver's CUDA"
    )
    if img_major and node_major and img_major > node_major:
        branch = CUDA_MAJOR_MIN_BRANCH.get(img_major)
        driver_fix = (
            f"update every node's driver to the {branch} branch or later (DGX OS 7.5 ships 580: sudo apt update "
            "&& sudo apt full-upgrade) and reboot, or "
            if branch
            else ""
        )
        return DriverVerdict(
            "fail",
            "newer-major",
            f"driver {driver} runs CUDA {node_major}.x at most, the image is CUDA {img_major} ({said}): minor "
            "version compatibility holds within one CUDA major only (NVIDIA CUDA Compatibility guide), so its "
            "CUDA does not start here",
            driver_fix + serve_own,
        )
    judged = []
    for x in needs:
        met = x.met_by(driver)
        if met is None and x.cuda and node_cuda:  # a CUDA release newer than the table: compare releases
            met = node_cuda >= x.cuda
        judged.append((x, met))
    unmet = [x for x, met in judged if met is False]
    if not unmet:
        if any(met for _, met in judged):
            return DriverVerdict("ok", "met", f"driver {driver} meets {said}")
        return DriverVerdict(
            "skip", "unknown", f"{needs[0].said}: its lowest driver is not in sparkcluster's table (CUDA release notes)"
        )
    x = unmet[0]
    need = f"driver branch {x.driver} or later" if x.branch else f"CUDA {x.cuda[0]}.{x.cuda[1]}'s driver"
    if img_major is None or node_major is None:
        return DriverVerdict(
            "warn",
            "unknown",
            f"driver {driver} is older than the image was built for ({said}: {need}) and its CUDA major is not "
            "known, so whether compatibility mode applies cannot be told",
            serve_own,
        )
    return DriverVerdict(
        "warn",
        "compat",
        f"driver {driver} is older than the image was built for ({said}: {need}); the same CUDA major "
        f"({img_major}), so it starts here: sparkcluster keeps the image's own start-up, which switches to the "
        'CUDA driver the image carries where it can (NGC 26.03 on 580.142: "CUDA Forward Compatibility mode '
        'ENABLED"); without it only minor version compatibility (CUDA '
        f"{node_major}.x on {CUDA_MAJOR_MIN_BRANCH[node_major]} and later: NVIDIA CUDA Compatibility guide), where "
        f"code its newer toolchain left as PTX fails to JIT (cudaErrorUnsupportedPtxVersion: {PTX_JIT}). `up` "
        "reads what each container's start-up printed and fails an UNAVAILABLE before serving",
        "nothing stops it starting; " + serve_own + " to run natively",
    )


# the lines an NGC image's start-up prints (its entrypoint.d driver check, module docstring): the
# forward-compatibility note (tests/captured/ngc-vllm-26.03-spark-banner.txt), the minor version
# compatibility warning (the public copy of 52-gpu-driver-version-check.sh that shared notes cite), the
# refusal (tests/captured/eugr-266-refused-banner.txt: wrapped over two lines); and the value NGC's probe
# exports when the image's own driver runs (gyliu513/langX101 llm-d/llm-d-spark-full-demo/README.md@07d311ff)
FORWARD = "CUDA Forward Compatibility mode ENABLED"
MINOR = "CUDA Minor Version Compatibility mode ENABLED"
COMPAT_OK = "CUDA Driver OK"
_BUILT_FOR = re.compile(r"built for NVIDIA Driver Release (\d+(?:\.\d+)*) or later")
# the node agent's first line (node/agent.py): what its own environment got from the start-up
AGENT_COMPAT = re.compile(r"^sparkcluster agent: _CUDA_COMPAT_STATUS=(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Boot:
    """What a container's start-up said, read from its output since it started."""

    banner: str  # the start-up's driver lines, whitespace folded ("" when it printed none)
    compat: str | None  # _CUDA_COMPAT_STATUS in the agent's environment; None when the agent has not said

    @property
    def built_for(self) -> str:
        m = _BUILT_FOR.search(self.banner)
        return m.group(1) if m else ""


def read_boot(output: str) -> Boot:
    """The start-up's driver lines and the agent's compat line, from a container's output (`docker logs`
    since its start). The last agent line wins (one boot's output holds one)."""
    lines = [ln.strip() for ln in output.splitlines()]
    keep, cont = [], False
    for ln in lines:
        if "NVIDIA Driver Release" in ln or "Compatibility mode" in ln or (cont and ln.startswith("version ")):
            keep.append(ln)
            cont = ln.endswith("but")  # the refusal wraps after "but" (eugr#266)
        else:
            cont = False
    said = AGENT_COMPAT.findall(output)
    return Boot(" ".join(" ".join(keep).split()), said[-1].strip() if said else None)


def judge_boot(boot: Boot, env: dict[str, str], driver: str, image_entrypoint: bool = True) -> DriverVerdict:
    """Pure: what one container got from its image's start-up on a node at `driver`, judged before
    `vllm serve` starts. `env` is the container's configured environment (the image's CUDA_VERSION and
    CUDA_DRIVER_VERSION); `image_entrypoint` False for an image whose entrypoint sparkcluster empties
    (vllm/vllm-openai: no NGC start-up). Minor version compatibility is a WARN, not a FAIL: whether a
    model needs a JIT the old driver refuses depends on its kernels (vllm-project/vllm#47397: FA2's
    plain bf16 models fail, NVFP4 models routed to FlashInfer do not), and the failed serve names the
    PTX cause when it happens (node/engine_failure)."""
    built, ours = env.get("CUDA_DRIVER_VERSION", ""), _version(driver)
    older = bool(_version(built)) and bool(ours) and ours[0] < _version(built)[0]
    if REFUSED in boot.banner:
        need = boot.built_for or ".".join(built.split(".")[:2])
        branch = need.split(".")[0]
        return DriverVerdict(
            "fail",
            "refused",
            f"the image's start-up printed \"This container was built for NVIDIA Driver Release {need} or later, "
            f"but version {driver} was detected and {REFUSED}\": its own CUDA driver does not run on this node's "
            f"driver (seen on a Spark: eugr/spark-vllm-docker#266), and without it vLLM's first JIT fails "
            f"({PTX_JIT})",
            f"serve an image that runs on this driver: one whose start-up prints Forward Compatibility ENABLED on "
            f"it, or one built for CUDA {driver_cuda_major(driver) or '13'}.x (FROM nvidia/cuda); this one runs "
            f"natively only on a driver of the {branch} branch or later",
        )
    if FORWARD in boot.banner or boot.compat == COMPAT_OK:
        how = f"{FORWARD}" if FORWARD in boot.banner else f"_CUDA_COMPAT_STATUS={COMPAT_OK}"
        return DriverVerdict("ok", "forward", f"the image's start-up ran in forward compatibility ({how})")
    if MINOR in boot.banner:
        return DriverVerdict(
            "warn",
            "minor",
            f'the image\'s start-up printed "{MINOR}" on driver {driver} (built for {built or "a newer driver"}): '
            "its newer CUDA runs on this driver's, so a kernel its toolchain left as PTX fails to JIT "
            f"(cudaErrorUnsupportedPtxVersion: {PTX_JIT})",
            "should the serve fail with that error, serve an image built for this driver's CUDA",
        )
    if not older:
        return DriverVerdict("ok", "native", f"driver {driver} is the image's own or newer: no compatibility needed")
    if not image_entrypoint:
        return DriverVerdict(
            "warn",
            "bypassed",
            f"driver {driver} is older than the image was built for (CUDA_DRIVER_VERSION={built}), and its "
            "entrypoint is not NGC's, so nothing switches it to a newer CUDA driver: a kernel its toolchain left "
            f"as PTX fails to JIT ({PTX_JIT})",
            "serve an image built for this driver's CUDA",
        )
    return DriverVerdict(
        "warn",
        "silent",
        f"driver {driver} is older than the image was built for (CUDA_DRIVER_VERSION={built}), yet its start-up "
        "printed no compatibility banner and the agent's environment has no _CUDA_COMPAT_STATUS: its processes "
        f"run on the host's CUDA driver, where a kernel its toolchain left as PTX fails to JIT ({PTX_JIT})",
        "check the image's entrypoint (docker image inspect --format '{{.Config.Entrypoint}}' IMAGE): NGC's is "
        "/opt/nvidia/nvidia_entrypoint.sh",
    )


def probe(image: str, seen: dict[str, str] | None = None, base: str | None = None) -> Probe:
    """The image's NCCL and driver need on this node: what the controller remembers for its ID, else
    read in a throwaway container. Where the node lacks the image (the cluster image before `up`
    built it) the profile's `base` is read instead: the cluster image is the base with Ray added,
    which changes neither, so an image built for a newer driver is caught before it is built and
    sent. Exits 3 when the node has neither."""
    refs = " ".join(shlex.quote(x) for x in dict.fromkeys((image, base)) if x)
    known = "".join(f"{shlex.quote(i)}) printf '%s\\n' {shlex.quote(t)}; exit 0;; " for i, t in (seen or {}).items())
    return Probe(
        NAME,
        f"for i in {refs}; do "
        "id=$(docker image inspect --format '{{.Id}}' \"$i\" 2>/dev/null) && break; id=; done; "
        '[ -n "$id" ] || exit 3; echo "id $id"; '
        + (f'case "$id" in {known}esac; ' if known else "")
        + f'docker run --rm --network none --entrypoint sh "$i" -c {shlex.quote(INSIDE)}',
        parse,
    )


# --- what the controller remembers ---------------------------------------------------------------


def path() -> Path:
    return _MEMO.path()


def load() -> dict[str, str]:
    """image ID -> the lines read in it (without the id line); {} when absent or unreadable. What was
    remembered before the driver requirement or CUDA_CACHE_DISABLE was read (no `driver` or `cudacache`
    line) is read again."""
    return {
        i: t for i, t in _MEMO.load().items() if {"driver", "cudacache"} <= {x.split(" ")[0] for x in t.splitlines()}
    }


def lines(found: ImageNccl) -> str:
    """What `probe` prints from the cache for this image (after its id line)."""
    out = [f"{found.build} {found.version}"] if found.build else []
    return "\n".join(
        [
            *out,
            f"cuda {found.cuda}",
            f"driver {found.cuda_driver}",
            f"require {found.require_cuda}",
            f"cudacache {found.cuda_cache_disable}",
        ]
    )


def remember(found: list[ImageNccl]) -> None:
    """Adds what was read, newest last, keeping KEEP; best effort (a failed write only costs a re-read)."""
    _MEMO.remember({f.image_id: lines(f) for f in found})
