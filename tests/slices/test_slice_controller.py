"""SliceController against a real kube-apiserver: accepted by server validation, self-healing, model
changes."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.inventory.device_model import build_device_model
from dra_gpu.inventory.model import DeviceModel
from dra_gpu.slices.slice_controller import SliceController

pytestmark = pytest.mark.apiserver
DRIVER = "gpu.nvidia.com"


@pytest.fixture(scope="module")
def dgx_h100_model() -> Iterator[DeviceModel]:
    root = tempfile.mkdtemp(prefix="ctl-", dir="/tmp")
    try:
        yield build_device_model(open_hardware("dgx-h100", root, seed="ctl").discover())
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def node(kube_apiserver: Any) -> Iterator[tuple[Any, str, str]]:
    """A fresh Node object (slices get it as owner) and the ApiClient."""
    api_client = kube_apiserver.api_client()
    name = f"gpu-node-{uuid.uuid4().hex[:8]}"
    created = client.CoreV1Api(api_client).create_node(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}, _preload_content=False
    )
    uid = json.loads(created.data)["metadata"]["uid"]
    yield api_client, name, uid
    api = client.ResourceV1Api(api_client)
    api.delete_collection_resource_slice(field_selector=f"spec.nodeName={name}")
    client.CoreV1Api(api_client).delete_node(name)


def _slices(api_client: Any, node: str) -> list[dict[str, Any]]:
    response = client.ResourceV1Api(api_client).list_resource_slice(
        field_selector=f"spec.driver={DRIVER},spec.nodeName={node}", _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    return sorted(items, key=lambda s: s["metadata"]["name"])


def _wait(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def _dgx_h100_slices(api_client: Any) -> int:
    """Slices of a DGX H100 pool on the server's release: 8 GPU slices, plus one counters slice on 1.35+."""
    from dra_gpu.kube.client import server_version

    return 9 if server_version(api_client) >= (1, 35) else 8


def _complete(api_client: Any, node: str, count: int, min_generation: int = 1) -> Callable[[], bool]:
    def check() -> bool:
        items = _slices(api_client, node)
        generations = {s["spec"]["pool"]["generation"] for s in items}
        return (
            len(items) == count
            and len(generations) == 1
            and min(generations) >= min_generation
            and all(s["spec"]["pool"]["resourceSliceCount"] == count for s in items)
        )

    return check


@pytest.fixture
def controller(node: tuple[Any, str, str], dgx_h100_model: DeviceModel) -> Iterator[SliceController]:
    api_client, name, _uid = node
    ctl = SliceController(api_client, DRIVER, name, lambda: dgx_h100_model, sync_delay=0.05, resync_period=5)
    ctl.start()
    yield ctl
    ctl.stop()


def test_publishes_dgx_h100_accepted_by_the_server(
    node: tuple[Any, str, str], controller: SliceController, dgx_h100_model: DeviceModel
) -> None:
    api_client, name, uid = node
    assert controller.wait_synced(30), controller.status.last_error
    items = _slices(api_client, name)
    count = _dgx_h100_slices(api_client)
    assert len(items) == count and _complete(api_client, name, count)()
    assert controller.calls.writes == count  # one write per slice
    assert controller.status.dropped_fields_warning is None  # the server kept every field we sent
    assert all(s["metadata"]["ownerReferences"][0]["uid"] == uid for s in items)
    devices = {d["name"]: d for s in items for d in s["spec"].get("devices", [])}
    assert set(devices) == {d.name for d in dgx_h100_model.devices}
    share = devices["gpu-3-shared"]
    assert share["allowMultipleAllocations"] is True and "requestPolicy" in share["capacity"]["memory"]
    counters = [c for s in items for c in s["spec"].get("sharedCounters", [])]
    assert len(counters) == 8 and counters[0]["counters"]["memory-slice-7"]["value"] == "1"


