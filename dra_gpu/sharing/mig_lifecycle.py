"""On-demand MIG: create the MIG device an allocation names at prepare, destroy it at unprepare.

A MIG_DYNAMIC device is a (profile, placement) pair that does not exist until a claim gets it. Creation goes
through `GpuHardware.create_mig_device`, which switches MIG mode on where the GPU can do that without a reset
(Hopper and newer). Ampere GPUs need a reset to change MIG mode, so MIG mode is never toggled on them (as in
NVIDIA's driver): with MIG disabled the claim gets an error that says how to enable it. MIG mode that this
driver switched on is switched off again when its last MIG device is gone.

Ownership: every instance created here is recorded in the registry (parent, gi id, ci id and its MIG uuid)
until it is destroyed, so start-up cleanup (`destroy_unowned`) removes exactly the instances this driver
created for claims that are no longer checkpointed, and never the MIG devices an administrator made, even one
that reuses the ids of an instance of ours destroyed out of band (its uuid differs).

A GPU that fell off the bus cannot destroy anything: `destroy(..., defer_if_gone=True)` then records the
instance in `pendingMigDestroy` and returns, so the unprepare finishes; `retry_pending` (the plugin's
reconcile loop) destroys it, by uuid, once the GPU answers (after a reset it is usually gone already).

NVML refuses to change a GPU that processes still use (NVML_ERROR_IN_USE, nvml.h): MIG mode switches only on
an idle GPU (nvmlDeviceSetMigMode's activation status), and a GPU or compute instance with processes on it is
not destroyed. A claim whose on-demand MIG device needs MIG mode switched on a busy GPU gets an error naming
the GPU, the processes and the fix, and nothing is left behind (the pending mode is put back). An instance
that cannot be destroyed because processes still run on it (a container not quite gone) joins
`pendingMigDestroy` like one on a lost GPU: the unprepare finishes, `retry_pending` destroys it once the
processes are gone, and it is reported meanwhile (`pending`, and a create that wants its placement says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from dra_gpu.hardware.interface import GpuHardware, HardwareError
from dra_gpu.hardware.types import GpuInfo, MigInstance, MigPlacement
from dra_gpu.sharing.interface import AllocatedDevice, SharingError
from dra_gpu.sharing.registry import Registry

log = structlog.get_logger(__name__)

NVML_ERROR_IN_USE = 19  # nvml.h: "An operation cannot be performed because the GPU is currently in use"


def _busy(err: HardwareError) -> bool:
    return err.nvml_code == NVML_ERROR_IN_USE


def instance_json(device_name: str, instance: MigInstance) -> dict[str, Any]:
    return {
        "device": device_name,
        "parentUuid": instance.parent_uuid,
        "parentMinor": instance.parent_minor,
        "uuid": instance.uuid,
        "profile": instance.profile,
        "giProfileId": instance.gi_profile_id,
        "giId": instance.gi_id,
        "ciId": instance.ci_id,
        "placementStart": instance.placement.start,
        "placementSize": instance.placement.size,
    }


def instance_from_json(data: Mapping[str, Any]) -> MigInstance:
    return MigInstance(
        parent_uuid=data["parentUuid"],
        parent_minor=data["parentMinor"],
        uuid=data["uuid"],
        profile=data["profile"],
        gi_profile_id=data["giProfileId"],
        gi_id=data["giId"],
        ci_id=data["ciId"],
        placement=MigPlacement(data["placementStart"], data["placementSize"]),
    )


def _overlaps(a: MigPlacement, b: MigPlacement) -> bool:
    return a.start < b.start + b.size and b.start < a.start + a.size


class MigLifecycle:
    def __init__(self, hardware: GpuHardware, registry: Registry) -> None:
        self._hardware = hardware
        self._registry = registry

    def create(self, device: AllocatedDevice, gpu: GpuInfo) -> MigInstance:
        """Create the MIG device `device` stands for on `gpu` (fresh discovery); raise SharingError."""
        spec = device.device.mig
        name = device.device.name
        if spec is None:
            raise SharingError(f"device {name} is not a MIG device (no profile/placement)")
        placement = MigPlacement(spec.placement_start, spec.placement_size)
        at = f"{placement.start}:{placement.size}"
        where = f"MIG device {name} ({spec.profile} at placement {at}) on GPU {gpu.uuid}"
        if not gpu.mig_capable:
            raise SharingError(f"{where}: GPU {gpu.uuid} ({gpu.product_name}) is not MIG-capable")
        if not gpu.mig_enabled and not gpu.mig_toggle_without_reset:
            raise SharingError(
                f"{where}: MIG mode is disabled and this {gpu.architecture} GPU needs a reset to enable it; "
                "the driver never resets GPUs: enable MIG mode out of band "
                f"(nvidia-smi -i {gpu.uuid} -mig 1, then a GPU reset) to use on-demand MIG devices"
            )
        if gpu.mig_enabled:
            waiting = {p.uuid for p in self.pending()}
            for existing in self._hardware.list_mig_devices(gpu.uuid):
                if _overlaps(existing.placement, placement) and existing.uuid in waiting:
                    raise SharingError(
                        f"{where}: placement {at} is still held by MIG device {existing.uuid}, which an "
                        "earlier claim released but which could not be destroyed yet (processes still run on "
                        "it, or its GPU was gone); it is destroyed as soon as NVML allows, retry then"
                    )
                if _overlaps(existing.placement, placement):
                    raise SharingError(
                        f"{where}: placement {at} is already taken by MIG device "
                        f"{existing.uuid} ({existing.profile} at {existing.placement.start}:"
                        f"{existing.placement.size}); a device that overlaps it was probably created outside "
                        "this driver"
                    )
        # The intent first: killed after NVML made the instance (or only its GPU instance, the first of two
        # calls) and before `createdMig` names it, start-up finds it by this (destroy_unowned); without it the
        # instance leaked and its placement stayed taken for every later claim (found by the soak).
        intent = [gpu.uuid, spec.gi_profile_id, spec.placement_start, gpu.mig_enabled]
        with self._registry.update() as data:
            data["creatingMig"].append(intent)
        try:
            instance = self._hardware.create_mig_device(gpu.uuid, spec.gi_profile_id, spec.placement_start)
        except HardwareError as err:
            self._drop_intent(intent)
            if not gpu.mig_enabled:
                self._undo_mig_mode(gpu.uuid)
            if _busy(err) and not gpu.mig_enabled:
                raise SharingError(
                    f"{where}: MIG mode must be switched on for it, and GPU {gpu.uuid} is not idle: {err}. "
                    "Stop the processes using the GPU (or enable MIG mode out of band while it is idle: "
                    f"nvidia-smi -i {gpu.uuid} -mig 1) and the claim's next prepare will create it"
                ) from None
            raise SharingError(f"{where}: creating it failed: {err}") from None
        try:
            created = [instance.parent_uuid, instance.gi_id, instance.ci_id, instance.uuid]
            with self._registry.update() as data:
                data["createdMig"].append(created)
                if not gpu.mig_enabled and gpu.uuid not in data["migModeEnabled"]:
                    data["migModeEnabled"].append(gpu.uuid)
                data["creatingMig"] = [i for i in data["creatingMig"] if i != intent]
        except OSError as err:  # e.g. a full disk: an instance no record names must not stay
            try:
                self._hardware.destroy_mig_device(instance.parent_uuid, instance.gi_id, instance.ci_id)
                if not gpu.mig_enabled:
                    self._undo_mig_mode(gpu.uuid)
            except HardwareError as undo:
                log.error("cannot destroy a MIG device just made", uuid=instance.uuid, error=str(undo))
            raise SharingError(f"{where}: recording it in {self._registry.path} failed: {err}") from None
        log.info("MIG device created", device=name, uuid=instance.uuid, gi=instance.gi_id, ci=instance.ci_id)
        return instance

    def destroy(
        self, instance: MigInstance, *, defer_if_gone: bool = False, defer_if_busy: bool | None = None
    ) -> None:
        """Destroy one instance we created (already gone is fine); then maybe switch MIG mode off. Raises.

        `defer_if_gone`: a lost GPU records the instance for `retry_pending` instead of raising;
        `defer_if_busy` (by default the same): so do processes still running on it (NVML_ERROR_IN_USE).

        The instance is identified by its MIG uuid, not by its GPU-instance/compute-instance ids: an
        unprepare replayed after a crash (or after the device was destroyed out of band) may find those ids
        reused by a MIG device another claim got since, and must leave that one alone.
        """
        try:
            current = next(
                (i for i in self._hardware.list_mig_devices(instance.parent_uuid) if i.uuid == instance.uuid),
                None,
            )
            if current is None:
                reused = any(
                    (i.gi_id, i.ci_id) == (instance.gi_id, instance.ci_id)
                    for i in self._hardware.list_mig_devices(instance.parent_uuid)
                )
                if not reused and self._left_empty(instance):
                    # Killed between destroying the compute instance and its GPU instance (two NVML calls):
                    # the empty GPU instance still holds its memory slices and placement. Finish the job
                    # (found by the soak, tests/soak).
                    log.info("destroying the empty GPU instance of a MIG device", uuid=instance.uuid)
                    self._hardware.destroy_mig_device(instance.parent_uuid, instance.gi_id, instance.ci_id)
                else:
                    log.info(
                        "MIG device already gone"
                        + ("; its ids now belong to another device, left alone" if reused else ""),
                        uuid=instance.uuid,
                        gi=instance.gi_id,
                        ci=instance.ci_id,
                    )
            else:
                self._hardware.destroy_mig_device(current.parent_uuid, current.gi_id, current.ci_id)
        except HardwareError as err:
            busy_deferred = (defer_if_gone if defer_if_busy is None else defer_if_busy) and _busy(err)
            if (defer_if_gone and err.gpu_gone) or busy_deferred:
                if busy_deferred:
                    log.warning(
                        "MIG device still in use; destroyed once its processes are gone",
                        uuid=instance.uuid,
                        error=str(err),
                    )
                else:
                    log.warning(
                        "GPU is gone; its MIG device is destroyed when it returns", uuid=instance.uuid
                    )
                with self._registry.update() as data:
                    if all(p["uuid"] != instance.uuid for p in data["pendingMigDestroy"]):
                        data["pendingMigDestroy"].append(instance_json("", instance))
                return
            raise SharingError(
                f"destroying MIG device {instance.uuid} (GPU {instance.parent_uuid} gi={instance.gi_id} "
                f"ci={instance.ci_id}) failed: {err}"
            ) from None
        self._forget(instance.parent_uuid, instance.gi_id, instance.ci_id, instance.uuid)
        log.info("MIG device destroyed", uuid=instance.uuid, gi=instance.gi_id, ci=instance.ci_id)
        self.maybe_disable_mig_mode(instance.parent_uuid)

    def _left_empty(self, instance: MigInstance) -> bool:
        """Whether the GPU instance of `instance` (same id, profile and placement) is there without any
        compute instance."""
        for gpu in self._hardware.discover().gpus:
            if gpu.uuid == instance.parent_uuid:
                ours = (instance.gi_id, instance.gi_profile_id, instance.placement.start)
                return any(
                    (e.gi_id, e.gi_profile_id, e.placement.start) == ours for e in gpu.mig_empty_gpu_instances
                )
        return False

    def pending(self) -> list[MigInstance]:
        """Instances whose destruction waits for their GPU to come back."""
        return [instance_from_json(d) for d in self._registry.read()["pendingMigDestroy"]]

    def retry_pending(self) -> list[str]:
        """Destroy the deferred instances whose GPU answers again. Returns their uuids."""
        done: list[str] = []
        for instance in self.pending():
            try:
                self.destroy(instance)
            except SharingError as err:
                log.debug("GPU not back; MIG device destroyed later", uuid=instance.uuid, error=str(err))
                continue
            with self._registry.update() as data:
                pending = data["pendingMigDestroy"]
                data["pendingMigDestroy"] = [p for p in pending if p["uuid"] != instance.uuid]
            done.append(instance.uuid)
        return done

    def _drop_intent(self, intent: list[Any]) -> None:
        with self._registry.update() as data:
            data["creatingMig"] = [i for i in data["creatingMig"] if i != intent]

    def _adopt_interrupted(
        self, owned: set[tuple[str, int, int]], gpus: Sequence[GpuInfo]
    ) -> list[tuple[str, int]]:
        """At start-up: an instance at the placement of a creation that was under way (its intent left in
        the registry), which neither `createdMig` nor a checkpointed claim names, was made by us just before a
        crash: record it as created (so `destroy_unowned` destroys it). MIG mode that was off at the intent
        and is on now was switched on by that creation (even when the kill came before any GPU instance was
        made): recorded as ours, so it is switched off again once no MIG device is left. Then the intents are
        done with.

        Returns (parent uuid, gi id) of the GPU instances left empty at an intent's placement: NVML makes a
        MIG device in two calls (GPU instance, then compute instance), and a kill between them leaves a GPU
        instance with no compute instance, hence no MIG device uuid to record; it still holds its memory
        slices and placement, so the caller destroys it (found by the soak, SOAK_SEED=31)."""
        empty: list[tuple[str, int]] = []
        with self._registry.update() as data:
            intents = list(data["creatingMig"])
            known = {tuple(k[:3]) for k in data["createdMig"]} | owned
            known_gis = {k[:2] for k in known}
            for parent, profile_id, start, mig_was_on in intents:
                for gpu in gpus:
                    if gpu.uuid != parent:
                        continue
                    for i in gpu.mig_instances:
                        key = (i.parent_uuid, i.gi_id, i.ci_id)
                        if (i.gi_profile_id, i.placement.start) == (profile_id, start) and key not in known:
                            log.warning("MIG device made just before a crash; destroying it", uuid=i.uuid)
                            data["createdMig"].append([*key, i.uuid])
                    for e in gpu.mig_empty_gpu_instances:
                        gi_key = (parent, e.gi_id)
                        at_intent = (e.gi_profile_id, e.placement.start) == (profile_id, start)
                        if at_intent and gi_key not in known_gis:
                            log.warning(
                                "GPU instance left empty by a crash while creating; destroying it",
                                gpu=parent,
                                gi=e.gi_id,
                            )
                            empty.append(gi_key)
                    if not mig_was_on and gpu.mig_enabled and parent not in data["migModeEnabled"]:
                        data["migModeEnabled"].append(parent)
            data["creatingMig"] = []
        return empty

    def _forget(self, parent: str, gi_id: int, ci_id: int, uuid: str | None = None) -> None:
        """Drop an instance from the registry (entries written before the uuid was recorded have 3 fields).
        With `uuid`, an entry that records another uuid under the same ids (a later instance) is kept."""

        def same(k: list[Any]) -> bool:
            return list(k[:3]) == [parent, gi_id, ci_id] and (uuid is None or len(k) < 4 or k[3] == uuid)

        with self._registry.update() as data:
            data["createdMig"] = [k for k in data["createdMig"] if not same(k)]

    def _undo_mig_mode(self, gpu_uuid: str) -> None:
        """Creation failed after the hardware switched MIG mode on: switch it off again if still empty."""
        try:
            if not self._hardware.list_mig_devices(gpu_uuid):
                self._hardware.set_mig_mode(gpu_uuid, False)
        except HardwareError as err:
            log.warning("cannot switch MIG mode off after a failed creation", gpu=gpu_uuid, error=str(err))

    def maybe_disable_mig_mode(self, gpu_uuid: str) -> None:
        """Switch MIG mode off on a GPU where we switched it on, once no MIG device is left on it."""
        with self._registry.update() as data:
            if gpu_uuid not in data["migModeEnabled"]:
                return
        try:
            if self._hardware.list_mig_devices(gpu_uuid):
                return
            self._hardware.set_mig_mode(gpu_uuid, False)
        except HardwareError as err:
            log.warning("cannot switch MIG mode off again", gpu=gpu_uuid, error=str(err))
            return
        with self._registry.update() as data:
            data["migModeEnabled"] = [u for u in data["migModeEnabled"] if u != gpu_uuid]
        log.info("MIG mode disabled again", gpu=gpu_uuid)

    def destroy_unowned(self, owned: set[tuple[str, int, int]], gpus: Sequence[GpuInfo]) -> list[str]:
        """Destroy the instances we created that no checkpointed claim owns. Returns what was destroyed."""
        left_empty = self._adopt_interrupted(owned, gpus)
        with self._registry.update() as data:
            created = [tuple(k) for k in data["createdMig"]]
        by_key = {(i.parent_uuid, i.gi_id, i.ci_id): i for g in gpus for i in g.mig_instances}
        empty = {(g.uuid, e.gi_id) for g in gpus for e in g.mig_empty_gpu_instances}
        destroyed: list[str] = []
        for parent, gi_id in left_empty:
            try:  # no compute instance: any ci id finds none, and the GPU instance goes
                self._hardware.destroy_mig_device(parent, gi_id, 0)
            except HardwareError as err:
                log.error("cannot destroy an empty GPU instance", gpu=parent, gi=gi_id, error=str(err))
                continue
            destroyed.append(f"empty GPU instance (GPU {parent} gi={gi_id})")
        for key in created:
            parent, gi_id, ci_id = str(key[0]), int(key[1]), int(key[2])
            if (parent, gi_id, ci_id) in owned:
                continue
            instance = by_key.get((parent, gi_id, ci_id))
            if instance is not None and len(key) > 3 and instance.uuid != key[3]:
                log.warning(
                    "MIG device with the ids of one we created is someone else's; leaving it",
                    uuid=instance.uuid,
                    ours=key[3],
                    gpu=parent,
                    gi=gi_id,
                    ci=ci_id,
                )
                instance = None
            label = f"{instance.uuid if instance else 'MIG device'} (GPU {parent} gi={gi_id} ci={ci_id})"
            try:
                if instance is not None:
                    self.destroy(instance, defer_if_busy=True)
                else:  # ours is already gone: forget it
                    if (parent, gi_id) in empty:  # its compute instance was, its GPU instance not (a crash)
                        self._hardware.destroy_mig_device(parent, gi_id, ci_id)
                        destroyed.append(f"empty GPU instance (GPU {parent} gi={gi_id})")
                    self._forget(parent, gi_id, ci_id)
                    continue
            except (SharingError, HardwareError) as err:
                log.error("cannot destroy unowned MIG device", device=label, error=str(err))
                continue
            if any(p.uuid == instance.uuid for p in self.pending()):
                continue  # still in use: retry_pending destroys it later
            destroyed.append(label)
        with self._registry.update() as data:
            enabled = list(data["migModeEnabled"])
        for uuid in enabled:
            self.maybe_disable_mig_mode(uuid)
        return destroyed
