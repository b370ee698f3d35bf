"""The Docker Engine API version, negotiated with each engine (issue 50).

Engines' own words: the testbed's 28.5.2 started with Docker 29's floor (captured:
tests/captured/docker-version-28.5.2-floor-1.44.json, `docker version --format '{{json .Server}}'` on
spark-head); Docker 20.10 "API version: 1.41 (minimum version 1.12)" (caprover/caprover#2111); Docker
29.0.0 "API version: 1.52 (minimum version 1.44)" (HariSekhon/Nagios-Plugins#434), 29.1.2 the same
(kasmtech/workspaces-issues#817).
"""

from __future__ import annotations

import json
from pathlib import Path

import docker
import docker.constants
import pytest
import requests
from requests.adapters import BaseAdapter

from sparkcluster.errors import EngineIncompatible, EngineUnreachable
from sparkcluster.facts import parsers
from sparkcluster.remote import dockerapi, engine_api
from sparkcluster.remote.engine_api import EngineApi

CAPTURED = Path(__file__).resolve().parents[1] / "captured"
DOCKER_20_10 = EngineApi("20.10.9", "1.41", "1.12")  # caprover/caprover#2111
DOCKER_29_0 = EngineApi("29.0.0", "1.52", "1.44")  # HariSekhon/Nagios-Plugins#434
DOCKER_29_1 = EngineApi("29.1.2", "1.52", "1.44")  # kasmtech/workspaces-issues#817


def test_the_client_range_is_the_installed_sdks():
    assert engine_api.CLIENT_MIN == docker.constants.MINIMUM_DOCKER_API_VERSION
    assert engine_api.CLIENT_MAX == docker.constants.DEFAULT_DOCKER_API_VERSION


def _captured(name: str) -> EngineApi:
    found = parsers.docker_api((CAPTURED / name).read_text())
    assert found is not None
    return found


def test_captured_engines_parse():
    assert _captured("docker-version-28.5.2-floor-1.44.json") == EngineApi("28.5.2+dfsg4", "1.51", "1.44")


@pytest.mark.parametrize(
    "engine, speak",
    [
        (DOCKER_20_10, "1.41"),  # the engine's newest: older than the SDK's
        (EngineApi("28.5.2+dfsg4", "1.51", "1.44"), "1.45"),  # the SDK's newest, above the floor
        (DOCKER_29_0, "1.45"),
        (DOCKER_29_1, "1.45"),
        (EngineApi("29.3.0", "1.53", "1.40"), "1.45"),  # 29.3 lowered the floor again
    ],
)
def test_negotiated_version_is_the_newest_both_accept(engine, speak):
    assert engine_api.negotiate(engine) == speak


def test_an_engine_whose_floor_is_above_the_sdk_is_refused_with_a_fix_for_that_engine():
    future = EngineApi("31.0.0", "1.56", "1.46")
    assert engine_api.negotiate(future) is None
    detail, fix = engine_api.incompatible("spark-a", future)
    assert detail == "Docker Engine 31.0.0 accepts API 1.46-1.56; sparkcluster's Docker SDK speaks 1.24-1.45"
    assert '"min-api-version": "1.45"' in fix and "spark-a" in fix


def test_an_engine_older_than_the_sdk_is_told_to_upgrade():
    ancient = EngineApi("1.13.1", "1.23", "1.12")
    assert engine_api.negotiate(ancient) is None
    assert "upgrade Docker Engine on spark-a" in engine_api.incompatible("spark-a", ancient)[1]


def test_docker_api_parser_takes_no_json_as_unknown():
    # what `docker version --format '{{json .Server}}'` prints when the socket refuses the account
    assert parsers.docker_api("permission denied while trying to connect to the docker API") is None
    assert parsers.docker_api("null") is None


# --- the SDK client over a connection: negotiation before the first versioned request -------------


class _Engine(BaseAdapter):
    """An engine at the far end of the adapter: answers /version with `engine` and refuses, as
    Docker 29 does, every versioned path below its floor."""

    def __init__(self, engine: EngineApi):
        super().__init__()
        self.engine, self.paths = engine, []

    def send(self, request, **kwargs):
        path = request.path_url
        self.paths.append(path)
        r = requests.Response()
        r.request, r.url = request, request.url
        if path == "/version":
            body = {"Version": self.engine.version, "ApiVersion": self.engine.api, "MinAPIVersion": self.engine.min_api}
            r.status_code = 200
        else:
            asked = path.split("/")[1].lstrip("v")
            if engine_api._key(asked) < engine_api._key(self.engine.min_api):
                r.status_code = 400
                body = {
                    "message": f"client version {asked} is too old. Minimum supported API version is "
                    f"{self.engine.min_api}, please upgrade your client to a newer version"
                }
            else:
                r.status_code, body = 200, []
        r._content = json.dumps(body).encode()
        r.headers["Content-Type"] = "application/json"
        return r

    def close(self):
        pass


def _client(engine: EngineApi) -> tuple[docker.DockerClient, _Engine]:
    client = dockerapi.client_over(object(), "spark-a")
    fake = _Engine(engine)
    client.api._api.mount(dockerapi.BASE_URL, fake)
    return client, fake


@pytest.mark.parametrize("engine", [DOCKER_20_10, DOCKER_29_0])
def test_the_client_asks_the_engine_first_then_speaks_the_negotiated_version(engine):
    client, fake = _client(engine)
    assert client.api.containers(all=True) == []
    speak = engine_api.negotiate(engine)
    assert fake.paths[0] == "/version"
    assert fake.paths[1].startswith(f"/v{speak}/containers/json")
    client.api.containers(all=True)
    assert fake.paths.count("/version") == 1  # asked once per client


def test_a_client_pinned_at_1_41_is_refused_by_docker_29_as_main_was():
    """What the pinned client got on a Spark with Docker 29.0-29.2: the engine's 400."""
    api = docker.APIClient(base_url="http://localhost:2375", version="1.41")
    api.mount("http://", _Engine(DOCKER_29_0))
    with pytest.raises(docker.errors.APIError, match="client version 1.41 is too old"):
        api.containers(all=True)


def test_an_incompatible_engine_is_one_error_naming_the_node_and_a_fix():
    client, _ = _client(EngineApi("31.0.0", "1.56", "1.46"))
    with pytest.raises(EngineIncompatible) as e:
        client.api.containers(all=True)
    assert str(e.value).startswith("spark-a: Docker Engine 31.0.0 accepts API 1.46-1.56")
    assert e.value.fix and "min-api-version" in e.value.fix


def test_an_engine_that_does_not_answer_the_version_is_unreachable():
    client, fake = _client(DOCKER_29_0)

    def refuse(request, **kwargs):
        raise requests.exceptions.ConnectionError("channel closed")

    fake.send = refuse
    with pytest.raises(EngineUnreachable):
        client.api.containers(all=True)
