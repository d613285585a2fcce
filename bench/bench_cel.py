"""CEL selector speed: compile, evaluate per device (uncached), and cached verdicts per device shape.

Selector (NVIDIA's typical one): driver check && lowerAscii().matches() on the product name && memory capacity
compared with a quantity. Devices come from the simulated DGX H100 (GPUs, MIG placements, shares).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from dra_gpu.allocator.matching import SelectorSet
from dra_gpu.allocator.model import Candidate
from dra_gpu.cel.device import device_value
from dra_gpu.cel.environment import compile_selector
from dra_gpu.cel.errors import CelEvalError
from dra_gpu.cel.syntax import parse

SELECTOR = (
    "device.driver == 'gpu.nvidia.com' && "
    "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('.*h100.*') && "
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('10Gi')) >= 0"
)


def _devices() -> list[dict[str, Any]]:
    from bench.bench_explain import template_slices

    return [d for s in template_slices("node-0") for d in s["spec"].get("devices") or ()]


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else float("inf")


def run() -> dict[str, Any]:
    devices = _devices()
    figures: dict[str, Any] = {"devices": len(devices)}

    started = time.perf_counter()
    rounds = 200
    for i in range(rounds):
        parse(SELECTOR + f" || {i} == 0")  # distinct text: no cache
    figures["parse_and_check_ms"] = round((time.perf_counter() - started) / rounds * 1000, 3)

    selector = compile_selector(SELECTOR)
    values = [device_value("gpu.nvidia.com", d) for d in devices]
    started = time.perf_counter()
    evaluations = 0
    while time.perf_counter() - started < 2.0:
        for value in values:
            with contextlib.suppress(CelEvalError):  # a selector error is a result too
                selector.matches(value)
            evaluations += 1
    figures["selector_evals_per_s"] = _rate(evaluations, time.perf_counter() - started)

    started = time.perf_counter()
    built = 0
    while time.perf_counter() - started < 1.0:
        for device in devices:
            device_value("gpu.nvidia.com", device)
            built += 1
    figures["device_activations_per_s"] = _rate(built, time.perf_counter() - started)

    selector_set = SelectorSet("gpu.nvidia.com", [], [selector])
    candidates = [Candidate("gpu.nvidia.com", "node-0", "s", d["name"], d, "node-0") for d in devices]
    started = time.perf_counter()
    verdicts = 0
    while time.perf_counter() - started < 1.0:
        for candidate in candidates:
            selector_set.verdict(candidate)
            verdicts += 1
    figures["cached_verdicts_per_s"] = _rate(verdicts, time.perf_counter() - started)
    figures["distinct_shapes_evaluated"] = selector_set.evaluations
    return figures


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key:40s} {value}")
