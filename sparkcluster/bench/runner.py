"""The cluster side of `sparkcluster bench`: the sweep driven level by level through a `Head`
(Ctrl-C stops the running level inside the container and keeps the levels before it), and the
only calls into ssh/fanout/serve and the Docker API, so the one place to adapt when those change.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from sparkcluster import log, redact
from sparkcluster.bench import aiperf, benchy, power
from sparkcluster.bench.prompts import (
    PromptSet,
    choose,
    fetch_command,
    parse_fetch,
    parse_probe,
    probe,
    speculative,
    wanted,
)
from sparkcluster.bench.results import failure_reason, level_error, progress, row_from_result, run_id
from sparkcluster.bench.sweep import (
    _RUN_ID,
    CONTAINER_ROOT,
    LOG_FILE,
    RESULT_FILE,
    Level,
    Target,
    bench_argv,
    describe,
    exec_argv,
    exec_env,
    level_dir,
    stop_argv,
)
from sparkcluster.deployment import endpoint, engine_ranks
from sparkcluster.errors import InputError, SparkError
from sparkcluster.fabric import engine_nccl
from sparkcluster.facts.parsers import ContainerInspect, container_inspect
from sparkcluster.labels import CLUSTER_LABEL, container_name
from sparkcluster.movement import hfcache
from sparkcluster.node.contract import STATE_PATH

_log = log.get("sparkcluster.bench")  # the logger name of the single module this was

# ---- the sweep, driven through a Head ----------------------------------------------------------


def row_for(harness: str, doc: dict, level: Level) -> dict:
    """A level's result file as a CSV row, by the harness that wrote it."""
    if harness == "llama-benchy":
        return benchy.row_from_result(doc, level)
    if harness == "aiperf":
        return aiperf.row_from_result(doc, level)
    return row_from_result(doc, level)


class Interrupted(Exception):
    """Ctrl-C during a level: the level was stopped inside the container."""


@dataclass(frozen=True)
class LevelResult:
    doc: dict  # the parsed --save-result JSON
    raw: bytes  # the same file as vLLM wrote it
    output: str  # what the benchmark printed (secrets masked)
    # the deployment's GPU power (W) as its supervisor published it while the level ran (issue 75)
    power_w: list[float] = field(default_factory=list)


@dataclass
class Sweep:
    run_dir: Path
    rows: list[dict] = field(default_factory=list)
    interrupted: bool = False
    failed: str = ""  # why the sweep stopped early, else ""


def prompt_set(head: Head, record, prof, harness: str, hub: str = hfcache.PUBLIC_HUB) -> PromptSet:
    """The prompts this run sends (bench/prompts.choose): the head is asked only for a speculative
    profile compared with a record measured on a dataset; where its image's bench has the dataset but
    its HF cache does not, the subset is made from `hub` (the inventory's hf_endpoint) when it can be."""
    spec, want = speculative(prof), wanted(record)
    if not spec or want is None or harness != "vllm-bench-serve":
        return choose(record, spec, harness, False, "")
    has, path, why = head.speed_bench(want[1])
    if has and not path:
        path, why = head.fetch_speed_bench(want[1], hub)
    return choose(record, spec, harness, has, path, why)


