"""Image checks: the cluster image is on every node with one ID, its base image agrees across
nodes, and `ray` runs in it."""

from __future__ import annotations

from sparkcluster.checks.registry import Context, Report, check


@check("image.same", "Cluster image present, same ID everywhere")
def image_same(ctx: Context, r: Report) -> None:
    img = ctx.expect.image
    if not img:
        return
    ids = {n: f.image_id for n, f in ctx.facts.items() if f.docker}
    head = ctx.inventory.head.name
    ref = ids.get(head)
    for n, i in ids.items():
        if i is None:
            r.warn(
                n, f"{img} is not on this node yet", "sparkcluster up builds it on the head and sends it to the workers"
            )
        elif ref is not None and i != ref:
            r.fail(
                n,
                f"{img} is {i[:19]} here but {ref[:19]} on {head}",
                "run sparkcluster up: it re-sends the head's image to nodes whose image ID differs",
            )
        else:
            r.ok(n, i[:19])


@check("image.base-same", "Base image, where present, has the same ID on every node")
def image_base_same(ctx: Context, r: Report) -> None:
    # a tag re-pushed upstream and pulled on different days is another base: the worker then holds
    # none of the cluster image's layers above the first difference, the whole image moves, and
    # anything built on each node drifts apart
    base = ctx.expect.base_image
    if not base:
        return
    ids = {n: f.base.id for n, f in ctx.facts.items() if f.docker and f.base is not None}
    if not ids:
        return
    head = ctx.inventory.head.name
    ref = ids.get(head) or sorted(ids.values())[0]
    where = head if head in ids else "another node"
    for n, i in ids.items():
        if i != ref:
            r.warn(
                n,
                f"{base} is {i[:19]} here but {ref[:19]} on {where}: the whole cluster image will move to it",
                f"on every node: docker pull {base} (or docker save {base} on {where} and docker load it here), "
                "then sparkcluster doctor",
            )
        else:
            r.ok(n, i[:19])


@check("image.ray", "`ray` runs in the cluster image")
def image_ray(ctx: Context, r: Report) -> None:
    if not ctx.expect.image:
        return
    for n, f in ctx.facts.items():
        if ctx.expect.executor != "ray":
            r.skip(n, f"executor {ctx.expect.executor}: the base image is served as it is, no Ray in it")
            continue
        if f.image_id is None:
            continue
        if f.image_ray:
            r.ok(n, f.image_ray)
        else:
            r.fail(
                n,
                f"`ray --version` failed in {ctx.expect.image}: {f.image_ray_error}",
                "rebuild with images/Dockerfile.vllm-ray (NGC 26.05 dropped Ray): sparkcluster up does this",
            )
