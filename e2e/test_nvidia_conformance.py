"""NVIDIA's published DRA examples (tests/conformance/nvidia), applied unchanged but for the container image,
and checked from inside the pods against what NVIDIA's README says each pod gets (each example's expect.yaml).

catalog.yaml decides: `run` examples must pass, `xfail` ones may fail for the stated reason, `unsupported`
ones are skipped with their reason. A `run` example written for other simulated hardware, or for hardware an
admin sets up out of band (expect.yaml `nvidiaSmi`; gpu-test4: A100s with NVIDIA's mig-parted half-balanced
layout), runs with the host plugin switched to a fresh simulated node of that kind for its duration
(e2e/lib/other_hardware.py). On kind a DaemonSet's pods cannot switch hardware, so run.sh gives each such
layout a node of its own, set up out of band at creation as the example needs, and the example runs with that
node the only one uncordoned (e2e/lib/pinned_node.py): gpu-test4 and gpu-test6 (xfail) on the DGX A100 node,
extended-resources-mig-1g-12gb on the GH200 node. Elsewhere gpu-test6 runs only where the suite's node is a
dgx-a100 (DRA_GPU_E2E_HARDWARE=dgx-a100). The consumable-shares examples switch the plugin's mode: the host
plugin is restarted, the chart's release upgraded (`--set consumableShares=`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from e2e.lib.consumable_shares import SharesSwitch
from e2e.lib.driver import DriverControl, HostDriver
from e2e.lib.example_runner import cluster_has, hardware_matches, slice_devices
from e2e.lib.incluster import InClusterDriver
from e2e.lib.kubectl import Kubectl
from e2e.lib.nvidia_conformance import (
    CatalogEntry,
    ConformanceRun,
    consumable_shares_modes,
    import_stand_in_image,
    load_catalog,
    raw_documents,
    unserved_api_versions,
)
from e2e.lib.other_hardware import plugin_on_hardware
from e2e.lib.pinned_node import pinned_to_node
from e2e.lib.settings import DriverMode, E2ESettings
from e2e.lib.summary import ExampleRow, record_row

ENTRIES = load_catalog()
CONSUMABLE_SHARES_FLAG = {"unlimited": "unlimited", "memory": "memory", "integer": "4"}  # NVIDIA's README


@pytest.fixture(scope="module")
def stand_in_image(settings: E2ESettings, kubectl: Kubectl) -> None:
    if settings.mode is not DriverMode.HOST and settings.kind_cluster is None:
        pytest.skip("the stand-in image goes into the local cluster's containerd or a kind cluster's nodes")
    import_stand_in_image(settings.kind_cluster)


@pytest.fixture(scope="module")
def shares(driver: DriverControl) -> Iterator[SharesSwitch | None]:
    """The plugin's consumable-shares mode, switched as each example needs (NVIDIA's three are consecutive)
    and back to none after the module."""
    if not isinstance(driver, HostDriver | InClusterDriver):
        yield None
        return
    switch = SharesSwitch(driver)
    try:
        yield switch
    finally:
        switch.reset()


def _skip(report_path: Path, entry: CatalogEntry, why: str) -> NoReturn:
    record_row(report_path, ExampleRow(f"nvidia/{entry.name}", "-", "-", "-", "skip", why))
    pytest.skip(why)


@pytest.mark.e2e
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_nvidia_example(
    entry: CatalogEntry,
    kubectl: Kubectl,
    driver: DriverControl,
    settings: E2ESettings,
    report_path: Path,
    stand_in_image: None,
    shares: SharesSwitch | None,
    request: pytest.FixtureRequest,
) -> None:
    if entry.status in ("unsupported", "unverified"):
        _skip(report_path, entry, f"{entry.status}: {entry.reason}")
    if shares is not None and not entry.name.startswith("consumable-shares-"):
        shares.reset()  # the examples before this one may have left the plugin in a consumable-shares mode
    run = ConformanceRun(entry.folder, kubectl, driver, settings)
    if not hardware_matches(run.exp, settings):
        # Written for other hardware, or for hardware an admin set up out of band (NVIDIA's README): the
        # host plugin serves a fresh simulated node of that kind, prepared so, while the example runs.
        switched = contextlib.ExitStack()
        request.addfinalizer(switched.close)
        pinned_node = settings.hardware_nodes.get(run.exp.hardware)
        if isinstance(driver, InClusterDriver) and pinned_node is not None:
            # run.sh set that node up with this example's nvidiaSmi steps (or none), as NVIDIA's README does
            driver = switched.enter_context(pinned_to_node(settings, kubectl, run.exp.hardware))
        elif isinstance(driver, HostDriver) and entry.status == "run":
            driver = switched.enter_context(plugin_on_hardware(driver, run.exp.hardware, run.exp.nvidiaSmi))
        else:
            setup = " set up with nvidia-smi" if run.exp.nvidiaSmi else ""
            where = "host plugin" if isinstance(driver, HostDriver) else "in-cluster plugin (no node of it)"
            why = f"written for hardware {run.exp.hardware}{setup}; the {where} simulates {settings.hardware}"
            _skip(report_path, entry, why)
        settings = driver.settings
        run = ConformanceRun(entry.folder, kubectl, driver, settings)
    for requirement in run.exp.requires:
        ok, why = cluster_has(requirement, kubectl)
        if not ok:
            _skip(report_path, entry, f"requires {requirement}: {why}")
    unserved = unserved_api_versions(raw_documents(entry, run.exp.manifests), kubectl)
    if unserved:
        _skip(report_path, entry, f"the cluster does not serve {', '.join(unserved)}")
    mode = entry.name.removeprefix("consumable-shares-")
    if mode != entry.name:
        # One plugin serves one --consumable-shares mode: the plugin is switched to the example's (NVIDIA's
        # README value) for it (host: restarted; kind: the release upgraded); to none after the module.
        assert shares is not None, f"cannot switch the consumable-shares mode of {type(driver).__name__}"
        shares.set(CONSUMABLE_SHARES_FLAG[mode])
        modes = consumable_shares_modes(slice_devices(kubectl))
        assert mode in modes, f"the published GPUs show consumable-shares modes {sorted(modes)}, not {mode}"
    if entry.status == "xfail":
        request.applymarker(pytest.mark.xfail(reason=entry.reason, strict=False))
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
    # An expected failure is recorded as such, so that the summary table does not read as a regression.
    failed = "xfail" if entry.status == "xfail" else "fail"
    row = run.row(failed if failures else "pass", failures[0] if failures else "")
    record_row(
        report_path,
        ExampleRow(f"nvidia/{entry.name}", row.pods, row.devices, row.sharing, row.result, row.detail),
    )
    assert not failures, "\n".join(failures)
