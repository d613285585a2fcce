"""200 concurrent Prepare/Unprepare calls on distinct claims, shared claims (the same claim from several pods)
and contended devices: no unexpected error, identical answers for a shared claim, no device used twice."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from dra_gpu.sharing.manager import shared_daemon_id
from tests.plugin.claim_view import workload
from tests.plugin.kubelet_client import ClaimId, KubeletClient, devices_of
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, Result, SimNode, opaque, time_slicing

pytestmark = pytest.mark.apiserver

NS = "busy"


def make(claims: ClaimFactory, device: str, configs: list[dict[str, Any]] | None = None) -> ClaimId:
    name, uid = claims.make(NS, [Result("gpu", device)], configs or [])
    return ClaimId(NS, uid, name)


def test_200_concurrent_calls(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    # Set A, prepared during the storm: 35 MIG claims on GPUs 0-4 (7 disjoint 1g.10gb placements each), each
    # prepared 5 times (a claim shared by several pods); 4 claims that were all allocated gpu-7 (a scheduler
    # race): exactly one may win.
    mig_claims = [make(claims, f"gpu-{g}-mig-1g10gb-19-{s}") for g in range(5) for s in range(7)]
    contenders = [make(claims, "gpu-7") for _ in range(4)]
    # Set B, prepared before and unprepared during the storm.
    set_b = [make(claims, f"gpu-5-mig-1g10gb-19-{s}") for s in range(7)]
    set_b.append(make(claims, "gpu-6", [opaque(time_slicing("Medium"))]))
    for claim in set_b:
        assert kubelet.prepare([claim]).claims[claim.uid].error == ""

    calls: list[tuple[str, ClaimId]] = [("prepare", c) for c in mig_claims * 5]
    calls += [("prepare", c) for c in contenders * 2]
    calls += [("unprepare", c) for c in set_b * 2]
    calls += [("prepare", c) for c in contenders[:1]]
    assert len(calls) == 200

    def call(kind_and_claim: tuple[str, ClaimId]) -> tuple[str, ClaimId, Any]:
        kind, claim = kind_and_claim
        method = kubelet.prepare if kind == "prepare" else kubelet.unprepare
        return kind, claim, method([claim])

    # Interleave so that repeats of one claim are not next to each other.
    order = sorted(range(len(calls)), key=lambda i: (i * 7919) % len(calls))
    with ThreadPoolExecutor(max_workers=48) as pool:
        results = list(pool.map(call, [calls[i] for i in order]))

    answers: dict[str, set[tuple[Any, ...]]] = {}
    contender_errors: Counter[str] = Counter()
    for kind, claim, response in results:
        assert list(response.claims) == [claim.uid]
        error = response.claims[claim.uid].error
        if claim in contenders:
            if error:
                assert "already allocated to different claim" in error, error
                contender_errors[claim.uid] += 1
            continue
        assert error == "", error
        if kind == "prepare":
            answers.setdefault(claim.uid, set()).add(tuple(devices_of(response, claim.uid)))
    assert all(len(a) == 1 for a in answers.values())  # every repeat of a shared claim: the same answer
    winners = [c for c in contenders if contender_errors[c.uid] == 0]
    assert len(winners) == 1, contender_errors
    winner_calls = 3 if winners[0] == contenders[0] else 2  # contenders[0] got one extra call
    assert sum(contender_errors.values()) == 9 - winner_calls

    held = [(uid, d["device"]) for uid, e in node.checkpoint()["claims"].items() for d in e["devices"]]
    assert sorted(uid for uid, _ in held) == sorted([c.uid for c in mig_claims] + [winners[0].uid])
    assert len({device for _, device in held}) == len(held)  # no device in two claims
    assert len(node.mig_instances()) == 35 and len(set(node.mig_instances())) == 35
    assert node.timeslices() == {}  # set B's time-slicing was undone

    everyone = mig_claims + contenders
    with ThreadPoolExecutor(max_workers=48) as pool:
        unprepared = list(pool.map(lambda c: kubelet.unprepare([c]), everyone * 2))
    assert all(r.claims[c.uid].error == "" for r, c in zip(unprepared, everyone * 2, strict=True))
    assert node.checkpoint()["claims"] == {}
    assert node.cdi_files() == []
    assert node.mig_instances() == []
    kubelet.close()


def _prepare_together(kubelet: KubeletClient, claims: list[ClaimId]) -> None:
    with ThreadPoolExecutor(max_workers=len(claims)) as pool:
        responses = list(pool.map(lambda c: kubelet.prepare([c]), claims))
    for claim, response in zip(claims, responses, strict=True):
        assert response.claims[claim.uid].error == "", response.claims[claim.uid].error


def test_prepares_of_eight_gpus_are_inside_their_prepare_at_the_same_time(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Each prepare waits at `prepare-started` (its GPU locked, its reservation written) until all 8 are
    there: with a node-wide lock only one could ever be, and the meeting would be given up."""
    plugin = start_plugin(
        env={"DRA_GPU_FAULT_MEET_AT": "prepare-started:8", "DRA_GPU_FAULT_MEET_TIMEOUT_S": "30"}
    )
    kubelet = KubeletClient(node.registration_socket)
    # whole GPUs, MIG devices made on demand and time-sliced GPUs: every kind of change, one GPU each
    batch = [make(claims, f"gpu-{g}") for g in (0, 1, 2)]
    batch += [make(claims, f"gpu-{g}-mig-1g10gb-19-0") for g in (3, 4, 5)]
    batch += [make(claims, f"gpu-{g}", [opaque(time_slicing("Short"))]) for g in (6, 7)]
    _prepare_together(kubelet, batch)
    log = plugin.log_tail(400)
    assert "8 calls met at step prepare-started" in log, log
    assert "gave up waiting" not in log
    assert sorted(node.checkpoint()["claims"]) == sorted(c.uid for c in batch)
    assert len(node.mig_instances()) == 3


