"""Every example of `examples/` on the real cluster: apply, check what its expect.yaml promises, delete, and
check that nothing is left (claims unprepared, CDI specs removed, hardware back to baseline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.lib.driver import DriverControl
from e2e.lib.example_runner import ExampleRun, cluster_has, example_folders, hardware_matches
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import E2ESettings
from e2e.lib.summary import record_row

FOLDERS = example_folders()


@pytest.mark.e2e
@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_example(
    folder: Path, kubectl: Kubectl, driver: DriverControl, settings: E2ESettings, report_path: Path
) -> None:
    run = ExampleRun(folder, kubectl, driver, settings)
    if not hardware_matches(run.exp, settings):
        pytest.skip(f"written for hardware {run.exp.hardware}, the node simulates {settings.hardware}")
    for requirement in run.exp.requires:
        ok, why = cluster_has(requirement, kubectl)
        if not ok:
            record_row(report_path, run.row("skip", why))
            pytest.skip(f"requires {requirement}: {why}")
    # A previous, interrupted run may have left the namespace behind.
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
