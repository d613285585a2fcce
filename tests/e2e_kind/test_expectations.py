"""The expect.yaml interpreter on real examples' expectations and hand-built cluster snapshots."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from e2e.lib.container_report import ClientReport, ContainerReport
from e2e.lib.example_runner import ExampleRun
from e2e.lib.expectations import (
    Observed,
    check_all,
    check_hardware_reset,
    leftover_cdi_specs,
    manifest_to_make_again,
    mig_placement_of,
    mps_limit_bytes,
    runtime_start_flake,
)
from tests.deploy.expect_model import load_expectation

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GPU0 = "GPU-aaaa"
NODE = "node-a"


def _gpu_device(name: str, uuid: str, dtype: str = "gpu", **attrs: Any) -> dict[str, Any]:
    attributes = {
        "type": {"string": dtype},
        "uuid": {"string": uuid},
        "productName": {"string": "NVIDIA H100"},
    }
    for key, value in attrs.items():
        attributes[key] = {"string": value} if isinstance(value, str) else {"int": value}
    return {"name": name, "attributes": attributes, "capacity": {"memory": {"value": "80Gi"}}}


def _claim(name: str, uid: str, results: list[tuple[str, str]], reserved: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": req, "driver": "gpu.nvidia.com", "pool": NODE, "device": dev}
                        for req, dev in results
                    ]
                }
            },
            "reservedFor": [{"name": f"p{i}"} for i in range(reserved)],
        },
    }


def _pod(
    name: str,
    claim_ref: dict[str, str],
    containers: list[dict[str, Any]],
    phase: str = "Running",
    status_claims: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {}},
        "spec": {"resourceClaims": [claim_ref], "containers": containers},
        "status": {"phase": phase, "resourceClaimStatuses": status_claims or []},
    }


def _state(gpus: list[dict[str, Any]], mps: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"hardware": "dgx-h100", "gpus": gpus, "mps": mps or {}}


def _gpu_state(uuid: str, **changes: Any) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "compute_mode": 0,
        "timeslice": 0,
        "mig_current": False,
        "gpu_instances": [],
        **changes,
    }


REPORT = ContainerReport(
    env={"CUDA_MPS_PIPE_DIRECTORY": "/mps/pipe"}, devices=("/dev/nvidia0", "/dev/nvidiactl"), complete=True
)


def _mps_observed(pct: int = 50, limit: str = "10G", second_device: str = "gpu-0") -> Observed:
    ctr = [{"name": "ctr", "resources": {"claims": [{"name": "gpu"}]}}]
    ref = {"name": "gpu", "resourceClaimName": "mps-gpu"}
    pods = [_pod("pod0", ref, ctr), _pod("pod1", ref, ctr)]
    claims = [_claim("mps-gpu", "uid-1", [("gpu", "gpu-0")], reserved=2)]
    if second_device != "gpu-0":  # a broken cluster: the second pod sees another claim's device
        claims.append(_claim("other", "uid-2", [("gpu", second_device)]))
        pods[1]["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "other"}]
    mps = {
        "/pipe": {
            "running": True,
            "visible_devices": [GPU0],
            "default_active_thread_percentage": pct,
            "default_pinned_mem_limits": {GPU0: limit},
        }
    }
    return Observed(
        pods=pods,
        claims=claims,
        slice_devices={
            (NODE, "gpu-0"): _gpu_device("gpu-0", GPU0),
            (NODE, "gpu-1"): _gpu_device("gpu-1", "GPU-b"),
        },
        reports={"pod0/ctr": REPORT, "pod1/ctr": REPORT},
        sim_before=_state([_gpu_state(GPU0)]),
        sim_now=_state([_gpu_state(GPU0, compute_mode=3)], mps),
        clients={key: _client(pct, limit) for key in ("pod0/ctr", "pod1/ctr")},
    )


def _client(pct: int, limit: str, gpu: str = GPU0) -> ClientReport:
    """What the simulated CUDA client in a container reports (limits as `<N>M`, as the client gives them)."""
    return ClientReport(
        mps=True,
        server_pid=4194305,
        gpus=(gpu,),
        active_thread_percentage=pct,
        pinned_limits={gpu: f"{mps_limit_bytes(limit) // 2**20}M"},
    )


def test_mps_example_holds_on_a_matching_snapshot() -> None:
    exp = load_expectation(EXAMPLES / "mps-limits" / "expect.yaml")
    assert check_all(exp, _mps_observed()) == []


def test_mps_example_reports_every_broken_promise() -> None:
    exp = load_expectation(EXAMPLES / "mps-limits" / "expect.yaml")
    failures = check_all(exp, _mps_observed(pct=100, limit="8G", second_device="gpu-1"))
    text = "\n".join(failures)
    assert "active thread percentage 100, expected 50" in text
    assert "pinned memory limits {'GPU-aaaa': '8192M'}, expected 10Gi" in text
    assert "sameDevices" in text and "reservedFor" not in text


def test_missing_container_report_is_a_failure_not_a_crash() -> None:
    exp = load_expectation(EXAMPLES / "mps-limits" / "expect.yaml")
    observed = _mps_observed()
    observed = Observed(**{**observed.__dict__, "reports": {}})
    assert any("has not printed" in f for f in check_all(exp, observed))


def test_mig_instances_created_for_the_claim_are_matched_by_placement() -> None:
    exp = load_expectation(EXAMPLES / "mig-mixed-profiles" / "expect.yaml")
    devices = {
        "gpu-0-mig-1g10gb-19-0": "1g.10gb",
        "gpu-0-mig-1g10gb-19-1": "1g.10gb",
        "gpu-0-mig-2g20gb-14-2": "2g.20gb",
        "gpu-0-mig-3g40gb-9-4": "3g.40gb",
    }
    slice_devices = {
        (NODE, n): {
            "name": n,
            "attributes": {
                "type": {"string": "mig"},
                "profile": {"string": p},
                "parentUUID": {"string": GPU0},
            },
        }
        for n, p in devices.items()
    }
    requests = {"1g.10gb": "mig-1g", "2g.20gb": "mig-2g", "3g.40gb": "mig-3g"}
    claim = _claim("pod-mig-devices-x", "uid-m", [(requests[p], n) for n, p in devices.items()])
    ctrs = [
        {"name": f"ctr-{g}", "resources": {"claims": [{"name": "mig-devices", "request": f"mig-{g}"}]}}
        for g in ("1g", "2g", "3g")
    ]
    pod = _pod(
        "pod",
        {"name": "mig-devices", "resourceClaimTemplateName": "mig-mixed"},
        ctrs,
        status_claims=[{"name": "mig-devices", "resourceClaimName": "pod-mig-devices-x"}],
    )
    caps = ("/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2")
    reports = {
        "pod/ctr-1g": ContainerReport(devices=("/dev/nvidia0", *caps, *caps), complete=True),
        "pod/ctr-2g": ContainerReport(devices=("/dev/nvidia0", *caps), complete=True),
        "pod/ctr-3g": ContainerReport(devices=("/dev/nvidia0", *caps), complete=True),
    }
    gis = [
        {
            "profile_id": int(n.split("-")[-2]),
            "start": int(n.split("-")[-1]),
            "gi_id": i,
            "size": 1,
            "compute_instances": [{"uuid": f"MIG-{i}"}],
        }
        for i, n in enumerate(devices)
    ]
    observed = Observed(
        pods=[pod],
        claims=[claim],
        slice_devices=slice_devices,
        reports=reports,
        sim_before=_state([_gpu_state(GPU0)]),
        sim_now=_state([_gpu_state(GPU0, mig_current=True, gpu_instances=gis)]),
    )
    assert check_all(exp, observed) == []
    # A snapshot in which one instance was not created fails with the placement named.
    observed_missing = Observed(
        **{**observed.__dict__, "sim_now": _state([_gpu_state(GPU0, gpu_instances=gis[1:])])}
    )
    assert any("no MIG instance (19, 0)" in f for f in check_all(exp, observed_missing))


def test_pending_pod_needs_its_event() -> None:
    exp = load_expectation(EXAMPLES / "negative-unmatched-selector" / "expect.yaml")
    pod = _pod(
        "pod",
        {"name": "gpu", "resourceClaimTemplateName": "t"},
        [],
        phase="Pending",
        status_claims=[{"name": "gpu", "resourceClaimName": "pod-gpu-1"}],
    )
    claim = {"metadata": {"name": "pod-gpu-1", "uid": "u"}, "status": {}}
    base = Observed(pods=[pod], claims=[claim], slice_devices={})
    assert any("no Warning event FailedScheduling" in f for f in check_all(exp, base))
    event = {
        "involvedObject": {"name": "pod"},
        "reason": "FailedScheduling",
        "type": "Warning",
        "message": "0/1 nodes are available: 1 cannot allocate all claims.",
    }
    assert check_all(exp, Observed(**{**base.__dict__, "events": [event]})) == []


def test_hardware_reset_after_deletion() -> None:
    before = _state([_gpu_state(GPU0)])
    after_bad = _state(
        [_gpu_state(GPU0, timeslice=3, gpu_instances=[{"profile_id": 19, "start": 0}])],
        {"/p": {"running": True, "visible_devices": [GPU0]}},
    )
    failures = check_hardware_reset(before, after_bad)
    assert len(failures) == 3 and "time slice 3" in failures[0]
    after_ok = _state([_gpu_state(GPU0)], {"/p": {"running": False}})
    assert check_hardware_reset(before, after_ok) == []


def test_small_parsers() -> None:
    assert mig_placement_of("gpu-3-mig-1g10gb-me-20-6") == (20, 6)
    assert mig_placement_of("gpu-3") is None and mig_placement_of("gpu-3-shared") is None
    assert mps_limit_bytes("10G") == 10 * 2**30 and mps_limit_bytes("512M") == 512 * 2**20
    with pytest.raises(ValueError, match="not <N>M or <N>G"):
        mps_limit_bytes("10Gi")
    assert leftover_cdi_specs(["gpu.nvidia.com-claim_uid-1.json", "other.json"], ["uid-1", ""]) == [
        "gpu.nvidia.com-claim_uid-1.json"
    ]


def _failed_pod(name: str, reason: str, message: str, phase_now: str = "Failed") -> dict[str, Any]:
    terminated = {"reason": reason, "message": message, "exitCode": 128}
    return {
        "metadata": {"name": name},
        "status": {
            "phase": phase_now,
            "containerStatuses": [{"name": "ctr", "state": {"terminated": terminated}}],
        },
    }


FREEZE = (
    "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
    "failed: unable to start container process: error during container init: error setting cgroup config for "
    "procHooks process: unable to freeze"
)


def test_a_runtime_start_flake_is_told_apart_from_real_start_failures() -> None:
    assert runtime_start_flake(_failed_pod("p", "StartError", FREEZE)) == FREEZE
    # a container that could not start for the example's or the driver's reason stays a failure
    missing_cdi = "CDI device injection failed: unresolvable CDI devices gpu.nvidia.com/claim=x-gpu-0"
    assert runtime_start_flake(_failed_pod("p", "StartError", missing_cdi)) is None
    assert runtime_start_flake(_failed_pod("p", "Error", FREEZE)) is None
    assert runtime_start_flake(_failed_pod("p", "StartError", FREEZE, phase_now="Running")) is None


def test_a_pod_made_again_is_its_authors_pod_not_the_clusters() -> None:
    """What the chart tests re-create after a runtime start flake: the same name, labels, claims and
    containers; not the node it was bound to (the scheduler places it again) nor the token volume the
    cluster added to it (the new pod gets its own)."""
    live = {
        "metadata": {"name": "tenant-a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                     "labels": {"app": "t"}},
        "spec": {
            "nodeName": "worker", "restartPolicy": "Never",
            "resourceClaims": [{"name": "share", "resourceClaimTemplateName": "tenant-a"}],
            "volumes": [{"name": "kube-api-access-ab12c", "projected": {"sources": []}}, {"name": "data"}],
            "containers": [{"name": "ctr", "image": "busybox", "volumeMounts": [
                {"name": "kube-api-access-ab12c", "mountPath": "/var/run/secrets/kubernetes.io"},
                {"name": "data", "mountPath": "/data"}]}],
        },
        "status": {"phase": "Failed"},
    }  # fmt: skip
    made = manifest_to_make_again(live)
    assert made["metadata"] == {"name": "tenant-a", "namespace": "ns", "labels": {"app": "t"}}
    assert "nodeName" not in made["spec"] and "status" not in made
    assert made["spec"]["resourceClaims"] == live["spec"]["resourceClaims"]
    assert made["spec"]["volumes"] == [{"name": "data"}]
    assert made["spec"]["containers"][0]["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert live["spec"]["nodeName"] == "worker"  # the live object is left as it was


class _RecordingKubectl:
    """Stands in for kubectl in the harness's own test: records what the runner would send."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def delete_manifest(self, manifest: str, namespace: str | None = None, wait: bool = True) -> None:
        self.calls.append(("delete", yaml.safe_load(manifest)))

    def apply(self, manifest: str, namespace: str | None = None, server_side: bool = False) -> str:
        self.calls.append(("apply", yaml.safe_load(manifest)))
        return ""


