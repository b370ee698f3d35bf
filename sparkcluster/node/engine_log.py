"""What the engine's own log says about its ranks while it starts and once it serves (issue 59): the
all-reduce backend each rank chose, and the warm-up phase each rank is in.

Why from the log: both are choices the engine makes at run time and reports nowhere else. vLLM names
the all-reduce backends of each process group per rank (`cuda_communicator.py`: "Using ['PYNCCL']
all-reduce backends (in dispatch order) for group 'tp:0' out of potential backends: [...]"; older
builds print "Using ['PYNCCL'] all-reduce backends for group 'tp:0'"), and b12x's RoCEnante shim
(local-inference-lab/vllm PR #597, backend `B12X_ROCENANTE`, on with VLLM_ENABLE_ROCE_ALLREDUCE=1)
says when it stood down on every rank ("RoCEnante disabled on every rank: <why>"), after which the
ranks run PYNCCL silently. The warm-up phases are the lines vLLM prints as a rank loads its weights,
compiles, sizes its KV cache, autotunes FlashInfer's kernels and captures CUDA graphs; a rank left
behind in one of them for long is what a 1800 s gloo barrier later kills (getainode/ainode#134).

Each line of a rank carries its process's prefix: `(Worker_TP1 pid=656)` under `mp`,
`(RayWorkerWrapper pid=242, ip=198.19.2.2)` for a Ray worker forwarded into the head's log. A line
without one belongs to the node's own process (one rank per node under `mp`).

Standard library only: the supervisor reads its node's log with it (node/), and the controller the
lines `status` and `up` read from every container (node/container_status)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# written to the serve log before every start (supervisor, ranks): what follows is this start's
SERVE_MARK = "sparkcluster: vllm serve started"

PREFIX = re.compile(r"^\((?P<proc>[A-Za-z][\w]*) pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9A-Fa-f.:]+))?\)\s*")
# not ranks: the engine core and the API server print the cluster's lines, not one rank's
NOT_RANKS = ("EngineCore", "APIServer")
BACKENDS = re.compile(
    r"Using \[(?P<using>[^\]]*)\] all-reduce backends(?: \(in dispatch order\))? for (?:group )?'(?P<group>[^']+)'"
    r"(?: out of potential backends: \[(?P<potential>[^\]]*)\])?"
)
ROCE_OFF = re.compile(r"RoCEnante disabled on every rank: (?P<why>.+?)\s*$")
ROCE_BACKEND = "B12X_ROCENANTE"  # the shim's backend_name (local-inference-lab/vllm PR #597)
# the variables that ask the engine for a backend other than NCCL, and the backend each asks for
ASKS = {"VLLM_ENABLE_ROCE_ALLREDUCE": ROCE_BACKEND}

# The warm-up phases, in the order a rank goes through them, each with the vLLM lines that say a rank
# is in it (the last such line of a rank decides). Sources: tests/captured/vllm-0.32-*.log
# ("Starting to load model", "Starting torch.compile", "Warming up done"; vLLM 0.32), vLLM's
# gpu_model_runner/gpu_worker ("Loading weights took", "Model loading took", "Available KV cache
# memory", "Graph capturing finished"; vllm-0.32-compile-miss.log quotes "Model loading took"),
# vLLM's kernel_warmup ("Running FlashInfer autotune with %d tokens.") and FlashInfer's progress bar
# ("[AutoTuner]: Tuning flashinfer::...", quoted in vllm-project/vllm PR #54794).
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("weights", ("Starting to load model", "Loading safetensors checkpoint shards", "Loading weights took")),
    ("compile", ("Model loading took", "Starting torch.compile", "torch.compile took")),
    ("profiling", ("Available KV cache memory", "Memory profiling takes", "determine_available_memory")),
    ("autotuning", ("Running FlashInfer autotune", "[AutoTuner]: Tuning")),
    ("graph capture", ("Capturing CUDA graph", "Graph capturing finished")),
    ("ready", ("Warming up done", "init engine (profile, create kv cache, warmup model) took")),
)
ORDER = {name: i for i, (name, _) in enumerate(PHASES)}
# the grep that picks the lines either reader wants (node/container_status), as an ERE
WANTED = "all-reduce backends|RoCEnante disabled|" + "|".join(
    re.escape(p).replace("\\ ", " ") for _, pats in PHASES for p in pats
)


def rank_of(line: str, node: str = "") -> tuple[str, str] | None:
    """(the rank's name, the line without its prefix); None for the engine core's and API server's
    lines. A rank is named by its process and PID (and IP under Ray); a line without a prefix by its
    node alone."""
    m = PREFIX.match(line)
    if not m:
        return node or "this node", line
    if m.group("proc").startswith(NOT_RANKS):
        return None
    name = f"{m.group('proc')} pid={m.group('pid')}" + (f" ip={m.group('ip')}" if m.group("ip") else "")
    return (f"{node}: {name}" if node else name), line[m.end() :]


def _names(listing: str | None) -> tuple[str, ...]:
    return tuple(x.strip().strip("'\"") for x in (listing or "").split(",") if x.strip())


@dataclass
class AllReduce:
    """What one start's ranks said about their all-reduce backends: rank -> group -> the backends in
    dispatch order, and why RoCEnante stood down where it did."""

    using: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    potential: tuple[str, ...] = ()
    roce_off: list[str] = field(default_factory=list)

    def reported(self) -> bool:
        return bool(self.using or self.roce_off)

    def serving(self, group: str = "tp:0") -> str:
        """The backend that serves the group's small all-reduces: the first in dispatch order, where
        every rank agrees ("" where none said; several joined by " / " where they disagree)."""
        firsts = sorted({b[0] for g in self.using.values() for k, b in g.items() if k == group and b})
        return " / ".join(firsts)


def all_reduce(texts: dict[str, str]) -> AllReduce:
    """Every node's serve-log lines (this start's) -> their ranks' all-reduce backends."""
    out = AllReduce()
    for node, text in texts.items():
        for line in text.splitlines():
            got = rank_of(line, node if len(texts) > 1 else "")
            if got is None:
                continue
            rank, msg = got
            m = BACKENDS.search(msg)
            if m:
                out.using.setdefault(rank, {})[m.group("group")] = _names(m.group("using"))
                out.potential = _names(m.group("potential")) or out.potential
                continue
            off = ROCE_OFF.search(msg)
            if off and off.group("why") not in out.roce_off:
                out.roce_off.append(off.group("why"))
    return out


