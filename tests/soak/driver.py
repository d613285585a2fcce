"""Drive a soak: draw steps from a seed (weighted, each only when it applies), run them on fresh nodes,
check the invariants after each, and when one breaks, print the seed and shrink the recorded steps to the
shortest sequence that still breaks the same invariant (delta debugging over replays: drop halves, then
quarters, ... then single steps, keeping every cut after which the failure remains)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.soak.environment import SoakEnvironment
from tests.soak.fault_steps import FAULT_POINTS
from tests.soak.pacing import FAULT_GAP, MAX_CLAIMS
from tests.soak.profiles import Profile
from tests.soak.run import SoakRun
from tests.soak.run_state import InvariantBrokenError
from tests.soak.stats import SoakStats


@dataclass(frozen=True)
class Step:
    name: str  # a SoakRun method
    args: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.args.items())})"


Draw = Callable[[random.Random], dict[str, Any]]


def _pick(rng: random.Random) -> dict[str, Any]:
    return {"pick": rng.randrange(64)}


def _picks(low: int, high: int) -> Draw:
    return lambda rng: {"picks": [rng.randrange(64) for _ in range(rng.randint(low, high))]}


def _none(rng: random.Random) -> dict[str, Any]:
    return {}


# name: (weight, when it applies, its arguments). Kubelet work dominates; faults are rarer, and each fault
# that lasts (API server away, disk full, GPU lost) has a more likely step that ends it.
STEPS: dict[str, tuple[int, Callable[[SoakRun], bool], Draw]] = {
    "allocate_claim": (
        14,
        lambda r: len(r.claims) < MAX_CLAIMS,
        lambda rng: {"kind": rng.randrange(64), "draw": rng.randrange(2**16)},
    ),
    "start_pod": (20, lambda r: bool(r.claims), _pick),
    "stop_pod": (14, lambda r: bool(r.claims), _pick),
    "kubelet_retry": (8, lambda r: bool(r.claims), _pick),
    "delete_claim": (
        8,
        lambda r: bool(r.claims),
        lambda rng: {"pick": rng.randrange(64), "again": rng.random() < 0.3},
    ),
    "prepare_together": (3, lambda r: len(r.claims) > 1, _pick),
    "concurrent_calls": (6, lambda r: bool(r.claims), _picks(2, 4)),
    "kill_plugin_at_random": (
        4,
        lambda r: r.since_kill >= FAULT_GAP,
        lambda rng: {**_picks(1, 3)(rng), "delay_ms": rng.randrange(40)},
    ),
    "arm_fault_point": (
        4,
        lambda r: r.since_kill >= FAULT_GAP,
        lambda rng: {"point": rng.choice(FAULT_POINTS), "pick": rng.randrange(64)},
    ),
    "restart_plugin": (1, lambda r: True, _none),
    "lose_gpu": (1, lambda r: not r.soak.lost_gpus, lambda rng: {"gpu": rng.randrange(8)}),
    "gpu_back": (3, lambda r: bool(r.soak.lost_gpus), _none),
    "kill_mps_daemon": (2, lambda r: True, _pick),
    "api_server_away": (1, lambda r: r.soak.proxy.is_up, _none),
    "api_server_back": (3, lambda r: not r.soak.proxy.is_up, _none),
    "fill_disk": (1, lambda r: not r.soak.fillers, lambda rng: {"where": rng.choice(("checkpoint", "cdi"))}),
    "free_disk": (3, lambda r: bool(r.soak.fillers), _none),
}


class SoakFailedError(Exception):
    """An invariant broke (or a step failed): `rule` names which, `steps` are the node's steps up to it,
    `profile` its node's profile (set by `soak`)."""

    def __init__(self, rule: str, message: str, steps: Sequence[Step]) -> None:
        super().__init__(message)
        self.rule, self.steps = rule, list(steps)
        self.profile: Profile | None = None


def draw_step(run: SoakRun, rng: random.Random) -> Step:
    names = [n for n, (_, applies, _) in STEPS.items() if applies(run)]
    name = rng.choices(names, weights=[STEPS[n][0] for n in names])[0]
    return Step(name, STEPS[name][2](rng))


def _execute(run: SoakRun, step: Step, done: list[Step]) -> None:
    done.append(step)
    run.stats.ops[step.name] += 1
    try:
        getattr(run, step.name)(**step.args)
        run.node_matches_claims()
    except InvariantBrokenError as broken:
        raise SoakFailedError(broken.violation.rule, str(broken), done) from broken
    except Exception as error:  # anything else that goes wrong under a step is a finding too
        raise SoakFailedError(f"error:{type(error).__name__}", f"{step}: {error!r}", done) from error