def test_restores_after_wipe_edit_and_delete(node: tuple[Any, str, str], controller: SliceController) -> None:
    api_client, name, _uid = node
    api = client.ResourceV1Api(api_client)
    assert controller.wait_synced(30)
    # the kubelet wipes the node's slices on registration/plugin restart: DeleteCollection
    before = {s["metadata"]["uid"] for s in _slices(api_client, name)}
    api.delete_collection_resource_slice(field_selector=f"spec.driver={DRIVER},spec.nodeName={name}")
    _wait(
        lambda: (
            _complete(api_client, name, _dgx_h100_slices(api_client))()
            and not before & {s["metadata"]["uid"] for s in _slices(api_client, name)}
        )
    )
    # a hand edit (drop a device) is reverted
    edited = _slices(api_client, name)[3]
    edited["spec"]["devices"] = edited["spec"]["devices"][:5]
    api.replace_resource_slice(edited["metadata"]["name"], edited, _preload_content=False)
    target = edited["metadata"]["name"]
    _wait(
        lambda: (
            len(
                next(s for s in _slices(api_client, name) if s["metadata"]["name"] == target)["spec"][
                    "devices"
                ]
            )
            == 27
        )
    )
    # a deleted slice is recreated
    victim = _slices(api_client, name)[5]["metadata"]
    api.delete_resource_slice(victim["name"])
    _wait(
        lambda: any(
            s["metadata"]["name"] == victim["name"] and s["metadata"]["uid"] != victim["uid"]
            for s in _slices(api_client, name)
        )
    )
    assert _complete(api_client, name, _dgx_h100_slices(api_client))()


def test_model_change_is_published(
    node: tuple[Any, str, str], controller: SliceController, dgx_h100_model: DeviceModel
) -> None:
    api_client, name, _uid = node
    assert controller.wait_synced(30)
    before = controller.calls.writes
    four_gpus = DeviceModel(
        devices=tuple(d for d in dgx_h100_model.devices if d.parent_minor < 4),
        counter_sets=dgx_h100_model.counter_sets[:4],
    )
    controller.update_model(four_gpus)
    assert controller.wait_synced(30)
    count = _dgx_h100_slices(api_client) - 4  # 4 GPU slices (+ the counters slice on 1.35+)
    _wait(_complete(api_client, name, count, min_generation=2))
    assert controller.calls.writes - before == 4 + count  # 4 obsolete deleted, the rest rewritten
    renamed = replace(
        four_gpus,
        devices=tuple(
            replace(
                d, attributes={**d.attributes, "productName": replace(d.attributes["productName"], value="X")}
            )
            for d in four_gpus.devices
        ),
    )
    controller.update_model(renamed)
    _wait(
        lambda: all(
            d["attributes"]["productName"]["string"] == "X"
            for s in _slices(api_client, name)
            for d in s["spec"].get("devices", [])
        )
    )


def test_invalid_slices_are_rejected_by_the_server_too(kube_apiserver: Any) -> None:
    """Our client-side validation mirrors the server: a bad version string is refused by both."""
    api_client = kube_apiserver.api_client()
    name = f"bad-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"driverVersion": {"version": "535.183.01"}}}],
        },
    }
    with pytest.raises(client.exceptions.ApiException) as info:
        client.ResourceV1Api(api_client).create_resource_slice(body, _preload_content=False)
    assert info.value.status == 422
    from dra_gpu.slices.slice_validation import validate_slices

    assert any("not strict semver" in p for p in validate_slices([body]))


def test_api_errors_are_retried_with_backoff(node: tuple[Any, str, str], dgx_h100_model: DeviceModel) -> None:
    """A 1.34-layout pool (counters beside devices) is refused by a 1.36 server: the controller keeps
    retrying, further apart each time, and publishes as soon as the cause is gone."""
    api_client, name, _uid = node
    if _dgx_h100_slices(api_client) == 8:
        pytest.skip("a 1.34 server takes the 1.34 layout: nothing to refuse")
    ctl = SliceController(
        api_client,
        DRIVER,
        name,
        lambda: dgx_h100_model,
        kubernetes_version=(1, 34),
        sync_delay=0.01,
        backoff_initial=0.1,
        backoff_max=0.4,
    )
    ctl.start()
    try:
        _wait(lambda: ctl.calls.create >= 4)
        assert ctl.status.last_error is not None and "422" in ctl.status.last_error
        assert _slices(api_client, name) == []
        attempts = ctl.calls.create
        time.sleep(1.0)
        assert (
            ctl.calls.create - attempts <= 4
        )  # back-off capped at 0.4 s: a few tries per second, no hot loop
        ctl._kubernetes_version = (1, 36)  # the cause goes away (as after a control-plane upgrade)
        assert ctl.wait_synced(30)
        _wait(_complete(api_client, name, _dgx_h100_slices(api_client)))
        assert ctl.status.last_error is None
    finally:
        ctl.stop()
