"""Test hooks at named steps of the prepare and unprepare flows; unset in production.

- `DRA_GPU_FAULT_KILL_AT=prepare-started` (comma-separated step names): the process kills itself (SIGKILL)
  when it reaches one of them (crash-recovery tests).
- `DRA_GPU_FAULT_MEET_AT=prepare-started:8` (step:count): the calls that reach the step wait there until
  `count` of them have arrived, or `DRA_GPU_FAULT_MEET_TIMEOUT_S` (default 10) have passed, and then go on.
  Either outcome is written to stderr (`... met at ...` / `... gave up waiting at ...`): the concurrency
  tests read it to prove that calls were inside the same step at the same time, or that they could not be.

Steps, in the order the prepare and unprepare flows reach them: `prepare-started`, `prepare-group-<i>-applied`
(sharing done, not yet checkpointed), `prepare-group-<i>`, `prepare-cdi-written`, `prepare-completed`;
`unprepare-group-<i>` (groups undone newest first), `unprepare-cdi-removed`. Inside the sharing manager:
`time-slice-recorded` (holder recorded, interval not yet set).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping

ENV_VAR = "DRA_GPU_FAULT_KILL_AT"
MEET_ENV_VAR = "DRA_GPU_FAULT_MEET_AT"
MEET_TIMEOUT_ENV_VAR = "DRA_GPU_FAULT_MEET_TIMEOUT_S"


class FaultPoints:
    def __init__(
        self,
        armed: frozenset[str] = frozenset(),
        meetings: Mapping[str, int] | None = None,
        meet_timeout_s: float = 10.0,
    ) -> None:
        self.armed = armed
        self._meetings = {step: threading.Barrier(count) for step, count in (meetings or {}).items()}
        self._meet_timeout_s = meet_timeout_s

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> FaultPoints:
        value = environ.get(ENV_VAR, "")
        meetings: dict[str, int] = {}
        for item in environ.get(MEET_ENV_VAR, "").split(","):
            if item.strip():
                step, _, count = item.strip().rpartition(":")
                meetings[step] = int(count)
        return cls(
            frozenset(s.strip() for s in value.split(",") if s.strip()),
            meetings,
            float(environ.get(MEET_TIMEOUT_ENV_VAR, "10")),
        )

    def reached(self, step: str) -> None:
        if step in self.armed:
            _say(f"fault injection: killing process at step {step}")
            os.kill(os.getpid(), signal.SIGKILL)
        meeting = self._meetings.get(step)
        if meeting is not None:
            self._meet(step, meeting)

    def _meet(self, step: str, meeting: threading.Barrier) -> None:
        try:
            if meeting.wait(self._meet_timeout_s) == 0:
                _say(f"fault injection: {meeting.parties} calls met at step {step}")
        except threading.BrokenBarrierError:
            _say(f"fault injection: gave up waiting at step {step} for {meeting.parties} calls")
            meeting.reset()  # the next group of calls gets a fresh meeting


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
