"""The API server's one job in the product-path check: answer the kubelet plugin's GET of a ResourceClaim.

`ClaimServer` serves `GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>` over HTTP on
127.0.0.1 (a 404 `Status` for a claim it does not hold, 404 for any other path) and writes the kubeconfig that
points the plugin at it. `allocate` fills a claim's `status.allocation` as kube-scheduler would: the project's
allocator (`dra_gpu.allocator`, the scheduler's semantics) over the node's ResourceSlices, with the claims
already allocated as what other claims hold (so shares of one GPU add up, and a whole GPU excludes its
shares). Nothing else of the API is served: the plugin runs with `--publish-slices false`.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from dra_gpu.allocator.builtin_classes import builtin_device_classes
from dra_gpu.allocator.claims import claim_from_object, parse_device_class
from dra_gpu.allocator.explain import explain, result_json
from dra_gpu.allocator.pools import Node, SliceIndex
from dra_gpu.allocator.search import Existing

CLAIM_PATH = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/?]+)$")


def claim_object(
    namespace: str,
    name: str,
    request: Mapping[str, Any],
    configs: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceClaim (wire format) with one request (`{"name": ..., "exactly": {...}}`) and opaque
    configs (`{"requests": [...], "opaque": {...}}`)."""
    devices: dict[str, Any] = {"requests": [dict(request)]}
    if configs:
        devices["config"] = [dict(c) for c in configs]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
        "spec": {"devices": devices},
    }


class AllocationError(Exception):
    pass


def allocate(
    claim: dict[str, Any], slices: Sequence[Mapping[str, Any]], node: str, held: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """`claim` with `status.allocation` as the scheduler would write it on `node`, given the claims in `held`
    (allocated already); AllocationError with the allocator's reason when it does not fit."""
    classes = {c.name: c for c in (parse_device_class(o) for o in builtin_device_classes())}
    [explanation] = explain(
        [[claim_from_object(claim)]], classes, SliceIndex(slices), [Node(node)], Existing.from_claims(held)
    )
    if not explanation.allocatable:
        meta = claim["metadata"]
        raise AllocationError(f"{meta['namespace']}/{meta['name']}: {explanation.reason}")
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [result_json(r) for r in explanation.results],
                "config": explanation.configs,
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    return claim


class ClaimServer:
    """Holds claims by (namespace, name) and serves them; `requests` counts the GETs it answered."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                match = CLAIM_PATH.match(self.path.split("?", 1)[0])
                with server._lock:
                    server.requests += 1
                    claim = server.claims.get((match[1], match[2])) if match else None
                if claim is None:
                    what = f'resourceclaims "{match[2]}" not found' if match else f"{self.path} not found"
                    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": what,
                            "reason": "NotFound", "code": 404}  # fmt: skip
                    self._send(404, body)
                else:
                    self._send(200, claim)

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="claim-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ClaimServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def put(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        with self._lock:
            self.claims[(meta["namespace"], meta["name"])] = claim

    def remove(self, claim: Mapping[str, Any]) -> None:
        meta = claim["metadata"]
        with self._lock:
            self.claims.pop((meta["namespace"], meta["name"]), None)

    def allocated(self) -> list[dict[str, Any]]:
        with self._lock:
            return [c for c in self.claims.values() if c.get("status", {}).get("allocation")]

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: claims, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: plugin, user: {token: product-path}}]\n"
            "contexts: [{name: claims, context: {cluster: claims, user: plugin}}]\n"
            "current-context: claims\n"
        )
        return path
