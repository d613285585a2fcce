"""List-typed attributes (KEP-5491, DRAListTypeAttributes) in ResourceSlices: per release and gate,
client-side validation, and the real kube-apiserver of the selected release."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.cli.feature_gates import parse_feature_gates
from dra_gpu.inventory.model import Attribute, Device, DeviceKind, DeviceModel
from dra_gpu.slices.slice_builder import build_slices
from dra_gpu.slices.slice_validation import validate_slices

NUMA = "resource.kubernetes.io/numaNode"


def _model(numa: Attribute, count: int = 1, **extra: Attribute) -> DeviceModel:
    devices = [
        Device(
            name=f"gpu-{i}",
            kind=DeviceKind.GPU,
            parent_uuid=f"GPU-{i}",
            parent_minor=i,
            attributes={"type": Attribute("string", "gpu"), NUMA: numa, **extra},
            capacity={},
        )
        for i in range(count)
    ]
    return DeviceModel(devices=tuple(devices))


def _attributes(slices: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(slices[-1]["spec"]["devices"][0]["attributes"])


@pytest.mark.parametrize(
    ("version", "gate", "expected"),
    [
        ((1, 37), True, {"ints": [1]}),
        ((1, 36), True, {"ints": [1]}),
        ((1, 37), False, {"int": 1}),
        ((1, 35), True, {"int": 1}),
    ],
)
def test_one_element_list_is_a_list_only_with_the_gate_on_1_36_and_later(
    version: tuple[int, int], gate: bool, expected: dict[str, Any]
) -> None:
    slices = build_slices(_model(Attribute("ints", (1,))), "node-a", version, list_type_attributes=gate)
    assert _attributes(slices)[NUMA] == expected
    assert validate_slices(slices, version) == []


def test_longer_lists_are_left_out_without_the_gate() -> None:
    model = _model(Attribute("ints", (0,)), links=Attribute("strings", ("nvlink-0", "nvlink-1")))
    without = _attributes(build_slices(model, "node-a", (1, 37)))
    assert "gpu.nvidia.com/links" not in without and "links" not in without
    with_gate = _attributes(build_slices(model, "node-a", (1, 37), list_type_attributes=True))
    assert with_gate["links"] == {"strings": ["nvlink-0", "nvlink-1"]}


def test_devices_with_list_attributes_count_as_advanced_64_per_slice() -> None:
    model = _model(Attribute("ints", (0,)), count=1)
    many = replace(model, devices=tuple(replace(model.devices[0], name=f"d-{i}") for i in range(100)))
    lists = build_slices(many, "node-a", (1, 37), list_type_attributes=True)
    assert [len(s["spec"]["devices"]) for s in lists] == [64, 36]
    scalars = build_slices(many, "node-a", (1, 37))
    assert [len(s["spec"]["devices"]) for s in scalars] == [100]
    too_many = [{**lists[0], "spec": {**lists[0]["spec"], "devices": lists[0]["spec"]["devices"] * 2}}]
    assert any("128 devices, at most 64" in p for p in validate_slices(too_many, (1, 37)))


def test_validation_knows_the_list_rules_per_release() -> None:
    slices = build_slices(_model(Attribute("ints", (1,))), "node-a", (1, 37), list_type_attributes=True)
    assert any("need Kubernetes >= 1.36" in p for p in validate_slices(slices, (1, 35)))
    device = slices[-1]["spec"]["devices"][0]
    device["attributes"]["empty"] = {"strings": []}
    device["attributes"]["bad"] = {"versions": ["1.0"]}
    device["attributes"]["many"] = {"ints": list(range(47))}
    problems = validate_slices(slices, (1, 37))
    assert any("empty'].strings: must be a non-empty list" in p for p in problems)
    assert any("bad'].versions.versions[0]" in p or "versions[0].version" in p for p in problems), problems
    assert any("attribute values, at most 48" in p for p in problems)


def _published_numa(*args: str) -> dict[str, Any]:
    """`dra-gpu slices` on a simulated DGX H100 (GPU 4 sits on NUMA node 1): the NUMA attributes of gpu-4
    and of one of its MIG devices, as the kubelet plugin would publish them with the same flags."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_gpu.cli.slices",
            "--hardware",
            "dgx-h100",
            "--node",
            "n1",
            "-o",
            "json",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    devices = {d["name"]: d for s in json.loads(done.stdout)["items"] for d in s["spec"].get("devices", [])}
    gpu, mig = devices["gpu-4"]["attributes"], devices["gpu-4-mig-1g10gb-me-20-6"]["attributes"]
    assert "numaNode" not in gpu  # NVIDIA publishes no driver-domain NUMA attribute, nor do we
    assert gpu[NUMA] == mig[NUMA]
    return dict(gpu[NUMA])


def test_numa_node_end_to_end_per_release_and_gate() -> None:
    """Discovery -> device model -> slices: `int` by default and on 1.35, `ints: [n]` with
    --feature-gates DRAListTypeAttributes=true on 1.36+ (NVIDIA's addNumaNodeAttribute does the same)."""
    assert _published_numa() == {"int": 1}
    assert _published_numa("--feature-gates", "DRAListTypeAttributes=true") == {"ints": [1]}
    assert _published_numa(
        "--kubernetes-version", "1.36", "--feature-gates", "DRAListTypeAttributes=true"
    ) == {"ints": [1]}
    assert _published_numa(
        "--kubernetes-version", "1.35", "--feature-gates", "DRAListTypeAttributes=true"
    ) == {"int": 1}


def test_feature_gates_flag() -> None:
    assert parse_feature_gates("")["DRAListTypeAttributes"] is False
    assert parse_feature_gates("DRAListTypeAttributes=true")["DRAListTypeAttributes"] is True
    # NVIDIA's chart renders a trailing comma
    assert parse_feature_gates("DRAListTypeAttributes=true,")["DRAListTypeAttributes"] is True
    with pytest.raises(ValueError, match=r"unknown gate; known: .*DRAListTypeAttributes"):
        parse_feature_gates("ConsumableCapacity=true")
    with pytest.raises(ValueError, match="expected NAME=true or NAME=false"):
        parse_feature_gates("DRAListTypeAttributes")


@pytest.mark.apiserver
def test_the_selected_release_accepts_what_the_builder_publishes(kube_apiserver: Any) -> None:
    """The real kube-apiserver (1.37 by default, 1.34 with KUBERNETES_VERSION=1.34) takes the builder's slices
    for its own release: lists where it has DRAListTypeAttributes (on in the test control plane), scalars
    elsewhere."""
    from kubernetes import client

    version = kube_apiserver.version()
    release = (int(version["major"]), int(version["minor"].rstrip("+")))
    node = f"lists-{uuid.uuid4().hex[:6]}"
    model = _model(Attribute("ints", (1,)), links=Attribute("strings", ("a", "b")))
    slices = build_slices(model, node, release, list_type_attributes=True)
    assert validate_slices(slices, release) == []
    api = client.CustomObjectsApi(kube_apiserver.api_client())
    try:
        for item in slices:
            api.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", item)
        stored: Any = api.get_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices", slices[-1]["metadata"]["name"]
        )
        attributes = stored["spec"]["devices"][0]["attributes"]
        if release >= (1, 36):
            assert attributes[NUMA] == {"ints": [1]} and attributes["links"] == {"strings": ["a", "b"]}
        else:
            assert attributes[NUMA] == {"int": 1} and "links" not in attributes
    finally:
        for item in slices:
            api.delete_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices", item["metadata"]["name"]
            )
