"""The soak's figures: operations, calls, faults injected by kind, kills by cause, the fault points reached,
invariant checks, workload (tenant) checks, refusals and deaths nobody explained, violations."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SoakStats:
    seed: int = 0
    started: float = field(default_factory=time.monotonic)
    ops: Counter[str] = field(default_factory=Counter)  # rule executions by rule name
    calls: Counter[str] = field(default_factory=Counter)  # kubelet calls: prepare, unprepare, ...
    claims: Counter[str] = field(default_factory=Counter)  # claims allocated, by kind
    outcomes: Counter[str] = field(default_factory=Counter)  # prepared, refused, in doubt, ...
    faults: Counter[str] = field(default_factory=Counter)  # faults injected by kind
    refusals: Counter[str] = field(default_factory=Counter)  # why the plugin refused prepares
    explained_by: Counter[str] = field(default_factory=Counter)  # refusals and failed calls, by their cause
    kills: Counter[str] = field(default_factory=Counter)  # plugin deaths by cause (fault-point, random)
    fault_points: Counter[str] = field(default_factory=Counter)  # named fault points the plugin died at
    checks: int = 0  # invariant passes (each reads the whole node)
    workload_checks: int = 0  # simulated CUDA clients run in a claim's container view and judged
    unexplained_refusals: list[str] = field(default_factory=list)
    unexplained_deaths: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    runs: int = 0  # fresh nodes
    nodes: list[str] = field(default_factory=list)  # their names (from the seed: a replay makes the same)

    @property
    def kill_count(self) -> int:
        return sum(self.kills.values())

    def summary(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "runs": self.runs,
            "nodes": list(self.nodes),
            "ops": sum(self.ops.values()),
            "ops_by_rule": dict(sorted(self.ops.items())),
            "kubelet_calls": dict(sorted(self.calls.items())),
            "claims_allocated": dict(sorted(self.claims.items())),
            "outcomes": dict(sorted(self.outcomes.items())),
            "refusals": dict(self.refusals.most_common(12)),
            "explained_by": dict(sorted(self.explained_by.items())),
            "faults": dict(sorted(self.faults.items())),
            "faults_total": sum(self.faults.values()),
            "kills": self.kill_count,
            "kills_by_cause": dict(sorted(self.kills.items())),
            "fault_points_reached": dict(sorted(self.fault_points.items())),
            "invariant_checks": self.checks,
            "workload_checks": self.workload_checks,
            "unexplained_refusals": len(self.unexplained_refusals),
            "unexplained_deaths": len(self.unexplained_deaths),
            "violations": len(self.violations),
            "wall_s": round(time.monotonic() - self.started, 1),
        }

    def report(self) -> str:
        return json.dumps(self.summary(), indent=2)
