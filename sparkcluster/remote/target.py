"""Where a node's `ssh` target leads: the alias resolved through ssh_config as OpenSSH would
(HostName, User, Port, IdentityFile, IdentitiesOnly, UserKnownHostsFile, ProxyCommand, ProxyJump),
and a paramiko client ready to open with those settings.

paramiko alone: the configuration library that used to wrap it imported a task runner (and with it
`unittest` and YAML) into every command, a twentieth of a second that `status --json`, polled by
scripts, does not spend on what it does not use.
"""

from __future__ import annotations

import base64
import getpass
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

# read in this order when the inventory names no ssh_config; the first value of an option wins
DEFAULT_CONFIGS = (Path("~/.ssh/config"), Path("/etc/ssh/ssh_config"))


def parse_target(target: str) -> tuple[str | None, str, int | None]:
    """`user@host:port`, `[v6]:port`, `alias` -> (user, host, port), absent parts None."""
    user, _, rest = target.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, p = rest[1:].partition("]")
        port = int(p[1:]) if p.startswith(":") else None
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        port = int(p)
    return (user or None), host, port


def load_config(path: Path | None) -> paramiko.SSHConfig:
    """The ssh_config named by the inventory (which must exist: a typo would silently connect with
    other settings), else OpenSSH's defaults where they exist."""
    cfg = paramiko.SSHConfig()
    for p in [path] if path else [p.expanduser() for p in DEFAULT_CONFIGS]:
        if p.is_file():
            with p.open() as f:
                cfg.parse(f)
    return cfg


class Silent(Exception):
    """The host accepted the TCP connection and then said nothing (a hung sshd, a tarpit, another
    service on the port), or closed it before its SSH greeting. Waiting longer would not help."""

    def __init__(self, host: str, port: int, closed: bool = False):
        super().__init__(
            f"{host}:{port} accepted TCP but " + ("closed it before" if closed else "never sent") + " its SSH greeting"
        )
        self.closed = closed


class JumpFailed(Exception):
    """A ProxyJump hop could not be opened, or could not reach the next one: `cause` is what went
    wrong there (a name that does not resolve, a closed port, a refused key...), told as the jump
    host's, not the target's."""

    def __init__(self, hop: SshConnection, cause: BaseException, onward: str = ""):
        super().__init__(f"ProxyJump {hop.target} ({hop.host}:{hop.port}): {cause}")
        self.conn, self.hop, self.host, self.port, self.cause = hop, hop.target, hop.host, hop.port, cause
        # "host:port" when the hop answered and could not open the connection onward to it
        self.onward = onward


class MissingKey(Exception):
    """Authentication failed where an IdentityFile that ssh_config names does not exist (nor its .pub
    for an agent's copy): the key meant for the host was never offered. Such a file is skipped, as
    OpenSSH skips it (paramiko alone would stop at it, on every attempt, as a file error)."""

    def __init__(self, conn: SshConnection, path: str, cause: BaseException | None = None):
        super().__init__(f"IdentityFile {path} (for {conn.alias}) does not exist")
        self.conn, self.alias, self.path, self.cause = conn, conn.alias, path, cause


