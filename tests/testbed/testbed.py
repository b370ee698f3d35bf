"""Two simulated DGX Sparks on one Linux machine: `spark-head` and `spark-worker`.

Each host is its own network, mount, UTS, IPC and PID namespace around a small init process, with
its own sshd (key auth only) on a LAN veth from the controller (the root namespace), its own dockerd
(own data root on a loop-mounted ext4, own containerd, private /run), four point-to-point data-plane
veths to the other host named as on a Spark (MTU 9000), and stand-ins only for what this machine
physically lacks: the GB10 (nvidia-smi, the --gpus hook), the RoCE HCAs (sysfs + /dev/infiniband),
the NGC image (a locally built Debian base carrying the vLLM stand-in). A pip mirror on the
controller's LAN address serves the Ray wheels to the head's `docker build`.

sparkcluster never learns about any of this: it gets an inventory, an ssh_config and a known_hosts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import artifacts, cabling, delay, hub
from .artifacts import (
    BASE_IMAGE,
    CACHE,
    RAY_IMAGE,
    RAY_VERSION,
    ROOTFS_IMAGE,
    ROOTFS_TAR,
    STANDIN_IMAGE,
    TINY_MODEL,
    VLLM_VERSION,
)
from .proc import TestbedError, log, run

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
STATE = Path(os.environ.get("SPARKCLUSTER_TESTBED_DIR", REPO / ".testbed"))
BIN = HERE / "standin_bin"
KMSG = "/run/testbed/kmsg"  # each host's kernel-log stand-in (its private /run; standin_bin/testbed-runc)

# the API floor of Docker Engine 29.0-29.2, which refuse older clients ("client version 1.41 is too old.
# Minimum supported API version is 1.44": docker/docs#23910, containrrr/watchtower#2124); 29.3 lowered it
MIN_API_VERSION = "1.44"
HEAD, WORKER = "spark-head", "spark-worker"
HOSTS = (HEAD, WORKER)  # the pair: what every suite but the N-node one runs on
# `make testbed-up HOSTS=N` (issue 27): N hosts, 2 by default; beyond the pair every data-plane link
# goes through a switch (a bridge per link in a namespace of its own), as a rail of a Spark switch does
HOSTS_ENV = "SPARKCLUSTER_TESTBED_HOSTS"
MAX_HOSTS = 8
SWITCH_NS = "sctb-switch"


def host_names(n: int) -> tuple[str, ...]:
    """The testbed's hosts when it has `n`: the pair, then spark-worker-3 .. spark-worker-N."""
    return (HEAD, WORKER, *(f"spark-worker-{i}" for i in range(3, n + 1)))


def hosts_wanted() -> int:
    """How many hosts a bring-up makes ($SPARKCLUSTER_TESTBED_HOSTS, default 2)."""
    raw = os.environ.get(HOSTS_ENV, "").strip() or "2"
    if not raw.isdigit() or not 2 <= int(raw) <= MAX_HOSTS:
        raise TestbedError(f"{HOSTS_ENV}={raw!r}: the testbed has 2 to {MAX_HOSTS} hosts")
    return int(raw)


ALL_HOSTS = host_names(MAX_HOSTS)  # what teardown looks for, whatever a bring-up made
# the SSH user on both hosts, as on a Spark: an ordinary account in `docker` (user-setup.sh); tests
# read who it is from the facts file (`ssh_account()`), never from here
SSH_USER, SSH_UID = "spark", 1000
LAN_IF = "enP7s7"  # a Spark's 10GbE port; the host side of its LAN veth
NETDEVS = cabling.NETDEVS  # ("enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1")
HCAS = cabling.HCAS  # ("rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1")
HCA_OF = cabling.HCA_OF
# worker netdev at the far end of head link k when the cables sit in other ports
CROSSED = ("enP2p1s0f0np0", "enP2p1s0f1np1", "enp1s0f0np0", "enp1s0f1np1")
CONTROL_LINK = cabling.CONTROL_LINK  # index into NETDEVS: enp1s0f1np1, 198.19.2.0/24
MTU = 9000
# DGX OS 7.5's driver (eugr/spark-vllm-docker#266 quotes NVIDIA's DGX Spark release notes: "NVIDIA GPU
# Driver now is 580.142"; NVIDIA/NemoClaw#4658: a Spark at 580.142)
DRIVER = "580.142"
MIRROR_PORT = 3141
TESTBED_NET = "198.18.0.0/15"  # RFC 2544 benchmarking range; everything the testbed uses
DISK_GB = 12
SYS_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# production container flags (seed 002)
PROD_FLAGS = (
    "--gpus all --device=/dev/infiniband --cap-add=IPC_LOCK --ulimit memlock=-1:-1 "
    "--network host --ipc host --shm-size 1g"
)


# `doctor --fabric` on the testbed: gloo over veths between namespaces on two shared cores (no GPU, no
# NCCL), a few hundred MB/s; the field's figures are a real pair's RDMA. Sizes up to 64 MiB keep the
# test within 30 s on two cores.
FABRIC_LINES = ["[fabric]", "healthy_gbps = 0.1", "floor_gbps = 0.04", f"max_bytes = {64 << 20}", "timeout_s = 30"]


@dataclass(frozen=True)
class HostSpec:
    name: str
    role: str
    ctl_if: str  # controller side of the LAN veth
    ctl_ip: str
    lan_ip: str
    octet: int  # data plane: 198.19.k.<octet>

    @property
    def dp_ips(self) -> list[str]:
        return [f"198.19.{k + 1}.{self.octet}" for k in range(len(NETDEVS))]

    @property
    def control_ip(self) -> str:
        return self.dp_ips[CONTROL_LINK]


SPECS = {
    HEAD: HostSpec(HEAD, "head", "sctb-head", "198.18.0.1", "198.18.0.2", 1),
    WORKER: HostSpec(WORKER, "worker", "sctb-worker", "198.18.0.5", "198.18.0.6", 2),
    **{
        h: HostSpec(h, "worker", f"sctb-w{i + 1}", f"198.18.0.{4 * i + 1}", f"198.18.0.{4 * i + 2}", i + 1)
        for i, h in enumerate(ALL_HOSTS)
        if i >= 2
    },
}
MIRROR_IP = SPECS[HEAD].ctl_ip
PIP_INDEX_URL = f"http://{MIRROR_IP}:{MIRROR_PORT}/simple"


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def preflight() -> str | None:
    """Why the testbed cannot run here, or None."""
    if os.geteuid() != 0:
        return "the testbed needs root (network/mount/PID namespaces, its own dockerd)"
    for tool in ("unshare", "nsenter", "ip", "sshd", "dockerd", "runc", "containerd", "ssh-keygen", "debootstrap"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} is missing (run `make deps`)"
    p = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount", "--uts", "true"], capture_output=True, text=True
    )
    if p.returncode != 0:
        return f"cannot create namespaces here: {p.stderr.strip()}"
    return None


