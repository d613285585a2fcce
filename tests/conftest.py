"""Session fixtures shared by every test package.

`kube_apiserver`: a real etcd + kube-apiserver (pinned Kubernetes, DRA feature gates on, resource.k8s.io/v1
served) on loopback, started once per session. Yields a `ControlPlane` with `.kubeconfig` (path), `.url`,
`.api_client()` and `.stop()`. Cluster-scoped objects are shared by the whole session: give them unique names.
`kube_scheduler`: the same control plane with a real kube-scheduler running against it.
The binaries come from `e2e/cluster/build.sh control-plane`; logs are copied to
`e2e/_artifacts/` when a test in the session failed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.support.control_plane import ControlPlane, ControlPlaneError  # noqa: E402


@pytest.fixture(scope="session")
def kube_apiserver(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    try:
        plane = ControlPlane()
    except ControlPlaneError as err:  # binaries missing: say how to build them
        pytest.fail(str(err), pytrace=False)
    try:
        plane.start()
    except ControlPlaneError as err:
        saved = plane.save_logs("control-plane-start-failed")
        plane.stop()
        pytest.fail(f"{err}\n(logs copied to {saved})", pytrace=False)
    yield plane
    if request.session.testsfailed:
        plane.save_logs("control-plane")
    plane.stop()


@pytest.fixture(scope="session")
def kube_scheduler(kube_apiserver: ControlPlane) -> ControlPlane:
    """The session control plane with a real kube-scheduler started on it (started once, stopped with it)."""
    if not any(p.name == "kube-scheduler" and p.running() for p in kube_apiserver.processes):
        try:
            kube_apiserver.start_scheduler()
        except ControlPlaneError as err:
            saved = kube_apiserver.save_logs("kube-scheduler-start-failed")
            pytest.fail(f"{err}\n(logs copied to {saved})", pytrace=False)
    return kube_apiserver


# ------------------------------------------------------------------------------------ full local cluster
# Tests marked `cluster` need the whole single-node cluster (kubelet, containerd; root; `build.sh all`).
# They are opt-in because they change the host (node address on lo, iptables chain, /var/lib/kubelet):
#   DRA_GPU_CLUSTER_TESTS=1 .venv/bin/pytest -q -m cluster tests/e2e_cluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: needs the local single-node cluster (e2e/cluster/up.sh)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("DRA_GPU_CLUSTER_TESTS") == "1":
        return
    skip = pytest.mark.skip(
        reason="needs the local cluster; run with DRA_GPU_CLUSTER_TESTS=1 (root, build.sh all)"
    )
    for item in items:
        if "cluster" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[Any]:
    """The e2e cluster from e2e/cluster/cluster.py: reused when already up, else started and stopped here."""
    from e2e.cluster.cluster import Cluster, ClusterError

    cluster = Cluster()
    started_here = not cluster.running()
    try:
        cluster.up()
    except ClusterError as err:
        pytest.fail(str(err), pytrace=False)
    yield cluster
    if started_here:
        cluster.down()