def run_sweep(
    head: Head,
    levels: list[Level],
    target: Target,
    secrets: dict[str, str],
    run_dir: Path,
    on_progress: Callable[[Level, int, int], None] | None = None,
    harness: str = "vllm-bench-serve",
    prompts: PromptSet | None = None,
) -> Sweep:
    """Each level in turn; its raw JSON lands in the run folder as soon as it is measured, so an
    interruption or a failed level keeps every level before it."""
    from secrets import token_hex  # the standard library's; a parameter here is called secrets

    sweep = Sweep(run_dir)
    # the folder in the container is this run's alone, whatever --out is called
    rid = f"{run_id()}-{token_hex(3)}"
    try:
        for level in levels:
            res = head.run_level(level, target, secrets, rid, on_progress=on_progress, harness=harness, prompts=prompts)
            (run_dir / f"{level.name}.json").write_bytes(res.raw)
            (run_dir / f"{level.name}.log").write_text(res.output)
            row = row_for(harness, res.doc, level)
            row.update(power.level_energy(res.power_w, row.get("output_tok_s")))
            sweep.rows.append(row)
            if on_progress is not None:  # a level too quick for a poll still shows as done
                on_progress(level, level.num_prompts, level.num_prompts)
            # aiperf's summary has no `completed`: its row's count of completed requests stands in
            doc = {"completed": row["completed"]} if harness == "aiperf" else res.doc
            err = level_error(doc, res.output, level, target.base_url)
            if err is not None:  # kept in the folder and the CSV (its errors column says it), then reported
                raise err
    except (Interrupted, KeyboardInterrupt):  # between levels nothing runs in the container
        sweep.interrupted = True
    except SparkError as e:
        sweep.failed = e.message
        raise
    finally:
        head.cleanup(rid)
    return sweep


# ---- the cluster side: the only calls into ssh/fanout/serve and the Docker API ----------------


NODE_FACTS = (
    'echo "hostname=$(hostname)"; echo "kernel=$(uname -r)"; '
    'echo "gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"; '
    "echo \"mem_total_kb=$(awk '/^MemTotal/ {print $2}' /proc/meminfo)\"; "
    "echo \"docker=$(docker version --format '{{.Server.Version}}' 2>/dev/null)\"; "
    # every netdev's MTU (the record's cause ranking compares the data plane's with the inventory's)
    'echo "mtus=$(for d in /sys/class/net/*; do printf \'%s:%s,\' "${d##*/}" "$(cat $d/mtu 2>/dev/null)"; done)"; true'
)
# the round trip from the head to a peer's control address, where the ranks' traffic goes: 5 pings in ~1 s
RTT = re.compile(r"= [0-9.]+/([0-9.]+)/[0-9.]+/[0-9.]+ ms")
VLLM_VERSION = (
    "python3 -c 'import importlib.metadata as m; print(m.version(\"vllm\"))' 2>/dev/null "
    "|| vllm --version 2>/dev/null | tail -1"
)


