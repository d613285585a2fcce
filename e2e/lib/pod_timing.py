"""Wall-clock time from a pod's creation to Running, measured with a watch (no polling delay)."""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

# The client's partial type hints do not model its dict-accepting calls; use it untyped, at this one seam.
kubernetes: Any = importlib.import_module("kubernetes")


def api_client(kubeconfig: Path) -> Any:
    return kubernetes.config.new_client_from_config(config_file=str(kubeconfig))


def create_and_time_to_running(api: Any, namespace: str, pod: dict[str, Any], timeout_s: float) -> float:
    """Create `pod` and return the seconds until the API server reports it Running.

    The watch starts from the list's resourceVersion before the create, so the Running event cannot be missed.
    Raises TimeoutError (with the last phase seen) when the pod is not Running in time.
    """
    core = kubernetes.client.CoreV1Api(api)
    name = pod["metadata"]["name"]
    selector = f"metadata.name={name}"
    rv = core.list_namespaced_pod(namespace, field_selector=selector).metadata.resource_version
    t0 = time.monotonic()
    core.create_namespaced_pod(namespace, pod)
    last_phase = "?"
    w = kubernetes.watch.Watch()
    try:
        for event in w.stream(
            core.list_namespaced_pod,
            namespace,
            field_selector=selector,
            resource_version=rv,
            timeout_seconds=int(timeout_s),
        ):
            obj = event["object"]
            last_phase = obj.status.phase if obj.status else "?"
            if last_phase == "Running":
                return time.monotonic() - t0
            if last_phase in ("Failed", "Succeeded"):
                break
            if time.monotonic() - t0 > timeout_s:
                break
    finally:
        w.stop()
    raise TimeoutError(
        f"pod {namespace}/{name} not Running after {time.monotonic() - t0:.1f}s (phase {last_phase})"
    )
