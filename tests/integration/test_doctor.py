"""`doctor` on the testbed (issue 3): a healthy cluster passes every check, and each check has a case
that breaks exactly its subject with a testbed knob and sees that check FAIL (WARN when it only
warns) on the right node, with every other (check, node) row as it was on the healthy cluster.

Every case runs the real CLI once (`doctor --json`) against the broken testbed and compares with one
healthy run per module. Each knob is undone in `finally`; the autouse fixture resets the testbed after
every case as well, so one failing case cannot leak into the next.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.helpers import account, as_user, ours
from tests.testbed import PROFILES as TESTBED_PROFILES

pytestmark = pytest.mark.testbed
HEAD, WORKER = "spark-head", "spark-worker"
NODES = (HEAD, WORKER)

# Every check id `doctor` reports, in its stable order (sparkcluster/checks.py REGISTRY).
IDS = [
    "ssh.reachable",
    "gpu.gb10",
    "gpu.driver",
    "gpu.clocks",
    "host.kernel",
    "host.bios",
    "host.versions",
    "account.docker",
    "docker.engine",
    "docker.gpu_runtime",
    "account.hf_cache",
    "account.lock",
    "image.same",
    "image.base-same",
    "image.ray",
    "image.nccl",
    "image.driver",
    "image.cuda_cache",
    "net.control_ip",
    "net.vllm_host_ip",
    "net.link",
    "net.mtu",
    "net.path_mtu",
    "net.twins",
    "rdma.gid",
    "net.speed",
    "net.peer",
    "net.default_route",
    "net.topology",
    "net.crossing",
    "rdma.hca",
    "rdma.pcie",
    "rdma.firmware",
    "rdma.aer",
    "nccl.topology_env",
    "mem.fit",
    "mem.size",
    "mem.headroom",
    "mem.earlyoom",
    "mem.earlyoom_args",
    "mem.sshd_oom",
    "ports.free",
    "ray.stale",
    "net.rendezvous",
    "disk.free",
    "clock.skew",
    "containers.forwarded_env",
    "containers.per_host_env",
    "containers.flags",
    # doctor adds it after the checks: what changed on each node since its last good serve (issue 39)
    "drift.since_good",
]
# WARNs a healthy testbed may show: sshd cannot get OOMScoreAdjust -1000 here (no CAP_SYS_RESOURCE),
# the cluster image is missing until the first `up` builds it, and the engine image is NGC's 26.05,
# built for driver 595, on DGX OS 7.5's 580.142: compatibility mode, as on every Spark today (issue 51)
KNOWN_WARNS = {"mem.sshd_oom", "image.same", "image.driver"}
# rows that follow whatever a case breaks on a node a known-good record holds (issue 39)
FOLLOWS = {"drift.since_good"}
# Default cabling (issue 17): one cable on port 1, data plane = its twins enp1s0f1np1 (control) and
# enP2p1s0f1np1; port 0's twins are admin-down and their HCAs DOWN, outside the inventory.
DATA_LINK = "enP2p1s0f1np1"  # head link 4: not the control link, so Ray's path is untouched
DOWN_LINK = "enP2p1s0f1np1"  # the only data link besides the control link


def doctor(sc, inventory: Path | None = None) -> tuple[int, dict, dict[tuple[str, str], dict]]:
    res = sc("doctor", "--json", inventory=inventory, timeout=120)
    # 4: a node could not be reached (issue 56: doctor exits as --help promises)
    assert res.returncode in (0, 1, 4), f"doctor exited {res.returncode}\n{res.stdout}\n{res.stderr}"
    doc = json.loads(res.stdout)
    return res.returncode, doc, {(c["id"], c["node"]): c for c in doc["checks"]}


@pytest.fixture(scope="module")
def healthy(testbed, sc):
    """One doctor run on the healthy testbed: what every case compares with. sparkcluster's own
    containers left by an earlier session are taken down first (as test_up does), so the testbed is
    the bare healthy pair and the cases below can stop dockerd or hold 8000 without harm."""
    if any(ours(testbed, h) for h in NODES):
        sc("down", "--purge-gcs", timeout=300)
    rc, doc, rows = doctor(sc)
    bad = {
        k: (r["status"], r["detail"])
        for k, r in rows.items()
        if r["status"] == "fail" or (r["status"] == "warn" and k[0] not in KNOWN_WARNS)
    }
    assert not bad, f"the testbed is not healthy before the doctor cases: {bad}"
    return rc, doc, rows


@pytest.fixture(autouse=True)
def _reset_after(testbed):
    yield
    testbed.reset()


def inventory_variant(testbed, tmp_path: Path, edit: Callable[[str], str] = lambda t: t) -> Path:
    """The testbed's uncrossed inventory in a tmp file (client files by absolute path), edited."""
    text = testbed.inventory_text(crossed=False)
    text = text.replace('ssh_config = "ssh_config"', f'ssh_config = "{testbed.ssh_config}"')
    text = text.replace('known_hosts = "known_hosts"', f'known_hosts = "{testbed.known_hosts}"')
    p = tmp_path / "cluster.toml"
    p.write_text(edit(text))
    return p


