"""`up`: from two bare Sparks to a TP=2 endpoint that answers.

The flow is the architecture: lint, connect, lock, gather facts and check (preflight), make a plan
from the facts (data: what each stage does on each host), then execute that same plan stage by
stage. `--dry-run` prints the plan and stops. Anything this run created is rolled back when a
stage fails or the user presses Ctrl-C, so the hosts end as they were or in a state `down` removes.
"""

from __future__ import annotations

import io
import shlex
import tarfile
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit

from . import checks, lint, log, preflight, profile as profiles, raycluster, redact, serve, teardown, transfer
from .containers import ContainerSpec, create_and_start, spec_for
from .errors import InputError, StageError, StepFailure
from .facts import HostFacts
from .flags import exec_argv
from .fanout import Cluster
from .images import DOCKERFILE, RAY_VERSION, image_ref
from .inventory import Inventory
from .labels import CONFIG_LABEL, PROFILE_LABEL, ROLE_LABEL
from .lock import ClusterLock

_log = log.get(__name__)

STAGES = ("preflight", "image", "containers", "ray", "probe", "serve")
# checks that `up` itself repairs, so they do not block it: the image stage builds and sends the
# image, recreating the containers fixes their flags and variables
REPAIRED_BY_UP = {"image.same", "image.ray", "containers.forwarded_env", "containers.per_host_env", "containers.flags"}
RAY_HEAD_TIMEOUT_S = 60.0
RAY_JOIN_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Step:
    stage: str
    host: str
    what: str
    detail: str = ""


@dataclass
class Plan:
    inventory: Inventory
    profile: profiles.Profile
    image: str
    head_container: str
    build: dict[str, str] | None  # build args when the head lacks the image
    send_to: list[str]  # workers that get the head's image (decided again after a build)
    remove: dict[str, list[str]]  # node -> our containers to remove before creating
    containers: list[ContainerSpec]  # to create, head first; empty when the current ones fit
    serve: serve.ServeSpec | None  # None when the same profile already serves
    unchanged: bool = False
    notes: list[str] = field(default_factory=list)

    def steps(self) -> list[Step]:
        inv, head = self.inventory, self.inventory.head.name
        out = [Step("preflight", n.name, "facts and checks", "one read-only probe script, then path-MTU pings")
               for n in inv.nodes]
        if self.build is not None:
            args = " ".join(f"--build-arg {k}={v}" for k, v in self.build.items())
            out.append(Step("image", head, "build the cluster image",
                            f"Engine API build: docker build --network host {args} -t {self.image} -f {DOCKERFILE.name} ."))
        for w in self.send_to:
            node = inv.node(w)
            out.append(Step("image", w, "receive the image from the head",
                            transfer.describe(self.image, head, str(inv.head.control_ip), w, str(node.control_ip))))
        for n in inv.nodes:
            out.append(Step("image", n.name, "check ray in the image", _ray_version_cmd(self.image)))
        for n, names in self.remove.items():
            for c in names:
                out.append(Step("containers", n, f"remove {c}",
                                "stop vllm serve by its PID (TERM, then KILL after 30s), then Engine API: docker rm -f " + c))
        if self.containers and self.profile.drop_page_cache:
            for n in inv.nodes:
                out.append(Step("containers", n.name, "drop the page cache", DROP_CACHES))
        for spec in self.containers:
            files = ", ".join(spec.files) or "none"
            out.append(Step("containers", spec.node, f"create {spec.name}",
                            f"Engine API create+start (files: {files}): {spec.docker_run_equivalent()}"))
        if self.containers:
            out.append(Step("ray", head, "wait for Ray membership",
                            f"every node at its control IP with its GPUs, within {RAY_JOIN_TIMEOUT_S:g}s"))
            for spec in self.containers:
                out.append(Step("probe", spec.node, "variables in the container", f"docker exec {spec.name} env"))
        if self.serve is not None:
            if self.serve.plugin:
                out.append(Step("serve", head, "stage the reasoning-parser plugin",
                                f"docker exec -e HF_TOKEN=****** {self.serve.container} " +
                                shlex.join(serve.stage_plugin_command(*self.serve.plugin))))
            out.append(Step("serve", head, "start vllm serve", self.serve.describe()))
            out.append(Step("serve", head, "wait until ready",
                            f"/health is 200 and a one-token chat completion succeeds, within {self.profile.ready_timeout_s}s; "
                            "then one warm-up request"))
        return out

    def render(self) -> str:
        lines = [f"plan for profile '{self.profile.name}' on cluster '{self.inventory.cluster.name}' (image {self.image}):"]
        lines += [f"  note: {n}" for n in self.notes]
        if self.unchanged:
            lines.append("  nothing to do: the cluster already serves this profile")
        stage = None
        for s in self.steps():
            if s.stage != stage:
                stage = s.stage
                lines.append(f"[{stage}]")
            lines.append(f"  {s.host}: {s.what}")
            if s.detail:
                lines.append(f"      {s.detail}")
        return redact.mask("\n".join(lines))


