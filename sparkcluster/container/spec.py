"""What each node's container is: a pure spec, the same on every node apart from role and the
per-host values, and the Docker API call that creates it.
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkcluster import node, programs
from sparkcluster.config import compile_cache, images
from sparkcluster.config import profile as profiles
from sparkcluster.config.inventory import Inventory, Node
from sparkcluster.labels import (
    CLUSTER_LABEL,
    CONFIG_LABEL,
    EXECUTOR_LABEL,
    MEMORY_LABEL,
    NODES_LABEL,
    ON_DEMAND_LABEL,
    PROFILE_LABEL,
    ROLE_LABEL,
    SLOT_LABEL,
    container_name,
)
from sparkcluster.node import contract

# Docker brings the container back after a reboot or a crash (never after `down`, which removes it);
# tini as PID 1 reaps what Ray and vLLM orphan
RESTART_POLICY = {"Name": "unless-stopped"}


def keeps_entrypoint(kind: str | None) -> bool:
    """Whether a container of an image of this kind keeps the image's own entrypoint, with the node
    agent as its command.

    An NGC image (and an image built FROM one, as the cluster image is) sets up CUDA forward
    compatibility only in its start-up: `/opt/nvidia/nvidia_entrypoint.sh` sources its entrypoint.d
    parts and `/etc/shinit_v2` (through BASH_ENV), which switch the process to the image's own
    user-mode driver (`LD_LIBRARY_PATH` led by `/usr/local/cuda/compat/lib.real`,
    `_CUDA_COMPAT_STATUS=CUDA Driver OK`) and print the driver banner, then `exec` the command. What
    the command spawns inherits that environment: the agent's `ray start` (and so every Ray worker,
    every rank) and its `vllm serve`. With the entrypoint emptied an NGC 26.08 image on a Spark at
    driver 580.173 failed its first FlashInfer JIT ("the provided PTX was compiled with an unsupported
    toolchain", gyliu513/langX101 PR #409); NVIDIA's one-Spark playbook keeps the entrypoint
    (`docker run ... IMAGE vllm serve ...`, NVIDIA/dgx-spark-playbooks nvidia/vllm/README.md). Docker
    runs the entrypoint again at every restart of the container, so a restarted agent has it too.

    A vllm/vllm-openai image's entrypoint is `vllm serve` itself (its Dockerfile's ENTRYPOINT), which
    would take the agent's command as a model: that entrypoint is emptied, as before; those images are
    built on the CUDA the host driver serves and have no forward-compatibility start-up to lose."""
    return kind != "vllm-openai"


def agent_files() -> dict[str, str]:
    """The node agent's files as the container holds them: the `node/` package under AGENT_DIR and
    its launcher as AGENT_DIR's `__main__.py` (so `python3 AGENT_DIR` runs it)."""
    roots = (f"{node.__name__}.agent", f"{node.__name__}.fabric_probe")  # the agent; the rank program it never imports
    modules = programs.layout({node.__name__, *(m for r in roots for m in programs.modules(r))}, node.__name__, "node")
    modules["__main__.py"] = "sparkcluster.node.launcher"
    return programs.files(contract.AGENT_DIR, modules)


AGENT_FILES = agent_files()

# The flags the field learned to put on every node (docs/field-notes.md, "Bring-up"): a worker without the device,
# capability and ulimit silently fell back to TCP.
# The kernel's log device, read-only, and the capability that reads it while kernel.dmesg_restrict is 1
# (DGX OS): every node's agent reads Xid, OOM-kill, mlx5 and AER lines there (node/kernel_log, issue 75;
# why this rather than the host's journal: docs/explanation/security.md)
KMSG_DEVICE = "/dev/kmsg:/dev/kmsg:r"
DEVICES = ["/dev/infiniband:/dev/infiniband:rwm", KMSG_DEVICE]
CAP_ADD = ["IPC_LOCK", "SYSLOG"]
MEMLOCK = {"Name": "memlock", "Soft": -1, "Hard": -1}


def required_flags(ulimit_stack: int | None = None, ulimit_nofile: int | None = None) -> dict[str, object]:
    """The flags every node's container must carry, in the form `ContainerInspect.flags` reads
    them back from `docker inspect`."""
    return {
        "NetworkMode": "host",
        "IpcMode": "host",
        "CapAdd": sorted(CAP_ADD),
        "Devices": sorted((d.split(":")[0], d.split(":")[1]) for d in DEVICES),
        "Ulimits": sorted(
            [
                (MEMLOCK["Name"], MEMLOCK["Soft"], MEMLOCK["Hard"]),
                *([("stack", ulimit_stack, ulimit_stack)] if ulimit_stack else []),
                *([("nofile", ulimit_nofile, ulimit_nofile)] if ulimit_nofile else []),
            ]
        ),
    }


