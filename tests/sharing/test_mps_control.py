"""The fake nvidia-cuda-mps-control itself (sim_tools/mps_control.py, the one model of the tool): daemon mode,
client mode, validation, MPS servers and their limits, records."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sim_node import SimNode, pid_alive

from dra_gpu.hardware.sim_driver_root import init_sim_driver_root, state_path
from dra_gpu.hardware.sim_tools.mps_records import (
    KEEP_STOPPED,
    SERVER_PID_BASE,
    pipe_dir_key,
    read_records,
    record_for_pipe_dir,
    records_dir,
    write_stopped,
)


@pytest.fixture
def env(node: SimNode) -> dict[str, str]:
    base = node.plugin_dir / "mps" / "manual"
    return {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": node.uuid(),
        "CUDA_MPS_PIPE_DIRECTORY": str(base / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(base / "log"),
    }


def _record(node: SimNode, pipe: str | Path) -> dict[str, Any]:
    found = record_for_pipe_dir(node.root, pipe)
    assert found is not None, f"no record for {pipe}"
    return found


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
        record = _record(node, pipe)
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
        assert _record(node, pipe)["running"] is False
        assert "Shutting down" in (Path(env["CUDA_MPS_LOG_DIRECTORY"]) / "control.log").read_text()
    finally:
        if pid_alive(pid):
            os.kill(pid, 9)
        shutil.rmtree(node.plugin_dir / "mps", ignore_errors=True)


def test_a_daemon_whose_log_cannot_be_written_goes_on_serving(node: SimNode, env: dict[str, str]) -> None:
    """Found by the soak: the simulated daemon died when a log line could not be written (its directory's
    disk full), so every MPS daemon of a node died when the plugin's directory filled up. The line is lost;
    commands and clients are still served."""
    assert control(node, env, "-d").returncode == 0
    pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
    pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    log = Path(env["CUDA_MPS_LOG_DIRECTORY"]) / "control.log"
    try:
        log.unlink()
        log.mkdir()  # no line can be appended to it any more
        done = control(node, env, stdin="set_default_active_thread_percentage 40\nget_server_list\n")
        assert done.returncode == 0, done.stderr
        assert pid_alive(pid) and _record(node, pipe)["default_active_thread_percentage"] == 40
        assert control(node, env, stdin="quit\n").returncode == 0
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
        record = _record(node, pipe)
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
        record = _record(node, pipe)
        assert record["running"] is True and record["multi_user"] is True and record["pid"] == daemon.pid
        daemon.terminate()
        assert daemon.wait(10) == 0
        assert not (pipe / "control").exists() and not (pipe / "nvidia-cuda-mps-control.pid").exists()
        record = _record(node, pipe)
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
    record, named by its pipe directory's identity, moves to the stopped name when it quits, a new daemon of
    the same pipe directory is the one reported, and only the newest KEEP_STOPPED stopped records are kept."""
    records = records_dir(node.root)
    pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
    for n in range(KEEP_STOPPED):  # older daemons of other pipe directories, the first one the oldest
        write_stopped(node.root, {"key": f"old-{n}", "pipe_dir": f"/old/{n}", "running": False, "started": n})
        os.utime(records / f"old-{n}.stopped.json", ns=(n * 10**9, n * 10**9))
    state_file = state_path(node.root)
    before = (os.stat(state_file).st_mtime_ns, state_file.read_bytes())
    for _round in range(2):
        assert control(node, env, "-d").returncode == 0
        key = pipe_dir_key(pipe)
        pid = int((Path(pipe) / "nvidia-cuda-mps-control.pid").read_text())
        assert control(node, env, stdin="set_default_active_thread_percentage 20\n").returncode == 0
        assert (records / f"{key}.json").is_file()
        record = read_records(node.root)[key]
        assert record["running"] and record["pid"] == pid and record["default_active_thread_percentage"] == 20
        assert record["pipe_dir"] == pipe and record["servers"] == []
        assert control(node, env, stdin="quit\n").returncode == 0
        _wait_exit(pid)
        assert not (records / f"{key}.json").exists()
        stopped = read_records(node.root)[key]
        assert stopped["running"] is False and stopped["pid"] == pid
        commands = [c["command"] for c in stopped["commands"]]
        assert commands == ["set_default_active_thread_percentage 20", "quit"]
    shutil.rmtree(node.plugin_dir / "mps")
    assert (os.stat(state_file).st_mtime_ns, state_file.read_bytes()) == before
    kept = read_records(node.root)
    assert len(kept) == KEEP_STOPPED and "old-0" not in kept and "old-1" in kept and key in kept


