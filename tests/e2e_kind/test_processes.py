from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from e2e.lib.processes import ProcessTable, is_running


def test_start_stop_restart_a_real_process(tmp_path: Path) -> None:
    table = ProcessTable(tmp_path / "state.json")
    argv = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    entry = table.start("sleeper", argv, tmp_path / "sleeper.log")
    try:
        assert is_running(entry)
        deadline = time.monotonic() + 10
        while "up" not in table.log_tail("sleeper") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "up" in table.log_tail("sleeper")
        # a second table (another command) sees and controls the same process
        other = ProcessTable(tmp_path / "state.json")
        assert other.stop("sleeper", sig=signal.SIGKILL)
        assert not is_running(entry)
        again = other.restart("sleeper")
        assert again.pid != entry.pid and is_running(again)
        assert table.stop("sleeper")
        assert not table.stop("sleeper")  # already stopped
    finally:
        table.stop("sleeper", sig=signal.SIGKILL)


def test_a_reused_pid_running_something_else_is_not_ours(tmp_path: Path) -> None:
    table = ProcessTable(tmp_path / "state.json")
    entry = table.start("x", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "x.log")
    try:
        from dataclasses import replace

        impostor = replace(entry, argv=["/bin/something-else"])
        assert not is_running(impostor)
    finally:
        table.stop("x", sig=signal.SIGKILL)
