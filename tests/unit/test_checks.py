"""Every check: a healthy two-Spark cluster passes; breaking one thing on one node flips exactly
that check on that node and nothing else."""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field

import pytest
from conftest import (
    LINKS,
    NODES,
    cap,
    carrier_text,
    control_ip,
    gid_text,
    hca_text,
    inventory_dict,
    link_ip,
    make_inventory,
    spark_ip_json,
)
from drift_fakes import DRIFT_CASES, healthy_image_nccl, healthy_traits

from sparkcluster import checks, facts
from sparkcluster.checks import GiB
from sparkcluster.config import profile as profiles
from sparkcluster.facts import access, parsers, probes

H, W = "spark-head", "spark-worker"
IMAGE = "sparkcluster/vllm-ray:26.05.post1-py3-ray2.49.2"
IMAGE_ID = "sha256:3f9c2d1e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b5b1c0e7f2a9d4c3b8e"
BASE_IMAGE = "nvcr.io/nvidia/vllm:26.05.post1-py3"
BASE = parsers.image_layers(f'sha256:{"b" * 64} ["sha256:{"1" * 64}","sha256:{"2" * 64}"]\n9000000000\n')
FORWARDED = {
    "VLLM_NVFP4_GEMM_BACKEND": "marlin",
    "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm",
    "VLLM_USE_FLASHINFER_MOE_FP4": "0",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
}
HEAD_INSPECT = json.loads(cap("gb10-docker-inspect-head.json"))[0]
HEAD_CID = HEAD_INSPECT["Id"]
WORKER_CID = "7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b5b1c0e7f2a9d4c3b8e6f1a0d9c8b"
# a 64 GB Spark's MemTotal: half of the 128 GB one's (NVIDIA's vllm-cluster page: "2 x DGX Spark,
# 64GB each"); the real figure of a 64 GB unit is not in the project's captures
MEMINFO_64 = "MemTotal:       62638174 kB\nMemFree:        50000000 kB\nMemAvailable:   55000000 kB\n"
MEMINFO = "MemTotal:       125276348 kB\nMemFree:         3187216 kB\nMemAvailable:   73400320 kB\n"
# the SSH user as the account and access probes print it on the testbed's hosts (an ordinary
# account in docker, as on a Spark), and the Docker probe as the socket refuses one outside docker
_AA = probes.split_sections(cap("testbed-account-access-probe.txt"))
ACCOUNT = _AA["account"].out
ACCESS = (
    _AA["access"]
    .out.replace("cache_ok /home/spark\n", "cache_ok /home/spark/.cache/huggingface\n")
    .replace("testbed.lock", "pair.lock")
)
DOCKER_DENIED = parsers.last_line(probes.split_sections(cap("testbed-docker-denied-probe.txt"))["docker"].out)
DF = (
    "Filesystem            1-blocks         Used     Available Capacity Mounted on\n"
    "/dev/nvme0n1p2 3936818520064 412043304960 1324727701504      24% /\n"
)


@dataclass
class State:
    """Everything a check sees, in a form a test can break before `ctx()` builds the Context."""

    inv: dict
    facts: dict[str, facts.HostFacts]
    unreachable: dict[str, str] = field(default_factory=dict)
    expect: dict = field(default_factory=dict)
    # what `docker inspect` prints of our containers on each node, parsed into the facts by `ctx()`
    inspect: dict[str, list[dict]] = field(default_factory=dict)

    def ctx(self) -> checks.Context:
        for name, ours in self.inspect.items():
            if name in self.facts:
                self.facts[name].ours = parsers.docker_inspect_json(json.dumps(ours))
        inv = make_inventory(self.inv)
        exp = dict(self.expect)
        # per-host values are what sparkcluster derives from the inventory (profile.per_host_env)
        exp["per_host_env"] = {n.name: profiles.per_host_env(None, inv, n) for n in inv.nodes}
        return checks.Context(inv, self.facts, self.unreachable, checks.Expect(**exp))

    def node(self, name: str) -> dict:
        return next(n for n in self.inv["nodes"] if n["name"] == name)

    def env(self, name: str) -> list[str]:
        return self.inspect[name][0]["Config"]["Env"]

    def set_env(self, name: str, key: str, value: str | None) -> None:
        env = [e for e in self.env(name) if not e.startswith(key + "=")]
        if value is not None:
            env.append(f"{key}={value}")
        self.inspect[name][0]["Config"]["Env"] = env


def _container_inspect(name: str, role: str, host: int) -> dict:
    c = copy.deepcopy(HEAD_INSPECT)
    if role == "worker":
        c["Id"] = WORKER_CID
        c["Name"] = f"/sparkcluster-pair-worker-{name}"
        c["Config"]["Labels"]["org.sparkcluster.role"] = "worker"
        c["Config"]["Hostname"] = name
        c["Config"]["Cmd"] = [
            "ray",
            "start",
            "--address",
            f"{control_ip(1)}:6379",
            "--node-ip-address",
            control_ip(host),
            "--block",
        ]
    env = [e for e in c["Config"]["Env"] if not e.startswith("VLLM_HOST_IP=")]
    c["Config"]["Env"] = env + [f"VLLM_HOST_IP={control_ip(host)}"]
    return c


