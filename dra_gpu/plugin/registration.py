"""The kubelet plugin-registration service (`pluginregistration.Registration`) on `<driver>-reg.sock`."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import grpc
import structlog

from dra_gpu.plugin.protos import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc

log = structlog.get_logger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"


class RegistrationService(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    def __init__(self, driver_name: str, endpoint: str, supported_versions: Sequence[str]) -> None:
        if not endpoint.startswith("/"):
            raise ValueError(f"registration endpoint must be an absolute socket path, got {endpoint!r}")
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.supported_versions = list(supported_versions)
        self.registered = threading.Event()
        self.last_error = ""

    def GetInfo(
        self, request: pluginregistration_v1_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> pluginregistration_v1_pb2.PluginInfo:
        return pluginregistration_v1_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=self.supported_versions,
        )

    def NotifyRegistrationStatus(
        self, request: pluginregistration_v1_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> pluginregistration_v1_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            self.last_error = ""
            self.registered.set()
            log.info("registered with the kubelet", endpoint=self.endpoint, versions=self.supported_versions)
            return pluginregistration_v1_pb2.RegistrationStatusResponse()
        self.registered.clear()
        self.last_error = request.error or "no reason given"
        log.error("kubelet refused the registration", error=self.last_error)
        context.abort(grpc.StatusCode.UNKNOWN, f"plugin registration failed: {self.last_error}")
        raise AssertionError("unreachable: context.abort raises")
