"""A Docker Engine API client that rides an existing SSH connection.

The docker SDK's own ssh:// support opens a second SSH connection with its own host-key handling;
here its adapter is given our already-verified paramiko client instead, so each API request opens a
channel running `docker system dial-stdio` on the host we are connected to.
"""

from __future__ import annotations

import docker
from docker.transport.sshconn import SSHHTTPAdapter
from requests.adapters import HTTPAdapter

API_VERSION = "1.41"  # Docker 20.10 and newer; DGX OS ships newer engines, all of which accept it
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


def client_over(ssh_client, host: str, timeout: int = 120) -> docker.DockerClient:
    api = docker.APIClient(base_url="http://localhost:2375", version=API_VERSION, timeout=timeout)
    adapter = _SharedConnectionAdapter(ssh_client, timeout=timeout)
    api.mount(BASE_URL, adapter)
    api._custom_adapter = adapter
    api.base_url = BASE_URL
    client = docker.DockerClient.__new__(docker.DockerClient)
    client.api = api
    return client
