"""The simulated CUDA process (sim_tools/mps_client.py) against the simulated MPS: per-user servers, the GPU
without MPS by compute mode, and how separate servers time-slice (observations on an H200, driver 580.159.04,
2026-11-27, and NVIDIA's MPS documentation)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sim_node import SimNode, pid_alive

from dra_gpu.hardware.sim_tools.mps_records import record_for_pipe_dir

CLIENT = [sys.executable, "-m", "dra_gpu.hardware.sim_tools.mps_client"]
OTHER_UID = 1000
EXCLUSIVE_PROCESS = 3  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS


def _env(node: SimNode, name: str) -> dict[str, str]:
    base = node.plugin_dir / "mps" / name
    return {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": node.uuid(),
        "CUDA_MPS_PIPE_DIRECTORY": str(base / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(base / "log"),
        "DRA_GPU_SIM_ROOT": str(node.root),
    }


def _control(node: SimNode, env: dict[str, str], *args: str, stdin: str = "") -> str:
    done = subprocess.run(
        [str(node.root / "usr" / "bin" / "nvidia-cuda-mps-control"), *args],
        input=stdin, env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _record(node: SimNode, env: dict[str, str]) -> dict[str, Any]:
    found = record_for_pipe_dir(node.root, env["CUDA_MPS_PIPE_DIRECTORY"])
    assert found is not None
    return found


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLIENT, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def _report(env: dict[str, str], *args: str) -> dict[str, Any]:
    done = _run(env, *args)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _start(env: dict[str, str], *args: str, uid: int | None = None) -> subprocess.Popen[str]:
    """A client process, as `uid` when given: root imports the tool, then drops to that uid (SO_PEERCRED at
    connect time is what the daemon goes by), as a workload image's non-root user would be."""
    if uid is None:
        command = [*CLIENT, *args]
    else:
        code = (
            # what argparse loads lazily is imported while still root (the interpreter is under /root)
            "import argparse, gettext, locale, os, shutil, sys; "
            "from dra_gpu.hardware.sim_tools import mps_client; "
            f"os.setuid({uid}); sys.exit(mps_client.main({list(args)!r}))"
        )
        command = [sys.executable, "-c", code]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def daemons(node: SimNode) -> Iterator[Callable[..., dict[str, str]]]:
    """start(name, *flags) -> the env of a new control daemon; every one is quit (servers forced) at the end,
    and every client process the test registered in `started` is killed first."""
    started: list[dict[str, str]] = []

    def start(name: str, *flags: str) -> dict[str, str]:
        env = _env(node, name)
        _control(node, env, "-d", *flags)
        started.append(env)
        return env

    yield start
    for env in started:
        pid = _record(node, env)["pid"]
        _control(node, env, stdin="quit -t 0\n")
        _wait_for("the daemon to exit", lambda pid=pid: not pid_alive(pid))  # type: ignore[misc]
    shutil.rmtree(node.plugin_dir / "mps", ignore_errors=True)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    found: list[subprocess.Popen[str]] = []
    yield found
    for process in found:
        process.kill()
        process.wait(10)


def _clients(node: SimNode, env: dict[str, str]) -> list[dict[str, Any]]:
    return [c for s in _record(node, env)["servers"] for c in s["clients"]]


def test_a_client_of_another_uid_waits_for_the_current_server_without_multi_user(
    node: SimNode, daemons: Callable[..., dict[str, str]], processes: list[subprocess.Popen[str]]
) -> None:
    """nvidia-cuda-mps-control(1): a server runs as the uid of the client that made it; a client of another
    uid waits until that server has finished (its clients gone), then gets a server of its own."""
    os.chmod(node.plugin_dir, 0o755)  # the other uid must reach the pipe directory
    env = daemons("single")
    root_client = _start(env, "--hold", "120")
    processes.append(root_client)
    _wait_for("the root client", lambda: len(_clients(node, env)) == 1)
    first = _record(node, env)["servers"][0]
    assert first["uid"] == 0
    other = _start(env, uid=OTHER_UID)
    processes.append(other)
    time.sleep(0.5)
    assert other.poll() is None, other.communicate()  # still waiting for the root server
    servers = _record(node, env)["servers"]
    assert [(s["pid"], s["shutting_down"]) for s in servers] == [(first["pid"], True)]
    root_client.terminate()
    out, err = other.communicate(timeout=15)
    assert other.returncode == 0, err
    report = json.loads(out)
    assert report["uid"] == OTHER_UID and report["mps"] is True and report["serverPid"] != first["pid"]
    record = _record(node, env)
    assert [(s["pid"], s["uid"]) for s in record["servers"]] == [(report["serverPid"], OTHER_UID)]
    assert first["pid"] in [s["pid"] for s in record["stopped_servers"]]


