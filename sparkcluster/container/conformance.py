"""Each profile's container beside its source's: the options the public document it follows passes to
`docker run` (the profile's `[source.container]`) and what `up` creates (`spec_for`, read back from the
Engine API arguments), option by option. Where they differ, the difference is either one every
sparkcluster container makes (`HOUSE`, each with its reason) or one the profile names in
`[source.diverges]` with its reason; anything else is a problem (`problems`), and tests/unit fails on it.
The reference page docs/reference/conformance.md is made from `rows` (docs/gen.py)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sparkcluster.config import profile as profiles
from sparkcluster.config import shipped
from sparkcluster.config.inventory import Inventory
from sparkcluster.container.spec import ContainerSpec, spec_for

NOT_PASSED = "not passed"
IMAGES_OWN = "the image's own"
EMPTIED = "emptied"

# the options compared, in the table's order
OPTIONS = (
    "privileged",
    "gpus",
    "network",
    "ipc",
    "shm-size",
    "ulimit memlock",
    "ulimit stack",
    "ulimit nofile",
    "devices",
    "cap-add",
    "security-opt",
    "entrypoint",
    "command",
)

FIELD_NOTES = 'docs/field-notes.md, "Bring-up of a TP=2 pair"'
BUILD_LOG = "https://corti.com/serving-nemotron-super-120b-with-a-1m-token-context-on-a-2-node-dgx-spark-cluster/"


@dataclass(frozen=True)
class House:
    """An option every sparkcluster container carries alike, whatever its source passes: the value
    (None: any value) and why."""

    value: str | None
    why: str


HOUSE: dict[str, House] = {
    "gpus": House("all", "every container gets the node's GPUs (a Spark has one)"),
    "network": House(
        "host",
        "Ray, NCCL and vLLM reach each node at its control IP, and the endpoint answers on the inventory's "
        f"api_port on the host, not on a published port ({FIELD_NOTES})",
    ),
    "ipc": House(
        "host",
        "the pairs' bring-up the field notes record runs every node's container in the host's IPC namespace, "
        f"the same on every node, and doctor reads it back from each ({FIELD_NOTES})",
    ),
    "ulimit memlock": House(
        "-1:-1",
        "RDMA registers pinned memory: without an unlimited memlock a worker's NCCL falls back to TCP sockets "
        f"without a word ({BUILD_LOG}; {FIELD_NOTES})",
    ),
    "devices": House(
        "/dev/infiniband, /dev/kmsg",
        f"the RoCE HCAs, for NCCL's RDMA transport (as memlock: {BUILD_LOG}); and the kernel's log, read-only, "
        "where the node agent reads Xid, OOM-kill, mlx5 and AER lines (node/kernel_log; docs/explanation/security.md)",
    ),
    "cap-add": House(
        "IPC_LOCK, SYSLOG",
        f"IPC_LOCK to pin the memory RDMA registers (as memlock: {BUILD_LOG}); SYSLOG to read /dev/kmsg, "
        "which kernel.dmesg_restrict=1 (DGX OS, an Ubuntu) keeps from a reader without it",
    ),
    "entrypoint": House(
        None,
        "an NGC image keeps its own entrypoint, whose start-up sets up CUDA forward compatibility for everything "
        "the agent starts; a vllm/vllm-openai image's entrypoint is `vllm serve` itself, which would take the "
        "agent's command for a model, so it is emptied (container/spec.py, keeps_entrypoint)",
    ),
    "command": House(
        None,
        "the container's process is sparkcluster's node agent: it starts Ray where the deployment uses it, and "
        "`vllm serve` with the profile's flags runs inside the head's container (on every node's with executor "
        "mp), where the source types or runs `vllm serve` itself",
    ),
}

# what every container adds that no source is compared on (container/spec.py)
ADDED = {
    "--init": "tini as PID 1 reaps the processes Ray and vLLM orphan",
    "--restart unless-stopped": "Docker brings the container back after a reboot or a crash (never after `down`)",
}


@dataclass(frozen=True)
class Row:
    option: str
    source: str
    created: str
    why: str  # "" where they agree


def _ulimit(value: str) -> str:
    """soft:hard, a hard limit not written being the soft one (docker/go-units ulimit.go, ParseUlimit)."""
    soft, _, hard = value.partition(":")
    return f"{soft}:{hard or soft}"


def _size(value: str) -> str:
    # Docker's sizes are binary whether written 16g or 16gb (compose's "16gb")
    v = value.strip().lower()
    return v[:-1] if len(v) > 2 and v.endswith("b") and v[-2] in "kmg" else v


def _joined(values) -> str:
    return ", ".join(sorted(values)) or NOT_PASSED


def source_values(c: profiles.SourceContainer) -> dict[str, str]:
    ulimits = {k: _ulimit(v) for k, v in c.ulimits.items()}
    return {
        "privileged": "yes" if c.privileged else "no",
        "gpus": c.gpus or NOT_PASSED,
        "network": c.network or NOT_PASSED,
        "ipc": c.ipc or NOT_PASSED,
        "shm-size": _size(c.shm_size) if c.shm_size else NOT_PASSED,
        **{f"ulimit {n}": ulimits.get(n, NOT_PASSED) for n in ("memlock", "stack", "nofile")},
        "devices": _joined(d.split(":")[0] for d in c.devices),
        "cap-add": _joined(x.upper().removeprefix("CAP_") for x in c.cap_add),
        "security-opt": _joined(c.security_opt),
        "entrypoint": IMAGES_OWN if c.entrypoint is None else (c.entrypoint or EMPTIED),
        "command": c.command,
    }


def created_values(spec: ContainerSpec) -> dict[str, str]:
    """The options of the container `up` creates, read from the Engine API arguments it sends."""
    hc, create = spec.host_config_kwargs(), spec.create_kwargs()
    ulimits = {u["Name"]: f"{u['Soft']}:{u['Hard']}" for u in hc["ulimits"]}
    gpus = [d for d in hc.get("device_requests", []) if ["gpu"] in d.get("Capabilities", [])]
    return {
        "privileged": "yes" if hc.get("privileged") else "no",
        "gpus": "all" if any(d.get("Count") == -1 for d in gpus) else NOT_PASSED,
        "network": hc.get("network_mode") or NOT_PASSED,
        "ipc": hc.get("ipc_mode") or NOT_PASSED,
        "shm-size": _size(hc["shm_size"]) if hc.get("shm_size") else NOT_PASSED,
        **{f"ulimit {n}": ulimits.get(n, NOT_PASSED) for n in ("memlock", "stack", "nofile")},
        "devices": _joined(d.split(":")[0] for d in hc.get("devices", [])),
        "cap-add": _joined(hc.get("cap_add", [])),
        "security-opt": _joined(hc.get("security_opt", [])),
        "entrypoint": IMAGES_OWN if "entrypoint" not in create else EMPTIED,
        "command": "the node agent: " + shlex.join(create["command"]),
    }


def inventory(nodes: int) -> Inventory:
    """The README's pair (its first `nodes` Sparks: spark-a the head, then workers), the SSH user's home
    learnt as gathering facts would: what the table computes `up`'s containers on."""
    names = ["spark-a", "spark-b", "spark-c", "spark-d", "spark-e", "spark-f", "spark-g", "spark-h"][:nodes]
    inv = Inventory.model_validate(
        {
            "cluster": {"name": "pair"},
            "nodes": [
                {
                    "name": name,
                    "role": "head" if i == 0 else "worker",
                    "ssh": f"spark@192.168.1.{11 + i}",
                    "control_if": "enp1s0f1np1",
                    "control_ip": f"192.168.100.{10 + i}",
                    "data_plane": [
                        {"netdev": "enp1s0f1np1", "hca": "rocep1s0f1"},
                        {"netdev": "enP2p1s0f1np1", "hca": "roceP2p1s0f1"},
                    ],
                    "mtu": 9000,
                }
                for i, name in enumerate(names)
            ],
        }
    )
    for name in names:
        inv.set_home(name, "/home/spark", "1000:1000")
    return inv


