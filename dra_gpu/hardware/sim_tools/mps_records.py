"""What each simulated MPS control daemon records: one small JSON file per daemon, beside the simulator state.

    <driver root>/var/lib/nvml-sim/mps/<key>.json          a daemon that runs (or was killed while running)
    <driver root>/var/lib/nvml-sim/mps/<key>.stopped.json  the last daemon of that pipe directory that stopped
    <driver root>/var/lib/nvml-sim/mps/<key>.lock          held (flock) by the running daemon for its lifetime

`<key>` is the identity of the daemon's pipe directory, `<st_dev>-<st_ino>` in hex, not its path: the
driver starts each daemon in a mount namespace of its own with its host pipe directory bind-mounted at
/tmp/nvidia-mps (as NVIDIA's driver does in its daemon pods), so many daemons see the same path, while the
directory's device and inode are the same on both sides of the bind mount and survive a rename of the host
path. The record keeps
the path the daemon saw (`pipe_dir`) for display; `record_for_pipe_dir(driver_root, host_path)` finds a record
by a path in the caller's own namespace.

A record holds the daemon's pid, devices, defaults, every control command it received, and its MPS servers
(`servers`: pid, uid, devices, limits and clients of each; `stopped_servers`: the last ones that ended), so
tests and `dra-gpu hardware state` see what each server holds.

Why not in state.json: every command a daemon received rewrote the whole simulator state, under its one lock,
and made every reader of the simulated NVML parse it again. In a burst of shares that was most of the
simulator's cost, which stands in for hardware and must not dominate the driver's figures. Each daemon writes
only its own file (temp file and rename, so readers see whole records); nothing else writes it, so no lock is
needed for the record itself.

This module stays free of the simulator's imports: the control client (every `echo CMD |
nvidia-cuda-mps-control`) loads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RECORDS_DIR = "var/lib/nvml-sim/mps"
KEEP_STOPPED = 50  # stopped daemons kept for inspection (the oldest are dropped)
_RUNNING, _STOPPED, _LOCK = ".json", ".stopped.json", ".lock"
_SERVER_PIDS = ".server-pids"  # the last synthetic MPS server pid handed out on this driver root
# Synthetic MPS server pids start above PID_MAX_LIMIT (2^22, the most a 64-bit Linux kernel allows for
# /proc/sys/kernel/pid_max), so no real process ever has one: nothing mistakes a server for a live process,
# and a kill() of one fails with ESRCH instead of hitting a bystander.
SERVER_PID_BASE = 1 << 22


def records_dir(driver_root: str | os.PathLike[str]) -> Path:
    return Path(driver_root) / RECORDS_DIR


def pipe_dir_key(pipe_dir: str | os.PathLike[str]) -> str:
    """The record key of a pipe directory as seen from this process's mount namespace (OSError if absent)."""
    st = os.stat(pipe_dir)
    return f"{st.st_dev:x}-{st.st_ino:x}"


def _write(path: Path, entry: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry, sort_keys=True))
    os.replace(tmp, path)


def write_running(driver_root: str | os.PathLike[str], entry: Mapping[str, Any]) -> None:
    """Record a running daemon (its entry names its `key`)."""
    _write(records_dir(driver_root) / (entry["key"] + _RUNNING), entry)


def write_stopped(driver_root: str | os.PathLike[str], entry: Mapping[str, Any]) -> None:
    """Record that a daemon stopped: its record moves to the stopped name, and the oldest stopped records
    beyond KEEP_STOPPED go."""
    base = records_dir(driver_root)
    key = entry["key"]
    _write(base / (key + _STOPPED), entry)
    with contextlib.suppress(FileNotFoundError):
        (base / (key + _RUNNING)).unlink()
    stopped = []
    for item in os.scandir(base):
        if item.name.endswith(_STOPPED):
            with contextlib.suppress(FileNotFoundError):
                stopped.append((item.stat().st_mtime_ns, item.path))
    for _mtime, path in sorted(stopped)[:-KEEP_STOPPED]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def hold_alive_lock(driver_root: str | os.PathLike[str], key: str) -> int:
    """Take (and keep: the caller leaves the descriptor open) the lock that says the daemon of `key` lives.
    A lock rather than a pid: the daemon and whoever asks may be in different pid namespaces (pods), and a
    lock dies with its holder however it ends (SIGKILL included), with nothing to reuse."""
    path = records_dir(driver_root) / (key + _LOCK)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def daemon_alive(driver_root: str | os.PathLike[str], key: str) -> bool:
    """Whether a daemon holds the lock of `key` (see hold_alive_lock)."""
    try:
        fd = os.open(records_dir(driver_root) / (key + _LOCK), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def next_server_pid(driver_root: str | os.PathLike[str]) -> int:
    """A synthetic MPS server pid, unique on this driver root (every daemon draws from one counter)."""
    path = records_dir(driver_root) / _SERVER_PIDS
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.pread(fd, 32, 0).decode().strip()
        pid = max(int(text) if text.isdigit() else 0, SERVER_PID_BASE) + 1
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{pid}\n".encode(), 0)
        return pid
    finally:
        os.close(fd)


def read_records(driver_root: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Every recorded daemon by key (its pipe directory's identity); where a pipe directory has a stopped
    daemon and a newer one, the one started last."""
    records: dict[str, dict[str, Any]] = {}
    try:
        items = sorted(os.scandir(records_dir(driver_root)), key=lambda item: item.name)
    except FileNotFoundError:
        return records
    for item in items:
        if item.name.startswith(".") or not item.name.endswith(_RUNNING):
            continue
        try:
            entry = json.loads(Path(item.path).read_text())
        except (FileNotFoundError, ValueError):
            continue  # stopped (renamed away) while this read; a temp file is never read
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
            continue
        seen = records.get(entry["key"])
        if seen is None or (entry.get("started") or 0) >= (seen.get("started") or 0):
            records[entry["key"]] = entry
    return dict(sorted(records.items()))


def record_for_pipe_dir(
    driver_root: str | os.PathLike[str], pipe_dir: str | os.PathLike[str]
) -> dict[str, Any] | None:
    """The record of the daemon (the newest one) whose pipe directory is `pipe_dir` in this process's mount
    namespace (a host path, for tests and the driver); None when that directory or its record is missing."""
    try:
        key = pipe_dir_key(pipe_dir)
    except OSError:
        return None
    return read_records(driver_root).get(key)


def live_servers(driver_root: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """The MPS servers of the daemons that still run, by server pid."""
    found: dict[int, dict[str, Any]] = {}
    for key, record in read_records(driver_root).items():
        if record.get("running") and daemon_alive(driver_root, key):
            for server in record.get("servers") or ():
                found[int(server["pid"])] = server
    return found


def dead_daemons(driver_root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Records that still say `running` whose daemon is gone (killed: it could not close its record)."""
    return [
        record
        for key, record in read_records(driver_root).items()
        if record.get("running") and not daemon_alive(driver_root, key)
    ]
