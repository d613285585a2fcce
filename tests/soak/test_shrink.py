"""The soak's shrinking: on its own (no node), from a long run whose failure needs a few of its steps, in
order, it keeps exactly those; and end to end, on a bug put back into the real plugin."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from dra_gpu.sharing.injected_bugs import ENV_VAR as INJECT_ENV
from tests.soak import __main__ as soak_main
from tests.soak.driver import (
    SoakFailedError,
    Step,
    describe,
    failure_record,
    replay,
    run_node,
    shrink,
    shrink_steps,
)
from tests.soak.environment import SoakEnvironment
from tests.soak.profiles import PROFILES
from tests.soak.stats import SoakStats


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


INJECTED = {INJECT_ENV: "caps-never-shrink"}
H100 = PROFILES["dgx-h100"]


@pytest.mark.apiserver
@pytest.mark.timeout(900)
def test_an_injected_bug_is_found_shrunk_to_a_short_sequence_and_replayed(
    soak_env: SoakEnvironment, tmp_path: Path
) -> None:
    """End to end, on a real bug put back behind a test-only switch (dra_gpu/sharing/injected_bugs.py: a
    GPU's shares server keeps the caps of a share that left). Among other steps, the fault schedule's turn
    for `mps-limits-recorded` prepares two shares of one GPU and unprepares the larger one: the soak must see
    the server keep the larger caps, shrink the run to the few steps that still break the same rule, and a
    replay of the recorded failure (as `python -m tests.soak --replay` does) must break it again. Without the
    bug the same steps pass."""
    rng = random.Random(5)
    kinds = [H100.kinds.index(k) for k in ("whole", "mig", "fraction", "time-slicing")]
    noise = [Step("allocate_claim", {"kind": k, "draw": rng.randrange(2**16)}) for k in kinds]
    noise += [Step(rng.choice(["start_pod", "stop_pod"]), {"pick": rng.randrange(64)}) for _ in range(10)]
    steps = [*noise[:9], Step("arm_fault_point", {"point": "mps-limits-recorded", "pick": 2}), *noise[9:]]
    with pytest.raises(SoakFailedError) as caught:
        run_node(H100, soak_env, SoakStats(), steps, None, node_seed=36, plugin_env=INJECTED)
    failure = caught.value
    assert failure.rule in ("caps-not-largest-share", "tenant-over-share"), failure
    assert len(failure.steps) >= 8  # it broke at the armed step, after the others

    shortest = shrink(soak_env, failure, budget_s=400, log=lambda _: None)
    assert len(shortest) <= 2, describe(shortest)
    again = replay(soak_env, failure, shortest, SoakStats())
    assert again is not None and again.rule == failure.rule

    report = tmp_path / "soak.json"
    report.write_text(json.dumps({"failure": failure_record(failure, shortest)}))
    recorded = json.loads(report.read_text())["failure"]
    assert recorded["node_seed"] == 36 and recorded["plugin_env"] == INJECTED
    assert soak_main._replay(soak_env, recorded, all_steps=False) == 1  # fails again: exit status 1
    without_bug = {**recorded, "plugin_env": {}}
    assert soak_main._replay(soak_env, without_bug, all_steps=False) == 0
