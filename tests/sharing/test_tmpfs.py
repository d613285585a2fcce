"""The MPS shared-memory tmpfs, mounted and unmounted by system call: the same mount `mount -t tmpfs -o ...`
makes, and errors that name the path."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dra_gpu.sharing.mps import SHM_OPTIONS
from dra_gpu.sharing.tmpfs import (
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RELATIME,
    mount_flags,
    mount_tmpfs,
    unmount,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")


def _mount_line(path: Path) -> list[str] | None:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            fields = line.split()
            if fields[4] == target:
                return fields
    return None


def test_options_split_into_flags_and_data() -> None:
    assert mount_flags(f"{SHM_OPTIONS},size=2048k") == (
        MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RELATIME,
        "size=2048k",
    )
    assert mount_flags("rw") == (0, "")
    assert mount_flags(" size=1k , mode=1777 ,") == (0, "size=1k,mode=1777")


@needs_root
def test_mount_and_unmount(tmp_path: Path) -> None:
    target = tmp_path / "shm"
    target.mkdir()
    mount_tmpfs(target, f"{SHM_OPTIONS},size=64k")
    try:
        fields = _mount_line(target)
        assert fields is not None
        # mount options, then " - tmpfs tmpfs <super options>"
        assert {"nosuid", "nodev", "noexec", "relatime"} <= set(fields[5].split(","))
        separator = fields.index("-")
        assert fields[separator + 1] == "tmpfs"
        assert "size=64k" in fields[separator + 3].split(",")
        (target / "file").write_bytes(b"x")
        with pytest.raises(OSError) as full:
            (target / "big").write_bytes(b"x" * 128 * 1024)  # the size limit holds
        assert full.value.errno == errno.ENOSPC
    finally:
        unmount(target)
    assert _mount_line(target) is None
    assert list(target.iterdir()) == []  # the files lived in the tmpfs


@needs_root
def test_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(OSError) as missing:
        mount_tmpfs(tmp_path / "absent", "size=64k")
    assert missing.value.errno == errno.ENOENT
    assert str(tmp_path / "absent") in str(missing.value)
    with pytest.raises(OSError) as not_mounted:
        unmount(tmp_path)
    assert not_mounted.value.errno == errno.EINVAL
    assert f"unmounting {tmp_path}" in str(not_mounted.value)