DROP_CACHES = "sync && echo 3 > /proc/sys/vm/drop_caches"


def _ray_version_cmd(image: str) -> str:
    return shlex.join(["docker", "run", "--rm", "--network", "none", "--entrypoint", "ray", image, "--version"])


# --- planning: pure over facts -------------------------------------------------------------------

def make_plan(inv: Inventory, prof: profiles.Profile, facts: dict[str, HostFacts], serving: bool,
              replace: bool) -> Plan:
    image = image_ref(inv, prof)
    head = inv.head.name
    head_id = facts[head].image_id
    build = None
    if head_id is None:
        build = {"BASE_IMAGE": prof.image.ref, "RAY_VERSION": RAY_VERSION}
        if inv.cluster.pip_index_url:
            build["PIP_INDEX_URL"] = inv.cluster.pip_index_url
            if inv.cluster.pip_index_url.startswith("http://"):
                # pip ignores a plain-http index unless its host is trusted by name
                build["PIP_TRUSTED_HOST"] = urlsplit(inv.cluster.pip_index_url).hostname
    send_to = [w.name for w in inv.workers if head_id is None or facts[w.name].image_id != head_id]

    specs = {n.name: spec_for(inv, prof, n, image) for n in inv.nodes}
    current = {n.name: [c for c in facts[n.name].ours] for n in inv.nodes}
    other_profiles = sorted({c.get("Config", {}).get("Labels", {}).get(PROFILE_LABEL, "?")
                             for cs in current.values() for c in cs} - {prof.name})
    notes = []
    if other_profiles:
        what = f"profile '{', '.join(other_profiles)}' (containers: " + ", ".join(
            c.get("Name", "").lstrip("/") for cs in current.values() for c in cs) + ")"
        if not replace:
            raise InputError(f"the cluster runs {what}; up --profile {prof.name} would replace it",
                             f"sparkcluster up --profile {prof.name} --replace (or sparkcluster down first)")
        notes.append(f"replacing {what}")

    def fits(node: str) -> bool:
        cs = current[node]
        if len(cs) != 1:
            return False
        c = cs[0]
        labels = c.get("Config", {}).get("Labels", {})
        # the labels are what was asked; the container's own env is what its ranks get (a
        # container recreated by hand can carry our labels without the forwarded variables)
        env = dict(e.split("=", 1) for e in (c.get("Config", {}).get("Env") or []) if "=" in e)
        # the config hash leaves the profile out: another profile's container can match it, and
        # kept, it would still carry that profile's label
        return (bool(c.get("State", {}).get("Running"))
                and labels.get(PROFILE_LABEL) == prof.name
                and labels.get(CONFIG_LABEL) == specs[node].config_hash()
                and all(env.get(k) == v for k, v in specs[node].env.items())
                and facts[node].image_id is not None and c.get("Image") == facts[node].image_id
                and node not in send_to and build is None)

    keep = all(fits(n.name) for n in inv.nodes)
    if not keep and not other_profiles and any(current.values()) and (
            not all(current.values()) or not all(c.get("State", {}).get("Running") for cs in current.values() for c in cs)):
        # what a killed run leaves (a head holding the GCS port, no worker): say so, then replace it
        notes.append("stale state left behind, not a running cluster (containers: " + ", ".join(
            c.get("Name", "").lstrip("/") for cs in current.values() for c in cs) +
            "): removed first, as `sparkcluster down --purge-gcs` would")
    remove = {} if keep else {n: [c.get("Name", "").lstrip("/") for c in cs] for n, cs in current.items() if cs}
    containers = [] if keep else [specs[inv.head.name], *[specs[w.name] for w in inv.workers]]
    if keep and serving:
        return Plan(inv, prof, image, specs[head].name, None, [], {}, [], None, unchanged=True, notes=notes)
    sv = serve.ServeSpec(
        container=specs[head].name,
        argv=exec_argv(prof, port=inv.cluster.api_port, hf_cache=inv.cluster.hf_cache),
        secret_names=profiles.secret_env_names(prof),
        model=prof.served_model_name,
        port=prof.serve.port or inv.cluster.api_port,
        plugin=profiles.reasoning_plugin(prof, inv.cluster.hf_cache),
    )
    return Plan(inv, prof, image, specs[head].name, build, send_to, remove, containers, sv, notes=notes)


