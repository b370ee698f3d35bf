"""Shell text as the recipes write it, read without running it: continuation lines joined, comments
dropped, `export K=V` lines and inline `K=V cmd` prefixes taken as variables, then the words of each
command (shlex, POSIX quoting). Nothing is expanded: a `$VAR` stays as written, for the caller to name."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


@dataclass
class Command:
    argv: list[str]
    line: int  # 1-based, within the text given
    env: dict[str, str] = field(default_factory=dict)  # inline VAR=value prefixes


@dataclass
class Script:
    exports: dict[str, str]
    commands: list[Command]
    errors: list[tuple[int, str]]  # (line, why) of what could not be split into words


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each command line, backslash-newline continuations joined."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf:
            start = n
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        out.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def read(text: str) -> Script:
    script = Script({}, [], [])
    for n, line in logical_lines(text):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as e:
            script.errors.append((n, str(e)))
            continue
        if not words:
            continue
        if words[0] == "export":
            for w in words[1:]:
                m = _ASSIGN.match(w)
                if m:
                    script.exports[m.group(1)] = m.group(2)
            continue
        env: dict[str, str] = {}
        while words and _ASSIGN.match(words[0]):
            m = _ASSIGN.match(words.pop(0))
            env[m.group(1)] = m.group(2)
        if not words:  # a bare assignment: a shell variable, as good as an export for what follows
            script.exports.update(env)
            continue
        script.commands.append(Command(words, n, env))
    return script


@dataclass
class DockerRun:
    """The options of one `docker run`, as written."""

    privileged: bool = False
    gpus: str | None = None
    network: str | None = None
    ipc: str | None = None
    shm_size: str | None = None
    ulimits: dict[str, str] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)
    cap_add: list[str] = field(default_factory=list)
    security_opt: list[str] = field(default_factory=list)
    entrypoint: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # -e K=V (a bare -e K: from the caller's shell)
    volumes: list[str] = field(default_factory=list)
    interactive: bool = False
    image: str | None = None
    command: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


_VALUED = {
    "--gpus": "gpus",
    "--network": "network",
    "--net": "network",
    "--ipc": "ipc",
    "--shm-size": "shm_size",
    "--entrypoint": "entrypoint",
}
_LISTS = {"--device": "devices", "--cap-add": "cap_add", "--security-opt": "security_opt"}
_IGNORED_VALUED = {"--name", "--hostname", "-w", "--workdir", "--user", "-u", "--memory", "--pids-limit", "-p"}


def docker_run(argv: list[str]) -> DockerRun | None:
    """The `docker run` in argv (after `docker run`), or None when argv is not one."""
    if argv[:2] != ["docker", "run"]:
        return None
    out = DockerRun()
    i, rest = 0, argv[2:]
    while i < len(rest):
        a = rest[i]
        if not a.startswith("-"):
            out.image, out.command = a, rest[i + 1 :]
            break
        name, eq, val = a.partition("=")
        takes = (
            name in _VALUED
            or name in _LISTS
            or name in _IGNORED_VALUED
            or name in ("-e", "--env", "-v", "--volume", "--ulimit")
        )
        if takes and not eq:
            i += 1
            val = rest[i] if i < len(rest) else ""
        if name == "--privileged":
            out.privileged = True
        elif name in ("--rm", "-d", "--detach", "--init"):
            pass
        elif name in ("-it", "-ti", "-i", "-t", "--interactive", "--tty"):
            out.interactive = True
        elif name in _VALUED:
            setattr(out, _VALUED[name], val)
        elif name in _LISTS:
            getattr(out, _LISTS[name]).append(val)
        elif name == "--ulimit":
            k, _, v = val.partition("=")
            out.ulimits[k] = v
        elif name in ("-e", "--env"):
            k, _, v = val.partition("=")
            out.env[k] = v
        elif name in ("-v", "--volume"):
            out.volumes.append(val)
        elif name in _IGNORED_VALUED:
            out.unknown.append(f"{name} {val}")
        else:
            out.unknown.append(a)
        i += 1
    return out
