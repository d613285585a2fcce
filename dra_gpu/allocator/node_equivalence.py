"""Nodes that cannot be told apart by the allocator, and one node's result carried over to another (pure).

A fleet is mostly identical nodes: `explain` over 1,000 DGX H100 nodes would search 1,000 times for the same
answer. Two nodes are equivalent when the allocator sees the same pools: in the same order, with the same
device entries (the same objects: `replicate_slices` shares them between the nodes it makes, so identity is
a cheap, sound test of equal content; nodes read from a cluster have their own objects and are simply
searched one by one), the same counters and the same pool state, and no device of theirs held by another
claim. The pools' names (the node's name) are the only difference, and they do not steer the search.

A failed search on one node is then the failed search on any equivalent node, with the names swapped:
`carry_over` maps every device of the searched node to the device at the same position of the other node
and rewrites the node's pool names in labels and reasons.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Hashable, Iterator, Sequence
from typing import overload

from dra_gpu.allocator.model import Candidate, DeviceId, Pool, Rejection
from dra_gpu.allocator.search import NodeResult, RequestReport


def equivalence_key(node: str, pools: Sequence[Pool], held: Collection[DeviceId]) -> Hashable | None:
    """A key that equal for two nodes means the allocator cannot tell them apart; None when the node must be
    searched on its own (another claim holds one of its devices)."""
    parts: list[Hashable] = []
    for pool in pools:
        if held and any(c.id in held for c in pool.candidates):
            return None
        parts.append(
            (
                pool.driver,
                pool.name.replace(node, "\0"),
                pool.generation,
                pool.slice_count,
                pool.incomplete,
                (pool.invalid_reason or "").replace(node, "\0"),
                tuple((name, tuple(sorted(c.items()))) for name, c in sorted(pool.counter_sets.items())),
                tuple(id(c.data) for c in pool.candidates),
            )
        )
    return tuple(parts)


def carry_over(result: NodeResult, searched: Sequence[Pool], node: str, pools: Sequence[Pool]) -> NodeResult:
    """The failed `result` of a node with `searched` pools, as the equivalent `node` with `pools` gets it.

    The per-device rejections, by far the bulk of it (a DGX H100 node rejects ~800 devices for a 4-request
    MIG claim), are not copied: they are the searched node's list read through the renaming
    (`RenamedRejections`), made per device only when read one by one."""
    if result.success:
        raise ValueError("only a failed search carries over: a success allocates on the node searched")
    renaming = PoolRenaming(searched, pools)
    device_of, text = renaming.device_map(), renaming.text

    def report(r: RequestReport) -> RequestReport:
        return RequestReport(
            name=r.name,
            eligible=[device_of[c.id] for c in r.eligible],
            rejected=RenamedRejections(r.rejected, renaming),
            abort=r.abort,
            sequence=[device_of[x.id] if isinstance(x, Candidate) else text(x) for x in r.sequence],
            errors=[text(e) for e in r.errors],
            all_failures=[text(f) for f in r.all_failures],
        )

    return NodeResult(
        node=node,
        success=False,
        reason=None if result.reason is None else text(result.reason),
        results=[[] for _ in result.results],
        reports={key: report(r) for key, r in result.reports.items()},
        late_rejections={
            key: {text(label): renaming.rejection(r) for label, r in by_label.items()}
            for key, by_label in result.late_rejections.items()
        },
        scheduler_error=result.scheduler_error,
    )


class PoolRenaming:
    """The pool names of a searched node swapped for those of an equivalent node, in device labels and in
    reasons.

    A pool name is replaced as a whole word ("node-7/gpu-0", "pool node-7 is ...", "node-7."), never inside a
    longer name (node-70, node-7.example)."""

    def __init__(self, searched: Sequence[Pool], pools: Sequence[Pool]) -> None:
        self.searched = searched
        self.pools = pools
        self.renames = {a.name: b.name for a, b in zip(searched, pools, strict=True) if a.name != b.name}
        self._rewritten: dict[str, str] = {}  # a node's reasons repeat: each distinct one is rewritten once

    @functools.cached_property
    def pattern(self) -> re.Pattern[str] | None:
        """The renamed pool names as whole words, longest first; None when no name changes."""
        return names_pattern(self.renames)

    def device_map(self) -> dict[DeviceId, Candidate]:
        """Each device of the searched node -> the device at the same position of the other node. Not kept:
        the renaming lives as long as the node's rejections, and 1,000 nodes' maps would be ~10 MB."""
        return {ca.id: cb for ca, cb in self._candidate_pairs()}

    @functools.cached_property
    def label_of(self) -> dict[str, str]:
        """The same, by label (made only when a rejection is read one by one)."""
        return {ca.label: cb.label for ca, cb in self._candidate_pairs()}

    def _candidate_pairs(self) -> Iterator[tuple[Candidate, Candidate]]:
        for a, b in zip(self.searched, self.pools, strict=True):
            yield from zip(a.candidates, b.candidates, strict=True)

    def text(self, value: str) -> str:
        done = self._rewritten.get(value)
        if done is None:
            pattern, renames = self.pattern, self.renames
            done = pattern.sub(lambda m: renames[m.group(0)], value) if pattern is not None else value
            self._rewritten[value] = done
        return done

    def rejection(self, r: Rejection) -> Rejection:
        return Rejection(self.label_of.get(r.device) or self.text(r.device), self.text(r.reason), r.kind)


def names_pattern(names: Collection[str]) -> re.Pattern[str] | None:
    """A pattern matching any of `names` as a whole pool name (see PoolRenaming); None for no names."""
    if not names:
        return None
    longest_first = sorted(names, key=len, reverse=True)
    return re.compile("|".join(rf"(?<![\w.-]){re.escape(n)}(?![\w-]|\.[\w-])" for n in longest_first))


class RenamedRejections(Sequence[Rejection]):
    """The rejections of a searched node as an equivalent node has them: `source` read through `renaming`.

    Reading one makes it (no copy of the whole list is kept); `explain -o json` writes the whole run without
    reading them one by one (`cli.explain_json`)."""

    __slots__ = ("renaming", "source")

    def __init__(self, source: Sequence[Rejection], renaming: PoolRenaming) -> None:
        self.source = source
        self.renaming = renaming

    def __len__(self) -> int:
        return len(self.source)

    @overload
    def __getitem__(self, index: int) -> Rejection: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Rejection]: ...

    def __getitem__(self, index: int | slice) -> Rejection | Sequence[Rejection]:
        if isinstance(index, slice):
            return [self.renaming.rejection(r) for r in self.source[index]]
        return self.renaming.rejection(self.source[index])

    def __iter__(self) -> Iterator[Rejection]:
        rejection = self.renaming.rejection
        return (rejection(r) for r in self.source)
