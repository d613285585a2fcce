"""The node's device model, and its re-discovery while the plugin runs.

The hardware changes under a running plugin: an administrator switches MIG mode or creates MIG devices out of
band, a GPU falls off the bus (NVML then fails for it and discovery leaves it out). `Rediscovery` rebuilds the
model every `interval_s` seconds and whenever `trigger()` is called (SIGHUP), and hands a model that differs
from the last one to `on_change` (the ResourceSlice controller's `update_model`). A discovery that finds no
GPU at all because NVML itself failed keeps the previous model: withdrawing every device of the node because
the driver hiccuped once would make the scheduler move work away for nothing.

MIG devices that exist are told apart by `owned_mig` (the prepare service's `owned_mig_placements`, read from
the checkpoint): the ones our claims own leave the model as it is, any other is published as it is and hides
what it overlaps (`build_device_model`). The owned set is read before AND after discovering, and the union
used: the checkpoint lock serialises with prepare/unprepare, so an instance a prepare created while the
hardware was read is in the second read, and one an unprepare destroyed meanwhile is in the first; either way
our own MIG changes never show up as out-of-band devices. Until a source is connected every instance counts
as ours (what is ours is unknown before the checkpoint is read; hiding a prepared claim's device would be
worse than offering an occupied placement). `on_discovery` gets every successful discovery (the sharing
manager's `refresh`, so prepares act on current GPU facts).

Start-up order (the composition root): build the inventory (hardware check), start the prepare service (load
the checkpoint, destroy leftover MIG devices of our own), `connect` the owned set and `refresh`, then publish.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection

import structlog

from dra_gpu.hardware.interface import GpuHardware, HardwareError
from dra_gpu.hardware.types import DiscoveryResult
from dra_gpu.inventory.device_model import ModelOptions, build_device_model
from dra_gpu.inventory.model import DeviceModel

log = structlog.get_logger(__name__)


class DiscoveryFailedError(Exception):
    """NVML could not enumerate the GPUs at all; the message says why."""


# (parent GPU UUID, GPU-instance id) of the MIG instances our checkpointed claims own
OwnedMigSource = Callable[[], Collection[tuple[str, int]]]
# called with each successful discovery and when it began (time.monotonic())
DiscoveryListener = Callable[[DiscoveryResult, float], None]


class DeviceInventory:
    """The node's device model, built from the hardware at construction; `refresh()` re-discovers."""

    last_discovery: tuple[DiscoveryResult, float]  # the latest successful discovery and when it began

    def __init__(
        self,
        hardware: GpuHardware,
        options: ModelOptions | None = None,
        *,
        owned_mig: OwnedMigSource | None = None,
        on_discovery: DiscoveryListener | None = None,
    ) -> None:
        self.hardware = hardware
        self.options = options or ModelOptions()
        self._owned_mig = owned_mig
        self._on_discovery = on_discovery
        self._lock = threading.Lock()
        # the inputs of the last model built and the model: equal inputs give an equal model
        self._built: tuple[DiscoveryResult, frozenset[tuple[str, int]], DeviceModel] | None = None
        self._model = self._build(initial=True)

    def connect(self, *, owned_mig: OwnedMigSource, on_discovery: DiscoveryListener | None = None) -> None:
        """Use `owned_mig` (and tell `on_discovery`) from the next `refresh()` on: once the prepare service
        has started, the checkpoint says which MIG instances are ours."""
        self._owned_mig = owned_mig
        self._on_discovery = on_discovery

    def _owned(self) -> frozenset[tuple[str, int]] | None:
        """The owned set now; None while no source is connected (not known yet)."""
        if self._owned_mig is None:
            return None
        try:
            return frozenset(self._owned_mig())
        except Exception as exc:  # e.g. the checkpoint lock timed out: publishing guesses would be worse
            raise DiscoveryFailedError(f"cannot read which MIG devices prepared claims own: {exc}") from exc

    def _build(self, *, initial: bool = False) -> DeviceModel:
        owned_before = self._owned()
        started_at = time.monotonic()
        discovery = self.hardware.discover()
        for error in discovery.errors:
            log.warning("GPU discovery problem", gpu_index=error.gpu_index, error=error.message)
        global_errors = [e.message for e in discovery.errors if e.gpu_index is None]
        if not initial and not discovery.gpus and global_errors:
            raise DiscoveryFailedError("; ".join(global_errors))
        owned_after = self._owned()
        if owned_before is None or owned_after is None:
            # Not connected (yet): which instances are ours is unknown, so take them all for ours, which
            # keeps the model as it was before out-of-band devices were told apart, rather than hide the
            # devices of prepared claims.
            owned = frozenset((g.uuid, i.gi_id) for g in discovery.gpus for i in g.mig_instances)
        else:
            owned = owned_before | owned_after  # why both: see the module docstring
        built = self._built
        if built is not None and built[0] == discovery and built[1] == owned:
            # Nothing changed (the start-up refresh on a node without MIG devices, most re-discoveries):
            # the model is a pure function of these, and building a DGX's costs ~25 ms.
            model = built[2]
        else:
            model = build_device_model(discovery, self.options, owned_mig=owned)
            self._built = (discovery, owned, model)
        self.last_discovery = (discovery, started_at)
        if self._on_discovery is not None:
            self._on_discovery(discovery, started_at)
        return model

    def model(self) -> DeviceModel:
        with self._lock:
            return self._model

    def refresh(self) -> tuple[DeviceModel, bool]:
        """Discover again: (the current model, whether it changed). Raises DiscoveryFailedError or
        HardwareError, keeping the previous model."""
        model = self._build()
        with self._lock:
            changed = model != self._model
            previous, self._model = self._model, model
        for warning in model.warnings:
            if warning not in previous.warnings:  # e.g. MIG devices made out of band: say so once
                log.warning("device model", warning=warning)
        return model, changed


class Rediscovery:
    """A thread that refreshes `inventory` periodically and on `trigger()`, calling `on_change(model)` when
    the model changed."""

    def __init__(
        self,
        inventory: DeviceInventory,
        on_change: Callable[[DeviceModel], None],
        interval_s: float,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"rediscovery interval must be > 0 seconds, got {interval_s:g}")
        self.inventory = inventory
        self.on_change = on_change
        self.interval_s = interval_s
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0  # completed rediscoveries, for diagnostics

    def trigger(self) -> None:
        """Re-discover now (safe from a signal handler: only sets an event)."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rediscovery", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_once(self) -> bool:
        """One rediscovery; True when the model changed (and `on_change` was called)."""
        try:
            model, changed = self.inventory.refresh()
        except (DiscoveryFailedError, HardwareError) as exc:
            log.error("re-discovery failed; keeping the previous device model", error=str(exc))
            return False
        except Exception as exc:  # e.g. the simulator's state file gone: the same answer, with the cause
            log.error("re-discovery crashed; keeping the previous device model", error=repr(exc))
            return False
        finally:
            self.rounds += 1
        if changed:
            log.info("device inventory changed; republishing", devices=len(model.devices))
            self.on_change(model)
        return changed

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.run_once()
            except Exception:  # a bug in one round must not end re-discovery for good
                log.exception("re-discovery crashed")
