"""Issue 53: sparkcluster installed like any Python CLI. The wheel is built from this checkout, installed
into a fresh venv outside it, and its console script run from another folder with an empty HOME: it
finds the shipped profiles (none of the testbed's), shows one, plans `up` against the README's pair
inventory without a node, and names the commit it was built from. The sdist carries what a wheel is
built from.

Kept fast and offline: the wheel is built without a build environment of its own (setuptools comes
with the dev extras), installed without its dependencies, and the venv reaches them in this test
environment's site-packages through a path line of a .pth file (a plain path: the editable install
of this checkout that also lives there is not activated, so the wheel's package is the one imported).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from sparkcluster import __version__
from sparkcluster.config import shipped
from tests.testbed import PROFILES as TESTBED_PROFILES

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.stem for p in (REPO / "env-profiles").glob("*.toml") if not p.name.endswith(".perf.toml"))


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, **kw)


def _pair_inventory() -> str:
    """README's complete inventory of the pair, as an owner would copy it."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("### A complete inventory: the pair") :]
    return re.search(r"```toml\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("wheel")
    build = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"), "."],
        cwd=REPO,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (tmp / "dist").glob("sparkcluster-*.whl")
    venv = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    put = _run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)]
    )
    assert put.returncode == 0, put.stdout + put.stderr
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_sparkcluster_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    home, elsewhere = tmp / "home", tmp / "elsewhere"
    (home / ".config" / "sparkcluster").mkdir(parents=True)
    elsewhere.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPARKCLUSTER_", "HF_", "VLLM_", "XDG_", "PYTHON", "VIRTUAL_ENV"))
    }
    env.update(HOME=str(home), XDG_STATE_HOME=str(tmp / "state"), COLUMNS="200")
    return {"venv": venv, "site": site, "home": home, "cwd": elsewhere, "env": env, "wheel": wheel}


def sc(installed, *argv: str) -> subprocess.CompletedProcess:
    """The installed console script, from a folder outside the checkout."""
    return _run([str(installed["venv"] / "bin" / "sparkcluster"), *argv], cwd=installed["cwd"], env=installed["env"])


def test_an_installed_wheel_finds_its_profiles_and_plans_up_from_any_folder(installed):
    site = installed["site"]
    where = _run(
        [str(installed["venv"] / "bin" / "python"), "-c", "import sparkcluster; print(sparkcluster.__file__)"],
        cwd=installed["cwd"],
        env=installed["env"],
    )
    assert Path(where.stdout.strip()).parent == site / "sparkcluster", where.stdout + where.stderr

    res = sc(installed, "profile", "list")
    assert res.returncode == 0, res.stdout + res.stderr
    listed = res.stdout.split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in listed] == SHIPPED
    assert all(f"[{site / 'sparkcluster' / '_data' / 'profiles'}/" in line for line in listed)
    assert "testbed" not in res.stdout
    assert f"  {site / 'sparkcluster' / '_data' / 'profiles'}  (shipped with sparkcluster)" in res.stdout
    assert f"  {installed['home'] / '.config/sparkcluster/profiles'}  (yours; absent)" in res.stdout

    res = sc(installed, "profile", "show", "nemotron")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith(
        f"profile nemotron  ({site / 'sparkcluster' / '_data' / 'profiles' / 'nemotron.toml'})"
    )
    assert "model:   nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4" in res.stdout

    (installed["home"] / ".config" / "sparkcluster" / "cluster.toml").write_text(_pair_inventory())
    res = sc(installed, "up", "--profile", "nemotron", "--dry-run", "--offline")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("plan for profile 'nemotron' on cluster 'pair'")
    assert "-f Dockerfile.vllm-ray ." in res.stdout
    assert (site / "sparkcluster" / "_data" / "images" / "Dockerfile.vllm-ray").is_file()

    res = sc(installed, "--version")
    assert res.returncode == 0 and res.stdout.startswith(f"sparkcluster {__version__}"), res.stdout + res.stderr
    commit = shipped.git_commit(REPO)
    if commit:  # built from this checkout: the wheel names its commit
        assert res.stdout.strip() == f"sparkcluster {__version__} (git {commit})"


def test_an_install_without_the_dockerfile_is_refused_before_any_connection(installed):
    dockerfile = installed["site"] / "sparkcluster" / "_data" / "images" / "Dockerfile.vllm-ray"
    aside = dockerfile.with_name("aside")
    dockerfile.rename(aside)
    try:
        # a real `up`: the pair's addresses are not reachable from here, and nothing is tried
        res = sc(installed, "up", "--profile", "nemotron")
    finally:
        aside.rename(dockerfile)
    assert res.returncode == 2, res.stdout + res.stderr
    assert (
        res.stderr.splitlines()[0]
        == f"error: the cluster image's Dockerfile is missing from this install: {dockerfile}"
    )
    assert res.stderr.splitlines()[1].startswith("fix: reinstall sparkcluster")


def test_the_wheel_and_the_sdist_carry_the_data_and_the_license(installed, tmp_path):
    import zipfile

    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    profiles = {f"sparkcluster/_data/profiles/{p.name}" for p in (REPO / "env-profiles").glob("*.toml")}
    assert profiles <= names and "sparkcluster/_data/images/Dockerfile.vllm-ray" in names
    assert not [n for n in names if "testbed" in n.rsplit("/", 1)[-1]]
    assert "sparkcluster-0.1.0.dist-info/licenses/LICENSE" in names
    meta = zipfile.ZipFile(installed["wheel"]).read("sparkcluster-0.1.0.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta and "Description-Content-Type: text/markdown" in meta
    assert re.search(r"^Summary: Bring one to eight NVIDIA DGX Sparks", meta, re.M)

    hook = "import setuptools.build_meta as b, sys; print(b.build_sdist(sys.argv[1]))"
    res = _run([sys.executable, "-c", hook, str(tmp_path)], cwd=REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    sdist = tmp_path / res.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        inside = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {f"env-profiles/{p.name}" for p in (REPO / "env-profiles").glob("*.toml")} <= inside
    assert {"images/Dockerfile.vllm-ray", "LICENSE", "COMMIT", "setup.py", "MANIFEST.in"} <= inside
    assert not [n for n in inside if n.startswith("tests/")]
    assert TESTBED_PROFILES.is_dir()  # the testbed's stay in the checkout
