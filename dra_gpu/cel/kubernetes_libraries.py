"""Runtime implementations of the Kubernetes libraries `library.IP`, `library.CIDR`, `library.URLs` and
`library.Format` (the overload table that exposes them is in library.py).

Error behaviour follows Kubernetes exactly where it is observable: `ip()`/`cidr()`/`url()` fail with the
parse message, `isIP()`/`isCIDR()`/`isURL()` return false, `cidr.containsIP('bad')` is a "no such overload"
error while `cidr.containsCIDR('bad')` reports the parse error (Kubernetes checks the two differently).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dra_gpu.cel.errors import CelEvalError
from dra_gpu.cel.formats import FORMATS, NamedFormat
from dra_gpu.cel.network import CIDR, IPAddr, NetworkParseError, parse_cidr, parse_ip
from dra_gpu.cel.urls import URL, URLParseError, parse_request_uri, parse_url
from dra_gpu.cel.values import NONE, CelOptional, no_overload

# ----------------------------------------------------------------------------------------------------
# library.IP


def to_ip(value: Any) -> IPAddr:
    """`ip(string)` and `<CIDR>.ip()` share the name."""
    if isinstance(value, CIDR):
        return value.addr
    if not isinstance(value, str):
        raise no_overload("ip", value)
    try:
        return parse_ip(value)
    except NetworkParseError as error:
        raise CelEvalError(str(error)) from None


def is_ip(value: Any) -> bool:
    if not isinstance(value, str):
        raise no_overload("isIP", value)
    try:
        parse_ip(value)
    except NetworkParseError:
        return False
    return True


def ip_is_canonical(value: Any) -> bool:
    if not isinstance(value, str):
        raise no_overload("ip.isCanonical", value)
    return str(to_ip(value)) == value


def family(value: Any) -> int:
    if not isinstance(value, IPAddr):
        raise no_overload("family", value)
    return value.family


def ip_predicate(name: str, test: Callable[[IPAddr], bool]) -> Callable[[Any], bool]:
    def run(value: Any) -> bool:
        if not isinstance(value, IPAddr):
            raise no_overload(name, value)
        return test(value)

    return run


# ----------------------------------------------------------------------------------------------------
# library.CIDR


def to_cidr(value: Any) -> CIDR:
    if not isinstance(value, str):
        raise no_overload("cidr", value)
    try:
        return parse_cidr(value)
    except NetworkParseError as error:
        raise CelEvalError(f"network address parse error during conversion from string: {error}") from None


def is_cidr(value: Any) -> bool:
    if not isinstance(value, str):
        raise no_overload("isCIDR", value)
    try:
        parse_cidr(value)
    except NetworkParseError:
        return False
    return True


def contains_ip(cidr: Any, other: Any) -> bool:
    if not isinstance(cidr, CIDR):
        raise no_overload("containsIP", cidr, other)
    if isinstance(other, str):
        try:
            other = parse_ip(other)
        except NetworkParseError:
            # Kubernetes drops the parse error here and reports a missing overload.
            raise no_overload("containsIP", cidr, other) from None
    if not isinstance(other, IPAddr):
        raise no_overload("containsIP", cidr, other)
    return cidr.contains_ip(other)


def contains_cidr(cidr: Any, other: Any) -> bool:
    if not isinstance(cidr, CIDR):
        raise no_overload("containsCIDR", cidr, other)
    if isinstance(other, str):
        other = to_cidr(other)
    if not isinstance(other, CIDR):
        raise no_overload("containsCIDR", cidr, other)
    return cidr.contains_cidr(other)


def masked(cidr: Any) -> CIDR:
    if not isinstance(cidr, CIDR):
        raise no_overload("masked", cidr)
    return cidr.masked()


def prefix_length(cidr: Any) -> int:
    if not isinstance(cidr, CIDR):
        raise no_overload("prefixLength", cidr)
    return cidr.prefix


# ----------------------------------------------------------------------------------------------------
# library.URLs


def to_url(value: Any) -> URL:
    if not isinstance(value, str):
        raise no_overload("url", value)
    try:
        return parse_url(value)
    except URLParseError as error:
        raise CelEvalError(f"URL parse error during conversion from string: {error}") from None


def is_url(value: Any) -> bool:
    if not isinstance(value, str):
        raise no_overload("isURL", value)
    try:
        parse_request_uri(value)
    except URLParseError:
        return False
    return True


def url_part(name: str, part: Callable[[URL], Any]) -> Callable[[Any], Any]:
    def run(value: Any) -> Any:
        if not isinstance(value, URL):
            raise no_overload(name, value)
        return part(value)

    return run


URL_PARTS: dict[str, Callable[[Any], Any]] = {
    "getScheme": url_part("getScheme", lambda u: u.scheme),
    "getHost": url_part("getHost", lambda u: u.host),
    "getHostname": url_part("getHostname", URL.hostname),
    "getPort": url_part("getPort", URL.port),
    "getEscapedPath": url_part("getEscapedPath", URL.escaped_path),
    "getQuery": url_part("getQuery", URL.query),
}


# ----------------------------------------------------------------------------------------------------
# library.Format


def format_named(name: Any) -> CelOptional:
    if not isinstance(name, str):
        raise no_overload("format.named", name)
    found = FORMATS.get(name)
    return NONE if found is None else CelOptional(found, True)


def format_constant(name: str) -> Callable[[], NamedFormat]:
    found = FORMATS[name]
    return lambda: found


def format_validate(named: Any, value: Any) -> CelOptional:
    if not isinstance(named, NamedFormat) or not isinstance(value, str):
        raise no_overload("validate", named, value)
    errors = named.validate(value)
    return CelOptional(errors, True) if errors else NONE
