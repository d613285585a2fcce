"""Helpers behind e2e/cluster/build.sh and the control-plane fixture (no Kubernetes binaries needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.control_plane import (
    REPO_ROOT,
    ControlPlane,
    ControlPlaneError,
    Pki,
    feature_gate_flag,
    kubernetes_versions_under_test,
    parse_feature_gates_help,
    read_versions,
    selected_kubernetes_version,
)


def _load_gomod_localize() -> ModuleType:
    from e2e.cluster import gomod_localize

    return gomod_localize


def test_local_replaces_are_dropped_and_placeholders_pinned() -> None:
    gomod = {
        "Require": [
            {"Path": "k8s.io/api", "Version": "v0.0.0"},
            {"Path": "go.etcd.io/etcd/api/v3", "Version": "v3.6.16"},
            {"Path": "example.com/remote", "Version": "v1.0.0"},
        ],
        "Replace": [
            {"Old": {"Path": "k8s.io/api"}, "New": {"Path": "./staging/src/k8s.io/api"}},
            {"Old": {"Path": "go.etcd.io/etcd/api/v3"}, "New": {"Path": "../api"}},
            {"Old": {"Path": "example.com/remote"}, "New": {"Path": "example.com/fork", "Version": "v1.2.0"}},
        ],
    }
    edits = _load_gomod_localize().localize_edits(gomod, "v0.36.3")
    assert edits == [
        "-dropreplace=k8s.io/api",
        "-require=k8s.io/api@v0.36.3",
        "-dropreplace=go.etcd.io/etcd/api/v3",
    ]


def test_localize_rejects_a_version_without_v() -> None:
    with pytest.raises(ValueError, match="staging version"):
        _load_gomod_localize().localize_edits({}, "0.36.3")


def test_feature_gates_are_parsed_from_help_and_filtered() -> None:
    help_text = """
      --feature-gates mapStringBool    A set of key=value pairs that describe feature gates. Options are:
                                       APIResponseCompression=true|false (BETA - default=true)
                                       kube:DRAConsumableCapacity=true|false (BETA - default=true)
                                       kube:AllAlpha=true|false (ALPHA - default=false)
      --help                           help for kube-apiserver
    """
    gates = parse_feature_gates_help(help_text)
    assert gates == {"APIResponseCompression", "DRAConsumableCapacity", "AllAlpha"}
    assert feature_gate_flag(["DRAConsumableCapacity", "GoneGate"], gates) == "DRAConsumableCapacity=true"


def test_versions_file_pins_every_component() -> None:
    versions = read_versions()
    for key in ("KUBERNETES_VERSION", "ETCD_VERSION", "CONTAINERD_VERSION", "RUNC_VERSION"):
        assert versions[key].startswith("v"), key


def test_tested_versions_are_the_oldest_supported_and_the_newest_minor() -> None:
    tested = kubernetes_versions_under_test()
    minors = [int(v.split(".")[1]) for v in tested]
    assert minors == sorted(minors) and len(tested) >= 2
    assert minors[0] == 34  # resource.k8s.io/v1 (the only API the driver speaks) is GA since 1.34
    assert read_versions()["KUBERNETES_VERSION"] in tested


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        ("", "v1.37.2"),
        ("1.34", "v1.34.12"),
        ("v1.37", "v1.37.2"),
        ("v1.36.3", "v1.36.3"),
        ("1.36.3", "v1.36.3"),
    ],
)
def test_kubernetes_version_selection_matches_the_shell_helper(requested: str, expected: str) -> None:
    versions = {"KUBERNETES_VERSIONS": "v1.34.12,v1.37.2", "KUBERNETES_VERSION": "v1.37.2"}
    assert selected_kubernetes_version({"KUBERNETES_VERSION": requested}, versions) == expected
    script = (
        "KUBERNETES_VERSIONS=v1.34.12,v1.37.2; KUBERNETES_VERSION=v1.37.2; "
        "KUBERNETES_STAGING_VERSION=v0.37.2; "
        f'source "{REPO_ROOT}/e2e/cluster/k8s-version.sh"; select_kubernetes_version "$1" && '
        'echo "$KUBERNETES_VERSION $KUBERNETES_STAGING_VERSION"'
    )
    out = subprocess.run(
        ["bash", "-c", script, "bash", requested], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [expected, "v0." + expected.removeprefix("v1.")]


@pytest.mark.parametrize("requested", ["1.36", "banana", "v1.x.0"])
def test_unknown_kubernetes_version_is_refused_with_the_fix(requested: str) -> None:
    versions = {"KUBERNETES_VERSIONS": "v1.34.12,v1.37.2", "KUBERNETES_VERSION": "v1.37.2"}
    with pytest.raises(ControlPlaneError, match="KUBERNETES_VERSION="):
        selected_kubernetes_version({"KUBERNETES_VERSION": requested}, versions)
    script = (
        "KUBERNETES_VERSIONS=v1.34.12,v1.37.2; KUBERNETES_VERSION=v1.37.2; "
        f'source "{REPO_ROOT}/e2e/cluster/k8s-version.sh"; select_kubernetes_version "$1"'
    )
    out = subprocess.run(["bash", "-c", script, "bash", requested], capture_output=True, text=True)
    assert out.returncode == 1 and "KUBERNETES_VERSION=" in out.stderr


def test_pki_issues_a_server_certificate_the_ca_verifies(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    pair = pki.issue("srv", "kube-apiserver", ips=["127.0.0.1"], dns=["localhost"], server=True)
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(pki.ca.cert), str(pair.cert)], capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stderr
    text = subprocess.run(
        ["openssl", "x509", "-in", str(pair.cert), "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in text
    assert "DNS:localhost" in text
    assert "TLS Web Server Authentication" in text
    # Issuing again reuses the files rather than minting a new key.
    assert pki.issue("srv", "kube-apiserver").key.read_bytes() == pair.key.read_bytes()


def test_missing_binaries_name_the_build_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ControlPlaneError, match=r"e2e/cluster/build\.sh control-plane"):
        ControlPlane()
    assert not (tmp_path / "empty-cache").exists()


def test_prune_keeps_the_newest_log_dirs_of_one_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support import control_plane

    monkeypatch.setattr(control_plane, "ARTIFACTS_DIR", tmp_path)
    for minute in range(5):
        (tmp_path / f"control-plane-20260101T00{minute:02d}00").mkdir()
    (tmp_path / "control-plane-start-failed-20260101T000000").mkdir()
    control_plane.prune_artifacts("control-plane", keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "control-plane-20260101T000300",
        "control-plane-20260101T000400",
        "control-plane-start-failed-20260101T000000",
    ]
