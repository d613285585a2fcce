"""A thin `kubectl` wrapper: what the suite does the way a user would (apply, exec, logs, describe).

The pinned kubectl built by `e2e/cluster/build.sh` is preferred over whatever is on PATH, so that client and
server versions match (server-side apply of `resource.k8s.io/v1` objects needs a recent client).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.lib.settings import cluster_bin_dir


class KubectlError(RuntimeError):
    """kubectl exited non-zero; carries the command and its stderr so the failure explains itself."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(f"`{' '.join(argv)}` exited {returncode}: {stderr.strip() or stdout.strip()}")


def find_kubectl() -> str:
    pinned = cluster_bin_dir() / "kubectl"
    if pinned.exists():
        return str(pinned)
    found = shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError(
            f"no kubectl: build it with `e2e/cluster/build.sh all` (expected at {pinned}) or put one on PATH"
        )
    return found


@dataclass(frozen=True)
class Kubectl:
    kubeconfig: Path
    binary: str = ""

    def _argv(self, args: Sequence[str]) -> list[str]:
        return [self.binary or find_kubectl(), f"--kubeconfig={self.kubeconfig}", *args]

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        argv = self._argv(args)
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise KubectlError(argv, proc.returncode, proc.stdout, proc.stderr)
        return proc

    def apply(self, manifest: str, namespace: str | None = None, server_side: bool = False) -> str:
        args = ["apply", "-f", "-"]
        if namespace:
            args += ["-n", namespace]
        if server_side:
            args += ["--server-side", "--force-conflicts"]
        return self.run(*args, stdin=manifest).stdout

    def try_apply(self, manifest: str, namespace: str | None = None) -> subprocess.CompletedProcess[str]:
        """Apply and hand back the result, failure included (tests of admission rejections read stderr)."""
        args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
        return self.run(*args, stdin=manifest, check=False)

    def delete_manifest(self, manifest: str, namespace: str | None = None, wait: bool = True) -> None:
        args = ["delete", "-f", "-", "--ignore-not-found", f"--wait={'true' if wait else 'false'}"]
        if namespace:
            args += ["-n", namespace]
        self.run(*args, stdin=manifest, timeout=300)

    def get_json(self, kind: str, name: str | None = None, namespace: str | None = None) -> dict[str, Any]:
        args = ["get", kind] + ([name] if name else []) + (["-n", namespace] if namespace else [])
        data: dict[str, Any] = json.loads(self.run(*args, "-o", "json").stdout)
        return data

    def items(
        self,
        kind: str,
        namespace: str | None = None,
        selector: str | None = None,
        all_namespaces: bool = False,
    ) -> list[dict[str, Any]]:
        args = ["get", kind, "-o", "json"]
        args += ["-n", namespace] if namespace else []
        args += ["--all-namespaces"] if all_namespaces else []
        args += ["-l", selector] if selector else []
        items: list[dict[str, Any]] = json.loads(self.run(*args).stdout).get("items", [])
        return items

    def exec(self, namespace: str, pod: str, command: Sequence[str], container: str | None = None) -> str:
        args = ["exec", "-n", namespace, pod]
        args += ["-c", container] if container else []
        return self.run(*args, "--", *command, timeout=60).stdout

    def logs(self, namespace: str, pod: str, container: str | None = None, tail: int | None = None) -> str:
        args = ["logs", "-n", namespace, pod]
        args += ["-c", container] if container else []
        args += [f"--tail={tail}"] if tail is not None else []
        return self.run(*args, check=False).stdout

    def describe(self, kind: str, name: str, namespace: str | None = None) -> str:
        args = ["describe", kind, name] + (["-n", namespace] if namespace else [])
        proc = self.run(*args, check=False)
        return proc.stdout or proc.stderr

    def events(self, namespace: str, involved: str | None = None) -> list[dict[str, Any]]:
        args = ["get", "events", "-n", namespace, "-o", "json"]
        if involved:
            args += ["--field-selector", f"involvedObject.name={involved}"]
        items: list[dict[str, Any]] = json.loads(self.run(*args).stdout).get("items", [])
        return items

    def create_namespace(self, name: str) -> None:
        self.run("create", "namespace", name)

    def delete_namespace(self, name: str, wait: bool = True, timeout_s: int = 180) -> None:
        self.run(
            "delete",
            "namespace",
            name,
            "--ignore-not-found",
            f"--wait={'true' if wait else 'false'}",
            f"--timeout={timeout_s}s",
            timeout=timeout_s + 30,
        )
