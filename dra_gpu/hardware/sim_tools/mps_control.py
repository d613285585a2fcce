"""A fake `nvidia-cuda-mps-control` for simulated driver roots (`DRA_GPU_SIM_ROOT`).

    nvidia-cuda-mps-control -d [-M]     start a control daemon in the background and return (like the real -d;
                                        -M: multi-user mode, recorded)
    nvidia-cuda-mps-control -f [-M]     run the control daemon in the foreground (as in a daemon's own pod)
    echo CMD | nvidia-cuda-mps-control  send each stdin line to the daemon and print its answers

The daemon is a real, detached process (double fork + setsid, so it outlives whoever started it). It serves a
Unix socket `control` in `CUDA_MPS_PIPE_DIRECTORY` (default /tmp/nvidia-mps), writes `control.log` in
`CUDA_MPS_LOG_DIRECTORY` (default /var/log/nvidia-mps) and its pid to `nvidia-cuda-mps-control.pid` in the
pipe directory. Every command it receives, and the limits it holds, are recorded in the daemon's own record
file beside the simulator state (mps_records.py), so tests and `dra-gpu hardware state` can see what the
driver asked for.

Commands (a subset of the real tool's): `get_server_list`, `set_default_active_thread_percentage N`,
`get_default_active_thread_percentage`, `set_default_device_pinned_mem_limit DEV VALUE`,
`get_default_device_pinned_mem_limit DEV`, `quit`. DEV is a UUID or an index into `CUDA_VISIBLE_DEVICES`;
VALUE is `<N>M` or `<N>G`. Invalid commands get an error answer and the client exits 1, as the driver expects.

A thread percentage in the daemon's own environment (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) is its default from
the moment it starts (MPS docs 4.2.5, "MPS control daemon level"); `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` there is
ignored, as a real daemon ignores it (H100, driver 580.159.04). Answers are printed as the real tool prints
them: `30.0` for a thread percentage, `2G` (or `1500M`) for a pinned limit, nothing for an unset one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dra_gpu.hardware.sim_tools import mps_records

# Imported where used: the simulator package loads the whole simulated NVML (~150 ms), which the client mode
# (every `echo CMD | nvidia-cuda-mps-control`) does not need.
if TYPE_CHECKING:
    from dra_gpu.hardware.simulator.state import StateStore

SOCKET_NAME = "control"
PID_FILE = "nvidia-cuda-mps-control.pid"
LOCK_FILE = "control_lock"  # one control session ("UI") at a time, as the real daemon's pipe directory has
BUSY_MESSAGE = "Cannot send command to MPS control daemon process"
NOT_RUNNING_MESSAGE = "Cannot find MPS control daemon process"
LOG_FILE = "control.log"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
STATE_PATH = "var/lib/nvml-sim/state.json"
_LIMIT_RE = re.compile(r"^([0-9]+)([MG])$")


class CommandError(Exception):
    pass


def _store() -> StateStore | None:
    from dra_gpu.hardware.simulator.state import StateStore

    root = os.environ.get("DRA_GPU_SIM_ROOT")
    return StateStore(Path(root) / STATE_PATH) if root else None


def _known_uuids(store: StateStore) -> set[str]:
    state = store.read()
    uuids = {g.uuid for g in state.gpus}
    for g in state.gpus:
        for gi in g.gpu_instances:
            uuids.update(ci.uuid for ci in gi.compute_instances)
    return uuids


class Daemon:
    """The control daemon's state and command handling (one command per connection)."""

    def __init__(self, pipe_dir: Path, log_dir: Path, visible: list[str], store: StateStore | None) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.visible = visible
        self.store = store
        self.driver_root = os.environ.get("DRA_GPU_SIM_ROOT", "")
        self.entry: dict[str, Any] = {}
        self.thread_percentage: int | None = None
        self.pinned: dict[str, str] = {}
        self.multi_user = False

    def log(self, text: str) -> None:
        with open(self.log_dir / LOG_FILE, "a", encoding="utf-8") as out:
            out.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")

    def record(self, **changes: Any) -> None:
        """Update this daemon's record (mps_records.py), the limits it holds included."""
        if self.store is None:
            return
        self.entry.update(changes)
        self.entry["default_active_thread_percentage"] = self.thread_percentage
        self.entry["default_pinned_mem_limits"] = dict(self.pinned)
        if self.entry.get("running"):
            mps_records.write_running(self.driver_root, self.entry)
        else:
            mps_records.write_stopped(self.driver_root, self.entry)

    def record_command(self, line: str, ok: bool) -> None:
        self.entry.setdefault("commands", []).append({"command": line, "ok": ok})
        self.record()

    def device(self, spec: str) -> str:
        if spec in self.visible:
            return spec
        if spec.isdigit() and int(spec) < len(self.visible):
            return self.visible[int(spec)]
        raise CommandError(
            f"device {spec!r} is not visible to this daemon (CUDA_VISIBLE_DEVICES={','.join(self.visible)})"
        )

    def handle(self, line: str) -> tuple[str, bool]:
        """(answer, quit?) for one command; raises CommandError."""
        words = line.split()
        if not words:
            raise CommandError("empty command")
        name, args = words[0], words[1:]
        if name == "get_server_list" and not args:
            return "", False  # no client has connected, so no MPS server runs yet
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            self.thread_percentage = thread_percentage(args[0])
            return f"{self.thread_percentage:.1f}", False  # the real tool answers "30.0"
        if name == "get_default_active_thread_percentage" and not args:
            return f"{self.thread_percentage if self.thread_percentage is not None else 100:.1f}", False
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            uuid = self.device(args[0])
            if not _LIMIT_RE.match(args[1]) or int(args[1][:-1]) == 0:
                raise CommandError(f"invalid pinned memory limit {args[1]!r}: expected <N>M or <N>G, N > 0")
            self.pinned[uuid] = args[1]
            return "", False
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            value = self.pinned.get(self.device(args[0]))
            return ("" if value is None else _as_the_tool_prints(value)), False  # unset: no answer
        if name == "sim_get_visible_devices" and not args:  # simulator only: for the simulated client
            return json.dumps(self.visible), False
        if name == "quit" and not args:
            return "", True
        raise CommandError(f"unknown command or wrong arguments: {line!r}")

    def serve(self, listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                line = _read_line(conn)
                try:
                    answer, stop = self.handle(line)
                    ok = True
                except CommandError as err:
                    answer, stop, ok = f"ERROR: {err}", False, False
                self.log(f"{'Received' if ok else 'Rejected'} command: {line}")
                self.record_command(line, ok)
                conn.sendall((answer + "\n").encode() if answer else b"")
                if not ok:
                    conn.sendall(b"\x00")  # tells the client the command failed
            if stop:
                return


def _read_line(conn: socket.socket) -> str:
    data = b""
    conn.settimeout(5)
    while not data.endswith(b"\n") and len(data) < 4096:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def mib(value: str) -> int:
    """`<N>M` / `<N>G` (the MPS tools' notation) -> MiB."""
    match = _LIMIT_RE.match(value.strip())
    if match is None or int(match.group(1)) == 0:
        raise CommandError(f"invalid memory limit {value!r}: expected <N>M or <N>G, N > 0")
    return int(match.group(1)) * (1024 if match.group(2) == "G" else 1)


def parse_pinned_env(text: str, visible: Sequence[str]) -> dict[str, int]:
    """`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` ("0=1G,GPU-...=512M": device index or UUID) -> uuid -> MiB."""
    limits: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        device, _, value = item.partition("=")
        if device.isdigit() and int(device) < len(visible):
            device = visible[int(device)]
        if device not in visible:
            raise CommandError(
                f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names {device!r}, not a device of this server"
            )
        limits[device] = mib(value)
    return limits


def thread_percentage(text: str) -> int:
    """An active thread percentage as the tool takes it (`30`, `40.5`; 0..100), rounded to a whole one."""
    try:
        value = float(text.strip())
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise CommandError(f"invalid active thread percentage {text!r}: expected 0..100")
    return round(value)


def _as_the_tool_prints(value: str) -> str:
    """`2048M` -> `2G`: the real tool answers in whole GiB where it can (seen on driver 580.159.04)."""
    mebibytes = mib(value)
    return f"{mebibytes >> 10}G" if mebibytes % 1024 == 0 else f"{mebibytes}M"


def thread_percentage_from_env(env: Mapping[str, str]) -> int | None:
    """The daemon-level default from the control daemon's own environment (MPS docs 4.2.5, "MPS control
    daemon level"). Only the thread percentage: a real control daemon (H100, driver 580.159.04) ignores
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in its own environment (in every notation: index or UUID, M or G), so the
    simulated one does too; pinned limits are set by command."""
    text = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip()
    return thread_percentage(text) if text else None


def _dirs() -> tuple[Path, Path]:
    pipe_dir = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    log_dir = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR)
    return pipe_dir, log_dir


