"""What the engine's own log says about its ranks while it starts and once it serves (issue 59): the
all-reduce backend each rank chose, and the warm-up phase each rank is in.

Why from the log: both are choices the engine makes at run time and reports nowhere else. vLLM names
the all-reduce backends of each process group per rank (`cuda_communicator.py`: "Using ['PYNCCL']
all-reduce backends (in dispatch order) for group 'tp:0' out of potential backends: [...]", the
line vllm-project/vllm PR #42993 added; a real one per arm in local-inference-lab/b12x
docs/evidence/rocenante/serving-ab-20261001-3spark-ring/; owners' notes quote it shortened, "Using
['PYNCCL'] all-reduce backends for group 'tp:0'", and a saved log can cut it off), and b12x's RoCEnante shim
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

# a process's prefix, `(Worker_TP1 pid=656)`, `(RayWorkerWrapper pid=242, ip=198.19.2.2)`; Ray forwards
# a worker's lines through its driver, so one line may carry several, outermost first ("(EngineCore
# pid=29087) (RayWorkerProc pid=29271) (Worker pid=29271) INFO ...", ray-project/ray PR #65486)
ONE = re.compile(r"\((?P<proc>[A-Za-z][\w:.\-]*) pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9A-Fa-f.:]+))?\)[ \t]*")
# a prefix inside a line, where another writer's output was cut off before it ("ahazidgx1:205:386 [0]
# NCCL I(Worker pid=205) INFO ...": local-inference-lab/b12x docs/evidence/rocenante/
# serving-ab-20261001-3spark-ring/roce-startup.txt)
INSIDE = re.compile(ONE.pattern + r"(?=(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) )")
# a prefix that ends a line belongs to the next: a progress bar on stderr is printed as the prefix, a
# newline, then the bar ("(Worker_TP0 pid=2500801) \nCapturing CUDA graphs (decode, FULL): ...",
# vllm-project/vllm PR #46389), and a bar's last redraw can carry the next rank's prefix at its end
# ("... 0/22 [00:00<?, ?profiles/s](Worker_TP2_EP2 pid=643)", vllm-project/vllm#57423)
TRAIL = re.compile(ONE.pattern + r"$")
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
# is in it (the last such line of a rank decides). Sources, each line as published:
# tests/captured/vllm-0.32-*.log ("Starting to load model", "Starting torch.compile", "Warming up
# done"; vLLM 0.32); vllm-project/vllm#38820 and noonghunna/club-3090#552 ("Loading safetensors
# checkpoint shards", "Loading weights took", "Model loading took"); hiyouga/EasyR1#69 (vLLM 0.7's
# "Loading model weights took", "Memory profiling takes"); ray-project/ray PR #65486 and
# noonghunna/club-3090#127 ("Available KV cache memory"); vllm-project/vllm#57423 ("Running FlashInfer
# autotune with 16384 tokens and token buckets (...)", FlashInfer's "[Autotuner]: Autotuning process
# starts ..." and its progress bar "[AutoTuner]: Tuning trtllm::fused_moe::gemm1: ..."); vllm-project/
# vllm PR #46389 and #27521 ("Capturing CUDA graphs (decode, FULL): ..."); vLLM's gpu_model_runner
# ("Graph capturing finished in %.0f secs", the string vllm-project/vllm PR #10027 added; no published
# capture of it was found) and core.py ("init engine (profile, create kv cache, warmup model) took",
# tests/captured/vllm-0.32-*.log).
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "weights",
        (
            "Starting to load model",
            "Loading safetensors checkpoint shards",
            "Loading weights took",
            "Loading model weights took",
        ),
    ),
    ("compile", ("Model loading took", "Starting torch.compile", "torch.compile took")),
    ("profiling", ("Available KV cache memory", "Memory profiling takes", "determine_available_memory")),
    ("autotuning", ("Running FlashInfer autotune", "[AutoTuner]: Tuning", "[Autotuner]: Autotuning process starts")),
    ("graph capture", ("Capturing CUDA graph", "Graph capturing finished")),
    ("ready", ("Warming up done", "init engine (profile, create kv cache, warmup model) took")),
)
ORDER = {name: i for i, (name, _) in enumerate(PHASES)}
# the grep that picks the lines either reader wants (node/container_status), as an ERE
# (and a line that ends with a prefix: the next line's rank, TRAIL)
WANTED = (
    "all-reduce backends|RoCEnante disabled|"
    + "|".join(re.escape(p).replace("\\ ", " ") for _, pats in PHASES for p in pats)
    + r"|\([A-Za-z][^ ()]* pid=[0-9]+(, ip=[^)]*)?\) *$"
)


def _chain(line: str, pos: int) -> tuple[list[re.Match], int]:
    found = []
    while m := ONE.match(line, pos):
        found.append(m)
        pos = m.end()
    return found, pos


def _split(line: str) -> tuple[list[re.Match], str, re.Match | None]:
    """(the prefixes the line's message carries, outermost first; the message; the prefix the line
    ends with, which is the next line's)."""
    found, end = _chain(line, 0)
    if not found and (m := INSIDE.search(line)):
        found, end = _chain(line, m.start())
    msg = line[end:]
    trail = TRAIL.search(msg)
    return found, (msg[: trail.start()] if trail else msg), trail


def ranked(text: str, node: str = "") -> list[tuple[str, str, bool]]:
    """One node's lines as (the rank's name, the message, whether a prefix named the rank), the engine
    core's and API server's lines left out. A rank is its process ID (and IP under Ray), named by the
    longest process name it printed under: vLLM renames a worker once its rank is known ("(Worker
    pid=42)", then "(Worker_TP0 pid=42)": noonghunna/club-3090#552 and the vLLM logs quoted below). A line
    no prefix names belongs to the node's own process (one rank per node under `mp`)."""
    rows: list[tuple[tuple[str, str] | None, str]] = []
    names: dict[tuple[str, str], str] = {}
    pending = None  # the prefix the previous line ended with
    for line in text.splitlines():
        found, msg, trail = _split(line)
        if found and not msg.strip():  # the prefix alone: the next line is its rank's
            pending = found[-1]
            continue
        m = found[-1] if found else pending
        pending = trail
        if m is None:
            rows.append((None, msg))
            continue
        if m.group("proc").startswith(NOT_RANKS):
            continue
        ip = next((x.group("ip") for x in reversed(found) if x.group("ip")), m.group("ip") or "")
        key = (m.group("pid"), ip)
        if len(m.group("proc")) > len(names.get(key, "")):
            names[key] = m.group("proc")
        rows.append((key, msg))
    out = []
    for key, msg in rows:
        if key is None:
            out.append((node or "this node", msg, False))
            continue
        name = f"{names[key]} pid={key[0]}" + (f" ip={key[1]}" if key[1] else "")
        out.append(((f"{node}: {name}" if node else name), msg, True))
    return out


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
        for rank, msg, _ in ranked(text, node if len(texts) > 1 else ""):
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
        for rank, msg, named in ranked(text, node if len(texts) > 1 else ""):
            for name, pats in PHASES:
                if any(p in msg for p in pats):
                    if named:
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
