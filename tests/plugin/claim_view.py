"""What a workload of a prepared claim gets, read from the CDI spec the plugin wrote for the claim (not
from the driver's own records): the spec's mounts and env as CdiEdits, run through
tests/support/container_view.py.

Only the spec's directory mounts are applied (the MPS `clients` directory at /tmp/nvidia-mps, the claim's shm
at /dev/shm, ...): the driver files a spec mounts are the host's own in this view, and the simulated CUDA
client needs none of them. The spec's device nodes are handed to the simulated client by name
(container_view.py), so that what it opens is what the spec gives."""

from __future__ import annotations

import json
import os
from typing import Any

from dra_gpu.sharing.interface import CdiDeviceNode, CdiEdits, CdiMount
from tests.plugin.plugin_harness import SimNode
from tests.support.container_view import sim_client, start_sim_client

CONTAINER_MPS_DIR = "/tmp/nvidia-mps"


def claim_spec(node: SimNode, claim_uid: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(
        (node.cdi_root / f"k8s.gpu.nvidia.com-claim_{claim_uid}.json").read_text()
    )
    return spec


def claim_edits(node: SimNode, claim_uid: str) -> CdiEdits:
    """The claim's container edits as a runtime applies them: spec-level, then each device's (later env
    wins)."""
    spec = claim_spec(node, claim_uid)
    parts = [spec.get("containerEdits") or {}]
    parts += [device.get("containerEdits") or {} for device in spec.get("devices") or ()]
    env: dict[str, str] = {}
    mounts: dict[str, CdiMount] = {}
    nodes: dict[str, CdiDeviceNode] = {}
    for part in parts:
        for item in part.get("env") or ():
            name, _, value = str(item).partition("=")
            env[name] = value
        for mount in part.get("mounts") or ():
            if os.path.isdir(mount["hostPath"]):
                mounts[mount["containerPath"]] = CdiMount(mount["hostPath"], mount["containerPath"])
        for node in part.get("deviceNodes") or ():
            nodes[node["path"]] = CdiDeviceNode(node["path"], node.get("hostPath"))
    return CdiEdits(
        env=tuple(f"{k}={v}" for k, v in env.items()),
        mounts=tuple(mounts.values()),
        device_nodes=tuple(nodes.values()),
    )


def mps_host_dir(node: SimNode, claim_uid: str) -> str:
    """The host directory the claim's spec mounts where its containers look for MPS (/tmp/nvidia-mps)."""
    (host,) = [
        m.host_path for m in claim_edits(node, claim_uid).mounts if m.container_path == CONTAINER_MPS_DIR
    ]
    return host


def workload(node: SimNode, claim_uid: str, *args: str, **kwargs: Any) -> dict[str, Any]:
    """The simulated CUDA client's report, run in the claim's container view."""
    return sim_client(claim_edits(node, claim_uid), node.driver_root, *args, **kwargs)


def start_workload(node: SimNode, claim_uid: str, *args: str, **kwargs: Any) -> Any:
    """The same, started in the background (e.g. `--hold 60`: a workload that keeps running)."""
    return start_sim_client(claim_edits(node, claim_uid), node.driver_root, *args, **kwargs)