def _ps_line(c: dict) -> str:
    labels = ",".join(f"{k}={v}" for k, v in sorted(c["Config"]["Labels"].items()))
    cmd = " ".join(c["Config"]["Entrypoint"] + c["Config"]["Cmd"])
    return json.dumps(
        {
            "Command": f'"{cmd}"',
            "ID": c["Id"],
            "Image": c["Config"]["Image"],
            "Labels": labels,
            "Names": c["Name"].lstrip("/"),
            "Networks": "host",
            "State": "running",
            "Status": "Up 38 minutes",
        }
    )


def _host_facts(name: str, role: str, host: int, ours: dict) -> facts.HostFacts:
    f = facts.HostFacts(node=name, hostname=name, clock_offset=0.010 * host)
    f.gpus = parsers.nvidia_smi_csv(cap("gb10-nvidia-smi.csv"))
    f.docker = parsers.docker_info(cap("gb10-docker-info.json"))
    f.gpu_hook = "/usr/bin/nvidia-container-runtime-hook"
    f.interfaces = parsers.ip_addr_json(spark_ip_json(host))
    for nd, carrier, speed in parsers.carrier_lines(carrier_text()):
        f.interfaces[nd].carrier, f.interfaces[nd].speed_mbps = carrier, speed
    f.hcas = parsers.hca_lines(hca_text())
    f.gids = parsers.gid_lines(gid_text(host))
    f.default_routes = ["enP7s7"]
    f.mem = parsers.meminfo(MEMINFO)
    f.earlyoom = True
    f.sshd_oom_score_adj = -1000
    if role == "head":
        # the head container (host network) holds Ray's GCS port and the API port
        f.listeners = parsers.ss_listeners(
            f'LISTEN 0      4096         0.0.0.0:6379       0.0.0.0:*    users:(("gcs_server",pid=48391,fd=21)) container={HEAD_CID}\n'
            f'LISTEN 0      2048         0.0.0.0:8000       0.0.0.0:*    users:(("python3",pid=49120,fd=27)) container={HEAD_CID}\n'
        )
        # the captured ps: our head plus an exited hand-made Ray container (not running: not a problem)
        f.containers = parsers.docker_ps_json(cap("gb10-docker-ps.jsonl"))
    else:
        f.containers = parsers.docker_ps_json(_ps_line(ours))
    f.image_id = IMAGE_ID
    f.image_ray = "ray, version 2.49.2"
    f.base = BASE
    f.disks = parsers.df_lines(DF)
    f.ray_sessions = ["/tmp/ray/session_2026-11-21_22-03-55_118733_1", "/tmp/ray/session_latest"]
    f.account = access.parse_account(ACCOUNT)
    f.access = access.parse_access(ACCESS)
    f.traits = healthy_traits()
    f.image_nccl = healthy_image_nccl(IMAGE_ID)
    return f


def healthy() -> State:
    inv_data = inventory_dict()
    ours = {name: [_container_inspect(name, role, host)] for name, role, host in NODES}
    hf = {name: _host_facts(name, role, host, ours[name][0]) for name, role, host in NODES}
    inv = make_inventory(inv_data)
    ok_line = parsers.last_line(cap("vm-ping-lo-8972.txt"))
    for node in inv.nodes:
        peer_if = {str(a.ip): i.mac for n, f in hf.items() for i in f.interfaces.values() for a in i.addresses}
        hf[node.name].path_mtu = [
            parsers.PingResult(
                p.netdev, p.peer_node, p.peer_ip, p.size, True, ok_line, facts.ping_command(p), peer_if[p.peer_ip]
            )
            for p in facts.path_mtu_probes(node, hf)
        ]
    expect = dict(
        image=IMAGE,
        base_image=BASE_IMAGE,
        forwarded_env=dict(FORWARDED),
        gpu_memory_utilization=0.75,
        image_disk_bytes=30 * GiB,
        model_disk_bytes=100 * GiB,
        # seed 002: Nemotron-3-Super NVFP4 over TP=2 holds ~30-40 GB of weights per node (field notes)
        weights_per_rank=40 * 10**9,
        weights_source="40.0 GB of weights over TP 2 x PP 1, from the hub's listing",
    )
    return State(inv_data, hf, {}, expect, ours)


def results(state: State) -> dict[tuple[str, str], checks.Result]:
    return {(r.id, r.node): r for r in checks.run_checks(state.ctx())}


BASELINE = results(healthy())


# --- the healthy cluster ------------------------------------------------------------------------


def test_healthy_cluster_all_ok():
    bad = [r for r in BASELINE.values() if r.status != "ok"]
    assert bad == []
    assert {cid for cid, _ in BASELINE} == {cid for cid, _, _ in checks.REGISTRY}
    assert {n for _, n in BASELINE} == {H, W}


def test_healthy_path_mtu_pairs_every_link_both_ways():
    s = healthy()
    for name, host in ((H, 1), (W, 2)):
        peer = 2 if host == 1 else 1
        assert {p.netdev: p.peer_ip for p in s.facts[name].path_mtu} == {nd: link_ip(k, peer) for nd, _, k in LINKS}


def test_no_profile_skips_what_it_cannot_judge():
    s = healthy()
    s.expect = {}
    got = results(s)
    for cid in ("image.same", "image.ray", "image.base-same", "containers.forwarded_env"):
        assert got[(cid, H)].status == got[(cid, W)].status == "skip"
    assert got[("gpu.gb10", W)].status == "ok"