def parse_facts(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and re.fullmatch(r"[a-z_]+", k):
            out[k] = v.strip()
    return out


class Head:
    """The head container, reached over an open SSH connection (ssh.Host) and its Docker API."""

    def __init__(self, host, container: str, poll_s: float = 0.5):
        self.host = host
        self.container = container
        self.api = host.docker().api
        self.poll_s = poll_s
        self.power_samples: list[float] = []  # the deployment's GPU power while the last level ran

    # -- state ---------------------------------------------------------------------------------

    def serving(self):
        """(server.Record, container inspect) of the running server, or raise 'no cluster serving'."""
        import docker

        from sparkcluster.deployment import server  # for start-up speed: it loads the Docker SDK

        fix = "start it with: sparkcluster up --profile NAME"
        try:
            info = container_inspect(self.api.inspect_container(self.container))
        except docker.errors.NotFound:
            raise SparkError(
                f"no cluster is serving: {self.host.name} has no container {self.container}", fix
            ) from None
        except docker.errors.DockerException as e:
            raise SparkError(
                f"{self.host.name}: cannot ask its Docker engine about {self.container}: {e}",
                "sparkcluster doctor shows why",
            ) from None
        if not info.running:
            raise SparkError(f"no cluster is serving: {self.container} on {self.host.name} is not running", fix)
        rec = server.read_record(self.api, self.container)
        if rec is None or not server.running(self.api, rec):
            raise SparkError(
                f"no cluster is serving: vllm serve is not running in {self.container}",
                "sparkcluster up --profile NAME starts it; sparkcluster logs shows why it stopped",
            )
        return rec, info

    def image(self, info: ContainerInspect) -> tuple[str, str]:
        return info.image, info.image_id

    def repo_digests(self, image_id: str) -> list[str]:
        """The registry digests (sha256:...) of the head's image: what a published record names."""
        import docker

        try:
            info = self.api.inspect_image(image_id)
        except docker.errors.DockerException:
            return []
        return [d.split("@", 1)[1] for d in info.get("RepoDigests") or [] if "@" in d]

    def setup_benchy(self, pip_index_url: str | None = None) -> None:
        """llama-benchy in its own virtualenv in the head container, installed once (bench/benchy)."""
        self._setup_harness("llama-benchy", benchy.VERSION, benchy.setup_argv(pip_index_url))

    def setup_aiperf(self, pip_index_url: str | None = None) -> None:
        """aiperf in its own virtualenv in the head container, installed once (bench/aiperf)."""
        self._setup_harness("aiperf", aiperf.VERSION, aiperf.setup_argv(pip_index_url))

    def _setup_harness(self, name: str, version: str, argv: list[str]) -> None:
        code, out = self._exec(argv, {})
        if code != 0:
            tail = [ln for ln in out.splitlines() if ln.strip()][-6:]
            raise SparkError(
                f"could not install {name} {version} in {self.container} (exit {code})",
                "the head container needs PyPI (or the inventory's pip_index_url); or use --harness vllm-bench-serve",
                details=tail,
            )

    def speed_bench(self, subset: str) -> tuple[bool, str, str]:
        """Whether the image's `vllm bench serve` can run speed_bench, the prepared subset's folder in
        the head's HF cache ("" when absent), and why not where it knows it: bench/prompts.probe."""
        code, out = self._exec(["sh", "-c", probe(subset)], {})
        return parse_probe(out) if code == 0 else (False, "", "")

    def fetch_speed_bench(self, subset: str, hub: str) -> tuple[str, str]:
        """The subset made in the head's HF cache from `hub`'s copy of the dataset: (its folder, "") or
        ("", why not) (bench/prompts.fetch_command)."""
        # the container serves with HF_HUB_OFFLINE=1 (config/profile); this one exec asks the hub
        env = {"HF_ENDPOINT": hub, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
        code, out = self._exec(fetch_command(subset), env)
        return parse_fetch(out) if code == 0 else ("", f"the fetch in {self.container} exited {code}")

    def vllm_version(self) -> str:
        code, out = self._exec(["sh", "-c", VLLM_VERSION], {})
        return out.strip().splitlines()[-1] if code == 0 and out.strip() else ""

    # -- one level -------------------------------------------------------------------------------

    def run_level(
        self,
        level: Level,
        target: Target,
        secrets: dict[str, str],
        rid: str,
        on_progress: Callable[[Level, int, int], None] | None = None,
        harness: str = "vllm-bench-serve",
        prompts: PromptSet | None = None,
    ) -> LevelResult:
        """Run one level to the end. Ctrl-C stops it and raises Interrupted; a failed benchmark
        raises SparkError with its last lines."""
        folder = level_dir(rid, level)
        result = f"{folder}/{RESULT_FILE}"
        if harness == "llama-benchy":
            inner = benchy.bench_argv(level, target, result)
            _log.info("bench level", command=redact.mask(shlex.join(inner)), harness=harness)
        elif harness == "aiperf":
            inner = aiperf.bench_argv(level, target, folder)
            result = aiperf.result_path(folder)
            _log.info("bench level", command=redact.mask(shlex.join(inner)), harness=harness)
        else:
            inner = bench_argv(level, target, folder, prompts=prompts)
            _log.info("bench level", command=describe(level, target, folder, self.container, secrets, prompts))
        argv = exec_argv(folder, inner)
        ex = self.api.exec_create(self.container, argv, environment=exec_env(secrets), stdout=False, stderr=False)
        self.power_samples = []  # what _wait reads of the supervisor's power while the level runs
        try:
            self.api.exec_start(ex["Id"], detach=True)
            code = self._wait(ex["Id"], level, folder, on_progress)
        except KeyboardInterrupt:
            self.stop(folder)
            raise Interrupted() from None
        output = redact.mask(self._read(f"{folder}/{LOG_FILE}").decode(errors="replace"))
        if code != 0:
            why, unreachable = failure_reason(output)
            tail = [ln for ln in output.replace("\r", "\n").splitlines() if ln.strip()][-8:]
            if unreachable:
                raise SparkError(
                    f"the endpoint {target.base_url} did not answer the benchmark at concurrency "
                    f"{level.concurrency}: {why}",
                    f"sparkcluster status; sparkcluster logs {self.host.name}",
                    details=tail,
                )
            if code == 127:  # the shell found no `vllm` to exec
                raise SparkError(
                    f"{self.container} has no `vllm` command on its PATH: {why}",
                    "the profile's image must ship vLLM (NGC vllm images and vllm-openai do)",
                )
            raise SparkError(
                f"vllm bench serve failed at concurrency {level.concurrency} (exit {code}): {why}",
                "see the lines above; the levels before it are kept",
                details=tail,
            )
        try:
            raw = self._read(result)
            doc = json.loads(raw)
        except (ValueError, SparkError) as e:
            raise SparkError(
                f"vllm bench serve wrote no readable result at concurrency {level.concurrency}: {e}",
                "run it again with -vv and read the debug log",
            ) from None
        return LevelResult(doc, raw, output, list(self.power_samples))

    def power_w(self) -> float | None:
        """The deployment's GPU power now, as the head's supervisor last computed it from every node's
        (its state file's `power_w`, node/energy); None where it has none (no NVML, nvidia-smi)."""
        try:
            doc = json.loads(self._read(STATE_PATH))
        except (ValueError, SparkError):
            return None
        power = doc.get("power_w") if isinstance(doc, dict) else None
        return float(power) if isinstance(power, (int, float)) and not isinstance(power, bool) else None

    def _wait(self, exec_id: str, level: Level, folder: str, on_progress) -> int:
        last = None
        sampled = float("-inf")
        while True:
            if time.monotonic() - sampled >= power.SAMPLE_S:  # the level's power, every few seconds
                sampled = time.monotonic()
                watts = self.power_w()
                if watts is not None:
                    self.power_samples.append(watts)
            info = self.api.exec_inspect(exec_id)
            if on_progress is not None:
                try:
                    p = progress(self._read(f"{folder}/{LOG_FILE}").decode(errors="replace"))
                except SparkError:
                    p = None  # not written yet
                if p and p != last:
                    last = p
                    on_progress(level, *p)
            if not info.get("Running"):
                return info.get("ExitCode", 1) if info.get("ExitCode") is not None else 1
            time.sleep(self.poll_s)

    def stop(self, folder: str) -> None:
        """Ctrl-C: `docker exec` forwarded nothing, so interrupt the benchmark by its PID."""
        try:
            self._exec(stop_argv(folder), {})
        except Exception as e:  # best effort: the user asked to stop, report what we could not do
            _log.warning("could not stop the benchmark in the container", error=str(e))

    def cleanup(self, rid: str) -> None:
        if not _RUN_ID.match(rid):
            return
        try:
            self._exec(["rm", "-rf", "--", str(PurePosixPath(CONTAINER_ROOT) / rid)], {})
        except Exception as e:  # leftovers in /tmp of the container harm nothing
            _log.info("could not remove the container's bench folder", error=str(e))

    # -- primitives ------------------------------------------------------------------------------

    def _exec(self, argv: list[str], env: dict[str, str]) -> tuple[int, str]:
        """A short command in the head container, to its end (the Docker API client's timeout bounds it)."""
        ex = self.api.exec_create(self.container, argv, environment=env)
        out = self.api.exec_start(ex["Id"]).decode(errors="replace")
        return self.api.exec_inspect(ex["Id"]).get("ExitCode", 1), out

    def _read(self, path: str) -> bytes:
        import docker

        try:
            stream, _ = self.api.get_archive(self.container, path)
        except docker.errors.NotFound:
            raise SparkError(f"{path}: no such file in {self.container}") from None
        data = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.getmembers()[0]
            f = tar.extractfile(member)
            return f.read() if f else b""


def node_facts(cluster, inv=None) -> dict[str, dict]:
    """A few facts per node for run.json; an unreachable node is recorded as such. With the
    inventory, also the image ID of each node's sparkcluster container (`image_id`)."""
    out: dict[str, dict] = {}
    script = NODE_FACTS
    if inv is not None:
        label = shlex.quote(f"{CLUSTER_LABEL}={inv.cluster.name}")
        script += (
            f'; echo "image_id=$(docker ps -q --filter label={label} | head -1 | '
            "xargs -r docker inspect -f '{{.Image}}' 2>/dev/null)\""
        )
    res = cluster.each(lambda h: h.run(script, timeout=20))
    for name, o in res.items():
        out[name] = parse_facts(o.value.stdout) if o.ok else {"error": str(o.error)}
    return out


def parse_rtt(ping_output: str) -> float | None:
    """The average round trip in ms from `ping -q`'s summary, or None when nothing answered."""
    m = RTT.search(ping_output or "")
    return float(m.group(1)) if m else None


def rank_rtts(cluster, inv, count: int = 5, deadline_s: int | None = None) -> dict[str, tuple[float | None, str]]:
    """From the head to every other node's control address (where the ranks talk): (ms, why none).
    `count` pings 0.2 s apart, or as many as fit in `deadline_s`."""
    head = cluster.head
    out: dict[str, tuple[float | None, str]] = {}
    for n in inv.nodes:
        if n.name == inv.head.name:
            continue
        cmd = ["ping", "-n", "-q", "-i", "0.2", "-W", "1", "-c", str(count)]
        if deadline_s:
            cmd += ["-w", str(deadline_s)]
        cmd.append(str(n.control_ip))
        try:
            res = head.run(cmd, timeout=(deadline_s or count) + 15, warn=True)
        except SparkError as e:
            out[n.name] = (None, e.message)
            continue
        rtt = parse_rtt(res.stdout)
        lines = (res.stdout + res.stderr).strip().splitlines()
        out[n.name] = (rtt, "" if rtt is not None else (lines[-1] if lines else "no answer"))
    return out


class LoadedRtt:
    """The same round trips measured while the benchmark runs (in a thread, over the head's SSH
    connection): a link that only queues under the ranks' traffic (a shaped or slow link) shows here."""

    def __init__(self, cluster, inv, seconds: int = 8):
        import threading

        self.result: dict[str, tuple[float | None, str]] = {}
        self._thread = threading.Thread(target=self._run, args=(cluster, inv, seconds), daemon=True)

    def _run(self, cluster, inv, seconds: int) -> None:
        try:
            self.result = rank_rtts(cluster, inv, count=seconds * 5, deadline_s=seconds)
        except Exception as e:  # noqa: BLE001 -- a fact not learnt, never a failed benchmark
            _log.info("no round trip under load", error=str(e))

    def start(self) -> LoadedRtt:
        self._thread.start()
        return self

    def join(self, timeout: float = 30.0) -> dict[str, tuple[float | None, str]]:
        self._thread.join(timeout)
        return self.result


def engine_nccl_texts(cluster, inv) -> dict[str, str]:
    """Per node, the lines the engine's NCCL wrote at init in sparkcluster's containers there; ""
    where none (a CPU engine writes none)."""
    res = cluster.each(lambda h: engine_nccl.read_node(h, inv.cluster.name))
    return {name: (o.value if o.ok else "") for name, o in res.items()}


def engine_rank_texts(cluster, inv) -> dict[str, str]:
    """Per node, what its ranks' serve logs say of their all-reduce backend (issue 59); "" unread."""
    res = cluster.each(lambda h: engine_ranks.read_node(h, inv.cluster.name))
    return {name: (o.value if o.ok else "") for name, o in res.items()}


def model_revision(cluster, inv, prof) -> str:
    """The commit the profile's model resolves to in the head's HF cache ("" when not a hub model or
    not there). A revision that is already a commit is its own answer."""
    if not hfcache.is_hub_model(prof.model):
        return ""
    rev = prof.revision or "main"
    if re.fullmatch(r"[0-9a-f]{40}", rev):
        return rev
    cache = inv.hf_cache(inv.head.name, unresolved_ok=True)
    ref = f"{hfcache.hub_dir(cache)}/{hfcache.repo_folder(prof.model)}/refs/{rev}"
    path = '"$HOME"/' + shlex.quote(ref[2:]) if ref.startswith("~/") else shlex.quote(ref)
    try:
        res = cluster.head.run(f"cat {path}", timeout=10, warn=True)
    except SparkError:
        return ""
    out = res.stdout.strip()
    return out if re.fullmatch(r"[0-9a-f]{40}", out) else ""


def connect(inv):
    """The cluster's hosts (fanout.ConnectedHosts); the head must answer, a worker may not."""
    # for start-up speed: paramiko loads only when a benchmark connects (`bench --compare` reads files)
    from sparkcluster.remote.fanout import ConnectedHosts, connect_all

    res = connect_all(inv)
    if inv.head.name in res.failed:
        for h in res.succeeded.values():
            h.close()
        raise res.failed[inv.head.name]  # a ConnectError names the head and the fix
    return ConnectedHosts(inv, res.succeeded)


def head_for(cluster, inv) -> Head:
    return Head(cluster.hosts[inv.head.name], container_name(inv.cluster.name, "head", inv.head.name, inv.slot))


def check_endpoint(address: str, target: Target, port: int, secrets: dict[str, str]) -> None:
    """From the controller, before any level: the endpoint answers and takes our key."""
    import httpx

    base = f"http://{address}:{port}"
    with httpx.Client() as client:
        code = endpoint.health(client, base)
        if code != 200:
            raise SparkError(
                f"the endpoint {base} does not answer (/health: {code or 'no answer'})",
                "sparkcluster status shows what is down; sparkcluster logs shows why",
            )
        ok, why = endpoint.one_token(client, base, target.model, endpoint.headers(secrets), timeout=60)
    if ok:
        return
    if "HTTP 401" in why:
        raise InputError(
            f"the endpoint {base} refuses the API key: {why}",
            f"set VLLM_API_KEY to the key the cluster was started with: {redact.set_fix('VLLM_API_KEY')}",
        )
    if why.startswith("completion answered HTTP"):
        # an answer is an endpoint that works; the chat route may be what it refuses (a model without
        # a chat template) while the benchmark's /v1/completions is fine: let the level say
        _log.warning("chat completion refused before the benchmark", reason=why)
        return
    raise SparkError(
        f"the endpoint {base} answers /health but not a completion: {why}", "sparkcluster status; sparkcluster logs"
    )


@dataclass
class ClusterFacts:
    """What bench learns about the cluster before it measures: run.json's node facts, and the
    provenance and cause-ranking facts of issue 38."""

    nodes: dict[str, dict] = field(default_factory=dict)
    rtts: dict[str, tuple[float | None, str]] = field(default_factory=dict)
    nccl_texts: dict[str, str] = field(default_factory=dict)
    engine_texts: dict[str, str] = field(default_factory=dict)  # node -> its ranks' log lines (deployment/engine_ranks)
    loaded_rtts: dict[str, tuple[float | None, str]] = field(default_factory=dict)  # set while measuring
    model_revision: str = ""
    image_digests: list[str] = field(default_factory=list)


def cluster_facts(cluster, inv, prof, head: Head, image_id: str) -> ClusterFacts:
    """Every fact in one place (the calls a unit test replaces with one fake)."""
    return ClusterFacts(
        nodes=node_facts(cluster, inv),
        rtts=rank_rtts(cluster, inv),
        nccl_texts=engine_nccl_texts(cluster, inv),
        engine_texts=engine_rank_texts(cluster, inv),
        model_revision=model_revision(cluster, inv, prof),
        image_digests=head.repo_digests(image_id) if image_id else [],
    )
