"""The SSH user's checks: may it do on each node what `up` will do there, without sudo? On a Spark
it is an ordinary account (DGX OS's first-boot user) in the `docker` group (NVIDIA's playbooks add
it): it must reach Docker, write its HF cache, and take the cluster lock. Disk is `disk.free`."""

from __future__ import annotations

from sparkcluster.checks.registry import Context, Report, check

# what `docker info` prints when the socket refuses this account (the Docker CLI's own wording)
SOCKET_DENIED = "permission denied while trying to connect to the docker"


def socket_denied(docker_error: str) -> bool:
    return SOCKET_DENIED in docker_error.lower()


@check("account.docker", "The SSH user may use Docker")
def account_docker(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        a = f.account
        if a is None:
            continue
        if a.uid == 0:
            r.ok(n, "root")
        elif f.docker is not None:
            r.ok(n, f"{a.user}, in docker" if "docker" in a.groups else f"{a.user} (the socket lets it in)")
        elif not socket_denied(f.docker_error):
            continue  # the engine itself is down or broken: docker.engine says so
        elif "docker" in a.db_groups:
            r.fail(
                n,
                f"{a.user} was added to the docker group after this login session began ({f.docker_error})",
                f"log in again on {n} (a new session picks up the group), then rerun",
            )
        else:
            r.fail(
                n,
                f"{a.user} is not in the docker group: the Docker socket refuses it",
                f"on {n}: sudo usermod -aG docker {a.user}, then log in again (a new session picks up the group)",
            )


@check("account.hf_cache", "The SSH user may write its HF cache")
def account_hf_cache(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        x, a = f.access, f.account
        if x is None or a is None:
            continue
        who = a.user
        if not x.cache_writable:
            r.fail(
                n,
                f"{x.cache}: {x.cache_nearest} is owned by {x.cache_nearest_owner or 'another account'}, "
                f"{who} may not write it",
                f"on {n}: sudo chown -R {who}: {x.cache_nearest}, or set hf_cache in the inventory to a "
                f"directory {who} owns",
            )
        elif x.foreign:
            r.warn(
                n,
                f"{x.foreign} is owned by {x.foreign_owner}, not {who}: {who}'s own `hf` cannot update that cache",
                f"on {n}: sudo chown -R {who}: {x.cache}",
            )
        else:
            r.ok(n, x.cache)


@check("account.lock", "The SSH user may take the cluster lock")
def account_lock(ctx: Context, r: Report) -> None:
    for n, f in ctx.facts.items():
        x = f.access
        if x is None:
            continue
        if not x.flock:
            r.fail(
                n,
                "flock is not installed (util-linux): the cluster lock needs it",
                f"on {n}: sudo apt install util-linux",
            )
        elif not x.lock_ok:
            r.fail(
                n,
                f"cannot take the lock {x.lock}: {x.lock_blocker or 'not writable'}",
                f"on {n}: sudo rm -rf {x.lock.rsplit('/', 1)[0]} (made by another tool); sparkcluster makes "
                "it again, open to every account",
            )
        else:
            r.ok(n, x.lock)
