"""`make bench`: run every `bench/bench_*.py` module's `run() -> dict` and print/save the figures.

Benchmarks measure speed and memory; unit tests never do. Results land in `bench/_results/<name>.json`.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path

import bench

RESULTS = Path(__file__).parent / "_results"


def main(argv: list[str]) -> int:
    wanted = set(argv)
    RESULTS.mkdir(exist_ok=True)
    failures = 0
    for info in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name):
        if not info.name.startswith("bench_") or (wanted and info.name not in wanted):
            continue
        print(f"== {info.name}", flush=True)
        started = time.perf_counter()
        try:
            module = importlib.import_module(f"bench.{info.name}")
            figures = module.run()
        except Exception as exc:  # a broken benchmark must not hide the others' figures
            failures += 1
            print(f"   FAILED: {type(exc).__name__}: {exc}", flush=True)
            continue
        figures["_wall_s"] = round(time.perf_counter() - started, 2)
        (RESULTS / f"{info.name}.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
        for key, value in figures.items():
            print(f"   {key:50s} {value}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
