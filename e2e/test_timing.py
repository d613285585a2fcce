"""How long a GPU pod takes from creation to Running on the real cluster, and how much of that is ours.

The figure goes to the run report (`e2e/_artifacts/e2e-report.json`) for run-e2e.sh's summary; nothing about
speed is asserted here, only that the pod starts and the plugin's metrics account for its prepare.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from e2e.lib.driver import DriverControl
from e2e.lib.kubectl import Kubectl
from e2e.lib.metrics import HistogramTotal, histogram_total
from e2e.lib.pod_timing import api_client, create_and_time_to_running
from e2e.lib.settings import E2ESettings
from e2e.lib.summary import record_timing
from e2e.lib.waiting import namespace_report
from e2e.lib.workloads import claim_template, pod_with_template

PREPARE_HISTOGRAM = "dra_gpu_request_duration_seconds"
PREPARE_LABELS = {"method": "NodePrepareResources"}
RUNS = 3


def _prepare_total(driver: DriverControl) -> HistogramTotal:
    return histogram_total(driver.metrics_text(), PREPARE_HISTOGRAM, PREPARE_LABELS)


@pytest.mark.e2e
def test_gpu_pod_create_to_running(
    kubectl: Kubectl, driver: DriverControl, settings: E2ESettings, namespace: str, report_path: Path
) -> None:
    kubectl.apply(yaml.safe_dump(claim_template(namespace, "gpu")))
    durations: list[float] = []
    prepare: list[float] = []
    api = api_client(settings.kubeconfig)
    for i in range(RUNS):
        name = f"pod{i}"
        before = _prepare_total(driver)
        pod = pod_with_template(namespace, name, "gpu", settings.test_image)
        try:
            durations.append(create_and_time_to_running(api, namespace, pod, settings.pod_timeout_s))
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{namespace_report(kubectl, namespace, driver.log_tail)}") from None
        spent = _prepare_total(driver).minus(before)
        assert spent.count >= 1, f"no NodePrepareResources call counted in {PREPARE_HISTOGRAM} for {name}"
        prepare.append(spent.sum_s)
        kubectl.run("delete", "pod", name, "-n", namespace, "--wait=true", "--timeout=120s", timeout=150)
    median = sorted(durations)[len(durations) // 2]
    median_prepare = sorted(prepare)[len(prepare) // 2]
    record_timing(report_path, "pod_create_to_running_s", median)
    record_timing(report_path, "node_prepare_s", median_prepare)
    record_timing(report_path, "node_prepare_share_pct", 100.0 * median_prepare / median)
    print(
        f"pod create -> Running: {[round(d, 2) for d in durations]} s; NodePrepareResources: "
        f"{[round(p * 1000) for p in prepare]} ms"
    )
