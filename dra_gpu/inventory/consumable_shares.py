"""NVIDIA's consumable-shares model: the `gpu` and `mig` devices themselves shared by several claims (pure).

`--consumable-shares` (env `CONSUMABLE_SHARES`, chart value `consumableShares`) picks one mode, as in NVIDIA's
driver (kubernetes-sigs/dra-driver-nvidia-gpu, `cmd/gpu-kubelet-plugin/consumable_shares.go`):
- `disabled` (the default): devices as before, one claim each.
- `unlimited`: `allowMultipleAllocations: true`; capacity `memory` (rounded down to whole MiB) gets the
  request policy default 0, range 0..memory, step 1Mi. A claim that asks for no memory consumes none, so any
  number of claims fit on one device.
- `memory`: the same, but default = the whole memory and min 1Mi: a claim without `capacity.requests.memory`
  takes the device whole, `memory: 4Gi` takes 4Gi of it.
- a positive integer N: `memory` as in `unlimited`, plus a capacity `shares` = N with default 1, range 1..N,
  step 1: at most N claims per device (each takes one share unless it asks for more).

Which devices: whole GPUs (`gpu-<minor>`) and MIG devices that exist (kind MIG_STATIC), as NVIDIA does for its
full GPUs and static MIG devices. MIG placements created at prepare (kind MIG_DYNAMIC) stay one claim each:
NVIDIA shares those only under its alpha DynamicMIG gate, and here a shared placement would need its MIG
instance created by the first claim and destroyed by the last, which prepare does not do. Our own
`gpu-<minor>-shared` devices (kind GPU_SHARE) keep their own policies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dra_gpu.inventory.model import Capacity, Device, DeviceKind, RequestPolicy

FLAG = "--consumable-shares"
ENV = "CONSUMABLE_SHARES"
MODES = ("disabled", "memory", "unlimited")
MIB = 1024 * 1024
SHARES_CAPACITY = "shares"
MEMORY_CAPACITY = "memory"
SHAREABLE_KINDS = (DeviceKind.GPU, DeviceKind.MIG_STATIC)


@dataclass(frozen=True)
class ConsumableShares:
    """A parsed `--consumable-shares`: `mode` is disabled|memory|unlimited|count; `count` N for the last."""

    mode: str = "disabled"
    count: int = 0

    @property
    def enabled(self) -> bool:
        return self.mode != "disabled"

    def __str__(self) -> str:
        return str(self.count) if self.mode == "count" else self.mode


DISABLED = ConsumableShares()


def parse_consumable_shares(text: str | None) -> ConsumableShares:
    """`disabled` (also empty), `memory`, `unlimited` or a positive integer; ValueError names the flag."""
    value = (text or "").strip()
    if value in ("", "disabled"):
        return DISABLED
    if value in MODES:
        return ConsumableShares(mode=value)
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count <= 0 or not value.isdigit():
        raise ValueError(
            f"{FLAG} ({ENV}) {value!r}: must be 'disabled', 'memory', 'unlimited' or a positive integer "
            "(the number of claims that may share one device)"
        )
    return ConsumableShares(mode="count", count=count)


def apply_consumable_shares(device: Device, shares: ConsumableShares) -> Device:
    """`device` as published under `shares`; unchanged when disabled or the kind is not shared."""
    if not shares.enabled or device.kind not in SHAREABLE_KINDS:
        return device
    capacity = dict(device.capacity)
    memory = capacity.get(MEMORY_CAPACITY)
    if memory is not None:
        # The API server requires max and default to be multiples of the step (1Mi).
        top = memory.value - memory.value % MIB
        if shares.mode == "memory":
            policy = RequestPolicy(
                default=top, valid_range_min=MIB, valid_range_max=top, valid_range_step=MIB
            )
        else:
            policy = RequestPolicy(default=0, valid_range_min=0, valid_range_max=top, valid_range_step=MIB)
        capacity[MEMORY_CAPACITY] = Capacity(top, binary_si=memory.binary_si, request_policy=policy)
        if shares.mode == "count":
            capacity[SHARES_CAPACITY] = Capacity(
                shares.count,
                request_policy=RequestPolicy(
                    default=1, valid_range_min=1, valid_range_max=shares.count, valid_range_step=1
                ),
            )
    return replace(device, capacity=capacity, allow_multiple_allocations=True)
