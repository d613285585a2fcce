"""The one advisory file lock (`flock(2)`) of dra-gpu: checkpoint, sharing registry and simulator state.

`flock` rather than `fcntl` record locks because it belongs to the open file description: two threads that
open the file separately exclude each other, and closing the descriptor (or the process dying) releases it,
so a crashed plugin never leaves a stale lock behind. Callers keep their own thread lock in front: the file
lock is for other processes (a second plugin instance, the simulator's tools, the CLI).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

_POLL_S = 0.002


class FileLockTimeoutError(TimeoutError):
    """Another process held the lock for longer than the caller was willing to wait."""


def open_lock_file(
    path: Path, *, mode: int = 0o600, dir_mode: int = 0o777, allow_read_only: bool = False
) -> int:
    """A descriptor for `path` (created with its directory when missing). With `allow_read_only`, a read-only
    file system still allows locking an existing file (reads keep working there). Raises OSError."""
    try:
        return _open_making_directory(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode, dir_mode)
    except OSError:
        if not allow_read_only:
            raise
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def _open_making_directory(path: Path, flags: int, mode: int, dir_mode: int) -> int:
    """os.open, making the file's directory when it is missing. Only the first lock in a new directory makes
    it: a mkdir before every lock was two system calls per lock, each a point where a prepare thread gives up
    the GIL (bench_side_by_side's waves)."""
    try:
        return os.open(path, flags, mode)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=dir_mode)
        return os.open(path, flags, mode)


def lock_fd(fd: int, *, exclusive: bool = True, timeout_s: float | None = None) -> None:
    """Take the lock on `fd`: block, or poll until `timeout_s` and raise FileLockTimeoutError (the
    descriptor stays open; the caller closes it)."""
    operation = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    if timeout_s is None:
        fcntl.flock(fd, operation)
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise FileLockTimeoutError(f"held by another process for more than {timeout_s}s") from None
            time.sleep(_POLL_S)


@contextlib.contextmanager
def file_locked(
    path: Path, *, exclusive: bool = True, timeout_s: float | None = None, mode: int = 0o600
) -> Iterator[int]:
    """Hold the lock on `path` for the block; yields the descriptor. Closing it releases the lock."""
    fd = open_lock_file(path, mode=mode)
    try:
        lock_fd(fd, exclusive=exclusive, timeout_s=timeout_s)
        yield fd
    finally:
        os.close(fd)


def unlock_and_close(fd: int) -> None:
    """Release a lock taken with `lock_fd` and close its descriptor."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class LockFile:
    """A lock file whose descriptor is opened on first use and kept until `close` (or until this object goes):
    taking the lock is one `flock` instead of open, flock and close (each system call is a point where a
    prepare's thread gives up the GIL; a prepare takes about seven locks).

    The descriptor is read-only (`flock` needs no more), so keeping it open does not stop the file system from
    being remounted read-only, and an existing file can be locked on a read-only file system. It is one open
    file description, so threads of this process that lock it together do not exclude each other: callers keep
    a thread lock in front (one holder at a time), or count their shared holders and lock the file for all of
    them at once. The file must stay where it is while the descriptor is open (dra-gpu never removes its lock
    files): a lock on a removed file would exclude nobody."""

    def __init__(self, path: Path, *, mode: int = 0o600, dir_mode: int = 0o750) -> None:
        self.path = path
        self._mode = mode
        self._dir_mode = dir_mode
        self._fd: int | None = None
        self._open_lock = threading.Lock()
        self._finalizer: weakref.finalize[[int], LockFile] | None = None

    def acquire(self, *, exclusive: bool = True, timeout_s: float | None = None) -> None:
        """Take the lock; raises OSError when the file cannot be opened (or made) and FileLockTimeoutError
        when another process holds it past `timeout_s`."""
        lock_fd(self._descriptor(), exclusive=exclusive, timeout_s=timeout_s)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the descriptor (releasing any lock on it); the next `acquire` opens the file again."""
        with self._open_lock:
            if self._finalizer is not None:
                self._finalizer()  # closes the descriptor, once
            self._fd = self._finalizer = None

    def _descriptor(self) -> int:
        with self._open_lock:
            if self._fd is None:
                flags = os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC
                fd = _open_making_directory(self.path, flags, self._mode, self._dir_mode)
                self._fd = fd
                self._finalizer = weakref.finalize(self, os.close, fd)
            return self._fd
