"""The shared-memory janitor: /dev/shm segments this container's processes mapped and no longer map."""

from __future__ import annotations

import os

from .journal import Journal
from .readings import SHM_SEGMENT


def shm_in_use(proc: str = "/proc") -> set[str]:
    """The multiprocessing segments this container's processes map or hold open now."""
    names: set[str] = set()
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(f"{proc}/{pid}/maps", errors="replace") as f:
                names.update(SHM_SEGMENT.findall(f.read()))
            for fd in os.listdir(f"{proc}/{pid}/fd"):
                target = os.readlink(f"{proc}/{pid}/fd/{fd}")
                if SHM_SEGMENT.fullmatch(target):
                    names.add(target)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return names


class ShmJanitor:
    """Removes a segment this container's processes mapped once none has mapped it for two looks
    in a row: what a stopped or killed engine leaves in the host's /dev/shm (--ipc host) would
    otherwise hold memory until the host reboots. Another program's segments are never touched."""

    def __init__(self, journal: Journal):
        self.seen: set[str] = set()
        self.unmapped_once: set[str] = set()
        self.journal = journal

    def look(self) -> None:
        now = shm_in_use()
        gone = {n for n in self.seen - now if os.path.exists(n)}
        doomed = gone & self.unmapped_once
        for name in sorted(doomed):
            try:
                os.unlink(name)
            except OSError:
                continue
        if doomed:
            self.journal.write("shm removed", segments=len(doomed))
        self.unmapped_once = gone - doomed
        self.seen = (self.seen | now) - doomed - {n for n in self.seen if not os.path.exists(n)}
