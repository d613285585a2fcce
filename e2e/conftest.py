"""Fixtures of the end-to-end suite: the cluster (current kubeconfig), the driver, the run report.

Runs against whatever cluster `DRA_GPU_E2E_KUBECONFIG` / `e2e/_artifacts/kubeconfig` / `KUBECONFIG` names:
- host mode (default, local cluster): the kubelet plugin and the webhook are host processes. If they do not
  run yet, the session installs them and removes them at the end (run-e2e.sh and the demo install them once).
- in-cluster mode (`DRA_GPU_E2E_MODE=in-cluster`, kind): the chart's pods are the driver.
Without a reachable cluster every test is skipped, unless `DRA_GPU_E2E_REQUIRE=1` (run-e2e.sh sets it) turns
that into an error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from e2e.lib.driver import DriverControl, HostDriver  # noqa: E402
from e2e.lib.incluster import InClusterDriver  # noqa: E402
from e2e.lib.kubectl import Kubectl, KubectlError  # noqa: E402
from e2e.lib.settings import DRIVER_NAME, DriverMode, E2ESettings, load_settings  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: needs a running Kubernetes cluster with the driver")
    config.addinivalue_line("markers", "disruptive: restarts the kubelet or the plugin (run last)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Disruptive tests last, so that a failure there cannot spoil the examples.
    items.sort(key=lambda item: 1 if item.get_closest_marker("disruptive") else 0)


@pytest.fixture(scope="session")
def settings() -> E2ESettings:
    return load_settings()


@pytest.fixture(scope="session")
def kubectl(settings: E2ESettings) -> Kubectl:
    problem = ""
    if not settings.kubeconfig.exists():
        problem = f"no kubeconfig at {settings.kubeconfig} (start a cluster: make cluster-up)"
    else:
        try:
            Kubectl(settings.kubeconfig).run("get", "--raw", "/readyz", timeout=15)
        except (KubectlError, FileNotFoundError, OSError) as exc:
            problem = f"the cluster in {settings.kubeconfig} does not answer: {exc}"
    if problem:
        if os.environ.get("DRA_GPU_E2E_REQUIRE") == "1":
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)
    return Kubectl(settings.kubeconfig)


@pytest.fixture(scope="session")
def driver(settings: E2ESettings, kubectl: Kubectl) -> Iterator[DriverControl]:
    _refuse_busy_node(kubectl)
    if settings.mode is DriverMode.IN_CLUSTER:
        in_cluster = InClusterDriver(settings, kubectl)
        in_cluster.wait_plugin_ready()
        yield in_cluster
        return
    host = HostDriver(settings, kubectl)
    installed_here = not host.plugin_running()
    if installed_here:
        host.install(log=lambda msg: print(f"[e2e] {msg}", file=sys.stderr))
    else:
        host.wait_plugin_ready()
    yield host
    if installed_here and os.environ.get("DRA_GPU_E2E_KEEP_DRIVER") != "1":
        host.uninstall()


def _refuse_busy_node(kubectl: Kubectl) -> None:
    """The examples need the whole simulated node: fail early if claims from elsewhere hold its devices."""
    from e2e.lib.claims import allocated_devices

    busy = [
        f"{c['metadata']['namespace']}/{c['metadata']['name']}"
        for c in kubectl.items("resourceclaims.resource.k8s.io", all_namespaces=True)
        if any(d.is_ours for d in allocated_devices(c))
    ]
    if busy:
        pytest.fail(
            f"{len(busy)} ResourceClaim(s) already hold {DRIVER_NAME} devices: {busy[:8]}; delete them first "
            "(the demo: make demo-down, or python -m e2e.lib.demo down to keep the cluster)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def report_path(settings: E2ESettings) -> Path:
    return settings.artifacts / "e2e-report.json"


@pytest.fixture
def namespace(kubectl: Kubectl, settings: E2ESettings, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted (and waited for) afterwards."""
    import secrets

    base = request.node.name.split("[")[0].removeprefix("test_").replace("_", "-")[:40].strip("-")
    name = f"{settings.namespace_prefix}{base}-{secrets.token_hex(2)}"
    kubectl.create_namespace(name)
    yield name
    kubectl.delete_namespace(name, wait=True)
