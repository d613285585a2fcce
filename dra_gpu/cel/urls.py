"""The Kubernetes CEL `kubernetes.URL` type (`library.URLs`), parsed the way Go's `net/url` parses.

Kubernetes checks a string with `url.ParseRequestURI` (an absolute URI or an absolute path; no fragment
handling) and then keeps the result of `url.Parse` (which splits off `#fragment`). Python's `urllib.parse`
accepts almost anything, so the Go rules that decide validity are reproduced here: control characters, the
scheme syntax, `invalid URI for request`, host and port syntax, userinfo characters and `%` escapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

_HEX = "0123456789abcdefABCDEF"
_ALNUM = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_HOST_OK = _ALNUM | set("-_.~!$&'()*+,;=:[]<>\"")
_PATH_OK = _ALNUM | set("-_.~$&+,/:;=@")
_VALID_ENCODED_EXTRA = set("!$&'()*+,;=:@[]%")
_USERINFO_OK = _ALNUM | set("-._:~!$&'()*+,;=%@")


class URLParseError(ValueError):
    pass


@dataclass(frozen=True)
class URL:
    scheme: str = ""
    opaque: str = ""
    userinfo: str | None = None
    host: str = ""
    path: str = ""
    raw_path: str = ""
    raw_query: str = ""
    fragment: str = ""

    def hostname(self) -> str:
        return _split_host_port(self.host)[0]

    def port(self) -> str:
        return _split_host_port(self.host)[1]

    def escaped_path(self) -> str:
        if self.raw_path and _valid_encoded(self.raw_path):
            return self.raw_path
        if self.path == "*":
            return "*"
        return _escape_path(self.path)

    def query(self) -> dict[str, list[str]]:
        """Go's `url.ParseQuery`, ignoring malformed pairs as `URL.Query()` does."""
        values: dict[str, list[str]] = {}
        for pair in self.raw_query.split("&") if self.raw_query else []:
            if ";" in pair or pair == "":
                continue
            key, _, value = pair.partition("=")
            try:
                key = _unescape(key, query=True)
                value = _unescape(value, query=True)
            except URLParseError:
                continue
            values.setdefault(key, []).append(value)
        return values


def _split_host_port(host_port: str) -> tuple[str, str]:
    host, port = host_port, ""
    colon = host.rfind(":")
    if colon != -1 and _valid_optional_port(host[colon:]):
        host, port = host[:colon], host[colon + 1 :]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _valid_optional_port(port: str) -> bool:
    if port == "":
        return True
    return port[0] == ":" and all(c in "0123456789" for c in port[1:])


def _unescape(text: str, query: bool = False, host: bool = False) -> str:
    """Go's `unescape`: `%XX` must be two hex digits; `+` is a space in query components."""
    out = bytearray()
    i = 0
    data = text.encode("utf-8")
    while i < len(data):
        c = data[i]
        if c == ord("%"):
            escape = data[i : i + 3]
            if len(escape) < 3 or chr(escape[1]) not in _HEX or chr(escape[2]) not in _HEX:
                raise URLParseError(f'invalid URL escape "{escape.decode("utf-8", "replace")}"')
            if host and int(chr(escape[1]), 16) < 8 and escape != b"%25":
                raise URLParseError(f'invalid URL escape "{escape.decode()}"')
            out.append(int(escape[1:].decode(), 16))
            i += 3
            continue
        if query and c == ord("+"):
            out.append(ord(" "))
        elif host and c < 0x80 and chr(c) not in _HOST_OK:
            raise URLParseError(f'invalid character "{chr(c)}" in host name')
        else:
            out.append(c)
        i += 1
    return out.decode("utf-8", "surrogateescape")


def _escape_path(path: str) -> str:
    return "".join(
        chr(b) if chr(b) in _PATH_OK else f"%{b:02X}" for b in path.encode("utf-8", "surrogateescape")
    )


def _valid_encoded(text: str) -> bool:
    return all(c in _VALID_ENCODED_EXTRA or c in _PATH_OK for c in text)


