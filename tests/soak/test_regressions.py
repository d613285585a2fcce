"""What the soak found, replayed at the soak's level (a fresh simulated node, the real plugin process, the
invariants of tests/soak/invariants.py); each bug also has a focused test next to the code it fixed:

1. An unprepare killed halfway left a PrepareCompleted checkpoint entry; a prepare then answered from it for
   a claim whose time slice (or MPS daemon) was already undone.
   -> tests/plugin/test_crash_recovery.py::test_prepare_after_an_unprepare_killed_halfway_prepares_again
2. A killed MPS daemon restarted on a full plugin directory: the new daemon started, saving its record failed,
   and it was left running unplaced; one more orphaned daemon every reconcile pass.
   -> tests/sharing/test_mps.py::test_a_restart_that_fails_after_the_daemon_started_leaves_no_daemon_running
3. A sharing-registry write that failed (disk full) left its partial temp file behind.
   -> tests/sharing/test_registry.py::test_a_write_that_fails_leaves_no_temp_file
4. Killed between NVML creating a MIG device and the registry naming it, the instance was nobody's: never
   destroyed, its placement taken for every later claim.
   -> tests/sharing/test_mig_lifecycle.py::test_an_instance_made_just_before_a_crash_is_destroyed_at_start_up
5. Killed between destroying a MIG device's compute instance and its GPU instance, the replayed unprepare
   (and start-up) took the device for gone: the empty GPU instance stayed, holding its placement.
   -> tests/sharing/test_mig_lifecycle.py::
      test_a_gpu_instance_left_empty_by_a_crash_is_destroyed_by_the_replayed_unprepare and
      test_start_up_destroys_a_gpu_instance_left_empty_by_a_crash
6. The plugin killed while its reconcile pass restarted a daemon (launched, not yet put in place): the next
   plugin's pass cleared `stage/` and started another; the first one ran on, orphaned.
   -> tests/sharing/test_mps.py::test_a_restart_killed_after_launching_leaves_no_daemon_behind
7. On a full disk, start-up's read of the MIG devices it created (a registry update that wrote even when it
   changed nothing) failed before any leftover was destroyed; the leftover stayed for good.
   -> tests/sharing/test_registry.py::test_an_update_that_changes_nothing_writes_nothing
8. Killed between NVML making a MIG device's GPU instance and its compute instance, start-up looked for the
   creation's device among the full MIG devices only and dropped its intent: the empty GPU instance stayed,
   nobody's; the retried prepare was refused (its device withheld from the model) and the instance outlived
   the claim's unprepare (SOAK_SEED=31).
   -> tests/sharing/test_mig_lifecycle.py::
      test_a_gpu_instance_left_empty_by_a_crash_during_creation_is_destroyed_at_start_up
9. A MIG + MPS claim whose daemon was killed while its server ran (a tenant had started it), unprepared while
   the daemon could not be restarted (a full disk): the simulated NVML still counted the dead daemon's server
   on the MIG device, so its destruction was put off for good and the placement lost (SOAK_SEED=31, the
   first soak that runs workloads). An MPS server does not outlive its control daemon; NVML now says so too.
   -> tests/sharing/test_mps.py::
      test_a_mig_device_whose_daemon_was_killed_with_its_server_is_destroyed_at_unprepare
10. The simulated MPS control daemon died when it could not append to its log (the plugin's directory full),
   so every MPS daemon of the node died with a full disk and its tenants ran outside MPS (SOAK_SEED=32).
   -> tests/sharing/test_mps_control.py::test_a_daemon_whose_log_cannot_be_written_goes_on_serving
11. After a GPU fell off the bus and came back, the simulated daemon kept handing its server (whose context
   the GPU had lost) to new clients: nothing held the GPU, and a process outside MPS got an MPS claim's GPU
   in EXCLUSIVE_PROCESS (`make soak`, SOAK_SEED=31). A server now dies with its device.
   -> tests/sharing/test_mps.py::
      test_a_server_whose_gpu_fell_off_the_bus_is_gone_and_a_process_outside_mps_stays_refused
"""

from __future__ import annotations

import time

import pytest

from dra_gpu.hardware.sim_driver_root import open_simulated_nvml
from dra_gpu.hardware.simulator.state import Fault
from tests.soak.driver import Step, run_node
from tests.soak.environment import SoakEnvironment
from tests.soak.kubelet_view import Phase, SoakClaim
from tests.soak.profiles import PROFILES
from tests.soak.run import SoakRun
from tests.soak.stats import SoakStats

