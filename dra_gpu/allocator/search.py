"""First fit with backtracking on one node: the scheduler's structured allocator, in Python.

Requests are handled in claim order, then request order; devices in pool order, slices by name, list order. A
request that needs n devices tries combinations in that order (permutations of one set are never retried: they
fail or succeed alike). `firstAvailable` subrequests are tried in order, and a later failure backtracks into
the next subrequest. Devices already allocated to other claims, counters already consumed and capacity already
shared come from `Existing`.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from dra_gpu.allocator.claims import DeviceClassSpec
from dra_gpu.allocator.matching import SelectorSet, capacity_share, untolerated_taint
from dra_gpu.allocator.model import (
    AllocatedDevice,
    Candidate,
    ClaimSpec,
    Constraint,
    DeviceId,
    DeviceRequestSpec,
    Pool,
    Rejection,
    quantity_of,
)

DEFAULT_STEP_LIMIT = 200_000


@dataclass
class Existing:
    """What other (already allocated) claims hold."""

    exclusive: set[DeviceId] = field(default_factory=set)
    shared: dict[DeviceId, list[dict[str, Decimal]]] = field(
        default_factory=dict
    )  # multi-allocatable devices
    holders: dict[DeviceId, str] = field(default_factory=dict)  # device -> "namespace/claim"

    @classmethod
    def from_claims(
        cls, claims: Iterable[Mapping[str, Any]], skip: Collection[tuple[str, str]] = ()
    ) -> Existing:
        existing = cls()
        for claim in claims:
            meta = claim.get("metadata") or {}
            ident = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
            if ident in skip:
                continue
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or ():
                if result.get("adminAccess"):
                    continue
                device_id = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
                existing.holders[device_id] = f"{ident[0]}/{ident[1]}"
                if result.get("shareID") is not None or result.get("consumedCapacity"):
                    consumed = {
                        str(k): quantity_of(v, f"claim {ident[0]}/{ident[1]} consumedCapacity {k}")
                        for k, v in (result.get("consumedCapacity") or {}).items()
                    }
                    existing.shared.setdefault(device_id, []).append(consumed)
                else:
                    existing.exclusive.add(device_id)
        return existing


@dataclass
class RequestReport:
    """Per request (or subrequest) on one node: eligible devices and why the others are not."""

    name: str
    eligible: list[Candidate] = field(default_factory=list)
    # a list for a node searched; the searched node's list renamed for one carried over (node_equivalence)
    rejected: Sequence[Rejection] = field(default_factory=list)
    abort: str | None = None  # the request cannot be handled on this node at all (unknown DeviceClass)
    # The devices in the order the scheduler walks them, with errors where it would hit them: a string
    # entry is
    # a CEL runtime error or an invalid pool, which make the scheduler give up on the node when reached.
    sequence: list[Candidate | str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the string entries, for allocationMode All
    all_failures: list[str] = field(default_factory=list)  # why allocationMode All cannot get every device


@dataclass
class NodeResult:
    node: str
    success: bool
    reason: str | None
    results: list[list[AllocatedDevice]]  # per claim
    reports: dict[str, RequestReport]  # "<claim index>:<request name>" -> report
    late_rejections: dict[str, dict[str, Rejection]]  # same key -> device label -> reason found during search
    # The search stopped at an error kube-scheduler's allocator returns as an error, not as "does not fit" (a
    # CEL runtime error, "all devices" of an incomplete or invalid pool): its DRA plugin then fails the whole
    # scheduling attempt of the pod, on every node, not just this one.
    scheduler_error: bool = False


class _SearchAbortedError(Exception):
    def __init__(self, reason: str, *, scheduler_error: bool = False) -> None:
        super().__init__(reason)
        self.scheduler_error = scheduler_error


class NodeAllocator:
    def __init__(
        self,
        node: str,
        claims: Sequence[ClaimSpec],
        classes: Mapping[str, DeviceClassSpec],
        pools: Sequence[Pool],
        existing: Existing,
        selector_sets: dict[tuple[int, str], SelectorSet],
        step_limit: int = DEFAULT_STEP_LIMIT,
    ):
        self.node = node
        self.claims = claims
        self.classes = classes
        self.pools = pools
        self.existing = existing
        self.selector_sets = selector_sets
        self.step_limit = step_limit
        self.steps = 0
        self.counters: dict[tuple[str, str, str], dict[str, Decimal]] = {}
        self.by_id: dict[DeviceId, Candidate] = {}
        self.reports: dict[str, RequestReport] = {}
        self.late: dict[str, dict[str, Rejection]] = {}
        self.picked: list[tuple[int, DeviceRequestSpec, Candidate, dict[str, Decimal] | None]] = []
        self.picked_ids: dict[DeviceId, list[str]] = {}  # device -> requests that picked it in this cycle
        self.constraint_values: dict[tuple[int, int], list[Any]] = {}
        self._charged: list[bool] = []

    # ------------------------------------------------------------------------------------------------------
    def _init_counters(self) -> None:
        for pool in self.pools:
            for candidate in pool.candidates:
                self.by_id[candidate.id] = candidate
            for set_name, counters in pool.counter_sets.items():
                self.counters[(pool.driver, pool.name, set_name)] = dict(counters)
        # Devices held by other claims consume their counters (a shared device once).
        held = set(self.existing.exclusive) | set(self.existing.shared)
        for device_id in held:
            held_device = self.by_id.get(device_id)
            if held_device is None:
                continue
            for set_name, counters in held_device.consumes():
                available = self.counters.get((held_device.driver, held_device.pool, set_name))
                if available is None:
                    continue
                for counter, amount in counters.items():
                    if counter in available:
                        available[counter] = max(Decimal(0), available[counter] - amount)

    # ------------------------------------------------------------------------------------------------------
    def report_for(self, claim_index: int, request: DeviceRequestSpec) -> RequestReport:
        key = f"{claim_index}:{request.name}"
        report = self.reports.get(key)
        if report is not None:
            return report
        rejected: list[Rejection] = []
        report = RequestReport(request.name, rejected=rejected)
        device_class = self.classes.get(request.class_name)
        if device_class is None:
            report.abort = f"DeviceClass {request.class_name!r} not found"
            self.reports[key] = report
            return report
        selectors = self.selector_sets.get((claim_index, request.name))
        if selectors is None:
            selectors = SelectorSet(request.class_name, device_class.selectors, request.selectors)
            self.selector_sets[(claim_index, request.name)] = selectors
        existing = self.existing
        check_existing = bool(existing.exclusive or existing.shared) and not request.admin_access
        check_capacity = bool(request.capacity_requests)
        all_mode = request.all_devices
        eligible = report.eligible
        sequence = report.sequence
        verdict_of = selectors.verdict
        for pool in self.pools:
            # Incomplete and invalid pools are skipped (as kube-scheduler 1.36 does: the differential test
            # checks it); for allocationMode All they are an error because "all" is unknown.
            pool_problem = None
            if pool.incomplete:
                pool_problem = (
                    f"pool {pool.name} is incomplete ({len(pool.slices)} of {pool.slice_count} slices)"
                )
            elif pool.invalid_reason:
                pool_problem = f"pool {pool.name} is invalid: {pool.invalid_reason}"
            if pool_problem is not None:
                rejected.extend(Rejection(c.label, pool_problem, "pool") for c in pool.candidates)
                if all_mode:
                    report.errors.append(pool_problem)
                continue
            for candidate in pool.candidates:
                in_use = check_existing and (
                    candidate.id in existing.exclusive
                    or (candidate.id in existing.shared and not candidate.allow_multiple)
                )
                if in_use and not all_mode:
                    # The scheduler checks "in use" before the selectors (and so never sees their errors).
                    holder = existing.holders.get(candidate.id)
                    rejected.append(
                        Rejection(candidate.label, f"already allocated to claim {holder}", "allocated")
                    )
                    continue
                verdict = verdict_of(candidate)
                if verdict is not None:
                    kind, reason = verdict
                    rejected.append(Rejection(candidate.label, reason, kind))
                    if kind == "cel-error":
                        error = f"{reason} on device {candidate.label}"
                        sequence.append(error)
                        report.errors.append(error)
                    continue
                if in_use:
                    holder = existing.holders.get(candidate.id)
                    rejected.append(
                        Rejection(candidate.label, f"already allocated to claim {holder}", "allocated")
                    )
                    report.all_failures.append(
                        f"matching device {candidate.label} is allocated to claim {holder}"
                    )
                    continue
                data = candidate.data
                if "taints" in data:
                    problem = untolerated_taint(candidate, request.tolerations)
                    if problem is not None:
                        rejected.append(Rejection(candidate.label, problem, "taint"))
                        report.all_failures.append(f"matching device {candidate.label}: {problem}")
                        continue
                if check_capacity or data.get("allowMultipleAllocations"):
                    _, problem = capacity_share(candidate, request)
                    if problem is not None:
                        rejected.append(Rejection(candidate.label, problem, "capacity"))
                        report.all_failures.append(f"matching device {candidate.label}: {problem}")
                        continue
                eligible.append(candidate)
                sequence.append(candidate)
        self.reports[key] = report
        return report

    # ------------------------------------------------------------------------------------------------------
    def run(self) -> NodeResult:
        self._init_counters()  # only nodes that are searched need the counter bookkeeping
        slots = [(ci, request) for ci, claim in enumerate(self.claims) for request in claim.requests]
        reason: str | None = None
        scheduler_error = False
        try:
            success = self._solve(slots, 0)
        except _SearchAbortedError as aborted:
            success, reason, scheduler_error = False, str(aborted), aborted.scheduler_error
        if not success and reason is None:
            reason = self._explain_failure(slots)
        results: list[list[AllocatedDevice]] = [[] for _ in self.claims]
        if success:
            for claim_index, request, candidate, consumed in self.picked:
                results[claim_index].append(
                    AllocatedDevice(
                        request=request.name,
                        driver=candidate.driver,
                        pool=candidate.pool,
                        device=candidate.name,
                        admin_access=request.admin_access,
                        share_id=str(uuid.uuid4())
                        if candidate.allow_multiple and not request.admin_access
                        else None,
                        consumed_capacity=consumed if candidate.allow_multiple else None,
                        tolerations=list(request.raw_tolerations),
                    )
                )
        return NodeResult(self.node, success, reason, results, self.reports, self.late, scheduler_error)

    def _explain_failure(self, slots: Sequence[tuple[int, Any]]) -> str:
        for claim_index, request in slots:
            for alternative in request.alternatives:
                report = self.report_for(claim_index, alternative)
                if report.abort:
                    return report.abort
            alternative = request.alternatives[-1]
            report = self.report_for(claim_index, alternative)
            needed = "all" if alternative.all_devices else str(alternative.count)
            late = self.late.get(f"{claim_index}:{alternative.name}", {})
            if alternative.all_devices:
                if not report.eligible:
                    return f"request {alternative.name}: no matching device for allocationMode All"
                if report.all_failures:
                    return f"request {alternative.name}: allocationMode All: {report.all_failures[0]}"
            if len(report.eligible) < (1 if alternative.all_devices else alternative.count):
                return (
                    f"request {alternative.name}: needs {needed} device(s), "
                    f"{len(report.eligible)} eligible on this node"
                )
            if late:
                sample = next(iter(late.values()))
                return (
                    f"request {alternative.name}: {len(report.eligible)} eligible device(s) "
                    "but no combination "
                    f"fits (e.g. {sample.device}: {sample.reason})"
                )
        return "no combination of devices satisfies all requests and constraints"

    # ------------------------------------------------------------------------------------------------------
    def _solve(self, slots: Sequence[tuple[int, Any]], index: int) -> bool:
        if index == len(slots):
            return True
        claim_index, request = slots[index]
        for alternative in request.alternatives:
            report = self.report_for(claim_index, alternative)
            if report.abort:
                raise _SearchAbortedError(report.abort)
            if alternative.all_devices:
                if self._pick_all(slots, index, claim_index, alternative, report):
                    return True
            elif self._pick(slots, index, claim_index, alternative, report, 0, 0):
                return True
        return False

    def _pick_all(
        self,
        slots: Sequence[tuple[int, Any]],
        index: int,
        claim_index: int,
        request: DeviceRequestSpec,
        report: RequestReport,
    ) -> bool:
        if report.errors:
            # Incomplete or invalid pools and CEL errors are errors for "All", not just a failed attempt.
            raise _SearchAbortedError(
                f"request {request.name} asks for all devices: {report.errors[0]}", scheduler_error=True
            )
        if not report.eligible or report.all_failures:
            return False  # at least one device, and every matching device must be usable
        added = 0
        for candidate in report.eligible:
            if not self._add(claim_index, request, candidate):
                for _ in range(added):
                    self._remove()
                return False
            added += 1
        if self._solve(slots, index + 1):
            return True
        for _ in range(added):
            self._remove()
        return False

    def _pick(
        self,
        slots: Sequence[tuple[int, Any]],
        index: int,
        claim_index: int,
        request: DeviceRequestSpec,
        report: RequestReport,
        have: int,
        start: int,
    ) -> bool:
        if have == request.count:
            return self._solve(slots, index + 1)
        sequence = report.sequence
        # Without error entries the tail that cannot hold the remaining devices can be skipped.
        end = len(sequence) if report.errors else len(sequence) - (request.count - have) + 1
        for position in range(start, end):
            candidate = sequence[position]
            if isinstance(candidate, str):
                raise _SearchAbortedError(candidate, scheduler_error=True)
            if not self._add(claim_index, request, candidate):
                continue
            if self._pick(slots, index, claim_index, request, report, have + 1, position + 1):
                return True
            self._remove()
        return False

    def _reject_late(
        self, claim_index: int, request: DeviceRequestSpec, candidate: Candidate, reason: str, kind: str
    ) -> bool:
        bucket = self.late.setdefault(f"{claim_index}:{request.name}", {})
        bucket.setdefault(candidate.label, Rejection(candidate.label, reason, kind))
        return False

    def _add(self, claim_index: int, request: DeviceRequestSpec, candidate: Candidate) -> bool:
        self.steps += 1
        if self.steps > self.step_limit:
            raise _SearchAbortedError(f"allocation search gave up after {self.step_limit} steps")
        device_id = candidate.id
        earlier = self.picked_ids.get(device_id, [])
        if earlier and not (candidate.allow_multiple or request.admin_access):
            return self._reject_late(
                claim_index,
                request,
                candidate,
                f"already picked for request {earlier[0]} in this allocation",
                "allocated",
            )
        if earlier and request.name in earlier:
            return False
        consumed: dict[str, Decimal] | None = None
        if not request.admin_access:
            if candidate.allow_multiple:
                consumed, problem = capacity_share(candidate, request)
                if problem is not None:
                    return self._reject_late(claim_index, request, candidate, problem, "capacity")
                assert consumed is not None
                problem = self._capacity_left(candidate, consumed)
                if problem is not None:
                    return self._reject_late(claim_index, request, candidate, problem, "capacity")
            in_use = bool(earlier) or device_id in self.existing.shared
            if not (candidate.allow_multiple and in_use):
                problem = self._counters_left(candidate)
                if problem is not None:
                    return self._reject_late(claim_index, request, candidate, problem, "counter")
        problem = self._constraints_accept(claim_index, request, candidate)
        if problem is not None:
            return self._reject_late(claim_index, request, candidate, problem, "constraint")
        # Commit.
        charged = False
        if not request.admin_access:
            in_use = bool(earlier) or device_id in self.existing.shared
            if not (candidate.allow_multiple and in_use):
                self._charge_counters(candidate, Decimal(-1))
                charged = True
        self._push_constraints(claim_index, request, candidate)
        self.picked.append((claim_index, request, candidate, consumed))
        self.picked_ids.setdefault(device_id, []).append(request.name)
        self._charged.append(charged)
        return True

    def _remove(self) -> None:
        claim_index, request, candidate, _ = self.picked.pop()
        charged = self._charged.pop()
        if charged:
            self._charge_counters(candidate, Decimal(1))
        self._pop_constraints(claim_index, request)
        names = self.picked_ids[candidate.id]
        names.pop()
        if not names:
            del self.picked_ids[candidate.id]

    # ------------------------------------------------------------------------------------------------------
    def _capacity_left(self, candidate: Candidate, consumed: Mapping[str, Decimal]) -> str | None:
        capacity = candidate.capacity()
        shares = list(self.existing.shared.get(candidate.id, []))
        shares += [c for _, _, picked, c in self.picked if picked.id == candidate.id and c is not None]
        for name, amount in consumed.items():
            used = sum((share.get(name, Decimal(0)) for share in shares), Decimal(0))
            if used + amount > capacity.get(name, Decimal(0)):
                return f"capacity {name}: {used} of {capacity.get(name)} in use, {amount} more does not fit"
        return None

    def _counters_left(self, candidate: Candidate) -> str | None:
        for set_name, counters in candidate.consumes():
            available = self.counters.get((candidate.driver, candidate.pool, set_name))
            if available is None:
                return f"counter set {set_name} does not exist"
            for counter, amount in counters.items():
                if available.get(counter, Decimal(0)) < amount:
                    return (
                        f"counter {set_name}/{counter} exhausted: needs {amount}, "
                        f"{available.get(counter, Decimal(0))} left"
                    )
        return None

    def _charge_counters(self, candidate: Candidate, sign: Decimal) -> None:
        for set_name, counters in candidate.consumes():
            available = self.counters[(candidate.driver, candidate.pool, set_name)]
            for counter, amount in counters.items():
                available[counter] = available.get(counter, Decimal(0)) + sign * amount

    # ------------------------------------------------------------------------------------------------------
    def _constraints_for(self, claim_index: int, request: DeviceRequestSpec) -> list[tuple[int, Constraint]]:
        base = request.name.split("/")[0]
        out = []
        for position, constraint in enumerate(self.claims[claim_index].constraints):
            if not constraint.requests or base in constraint.requests or request.name in constraint.requests:
                out.append((position, constraint))
        return out

    def _constraints_accept(
        self, claim_index: int, request: DeviceRequestSpec, candidate: Candidate
    ) -> str | None:
        # Kubernetes 1.37 with DRAListTypeAttributes (the experimental allocator): every attribute is a set
        # of typed values, a scalar a one-element set. matchAttribute keeps the running intersection of the
        # picked devices' sets and needs it non-empty; distinctAttribute needs the sets pairwise disjoint.
        # For scalars this is plain equality / inequality, what every release does.
        for position, constraint in self._constraints_for(claim_index, request):
            attribute = constraint.match_attribute or constraint.distinct_attribute or ""
            value = attribute_key(candidate, attribute)
            if value is None:
                return f"constraint on {attribute}: device does not have the attribute"
            values = self.constraint_values.get((claim_index, position), [])
            if constraint.match_attribute and values:
                common = frozenset.intersection(value, *values)
                if not common:
                    shared = _show(frozenset.intersection(*values))
                    return f"matchAttribute {attribute}: {_show(value)} has nothing in common with {shared}"
            if constraint.distinct_attribute:
                for used in values:
                    if value & used:
                        return f"distinctAttribute {attribute}: {_show(value & used)} is already used"
        return None

    def _push_constraints(self, claim_index: int, request: DeviceRequestSpec, candidate: Candidate) -> None:
        for position, constraint in self._constraints_for(claim_index, request):
            attribute = constraint.match_attribute or constraint.distinct_attribute or ""
            self.constraint_values.setdefault((claim_index, position), []).append(
                attribute_key(candidate, attribute)
            )

    def _pop_constraints(self, claim_index: int, request: DeviceRequestSpec) -> None:
        for position, _ in self._constraints_for(claim_index, request):
            self.constraint_values[(claim_index, position)].pop()


_LIST_KINDS = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}


def attribute_key(candidate: Candidate, qualified: str) -> frozenset[tuple[str, Any]] | None:
    """The values of a fully qualified attribute as a set of (kind, value) pairs, or None when the device
    lacks it. A scalar is a one-element set; a list attribute (`ints`, `bools`, `strings`, `versions`) the set
    of its items, of the item kind, so `int: 1` and `ints: [1, 2]` share the value 1. Versions compare as
    strings, like the scheduler (semver 2.0.0 strings are minimal, so equal versions are equal strings)."""
    attributes = candidate.data.get("attributes") or {}
    raw = attributes.get(qualified)
    if raw is None:
        domain, _, ident = qualified.partition("/")
        if domain == candidate.driver:
            raw = attributes.get(ident)
    if not isinstance(raw, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            return frozenset({(kind, raw[kind])})
    for field_name, kind in _LIST_KINDS.items():
        items = raw.get(field_name)
        if isinstance(items, list) and items:
            return frozenset((kind, item) for item in items)
    return None


def _show(values: frozenset[tuple[str, Any]]) -> str:
    shown = sorted(str(value) for _, value in values)
    return shown[0] if len(shown) == 1 else "[" + ", ".join(shown) + "]"