def _get_scheme(raw: str) -> tuple[str, str]:
    for i, c in enumerate(raw):
        if c in _ALNUM and not c.isdigit():
            continue
        if c.isascii() and (c.isdigit() or c in "+-."):
            if i == 0:
                return "", raw
            continue
        if c == ":":
            if i == 0:
                raise URLParseError("missing protocol scheme")
            return raw[:i], raw[i + 1 :]
        return "", raw
    return "", raw


def _parse_host(host: str) -> str:
    if host.startswith("["):
        end = host.rfind("]")
        if end < 0:
            raise URLParseError("missing ']' in host")
        colon_port = host[end + 1 :]
        if not _valid_optional_port(colon_port):
            raise URLParseError(f'invalid port "{colon_port}" after host')
    else:
        colon = host.rfind(":")
        if colon != -1:
            colon_port = host[colon:]
            if not _valid_optional_port(colon_port):
                raise URLParseError(f'invalid port "{colon_port}" after host')
            if ":" in host[:colon]:
                # Go >= 1.25 rejects unbracketed hosts with more than one colon (http://::1/).
                raise URLParseError(f'invalid host "{host}"')
    return _unescape(host, host=True)


def _parse_authority(authority: str) -> tuple[str | None, str]:
    at = authority.rfind("@")
    host = _parse_host(authority[at + 1 :] if at >= 0 else authority)
    if at < 0:
        return None, host
    userinfo = authority[:at]
    if any(c.isascii() and c not in _USERINFO_OK for c in userinfo):
        raise URLParseError("net/url: invalid userinfo")
    _unescape(userinfo)
    return userinfo, host


def _parse(raw: str, via_request: bool) -> URL:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise URLParseError("net/url: invalid control character in URL")
    if raw == "" and via_request:
        raise URLParseError("empty url")
    if raw == "*":
        return URL(path="*")
    scheme, rest = _get_scheme(raw)
    scheme = scheme.lower()
    if rest.endswith("?") and rest.count("?") == 1:
        rest, raw_query = rest[:-1], ""
    else:
        rest, _, raw_query = rest.partition("?")
    if not rest.startswith("/"):
        if scheme:
            return URL(scheme=scheme, opaque=rest, raw_query=raw_query)
        if via_request:
            raise URLParseError("invalid URI for request")
        if ":" in rest.partition("/")[0]:
            raise URLParseError("first path segment in URL cannot contain colon")
    userinfo: str | None = None
    host = ""
    if (scheme or (not via_request and not rest.startswith("///"))) and rest.startswith("//"):
        authority, slash, tail = rest[2:].partition("/")
        rest = slash + tail
        userinfo, host = _parse_authority(authority)
    path = _unescape(rest)
    raw_path = "" if _escape_path(path) == rest else rest
    return URL(scheme, "", userinfo, host, path, raw_path, raw_query)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@lru_cache(maxsize=4096)
def parse_request_uri(raw: str) -> URL:
    """Go's `url.ParseRequestURI`; errors read `parse "<raw>": <reason>` like Go's *url.Error."""
    try:
        return _parse(raw, via_request=True)
    except URLParseError as error:
        raise URLParseError(f"parse {_quote(raw)}: {error}") from None


@lru_cache(maxsize=4096)
def parse_url(raw: str) -> URL:
    """`url(s)`: valid for ParseRequestURI, value from Parse (which handles `#fragment`)."""
    parse_request_uri(raw)
    before, _, fragment = raw.partition("#")
    try:
        parsed = _parse(before, via_request=False)
        fragment = _unescape(fragment)
    except URLParseError as error:
        raise URLParseError(f"parse {_quote(raw)}: {error}") from None
    return URL(
        parsed.scheme,
        parsed.opaque,
        parsed.userinfo,
        parsed.host,
        parsed.path,
        parsed.raw_path,
        parsed.raw_query,
        fragment,
    )
