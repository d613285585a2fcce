"""The fake nvidia-cuda-mps-control itself: daemon mode, client mode, validation, state records."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from sim_node import SimNode, pid_alive


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
        assert done.returncode == 0 and done.stdout.split() == ["33", "33"]
        bad = control(node, env, stdin="set_default_active_thread_percentage 300\n")
        assert bad.returncode == 1 and "0..100" in bad.stderr
        bad = control(node, env, stdin="set_default_device_pinned_mem_limit GPU-nope 10M\n")
        assert bad.returncode == 1 and "not visible" in bad.stderr
        bad = control(node, env, stdin="set_default_device_pinned_mem_limit 0 10K\n")
        assert bad.returncode == 1
        record = node.mps_records()[str(pipe)]
        assert record["running"] and record["pid"] == pid
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
        import shutil

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