def set_in_node(node: str, key: str, value: str) -> Callable[[str], str]:
    """Edit `key = "..."` inside the [[nodes]] block of `node`."""

    def edit(text: str) -> str:
        head, sep, rest = text.partition(f'name = "{node}"')
        block, nxt, tail = rest.partition("[[nodes]]")
        block, n = re.subn(rf'(?m)^{key} = ".*"$', f'{key} = "{value}"', block, count=1)
        assert n == 1, (node, key)
        return head + sep + block + nxt + tail

    edit.__name__ = f"set_{key}"
    return edit


def running_containers(testbed, host: str) -> list[str]:
    return testbed.sh(host, "docker ps -q", check=False).stdout.split()


def image_ref(testbed) -> str:
    from sparkcluster.cli.common import load_profile_for
    from sparkcluster.config import images, inventory

    inv = inventory.load(testbed.inventory)
    return images.image_ref(inv, load_profile_for(inv, None))


# --------------------------------------------------------------------------------------- healthy


def test_healthy_cluster_passes_every_check(healthy, sc):
    rc, doc, rows = healthy
    assert rc == 0 and doc["ok"] is True
    assert sorted(rows) == sorted((i, n) for i in IDS for n in NODES)
    for (cid, _node), r in rows.items():
        assert r["status"] in ("ok", "skip") or (r["status"] == "warn" and cid in KNOWN_WARNS), r
    # the checks that judge the bare hosts are OK, not merely skipped
    for cid in (
        "ssh.reachable",
        "gpu.gb10",
        "gpu.driver",
        "docker.engine",
        "docker.gpu_runtime",
        "account.docker",
        "account.hf_cache",
        "account.lock",
        "net.control_ip",
        "net.link",
        "net.mtu",
        "net.path_mtu",
        "net.twins",
        "rdma.gid",
        "net.speed",
        "net.peer",
        "net.default_route",
        "rdma.hca",
        "mem.earlyoom",
        "ports.free",
        "disk.free",
        "clock.skew",
    ):
        for n in NODES:
            assert rows[(cid, n)]["status"] == "ok", rows[(cid, n)]

    text = sc("doctor", timeout=120)
    assert text.returncode == 0, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    assert HEAD in lines[0] and WORKER in lines[0]
    for cid in IDS:
        row = [line for line in lines if line.split()[:1] == [cid]]
        assert len(row) == 1, f"no single row for {cid} in\n{text.stdout}"
        want = [rows[(cid, n)]["status"].upper() for n in NODES]
        assert row[0].split()[1:3] == want, row[0]
    assert "FAIL" not in text.stdout


def test_json_has_stable_ids_and_documented_shape(healthy):
    _, doc, _ = healthy
    assert set(doc) == {"ok", "checks"} and isinstance(doc["ok"], bool)
    assert all(set(c) == {"id", "node", "status", "detail", "fix"} for c in doc["checks"])
    assert all(isinstance(c[k], str) for c in doc["checks"] for k in ("id", "node", "status", "detail", "fix"))
    assert all(c["status"] in ("ok", "warn", "fail", "skip") for c in doc["checks"])
    # ids in registry order, each once per node, nodes in inventory order
    assert [c["id"] for c in doc["checks"]] == [i for i in IDS for _ in NODES]
    assert [c["node"] for c in doc["checks"]] == list(NODES) * len(IDS)
    # a WARN or FAIL always says why and what to do
    assert all(c["detail"] and c["fix"] for c in doc["checks"] if c["status"] in ("warn", "fail"))


# --------------------------------------------------------------------------------------- broken


@dataclass
class Case:
    name: str
    # break the testbed; may return an inventory path to run doctor with
    breaks: Callable[..., Path | None]
    undo: Callable[..., None]
    changed: dict[tuple[str, str], str]  # (check, node) -> status expected while broken
    detail: dict[tuple[str, str], str] = field(default_factory=dict)  # substring in detail
    fix: dict[tuple[str, str], str] = field(default_factory=dict)  # actionable substring in fix


def _noop(tb, ctx):
    return None


def _cross(tb, ctx):
    # the inventory as written before re-cabling: the worker's netdev/HCA pairs are now wrong
    inv = inventory_variant(tb, ctx["tmp"])
    tb.cable_worker(True)
    return inv


def _cable_in_port0(tb, ctx):
    for hca in ("rocep1s0f1", "roceP2p1s0f1"):
        tb.set_hca_state(WORKER, hca, "1: DOWN")
    for hca in ("rocep1s0f0", "roceP2p1s0f0"):
        tb.set_hca_state(WORKER, hca, "4: ACTIVE")


def _cable_back(tb, ctx):
    tb.reset()


def _worker_rails_at_1500(tb, ctx):
    for nd in ("enp1s0f1np1", DATA_LINK):
        tb.set_mtu(WORKER, nd, 1500)


def _twin_on_control_subnet(tb, ctx):
    # eugr/spark-vllm-docker#270: the worker's second twin also gets an address on the first twin's /24
    tb.set_addresses(WORKER, DATA_LINK, ["198.19.4.2/24", "198.19.2.4/24"])


