"""An unreadable sharing registry on a real plugin: it still starts and serves, but a claim that needs the
registry is refused with a message naming the file and the fix, the error is counted under its own reason, and
the file is left exactly as it was (never silently reset)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, Result, SimNode, opaque, time_slicing
from tests.support.control_plane import free_port

pytestmark = pytest.mark.apiserver

GARBAGE = b'{"format": 1, "timeSlice": {"GPU-'  # cut off mid-write by something other than us


def test_unreadable_registry_refuses_to_guess(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    registry = node.plugin_dir / "sharing-registry.json"
    registry.parent.mkdir(parents=True, exist_ok=True)
    registry.write_bytes(GARBAGE)
    port = free_port()
    process = start_plugin(http_port=port)
    name, uid = claims.make("registry", [Result("gpu", "gpu-0")], [opaque(time_slicing("Long"), ["gpu"])])
    kubelet = KubeletClient(node.registration_socket)
    try:
        error = kubelet.prepare([ClaimId("registry", uid, name)]).claims[uid].error
    finally:
        kubelet.close()
    assert f"sharing registry {registry} is unreadable" in error and "move it aside" in error
    assert registry.read_bytes() == GARBAGE
    assert node.timeslices() == {}  # nothing was set on a guess
    deadline = time.monotonic() + 20  # the HTTP endpoint starts just after the sockets
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                metrics = resp.read().decode()
            break
        except urllib.error.URLError:
            assert time.monotonic() < deadline, "no /metrics"
            time.sleep(0.2)
    assert 'dra_gpu_claim_errors_total{operation="prepare",reason="registry_unreadable"} 1.0' in metrics
    assert "sharing registry unreadable" in process.log_path.read_text()
