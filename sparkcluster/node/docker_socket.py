"""The few Docker Engine API calls a service's supervisor makes (node/service_supervisor), over the
node's Docker socket mounted into its container: inspect, start and stop one container, named in
its config. Nothing else: it never creates, removes, pulls or execs, though the socket would let it
(the socket is root on the node: docs/reference/security.md says so).

The Engine API's routes, as Docker documents them (https://docs.docker.com/reference/api/engine/
version/v1.43/): `GET /containers/{id}/json` (200, 404 "No such container"), `POST
/containers/{id}/start` (204, 304 already started), `POST /containers/{id}/stop?t=SECONDS` (204,
304 already stopped: SIGTERM, then SIGKILL after t seconds). Unversioned paths: the daemon answers
them at its own API version.

Standard library only: shipped into the container with the rest of node/.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse

SOCKET = "/run/docker.sock"  # where a service's supervisor container has the node's socket mounted
# the node's own (dockerd's default, -H unix:///var/run/docker.sock); mounted at SOCKET, not at the same path:
# in images where /var/run is a link to /run (NGC's), Docker refuses to copy files into a container that
# has a mount under the link ("mkdirat var/run: ... path escapes from parent"), and `up` copies the
# agent's files in after creating it
NODE_SOCKET = "/var/run/docker.sock"
TIMEOUT_S = 30.0  # one call; a stop waits its grace on top


class DockerError(Exception):
    """An answer the call does not expect: its status and Docker's message."""


class _Conn(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


class Docker:
    """The node's Docker, through its socket at `path`."""

    def __init__(self, path: str = SOCKET):
        self.path = path

    def _call(self, method: str, route: str, ok: tuple[int, ...], timeout: float = TIMEOUT_S) -> tuple[int, bytes]:
        conn = _Conn(self.path, timeout)
        try:
            conn.request(method, route, headers={"Host": "docker"})
            r = conn.getresponse()
            body = r.read()
        finally:
            conn.close()
        if r.status not in ok:
            try:
                message = json.loads(body).get("message", "")
            except ValueError:
                message = body.decode(errors="replace")[:200]
            raise DockerError(f"{method} {route}: {r.status} {message}".strip())
        return r.status, body

    def inspect(self, name: str) -> dict | None:
        """The container's document, None where there is no container of that name."""
        status, body = self._call("GET", f"/containers/{urllib.parse.quote(name)}/json", (200, 404))
        return json.loads(body) if status == 200 else None

    def start(self, name: str) -> None:
        self._call("POST", f"/containers/{urllib.parse.quote(name)}/start", (204, 304))

    def stop(self, name: str, grace_s: float) -> None:
        t = max(int(grace_s), 0)
        self._call("POST", f"/containers/{urllib.parse.quote(name)}/stop?t={t}", (204, 304, 404), TIMEOUT_S + t)


def state_of(doc: dict | None) -> tuple[bool, int | None, int | None]:
    """(running, its main process's PID on the node, its exit status) from an inspect document."""
    st = (doc or {}).get("State") or {}
    running = bool(st.get("Running"))
    pid = st.get("Pid") or None
    return running, (pid if running else None), (None if running else st.get("ExitCode"))
