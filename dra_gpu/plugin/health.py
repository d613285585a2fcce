"""The `v1alpha1.DRAResourceHealth` stream: the health of every device, complete list in each message.

No hardware health source feeds it yet, so devices that the inventory lists are reported HEALTHY and re-sent
periodically (a live stream also keeps kubelet 1.34.0-1.34.1 from dropping an idle connection).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc

from dra_gpu.inventory.model import DeviceModel
from dra_gpu.plugin.protos import dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc

SERVICE_HEALTH = "v1alpha1.DRAResourceHealth"


class DeviceHealthService(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(
        self,
        pool_name: str,
        device_model: Callable[[], DeviceModel],
        *,
        interval_s: float = 30.0,
        stop: threading.Event | None = None,
    ) -> None:
        self.pool_name = pool_name
        self.device_model = device_model
        self.interval_s = interval_s
        self.stop = stop or threading.Event()

    def snapshot(self) -> dra_health_v1alpha1_pb2.NodeWatchResourcesResponse:
        now = int(time.time())
        response = dra_health_v1alpha1_pb2.NodeWatchResourcesResponse()
        for device in self.device_model().devices:
            response.devices.add(
                device=dra_health_v1alpha1_pb2.DeviceIdentifier(
                    pool_name=self.pool_name, device_name=device.name
                ),
                health=dra_health_v1alpha1_pb2.HEALTHY,
                last_updated_time=now,
                health_check_timeout_seconds=int(self.interval_s * 3),
            )
        return response

    def NodeWatchResources(
        self, request: dra_health_v1alpha1_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[dra_health_v1alpha1_pb2.NodeWatchResourcesResponse]:
        while context.is_active() and not self.stop.is_set():
            yield self.snapshot()
            self.stop.wait(self.interval_s)


def add_health_service(server: grpc.Server, service: DeviceHealthService) -> str:
    dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(service, server)
    return SERVICE_HEALTH
