"""A Docker Engine API client that rides an existing SSH connection.

The docker SDK's own ssh:// support opens a second SSH connection with its own host-key handling;
here its adapter is given our already-verified paramiko client instead, so each API request opens a
channel running `docker system dial-stdio` on the host we are connected to.
"""

from __future__ import annotations

import functools
import shlex
import time

import docker
import paramiko
import requests
from docker.transport.sshconn import SSHHTTPAdapter
from requests.adapters import HTTPAdapter

from sparkcluster import redact
from sparkcluster.errors import CommandFailed, EngineIncompatible, EngineUnreachable
from sparkcluster.remote import engine_api
from sparkcluster.remote.result import CommandResult

# What "the engine did not answer" looks like from the SDK over our SSH channel. Anything the
# engine itself answers (docker.errors.NotFound for absent, APIError otherwise) passes through.
UNREACHABLE = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    paramiko.SSHException,
    EOFError,
    ConnectionError,
    TimeoutError,
)

BASE_URL = "http+docker://ssh"


class _SharedConnectionAdapter(SSHHTTPAdapter):
    """SSHHTTPAdapter without its own connect: it uses the paramiko client it is given."""

    def __init__(self, ssh_client, timeout: int = 120, max_pool_size: int = 4):
        self.ssh_client = ssh_client
        self.ssh_params = {}
        self.ssh_host = "ssh"
        self.timeout = timeout
        self.max_pool_size = max_pool_size
        from docker.transport.sshconn import RecentlyUsedContainer

        self.pools = RecentlyUsedContainer(4, dispose_func=lambda p: p.close())
        HTTPAdapter.__init__(self)

    def _connect(self):  # the connection is owned by ssh.Host
        return None

    def close(self):
        self.pools.clear()


class GuardedAPI:
    """The SDK's APIClient, with "the engine did not answer" turned into `EngineUnreachable`
    naming the node: a caller that treats NotFound as "absent" can never mistake a dead engine
    for an empty one."""

    def __init__(self, api: docker.APIClient, host: str):
        self._api, self._host = api, host

    @property
    def host(self) -> str:
        return self._host

    def __getattr__(self, name: str):
        attr = getattr(self._api, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            try:
                return attr(*args, **kwargs)
            except UNREACHABLE as e:
                raise EngineUnreachable(self._host, name, e) from e

        return call


def client_over(ssh_client, host: str, timeout: int = 120) -> docker.DockerClient:
    """A client of `host`'s engine over `ssh_client`. The API version is negotiated with that engine
    on first use (engine_api.negotiate): the SDK's own "auto" would ask the placeholder URL it is
    built with, before the SSH adapter is mounted."""
    api = _NegotiatingAPIClient(base_url="http://localhost:2375", version=engine_api.CLIENT_MAX, timeout=timeout)
    adapter = _SharedConnectionAdapter(ssh_client, timeout=timeout)
    api.mount(BASE_URL, adapter)
    api._custom_adapter = adapter
    api.base_url = BASE_URL
    api.host = host
    client = docker.DockerClient.__new__(docker.DockerClient)
    client.api = GuardedAPI(api, host)
    return client


class _NegotiatingAPIClient(docker.APIClient):
    """The SDK's APIClient whose version is settled by one unversioned `GET /version` before its first
    versioned request, on the connection that request then reuses."""

    host = "the node"
    _negotiated: engine_api.EngineApi | None = None

    def engine(self) -> engine_api.EngineApi:
        """What the engine said of itself (asked once)."""
        if self._negotiated is None:
            answer = docker.APIClient._result(self, self._get(self._url("/version", versioned_api=False)), json=True)
            found = engine_api.EngineApi.from_version(answer)
            version = engine_api.negotiate(found)
            if version is None:
                raise EngineIncompatible(self.host, *engine_api.incompatible(self.host, found))
            self._version = version
            self._negotiated = found
        return self._negotiated

    def _url(self, pathfmt, *args, **kwargs):
        if kwargs.get("versioned_api", True) and self._negotiated is None:
            self.engine()
        return super()._url(pathfmt, *args, **kwargs)


def run_in(api, container: str, argv: list[str], *, warn: bool = False, environment: dict | None = None):
    """`docker exec` as the one runner for commands in a container, as `Host.run` is on a host: a
    non-zero exit raises `CommandFailed` naming the node, the container and the command, unless the
    caller passes `warn=True` and judges the result itself. An engine that does not answer raises
    `EngineUnreachable` (GuardedAPI). Returns a CommandResult (stdout and stderr in stdout)."""
    started = time.monotonic()
    ex = api.exec_create(container, argv, environment=environment)
    out = api.exec_start(ex["Id"]).decode(errors="replace")
    code = api.exec_inspect(ex["Id"]).get("ExitCode")
    res = CommandResult(
        getattr(api, "host", "the node"),
        redact.mask(f"docker exec {container} {shlex.join(argv)}"),
        1 if code is None else int(code),
        out,
        "",
        time.monotonic() - started,
    )
    if not res.ok and not warn:
        raise CommandFailed(res)
    return res
