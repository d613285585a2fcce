"""CEL `google.protobuf.Timestamp` and `google.protobuf.Duration` values, as cel-go implements them.

A timestamp is an instant with nanosecond precision between year 1 and 9999, plus the UTC offset it was
written with (cel-go keeps Go's time.Time, so `string(timestamp('2024-01-01T00:00:00+01:00'))` keeps
`+01:00`; equality and ordering look at the instant only). A duration is a signed int64 count of
nanoseconds, parsed with Go's `time.ParseDuration` rules and printed as seconds (`string(duration('1m'))` is
`60s`). Kubernetes sets `DefaultUTCTimeZone(true)`, so the getters use UTC unless given a time zone.
"""

from __future__ import annotations

import datetime
import re
from decimal import Decimal
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
NANOS = 1_000_000_000
MIN_SECONDS = -62135596800  # 0001-01-01T00:00:00Z
MAX_SECONDS = 253402300799  # 9999-12-31T23:59:59Z
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_RFC3339 = re.compile(
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?(Z|[+-][0-9]{2}:[0-9]{2})\Z"
)
_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": NANOS, "m": 60 * NANOS}
_UNITS["h"] = 3600 * NANOS


class TemporalError(ValueError):
    pass


class Duration:
    __slots__ = ("nanos",)

    def __init__(self, nanos: int):
        if not INT64_MIN <= nanos <= INT64_MAX:
            raise TemporalError("integer overflow")
        self.nanos = nanos

    def __str__(self) -> str:
        # Go: strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
        seconds = self.nanos // NANOS + (self.nanos % NANOS) / 1e9
        return format(Decimal(repr(seconds)), "f").rstrip("0").rstrip(".") + "s" if seconds else "0s"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and other.nanos == self.nanos

    def __hash__(self) -> int:
        return hash(("duration", self.nanos))

    def __repr__(self) -> str:
        return f"duration({str(self)!r})"


class Timestamp:
    __slots__ = ("nanos", "offset")

    def __init__(self, nanos: int, offset: int = 0):
        """`nanos` since the Unix epoch; `offset` in seconds east of UTC (only for printing)."""
        if not MIN_SECONDS * NANOS <= nanos <= MAX_SECONDS * NANOS + NANOS - 1:
            raise TemporalError("timestamp out of range")
        self.nanos = nanos
        self.offset = offset

    def local(self, zone: str | None = None) -> tuple[datetime.datetime, int]:
        """The wall-clock time (to the second) in UTC or `zone`, and the nanoseconds within the second."""
        seconds, fraction = divmod(self.nanos, NANOS)
        moment = _EPOCH + datetime.timedelta(seconds=seconds)
        return moment.astimezone(_zone(zone)) if zone is not None else moment, fraction

    def __str__(self) -> str:
        # Go's RFC3339Nano: trailing zeros of the fraction dropped, "Z" for a zero offset.
        seconds, fraction = divmod(self.nanos + self.offset * NANOS, NANOS)
        wall = _EPOCH + datetime.timedelta(seconds=seconds)
        text = wall.strftime("%Y-%m-%dT%H:%M:%S")
        if fraction:
            text += "." + f"{fraction:09d}".rstrip("0")
        if self.offset == 0:
            return text + "Z"
        sign = "+" if self.offset > 0 else "-"
        hours, minutes = divmod(abs(self.offset) // 60, 60)
        return f"{text}{sign}{hours:02d}:{minutes:02d}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timestamp) and other.nanos == self.nanos

    def __hash__(self) -> int:
        return hash(("timestamp", self.nanos))

    def __repr__(self) -> str:
        return f"timestamp({str(self)!r})"


@lru_cache(maxsize=256)
def _zone(name: str) -> datetime.tzinfo:
    """cel-go's time zone argument: `[+-]HH:MM`, or an IANA name."""
    if ":" in name:
        match = re.fullmatch(r"([+-]?)([0-9]{1,2}):([0-9]{2})", name)
        if match is None:
            raise TemporalError(f"invalid time zone offset {name!r}")
        delta = datetime.timedelta(hours=int(match[2]), minutes=int(match[3]))
        return datetime.timezone(-delta if match[1] == "-" else delta)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise TemporalError(f"unknown time zone {name!r}") from None


def parse_timestamp(text: str) -> Timestamp:
    """Go's time.Parse(time.RFC3339, s) (fractional seconds allowed), then cel-go's range check."""
    match = _RFC3339.match(text)
    if match is None:
        raise TemporalError("type conversion error from 'string' to 'google.protobuf.Timestamp'")
    year, month, day, hour, minute, second = (int(match[i]) for i in range(1, 7))
    try:
        if hour > 23 or minute > 59 or second > 59:
            raise ValueError("time out of range")
        wall = datetime.datetime(year, month, day, hour, minute, second, tzinfo=datetime.UTC)
    except ValueError:
        raise TemporalError("type conversion error from 'string' to 'google.protobuf.Timestamp'") from None
    zone = match[8]
    offset = 0
    if zone != "Z":
        offset = (int(zone[1:3]) * 60 + int(zone[4:6])) * 60 * (1 if zone[0] == "+" else -1)
    fraction = int(((match[7] or "") + "000000000")[:9])
    seconds = int((wall - _EPOCH).total_seconds()) - offset
    return Timestamp(seconds * NANOS + fraction, offset)


def parse_duration(text: str) -> Duration:
    """Go's time.ParseDuration: `[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+`, or a bare `0`."""
    original = text
    negative = text[:1] == "-"
    if text[:1] in "+-" and text:
        text = text[1:]
    if text == "0":
        return Duration(0)
    if not text:
        raise TemporalError(f'time: invalid duration "{original}"')
    total = 0
    while text:
        match = re.match(r"([0-9]*)(?:\.([0-9]*))?", text)
        assert match is not None
        whole, fraction = match[1], match[2]
        if not whole and not fraction:
            raise TemporalError(f'time: invalid duration "{original}"')
        text = text[match.end() :]
        unit_match = re.match(r"[^0-9.]+", text)
        if unit_match is None:
            raise TemporalError(f'time: missing unit in duration "{original}"')
        unit = unit_match[0]
        if unit not in _UNITS:
            raise TemporalError(f'time: unknown unit "{unit}" in duration "{original}"')
        text = text[unit_match.end() :]
        scale = _UNITS[unit]
        amount = int(whole or "0") * scale
        if fraction:
            amount += int(Decimal(int(fraction)) * scale / (Decimal(10) ** len(fraction)))
        total += amount
        if total > INT64_MAX + (1 if negative else 0):
            raise TemporalError(f'time: invalid duration "{original}"')
    return Duration(-total if negative else total)
