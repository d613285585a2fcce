"""The per-claim CDI spec: names, content, validation, atomic write and removal, driver discovery."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.cdi import spec_writer
from dra_gpu.cdi.driver_discovery import (
    MigCapabilityError,
    discover_driver_edits,
    discover_from_driver_root,
    mig_capability_minors,
    to_host_path,
)
from dra_gpu.cdi.edits_json import edits_from_json, edits_to_json
from dra_gpu.cdi.spec_builder import (
    CDI_KIND,
    ClaimDevice,
    DriverEdits,
    build_claim_spec,
    cdi_device_id,
    claim_uid_from_file_name,
    gpu_device_nodes,
    mig_capability_nodes,
    spec_file_name,
)
from dra_gpu.cdi.spec_validation import CdiSpecError, spec_problems, validate_spec
from dra_gpu.cdi.spec_writer import CdiSpecWriter, CdiWriteError
from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.sim_driver_root import ci_cap_minor, gi_cap_minor, init_sim_driver_root
from dra_gpu.sharing.interface import CdiDeviceNode, CdiEdits, CdiMount

UID = "0f4e8a52-7d6b-4c1e-9a3e-2b1c5d6e7f80"


@pytest.fixture(scope="module")
def sim_root() -> Iterator[str]:
    root = tempfile.mkdtemp(dir="/tmp", prefix="cdi-sim-")
    init_sim_driver_root(root, "dgx-h100")
    yield root
    subprocess.run(["rm", "-rf", root], check=True)


def spec_for(driver_root: str, driver: DriverEdits, group: CdiEdits | None = None) -> dict[str, Any]:
    devices = [
        ClaimDevice("gpu-0", ("GPU-aaa",), gpu_device_nodes(driver_root, 0), group or CdiEdits()),
        ClaimDevice(
            "gpu-1-mig-1g10gb-19-0",
            ("MIG-bbb",),
            gpu_device_nodes(driver_root, 1) + mig_capability_nodes(driver_root, (30, 31)),
        ),
    ]
    return build_claim_spec(UID, "team-a/train", devices, driver)


def test_names_follow_the_nvidia_convention() -> None:
    assert spec_file_name(UID) == f"k8s.gpu.nvidia.com-claim_{UID}.json"
    assert claim_uid_from_file_name(spec_file_name(UID)) == UID
    assert claim_uid_from_file_name(f"k8s.gpu.nvidia.com-claim_{UID}.yaml") == UID
    assert claim_uid_from_file_name("nvidia.yaml") is None
    assert cdi_device_id(UID, "gpu-0") == f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"


def test_spec_content_with_a_separate_driver_root(sim_root: str) -> None:
    driver = discover_from_driver_root(sim_root)
    mps = CdiEdits(
        env=("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",),
        mounts=(CdiMount("/var/lib/kubelet/plugins/gpu.nvidia.com/mps/x/pipe", "/tmp/nvidia-mps"),),
    )
    spec = spec_for(sim_root, driver, mps)
    validate_spec(spec)
    assert spec["kind"] == CDI_KIND and spec["cdiVersion"] == "0.6.0"
    gpu, mig = spec["devices"]
    assert gpu["name"] == f"{UID}-gpu-0"
    assert gpu["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": f"{sim_root}/dev/nvidia0"}
    ]
    assert gpu["containerEdits"]["env"] == ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
    assert [n["path"] for n in mig["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia1",
        "/dev/nvidia-caps/nvidia-cap30",
        "/dev/nvidia-caps/nvidia-cap31",
    ]
    common = spec["containerEdits"]
    assert "DRA_GPU_CLAIM=team-a/train" in common["env"]
    assert "DRA_GPU_DEVICES=GPU-aaa,MIG-bbb" in common["env"]
    assert not any(e.startswith("NVIDIA_VISIBLE_DEVICES") for e in common["env"])
    assert {n["path"] for n in common["deviceNodes"]} == {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    }
    libs = {m["containerPath"]: m for m in common["mounts"]}
    ml = libs["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]
    # the soname's path in the container, the file its link resolves to (inside the root) as the source
    assert ml["hostPath"] == f"{sim_root}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.133.20"
    assert "ro" in ml["options"] and "bind" in ml["options"]
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in libs and "/usr/bin/nvidia-smi" in libs
    for mount in common["mounts"]:  # only files that exist are mounted
        assert os.path.exists(mount["hostPath"]), mount


def test_driver_at_root_has_no_host_paths() -> None:
    nodes = gpu_device_nodes("/", 3)
    assert nodes == (CdiDeviceNode(path="/dev/nvidia3", host_path=None),)
    spec = build_claim_spec(UID, "a/b", [ClaimDevice("gpu-3", ("GPU-x",), nodes)], DriverEdits())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia3"}]


def test_mig_capability_minors_come_from_the_proc_files(sim_root: str) -> None:
    hardware = open_hardware("dgx-h100", sim_root)
    gpu = hardware.discover().gpus[2]
    instance = hardware.create_mig_device(gpu.uuid, 19, 3)
    try:
        minors = mig_capability_minors(sim_root, gpu.minor, instance.gi_id, instance.ci_id)
        assert minors == (
            gi_cap_minor(gpu.minor, instance.gi_id),
            ci_cap_minor(gpu.minor, instance.gi_id, instance.ci_id),
        )
    finally:
        hardware.destroy_mig_device(gpu.uuid, instance.gi_id, instance.ci_id)
    with pytest.raises(MigCapabilityError, match="gpu9"):
        mig_capability_minors(sim_root, 9, 1, 0)


def test_nvidia_ctk_is_used_when_present(tmp_path: Path, sim_root: str) -> None:
    """A stand-in nvidia-ctk that writes a spec as the real one does: its common edits are taken."""
    ctk = tmp_path / "nvidia-ctk"
    generated = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl"}],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": "/usr/bin/nvidia-cdi-hook",
                    "args": ["nvidia-cdi-hook", "update-ldcache"],
                }
            ],
            "mounts": [
                {
                    "hostPath": "/x/libcuda.so.1",
                    "containerPath": "/usr/lib/libcuda.so.1",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            ],
        },
    }
    ctk.write_text(
        '#!/bin/sh\nfor a in "$@"; do case $a in --output=*) out=${a#--output=};; esac; done\n'
        f"cat > \"$out\" <<'EOF'\n{json.dumps(generated)}\nEOF\n"
    )
    ctk.chmod(0o755)
    edits = discover_driver_edits(sim_root, nvidia_ctk=str(ctk), hook_path="/usr/bin/nvidia-cdi-hook")
    assert edits.source == "nvidia-ctk"
    assert [h.path for h in edits.hooks] == ["/usr/bin/nvidia-cdi-hook"]
    assert edits.env == ()  # NVIDIA_VISIBLE_DEVICES dropped: visibility is by device nodes
    spec = build_claim_spec(UID, "a/b", [ClaimDevice("gpu-0", ("GPU-x",), gpu_device_nodes("/", 0))], edits)
    validate_spec(spec)
    assert spec["containerEdits"]["hooks"][0]["hookName"] == "createContainer"


def test_failing_nvidia_ctk_falls_back_to_own_discovery(tmp_path: Path, sim_root: str) -> None:
    ctk = tmp_path / "nvidia-ctk"
    ctk.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    ctk.chmod(0o755)
    edits = discover_driver_edits(sim_root, nvidia_ctk=str(ctk), hook_path="/usr/bin/nvidia-cdi-hook")
    assert edits.source == "driver-root"
    assert edits.hooks  # own discovery still adds NVIDIA's hooks: the hook binary is there


def _valid() -> dict[str, Any]:
    return build_claim_spec(
        UID, "a/b", [ClaimDevice("gpu-0", ("GPU-x",), gpu_device_nodes("/", 0))], DriverEdits()
    )


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda s: s.update(cdiVersion="0.9.9"), "cdiVersion"),
        (lambda s: s.update(kind="k8s.gpu.nvidia.com"), "kind"),
        (lambda s: s.update(kind="-bad/claim"), "kind"),
        (lambda s: s["devices"][0].update(name="bad name!"), "devices[0].name"),
        (lambda s: s["devices"][0].update(name="x-"), "devices[0].name"),
        (lambda s: s["devices"].append(copy.deepcopy(s["devices"][0])), "used twice"),
        (lambda s: s["devices"][0].update(containerEdits={}), "at least one edit"),
        (lambda s: s.update(devices=[]), "at least one device"),
        (lambda s: s["containerEdits"].update(env=["NOEQUALS"]), "containerEdits.env[0]"),
        (lambda s: s["devices"][0]["containerEdits"]["deviceNodes"].append({"path": "dev/x"}), "absolute"),
        (
            lambda s: s["containerEdits"].update(mounts=[{"hostPath": "/a", "containerPath": "rel"}]),
            "containerPath",
        ),
        (lambda s: s["containerEdits"].update(hooks=[{"hookName": "onBoot", "path": "/x"}]), "hookName"),
    ],
)
def test_validation_names_the_broken_rule(mutate: Any, fragment: str) -> None:
    spec = _valid()
    assert spec_problems(spec) == []
    mutate(spec)
    with pytest.raises(CdiSpecError) as err:
        validate_spec(spec)
    assert fragment in str(err.value)


def test_writer_writes_atomically_and_removes(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path / "cdi")
    path = writer.write(UID, _valid())
    assert path == tmp_path / "cdi" / spec_file_name(UID)
    assert json.loads(path.read_text()) == _valid()
    assert oct(path.stat().st_mode & 0o777) == "0o644"  # container runtimes read it
    assert writer.claim_uids() == {UID}
    assert writer.remove(UID) is True
    assert writer.remove(UID) is False
    assert os.listdir(tmp_path / "cdi") == []


def test_writer_makes_the_cdi_root_again_when_it_was_cleared(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path / "cdi")
    writer.write(UID, _valid())
    writer.write(UID, _valid())  # a rewrite (a repaired spec) replaces the file, leaving nothing beside it
    assert os.listdir(tmp_path / "cdi") == [spec_file_name(UID)]
    subprocess.run(["rm", "-rf", str(tmp_path / "cdi")], check=True)  # a tmpfs /var/run/cdi after a remount
    assert json.loads(writer.write(UID, _valid()).read_text()) == _valid()


def test_writer_retries_when_a_concurrent_prepare_made_the_missing_cdi_root_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two prepares find the CDI root missing; the other one makes it before this one looks. This write
    must still be tried again, not refused because the directory is there now (CI saw that refusal)."""
    root = tmp_path / "cdi"
    other_uid = "0b0b0b0b-0000-4000-8000-000000000000"
    real_write = spec_writer.atomic_write
    interleaved = []

    def write_then_let_the_other_prepare_in(path: Path, data: bytes, **kwargs: Any) -> os.stat_result:
        try:
            return real_write(path, data, **kwargs)
        except CdiWriteError:
            if not interleaved and other_uid not in path.name:
                interleaved.append(path)
                CdiSpecWriter(root).write(other_uid, _valid())  # makes the root, then writes its spec
            raise

    monkeypatch.setattr(spec_writer, "atomic_write", write_then_let_the_other_prepare_in)
    written = CdiSpecWriter(root).write(UID, _valid())
    assert interleaved and json.loads(written.read_text()) == _valid()
    assert sorted(os.listdir(root)) == sorted([spec_file_name(UID), spec_file_name(other_uid)])