def test_a_multi_user_daemon_serves_every_uid_from_one_server(
    node: SimNode, daemons: Callable[..., dict[str, str]], processes: list[subprocess.Popen[str]]
) -> None:
    """`-M` (NVIDIA's mpsConfig.multiUser): one server serves the clients of every uid, none waits."""
    os.chmod(node.plugin_dir, 0o755)
    env = daemons("multi", "-M")
    root_client = _start(env, "--hold", "120")
    processes.append(root_client)
    _wait_for("the root client", lambda: len(_clients(node, env)) == 1)
    other = _start(env, "--hold", "120", uid=OTHER_UID)
    processes.append(other)
    _wait_for("the other uid's client", lambda: len(_clients(node, env)) == 2)
    servers = _record(node, env)["servers"]
    assert len(servers) == 1 and sorted(c["uid"] for c in servers[0]["clients"]) == [0, OTHER_UID]
    other.terminate()
    report = json.loads(other.communicate(timeout=15)[0])
    assert report["uid"] == OTHER_UID and report["serverPid"] == servers[0]["pid"]


def test_a_client_without_a_daemon_gets_the_whole_gpu_unless_exclusive_process_and_taken(
    node: SimNode, daemons: Callable[..., dict[str, str]], processes: list[subprocess.Popen[str]]
) -> None:
    """nvidia-cuda-mps-control(1): a process that cannot reach a control daemon runs without MPS. H200, driver
    580.159.04: it gets the whole GPU in compute mode Default; in EXCLUSIVE_PROCESS, with a context already on
    the GPU (an MPS server's counts), CUDA refuses it: "all CUDA-capable devices are busy or unavailable"."""
    uuid = node.uuid()
    lone = {**_env(node, "nobody"), "CUDA_VISIBLE_DEVICES": ""}  # no daemon at this pipe directory
    report = _report(lone, "--gpu", uuid)
    assert report["mps"] is False and report["serverPid"] is None and report["gpus"] == [uuid]
    assert (report["activeThreadPercentage"], report["smCount"]) == (100, 132)
    assert report["pinnedDeviceMemoryLimits"] == {uuid: None}
    env = daemons("served")
    _control(node, env, stdin="set_default_active_thread_percentage 25\n")
    served = _start(env, "--hold", "120")
    processes.append(served)
    _wait_for("the MPS client", lambda: len(_clients(node, env)) == 1)
    assert _report(lone, "--gpu", uuid)["smCount"] == 132  # Default: nothing stops it
    with node.store.transaction() as state:
        state.gpus[0].compute_mode = EXCLUSIVE_PROCESS
    refused = _run(lone, "--gpu", uuid)
    assert refused.returncode == 1 and "all CUDA-capable devices are busy or unavailable" in refused.stderr
    # a second daemon's server cannot open the GPU either; the first server's own clients still can
    second = daemons("second")
    refused = _run(second)
    assert refused.returncode == 1 and "all CUDA-capable devices are busy or unavailable" in refused.stderr
    assert _report(env)["activeThreadPercentage"] == 25
    served.terminate()
    served.wait(15)
    refused = _run(lone, "--gpu", uuid)  # an idle server still holds its context
    assert refused.returncode == 1
    server = _record(node, env)["servers"][0]["pid"]
    _control(node, env, stdin=f"shutdown_server {server}\n")
    assert _report(lone, "--gpu", uuid)["mps"] is False  # the GPU is free: a process of its own may have it


def test_separate_servers_time_slice_and_the_clients_of_one_server_do_not(
    node: SimNode, daemons: Callable[..., dict[str, str]], processes: list[subprocess.Popen[str]]
) -> None:
    """H200, driver 580.159.04: 4 jobs in 4 MPS servers took 4.25x one job alone (as 4 plain processes do);
    4 clients of one server took 1.00x. A job that alone takes T takes T x the contexts time-slicing its
    GPU."""
    job = 0.3
    envs = [daemons(f"d{n}") for n in range(4)]
    for env in envs[:3]:  # three servers busy with a client each
        processes.append(_start(env, "--hold", "120"))
    _wait_for("three busy servers", lambda: all(len(_clients(node, e)) == 1 for e in envs[:3]))
    four_servers = _report(envs[3], "--job-seconds", str(job))["elapsedSeconds"]
    assert four_servers >= 4 * job
    for process in processes:
        process.terminate()
        process.wait(15)
    processes.clear()
    for _ in range(3):  # three more clients of the last server: they share its context
        processes.append(_start(envs[3], "--hold", "120"))
    _wait_for("three clients of one server", lambda: len(_clients(node, envs[3])) == 3)
    one_server = _report(envs[3], "--job-seconds", str(job))["elapsedSeconds"]
    assert job <= one_server < 2 * job
    assert four_servers / one_server > 2.5