# --- one break per case -------------------------------------------------------------------------


def _set_control_ip(s: State, node: str, ip: str, iface: str | None = "control") -> None:
    """The inventory names `ip` as the node's control IP; sparkcluster started its container with
    VLLM_HOST_IP=ip. `iface`: where the address is configured ("control": on control_if, None: nowhere)."""
    n = s.node(node)
    old = n["control_ip"]
    n["control_ip"] = ip
    s.set_env(node, "VLLM_HOST_IP", ip)
    if iface is not None:
        name = n["control_if"] if iface == "control" else iface
        i = s.facts[node].interfaces[name]
        i.addresses = [a for a in i.addresses if str(a.ip) != old] + [_addr(ip, 24 if iface == "control" else 16)]


def _addr(ip: str, prefix: int) -> parsers.Address:
    import ipaddress

    return parsers.Address(ipaddress.IPv4Address(ip), ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False))


def non_gb10(s):
    s.facts[W].gpus = parsers.nvidia_smi_csv("NVIDIA H100 80GB HBM3, 580.95.05, 81559 MiB, 9.0\n")


def other_driver(s):
    s.facts[W].gpus = [dataclasses.replace(g, driver="580.82.09") for g in s.facts[W].gpus]


def below_min_driver(s):
    # the profile states a minimum (min_driver) that only the worker lacks
    other_driver(s)
    s.expect["min_driver"] = "580.95"


def docker_down(s):
    f = s.facts[W]
    sec = probes.split_sections(cap("vm-probe.txt"))["docker"]  # real: the CLI without a daemon
    f.docker, f.docker_error = None, parsers.last_line(sec.out)
    f.image_id = f.image_ray = None  # `docker image inspect` fails too


def _socket_refuses(f):
    f.docker, f.docker_error = None, DOCKER_DENIED
    f.image_id = f.image_ray = None  # `docker image inspect` is refused too


def not_in_docker_group(s):
    f = s.facts[W]
    f.account = access.parse_account(ACCOUNT.replace("spark docker\n", "spark\n"))
    _socket_refuses(f)


def added_to_docker_not_relogged(s):
    f = s.facts[W]
    f.account = access.parse_account(ACCOUNT.replace("spark docker\nspark docker", "spark\nspark docker"))
    _socket_refuses(f)


def cache_root_owned(s):
    s.facts[W].access = access.parse_access(
        ACCESS.replace("cache_ok /home/spark/.cache/huggingface", "cache_denied root /home/spark/.cache")
    )


def cache_holds_root_files(s):
    s.facts[W].access = access.parse_access(
        ACCESS + "cache_foreign root /home/spark/.cache/huggingface/hub/models--o--m\n"
    )


def lock_dir_foreign(s):
    s.facts[W].access = access.parse_access(
        ACCESS.replace("lock_ok /tmp/sparkcluster/pair.lock", "lock_denied bob /tmp/sparkcluster")
    )


def no_flock(s):
    s.facts[W].access = access.parse_access(ACCESS + "lock_noflock\n")


def no_gpu_runtime(s):
    f = s.facts[W]
    f.gpu_hook = ""
    f.docker = dataclasses.replace(f.docker, runtimes=("io.containerd.runc.v2", "runc"))


def image_differs(s):
    s.facts[W].image_id = "sha256:" + "0" * 64


def image_missing(s):
    s.facts[W].image_id = s.facts[W].image_ray = None


def base_differs(s):
    # the tag re-pushed upstream and pulled on the worker another day
    s.facts[W].base = dataclasses.replace(BASE, id="sha256:" + "c" * 64)


def ray_missing(s):
    s.facts[W].image_ray = None
    s.facts[
        W
    ].image_ray_error = 'docker: Error response from daemon: failed to create task for container: exec: "ray": executable file not found in $PATH: unknown'


def control_link_local(s):
    _set_control_ip(s, W, "169.254.33.2")


def control_docker_bridge(s):
    _set_control_ip(s, W, "172.17.0.1", iface=None)  # docker0's address, already on docker0


def control_not_on_iface(s):
    _set_control_ip(s, W, "198.19.9.2", iface=None)


def control_duplicated(s):
    # the worker's control IP is also configured on the head (a secondary address on its management port)
    s.facts[H].interfaces["enP7s7"].addresses.append(_addr(control_ip(2), 24))


def vllm_host_ip_wrong(s):
    s.set_env(W, "VLLM_HOST_IP", control_ip(1))


def link_admin_down(s):
    i = s.facts[W].interfaces["enP2p1s0f0np0"]
    i.up, i.lower_up, i.operstate = False, False, "DOWN"


def link_no_carrier(s):
    i = s.facts[W].interfaces["enP2p1s0f1np1"]
    i.lower_up, i.carrier, i.operstate, i.speed_mbps = False, False, "DOWN", None


def link_missing(s):
    del s.facts[W].interfaces["enp1s0f0np0"]


def mtu_1500(s):
    s.facts[W].interfaces["enP2p1s0f0np0"].mtu = 1500


def path_mtu_fails(s):
    k = next(i for i, p in enumerate(s.facts[W].path_mtu) if p.netdev == "enP2p1s0f0np0")
    s.facts[W].path_mtu[k] = dataclasses.replace(
        s.facts[W].path_mtu[k], ok=False, detail=parsers.last_line(cap("vm-ping-eth0-1472-toolarge.txt"))
    )


