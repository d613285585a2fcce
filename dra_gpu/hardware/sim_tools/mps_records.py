"""What each simulated MPS control daemon records: one small JSON file per daemon, beside the simulator state.

    <driver root>/var/lib/nvml-sim/mps/<key>.json          a daemon that runs (or was killed while running)
    <driver root>/var/lib/nvml-sim/mps/<key>.stopped.json  the last daemon of that pipe directory that stopped

`<key>` is derived from the daemon's pipe directory. A record holds the daemon's pid, devices, limits and
every command it received, so that tests and `dra-gpu hardware state` can see what the driver asked for.

Why not in state.json: every command a daemon received rewrote the whole simulator state, under its one lock,
and made every reader of the simulated NVML parse it again. In a burst of shares that was most of the
simulator's cost, which stands in for hardware and must not dominate the driver's figures. Each daemon writes
only its own file (temp file and rename, so readers see whole records); nothing else writes it, so no lock is
needed. mps_control.go keeps the same files in the same format.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RECORDS_DIR = "var/lib/nvml-sim/mps"
KEEP_STOPPED = 50  # stopped daemons kept for inspection (the oldest are dropped)
_RUNNING, _STOPPED = ".json", ".stopped.json"


def records_dir(driver_root: str | os.PathLike[str]) -> Path:
    return Path(driver_root) / RECORDS_DIR


def record_key(pipe_dir: str) -> str:
    return hashlib.sha256(pipe_dir.encode()).hexdigest()[:24]


def _write(path: Path, entry: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry, sort_keys=True))
    os.replace(tmp, path)


def write_running(driver_root: str | os.PathLike[str], entry: Mapping[str, Any]) -> None:
    """Record a running daemon (its entry names its `pipe_dir`)."""
    _write(records_dir(driver_root) / (record_key(entry["pipe_dir"]) + _RUNNING), entry)


def write_stopped(driver_root: str | os.PathLike[str], entry: Mapping[str, Any]) -> None:
    """Record that a daemon stopped: its record moves to the stopped name, and the oldest stopped records
    beyond KEEP_STOPPED go."""
    base = records_dir(driver_root)
    key = record_key(entry["pipe_dir"])
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


def read_records(driver_root: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Every recorded daemon by pipe directory; where a pipe directory has a stopped daemon and a newer one,
    the one started last."""
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
        if not isinstance(entry, dict) or not isinstance(entry.get("pipe_dir"), str):
            continue
        seen = records.get(entry["pipe_dir"])
        if seen is None or (entry.get("started") or 0) >= (seen.get("started") or 0):
            records[entry["pipe_dir"]] = entry
    return dict(sorted(records.items()))
