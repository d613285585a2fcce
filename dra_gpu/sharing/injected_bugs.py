"""Test-only: bugs that were fixed, put back on request, so that the soak's checks and its shrinking can be
shown to find a real one end to end (tests/soak/test_shrink.py). `DRA_GPU_INJECT_BUG=<name>[,<name>...]` in
the plugin's environment; unset (nothing injected) everywhere but in those tests.

- `caps-never-shrink`: a GPU's shares server keeps the caps of the largest share it ever served, also after
  that share left, so a tenant that drops its env limits gets more than the largest share on its GPU.
"""

from __future__ import annotations

import os

ENV_VAR = "DRA_GPU_INJECT_BUG"
KNOWN = frozenset({"caps-never-shrink"})


def injected(name: str) -> bool:
    """Whether the bug `name` is put back in this process (read at each call: tests set it per process)."""
    if name not in KNOWN:
        raise ValueError(f"unknown injected bug {name!r}; known: {', '.join(sorted(KNOWN))}")
    return name in {part.strip() for part in os.environ.get(ENV_VAR, "").split(",")}
