"""Options several commands take with one meaning. This module imports only click, since the
top-level command (`cli/main`) uses it too and `--help` must not pay for pydantic or structlog."""

from __future__ import annotations

from pathlib import Path

import click


def env_file_option(help: str):
    """`--env-file PATH`: the .env a command reads its secrets from; `help` says which ones."""
    return click.option("--env-file", type=click.Path(path_type=Path), default=None, help=help)


def inventory_option(help: str):
    """`--inventory/-i PATH` into `inventory_path`: the global one, or a subcommand's override."""
    return click.option("--inventory", "-i", "inventory_path", type=click.Path(path_type=Path), default=None, help=help)
