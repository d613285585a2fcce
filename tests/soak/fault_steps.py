"""The world's steps against the node (`FaultSteps`) and the named fault points they may arm: the plugin
SIGKILLed at a random moment under calls or at a named point of its work, restarted gracefully, a GPU
falling off the bus and coming back reset, an MPS daemon killed, the API server unreachable, the checkpoint
or CDI directory full. Each fault that lasts has a step that ends it, which the driver draws more often."""

from __future__ import annotations

from tests.soak.kubelet_calls import KubeletCalls
from tests.soak.soak_node import PluginDiedError

# The plugin's named fault points (dra_gpu/plugin/fault_injection.py, the sharing manager's and MPS's).
FAULT_POINTS = (
    "prepare-started",
    "prepare-group-0-applied",
    "prepare-group-0",
    "prepare-group-1-applied",
    "prepare-group-1",
    "prepare-cdi-written",
    "prepare-completed",
    "unprepare-group-0",
    "unprepare-group-1",
    "unprepare-cdi-removed",
    "time-slice-recorded",
    "shares-client-added",
    "shares-client-removed",
    "mps-record-written",
    "mps-shm-mounted",
    "mps-compute-mode-set",
    "mps-daemon-started",
    "mps-limits-set",
    "mps-daemon-placed",
    "mps-limits-recorded",
    "mps-quit-sent",
    "mps-shm-unmounted",
    "mps-modes-restored",
)


class FaultSteps(KubeletCalls):
    def kill_plugin_at_random(self, picks: list[int], delay_ms: int) -> None:
        """SIGKILL the plugin a random moment after calls went out (or while it idles)."""
        self.stats.faults["kill-random"] += 1
        found = [self.claims[p % len(self.claims)] for p in picks] if self.claims else []
        plans = [(c, self._next_call(c)) for c in {id(c): c for c in found}.values()]
        self._note(f"kill after {delay_ms} ms under {[(c.index, m) for c, m in plans]}")
        if not plans:
            self.soak.kill_plugin()
            self._restart_after_kill()
            return
        self._run_together(plans, kill_after_s=delay_ms / 1000)

    def arm_fault_point(self, point: str, pick: int) -> None:
        """Restart the plugin with a named fault point armed: it kills itself when a call reaches it (this
        step's call, or a later one)."""
        self.stats.faults["restart"] += 1
        self._note(f"arm fault point {point}")
        self.soak.stop_plugin()
        try:
            self.soak.start_plugin(kill_at=point)
        except PluginDiedError:
            self.stats.faults[f"kill-at:{point}"] += 1
            self._note(f"  plugin died at {point} while starting")
            self._restart_after_kill()
            return
        if self.claims:
            claim = self.claims[pick % len(self.claims)]
            self._call(self._next_call(claim), [claim])

    def restart_plugin(self) -> None:
        """A graceful restart (an upgrade, a rescheduled pod)."""
        self.stats.faults["restart"] += 1
        self._note("restart plugin")
        self.soak.stop_plugin()
        self.soak.start_plugin()

    def lose_gpu(self, gpu: int) -> None:
        self.stats.faults["gpu-lost"] += 1
        self._note(f"GPU {gpu} lost")
        self.soak.lose_gpu(gpu)

    def gpu_back(self) -> None:
        """The GPU is back (a reset): its MIG instances are gone, so its claims with MIG devices are broken;
        their pods fail and the kubelet unprepares them."""
        state = self.soak.node.sim_state()
        back = {state.gpus[i].uuid for i in self.soak.recover_gpus()}
        self._note(f"GPUs back {sorted(back)}")
        for claim in self.claims:
            if claim.explained and any(
                d.gpu_uuid in back and d.mig_placement for d in claim.devices(self.facts)
            ):
                claim.hardware_lost = True

    def kill_mps_daemon(self, pick: int) -> None:
        if self.soak.kill_mps_daemon(pick):
            self.stats.faults["mps-daemon-killed"] += 1
            self._note("MPS daemon killed")

    def api_server_away(self) -> None:
        self.stats.faults["api-unreachable"] += 1
        self._note("API server unreachable")
        self.soak.proxy.down()

    def api_server_back(self) -> None:
        self._note("API server back")
        self.soak.proxy.up()

    def fill_disk(self, where: str) -> None:
        self.stats.faults[f"disk-full-{where}"] += 1
        self._note(f"disk full: {where}")
        self.soak.fill_disk(where)

    def free_disk(self) -> None:
        self._note("disk freed")
        self.soak.free_disk()
