"""The sharing registry on real files: an unreadable file is kept and refused, never silently reset; a reboot
forgets what a reboot undoes and keeps the MIG mode records (MIG mode outlives a reboot)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from dra_gpu.sharing.registry import REGISTRY_FILE, Registry, RegistryUnreadableError


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00", b"[1, 2]", b'{"migModeEnabled": 3}'])
def test_unreadable_registry_is_refused_and_kept(tmp_path: Path, content: bytes) -> None:
    (tmp_path / REGISTRY_FILE).write_bytes(content)
    registry = Registry(tmp_path, boot_id="boot-1")
    with pytest.raises(RegistryUnreadableError) as err, registry.update() as data:
        data["timeSlice"]["GPU-x"] = {"interval": 1, "claims": ["c"]}
    message = str(err.value)
    assert str(tmp_path / REGISTRY_FILE) in message and "move it aside" in message
    with pytest.raises(RegistryUnreadableError):
        registry.read()
    assert (tmp_path / REGISTRY_FILE).read_bytes() == content  # nothing overwritten


def test_a_reboot_keeps_only_mig_mode_records(tmp_path: Path) -> None:
    before = Registry(tmp_path, boot_id="boot-1")
    with before.update() as data:
        data["timeSlice"]["GPU-a"] = {"interval": 2, "claims": ["c1"]}
        data["createdMig"].append(["GPU-a", 1, 0, "MIG-1"])
        data["migModeEnabled"].append("GPU-a")
    after = Registry(tmp_path, boot_id="boot-2").read()
    assert after["bootId"] == "boot-2" and after["migModeEnabled"] == ["GPU-a"]
    assert after["timeSlice"] == {} and after["createdMig"] == []
    with Registry(tmp_path, boot_id="boot-2").update() as data:
        assert data["migModeEnabled"] == ["GPU-a"]
    assert json.loads((tmp_path / REGISTRY_FILE).read_text())["migModeEnabled"] == ["GPU-a"]


def test_a_write_that_fails_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the soak (tests/soak): a save that failed on a full disk left its partial temp file, holding
    the space that had run out, and nothing ever removed it. The old registry stays, and nothing else."""
    registry = Registry(tmp_path, boot_id="boot-1")
    with registry.update() as data:
        data["timeSlice"]["GPU-a"] = {"interval": 2, "claims": ["c1"]}
    before = (tmp_path / REGISTRY_FILE).read_bytes()

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError), registry.update() as data:
        data["timeSlice"]["GPU-b"] = {"interval": 1, "claims": ["c2"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([REGISTRY_FILE, f"{REGISTRY_FILE}.lock"])
    assert (tmp_path / REGISTRY_FILE).read_bytes() == before


def test_an_update_that_changes_nothing_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the soak (tests/soak): start-up reads `createdMig` through an update; on a full disk that
    write failed before any leftover MIG device was destroyed. Only updates that change something write."""
    registry = Registry(tmp_path, boot_id="boot-1")
    with registry.update() as data:
        data["createdMig"].append(["GPU-a", 1, 0, "MIG-1"])

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with registry.update() as data:
        created = list(data["createdMig"])  # read only: no write, so no failure
    assert created == [["GPU-a", 1, 0, "MIG-1"]]
    with pytest.raises(OSError), registry.update() as data:
        data["createdMig"].clear()  # a change still has to be written, and fails
