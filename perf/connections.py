"""SSH connections per host for each command (one each, whatever the command): "Accepted publickey"
lines in each host's sshd log before and after the command's run (perf/cli.py counts them for every
CLI run; the family modules record them under `conns_<command>`).
"""

from __future__ import annotations

from perf.figures import Figure

COMMANDS = {
    "conns_doctor": "doctor",
    "conns_up_serving": "up on a serving cluster",
    "conns_up_down": "up from down",
    "conns_status": "status",
}


def figures(R: dict, hosts: tuple[str, ...]) -> list[Figure]:
    F = []
    for key, title in COMMANDS.items():
        for h in hosts:
            v = [float(c[h]) for c in R[key]]
            F.append(Figure(f"{key}_{h}", f"SSH connections to {h}: {title}", "count", "1", v, all(x == 1 for x in v)))
    return F
