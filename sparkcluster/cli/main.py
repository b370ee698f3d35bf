"""The `sparkcluster` command: global options, and the one place errors become output.

Each subcommand lives in its own module in this package, imported only when it is asked for.
"""

from __future__ import annotations

import gc
import importlib
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sparkcluster import redact
from sparkcluster.cli.options import COMPLETERS, INVENTORY_META, complete_profiles, inventory_option
from sparkcluster.errors import EXIT_BUG, EXIT_INTERRUPTED, EXIT_USAGE, SparkError, failure

if TYPE_CHECKING:  # structlog and pydantic are imported by the commands that use them, not by --help
    from sparkcluster.config import inventory


@dataclass
class Invocation:
    """What every subcommand gets from the global options (click passes it as `obj`)."""

    inventory_path: Path | None
    log_format: str
    verbose: int = 0
    _inventory: inventory.Inventory | None = field(default=None, repr=False)

    def configure_log(self) -> None:
        from sparkcluster import log  # for start-up speed: structlog loads only once a command runs

        log.configure(level={0: "warning", 1: "info"}.get(self.verbose, "debug"), fmt=self.log_format)

    def inventory(self) -> inventory.Inventory:
        if self._inventory is None:
            from sparkcluster.config import inventory  # for start-up speed: pydantic loads when asked for

            self._inventory = inventory.load(self.inventory_path)
        return self._inventory


class Suggestion(click.UsageError):
    """A mistyped name with one close match: the fix is the command line with the match in its place."""

    def __init__(self, message: str, wrong: str, right: str, ctx: click.Context | None = None):
        super().__init__(message, ctx)
        self.wrong, self.right = wrong, right


def did_you_mean(word: str, choices) -> str | None:
    import difflib  # for start-up speed: only a mistyped name pays for it

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


# the global options, taken after the subcommand too (`status -i f.toml`): each sets what the group's
# own option would have; a subcommand's own option of the same name (`profile show -i`) wins
def _late_inventory(ctx: click.Context, _param, value) -> None:
    if value is not None:
        ctx.meta[INVENTORY_META] = value  # where shell completion finds it (no Invocation then)
        obj = ctx.find_object(Invocation)
        if obj is not None:
            obj.inventory_path = value


def _late_log(ctx: click.Context, param, value) -> None:
    if value:
        obj = ctx.find_object(Invocation)
        if param.name == "late_verbose":
            obj.verbose += value
        else:
            obj.log_format = value
        obj.configure_log()


def _late_globals(cmd: click.Command) -> None:
    if getattr(cmd, "_late_globals", False):
        return
    cmd._late_globals = True
    taken = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    extra = [
        click.Option(
            ["--inventory", "-i", "late_inventory"], type=click.Path(path_type=Path), callback=_late_inventory
        ),
        click.Option(["--log-format", "late_log_format"], type=click.Choice(["text", "json"]), callback=_late_log),
        click.Option(["--verbose", "-v", "late_verbose"], count=True, callback=_late_log),
    ]
    for opt in extra:
        if not set(opt.opts) & taken:
            opt.expose_value, opt.hidden = False, True
            cmd.params.append(opt)
    for p in cmd.params:  # profile and node names complete in the shell (README, "Shell completion")
        fn = COMPLETERS.get(p.name) or (
            complete_profiles if cmd.name in ("show", "lint") and p.name == "name" else None
        )
        if fn is not None and p._custom_shell_complete is None:
            p._custom_shell_complete = fn
    for sub in getattr(cmd, "commands", {}).values():
        _late_globals(sub)


