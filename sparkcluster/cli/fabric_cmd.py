"""`sparkcluster fabric resume [--dry-run]`: bring a deployment the fabric holds out of the gateway's
rotation back now (issue 75), rather than after the profile's healthy looks. The head's supervisor
holds a serving deployment out when a data port goes down, its GID is lost, its speed drops or an AER
storm hits any of its nodes (node/fabric_watch); its engine keeps running the whole time. This
command leaves a mark in each head container (contract.FABRIC_RESUME_PATH) that its supervisor reads
at its next look: a hold older than the mark ends there, journalled as `fabric resumed`. A fabric
still unhealthy at that look is held again at once: the mark ends a hold, it does not silence one."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

import click

from sparkcluster.cli.events_cmd import journals
from sparkcluster.cli.main import cli
from sparkcluster.errors import InputError
from sparkcluster.node.contract import FABRIC_RESUME_PATH
from sparkcluster.remote.dockerapi import run_in
from sparkcluster.remote.fanout import ConnectedHosts
from sparkcluster.steps.base import Step, render_steps
from sparkcluster.steps.walk import StageProgress, walk

STAGE = "fabric resume"
MARK_ARGV = ["sh", "-c", f"date +%s > {FABRIC_RESUME_PATH}"]


@dataclass
class ResumeRun:
    """The run the resume's steps share (steps/walk.Run)."""

    api: Any
    stage: str = STAGE
    progress: StageProgress = field(default_factory=StageProgress)
    owned: dict = field(default_factory=dict)

    def put(self, value):
        self.owned[type(value)] = value
        return value

    def find(self, kind):
        return self.owned.get(kind)


def resume_steps(node: str, containers: list[tuple[str, str]]) -> list[Step]:
    """One step per deployment headed on `node` (pure): the mark its supervisor reads."""

    def mark(container: str):
        return lambda r: run_in(r.api, container, MARK_ARGV).stdout

    return [
        Step(
            STAGE,
            node,
            f"mark-{profile or container}",
            f"mark the fabric hold of {profile or container} resumed (its supervisor ends it at its next look)",
            detail=f"docker exec {container} {shlex.join(MARK_ARGV)}",
            run=mark(container),
        )
        for container, profile in containers
    ]


@cli.group()
def fabric() -> None:
    """The data-plane fabric while serving: end a fabric hold (sparkcluster status shows one)."""


@fabric.command()
@click.option("--dry-run", is_flag=True, help="Print the steps that would run, then stop.")
@click.option("--json", "as_json", is_flag=True, help="The steps (with --dry-run) or what was marked, as JSON.")
@click.option("--node", default=None, help="The deployments' head node; default: the inventory's head.")
@click.option("--profile", "-p", "profile_name", default=None, help="Only this profile's deployment.")
@click.pass_obj
def resume(obj, dry_run: bool, as_json: bool, node: str | None, profile_name: str | None) -> None:
    """Bring a deployment held out of rotation for its fabric back now."""
    inv = obj.inventory()
    head = inv.node(node) if node else inv.head
    host = ConnectedHosts.connect(inv, [head]).hosts[head.name]
    api = host.docker().api
    heads = journals(api, inv.cluster.name, head.name, profile_name)
    if not heads:
        raise InputError(
            f"no deployment{f' of profile {profile_name!r}' if profile_name else ''} is headed on {head.name}",
            "sparkcluster status",
        )
    steps = resume_steps(head.name, heads)
    if dry_run:
        if as_json:
            click.echo(json.dumps({"steps": [s.public() for s in steps]}))
        else:
            click.echo("\n".join(render_steps(steps)))
        return
    walk(ResumeRun(api), steps)
    marked = [p or c for c, p in heads]
    if as_json:
        click.echo(json.dumps({"marked": marked}))
    else:
        click.echo(
            f"marked {', '.join(marked)}: the supervisor ends a fabric hold at its next look (sparkcluster events)"
        )