def twins_share_subnet(s):
    # eugr/spark-vllm-docker#270: the owner put the port's second twin on the first twin's subnet too
    s.facts[W].interfaces["enP2p1s0f1np1"].addresses.append(_addr("198.19.2.3", 24))


def twin_up_without_ipv4(s):
    # the twin is up (and listed) but has no IPv4, so the kernel made no RoCE v2 IPv4 GID for its HCA
    s.facts[W].interfaces["enP2p1s0f0np0"].addresses = []
    s.facts[W].gids["roceP2p1s0f0"] = [g for g in s.facts[W].gids["roceP2p1s0f0"] if g.ipv4 is None]


def hca_without_v4_gid(s):
    # the address is there but the GID table has only the IPv6 link-local entries (e.g. read too early)
    s.facts[W].gids["rocep1s0f0"] = [g for g in s.facts[W].gids["rocep1s0f0"] if g.ipv4 is None]


def gid_index_shifted(s):
    # one more IPv6 address on every worker port pushes the IPv4 GIDs two entries down: index 5, not 3
    s.facts[W].gids = {
        h: [dataclasses.replace(g, index=g.index + 2 if g.ipv4 else g.index) for g in gs]
        for h, gs in s.facts[W].gids.items()
    }


def gid_index_shifted_under_the_inventory(s):
    # an older init wrote index 3 into the worker's inventory (and its container); its IPv4 GIDs now
    # sit at 5: the pin is ignored (NCCL finds the GID itself), doctor WARNs to remove it
    s.node(W)["gid_index"] = 3
    s.set_env(W, "NCCL_IB_GID_INDEX", "3")
    gid_index_shifted(s)


def rail_degraded(s):
    s.facts[W].interfaces["enP2p1s0f1np1"].speed_mbps = 100000


def peer_is_third_machine(s):
    # the worker's path MTU probe on enp1s0f0np0 was answered by a MAC no cluster node has
    k = next(i for i, p in enumerate(s.facts[W].path_mtu) if p.netdev == "enp1s0f0np0")
    s.facts[W].path_mtu[k] = dataclasses.replace(s.facts[W].path_mtu[k], peer_mac="b8:ce:f6:01:02:03")


def default_route_on_cx7(s):
    s.facts[W].default_routes = ["enp1s0f1np1"]


def hca_down(s):
    s.facts[W].hcas["roceP2p1s0f1"] = dataclasses.replace(s.facts[W].hcas["roceP2p1s0f1"], state="1: DOWN")


def hca_missing(s):
    del s.facts[W].hcas["roceP2p1s0f0"]


def hca_wrong_netdev(s):
    # the worker's cables sit in the other ports: its HCAs pair with the netdevs the other way round
    swapped = [
        ("enp1s0f1np1", "rocep1s0f0", 0),
        ("enp1s0f0np0", "rocep1s0f1", 0),
        ("enP2p1s0f0np0", "roceP2p1s0f0", 0),
        ("enP2p1s0f1np1", "roceP2p1s0f1", 0),
    ]
    s.facts[W].hcas = parsers.hca_lines(hca_text(swapped))


def mem_low(s):
    s.facts[W].mem = parsers.meminfo(
        "MemTotal:       125276348 kB\nMemFree:          412000 kB\nMemAvailable:    3145728 kB\n"
    )


def weights_too_large(s):
    # one rank's share of 100 GB: more than 0.75 x MemTotal of a 128 GB Spark (96 GB)
    s.expect["weights_per_rank"] = 100 * 10**9


def worker_64_gb(s):
    s.facts[W].mem = parsers.meminfo(MEMINFO_64)


def no_earlyoom(s):
    s.facts[W].earlyoom = False


def sshd_oom_zero(s):
    s.facts[W].sshd_oom_score_adj = 0


def port_8000_foreign(s):
    # real: a host process (python3 -m http.server) holding 8000, as the probe's listener loop printed it
    sec = probes.split_sections(cap("vm-probe.txt"))["listeners"]
    s.facts[H].listeners = [ls for ls in s.facts[H].listeners if ls.port != 8000] + parsers.ss_listeners(sec.out)


def port_6379_other_container(s):
    s.facts[W].listeners = parsers.ss_listeners(
        'LISTEN 0      4096         0.0.0.0:6379       0.0.0.0:*    users:(("gcs_server",pid=777,fd=21)) '
        "container=9e8d7c6b5a4f3e2d1c0b5b1c0e7f2a9d4c3b8e6f1a0d9c8b7a6f5e4d3c2b1a0f\n"
    )


def foreign_ray(s):
    s.facts[W].containers += parsers.docker_ps_json(
        json.dumps(
            {
                "Command": '"/opt/nvidia/nvidia_entrypoint.sh ray start --head --block"',
                "ID": "1" * 64,
                "Image": "nvcr.io/nvidia/vllm:25.11-py3",
                "Labels": "com.nvidia.volumes.needed=nvidia_driver",
                "Names": "vllm_node",
                "State": "running",
                "Status": "Up 2 days",
            }
        )
    )


def ours_exited(s):
    old = copy.deepcopy(s.inspect[W][0])
    old["Id"], old["Name"] = "2" * 64, "/sparkcluster-pair-worker-old"
    old["State"] = {**old["State"], "Status": "exited", "Running": False, "ExitCode": 137}
    s.inspect[W].append(old)


