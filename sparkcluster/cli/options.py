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


INVENTORY_META = "sparkcluster.inventory_path"  # a subcommand's -i, in ctx.meta


# shell completion of the names a command line takes: profiles (`--profile`, `profile show NAME`) and
# the inventory's nodes (`--node`). Read only when the shell asks; nothing here runs otherwise.
def complete_profiles(ctx: click.Context, _param, incomplete: str) -> list[str]:
    from sparkcluster.config import profile  # for start-up speed: only when the shell asks

    try:
        return [n for n in profile.available() if n.startswith(incomplete)]
    except Exception:  # noqa: BLE001 - a completion never fails the shell
        return []


def complete_nodes(ctx: click.Context, _param, incomplete: str) -> list[str]:
    from sparkcluster.config import inventory  # for start-up speed: only when the shell asks

    path = ctx.meta.get(INVENTORY_META) or ctx.find_root().params.get("inventory_path")
    try:
        return [n.name for n in inventory.load(path).nodes if n.name.startswith(incomplete)]
    except Exception:  # noqa: BLE001 - no inventory yet: nothing to offer
        return []


COMPLETERS = {"profile_name": complete_profiles, "node": complete_nodes, "node_name": complete_nodes}
