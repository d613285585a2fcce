"""`HardwareSharingManager`: the `SharingManager` the kubelet plugin uses, on top of a `GpuHardware`.

For one config group of one claim, `prepare_group` executes the checked plan from `dra_gpu.sharing.plan`, in
an order where each step can be undone: create on-demand MIG devices, set the time-slice interval, start the
group's own MPS daemon (over full GPUs and MIG devices), or join the GPU's shares server. If a step fails,
everything done so far is undone and SharingError says what failed; nothing is left behind.

The shares of one GPU (fractional `gpu-N-shared` devices, NVIDIA's consumable shares with an MPS config or
part of the memory) are clients of ONE MPS server: separate servers on one GPU time-slice against each other
(seen on an H200: 4 jobs in 4 servers took 4.25x one job alone, 4 clients of one server 1.00x), so a server
per claim would make shares no faster than time-slicing. The GPU's daemon (`shares-<GPU uuid>`, multi-user so
that pods of any uid share its server) is started by the first share and stopped with the last; its caps are
the largest share it serves, and each claim's container carries its own share as client limits in its env
(a client env only lowers the server's caps). The registry counts the clients and their shares.

`reconcile_mps` (called by the plugin every few seconds) restarts a prepared group's daemon that died, with
the same limits and pipe directory, and finishes what an unprepare could not undo while a GPU was gone
(compute modes, time-slice intervals, MIG devices): unprepare records those instead of failing, so a pod on a
vanished GPU terminates.

The returned `state` (JSON, checkpointed by the plugin) holds everything `unprepare_group` needs, so the undo
works after a plugin restart; what several claims share (time-slice holders, shared MPS daemons, MIG instances
we created) is counted in the on-disk `Registry` under the plugin directory. `unprepare_group` runs every undo
step even when one fails, is idempotent, and raises SharingError listing the failures so the kubelet retries.

Admin-access devices are never reconfigured: admin access is for observing a device another claim may be
using, and changing its sharing setting would change that claim's behaviour.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from dra_gpu.config.names import ConfigError
from dra_gpu.config.quantity import MIB, format_mib
from dra_gpu.gpu_locks import GpuLocks
from dra_gpu.hardware.interface import GpuHardware, HardwareError
from dra_gpu.hardware.types import ComputeMode, DiscoveryResult, GpuInfo, MigInstance
from dra_gpu.inventory.model import DeviceKind
from dra_gpu.sharing.injected_bugs import injected
from dra_gpu.sharing.interface import AllocatedDevice, CdiEdits, CdiMount, GroupResult, SharingError
from dra_gpu.sharing.mig_lifecycle import MigLifecycle, instance_from_json, instance_json
from dra_gpu.sharing.mps import DaemonSpec, MpsDaemons, client_edits, saved_record
from dra_gpu.sharing.mps_pods import PodLauncher
from dra_gpu.sharing.plan import MpsPlan, SharePlan, SharingPlan, build_plan, gpu_lock_keys
from dra_gpu.sharing.registry import Registry
from dra_gpu.sharing.time_slicing import TimeSlicing
from dra_gpu.sharing.tmpfs import unmount

log = structlog.get_logger(__name__)

STATE_VERSION = 1
POD_RESTART_GRACE_S = 60.0  # a daemon pod that exists but does not answer for longer is reported as failed


@dataclass
class MpsReconcileReport:
    restarted: list[str] = field(default_factory=list)  # daemon ids started again
    limits_restored: list[str] = field(default_factory=list)  # daemon ids whose limits were set again
    failed: dict[str, tuple[list[str], str]] = field(default_factory=dict)  # id -> (GPU uuids, error)
    restored_modes: list[str] = field(default_factory=list)  # GPUs whose pending compute mode was restored
    reset_time_slices: list[str] = field(default_factory=list)  # GPUs whose pending time-slice reset was done
    destroyed_mig: list[str] = field(default_factory=list)  # deferred MIG devices destroyed (their uuids)


def group_daemon_id(claim_uid: str, uuids: Sequence[str]) -> str:
    """NVIDIA's naming: `<claim uid>-<first 5 hex of sha256 of the sorted UUIDs>`."""
    digest = hashlib.sha256(",".join(sorted(uuids)).encode()).hexdigest()[:5]
    return f"{claim_uid}-{digest}"


