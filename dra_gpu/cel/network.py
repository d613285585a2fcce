"""The Kubernetes CEL `net.IP` and `net.CIDR` types (`library.IP`, `library.CIDR`, in the base environment
since 1.30).

Kubernetes parses with Go's `netip.ParseAddr` / `netip.ParsePrefix` and then rejects zones and IPv4-mapped
IPv6 addresses (`::ffff:1.2.3.4`). Python's `ipaddress` is stricter or looser than Go in a few places (it
accepts `%zone` and decides the family differently), so the family decision and those rejections are made
here, the way Go makes them, and `ipaddress` only decodes the address once its shape is known. Error texts
follow Kubernetes' wording, so that messages match what the API server / scheduler reports.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

IPv4_BITS = 32
IPv6_BITS = 128


class NetworkParseError(ValueError):
    pass


class IPAddr:
    """An IPv4 or IPv6 address without zone (`net.IP`). Equality is by family and value."""

    __slots__ = ("bits", "value")

    def __init__(self, value: int, bits: int):
        self.value = value
        self.bits = bits  # 32 or 128

    @property
    def family(self) -> int:
        return 4 if self.bits == IPv4_BITS else 6

    def _byte(self, index: int) -> int:
        return (self.value >> (self.bits - 8 * (index + 1))) & 0xFF

    def _word(self) -> int:
        return self.value >> 112  # first 16 bits of an IPv6 address

    def is_unspecified(self) -> bool:
        return self.value == 0

    def is_loopback(self) -> bool:
        if self.bits == IPv4_BITS:
            return self._byte(0) == 127
        return self.value == 1

    def is_multicast(self) -> bool:
        if self.bits == IPv4_BITS:
            return self._byte(0) & 0xF0 == 0xE0
        return self._byte(0) == 0xFF

    def is_link_local_multicast(self) -> bool:
        # Go: 224.0.0.0/24, and ff02::/16 with any flags nibble (ffX2::).
        if self.bits == IPv4_BITS:
            return self._byte(0) == 224 and self._byte(1) == 0 and self._byte(2) == 0
        return self._word() & 0xFF0F == 0xFF02

    def is_link_local_unicast(self) -> bool:
        if self.bits == IPv4_BITS:
            return self._byte(0) == 169 and self._byte(1) == 254
        return self._word() & 0xFFC0 == 0xFE80

    def is_global_unicast(self) -> bool:
        # Go's rule: private IPv4 and ULA IPv6 addresses still count as global unicast.
        if self.bits == IPv4_BITS and self.value in (0, 0xFFFFFFFF):
            return False
        return (
            not self.is_unspecified()
            and not self.is_loopback()
            and not self.is_multicast()
            and not self.is_link_local_unicast()
        )

    def __str__(self) -> str:
        if self.bits == IPv4_BITS:
            return str(ipaddress.IPv4Address(self.value))
        return ipaddress.IPv6Address(self.value).compressed  # RFC 5952, like Go's Addr.String

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IPAddr) and (self.value, self.bits) == (other.value, other.bits)

    def __hash__(self) -> int:
        return hash((self.value, self.bits))

    def __repr__(self) -> str:
        return f"ip({str(self)!r})"


class CIDR:
    """An address with a prefix length (`net.CIDR`); host bits are kept (`cidr('10.0.0.1/8').ip()` is
    10.0.0.1), `masked()` clears them. Equality compares address and length, as Go's Prefix does."""

    __slots__ = ("addr", "prefix")

    def __init__(self, addr: IPAddr, prefix: int):
        self.addr = addr
        self.prefix = prefix

    def masked(self) -> CIDR:
        host_bits = self.addr.bits - self.prefix
        value = (self.addr.value >> host_bits) << host_bits
        return CIDR(IPAddr(value, self.addr.bits), self.prefix)

    def contains_ip(self, ip: IPAddr) -> bool:
        if ip.bits != self.addr.bits:
            return False
        host_bits = self.addr.bits - self.prefix
        return ip.value >> host_bits == self.addr.value >> host_bits

    def contains_cidr(self, other: CIDR) -> bool:
        # Kubernetes >= 1.33 (PR 130450): the other address masked to this length, and a longer prefix.
        if other.addr.bits != self.addr.bits:
            return False
        return self.contains_ip(other.addr) and self.prefix <= other.prefix

    def __str__(self) -> str:
        return f"{self.addr}/{self.prefix}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CIDR) and self.addr == other.addr and self.prefix == other.prefix

    def __hash__(self) -> int:
        return hash((self.addr, self.prefix))

    def __repr__(self) -> str:
        return f"cidr({str(self)!r})"


