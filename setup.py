"""The build's one step beyond pyproject.toml: a wheel carries the shipped data inside the package.

The top-level folders stay the source of what ships (sparkcluster/config/shipped.py reads them):
env-profiles/*.toml (the profiles and their records) become sparkcluster/_data/profiles/, images/
(the cluster image's Dockerfile) sparkcluster/_data/images/, and the commit the build came from
sparkcluster/_data/commit (`sparkcluster --version`). An sdist carries the top-level folders
(MANIFEST.in) and that commit (COMMIT, as there is no .git in it), so a wheel built from it is the
same. An editable install copies nothing: the package then reads the checkout's folders in place.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
DATA = {"profiles": ("env-profiles", "*.toml"), "images": ("images", "Dockerfile.*")}  # _data/NAME: (source, glob)
COMMIT = "COMMIT"  # in an sdist: the commit it was made from


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _commit() -> str:
    """HEAD's short hash (`+dirty` when tracked files differ from it), else an sdist's COMMIT, else ''."""
    if (ROOT / ".git").exists():
        head = _git("rev-parse", "--short=12", "HEAD")
        if head:
            return head + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")
    recorded = ROOT / COMMIT
    return recorded.read_text().strip() if recorded.is_file() else ""


class BuildPy(build_py):
    def run(self) -> None:
        editable = getattr(self, "editable_mode", False)
        package = Path(self.build_lib) / "sparkcluster"
        if not editable:
            shutil.rmtree(package, ignore_errors=True)  # a module moved or removed since the last build stays out
        super().run()
        if editable:
            return
        data = package / "_data"
        for name, (folder, pattern) in DATA.items():
            files = sorted((ROOT / folder).glob(pattern))
            if not files:
                raise SystemExit(f"setup.py: nothing matches {folder}/{pattern}: the wheel would lack it")
            (data / name).mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copy2(f, data / name / f.name)
        (data / "commit").write_text(_commit() + "\n")


class Sdist(sdist):
    def make_release_tree(self, base_dir, files) -> None:
        super().make_release_tree(base_dir, files)
        (Path(base_dir) / COMMIT).write_text(_commit() + "\n")


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
