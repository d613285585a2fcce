"""Random claims of every kind the driver serves, as ResourceClaim specs (what a user writes); the soak has
them allocated by the project's allocator, so only what the scheduler could allocate reaches the plugin."""

from __future__ import annotations

import random
from typing import Any

from tests.plugin.plugin_harness import mps, opaque, time_slicing

MIG_PROFILES = {
    "dgx-h100": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb"),
    "dgx-a100": ("1g.5gb", "2g.10gb", "3g.20gb"),
}
INTERVALS = ("Default", "Short", "Medium", "Long")
KINDS = (
    "whole",  # an exclusive whole GPU, as it is
    "time-slicing",  # a whole GPU with a time-slice interval
    "mps",  # a whole GPU behind its own MPS daemon with limits
    "mig",  # one or two MIG devices made on demand (a mix of profiles)
    "mig-mps",  # a MIG device behind an MPS daemon
    "fraction",  # a fractional share (gpu-share device: memory and compute; one MPS server per GPU)
    "consumable",  # NVIDIA's consumable shares of a whole GPU (--consumable-shares)
    "consumable-mps",  # the same with an MPS config
    "consumable-memory",  # the same consuming part of the GPU's memory, no config (its GPU's MPS server)
    "admin",  # admin access to a whole GPU (monitoring: any GPU, in use or not)
    "mixed",  # a whole GPU with time-slicing plus a MIG device: two config groups in one claim
)


def _exactly(name: str, device_class: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, "count": 1, **extra}}


def _mig(name: str, profile: str) -> dict[str, Any]:
    selector = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
    return _exactly(name, "mig.nvidia.com", selectors=[{"cel": {"expression": selector}}])


def _mig_mps(rng: random.Random) -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "MigDeviceConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {"defaultActiveThreadPercentage": rng.choice((20, 50, 100))},
        },
    }


def draw_spec(kind: str, hardware: str, rng: random.Random) -> dict[str, Any]:
    """`spec.devices` of a claim of `kind` (requests and config)."""
    requests: list[dict[str, Any]]
    config: list[dict[str, Any]] = []
    profiles = MIG_PROFILES[hardware]
    if kind == "whole":
        requests = [_exactly("gpu", "gpu.nvidia.com")]
    elif kind == "time-slicing":
        requests = [_exactly("gpu", "gpu.nvidia.com")]
        config = [opaque(time_slicing(rng.choice(INTERVALS)))]
    elif kind in ("mps", "consumable-mps"):
        requests = [_exactly("gpu", "gpu.nvidia.com")]
        config = [opaque(mps(rng.choice((10, 25, 50)), rng.choice(("1Gi", "2Gi", "4Gi"))))]
    elif kind == "mig":
        requests = [_mig("mig-0", rng.choice(profiles))]
        if rng.random() < 0.4:
            requests.append(_mig("mig-1", rng.choice(profiles)))
    elif kind == "mig-mps":
        requests = [_mig("mig", rng.choice(profiles))]
        config = [opaque(_mig_mps(rng))]
    elif kind == "fraction":
        capacity = {"memory": f"{rng.choice((1, 2, 4, 8))}Gi", "compute": str(rng.choice((5, 10, 20, 40)))}
        requests = [_exactly("gpu", "gpu-share.nvidia.com", capacity={"requests": capacity})]
    elif kind == "consumable":
        requests = [_exactly("gpu", "gpu.nvidia.com")]
    elif kind == "consumable-memory":
        memory = f"{rng.choice((2, 4, 8))}Gi"
        requests = [_exactly("gpu", "gpu.nvidia.com", capacity={"requests": {"memory": memory}})]
    elif kind == "admin":
        requests = [_exactly("gpu", "gpu.nvidia.com", adminAccess=True)]
    elif kind == "mixed":
        requests = [_exactly("gpu", "gpu.nvidia.com"), _mig("mig", rng.choice(profiles))]
        config = [opaque(time_slicing(rng.choice(INTERVALS)), ["gpu"])]
    else:
        raise ValueError(f"unknown claim kind {kind!r}: one of {', '.join(KINDS)}")
    return {"requests": requests, **({"config": config} if config else {})}
