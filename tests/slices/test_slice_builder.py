"""ResourceSlice layouts per Kubernetes version, NVIDIA's H100 placements, and client-side validation."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.types import DiscoveryResult
from dra_gpu.inventory.device_model import build_device_model
from dra_gpu.inventory.model import DeviceModel
from dra_gpu.slices.slice_builder import build_slices, format_quantity
from dra_gpu.slices.slice_validation import validate_slices

REPO = Path(__file__).resolve().parents[2]

# NVIDIA's H100-80GB table (nvidia-conventions §12): profile -> (GI profile id, valid starts, memory slices)
H100_TABLE = {
    "1g.10gb": (19, [0, 1, 2, 3, 4, 5, 6], 1),
    "1g.10gb+me": (20, [0, 1, 2, 3, 4, 5, 6], 1),
    "1g.20gb": (15, [0, 2, 4, 6], 2),
    "2g.20gb": (14, [0, 2, 4], 2),
    "3g.40gb": (9, [0, 4], 4),
    "4g.40gb": (5, [0], 4),
    "7g.80gb": (0, [0], 8),
}


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="slc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _discovery(root: Path, hardware: str) -> DiscoveryResult:
    return open_hardware(hardware, str(root / hardware), seed="node-a").discover()


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def test_dgx_h100_on_136_has_counters_slice_then_one_slice_per_gpu(root: Path) -> None:
    model = build_device_model(_discovery(root, "dgx-h100"))
    slices = build_slices(model, "node-a", (1, 36), generation=3, node_uid="uid-1")
    assert validate_slices(slices, (1, 36)) == []
    assert [s["metadata"]["name"] for s in slices] == [f"node-a-gpu.nvidia.com-{i}" for i in range(9)]
    assert all(
        s["spec"]["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 9} for s in slices
    )
    assert all(s["spec"]["nodeName"] == "node-a" and s["spec"]["driver"] == "gpu.nvidia.com" for s in slices)
    assert slices[0]["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1", "controller": True}
    ]
    counters = slices[0]["spec"]["sharedCounters"]
    assert "devices" not in slices[0]["spec"] and len(counters) == 8
    assert counters[0]["counters"]["memory-slice-7"] == {"value": "1"}
    assert counters[0]["counters"]["multiprocessors"] == {"value": "132"}
    for minor, item in enumerate(slices[1:]):
        assert "sharedCounters" not in item["spec"]
        names = [d["name"] for d in item["spec"]["devices"]]
        assert len(names) == 27 and names[0] == f"gpu-{minor}" and names[-1] == f"gpu-{minor}-shared"


def test_every_nvidia_h100_placement_is_published_with_its_memory_slices(root: Path) -> None:
    model = build_device_model(_discovery(root, "dgx-h100"))
    devices = {d["name"]: d for d in _devices(build_slices(model, "node-a"))}
    for minor in range(8):
        assert f"gpu-{minor}" in devices
        for profile, (profile_id, starts, size) in H100_TABLE.items():
            label = profile.replace(".", "").replace("+", "-")  # NVIDIA: "1g.10gb+me" -> "1g10gb-me"
            for start in starts:
                device = devices.pop(f"gpu-{minor}-mig-{label}-{profile_id}-{start}")
                consumed = device["consumesCounters"][0]
                assert consumed["counterSet"] == f"gpu-{minor}-counter-set"
                slice_counters = {k for k in consumed["counters"] if k.startswith("memory-slice-")}
                assert slice_counters == {f"memory-slice-{i}" for i in range(start, start + size)}
                assert device["attributes"]["profile"] == {"string": profile}
                assert device["attributes"]["type"] == {"string": "mig"}
    assert sorted(devices) == sorted([f"gpu-{m}" for m in range(8)] + [f"gpu-{m}-shared" for m in range(8)])


def test_134_layout_keeps_counters_beside_devices(root: Path) -> None:
    model = build_device_model(_discovery(root, "dgx-h100"))
    slices = build_slices(model, "node-a", (1, 34))
    assert validate_slices(slices, (1, 34)) == []
    assert len(slices) == 8
    for minor, item in enumerate(slices):
        assert [c["name"] for c in item["spec"]["sharedCounters"]] == [f"gpu-{minor}-counter-set"]
        assert len(item["spec"]["devices"]) == 27
    # the 1.34 shape is invalid on 1.35+ (and the other way round)
    assert any("not both" in p for p in validate_slices(slices, (1, 35)))
    split = build_slices(model, "node-a", (1, 35))
    assert any("own slice" in p for p in validate_slices(split, (1, 34)))


def test_wire_format_details(root: Path) -> None:
    model = build_device_model(_discovery(root, "single-t4"))
    slices = build_slices(model, "node-a")
    share = next(d for d in _devices(slices) if d["name"] == "gpu-0-shared")
    assert share["allowMultipleAllocations"] is True
    assert share["capacity"]["memory"] == {
        "value": "15Gi",
        "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
    }
    assert share["capacity"]["compute"] == {
        "value": "100",
        "requestPolicy": {"default": "10", "validRange": {"min": "5", "step": "5"}},
    }
    # no NUMA node known (cloud VM): the standard attribute is left out, as NVIDIA's driver does
    assert (
        "numaNode" not in share["attributes"] and "resource.kubernetes.io/numaNode" not in share["attributes"]
    )
    assert "ownerReferences" not in slices[0]["metadata"]
    assert format_quantity(81559 * 2**20, binary_si=True) == "81559Mi"
    assert format_quantity(1000) == "1000"


def test_no_gpus_gives_one_empty_slice() -> None:
    slices = build_slices(DeviceModel(devices=()), "node-b")
    assert len(slices) == 1 and slices[0]["spec"]["devices"] == []
    assert slices[0]["spec"]["pool"]["resourceSliceCount"] == 1
    assert validate_slices(slices) == []


def test_more_than_eight_counter_sets_are_split(root: Path) -> None:
    discovery = _discovery(root, "dgx-h100")
    twelve = replace(
        discovery,
        gpus=discovery.gpus
        + tuple(
            replace(g, minor=g.minor + 8, index=g.index + 8, uuid=g.uuid + "x") for g in discovery.gpus[:4]
        ),
    )
    slices = build_slices(build_device_model(twelve), "node-a")
    assert validate_slices(slices) == []
    assert [len(s["spec"].get("sharedCounters", [])) for s in slices[:2]] == [8, 4]
    assert len(slices) == 2 + 12


def test_too_many_devices_for_one_slice_are_split(root: Path) -> None:
    model = build_device_model(_discovery(root, "h100-80gb"))  # 27 devices of GPU 0, all consuming counters
    copies = tuple(replace(d, name=f"{d.name}-copy{n}") for n in range(3) for d in model.devices)  # 81 more
    slices = build_slices(
        DeviceModel(devices=model.devices + copies, counter_sets=model.counter_sets), "node-a"
    )
    assert [len(s["spec"].get("devices", [])) for s in slices] == [0, 64, 44]
    assert validate_slices(slices) == []
    # no counters: 128 per slice
    plain = tuple(replace(d, consumes_counters=()) for d in model.devices + copies)
    assert [len(s["spec"]["devices"]) for s in build_slices(DeviceModel(devices=plain), "node-a")] == [108]


def _valid_slices(root: Path) -> list[dict[str, Any]]:
    return build_slices(build_device_model(_discovery(root, "h100-80gb")), "node-a")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda s: s[1]["spec"]["devices"][0]["attributes"].update(driverVersion={"version": "570.01.2"}),
            "not strict semver",
        ),
        (
            lambda s: s[1]["spec"]["devices"][0]["attributes"].update(productName={"string": "x" * 65}),
            "65 bytes",
        ),
        (
            lambda s: s[1]["spec"]["devices"][0]["attributes"].update(
                {f"extra{i}": {"int": i} for i in range(20)}
            ),
            "at most 32",
        ),
        (lambda s: s[1]["spec"]["devices"][1].update(name="Bad_Name"), "not a DNS label"),
        (
            lambda s: s[1]["spec"]["devices"].append(copy.deepcopy(s[1]["spec"]["devices"][0])),
            "unique per pool",
        ),
        (
            lambda s: s[1]["spec"]["devices"][2]["consumesCounters"][0].update(
                counterSet="gpu-9-counter-set"
            ),
            "does not define",
        ),
        (
            lambda s: s[1]["spec"]["devices"][2]["consumesCounters"][0]["counters"].update(
                bogus={"value": "1"}
            ),
            "not in counter set",
        ),
        (
            lambda s: s[1]["spec"]["devices"][0]["capacity"]["memory"].update(
                requestPolicy={"validRange": {"min": "1Gi"}}
            ),
            "allowMultipleAllocations must be true",
        ),
        (
            lambda s: s[1]["spec"]["devices"][-1]["capacity"]["compute"]["requestPolicy"].update(default="7"),
            "min + n*step",
        ),
        (lambda s: s[1]["spec"]["pool"].update(resourceSliceCount=3), "resourceSliceCount"),
        (lambda s: s[1]["spec"]["pool"].update(generation=2), "different generations"),
        (lambda s: s[0]["spec"].update(nodeName=None), "exactly one of nodeName"),
    ],
)
def test_validation_names_each_problem(root: Path, mutate: Any, message: str) -> None:
    slices = _valid_slices(root)
    mutate(slices)
    problems = validate_slices(slices)
    assert any(message in p for p in problems), problems


def _run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m module args...` from the repository root, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_slices_cli(root: Path) -> None:
    done = _run_module(
        "dra_gpu.cli.slices",
        "--hardware",
        "dgx-h100",
        "--node",
        "n1",
        "-o",
        "json",
        "--kubernetes-version",
        "1.35",
    )
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["items"]
    assert len(items) == 9 and items[0]["metadata"]["name"] == "n1-gpu.nvidia.com-0"
    bad = _run_module("dra_gpu.cli.slices", "--hardware", "dgx-b300", "--node", "n1")
    assert bad.returncode == 1 and "dgx-h100" in bad.stderr and "h200-141gb" in bad.stderr


def test_slices_cli_publishes_the_healthy_gpus(root: Path) -> None:
    sim = root / "sim"
    open_hardware("dgx-h100", str(sim))
    fault = _run_module(
        "dra_gpu.cli.hardware",
        "fault",
        "--driver-root",
        str(sim),
        "-i",
        "2",
        "--function",
        "nvmlDeviceGetPciInfo_v3",
    )
    assert fault.returncode == 0, fault.stderr
    done = _run_module(
        "dra_gpu.cli.slices",
        "--hardware",
        "dgx-h100",
        "--node",
        "n1",
        "--nvidia-driver-root",
        str(sim),
        "-o",
        "json",
    )
    assert done.returncode == 0, done.stderr
    assert "GPU index 2 not published" in done.stderr and "NVML_ERROR_GPU_IS_LOST" in done.stderr
    names = {d["name"] for s in json.loads(done.stdout)["items"] for d in s["spec"].get("devices", [])}
    assert "gpu-1" in names and "gpu-3" in names and "gpu-2" not in names
    inventory = _run_module(
        "dra_gpu.cli.inventory", "--hardware", "dgx-h100", "--nvidia-driver-root", str(sim)
    )
    assert inventory.returncode == 0 and "GPU index 2" in inventory.stdout
    assert "gpu 0 MIG placements (25)" in inventory.stdout
