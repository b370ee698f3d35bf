"""The cluster image: the profile's base image plus a pinned Ray (images/Dockerfile.vllm-ray)."""

from __future__ import annotations

from pathlib import Path

from sparkcluster.config.inventory import Inventory

# Pinned: an unpinned install drifts between nodes built on different days (docs/field-notes.md, "Bring-up").
RAY_VERSION = "2.60.0"
DOCKERFILE = Path(__file__).resolve().parents[2] / "images" / "Dockerfile.vllm-ray"


def image_ref(inv: Inventory, prof) -> str:
    """The image every node's container runs: with executor "mp" (issue 28) the profile's base image
    as it is (no Ray layer to add), else the base plus the pinned Ray, built once on the head."""
    if prof.executor == "mp":
        return prof.image.ref
    return f"{inv.cluster.image_repo}:{prof.image_tag(RAY_VERSION)}"
