"""The inventory: which hosts form the cluster and how each is wired.

A TOML file validated by pydantic. Interface and HCA names are per-node facts (cables can sit in
other ports on the other node, sparkrun#135), so nothing here assumes they match across nodes.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
import typing
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from sparkcluster.config.topology import MAX_NODES, Kind, Miscabled, nodes_allowed, subset
from sparkcluster.errors import InputError

DEFAULT_PATH = Path("~/.config/sparkcluster/cluster.toml")
ENV_VAR = "SPARKCLUSTER_INVENTORY"
HOME_HF_CACHE = "~/.cache/huggingface"
HOME_COMPILE_CACHE = "~/.cache/sparkcluster/compile"  # config/compile_cache
LOOPBACK = "127.0.0.1"  # where a one-node cluster's engines listen (engines_listen = "control")
COMPILE_CACHE_MAX_GB = 64.0  # a 120B model's torch.compile + FlashInfer JIT is a few GB; a Spark has 1-4 TB

_NAME = r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$"
_TARGET = re.compile(
    r"^(?:(?P<user>[a-zA-Z0-9._-]+)@)?(?P<host>[a-zA-Z0-9._-]+|\[[0-9a-fA-F:]+\])(?::(?P<port>\d{1,5}))?$"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataLink(_Strict):
    """One data-plane port: its netdev and the RoCE HCA that sits on it."""

    netdev: str = Field(pattern=r"^[a-zA-Z0-9._-]{1,15}$")
    hca: str = Field(pattern=r"^[a-zA-Z0-9._-]{1,64}$")


class Node(_Strict):
    name: str = Field(pattern=_NAME)
    role: Literal["head", "worker"]
    ssh: str  # ~/.ssh/config alias, or user@host[:port]
    control_if: str = Field(pattern=r"^[a-zA-Z0-9._-]{1,15}$")
    control_ip: ipaddress.IPv4Address
    data_plane: list[DataLink] = Field(min_length=1)
    mtu: int = Field(default=9000, ge=576, le=9216)
    gpus: int = Field(default=1, ge=1, le=8)
    # the node's MemTotal in GB (10^9) as `init` read it: a 128 GB Spark or a 64 GB one (NVIDIA's
    # vllm-cluster page lists "2 x DGX Spark, 64GB each"); `profile lint` judges against it offline
    memory_gb: float | None = Field(default=None, gt=0, le=4096)
    # an older init's RoCE v2 GID index: ignored (issue 35), NCCL finds each HCA's at every start;
    # accepted so that an inventory carrying it still loads, and doctor's rdma.gid says to remove it
    gid_index: int | None = Field(default=None, ge=0, le=255)

    @field_validator("ssh")
    @classmethod
    def _target(cls, v: str) -> str:
        m = _TARGET.match(v)
        if not m:
            raise ValueError("expected an ssh config alias or user@host[:port], e.g. spark@192.168.1.11")
        host = m.group("host")
        # what a resolver accepts (RFC 1035): a longer name fails at connect time, far from here
        if not host.startswith("[") and (len(host) > 253 or any(len(label) > 63 for label in host.split("."))):
            raise ValueError(f"host name too long ({len(host)} characters): at most 253, each part between dots 63")
        if m.group("port") and not 1 <= int(m.group("port")) <= 65535:
            raise ValueError("port out of range 1-65535")
        return v

    @property
    def hcas(self) -> list[str]:
        return [link.hca for link in self.data_plane]

    @property
    def netdevs(self) -> list[str]:
        return [link.netdev for link in self.data_plane]


class ClusterSettings(_Strict):
    name: str = Field(pattern=_NAME)
    # optional ssh client config and known_hosts, relative to the inventory file
    ssh_config: Path | None = None
    known_hosts: Path | None = None
    profile: str | None = None  # default profile for doctor/status when none is given
    image_repo: str = Field(default="sparkcluster/vllm-ray", pattern=r"^[a-z0-9][a-z0-9._/-]*$")
    # a package mirror for the image build (air-gapped hosts); passed as the PIP_INDEX_URL build arg
    pip_index_url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")
    # host path, mounted at the same path in containers; `~/` is the SSH user's home on each node,
    # resolved there with the facts (where that user's own `hf download` puts weights)
    hf_cache: str = Field(default=HOME_HF_CACHE, pattern=r"^(/|~/)[^:\n]*$")
    # compile and autotune caches (config/compile_cache), beside the HF cache, one folder per key;
    # their total on each node is kept under compile_cache_max_gb (oldest keys removed first)
    compile_cache: str = Field(default=HOME_COMPILE_CACHE, pattern=r"^(/|~/)[^:\n]*$")
    compile_cache_max_gb: float = Field(default=COMPILE_CACHE_MAX_GB, gt=0)
    # the hub the weights come from (a mirror, or the testbed's); unset: the public hub. HF_ENDPOINT
    hf_endpoint: str | None = Field(default=None, pattern=r"^https?://[^\s'\"]+$")
    # a cap on a replication between nodes (the weights' stream from the head, along the chain), in
    # MB a second, so that it does not starve an engine serving on the same nodes (issue 40); unset: none
    replication_max_mb_s: float | None = Field(default=None, gt=0)
    api_port: int = Field(default=8000, ge=1, le=65535)
    # "control" (the default): every engine listens only on its head's control address (vLLM's
    # --host; no root needed), on loopback when the cluster is one node, so from the LAN the gateway
    # is the only door; the controller reaches an engine through the head's SSH connection. vLLM's
    # key covers only some of its routes (/invocations and /pause answer without it), so an engine
    # on the LAN is open to the LAN. "all": as the profile's serve.host says (0.0.0.0: every
    # address, the LAN's too), warned at every `up`
    engines_listen: Literal["all", "control"] = "control"
    ray_port: int = Field(default=6379, ge=1, le=65535)
    # executor "mp" (issue 28): vLLM's torch.distributed rendezvous on the head's control IP (vLLM's default)
    master_port: int = Field(default=29501, ge=1, le=65535)
    # each node's agent reports MemAvailable here, on the node's control IP (read-only figures)
    agent_port: int = Field(default=8297, ge=1, le=65535)
    # every attempt of a connection together; unset: ssh_config's ConnectTimeout, else 10 s (remote/ssh)
    connect_timeout: float | None = Field(default=None, gt=0, le=120)
    connect_attempts: int = Field(default=3, ge=1, le=10)
    # how the data plane is cabled (config/topology): written by init from the subnets it found,
    # checked by doctor (net.topology); a ring's order is the nodes' order. Unset: told from the facts
    topology: Kind | None = None


class FabricFigures(_Strict):
    """`[fabric]`: what `doctor --fabric` expects of the collective test between the nodes. Unset
    figures come from the topology (`fabric/verdict`): the field's for a pair of Sparks."""

    healthy_gbps: float | None = Field(default=None, gt=0)  # below it: WARN (all_gather bus bandwidth)
    floor_gbps: float | None = Field(default=None, gt=0)  # below it: FAIL
    max_bytes: int = Field(default=1 << 30, ge=1 << 20, le=4 << 30)  # the largest size tested
    port: int = Field(default=29517, ge=1, le=65535)  # the ranks' rendezvous on the head's control IP
    timeout_s: float = Field(default=60.0, gt=0, le=600)  # every rank joined and every size measured


