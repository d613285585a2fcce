"""Ask MPS from where a workload looks: the simulated CUDA client run in a running container's view.

The examples' workloads run the suite's busybox image (images.py), which has no Python to run
`python -m dra_gpu.hardware.sim_tools.mps_client` in. So the client runs on the node, as root, as a process
of the container would see MPS:
- its environment is the container's own (`/proc/<pid>/environ` of the container's first process: the CDI
  env, the pod spec's env), so the limits a client asks for are the ones the container really carries;
- its pipe directory is reached through the container's root (`/proc/<pid>/root` + the container's
  CUDA_MPS_PIPE_DIRECTORY): path lookup below that link walks the container's own mount namespace, so the
  client talks to whatever daemon the container's bind mount leads to (a stale or cross-wired mount is seen
  as the container sees it). `nsenter -m` into that namespace would lose the node's interpreter, and a bind
  mount cannot be taken from another mount namespace, so the pipe path is the one thing rewritten;
- it runs with the container process's uid (`setpriv`), as MPS serves a server per uid.

Host pids of a container come from the container id in the pod status, found in `/proc/<pid>/cgroup` (the
runtime names each container's cgroup after its id, with the cgroupfs and the systemd driver alike). That
needs the suite on the node's host with root: the local cluster, and kind (whose nodes' processes are the
host's). Where no process is found the report says so and the expectation that needs it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from e2e.lib.container_report import ClientReport, parse_client_report

CLIENT = ("-m", "dra_gpu.hardware.sim_tools.mps_client")
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # what libcuda (and the simulated client) use without the variable
PROC = Path("/proc")


def container_ids(pod: Mapping[str, Any]) -> dict[str, str]:
    """Container name -> runtime id (`containerd://<id>` without the scheme) of its started containers."""
    out: dict[str, str] = {}
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        raw = str(status.get("containerID") or "")
        if raw:
            out[str(status.get("name"))] = raw.split("://", 1)[-1]
    return out


def host_pid_of_container(container_id: str, proc: Path = PROC) -> int | None:
    """The container's first process as the host numbers it (the lowest pid whose cgroup names the id): its
    init, which holds the env the runtime gave the container."""
    if not container_id:
        return None
    found: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue  # exited meanwhile, or not ours to read
        if container_id in cgroup:
            found.append(int(entry.name))
    return min(found) if found else None


def process_env(pid: int, proc: Path = PROC) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in (proc / str(pid) / "environ").read_bytes().split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            env[key] = value
    return env


def process_uid(pid: int, proc: Path = PROC) -> int:
    for line in (proc / str(pid) / "status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise ValueError(f"no Uid line in {proc}/{pid}/status")


def client_env(
    container_env: Mapping[str, str], pid: int, driver_root: str | None, proc: Path = PROC
) -> dict[str, str]:
    """The environment of a client in the container's view: the container's CUDA/NVIDIA variables (its MPS
    limits and visible devices), its pipe directory through `/proc/<pid>/root`, and what the node's
    interpreter needs (PATH, PYTHONPATH; DRA_GPU_SIM_ROOT for a client that finds no daemon)."""
    env = {k: v for k, v in container_env.items() if k.startswith(("CUDA_", "NVIDIA_"))}
    pipe = container_env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR
    env["CUDA_MPS_PIPE_DIRECTORY"] = f"{proc}/{pid}/root/{pipe.lstrip('/')}"
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)
    if driver_root:
        env["DRA_GPU_SIM_ROOT"] = driver_root
    return env


def run_client_as(
    pid: int, driver_root: str | None, timeout_s: float = 60, proc: Path = PROC
) -> ClientReport:
    """The client's report, run in the view of the container whose process is `pid` (see the module doc)."""
    try:
        env = client_env(process_env(pid, proc), pid, driver_root, proc)
        uid = process_uid(pid, proc)
    except (OSError, ValueError) as exc:
        return ClientReport(error=f"cannot read process {pid} of the container: {exc}")
    argv = [sys.executable, *CLIENT]
    if uid != os.getuid():
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return ClientReport(error=f"the client did not answer within {timeout_s:.0f}s")
    if done.returncode != 0:
        return ClientReport(
            error=f"the client exited {done.returncode}: {(done.stderr or done.stdout).strip()}"
        )
    return parse_client_report(done.stdout)


def client_in_container(
    pod: Mapping[str, Any], container: str, driver_root: str | None, timeout_s: float = 60
) -> ClientReport:
    """What a CUDA process in `container` of `pod` (a running pod's JSON) gets from MPS."""
    cid = container_ids(pod).get(container)
    if cid is None:
        return ClientReport(error=f"container {container} has no container id in the pod status yet")
    pid = host_pid_of_container(cid)
    if pid is None:
        return ClientReport(error=f"no process of container {container} ({cid[:12]}) on this host")
    return run_client_as(pid, driver_root, timeout_s)
