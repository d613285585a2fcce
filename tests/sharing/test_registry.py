"""The sharing registry on real files: an unreadable file is kept and refused, never silently reset; a reboot
forgets what a reboot undoes and keeps the MIG mode records (MIG mode outlives a reboot)."""

from __future__ import annotations

import json
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
