"""Switch the kubelet plugin to another `--consumable-shares` mode and wait until every whole GPU of the node
is published accordingly: the host-process plugin is restarted with env CONSUMABLE_SHARES; on kind the
chart's release is upgraded with `--set consumableShares=<mode>` (the DaemonSet rolls its pods). One plugin
serves one mode, so the tests of NVIDIA's consumable-shares examples switch modes around each example and
switch back afterwards.

Also what NVIDIA's examples should give when scaled past the node's GPU count (how many claims each GPU
holds), and what they gave, for e2e/test_consumable_shares.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_gpu.cel.quantity import parse_quantity_strict
from e2e.lib.claims import allocated_devices
from e2e.lib.driver import HostDriver
from e2e.lib.incluster import InClusterDriver
from e2e.lib.waiting import wait_until


def slices_follow(driver: HostDriver | InClusterDriver, shared: bool) -> bool:
    """Every whole GPU of the node published as --consumable-shares says (the slices are updated one by one,
    so one GPU alone could be ahead of the others)."""
    gpus = [
        d
        for s in driver.slices()
        for d in s["spec"].get("devices") or []
        if d.get("attributes", {}).get("type", {}).get("string") == "gpu"
    ]
    return bool(gpus) and all(bool(d.get("allowMultipleAllocations")) == shared for d in gpus)


def restart_with_shares(driver: HostDriver | InClusterDriver, shares: str) -> None:
    """`shares`: disabled, memory, unlimited or a positive integer (NVIDIA's values)."""
    if isinstance(driver, InClusterDriver):
        # The chart's value: empty is the chart's default (one claim per device).
        driver.upgrade_chart({"consumableShares": "" if shares == "disabled" else shares})
    else:
        driver.stop_plugin()
        driver.start_plugin(env={"CONSUMABLE_SHARES": shares})
        driver.wait_plugin_ready()
    wait_until(
        lambda: slices_follow(driver, shares != "disabled") or None,
        timeout_s=90,
        what=f"the slices to follow --consumable-shares={shares}",
        explain=driver.log_tail,
    )


class SharesSwitch:
    """The plugin's consumable-shares mode for a run of tests: switched only when a test needs another mode,
    back to none at `reset()` (a module fixture's teardown). Each switch restarts the host plugin or rolls the
    chart's DaemonSet on every node, so consecutive tests in modes other than none do not go back in between.
    """

    def __init__(self, driver: HostDriver | InClusterDriver) -> None:
        self.driver = driver
        self.current = "disabled"

    def set(self, shares: str) -> None:
        if shares != self.current:
            self.current = "unknown"  # a failed switch leaves the mode unknown: reset() switches back
            restart_with_shares(self.driver, shares)
            self.current = shares

    def reset(self) -> None:
        self.set("disabled")


# ------------------------------------------------------------------------- packing (pure, unit-tested)

# NVIDIA's examples (tests/conformance/nvidia/consumable-shares-<mode>) and the plugin value each needs.
NVIDIA_FLAG = {"integer": "4", "unlimited": "unlimited", "memory": "memory"}
MIB = 1024 * 1024


def whole_gpus(slices: Iterable[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """("pool/device", device) of every whole GPU (type `gpu`) in the order the scheduler tries them: slices
    by name, devices in list order."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    for item in sorted(slices, key=lambda s: str(s["metadata"]["name"])):
        pool = item["spec"]["pool"]["name"]
        for dev in item["spec"].get("devices") or []:
            if ((dev.get("attributes") or {}).get("type") or {}).get("string") == "gpu":
                out.append((f"{pool}/{dev['name']}", dev))
    return out


def scaled_replicas(gpus: int) -> int:
    """Replicas past the node's GPU count (12 on a DGX H100): with one claim per GPU, 4 would stay pending."""
    return gpus + 4


def template_requests(docs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """`capacity.requests` of the (one) ResourceClaimTemplate's (one) request in an example's manifests."""
    (template,) = [d for d in docs if d.get("kind") == "ResourceClaimTemplate"]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    requests = ((request.get("exactly") or {}).get("capacity") or {}).get("requests") or {}
    return {str(k): str(v) for k, v in requests.items()}


def claims_per_gpu_limit(mode: str, gpu: Mapping[str, Any], requests: Mapping[str, str]) -> int | None:
    """How many claims asking for `requests` one published whole GPU holds in NVIDIA's `mode` (integer,
    unlimited or memory, as consumable_shares_modes names them); None: no limit. Written from NVIDIA's README
    (its demo/specs/consumable-shares), not from the allocator: N claims per GPU (each takes one share unless
    it asks for more), any number without a memory request in unlimited mode, the whole GPU without one in
    memory mode, else as many as the GPU's memory holds (requests rounded up to whole MiB)."""
    capacity = gpu.get("capacity") or {}
    limits: list[int] = []
    if mode == "integer":
        total = int(parse_quantity_strict(str(capacity["shares"]["value"])))
        limits.append(total // int(parse_quantity_strict(requests.get("shares", "1"))))
    if "memory" in requests:
        memory = int(parse_quantity_strict(str(capacity["memory"]["value"])))
        asked = int(parse_quantity_strict(requests["memory"]))
        limits.append(memory // (-(-asked // MIB) * MIB))
    elif mode == "memory":
        limits.append(1)
    return min(limits) if limits else None


def expected_claims_per_gpu(gpus: Sequence[str], limit: int | None, replicas: int) -> dict[str, int]:
    """Claims per GPU once `replicas` identical claims are allocated one after another: the scheduler takes
    the first device that fits (no scoring), so each GPU fills up before the next is used. GPUs that get
    none are left out; replicas beyond `len(gpus) * limit` stay pending."""
    out: dict[str, int] = {}
    left = replicas
    for gpu in gpus:
        if left <= 0:
            break
        out[gpu] = left if limit is None else min(limit, left)
        left -= out[gpu]
    return out


def claims_per_gpu(claims: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Allocated claims per device of our driver ("pool/device"), from the claims' allocation results."""
    counts: Counter[str] = Counter()
    for claim in claims:
        for device in allocated_devices(claim):
            if device.is_ours:
                counts[f"{device.pool}/{device.device}"] += 1
    return dict(counts)