def disk_small(s):
    s.facts[W].disks = parsers.df_lines(DF.replace("1324727701504", str(20 * GiB)))


def clock_40s(s):
    s.facts[W].clock_offset = 40.0


def clock_5s(s):
    s.facts[W].clock_offset = 5.0


def forwarded_missing(s):
    s.set_env(W, "VLLM_NVFP4_GEMM_BACKEND", None)


def forwarded_different(s):
    s.set_env(W, "VLLM_USE_FLASHINFER_MOE_FP4", "1")


def nccl_ib_hca_wrong(s):
    s.set_env(W, "NCCL_IB_HCA", "rocep1s0f1,rocep1s0f0,roceP2p1s0f0,roceP2p1s0f1")


def gloo_on_another_interface(s):
    s.set_env(W, "GLOO_SOCKET_IFNAME", "enP7s7")


def no_infiniband_device(s):
    s.inspect[W][0]["HostConfig"]["Devices"] = []


def no_ipc_lock(s):
    s.inspect[W][0]["HostConfig"]["CapAdd"] = None


def no_memlock_ulimit(s):
    s.inspect[W][0]["HostConfig"]["Ulimits"] = [
        u for u in s.inspect[W][0]["HostConfig"]["Ulimits"] if u["Name"] != "memlock"
    ]


def memory_cap_on_head(s):
    s.inspect[H][0]["HostConfig"]["Memory"] = 64 * GiB


def memory_cap_on_worker(s):
    s.inspect[W][0]["HostConfig"]["Memory"] = 64 * GiB


REFUSED = {
    ("docker.engine", W): "skip",
    ("docker.gpu_runtime", W): "skip",
    ("image.same", W): "skip",
    ("image.ray", W): "skip",
    ("image.base-same", W): "skip",
}

# (check id, node that must flip, status, break, {other rows that change by design: status})
CASES = [
    ("gpu.gb10", W, "fail", non_gb10, {}),
    ("gpu.driver", W, "warn", other_driver, {}),
    ("gpu.driver", W, "fail", below_min_driver, {}),
    # with no engine there is nothing to ask about runtimes or images: those rows skip on that node
    (
        "docker.engine",
        W,
        "fail",
        docker_down,
        {
            ("docker.gpu_runtime", W): "skip",
            ("image.same", W): "skip",
            ("image.ray", W): "skip",
            ("image.base-same", W): "skip",
            ("account.docker", W): "skip",
        },
    ),
    ("docker.gpu_runtime", W, "fail", no_gpu_runtime, {}),
    # the socket refuses the SSH user: its row names the group fix; the engine's rows cannot judge
    ("account.docker", W, "fail", not_in_docker_group, REFUSED),
    ("account.docker", W, "fail", added_to_docker_not_relogged, REFUSED),
    ("account.hf_cache", W, "fail", cache_root_owned, {}),
    ("account.hf_cache", W, "warn", cache_holds_root_files, {}),
    ("account.lock", W, "fail", lock_dir_foreign, {}),
    ("account.lock", W, "fail", no_flock, {}),
    ("image.same", W, "fail", image_differs, {}),
    ("image.same", W, "warn", image_missing, {("image.ray", W): "skip"}),
    ("image.ray", W, "fail", ray_missing, {}),
    ("image.base-same", W, "warn", base_differs, {}),
    ("net.control_ip", W, "fail", control_link_local, {}),
    ("net.control_ip", W, "fail", control_docker_bridge, {}),
    ("net.control_ip", W, "fail", control_not_on_iface, {}),
    ("net.control_ip", W, "fail", control_duplicated, {}),
    ("net.vllm_host_ip", W, "fail", vllm_host_ip_wrong, {}),
    ("net.link", W, "fail", link_admin_down, {}),
    ("net.link", W, "fail", link_no_carrier, {}),
    ("net.mtu", W, "fail", mtu_1500, {}),
    ("net.path_mtu", W, "fail", path_mtu_fails, {}),
    ("net.twins", W, "fail", twins_share_subnet, {}),
    ("rdma.gid", W, "fail", twin_up_without_ipv4, {}),
    ("rdma.gid", W, "fail", hca_without_v4_gid, {}),
    ("rdma.gid", W, "warn", gid_index_shifted_under_the_inventory, {}),
    ("net.speed", W, "warn", rail_degraded, {}),
    ("net.peer", W, "fail", peer_is_third_machine, {}),
    ("net.default_route", W, "warn", default_route_on_cx7, {}),
    ("rdma.hca", W, "fail", hca_down, {}),
    ("rdma.hca", W, "fail", hca_missing, {}),
    ("rdma.hca", W, "fail", hca_wrong_netdev, {}),
    ("mem.headroom", W, "warn", mem_low, {}),
    ("mem.fit", W, "fail", weights_too_large, {("mem.fit", H): "fail"}),
    ("mem.size", W, "warn", worker_64_gb, {}),
    # its thresholds cannot be judged either (mem.earlyoom_args, issue 39)
    ("mem.earlyoom", W, "warn", no_earlyoom, {("mem.earlyoom_args", W): "skip"}),
    ("mem.sshd_oom", W, "warn", sshd_oom_zero, {}),
    ("ports.free", H, "fail", port_8000_foreign, {}),
    ("ports.free", W, "fail", port_6379_other_container, {}),
    ("ray.stale", W, "fail", foreign_ray, {}),
    ("ray.stale", W, "warn", ours_exited, {}),
    ("disk.free", W, "fail", disk_small, {}),
    ("clock.skew", W, "fail", clock_40s, {}),
    ("clock.skew", W, "warn", clock_5s, {}),
    ("containers.forwarded_env", W, "fail", forwarded_missing, {}),
    ("containers.forwarded_env", W, "fail", forwarded_different, {}),
    ("containers.per_host_env", W, "fail", nccl_ib_hca_wrong, {}),
    # the rendezvous names the interface gloo meets on; the container's per-host row flips with it
    ("net.rendezvous", W, "fail", gloo_on_another_interface, {("containers.per_host_env", W): "fail"}),
    ("containers.flags", W, "fail", no_infiniband_device, {}),
    ("containers.flags", W, "fail", no_ipc_lock, {}),
    ("containers.flags", W, "fail", no_memlock_ulimit, {}),
    ("containers.flags", H, "fail", memory_cap_on_head, {}),
    ("containers.flags", W, "fail", memory_cap_on_worker, {}),
    # what drifts on one node (issue 39): the breaks live in drift_fakes.py
    *DRIFT_CASES,
]


