"""The testbed is real: real sshd with strict host keys, real jumbo-frame links, real dockerd per
host with the production container flags, a real image copy and a real two-node Ray cluster.

These tests use paramiko and the testbed's own shell access, never sparkcluster.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid

import paramiko
import pytest

from tests.testbed.proc import run
from tests.testbed.testbed import (
    BASE_IMAGE,
    HCAS,
    HEAD,
    HOSTS,
    LAN_IF,
    NETDEVS,
    PROD_FLAGS,
    SPECS,
    WORKER,
    TestbedError,
)

pytestmark = pytest.mark.testbed
LABEL = "org.sparkcluster.testbed-test=1"


def _client(tb, host: str, known_hosts=None) -> paramiko.SSHClient:
    cfg = paramiko.SSHConfig.from_path(str(tb.ssh_config)).lookup(host)
    c = paramiko.SSHClient()
    c.load_host_keys(str(known_hosts or cfg["userknownhostsfile"]))
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.connect(
        cfg["hostname"],
        port=int(cfg.get("port", 22)),
        username=cfg["user"],
        key_filename=cfg["identityfile"][0],
        look_for_keys=False,
        allow_agent=False,
        timeout=10,
        banner_timeout=10,
        auth_timeout=10,
    )
    return c


def _run(c: paramiko.SSHClient, cmd: str) -> tuple[int, str]:
    _, out, _ = c.exec_command(cmd, timeout=30)
    text = out.read().decode()
    return out.channel.recv_exit_status(), text


@pytest.fixture
def containers(testbed):
    """Names of containers a test starts; all removed afterwards (only ours, by label)."""
    made: list[tuple[str, str]] = []
    yield made
    for host in HOSTS:
        testbed.remove_containers(host, label=LABEL)


def _name(prefix: str) -> str:
    return f"tbtest-{prefix}-{uuid.uuid4().hex[:6]}"


# ---------------------------------------------------------------- SSH
@pytest.mark.parametrize("host", HOSTS)
def test_paramiko_strict_host_keys(testbed, host):
    c = _client(testbed, host)
    try:
        rc, out = _run(
            c,
            "hostname; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,"
            "compute_cap --format=csv,noheader",
        )
        assert rc == 0
        lines = out.splitlines()
        assert lines[0] == host
        assert lines[1] == "NVIDIA GB10, 580.142, [N/A], [N/A], 12.1"
    finally:
        c.close()
    # an unknown host key is refused under RejectPolicy
    empty = testbed.dir / "empty_known_hosts"
    empty.write_text("")
    try:
        with pytest.raises(paramiko.SSHException):
            _client(testbed, host, known_hosts=empty).close()
    finally:
        empty.unlink()


def _dial(tb, host: str, path: str) -> str:
    """One HTTP request to the host's engine through `docker system dial-stdio` over SSH."""
    c = _client(tb, host)
    try:
        stdin, out, _ = c.exec_command("docker system dial-stdio", timeout=30)
        stdin.write(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        stdin.flush()
        # no half-close: an HTTP/1.0 answer ends with the daemon closing the connection. Closing our
        # side first lets Go's server cancel the request's context, and moby's /info then answers
        # 200 with `null` (its getInfo drops SystemInfo's error: moby api/server/router/system/
        # system_routes.go), which a loaded CI machine showed
        return out.read().decode(errors="replace")
    finally:
        c.close()


@pytest.mark.parametrize("host", HOSTS)
def test_docker_dial_stdio_over_ssh_reaches_that_hosts_daemon(testbed, host):
    """`docker system dial-stdio` in an SSH session talks to that host's own dockerd, an engine of
    Docker 28 that refuses clients below Docker 29.0-29.2's floor as those do (issue 50)."""
    too_old = _dial(testbed, host, "/v1.41/info")
    assert too_old.split("\r\n", 1)[0].split()[1] == "400", too_old[:200]
    assert "client version 1.41 is too old. Minimum supported API version is 1.44" in too_old
    version = json.loads(_dial(testbed, host, "/version").split("\r\n\r\n", 1)[1])
    assert int(version["Version"].split(".")[0]) >= 28 and version["MinAPIVersion"] == "1.44"
    raw = _dial(testbed, host, "/v1.44/info")
    assert raw.startswith("HTTP/1.0 200") or raw.startswith("HTTP/1.1 200"), raw[:200]
    info = json.loads(raw.split("\r\n\r\n", 1)[1])
    assert isinstance(info, dict) and info["Name"] == host, raw[:1500]
    assert info["DockerRootDir"] == "/var/lib/docker"
    # shaped like a Spark's: default runtime runc, the toolkit's nvidia runtime, its hook on PATH
    assert info["DefaultRuntime"] == "runc" and "nvidia" in info["Runtimes"]
    assert testbed.ssh(host, "command -v nvidia-container-runtime-hook").returncode == 0


def test_sshd_log_counts_connections(testbed):
    before = testbed.connections_logged(WORKER)
    for _ in range(2):
        _client(testbed, WORKER).close()
    assert testbed.connections_logged(WORKER) == before + 2


def test_openssh_config_and_password_refused(testbed):
    assert testbed.ssh(HEAD, "hostname").stdout.strip() == HEAD
    p = testbed.ssh(WORKER, "hostname")
    assert p.stdout.strip() == WORKER
    cfg = (testbed.host_dir(HEAD) / "sshd_config").read_text()
    assert "PasswordAuthentication no" in cfg and "KbdInteractiveAuthentication no" in cfg
    assert "Accepted publickey" in testbed.sshd_log(HEAD).read_text()


def test_ssh_user_is_an_ordinary_docker_member_and_root_may_not_log_in(testbed):
    """As on a Spark: sparkcluster's SSH user is the account the facts file names (uid, own home,
    in `docker`, no sudo); root login is refused; the Docker socket is the docker group's."""
    acct = json.loads(testbed.facts_file.read_text())
    for h in (HEAD, WORKER):
        got = testbed.ssh(
            h,
            'id -un; id -u; id -Gn; printf "%s\\n" "$HOME"; stat -c "%G %a" /run/docker.sock; '
            'docker version --format "{{.Server.Version}}" >/dev/null && echo docker-ok; '
            "sudo -n true 2>/dev/null && echo SUDO || echo no-sudo",
        ).stdout.splitlines()
        assert got[0] == acct["ssh_user"] and got[1] == str(acct["uid"]) and got[3] == acct["home"], got
        assert "docker" in got[2].split() and got[4] == "docker 660", got
        assert got[5:] == ["docker-ok", "no-sudo"], got
        assert "PermitRootLogin no" in (testbed.host_dir(h) / "sshd_config").read_text()
        spec = SPECS[h]
        p = run(
            [
                "ssh",
                "-o",
                "BatchMode=yes",
                "-o",
                f"UserKnownHostsFile={testbed.known_hosts}",
                "-o",
                "StrictHostKeyChecking=yes",
                "-i",
                str(testbed.identity),
                "-o",
                "IdentitiesOnly=yes",
                f"root@{spec.lan_ip}",
                "true",
            ],
            check=False,
            timeout=30,
        )
        assert p.returncode == 255 and "Permission denied" in p.stderr, p.stderr


# ---------------------------------------------------------------- hosts are separate machines
def test_hosts_are_isolated(testbed):
    ids = {}
    for h in HOSTS:
        out = testbed.sh(
            h,
            "hostname; ps -e -o comm= | sort -u | tr '\\n' ' '; echo; "
            "docker info --format '{{.ID}} {{.DockerRootDir}}'; df -P /var/lib/docker | tail -1",
        ).stdout
        lines = out.splitlines()
        assert lines[0] == h
        assert "dockerd" in lines[1] and "sshd" in lines[1]
        ids[h] = lines[2].split()[0]
        assert lines[3].split()[0].startswith("/dev/loop") or lines[3].startswith("tb-docker")
        # PID namespace: pid 1 is the host's own init, not the machine's
        assert testbed.sh(h, "cat /proc/1/cmdline | tr '\\0' ' '").stdout.split()[0].endswith("python3")
    assert ids[HEAD] != ids[WORKER]
    marker = f"/run/tbtest-{uuid.uuid4().hex[:6]}"
    testbed.sh(HEAD, f"touch {marker}")
    try:
        assert testbed.sh(WORKER, f"test -e {marker}", check=False).returncode != 0
    finally:
        testbed.sh(HEAD, f"rm -f {marker}")
    # the controller has no GPU stand-in on its PATH and no route into the data plane
    import shutil

    assert shutil.which("nvidia-smi") is None


def test_fake_hcas_and_devices(testbed):
    # default cabling (issue 17): one cable on port 1; port 0's HCAs DOWN, its netdevs admin-down
    from tests.testbed import cabling

    mode = testbed.cabling
    for h in HOSTS:
        out = testbed.sh(
            h,
            "for d in /sys/class/infiniband/*; do echo ${d##*/} $(cat $d/ports/1/state | tr -d ' ') "
            "$(cat $d/ports/1/link_layer) $(ls $d/device/net); done",
        ).stdout.split("\n")
        rows = {line.split()[0]: line.split()[1:] for line in out if line.strip()}
        for k, (hca, nd) in enumerate(zip(HCAS, NETDEVS)):
            want = "4:ACTIVE" if cabling.cabled(mode, k) else "1:DOWN"
            assert rows[hca] == [want, "Ethernet", nd]
        # the RoCE v2 IPv4 GID of each addressed twin at index 3
        assert (
            testbed.sh(h, "cat /sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/3").stdout.strip() == "RoCE v2"
        )
        assert testbed.sh(
            h, "cat /sys/class/infiniband/rocep1s0f1/ports/1/gids/3"
        ).stdout.strip() == cabling.mapped_gid(SPECS[h].control_ip)
        dev = testbed.sh(h, "stat -c '%n %t %T' /dev/infiniband/uverbs*").stdout.split("\n")
        assert [line.split()[1:] for line in dev if line] == [["e7", f"{192 + i:x}"] for i in range(4)]
        assert testbed.sh(h, "cat /sys/class/net/enp1s0f1np1/mtu").stdout.strip() == "9000"
        assert testbed.sh(h, "cat /sys/class/net/enp1s0f1np1/speed").stdout.strip() == "200000"
        assert "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)" in testbed.ssh(h, "ibdev2netdev").stdout


# ---------------------------------------------------------------- data plane
def _ping(tb, host, ifname, peer, size=8972):
    return tb.sh(host, f"ping -M do -s {size} -c 1 -W 2 -I {ifname} {peer}", check=False, timeout=20)


def test_jumbo_frames_on_every_link_then_mtu_break(testbed):
    from tests.testbed import cabling

    wnd = testbed.worker_netdevs()
    for k, nd in enumerate(NETDEVS):
        if not cabling.cabled(testbed.cabling, k):
            continue  # no cable in that port in this mode
        head_ip, worker_ip = SPECS[HEAD].dp_ips[k], SPECS[WORKER].dp_ips[k]
        assert _ping(testbed, HEAD, nd, worker_ip).returncode == 0, f"head {nd} -> {worker_ip}"
        assert _ping(testbed, WORKER, wnd[k], head_ip).returncode == 0, f"worker {wnd[k]} -> {head_ip}"
    # one end at 1500: the 9000-byte path no longer works
    nd = NETDEVS[1]
    testbed.set_mtu(WORKER, wnd[1], 1500)
    try:
        assert testbed.get_mtu(WORKER, wnd[1]) == 1500
        assert _ping(testbed, HEAD, nd, SPECS[WORKER].dp_ips[1]).returncode != 0
        assert _ping(testbed, WORKER, wnd[1], SPECS[HEAD].dp_ips[1]).returncode != 0
        assert _ping(testbed, HEAD, nd, SPECS[WORKER].dp_ips[1], size=1472).returncode == 0
    finally:
        testbed.set_mtu(WORKER, wnd[1], 9000)
    assert _ping(testbed, HEAD, nd, SPECS[WORKER].dp_ips[1]).returncode == 0


def test_hosts_cannot_reach_each_other_over_the_lan(testbed):
    # the controller does not forward: hosts reach each other only over the data plane
    assert testbed.sh(HEAD, f"ping -c 1 -W 1 {SPECS[WORKER].lan_ip}", check=False, timeout=10).returncode != 0
    assert testbed.sh(HEAD, f"ping -c 1 -W 1 {SPECS[HEAD].ctl_ip}", check=False, timeout=10).returncode == 0
    # and nothing leaves the machine
    assert testbed.sh(HEAD, "ping -c 1 -W 1 1.1.1.1", check=False, timeout=10).returncode != 0
    assert open("/proc/sys/net/ipv4/ip_forward").read().strip() == "0"


def test_default_route_trap_is_reproduced(testbed):
    """Without VLLM_HOST_IP, vLLM takes the default-route interface's IP: the LAN, not the control plane."""
    probe = (
        "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        "s.connect(('8.8.8.8', 80)); print(s.getsockname()[0])"
    )
    for h in HOSTS:
        out = testbed.sh(h, f"python3 -c {shlex.quote(probe)}").stdout.strip()
        assert out == SPECS[h].lan_ip != SPECS[h].control_ip
        # docker's bridge is there too, as on a Spark
        assert "172.17.0.1" in testbed.sh(h, "ip -4 -br addr show docker0").stdout


# ---------------------------------------------------------------- containers with the production flags
@pytest.mark.long  # `make test-long`: CI's 50 minutes cannot also hold it (tests/README.md)
def test_production_container_sees_hardware(testbed, containers):
    testbed.ray_image()  # puts an image on the worker too (the NGC stand-in lives on the head only)
    from tests.testbed.testbed import RAY_IMAGE

    for h in HOSTS:
        image = BASE_IMAGE if h == HEAD else RAY_IMAGE
        name = _name("hw")
        p = testbed.docker(
            h,
            f"run --rm --name {name} --label {LABEL} {PROD_FLAGS} {image} bash -c "
            + shlex.quote(
                "hostname; ls /sys/class/net | tr '\\n' ' '; echo; "
                "cat /sys/class/infiniband/rocep1s0f1/ports/1/state; "
                "ls /sys/class/infiniband/rocep1s0f1/device/net; "
                "ls /dev/infiniband | tr '\\n' ' '; echo; "
                "nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader; "
                "ulimit -l; cat /sys/class/net/enp1s0f1np1/mtu"
            ),
        )
        lines = p.stdout.splitlines()
        # the image's entrypoint prints NGC's driver banner first (580.142 against a 595 build), as on a Spark
        assert h in lines, p.stdout
        lines = lines[lines.index(h) :]
        for nd in NETDEVS:
            assert nd in lines[1].split()
        assert lines[2] == "4: ACTIVE"
        assert lines[3] == "enp1s0f1np1"
        assert set(lines[4].split()) >= {"uverbs0", "uverbs1", "uverbs2", "uverbs3", "rdma_cm"}
        assert lines[5] == "NVIDIA GB10, 12.1"
        assert lines[7] == "9000"
        # docker inspect still shows what was asked
        name2 = _name("inspect")
        testbed.docker(h, f"run -d --name {name2} --label {LABEL} {PROD_FLAGS} {image} sleep 60")
        info = json.loads(testbed.docker(h, f"inspect {name2}").stdout)[0]["HostConfig"]
        assert [u for u in info["Ulimits"] if u["Name"] == "memlock"][0]["Hard"] == -1
        assert info["NetworkMode"] == "host" and info["IpcMode"] == "host"
        assert {"IPC_LOCK", "CAP_IPC_LOCK"} & set(info["CapAdd"])
        assert info["DeviceRequests"][0]["Count"] == -1
        assert info["Devices"][0]["PathOnHost"] == "/dev/infiniband"
    # without --gpus / --device the stand-ins are not injected, as on a real Spark
    p = testbed.docker(
        HEAD,
        f"run --rm --label {LABEL} --network host {BASE_IMAGE} bash -c "
        "'command -v nvidia-smi || echo none; ls /sys/class/infiniband 2>/dev/null || echo noib'",
    )
    assert p.stdout.split() == ["none", "noib"]


# ---------------------------------------------------------------- images and Ray
def test_ray_image_built_on_head_and_copied(testbed):
    from tests.testbed.testbed import RAY_IMAGE, RAY_VERSION

    tag = testbed.ray_image()
    assert tag == RAY_IMAGE
    ids = {h: testbed.image_id(h, tag) for h in HOSTS}
    assert ids[HEAD] and ids[HEAD] == ids[WORKER]
    label = testbed.docker(
        HEAD, f"image inspect --format '{{{{index .Config.Labels \"org.sparkcluster.ray-version\"}}}}' {tag}"
    )
    assert label.stdout.strip() == RAY_VERSION
    for h in HOSTS:
        out = testbed.docker(h, f"run --rm --network none {tag} ray --version").stdout
        assert RAY_VERSION in out
    # the NGC stand-in is imported on the head only (anything on the worker was shipped there)
    assert testbed.image_id(HEAD, BASE_IMAGE)


def test_two_node_ray_cluster_over_the_data_plane(testbed, containers):
    tag = testbed.ray_image()
    head_ip, worker_ip = SPECS[HEAD].control_ip, SPECS[WORKER].control_ip
    hn, wn = _name("rayhead"), _name("rayworker")
    common = f"-d --label {LABEL} {PROD_FLAGS} -e RAY_memory_usage_threshold=1.0 {tag}"
    testbed.docker(
        HEAD,
        f"run --name {hn} {common} ray start --head --node-ip-address {head_ip} --num-gpus 1 "
        "--disable-usage-stats --include-dashboard=false --block",
    )
    testbed.docker(
        WORKER,
        f"run --name {wn} {common} ray start --address {head_ip}:6379 "
        f"--node-ip-address {worker_ip} --num-gpus 1 --disable-usage-stats --block",
    )
    probe = (
        "import json, ray; ray.init(address='auto', logging_level='ERROR'); "
        "n=[x for x in ray.nodes() if x['Alive']]; "
        "print(json.dumps({'nodes': sorted(x['NodeManagerAddress'] for x in n), "
        "'gpus': ray.cluster_resources().get('GPU', 0)}))"
    )
    deadline = time.monotonic() + 120
    last = None
    while time.monotonic() < deadline:
        p = testbed.docker(HEAD, f"exec {hn} python3 -c {shlex.quote(probe)}", check=False, timeout=60)
        if p.returncode == 0 and p.stdout.strip():
            last = json.loads(p.stdout.strip().splitlines()[-1])
            if len(last["nodes"]) == 2:
                break
        for c, h in ((hn, HEAD), (wn, WORKER)):
            state = testbed.docker(h, f"inspect --format '{{{{.State.Running}}}}' {c}").stdout.strip()
            assert state == "true", testbed.docker(h, f"logs --tail 50 {c}", check=False).stderr
        time.sleep(2)
    assert last == {"nodes": [head_ip, worker_ip], "gpus": 2.0}, last
    # `ray status` (the autoscaler's view) catches up a few seconds later
    for _ in range(30):
        status = testbed.docker(HEAD, f"exec {hn} ray status", timeout=60).stdout
        if "/2.0 GPU" in status:
            break
        time.sleep(1)
    assert "/2.0 GPU" in status, status


# ---------------------------------------------------------------- knobs break things and undo them
def test_knobs_break_and_restore(testbed):
    # HCA port state
    testbed.set_hca_state(WORKER, "roceP2p1s0f1", "1: DOWN")
    try:
        assert testbed.sh(WORKER, "cat /sys/class/infiniband/roceP2p1s0f1/ports/1/state").stdout.strip() == "1: DOWN"
    finally:
        testbed.set_hca_state(WORKER, "roceP2p1s0f1", "4: ACTIVE")
    # driver version differs between hosts
    testbed.set_driver_version(WORKER, "570.10.01")
    try:
        out = testbed.sh(WORKER, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.strip()
        assert out == "570.10.01"
        assert "580.142" in testbed.sh(HEAD, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout
    finally:
        testbed.set_driver_version(WORKER)
    # data-plane link down / up (link 4: cabled in every mode)
    assert _ping(testbed, WORKER, testbed.worker_netdevs()[3], SPECS[HEAD].dp_ips[3], 56).returncode == 0
    testbed.link_down(HEAD, "enP2p1s0f1np1")
    try:
        assert testbed.sh(HEAD, "cat /sys/class/net/enP2p1s0f1np1/operstate").stdout.strip() == "down"
        assert _ping(testbed, WORKER, testbed.worker_netdevs()[3], SPECS[HEAD].dp_ips[3], 56).returncode != 0
    finally:
        testbed.link_up(HEAD, "enP2p1s0f1np1")
    # disk nearly full, then freed
    testbed.fill_disk(WORKER, 200)
    try:
        assert 100 <= testbed.disk_free_mb(WORKER) <= 300
    finally:
        testbed.unfill_disk(WORKER)
    assert testbed.disk_free_mb(WORKER) > 5000
    # a foreign process holds a port
    with testbed.hold_port(HEAD, 6379):
        out = testbed.sh(
            HEAD, "ss -Hltnp 'sport = :6379' 2>/dev/null || netstat -ltnp 2>/dev/null | grep :6379", check=False
        ).stdout
        assert "6379" in out and "python3" in out
    assert "6379" not in testbed.sh(HEAD, "ss -Hltn 'sport = :6379'", check=False).stdout


def test_knob_rewire_worker(testbed):
    inv0 = testbed.inventory.read_text()
    path = testbed.cable_worker(crossed=True)
    try:
        from sparkcluster.config import inventory

        inv = inventory.load(path)
        w = inv.node(WORKER)
        assert w.control_if == "enP2p1s0f1np1" and str(w.control_ip) == "198.19.2.2"
        # one cable on port 1 (default cabling): head links 2 and 4 end at the worker's swapped twins
        assert w.netdevs == ["enP2p1s0f1np1", "enp1s0f1np1"]
        assert w.hcas == ["roceP2p1s0f1", "rocep1s0f1"]
        assert inv.head.netdevs == ["enp1s0f1np1", "enP2p1s0f1np1"]
        assert testbed.sh(WORKER, "ip -br -4 addr show enP2p1s0f1np1").stdout.split()[2] == "198.19.2.2/24"
        assert _ping(testbed, HEAD, "enp1s0f1np1", "198.19.2.2").returncode == 0
        assert testbed.sh(WORKER, "cat /sys/class/net/enP2p1s0f1np1/speed").stdout.strip() == "200000"
    finally:
        testbed.cable_worker(crossed=False)
    assert testbed.inventory.read_text() == inv0
    assert testbed.sh(WORKER, "ip -br -4 addr show enp1s0f1np1").stdout.split()[2] == "198.19.2.2/24"


def test_knob_host_key_replaced(testbed):
    testbed.replace_host_key(WORKER)
    try:
        with pytest.raises(paramiko.SSHException):
            _client(testbed, WORKER).close()
        assert testbed.ssh(WORKER, "true", check=False).returncode != 0
    finally:
        testbed.restore_host_key(WORKER)
    _client(testbed, WORKER).close()


def test_knob_sshd_and_dockerd_stop_start(testbed):
    testbed.stop_sshd(WORKER)
    try:
        with pytest.raises((OSError, paramiko.SSHException)):
            _client(testbed, WORKER).close()
    finally:
        testbed.start_sshd(WORKER)
    _client(testbed, WORKER).close()
    testbed.stop_dockerd(WORKER)
    try:
        assert testbed.sh(WORKER, "docker info", check=False, timeout=30).returncode != 0
    finally:
        testbed.start_dockerd(WORKER)
    assert testbed.sh(WORKER, "docker info --format '{{.ServerVersion}}'").returncode == 0


def test_knob_lan_unplugged(testbed):
    testbed.lan_down(WORKER)
    try:
        with pytest.raises(OSError):
            _client(testbed, WORKER).close()
    finally:
        testbed.lan_up(WORKER)
    _client(testbed, WORKER).close()


def test_knob_kill_container(testbed, containers):
    name = _name("kill")
    testbed.docker(HEAD, f"run -d --name {name} --label {LABEL} {BASE_IMAGE} sleep 600")
    testbed.kill_container(HEAD, name)
    for _ in range(50):
        st = testbed.docker(
            HEAD, f"inspect --format '{{{{.State.Running}}}} {{{{.State.ExitCode}}}}' {name}"
        ).stdout.split()
        if st[0] == "false":
            break
        time.sleep(0.1)
    assert st == ["false", "137"]


def test_sh_reports_failures(testbed):
    with pytest.raises(TestbedError):
        testbed.sh(HEAD, "exit 3")
    assert testbed.sh(HEAD, "exit 3", check=False).returncode == 3
    assert LAN_IF in testbed.sh(HEAD, "ip -br link").stdout


# ---------------------------------------------------------------- cabling modes (issue 17)
def test_cabling_modes_switch_and_reset(testbed):
    from sparkcluster.config import inventory
    from tests.testbed import cabling

    try:
        path = testbed.set_cabling("two-cables@9216")
        inv = inventory.load(path)
        assert inv.head.netdevs == list(NETDEVS) and inv.head.mtu == 9216
        for k, nd in enumerate(NETDEVS):
            assert _ping(testbed, HEAD, nd, SPECS[WORKER].dp_ips[k], 9216 - 28).returncode == 0, nd
        testbed.set_cabling("twin-no-ipv4")
        assert testbed.sh(WORKER, "ip -4 -o addr show dev enP2p1s0f1np1").stdout.strip() == ""
        assert testbed.sh(WORKER, "cat /sys/class/net/enP2p1s0f1np1/operstate").stdout.strip() == "up"
        assert testbed.sh(WORKER, "ls /sys/class/infiniband/roceP2p1s0f1/ports/1/gid_attrs/types").stdout.split() == [
            "0",
            "1",
        ]
        testbed.set_cabling("link-local")
        assert "169.254.2.1/16" in testbed.sh(HEAD, "ip -4 -o addr show dev enp1s0f1np1").stdout
    finally:
        testbed.reset()
    import os

    assert testbed.cabling == cabling.parse(os.environ.get(cabling.ENV))
    assert testbed.sh(HEAD, "cat /sys/class/net/enp1s0f0np0/operstate").stdout.strip() == "down"
    assert "198.19.2.1/24" in testbed.sh(HEAD, "ip -4 -o addr show dev enp1s0f1np1").stdout


def test_third_machine_knob(testbed):
    try:
        third = testbed.plug_third(HEAD, "enp1s0f0np0")
        assert _ping(testbed, HEAD, "enp1s0f0np0", third, 56).returncode == 0
        assert testbed.sh(HEAD, "cat /sys/class/infiniband/rocep1s0f0/ports/1/state").stdout.strip() == "4: ACTIVE"
        # the worker's end of that link has no cable now
        assert testbed.sh(WORKER, "cat /sys/class/net/enp1s0f0np0/carrier", check=False).stdout.strip() in ("0", "")
    finally:
        testbed.unplug_third()
    import subprocess

    from tests.testbed import cabling

    assert cabling.THIRD_NS not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert testbed.sh(HEAD, "cat /sys/class/infiniband/rocep1s0f0/ports/1/state").stdout.strip() == "1: DOWN"
    # the pair's veth for that link is back, renamed as before and (no cable in this mode) down
    assert testbed.sh(WORKER, "cat /sys/class/net/enp1s0f0np0/operstate").stdout.strip() == "down"


def _fidelity_rows() -> dict[str, str]:
    """tests/testbed/README.md's fidelity table: row name -> the testbed host's cell."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "testbed" / "README.md").read_text()
    table = text.split("## How a testbed host differs from a DGX Spark", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("what", "---"):
            rows[cells[0]] = cells[2]
    return rows


def _release(version: str) -> str:
    """The numeric release of a version string: "28.5.2+dfsg4" -> "28.5.2"."""
    import re

    return re.match(r"[0-9]+(\.[0-9]+)*", version).group(0)


def test_fidelity_table_is_what_the_testbed_runs(testbed):
    """Each row of the testbed's fidelity table that names a version says what the head runs."""
    rows = _fidelity_rows()
    sh = lambda cmd: testbed.sh(HEAD, cmd).stdout.strip()  # noqa: E731
    os_name = sh('. /etc/os-release && echo "$PRETTY_NAME"')
    assert os_name in rows["OS"]
    server = json.loads(sh("docker version --format '{{json .Server}}'"))
    assert _release(server["Version"]) in rows["Docker Engine"]
    assert f"DOCKER_MIN_API_VERSION={server['MinAPIVersion']}" in rows["Docker Engine"]
    parts = {c["Name"]: c["Version"] for c in server["Components"]}
    assert _release(parts["containerd"]) in rows["containerd"]
    assert _release(parts["runc"]) in rows["runc"]
    info = json.loads(sh("docker info --format '{{json .}}'"))
    assert f"v{info['CgroupVersion']} ({info['CgroupDriver']})" in rows["cgroup"]
    assert info["Driver"] in rows["image store"]
    assert not any("apparmor" in o for o in info["SecurityOptions"]) and rows["AppArmor"] == "none"
    name, driver = sh("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader").split(", ")
    assert driver in rows["driver"]
    assert name in rows["GPU"]