def shared_daemon_id(gpu_uuid: str) -> str:
    """The daemon of a GPU's shares, named by the GPU's UUID (a minor number may change with a MIG switch),
    lower case: it names the daemon's pod too (`dra-gpu-mps-shares-gpu-<uuid>`: 59 characters)."""
    return f"shares-{gpu_uuid.lower()}"


def share_caps(clients: Mapping[str, Mapping[str, Any]], memory_bytes: int) -> tuple[int, int]:
    """A shares server's caps: the largest share's compute percentage and memory. A tenant that drops its
    client limits gets these; one that keeps them gets its own share."""
    compute = max((int(c.get("computePercent", 100)) for c in clients.values()), default=100)
    memory = max((int(c.get("memoryBytes", memory_bytes)) for c in clients.values()), default=memory_bytes)
    return compute, memory


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
        faults: Callable[[str], None] | None = None,
        mps_pods: PodLauncher | None = None,
        locks: GpuLocks | None = None,
        leave_compute_mode: bool = False,
    ) -> None:
        self._hardware = hardware
        self._plugin_dir = Path(plugin_dir)
        self._registry = Registry(self._plugin_dir, boot_id)
        self._time_slicing = TimeSlicing(hardware, self._registry, faults)
        self._mps = MpsDaemons(
            hardware,
            self._plugin_dir,
            ready_timeout_s=mps_ready_timeout_s,
            mount_shm=mount_shm,
            faults=faults,
            pods=mps_pods,
            leave_compute_mode=leave_compute_mode,
        )
        self._faults: Callable[[str], None] = faults or (lambda _step: None)
        self._mig = MigLifecycle(hardware, self._registry)
        # One claim's sharing change per GPU at a time (the plugin passes the prepare service's locks, which
        # a prepare already holds); GPUs of other claims go on meanwhile.
        self._locks = locks or GpuLocks()
        self._facts_lock = threading.RLock()  # the cached GPU facts below
        self._kubelet_restarting: dict[str, float] = {}  # daemon id -> since when its pod does not answer
        self._gpus: dict[str, GpuInfo] | None = None
        # When our own MIG actions last changed the hardware (time.monotonic()): a discovery that started
        # before that is older than what we know, and `refresh` ignores it.
        self._mig_changed_at = float("-inf")

    @property
    def registry(self) -> Registry:
        return self._registry

    # ---- GPU facts -----------------------------------------------------------------------------------------

    def _gpu_facts(self, *, refresh: bool = False) -> dict[str, GpuInfo]:
        with self._facts_lock:
            if self._gpus is None or refresh:
                result = self._hardware.discover()
                self._gpus = {g.uuid: g for g in result.gpus}
            return self._gpus

    def _mig_changed(self) -> None:
        """Our own MIG action changed the hardware: the cached facts are stale (the next prepare re-reads)."""
        with self._facts_lock:
            self._gpus = None
            self._mig_changed_at = time.monotonic()

    def refresh(self, discovery: DiscoveryResult, started_at: float | None = None) -> None:
        """Take the GPU facts of a re-discovery (the plugin calls this after each one), so that prepares that
        do not re-read the hardware (everything but on-demand MIG) do not act on stale facts: a compute mode,
        MIG mode or MIG device changed out of band, a GPU gone. `started_at` (time.monotonic() when the
        discovery began) lets a discovery that raced with one of our own MIG changes be ignored."""
        with self._facts_lock:
            if started_at is not None and started_at < self._mig_changed_at:
                return
            self._gpus = {g.uuid: g for g in discovery.gpus}

    # ---- prepare -------------------------------------------------------------------------------------------

    def prepare_group(
        self, claim_uid: str, config: object | None, devices: Sequence[AllocatedDevice]
    ) -> GroupResult:
        exclusive, shared = gpu_lock_keys(d.device for d in devices)
        with self._locks.gpus(exclusive, shared=shared):
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
                if isinstance(err, SharingError):  # keeps its class (RegistryUnreadableError: its own metric)
                    raise type(err)(f"{err}{cleanup}") from None
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
            return GroupResult(
                state=state, edits=edits, mig_instances=created, undo_needed=bool(self._gpus_of_state(state))
            )

    def _start_group_mps(
        self, claim_uid: str, mps: MpsPlan, created: Mapping[str, MigInstance], state: dict[str, Any]
    ) -> CdiEdits:
        uuids = list(mps.static_uuids) + [created[name].uuid for name in mps.dynamic_mig_devices]
        names_by_uuid = self._uuid_names(mps, created)
        memory = {uuid: mps.memory_bytes[name] for uuid, name in names_by_uuid.items()}
        clamped: list[str] = []
        try:
            limits = mps.config.pinned_memory_limits(uuids, memory, clamped=clamped)
        except ConfigError as err:
            raise SharingError(str(err)) from None
        for message in clamped:  # accepted as NVIDIA's driver does, but the user should know
            log.warning("MPS pinned memory limit clamped", claim_uid=claim_uid, detail=message)
        spec = DaemonSpec(
            daemon_id=group_daemon_id(claim_uid, uuids),
            visible_uuids=tuple(uuids),
            exclusive_gpus=mps.full_gpu_uuids,
            thread_percentage=mps.config.defaultActiveThreadPercentage,
            pinned_limits=limits,
            multi_user=bool(mps.config.multiUser),
        )
        # A compute mode still pending on one of these GPUs (its claim was unprepared while the GPU was
        # gone) becomes the mode this daemon restores; restoring it now would take MPS from this claim.
        pending = self._registry.read().get("pendingComputeModes", {})
        adopted = {uuid: pending[uuid] for uuid in spec.exclusive_gpus if uuid in pending}
        record = self._mps.start(replace(spec, modes_before=adopted) if adopted else spec)
        if adopted:
            with self._registry.update() as data:
                for uuid in adopted:
                    data.setdefault("pendingComputeModes", {}).pop(uuid, None)
            log.info("compute mode left pending by an earlier claim taken over", gpus=sorted(adopted))
        state["mpsDaemon"] = record
        return client_edits(record)

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
        """Make the claim a client of its GPU's shares server (started by the first share): the registry
        counts it with its share, the server's caps grow to the largest share, and the container gets its own
        share as client limits. Holds the GPU alone (gpu_lock_keys), so joins and leaves of one GPU are one at
        a time."""
        clients = sorted(f"{claim_uid}/{key}" for key in share.client_keys)
        mine = {"computePercent": share.compute_percent, "memoryBytes": share.memory_bytes}
        facts = self._gpu_facts()
        gpu_memory = facts[share.gpu_uuid].memory_bytes if share.gpu_uuid in facts else 0
        state["sharedMps"] = {
            "gpu": share.gpu_uuid,
            "clients": clients,
            "daemonId": shared_daemon_id(share.gpu_uuid),
            "computePercent": share.compute_percent,
            "memoryBytes": share.memory_bytes,
            "ownDaemon": False,
        }
        # What this join made before it failed is undone here: the registry is saved only when the block
        # ends, so `_undo` would find neither a server it started, nor the claim's /dev/shm, nor the caps
        # it raised (a tenant connecting after the failure would keep them: issue 36).
        started: dict[str, Any] | None = None
        mounted: Path | None = None
        raised: tuple[dict[str, Any], tuple[int, int]] | None = None  # the server, and its caps before
        try:
            with self._registry.update() as data:
                entry = data["sharedMps"].get(share.gpu_uuid)
                if entry is not None and not Path(entry["daemon"]["dir"]).is_dir():
                    entry = None  # its directory is gone (removed by hand): start anew
                if entry is None:
                    thread, memory = share_caps(
                        dict.fromkeys(clients, mine), gpu_memory or share.memory_bytes
                    )
                    spec = DaemonSpec(
                        daemon_id=shared_daemon_id(share.gpu_uuid),
                        visible_uuids=(share.gpu_uuid,),
                        exclusive_gpus=(share.gpu_uuid,),
                        thread_percentage=thread,
                        pinned_limits={share.gpu_uuid: memory},
                        multi_user=True,  # pods of any uid: one server (per-uid servers would time-slice)
                        shares_server=True,
                    )
                    pending = data.get("pendingComputeModes", {})
                    if (
                        share.gpu_uuid in pending
                    ):  # the mode an earlier claim could not restore: restore that one
                        spec = replace(spec, modes_before={share.gpu_uuid: pending[share.gpu_uuid]})
                    record = self._mps.start(spec)
                    started = record
                    pending.pop(share.gpu_uuid, None)
                    entry = {"daemon": record, "clients": {}}
                    data["sharedMps"][share.gpu_uuid] = entry
                # the claim's own /dev/shm: tenants of one server share nothing through it (mounted before the
                # registry names it: a crash in between leaves a directory that start-up's sweep removes)
                shm = self._claim_shm_dir(entry["daemon"], claim_uid)
                mounted = shm
                self._mps.mount_shm(shm)
                entry["clients"].update({key: {**mine, "shmDir": str(shm)} for key in clients})
                self._faults("shares-client-added")
                record = entry["daemon"]
                before = share_caps(
                    {k: v for k, v in entry["clients"].items() if k not in clients},
                    gpu_memory or share.memory_bytes,
                )
                thread, memory = share_caps(entry["clients"], gpu_memory or share.memory_bytes)
                if (thread, format_mib(memory)) != (
                    record.get("threadPercentage"),
                    record.get("pinnedLimits", {}).get(share.gpu_uuid),
                ):
                    if started is None:
                        raised = (record, before)
                    self._mps.set_limits(record, thread, {share.gpu_uuid: memory})
        except BaseException:
            if mounted is not None:
                _remove_claim_shm(mounted.parent)
            if started is not None:
                self._mps.stop(started, on_gpu_gone=self._restore_later)
            elif raised is not None:
                self._lower_caps(share.gpu_uuid, *raised)
            raise
        return client_edits(
            record,
            thread_percentage=share.compute_percent,
            pinned_mib=share.memory_bytes // MIB,
            shm_dir=str(shm),
        )

    @staticmethod
    def _claim_shm_dir(record: Mapping[str, Any], claim_uid: str) -> Path:
        return Path(record["dir"]) / "claims" / claim_uid / "shm"

    def _sweep_claim_shm(self, entry: Mapping[str, Any]) -> list[str]:
        """Unmount and remove the /dev/shm of every claim that is no client of the shares server any more."""
        claims_dir = Path(entry["daemon"]["dir"]) / "claims"
        if not claims_dir.is_dir():
            return []
        keep = {key.split("/", 1)[0] for key in entry["clients"]}
        problems: list[str] = []
        for claim in sorted(claims_dir.iterdir()):
            if claim.name not in keep:
                problems += _remove_claim_shm(claim)
        return problems

    # ---- unprepare -----------------------------------------------------------------------------------------

    def unprepare_group(self, claim_uid: str, state: Mapping[str, Any]) -> None:
        gpus = self._gpus_of_state(state)
        only_shares = _changes_nothing_gpu_wide(state)
        with self._locks.gpus(() if only_shares else gpus, shared=gpus if only_shares else ()):
            problems = self._undo(claim_uid, state)
            if state.get("migCreated"):
                self._mig_changed()
        if problems:
            raise SharingError("; ".join(problems))
        log.info("group unprepared", claim_uid=claim_uid, devices=state.get("devices"))

    def _gpus_of_state(self, state: Mapping[str, Any]) -> set[str]:
        """The physical GPUs a prepared group's undo touches."""
        gpus = {str(d["parentUuid"]) for d in state.get("migCreated") or ()}
        gpus |= set((state.get("timeSlice") or {}).get("gpus") or ())
        if state.get("mpsDaemon"):
            gpus |= set(self._gpus_of(state["mpsDaemon"]))
        if state.get("sharedMps"):
            gpus.add(str(state["sharedMps"]["gpu"]))
        return gpus

    def _undo(self, claim_uid: str, state: Mapping[str, Any]) -> list[str]:
        """Undo in reverse order of prepare; every step runs even if an earlier one fails."""
        problems: list[str] = []
        shared = state.get("sharedMps")
        if shared and not shared.get("ownDaemon"):
            problems += self._leave_shared_mps(shared["gpu"], shared["clients"])
        daemon = state.get("mpsDaemon")
        if daemon:
            problems += self._mps.stop(daemon, on_gpu_gone=self._restore_later)
        time_slice = state.get("timeSlice")
        if time_slice:
            problems += self._time_slicing.release(claim_uid, time_slice["gpus"])
        for data in reversed(state.get("migCreated") or []):
            try:
                self._mig.destroy(instance_from_json(data), defer_if_gone=True)
            except SharingError as err:
                problems.append(str(err))
        return problems

    def _leave_shared_mps(self, gpu_uuid: str, client_keys: Sequence[str]) -> list[str]:
        """The claim's clients leave the GPU's shares server: the last one stops it (and its compute mode is
        put back); otherwise the caps shrink to the largest share left."""
        with self._registry.update() as data:
            entry = data["sharedMps"].get(gpu_uuid)
            if entry is None:
                return []
            for key in client_keys:
                entry["clients"].pop(key, None)
            self._faults("shares-client-removed")
            problems = self._sweep_claim_shm(entry)
            if entry["clients"]:
                return problems + self._fit_caps(gpu_uuid, entry)
            if problems:
                return problems
            problems = self._mps.stop(entry["daemon"], on_gpu_gone=self._restore_later)
            if not problems:
                del data["sharedMps"][gpu_uuid]
            return problems

    def _lower_caps(self, gpu_uuid: str, record: dict[str, Any], caps: tuple[int, int]) -> None:
        """A join that raised its server's caps failed: put back the caps of the shares that were there
        before, on the daemon and its running servers. When that fails too, the reconcile pass fits them to
        the registry's shares before it holds any server to a record (`reconcile_mps`)."""
        thread, memory = caps
        try:
            self._mps.record_limits(record, thread, {gpu_uuid: memory})
            self._mps.apply_limits(record)
        except (SharingError, OSError) as err:
            log.warning("caps of a failed join not lowered yet", gpu=gpu_uuid, error=str(err))

    def _fit_caps(self, gpu_uuid: str, entry: dict[str, Any]) -> list[str]:
        """Hold a shares server to the largest share it serves: grown when a larger one joins, shrunk when
        one leaves (a departed share's caps must go). Problems are logged; the next reconcile pass retries."""
        record = entry["daemon"]
        if not record.get("sharesServer"):
            return []  # a per-GPU daemon from before the shares server: its limits are its only client's
        thread, memory = self._caps_for(gpu_uuid, entry)
        if (thread, format_mib(memory)) == (
            record.get("threadPercentage"),
            record["pinnedLimits"].get(gpu_uuid),
        ):
            return []
        try:
            self._mps.set_limits(record, thread, {gpu_uuid: memory})
        except SharingError as err:  # the registry holds the shares: the reconcile pass sets the caps
            log.warning("shares server caps not set yet", gpu=gpu_uuid, error=str(err))
        return []

    def _caps_for(self, gpu_uuid: str, entry: Mapping[str, Any]) -> tuple[int, int]:
        """The caps a GPU's shares server must hold: the largest of the shares the registry names."""
        gpus = self._gpu_facts()
        memory_bytes = gpus[gpu_uuid].memory_bytes if gpu_uuid in gpus else 0
        thread, memory = share_caps(entry["clients"], memory_bytes)
        if injected("caps-never-shrink"):  # test-only: the soak's shrinking is tested on this bug
            held = entry["daemon"]
            thread = max(thread, int(held.get("threadPercentage") or 0))
            memory = max(memory, int(str(held["pinnedLimits"].get(gpu_uuid, "0M")).rstrip("M")) * MIB)
        return thread, memory

    def _restore_later(self, gpu_uuid: str, mode: int) -> None:
        """A compute mode to put back when the GPU returns (it fell off the bus during unprepare)."""
        with self._registry.update() as data:
            data.setdefault("pendingComputeModes", {})[gpu_uuid] = mode

    def pending_cleanup(self) -> dict[str, list[str]]:
        """GPU uuid -> what is still to undo on it because the GPU was gone when its claim was unprepared
        (a compute mode to restore, a time-slice interval to reset, MIG devices to destroy)."""
        data = self._registry.read()
        pending: dict[str, list[str]] = {}
        for uuid, mode in sorted(data["pendingComputeModes"].items()):
            pending.setdefault(uuid, []).append(f"compute mode {ComputeMode(mode).name} to restore")
        for uuid in data["pendingTimeSliceResets"]:
            pending.setdefault(uuid, []).append("time-slice interval to reset to Default")
        for instance in self._mig.pending():
            pending.setdefault(instance.parent_uuid, []).append(f"MIG device {instance.uuid} to destroy")
        return pending

    # ---- start-up ------------------------------------------------------------------------------------------

    def destroy_unowned_mig(self, owned: set[tuple[str, int, int]]) -> list[str]:
        with self._locks.node():
            try:
                gpus = self._gpu_facts(refresh=True)
            except HardwareError as err:
                raise SharingError(f"cannot read the GPUs: {err}") from None
            destroyed = self._mig.destroy_unowned(owned, list(gpus.values()))
            self._mig_changed()
            return destroyed

    def release_unowned_time_slices(
        self, owned_states: Mapping[str, Iterable[Mapping[str, Any]]]
    ) -> list[str]:
        """At start-up: reset time-slice intervals held for claims (uid -> group states) that no checkpointed
        group state holds. Returns the GPUs reset to Default."""
        with self._locks.node():
            owned = {uid for uid, states in owned_states.items() if any(s.get("timeSlice") for s in states)}
            return self._time_slicing.release_unowned(owned)

    def stop_unowned_mps(self, owned_states: Iterable[Mapping[str, Any]]) -> list[str]:
        """At start-up: stop MPS daemons that neither a checkpointed group state nor a shared GPU owns.

        A crash between starting a daemon and checkpointing the group leaves one behind; its own `record.json`
        (written while it starts) says how to stop it and which compute modes to restore. Returns their ids.
        """
        with self._locks.node():
            owned_states = list(owned_states)
            stopped: list[str] = self._release_unowned_share_clients(owned_states)
            owned = {s["mpsDaemon"]["id"] for s in owned_states if s.get("mpsDaemon")}
            owned |= {e["daemon"]["id"] for e in self._registry.read()["sharedMps"].values()}
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
            stopped += self._mps.stop_unowned_pods(owned)
            return stopped

    def _release_unowned_share_clients(self, owned_states: Sequence[Mapping[str, Any]]) -> list[str]:
        """A crash between a share joining its GPU's server and its claim being checkpointed leaves a client
        in the registry that no claim will ever remove: drop it (the kubelet's retry joins again), and stop a
        server left without clients. Returns the daemons stopped."""
        owned = {key for s in owned_states if s.get("sharedMps") for key in s["sharedMps"].get("clients", ())}
        stopped: list[str] = []
        with self._registry.update() as data:
            for gpu_uuid, entry in sorted(data["sharedMps"].items()):
                unowned = sorted(set(entry["clients"]) - owned)
                for key in unowned:
                    del entry["clients"][key]
                if unowned:
                    log.info("dropped share clients no claim owns", gpu=gpu_uuid, clients=unowned)
                swept = self._sweep_claim_shm(entry)
                if swept:
                    log.error("cannot remove a departed share's /dev/shm", gpu=gpu_uuid, problems=swept)
                if entry["clients"]:
                    if unowned:
                        self._fit_caps(gpu_uuid, entry)
                    continue
                problems = self._mps.stop(entry["daemon"], on_gpu_gone=self._restore_later)
                if problems:
                    log.error("cannot stop a shares server without clients", gpu=gpu_uuid, problems=problems)
                    continue
                del data["sharedMps"][gpu_uuid]
                stopped.append(entry["daemon"]["id"])
        return stopped

    def revive_mps(self, owned_states: Iterable[Mapping[str, Any]]) -> list[str]:
        """At start-up: restart, in place, the MPS daemons that prepared groups still need but that no longer
        answer. Returns the ids restarted; one that cannot be restarted is logged (and reported by the
        plugin's reconcile loop, which calls `reconcile_mps`)."""
        return self.reconcile_mps(owned_states).restarted

    def reconcile_mps(self, owned_states: Iterable[Mapping[str, Any]]) -> MpsReconcileReport:
        """One pass of the continuous check: every prepared group's daemon and every GPU's shares server must
        run with its recorded identity and answer; a dead one is restarted with the same pipe directory,
        limits and compute modes, a running one held to its limits (MpsDaemons.ensure_limits), and a shares
        server's caps fitted to the clients the registry holds. Compute modes left to restore on a GPU that
        was gone are put back once it answers again."""
        report = MpsReconcileReport()
        for state in owned_states:
            if state.get("mpsDaemon"):
                # Only this daemon's GPUs wait: a restart that takes its ready timeout holds back no other.
                # Exclusive, also for a share that an earlier version gave a daemon of its own: its claim's
                # unprepare (which holds the GPU shared) must not find its daemon restarted behind its back.
                with self._locks.gpus(self._gpus_of(state["mpsDaemon"])):
                    self._reconcile_one(self._mps.latest(state["mpsDaemon"]), report)
        for gpu_uuid in sorted(self._registry.read()["sharedMps"]):
            with self._locks.gpus([gpu_uuid]), self._registry.update() as data:
                entry = data["sharedMps"].get(gpu_uuid)
                if entry is not None and entry["clients"]:
                    # The caps follow the shares the registry holds, and are fitted BEFORE anything holds
                    # the daemon to its record: a join that failed (or was killed) after saving larger caps
                    # beside the daemon must not have them sent to a server (issue 36).
                    record = self._mps.latest(entry["daemon"])
                    if record.get("sharesServer"):
                        thread, memory = self._caps_for(gpu_uuid, entry)
                        self._mps.record_limits(record, thread, {gpu_uuid: memory})
                    self._reconcile_one(record, report)
                    entry["daemon"] = self._mps.latest(record)
        if not self._node_work_pending():
            return report
        with self._locks.node():  # rare (a GPU came back): the whole node at once
            with self._registry.update() as data:
                pending = data.setdefault("pendingComputeModes", {})
                for uuid, mode in sorted(pending.items()):
                    try:
                        self._hardware.set_compute_mode(uuid, ComputeMode(mode))
                    except HardwareError as err:
                        log.debug("GPU still not back; compute mode restored later", gpu=uuid, error=str(err))
                        continue
                    del pending[uuid]
                    report.restored_modes.append(uuid)
                    log.info("GPU is back; compute mode restored", gpu=uuid, mode=mode)
            report.reset_time_slices = self._time_slicing.retry_pending()
            report.destroyed_mig = self._mig.retry_pending()
            if report.destroyed_mig:
                self._mig_changed()
        return report

    def _node_work_pending(self) -> bool:
        """Whether the registry holds anything for the node-wide part of a reconcile pass."""
        data = self._registry.read()
        return bool(
            data.get("pendingComputeModes")
            or data.get("pendingTimeSliceResets")
            or data.get("pendingMigDestroy")
        )

    def _reconcile_one(self, record: dict[str, Any], report: MpsReconcileReport) -> None:
        if not Path(record["dir"]).is_dir():
            self._kubelet_restarting.pop(record["id"], None)
            return
        if self._mps.alive(record):
            self._kubelet_restarting.pop(record["id"], None)
            try:
                if self._mps.ensure_limits(record):
                    report.limits_restored.append(record["id"])
            except SharingError as err:
                log.error("cannot set the limits of a restarted MPS daemon", id=record["id"], error=str(err))
                why = f"its limits cannot be set again: {err}"
                report.failed[record["id"]] = (self._gpus_of(record), why)
            return
        gpus = self._gpus_of(record)
        if self._mps.pod_exists(record):
            try:
                if self._mps.place_staged(record):  # the kubelet restarted its container: now limited
                    self._kubelet_restarting.pop(record["id"], None)
                    report.limits_restored.append(record["id"])
                    return
            except (SharingError, OSError) as err:
                log.error("cannot put a restarted MPS daemon in place", id=record["id"], error=str(err))
            # Its pod is there but the daemon does not answer: the kubelet restarts the container in place
            # (restartPolicy Always). Starting another would only wait under the lock; report it when it
            # stays so for longer than a container restart takes.
            since = self._kubelet_restarting.setdefault(record["id"], time.monotonic())
            if time.monotonic() - since > POD_RESTART_GRACE_S:
                why = "its pod runs but the daemon does not answer on its pipe"
                report.failed[record["id"]] = (gpus, why)
            return
        log.warning("MPS daemon is not running; restarting it", id=record["id"], pid=record.get("pid"))
        try:
            self._mps.restart(record)
        except (SharingError, HardwareError, OSError) as err:
            log.error("cannot restart MPS daemon", id=record["id"], error=str(err))
            report.failed[record["id"]] = (gpus, str(err))
            return
        report.restarted.append(record["id"])

    def _gpus_of(self, record: Mapping[str, Any]) -> list[str]:
        """The physical GPUs a daemon serves (the parents of its MIG devices): where a failure is tainted."""
        return sorted({self._parent_gpu(uuid) for uuid in record.get("visibleDevices", [])})

    def _parent_gpu(self, uuid: str) -> str:
        """The physical GPU of a daemon's device (a MIG device's parent), from the cached facts."""
        try:
            gpus = self._gpu_facts()
        except HardwareError:
            return uuid
        if uuid in gpus:
            return uuid
        for gpu in gpus.values():
            if any(m.uuid == uuid for m in gpu.mig_instances):
                return gpu.uuid
        return uuid

    def describe(self) -> dict[str, Any]:
        """The registry (what is shared between claims right now), for diagnostics."""
        return self._registry.read()


