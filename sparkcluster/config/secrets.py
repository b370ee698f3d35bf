"""Secrets (`HF_TOKEN`, `VLLM_API_KEY`): from the environment or a `.env` of mode 0600.

Values are registered with `redact` the moment they are read, so any later output can be masked.
They are returned to the caller, who passes them in the environment of the `docker exec` that runs
`vllm serve` (Docker API exec environment), never on a command line (`ps` shows argv;
docs/field-notes.md, "Secrets"). A `.env` readable by group or others is refused.

Which `.env`: `--env-file`, else `$SPARKCLUSTER_ENV_FILE`, else `~/.config/sparkcluster/.env`. A
`./.env` in the current folder is never read unless named: the folder is wherever the owner happens
to stand, and its `.env` is usually another project's (issue 34: one of mode 0644 holding nothing of
ours blocked `status`, and the fix offered was to chmod someone else's file).
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
from sparkcluster.redact import DEFAULT_ENV_FILE, set_fix

if TYPE_CHECKING:  # pragma: no cover
    from sparkcluster.config.profile import Profile

# The only secrets sparkcluster knows: from the environment or the 0600 .env (DEFAULT_ENV_FILE), to vLLM through the
# environment of the `docker exec`, never argv (docs/field-notes.md, "Secrets"). Here, not in the
# profile module, so a command that reads a secret need not import the profile's models.
SECRET_NAMES: tuple[str, ...] = ("HF_TOKEN", "VLLM_API_KEY")

# passed to every engine whatever a profile's `secrets` lists: an engine never serves without a key.
# When none is found, the command that starts an engine generates one (`generate_api_key`).
API_KEY = "VLLM_API_KEY"
GENERATED_PREFIX = "sk-"  # an OpenAI-style key (SECRET_VALUE masks it wherever it shows up)
GENERATED_BYTES = 32  # secrets.token_urlsafe's randomness: 256 bits

# the gateway's client keys (issue 36): one or more, comma-separated, read as the others are; they
# reach the gateway only in its 0600 config file inside its container, never argv or output
GATEWAY_KEYS = "GATEWAY_API_KEYS"

ENV_FILE_VAR = "SPARKCLUSTER_ENV_FILE"
ENV_FILE_HELP = "default: $SPARKCLUSTER_ENV_FILE, else ~/.config/sparkcluster/.env; ./.env is read only when named"

# names whose values are treated as secret wherever they show up
SECRETISH_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|PRIVATE_KEY|CREDENTIAL)", re.I)


# values that are secrets whatever their name: Hugging Face, OpenAI-style and NGC API keys
SECRET_VALUE = re.compile(r"(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|nvapi-[A-Za-z0-9_-]{16,})")


def register_written(profile: Profile) -> None:
    """Secrets written into the profile itself (lint refuses them, `up` with it): registered the
    moment the profile is read, so `profile show`, `--dry-run` and the logs mask them as they mask
    any other secret."""
    for name, value in profile.env.forward.items():
        secretish = bool(SECRETISH_NAME.search(name)) and len(value) >= 8 and not value.startswith("/")
        if name in SECRET_NAMES or secretish or SECRET_VALUE.search(value):
            redact.register(value)
    flags = profile.serve.extra_flags
    for i, token in enumerate(flags):
        if token.startswith("--api-key="):
            redact.register(token.partition("=")[2])
        elif token == "--api-key" and i + 1 < len(flags):
            redact.register(flags[i + 1])
        for found in SECRET_VALUE.findall(token):
            redact.register(found)
    for text in (profile.model, profile.served_name or ""):
        for found in SECRET_VALUE.findall(text):
            redact.register(found)


def passed_names(listed: Iterable[str]) -> list[str]:
    """The secrets passed to a profile's engine: those its `secrets` lists, and the API key always."""
    return list(dict.fromkeys([*listed, API_KEY]))


