"""NodePrepareResources / NodeUnprepareResources, independent of the gRPC API version.

Prepare of one claim (kubelet semantics, k8s-dra-api §7; NVIDIA's flow, nvidia-conventions §8):
1. A claim already `PrepareCompleted` in the checkpoint is answered from there (idempotent; no API call).
2. GET the claim; fail it when missing, replaced (UID differs) or not allocated. Keep only our driver's
   results.
3. Map device names to the node's device model, decode and resolve the opaque configs into groups.
4. Under the locks of the claim's GPUs (`GpuLocks`: prepares of other GPUs go on meanwhile): roll back a
   claim left `PrepareStarted`; refuse devices that another claim holds (unless admin access), or a shared
   GPU taken another way than its claims take it (`share_modes`), and write `PrepareStarted`, both in one
   checkpoint update. A claim that takes its devices as they are (whole GPUs and existing MIG devices, no
   config, no share) skips this write: the refusal goes with step 6.
5. Per group `SharingManager.prepare_group`, checkpointing each group's undo state as soon as it exists (a
   group that changed nothing is recorded with step 6).
6. Write the CDI spec, then `PrepareCompleted` with the answer.
Any failure after step 4 rolls back what was done (groups in reverse, CDI file, checkpoint entry). Errors are
returned per claim, never for the whole batch, and name the claim and the cause.

The checkpoint file is shared by all claims: every change of one claim's entry is a short read-modify-write
under the checkpoint's own lock (`_commit`), so concurrent prepares of different GPUs never write back each
other's stale entries. Node-wide work (start-up cleanup, the owned-MIG read of a re-discovery) takes
`GpuLocks.node()` and so never sees a prepare half done.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import structlog

from dra_gpu.cdi.driver_discovery import MigCapabilityError, mig_capability_minors
from dra_gpu.cdi.edits_json import edits_from_json, edits_to_json
from dra_gpu.cdi.spec_builder import (
    ClaimDevice,
    DriverEdits,
    build_claim_spec,
    cdi_device_id,
    gpu_device_nodes,
    mig_capability_nodes,
)
from dra_gpu.cdi.spec_validation import CdiSpecError
from dra_gpu.cdi.spec_writer import CdiSpecWriter, CdiWriteError
from dra_gpu.checkpoint.checkpoint_store import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    ClaimEntry,
    ClaimPhase,
    PreparedDevice,
    PreparedGroup,
)
from dra_gpu.config.resolution import (
    ConfigResolutionError,
    ResultRef,
    ordered_config_entries,
    resolve_configs,
)
from dra_gpu.gpu_locks import GpuLocks, GpuLockTimeoutError
from dra_gpu.hardware.types import MigInstance
from dra_gpu.inventory.model import DRIVER_NAME, Device, DeviceKind, DeviceModel
from dra_gpu.plugin.claim_reader import ClaimJson, ClaimReader, ClaimReadError
from dra_gpu.plugin.device_conflicts import devices_conflict
from dra_gpu.plugin.fault_injection import FaultPoints
from dra_gpu.plugin.metrics import PluginMetrics
from dra_gpu.plugin.share_modes import (
    ShareMode,
    conflict_message,
    held_modes,
    mixed_in_one_claim,
    modes_by_name,
    planned_modes,
)
from dra_gpu.sharing.interface import AllocatedDevice, CdiEdits, GroupResult, SharingError, SharingManager
from dra_gpu.sharing.plan import gpu_lock_keys, takes_devices_as_they_are
from dra_gpu.sharing.registry import RegistryUnreadableError

if TYPE_CHECKING:  # the models load with the first config a claim carries (dra_gpu.config.names)
    from dra_gpu.config.api import DeviceConfig

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class PreparedDeviceAnswer:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareOutcome:
    devices: tuple[PreparedDeviceAnswer, ...] = ()
    error: str = ""


class ClaimError(Exception):
    """Preparing one claim failed; `reason` is a short metric label, the message names claim and cause."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class _Allocation:
    """One of our allocation results joined with the device model."""

    request: str
    pool: str
    device: Device
    admin_access: bool
    share_id: str | None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)

    def as_allocated(self) -> AllocatedDevice:
        return AllocatedDevice(
            request=self.request,
            pool=self.pool,
            device=self.device,
            admin_access=self.admin_access,
            share_id=self.share_id,
            consumed_capacity=self.consumed_capacity,
        )


def _shared_device_configs(
    allocations: Sequence[_Allocation], groups: Sequence[tuple[DeviceConfig | None, list[int]]]
) -> list[Mapping[str, Any] | None]:
    """Per allocation: on a device several claims may share (NVIDIA's consumable shares), what its config asks
    of it (`config_settings`); None on other devices. Our `gpu-<minor>-shared` devices are left out: each
    share there has its own limits (its client env on the GPU's shares server)."""
    configs: list[Mapping[str, Any] | None] = [None] * len(allocations)
    for config, indices in groups:
        settings: Mapping[str, Any] = {}  # no config: what the default config asks (config_settings)
        if config is not None:
            from dra_gpu.config.api import config_settings

            settings = config_settings(config)
        for i in indices:
            device = allocations[i].device
            if device.allow_multiple_allocations and device.kind is not DeviceKind.GPU_SHARE:
                configs[i] = settings
    return configs


def _config_text(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True) if config else "no config"


