"""Crash-safe record of which claims this node has prepared, and how.

One JSON file (`checkpoint.json` in the plugin directory) holds, per claim UID, a two-phase state:
`PrepareStarted` (written before anything is changed on the node: the devices are reserved; a prepare that
changes nothing but its CDI spec skips it) and
`PrepareCompleted` (everything done, the response is stored so a repeated Prepare returns it unchanged). Each
sharing group's `state` is recorded as soon as the group is prepared, so an interrupted Prepare can be undone
after a restart.

Guarantees:
- Atomic replacement: temp file in the same directory, rename (with `durable`, fsync of the file before and
  of the directory after; the prepare service's records skip them, see `PrepareService._commit`, and are
  swapped in with RENAME_EXCHANGE, see `atomic_write`). A failed
  write (disk full, read-only) raises `CheckpointWriteError` and leaves the previous file as it was.
- One writer per node: `locked()` takes an in-process lock and an `flock` on `checkpoint.lock`, so two
  plugin instances (rolling update) never interleave their read-modify-write cycles. Each cycle is short;
  concurrency between claims comes from `GpuLocks`, not from here. `update_claim` writes the claim updates
  that queued while a write was under way in one cycle (group commit), so a burst of prepares costs one write
  per write in progress, not one per update.
- Cheap reads on the prepare path: `read(shared=True)` gives the file as this process last wrote it, kept
  parsed, while the file is still that one (one `stat`: same inode, size and mtime; every write puts a new
  inode in place, ours or another instance's). Its entries are shared with the cache and must not be changed
  in place (replace them); a plain `read()` parses the file into objects of the caller's own.
- Forward compatibility: fields this version does not know are kept (top level, per claim, per device, per
  group) and written back unchanged.
- Reboots: the boot id is recorded; a checkpoint from another boot reads as empty, and its claims are offered
  in `previous_boot_claims` so the caller can still clean up what survives a reboot (MIG instances).
"""

from __future__ import annotations

import contextlib
import copy
import enum
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from dra_gpu.checkpoint.atomic_file import atomic_write
from dra_gpu.file_lock import FileLockTimeoutError, LockFile

log = structlog.get_logger(__name__)

API_VERSION = "checkpoint.gpu.nvidia.com/v1"
KIND = "DraGpuCheckpoint"
CHECKPOINT_FILE = "checkpoint.json"
LOCK_FILE = "checkpoint.lock"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
DEFAULT_LOCK_TIMEOUT_S = 10.0  # another plugin instance (NVIDIA's pu.lock waits as long)
# Calls of this process queue behind each other; the kubelet gives each call 45 s.
DEFAULT_QUEUE_TIMEOUT_S = 40.0

JsonDict = dict[str, Any]


class CheckpointError(Exception):
    """Base class: the message names the checkpoint file and the cause."""


class CheckpointWriteError(CheckpointError):
    """Writing failed; the previous checkpoint is intact."""


class CheckpointCorruptError(CheckpointError):
    """The file cannot be understood; refusing to guess which devices are in use."""


class CheckpointLockError(CheckpointError):
    """The node-wide lock could not be taken in time (another plugin instance holds it)."""


class ClaimPhase(enum.Enum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True)
class PreparedDevice:
    """One allocation result of our driver that this claim holds on the node."""

    request: str  # as in the allocation result: "req" or "req/sub"
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    cdi_device_ids: tuple[str, ...] = ()
    # On a device several claims share: the config this claim gives it, normalized ({} for none); another
    # claim of the same device must give the same. None: not shared, or recorded before this field existed.
    config: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> JsonDict:
        out: JsonDict = dict(self.extra)
        out.update(request=self.request, pool=self.pool, device=self.device)
        out["cdiDeviceIDs"] = list(self.cdi_device_ids)
        if self.admin_access:
            out["adminAccess"] = True
        if self.share_id is not None:
            out["shareID"] = self.share_id
        if self.config is not None:
            out["config"] = dict(self.config)
        return out

    def detached(self) -> PreparedDevice:
        """A copy with its own JSON parts (see ClaimEntry.detached)."""
        if self.config is None and not self.extra:
            return self  # nothing in it can change
        return replace(
            self,
            config=copy.deepcopy(dict(self.config)) if self.config is not None else None,
            extra=copy.deepcopy(self.extra) if self.extra else {},
        )

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PreparedDevice:
        known = {"request", "pool", "device", "adminAccess", "shareID", "cdiDeviceIDs", "config"}
        return cls(
            request=str(raw["request"]),
            pool=str(raw["pool"]),
            device=str(raw["device"]),
            admin_access=bool(raw.get("adminAccess", False)),
            share_id=None if raw.get("shareID") is None else str(raw["shareID"]),
            cdi_device_ids=tuple(str(i) for i in raw.get("cdiDeviceIDs", ())),
            config=dict(raw["config"]) if isinstance(raw.get("config"), Mapping) else None,
            extra={k: v for k, v in raw.items() if k not in known},
        )


