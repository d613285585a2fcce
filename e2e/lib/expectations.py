"""Checks an example's `expect.yaml` against what the cluster shows (pure).

The schema is the deploy engineer's pydantic model (`tests/deploy/expect_model.py`, documented in
`examples/README.md`); this module only interprets it. Each `check_*` returns a list of failures (empty when
the expectation holds), so the suite can poll until the list is empty and, at the deadline, report every
unmet promise at once rather than the first one.
"""

from __future__ import annotations

import copy
import fnmatch
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gpu.cel.quantity import QuantityError, parse_quantity_strict
from e2e.lib.claims import AllocatedDevice, allocated_devices, pod_claim_names, reserved_for
from e2e.lib.container_report import ClientReport, ContainerReport
from e2e.lib.settings import DRIVER_NAME
from e2e.lib.sim_view import (
    compute_instance_uuids,
    mig_instances_by_gpu,
    mps_daemon_serving,
    running_mps_daemons,
)
from tests.deploy.expect_model import (
    ClaimExpectation,
    ClaimRef,
    ContainerExpectation,
    DeviceExpectation,
    Expectation,
    HardwareExpectation,
    PodExpectation,
)

SliceDevices = Mapping[tuple[str, str], Mapping[str, Any]]  # (pool, device name) -> ResourceSlice device
COMPUTE_MODE_NAMES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


@dataclass(frozen=True)
class Observed:
    """One snapshot of everything the expectations talk about."""

    pods: Sequence[Mapping[str, Any]]
    claims: Sequence[Mapping[str, Any]]
    slice_devices: SliceDevices
    reports: Mapping[str, ContainerReport] = field(default_factory=dict)  # "<pod>/<container>"
    events: Sequence[Mapping[str, Any]] = ()
    sim_before: Mapping[str, Any] | None = None  # hardware state before the example was applied
    sim_now: Mapping[str, Any] | None = None
    # "<pod>/<container>" -> what a CUDA process in that container gets from MPS (container_client.py)
    clients: Mapping[str, ClientReport] = field(default_factory=dict)
    # claim name -> the GPU uuids it was seen to hold in any snapshot so far: a Job's claims are gone once
    # its pods end, and the footprint counts what they held
    held_gpus: Mapping[str, frozenset[str]] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------- devices
def attribute_text(device: Mapping[str, Any] | None, name: str) -> str | None:
    """An attribute of a slice device as text; `gpu.nvidia.com/x` and `x` name the same attribute."""
    if device is None:
        return None
    attrs = device.get("attributes") or {}
    short = name.removeprefix(f"{DRIVER_NAME}/")
    value = attrs.get(short, attrs.get(name))
    if not isinstance(value, Mapping) or not value:
        return None
    raw = next(iter(value.values()))
    if isinstance(raw, bool):
        return "true" if raw else "false"
    return str(raw)


def capacity_value(device: Mapping[str, Any] | None, name: str) -> str | None:
    if device is None:
        return None
    cap = (device.get("capacity") or {}).get(name.removeprefix(f"{DRIVER_NAME}/"))
    if isinstance(cap, Mapping):
        value = cap.get("value")
        return None if value is None else str(value)
    return None


