"""Registers every subcommand module on the `cli` group (one import per module)."""

from . import doctor, profile  # noqa: F401
