"""The compiled simulated tools: Go twins of Python tools, built once per source version and cached.

A simulated `nvidia-cuda-mps-control` in Python costs an interpreter start per run (50-150 ms, two or three
runs per MPS daemon), where the real tool takes milliseconds; the simulator, standing in for hardware, must
not be what the driver's figures measure. So `mps_control.go` (the same tool, mps_control.py is the reference)
is built with `go build` when Go is installed, into `$DRA_GPU_CACHE/sim-tools/<source digest>/` (default
~/.cache/dra-gpu), and the simulated driver root's shim runs it. Without Go, or where the build fails, the
shim runs the Python tool, which does the same.

`DRA_GPU_SIM_TOOLS`: `auto` (default, as above), `python` (always the Python tools), `compiled` (the compiled
ones or an error: for the tests that check the two agree).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import structlog

from dra_gpu.file_lock import file_locked

log = structlog.get_logger(__name__)

ENV = "DRA_GPU_SIM_TOOLS"
SOURCES = {"nvidia-cuda-mps-control": "mps_control.go"}
_built: dict[tuple[str, str], Path | None] = {}  # (tool, choice) -> binary, per process


class CompiledToolError(RuntimeError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("DRA_GPU_CACHE") or Path.home() / ".cache" / "dra-gpu") / "sim-tools"


def compiled_tool(tool: str) -> Path | None:
    """The compiled `tool` (built now if needed), or None: the shim then runs the Python tool."""
    choice = os.environ.get(ENV, "auto")
    if choice not in ("auto", "python", "compiled"):
        raise CompiledToolError(f"{ENV}={choice!r}: expected auto, python or compiled")
    if choice == "python" or tool not in SOURCES:
        return None
    key = (tool, choice)
    if key not in _built:
        _built[key] = _build(tool, required=choice == "compiled")
    return _built[key]


def _build(tool: str, *, required: bool) -> Path | None:
    source = Path(__file__).with_name(SOURCES[tool])
    if not source.is_file():  # an installed package without its Go sources (the image): the Python tool
        if required:
            raise CompiledToolError(f"{ENV}=compiled, but {source} is not installed")
        return None
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    binary = cache_root() / digest / tool
    if os.access(binary, os.X_OK):
        return binary
    go = shutil.which("go")
    if go is None:
        if required:
            raise CompiledToolError(f"{ENV}=compiled, but no `go` on PATH to build {source.name}")
        return None
    binary.parent.mkdir(parents=True, exist_ok=True)
    with file_locked(binary.parent / ".build.lock"):  # parallel test workers build it once
        if os.access(binary, os.X_OK):
            return binary
        tmp = binary.with_name(f".{tool}.{os.getpid()}.tmp")
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "", "GOTOOLCHAIN": "local"}
        done = subprocess.run(
            [go, "build", "-trimpath", "-o", str(tmp), str(source)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=600,
        )
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            message = f"go build {source.name} failed: {(done.stderr or done.stdout).strip()}"
            if required:
                raise CompiledToolError(message)
            log.warning("simulated tool runs in Python: " + message, tool=tool)
            return None
        os.replace(tmp, binary)
    return binary
