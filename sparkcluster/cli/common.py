"""Helpers shared by several commands."""

from __future__ import annotations

from sparkcluster.config import profile as profiles
from sparkcluster.config.inventory import Inventory


def load_profile_for(inv: Inventory, name: str | None) -> profiles.Profile | None:
    name = name or inv.cluster.profile
    return profiles.load_profile(name) if name else None
