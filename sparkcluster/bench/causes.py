"""Why a run falls short of its record: the likely causes, ranked by a stated rule from what the
cluster knows. Pure: fed the cluster's facts (`ClusterView`) and the record.

The rule. Only a fact that is wrong on its own (the fabric, the MTU, the twins) or that differs from
what the record ran with (image, vLLM, driver, model revision, kernel) is a cause. Causes are ranked
by class, most likely first, because of how much speed each has been seen to cost on Sparks:

1. fabric (multi-node only): the engine's NCCL on TCP sockets while the nodes have RoCE links (seed 002:
   silent, and every decode step pays for it); the round trip between the ranks above
   `RTT_SLOW_MS` (a direct QSFP link answers in tens of microseconds; tensor parallelism crosses it
   twice per layer per decode step, so a millisecond more is most of a step), or above
   `RTT_LOADED_SLOW_MS` while the benchmark runs (the link queues the ranks' traffic); the fabric test's bus
   bandwidth below its floor (fabric/judge.py's figures).
2. mtu: a data-plane netdev below the inventory's MTU (field notes: 1500 on the QSFP links halves NCCL's
   throughput).
3. twins (multi-node only): a node whose `NCCL_IB_HCA` names one HCA of its port, so NCCL uses half of
   it (NVIDIA's two-Spark recipes: "use both twins"), against a published record or beside a node with two.
4. memory (issue 52): a node whose MemTotal is of another memory size than the record's hosts (a 64 GB
   Spark against a 128 GB one's record, or the reverse; node/memory_fit.same_size), where the record
   says its size: another KV cache, so not like for like. A hardware fact, so before the software.
5. image: another image than the record's (its registry digest, else its name).
6. vllm: another vLLM version.
7. driver: another NVIDIA driver than the record's.
8. model: another revision of the weights.
9. kernel: another kernel, where the record names one.
10. prompts (issue 58): this run sent other prompts than the record's (random tokens against
   nvidia/SPEED-Bench). Last for a profile without speculative decoding (prompts of the same lengths
   cost the same compute, to first order); FIRST for a speculative one, whose decode speed is its
   drafts' acceptance, which the text decides (bench/prompts.py: vllm#33497).

Within a class, the nodes go in inventory order. The same list is returned whether or not the run fell
short; the caller shows it when it did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkcluster.bench import prompts
from sparkcluster.bench.perf_record import PerfRecord
from sparkcluster.node import memory_fit

RTT_SLOW_MS = 1.0
# under the benchmark's own load: a few ms of scheduling on a busy host is noise, more is a queueing link
RTT_LOADED_SLOW_MS = 5.0
CLASSES = ("fabric", "mtu", "twins", "memory", "image", "vllm", "driver", "model", "kernel", "prompts")


@dataclass(frozen=True)
class NodeView:
    name: str
    kernel: str = ""
    driver: str = ""
    mtu_expected: int | None = None
    mtus: dict[str, int] = field(default_factory=dict)  # data-plane netdev -> MTU seen on it
    hcas: tuple[str, ...] = ()  # NCCL_IB_HCA, from the inventory
    nccl_transport: str = ""  # what the engine's NCCL chose here (fabric/engine_nccl's summary), "" unknown
    rtt_ms: float | None = None  # from the head to this node's control IP (the ranks' path); None: the head
    rtt_error: str = ""  # why no round trip was measured (no answer at all is the worst case)
    rtt_loaded_ms: float | None = None  # the same, measured while the benchmark ran
    mem_total: int | None = None  # MemTotal in bytes (bench's node facts), None unread


@dataclass(frozen=True)
class ClusterView:
    nodes: tuple[NodeView, ...]
    roce: bool = False  # the inventory has RoCE data-plane links between its nodes
    image: str = ""  # the base image the profile serves (the cluster's own adds only Ray on top)
    image_digests: tuple[str, ...] = ()  # the head image's registry digests (sha256:...)
    vllm_version: str = ""
    model_revision: str = ""
    fabric_busbw_gbps: float | None = None  # the latest fabric test's largest all_gather, when known
    fabric_floor_gbps: float | None = None


@dataclass(frozen=True)
class Cause:
    area: str  # one of CLASSES
    node: str | None
    says: str
    fix: str

    def line(self) -> str:
        where = f"{self.node}: " if self.node else ""
        return f"[{self.area}] {where}{self.says} -- fix: {self.fix}"


def rank(view: ClusterView, record: PerfRecord, ours: PerfRecord | None = None) -> list[Cause]:
    """Every cause the facts support, most likely first (the module's rule). `ours`: this run's
    record (its prompts and whether it decodes speculatively)."""
    found: list[Cause] = []
    multi = len(view.nodes) > 1
    if multi:
        found += _fabric(view)
        found += _twins(view, record)
    found += _mtu(view)
    found += _memory(view, record)
    found += _software(view, record)
    found += _prompts(ours, record)
    order = {c: i for i, c in enumerate(CLASSES)}
    if ours is not None and ours.software.speculative:
        order["prompts"] = -1  # a speculative profile: the prompts decide its decode speed
    names = [n.name for n in view.nodes]
    return sorted(found, key=lambda c: (order[c.area], names.index(c.node) if c.node in names else -1))


def _fabric(view: ClusterView) -> list[Cause]:
    out = []
    for n in view.nodes:
        if view.roce and n.nccl_transport.startswith("NET/Socket"):
            out.append(
                Cause(
                    "fabric",
                    n.name,
                    f"the engine's NCCL runs over TCP sockets ({n.nccl_transport}) while the nodes have RoCE links",
                    "sparkcluster doctor --fabric names why (HCAs, GID index, /dev/infiniband in the container)",
                )
            )
        if n.rtt_ms is not None and n.rtt_ms > RTT_SLOW_MS:
            out.append(
                Cause(
                    "fabric",
                    n.name,
                    f"the round trip between the ranks (head to {n.name}) takes {n.rtt_ms:.2f} ms, above "
                    f"{RTT_SLOW_MS:g} ms: every decode step waits on it",
                    "check the link between the nodes (a queueing discipline, a switch in between, a busy link); "
                    "sparkcluster doctor --fabric measures it",
                )
            )
        elif n.rtt_loaded_ms is not None and n.rtt_loaded_ms > RTT_LOADED_SLOW_MS:
            idle = f", {n.rtt_ms:.2f} ms idle" if n.rtt_ms is not None else ""
            out.append(
                Cause(
                    "fabric",
                    n.name,
                    f"under the benchmark's load the round trip between the ranks (head to {n.name}) rose to "
                    f"{n.rtt_loaded_ms:.2f} ms{idle}: the link queues the ranks' traffic (a slow or shaped link)",
                    "check the link's speed and any queueing discipline on it; sparkcluster doctor --fabric "
                    "measures its bandwidth",
                )
            )
        elif n.rtt_error:
            out.append(
                Cause(
                    "fabric",
                    n.name,
                    f"the head gets no answer from {n.name}'s control address: {n.rtt_error}",
                    "sparkcluster doctor",
                )
            )
    floor, bw = view.fabric_floor_gbps, view.fabric_busbw_gbps
    if floor is not None and bw is not None and bw < floor:
        out.append(
            Cause(
                "fabric",
                None,
                f"the fabric test's all_gather reached {bw:.2f} GB/s, below its floor of {floor:g} GB/s",
                "sparkcluster doctor --fabric (transport, direction and per-node verdicts)",
            )
        )
    return out


def _mtu(view: ClusterView) -> list[Cause]:
    out = []
    for n in view.nodes:
        if n.mtu_expected is None:
            continue
        low = {nd: m for nd, m in sorted(n.mtus.items()) if m < n.mtu_expected}
        if low:
            seen = ", ".join(f"{nd} {m}" for nd, m in low.items())
            out.append(
                Cause(
                    "mtu",
                    n.name,
                    f"data-plane MTU below the inventory's {n.mtu_expected}: {seen}",
                    f"set MTU {n.mtu_expected} on those links (sparkcluster doctor's net.mtu says how)",
                )
            )
    return out


def _memory(view: ClusterView, record: PerfRecord) -> list[Cause]:
    theirs = record.hardware.memory_known
    if theirs is None:  # the record does not say: never assumed
        return []
    out = []
    for n in view.nodes:
        if n.mem_total and not memory_fit.same_size({"here": n.mem_total / memory_fit.GB, "record": theirs}):
            out.append(
                Cause(
                    "memory",
                    n.name,
                    f"MemTotal {memory_fit.gb(n.mem_total)} here, the record's hosts {theirs:g} GB: another memory "
                    "size holds another KV cache, so the record is not like for like",
                    "compare with a record measured on Sparks of this memory size, or keep a baseline of your own "
                    "(sparkcluster bench --keep-baseline)",
                )
            )
    return out


def _prompts(ours: PerfRecord | None, record: PerfRecord) -> list[Cause]:
    if ours is None:
        return []
    seen = set()
    for run in record.runs:
        mine = ours.run_at(run.conditions.key)
        if mine is None:
            continue
        a, b = prompts.said(mine.conditions), prompts.said(run.conditions)
        if a != b:
            seen.add((a, b))
    out = []
    for a, b in sorted(seen):
        spec = ours.software.speculative
        says = f"this run sent {a} prompts, the record {b}'s"
        if spec:
            says += f": this profile decodes speculatively ({spec}), and {prompts.WHY_RANDOM}"
        out.append(
            Cause(
                "prompts",
                None,
                says,
                f"prepare {prompts.SPEED_BENCH} ({prompts.PREPARE_HINT}) and measure again "
                "(a speculative profile is then measured on it where the image's vLLM has --dataset-name speed_bench)"
                if b.startswith(prompts.SPEED_BENCH)
                else "measure with the record's harness and dataset",
            )
        )
    return out


def _twins(view: ClusterView, record: PerfRecord) -> list[Cause]:
    # one HCA is wrong against a published record (its recipes use both twins) or beside a node with two
    both = record.kind == "published" or any(len(n.hcas) > 1 for n in view.nodes)
    out = []
    for n in view.nodes:
        if both and len(n.hcas) == 1:
            out.append(
                Cause(
                    "twins",
                    n.name,
                    f"NCCL_IB_HCA names one HCA ({n.hcas[0]}): NCCL uses half of the port "
                    "(NVIDIA's two-Spark recipes use both twins)",
                    "list both twins of the cabled port in the inventory's data_plane (sparkcluster init finds them)",
                )
            )
    return out


def _software(view: ClusterView, record: PerfRecord) -> list[Cause]:
    sw = record.software
    out = []
    if sw.image_digest and view.image_digests:
        if sw.image_digest not in view.image_digests:
            out.append(
                Cause(
                    "image",
                    None,
                    f"the image differs from the record's ({sw.image or 'image'} {sw.image_digest[:19]}...; "
                    f"here {view.image or 'the head image'})",
                    f"pull the record's image by digest ({sw.image_digest}) and serve it",
                )
            )
    elif sw.image and view.image and not _same_image(sw.image, view.image):
        out.append(
            Cause(
                "image",
                None,
                f"another image than the record's: {view.image} here, {sw.image} there",
                "serve the record's image (profile's [image])",
            )
        )
    if sw.backend_version and view.vllm_version and _ver(sw.backend_version) != _ver(view.vllm_version):
        out.append(
            Cause(
                "vllm",
                None,
                f"vLLM {view.vllm_version} here, {sw.backend_version} in the record",
                "serve the vLLM the record names (image.vllm_version)",
            )
        )
    if sw.driver:
        for n in view.nodes:
            if n.driver and n.driver != sw.driver:
                out.append(
                    Cause(
                        "driver",
                        n.name,
                        f"NVIDIA driver {n.driver}, the record's {sw.driver}",
                        "install the record's driver, or measure a record of your own",
                    )
                )
    if sw.model_revision and view.model_revision and view.model_revision != sw.model_revision:
        out.append(
            Cause(
                "model",
                None,
                f"weights revision {view.model_revision[:12]} here, {sw.model_revision[:12]} in the record",
                f"set revision = {sw.model_revision!r} in the profile",
            )
        )
    if sw.kernel:
        kernels = {k.strip() for k in sw.kernel.split(",")}
        for n in view.nodes:
            if n.kernel and n.kernel not in kernels:
                out.append(
                    Cause("kernel", n.name, f"kernel {n.kernel}, the record's {sw.kernel}", "boot the record's kernel")
                )
    return out


def _same_image(a: str, b: str) -> bool:
    return a.split("@")[0].strip() == b.split("@")[0].strip()


def _ver(v: str) -> str:
    return v.strip().lstrip("v")


def parse_mtus(text: str) -> dict[str, int]:
    """`mtus=` of bench's node facts (runner.NODE_FACTS): 'lo:65536,enp1s0f1np1:9000,' -> {netdev: MTU}."""
    out = {}
    for part in (text or "").split(","):
        nd, sep, m = part.partition(":")
        if sep and m.strip().isdigit():
            out[nd.strip()] = int(m)
    return out


def view_from(
    inv,
    nodes: list[str],
    facts: dict[str, dict],
    rtts: dict[str, tuple[float | None, str]],
    transports: dict[str, str],
    *,
    loaded_rtts: dict[str, tuple[float | None, str]] | None = None,
    image: str = "",
    image_digests: tuple[str, ...] = (),
    vllm_version: str = "",
    model_revision: str = "",
) -> ClusterView:
    """The view `rank` reads, from the inventory and what bench gathered (runner.node_facts, rank_rtts,
    engine_nccl_texts summarised, the head image's digests)."""
    out = []
    for name in nodes:
        node = inv.node(name)
        f = facts.get(name, {})
        gpu = [p.strip() for p in (f.get("gpu") or "").split(",")]
        mtus = parse_mtus(f.get("mtus", ""))
        rtt, why = rtts.get(name, (None, ""))
        kb = str(f.get("mem_total_kb", "")).strip()
        out.append(
            NodeView(
                name,
                kernel=f.get("kernel", ""),
                driver=gpu[1] if len(gpu) > 1 else "",
                mtu_expected=node.mtu,
                mtus={nd: mtus[nd] for nd in node.netdevs if nd in mtus},
                hcas=tuple(node.hcas),
                nccl_transport=transports.get(name, ""),
                rtt_ms=rtt,
                rtt_error=why,
                rtt_loaded_ms=(loaded_rtts or {}).get(name, (None, ""))[0],
                mem_total=int(kb) * 1024 if kb.isdigit() and int(kb) > 0 else None,
            )
        )
    return ClusterView(
        nodes=tuple(out),
        roce=len(out) > 1 and all(n.hcas for n in out),
        image=image,
        image_digests=image_digests,
        vllm_version=vllm_version,
        model_revision=model_revision,
    )
