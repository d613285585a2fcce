"""MPS: control daemons started by the plugin, their limits, and the container edits that connect to them.

A daemon is a real, detached process: `<driver root>/usr/bin/nvidia-cuda-mps-control -d` with
`CUDA_VISIBLE_DEVICES` (the UUIDs it serves), `CUDA_MPS_PIPE_DIRECTORY` and `CUDA_MPS_LOG_DIRECTORY` pointing
at `<plugin dir>/mps/<id>/{pipe,log}`. Its clients share `<plugin dir>/mps/<id>/shm`, a size-limited tmpfs
like NVIDIA's (`size=MemTotal/2`), mounted at the containers' `/dev/shm`; when mounting is not possible the
directory is used as it is and the record says so (`shmMounted: false`). Before the daemon starts, the full
GPUs it serves are switched to compute mode EXCLUSIVE_PROCESS, so that only the MPS server can open them; the
previous mode is restored when the daemon stops.

Readiness is proven before prepare returns: the daemon must answer `get_server_list` through its control pipe
and have written its log. Limits are set ON THE CONTROL DAEMON (`set_default_active_thread_percentage N`,
`set_default_device_pinned_mem_limit <uuid> <N>M`) and nowhere else: NVIDIA documents that a client's own
`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` / `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` can only lower the daemon's setting,
so a tenant's environment cannot raise its share, and a value the user put in the pod spec (which can only
lower it) is left alone. (No security boundary: the pipe directory a client needs is also the daemon's control
channel, so a root tenant that brings its own control client can change the limits; NVIDIA's driver is the
same.) The container gets `CUDA_MPS_PIPE_DIRECTORY` and the pipe/shm mounts only;
the control binary is never mounted into workloads.

The daemon is detached (its own session; `-d` daemonizes) so it outlives the plugin process. It is known by
what cannot be reused: its pipe directory (commands go through the pipe) plus its pid AND that process's start
time (field 22 of /proc/<pid>/stat). A pid read from a file is never signalled unless the process holding it
started at the recorded time. The record is written before anything it would have to undo (tmpfs mount,
compute mode, daemon), so a crash at any step leaves a record that says how to clean up.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dra_gpu.config.quantity import format_mib
from dra_gpu.hardware.interface import GpuHardware, HardwareError
from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.interface import CdiEdits, CdiMount, SharingError
from dra_gpu.sharing.mps_pods import PodLauncher, pod_limit_env
from dra_gpu.sharing.tmpfs import mount_tmpfs, unmount

log = structlog.get_logger(__name__)

CONTROL_BINARY = "usr/bin/nvidia-cuda-mps-control"
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
CONTAINER_SHM_DIR = "/dev/shm"
PID_FILE = "nvidia-cuda-mps-control.pid"  # written by the simulated daemon; absent on some real drivers
LOG_FILE = "control.log"
NOT_RUNNING = "Cannot find MPS control daemon"  # what the control binary says when no daemon answers
BUSY = "Cannot send command to MPS control daemon"  # ... when the daemon serves another control session
THREAD_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PINNED_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"  # only ever dropped from what the plugin passes on
_MEMORY_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([MG])B?$")
RECORD_FILE = "record.json"
DEFAULT_SHM_SIZE = "65536k"  # NVIDIA's fallback when MemTotal cannot be read
SHM_OPTIONS = "rw,nosuid,nodev,noexec,relatime"
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu", "usr/lib")


@dataclass(frozen=True)
class DaemonSpec:
    daemon_id: str  # directory name under <plugin dir>/mps
    visible_uuids: tuple[str, ...]  # CUDA_VISIBLE_DEVICES: GPU and/or MIG UUIDs
    exclusive_gpus: tuple[str, ...]  # full GPUs switched to EXCLUSIVE_PROCESS while the daemon runs
    thread_percentage: int | None = None
    pinned_limits: Mapping[str, int] | None = None  # uuid -> bytes
    multi_user: bool = False  # `-M`: clients of other uids may connect (NVIDIA's mpsConfig.multiUser)
    # gpu uuid -> the compute mode to restore at stop when known better than the GPU's current one (a mode an
    # earlier claim could not restore because the GPU was gone: the GPU must end as it was before both)
    modes_before: Mapping[str, int] | None = None


def process_start_time(pid: int | None) -> int | None:
    """Start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22); None if it does not run.
    With the pid it names one process for the life of the boot: a reused pid has another start time."""
    if not pid:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None  # a zombie has exited; whoever reaps it is not our business
    try:
        return int(fields[19])  # field 22 overall; fields[0] is field 3 (state)
    except ValueError:
        return None


def same_process(pid: int | None, start_time: int | None) -> bool:
    """True only when `pid` runs and started at `start_time`: the identity check before any signal."""
    return pid is not None and start_time is not None and process_start_time(pid) == start_time


def daemon_limit_env(record: Mapping[str, Any]) -> dict[str, str]:
    """The record's thread limit as the control daemon's own environment (MPS docs 4.2.5, "MPS control daemon
    level"): in force from the daemon's first moment, before any command. Not the pinned memory limit: a real
    control daemon ignores CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in its environment (seen on an H100, driver
    580.159.04, in every notation), so that one is set by command at every start (`limit_commands`)."""
    if record.get("threadPercentage") is None:
        return {}
    return {THREAD_ENV: str(record["threadPercentage"])}


def limit_commands(record: Mapping[str, Any]) -> list[str]:
    """The daemon's defaults as control commands: the ceiling for every client of this daemon (a client's env
    only lowers it; seen on an H100: a client asking for 100 % and 80G still got 25 % of the SMs and failed
    to allocate past the 2G limit)."""
    limits = [
        f"set_default_device_pinned_mem_limit {uuid} {value}"
        for uuid, value in sorted(record.get("pinnedLimits", {}).items())
    ]
    if record.get("threadPercentage") is not None:
        limits.insert(0, f"set_default_active_thread_percentage {record['threadPercentage']}")
    return limits


def _memory_mib(text: str) -> float | None:
    """`4096M`, `4G`, `4.0G` (get_default_device_pinned_mem_limit's answer) -> MiB; None when unset."""
    match = _MEMORY_RE.match(text.strip())
    if match is None:
        return None
    return float(match.group(1)) * (1024 if match.group(2) == "G" else 1)


def client_edits(record: Mapping[str, Any]) -> CdiEdits:
    """What a container needs to be an MPS client of the daemon in `record`: the pipe directory and the shared
    memory. No limits: they are the daemon's (a client env can only lower them, so the user's own pod env is
    left to do that)."""
    env = [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"]
    mounts = (
        CdiMount(record["pipeDir"], CONTAINER_PIPE_DIR),
        CdiMount(record["shmDir"], CONTAINER_SHM_DIR),
    )
    return CdiEdits(env=tuple(env), mounts=mounts)


class MpsDaemons:
    def __init__(
        self,
        hardware: GpuHardware,
        plugin_dir: Path,
        *,
        ready_timeout_s: float = 10.0,
        stop_timeout_s: float = 5.0,
        mount_shm: bool = True,
        faults: Callable[[str], None] | None = None,
        pods: PodLauncher | None = None,
    ) -> None:
        self._hardware = hardware
        self._pods = pods  # None: detached processes (the `process` launcher); else one pod per daemon
        self._base = plugin_dir / "mps"
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._mount_shm = mount_shm
        self._faults: Callable[[str], None] = faults or (lambda _step: None)
        # daemon id -> its pod's restartCount as `alive` last read it / as its limits were last checked at
        self._observed_restarts: dict[str, int | None] = {}
        self._checked_restarts: dict[str, int] = {}

    # ---- start ---------------------------------------------------------------------------------------------

    def start(self, spec: DaemonSpec) -> dict[str, Any]:
        """Start and configure a daemon; all or nothing. Returns its record (JSON) for `stop`."""
        binary = Path(self._hardware.driver_root()) / CONTROL_BINARY
        if not os.access(binary, os.X_OK):
            raise SharingError(
                f"cannot start MPS for {', '.join(spec.visible_uuids)}: {binary} is missing or not "
                "executable (check --container-driver-root, env CONTAINER_DRIVER_ROOT: where this process "
                "sees the driver root, by default --nvidia-driver-root)"
            )
        root = self._base / spec.daemon_id
        if root.exists():
            # Left over from an interrupted attempt or a lost checkpoint: take it down before starting anew.
            log.warning("stale MPS daemon directory; stopping what is left", dir=str(root))
            stale = saved_record(root) or self._record_for(
                spec, root, pid=None, shm_mounted=_is_mount_point(root / "shm")
            )
            self.stop(stale)
        record = self._record_for(spec, root, pid=None, shm_mounted=False)
        try:
            # Record first: every later step (mount, compute mode, daemon) is undone from this file if the
            # plugin dies before the checkpoint names the daemon.
            root.mkdir(parents=True, exist_ok=True)
            _save_record(record)
            self._faults("mps-record-written")
            for name in ("pipe", "log", "shm"):
                (root / name).mkdir(parents=True, exist_ok=True)
            record["shmMounted"] = self._mount_tmpfs(root / "shm")
            _save_record(record)
            self._faults("mps-shm-mounted")
            for uuid in spec.exclusive_gpus:
                current = int(self._hardware.get_compute_mode(uuid))
                record["computeModes"][uuid] = (spec.modes_before or {}).get(uuid, current)
                _save_record(record)  # the mode to restore is known before it is changed
                self._hardware.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_PROCESS)
            self._faults("mps-compute-mode-set")
            self._launch(record)
            self._faults("mps-daemon-started")
            self._wait_ready(record, limit_commands(record))
            self._faults("mps-limits-set")
        except (SharingError, HardwareError, OSError) as err:
            problems = self.stop(record)
            detail = f" (cleanup: {'; '.join(problems)})" if problems else ""
            raise SharingError(
                f"MPS daemon {spec.daemon_id} for {', '.join(spec.visible_uuids)}: {err}{detail}"
            ) from None
        log.info(
            "MPS daemon ready",
            id=spec.daemon_id,
            pid=record["pid"],
            devices=list(spec.visible_uuids),
            shm_mounted=record["shmMounted"],
        )
        return record

    def _record_for(self, spec: DaemonSpec, root: Path, pid: int | None, shm_mounted: bool) -> dict[str, Any]:
        return {
            "id": spec.daemon_id,
            "dir": str(root),
            "pipeDir": str(root / "pipe"),
            "logDir": str(root / "log"),
            "shmDir": str(root / "shm"),
            "shmMounted": shm_mounted,
            "pid": pid,
            "visibleDevices": list(spec.visible_uuids),
            "computeModes": {},  # gpu uuid -> compute mode before we changed it
            "threadPercentage": spec.thread_percentage,
            "pinnedLimits": {u: format_mib(v) for u, v in sorted((spec.pinned_limits or {}).items())},
            "multiUser": spec.multi_user,
            "startTime": None,  # with pid: the daemon's identity (see process_start_time)
        }

    def _launch(self, record: dict[str, Any]) -> None:
        """Start the control daemon detached (`-d` forks it into its own session: it is no child of ours and
        outlives this process) and learn its identity: pid from the pid file, checked to be an MPS control
        process, plus its start time."""
        with contextlib.suppress(FileNotFoundError):
            (Path(record["pipeDir"]) / PID_FILE).unlink()  # a previous daemon's; it is gone
        if self._pods is not None:
            # its own pod: pid and start time are the pod's business; the pod UID is the identity
            record["launcher"], record["pid"], record["startTime"] = "pod", None, None
            _save_record(record)  # before the pod exists: a crash leaves the name to find it by
            env = {**self._env(record), **daemon_limit_env(record), **pod_limit_env(limit_commands(record))}
            self._pods.launch(record, env)
            _save_record(record)
            return
        args = ["-d", "-M"] if record.get("multiUser") else ["-d"]
        self._run(record, args, None, what="starting the MPS control daemon", env=daemon_limit_env(record))
        pid = self._read_pid(Path(record["pipeDir"]))
        start_time = process_start_time(pid) if _is_mps_process(pid) else None
        record["pid"] = pid if start_time is not None else None
        record["startTime"] = start_time
        _save_record(record)

    def limits_in_force(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The limits the running daemon holds (asked through its pipe), e.g. to check a revived daemon;
        pinned limits in the record's notation (`2048M`), "" where none is set."""
        thread = self.command(record, "get_default_active_thread_percentage").strip()
        pinned = {
            uuid: self.command(record, f"get_default_device_pinned_mem_limit {uuid}").strip()
            for uuid in record.get("visibleDevices", [])
        }
        try:
            percentage: int | None = round(float(thread))  # the real tool prints "25.0"
        except ValueError:
            percentage = None
        # in the record's notation ("2048M"; the real tool prints "2G"), "" where none is set
        notation = {}
        for uuid, text in pinned.items():
            value = _memory_mib(text)
            notation[uuid] = "" if value is None else f"{int(value) if value.is_integer() else value}M"
        return {"threadPercentage": percentage, "pinnedLimits": notation}

    def holds_limits(self, record: Mapping[str, Any]) -> bool:
        """The running daemon holds the record's limits (a limit the record leaves unset is not checked)."""
        held = self.limits_in_force(record)
        wanted_thread = record.get("threadPercentage")
        if wanted_thread is not None and held["threadPercentage"] != wanted_thread:
            return False
        # both in the record's notation (format_mib's `<N>M`; limits_in_force turns the tool's "2G" into it)
        wanted = record.get("pinnedLimits", {})
        return all(held["pinnedLimits"].get(uuid) == value for uuid, value in wanted.items())

    def ensure_limits(self, record: Mapping[str, Any]) -> bool:
        """For a daemon in a pod, after `alive` said it runs: when its container restarted since this process
        last looked (or it has not looked yet), check the daemon's limits and set them again where they
        differ. The kubelet restarts a daemon that exits in place; its pod's entrypoint sets the limits, and
        this is the check that they are in force. True when limits had to be set again; SharingError when
        that failed."""
        latest = self.latest(record)
        if latest.get("launcher") != "pod" or self._pods is None:
            return False
        restarts = self._observed_restarts.get(latest["id"])  # read by `alive` just before: no second GET
        if restarts is None or self._checked_restarts.get(latest["id"]) == restarts:
            return False
        applied = False
        if limit_commands(latest) and not self.holds_limits(latest):
            log.warning("MPS daemon lost its limits; setting them again", id=latest["id"], restarts=restarts)
            self._wait_ready(latest, limit_commands(latest))
            applied = True
        self._checked_restarts[latest["id"]] = restarts
        return applied

    def _mount_tmpfs(self, path: Path) -> bool:
        if not self._mount_shm:
            return False
        try:
            mount_tmpfs(path, f"{SHM_OPTIONS},size={_shm_size()}")
        except OSError as err:
            log.warning(
                "cannot mount tmpfs for MPS shared memory; using a plain directory (size not limited)",
                path=str(path),
                error=err.strerror,
            )
            return False
        return True

    def _env(self, record: Mapping[str, Any]) -> dict[str, str]:
        root = self._hardware.driver_root()
        # limits come from the record only (daemon_limit_env), never from whatever this process inherited
        env = {k: v for k, v in os.environ.items() if k not in (THREAD_ENV, PINNED_ENV)}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(record["visibleDevices"])
        env["CUDA_MPS_PIPE_DIRECTORY"] = record["pipeDir"]
        env["CUDA_MPS_LOG_DIRECTORY"] = record["logDir"]
        libs = [os.path.join(root, d) for d in LIB_DIRS if os.path.isdir(os.path.join(root, d))]
        if libs:
            env["LD_LIBRARY_PATH"] = ":".join([*libs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
        env["PATH"] = os.path.join(root, "usr", "bin") + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        return env

    def _run(
        self,
        record: Mapping[str, Any],
        args: Sequence[str],
        stdin: str | None,
        *,
        what: str,
        timeout_s: float = 30,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Run the control binary. A daemon serves one control session at a time and refuses a second at once
        (BUSY: the daemon pod's entrypoint, an admin's session); a command session is tried again until
        `timeout_s` has passed."""
        binary = os.path.join(self._hardware.driver_root(), CONTROL_BINARY)
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while True:
            try:
                done = subprocess.run(
                    [binary, *args],
                    input=stdin,
                    capture_output=True,
                    text=True,
                    env={**self._env(record), **(env or {})},
                    timeout=max(deadline - time.monotonic(), 0.5),
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as err:
                raise SharingError(f"{what}: {err}") from None
            if done.returncode == 0:
                return done.stdout
            output = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            if args or BUSY not in output or time.monotonic() + delay > deadline:
                raise SharingError(f"{what}: {output}")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def command(self, record: Mapping[str, Any], line: str, timeout_s: float = 30) -> str:
        """Send one control command (`echo line | nvidia-cuda-mps-control`); raise SharingError on failure."""
        return self._run(record, [], line + "\n", what=f"MPS control command {line!r}", timeout_s=timeout_s)

    def _wait_ready(self, record: Mapping[str, Any], limits: Sequence[str] = ()) -> None:
        """Wait until the daemon answers `get_server_list` and has written its log, and set `limits` in the
        same run of the control binary (each run costs a process start: one run, not two)."""
        deadline = time.monotonic() + self._ready_timeout_s
        delay = 0.01
        last = "no answer"
        log_file = Path(record["logDir"]) / LOG_FILE
        lines = ["get_server_list", *limits]
        what = "MPS control command 'get_server_list'"
        if limits:
            what = f"setting MPS limits ({'; '.join(limits)})"
        while True:
            try:
                remaining = max(deadline - time.monotonic(), 0.5)
                self._run(record, [], "\n".join(lines) + "\n", what=what, timeout_s=remaining)
                if log_file.exists():
                    return
                last = f"{log_file} was not written"
            except SharingError as err:
                if limits and NOT_RUNNING not in str(err) and BUSY not in str(err):
                    raise  # the daemon answered and refused a limit: waiting will not change that
                last = str(err)
            if time.monotonic() > deadline:
                raise SharingError(
                    f"the daemon did not become ready within {self._ready_timeout_s:g}s: {last}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    @staticmethod
    def _read_pid(pipe_dir: Path) -> int | None:
        try:
            return int((pipe_dir / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def answers(self, record: Mapping[str, Any]) -> bool:
        """The daemon answers on its pipe, or is busy with another control session for longer than this waits
        (it runs: only a running daemon refuses a session)."""
        try:
            self.command(record, "get_server_list", timeout_s=5)
            return True
        except SharingError as err:
            return BUSY in str(err)

    def restart(self, record: dict[str, Any]) -> None:
        """Start the daemon of `record` again in place (same pipe directory, mount and limits), e.g. after it
        died or was killed. Containers that bind-mounted the pipe and shm directories keep working with the
        new daemon, so nothing is removed. Updates the record's identity (pid, startTime)."""
        root = Path(record["dir"])
        for name in ("pipe", "log", "shm"):
            (root / name).mkdir(parents=True, exist_ok=True)
        if record.get("shmMounted") and not _is_mount_point(root / "shm"):
            record["shmMounted"] = self._mount_tmpfs(root / "shm")
        for uuid in record.get("computeModes", {}):
            self._hardware.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_PROCESS)
        self._launch(record)
        self._wait_ready(record, limit_commands(record))
        log.info("MPS daemon restarted", id=record["id"], pid=record["pid"])

    def alive(self, record: Mapping[str, Any]) -> bool:
        """The daemon named by the record's latest identity runs and answers on its pipe."""
        latest = self.latest(record)
        if latest.get("launcher") == "pod":
            if self._pods is not None:
                seen = self._pods.observe(latest)
                if seen is None:
                    return False
                self._observed_restarts[latest["id"]] = seen.restarts  # for ensure_limits: no second read
        elif latest.get("startTime") is not None and not same_process(latest.get("pid"), latest["startTime"]):
            return False
        return self.answers(latest)

    def pod_exists(self, record: Mapping[str, Any]) -> bool:
        """The record's daemon runs in a pod and that pod (its UID) still exists."""
        latest = self.latest(record)
        return latest.get("launcher") == "pod" and self._pods is not None and self._pods.alive(latest)

    def latest(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The record as last saved next to the daemon (a restart changes pid and start time there, while the
        checkpoint keeps the first); the given one when that file is missing or belongs to another daemon."""
        saved = saved_record(Path(record["dir"]))
        if saved is not None and saved.get("id") == record.get("id"):
            return saved
        return dict(record)

    def stop_unowned_pods(self, owned_ids: set[str]) -> list[str]:
        """Delete daemon pods of this node that no record owns (a crash between creating one and saving its
        record, or a record lost); returns their names."""
        if self._pods is None:
            return []
        stopped: list[str] = []
        for pod in self._pods.owned_pods():
            daemon = pod["metadata"].get("labels", {}).get("gpu.nvidia.com/mps-daemon", "")
            latest = saved_record(self._base / daemon) if daemon else None
            if daemon in owned_ids and latest is not None and latest.get("podUid") == pod["metadata"]["uid"]:
                continue
            if latest is not None and latest.get("podUid") == pod["metadata"]["uid"]:
                continue  # its directory still has a record: stop_unowned_mps stops it with everything else
            problems = self._pods.delete_pod(pod)
            if problems:
                log.error(
                    "cannot delete unowned MPS daemon pod", pod=pod["metadata"]["name"], problems=problems
                )
                continue
            stopped.append(pod["metadata"]["name"])
        return stopped

    def daemon_dirs(self) -> list[Path]:
        return sorted(p for p in self._base.iterdir() if p.is_dir()) if self._base.is_dir() else []

    # ---- stop ----------------------------------------------------------------------------------------------

    def stop(
        self, record: Mapping[str, Any], on_gpu_gone: Callable[[str, int], None] | None = None
    ) -> list[str]:
        """Stop the daemon, unmount, remove its dir, restore compute modes. Idempotent; returns problems.

        Only the process with the recorded identity (pid + start time) is ever signalled. A compute mode that
        cannot be restored because the GPU is gone is handed to `on_gpu_gone(uuid, mode)` (to be restored when
        the GPU returns) instead of being a problem, so unprepare of a vanished GPU finishes."""
        problems: list[str] = []
        latest = self.latest(record)
        pid, start_time = latest.get("pid"), latest.get("startTime")
        if latest.get("launcher") == "pod":
            if self._pods is None:
                problems.append(
                    f"MPS daemon {record['id']} runs in a pod, but this plugin has no pod launcher"
                )
            else:
                problems += self._pods.stop(latest)  # the pod's preStop hook sends `quit`
        elif Path(record["pipeDir"]).is_dir():
            try:
                self.command(record, "quit", timeout_s=self._stop_timeout_s)
            except SharingError as err:
                if same_process(pid, start_time):
                    log.warning("MPS quit failed; will kill", id=record["id"], error=str(err))
        if not _wait_gone(pid, start_time, self._stop_timeout_s):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if pid is not None and same_process(pid, start_time):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
                    if _wait_gone(pid, start_time, self._stop_timeout_s):
                        break
            if same_process(pid, start_time):
                problems.append(f"MPS daemon {record['id']} (pid {pid}) does not exit")
        self._faults("mps-quit-sent")
        shm = Path(record["shmDir"])
        if _is_mount_point(shm):
            try:
                unmount(shm)
            except OSError as err:
                problems.append(f"cannot unmount {shm}: {err.strerror}")
        self._faults("mps-shm-unmounted")
        for uuid, mode in sorted(latest.get("computeModes", {}).items()):
            try:
                self._hardware.set_compute_mode(uuid, ComputeMode(mode))
            except HardwareError as err:
                if on_gpu_gone is not None and err.gpu_gone:
                    log.warning(
                        "GPU is gone; compute mode restored when it returns", gpu=uuid, error=str(err)
                    )
                    on_gpu_gone(uuid, int(mode))
                else:
                    problems.append(f"restoring compute mode of GPU {uuid}: {err}")
            except ValueError as err:
                problems.append(f"restoring compute mode of GPU {uuid}: {err}")
        self._faults("mps-modes-restored")
        if not problems:
            shutil.rmtree(record["dir"], ignore_errors=True)
            if Path(record["dir"]).exists():
                problems.append(f"cannot remove {record['dir']}")
        if not problems:
            log.info("MPS daemon stopped", id=record["id"], pid=pid)
        return problems


def _save_record(record: Mapping[str, Any]) -> None:
    """Keep a copy of the record next to the daemon: the way to stop it if the checkpoint never got it."""
    path = Path(record["dir"]) / RECORD_FILE
    tmp = path.with_name(RECORD_FILE + ".tmp")
    tmp.write_text(json.dumps(record, sort_keys=True))
    os.replace(tmp, path)


def saved_record(daemon_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((daemon_dir / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _shm_size() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) // 2}k"
    except (OSError, ValueError, IndexError):
        pass
    return DEFAULT_SHM_SIZE


def _is_mount_point(path: Path) -> bool:
    target = os.path.realpath(path)
    # A tmpfs has its own device, which stat shows whatever else is mounted meanwhile; mountinfo, read while
    # other shares mount and unmount theirs, can miss a line. It is the fallback for a mount of the same file
    # system (a bind mount), which stat cannot tell.
    if os.path.ismount(target):
        return True
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as info:
            for line in info:
                fields = line.split()
                if len(fields) > 4 and fields[4].replace("\\040", " ") == target:
                    return True
    except OSError:
        return os.path.ismount(target)
    return False


def _is_mps_process(pid: int | None) -> bool:
    """The pid runs an MPS control process (checked once, when the daemon has just written its pid file)."""
    if pid is None or process_start_time(pid) is None:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"nvidia-cuda-mps-control" in cmdline or b"mps_control" in cmdline


def _wait_gone(pid: int | None, start_time: int | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while same_process(pid, start_time):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
