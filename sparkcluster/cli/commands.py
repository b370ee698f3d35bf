"""Registers every subcommand module on the `cli` group (one import per module)."""

from . import doctor, down, init, logs, profile, status, up  # noqa: F401