@pytest.mark.parametrize("cid,node,status,breaker,also", CASES, ids=[c[3].__name__ for c in CASES])
def test_one_break_flips_one_row(cid, node, status, breaker, also):
    s = healthy()
    breaker(s)
    got = results(s)
    r = got[(cid, node)]
    assert r.status == status, r
    assert r.detail.strip() and r.fix.strip(), r
    assert "\n" not in r.detail and "\n" not in r.fix
    for key, before in BASELINE.items():
        if key == (cid, node):
            continue
        if key in also:
            assert got[key].status == also[key], got[key]
        else:
            assert same(got[key], before), f"{key} changed: {got[key]}"


def same(a: checks.Result, b: checks.Result) -> bool:
    """Unchanged: same status and fix; an ok row may name the new value in its detail (e.g. the IP)."""
    return (a.status, a.fix) == (b.status, b.fix) and (a.status == "ok" or a.detail == b.detail)


# checks whose subject needs more than a pair: broken on one node of four in test_topology.py
N_NODE_CHECKS = {"net.topology", "nccl.topology_env", "net.crossing"}


def test_every_check_has_a_break():
    assert {c[0] for c in CASES} | {"ssh.reachable"} | N_NODE_CHECKS == {cid for cid, _, _ in checks.REGISTRY}


def test_unreachable_worker():
    s = healthy()
    del s.facts[W]
    s.unreachable[W] = "no answer from spark-worker:22 within 5s (timed out) (after 3 attempt(s))"
    got = results(s)
    r = got[("ssh.reachable", W)]
    assert r.status == "fail" and "no answer" in r.detail and r.fix
    for (cid, n), res in got.items():
        if n == W and cid != "ssh.reachable":
            assert (res.status, res.detail) == ("skip", "unreachable"), res
    for (cid, n), before in BASELINE.items():
        if n != H:
            continue
        if cid in ("clock.skew", "mem.size"):  # one clock, one memory size: nothing to agree with
            assert got[(cid, n)].status == "skip"
        else:
            assert same(got[(cid, n)], before), got[(cid, n)]


def test_mem_headroom_fails_before_start_when_profile_needs_more():
    s = healthy()
    for name in (H, W):
        s.inspect[name] = []  # nothing running yet: the profile's share must still fit
    s.facts[H].mem = parsers.meminfo(
        "MemTotal:       125276348 kB\nMemFree:        90000000 kB\nMemAvailable:  118000000 kB\n"
    )
    s.facts[W].mem = parsers.meminfo(
        "MemTotal:       125276348 kB\nMemFree:        40000000 kB\nMemAvailable:   60000000 kB\n"
    )
    got = {(r.id, r.node): r for r in checks.run_checks(s.ctx(), only={"mem.headroom"})}
    assert got[("mem.headroom", W)].status == "fail"
    assert "profile needs" in got[("mem.headroom", W)].detail
    assert got[("mem.headroom", H)].status == "ok"


PS_RSS = (  # `ps -eo pid=,rss=,comm=,cgroup= --sort=-rss` on a node: procps' RSS in KiB, cgroup v2 under systemd
    "  4242 31457280 ollama          0::/system.slice/ollama.service\n"
    "  5150 12582912 python3         0::/system.slice/docker-" + "c" * 64 + ".scope\n"
    "   911   204800 dockerd         0::/system.slice/docker.service\n"
)


def test_ps_rss_reads_each_process_and_its_container():
    got = parsers.ps_rss(PS_RSS)
    assert [(p.pid, p.rss, p.command) for p in got] == [
        (4242, 30 * GiB, "ollama"),
        (5150, 12 * GiB, "python3"),
        (911, 200 * 1024 * 1024, "dockerd"),
    ]
    assert got[0].container is None and got[1].container == "c" * 64
    assert parsers.ps_rss("5150 100 python3 12:memory:/docker/" + "d" * 64)[0].container == "d" * 64