# --- execution -----------------------------------------------------------------------------------

class Progress:
    """What the user sees: each stage with its duration. Replaced by the CLI with a rich display."""

    def stage(self, name: str) -> None: ...
    def done(self, name: str, seconds: float, note: str = "") -> None: ...
    def info(self, text: str) -> None: ...
    def bytes(self, node: str, sent: int, total: int) -> None: ...


@dataclass
class Created:
    containers: dict[str, set[str]] = field(default_factory=dict)  # node -> container ids

    def add(self, node: str, cid: str) -> None:
        self.containers.setdefault(node, set()).add(cid)

    def __bool__(self) -> bool:
        return any(self.containers.values())


@dataclass
class Outcome:
    unchanged: bool
    endpoint: str
    model: str
    pid: int | None
    seconds: dict[str, float]


def _check(res, stage: str, step: str):
    if not res.ok:
        raise _fail(stage, res.host, step, f"exit {res.exit_code}", res.command, res.tail())
    return res


def _fail(stage: str, host: str, step: str, reason: str, command: str | None = None, tail: str = "",
          fix: str | None = None) -> StageError:
    return StageError(stage, [StepFailure(host, step, reason, command, tail, fix)], fix)


class Runner:
    def __init__(self, cluster: Cluster, plan: Plan, facts: dict[str, HostFacts], secrets: dict[str, str],
                 progress: Progress):
        self.cluster, self.plan, self.facts, self.secrets, self.progress = cluster, plan, facts, secrets, progress
        self.inv = plan.inventory
        self.created = Created()
        self.server: serve.Record | None = None  # started by this run
        self.seconds: dict[str, float] = {}
        self.stage = "image"

    def _timed(self, stage: str, fn: Callable[[], str | None]) -> None:
        self.stage = stage
        self.progress.stage(stage)
        t = time.monotonic()
        note = fn() or ""
        self.seconds[stage] = time.monotonic() - t
        self.progress.done(stage, self.seconds[stage], note)

    # -- image --
    def image(self) -> str:
        p, head = self.plan, self.cluster.head
        notes = []
        if p.build is not None:
            self._build(head)
            notes.append("built on " + head.name)
        info = head.docker().api.inspect_image(p.image)
        head_id = info["Id"]
        targets = [w for w in self.cluster.workers if w.name in p.send_to]
        size, layers = info.get("Size", 0), (info.get("RootFS") or {}).get("Layers") or []
        for w in targets:
            if self.facts[w.name].image_id == head_id:
                continue
            sent, secs = self._send(head, w, head_id, size, layers)
            # the bar's own rate needs samples over time; a fast link sends in one burst after
            # docker save has prepared the stream, so the whole transfer's rate is stated here
            notes.append(f"sent to {w.name}: {sent / 1e6:.1f} MB in {secs:.1f}s, {sent / 1e6 / max(secs, 1e-3):.1f} MB/s")

        def ray_in_image(h):
            if h.name not in p.send_to and p.build is None and self.facts[h.name].image_ray:
                return self.facts[h.name].image_ray
            cmd = _ray_version_cmd(p.image)
            r = h.run(cmd, timeout=120)
            if not r.ok:
                raise _fail("image", h.name, "ray in the image", "`ray --version` failed in the image", cmd, r.tail(),
                            "the image must be built from images/Dockerfile.vllm-ray (NGC 26.05 has no Ray)")
            return r.stdout.strip()
        self.cluster.each(ray_in_image).values_or_raise("image")
        return ", ".join(notes) or "in place on every node"

    def _build(self, head) -> None:
        api = head.docker().api
        ctx = io.BytesIO()
        with tarfile.open(fileobj=ctx, mode="w") as tar:
            tar.add(str(DOCKERFILE), arcname="Dockerfile")
        ctx.seek(0)
        tail: list[str] = []
        try:
            for chunk in api.build(fileobj=ctx, custom_context=True, tag=self.plan.image, buildargs=self.plan.build,
                                   network_mode="host", rm=True, forcerm=True, decode=True, pull=False):
                if "stream" in chunk:
                    tail.extend(x for x in chunk["stream"].splitlines() if x.strip())
                    tail = tail[-20:]
                if "error" in chunk:
                    raise _fail("image", head.name, "docker build", chunk["error"].strip(),
                                f"docker build -t {self.plan.image} images/", "\n".join(tail),
                                "read the build output above; the base image must exist on the head "
                                f"(docker pull {self.plan.profile.image.ref})")
        except StageError:
            raise
        except Exception as e:  # the API call itself failed
            raise _fail("image", head.name, "docker build", str(e), None, "\n".join(tail)) from None

    def _disk_needed(self, head, worker, size: int, layers: list[str]) -> int | None:
        """What docker load will need on the worker, from the layers it already holds; None when
        the engines cannot say (the transfer then goes ahead, and a full disk fails it cleanly)."""
        try:
            hist = head.docker().api.history(self.plan.image)
            sizes = [e.get("Size", 0) for e in reversed(hist) if e.get("Size", 0) > 0]
            api = worker.docker().api
            present = []
            for img in api.images():
                try:
                    rootfs = api.inspect_image(img["Id"]).get("RootFS") or {}
                except Exception:  # removed meanwhile
                    continue
                present.append((rootfs.get("Layers") or [], img.get("Size", 0)))
        except Exception as e:  # an Engine API or connection error: no estimate, not a failure
            _log.warning("could not estimate the disk the image needs", node=worker.name, error=str(e))
            return None
        return transfer.disk_needed(size, layers, present, sizes)

    def _send(self, head, worker, head_id: str, size: int, layers: list[str]) -> tuple[int, float]:
        wf = self.facts[worker.name]
        free = list(wf.disks.values())[0].available if wf.disks else None
        need = self._disk_needed(head, worker, size, layers) if free is not None and size else None
        if free is not None and need and free < need * 1.05:
            raise _fail("image", worker.name, "receive the image",
                        f"not enough disk: {free / 2**30:.1f} GiB free in "
                        f"{wf.docker.root_dir if wf.docker else 'the docker root'}; docker load needs "
                        f"{need / 2**30:.1f} GiB (it unpacks the whole {size / 2**30:.1f} GiB image before "
                        "storing the layers the node lacks)",
                        fix=f"free {(need * 1.05 - free) / 2**30:.1f} GiB more on {worker.name} (`docker image prune -a` "
                            "removes the images no container uses), then sparkcluster up")
        wnode, hnode = self.inv.node(worker.name), self.inv.head
        recv = worker.start(transfer.bash(transfer.receive_command(str(wnode.control_ip), str(hnode.control_ip))), timeout=3600)
        port = None
        for line in recv.stderr_lines():
            if line.startswith("@@port "):
                port = int(line.split()[1])
                break
        if port is None:
            res = recv.wait()
            raise _fail("image", worker.name, "start the receiver", "the receiver did not start",
                        "python3 receiver | docker load", res.tail())
        t0, sent = time.monotonic(), 0
        send = head.start(transfer.bash(transfer.send_command(self.plan.image, str(wnode.control_ip), port,
                                                              str(hnode.control_ip))), timeout=3600)
        for line in send.stderr_lines():
            if line.startswith("@@sent "):
                sent = int(line.split()[1])
                self.progress.bytes(worker.name, sent, size)
        sres, rres = send.wait(), recv.wait()
        if not rres.ok or not sres.ok:
            bad, res = (worker, rres) if not rres.ok else (head, sres)
            left = self._image_id(worker)
            extra = "" if left is None else f" (an image {left[:19]} is left on {worker.name})"
            root = wf.docker.root_dir if wf.docker else "/var/lib/docker"
            df = worker.run(f"df -Pk {shlex.quote(root)} | tail -1", timeout=20)
            if df.ok and len(df.stdout.split()) > 3 and df.stdout.split()[3].isdigit():
                extra += f"; {int(df.stdout.split()[3]) // 1024} MiB free in {root} on {worker.name}"
            raise _fail("image", bad.name, "send the image", f"transfer failed (exit {res.exit_code}){extra}",
                        res.command[:160], res.tail(),
                        f"check free disk and the link between {head.name} and {worker.name}, then sparkcluster up")
        got = self._image_id(worker)
        if got != head_id:
            raise _fail("image", worker.name, "verify the image", f"image ID after the transfer is {got}, expected {head_id}")
        return sent, time.monotonic() - t0

    def _image_id(self, host) -> str | None:
        try:
            return host.docker().api.inspect_image(self.plan.image)["Id"]
        except Exception:  # not there
            return None

    # -- containers and Ray --
    def containers(self) -> str:
        p = self.plan
        if p.remove:
            teardown.down(self.cluster)
        if p.profile.drop_page_cache:
            self.cluster.each(lambda h: h.run(DROP_CACHES, timeout=60)).values_or_raise("containers")
        head_spec, worker_specs = p.containers[0], p.containers[1:]
        self._create(self.cluster.head, head_spec)
        self._wait_ray_head(head_spec)
        by_node = {s.node: s for s in worker_specs}
        self.cluster.each(lambda h: self._create(h, by_node[h.name]),
                          [w for w in self.cluster.workers if w.name in by_node]).values_or_raise("containers")
        return f"{len(p.containers)} created"

    def _create(self, host, spec: ContainerSpec) -> str:
        try:
            cid = create_and_start(host.docker().api, spec)
        except Exception as e:  # the Engine API refused: name the node and the call
            raise _fail("containers", host.name, f"create {spec.name}", str(e), spec.docker_run_equivalent()) from None
        self.created.add(host.name, cid)
        return cid

    def _exec(self, host, container: str, argv: list[str], env: dict | None = None, timeout: float = 60) -> tuple[int, str]:
        api = host.docker().api
        ex = api.exec_create(container, argv, environment=env or {})
        out = api.exec_start(ex["Id"]).decode(errors="replace")
        return api.exec_inspect(ex["Id"]).get("ExitCode", 1), out

    def _container_failed(self, host, spec: ContainerSpec) -> StageError | None:
        api = host.docker().api
        info = api.inspect_container(spec.name)
        if info.get("State", {}).get("Running"):
            return None
        logs = redact.mask(api.logs(spec.name, tail=15).decode(errors="replace"))
        fix = None
        if "already" in logs and ("6379" in logs or "running" in logs):
            fix = "a stale Ray head holds the GCS port: sparkcluster down --purge-gcs, then sparkcluster up"
        return _fail("ray", host.name, f"{spec.role} container {spec.name}",
                     f"the container exited ({info['State'].get('ExitCode')})", shlex.join(spec.command), logs,
                     fix or f"read the container's last lines above (exit 137: killed, e.g. out of memory on {host.name}); "
                            "sparkcluster doctor, then sparkcluster up")

    def _membership(self) -> list[raycluster.RayNode] | None:
        res = self.cluster.head.run(raycluster.state_api_command(), timeout=10)
        return raycluster.nodes_from_state_api(res.stdout) if res.ok else None

    def _wait_ray_head(self, spec: ContainerSpec) -> None:
        deadline = time.monotonic() + RAY_HEAD_TIMEOUT_S
        while time.monotonic() < deadline:
            err = self._container_failed(self.cluster.head, spec)
            if err:
                raise err
            nodes = self._membership()
            if nodes:
                return
            time.sleep(0.25)
        raise _fail("ray", self.cluster.head.name, "Ray head", f"Ray did not answer within {RAY_HEAD_TIMEOUT_S:g}s",
                    shlex.join(spec.command), redact.mask(self.cluster.head.docker().api.logs(spec.name, tail=15).decode(errors="replace")))

    def ray(self) -> str:
        deadline = time.monotonic() + RAY_JOIN_TIMEOUT_S
        problems = ["no answer from Ray yet"]
        while time.monotonic() < deadline:
            for spec in self.plan.containers:
                err = self._container_failed(self.cluster.hosts[spec.node], spec)
                if err:
                    raise err
            nodes = self._membership()
            if nodes is not None:
                problems = raycluster.membership_problems(self.inv, nodes)
                if not problems:
                    return f"{len(self.inv.nodes)} nodes, {self.inv.gpu_count} GPUs"
            time.sleep(0.25)
        raise _fail("ray", self.inv.head.name, "wait for Ray membership",
                    f"not formed within {RAY_JOIN_TIMEOUT_S:g}s: {'; '.join(problems)}",
                    fix="check the control link between the nodes (sparkcluster doctor), then sparkcluster up")

    # -- probe --
    def probe(self) -> str:
        want = self.plan.profile.forwarded_env()

        def one(host) -> int:
            spec = next(s for s in self.plan.containers if s.node == host.name)
            code, out = self._exec(host, spec.name, ["env"])
            env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
            missing = [k for k in want if k not in env]
            wrong = [k for k, v in want.items() if k in env and env[k] != v]
            per_host = profiles.per_host_env(self.plan.profile, self.inv, host.name)
            bad_host = [f"{k}={env.get(k, '(unset)')} (want {v})" for k, v in per_host.items() if env.get(k) != v]
            if missing or wrong or bad_host:
                reason = "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                               f"different {', '.join(wrong)}" if wrong else "",
                                               ", ".join(bad_host)) if x)
                raise _fail("probe", host.name, "variables in the container", reason, f"docker exec {spec.name} env", "",
                            "these must be in the container at its start on every node (docker exec -e reaches rank 0 "
                            "only): sparkcluster down, then sparkcluster up recreates both containers")
            return len(want) + len(per_host)
        got = self.cluster.each(one, [self.cluster.hosts[s.node] for s in self.plan.containers]).values_or_raise("probe")
        return f"{sum(got.values())} variables right on {len(got)} nodes"

    # -- serve --
    def serve(self) -> tuple[serve.Record, float]:
        sv, head = self.plan.serve, self.cluster.head
        api = head.docker().api
        if "HF_TOKEN" in self.secrets:
            # Every rank downloads weights, but vLLM must not copy HF_TOKEN into the worker ranks'
            # Ray runtime_env (it shows on their command lines); huggingface_hub reads the token
            # file in the mounted cache instead, as after `huggingface-cli login`
            token = self.secrets["HF_TOKEN"].encode()
            cmd = serve.token_file_command(self.inv.cluster.hf_cache)
            self.cluster.each(lambda h: _check(h.run(cmd, timeout=30, stdin=token), "serve", "stage the HF token file")
                              ).values_or_raise("serve")
        if sv.plugin:
            env = {k: v for k, v in self.secrets.items() if k == "HF_TOKEN"}
            code, out = self._exec(head, sv.container, serve.stage_plugin_command(*sv.plugin), env, timeout=120)
            if code != 0:
                raise _fail("serve", head.name, "stage the reasoning-parser plugin", f"fetch of {sv.plugin[0]} failed",
                            shlex.join(serve.stage_plugin_command(*sv.plugin)), redact.mask(out))
        old = serve.read_record(api, sv.container)
        if old and serve.running(api, old):
            head.run(teardown.kill_command(old.pid, teardown.STOP_GRACE_S), timeout=teardown.STOP_GRACE_S + 15)
        rec = serve.start(api, sv, self.secrets, self.plan.profile.name)
        self.server = rec
        base = f"http://{head.address}:{sv.port}"
        try:
            took = serve.wait_ready(api, rec, sv, base, self.secrets, self.plan.profile.ready_timeout_s,
                                    on_wait=lambda why, s: self.progress.info(f"waiting for the server ({s:.0f}s): {why}"))
        except serve.NotReady as e:
            raise _fail("serve", head.name, "wait until ready", e.reason, sv.describe(), e.tail,
                        "read the server's log above (sparkcluster logs spark-head); fix, then sparkcluster up") from None
        return rec, took

    def rollback(self) -> None:
        """Stop what this run started and remove what it created; leave everything else alone."""
        ids = self.created.containers
        if self.server is not None:
            try:
                teardown.stop_server(self.cluster.head, self.plan.serve.container)
            except Exception as e:  # keep rolling back
                _log.warning("rollback: stopping vllm serve failed", error=str(e))
        if any(ids.values()):
            teardown.down(self.cluster, only_ids=ids)


