"""Issue 7 on the testbed: access faults (host keys, authentication, sshd down), bad input, the
dry run, the cluster lock, secrets and hostile values. Each case asserts the outcome AND that
nothing was lost or left: no container, file or process changed on a host that was refused, no
secret anywhere it could be read."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.helpers import API_KEY, HF_TOKEN, account, debug_log_lines, hf_cache, ours, utc_now
from tests.testbed import PROFILES as TESTBED_PROFILES

pytestmark = pytest.mark.testbed
HEAD, WORKER = "spark-head", "spark-worker"
HOSTS = (HEAD, WORKER)
ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "sparkcluster"]

# cluster defaults (inventory.ClusterSettings, remote/ssh): a connect timeout of 10 s for every attempt
# together (no timeout in the testbed's inventory or ssh_config), 3 attempts, back-off 0.5 s + 1 s
CONNECT_TIMEOUT, ATTEMPTS, BACKOFF = 10.0, 3, 1.5
# exit codes (README, "Exit codes and errors"): doctor reports a node it cannot reach as a FAIL row
# and, as every command does, ends with 4 (issue 56: --help promised 4, doctor said 1)
DOCTOR_RC, UNREACHABLE_RC = 4, 4

PWNED = "/tmp/sc-faults-pwned"
# everything a shell would interpret: ; $() backticks, both quotes, runs of spaces, a backslash
HOSTILE = f"""a;b $(touch {PWNED}-1) `touch {PWNED}-2` 'single' "double"  two  spaces \\ end;"""


# --- helpers ---------------------------------------------------------------------------------


SSHD_SESSION = re.compile(r"sshd: \S+ \[priv\]|sshd: \S+@")


def state(testbed, host: str) -> dict[str, object]:
    """What sparkcluster could have changed on a host: containers, images, its files, processes."""
    sh = lambda cmd: testbed.sh(host, cmd, check=False).stdout  # noqa: E731
    # an sshd session's own processes (`sshd: spark [priv]`, `sshd: spark@notty`) come and go with every
    # connection, an earlier case's included; connections are counted apart, by `accepted`
    procs = sorted(
        line.strip()
        for line in sh("ps -eo pid,args --no-headers").splitlines()
        if "ps -eo pid,args" not in line and not SSHD_SESSION.search(line)
    )
    return {
        # sparkcluster's own containers: a throwaway `docker run --rm` of an earlier test's probe (a random
        # name) may still be ending when a case takes its first look
        "containers": sh(
            "docker ps -a --no-trunc --format '{{.ID}} {{.Names}} {{.State}}' | grep ' sparkcluster-' | sort"
        ),
        "images": sh("docker images -a -q --no-trunc | sort"),
        "files": sh(
            f"find /tmp/sparkcluster /run/sparkcluster /var/lib/sparkcluster {account()['home']}/.cache -printf '%p %s %T@\\n' "
            "2>/dev/null | sort"
        ),
        "processes": procs,
    }


def states(testbed) -> dict[str, dict]:
    return {h: state(testbed, h) for h in HOSTS}


def assert_unchanged(testbed, before: dict[str, dict]) -> None:
    # an sshd session that just ended can take a moment to leave the process table
    deadline = time.monotonic() + 5
    while True:
        after = states(testbed)
        if after == before or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    for h in HOSTS:
        for k in before[h]:
            assert after[h][k] == before[h][k], f"{h}: {k} changed"


def no_secret(*texts: str) -> None:
    for t in texts:
        assert API_KEY not in t and HF_TOKEN not in t


def fingerprint(pub: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def inventory_variant(
    testbed, d: Path, *, known_hosts: Path | None = None, identity: Path | None = None, text: str | None = None
) -> Path:
    """The testbed's inventory with its own ssh_config (UserKnownHostsFile / IdentityFile replaced)."""
    kh = known_hosts or testbed.known_hosts
    cfg = re.sub(r"UserKnownHostsFile \S+", f"UserKnownHostsFile {kh}", testbed.ssh_config.read_text())
    if identity is not None:
        cfg = re.sub(r"IdentityFile \S+", f"IdentityFile {identity}", cfg)
    (d / "ssh_config").write_text(cfg)
    inv = (text or testbed.inventory_text()).replace('ssh_config = "ssh_config"', f'ssh_config = "{d / "ssh_config"}"')
    inv = inv.replace('known_hosts = "known_hosts"', f'known_hosts = "{kh}"')
    path = d / "cluster.toml"
    path.write_text(inv)
    return path


