"""Parsing rules of the Kubernetes IP / CIDR / URL / Format libraries, and the syntax added with them
(sortBy, optional literal entries), beyond what the conformance table covers."""

from __future__ import annotations

import pytest

from dra_gpu.cel.environment import compile_expression, compile_selector
from dra_gpu.cel.errors import CelCompileError, CelEvalError
from dra_gpu.cel.formats import FORMATS
from dra_gpu.cel.network import NetworkParseError, parse_cidr, parse_ip
from dra_gpu.cel.temporal import TemporalError, parse_duration, parse_timestamp
from dra_gpu.cel.urls import URLParseError, parse_request_uri, parse_url


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "1.2.3",
        "1.2.3.4.5",
        "1.2.3.04",
        "256.1.1.1",
        " 1.2.3.4",
        "1.2.3.4%eth0",
        ":::1",
        "1:2:3:4:5:6:7:8:9",
        "12345::1",
        "::ffff:10.0.0.1",
        "::ffff:a00:1",
        "fe80::1%eth0",
        "fe80::1%",
        "%eth0",
        "::01.2.3.4",
    ],
)
def test_ip_rejects_what_kubernetes_rejects(text: str) -> None:
    with pytest.raises(NetworkParseError):
        parse_ip(text)


@pytest.mark.parametrize(
    ("text", "canonical", "family"),
    [
        ("10.0.0.1", "10.0.0.1", 4),
        ("0.0.0.0", "0.0.0.0", 4),
        ("::", "::", 6),
        ("2001:DB8:0:0:1:0:0:1", "2001:db8::1:0:0:1", 6),
        ("1:2:3:4:5:6:7::", "1:2:3:4:5:6:7:0", 6),
        ("::1.2.3.4", "::102:304", 6),
        ("2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1", 6),
    ],
)
def test_ip_canonical_form_follows_go(text: str, canonical: str, family: int) -> None:
    parsed = parse_ip(text)
    assert (str(parsed), parsed.family) == (canonical, family)


@pytest.mark.parametrize(
    "text", ["10.0.0.0", "10.0.0.0/", "10.0.0.0/33", "::/129", "10.0.0.0/08", "10.0.0.0/-1", "fe80::/10%x"]
)
def test_cidr_rejects_bad_prefixes(text: str) -> None:
    with pytest.raises(NetworkParseError):
        parse_cidr(text)


def test_cidr_keeps_host_bits_until_masked() -> None:
    cidr = parse_cidr("10.1.2.3/8")
    assert str(cidr) == "10.1.2.3/8"
    assert str(cidr.masked()) == "10.0.0.0/8"
    assert cidr.contains_cidr(parse_cidr("10.200.0.0/16"))
    assert not cidr.contains_cidr(parse_cidr("0.0.0.0/0"))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty url"),
        ("relative/path", "invalid URI for request"),
        (":foo", "missing protocol scheme"),
        ("http://host:port/", 'invalid port ":port" after host'),
        ("http://[::1/", "missing ']' in host"),
        ("http://a b/", "invalid character"),
        ("http://x/%zz", 'invalid URL escape "%zz"'),
        ("http://x/\x7f", "invalid control character"),
        ("http://us er@x/", "invalid userinfo"),
    ],
)
def test_url_errors_follow_go(text: str, reason: str) -> None:
    with pytest.raises(URLParseError) as error:
        parse_request_uri(text)
    assert reason in str(error.value)


def test_url_components() -> None:
    parsed = parse_url("HTTPS://u:p@Example.com:8443/a%2Fb c?x=1&y=%41+B&bad=%zz&x=2#frag")
    assert parsed.scheme == "https"
    assert (parsed.host, parsed.hostname(), parsed.port()) == ("Example.com:8443", "Example.com", "8443")
    # Go keeps the raw path only when it is validly encoded; with the space it re-escapes the decoded path.
    assert parsed.escaped_path() == "/a/b%20c"
    assert parse_url("http://x/a%2Fb").escaped_path() == "/a%2Fb"
    assert parsed.query() == {"x": ["1", "2"], "y": ["A B"]}
    assert parsed.fragment == "frag"
    opaque = parse_url("mailto:someone@example.com")
    assert (opaque.scheme, opaque.host, opaque.escaped_path()) == ("mailto", "", "")


