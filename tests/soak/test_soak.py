"""The soak's short form, part of `make test`: a few hundred steps from a fixed seed on both profiles (the
simulated DGX H100; the DGX A100 with MIG and NVIDIA's consumable shares), with every kind of fault, the
invariants and the tenants checked after every step, and every named fault point of the plugin reached: the
fault schedule arms the next unreached one every FAULT_EVERY steps. `make soak` runs the long one
(SOAK_OPS, SOAK_SEED)."""

from __future__ import annotations

import os

import pytest

from tests.soak.driver import SoakFailedError, describe, shrink, soak
from tests.soak.environment import SoakEnvironment
from tests.soak.fault_schedule import FAULT_POINTS
from tests.soak.profiles import PROFILES
from tests.soak.stats import SoakStats

SHORT_OPS = int(os.environ.get("SOAK_SHORT_OPS", "240"))
SEED = int(os.environ.get("SOAK_SHORT_SEED", "31"))
FAULT_EVERY = 5
SHRINK_S = 180

pytestmark = [pytest.mark.apiserver, pytest.mark.timeout(900 + SHRINK_S)]


def test_short_soak_breaks_no_invariant_and_reaches_every_fault_point(soak_env: SoakEnvironment) -> None:
    stats = SoakStats(seed=SEED)
    try:
        soak(
            list(PROFILES.values()), soak_env, SHORT_OPS, SEED, SHORT_OPS // 2, stats, fault_every=FAULT_EVERY
        )
    except SoakFailedError as failure:
        shortest = shrink(soak_env, failure, SHRINK_S)
        pytest.fail(f"{failure}\n\nshortest sequence that breaks [{failure.rule}]:\n{describe(shortest)}")
    summary = stats.summary()
    print(stats.report())
    assert summary["ops"] == SHORT_OPS and summary["violations"] == 0
    assert summary["unexplained_refusals"] == 0 and summary["unexplained_deaths"] == 0
    assert summary["invariant_checks"] >= SHORT_OPS and summary["workload_checks"] >= SHORT_OPS // 2
    assert len(summary["claims_allocated"]) >= 5  # kinds of claims
    missed = [p for p in FAULT_POINTS if not summary["fault_points_reached"].get(p)]
    assert not missed, f"fault points never reached: {missed}"
    assert summary["kills_by_cause"].get("fault-point", 0) >= len(FAULT_POINTS)
