"""Host processes that outlive the command that started them (demo, run-e2e.sh), tracked in a state file.

Each managed process is recorded as `{pid, argv, log, started_at}` under a name in a JSON file, so a later
command (pytest, `demo.sh down`, a resilience test) can stop or restart exactly that process by its pid, after
checking the pid still runs the recorded program (pids get reused).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

# Popen objects of the processes this Python process started, so that a killed child is reaped, not a zombie.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class ManagedProcess:
    name: str
    pid: int
    argv: list[str]
    log: str
    started_at: float
    env: dict[str, str]


class ProcessTable:
    def __init__(self, state_file: Path) -> None:
        self.state_file = state_file

    def _load(self) -> dict[str, ManagedProcess]:
        if not self.state_file.exists():
            return {}
        raw = json.loads(self.state_file.read_text())
        return {name: ManagedProcess(**entry) for name, entry in raw.items()}

    def _save(self, table: Mapping[str, ManagedProcess]) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({n: asdict(p) for n, p in table.items()}, indent=2) + "\n")
        tmp.replace(self.state_file)

    def get(self, name: str) -> ManagedProcess | None:
        return self._load().get(name)

    def names(self) -> list[str]:
        return sorted(self._load())

    def start(
        self, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        """Start `argv` in its own session (the caller's Ctrl-C does not reach it), output to `log`."""
        existing = self.get(name)
        if existing and is_running(existing):
            raise RuntimeError(f"{name} already runs as pid {existing.pid}; stop it first")
        log.parent.mkdir(parents=True, exist_ok=True)
        extra = dict(env or {})
        with log.open("ab") as out:
            out.write(f"\n===== {time.strftime('%H:%M:%S')} start: {' '.join(argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **extra},
            )
        _CHILDREN[proc.pid] = proc
        entry = ManagedProcess(name, proc.pid, list(argv), str(log), time.time(), extra)
        # Popen returns once the child has exec'd, but the kernel sets the new program's argv (what
        # /proc/<pid>/cmdline shows, and is_running compares) a moment later: wait for it, so that a caller's
        # is_running right after start cannot see an empty command line on a busy machine.
        deadline = time.monotonic() + 5
        while not is_running(entry) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        table = self._load()
        table[name] = entry
        self._save(table)
        return entry

    def restart(self, name: str) -> ManagedProcess:
        """Start again with the recorded argv and env (after a stop or a kill)."""
        entry = self.get(name)
        if entry is None:
            raise RuntimeError(f"no recorded process {name!r} in {self.state_file}")
        return self.start(name, entry.argv, Path(entry.log), entry.env)

    def stop(self, name: str, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 15) -> bool:
        """Signal the recorded process (SIGKILL after `timeout_s`); True when one was running."""
        entry = self.get(name)
        if entry is None or not is_running(entry):
            return False
        os.kill(entry.pid, sig)
        deadline = time.monotonic() + timeout_s
        while is_running(entry):
            if time.monotonic() > deadline:
                os.kill(entry.pid, signal.SIGKILL)
                deadline = time.monotonic() + 5
            time.sleep(0.1)
        return True

    def forget(self, name: str) -> None:
        table = self._load()
        table.pop(name, None)
        self._save(table)

    def log_tail(self, name: str, lines: int = 40) -> str:
        entry = self.get(name)
        if entry is None or not Path(entry.log).exists():
            return f"(no log for {name})"
        text = Path(entry.log).read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def is_running(entry: ManagedProcess) -> bool:
    """The pid is alive, not a zombie, and still runs the recorded program."""
    child = _CHILDREN.get(entry.pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(entry.pid, None)
        return False
    try:
        stat = Path(f"/proc/{entry.pid}/stat").read_text()
        cmdline = Path(f"/proc/{entry.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    recorded = [a.encode() for a in entry.argv]
    return cmdline[: len(recorded)] == recorded
