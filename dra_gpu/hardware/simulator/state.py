"""The simulator's persistent state: one JSON file guarded by an fcntl lock.

Everything that can change on real hardware (MIG mode, GPU/compute instances, compute mode, time-slice,
injected faults, the processes holding a context on a GPU or MIG device) lives here, so the plugin, the fake
`nvidia-smi`/`nvidia-cuda-mps-control` and the tests in other processes all see one machine. What cannot
change (the GPUs themselves) is derived from `hardware` + `seed` through `dra_gpu.hardware.profiles`. The fake
MPS control daemons keep their records in files of their own beside this one (sim_tools/mps_records.py): they
change with every command, and this file does not have to.

Writes replace the file atomically (write to a temporary file, then rename) under an exclusive lock on a
separate lock file and bump a write counter kept in that lock file; reads take a shared lock and reuse the
parsed state while the counter is unchanged (file timestamps are too coarse to tell two quick writes apart),
which keeps discovery of a DGX at a few milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dra_gpu.file_lock import file_locked
from dra_gpu.hardware import profiles

STATE_FORMAT = 1


@dataclass
class ComputeInstanceState:
    ci_id: int
    profile_id: int  # NVML_COMPUTE_INSTANCE_PROFILE_* (the CI profile id equals the enum)
    slice_count: int
    uuid: str  # the MIG device UUID of this compute instance


@dataclass
class GpuInstanceState:
    gi_id: int
    profile_id: int  # GI profile id (info.id: 19, 20, 15, ...)
    start: int
    size: int
    compute_instances: list[ComputeInstanceState] = field(default_factory=list)


@dataclass
class GpuState:
    uuid: str
    mig_current: bool = False
    mig_pending: bool = False
    compute_mode: int = 0
    timeslice: int = 0  # nvidia-smi compute-policy --set-timeslice value (0 = default)
    gpu_instances: list[GpuInstanceState] = field(default_factory=list)
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: what the driver asks for after an error (0 = none); reset clears it
    recovery_action: int = 0
    # The device minor number once a MIG mode switch has renumbered the GPU (None: the layout's own). nvml.h,
    # nvmlDeviceSetMigMode: the switch "may unbind or reset the device ... attributes associated with the
    # device, such as minor number, might change. The caller of this API is expected to query such attributes
    # again."
    minor: int | None = None


# What holds a context on a GPU or MIG device. "compute" (a CUDA process) and "mps-server" are what NVML lists
# in nvmlDeviceGetComputeRunningProcesses (nvidia-smi type C), "mps-client" in
# nvmlDeviceGetMPSComputeRunningProcesses (type M+C), "graphics" in nvmlDeviceGetGraphicsRunningProcesses.
CONTEXT_KINDS = ("compute", "mps-server", "mps-client", "graphics")
# Kinds that own a context of their own on the device: an MPS client runs inside its server's context, so
# only these count against compute mode EXCLUSIVE_PROCESS (MPS guide: the server is the one process that opens
# a GPU in that mode).
OWN_CONTEXT_KINDS = ("compute", "mps-server", "graphics")


@dataclass
class ContextState:
    """A process `pid` with a context on `device_uuid` (a GPU UUID or a MIG device UUID)."""

    device_uuid: str
    pid: int
    kind: str = "compute"


@dataclass
class Fault:
    """Make `function` fail with NVML error `error` for the GPU at `gpu_index` ("*" = every function).

    `delay_s` > 0: the call first takes that long (a slow MIG creation, a driver busy with a reset); with
    `error` 0 (NVML_SUCCESS) it then goes on normally, so latency can be injected without a failure.
    """

    gpu_index: int
    function: str
    error: int
    delay_s: float = 0.0


@dataclass
class SimEvent:
    """An NVML event waiting to be delivered to the event sets registered for its GPU (`seq` orders them)."""

    seq: int
    gpu_index: int
    event_type: int  # nvmlEventType* bit
    data: int  # the XID for nvmlEventTypeXidCriticalError
    gi_id: int  # 0xFFFFFFFF: the whole GPU
    ci_id: int


MAX_EVENTS = 256  # older events are dropped; an event set only sees events raised after it registered


@dataclass
class SimState:
    hardware: str
    seed: str
    gpus: list[GpuState]
    mig_serial: int = 0  # bumps on every MIG device creation, so re-created devices get new UUIDs
    resets: int = 0
    faults: list[Fault] = field(default_factory=list)
    events: list[SimEvent] = field(default_factory=list)
    event_seq: int = 0  # seq of the last event raised
    contexts: list[ContextState] = field(default_factory=list)
    # Renumber a GPU's minor when a MIG mode switch takes effect (nvml.h allows it; off by default so that
    # device names, which carry the minor, stay put in tests that do not ask for it)
    renumber_on_mig_switch: bool = False
    format: int = STATE_FORMAT

    def layout(self) -> profiles.NodeLayout:
        return profiles.resolve_layout(self.hardware)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> SimState:
        gpus = [
            GpuState(
                uuid=g["uuid"],
                mig_current=g["mig_current"],
                mig_pending=g["mig_pending"],
                compute_mode=g["compute_mode"],
                timeslice=g["timeslice"],
                recovery_action=g.get("recovery_action", 0),
                minor=g.get("minor"),
                gpu_instances=[
                    GpuInstanceState(
                        gi_id=gi["gi_id"],
                        profile_id=gi["profile_id"],
                        start=gi["start"],
                        size=gi["size"],
                        compute_instances=[ComputeInstanceState(**ci) for ci in gi["compute_instances"]],
                    )
                    for gi in g["gpu_instances"]
                ],
            )
            for g in data["gpus"]
        ]
        return SimState(
            hardware=data["hardware"],
            seed=data["seed"],
            gpus=gpus,
            mig_serial=data.get("mig_serial", 0),
            resets=data.get("resets", 0),
            faults=[Fault(**f) for f in data.get("faults", [])],
            events=[SimEvent(**e) for e in data.get("events", [])],
            event_seq=data.get("event_seq", 0),
            contexts=[ContextState(**c) for c in data.get("contexts", [])],
            renumber_on_mig_switch=data.get("renumber_on_mig_switch", False),
            format=data.get("format", STATE_FORMAT),
        )


def raise_event(state: SimState, gpu_index: int, event_type: int, data: int, gi_id: int, ci_id: int) -> None:
    """Append an event to `state` (inside a transaction), keeping the last MAX_EVENTS."""
    state.event_seq += 1
    state.events.append(SimEvent(state.event_seq, gpu_index, event_type, data, gi_id, ci_id))
    del state.events[:-MAX_EVENTS]


def device_uuids(gpu: GpuState, gi_id: int | None = None, ci_id: int | None = None) -> set[str]:
    """The GPU's UUID and its MIG devices' (all, those of GPU instance `gi_id`, or one compute instance)."""
    found = {gpu.uuid} if gi_id is None else set()
    for gi in gpu.gpu_instances:
        if gi_id is None or gi.gi_id == gi_id:
            found.update(c.uuid for c in gi.compute_instances if ci_id is None or c.ci_id == ci_id)
    return found


def contexts_on(state: SimState, uuids: set[str]) -> list[ContextState]:
    return [c for c in state.contexts if c.device_uuid in uuids]


def renumber_minor(state: SimState, gpu: GpuState, layout_minors: list[int]) -> None:
    """A MIG mode switch unbound and re-bound the GPU: it takes the lowest minor above every one in use."""
    used = [g.minor if g.minor is not None else m for g, m in zip(state.gpus, layout_minors, strict=True)]
    gpu.minor = max(used) + 1


def fresh_state(hardware: str, seed: str) -> SimState:
    """Power-on state: MIG disabled, no instances, default compute mode and time-slice."""
    layout = profiles.resolve_layout(hardware)
    gpus = [GpuState(uuid=g.uuid) for g in profiles.simulated_gpus(layout, seed)]
    return SimState(hardware=hardware, seed=seed, gpus=gpus)


class StateError(RuntimeError):
    pass


class StateStore:
    """Locked access to one state file. Safe across processes (fcntl) and threads (a process-local lock).

    The state stands in for the kernel driver, which a CUDA process of any uid reaches through /dev/nvidia*: a
    tenant's non-root process opens a context on a GPU (contexts.py) as a root one does. So the files are
    readable and writable by every uid (a simulator's test hosts only: nothing here guards real hardware)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._thread_lock = threading.RLock()
        self._cache_key: tuple[int, int] | None = None
        self._lock_fd: int | None = None
        self._cache: SimState | None = None

    def exists(self) -> bool:
        return self.path.is_file()

    def initialize(self, hardware: str, seed: str, *, force: bool = False) -> SimState:
        """Create the state file for `hardware` unless one exists for the same hardware (then keep it)."""
        with self._locked(exclusive=True):
            if self.path.is_file() and not force:
                current = self._load_unlocked()
                if current.hardware != hardware or current.seed != seed:
                    raise StateError(
                        f"{self.path} already simulates hardware {current.hardware!r} "
                        f"(seed {current.seed!r}), "
                        f"not {hardware!r} (seed {seed!r}); pass force=True (--force) to start over"
                    )
                return current
            state = fresh_state(hardware, seed)
            self._save_unlocked(state)
            return state

    def read(self) -> SimState:
        """The current state. Callers must not mutate it (it is shared with later reads)."""
        with self._locked(exclusive=False):
            return self._load_unlocked()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[SimState]:
        """Exclusive read-modify-write: mutate the yielded state; it is saved when the block exits
        normally."""
        with self._locked(exclusive=True):
            state = SimState.from_json(self._load_unlocked().to_json())  # private copy
            yield state
            self._save_unlocked(state)

    @contextlib.contextmanager
    def _locked(self, *, exclusive: bool) -> Iterator[None]:
        with self._thread_lock, file_locked(self._lock_path, exclusive=exclusive, mode=0o666) as fd:
            if os.fstat(fd).st_mode & 0o777 != 0o666:  # the umask took bits away at creation
                with contextlib.suppress(PermissionError):
                    os.fchmod(fd, 0o666)
            self._lock_fd = fd
            try:
                yield
            finally:
                self._lock_fd = None

    def _load_unlocked(self) -> SimState:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise StateError(
                f"simulator state {self.path} does not exist: run 'dra-gpu hardware init-sim' first"
            ) from None
        key = (st.st_ino, self._write_counter())
        if self._cache is not None and self._cache_key == key:
            return self._cache
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise StateError(f"simulator state {self.path} is unreadable: {err}") from err
        if data.get("format") != STATE_FORMAT:
            raise StateError(
                f"simulator state {self.path} has format {data.get('format')}, expected {STATE_FORMAT}"
            )
        state = SimState.from_json(data)
        self._cache, self._cache_key = state, key
        return state

    def _save_unlocked(self, state: SimState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.parent.stat().st_mode & 0o1777 != 0o1777:  # others' processes write temp files here
            with contextlib.suppress(PermissionError):
                self.path.parent.chmod(0o1777)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state.to_json(), indent=1, sort_keys=True))
        tmp.chmod(0o666)
        os.replace(tmp, self.path)
        self._cache, self._cache_key = None, None
        assert self._lock_fd is not None
        os.pwrite(self._lock_fd, str(self._write_counter() + 1).encode().ljust(20), 0)

    def _write_counter(self) -> int:
        assert self._lock_fd is not None
        raw = os.pread(self._lock_fd, 20, 0).strip()
        return int(raw) if raw else 0
