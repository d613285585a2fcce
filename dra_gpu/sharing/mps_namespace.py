"""Where an MPS daemon's pipe directory is, for the daemon, for the plugin's control sessions and for clients.

`nvidia-cuda-mps-control -d` fails (exit status 1) when its pipe directory path is 88 characters or longer
(seen on an H200, driver 580.159.04, 2026-11-27: 86 works): its control sockets must fit a unix socket path
(108 bytes). The kubelet's plugins directory alone is 39 characters, so a pipe directory under it does not fit
at the kubelet's default paths, let alone under a longer one. NVIDIA's driver mounts the host directory at a
short fixed path (/tmp/nvidia-mps) inside the daemon's own namespace; so does this driver:
- the daemon (process mode) runs in a private mount namespace where its host pipe and log directories are
  bound at /tmp/nvidia-mps and /var/log/nvidia-mps (pod mode: the daemon pod mounts them there);
- each control session of the plugin (`echo CMD | nvidia-cuda-mps-control`) does the same, since the control
  client builds the same socket paths;
- a container mounts the daemon's `clients` directory and finds the pipe at /tmp/nvidia-mps/pipe.
The host path can then be as long as a path may be.

Staging (why `clients/pipe` and not the directory the daemon starts in): a daemon that starts serves at once,
before its pinned-memory limit is set by command (a real control daemon ignores that limit in its own
environment), and a client that connects then spawns an MPS server without it (seen on the H200: set_default_*
sent afterwards does not reach that running server). So a daemon starts in `stage/`, which no container
mounts; once it answers and holds its limits, `stage/` is swapped into `clients/pipe` with one atomic rename
(RENAME_EXCHANGE: the name holds the old directory or the new one, never nothing). The daemon keeps serving
the same directory, since its namespace bound the directory itself, not the name; containers mounted
`clients/`, so they see the new `pipe` at their next connect.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from dra_gpu.checkpoint.atomic_file import rename_exchange
from dra_gpu.sharing.interface import SharingError

DAEMON_PIPE_DIR = "/tmp/nvidia-mps"  # where the daemon and the plugin's control sessions see the pipe
DAEMON_LOG_DIR = "/var/log/nvidia-mps"
CONTAINER_MPS_DIR = "/tmp/nvidia-mps"  # where a container mounts the daemon's `clients` directory
CONTAINER_PIPE_DIR = f"{CONTAINER_MPS_DIR}/pipe"  # CUDA_MPS_PIPE_DIRECTORY of a container
# A bind mount's source may be as long as a path may be (PATH_MAX, 4096 with the trailing NUL).
MAX_HOST_PATH = 4095

# `unshare -m` gives a private copy of the mount table (util-linux makes it private by default, so nothing
# leaks back to the host); the binds cover only the two fixed paths, so the driver root and everything else
# stay where they are. `exec` keeps the control binary's own pid (the daemon's identity) and exit status.
_BIND_AND_EXEC = 'mount --bind "$1" "$3" && mount --bind "$2" "$4" && shift 4 && exec "$@"'


def unshare_binary() -> str:
    found = shutil.which("unshare")
    if found is None:
        raise SharingError(
            "cannot run the MPS control tool: `unshare` (util-linux) is not on PATH; the MPS pipe directory "
            f"is mounted at {DAEMON_PIPE_DIR} in a private mount namespace, as NVIDIA's driver does"
        )
    return found


def in_daemon_view(pipe_dir: str, log_dir: str, argv: Sequence[str]) -> list[str]:
    """`argv` run where `pipe_dir` and `log_dir` (host paths) are DAEMON_PIPE_DIR and DAEMON_LOG_DIR."""
    for path in (pipe_dir, log_dir):
        if len(path) > MAX_HOST_PATH:
            raise SharingError(f"MPS directory {path[:80]}... is longer than {MAX_HOST_PATH} characters")
    for target in (DAEMON_PIPE_DIR, DAEMON_LOG_DIR):
        os.makedirs(target, exist_ok=True)  # the mount points (empty; covered only inside the namespace)
    return [
        unshare_binary(),
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        _BIND_AND_EXEC,
        "sh",
        pipe_dir,
        log_dir,
        DAEMON_PIPE_DIR,
        DAEMON_LOG_DIR,
        *argv,
    ]


def place(stage: Path, live: Path) -> None:
    """Put the directory `stage` (a daemon that holds its limits) at `live`, where clients look, in one step.
    The old `live` (a dead daemon's) ends at `stage` and is removed; an empty `stage` is made again (a daemon
    pod's hostPath names it: a restarted container starts its daemon there)."""
    if live.exists():
        code = rename_exchange(stage, live)
        if code:
            raise SharingError(f"swapping {stage} into {live}: {os.strerror(code)}")
        shutil.rmtree(stage, ignore_errors=True)
    else:
        os.rename(stage, live)
    with contextlib.suppress(FileExistsError):
        stage.mkdir()