class PortHolder:
    """A non-sparkcluster process holding a TCP port on a host; release() ends it."""

    def __init__(self, tb: Testbed, host: str, port: int, addr: str = "0.0.0.0"):
        self.tb, self.host, self.port = tb, host, port
        code = (
            "import socket,time,os;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
            f"s.bind(({addr!r},{port}));s.listen(16);print(os.getpid(),flush=True);time.sleep(10**9)"
        )
        self.proc = subprocess.Popen(
            tb.nsenter_argv(host) + ["python3", "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        line = self.proc.stdout.readline().strip()
        if not line:
            raise TestbedError(f"could not hold port {port} on {host}: {self.proc.stderr.read()}")
        self.pid_in_host = int(line)

    def release(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Testbed:
    """Build, inspect, break and tear down the two-host testbed. State lives in `.testbed/`."""

    __test__ = False  # not a pytest class

    def __init__(self, state_dir: Path = STATE):
        self.dir = Path(state_dir)
        self.built_here = False

    # ---------------------------------------------------------------- paths
    @property
    def hosts(self) -> tuple[str, ...]:
        """This testbed's hosts: as many as its bring-up made (the pair unless HOSTS=N said more)."""
        n = self._state().get("n_hosts") if self.state_file.exists() else None
        return host_names(n or hosts_wanted())

    @property
    def facts_file(self) -> Path:
        """Who the testbed's SSH user is (ssh_user, uid, gid, home, hf_cache): tests read it."""
        return self.dir / "facts.json"

    @property
    def ssh_config(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def identity(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def inventory(self) -> Path:
        return self.dir / "cluster.toml"

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def host_dir(self, host: str) -> Path:
        return self.dir / "hosts" / host

    def sshd_log(self, host: str) -> Path:
        return self.host_dir(host) / "sshd.log"

    def dockerd_log(self, host: str) -> Path:
        return self.host_dir(host) / "dockerd.log"

    # ---------------------------------------------------------------- state
    def _state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, st: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=2))
        tmp.replace(self.state_file)

    def _update(self, **kw) -> dict:
        st = self._state()
        st.update(kw)
        self._save(st)
        return st

    def pid(self, host: str) -> int:
        pid = self._state().get("hosts", {}).get(host, {}).get("init_pid")
        if not _alive(pid):
            raise TestbedError(f"testbed host {host} is not running (no live init process)")
        return pid

    @contextlib.contextmanager
    def _lock(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # ---------------------------------------------------------------- running things on a host
    def nsenter_argv(self, host: str) -> list[str]:
        return [
            "nsenter",
            "-t",
            str(self.pid(host)),
            "-n",
            "-m",
            "-u",
            "-i",
            "-p",
            "--",
            "env",
            "-i",
            f"PATH={HOST_PATH}",
            "HOME=/root",
            "LANG=C.UTF-8",
            "USER=root",
            "LOGNAME=root",
            f"HOSTNAME={host}",
        ]

    def sh(
        self, host: str, cmd: str, check: bool = True, input=None, timeout: float | None = 300, text: bool = True
    ) -> subprocess.CompletedProcess:
        """Run a shell command "on the host" (its namespaces), independent of sshd and sparkcluster."""
        argv = self.nsenter_argv(host) + ["bash", "-c", cmd]
        p = subprocess.run(argv, input=input, timeout=timeout, capture_output=True, text=text, cwd="/")
        if check and p.returncode != 0:
            raise TestbedError(
                f"[{host}] command failed ({p.returncode}): {cmd}\n"
                f"stdout: {(p.stdout or '')[-3000:]}\nstderr: {(p.stderr or '')[-3000:]}"
            )
        return p

    def docker(self, host: str, args: str, check: bool = True, timeout: float | None = 600):
        return self.sh(host, f"docker {args}", check=check, timeout=timeout)

    def ssh_argv(self, host: str) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", host]

    def ssh(self, host: str, cmd: str, check: bool = True, timeout: float = 60):
        """Through the real sshd, as sparkcluster would (OpenSSH client, strict host keys)."""
        return run(self.ssh_argv(host) + [cmd], check=check, timeout=timeout)

    # ---------------------------------------------------------------- up
    def up(self) -> Testbed:
        """Bring the testbed up, or reuse a healthy one; refuse on a half-broken one."""
        err = preflight()
        if err:
            raise TestbedError(err)
        with self._lock():
            st = self._state()
            if st:
                problems = self.problems()
                if not problems:
                    log("testbed is already up and healthy; reusing it")
                    return self
                raise TestbedError(
                    "a testbed is already up but unhealthy:\n  "
                    + "\n  ".join(problems)
                    + "\nrun `make testbed-down` (python -m tests.testbed down) first"
                )
            if self._leftovers():
                raise TestbedError(
                    "leftovers of an earlier testbed exist ("
                    + ", ".join(self._leftovers())
                    + "); run `make testbed-down` first"
                )
            t0 = time.monotonic()
            self._save(
                {
                    "phase": "starting",
                    "hosts": {},
                    "created_dirs": [],
                    "started": time.time(),
                    "n_hosts": hosts_wanted(),
                }
            )
            try:
                self._build()
            except BaseException:
                log("bring-up failed; tearing down what was started")
                self._down()
                raise
            self._update(phase="up", up_seconds=round(time.monotonic() - t0, 1))
            self.built_here = True
            log(f"testbed up in {time.monotonic() - t0:.1f}s")
        return self

    def _build(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        prep = self._prepare_caches_async()
        self._keys()
        for h in self.hosts:
            self._start_host(h)
        self._network()
        for h in self.hosts:
            self._setup_host(h)
        for h in self.hosts:
            self._apply_cabling(h)  # needs the fake HCAs and speed files host-setup.sh made
        self._write_client_files()
        for h in self.hosts:
            self.start_sshd(h)
            self.start_dockerd(h, wait=False)
        for h in self.hosts:
            self._wait_dockerd(h)
        prep.result()
        self._start_mirror()
        self._base_image()
        for h in self.hosts:
            self._wait_ssh(h)

    # caches: rootfs tarball and wheels, built in a thread while the hosts come up
    def _prepare_caches_async(self):
        import concurrent.futures as cf

        ex = cf.ThreadPoolExecutor(max_workers=2)
        futs = [ex.submit(artifacts.ensure_rootfs_tar), ex.submit(artifacts.ensure_wheels)]

        class _F:
            def result(self_inner):
                for f in futs:
                    f.result()
                ex.shutdown()

        return _F()

    def _keys(self) -> None:
        if not self.identity.exists():
            run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "sparkcluster-testbed-controller",
                    "-f",
                    str(self.identity),
                ]
            )
        os.chmod(self.identity, 0o600)
        ak = self.dir / "authorized_keys"
        ak.write_text((self.identity.with_suffix(".pub")).read_text())
        os.chmod(ak, 0o600)
        for h in self.hosts:
            d = self.host_dir(h)
            d.mkdir(parents=True, exist_ok=True)
            key = d / "ssh_host_ed25519_key"
            if not key.exists():
                run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{h}", "-f", str(key)])

    def _mkdir_root(self, path: str) -> None:
        """A mount point on the shared root filesystem; removed at down if we made it and it is empty."""
        if not os.path.exists(path):
            os.makedirs(path)
            st = self._state()
            st.setdefault("created_dirs", []).append(path)
            self._save(st)

    def _start_host(self, host: str) -> None:
        d = self.host_dir(host)
        d.mkdir(parents=True, exist_ok=True)
        if "netns_mount" not in self._state():
            # `ip netns add` turns /run/netns into a (shared) bind mount; undo that at down if it was us
            was = run(["mountpoint", "-q", "/run/netns"], check=False).returncode == 0
            self._update(netns_mount={"was_mounted": was, "dir_existed": os.path.isdir("/run/netns")})
        run(["ip", "netns", "add", host])
        st = self._state()
        st["hosts"].setdefault(host, {})["netns"] = host
        self._save(st)
        init = (
            "import os,signal,time\n"
            "signal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n"
            "signal.signal(signal.SIGINT, lambda *a: os._exit(0))\n"
            "while True:\n"
            "    try:\n"
            "        os.wait()\n"
            "    except ChildProcessError:\n"
            "        time.sleep(0.5)\n"
        )
        with open(d / "init.log", "ab") as logf:
            p = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    host,
                    "unshare",
                    "--pid",
                    "--fork",
                    "--mount-proc",
                    "--mount",
                    "--uts",
                    "--ipc",
                    "--propagation",
                    "private",
                    SYS_PYTHON,
                    "-c",
                    init,
                ],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,
                cwd="/",
            )
        child = None
        for _ in range(200):
            try:
                kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
            except OSError:
                kids = []
            if kids:
                c = int(kids[0])
                try:
                    if (
                        os.readlink(f"/proc/{c}/ns/pid") != os.readlink("/proc/self/ns/pid")
                        and b"python3" in Path(f"/proc/{c}/cmdline").read_bytes()
                    ):
                        child = c
                        break
                except OSError:
                    pass
            if p.poll() is not None:
                break
            time.sleep(0.05)
        if child is None:
            raise TestbedError(f"init for {host} did not start (see {d / 'init.log'})")
        st = self._state()
        st["hosts"][host].update(init_pid=child, unshare_pid=p.pid)
        self._save(st)
        log(f"{host}: namespaces up (init pid {child})")

    def _network(self) -> None:
        # nothing addressed to the testbed ranges may ever leave this machine (e.g. while a LAN link
        # is down and its connected route is gone): a catch-all unreachable route, no forwarding, no NAT
        run(["ip", "route", "replace", "unreachable", TESTBED_NET, "metric", "4242"])
        self._update(guard_route=True)
        for h in self.hosts:
            s = SPECS[h]
            run(["ip", "link", "add", s.ctl_if, "type", "veth", "peer", "name", LAN_IF, "netns", h])
            run(["ip", "addr", "add", f"{s.ctl_ip}/30", "dev", s.ctl_if])
            run(["ip", "link", "set", s.ctl_if, "up"])
            self.sh(
                h,
                f"ip link set lo up && ip addr add {s.lan_ip}/30 dev {LAN_IF} && ip link set {LAN_IF} up "
                f"&& ip route add default via {s.ctl_ip} dev {LAN_IF}",
            )
        mode = self.cabling
        self._update(cabling=mode.spec)
        if mode.name == "ring":
            self._ring(mode.mtu)
            log(
                f"network: {len(self.hosts)} LAN veths in 198.18.0.0/27; a ring of {len(self.hosts)} cables (each "
                f"twin pair on /24s of its own), the control plane on a LAN ({cabling.RING_LAN}.0/24)"
            )
            return
        self._update(wiring="switch" if len(self.hosts) > 2 else "pair")
        if len(self.hosts) > 2:
            self._switch(mode.mtu)
            log(
                f"network: {len(self.hosts)} LAN veths in 198.18.0.0/27; 4 rails 198.19.{{1..4}}.0/24 through a "
                f"switch ({SWITCH_NS}), cabling {mode.spec}"
            )
            return
        for k, nd in enumerate(NETDEVS):
            # one veth pair per netdev, each end created directly in its host; which are cabled (up),
            # their addresses, HCA states and GID tables come from the cabling mode (_apply_cabling)
            self._veth(k, nd, nd, mode.mtu)
        log(
            f"network: LAN veths 198.18.0.0/30, 198.18.0.4/30; 4 data-plane veths 198.19.{{1..4}}.0/24, "
            f"cabling {mode.spec}"
        )

    def _ring(self, mtu: int) -> None:
        """Three or more hosts cabled as a ring: host i's port 0 twins to host i+1's port 1 twins (the
        last to the first), a veth per twin; and a LAN all hosts share (`lan0` on a bridge in the
        switch namespace) for the control plane, since no cable reaches every host."""
        hosts = self.hosts
        if len(hosts) < 3:
            raise TestbedError("the ring cabling needs three or more hosts (HOSTS=3 or more)")
        self._update(wiring="ring")
        run(["ip", "netns", "add", SWITCH_NS])
        sw = ["ip", "-n", SWITCH_NS]
        run(sw + ["link", "set", "lo", "up"])
        run(sw + ["link", "add", "lan", "type", "bridge"])
        run(sw + ["link", "set", "lan", "up"])
        for h in hosts:
            port = f"p{SPECS[h].octet}lan"
            run(["ip", "link", "add", "tbtmp-h", "netns", h, "type", "veth", "peer", "name", port, "netns", SWITCH_NS])
            run(["ip", "-n", h, "link", "set", "tbtmp-h", "name", cabling.RING_LAN_IF])
            run(sw + ["link", "set", port, "master", "lan"])
            run(sw + ["link", "set", port, "up"])
            run(["ip", "-n", h, "addr", "add", f"{cabling.RING_LAN}.{SPECS[h].octet}/24", "dev", cabling.RING_LAN_IF])
            run(["ip", "-n", h, "link", "set", cabling.RING_LAN_IF, "up"])
        for i, h in enumerate(hosts):
            nxt = hosts[(i + 1) % len(hosts)]
            for out_k, in_k in ((0, 1), (2, 3)):  # port 0's twins to the next host's port 1 twins
                run(
                    [
                        "ip",
                        "link",
                        "add",
                        "tbtmp-a",
                        "netns",
                        h,
                        "mtu",
                        str(mtu),
                        "type",
                        "veth",
                        "peer",
                        "name",
                        "tbtmp-b",
                        "netns",
                        nxt,
                        "mtu",
                        str(mtu),
                    ]
                )
                run(["ip", "-n", h, "link", "set", "tbtmp-a", "name", NETDEVS[out_k]])
                run(["ip", "-n", nxt, "link", "set", "tbtmp-b", "name", NETDEVS[in_k]])

    def _switch(self, mtu: int) -> None:
        """Three or more hosts: a switch of its own (a namespace with a bridge per rail k); each
        host's netdev k is a veth whose far end is a port of bridge k. Which ports carry a cable, their
        addresses and the rest come from the cabling mode on each host (an uncabled port: the host's
        end admin-down, so the switch's port has no carrier, as an empty cage)."""
        run(["ip", "netns", "add", SWITCH_NS])
        self._update(switch=True)
        sw = ["ip", "-n", SWITCH_NS]
        run(sw + ["link", "set", "lo", "up"])
        for k in range(len(NETDEVS)):
            run(sw + ["link", "add", f"rail{k + 1}", "mtu", str(mtu), "type", "bridge"])
            run(sw + ["link", "set", f"rail{k + 1}", "up"])
        for h in self.hosts:
            for k, nd in enumerate(NETDEVS):
                port = f"p{SPECS[h].octet}r{k + 1}"
                run(
                    [
                        "ip",
                        "link",
                        "add",
                        "tbtmp-h",
                        "netns",
                        h,
                        "mtu",
                        str(mtu),
                        "type",
                        "veth",
                        "peer",
                        "name",
                        port,
                        "netns",
                        SWITCH_NS,
                        "mtu",
                        str(mtu),
                    ]
                )
                run(["ip", "-n", h, "link", "set", "tbtmp-h", "name", nd])
                run(sw + ["link", "set", port, "master", f"rail{k + 1}"])
                run(sw + ["link", "set", port, "up"])

    def _veth(self, k: int, head_nd: str, worker_nd: str, mtu: int) -> None:
        run(
            [
                "ip",
                "link",
                "add",
                "tbtmp-h",
                "netns",
                HEAD,
                "mtu",
                str(mtu),
                "type",
                "veth",
                "peer",
                "name",
                "tbtmp-w",
                "netns",
                WORKER,
                "mtu",
                str(mtu),
            ]
        )
        run(["ip", "-n", HEAD, "link", "set", "tbtmp-h", "name", head_nd])
        run(["ip", "-n", WORKER, "link", "set", "tbtmp-w", "name", worker_nd])

    # ---------------------------------------------------------------- cabling (issue 17)
    @property
    def cabling(self) -> cabling.Mode:
        """The current cabling mode: what set_cabling chose, else $SPARKCLUSTER_TESTBED_CABLING at up."""
        spec = self._state().get("cabling") if self.state_file.exists() else None
        return cabling.parse(spec if spec is not None else os.environ.get(cabling.ENV))

    def _names(self, host: str) -> list[str]:
        return self.worker_netdevs() if host == WORKER else list(NETDEVS)

    def _apply_cabling(self, host: str) -> None:
        """Put one host's data-plane ports in the current mode: admin state, MTU, addresses, HCA
        states, link speeds and GID tables. Idempotent; a live control address is never removed."""
        names = self._names(host)
        macs = cabling.parse_macs(self.sh(host, cabling.mac_query(names)).stdout)
        octet = SPECS[host].octet
        self.sh(host, "set -e\n" + "\n".join(cabling.host_commands(self.cabling, octet, names, macs, len(self.hosts))))

    def set_cabling(self, mode: str | None = None) -> Path:
        """Re-cable and re-address both hosts as `mode` ("two-cables", "one-cable@1500", ...; None:
        the default) and rewrite cluster.toml to match. Undo: set_cabling() or reset()."""
        m = cabling.parse(mode if mode is not None else os.environ.get(cabling.ENV))
        if (m.name == "ring") != (self._state().get("wiring") == "ring"):
            raise TestbedError(
                "a ring is wired at bring-up (SPARKCLUSTER_TESTBED_CABLING=ring with HOSTS=3 or more), "
                "and a ring's hosts cannot be re-cabled as a pair or through a switch"
            )
        self._update(cabling=m.spec)
        for h in self.hosts:
            self._apply_cabling(h)
        return self.write_inventory(crossed=self._state().get("crossed", False))

    def set_addresses(self, host: str, ifname: str, addrs: list[str]) -> None:
        """Give one data-plane netdev exactly these IPv4 addresses ("198.19.2.4/24"); its HCA's GID
        table follows, as the kernel's does. Undo: reset() (the mode's addresses again)."""
        mac = cabling.parse_macs(self.sh(host, cabling.mac_query([ifname])).stdout).get(ifname)
        up = self.sh(host, f"cat /sys/class/net/{ifname}/operstate").stdout.strip() != "down"
        cmds = cabling.address_commands(ifname, list(addrs))
        cmds += cabling.gid_commands(HCA_OF[ifname], ifname, mac if up else None, list(addrs))
        self.sh(host, "set -e\n" + "\n".join(cmds))

    def shift_gids(self, host: str) -> None:
        """Rewrite every cabled HCA's GID table on `host` with a global IPv6 GID (fd00:19::<octet>)
        ahead of the IPv4 ones, as when the port had an IPv6 address first: its RoCE v2 IPv4 GID
        moves from index 3 to 5. Undo: reset()."""
        names = self._names(host)
        macs = cabling.parse_macs(self.sh(host, cabling.mac_query(names)).stdout)
        octet = SPECS[host].octet
        cmds = []
        for k, nd in enumerate(names):
            if cabling.cabled(self.cabling, k):
                cmds += cabling.gid_commands(
                    HCA_OF[nd],
                    nd,
                    macs.get(nd),
                    cabling.addresses(self.cabling, k, octet),
                    (f"fd00:19::{k + 1}:{octet}",),
                )
        self.sh(host, "set -e\n" + "\n".join(cmds))

    def set_default_route(self, host: str, ifname: str, via: str) -> None:
        """Send the host's default route out of a data-plane port (undo: reset(), back via the LAN)."""
        self.sh(host, f"ip route replace default via {shlex.quote(via)} dev {shlex.quote(ifname)}")

    def plug_third(self, host: str, ifname: str = "enp1s0f0np0") -> str:
        """Cable `host`'s port `ifname` to a third machine (namespace cabling.THIRD_NS, not a cluster
        node; eugr#40): the host's end gets THIRD_NET.1/24 and an ACTIVE HCA, the other host's end of
        that link loses its cable. Returns the third machine's address. Undo: unplug_third()."""
        other = WORKER if host == HEAD else HEAD
        k = self._names(host).index(ifname)
        other_nd = self._names(other)[k]
        for argv in cabling.third_plug_commands(host, ifname, other, other_nd, self.cabling.mtu):
            run(argv)
        self._update(third={"host": host, "ifname": ifname})
        self.sh(
            host,
            cabling.rebind_speed([(ifname, NETDEVS[k])])
            + f"; echo {cabling.SPEED_MBPS} > /run/testbed/speed/{NETDEVS[k]}",
        )
        self.sh(other, cabling.rebind_speed([(other_nd, NETDEVS[k])]))
        self.set_hca_state(host, HCA_OF[ifname], "4: ACTIVE")
        self.set_addresses(host, ifname, [f"{cabling.THIRD_NET}.1/24"])
        return f"{cabling.THIRD_NET}.3"

    def unplug_third(self) -> None:
        third = self._state().get("third")
        if not third:
            return
        host, ifname = third["host"], third["ifname"]
        other = WORKER if host == HEAD else HEAD
        k = self._names(host).index(ifname)
        for argv in cabling.third_unplug_commands(host, ifname, other, self._names(other)[k], self.cabling.mtu):
            run(argv, check=False)
        self._update(third=None)
        for h in HOSTS:
            self.sh(h, cabling.rebind_speed([(self._names(h)[k], NETDEVS[k])]))
            self._apply_cabling(h)

    def _setup_host(self, host: str) -> None:
        d = self.host_dir(host)
        s = SPECS[host]
        (d / "etc-hosts").write_text(
            f"127.0.0.1\tlocalhost\n127.0.1.1\t{host}\n"
            + "".join(f"{SPECS[h].lan_ip}\t{h}\n" for h in self.hosts)
            + "::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        # a resolver that answers "port unreachable" at once instead of timing out
        (d / "resolv.conf").write_text(f"nameserver {s.ctl_ip}\noptions timeout:1 attempts:1\n")
        (d / "etc-docker").mkdir(exist_ok=True)
        for p in ("/var/lib/docker", "/var/lib/sparkcluster", "/dev/infiniband", "/etc/docker"):
            self._mkdir_root(p)
        disk = ""
        img = d / "docker.img"
        if artifacts.loop_devices_work():
            img.unlink(missing_ok=True)
            with open(img, "wb") as f:
                f.truncate(DISK_GB * 1024**3)
            run(
                [
                    "mkfs.ext4",
                    "-q",
                    "-F",
                    "-m",
                    "0",
                    "-E",
                    "lazy_itable_init=1,lazy_journal_init=1",
                    "-L",
                    f"{host}-docker",
                    str(img),
                ]
            )
            disk = str(img)
        env = {
            "TB_NAME": host,
            "TB_REPO": str(REPO),
            "TB_STATE": str(d),
            "TB_BIN": str(BIN),
            "TB_DISK": disk,
            "TB_DISK_MB": str(8 * 1024),
            "TB_NETDEVS": " ".join(NETDEVS),
            "TB_HCAS": " ".join(HCAS),
            "TB_DRIVER": DRIVER,
        }
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        self.sh(host, f"export {exports}; bash {shlex.quote(str(HERE / 'host-setup.sh'))}")
        # the account sparkcluster logs in as (root may not log in: sshd's PermitRootLogin no), with
        # the controller's key in its own private home, where sshd looks by default
        self.add_ssh_user(host)
        st = self._state()
        st["hosts"][host]["disk"] = disk
        self._save(st)
        log(
            f"{host}: private /run /tmp /var/lib/docker ({'ext4 on loop' if disk else 'tmpfs'}), "
            "fake HCAs, nvidia-smi stand-in"
        )

    def add_ssh_user(self, host: str) -> None:
        """The Spark's SSH user on `host` (tests/testbed/user-setup.sh): uid SSH_UID, its own home,
        a member of `docker`, no sudo rule; its authorized_keys the controller's key."""
        self.sh(
            host,
            f"TB_USER={SSH_USER} TB_UID={SSH_UID} bash {shlex.quote(str(HERE / 'user-setup.sh'))}",
            input=(self.dir / "authorized_keys").read_text(),
        )

    def account(self) -> dict:
        """Who the testbed's SSH user is (written to facts.json with the client files)."""
        home = f"/home/{SSH_USER}"
        return {
            "ssh_user": SSH_USER,
            "uid": SSH_UID,
            "gid": SSH_UID,
            "home": home,
            "groups": [SSH_USER, "docker"],
            "hf_cache": f"{home}/.cache/huggingface",
            "root_login": False,
            "sudo": False,
        }

    # ---------------------------------------------------------------- sshd
    def _sshd_config(self, host: str) -> Path:
        d = self.host_dir(host)
        cfg = d / "sshd_config"
        cfg.write_text(f"""# testbed sshd for {host}
ListenAddress {SPECS[host].lan_ip}
Port 22
HostKey {d / "ssh_host_ed25519_key"}
PidFile /run/sshd.pid
AuthorizedKeysFile .ssh/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM no
LogLevel VERBOSE
X11Forwarding no
PrintMotd no
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
""")
        return cfg

    def start_sshd(self, host: str) -> None:
        """Start the host's sshd (logs to hosts/<host>/sshd.log)."""
        cfg = self._sshd_config(host)
        self.sh(
            host,
            f"/usr/sbin/sshd -t -f {cfg} && /usr/sbin/sshd -f {cfg} -E {self.sshd_log(host)} && "
            f"for i in $(seq 100); do ss -Hltn 'sport = :22' | grep -q {SPECS[host].lan_ip} && break; "
            "sleep 0.05; done; ss -Hltn 'sport = :22' | grep -q . || { echo 'sshd is not listening' >&2; exit 1; }",
        )
        # A hardened Spark also gives sshd OOMScoreAdjust=-1000; lowering an OOM score needs
        # CAP_SYS_RESOURCE, which this sandbox withholds, so doctor's mem.sshd_oom warns here.
        self.start_earlyoom(host)

    def start_earlyoom(self, host: str) -> None:
        """earlyoom, as a hardened Spark runs it (seed 002). A real process in the host's PID
        namespace; both hosts watch this one machine's memory, as both share it."""
        self.sh(
            host, "pgrep -x earlyoom >/dev/null || { setsid earlyoom -r 0 </dev/null >/dev/null 2>&1 & }", timeout=20
        )

    def stop_earlyoom(self, host: str) -> None:
        self.sh(
            host,
            "pkill -x earlyoom; for i in $(seq 50); do pgrep -x earlyoom >/dev/null || exit 0; sleep 0.1; done",
            check=False,
        )

    def stop_sshd(self, host: str) -> None:
        """Stop the listening sshd (established sessions survive, as with a real `kill`)."""
        self.sh(
            host,
            "[ -s /run/sshd.pid ] && kill $(cat /run/sshd.pid) || true; "
            "for i in $(seq 50); do [ -e /run/sshd.pid ] || exit 0; sleep 0.1; done; rm -f /run/sshd.pid",
        )

    def _wait_ssh(self, host: str, timeout: float = 20) -> None:
        end = time.monotonic() + timeout
        while True:
            p = self.ssh(host, "true", check=False, timeout=15)
            if p.returncode == 0:
                return
            if time.monotonic() > end:
                raise TestbedError(f"ssh to {host} does not work: {p.stderr.strip()}")
            time.sleep(0.3)

    # ---------------------------------------------------------------- dockerd
    def start_dockerd(self, host: str, wait: bool = True, min_api: str = MIN_API_VERSION) -> None:
        """Start the host's own dockerd (own containerd, data root /var/lib/docker, /run/docker.sock).
        Its default runtime stays `runc`, found first on dockerd's PATH in /run/testbed/bin: the
        testbed-runc wrapper (see standin_bin/testbed-runc), so `docker info` reads as on a Spark."""
        args = (
            "dockerd --data-root /var/lib/docker --exec-root /run/docker --pidfile /run/docker.pid "
            "-H unix:///run/docker.sock --add-runtime nvidia=nvidia-container-runtime --log-level warn"
        )
        # Docker 29.0-29.2's floor (docker/docs#23910), which 25.0 and newer take from this variable
        # (daemon.json's `min-api-version` arrived in 29): a client pinned below 1.44 fails here as on a Spark
        env = f"DOCKER_MIN_API_VERSION={min_api} PATH=/run/testbed/bin:$PATH"
        self.sh(host, f"{env} setsid {args} </dev/null >>{self.dockerd_log(host)} 2>&1 &")
        if wait:
            self._wait_dockerd(host)

    def _wait_dockerd(self, host: str, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.sh(host, "docker version --format '{{.Server.Version}}'", check=False, timeout=20).returncode == 0:
                # the socket is the docker group's, as the Docker package leaves it on a Spark
                self.sh(host, "chgrp docker /run/docker.sock && chmod 660 /run/docker.sock")
                return
            time.sleep(0.3)
        try:
            tail = "\n".join(self.dockerd_log(host).read_text(errors="replace").splitlines()[-15:])
        except OSError:
            tail = "(no log)"
        raise TestbedError(f"dockerd on {host} did not come up; its log ends:\n{tail}")

    def stop_dockerd(self, host: str, timeout: float = 30) -> None:
        """Stop the host's dockerd (and its containerd) like `systemctl stop docker`."""
        self.sh(
            host,
            f"""
pid=$(cat /run/docker.pid 2>/dev/null || true)
[ -n "$pid" ] && kill "$pid" 2>/dev/null || true
for i in $(seq {int(timeout * 10)}); do [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
pkill -x containerd 2>/dev/null || true
for i in $(seq 50); do pgrep -x containerd >/dev/null || break; sleep 0.1; done
rm -f /run/docker.pid /run/docker.sock
""",
            check=False,
            timeout=timeout + 20,
        )

    def reboot(self, host: str) -> None:
        """What a reboot does to a node's containers: dockerd and everything under it stops (the
        containers end as at shutdown, not by `docker stop`), then dockerd starts again and brings
        back the containers whose restart policy asks for it. Stand-in limits: the host's kernel,
        sshd and link state stay up, which a real reboot would also take down for a minute."""
        self.stop_dockerd(host)
        self.sh(host, "pkill -9 -f containerd-shim 2>/dev/null; true", check=False)
        self.start_dockerd(host)

    def set_meminfo(self, host: str, container: str, mem_available_kib: int | None) -> None:
        """A stand-in at the OS boundary, as lxcfs does for containers: the container's
        /proc/meminfo shows MemAvailable = `mem_available_kib` (the rest of the real file kept);
        None removes it. The testbed's two hosts are one machine, so real pressure on one "node"
        would starve both and the test's own processes with them."""
        pid = self.sh(host, f"docker inspect -f '{{{{.State.Pid}}}}' {container}").stdout.strip()
        if mem_available_kib is None:
            self.sh(host, f"nsenter -t {pid} -m -p umount /proc/meminfo", check=False)
            return
        fake = "/run/testbed-meminfo"
        self.sh(
            host,
            f'docker exec {container} sh -c \'sed "s/^MemAvailable:.*/MemAvailable:   {int(mem_available_kib)} kB/" '
            f"/proc/meminfo > {fake}'",
        )
        self.sh(host, f"nsenter -t {pid} -m -p mount --bind {fake} /proc/meminfo")

    def meminfo_returning(self, host: str, container: str, low_kib: int, after_s: float) -> dict:
        """The slow-returning memory of a killed engine (issue 35), at the same OS boundary as
        set_meminfo: the container's MemAvailable reads `low_kib` now and its real value again
        `after_s` seconds later, as tens of GiB of shared and CUDA memory come back after a kill on
        a Spark (MiaAI-Lab GLM-5.3 #193). Returns {"timer": the pending restore (cancel() it in a
        test's finally), "at": the time.time() of the restore once done}."""
        self.set_meminfo(host, container, low_kib)
        out: dict = {"at": None}

        def restore() -> None:
            self.set_meminfo(host, container, None)
            out["at"] = time.time()

        out["timer"] = threading.Timer(after_s, restore)
        out["timer"].daemon = True
        out["timer"].start()
        return out

    # ---------------------------------------------------------------- client files
    def _write_client_files(self) -> None:
        lines = []
        for h in self.hosts:
            s = SPECS[h]
            lines.append(f"""Host {h}
  HostName {s.lan_ip}
  User {SSH_USER}
  Port 22
  IdentityFile {self.identity}
  IdentitiesOnly yes
  UserKnownHostsFile {self.known_hosts}
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  ConnectTimeout 5
""")
        self.ssh_config.write_text("\n".join(lines))
        self.facts_file.write_text(json.dumps(self.account(), indent=2) + "\n")
        kh = []
        for h in self.hosts:
            pub = (self.host_dir(h) / "ssh_host_ed25519_key.pub").read_text().split()
            kh.append(f"{h},{SPECS[h].lan_ip} {pub[0]} {pub[1]}")
        self.known_hosts.write_text("\n".join(kh) + "\n")
        self.write_inventory(crossed=self._state().get("crossed", False))

    def inventory_text(self, crossed: bool = False, mode: str | None = None) -> str:
        """cluster.toml for the current cabling mode (or `mode`): the data plane lists the cabled
        twins that have an IPv4 address, as `sparkcluster init` would."""
        m = cabling.parse(mode) if mode is not None else self.cabling
        hosts = self.hosts
        many = len(hosts) > 2  # through the testbed's switch: every rail on every host
        out = [
            f"# sparkcluster inventory for the {len(hosts)}-host testbed (written by tests/testbed)",
            f"# cabling: {m.spec}" + (", through a switch" if many and m.name != "ring" else ""),
            "[cluster]",
            'name = "testbed"',
            'ssh_config = "ssh_config"',
            'known_hosts = "known_hosts"',
            f'profile = "{"testbed-pp" if len(hosts) == 4 else "testbed"}"',
            f'pip_index_url = "{PIP_INDEX_URL}"',
            hub.INVENTORY_LINE,
            *([f'topology = "{"ring" if m.name == "ring" else "switch"}"'] if many else []),
            "",
            *FABRIC_LINES,
            "",
            # monitoring (sparkcluster monitor up): Debian's packages in one stand-in image (monitor_image)
            "[monitor]",
            f'prometheus_image = "{artifacts.MONITOR_IMAGE}"',
            f'alertmanager_image = "{artifacts.MONITOR_IMAGE}"',
            f'node_exporter_image = "{artifacts.MONITOR_IMAGE}"',
            "scrape_interval_s = 2",
            "",
        ]
        names = {h: list(CROSSED if (crossed and h == WORKER) else NETDEVS) for h in hosts}
        out += cabling.inventory_nodes(m, [(h, SPECS[h].role, SPECS[h].octet) for h in hosts], names)
        return "\n".join(out)

    def write_inventory(self, crossed: bool = False, path: Path | None = None, mode: str | None = None) -> Path:
        path = path or self.inventory
        path.write_text(self.inventory_text(crossed, mode))
        return path

    # ---------------------------------------------------------------- pip mirror
    def _start_mirror(self) -> None:
        artifacts.build_simple_index()
        logf = open(self.dir / "mirror.log", "ab")
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "http.server",
                str(MIRROR_PORT),
                "--bind",
                MIRROR_IP,
                "--directory",
                str(artifacts.MIRROR_ROOT),
            ],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=logf,
            start_new_session=True,
            cwd="/",
        )
        self._update(mirror_pid=p.pid)
        for _ in range(100):
            if artifacts.mirror_ok(PIP_INDEX_URL):
                log(f"pip mirror: {PIP_INDEX_URL} ({len(list(artifacts.WHEELS.glob('*.whl')))} wheels)")
                return
            time.sleep(0.1)
        raise TestbedError("pip mirror did not answer")

    # ---------------------------------------------------------------- images
    def _base_image(self) -> None:
        """The images standing in for NGC's (see artifacts.py) and the tiny model in both HF caches.
        The engine image is on BOTH hosts, as after `docker pull` on each Spark; the stand-in of
        vLLM 0.21 on the head only."""
        t0 = time.monotonic()
        changes = [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            "ENV PYTHONUNBUFFERED=1",
            "WORKDIR /workspace",
            'CMD ["/bin/bash"]',
        ]
        ch = " ".join(f"--change {shlex.quote(c)}" for c in changes)
        with open(ROOTFS_TAR, "rb") as f:
            p = subprocess.run(
                self.nsenter_argv(HEAD) + ["bash", "-c", f"docker import {ch} - {ROOTFS_IMAGE}"],
                stdin=f,
                capture_output=True,
                text=True,
            )
        if p.returncode != 0:
            raise TestbedError(f"docker import failed: {p.stderr}")
        self.refresh_vllm_standin()
        self.engine_image()
        self.ensure_model()
        self._start_hub()
        log(f"images and model in {time.monotonic() - t0:.1f}s")

    def engine_image(self) -> str:
        """BASE_IMAGE (the real vLLM, CPU build) on both hosts: loaded from the controller's cache
        when this machine built it before, else built on the head from the pip mirror and cached."""
        tar = artifacts.engine_image_tar()
        t0 = time.monotonic()
        if not tar.exists():
            ctx = artifacts.engine_build_context(self.dir / "engine-build")
            self.docker(
                HEAD,
                f"build --network host --build-arg ROOTFS={ROOTFS_IMAGE} "
                f"--build-arg PIP_INDEX_URL={PIP_INDEX_URL} --build-arg PIP_TRUSTED_HOST={MIRROR_IP} "
                f"-t {BASE_IMAGE} {ctx}",
                timeout=1500,
            )
            shutil.rmtree(ctx, ignore_errors=True)
            self.docker(HEAD, "builder prune -af", check=False)
            log(f"engine image {BASE_IMAGE} built on {HEAD} in {time.monotonic() - t0:.1f}s")
            tmp = tar.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                res = subprocess.run(
                    self.nsenter_argv(HEAD) + ["docker", "save", BASE_IMAGE], stdout=f, stderr=subprocess.PIPE
                )
            if res.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise TestbedError(f"docker save {BASE_IMAGE}: {res.stderr!r}")
            for old in artifacts.CACHE.glob("engine-image-*.tar"):
                old.unlink()  # an image of older inputs is never used again
            tmp.replace(tar)
            hosts = list(self.hosts[1:])
        else:
            hosts = list(self.hosts)
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(len(hosts)) as ex:
            list(ex.map(lambda h: self._load_tar(h, tar), hosts))
        log(f"engine image {BASE_IMAGE} ({VLLM_VERSION}) on {', '.join(self.hosts)} in {time.monotonic() - t0:.1f}s")
        return self.image_id(HEAD, BASE_IMAGE)

    def _load_tar(self, host: str, tar: Path) -> None:
        with open(tar, "rb") as f:
            res = subprocess.run(self.nsenter_argv(host) + ["docker", "load", "-q"], stdin=f, capture_output=True)
        if res.returncode != 0:
            raise TestbedError(f"docker load on {host} failed: {res.stderr!r}")

    def _start_hub(self) -> None:
        """The model hub on the controller's LAN address (tests/testbed/hub): what sparkcluster's
        weights stage fetches from, through the inventory's hf_endpoint."""
        # the first start hashes issue 52's 75 GB sparse repository once (zeros: a minute or two)
        h = hub.start_hub(log_path=self.dir / "hub.log", large=True, timeout=900)
        self._update(hub_pid=h.pid)
        log(f"model hub: {h.endpoint} ({TINY_MODEL} and the gated and synthetic repos)")

    def place_model(self, hosts=None) -> None:
        """The tiny model in each host's HF cache, laid out as after a download (a knob: the weights
        stage normally fetches it from the hub)."""
        src = self.ensure_model()
        tree = self.dir / "hf-cache"
        shutil.rmtree(tree, ignore_errors=True)
        artifacts.hub_cache_tree(src, tree)
        data = run(["tar", "-C", str(tree), "-cf", "-", "."], text=False).stdout
        acct = ssh_account(self)
        cache, owner = shlex.quote(acct["hf_cache"]), f"{acct['uid']}:{acct['gid']}"
        for h in hosts or self.hosts:
            # the SSH user's own files, as its own `hf download` would leave them
            self.sh(
                h,
                f"mkdir -p {cache} && tar -C {cache} --no-same-owner -xf - && chown -R {owner} {shlex.quote(acct['home'])}/.cache",
                input=data,
                text=False,
            )
        shutil.rmtree(tree, ignore_errors=True)

    def ensure_model(self) -> Path:
        """The tiny model's files on the controller, built once per machine inside the engine image
        (which has torch and transformers)."""
        return self._model_built(artifacts.MODEL_SCRIPT, artifacts.model_dir(), TINY_MODEL, timeout=300)

    def ensure_trained_model(self) -> Path:
        """The trained tiny model's files (model/train_tiny_model.py: the tiny model's shape trained a few
        minutes on the CPU, issue 58), built once per machine inside the engine image."""
        return self._model_built(
            artifacts.TRAIN_SCRIPT, artifacts.trained_model_dir(), artifacts.TRAINED_MODEL, timeout=1800
        )

    def _model_built(self, script: Path, src: Path, name: str, timeout: int) -> Path:
        """`script` run once in the engine image on the head (model/ mounted beside it, no network),
        its output kept at `src`."""
        if not (src / "model.safetensors").exists():
            t0 = time.monotonic()
            tmp = Path(f"/tmp/tb-model-{os.getpid()}")
            self.sh(
                HEAD,
                f"rm -rf {tmp} && mkdir -p {tmp} && docker run --rm --network none -v {tmp}:/out "
                f"-v {script.parent}:/model-src:ro {BASE_IMAGE} python3 /model-src/{script.name} /out/model",
                timeout=timeout,
            )
            staging = src.with_suffix(".tmp")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            data = self.sh(HEAD, f"tar -C {tmp}/model -cf - . && rm -rf {tmp}", text=False).stdout
            subprocess.run(["tar", "-C", str(staging), "-xf", "-"], input=data, check=True)
            shutil.rmtree(src, ignore_errors=True)
            staging.replace(src)
            log(f"{name} built in {time.monotonic() - t0:.1f}s")
        return src

    def refresh_vllm_standin(self) -> str:
        """(Re)build the small layer with tests/testbed/standins/vllm on top of the imported rootfs,
        tagged STANDIN_IMAGE, on the head. Returns the image ID."""
        ctx = self.dir / "base-build"
        shutil.rmtree(ctx, ignore_errors=True)
        ctx.mkdir(parents=True)
        src = ctx / "vllm"
        if artifacts.STANDIN_VLLM.is_dir() and any(artifacts.STANDIN_VLLM.iterdir()):
            shutil.copytree(
                artifacts.STANDIN_VLLM,
                src,
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".pytest_cache"),
            )
        else:
            src.mkdir()
        (ctx / "install-standin.sh").write_text(artifacts.INSTALL_STANDIN)
        (ctx / "Dockerfile").write_text(f"""FROM {ROOTFS_IMAGE}
COPY vllm /opt/vllm-standin
COPY install-standin.sh /tmp/install-standin.sh
RUN sh /tmp/install-standin.sh && rm -f /tmp/install-standin.sh
# as in every vLLM image (vLLM depends on it): sparkcluster's weights stage downloads with it
ARG PIP_INDEX_URL
ARG PIP_TRUSTED_HOST
RUN PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install --quiet huggingface_hub
ENV VLLM_VERSION_STANDIN=1
LABEL com.nvidia.nvidia-driver-version="580" org.opencontainers.image.title="vllm (testbed stand-in)"
""")
        self.docker(
            HEAD,
            f"build -q --network host --build-arg PIP_INDEX_URL={PIP_INDEX_URL} "
            f"--build-arg PIP_TRUSTED_HOST={MIRROR_IP} -t {STANDIN_IMAGE} {ctx}",
            timeout=600,
        )
        self.docker(HEAD, "image prune -f", check=False)
        return self.image_id(HEAD, STANDIN_IMAGE)

    def image_id(self, host: str, ref: str) -> str | None:
        p = self.docker(host, f"image inspect --format '{{{{.Id}}}}' {shlex.quote(ref)}", check=False)
        return p.stdout.strip() if p.returncode == 0 else None

    def ray_image(self, tag: str = RAY_IMAGE, force: bool = False) -> str:
        """images/Dockerfile.vllm-ray built on the head (pip mirror build arg, --network host) and copied
        to the worker with docker save | docker load. Cached per session by image ID; returns the tag."""
        st = self._state()
        cached = st.get("ray_image", {})
        base = self.image_id(HEAD, BASE_IMAGE)
        if (
            not force
            and cached.get("tag") == tag
            and cached.get("id")
            and cached.get("base") == base
            and all(self.image_id(h, tag) == cached["id"] for h in self.hosts)
        ):
            return tag
        t0 = time.monotonic()
        self.docker(
            HEAD,
            f"build --network host --build-arg PIP_INDEX_URL={PIP_INDEX_URL} "
            f"--build-arg PIP_TRUSTED_HOST={MIRROR_IP} --build-arg RAY_VERSION={RAY_VERSION} "
            f"-f {REPO / 'images/Dockerfile.vllm-ray'} -t {tag} {REPO / 'images'}",
            timeout=900,
        )
        t1 = time.monotonic()
        for w in self.hosts[1:]:
            self.copy_image(tag, HEAD, w)
        iid = self.image_id(HEAD, tag)
        self._update(
            ray_image={
                "tag": tag,
                "id": iid,
                "base": base,
                "build_s": round(t1 - t0, 1),
                "copy_s": round(time.monotonic() - t1, 1),
            }
        )
        log(f"ray image {tag} {iid[:19]}: build {t1 - t0:.1f}s, save|load {time.monotonic() - t1:.1f}s")
        return tag

    def monitor_image(self, tag: str = artifacts.MONITOR_IMAGE) -> str:
        """images/Dockerfile.monitor (Debian's prometheus, prometheus-alertmanager and
        prometheus-node-exporter on the testbed's rootfs) built on the head and copied to every other
        host (node_exporter runs on each). The testbed inventory's [monitor] names it for all three
        images. Returns the tag."""
        if all(self.image_id(h, tag) for h in self.hosts):
            return tag
        t0 = time.monotonic()
        ctx = artifacts.monitor_build_context(self.dir / "monitor-build")
        self.docker(HEAD, f"build -q --build-arg ROOTFS={ROOTFS_IMAGE} -t {tag} {ctx}", timeout=600)
        for h in self.hosts[1:]:
            self.copy_image(tag, HEAD, h)
        log(f"monitor image {tag} built and copied in {time.monotonic() - t0:.1f}s")
        return tag

    def audio_image(self, tag: str = artifacts.AUDIO_IMAGE, hosts: tuple[str, ...] = (HEAD,)) -> str:
        """images/Dockerfile.audio-standin (Debian's espeak-ng and pocketsphinx behind the OpenAI
        audio routes: standins/audio) built on the head, copied to the other `hosts`: the image of
        the testbed-audio service profile (issue 60). Kept while the testbed lives. Returns the tag."""
        if all(self.image_id(h, tag) for h in hosts):
            return tag
        t0 = time.monotonic()
        ctx = artifacts.audio_build_context(self.dir / "audio-build")
        self.docker(HEAD, f"build -q --build-arg ROOTFS={ROOTFS_IMAGE} -t {tag} {ctx}", timeout=600)
        for h in hosts:
            if h != HEAD:
                self.copy_image(tag, HEAD, h)
        log(f"audio stand-in image {tag} built in {time.monotonic() - t0:.1f}s")
        return tag

    def keyed_image(self, tag: str = artifacts.KEYED_IMAGE) -> str:
        """images/Dockerfile.keyed-standin (busybox alone: its own entrypoint, no python3, a key read
        from a file, a mounted voices folder: standins/keyed) built on the head: the image of the
        testbed-keyed service (issue 72 item 3). Kept while the testbed lives. Returns the tag."""
        if self.image_id(HEAD, tag):
            return tag
        t0 = time.monotonic()
        ctx = artifacts.keyed_build_context(self.dir / "keyed-build")
        self.docker(HEAD, f"build -q -t {tag} {ctx}", timeout=300)
        log(f"keyed stand-in image {tag} built in {time.monotonic() - t0:.1f}s")
        return tag

    def copy_image(self, ref: str, src: str = HEAD, dst: str = WORKER) -> None:
        """docker save on src piped into docker load on dst."""
        save = subprocess.Popen(
            self.nsenter_argv(src) + ["docker", "save", ref], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        load = subprocess.run(
            self.nsenter_argv(dst) + ["docker", "load", "-q"], stdin=save.stdout, capture_output=True, text=True
        )
        save.stdout.close()
        save.wait()
        if save.returncode != 0 or load.returncode != 0:
            raise TestbedError(f"save|load of {ref} {src}->{dst} failed: {save.stderr.read()!r} {load.stderr}")

    def images_sharing_layers(self, host: str, ref: str) -> list[str]:
        """Tags on host, other than ref, whose images hold any of ref's layers (docker load skips those)."""

        def layers(r: str) -> set[str]:
            out = self.docker(host, f"image inspect --format '{{{{json .RootFS.Layers}}}}' {shlex.quote(r)}").stdout
            return set(json.loads(out) or [])

        mine = layers(ref)
        tags = self.docker(host, "images --format '{{.Repository}}:{{.Tag}}'").stdout.split()
        return [t for t in tags if t != ref and "<none>" not in t and layers(t) & mine]

    def set_images_aside(self, host: str, tags: list[str], path: Path) -> None:
        """docker save the tags into a file on the controller, then remove them (undo: restore_images).
        Untagged images go first, for good: they hold layers too (a one-node deployment's own build on
        a worker, left dangling when the pair's image took its tag), and nothing can name them again."""
        self.docker(host, "image prune -f", check=False)
        if not tags:
            return
        with open(path, "wb") as f:
            res = subprocess.run(self.nsenter_argv(host) + ["docker", "save", *tags], stdout=f, stderr=subprocess.PIPE)
        if res.returncode != 0:
            raise TestbedError(f"docker save {tags} on {host} failed: {res.stderr!r}")
        self.docker(host, "rmi " + " ".join(shlex.quote(t) for t in tags))

    def restore_images(self, host: str, path: Path) -> None:
        if path.exists():
            with open(path, "rb") as f:
                res = subprocess.run(self.nsenter_argv(host) + ["docker", "load", "-q"], stdin=f, capture_output=True)
            if res.returncode != 0:
                raise TestbedError(f"docker load on {host} failed: {res.stderr!r}")
            path.unlink()

    # ---------------------------------------------------------------- health
    def problems(self) -> list[str]:
        st = self._state()
        if not st:
            return ["no testbed state (not up)"]
        out = []
        if st.get("phase") != "up":
            out.append(f"bring-up did not finish (phase {st.get('phase')!r})")
        for h in self.hosts:
            hs = st.get("hosts", {}).get(h, {})
            if not _alive(hs.get("init_pid")):
                out.append(f"{h}: init process is gone")
                continue
            if run(["ip", "netns", "pids", h], check=False).returncode != 0:
                out.append(f"{h}: netns missing")
            p = self.sh(h, "docker version --format '{{.Server.Version}}'", check=False, timeout=20)
            if p.returncode != 0:
                out.append(f"{h}: dockerd not answering")
            try:
                p = self.ssh(h, "hostname", check=False, timeout=20)
                if p.returncode != 0 or p.stdout.strip() != h:
                    out.append(f"{h}: ssh hostname failed: {p.stderr.strip()[-200:]}")
            except subprocess.TimeoutExpired:
                out.append(f"{h}: ssh timed out")
        if not _alive(st.get("hub_pid")):
            out.append("model hub not running")
        if not _alive(st.get("mirror_pid")) or not artifacts.mirror_ok(PIP_INDEX_URL):
            out.append("pip mirror not answering")
        if not out:
            for h, ref in (*((h, BASE_IMAGE) for h in self.hosts), (HEAD, STANDIN_IMAGE)):
                if not self.image_id(h, ref):
                    out.append(f"{ref} missing on {h}")
        return out

    def status(self) -> dict:
        st = self._state()
        return {
            "state": st.get("phase", "down"),
            "problems": self.problems() if st else [],
            "dir": str(self.dir),
            "hosts": st.get("hosts", {}),
            "up_seconds": st.get("up_seconds"),
        }

    # ---------------------------------------------------------------- down
    def down(self) -> None:
        with self._lock():
            self._down()

    def _leftovers(self) -> list[str]:
        out = []
        ns = run(["ip", "netns", "list"], check=False).stdout
        if re.search(rf"^{SWITCH_NS}\b", ns, re.M):
            out.append(f"netns {SWITCH_NS}")
        for h in ALL_HOSTS:
            if re.search(rf"^{h}\b", ns, re.M):
                out.append(f"netns {h}")
            if run(["ip", "link", "show", SPECS[h].ctl_if], check=False).returncode == 0:
                out.append(f"link {SPECS[h].ctl_if}")
        return out

    def _down(self) -> None:
        st = self._state()
        hosts = st.get("hosts", {})
        for h in ALL_HOSTS:
            pid = hosts.get(h, {}).get("init_pid")
            if _alive(pid):
                try:
                    self.stop_dockerd(h, timeout=15)
                except Exception as e:  # noqa: BLE001 - teardown continues
                    log(f"{h}: stopping dockerd: {e}")
        for h in ALL_HOSTS:
            hs = hosts.get(h, {})
            for key in ("init_pid", "unshare_pid"):
                pid = hs.get(key)
                if _alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        # the kernel kills everything in a PID namespace when its init dies; wait for it
        for h in ALL_HOSTS:
            for key in ("init_pid", "unshare_pid"):
                pid = hosts.get(h, {}).get(key)
                for _ in range(30):
                    if pid:
                        with contextlib.suppress(ChildProcessError, OSError):
                            os.waitpid(pid, os.WNOHANG)  # reap it if this process started it
                    if not pid or not os.path.exists(f"/proc/{pid}"):
                        break  # gone, not merely a zombie
                    time.sleep(0.1)
        run(["ip", "netns", "del", cabling.THIRD_NS], check=False)  # a third machine a test plugged in
        run(["ip", "netns", "del", SWITCH_NS], check=False)  # the switch of three or more hosts
        # anything else still inside a host's netns (should be nothing)
        for h in ALL_HOSTS:
            p = run(["ip", "netns", "pids", h], check=False)
            for pid in p.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        if _alive(st.get("hub_pid")):
            hub.stop_hub(st["hub_pid"])
        mp = st.get("mirror_pid")
        if _alive(mp):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(mp, signal.SIGTERM)
        for h in ALL_HOSTS:
            for _ in range(50):
                if run(["ip", "netns", "pids", h], check=False).stdout.strip() == "":
                    break
                time.sleep(0.1)
            run(["ip", "netns", "del", h], check=False)
            run(["ip", "link", "del", SPECS[h].ctl_if], check=False)
        if (
            st.get("guard_route")
            or run(["ip", "route", "show", "type", "unreachable", TESTBED_NET], check=False).stdout.strip()
        ):
            run(["ip", "route", "del", "unreachable", TESTBED_NET, "metric", "4242"], check=False)
        nm = st.get("netns_mount")
        if nm and not nm.get("was_mounted") and not run(["ip", "netns", "list"], check=False).stdout.strip():
            for _ in range(4):
                if run(["mountpoint", "-q", "/run/netns"], check=False).returncode != 0:
                    break
                run(["umount", "/run/netns"], check=False)
            if not nm.get("dir_existed"):
                with contextlib.suppress(OSError):
                    os.rmdir("/run/netns")
        # loop devices of our disk images (autoclear normally detaches them with the mount namespace)
        for h in ALL_HOSTS:
            img = self.host_dir(h) / "docker.img"
            for _ in range(50):
                p = run(["losetup", "-j", str(img)], check=False)
                if not p.stdout.strip():
                    break
                for line in p.stdout.splitlines():
                    run(["losetup", "-d", line.split(":")[0]], check=False)
                time.sleep(0.1)
            img.unlink(missing_ok=True)
        artifacts.umount_under(CACHE / "rootfs.tmp")  # if an up was killed during debootstrap
        for d in reversed(st.get("created_dirs", [])):
            with contextlib.suppress(OSError):
                os.rmdir(d)
        for name in (
            "state.json",
            "state.tmp",
            "ssh_config",
            "known_hosts",
            "cluster.toml",
            "authorized_keys",
            "id_ed25519",
            "id_ed25519.pub",
        ):
            (self.dir / name).unlink(missing_ok=True)
        shutil.rmtree(self.dir / "hosts", ignore_errors=True)
        shutil.rmtree(self.dir / "base-build", ignore_errors=True)
        if st:
            log("testbed down")

    def reset(self) -> None:
        """Undo every knob (idempotent): what a test left broken is repaired before the next one."""
        for h in self.hosts:
            run(["ip", "link", "set", SPECS[h].ctl_if, "up"], check=False)
        if self._state().get("crossed"):
            self.cable_worker(False)
        for h in self.hosts:
            self.restore_host_key(h)
            if self.sh(h, "[ -s /run/sshd.pid ] && kill -0 $(cat /run/sshd.pid)", check=False).returncode != 0:
                self.start_sshd(h)
            if self.sh(h, "docker version >/dev/null 2>&1", check=False, timeout=30).returncode != 0:
                self.stop_dockerd(h)
                self.start_dockerd(h)
            cmds = [
                f"ip link set dev {LAN_IF} up",
                f"ip route replace default via {SPECS[h].ctl_ip} dev {LAN_IF}",
                "rm -f /var/lib/docker/.testbed-fill",
                f"echo {DRIVER} > /run/nvidia-standin/driver_version",
                "rm -f /run/nvidia-standin/gpu_slow_cpus",
                # issue 75's stand-ins: the GPU's power following the work and its temperature 41 C, every
                # HCA at its full rate, and the kernel-log stand-in present (a testbed made before it)
                "rm -f /run/nvidia-standin/power_draw_w /run/nvidia-standin/temperature_c",
                "for d in /sys/class/infiniband/*; do echo '200 Gb/sec (2X NDR)' > $d/ports/1/rate; done",
                f"[ -e {KMSG} ] || : > {KMSG}",
                # the runtime wrapper as host-setup.sh installs it (a testbed built before set_gpu_slow)
                "mountpoint -q /usr/local/sbin && install -m 755 "
                f"{shlex.quote(str(BIN / 'testbed-runc'))} /usr/local/sbin/nvidia-container-runtime",
                f"[ -d /run/testbed/bin ] && install -m 755 {shlex.quote(str(BIN / 'testbed-runc'))} /run/testbed/bin/runc",
                # issue 39's stand-ins: the real kernel string and meminfo; every HCA's PCIe link at
                # Gen5 x4 and its firmware, and the GPU and toolkit stand-ins as host-setup.sh installs
                # them (so a testbed built before them gets them too)
                "umount /proc/sys/kernel/osrelease 2>/dev/null",
                f"[ -f {self.MEMVIEW}/pid ] && kill $(cat {self.MEMVIEW}/pid) 2>/dev/null",
                "umount /proc/meminfo 2>/dev/null",
                f"rm -rf {self.MEMVIEW}",
                "for d in /sys/class/infiniband/*; do echo 4 > $d/device/current_link_width; "
                "echo 4 > $d/device/max_link_width; echo '32.0 GT/s PCIe' > $d/device/current_link_speed; "
                "echo '32.0 GT/s PCIe' > $d/device/max_link_speed; echo 28.45.4028 > $d/fw_ver; done",
                # issue 59's stand-in: every HCA's PCI function with no AER error since boot
                "for d in /sys/class/infiniband/*; do " + self.aer_commands("$d") + "; done",
                "mountpoint -q /usr/local/sbin && install -m 755 "
                f"{shlex.quote(str(BIN / 'nvidia-smi'))} {shlex.quote(str(BIN / 'nvidia-ctk'))} /usr/local/sbin/",
                # /usr/local/sbin and /usr/local/bin are the host's own mounts (host-setup.sh, user-setup.sh)
                "mountpoint -q /usr/local/bin && ln -sfn /usr/local/sbin/nvidia-ctk /usr/local/bin/nvidia-ctk",
            ]
            self.sh(h, " ; ".join(cmds), check=False)
            self.start_earlyoom(h)
            self.unshape_egress(h)
            self.show_uverbs(h)
        # the network as the default cabling mode has it: links, addresses, HCA states, speeds, GIDs
        self.unplug_third()
        ring = self._state().get("wiring") == "ring"
        self._update(cabling=cabling.parse("ring" if ring else os.environ.get(cabling.ENV)).spec)
        for h in self.hosts:
            self._apply_cabling(h)
        self.write_inventory(crossed=False)
        if not self.ssh_config.exists() or not self.known_hosts.exists():
            self._write_client_files()

    # ---------------------------------------------------------------- knobs (each with its undo)
    def set_mtu(self, host: str, ifname: str, mtu: int) -> None:
        """Set an interface's MTU on a host (undo: set it back, e.g. 9000)."""
        self.sh(host, f"ip link set dev {shlex.quote(ifname)} mtu {int(mtu)}")

    def get_mtu(self, host: str, ifname: str) -> int:
        return int(self.sh(host, f"cat /sys/class/net/{ifname}/mtu").stdout)

    # --- node health beyond the GPU (issue 75): stand-ins at the OS boundary, each with its undo

    def kernel_line(self, host: str, text: str, priority: int = 3) -> None:
        """Append one record to the host's kernel-log stand-in (KMSG, bound over /dev/kmsg in its
        containers by testbed-runc), as the kernel writes /dev/kmsg: `prio,seq,usec,-;text`, usec on
        CLOCK_MONOTONIC, which every host shares with this process (one kernel). Undo: none needed,
        the reader only reports what is new."""
        from sparkcluster.node.kernel_log import message

        text, _ = message(text)  # a captured `dmesg` or `journalctl -k` line: its message alone
        usec = int(time.monotonic() * 1e6)
        seq = self.sh(host, f"wc -l < {KMSG}", check=False).stdout.strip() or "0"
        record = f"{priority},{seq},{usec},-;{text}"
        self.sh(host, f"printf '%s\\n' {shlex.quote(record)} >> {KMSG}")

    def kernel_captured(self, host: str, name: str) -> None:
        """Every line of tests/captured/kernel/<name> (real lines, sources in tests/captured/README.md)."""
        for line in (REPO / "tests" / "captured" / "kernel" / name).read_text().splitlines():
            if line.strip():
                self.kernel_line(host, line)

    def set_gpu_power(self, host: str, watts: float | None, temperature_c: float | None = None) -> None:
        """Pin what the nvidia-smi stand-in reads as power.draw (and temperature.gpu) on that host, from
        its next call on. None: power.draw follows the work again (the CPU time the processes it sees
        used since its previous reading, between 4.56 W at rest and 33.5 W at work: standin_bin/
        nvidia-smi), and temperature.gpu is 41 C."""
        cmds = []
        for name, value in (("power_draw_w", watts), ("temperature_c", temperature_c)):
            f = f"/run/nvidia-standin/{name}"
            cmds.append(f"rm -f {f}" if value is None else f"echo {float(value):g} > {f}")
        self.sh(host, " ; ".join(cmds))

    def set_hca_rate(self, host: str, hca: str, rate: str = "100 Gb/sec (2X HDR)") -> None:
        """Write /sys/class/infiniband/<hca>/ports/1/rate (undo: rate="200 Gb/sec (2X NDR)")."""
        self.sh(host, f"echo {shlex.quote(rate)} > /sys/class/infiniband/{shlex.quote(hca)}/ports/1/rate")

    def set_hca_gid(self, host: str, hca: str, index: int, gid: str | None = None) -> None:
        """Empty (gid None) or write one GID of the HCA's port 1 (undo: reset(), which re-applies the
        cabling's GID tables)."""
        f = f"/sys/class/infiniband/{shlex.quote(hca)}/ports/1/gids/{int(index)}"
        self.sh(host, f"echo {shlex.quote(gid or cabling.ZERO_GID)} > {f}")

    def set_hca_state(self, host: str, hca: str, state: str = "1: DOWN") -> None:
        """Write /sys/class/infiniband/<hca>/ports/1/state (undo: state="4: ACTIVE")."""
        phys = "5: LinkUp" if state.startswith("4") else "3: Disabled"
        self.sh(
            host,
            f"d=/sys/class/infiniband/{hca}/ports/1; [ -d $d ] && echo {shlex.quote(state)} > $d/state "
            f"&& echo {shlex.quote(phys)} > $d/phys_state",
        )

    # --- what drifts on a node (issue 39): the testbed's hosts share one kernel, so each reads its own
    # stand-in, bound over the file at the OS boundary in the host's own mount namespace

    def set_kernel(self, host: str, release: str | None = None) -> None:
        """What /proc/sys/kernel/osrelease (`uname -r`'s answer) reads on the host; None: the real one."""
        cmd = "umount /proc/sys/kernel/osrelease 2>/dev/null; true"
        if release is not None:
            cmd += (
                f"; printf '%s\\n' {shlex.quote(release)} > /run/testbed/osrelease"
                " && mount --bind /run/testbed/osrelease /proc/sys/kernel/osrelease"
            )
        self.sh(host, cmd)

    MEMVIEW = "/run/testbed/meminfo-view"

    def set_memory(self, host: str, gb: float | None) -> None:
        """Make `host` read as a Spark of `gb` GB (MemTotal gb x 10^9 bytes: 64 or 128; NVIDIA's
        vllm-cluster page lists "2 x DGX Spark, 64GB each"); None: the machine's own memory again.

        A stand-in at the OS boundary, as lxcfs is: one view per host (standin_bin/testbed-meminfo-view,
        a small loop rewriting MEMVIEW/meminfo every second from the real /proc/meminfo, MemTotal set
        and MemFree/MemAvailable shifted by the same amount), bind-mounted over the host's
        /proc/meminfo (doctor's facts read it over SSH) and bound by testbed-runc into every container
        created while it is on (the supervisor, the memory reports and the metrics read it there).
        Set it before `up`: a container created before keeps what it had. set_cma's lines go into the
        same view while it is on."""
        v = self.MEMVIEW
        stop = f"[ -f {v}/pid ] && kill $(cat {v}/pid) 2>/dev/null; umount /proc/meminfo 2>/dev/null; rm -rf {v}; true"
        self.sh(host, stop)
        if gb is None:
            return
        kib = int(gb * 1e9) // 1024
        prog = shlex.quote(str(BIN / "testbed-meminfo-view"))
        # only the loop goes to the background: a backgrounded `mkdir && ...` list would be a subshell
        # that keeps this command's output pipes open for as long as the loop runs
        self.sh(host, f"mkdir -p {v} && {{ setsid python3 {prog} {v} {kib} </dev/null >/dev/null 2>&1 & }}")
        end = time.monotonic() + 10
        while self.sh(host, f"grep -q '^MemTotal: *{kib} kB' {v}/meminfo", check=False).returncode:
            if time.monotonic() > end:
                raise TestbedError(f"[{host}] testbed-meminfo-view wrote no {v}/meminfo")
            time.sleep(0.2)
        self.sh(host, f"mount --bind {v}/meminfo /proc/meminfo")

    def set_cma(self, host: str, total_kb: int | None = None, free_kb: int = 0) -> None:
        """The host's /proc/meminfo with CmaTotal/CmaFree as given (a copy taken now, the rest of the
        real file kept: its other figures hold still until undone); None: the real file. While the
        host reads as another memory size (set_memory), the lines go into that view instead."""
        v = self.MEMVIEW
        if self.sh(host, f"test -f {v}/pid", check=False).returncode == 0:
            lines = f"CmaTotal: {int(total_kb)} kB\nCmaFree: {int(free_kb)} kB\n" if total_kb is not None else ""
            self.sh(host, f"printf '{lines}' > {v}/overrides")
            return
        cmd = "umount /proc/meminfo 2>/dev/null; true"
        if total_kb is not None:
            cmd += (
                "; grep -v -E '^Cma(Total|Free):' /proc/meminfo > /run/testbed/meminfo"
                f" && printf 'CmaTotal:     %8d kB\\nCmaFree:      %8d kB\\n' {int(total_kb)} {int(free_kb)}"
                " >> /run/testbed/meminfo && mount --bind /run/testbed/meminfo /proc/meminfo"
            )
        self.sh(host, cmd)

    @staticmethod
    def aer_commands(dev_parent: str, fatal: int = 0, nonfatal: int = 0, correctable: int = 0) -> str:
        """Shell writing the AER counters of `dev_parent`/device (an HCA's PCI function) in the kernel's
        format: a count per error type, then the TOTAL_ line (Linux Documentation/ABI/testing/
        sysfs-bus-pci-devices-aer_stats); the fatal and non-fatal counts on the TLP line."""
        d = f"{dev_parent}/device"
        cor = f"RxErr 0\\nBadTLP {int(correctable)}\\nBadDLLP 0\\nRollover 0\\nTimeout 0\\nNonFatalErr 0\\nCorrIntErr 0\\nHeaderOF 0\\nTOTAL_ERR_COR {int(correctable)}\\n"

        def unc(n: int, total: str) -> str:
            return f"Undefined 0\\nDLP 0\\nSDES 0\\nTLP {int(n)}\\nFCP 0\\nCmpltTO 0\\nMalfTLP 0\\nECRC 0\\nUnsupReq 0\\n{total} {int(n)}\\n"

        return (
            f"printf '{cor}' > {d}/aer_dev_correctable; "
            f"printf '{unc(fatal, 'TOTAL_ERR_FATAL')}' > {d}/aer_dev_fatal; "
            f"printf '{unc(nonfatal, 'TOTAL_ERR_NONFATAL')}' > {d}/aer_dev_nonfatal"
        )

    def set_hca_aer(self, host: str, hca: str, fatal: int = 0, nonfatal: int = 0, correctable: int = 0) -> None:
        """An HCA's PCI function's AER counters since boot (the stand-in for sysfs aer_dev_*; undo: all 0)."""
        self.sh(host, self.aer_commands(f"/sys/class/infiniband/{shlex.quote(hca)}", fatal, nonfatal, correctable))

    def set_hca_link_width(self, host: str, hca: str, width: int = 4) -> None:
        """An HCA's PCIe link width (/sys/class/infiniband/<hca>/device/current_link_width; undo: 4)."""
        self.sh(host, f"echo {int(width)} > /sys/class/infiniband/{shlex.quote(hca)}/device/current_link_width")

    def set_speed(self, host: str, ifname: str, mbps: int = 200000) -> None:
        """What /sys/class/net/<if>/speed reads on the host (data-plane netdevs; default 200000)."""
        nd = NETDEVS[self._dp_index(host, ifname)]
        self.sh(host, f"echo {int(mbps)} > /run/testbed/speed/{nd}")

    def _dp_index(self, host: str, ifname: str) -> int:
        names = self.worker_netdevs() if host == WORKER else list(NETDEVS)
        return names.index(ifname)

    def shape_egress(self, host: str, ifname: str, rate: str = "200mbit") -> None:
        """Slow what `host` sends on `ifname` with a token bucket (tc tbf), as a link that trained at a
        lower speed or a half-broken port would. Undo: unshape_egress (reset does it too)."""
        self.sh(
            host,
            f"tc qdisc replace dev {shlex.quote(ifname)} root tbf rate {shlex.quote(rate)} burst 256kb latency 400ms",
        )

    def delay_egress(self, host: str, ifname: str, delay_ms: int = 20) -> str:
        """Delay what crosses `host`'s `ifname` by a fixed time: netem's delay where the kernel has
        sch_netem, else the NFQUEUE stand-in for it (tests/testbed/delay.py: a reader in the host's
        namespaces holds each packet for `delay_ms`, then accepts it, in order). Returns which one
        ("netem", "nfqueue", or "tbf" where neither is possible: a slow token bucket). Undo:
        unshape_egress (reset does it too).

        The stand-in holds what `host` sends at the far end of the cable, in the peer's INPUT (the
        head's link k ends on the worker's netdev k: `worker_netdevs`), as a long cable would: held in
        `host`'s OUTPUT, a packet still counts against its TCP socket's small-queue budget (TSQ; netem
        orphans the packets it delays, NFQUEUE cannot), which serialises a connection's sends behind
        the delay (8 writes of 4 KB then took 147 ms a step against 42 ms on INPUT, a bulk transfer
        0.3 MB/s); held in `host`'s own INPUT, ping does not see it (its round trip is timed by the
        kernel's receive timestamp, taken before the hold). Where no peer is known (a host other than
        the head of the pair), it holds what `host` receives on `ifname`."""
        dev = shlex.quote(ifname)
        got = self.sh(host, f"tc qdisc replace dev {dev} root netem delay {int(delay_ms)}ms", check=False)
        if got.returncode == 0:
            return "netem"
        try:
            self._nfqueue_delay(host, ifname, delay_ms)
            return "nfqueue"
        except (RuntimeError, OSError, TestbedError) as e:
            log(f"[{host}] no NFQUEUE delay on {ifname} ({e}); a token bucket instead")
        # a queue long enough never to drop (latency 60s): a dropped segment of the ranks' gloo stream
        # waits out TCP's retransmission backoff, which stalled the engine into a wedge verdict at
        # 256 kbit with a 2 s queue, where the point is a slow link, not a broken one
        self.sh(host, f"tc qdisc replace dev {dev} root tbf rate 512kbit burst 1600 latency 60s")
        return "tbf"

    def _nfqueue_delay(self, host: str, ifname: str, delay_ms: int) -> None:
        """Start delay.py's reader in the host and its NFQUEUE rule on `ifname`; state.json keeps its
        process group and queue number for unshape_egress (which may run in another process)."""
        self._stop_nfqueue_delays(host, [ifname])
        at_host, at_if = host, ifname
        if host == HEAD and ifname in NETDEVS and WORKER in self.hosts:  # the far end of the cable
            at_host, at_if = WORKER, self.worker_netdevs()[NETDEVS.index(ifname)]
        held = [d for h in self._state().get("hosts", {}).values() for d in h.get("delays", {}).values()]
        queue = next(q for q in range(100, 200) if q not in {d["queue"] for d in held})
        self.host_dir(at_host).mkdir(parents=True, exist_ok=True)
        p = delay.start(
            self.nsenter_argv(at_host),
            at_if,
            delay_ms,
            queue=queue,
            chains=("INPUT",),
            log_path=self.host_dir(at_host) / "delay.log",
            python=SYS_PYTHON,
        )
        st = self._state()
        st.setdefault("hosts", {}).setdefault(host, {}).setdefault("delays", {})[ifname] = {
            "pgid": p.pid,
            "queue": queue,
            "delay_ms": delay_ms,
            "at_host": at_host,
            "at_if": at_if,
        }
        self._save(st)

    def _stop_nfqueue_delays(self, host: str, names: list[str] | None) -> None:
        """Remove the NFQUEUE rules of `names` (all when None), then end their readers (which accept
        what they hold first)."""
        argv = self.nsenter_argv(host)
        st = self._state()
        held = st.get("hosts", {}).get(host, {}).get("delays", {})
        gone = list(held) if names is None else [n for n in names if n in held]
        readers = []
        ends = []  # where each rule is: (namespace's argv, netdev)
        for n in gone:
            entry = held.pop(n)
            pgid = entry["pgid"]
            ends.append((self.nsenter_argv(entry.get("at_host", host)), entry.get("at_if", n)))
            try:
                cmd = Path(f"/proc/{pgid}/cmdline").read_bytes()
            except OSError:
                cmd = b""
            if b"delay.py" in cmd or cmd.startswith(b"nsenter"):  # not a pid reused since
                readers.append(pgid)
                delay.pass_through(pgid)  # no more delay before the rule goes: nothing overtakes
        for n in names or [None]:
            delay.remove_rules(argv, n)
        for at_argv, at_if in ends:
            delay.remove_rules(at_argv, at_if)
        for pgid in readers:
            delay.end_reader(pgid)
        if gone:
            self._save(st)

    def unshape_egress(self, host: str, ifname: str | None = None) -> None:
        names = [ifname] if ifname else self.worker_netdevs() if host == WORKER else list(NETDEVS)
        self.sh(
            host,
            " ; ".join(f"tc qdisc del dev {shlex.quote(n)} root 2>/dev/null" for n in names) + " ; true",
            check=False,
        )
        self._stop_nfqueue_delays(host, [ifname] if ifname else None)

    def hide_uverbs(self, host: str) -> None:
        """Take the uverbs devices out of the host's /dev/infiniband, so a container made with
        --device=/dev/infiniband has no RDMA device (seed 002's worker). Undo: show_uverbs."""
        self.sh(host, "mkdir -p /run/testbed/uverbs-aside && mv /dev/infiniband/uverbs* /run/testbed/uverbs-aside/")

    def show_uverbs(self, host: str) -> None:
        self.sh(
            host,
            "[ -d /run/testbed/uverbs-aside ] && mv /run/testbed/uverbs-aside/* /dev/infiniband/ 2>/dev/null; true",
            check=False,
        )

    def link_down(self, host: str, ifname: str) -> None:
        """Take a link down on a host (data plane netdev, or LAN_IF for the LAN). Undo: link_up."""
        self.sh(host, f"ip link set dev {shlex.quote(ifname)} down")

    def link_up(self, host: str, ifname: str) -> None:
        self.sh(host, f"ip link set dev {shlex.quote(ifname)} up")
        if ifname == LAN_IF:
            s = SPECS[host]
            self.sh(host, f"ip route replace default via {s.ctl_ip} dev {LAN_IF}")

    def lan_down(self, host: str) -> None:
        """Pull the host's LAN cable (controller side down: the host is unreachable). Undo: lan_up."""
        run(["ip", "link", "set", SPECS[host].ctl_if, "down"])

    def lan_up(self, host: str) -> None:
        run(["ip", "link", "set", SPECS[host].ctl_if, "up"])

    def worker_netdevs(self) -> list[str]:
        """The worker's netdev at the far end of head link k, in head order."""
        return list(CROSSED if self._state().get("crossed") else NETDEVS)

    def cable_worker(self, crossed: bool = True) -> Path:
        """Re-cable the worker: its ports named in another order than the head's (sparkrun#135).
        Renames the worker's netdevs (HCAs follow their netdev, as on hardware) and rewrites
        cluster.toml. Undo: cable_worker(False)."""
        cur = self.worker_netdevs()
        new = list(CROSSED if crossed else NETDEVS)
        if cur != new:
            ren = " && ".join(
                f"ip link set dev {a} down && ip link set dev {a} name tbren{k}" for k, a in enumerate(cur)
            )
            ren += " && " + " && ".join(
                f"ip link set dev tbren{k} name {b} && ip link set dev {b} up" for k, b in enumerate(new)
            )
            self.sh(WORKER, ren)
            # a rename drops the mounts on the old sysfs entries: bind each port's speed file again
            self.sh(
                WORKER,
                " ; ".join(
                    f"umount /sys/class/net/{b}/speed 2>/dev/null; "
                    f"mount --bind /run/testbed/speed/{NETDEVS[k]} /sys/class/net/{b}/speed"
                    for k, b in enumerate(new)
                ),
            )
        self._update(crossed=crossed)
        self._apply_cabling(WORKER)  # the renamed ports: up/down, HCA states and GIDs by their new names
        return self.write_inventory(crossed=crossed)

    def replace_host_key(self, host: str) -> str:
        """Give the host's sshd a new host key without updating known_hosts (undo: restore_host_key).
        Returns the new public key line."""
        d = self.host_dir(host)
        key = d / "ssh_host_ed25519_key"
        orig = d / "ssh_host_ed25519_key.orig"
        if not orig.exists():
            shutil.copy2(key, orig)
            shutil.copy2(key.with_suffix(".pub"), d / "ssh_host_ed25519_key.pub.orig")
        key.unlink()
        key.with_suffix(".pub").unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host}-new", "-f", str(key)])
        self.stop_sshd(host)
        self.start_sshd(host)
        return key.with_suffix(".pub").read_text().strip()

    def restore_host_key(self, host: str) -> None:
        d = self.host_dir(host)
        orig = d / "ssh_host_ed25519_key.orig"
        if orig.exists():
            key = d / "ssh_host_ed25519_key"
            os.replace(orig, key)
            os.replace(d / "ssh_host_ed25519_key.pub.orig", key.with_suffix(".pub"))
            self.stop_sshd(host)
            self.start_sshd(host)

    def disk_free_mb(self, host: str) -> int:
        out = self.sh(host, "df -Pk /var/lib/docker | tail -1").stdout.split()
        return int(out[3]) // 1024

    def fill_disk(self, host: str, leave_mb: int) -> None:
        """Fill the host's docker disk until about leave_mb MB are free (undo: unfill_disk)."""
        self.unfill_disk(host)
        free = self.disk_free_mb(host)
        size = max(free - int(leave_mb), 0)
        if size:
            self.sh(
                host,
                f"fallocate -l {size}M /var/lib/docker/.testbed-fill || "
                f"dd if=/dev/zero of=/var/lib/docker/.testbed-fill bs=1M count={size} status=none",
            )

    def fill_disk_during_load(self, host: str, leave_mb: int, within_s: float = 120) -> threading.Thread:
        """After fill_disk: a thread that waits until docker load starts unpacking on host (its
        docker-import-* directory appears), then fills the docker disk to about leave_mb MB free, as
        another writer on the same disk would (undo: unfill_disk)."""
        # fills only once the load has begun, and gives up when the base fill is gone
        # (unfill_disk): a late fill must not outlive its test
        script = (
            f"found=; for i in $(seq {int(within_s * 20)}); do [ -e /var/lib/docker/.testbed-fill ] || exit 0; "
            "ls -d /var/lib/docker/tmp/docker-import-* >/dev/null 2>&1 && { found=1; break; }; sleep 0.05; done; "
            '[ -n "$found" ] && [ -e /var/lib/docker/.testbed-fill ] || exit 0; '
            "free=$(( $(df -Pk /var/lib/docker | tail -1 | awk '{print $4}') / 1024 )); "
            f"[ $free -gt {int(leave_mb)} ] && fallocate -l $(( free - {int(leave_mb)} ))M "
            "/var/lib/docker/.testbed-fill-late; true"
        )
        t = threading.Thread(target=self.sh, args=(host, script), kwargs={"timeout": within_s + 30}, daemon=True)
        t.start()
        return t

    def unfill_disk(self, host: str) -> None:
        self.sh(host, "rm -f /var/lib/docker/.testbed-fill /var/lib/docker/.testbed-fill-late")

    def kill_container(self, host: str, name: str, sig: str = "KILL") -> None:
        """Kill a container's main process from the host, as the OOM killer or a crash would."""
        pid = self.docker(host, f"inspect --format '{{{{.State.Pid}}}}' {shlex.quote(name)}").stdout.strip()
        if pid and pid != "0":
            self.sh(host, f"kill -{sig} {pid}")

    def set_driver_version(self, host: str, version: str = DRIVER) -> None:
        """What nvidia-smi reports as driver_version on that host (undo: set_driver_version(host))."""
        self.sh(host, f"echo {shlex.quote(version)} > /run/nvidia-standin/driver_version")

    def set_gpu_slow(self, host: str, cpus: float | None) -> None:
        """The GPU stand-in made slow on that host (issue 39 item 3): every GPU container created there
        from now on gets `cpus` CPUs' worth of time (the runtime wrapper sets its cgroup quota), so the
        fabric test's GPU workload, torch on the CPU here, runs slower there only. None undoes it."""
        f = "/run/nvidia-standin/gpu_slow_cpus"
        self.sh(host, f"rm -f {f}" if cpus is None else f"echo {float(cpus)} > {f}")

    def hold_port(self, host: str, port: int, addr: str = "0.0.0.0") -> PortHolder:
        """A foreign (non-sparkcluster) process listening on host:port; use as a context manager or release()."""
        return PortHolder(self, host, port, addr)

    def remove_containers(self, host: str, label: str | None = None, names: list[str] | None = None) -> None:
        """docker rm -f by label or names (only what a test made)."""
        if names:
            self.docker(host, "rm -f " + " ".join(shlex.quote(n) for n in names), check=False)
        if label:
            self.docker(host, f"ps -aq --filter label={shlex.quote(label)} | xargs -r docker rm -f", check=False)

    def connections_logged(self, host: str) -> int:
        """sshd 'Accepted publickey' lines so far (for benchmarks counting SSH connections)."""
        try:
            return sum(
                1
                for line in self.sshd_log(host).read_text(errors="replace").splitlines()
                if "Accepted publickey" in line
            )
        except OSError:
            return 0


def ssh_account(tb: Testbed | None = None) -> dict:
    """Who the testbed's SSH user is, from its facts file (ssh_user, uid, gid, home, hf_cache)."""
    tb = tb or Testbed()
    try:
        return json.loads(tb.facts_file.read_text())
    except FileNotFoundError:
        raise TestbedError(f"no {tb.facts_file}: the testbed is not up (or predates its ordinary SSH user)") from None
