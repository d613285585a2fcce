"""The fake nvidia-cuda-mps-control itself: daemon mode, client mode, validation, state records.

Every test runs against both implementations: the Python reference (sim_tools/mps_control.py) and its compiled
twin (sim_tools/mps_control.go), which the simulated driver roots use when Go can build it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from sim_node import SimNode, pid_alive

from dra_gpu.hardware.sim_driver_root import state_path
from dra_gpu.hardware.sim_tools.compiled import ENV, CompiledToolError, compiled_tool
from dra_gpu.hardware.sim_tools.mps_records import (
    KEEP_STOPPED,
    read_records,
    record_key,
    records_dir,
    write_stopped,
)


@pytest.fixture(autouse=True, params=["python", "compiled"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which tool the node's driver root gets (autouse fixtures come before `node`, which writes the shim)."""
    monkeypatch.setenv(ENV, request.param)
    if request.param == "compiled":
        try:
            compiled_tool("nvidia-cuda-mps-control")
        except CompiledToolError as err:
            pytest.skip(f"no compiled simulated tool here: {err}")
    return str(request.param)


def test_the_shim_runs_the_chosen_implementation(node: SimNode, implementation: str) -> None:
    shim = (node.root / "usr" / "bin" / "nvidia-cuda-mps-control").read_text()
    assert ("-m dra_gpu.hardware.sim_tools.mps_control" in shim) == (implementation == "python")