def run_node(
    profile: Profile,
    env: SoakEnvironment,
    stats: SoakStats,
    steps: int | Sequence[Step],
    rng: random.Random | None,
) -> list[Step]:
    """One fresh node: `steps` drawn from `rng` (a count) or replayed (a list; steps that do not apply at
    their turn are left out). Returns the steps run; raises SoakFailedError."""
    run = SoakRun(profile, env, stats)
    done: list[Step] = []
    try:
        run.node_matches_claims()
        if isinstance(steps, int):
            assert rng is not None
            for _ in range(steps):
                _execute(run, draw_step(run, rng), done)
        else:
            for step in steps:
                if STEPS[step.name][1](run):
                    _execute(run, step, done)
        try:
            run.teardown_checks()
        except InvariantBrokenError as broken:
            raise SoakFailedError(broken.violation.rule, str(broken), done) from broken
    finally:
        run.close()
    return done


def soak(
    profiles: Sequence[Profile],
    env: SoakEnvironment,
    ops: int,
    seed: int,
    steps_per_node: int,
    stats: SoakStats,
    progress: Callable[[str], None] = lambda line: None,
) -> None:
    """`ops` steps in all, nodes of each profile in turn, `steps_per_node` on each (`progress` hears of each
    node done); raises SoakFailedError."""
    rng = random.Random(seed)
    left, turn = ops, 0
    per_node = min(steps_per_node, -(-ops // len(profiles)))  # every profile gets a node
    while left > 0:
        profile = profiles[turn % len(profiles)]
        count = min(per_node, left)
        node_seed = rng.randrange(2**32)
        try:
            run_node(profile, env, stats, count, random.Random(node_seed))
        except SoakFailedError as failure:
            where = f"SOAK_SEED={seed}: node {turn}, profile {profile.name}, node seed {node_seed}"
            failure.args = (f"{failure.args[0]}\n({where})",)
            failure.profile = profile
            raise
        left -= count
        turn += 1
        progress(
            f"node {turn} ({profile.name}) done: {ops - left}/{ops} steps, {stats.kills} kills, "
            f"{sum(stats.faults.values())} faults, {stats.checks} checks, "
            f"{time.monotonic() - stats.started:.0f} s"
        )


def shrink(
    env: SoakEnvironment,
    failure: SoakFailedError,
    budget_s: float = 600.0,
    log: Callable[[str], None] = print,
) -> list[Step]:
    """A short sequence of the failing run's steps that still breaks the same rule, each try replayed on a
    fresh node (within the time budget). A failure that does not come back on replay (it needed the timing
    of a random-moment kill) is returned as it was, and said so."""
    profile = failure.profile
    assert profile is not None, "shrink a failure that `soak` raised"

    def still_fails(candidate: Sequence[Step]) -> bool:
        try:
            run_node(profile, env, SoakStats(), candidate, None)
        except SoakFailedError as again:
            return again.rule == failure.rule
        return False

    if not still_fails(failure.steps):
        log(f"shrink: the replayed steps do not break [{failure.rule}] again (timing); not shrunk")
        return list(failure.steps)
    return shrink_steps(failure.steps, still_fails, time.monotonic() + budget_s, log)


def shrink_steps(
    steps: Sequence[Step],
    still_fails: Callable[[Sequence[Step]], bool],
    deadline: float,
    log: Callable[[str], None] = print,
) -> list[Step]:
    """Delta debugging: try without each half, then each quarter, ... then each single step, keeping every
    cut after which `still_fails`; stops at `deadline` (time.monotonic())."""
    kept = list(steps)
    chunk = max(1, len(kept) // 2)
    while chunk >= 1 and time.monotonic() < deadline:
        start, cut_any = 0, False
        while start < len(kept) and time.monotonic() < deadline:
            candidate = kept[:start] + kept[start + chunk :]
            if candidate and still_fails(candidate):
                kept, cut_any = candidate, True
                log(f"shrink: {len(kept)} steps still fail")
            else:
                start += chunk
        if not cut_any:
            chunk //= 2
    return kept


def describe(steps: Sequence[Step]) -> str:
    return (
        "\n".join(f"  {i:3d}. {s}" for i, s in enumerate(steps))
        + "\n"
        + json.dumps([{"name": s.name, "args": dict(s.args)} for s in steps])
    )
