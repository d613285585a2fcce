"""The sharing manager's small on-disk registry: who holds which GPU-global setting, across plugin restarts.

Per-claim undo information lives in each group's checkpointed `state`; what is shared *between* claims lives
here: time-slice holders per GPU, the per-GPU MPS daemons of fractional shares and their clients, the MIG
instances this driver created (so start-up cleanup never touches instances an administrator made) and the GPUs
whose MIG mode we switched on. The file is `<plugin dir>/sharing-registry.json`, replaced atomically under an
fcntl lock. It records the boot id: after a reboot every GPU-global setting is gone, so the registry starts
empty instead of holding references for claims that no longer exist.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

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
        "sharedMps": {},  # gpu uuid -> {"daemon": daemon record, "clients": {"<claim>/<device>": {...}}}
        "createdMig": [],  # [parent uuid, gi id, ci id, MIG uuid] of instances this driver created
        "migModeEnabled": [],  # gpu uuids whose MIG mode we switched on (switched off again when empty)
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
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._open = self._load()
                yield self._open
                self._save(self._open)
            finally:
                self._open = None
                os.close(fd)

    def read(self) -> dict[str, Any]:
        """A private copy of the current contents (nothing is written)."""
        with self._thread_lock:
            if self._open is not None:
                copy: dict[str, Any] = json.loads(json.dumps(self._open))
                return copy
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                return self._load()
            finally:
                os.close(fd)

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return empty_registry(self._boot_id)
        except (OSError, json.JSONDecodeError) as err:
            # Losing the registry loses reference counts, not correctness of the GPU: start over, loudly.
            log.error("sharing registry unreadable; starting empty", path=str(self.path), error=str(err))
            return empty_registry(self._boot_id)
        if not isinstance(data, dict) or data.get("bootId") != self._boot_id:
            if isinstance(data, dict):
                log.info("sharing registry is from an earlier boot; starting empty", path=str(self.path))
            return empty_registry(self._boot_id)
        fresh = empty_registry(self._boot_id)
        fresh.update(
            {k: v for k, v in data.items() if k in fresh}
        )  # forward-compatible: unknown keys dropped
        return fresh

    def _save(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