def accepted(testbed) -> dict[str, int]:
    return {h: testbed.connections_logged(h) for h in HOSTS}


def log_since(sc, since: str) -> str:
    return "\n".join(debug_log_lines(sc, since))


def timed(sc, *args, **kw) -> tuple[subprocess.CompletedProcess, float]:
    t = time.monotonic()
    res = sc(*args, **kw)
    return res, time.monotonic() - t


def hostile_profile_dir(d: Path) -> Path:
    text = (TESTBED_PROFILES / "testbed-standin.toml").read_text()
    assert "[env.forward]\n" in text
    # a JSON string is a valid TOML basic string
    text = text.replace("[env.forward]\n", f"[env.forward]\nSC_HOSTILE = {json.dumps(HOSTILE)}\n")
    (d / "testbed-hostile.toml").write_text(text)
    return d


# --- 1-4: access faults ----------------------------------------------------------------------


def test_unknown_host_key_refused_with_fingerprint(testbed, sc, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text(
        "".join(line for line in testbed.known_hosts.read_text().splitlines(True) if not line.startswith(WORKER))
    )
    kept = kh.read_text()
    inv = inventory_variant(testbed, tmp_path, known_hosts=kh)
    fp = fingerprint(testbed.host_dir(WORKER) / "ssh_host_ed25519_key.pub")
    before, conns = states(testbed), accepted(testbed)
    for cmd in (["doctor"], ["up", "--profile", "testbed-standin"]):
        res = sc("-v", *cmd, inventory=inv, timeout=60)
        text = res.stdout + res.stderr
        assert res.returncode == (DOCTOR_RC if cmd == ["doctor"] else UNREACHABLE_RC), text
        assert fp in text and "not in known_hosts" in text and WORKER in text, text
        assert "retrying" not in res.stderr
        no_secret(text)
    assert testbed.connections_logged(WORKER) == conns[WORKER]  # refused before authentication
    assert kh.read_text() == kept  # never added
    assert_unchanged(testbed, before)


def test_changed_host_key_aborts_with_hint_no_retry(testbed, sc):
    testbed.replace_host_key(WORKER)
    try:
        fp = fingerprint(testbed.host_dir(WORKER) / "ssh_host_ed25519_key.pub")
        kept = testbed.known_hosts.read_text()
        before, conns, since = states(testbed), accepted(testbed), utc_now()
        res, took = timed(sc, "-v", "up", "--profile", "testbed-standin", timeout=60)
        assert res.returncode == UNREACHABLE_RC, res.stderr
        assert "CHANGED" in res.stderr and fp in res.stderr and WORKER in res.stderr
        assert f"ssh-keygen -f {testbed.known_hosts} -R 198.18.0.6" in res.stderr
        assert "retrying" not in res.stderr and "retrying" not in log_since(sc, since)
        assert took < CONNECT_TIMEOUT, took
        assert testbed.connections_logged(WORKER) == conns[WORKER]
        assert testbed.known_hosts.read_text() == kept
        no_secret(res.stdout, res.stderr)
        assert_unchanged(testbed, before)
    finally:
        testbed.restore_host_key(WORKER)


def test_auth_failure_fast_no_retry(testbed, sc, tmp_path):
    key = tmp_path / "id_unauthorized"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    inv = inventory_variant(testbed, tmp_path, identity=key)
    before, conns, since = states(testbed), accepted(testbed), utc_now()
    res, took = timed(sc, "-v", "up", "--profile", "testbed-standin", inventory=inv, timeout=60)
    assert res.returncode == UNREACHABLE_RC, res.stderr
    assert "authentication refused" in res.stderr and WORKER in res.stderr and HEAD in res.stderr
    assert "retrying" not in res.stderr and "retrying" not in log_since(sc, since)
    assert took < 2.0, took
    assert accepted(testbed) == conns
    no_secret(res.stdout, res.stderr)
    assert_unchanged(testbed, before)


def test_sshd_stopped_fails_bounded_naming_host(testbed, sc):
    testbed.stop_sshd(WORKER)
    try:
        before = states(testbed)
        bound = CONNECT_TIMEOUT + BACKOFF + 5  # every attempt together within the connect timeout
        for cmd in (["doctor"], ["up", "--profile", "testbed-standin"]):
            res, took = timed(sc, "-v", *cmd, timeout=120)
            assert res.returncode == (DOCTOR_RC if cmd == ["doctor"] else UNREACHABLE_RC), res.stdout + res.stderr
            assert took < bound, (cmd, took)
            text = res.stdout + res.stderr
            assert WORKER in text and "198.18.0.6:22" in text, text
            if cmd[0] == "up":
                assert f"after {ATTEMPTS} attempt(s)" in res.stderr
                # a refused connection is transient: retried, each retry logged
                assert res.stderr.count("retrying") == ATTEMPTS - 1, res.stderr
        assert_unchanged(testbed, before)
    finally:
        testbed.start_sshd(WORKER)


# --- 19, 17b, 18b: bad input is refused before any connection -----------------------------------


def test_malformed_inventory_or_profile_before_any_connection(testbed, sc, tmp_path):
    text = testbed.inventory_text()
    text = text.replace('name = "testbed"\n', f'name = "testbed"\nsecret_thing = "{HF_TOKEN}"\n', 1)
    text = text.replace('control_ip = "198.19.2.2"', 'control_ip = "198.19.2.999"')
    bad_inv = tmp_path / "bad.toml"
    bad_inv.write_text(text)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "testbed-tp4.toml").write_text(
        (TESTBED_PROFILES / "testbed-standin.toml")
        .read_text()
        .replace("tensor_parallel_size = 2", "tensor_parallel_size = 4")
    )
    conns = accepted(testbed)
    for cmd in (["up", "--profile", "testbed-standin"], ["doctor"]):
        res = sc(*cmd, inventory=bad_inv)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.splitlines()
        assert "2 problem(s) in the inventory" in lines[0], res.stderr
        assert sum("cluster.secret_thing: unknown key" in x for x in lines) == 1
        assert sum("nodes[1].control_ip:" in x for x in lines) == 1
        assert "198.19.2.999" not in res.stderr
        no_secret(res.stdout, res.stderr)
    res = sc("up", "--profile", "testbed-tp4", env={"SPARKCLUSTER_PROFILES": str(profiles)})
    assert res.returncode == 2, res.stderr
    assert sum("= 4, but the cluster has 2 GPU(s)" in x for x in res.stderr.splitlines()) == 1
    no_secret(res.stdout, res.stderr)
    assert accepted(testbed) == conns


