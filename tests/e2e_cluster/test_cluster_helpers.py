"""Pure helpers of e2e/cluster/cluster.py and the OCI image builder (no cluster needed)."""

from __future__ import annotations

import hashlib
import json
import tarfile
import tomllib
from pathlib import Path

import pytest

from e2e.cluster.cluster import (
    ClusterError,
    cni_conflist,
    common_cgroup_root,
    containerd_config,
    host_nameservers,
    kubelet_config,
    own_cgroups,
)
from e2e.cluster.oci_image import ImageSpec, build_archive

PROC_CGROUP = """9:name=systemd:/
8:pids:/
4:memory:/process_api/82af
3:cpuset:/
1:cpu,cpuacct:/
0::/
"""


def test_own_cgroups_reads_every_v1_controller() -> None:
    paths = own_cgroups(PROC_CGROUP)
    assert paths == {
        "name=systemd": "/",
        "pids": "/",
        "memory": "/process_api/82af",
        "cpuset": "/",
        "cpu": "/",
        "cpuacct": "/",
    }


def test_cgroup_root_is_inside_our_cgroup_in_every_hierarchy() -> None:
    assert common_cgroup_root(own_cgroups(PROC_CGROUP)) == "/process_api/82af"
    assert common_cgroup_root({"cpu": "/", "memory": "/"}) == "/"


def test_cgroup_root_refuses_paths_that_disagree() -> None:
    with pytest.raises(ClusterError, match="cgroup paths disagree"):
        common_cgroup_root({"memory": "/a/b", "cpu": "/c"})
    with pytest.raises(ClusterError, match="cgroup v1"):
        common_cgroup_root({})


def test_containerd_config_parses_and_points_cdi_and_cni_at_our_dirs() -> None:
    text = containerd_config(Path("/b"), Path("/s"), Path("/r"), Path("/r/c.sock"))
    config = tomllib.loads(text)
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert config["version"] == 3
    assert runtime["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert runtime["cni"]["bin_dirs"] == ["/b/cni"]
    assert runtime["containerd"]["runtimes"]["runc"]["options"] == {
        "BinaryName": "/b/runc",
        "Root": "/r/runc",
        "SystemdCgroup": False,
    }
    # No process here may lower its oom_score_adj (CAP_SYS_RESOURCE is withheld).
    assert runtime["restrict_oom_score_adj"] is True
    assert config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"].startswith(
        "registry.local/"
    )


def test_kubelet_config_keeps_pods_under_the_cgroup_root() -> None:
    config = kubelet_config(
        cgroup_root="/process_api/82af/dra-gpu-e2e",
        containerd_sock=Path("/r/c.sock"),
        ca=Path("/p/ca.crt"),
        serving_cert=Path("/p/k.crt"),
        serving_key=Path("/p/k.key"),
        feature_gates={"DRADeviceTaints": True},
    )
    assert config["failCgroupV1"] is False
    assert (config["cgroupDriver"], config["cgroupRoot"]) == ("cgroupfs", "/process_api/82af/dra-gpu-e2e")
    assert config["containerRuntimeEndpoint"] == "unix:///r/c.sock"
    assert config["featureGates"] == {"DRADeviceTaints": True}


def test_cni_conflist_uses_bridge_and_host_local() -> None:
    plugins = cni_conflist()["plugins"]
    assert [p["type"] for p in plugins] == ["bridge", "portmap"]
    assert plugins[0]["ipam"]["type"] == "host-local"


def test_oci_archive_is_a_valid_deterministic_layout(tmp_path: Path) -> None:
    rootfs = tmp_path / "root"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "bin" / "tool").write_bytes(b"#!/bin/sh\necho hi\n")
    (rootfs / "bin" / "tool").chmod(0o755)
    (rootfs / "bin" / "alias").symlink_to("tool")
    spec = ImageSpec("registry.local/tool:1", entrypoint=("/bin/tool",))
    digest = build_archive(spec, rootfs, tmp_path / "a.tar")
    assert build_archive(spec, rootfs, tmp_path / "b.tar") == digest
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()

    with tarfile.open(tmp_path / "a.tar") as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    index = json.loads(blobs["index.json"])
    entry = index["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == "registry.local/tool:1"
    assert entry["digest"] == digest
    manifest_bytes = blobs[f"blobs/sha256/{digest.removeprefix('sha256:')}"]
    manifest = json.loads(manifest_bytes)
    for ref in (manifest["config"], *manifest["layers"]):
        blob = blobs[f"blobs/sha256/{ref['digest'].removeprefix('sha256:')}"]
        assert "sha256:" + hashlib.sha256(blob).hexdigest() == ref["digest"]
        assert len(blob) == ref["size"]
    config = json.loads(blobs[f"blobs/sha256/{manifest['config']['digest'].removeprefix('sha256:')}"])
    assert config["config"]["Entrypoint"] == ["/bin/tool"]


def test_image_reference_needs_a_tag() -> None:
    with pytest.raises(ValueError, match="needs a tag"):
        _ = ImageSpec("registry.local/tool").tag


def test_pods_get_only_reachable_host_nameservers() -> None:
    resolv = "search example\nnameserver 127.0.0.53\nnameserver 10.255.255.53\nnameserver fd00::1\n"
    assert host_nameservers(resolv) == ["10.255.255.53"]
