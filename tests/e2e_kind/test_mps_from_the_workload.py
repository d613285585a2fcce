"""The e2e MPS check asks from where a workload looks (issue 29): the simulated CUDA client run in a running
container's view (e2e/lib/container_client.py: the container's env from /proc/<pid>/environ, its pipe
reached through /proc/<pid>/root), compared per claim with that claim's own limits (expectations.py).

"Containers" here are processes in private mount namespaces with a prepared claim's CDI mounts bound and its
CDI env set (tests/support/container_view.py), on a simulated two-GPU node with real simulated MPS daemons.
A container whose pipe is cross-wired to another claim's daemon, or that lacks its limit env, fails."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.hardware.sim_driver_root import state_report
from dra_gpu.sharing.interface import CdiEdits, GroupResult
from dra_gpu.sharing.manager import HardwareSharingManager
from e2e.lib.container_client import container_ids, host_pid_of_container, run_client_as
from e2e.lib.container_report import ClientReport
from e2e.lib.expectations import Observed, check_all
from tests.deploy.expect_model import Expectation
from tests.sharing.sim_node import SimNode
from tests.support.container_view import container_argv, container_env

POOL = "node-a"
SHARES = {  # claim -> (device, compute %, memory)
    "claim-a": ("gpu-0-shared", "25", "10Gi"),
    "claim-big": ("gpu-0-shared", "50", "20Gi"),  # raises gpu 0's server caps above claim-a's share
    "claim-b": ("gpu-1-shared", "40", "16Gi"),
}


@pytest.fixture
def node() -> Iterator[SimNode]:
    sim = SimNode("dual-gh200")
    yield sim
    left = sim.cleanup()
    assert not left, f"the test left things behind: {left}"


@pytest.fixture
def prepared(node: SimNode) -> Iterator[dict[str, GroupResult]]:
    manager: HardwareSharingManager = node.manager()
    results: dict[str, GroupResult] = {}
    try:
        for n, (claim, (device, compute, memory)) in enumerate(SHARES.items()):
            alloc = node.alloc(
                device,
                share_id=f"22222222-0000-0000-0000-{n:012d}",
                consumed_capacity={"compute": compute, "memory": memory},
            )
            results[claim] = manager.prepare_group(claim, None, [alloc])
        yield results
    finally:
        for claim, result in results.items():
            manager.unprepare_group(claim, result.state)


class Container:
    """A process that sees the node as a container of a claim would: CDI mounts bound, CDI env set."""

    def __init__(self, edits: CdiEdits) -> None:
        self.process = subprocess.Popen(
            container_argv(edits, ["sleep", "300"]), env=container_env(edits), stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 20
        comm = Path(f"/proc/{self.process.pid}/comm")
        while (
            comm.read_text().strip() != "sleep"
        ):  # unshare and sh exec on to sleep once the mounts are bound
            assert self.process.poll() is None, "the container process ended before its mounts were bound"
            assert time.monotonic() < deadline, "the container process did not reach its command"
            time.sleep(0.02)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


def _observed(node: SimNode, clients: Mapping[str, ClientReport]) -> Observed:
    """A cluster snapshot of the three claims, one Running pod each (container `ctr`), with `clients`."""
    uuids = {"gpu-0-shared": node.uuid(0), "gpu-1-shared": node.uuid(1)}
    pods: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    for claim, (device, _, _) in SHARES.items():
        pods.append({
            "metadata": {"name": f"pod-{claim}"},
            "spec": {
                "resourceClaims": [{"name": "share", "resourceClaimName": claim}],
                "containers": [{"name": "ctr", "resources": {"claims": [{"name": "share"}]}}],
            },
            "status": {"phase": "Running"},
        })  # fmt: skip
        result = {"request": "share", "driver": "gpu.nvidia.com", "pool": POOL, "device": device}
        claims.append({
            "metadata": {"name": claim, "uid": claim},
            "status": {"allocation": {"devices": {"results": [result]}}},
        })  # fmt: skip
    slice_devices = {
        (POOL, name): {
            "name": name,
            "attributes": {"type": {"string": "gpu-share"}, "uuid": {"string": uuid}},
        }
        for name, uuid in uuids.items()
    }
    return Observed(
        pods=pods,
        claims=claims,
        slice_devices=slice_devices,
        sim_now=state_report(node.root),
        clients=clients,
    )


EXPECTATION = Expectation.model_validate({
    "schemaVersion": 1, "name": "shares", "summary": "s", "namespace": "shares", "manifests": ["x.yaml"],
    "footprint": {"gpus": 2},
    "claims": [
        {"ref": {"name": claim}, "hardware": {"mpsDaemon": True, "mps": {
            "activeThreadPercentage": int(compute), "pinnedMemoryLimit": memory,
        }}}
        for claim, (_, compute, memory) in SHARES.items()
    ],
})  # fmt: skip


def _ask(edits_by_claim: Mapping[str, CdiEdits]) -> dict[str, ClientReport]:
    """Start each claim's container with the given edits and ask MPS from inside it."""
    containers = {claim: Container(edits) for claim, edits in edits_by_claim.items()}
    try:
        return {
            f"pod-{claim}/ctr": run_client_as(c.process.pid, driver_root=None)
            for claim, c in containers.items()
        }
    finally:
        for c in containers.values():
            c.stop()


