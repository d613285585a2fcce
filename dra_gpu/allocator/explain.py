"""Explain, for a set of claims, what the scheduler would allocate in a cluster and why devices are rejected.

Pure: takes parsed claims, DeviceClasses, a `SliceIndex`, the nodes and what other claims already hold. Nodes
are tried in the scheduler's order (sorted names); the first node that fits gets the allocation, but the
matching devices of every node are reported.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from dra_gpu.allocator.claims import DeviceClassSpec
from dra_gpu.allocator.matching import SelectorSet
from dra_gpu.allocator.model import AllocatedDevice, ClaimSpec, DeviceRequestSpec, Pool, Rejection
from dra_gpu.allocator.node_equivalence import RenamedRejections, carry_over, equivalence_key
from dra_gpu.allocator.pools import Node, SliceIndex
from dra_gpu.allocator.search import DEFAULT_STEP_LIMIT, Existing, NodeAllocator, NodeResult
from dra_gpu.config.quantity import format_quantity


class RejectionRuns(Sequence[Rejection]):
    """The rejections of one request over all nodes, in node order, kept as the runs they came in: each
    node's own list, or a searched node's list renamed for a node carried over from it. Over 1,000 identical
    nodes that is 1,000 views of one list instead of ~800,000 objects; `explain -o json` writes a renamed
    run from one encoding of its source (`cli.explain_json`)."""

    __slots__ = ("runs",)

    def __init__(self, items: Iterable[Rejection] = ()) -> None:
        self.runs: list[Sequence[Rejection]] = []
        self.extend(items)

    def append(self, rejection: Rejection) -> None:
        last = self.runs[-1] if self.runs else None
        if isinstance(last, list):
            last.append(rejection)
        else:
            self.runs.append([rejection])

    def extend(self, items: Iterable[Rejection]) -> None:
        runs = items.runs if isinstance(items, RejectionRuns) else [items]
        for run in runs:
            if isinstance(run, RenamedRejections):
                if run:
                    self.runs.append(run)
                continue
            last = self.runs[-1] if self.runs else None
            if isinstance(last, list):
                last.extend(run)
            else:
                copied = list(run)
                if copied:
                    self.runs.append(copied)

    def __len__(self) -> int:
        return sum(len(run) for run in self.runs)

    def __iter__(self) -> Iterator[Rejection]:
        return itertools.chain.from_iterable(self.runs)

    @overload
    def __getitem__(self, index: int) -> Rejection: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Rejection]: ...

    def __getitem__(self, index: int | slice) -> Rejection | Sequence[Rejection]:
        return list(self)[index]  # not on a hot path: JSON and the table iterate

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"RejectionRuns({list(self)!r})"


@dataclass
class SubrequestExplanation:
    name: str
    matching: list[str] = field(default_factory=list)
    rejected: RejectionRuns = field(default_factory=RejectionRuns)
    allocated: list[str] = field(default_factory=list)


@dataclass
class RequestExplanation:
    name: str
    matching: list[str] = field(default_factory=list)
    rejected: RejectionRuns = field(default_factory=RejectionRuns)
    allocated: list[str] = field(default_factory=list)
    subrequests: list[SubrequestExplanation] = field(default_factory=list)


@dataclass
class ClaimExplanation:
    namespace: str
    name: str
    allocatable: bool
    node: str | None
    reason: str | None
    requests: list[RequestExplanation]
    results: list[AllocatedDevice]
    configs: list[dict[str, Any]]
    node_failures: dict[str, str]  # node -> why the claim (group) does not fit there


def explain(
    groups: Sequence[Sequence[ClaimSpec]],
    classes: Mapping[str, DeviceClassSpec],
    index: SliceIndex,
    nodes: Sequence[Node],
    existing: Existing,
    step_limit: int = DEFAULT_STEP_LIMIT // 10,
) -> list[ClaimExplanation]:
    """`groups`: claims that must land on one node together (the claims of one pod), each explained."""
    # Hundreds of thousands of small objects are created and all of them stay alive until the end: the cyclic
    # garbage collector would rescan the whole heap again and again for nothing (it tripled the run time).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _explain(groups, classes, index, nodes, existing, step_limit)
    finally:
        if collecting:
            gc.enable()


def _explain(
    groups: Sequence[Sequence[ClaimSpec]],
    classes: Mapping[str, DeviceClassSpec],
    index: SliceIndex,
    nodes: Sequence[Node],
    existing: Existing,
    step_limit: int,
) -> list[ClaimExplanation]:
    ordered = sorted(nodes, key=lambda n: n.name)
    pools_by_node = {node.name: index.pools_for(node) for node in ordered}
    out: list[ClaimExplanation] = []
    for group in groups:
        out.extend(_explain_group(group, classes, pools_by_node, ordered, existing, step_limit))
    return out


def _explain_group(
    group: Sequence[ClaimSpec],
    classes: Mapping[str, DeviceClassSpec],
    pools_by_node: Mapping[str, Any],
    nodes: Sequence[Node],
    existing: Existing,
    step_limit: int,
) -> list[ClaimExplanation]:
    selector_sets: dict[tuple[int, str], SelectorSet] = {}
    chosen: NodeResult | None = None
    failures: dict[str, str] = {}
    per_node: list[NodeResult] = []
    held = set(existing.exclusive) | set(existing.shared)
    # equivalence key -> (pools, failed result) of the node searched for it: identical nodes are searched once
    searched: dict[Hashable, tuple[Sequence[Pool], NodeResult]] = {}
    # kube-scheduler filters every node (all of them below its 100-node minimum): an allocator error on any
    # one (a CEL runtime error its search reaches) fails the pod's whole scheduling attempt, feasible nodes
    # or not. So after the chosen node, a node whose requests can hit an error is still searched.
    fatal: NodeResult | None = None
    for node in nodes:
        pools = pools_by_node[node.name]
        allocator = NodeAllocator(node.name, group, classes, pools, existing, selector_sets, step_limit)
        if chosen is None and fatal is None:
            result = _search(allocator, node.name, pools, held, searched)
            if result.success:
                chosen = result
            else:
                failures[node.name] = result.reason or "does not fit"
                if result.scheduler_error:
                    fatal = result
        else:
            # Allocation is decided; still list what matches on the remaining nodes.
            for claim_index, claim in enumerate(group):
                for request in claim.requests:
                    for alternative in request.alternatives:
                        allocator.report_for(claim_index, alternative)
            result = NodeResult(node.name, False, None, [[] for _ in group], allocator.reports, {})
            if fatal is None and any(report.errors for report in allocator.reports.values()):
                searched_here = _search(allocator, node.name, pools, held, searched)
                if searched_here.scheduler_error:
                    fatal = result = searched_here
                    failures[node.name] = searched_here.reason or "error"
        per_node.append(result)
    if fatal is not None:
        chosen = None
    explanations = []
    for claim_index, claim in enumerate(group):
        results = chosen.results[claim_index] if chosen is not None else []
        requests = [
            _request_explanation(claim_index, request.name, request.alternatives, per_node, results, chosen)
            for request in claim.requests
        ]
        reason = None
        if fatal is not None:
            reason = (
                f"kube-scheduler stops at an error on node {fatal.node} and so fails the pod on every node: "
                f"{fatal.reason}"
            )
        elif chosen is None:
            reason = _summarize_failures(failures) if nodes else "no nodes in the inventory"
        explanations.append(
            ClaimExplanation(
                namespace=claim.namespace,
                name=claim.name,
                allocatable=chosen is not None,
                node=chosen.node if chosen is not None else None,
                reason=reason,
                requests=requests,
                results=results,
                configs=_allocation_configs(claim, results, classes) if chosen is not None else [],
                node_failures=failures,
            )
        )
    return explanations


def _search(
    allocator: NodeAllocator,
    node: str,
    pools: Sequence[Pool],
    held: set[Any],
    searched: dict[Hashable, tuple[Sequence[Pool], NodeResult]],
) -> NodeResult:
    """The node's search result; identical nodes are searched once (a failed result is carried over)."""
    key = equivalence_key(node, pools, held)
    known = searched.get(key) if key is not None else None
    if known is not None:
        return carry_over(known[1], known[0], node, pools)
    result = allocator.run()
    if key is not None and not result.success:
        searched[key] = (pools, result)
    return result