def asked(env: dict[str, str]) -> dict[str, str]:
    """The backends a profile's environment asks for: variable -> backend (VLLM_ENABLE_ROCE_ALLREDUCE=1:
    RoCEnante, local-inference-lab/vllm PR #597)."""
    return {k: b for k, b in ASKS.items() if str(env.get(k, "")).strip().lower() in ("1", "true", "yes", "on")}


def judge_all_reduce(ar: AllReduce, env: dict[str, str], group: str = "tp:0") -> tuple[str, str, str]:
    """(status, what, fix): "unknown" where no rank reported (the CPU engine prints none of these
    lines), "fail" where the profile asks for a backend a rank runs without or where the ranks
    disagree, else "ok". `what` names the backend that serves and each rank's list where it matters."""
    if not ar.reported():
        return "unknown", "not reported (the engine printed no all-reduce backend line)", ""
    lists = {r: g[group] for r, g in ar.using.items() if group in g}
    serving = ar.serving(group) or "none named"
    why = f"; RoCEnante said: {'; '.join(ar.roce_off)}" if ar.roce_off else ""
    for var, backend in asked(env).items():
        without = sorted(r for r, b in lists.items() if backend not in b)
        if without or (ar.roce_off and not lists):
            ranks = ", ".join(f"{r}: {list(lists[r])}" for r in without) or "every rank"
            offered = "" if not ar.potential or backend in ar.potential else f" (not among {list(ar.potential)})"
            return (
                "fail",
                f"the profile sets {var}=1 but {ranks} run without {backend}{offered}{why}",
                f"use an image whose vLLM carries b12x's RoCEnante (local-inference-lab/vllm PR #597, "
                f"b12x PR #295) and fix what RoCEnante named, or remove {var} from the profile's env; "
                "then sparkcluster up",
            )
    if len({b for b in lists.values()}) > 1:
        return (
            "fail",
            f"the ranks disagree on the {group} all-reduce: "
            + "; ".join(f"{r}: {list(b)}" for r, b in sorted(lists.items())),
            "every rank must run the same image and environment: sparkcluster doctor names what differs; "
            "then sparkcluster up",
        )
    return "ok", f"{serving} serves the {group} all-reduce ({len(lists)} rank(s) reported){why}", ""


def phases(texts: dict[str, str]) -> dict[str, str]:
    """Every node's serve-log lines (this start's) -> each rank's warm-up phase now (its last phase
    line decides; a rank that printed none is left out)."""
    out: dict[str, str] = {}
    for node, text in texts.items():
        mine: dict[str, str] = {}
        plain = None  # the last phase of a line without a prefix (FlashInfer's progress bar on stderr)
        for line in text.splitlines():
            got = rank_of(line, node if len(texts) > 1 else "")
            if got is None:
                continue
            rank, msg = got
            for name, pats in PHASES:
                if any(p in msg for p in pats):
                    if PREFIX.match(line):
                        mine[rank], plain = name, None
                    else:
                        plain = (rank, name)
                    break
        if plain is not None:  # the node's one rank, where it has one (mp); else the node itself
            mine[next(iter(mine)) if len(mine) == 1 else plain[0]] = plain[1]
        out.update(mine)
    return out


def drifted(ph: dict[str, str]) -> bool:
    """Whether the ranks are in different phases (ranks that are all ready, or one rank, are not)."""
    return len(set(ph.values())) > 1


def drift_text(ph: dict[str, str]) -> str:
    return "; ".join(f"{r}: {p}" for r, p in sorted(ph.items(), key=lambda x: (ORDER.get(x[1], 99), x[0])))


class DriftClock:
    """How long the ranks have been in different phases, as the reader saw them (pure: `now` given)."""

    def __init__(self):
        self.since: float | None = None
        self.last: dict[str, str] = {}

    def see(self, ph: dict[str, str], now: float) -> float:
        """Seconds the ranks have been apart (0 while together)."""
        self.last = ph
        if not drifted(ph):
            self.since = None
            return 0.0
        if self.since is None:
            self.since = now
        return now - self.since
