"""`make demo`: the sharing showcase on the simulated DGX H100 node, as a table of pods, devices and sharing.

    python -m e2e.lib.demo up|show|down

`up` expects the cluster and the driver to run (e2e/demo.sh starts them), applies the showcase examples, waits
until each holds what its expect.yaml promises, and prints one row per pod: the devices its claims got
(allocation results) and how they are shared (the claim's opaque config, the capacity it consumed, and what
the simulated hardware records for the GPU: time-slice, compute mode, MPS daemon, MIG instances).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from e2e.lib.claims import pod_claim_names
from e2e.lib.driver import DriverControl, HostDriver
from e2e.lib.example_runner import EXAMPLES_DIR, ExampleFailedError, ExampleRun, slice_devices
from e2e.lib.expectations import attribute_text, container_devices, device_gpu_uuid, mig_placement_of
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import DRIVER_NAME, E2ESettings, load_settings
from e2e.lib.sim_view import gpu_views, mig_instances_by_gpu, mps_daemon_serving
from e2e.lib.summary import render_table

# Whole GPUs, time-slicing, MPS with limits, on-demand MIG with mixed profiles, fractional shares:
# 1 + 4 + 1 + 1 + 1 = the 8 GPUs of a DGX H100.
SHOWCASE = (
    "two-containers-one-gpu",
    "time-slicing-intervals",
    "mps-limits",
    "mig-mixed-profiles",
    "gpu-share-capacity",
)


def _log(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def _config_phrase(claim: Mapping[str, Any]) -> str:
    """The sharing the claim asked for, from its allocation's opaque config (our driver's only)."""
    configs = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("config") or []
    for cfg in configs:
        opaque = cfg.get("opaque") or {}
        if opaque.get("driver") != DRIVER_NAME:
            continue
        sharing = (opaque.get("parameters") or {}).get("sharing") or {}
        strategy = sharing.get("strategy")
        if strategy == "TimeSlicing":
            interval = (sharing.get("timeSlicingConfig") or {}).get("interval", "Default")
            return f"TimeSlicing {interval}"
        if strategy == "MPS":
            mps = sharing.get("mpsConfig") or {}
            limits = (
                [f"{mps['defaultActiveThreadPercentage']}% threads"]
                if "defaultActiveThreadPercentage" in mps
                else []
            )
            if "defaultPinnedDeviceMemoryLimit" in mps:
                limits.append(f"{mps['defaultPinnedDeviceMemoryLimit']} pinned")
            return "MPS " + ", ".join(limits) if limits else "MPS"
        if strategy:
            return str(strategy)
    return ""


def _share_phrase(claim: Mapping[str, Any]) -> str:
    """`share compute=25, memory=10Gi` for consumable-capacity results (fractional GPUs)."""
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    parts = []
    for r in results:
        consumed: Mapping[str, Any] = r.get("consumedCapacity") or {}
        if r.get("driver") == DRIVER_NAME and consumed:
            parts.append("share " + ", ".join(f"{k}={v}" for k, v in sorted(consumed.items())))
    return "; ".join(parts)


def _hardware_phrase(state: Mapping[str, Any], slice_dev: Mapping[str, Any] | None, device: str) -> str:
    uuid = device_gpu_uuid(slice_dev)
    views = {v.uuid: v for v in gpu_views(state)}
    view = views.get(str(uuid))
    if view is None:
        return ""
    parts: list[str] = []
    placement = mig_placement_of(device)
    if placement is not None:
        profile = mig_instances_by_gpu(state).get(view.uuid, {}).get(placement)
        parts.append(f"MIG {profile} on gpu{view.index}" if profile else "MIG instance missing")
    if view.timeslice != "Default":
        parts.append(f"time-slice {view.timeslice}")
    if view.compute_mode != "Default":
        parts.append(f"compute {view.compute_mode}")
    daemon = mps_daemon_serving(state, [view.uuid, device, attribute_text(slice_dev, "uuid") or ""])
    if daemon is not None:
        parts.append("MPS daemon up")
    return ", ".join(parts)


def showcase_rows(
    kubectl: Kubectl, driver: DriverControl, namespaces: Sequence[str]
) -> list[tuple[str, ...]]:
    devices_by_key = slice_devices(kubectl)
    state = driver.sim_state()
    rows: list[tuple[str, ...]] = []
    for ns in namespaces:
        pods = kubectl.items("pods", ns)
        claims = kubectl.items("resourceclaims.resource.k8s.io", ns)
        by_name = {c["metadata"]["name"]: c for c in claims}
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            names = set()
            for ctr in pod["spec"].get("containers", []):
                names |= {
                    (d.pool, d.device) for d in container_devices(pod, ctr["name"], claims) if d.is_ours
                }
            hows: list[str] = []
            for claim_name in pod_claim_names(pod).values():
                claim = by_name.get(claim_name)
                if claim is None:
                    continue
                phrase = _config_phrase(claim)
                if len(claim.get("status", {}).get("reservedFor") or []) > 1:
                    phrase = f"{phrase} (claim shared by {len(claim['status']['reservedFor'])} pods)".strip()
                phrase = (phrase + " " + _share_phrase(claim)).strip()
                if phrase:
                    hows.append(phrase)
            if not hows and any(mig_placement_of(d) for _, d in names):
                hows.append("on-demand MIG (created at prepare)")
            hardware = sorted({_hardware_phrase(state, devices_by_key.get(k), k[1]) for k in names} - {""})
            rows.append(
                (
                    f"{ns}/{pod['metadata']['name']}",
                    pod.get("status", {}).get("phase", "?"),
                    ", ".join(sorted(d for _, d in names)) or "-",
                    "; ".join(sorted(set(hows))) or "exclusive",
                    "; ".join(hardware) or "-",
                )
            )
    return rows


def print_table(kubectl: Kubectl, driver: DriverControl) -> None:
    rows = showcase_rows(kubectl, driver, [ns for ns in SHOWCASE])
    headers = ("pod", "phase", "devices", "sharing (claim)", "simulated hardware")
    print(render_table(headers, rows, max_width=64))


def up(settings: E2ESettings, kubectl: Kubectl, driver: HostDriver) -> int:
    failed = 0
    for name in SHOWCASE:
        run = ExampleRun(EXAMPLES_DIR / name, kubectl, driver, settings, log=_log)
        _log(f"{name}: {run.exp.summary}")
        problems = run.apply()
        try:
            run.wait_expectations()
        except ExampleFailedError as exc:
            problems.append(str(exc))
        if problems:
            failed += 1
            _log(f"{name}: NOT as expected:\n" + "\n".join(problems))
        else:
            _log(f"{name}: ready in {run.outcome.timings.get('settled_s', 0):.1f}s")
    print()
    print_table(kubectl, driver)
    print(f"\nkubectl: export KUBECONFIG={settings.kubeconfig}; stop everything: make demo-down")
    return 1 if failed else 0


def down(kubectl: Kubectl) -> None:
    for name in SHOWCASE:
        kubectl.delete_namespace(name, wait=True)
        _log(f"deleted namespace {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.lib.demo")
    parser.add_argument("action", choices=["up", "show", "down"])
    args = parser.parse_args(argv)
    settings = load_settings()
    kubectl = Kubectl(settings.kubeconfig)
    driver = HostDriver(settings, kubectl)
    if args.action == "up":
        return up(settings, kubectl, driver)
    if args.action == "show":
        print_table(kubectl, driver)
        return 0
    down(kubectl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