def test_prepares_on_one_gpu_take_turns(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Two MIG devices of one GPU: the second prepare cannot reach `prepare-started` while the first holds the
    GPU, so the meeting of two is given up, and both prepares still succeed, one after the other."""
    plugin = start_plugin(
        env={"DRA_GPU_FAULT_MEET_AT": "prepare-started:2", "DRA_GPU_FAULT_MEET_TIMEOUT_S": "2"}
    )
    kubelet = KubeletClient(node.registration_socket)
    _prepare_together(kubelet, [make(claims, "gpu-0-mig-1g10gb-19-0"), make(claims, "gpu-0-mig-1g10gb-19-1")])
    log = plugin.log_tail(400)
    assert "gave up waiting at step prepare-started for 2 calls" in log, log
    assert "calls met" not in log
    assert len(node.mig_instances()) == 2


def _share(claims: ClaimFactory, gpu: int, index: int) -> ClaimId:
    consumed = {"memory": "8Gi", "compute": "10"}
    share_id = str(uuid.UUID(int=gpu << 8 | index + 1))
    name, uid = claims.make(NS, [Result("gpu", f"gpu-{gpu}-shared", share_id=share_id, consumed=consumed)])
    return ClaimId(NS, uid, name)


def test_shares_of_distinct_gpus_are_prepared_side_by_side(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """A share holds only its own GPU: shares of four GPUs are inside their prepare together, and each GPU
    gets its one shares server."""
    plugin = start_plugin(
        env={"DRA_GPU_FAULT_MEET_AT": "prepare-started:4", "DRA_GPU_FAULT_MEET_TIMEOUT_S": "30"}
    )
    kubelet = KubeletClient(node.registration_socket)
    shares = [_share(claims, gpu, 0) for gpu in range(4)]
    _prepare_together(kubelet, shares)
    log = plugin.log_tail(400)
    assert "4 calls met at step prepare-started" in log, log
    running = [r for r in node.mps_records().values() if r.get("running")]
    assert sorted(r["visible_devices"][0] for r in running) == sorted(
        g.uuid for g in node.sim_state().gpus[:4]
    )
    with ThreadPoolExecutor(max_workers=4) as pool:
        undone = list(pool.map(lambda c: kubelet.unprepare([c]), shares))
    assert all(r.claims[c.uid].error == "" for r, c in zip(undone, shares, strict=True))
    assert not [r for r in node.mps_records().values() if r.get("running")]
    kubelet.close()


def test_fractional_shares_of_one_gpu_take_turns_and_join_one_server(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Shares of one GPU join and leave its one shares server (its clients and caps), so they hold the GPU
    alone and take turns: the meeting of two inside their prepare is given up, and all four still prepare,
    clients of one server, each workload held to its own share."""
    plugin = start_plugin(
        env={"DRA_GPU_FAULT_MEET_AT": "prepare-started:2", "DRA_GPU_FAULT_MEET_TIMEOUT_S": "2"}
    )
    kubelet = KubeletClient(node.registration_socket)
    shares = [_share(claims, 0, i) for i in range(4)]
    _prepare_together(kubelet, shares)
    log = plugin.log_tail(400)
    assert "gave up waiting at step prepare-started for 2 calls" in log, log
    assert "calls met" not in log
    running = [r for r in node.mps_records().values() if r.get("running")]
    assert len(running) == 1 and running[0]["default_active_thread_percentage"] == 10
    views = [workload(node, c.uid) for c in shares]
    assert all(v.get("mps") for v in views), views
    assert len({v["serverPid"] for v in views}) == 1
    assert {(v["activeThreadPercentage"], *v["pinnedDeviceMemoryLimits"].values()) for v in views} == {
        (10, "8192M")
    }
    with ThreadPoolExecutor(max_workers=4) as pool:
        undone = list(pool.map(lambda c: kubelet.unprepare([c]), shares))
    assert all(r.claims[c.uid].error == "" for r, c in zip(undone, shares, strict=True))
    assert not [r for r in node.mps_records().values() if r.get("running")]
    kubelet.close()


def test_repeated_calls_for_shares_of_one_gpu_each_join_once(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Repeats of one share claim (a kubelet retry beside the first call) take turns with each other and with
    the GPU's other shares. Every repeat gets the same answer, the GPU has one server and each claim is one
    client of it, and repeated unprepares leave nothing behind."""
    start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    gpu2 = node.sim_state().gpus[2].uuid
    shares = [_share(claims, 2, i) for i in range(3)]
    calls = shares * 4
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        responses = list(pool.map(lambda c: kubelet.prepare([c]), calls))
    answers: dict[str, set[str]] = {}
    for claim, response in zip(calls, responses, strict=True):
        assert response.claims[claim.uid].error == "", response.claims[claim.uid].error
        answers.setdefault(claim.uid, set()).add(repr(devices_of(response, claim.uid)))
    assert all(len(a) == 1 for a in answers.values())
    running = [r for r in node.mps_records().values() if r.get("running")]
    assert len(running) == 1
    groups = [g["state"] for e in node.checkpoint()["claims"].values() for g in e["groups"]]
    assert len(groups) == 3
    assert all(g["mpsDaemon"] is None and g["sharedMps"]["ownDaemon"] is False for g in groups)
    assert {g["sharedMps"]["daemonId"] for g in groups} == {shared_daemon_id(gpu2)}
    entry = json.loads((node.plugin_dir / "sharing-registry.json").read_text())["sharedMps"][gpu2]
    assert sorted(entry["clients"]) == sorted(key for g in groups for key in g["sharedMps"]["clients"])
    assert node.mps_records()[entry["daemon"]["pipeDir"]]["pid"] == running[0]["pid"]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        undone = list(pool.map(lambda c: kubelet.unprepare([c]), shares * 2))
    assert all(r.claims[c.uid].error == "" for r, c in zip(undone, shares * 2, strict=True))
    assert not [r for r in node.mps_records().values() if r.get("running")]
    assert node.checkpoint()["claims"] == {} and node.cdi_files() == []
    kubelet.close()