class MonitorSettings(_Strict):
    """`[monitor]`: what `sparkcluster monitor up` runs (sparkcluster/monitor). The images are pinned
    releases of the upstream ones (an owner may pin by digest: `prom/prometheus@sha256:...`); each
    is started with its binary named (/bin/prometheus, /bin/alertmanager, /bin/node_exporter), so an
    image built otherwise (the testbed's, from Debian's packages) needs only those paths."""

    prometheus_image: str = Field(default="prom/prometheus:v3.5.0", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*$")
    alertmanager_image: str = Field(default="prom/alertmanager:v0.28.1", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*$")
    node_exporter_image: str = Field(default="prom/node-exporter:v1.9.1", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*$")
    node_exporter: bool = True  # host counters (RDMA ports, filesystems, memory) on every node
    scrape_interval_s: float = Field(default=10.0, ge=1, le=300)  # also the rules' evaluation interval
    retention_time: str = Field(default="15d", pattern=r"^[0-9]+[smhdwy]$")
    retention_size: str = Field(default="4GB", pattern=r"^[0-9]+(B|KB|MB|GB|TB)$")
    # where Prometheus, Alertmanager and node_exporter listen: "control" (each on its node's control
    # IP, reachable from the cluster's own network only) or an address the owner chooses (0.0.0.0)
    listen: str = Field(default="control", pattern=r"^(control|[0-9.]+)$")
    prometheus_port: int = Field(default=9090, ge=1, le=65535)
    alertmanager_port: int = Field(default=9093, ge=1, le=65535)
    node_exporter_port: int = Field(default=9100, ge=1, le=65535)


class OnDemandRule(_Strict):
    """`[on_demand]`: which idle deployment yields its memory when a woken one does not fit beside it
    (issue 60). The gateway, which sees every request, chooses among the on-demand deployments in
    rotation on the woken one's nodes with no request in flight: "lru" the least recently asked,
    "priority" the lowest `priority` below the woken one's (ties: the least recently asked); a
    deployment in `pinned` never yields. "never" (the default): a wake that does not fit is refused,
    naming who holds the memory, and nothing is stopped."""

    rule: Literal["never", "lru", "priority"] = "never"
    priority: dict[str, int] = Field(default_factory=dict)  # profile -> priority (unlisted: 0)
    pinned: list[str] = Field(default_factory=list)  # profiles that never yield


class Inventory(_Strict):
    cluster: ClusterSettings
    nodes: list[Node] = Field(min_length=1, max_length=MAX_NODES)  # one Spark is a cluster too (seed 000)
    fabric: FabricFigures = Field(default_factory=FabricFigures)
    monitor: MonitorSettings = Field(default_factory=MonitorSettings)
    on_demand: OnDemandRule = Field(default_factory=OnDemandRule)
    path: Path | None = Field(default=None, exclude=True)
    # node -> the SSH user's home there, learnt from the facts (shared with the copies `only` makes)
    _homes: dict[str, str] = PrivateAttr(default_factory=dict)
    _owners: dict[str, str] = PrivateAttr(default_factory=dict)  # node -> the SSH user's "uid:gid"
    _slot: int = PrivateAttr(default=0)  # the deployment's slot on its nodes (issue 60): `at_slot`
    _whole: int = PrivateAttr(default=0)  # on a part `only` made: how many nodes the whole inventory has

    @model_validator(mode="after")
    def _shape(self) -> Inventory:
        heads = [n.name for n in self.nodes if n.role == "head"]
        if len(heads) != 1:
            raise ValueError(f'exactly one node must have role = "head" (found {len(heads)})')
        if self.cluster.topology and (why := nodes_allowed(self.cluster.topology, len(self.nodes))):
            raise ValueError(f"cluster.topology: {why}")
        return self

    def duplicates(self) -> list[str]:
        """One line per node field that repeats an earlier node's: names, control IPs and SSH
        targets must be unique."""
        lines = []
        for key in ("name", "control_ip", "ssh"):
            first: dict[str, int] = {}
            for i, n in enumerate(self.nodes):
                v = str(getattr(n, key))
                if v in first:
                    lines.append(f"nodes[{i}].{key}: {v!r} is already used by nodes[{first[v]}]")
                else:
                    first[v] = i
        return lines

    def only(self, names: list[str]) -> Inventory:
        """The inventory of a deployment on some of the nodes (in inventory order): the head stays
        head when it is among them, else the first becomes the deployment's head."""
        chosen = [n for n in self.nodes if n.name in names]
        for name in names:
            self.node(name)  # an unknown name is an input error
        if not any(n.role == "head" for n in chosen):
            chosen = [chosen[0].model_copy(update={"role": "head"}), *chosen[1:]]
        # judged as what the part is (issue 35): two neighbours of a ring are a direct pair, with
        # a pair's NCCL variables and figures, not the ring's
        try:
            kind = subset(self.cluster.topology, [n.name for n in self.nodes], [n.name for n in chosen])
        except Miscabled as e:
            raise InputError(
                f"--node {' --node '.join(n.name for n in chosen)}: {e}",
                "run on the whole ring, on one node, or on two nodes a cable joins",
            ) from None
        cluster = self.cluster.model_copy(update={"topology": kind}) if self.cluster.topology else self.cluster
        part = self.model_copy(update={"nodes": chosen, "cluster": cluster})
        part._whole = self._whole or len(self.nodes)
        return part

    @property
    def alone(self) -> bool:
        """Whether the cluster is one node: the owner's whole inventory, not a deployment's part of
        it (a one-node deployment on a pair is reached from the other node, by a gateway there)."""
        return (self._whole or len(self.nodes)) == 1

    def engine_address(self, head: Node | None = None) -> str:
        """Where programs on the cluster's own nodes reach a deployment's engine (the gateway,
        Prometheus, the controller's SSH forward from the head): loopback where a one-node cluster's
        engine listens only there (`engines_listen = "control"`: they run on that node), else the
        head's control address (a wildcard bind answers there too). `head`: the deployment's head,
        where this is the whole inventory."""
        if self.cluster.engines_listen == "control" and self.alone:
            return LOOPBACK
        return str((head or self.head).control_ip)

    @property
    def slot(self) -> int:
        """The slot of the deployment this inventory describes (0: the nodes' first, today's names
        and ports)."""
        return self._slot

    def at_slot(self, slot: int) -> Inventory:
        """The inventory of a deployment in `slot` on its nodes (issue 60): the cluster's ports moved
        by the slot's block (`port_block`), so that every reader of api_port, ray_port, master_port
        and agent_port gets the deployment's own; slot 0 is this inventory itself."""
        if slot == self._slot:
            return self
        if self._slot:
            raise ValueError("at_slot is taken from the slot-0 inventory")
        block = port_block(slot, self.cluster)
        cluster = self.cluster.model_copy(
            update={k: block[k] for k in ("api_port", "ray_port", "master_port", "agent_port")}
        )
        out = self.model_copy(update={"cluster": cluster})
        out._slot = slot
        return out

    def ray_ports(self) -> dict[str, int]:
        """Ray's ports of this deployment beyond the GCS's (`port_block`'s), as `ray start` flags
        name them; {} in slot 0 (Ray's defaults: the flags of before issue 60)."""
        if not self._slot:
            return {}
        b = port_block(self._slot, self.cluster)
        return {
            "dashboard-port": b["dashboard_port"],
            "ray-client-server-port": b["client_server_port"],
            "dashboard-agent-listen-port": b["dashboard_agent_port"],
            "min-worker-port": b["min_worker_port"],
            "max-worker-port": b["max_worker_port"],
        }

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "worker"]

    @property
    def gpu_count(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        import difflib

        names = [n.name for n in self.nodes]
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        err = InputError(
            f"no node named {name!r} in the inventory" + (f": did you mean {close[0]!r}?" if close else ""),
            f"choose one of: {', '.join(names)}",
        )
        err.replace = (name, close[0]) if close else None  # the CLI's fix: the command line with it in place
        raise err

    def set_home(self, node: str, home: str, owner: str = "") -> None:
        self._homes[node] = home
        if owner:
            self._owners[node] = owner

    def owner(self, node: str) -> str | None:
        """The SSH user's `uid:gid` on `node` (from the facts): whom files a container writes into
        the HF cache must belong to. None when not learnt."""
        return self._owners.get(node)

    def hf_cache(self, node: str, unresolved_ok: bool = False) -> str:
        """The HF cache's host path on `node`: the setting, with a leading `~` made the SSH user's
        home there (from the facts). Unresolved, the setting itself when `unresolved_ok` (what
        `profile show` prints without connecting), else a bug."""
        return self._at_home(node, self.cluster.hf_cache, "HF cache", unresolved_ok)

    def compile_cache(self, node: str, unresolved_ok: bool = False) -> str:
        """The compile caches' folder on `node` (config/compile_cache), resolved as `hf_cache` is."""
        return self._at_home(node, self.cluster.compile_cache, "compile cache", unresolved_ok)

    def _at_home(self, node: str, p: str, what: str, unresolved_ok: bool) -> str:
        if not p.startswith("~"):
            return p
        home = self._homes.get(node)
        if home is None:
            if unresolved_ok:
                return p
            raise RuntimeError(f"{node}: the SSH user's home was not learnt before the {what} was needed")
        return home.rstrip("/") + p[1:]

    def resolve(self, p: Path | None) -> Path | None:
        """A path from the inventory, relative to the inventory file's folder."""
        if p is None:
            return None
        p = p.expanduser()
        if not p.is_absolute() and self.path is not None:
            p = self.path.parent / p
        return p


# A deployment's port block (issue 60): several deployments on one node (host networking) each need
# their own API, Ray GCS, Ray dashboard, Ray client server, dashboard agent, worker-port range, mp
# rendezvous and agent report ports. Slot 0 keeps the inventory's ports and Ray's own defaults (what
# every deployment used before, so an upgrade of sparkcluster recreates nothing); slot k moves each
# by k x SLOT_STRIDE and gives Ray's workers a range of their own above Ray's default one. Ray's
# defaults and flags: docs.ray.io/en/latest/cluster/cli.html (`ray start`: --port 6379,
# --dashboard-port 8265, --ray-client-server-port 10001, --dashboard-agent-listen-port 52365,
# --min-worker-port/--max-worker-port; the default worker range is 10002-19999).
SLOT_STRIDE = 10
MAX_SLOTS = 8  # deployments on one node: far more than a Spark's memory holds engines
RAY_DASHBOARD_PORT = 8265
RAY_CLIENT_SERVER_PORT = 10001
RAY_DASHBOARD_AGENT_PORT = 52365
WORKER_RANGE_START = 20000  # slot k's block: 20000 + (k-1) x 1000 .. + 999, clear of Ray's default worker range
WORKER_RANGE_SIZE = 1000


def port_block(slot: int, c: ClusterSettings) -> dict[str, int | None]:
    """The ports of the deployment in `slot`. `c` is the slot-0 inventory's cluster settings: the
    four ports it names moved by slot x SLOT_STRIDE; Ray's dashboard moved the same way; Ray's
    client server, dashboard agent and workers in a block of WORKER_RANGE_SIZE ports of the slot's
    own, clear of Ray's default worker range. Slot 0: Ray's defaults, and no worker range (None)."""
    if not 0 <= slot < MAX_SLOTS:
        raise ValueError(f"slot {slot} outside 0..{MAX_SLOTS - 1}")
    d = slot * SLOT_STRIDE
    first = WORKER_RANGE_START + (slot - 1) * WORKER_RANGE_SIZE if slot else None
    return {
        "api_port": c.api_port + d,
        "ray_port": c.ray_port + d,
        "master_port": c.master_port + d,
        "agent_port": c.agent_port + d,
        "dashboard_port": RAY_DASHBOARD_PORT + d,
        "client_server_port": first if first else RAY_CLIENT_SERVER_PORT,
        "dashboard_agent_port": first + 1 if first else RAY_DASHBOARD_AGENT_PORT,
        "min_worker_port": first + 10 if first else None,
        "max_worker_port": first + WORKER_RANGE_SIZE - 1 if first else None,
    }


def default_path() -> Path:
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else DEFAULT_PATH.expanduser()


_LETTERS = "letters, digits, '.', '_' or '-'"
# what a field's pattern means, in words: a regular expression is no message for a new owner
PATTERN_WORDS = {
    _NAME: f"a name of {_LETTERS}, starting with a letter or digit, at most 63 characters",
    r"^[a-zA-Z0-9._-]{1,15}$": f"an interface name of {_LETTERS}, at most 15 characters",
    r"^[a-zA-Z0-9._-]{1,64}$": f"an HCA name of {_LETTERS}, at most 64 characters",
    r"^[a-z0-9_]+$": "lower-case letters, digits and '_' only",
    r"^[a-z0-9_-]+$": "lower-case letters, digits, '_' and '-' only",
    r"^[^\s]+$": "one word, without spaces",
    r"^https?://[^\s]+$": "an http:// or https:// URL without spaces",
    r"^https?://[^\s'\"]+$": "an http:// or https:// URL without spaces or quotes",
    r"^[0-9]+[bkmgBKMG]?$": "a size such as 64g",
    r"^(/|~/)[^:\n]*$": "an absolute path, or one starting with ~/",
}


def _pattern_words(pattern: str) -> str:
    if pattern in PATTERN_WORDS:
        return PATTERN_WORDS[pattern]
    if pattern.startswith("^/"):
        return "an absolute path of letters, digits, '.', '_', '/' or '-'"
    if pattern.startswith("^[a-z0-9]"):
        return "lower-case letters, digits, '.', '_', '/' or '-', starting with a letter or digit"
    if "\\." in pattern and pattern.startswith("^[0-9]"):
        return "a version such as 0.21.0"
    return "not in the form this field takes (see README's example)"


def _model_in(annotation) -> type[BaseModel] | None:
    """The model a field holds (itself, or inside a list, an Optional, a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (m := _model_in(arg)) is not None:
            return m
    return None


def known_keys(model: type[BaseModel] | None, loc: tuple) -> list[str]:
    """The keys the model takes at `loc` (a pydantic error's location, less the bad key itself)."""
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return []
        model = _model_in(field.annotation)
    return [f.alias or n for n, f in model.model_fields.items() if n != "path"] if model is not None else []


def describe_validation_error(source: str, err: ValidationError, model: type[BaseModel] | None = None) -> list[str]:
    """One line per bad field, never echoing values that could be secrets, nor a regular expression;
    an unknown key with a close known one (`model`'s) names it."""
    import difflib

    lines = []
    for e in err.errors():
        loc = ".".join(str(x) if not isinstance(x, int) else f"[{x}]" for x in e["loc"]).replace(".[", "[")
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            close = difflib.get_close_matches(str(e["loc"][-1]), known_keys(model, e["loc"][:-1]), n=1, cutoff=0.6)
            if close:
                msg += f": did you mean {close[0]!r}?"
        elif e["type"] == "string_pattern_mismatch":
            msg = "expected " + _pattern_words(str((e.get("ctx") or {}).get("pattern", "")))
        lines.append(f"{source}: {loc or '(top level)'}: {msg}")
    return lines


def parse(text: str, source: str = "inventory", path: Path | None = None) -> Inventory:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{source}: not valid TOML: {e}", "fix the syntax at the position shown") from None
    try:
        inv = Inventory.model_validate({**data, "path": path})
    except ValidationError as e:
        lines = describe_validation_error(source, e, Inventory)
        raise InputError(
            f"{source}: {len(lines)} problem(s) in the inventory", "correct the fields listed above", details=lines
        ) from None
    dup = [f"{source}: {line}" for line in inv.duplicates()]
    if dup:
        raise InputError(
            f"{source}: {len(dup)} problem(s) in the inventory", "correct the fields listed above", details=dup
        )
    return inv


def _found_through(explicit: bool) -> str:
    if explicit:
        return "--inventory"
    return f"${ENV_VAR}" if os.environ.get(ENV_VAR) else "the default path"


def load(path: Path | None = None) -> Inventory:
    explicit = path is not None
    path = (path or default_path()).expanduser()
    if not path.is_file():
        raise InputError(
            f"no inventory at {path}" + ("" if explicit else f" ({_found_through(False)})"),
            "pass --inventory PATH, set $SPARKCLUSTER_INVENTORY, or run 'sparkcluster init'",
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise InputError(
            f"cannot read the inventory {path} (from {_found_through(explicit)}): {e.strerror or e}",
            f"make it readable by you (ls -l {path}), or pass --inventory PATH",
        ) from None
    except UnicodeDecodeError as e:
        raise InputError(
            f"{path}: not UTF-8 text (byte {e.start}); TOML files are UTF-8",
            f"save it as UTF-8 (iconv -f LATIN1 -t UTF-8 {path})",
        ) from None
    return parse(text, source=str(path), path=path.resolve())
