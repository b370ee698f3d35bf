"""What ships with the package as data, found wherever the package is installed, from any folder.

The profiles with their performance records and the cluster image's Dockerfile are kept at the top of
the repository (env-profiles/, images/): those folders are the source. A wheel or an sdist built from
it carries them inside the package, as sparkcluster/_data/profiles/ and sparkcluster/_data/images/,
with the commit the build came from in sparkcluster/_data/commit (setup.py copies them when it
builds); installed (pip, pipx, `uv tool install`), the package finds them there through
importlib.resources. Run from a checkout (an editable install, `python -m sparkcluster` in the
repository) the package has no _data/: it reads the checkout's top-level folders themselves, so an
edited profile counts at once, and the commit is the checkout's HEAD.

Nothing here imports more than the standard library: `--version` uses it."""

from __future__ import annotations

import subprocess
from importlib.resources import files
from pathlib import Path

from sparkcluster import __version__

DATA = "_data"
PROFILES = ("profiles", "env-profiles")  # (inside the package, in a checkout)
IMAGES = ("images", "images")
COMMIT = "commit"


def _package() -> Path:
    # an installed package is a folder on disk (pip, pipx and uv unpack wheels), never a zip
    return Path(str(files("sparkcluster")))


def _dir(where: tuple[str, str]) -> Path:
    packaged, checkout = where
    data = _package() / DATA / packaged
    if data.is_dir():
        return data
    return _package().resolve().parent / checkout


def profiles_dir() -> Path:
    """The shipped profiles and their records (`*.perf.toml`)."""
    return _dir(PROFILES)


def images_dir() -> Path:
    """The cluster image's build files (Dockerfile.vllm-ray)."""
    return _dir(IMAGES)


def checkout() -> Path | None:
    """The repository the package runs from (editable install or source tree), or None when installed."""
    root = _package().resolve().parent
    return root if (root / ".git").exists() and (root / "pyproject.toml").is_file() else None


def git_commit(root: Path) -> str | None:
    """HEAD's short hash, `+dirty` when tracked files differ from it; None without git or a repository."""

    def git(*args: str) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "--short=12", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    dirty = status is not None and status.returncode == 0 and bool(status.stdout.strip())
    return head.stdout.strip() + ("+dirty" if dirty else "")


def commit() -> str | None:
    """The commit this package was built from (recorded in a wheel), else the checkout's it runs from."""
    recorded = _package() / DATA / COMMIT
    if recorded.is_file():
        return recorded.read_text().strip() or None
    root = checkout()
    return git_commit(root) if root else None


def version_line() -> str:
    """`sparkcluster 0.1.0 (git 0123abcd4567)`; without a known commit, the version alone."""
    c = commit()
    return f"sparkcluster {__version__}" + (f" (git {c})" if c else "")
