"""`python -m tests.soak --ops N --seed S` (`make soak SOAK_OPS=N SOAK_SEED=S`): the randomized fault soak on
both profiles (simulated DGX H100; DGX A100 with MIG and NVIDIA's consumable shares) against a real
kube-apiserver started for it. Prints the figures as JSON; when an invariant breaks, prints the seed and the
shrunk sequence of steps that breaks it, writes the failure into the report (`--report`), and exits 1.

`python -m tests.soak --replay REPORT.json` runs a recorded failure again: the same node (its seed names it
and seeds its simulated hardware), the same plugin environment, the shortest failing steps (`--all-steps`:
every step up to the failure); exits 1 when it fails again (printing the rule), 0 when it passes now."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dra_gpu.sharing.injected_bugs import ENV_VAR as INJECT_ENV
from dra_gpu.sharing.injected_bugs import KNOWN as KNOWN_BUGS
from tests.soak.driver import (
    SoakFailedError,
    describe,
    failure_record,
    replay,
    shrink,
    soak,
    steps_from_json,
)
from tests.soak.environment import SoakEnvironment
from tests.soak.profiles import PROFILES
from tests.soak.stats import SoakStats
from tests.support.control_plane import ControlPlane


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--ops", type=int, default=10_000, help="steps in all (default 10000)")
    parser.add_argument("--seed", type=int, default=31, help="seed of the run (default 31)")
    parser.add_argument(
        "--steps-per-node", type=int, default=500, help="steps on one node before a fresh one"
    )
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated, taken in turn")
    parser.add_argument(
        "--fault-every",
        type=int,
        default=0,
        help="arm the fault schedule's next point every N steps (0: only when drawn)",
    )
    parser.add_argument("--shrink-seconds", type=float, default=900, help="time for shrinking (0: none)")
    parser.add_argument("--report", type=Path, help="also write the figures (JSON) to this file")
    parser.add_argument("--replay", type=Path, metavar="REPORT.json", help="run the failure it records again")
    parser.add_argument("--all-steps", action="store_true", help="with --replay: every recorded step")
    parser.add_argument(
        "--inject-bug",
        choices=sorted(KNOWN_BUGS),
        help="test only: put a fixed bug back into the plugin (dra_gpu/sharing/injected_bugs.py)",
    )
    args = parser.parse_args(argv)
    if args.ops <= 0 or args.steps_per_node <= 0 or args.fault_every < 0:
        parser.error("--ops and --steps-per-node must be positive, --fault-every at least 0")
    names = [p for p in args.profiles.split(",") if p]
    unknown = [p for p in names if p not in PROFILES]
    if unknown or not names:
        parser.error(f"--profiles: unknown {unknown}; known: {', '.join(PROFILES)}")
    recorded = None
    if args.replay is not None:
        try:
            recorded = json.loads(args.replay.read_text())["failure"]
            if recorded is None or recorded["profile"] not in PROFILES:
                raise KeyError("failure")
        except (OSError, ValueError, KeyError, TypeError) as err:
            parser.error(f"--replay {args.replay}: no recorded failure to replay ({err!r})")
    plugin_env = {INJECT_ENV: args.inject_bug} if args.inject_bug else {}

    plane = ControlPlane()
    plane.start()
    try:
        env = SoakEnvironment.of(plane)
        if recorded is not None:
            return _replay(env, recorded, args.all_steps)
        return _soak(env, args, names, plugin_env)
    finally:
        plane.stop()


def _replay(env: SoakEnvironment, recorded: dict[str, object], all_steps: bool) -> int:
    steps = steps_from_json(
        recorded["steps"] if all_steps or not recorded.get("shortest") else recorded["shortest"]  # type: ignore[arg-type]
    )
    failure = SoakFailedError(str(recorded["rule"]), "recorded", [])
    failure.profile = PROFILES[str(recorded["profile"])]
    failure.node_seed = int(recorded["node_seed"])  # type: ignore[call-overload]
    failure.plugin_env = dict(recorded.get("plugin_env") or {})  # type: ignore[call-overload]
    _say(f"replaying {len(steps)} steps on node seed {failure.node_seed} ({failure.profile.name}):")
    _say(describe(steps))
    again = replay(env, failure, steps, SoakStats())
    if again is None:
        _say(f"REPLAY PASSED: [{recorded['rule']}] does not break any more")
        return 0
    same = " (the recorded rule)" if again.rule == recorded["rule"] else " (another rule)"
    _say(f"REPLAY FAILED [{again.rule}]{same}: {again}")
    return 1


def _soak(
    env: SoakEnvironment, args: argparse.Namespace, names: list[str], plugin_env: dict[str, str]
) -> int:
    stats = SoakStats(seed=args.seed)
    record = None
    try:
        soak(
            [PROFILES[n] for n in names],
            env,
            args.ops,
            args.seed,
            args.steps_per_node,
            stats,
            _say,
            plugin_env=plugin_env,
            fault_every=args.fault_every,
        )
    except SoakFailedError as failure:
        _say(f"\nSOAK FAILED [{failure.rule}]: {failure}\n")
        _say(f"the run's last steps on that node:\n{describe(failure.steps[-30:])}")
        shortest = None
        if args.shrink_seconds > 0:
            shortest = shrink(env, failure, args.shrink_seconds, _say)
            _say(
                f"\nSHORTEST SEQUENCE breaking [{failure.rule}] (SOAK_SEED={args.seed}, "
                f"{len(shortest)} steps):\n{describe(shortest)}"
            )
        record = failure_record(failure, shortest)
    finally:
        print(stats.report(), flush=True)
        if args.report:
            summary = {**stats.summary(), "failure": record}
            args.report.write_text(json.dumps(summary, indent=2) + "\n")
            if record is not None:
                _say(f"replay it: python -m tests.soak --replay {args.report}")
    return 1 if record is not None else 0


if __name__ == "__main__":
    sys.exit(main())
