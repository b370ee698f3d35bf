"""Constants and read-only looks at a testbed host, shared by the integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path

from tests.testbed import profiles_env

API_KEY = "sk-testbed-4f9c1e2a7b"
HF_TOKEN = "hf_testbedTOKEN1234567890"
HEAD, WORKER = "spark-head", "spark-worker"
HEAD_C = "sparkcluster-testbed-head"
CONTAINERS = {HEAD: HEAD_C, WORKER: "sparkcluster-testbed-worker-spark-worker"}
BASE = "http://198.18.0.2:8000"


def ours(testbed, host: str) -> list[str]:
    """Names of sparkcluster's containers on a host, read with the host's own docker CLI."""
    out = testbed.sh(host, "docker ps -a --filter label=org.sparkcluster.cluster --format '{{.Names}}'").stdout
    return [x for x in out.split() if x]


def listeners(testbed, host: str, port: int) -> str:
    return testbed.sh(host, f"ss -Htln '( sport = :{port} )'").stdout.strip()


def inventory_variant(testbed, tmp_path: Path, edit) -> Path:
    """The testbed's inventory with absolute ssh paths, one node edited: edit(text) -> text."""
    text = testbed.inventory_text().replace('ssh_config = "ssh_config"', f'ssh_config = "{testbed.ssh_config}"')
    text = text.replace('known_hosts = "known_hosts"', f'known_hosts = "{testbed.known_hosts}"')
    new = edit(text)
    assert new != text
    p = tmp_path / "cluster.toml"
    p.write_text(new)
    return p


def worker_block_edit(old: str, new: str):
    """Replace `old` by `new` in the worker's [[nodes]] block only."""

    def edit(text: str) -> str:
        head, worker = text.split('name = "spark-worker"')
        return head + 'name = "spark-worker"' + worker.replace(old, new)

    return edit


def debug_log_lines(sc, since: str = "") -> list[str]:
    """The controller's debug log, its rotated files included (oldest first), as JSON lines.

    The log rotates at 5 MiB and one test session writes more than that, so a byte offset taken
    before a command may point past the end after it; `since` is an ISO UTC timestamp instead.
    """
    base = sc.state_dir / "sparkcluster" / "debug.log"
    files = [base.with_name(f"debug.log.{i}") for i in (2, 1)] + [base]
    lines = [x for f in files if f.exists() for x in f.read_text(errors="replace").splitlines()]
    return [x for x in lines if _timestamp(x) >= since]


def utc_now() -> str:
    from datetime import datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # structlog's own form


def _timestamp(line: str) -> str:
    import json

    try:
        return str(json.loads(line).get("timestamp", ""))
    except ValueError:
        return ""


def popen_sc(testbed, sc, env_file, *args: str, env: dict | None = None) -> subprocess.Popen:
    """The CLI as a background process (same environment as the `sc` fixture), stdout and stderr piped."""
    full = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "HF_TOKEN")}
    full.update({"SPARKCLUSTER_ENV_FILE": str(env_file), "XDG_STATE_HOME": str(sc.state_dir), "COLUMNS": "200"})
    full.update(env or {})
    if env and "SPARKCLUSTER_PROFILES" in env:  # as `sc`: a test's folder first, the testbed's profiles still found
        full["SPARKCLUSTER_PROFILES"] = profiles_env(env["SPARKCLUSTER_PROFILES"])
    return subprocess.Popen(
        [sys.executable, "-m", "sparkcluster", "--inventory", str(testbed.inventory), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full,
        start_new_session=True,
    )


def answers(base: str, model: str, max_tokens: int = 2, api_key: str = API_KEY) -> bool:
    """A chat completion through the endpoint (`base` ends before /v1) returns the tokens asked for."""
    import httpx

    try:
        r = httpx.post(
            f"{base}/v1/chat/completions",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=20,
            json={"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]},
        )
        return r.status_code == 200 and r.json()["usage"]["completion_tokens"] == max_tokens
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def sup_state(testbed) -> dict:
    """The head supervisor's state file; {} when it cannot be read."""
    import json

    res = testbed.sh(HEAD, f"docker exec {HEAD_C} cat /run/sparkcluster/supervisor.json", check=False)
    try:
        return json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else {}
    except ValueError:
        return {}


def journal(testbed, host: str = HEAD) -> list[dict]:
    """The agent's journal in `host`'s container of the pair (the head's by default)."""
    import json

    out = testbed.sh(
        host, f"docker exec {CONTAINERS[host]} cat /var/log/sparkcluster/journal.jsonl", check=False
    ).stdout
    return [json.loads(x) for x in out.splitlines() if x.strip()]


def serving_again(testbed, since: float, timeout: float, step: float = 2.0, tail=None) -> float:
    """Seconds until the head supervisor says serving (since `since`) and a completion answers;
    else an AssertionError ending with the journal (`tail()`, the head's by default)."""
    import json

    t0 = time.monotonic()
    if not wait_for(
        lambda: (
            (st := sup_state(testbed)).get("state") == "serving"
            and st.get("since", 0) > since
            and answers(BASE, "testbed-tiny")
        ),
        timeout,
        step=step,
    ):
        said = tail() if tail else "\n".join(json.dumps(e) for e in journal(testbed)[-12:])
        raise AssertionError(f"not serving again within {timeout:.0f}s; the journal ends:\n{said}")
    return time.monotonic() - t0


def wait_for(cond, timeout: float, step: float = 0.2):
    """The condition's first true value within `timeout` seconds, else a false one: the suites
    wait on conditions, never on sleeps."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(step)
    return cond()


# ---- the testbed's SSH user (an ordinary account in `docker`, as on a Spark) --------------------


def account() -> dict:
    """Who the testbed's SSH user is, from the testbed's facts file (ssh_user, uid, gid, home,
    hf_cache): tests never hard-code a name, a home or root's."""
    from tests.testbed.testbed import ssh_account

    return ssh_account()


def hf_cache() -> str:
    """The SSH user's HF cache on the hosts (what sparkcluster resolves `~/.cache/huggingface` to)."""
    return account()["hf_cache"]


def as_user(cmd: str) -> str:
    """Shell text that runs `cmd` (through `testbed.sh`, root inside the host) as the SSH user, so
    what it writes in the user's HF cache is the user's own, as sparkcluster leaves it."""
    import shlex

    a = account()
    return (
        f"setpriv --reuid={int(a['uid'])} --regid={int(a['gid'])} --init-groups "
        f"env HOME={shlex.quote(a['home'])} sh -c {shlex.quote(cmd)}"
    )
