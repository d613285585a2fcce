"""Device and counter names (RFC 1123 DNS labels), as NVIDIA's driver forms them, and their inverse.

- full GPU: `gpu-<minor>` (the /dev/nvidia<minor> number, stable across boots, unlike the NVML index);
- MIG (static and dynamic): `gpu-<minor>-mig-<profile>-<giProfileId>-<placementStart>` where `<profile>` is
  the profile name without dots, lower-cased, every other character outside `[a-z0-9-]` written as `-`, and
  leading/trailing `-` trimmed (`1g.10gb+me` -> `1g10gb-me`, `1g.10gb+me.all` -> `1g10gb-meall`,
  `1g.10gb+gfx` -> `1g10gb-gfx`, `1g.10gb-me` -> `1g10gb-me`). That is NVIDIA's rule, so names match theirs
  for the same hardware; `+me` and `-me` share a label, the GI profile id keeps the names apart;
- fractional share of a GPU: `gpu-<minor>-shared`;
- counter set: `gpu-<minor>-counter-set`; memory-slice counter `memory-slice-<i>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")
_GPU_NAME = re.compile(r"^gpu-(\d+)$")
_SHARE_NAME = re.compile(r"^gpu-(\d+)-shared$")
_NOT_LABEL_CHAR = re.compile(r"[^a-z0-9-]")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def gpu_device_name(minor: int) -> str:
    return f"gpu-{minor}"


def share_device_name(minor: int) -> str:
    return f"gpu-{minor}-shared"


def profile_label(profile: str) -> str:
    """`1g.10gb+me` -> `1g10gb-me`: the MIG profile as it appears in device names (NVIDIA's rule: dots
    dropped, then RFC 1123 clean-up: lower case, anything else outside [a-z0-9-] -> `-`, `-` trimmed)."""
    return _NOT_LABEL_CHAR.sub("-", profile.replace(".", "").lower()).strip("-")


def mig_device_name(minor: int, profile: str, gi_profile_id: int, placement_start: int) -> str:
    return f"gpu-{minor}-mig-{profile_label(profile)}-{gi_profile_id}-{placement_start}"


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


@dataclass(frozen=True)
class ParsedMigName:
    minor: int
    profile_label: str
    gi_profile_id: int
    placement_start: int


def parse_mig_device_name(name: str) -> ParsedMigName | None:
    """The parts of a MIG device name, or None if `name` is not one (enough to find or destroy an orphan)."""
    match = _MIG_NAME.match(name)
    if match is None:
        return None
    return ParsedMigName(int(match[1]), match[2], int(match[3]), int(match[4]))


def parse_gpu_minor(name: str) -> int | None:
    """The GPU minor of any of our device names (`gpu-3`, `gpu-3-shared`, `gpu-3-mig-...`), else None."""
    for pattern in (_GPU_NAME, _SHARE_NAME, _MIG_NAME):
        match = pattern.match(name)
        if match is not None:
            return int(match[1])
    return None


def is_dns_label(name: str) -> bool:
    return len(name) <= 63 and DNS_LABEL.match(name) is not None