def _quantity(text: str, where: str) -> Any:
    try:
        return parse_quantity_strict(text)
    except QuantityError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def check_devices(
    exp: DeviceExpectation, devices: Sequence[AllocatedDevice], slice_devices: SliceDevices, where: str
) -> list[str]:
    ours = [d for d in devices if d.is_ours]
    names = [d.device for d in ours]
    failures: list[str] = []
    if len(ours) != exp.count:
        failures.append(f"{where}: expected {exp.count} {DRIVER_NAME} device(s), got {len(ours)} {names}")
    looked_up = {d.device: slice_devices.get((d.pool, d.device)) for d in ours}
    for name, dev in looked_up.items():
        if dev is None:
            failures.append(f"{where}: allocated device {name} is in no ResourceSlice of {DRIVER_NAME}")
            continue
        if (t := attribute_text(dev, "type")) != exp.type:
            failures.append(f"{where}: device {name} has type {t!r}, expected {exp.type!r}")
        for attr, pattern in exp.attributes.items():
            text = attribute_text(dev, attr)
            if text is None or not re.search(pattern, text):
                failures.append(
                    f"{where}: device {name} attribute {attr}={text!r} does not match /{pattern}/"
                )
        for cap, bound in exp.minCapacity.items():
            have = capacity_value(dev, cap)
            if have is None or _quantity(have, where) < _quantity(bound, where):
                failures.append(f"{where}: device {name} capacity {cap}={have} is below {bound}")
    if exp.request is not None:
        wrong = [d.request for d in ours if d.request != exp.request]
        if wrong:
            failures.append(f"{where}: expected request {exp.request!r} for every result, got {wrong}")
    if exp.profiles is not None:
        got = Counter(attribute_text(looked_up[n], "profile") for n in names)
        if got != Counter(exp.profiles):
            failures.append(
                f"{where}: MIG profiles {sorted(map(str, got.elements()))}, expected {sorted(exp.profiles)}"
            )
    for attr in exp.sameAttribute:
        values = {attribute_text(looked_up[n], attr) for n in names}
        if len(values) > 1:
            failures.append(f"{where}: attribute {attr} differs across devices: {sorted(map(str, values))}")
    return failures