def run(inv: Inventory, prof: profiles.Profile, secrets: dict[str, str], progress: Progress, *,
        dry_run: bool = False, replace: bool = False, command: str = "up") -> Outcome | Plan:
    problems = lint.lint(prof, inv)
    if problems:
        raise InputError(f"profile '{prof.name}' fails lint ({len(problems)} problem(s))",
                         f"fix the profile, then check with: sparkcluster profile lint {prof.name}",
                         details=[p.line() for p in problems])
    t0 = time.monotonic()
    progress.stage("preflight")
    cluster = Cluster.connect(inv)
    with cluster:
        lock = None if dry_run else ClusterLock(cluster.head, inv.cluster.name, command)
        if lock:
            lock.__enter__()
        try:
            return _run_locked(cluster, inv, prof, secrets, progress, dry_run, replace, t0)
        finally:
            if lock:
                lock.__exit__(None, None, None)


def _serving(cluster: Cluster, inv: Inventory, prof: profiles.Profile, facts: dict[str, HostFacts],
             secrets: dict[str, str]) -> bool:
    """The same profile already serves: its server runs, started with the same secrets."""
    heads = [c for c in facts[inv.head.name].ours if c.get("Config", {}).get("Labels", {}).get(ROLE_LABEL) == "head"
             and c.get("State", {}).get("Running")]
    if not heads:
        return False
    api = cluster.head.docker().api
    rec = serve.read_record(api, heads[0]["Id"])
    wanted = {k: v for k, v in secrets.items() if k in profiles.secret_env_names(prof)}
    return bool(rec and rec.profile == prof.name and rec.started_with(wanted) and serve.running(api, rec))


