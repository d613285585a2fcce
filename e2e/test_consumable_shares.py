"""NVIDIA's consumable shares on the real cluster: the host plugin restarted with CONSUMABLE_SHARES=memory
publishes whole GPUs with allowMultipleAllocations, and examples/consumable-shares-memory (NVIDIA's
memory-sharing demo) runs as its expect.yaml says; the plugin is restarted as it was afterwards
(test_examples.py skips that example without the flag)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.lib.consumable_shares import restart_with_shares
from e2e.lib.driver import DriverControl, HostDriver
from e2e.lib.example_runner import ExampleRun, cluster_has
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import E2ESettings
from e2e.lib.summary import record_row

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "consumable-shares-memory"


@pytest.fixture
def shared_driver(driver: DriverControl, kubectl: Kubectl) -> Iterator[HostDriver]:
    if not isinstance(driver, HostDriver):
        pytest.skip("restarts the host plugin with CONSUMABLE_SHARES (in-cluster: --set consumableShares)")
    ok, why = cluster_has("kubernetes>=1.35", kubectl)
    if not ok:
        pytest.skip(f"requires kubernetes>=1.35: {why}")
    restart_with_shares(driver, "memory")
    try:
        yield driver
    finally:
        restart_with_shares(driver, "disabled")


@pytest.mark.e2e
def test_nvidia_memory_sharing_demo(
    shared_driver: HostDriver, kubectl: Kubectl, settings: E2ESettings, report_path: Path
) -> None:
    run = ExampleRun(EXAMPLE, kubectl, shared_driver, settings)
    assert cluster_has("consumable-shares", kubectl)[0]
    kubectl.delete_namespace(run.namespace, wait=True)
    failures: list[str] = []
    try:
        failures += run.apply()
        run.wait_expectations()
        missing = run.prepared_claims_without_cdi_spec()
        if missing:
            failures.append(f"claims prepared for running pods without a CDI spec file: {missing}")
    except AssertionError as exc:
        failures.append(str(exc))
    finally:
        run.delete()
    failures += run.wait_cleanup()
    record_row(report_path, run.row("fail" if failures else "pass", failures[0] if failures else ""))
    assert not failures, "\n".join(failures)
