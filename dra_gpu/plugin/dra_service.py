"""The DRAPlugin gRPC services, `v1` and `v1beta1`, on top of one `PrepareService`.

The two versions have the same messages except `Device.share_id` (v1 only), so one adapter serves both,
parameterised by the generated module. Every requested claim gets exactly one response entry.
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from dra_gpu.plugin.metrics import PluginMetrics
from dra_gpu.plugin.prepare_service import ClaimRef, PrepareService
from dra_gpu.plugin.protos import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc

SERVICE_V1 = "v1.DRAPlugin"
SERVICE_V1BETA1 = "v1beta1.DRAPlugin"


class _DraPluginAdapter:
    def __init__(self, service: PrepareService, pb2: Any, version: str, metrics: PluginMetrics) -> None:
        self._service = service
        self._pb2 = pb2
        self._version = version
        self._metrics = metrics
        self._has_share_id = "share_id" in pb2.Device.DESCRIPTOR.fields_by_name

    def _refs(self, request: Any) -> list[ClaimRef]:
        return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in request.claims]

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        method = "NodePrepareResources"
        started = time.perf_counter()
        self._metrics.requests.labels(method, self._version).inc()
        with self._metrics.inflight.labels(method).track_inprogress():
            outcomes = self._service.prepare(self._refs(request))
        response = self._pb2.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for answer in outcome.devices:
                device = entry.devices.add(
                    request_names=list(answer.request_names),
                    pool_name=answer.pool,
                    device_name=answer.device,
                    cdi_device_ids=list(answer.cdi_device_ids),
                )
                if self._has_share_id and answer.share_id is not None:
                    device.share_id = answer.share_id
        self._metrics.request_duration.labels(method).observe(time.perf_counter() - started)
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        method = "NodeUnprepareResources"
        started = time.perf_counter()
        self._metrics.requests.labels(method, self._version).inc()
        with self._metrics.inflight.labels(method).track_inprogress():
            errors = self._service.unprepare(self._refs(request))
        response = self._pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        self._metrics.request_duration.labels(method).observe(time.perf_counter() - started)
        return response


class DraPluginV1(_DraPluginAdapter, dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, service: PrepareService, metrics: PluginMetrics) -> None:
        super().__init__(service, dra_v1_pb2, "v1", metrics)


class DraPluginV1beta1(_DraPluginAdapter, dra_v1beta1_pb2_grpc.DRAPluginServicer):
    def __init__(self, service: PrepareService, metrics: PluginMetrics) -> None:
        super().__init__(service, dra_v1beta1_pb2, "v1beta1", metrics)


def add_dra_services(server: grpc.Server, service: PrepareService, metrics: PluginMetrics) -> list[str]:
    """Register both versions; returns their names in the order the kubelet should prefer them."""
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraPluginV1(service, metrics), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DraPluginV1beta1(service, metrics), server)
    return [SERVICE_V1, SERVICE_V1BETA1]