def start_daemon(foreground: bool = False, multi_user: bool = False) -> int:
    pipe_dir, log_dir = _dirs()
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    store = _store()
    if not visible:
        print(
            "CUDA_VISIBLE_DEVICES is empty: the MPS control daemon needs the devices it serves",
            file=sys.stderr,
        )
        return 1
    if store is not None:
        unknown = [d for d in visible if d not in _known_uuids(store)]
        if unknown:
            print(
                f"CUDA_VISIBLE_DEVICES names devices that do not exist: {','.join(unknown)}", file=sys.stderr
            )
            return 1
    try:
        daemon_threads = thread_percentage_from_env(os.environ)
    except CommandError as err:
        print(str(err), file=sys.stderr)
        return 1
    pipe_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    if (pipe_dir / PID_FILE).exists() and _answers(pipe_dir):
        print(f"An instance of this daemon is already running ({pipe_dir})", file=sys.stderr)
        return 1
    with contextlib.suppress(FileNotFoundError):
        (pipe_dir / SOCKET_NAME).unlink()
    (pipe_dir / LOCK_FILE).touch()
    os.chmod(pipe_dir / LOCK_FILE, 0o666)
    # Bind before forking so that a failure is reported to the caller; bind with a relative name so a long
    # pipe directory does not hit the 108-byte limit of socket paths.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    os.chdir(pipe_dir)
    try:
        listener.bind(SOCKET_NAME)
        # As a real daemon's (H100, driver 580.159.04): `control` and `control_lock` are 0666, so clients of
        # any uid (a workload image's non-root user) reach the daemon through the mounted pipe directory.
        os.chmod(SOCKET_NAME, 0o666)
    finally:
        os.chdir(cwd)
    listener.listen(16)
    daemon = Daemon(pipe_dir, log_dir, visible, store)
    daemon.multi_user = multi_user
    daemon.thread_percentage = daemon_threads
    if foreground:
        signal.signal(signal.SIGTERM, _exit_on_signal)
        _daemon_main(listener, None, daemon)
        return 0
    read_end, write_end = os.pipe()
    if os.fork() > 0:  # the caller's process: wait until the daemon has written its pid, then return
        os.close(write_end)
        listener.close()
        ready = os.read(read_end, 16)
        os.close(read_end)
        return 0 if ready else 1
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _daemon_main(listener, write_end, daemon)
    os._exit(0)


