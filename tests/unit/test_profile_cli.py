"""`sparkcluster profile list|show|lint` through the real entry point."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sparkcluster.cli.main import main
from sparkcluster.config import shipped
from tests.testbed import PROFILES as TESTBED_PROFILES

DATA = Path(__file__).parent / "data"
INV = str(DATA / "profile-cluster.toml")
TOKEN = "hf_clitokenvalue0123456789"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for n in ("HF_TOKEN", "VLLM_API_KEY", "SPARKCLUSTER_ENV_FILE", "SPARKCLUSTER_INVENTORY"):
        monkeypatch.delenv(n, raising=False)
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(TESTBED_PROFILES))  # the testbed's, nothing of yours


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_list(capsys):
    rc, out, _ = run(capsys, "profile", "list")
    assert rc == 0
    for name in (
        "nemotron",
        "qwen3-30b",
        "qwen3-122b",
        "testbed",
        "testbed-standin",
        "qwen36-35b-fp8-single",
        "qwen36-35b-nvfp4-mtp",
        "gemma4-26b-fp8-mtp",
    ):
        assert name in out
    # then where it looked, in order, first match wins
    tail = out[out.index("searched, first match wins:") :].splitlines()[1:]
    assert tail == [
        f"  {TESTBED_PROFILES}  ($SPARKCLUSTER_PROFILES)",
        f"  {Path(os.environ['HOME']) / '.config/sparkcluster/profiles'}  (yours; absent)",
        f"  {shipped.profiles_dir()}  (shipped with sparkcluster)",
    ]


@pytest.fixture
def yours(monkeypatch):
    """Only your folder and the shipped profiles on the search path."""
    monkeypatch.delenv("SPARKCLUSTER_PROFILES")
    return Path(os.environ["HOME"]) / ".config/sparkcluster/profiles"


def test_copy_writes_a_shipped_profile_into_your_folder_and_prints_its_path(capsys, yours):
    rc, out, err = run(capsys, "profile", "copy", "nemotron")
    assert rc == 0, err
    assert out == f"{yours / 'nemotron.toml'}\n"
    assert (yours / "nemotron.toml").read_text() == (shipped.profiles_dir() / "nemotron.toml").read_text()
    assert err == (
        f"note: profile 'nemotron' is now this file; it overrides {shipped.profiles_dir() / 'nemotron.toml'}\n"
    )
    # never overwritten: the second copy is refused, naming another name that works
    (yours / "nemotron.toml").write_text("# mine\n" + (yours / "nemotron.toml").read_text())
    rc, out, err = run(capsys, "profile", "copy", "nemotron")
    assert rc == 2 and out == ""
    assert err.splitlines()[0] == f"error: {yours / 'nemotron.toml'} exists: not overwritten"
    assert "sparkcluster profile copy nemotron --to nemotron-2" in err
    assert (yours / "nemotron.toml").read_text().startswith("# mine\n")
    rc, out, err = run(capsys, "profile", "copy", "nemotron", "--to", "nemotron-2")
    assert rc == 0 and out == f"{yours / 'nemotron-2.toml'}\n" and err == ""
    rc, out, err = run(capsys, "profile", "copy", "nemotron", "--to", "no/slash")
    assert rc == 2 and "not a profile name: 'no/slash'" in err
    rc, out, err = run(capsys, "profile", "copy", "nemotronn")
    assert rc == 2 and "did you mean 'nemotron'" in err


def test_your_copy_wins_and_list_and_show_name_both_files(capsys, yours):
    shipped_one = shipped.profiles_dir() / "nemotron.toml"
    yours.mkdir(parents=True)
    mine = yours / "nemotron.toml"
    mine.write_text(shipped_one.read_text().replace('tag = "26.05.post1-py3"', 'tag = "26.06-py3"'))
    rc, out, err = run(capsys, "profile", "list")
    assert rc == 0, err
    (line,) = [x for x in out.splitlines() if x.startswith("nemotron ")]
    assert "nvcr.io/nvidia/vllm:26.06-py3" in line
    assert line.endswith(f"[{mine}]  (overrides {shipped_one})")
    rc, out, err = run(capsys, "profile", "list", "--json")
    import json

    (row,) = [r for r in json.loads(out)["profiles"] if r["name"] == "nemotron"]
    assert row["path"] == str(mine) and row["overrides"] == [str(shipped_one)]
    rc, out, err = run(capsys, "profile", "show", "nemotron")
    assert rc == 0 and out.startswith(f"profile nemotron  ({mine.resolve()})")
    assert err == (
        f"note: profile 'nemotron' is {mine.resolve()}, which overrides {shipped_one} "
        "(the first on the search path wins: sparkcluster profile list)\n"
    )
    rc, out, err = run(capsys, "--inventory", INV, "up", "--profile", "nemotron", "--dry-run", "--offline")
    assert f"note: profile 'nemotron' is {mine.resolve()}, which overrides {shipped_one}" in err
    assert "26.06-py3" in out


def test_the_shipped_profiles_are_not_the_testbeds(capsys, monkeypatch):
    """What ships is the owner's: the testbed's profiles (tests/testbed/profiles) come only through
    $SPARKCLUSTER_PROFILES."""
    monkeypatch.delenv("SPARKCLUSTER_PROFILES")
    rc, out, _ = run(capsys, "profile", "list")
    assert rc == 0 and "nemotron" in out and "qwen3-30b" in out
    assert "testbed" not in out and "$SPARKCLUSTER_PROFILES" not in out
    assert not list(shipped.profiles_dir().glob("testbed*"))
    assert {p.name for p in TESTBED_PROFILES.glob("*.toml")} >= {"testbed.toml", "testbed.perf.toml"}


def test_list_with_nothing_found_says_where_it_looked_and_fails(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(tmp_path / "none"))
    monkeypatch.setattr(shipped, "profiles_dir", lambda: tmp_path / "not-installed")
    rc, out, err = run(capsys, "profile", "list")
    assert rc == 1
    assert out.splitlines() == [
        "searched, first match wins:",
        f"  {tmp_path / 'none'}  ($SPARKCLUSTER_PROFILES; absent)",
        f"  {Path(os.environ['HOME']) / '.config/sparkcluster/profiles'}  (yours; absent)",
        f"  {tmp_path / 'not-installed'}  (shipped with sparkcluster; absent)",
    ]
    assert err.splitlines()[0] == "error: no profiles found in the folders above"
    assert err.splitlines()[1].startswith("fix: reinstall sparkcluster")


def test_lint_nemotron_with_inventory(capsys):
    rc, out, err = run(capsys, "-i", INV, "profile", "lint", "nemotron")
    assert rc == 0
    assert out.strip() == "nemotron: ok"
    assert "skipped" not in err


def test_lint_local_inventory_option(capsys):
    rc, out, _ = run(capsys, "profile", "lint", "nemotron", "--inventory", INV)
    assert (rc, out.strip()) == (0, "nemotron: ok")


def test_lint_env_inventory(capsys, monkeypatch):
    monkeypatch.setenv("SPARKCLUSTER_INVENTORY", INV)
    rc, out, err = run(capsys, "profile", "lint", "nemotron")
    assert rc == 0 and "skipped" not in err


def test_lint_default_inventory_path(capsys, tmp_path):
    d = Path(os.environ["HOME"]) / ".config/sparkcluster"
    d.mkdir(parents=True)
    shutil.copy(INV, d / "cluster.toml")
    rc, out, err = run(capsys, "profile", "lint", "nemotron")
    assert rc == 0 and "skipped" not in err


def test_lint_without_inventory_says_so(capsys):
    rc, out, err = run(capsys, "profile", "lint", "nemotron")
    assert rc == 0
    assert out.strip() == "nemotron: ok"
    # the rules in the registry's order (config/lint.RULES)
    assert "no inventory; skipped the cluster rules (control-ip, tp-pp-gpus" in err


def test_lint_failures_one_line_each_exit_1(capsys, tmp_path, monkeypatch):
    src = (Path(__file__).resolve().parents[2] / "env-profiles" / "nemotron.toml").read_text()
    bad = (
        src.replace("gpu_memory_utilization = 0.75", "gpu_memory_utilization = 0.9")
        .replace("tensor_parallel_size = 2", "tensor_parallel_size = 4")
        .replace('quantization = "modelopt"', 'quantization = "fp4"')
    )
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "broken.toml").write_text(bad)
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(d))
    rc, out, err = run(capsys, "-i", INV, "profile", "lint", "broken")
    assert rc == 1
    lines = out.strip().splitlines()
    assert len(lines) == 3
    assert any(line.startswith("broken: [gpu-memory-utilization]") for line in lines)
    assert any(line.startswith("broken: [tp-pp-gpus]") for line in lines)
    assert any(line.startswith("broken: [quantization]") for line in lines)
    assert "Traceback" not in out + err


def test_lint_invalid_profile_exit_2(capsys, tmp_path, monkeypatch):
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "bad.toml").write_text('model = "x"\nwhat = 1\n')
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(d))
    rc, out, err = run(capsys, "profile", "lint", "bad")
    assert rc == 2
    assert "what: unknown key" in err
    assert "image: Field required" in err
    assert "Traceback" not in err


def test_lint_unknown_profile(capsys):
    rc, _, err = run(capsys, "profile", "lint", "nope")
    assert rc == 2 and "no profile named 'nope'" in err


def test_lint_missing_named_inventory(capsys, tmp_path):
    rc, _, err = run(capsys, "-i", str(tmp_path / "none.toml"), "profile", "lint", "nemotron")
    assert rc == 2 and "no inventory at" in err


def test_show_per_node_secrets_masked(capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    rc, out, err = run(capsys, "-i", INV, "profile", "show", "nemotron")
    assert rc == 0, err
    assert TOKEN not in out + err
    assert "HF_TOKEN=******" in out
    assert "VLLM_API_KEY=(not set)" in out
    assert "node spark-a (head)" in out and "node spark-b (worker)" in out
    assert "VLLM_HOST_IP=192.168.100.11  (per host)" in out
    assert "NCCL_IB_HCA=roceP2p1s0f1,rocep1s0f1  (per host)" in out
    assert "VLLM_NVFP4_GEMM_BACKEND=marlin" in out
    assert "/etc/sparkcluster/vllm/ray_non_carry_over_env_vars.json" in out
    assert "vllm serve nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4" in out
    assert "sparkcluster/vllm-ray:26.05.post1-py3-ray2.60.0" in out


def test_show_env_file_bad_mode(capsys, tmp_path):
    f = tmp_path / ".env"
    f.write_text(f"HF_TOKEN={TOKEN}\n")
    os.chmod(f, 0o644)
    rc, out, err = run(capsys, "profile", "show", "nemotron", "--env-file", str(f))
    assert rc == 2
    assert f"fix: chmod 600 {f}" in err
    assert TOKEN not in out + err


def test_show_without_inventory(capsys):
    rc, out, _ = run(capsys, "profile", "show", "testbed-standin")
    assert rc == 0
    assert "FLASHINFER_DISABLE_VERSION_CHECK=1" in out
    assert "no inventory given" in out


def test_show_json(capsys, monkeypatch):
    import json

    monkeypatch.setenv("VLLM_API_KEY", "sk-clikeyvalue0123456789")
    rc, out, _ = run(capsys, "-i", INV, "profile", "show", "testbed", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["secrets_exec_env"] == {"HF_TOKEN": "(not set)", "VLLM_API_KEY": "******"}
    assert [n["name"] for n in data["nodes"]] == ["spark-a", "spark-b"]
    assert data["serve_argv"][:3] == ["vllm", "serve", "sparkcluster/testbed-tiny"]
    assert "sk-clikey" not in out
