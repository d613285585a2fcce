"""NVIDIA's consumable shares on the real cluster: the plugin switched to CONSUMABLE_SHARES=memory (the
host plugin restarted with it; on kind `helm upgrade --set consumableShares=memory`, the DaemonSet rolled)
publishes whole GPUs with allowMultipleAllocations, and examples/consumable-shares-memory (NVIDIA's
memory-sharing demo) runs as its expect.yaml says; the plugin is switched back afterwards (test_examples.py
skips that example without the flag).

NVIDIA's three examples (tests/conformance/nvidia/consumable-shares-*) are also scaled past the node's GPU
count (12 replicas on a DGX H100), with the plugin in each example's mode: the claims pack onto the GPUs as
far as the mode allows (4 per GPU with --consumable-shares=4; all on one GPU in unlimited mode, and in memory
mode while the 4Gi requests fit in its memory), which is checked by counting the claims each GPU holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.lib.consumable_shares import (
    NVIDIA_FLAG,
    SharesSwitch,
    claims_per_gpu,
    claims_per_gpu_limit,
    expected_claims_per_gpu,
    scaled_replicas,
    template_requests,
    whole_gpus,
)
from e2e.lib.driver import DriverControl, HostDriver
from e2e.lib.example_runner import ExampleRun, cluster_has
from e2e.lib.expectations import phase
from e2e.lib.incluster import InClusterDriver
from e2e.lib.kubectl import Kubectl
from e2e.lib.nvidia_conformance import CONFORMANCE_DIR, import_stand_in_image, substitute_stand_in
from e2e.lib.settings import DriverMode, E2ESettings
from e2e.lib.summary import ExampleRow, record_row
from e2e.lib.waiting import WaitTimeoutError, wait_until
from tests.deploy.expect_model import load_expectation

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "consumable-shares-memory"


def switchable(driver: DriverControl) -> HostDriver | InClusterDriver:
    """The plugin as something whose --consumable-shares mode can be switched (both paths can)."""
    assert isinstance(driver, HostDriver | InClusterDriver), f"unknown driver {type(driver).__name__}"
    return driver


@pytest.fixture(scope="module")
def shares(driver: DriverControl) -> Iterator[SharesSwitch]:
    """The plugin's mode, switched as each test needs and back to none after the module's last test."""
    switch = SharesSwitch(switchable(driver))
    try:
        yield switch
    finally:
        switch.reset()


@pytest.fixture
def shared_driver(shares: SharesSwitch, kubectl: Kubectl) -> HostDriver | InClusterDriver:
    ok, why = cluster_has("kubernetes>=1.35", kubectl)
    if not ok:
        pytest.skip(f"requires kubernetes>=1.35: {why}")
    shares.set("memory")
    return shares.driver


@pytest.mark.e2e
def test_nvidia_memory_sharing_demo(
    shared_driver: HostDriver | InClusterDriver, kubectl: Kubectl, settings: E2ESettings, report_path: Path
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


@pytest.fixture(scope="module")
def stand_in_image(settings: E2ESettings) -> None:
    """NVIDIA's manifests run with the stand-in image (as in e2e/test_nvidia_conformance.py)."""
    if settings.mode is not DriverMode.HOST and settings.kind_cluster is None:
        pytest.skip("the stand-in image goes into the local cluster's containerd or a kind cluster's nodes")
    import_stand_in_image(settings.kind_cluster)


@pytest.mark.e2e
@pytest.mark.parametrize("mode", sorted(NVIDIA_FLAG))
def test_nvidia_example_scaled_past_the_gpu_count(
    mode: str,
    shares: SharesSwitch,
    kubectl: Kubectl,
    report_path: Path,
    stand_in_image: None,
) -> None:
    ok, why = cluster_has("kubernetes>=1.35", kubectl)
    if not ok:
        pytest.skip(f"requires kubernetes>=1.35: {why}")
    folder = CONFORMANCE_DIR / f"consumable-shares-{mode}"
    exp = load_expectation(folder / "expect.yaml")
    docs = [
        d
        for name in exp.manifests
        for d in yaml.safe_load_all((folder / name).read_text())
        if isinstance(d, dict)
    ]
    (deployment,) = [d for d in docs if d.get("kind") == "Deployment"]
    shares.set(NVIDIA_FLAG[mode])
    gpus = whole_gpus(shares.driver.wait_slices())
    limit = claims_per_gpu_limit(mode, gpus[0][1], template_requests(docs))
    replicas = scaled_replicas(len(gpus))
    expected = expected_claims_per_gpu([g for g, _ in gpus], limit, replicas)
    running = sum(expected.values())
    namespace = exp.namespace
    kubectl.delete_namespace(namespace, wait=True)
    observed: dict[str, int] = {}
    failures: list[str] = []
    try:
        kubectl.apply(yaml.safe_dump_all(substitute_stand_in(docs)))
        kubectl.run(
            "scale", "deployment", deployment["metadata"]["name"], "-n", namespace, f"--replicas={replicas}"
        )

        def settled() -> dict[str, int] | None:
            pods = kubectl.items("pods", namespace)
            observed.clear()
            observed.update(claims_per_gpu(kubectl.items("resourceclaims.resource.k8s.io", namespace)))
            up = sum(phase(p) == "Running" for p in pods)
            return dict(observed) if len(pods) == replicas and up == running else None

        try:
            wait_until(settled, timeout_s=240, what=f"{running} of {replicas} replicas running")
        except WaitTimeoutError as exc:  # the counts say more than the timeout alone
            failures.append(f"{exc}; claims per GPU {observed}, expected {expected}")
        # Which GPU fills first is the scheduler's order; how many claims the GPUs hold is the mode's.
        if not failures and sorted(observed.values()) != sorted(expected.values()):
            failures.append(f"claims per GPU {observed}, expected {expected} (in some order)")
    finally:
        kubectl.delete_namespace(namespace, wait=True)
    shown = ", ".join(f"{gpu.split('/')[-1]} x{n}" for gpu, n in sorted(observed.items()))
    record_row(
        report_path,
        ExampleRow(
            f"nvidia/consumable-shares-{mode} x{replicas}",
            f"{sum(observed.values())}/{replicas} allocated",
            shown,
            f"--consumable-shares={NVIDIA_FLAG[mode]}",
            "fail" if failures else "pass",
            failures[0] if failures else "",
        ),
    )
    assert not failures, "\n".join(failures)