def test_the_runner_makes_a_pod_again_once_after_a_runtime_start_flake() -> None:
    kubectl = _RecordingKubectl()
    settings = SimpleNamespace(test_image="dra-gpu-test:local")
    run = ExampleRun(EXAMPLES / "time-slicing-intervals", kubectl, None, settings)  # type: ignore[arg-type]
    flaky = _failed_pod("pod-long", "StartError", FREEZE)
    assert run._recreate_runtime_flakes([flaky, _failed_pod("not-in-the-manifests", "StartError", FREEZE)])
    assert [(verb, doc["metadata"]["name"]) for verb, doc in kubectl.calls] == [
        ("delete", "pod-long"),
        ("apply", "pod-long"),
    ]
    made = kubectl.calls[1][1]
    assert made["kind"] == "Pod" and made["metadata"]["namespace"] == "time-slicing-intervals"
    assert {c["image"] for c in made["spec"]["containers"]} == {"dra-gpu-test:local"}
    assert not run._recreate_runtime_flakes([flaky])  # once: a second failure is the example's
    assert len(kubectl.calls) == 2


def test_footprint_counts_the_distinct_gpus_of_the_claims() -> None:
    """mps-limits promises one GPU: its claim on gpu-0 holds; a claim on a second GPU breaks it."""
    exp = load_expectation(EXAMPLES / "mps-limits" / "expect.yaml")
    assert not [f for f in check_all(exp, _mps_observed()) if f.startswith("footprint")]
    two = [f for f in check_all(exp, _mps_observed(second_device="gpu-1")) if f.startswith("footprint")]
    assert two == ["footprint: the claims hold 2 distinct GPUs (mps-gpu: 1, other: 1), expected 1"]


