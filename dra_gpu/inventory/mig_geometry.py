"""MIG geometry: which sets of MIG placements a GPU can hold at once, and the counter totals that follow.

The scheduler knows nothing about MIG; it only subtracts counters. Exclusion between overlapping placements
comes
from the `memory-slice-<i>` counters (value 1 each). The other counters (multiprocessors, engines, memory) are
set
to the largest total any valid configuration reaches, so every configuration the hardware allows stays
allocatable
and the full GPU (which consumes everything) excludes every MIG device.

A configuration is valid when its placements do not overlap, each profile stays within its instance count, and
the
compute slices fit in the GPU (the largest profile's compute slices, 7 on A100/H100); this matches what the
simulator enforces and what NVML reports as `instanceCount`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

from dra_gpu.hardware.types import MigProfileInfo

# capacity name (published on MIG devices) -> counter name (DNS label) -> MigProfileInfo field
ENGINE_DIMENSIONS: tuple[tuple[str, str, str], ...] = (
    ("multiprocessors", "multiprocessors", "multiprocessors"),
    ("copyEngines", "copy-engines", "copy_engines"),
    ("decoders", "decoders", "decoders"),
    ("encoders", "encoders", "encoders"),
    ("jpegEngines", "jpeg-engines", "jpeg_engines"),
    ("ofaEngines", "ofa-engines", "ofa_engines"),
)
MIB = 1024 * 1024


@dataclass(frozen=True)
class Placement:
    """One (profile, placement) pair: what a dynamic MIG device stands for."""

    profile: MigProfileInfo
    start: int

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.profile.memory_slices)

    def overlaps(self, other: Placement) -> bool:
        return bool(set(self.memory_slices) & set(other.memory_slices))

    def amount(self, counter: str) -> int:
        """What this placement consumes of `counter` (a counter name, not a capacity name)."""
        if counter == "memory":
            return self.profile.memory_mib * MIB
        for _capacity, name, field in ENGINE_DIMENSIONS:
            if name == counter:
                return int(getattr(self.profile, field))
        if counter.startswith("memory-slice-"):
            return 1 if int(counter.rsplit("-", 1)[1]) in self.memory_slices else 0
        raise KeyError(counter)


def all_placements(profiles: tuple[MigProfileInfo, ...]) -> tuple[Placement, ...]:
    return tuple(Placement(p, pl.start) for p in profiles for pl in p.placements)


def memory_slice_count(profiles: tuple[MigProfileInfo, ...]) -> int:
    return max((pl.start + pl.size for p in profiles for pl in p.placements), default=0)


def compute_slice_count(profiles: tuple[MigProfileInfo, ...]) -> int:
    return max((p.compute_slices for p in profiles), default=0)


def is_valid_configuration(placements: tuple[Placement, ...], profiles: tuple[MigProfileInfo, ...]) -> bool:
    """Can the hardware hold all of `placements` at the same time?"""
    for i, a in enumerate(placements):
        if any(a.overlaps(b) for b in placements[i + 1 :]):
            return False
    for profile in profiles:
        if sum(1 for p in placements if p.profile == profile) > profile.max_instances:
            return False
    return sum(p.profile.compute_slices for p in placements) <= compute_slice_count(profiles)


def valid_configurations(profiles: tuple[MigProfileInfo, ...]) -> Iterator[tuple[Placement, ...]]:
    """Every non-empty valid configuration (depth-first, each set once)."""
    candidates = all_placements(profiles)
    compute_total = compute_slice_count(profiles)

    def extend(
        chosen: tuple[Placement, ...], next_index: int, used: frozenset[int], compute: int
    ) -> Iterator[tuple[Placement, ...]]:
        for i in range(next_index, len(candidates)):
            p = candidates[i]
            if used & set(p.memory_slices) or compute + p.profile.compute_slices > compute_total:
                continue
            if sum(1 for c in chosen if c.profile == p.profile) >= p.profile.max_instances:
                continue
            grown = (*chosen, p)
            yield grown
            yield from extend(
                grown, i + 1, used | frozenset(p.memory_slices), compute + p.profile.compute_slices
            )

    yield from extend((), 0, frozenset(), 0)


@functools.lru_cache(maxsize=64)
def max_configuration_totals(profiles: tuple[MigProfileInfo, ...]) -> dict[str, int]:
    """Per counter (memory + engine counters), the largest sum any valid configuration consumes.

    The same depth-first walk as `valid_configurations`, with each configuration's totals carried along
    (memory slices as a bit mask, instances counted per profile) instead of summed again per configuration:
    it runs once per GPU model at every plugin start (an H100 has 2,318 configurations; 60 ms before)."""
    names = ["memory", *(name for _c, name, _f in ENGINE_DIMENSIONS)]
    candidates = all_placements(profiles)
    masks = [sum(1 << s for s in p.memory_slices) for p in candidates]
    amounts = [tuple(p.amount(name) for name in names) for p in candidates]
    slot = {profile: i for i, profile in enumerate(profiles)}
    kinds = [slot[p.profile] for p in candidates]
    compute = [p.profile.compute_slices for p in candidates]
    limit = [profile.max_instances for profile in profiles]
    compute_total = compute_slice_count(profiles)
    best = [0] * len(names)
    counts = [0] * len(profiles)

    def extend(next_index: int, used: int, compute_used: int, totals: tuple[int, ...]) -> None:
        for i in range(next_index, len(candidates)):
            kind = kinds[i]
            if used & masks[i] or compute_used + compute[i] > compute_total or counts[kind] >= limit[kind]:
                continue
            grown = tuple(t + a for t, a in zip(totals, amounts[i], strict=True))
            for k, value in enumerate(grown):
                if value > best[k]:
                    best[k] = value
            counts[kind] += 1
            extend(i + 1, used | masks[i], compute_used + compute[i], grown)
            counts[kind] -= 1

    extend(0, 0, 0, (0,) * len(names))
    return dict(zip(names, best, strict=True))