class _Group(click.Group):
    """A group whose mistyped subcommand gets the closest name (`sparkcluster stauts`)."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = did_you_mean(name, self.list_commands(ctx))
            if close:
                raise Suggestion(
                    f"no command {name!r} in {ctx.command_path}: did you mean {close!r}?", name, close, ctx
                )
        return super().resolve_command(ctx, args)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None:
            _late_globals(cmd)
        return cmd


_Group.group_class = _Group


class _LazyGroup(_Group):
    """Imports a subcommand's module when that subcommand is asked for: a quick command like
    `status --json` spends most of its time importing, and need not import the others' libraries."""

    # each command lives in `<name>_cmd.py` of this package; importing it decorates the command onto
    # `cli`. Its one-line help is here too, so `--help` imports no command (a test keeps them equal).
    COMMANDS = {
        "bench": "Measure throughput and latency of the serving cluster with vLLM's own bench.",
        "doctor": "Check every node for what breaks Spark clusters; a fix for each failure.",
        "down": "Stop vllm serve by its PID, then remove sparkcluster's containers.",
        "events": "The supervisor's journal on the head: what it saw and what it did.",
        "fabric": "The fabric while serving: resume a deployment a fabric hold took out of rotation.",
        "gateway": "One endpoint for every model: up, down, status, events, keys, usage, export --litellm.",
        "init": "Discover the hosts and write a draft inventory to review.",
        "logs": "The containers' logs (Ray) and vllm serve's log, from any node.",
        "monitor": "Prometheus, Alertmanager and node_exporter for the cluster: up, down, status, config.",
        "profile": "Model profiles: list, show what each node gets, lint.",
        "rollback": "Return a deployment to its last good serve with another image or revision.",
        "status": "Per deployment and node: container, Ray membership, endpoint, supervisor.",
        "up": "Build, distribute, start the containers on every node and serve the profile's model.",
        "upgrade": "Serve a new image or model revision; roll back by itself unless its canary and bench hold.",
        "weights": "Model weights in the nodes' HF caches: stage, list, remove.",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.COMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in self.COMMANDS:
            importlib.import_module(f"{__package__}.{name}_cmd")
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (name, self.COMMANDS.get(name) or self.commands[name].get_short_help_str())
            for name in self.list_commands(ctx)
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _print_version(ctx: click.Context, _param, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from sparkcluster.config.shipped import version_line  # the standard library only

    click.echo(version_line())
    ctx.exit()


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@inventory_option("Inventory TOML (default: $SPARKCLUSTER_INVENTORY, else ~/.config/sparkcluster/cluster.toml).")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Format of log lines on stderr.",
)
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-v info, -vv debug).")
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version (with the commit it was built from, or the checkout's) and exit.",
)
@click.pass_context
def cli(ctx: click.Context, inventory_path: Path | None, log_format: str, verbose: int) -> None:
    """Bring one to eight DGX Sparks from bare to serving a model (tensor and pipeline parallel, over Ray or
    vLLM's own multi-node launch).

    The options below work after the command too (`sparkcluster status -i f.toml`).

    Exit codes: 0 ok, 1 a check or stage failed (status: degraded), 2 bad input (nothing touched),
    3 status: down, 4 a node could not be reached, 70 a bug (see the debug log), 130 Ctrl-C.
    """
    ctx.obj = Invocation(inventory_path=inventory_path, log_format=log_format, verbose=verbose)
    ctx.obj.configure_log()


def _print_error(err: SparkError) -> None:
    click.echo(redact.mask(f"error: {err.message}"), err=True)
    for line in err.details:
        click.echo(redact.mask(f"  {line}"), err=True)
    if err.fix:
        click.echo(redact.mask(f"fix: {err.fix}"), err=True)


def _wants_json(argv: list[str]) -> bool:
    """`--json` anywhere among the options (before a `--`): a failure is then JSON on stdout too."""
    args = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in args


def failure_json(message: str, exit_code: int, fix: str | None = None, problems=(), details=()) -> str:
    """The one shape of every failure under `--json` (docs/reference/cli.md, "Failures under --json"):
    what a script reads instead of parsing stderr. `problems` holds each node's own part (node,
    error, fix), empty when the failure names no node. The human lines still go to stderr."""
    import json

    return redact.mask(json.dumps(failure(message, fix, problems, exit_code, details), indent=2))


def problems_of(err: BaseException) -> list[dict]:
    """Each node's part of a failure: what the error says per node (errors.problem)."""
    return list(getattr(err, "problems", None) or [])


# old option names, kept for one release as hidden aliases (issue 56: one name per meaning across
# commands): (command words, old) -> new; a positional NODE of `logs` becomes --node. Each use says so.
RENAMED = {
    (("logs",), "--tail"): "--last",
    (("gateway", "export"), "--out"): "--output",
    (("bench",), "--out"): "--output",
}
POSITIONAL_NODE = ("logs",)


GROUPS = ("gateway", "monitor", "profile", "weights")


def _command_words(args: list[str]) -> tuple[int, list[str]]:
    """Where the command's own arguments start in `args`, and the command words before them (global
    options and their values skipped)."""
    words, i = [], 0
    while i < len(args) and args[i] != "--" and len(words) < (2 if words and words[0] in GROUPS else 1):
        a = args[i]
        if a in ("-i", "--inventory", "--log-format"):
            i += 2
            continue
        if not a.startswith("-"):
            words.append(a)
        i += 1
    return i, words


