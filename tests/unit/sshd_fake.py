"""A private SSH server on loopback, in this process (paramiko's server side): enough of sshd for a
client to check its host key and try to authenticate. Keys are made with ssh-keygen, as an owner's are."""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path

import paramiko


def keygen(path: Path, passphrase: str = "") -> paramiko.PKey:
    """An ed25519 key pair at `path` (and `path`.pub), as `ssh-keygen` writes it."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path), password=passphrase or None)


def known_line(name: str, key: paramiko.PKey) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}"


class _Server(paramiko.ServerInterface):
    def __init__(self, accept: set[bytes]):
        self.accept = accept

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL if key.asbytes() in self.accept else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED


class FakeSshd:
    """Listens on 127.0.0.1; every connection is served with `host_key`; `accept` holds the client
    keys it lets in (none: every authentication is refused)."""

    def __init__(self, host_key: paramiko.PKey, accept: tuple[paramiko.PKey, ...] = ()):
        self.host_key = host_key
        self.accept = {k.asbytes() for k in accept}
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self._transports: list[paramiko.Transport] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = paramiko.Transport(conn)
            t.add_server_key(self.host_key)
            self._transports.append(t)
            try:
                t.start_server(server=_Server(self.accept))
            except (paramiko.SSHException, EOFError, OSError):
                t.close()

    def close(self) -> None:
        self.sock.close()
        for t in self._transports:
            t.close()
