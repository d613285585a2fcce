"""Sockets of earlier plugin instances that nobody serves any more are removed at start; live ones stay."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

from dra_gpu.plugin.server import SocketPaths, remove_dead_sockets

DRIVER = "gpu.nvidia.com"


def _dead_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))  # bound, never listening, closed: what a SIGKILLed or force-deleted pod leaves


def test_a_force_deleted_instances_sockets_go_and_a_live_instances_stay() -> None:
    with tempfile.TemporaryDirectory(prefix="ss-") as short:  # socket paths must stay under 108 bytes
        _check(Path(short))


def _check(tmp_path: Path) -> None:
    registry, plugins = tmp_path / "reg", tmp_path / "plugins"
    me = SocketPaths.for_driver(registry, plugins, DRIVER, plugin_uid="new-pod")
    dead = SocketPaths.for_driver(registry, plugins, DRIVER, plugin_uid="deleted-pod")
    live = SocketPaths.for_driver(registry, plugins, DRIVER, plugin_uid="surge-pod")
    other_driver = registry / "other.example.com-x-reg.sock"
    for path in (dead.registration, dead.endpoint, other_driver):
        _dead_socket(path)
    listeners = []
    for path in (live.registration, live.endpoint, me.registration, me.endpoint):
        path.parent.mkdir(parents=True, exist_ok=True)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(path))
        s.listen()
        listeners.append(s)
    try:
        removed = remove_dead_sockets(me, DRIVER)
    finally:
        for s in listeners:
            s.close()
    assert sorted(removed) == sorted([dead.registration, dead.endpoint])
    assert not dead.registration.exists() and not dead.endpoint.exists()
    assert live.registration.exists() and live.endpoint.exists() and me.registration.exists()
    assert other_driver.exists()  # another driver's socket is not ours to judge
