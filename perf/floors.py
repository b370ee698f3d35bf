"""What a short command cannot avoid, measured in the same run as the command (issue 40 item 6):
its figures are ratios to these floors, not seconds, so that they hold on a slower or busier
machine (absolute bounds such as "< 1 s" moved 2-3x between machines of one kind).

- start-up: a fresh interpreter (the CLI's own, same environment and working directory) that
  imports exactly the modules the command imports, as `python -X importtime` lists them for one
  unmeasured run of that command, and exits the way the CLI exits (after `gc.freeze()`).
  Interpreter start-up, `site`, every import the command makes and the process's exit are in it;
  the command's own work is not. (A module imported but not needed counts
  as unavoidable here; tests/unit/test_cli_startup.py keeps `--help` light.)
- per host, alone (one host after the other, each on a fresh connection made the way
  sparkcluster makes it, `remote.fanout.connect_all`): the SSH connection (TCP, key exchange,
  authentication), one round trip (`true`), and the facts script (`facts.gather`).

Floors: `status --json` = start-up + max over hosts of (connect + one round trip): status reads each
node in one bounded round trip. `doctor` and `up` on a serving cluster = start-up + max over hosts of
(connect + facts script): both gather facts, once per host in parallel, so the slowest host bounds
them. Everything else a command does (checks, the endpoint's answer, the path-MTU pings, the plan,
rendering) is what the ratio's 1.5 leaves room for.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

from perf.cli import REPO
from perf.session import PROFILE

# the commands whose wall time is a ratio, with the argv they run with (on a serving cluster)
COMMANDS: dict[str, tuple[str, ...]] = {
    "doctor": ("doctor",),
    "status": ("status", "--json"),
    "up_serving": ("up", "--profile", PROFILE),
}

# a module the command tried and lacked (an optional dependency) is tried again: the same lookup;
# then exit as the CLI exits, after gc.freeze() (sparkcluster/cli/main.py: the collector's last pass
# is skipped), so that the floor is not charged for what the command avoids
IMPORT_ONLY = (
    "import gc, importlib, sys\n"
    "for name in open(sys.argv[1]).read().split():\n"
    "    try:\n"
    "        importlib.import_module(name)\n"
    "    except Exception:\n"
    "        pass\n"
    "gc.freeze()\n"
)


def imported_modules(importtime_stderr: str) -> list[str]:
    """The modules a process imported, in the order `-X importtime` reports them (each module after
    what it imported), from that run's stderr; `__main__` modules left out (running them would
    run the command)."""
    out, seen = [], set()
    for line in importtime_stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        cols = line.split("|")
        if len(cols) != 3:
            continue
        name = cols[2].strip()
        if not name or name == "imported package" or name.endswith("__main__") or name in seen:
            continue
        seen.add(name)
        out.append(name)
    return out


def learn_imports(sc, args: tuple[str, ...]) -> list[str]:
    """One unmeasured run of the command under `python -X importtime`: the modules it imports."""
    r = sc(*args, check=False, python_flags=("-X", "importtime"))
    mods = imported_modules(r.stderr)
    if "sparkcluster.cli.main" not in mods:
        raise SystemExit(
            f"bench: -X importtime listed no sparkcluster.cli.main for {' '.join(args)}\n{r.stderr[-2000:]}"
        )
    return mods


def startup_s(modules: list[str], env: dict[str, str]) -> float:
    """Wall time of a fresh interpreter that imports `modules` and exits (process start to exit)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="sparkcluster-bench-imports-") as f:
        f.write("\n".join(modules))
        f.flush()
        t0 = time.time()
        subprocess.run([sys.executable, "-c", IMPORT_ONLY, f.name], env=env, cwd=str(REPO), check=True)
        return time.time() - t0


def per_host(inv, prof) -> dict[str, dict[str, float]]:
    """{node: {"connect", "round_trip", "facts"}} in seconds, each node alone on a fresh connection."""
    from sparkcluster import facts
    from sparkcluster.checks import preflight
    from sparkcluster.remote.fanout import connect_all

    image = preflight.expectations(inv, prof).image
    out: dict[str, dict[str, float]] = {}
    for node in inv.nodes:
        t0 = time.time()
        h = connect_all(inv, [node]).values_or_raise("connect")[node.name]
        try:
            t1 = time.time()
            h.run("true", timeout=30)
            t2 = time.time()
            facts.gather(h, inv, image)
            t3 = time.time()
        finally:
            h.close()
        out[node.name] = {"connect": t1 - t0, "round_trip": t2 - t1, "facts": t3 - t2}
    return out


def floors(startup: dict[str, float], hosts: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each command's floor in seconds, from its start-up and the hosts' parts (see the docstring)."""
    status_net = max(h["connect"] + h["round_trip"] for h in hosts.values())
    facts_net = max(h["connect"] + h["facts"] for h in hosts.values())
    return {
        "doctor": startup["doctor"] + facts_net,
        "status": startup["status"] + status_net,
        "up_serving": startup["up_serving"] + facts_net,
    }


def measure(s, walls: dict[str, float]) -> dict[str, float]:
    """One repetition, right after the commands' own runs (`walls`: their wall times by COMMANDS
    key): each command's start-up and the hosts' parts, recorded with the ratios wall / floor."""
    imports = s.floor_imports
    for key, args in COMMANDS.items():
        if key not in imports:
            imports[key] = learn_imports(s.sc, args)
            s.details.setdefault("floor_modules_imported", {})[key] = len(imports[key])
    startup = {key: startup_s(imports[key], s.sc.env) for key in COMMANDS}
    hosts = per_host(s.inv, s.prof)
    fl = floors(startup, hosts)
    s.rec("floor_startup", startup)
    s.rec("floor_hosts", hosts)
    s.rec("floor_s", fl)
    ratios = {key: walls[key] / fl[key] for key in COMMANDS}
    for key, ratio in ratios.items():
        s.rec(f"{key}_floor_ratio", ratio)
    return ratios