@pytest.fixture
def env(node: SimNode) -> dict[str, str]:
    base = node.plugin_dir / "mps" / "manual"
    return {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": node.uuid(),
        "CUDA_MPS_PIPE_DIRECTORY": str(base / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(base / "log"),
    }


def control(
    node: SimNode, env: dict[str, str], *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    binary = node.root / "usr" / "bin" / "nvidia-cuda-mps-control"
    return subprocess.run(
        [str(binary), *args], input=stdin, env=env, capture_output=True, text=True, timeout=30, check=False
    )


def test_daemon_client_round_trip_and_quit(node: SimNode, env: dict[str, str]) -> None:
    assert control(node, env, "-d").returncode == 0
    pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
    pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    try:
        assert pid_alive(pid)
        assert control(node, env, "-d").returncode == 1  # one daemon per pipe directory
        done = control(
            node, env, stdin="set_default_active_thread_percentage 33\nget_default_active_thread_percentage\n"
        )
        assert done.returncode == 0 and done.stdout.split() == ["33.0", "33.0"]  # as the real tool answers
        bad = control(node, env, stdin="set_default_active_thread_percentage 300\n")
        assert bad.returncode == 1 and "0..100" in bad.stderr
        bad = control(node, env, stdin="set_default_device_pinned_mem_limit GPU-nope 10M\n")
        assert bad.returncode == 1 and "not visible" in bad.stderr
        bad = control(node, env, stdin="set_default_device_pinned_mem_limit 0 10K\n")
        assert bad.returncode == 1
        record = node.mps_records()[str(pipe)]
        assert record["running"] and record["pid"] == pid
        # as a real daemon's: clients of any uid (a non-root workload) can reach it
        assert stat.S_IMODE(os.stat(pipe / "control").st_mode) == 0o666
        assert stat.S_IMODE(os.stat(pipe / "control_lock").st_mode) == 0o666
        # the second -d probed the running daemon with get_server_list
        assert [c["ok"] for c in record["commands"]] == [True, True, True, False, False, False]
        assert control(node, env, stdin="quit\n").returncode == 0
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pid_alive(pid)
        assert not (pipe / "control").exists()
        assert node.mps_records()[str(pipe)]["running"] is False
        assert "Shutting down" in (Path(env["CUDA_MPS_LOG_DIRECTORY"]) / "control.log").read_text()
    finally:
        if pid_alive(pid):
            os.kill(pid, 9)
        shutil.rmtree(node.plugin_dir / "mps", ignore_errors=True)


def test_client_without_daemon_fails(node: SimNode, env: dict[str, str]) -> None:
    done = control(node, env, stdin="get_server_list\n")
    assert done.returncode == 1 and "Cannot find MPS control daemon" in done.stderr


def test_daemon_refuses_unknown_devices(node: SimNode, env: dict[str, str]) -> None:
    env["CUDA_VISIBLE_DEVICES"] = "GPU-00000000-0000-0000-0000-000000000000"
    done = control(node, env, "-d")
    assert done.returncode == 1 and "do not exist" in done.stderr
    env["CUDA_VISIBLE_DEVICES"] = ""
    assert control(node, env, "-d").returncode == 1
    import shutil

    shutil.rmtree(node.plugin_dir / "mps", ignore_errors=True)


def test_the_thread_limit_in_the_daemons_environment_is_its_default_from_the_start(
    node: SimNode, env: dict[str, str]
) -> None:
    """MPS docs 4.2.5 (control daemon level): the thread percentage a daemon is started with holds before any
    command. A pinned memory limit in its environment is ignored, as a real daemon ignores it (H100, driver
    580.159.04); answers look like the real tool's (`25.0`, `2G`, nothing when unset)."""
    env = {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2G"}
    assert control(node, env, "-d").returncode == 0
    pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
    pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    try:
        ask = f"get_default_active_thread_percentage\nget_default_device_pinned_mem_limit {node.uuid()}\n"
        done = control(node, env, stdin=ask)
        assert done.returncode == 0 and done.stdout.split() == ["25.0"]
        record = node.mps_records()[str(pipe)]
        assert record["default_active_thread_percentage"] == 25
        assert record["default_pinned_mem_limits"] == {}
        done = control(node, env, stdin="set_default_device_pinned_mem_limit 0 2048M\n" + ask)
        assert done.returncode == 0 and done.stdout.split() == ["25.0", "2G"]
    finally:
        assert control(node, env, stdin="quit\n").returncode == 0
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        shutil.rmtree(node.plugin_dir / "mps", ignore_errors=True)


@pytest.mark.parametrize("value", ["150", "lots", "-1"])
def test_a_daemon_with_an_invalid_thread_limit_in_its_environment_does_not_start(
    node: SimNode, env: dict[str, str], value: str
) -> None:
    done = control(node, {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": value}, "-d")
    assert done.returncode == 1 and "0..100" in done.stderr
    assert not (Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / "nvidia-cuda-mps-control.pid").exists()


def test_the_daemon_serves_one_control_session_at_a_time(node: SimNode, env: dict[str, str]) -> None:
    """As a real daemon (H100, driver 580.159.04): while one session is open, another fails at once with
    "Cannot send command to MPS control daemon process"; once it is closed, the next one works."""
    assert control(node, env, "-d").returncode == 0
    pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
    pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    binary = node.root / "usr" / "bin" / "nvidia-cuda-mps-control"
    held = subprocess.Popen(  # a session with its stdin open
        [str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        assert held.stdin is not None and held.stdout is not None
        # once it has answered a command, the held session has the daemon (no other session raced it to it)
        held.stdin.write(b"get_default_active_thread_percentage\n")
        held.stdin.flush()
        assert held.stdout.read(5) == b"100.0"
        busy = control(node, env, stdin="get_server_list\n")
        assert busy.returncode == 1 and "Cannot send command to MPS control daemon process" in busy.stderr
        held.stdin.close()
        assert held.wait(10) == 0
        assert control(node, env, stdin="get_server_list\n").returncode == 0
    finally:
        held.kill()
        held.wait(10)
        assert control(node, env, stdin="quit\n").returncode == 0
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        shutil.rmtree(node.plugin_dir / "mps", ignore_errors=True)


def test_a_foreground_multi_user_daemon_stops_cleanly_on_sigterm(node: SimNode, env: dict[str, str]) -> None:
    """`-f` is how a daemon runs in its own pod: SIGTERM (the pod deleted) ends it as `quit` does, with its
    socket and pid file removed and the state record closed; `-M` (multi-user) is recorded."""
    pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
    binary = node.root / "usr" / "bin" / "nvidia-cuda-mps-control"
    daemon = subprocess.Popen([str(binary), "-f", "-M"], env=env)
    try:
        deadline = time.monotonic() + 10
        while not (pipe / "nvidia-cuda-mps-control.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        done = control(node, env, stdin="sim_get_visible_devices\nset_default_device_pinned_mem_limit 0 0M\n")
        assert done.stdout == f'["{node.uuid()}"]\n'
        assert done.stderr == "ERROR: invalid pinned memory limit '0M': expected <N>M or <N>G, N > 0\n"
        record = node.mps_records()[str(pipe)]
        assert record["running"] is True and record["multi_user"] is True and record["pid"] == daemon.pid
        daemon.terminate()
        assert daemon.wait(10) == 0
        assert not (pipe / "control").exists() and not (pipe / "nvidia-cuda-mps-control.pid").exists()
        record = node.mps_records()[str(pipe)]
        assert record["running"] is False and record["stopped"] >= record["started"]
        assert [c["command"] for c in record["commands"]] == [
            "sim_get_visible_devices",
            "set_default_device_pinned_mem_limit 0 0M",
        ]
    finally:
        daemon.kill()
        daemon.wait(10)
        shutil.rmtree(node.plugin_dir / "mps", ignore_errors=True)


def _wait_exit(pid: int) -> None:
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pid_alive(pid)


def test_records_are_files_of_their_own(node: SimNode, env: dict[str, str]) -> None:
    """A daemon's commands leave the simulator state alone (the plugin's parsed copy of it stays valid); its
    record moves to the stopped name when it quits, a new daemon of the same pipe directory is the one
    reported, and only the newest KEEP_STOPPED stopped records are kept."""
    records = records_dir(node.root)
    pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
    for n in range(KEEP_STOPPED):  # older daemons of other pipe directories, the first one the oldest
        write_stopped(node.root, {"pipe_dir": f"/old/{n}", "running": False, "started": float(n)})
        path = records / f"{record_key(f'/old/{n}')}.stopped.json"
        os.utime(path, ns=(n * 10**9, n * 10**9))
    state_file = state_path(node.root)
    before = (os.stat(state_file).st_mtime_ns, state_file.read_bytes())
    for _round in range(2):
        assert control(node, env, "-d").returncode == 0
        pid = int((Path(pipe) / "nvidia-cuda-mps-control.pid").read_text())
        assert control(node, env, stdin="set_default_active_thread_percentage 20\n").returncode == 0
        assert (records / f"{record_key(pipe)}.json").is_file()
        record = read_records(node.root)[pipe]
        assert record["running"] and record["pid"] == pid and record["default_active_thread_percentage"] == 20
        assert control(node, env, stdin="quit\n").returncode == 0
        _wait_exit(pid)
        assert not (records / f"{record_key(pipe)}.json").exists()
        stopped = read_records(node.root)[pipe]
        assert stopped["running"] is False and stopped["pid"] == pid
        commands = [c["command"] for c in stopped["commands"]]
        assert commands == ["set_default_active_thread_percentage 20", "quit"]
    shutil.rmtree(node.plugin_dir / "mps")
    assert (os.stat(state_file).st_mtime_ns, state_file.read_bytes()) == before
    kept = read_records(node.root)
    assert len(kept) == KEEP_STOPPED and "/old/0" not in kept and "/old/1" in kept and pipe in kept
