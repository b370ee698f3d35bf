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

    # the Grafana dashboards, from the installed package into a folder of the owner's
    res = sc(installed, "monitor", "dashboards", "--out", "grafana")
    assert res.returncode == 0, res.stdout + res.stderr
    shipped_json = site / "sparkcluster" / "monitor" / "grafana" / "dashboards" / "sparkcluster-serving.json"
    copied = installed["cwd"] / "grafana" / "dashboards" / "sparkcluster-serving.json"
    assert copied.read_bytes() == shipped_json.read_bytes()
    # the web console's script and styles, which the gateway's container gets from the installed package
    for asset in ("console.js", "console.css"):
        assert (site / "sparkcluster" / "gateway" / "console_assets" / asset).is_file()

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


# --- README's install lines, as an owner types them ------------------------------------------------


def _readme_install_lines() -> list[list[str]]:
    """The shell lines of README's Install section that install sparkcluster, grouped into what an
    owner runs together: each line alone, except `pip wheel` with the `pipx install dist/...` after it."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    lines = [
        line
        for block in re.findall(r"```sh\n(.*?)```", section, re.S)
        for line in block.splitlines()
        if line.startswith(("pipx ", "uv ", "pip "))
    ]
    groups: list[list[str]] = []
    for line in lines:
        if groups and groups[-1][0].startswith("pip wheel") and len(groups[-1]) == 1:
            groups[-1].append(line)
        else:
            groups.append([line])
    return groups


INSTALLS = _readme_install_lines()


def test_readme_installs_from_the_clones_root_not_the_package_folder():
    firsts = [g[0].split("#")[0].split() for g in INSTALLS]
    assert firsts[:3] == [["pipx", "install", "."], ["uv", "tool", "install", "."], ["pip", "install", "."]]
    assert firsts[3] == ["pip", "wheel", "--no-deps", "-w", "dist", "."]
    assert INSTALLS[3][1].startswith(f"pipx install dist/sparkcluster-{__version__}-py3-none-any.whl")
    assert not [line for g in INSTALLS for line in g if "./sparkcluster" in line]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The checkout's files as a clone has them: what git tracks, and new files it does not ignore (no
    virtualenv, no build output, no git, and never a testbed's hosts, which `.testbed` holds by the
    gigabyte on a machine where one is up)."""
    import shutil

    dest = tmp_path_factory.mktemp("readme-install") / "sparkcluster-clone"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = REPO / name
        if not src.exists() and not src.is_symlink():  # tracked, deleted in this working tree
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / name, follow_symlinks=False)
    return dest


@pytest.mark.parametrize("lines", INSTALLS, ids=[" && ".join(g) for g in INSTALLS])
def test_readmes_install_lines_run_as_written_and_the_command_works_from_anywhere(clone, tmp_path, lines):
    """Each way README gives, run by bash in the clone's root with an empty HOME: pipx and uv (from
    PyPI, the dev extras) put `sparkcluster` in their bin folder, pip into a virtualenv of the
    owner's; then `sparkcluster --version` and `profile list` answer from another folder, with the
    profiles of the installed package."""
    home, bin_dir, elsewhere = tmp_path / "home", tmp_path / "bin", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    tools = Path(sys.executable).parent  # this environment's pipx and uv
    path = [str(bin_dir), str(tools)]
    if any(line.startswith("pip install") for line in lines):  # the owner's own virtualenv
        # (`pip wheel` only builds: this environment's pip does, as any pip would)
        venv = tmp_path / "venv"
        made = _run([sys.executable, "-m", "venv", str(venv)])
        assert made.returncode == 0, made.stderr
        path.insert(0, str(venv / "bin"))
        bin_dir = venv / "bin" if not any(line.startswith("pipx ") for line in lines) else bin_dir
    keep = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT", "SSL_CERT_FILE", "LANG")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith(("UV_INDEX", "UV_DEFAULT_INDEX"))}
    env.update(
        HOME=str(home),
        PATH=os.pathsep.join([*path, "/usr/bin", "/bin"]),
        PIPX_HOME=str(tmp_path / "pipx"),
        PIPX_BIN_DIR=str(tmp_path / "bin"),
        UV_TOOL_DIR=str(tmp_path / "uv-tools"),
        UV_TOOL_BIN_DIR=str(tmp_path / "bin"),
        UV_PYTHON=sys.executable,  # the Python these tests run on: never one downloaded
        # the caches of whoever runs the tests: a warm one saves minutes, a cold one changes nothing
        PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR", os.path.expanduser("~/.cache/pip")),
        UV_CACHE_DIR=os.environ.get("UV_CACHE_DIR", os.path.expanduser("~/.cache/uv")),
    )
    script = "set -e\n" + "\n".join(lines) + "\n"
    res = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{lines}\n{res.stdout}\n{res.stderr}"
    exe = bin_dir / "sparkcluster"
    assert exe.is_file(), f"{lines}: no {exe}\n{res.stdout}\n{res.stderr}"
    version = subprocess.run([str(exe), "--version"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith(f"sparkcluster {__version__}"), version.stderr
    listed = subprocess.run([str(exe), "profile", "list"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    first = listed.stdout.splitlines()[0]
    assert first.split()[0] == SHIPPED[0] and "/_data/profiles/" in first and str(clone) not in first
