"""The cluster image: the profile's base image plus a pinned Ray (images/Dockerfile.vllm-ray, shipped with
the package: config/shipped)."""

from __future__ import annotations

from sparkcluster.config import shipped
from sparkcluster.config.inventory import Inventory
from sparkcluster.errors import InputError

# Pinned: an unpinned install drifts between nodes built on different days (docs/field-notes.md, "Bring-up").
RAY_VERSION = "2.60.0"
DOCKERFILE = shipped.images_dir() / "Dockerfile.vllm-ray"


def image_ref(inv: Inventory, prof) -> str:
    """The image every node's container runs: with executor "mp" (issue 28) the profile's base image
    as it is (no Ray layer to add), else the base plus the pinned Ray, built once on the head."""
    if prof.executor == "mp":
        return prof.image.ref
    return f"{inv.cluster.image_repo}:{prof.image_tag(RAY_VERSION)}"


def check_dockerfile(prof) -> None:
    """Before `up` connects: the Dockerfile it builds the cluster image from is there (an install made
    without the package's data would otherwise fail half-way, on the head). Executor "mp" builds nothing."""
    if prof.executor != "mp" and not DOCKERFILE.is_file():
        raise InputError(
            f"the cluster image's Dockerfile is missing from this install: {DOCKERFILE}",
            "reinstall sparkcluster from a built wheel or a checkout (README, Install), which carry it",
        )
