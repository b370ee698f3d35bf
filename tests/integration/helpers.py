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
HEAD_LAN = "198.18.0.2"  # the head's LAN address, as the controller (198.18.0.1, on the LAN) reaches it
LAN_BASE = f"http://{HEAD_LAN}:8000"  # where an engine would answer the LAN: nothing listens there by default


class HostDoor:
    """A local port on the controller whose every connection is carried to `port` where an engine
    listens on a testbed host: the connection is made from inside the host's network namespace (a
    thread entered into it, setns(2)), as the controller's own SSH forward reaches it from the head.

    Engines listen only on the cluster's side by default (the head's control address, which the
    controller has no route to; issue 70), so the tests' own clients (httpx, openai, curl) ask
    through this door, never through sshd: a test that stops sshd or counts its connections is not
    disturbed. Each connection looks again where the engine listens (the inventory's control
    address of the host, then loopback, then its LAN address), so the door outlives engine restarts,
    cabling changes and `engines_listen = "all"`."""

    CLONE_NEWNET = 0x40000000  # <sched.h>

    def __init__(self, host: str, port: int):
        import socket
        import threading

        self.host, self.port = host, port
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.base = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True, name=f"door-{host}-{port}").start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._carry, args=(conn,), daemon=True).start()

    def _addresses(self) -> list[str]:
        import tomllib

        from tests.testbed.testbed import SPECS, Testbed

        out = []
        try:
            nodes = tomllib.loads(Testbed().inventory.read_text()).get("nodes", [])
            out += [n["control_ip"] for n in nodes if n.get("name") == self.host]
        except (OSError, ValueError, KeyError):
            pass
        return list(dict.fromkeys([*out, SPECS[self.host].control_ip, "127.0.0.1", SPECS[self.host].lan_ip]))

    def _carry(self, conn) -> None:
        import ctypes
        import socket

        from sparkcluster.remote.forward import pump
        from tests.testbed.testbed import Testbed

        far = None
        try:
            fd = os.open(f"/proc/{Testbed().pid(self.host)}/ns/net", os.O_RDONLY)
            try:  # this thread only: its sockets are the host's from here on
                if ctypes.CDLL(None, use_errno=True).setns(fd, self.CLONE_NEWNET) != 0:
                    return
            finally:
                os.close(fd)
            for addr in self._addresses():
                try:
                    far = socket.create_connection((addr, self.port), timeout=2)
                    far.settimeout(None)
                    break
                except OSError:
                    far = None
            if far is not None:
                import threading

                pump(conn, far, threading.Event())
        except Exception:  # noqa: BLE001 - the client sees its connection closed, as with nothing listening
            pass
        finally:
            for end in (far, conn):
                if end is not None:
                    end.close()


_DOORS: dict[tuple[str, int], HostDoor] = {}


def door(host: str, port: int = 8000) -> str:
    """The base URL (no /v1) at which the tests reach `port` on `host`'s cluster side (HostDoor)."""
    if (host, port) not in _DOORS:
        _DOORS[(host, port)] = HostDoor(host, port)
    return _DOORS[(host, port)].base


def reached(url: str) -> str:
    """`url` as `up` prints it (where the engine listens: a host's control address, or loopback on a
    one-node inventory) made reachable from the tests: the same path through the host's door."""
    from urllib.parse import urlsplit

    from tests.testbed.testbed import SPECS

    u = urlsplit(url)
    owner = next((h for h, s in SPECS.items() if u.hostname in (*s.dp_ips, s.lan_ip)), HEAD)
    return door(owner, u.port or 8000) + u.path


BASE = door(HEAD)  # the head's engine, from the tests (through the head's door)


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


def up_unless_serving(testbed, sc) -> None:
    """The serving tail's cluster used as it is: `up --profile testbed` only where the head supervisor
    does not say serving or the engine does not answer (a module run alone, or after a failure)."""
    if sup_state(testbed).get("state") != "serving" or not answers(BASE, "testbed-tiny"):
        res = sc("up", "--profile", "testbed", timeout=900)
        assert res.returncode == 0, res.stdout + res.stderr


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


def load(stop):
    """Requests to the `testbed` profile's engine (through the head's door) all the time until `stop` is
    set, in a thread (the stall clock and the GPU stand-in's power count only while work is there)."""
    import threading
    import time

    import httpx

    def go():
        while not stop.is_set():
            try:
                httpx.post(
                    BASE + "/v1/chat/completions",
                    json={"model": "testbed-tiny", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
                    headers={"Authorization": f"Bearer {API_KEY}"},
                    timeout=30,
                )
            except httpx.HTTPError:
                time.sleep(0.2)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t