@dataclass(frozen=True)
class PreparedGroup:
    """A sharing group that has been prepared: its devices and the SharingManager's state for the undo."""

    devices: tuple[str, ...]
    state: Mapping[str, Any]
    # device name -> MIG instance created for it ({"parentUUID", "giID", "ciID", ...}); owned by the claim
    mig_instances: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The group's container edits as written into the CDI spec (`dra_gpu.cdi.edits_json`), so the spec can be
    # rebuilt from the checkpoint alone; None in entries written before this field existed.
    cdi_edits: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self, *, detached: bool = True) -> JsonDict:
        """The group as JSON; `detached=False` shares the nested state instead of copying it, for a caller
        that only encodes the result (the checkpoint write: one to three per prepare)."""
        same: Callable[[Any], Any] = copy.deepcopy if detached else _unchanged
        out: JsonDict = dict(self.extra)
        out.update(devices=list(self.devices), state=same(dict(self.state)))
        if self.mig_instances:
            out["migInstances"] = same({k: dict(v) for k, v in self.mig_instances.items()})
        if self.cdi_edits is not None:
            out["cdiEdits"] = same(dict(self.cdi_edits))
        return out

    def detached(self) -> PreparedGroup:
        """A copy with its own JSON parts (see ClaimEntry.detached)."""
        return replace(
            self,
            state=copy.deepcopy(dict(self.state)),
            mig_instances=copy.deepcopy({k: dict(v) for k, v in self.mig_instances.items()}),
            cdi_edits=copy.deepcopy(dict(self.cdi_edits)) if self.cdi_edits is not None else None,
            extra=copy.deepcopy(self.extra) if self.extra else {},
        )

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PreparedGroup:
        edits = raw.get("cdiEdits")
        return cls(
            devices=tuple(str(d) for d in raw.get("devices", ())),
            state=dict(raw.get("state") or {}),
            mig_instances={str(k): dict(v) for k, v in (raw.get("migInstances") or {}).items()},
            cdi_edits=dict(edits) if edits is not None else None,
            extra={k: v for k, v in raw.items() if k not in {"devices", "state", "migInstances", "cdiEdits"}},
        )


@dataclass(frozen=True)
class ClaimEntry:
    uid: str
    namespace: str
    name: str
    phase: ClaimPhase
    devices: tuple[PreparedDevice, ...]
    groups: tuple[PreparedGroup, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def detached(self) -> ClaimEntry:
        """A copy whose JSON parts (group states, configs, unknown keys) are the caller's own: the sharing
        manager changes a group's state in place. The dataclasses are frozen and shared; a `copy.deepcopy`
        of the whole entry, taken about five times per prepare, cost several times this."""
        return replace(
            self,
            devices=tuple(d.detached() for d in self.devices),
            groups=tuple(g.detached() for g in self.groups),
            extra=copy.deepcopy(self.extra) if self.extra else {},
        )

    def to_json(self, *, detached: bool = True) -> JsonDict:
        out: JsonDict = dict(self.extra)
        out.update(
            namespace=self.namespace,
            name=self.name,
            checkpointState=self.phase.value,
            devices=[d.to_json() for d in self.devices],
            groups=[g.to_json(detached=detached) for g in self.groups],
        )
        return out

    @classmethod
    def from_json(cls, uid: str, raw: Mapping[str, Any]) -> ClaimEntry:
        known = {"namespace", "name", "checkpointState", "devices", "groups"}
        return cls(
            uid=uid,
            namespace=str(raw["namespace"]),
            name=str(raw["name"]),
            phase=ClaimPhase(raw["checkpointState"]),
            devices=tuple(PreparedDevice.from_json(d) for d in raw.get("devices", ())),
            groups=tuple(PreparedGroup.from_json(g) for g in raw.get("groups", ())),
            extra={k: v for k, v in raw.items() if k not in known},
        )


@dataclass
class Checkpoint:
    boot_id: str
    claims: dict[str, ClaimEntry] = field(default_factory=dict)
    # Claims recorded before the last reboot: not prepared any more, only of interest for cleanup.
    previous_boot_claims: dict[str, ClaimEntry] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self, *, detached: bool = True) -> JsonDict:
        out: JsonDict = dict(self.extra)
        out.update(
            apiVersion=API_VERSION,
            kind=KIND,
            bootID=self.boot_id,
            claims={uid: entry.to_json(detached=detached) for uid, entry in sorted(self.claims.items())},
        )
        return out


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""  # no boot id (unusual kernels): reboot detection is then off


