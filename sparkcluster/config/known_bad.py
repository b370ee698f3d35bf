"""The known-bad list: the traps that break a Spark cluster which served yesterday,
as data an owner can extend without code.

Each entry names the check that reports it, what it matches (conditions on that check's named
signals: a node's kernel, an HCA's link width, a line NCCL printed), why it is bad, where that is
known from, and the fix. The list ships as `known_bad.toml` beside this module; a `known_bad.toml`
beside the inventory file extends it, and an entry there with a shipped entry's `id` replaces that
entry (so an owner may correct or silence one: `severity = "ok"`). Both are validated when loaded: an
unknown check, an unknown signal or a malformed condition is an error naming the entry, never a
silent no-match.

A condition is `signal = { op = value }` (several ops on one signal all hold; all signals of an
entry hold together): `eq`, `ne`, `lt`, `le`, `gt`, `ge` (numbers, or ISO dates as text), `regex`
(searched in the signal's text), `in` (a list), `version_lt`, `version_ge` (dotted versions compared
number by number). A signal the node did not report never matches: unknown is not bad.
"""

from __future__ import annotations

import functools
import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkcluster.errors import InputError

SHIPPED = Path(__file__).with_name("known_bad.toml")
USER_FILE = "known_bad.toml"  # beside the inventory

# the signals each reporting check offers its entries (checks/drift.py computes them per node or per HCA)
SIGNALS: dict[str, frozenset[str]] = {
    # cma_free_over_total_kb: CmaFree - CmaTotal, above 0 only where free CMA pages belong to no CMA area
    "host.kernel": frozenset({"kernel", "cma_total_kb", "cma_free_kb", "cma_free_over_total_kb"}),
    "host.bios": frozenset({"bios_vendor", "bios_version", "bios_date"}),
    "host.versions": frozenset({"dgx_os", "docker", "toolkit", "driver"}),
    "rdma.pcie": frozenset({"hca", "link_width", "link_speed_gts", "max_link_width", "max_link_speed_gts"}),
    "rdma.firmware": frozenset({"hca", "fw"}),
    "gpu.clocks": frozenset({"sm_mhz", "sm_max_mhz", "temperature_c", "pstate", "reasons"}),
    "mem.earlyoom_args": frozenset({"mem_pct", "swap_pct", "swap_total_kb", "args"}),
    # read from the image (its NCCL library): judged once the image probe lands
    "image.nccl": frozenset({"nccl_version", "nccl_build", "nodes"}),
    # a line NCCL printed (a rank's log, an error) and the cabling: the fabric test's causes
    "nccl.failure": frozenset({"log", "topology"}),
}
OPS = ("eq", "ne", "lt", "le", "gt", "ge", "regex", "in", "version_lt", "version_ge")

Scalar = int | float | str


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(v)))


class Condition(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    eq: Scalar | None = None
    ne: Scalar | None = None
    lt: Scalar | None = None
    le: Scalar | None = None
    gt: Scalar | None = None
    ge: Scalar | None = None
    regex: str | None = None
    in_: list[Scalar] | None = Field(default=None, alias="in")
    version_lt: str | None = None
    version_ge: str | None = None

    @field_validator("regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            re.compile(v)
        return v

    @model_validator(mode="after")
    def _one_at_least(self) -> Condition:
        if not self.model_dump(exclude_none=True):
            raise ValueError(f"a condition needs one of {', '.join(OPS)}")
        return self

    def holds(self, value) -> bool:
        if value is None or value == "":
            return False
        try:
            for op, want in self.model_dump(exclude_none=True, by_alias=True).items():
                if op == "eq" and not value == want:
                    return False
                if op == "ne" and not value != want:
                    return False
                if op == "lt" and not value < want:
                    return False
                if op == "le" and not value <= want:
                    return False
                if op == "gt" and not value > want:
                    return False
                if op == "ge" and not value >= want:
                    return False
                if op == "regex" and not re.search(want, str(value)):
                    return False
                if op == "in" and value not in want:
                    return False
                if op == "version_lt" and not _version(value) < _version(want):
                    return False
                if op == "version_ge" and not _version(value) >= _version(want):
                    return False
        except TypeError:  # a number compared with text: the entry does not apply to this value
            return False
        return True


class Entry(BaseModel):
    """One trap: what matches, why, the source, the fix."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    check: str
    severity: Literal["fail", "warn", "ok"] = "warn"  # "ok": listed but silenced (a user file's override)
    when: dict[str, Condition]
    why: str
    source: list[str] = Field(min_length=1)
    fix: str

    @model_validator(mode="after")
    def _known_signals(self) -> Entry:
        if self.check not in SIGNALS:
            raise ValueError(f"check {self.check!r} is not one the list feeds (one of {', '.join(SIGNALS)})")
        unknown = set(self.when) - SIGNALS[self.check]
        if unknown or not self.when:
            raise ValueError(
                f"{self.check} offers the signals {', '.join(sorted(SIGNALS[self.check]))}; "
                + (f"not {', '.join(sorted(unknown))}" if unknown else "the entry names none")
            )
        return self

    def matches(self, signals: dict) -> bool:
        return all(cond.holds(signals.get(name)) for name, cond in self.when.items())

    def sources(self) -> str:
        return "; ".join(self.source)


class KnownBad(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    entry: list[Entry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> KnownBad:
        ids = [e.id for e in self.entry]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"entry ids must be unique: {', '.join(dup)}")
        return self

    def for_check(self, check: str) -> list[Entry]:
        return [e for e in self.entry if e.check == check]

    def matching(self, check: str, signals: dict) -> list[Entry]:
        """Entries of `check` whose conditions all hold for these signals, in list order (silenced ones too)."""
        return [e for e in self.for_check(check) if e.matches(signals)]


def parse(text: str, source: str) -> KnownBad:
    try:
        return KnownBad.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{source}: not valid TOML ({e})", f"fix the syntax of {source}") from e
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise InputError(
            f"{source}: {where}: {first['msg']}",
            f"fix that entry of {source} (each [[entry]] has id, check, when, why, source, fix; "
            "see sparkcluster/config/known_bad.py)",
        ) from e


def merge(shipped: KnownBad, extra: KnownBad) -> KnownBad:
    """The shipped list with the user's entries: one with a shipped id replaces it in place, new ones follow."""
    theirs = {e.id: e for e in extra.entry}
    merged = [theirs.pop(e.id, e) for e in shipped.entry]
    return KnownBad(entry=merged + list(theirs.values()))


@functools.cache
def _load(user: Path | None) -> KnownBad:
    base = parse(SHIPPED.read_text(), str(SHIPPED))
    if user is None or not user.is_file():
        return base
    return merge(base, parse(user.read_text(), str(user)))


def load(inventory_path: Path | None = None) -> KnownBad:
    """The shipped list, extended by `known_bad.toml` beside the inventory when there is one."""
    return _load(inventory_path.parent / USER_FILE if inventory_path is not None else None)