def _request_explanation(
    claim_index: int,
    name: str,
    alternatives: Sequence[DeviceRequestSpec],
    per_node: Sequence[NodeResult],
    results: Sequence[AllocatedDevice],
    chosen: NodeResult | None,
) -> RequestExplanation:
    subs = []
    for alternative in alternatives:
        sub = SubrequestExplanation(alternative.name)
        key = f"{claim_index}:{alternative.name}"
        for node_result in per_node:
            report = node_result.reports.get(key)
            if report is None:
                continue
            late = node_result.late_rejections.get(key, {}) if not node_result.success else {}
            for candidate in report.eligible:
                rejection = late.get(candidate.label)
                if rejection is not None:
                    sub.rejected.append(rejection)
                else:
                    sub.matching.append(candidate.label)
            if report.abort and not report.rejected:
                continue
            sub.rejected.extend(report.rejected)
        sub.allocated = [r.label for r in results if r.request == alternative.name]
        subs.append(sub)
    explanation = RequestExplanation(name)
    if len(subs) == 1 and subs[0].name == name:
        only = subs[0]
        explanation.matching, explanation.rejected, explanation.allocated = (
            only.matching,
            only.rejected,
            only.allocated,
        )
        return explanation
    seen: set[str] = set()
    for sub in subs:
        for label in sub.matching:
            if label not in seen:
                seen.add(label)
                explanation.matching.append(label)
    rejected_first = {}
    for sub in subs:
        for rejection in sub.rejected:
            if rejection.device not in seen and rejection.device not in rejected_first:
                rejected_first[rejection.device] = Rejection(
                    rejection.device, f"{sub.name}: {rejection.reason}", rejection.kind
                )
    explanation.rejected = RejectionRuns(rejected_first.values())
    explanation.allocated = [r.label for r in results if r.request.split("/")[0] == name]
    explanation.subrequests = subs
    return explanation