def _daemon_main(listener: socket.socket, ready_fd: int | None, daemon: Daemon) -> None:
    os.chdir("/")
    signal.signal(signal.SIGTERM, _exit_on_signal)
    pid = os.getpid()
    (daemon.pipe_dir / PID_FILE).write_text(f"{pid}\n")
    daemon.log(f"Starting control daemon pid {pid} for devices {','.join(daemon.visible)}")
    daemon.record(
        pid=pid,
        running=True,
        started=time.time(),
        stopped=None,
        visible_devices=daemon.visible,
        multi_user=daemon.multi_user,
        pipe_dir=str(daemon.pipe_dir),
        log_dir=str(daemon.log_dir),
        commands=[],
    )
    if ready_fd is not None:
        os.write(ready_fd, b"1")
        os.close(ready_fd)
    try:
        daemon.serve(listener)
    except Exception as err:  # stdout/stderr are /dev/null: the log is the only place to say why
        daemon.log(f"Control daemon failed: {err!r}")
        raise
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            (daemon.pipe_dir / SOCKET_NAME).unlink()
        with contextlib.suppress(FileNotFoundError):
            (daemon.pipe_dir / PID_FILE).unlink()
        daemon.log("Shutting down control daemon")
        daemon.record(running=False, stopped=time.time())


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(0)  # unwinds through _daemon_main's cleanup (socket, pid file, state record)


def _connect(pipe_dir: Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    try:
        os.chdir(pipe_dir)
        conn.connect(SOCKET_NAME)
    except OSError:
        conn.close()
        raise
    finally:
        os.chdir(cwd)
    return conn


def _answers(pipe_dir: Path) -> bool:
    try:
        with _connect(pipe_dir) as conn:
            conn.sendall(b"get_server_list\n")
            conn.settimeout(2)
            conn.recv(4096)
        return True
    except OSError:
        return False


def run_client(lines: Iterable[str]) -> int:
    """One control session (a "UI" in the daemon's log): every stdin line as a command, in order.

    A real control daemon serves one UI at a time; a second one fails at once with "Cannot send command to MPS
    control daemon process" and exit status 1, also while the first only holds its stdin open (seen on an
    H100, driver 580.159.04: 15 of 20 concurrent `echo get_server_list | nvidia-cuda-mps-control` failed so).
    The simulated session holds an exclusive lock on the pipe directory's `control_lock` to do the same."""
    pipe_dir, _ = _dirs()
    try:
        lock = open(pipe_dir / LOCK_FILE, "rb")  # noqa: SIM115 (held for the whole session)
    except OSError:
        print(NOT_RUNNING_MESSAGE, file=sys.stderr)
        return 1
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(BUSY_MESSAGE, file=sys.stderr)
            return 1
        status = 0
        for line in lines:
            if not line.strip():
                continue
            try:
                conn = _connect(pipe_dir)
            except OSError:
                print(NOT_RUNNING_MESSAGE, file=sys.stderr)
                return 1
            with conn:
                conn.settimeout(10)
                conn.sendall(line.strip().encode() + b"\n")
                reply = b""
                while chunk := conn.recv(4096):
                    reply += chunk
            failed = reply.endswith(b"\x00")
            text = reply.rstrip(b"\x00").decode(errors="replace")
            (sys.stderr if failed else sys.stdout).write(text)
            sys.stdout.flush()
            status = 1 if failed else status
        return status


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-d", "-f") and set(args[1:]) <= {"-M"} and len(args) <= 2:
        return start_daemon(foreground=args[0] == "-f", multi_user="-M" in args)
    if args:
        print("usage: nvidia-cuda-mps-control -d|-f [-M]   (commands on stdin otherwise)", file=sys.stderr)
        return 2
    return run_client(sys.stdin)


if __name__ == "__main__":
    sys.exit(main())