def _run_locked(cluster: Cluster, inv: Inventory, prof: profiles.Profile, secrets: dict[str, str],
                progress: Progress, dry_run: bool, replace: bool, t0: float) -> Outcome | Plan:
    report, _ = preflight.run(inv, prof, cluster=cluster)
    blocking = [r for r in report.failed if r.id not in REPAIRED_BY_UP]
    if blocking:
        raise StageError("preflight", [StepFailure(r.node, r.id, r.detail, fix=r.fix) for r in blocking],
                         blocking[0].fix)
    serving = _serving(cluster, inv, prof, report.facts, secrets)
    plan = make_plan(inv, prof, report.facts, serving, replace)
    progress.done("preflight", time.monotonic() - t0, f"{len(report.results)} checks")
    if dry_run:
        return plan
    for note in plan.notes:
        progress.info(note)
    if plan.unchanged:
        rec = serve.read_record(cluster.head.docker().api, plan.head_container)
        port = prof.serve.port or inv.cluster.api_port
        return Outcome(True, f"http://{cluster.head.address}:{port}/v1", prof.served_model_name, rec.pid if rec else None, {})
    runner = Runner(cluster, plan, report.facts, secrets, progress)
    try:
        runner._timed("image", runner.image)
        if plan.containers:
            runner._timed("containers", runner.containers)
            runner._timed("ray", runner.ray)
            runner._timed("probe", runner.probe)
        result: dict = {}

        def do_serve() -> str:
            rec, took = runner.serve()
            result["rec"] = rec
            return f"ready after {took:.1f}s"
        runner._timed("serve", do_serve)
    except BaseException as e:  # a failed stage, Ctrl-C, or a bug: undo this run's changes, then report
        progress.info("rolling back what this run created")
        try:
            runner.rollback()
        except Exception as rb:  # report the original failure; the rollback's goes to the log
            _log.warning("rollback failed", error=str(rb))
        lost = {h.name: h.lost for h in cluster.hosts.values() if getattr(h, "lost", "")}
        if lost and not isinstance(e, KeyboardInterrupt):
            # the root cause: a host stopped answering; what failed on it after is only a symptom
            others = [f for f in getattr(e, "failures", []) if f.host not in lost]
            fix = (f"rolled back on the hosts that answer; {', '.join(lost)} could not be rolled back: check its "
                   "network, then sparkcluster down (removes what is left there) and sparkcluster up")
            raise StageError(runner.stage, [StepFailure(n, runner.stage, why, fix=fix) for n, why in lost.items()] + others,
                             fix) from e
        raise
    port = plan.serve.port
    return Outcome(False, f"http://{cluster.head.address}:{port}/v1", plan.serve.model, result["rec"].pid, runner.seconds)


__all__ = ["run", "make_plan", "Plan", "Step", "Outcome", "Progress", "STAGES", "checks"]
