"""Errors a user can cause or fix.

Every exception here carries a one-line message and, where we know it, a one-line fix. The CLI
(`sparkcluster.cli.main`) is the only place that turns them into output and exit codes; anything
that is not a `SparkError` is a bug and goes to the debug log with its traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # a check or a stage failed
EXIT_USAGE = 2  # bad command line, inventory or profile: nothing was touched
EXIT_DOWN = 3  # status: nothing of sparkcluster's runs
EXIT_UNREACHABLE = 4  # a node (status: every node) could not be reached over SSH
EXIT_BUG = 70  # a bug in sparkcluster: the traceback is in the debug log (EX_SOFTWARE)
EXIT_INTERRUPTED = 130  # Ctrl-C


class SparkError(Exception):
    exit_code = EXIT_FAILED

    def __init__(self, message: str, fix: str | None = None, *, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        # extra lines shown under the message (one per bad field, last lines of output, ...)
        self.details = details or []
        # (mistyped, close match): where the mistyped word is on the command line, the CLI's fix is
        # that command line with the match in its place
        self.replace: tuple[str, str] | None = None
        # the nodes to name instead (() for none: the whole inventory): where the command line names
        # nodes (--node), the CLI's fix is that command line with these in their place
        self.nodes: tuple[str, ...] | None = None
        # per node, what went wrong there and its own fix: the `problems` of the one `--json` failure
        # shape (`problem`); a failure that names no node has none
        self.problems: list[dict[str, str | None]] = []


def problem(node: str, error: str, fix: str | None = None) -> dict[str, str | None]:
    """One node's part of a failure, as `--json` prints it under `problems`."""
    return {"node": node, "error": error, "fix": fix}


def failure(error: str, fix: str | None, problems=(), exit_code: int = EXIT_FAILED, details=()) -> dict:
    """The one shape of a failure under `--json`, every command's: `ok` false, one line of what
    went wrong, its fix, each node's own part (`problem`), the exit code, the lines under it. A
    command whose failure still has a report (doctor's checks, down's nodes) prints these beside it."""
    return {
        "ok": False,
        "error": error,
        "fix": fix,
        "problems": [dict(p) for p in problems],
        "exit_code": exit_code,
        "details": list(details),
    }


class InputError(SparkError):
    """Bad inventory, profile or command line. Raised before any connection is opened."""

    exit_code = EXIT_USAGE


class ConnectError(SparkError):
    """A host could not be reached or refused us."""

    exit_code = EXIT_UNREACHABLE

    def __init__(self, host: str, message: str, fix: str | None = None, **kw):
        super().__init__(f"{host}: {message}", fix, **kw)
        self.host = host
        self.problems = [problem(host, self.message, fix)]


class HostKeyError(ConnectError):
    """Unknown or changed host key. Never retried, never accepted silently."""


class AuthError(ConnectError):
    """Authentication refused. Never retried."""


class StageError(SparkError):
    """A stage of a plan failed on one or more hosts."""

    def __init__(self, stage: str, failures: list[StepFailure], fix: str | None = None):
        first = failures[0]
        hosts = ", ".join(sorted({f.host for f in failures}))
        super().__init__(f"stage '{stage}' failed on {hosts}: {first.step}: {first.reason}", fix or first.fix)
        self.stage = stage
        self.failures = failures
        for f in failures:
            self.details.extend(f.lines())
        self.problems = [problem(f.host, f"{f.step}: {f.reason}", f.fix or fix) for f in failures]


class StepFailure:
    """What went wrong with one step on one host: enough to act on without a log."""

    def __init__(
        self,
        host: str,
        step: str,
        reason: str,
        command: str | None = None,
        output_tail: str = "",
        fix: str | None = None,
    ):
        self.host = host
        self.step = step
        self.reason = reason
        self.command = command
        self.output_tail = output_tail
        self.fix = fix

    def lines(self) -> list[str]:
        out = [f"[{self.host}] step '{self.step}': {self.reason}"]
        if self.command:
            out.append(f"[{self.host}]   command: {self.command}")
        for line in self.output_tail.splitlines()[-10:]:
            out.append(f"[{self.host}]   | {line}")
        return out


class CommandFailed(SparkError):
    """A command on a node exited non-zero or timed out, and its caller did not pass `warn=True`.

    Carries the result (command as run with secrets masked, exit status, last lines), so whoever
    reports it can name the node, the command and what it printed."""

    def __init__(self, result):
        how = f"timed out after {result.duration:.0f}s" if result.timed_out else f"exit {result.exit_code}"
        super().__init__(
            f"{result.host}: command failed ({how}): {result.command[:160]}", details=result.tail().splitlines()
        )
        self.result = result
        self.host = result.host
        self.reason = how
        self.problems = [problem(result.host, self.message)]


class EngineUnreachable(SparkError):
    """The node's Docker Engine did not answer (or the SSH channel to it broke). Never taken for
    "not found": an unreachable engine says nothing about what exists on the node."""

    def __init__(self, host: str, what: str, error: BaseException):
        super().__init__(
            f"{host}: the Docker Engine did not answer ({what}: {error})",
            f"check dockerd on {host} (systemctl status docker), then retry",
        )
        self.host = host
        self.problems = [problem(host, self.message, self.fix)]


class EngineIncompatible(SparkError):
    """The node's Docker Engine answers, but accepts no API version that sparkcluster speaks."""

    def __init__(self, host: str, detail: str, fix: str):
        super().__init__(f"{host}: {detail}", fix)
        self.host = host
        self.problems = [problem(host, self.message, fix)]


class LockHeld(SparkError):
    """Another sparkcluster run holds the cluster lock."""
