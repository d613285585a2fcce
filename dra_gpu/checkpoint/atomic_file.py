"""Replace a file atomically and durably (temp file, fsync, rename, fsync of the directory), or atomically
only (temp file swapped in, no fsync)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path


def atomic_write(
    path: Path, data: bytes, *, error: type[Exception], mode: int = 0o600, durable: bool = True
) -> os.stat_result:
    """Replace `path` with `data` so that readers see the old or the new content, never a mix.

    Raises `error` naming the file and the cause; on failure the old file is untouched and no temp file
    is left. `durable=False` skips the fsyncs: still atomic for readers and across a process crash (the page
    cache survives it), but not across a power loss.

    Returns the new file's status, taken before the rename (which changes neither its inode, size nor
    mtime): a caller that caches what it wrote knows the file's identity without another system call.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                # Data (and the size that makes it readable) on disk before the rename: after a power loss the
                # name points to the old or the new content, never to an empty file.
                os.fdatasync(fd)
            status = os.fstat(fd)
        finally:
            os.close(fd)
        if not durable:
            _swap_into_place(tmp, path)
            return status
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return status
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        cause = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or repr(exc))
        raise error(f"writing {path}: {cause}") from exc


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # renameat2(2): swap the two names atomically


def _renameat2() -> Callable[..., int] | None:
    """glibc's renameat2 (Python has no binding), or None (another libc)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    call: Callable[..., int] = function
    return call


_RENAMEAT2 = _renameat2()


def _swap_into_place(tmp: Path, path: Path) -> None:
    """Put `tmp` in place of `path` atomically, for a write that need not survive a power loss.

    Renaming over an existing file makes ext4 (auto_da_alloc) allocate and start writing the new file's blocks
    inside the rename, so that a power loss cannot leave the name pointing at an empty file: ~0.15 ms of a
    ~0.04 ms write. Writes that skip the fsyncs do not need that, so they swap the two names with
    RENAME_EXCHANGE, which readers see as atomically as a rename (the name holds the old file or the new one),
    and then remove the old file from the temporary name. Where the swap is not possible (no file there yet, a
    file system or libc without it) this is a plain rename."""
    if rename_exchange(tmp, path) == 0:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # the old content; a crash before this leaves it behind, as one mid-write does
        return
    os.replace(tmp, path)


def rename_exchange(first: Path, second: Path) -> int:
    """Swap the two names atomically (renameat2 RENAME_EXCHANGE; both must exist): 0, or the errno of the
    failure (ENOSYS where this libc has no renameat2)."""
    if _RENAMEAT2 is None:
        return errno.ENOSYS
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return 0
    return ctypes.get_errno() or errno.EIO
