"""Files on a GPU node, wherever the node is: this machine (the local cluster) or a kind node's container.

The chart tests look at what the plugin left on its node (registration sockets, the CDI specs, NVIDIA's hook
copied next to its sockets). On the local cluster the node is this machine; on kind each node is a container,
and `docker exec <node>` reads its files (kind's own tooling does the same).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NodeFiles:
    """Reads files on `node`: in its kind container when `kind` is set, else on this machine."""

    node: str
    kind: bool

    def _sh(self, script: str) -> subprocess.CompletedProcess[str]:
        argv = ["docker", "exec", self.node, "sh", "-c", script]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    def glob(self, directory: Path, pattern: str) -> list[str]:
        """Sorted paths in `directory` matching the shell `pattern` (no match: empty)."""
        if not self.kind:
            return sorted(str(p) for p in directory.glob(pattern))
        target = f"{shlex.quote(str(directory))}/{pattern}"
        done = self._sh(f'for f in {target}; do [ -e "$f" ] && echo "$f"; done; true')
        if done.returncode != 0:
            raise RuntimeError(f"listing {target} on node {self.node} failed: {done.stderr.strip()}")
        return sorted(line for line in done.stdout.splitlines() if line)

    def read_text(self, path: Path) -> str:
        if not self.kind:
            return path.read_text()
        done = self._sh(f"cat {shlex.quote(str(path))}")
        if done.returncode != 0:
            raise FileNotFoundError(f"{path} on node {self.node}: {done.stderr.strip()}")
        return done.stdout

    def is_executable_file(self, path: Path) -> bool:
        if not self.kind:
            return path.is_file() and os.access(path, os.X_OK)
        return self._sh(f"test -f {shlex.quote(str(path))} -a -x {shlex.quote(str(path))}").returncode == 0
