"""The sharing manager's small on-disk registry: who holds which GPU-global setting, across plugin restarts.

Per-claim undo information lives in each group's checkpointed `state`; what is shared *between* claims lives
here: time-slice holders per GPU, each GPU's MPS shares server (the one daemon whose clients are the GPU's
fractional shares) with its clients and their shares, the MIG instances this driver created (so start-up
cleanup never touches instances an administrator made) and the GPUs whose MIG mode we switched on. The file is
`<plugin dir>/sharing-registry.json`, replaced atomically under an fcntl lock. It records the boot id: after a
reboot the settings that do not survive one (time-slices, MPS daemons, MIG instances, compute modes) are gone,
so their records start empty instead of holding references for claims that no longer exist. MIG mode does
survive a reboot (it is kept by the GPU; on Ampere a change is pending until the next reset, which a reboot
is), so `migModeEnabled` is carried over: the driver still switches off the MIG mode it switched on.

A registry file that exists but cannot be read or parsed is never replaced by a fresh one: guessing "empty"
would forget which MIG instances and settings are ours. `RegistryUnreadableError` is raised (the prepare or
unprepare that needed it fails with that message), the file is left as it is for the operator, and the
error is logged every time.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from dra_gpu.file_lock import file_locked
from dra_gpu.sharing.interface import SharingError

log = structlog.get_logger(__name__)


class RegistryUnreadableError(SharingError):
    """The registry file exists but cannot be read or parsed; the message names the file and the fix."""


REGISTRY_FILE = "sharing-registry.json"
FORMAT = 1
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def current_boot_id() -> str:
    try:
        return Path(BOOT_ID_PATH).read_text().strip()
    except OSError:
        return "unknown"


def empty_registry(boot_id: str) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "bootId": boot_id,
        "timeSlice": {},  # gpu uuid -> {"interval": int, "claims": [claim uid, ...]}
        # gpu uuid -> {"daemon": the shares server's record,
        #              "clients": {"<claim>/<device>/<shareID>": {"computePercent": N, "memoryBytes": N}}}
        "sharedMps": {},
        "createdMig": [],  # [parent uuid, gi id, ci id, MIG uuid] of instances this driver created
        # [parent uuid, GI profile id, placement start, MIG mode was on] of a creation under way: a crash
        # between NVML creating the instance and `createdMig` naming it leaves an instance start-up must find
        "creatingMig": [],
        "migModeEnabled": [],  # gpu uuids whose MIG mode we switched on (switched off again when empty)
        "pendingComputeModes": {},  # gpu uuid -> mode to restore once the GPU (gone at unprepare) is back
        "pendingTimeSliceResets": [],  # gpu uuids to reset to the Default interval once back
        "pendingMigDestroy": [],  # MIG devices (instance JSON) to destroy once their GPU is back
    }


class Registry:
    """Exclusive read-modify-write: `with registry.update() as data: ...` saves when the block succeeds."""

    def __init__(self, plugin_dir: Path, boot_id: str | None = None) -> None:
        self.path = plugin_dir / REGISTRY_FILE
        self._lock_path = plugin_dir / (REGISTRY_FILE + ".lock")
        self._boot_id = boot_id or current_boot_id()
        self._thread_lock = threading.RLock()
        self._open: dict[str, Any] | None = None  # the data of the outermost update() of the owning thread

    @contextlib.contextmanager
    def update(self) -> Iterator[dict[str, Any]]:
        """Reentrant: a nested update() sees and changes the outer one's data; the outermost one saves."""
        with self._thread_lock:
            if self._open is not None:
                yield self._open
                return
            with file_locked(self._lock_path, exclusive=True):
                try:
                    self._open = self._load()
                    yield self._open
                    # An update that changes nothing writes nothing: on a full disk, start-up's read of
                    # `createdMig` (an update) failed before any leftover MIG device was destroyed, which
                    # then stayed for good (found by the soak, tests/soak).
                    if _encode(self._open) != self._text_on_disk():
                        self._save(self._open)
                finally:
                    self._open = None

    def read(self) -> dict[str, Any]:
        """A private copy of the current contents (nothing is written)."""
        with self._thread_lock:
            if self._open is not None:
                copy: dict[str, Any] = json.loads(json.dumps(self._open))
                return copy
            with file_locked(self._lock_path, exclusive=False):
                return self._load()

    def _text_on_disk(self) -> str | None:
        try:
            return self.path.read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return empty_registry(self._boot_id)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise self._unreadable(f"{type(err).__name__}: {err}") from None
        if not isinstance(data, dict) or not isinstance(data.get("migModeEnabled", []), list):
            raise self._unreadable("not a registry object")
        if data.get("bootId") != self._boot_id:
            kept = [str(u) for u in data.get("migModeEnabled", [])]
            log.info(
                "sharing registry is from an earlier boot; starting over, keeping MIG mode records",
                path=str(self.path),
                mig_mode_enabled=kept,
            )
            fresh = empty_registry(self._boot_id)
            fresh["migModeEnabled"] = kept
            return fresh
        fresh = empty_registry(self._boot_id)
        fresh.update(
            {k: v for k, v in data.items() if k in fresh}
        )  # forward-compatible: unknown keys dropped
        return fresh

    def _unreadable(self, why: str) -> RegistryUnreadableError:
        message = (
            f"sharing registry {self.path} is unreadable ({why}); refusing to guess which GPU settings and "
            "MIG devices this driver owns. The file is kept as it is: repair it, or, once no claim is "
            "prepared on this node, move it aside and restart the plugin"
        )
        log.error("sharing registry unreadable", path=str(self.path), error=why)
        return RegistryUnreadableError(message)

    def _save(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as out:
                out.write(_encode(data))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except OSError:
            # A failed write (a full disk) must not leave its partial temp file: it would hold on to the very
            # space that ran out, and nothing else ever removes it (found by the soak, tests/soak).
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def _encode(data: dict[str, Any]) -> str:
    # one C-encoded string (`json.dump` and `indent` take the pure-Python encoder)
    return json.dumps(data, separators=(",", ":"), sort_keys=True)
