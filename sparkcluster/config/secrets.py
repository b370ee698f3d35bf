"""Secrets (`HF_TOKEN`, `VLLM_API_KEY`): from the environment or a `.env` of mode 0600.

Values are registered with `redact` the moment they are read, so any later output can be masked.
They are returned to the caller, who passes them in the environment of the `docker exec` that runs
`vllm serve` (Docker API exec environment), never on a command line (`ps` shows argv;
docs/field-notes.md, "Secrets"). A `.env` readable by group or others is refused.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dotenv import dotenv_values

from sparkcluster import redact
from sparkcluster.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from sparkcluster.config.profile import Profile

# The only secrets sparkcluster knows: from the environment or a 0600 .env, to vLLM through the
# environment of the `docker exec`, never argv (docs/field-notes.md, "Secrets"). Here, not in the
# profile module, so a command that reads a secret need not import the profile's models.
SECRET_NAMES: tuple[str, ...] = ("HF_TOKEN", "VLLM_API_KEY")

# the gateway's client keys (issue 36): one or more, comma-separated, read as the others are; they
# reach the gateway only in its 0600 config file inside its container, never argv or output
GATEWAY_KEYS = "GATEWAY_API_KEYS"

ENV_FILE_VAR = "SPARKCLUSTER_ENV_FILE"
DEFAULT_ENV_FILES = (Path(".env"), Path("~/.config/sparkcluster/.env"))

# names whose values are treated as secret wherever they show up
SECRETISH_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|PRIVATE_KEY|CREDENTIAL)", re.I)


def default_env_file() -> Path | None:
    env = os.environ.get(ENV_FILE_VAR)
    if env:
        return Path(env).expanduser()
    for p in DEFAULT_ENV_FILES:
        p = p.expanduser()
        if p.is_file():
            return p
    return None


def check_mode(path: Path) -> None:
    """Refuse a .env that group or others can access."""
    try:
        st = path.stat()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}", "check the path") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path} is not a regular file", "point --env-file at the .env file")
    if st.st_mode & 0o077:
        raise InputError(
            f"{path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o})", f"chmod 600 {path}"
        )


def read_env_file(path: Path) -> dict[str, str]:
    """The key/value pairs of a .env after the mode check; secret-looking values are registered."""
    check_mode(path)
    try:
        raw = dotenv_values(path)
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {path}: {e}", "check the file") from None
    values = {k: v for k, v in raw.items() if v is not None}
    for k, v in values.items():
        if k in SECRET_NAMES or SECRETISH_NAME.search(k):
            redact.register(v)
    return values


def load_secrets(
    env_file: Path | None = None,
    profile: "Profile | None" = None,
    *,
    names: Iterable[str] | None = None,
    environ: Mapping[str, str] | None = None,
    required: bool = False,
) -> dict[str, str]:
    """The secrets the profile needs, by name: {name: value}; names not found are left out.

    The process environment wins over the .env (python-dotenv's own rule). env_file None means
    $SPARKCLUSTER_ENV_FILE, else ./.env, else ~/.config/sparkcluster/.env, else none. A given
    env_file that does not exist is an error. required=True raises InputError naming the missing.
    """
    wanted = list(names) if names is not None else (list(profile.secrets) if profile else list(SECRET_NAMES))
    environ = os.environ if environ is None else environ
    explicit = env_file is not None
    path = env_file.expanduser() if env_file is not None else default_env_file()
    file_values: dict[str, str] = {}
    if path is not None:
        if not path.exists():
            if explicit or os.environ.get(ENV_FILE_VAR):
                raise InputError(f"no .env at {path}", "create it (mode 0600) or pass another --env-file")
        else:
            file_values = read_env_file(path)
    out: dict[str, str] = {}
    for name in wanted:
        value = environ.get(name) or file_values.get(name)
        if value:
            redact.register(value)
            out[name] = value
    if required:
        missing = [n for n in wanted if n not in out]
        if missing:
            where = f"the environment or {path}" if path else "the environment or a .env"
            raise InputError(
                f"missing secret(s): {', '.join(missing)}", f"set them in {where} (a .env must have mode 0600)"
            )
    return out


def masked(secrets: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """name -> '******' when set, '(not set)' otherwise: what `profile show` prints."""
    return {n: (redact.MASK if secrets.get(n) else "(not set)") for n in names}


def split_keys(value: str | None) -> list[str]:
    """The gateway's client keys from GATEWAY_API_KEYS ("k1,k2"), each registered for masking."""
    keys = [k.strip() for k in (value or "").split(",") if k.strip()]
    for k in keys:
        redact.register(k)
    return keys