def strip_subrequest(request: str) -> str:
    return request.split("/", 1)[0]


def _answer_from_entry(entry: ClaimEntry) -> PrepareOutcome:
    return PrepareOutcome(
        devices=tuple(
            PreparedDeviceAnswer(
                request_names=(strip_subrequest(d.request),),
                pool=d.pool,
                device=d.device,
                cdi_device_ids=d.cdi_device_ids,
                share_id=d.share_id,
            )
            for d in entry.devices
        )
    )


def _mig_json(instance: MigInstance) -> dict[str, Any]:
    return {
        "parentUUID": instance.parent_uuid,
        "parentMinor": instance.parent_minor,
        "uuid": instance.uuid,
        "profile": instance.profile,
        "giProfileID": instance.gi_profile_id,
        "giID": instance.gi_id,
        "ciID": instance.ci_id,
        "placementStart": instance.placement.start,
        "placementSize": instance.placement.size,
    }


def owned_mig_instances(entries: Iterable[ClaimEntry]) -> set[tuple[str, int, int]]:
    """(parent uuid, gi id, ci id) of every MIG instance this driver created for a checkpointed claim.

    Only what the checkpoint recorded as created counts, never what the device model says: before start-up
    the model is built without knowing which instances are ours, so a leftover of ours shows up in it as a
    static MIG device, possibly under the very name a checkpointed claim was allocated. MIG devices an
    administrator made need no protection here: start-up cleanup destroys only instances the sharing manager
    recorded as created by this driver."""
    owned: set[tuple[str, int, int]] = set()
    for entry in entries:
        for group in entry.groups:
            for mig in group.mig_instances.values():
                owned.add((str(mig["parentUUID"]), int(mig["giID"]), int(mig["ciID"])))
            for data in group.state.get("migCreated") or ():  # the sharing manager's own record of them
                owned.add((str(data["parentUuid"]), int(data["giId"]), int(data["ciId"])))
    return owned


def owned_mig_placements(entries: Iterable[ClaimEntry]) -> frozenset[tuple[str, int]]:
    """(parent uuid, GPU-instance id) of every MIG instance this driver created for a checkpointed claim
    (prepared or being prepared): the device model leaves these as they are (`build_device_model`)."""
    owned: set[tuple[str, int]] = set()
    for entry in entries:
        for group in entry.groups:
            for mig in group.mig_instances.values():
                owned.add((str(mig["parentUUID"]), int(mig["giID"])))
            for data in group.state.get("migCreated") or ():  # the sharing manager's own record of them
                owned.add((str(data["parentUuid"]), int(data["giId"])))
    return frozenset(owned)