def test_footprint_remembers_claims_gone_with_their_pods() -> None:
    """A Job's claims are deleted once its pods succeed: what they held (held_gpus) still counts, and while a
    finished pod's claim was never seen the count may fall short without failing."""
    exp = load_expectation(EXAMPLES / "job-claim-template" / "expect.yaml")  # footprint 2
    ref = {"name": "gpu", "resourceClaimTemplateName": "single-gpu"}
    pods = [
        _pod(f"job-{i}", ref, [{"name": "ctr"}], "Succeeded", [{"name": "gpu", "resourceClaimName": f"c{i}"}])
        for i in range(2)
    ]
    devices = {(NODE, "gpu-0"): _gpu_device("gpu-0", GPU0), (NODE, "gpu-1"): _gpu_device("gpu-1", "GPU-b")}
    unseen = Observed(pods=pods, claims=[], slice_devices=devices)
    assert not [f for f in check_all(exp, unseen) if f.startswith("footprint")]
    seen_one = Observed(pods=pods, claims=[], slice_devices=devices, held_gpus={"c0": frozenset({GPU0})})
    assert not [f for f in check_all(exp, seen_one) if f.startswith("footprint")]  # c1 unseen
    both_on_one = Observed(
        pods=pods,
        claims=[],
        slice_devices=devices,
        held_gpus={"c0": frozenset({GPU0}), "c1": frozenset({GPU0})},
    )
    assert [f for f in check_all(exp, both_on_one) if f.startswith("footprint")] == [
        "footprint: the claims hold 1 distinct GPUs (c0: 1, c1: 1), expected 2"
    ]


