"""The numbers that pace a soak run, shared by the steps (tests/soak/*_steps.py), the checks after them
(tests/soak/run.py) and the driver that decides which steps apply (tests/soak/driver.py)."""

from __future__ import annotations

MAX_CLAIMS = 20  # allocated at once (the node's eight GPUs fill up well before)
SETTLE_S = 6.0  # how long a broken invariant may take to heal (a killed daemon restarted, a mode restored)
FAULT_GAP = 3  # steps between two plugin kills, so that most steps run against a plugin that lives
