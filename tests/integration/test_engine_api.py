"""sparkcluster's Docker client against the testbed's engines (issue 50): Docker 28.5.2 with the 1.44
floor of Docker 29.0-29.2. The client that main pinned at API 1.41 is refused there; sparkcluster's
negotiates the newest version both accept, over its own SSH connection."""

from __future__ import annotations

import docker
import pytest

from sparkcluster.config import inventory
from sparkcluster.remote import dockerapi, engine_api, ssh

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def hosts(testbed):
    inv = inventory.load(testbed.inventory)
    settings = ssh.Settings.from_inventory(inv)
    out = [ssh.connect(n, settings) for n in inv.nodes]
    yield out
    for h in out:
        h.close()


def test_the_client_negotiates_with_each_engine_and_the_pinned_one_is_refused(hosts):
    for host in hosts:
        client = host.docker()
        client.api.containers(all=True)  # the first request: negotiated before it
        engine = client.api.engine()
        assert engine.min_api == "1.44" and int(engine.version.split(".")[0]) >= 28
        assert client.api.api_version == engine_api.negotiate(engine) == engine_api.CLIENT_MAX
        # main's client: the SDK pinned at 1.41 over the same SSH connection
        pinned = docker.APIClient(base_url="http://localhost:2375", version="1.41")
        pinned.mount(dockerapi.BASE_URL, dockerapi._SharedConnectionAdapter(host._conn.client))
        pinned.base_url = dockerapi.BASE_URL
        with pytest.raises(docker.errors.APIError, match="client version 1.41 is too old"):
            pinned.containers(all=True)
