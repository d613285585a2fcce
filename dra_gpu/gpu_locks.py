"""Who may act on which GPU right now: one lock per physical GPU, and a node-wide section above them.

Prepares and unprepares of different GPUs never need to wait for each other. A claim takes the locks of the
GPUs its devices live on (everything a prepare changes hangs off one physical GPU: the GPU itself, its MIG
placements, its MPS daemon, its time-slice interval), in sorted order so that two claims never wait for each
other in a circle. Node-wide work (start-up cleanup, reading which MIG instances our claims own while the
hardware is discovered) takes `node()`, which waits until every GPU section has ended and holds new ones back
meanwhile, so it is never starved.

A GPU is held exclusively, fractional shares included: the shares of one GPU are clients of its one MPS
server, and each join or leave changes that server's clients and caps (sharing.plan.gpu_lock_keys). Work
that changes nothing GPU-wide may hold a GPU shared (`gpus(..., shared=...)`), beside other shared holders,
while anything that changes the GPU waits for them and they for it; today that is only the undo of a share
that an earlier version gave an MPS daemon of its own. A waiting exclusive holder keeps new shared ones back,
so it is never starved. Two calls for one claim take turns on the claim's own lock (`claim(uid)`), taken
before its GPUs.

Both levels are re-entrant within a thread, and the outermost section decides the mode: the prepare service
holds a claim's GPUs and the sharing manager takes the same ones again; a thread inside `node()` may enter any
GPU section. The reverse (asking for the node while holding a GPU) would wait for itself and is refused.

Across processes (a second plugin instance during a rolling update) the same structure is kept with `flock`
files in `directory`: `node.lock`, shared by GPU sections and exclusive for `node()`, and one
`gpu-<uuid>.lock` per GPU, exclusive (the shared sections of one process hold it together). Only a thread's
outermost section touches the files. Each file has one descriptor, kept open (`LockFile`): the GPU sections of
this process lock `node.lock` shared together, counted, as its shared holders of one GPU lock its file.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from dra_gpu.file_lock import FileLockTimeoutError, LockFile

NODE_LOCK_FILE = "node.lock"
DEFAULT_TIMEOUT_S = 40.0  # the kubelet gives each call 45 s
DEFAULT_FILE_TIMEOUT_S = 10.0  # another plugin instance (NVIDIA's pu.lock waits as long)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class GpuLockTimeoutError(TimeoutError):
    """A lock was not free in time; the message says which and behind whom."""


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.node_depth = 0
        self.shared_depth = 0
        self.gpus: Counter[str] = Counter()


class _GpuLock:
    """One GPU's in-process lock: any number of shared holders, or one exclusive holder. Re-entry is handled
    above it (a thread's depth per GPU), so each thread acquires it at most once."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._exclusive_waiting = 0
        # The GPU's lock file, held exclusively for all of this process's shared holders together: another
        # plugin process stays out of the GPU while any of them is in (as it did when they took turns).
        self.shared_file = _CountedHold()

    def acquire(self, *, exclusive: bool, timeout: float) -> bool:
        with self._cond:
            if not exclusive:
                free = self._cond.wait_for(
                    lambda: not self._exclusive and not self._exclusive_waiting, timeout
                )
                self._shared += free
                return free
            self._exclusive_waiting += 1
            try:
                free = self._cond.wait_for(lambda: not self._exclusive and not self._shared, timeout)
            finally:
                self._exclusive_waiting -= 1
            if free:
                self._exclusive = True
            else:
                self._cond.notify_all()  # shared holders held back by this wait may go on
            return free

    def release(self, *, exclusive: bool) -> None:
        with self._cond:
            if exclusive:
                self._exclusive = False
            else:
                self._shared -= 1
            self._cond.notify_all()


class GpuLocks:
    def __init__(
        self,
        directory: Path | str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        file_timeout_s: float = DEFAULT_FILE_TIMEOUT_S,
    ) -> None:
        self._directory = Path(directory) if directory is not None else None
        self._timeout_s = timeout_s
        self._file_timeout_s = file_timeout_s
        self._cond = threading.Condition()
        self._node_owner: int | None = None
        self._node_waiting = 0
        self._sharers = 0  # threads inside at least one GPU section
        self._gpu_locks: dict[str, _GpuLock] = {}
        self._claim_locks: dict[str, list[Any]] = {}  # uid -> [RLock, users]
        self._mine = _ThreadState()
        self._files: dict[str, LockFile] = {}  # lock file name -> its kept descriptor
        self._node_file = _CountedHold()  # node.lock, shared, for all of this process's GPU sections together

    # ---- GPU sections ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def gpus(self, keys: Iterable[str], *, shared: Iterable[str] = ()) -> Iterator[None]:
        """Hold the locks of these GPUs (UUIDs; any stable name for a device without one) for the block:
        `keys` exclusively, `shared` shared (a key in both is held exclusively).
        Raises GpuLockTimeoutError."""
        deadline = time.monotonic() + self._timeout_s
        exclusive = set(keys)
        modes = {key: True for key in exclusive} | {key: False for key in set(shared) - exclusive}
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._shared(deadline))
            for key in sorted(modes):
                stack.enter_context(self._gpu(key, deadline, exclusive=modes[key]))
            yield

    @contextlib.contextmanager
    def _shared(self, deadline: float) -> Iterator[None]:
        mine = self._mine
        outermost = mine.shared_depth == 0 and mine.node_depth == 0
        if outermost:
            with self._cond:
                free = self._cond.wait_for(
                    lambda: self._node_owner is None and self._node_waiting == 0, _left(deadline)
                )
                if not free:
                    raise GpuLockTimeoutError(f"waited {self._timeout_s}s for node-wide work of this plugin")
                self._sharers += 1
        mine.shared_depth += 1
        joined = False
        try:
            if outermost:
                self._node_file.join(lambda: self._file_lock(NODE_LOCK_FILE, exclusive=False))
                joined = True
            yield
        finally:
            if joined:
                self._node_file.leave()
            mine.shared_depth -= 1
            if outermost:
                with self._cond:
                    self._sharers -= 1
                    self._cond.notify_all()

    @contextlib.contextmanager
    def _gpu(self, key: str, deadline: float, *, exclusive: bool) -> Iterator[None]:
        mine = self._mine
        if mine.gpus[key]:  # re-entered: the outermost section's mode holds
            mine.gpus[key] += 1
            try:
                yield
            finally:
                mine.gpus[key] -= 1
            return
        with self._cond:
            lock = self._gpu_locks.setdefault(key, _GpuLock())
        if not lock.acquire(exclusive=exclusive, timeout=_left(deadline)):
            raise GpuLockTimeoutError(f"GPU {key}: waited {self._timeout_s}s behind another claim of it")
        mine.gpus[key] = 1
        held: LockFile | None = None
        joined = False
        try:
            if mine.node_depth == 0 and exclusive:
                held = self._file_lock(_gpu_file(key), exclusive=True)
            elif mine.node_depth == 0:
                lock.shared_file.join(lambda: self._file_lock(_gpu_file(key), exclusive=True))
                joined = True
            yield
        finally:
            if held is not None:
                held.release()
            if joined:
                lock.shared_file.leave()
            del mine.gpus[key]
            lock.release(exclusive=exclusive)

    # ---- one claim ---------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def claim(self, uid: str) -> Iterator[None]:
        """One operation on a claim at a time in this process (re-entrant). Taken before its GPUs: a GPU
        held shared does not keep two calls for the same claim (a kubelet retry beside the first attempt, a
        stale-claim cleanup) apart, so they take turns here. Another plugin process is kept out by the GPU's
        lock file. Raises GpuLockTimeoutError."""
        with self._cond:
            entry = self._claim_locks.setdefault(uid, [threading.RLock(), 0])
            entry[1] += 1
        try:
            if not entry[0].acquire(timeout=self._timeout_s):
                waited = f"waited {self._timeout_s}s behind another call for it"
                raise GpuLockTimeoutError(f"claim {uid}: {waited}")
            try:
                yield
            finally:
                entry[0].release()
        finally:
            with self._cond:
                entry[1] -= 1
                if not entry[1]:
                    del self._claim_locks[uid]

    # ---- node-wide section -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def node(self) -> Iterator[None]:
        """Hold the whole node: no GPU section of this process (or, with a directory, of another plugin
        instance) runs meanwhile. Raises GpuLockTimeoutError."""
        mine = self._mine
        if mine.node_depth:
            mine.node_depth += 1
            try:
                yield
            finally:
                mine.node_depth -= 1
            return
        if mine.shared_depth:
            raise RuntimeError("node-wide section asked for inside a GPU section: it would wait for itself")
        deadline = time.monotonic() + self._timeout_s
        with self._cond:
            self._node_waiting += 1
            try:
                free = self._cond.wait_for(
                    lambda: self._node_owner is None and self._sharers == 0, _left(deadline)
                )
            finally:
                self._node_waiting -= 1
            if not free:
                self._cond.notify_all()  # GPU sections held back by this wait may go on
                raise GpuLockTimeoutError(f"waited {self._timeout_s}s for claims being prepared on this node")
            self._node_owner = threading.get_ident()
        mine.node_depth = 1
        held: LockFile | None = None
        try:
            # No GPU section of this process is in (waited for above), so node.lock's one descriptor is free.
            held = self._file_lock(NODE_LOCK_FILE, exclusive=True)
            yield
        finally:
            if held is not None:
                held.release()
            mine.node_depth = 0
            with self._cond:
                self._node_owner = None
                self._cond.notify_all()

    # ---- files -------------------------------------------------------------------------------------------

    def _file_lock(self, name: str, *, exclusive: bool) -> LockFile | None:
        """Lock file `name` (None without a directory). Raises GpuLockTimeoutError."""
        if self._directory is None:
            return None
        with self._cond:
            file = self._files.get(name)
            if file is None:
                file = self._files[name] = LockFile(self._directory / name)
        try:
            file.acquire(exclusive=exclusive, timeout_s=self._file_timeout_s)
        except FileLockTimeoutError:
            raise GpuLockTimeoutError(
                f"{file.path}: held by another plugin instance for more than {self._file_timeout_s}s"
            ) from None
        except OSError as exc:
            raise GpuLockTimeoutError(f"{file.path}: cannot open ({exc.strerror})") from exc
        return file


class _CountedHold:
    """A lock file held once for any number of holders in this process (one descriptor cannot be locked
    twice): the first to join locks it, the last to leave releases it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._users = 0
        self._file: LockFile | None = None

    def join(self, take: Callable[[], LockFile | None]) -> None:
        """Count one more holder, locking the file with `take` for the first (its error leaves no count)."""
        with self._mutex:
            if not self._users:
                self._file = take()
            self._users += 1

    def leave(self) -> None:
        with self._mutex:
            self._users -= 1
            if not self._users and self._file is not None:
                self._file.release()
                self._file = None


def _gpu_file(key: str) -> str:
    return f"gpu-{_UNSAFE.sub('_', key)}.lock"


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
