"""The soak's figures: operations, calls, faults injected by kind, invariant checks, violations."""

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
    checks: int = 0  # invariant passes (each reads the whole node)
    violations: list[str] = field(default_factory=list)
    runs: int = 0  # fresh nodes (hypothesis examples)

    @property
    def kills(self) -> int:
        return sum(n for kind, n in self.faults.items() if kind.startswith("kill"))

    def summary(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "runs": self.runs,
            "ops": sum(self.ops.values()),
            "ops_by_rule": dict(sorted(self.ops.items())),
            "kubelet_calls": dict(sorted(self.calls.items())),
            "claims_allocated": dict(sorted(self.claims.items())),
            "outcomes": dict(sorted(self.outcomes.items())),
            "refusals": dict(self.refusals.most_common(12)),
            "faults": dict(sorted(self.faults.items())),
            "faults_total": sum(self.faults.values()),
            "kills": self.kills,
            "invariant_checks": self.checks,
            "violations": len(self.violations),
            "wall_s": round(time.monotonic() - self.started, 1),
        }

    def report(self) -> str:
        return json.dumps(self.summary(), indent=2)
