"""Shell that prints a command's output between named markers, so that one script run once (over
SSH, by `docker exec`, or by the node agent) answers many readings; the controller splits them
(facts/probes `split_sections`).

Standard library only: this file is shipped into every container."""

from __future__ import annotations

import shlex

SECTION = "@@sc@@"


def section(name: str, cmd: str, stderr: bool = True) -> str:
    """Shell that prints `cmd`'s output between markers, with its exit status. The closing marker
    starts on a fresh line even when the output does not end with a newline (JSON from curl). The
    name is quoted: it may carry an interface name or an address."""
    redirect = "2>&1" if stderr else "2>/dev/null"
    marker = shlex.quote(f"{SECTION} {name}")
    return f"echo {marker}; ( {cmd} ) {redirect}; rc=$?; printf '\\n%s rc=%s\\n' {marker} \"$rc\""