def test_mem_headroom_beside_another_deployment_judges_memavailable_and_names_every_holder():
    """`up --beside`: the head runs another deployment (another slot's container), which used to
    count as "already serving" and skip the gate. Now the new one's share must fit MemAvailable, and
    the refusal names who holds the memory: the other deployment at its claim, a process not ours."""
    s = healthy()
    other = copy.deepcopy(s.inspect[H][0])
    other["Id"] = "c" * 64
    other["Name"] = "/sparkcluster-pair-d1-head"
    other["Config"]["Labels"].update(
        {"org.sparkcluster.slot": "1", "org.sparkcluster.profile": "qwen", "org.sparkcluster.memory-fraction": "0.2"}
    )
    s.inspect[H] = [other]
    s.facts[H].beside = parsers.docker_inspect_json(json.dumps([other]))
    s.facts[H].mem = parsers.meminfo(
        "MemTotal:       125276348 kB\nMemFree:        40000000 kB\nMemAvailable:   60000000 kB\n"
    )
    s.facts[H].processes = parsers.ps_rss(PS_RSS)
    got = {(r.id, r.node): r for r in checks.run_checks(s.ctx(), only={"mem.headroom"})}
    r = got[("mem.headroom", H)]
    assert r.status == "fail" and "profile needs" in r.detail, r
    assert "ollama (pid 4242) 30.0 GiB" in r.detail and "'qwen' (sparkcluster) 23.9 GiB" in r.detail, r.detail
    assert r.detail.index("ollama") < r.detail.index("'qwen'")  # largest first
    assert "dockerd" not in r.detail  # under half a GiB


def test_container_flags_against_profile_expectation():
    s = healthy()
    s.expect["container_flags"] = {"CapAdd": ["IPC_LOCK"], "NetworkMode": "host", "IpcMode": "host"}
    assert all(r.status == "ok" for r in results(s).values())
    s.expect["container_flags"]["CapAdd"] = ["IPC_LOCK", "SYS_NICE"]
    got = results(s)
    assert got[("containers.flags", H)].status == got[("containers.flags", W)].status == "fail"
    assert "what the profile needs" in got[("containers.flags", W)].detail


def test_gb10_memory_na_is_not_a_problem():
    s = healthy()
    assert s.facts[H].gpus[0].memory_total == "[N/A]"
    assert BASELINE[("gpu.gb10", H)].status == "ok"


def test_cap_add_spelling_cli_vs_engine_api():
    # real: the docker CLI stores --cap-add=IPC_LOCK as CAP_IPC_LOCK (tests/captured/testbed-head-docker-inspect.json)
    cli_caps = json.loads(cap("testbed-head-docker-inspect.json"))[0]["HostConfig"]["CapAdd"]
    s = healthy()
    s.inspect[H][0]["HostConfig"]["CapAdd"] = cli_caps
    got = results(s)
    assert got[("containers.flags", H)].status == got[("containers.flags", W)].status == "ok"


def test_base_absent_on_a_node_is_not_judged_there():
    s = healthy()
    s.facts[W].base = None
    got = results(s)
    assert got[("image.base-same", W)].status == "skip"
    assert got[("image.base-same", H)].status == "ok"


def test_base_differs_names_both_ids_and_the_fix():
    s = healthy()
    base_differs(s)
    r = results(s)[("image.base-same", W)]
    assert "sha256:cccccccccccc" in r.detail and "sha256:bbbbbbbbbbbb" in r.detail and H in r.detail
    assert f"docker pull {BASE_IMAGE}" in r.fix


def test_driver_difference_warns_naming_both_versions():
    s = healthy()
    other_driver(s)
    got = results(s)
    r = got[("gpu.driver", W)]
    assert r.status == "warn" and r.detail == "driver 580.82.09 here, 580.95.05 on spark-head"
    assert got[("gpu.driver", H)].status == "ok"


def test_min_driver_fails_only_the_node_below_it():
    s = healthy()
    below_min_driver(s)
    got = results(s)
    r = got[("gpu.driver", W)]
    assert r.status == "fail" and "580.82.09 is older than 580.95" in r.detail and "580.95 or later" in r.fix
    assert got[("gpu.driver", H)].status == "ok"
    s.expect["min_driver"] = "580.82.09"  # met by both: the difference is only warned again
    assert results(s)[("gpu.driver", W)].status == "warn"
    s.expect["min_driver"] = "590.44"  # seed 001's image: neither node has it
    got = results(s)
    assert got[("gpu.driver", W)].status == got[("gpu.driver", H)].status == "fail"


def test_gid_index_may_differ_between_nodes():
    # owners report index 3 on one Spark and 4 or 5 on the other (issue 24): each node is judged alone
    s = healthy()
    gid_index_shifted(s)
    got = results(s)
    assert got[("rdma.gid", W)].status == "ok" and got[("rdma.gid", W)].detail.startswith("index 5 on ")
    assert got[("rdma.gid", H)].status == "ok" and got[("rdma.gid", H)].detail.startswith("index 3 on ")


def test_docker_group_fix_names_the_user_and_logging_in_again():
    assert DOCKER_DENIED.startswith("permission denied while trying to connect to the Docker daemon socket")
    s = healthy()
    not_in_docker_group(s)
    r = results(s)[("account.docker", W)]
    assert "sudo usermod -aG docker spark" in r.fix and "log in again" in r.fix
    s = healthy()
    added_to_docker_not_relogged(s)
    r = results(s)[("account.docker", W)]
    assert "usermod" not in r.fix and "log in again" in r.fix


