"""Per-device checks that do not depend on what else gets picked: selectors, taints, capacity requests.

Selector verdicts are cached per selector set, keyed by the values of exactly the device fields the
expressions read (see `dra_gpu.cel.references`), so identical devices on a thousand nodes cost one evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import ROUND_CEILING, Decimal
from typing import Any

from dra_gpu.allocator.model import Candidate, DeviceRequestSpec, Toleration, quantity_of
from dra_gpu.cel.device import raw_path_value
from dra_gpu.cel.environment import CompiledExpression
from dra_gpu.cel.errors import CelEvalError
from dra_gpu.cel.references import Path

Verdict = (
    tuple[str, str] | None
)  # None: all selectors true; else (kind, reason), kind "selector" or "cel-error"


class SelectorSet:
    """Class selectors, then request selectors, of one request, as the scheduler evaluates them."""

    def __init__(
        self,
        class_name: str,
        class_selectors: Sequence[CompiledExpression],
        request_selectors: Sequence[CompiledExpression],
    ):
        self.entries: list[tuple[str, CompiledExpression]] = [
            (f"DeviceClass {class_name} selector #{i}", s) for i, s in enumerate(class_selectors)
        ] + [(f"request selector #{i}", s) for i, s in enumerate(request_selectors)]
        paths: set[Path] = set()
        for _, selector in self.entries:
            paths |= selector.paths
        self.whole_device = () in paths
        self.paths: tuple[Path, ...] = tuple(sorted(paths))
        # (section, ident, qualified name) per value path; other paths fall back to raw_path_value.
        self.value_paths = all(len(p) == 3 or p == ("driver",) for p in self.paths)
        self.getters = [(p[0], p[1], p[2], f"{p[1]}/{p[2]}") for p in self.paths if len(p) == 3]
        self.cache: dict[tuple[Any, ...], Verdict] = {}
        # Device entries shared between nodes (replicated inventories) are recognised by identity;
        # the entry is
        # kept with the verdict so that its id cannot be reused by another object.
        self.by_identity: dict[int, tuple[Mapping[str, Any], str, Verdict]] = {}
        self.evaluations = 0

    def verdict(self, candidate: Candidate) -> Verdict:
        if not self.entries:
            return None
        data = candidate.data
        known = self.by_identity.get(id(data))
        if known is not None and known[0] is data and known[1] == candidate.driver:
            return known[2]
        verdict = self._verdict_by_content(candidate)
        self.by_identity[id(data)] = (data, candidate.driver, verdict)
        return verdict

    def _verdict_by_content(self, candidate: Candidate) -> Verdict:
        data = candidate.data
        driver = candidate.driver
        if self.whole_device:
            key: tuple[Any, ...] = (driver, raw_path_value(driver, data, ()))
        elif self.value_paths:
            parts: list[Any] = [driver]
            for section, domain, ident, qualified in self.getters:
                entries = data.get(section)
                value = None
                if entries:
                    value = entries.get(ident) if domain == driver else None
                    if value is None:
                        value = entries.get(qualified)
                if value is None:
                    parts.append(None)
                elif section == "capacity":
                    parts.append(value.get("value"))  # CEL sees only the value, not the request policy
                else:
                    parts.append(tuple(value.items()))
            key = tuple(parts)
        else:
            key = (driver, *[raw_path_value(driver, data, p) for p in self.paths])
        try:
            return self.cache[key]
        except KeyError:
            pass
        except TypeError:  # unhashable value in the data: evaluate without caching
            return self._evaluate(candidate)
        result = self._evaluate(candidate)
        self.cache[key] = result
        return result

    def _evaluate(self, candidate: Candidate) -> Verdict:
        self.evaluations += 1
        for label, selector in self.entries:
            try:
                if not selector.matches(candidate.cel()):
                    return ("selector", f"{label} is false: {selector.expression}")
            except CelEvalError as error:
                return (
                    "cel-error",
                    f"{label}: CEL runtime error: {error.message} (expression: {selector.expression})",
                )
        return None


def untolerated_taint(candidate: Candidate, tolerations: Sequence[Toleration]) -> str | None:
    for taint in candidate.data.get("taints") or ():
        effect = str(taint.get("effect") or "")
        if effect not in ("NoSchedule", "NoExecute"):
            continue  # None and unknown effects do not keep devices away
        if not any(_tolerates(t, taint) for t in tolerations):
            key = taint.get("key", "")
            value = taint.get("value")
            shown = f"{key}={value}" if value else str(key)
            return f"taint {shown}:{effect} is not tolerated"
    return None


def _tolerates(toleration: Toleration, taint: Mapping[str, Any]) -> bool:
    if toleration.effect and toleration.effect != taint.get("effect"):
        return False
    if toleration.operator == "Exists":
        return not toleration.key or toleration.key == taint.get("key")
    return toleration.key == taint.get("key") and toleration.value == str(taint.get("value") or "")


def qualify(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def capacity_share(
    candidate: Candidate, request: DeviceRequestSpec
) -> tuple[dict[str, Decimal] | None, str | None]:
    """What one allocation of `candidate` for `request` consumes (multi-allocatable devices), or why it
    cannot.

    For a device without allowMultipleAllocations the capacity requests are minimums; nothing is consumed.
    """
    driver = candidate.driver
    capacities = {qualify(name, driver): (name, value) for name, value in candidate.capacity().items()}
    requested = {qualify(name, driver): amount for name, amount in request.capacity_requests.items()}
    for name in requested:
        if name not in capacities:
            return None, f"device has no capacity {name!r}"
    if not candidate.allow_multiple:
        for name, amount in requested.items():
            published, value = capacities[name]
            if amount > value:
                return None, f"capacity {published} is {value}, request asks for {amount}"
        return None, None
    raw_capacity = candidate.data.get("capacity") or {}
    consumed: dict[str, Decimal] = {}
    for qualified, (published, full) in capacities.items():
        policy = (raw_capacity.get(published) or {}).get("requestPolicy") or {}
        share_amount, problem = _consumed_amount(
            requested.get(qualified), full, policy, f"device {candidate.label}"
        )
        if problem is not None:
            return None, f"capacity {published}: {problem}"
        assert share_amount is not None
        consumed[published] = share_amount
    return consumed, None


def _consumed_amount(
    requested: Decimal | None, value: Decimal, policy: Mapping[str, Any], where: str
) -> tuple[Decimal | None, str | None]:
    if requested is None:
        if policy.get("default") is not None:
            return quantity_of(policy["default"], f"{where} requestPolicy.default"), None
        return value, None  # not requested and no default: the whole capacity
    valid_values = [
        quantity_of(v, f"{where} requestPolicy.validValues") for v in policy.get("validValues") or ()
    ]
    if valid_values:
        for candidate_value in sorted(valid_values):
            if candidate_value >= requested:
                return candidate_value, None
        return (
            None,
            f"request {requested} is above every valid value ({', '.join(str(v) for v in valid_values)})",
        )
    valid_range = policy.get("validRange")
    if valid_range:
        minimum = quantity_of(valid_range.get("min"), f"{where} requestPolicy.validRange.min")
        amount = max(requested, minimum)
        if valid_range.get("step") is not None:
            step = quantity_of(valid_range["step"], f"{where} requestPolicy.validRange.step")
            steps = ((amount - minimum) / step).to_integral_value(rounding=ROUND_CEILING)
            amount = minimum + steps * step
        if valid_range.get("max") is not None:
            maximum = quantity_of(valid_range["max"], f"{where} requestPolicy.validRange.max")
            if amount > maximum:
                return None, f"request {requested} is above the maximum {maximum}"
        if amount > value:
            return None, f"request {requested} is above the capacity {value}"
        return amount, None
    if requested > value:
        return None, f"request {requested} is above the capacity {value}"
    return requested, None
