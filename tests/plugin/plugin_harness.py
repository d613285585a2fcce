"""Run `dra-gpu kubelet-plugin` as a real subprocess on a simulated node, and make ResourceClaims for it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_gpu.hardware.sim_driver_root import init_sim_driver_root, state_path
from dra_gpu.hardware.simulator.state import SimState, StateStore
from tests.support.mps_view import mps_records as read_records

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.nvidia.com"
V1B1 = "resource.nvidia.com/v1beta1"


@dataclass
class SimNode:
    """Short directories (socket paths must stay under ~100 bytes) for one simulated node."""

    name: str
    hardware: str = "dgx-h100"
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(dir="/tmp", prefix="dp-")))

    def __post_init__(self) -> None:
        self.driver_root = self.base / "drv"
        self.registrar_dir = self.base / "reg"
        self.plugins_dir = self.base / "plg"
        self.cdi_root = self.base / "cdi"
        init_sim_driver_root(self.driver_root, self.hardware, seed=self.name)

    @property
    def plugin_dir(self) -> Path:
        return self.plugins_dir / DRIVER

    @property
    def registration_socket(self) -> Path:
        return self.registrar_dir / f"{DRIVER}-reg.sock"

    def checkpoint(self) -> dict[str, Any]:
        path = self.plugin_dir / "checkpoint.json"
        return json.loads(path.read_text()) if path.exists() else {"claims": {}}

    def cdi_files(self) -> list[str]:
        return sorted(os.listdir(self.cdi_root)) if self.cdi_root.exists() else []

    def sim_state(self) -> SimState:
        return StateStore(state_path(self.driver_root)).read()

    def mps_records(self) -> dict[str, dict[str, Any]]:
        """What each simulated MPS control daemon recorded, by pipe directory."""
        return read_records(self.driver_root)

    def mig_instances(self) -> list[tuple[str, int]]:
        return [(g.uuid, gi.gi_id) for g in self.sim_state().gpus for gi in g.gpu_instances]

    def gpu_compute_mode(self, uuid: str) -> int:
        return next(g.compute_mode for g in self.sim_state().gpus if g.uuid == uuid)

    def timeslices(self) -> dict[str, int]:
        return {g.uuid: g.timeslice for g in self.sim_state().gpus if g.timeslice}

    def hardware_cli(self, *args: str) -> str:
        """Run `dra-gpu hardware ...` on this node's simulated hardware, as an administrator would; its
        output."""
        command = [sys.executable, "-m", "dra_gpu.cli.main", "hardware", *args]
        done = subprocess.run(
            [*command, "--driver-root", str(self.driver_root)],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO_ROOT,
        )
        return done.stdout

    def cleanup(self) -> None:
        """Remove the node, including what a failed test left running on it: simulated MPS daemons (started
        for this driver root) and tmpfs mounts under it."""
        for pid in _pids_with_env("DRA_GPU_SIM_ROOT", str(self.driver_root)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount_point in sorted((m for m in mounts if m.startswith(f"{self.base}/")), reverse=True):
            subprocess.run(["umount", "-l", mount_point], check=False)
        shutil.rmtree(self.base, ignore_errors=True)


def _pids_with_env(name: str, value: str) -> list[int]:
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


class PluginProcess:
    def __init__(
        self,
        node: SimNode,
        kubeconfig: str,
        *,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        http_port: int | None = None,
        python: str = sys.executable,
    ) -> None:
        self.node = node
        self.http_port = http_port
        argv = [
            python,
            "-m",
            "dra_gpu.cli.kubelet_plugin",
            "--node-name",
            node.name,
            "--hardware",
            node.hardware,
            "--nvidia-driver-root",
            str(node.driver_root),
            "--kubeconfig",
            kubeconfig,
            "--kubelet-registrar-directory-path",
            str(node.registrar_dir),
            "--kubelet-plugins-directory-path",
            str(node.plugins_dir),
            "--cdi-root",
            str(node.cdi_root),
            "--publish-slices",
            "false",
            "--log-format",
            "json",
            *extra_args,
        ]
        if http_port is not None:
            argv += ["--http-endpoint", f"127.0.0.1:{http_port}"]
        self.log_path = node.base / f"plugin-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        full_env = {k: v for k, v in os.environ.items() if k != "DRA_GPU_FAULT_KILL_AT"}
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_for_socket(self.node.registration_socket, self.proc, self.log_tail, timeout)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_dead(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._log.close()
        return self.proc.returncode


def wait_for_socket(
    registration_socket: Path,
    proc: subprocess.Popen[bytes],
    log_tail: Callable[[], str],
    timeout: float = 60.0,
    poll_s: float = 0.05,
) -> Any:
    """Wait until the registration socket of the plugin process `proc` (ours or another driver's) answers
    GetInfo; returns the PluginInfo. `log_tail` says why when the process exits or never answers."""
    from tests.plugin.kubelet_client import get_info

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"plugin exited with {proc.returncode}:\n{log_tail()}")
        if registration_socket.exists():
            try:
                return get_info(registration_socket, timeout=1.0)
            except Exception:  # bound, not serving yet
                pass
        time.sleep(poll_s)
    raise TimeoutError(f"plugin not ready after {timeout}s:\n{log_tail()}")


# ---------------------------------------------------------------------------------------------- claims


def opaque(
    params: Mapping[str, Any], requests: Sequence[str] | None = None, source: str = "FromClaim"
) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": DRIVER, "parameters": dict(params)}}
    if requests:
        entry["requests"] = list(requests)
    return entry


def time_slicing(interval: str = "Long") -> dict[str, Any]:
    return {
        "apiVersion": V1B1,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }


def mps(thread_percentage: int = 40, pinned: str = "2Gi") -> dict[str, Any]:
    return {
        "apiVersion": V1B1,
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": thread_percentage,
                "defaultPinnedDeviceMemoryLimit": pinned,
            },
        },
    }


@dataclass(frozen=True)
class Result:
    request: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    consumed: Mapping[str, str] | None = None


class ClaimFactory:
    """Creates ResourceClaims and writes `status.allocation` through the status subresource, as the scheduler
    would (no scheduler needed)."""

    def __init__(self, api_client: Any, node_name: str, *, driver: str = DRIVER) -> None:
        from kubernetes import client

        # Any: raw JSON bodies in and out (`_preload_content=False`), not the typed models
        self.api: Any = client.ResourceV1Api(api_client)
        self.core: Any = client.CoreV1Api(api_client)
        self.node_name = node_name
        self.driver = driver  # the driver the allocation names (another one for the Go baseline benchmark)
        self._namespaces: set[str] = set()

    def namespace(self, name: str, labels: Mapping[str, str] | None = None) -> str:
        from kubernetes.client.exceptions import ApiException

        if name not in self._namespaces:
            meta = {"name": name, "labels": dict(labels or {})}
            try:
                self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
            except ApiException as exc:
                if exc.status != 409:
                    raise
            self._namespaces.add(name)
        return name

    def create(
        self, namespace: str, requests: Sequence[str], *, name: str | None = None, admin_access: bool = False
    ) -> tuple[str, str]:
        """A claim with one request per name, class gpu.nvidia.com; "req/sub" makes request `req` a
        firstAvailable list with subrequest `sub`. Returns (name, uid)."""
        self.namespace(namespace)
        name = name or f"claim-{uuid.uuid4().hex[:10]}"
        exact: dict[str, Any] = {
            "deviceClassName": "gpu.nvidia.com",
            "allocationMode": "ExactCount",
            "count": 1,
        }
        if admin_access:
            exact["adminAccess"] = True
        subrequests: dict[str, list[str]] = {}
        for r in requests:
            parent, _, sub = r.partition("/")
            subrequests.setdefault(parent, [])
            if sub:
                subrequests[parent].append(sub)
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": parent, "firstAvailable": [{"name": s, **exact} for s in subs]}
                        if subs
                        else {"name": parent, "exactly": exact}
                        for parent, subs in subrequests.items()
                    ]
                }
            },
        }
        resp = self.api.create_namespaced_resource_claim(namespace, body, _preload_content=False)
        created = json.loads(resp.data)
        return name, created["metadata"]["uid"]

    def allocate(
        self,
        namespace: str,
        name: str,
        results: Sequence[Result],
        configs: Sequence[Mapping[str, Any]] = (),
        other_driver_results: Sequence[Result] = (),
    ) -> None:
        allocation: dict[str, Any] = {
            "devices": {
                "results": [
                    {
                        "request": r.request,
                        "driver": self.driver,
                        "pool": self.node_name,
                        "device": r.device,
                        **({"adminAccess": True} if r.admin_access else {}),
                        **({"shareID": r.share_id} if r.share_id else {}),
                        **({"consumedCapacity": dict(r.consumed)} if r.consumed else {}),
                    }
                    for r in results
                ]
                + [
                    {
                        "request": r.request,
                        "driver": "other.example.com",
                        "pool": "elsewhere",
                        "device": r.device,
                    }
                    for r in other_driver_results
                ],
                "config": list(configs),
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [self.node_name]}]}
                ]
            },
        }
        self.api.patch_namespaced_resource_claim_status(
            name,
            namespace,
            {"status": {"allocation": allocation}},
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )

    def make(
        self,
        namespace: str,
        results: Sequence[Result],
        configs: Sequence[Mapping[str, Any]] = (),
        *,
        name: str | None = None,
    ) -> tuple[str, str]:
        requests = list(dict.fromkeys(r.request for r in results))
        claim_name, uid = self.create(namespace, requests, name=name)
        self.allocate(namespace, claim_name, results, configs)
        return claim_name, uid

    def delete(self, namespace: str, name: str) -> None:
        self.api.delete_namespaced_resource_claim(name, namespace, _preload_content=False)

    def published_devices(self) -> dict[str, dict[str, Any]]:
        """Device name -> the published device (wire format), over all of the node's ResourceSlices."""
        response = self.api.list_resource_slice(
            field_selector=f"spec.nodeName={self.node_name}", _preload_content=False
        )
        items = json.loads(response.data)["items"]
        return {d["name"]: d for s in items for d in s["spec"].get("devices", [])}

    def wait_published(
        self, until: Callable[[dict[str, dict[str, Any]]], bool], timeout: float = 30.0
    ) -> dict[str, dict[str, Any]]:
        """The published devices, once `until` holds for them."""
        deadline = time.monotonic() + timeout
        devices = self.published_devices()
        while not until(devices):
            assert time.monotonic() < deadline, f"published devices never matched: {sorted(devices)}"
            time.sleep(0.2)
            devices = self.published_devices()
        return devices
