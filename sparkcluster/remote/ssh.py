"""One SSH connection per host, and the runner interface everything above is built on.

`Host.run(cmd, timeout) -> CommandResult` is the only way the rest of sparkcluster executes a command
on a node. It fails loudly: a non-zero exit or a timeout raises `CommandFailed` carrying the result,
unless the caller passes `warn=True` and reads the result itself; `Host.docker()` gives a Docker
Engine API client that rides the same SSH connection (each API request is a `docker system
dial-stdio` channel), so one invocation opens one connection per host. Nothing outside `remote/`
(this module, `target` and `dockerapi`) touches paramiko.

Host keys are checked strictly against known_hosts: an unknown key is refused with its fingerprint,
a changed key with the `ssh-keygen -R` hint; neither is ever added (`target.SshConnection` resolves the
ssh_config; the policy here is set on its client, and on each ProxyJump hop's).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

from sparkcluster import log, redact
from sparkcluster.config.inventory import Inventory, Node
from sparkcluster.errors import AuthError, CommandFailed, ConnectError, HostKeyError, InputError
from sparkcluster.remote import retry
from sparkcluster.remote.result import CommandResult
from sparkcluster.remote.target import JumpFailed, MissingKey, Silent, SshConnection, load_config, parse_target

_log = log.get(__name__)


def command_line(cmd: str | Sequence[str]) -> str:
    """An argv list is quoted for the remote shell; a string is taken as a finished shell line."""
    return cmd if isinstance(cmd, str) else shlex.join(cmd)


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass
class KnownHosts:
    """What one known_hosts file says, as far as paramiko can use it: its host keys, and the keys it
    marks `@revoked` (refused for every host, whatever else the file lists)."""

    entries: list[paramiko.hostkeys.HostKeyEntry]
    revoked: dict[bytes, str]  # key blob -> "file:line" that revokes it


_known_lock = threading.Lock()
_known: dict[tuple[str, int, int], KnownHosts] = {}


def read_known_hosts(path: Path) -> KnownHosts:
    """`path` read line by line as OpenSSH reads it. paramiko's own loader stops the whole connection
    at one line it cannot parse (an `@cert-authority` line, a damaged line: paramiko #771, #490),
    where OpenSSH goes on; such a line is skipped here with one warning naming the file and line
    (pyinfra skips them the same way, its PR #1926). Every other line is still checked strictly.
    Read once per process for each version of the file (several nodes connect at once)."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _known_lock:
        if key in _known:
            return _known[key]
        got = KnownHosts([], {})
        with path.open(errors="replace") as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                marker = ""
                if line.startswith("@"):
                    marker, _, line = line.partition(" ")
                    line = line.strip()
                try:
                    entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
                except Exception:  # noqa: BLE001 - paramiko raises several kinds for a damaged line
                    entry, why = None, "damaged: its key does not decode"
                else:
                    why = "not a host key paramiko can read (too few fields, or a key type it does not know)"
                if marker == "@revoked" and entry is not None:
                    got.revoked[entry.key.asbytes()] = f"{path}:{lineno}"
                elif marker:
                    _skipped(path, lineno, f"{marker} lines are not supported by paramiko")
                elif entry is None:
                    _skipped(path, lineno, why)
                else:
                    got.entries.append(entry)
        got.entries = [e for e in got.entries if e.key.asbytes() not in got.revoked]
        _known[key] = got
        return got


def _skipped(path: Path, lineno: int, why: str) -> None:
    _log.warning(f"{path}:{lineno}: known_hosts line skipped ({why}); host keys are checked against its other lines")


class _StrictPolicy(paramiko.MissingHostKeyPolicy):
    def __init__(self, node: str, known_hosts: list[Path], revoked: dict[bytes, str] | None = None):
        self.node = node
        self.known_hosts = known_hosts
        self.revoked = revoked or {}

    def missing_host_key(self, client, hostname, key):
        where = self.revoked.get(key.asbytes())
        if where is not None:
            raise HostKeyError(
                self.node,
                f"host key for {hostname} ({key.get_name()} {fingerprint(key)}) is marked @revoked in {where}; "
                "refusing to connect",
                f"find out why that key was revoked before trusting {hostname} again",
            )
        file = shlex.quote(str(self.known_hosts[0])) if self.known_hosts else "~/.ssh/known_hosts"
        host, port = _host_port(hostname)
        scan = f"ssh-keyscan -t {_short(key)}" + (f" -p {port}" if port != 22 else "") + f" {shlex.quote(host)}"
        raise HostKeyError(
            self.node,
            f"host key for {hostname} is not in known_hosts ({key.get_name()} {fingerprint(key)}); refusing to connect",
            f"verify the fingerprint on the host (ssh-keygen -lf /etc/ssh/ssh_host_{_short(key)}_key.pub), "
            f"then add it: {scan} >> {file}",
        )


def _host_port(known_name: str) -> tuple[str, int]:
    """paramiko's name for a host in known_hosts (`host`, or `[host]:port` off port 22) -> (host, port)."""
    if known_name.startswith("[") and "]:" in known_name:
        host, _, port = known_name[1:].rpartition("]:")
        return host, int(port)
    return known_name, 22


def _short(key: paramiko.PKey) -> str:
    name = key.get_name()
    return {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa"}.get(name, "ecdsa" if "ecdsa" in name else name)


KEEPALIVE_INTERVAL_S = 5.0
KEEPALIVE_DEAD_S = 15.0  # no reply to a keepalive for this long: the host is gone


class Host:
    """A connected node. Create with `connect()`; close with `close()`."""

    def __init__(self, node: Node, conn: SshConnection):
        self.node = node
        self.name = node.name
        self._conn = conn
        self._docker = None
        self.lost = ""  # why the connection was declared dead (no keepalive answer), else ""
        transport = conn.client.get_transport()
        if transport is not None and isinstance(transport.sock, socket.socket):
            # each command is a few small packets each way (channel open, exec, EOF, exit status):
            # with Nagle's algorithm one of them waits for the host's delayed ACK, 40 ms on Linux,
            # per command. OpenSSH sets TCP_NODELAY on its sessions too; paramiko does not.
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if transport is not None:
            threading.Thread(target=self._watch, args=(transport,), daemon=True, name=f"keepalive-{self.name}").start()

    def _watch(self, transport) -> None:
        """ServerAliveInterval/CountMax for paramiko: a host that stops answering (cable pulled) would
        leave every channel, Docker API calls included, blocked for up to an hour. Close the transport
        instead, so everything waiting on this host fails at once and the others go on."""
        while transport.is_active():
            answered = threading.Event()

            def ping(answered: threading.Event) -> None:
                try:
                    transport.global_request("keepalive@openssh.com", wait=True)  # any reply (even failure)
                except Exception:  # noqa: BLE001 - the transport is closing anyway
                    pass
                answered.set()

            # each round's thread gets its own event: a reply that comes late must not answer a later round
            threading.Thread(target=ping, args=(answered,), daemon=True).start()
            if not answered.wait(KEEPALIVE_DEAD_S):
                if transport.is_active():
                    self.lost = f"no answer from {self.name} over SSH for {KEEPALIVE_DEAD_S:g}s (connection lost)"
                    _log.warning("ssh connection lost", host=self.name, seconds=KEEPALIVE_DEAD_S)
                    transport.close()
                return
            for _ in range(int(KEEPALIVE_INTERVAL_S * 10)):
                if not transport.is_active():
                    return
                time.sleep(0.1)

    def _channel(self, timeout: float):
        """A new session channel; a connection that is gone is a ConnectError naming the host."""
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(
                self.name, self.lost or "the SSH connection was lost", "check the host's network and sshd, then retry"
            )
        try:
            return transport.open_session(timeout=timeout)
        except (paramiko.SSHException, EOFError, OSError) as e:  # it died between the check and the open
            raise ConnectError(
                self.name,
                self.lost or f"the SSH connection was lost ({e})",
                "check the host's network and sshd, then retry",
            ) from None

    @property
    def address(self) -> str:
        return self._conn.host

    def tunnel(self, ip: str, port: int, timeout: float = 10.0):
        """A channel from this host to ip:port (`direct-tcpip`, as `ssh -L` opens): what
        remote/forward carries a local connection on. A host whose sshd refuses forwarding raises
        paramiko's ChannelException."""
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(
                self.name, self.lost or "the SSH connection was lost", "check the host's network and sshd, then retry"
            )
        try:
            return transport.open_channel("direct-tcpip", (ip, int(port)), ("127.0.0.1", 0), timeout=timeout)
        except paramiko.ChannelException as e:
            if e.code == paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED:  # sshd's AllowTcpForwarding no
                raise InputError(
                    f"{self.name}: its sshd refuses to forward a connection to {ip}:{port} ({e.text})",
                    'set AllowTcpForwarding yes in its sshd_config, or engines_listen = "all" in the inventory',
                ) from None
            raise  # nothing listens there (connect failed): the caller finds it not answering

    def run(
        self, cmd: str | Sequence[str], timeout: float = 30.0, stdin: bytes | None = None, *, warn: bool = False
    ) -> CommandResult:
        """Run a command and wait for it. Raises `CommandFailed` when it exits non-zero or times out,
        unless `warn` (then the caller reads `ok`, `exit_code` and the output itself)."""
        line = command_line(cmd)
        shown = redact.mask(line)
        started = time.monotonic()
        chan = self._channel(timeout)
        chan.settimeout(timeout)
        out, err = bytearray(), bytearray()
        timed_out = False
        try:
            chan.exec_command(line)
            if stdin is not None:
                chan.sendall(stdin)
            chan.shutdown_write()
            deadline = started + timeout
            while True:
                if chan.recv_ready():
                    out += chan.recv(65536)
                    continue
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    continue
                # the exit status can arrive before the last data is read: stop only at EOF too
                if (
                    chan.exit_status_ready()
                    and chan.eof_received
                    and not chan.recv_ready()
                    and not chan.recv_stderr_ready()
                ):
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.005)
            code = chan.recv_exit_status() if not timed_out else -1
        except TimeoutError:
            timed_out, code = True, -1
        finally:
            chan.close()
        res = CommandResult(
            self.name,
            shown,
            code,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            time.monotonic() - started,
            timed_out,
        )
        _log.debug(
            "ran", host=self.name, command=shown, exit_code=code, seconds=round(res.duration, 3), timed_out=timed_out
        )
        if not res.ok and not warn:
            raise CommandFailed(res)
        return res

    def start(self, cmd: str | Sequence[str], timeout: float = 600.0) -> RemoteProcess:
        """Start a long-running command; read its stderr lines as they come, then `wait()`."""
        line = command_line(cmd)
        chan = self._channel(30)
        chan.exec_command(line)
        _log.debug("started", host=self.name, command=redact.mask(line))
        return RemoteProcess(self.name, redact.mask(line), chan, timeout)

    def docker(self):
        """A docker SDK client over this host's SSH connection (created once)."""
        if self._docker is None:
            # imported here for start-up speed: the docker SDK (and requests) loads only when a command
            # talks to an engine; dockerapi never imports this module
            from sparkcluster.remote.dockerapi import client_over

            self._docker = client_over(self._conn.client, self.name)
        return self._docker

    def close(self) -> None:
        if self._docker is not None:
            try:
                self._docker.close()
            except Exception:  # closing is best effort
                pass
        self._conn.close()


class RemoteProcess:
    """A command running on a host over its own channel. Closing the channel (or losing the
    connection) ends the remote side's stdin, which is how the cluster lock is released."""

    def __init__(self, host: str, command: str, chan, timeout: float):
        self.host, self.command, self._chan = host, command, chan
        self._started = time.monotonic()
        self._deadline = self._started + timeout
        self._out, self._err_buf, self._err_all = bytearray(), bytearray(), bytearray()

    def _pump(self) -> None:
        while self._chan.recv_ready():
            self._out += self._chan.recv(65536)
        while self._chan.recv_stderr_ready():
            data = self._chan.recv_stderr(65536)
            self._err_buf += data
            self._err_all += data

    def stderr_lines(self, poll: float = 0.05):
        """Yield stderr lines until the command ends (or its deadline passes)."""
        while True:
            self._pump()
            while b"\n" in self._err_buf:
                line, _, rest = self._err_buf.partition(b"\n")
                self._err_buf = bytearray(rest)
                yield line.decode(errors="replace")
            if self._chan.exit_status_ready() and not self._chan.recv_ready() and not self._chan.recv_stderr_ready():
                return
            if time.monotonic() > self._deadline:
                return
            time.sleep(poll)

    def wait(self) -> CommandResult:
        for _ in self.stderr_lines():
            pass
        timed_out = not self._chan.exit_status_ready()
        if timed_out:
            self._chan.close()
        code = -1 if timed_out else self._chan.recv_exit_status()
        self._pump()
        return CommandResult(
            self.host,
            self.command,
            code,
            self._out.decode(errors="replace"),
            self._err_all.decode(errors="replace"),
            time.monotonic() - self._started,
            timed_out,
        )

    def write(self, text: str) -> None:
        """Send `text` to the command's stdin."""
        self._chan.sendall(text.encode())

    def close(self) -> None:
        self._chan.close()


# the connect timeout when neither the inventory ([cluster] connect_timeout) nor ssh_config
# (ConnectTimeout) sets one: every attempt together, so that `status` answers within README's 15 s
# even when a host accepts TCP and never speaks
DEFAULT_CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Settings:
    ssh_config: Path | None
    known_hosts: Path | None
    connect_timeout: float | None  # None: ssh_config's ConnectTimeout, else DEFAULT_CONNECT_TIMEOUT_S
    attempts: int

    @classmethod
    def from_inventory(cls, inv: Inventory) -> Settings:
        c = inv.cluster
        config = inv.resolve(c.ssh_config)
        if config is not None and not config.is_file():
            raise InputError(
                f"{inv.path or 'inventory'}: cluster.ssh_config {config} does not exist",
                "correct cluster.ssh_config (relative to the inventory's folder), or remove it to use ~/.ssh/config",
            )
        return cls(config, inv.resolve(c.known_hosts), c.connect_timeout, c.connect_attempts)

    def timeout_for(self, options: dict) -> float:
        """The inventory's connect timeout, else the host's ssh_config ConnectTimeout, else the default."""
        if self.connect_timeout is not None:
            return float(self.connect_timeout)
        try:
            configured = float(options.get("connecttimeout", ""))
        except ValueError:
            configured = 0.0
        return configured if configured > 0 else DEFAULT_CONNECT_TIMEOUT_S


def _make_connection(node: Node, settings: Settings) -> tuple[SshConnection, list[Path]]:
    config = load_config(settings.ssh_config)
    alias = parse_target(node.ssh)[1]
    files: list[Path] = []
    if settings.known_hosts:
        files.append(settings.known_hosts)
    for f in config.lookup(alias).get("userknownhostsfile", "").split():
        files.append(Path(f).expanduser())
    if not files:
        files.append(Path("~/.ssh/known_hosts").expanduser())

    read = [read_known_hosts(f) for f in files if f.is_file()]
    revoked = {k: v for r in read for k, v in r.revoked.items()}

    def prepare(client: paramiko.SSHClient) -> None:
        keys = client.get_host_keys()
        for r in read:
            for entry in r.entries:
                for name in entry.hostnames:
                    known = keys.lookup(name)
                    if known is None or entry.key.get_name() not in known:  # the first line wins, as paramiko's load
                        keys.add(name, entry.key.get_name(), entry.key)
        client.set_missing_host_key_policy(_StrictPolicy(node.name, files, revoked))

    timeout = settings.timeout_for(config.lookup(alias))
    return SshConnection.resolve(node.ssh, config, timeout, prepare), files


def connect(node: Node, settings: Settings) -> Host:
    """One connection to `node`, within its connect timeout whatever the host does (retries
    included), or a ConnectError naming the node, the cause and a fix for that cause (a closed port,
    a silent host, a name that does not resolve, an unknown or changed host key, a refused key, a key
    locked by its passphrase are different problems with different fixes)."""
    conn, files = _make_connection(node, settings)
    bound = conn.timeout
    deadline = time.monotonic() + bound
    login = ssh_command(node.ssh)
    # the fix for what is retried, named by the last attempt's cause
    fix = [f"check that {node.name} is up and answers on the network, then try: {login}"]

    tries = []

    def attempt() -> Host:
        tries.append(1)
        conn.set_timeout(max(0.1, deadline - time.monotonic()))
        try:
            conn.open()
        except HostKeyError:
            raise
        except MissingKey as e:  # refused, and the key meant for it is missing: never retried
            raise _missing_key(node.name, e, settings) from None
        except JumpFailed as e:
            raise _jump_failed(node.name, conn.alias, e, settings, fix) from None
        except Silent as e:  # waiting again would spend the same time for the same silence
            raise ConnectError(
                node.name,
                f"{e}"
                + ("" if e.closed else f" (waited {bound:g}s)")
                + ": a hung sshd, or not an SSH server on that port",
                f"check sshd on {node.name} (systemctl status ssh) and that {conn.port} is its SSH port",
            ) from None
        except paramiko.BadHostKeyException as e:
            raise HostKeyError(
                node.name,
                f"host key for {e.hostname} has CHANGED (now {e.key.get_name()} {fingerprint(e.key)}); "
                "refusing to connect",
                "if the host was reinstalled, remove the old key with: "
                f"ssh-keygen -f {shlex.quote(str(files[0]))} -R {shlex.quote(_known_hosts_name(conn))}",
            ) from None
        except paramiko.PasswordRequiredException:
            raise _locked_key(node.name, conn) from None
        except paramiko.AuthenticationException as e:
            raise AuthError(
                node.name,
                f"authentication refused for {conn.user}@{conn.host}: {e}",
                f"install your public key on the host: {_copy_id(conn)}",
            ) from None
        except paramiko.SSHException as e:
            if "not found in known_hosts" in str(e):
                raise HostKeyError(node.name, str(e), f"add the host key to {files[0]}") from None
            if "No authentication methods available" in str(e):
                raise AuthError(
                    node.name,
                    f"no SSH key to offer {conn.user}@{conn.host} (no IdentityFile, no ~/.ssh/id_*, no ssh-agent)",
                    f"make one and install it on the host: ssh-keygen -t ed25519 && {_copy_id(conn)}",
                ) from None
            raise retry.Transient(node.name, f"SSH handshake with {conn.host}:{conn.port} failed: {e}") from None
        except TimeoutError as e:  # socket.timeout is TimeoutError
            raise retry.Transient(
                node.name, f"no answer from {conn.host}:{conn.port} within {bound:g}s ({e or 'timeout'})"
            ) from None
        except UnicodeError as e:  # a name the resolver cannot encode (a label over 63 characters)
            raise ConnectError(node.name, f"{conn.host[:80]!r} is not a host name ({e})", fix[0]) from None
        except socket.gaierror as e:  # not retried: the resolver has answered
            raise ConnectError(
                node.name,
                f"{conn.host!r} does not resolve ({e.strerror or e}): neither a host name this machine knows "
                f"nor a Host entry in {settings.ssh_config or '~/.ssh/config'}",
                f"add `Host {conn.host}` with its HostName (and User) to {settings.ssh_config or '~/.ssh/config'}, "
                "or give the target as user@address",
            ) from None
        except ConnectionRefusedError:
            fix[0] = (
                f"start sshd on {node.name} (sudo systemctl start ssh), or give the port it listens on "
                f"in the node's ssh target; then try: {login}"
            )
            raise retry.Transient(
                node.name, f"nothing listens on {conn.host}:{conn.port} (connection refused)"
            ) from None
        except (OSError, EOFError) as e:
            raise retry.Transient(node.name, f"cannot reach {conn.host}:{conn.port}: {e}") from None
        return Host(node, conn)

    try:
        # the next attempt starts only while there is time left for it to finish
        return retry.transient(attempt, attempts=settings.attempts, what=f"ssh {node.name}", within=bound * 0.8)
    except retry.Transient as e:
        raise ConnectError(node.name, f"{e.message} (after {len(tries)} attempt(s))", fix[0]) from None


def _missing_key(node: str, e: MissingKey, settings: Settings, via: str = "") -> AuthError:
    """An IdentityFile that does not exist, where no other key was let in: named, with the two ways out
    (make it, or name the key that exists). Never retried: the file is as missing the next time."""
    cfg = settings.ssh_config or "~/.ssh/config"
    key = shlex.quote(e.path)
    return AuthError(
        node,
        f"{via}IdentityFile {e.path} does not exist (ssh_config {cfg}, Host {e.alias}), and "
        f"{e.conn.user}@{e.conn.host} accepted no other key",
        f"correct IdentityFile under `Host {e.alias}` in {cfg} to a key you have (ls ~/.ssh), or make that one "
        f"and install it on {e.conn.host}: ssh-keygen -t ed25519 -f {key} && {_copy_id(e.conn, e.path)}",
    )


def _jump_failed(node: str, alias: str, e: JumpFailed, settings: Settings, fix: list[str]) -> Exception:
    """A ProxyJump hop's failure told as the jump host's: its name, its address and port, its fix. What
    would pass on its own (a closed or silent port) is retried, as for a direct connection."""
    cfg = settings.ssh_config or "~/.ssh/config"
    hop, cause, at = e.hop, e.cause, f"{e.host}:{e.port}"
    jump = f"its ProxyJump host {hop}"
    login = ssh_command(f"{e.conn.user}@{e.host}" + (f":{e.port}" if e.port != 22 else ""))
    if isinstance(cause, HostKeyError):
        return HostKeyError(node, f"{jump}: {cause.message.removeprefix(f'{node}: ')}", cause.fix)
    if isinstance(cause, MissingKey):
        return _missing_key(node, cause, settings, via=f"{jump}: ")
    if e.onward:  # the jump host answered; the connection from it onward did not open
        host, _, port = e.onward.rpartition(":")
        fix[0] = (
            f"check that {e.onward} is where {hop} reaches {node}'s sshd (HostName and Port of `Host {alias}` in "
            f"{cfg}) and that sshd runs there: {login}, then from there ssh -p {port} {host}"
        )
        return retry.Transient(node, f"{jump} could not open a connection to {e.onward} ({cause})")
    if isinstance(cause, paramiko.BadHostKeyException):
        name = e.host if e.port == 22 else f"[{e.host}]:{e.port}"
        return HostKeyError(
            node,
            f"{jump}: host key for {cause.hostname} has CHANGED (now {cause.key.get_name()} {fingerprint(cause.key)}); "
            "refusing to connect",
            f"if {hop} was reinstalled, remove the old key with: ssh-keygen -R {shlex.quote(name)}",
        )
    if isinstance(cause, paramiko.PasswordRequiredException):
        locked = _locked_key(node, e.conn)
        return AuthError(node, f"{jump}: {locked.message.removeprefix(f'{node}: ')}", locked.fix)
    if isinstance(cause, paramiko.AuthenticationException) or "No authentication methods" in str(cause):
        return AuthError(
            node,
            f"{jump} refused authentication for {e.conn.user}@{e.host} ({cause})",
            f"install your public key on the jump host: {_copy_id(e.conn)}",
        )
    if isinstance(cause, UnicodeError | socket.gaierror):  # not retried: the resolver has answered
        why = getattr(cause, "strerror", None) or cause
        return ConnectError(
            node,
            f"{jump}"
            + (f" (HostName {e.host})" if e.host not in hop else "")
            + f" does not resolve ({why}): neither a host name this machine knows nor a Host entry in {cfg}",
            f"add `Host {hop}` with its HostName (and User) to {cfg}, or correct the ProxyJump of `Host {alias}` there",
        )
    refused = isinstance(cause, ConnectionRefusedError) or (
        isinstance(cause, paramiko.ssh_exception.NoValidConnectionsError)
        and all(getattr(x, "errno", None) == errno.ECONNREFUSED for x in cause.errors.values())
    )
    if refused:
        fix[0] = (
            f"start sshd on the jump host {hop}, or correct the port it is reached on (the ProxyJump of "
            f"`Host {alias}`, or the Port of its own Host entry, in {cfg}); then try: {login}"
        )
        return retry.Transient(node, f"nothing listens on {jump} at {at} (connection refused)")
    fix[0] = f"check that the jump host {hop} is up and answers on the network, then try: {login}"
    if isinstance(cause, TimeoutError):
        return retry.Transient(node, f"no answer from {jump} at {at} ({cause or 'timeout'})")
    if isinstance(cause, paramiko.ssh_exception.NoValidConnectionsError):
        why = "; ".join(os.strerror(x.errno) if x.errno else str(x) for x in cause.errors.values())
        return retry.Transient(node, f"cannot reach {jump} at {at}: {why}")
    return retry.Transient(node, f"SSH to {jump} at {at} failed: {cause}")


def ssh_command(target: str) -> str:
    """The `ssh` command line that reaches an inventory's ssh target as written (`user@host:port` is
    not one `ssh` accepts: the port goes to -p), for fixes a user runs as printed."""
    user, host, port = parse_target(target)
    dest = f"{user}@{host}" if user else host
    return "ssh " + (f"-p {port} " if port else "") + shlex.quote(dest)


def _copy_id(conn: SshConnection, key: str | None = None) -> str:
    keys = conn.connect_kwargs.get("key_filename") or []
    keys = [key] if key else [k for k in keys if Path(k).exists()] or keys
    return (
        "ssh-copy-id"
        + (f" -i {shlex.quote(keys[0])}" if keys else "")
        + (f" -p {conn.port}" if conn.port != 22 else "")
        + f" {shlex.quote(f'{conn.user}@{conn.host}')}"
    )


def _locked_key(node: str, conn: SshConnection) -> AuthError:
    """A key that needs its passphrase, and no agent that holds it: sparkcluster never asks for a
    passphrase (it runs unattended), so the key must be in an ssh-agent."""
    keys = list(conn.connect_kwargs.get("key_filename") or [])
    keys += [str(p) for p in sorted(Path("~/.ssh").expanduser().glob("id_*")) if not p.name.endswith(".pub")]
    locked = "your key"
    for k in keys:
        try:
            paramiko.PKey.from_path(k)
        except paramiko.PasswordRequiredException:
            locked = k
            break
        except TypeError as e:  # what the cryptography library says of an OpenSSH key locked by a passphrase
            if "password" in str(e).lower():
                locked = k
                break
        except Exception:  # noqa: BLE001 - another key's problem is not this message's
            continue
    add = f"ssh-add {shlex.quote(locked)}" if locked != "your key" else "ssh-add"
    return AuthError(
        node,
        f"{locked} needs its passphrase and no ssh-agent offers it (sparkcluster never prompts)",
        f"load it into your agent: {add}" if os.environ.get("SSH_AUTH_SOCK") else f'eval "$(ssh-agent -s)" && {add}',
    )


def _known_hosts_name(conn: SshConnection) -> str:
    return conn.host if conn.port == 22 else f"[{conn.host}]:{conn.port}"
