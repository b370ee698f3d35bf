"""Which Docker Engine API version sparkcluster speaks with a node's engine: negotiated per engine,
as the docker CLI does, never pinned.

An engine serves a range of API versions: its own (`ApiVersion`) down to a floor (`MinAPIVersion`).
Docker Engine 29.0-29.2 raised that floor to 1.44 and refuse older clients with "client version 1.41
is too old. Minimum supported API version is 1.44" (docker/docs#23910, containrrr/watchtower#2124,
amir20/dozzle#4265); 29.3 lowered it to 1.40 again. Sparks run 28.x and 29.x
(tests/captured/gb10-docker-info.json: 28.3.3; NVIDIA/NemoClaw#4658: 29.x). Debian 12's 20.10 serves
up to 1.41. sparkcluster speaks the newest version both sides know.

Kept free of the docker SDK (which loads requests and more) so that `doctor` can judge a node's range
from its facts without importing it; tests/unit/test_engine_api.py holds CLIENT_* to the SDK's own.
"""

from __future__ import annotations

from dataclasses import dataclass

# the docker SDK's range (docker-py 7.1 and 7.2, docker/constants.py): MINIMUM_DOCKER_API_VERSION and
# DEFAULT_DOCKER_API_VERSION, the newest API whose requests and answers that SDK is written for
CLIENT_MIN = "1.24"
CLIENT_MAX = "1.45"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.strip().split("."))


@dataclass(frozen=True)
class EngineApi:
    """What an engine says of itself (`GET /version`, `docker version`)."""

    version: str  # the engine's release, e.g. "28.5.2"
    api: str  # the newest API version it serves
    min_api: str  # the oldest it accepts

    @classmethod
    def from_version(cls, d: dict) -> EngineApi:
        """From the engine's `/version` answer (or `docker version --format '{{json .Server}}'`)."""
        return cls(str(d.get("Version", "")), str(d.get("ApiVersion", "")), str(d.get("MinAPIVersion") or "1.12"))

    def range(self) -> str:
        return f"{self.min_api}-{self.api}"


def negotiate(engine: EngineApi) -> str | None:
    """The version to speak: the newer of both sides' newest that both accept, or None when the
    ranges do not meet (the engine is too old, or refuses every version this SDK knows)."""
    try:
        newest = min(_key(engine.api), _key(CLIENT_MAX))
        floor = max(_key(engine.min_api), _key(CLIENT_MIN))
    except ValueError:
        return None
    if newest < floor:
        return None
    return ".".join(str(p) for p in newest)


def incompatible(host: str, engine: EngineApi) -> tuple[str, str]:
    """What is wrong (without the host's name) and the fix, for an engine whose range does not meet
    sparkcluster's."""
    what = (
        f"Docker Engine {engine.version or '?'} accepts API {engine.range()}; "
        f"sparkcluster's Docker SDK speaks {CLIENT_MIN}-{CLIENT_MAX}"
    )
    try:
        too_old = _key(engine.api) < _key(CLIENT_MIN)
    except ValueError:
        too_old = False
    if too_old:
        return what, f"upgrade Docker Engine on {host} (DGX OS: sudo apt-get update && sudo apt-get upgrade)"
    # the engine's floor is above every version sparkcluster knows: Docker 29 takes its floor from
    # daemon.json's "min-api-version" (shared/debs/README.md: the key arrived in 29)
    return what, (
        f'on {host}, let dockerd accept API {CLIENT_MAX}: put "min-api-version": "{CLIENT_MAX}" in '
        "/etc/docker/daemon.json, then sudo systemctl restart docker"
    )