def reason_groups(failures: Mapping[str, str], examples: int = 3) -> list[dict[str, Any]]:
    """Each distinct per-node reason once, most common first: {reason, nodes: count, examples: [node...]}.

    A fleet of identical nodes fails for one reason; listing it per node would repeat it a thousand times."""
    by_reason: dict[str, list[str]] = {}
    for node, reason in failures.items():
        by_reason.setdefault(_node_neutral(node, reason), []).append(node)
    return [
        {"reason": reason, "nodes": len(names), "examples": names[:examples]}
        for reason, names in sorted(by_reason.items(), key=lambda item: -len(item[1]))
    ]


def _node_neutral(node: str, reason: str) -> str:
    """The reason with the node's own device prefix ("node-7/gpu-0") written as "<node>/gpu-0": identical
    nodes name their devices alike, so their reasons then compare equal and are listed once."""
    return reason.replace(f"{node}/", "<node>/")


def _summarize_failures(failures: Mapping[str, str]) -> str:
    if not failures:
        return "no node can satisfy the claim"
    by_reason: dict[str, list[str]] = {}
    for node, reason in failures.items():
        by_reason.setdefault(_node_neutral(node, reason), []).append(node)
    parts = []
    for reason, node_names in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        shown = ", ".join(node_names[:3]) + (
            f" and {len(node_names) - 3} more" if len(node_names) > 3 else ""
        )
        parts.append(f"{reason} (node {shown})")
    return "; ".join(parts)


def _allocation_configs(
    claim: ClaimSpec, results: Sequence[AllocatedDevice], classes: Mapping[str, DeviceClassSpec]
) -> list[dict[str, Any]]:
    """status.allocation.devices.config: class configs (FromClass) then claim configs (FromClaim)."""
    configs: list[dict[str, Any]] = []
    used_classes: dict[str, list[str]] = {}
    for request in claim.requests:
        for alternative in request.alternatives:
            if any(r.request == alternative.name for r in results):
                used_classes.setdefault(alternative.class_name, []).append(alternative.name)
    for class_name, request_names in used_classes.items():
        device_class = classes.get(class_name)
        for config in device_class.configs if device_class else ():
            configs.append({"source": "FromClass", "requests": request_names, **dict(config)})
    for config in claim.configs:
        entry = {"source": "FromClaim", **dict(config)}
        configs.append(entry)
    return configs


# What MPS does not isolate (NVIDIA's MPS documentation), said wherever a claim would share a GPU through it.
MPS_ISOLATION_NOTES = (
    "shares of one GPU are clients of one MPS server and run at the same time; the server's caps are the "
    "largest share on the GPU, and each claim's containers carry their own share as client limits "
    "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), which take precedence over the "
    "same variables in the pod spec; a process may set lower ones for itself",
    "what a tenant can change: lower its SMs and pinned memory (its own env); raise them up to the server's "
    "caps (the largest share on the GPU) by changing those variables, root or not; a root tenant can change "
    "the server's caps through the mounted pipe directory with its own MPS control client (as with NVIDIA's "
    "driver). A process that ignores the pipe directory cannot open the GPU while the server runs (compute "
    "mode EXCLUSIVE_PROCESS), unless the node runs the lab option --mps-leave-compute-mode",
    "memory: each Volta+ MPS client has its own GPU address space, but there is no isolation of memory "
    "bandwidth, caches or of the GPU's memory beyond the pinned-memory limit, which the client enforces "
    "(MPS v2); for a hard boundary against a hostile tenant, use MIG",
    "faults: a fatal GPU exception of one client can end every client of the same MPS server (every share "
    "of the GPU); a GPU error that needs a reset stops every tenant of the GPU",
)


def isolation_notes(results: Sequence[AllocatedDevice], configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The MPS isolation caveats when the allocation shares a GPU through MPS (a fractional share, or an
    MPS sharing config); empty otherwise."""
    shared = any(r.share_id for r in results)
    mps = any(_mentions_mps(c) for c in configs)
    return list(MPS_ISOLATION_NOTES) if shared or mps else []


def _mentions_mps(value: Any) -> bool:
    if isinstance(value, Mapping):
        return value.get("strategy") == "MPS" or any(_mentions_mps(v) for v in value.values())
    if isinstance(value, list):
        return any(_mentions_mps(v) for v in value)
    return False


def result_json(result: AllocatedDevice) -> dict[str, Any]:
    """One allocation result as the scheduler writes it in `status.allocation.devices.results[]`."""
    out: dict[str, Any] = {
        "request": result.request,
        "driver": result.driver,
        "pool": result.pool,
        "device": result.device,
    }
    if result.admin_access:
        out["adminAccess"] = True
    if result.tolerations:
        out["tolerations"] = result.tolerations
    if result.share_id:
        out["shareID"] = result.share_id
    if result.consumed_capacity is not None:
        out["consumedCapacity"] = {
            k: format_quantity(v, binary_si=True) for k, v in result.consumed_capacity.items()
        }
    return out