# ------------------------------------------------------------------------------------------------ pods
def match_pods(exp: PodExpectation, pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for pod in pods:
        meta = pod["metadata"]
        if exp.name is not None and meta["name"] == exp.name:
            out.append(pod)
        elif exp.selector is not None:
            labels = meta.get("labels") or {}
            if all(labels.get(k) == v for k, v in exp.selector.items()):
                out.append(pod)
    return out


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


# Container runtime failures to create a container that come from the host, not the driver or the
# example: runc on a loaded cgroup v1 host can give up freezing the new container's cgroup (seen once in
# ~20 CI runs on kind: "error setting cgroup config for procHooks process: unable to freeze").
RUNTIME_START_FLAKES = ("unable to freeze",)


def runtime_start_flake(pod: Mapping[str, Any]) -> str | None:
    """The runtime's message when `pod` has Failed because a container could not be created for a reason of
    the host (RUNTIME_START_FLAKES); None otherwise."""
    if phase(pod) != "Failed":
        return None
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            terminated = state.get("terminated") or {}
            message = str(terminated.get("message") or "")
            if terminated.get("reason") == "StartError" and any(f in message for f in RUNTIME_START_FLAKES):
                return message
    return None


def manifest_to_make_again(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A Pod manifest that makes `pod` again as its author wrote it: its name, labels, annotations and spec,
    less what the cluster filled in for this one (the node it was bound to, the service account token
    volume the admission plugin adds to each new pod)."""
    meta = pod["metadata"]
    spec = copy.deepcopy(dict(pod["spec"]))
    spec.pop("nodeName", None)
    injected = {v["name"] for v in spec.get("volumes") or [] if v["name"].startswith("kube-api-access-")}
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] not in injected]
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        mounts = [m for m in container.get("volumeMounts") or [] if m["name"] not in injected]
        container["volumeMounts"] = mounts
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if k in meta},
        "spec": spec,
    }


def container_devices(
    pod: Mapping[str, Any], container: str, claims: Sequence[Mapping[str, Any]]
) -> list[AllocatedDevice]:
    """The devices a container gets: results of the claims (and requests) listed in its resources.claims."""
    spec = next((c for c in pod["spec"].get("containers", []) if c["name"] == container), None)
    if spec is None:
        return []
    by_name = {c["metadata"]["name"]: c for c in claims}
    pod_claims = pod_claim_names(pod)
    out: list[AllocatedDevice] = []
    for ref in (spec.get("resources") or {}).get("claims") or []:
        claim = by_name.get(pod_claims.get(ref["name"], ""))
        if claim is None:
            continue
        request = ref.get("request")
        for dev in allocated_devices(claim):
            if not request or dev.request == request or dev.request.startswith(request + "/"):
                out.append(dev)
    # Extended resources (`nvidia.com/gpu: 1`) go through a claim the scheduler made for the pod.
    ext = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    ext_claim = by_name.get(ext.get("resourceClaimName", ""))
    if ext_claim is not None:
        requests = {
            m.get("requestName")
            for m in ext.get("requestMappings") or []
            if m.get("containerName") == container
        }
        out += [d for d in allocated_devices(ext_claim) if d.request in requests]
    return out


def _pod_events(events: Iterable[Mapping[str, Any]], pod: str) -> list[Mapping[str, Any]]:
    return [e for e in events if (e.get("involvedObject") or {}).get("name") == pod]


def check_container(exp: ContainerExpectation, pod: Mapping[str, Any], observed: Observed) -> list[str]:
    pod_name = pod["metadata"]["name"]
    where = f"{pod_name}/{exp.name}"
    failures: list[str] = []
    if exp.devices is not None:
        devices = container_devices(pod, exp.name, observed.claims)
        failures += check_devices(exp.devices, devices, observed.slice_devices, where)
    if not (exp.env or exp.envAbsent or exp.deviceNodes):
        return failures
    report = observed.reports.get(where)
    if report is None or not report.complete:
        return [*failures, f"{where}: the container has not printed its env/devices report yet"]
    for var, pattern in exp.env.items():
        value = report.env.get(var)
        if value is None or not re.fullmatch(pattern, value):
            failures.append(f"{where}: env {var}={value!r} does not fully match /{pattern}/")
    for var in exp.envAbsent:
        if var in report.env:
            failures.append(f"{where}: env {var} must be absent, is {report.env[var]!r}")
    for glob, count in exp.deviceNodes.items():
        found = [d for d in report.devices if fnmatch.fnmatchcase(d, glob)]
        if len(found) != count:
            failures.append(f"{where}: {len(found)} device node(s) match {glob} {found}, expected {count}")
    return failures


def check_pod_expectation(exp: PodExpectation, observed: Observed) -> list[str]:
    label = exp.name or f"pods {exp.selector}"
    pods = match_pods(exp, observed.pods)
    failures: list[str] = []
    if len(pods) != exp.count:
        return [f"{label}: expected {exp.count} pod(s), found {len(pods)}"]
    phases = Counter(phase(p) for p in pods)
    if exp.phase is not None and set(phases) != {exp.phase}:
        failures.append(f"{label}: phases {dict(phases)}, expected all {exp.phase}")
    if exp.phases is not None and phases != Counter({k: v for k, v in exp.phases.items() if v}):
        failures.append(f"{label}: phases {dict(phases)}, expected {exp.phases}")
    for pod in pods:
        name = pod["metadata"]["name"]
        if phase(pod) == "Pending":
            for ev in exp.events:
                seen = _pod_events(observed.events, name)
                if not any(
                    e.get("reason") == ev.reason
                    and e.get("type") == ev.type
                    and re.search(ev.messageRegex, e.get("message", ""))
                    for e in seen
                ):
                    got = sorted(
                        {f"{e.get('type')} {e.get('reason')}: {e.get('message', '')[:80]}" for e in seen}
                    )
                    failures.append(
                        f"{name}: no {ev.type} event {ev.reason} matching /{ev.messageRegex}/ (got {got})"
                    )
        elif phase(pod) in ("Running", "Succeeded"):
            for cexp in exp.containers:
                failures += check_container(cexp, pod, observed)
    return failures


# ---------------------------------------------------------------------------------------------- claims
def resolve_claims(ref: ClaimRef, observed: Observed) -> tuple[str, list[Mapping[str, Any]]]:
    """(a label for messages, the claims the reference means). Empty when they do not exist (yet)."""
    by_name = {c["metadata"]["name"]: c for c in observed.claims}
    if ref.name is not None:
        claim = by_name.get(ref.name)
        return f"claim {ref.name}", [claim] if claim else []
    pods = [
        p
        for p in observed.pods
        if (ref.pod is not None and p["metadata"]["name"] == ref.pod)
        or (
            ref.podSelector is not None
            and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in ref.podSelector.items())
        )
    ]
    names = [pod_claim_names(p).get(ref.podClaim or "") for p in pods]
    label = f"claim {ref.podClaim} of {ref.pod or ref.podSelector}"
    return label, [by_name[n] for n in names if n in by_name]


def check_claim_expectation(exp: ClaimExpectation, observed: Observed) -> list[str]:
    label, claims = resolve_claims(exp.ref, observed)
    if not claims:
        if not exp.allocated and exp.ref.name is None:
            # A pod whose claim never got created (quota) also satisfies "not allocated" - but say it.
            pods_exist = any(p["metadata"]["name"] == exp.ref.pod for p in observed.pods)
            return [] if pods_exist else [f"{label}: the pod does not exist"]
        return [f"{label}: not found"]
    failures: list[str] = []
    for claim in claims:
        where = f"{label} ({claim['metadata']['name']})"
        allocated = bool((claim.get("status") or {}).get("allocation"))
        if allocated != exp.allocated:
            failures.append(f"{where}: allocated={allocated}, expected {exp.allocated}")
            continue
        if exp.reservedFor is not None and len(reserved_for(claim)) != exp.reservedFor:
            failures.append(
                f"{where}: reservedFor has {reserved_for(claim)}, expected {exp.reservedFor} entries"
            )
        devices = allocated_devices(claim)
        if exp.devices is not None:
            failures += check_devices(exp.devices, devices, observed.slice_devices, where)
        if exp.consumedCapacity is not None:
            failures += _check_consumed(exp.consumedCapacity, claim, where)
        if exp.hardware is not None:
            failures += check_hardware(exp.hardware, devices, observed, where, claim["metadata"]["name"])
    return failures


def _check_consumed(want: Mapping[str, str], claim: Mapping[str, Any], where: str) -> list[str]:
    failures: list[str] = []
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    for r in results:
        if r.get("driver") != DRIVER_NAME:
            continue
        got = r.get("consumedCapacity") or {}
        for name, value in want.items():
            have = got.get(name)
            if have is None or _quantity(str(have), where) != _quantity(value, where):
                failures.append(
                    f"{where}: {r.get('device')} consumedCapacity {name}={have}, expected {value}"
                )
    return failures


# -------------------------------------------------------------------------------------------- hardware
def device_gpu_uuid(device: Mapping[str, Any] | None) -> str | None:
    """The physical GPU behind a slice device: its own uuid (full GPU) or its parent's (MIG, share)."""
    return attribute_text(device, "parentUUID") or attribute_text(device, "uuid")


def mig_placement_of(device_name: str) -> tuple[int, int] | None:
    """`gpu-<minor>-mig-<profile>-<giProfileId>-<start>` -> (giProfileId, start)."""
    parts = device_name.rsplit("-", 2)
    if len(parts) == 3 and "-mig-" in device_name and parts[1].isdigit() and parts[2].isdigit():
        return int(parts[1]), int(parts[2])
    return None


def device_uuids(
    state: Mapping[str, Any], device: AllocatedDevice, slice_dev: Mapping[str, Any] | None
) -> set[str]:
    """The uuids an MPS server of `device` names: the GPU's for a full GPU or a share, the MIG device's
    (its compute instances') for a MIG device."""
    uuid = device_gpu_uuid(slice_dev)
    placement = mig_placement_of(device.device)
    if placement is None:
        return {uuid} if uuid else set()
    return set(compute_instance_uuids(state, str(uuid), placement))


def check_hardware(
    exp: HardwareExpectation,
    devices: Sequence[AllocatedDevice],
    observed: Observed,
    where: str,
    claim_name: str = "",
) -> list[str]:
    state = observed.sim_now
    if state is None:
        return [f"{where}: no simulated hardware state to check"]
    failures: list[str] = []
    gpus = {g.get("uuid"): g for g in state.get("gpus", [])}
    created: list[str] = []
    before = mig_instances_by_gpu(observed.sim_before or {"gpus": []})
    now = mig_instances_by_gpu(state)
    for d in (d for d in devices if d.is_ours):
        slice_dev = observed.slice_devices.get((d.pool, d.device))
        uuid = device_gpu_uuid(slice_dev)
        gpu = gpus.get(uuid)
        if gpu is None:
            failures.append(f"{where}: no simulated GPU {uuid} behind device {d.device}")
            continue
        if exp.computeMode is not None:
            mode = COMPUTE_MODE_NAMES.get(int(gpu.get("compute_mode", 0)), str(gpu.get("compute_mode")))
            if mode != exp.computeMode:
                failures.append(f"{where}: GPU {uuid} compute mode {mode}, expected {exp.computeMode}")
        if exp.timeSlice is not None and int(gpu.get("timeslice", 0)) != exp.timeSlice:
            failures.append(
                f"{where}: GPU {uuid} time slice {gpu.get('timeslice')}, expected {exp.timeSlice}"
            )
        placement = mig_placement_of(d.device)
        needles = [str(uuid), d.device, attribute_text(slice_dev, "uuid") or ""]
        if placement is not None:
            needles += compute_instance_uuids(state, str(uuid), placement)
        daemon = mps_daemon_serving(state, needles)
        if exp.mpsDaemon is not None and (daemon is not None) != exp.mpsDaemon:
            failures.append(
                f"{where}: MPS daemon for {d.device} is {'running' if daemon else 'absent'}, "
                f"expected {'running' if exp.mpsDaemon else 'absent'}"
            )
        if exp.mps is not None:
            failures += _check_mps_limits(exp, claim_name, device_uuids(state, d, slice_dev), observed, where)
        if exp.migInstances is not None and placement is not None:
            inst = now.get(str(uuid), {}).get(placement)
            if inst is None:
                failures.append(f"{where}: no MIG instance {placement} on GPU {uuid} for {d.device}")
            elif placement in before.get(str(uuid), {}):
                failures.append(
                    f"{where}: MIG instance for {d.device} existed before the claim (not created)"
                )
            else:
                created.append(inst)
    if exp.migInstances is not None and Counter(created) != Counter(exp.migInstances):
        failures.append(
            f"{where}: MIG instances created {sorted(created)}, expected {sorted(exp.migInstances)}"
        )
    return failures


def mps_limit_bytes(text: str) -> int:
    """An MPS pinned-memory limit as `nvidia-cuda-mps-control` takes it: `<N>M` (MiB) or `<N>G` (GiB)."""
    match = re.fullmatch(r"(\d+)([MG])", text.strip())
    if match is None:
        raise ValueError(f"MPS pinned memory limit {text!r} is not <N>M or <N>G")
    return int(match.group(1)) * (2**20 if match.group(2) == "M" else 2**30)


def claim_containers(claim_name: str, observed: Observed) -> list[str]:
    """ "<pod>/<container>" of every container of a Running pod that gets the claim (lists it, or one of its
    requests, in resources.claims; or gets it as the pod's extended-resource claim)."""
    out: list[str] = []
    for pod in observed.pods:
        if phase(pod) != "Running":
            continue
        by_pod_claim = {k for k, v in pod_claim_names(pod).items() if v == claim_name}
        ext = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
        ext_containers = (
            {m.get("containerName") for m in ext.get("requestMappings") or []}
            if ext.get("resourceClaimName") == claim_name
            else set()
        )
        for ctr in pod["spec"].get("containers", []):
            refs = {r.get("name") for r in (ctr.get("resources") or {}).get("claims") or []}
            if refs & by_pod_claim or ctr["name"] in ext_containers:
                out.append(f"{pod['metadata']['name']}/{ctr['name']}")
    return out


def _check_mps_limits(
    exp: HardwareExpectation, claim_name: str, uuids: set[str], observed: Observed, where: str
) -> list[str]:
    """What each workload of the claim gets from MPS, asked from inside its container (the simulated CUDA
    client in the container's view): a server of this claim's device, with this claim's limits. Not the
    daemon's records: the shares of a GPU are clients of one server whose caps are the largest share's, and
    what a container reaches depends on its own mount and env, which no record shows."""
    assert exp.mps is not None
    containers = claim_containers(claim_name, observed)
    if not containers:
        return [f"{where}: MPS limits expected but no running container gets the claim"]
    want_pct = exp.mps.activeThreadPercentage
    want_pinned = (
        None if exp.mps.pinnedMemoryLimit is None else int(_quantity(exp.mps.pinnedMemoryLimit, where))
    )
    failures: list[str] = []
    for key in containers:
        report = observed.clients.get(key)
        if report is None:
            failures.append(f"{where}: no CUDA client has asked MPS from inside {key} yet")
            continue
        if report.error is not None:
            failures.append(f"{where}: a CUDA client in {key} got no answer from MPS: {report.error}")
            continue
        if not report.mps:
            failures.append(f"{where}: a CUDA client in {key} runs without MPS (no daemon behind its pipe)")
            continue
        if not uuids & set(report.gpus):
            failures.append(
                f"{where}: the MPS server that {key} reaches serves {list(report.gpus)}, not the claim's "
                f"device {sorted(uuids)} (its pipe leads to another claim's daemon)"
            )
        if want_pct is not None and report.active_thread_percentage != want_pct:
            failures.append(
                f"{where}: a CUDA client in {key} gets MPS active thread percentage "
                f"{report.active_thread_percentage}, expected {want_pct}"
            )
        if want_pinned is not None:
            limits = {u: v for u, v in report.pinned_limits.items() if not uuids or u in uuids} or dict(
                report.pinned_limits
            )
            if not limits or any(v is None or mps_limit_bytes(v) != want_pinned for v in limits.values()):
                failures.append(
                    f"{where}: a CUDA client in {key} gets MPS pinned memory limits {limits}, expected "
                    f"{exp.mps.pinnedMemoryLimit}"
                )
    return failures


def mps_client_containers(exp: Expectation, observed: Observed) -> list[str]:
    """The containers whose view of MPS the expectations need (the runner asks only these)."""
    out: list[str] = []
    for cexp in exp.claims:
        if cexp.hardware is None or cexp.hardware.mps is None:
            continue
        for claim in resolve_claims(cexp.ref, observed)[1]:
            out += [k for k in claim_containers(claim["metadata"]["name"], observed) if k not in out]
    return out


# ------------------------------------------------------------------------------------------- footprint
def claim_gpus(claim: Mapping[str, Any], slice_devices: SliceDevices) -> frozenset[str]:
    """The physical GPUs (uuids) the claim's devices of our driver are on."""
    found = {
        device_gpu_uuid(slice_devices.get((d.pool, d.device))) for d in allocated_devices(claim) if d.is_ours
    }
    return frozenset(u for u in found if u)


def check_footprint(exp: Expectation, observed: Observed) -> list[str]:
    """The example's claims are on exactly `footprint.gpus` distinct GPUs (counting what claims held in
    earlier snapshots too). Fewer is a failure only when nothing is unseen: a claim that a Running or
    Succeeded pod names but that was never seen allocated (a Job's, deleted once its pod ended) may have held
    the rest."""
    held: dict[str, frozenset[str]] = dict(observed.held_gpus)
    for claim in observed.claims:
        now = claim_gpus(claim, observed.slice_devices)
        if now:
            held[claim["metadata"]["name"]] = held.get(claim["metadata"]["name"], frozenset()) | now
    gpus = frozenset().union(*held.values()) if held else frozenset()
    want = exp.footprint.gpus
    by_claim = ", ".join(f"{n}: {len(g)}" for n, g in sorted(held.items()))
    if len(gpus) > want:
        return [f"footprint: the claims hold {len(gpus)} distinct GPUs ({by_claim}), expected {want}"]
    if len(gpus) < want:
        unseen = sorted(
            name
            for pod in observed.pods
            if phase(pod) in ("Running", "Succeeded")
            for name in pod_claim_names(pod).values()
            if name not in held
        )
        if not unseen:
            held_text = by_claim or "none"
            return [f"footprint: the claims hold {len(gpus)} distinct GPUs ({held_text}), expected {want}"]
    return []


# -------------------------------------------------------------------------------------- device groups
def container_device_set(ref: str, observed: Observed) -> set[tuple[str, str]] | None:
    pod_name, container = ref.split("/", 1)
    pod = next((p for p in observed.pods if p["metadata"]["name"] == pod_name), None)
    if pod is None:
        return None
    return {(d.pool, d.device) for d in container_devices(pod, container, observed.claims) if d.is_ours}


def check_groups(exp: Expectation, observed: Observed) -> list[str]:
    failures: list[str] = []
    for group in exp.sameDevices:
        sets = {ref: container_device_set(ref, observed) for ref in group}
        if any(s is None for s in sets.values()):
            failures.append(f"sameDevices {group}: pod(s) missing")
        elif len({frozenset(s or ()) for s in sets.values()}) != 1 or not any(sets.values()):
            failures.append(f"sameDevices {group}: devices differ or are empty: {_fmt_sets(sets)}")
    for group in exp.distinctDevices:
        sets = {ref: container_device_set(ref, observed) for ref in group}
        if any(s is None for s in sets.values()):
            failures.append(f"distinctDevices {group}: pod(s) missing")
            continue
        seen: dict[tuple[str, str], str] = {}
        for ref, devs in sets.items():
            for dev in devs or ():
                if dev in seen:
                    failures.append(f"distinctDevices: {dev[1]} is used by both {seen[dev]} and {ref}")
                seen[dev] = ref
    return failures


def _fmt_sets(sets: Mapping[str, set[tuple[str, str]] | None]) -> str:
    return ", ".join(f"{ref}={sorted(d for _, d in s or ())}" for ref, s in sets.items())


def check_all(exp: Expectation, observed: Observed) -> list[str]:
    failures: list[str] = []
    for pexp in exp.pods:
        failures += check_pod_expectation(pexp, observed)
    for cexp in exp.claims:
        failures += check_claim_expectation(cexp, observed)
    return failures + check_groups(exp, observed) + check_footprint(exp, observed)


# ------------------------------------------------------------------------------------------- cleanup
def check_hardware_reset(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """After deletion: default compute mode and time slice, no MPS daemon, MIG instances as before."""
    failures: list[str] = []
    mig_before = mig_instances_by_gpu(before)
    mig_after = mig_instances_by_gpu(after)
    for gpu in after.get("gpus", []):
        uuid = str(gpu.get("uuid"))
        if int(gpu.get("compute_mode", 0)) != 0:
            failures.append(
                f"GPU {uuid}: compute mode {COMPUTE_MODE_NAMES.get(gpu['compute_mode'])} left behind"
            )
        if int(gpu.get("timeslice", 0)) != 0:
            failures.append(f"GPU {uuid}: time slice {gpu['timeslice']} left behind")
        extra = set(mig_after.get(uuid, {})) - set(mig_before.get(uuid, {}))
        if extra:
            failures.append(f"GPU {uuid}: MIG instances {sorted(extra)} (giProfileId, start) left behind")
    for daemon in running_mps_daemons(after):
        failures.append(f"an MPS daemon still runs: {dict(daemon)}")
    return failures


def leftover_cdi_specs(spec_names: Iterable[str], claim_uids: Iterable[str]) -> list[str]:
    """CDI spec files whose name carries one of the (deleted) claims' UIDs."""
    uids = [u for u in claim_uids if u]
    return sorted(n for n in spec_names if any(u in n for u in uids))


def row_devices(claims: Iterable[Mapping[str, Any]]) -> str:
    names = sorted({d.device for c in claims for d in allocated_devices(c) if d.is_ours})
    return ", ".join(names) if names else "-"


def row_pods(pods: Iterable[Mapping[str, Any]]) -> str:
    counts = Counter(phase(p) for p in pods)
    total = sum(counts.values())
    return (
        f"{total} pod(s): " + ", ".join(f"{n} {ph}" for ph, n in sorted(counts.items()))
        if total
        else "0 pods"
    )