class PrepareService:
    def __init__(
        self,
        *,
        node_name: str,
        claims: ClaimReader,
        checkpoints: CheckpointStore,
        cdi: CdiSpecWriter,
        sharing: SharingManager,
        device_model: Callable[[], DeviceModel],
        driver_edits: DriverEdits,
        driver_root: str,
        container_driver_root: str | None = None,
        driver_name: str = DRIVER_NAME,
        pool_name: str | None = None,
        metrics: PluginMetrics | None = None,
        faults: FaultPoints | None = None,
        locks: GpuLocks | None = None,
    ) -> None:
        self.node_name = node_name
        self.pool_name = pool_name or node_name
        self.driver_name = driver_name
        self.claims = claims
        self.checkpoints = checkpoints
        self.cdi = cdi
        self.sharing = sharing
        self.device_model = device_model
        self.driver_edits = driver_edits
        self.driver_root = driver_root  # on the host: what CDI specs name
        # The same files as this process sees them (NVIDIA's chart mounts the host's root at /driver-root).
        self.container_driver_root = container_driver_root or driver_root
        self.metrics = metrics or PluginMetrics()
        self.faults = faults or FaultPoints()
        # Shared with the sharing manager in the plugin; the files exclude a second plugin instance.
        self.locks = locks or GpuLocks(checkpoints.directory)
        self._started = threading.Event()

    # ----------------------------------------------------------------------------------------------- prepare

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
        """One outcome per requested claim UID; never raises for a single claim's failure."""
        outcomes: dict[str, PrepareOutcome] = {}
        for ref in claims:
            if ref.uid in outcomes:
                continue  # the same claim twice in one batch: one answer
            started = time.perf_counter()
            try:
                with self._claim_locked(ref):
                    outcomes[ref.uid] = self._prepare_claim(ref)
                self.metrics.claims.labels("prepare", "ok").inc()
            except ClaimError as exc:
                log.warning("prepare failed", claim=str(ref), reason=exc.reason, error=str(exc))
                self.metrics.claims.labels("prepare", "error").inc()
                self.metrics.errors.labels("prepare", exc.reason).inc()
                outcomes[ref.uid] = PrepareOutcome(error=str(exc))
            except Exception as exc:  # a bug must not fail the batch: report it on the claim
                log.exception("prepare crashed", claim=str(ref))
                self.metrics.claims.labels("prepare", "error").inc()
                self.metrics.errors.labels("prepare", "internal").inc()
                outcomes[ref.uid] = PrepareOutcome(error=f"claim {ref}: internal error: {exc!r}")
            finally:
                self.metrics.claim_duration.labels("prepare").observe(time.perf_counter() - started)
        return outcomes

    @contextlib.contextmanager
    def _locked(self, ref: ClaimRef) -> Iterator[None]:
        """The checkpoint file's lock (short: one read-modify-write); failing to get it is this claim's
        error, not the batch's."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.checkpoints.locked())
            except CheckpointError as exc:
                raise ClaimError("lock_acquire", f"claim {ref}: {exc}") from exc
            yield

    @contextlib.contextmanager
    def _claim_locked(self, ref: ClaimRef) -> Iterator[None]:
        """One call for this claim at a time, before its GPUs are locked (see GpuLocks.claim)."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.locks.claim(ref.uid))
            except GpuLockTimeoutError as exc:
                raise ClaimError("lock_acquire", f"claim {ref}: {exc}") from exc
            yield

    @contextlib.contextmanager
    def _gpus_locked(self, ref: ClaimRef, keys: Iterable[str], shared: Iterable[str] = ()) -> Iterator[None]:
        """The locks of the GPUs a claim touches, for the whole prepare or unprepare of it: `keys` alone,
        `shared` beside other shared holders (see GpuLocks)."""
        with contextlib.ExitStack() as stack:
            started = time.perf_counter()
            try:
                stack.enter_context(self.locks.gpus(keys, shared=shared))
            except GpuLockTimeoutError as exc:
                raise ClaimError("lock_acquire", f"claim {ref}: {exc}") from exc
            finally:
                self.metrics.lock_wait.observe(time.perf_counter() - started)
            yield

    def _gpu_keys(self, entry: ClaimEntry) -> tuple[set[str], set[str]]:
        """The lock keys of a checkpointed claim's devices, (exclusive, shared): their physical GPUs, as a
        prepare takes them from its allocation (a device the node no longer has: its name, exclusive)."""
        by_name = self.device_model().by_name()
        exclusive, shared = gpu_lock_keys(by_name[d.device] for d in entry.devices if d.device in by_name)
        exclusive |= {d.device for d in entry.devices if d.device not in by_name}
        # A client of a GPU's shares server changes that server's clients and caps when it leaves: alone.
        if any(g.state.get("sharedMps") and not g.state["sharedMps"].get("ownDaemon") for g in entry.groups):
            return exclusive | shared, set()
        return exclusive, shared

    def _entry(self, ref: ClaimRef) -> ClaimEntry | None:
        """This claim's entry, a copy of its own (the sharing manager may change group states in place).
        Read without the checkpoint lock: only this claim's calls change its entry, and they are kept apart
        by its claim lock (CheckpointStore.read says why that is enough)."""
        entry = self._read(ref, shared=True).claims.get(ref.uid)
        return None if entry is None else entry.detached()

    def _commit(
        self,
        ref: ClaimRef,
        entry: ClaimEntry | None,
        *,
        check: Callable[[Checkpoint], None] | None = None,
    ) -> None:
        """Record (or with None, drop) this claim's entry, leaving every other claim's as the file has it;
        written together with other claims' commits queued meanwhile (CheckpointStore.update_claim). `check`
        may refuse it (raising ClaimError) on the checkpoint it would change.

        Atomic (a whole file renamed into place) but not fsynced. The records exist to answer a repeated
        prepare and to undo or unprepare what a claim holds after this process restarts, and the page cache
        outlives the process. Only a power loss or a kernel crash outlives the page cache, and either reboots
        the node, which ends everything the records describe (MIG instances, MPS daemons, compute modes, time
        slices): the checkpoint of another boot reads as empty, an unreadable one written before the boot is
        discarded, CDI specs no record names are removed at start, and the kubelet prepares its pods' claims
        again. So the fsyncs (two per write: the file, then its directory; the Go example driver's checkpoint
        does one) would buy nothing while costing every prepare and unprepare."""
        try:
            checkpoint = self.checkpoints.update_claim(ref.uid, entry, durable=False, check=check)
        except CheckpointError as exc:
            raise ClaimError("checkpoint", f"claim {ref}: {exc}") from exc
        self._update_gauges(checkpoint)

    def _completed_answer(self, ref: ClaimRef, entry: ClaimEntry) -> PrepareOutcome | None:
        """The stored answer of a completed claim, its CDI spec written again if it is gone; None when the
        claim was unprepared meanwhile."""
        if self.cdi.has_spec(ref.uid):
            return _answer_from_entry(entry)
        with self._gpus_locked(ref, *self._gpu_keys(entry)):
            current = self._entry(ref)
            if current is None or current.phase is not ClaimPhase.PREPARE_COMPLETED:
                return None
            self._repair_cdi_spec(ref, current)
        return _answer_from_entry(current)

    def _repair_cdi_spec(self, ref: ClaimRef, entry: ClaimEntry) -> None:
        """A completed claim whose CDI spec is gone (deleted by hand, a CDI root on a tmpfs that was cleared):
        the runtime could not start its containers, so write the spec again from the checkpoint. Raises
        ClaimError when that is impossible (a device the node no longer has)."""
        if self.cdi.has_spec(ref.uid):
            return
        by_name = self.device_model().by_name()
        missing = [d.device for d in entry.devices if d.device not in by_name]
        if missing:
            raise ClaimError(
                "cdi",
                f"claim {ref}: CDI spec {self.cdi.path_for(ref.uid)} is missing and cannot be rebuilt: node "
                f"{self.node_name} no longer has device(s) {', '.join(missing)} "
                "(delete and recreate the claim)",
            )
        edits: dict[str, CdiEdits] = {}
        mig_ids: dict[str, tuple[int, int, str, int]] = {}
        try:
            for group in entry.groups:
                # Entries written before `cdiEdits` existed: the sharing manager's state has the same shape.
                group_edits = edits_from_json(group.cdi_edits or group.state.get("edits") or {})
                for name in group.devices:
                    edits.setdefault(name, group_edits)
                for name, mig in group.mig_instances.items():
                    mig_ids[name] = (
                        int(mig["giID"]),
                        int(mig["ciID"]),
                        str(mig.get("uuid") or ""),
                        int(mig.get("parentMinor", -1)),
                    )
        except (KeyError, TypeError, ValueError) as exc:
            raise ClaimError(
                "checkpoint",
                f"claim {ref}: CDI spec missing, and its checkpoint entry is malformed ({exc!r})",
            ) from exc
        log.warning("CDI spec of a prepared claim is missing; rewriting it", claim=str(ref))
        self._write_spec(ref, [by_name[d.device] for d in entry.devices], edits, mig_ids)

    def _read(self, ref: ClaimRef, *, shared: bool = False) -> Checkpoint:
        try:
            return self.checkpoints.read(shared=shared)
        except CheckpointError as exc:
            raise ClaimError("checkpoint", f"claim {ref}: {exc}") from exc

    def _update_gauges(self, checkpoint: Checkpoint) -> None:
        self.metrics.prepared_claims.set(len(checkpoint.claims))
        self.metrics.prepared_devices.set(sum(len(e.devices) for e in checkpoint.claims.values()))

    def _prepare_claim(self, ref: ClaimRef) -> PrepareOutcome:
        left = self._entry(ref)
        if left is not None and left.phase is ClaimPhase.PREPARE_COMPLETED:
            done = self._completed_answer(ref, left)
            if done is not None:
                return done
            left = self._entry(ref)
        claim = self._fetch(ref)
        allocations, raw_configs = self._our_allocations(ref, claim)
        groups = self._resolve(ref, allocations, raw_configs)
        configs = _shared_device_configs(allocations, groups)
        modes = self._share_modes(ref, allocations, groups)
        # Fractional shares of one GPU are prepared one at a time (gpu_lock_keys: each joins its server).
        keys, shared = gpu_lock_keys(a.device for a in allocations)
        if left is not None:  # the same UID has the same allocation, but a leftover's devices count too
            left_keys, left_shared = self._gpu_keys(left)
            keys, shared = keys | left_keys, shared | left_shared
        with self._gpus_locked(ref, keys, shared):
            entry = self._entry(ref)
            if entry is not None and entry.phase is ClaimPhase.PREPARE_COMPLETED:
                return _answer_from_entry(entry)  # a concurrent call finished it meanwhile
            if entry is not None:
                log.info("rolling back interrupted prepare", claim=str(ref))
                self._roll_back(ref, entry)
            entry = ClaimEntry(
                uid=ref.uid,
                namespace=ref.namespace,
                name=ref.name,
                phase=ClaimPhase.PREPARE_STARTED,
                devices=tuple(
                    PreparedDevice(
                        request=a.request,
                        pool=a.pool,
                        device=a.device.name,
                        admin_access=a.admin_access,
                        share_id=a.share_id,
                        config=config,
                    )
                    for a, config in zip(allocations, configs, strict=True)
                ),
            )

            def refuse_double_use(checkpoint: Checkpoint) -> None:
                self._refuse_double_use(ref, checkpoint, allocations, configs, modes)

            as_they_are = all(
                takes_devices_as_they_are(config, [allocations[i].as_allocated() for i in indices])
                for config, indices in groups
            )
            if not as_they_are:
                # The check and the reservation in one update of the file (not fsynced: see _commit), before
                # anything is changed.
                self._commit(ref, entry, check=refuse_double_use)
            # Else nothing will change but the claim's CDI spec, so the check goes with the completed entry:
            # one checkpoint write for the prepare of a whole GPU. A crash before it leaves a spec no record
            # names, which the next start removes; a refusal then removes the spec (rollback).
            self.faults.reached("prepare-started")
            progress = _Progress(entry)
            try:
                return self._apply(
                    ref, progress, allocations, groups, check=refuse_double_use if as_they_are else None
                )
            except Exception as failure:  # whatever went wrong, undo what was done before answering
                self._roll_back_after_failure(ref, progress.entry, failure)
                raise

    def _fetch(self, ref: ClaimRef) -> ClaimJson:
        started = time.perf_counter()
        try:
            claim = self.claims.get(ref.namespace, ref.name)
        except ClaimReadError as exc:
            raise ClaimError("apiserver", f"claim {ref}: {exc}") from exc
        finally:
            self.metrics.apiserver_wait.observe(time.perf_counter() - started)
        if claim is None:
            raise ClaimError(
                "not_found",
                f"claim {ref}: ResourceClaim {ref.namespace}/{ref.name} not found in the API server",
            )
        uid = claim.get("metadata", {}).get("uid")
        if uid != ref.uid:
            raise ClaimError(
                "uid_mismatch",
                f"claim {ref}: the API server has UID {uid}; the claim was deleted and replaced",
            )
        if not (claim.get("status") or {}).get("allocation"):
            raise ClaimError("not_allocated", f"claim {ref}: not allocated (status.allocation is empty)")
        return claim

    def _our_allocations(
        self, ref: ClaimRef, claim: ClaimJson
    ) -> tuple[list[_Allocation], list[Mapping[str, Any]]]:
        devices_status = claim["status"]["allocation"].get("devices") or {}
        by_name = self.device_model().by_name()
        allocations: list[_Allocation] = []
        for index, result in enumerate(devices_status.get("results") or ()):
            if result.get("driver") != self.driver_name:
                continue
            where = f"status.allocation.devices.results[{index}]"
            pool, name = str(result.get("pool", "")), str(result.get("device", ""))
            if pool != self.pool_name:
                raise ClaimError(
                    "wrong_node",
                    f"claim {ref}: {where} is from pool {pool!r}, but this node ({self.node_name}) "
                    f"serves pool {self.pool_name!r}",
                )
            device = by_name.get(name)
            if device is None:
                raise ClaimError(
                    "unknown_device",
                    f"claim {ref}: {where} names device {name!r}, which node {self.node_name} does not have "
                    "(the node's devices changed after allocation: delete and recreate the claim)",
                )
            consumed = {str(k): str(v) for k, v in (result.get("consumedCapacity") or {}).items()}
            allocations.append(
                _Allocation(
                    request=str(result.get("request", "")),
                    pool=pool,
                    device=device,
                    admin_access=bool(result.get("adminAccess") or False),
                    share_id=result.get("shareID"),
                    consumed_capacity=consumed,
                )
            )
        if not allocations:
            raise ClaimError(
                "no_devices", f"claim {ref}: the allocation has no device of driver {self.driver_name}"
            )
        return allocations, list(devices_status.get("config") or ())

    def _resolve(
        self, ref: ClaimRef, allocations: Sequence[_Allocation], raw_configs: Sequence[Mapping[str, Any]]
    ) -> list[tuple[DeviceConfig | None, list[int]]]:
        try:
            entries = ordered_config_entries(raw_configs, driver=self.driver_name)
            refs = [ResultRef(a.request, a.device.name, a.device.kind) for a in allocations]
            return [(g.config, list(g.results)) for g in resolve_configs(refs, entries)]
        except ConfigResolutionError as exc:
            raise ClaimError("config", f"claim {ref}: {exc}") from exc

    @staticmethod
    def _share_modes(
        ref: ClaimRef,
        allocations: Sequence[_Allocation],
        groups: Sequence[tuple[DeviceConfig | None, list[int]]],
    ) -> Mapping[str, ShareMode]:
        """Device name -> how this claim's consumable share of that whole GPU will be served (share_modes)."""
        devices = [a.as_allocated() for a in allocations]
        modes = planned_modes(devices, groups)
        mixed = mixed_in_one_claim(devices, modes)
        if mixed is not None:
            raise ClaimError("device_sharing_conflict", f"claim {ref}: {mixed}")
        return modes_by_name(devices, modes)

    def _refuse_double_use(
        self,
        ref: ClaimRef,
        checkpoint: Checkpoint,
        allocations: Sequence[_Allocation],
        configs: Sequence[Mapping[str, Any] | None],
        modes: Mapping[str, ShareMode],
    ) -> None:
        """Refuse a device another claim holds; on a device several claims share, also refuse another config
        than the holder's (`configs`, per allocation): the GPU-wide settings of one claim (a time-slice
        interval) would change the other's. NVIDIA's driver refuses it too. A consumable share of a whole GPU
        is also refused when it would take the GPU another way (MPS client or plain device, `modes`) than a
        claim already on it: one of the two workloads could not run (share_modes). Admin access takes devices
        as they are, on either side."""
        by_name = self.device_model().by_name()
        for uid, other in checkpoint.claims.items():
            if uid == ref.uid:
                continue
            for held in other.devices:
                if held.admin_access:
                    continue
                held_device = by_name.get(held.device)
                for alloc, config in zip(allocations, configs, strict=True):
                    if alloc.admin_access:
                        continue
                    clash = (
                        devices_conflict(alloc.device, held_device)
                        if held_device is not None
                        else alloc.device.name == held.device
                    )
                    if clash:
                        raise ClaimError(
                            "device_in_use",
                            f"claim {ref}: requested device {alloc.device.name} is already allocated to "
                            f"different claim {other.ref} ({uid}) as {held.device}",
                        )
                    theirs = held.config
                    if alloc.device.name != held.device or config is None or theirs in (None, config):
                        continue
                    raise ClaimError(
                        "device_config_conflict",
                        f"claim {ref}: requested device {held.device} has conflicting configuration with "
                        f"already prepared claim {other.ref} ({uid}): it has {_config_text(theirs)}, this "
                        f"claim asks for {_config_text(config)}; claims that share a device must give it the "
                        "same config (or none)",
                    )
            # after the config check: a config that differs is what NVIDIA's driver names too
            for device_name, held_mode in held_modes(other).items():
                mode = modes.get(device_name)
                if mode is not None and mode is not held_mode:
                    why = conflict_message(device_name, mode, f"{other.ref} ({uid})", held_mode)
                    raise ClaimError("device_sharing_conflict", f"claim {ref}: {why}")

    def _apply(
        self,
        ref: ClaimRef,
        progress: _Progress,
        allocations: Sequence[_Allocation],
        groups: Sequence[tuple[DeviceConfig | None, list[int]]],
        check: Callable[[Checkpoint], None] | None = None,
    ) -> PrepareOutcome:
        """Prepare the groups, write the CDI spec, record the completed entry (`check` may refuse it)."""
        group_edits: dict[int, CdiEdits] = {}
        created_mig: dict[str, MigInstance] = {}
        for group_index, (config, indices) in enumerate(groups):
            members = [allocations[i] for i in indices]
            try:
                result: GroupResult = self.sharing.prepare_group(
                    ref.uid, config, [a.as_allocated() for a in members]
                )
            except SharingError as exc:
                # its own reason, so dra_gpu_claim_errors_total{reason="registry_unreadable"} can alert on it
                reason = "registry_unreadable" if isinstance(exc, RegistryUnreadableError) else "sharing"
                raise ClaimError(reason, f"claim {ref}: {exc}") from exc
            except Exception as exc:
                raise ClaimError("sharing", f"claim {ref}: sharing setup failed: {exc!r}") from exc
            self.faults.reached(f"prepare-group-{group_index}-applied")
            created_mig.update(result.mig_instances)
            for i in indices:
                group_edits[i] = result.edits
            # In `progress` before it is written: a failed write still undoes this group.
            progress.entry = _with_group(
                progress.entry,
                PreparedGroup(
                    devices=tuple(a.device.name for a in members),
                    state=dict(result.state),
                    mig_instances={k: _mig_json(v) for k, v in result.mig_instances.items()},
                    cdi_edits=edits_to_json(result.edits),
                ),
            )
            if result.undo_needed:
                # Recorded before the next step, so that a crash from here on undoes it. A group that changed
                # nothing goes into the checkpoint with the completed entry instead: a crash before that
                # leaves nothing of it to undo, and the prepare writes the file once less.
                self._commit(ref, progress.entry)
            self.faults.reached(f"prepare-group-{group_index}")

        edits_by_name: dict[str, CdiEdits] = {}
        for index in sorted(group_edits):  # a device in two requests: the edits of its first one
            edits_by_name.setdefault(allocations[index].device.name, group_edits[index])
        mig_ids = {name: (m.gi_id, m.ci_id, m.uuid, m.parent_minor) for name, m in created_mig.items()}
        self._write_spec(ref, [a.device for a in allocations], edits_by_name, mig_ids)
        self.faults.reached("prepare-cdi-written")

        entry = progress.entry
        completed = replace(
            entry,
            phase=ClaimPhase.PREPARE_COMPLETED,
            devices=tuple(
                replace(d, cdi_device_ids=(cdi_device_id(ref.uid, d.device),)) for d in entry.devices
            ),
        )
        self._commit(ref, completed, check=check)
        self.faults.reached("prepare-completed")
        return _answer_from_entry(completed)

    def _write_spec(
        self,
        ref: ClaimRef,
        devices: Sequence[Device],
        edits: Mapping[str, CdiEdits],
        mig_ids: Mapping[str, tuple[int, int, str, int]],
    ) -> None:
        """Build and write the claim's CDI spec. `edits`: device name -> its group's edits; `mig_ids`: device
        name -> (gi id, ci id, uuid) of the MIG instances created for the claim."""
        spec = build_claim_spec(
            ref.uid,
            f"{ref.namespace}/{ref.name}",
            self._claim_devices(ref, devices, edits, mig_ids),
            self.driver_edits,
        )
        try:
            self.cdi.write(ref.uid, spec)
        except (CdiWriteError, CdiSpecError) as exc:
            raise ClaimError("cdi", f"claim {ref}: {exc}") from exc

    def _claim_devices(
        self,
        ref: ClaimRef,
        allocated: Sequence[Device],
        edits: Mapping[str, CdiEdits],
        mig_ids: Mapping[str, tuple[int, int, str, int]],
    ) -> list[ClaimDevice]:
        devices: dict[str, ClaimDevice] = {}
        for device in allocated:
            if device.name in devices:
                continue  # the same shared device in two requests: one CDI device
            # Device nodes carry host paths (the runtime reads the spec on the host); capability files are
            # read here, inside the plugin's container.
            minor = device.parent_minor
            if device.name in mig_ids and mig_ids[device.name][3] >= 0:
                # the GPU's minor as the MIG instance was created: switching MIG mode on may renumber it
                # (nvml.h, nvmlDeviceSetMigMode), and the published device still carries the old one
                minor = mig_ids[device.name][3]
            nodes = gpu_device_nodes(self.driver_root, minor)
            uuids: tuple[str, ...] = (device.parent_uuid,)
            if device.kind in (DeviceKind.MIG_STATIC, DeviceKind.MIG_DYNAMIC):
                gi_ci = self._mig_ids(ref, device, mig_ids)
                try:
                    caps = mig_capability_minors(self.container_driver_root, minor, *gi_ci[:2])
                except MigCapabilityError as exc:
                    raise ClaimError("cdi", f"claim {ref}: device {device.name}: {exc}") from exc
                nodes = nodes + mig_capability_nodes(self.driver_root, caps)
                uuids = (gi_ci[2],) if gi_ci[2] else uuids
            devices[device.name] = ClaimDevice(
                name=device.name,
                uuids=uuids,
                device_nodes=nodes,
                group_edits=edits.get(device.name, CdiEdits()),
            )
        return list(devices.values())

    @staticmethod
    def _mig_ids(
        ref: ClaimRef, device: Device, created: Mapping[str, tuple[int, int, str, int]]
    ) -> tuple[int, int, str]:
        ids = created.get(device.name)
        if ids is not None:
            return ids[:3]
        mig = device.mig
        if mig is None or mig.gi_id is None or mig.ci_id is None:
            raise ClaimError(
                "sharing",
                f"claim {ref}: MIG device {device.name} has no instance: it was neither created by the "
                "sharing manager nor exists on the GPU",
            )
        return mig.gi_id, mig.ci_id, mig.uuid or ""

    # ------------------------------------------------------------------------------------------- rollback

    def _roll_back_after_failure(self, ref: ClaimRef, entry: ClaimEntry, failure: Exception) -> None:
        try:
            self._roll_back(ref, entry)
        except ClaimError as exc:
            # The entry stays PrepareStarted with what is left to undo; a retry or the stale-claim pass
            # finishes the job.
            log.error("rollback incomplete", claim=str(ref), error=str(exc), cause=str(failure))

    def _roll_back(self, ref: ClaimRef, entry: ClaimEntry) -> None:
        """Undo a claim's groups (newest first), remove its CDI file, drop its entry. The caller holds the
        claim's GPU locks. Raises ClaimError."""
        remaining = list(entry.groups)
        try:
            while remaining:
                group = remaining[-1]
                self.sharing.unprepare_group(ref.uid, group.state)
                remaining.pop()
                self.faults.reached(f"unprepare-group-{len(remaining)}")
        except Exception as exc:
            # Back to PrepareStarted: the claim is half undone, so a later Prepare must not answer from the
            # checkpoint but finish the rollback and prepare again.
            self._commit_quietly(ref, _replace_groups(entry, remaining, ClaimPhase.PREPARE_STARTED))
            raise ClaimError("sharing", f"claim {ref}: undoing sharing setup failed: {exc}") from exc
        try:
            self.cdi.remove(ref.uid)
        except OSError as exc:
            log.warning("removing CDI spec failed", claim=str(ref), error=str(exc))
        self.faults.reached("unprepare-cdi-removed")
        self._commit(ref, None)

    def _commit_quietly(self, ref: ClaimRef, entry: ClaimEntry) -> None:
        try:
            self._commit(ref, entry)
        except ClaimError as exc:
            log.error("checkpoint update failed during rollback", claim=str(ref), error=str(exc))

    # --------------------------------------------------------------------------------------------- unprepare

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> error ("" on success). Unpreparing an unknown claim succeeds."""
        errors: dict[str, str] = {}
        for ref in claims:
            if ref.uid in errors:
                continue
            started = time.perf_counter()
            try:
                with self._claim_locked(ref):
                    self._unprepare_claim(ref)
                errors[ref.uid] = ""
                self.metrics.claims.labels("unprepare", "ok").inc()
            except ClaimError as exc:
                log.warning("unprepare failed", claim=str(ref), reason=exc.reason, error=str(exc))
                self.metrics.claims.labels("unprepare", "error").inc()
                self.metrics.errors.labels("unprepare", exc.reason).inc()
                errors[ref.uid] = str(exc)
            except Exception as exc:
                log.exception("unprepare crashed", claim=str(ref))
                self.metrics.claims.labels("unprepare", "error").inc()
                self.metrics.errors.labels("unprepare", "internal").inc()
                errors[ref.uid] = f"claim {ref}: internal error: {exc!r}"
            finally:
                self.metrics.claim_duration.labels("unprepare").observe(time.perf_counter() - started)
        return errors

    def _unprepare_claim(self, ref: ClaimRef) -> None:
        # Read without the checkpoint lock first (this claim's calls are kept apart by its claim lock, see
        # `_entry`): a claim that has an entry needs the lock only for its final update.
        entry = self._entry(ref)
        if entry is None:
            with self._locked(ref):
                entry = self._entry(ref)
                if entry is None:
                    # A leftover from an interrupted earlier attempt, if any. No prepare of this claim runs
                    # meanwhile in this process (its claim lock is held). Across processes, a prepare that
                    # reserves writes its spec only after its `PrepareStarted` update, seen here under the
                    # checkpoint lock; one that takes its devices as they are records nothing before its spec,
                    # and the kubelet does not unprepare a claim while a prepare of it is in flight.
                    self.cdi.remove(ref.uid)
                    return
        with self._gpus_locked(ref, *self._gpu_keys(entry)):
            entry = self._entry(ref)  # a concurrent call for the same claim may have finished meanwhile
            if entry is None:
                return
            if entry.phase is ClaimPhase.PREPARE_COMPLETED and entry.groups:
                # Undoing starts: record it first. Killed halfway (a time-slice reset, a daemon stopped), a
                # completed entry would stay, and a repeated prepare would answer from it for a claim that
                # no longer has what the answer promises (found by the soak, tests/soak). Started, the
                # prepare finishes the undo and prepares again.
                entry = _replace_groups(entry, entry.groups, ClaimPhase.PREPARE_STARTED)
                self._commit(ref, entry)
            self._roll_back(ref, entry)

    # ------------------------------------------------------------------------------------ start-up and GC

    def warm_up(self) -> None:
        """Load what the first prepare needs and start-up did not (the API's claim client), so that prepare
        does not pay for it. Called in a thread once the sockets serve."""
        self.claims.warm_up()

    def start(self) -> None:
        """Clean up after a crash or reboot: unowned MIG instances, MPS daemons (unowned ones stopped, needed
        ones restarted), CDI files of claims no longer prepared."""
        with self.locks.node(), self.checkpoints.locked():
            checkpoint = self.checkpoints.read()
            if checkpoint.previous_boot_claims:
                log.info(
                    "checkpoint is from before a reboot; starting empty",
                    claims=sorted(checkpoint.previous_boot_claims),
                )
                self.checkpoints.write(checkpoint)
            owned = owned_mig_instances(checkpoint.claims.values())
            try:
                destroyed = self.sharing.destroy_unowned_mig(owned)
            except Exception as exc:  # serve anyway: leftover MIG devices only cost capacity
                log.error("destroying leftover MIG instances failed", error=str(exc))
                destroyed = []
            if destroyed:
                log.info("destroyed MIG instances no claim owns", instances=destroyed)
            try:  # a crash between recording a time-slice holder and checkpointing its claim
                reset = self.sharing.release_unowned_time_slices(
                    {uid: [g.state for g in e.groups] for uid, e in checkpoint.claims.items()}
                )
            except Exception as exc:  # serve anyway; the error names the GPU
                log.error("resetting leftover time-slice intervals failed", error=str(exc))
                reset = []
            if reset:
                log.info("reset time-slice intervals no claim holds", gpus=reset)
            self._recover_mps([g.state for e in checkpoint.claims.values() for g in e.groups])
            for uid in self.cdi.claim_uids() - set(checkpoint.claims):
                log.info("removing leftover CDI spec", claim_uid=uid)
                self.cdi.remove(uid)
            self._update_gauges(checkpoint)
        self._started.set()

    def _recover_mps(self, states: Sequence[Mapping[str, Any]]) -> None:
        """MPS daemons after a restart: stop the ones no group owns (a crash between starting one and
        checkpointing its group), then restart the ones prepared claims still use but that died with the
        plugin's container. Failures are logged, not fatal: containers of other claims still need serving."""
        try:
            stopped = self.sharing.stop_unowned_mps(states)
        except Exception as exc:
            log.error("stopping leftover MPS daemons failed", error=str(exc))
            stopped = []
        if stopped:
            log.info("stopped MPS daemons no claim owns", daemons=stopped)
        try:
            revived = self.sharing.revive_mps(states)
        except Exception as exc:
            log.error("restarting MPS daemons of prepared claims failed", error=str(exc))
            revived = []
        if revived:
            log.info("restarted MPS daemons of prepared claims", daemons=revived)

    def cleanup_stale_claims(self) -> list[str]:
        """Unprepare `PrepareStarted` claims whose ResourceClaim is gone or replaced. Returns their UIDs."""
        with self.checkpoints.locked():
            started = [
                e for e in self.checkpoints.read().claims.values() if e.phase is ClaimPhase.PREPARE_STARTED
            ]
        cleaned: list[str] = []
        for entry in started:
            ref = ClaimRef(entry.namespace, entry.uid, entry.name)
            try:
                claim = self.claims.get(entry.namespace, entry.name)
            except ClaimReadError as exc:
                log.warning("stale-claim check skipped", claim=str(ref), error=str(exc))
                continue
            if claim is not None and claim.get("metadata", {}).get("uid") == entry.uid:
                continue
            try:
                with self._claim_locked(ref), self._gpus_locked(ref, *self._gpu_keys(entry)):
                    current = self._entry(ref)
                    if current is None or current.phase is not ClaimPhase.PREPARE_STARTED:
                        continue
                    self._roll_back(ref, current)
                cleaned.append(entry.uid)
                log.info("unprepared stale claim", claim=str(ref))
            except ClaimError as exc:
                log.warning("stale claim cleanup failed", claim=str(ref), error=str(exc))
        return cleaned

    def prepared_group_states(self) -> list[Mapping[str, Any]]:
        """The sharing states of every checkpointed group (for the MPS reconcile loop), read under the
        checkpoint lock. Raises CheckpointError."""
        with self.checkpoints.locked():
            return [g.state for e in self.checkpoints.read().claims.values() for g in e.groups]

    def owned_mig_placements(self) -> frozenset[tuple[str, int]]:
        """(parent uuid, GPU-instance id) of the MIG instances our checkpointed claims own, read in a
        node-wide section (so never in the middle of a prepare or unprepare). Raises CheckpointError or
        GpuLockTimeoutError."""
        with self.locks.node(), self.checkpoints.locked():
            return owned_mig_placements(self.checkpoints.read().claims.values())

    @property
    def started(self) -> bool:
        return self._started.is_set()


@dataclass
class _Progress:
    """How far a prepare got: the claim's entry with every group prepared so far, written or not."""

    entry: ClaimEntry


def _with_group(entry: ClaimEntry, group: PreparedGroup) -> ClaimEntry:
    return _replace_groups(entry, [*entry.groups, group])


def _replace_groups(
    entry: ClaimEntry, groups: Sequence[PreparedGroup], phase: ClaimPhase | None = None
) -> ClaimEntry:
    return replace(entry, phase=phase or entry.phase, groups=tuple(groups))
