"""The image stage: build the cluster image on the head when it lacks it, send it to each worker
whose image differs (head to worker over the control link, verified by image ID), and check that
`ray` runs in the image wherever the image is new or its Ray is not known yet.

A worker gets only the layers it lacks, as an archive into `docker load`, which finds the others by
chain ID. The head reads those layers from its own layer store (movement/layerstore), so what it
reads follows the delta, not the image; when it cannot, `docker save` with the held layers left
out (movement/transfer). Not through a registry on the head: on the classic image store (a
Spark's Docker 28, the testbed's 20.10) `docker pull` skips a layer only when the engine already
maps its compressed digest to a diff ID, and a head's push recompresses every layer into digests
no worker has seen, so each worker would download the NGC base once more (perf/README.md, "How
image layers move")."""

from __future__ import annotations

import dataclasses
import io
import shlex
import tarfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

import docker.errors

from sparkcluster import log
from sparkcluster.config.images import DOCKERFILE, uses_ray
from sparkcluster.errors import EngineUnreachable, StageError
from sparkcluster.movement import chain, layers, layerstore, stream, transfer
from sparkcluster.remote import dockerapi
from sparkcluster.steps.base import Step, fail

if TYPE_CHECKING:
    from sparkcluster.up.execute import UpRun
    from sparkcluster.up.plan import Plan

_log = log.get(__name__)
STAGE = "image"


def ray_version_command(image: str) -> str:
    return shlex.join(["docker", "run", "--rm", "--network", "none", "--entrypoint", "ray", image, "--version"])


def steps(plan: Plan) -> list[Step]:
    inv, head = plan.inventory, plan.inventory.head.name
    out = []
    if plan.build is not None:
        args = " ".join(f"--build-arg {k}={v}" for k, v in plan.build.items())
        out.append(
            Step(
                STAGE,
                head,
                "build",
                "build the cluster image",
                f"Engine API build: docker build --network host {args} -t {plan.image} -f {DOCKERFILE.name} .",
                run=build,
            )
        )
    for w in plan.send_to if len(plan.send_to) == 1 else ():
        node = inv.node(w)
        # after a build the head's new ID is known only at run time: the worker may already hold it
        when = "the head's image ID, read after the build, differs from this node's" if plan.build is not None else ""
        out.append(
            Step(
                STAGE,
                w,
                "receive",
                "receive the image from the head",
                (layerstore.describe if _reads_store(plan, [w]) else transfer.describe)(
                    plan.image, head, str(inv.head.control_ip), w, str(node.control_ip)
                )
                + "; "
                + planned_layers(plan, w),
                run=lambda r, w=w: send(r, w),
                when=when,
                skip=(lambda r, w=w: _same_image(r, w)) if when else None,
            )
        )
    for n in inv.nodes:
        if not uses_ray(len(inv.nodes), plan.profile):  # no Ray in the image to check (issue 28)
            break
        if n.name in plan.send_to:
            # it gets the head's image, its ID checked equal (verify), and an image ID is its
            # content's digest: the head's Ray, known from its facts or checked here, is this copy's.
            # A container of its own cost a delta's stage 3.4 s of its 11.4 on the testbed (issue 40)
            continue
        if plan.build is not None or not plan.facts[n.name].image_ray:
            out.append(
                Step(
                    STAGE,
                    n.name,
                    "ray-version",
                    "check ray in the image",
                    ray_version_command(plan.image),
                    run=lambda r, n=n.name: ray_in_image(r, n),
                    parallel="ray-version",
                )
            )
    return out


def _elides(facts) -> bool:
    return facts.docker is not None and transfer.elides(facts.docker.driver_status)


def _reads_store(plan: Plan, workers: list[str]) -> bool:
    """Whether the plan expects a delta every receiving worker's store can take (the layers are then
    read from the head's layer store; _stream_delta)."""
    hf = plan.facts.get(plan.inventory.head.name)
    wfs = [plan.facts.get(w) for w in workers]
    if hf is None or hf.docker is None or any(f is None for f in wfs):
        return False
    img = hf.image_layers if plan.build is None and hf.image_layers is not None else hf.base
    if img is None:
        return False
    d = layers.shared_delta(img, [(f.layer_chains, _elides(f)) for f in wfs])
    return bool(d.skip) and d.elide


def planned_layers(plan: Plan, worker: str) -> str:
    """Which layers (count, size) move to `worker`, from the facts gathered in preflight."""
    f, hf = plan.facts.get(worker), plan.facts.get(plan.inventory.head.name)
    if f is None or hf is None:
        return "layers: unknown (no facts)"
    if plan.build is None and hf.image_layers is not None:
        return layers.describe(layers.delta(hf.image_layers, f.layer_chains, _elides(f)), worker)
    if hf.base is not None:
        # the build's own layers are known only after it; the base's are known now
        d = layers.delta(hf.base, f.layer_chains, _elides(f))
        return (
            f"the layers the build adds, plus {d.moving} of the base's {d.total} layers "
            f"({layers.mb(d.move_bytes)}) to {worker}"
            + ("" if d.elide else ": its image store cannot skip layers it holds")
        )
    return f"the whole image to {worker} (the head's layers are known only after the build)"