def default_env_file() -> Path | None:
    env = os.environ.get(ENV_FILE_VAR)
    if env:
        return Path(env).expanduser()
    p = DEFAULT_ENV_FILE.expanduser()
    return p if p.is_file() else None


def check_mode(path: Path) -> None:
    """Refuse a .env that group or others can access."""
    try:
        st = path.stat()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}", "check the path") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path} is not a regular file", "point --env-file at the .env file")
    if st.st_mode & 0o077:
        mode = f"mode {stat.S_IMODE(st.st_mode):04o}"
        if st.st_uid != os.getuid():  # not the owner's to chmod: never advise changing another's file
            raise InputError(
                f"{path} is readable by group or others ({mode}) and belongs to uid {st.st_uid}, not you",
                "put HF_TOKEN / VLLM_API_KEY in a file of your own with mode 0600 and pass --env-file",
            )
        raise InputError(f"{path} is readable by group or others ({mode})", f"chmod 600 {path}")


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
    profile: Profile | None = None,
    *,
    names: Iterable[str] | None = None,
    environ: Mapping[str, str] | None = None,
    required: bool = False,
) -> dict[str, str]:
    """The secrets the profile needs, by name: {name: value}; names not found are left out.

    The process environment wins over the .env (python-dotenv's own rule). env_file None means
    $SPARKCLUSTER_ENV_FILE, else ~/.config/sparkcluster/.env, else none (never ./.env unnamed). A given
    env_file that does not exist is an error. required=True raises InputError naming the missing.
    """
    wanted = list(names) if names is not None else (passed_names(profile.secrets) if profile else list(SECRET_NAMES))
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
            # with no .env yet, the fix names the one the tool reads by default (never ./.env)
            where = f"the environment or {path}" if path else f"the environment or {DEFAULT_ENV_FILE}"
            fix = (
                set_fix(missing[0], path=path)
                if len(missing) == 1
                else f"set them in {where} (a .env must have mode 0600)"
            )
            raise InputError(f"missing secret(s): {', '.join(missing)}", fix)
    return out


def key_file(env_file: Path | None) -> Path:
    """The .env a generated API key is written to: the one the command reads (`--env-file`, else
    $SPARKCLUSTER_ENV_FILE), else the default one (DEFAULT_ENV_FILE), created if need be."""
    if env_file is not None:
        return env_file.expanduser()
    return default_env_file() or DEFAULT_ENV_FILE.expanduser()


def generate_api_key(env_file: Path | None, secrets: dict[str, str]) -> Path | None:
    """When `secrets` has no VLLM_API_KEY: a new random one, registered for masking, put in `secrets`
    and appended to `key_file(env_file)` (created with mode 0600, its folder 0700), so that the next
    command finds it and the owner can hand it to clients. Returns the file written, None when a
    key was there. The value is never printed, logged or put on a command line."""
    if secrets.get(API_KEY):
        return None
    from secrets import token_urlsafe  # the standard library's (this module shares its name)

    path = key_file(env_file)
    key = GENERATED_PREFIX + token_urlsafe(GENERATED_BYTES)
    redact.register(key)
    try:
        if path.exists():
            check_mode(path)  # never write a key into a file others can read
            text = path.read_bytes()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            lead = b"\n" if text and not text.endswith(b"\n") else b""
        else:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            lead = b""
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, lead + f"{API_KEY}={key}\n".encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise InputError(
            f"cannot write the generated {API_KEY} to {path}: {e.strerror}",
            set_fix(API_KEY, "a-long-random-key", path=path),
        ) from None
    secrets[API_KEY] = key
    return path


def masked(secrets: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """name -> '******' when set, '(not set)' otherwise: what `profile show` prints."""
    return {n: (redact.MASK if secrets.get(n) else "(not set)") for n in names}


def split_keys(value: str | None) -> list[str]:
    """The gateway's client keys from GATEWAY_API_KEYS ("k1,k2"), each registered for masking."""
    keys = [k.strip() for k in (value or "").split(",") if k.strip()]
    for k in keys:
        redact.register(k)
    return keys