def _go_parse_addr(text: str) -> tuple[IPAddr, str]:
    """Go's netip.ParseAddr: the address and its zone; raises with Go's message."""
    for char in text:
        if char == ".":
            return _parse_v4(text), ""
        if char == ":":
            return _parse_v6(text)
        if char == "%":
            raise NetworkParseError(f"ParseAddr({text!r}): missing IPv6 address")
    raise NetworkParseError(f'ParseAddr("{text}"): unable to parse IP')


def _parse_v4(text: str) -> IPAddr:
    fields = text.split(".")
    if len(fields) != 4:
        raise NetworkParseError(f'ParseAddr("{text}"): IPv4 address too short or too long')
    value = 0
    for field in fields:
        if not field:
            raise NetworkParseError(f'ParseAddr("{text}"): IPv4 field must have at least one digit')
        if not (field.isascii() and field.isdigit()):
            raise NetworkParseError(f'ParseAddr("{text}"): unexpected character')
        if len(field) > 1 and field[0] == "0":
            raise NetworkParseError(f'ParseAddr("{text}"): IPv4 field has octet with leading zero')
        octet = int(field)
        if octet > 255:
            raise NetworkParseError(f'ParseAddr("{text}"): IPv4 field has value >255')
        value = value << 8 | octet
    return IPAddr(value, IPv4_BITS)


def _parse_v6(text: str) -> tuple[IPAddr, str]:
    address, percent, zone = text.partition("%")
    if percent and not zone:
        raise NetworkParseError(f'ParseAddr("{text}"): zone must be a non-empty string')
    if not address or any(c not in "0123456789abcdefABCDEF:." for c in address):
        raise NetworkParseError(f'ParseAddr("{text}"): unexpected character')
    try:
        parsed = ipaddress.IPv6Address(address)
    except ValueError as error:
        raise NetworkParseError(f'ParseAddr("{text}"): {error}') from None
    return IPAddr(int(parsed), IPv6_BITS), zone


def _is_4in6(ip: IPAddr) -> bool:
    return ip.bits == IPv6_BITS and ip.value >> 32 == 0xFFFF


@lru_cache(maxsize=4096)
def parse_ip(text: str) -> IPAddr:
    """`ip(s)`: Go's ParseAddr, then Kubernetes' rejections of zones and IPv4-mapped IPv6 addresses."""
    try:
        ip, zone = _go_parse_addr(text)
    except NetworkParseError as error:
        raise NetworkParseError(
            f'IP Address "{text}" parse error during conversion from string: {error}'
        ) from None
    if zone:
        raise NetworkParseError(f'IP address "{text}" with zone value is not allowed')
    if _is_4in6(ip):
        raise NetworkParseError(f'IPv4-mapped IPv6 address "{text}" is not allowed')
    return ip


def _go_parse_prefix(text: str) -> CIDR:
    slash = text.rfind("/")
    if slash < 0:
        raise NetworkParseError(f"netip.ParsePrefix(\"{text}\"): no '/'")
    try:
        ip, zone = _go_parse_addr(text[:slash])
    except NetworkParseError as error:
        raise NetworkParseError(f'netip.ParsePrefix("{text}"): {error}') from None
    if zone:
        raise NetworkParseError(f'netip.ParsePrefix("{text}"): IPv6 zones cannot be present in a prefix')
    bits_text = text[slash + 1 :]
    # Go rejects signs and leading zeros here, which strconv.Atoi alone would accept.
    if (
        not bits_text
        or not (bits_text.isascii() and bits_text.isdigit())
        or (len(bits_text) > 1 and bits_text[0] == "0")
    ):
        raise NetworkParseError(f'netip.ParsePrefix("{text}"): bad bits after slash: "{bits_text}"')
    bits = int(bits_text)
    if bits > ip.bits:
        raise NetworkParseError(f'netip.ParsePrefix("{text}"): prefix length out of range')
    return CIDR(ip, bits)


@lru_cache(maxsize=4096)
def parse_cidr(text: str) -> CIDR:
    """Kubernetes' parseCIDR: Go's ParsePrefix, then a rejection of IPv4-mapped IPv6 addresses. (`cidr(s)`
    prefixes one more "network address parse error during conversion from string: ", as Kubernetes does.)"""
    try:
        cidr = _go_parse_prefix(text)
    except NetworkParseError as error:
        raise NetworkParseError(
            f"network address parse error during conversion from string: {error}"
        ) from None
    if _is_4in6(cidr.addr):
        raise NetworkParseError(f'IPv4-mapped IPv6 address "{text}" is not allowed')
    return cidr
