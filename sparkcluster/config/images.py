"""The cluster image: the profile's base image plus a pinned Ray (images/Dockerfile.vllm-ray)."""

from __future__ import annotations

from pathlib import Path

from sparkcluster.config.inventory import Inventory

# Pinned: an unpinned install drifts between nodes built on different days (docs/field-notes.md, "Bring-up").
RAY_VERSION = "2.60.0"
DOCKERFILE = Path(__file__).resolve().parents[2] / "images" / "Dockerfile.vllm-ray"


def image_ref(inv: Inventory, prof) -> str:
    return f"{inv.cluster.image_repo}:{prof.image_tag(RAY_VERSION)}"
