"""Who the SSH user is on a node and what it may do there: the account (name, uid, gid, groups,
home), whether it may write the HF cache and take the cluster lock. On a Spark the SSH user is an
ordinary account in the `docker` group (DGX OS's first-boot user, added to `docker` by NVIDIA's
playbooks), never root: `up` must need nothing more, and `doctor` says when a node gives less.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from sparkcluster.errors import SparkError
from sparkcluster.facts.probes import Probe, script, shell_path, split_sections, value


@dataclass(frozen=True)
class Account:
    user: str
    uid: int
    gid: int
    groups: list[str] = field(default_factory=list)  # of this login session (`id -Gn`)
    db_groups: list[str] = field(default_factory=list)  # in the group database now (`id -Gn USER`)
    home: str = ""

    @property
    def owner(self) -> str:
        """`uid:gid`, what a container writing into the user's files runs as (`docker run --user`)."""
        return f"{self.uid}:{self.gid}"


def parse_account(out: str) -> Account | None:
    lines = out.splitlines()
    if len(lines) < 6 or not lines[1].strip().isdigit() or not lines[2].strip().isdigit():
        return None
    return Account(lines[0].strip(), int(lines[1]), int(lines[2]), lines[3].split(), lines[4].split(), lines[5].strip())


ACCOUNT = Probe(
    "account",
    'u=$(id -un); printf "%s\\n" "$u" "$(id -u)" "$(id -g)" "$(id -Gn)" "$(id -Gn "$u")" "$HOME"',
    parse_account,
)


@dataclass(frozen=True)
class Access:
    cache: str = ""  # the HF cache as resolved on the node
    cache_writable: bool = False
    cache_nearest: str = ""  # the cache itself, or its nearest existing parent
    cache_nearest_owner: str = ""
    foreign: str = ""  # a path in the cache that another account owns ("" when none)
    foreign_owner: str = ""
    lock: str = ""
    lock_ok: bool = False
    lock_blocker: str = ""  # what stops the lock: the path, then its owner
    flock: bool = True


def parse_access(out: str) -> Access:
    kv: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        kv[key] = rest.split(" ", 1) if key in ("cache_denied", "cache_foreign", "lock_denied") else [rest]
    cache = kv.get("cache", [""])[0]
    denied, foreign, lock_denied = kv.get("cache_denied"), kv.get("cache_foreign"), kv.get("lock_denied")
    return Access(
        cache=cache,
        cache_writable="cache_ok" in kv,
        cache_nearest=(denied[1] if denied and len(denied) > 1 else kv.get("cache_ok", [cache])[0]),
        cache_nearest_owner=denied[0] if denied else "",
        foreign=foreign[1] if foreign and len(foreign) > 1 else "",
        foreign_owner=foreign[0] if foreign else "",
        lock=kv.get("lock", [""])[0],
        lock_ok="lock_ok" in kv and "lock_noflock" not in kv,
        lock_blocker=" owned by ".join(reversed(lock_denied)) if lock_denied else "",
        flock="lock_noflock" not in kv,
    )


def access(hf_cache: str, lock_path: str) -> Probe:
    """May the SSH user write the HF cache (or create it: its nearest existing parent) and take the
    lock (open the lock directory, or create it)? And the first path in the cache (four levels:
    hub/models--ORG--NAME/blobs/FILE) another account owns, which this user's own `hf` cannot update."""
    return Probe(
        "access",
        f'h={shell_path(hf_cache)}; l={shlex.quote(lock_path)}; u=$(id -u); echo "cache $h"; '
        'p=$h; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
        'if [ -d "$p" ] && [ -w "$p" ] && [ -x "$p" ]; then echo "cache_ok $p"; '
        'else echo "cache_denied $(stat -c %U "$p") $p"; fi; '
        'o=$(find "$h" -maxdepth 4 ! -user "$u" -print -quit 2>/dev/null); '
        '[ -z "$o" ] || echo "cache_foreign $(stat -c %U "$o") $o"; echo "lock $l"; '
        'if [ -e "$l" ]; then q=$l; [ -d "$l" ] && [ -r "$l" ] && ok=1 || ok=; '
        'else q=$(dirname "$l"); while [ ! -e "$q" ]; do q=$(dirname "$q"); done; '
        '[ -d "$q" ] && [ -w "$q" ] && [ -x "$q" ] && ok=1 || ok=; fi; '
        '[ -n "$ok" ] && echo "lock_ok $l" || echo "lock_denied $(stat -c %U "$q") $q"; '
        "command -v flock >/dev/null || echo lock_noflock",
        parse_access,
    )


def learn_homes(cluster) -> None:
    """The SSH user's home on every connected node, for the commands that gather no other facts
    (`weights status`, `weights rm`): the HF cache `~/...` is resolved there."""
    inv = cluster.inventory

    def one(host):
        res = host.run(script([ACCOUNT]), timeout=30)
        acct = value(ACCOUNT, split_sections(res.stdout))
        if acct is None or not acct.home:
            raise SparkError(
                f"{host.name}: could not learn the SSH user's home (id, $HOME)",
                "check that the SSH user has a home directory on this node",
            )
        inv.set_home(host.name, acct.home, acct.owner)

    cluster.each(one).values_or_raise("account")
