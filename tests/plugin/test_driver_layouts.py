"""The plugin on a driver root of each of NVIDIA's layouts (host install at `/`, the GPU Operator's
`/run/nvidia/driver`, RHEL's usr/lib64, GKE/COS's `/home/kubernetes/bin/nvidia` with bin/ and lib64/): it
finds NVML, nvidia-smi and nvidia-cuda-mps-control where the layout keeps them, prepares an MPS claim and a
time-sliced one, and its CDI specs name the host's files."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from dra_gpu.hardware.sim_driver_root import init_sim_driver_root
from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import (
    ClaimFactory,
    PluginProcess,
    Result,
    SimNode,
    mps,
    opaque,
    time_slicing,
)

VERSION = "570.133.20"
LAYOUTS = [  # (simulated layout, host driver root, tools dir, libraries dir)
    ("standard", "/", "/usr/bin", "/usr/lib/x86_64-linux-gnu"),
    ("standard", "/run/nvidia/driver", "/usr/bin", "/usr/lib/x86_64-linux-gnu"),
    ("rhel", "/", "/usr/bin", "/usr/lib64"),
    ("gke", "/home/kubernetes/bin/nvidia", "/bin", "/lib64"),
]


@pytest.mark.apiserver
@pytest.mark.parametrize(("layout", "host_root", "tools", "libs"), LAYOUTS)
def test_plugin_serves_each_driver_layout(
    start_plugin: Callable[..., PluginProcess],
    node: SimNode,
    claims: ClaimFactory,
    layout: str,
    host_root: str,
    tools: str,
    libs: str,
) -> None:
    init_sim_driver_root(node.driver_root, node.hardware, node.name, force=True, driver_layout=layout)
    start_plugin(
        extra_args=["--nvidia-driver-root", host_root, "--container-driver-root", str(node.driver_root)]
    )
    kubelet = KubeletClient(node.registration_socket)
    shared, uid = claims.make("layouts", [Result("gpu", "gpu-0")], [opaque(mps(), ["gpu"])])
    sliced, uid2 = claims.make("layouts", [Result("gpu", "gpu-1")], [opaque(time_slicing("Long"), ["gpu"])])
    answer = kubelet.prepare([ClaimId("layouts", uid, shared), ClaimId("layouts", uid2, sliced)])
    assert answer.claims[uid].error == "" and answer.claims[uid2].error == ""
    # the MPS daemon was started from the layout's tools directory, nvidia-smi set the time slice
    assert [r.get("running") for r in node.mps_records().values()] == [True]
    assert list(node.timeslices().values()) == [3]

    spec = json.loads((node.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    host = host_root.rstrip("/")
    # no nvidia-cdi-hook here: mounted by soname, from the file the link resolves to
    assert mounts[f"{libs}/libnvidia-ml.so.1"] == f"{host}{libs}/libnvidia-ml.so.{VERSION}"
    assert mounts[f"{tools}/nvidia-smi"] == f"{host}{tools}/nvidia-smi"
    assert str(node.driver_root) not in json.dumps(spec)  # only host paths

    result = kubelet.unprepare([ClaimId("layouts", uid, shared), ClaimId("layouts", uid2, sliced)])
    assert all(c.error == "" for c in result.claims.values())
    assert node.timeslices() == {}
    kubelet.close()
