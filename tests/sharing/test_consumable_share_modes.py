"""How the prepare service tells, before anything is touched, whether a consumable share of a whole GPU will
be a client of the GPU's MPS shares server or the plain device (dra_gpu/plugin/share_modes.py): it must say
what the sharing plan then does, for every kind of group, flag and GPU (a pre-Volta GPU gives every share
plain); and how a prepared claim holds its GPU is read back from its checkpointed groups."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import pytest
from sim_node import SimNode

from dra_gpu.checkpoint.checkpoint_store import ClaimEntry, ClaimPhase, PreparedDevice, PreparedGroup
from dra_gpu.config.api import DeviceConfig, decode_opaque_config
from dra_gpu.hardware.types import GpuInfo
from dra_gpu.inventory.consumable_shares import parse_consumable_shares
from dra_gpu.inventory.device_model import ModelOptions, build_device_model
from dra_gpu.plugin.share_modes import ShareMode, held_modes, mixed_in_one_claim, planned_modes
from dra_gpu.sharing.interface import AllocatedDevice, SharingError
from dra_gpu.sharing.plan import build_plan

V1B1 = "resource.nvidia.com/v1beta1"
CONFIGS: dict[str, DeviceConfig | None] = {
    "none": None,
    "mps": decode_opaque_config({"apiVersion": V1B1, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}),
    "time-slicing": decode_opaque_config(
        {
            "apiVersion": V1B1,
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
        }
    ),
    "no-sharing": decode_opaque_config({"apiVersion": V1B1, "kind": "GpuConfig"}),
}
MEMORY = {"unlimited": ("0", "4Gi"), "memory": ("4Gi", "all"), "4": ("0", "4Gi")}


def shared(node: SimNode, flag: str) -> SimNode:
    node._model = build_device_model(
        node.hardware.discover(), ModelOptions(consumable_shares=parse_consumable_shares(flag))
    )
    return node


def share(node: SimNode, n: int, device: str, memory: str, flag: str) -> AllocatedDevice:
    if memory == "all":
        memory = f"{node.device(device).capacity['memory'].value // 2**20}Mi"
    consumed = {"memory": memory, **({"shares": "1"} if flag.isdigit() else {})}
    share_id = f"77777777-0000-0000-0000-{n:012d}"
    return node.alloc(device, request=f"r{n}", share_id=share_id, consumed_capacity=consumed)


def groups_of(node: SimNode, flag: str) -> list[list[AllocatedDevice]]:
    """Groups a claim may bring: one share of each memory size, two shares of gpu-0, shares of two GPUs."""
    sizes = MEMORY[flag]
    counter = itertools.count(1)
    groups = [[share(node, next(counter), "gpu-0", size, flag)] for size in sizes]
    groups.append([share(node, next(counter), "gpu-0", size, flag) for size in sizes])
    groups.append(
        [
            share(node, next(counter), "gpu-0", sizes[0], flag),
            share(node, next(counter), "gpu-0", sizes[0], flag),
        ]
    )
    if "gpu-1" in node.model().by_name():
        groups.append(
            [
                share(node, next(counter), "gpu-0", "4Gi", flag),
                share(node, next(counter), "gpu-1", "4Gi", flag),
            ]
        )
    return groups


def gpus(node: SimNode) -> dict[str, GpuInfo]:
    return {g.uuid: g for g in node.hardware.discover().gpus}


@pytest.mark.parametrize("hardware", ["h100-80gb", "dgx-a100", "p4"])
@pytest.mark.parametrize("flag", ["unlimited", "memory", "4"])
def test_the_planned_mode_is_what_the_sharing_plan_does(
    make_node: Callable[[str], SimNode], hardware: str, flag: str
) -> None:
    node = shared(make_node(hardware), flag)
    facts = gpus(node)
    checked = 0
    for devices, (config_name, config) in itertools.product(groups_of(node, flag), CONFIGS.items()):
        modes = planned_modes(devices, [(config, list(range(len(devices))))])
        try:
            plan = build_plan(config, devices, facts)
        except SharingError:
            continue  # prepare fails on its own (an MPS config on plain shares)
        served = set(plan.shares.device_names) if plan.shares is not None else set()
        expected = [ShareMode.MPS_CLIENT if d.device.name in served else ShareMode.DEVICE for d in devices]
        assert modes == expected, (hardware, flag, config_name, [d.consumed_capacity for d in devices])
        checked += 1
    assert checked >= 6
    if hardware == "p4":  # pre-Volta: no MPS client limits, every share is the plain device
        limited = [share(node, 99, "gpu-0", "4Gi", flag)]
        assert planned_modes(limited, [(None, [0])]) == [ShareMode.DEVICE]


def test_other_devices_and_admin_access_have_no_mode(node: SimNode) -> None:
    plain_gpu = node.alloc("gpu-0", request="whole")  # not shared (no flag)
    shared(node, "unlimited")
    admin = AllocatedDevice(
        request="admin",
        pool="node-a",
        device=node.device("gpu-0"),
        admin_access=True,
        share_id="77777777-0000-0000-0000-000000000001",
        consumed_capacity={"memory": "4Gi"},
    )
    assert planned_modes([plain_gpu, admin], [(None, [0]), (None, [1])]) == [None, None]


def test_one_claim_taking_a_gpu_both_ways_is_named(node: SimNode) -> None:
    shared(node, "unlimited")
    devices = [share(node, 1, "gpu-0", "4Gi", "unlimited"), share(node, 2, "gpu-0", "0", "unlimited")]
    apart = planned_modes(devices, [(None, [0]), (None, [1])])  # each request with a config entry of its own
    assert apart == [ShareMode.MPS_CLIENT, ShareMode.DEVICE]
    message = mixed_in_one_claim(devices, apart)
    assert message is not None and message.startswith("requests r1 and r2 share device gpu-0 as a client")
    together = planned_modes(devices, [(None, [0, 1])])  # one group: the GPU as it is for both
    assert together == [ShareMode.DEVICE, ShareMode.DEVICE] and mixed_in_one_claim(devices, together) is None


def entry(
    devices: Sequence[tuple[str, str | None]], groups: Sequence[PreparedGroup], phase: ClaimPhase
) -> ClaimEntry:
    return ClaimEntry(
        uid="u",
        namespace="ns",
        name="c",
        phase=phase,
        devices=tuple(PreparedDevice(request="r", pool="p", device=d, share_id=s) for d, s in devices),
        groups=tuple(groups),
    )


def test_a_prepared_claims_mode_is_read_from_its_groups() -> None:
    served = PreparedGroup(
        devices=("gpu-0",), state={"sharedMps": {"gpu": "GPU-0", "clients": ["u/gpu-0/s"]}}
    )
    plain = PreparedGroup(devices=("gpu-1",), state={"sharedMps": None, "timeSlice": None})
    whole = PreparedGroup(devices=("gpu-2",), state={})
    done = entry(
        [("gpu-0", "s"), ("gpu-1", "s"), ("gpu-2", None)],
        [served, plain, whole],
        ClaimPhase.PREPARE_COMPLETED,
    )
    assert held_modes(done) == {"gpu-0": ShareMode.MPS_CLIENT, "gpu-1": ShareMode.DEVICE}
    # a claim reserved but not prepared yet has done nothing to its GPU: no mode to keep
    assert held_modes(entry([("gpu-0", "s")], [], ClaimPhase.PREPARE_STARTED)) == {}
    # a checkpoint as written back from JSON (a restart) reads the same
    assert held_modes(ClaimEntry.from_json("u", done.to_json())) == held_modes(done)
