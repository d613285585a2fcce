"""Device health: watch NVML for XID events and lost GPUs, publish the result as device taints.

`HealthMonitor` runs one thread: it waits on the NVML event set (`NvmlHealthEvents`) for up to `wait_s`,
records an XID, then probes every GPU (does NVML answer, does the driver still ask for a reset) and lets
`dra_gpu.inventory.device_health` decide what is lost and what has recovered. Each change bumps `version` and
calls `on_change` (republish the slices, push a health message).

With a `state_file` (the plugin directory's `device-health.json`) the XIDs and lost GPUs survive a plugin
restart: taints stay until the GPU has really recovered, not until the plugin restarts. At start the first
probe round then decides whether a GPU recovered (was reset) while the plugin was down.

`HealthView` joins the inventory's model with the monitor's findings: `model()` is the model with taints (the
slice controller's and the health stream's source), cached so an unchanged model stays the same object.

Flags (`add_device_health_args`): `--device-health-check` [DEVICE_HEALTH_CHECK] (default true),
`--additional-xids-to-ignore` [ADDITIONAL_XIDS_TO_IGNORE], `--device-health-recovery-seconds`
[DEVICE_HEALTH_RECOVERY_SECONDS] (default 300: quiet period after the GPU proved healthy; negative: never
remove XID taints), `--device-health-taint-effect` [DEVICE_HEALTH_TAINT_EFFECT] (NoSchedule or NoExecute),
`--device-health-poll-seconds` [DEVICE_HEALTH_POLL_SECONDS] (default 5).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from dra_gpu.checkpoint.atomic_file import atomic_write
from dra_gpu.hardware.health_events import GpuLostError, NvmlHealthEvents
from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.nvml_hardware import NvmlHardware
from dra_gpu.hardware.types import XidEvent
from dra_gpu.inventory.device_health import (
    GpuHealth,
    HealthPolicy,
    after_probe,
    apply_health,
    health_from_json,
    health_to_json,
    parse_xid_list,
    record_xid,
)
from dra_gpu.inventory.model import DeviceModel

log = structlog.get_logger(__name__)

REGISTER_RETRY_S = 60.0  # how often registration is tried again for unmonitored GPUs
# The event wait is cut into slices this long so that stop() returns within one (a plugin restart or upgrade
# waited up to the whole poll interval, 5 s, on the thread); each slice is one blocking NVML call.
STOP_SLICE_S = 0.25


class HealthMonitor:
    def __init__(
        self,
        events: NvmlHealthEvents,
        policy: HealthPolicy,
        *,
        wait_s: float = 5.0,
        on_change: Callable[[], None] | None = None,
        state_file: Path | None = None,
    ) -> None:
        self._events = events
        self._state_file = state_file
        self.policy = policy
        self._wait_s = wait_s
        self.on_change = on_change
        self._lock = threading.Lock()
        self._health: dict[str, GpuHealth] = {}
        self.version = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_register = 0.0

    def snapshot(self) -> dict[str, GpuHealth]:
        with self._lock:
            return dict(self._health)

    # ---- lifecycle ----
    def start(self) -> None:
        self._load()
        if self._register(self._events.gpus):
            self._changed()
        self._thread = threading.Thread(target=self._run, name="device-health", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._events.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # keep monitoring; NVML hiccups must not end health checks for good
                log.exception("device health check failed")
                self._stop.wait(self._wait_s)

    # ---- one round ----
    def step(self) -> bool:
        """Wait for one event (or the timeout), then probe every GPU. True when health changed."""
        changed = False
        lost_signal = False
        try:
            event = self._wait_event()
        except GpuLostError:
            event, lost_signal = None, True
        except HardwareError as err:
            log.warning("NVML event wait failed; registering again", error=str(err))
            self._stop.wait(self._wait_s)
            if self._register([u for u in self._events.gpus if u in self._events.registered]):
                self._changed()
                return True
            return False
        if event is not None and event.gpu_uuid in self._events.gpus:
            log.warning("XID event", gpu=event.gpu_uuid, xid=event.xid, gi=event.gi_id, ci=event.ci_id)
            with self._lock:
                self._health[event.gpu_uuid] = record_xid(self._health.get(event.gpu_uuid), event)
            changed = True
        changed |= self._probe_all(lost_signal)
        if changed:
            self._changed()
        return changed

    def _wait_event(self) -> XidEvent | None:
        """One event, or None after `wait_s` (or as soon as stop() is called)."""
        deadline = time.monotonic() + self._wait_s
        while True:
            left = deadline - time.monotonic()
            event = self._events.wait(max(min(left, STOP_SLICE_S), 0.001))
            if event is not None or left <= STOP_SLICE_S or self._stop.is_set():
                return event

    def _probe_all(self, lost_signal: bool) -> bool:
        now = time.time()
        answering: list[str] = []
        changed = False
        for uuid in self._events.gpus:
            probe = self._events.probe(uuid)
            if probe.answering:
                answering.append(uuid)
            with self._lock:
                current = self._health.get(uuid)
                if current is None and probe.answering:
                    continue
                updated = after_probe(current or GpuHealth(uuid), probe, now, self.policy)
                if updated != current:
                    changed = True
                    if updated.lost_since is not None and (current is None or current.lost_since is None):
                        log.warning("GPU lost", gpu=uuid, error=probe.error)
                    if updated.clean:
                        self._health.pop(uuid, None)
                        log.info("GPU healthy again", gpu=uuid)
                    else:
                        self._health[uuid] = updated
        registered = self._events.registered
        unmonitored = set(self._events.unmonitored)
        retry_unmonitored = bool(unmonitored) and now - self._last_register >= REGISTER_RETRY_S
        newly_lost = registered - set(answering)
        back = set(answering) - registered - unmonitored
        if newly_lost or back or retry_unmonitored:
            # lost GPUs leave the event set (their wait fails); GPUs answering again come back
            changed |= self._register(answering)
        elif lost_signal and len(answering) == len(self._events.gpus):
            self._stop.wait(self._wait_s)  # the wait keeps failing though every GPU answers: do not spin
        return changed

    def _register(self, gpus: list[str]) -> bool:
        self._last_register = time.time()
        self._events.register(gpus)
        return self._sync_unmonitored()

    def _sync_unmonitored(self) -> bool:
        reasons = self._events.unmonitored
        changed = False
        with self._lock:
            for uuid in self._events.gpus:
                current = self._health.get(uuid) or GpuHealth(uuid)
                reason = reasons.get(uuid)
                if uuid in self._events.registered:
                    reason = None
                elif reason is None:
                    reason = current.unmonitored  # not tried this time (lost): keep what we knew
                if reason != current.unmonitored:
                    changed = True
                    updated = GpuHealth(uuid, current.xids, current.last_xid_time, current.lost_since, reason)
                    if updated.clean:
                        self._health.pop(uuid, None)
                    else:
                        self._health[uuid] = updated
                    if reason:
                        log.warning("GPU not monitored", gpu=uuid, reason=reason)
        return changed

    def _load(self) -> None:
        if self._state_file is None or not self._state_file.exists():
            return
        try:
            saved = health_from_json(json.loads(self._state_file.read_text()))
        except (OSError, ValueError) as err:  # a broken file must not stop health checks: start afresh
            log.warning(
                "device health state unreadable, starting afresh", file=str(self._state_file), error=str(err)
            )
            return
        with self._lock:
            self._health.update({u: h for u, h in saved.items() if u in self._events.gpus})
            if self._health:
                self.version += 1
                log.info("device health restored", gpus=sorted(self._health))

    def _save(self) -> None:
        if self._state_file is None:
            return
        with self._lock:
            data = json.dumps(health_to_json(self._health), indent=1).encode()
        try:
            self._state_file.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
            atomic_write(self._state_file, data, error=OSError, mode=0o644)
        except OSError as err:
            log.warning("device health state not saved", file=str(self._state_file), error=str(err))

    def _changed(self) -> None:
        with self._lock:
            self.version += 1
        self._save()
        if self.on_change is not None:
            self.on_change()


class HealthView:
    """The inventory's model with the monitor's health taints."""

    def __init__(self, base_model: Callable[[], DeviceModel], monitor: HealthMonitor | None) -> None:
        self._base_model = base_model
        self.monitor = monitor
        self._lock = threading.Lock()
        self._cache: tuple[DeviceModel, int, DeviceModel] | None = None

    def model(self) -> DeviceModel:
        return self.with_health(self._base_model())

    def with_health(self, base: DeviceModel) -> DeviceModel:
        if self.monitor is None:
            return base
        version = self.monitor.version
        with self._lock:
            if self._cache is not None and self._cache[0] is base and self._cache[1] == version:
                return self._cache[2]
        tainted = apply_health(base, self.monitor.snapshot(), self.monitor.policy)
        with self._lock:
            self._cache = (base, version, tainted)
        return tainted

    def stop(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()


def _env(name: str, default: str) -> str:
    value = os.environ.get(name)
    return value if value else default


def add_device_health_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device-health-check",
        default=_env("DEVICE_HEALTH_CHECK", "true"),
        choices=["true", "false"],
        help="watch NVML for XID errors and lost GPUs and taint the affected devices [DEVICE_HEALTH_CHECK] "
        "(default: true)",
    )
    parser.add_argument(
        "--additional-xids-to-ignore",
        default=_env("ADDITIONAL_XIDS_TO_IGNORE", ""),
        help="comma-separated XIDs that only get an effect-None taint, on top of 13,31,43,45,68,109 "
        "[ADDITIONAL_XIDS_TO_IGNORE]",
    )
    parser.add_argument(
        "--device-health-recovery-seconds",
        type=float,
        default=float(_env("DEVICE_HEALTH_RECOVERY_SECONDS", "300")),
        help="XID taints go only once the GPU proved healthy (NVML reports no recovery action needed, or a "
        "reset was seen) and then had no XID for this long; never on the timer alone; negative: never "
        "[DEVICE_HEALTH_RECOVERY_SECONDS] (default: 300)",
    )
    parser.add_argument(
        "--device-health-taint-effect",
        default=_env("DEVICE_HEALTH_TAINT_EFFECT", "NoSchedule"),
        choices=["NoSchedule", "NoExecute"],
        help="effect of the taints for fatal errors (critical XIDs, double-bit ECC, GPU lost): NoSchedule "
        "keeps new work away; NoExecute also evicts pods using the device [DEVICE_HEALTH_TAINT_EFFECT] "
        "(default: NoSchedule)",
    )
    parser.add_argument(
        "--device-health-poll-seconds",
        type=float,
        default=float(_env("DEVICE_HEALTH_POLL_SECONDS", "5")),
        help="longest NVML event wait between GPU probes [DEVICE_HEALTH_POLL_SECONDS] (default: 5)",
    )


HEALTH_STATE_FILE = "device-health.json"


def start_device_health(
    args: argparse.Namespace,
    hardware: NvmlHardware,
    base_model: Callable[[], DeviceModel],
    state_dir: Path | None = None,
) -> HealthView:
    """The health view for the plugin; with `--device-health-check=true` its monitor is running.

    `state_dir` (the plugin directory) keeps the findings across restarts. Raises ValueError for a bad
    flag value. NVML failing to set up events does not stop the plugin: the
    view then has no monitor and the reason is logged.
    """
    if args.device_health_poll_seconds <= 0:
        raise ValueError(
            f"--device-health-poll-seconds must be > 0 seconds, got {args.device_health_poll_seconds:g}"
        )
    policy = HealthPolicy(
        additional_ignored_xids=parse_xid_list(args.additional_xids_to_ignore),
        recovery_quiet_s=args.device_health_recovery_seconds,
        fatal_effect=args.device_health_taint_effect,
    )
    if args.device_health_check != "true":
        return HealthView(base_model, None)
    try:
        events = NvmlHealthEvents(hardware.nvml_module())
    except Exception as err:  # NVML without event support: run without health checks rather than not at all
        log.error("device health check unavailable", error=str(err))
        return HealthView(base_model, None)
    state_file = state_dir / HEALTH_STATE_FILE if state_dir is not None else None
    monitor = HealthMonitor(events, policy, wait_s=args.device_health_poll_seconds, state_file=state_file)
    monitor.start()
    return HealthView(base_model, monitor)
