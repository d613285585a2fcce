"""Crash points for fault tests: the process kills itself (SIGKILL) when it reaches a named step.

`DRA_GPU_FAULT_KILL_AT=prepare-started` (comma-separated step names) arms it; unset in production. Steps, in
the order the prepare and unprepare flows reach them: `prepare-started`, `prepare-group-<i>-applied`
(sharing done, not yet checkpointed), `prepare-group-<i>`, `prepare-cdi-written`, `prepare-completed`;
`unprepare-group-<i>` (groups undone newest first), `unprepare-cdi-removed`. Inside the sharing manager:
`time-slice-recorded` (holder recorded, interval not yet set).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping

ENV_VAR = "DRA_GPU_FAULT_KILL_AT"


class FaultPoints:
    def __init__(self, armed: frozenset[str] = frozenset()) -> None:
        self.armed = armed

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> FaultPoints:
        value = environ.get(ENV_VAR, "")
        return cls(frozenset(s.strip() for s in value.split(",") if s.strip()))

    def reached(self, step: str) -> None:
        if step in self.armed:
            sys.stderr.write(f"fault injection: killing process at step {step}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
