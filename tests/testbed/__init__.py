"""The two (to eight) simulated Sparks. Their profiles (tests/testbed/profiles/) do not ship with
sparkcluster: the suite, `make demo` and perf/ put that folder on the profile search path,
$SPARKCLUSTER_PROFILES (`profiles_env`), as an owner puts a folder of their own."""

from __future__ import annotations

import os
from pathlib import Path

PROFILES = Path(__file__).resolve().parent / "profiles"
PROFILES_ENV_VAR = "SPARKCLUSTER_PROFILES"  # sparkcluster.config.profile's, spelt here to import nothing


def profiles_env(*first: str | os.PathLike) -> str:
    """$SPARKCLUSTER_PROFILES with the given folders first (they shadow the testbed's), then the testbed's."""
    dirs = [str(d) for d in first if str(d)]
    return os.pathsep.join([*dirs, str(PROFILES)] if str(PROFILES) not in dirs else dirs)


def use_profiles() -> None:
    """Put the testbed's profiles on this process's search path (and its children's), after any folder
    already there."""
    current = [d for d in os.environ.get(PROFILES_ENV_VAR, "").split(os.pathsep) if d]
    os.environ[PROFILES_ENV_VAR] = profiles_env(*current)
