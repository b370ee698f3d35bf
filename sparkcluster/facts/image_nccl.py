"""The NCCL library an image will load, read once per image ID and remembered on the controller
(issue 39): its version, and whether it is the pip wheel (`nvidia-nccl-cu*`, which pip-installed
PyTorch loads from its own site-packages) or the system `libnccl2` package. The known-bad list holds
builds with known hangs (the pip 2.28.9 build hangs TP=2 where DGX OS's 2.28.9 does not: vllm#41725).

Reading it needs a throwaway container of the image (`--network none`, no GPU), so only an image ID
not seen before costs one; an image ID is its content's digest, so what was read holds wherever the
image is loaded (as `ray_seen` reasons for Ray).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from sparkcluster.facts.image_memo import IMAGE_ID, ImageMemo
from sparkcluster.facts.probes import Probe

NAME = "image_nccl"
KEEP = 20
_MEMO = ImageMemo("nccl-in-images.json", KEEP)

# inside the image: each site-packages Python knows (else the usual places), the pip wheel's
# METADATA; the Debian package's version; the CUDA the image was built for
INSIDE = (
    "d=$(python3 -c 'import sys; print(\" \".join(p for p in sys.path if p))' 2>/dev/null) || "
    "d=$(echo /usr/lib/python3*/dist-packages /usr/local/lib/python3*/dist-packages "
    "/usr/local/lib/python3*/site-packages); "
    'for p in $d; do for m in "$p"/nvidia_nccl_cu*.dist-info/METADATA; do '
    '[ -f "$m" ] && sed -n \'s/^Version: /pip /p\' "$m"; '
    "done; done; v=$(dpkg-query -W -f '${Version}' libnccl2 2>/dev/null) && echo \"system $v\"; "
    'echo "cuda ${CUDA_VERSION:-}"; true'
)


@dataclass(frozen=True)
class ImageNccl:
    image_id: str
    version: str  # "2.28.9", "" when the image carries no NCCL
    build: str  # "pip" | "system" | ""
    cuda: str  # the image's CUDA_VERSION, "" when it does not say


def parse(text: str) -> ImageNccl | None:
    """`id <image ID>`, then `pip <version>` / `system <deb version>` / `cuda <version>` lines. The pip
    wheel wins: a pip-installed PyTorch loads its own wheel's library, not the system one."""
    kv: dict[str, str] = {}
    for line in text.splitlines():
        k, _, v = line.strip().partition(" ")
        if k in ("id", "pip", "system", "cuda") and k not in kv:
            kv[k] = v.strip()
    if not IMAGE_ID.fullmatch(kv.get("id", "")):
        return None
    if kv.get("pip"):
        version, build = kv["pip"], "pip"
    elif kv.get("system"):
        version, build = kv["system"].split("-")[0], "system"  # 2.28.9-1+cuda13.0 -> 2.28.9
    else:
        version, build = "", ""
    return ImageNccl(kv["id"], version, build, kv.get("cuda", ""))


def probe(image: str, seen: dict[str, str] | None = None) -> Probe:
    """The image's NCCL on this node: what the controller remembers for its ID, else read in a
    throwaway container. Exits 3 when the node lacks the image."""
    img = shlex.quote(image)
    known = "".join(f"{shlex.quote(i)}) printf '%s\\n' {shlex.quote(t)}; exit 0;; " for i, t in (seen or {}).items())
    return Probe(
        NAME,
        f"id=$(docker image inspect --format '{{{{.Id}}}}' {img} 2>/dev/null) || exit 3; echo \"id $id\"; "
        + (f'case "$id" in {known}esac; ' if known else "")
        + f"docker run --rm --network none --entrypoint sh {img} -c {shlex.quote(INSIDE)}",
        parse,
    )


# --- what the controller remembers ---------------------------------------------------------------


def path() -> Path:
    return _MEMO.path()


def load() -> dict[str, str]:
    """image ID -> the lines read in it (without the id line); {} when absent or unreadable."""
    return _MEMO.load()


def lines(found: ImageNccl) -> str:
    """What `probe` prints from the cache for this image (after its id line)."""
    out = [f"{found.build} {found.version}"] if found.build else []
    return "\n".join([*out, f"cuda {found.cuda}"])


def remember(found: list[ImageNccl]) -> None:
    """Adds what was read, newest last, keeping KEEP; best effort (a failed write only costs a re-read)."""
    _MEMO.remember({f.image_id: lines(f) for f in found})
