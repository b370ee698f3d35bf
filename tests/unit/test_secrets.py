"""Secrets from the environment or a 0600 .env; registered with redact; never shown."""

from __future__ import annotations

import os

import pytest

from sparkcluster import redact
from sparkcluster.config.profile import load_profile
from sparkcluster.config.secrets import load_secrets, masked
from sparkcluster.errors import InputError

TOKEN = "hf_testtokenvalue0123456789"
KEY = "sk-testapikeyvalue0123456789"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for n in ("HF_TOKEN", "VLLM_API_KEY", "SPARKCLUSTER_ENV_FILE"):
        monkeypatch.delenv(n, raising=False)


def _env_file(tmp_path, mode=0o600, text=None):
    f = tmp_path / ".env"
    f.write_text(text if text is not None else f"HF_TOKEN={TOKEN}\nVLLM_API_KEY={KEY}\nOTHER=1\n")
    os.chmod(f, mode)
    return f


def test_from_env_file(tmp_path):
    f = _env_file(tmp_path)
    s = load_secrets(f, load_profile("nemotron"))
    assert s == {"HF_TOKEN": TOKEN, "VLLM_API_KEY": KEY}  # only the names the profile needs
    assert redact.mask(f"x {TOKEN} y {KEY}") == "x ****** y ******"


def test_only_names_asked(tmp_path):
    f = _env_file(tmp_path)
    assert load_secrets(f, names=["VLLM_API_KEY"]) == {"VLLM_API_KEY": KEY}


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_group_or_other_readable_refused(tmp_path, mode):
    f = _env_file(tmp_path, mode)
    with pytest.raises(InputError) as ei:
        load_secrets(f)
    assert ei.value.fix == f"chmod 600 {f}"
    assert "readable by group or others" in ei.value.message
    assert TOKEN not in ei.value.message


def test_environment_wins(tmp_path):
    f = _env_file(tmp_path)
    s = load_secrets(f, environ={"HF_TOKEN": "hf_fromenvironment0123456"})
    assert s["HF_TOKEN"] == "hf_fromenvironment0123456"
    assert redact.mask("hf_fromenvironment0123456") == "******"


def test_environment_only(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-onlyinenvironment0123")
    assert load_secrets() == {"VLLM_API_KEY": "sk-onlyinenvironment0123"}


def test_a_dot_env_in_the_current_folder_is_not_read_unless_named(tmp_path, monkeypatch):
    """Another project's ./.env (0644, nothing of ours) neither blocks nor feeds a command (issue 34)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    _env_file(tmp_path, 0o644)  # ./.env (cwd is tmp_path)
    assert load_secrets() == {}
    with pytest.raises(InputError):  # named, it is read, and its mode checked
        load_secrets(tmp_path / ".env")


def test_default_env_file_is_ours_and_its_mode_is_checked(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    (home / ".config" / "sparkcluster").mkdir(parents=True)
    f = home / ".config" / "sparkcluster" / ".env"
    f.write_text(f"HF_TOKEN={TOKEN}\n")
    f.chmod(0o600)
    assert load_secrets()["HF_TOKEN"] == TOKEN
    f.chmod(0o644)
    with pytest.raises(InputError) as ei:
        load_secrets()
    assert ei.value.fix == f"chmod 600 {f}"


def test_another_users_env_file_is_never_to_be_chmodded(tmp_path):
    f = _env_file(tmp_path, 0o644)
    os.chown(f, 4242, 4242)
    with pytest.raises(InputError) as ei:
        load_secrets(f)
    assert "belongs to uid 4242" in ei.value.message and "chmod" not in ei.value.fix


def test_missing_explicit_file(tmp_path):
    with pytest.raises(InputError) as ei:
        load_secrets(tmp_path / "nope.env")
    assert "no .env" in ei.value.message


def test_required(tmp_path):
    f = _env_file(tmp_path, text=f"HF_TOKEN={TOKEN}\n")
    with pytest.raises(InputError) as ei:
        load_secrets(f, required=True)
    assert ei.value.message == "missing secret(s): VLLM_API_KEY"
    assert TOKEN not in (ei.value.fix or "")


def test_a_missing_secret_with_no_env_file_names_where_the_tool_reads_one(tmp_path, monkeypatch):
    """No .env anywhere: the fix names ~/.config/sparkcluster/.env (0600), never ./.env."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SPARKCLUSTER_ENV_FILE", raising=False)
    with pytest.raises(InputError) as ei:
        load_secrets(names=["HF_TOKEN"], environ={}, required=True)
    assert ei.value.message == "missing secret(s): HF_TOKEN"
    assert "~/.config/sparkcluster/.env" in ei.value.fix and "0600" in ei.value.fix


def test_masked():
    assert masked({"HF_TOKEN": TOKEN}, ["HF_TOKEN", "VLLM_API_KEY"]) == {
        "HF_TOKEN": "******",
        "VLLM_API_KEY": "(not set)",
    }


# ---- the fix that names a missing secret (issue 55 item 4) ---------------------------------------


def test_the_fix_for_a_missing_secret_runs_as_printed_and_load_secrets_then_reads_it(tmp_path, monkeypatch):
    """The fix's command, run by bash with HOME in tmp_path, creates ~/.config/sparkcluster/.env 0600
    with the line load_secrets then reads (the value filled in where the fix shows its placeholder)."""
    import subprocess

    from sparkcluster.config.secrets import GATEWAY_KEYS

    fix = redact.set_fix(GATEWAY_KEYS, "KEY[,KEY...]")
    assert "~/.config/sparkcluster/.env" in fix and "0600" in fix
    command = fix.split(" -- ")[0].replace("KEY[,KEY...]", "sk-team-a,sk-team-b")
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    subprocess.run(["bash", "-c", command], check=True, env={"HOME": str(home), "PATH": os.environ["PATH"]})
    made = home / ".config" / "sparkcluster" / ".env"
    assert made.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("HOME", str(home))
    assert load_secrets(names=[GATEWAY_KEYS], environ={}) == {GATEWAY_KEYS: "sk-team-a,sk-team-b"}


def test_every_fix_that_names_a_missing_secret_names_the_path_the_tool_reads():
    """The gateway's missing keys (rollout and the CLI share the words), a gated repository without a
    token, one missing secret of load_secrets: each names ~/.config/sparkcluster/.env."""
    from sparkcluster.gateway import rollout
    from sparkcluster.movement import hfcache

    with pytest.raises(InputError) as ei:
        rollout.make(None, "a", [], {}, {}, [], "img:1", None)
    assert "~/.config/sparkcluster/.env" in ei.value.fix and "GATEWAY_API_KEYS=" in ei.value.fix
    gated = hfcache.resolve_error({"error": "GatedRepo", "status": 401}, "org/model", "main", "http://hub")
    assert "~/.config/sparkcluster/.env" in gated.fix and "HF_TOKEN=" in gated.fix
    with pytest.raises(InputError) as ei:
        load_secrets(names=["VLLM_API_KEY"], environ={}, required=True)
    assert "~/.config/sparkcluster/.env" in ei.value.fix


def test_no_message_says_a_dot_env_without_its_path():
    """The words that sent owners to a `.env` the tool never reads (README's old recipe wrote ./.env)
    appear nowhere in the package."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "sparkcluster"
    stale = (".env of mode 0600", "a 0600 .env", "in the .env (mode 0600)", "environment or .env)")
    hits = [f"{p}: {s}" for p in root.rglob("*.py") for s in stale if s in p.read_text()]
    assert not hits
