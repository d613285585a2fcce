"""The host-mode webhook install on a real kube-apiserver: TLS on loopback, the webhook configuration, and a
bad opaque config refused at `kubectl apply` with the field named (the same path `run-e2e.sh` uses)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.lib.driver import HostDriver
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import load_settings
from e2e.lib.webhook_config import WEBHOOK_CONFIG_NAME
from e2e.lib.workloads import claim, gpu_config_time_slicing
from tests.support.control_plane import free_port


@pytest.mark.apiserver
def test_webhook_host_process_rejects_bad_config(kube_apiserver: Any, tmp_path: Path) -> None:
    settings = dataclasses.replace(
        load_settings({}),
        kubeconfig=Path(kube_apiserver.kubeconfig),
        artifacts=tmp_path,
        webhook_port=free_port(),
    )
    kubectl = Kubectl(settings.kubeconfig)
    driver = HostDriver(settings, kubectl, node_name="no-node")
    driver.start_webhook()
    try:
        hooks = kubectl.get_json("validatingwebhookconfiguration", WEBHOOK_CONFIG_NAME)
        url = hooks["webhooks"][0]["clientConfig"]["url"]
        assert url == f"https://127.0.0.1:{settings.webhook_port}/validate-resource-claim-parameters"
        kubectl.run("create", "namespace", "webhook-e2e")
        bad = kubectl.try_apply(
            yaml.safe_dump(claim("webhook-e2e", "bad", gpu_config_time_slicing("VeryLong")))
        )
        assert bad.returncode != 0
        assert "denied the request" in bad.stderr and "sharing.timeSlicingConfig.interval" in bad.stderr, (
            bad.stderr
        )
        good = kubectl.try_apply(
            yaml.safe_dump(claim("webhook-e2e", "good", gpu_config_time_slicing("Long")))
        )
        assert good.returncode == 0, good.stderr
    finally:
        driver.stop_webhook()
    assert (
        kubectl.run("get", "validatingwebhookconfiguration", WEBHOOK_CONFIG_NAME, check=False).returncode != 0
    )
    assert not driver.webhook_running()
