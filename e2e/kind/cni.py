"""Pod networking for the kind cluster without kindnetd: what kindnetd does, done once after the nodes join.

kind's default CNI (kindnetd) is an image from a registry this machine cannot reach, so e2e/kind/cluster.yaml
sets `disableDefaultCNI`. Each node then gets a ptp network (a veth per pod, as kindnetd sets up) on the pod
range the controller-manager gave it (node.spec.podCIDR) and a route to every other node's pod range through
that node's address, which is the whole of kindnetd's job on a single docker network.

    python3 e2e/kind/cni.py KUBECONFIG
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CONF_PATH = "/etc/cni/net.d/10-dra-gpu-kind.conflist"


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    pod_cidr: str


def nodes_from(node_list: dict[str, Any]) -> list[Node]:
    """The nodes of a `kubectl get nodes -o json` answer that have a pod range and an internal address."""
    out = []
    for item in node_list.get("items", []):
        cidr = item.get("spec", {}).get("podCIDR")
        address = next(
            (
                a["address"]
                for a in item.get("status", {}).get("addresses", [])
                if a.get("type") == "InternalIP"
            ),
            None,
        )
        if cidr and address:
            out.append(Node(item["metadata"]["name"], address, cidr))
    return out


def conflist(node: Node) -> dict[str, Any]:
    """A point-to-point link per pod on the node's pod range (as kindnetd does), masqueraded going out."""
    return {
        "cniVersion": "1.0.0",
        "name": "dra-gpu-kind",
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def routes(node: Node, others: Sequence[Node]) -> list[list[str]]:
    """`ip route replace` argument lists reaching the other nodes' pods from this node."""
    return [["ip", "route", "replace", o.pod_cidr, "via", o.address] for o in others if o.name != node.name]


def docker_exec(node: str, argv: Sequence[str], stdin: str | None = None) -> None:
    subprocess.run(
        ["docker", "exec", "-i", node, *argv], input=stdin, text=True, check=True, capture_output=True
    )


def main(argv: Sequence[str]) -> int:
    kubeconfig = argv[1]
    raw = subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig, "get", "nodes", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    nodes = nodes_from(json.loads(raw))
    if not nodes:
        print("[kind-cni] no node has a podCIDR yet", file=sys.stderr)
        return 1
    for node in nodes:
        docker_exec(
            node.name,
            ["sh", "-c", f"mkdir -p /etc/cni/net.d && cat > {CONF_PATH}"],
            stdin=json.dumps(conflist(node), indent=2),
        )
        for route in routes(node, nodes):
            docker_exec(node.name, route)
        print(
            f"[kind-cni] {node.name}: pods {node.pod_cidr}, {len(nodes) - 1} route(s) to other nodes",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
