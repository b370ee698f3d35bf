"""Where the gateway's named keys and usage ledger are kept (gateway/store): the node holding its
folder, connected (where the gateway runs, else the inventory's head), and the key file's edits, each
one read, change and write back under that node's lock. `gateway keys` and `gateway usage` (the
CLI) parse and print around these."""

from __future__ import annotations

from sparkcluster.config.inventory import Inventory
from sparkcluster.deployment import gateway_registry
from sparkcluster.errors import SparkError
from sparkcluster.remote.fanout import connect_reachable
from sparkcluster.remote.lock import NodeLocks

from . import keys, rollout, store


class KeysPlace:
    """The node holding the gateway's folder, connected; whether the gateway running there reads it."""

    def __init__(self, inv: Inventory, node_name: str | None):
        self.inv = inv
        self.cluster, unreachable = connect_reachable(self.inv)
        running = {}
        for name, host in self.cluster.hosts.items():
            c = gateway_registry.find(host.docker().api, self.inv.cluster.name)
            if c is not None:
                running[name] = c
        name = node_name or next(iter(running), None) or self.inv.head.name
        if name not in self.cluster.hosts:
            self.cluster.close()
            err = unreachable.get(name)
            e = SparkError(
                f"{name} (where the gateway's keys and usage are kept) is unreachable"
                + (f": {err.message}" if err else ""),
                err.fix if err else "check the node, then run the command again",
            )
            e.problems = list(err.problems) if err else []  # the node's own, for --json
            raise e
        self.node, self.host = name, self.cluster.hosts[name]
        self.gateway = running.get(name)
        self.folder = store.folder(self.host, self.inv.cluster.name)

    def reads_keys(self) -> bool:
        mounts = (self.gateway or {}).get("Mounts") or []
        return any(m.get("Destination") == rollout.DATA_MOUNT for m in mounts)

    def when(self) -> str:
        if self.gateway is None:
            return "the gateway reads it when it starts (sparkcluster gateway up)"
        if not self.reads_keys():
            return "the gateway running there predates named keys: run sparkcluster gateway up once to let it read them"
        return "the running gateway takes it within a second (no restart)"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cluster.close()


def edit(inv: Inventory, node_name: str | None, what: str, change) -> tuple[str, str]:
    """Read the key file, `change(entries)` (returns what to say), write it back, under the node's lock."""
    with KeysPlace(inv, node_name) as at:
        with NodeLocks(at.cluster, at.inv.only([at.node]), f"gateway keys {what}"):
            entries = store.read_keys(at.host, at.folder)
            said = change(entries)
            store.write_keys(at.host, at.folder, entries)
        return said, f"key file {at.folder}/{keys.KEYS_FILE} on {at.node} (0600): {at.when()}"