def _worker_gid_index_3_then_shifted(tb, ctx):
    def edit(text: str) -> str:
        head, sep, rest = text.partition('name = "spark-worker"')
        return head + sep + rest.replace("mtu = 9000\n", "mtu = 9000\ngid_index = 3\n", 1)

    inv = inventory_variant(tb, ctx["tmp"], edit)
    assert "gid_index = 3" in inv.read_text()
    tb.shift_gids(WORKER)
    return inv


def _untag_image(tb, ctx):
    ref = ctx["ref"] = image_ref(tb)
    if tb.image_id(WORKER, ref):
        keep = ctx["keep"] = "sparkcluster-test/doctor-keep:disk"
        tb.docker(WORKER, f"tag {ref} {keep}")
        tb.docker(WORKER, f"rmi {ref}")


def _retag_image(tb, ctx):
    if ctx.get("keep"):
        tb.docker(WORKER, f"tag {ctx['keep']} {ctx['ref']}")
        tb.docker(WORKER, f"rmi {ctx['keep']}")


def _fill_disk(tb, ctx):
    # disk.free only asks for image room where the image is still missing: take its tag away on the
    # worker (the layers stay, under another tag) so the worker looks like a node before `up`.
    _untag_image(tb, ctx)
    tb.fill_disk(WORKER, 512)  # the testbed profile needs image_disk_gb = 4
    return None


def _unfill_disk(tb, ctx):
    try:
        tb.unfill_disk(WORKER)
    finally:
        _retag_image(tb, ctx)


def _hold_port(tb, ctx):
    if any(tb.sh(HEAD, "ss -Htln 'sport = :8000'").stdout.split()):
        pytest.skip("port 8000 on the head is already in use (a cluster left serving?)")
    ctx["holder"] = tb.hold_port(HEAD, 8000)
    return None


def _stop_dockerd(tb, ctx):
    if running_containers(tb, WORKER):
        pytest.skip("containers run on the worker: stopping its dockerd would kill them")
    tb.stop_dockerd(WORKER)


def _raise_engine_floor(tb, ctx):
    # an engine that accepts no API the docker SDK speaks (1.24-1.45): its floor at 1.46. The docker
    # CLI still negotiates with it, so every other row stays as it was (issue 50)
    if running_containers(tb, WORKER):
        pytest.skip("containers run on the worker: restarting its dockerd would stop them")
    tb.stop_dockerd(WORKER)
    tb.start_dockerd(WORKER, min_api="1.46")


def _restore_engine_floor(tb, ctx):
    tb.stop_dockerd(WORKER)
    tb.start_dockerd(WORKER)


WORKER_SKIPS = {(cid, WORKER): "skip" for cid in IDS if cid != "ssh.reachable"}


# --- the SSH user's own rights (an ordinary account in docker, as on a Spark; who it is: facts.json)


def _leave_docker_group(tb, ctx):
    # the worker's own /etc/group (a bind mount: rewritten in place, never replaced)
    u = account()["ssh_user"]
    tb.sh(
        WORKER,
        f"cp /etc/group /run/testbed/group.saved && sed -E '/^docker:/ {{ s/([:,]){u}(,|$)/\\1/; s/,$//; }}' "
        "/run/testbed/group.saved > /run/testbed/group.new && cat /run/testbed/group.new > /etc/group",
    )


def _rejoin_docker_group(tb, ctx):
    tb.sh(WORKER, "cat /run/testbed/group.saved > /etc/group && rm -f /run/testbed/group.saved /run/testbed/group.new")


def _root_files_in_cache(tb, ctx):
    # what a container running as root would leave in the user's cache
    # the cache's own folders are the user's (made as the user first, when a fresh worker has none)
    tb.sh(WORKER, as_user(f"mkdir -p {account()['hf_cache']}/hub"))
    tb.sh(
        WORKER,
        f"mkdir -p {account()['hf_cache']}/hub/models--root--left && chown -R 0:0 {account()['hf_cache']}/hub/models--root--left",
    )


def _no_root_files(tb, ctx):
    tb.sh(WORKER, f"rm -rf {account()['hf_cache']}/hub/models--root--left")


def _foreign_lock_dir(tb, ctx):
    # /tmp/sparkcluster made by another tool as root, closed to others
    tb.sh(
        WORKER,
        "rm -rf /tmp/sparkcluster.saved; { [ ! -e /tmp/sparkcluster ] || mv /tmp/sparkcluster /tmp/sparkcluster.saved; } "
        "&& mkdir -m 755 /tmp/sparkcluster",
    )


def _lock_dir_back(tb, ctx):
    tb.sh(
        WORKER,
        "rm -rf /tmp/sparkcluster; [ ! -e /tmp/sparkcluster.saved ] || mv /tmp/sparkcluster.saved /tmp/sparkcluster",
    )


ENGINE_ROWS = ("docker.engine", "docker.gpu_runtime", "image.same", "image.base-same", "image.ray")

