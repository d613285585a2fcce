"""Where the end-to-end suite finds things: one frozen object built from the environment.

Every knob has a default that matches the local cluster (`e2e/cluster/up.sh`), so `pytest e2e` works after
`make cluster-up`; the kind path (`e2e/kind/run.sh`) sets `DRA_GPU_E2E_MODE=in-cluster` and its kubeconfig.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = REPO_ROOT / "e2e" / "_artifacts"
DRIVER_NAME = "gpu.nvidia.com"


class DriverMode(Enum):
    """How the driver runs: host processes next to the local kubelet, or the Helm chart's pods (kind)."""

    HOST = "host"
    IN_CLUSTER = "in-cluster"


@dataclass(frozen=True)
class E2ESettings:
    kubeconfig: Path
    mode: DriverMode
    artifacts: Path
    driver_root: Path  # simulated NVIDIA driver root (host mode: on this machine; kind: inside the node)
    hardware: str
    cdi_root: Path
    kubelet_dir: Path
    test_image: str
    node_name: str | None  # None: the cluster's only node
    second_node: str | None  # a second GPU node with other hardware (kind), for e2e/test_two_nodes.py
    kind_cluster: str | None  # the kind cluster e2e/kind/run.sh made; None: not a kind run
    plugin_port: int
    webhook_port: int
    namespace_prefix: str
    chart_namespace: str  # where the chart runs in in-cluster mode
    chart_release: str  # the release e2e/kind/run.sh installed there
    chart_values: Path | None  # the values file of that release: a test that uninstalls it installs it again
    hardware_nodes: Mapping[str, str]  # kind: hardware layout -> the (cordoned) node that simulates it
    pod_timeout_s: float

    @property
    def plugin_endpoint(self) -> str:
        return f"127.0.0.1:{self.plugin_port}"


def _kubernetes_version_env() -> dict[str, str]:
    """`e2e/cluster/versions.env` as a dict (KEY=VALUE lines), empty when the file is missing."""
    path = REPO_ROOT / "e2e" / "cluster" / "versions.env"
    values: dict[str, str] = {}
    if not path.exists():
        return values
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip().strip('"')
    return values


def cluster_bin_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The directory where `e2e/cluster/build.sh` puts the binaries (kubectl, helm, ...) of the selected
    Kubernetes version ($KUBERNETES_VERSION, else the default of versions.env)."""
    cache = Path(env.get("DRA_GPU_CACHE") or Path.home() / ".cache" / "dra-gpu")
    return cache / "k8s" / pinned_kubernetes_version(env) / "bin"


def pinned_kubernetes_version(env: Mapping[str, str] = os.environ) -> str:
    """The Kubernetes release under test; `make e2e` runs once per entry of KUBERNETES_VERSIONS."""
    from tests.support.control_plane import selected_kubernetes_version

    versions = _kubernetes_version_env()
    if "KUBERNETES_VERSION" not in versions:
        return "v1.37.2"
    return selected_kubernetes_version(env, versions)


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{key}={raw!r} is not an integer; unset it or give a port number") from exc


def _hardware_nodes(raw: str) -> dict[str, str]:
    """DRA_GPU_E2E_HARDWARE_NODES: `layout=node,layout=node` (e2e/kind/run.sh: one node per extra layout)."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        layout, sep, node = item.partition("=")
        if not sep or not layout or not node:
            raise ValueError(
                f"DRA_GPU_E2E_HARDWARE_NODES: {item!r} is not layout=node (e.g. dgx-a100=dra-gpu-worker3)"
            )
        out[layout] = node
    return out


def load_settings(env: Mapping[str, str] = os.environ) -> E2ESettings:
    artifacts = Path(env.get("DRA_GPU_E2E_ARTIFACTS") or ARTIFACTS_DIR)
    raw_mode = env.get("DRA_GPU_E2E_MODE", DriverMode.HOST.value)
    try:
        mode = DriverMode(raw_mode)
    except ValueError:
        allowed = ", ".join(m.value for m in DriverMode)
        raise ValueError(f"DRA_GPU_E2E_MODE={raw_mode!r} is not one of: {allowed}") from None
    kubeconfig = env.get("DRA_GPU_E2E_KUBECONFIG") or str(artifacts / "kubeconfig")
    if not Path(kubeconfig).exists() and env.get("KUBECONFIG"):
        kubeconfig = env["KUBECONFIG"].split(os.pathsep)[0]
    default_root = artifacts / "driver-root" if mode is DriverMode.HOST else Path("/opt/dra-gpu/driver-root")
    return E2ESettings(
        kubeconfig=Path(kubeconfig),
        mode=mode,
        artifacts=artifacts,
        driver_root=Path(env.get("DRA_GPU_E2E_DRIVER_ROOT") or default_root),
        hardware=env.get("DRA_GPU_E2E_HARDWARE", "dgx-h100"),
        cdi_root=Path(env.get("DRA_GPU_E2E_CDI_ROOT", "/var/run/cdi")),
        kubelet_dir=Path(env.get("DRA_GPU_E2E_KUBELET_DIR", "/var/lib/kubelet")),
        test_image=env.get("DRA_GPU_E2E_TEST_IMAGE", "registry.local/busybox:1"),
        node_name=env.get("DRA_GPU_E2E_NODE") or None,
        second_node=env.get("DRA_GPU_E2E_SECOND_NODE") or None,
        kind_cluster=env.get("DRA_GPU_E2E_KIND_CLUSTER") or None,
        plugin_port=_int(env, "DRA_GPU_E2E_PLUGIN_PORT", 18080),
        webhook_port=_int(env, "DRA_GPU_E2E_WEBHOOK_PORT", 18443),
        namespace_prefix=env.get("DRA_GPU_E2E_NS_PREFIX", "e2e-"),
        chart_namespace=env.get("DRA_GPU_E2E_CHART_NAMESPACE", "dra-gpu"),
        chart_release=env.get("DRA_GPU_E2E_CHART_RELEASE", "dra-gpu"),
        chart_values=Path(env["DRA_GPU_E2E_CHART_VALUES"]) if env.get("DRA_GPU_E2E_CHART_VALUES") else None,
        hardware_nodes=_hardware_nodes(env.get("DRA_GPU_E2E_HARDWARE_NODES", "")),
        pod_timeout_s=float(env.get("DRA_GPU_E2E_POD_TIMEOUT", "120")),
    )
