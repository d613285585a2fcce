"""NVIDIA's consumable-shares examples scaled past the node's GPU count, allocated claim after claim by our
allocator (kube-scheduler's semantics) on the simulated DGX H100's slices: the claims pack onto each GPU as
far as the mode allows, and no capacity that the mode does not share (copy engines, SMs, ...) stops them.

The expected figures come from e2e/lib/consumable_shares.py (written from NVIDIA's README), which the e2e
test uses on the real cluster, and are also spelled out here."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.types import DiscoveryResult
from dra_gpu.inventory.consumable_shares import parse_consumable_shares
from dra_gpu.inventory.device_model import ModelOptions, build_device_model
from dra_gpu.slices.slice_builder import build_slices
from e2e.lib.consumable_shares import (
    NVIDIA_FLAG,
    claims_per_gpu,
    claims_per_gpu_limit,
    expected_claims_per_gpu,
    scaled_replicas,
    template_requests,
    whole_gpus,
)
from e2e.lib.nvidia_conformance import CONFORMANCE_DIR
from tests.allocator.builders import allocate_in_turn
from tests.deploy.expect_model import load_expectation

NODE = "node-a"
GPUS = [f"{NODE}/gpu-{i}" for i in range(8)]
# Capacities no mode divides between claims: none of them may be what stops one.
UNSHARED = ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")


def _slices(discovery: DiscoveryResult, flag: str, dynamic_mig: bool = True) -> list[dict[str, Any]]:
    options = ModelOptions(dynamic_mig=dynamic_mig, consumable_shares=parse_consumable_shares(flag))
    return build_slices(build_device_model(discovery, options), NODE, (1, 35))


def _example(mode: str) -> list[dict[str, Any]]:
    folder = CONFORMANCE_DIR / f"consumable-shares-{mode}"
    exp = load_expectation(folder / "expect.yaml")
    return [
        d
        for name in exp.manifests
        for d in yaml.safe_load_all((folder / name).read_text())
        if isinstance(d, dict)
    ]


def _claim_spec(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    (template,) = [d for d in docs if d.get("kind") == "ResourceClaimTemplate"]
    return dict(template["spec"]["spec"])


# NVIDIA's examples at 12 and 40 replicas on the 8 GPUs: N=4 puts 4 claims on a GPU; unlimited any number;
# memory mode 4Gi claims up to the H100's 81559Mi (19 of them).
FIGURES = {
    ("integer", 12): ({"gpu-0": 4, "gpu-1": 4, "gpu-2": 4}, 0),
    ("integer", 40): ({f"gpu-{i}": 4 for i in range(8)}, 8),
    ("unlimited", 12): ({"gpu-0": 12}, 0),
    ("unlimited", 40): ({"gpu-0": 40}, 0),
    ("memory", 12): ({"gpu-0": 12}, 0),
    ("memory", 40): ({"gpu-0": 19, "gpu-1": 19, "gpu-2": 2}, 0),
}


@pytest.mark.parametrize(("mode", "replicas"), sorted(FIGURES))
def test_nvidia_examples_pack_as_far_as_the_mode_allows(
    discovery: DiscoveryResult, mode: str, replicas: int
) -> None:
    slices = _slices(discovery, NVIDIA_FLAG[mode])
    docs = _example(mode)
    allocated, pending = allocate_in_turn(slices, _claim_spec(docs), replicas)
    per_gpu = claims_per_gpu(allocated)
    figures, pending_count = FIGURES[(mode, replicas)]
    assert per_gpu == {f"{NODE}/{gpu}": n for gpu, n in figures.items()}
    assert len(pending) == pending_count
    # the e2e test's expectation (from NVIDIA's README, not from the allocator) says the same
    gpus = whole_gpus(slices)
    assert [g for g, _ in gpus] == GPUS
    limit = claims_per_gpu_limit(mode, gpus[0][1], template_requests(docs))
    assert expected_claims_per_gpu(GPUS, limit, replicas) == per_gpu
    # the mode's own capacity is what stops the rest, never one that is not shared
    for reason in pending:
        assert "capacity shares: 4 of 4 in use" in reason, reason
        assert not any(name in reason for name in UNSHARED), reason
    # each claim is a share of its GPU (shareID), consuming none of the unshared capacities
    for claim in allocated:
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["shareID"]
        assert all(result["consumedCapacity"][name] == "0" for name in UNSHARED), result


@pytest.mark.parametrize("mode", sorted(NVIDIA_FLAG))
def test_the_examples_as_published_fit_their_footprint(discovery: DiscoveryResult, mode: str) -> None:
    """expect.yaml's footprint (the most GPUs the example holds) is one GPU: NVIDIA's replicas share it."""
    docs = _example(mode)
    (deployment,) = [d for d in docs if d.get("kind") == "Deployment"]
    replicas = int(deployment["spec"]["replicas"])
    assert replicas > 1 and scaled_replicas(len(GPUS)) == 12
    allocated, pending = allocate_in_turn(_slices(discovery, NVIDIA_FLAG[mode]), _claim_spec(docs), replicas)
    footprint = load_expectation(CONFORMANCE_DIR / f"consumable-shares-{mode}" / "expect.yaml").footprint
    assert pending == [] and claims_per_gpu(allocated) == {f"{NODE}/gpu-0": replicas}
    assert len(claims_per_gpu(allocated)) <= footprint.gpus


def test_memory_mode_without_a_memory_request_takes_a_whole_gpu(discovery: DiscoveryResult) -> None:
    """NVIDIA's unlimited example's claim (no capacity request) on a node in memory mode: one per GPU, and
    the GPU's memory (the default takes all of it), not an engine count, is what stops the ninth."""
    docs = _example("unlimited")
    allocated, pending = allocate_in_turn(_slices(discovery, "memory"), _claim_spec(docs), 12)
    assert claims_per_gpu(allocated) == dict.fromkeys(GPUS, 1)
    assert len(pending) == 4
    for reason in pending:
        assert "capacity memory: " in reason and not any(name in reason for name in UNSHARED), reason
    gpu = whole_gpus(_slices(discovery, "memory"))[0][1]
    assert claims_per_gpu_limit("memory", gpu, template_requests(docs)) == 1


