"""Helpers shared by several commands."""

from __future__ import annotations

import click

from sparkcluster.config import profile as profiles
from sparkcluster.config.inventory import Inventory


def load_profile_for(inv: Inventory, name: str | None, service: bool = False) -> profiles.Profile | None:
    name = name or inv.cluster.profile
    return profiles.load_profile(name, service=service) if name else None


def profile_or_usage(inv: Inventory, name: str | None, service: bool = False) -> profiles.Profile:
    """The named profile, else the inventory's; a usage error when neither names one. `service`: a
    service's profile (issue 60) is taken too."""
    prof = load_profile_for(inv, name, service)
    if prof is None:
        raise click.UsageError("no profile: pass --profile NAME (see `sparkcluster profile list`)")
    return prof
