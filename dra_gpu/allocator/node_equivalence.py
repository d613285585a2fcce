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

import re
from collections.abc import Collection, Hashable, Sequence

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
    """The failed `result` of a node with `searched` pools, as the equivalent `node` with `pools` gets it."""
    if result.success:
        raise ValueError("only a failed search carries over: a success allocates on the node searched")
    renames = {a.name: b.name for a, b in zip(searched, pools, strict=True) if a.name != b.name}
    # A pool name as a whole word ("node-7/gpu-0", "pool node-7 is ...", "node-7."), never inside a longer
    # name (node-70, node-7.example)
    longest_first = sorted(renames, key=len, reverse=True)
    name_re = re.compile("|".join(rf"(?<![\w.-]){re.escape(n)}(?![\w-]|\.[\w-])" for n in longest_first))
    device_of: dict[DeviceId, Candidate] = {}
    label_of: dict[str, str] = {}
    for a, b in zip(searched, pools, strict=True):
        for ca, cb in zip(a.candidates, b.candidates, strict=True):
            device_of[ca.id] = cb
            label_of[ca.label] = cb.label
    rewritten: dict[str, str] = {}  # a node's reasons repeat: each distinct one is rewritten once

    def text(value: str) -> str:
        done = rewritten.get(value)
        if done is None:
            done = rewritten[value] = name_re.sub(lambda m: renames[m.group(0)], value) if renames else value
        return done

    def rejection(r: Rejection) -> Rejection:
        return Rejection(label_of.get(r.device) or text(r.device), text(r.reason), r.kind)

    def report(r: RequestReport) -> RequestReport:
        return RequestReport(
            name=r.name,
            eligible=[device_of[c.id] for c in r.eligible],
            rejected=[rejection(x) for x in r.rejected],
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
            key: {text(label): rejection(r) for label, r in by_label.items()}
            for key, by_label in result.late_rejections.items()
        },
        scheduler_error=result.scheduler_error,
    )
