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
