"""What a test container saw, from the report it prints (pure).

The examples' containers print
    --- env
    KEY=value ...
    --- devices
    /dev/nvidia0 ...
    --- end
so the suite can check CDI injection from `kubectl logs`, also for containers that have exited.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

REPORT_COMMAND = (
    "echo '--- env'; env | sort; echo '--- devices'; ls -d /dev/nvidia* /dev/nvidia-caps/* 2>/dev/null; "
    "echo '--- end'"
)


@dataclass(frozen=True)
class ContainerReport:
    env: dict[str, str] = field(default_factory=dict)
    devices: tuple[str, ...] = ()
    complete: bool = False  # the `--- end` marker was seen


def parse_report(log: str) -> ContainerReport:
    """The last complete report in `log` (a restarted container prints again); a partial one otherwise."""
    env: dict[str, str] = {}
    devices: list[str] = []
    section: str | None = None
    best: ContainerReport | None = None
    for raw in log.splitlines():
        line = raw.rstrip("\r")
        if line == "--- env":
            section, env, devices = "env", {}, []
        elif line == "--- devices":
            section = "devices"
        elif line == "--- end":
            best = ContainerReport(dict(env), tuple(devices), True)
            section = None
        elif section == "env" and "=" in line:
            key, value = line.split("=", 1)
            env[key] = value
        elif section == "devices" and line.strip():
            devices.extend(line.split())
    if best is not None:
        return best
    return ContainerReport(env, tuple(devices), False)


@dataclass(frozen=True)
class ClientReport:
    """What a CUDA process in a container gets from MPS: the simulated CUDA client's JSON
    (`python -m dra_gpu.hardware.sim_tools.mps_client`), run in the container's view (container_client.py).
    `error` says why there is no answer (no process of the container found, the client failed)."""

    mps: bool = False
    server_pid: int | None = None
    gpus: tuple[str, ...] = ()
    active_thread_percentage: int | None = None
    pinned_limits: dict[str, str | None] = field(default_factory=dict)  # uuid -> "<N>M" or None (no limit)
    error: str | None = None


def parse_client_report(text: str) -> ClientReport:
    """The client's JSON line (the last line that parses as an object), or a report with `error`."""
    for line in reversed(text.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            pct = data.get("activeThreadPercentage")
            return ClientReport(
                mps=bool(data.get("mps")),
                server_pid=data.get("serverPid"),
                gpus=tuple(str(g) for g in data.get("gpus") or ()),
                active_thread_percentage=None if pct is None else int(pct),
                pinned_limits={str(k): v for k, v in (data.get("pinnedDeviceMemoryLimits") or {}).items()},
            )
    return ClientReport(error=f"the client printed no JSON report: {text.strip()[-300:]!r}")
