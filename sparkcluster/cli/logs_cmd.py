"""`sparkcluster logs [--node NODE] [--follow] [--since DURATION] [--last N]`: every line prefixed with its node.

Reading logs never touches the service: Ctrl-C only detaches.
"""

from __future__ import annotations

import re
import sys
import threading
import time

import click

from sparkcluster import redact
from sparkcluster.cli.main import cli
from sparkcluster.deployment import failed_serve, server
from sparkcluster.errors import InputError
from sparkcluster.labels import CLUSTER_LABEL, EXECUTOR_LABEL, ROLE_LABEL
from sparkcluster.remote.fanout import ConnectedHosts

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    m = re.fullmatch(r"(\d+)([smhd]?)", text.strip())
    if not m:
        raise InputError(f"--since {text!r} is not a duration", "use e.g. 90s, 10m, 2h or 1d")
    return int(m.group(1)) * _UNITS[m.group(2) or "s"]


@cli.command()
@click.option("--node", default=None, help="Only this node's logs (default: every node's).")
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing new lines until Ctrl-C (which never stops the service)."
)
@click.option("--since", default=None, help="Only container lines newer than this (e.g. 10m, 2h).")
@click.option(
    "--last",
    "tail_lines",
    default=200,
    show_default=True,
    type=click.IntRange(min=0),
    help="Lines of each log to start from.",
)
@click.pass_obj
def logs(obj, node: str | None, follow: bool, since: str | None, tail_lines: int) -> None:
    """The containers' logs (Ray) and vllm serve's log, from any node."""
    inv = obj.inventory()
    targets = [inv.node(node)] if node else inv.nodes
    since_ts = int(time.time()) - parse_duration(since) if since else None
    out_lock = threading.Lock()

    def emit(name: str, line: str) -> None:
        with out_lock:
            sys.stdout.write(redact.mask(f"{name} | {line}") + "\n")
            sys.stdout.flush()

    cluster = ConnectedHosts.connect(inv, targets)
    with cluster:

        def stream(host) -> None:
            api = host.docker().api
            found = api.containers(all=True, filters={"label": f"{CLUSTER_LABEL}={inv.cluster.name}"})
            if not found:
                kept = failed_serve.newest()
                log = kept / f"{host.name}.log" if kept else None
                emit(
                    host.name,
                    "(no sparkcluster container)"
                    + (f"; the last failed start's logs are kept in {log}" if log and log.is_file() else ""),
                )
                return
            c = found[0]
            kw = {"tail": tail_lines, "timestamps": False}
            if since_ts:
                kw["since"] = since_ts
            readers = []
            labels = c.get("Labels", {})
            # executor "mp": every node's agent runs its own rank of vllm serve (issue 28)
            mp = labels.get(EXECUTOR_LABEL) == "mp"
            if (labels.get(ROLE_LABEL) == "head" or mp) and c.get("State") == "running":
                readers.append(("vllm", lambda: _vllm_log(api, c["Id"], tail_lines, follow)))
            readers.append(("agent" if mp else "ray", lambda: api.logs(c["Id"], stream=True, follow=follow, **kw)))
            threads = []
            for label, make in readers:

                def pump(label=label, make=make):
                    buf = b""
                    for chunk in make():
                        buf += chunk
                        while b"\n" in buf:
                            line, buf = buf.split(b"\n", 1)
                            emit(f"{host.name} {label}", line.decode(errors="replace"))
                    if buf:
                        emit(f"{host.name} {label}", buf.decode(errors="replace"))

                t = threading.Thread(target=pump, daemon=True)
                t.start()
                threads.append(t)
            for t in threads:
                while t.is_alive():
                    t.join(0.2)

        hosts = [cluster.hosts[n.name] for n in targets]
        threads = [threading.Thread(target=stream, args=(h,), daemon=True) for h in hosts]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        except KeyboardInterrupt:
            click.echo("detached (the service keeps running)", err=True)


def _vllm_log(api, container: str, tail_lines: int, follow: bool):
    argv = ["tail", "-n", str(tail_lines)] + (["-F"] if follow else []) + [server.LOG_PATH]
    ex = api.exec_create(container, argv)
    return api.exec_start(ex["Id"], stream=True)
