"""Registers every subcommand module on the `cli` group (one import per module)."""

from . import profile  # noqa: F401
