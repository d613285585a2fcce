"""MPS: control daemons started by the plugin, their limits, and the container edits that connect to them.

A daemon is a real, detached process: `<driver root>/usr/bin/nvidia-cuda-mps-control -d` with
`CUDA_VISIBLE_DEVICES` (the UUIDs it serves), `CUDA_MPS_PIPE_DIRECTORY` and `CUDA_MPS_LOG_DIRECTORY` pointing
at `<plugin dir>/mps/<id>/{pipe,log}`. Its clients share `<plugin dir>/mps/<id>/shm`, a size-limited tmpfs
like NVIDIA's (`size=MemTotal/2`), mounted at the containers' `/dev/shm`; when mounting is not possible the
directory is used as it is and the record says so (`shmMounted: false`). Before the daemon starts, the full
GPUs it serves are switched to compute mode EXCLUSIVE_PROCESS, so that only the MPS server can open them; the
previous mode is restored when the daemon stops.

Readiness is proven before prepare returns: the daemon must answer `get_server_list` through its control pipe
and have written its log. Limits go through the control pipe (`set_default_active_thread_percentage N`,
`set_default_device_pinned_mem_limit <uuid> <N>M`); per-client limits go into the container environment
(`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`). The daemon outlives a plugin
restart: everything needed to stop it (pid, directories, mount, compute modes) is in the returned record,
which the caller checkpoints. Stopping sends `quit`, waits, then kills the recorded pid if it is still an MPS
process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dra_gpu.config.quantity import format_mib
from dra_gpu.hardware.interface import GpuHardware, HardwareError
from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.interface import CdiEdits, CdiMount, SharingError

log = structlog.get_logger(__name__)

CONTROL_BINARY = "usr/bin/nvidia-cuda-mps-control"
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
CONTAINER_SHM_DIR = "/dev/shm"
PID_FILE = "nvidia-cuda-mps-control.pid"  # written by the simulated daemon; absent on some real drivers
LOG_FILE = "control.log"
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


def client_edits(
    record: Mapping[str, Any], thread_percentage: int | None, pinned_limits: Mapping[str, int]
) -> CdiEdits:
    """What a container needs to be an MPS client of the daemon in `record`, with its own limits."""
    env = [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"]
    if thread_percentage is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={thread_percentage}")
    if pinned_limits:
        limits = ",".join(f"{uuid}={format_mib(value)}" for uuid, value in sorted(pinned_limits.items()))
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={limits}")
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
    ) -> None:
        self._hardware = hardware
        self._base = plugin_dir / "mps"
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._mount_shm = mount_shm

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
            for name in ("pipe", "log", "shm"):
                (root / name).mkdir(parents=True, exist_ok=True)
            record["shmMounted"] = self._mount_tmpfs(root / "shm")
            _save_record(record)
            for uuid in spec.exclusive_gpus:
                record["computeModes"][uuid] = int(self._hardware.get_compute_mode(uuid))
                self._hardware.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_PROCESS)
                _save_record(record)
            self._run(record, ["-d"], None, what="starting the MPS control daemon")
            record["pid"] = self._read_pid(root / "pipe")
            _save_record(record)
            self._wait_ready(record)
            limits = [
                f"set_default_device_pinned_mem_limit {uuid} {format_mib(value)}"
                for uuid, value in sorted((spec.pinned_limits or {}).items())
            ]
            if spec.thread_percentage is not None:
                limits.insert(0, f"set_default_active_thread_percentage {spec.thread_percentage}")
            if limits:  # one client run for all of them: each run of the control binary costs a process start
                self._run(
                    record, [], "\n".join(limits) + "\n", what=f"setting MPS limits ({'; '.join(limits)})"
                )
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
        }

    def _mount_tmpfs(self, path: Path) -> bool:
        if not self._mount_shm:
            return False
        size = _shm_size()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"{SHM_OPTIONS},size={size}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        if done.returncode != 0:
            log.warning(
                "cannot mount tmpfs for MPS shared memory; using a plain directory (size not limited)",
                path=str(path),
                error=(done.stderr or done.stdout).strip(),
            )
            return False
        return True

    def _env(self, record: Mapping[str, Any]) -> dict[str, str]:
        root = self._hardware.driver_root()
        env = dict(os.environ)
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
    ) -> str:
        binary = os.path.join(self._hardware.driver_root(), CONTROL_BINARY)
        try:
            done = subprocess.run(
                [binary, *args],
                input=stdin,
                capture_output=True,
                text=True,
                env=self._env(record),
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SharingError(f"{what}: {err}") from None
        if done.returncode != 0:
            output = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise SharingError(f"{what}: {output}")
        return done.stdout

    def command(self, record: Mapping[str, Any], line: str, timeout_s: float = 30) -> str:
        """Send one control command (`echo line | nvidia-cuda-mps-control`); raise SharingError on failure."""
        return self._run(record, [], line + "\n", what=f"MPS control command {line!r}", timeout_s=timeout_s)

    def _wait_ready(self, record: Mapping[str, Any]) -> None:
        deadline = time.monotonic() + self._ready_timeout_s
        delay = 0.01
        last = "no answer"
        log_file = Path(record["logDir"]) / LOG_FILE
        while True:
            try:
                remaining = max(deadline - time.monotonic(), 0.5)
                self.command(record, "get_server_list", timeout_s=remaining)
                if log_file.exists():
                    return
                last = f"{log_file} was not written"
            except SharingError as err:
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
        try:
            self.command(record, "get_server_list", timeout_s=5)
            return True
        except SharingError:
            return False

    def restart(self, record: dict[str, Any]) -> None:
        """Start the daemon of `record` again in place (same directories, mount and limits), e.g. after the
        plugin's container was restarted and took the daemon with it. Containers that bind-mounted the pipe
        and
        shm directories keep working with the new daemon, so nothing is removed. Updates `record["pid"]`."""
        root = Path(record["dir"])
        for name in ("pipe", "log", "shm"):
            (root / name).mkdir(parents=True, exist_ok=True)
        if record.get("shmMounted") and not _is_mount_point(root / "shm"):
            record["shmMounted"] = self._mount_tmpfs(root / "shm")
        with contextlib.suppress(FileNotFoundError):
            (root / "pipe" / PID_FILE).unlink()  # the previous daemon's; it is gone
        for uuid in record.get("computeModes", {}):
            self._hardware.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_PROCESS)
        self._run(record, ["-d"], None, what="restarting the MPS control daemon")
        record["pid"] = self._read_pid(root / "pipe")
        _save_record(record)
        self._wait_ready(record)
        limits = [
            f"set_default_device_pinned_mem_limit {uuid} {value}"
            for uuid, value in sorted(record.get("pinnedLimits", {}).items())
        ]
        if record.get("threadPercentage") is not None:
            limits.insert(0, f"set_default_active_thread_percentage {record['threadPercentage']}")
        if limits:
            self._run(record, [], "\n".join(limits) + "\n", what="setting MPS limits again")
        log.info("MPS daemon restarted", id=record["id"], pid=record["pid"])

    def daemon_dirs(self) -> list[Path]:
        return sorted(p for p in self._base.iterdir() if p.is_dir()) if self._base.is_dir() else []

    # ---- stop ----------------------------------------------------------------------------------------------

    def stop(self, record: Mapping[str, Any]) -> list[str]:
        """Stop the daemon, unmount, remove its dir, restore compute modes. Idempotent; returns problems."""
        problems: list[str] = []
        # The pid file names the daemon that runs now (it may have been restarted since the record was made).
        pid = self._read_pid(Path(record["pipeDir"])) or record.get("pid")
        if Path(record["pipeDir"]).is_dir():
            try:
                self.command(record, "quit", timeout_s=self._stop_timeout_s)
            except SharingError as err:
                if _alive_mps(pid):
                    log.warning("MPS quit failed; will kill", id=record["id"], error=str(err))
        if pid is not None and not _wait_gone(pid, self._stop_timeout_s):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if _alive_mps(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
                    if _wait_gone(pid, self._stop_timeout_s):
                        break
            if _alive_mps(pid):
                problems.append(f"MPS daemon {record['id']} (pid {pid}) does not exit")
        shm = Path(record["shmDir"])
        if _is_mount_point(shm):
            done = subprocess.run(
                ["umount", str(shm)], capture_output=True, text=True, check=False, timeout=30
            )
            if done.returncode != 0:
                problems.append(f"cannot unmount {shm}: {(done.stderr or done.stdout).strip()}")
        if not problems:
            shutil.rmtree(record["dir"], ignore_errors=True)
            if Path(record["dir"]).exists():
                problems.append(f"cannot remove {record['dir']}")
        for uuid, mode in sorted(record.get("computeModes", {}).items()):
            try:
                self._hardware.set_compute_mode(uuid, ComputeMode(mode))
            except (HardwareError, ValueError) as err:
                problems.append(f"restoring compute mode of GPU {uuid}: {err}")
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
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as info:
            for line in info:
                fields = line.split()
                if len(fields) > 4 and fields[4].replace("\\040", " ") == target:
                    return True
    except OSError:
        return os.path.ismount(target)
    return False


def _alive_mps(pid: int | None) -> bool:
    """The pid runs and is an MPS control process (guards against killing a reused pid)."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    if state in ("Z", "X"):
        return False  # a zombie has exited; whoever reaps it is not our business
    return b"nvidia-cuda-mps-control" in cmdline or b"mps_control" in cmdline


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive_mps(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
