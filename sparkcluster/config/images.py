"""The cluster image: the profile's base image plus a pinned Ray (images/Dockerfile.vllm-ray, shipped with
the package: config/shipped)."""

from __future__ import annotations

from sparkcluster.config import shipped
from sparkcluster.config.inventory import Inventory
from sparkcluster.errors import InputError

# Pinned: an unpinned install drifts between nodes built on different days (docs/field-notes.md, "Bring-up").
RAY_VERSION = "2.60.0"
DOCKERFILE = shipped.images_dir() / "Dockerfile.vllm-ray"


def uses_ray(nodes: int, prof) -> bool:
    """Whether Ray spans the deployment: several nodes unless the profile's executor is vLLM's own (mp,
    the multi-node launch); one node only if the profile asks for Ray (`distributed_executor_backend = "ray"`)."""
    if prof.executor == "mp":
        return False
    return nodes > 1 or prof.serve.distributed_executor_backend == "ray"


def executor_of(nodes: int, prof) -> str:
    """What runs the ranks, as `up`'s plan and the containers' label say it: "ray"; vLLM's own
    multi-node launch "mp"; or "uni", vLLM's one-process executor, which it picks for a world of one
    rank (one node's one GPU) when no backend is named (vLLM's ParallelConfig: uni for world_size 1)."""
    if uses_ray(nodes, prof):
        return "ray"
    return "mp" if nodes > 1 or prof.world_size > 1 else "uni"


def served_as_pulled(nodes: int, prof) -> str:
    """Why the profile's base image is served as it is (no Ray to add, nothing built: pulled by the
    owner), or "" when the cluster image is built."""
    if uses_ray(nodes, prof):
        return ""
    return 'executor "mp"' if prof.executor == "mp" else "one node without Ray"


def image_ref(inv: Inventory, prof) -> str:
    """The image every node's container runs: without Ray (executor "mp", or one node) the
    profile's base image as it is (no Ray layer to add), else the base plus the pinned Ray, built
    once on the head."""
    if not uses_ray(len(inv.nodes), prof):
        return prof.image.ref
    return f"{inv.cluster.image_repo}:{prof.image_tag(RAY_VERSION)}"


def check_dockerfile(prof, nodes: int) -> None:
    """Before `up` connects: the Dockerfile it builds the cluster image from is there (an install made
    without the package's data would otherwise fail half-way, on the head). Without Ray nothing is built."""
    if uses_ray(nodes, prof) and not DOCKERFILE.is_file():
        raise InputError(
            f"the cluster image's Dockerfile is missing from this install: {DOCKERFILE}",
            "reinstall sparkcluster from a built wheel or a checkout (README, Install), which carry it",
        )
