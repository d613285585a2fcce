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


def test_reads_from_threads_racing_the_warm_up(kube_apiserver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin loads its API client in a warm-up thread while prepares may already arrive: every reader
    gets the claim, and one client is made for all of them."""
    from concurrent.futures import ThreadPoolExecutor

    from dra_gpu.kube import client as kube_client

    name, uid = ClaimFactory(kube_apiserver.api_client(), "node-warm").make("warm", [Result("gpu", "gpu-0")])
    made: list[Any] = []
    load = kube_client.load_api_client
    monkeypatch.setattr(
        kube_client, "load_api_client", lambda path, limiter: made.append(load(path, limiter)) or made[-1]
    )
    api_client = kube_client.LazyApiClient(str(kube_apiserver.kubeconfig))
    reader = KubeClaimReader(api_client)
    with ThreadPoolExecutor(max_workers=8) as pool:
        warm = pool.submit(reader.warm_up)
        claims = list(pool.map(lambda _: reader.get("warm", name), range(16)))
        warm.result()
    assert all(c is not None and c["metadata"]["uid"] == uid for c in claims)
    assert len(made) == 1 and api_client.loaded() is made[0]
