#!/usr/bin/env python3
"""runc, minus the capabilities this machine cannot grant: the OCI runtime of e2e/kind's private dockerd.

`docker run --privileged` (every kind node) asks for every capability the kernel knows. A sandboxed machine
may hold fewer: this team's machines lack CAP_SYS_RESOURCE in their bounding set, and runc then refuses to
start the container ("unable to apply caps: operation not permitted"). containerd's CRI, which the local
cluster uses, asks only for the capabilities its caller holds, so there the problem never shows.

Called by containerd's shim exactly as runc is. Before `create`/`run` it removes from the bundle's config.json
the capabilities outside this process's bounding set, and lowers rlimits above its own hard limits (raising
them needs CAP_SYS_RESOURCE too); then it execs the real runc ($DRA_GPU_REAL_RUNC, else runc on PATH).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
from pathlib import Path
from typing import Any

# Capability numbers, as in linux/capability.h.
CAPABILITIES = (
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
)
RLIMITS = {
    "RLIMIT_NOFILE": resource.RLIMIT_NOFILE,
    "RLIMIT_NPROC": resource.RLIMIT_NPROC,
    "RLIMIT_MEMLOCK": resource.RLIMIT_MEMLOCK,
    "RLIMIT_CORE": resource.RLIMIT_CORE,
    "RLIMIT_STACK": resource.RLIMIT_STACK,
}


def bounding_set(status: str) -> set[str]:
    """Names (CAP_*) of the capabilities in a /proc/<pid>/status text's CapBnd mask."""
    for line in status.splitlines():
        if line.startswith("CapBnd:"):
            mask = int(line.split()[1], 16)
            return {f"CAP_{name}" for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1}
    raise ValueError("no CapBnd line")


def bound_process(process: dict[str, Any], allowed: set[str], hard: dict[str, int]) -> bool:
    """Drop capabilities outside allowed and clamp rlimits to hard in an OCI process; True if it changed."""
    changed = False
    caps = process.get("capabilities")
    if isinstance(caps, dict):
        for kind, names in caps.items():
            kept = [n for n in names if n in allowed]
            if kept != names:
                caps[kind] = kept
                changed = True
    for limit in process.get("rlimits") or []:
        ceiling = hard.get(limit.get("type", ""))
        if ceiling is None or ceiling == resource.RLIM_INFINITY:
            continue
        for key in ("hard", "soft"):
            if limit.get(key, 0) > ceiling:
                limit[key] = ceiling
                changed = True
    return changed


def _option(argv: list[str], long: str, short: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg in (long, short) and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(long + "="):
            return arg.split("=", 1)[1]
    return None


def spec_file(argv: list[str]) -> tuple[Path, bool] | None:
    """The JSON file this runc call takes its process from, and whether it is a whole bundle config.

    `create`/`run` read <bundle>/config.json; `exec` (docker exec) reads the process alone from --process."""
    if "exec" in argv:
        process = _option(argv, "--process", "-p")
        return (Path(process), False) if process else None
    if {"create", "run"} & set(argv):
        bundle = _option(argv, "--bundle", "-b")
        return (Path(bundle or ".") / "config.json", True)
    return None


def main() -> None:
    argv = sys.argv[1:]
    target = spec_file(argv)
    if target is not None and target[0].exists():
        path, whole = target
        spec = json.loads(path.read_text())
        process = spec.get("process") if whole else spec
        allowed = bounding_set(Path("/proc/self/status").read_text())
        hard = {name: resource.getrlimit(num)[1] for name, num in RLIMITS.items()}
        if isinstance(process, dict) and bound_process(process, allowed, hard):
            path.write_text(json.dumps(spec))
    real = os.environ.get("DRA_GPU_REAL_RUNC") or shutil.which("runc") or "runc"
    os.execv(real, [real, *argv])


if __name__ == "__main__":
    main()