def test_each_container_of_the_claim_must_have_asked_mps_itself() -> None:
    """mps-limits: both pods' containers are asked; one whose client got no answer, or that was not asked
    yet, fails the claim even when the other container is served right."""
    exp = load_expectation(EXAMPLES / "mps-limits" / "expect.yaml")
    observed = _mps_observed()
    clients = {"pod0/ctr": ClientReport(error="the client exited 1: no MPS control daemon")}
    failures = check_all(exp, Observed(**{**observed.__dict__, "clients": clients}))
    assert [f for f in failures if "CUDA client" in f] == [
        "claim mps-gpu (mps-gpu): a CUDA client in pod0/ctr got no answer from MPS: the client exited 1: no "
        "MPS control daemon",
        "claim mps-gpu (mps-gpu): no CUDA client has asked MPS from inside pod1/ctr yet",
    ]


def test_a_selector_the_scheduler_cannot_evaluate_ends_the_wait() -> None:
    """NVIDIA's gpu-test6 reads an attribute no driver publishes: every scheduling attempt fails with the same
    CEL runtime error, so the runner stops waiting; any other FailedScheduling (devices busy) keeps it."""
    from e2e.lib.example_runner import unschedulable_for_good

    busy = {"reason": "FailedScheduling", "message": "0/5 nodes are available: 1 cannot allocate all claims."}
    cel = {
        "reason": "FailedScheduling",
        "message": "0/5 nodes are available: 1 CEL runtime error: no such key: index.",
    }
    assert unschedulable_for_good([busy]) is None
    assert unschedulable_for_good([{"reason": "Scheduled", "message": "CEL runtime error"}]) is None
    assert unschedulable_for_good([busy, cel]) == cel["message"]
