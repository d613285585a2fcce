"""The Kubernetes CEL `kubernetes.NamedFormat` type (`library.Format`, base environment since 1.31).

`format.dns1123Label().validate(s)` gives `optional.none()` for a valid string, else an optional list of the
messages Kubernetes' validators (`k8s.io/apimachinery/pkg/util/validation`, kube-openapi strfmt) return.
The message texts are Kubernetes', since expressions may show them (`.value().join(...)`).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import re
from collections.abc import Callable

from dra_gpu.cel.urls import URLParseError, parse_request_uri

_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = _DNS1123_LABEL + "(\\." + _DNS1123_LABEL + ")*"
_DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"
_LABEL_KEY = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = "(" + _LABEL_KEY + ")?"

_DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_DNS1035_LABEL_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character"
)
_LABEL_KEY_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\Z")
_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}\Z")
_TIME = re.compile(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))\Z")


def _full(pattern: str) -> re.Pattern[str]:
    return re.compile("^(?:" + pattern + r")\Z")


_DNS1123_LABEL_RE = _full(_DNS1123_LABEL)
_DNS1123_SUBDOMAIN_RE = _full(_DNS1123_SUBDOMAIN)
_DNS1035_LABEL_RE = _full(_DNS1035_LABEL)
_LABEL_KEY_RE = _full(_LABEL_KEY)
_LABEL_VALUE_RE = _full(_LABEL_VALUE)


def regex_error(message: str, pattern: str, *examples: str) -> str:
    """apimachinery's RegexError (including its double space before each 'or')."""
    if not examples:
        return f"{message} (regex used for validation is '{pattern}')"
    listed = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {listed}regex used for validation is '{pattern}')"


def _max_len(length: int) -> str:
    return f"must be no more than {length} characters"


def _too_long(value: str, limit: int) -> bool:
    return len(value.encode("utf-8")) > limit  # Go's len() counts bytes


def dns1123_label(value: str) -> list[str]:
    errors = [_max_len(63)] if _too_long(value, 63) else []
    if not _DNS1123_LABEL_RE.match(value):
        if _DNS1123_SUBDOMAIN_RE.match(value):
            errors.append("must not contain dots")
        else:
            errors.append(regex_error(_DNS1123_LABEL_MSG, _DNS1123_LABEL, "my-name", "123-abc"))
    return errors


def dns1123_subdomain(value: str) -> list[str]:
    errors = [_max_len(253)] if _too_long(value, 253) else []
    if not _DNS1123_SUBDOMAIN_RE.match(value):
        errors.append(regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN, "example.com"))
    return errors


def dns1035_label(value: str) -> list[str]:
    errors = [_max_len(63)] if _too_long(value, 63) else []
    if not _DNS1035_LABEL_RE.match(value):
        errors.append(regex_error(_DNS1035_LABEL_MSG, _DNS1035_LABEL, "my-name", "abc-123"))
    return errors


def qualified_name(value: str) -> list[str]:
    errors: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend("prefix part " + message for message in dns1123_subdomain(prefix))
    else:
        return [
            "a valid label key "
            + regex_error(_LABEL_KEY_MSG, _LABEL_KEY, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errors.append("name part must be non-empty")
    elif _too_long(name, 63):
        errors.append("name part " + _max_len(63))
    if not _LABEL_KEY_RE.match(name):
        errors.append("name part " + regex_error(_LABEL_KEY_MSG, _LABEL_KEY, "MyName", "my.name", "123-abc"))
    return errors


def label_value(value: str) -> list[str]:
    errors = [_max_len(63)] if _too_long(value, 63) else []
    if not _LABEL_VALUE_RE.match(value):
        errors.append(regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE, "MyValue", "my_value", "12345"))
    return errors


def _mask_trailing_dash(value: str) -> str:
    # apimachinery's maskTrailingDash: a generateName prefix may end in '-'; the last two characters are
    # replaced by 'a' (sic) before validating.
    if len(value) > 1 and value.endswith("-"):
        return value[:-2] + "a"
    return value


def _uri(value: str) -> list[str]:
    try:
        parse_request_uri(value)
    except URLParseError as error:
        return [str(error)]
    return []


def _uuid(value: str) -> list[str]:
    return [] if _UUID.match(value) else ["does not match the UUID format"]


def _byte(value: str) -> list[str]:
    try:
        base64.b64decode(value.replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        return ["invalid base64"]
    return []


def _is_date(value: str) -> bool:
    if not _DATE.match(value):
        return False
    try:
        datetime.date(int(value[0:4]), int(value[5:7]), int(value[8:10]))
    except ValueError:
        return False
    return True


def _date(value: str) -> list[str]:
    return [] if _is_date(value) else ["invalid date"]


def _datetime(value: str) -> list[str]:
    # kube-openapi strfmt IsDateTime: split at 't' (case-insensitive), a full date, then a time.
    parts = value.lower().split("t")
    if len(value) < 4 or len(parts) < 2 or not _is_date(parts[0]):
        return ["invalid datetime"]
    match = _TIME.match(parts[1])
    if match is None or not (match[1] <= "23" and match[2] <= "59" and match[3] <= "59"):
        return ["invalid datetime"]
    return []


class NamedFormat:
    """A named validator; two formats are equal when they have the same name."""

    __slots__ = ("name", "validator")

    def __init__(self, name: str, validator: Callable[[str], list[str]]):
        self.name = name
        self.validator = validator

    def validate(self, value: str) -> list[str]:
        return self.validator(value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NamedFormat) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("format", self.name))

    def __repr__(self) -> str:
        return f"format.{self.name}()"


FORMATS: dict[str, NamedFormat] = {
    name: NamedFormat(name, validator)
    for name, validator in {
        "dns1123Label": dns1123_label,
        "dns1123Subdomain": dns1123_subdomain,
        "dns1035Label": dns1035_label,
        "qualifiedName": qualified_name,
        "dns1123LabelPrefix": lambda s: dns1123_label(_mask_trailing_dash(s)),
        "dns1123SubdomainPrefix": lambda s: dns1123_subdomain(_mask_trailing_dash(s)),
        "dns1035LabelPrefix": lambda s: dns1035_label(_mask_trailing_dash(s)),
        "labelValue": label_value,
        "uri": _uri,
        "uuid": _uuid,
        "byte": _byte,
        "date": _date,
        "datetime": _datetime,
    }.items()
}
