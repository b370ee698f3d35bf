"""Helpers for running the real `sparkcluster` CLI against the testbed.

`sc(...)` runs the installed console script in a subprocess, exactly as a user would, with the
testbed's inventory and a 0600 `.env` holding the test secrets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import API_KEY, HF_TOKEN
from tests.testbed import profiles_env

CLI = [sys.executable, "-m", "sparkcluster"]


@pytest.fixture(scope="session")
def env_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("secrets") / ".env"
    p.write_text(f"VLLM_API_KEY={API_KEY}\nHF_TOKEN={HF_TOKEN}\n")
    p.chmod(0o600)
    return p


@pytest.fixture(scope="session")
def sc(testbed, env_file, tmp_path_factory):
    state = tmp_path_factory.mktemp("state")

    def run(
        *args: str, timeout: float = 600, inventory: Path | None = None, check: bool = False, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        argv = [*CLI, "--inventory", str(inventory or testbed.inventory), *args]
        full_env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "HF_TOKEN")}
        full_env.update({"SPARKCLUSTER_ENV_FILE": str(env_file), "XDG_STATE_HOME": str(state), "COLUMNS": "200"})
        full_env.update(env or {})
        if env and "SPARKCLUSTER_PROFILES" in env:  # a test's folder first; the testbed's profiles stay found
            full_env["SPARKCLUSTER_PROFILES"] = profiles_env(env["SPARKCLUSTER_PROFILES"])
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {res.returncode}\n{res.stdout}\n{res.stderr}")
        return res

    run.state_dir = state
    return run
