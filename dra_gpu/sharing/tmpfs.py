"""Mount and unmount a tmpfs with the mount(2) and umount2(2) system calls.

The MPS shared-memory directory of every share is a tmpfs of its own. Running `mount` and `umount` for it
cost a process start each, plus libmount's parse of the whole mount table, which grows with every share:
in a burst of shares that was a fifth of the plugin's time. Python has no binding for these calls, so they go
through libc with ctypes (which pynvml loads anyway).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

# <sys/mount.h>: the mount flags that `mount -o` options stand for
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_RELATIME = 0x200000

_FLAG_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "relatime": MS_RELATIME}


def mount_flags(options: str) -> tuple[int, str]:
    """`mount -o` options split into mount(2)'s flags and the file system's own data string
    ("rw,nosuid,size=1k" -> (MS_NOSUID, "size=1k")). `rw` is the default: no flag."""
    flags = 0
    data = []
    for option in filter(None, (o.strip() for o in options.split(","))):
        if option in _FLAG_OPTIONS:
            flags |= _FLAG_OPTIONS[option]
        elif option != "rw":
            data.append(option)
    return flags, ",".join(data)


@functools.cache
def _libc() -> ctypes.CDLL:
    # The interpreter's own symbols, libc's among them (find_library would run ldconfig to find the file).
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str, path: Path) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} {path}: {os.strerror(err)}")


def mount_tmpfs(path: Path, options: str) -> None:
    """Mount a fresh tmpfs at `path` with `mount -o` style `options`; OSError (errno, message) on failure."""
    flags, data = mount_flags(options)
    result = _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", ctypes.c_ulong(flags), data.encode())
    _check(result, "mounting tmpfs at", path)


def unmount(path: Path) -> None:
    """Unmount what is mounted at `path`; OSError on failure (EINVAL: nothing is mounted there)."""
    _check(_libc().umount2(os.fsencode(path), 0), "unmounting", path)
