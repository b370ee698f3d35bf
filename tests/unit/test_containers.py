"""Container spec: ray start argv, flags identical on every node, per-host env, config hash,
the `docker run` equivalent, the files tar, and the Engine API calls (against a tiny fake API)."""

from __future__ import annotations

import dataclasses
import io
import json
import shlex
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import inventory_dict, make_inventory

from sparkcluster.config import inventory, profile
from sparkcluster.container.spec import AGENT_FILES, create_and_start, files_tar, ray_start_argv, spec_for
from sparkcluster.labels import CLUSTER_LABEL, CONFIG_LABEL, PROFILE_LABEL, ROLE_LABEL
from sparkcluster.node import contract

DATA = Path(__file__).parent / "data"
IMAGE = "sparkcluster/vllm-ray:26.05.post1-py3-ray2.60.0"
IMAGE_ID = "sha256:" + "ab" * 32  # the image's ID: the compile cache's key needs it


@pytest.fixture(scope="module")
def prof() -> profile.Profile:
    return profile.load_profile("testbed")


def inventories() -> list[inventory.Inventory]:
    return [_homes(inventory.load(DATA / "profile-cluster.toml")), make_inventory()]


def _homes(inv: inventory.Inventory) -> inventory.Inventory:
    for n in inv.nodes:  # as gathering the facts learns it
        inv.set_home(n.name, "/home/spark", "1000:1000")
    return inv


@pytest.fixture(params=["profile-cluster", "testbed-like"])
def inv(request) -> inventory.Inventory:
    return inventories()[0 if request.param == "profile-cluster" else 1]


def specs(inv, prof):
    return spec_for(inv, prof, inv.head, IMAGE, IMAGE_ID), spec_for(inv, prof, inv.workers[0], IMAGE, IMAGE_ID)


# ---- ray start ----------------------------------------------------------------------------------


def test_ray_start_head_argv_exact():
    inv = make_inventory()
    assert ray_start_argv(inv, inv.head) == [
        "ray",
        "start",
        "--head",
        "--port=6379",
        "--dashboard-host=127.0.0.1",
        "--node-ip-address=198.19.2.1",
        "--num-gpus=1",
        "--disable-usage-stats",
        "--block",
    ]


def test_ray_start_worker_argv_exact():
    inv = make_inventory()
    assert ray_start_argv(inv, inv.workers[0]) == [
        "ray",
        "start",
        "--address=198.19.2.1:6379",
        "--node-ip-address=198.19.2.2",
        "--num-gpus=1",
        "--disable-usage-stats",
        "--block",
    ]


def test_ray_start_follows_inventory_port_and_gpus():
    data = inventory_dict()
    data["cluster"]["ray_port"] = 6400
    data["nodes"][1]["gpus"] = 2
    inv = make_inventory(data)
    assert "--port=6400" in ray_start_argv(inv, inv.head)
    worker = ray_start_argv(inv, inv.workers[0])
    assert "--address=198.19.2.1:6400" in worker
    assert "--num-gpus=2" in worker
    assert "--head" not in worker


def test_ray_start_node_ip_is_control_ip_not_a_data_link(inv):
    for node in inv.nodes:
        argv = ray_start_argv(inv, node)
        assert [a for a in argv if a.startswith("--node-ip-address=")] == [f"--node-ip-address={node.control_ip}"]


# ---- spec_for -----------------------------------------------------------------------------------