CASES = [
    # the socket refuses the worker's user: its row names the group fix; the engine's rows cannot judge
    Case(
        "account.docker",
        _leave_docker_group,
        _rejoin_docker_group,
        {("account.docker", WORKER): "fail", **{(cid, WORKER): "skip" for cid in ENGINE_ROWS}},
        detail={("account.docker", WORKER): "not in the docker group"},
        fix={("account.docker", WORKER): "usermod -aG docker"},
    ),
    Case(
        "account.hf_cache",
        _root_files_in_cache,
        _no_root_files,
        {("account.hf_cache", WORKER): "warn"},
        detail={("account.hf_cache", WORKER): "owned by root"},
        fix={("account.hf_cache", WORKER): "chown -R"},
    ),
    Case(
        "account.lock",
        _foreign_lock_dir,
        _lock_dir_back,
        {("account.lock", WORKER): "fail"},
        detail={("account.lock", WORKER): "/tmp/sparkcluster owned by root"},
        fix={("account.lock", WORKER): "rm -rf"},
    ),
    Case(
        "net.mtu",
        lambda tb, c: tb.set_mtu(WORKER, DATA_LINK, 1500),
        lambda tb, c: tb.set_mtu(WORKER, DATA_LINK, 9000),
        # 9000-byte frames no longer cross that link either way: the worker cannot send them, the
        # head's are dropped at the worker's end. Same subject (the link's MTU), so path MTU fails
        # on both nodes, and nothing else changes.
        {("net.mtu", WORKER): "fail", ("net.path_mtu", WORKER): "fail", ("net.path_mtu", HEAD): "fail"},
        detail={
            ("net.mtu", WORKER): f"{DATA_LINK} is 1500",
            ("net.path_mtu", HEAD): "9000-byte",
            ("net.path_mtu", WORKER): "9000-byte",
        },
        fix={("net.mtu", WORKER): "mtu 9000", ("net.path_mtu", HEAD): "MTU 9000", ("net.path_mtu", WORKER): "MTU 9000"},
    ),
    Case(
        "net.link",
        lambda tb, c: tb.link_down(WORKER, DOWN_LINK),
        lambda tb, c: tb.link_up(WORKER, DOWN_LINK),
        # one end of a cable administratively down: the far end (the head's port) loses carrier, as a
        # real QSFP link does, and no frame crosses that link in either direction. Same subject.
        {
            ("net.link", WORKER): "fail",
            ("net.link", HEAD): "fail",
            ("net.path_mtu", WORKER): "fail",
            ("net.path_mtu", HEAD): "fail",
        },
        detail={
            ("net.link", WORKER): f"{DOWN_LINK} administratively down",
            ("net.link", HEAD): f"{DOWN_LINK} has no carrier",
        },
        fix={("net.link", WORKER): "ip link set", ("net.link", HEAD): "QSFP"},
    ),
    Case(
        "rdma.hca-down",
        lambda tb, c: tb.set_hca_state(HEAD, "roceP2p1s0f1", "1: DOWN"),
        lambda tb, c: tb.set_hca_state(HEAD, "roceP2p1s0f1", "4: ACTIVE"),
        # the detail shows every HCA's state (port 0's are DOWN too: no cable there)
        {("rdma.hca", HEAD): "fail"},
        detail={("rdma.hca", HEAD): "roceP2p1s0f1 port 1 is '1: DOWN'"},
        fix={("rdma.hca", HEAD): "bring the RoCE port up: check the cable of enP2p1s0f1np1"},
    ),
    Case(
        "rdma.hca-cable-in-other-port",
        _cable_in_port0,
        _cable_back,
        # the worker's sysfs as after moving its cable to port 0: port 1's HCAs DOWN, port 0's ACTIVE
        {("rdma.hca", WORKER): "fail"},
        detail={
            ("rdma.hca", WORKER): "likely cause: the cable sits in the other port (rocep1s0f0, roceP2p1s0f0 ACTIVE"
        },
        fix={("rdma.hca", WORKER): "move the cable"},
    ),
    Case(
        "rdma.hca-crossed",
        _cross,
        lambda tb, c: tb.cable_worker(False),
        # the worker re-cabled, its inventory not rewritten. On the worker each HCA still sits on its
        # own netdev (they are renamed together, as on hardware), but its entry k is now the far end of
        # another head entry: NCCL would pair HCAs that share no cable. The listed control_if
        # (enp1s0f1np1) is now the port of head link 4, so the control IP is not on it either: the
        # same stale data_plane/control_if of this one node.
        {("rdma.hca", WORKER): "fail", ("net.control_ip", WORKER): "fail"},
        detail={
            ("rdma.hca", WORKER): "entry 1 rocep1s0f1/enp1s0f1np1 is cabled to spark-head's entry 2 "
            "roceP2p1s0f1/enP2p1s0f1np1",
            ("net.control_ip", WORKER): "198.19.2.2 is not on enp1s0f1np1",
        },
        fix={("rdma.hca", WORKER): "order data_plane for spark-worker", ("net.control_ip", WORKER): "control_ip"},
    ),
    Case(
        "rdma.hca-crossed-inventory-rewritten",
        lambda tb, c: tb.cable_worker(True),
        lambda tb, c: tb.cable_worker(False),
        # the same re-cabled worker with its inventory rewritten (entry k is again the far end of the
        # head's entry k, under other names): nothing to report, no row changes
        {},
    ),
    Case(
        "gpu.driver",
        # an older driver of the same branch: image.driver reads as on the head (compatibility mode, issue 51)
        lambda tb, c: tb.set_driver_version(WORKER, "580.82.09"),
        lambda tb, c: tb.set_driver_version(WORKER),
        # owners update their Sparks on different days: a WARN naming both versions (issue 24)
        {("gpu.driver", WORKER): "warn"},
        detail={("gpu.driver", WORKER): "driver 580.82.09 here, 580.142 on spark-head"},
        fix={("gpu.driver", WORKER): "update the older one"},
    ),
    Case(
        "mem.size",
        # the worker reads as a 64 GB Spark beside the head's own 24 GiB (issue 52: one meminfo view per
        # host): the smaller node is the one named, as it sets what the deployment can hold
        lambda tb, c: tb.set_memory(WORKER, 64),
        lambda tb, c: tb.set_memory(WORKER, None),
        {("mem.size", HEAD): "warn"},
        detail={("mem.size", HEAD): "64.0 GB on another node"},
        fix={("mem.size", HEAD): "same memory size"},
    ),
    Case(
        "ssh.reachable",
        lambda tb, c: tb.stop_sshd(WORKER),
        lambda tb, c: tb.start_sshd(WORKER),
        # nothing else about the worker can be judged; on the head, only what compares it with the
        # worker (clock skew, path MTU to the worker's addresses) has nothing to compare with
        {
            **WORKER_SKIPS,
            ("ssh.reachable", WORKER): "fail",
            ("clock.skew", HEAD): "skip",
            ("mem.size", HEAD): "skip",
            ("net.path_mtu", HEAD): "skip",
        },
        detail={("ssh.reachable", WORKER): "198.18.0.6"},
        fix={("ssh.reachable", WORKER): "ssh"},
    ),
    Case(
        "docker.engine",
        _stop_dockerd,
        lambda tb, c: tb.start_dockerd(WORKER),
        {
            ("docker.engine", WORKER): "fail",
            ("docker.gpu_runtime", WORKER): "skip",
            ("account.docker", WORKER): "skip",  # a stopped engine is not the account's fault
            ("image.base-same", WORKER): "skip",
            ("image.same", WORKER): "skip",
            ("image.ray", WORKER): "skip",
        },
        detail={("docker.engine", WORKER): "docker info failed"},
        fix={("docker.engine", WORKER): "start the Docker daemon"},
    ),
    Case(
        "engine_floor_above_the_sdk",
        _raise_engine_floor,
        _restore_engine_floor,
        {("docker.engine", WORKER): "fail"},
        detail={("docker.engine", WORKER): "accepts API 1.46-"},
        fix={("docker.engine", WORKER): '"min-api-version": "1.45"'},
    ),
    Case(
        "ports.free",
        _hold_port,
        lambda tb, c: c["holder"].release() if "holder" in c else None,
        {("ports.free", HEAD): "fail"},
        # the holder is root's: to the Spark's ordinary user ss does not name it
        detail={("ports.free", HEAD): "8000 (vLLM API) is held by a process of another account"},
        fix={("ports.free", HEAD): "stop that process"},
    ),
    Case(
        "disk.free",
        _fill_disk,
        _unfill_disk,
        # the image's absence on the worker is the precondition (image.same WARN "not on this node
        # yet", image.ray not run), the filled disk is the break
        {("disk.free", WORKER): "fail", ("image.same", WORKER): "warn", ("image.ray", WORKER): "skip"},
        detail={("disk.free", WORKER): "the image needs 4.0 GiB"},
        fix={("disk.free", WORKER): "docker system prune"},
    ),
    Case(
        "mem.earlyoom",
        lambda tb, c: tb.stop_earlyoom(WORKER),
        lambda tb, c: tb.start_earlyoom(WORKER),
        # its thresholds cannot be judged either (issue 39)
        {("mem.earlyoom", WORKER): "warn", ("mem.earlyoom_args", WORKER): "skip"},
        detail={("mem.earlyoom", WORKER): "not running"},
        fix={("mem.earlyoom", WORKER): "systemctl enable --now earlyoom"},
    ),
    Case(
        "net.control_ip-link-local",
        lambda tb, c: inventory_variant(tb, c["tmp"], set_in_node(WORKER, "control_ip", "169.254.10.2")),
        _noop,
        {("net.control_ip", WORKER): "fail"},
        detail={("net.control_ip", WORKER): "link-local"},
        fix={("net.control_ip", WORKER): "static address"},
    ),
    Case(
        "net.control_ip-docker-bridge",
        lambda tb, c: inventory_variant(tb, c["tmp"], set_in_node(WORKER, "control_ip", "172.17.0.5")),
        _noop,
        {("net.control_ip", WORKER): "fail"},
        detail={("net.control_ip", WORKER): "docker bridge"},
        fix={("net.control_ip", WORKER): "enp1s0f1np1"},
    ),
    Case(
        "net.control_ip-wrong-if",
        # an existing interface, but not the one holding the control IP
        lambda tb, c: inventory_variant(tb, c["tmp"], set_in_node(HEAD, "control_if", "enP2p1s0f1np1")),
        _noop,
        {("net.control_ip", HEAD): "fail"},
        detail={("net.control_ip", HEAD): "198.19.2.1 is not on enP2p1s0f1np1"},
        fix={("net.control_ip", HEAD): "control_ip"},
    ),
    Case(
        "net.control_ip-missing-if",
        # a name the head does not have: net.link, which checks control_if exists too, says so as well
        lambda tb, c: inventory_variant(tb, c["tmp"], set_in_node(HEAD, "control_if", "enp9s9")),
        _noop,
        {("net.control_ip", HEAD): "fail", ("net.link", HEAD): "fail"},
        detail={("net.control_ip", HEAD): "enp9s9 does not exist", ("net.link", HEAD): "enp9s9 missing"},
        fix={("net.control_ip", HEAD): "control_if"},
    ),
    # ---- issue 17: the checks real cabling needs, each on one node
    Case(
        "net.path_mtu-every-probe",
        _worker_rails_at_1500,
        lambda tb, c: tb.reset(),
        # both of the worker's rails at 1500: both of its probes are reported, not only the last one
        {("net.mtu", WORKER): "fail", ("net.path_mtu", WORKER): "fail", ("net.path_mtu", HEAD): "fail"},
        detail={("net.path_mtu", WORKER): "2 of 2 probe(s)", ("net.path_mtu", HEAD): "2 of 2 probe(s)"},
        fix={("net.path_mtu", WORKER): "MTU 9000"},
    ),
    Case(
        "net.twins",
        _twin_on_control_subnet,
        lambda tb, c: tb.reset(),
        # the extra address makes extra path MTU probes (to and from 198.19.2.4); whether a probe that
        # crosses the other twin's cable is answered depends on the hosts' ARP/rp_filter defaults
        {
            ("net.twins", WORKER): "fail",
            ("net.path_mtu", WORKER): ("ok", "fail"),
            ("net.path_mtu", HEAD): ("ok", "fail"),
        },
        detail={("net.twins", WORKER): "enp1s0f1np1 and enP2p1s0f1np1 (twins of one port) share 198.19.2.0/24"},
        fix={("net.twins", WORKER): "its own subnet"},
    ),
    Case(
        "rdma.gid-twin-without-ipv4",
        lambda tb, c: tb.set_addresses(WORKER, DATA_LINK, []),
        lambda tb, c: tb.reset(),
        # the twin stays up, its HCA loses its IPv4 GIDs; with no peer address on that subnet neither
        # node probes that rail (path MTU stays OK with one probe fewer)
        {("rdma.gid", WORKER): "fail"},
        detail={("rdma.gid", WORKER): "roceP2p1s0f1: its netdev enP2p1s0f1np1 is up without an IPv4 address"},
        fix={("rdma.gid", WORKER): "static IPv4 address"},
    ),
    Case(
        "rdma.gid-index-differs",
        lambda tb, c: tb.shift_gids(WORKER),
        lambda tb, c: tb.reset(),
        # the worker's IPv4 GIDs sit at 5 (an IPv6 address came first), the head's at 3: owners report
        # exactly that (issue 24), and NCCL finds each node's own (issue 35): nothing to report
        {},
    ),
    Case(
        "rdma.gid-index-not-the-inventorys",
        _worker_gid_index_3_then_shifted,
        lambda tb, c: tb.reset(),
        # an older init wrote 3 into the worker's inventory, its IPv4 GIDs now sit at 5: the pin is
        # ignored (issue 35: NCCL finds each HCA's GID at every start), doctor says to remove it
        {("rdma.gid", WORKER): "warn"},
        detail={("rdma.gid", WORKER): "the inventory's gid_index 3 is ignored"},
        fix={("rdma.gid", WORKER): "remove gid_index from spark-worker"},
    ),
    Case(
        "net.speed",
        lambda tb, c: tb.set_speed(HEAD, DATA_LINK, 100000),
        lambda tb, c: tb.set_speed(HEAD, DATA_LINK),
        {("net.speed", HEAD): "warn"},
        detail={("net.speed", HEAD): "rail roceP2p1s0f1/enP2p1s0f1np1 at 100 Gb/s"},
        fix={("net.speed", HEAD): "firmware"},
    ),
    Case(
        "net.peer-third-machine",
        lambda tb, c: tb.plug_third(HEAD, "enp1s0f0np0") and None,
        lambda tb, c: tb.unplug_third(),
        # the head's spare port cabled to a machine that is no cluster node (eugr#40): flagged on the
        # head, which has it; the worker's port 0 had no cable before and has none now
        {("net.peer", HEAD): "warn"},
        detail={("net.peer", HEAD): "enp1s0f0np0 (198.19.100.0/24)"},
        fix={("net.peer", HEAD): "data_plane"},
    ),
    Case(
        "net.default_route",
        lambda tb, c: tb.set_default_route(WORKER, "enp1s0f1np1", "198.19.2.1"),
        lambda tb, c: tb.reset(),
        {("net.default_route", WORKER): "warn"},
        detail={("net.default_route", WORKER): "enp1s0f1np1, a ConnectX-7 port"},
        fix={("net.default_route", WORKER): "10 GbE"},
    ),
    Case(
        "cabling-link-local",
        lambda tb, c: tb.set_cabling("link-local"),
        lambda tb, c: tb.reset(),
        # NVIDIA's default addressing: every twin in 169.254/16. Not a healthy variant by design: the
        # control IP changes per boot and both twins share the one link-local route, on both nodes.
        # no subnet of their own is left to tell the cabling from (net.topology, on both ends)
        {
            ("net.control_ip", HEAD): "fail",
            ("net.control_ip", WORKER): "fail",
            ("net.twins", HEAD): "fail",
            ("net.twins", WORKER): "fail",
            ("net.topology", HEAD): "fail",
            ("net.topology", WORKER): "fail",
            ("net.path_mtu", HEAD): ("ok", "fail"),
            ("net.path_mtu", WORKER): ("ok", "fail"),
        },
        detail={("net.control_ip", WORKER): "chosen anew at each boot", ("net.twins", HEAD): "link-local"},
        fix={("net.control_ip", WORKER): "static address"},
    ),
    Case(
        "cabling-one-subnet",
        lambda tb, c: tb.set_cabling("one-subnet"),
        lambda tb, c: tb.reset(),
        {
            ("net.twins", HEAD): "fail",
            ("net.twins", WORKER): "fail",
            ("net.path_mtu", HEAD): ("ok", "fail"),
            ("net.path_mtu", WORKER): ("ok", "fail"),
        },
        detail={("net.twins", HEAD): "share 198.19.2.0/24"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_breaking_one_subject_fails_only_its_check(testbed, sc, healthy, case, tmp_path):
    _, _, base = healthy
    ctx: dict = {"tmp": tmp_path}
    try:
        inventory = case.breaks(testbed, ctx)
        rc, doc, rows = doctor(sc, inventory)
        if case.name == "ports.free":
            # doctor reports the foreign holder, never kills it
            holder = ctx["holder"]
            assert holder.proc.poll() is None
            assert testbed.sh(HEAD, f"kill -0 {holder.pid_in_host}", check=False).returncode == 0
    finally:
        case.undo(testbed, ctx)

    # the broken subject's rows
    for key, status in case.changed.items():
        r = rows[key]
        # a tuple: the row may take any of these (a side effect the testbed's kernel decides)
        assert r["status"] in (status if isinstance(status, tuple) else (status,)), (key, r)
        if r["status"] in ("fail", "warn"):
            assert r["detail"] and r["fix"], r
    for key, text in case.detail.items():
        assert text in rows[key]["detail"], (key, rows[key])
    for key, text in case.fix.items():
        assert text in rows[key]["fix"], (key, rows[key])
    if case.name == "ports.free":  # root's holder: its pid is not the ordinary user's to see
        assert str(ctx["holder"].pid_in_host) not in rows[("ports.free", HEAD)]["detail"]
    if case.name == "ssh.reachable":
        assert all(rows[k]["detail"] == "unreachable" for k in WORKER_SKIPS)

    # every other row exactly as on the healthy cluster; drift since the last good serve follows a
    # case's subject wherever a record holds it (a driver changed is drift too)
    others = {k: (base[k]["status"], rows[k]["status"]) for k in base if k not in case.changed and k[0] not in FOLLOWS}
    assert {k: v for k, v in others.items() if v[0] != v[1]} == {}
    assert sorted(rows) == sorted(base)

    failed = any(rows[k]["status"] == "fail" for k in case.changed)
    # a node doctor could not reach is exit 4 (issue 56), a failed check 1
    want = 4 if ("ssh.reachable", WORKER) in case.changed else 1 if failed else 0
    assert rc == want and doc["ok"] is (not failed)


# --------------------------------------------------------------------------------------- cabling modes


@pytest.mark.parametrize("mode", ["two-cables", "one-cable@1500", "one-cable@9216", "two-cables@1500", "twin-no-ipv4"])
def test_healthy_cabling_modes_pass_like_the_default(testbed, sc, healthy, mode):
    """Every healthy cabling mode (issue 17) gives the same statuses as the default one-cable pair;
    the inventory is the one the testbed writes for the mode (what init would write)."""
    _, _, base = healthy
    try:
        inv = testbed.set_cabling(mode)
        rc, doc, rows = doctor(sc, inv)
    finally:
        testbed.reset()
    assert {k: (base[k]["status"], rows[k]["status"]) for k in base if base[k]["status"] != rows[k]["status"]} == {}
    assert rc == 0 and doc["ok"] is True
    if mode.startswith("two-cables"):
        assert rows[("rdma.gid", HEAD)]["detail"] == "index 3 on rocep1s0f0, rocep1s0f1, roceP2p1s0f0, roceP2p1s0f1"


# the network's rows (net.vllm_host_ip judges the profile's planned variables: the draft names none)
NET_IDS = [i for i in IDS if i.startswith(("net.", "rdma.")) and i != "net.vllm_host_ip"]


@pytest.mark.parametrize("mode", ["one-cable", "two-cables", "twin-no-ipv4", "one-cable@1500"])
def test_init_drafts_what_doctor_passes_on_every_healthy_mode(testbed, sc, healthy, mode, tmp_path):
    """`init` on a cabling mode (issue 17) writes the ports the testbed's own inventory lists, with
    no gid_index (issue 35), and doctor with that draft judges the network exactly as with the testbed's."""
    from sparkcluster.config import inventory

    _, _, base = healthy
    out = tmp_path / "draft.toml"
    try:
        ref = inventory.load(testbed.set_cabling(mode))
        res = sc(
            "init",
            "--head",
            HEAD,
            "--worker",
            WORKER,
            "--ssh-config",
            str(testbed.ssh_config),
            "--known-hosts",
            str(testbed.known_hosts),
            "--name",
            "testbed",
            "-o",
            str(out),
            inventory=out,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        draft = inventory.load(out)
        for n in NODES:
            d, r = draft.node(n), ref.node(n)
            assert [(x.netdev, x.hca) for x in d.data_plane] == [(x.netdev, x.hca) for x in r.data_plane]
            assert (d.mtu, d.gid_index) == (r.mtu, None)  # no GID index drafted (issue 35)
            # init's control plane: the first link in HCA order with a shared subnet (port 0's with two cables)
            if mode.startswith("two-cables"):
                assert (d.control_if, str(d.control_ip)) == ("enp1s0f0np0", f"198.19.1.{1 if n == HEAD else 2}")
            else:
                assert (d.control_if, d.control_ip) == (r.control_if, r.control_ip)
        if mode == "one-cable":
            assert "rocep1s0f0" in res.stdout and "left out" in res.stdout  # port 0: no cable, said so
        acct = account()  # init names the SSH user and the HF cache its home gives, per node
        for n in NODES:
            assert (
                f"{n}: ssh user {acct['ssh_user']} (uid {acct['uid']}, in docker), HF cache {acct['hf_cache']}"
                in res.stdout
            ), res.stdout
        _, _, rows = doctor(sc, out)
    finally:
        testbed.reset()
    changed = {
        (i, n): (base[(i, n)]["status"], rows[(i, n)]["status"])
        for i in NET_IDS
        for n in NODES
        if base[(i, n)]["status"] != rows[(i, n)]["status"]
    }
    assert changed == {}


def test_min_driver_fails_only_the_node_that_lacks_it(testbed, sc, healthy, tmp_path):
    """A profile that states min_driver (issue 24): the worker's older driver FAILs there, the head,
    at the minimum, passes; without the setting the same difference is only a WARN (Case gpu.driver)."""
    d = tmp_path / "profiles"
    d.mkdir()
    text = (TESTBED_PROFILES / "testbed.toml").read_text()
    (d / "testbed-min-driver.toml").write_text('min_driver = "580.95"\n' + text)
    try:
        testbed.set_driver_version(WORKER, "570.00")
        res = sc(
            "doctor", "--json", "--profile", "testbed-min-driver", env={"SPARKCLUSTER_PROFILES": str(d)}, timeout=120
        )
    finally:
        testbed.set_driver_version(WORKER)
    assert res.returncode == 1, res.stdout + res.stderr
    rows = {(c["id"], c["node"]): c for c in json.loads(res.stdout)["checks"]}
    r = rows[("gpu.driver", WORKER)]
    assert r["status"] == "fail" and "driver 570.00 is older than 580.95" in r["detail"], r
    assert "580.95 or later" in r["fix"]
    assert rows[("gpu.driver", HEAD)]["status"] == "ok"


def _one_spark(text: str) -> str:
    """The head's block alone, without its data_plane: README's one-Spark inventory on the testbed."""
    first = text.index("[[nodes]]")
    head_block, *_ = text[first:].split("\n[[nodes]]")
    head_block = re.sub(r"\ndata_plane = \[.*?\n\]\n", "\n", head_block + "\n", flags=re.S)
    return text[:first] + head_block


def test_one_spark_without_a_data_plane_is_healthy(healthy, sc, testbed, tmp_path):
    """One node names no QSFP port (nothing crosses a cable): doctor on the head alone has no FAIL,
    and rdma.hca, with no HCA to pair, is skipped (the pair's HCA checks stay with the pair)."""
    inv = inventory_variant(testbed, tmp_path, _one_spark)
    assert "data_plane" not in inv.read_text() and inv.read_text().count("[[nodes]]") == 1
    rc, doc, rows = doctor(sc, inventory=inv)
    bad = {k: (r["status"], r["detail"]) for k, r in rows.items() if r["status"] == "fail"}
    assert rc == 0 and not bad, bad
    assert {n for _, n in rows} == {HEAD}
    assert rows[("rdma.hca", HEAD)]["status"] == "skip"
