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

Every other capacity of a shared device (`multiprocessors`, and on MIG devices and on whole GPUs with dynamic
MIG `copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`) gets the request policy default 0,
range 0..value. Kubernetes makes every capacity of an `allowMultipleAllocations` device consumable, and one
without a policy is consumed whole by each claim that does not ask for it: without this, the first claim
would take all the copy engines and no second claim would fit, whatever the mode. Those engines and SMs are
not divided between the claims of a device (its processes share them by time-slicing), so a claim consumes
none unless it asks; one that asks books what it asks for, up to the value, and gets no limit from it
(prepare limits a share by its consumed `memory` only, with MPS; see dra_gpu/sharing/plan.py). They stay
published, with their values, so that selectors on them (NVIDIA's
`device.capacity['gpu.nvidia.com'].multiprocessors`) still match: a missing capacity would be a CEL runtime
error that stops the claim's allocation. NVIDIA's full GPU publishes only `memory` without its DynamicMIG
gate; its MIG devices, and its full GPU under DynamicMIG, carry these counts without a policy, so there each
of them holds one claim.

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
    # Not divided between claims: consumed only when asked for (see the module docstring).
    capacity = {
        name: replace(value, request_policy=_unshared_policy(value.value))
        for name, value in device.capacity.items()
    }
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


def _unshared_policy(value: int) -> RequestPolicy:
    """Default 0, any amount up to `value`. No step: the API server wants `min + step <= value`, which a
    capacity of 0 (an engine a MIG profile lacks) could not meet."""
    return RequestPolicy(default=0, valid_range_min=0, valid_range_max=value)
