"""A test client that talks to the plugin the way the kubelet does: registration handshake on the registration
socket, then DRA calls (v1 or v1beta1, whichever the plugin offers first that it knows) on the endpoint it was
given, over one connection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from dra_gpu.plugin.protos import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # what kubelet 1.34+ speaks, in its order
_MODULES = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


@dataclass(frozen=True)
class ClaimId:
    namespace: str
    uid: str
    name: str


class RegistrationRefusedError(Exception):
    pass


def get_info(registration_socket: Path, timeout: float = 5.0) -> pluginregistration_v1_pb2.PluginInfo:
    with grpc.insecure_channel(f"unix://{registration_socket}") as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        return stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=timeout)


class KubeletClient:
    """Registers like the kubelet (`GetInfo`, choose service, `NotifyRegistrationStatus`), then calls DRA."""

    def __init__(self, registration_socket: Path, *, force_service: str | None = None) -> None:
        info = get_info(registration_socket)
        self.info = info
        chosen = force_service or next((v for v in info.supported_versions if v in KUBELET_SERVICES), None)
        with grpc.insecure_channel(f"unix://{registration_socket}") as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            if info.type != "DRAPlugin" or chosen is None:
                stub.NotifyRegistrationStatus(
                    pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=False, error="no service")
                )
                raise RegistrationRefusedError(f"{info.type} {list(info.supported_versions)}")
            stub.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True)
            )
        self.service = chosen
        self.pb2, grpc_module = _MODULES[chosen]
        self.channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        self.stub: Any = grpc_module.DRAPluginStub(self.channel)
        self.health = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(self.channel)

    def _claims(self, claims: Sequence[ClaimId]) -> list[Any]:
        return [self.pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]

    def prepare(self, claims: Sequence[ClaimId], timeout: float = 45.0) -> Any:
        request = self.pb2.NodePrepareResourcesRequest(claims=self._claims(claims))
        return self.stub.NodePrepareResources(request, timeout=timeout)

    def unprepare(self, claims: Sequence[ClaimId], timeout: float = 45.0) -> Any:
        request = self.pb2.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        return self.stub.NodeUnprepareResources(request, timeout=timeout)

    def first_health_message(
        self, timeout: float = 5.0
    ) -> dra_health_v1alpha1_pb2.NodeWatchResourcesResponse:
        stream = self.health.NodeWatchResources(
            dra_health_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=timeout
        )
        try:
            return next(iter(stream))
        finally:
            stream.cancel()

    def close(self) -> None:
        self.channel.close()


def devices_of(response: Any, uid: str) -> list[tuple[tuple[str, ...], str, str, tuple[str, ...]]]:
    """(request_names, pool, device, cdi ids) of one claim's answer, for comparing answers."""
    return [
        (tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids))
        for d in response.claims[uid].devices
    ]