@pytest.mark.parametrize(("flag", "per_device"), [("3", 3), ("unlimited", 10)])
def test_existing_mig_devices_are_shared_as_far_as_the_mode_allows(flag: str, per_device: int) -> None:
    """Static MIG devices (made out of band, dynamic MIG off) carry their engine counts and SMs too."""
    root = Path(tempfile.mkdtemp(prefix="shares-mig-", dir="/tmp"))
    try:
        hw = open_hardware("h100-80gb", str(root))
        gpu = hw.discover().gpus[0]
        hw.create_mig_device(gpu.uuid, 9, 0)  # 3g.40gb at memory slices 0-3
        hw.create_mig_device(gpu.uuid, 9, 4)  # and 4-7
        discovery = hw.discover()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    slices = _slices(discovery, flag, dynamic_mig=False)
    spec = {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}
    allocated, pending = allocate_in_turn(slices, spec, 10)
    per_device_counts = Counter(claims_per_gpu(allocated).values())
    if per_device == 3:
        assert per_device_counts == Counter({3: 2}) and len(pending) == 4
    else:
        assert claims_per_gpu(allocated) == {f"{NODE}/gpu-0-mig-3g40gb-9-0": 10} and pending == []
    for reason in pending:
        assert "capacity shares: 3 of 3 in use" in reason, reason


def test_the_shares_limit_from_the_published_gpu() -> None:
    """claims_per_gpu_limit (the e2e expectation) for the request shapes NVIDIA's README names."""
    gpu = {"capacity": {"memory": {"value": "81559Mi"}, "shares": {"value": "4"}}}
    assert claims_per_gpu_limit("integer", gpu, {}) == 4
    assert claims_per_gpu_limit("integer", gpu, {"shares": "2"}) == 2
    assert claims_per_gpu_limit("integer", gpu, {"memory": "40Gi"}) == 1
    assert claims_per_gpu_limit("unlimited", gpu, {}) is None
    assert claims_per_gpu_limit("unlimited", gpu, {"memory": "4Gi"}) == 19
    assert claims_per_gpu_limit("memory", gpu, {"memory": "4Gi"}) == 19
    assert claims_per_gpu_limit("memory", gpu, {"memory": "4095.5Mi"}) == 19  # rounded up to 4096Mi
    assert claims_per_gpu_limit("memory", gpu, {}) == 1
    assert expected_claims_per_gpu(["a", "b", "c"], 4, 9) == {"a": 4, "b": 4, "c": 1}
    assert expected_claims_per_gpu(["a", "b"], 4, 12) == {"a": 4, "b": 4}
    assert expected_claims_per_gpu(["a", "b"], None, 12) == {"a": 12}
    assert expected_claims_per_gpu(["a", "b"], 1, 0) == {}


def test_claims_per_gpu_counts_our_results_only() -> None:
    def allocated(*results: Mapping[str, Any]) -> dict[str, Any]:
        return {"status": {"allocation": {"devices": {"results": list(results)}}}}

    ours = {"driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0", "request": "gpu", "shareID": "x"}
    other = {"driver": "other.example.com", "pool": "n", "device": "gpu-0", "request": "gpu"}
    claims = [allocated(ours), allocated(ours, other), {"status": {}}, allocated(ours | {"device": "gpu-1"})]
    assert claims_per_gpu(claims) == {"n/gpu-0": 2, "n/gpu-1": 1}
