"""The CEL `kubernetes.Semver` type: strict semantic versions as parsed by blang/semver v4 (`semver.Parse`).

Rules: `MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]`, no `v` prefix, no leading zeros in numbers or numeric
pre-release identifiers, identifiers `[0-9A-Za-z-]+`. Ordering per semver 2.0.0 §11; build metadata is
ignored.
"""

from __future__ import annotations

import re
from functools import lru_cache, total_ordering

_IDENT = re.compile(r"^[0-9A-Za-z-]+$")
_NUMBER = re.compile(r"^(0|[1-9][0-9]*)$")
UINT64_MAX = 2**64 - 1


class SemverError(ValueError):
    pass


@total_ordering
class Semver:
    __slots__ = ("build", "major", "minor", "patch", "pre", "text")

    def __init__(
        self, major: int, minor: int, patch: int, pre: tuple[str, ...], build: tuple[str, ...], text: str
    ):
        self.major = major
        self.minor = minor
        self.patch = patch
        self.pre = pre
        self.build = build
        self.text = text

    @classmethod
    def parse(cls, text: str, normalize: bool = False) -> Semver:
        return _parse(normalize_version(text) if normalize else text)

    def compare(self, other: Semver) -> int:
        mine = (self.major, self.minor, self.patch)
        theirs = (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        return _compare_pre(self.pre, other.pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __lt__(self, other: Semver) -> bool:
        return self.compare(other) < 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))

    def __repr__(self) -> str:
        return f"semver({self.text!r})"

    def __str__(self) -> str:
        return self.text


def _number(part: str, what: str, text: str) -> int:
    if not _NUMBER.match(part):
        if part.isdigit():
            raise SemverError(f"{what} number must not contain leading zeroes: {text!r}")
        raise SemverError(f"invalid character(s) found in {what} number {part!r}: {text!r}")
    value = int(part)
    if value > UINT64_MAX:
        raise SemverError(f"{what} number out of range: {text!r}")
    return value


@lru_cache(maxsize=16384)
def _parse(text: str) -> Semver:
    if not text:
        raise SemverError("version string empty")
    core, plus, build_text = text.partition("+")
    core, minus, pre_text = core.partition("-")
    parts = core.split(".")
    if len(parts) != 3:
        raise SemverError(f"no major, minor and patch version found in {text!r}")
    major = _number(parts[0], "major", text)
    minor = _number(parts[1], "minor", text)
    patch = _number(parts[2], "patch", text)
    pre: tuple[str, ...] = ()
    if minus:
        pre = tuple(pre_text.split("."))
        for ident in pre:
            if not ident or not _IDENT.match(ident):
                raise SemverError(f"invalid pre-release identifier {ident!r} in {text!r}")
            if ident.isdigit() and not _NUMBER.match(ident):
                raise SemverError(f"numeric pre-release identifier must not contain leading zeroes: {text!r}")
    build: tuple[str, ...] = ()
    if plus:
        build = tuple(build_text.split("."))
        for ident in build:
            if not ident or not _IDENT.match(ident):
                raise SemverError(f"invalid build metadata identifier {ident!r} in {text!r}")
    return Semver(major, minor, patch, pre, build, text)


def _compare_pre(mine: tuple[str, ...], theirs: tuple[str, ...]) -> int:
    # A version without pre-release has higher precedence than one with.
    if not mine or not theirs:
        return (not mine) - (not theirs)
    for a, b in zip(mine, theirs, strict=False):
        if a == b:
            continue
        a_num, b_num = a.isdigit(), b.isdigit()
        if a_num and b_num:
            return -1 if int(a) < int(b) else 1
        if a_num != b_num:
            return -1 if a_num else 1  # numeric identifiers sort before alphanumeric ones
        return -1 if a < b else 1
    return (len(mine) > len(theirs)) - (len(mine) < len(theirs))


def normalize_version(text: str) -> str:
    """`semver(s, true)`: drop a leading `v`, drop leading zeros, fill in a missing minor or patch with 0."""
    rest = text[1:] if text[:1] in ("v", "V") else text
    core_end = len(rest)
    for sep in ("-", "+"):
        index = rest.find(sep)
        if index != -1:
            core_end = min(core_end, index)
    core, tail = rest[:core_end], rest[core_end:]
    parts = core.split(".")
    if not 1 <= len(parts) <= 3:
        return text
    fixed = []
    for part in parts:
        if part.isdigit():
            part = str(int(part))
        fixed.append(part)
    while len(fixed) < 3:
        fixed.append("0")
    return ".".join(fixed) + tail
