"""The soak's shrinking on its own (no node): from a long run whose failure needs a few of its steps, in
order, it keeps exactly those."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from tests.soak.driver import Step, shrink_steps


def needs(*names: str) -> Callable[[Sequence[Step]], bool]:
    def still_fails(steps: Sequence[Step]) -> bool:
        wanted = iter(names)
        current = next(wanted)
        for step in steps:
            if step.name == current:
                current = next(wanted, "")
                if not current:
                    return True
        return False

    return still_fails


def test_a_failure_needing_three_steps_in_order_shrinks_to_them() -> None:
    rng = random.Random(31)
    steps = [Step(rng.choice(["start_pod", "stop_pod", "allocate_claim"]), {"pick": i}) for i in range(300)]
    steps[40] = Step("fill_disk", {"where": "checkpoint"})
    steps[170] = Step("kill_mps_daemon", {"pick": 3})
    steps[260] = Step("free_disk")
    still_fails = needs("fill_disk", "kill_mps_daemon", "free_disk")
    assert still_fails(steps)
    shortest = shrink_steps(steps, still_fails, time.monotonic() + 30, log=lambda _: None)
    assert shortest == [steps[40], steps[170], steps[260]]


def test_shrinking_stops_at_its_deadline() -> None:
    steps = [Step("start_pod", {"pick": i}) for i in range(50)]
    assert shrink_steps(steps, lambda s: True, time.monotonic() - 1, log=lambda _: None) == steps