def ray_start_argv(inv: Inventory, node: Node) -> list[str]:
    """`ray start` for the container's foreground process. --num-gpus is explicit: Ray's own GPU
    detection is not what decides how many ranks a Spark holds, the inventory is."""
    common = [f"--node-ip-address={node.control_ip}", f"--num-gpus={node.gpus}", "--disable-usage-stats", "--block"]
    # a later slot's deployment (issue 60) shares the node with others: Ray's every fixed port moved
    # to its block (a head's dashboard and client server; every node's agent and workers)
    ports = inv.ray_ports()
    head_only = ("dashboard-port", "ray-client-server-port")
    own = [f"--{k}={v}" for k, v in ports.items() if node.role == "head" or k not in head_only]
    if node.role == "head":
        return ["ray", "start", "--head", f"--port={inv.cluster.ray_port}", "--dashboard-host=127.0.0.1", *own, *common]
    return ["ray", "start", f"--address={inv.head.control_ip}:{inv.cluster.ray_port}", *own, *common]


@dataclass(frozen=True)
class ContainerSpec:
    node: str
    role: str
    name: str
    image: str
    command: list[str]
    env: dict[str, str]
    labels: dict[str, str]
    shm_size: str
    binds: dict[str, str]  # host path -> container path
    files: dict[str, str] = field(default_factory=dict)  # written into the container before start
    ulimit_stack: int | None = None  # bytes, soft = hard (seed 004); None: Docker's default
    ulimit_nofile: int | None = None  # open files, soft = hard (NVIDIA's two-Spark recipes); None: Docker's default
    security_opt: tuple[str, ...] = ()  # `--security-opt` values, as the profile gives them (issue 51)
    privileged: bool = False
    # the image's own entrypoint runs the agent (keeps_entrypoint): NGC's start-up and its environment
    image_entrypoint: bool = True
    # what a service's containers differ in (container/service_container): the GPUs given or not; the
    # fabric's flags (the InfiniBand devices, IPC_LOCK, memlock, the host's IPC) left off where no rank
    # runs; `command` run as it is, with no agent (its supervisor is another container); Docker's
    # restart policy; binds whose container side carries `:ro`; files written with a mode of their own
    gpus: bool = True
    fabric: bool = True
    agent: bool = True
    restart: str = RESTART_POLICY["Name"]
    # path -> (text, mode), written before start like `files`: a service's secrets. Never in
    # docker_run_equivalent, create_kwargs or a label: only a digest of each in config_hash
    secret_files: dict[str, tuple[str, int]] = field(default_factory=dict, repr=False)

    def config_hash(self) -> str:
        doc = json.dumps(
            {
                "image": self.image,
                "command": self.command,
                "env": self.env,
                "shm": self.shm_size,
                "binds": self.binds,
                "files": self.files,
                "flags": [DEVICES, CAP_ADD, MEMLOCK],
                **({"stack": self.ulimit_stack} if self.ulimit_stack else {}),
                **({"nofile": self.ulimit_nofile} if self.ulimit_nofile else {}),
                **({"security_opt": list(self.security_opt)} if self.security_opt else {}),
                **({"privileged": True} if self.privileged else {}),
                **self._service_doc(),
                # a container made before the entrypoint was kept is made again, with the image's start-up
                **({"entrypoint": "image"} if self.image_entrypoint else {}),
            },
            sort_keys=True,
        )
        return hashlib.sha256(doc.encode()).hexdigest()[:16]

    def _service_doc(self) -> dict:
        """What a service's containers add to the configuration hash, only where they differ from an
        engine's (so an engine's hash is what it was). A secret counts by its digest: a new key
        makes a new container, and no label carries anything a key could be read back from."""
        doc: dict = {}
        if not self.gpus:
            doc["gpus"] = False
        if not self.fabric:
            doc["fabric"] = False
        if not self.agent:
            doc["agent"] = False
        if self.restart != RESTART_POLICY["Name"]:
            doc["restart"] = self.restart
        if self.secret_files:
            doc["secrets"] = {
                p: [hashlib.sha256(t.encode()).hexdigest(), m] for p, (t, m) in sorted(self.secret_files.items())
            }
        return doc

    def create_kwargs(self) -> dict:
        """Arguments for docker's APIClient.create_container (host_config built separately)."""
        labels = {**self.labels, CONFIG_LABEL: self.config_hash()}
        return {
            "image": self.image,
            "name": self.name,
            "command": self.agent_command(),
            # None: the image's ENTRYPOINT stays (the Engine API leaves it when the field is absent)
            **({} if self.image_entrypoint else {"entrypoint": []}),
            "environment": self.env,
            "labels": labels,
            "detach": True,
        }

    def host_config_kwargs(self) -> dict:
        """Arguments for APIClient.create_host_config. Never a memory cap: unified memory."""
        gpus = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}]
        fabric = {
            "ipc_mode": "host",
            "devices": list(DEVICES),
            "cap_add": list(CAP_ADD),
        }
        return {
            "network_mode": "host",
            **(fabric if self.fabric else {}),
            **({"device_requests": gpus} if self.gpus else {}),
            "ulimits": [*([dict(MEMLOCK)] if self.fabric else []), *self.stack_ulimit(), *self.nofile_ulimit()],
            "shm_size": self.shm_size,
            "restart_policy": {"Name": self.restart},
            "init": True,
            "binds": {h: bind_mode(c) for h, c in self.binds.items()},
            **({"security_opt": list(self.security_opt)} if self.security_opt else {}),
            **({"privileged": True} if self.privileged else {}),
        }

    def docker_run_equivalent(self) -> str:
        """What the API call amounts to, as the `docker run` line a person would type (for --dry-run)."""
        argv = [
            "docker",
            "run",
            "-d",
            "--name",
            self.name,
            *(["--gpus", "all"] if self.gpus else []),
            *(
                [
                    "--device=/dev/infiniband",
                    f"--device={KMSG_DEVICE}",
                    "--cap-add=IPC_LOCK",
                    "--cap-add=SYSLOG",
                    "--ulimit",
                    "memlock=-1:-1",
                ]
                if self.fabric
                else []
            ),
            *(["--ulimit", f"stack={self.ulimit_stack}"] if self.ulimit_stack else []),
            *(["--ulimit", f"nofile={self.ulimit_nofile}:{self.ulimit_nofile}"] if self.ulimit_nofile else []),
            "--network",
            "host",
            *(["--ipc", "host"] if self.fabric else []),
            "--shm-size",
            self.shm_size,
            "--restart",
            self.restart,
            "--init",
            *[f"--security-opt={o}" for o in self.security_opt],
            *(["--privileged"] if self.privileged else []),
        ]
        for h, c in self.binds.items():
            argv += ["-v", f"{h}:{c}"]
        for k, v in {**self.labels, CONFIG_LABEL: self.config_hash()}.items():
            argv += ["--label", f"{k}={v}"]
        for k, v in self.env.items():
            argv += ["-e", f"{k}={v}"]
        argv += [*([] if self.image_entrypoint else ["--entrypoint", ""]), self.image, *self.agent_command()]
        return shlex.join(argv)

    def stack_ulimit(self) -> list[dict]:
        return [{"Name": "stack", "Soft": self.ulimit_stack, "Hard": self.ulimit_stack}] if self.ulimit_stack else []

    def nofile_ulimit(self) -> list[dict]:
        return (
            [{"Name": "nofile", "Soft": self.ulimit_nofile, "Hard": self.ulimit_nofile}] if self.ulimit_nofile else []
        )

    def agent_command(self) -> list[str]:
        """The container's foreground process: the node agent, which runs `self.command` (Ray); a
        service's own container (`agent` false): its command as the profile gives it, appended to its
        image's entrypoint."""
        return ["python3", contract.AGENT_DIR, contract.CONFIG_PATH] if self.agent else list(self.command)