def summary(done: list[tuple[Step, object]]) -> str:
    notes = [v for s, v in done if s.action in ("build", "receive") and v]
    return ", ".join(notes) or "in place on every node"


@dataclass(frozen=True)
class HeadImage:
    """The head's image as its engine describes it (the image stage's state), read once, after a build."""

    info: dict


def head_image(r: UpRun) -> dict:
    return (r.find(HeadImage) or r.put(HeadImage(r.cluster.head.docker().api.inspect_image(r.plan.image)))).info


def _same_image(r: UpRun, worker: str) -> str | None:
    return "it already holds the head's image" if r.facts[worker].image_id == head_image(r)["Id"] else None


def image_id(host, image: str) -> str | None:
    """The image's ID on the host, None when it has no such image (an engine error raises)."""
    try:
        return host.docker().api.inspect_image(image)["Id"]
    except docker.errors.NotFound:  # ImageNotFound, or a plain 404 from older engines
        return None


def build(r: UpRun) -> str:
    head, plan = r.cluster.head, r.plan
    api = head.docker().api
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tar:
        tar.add(str(DOCKERFILE), arcname="Dockerfile")
    ctx.seek(0)
    tail: list[str] = []
    try:
        for chunk in api.build(
            fileobj=ctx,
            custom_context=True,
            tag=plan.image,
            buildargs=plan.build,
            network_mode="host",
            rm=True,
            forcerm=True,
            decode=True,
            pull=False,
        ):
            if "stream" in chunk:
                tail.extend(x for x in chunk["stream"].splitlines() if x.strip())
                tail = tail[-20:]
            if "error" in chunk:
                raise fail(
                    STAGE,
                    head.name,
                    "docker build",
                    chunk["error"].strip(),
                    f"docker build -t {plan.image} images/",
                    "\n".join(tail),
                    "read the build output above; the base image must exist on the head "
                    f"(docker pull {plan.profile.image.ref})",
                )
    except StageError:
        raise
    except (docker.errors.DockerException, EngineUnreachable, *dockerapi.UNREACHABLE) as e:
        # the engine refused or the stream broke: name it with the output so far
        raise fail(STAGE, head.name, "docker build", str(e), None, "\n".join(tail)) from None
    return "built on " + head.name


def ray_in_image(r: UpRun, node: str) -> str:
    cmd = ray_version_command(r.plan.image)
    res = r.cluster.hosts[node].run(cmd, timeout=120, warn=True)
    if not res.ok:
        raise fail(
            STAGE,
            node,
            "ray in the image",
            "`ray --version` failed in the image",
            cmd,
            res.tail(),
            "the image must be built from images/Dockerfile.vllm-ray (NGC 26.05 has no Ray)",
        )
    return res.stdout.strip()


def _disk_needed(r: UpRun, head, worker, size: int, layers: list[str]) -> int | None:
    """What docker load will need on the worker, from the layers it already holds; None when the
    engines cannot say (the transfer then goes ahead, and a full disk fails it cleanly)."""
    try:
        hist = head.docker().api.history(r.plan.image)
        sizes = [e.get("Size", 0) for e in reversed(hist) if e.get("Size", 0) > 0]
        api = worker.docker().api
        present = []
        for img in api.images():
            try:
                rootfs = api.inspect_image(img["Id"]).get("RootFS") or {}
            except docker.errors.NotFound:  # removed meanwhile
                continue
            present.append((rootfs.get("Layers") or [], img.get("Size", 0)))
    except (docker.errors.APIError, EngineUnreachable) as e:  # no estimate, not a failure
        _log.warning("could not estimate the disk the image needs", node=worker.name, error=str(e))
        return None
    return transfer.disk_needed(size, layers, present, sizes)


def run_delta(r: UpRun, worker: str) -> layers.Delta:
    """The same computation as the plan's (planned_layers), over the head's image as it is now:
    after a build, its layers are read from the engine."""
    wf = r.facts[worker]
    return layers.delta(head_layers(r), wf.layer_chains, _elides(wf))