@dataclass
class SshConnection:
    """One node's SSH connection: the resolved address, the paramiko client, what opens it."""

    host: str
    port: int
    user: str
    options: dict  # the ssh_config lookup for the alias
    timeout: float
    config: paramiko.SSHConfig
    prepare: Callable[[paramiko.SSHClient], None]  # host keys and their policy, for every client
    client: paramiko.SSHClient = field(default_factory=paramiko.SSHClient)
    connect_kwargs: dict = field(default_factory=dict)
    _hops: list = field(default_factory=list)  # ProxyJump's own connections, closed with this one
    _agent_for: list = field(default_factory=list)  # IdentityFile keys to take from the agent
    _agent: paramiko.Agent | None = None
    alias: str = ""  # the name ssh_config was looked up by
    target: str = ""  # as written (the inventory's ssh, or a ProxyJump hop)

    @classmethod
    def resolve(
        cls, target: str, config: paramiko.SSHConfig, timeout: float, prepare: Callable[[paramiko.SSHClient], None]
    ) -> SshConnection:
        user, alias, port = parse_target(target)
        opts = dict(config.lookup(alias))
        conn = cls(
            opts.get("hostname", alias),
            port or int(opts.get("port", 22)),
            user or opts.get("user") or getpass.getuser(),
            opts,
            timeout,
            config,
            prepare,
        )
        keys = [str(Path(k).expanduser()) for k in opts.get("identityfile", [])]
        only = opts.get("identitiesonly", "no").lower() == "yes"
        agent = opts.get("identityagent", "").lower() != "none"
        conn.connect_kwargs = {
            "banner_timeout": timeout,
            "auth_timeout": timeout,
            # the keys in the user's ssh-agent are offered after the configured ones, as OpenSSH does
            # (IdentityAgent none: never), so a key locked by a passphrase works once ssh-add holds
            # it; with IdentitiesOnly, only the agent's copies of the IdentityFile keys (`open`)
            "allow_agent": agent and not only,
            **({"key_filename": keys} if keys else {}),
            **({"look_for_keys": False} if only else {}),
        }
        conn._agent_for = keys if (agent and only) else []
        conn.alias, conn.target = alias, target
        prepare(conn.client)
        return conn

    def missing_key(self) -> str | None:
        """The first IdentityFile that does not exist (a key held by the agent needs its .pub only)."""
        for k in self.connect_kwargs.get("key_filename") or []:
            if not Path(k).exists() and not (k in self._agent_for and Path(k + ".pub").exists()):
                return k
        return None

    def login(self, sock, timeout: float, pkey=None) -> None:
        """paramiko's connect with the IdentityFiles that exist (OpenSSH skips the others too); an
        authentication that then fails while one was missing is a MissingKey naming it."""
        kw = dict(self.connect_kwargs)
        there = [k for k in kw.pop("key_filename", []) if Path(k).exists()]
        if there:
            kw["key_filename"] = there
        missing = self.missing_key()
        try:
            self.client.connect(
                self.host, port=self.port, username=self.user, timeout=timeout, sock=sock, **kw,
                **({"pkey": pkey} if pkey is not None else {}),
            )  # fmt: skip
        except paramiko.PasswordRequiredException:
            raise
        except paramiko.SSHException as e:
            refused = isinstance(e, paramiko.AuthenticationException) or "No authentication methods" in str(e)
            if missing is not None and refused:
                raise MissingKey(self, missing, e) from e
            raise

    def _agent_key(self):
        """The ssh-agent's copy of an IdentityFile key (matched by its .pub), for IdentitiesOnly: a
        key locked by its passphrase is used through the agent, and no other agent key is offered."""
        wanted = set()
        for k in self._agent_for:
            try:
                wanted.add(base64.b64decode(Path(k + ".pub").read_text().split()[1]))
            except (OSError, IndexError, ValueError):
                continue
        if not wanted:
            return None
        self._agent = paramiko.Agent()
        return next((k for k in self._agent.get_keys() if k.asbytes() in wanted), None)

    def set_timeout(self, seconds: float) -> None:
        """What is left of the connect timeout bounds the next attempt: TCP, greeting, key exchange
        and authentication together (paramiko takes one bound for each)."""
        self.timeout = seconds
        self.connect_kwargs.update(banner_timeout=seconds, auth_timeout=seconds)

    def _direct(self) -> socket.socket:
        """A direct TCP connection whose host has begun its SSH greeting: a host that accepts and
        never speaks is told apart from a slow handshake here, within the timeout, without paramiko's
        transport thread (whose failures would otherwise be logged as tracebacks)."""
        started = time.monotonic()
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        try:
            sock.settimeout(max(0.05, self.timeout - (time.monotonic() - started)))
            first = sock.recv(1, socket.MSG_PEEK)
        except TimeoutError:  # socket.timeout is TimeoutError
            sock.close()
            raise Silent(self.host, self.port) from None
        except BaseException:
            sock.close()
            raise
        if not first:
            sock.close()
            raise Silent(self.host, self.port, closed=True)
        return sock

    def _channel_through(self, transport: paramiko.Transport):
        return transport.open_channel("direct-tcpip", (self.host, self.port), ("", 0), timeout=self.timeout)

    def _sock(self):
        """What carries the connection when ssh_config says so: ProxyJump's hops in turn (each
        resolved through the same config, its host key checked the same way), or ProxyCommand;
        None for a direct TCP connection."""
        jump = self.options.get("proxyjump", "none")
        if jump.lower() != "none":
            via, last = None, None
            for hop in (h.strip() for h in jump.split(",")):
                conn = SshConnection.resolve(hop, self.config, self.timeout, self.prepare)
                try:
                    sock = conn._channel_through(via) if via else None
                except Exception as e:  # the previous hop answered, and could not reach this one
                    raise JumpFailed(last, e, f"{conn.host}:{conn.port}") from e
                try:
                    conn.login(sock, self.timeout)
                except Exception as e:
                    conn.client.close()
                    raise JumpFailed(conn, e) from e
                self._hops.append(conn)
                via, last = conn.client.get_transport(), conn
            try:
                return self._channel_through(via)
            except Exception as e:  # the last hop answered, and could not reach the target
                raise JumpFailed(last, e, f"{self.host}:{self.port}") from e
        command = self.options.get("proxycommand", "none")
        return paramiko.ProxyCommand(command) if command.lower() != "none" else None

    def open(self) -> None:
        try:
            pkey = self._agent_key() if self._agent_for else None
            self.login(self._sock() or self._direct(), self.timeout, pkey)
        except BaseException:
            self.close()  # a retry resolves the hops again
            raise

    def close(self) -> None:
        self.client.close()
        if self._agent is not None:
            self._agent.close()
            self._agent = None
        for conn in reversed(self._hops):
            conn.client.close()
        self._hops.clear()
