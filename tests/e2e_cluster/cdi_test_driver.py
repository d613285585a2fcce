"""A minimal DRA kubelet plugin that answers every claim with one fixed CDI device ID.

It exists to prove the cluster's plumbing (kubelet plugin registration -> NodePrepareResources -> CDI
injection by containerd) independently of the real driver. It speaks the same gRPC services as the real
plugin, using the project's generated protos.
"""

from __future__ import annotations

import os
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from dra_gpu.plugin.protos import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)


class _Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: Path, registered: threading.Event) -> None:
        self.driver, self.endpoint, self.registered = driver, endpoint, registered
        self.error = ""

    def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=["v1.DRAPlugin"],
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.error = request.error
        if request.plugin_registered:
            self.registered.set()
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class _Dra(dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, cdi_id: str) -> None:
        self.cdi_id = cdi_id
        self.prepared: list[str] = []
        self.unprepared: list[str] = []

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = dra_v1_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            self.prepared.append(claim.uid)
            response.claims[claim.uid].devices.append(
                dra_v1_pb2.Device(pool_name="", device_name="dev0", cdi_device_ids=[self.cdi_id])
            )
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = dra_v1_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            self.unprepared.append(claim.uid)
            response.claims[claim.uid].CopyFrom(dra_v1_pb2.NodeUnprepareResourceResponse())
        return response


class CdiTestDriver:
    """Serves registration + DRA sockets under the kubelet's standard directories until `stop()`."""

    def __init__(self, driver: str, cdi_id: str, kubelet_dir: Path = Path("/var/lib/kubelet")) -> None:
        self.driver = driver
        self.plugin_dir = kubelet_dir / "plugins" / driver
        self.dra_socket = self.plugin_dir / "dra.sock"
        self.registration_socket = kubelet_dir / "plugins_registry" / f"{driver}-reg.sock"
        self.registered = threading.Event()
        self.registration = _Registration(driver, self.dra_socket, self.registered)
        self.dra = _Dra(cdi_id)
        self._servers: list[grpc.Server] = []

    def start(self) -> CdiTestDriver:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
        for sock in (self.dra_socket, self.registration_socket):
            if sock.exists():
                os.unlink(sock)
        dra_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(self.dra, dra_server)
        dra_server.add_insecure_port(f"unix://{self.dra_socket}")
        dra_server.start()
        self._servers.append(dra_server)
        # The registration socket last: kubelet dials the DRA socket as soon as it sees this one.
        reg_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(self.registration, reg_server)
        reg_server.add_insecure_port(f"unix://{self.registration_socket}")
        reg_server.start()
        self._servers.append(reg_server)
        return self

    def stop(self) -> None:
        for server in reversed(self._servers):
            server.stop(grace=None)
        self._servers.clear()
        for sock in (self.registration_socket, self.dra_socket):
            if sock.exists():
                os.unlink(sock)
        if self.plugin_dir.exists() and not any(self.plugin_dir.iterdir()):
            self.plugin_dir.rmdir()
