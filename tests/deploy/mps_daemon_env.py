"""The MPS daemon pod settings a plugin started from the rendered chart would use."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from dra_gpu.cli.kubelet_plugin import daemon_pod_settings
from dra_gpu.sharing.mps_pods import DaemonPodSettings


def settings_from_env(env: Mapping[str, str | None]) -> DaemonPodSettings:
    """Parsed from the DaemonSet container's environment as the plugin parses its flags' env defaults."""
    args = argparse.Namespace(
        mps_daemon_image=env["MPS_DAEMON_IMAGE"],
        mps_daemon_image_pull_policy=env["MPS_DAEMON_IMAGE_PULL_POLICY"],
        mps_daemon_image_pull_secrets=env.get("MPS_DAEMON_IMAGE_PULL_SECRETS") or "",
        mps_daemon_service_account=env["MPS_DAEMON_SERVICE_ACCOUNT"],
        mps_daemon_priority_class=env["MPS_DAEMON_PRIORITY_CLASS"],
        mps_daemon_tolerations=env["MPS_DAEMON_TOLERATIONS"],
        mps_daemon_resources=env["MPS_DAEMON_RESOURCES"],
        hardware=env["HARDWARE"],
    )
    return daemon_pod_settings(args)