def read_boot_time(stat_path: Path = Path("/proc/stat")) -> float | None:
    """When the system booted (seconds since the epoch), from the `btime` line."""
    try:
        for line in stat_path.read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def parse_checkpoint(raw: Mapping[str, Any], current_boot_id: str, source: str) -> Checkpoint:
    """Pure: turn the file's JSON into a `Checkpoint`, discarding claims from another boot."""
    api_version = raw.get("apiVersion")
    if api_version != API_VERSION:
        raise CheckpointCorruptError(
            f"{source}: apiVersion {api_version!r} is not {API_VERSION!r}; this plugin version cannot read "
            "it (downgrade across checkpoint formats is not supported: unprepare all claims or remove "
            "the file)"
        )
    try:
        raw_claims = dict(raw.get("claims", {}))
        claims = {str(uid): ClaimEntry.from_json(str(uid), e) for uid, e in raw_claims.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointCorruptError(f"{source}: malformed claim entry ({exc!r})") from exc
    extra = {k: v for k, v in raw.items() if k not in {"apiVersion", "kind", "bootID", "claims"}}
    recorded_boot = str(raw.get("bootID", ""))
    if recorded_boot and current_boot_id and recorded_boot != current_boot_id:
        return Checkpoint(boot_id=current_boot_id, previous_boot_claims=claims, extra=extra)
    return Checkpoint(boot_id=current_boot_id, claims=claims, extra=extra)


class CheckpointStore:
    """The checkpoint file of one plugin directory. Call `read`/`write` only inside `locked()`."""

    def __init__(
        self,
        directory: Path | str,
        *,
        boot_id: str | None = None,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S,
        boot_time: float | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.path = self.directory / CHECKPOINT_FILE
        self.lock_path = self.directory / LOCK_FILE
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        self._lock_timeout_s = lock_timeout_s
        self._queue_timeout_s = queue_timeout_s
        self._boot_time = boot_time  # tests set it; else from /proc/stat
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._owner: int | None = None  # the thread inside locked()
        self._lock_file = LockFile(self.lock_path)  # one descriptor, kept (see LockFile)
        self._last: tuple[tuple[int, int, int], Checkpoint] | None = None  # (file identity, what it holds)
        self._pending_lock = threading.Lock()
        self._pending: list[_Update] = []  # update_claim's changes not yet written
        # update_claim's leader/followers: one caller writes the queue, the others wait for their change
        self._queue = threading.Condition(self._pending_lock)
        self._writing = False  # a leader is taking the lock or writing

    def close(self) -> None:
        """Close the lock file's kept descriptor (a store used again opens it again)."""
        self._lock_file.close()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Node-wide exclusive section; re-entrant within one thread."""
        if not self._thread_lock.acquire(timeout=self._queue_timeout_s):
            raise CheckpointLockError(
                f"{self.lock_path}: waited {self._queue_timeout_s}s behind other calls of this plugin"
            )
        try:
            if self._depth == 0:
                self._take_file_lock()
                self._owner = threading.get_ident()
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None
                    self._lock_file.release()  # taken by the outermost entry, which got here
        finally:
            self._thread_lock.release()

    def update_claim(
        self,
        uid: str,
        entry: ClaimEntry | None,
        *,
        durable: bool = True,
        check: Callable[[Checkpoint], None] | None = None,
    ) -> Checkpoint:
        """Record (or with None, drop) one claim's entry, leaving every other claim's as the file has it, and
        return the checkpoint as written. `check`, when given, sees the checkpoint just before this change is
        made, under the lock (with the changes written in the same go before it), and may refuse the change
        by raising: the change is then left out and its exception raised here.

        Group commit: a caller that finds no write under way leads: it takes the lock and writes every update
        queued by then in one write (durable when any of them asked for it); callers that arrive meanwhile
        wait for the write that takes their change, not for the lock, and the next leader comes from those
        still queued. Each call still returns only after a write that holds its change, or raises the error
        of that write; a claim's calls never overlap (GpuLocks.claim), so one write holds at most one change
        per claim. Under a burst of prepares this turns one whole-file write per change into one per write
        in progress."""
        update = _Update(uid, entry, durable, check)
        deadline = time.monotonic() + self._queue_timeout_s
        with self._queue:
            self._pending.append(update)
            # Only this thread sets or clears _owner to its own id, so the comparison is stable here.
            inside_locked = self._owner == threading.get_ident()
            leader = not inside_locked and self._wait_as_follower(update, deadline)
        if inside_locked:
            self._write_pending()  # this thread holds the lock already: write now (a leader would wait on us)
        elif leader:
            try:
                with self.locked():
                    self._write_pending()
            except CheckpointLockError:
                with self._queue:
                    if update in self._pending:  # nobody took it: it is not written, ever
                        self._pending.remove(update)
                        raise
            finally:
                with self._queue:
                    self._writing = False
                    self._queue.notify_all()
        update.done.wait()  # taken by a write: this thread's own, or a leader's that is finishing now
        if update.error is not None:
            raise update.error
        if update.written is None:  # the writing thread was interrupted (BaseException)
            raise CheckpointWriteError(f"{self.path}: the write of claim {uid}'s entry was interrupted")
        return update.written

    def _wait_as_follower(self, update: _Update, deadline: float) -> bool:
        """Under `_queue`, with `update` queued: True when this caller is to write the queue (the leader)."""
        # A follower: the leader writes the whole queue, this change with it; wait for that rather than for
        # the lock (each waiter taking and releasing the lock in turn only to find its change written cost a
        # lock hand-over per claim under a burst).
        while self._writing and not update.done.is_set():
            if not self._queue.wait(timeout=max(deadline - time.monotonic(), 0)):
                break
        if not update.done.is_set() and self._writing and update in self._pending:
            self._pending.remove(update)  # timed out, nobody took it: it is not written, ever
            raise CheckpointLockError(
                f"{self.lock_path}: waited {self._queue_timeout_s}s behind other calls of this plugin"
            )
        if update.done.is_set() or update not in self._pending:
            return False  # written, or in the batch a leader is writing now
        self._writing = True
        return True

    def _write_pending(self) -> None:
        """Inside `locked()`: write every queued update (this thread's among them) in one go."""
        with self._pending_lock:
            batch, self._pending = self._pending, []
        applied: list[_Update] = []
        try:
            checkpoint = self.read(shared=True)
            for update in batch:
                if update.check is not None:
                    try:
                        update.check(checkpoint)
                    except Exception as refused:
                        update.error = refused
                        continue
                if update.entry is None:
                    checkpoint.claims.pop(update.uid, None)
                else:
                    checkpoint.claims[update.uid] = update.entry
                applied.append(update)
            if applied:
                self.write(checkpoint, durable=any(update.durable for update in applied))
            for update in applied:
                update.written = checkpoint
        except Exception as exc:
            error = exc if isinstance(exc, CheckpointError) else CheckpointWriteError(f"{self.path}: {exc!r}")
            for update in batch:
                if update.error is None:
                    update.error = error
        finally:
            for update in batch:
                update.done.set()

    def _take_file_lock(self) -> None:
        try:
            self._lock_file.acquire(timeout_s=self._lock_timeout_s)
        except FileLockTimeoutError:
            raise CheckpointLockError(
                f"{self.lock_path}: held by another plugin instance for more than {self._lock_timeout_s}s"
            ) from None
        except OSError as exc:
            raise CheckpointLockError(f"{self.lock_path}: cannot open ({exc.strerror})") from exc

    def read(self, *, shared: bool = False) -> Checkpoint:
        """The checkpoint as the file holds it. Inside `locked()` for a read-modify-write; outside it, a
        snapshot at least as new as every write this process has finished, which is enough to read a claim's
        own entry while that claim's calls are kept apart (GpuLocks.claim). Safe without the lock because
        every write renames a whole new file into place and the cached copy is never changed, only
        replaced."""
        try:
            last = self._last  # read once: a write may replace it meanwhile (see `read`'s docstring)
            # One stat rather than open, fstat and close: a prepare reads the checkpoint about five times, and
            # each system call is a point where its thread gives up the GIL to the other prepares.
            if shared and last is not None and last[0] == _identity(os.stat(self.path)):
                return _copy(last[1])
            with self.path.open("rb") as file:
                text = file.read().decode()
        except FileNotFoundError:
            return Checkpoint(boot_id=self.boot_id)
        except OSError as exc:
            raise CheckpointCorruptError(f"{self.path}: cannot read ({exc.strerror})") from exc
        except UnicodeDecodeError as exc:
            raise CheckpointCorruptError(f"{self.path}: not UTF-8 ({exc})") from exc
        try:
            return self._parse(text)
        except CheckpointCorruptError:
            if not self._written_before_boot():
                raise
            # Unreadable, but last written before this boot: whatever it recorded was undone by the reboot.
            log.warning("discarding unreadable checkpoint from before the last reboot", path=str(self.path))
            return Checkpoint(boot_id=self.boot_id)

    def _written_before_boot(self) -> bool:
        boot_time = self._boot_time if self._boot_time is not None else read_boot_time()
        try:
            return boot_time is not None and self.path.stat().st_mtime < boot_time
        except OSError:
            return False

    def _parse(self, text: str) -> Checkpoint:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointCorruptError(
                f"{self.path}: not valid JSON ({exc}); move the file away only after checking that no claim "
                "is still prepared on this node"
            ) from exc
        if not isinstance(raw, dict):
            raise CheckpointCorruptError(
                f"{self.path}: top level is {type(raw).__name__}, expected an object"
            )
        return parse_checkpoint(raw, self.boot_id, str(self.path))

    def write(self, checkpoint: Checkpoint, *, durable: bool = True) -> None:
        """Replace the file atomically; `durable=False` skips the fsyncs (see `atomic_write`): for the records
        of a prepare in progress, which only a process crash (not a power loss) can leave behind."""
        # Compact: without `indent` the json module encodes in C, several times faster than its Python
        # encoder, and a prepare writes the whole file up to three times (`jq . checkpoint.json` to read it).
        # Not detached: json's C encoder reads the shared state without releasing the GIL, so no other thread
        # changes it meanwhile (a deep copy, Python code, could be interrupted halfway).
        wire = checkpoint.to_json(detached=False)
        data = (json.dumps(wire, separators=(",", ":"), sort_keys=True) + "\n").encode()
        self._last = None
        status = atomic_write(self.path, data, error=CheckpointWriteError, durable=durable)
        # Under the lock: nobody else can have replaced it since. As a parse of what was written would give
        # it: no claims of an earlier boot.
        self._last = (_identity(status), replace(_copy(checkpoint), previous_boot_claims={}))


@dataclass(eq=False)  # compared by identity: two updates of one claim are two updates
class _Update:
    """One claim's change waiting to be written by `update_claim`."""

    uid: str
    entry: ClaimEntry | None
    durable: bool
    check: Callable[[Checkpoint], None] | None = None
    written: Checkpoint | None = None
    error: Exception | None = None
    done: threading.Event = field(default_factory=threading.Event)


def _identity(stat: os.stat_result) -> tuple[int, int, int]:
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _copy(checkpoint: Checkpoint) -> Checkpoint:
    """A copy callers may change (entries are frozen; only the containers need copying)."""
    return Checkpoint(
        boot_id=checkpoint.boot_id,
        claims=dict(checkpoint.claims),
        previous_boot_claims=dict(checkpoint.previous_boot_claims),
        extra=copy.deepcopy(checkpoint.extra),
    )


def _unchanged(value: Any) -> Any:
    return value
