"""Fixtures for the kubelet-plugin tests: a simulated node, the plugin as a subprocess, claims in a real
kube-apiserver."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.plugin.kubelet_client import KubeletClient
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, SimNode


@pytest.fixture
def node() -> Iterator[SimNode]:
    sim = SimNode(name=f"node-{uuid.uuid4().hex[:8]}")
    yield sim
    sim.cleanup()


@pytest.fixture
def claims(kube_apiserver: Any, node: SimNode) -> ClaimFactory:
    return ClaimFactory(kube_apiserver.api_client(), node.name)


@pytest.fixture
def start_plugin(kube_apiserver: Any, node: SimNode) -> Iterator[Callable[..., PluginProcess]]:
    """Start the plugin (returns once its registration socket answers); every started one is stopped after."""
    started: list[PluginProcess] = []

    def start(wait: bool = True, **kwargs: Any) -> PluginProcess:
        process = PluginProcess(node, str(kube_apiserver.kubeconfig), **kwargs)
        started.append(process)
        if wait:
            process.wait_ready()
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def kubelet(start_plugin: Callable[..., PluginProcess], node: SimNode) -> Iterator[KubeletClient]:
    """A running plugin with a registered kubelet client."""
    start_plugin()
    client = KubeletClient(node.registration_socket)
    yield client
    client.close()