# ---- MPS servers (issue 28): what the real tool refuses and how its servers take limits ----


def client(node: SimNode, env: dict[str, str], *args: str, **extra: str) -> dict[str, Any]:
    """One simulated CUDA process (sim_tools/mps_client.py) with `env` (+ `extra`); its JSON report."""
    done = subprocess.run(
        [sys.executable, "-m", "dra_gpu.hardware.sim_tools.mps_client", *args],
        env={**env, **extra, "DRA_GPU_SIM_ROOT": str(node.root)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def holder(node: SimNode, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """A CUDA process that stays attached (until terminated)."""
    return subprocess.Popen(
        [sys.executable, "-m", "dra_gpu.hardware.sim_tools.mps_client", "--hold", "120", *args],
        env={**env, "DRA_GPU_SIM_ROOT": str(node.root)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def ask(node: SimNode, env: dict[str, str], command: str) -> list[str]:
    done = control(node, env, stdin=command + "\n")
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def wait_for(what: str, check: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def server_clients(node: SimNode, pipe: str | Path) -> list[int]:
    return [len(s["clients"]) for s in _record(node, pipe)["servers"]]


@pytest.fixture
def daemon(node: SimNode, env: dict[str, str]) -> Iterator[Path]:
    """A running control daemon at env's pipe directory; quit (forcing its servers down) afterwards."""
    assert control(node, env, "-d").returncode == 0
    pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
    pid = _record(node, pipe)["pid"]
    yield pipe
    control(node, env, stdin="quit -t 0\n")
    _wait_exit(pid)
    shutil.rmtree(node.plugin_dir / "mps", ignore_errors=True)


@pytest.mark.parametrize(("length", "starts"), [(86, True), (87, False), (88, False)])
def test_a_pipe_directory_of_87_characters_or_more_is_refused(
    node: SimNode, env: dict[str, str], length: int, starts: bool
) -> None:
    """H200, driver 580.159.04 (2026-11-27): `-d` exits 1, printing nothing useful, with a pipe directory of
    88 characters, and works with 86; 87 was not tried and is refused."""
    prefix = f"{node.plugin_dir}/mps/"
    pipe = prefix + "p" * (length - len(prefix))
    assert len(pipe) == length
    env = {**env, "CUDA_MPS_PIPE_DIRECTORY": pipe}
    done = control(node, env, "-d")
    try:
        assert (done.returncode == 0) == starts, done.stderr
        if not starts:
            assert done.stdout == "" and done.stderr == "" and not Path(pipe, "control").exists()
            assert read_records(node.root) == {}
    finally:
        if starts:
            pid = _record(node, pipe)["pid"]
            assert control(node, env, stdin="quit\n").returncode == 0
            _wait_exit(pid)
        shutil.rmtree(node.plugin_dir / "mps", ignore_errors=True)


def test_defaults_reach_only_the_next_server(node: SimNode, env: dict[str, str], daemon: Path) -> None:
    """MPS docs (set_default_*: "only affect the next server") and an H200 (driver 580.159.04): a server takes
    the daemon's defaults as they are when the first client spawns it; shutdown_server and a new server take
    the new ones. get_server_list prints the running servers' pids, one per line."""
    uuid = node.uuid()
    assert ask(node, env, "get_server_list") == []  # no client yet, no server
    ask(node, env, f"set_default_active_thread_percentage 25\nset_default_device_pinned_mem_limit {uuid} 12G")
    first = client(node, env)
    assert first["mps"] is True and first["uid"] == 0 and first["gpus"] == [uuid]
    assert first["activeThreadPercentage"] == 25 and first["smCount"] == 32  # whole TPCs: 25 % of 132 SMs
    assert first["pinnedDeviceMemoryLimits"] == {uuid: "12288M"}
    server_pid = first["serverPid"]
    assert server_pid > SERVER_PID_BASE and not pid_alive(server_pid)  # synthetic: no real process has it
    assert ask(node, env, "get_server_list") == [str(server_pid)]
    ask(node, env, "set_default_active_thread_percentage 50\nset_default_device_pinned_mem_limit 0 20G")
    second = client(node, env)
    assert second["serverPid"] == server_pid
    assert (second["activeThreadPercentage"], second["smCount"]) == (25, 32)  # the running server's, not 50
    assert second["pinnedDeviceMemoryLimits"] == {uuid: "12288M"}
    server = _record(node, daemon)["servers"][0]
    assert server["pid"] == server_pid and server["uid"] == 0 and server["gpus"] == [uuid]
    assert server["active_thread_percentage"] == 25 and server["pinned_mem_limits"] == {uuid: "12288M"}
    assert server["clients"] == []  # both clients have exited
    assert ask(node, env, f"shutdown_server {server_pid}") == []
    assert ask(node, env, "get_server_list") == []
    assert _record(node, daemon)["stopped_servers"][-1]["pid"] == server_pid
    third = client(node, env)
    assert third["serverPid"] not in (server_pid, None)
    assert (third["activeThreadPercentage"], third["smCount"]) == (50, 66)
    assert third["pinnedDeviceMemoryLimits"] == {uuid: "20480M"}


def test_per_server_limits_change_a_running_server(node: SimNode, env: dict[str, str], daemon: Path) -> None:
    """set_active_thread_percentage PID N and set_device_pinned_mem_limit PID DEV VALUE change a running
    server (H200, driver 580.159.04: its next client got 32 SMs and 1903 MiB free); the defaults stay."""
    uuid = node.uuid()
    first = client(node, env)
    assert (first["activeThreadPercentage"], first["smCount"]) == (100, 132)
    assert first["pinnedDeviceMemoryLimits"] == {uuid: None}
    pid = first["serverPid"]
    assert ask(node, env, f"set_active_thread_percentage {pid} 25") == ["25.0"]
    assert ask(node, env, f"set_device_pinned_mem_limit {pid} 0 2048M") == []
    assert ask(
        node, env, f"get_active_thread_percentage {pid}\nget_device_pinned_mem_limit {pid} {uuid}"
    ) == [
        "25.0",
        "2G",
    ]
    assert ask(node, env, "get_default_active_thread_percentage") == ["100.0"]
    second = client(node, env)
    assert second["serverPid"] == pid and (second["activeThreadPercentage"], second["smCount"]) == (25, 32)
    assert second["pinnedDeviceMemoryLimits"] == {uuid: "2048M"}
    bad = control(node, env, stdin="set_active_thread_percentage 12345 10\n")
    assert bad.returncode == 1 and "no MPS server with pid" in bad.stderr
    bad = control(node, env, stdin=f"set_device_pinned_mem_limit {pid} 3 1G\n")
    assert bad.returncode == 1 and "not served by MPS server" in bad.stderr


def test_shutdown_server_waits_for_its_clients_and_a_new_client_gets_a_new_server(
    node: SimNode, env: dict[str, str], daemon: Path
) -> None:
    """nvidia-cuda-mps-control(1): shutdown_server PID takes no new client and ends the server once its
    clients are gone (-f: at once); get_client_list PID prints its clients' pids."""
    held = holder(node, env)
    try:
        wait_for("the held client", lambda: server_clients(node, daemon) == [1])
        pid = _record(node, daemon)["servers"][0]["pid"]
        assert ask(node, env, f"get_client_list {pid}") == [str(held.pid)]
        assert ask(node, env, f"shutdown_server {pid}") == []
        assert ask(node, env, "get_server_list") == [str(pid)]  # still serving its client
        newer = client(node, env)["serverPid"]
        assert newer != pid and ask(node, env, "get_server_list") == [str(pid), str(newer)]
        held.terminate()
        report = json.loads(held.communicate(timeout=15)[0])  # SIGTERM: it detaches and still reports
        assert report["serverPid"] == pid
        wait_for("the drained server to end", lambda: ask(node, env, "get_server_list") == [str(newer)])
        assert ask(node, env, f"shutdown_server {newer} -f") == []
        assert ask(node, env, "get_server_list") == []
    finally:
        held.kill()
        held.wait(10)


def test_a_clients_environment_only_lowers_its_servers_limits(
    node: SimNode, env: dict[str, str], daemon: Path
) -> None:
    """MPS docs 4.2.5 / 4.2.7 and an H200 (driver 580.159.04): a client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE /
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=10G": index or UUID) lower what the server gives, never raise it; a
    client without them gets the server's own limits."""
    uuid = node.uuid()
    ask(node, env, "set_default_active_thread_percentage 50\nset_default_device_pinned_mem_limit 0 8G")
    raised = client(
        node, env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=16G"
    )
    assert (raised["activeThreadPercentage"], raised["smCount"]) == (50, 66)
    assert raised["pinnedDeviceMemoryLimits"] == {uuid: "8192M"}
    lowered = client(
        node, env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="10", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"{uuid}=1G"
    )
    assert (lowered["activeThreadPercentage"], lowered["smCount"]) == (10, 12)
    assert lowered["pinnedDeviceMemoryLimits"] == {uuid: "1024M"}
    plain = client(node, env)
    assert (plain["activeThreadPercentage"], plain["pinnedDeviceMemoryLimits"]) == (50, {uuid: "8192M"})


def test_the_pid_file_can_be_switched_off_for_the_driver_root(node: SimNode, env: dict[str, str]) -> None:
    """Driver 580 writes nvidia-cuda-mps-control.pid; DRA_GPU_SIM_MPS_PID_FILE=0 (at run time, or baked into
    the driver root's shim) models a driver that does not. The daemon is still found by its socket."""
    pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
    init_sim_driver_root(node.root, node.hardware_name, mps_pid_file=False)
    shim = (node.root / "usr" / "bin" / "nvidia-cuda-mps-control").read_text()
    assert 'DRA_GPU_SIM_MPS_PID_FILE="${DRA_GPU_SIM_MPS_PID_FILE:-0}"' in shim
    env = {k: v for k, v in env.items() if k != "DRA_GPU_SIM_MPS_PID_FILE"}
    try:
        assert control(node, env, "-d").returncode == 0
        record = _record(node, pipe)
        assert record["pid_file"] is False and not (pipe / "nvidia-cuda-mps-control.pid").exists()
        again = control(node, env, "-d")
        assert again.returncode == 1 and "already running" in again.stderr
        assert control(node, env, stdin="quit\n").returncode == 0
        _wait_exit(record["pid"])
        # the variable at run time wins over the shim's default
        assert control(node, {**env, "DRA_GPU_SIM_MPS_PID_FILE": "1"}, "-d").returncode == 0
        pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
        assert control(node, env, stdin="quit\n").returncode == 0
        _wait_exit(pid)
    finally:
        init_sim_driver_root(node.root, node.hardware_name, mps_pid_file=True)
        shutil.rmtree(node.plugin_dir / "mps", ignore_errors=True)


BIND_AND_START = 'mount --bind "$0" "$1" && exec "$2" -d'  # in a mount namespace of its own, as the driver


def test_records_follow_the_pipe_directorys_identity_not_its_path(node: SimNode, env: dict[str, str]) -> None:
    """Two daemons in mount namespaces of their own, each with its host pipe directory bind-mounted at the
    same path (as the driver starts them): two records with the same `pipe_dir`, told apart by the directory's
    identity, found by host path, and still found after the host directory is renamed."""
    base = node.plugin_dir / "mps"
    same = base / "same"  # the path both daemons see
    hosts = [base / "host-0", base / "host-1"]
    for path in (same, *hosts):
        path.mkdir(parents=True)
    binary = node.root / "usr" / "bin" / "nvidia-cuda-mps-control"
    pids = []
    try:
        for n, host in enumerate(hosts):
            daemon_env = {
                **env,
                "CUDA_MPS_PIPE_DIRECTORY": str(same),
                "CUDA_MPS_LOG_DIRECTORY": str(base / f"log-{n}"),
            }
            done = subprocess.run(
                ["unshare", "-m", "--propagation", "private", "sh", "-c", BIND_AND_START,
                 str(host), str(same), str(binary)],
                env=daemon_env, capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            record = record_for_pipe_dir(node.root, host)
            assert record is not None and record["pipe_dir"] == str(same) and record["running"]
            pids.append(record["pid"])
        assert pids[0] != pids[1]
        assert [r["pipe_dir"] for r in read_records(node.root).values()] == [str(same), str(same)]
        assert record_for_pipe_dir(node.root, same) is None  # the host's own directory has no daemon
        renamed = base / "renamed-0"
        hosts[0].rename(renamed)
        hosts[0] = renamed
        moved = record_for_pipe_dir(node.root, renamed)
        assert moved is not None and moved["pid"] == pids[0]
        for host in hosts:  # the host path reaches the daemon's socket through the bind mount
            assert (
                control(node, {**env, "CUDA_MPS_PIPE_DIRECTORY": str(host)}, stdin="quit\n").returncode == 0
            )
        for pid in pids:
            _wait_exit(pid)
    finally:
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, 9)
        shutil.rmtree(base, ignore_errors=True)
