"""Drive a soak: draw steps from a seed (weighted, each only when it applies), run them on fresh nodes,
check the invariants after each, and when one breaks, print the seed and shrink the recorded steps to the
shortest sequence that still breaks the same invariant (delta debugging over replays: drop halves, then
quarters, ... then single steps, keeping every cut after which the failure remains).

The seed decides everything that is drawn: each node's seed, and from it the node's name (which seeds its
simulated hardware) and its steps. Fault points are not drawn but scheduled (tests/soak/fault_schedule.py):
each armed fault point is the next one this soak has not reached, and `fault_every` arms one every that many
steps, so that a short soak reaches them all. A failure is recorded with its node's seed, profile, plugin
environment and steps (`failure_record`), which `python -m tests.soak --replay REPORT.json` runs again."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.soak.environment import SoakEnvironment
from tests.soak.fault_schedule import next_point
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


Draw = Callable[[random.Random, SoakRun], dict[str, Any]]


def _pick(rng: random.Random, run: SoakRun) -> dict[str, Any]:
    return {"pick": rng.randrange(64)}


def _picks(low: int, high: int) -> Draw:
    return lambda rng, run: {"picks": [rng.randrange(64) for _ in range(rng.randint(low, high))]}


def _none(rng: random.Random, run: SoakRun) -> dict[str, Any]:
    return {}


def _scheduled_point(rng: random.Random, run: SoakRun) -> dict[str, Any]:
    """The next fault point of the schedule (not drawn), and a claim pick."""
    return {
        "point": next_point(run.profile.kinds, run.stats.fault_points, run.armed),
        "pick": rng.randrange(64),
    }


# name: (weight, when it applies, its arguments). Kubelet work dominates; faults are rarer, and each fault
# that lasts (API server away, disk full, GPU lost) has a more likely step that ends it.
STEPS: dict[str, tuple[int, Callable[[SoakRun], bool], Draw]] = {
    "allocate_claim": (
        14,
        lambda r: len(r.claims) < MAX_CLAIMS,
        lambda rng, run: {"kind": rng.randrange(64), "draw": rng.randrange(2**16)},
    ),
    "start_pod": (20, lambda r: bool(r.claims), _pick),
    "stop_pod": (14, lambda r: bool(r.claims), _pick),
    "kubelet_retry": (8, lambda r: bool(r.claims), _pick),
    "delete_claim": (
        8,
        lambda r: bool(r.claims),
        lambda rng, run: {"pick": rng.randrange(64), "again": rng.random() < 0.3},
    ),
    "prepare_together": (3, lambda r: len(r.claims) > 1, _pick),
    "concurrent_calls": (6, lambda r: bool(r.claims), _picks(2, 4)),
    "kill_plugin_at_random": (
        4,
        lambda r: r.since_kill >= FAULT_GAP,
        lambda rng, run: {**_picks(1, 3)(rng, run), "delay_ms": rng.randrange(40)},
    ),
    "arm_fault_point": (4, lambda r: r.since_kill >= FAULT_GAP, _scheduled_point),
    "restart_plugin": (1, lambda r: True, _none),
    "lose_gpu": (1, lambda r: not r.soak.lost_gpus, lambda rng, run: {"gpu": rng.randrange(8)}),
    "gpu_back": (3, lambda r: bool(r.soak.lost_gpus), _none),
    "kill_mps_daemon": (2, lambda r: True, _pick),
    "api_server_away": (1, lambda r: r.soak.proxy.is_up, _none),
    "api_server_back": (3, lambda r: not r.soak.proxy.is_up, _none),
    "fill_disk": (
        1,
        lambda r: not r.soak.fillers,
        lambda rng, run: {"where": rng.choice(("checkpoint", "cdi"))},
    ),
    "free_disk": (3, lambda r: bool(r.soak.fillers), _none),
}


class SoakFailedError(Exception):
    """An invariant broke (or a step failed): `rule` names which, `steps` are the node's steps up to it;
    `profile`, `node_seed` and `plugin_env` say how to make the same node again (set by `run_node`)."""

    def __init__(self, rule: str, message: str, steps: Sequence[Step]) -> None:
        super().__init__(message)
        self.rule, self.steps = rule, list(steps)
        self.profile: Profile | None = None
        self.node_seed = 0
        self.plugin_env: dict[str, str] = {}


def draw_step(run: SoakRun, rng: random.Random, scheduled_fault: bool = False) -> Step:
    """A step drawn by weight among those that apply; `scheduled_fault`: the fault schedule's turn (an armed
    fault point) when it applies."""
    if scheduled_fault and STEPS["arm_fault_point"][1](run):
        return Step("arm_fault_point", _scheduled_point(rng, run))
    names = [n for n, (_, applies, _) in STEPS.items() if applies(run)]
    name = rng.choices(names, weights=[STEPS[n][0] for n in names])[0]
    return Step(name, STEPS[name][2](rng, run))


def _execute(run: SoakRun, step: Step, done: list[Step]) -> None:
    done.append(step)
    run.stats.ops[step.name] += 1
    try:
        run.begin_step()
        getattr(run, step.name)(**step.args)
        run.after_step(step.name)
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
    *,
    node_seed: int = 0,
    plugin_env: Mapping[str, str] | None = None,
    fault_every: int = 0,
) -> list[Step]:
    """One fresh node, made from `node_seed`: `steps` drawn from `rng` (a count; every `fault_every`-th one
    the fault schedule's) or replayed (a list; steps that do not apply at their turn are left out). Returns
    the steps run; raises SoakFailedError."""
    run = SoakRun(profile, env, stats, node_seed, plugin_env)
    done: list[Step] = []
    try:
        try:
            run.node_matches_claims()
            if isinstance(steps, int):
                assert rng is not None
                for turn in range(1, steps + 1):
                    scheduled = fault_every > 0 and turn % fault_every == 0
                    _execute(run, draw_step(run, rng, scheduled), done)
            else:
                for step in steps:
                    if STEPS[step.name][1](run):
                        _execute(run, step, done)
            try:
                run.teardown_checks()
            except InvariantBrokenError as broken:
                raise SoakFailedError(broken.violation.rule, str(broken), done) from broken
        except SoakFailedError as failure:
            failure.profile, failure.node_seed = profile, node_seed
            failure.plugin_env = dict(plugin_env or {})
            raise
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
    *,
    plugin_env: Mapping[str, str] | None = None,
    fault_every: int = 0,
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
            run_node(
                profile,
                env,
                stats,
                count,
                random.Random(node_seed),
                node_seed=node_seed,
                plugin_env=plugin_env,
                fault_every=fault_every,
            )
        except SoakFailedError as failure:
            where = f"SOAK_SEED={seed}: node {turn}, profile {profile.name}, node seed {node_seed}"
            failure.args = (f"{failure.args[0]}\n({where})",)
            raise
        left -= count
        turn += 1
        progress(
            f"node {turn} ({profile.name}) done: {ops - left}/{ops} steps, {stats.kill_count} kills, "
            f"{sum(stats.faults.values())} faults, {stats.checks} checks, {stats.workload_checks} workload "
            f"checks, {time.monotonic() - stats.started:.0f} s"
        )


def replay(
    env: SoakEnvironment, failure: SoakFailedError, steps: Sequence[Step], stats: SoakStats
) -> SoakFailedError | None:
    """Run `steps` on a fresh node made as the failing one was; how it fails, or None."""
    assert failure.profile is not None, "replay a failure that `run_node` raised"
    try:
        run_node(
            failure.profile,
            env,
            stats,
            steps,
            None,
            node_seed=failure.node_seed,
            plugin_env=failure.plugin_env,
        )
    except SoakFailedError as again:
        return again
    return None


def shrink(
    env: SoakEnvironment,
    failure: SoakFailedError,
    budget_s: float = 600.0,
    log: Callable[[str], None] = print,
) -> list[Step]:
    """A short sequence of the failing run's steps that still breaks the same rule, each try replayed on a
    fresh node made as the failing one was (within the time budget). A failure that does not come back on
    replay (it needed the timing of a random-moment kill) is returned as it was, and said so."""

    def still_fails(candidate: Sequence[Step]) -> bool:
        again = replay(env, failure, candidate, SoakStats())
        return again is not None and again.rule == failure.rule

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
    """Delta debugging: try without each half, then each quarter, ... then single step, keeping every
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


def steps_json(steps: Sequence[Step]) -> list[dict[str, Any]]:
    return [{"name": s.name, "args": dict(s.args)} for s in steps]


def steps_from_json(data: Sequence[Mapping[str, Any]]) -> list[Step]:
    unknown = sorted({str(d["name"]) for d in data} - set(STEPS))
    if unknown:
        raise ValueError(f"unknown soak steps {unknown}; known: {', '.join(STEPS)}")
    return [Step(str(d["name"]), dict(d.get("args") or {})) for d in data]


def failure_record(failure: SoakFailedError, shortest: Sequence[Step] | None) -> dict[str, Any]:
    """What a report keeps of a failure: enough to make the same node and run the same steps again."""
    assert failure.profile is not None
    return {
        "rule": failure.rule,
        "message": str(failure)[:4000],
        "profile": failure.profile.name,
        "node_seed": failure.node_seed,
        "plugin_env": dict(failure.plugin_env),
        "steps": steps_json(failure.steps),
        "shortest": steps_json(shortest) if shortest is not None else None,
    }


def describe(steps: Sequence[Step]) -> str:
    return "\n".join(f"  {i:3d}. {s}" for i, s in enumerate(steps)) + "\n" + json.dumps(steps_json(steps))
