"""The plugin's two Unix sockets and their gRPC servers.

- `<registry dir>/<driver>-reg.sock` serves `pluginregistration.Registration`; the kubelet watches that
  directory and registers the plugin.
- `<plugins dir>/<driver>/dra.sock` serves DRA v1, v1beta1 and (optionally) the health stream, on one server:
  the kubelet uses one connection for all of them.
With a plugin UID (rolling-update mode, several instances per node) the names carry it:
`<driver>-<uid>-reg.sock`, `dra-<uid>.sock`. Stale sockets are removed before binding and on stop; directories
are 0750 and sockets 0600, so only root (the kubelet) can talk to the plugin.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from dra_gpu.plugin.dra_service import add_dra_services
from dra_gpu.plugin.health import DeviceHealthService, add_health_service
from dra_gpu.plugin.metrics import PluginMetrics
from dra_gpu.plugin.prepare_service import PrepareService
from dra_gpu.plugin.protos import pluginregistration_v1_pb2_grpc
from dra_gpu.plugin.registration import RegistrationService

log = structlog.get_logger(__name__)

MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL
DIR_MODE = 0o750
SOCKET_MODE = 0o600


class SocketSetupError(Exception):
    """A socket cannot be created; the message names the path and the fix."""


@dataclass(frozen=True)
class SocketPaths:
    registration: Path
    endpoint: Path
    plugin_dir: Path

    @classmethod
    def for_driver(
        cls,
        registrar_dir: Path | str,
        plugins_dir: Path | str,
        driver_name: str,
        plugin_uid: str | None = None,
    ) -> SocketPaths:
        plugin_dir = Path(plugins_dir) / driver_name
        if plugin_uid:
            registration = Path(registrar_dir) / f"{driver_name}-{plugin_uid}-reg.sock"
            endpoint = plugin_dir / f"dra-{plugin_uid}.sock"
        else:
            registration = Path(registrar_dir) / f"{driver_name}-reg.sock"
            endpoint = plugin_dir / "dra.sock"
        paths = cls(registration=registration.absolute(), endpoint=endpoint.absolute(), plugin_dir=plugin_dir)
        for path in (paths.registration, paths.endpoint):
            if len(str(path).encode()) > MAX_SOCKET_PATH:
                raise SocketSetupError(
                    f"socket path {path} is {len(str(path))} bytes; Unix sockets allow {MAX_SOCKET_PATH}: "
                    "use shorter --kubelet-registrar-directory-path / --kubelet-plugins-directory-path"
                )
        return paths


def _prepare_socket_path(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(path.parent, DIR_MODE)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketSetupError(f"{path} exists and is not a socket; remove it or choose another directory")
    path.unlink()  # stale socket of a crashed or previous instance: bind would fail on it


def _nobody_listens(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return True
        except OSError:
            return False  # busy, or not ours to judge: leave it
    return False


def remove_dead_sockets(paths: SocketPaths, driver_name: str) -> list[Path]:
    """Remove the sockets of this driver's earlier instances that no process listens on any more.

    With a plugin UID each instance names its sockets after its pod, so an instance that never stopped
    cleanly (a pod force-deleted, a node crash) leaves sockets no later instance binds again: the kubelet
    keeps finding a registration socket that refuses it. An instance that is still alive (a rolling update's
    other pod) accepts the probe and keeps its sockets."""
    candidates = [
        *paths.registration.parent.glob(f"{driver_name}-*-reg.sock"),
        *paths.plugin_dir.glob("dra-*.sock"),
    ]
    removed = []
    for path in candidates:
        if path in (paths.registration, paths.endpoint) or not stat.S_ISSOCK(path.lstat().st_mode):
            continue
        if _nobody_listens(path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            removed.append(path)
    return removed


def _bind(server: grpc.Server, path: Path) -> None:
    _prepare_socket_path(path)
    old_umask = os.umask(0o177)  # the socket is created with mode 0600
    try:
        port = server.add_insecure_port(f"unix://{path}")
    finally:
        os.umask(old_umask)
    if port == 0:
        raise SocketSetupError(f"cannot listen on {path}")


class PluginServer:
    def __init__(
        self,
        paths: SocketPaths,
        driver_name: str,
        prepare_service: PrepareService,
        metrics: PluginMetrics,
        health: DeviceHealthService | None = None,
        max_workers: int = 32,
    ) -> None:
        self.paths = paths
        self._driver_name = driver_name
        self.stop_event = threading.Event()
        pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dra")
        self._plugin = grpc.server(pool)
        versions = add_dra_services(self._plugin, prepare_service, metrics)
        if health is not None:
            health.stop = self.stop_event
            versions.append(add_health_service(self._plugin, health))
        self.registration = RegistrationService(driver_name, str(paths.endpoint), versions)
        self._registrar = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reg"))
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(self.registration, self._registrar)

    def start(self) -> None:
        # The DRA socket first: once the registration socket appears, the kubelet connects right away.
        _bind(self._plugin, self.paths.endpoint)
        self._plugin.start()
        os.chmod(self.paths.endpoint, SOCKET_MODE)
        _bind(self._registrar, self.paths.registration)
        self._registrar.start()
        os.chmod(self.paths.registration, SOCKET_MODE)
        removed = remove_dead_sockets(self.paths, self._driver_name)
        log.info(
            "serving",
            stale_sockets_removed=[str(p) for p in removed],
            registration=str(self.paths.registration),
            endpoint=str(self.paths.endpoint),
            versions=self.registration.supported_versions,
        )

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting calls, let running ones finish (up to `grace_s`), remove the sockets."""
        self.stop_event.set()
        # Registration first, so the kubelet stops routing new calls here while ours finish.
        self._registrar.stop(grace_s).wait()
        self._plugin.stop(grace_s).wait()
        for path in (self.paths.registration, self.paths.endpoint):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        log.info("stopped", endpoint=str(self.paths.endpoint))

    def wait(self) -> None:
        self._plugin.wait_for_termination()
