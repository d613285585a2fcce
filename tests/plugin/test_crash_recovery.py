"""The plugin killed (SIGKILL) at each step of Prepare and Unprepare, then restarted: nothing leaks, no device
ends up prepared for two claims, and the repeated call gets the answer an uninterrupted run gives."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable

import grpc
import pytest

from tests.plugin.kubelet_client import ClaimId, KubeletClient, devices_of
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, Result, SimNode, opaque, time_slicing

pytestmark = pytest.mark.apiserver

MIG_DEVICE = "gpu-1-mig-1g10gb-19-0"
# The claim has two groups: the MIG device with default config (group 0), gpu-0 with time-slicing (group 1).
PREPARE_STEPS = [
    "prepare-started",
    "prepare-group-0-applied",  # MIG instance created, not yet in the checkpoint
    "prepare-group-0",
    "prepare-group-1-applied",
    "prepare-group-1",
    "prepare-cdi-written",
    "prepare-completed",
]
UNPREPARE_STEPS = ["unprepare-group-1", "unprepare-group-0", "unprepare-cdi-removed"]


def make_claim(claims: ClaimFactory) -> ClaimId:
    name, uid = claims.make(
        "crash",
        [Result("gpu", "gpu-0"), Result("mig", MIG_DEVICE)],
        [opaque(time_slicing("Long"), ["gpu"])],
    )
    return ClaimId("crash", uid, name)


def expected_answer(node: SimNode, claim: ClaimId) -> list[tuple[tuple[str, ...], str, str, tuple[str, ...]]]:
    return [
        (("gpu",), node.name, "gpu-0", (f"k8s.gpu.nvidia.com/claim={claim.uid}-gpu-0",)),
        (("mig",), node.name, MIG_DEVICE, (f"k8s.gpu.nvidia.com/claim={claim.uid}-{MIG_DEVICE}",)),
    ]


def assert_clean(node: SimNode) -> None:
    assert node.checkpoint()["claims"] == {}
    assert node.cdi_files() == []
    assert node.mig_instances() == []
    assert node.timeslices() == {}


def assert_prepared_once(node: SimNode, claim: ClaimId) -> None:
    assert list(node.checkpoint()["claims"]) == [claim.uid]
    assert node.checkpoint()["claims"][claim.uid]["checkpointState"] == "PrepareCompleted"
    assert node.cdi_files() == [f"k8s.gpu.nvidia.com-claim_{claim.uid}.json"]
    assert len(node.mig_instances()) == 1  # no leaked second instance for the same device
    assert list(node.timeslices().values()) == [3]


def crash(process: PluginProcess, call: Callable[[], object]) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert process.wait_dead() == -signal.SIGKILL


@pytest.mark.parametrize("step", PREPARE_STEPS)
def test_killed_during_prepare(
    step: str, start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    claim = make_claim(claims)
    doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": step})
    kubelet = KubeletClient(node.registration_socket)
    crash(doomed, lambda: kubelet.prepare([claim]))
    kubelet.close()

    start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    state = node.checkpoint()["claims"].get(claim.uid, {}).get("checkpointState")
    assert state == ("PrepareCompleted" if step == "prepare-completed" else "PrepareStarted")
    if step == "prepare-group-0-applied":
        assert node.mig_instances() == []  # created but never checkpointed: destroyed at start-up

    answer = kubelet.prepare([claim])  # the kubelet retries
    assert answer.claims[claim.uid].error == ""
    assert devices_of(answer, claim.uid) == expected_answer(node, claim)
    assert_prepared_once(node, claim)

    assert kubelet.unprepare([claim]).claims[claim.uid].error == ""
    assert_clean(node)
    kubelet.close()


@pytest.mark.parametrize("step", UNPREPARE_STEPS)
def test_prepare_after_an_unprepare_killed_halfway_prepares_again(
    step: str, start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Found by the soak (tests/soak): killed after the time-slice group was undone, the checkpoint still
    said PrepareCompleted, so a prepare (a new pod of the claim) answered from it while the GPU's time slice
    was back to default. Now the unprepare records that it started before undoing anything, and the prepare
    finishes the undo and prepares again: the claim has everything its answer promises."""
    claim = make_claim(claims)
    doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": step})
    kubelet = KubeletClient(node.registration_socket)
    assert kubelet.prepare([claim]).claims[claim.uid].error == ""
    crash(doomed, lambda: kubelet.unprepare([claim]))
    kubelet.close()

    start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    answer = kubelet.prepare([claim])
    assert answer.claims[claim.uid].error == ""
    assert devices_of(answer, claim.uid) == expected_answer(node, claim)
    assert_prepared_once(node, claim)  # time slice set, one MIG instance, its spec
    assert kubelet.unprepare([claim]).claims[claim.uid].error == ""
    assert_clean(node)
    kubelet.close()


