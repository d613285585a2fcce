"""Whether two allocated devices would use the same hardware (pure).

The plugin is the last line of defence against double use (a scheduler race, a force-deleted pod whose claim
is still prepared). Two devices conflict when they share hardware: the same exclusive device, a whole GPU and
anything on it, a GPU share and a MIG device of the same GPU, or two MIG devices whose memory slices overlap.
Shares of one GPU (`allowMultipleAllocations`) do not conflict with each other; admin access never conflicts.
"""

from __future__ import annotations

from dra_gpu.inventory.model import Device, DeviceKind

_MIG_KINDS = (DeviceKind.MIG_STATIC, DeviceKind.MIG_DYNAMIC)


def devices_conflict(a: Device, b: Device) -> bool:
    if a.name == b.name:
        return not (a.allow_multiple_allocations and b.allow_multiple_allocations)
    if a.parent_uuid != b.parent_uuid:
        return False
    if DeviceKind.GPU in (a.kind, b.kind):
        return True
    if a.kind in _MIG_KINDS and b.kind in _MIG_KINDS:
        if a.mig is None or b.mig is None:
            return False
        a_slices = range(a.mig.placement_start, a.mig.placement_start + a.mig.placement_size)
        b_slices = range(b.mig.placement_start, b.mig.placement_start + b.mig.placement_size)
        return bool(set(a_slices) & set(b_slices))
    # a GPU share and a MIG device of the same GPU: the share consumes the whole GPU
    return (a.kind == DeviceKind.GPU_SHARE) != (b.kind == DeviceKind.GPU_SHARE)
