"""The `v1alpha1.DRAResourceHealth` stream: the health of every device, complete list in each message.

Each device is HEALTHY unless the health monitor's taints keep new work away from it (`NoSchedule`), then
UNHEALTHY, with the taints in `message` (1.36 field; cut to 1024 characters). Without a monitor every listed
device is HEALTHY. A message goes out at once when health changes (`notify`) and again every `interval_s`
anyway (a live stream also keeps kubelet 1.34.0-1.34.1 from dropping an idle connection).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc

from dra_gpu.inventory.device_health import health_status
from dra_gpu.inventory.model import DeviceModel
from dra_gpu.plugin.protos import dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc

SERVICE_HEALTH = "v1alpha1.DRAResourceHealth"
MAX_MESSAGE = 1024


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


class DeviceHealthService(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(
        self,
        pool_name: str,
        device_model: Callable[[], DeviceModel],
        *,
        interval_s: float = 30.0,
        stop: threading.Event | None = None,
    ) -> None:
        """`device_model`: the model with health taints (`HealthView.model`), or a plain one."""
        self.pool_name = pool_name
        self.device_model = device_model
        self.interval_s = interval_s
        self.stop = stop or threading.Event()
        self._changed = threading.Condition()
        self._generation = 0

    def notify(self) -> None:
        """Health changed: every open stream sends a new message now."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def snapshot(self) -> dra_health_v1alpha1_pb2.NodeWatchResourcesResponse:
        now = int(time.time())
        response = dra_health_v1alpha1_pb2.NodeWatchResourcesResponse()
        for device in self.device_model().devices:
            status = health_status(device)
            response.devices.add(
                device=dra_health_v1alpha1_pb2.DeviceIdentifier(
                    pool_name=self.pool_name, device_name=device.name
                ),
                health=dra_health_v1alpha1_pb2.HEALTHY
                if status.healthy
                else dra_health_v1alpha1_pb2.UNHEALTHY,
                last_updated_time=now,
                health_check_timeout_seconds=int(self.interval_s * 3),
                message=_cut(status.message),
            )
        return response

    def NodeWatchResources(
        self, request: dra_health_v1alpha1_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[dra_health_v1alpha1_pb2.NodeWatchResourcesResponse]:
        while context.is_active() and not self.stop.is_set():
            with self._changed:
                seen = self._generation
            yield self.snapshot()
            deadline = time.monotonic() + self.interval_s
            with self._changed:
                # short waits so a stopped server or a closed stream ends this thread soon
                while self._generation == seen and not self.stop.is_set() and context.is_active():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(min(left, 1.0))


def add_health_service(server: grpc.Server, service: DeviceHealthService) -> str:
    dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(service, server)
    return SERVICE_HEALTH
