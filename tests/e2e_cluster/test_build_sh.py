"""e2e/cluster/build.sh as a command: stamps make a second run a no-op, bad targets are named."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.control_plane import REPO_ROOT, bin_dir

BUILD_SH = REPO_ROOT / "e2e" / "cluster" / "build.sh"


def test_unknown_target_is_rejected_with_the_valid_ones() -> None:
    res = subprocess.run([str(BUILD_SH), "kubelett"], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    assert "unknown target 'kubelett'" in res.stderr
    assert "control-plane" in res.stderr


@pytest.mark.apiserver
def test_second_control_plane_build_is_a_stamp_hit() -> None:
    # The apiserver fixture's precondition: the control plane was built (make test runs build.sh first).
    if not (bin_dir() / "kube-apiserver").exists():
        pytest.fail("kube-apiserver not built: run e2e/cluster/build.sh control-plane", pytrace=False)
    res = subprocess.run([str(BUILD_SH), "control-plane"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    for component in ("etcd", "kube-apiserver", "kube-scheduler"):
        assert f"[build] {component} " in res.stderr
    assert res.stderr.count("up to date") == 3, res.stderr
    assert "done in" not in res.stderr
