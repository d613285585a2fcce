"""A soak's seed decides its nodes, their simulated hardware and their steps: a failure found once can be
run again (`python -m tests.soak --replay`, tests/soak/test_shrink.py)."""

from __future__ import annotations

import random

import pytest

from tests.soak.driver import run_node
from tests.soak.environment import SoakEnvironment
from tests.soak.profiles import PROFILES
from tests.soak.run import SoakRun
from tests.soak.stats import SoakStats

pytestmark = pytest.mark.apiserver

H100 = PROFILES["dgx-h100"]


def test_the_same_node_seed_makes_the_same_node_and_hardware(soak_env: SoakEnvironment) -> None:
    seen = []
    for seed in (11, 11, 12):
        run = SoakRun(H100, soak_env, SoakStats(), seed)
        try:
            seen.append((run.soak.node.name, [g.uuid for g in run.soak.node.sim_state().gpus]))
        finally:
            run.close()
    assert seen[0] == seen[1]
    assert seen[0][0] != seen[2][0] and set(seen[0][1]).isdisjoint(seen[2][1])


def test_the_same_seed_draws_the_same_steps_with_the_same_outcome(soak_env: SoakEnvironment) -> None:
    runs = []
    for _ in range(2):
        stats = SoakStats(seed=11)
        steps = run_node(H100, soak_env, stats, 20, random.Random(11), node_seed=11)
        runs.append((stats.nodes, steps, dict(stats.outcomes), dict(stats.fault_points)))
    assert runs[0] == runs[1]