def test_format_length_limits_and_prefix_masking() -> None:
    assert FORMATS["dns1123Label"].validate("a" * 63) == []
    assert FORMATS["dns1123Label"].validate("a" * 64)[0].startswith("must be no more than 63")
    assert FORMATS["dns1123LabelPrefix"].validate("abc-") == []
    assert FORMATS["qualifiedName"].validate("a/b/c")[0].startswith("a valid label key")
    assert FORMATS["qualifiedName"].validate("-x.com/y")[0].startswith("prefix part a lowercase RFC 1123")
    assert FORMATS["uuid"].validate("123e4567e89b12d3a456426614174000") == []
    assert FORMATS["datetime"].validate("2020-01-01T24:00:00Z") == ["invalid datetime"]


def test_stray_optional_marker_is_a_syntax_error_at_its_line() -> None:
    with pytest.raises(CelCompileError) as error:
        compile_selector("device.driver == 'x' ||\n  size(1, ?2) == 1")
    assert error.value.line == 2
    assert "Syntax error" in error.value.message


def test_question_marks_in_strings_and_conditionals_are_untouched() -> None:
    assert compile_expression("['?', '[?', true ? 'a' : 'b']").evaluate({}) == ["?", "[?", "a"]
    assert compile_expression("{'a': true ? 1 : 2}").evaluate({}) == {"a": 1}


def test_sort_by_reads_the_same_device_paths_as_its_list() -> None:
    selector = compile_selector("device.attributes['gpu.nvidia.com'].interconnects.sortBy(i, i).size() > 0")
    assert selector.paths == {("attributes", "gpu.nvidia.com", "interconnects")}


def test_sort_by_hidden_variable_cannot_be_named() -> None:
    with pytest.raises(CelCompileError):
        compile_expression("@__sortBy_input__.size() == 0")


def test_sort_by_errors_on_mixed_key_types() -> None:
    with pytest.raises(CelEvalError, match="same type"):
        compile_expression("[1, 2].sortBy(x, x == 1 ? 'a' : 2)").evaluate({})


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("0", 0),
        ("1h30m", 5400 * 10**9),
        ("-1.5s", -1_500_000_000),
        ("+.5ms", 500_000),
        ("1us", 1_000),
        ("1µs", 1_000),
        ("2h45m30.5s", (2 * 3600 + 45 * 60 + 30) * 10**9 + 500_000_000),
        ("2562047h", 2562047 * 3600 * 10**9),
    ],
)
def test_durations_parse_like_go(text: str, nanos: int) -> None:
    assert parse_duration(text).nanos == nanos


@pytest.mark.parametrize("text", ["", "1", "s", ".s", "1d", "1h-1m", "2562048h", "- 1s"])
def test_durations_go_rejects(text: str) -> None:
    with pytest.raises(TemporalError):
        parse_duration(text)


@pytest.mark.parametrize(
    "text",
    [
        "2024-01-01",
        "2024-01-01 00:00:00Z",
        "2024-01-01T00:00:00",
        "2024-02-30T00:00:00Z",
        "2024-01-01T24:00:00Z",
        "2024-01-01t00:00:00z",
        "0000-12-31T23:59:59Z",
    ],
)
def test_timestamps_must_be_rfc3339_in_range(text: str) -> None:
    with pytest.raises(TemporalError):
        parse_timestamp(text)


def test_timestamp_keeps_its_offset_for_printing_only() -> None:
    east = parse_timestamp("2024-01-01T01:00:00.000000001+01:00")
    utc = parse_timestamp("2024-01-01T00:00:00.000000001Z")
    assert east == utc
    assert (str(east), str(utc)) == ("2024-01-01T01:00:00.000000001+01:00", "2024-01-01T00:00:00.000000001Z")