def _old_names(args: list[str]) -> list[str]:
    """The command line with each old option name in its new one, saying so on stderr."""
    start, words = _command_words(args)
    out = list(args[:start])
    rest = args[start:]
    end = rest.index("--") if "--" in rest else len(rest)
    skip = False
    for j, a in enumerate(rest):
        if j >= end or skip:
            out.append(a)
            skip = False
            continue
        name, eq, value = a.partition("=")
        new = RENAMED.get((tuple(words), name))
        if new is not None:
            click.echo(f"warning: {name} is now {new}; {name} goes in the next release", err=True)
            out.append(new + eq + value)
        elif tuple(words) == POSITIONAL_NODE and not a.startswith("-") and (j == 0 or not rest[j - 1].startswith("--")):
            click.echo(
                f"warning: `{' '.join(words)} NODE` is now `{' '.join(words)} --node NODE`; "
                "the positional form goes in the next release",
                err=True,
            )
            out += ["--node", a]
        else:
            out.append(a)
            skip = a in ("--since", "--node", "--last", "--tail", "-i", "--inventory", "--log-format") and not eq
    return out


def _typed_at(args: list[str], wrong: str) -> int | None:
    """Where `wrong` is on the command line: as typed, or as a path that names it (`dir/` for `dir`)."""
    import os.path

    if wrong in args:
        return args.index(wrong)
    return next((i for i, a in enumerate(args) if "/" in a and os.path.normpath(a) == os.path.normpath(wrong)), None)


def _replaced(args: list[str], wrong: str, right: str) -> str:
    """The command line as typed, the close name in place of the mistyped one: a fix that runs as printed."""
    import shlex

    at = _typed_at(args, wrong)
    return "sparkcluster " + shlex.join([*args[:at], right, *args[at + 1 :]])


def _renamed_nodes(args: list[str], nodes: tuple[str, ...]) -> str:
    """The command line as typed with its `--node` options replaced by `nodes` (none: the whole
    inventory); where it names none, `nodes` added at its end (before a `--`)."""
    import shlex

    end = args.index("--") if "--" in args else len(args)
    out: list[str] = []
    at, i = None, 0
    while i < len(args):
        a = args[i]
        if i < end and (a == "--node" or a.startswith("--node=")):
            at = len(out) if at is None else at
            i += 1 if "=" in a else 2
            continue
        out.append(a)
        i += 1
    if at is None:
        at = out.index("--") if "--" in out else len(out)
    out[at:at] = [x for n in nodes for x in ("--node", n)]
    return "sparkcluster " + shlex.join(out)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:  # bare `sparkcluster`: what it can do, not an error
        args = ["--help"]
    args = _old_names(args)
    as_json = _wants_json(args)

    def failed(message: str, code: int, fix: str | None = None, problems=(), details=()) -> int:
        if as_json:
            click.echo(failure_json(message, code, fix, problems, details))
        return code

    try:
        rc = cli.main(args=args, prog_name="sparkcluster", standalone_mode=False)
        # with standalone_mode off, click returns a command's Exit code instead of raising it
        return rc if isinstance(rc, int) else 0
    except SparkError as err:
        if err.replace and _typed_at(args, err.replace[0]) is not None:
            err.fix = _replaced(args, *err.replace)
        elif err.nodes is not None:
            err.fix = _renamed_nodes(args, err.nodes)
        _print_error(err)
        return failed(err.message, err.exit_code, err.fix, problems_of(err), err.details)
    except click.exceptions.Abort as e:  # click makes Ctrl-C an Abort too
        what = "interrupted" if isinstance(e.__cause__, KeyboardInterrupt) else "aborted"
        click.echo(what, err=True)
        return failed(what, EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return failed("interrupted", EXIT_INTERRUPTED)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:  # a bad command line: one line and where the options are
        code = EXIT_USAGE if e.exit_code == 2 else e.exit_code
        ctx = getattr(e, "ctx", None)
        fix = f"see {ctx.command_path if ctx else 'sparkcluster'} --help"
        if isinstance(e, Suggestion):
            fix = _replaced(args, e.wrong, e.right)
        click.echo(f"error: {e.format_message()}", err=True)
        click.echo(f"fix: {fix}", err=True)
        return failed(e.format_message(), code, fix)
    except Exception:  # a bug: the user gets one line, the log gets the traceback
        from sparkcluster import log  # for start-up speed: structlog loads only when needed

        path = log.debug_log_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(redact.mask(traceback.format_exc()))
        except OSError:
            pass
        exc = sys.exc_info()[1]
        message = f"unexpected {type(exc).__name__}: {exc}"
        click.echo(redact.mask(f"error: {message}"), err=True)
        click.echo(f"details: {path}", err=True)
        return failed(message, EXIT_BUG, f"a bug in sparkcluster: please report it with {path}")


def run() -> None:
    rc = main()
    # what the command made lives until the process ends: the collector's passes over it at
    # interpreter exit cost about 0.1 s of every short command (status --json is polled), and
    # free nothing the OS does not. atexit handlers (the log's flush) still run.
    gc.freeze()
    sys.exit(rc)
