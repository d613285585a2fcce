"""The soak's short form, part of `make test`: a few hundred steps from a fixed seed on both profiles (the
simulated DGX H100; the DGX A100 with MIG and NVIDIA's consumable shares), with every kind of fault, and the
invariants checked after every step. `make soak` runs the long one (SOAK_OPS, SOAK_SEED)."""

from __future__ import annotations

import os

import pytest

from tests.soak.driver import SoakFailedError, describe, shrink, soak
from tests.soak.environment import SoakEnvironment
from tests.soak.profiles import PROFILES
from tests.soak.stats import SoakStats

SHORT_OPS = int(os.environ.get("SOAK_SHORT_OPS", "240"))
SEED = int(os.environ.get("SOAK_SHORT_SEED", "31"))
SHRINK_S = 180

pytestmark = [pytest.mark.apiserver, pytest.mark.timeout(600 + SHRINK_S)]


def test_short_soak_breaks_no_invariant(soak_env: SoakEnvironment) -> None:
    stats = SoakStats(seed=SEED)
    try:
        soak(list(PROFILES.values()), soak_env, SHORT_OPS, SEED, SHORT_OPS // 2, stats)
    except SoakFailedError as failure:
        shortest = shrink(soak_env, failure, SHRINK_S)
        pytest.fail(f"{failure}\n\nshortest sequence that breaks [{failure.rule}]:\n{describe(shortest)}")
    summary = stats.summary()
    print(stats.report())
    assert summary["ops"] == SHORT_OPS and summary["violations"] == 0
    assert summary["kills"] > 0 and summary["invariant_checks"] >= SHORT_OPS
    assert len(summary["claims_allocated"]) >= 5  # kinds of claims