def test_world_readable_env_refused_before_any_connection(testbed, sc, tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text(f"VLLM_API_KEY={API_KEY}\nHF_TOKEN={HF_TOKEN}\n")
    env_file.chmod(0o644)
    conns = accepted(testbed)
    res = sc("up", "--profile", "testbed-standin", env={"SPARKCLUSTER_ENV_FILE": str(env_file)})
    assert res.returncode == 2, res.stderr
    assert "mode 0644" in res.stderr and f"chmod 600 {env_file}" in res.stderr
    no_secret(res.stdout, res.stderr)
    assert accepted(testbed) == conns


def test_newline_in_forwarded_value_refused_before_any_connection(testbed, sc, tmp_path):
    text = (TESTBED_PROFILES / "testbed-standin.toml").read_text()
    (tmp_path / "testbed-newline.toml").write_text(
        text.replace("[env.forward]\n", '[env.forward]\nSC_MULTILINE = "line one\\nline two"\n')
    )
    conns = accepted(testbed)
    res = sc("up", "--profile", "testbed-newline", env={"SPARKCLUSTER_PROFILES": str(tmp_path)})
    assert res.returncode == 2, res.stderr
    problem = [x for x in res.stderr.splitlines() if "SC_MULTILINE" in x]
    assert len(problem) == 1 and "may not contain a newline" in problem[0], res.stderr
    assert "line two" not in res.stderr
    assert accepted(testbed) == conns


# --- 9: the dry run changes nothing ------------------------------------------------------------


def test_dry_run_on_bare_cluster_prints_plan_changes_nothing(testbed, sc):
    from sparkcluster.config import inventory, profile
    from sparkcluster.config.flags import engine_host, supervised_argv

    assert sc("down").returncode == 0
    before = states(testbed)
    res = sc("up", "--profile", "testbed-standin", "--dry-run", timeout=120)
    assert res.returncode == 0, res.stderr
    headers = [line for line in res.stdout.splitlines() if re.fullmatch(r"\[\w+\]", line)]
    out = " ".join(res.stdout.split())  # the plan's lines wrap at ~100 columns: their words, one line
    # every stage in order; image and weights only where something is missing (what earlier tests
    # left on the hosts decides)
    order = ["[preflight]", "[image]", "[weights]", "[containers]", "[ray]", "[probe]", "[serve]"]
    assert headers == [h for h in order if h in headers], out
    assert {"[preflight]", "[containers]", "[ray]", "[probe]", "[serve]"} <= set(headers), out
    flags = (
        "--gpus all --device=/dev/infiniband --device=/dev/kmsg:/dev/kmsg:r --cap-add=IPC_LOCK --cap-add=SYSLOG "
        "--ulimit memlock=-1:-1 --network host --ipc host"
    )  # the kernel log read-only with CAP_SYSLOG: the agents' kernel events (node/kernel_log)
    for name in ("sparkcluster-testbed-head", "sparkcluster-testbed-worker-spark-worker"):
        assert f"docker run -d --name {name} {flags} " in out, out
    inv, prof = inventory.load(testbed.inventory), profile.load_profile("testbed-standin")
    # listening where the inventory says: the head's control address by default (issue 70)
    host = engine_host(inv, prof)
    assert host == str(inv.head.control_ip)
    argv = shlex.join(supervised_argv(prof, port=inv.cluster.api_port, hf_cache=hf_cache(), host=host))
    assert argv.startswith("vllm serve sparkcluster/testbed-tiny") and " ".join(argv.split()) in out
    assert "(HF_TOKEN=******, VLLM_API_KEY=****** from a 0600 file)" in out
    no_secret(out, res.stderr)
    assert_unchanged(testbed, before)


# --- 20, 17, 18: one `up` of a hostile profile, a second `up` against the lock ----------------


@pytest.fixture(scope="module")
def hostile(testbed, sc, env_file, tmp_path_factory):
    """`up --profile testbed-hostile` on a bare cluster in the background (JSON logs, -vv), while
    the controller's and both hosts' `ps` are sampled and a second `up` runs into the lock."""
    d = tmp_path_factory.mktemp("hostile")
    profiles = hostile_profile_dir(d)
    env = {"SPARKCLUSTER_PROFILES": str(profiles)}
    for i in (1, 2):
        Path(f"{PWNED}-{i}").unlink(missing_ok=True)
    assert sc("down").returncode == 0
    full_env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "HF_TOKEN")}
    full_env.update(
        {"SPARKCLUSTER_ENV_FILE": str(env_file), "XDG_STATE_HOME": str(sc.state_dir), "COLUMNS": "200", **env}
    )
    out_path, err_path = d / "up.out", d / "up.err"
    seen: dict[str, list[str]] = {"controller": [], HEAD: [], WORKER: []}
    samples = {"controller": 0, HEAD: 0, WORKER: 0}
    second: dict = {}

    def run_second() -> None:
        t = time.monotonic()
        second["res"] = sc("up", "--profile", "testbed-hostile", env=env, timeout=60)
        second["seconds"] = time.monotonic() - t

    def sample(where: str, text: str) -> None:
        samples[where] += 1
        seen[where] += [line for line in text.splitlines() if API_KEY in line or HF_TOKEN in line]

    with out_path.open("w") as out, err_path.open("w") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [
                *CLI,
                "--inventory",
                str(testbed.inventory),
                "--log-format",
                "json",
                "-vv",
                "up",
                "--profile",
                "testbed-hostile",
            ],
            stdout=out,
            stderr=err,
            env=full_env,
        )
        thread = None
        last_remote = 0.0
        try:
            while proc.poll() is None:
                sample("controller", subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout)
                if time.monotonic() - last_remote > 0.5:
                    last_remote = time.monotonic()
                    for h in HOSTS:
                        sample(h, testbed.sh(h, "ps -eo args", check=False).stdout)
                if thread is None and time.monotonic() - t0 > 1.0:
                    holder = testbed.sh(HEAD, "cat /tmp/sparkcluster/testbed.holder.* 2>/dev/null", check=False).stdout
                    if f"pid {proc.pid} " in holder:  # the first run holds the lock
                        thread = threading.Thread(target=run_second)
                        thread.start()
                if time.monotonic() - t0 > 600:
                    proc.kill()
                    break
                time.sleep(0.1)
        finally:
            proc.wait()
            if thread is not None:
                thread.join()
    yield {
        "rc": proc.returncode,
        "pid": proc.pid,
        "stdout": out_path.read_text(),
        "stderr": err_path.read_text(),
        "second": second,
        "seen": seen,
        "samples": samples,
        "env": env,
    }
    sc("down")


