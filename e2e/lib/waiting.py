"""Waiting with deadlines whose failures explain themselves (events, describe, driver log tail)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from typing import Any, TypeVar

from e2e.lib.kubectl import Kubectl, KubectlError

T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """A condition did not hold in time. An AssertionError so pytest reports it as a test failure."""


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.5,
    explain: Callable[[], str] | None = None,
) -> T:
    """Call `probe` until it returns a truthy value; return that value."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except KubectlError as exc:  # the API server may be briefly unavailable (kubelet restart tests)
            last_error = exc
        if time.monotonic() >= deadline:
            details = explain() if explain else ""
            cause = f"\nlast error: {last_error}" if last_error else ""
            raise WaitTimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}{cause}\n{details}")
        time.sleep(interval_s)


def pod_phase_summary(pod: dict[str, Any]) -> str:
    """One line per pod: phase, and why it is not running (waiting reasons, unschedulable message)."""
    status = pod.get("status", {})
    parts = [f"{pod['metadata']['name']}: {status.get('phase', '?')}"]
    for cond in status.get("conditions", []):
        if cond.get("status") != "True" and cond.get("message"):
            parts.append(f"{cond['type']}={cond.get('reason', '')}: {cond['message']}")
    for cs in status.get("containerStatuses", []) + status.get("initContainerStatuses", []):
        state = cs.get("state", {})
        for key in ("waiting", "terminated"):
            if key in state:
                detail = state[key]
                parts.append(
                    f"container {cs['name']} {key} {detail.get('reason', '')} {detail.get('message', '')}"
                )
    return "; ".join(p.strip() for p in parts)


def namespace_report(
    kubectl: Kubectl, namespace: str, driver_log_tail: Callable[[], str] | None = None
) -> str:
    """Everything a person needs to see when something in a test namespace did not happen."""
    sections: list[str] = []
    try:
        pods = kubectl.items("pods", namespace)
        sections.append("pods:\n" + "\n".join("  " + pod_phase_summary(p) for p in pods))
        events = sorted(
            kubectl.events(namespace),
            key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"],
        )
        lines = [
            f"  {e.get('type', '')} {e.get('reason', '')} {e['involvedObject'].get('kind', '')}/"
            f"{e['involvedObject'].get('name', '')}: {e.get('message', '').strip()}"
            for e in events[-30:]
        ]
        sections.append("events:\n" + "\n".join(lines))
        claims = kubectl.items("resourceclaims.resource.k8s.io", namespace)
        claim_lines = [
            f"  {c['metadata']['name']}: allocated={'allocation' in c.get('status', {})} "
            f"reservedFor={[r.get('name') for r in c.get('status', {}).get('reservedFor', [])]}"
            for c in claims
        ]
        sections.append("resourceclaims:\n" + "\n".join(claim_lines))
        for pod in pods:
            if pod.get("status", {}).get("phase") not in ("Running", "Succeeded"):
                sections.append(kubectl.describe("pod", pod["metadata"]["name"], namespace))
    except KubectlError as exc:
        sections.append(f"(could not read the namespace: {exc})")
    if driver_log_tail is not None:
        sections.append("driver log tail:\n" + driver_log_tail())
    return "\n".join(sections)


def wait_for_pods(
    kubectl: Kubectl,
    namespace: str,
    names: Iterable[str],
    *,
    phases: Collection[str] = ("Running", "Succeeded"),
    timeout_s: float,
    driver_log_tail: Callable[[], str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Wait until every named pod is in one of `phases`; fail at once when one has Failed unexpectedly."""
    wanted = set(names)

    def probe() -> dict[str, dict[str, Any]] | None:
        pods = {p["metadata"]["name"]: p for p in kubectl.items("pods", namespace)}
        missing = wanted - pods.keys()
        if missing:
            return None
        for name in wanted:
            phase = pods[name].get("status", {}).get("phase")
            if phase == "Failed" and "Failed" not in phases:
                raise WaitTimeoutError(
                    f"pod {namespace}/{name} failed: {pod_phase_summary(pods[name])}\n"
                    + namespace_report(kubectl, namespace, driver_log_tail)
                )
        if all(pods[n].get("status", {}).get("phase") in phases for n in wanted):
            return {n: pods[n] for n in wanted}
        return None

    return wait_until(
        probe,
        timeout_s=timeout_s,
        interval_s=1.0,
        what=f"pods {sorted(wanted)} in {namespace} to be {'/'.join(phases)}",
        explain=lambda: namespace_report(kubectl, namespace, driver_log_tail),
    )
