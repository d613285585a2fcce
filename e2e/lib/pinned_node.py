"""On kind, run an example on the node whose simulated hardware it was written for.

e2e/kind/run.sh makes one node per extra hardware layout (a DGX A100 with MIG set up as NVIDIA's gpu-test4
needs, two GH200 with 1g.12gb MIG devices) and keeps them cordoned, like the L40S node: the suite's examples
assume the DGX H100. For one of NVIDIA's examples written for such hardware, that node alone is uncordoned
while it runs, so the scheduler can only place its pods there (NVIDIA's manifests carry no node selector, and
cannot be edited to get one: they are applied unchanged). Afterwards every node is as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

from e2e.lib.incluster import InClusterDriver
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import E2ESettings

GPU_NODE_SELECTOR = "nvidia.com/gpu.present=true"


def _unschedulable(kubectl: Kubectl) -> dict[str, bool]:
    return {
        n["metadata"]["name"]: bool(n["spec"].get("unschedulable"))
        for n in kubectl.items("nodes", selector=GPU_NODE_SELECTOR)
    }


@contextlib.contextmanager
def pinned_to_node(settings: E2ESettings, kubectl: Kubectl, hardware: str) -> Iterator[InClusterDriver]:
    """The in-cluster driver of the node that simulates `hardware`, the only GPU node pods can go to."""
    node = settings.hardware_nodes[hardware]
    before = _unschedulable(kubectl)
    if node not in before:
        raise RuntimeError(f"no GPU node {node} for {hardware} (nodes: {sorted(before)})")
    try:
        for name in before:
            kubectl.run("uncordon" if name == node else "cordon", name)
        driver = InClusterDriver(replace(settings, hardware=hardware, node_name=node), kubectl, node)
        driver.wait_plugin_ready()
        driver.wait_slices()
        yield driver
    finally:
        for name, cordoned in before.items():
            kubectl.run("cordon" if cordoned else "uncordon", name, check=False)
