"""Which /dev/shm a real MPS server and its clients must share, checked on a real GPU. Read-mostly: it starts
MPS control daemons with private pipe directories and a claim's size-limited tmpfs (as the plugin mounts it),
never changes a compute mode or MIG mode, and stops and unmounts everything at the end.

    PYTHONPATH=. python3 e2e/real_gpu/mps_shm_check.py [--nvidia-driver-root /]

A workload container sees the claim's tmpfs (`<plugin dir>/mps/<id>/shm`) as its /dev/shm. The control daemon
sees it too when it runs in its pod (`daemonMode: pod`, the chart's default: the pod mounts the tmpfs at
/dev/shm), but not when it is a child of the plugin (`daemonMode: process`): then the MPS server, which the
control daemon starts on the first client's connection, has the plugin's /dev/shm. A client here is
e2e/real_gpu/cuda_client.py in a private mount namespace with the tmpfs bound on /dev/shm (what a container
gets), or in the host's (the other /dev/shm). Prints one JSON report: per daemon placement, what each client
got (SM count under MPS, or its error) and which files MPS left in each /dev/shm.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dra_gpu.sharing.mps import DaemonSpec, MpsDaemons, daemon_limit_env, limit_commands
from dra_gpu.sharing.mps_pods import ENTRYPOINT, pod_limit_env
from e2e.real_gpu.mps_check import client, open_gpu

IN_SHM = 'mount --bind "$0" /dev/shm && exec "$@"'  # run as `unshare --mount sh -c IN_SHM <shm> <cmd...>`
PRIVATE_MOUNTS = ["unshare", "--mount", "--propagation", "private", "sh", "-c", IN_SHM]


def _client(record: dict[str, Any], in_tmpfs: bool) -> dict[str, Any]:
    """A client with the daemon's tmpfs bound on its /dev/shm (a container's view), or with the host's."""
    prefix = [*PRIVATE_MOUNTS, record["shmDir"]] if in_tmpfs else []
    started = time.monotonic()
    try:
        result = client(record, {}, prefix, timeout=40)
    except subprocess.TimeoutExpired:
        return {"timedOut": 40}
    return {**result, "seconds": round(time.monotonic() - started, 2)}


def _listing(path: str) -> list[str]:
    try:
        return sorted(p.name for p in Path(path).iterdir())[:40]
    except OSError as err:
        return [f"error: {err}"]


def _server_log(record: dict[str, Any]) -> list[str]:
    try:
        return (Path(record["logDir"]) / "server.log").read_text().splitlines()[-12:]
    except OSError:
        return []


def _clients(record: dict[str, Any]) -> dict[str, Any]:
    before = set(_listing("/dev/shm"))
    out = {
        "tmpfsFirst": _client(record, in_tmpfs=True),
        "host": _client(record, in_tmpfs=False),
        "tmpfsAgain": _client(record, in_tmpfs=True),
        "hostShmNew": sorted(set(_listing("/dev/shm")) - before),
        "tmpfsShm": _listing(record["shmDir"]),
        "serverLog": _server_log(record),
    }
    return out


def main() -> int:
    hardware, gpu, base = open_gpu("dra-gpu-mps-shm.")
    daemons = MpsDaemons(hardware, base, mount_shm=True)
    spec = DaemonSpec("process", (gpu.uuid,), (), thread_percentage=25, pinned_limits={gpu.uuid: 2 << 30})
    report: dict[str, Any] = {"gpu": gpu.product_name}

    record = daemons.start(spec)  # a child of this process, in the host's mount namespace
    try:
        report["processMode"] = {"shmMounted": record["shmMounted"], **_clients(record)}
    finally:
        report["processMode"]["stopProblems"] = daemons.stop(record)

    # as in its pod: the daemon's /dev/shm is the claim's tmpfs
    pod_spec = DaemonSpec("pod", (gpu.uuid,), (), thread_percentage=25, pinned_limits={gpu.uuid: 2 << 30})
    record = daemons._record_for(pod_spec, base / "pod", pid=None, shm_mounted=False)
    for name in ("pipe", "log", "shm"):
        (base / "pod" / name).mkdir(parents=True, exist_ok=True)
    record["shmMounted"] = daemons._mount_tmpfs(base / "pod" / "shm")
    env = {**daemons._env(record), **daemon_limit_env(record), **pod_limit_env(limit_commands(record))}
    binary = str(Path(hardware.driver_root()) / "usr/bin/nvidia-cuda-mps-control")
    shell = subprocess.Popen(
        [*PRIVATE_MOUNTS, record["shmDir"], "sh", "-c", ENTRYPOINT, binary],
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while not (daemons.answers(record) and daemons.holds_limits(record)) and time.monotonic() < deadline:
            time.sleep(0.05)
        report["podMode"] = {"shmMounted": record["shmMounted"], **_clients(record)}
    finally:
        shell.terminate()
        report["podMode"]["exitOnSigterm"] = shell.wait(60)
        subprocess.run(["umount", record["shmDir"]], check=False)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
