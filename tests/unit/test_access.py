"""The account and access probes, run locally with bash: who the SSH user is, whether it may write
its HF cache (or create it) and take the lock, and which file in the cache another account owns."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from sparkcluster.facts import access, probes

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root to run the probe as another account (setpriv)",
)


def run(probe: probes.Probe, home: Path, uid: int | None = None):
    pre = [] if uid is None else ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    res = subprocess.run(
        [*pre, "bash", "-c", probes.script([probe])],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
        cwd="/",
    )
    return probes.value(probe, probes.split_sections(res.stdout))


@pytest.fixture
def top():
    d = Path(tempfile.mkdtemp(prefix="sc-access-"))  # not under pytest's folders: other accounts look in
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_account_probe_reads_id_and_home(top):
    a = run(access.ACCOUNT, top)
    assert a.uid == os.getuid() and a.gid == os.getgid() and a.home == str(top) and a.user
    assert a.owner == f"{os.getuid()}:{os.getgid()}"


def test_a_cache_not_made_yet_is_writable_through_its_parent(top):
    x = run(access.access("~/.cache/huggingface", str(top / "tmp" / "sparkcluster" / "pair.lock")), top)
    assert x.cache == f"{top}/.cache/huggingface" and x.cache_writable and x.cache_nearest == str(top)
    assert x.lock_ok and x.flock and not x.foreign


def test_hostile_cache_setting_is_not_executed(top):
    x = run(access.access("~/a b/$(touch PWNED)/`touch PWNED2`", str(top / "l.lock")), top)
    assert x.cache == f"{top}/a b/$(touch PWNED)/`touch PWNED2`"
    assert not Path("/PWNED").exists() and not list(top.glob("*PWNED*"))


@needs_root
def test_ordinary_account_sees_root_owned_cache_files_and_a_foreign_lock_dir(top):
    home = top / "home"
    cache = home / ".cache" / "huggingface"
    (cache / "hub" / "models--o--m").mkdir(parents=True)
    for p in (home, home / ".cache", cache, cache / "hub"):
        os.chown(p, 1000, 1000)
    # what a download container running as root left behind
    x = run(access.access("~/.cache/huggingface", str(top / "sc" / "pair.lock")), home, uid=1000)
    assert x.cache_writable and x.foreign == str(cache / "hub" / "models--o--m") and x.foreign_owner == "root"
    assert not x.lock_ok and x.lock_blocker == f"{top} owned by root"  # /tmp itself would be 1777
    os.chown(cache / "hub" / "models--o--m", 1000, 1000)
    os.chown(cache, 0, 0)
    x = run(access.access("~/.cache/huggingface", str(top / "sc" / "pair.lock")), home, uid=1000)
    assert not x.cache_writable and x.cache_nearest == str(cache) and x.cache_nearest_owner == "root"
    (top / "sc").mkdir(mode=0o1777)
    (top / "sc").chmod(0o1777)
    x = run(access.access("~/.cache/huggingface", str(top / "sc" / "pair.lock")), home, uid=1000)
    assert x.lock_ok