def head_layers(r: UpRun) -> layers.ImageLayers:
    """The head's image's layers as they are now (after a build, read from the engine)."""
    hf = r.facts[r.inv.head.name]
    info = head_image(r)
    if hf.image_layers is not None and hf.image_layers.id == info["Id"]:
        img = hf.image_layers
    else:
        diff_ids = tuple((info.get("RootFS") or {}).get("Layers") or [])
        try:
            hist = [e.get("Size", 0) for e in reversed(r.cluster.head.docker().api.history(r.plan.image))]
            sizes = layers.sizes_from_history(hist, len(diff_ids))
        except (docker.errors.APIError, EngineUnreachable):
            sizes = None
        img = layers.ImageLayers(info["Id"], diff_ids, sizes)
    return img


def check_disk(r: UpRun, worker_name: str, d: layers.Delta, size: int, image_layers: list[str]) -> None:
    """Fails naming the worker when its docker root lacks the room docker load needs."""
    head, worker = r.cluster.head, r.cluster.hosts[worker_name]
    wf = r.facts[worker.name]
    free = list(wf.disks.values())[0].available if wf.disks else None
    elided_need = d.elide and d.held > 0 and d.move_bytes is not None
    if elided_need:
        # docker load unpacks what arrives under the docker root, then stores it: twice what moves
        need = 2 * (d.move_bytes or 0)
    else:
        need = _disk_needed(r, head, worker, size, image_layers) if free is not None and size else None
    if free is not None and need and free < need * 1.05:
        raise fail(
            STAGE,
            worker.name,
            "receive the image",
            f"not enough disk: {free / 2**30:.1f} GiB free in "
            f"{wf.docker.root_dir if wf.docker else 'the docker root'}; docker load needs "
            f"{need / 2**30:.1f} GiB (it unpacks "
            + (
                f"the {(d.move_bytes or 0) / 2**30:.1f} GiB of layers it lacks before storing them)"
                if elided_need
                else f"the whole {size / 2**30:.1f} GiB image before storing the layers the node lacks)"
            ),
            fix=f"free {(need * 1.05 - free) / 2**30:.1f} GiB more on {worker.name} (`docker image prune -a` "
            "removes the images no container uses), then sparkcluster up",
        )


def send(r: UpRun, worker_name: str) -> str:
    """The image to one worker, over the control link."""
    got, d = stream_image(r, [chain.control(r.inv, r.inv.head.name, worker_name)], run_delta(r, worker_name))
    verify(r, worker_name)
    # the bar's own rate needs samples over time; a fast link sends in one burst after docker save
    # has prepared the stream, so the whole transfer's rate is stated here
    what = (
        layers.describe(d, worker_name).replace(f" to {worker_name}", "")
        if d.elide
        else f"the whole image: {worker_name}'s containerd image store cannot skip layers it holds"
    )
    return f"sent to {worker_name}: {got.rate} ({what}){head_time(got, head_image(r).get('Size', 0))}"


def head_time(got: stream.Streamed, size: int) -> str:
    """Where a transfer's time went on the head, for its note. A delta read from the layer store
    reads only what moves. `docker save` writes the whole image into a temporary directory of its
    own before the first byte leaves (moby image/tarexport/save.go: MkdirTemp, then archive.Tar of
    it), whatever the layers left out, so a delta's rate over the whole transfer said little about
    the link (issue 40 item 5: 274 MB at 4 MB/s on a fresh testbed). Layer tars the sender had to
    read in full to learn which they were are named too."""
    out = ""
    if got.first_s is not None and got.sent:
        after = max(got.secs - got.first_s, 1e-3)
        if got.source == "store":
            out = f"; read from the head's layer store: the first byte left after {got.first_s:.1f}s"
        else:
            out = (
                f"; by docker save: the first byte left after {got.first_s:.1f}s (it copies the whole "
                f"{layers.mb(size)} image on the head before it streams)"
            )
        out += f", the rest took {after:.1f}s"
    n, b = got.counts.get("hashed", (0, 0))
    if n:
        out += f"; {n} layer tars ({layers.mb(b)}) hashed on the head: their names did not say which layer"
    return out


def verify(r: UpRun, worker: str) -> None:
    """The worker's image ID is the head's: docker load checked every layer against the config,
    whose digest is the ID. An image of another ID under the name is removed (the name, and the
    image with it when nothing else holds it), so that nothing starts from it."""
    host = r.cluster.hosts[worker]
    got, head_id = image_id(host, r.plan.image), head_image(r)["Id"]
    if got != head_id:
        removed = ""
        if got is not None:
            try:
                host.docker().api.remove_image(r.plan.image)
                removed = f"; {r.plan.image} removed from {worker}"
            except docker.errors.APIError as e:
                removed = f"; removing {r.plan.image} from {worker} failed: {e.explanation or e}"
        raise fail(
            STAGE,
            worker,
            "verify the image",
            f"image ID after the transfer is {got} on {worker}, {head_id} on {r.inv.head.name}{removed}",
        )


