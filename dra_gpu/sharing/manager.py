"""`HardwareSharingManager`: the `SharingManager` the kubelet plugin uses, on top of a `GpuHardware`.

For one config group of one claim, `prepare_group` executes the checked plan from `dra_gpu.sharing.plan`, in
an order where each step can be undone: create on-demand MIG devices, set the time-slice interval, start the
group's MPS daemon (over full GPUs and MIG devices) or join the per-GPU MPS daemon of fractional shares. If a
step fails, everything done so far is undone and SharingError says what failed; nothing is left behind.

The returned `state` (JSON, checkpointed by the plugin) holds everything `unprepare_group` needs, so the undo
works after a plugin restart; what several claims share (time-slice holders, shared MPS daemons, MIG instances
we created) is counted in the on-disk `Registry` under the plugin directory. `unprepare_group` runs every undo
step even when one fails, is idempotent, and raises SharingError listing the failures so the kubelet retries.

Admin-access devices are never reconfigured: admin access is for observing a device another claim may be
using, and changing its sharing setting would change that claim's behaviour.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from dra_gpu.config.api import ConfigError
from dra_gpu.hardware.interface import GpuHardware, HardwareError
from dra_gpu.hardware.types import DiscoveryResult, GpuInfo, MigInstance
from dra_gpu.inventory.model import DeviceKind
from dra_gpu.sharing.interface import AllocatedDevice, CdiEdits, CdiMount, GroupResult, SharingError
from dra_gpu.sharing.mig_lifecycle import MigLifecycle, instance_from_json, instance_json
from dra_gpu.sharing.mps import DaemonSpec, MpsDaemons, client_edits, saved_record
from dra_gpu.sharing.plan import MpsPlan, SharePlan, SharingPlan, build_plan
from dra_gpu.sharing.registry import Registry
from dra_gpu.sharing.time_slicing import TimeSlicing

log = structlog.get_logger(__name__)

STATE_VERSION = 1


def group_daemon_id(claim_uid: str, uuids: Sequence[str]) -> str:
    """NVIDIA's naming: `<claim uid>-<first 5 hex of sha256 of the sorted UUIDs>`."""
    digest = hashlib.sha256(",".join(sorted(uuids)).encode()).hexdigest()[:5]
    return f"{claim_uid}-{digest}"


def shared_daemon_id(gpu_minor: int) -> str:
    return f"shared-gpu-{gpu_minor}"


def edits_to_json(edits: CdiEdits) -> dict[str, Any]:
    return {
        "env": list(edits.env),
        "mounts": [
            {"hostPath": m.host_path, "containerPath": m.container_path, "options": list(m.options)}
            for m in edits.mounts
        ],
    }


def edits_from_state(state: Mapping[str, Any]) -> CdiEdits:
    """The container edits of a prepared group, rebuilt from its checkpointed state (e.g. after a restart)."""
    data = state.get("edits") or {}
    return CdiEdits(
        env=tuple(data.get("env", ())),
        mounts=tuple(
            CdiMount(m["hostPath"], m["containerPath"], tuple(m["options"])) for m in data.get("mounts", ())
        ),
    )


