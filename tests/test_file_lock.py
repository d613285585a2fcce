"""The one flock helper: exclusion across processes, shared readers, timeouts, release on close."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from dra_gpu.file_lock import FileLockTimeoutError, file_locked, lock_fd, open_lock_file, unlock_and_close

_HOLD = """
import sys, time
from pathlib import Path
from dra_gpu.file_lock import file_locked
with file_locked(Path(sys.argv[1]), exclusive=sys.argv[2] == "x"):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _holder(path: Path, exclusive: bool, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path), "x" if exclusive else "s", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_exclusive_lock_held_by_another_process_times_out(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "x.lock"  # the directory is created on demand
    proc = _holder(path, exclusive=True, seconds=5)
    try:
        started = time.monotonic()
        with pytest.raises(FileLockTimeoutError, match=r"more than 0\.2s"), file_locked(path, timeout_s=0.2):
            pass
        assert time.monotonic() - started >= 0.2
    finally:
        proc.kill()
        proc.wait()
    with file_locked(path, timeout_s=1):  # the holder died: the kernel released its lock
        pass


def test_shared_locks_coexist_but_exclude_writers(tmp_path: Path) -> None:
    path = tmp_path / "s.lock"
    proc = _holder(path, exclusive=False, seconds=5)
    try:
        with file_locked(path, exclusive=False, timeout_s=0.5):
            pass
        with pytest.raises(FileLockTimeoutError), file_locked(path, exclusive=True, timeout_s=0.1):
            pass
    finally:
        proc.kill()
        proc.wait()


def test_waiting_lock_is_granted_when_released(tmp_path: Path) -> None:
    path = tmp_path / "w.lock"
    proc = _holder(path, exclusive=True, seconds=0.3)
    try:
        fd = open_lock_file(path)
        lock_fd(fd, timeout_s=10)
        unlock_and_close(fd)
    finally:
        proc.wait()


def test_read_only_fallback_opens_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "ro" / "r.lock"
    path.parent.mkdir()
    path.touch()
    path.parent.chmod(0o500)
    path.chmod(0o400)
    try:
        if _writable(path):
            pytest.skip("running as root: permissions do not stop writes")
        with pytest.raises(OSError):
            open_lock_file(path)
        fd = open_lock_file(path, allow_read_only=True)
        lock_fd(fd, timeout_s=1)
        unlock_and_close(fd)
    finally:
        path.parent.chmod(0o700)


def _writable(path: Path) -> bool:
    try:
        with path.open("a"):
            return True
    except OSError:
        return False
