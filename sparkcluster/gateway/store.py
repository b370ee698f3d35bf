"""The gateway's folder on its node, from the controller, over the node's SSH connection: where it
is (FOLDER under the SSH user's home, one per cluster, mode 0700), the key file in it (read, and
written from stdin, aside and renamed, so no key or hash reaches a command line and the gateway
never reads half a file), the usage ledger read by a program on the host
(programs/gateway_usage), and the ledger's removal (`gateway down --purge-usage`, the only thing
that removes it). The folder is bound into the gateway's container (rollout.DATA_MOUNT)."""

from __future__ import annotations

import json
import shlex

from sparkcluster import programs
from sparkcluster.deployment import head_records
from sparkcluster.errors import SparkError
from sparkcluster.programs.gateway_usage import USAGE_DIR

from . import keys

FOLDER = head_records.FOLDER  # under the SSH user's home, then the cluster's name
USAGE_PROGRAM = "sparkcluster.programs.gateway_usage"


def folder(host, cluster: str) -> str:
    """The folder's absolute path on the node (the SSH user's home read there: Docker binds need one);
    the console's records (deployment/head_records) are kept in it too."""
    return head_records.folder(host, cluster)


def prepare(host, path: str) -> None:
    """The folder and its usage subfolder, 0700, the SSH user's."""
    dirs = f"{shlex.quote(path)} {shlex.quote(path + '/' + USAGE_DIR)}"
    host.run(f"mkdir -p {dirs} && chmod 700 {dirs}", timeout=30)


def read_keys(host, path: str) -> list[keys.Entry]:
    got = host.run(f"cat {shlex.quote(path + '/' + keys.KEYS_FILE)}", timeout=30, warn=True)
    if got.exit_code != 0:
        if "No such file" in got.stderr:
            return []
        raise SparkError(f"{host.name}: could not read the gateway's key file: {got.stderr.strip()}")
    try:
        return keys.parse(got.stdout)
    except ValueError as e:
        raise SparkError(
            f"{host.name}: the gateway's key file {path}/{keys.KEYS_FILE} is not valid JSON: {e}",
            "restore it from a backup, or remove it and add the keys again",
        ) from None


def write_keys(host, path: str, entries: list[keys.Entry]) -> None:
    prepare(host, path)
    target = shlex.quote(f"{path}/{keys.KEYS_FILE}")
    host.run(
        f"umask 077 && cat > {target}.new && mv -f {target}.new {target}",
        timeout=30,
        stdin=keys.render(entries).encode(),
    )


def usage(host, path: str, since: int, key: str | None, model: str | None) -> list[dict]:
    """The ledger's rows, read on the node by programs/gateway_usage."""
    cmd = programs.command(USAGE_PROGRAM, f"{path}/{USAGE_DIR}", str(int(since)), key or "", model or "")
    got = host.run(cmd, timeout=120)
    return json.loads(got.stdout or "[]")


def purge(host, path: str) -> None:
    host.run(f"rm -rf {shlex.quote(path + '/' + USAGE_DIR)}", timeout=60)
