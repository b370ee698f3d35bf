"""An upgrade's hold on the gateway (issue 39 item 5): traffic for the deployment being upgraded is
drained and held, not dropped. `hold` adds the deployment to the running gateway's config under
`held_until`: the hold's deadline, `HOLD_S` from when the hold began, on the gateway node's own clock
(read in its container, so the controller's clock never counts). An absolute deadline, so neither a
reload of the config (`gateway up`, a wake token handed over) nor a new gateway container that
`gateway up` carries the hold into restarts the bound. From its next look the gateway sends that
deployment no new request, lets the ones in flight finish, and keeps new ones waiting (gateway/app:
a held request looks again every quarter second) until `release` takes the entry out, or the
deadline passes and the usual 503 with Retry-After answers. `hold` returns once
the requests in flight have drained (within `drain_s`), so the old engine stops with none running.

The controller's side only: it reaches the gateway's container through the Docker API of the node
it runs on, as `gateway up` does; the gateway itself never learns about upgrades.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass

import docker.errors

from sparkcluster import programs
from sparkcluster.deployment import gateway_registry
from sparkcluster.deployment.gateway_registry import CONFIG_PATH
from sparkcluster.errors import SparkError
from sparkcluster.remote.dockerapi import run_in

HOLD_S = 1800.0  # the longest a request waits: an upgrade's up, canary and bench (a cold compile included)
DRAIN_S = 120.0  # the longest hold() waits for the requests in flight to end
LOOK_S = 0.5

CLOCK = "import time; print(time.time())"  # inside the gateway's container: its node's clock
STATUS = "sparkcluster.programs.gateway_status"  # inside the gateway's container: its own /gateway/status


@dataclass
class GatewayHold:
    """upgrade.Traffic for the gateway container `container`; `docker` opens the Docker API of the
    node it runs on (a context manager: connected for each hold and release, not across the upgrade)."""

    docker: object
    container: str
    deployment: str  # PROFILE@NODE+NODE, the gateway's route key
    node: str = ""  # where it runs, for messages
    hold_s: float = HOLD_S
    drain_s: float = DRAIN_S

    def _set(self, api, held: bool) -> None:
        doc = gateway_registry.read_doc(api, self.container)
        holds = dict(doc.get("held_until") or {})
        if held:
            holds[self.deployment] = self.clock(api) + self.hold_s
        else:
            holds.pop(self.deployment, None)
        doc["held_until"] = holds
        gateway_registry.write_doc(api, self.container, doc)

    def clock(self, api) -> float:
        """time.time() on the gateway's node, the clock the gateway judges the deadline by."""
        return float(run_in(api, self.container, ["python3", "-c", CLOCK]).stdout.strip())

    def route(self, api) -> dict | None:
        """The deployment as the gateway reports it (in flight, held); None when it does not say."""
        got = run_in(api, self.container, programs.argv(STATUS, CONFIG_PATH), warn=True)
        try:
            routes = json.loads(got.stdout)["routes"]
        except (ValueError, KeyError, TypeError):
            return None
        return next((r for r in routes if r.get("deployment") == self.deployment), None)

    def hold(self) -> str:
        """Held once the gateway has read the hold (its next look) and the requests in flight ended."""
        with self.docker() as api:
            self._set(api, True)
            deadline = time.monotonic() + self.drain_s
            r = self.route(api)
            while time.monotonic() < deadline and (r is None or not r.get("held_s") or r.get("in_flight")):
                time.sleep(LOOK_S)
                r = self.route(api)
        if r is None or not r.get("held_s"):
            return f"asked {self.container} to hold new requests; it did not confirm within {self.drain_s:g}s"
        if r.get("in_flight"):
            return f"new requests held by {self.container}; {r['in_flight']} still in flight after {self.drain_s:g}s"
        return f"new requests held by {self.container} (at most {self.hold_s:g}s); none in flight"

    def release(self) -> str:
        with self.docker() as api:
            self._set(api, False)
        return f"{self.container} sends requests to {self.deployment} again"


@dataclass
class Holds:
    """upgrade.Traffic for every gateway that routes the deployment (an owner may run one on each
    node): each held in turn; each released even where another's release failed, and a release
    that failed is one error naming the gateway, when its hold ends by itself, and how to end it now
    (`gateway down` removes the container and its config; `gateway up` then starts one without it)."""

    each: list[GatewayHold]

    def hold(self) -> str:
        return "; ".join(h.hold() for h in self.each)

    def release(self) -> str:
        said, failed = [], []
        for h in self.each:
            try:
                said.append(h.release())
            except (SparkError, docker.errors.DockerException, OSError) as e:
                failed.append(f"{h.container} on {h.node or 'its node'}: {getattr(e, 'message', None) or e}")
        if failed:
            raise SparkError(
                f"could not release the held requests of {self.each[0].deployment} ({'; '.join(failed)}): "
                f"they wait until the hold's deadline ({self.each[0].hold_s / 60:g} min after it began), then get 503",
                "sparkcluster gateway down, then sparkcluster gateway up: the new gateway holds nothing",
            )
        return "; ".join(said)


def find(inv, deployment: str) -> Holds | None:
    """The holds on every gateway that routes `deployment`, on the nodes of `inv` that answer (one
    look over SSH; a node that does not cannot hold anything); None where none does."""
    # lazy: the deployment package stays light to import
    from sparkcluster.remote.fanout import ConnectedHosts, connect_all

    found: list[GatewayHold] = []
    res = connect_all(inv, None)
    try:
        for name, host in res.succeeded.items():
            got = gateway_registry.routing(host.docker().api, inv.cluster.name, deployment)
            if got is None:
                continue
            node = next(n for n in inv.nodes if n.name == name)

            @contextlib.contextmanager
            def open_api(node=node):
                with ConnectedHosts.connect(inv, [node]) as one:
                    yield one.hosts[node.name].docker().api

            found.append(GatewayHold(open_api, got[0], deployment, node=name))
    finally:
        for host in res.succeeded.values():
            host.close()
    return Holds(found) if found else None
