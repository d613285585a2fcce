"""Cluster-side actions the resilience tests need, for the local cluster (`e2e/cluster/cluster.py`).

Restarting the kubelet: prefer `Cluster.restart_kubelet()` when the cluster module has it; otherwise stop the
recorded kubelet and start it again with the very argv and environment it ran with (read from /proc), and
update the cluster's pid record so that `cluster.py down` stops the new process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import REPO_ROOT

CLUSTER_STATE = Path("/var/lib/dra-gpu-e2e")


def _cluster_module() -> Any | None:
    path = REPO_ROOT / "e2e" / "cluster"
    if not (path / "cluster.py").exists():
        return None
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    import importlib

    return importlib.import_module("cluster")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def restart_local_kubelet(timeout_s: float = 30) -> float:
    """Restart the local cluster's kubelet; returns when the new process runs. Returns the downtime in s."""
    module = _cluster_module()
    if module is not None and hasattr(module.Cluster, "restart_kubelet"):
        t0 = time.monotonic()
        module.Cluster().restart_kubelet()
        return time.monotonic() - t0
    pids_file = CLUSTER_STATE / "pids.json"
    entries: list[dict[str, Any]] = json.loads(pids_file.read_text())
    entry = next((e for e in entries if e["name"] == "kubelet"), None)
    if entry is None or not _alive(int(entry["pid"])):
        raise RuntimeError(f"no running kubelet recorded in {pids_file}")
    pid = int(entry["pid"])
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    env: dict[str, str] = {}
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if b"=" in item:
            key, value = item.decode(errors="replace").split("=", 1)
            env[key] = value
    if argv[0] != entry["exe"]:
        raise RuntimeError(f"pid {pid} runs {argv[0]}, not the recorded kubelet {entry['exe']}")
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    log = CLUSTER_STATE / "logs" / "kubelet.log"
    with log.open("ab") as out:
        out.write(f"\n===== {time.strftime('%H:%M:%S')} restarted by the e2e suite\n".encode())
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    entry["pid"] = proc.pid
    tmp = pids_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(entries, indent=2) + "\n")
    tmp.replace(pids_file)
    return time.monotonic() - t0


def feature_enabled(kubectl: Kubectl, gate: str) -> bool:
    """Whether the API server runs with `gate` on (its kubernetes_feature_enabled metric); the local cluster
    gives every component the same gates (e2e/cluster/cluster.py NODE_FEATURE_GATES, where the release has
    them)."""
    text = kubectl.run("get", "--raw", "/metrics").stdout
    for line in text.splitlines():
        if line.startswith("kubernetes_feature_enabled{") and f'name="{gate}"' in line:
            return line.rsplit(" ", 1)[1].strip() in ("1", "1.0")
    return False
