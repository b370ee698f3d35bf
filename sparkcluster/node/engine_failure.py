"""Why an engine stopped, read from its server log: the first failure, not the last lines (issue 62).

A vLLM that dies prints its cause first and shutdown noise after ("MPClient: stopping engine manager",
"force killing remaining processes"), so the last lines of its log say nothing. `read` keeps the
lines that report a failure (a Python traceback's exception line, `ERROR` and `Fatal` lines, signals,
CUDA and NCCL errors, the kernel's OOM kill) in the order they were written, with the process that
wrote each (Ray forwards a worker rank's lines prefixed "(RayWorkerWrapper pid=…, ip=…)",
vllm-project/vllm#15598; vLLM's own processes "(EngineCore pid=…)", wtdcode/vllm-backport#24), and
leaves the traceback frames and the shutdown noise out. `cause` maps the first failure to one known
cause and its fix, as the known-bad list does for versions.

Standard library only: the supervisor on a node reads its own server's log with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# "(RayWorkerWrapper pid=206994, ip=192.168.10.25) " / "(EngineCore pid=162129) " / "(raylet) ": Ray colours
# the prefix with ANSI codes (tests/captured/vllm-0.32-ray-worker-sigill.log), taken off first
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROC = re.compile(
    r"^\((?P<proc>[A-Za-z_][\w]*(?: rank=\d+)?)(?: pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9a-fA-F.:]+))?)?\)\s?"
)
# Ray's own report of a dead worker names its address in the text
_WORKER_IP = re.compile(r"Worker IP address: ([0-9a-fA-F.:]+)")
# vLLM's log prefix: "ERROR 03-27 10:29:13 [worker_base.py:620] " (level, month-day, time, file:line)
_LEVEL = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? \[[^\]]*\] "
)
# a traceback's last line: "RuntimeError: …", "torch.OutOfMemoryError: …", "ncclInternalError: …"
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt)\b(?::|$)")
FAILURE = re.compile(
    r"Fatal Python error|Illegal instruction|Segmentation fault|Bus error|core dumped"
    r"|\bSIG(?:ILL|SEGV|BUS|ABRT|KILL)\b|killed by signal|died unexpectedly|exit code:? -?\d+"
    r"|CUDA error|out of memory|OutOfMemoryError|no kernel image is available"
    r"|driver version is insufficient|NVIDIA driver on your system is too old"
    r"|NCCL error|NCCL WARN|ncclInternalError|ncclSystemError|ncclUnhandledCudaError"
    r"|Killed process \d+|oom-kill",
    re.IGNORECASE,
)
# what a dying engine prints after its cause: never the cause itself
NOISE = re.compile(
    r"stopping engine manager|force killing|shutting down|shutdown|terminat(?:e|ing|ed)|waiting for worker exit"
    r"|^Process \w+:$|^Traceback \(most recent call last\):$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Line:
    text: str  # the failure as written, without the process and log prefixes
    proc: str = ""  # the process that wrote it ("RayWorkerWrapper pid=206994"), "" for the server itself
    ip: str = ""  # the address Ray gave for it, where it did
    ts: str = ""  # vLLM's "MM-DD HH:MM:SS", where the line carries it


@dataclass(frozen=True)
class Cause:
    id: str
    what: str
    fix: str
    source: str


# Known causes, each with the text that shows it and one fix (issue 62). The first that matches the
# first failure line names it; the others are still shown as lines.
CAUSES: tuple[tuple[re.Pattern, Cause], ...] = (
    (
        re.compile(r"Illegal instruction|SIGILL", re.IGNORECASE),
        Cause(
            "illegal-instruction",
            "a rank ran an instruction this CPU does not have (SIGILL)",
            "serve an image built for this machine's CPU (on a Spark, the aarch64 NGC image); on an x86 host, "
            "vLLM's CPU kernels use AMX and AVX-512 BF16 where its build found them at install time",
            "issue 62: vLLM's CPU attention kernel (cpu_attention::AttentionMainLoop) on a host with amx_tile "
            "but not amx_bf16",
        ),
    ),
    (
        re.compile(r"no kernel image is available for execution on the device", re.IGNORECASE),
        Cause(
            "no-kernel-image",
            "the image has no GPU kernel for this GPU's architecture (GB10 is sm_121)",
            "serve an image built for sm_121 (NVIDIA's NGC vLLM images for DGX Spark), or drop the "
            "quantization or kernel option that needs the missing kernel",
            "vllm-project/vllm#30855 (GB10: torch.AcceleratorError: CUDA error: no kernel image is available)",
        ),
    ),
    (
        re.compile(r"the provided PTX was compiled with an unsupported toolchain|cudaErrorUnsupportedPtxVersion"),
        Cause(
            "ptx-toolchain",
            "a kernel's PTX came from a newer CUDA toolchain than the driver that loaded it can JIT-compile "
            "(cudaErrorUnsupportedPtxVersion): the engine ran on the host's driver (580 runs CUDA 13.0) rather "
            "than the image's forward-compatibility one, or the image was built with a newer nvcc than that driver",
            "start the image through its own entrypoint (an NGC image's /opt/nvidia/nvidia_entrypoint.sh puts its "
            "forward-compatibility driver first; a container whose entrypoint is replaced runs on the host's), or "
            "serve an image built for the node driver's CUDA; `sparkcluster doctor` (image.driver) compares the two",
            "gyliu513/langX101:llm-d/llm-d-spark-full-demo/README.md@07d311ff (NGC vllm:26.08-py3, CUDA 13.4, on "
            "driver 580.173.02 with the entrypoint replaced: gone once it was kept); vllm-project/vllm#47397 (GB10, "
            "a source build with nvcc 13.3 on driver 580.159.03)",
        ),
    ),
    (
        re.compile(r"driver version is insufficient for CUDA runtime version|NVIDIA driver on your system is too old"),
        Cause(
            "driver-too-old",
            "the image's CUDA runtime needs a newer driver than the one the engine loaded (CUDA error 35)",
            "serve an image built for the node driver's CUDA, keep an NGC image's entrypoint so that its "
            "forward-compatibility driver is the one loaded, or update the driver; `sparkcluster doctor` "
            "(image.driver) says what the image needs",
            'nagadomi/nunif#702 and SYSTRAN/faster-whisper#1278 ("CUDA driver version is insufficient for CUDA '
            'runtime version"), lllyasviel/Fooocus#1313 (PyTorch\'s "The NVIDIA driver on your system is too '
            'old"): none of them on a Spark',
        ),
    ),
    (
        re.compile(r"out of memory|OutOfMemoryError|Killed process \d+|oom-kill", re.IGNORECASE),
        Cause(
            "out-of-memory",
            "a rank ran out of memory (on GB10 the GPU's memory is the host's)",
            "lower gpu_memory_utilization or max_model_len in the profile, or spread the model over more "
            "Sparks; `sparkcluster doctor` shows each node's memory",
            "vllm-project/vllm#15598, wtdcode/vllm-backport#24 (torch.OutOfMemoryError: CUDA out of memory)",
        ),
    ),
    (
        re.compile(r"NCCL error|NCCL WARN|ncclInternalError|ncclSystemError|ncclUnhandledCudaError"),
        Cause(
            "nccl-init",
            "NCCL failed between the ranks",
            "run `sparkcluster doctor --fabric`: it names the node, the HCA and the GID NCCL could not use",
            "tests/captured/nccl/published-modify-qp-61-spark-pair.txt (ibv_modify_qp failed, then "
            "NCCL error: unhandled system error)",
        ),
    ),
)


@dataclass(frozen=True)
class Failure:
    lines: tuple[Line, ...]  # every failure line kept, in the order written, capped

    @property
    def first(self) -> Line:
        """The first line that shows a known cause, else the first line: what a dying rank says of itself
        (SIGILL, CUDA out of memory) outranks what its peers then say of its death (Ray's "a worker died",
        which Ray may forward before the rank's own lines)."""
        return next((ln for ln in self.lines if _known(ln.text)), self.lines[0])

    def cause(self) -> Cause | None:
        """The known cause of the first failure that has one."""
        return _known(self.first.text)

    def render(self, where=lambda ln: ln.proc) -> str:
        """The lines, each after the process (or node) that wrote it."""
        return "\n".join(f"[{where(ln)}] {ln.text}" if where(ln) else ln.text for ln in self.lines)


def _known(text: str) -> Cause | None:
    return next((cause for pattern, cause in CAUSES if pattern.search(text)), None)


def _split(raw: str) -> tuple[str, str, str, str, str]:
    """(process, ip, level, timestamp, message) of one log line."""
    proc = ip = level = ts = ""
    raw = _ANSI.sub("", raw)
    m = _PROC.match(raw)
    if m:
        proc = m.group("proc") + (f" pid={m.group('pid')}" if m.group("pid") else "")
        ip = m.group("ip") or ""
        raw = raw[m.end() :]
    if not ip and (w := _WORKER_IP.search(raw)):
        ip = w.group(1)
    m = _LEVEL.match(raw)
    if m:
        level, ts = m.group("level"), m.group("ts")
        raw = raw[m.end() :]
    return proc, ip, level, ts, raw


def read(text: str, limit: int = 12) -> Failure | None:
    """The failure lines of a server log (None when it reports none), at most `limit` of them, the
    first failure always first."""
    out: list[Line] = []
    seen: set[tuple[str, str]] = set()
    for raw in text.splitlines():
        proc, ip, level, ts, msg = _split(raw.rstrip())
        body = msg.strip()
        if not body or msg[:1].isspace() or body.startswith(("File ", "^", "~")):
            continue  # a traceback frame, its source line or its markers
        # a failure's own words are kept whatever else the line says ("…, shutting down executor");
        # an ERROR line that says none is kept unless it is the shutdown's
        if not (FAILURE.search(body) or _EXCEPTION.match(body)):
            if level not in ("ERROR", "CRITICAL") or NOISE.search(body):
                continue
        key = (proc.split(" pid=")[0], body)
        if key in seen:  # every rank of one kind saying the same thing: once
            continue
        seen.add(key)
        out.append(Line(body, proc, ip, ts))
        if len(out) >= limit:
            break
    return Failure(tuple(out)) if out else None