def test_host_config_identical_on_head_and_worker(inv, prof):
    head, worker = specs(inv, prof)
    assert head.host_config_kwargs() == worker.host_config_kwargs()
    hc = head.host_config_kwargs()
    assert hc["network_mode"] == "host"
    assert hc["ipc_mode"] == "host"
    # the kernel's log read-only, and the capability dmesg_restrict asks of its reader (issue 75)
    assert hc["devices"] == ["/dev/infiniband:/dev/infiniband:rwm", "/dev/kmsg:/dev/kmsg:r"]
    assert hc["cap_add"] == ["IPC_LOCK", "SYSLOG"]
    assert hc["ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}]
    assert hc["device_requests"][0]["Count"] == -1
    assert hc["device_requests"][0]["Capabilities"] == [["gpu"]]
    assert hc["shm_size"] == prof.shm_size
    cache = inv.hf_cache(inv.head.name)  # the SSH user's ~/.cache/huggingface, learnt per node
    assert cache == "/home/spark/.cache/huggingface"
    assert hc["binds"][cache] == {"bind": cache, "mode": "rw"}
    # and the compile caches of this image, model and flags (test_compile_cache checks the rest)
    compiled, headers = sorted(set(hc["binds"]) - {cache})
    assert compiled.startswith("/home/spark/.cache/sparkcluster/compile/")
    assert hc["binds"][compiled]["bind"] == compiled
    # inductor's precompiled headers, which it keeps in its default folder whatever its variable says
    assert headers == compiled + "/inductor-default"
    assert hc["binds"][headers]["bind"] == "/tmp/torchinductor_root"


def test_host_config_never_caps_memory(inv, prof):
    for spec in specs(inv, prof):
        keys = spec.host_config_kwargs().keys()
        assert not [k for k in keys if "mem" in k.lower()], keys
        argv = shlex.split(spec.docker_run_equivalent())
        assert not [a for a in argv if a.startswith(("--memory", "-m=")) or a == "-m"]


def test_spec_differs_only_in_role_and_per_host_values(inv, prof):
    head, worker = specs(inv, prof)
    assert (head.role, worker.role) == ("head", "worker")
    assert head.image == worker.image == IMAGE
    assert head.shm_size == worker.shm_size
    assert head.binds == worker.binds
    # the agent's configuration names the node and its role; every other file is the same
    assert {k: v for k, v in head.files.items() if k != contract.CONFIG_PATH} == {
        k: v for k, v in worker.files.items() if k != contract.CONFIG_PATH
    }
    assert {k: head.files[k] for k in AGENT_FILES} == AGENT_FILES
    assert head.files[f"{contract.AGENT_DIR}/__main__.py"].endswith("sys.exit(main(*sys.argv[1:]))\n")
    cfg_h, cfg_w = json.loads(head.files[contract.CONFIG_PATH]), json.loads(worker.files[contract.CONFIG_PATH])
    assert (cfg_h["role"], cfg_w["role"]) == ("head", "worker")
    assert cfg_h["ray_argv"] == head.command and cfg_w["ray_argv"] == worker.command
    assert cfg_w["report_ip"] == str(inv.workers[0].control_ip) and cfg_h["peers"][0]["ip"] == cfg_w["report_ip"]
    assert set(head.env) == set(worker.env)
    differing = {k for k in head.env if head.env[k] != worker.env[k]}
    assert differing <= set(profile.PER_HOST_VARS)
    assert "VLLM_HOST_IP" in differing
    assert head.labels[CLUSTER_LABEL] == worker.labels[CLUSTER_LABEL] == inv.cluster.name
    assert head.labels[PROFILE_LABEL] == worker.labels[PROFILE_LABEL] == prof.name
    assert (head.labels[ROLE_LABEL], worker.labels[ROLE_LABEL]) == ("head", "worker")
    assert head.name != worker.name
    assert head.command == ray_start_argv(inv, inv.head)
    assert worker.command == ray_start_argv(inv, inv.workers[0])


def test_env_has_forwarded_and_own_per_host_values(inv, prof):
    assert prof.forwarded_env()  # the testbed profile forwards variables
    for node in inv.nodes:
        env = spec_for(inv, prof, node, IMAGE).env
        for k, v in prof.forwarded_env().items():
            assert env[k] == v
        assert env["VLLM_HOST_IP"] == str(node.control_ip)
        assert env["NCCL_IB_HCA"] == ",".join(link.hca for link in node.data_plane)
        assert env["NCCL_SOCKET_IFNAME"] == node.control_if
        assert env["GLOO_SOCKET_IFNAME"] == node.control_if
        assert env["RAY_memory_usage_threshold"] == "1.0"
        assert env["VLLM_CONFIG_ROOT"] == prof.env.vllm_config_root


def test_nccl_ib_hca_keeps_inventory_order_when_ports_differ(prof):
    inv = _homes(inventory.load(DATA / "profile-cluster.toml"))
    head, worker = specs(inv, prof)
    assert head.env["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
    assert worker.env["NCCL_IB_HCA"] == "roceP2p1s0f1,rocep1s0f1"
    assert head.env["VLLM_HOST_IP"] == "192.168.100.10"
    assert worker.env["VLLM_HOST_IP"] == "192.168.100.11"


def test_no_secret_names_in_container_env(inv, prof):
    for spec in specs(inv, prof):
        for name in profile.SECRET_NAMES:
            assert name not in spec.env
            assert name not in spec.docker_run_equivalent()
            assert name not in repr(spec.create_kwargs())


def test_container_files_carry_the_non_carry_over_list(inv, prof):
    head, _ = specs(inv, prof)
    path, text = profile.non_carry_over_file(prof)
    assert head.files == {path: text, **AGENT_FILES, contract.CONFIG_PATH: head.files[contract.CONFIG_PATH]}


def test_config_hash_stable_and_sensitive(inv, prof):
    head, worker = specs(inv, prof)
    again = spec_for(inv, prof, inv.head, IMAGE, IMAGE_ID)
    assert head.config_hash() == again.config_hash()
    assert len(head.config_hash()) == 16
    assert head.config_hash() != worker.config_hash()  # per-host values differ
    changed = dataclasses.replace(head, env={**head.env, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "0"})
    assert changed.config_hash() != head.config_hash()
    added = dataclasses.replace(head, env={**head.env, "NEW_VAR": "x"})
    assert added.config_hash() != head.config_hash()
    assert dataclasses.replace(head, image=IMAGE + "x").config_hash() != head.config_hash()
    assert dataclasses.replace(head, command=head.command[:-1]).config_hash() != head.config_hash()


def test_config_hash_follows_profile_forwarded_vars(inv, prof):
    other = prof.model_copy(
        update={
            "env": prof.env.model_copy(update={"forward": {**prof.env.forward, "VLLM_NVFP4_GEMM_BACKEND": "marlin"}})
        }
    )
    assert spec_for(inv, other, inv.head, IMAGE).config_hash() != spec_for(inv, prof, inv.head, IMAGE).config_hash()


def test_create_kwargs_labels_include_config_hash(inv, prof):
    head, _ = specs(inv, prof)
    kw = head.create_kwargs()
    assert kw["labels"][CONFIG_LABEL] == head.config_hash()
    # an NGC image keeps its entrypoint (its start-up sets up CUDA forward compatibility): the API call
    # names none, so the image's own runs, with the agent as its command
    assert prof.image.kind == "ngc" and "entrypoint" not in kw
    # the node agent is the foreground process; it runs Ray's command, read from its configuration
    assert kw["command"] == ["python3", contract.AGENT_DIR, contract.CONFIG_PATH]
    assert json.loads(head.files[contract.CONFIG_PATH])["ray_argv"] == head.command
    assert kw["environment"] == head.env
    assert kw["image"] == IMAGE and kw["name"] == head.name
    assert "host_config" not in kw


# ---- docker run equivalent ----------------------------------------------------------------------


def test_docker_run_equivalent_splits_back_with_every_flag(inv, prof):
    for spec in specs(inv, prof):
        argv = shlex.split(spec.docker_run_equivalent())
        assert argv[:3] == ["docker", "run", "-d"]
        assert "--device=/dev/infiniband" in argv
        assert "--cap-add=IPC_LOCK" in argv
        i = argv.index("--ulimit")
        assert argv[i + 1] == "memlock=-1:-1"
        for flag, value in (
            ("--network", "host"),
            ("--ipc", "host"),
            ("--gpus", "all"),
            ("--shm-size", spec.shm_size),
            ("--name", spec.name),
        ):
            assert argv[argv.index(flag) + 1] == value
        assert argv[argv.index("--restart") + 1] == "unless-stopped" and "--init" in argv
        # image, then the node agent's command verbatim
        n = len(spec.agent_command())
        assert argv[-n:] == spec.agent_command()
        assert argv[-n - 1] == spec.image
        assert "--entrypoint" not in argv  # NGC's start-up runs (container/spec.keeps_entrypoint)
        envs = [argv[j + 1] for j, a in enumerate(argv) if a == "-e"]
        assert envs == [f"{k}={v}" for k, v in spec.env.items()]
        labels = [argv[j + 1] for j, a in enumerate(argv) if a == "--label"]
        assert f"{CONFIG_LABEL}={spec.config_hash()}" in labels


def test_a_vllm_openai_image_has_its_entrypoint_emptied_an_ngc_image_keeps_it(inv, prof):
    # vllm/vllm-openai's ENTRYPOINT is `vllm serve`: it would take the agent's command as a model
    openai = prof.model_copy(update={"image": prof.image.model_copy(update={"kind": "vllm-openai"})})
    spec = spec_for(inv, openai, inv.head, IMAGE, IMAGE_ID)
    assert spec.create_kwargs()["entrypoint"] == []
    argv = shlex.split(spec.docker_run_equivalent())
    n = len(spec.agent_command())
    assert argv[-n - 3 : -n - 1] == ["--entrypoint", ""]
    # switching the start-up makes the container again (its configuration hash changes)
    assert spec.config_hash() != spec_for(inv, prof, inv.head, IMAGE, IMAGE_ID).config_hash()


def test_docker_run_equivalent_quotes_hostile_values(inv, prof):
    head, _ = specs(inv, prof)
    evil = dataclasses.replace(head, env={**head.env, "X": "a b; $(touch /tmp/pwned) 'q' \"d\""})
    argv = shlex.split(evil.docker_run_equivalent())
    assert "X=a b; $(touch /tmp/pwned) 'q' \"d\"" in argv


# ---- files tar ----------------------------------------------------------------------------------


def test_files_tar_round_trips():
    files = {
        "/etc/sparkcluster/vllm/ray_non_carry_over_env_vars.json": '["VLLM_HOST_IP"]\n',
        "/etc/sparkcluster/other.txt": "héllo\nwörld",
        "/top.txt": "",
    }
    with tarfile.open(fileobj=io.BytesIO(files_tar(files))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        for path, text in files.items():
            m = members[path.lstrip("/")]
            assert m.isfile()
            assert m.mode == 0o644
            assert tar.extractfile(m).read() == text.encode()
        for d in ("etc", "etc/sparkcluster", "etc/sparkcluster/vllm"):
            assert members[d].isdir()
        # each directory once, before its files
        names = [m.name for m in tar.getmembers()]
        assert names.count("etc/sparkcluster") == 1
        assert names.index("etc/sparkcluster/vllm") < names.index(
            "etc/sparkcluster/vllm/ray_non_carry_over_env_vars.json"
        )


def test_files_tar_extracts_to_the_right_place(tmp_path, prof):
    files = profile.container_files(prof)
    with tarfile.open(fileobj=io.BytesIO(files_tar(files))) as tar:
        tar.extractall(tmp_path, filter="data")
    for path, text in files.items():
        assert (tmp_path / path.lstrip("/")).read_text() == text


# ---- Engine API calls (tiny fake API) ------------------------------------------------------------


class FakeAPI:
    def __init__(self):
        self.calls: list[tuple] = []

    def create_host_config(self, **kw):
        self.calls.append(("create_host_config", kw))
        return {"hc": kw}

    def create_container(self, **kw):
        self.calls.append(("create_container", kw))
        return {"Id": "c0ffee"}

    def put_archive(self, cid, path, data):
        self.calls.append(("put_archive", cid, path, data))
        return True

    def start(self, cid):
        self.calls.append(("start", cid))


def test_create_and_start_writes_files_before_start(inv, prof):
    api = FakeAPI()
    head, _ = specs(inv, prof)
    assert create_and_start(api, head) == "c0ffee"
    assert [c[0] for c in api.calls] == ["create_host_config", "create_container", "put_archive", "start"]
    assert api.calls[0][1] == head.host_config_kwargs()
    created = api.calls[1][1]
    assert created["host_config"] == {"hc": head.host_config_kwargs()}
    assert {k: v for k, v in created.items() if k != "host_config"} == head.create_kwargs()
    _, cid, path, data = api.calls[2]
    assert (cid, path) == ("c0ffee", "/")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for path, text in head.files.items():
            assert tar.extractfile(path.lstrip("/")).read() == text.encode()
    assert api.calls[3] == ("start", "c0ffee")


def test_create_and_start_without_files_skips_put_archive(inv, prof):
    api = FakeAPI()
    head, _ = specs(inv, prof)
    create_and_start(api, dataclasses.replace(head, files={}))
    assert [c[0] for c in api.calls] == ["create_host_config", "create_container", "start"]


def test_a_container_created_and_never_started_is_recorded_for_the_rollback(inv, prof):
    """Issue 23: the ID is recorded when the container exists, not after its start, so a start the
    engine refuses (a device missing, a port held) still leaves the container to the rollback."""
    import docker.errors

    from sparkcluster.errors import StageError
    from sparkcluster.up.stages import containers
    from sparkcluster.up.stages.containers import Created

    class Refusing(FakeAPI):
        def start(self, cid):
            raise docker.errors.APIError("error gathering device information while adding custom device")

    api = Refusing()
    head, _ = specs(inv, prof)
    owned: dict = {}
    host = SimpleNamespace(name=head.node, docker=lambda: SimpleNamespace(api=api))
    r = SimpleNamespace(
        cluster=SimpleNamespace(hosts={head.node: host}),
        find=lambda kind: owned.get(kind),
        put=lambda v: owned.setdefault(type(v), v),
    )
    with pytest.raises(StageError, match="error gathering device information"):
        containers.create(r, head)
    assert owned[Created].containers == {head.node: {"c0ffee"}}


def test_each_node_mounts_its_own_ssh_users_cache():
    """The default HF cache is `~/.cache/huggingface`, `~` being the SSH user's home on each node as
    the facts found it: two accounts with different homes each get their own cache mounted."""
    inv = inventory.load(DATA / "profile-cluster.toml")
    assert inv.cluster.hf_cache == "~/.cache/huggingface"
    assert inv.hf_cache("spark-a", unresolved_ok=True) == "~/.cache/huggingface"
    with pytest.raises(RuntimeError):
        inv.hf_cache("spark-a")  # never a path guessed for a node not asked
    inv.set_home("spark-a", "/home/alice", "1000:1000")
    inv.set_home("spark-b", "/home/bob/", "1001:1001")
    head, worker = specs(inv, profile.load_profile("testbed"))
    assert head.binds["/home/alice/.cache/huggingface"] == "/home/alice/.cache/huggingface"
    assert worker.binds["/home/bob/.cache/huggingface"] == "/home/bob/.cache/huggingface"
    # the compile caches too: each under its own user's home (test_compile_cache has the rest)
    assert [p for p in head.binds if "/compile/" in p][0].startswith("/home/alice/.cache/sparkcluster/compile/")
    assert [p for p in worker.binds if "/compile/" in p][0].startswith("/home/bob/.cache/sparkcluster/compile/")
    assert (head.env["HF_HOME"], worker.env["HF_HOME"]) == (
        "/home/alice/.cache/huggingface",
        "/home/bob/.cache/huggingface",
    )
    assert inv.owner("spark-b") == "1001:1001"


def test_the_fabric_tests_ranks_run_in_the_images_start_up(inv, prof):
    # the throwaway starts as the serving container would (NGC's entrypoint kept; a vllm-openai
    # image's emptied), and each rank is a `docker exec` under bash, whose BASH_ENV re-runs NGC's
    # shinit_v2: an exec does not inherit the start-up's exports (container/spec.keeps_entrypoint)
    from sparkcluster.fabric import launch

    ngc = launch.throwaway_spec(inv, prof, inv.head, IMAGE)
    assert ngc.image_entrypoint and "entrypoint" not in ngc.create_kwargs()
    openai = prof.model_copy(update={"image": prof.image.model_copy(update={"kind": "vllm-openai"})})
    assert launch.throwaway_spec(inv, openai, inv.head, IMAGE).create_kwargs()["entrypoint"] == []
    assert launch.IN_START_UP[:2] == ["bash", "-c"] and launch.IN_START_UP[-1] == launch.PROBE_PATH
