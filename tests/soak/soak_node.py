"""One simulated node under soak: its driver root, the plugin process (restarted, killed), the kubelet's
gRPC connection to it, and the faults the soak injects into its surroundings (the API server cut off, full
checkpoint and CDI directories, a GPU off the bus, a killed MPS daemon)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from dra_gpu.hardware.sim_driver_root import open_simulated_nvml
from dra_gpu.hardware.sim_tools.mps_records import daemon_alive, read_records
from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import PluginProcess, SimNode
from tests.soak.api_proxy import ApiProxy
from tests.soak.profiles import Profile, prepare_node

# Asynchronous repairs the invariants wait for (a killed MPS daemon restarted, a compute mode restored once
# its GPU is back) happen within a few of these.
PLUGIN_ENV = {"MPS_RECONCILE_SECONDS": "0.5", "REDISCOVERY_INTERVAL": "2"}
TMPFS_SIZE = "16m"  # the plugin directory and the CDI root: small filesystems the soak can fill


class PluginDiedError(Exception):
    """The plugin process ended under a call (killed); the call's claims are in doubt."""


FAULT_POINT_LINE = re.compile(r"fault injection: killing process at step (\S+)")


class SoakNode:
    def __init__(
        self,
        profile: Profile,
        kubeconfig: Path,
        api_host: str,
        api_port: int,
        name: str,
        plugin_env: Mapping[str, str] | None = None,
    ) -> None:
        """`name` seeds the simulated hardware (its UUIDs, serials, ...): the same name, the same node.
        `plugin_env`: more of the plugin's environment (a test-only injected bug)."""
        self.profile = profile
        self.extra_env = dict(plugin_env or {})
        self.node = SimNode(name=name, hardware=profile.hardware)
        prepare_node(profile, self.node)
        for directory in (self.node.plugin_dir, self.node.cdi_root):
            directory.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(directory)], check=True
            )
        self.proxy = ApiProxy(api_host, api_port)
        self.kubeconfig = self.proxy.kubeconfig(kubeconfig, self.node.base / "kubeconfig")
        self.plugin: PluginProcess | None = None
        self.kubelet: KubeletClient | None = None
        self.armed_step: str | None = None
        self.fillers: dict[str, Path] = {}
        self.lost_gpus: set[int] = set()

    # ------------------------------------------------------------------------------------- plugin process

    def start_plugin(self, kill_at: str | None = None) -> None:
        env = {**PLUGIN_ENV, **self.profile.plugin_env(), **self.extra_env}
        if kill_at:
            env["DRA_GPU_FAULT_KILL_AT"] = kill_at
        # The plugin needs the API server at start (its client); a cut relay is back for the start only if
        # the soak says so: a plugin starting while the API server is away must still come up.
        self.plugin = PluginProcess(self.node, str(self.kubeconfig), env=env)
        try:
            self.plugin.wait_ready(timeout=90)
        except RuntimeError:
            # an armed fault point reached by start-up's own work (restarting the MPS daemons of prepared
            # claims) kills it before it serves: a kill like any other, for the caller to count
            if kill_at and self.plugin.proc.returncode == -signal.SIGKILL:
                raise PluginDiedError(f"killed at {kill_at} while starting") from None
            raise
        self.armed_step = kill_at
        if self.kubelet is not None:
            self.kubelet.close()
        self.kubelet = KubeletClient(self.node.registration_socket)

    def stop_plugin(self, sig: int = signal.SIGTERM) -> None:
        if self.kubelet is not None:
            self.kubelet.close()
            self.kubelet = None
        if self.plugin is not None:
            self.plugin.stop(sig)
            self.plugin = None
        self.armed_step = None

    def fault_point_reached(self) -> str | None:
        """The named fault point the plugin process killed itself at, from its log; None when it did not."""
        if self.plugin is None:
            return None
        found = FAULT_POINT_LINE.findall(self.plugin.log_path.read_text(errors="replace"))
        return found[-1] if found else None

    def plugin_alive(self) -> bool:
        return self.plugin is not None and self.plugin.proc.poll() is None

    def kill_plugin(self) -> None:
        if self.plugin is not None and self.plugin.proc.poll() is None:
            self.plugin.proc.send_signal(signal.SIGKILL)
            self.plugin.proc.wait(20)

    def ensure_plugin(self) -> bool:
        """Restart the plugin if it died (as its DaemonSet would); True when it had to."""
        if self.plugin_alive():
            return False
        self.stop_plugin(signal.SIGKILL)
        self.start_plugin()
        return True

    def call(self, method: str, claims: list[ClaimId]) -> dict[str, Any]:
        """One NodePrepareResources / NodeUnprepareResources call; per claim UID its answer (error text, or
        the devices). Raises PluginDiedError when the plugin was killed under it."""
        assert self.kubelet is not None
        try:
            response = getattr(self.kubelet, method)(claims, timeout=60)
        except grpc.RpcError as err:
            if self.plugin is not None:
                with contextlib.suppress(Exception):
                    self.plugin.proc.wait(5)
            if not self.plugin_alive():
                raise PluginDiedError(str(err.code())) from err
            raise
        return {uid: answer for uid, answer in response.claims.items()}

    # ------------------------------------------------------------------------------------------- faults

    def fill_disk(self, where: str) -> None:
        directory = self.node.plugin_dir if where == "checkpoint" else self.node.cdi_root
        filler = directory / ".soak-filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, check=False)
        self.fillers[where] = filler

    def free_disk(self) -> None:
        for filler in self.fillers.values():
            filler.unlink(missing_ok=True)
        self.fillers.clear()

    def lose_gpu(self, index: int) -> None:
        open_simulated_nvml(self.node.driver_root).lose_gpu(index)  # as `dra-gpu hardware gpu-lost`
        self.lost_gpus.add(index)

    def lost_uuids(self) -> set[str]:
        state = self.node.sim_state()
        return {state.gpus[i].uuid for i in self.lost_gpus}

    def recover_gpus(self) -> list[int]:
        back = sorted(self.lost_gpus)
        for index in back:
            open_simulated_nvml(self.node.driver_root).recover_gpu(index)
        self.lost_gpus.clear()
        return back

    def live_daemons(self) -> dict[str, dict[str, Any]]:
        """The simulated MPS control daemons that run now, by record key."""
        return {
            key: record
            for key, record in read_records(self.node.driver_root).items()
            if record.get("running") and daemon_alive(self.node.driver_root, key)
        }

    def kill_mps_daemon(self, pick: int) -> bool:
        daemons = sorted(self.live_daemons().values(), key=lambda r: r["key"])
        if not daemons:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(daemons[pick % len(daemons)]["pid"]), signal.SIGKILL)
        return True

    # ---------------------------------------------------------------------------------------- teardown

    def checkpoint_bytes(self) -> int:
        path = self.node.plugin_dir / "checkpoint.json"
        return path.stat().st_size if path.exists() else 0

    def checkpoint(self) -> dict[str, Any]:
        path = self.node.plugin_dir / "checkpoint.json"
        return json.loads(path.read_text()) if path.exists() else {"claims": {}}

    def close(self) -> None:
        self.free_disk()
        self.proxy.up()
        with contextlib.suppress(Exception):
            self.recover_gpus()
        with contextlib.suppress(Exception):
            self.stop_plugin()
        self.proxy.down()
        for directory in (self.node.plugin_dir, self.node.cdi_root):
            subprocess.run(["umount", "-l", str(directory)], check=False, capture_output=True)
        self.node.cleanup()