def test_hf_cache_row_shows_the_resolved_path():
    assert BASELINE[("account.hf_cache", H)].detail == "/home/spark/.cache/huggingface"


def test_a_stopped_engine_is_not_blamed_on_the_account():
    s = healthy()
    docker_down(s)
    got = results(s)
    assert got[("docker.engine", W)].status == "fail" and got[("account.docker", W)].status == "skip"


# ss as the SSH user (an ordinary account): no `users:((...))` for root's processes, so no pid and no
# container; the probe's loop still appends ` container=`
HIDDEN = (
    "LISTEN 0      4096         0.0.0.0:6379       0.0.0.0:*     container=\n"
    "LISTEN 0      2048         0.0.0.0:8000       0.0.0.0:*     container=\n"
)


def test_ports_held_by_our_running_head_are_ours_when_ss_hides_the_owner():
    s = healthy()
    s.facts[H].listeners = parsers.ss_listeners(HIDDEN)
    assert results(s)[("ports.free", H)].status == "ok"


def test_ports_hidden_from_the_user_with_none_of_ours_running_are_held():
    s = healthy()
    s.facts[H].listeners = parsers.ss_listeners(HIDDEN)
    for n in (H, W):
        s.inspect[n] = []
    r = results(s)[("ports.free", H)]
    assert r.status == "fail" and "another account" in r.detail


# --- memory fit (issue 52) ------------------------------------------------------------------------


def test_a_profile_sized_for_128_gb_fails_mem_fit_on_a_64_gb_node_with_the_arithmetic():
    s = healthy()
    # nemotron3-super-nvfp4-single: about 75 GB of weights on one rank, at 0.8
    s.expect |= {"weights_per_rank": 75 * 10**9, "gpu_memory_utilization": 0.8}
    s.facts[W].mem = parsers.meminfo(MEMINFO_64)
    got = results(s)
    fit = got[("mem.fit", W)]
    assert fit.status == "fail"
    assert "weights per rank 75.0 GB" in fit.detail and "0.8 x MemTotal 64.1 GB = 51.3 GB" in fit.detail
    assert "23.7 GB short" in fit.detail and "hub's listing" in fit.detail
    assert got[("mem.fit", H)].status == "ok"  # 0.8 x 128.3 GB holds 75 GB
    # MemAvailable covers 0.8 x MemTotal on both: mem.headroom alone let this through
    assert got[("mem.headroom", W)].status == "ok"
    size = got[("mem.size", W)]
    assert size.status == "warn" and "64.1 GB here, 128.3 GB on another node" in size.detail
    assert got[("mem.size", H)].status == "ok"


def test_mem_fit_counts_the_kv_minimum_and_skips_an_unknown_listing():
    from sparkcluster.node.memory_fit import KvMin

    s = healthy()
    s.expect |= {"weights_per_rank": 92 * 10**9, "kv_min": KvMin(6 * 10**9, "2 x 48 layers ...")}
    got = results(s)[("mem.fit", H)]
    assert got.status == "fail" and "KV for one max_model_len sequence 6.0 GB" in got.detail
    s = healthy()
    s.expect |= {"weights_per_rank": None, "weights_source": "no listing of org/m: the hub answered 500"}
    got = results(s)[("mem.fit", H)]
    assert got.status == "skip" and "the hub answered 500" in got.detail


def test_one_spark_without_a_data_plane_passes_and_skips_the_hca_pairing():
    """A one-node inventory names no QSFP port (nothing crosses a cable): every check passes on the
    healthy head, rdma.hca has nothing to judge (SKIP), and the container carries an empty
    NCCL_IB_HCA, as profile.per_host_env gives it."""
    s = healthy()
    head = {k: v for k, v in s.node("spark-head").items() if k != "data_plane"}
    s.inv["nodes"] = [head]
    s.facts = {"spark-head": s.facts["spark-head"]}
    s.inspect = {"spark-head": s.inspect["spark-head"]}
    s.set_env("spark-head", "NCCL_IB_HCA", "")
    results = checks.run_checks(s.ctx())
    bad = [(r.id, r.status, r.detail) for r in results if r.status not in ("ok", "skip")]
    assert not bad, bad
    assert {r.id: r.status for r in results}["rdma.hca"] == "skip"


def test_a_services_containers_beside_the_engine_are_not_judged_as_an_engines():
    """A service's supervisor and its own container (issue 72: from their own images, with none of the
    engines' devices, capabilities or variables) run beside the worker's engine: the engines' flag and
    variable checks judge the engine's container, whichever `docker ps` lists first."""
    import copy

    from sparkcluster.labels import ROLE_LABEL

    s = healthy()
    for role in ("service", "service-server"):
        other = copy.deepcopy(s.inspect[W][0])
        other["Id"], other["Name"] = role[0] * 64, f"/sparkcluster-x-{role}"
        other["Config"]["Labels"][ROLE_LABEL] = role
        other["HostConfig"]["CapAdd"], other["HostConfig"]["Devices"], other["Config"]["Env"] = None, [], []
        s.inspect[W].insert(0, other)
    got = results(s)
    for cid in ("containers.flags", "containers.forwarded_env", "containers.per_host_env"):
        assert got[(cid, W)].status == BASELINE[(cid, W)].status, got[(cid, W)]