def plan_for(
    config: object | None, devices: Sequence[AllocatedDevice], gpus: Mapping[str, GpuInfo]
) -> SharingPlan:
    """The checked plan without executing it (for `dra-gpu explain`-style tools and tests)."""
    return build_plan(config, devices, gpus)


def _changes_nothing_gpu_wide(state: Mapping[str, Any]) -> bool:
    """A prepared group whose undo touches nothing other claims of its GPU rely on: a fractional share that an
    earlier version gave an MPS daemon of its own (`ownDaemon`), which left the compute mode alone. Its undo
    holds the GPU shared (see GpuLocks); a client of a GPU's shares server holds it alone."""
    shared = state.get("sharedMps")
    daemon = state.get("mpsDaemon") or {}
    return bool(
        shared
        and shared.get("ownDaemon")
        and not state.get("migCreated")
        and not state.get("timeSlice")
        and not daemon.get("computeModes")
    )


def _remove_claim_shm(claim_dir: Path) -> list[str]:
    """Unmount a shares server's claim's /dev/shm and remove its directory; problems (empty when done)."""
    shm = claim_dir / "shm"
    if shm.is_mount():
        try:
            unmount(shm)
        except OSError as err:
            return [f"cannot unmount {shm}: {err.strerror}"]
    shutil.rmtree(claim_dir, ignore_errors=True)
    return []
