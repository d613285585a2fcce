"""MPS: control daemons started by the plugin, their limits, and the container edits that connect to them.

A daemon is a real, detached process: the driver root's `nvidia-cuda-mps-control -d` (driver_layout) with
`CUDA_VISIBLE_DEVICES` (the UUIDs it serves), run in a private mount namespace where its host directories
`<plugin dir>/mps/<id>/stage` and `.../log` are /tmp/nvidia-mps and /var/log/nvidia-mps (mps_namespace.py: the
real tool refuses a long pipe directory). Once it holds its limits, `stage` becomes `<id>/clients/pipe`, the
directory containers reach (mounted at /tmp/nvidia-mps, pipe /tmp/nvidia-mps/pipe). Its clients share
`<plugin dir>/mps/<id>/shm`, a size-limited tmpfs like NVIDIA's (`size=MemTotal/2`), mounted at the
containers' `/dev/shm`; when mounting is not possible the directory is used as it is and the record says so
(`shmMounted: false`). Before the daemon starts, the full GPUs it serves are switched to compute mode
EXCLUSIVE_PROCESS, so that only the MPS server can open them (MPS's guide: a process that ignores the pipe
directory would otherwise get the whole GPU); the previous mode is restored when the daemon stops. The lab
option `leave_compute_mode` (--mps-leave-compute-mode) skips that, for machines whose GPU settings must not
change: then a tenant that drops its pipe directory reaches the whole GPU.

Readiness is proven before prepare returns: the daemon must answer `get_server_list` through its control pipe
and have written its log. Limits are set on the control daemon (`set_default_active_thread_percentage N`,
`set_default_device_pinned_mem_limit <uuid> <N>M`): they are the caps of the next MPS server it spawns, and a
client's own `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` / `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` can only lower them. A
server already running keeps the caps it was spawned with (seen on the H200), so limits that change, and the
reconcile pass, also set them per running server (`set_active_thread_percentage <pid> N`,
`set_device_pinned_mem_limit <pid> <uuid> <N>M`). (No security boundary against root: the pipe directory a
client needs is also the daemon's control channel, so a root tenant that brings its own control client can
change the limits; NVIDIA's driver is the same.) The container gets `CUDA_MPS_PIPE_DIRECTORY`, the pipe/shm
mounts and, for a share of a GPU's common server, its own limits in its env; the control binary is never
mounted into workloads.

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
from dra_gpu.hardware import driver_layout
from dra_gpu.hardware.interface import GpuHardware, HardwareError
from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.interface import CdiEdits, CdiMount, SharingError
from dra_gpu.sharing.mps_namespace import (
    CONTAINER_MPS_DIR,
    CONTAINER_PIPE_DIR,
    DAEMON_LOG_DIR,
    DAEMON_PIPE_DIR,
    in_daemon_view,
    place,
)
from dra_gpu.sharing.mps_pods import PodLauncher, pod_limit_env
from dra_gpu.sharing.tmpfs import mount_tmpfs, unmount

log = structlog.get_logger(__name__)

CONTROL_BINARY_NAME = "nvidia-cuda-mps-control"  # found under the driver root by driver_layout
LEGACY_CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"  # records of layout 1 (before staging) mount the pipe here
LAYOUT = 2  # record["layout"]: 2 = stage/ and clients/pipe; absent = 1 (the pipe directory itself mounted)
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
    shares_server: bool = False  # the common server of a GPU's shares (clients carry their limits in env)


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


def server_limit_commands(record: Mapping[str, Any], server_pids: Sequence[int]) -> list[str]:
    """The record's limits for MPS servers already running: `set_default_*` reaches only the next server, so a
    server spawned before a limit changed (or before a restarted daemon got its limits) is set one by one."""
    commands: list[str] = []
    for pid in server_pids:
        if record.get("threadPercentage") is not None:
            commands.append(f"set_active_thread_percentage {pid} {record['threadPercentage']}")
        commands += [
            f"set_device_pinned_mem_limit {pid} {uuid} {value}"
            for uuid, value in sorted(record.get("pinnedLimits", {}).items())
        ]
    return commands


def parse_server_list(text: str) -> list[int]:
    """`get_server_list`'s answer: the running servers' pids, one per line."""
    return [int(word) for word in text.split() if word.isdigit()]


def _memory_mib(text: str) -> float | None:
    """`4096M`, `4G`, `4.0G` (get_default_device_pinned_mem_limit's answer) -> MiB; None when unset."""
    match = _MEMORY_RE.match(text.strip())
    if match is None:
        return None
    return float(match.group(1)) * (1024 if match.group(2) == "G" else 1)


def client_edits(
    record: Mapping[str, Any],
    *,
    thread_percentage: int | None = None,
    pinned_mib: int | None = None,
    shm_dir: str | None = None,
) -> CdiEdits:
    """What a container needs to be an MPS client of the daemon in `record`: the pipe directory and the shared
    memory; for a share of a GPU's common server, its own limits too (`thread_percentage`, `pinned_mib`):
    the server's caps are the largest share's, and a client's env lowers them to its own (MPS docs: a client
    setting only further constrains the daemon's). The container sees one GPU, so the memory limit names
    device 0. `shm_dir`: the claim's own /dev/shm where the daemon serves several claims (a client and its
    server need not share /dev/shm: seen on an H100, e2e/real_gpu mps_shm_check.py), else the daemon's."""
    if record.get("layout") == LAYOUT:
        env = [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"]
        pipe_mount = CdiMount(record["clientsDir"], CONTAINER_MPS_DIR)
    else:
        env = [f"CUDA_MPS_PIPE_DIRECTORY={LEGACY_CONTAINER_PIPE_DIR}"]
        pipe_mount = CdiMount(record["pipeDir"], LEGACY_CONTAINER_PIPE_DIR)
    if thread_percentage is not None:
        env.append(f"{THREAD_ENV}={thread_percentage}")
    if pinned_mib is not None:
        env.append(f"{PINNED_ENV}=0={pinned_mib}M")
    shm = CdiMount(shm_dir or record["shmDir"], CONTAINER_SHM_DIR)
    return CdiEdits(env=tuple(env), mounts=(pipe_mount, shm))


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
        leave_compute_mode: bool = False,
    ) -> None:
        self._hardware = hardware
        self._leave_compute_mode = leave_compute_mode
        self._pods = pods  # None: detached processes (the `process` launcher); else one pod per daemon
        self._base = plugin_dir / "mps"
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._mount_shm = mount_shm
        self._faults: Callable[[str], None] = faults or (lambda _step: None)
        # daemon id -> its pod's restartCount as `alive` last read it / as its limits were last checked at
        self._observed_restarts: dict[str, int | None] = {}
        self._defaults_checked: dict[str, str] = {}  # daemon id -> the identity and limits last checked
        self._server_lists: dict[str, list[int]] = {}  # daemon id -> servers, as `answers` just read them

    # ---- start ---------------------------------------------------------------------------------------------

    def start(self, spec: DaemonSpec) -> dict[str, Any]:
        """Start and configure a daemon; all or nothing. Returns its record (JSON) for `stop`."""
        binary = driver_layout.binary_path(self._hardware.driver_root(), CONTROL_BINARY_NAME)
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
            for name in ("clients", "stage", "log", "shm"):
                (root / name).mkdir(parents=True, exist_ok=True)
            record["shmMounted"] = self._mount_tmpfs(root / "shm")
            _save_record(record)
            self._faults("mps-shm-mounted")
            for uuid in () if self._leave_compute_mode else spec.exclusive_gpus:
                current = int(self._hardware.get_compute_mode(uuid))
                record["computeModes"][uuid] = (spec.modes_before or {}).get(uuid, current)
                _save_record(record)  # the mode to restore is known before it is changed
                self._hardware.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_PROCESS)
            self._faults("mps-compute-mode-set")
            self._launch(record)
            self._faults("mps-daemon-started")
            self._wait_ready(record, limit_commands(record), at=record["stageDir"])
            self._faults("mps-limits-set")
            place(Path(record["stageDir"]), Path(record["pipeDir"]))  # containers may reach it from now on
            self._faults("mps-daemon-placed")
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
            "layout": LAYOUT,
            "dir": str(root),
            "clientsDir": str(root / "clients"),  # what containers mount
            "pipeDir": str(root / "clients" / "pipe"),  # the serving daemon's pipe, once it holds its limits
            "stageDir": str(root / "stage"),  # where a daemon starts, out of the containers' reach
            "logDir": str(root / "log"),
            "shmDir": str(root / "shm"),
            "shmMounted": shm_mounted,
            "pid": pid,
            "visibleDevices": list(spec.visible_uuids),
            "computeModes": {},  # gpu uuid -> compute mode before we changed it
            "threadPercentage": spec.thread_percentage,
            "pinnedLimits": {u: format_mib(v) for u, v in sorted((spec.pinned_limits or {}).items())},
            "multiUser": spec.multi_user,
            "sharesServer": spec.shares_server,
            "startTime": None,  # with pid: the daemon's identity (see process_start_time)
        }

    def _launch(self, record: dict[str, Any]) -> None:
        """Start the control daemon detached (`-d` forks it into its own session: it is no child of ours and
        outlives this process) and learn its identity: pid from the pid file, checked to be an MPS control
        process, plus its start time."""
        start_dir = Path(record["stageDir"] if record.get("layout") == LAYOUT else record["pipeDir"])
        with contextlib.suppress(FileNotFoundError):
            (start_dir / PID_FILE).unlink()  # a previous daemon's; it is gone
        if self._pods is not None:
            # its own pod: pid and start time are the pod's business; the pod UID is the identity
            record["launcher"], record["pid"], record["startTime"] = "pod", None, None
            _save_record(record)  # before the pod exists: a crash leaves the name to find it by
            env = {**self._env(record), **daemon_limit_env(record), **pod_limit_env(limit_commands(record))}
            if record.get("layout") != LAYOUT:  # its pod mounts the pipe at the host path (mps_pods.py)
                env.update(CUDA_MPS_PIPE_DIRECTORY=record["pipeDir"], CUDA_MPS_LOG_DIRECTORY=record["logDir"])
            self._pods.launch(record, env)
            _save_record(record)
            return
        args = ["-d", "-M"] if record.get("multiUser") else ["-d"]
        self._run(
            record,
            args,
            None,
            what="starting the MPS control daemon",
            env=daemon_limit_env(record),
            at=str(start_dir),
        )
        pid = self._read_pid(start_dir)
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
        """After `alive` said the daemon runs: hold it and its running servers to the record's limits.

        The servers are what clients get: a server keeps the caps it was spawned with, so one spawned before
        the daemon had its limits (a restart, a tenant quick enough) or before they changed would serve
        without them for good (seen on the H200). Every server that appeared since the last check, and every
        server when the daemon restarted or the limits changed, is set by pid. For a daemon in a pod whose
        container restarted, the defaults are checked and set again where they differ. True when a daemon's
        defaults had to be set again; SharingError when setting failed."""
        latest = self.latest(record)
        applied = False
        # The daemon's own defaults (the next server's caps), once per daemon identity this process sees: a
        # pod's container restarted by the kubelet, a daemon started before this process, or limits saved
        # in the record by a process killed before it sent them (set_limits) are all checked here.
        identity = json.dumps(
            [latest.get("pid"), latest.get("startTime"), latest.get("podUid"),
             self._observed_restarts.get(latest["id"]), latest.get("threadPercentage"),
             latest.get("pinnedLimits")],
            sort_keys=True,
        )  # fmt: skip
        if self._defaults_checked.get(latest["id"]) != identity:
            if limit_commands(latest) and not self.holds_limits(latest):
                log.warning("MPS daemon without its limits; setting them again", id=latest["id"])
                self._wait_ready(latest, limit_commands(latest))
                applied = True
            self._defaults_checked[latest["id"]] = identity
        if not limit_commands(latest):
            return applied
        servers = self._server_lists.pop(latest["id"], None)
        if servers is None:
            servers = self.server_pids(latest)
        off = self._servers_off_limits(latest, servers)
        if off:
            log.warning("MPS servers without the daemon's limits; setting them", id=latest["id"], servers=off)
            self.commands(latest, server_limit_commands(latest, off))
            applied = True
        return applied

    def _servers_off_limits(self, record: Mapping[str, Any], servers: Sequence[int]) -> list[int]:
        """The running servers whose own limits are not the record's, asked in one control session. An
        answer that cannot be read as expected counts every server as off (setting them again is harmless)."""
        if not servers:
            return []
        queries: list[str] = []
        wanted: list[tuple[int, str | float]] = []
        for pid in servers:
            if record.get("threadPercentage") is not None:
                queries.append(f"get_active_thread_percentage {pid}")
                wanted.append((pid, float(record["threadPercentage"])))
            for uuid, value in sorted(record.get("pinnedLimits", {}).items()):
                queries.append(f"get_device_pinned_mem_limit {pid} {uuid}")
                wanted.append((pid, value))
        answers = [line.strip() for line in self.commands(record, queries).splitlines() if line.strip()]
        if len(answers) != len(wanted):
            return list(servers)
        off: set[int] = set()
        for (pid, value), answer in zip(wanted, answers, strict=True):
            if isinstance(value, float):
                try:
                    same = round(float(answer)) == round(value)
                except ValueError:
                    same = False
            else:
                same = _memory_mib(answer) == _memory_mib(value)
            if not same:
                off.add(pid)
        return sorted(off)

    def mount_shm(self, path: Path) -> bool:
        """A size-limited tmpfs for a /dev/shm at `path` (made if missing); False when it cannot be mounted
        (the directory is used as it is)."""
        path.mkdir(parents=True, exist_ok=True)
        return _is_mount_point(path) or self._mount_tmpfs(path)

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
        # the daemon's view (mps_namespace.py): its host directories are bound at these short paths
        env["CUDA_MPS_PIPE_DIRECTORY"] = DAEMON_PIPE_DIR
        env["CUDA_MPS_LOG_DIRECTORY"] = DAEMON_LOG_DIR
        libs = driver_layout.library_dirs(root)  # NVIDIA's search directories, e.g. lib64/ on GKE
        if libs:
            env["LD_LIBRARY_PATH"] = ":".join([*libs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
        # the control daemon starts nvidia-cuda-mps-server from its own directory (usr/bin, or bin/ on GKE)
        tools = os.path.dirname(driver_layout.binary_path(root, CONTROL_BINARY_NAME))
        env["PATH"] = tools + os.pathsep + env.get("PATH", "/usr/bin:/bin")
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
        at: str | None = None,
    ) -> str:
        """Run the control binary where the daemon's pipe directory (`at`, by default the one that serves:
        `control_dir`) is /tmp/nvidia-mps. A daemon serves one control session at a time and refuses a second
        at once (BUSY: the daemon pod's entrypoint, an admin's session); a command session is tried again
        until `timeout_s` has passed."""
        binary = driver_layout.binary_path(self._hardware.driver_root(), CONTROL_BINARY_NAME)
        argv = in_daemon_view(at or control_dir(record), record["logDir"], [binary, *args])
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while True:
            try:
                done = subprocess.run(
                    argv,
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

    def command(
        self, record: Mapping[str, Any], line: str, timeout_s: float = 30, at: str | None = None
    ) -> str:
        """Send one control command (`echo line | nvidia-cuda-mps-control`); raise SharingError on failure."""
        return self._run(
            record, [], line + "\n", what=f"MPS control command {line!r}", timeout_s=timeout_s, at=at
        )

    def commands(self, record: Mapping[str, Any], lines: Sequence[str], timeout_s: float = 30) -> str:
        """Several control commands in one session (one start of the control binary)."""
        if not lines:
            return ""
        what = f"MPS control commands ({'; '.join(lines)})"
        return self._run(record, [], "\n".join(lines) + "\n", what=what, timeout_s=timeout_s)

    def server_pids(self, record: Mapping[str, Any]) -> list[int]:
        """The MPS servers the daemon runs now (`get_server_list`)."""
        return parse_server_list(self.command(record, "get_server_list", timeout_s=5))

    def set_limits(
        self, record: dict[str, Any], thread_percentage: int | None, pinned_limits: Mapping[str, int]
    ) -> None:
        """Change a running daemon's limits: its defaults (the next server) and every server it runs now.
        The record (and its copy beside the daemon) is updated first, so that a daemon restarted after a
        crash in between gets them. For a shares server the record is not what the reconcile pass holds it
        to: the registry's shares are (manager.py), so caps saved here for a join that then fails never
        reach a server."""
        self.record_limits(record, thread_percentage, pinned_limits)
        self._faults("mps-limits-recorded")
        self.apply_limits(record)

    def record_limits(
        self, record: dict[str, Any], thread_percentage: int | None, pinned_limits: Mapping[str, int]
    ) -> bool:
        """Put these limits in the record and its copy beside the daemon, sending nothing; True when they
        changed."""
        pinned = {u: format_mib(v) for u, v in sorted(pinned_limits.items())}
        if (record.get("threadPercentage"), record.get("pinnedLimits")) == (thread_percentage, pinned):
            return False
        record["threadPercentage"] = thread_percentage
        record["pinnedLimits"] = pinned
        _save_record(record)
        return True

    def apply_limits(self, record: Mapping[str, Any]) -> None:
        """Send the record's limits to the running daemon: its defaults and each server it runs now."""
        servers = self.server_pids(record)
        self.commands(record, limit_commands(record) + server_limit_commands(record, servers))

    def _wait_ready(
        self, record: Mapping[str, Any], limits: Sequence[str] = (), *, at: str | None = None
    ) -> None:
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
                self._run(record, [], "\n".join(lines) + "\n", what=what, timeout_s=remaining, at=at)
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
            answer = self.command(record, "get_server_list", timeout_s=5)
        except SharingError as err:
            return BUSY in str(err)
        # the reconcile pass asks `alive`, then `ensure_limits`: one control session serves both
        self._server_lists[record["id"]] = parse_server_list(answer)
        return True

    def restart(self, record: dict[str, Any]) -> None:
        """Start the daemon of `record` again (same limits, same `clients` directory for the containers), e.g.
        after it died or was killed. It starts in a fresh `stage/` and takes the place of the dead one's pipe
        only once it holds its limits, so no client reaches it before. Containers that bind-mounted the
        clients and shm directories keep working with the new daemon. Updates the record's identity."""
        root = Path(record["dir"])
        staged = record.get("layout") == LAYOUT
        if staged:
            if self._pods is None and Path(record["stageDir"]).is_dir():
                # A restart cut short (the plugin killed after launching; the saved record names that daemon)
                # left its daemon running here, unplaced: clearing `stage/` would orphan it (found by the
                # soak, tests/soak). Stop it first.
                self._stop_unplaced(self.latest(record), record["stageDir"])
            shutil.rmtree(record["stageDir"], ignore_errors=True)  # what a dead daemon may have left there
        for name in ("clients", "stage", "log", "shm") if staged else ("pipe", "log", "shm"):
            (root / name).mkdir(parents=True, exist_ok=True)
        if record.get("shmMounted") and not _is_mount_point(root / "shm"):
            record["shmMounted"] = self._mount_tmpfs(root / "shm")
        for uuid in record.get("computeModes", {}):
            self._hardware.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_PROCESS)
        try:
            self._launch(record)
            self._faults("mps-daemon-started")
            if staged:
                self._wait_ready(record, limit_commands(record), at=record["stageDir"])
                place(Path(record["stageDir"]), Path(record["pipeDir"]))
            else:
                self._wait_ready(record, limit_commands(record))
        except (SharingError, HardwareError, OSError):
            # The daemon may already run (e.g. its record could not be saved: a full disk). Left running it is
            # orphaned: the next reconcile pass clears `stage/` and starts another, one leaked daemon per pass
            # (found by the soak, tests/soak). Stop it; the next pass tries again from scratch. (A daemon pod
            # is found by its UID and its container restarted by the kubelet: that path keeps its own course.)
            if self._pods is None:
                self._stop_unplaced(record, record["stageDir"] if staged else record["pipeDir"])
            raise
        log.info("MPS daemon restarted", id=record["id"], pid=record["pid"])

    def _stop_unplaced(self, record: Mapping[str, Any], where: str) -> None:
        """Stop a daemon that `restart` started at `where` and could not finish: `quit` on its pipe, then
        its recorded process (pid and start time: never another process) if it is still there."""
        with contextlib.suppress(SharingError, OSError):
            self.command(record, "quit", timeout_s=self._stop_timeout_s, at=where)
        pid, start_time = record.get("pid"), record.get("startTime")
        if pid is not None and not _wait_gone(pid, start_time, self._stop_timeout_s):
            with contextlib.suppress(ProcessLookupError):
                if same_process(pid, start_time):
                    os.kill(pid, signal.SIGKILL)

    def place_staged(self, record: Mapping[str, Any]) -> bool:
        """A daemon pod's container restarted by the kubelet starts its daemon in `stage/` (its hostPath):
        when one answers there, give it its limits and put it where the clients look. True when it did."""
        latest = self.latest(record)
        stage = latest.get("stageDir")
        if latest.get("layout") != LAYOUT or not stage or not Path(stage).is_dir():
            return False
        try:
            self.command(latest, "get_server_list", timeout_s=2, at=stage)
        except SharingError:
            return False
        self._wait_ready(latest, limit_commands(latest), at=stage)
        place(Path(stage), Path(latest["pipeDir"]))
        log.info("restarted MPS daemon put in place with its limits", id=latest["id"])
        return True

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
        else:
            # the serving daemon, and one still in `stage/` (a crash before it was put in place)
            for where in (record["pipeDir"], record.get("stageDir")):
                if not where or not Path(where).is_dir():
                    continue
                try:
                    self.command(record, "quit", timeout_s=self._stop_timeout_s, at=where)
                except SharingError as err:
                    if same_process(pid, start_time) and NOT_RUNNING not in str(err):
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
        # the daemon's /dev/shm, and those of a shares server's claims that are still there (a crash)
        for shm in [Path(record["shmDir"]), *sorted(Path(record["dir"]).glob("claims/*/shm"))]:
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


def control_dir(record: Mapping[str, Any]) -> str:
    """The pipe directory of the daemon that serves: `clients/pipe` once placed, else `stage/` (a daemon still
    starting, or left there by a crash); the pipe directory itself for records of layout 1."""
    if record.get("layout") == LAYOUT and not os.path.isdir(record["pipeDir"]):
        return str(record["stageDir"])
    return str(record["pipeDir"])


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