def bind_mode(container_side: str) -> dict[str, str]:
    """A bind's container side as the Engine API takes it: "PATH" (read-write) or "PATH:ro"."""
    path, _, mode = container_side.partition(":")
    return {"bind": path, "mode": "ro" if mode == "ro" else "rw"}


def uses_ray(inv: Inventory, prof: profiles.Profile) -> bool:
    """Ray spans the deployment (config/images.uses_ray)."""
    return images.uses_ray(len(inv.nodes), prof)


def node_rank(inv: Inventory, node: str) -> int:
    """A node's `--node-rank` with executor "mp": the head is 0, the workers follow in inventory order."""
    return [n.name for n in (inv.head, *inv.workers)].index(node)


def spec_for(
    inv: Inventory, prof: profiles.Profile, node: Node, image: str, image_id: str | None = None
) -> ContainerSpec:
    # the compile caches' folder of this image (its ID), model and flags only (config/compile_cache):
    # another key's folder is never in the container. Without the image's ID (the head lacks the
    # image) the folder is pending: the containers stage makes the spec again once the image is built.
    # A profile with compile_cache = "image" mounts none: the engine uses the image's own caches.
    keyed = not compile_cache.in_place(prof)
    cache = compile_cache.folder(inv.compile_cache(node.name), prof, image, image_id) if keyed else ""
    return ContainerSpec(
        node=node.name,
        role=node.role,
        name=container_name(inv.cluster.name, node.role, node.name, inv.slot),
        image=image,
        command=ray_start_argv(inv, node) if uses_ray(inv, prof) else [],
        # the cache is mounted at the same path; HF_HOME makes every rank look there (weights, token)
        env={
            **profiles.container_env(prof, inv, node),
            "HF_HOME": inv.hf_cache(node.name),
            **(compile_cache.env(cache) if keyed else {}),
        },
        labels={
            CLUSTER_LABEL: inv.cluster.name,
            ROLE_LABEL: node.role,
            PROFILE_LABEL: prof.name,
            NODES_LABEL: ",".join(n.name for n in inv.nodes),
            EXECUTOR_LABEL: images.executor_of(len(inv.nodes), prof),
            **({SLOT_LABEL: str(inv.slot)} if inv.slot else {}),
            MEMORY_LABEL: f"{prof.serve.gpu_memory_utilization:g}",
            **({ON_DEMAND_LABEL: "1"} if prof.on_demand.enabled else {}),
        },
        shm_size=prof.shm_size,
        binds={inv.hf_cache(node.name): inv.hf_cache(node.name), **(compile_cache.binds(cache) if keyed else {})},
        files={
            **profiles.container_files(prof),
            **AGENT_FILES,
            contract.CONFIG_PATH: json.dumps(
                {
                    **agent_config(inv, node, uses_ray(inv, prof), prof.executor),
                    "compile_cache": (
                        {"dir": cache, "owner": inv.owner(node.name), "seed": compile_cache.SEEDS} if keyed else None
                    ),
                },
                sort_keys=True,
            ),
        },
        ulimit_stack=prof.ulimit_stack,
        ulimit_nofile=prof.ulimit_nofile,
        security_opt=tuple(prof.security_opt),
        privileged=prof.privileged,
        image_entrypoint=keeps_entrypoint(prof.image.kind),
    )