pytestmark = pytest.mark.apiserver

H100 = PROFILES["dgx-h100"]


def kind(name: str) -> int:
    return H100.kinds.index(name)


def phase_of(claim: SoakClaim) -> Phase:
    return claim.phase


@pytest.mark.parametrize("claim_kind", ["time-slicing", "mps"])
def test_a_prepare_after_an_unprepare_killed_halfway_gets_everything_its_answer_promises(
    soak_env: SoakEnvironment, claim_kind: str
) -> None:
    run = SoakRun(H100, soak_env, SoakStats())
    try:
        run.allocate_claim(kind(claim_kind), 1)
        run.start_pod(0)
        run.arm_fault_point("unprepare-group-0", 0)  # its unprepare is killed after undoing the group
        (claim,) = run.claims
        assert claim.phase is Phase.IN_DOUBT
        claim.retry = "prepare"  # a new pod of the claim: the kubelet prepares it
        run.kubelet_retry(0)
        assert phase_of(claim) is Phase.PREPARED
        run.node_matches_claims()  # its time slice / MPS daemon are there again
        run.teardown_checks()
    finally:
        run.close()


def test_a_killed_mps_daemon_on_a_full_disk_leaves_no_daemon_running(soak_env: SoakEnvironment) -> None:
    """Bug 2's scenario. How full the disk is decides which step of the restart fails, so here: nothing
    runs while the disk is full, and once it has room the claim gets exactly one daemon again, its own."""
    run = SoakRun(H100, soak_env, SoakStats())
    try:
        run.allocate_claim(kind("mps"), 1)
        run.start_pod(0)
        run.node_matches_claims()
        run.fill_disk("checkpoint")
        assert run.soak.kill_mps_daemon(0)
        time.sleep(3)  # several reconcile passes (0.5 s apart), each failing to restart it
        assert len(run.soak.live_daemons()) == 0
        run.free_disk()
        run.node_matches_claims()  # restarted within the settle time: one daemon, its own, with its limits
        assert len(run.soak.live_daemons()) == 1
        run.teardown_checks()
    finally:
        run.close()


def test_a_prepare_killed_between_the_gpu_instance_and_its_compute_instance_leaves_nothing(
    soak_env: SoakEnvironment,
) -> None:
    """Bug 8's scenario. NVML's compute-instance creation is slowed down (a simulator delay fault) so that the
    kill lands after the GPU instance exists and before its compute instance does; the restarted plugin must
    destroy that GPU instance, so the kubelet's retry prepares the claim and its unprepare leaves nothing."""
    run = SoakRun(H100, soak_env, SoakStats())
    try:
        run.allocate_claim(kind("mig"), 1)
        nvml = open_simulated_nvml(run.soak.node.driver_root)
        slow = "nvmlGpuInstanceCreateComputeInstance"
        with nvml.store.transaction() as state:
            state.faults.extend(Fault(i, slow, 0, 5.0) for i in range(len(state.gpus)))
        run.kill_plugin_at_random([0], delay_ms=2500)
        (claim,) = run.claims
        assert claim.phase is Phase.IN_DOUBT
        with nvml.store.transaction() as state:
            state.faults = [f for f in state.faults if f.function != slow]
        # (the restarted plugin has run its start-up cleanup by now: the precondition is read from history)
        run.kubelet_retry(0)
        assert phase_of(claim) is Phase.PREPARED, claim.history
        run.node_matches_claims()
        run.teardown_checks()  # unprepared: no MIG instance may be left
    finally:
        run.close()


def test_soak_steps_replay(soak_env: SoakEnvironment) -> None:
    """The form `make soak` prints a failure in (the shrunk steps, as JSON) replays as it was recorded."""
    steps = [
        Step("allocate_claim", {"kind": kind("mixed"), "draw": 7}),
        Step("start_pod", {"pick": 0}),
        Step("fill_disk", {"where": "cdi"}),
        Step("kill_plugin_at_random", {"picks": [0], "delay_ms": 5}),
        Step("free_disk"),
        Step("kubelet_retry", {"pick": 0}),
        Step("stop_pod", {"pick": 0}),
    ]
    assert run_node(H100, soak_env, SoakStats(), steps, None) == steps
