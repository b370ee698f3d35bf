"""The outcome of one command, on a host over SSH (`ssh.Host.run`) or in a container through `docker
exec` (`dockerapi.run_in`): both runners answer with it, and `CommandFailed` carries it. It lives
apart from both so that neither runner imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkcluster import redact


@dataclass(frozen=True)
class CommandResult:
    host: str
    command: str  # as run, with secrets masked
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def tail(self, lines: int = 10) -> str:
        text = (self.stderr.strip() + "\n" + self.stdout.strip()).strip() if self.stderr.strip() else self.stdout
        return redact.mask("\n".join(text.splitlines()[-lines:]))
