"""Time-slicing: the GPU-global CUDA time-slice interval, set for claims that ask for it and reset after them.

Applied the way NVIDIA's driver does it (`GpuHardware.set_time_slice`: `nvidia-smi -c DEFAULT`, then
`nvidia-smi compute-policy --set-timeslice N`), on full GPUs only, and only when the config asked for
TimeSlicing: `--set-timeslice` is unsupported on some GPUs (Tesla P4 and older), so an implicit default would
break them. Holders are counted per GPU in the registry (several claims can reach one GPU, e.g. with admin
access), and the interval goes back to Default (0) when the last holder is unprepared, also after a restart.

Crash safety: the holder is recorded before the interval is set (`time-slice-recorded` is the fault-injection
point between the two), so a plugin killed at any point leaves a record of whatever it may have set; at
start-up `release_unowned` drops holders that no checkpointed claim state owns and resets their GPUs.

A GPU that fell off the bus cannot be reset: the last holder's release then records the reset as pending
(registry `pendingTimeSliceResets`) instead of failing, so the kubelet can finish the pod; `retry_pending`
(the plugin's reconcile loop) does it once the GPU answers, unless a new claim has set an interval since.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog

from dra_gpu.config.names import TIME_SLICE_INTERVALS
from dra_gpu.hardware.interface import GpuHardware, HardwareError
from dra_gpu.sharing.interface import SharingError
from dra_gpu.sharing.registry import Registry

log = structlog.get_logger(__name__)

DEFAULT_INTERVAL = 0


def interval_name(value: int) -> str:
    return TIME_SLICE_INTERVALS[value] if 0 <= value < len(TIME_SLICE_INTERVALS) else str(value)


class TimeSlicing:
    def __init__(
        self, hardware: GpuHardware, registry: Registry, faults: Callable[[str], None] | None = None
    ) -> None:
        self._hardware = hardware
        self._registry = registry
        self._faults = faults or (lambda _step: None)

    def acquire(self, claim_uid: str, gpu_uuids: Sequence[str], interval: int) -> list[str]:
        """Set `interval` on every GPU for this claim; all or nothing. Returns the GPUs it holds now."""
        done: list[str] = []
        try:
            for uuid in gpu_uuids:
                self._acquire_one(claim_uid, uuid, interval)
                done.append(uuid)
        except SharingError:
            for uuid in reversed(done):
                for problem in self.release(claim_uid, [uuid]):
                    log.error("time-slice rollback failed", gpu=uuid, error=problem)
            raise
        return done

    def _acquire_one(self, claim_uid: str, uuid: str, interval: int) -> None:
        with self._registry.update() as data:
            entry = data["timeSlice"].get(uuid)
            others = [c for c in (entry or {}).get("claims", []) if c != claim_uid]
            if others and entry is not None:
                if entry["interval"] != interval:
                    raise SharingError(
                        f"GPU {uuid} is time-sliced with interval {interval_name(entry['interval'])} for "
                        f"claim(s) {', '.join(others)}; it cannot be {interval_name(interval)} for this "
                        "claim at the same time (the interval is a whole-GPU setting)"
                    )
                entry["claims"] = [*others, claim_uid]
                return
            # Recorded before it is set: a crash after the set must not leave a setting nobody knows of.
            data["timeSlice"][uuid] = {"interval": interval, "claims": [claim_uid]}
        self._faults("time-slice-recorded")
        try:
            self._hardware.set_time_slice(uuid, interval)
            with self._registry.update() as data:  # this setting replaces a reset still owed from a lost GPU
                data["pendingTimeSliceResets"] = [u for u in data["pendingTimeSliceResets"] if u != uuid]
        except HardwareError as err:
            with self._registry.update() as data:
                entry = data["timeSlice"].get(uuid)
                if entry is not None and entry["claims"] == [claim_uid]:
                    del data["timeSlice"][uuid]
            raise SharingError(
                f"cannot set time-slice interval {interval_name(interval)} on GPU {uuid}: {err} (some GPUs, "
                "such as the Tesla P4, do not support setting it: drop timeSlicingConfig or the TimeSlicing "
                "strategy for this GPU)"
            ) from None
        log.info("time-slice set", gpu=uuid, interval=interval_name(interval), claim_uid=claim_uid)

    def release(self, claim_uid: str, gpu_uuids: Sequence[str]) -> list[str]:
        """Drop this claim's hold; reset to Default where it was the last. Idempotent; returns problems."""
        problems: list[str] = []
        for uuid in gpu_uuids:
            with self._registry.update() as data:
                entry = data["timeSlice"].get(uuid)
                if entry is not None:
                    entry["claims"] = [c for c in entry["claims"] if c != claim_uid]
                    if entry["claims"]:
                        continue  # another claim still relies on the setting
                # No entry at all: the registry was lost; nobody else is known to rely on it, so reset.
            try:
                self._hardware.set_time_slice(uuid, DEFAULT_INTERVAL)
            except HardwareError as err:
                if not err.gpu_gone:
                    problems.append(
                        f"resetting the time-slice interval of GPU {uuid} to Default failed: {err}"
                    )
                    continue
                log.warning("GPU is gone; its time-slice interval is reset when it returns", gpu=uuid)
                with self._registry.update() as data:
                    if uuid not in data["pendingTimeSliceResets"]:
                        data["pendingTimeSliceResets"].append(uuid)
            with self._registry.update() as data:
                entry = data["timeSlice"].get(uuid)
                if entry is not None and not entry["claims"]:
                    del data["timeSlice"][uuid]
            log.info("time-slice released", gpu=uuid, claim_uid=claim_uid)
        return problems

    def pending(self) -> list[str]:
        """GPUs whose reset to Default waits for the GPU to come back."""
        return list(self._registry.read()["pendingTimeSliceResets"])

    def retry_pending(self) -> list[str]:
        """Reset the GPUs that were gone when their last holder left and answer again. Returns those reset."""
        done: list[str] = []
        with self._registry.update() as data:
            for uuid in list(data["pendingTimeSliceResets"]):
                if uuid in data["timeSlice"]:  # a new claim holds the GPU now: its interval stands
                    data["pendingTimeSliceResets"].remove(uuid)
                    continue
                try:
                    self._hardware.set_time_slice(uuid, DEFAULT_INTERVAL)
                except HardwareError as err:
                    log.debug("GPU still not back; time-slice reset later", gpu=uuid, error=str(err))
                    continue
                data["pendingTimeSliceResets"].remove(uuid)
                done.append(uuid)
                log.info("GPU is back; time-slice interval reset to Default", gpu=uuid)
        return done

    def release_unowned(self, owned: set[str]) -> list[str]:
        """At start-up: drop holders no checkpointed claim state owns (a crash between recording a holder and
        checkpointing its claim); a GPU left without holders goes back to Default. Returns the GPUs reset."""
        stale = {
            uuid: [c for c in entry["claims"] if c not in owned]
            for uuid, entry in self._registry.read()["timeSlice"].items()
        }
        reset: list[str] = []
        for uuid, claims in stale.items():
            for claim_uid in claims:
                problems = self.release(claim_uid, [uuid])
                for problem in problems:
                    log.error("cannot reset the time-slice of an interrupted claim", gpu=uuid, error=problem)
                if not problems and uuid not in self._registry.read()["timeSlice"]:
                    reset.append(uuid)
        return reset
