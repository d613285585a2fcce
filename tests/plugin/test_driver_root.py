"""`--container-driver-root`: the plugin reads the driver where its container sees it, while the CDI specs it
writes name the host's paths (`--nvidia-driver-root`), as with NVIDIA's chart (host `/` at `/driver-root`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from dra_gpu.hardware.sim_driver_root import ci_cap_minor, gi_cap_minor
from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import REPO_ROOT, V1B1, ClaimFactory, PluginProcess, Result, SimNode, opaque

HOST_ROOT = "/run/nvidia/driver"  # does not exist on this machine: nothing may be read from it
MIG_DEVICE = "gpu-1-mig-1g10gb-19-0"


@pytest.mark.apiserver
def test_container_root_is_read_and_host_root_is_written(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin(
        extra_args=["--nvidia-driver-root", HOST_ROOT, "--container-driver-root", str(node.driver_root)]
    )
    kubelet = KubeletClient(node.registration_socket)
    mps = {"apiVersion": V1B1, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    name, uid = claims.make(
        "roots", [Result("gpu", "gpu-0"), Result("mig", MIG_DEVICE)], [opaque(mps, ["gpu"])]
    )
    claim = ClaimId("roots", uid, name)
    answer = kubelet.prepare([claim])
    # The MPS control binary and the MIG capability files were found under the container root.
    assert answer.claims[uid].error == ""
    spec = json.loads((node.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
    assert str(node.driver_root) not in json.dumps(spec)

    gpu, mig = spec["devices"]

    def node_at(path: str) -> dict[str, str]:
        return {"path": path, "hostPath": f"{HOST_ROOT}{path}"}

    assert gpu["containerEdits"]["deviceNodes"] == [node_at("/dev/nvidia0")]
    (instance,) = [gi for g in node.sim_state().gpus for gi in g.gpu_instances]
    ci_id = instance.compute_instances[0].ci_id
    caps = [gi_cap_minor(1, instance.gi_id), ci_cap_minor(1, instance.gi_id, ci_id)]
    assert mig["containerEdits"]["deviceNodes"] == [
        node_at("/dev/nvidia1"),
        *(node_at(f"/dev/nvidia-caps/nvidia-cap{n}") for n in caps),
    ]
    common = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    lib = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    assert common[lib] == f"{HOST_ROOT}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.133.20"  # link resolved
    assert common["/usr/bin/nvidia-smi"] == f"{HOST_ROOT}/usr/bin/nvidia-smi"
    nodes = {n["path"]: n.get("hostPath") for n in spec["containerEdits"]["deviceNodes"]}
    assert nodes["/dev/nvidiactl"] == f"{HOST_ROOT}/dev/nvidiactl"
    pipe = {m["containerPath"]: m["hostPath"] for m in gpu["containerEdits"]["mounts"]}["/tmp/nvidia-mps"]
    assert pipe.startswith(str(node.plugin_dir))  # the plugin directory has the same path on both sides

    assert kubelet.unprepare([claim]).claims[uid].error == ""
    assert node.mig_instances() == [] and node.cdi_files() == []
    kubelet.close()


def run_plugin(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "dra_gpu.cli.kubelet_plugin", "--node-name", "n", "--log-format", "json"]
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=False, env=env
    )


def test_real_nvml_is_loaded_from_the_container_root(node: SimNode) -> None:
    """`--hardware real` loads libnvidia-ml.so.1 from the container root (the simulated root has a placeholder
    library, which fails to load: the error names the file it tried)."""
    done = run_plugin(
        "--hardware",
        "real",
        "--nvidia-driver-root",
        HOST_ROOT,
        "--container-driver-root",
        str(node.driver_root),
    )
    assert done.returncode == 1
    assert f"cannot load {node.driver_root}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in done.stdout
    without = run_plugin("--hardware", "real", "--nvidia-driver-root", HOST_ROOT)
    assert without.returncode == 1 and f"{HOST_ROOT!r} is not a readable directory" in without.stdout


def test_container_driver_root_comes_from_the_environment(node: SimNode) -> None:
    env = {**os.environ, "CONTAINER_DRIVER_ROOT": str(node.driver_root), "NVIDIA_DRIVER_ROOT": HOST_ROOT}
    done = run_plugin("--hardware", "real", env=env)
    assert done.returncode == 1 and f"cannot load {node.driver_root}/usr/lib" in done.stdout