def test_writer_refuses_an_invalid_spec_and_writes_nothing(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path)
    spec = _valid()
    spec["kind"] = "nope"
    with pytest.raises(CdiSpecError):
        writer.write(UID, spec)
    assert os.listdir(tmp_path) == []


def test_unwritable_cdi_root_names_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    with pytest.raises(CdiWriteError, match="file-not-dir"):
        CdiSpecWriter(blocker / "cdi").write(UID, _valid())


# ------------------------------------------------------------------ container view vs host driver root
HOST_ROOT = "/run/nvidia/driver"


def test_files_found_under_the_container_root_are_named_by_host_path(sim_root: str) -> None:
    """NVIDIA's chart: the host's driver root is mounted at another path in the plugin's container."""
    driver = discover_driver_edits(sim_root, use_ctk=False, host_driver_root=HOST_ROOT)
    mounts = {m.container_path: m.host_path for m in driver.mounts}
    assert mounts["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"] == (
        f"{HOST_ROOT}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.133.20"
    )
    assert mounts["/usr/bin/nvidia-cuda-mps-control"] == f"{HOST_ROOT}/usr/bin/nvidia-cuda-mps-control"
    nodes = {n.path: n.host_path for n in driver.device_nodes}
    assert nodes["/dev/nvidiactl"] == f"{HOST_ROOT}/dev/nvidiactl"
    spec = spec_for(HOST_ROOT, driver)
    validate_spec(spec)
    assert sim_root not in json.dumps(spec)  # the container's path never reaches the runtime


