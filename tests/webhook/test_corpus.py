"""Property tests: every malformed config is denied (never a crash), every valid one admitted; examples."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webhook_helpers import RunningWebhook

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.config.names import ConfigError
from dra_gpu.config.quantity import MIB, QuantityError, parse_quantity
from dra_gpu.webhook.review import CONFIG_PATHS, review

REPO = Path(__file__).resolve().parents[2]
V1B1 = "resource.nvidia.com/v1beta1"
LEGACY = "gpu.nvidia.com/v1alpha1"
INTERVALS = ["Default", "Short", "Medium", "Long"]

# ---- valid configs -----------------------------------------------------------------------------------------

quantities = st.one_of(
    st.integers(1, 200).map(lambda n: f"{n}Gi"),
    st.integers(1, 4096).map(lambda n: f"{n}Mi"),
    st.integers(2, 100).map(lambda n: f"{n}G"),
    st.integers(MIB, 2**40),
)
device_keys = st.one_of(
    st.integers(0, 7).map(str),
    st.uuids().map(lambda u: f"GPU-{u}"),
    st.uuids().map(lambda u: f"MIG-{u}"),
)


@st.composite
def mps_configs(draw: st.DrawFn) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if draw(st.booleans()):
        config["defaultActiveThreadPercentage"] = draw(st.integers(0, 100))
    if draw(st.booleans()):
        config["defaultPinnedDeviceMemoryLimit"] = draw(quantities)
    if draw(st.booleans()):
        config["defaultPerDevicePinnedMemoryLimit"] = draw(
            st.dictionaries(device_keys, quantities, max_size=3)
        )
    return config


@st.composite
def valid_configs(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["GpuConfig", "MigDeviceConfig"]))
    body: dict[str, Any] = {"apiVersion": draw(st.sampled_from([V1B1, LEGACY])), "kind": kind}
    choice = draw(st.sampled_from(["none", "TimeSlicing", "MPS"]))
    if choice == "TimeSlicing":
        sharing: dict[str, Any] = {"strategy": "TimeSlicing"}
        if kind == "GpuConfig" and draw(st.booleans()):
            ts = {"interval": draw(st.sampled_from(INTERVALS))} if draw(st.booleans()) else {}
            sharing["timeSlicingConfig"] = ts
        body["sharing"] = sharing
    elif choice == "MPS":
        sharing = {"strategy": "MPS"}
        if draw(st.booleans()):
            sharing["mpsConfig"] = draw(mps_configs())
        body["sharing"] = sharing
    return body


# ---- malformed configs: a valid one with exactly one thing broken ------------------------------------------


def _bad_quantity(text: str) -> bool:
    try:
        return parse_quantity(text) < MIB
    except QuantityError:
        return True


bad_quantities = st.one_of(
    st.text(max_size=12).filter(_bad_quantity),
    st.integers(max_value=MIB - 1),
    st.floats(allow_nan=True),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.just(None).map(lambda _: {"value": "1Gi"}),
)
# values of the wrong JSON type, including unhashable ones
junk = st.one_of(
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)
not_an_int = st.one_of(st.text(max_size=5), st.floats(), st.booleans(), st.lists(st.integers(), max_size=2))
unknown_names = st.text(min_size=1, max_size=20).filter(
    lambda s: (
        s
        not in {
            "apiVersion",
            "kind",
            "sharing",
            "strategy",
            "timeSlicingConfig",
            "mpsConfig",
            "interval",
            "defaultActiveThreadPercentage",
            "defaultPinnedDeviceMemoryLimit",
            "defaultPerDevicePinnedMemoryLimit",
        }
    )
)


@st.composite
def malformed_configs(draw: st.DrawFn) -> Any:
    body = draw(valid_configs())
    mutation = draw(st.integers(0, 13))
    sharing = body.setdefault("sharing", {"strategy": "MPS"})
    if mutation == 0:
        body[draw(unknown_names)] = draw(st.integers())
    elif mutation == 1:
        sharing[draw(unknown_names)] = "x"
    elif mutation == 2:
        sharing["strategy"] = draw(
            st.one_of(st.text(max_size=15), st.integers(), st.none()).filter(
                lambda s: s not in ("TimeSlicing", "MPS")
            )
        )
    elif mutation == 3:
        body["kind"] = "GpuConfig"
        sharing.clear()
        sharing.update(
            {
                "strategy": "TimeSlicing",
                "timeSlicingConfig": {
                    "interval": draw(st.text(max_size=10).filter(lambda s: s not in INTERVALS))
                },
            }
        )
    elif mutation == 4:
        sharing.clear()
        sharing.update(
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": draw(
                        st.one_of(st.integers(max_value=-1), st.integers(min_value=101), not_an_int)
                    )
                },
            }
        )
    elif mutation == 5:
        sharing.clear()
        sharing.update(
            {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": draw(bad_quantities)}}
        )
    elif mutation == 6:
        sharing.clear()
        sharing.update(
            {
                "strategy": "MPS",
                "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {draw(device_keys): draw(bad_quantities)}},
            }
        )
    elif mutation == 7:
        bad_key = draw(
            st.text(max_size=12).filter(
                lambda k: (
                    not (k.isascii() and k.isdigit() and len(k) <= 4) and not k.startswith(("GPU-", "MIG-"))
                )
            )
        )
        sharing.clear()
        sharing.update(
            {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {bad_key: "1Gi"}}}
        )
    elif mutation == 8:
        body["apiVersion"] = draw(
            st.one_of(st.text(max_size=30), st.integers(), junk).filter(lambda v: v not in (V1B1, LEGACY))
        )
    elif mutation == 9:
        body["kind"] = draw(
            st.one_of(st.text(max_size=20), st.integers(), st.none(), junk).filter(
                lambda v: v not in ("GpuConfig", "MigDeviceConfig")
            )
        )
    elif mutation == 10:
        return draw(
            st.one_of(st.none(), st.integers(), st.text(max_size=10), st.lists(st.integers(), max_size=3))
        )
    elif mutation == 11:
        # a setting that belongs to the other strategy
        if sharing.get("strategy") == "TimeSlicing":
            sharing["mpsConfig"] = {}
        else:
            sharing["strategy"] = "MPS"
            sharing["timeSlicingConfig"] = {"interval": "Long"}
    elif mutation == 12:
        body["sharing"] = draw(
            st.one_of(st.text(max_size=5), st.integers(), st.lists(st.integers(), max_size=2))
        )
    else:
        body["kind"] = "MigDeviceConfig"
        sharing.clear()
        sharing.update({"strategy": "TimeSlicing", "timeSlicingConfig": {}})
    return body


def claim_with(parameters: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}],
            }
        },
    }


def admission(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "operation": "CREATE", "kind": {"kind": obj["kind"]}, "object": obj},
    }


@settings(max_examples=400, deadline=None)
@given(malformed_configs())
def test_malformed_configs_are_always_denied(parameters: Any) -> None:
    with pytest.raises(ConfigError):
        decode_opaque_config(parameters)
    response = review(admission(claim_with(parameters)))["response"]
    assert response["allowed"] is False
    assert response["status"]["message"].startswith("ResourceClaim ns/c: ")
    assert "spec.devices.config[0].opaque.parameters" in response["status"]["message"]


@settings(max_examples=300, deadline=None)
@given(valid_configs())
def test_valid_configs_are_always_allowed(parameters: dict[str, Any]) -> None:
    decode_opaque_config(parameters)
    assert review(admission(claim_with(parameters)))["response"]["allowed"] is True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(malformed_configs().map(lambda p: (p, False)), valid_configs().map(lambda p: (p, True))))
def test_corpus_over_https(webhook: RunningWebhook, case: tuple[Any, bool]) -> None:
    parameters, valid = case
    assert webhook.review(claim_with(parameters))["allowed"] is valid


# ---- examples written by the team ------------------------------------------------------------------------


def _expected_rejections(example_dir: Path) -> dict[tuple[str, str], str]:
    """(kind, name) -> messageRegex for the objects an example's expect.yaml says the webhook refuses."""
    expect = example_dir / "expect.yaml"
    if not expect.exists():
        return {}
    data = yaml.safe_load(expect.read_text()) or {}
    return {(r["kind"], r["name"]): r.get("messageRegex", "") for r in data.get("rejected") or []}


def example_objects() -> list[tuple[str, dict[str, Any], str | None]]:
    """(test id, object, None when it must be admitted / the regex its denial must match)."""
    found: list[tuple[str, dict[str, Any], str | None]] = []
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        if path.name == "expect.yaml":
            continue
        rejected = _expected_rejections(path.parent)
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in CONFIG_PATHS:
                name = doc["metadata"]["name"]
                test_id = f"{path.relative_to(REPO)}:{doc['kind']}/{name}"
                found.append((test_id, doc, rejected.get((doc["kind"], name))))
    return found


EXAMPLES = example_objects()


@pytest.mark.skipif(not EXAMPLES, reason="no examples/ with claims, templates or device classes yet")
@pytest.mark.parametrize(
    ("obj", "rejection"), [(o, r) for _, o, r in EXAMPLES], ids=[i for i, _, _ in EXAMPLES]
)
def test_every_example_gets_the_expected_answer(
    webhook: RunningWebhook, obj: dict[str, Any], rejection: str | None
) -> None:
    response = webhook.review(obj)
    if rejection is None:
        assert response["allowed"] is True, response.get("status")
    else:
        assert response["allowed"] is False
        assert re.search(rejection, response["status"]["message"]), response["status"]["message"]