def agent_config(inv: Inventory, node: Node, ray: bool = True, executor: str = "ray") -> dict:
    """What the node agent needs to know (sparkcluster/node): no secret. Without Ray (one node), the agent
    is the container's only long-lived process and starts the server without a membership wait. With
    executor "mp" on several nodes every agent runs its node's rank(s) of `vllm serve` (node/ranks)."""
    mp = executor == "mp" and len(inv.nodes) > 1
    return {
        **(
            {
                "executor": "mp",
                "rank": node_rank(inv, node.name),
                "head": {"name": inv.head.name, "ip": str(inv.head.control_ip)},
            }
            if mp
            else {}
        ),
        "node": node.name,
        "role": node.role,
        "ray_argv": ray_start_argv(inv, node) if ray else [],
        "report_ip": str(node.control_ip),
        "report_port": inv.cluster.agent_port,
        "state_api": contract.state_api_url(inv.ray_ports().get("dashboard-port", contract.DASHBOARD_PORT)),
        "nodes": [{"name": n.name, "ip": str(n.control_ip), "gpus": n.gpus} for n in inv.nodes],
        "peers": [{"name": n.name, "ip": str(n.control_ip)} for n in inv.nodes if n.name != node.name],
        # the data-plane HCAs the agent watches while serving and the GID NCCL uses (node/fabric_watch)
        "fabric": {"hcas": list(node.hcas), "gid_index": node.gid_index},
    }


def files_tar(files: dict[str, str], mode: int = 0o644) -> bytes:
    """The files (path -> text), each with `mode`, owned by root, with their folders."""
    return files_tar_modes({p: (text, mode) for p, text in files.items()})


def files_tar_modes(files: dict[str, tuple[str, int]], uid: int = 0, gid: int = 0) -> bytes:
    """The files (path -> (text, mode)) owned by uid:gid, with their folders (root's, 0755), as one
    tar for the Engine API's put_archive."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        made: set[str] = set()
        for path, (text, mode) in files.items():
            parts = path.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in made:
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
                    tar.addfile(info)
                    made.add(d)
            data = text.encode()
            info = tarfile.TarInfo("/".join(parts))
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), mode, int(time.time()), uid, gid
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def create_and_start(
    api, spec: ContainerSpec, created: Callable[[str], None] = lambda cid: None, start: bool = True
) -> str:
    """Create the container through the Engine API, write its files, start it (`start`: a service's
    own container is left for its supervisor to start). Returns its ID. `created` hears the ID as
    soon as the container exists, before its files and its start: a container created and never
    started is still this run's to remove."""
    hc = api.create_host_config(**spec.host_config_kwargs())
    c = api.create_container(host_config=hc, **spec.create_kwargs())
    cid = c["Id"]
    created(cid)
    if spec.files:
        api.put_archive(cid, "/", files_tar(spec.files))
    if spec.secret_files:  # a service's secrets: files of their own mode, in no argv, label or environment
        api.put_archive(cid, "/", files_tar_modes(spec.secret_files))
    if start:
        api.start(cid)
    return cid
