"""Host checks: SSH reachability, the GB10 GPU and its driver, the Docker engine and its GPU
runtime, memory headroom and OOM protection, free disk, and clock agreement."""

from __future__ import annotations

from sparkcluster.checks.registry import Context, GiB, Report, check
from sparkcluster.labels import MEMORY_LABEL, PROFILE_LABEL, RESERVED_LABEL
from sparkcluster.node.memory_fit import Fit, gb, headroom, same_size
from sparkcluster.remote import engine_api

MEM_HEADROOM_FLOOR = 6 * GiB  # seed 002's watchdog warns under 6 GB of MemAvailable


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


# --- reachability and GPU -----------------------------------------------------------------------


@check("ssh.reachable", "SSH reachable")
def ssh_reachable(ctx: Context, r: Report) -> None:
    for n in ctx.facts:
        r.ok(n, ctx.facts[n].hostname)
    for n, why in ctx.unreachable.items():
        r.fail(n, why, f"check that {n} is up and `ssh {ctx.inventory.node(n).ssh}` works from this machine")


@check("gpu.gb10", "GPU present, a GB10")
def gpu_gb10(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        if not f.gpus:
            r.fail(
                n,
                f"nvidia-smi found no GPU: {f.gpu_error or 'no output'}",
                "check the NVIDIA driver on this node (nvidia-smi must list the GB10)",
            )
        elif not all("GB10" in g.name for g in f.gpus):
            r.fail(
                n,
                f"GPU is {', '.join(g.name for g in f.gpus)}, not a GB10",
                "sparkcluster targets DGX Spark (GB10); check the inventory points at the Sparks",
            )
        else:
            # memory.total is [N/A] on GB10 (unified memory): expected, not an error
            r.ok(n, f"{f.gpus[0].name}, sm {f.gpus[0].compute_cap}")


def driver_version(v: str) -> tuple[int, ...] | None:
    """`580.95.05` -> (580, 95, 5); None when nvidia-smi printed something else."""
    try:
        return tuple(int(p) for p in v.strip().split("."))
    except ValueError:
        return None


@check("gpu.driver", "NVIDIA driver: at least the profile's minimum; a difference between nodes named")
def gpu_driver(ctx: Context, r: Report) -> None:
    # Owners update their Sparks on different days and nothing in the field requires equal drivers
    # (issue 24): a difference is a WARN naming both versions. Only a minimum the profile states
    # (`min_driver`, e.g. the image's CUDA needs it) makes a node that lacks it FAIL.
    drivers = {n: f.gpus[0].driver for n, f in ctx.facts.items() if f.gpus}
    if not drivers:
        return
    head = ctx.inventory.head.name
    ref = drivers.get(head) or next(iter(drivers.values()))
    need = ctx.expect.min_driver
    for n, d in drivers.items():
        have = driver_version(d)
        if need and (have is None or have < driver_version(need)):
            r.fail(
                n,
                f"driver {d} is older than {need}, the profile's min_driver",
                f"update the NVIDIA driver on {n} to {need} or later and reboot it (or serve an image "
                "built for this driver and lower min_driver)",
            )
        elif d != ref:
            r.warn(
                n,
                f"driver {d} here, {ref} on {head}",
                "nothing requires equal drivers; update the older one when convenient, so both ranks "
                "run the same CUDA stack",
            )
        else:
            r.ok(n, d)


# --- docker -------------------------------------------------------------------------------------


@check("docker.engine", "Docker engine reachable")
def docker_engine(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        if f.docker:
            api = f.docker_api
            if api is None:  # the CLI answered `docker info` but not the version: say what is known
                r.ok(n, f"Docker {f.docker.server_version}")
            elif (speak := engine_api.negotiate(api)) is None:
                r.fail(n, *engine_api.incompatible(n, api))
            else:
                r.ok(n, f"Docker {api.version}, API {api.range()} (sparkcluster speaks {speak})")
        elif "permission denied while trying to connect to the docker" in f.docker_error.lower() and f.account:
            continue  # the engine may be fine: the socket refuses this account (account.docker says so)
        else:
            r.fail(
                n,
                f"docker info failed: {f.docker_error}",
                "start the Docker daemon (systemctl start docker) and make sure this user may use it",
            )


@check("docker.gpu_runtime", "GPU runtime usable by Docker")
def docker_gpu_runtime(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        if not f.docker:
            continue
        if f.gpu_hook or "nvidia" in f.docker.runtimes:
            r.ok(n, f.gpu_hook or "nvidia runtime")
        else:
            r.fail(
                n,
                "neither nvidia-container-runtime-hook nor an nvidia runtime found",
                "install the NVIDIA Container Toolkit (nvidia-container-toolkit) and restart Docker",
            )


# --- memory -------------------------------------------------------------------------------------


@check("mem.headroom", "MemAvailable covers the profile's memory")
def mem_headroom(ctx: Context, r: Report) -> None:
    frac = ctx.expect.gpu_memory_utilization
    for n, f in ctx.facts.items():
        if not f.mem:
            continue
        # already serving: the model's memory is in use, MemAvailable is what is left. Only this
        # deployment's own containers say so: another one beside it (`up --beside`) holds memory of
        # its own, which MemAvailable has already lost, and this one still has to find its share.
        beside = {c.id for c in f.beside}
        running = any(c.running for c in ctx.ours(n) if c.id not in beside)
        if ctx.expect.on_demand and ctx.expect.gpu_memory_utilization is not None:
            # `up` leaves it on standby: its supervisor admits each start against the memory as it is then
            r.ok(n, f"MemAvailable {_gib(f.mem.available)}; on demand: each start is admitted by its supervisor")
            continue
        need, left = headroom(f.mem.total, f.mem.available, frac or 0, running)
        detail = f"MemAvailable {_gib(f.mem.available)}" + (
            f", profile needs {_gib(need)}, leaves {_gib(left)}" if need else ""
        )
        held = holders(f) if left < MEM_HEADROOM_FLOOR else ""
        detail += f"; held by {held}" if held else ""
        if left < 0:
            r.fail(
                n,
                detail,
                "lower gpu_memory_utilization in the profile or free memory on the node "
                "(MemAvailable, not MemFree, is what counts; "
                "drop caches with `sync; echo 3 > /proc/sys/vm/drop_caches`)",
            )
        elif left < MEM_HEADROOM_FLOOR:
            r.warn(
                n,
                detail + " (under the 6 GiB floor)",
                "lower gpu_memory_utilization (0.70-0.80 survives on unified memory) or stop other work on the node",
            )
        else:
            r.ok(n, detail)


HOLDER_MIN = GiB // 2  # a process under half a GiB is not named as a holder
HOLDERS_NAMED = 6


def _claim(labels: dict, total: int) -> int:
    try:
        if labels.get(RESERVED_LABEL):
            return int(float(labels[RESERVED_LABEL]) * 1e9)
        return int(float(labels.get(MEMORY_LABEL) or 0) * total)
    except ValueError:
        return 0


def holders(f) -> str:
    """Who holds the node's memory, largest first, from its largest processes (`f.processes`): a
    deployment of ours by its profile (its container's processes summed), another container by its
    name, any other process by its command and PID. Empty when nothing holds half a GiB."""
    ours = {c.id: f"'{c.labels.get(PROFILE_LABEL, c.name)}' (sparkcluster)" for c in f.ours}
    names = {c.id: f"container {c.name}" for c in f.containers}
    held: dict[str, int] = {}
    for p in f.processes:
        who = ours.get(p.container or "") or names.get(p.container or "") or f"{p.command} (pid {p.pid})"
        held[who] = held.get(who, 0) + p.rss
    # an engine's memory on unified memory is the driver's, not its processes' resident set: ours are
    # counted at least at their claim (the labels `up` gave them), as the admission counts them
    total = f.mem.total if f.mem else 0
    for c in f.ours:
        if not c.running:
            continue
        claim = _claim(c.labels, total)
        who = ours[c.id]
        held[who] = max(held.get(who, 0), claim)
    big = sorted(((v, k) for k, v in held.items() if v >= HOLDER_MIN), reverse=True)[:HOLDERS_NAMED]
    return ", ".join(f"{k} {_gib(v)}" for v, k in big)


@check("mem.fit", "The profile's weights per rank and one sequence of KV cache fit the engine's budget")
def mem_fit(ctx: Context, r: Report) -> None:
    # issue 52: a profile sized for a 128 GB Spark passes mem.headroom on a 64 GB one (MemAvailable
    # covers utilization x MemTotal) and then runs out of memory while loading
    e = ctx.expect
    if e.gpu_memory_utilization is None or not e.weights_source:  # no profile, or its listing not looked up
        return
    for n, f in ctx.facts.items():
        if not f.mem or not f.mem.total:
            continue
        if e.weights_per_rank is None:
            r.skip(n, f"weights per rank unknown: {e.weights_source}")
            continue
        fit = Fit(e.weights_per_rank, e.kv_min, e.gpu_memory_utilization, f.mem.total, f.mem.available)
        detail = f"{fit.arithmetic()} ({e.weights_source})"
        if fit.fits is False:
            r.fail(
                n,
                detail,
                f"serve this model on nodes with more memory (this one has MemTotal {gb(f.mem.total)}), "
                "spread it over more ranks (tensor or pipeline parallel), or pick a smaller checkpoint or "
                "max_model_len; raising gpu_memory_utilization above 0.85 starves the host",
            )
        else:
            r.ok(n, detail)


@check("mem.size", "Nodes of one memory size")
def mem_size(ctx: Context, r: Report) -> None:
    # NVIDIA's vllm-cluster page: "use two Sparks of the same memory size"
    totals = {n: f.mem.total for n, f in ctx.facts.items() if f.mem and f.mem.total}
    if len(totals) < 2:
        return
    if same_size(totals):
        for n, t in totals.items():
            r.ok(n, f"MemTotal {gb(t)}")
        return
    largest = max(totals.values())
    for n, t in totals.items():
        if same_size({"a": t, "b": largest}):
            r.ok(n, f"MemTotal {gb(t)}")
        else:
            r.warn(
                n,
                f"MemTotal {gb(t)} here, {gb(largest)} on another node: every rank gets the same "
                "gpu_memory_utilization, so the smallest node sets what the deployment can hold",
                "pair Sparks of the same memory size (NVIDIA's vllm-cluster guide asks for it)",
            )


@check("mem.earlyoom", "earlyoom running")
def mem_earlyoom(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        if f.earlyoom:
            r.ok(n, "running")
        else:
            r.warn(
                n,
                "earlyoom is not running: a memory spike can freeze the host until sshd stops answering",
                "apt install earlyoom && systemctl enable --now earlyoom",
            )


@check("mem.sshd_oom", "sshd protected from the OOM killer")
def mem_sshd_oom(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        v = f.sshd_oom_score_adj
        if v is not None and v < 0:
            r.ok(n, f"oom_score_adj {v}")
        else:
            r.warn(
                n,
                f"sshd oom_score_adj is {v if v is not None else 'unknown'}",
                "systemctl edit ssh: [Service] OOMScoreAdjust=-1000, then systemctl restart ssh",
            )


# --- disk and clock -----------------------------------------------------------------------------


@check("disk.free", "Free disk for the image and the model cache")
def disk_free(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        if not f.disks:
            continue
        root = f.docker.root_dir if f.docker else "/var/lib/docker"
        # df reports each path's mount point; the docker root is the first line, the HF cache the last
        disks = list(f.disks.values())
        docker_disk, cache_disk = disks[0], disks[-1]
        image_ready = f.image_id is not None
        problems = []
        if not image_ready and docker_disk.available < ctx.expect.image_disk_bytes:
            problems.append(
                f"{root} has {_gib(docker_disk.available)} free, the image needs {_gib(ctx.expect.image_disk_bytes)}"
            )
        if cache_disk.available < ctx.expect.model_disk_bytes:
            problems.append(
                f"{cache_disk.mount} has {_gib(cache_disk.available)} free, "
                f"the model needs {_gib(ctx.expect.model_disk_bytes)}"
            )
        if problems:
            r.fail(n, "; ".join(problems), "free space (docker system prune, old models in the HF cache) on this node")
        else:
            r.ok(n, f"{_gib(docker_disk.available)} free for images")


@check("clock.skew", "Clocks agree")
def clock_skew(ctx: Context, r: Report) -> None:
    offsets = {n: f.clock_offset for n, f in ctx.facts.items() if f.clock_offset is not None}
    if len(offsets) < 2:
        return
    head = ctx.inventory.head.name
    ref = offsets.get(head, next(iter(offsets.values())))
    for n, off in offsets.items():
        skew = abs(off - ref)
        if skew > 30:
            r.fail(n, f"clock is {skew:.1f}s off {head}", "enable NTP on both nodes (timedatectl set-ntp true)")
        elif skew > 1:
            r.warn(n, f"clock is {skew:.1f}s off {head}", "enable NTP on both nodes (timedatectl set-ntp true)")
        else:
            r.ok(n, f"{skew * 1000:.0f} ms")
