"""A simulated CUDA process: what it gets from MPS (or from the GPU without MPS), as one process of its uid.

    python -m dra_gpu.hardware.sim_tools.mps_client [--hold SECONDS] [--job-seconds T] [--gpu UUID]

    env: CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps), the client's own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
         and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA_VISIBLE_DEVICES, DRA_GPU_SIM_ROOT

prints one JSON object when it ends:

    {"mps": bool, "serverPid": int | null, "uid": int, "gpus": [uuid], "activeThreadPercentage": N,
     "smCount": SMs it may use on its first GPU, "pinnedDeviceMemoryLimits": {uuid: "<N>M" | null},
     "elapsedSeconds": from its start to the end of its job}

What it models, and from where:
- nvidia-cuda-mps-control(1): "When CUDA is first initialized in a program, the CUDA driver attempts to
  connect to the MPS control daemon. If the connection attempt fails, the program continues to run as it
  normally would without MPS." Otherwise the daemon gives it a server (its uid's, or a new one:
  mps_control.py) and it stays that server's client until it exits (`--hold` keeps it attached that long;
  SIGTERM ends the hold early, and it still detaches and reports).
- Without MPS a process takes a context of its own on its GPU (the first of CUDA_VISIBLE_DEVICES, else --gpu,
  else device 0, among the devices its container's nodes give when DRA_GPU_SIM_DEVICE_NODES names them:
  device_nodes.py) and gets the whole GPU: in compute mode Default always; in EXCLUSIVE_PROCESS only while
  no other process (an MPS server counts) has one there, else it fails with CUDA's "all CUDA-capable
  devices are busy or unavailable" (simulator/contexts.py; seen on an H200, driver 580.159.04, 2026-11-27).
- A client's own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / CUDA_MPS_PINNED_DEVICE_MEM_LIMIT only lower what its
  server gives (MPS docs 4.2.5 / 4.2.7: the client "will only further constrain the limit"); without them it
  gets the server's own limits (seen on an H200: 132 SMs / 80 GiB from a 100 %/80G server).
- `--job-seconds T`: a job that alone takes T seconds takes T x the contexts that time-slice its GPU when it
  starts (mps_control.time_sliced_contexts: the clients of one server share its context and run concurrently;
  separate servers and plain processes take turns; seen on an H200: 4 jobs in 4 servers 4.25x, 4 clients of
  one server 1.00x).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_gpu.hardware.sim_tools.mps_control import (
    ATTACH,
    DEFAULT_PIPE_DIR,
    CommandError,
    connect,
    parse_pinned_env,
    sms_for_percentage,
    thread_percentage,
)

WAIT_POLL_S = 0.05  # how often a client that waits for another user's server asks again


class ClientError(CommandError):
    pass


class _Terminated:
    """SIGTERM seen: the job and the hold end early, and the client still detaches and reports. A flag, not
    an exception, so that a signal that lands while it attaches cannot leave it attached without a report."""

    seen = False


def _on_sigterm(_signum: int, _frame: object) -> None:
    _Terminated.seen = True


def _sleep(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not _Terminated.seen and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.02))


def client_limits(server: Mapping[str, Any], env: Mapping[str, str]) -> tuple[int, dict[str, str | None]]:
    """The thread percentage and pinned limits a client with `env` gets from `server`: for each, the lower of
    the server's and the client's own setting."""
    thread = int(server["active_thread_percentage"])
    own = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip()
    if own:
        thread = min(thread, thread_percentage(own))
    gpus = list(server["gpus"])
    own_pinned = parse_pinned_env(env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ""), gpus)
    pinned: dict[str, str | None] = {}
    for uuid in gpus:
        server_value = server["pinned_mem_limits"].get(uuid)
        candidates = [v for v in (_mib_of(server_value), own_pinned.get(uuid)) if v is not None]
        pinned[uuid] = f"{min(candidates)}M" if candidates else None
    return thread, pinned


def _mib_of(value: str | None) -> int | None:
    return None if value is None else int(value.rstrip("M"))


def _read_answer(conn: socket.socket) -> dict[str, Any]:
    data = b""
    conn.settimeout(30)
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    conn.settimeout(None)
    if not data.strip():
        raise ClientError("the MPS control daemon closed the connection without an answer")
    answer: dict[str, Any] = json.loads(data)
    return answer


def attach(pipe_dir: Path) -> tuple[socket.socket, dict[str, Any]] | None:
    """Attach to a server of the daemon at `pipe_dir`, waiting while another user's server runs; None when no
    daemon can be reached (the process then runs without MPS)."""
    while True:
        try:
            conn = connect(pipe_dir)
        except OSError:
            return None
        try:
            conn.sendall(f"{ATTACH} {os.getpid()}\n".encode())
            answer = _read_answer(conn)
        except BaseException:
            conn.close()
            raise
        if answer.get("status") == "attached":
            return conn, answer
        conn.close()
        if answer.get("status") == "error":
            raise ClientError(str(answer.get("message")))
        if _Terminated.seen:
            raise ClientError("terminated while waiting for an MPS server")
        time.sleep(WAIT_POLL_S)


def _without_mps_device(env: Mapping[str, str], gpu: str | None, driver_root: str) -> str:
    """The device a process without MPS opens: the first of CUDA_VISIBLE_DEVICES (else --gpu, else device 0)
    among the devices it can reach: those its container's device nodes give (device_nodes.py) when the
    container view names them, else every GPU of the node."""
    from dra_gpu.hardware.sim_driver_root import state_path
    from dra_gpu.hardware.sim_tools import device_nodes
    from dra_gpu.hardware.simulator.state import StateStore

    state = StateStore(state_path(driver_root)).read()
    if device_nodes.ENV_VAR in env and not gpu:
        reachable = device_nodes.visible_devices(state, device_nodes.parse_nodes(env[device_nodes.ENV_VAR]))
    else:
        reachable = [g.uuid for g in state.gpus]
    if not reachable:
        raise ClientError("no CUDA-capable device is detected")  # CUDA's text (cudaErrorNoDevice)
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    chosen = visible[0] if visible else (gpu or "0")
    if chosen.isdigit():
        if int(chosen) >= len(reachable):
            raise ClientError(f"no GPU {chosen} on this simulated node")
        return reachable[int(chosen)]
    return chosen


def run(env: Mapping[str, str], hold_s: float, job_s: float, gpu: str | None) -> dict[str, Any]:
    started = time.monotonic()
    pipe_dir = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    result: dict[str, Any] = {"uid": os.getuid()}
    attached = attach(pipe_dir)
    if attached is not None:
        conn, answer = attached
        try:
            server = answer["server"]
            thread, pinned = client_limits(server, env)
            gpus = list(server["gpus"])
            full = answer.get("smCounts", {}).get(gpus[0])
            result.update(
                mps=True,
                serverPid=server["pid"],
                gpus=gpus,
                activeThreadPercentage=thread,
                smCount=None if full is None else sms_for_percentage(int(full), thread),
                pinnedDeviceMemoryLimits=pinned,
            )
            sliced = int(answer.get("timeSliced", {}).get(gpus[0], 1))
            _job_and_hold(job_s * max(sliced, 1), hold_s, started, result)
        finally:
            conn.close()  # detaches: the daemon sees the connection end
        return result
    driver_root = env.get("DRA_GPU_SIM_ROOT", "")
    if not driver_root:
        raise ClientError("no MPS control daemon and no DRA_GPU_SIM_ROOT: no simulated GPU to run on")
    from dra_gpu.hardware.sim_tools.mps_control import multiprocessors, time_sliced_contexts
    from dra_gpu.hardware.simulator.contexts import ContextRefusedError, add_context, remove_context
    from dra_gpu.hardware.simulator.state import StateStore

    uuid = _without_mps_device(env, gpu, driver_root)
    try:
        add_context(driver_root, uuid, os.getpid(), kind="compute")
    except ContextRefusedError as err:
        raise ClientError(str(err)) from None  # CUDA's own text
    except ValueError as err:
        raise ClientError(str(err)) from None
    try:
        from dra_gpu.hardware.sim_driver_root import state_path

        full = multiprocessors(StateStore(state_path(driver_root)).read(), uuid)
        result.update(
            mps=False,
            serverPid=None,
            gpus=[uuid],
            activeThreadPercentage=100,
            smCount=full,
            pinnedDeviceMemoryLimits={uuid: None},
        )
        sliced = time_sliced_contexts(driver_root, uuid)
        _job_and_hold(job_s * max(sliced, 1), hold_s, started, result)
    finally:
        remove_context(driver_root, uuid, os.getpid())
    return result


def _job_and_hold(job_s: float, hold_s: float, started: float, result: dict[str, Any]) -> None:
    _sleep(job_s)
    result["elapsedSeconds"] = round(time.monotonic() - started, 4)
    _sleep(hold_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra_gpu.hardware.sim_tools.mps_client")
    parser.add_argument("--hold", type=float, default=0.0, help="stay attached this long (seconds)")
    parser.add_argument("--job-seconds", type=float, default=0.0, help="a job that alone takes this long")
    parser.add_argument("--gpu", help="the GPU (UUID or index) of a client without MPS")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        result = run(os.environ, args.hold, args.job_seconds, args.gpu)
    except CommandError as err:
        print(f"mps client: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
