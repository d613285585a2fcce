"""Replace a file atomically and durably (temp file, fsync, rename, fsync of the directory)."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path


def atomic_write(
    path: Path, data: bytes, *, error: type[Exception], mode: int = 0o600, durable: bool = True
) -> None:
    """Replace `path` with `data` so that readers see the old or the new content, never a mix.

    Raises `error` naming the file and the cause; on failure the old file is untouched and no temp file
    is left. `durable=False` skips the fsyncs: still atomic for readers and across a process crash (the page
    cache survives it), but not across a power loss.
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
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if not durable:
            return
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        cause = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or repr(exc))
        raise error(f"writing {path}: {cause}") from exc