@pytest.mark.parametrize("step", ["prepare-started", "prepare-group-0", "prepare-cdi-written"])
def test_killed_while_preparing_a_whole_gpu_as_it_is(
    step: str, start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """A whole GPU with no config changes nothing but its CDI spec, so its prepare records only the completed
    entry: a crash before that leaves at most a spec no record names, which the next start removes."""
    name, uid = claims.make("crash", [Result("gpu", "gpu-2")])
    claim = ClaimId("crash", uid, name)
    doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": step})
    kubelet = KubeletClient(node.registration_socket)
    crash(doomed, lambda: kubelet.prepare([claim]))
    kubelet.close()
    assert node.checkpoint()["claims"] == {}
    leftover = [f"k8s.gpu.nvidia.com-claim_{uid}.json"] if step == "prepare-cdi-written" else []
    assert node.cdi_files() == leftover

    start_plugin()
    assert_clean(node)  # the leftover spec is gone at start
    kubelet = KubeletClient(node.registration_socket)
    answer = kubelet.prepare([claim])  # the kubelet retries
    assert answer.claims[uid].error == ""
    assert node.checkpoint()["claims"][uid]["checkpointState"] == "PrepareCompleted"
    assert kubelet.unprepare([claim]).claims[uid].error == ""
    assert_clean(node)
    kubelet.close()


@pytest.mark.parametrize("step", UNPREPARE_STEPS)
def test_killed_during_unprepare(
    step: str, start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    claim = make_claim(claims)
    doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": step})
    kubelet = KubeletClient(node.registration_socket)
    assert kubelet.prepare([claim]).claims[claim.uid].error == ""
    crash(doomed, lambda: kubelet.unprepare([claim]))
    kubelet.close()

    start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    assert kubelet.unprepare([claim]).claims[claim.uid].error == ""
    assert_clean(node)
    kubelet.close()


def test_interrupted_claim_deleted_meanwhile_is_cleaned_at_start(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    claim = make_claim(claims)
    doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": "prepare-cdi-written"})
    kubelet = KubeletClient(node.registration_socket)
    crash(doomed, lambda: kubelet.prepare([claim]))
    kubelet.close()
    assert len(node.mig_instances()) == 1 and node.cdi_files() != []

    claims.delete("crash", claim.name)  # the pod went away while the plugin was down
    start_plugin()
    deadline = time.monotonic() + 20
    while node.checkpoint()["claims"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_clean(node)


def test_checkpoint_from_before_a_reboot_is_discarded_with_its_mig_devices(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    claim = make_claim(claims)
    first = start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    assert kubelet.prepare([claim]).claims[claim.uid].error == ""
    kubelet.close()
    first.stop(signal.SIGKILL)

    path = node.plugin_dir / "checkpoint.json"
    doc = json.loads(path.read_text())
    doc["bootID"] = "an-earlier-boot"
    path.write_text(json.dumps(doc))
    start_plugin()
    assert node.checkpoint()["claims"] == {}
    assert node.mig_instances() == []  # not owned by any claim of this boot
    assert node.cdi_files() == []


@pytest.mark.parametrize("step", ["time-slice-recorded", "prepare-group-0-applied"])
def test_time_slice_of_a_claim_deleted_while_down_is_reset_at_start(
    step: str, start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Killed after the time-slice holder was recorded (before, resp. after, the interval was set) and
    before the claim was checkpointed; the claim is gone when the plugin is back: no interval stays set and
    no holder stays recorded."""
    name, uid = claims.make("crash", [Result("gpu", "gpu-2")], [opaque(time_slicing("Long"), ["gpu"])])
    claim = ClaimId("crash", uid, name)
    doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": step})
    kubelet = KubeletClient(node.registration_socket)
    crash(doomed, lambda: kubelet.prepare([claim]))
    kubelet.close()
    if step == "prepare-group-0-applied":
        assert list(node.timeslices().values()) == [3]  # the crash window: set, not yet checkpointed

    claims.delete("crash", claim.name)  # the pod went away while the plugin was down
    start_plugin()
    deadline = time.monotonic() + 20
    while (node.checkpoint()["claims"] or node.timeslices()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_clean(node)
    registry = json.loads((node.plugin_dir / "sharing-registry.json").read_text())
    assert registry["timeSlice"] == {}


def test_replayed_unprepare_leaves_a_mig_device_that_reuses_the_ids_alone(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Killed after the claim's MIG device was destroyed, before the checkpoint said so; meanwhile an
    administrator made a MIG device that got the same GPU-instance/compute-instance ids. The replayed
    unprepare (the kubelet retries) identifies ours by its MIG uuid and leaves theirs alone."""
    from dra_gpu.hardware.loader import open_hardware

    name, uid = claims.make("crash", [Result("mig", MIG_DEVICE)])
    claim = ClaimId("crash", uid, name)
    doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": "unprepare-group-0"})
    kubelet = KubeletClient(node.registration_socket)
    assert kubelet.prepare([claim]).claims[uid].error == ""
    ((parent, ours_gi),) = node.mig_instances()
    crash(doomed, lambda: kubelet.unprepare([claim]))
    kubelet.close()
    assert node.mig_instances() == [] and uid in node.checkpoint()["claims"]

    hardware = open_hardware(node.hardware, str(node.driver_root))
    theirs = hardware.create_mig_device(parent, 19, 0)  # 1g.10gb at placement 0, as ours was
    assert (theirs.parent_uuid, theirs.gi_id) == (parent, ours_gi)  # the ids came back

    start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    assert kubelet.unprepare([claim]).claims[uid].error == ""
    kubelet.close()
    assert node.checkpoint()["claims"] == {} and node.cdi_files() == []
    assert [i.uuid for i in hardware.list_mig_devices(parent)] == [theirs.uuid]
    hardware.destroy_mig_device(parent, theirs.gi_id, theirs.ci_id)
