"""`python -m tests.soak --ops N --seed S` (`make soak SOAK_OPS=N SOAK_SEED=S`): the randomized fault soak on
both profiles (simulated DGX H100; DGX A100 with MIG and NVIDIA's consumable shares) against a real
kube-apiserver started for it. Prints the figures as JSON; when an invariant breaks, prints the seed and the
shrunk sequence of steps that breaks it, and exits 1."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.soak.driver import SoakFailedError, describe, shrink, soak
from tests.soak.environment import SoakEnvironment
from tests.soak.profiles import PROFILES
from tests.soak.stats import SoakStats
from tests.support.control_plane import ControlPlane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--ops", type=int, default=10_000, help="steps in all (default 10000)")
    parser.add_argument("--seed", type=int, default=31, help="seed of the run (default 31)")
    parser.add_argument(
        "--steps-per-node", type=int, default=500, help="steps on one node before a fresh one"
    )
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated, taken in turn")
    parser.add_argument("--shrink-seconds", type=float, default=900, help="time for shrinking (0: none)")
    parser.add_argument("--report", type=Path, help="also write the figures (JSON) to this file")
    args = parser.parse_args(argv)
    if args.ops <= 0 or args.steps_per_node <= 0:
        parser.error("--ops and --steps-per-node must be positive")
    names = [p for p in args.profiles.split(",") if p]
    unknown = [p for p in names if p not in PROFILES]
    if unknown or not names:
        parser.error(f"--profiles: unknown {unknown}; known: {', '.join(PROFILES)}")

    stats = SoakStats(seed=args.seed)
    plane = ControlPlane()
    plane.start()
    failed = False
    try:
        env = SoakEnvironment.of(plane)
        try:
            soak(
                [PROFILES[n] for n in names],
                env,
                args.ops,
                args.seed,
                args.steps_per_node,
                stats,
                lambda line: print(line, file=sys.stderr, flush=True),
            )
        except SoakFailedError as failure:
            failed = True
            print(f"\nSOAK FAILED [{failure.rule}]: {failure}\n", file=sys.stderr, flush=True)
            print(f"the run's last steps on that node:\n{describe(failure.steps[-30:])}", file=sys.stderr)
            if args.shrink_seconds > 0:
                shortest = shrink(
                    env, failure, args.shrink_seconds, lambda line: print(line, file=sys.stderr, flush=True)
                )
                print(
                    f"\nSHORTEST SEQUENCE breaking [{failure.rule}] (SOAK_SEED={args.seed}, "
                    f"{len(shortest)} steps):\n{describe(shortest)}",
                    file=sys.stderr,
                )
    finally:
        plane.stop()
        print(stats.report(), flush=True)
        if args.report:
            args.report.write_text(json.dumps(stats.summary(), indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
