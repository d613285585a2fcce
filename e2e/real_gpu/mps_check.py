"""The MPS facts dra-gpu builds on, checked with the driver's own code on a real GPU (issue 12). Read-mostly:
it starts MPS control daemons with private pipe directories and stops them; it never changes a compute mode,
MIG mode or any other GPU setting (the daemons get no exclusive GPUs).

    PYTHONPATH=. python3 e2e/real_gpu/mps_check.py [--nvidia-driver-root /]

prints one JSON report:
- `limitsByCommand`: a daemon started by `MpsDaemons.start` with 25 % threads and a 2 GiB pinned limit, as the
  daemon reports them (the real tool's answer format), and `holdsLimits` (dra-gpu reads them back right);
- `clients`: what a CUDA context gets (e2e/real_gpu/cuda_client.py) with no MPS, from that daemon, with its
  own env raising the limits (100 %, 80G), and lowering them (10 %, 1G);
- `limitsFromEnvOnly`: the daemon quit and started again with its launch environment only (no commands: MPS
  docs' "control daemon level"), the limits it then holds and what a client that raises its own env gets;
- `podEntrypoint`: the daemon pod's entrypoint (sharing/mps_pods.py) run as the container would run it: the
  limits it sets, what a raising client gets, its exit when the daemon is SIGKILLed (the kubelet then
  restarts the container) and its clean `quit` on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.sharing.mps import DaemonSpec, MpsDaemons, daemon_limit_env, limit_commands
from dra_gpu.sharing.mps_pods import ENTRYPOINT, pod_limit_env

CLIENT = Path(__file__).with_name("cuda_client.py")
RAISE = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}
LOWER = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G"}


def client(
    record: dict[str, Any] | None, extra: dict[str, str], prefix: Sequence[str] = (), timeout: float = 120
) -> Any:
    """What cuda_client.py reports as a client of `record`'s daemon with `extra` in its environment, run
    behind `prefix` (e.g. a private mount namespace); subprocess.TimeoutExpired after `timeout` seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    if record is not None:
        env["CUDA_MPS_PIPE_DIRECTORY"] = record["pipeDir"]
        env["CUDA_MPS_LOG_DIRECTORY"] = record["logDir"]
    env.update(extra)
    done = subprocess.run(
        [*prefix, sys.executable, str(CLIENT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"exit": done.returncode, "stdout": done.stdout[-500:], "stderr": done.stderr[-500:]}


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def entrypoint_check(daemons: MpsDaemons, spec: DaemonSpec, base: Path) -> dict[str, Any]:
    """Run the daemon pod's entrypoint with the env the pod gets; check it twice (the second time as the
    kubelet's restart after the daemon was killed), then stop it with SIGTERM."""
    record = daemons._record_for(spec, base / "pod", pid=None, shm_mounted=False)
    for name in ("pipe", "log"):
        (base / "pod" / name).mkdir(parents=True, exist_ok=True)
    env = {**daemons._env(record), **daemon_limit_env(record), **pod_limit_env(limit_commands(record))}
    binary = str(Path(daemons._hardware.driver_root()) / "usr/bin/nvidia-cuda-mps-control")
    result: dict[str, Any] = {}
    for attempt in ("first", "restarted"):
        started = time.monotonic()
        shell = subprocess.Popen(["sh", "-c", ENTRYPOINT, binary], env=env)
        deadline = time.monotonic() + 30
        while not (daemons.answers(record) and daemons.holds_limits(record)) and time.monotonic() < deadline:
            time.sleep(0.05)
        result[attempt] = {
            "limitsSetSeconds": round(time.monotonic() - started, 3),
            "limits": daemons.limits_in_force(record),
            "raises": client(record, RAISE),
        }
        if attempt == "first":
            for child in _children(shell.pid):
                os.kill(child, 9)  # the daemon dies: the entrypoint must exit so the container restarts
            result[attempt]["exitAfterDaemonKilled"] = shell.wait(30)
        else:
            shell.terminate()  # pod deletion: quit, then exit 0
            result[attempt]["exitOnSigterm"] = shell.wait(60)
            result[attempt]["daemonAnswersAfter"] = daemons.answers(record)
    return result


def open_gpu(temp_prefix: str) -> tuple[Any, Any, Path]:
    """From the command line (--nvidia-driver-root, --hardware): the hardware, its first GPU and a fresh
    temporary directory for the daemons' pipe, log and shm directories."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--nvidia-driver-root", default="/")
    parser.add_argument("--hardware", default="real", help="a simulator profile checks the script itself")
    args = parser.parse_args()
    hardware = open_hardware(args.hardware, args.nvidia_driver_root)
    return hardware, hardware.discover().gpus[0], Path(tempfile.mkdtemp(prefix=temp_prefix))


def main() -> int:
    hardware, gpu, base = open_gpu("dra-gpu-mps-check.")
    daemons = MpsDaemons(hardware, base, mount_shm=False)
    report: dict[str, Any] = {"gpu": {"uuid": gpu.uuid, "name": gpu.product_name}}
    report["clients"] = {"noMps": client(None, {})}
    spec = DaemonSpec("check", (gpu.uuid,), (), thread_percentage=25, pinned_limits={gpu.uuid: 2 << 30})
    started = time.monotonic()
    record = daemons.start(spec)
    report["startSeconds"] = round(time.monotonic() - started, 3)
    try:
        report["record"] = {k: record[k] for k in ("pid", "startTime", "threadPercentage", "pinnedLimits")}
        report["limitsByCommand"] = daemons.limits_in_force(record)
        report["holdsLimits"] = daemons.holds_limits(record)
        report["clients"]["daemon"] = client(record, {})
        report["clients"]["raises"] = client(record, RAISE)
        report["clients"]["lowers"] = client(record, LOWER)
        daemons.command(record, "quit")
        deadline = time.monotonic() + 30
        while daemons.answers(record) and time.monotonic() < deadline:
            time.sleep(0.2)
        daemons._launch(record)  # as a kubelet restart: the launch environment only, no limit commands
        deadline = time.monotonic() + 30
        while not daemons.answers(record) and time.monotonic() < deadline:
            time.sleep(0.2)
        report["limitsFromEnvOnly"] = daemons.limits_in_force(record)
        report["clients"]["envOnlyRaises"] = client(record, RAISE)
    finally:
        report["stopProblems"] = daemons.stop(record)
    report["podEntrypoint"] = entrypoint_check(daemons, spec, base)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
