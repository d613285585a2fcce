"""Reading ResourceClaims from a real kube-apiserver."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gpu.plugin.claim_reader import ClaimReadError, KubeClaimReader
from tests.plugin.plugin_harness import ClaimFactory, Result, opaque, time_slicing

pytestmark = pytest.mark.apiserver


def test_reads_allocated_claim_as_wire_json(kube_apiserver: Any) -> None:
    api_client = kube_apiserver.api_client()
    factory = ClaimFactory(api_client, "node-reader")
    waits: list[float] = []
    reader = KubeClaimReader(api_client, on_wait=waits.append)
    name, uid = factory.make("reader", [Result("gpu", "gpu-0")], [opaque(time_slicing(), ["gpu"])])
    claim = reader.get("reader", name)
    assert claim is not None
    assert claim["metadata"]["uid"] == uid
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert (result["driver"], result["pool"], result["device"], result["request"]) == (
        "gpu.nvidia.com",
        "node-reader",
        "gpu-0",
        "gpu",
    )
    config = claim["status"]["allocation"]["devices"]["config"][0]
    assert config["opaque"]["parameters"]["kind"] == "GpuConfig"
    assert reader.get("reader", "no-such-claim") is None
    assert len(waits) == 2 and all(w > 0 for w in waits)


def test_unreachable_api_server_is_a_read_error() -> None:
    from kubernetes import client

    config = client.Configuration()
    config.host = "https://127.0.0.1:1"
    reader = KubeClaimReader(client.ApiClient(config), timeout_s=1.0)
    with pytest.raises(ClaimReadError, match="reading ResourceClaim ns/c"):
        reader.get("ns", "c")