class HardwareSharingManager:
    def __init__(
        self,
        hardware: GpuHardware,
        plugin_dir: Path,
        *,
        mps_ready_timeout_s: float = 10.0,
        mount_shm: bool = True,
        boot_id: str | None = None,
    ) -> None:
        self._hardware = hardware
        self._plugin_dir = Path(plugin_dir)
        self._registry = Registry(self._plugin_dir, boot_id)
        self._time_slicing = TimeSlicing(hardware, self._registry)
        self._mps = MpsDaemons(
            hardware, self._plugin_dir, ready_timeout_s=mps_ready_timeout_s, mount_shm=mount_shm
        )
        self._mig = MigLifecycle(hardware, self._registry)
        self._lock = threading.RLock()  # GPU-global settings: one claim's sharing change at a time
        self._gpus: dict[str, GpuInfo] | None = None
        # When our own MIG actions last changed the hardware (time.monotonic()): a discovery that started
        # before that is older than what we know, and `refresh` ignores it.
        self._mig_changed_at = float("-inf")

    @property
    def registry(self) -> Registry:
        return self._registry

    # ---- GPU facts -----------------------------------------------------------------------------------------

    def _gpu_facts(self, *, refresh: bool = False) -> dict[str, GpuInfo]:
        if self._gpus is None or refresh:
            result = self._hardware.discover()
            self._gpus = {g.uuid: g for g in result.gpus}
        return self._gpus

    def _mig_changed(self) -> None:
        """Our own MIG action changed the hardware: the cached facts are stale (the next prepare re-reads)."""
        self._gpus = None
        self._mig_changed_at = time.monotonic()

    def refresh(self, discovery: DiscoveryResult, started_at: float | None = None) -> None:
        """Take the GPU facts of a re-discovery (the plugin calls this after each one), so that prepares that
        do not re-read the hardware (everything but on-demand MIG) do not act on stale facts: a compute mode,
        MIG mode or MIG device changed out of band, a GPU gone. `started_at` (time.monotonic() when the
        discovery began) lets a discovery that raced with one of our own MIG changes be ignored."""
        with self._lock:
            if started_at is not None and started_at < self._mig_changed_at:
                return
            self._gpus = {g.uuid: g for g in discovery.gpus}

    # ---- prepare -------------------------------------------------------------------------------------------

    def prepare_group(
        self, claim_uid: str, config: object | None, devices: Sequence[AllocatedDevice]
    ) -> GroupResult:
        with self._lock:
            dynamic = any(d.device.kind is DeviceKind.MIG_DYNAMIC for d in devices)
            try:
                gpus = self._gpu_facts(refresh=dynamic)
            except HardwareError as err:
                raise SharingError(f"cannot read the GPUs: {err}") from None
            plan = build_plan(config, devices, gpus)
            state: dict[str, Any] = {
                "version": STATE_VERSION,
                "strategy": plan.strategy,
                "devices": [d.device.name for d in devices],
                "migCreated": [],
                "timeSlice": None,
                "migTimeSlicing": list(plan.mig_time_slicing),
                "mpsDaemon": None,
                "sharedMps": None,
                "adminAccessSkipped": list(plan.skipped_admin),
                "edits": edits_to_json(CdiEdits()),
            }
            created: dict[str, MigInstance] = {}
            edits = CdiEdits()
            try:
                for device in plan.create_mig:
                    gpus = self._gpu_facts(refresh=True)
                    gpu = gpus.get(device.device.parent_uuid)
                    if gpu is None:
                        raise SharingError(
                            f"device {device.device.name}: GPU {device.device.parent_uuid} is gone"
                        )
                    instance = self._mig.create(device, gpu)
                    created[device.device.name] = instance
                    state["migCreated"].append(instance_json(device.device.name, instance))
                if plan.time_slice_interval is not None and plan.time_slice_gpus:
                    held = self._time_slicing.acquire(
                        claim_uid, plan.time_slice_gpus, plan.time_slice_interval
                    )
                    state["timeSlice"] = {"interval": plan.time_slice_interval, "gpus": held}
                if plan.mps is not None:
                    edits = self._start_group_mps(claim_uid, plan.mps, created, state)
                if plan.shares is not None:
                    edits = self._join_shared_mps(claim_uid, plan.shares, state)
            except Exception as err:
                problems = self._undo(claim_uid, state)
                if state["migCreated"]:
                    self._mig_changed()
                cleanup = f" (cleanup failed: {'; '.join(problems)})" if problems else ""
                if isinstance(err, SharingError):
                    raise SharingError(f"{err}{cleanup}") from None
                raise SharingError(f"sharing setup failed: {err!r}{cleanup}") from err
            state["edits"] = edits_to_json(edits)
            if created:  # MIG devices (and maybe MIG mode) changed
                self._mig_changed()
            log.info(
                "group prepared",
                claim_uid=claim_uid,
                strategy=plan.strategy,
                devices=state["devices"],
                created_mig=list(created),
            )
            return GroupResult(state=state, edits=edits, mig_instances=created)

    def _start_group_mps(
        self, claim_uid: str, mps: MpsPlan, created: Mapping[str, MigInstance], state: dict[str, Any]
    ) -> CdiEdits:
        uuids = list(mps.static_uuids) + [created[name].uuid for name in mps.dynamic_mig_devices]
        names_by_uuid = self._uuid_names(mps, created)
        memory = {uuid: mps.memory_bytes[name] for uuid, name in names_by_uuid.items()}
        try:
            limits = mps.config.pinned_memory_limits(uuids, memory)
        except ConfigError as err:
            raise SharingError(str(err)) from None
        spec = DaemonSpec(
            daemon_id=group_daemon_id(claim_uid, uuids),
            visible_uuids=tuple(uuids),
            exclusive_gpus=mps.full_gpu_uuids,
            thread_percentage=mps.config.defaultActiveThreadPercentage,
            pinned_limits=limits,
        )
        record = self._mps.start(spec)
        state["mpsDaemon"] = record
        return client_edits(record, spec.thread_percentage, limits)

    @staticmethod
    def _uuid_names(mps: MpsPlan, created: Mapping[str, MigInstance]) -> dict[str, str]:
        names: dict[str, str] = {}
        static = iter(mps.static_uuids)
        for name in mps.memory_bytes:
            if name in created:
                names[created[name].uuid] = name
            elif name not in mps.dynamic_mig_devices:
                names[next(static)] = name
        return names

    def _join_shared_mps(self, claim_uid: str, share: SharePlan, state: dict[str, Any]) -> CdiEdits:
        clients = {
            f"{claim_uid}/{key}": {"computePercent": share.compute_percent, "memoryBytes": share.memory_bytes}
            for key in share.client_keys
        }
        with self._registry.update() as data:
            entry = data["sharedMps"].get(share.gpu_uuid)
            if entry is not None and not self._daemon_answers(entry["daemon"]):
                log.warning("shared MPS daemon is gone; restarting it", gpu=share.gpu_uuid)
                problems = self._mps.stop(entry["daemon"])
                if problems:
                    raise SharingError(
                        f"cannot clean up the dead MPS daemon of GPU {share.gpu_uuid}: " + "; ".join(problems)
                    )
                entry = None
            if entry is None:
                record = self._mps.start(
                    DaemonSpec(
                        daemon_id=shared_daemon_id(share.gpu_minor),
                        visible_uuids=(share.gpu_uuid,),
                        exclusive_gpus=(share.gpu_uuid,),
                    )
                )
                entry = {"daemon": record, "clients": {}}
                data["sharedMps"][share.gpu_uuid] = entry
            entry["clients"].update(clients)
            record = entry["daemon"]
        state["sharedMps"] = {
            "gpu": share.gpu_uuid,
            "clients": sorted(clients),
            "daemonId": record["id"],
            "computePercent": share.compute_percent,
            "memoryBytes": share.memory_bytes,
        }
        return client_edits(record, share.compute_percent, {share.gpu_uuid: share.memory_bytes})

    def _daemon_answers(self, record: Mapping[str, Any]) -> bool:
        return self._mps.answers(record)

    # ---- unprepare -----------------------------------------------------------------------------------------

    def unprepare_group(self, claim_uid: str, state: Mapping[str, Any]) -> None:
        with self._lock:
            problems = self._undo(claim_uid, state)
            if state.get("migCreated"):
                self._mig_changed()
        if problems:
            raise SharingError("; ".join(problems))
        log.info("group unprepared", claim_uid=claim_uid, devices=state.get("devices"))

    def _undo(self, claim_uid: str, state: Mapping[str, Any]) -> list[str]:
        """Undo in reverse order of prepare; every step runs even if an earlier one fails."""
        problems: list[str] = []
        shared = state.get("sharedMps")
        if shared:
            problems += self._leave_shared_mps(shared["gpu"], shared["clients"])
        daemon = state.get("mpsDaemon")
        if daemon:
            problems += self._mps.stop(daemon)
        time_slice = state.get("timeSlice")
        if time_slice:
            problems += self._time_slicing.release(claim_uid, time_slice["gpus"])
        for data in reversed(state.get("migCreated") or []):
            try:
                self._mig.destroy(instance_from_json(data))
            except SharingError as err:
                problems.append(str(err))
        return problems

    def _leave_shared_mps(self, gpu_uuid: str, client_keys: Sequence[str]) -> list[str]:
        with self._registry.update() as data:
            entry = data["sharedMps"].get(gpu_uuid)
            if entry is None:
                return []
            for key in client_keys:
                entry["clients"].pop(key, None)
            if entry["clients"]:
                return []
            problems = self._mps.stop(entry["daemon"])
            if not problems:
                del data["sharedMps"][gpu_uuid]
            return problems

    # ---- start-up ------------------------------------------------------------------------------------------

    def destroy_unowned_mig(self, owned: set[tuple[str, int, int]]) -> list[str]:
        with self._lock:
            try:
                gpus = self._gpu_facts(refresh=True)
            except HardwareError as err:
                raise SharingError(f"cannot read the GPUs: {err}") from None
            destroyed = self._mig.destroy_unowned(owned, list(gpus.values()))
            self._mig_changed()
            return destroyed

    def stop_unowned_mps(self, owned_states: Iterable[Mapping[str, Any]]) -> list[str]:
        """At start-up: stop MPS daemons that neither a checkpointed group state nor a shared GPU owns.

        A crash between starting a daemon and checkpointing the group leaves one behind; its own `record.json`
        (written while it starts) says how to stop it and which compute modes to restore. Returns their ids.
        """
        with self._lock:
            owned = {s["mpsDaemon"]["id"] for s in owned_states if s.get("mpsDaemon")}
            owned |= {e["daemon"]["id"] for e in self._registry.read()["sharedMps"].values()}
            stopped: list[str] = []
            for directory in self._mps.daemon_dirs():
                if directory.name in owned:
                    continue
                record = saved_record(directory)
                if record is None:
                    log.warning("MPS directory without a record; leaving it", dir=str(directory))
                    continue
                problems = self._mps.stop(record)
                if problems:
                    log.error("cannot stop unowned MPS daemon", id=directory.name, problems=problems)
                    continue
                stopped.append(directory.name)
            return stopped

    def revive_mps(self, owned_states: Iterable[Mapping[str, Any]]) -> list[str]:
        """At start-up: restart, in place, the MPS daemons that prepared groups and shared GPUs still need but
        that no longer answer (a restart of the plugin's container takes its child processes with it).

        Returns the ids restarted; a daemon that cannot be restarted is logged and left for unprepare.
        """
        with self._lock:
            revived: list[str] = []
            records = [dict(s["mpsDaemon"]) for s in owned_states if s.get("mpsDaemon")]
            for record in records:
                if self._revive(record):
                    revived.append(record["id"])
            with self._registry.update() as data:
                for entry in data["sharedMps"].values():
                    if entry["clients"] and self._revive(entry["daemon"]):
                        revived.append(entry["daemon"]["id"])
            return revived

    def _revive(self, record: dict[str, Any]) -> bool:
        if not Path(record["dir"]).is_dir() or self._mps.answers(record):
            return False
        try:
            self._mps.restart(record)
        except (SharingError, HardwareError, OSError) as err:
            log.error("cannot restart MPS daemon", id=record["id"], error=str(err))
            return False
        return True

    def describe(self) -> dict[str, Any]:
        """The registry (what is shared between claims right now), for diagnostics."""
        return self._registry.read()


def plan_for(
    config: object | None, devices: Sequence[AllocatedDevice], gpus: Mapping[str, GpuInfo]
) -> SharingPlan:
    """The checked plan without executing it (for `dra-gpu explain`-style tools and tests)."""
    return build_plan(config, devices, gpus)