def test_two_ups_at_once_second_fails_fast_naming_holder(testbed, sc, hostile):
    assert hostile["rc"] == 0, hostile["stdout"] + hostile["stderr"][-3000:]
    assert "serving 'testbed-tiny' with tensor parallel 2" in hostile["stdout"]
    assert hostile["second"], "the first up never showed as the lock holder"
    res, took = hostile["second"]["res"], hostile["second"]["seconds"]
    assert res.returncode == 1, res.stdout + res.stderr
    assert "cluster 'testbed' is locked by" in res.stderr and f"pid {hostile['pid']} " in res.stderr, res.stderr
    assert took < 10, took
    no_secret(res.stdout, res.stderr)
    # neither corrupted the other: one container per node, healthy, serving
    assert len(ours(testbed, HEAD)) == 1 and len(ours(testbed, WORKER)) == 1
    st = sc("status", env=hostile["env"])
    assert st.returncode == 0 and "healthy" in st.stdout, st.stdout + st.stderr


def test_secrets_never_visible(testbed, sc, hostile):
    assert hostile["rc"] == 0
    # ps on the controller and both hosts while `up` ran (sampled), and on the hosts now
    assert all(n > 5 for n in hostile["samples"].values()), hostile["samples"]
    assert hostile["seen"] == {"controller": [], HEAD: [], WORKER: []}
    for h in HOSTS:
        no_secret(testbed.sh(h, "ps -eo args").stdout)
        names = ours(testbed, h)
        inspect = testbed.sh(h, "docker inspect " + " ".join(names)).stdout
        cfg = json.loads(inspect)[0]["Config"]
        assert cfg["Env"] and cfg["Cmd"]
        no_secret(inspect)
    # the logs: JSON (-vv) of the first run, text (-vv) of an `up` again, the debug log, `logs`
    json_lines = [x for x in hostile["stderr"].splitlines() if x.startswith("{")]
    assert any(json.loads(x).get("event") == "ran" for x in json_lines)
    again = sc("-vv", "up", "--profile", "testbed-hostile", env=hostile["env"])
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr
    dry = sc("up", "--profile", "testbed-hostile", "--dry-run", env=hostile["env"])
    assert dry.returncode == 0, dry.stderr
    logs = sc("logs", "--node", HEAD, "--last", "50", env=hostile["env"])
    no_secret(
        hostile["stdout"],
        hostile["stderr"],
        again.stdout,
        again.stderr,
        dry.stdout,
        dry.stderr,
        logs.stdout,
        logs.stderr,
        "\n".join(debug_log_lines(sc)),
    )


def test_hostile_forwarded_value_arrives_byte_for_byte(testbed, sc, hostile):
    assert hostile["rc"] == 0
    for h in HOSTS:
        (name,) = ours(testbed, h)
        got = testbed.sh(h, f"docker exec {name} printenv SC_HOSTILE", text=False).stdout
        assert got == HOSTILE.encode() + b"\n", (h, got)
        # no shell interpreted it: neither on the host, nor in its container
        for i in (1, 2):
            assert testbed.sh(h, f"test -e {PWNED}-{i}", check=False).returncode == 1
            assert testbed.sh(h, f"docker exec {name} test -e {PWNED}-{i}", check=False).returncode == 1
    for i in (1, 2):
        assert not Path(f"{PWNED}-{i}").exists()
