"""ResourceSlice publishing for a simulated DGX H100 against a real kube-apiserver.

- `publish_s`: controller start to all slices published and complete (the time a new node takes to become
  schedulable for DRA), with the API calls it made; target under 1 s and one write per slice;
- `republish_after_wipe_s`: the kubelet's DeleteCollection of the node's slices to the pool complete again;
- `model_to_slices_ms`: discovery + device model + slice building + client-side validation (pure work, no
  API).
Best of `ROUNDS` for the timings, each round on a fresh Node.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from typing import Any

from kubernetes import client

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.inventory.device_model import build_device_model
from dra_gpu.inventory.model import DRIVER_NAME, DeviceModel
from dra_gpu.slices.slice_builder import build_slices
from dra_gpu.slices.slice_controller import SliceController
from dra_gpu.slices.slice_validation import check_slices
from tests.support.control_plane import ControlPlane

ROUNDS = 5


def _pool_complete(api: Any, node: str, expected: int) -> bool:
    items = json.loads(
        api.list_resource_slice(
            field_selector=f"spec.driver={DRIVER_NAME},spec.nodeName={node}", _preload_content=False
        ).data
    )["items"]
    return len(items) == expected and len({s["spec"]["pool"]["generation"] for s in items}) == 1


def _wait_complete(api: Any, node: str, expected: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not _pool_complete(api, node, expected):
        if time.monotonic() > deadline:
            raise TimeoutError(f"slices of {node} not complete after {timeout}s")
        time.sleep(0.02)


def _model_timing(root: str) -> tuple[DeviceModel, float]:
    best = float("inf")
    model: DeviceModel | None = None
    for _ in range(ROUNDS):
        start = time.perf_counter()
        hardware = open_hardware("dgx-h100", root)
        model = build_device_model(hardware.discover())
        check_slices(build_slices(model, "bench-node"))
        best = min(best, time.perf_counter() - start)
    assert model is not None
    return model, best


def run() -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="bench-slices-", dir="/tmp")
    plane = ControlPlane()
    plane.start()
    try:
        model, model_seconds = _model_timing(root)
        expected = len(build_slices(model, "bench-node"))
        api_client = plane.api_client()
        api = client.ResourceV1Api(api_client)
        core: Any = client.CoreV1Api(api_client)  # Any: plain dict bodies
        publish, wipe, calls = [], [], {}
        for _ in range(ROUNDS):
            node = f"bench-{uuid.uuid4().hex[:8]}"
            core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
            controller = SliceController(api_client, DRIVER_NAME, node, lambda: model, sync_delay=0.02)
            start = time.perf_counter()
            controller.start()
            if not controller.wait_synced(30):  # every write acknowledged by the server
                raise TimeoutError(f"controller for {node} did not sync: {controller.status.last_error}")
            publish.append(time.perf_counter() - start)
            if not _pool_complete(api, node, expected):
                raise AssertionError(f"pool of {node} incomplete after sync")
            calls = {
                "list": controller.calls.list,
                "get": controller.calls.get,
                "writes": controller.calls.writes,
                "creates": controller.calls.create,
            }
            start = time.perf_counter()
            api.delete_collection_resource_slice(
                field_selector=f"spec.driver={DRIVER_NAME},spec.nodeName={node}"
            )
            time.sleep(0.01)  # let the deletion land before polling for the pool to come back
            _wait_complete(api, node, expected)
            wipe.append(time.perf_counter() - start)
            controller.stop()
            api.delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")
            core.delete_node(node)
        return {
            "hardware": "dgx-h100",
            "slices": expected,
            "devices": len(model.devices),
            "publish_s": round(min(publish), 3),
            "publish_median_s": round(sorted(publish)[len(publish) // 2], 3),
            "publish_api_calls": calls,
            "writes_per_slice": round(calls["writes"] / expected, 2),
            "republish_after_wipe_s": round(min(wipe), 3),
            "model_to_slices_ms": round(model_seconds * 1000, 1),
            "target": "publish_s < 1.0 and writes_per_slice == 1",
        }
    finally:
        plane.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
