"""Run a process as a container of a prepared claim would see the node: the claim's CDI mounts bound at their
container paths in a private mount namespace, and its CDI env; its device nodes are named to the simulated
client (DRA_GPU_SIM_DEVICE_NODES), which opens only what they give. Checks of sharing read what a workload
gets from there (the simulated CUDA client), not the driver's own records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dra_gpu.hardware.sim_tools import device_nodes
from dra_gpu.sharing.interface import CdiEdits

# Binds each "host\0container" pair given after the script, then execs the rest; runs as root in `unshare -m`
# (util-linux makes the namespace's mounts private, so nothing reaches the host's table).
_BIND_ALL = """
while [ "$1" != "--" ]; do
  mkdir -p "$2" && mount --bind "$1" "$2" || exit 97
  shift 2
done
shift
exec "$@"
"""


def container_argv(edits: CdiEdits, argv: Sequence[str]) -> list[str]:
    pairs = [part for m in edits.mounts for part in (m.host_path, m.container_path)]
    return ["unshare", "--mount", "--", "sh", "-c", _BIND_ALL, "sh", *pairs, "--", *argv]


def container_env(edits: CdiEdits, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test process's env (PATH, DRA_GPU_SIM_ROOT: what the simulator needs) with the CDI env on top,
    and `extra` (what the pod spec adds) last, as a container runtime applies them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    for item in edits.env:
        name, _, value = item.partition("=")
        env[name] = value
    if edits.device_nodes:  # the nodes a runtime would create in the container (device_nodes.py)
        env[device_nodes.ENV_VAR] = ",".join(node.path for node in edits.device_nodes)
    env.update(extra or {})
    return env


def sim_client(
    edits: CdiEdits,
    driver_root: str | os.PathLike[str],
    *args: str,
    env: Mapping[str, str] | None = None,
    uid: int | None = None,
    timeout_s: float = 60,
) -> dict[str, Any]:
    """The simulated CUDA client's report, run in the claim's container view (as `uid`, when given)."""
    client = [sys.executable, "-m", "dra_gpu.hardware.sim_tools.mps_client", *args]
    if uid is not None:
        client = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *client]
    full_env = container_env(edits, env)
    full_env["DRA_GPU_SIM_ROOT"] = str(driver_root)
    done = subprocess.run(
        container_argv(edits, client),
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip(), "returncode": done.returncode}
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def start_sim_client(
    edits: CdiEdits, driver_root: str | os.PathLike[str], *args: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    """The same, started in the background (several clients at once)."""
    full_env = container_env(edits, env)
    full_env["DRA_GPU_SIM_ROOT"] = str(driver_root)
    client = [sys.executable, "-m", "dra_gpu.hardware.sim_tools.mps_client", *args]
    return subprocess.Popen(
        container_argv(edits, client), env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