def test_each_claim_is_checked_against_what_its_own_container_gets(
    node: SimNode, prepared: dict[str, GroupResult]
) -> None:
    clients = _ask({claim: r.edits for claim, r in prepared.items()})
    assert clients["pod-claim-a/ctr"].active_thread_percentage == 25, clients
    assert clients["pod-claim-big/ctr"].active_thread_percentage == 50, clients
    # the shares of gpu 0 are clients of one server; gpu 1's share has a server of its own
    assert clients["pod-claim-a/ctr"].server_pid == clients["pod-claim-big/ctr"].server_pid
    assert clients["pod-claim-b/ctr"].gpus == (node.uuid(1),)
    assert check_all(EXPECTATION, _observed(node, clients)) == []


def test_a_container_given_another_claims_pipe_fails_the_check(
    node: SimNode, prepared: dict[str, GroupResult]
) -> None:
    """claim-a's container gets claim-b's mounts (its pipe) with its own env: its own limit env lowers the
    other server's caps to claim-a's numbers, so only the server's device gives the cross-wiring away."""
    a, b = prepared["claim-a"].edits, prepared["claim-b"].edits
    edits = {claim: r.edits for claim, r in prepared.items()} | {"claim-a": replace(a, mounts=b.mounts)}
    clients = _ask(edits)
    assert clients["pod-claim-a/ctr"].gpus == (node.uuid(1),), clients
    failures = check_all(EXPECTATION, _observed(node, clients))
    assert len(failures) == 1 and "claim claim-a" in failures[0], failures
    assert f"serves ['{node.uuid(1)}'], not the claim's device ['{node.uuid(0)}']" in failures[0]


def test_a_container_without_its_limit_env_fails_the_check(
    node: SimNode, prepared: dict[str, GroupResult]
) -> None:
    """Without CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / CUDA_MPS_PINNED_DEVICE_MEM_LIMIT claim-a's processes get
    the shared server's caps (the largest share on the GPU, claim-big's), not claim-a's share."""
    a = prepared["claim-a"].edits
    bare = replace(a, env=tuple(e for e in a.env if e.startswith("CUDA_MPS_PIPE_DIRECTORY=")))
    clients = _ask({claim: r.edits for claim, r in prepared.items()} | {"claim-a": bare})
    failures = check_all(EXPECTATION, _observed(node, clients))
    assert failures == [
        "claim claim-a (claim-a): a CUDA client in pod-claim-a/ctr gets MPS active thread percentage 50, "
        "expected 25",
        f"claim claim-a (claim-a): a CUDA client in pod-claim-a/ctr gets MPS pinned memory limits "
        f"{{'{node.uuid(0)}': '20480M'}}, expected 10Gi",
    ]


def test_the_container_process_is_found_by_its_id_in_the_cgroup(tmp_path: Path) -> None:
    cid = "0123456789abcdef" * 4
    for pid, cgroup in ((40, "0::/init.scope"), (52, f"0::/kubepods/pod1/cri-containerd-{cid}.scope"),
                        (51, f"0::/kubepods/pod1/{cid}"), (7, "0::/kubepods/pod1/other")):  # fmt: skip
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(cgroup + "\n")
    (tmp_path / "self").mkdir()
    assert host_pid_of_container(cid, tmp_path) == 51  # the container's first process
    assert host_pid_of_container("f" * 64, tmp_path) is None
    pod = {"status": {"containerStatuses": [{"name": "ctr", "containerID": f"containerd://{cid}"}]}}
    assert container_ids(pod) == {"ctr": cid}