def test_empty_container_root_finds_nothing_even_if_the_host_root_exists(
    tmp_path: Path, sim_root: str
) -> None:
    """Files are looked for only under the container root: the host root is never read."""
    driver = discover_driver_edits(str(tmp_path), use_ctk=False, host_driver_root=sim_root)
    assert driver.mounts == () and driver.device_nodes == ()


@pytest.mark.parametrize(
    ("path", "container", "host", "expected"),
    [
        ("/driver-root/usr/lib/libcuda.so.1", "/driver-root", "/", "/usr/lib/libcuda.so.1"),
        ("/driver-root", "/driver-root/", "/", "/"),
        ("/driver-root/dev/nvidiactl", "/driver-root", HOST_ROOT, f"{HOST_ROOT}/dev/nvidiactl"),
        ("/usr/bin/nvidia-cdi-hook", "/driver-root", "/", "/usr/bin/nvidia-cdi-hook"),  # the plugin's own
        ("/driver-rootx/lib", "/driver-root", "/", "/driver-rootx/lib"),  # a sibling, not under the root
        ("/x/lib", "/x", "/x", "/x/lib"),
    ],
)
def test_to_host_path(path: str, container: str, host: str, expected: str) -> None:
    assert to_host_path(path, container, host) == expected


def test_nvidia_ctk_paths_are_mapped_to_the_host_root(tmp_path: Path) -> None:
    """nvidia-ctk runs against the container's view; its hostPaths must be translated for the runtime."""
    root = tmp_path / "driver-root"
    ctk = tmp_path / "nvidia-ctk"
    generated = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [],
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": f"{root}/dev/nvidiactl"}],
            "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook"}],
            "mounts": [
                {"hostPath": f"{root}/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1"}
            ],
        },
    }
    ctk.write_text(
        '#!/bin/sh\nfor a in "$@"; do case $a in --output=*) out=${a#--output=};; '
        '--driver-root=*) echo "$a" > "$(dirname "$0")/args";; esac; done\n'
        f"cat > \"$out\" <<'EOF'\n{json.dumps(generated)}\nEOF\n"
    )
    ctk.chmod(0o755)
    edits = discover_driver_edits(
        str(root), nvidia_ctk=str(ctk), host_driver_root=HOST_ROOT, hook_path="/usr/bin/nvidia-cdi-hook"
    )
    assert (tmp_path / "args").read_text().strip() == f"--driver-root={root}"
    assert [(m.host_path, m.container_path) for m in edits.mounts] == [
        (f"{HOST_ROOT}/usr/lib/libcuda.so.1", "/usr/lib/libcuda.so.1")
    ]
    assert [(n.path, n.host_path) for n in edits.device_nodes] == [
        ("/dev/nvidiactl", f"{HOST_ROOT}/dev/nvidiactl")
    ]
    assert [h.path for h in edits.hooks] == ["/usr/bin/nvidia-cdi-hook"]


def test_edits_json_round_trip() -> None:
    edits = CdiEdits(
        env=("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"),
        mounts=(CdiMount("/var/lib/kubelet/plugins/gpu.nvidia.com/mps/x/pipe", "/tmp/nvidia-mps"),),
        device_nodes=(
            CdiDeviceNode("/dev/nvidia-caps/nvidia-cap3", "/host/dev/nvidia-caps/nvidia-cap3"),
            CdiDeviceNode("/dev/nvidia3"),
        ),
    )
    data = json.loads(json.dumps(edits_to_json(edits)))
    assert edits_from_json(data) == edits
    assert edits_from_json({}) == CdiEdits()
    with pytest.raises(KeyError):
        edits_from_json({"mounts": [{"hostPath": "/a"}]})


def test_has_spec(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path / "cdi")
    assert not writer.has_spec(UID)
    writer.write(UID, _valid())
    assert writer.has_spec(UID)
    writer.remove(UID)
    assert not writer.has_spec(UID)
