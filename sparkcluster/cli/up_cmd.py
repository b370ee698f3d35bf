"""`sparkcluster up --profile NAME`: from two bare Sparks to an endpoint that answers."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from sparkcluster import redact
from sparkcluster.cli.common import profile_or_usage
from sparkcluster.cli.main import cli
from sparkcluster.cli.options import env_file_option
from sparkcluster.config.images import check_dockerfile
from sparkcluster.config.profile import shadow_notice
from sparkcluster.config.secrets import API_KEY, ENV_FILE_HELP, generate_api_key, key_file, load_secrets
from sparkcluster.config.service_profile import is_service
from sparkcluster.deployment import deployments
from sparkcluster.monitor.planned import planned
from sparkcluster.steps.walk import StageProgress
from sparkcluster.up import bringup, service_up
from sparkcluster.up.plan import Plan


def _distinct(nodes: tuple[str, ...]) -> tuple[str, ...]:
    twice = sorted({n for n in nodes if nodes.count(n) > 1})
    if twice:
        raise click.BadParameter(f"{', '.join(twice)} given more than once", param_hint="--node")
    return nodes


class RichProgress(StageProgress):
    def __init__(self, console: Console):
        self.c = console
        self._bars: Progress | None = None
        self._tasks: dict[str, int] = {}
        self._last_info = ""

    def stage(self, name: str) -> None:
        self.c.print(f"[bold]▸ {name}[/]", highlight=False)

    def done(self, name: str, seconds: float, note: str = "") -> None:
        if self._bars:
            self._bars.stop()
            self._bars = None
        self.c.print(
            f"[green]✓ {name}[/] {seconds:.1f}s" + (f"  [dim]{redact.mask(note)}[/]" if note else ""), highlight=False
        )

    def info(self, text: str) -> None:
        # the same waiting line every second is noise; print it when it changes
        key = text.split(": ", 1)[-1]
        if key != self._last_info:
            self._last_info = key
            self.c.print(f"  [dim]{redact.mask(text)}[/]", highlight=False)

    def bytes(self, node: str, sent: int, total: int) -> None:
        if self._bars is None:
            self._bars = Progress(
                TextColumn("  {task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                console=self.c,
                transient=False,
            )
            self._bars.start()
        if node not in self._tasks:
            self._tasks[node] = self._bars.add_task(node if "->" in node else f"image -> {node}", total=total or None)
        # the image's size is an estimate of the saved stream (tar headers add a little)
        self._bars.update(self._tasks[node], completed=sent, total=max(total, sent) if total else None)


def run_up(*args, **kwargs):
    """`up` (up/bringup.run) with monitoring's part in planned work around it (monitor/planned): the
    nodes it touches silenced while it runs and for a grace period after, the deployments running
    then scraped. The CLI composes the two, as `down` does; `upgrade` and `rollback` get this for the
    `up`s inside them."""
    return bringup.run(*args, monitoring=planned, **kwargs)


@cli.command()
@click.option("--profile", "-p", "profile_name", default=None, help="Profile to serve (default: the inventory's).")
@env_file_option(f"Where HF_TOKEN and VLLM_API_KEY live (mode 0600); {ENV_FILE_HELP}.")
@click.option("--dry-run", is_flag=True, help="Print the plan, every command and API call per host; change nothing.")
@click.option(
    "--offline",
    is_flag=True,
    help="With --dry-run: the plan from the inventory and profile alone, connecting to nothing; "
    "it says which decisions wait for the nodes' facts.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="With --dry-run: the steps as a JSON list (id, stage, host, description)."
)
@click.option(
    "--node",
    "node",
    multiple=True,
    callback=lambda ctx, param, v: _distinct(v),
    help="Run the profile on this node only (repeat for a subset of "
    "the nodes: a pair of four); the profile's TP x PP is the named nodes' GPUs.",
)
@click.option("--replace", is_flag=True, help="Replace what serves another profile on the nodes this run needs.")
@click.option(
    "--beside",
    is_flag=True,
    help="Start beside what serves on the nodes this run needs, with its own containers and ports, "
    "when every node's memory holds all of them plus the floor.",
)
@click.option(
    "--smoke",
    is_flag=True,
    help="Once serving: a short single-stream measurement, compared with the "
    "profile's published figure (a warning when far below).",
)
@click.pass_obj
def up(
    obj,
    profile_name: str | None,
    env_file: Path | None,
    dry_run: bool,
    offline: bool,
    as_json: bool,
    node: tuple[str, ...],
    replace: bool,
    beside: bool,
    smoke: bool,
) -> None:
    """Build, distribute, start the containers on every node and serve the profile's model.

    Across the nodes with the profile's executor: Ray (the default) or vLLM's own multi-node launch (mp).
    """
    if as_json and not dry_run:
        raise click.UsageError("--json goes with --dry-run (a real up logs its steps with --log-format json)")
    if offline and not dry_run:
        raise click.UsageError("--offline goes with --dry-run (a real up needs the nodes)")
    if replace and beside:
        raise click.UsageError("--replace takes the others down, --beside keeps them: choose one")
    inv = obj.inventory()
    prof = profile_or_usage(inv, profile_name, service=True)
    if not is_service(prof) and (note := shadow_notice(prof.path, prof.name)):
        click.echo(note, err=True)  # a profile of yours that shares a shipped name is the one used
    if is_service(prof):  # issue 60 item 2: a service beside the models
        if smoke:
            raise click.UsageError(f"--smoke measures a model's engine; '{prof.name}' is a service")
        _up_service(
            inv, prof, node, env_file, dry_run=dry_run, offline=offline, as_json=as_json, beside=beside, replace=replace
        )
        return
    check_dockerfile(prof, len(inv.nodes))  # before any connection: the image's Dockerfile is in this install
    secrets = load_secrets(env_file, prof)
    err = Console(stderr=True, highlight=False)
    with_api_key(env_file, secrets, dry_run, err)
    result = run_up(
        inv,
        prof,
        secrets,
        RichProgress(err),
        dry_run=dry_run,
        offline=offline,
        replace=replace,
        beside=beside,
        node=node,
        command=f"up --profile {prof.name}" + deployments.node_flags(node),
    )
    if isinstance(result, Plan):
        click.echo(result.as_json() if as_json else result.render())
        return
    if result.unchanged:
        where = f" on {', '.join(node)}" if node else ""
        click.echo(
            f"nothing to do: {inv.cluster.name} already serves '{prof.name}'{where} (vllm serve pid {result.pid})"
        )
    elif prof.on_demand.enabled and result.pid is None:
        click.echo(
            f"on standby: '{result.model}' starts on demand, through the gateway (sparkcluster gateway up), "
            f"and stops after {prof.on_demand.idle_ttl_s:g}s idle"
        )
    else:
        total = sum(result.seconds.values())
        pp = prof.serve.pipeline_parallel_size
        click.echo(
            f"serving '{result.model}' with tensor parallel {prof.serve.tensor_parallel_size}"
            + (f" x pipeline parallel {pp}" if pp > 1 else "")
            + f" in {total:.0f}s"
        )
    auth = ' -H "Authorization: Bearer $VLLM_API_KEY"' if "VLLM_API_KEY" in secrets else ""
    click.echo(f"endpoint: {result.endpoint}")
    base = result.endpoint
    if inv.cluster.engines_listen == "control":
        from sparkcluster.deployment.endpoint import ssh_forward  # the hint only where it is printed

        part = deployments.target(inv, prof, node).at_slot(result.slot)
        forward, base = ssh_forward(part, urlsplit(result.endpoint).port or inv.cluster.api_port)
        side = "on its node only" if part.alone else "on the cluster's own network only"
        click.echo(f"door:     the engine listens {side}: clients come through the gateway (sparkcluster gateway up)")
        click.echo(f"reach:    from this machine, keep open: {forward}   then {base}")
    click.echo(f"model:    {result.model}")
    click.echo(
        f"try:      curl -s {base}/chat/completions{auth} -H 'Content-Type: application/json' "
        f'-d \'{{"model": "{result.model}", "messages": [{{"role": "user", "content": "Hello"}}]}}\''
    )
    if smoke:
        from sparkcluster.deployment.deployments import target  # only `up --smoke` needs it

        _smoke(target(inv, prof, node).at_slot(result.slot), prof, secrets, err)  # its own container and port


def with_api_key(env_file: Path | None, secrets: dict[str, str], dry_run: bool, err: Console) -> None:
    """Every engine gets VLLM_API_KEY whatever its profile's `secrets`: with none found, a real run
    generates one, writes it 0600 to the .env the command reads and says where (never the value);
    its dry run says it would (the plan warns too). `up`, `upgrade` and `rollback` call it."""
    if secrets.get(API_KEY):
        return
    if dry_run:
        err.print(
            f"note: no {API_KEY} found: a real run generates one and writes it to {key_file(env_file)} (mode 0600)",
            highlight=False,
            soft_wrap=True,
        )
        return
    path = generate_api_key(env_file, secrets)
    err.print(
        f"generated {API_KEY} (the key clients send to the engine) and wrote it to {path} (mode 0600); "
        f"read it there: it is never printed",
        highlight=False,
        soft_wrap=True,
    )


def _up_service(inv, svc, node: tuple[str, ...], env_file, *, dry_run, offline, as_json, beside, replace) -> None:
    """`up` of a service's profile (up/service_up): its container on one node, supervised. Its
    secrets (`[[secrets]]`) from the environment or the 0600 .env, as an engine's: all of them for a
    real run; a dry run prints none of them either way."""
    if offline:
        raise click.UsageError("--offline is for a model's plan; a service's dry run reads the node's deployments")
    err = Console(stderr=True, highlight=False)
    names = [s.name for s in svc.secrets]
    secrets = load_secrets(env_file, names=names, required=not dry_run) if names else {}
    result = service_up.run(
        inv,
        svc,
        RichProgress(err),
        secrets=secrets,
        monitoring=planned,
        node=node,
        dry_run=dry_run,
        beside=beside,
        replace=replace,
        command=f"up --profile {svc.name}" + deployments.node_flags(node),
    )
    if isinstance(result, service_up.ServicePlan):
        click.echo(result.as_json() if as_json else result.render())
        return
    if result.unchanged:
        click.echo(f"nothing to do: {inv.cluster.name} already serves '{svc.name}' (service pid {result.pid})")
    else:
        click.echo(f"serving service '{svc.name}' in {sum(result.seconds.values()):.0f}s")
    click.echo(f"endpoint: {result.endpoint}")
    click.echo(f"routes:   {', '.join(svc.routes)} (through the gateway: sparkcluster gateway up)")
    click.echo(f"health:   curl -s {result.endpoint}{svc.health}")


def _smoke(inv, prof, secrets: dict[str, str], err: Console) -> None:
    """`vllm bench serve` at concurrency 1 inside the head container, after the endpoint is ready."""
    from sparkcluster.bench import runner, smoke  # only `up --smoke` loads the benchmark

    with runner.connect(inv) as cluster:
        tok_s, expected, verdict = smoke.smoke_after_up(cluster.hosts[inv.head.name], inv, prof, secrets)
    line = smoke.smoke_message(tok_s, expected, verdict)
    if verdict == "ok" or verdict == "unknown":
        click.echo(line)
    else:
        err.print(f"[yellow]warning:[/] {redact.mask(line)}")
