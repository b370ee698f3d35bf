"""`gateway up` and `gateway down` as steps: connect, read what runs, make the steps (each with its
run), then print them (`--dry-run`) or walk them under the node's lock. The CLI parses and prints."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkcluster.config import profile as profiles
from sparkcluster.config.inventory import Inventory
from sparkcluster.config.service_profile import is_service
from sparkcluster.deployment import deployments, gateway_registry
from sparkcluster.errors import SparkError
from sparkcluster.remote.fanout import connect_reachable
from sparkcluster.remote.lock import NodeLocks
from sparkcluster.steps.base import Step

from . import deploy, rollout, store


def routes(inv: Inventory, node_name: str | None):
    """Connect, find the deployments and their profiles: (gateway node, cluster, found, profiles,
    nodes that could not be read). The gateway's node out of reach is an error."""
    node = inv.node(node_name) if node_name else inv.head
    cluster, unreachable = connect_reachable(inv)
    if node.name not in cluster.hosts:
        cluster.close()
        err = unreachable[node.name]
        e = SparkError(f"{node.name} (the gateway's node) is unreachable: {err.message}", err.fix)
        e.problems = list(err.problems)  # the node's own, for --json
        raise e
    found, unread = deployments.on(cluster, inv)
    try:
        loaded = {d.profile: profiles.load_profile(d.profile, service=True) for d in found}
    except SparkError:
        cluster.close()
        raise
    missing = {**{n: e.message for n, e in unreachable.items()}, **unread}
    return node, cluster, found, loaded, missing


def up(inv: Inventory, node_name, secrets, keys, *, port, drain_s, image, tls, dry_run, say, warn, more_secrets=None):
    """The plan; unless `dry_run`, walked (each step said done): (plan, what the gateway routes).
    `more_secrets(names)`: the services' keys the gateway sends them (their profiles' `bearer`
    secrets), read as the others are, once the deployments and their profiles are known."""
    node, cluster, found, loaded, missing = routes(inv, node_name)
    bearers = sorted({p.bearer.name for p in loaded.values() if is_service(p) and p.bearer})
    if bearers and more_secrets is not None:
        secrets = {**secrets, **more_secrets(bearers)}
    with cluster:
        api = cluster.hosts[node.name].docker().api
        running = gateway_registry.find(api, inv.cluster.name)
        img = image or deploy.deployment_image(api, inv.cluster.name) or (running or {}).get("Image")
        tokens = deploy.wake_tokens(cluster.hosts, inv, found, loaded)
        held = gateway_registry.holds(api, running)  # an upgrade's hold, kept (read again just before the write)
        data = store.folder(cluster.hosts[node.name], inv.cluster.name)  # its key file and usage ledger
        p = rollout.make(
            inv, node.name, found, loaded, secrets, keys, img, running, port, drain_s, tls, tokens, held, data
        )
        for n, why in sorted(missing.items()):
            warn(f"{n}: cannot read what runs there, so its deployments are not routed: {why}")
        if dry_run:
            return p, None
        say(p.render())
        with NodeLocks(cluster, inv.only([node.name]), "gateway up"):
            return p, deploy.apply(api, p, cluster.hosts[node.name], say=say)


@dataclass
class Down:
    """What `gateway down` found and did: its steps, what each did, the nodes not looked at."""

    steps: list[Step]
    removed: list[str] = field(default_factory=list)  # a line per step walked: what it removed or deleted
    unreachable: dict[str, SparkError] = field(default_factory=dict)

    @property
    def stopped(self) -> bool:
        """Whether a gateway was found (and, walked, stopped)."""
        return any(s.action == "stop" for s in self.steps)


def down(inv: Inventory, dry_run: bool, purge_usage: bool = False) -> Down:
    """A step per gateway found on the nodes that answer (with `purge_usage`, one more per node that
    keeps its usage ledger: where the gateway ran, else the head); walked unless `dry_run`."""
    cluster, unreachable = connect_reachable(inv)
    with cluster:
        apis = {n: h.docker().api for n, h in cluster.hosts.items()}
        found = {n: c for n, api in apis.items() if (c := gateway_registry.find(api, inv.cluster.name)) is not None}
        steps = deploy.down_steps(found)
        for name in (sorted(found) or [inv.head.name]) if purge_usage else []:
            if name in cluster.hosts:
                steps.append(_purge_step(cluster.hosts[name], store.folder(cluster.hosts[name], inv.cluster.name)))
        out = Down(steps, unreachable=unreachable)
        if not dry_run and out.steps:
            done = deploy.walk_said(deploy.GatewayRun(apis=apis), out.steps)
            out.removed = [v for _, v in done]
    return out


def _purge_step(host, folder: str) -> Step:
    def run(r) -> str:
        store.purge(host, folder)
        return f"{host.name}: deleted the usage ledger in {folder}/usage (the keys stay)"

    what = f"delete the usage ledger in {folder}/usage (the keys stay)"
    return Step("gateway", host.name, "purge-usage", what, f"rm -rf {folder}/usage", run=run)