def stream_image(r: UpRun, hops: list[chain.Hop], d: layers.Delta) -> tuple[stream.Streamed, layers.Delta]:
    """One stream of the image along `hops` (one hop: a single worker), leaving out the layers `d`
    says every receiving node holds, after checking each has the disk docker load needs. A delta is
    read from the head's layer store (movement/layerstore: only what moves is read); when the head
    cannot read it there, the same delta goes by docker save. Returns the stream and what it carried."""
    info = head_image(r)
    size, image_layers = info.get("Size", 0), (info.get("RootFS") or {}).get("Layers") or []
    for h in hops:
        check_disk(r, h.dst, d, size, image_layers)
    expect = d.move_bytes if d.elide and d.move_bytes else size
    try:
        return _stream_delta(r, hops, d, expect, info["Id"]), d
    except StageError as e:
        # a worker lost a layer since preflight (an image removed meanwhile): docker load names the
        # missing file; the whole image then goes once more
        if not d.skip or "no such file" not in " ".join(f.output_tail for f in e.failures).lower():
            raise
        _log.warning(
            "a worker lacks a layer it held at preflight; sending the whole image", nodes=[h.dst for h in hops]
        )
        d = layers.Delta(d.total, 0, None, d.elide)
        return _stream(r, hops, d, size), d


def _stream_delta(r: UpRun, hops: list[chain.Hop], d: layers.Delta, expect: int, image_id: str) -> stream.Streamed:
    """The delta from the head's layer store, else by docker save. Only a failure of the head's own
    end falls back: one of a worker's is the worker's, whichever way the bytes were read."""
    head = r.inv.head.name
    hf = r.facts.get(head)
    if d.skip and d.elide and hf is not None and hf.docker is not None and hf.docker.root_dir:
        store = (image_id, hf.docker.root_dir)
        try:
            return _stream(r, hops, d, expect, store)
        except StageError as e:
            if e.failures[0].host != head:
                raise
            tail = [x for x in e.failures[0].output_tail.splitlines() if x.strip()]
            _log.warning(
                "could not read the layers from the head's layer store; sending them by docker save",
                reason=" | ".join(tail[-3:]) or e.failures[0].reason,
            )
    return _stream(r, hops, d, expect)


def _stream(
    r: UpRun, hops: list[chain.Hop], d: layers.Delta, expect: int, store: tuple[str, str] | None = None
) -> stream.Streamed:
    """One stream of the image; fails naming the node at fault (stream.culprit). `store`: (image
    ID, docker root) to read the layers `d` moves from the head's layer store; None: docker save."""
    first, image = hops[0], r.plan.image
    if store is None:
        send = lambda port: transfer.send_command(  # noqa: E731
            image, first.dst_ip, port, first.src_ip, d.skip, d.keep, d.order
        )
        source = f"`docker save {image}`"
    else:
        send = lambda port: layerstore.send_command(  # noqa: E731
            image, store[0], store[1], d.order, d.skip, first.dst_ip, port, first.src_ip
        )
        source = f"the layer store under {store[1]} (read by a container of {image})"
    got = stream.run(
        STAGE,
        r.cluster.hosts,
        hops,
        receive=lambda h, fwd: transfer.receive_command(h.dst_ip, h.src_ip, fwd),
        send=send,
        on_sent=lambda n: r.progress.bytes(first.dst, n, max(expect, n)),
        sink="docker load",
        timeout=3600,
        port_on_stdin=store is not None,
    )
    got = dataclasses.replace(got, source="save" if store is None else "store")
    if got.blame is None:
        return got
    res = got.result
    how = (
        "could not forward to the next node: its own copy is whole"
        if res.exit_code == transfer.RELAY_FAILED
        else "refused a frame that was not the head's (another host on the link?): nothing of it loaded"
        if res.exit_code == transfer.REFUSED
        else f"transfer failed (exit {res.exit_code})"
    )
    if len(hops) == 1:  # a single worker: what the failure left on it
        how += _left_on(r, first.dst)
    cut = f"; {', '.join(got.cut)} got a cut stream and loaded nothing" if got.cut else ""
    raise got.failure(STAGE, "send the image", how + cut, source)


def _left_on(r: UpRun, node: str) -> str:
    """What a failed transfer left on the node: an image, and the room in its docker root."""
    host, wf = r.cluster.hosts[node], r.facts[node]
    left = image_id(host, r.plan.image)
    extra = "" if left is None else f" (an image {left[:19]} is left on {node})"
    root = wf.docker.root_dir if wf.docker else "/var/lib/docker"
    df = host.run(f"df -Pk {shlex.quote(root)} | tail -1", timeout=20, warn=True)
    if df.ok and len(df.stdout.split()) > 3 and df.stdout.split()[3].isdigit():
        extra += f"; {int(df.stdout.split()[3]) // 1024} MiB free in {root} on {node}"
    return extra
