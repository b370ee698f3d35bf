"""The monitoring containers: Prometheus and Alertmanager on the head, node_exporter on every node,
each from the image `[monitor]` names, started with its binary named (so that the upstream images
and one built otherwise start the same way), on the host's network, listening on the node's control
IP (`[monitor] listen`), restarted by Docker after a reboot. Their data (Prometheus' TSDB with its
retention bounds, Alertmanager's silences) lives in named volumes on the head's disk, kept by
`monitor down` unless asked.

Prometheus and Alertmanager run as `nobody` (as in the upstream images); Alertmanager's config holds
the webhook (a secret), so it is written 0600 and owned by that user, as is the key Prometheus shows
the gateway's `/metrics` (scrape.GATEWAY_KEY_FILE: empty when there is none, and the gateway
answers 401). node_exporter runs as the SSH user (the owner), reading the host's /proc and /sys read-only."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sparkcluster.config.inventory import Inventory
from sparkcluster.container.spec import files_tar_modes
from sparkcluster.labels import MONITOR_LABEL
from sparkcluster.monitor import scrape

PROMETHEUS, ALERTMANAGER, NODE_EXPORTER = "prometheus", "alertmanager", "node-exporter"
NOBODY = "65534:65534"
RULES = Path(__file__).parent / "rules"
PROM_CONFIG, AM_CONFIG = "/etc/prometheus/prometheus.yml", "/etc/alertmanager/alertmanager.yml"


@dataclass
class Spec:
    """One monitoring container, as the Docker Engine API creates it."""

    component: str
    node: str
    name: str
    image: str
    entrypoint: list[str]
    args: list[str]
    user: str
    volumes: dict[str, str] = field(default_factory=dict)  # named volume or host path -> container path
    read_only: set[str] = field(default_factory=set)  # of the sources above
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # path -> (text, mode)
    pid_host: bool = False

    def describe(self) -> str:
        return f"{self.component} on {self.node}: {self.image} {' '.join(self.entrypoint + self.args)}"


def container(inv: Inventory, component: str) -> str:
    return f"sparkcluster-{inv.cluster.name}-{component}"


def volume(inv: Inventory, component: str) -> str:
    return f"sparkcluster-{inv.cluster.name}-{component}-data"


def rule_files() -> dict[str, str]:
    return {f"{scrape.RULES_DIR}/{f.name}": f.read_text() for f in sorted(RULES.glob("*.yml"))}


def specs(
    inv: Inventory, prometheus_yml: str, alertmanager_yml: str, owners: dict[str, str], gateway_key: str | None = None
) -> list[Spec]:
    """Every container `monitor up` starts; `owners`: node -> the SSH user's uid:gid there;
    `gateway_key`: the key Prometheus shows the gateway's `/metrics`."""
    m, head = inv.monitor, inv.head.name
    out = [
        Spec(
            PROMETHEUS,
            head,
            container(inv, PROMETHEUS),
            m.prometheus_image,
            ["/bin/prometheus"],
            [
                f"--config.file={PROM_CONFIG}",
                "--storage.tsdb.path=/prometheus",
                f"--storage.tsdb.retention.time={m.retention_time}",
                f"--storage.tsdb.retention.size={m.retention_size}",
                f"--web.listen-address={scrape.listen_ip(inv, head)}:{m.prometheus_port}",
            ],
            NOBODY,
            volumes={volume(inv, PROMETHEUS): "/prometheus"},
            files={
                PROM_CONFIG: (prometheus_yml, 0o644),
                scrape.GATEWAY_KEY_FILE: (gateway_key or "", 0o600),
                **{p: (t, 0o644) for p, t in rule_files().items()},
            },
        ),
        Spec(
            ALERTMANAGER,
            head,
            container(inv, ALERTMANAGER),
            m.alertmanager_image,
            ["/bin/alertmanager"],
            [
                f"--config.file={AM_CONFIG}",
                "--storage.path=/alertmanager",
                f"--web.listen-address={scrape.listen_ip(inv, head)}:{m.alertmanager_port}",
                "--cluster.listen-address=",  # one Alertmanager: no gossip port on every interface
            ],
            NOBODY,
            volumes={volume(inv, ALERTMANAGER): "/alertmanager"},
            files={AM_CONFIG: (alertmanager_yml, 0o600)},
        ),
    ]
    if m.node_exporter:
        for n in inv.nodes:
            out.append(
                Spec(
                    NODE_EXPORTER,
                    n.name,
                    container(inv, NODE_EXPORTER),
                    m.node_exporter_image,
                    ["/bin/node_exporter"],
                    [
                        f"--web.listen-address={scrape.listen_ip(inv, n.name)}:{m.node_exporter_port}",
                        "--path.procfs=/host/proc",
                        "--path.sysfs=/host/sys",
                        "--path.rootfs=/host/root",
                        "--collector.filesystem.mount-points-exclude=^/(dev|proc|sys|run|var/lib/docker/.+)($|/)",
                    ],
                    owners.get(n.name, NOBODY),
                    volumes={"/proc": "/host/proc", "/sys": "/host/sys", "/": "/host/root"},
                    read_only={"/proc", "/sys", "/"},
                    pid_host=True,
                )
            )
    return out