def shipped_profiles() -> list[profiles.Profile]:
    """The model profiles that ship with sparkcluster (env-profiles/), whatever $SPARKCLUSTER_PROFILES adds."""
    out = []
    for path in sorted(shipped.profiles_dir().glob("*.toml")):
        if path.name.endswith(".perf.toml"):  # a performance record, beside its profile
            continue
        prof = profiles.load_profile(str(path), service=True)
        if isinstance(prof, profiles.Profile):
            out.append(prof)
    return out


def created_specs(prof: profiles.Profile) -> list[ContainerSpec]:
    """Every node's container of the profile on an inventory of as many Sparks as it has ranks."""
    inv = inventory(max(1, min(prof.world_size, 8)))
    return [spec_for(inv, prof, node, prof.image.ref) for node in inv.nodes]


def rows(prof: profiles.Profile) -> list[Row]:
    """Option by option: the source's value, what `up` creates (the same on every node: else both are
    shown) and why they differ ("" where they agree; "UNEXPLAINED" where nothing says)."""
    assert prof.source is not None, f"{prof.name}: no [source]"
    theirs = source_values(prof.source.container)
    per_node = [created_values(s) for s in created_specs(prof)]
    out = []
    for option in OPTIONS:
        made = sorted({v[option] for v in per_node})
        created = " / ".join(made)
        out.append(Row(option, theirs[option], created, _why(prof, option, theirs[option], made)))
    return out


UNEXPLAINED = "UNEXPLAINED"


def _why(prof: profiles.Profile, option: str, theirs: str, made: list[str]) -> str:
    if made == [theirs]:
        return ""
    named = prof.source.diverges.get(option) if prof.source else None
    if named:
        return named
    house = HOUSE.get(option)
    if house and (house.value is None or made == [house.value]):
        return f"every container: {house.why}"
    return UNEXPLAINED


def problems(prof: profiles.Profile) -> list[str]:
    """What makes the profile's conformance unexplained: no source, a divergence without a reason, a
    reason named for an option that does not diverge (stale) or that is not an option."""
    if prof.source is None:
        return [f"{prof.name}: no [source]: name the public document the profile follows"]
    out = [
        f"{prof.name}: {r.option}: the source has {r.source!r}, up creates {r.created!r}: fix the profile, "
        f"or name the reason in [source.diverges]"
        for r in rows(prof)
        if r.why == UNEXPLAINED
    ]
    agreeing = {r.option for r in rows(prof) if not r.why}
    for option in prof.source.diverges:
        if option not in OPTIONS:
            out.append(f"{prof.name}: [source.diverges] {option!r} is not an option ({', '.join(OPTIONS)})")
        elif option in agreeing:
            out.append(f"{prof.name}: [source.diverges] {option!r}: the container agrees with the source: remove it")
    return out
