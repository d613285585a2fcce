"""A GPU whose minor number changes when its MIG mode is switched on (nvml.h allows it) is found again by
UUID, and the claim's container gets the GPU's device node and MIG capabilities under the new minor."""

from __future__ import annotations

import json

import pytest

from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import ClaimFactory, Result, SimNode

pytestmark = pytest.mark.apiserver


def test_an_on_demand_mig_device_on_a_renumbered_gpu_gets_the_new_device_node(
    kubelet: KubeletClient, node: SimNode, claims: ClaimFactory
) -> None:
    node.hardware_cli("mig-renumber", "on")
    name, uid = claims.make("renumber", [Result("m", "gpu-6-mig-1g10gb-19-2")])
    claim = ClaimId(namespace="renumber", uid=uid, name=name)
    assert kubelet.prepare([claim]).claims[uid].error == ""
    state = json.loads(node.hardware_cli("state"))
    minors = [g.get("minor") for g in state["gpus"]]
    assert 6 not in minors  # the switch gave gpu-6 a new minor
    new_minor = max(m for m in minors if m is not None)
    spec = json.loads((node.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
    paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert paths[0] == f"/dev/nvidia{new_minor}", paths
    assert len([p for p in paths if p.startswith("/dev/nvidia-caps/nvidia-cap")]) == 2
    kubelet.unprepare([claim])
    assert node.mig_instances() == []