def files_tar(files: dict[str, tuple[str, int]], owner: str) -> bytes:
    """The files (text, mode) owned by `owner` ("uid:gid"), with their folders."""
    uid, gid = (int(x) for x in owner.split(":"))
    return files_tar_modes(files, uid, gid)


def labels(inv: Inventory, component: str) -> dict[str, str]:
    return {MONITOR_LABEL: inv.cluster.name, f"{MONITOR_LABEL}.component": component}


def start(api, inv: Inventory, spec: Spec) -> str:
    """Replace the container `spec` names (its data volume stays) and start it. Returns its ID."""
    import docker.errors

    remove(api, spec.name)
    try:
        api.inspect_image(spec.image)
    except docker.errors.ImageNotFound:
        api.pull(spec.image)
    binds = {src: {"bind": dst, "mode": "ro" if src in spec.read_only else "rw"} for src, dst in spec.volumes.items()}
    hc = api.create_host_config(
        network_mode="host",
        restart_policy={"Name": "unless-stopped"},
        binds=binds,
        pid_mode="host" if spec.pid_host else None,
    )
    c = api.create_container(
        spec.image,
        command=spec.args,
        entrypoint=spec.entrypoint,
        name=spec.name,
        user=spec.user,
        labels=labels(inv, spec.component),
        host_config=hc,
    )
    if spec.files:
        api.put_archive(c["Id"], "/", files_tar(spec.files, spec.user))
    api.start(c["Id"])
    return c["Id"]


def remove(api, name: str) -> bool:
    import docker.errors

    try:
        api.remove_container(name, force=True)
        return True
    except docker.errors.NotFound:
        return False


def ours(api, inv: Inventory) -> list[dict]:
    return api.containers(all=True, filters={"label": f"{MONITOR_LABEL}={inv.cluster.name}"})


def running(api, inv: Inventory, component: str) -> bool:
    name = container(inv, component)
    return any(f"/{name}" in (c.get("Names") or []) and c.get("State") == "running" for c in ours(api, inv))


def exec_in(api, inv: Inventory, component: str, argv: list[str]):
    from sparkcluster.remote.dockerapi import run_in  # Docker's SDK only where a command runs in a container

    return run_in(api, container(inv, component), argv, warn=True)


def down(api, inv: Inventory, purge: bool = False) -> list[str]:
    """Remove this node's monitoring containers (and, with `purge`, their data volumes)."""
    import docker.errors

    removed = []
    for c in ours(api, inv):
        api.remove_container(c["Id"], force=True)
        removed.append((c.get("Names") or ["?"])[0].lstrip("/"))
    if purge:
        for component in (PROMETHEUS, ALERTMANAGER):
            try:
                api.remove_volume(volume(inv, component))
                removed.append(f"volume {volume(inv, component)}")
            except docker.errors.NotFound:
                pass
    return removed
