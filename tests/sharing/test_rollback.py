"""A failure late in prepare undoes everything earlier in the same group."""

from __future__ import annotations

import pytest
from sim_node import SimNode

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.inventory.model import DeviceKind
from dra_gpu.sharing.interface import SharingError


def test_mps_failure_after_mig_creation_destroys_the_instance(node: SimNode) -> None:
    shim = node.root / "usr" / "bin" / "nvidia-cuda-mps-control"
    shim.write_text("#!/bin/sh\necho 'MPS is not supported on this node' >&2\nexit 1\n")
    mig = next(d for d in node.model().devices if d.kind is DeviceKind.MIG_DYNAMIC)
    config = decode_opaque_config(
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS"},
        }
    )
    manager = node.manager()
    with pytest.raises(SharingError, match="MPS is not supported on this node"):
        manager.prepare_group("claim-1", config, [node.alloc(mig.name)])
    gpu = node.state().gpus[0]
    assert gpu.gpu_instances == [] and gpu.mig_current is False
    assert manager.describe()["createdMig"] == []
    assert node.leftovers() == []


def test_state_is_json_and_edits_can_be_rebuilt(node: SimNode) -> None:
    import json

    from dra_gpu.sharing.manager import edits_from_state

    config = decode_opaque_config(
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10}},
        }
    )
    manager = node.manager()
    result = manager.prepare_group("claim-1", config, [node.alloc("gpu-0")])
    state = json.loads(json.dumps(result.state))  # what the checkpoint stores
    assert edits_from_state(state) == result.edits
    manager.unprepare_group("claim-1", state)
    assert node.leftovers() == []


def test_start_up_stops_daemons_no_checkpoint_owns(node: SimNode) -> None:
    from dra_gpu.hardware.types import ComputeMode

    config = decode_opaque_config(
        {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    )
    manager = node.manager()
    kept = manager.prepare_group("kept", config, [node.alloc("gpu-0")])
    lost = manager.prepare_group(
        "lost",
        None,
        [node.alloc("gpu-0-shared", share_id="s", consumed_capacity={"compute": "5", "memory": "1Gi"})],
    )
    # An orphan: the plugin crashed before checkpointing this group.
    node.hardware.set_compute_mode(node.uuid(), ComputeMode.DEFAULT)
    orphan = manager.prepare_group("orphan", config, [node.alloc("gpu-0")])
    restarted = node.manager()
    stopped = restarted.stop_unowned_mps([kept.state, lost.state])
    assert stopped == [orphan.state["mpsDaemon"]["id"]]
    assert len(node.running_daemons()) == 2  # kept's and the shared one
    restarted.unprepare_group("kept", kept.state)
    restarted.unprepare_group("lost", lost.state)
    assert node.leftovers() == []
