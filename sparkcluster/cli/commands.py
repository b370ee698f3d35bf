"""Registers every subcommand module on the `cli` group (one import per module)."""

from . import doctor, down, profile, up  # noqa: F401
