"""Prometheus metrics of the kubelet plugin (namespace `dra_gpu`).

Modelled on what NVIDIA's plugin exports (requests, durations, errors by reason, prepared devices), plus the
time spent waiting on the API server, so a slow Prepare can be attributed.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        ns = "dra_gpu"
        self.requests = Counter(
            "requests",
            "gRPC calls by method and API version",
            ["method", "version"],
            namespace=ns,
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "request_duration_seconds",
            "gRPC call duration by method",
            ["method"],
            namespace=ns,
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.inflight = Gauge(
            "requests_inflight", "gRPC calls being served", ["method"], namespace=ns, registry=self.registry
        )
        self.claims = Counter(
            "claims",
            "claims handled by operation and outcome (ok, error)",
            ["operation", "outcome"],
            namespace=ns,
            registry=self.registry,
        )
        self.claim_duration = Histogram(
            "claim_duration_seconds",
            "time to prepare or unprepare one claim",
            ["operation"],
            namespace=ns,
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.errors = Counter(
            "claim_errors",
            "per-claim errors by operation and reason",
            ["operation", "reason"],
            namespace=ns,
            registry=self.registry,
        )
        self.apiserver_wait = Histogram(
            "apiserver_wait_seconds",
            "time spent waiting on the API server for a claim",
            namespace=ns,
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.lock_wait = Histogram(
            "gpu_lock_wait_seconds",
            "time a prepare or unprepare waited for the locks of its GPUs",
            namespace=ns,
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.prepared_devices = Gauge(
            "prepared_devices",
            "devices held by prepared claims on this node",
            namespace=ns,
            registry=self.registry,
        )
        self.prepared_claims = Gauge(
            "prepared_claims", "claims prepared on this node", namespace=ns, registry=self.registry
        )
