"""The seam between the prepare service (plugin) and the sharing machinery.

The plugin resolves a claim's allocation into groups of devices that share one opaque config, then asks a
`SharingManager` to apply each group's config (time-slicing, MPS, dynamic MIG creation). What the manager did
is returned as a JSON-serialisable `state`, written into the checkpoint, and handed back to `unprepare_group`
so the undo works after a plugin restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dra_gpu.hardware.types import MigInstance
from dra_gpu.inventory.model import Device


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of our driver, joined with what the device model says about that device."""

    request: str  # "req" or "req/sub" as in the allocation result
    pool: str
    device: Device
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)  # capacity name -> quantity string


@dataclass(frozen=True)
class CdiMount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ("rw", "nosuid", "nodev", "bind")


@dataclass(frozen=True)
class CdiDeviceNode:
    path: str  # path in the container
    host_path: str | None = None


@dataclass(frozen=True)
class CdiEdits:
    """Container edits in CDI terms (env as "KEY=VALUE")."""

    env: tuple[str, ...] = ()
    mounts: tuple[CdiMount, ...] = ()
    device_nodes: tuple[CdiDeviceNode, ...] = ()


@dataclass(frozen=True)
class GroupResult:
    state: Mapping[str, Any]  # JSON-serialisable; everything unprepare_group needs, checkpointed
    edits: CdiEdits  # applied to every device of the group
    mig_instances: Mapping[str, MigInstance] = field(default_factory=dict)  # device name -> created instance
    # False when the group changed nothing that unprepare_group undoes (no MIG instance, MPS daemon or share,
    # time slice): the prepare then need not record the group before it goes on (PrepareService._apply).
    undo_needed: bool = True


class SharingError(Exception):
    """A sharing action failed; the message names the device and the cause. Nothing is left behind."""


class SharingManager(Protocol):
    def prepare_group(
        self, claim_uid: str, config: object | None, devices: Sequence[AllocatedDevice]
    ) -> GroupResult:
        """Apply `config` (a decoded GpuConfig/MigDeviceConfig, or None for defaults) to the devices.

        Creates dynamic MIG devices, sets time-slicing, starts the group's MPS daemon or joins its GPU's
        shares server (a fractional share: its limits go into the returned env). On failure rolls back what
        it did and raises SharingError.
        """
        ...

    def unprepare_group(self, claim_uid: str, state: Mapping[str, Any]) -> None:
        """Undo what prepare_group did. Idempotent; safe after a restart."""
        ...

    def destroy_unowned_mig(self, owned: set[tuple[str, int, int]]) -> list[str]:
        """At start-up: destroy MIG instances (parent uuid, gi id, ci id) that no checkpointed claim owns."""
        ...

    def release_unowned_time_slices(
        self, owned_states: Mapping[str, Iterable[Mapping[str, Any]]]
    ) -> list[str]:
        """At start-up: reset the time-slice intervals that no checkpointed group state (claim uid -> states)
        holds. Returns the GPUs reset."""
        ...

    def stop_unowned_mps(self, owned_states: Iterable[Mapping[str, Any]]) -> list[str]:
        """At start-up: stop MPS daemons that no checkpointed group state (nor a GPU's shares) owns; drop
        shares-server clients that no checkpointed state owns and stop a shares server left without clients.

        Returns the ids of the daemons stopped."""
        ...

    def revive_mps(self, owned_states: Iterable[Mapping[str, Any]]) -> list[str]:
        """At start-up: restart in place the MPS daemons the checkpointed group states still need but that no
        longer answer. Returns the ids restarted."""
        ...
