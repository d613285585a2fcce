"""Prints the end-of-run summary: `python -m e2e.lib.report [--junit FILE]`.

Rows come from the run report the tests wrote (`e2e/_artifacts/e2e-report.json`); timings from that report
and from `e2e/_artifacts/build-times.json` (written by `e2e/cluster/build.sh` and `cluster.py up`).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from e2e.lib.settings import ARTIFACTS_DIR
from e2e.lib.summary import examples_table, load_report, render_table, timings_table

TIMING_LABELS = {
    "cluster_build_cold_s": "cluster build, cold (sum of component builds)",
    "cluster_build_warm_s": "cluster build, warm (everything cached)",
    "cluster_start_s": "cluster start (up to node Ready)",
    "driver_deviceclasses_s": "driver install: DeviceClasses applied",
    "driver_webhook_start_s": "driver install: webhook serving + registered",
    "driver_plugin_ready_s": "driver install: plugin ready (/readyz)",
    "driver_slices_published_s": "driver install: node's slices complete",
    "pod_create_to_running_s": "GPU pod create -> Running (median)",
    "node_prepare_s": "GPU pod: time in our NodePrepareResources (median)",
    "node_prepare_share_pct": "GPU pod: NodePrepareResources share of start-up",
}


def build_timings(build_times: Mapping[str, Any]) -> dict[str, float]:
    """Cluster build and start times from build.sh / cluster.py's records.

    Cold: build.sh's `targets.all.cold_s` when it timed a whole cold `all`, else the sum of every component's
    last real compile (`components.*.build_s`, helm excluded: the cluster does not need it). Warm:
    `targets.all.warm_s` (a rerun with every stamp in place).
    """
    out: dict[str, float] = {}
    targets = build_times.get("targets") or {}
    all_target = targets.get("all") or {}
    components = build_times.get("components") or {}
    if "cold_s" in all_target:
        out["cluster_build_cold_s"] = float(all_target["cold_s"])
    else:
        cold = [
            float(c["build_s"])
            for name, c in components.items()
            if isinstance(c, Mapping) and "build_s" in c and name != "helm"
        ]
        if cold:
            out["cluster_build_cold_s"] = sum(cold)
    if "warm_s" in all_target:
        out["cluster_build_warm_s"] = float(all_target["warm_s"])
    start = build_times.get("cluster_start") or {}
    if "node_ready_s" in start:
        out["cluster_start_s"] = float(start["node_ready_s"])
    return out


def junit_outcomes(path: Path) -> list[tuple[str, str, str]]:
    """(test, outcome, first line of the message) from a pytest junit XML file."""
    rows: list[tuple[str, str, str]] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "pass", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "FAIL", "error": "ERROR", "skipped": "skip"}[tag]
                message = (node.get("message") or "").splitlines()[0] if node.get("message") else ""
                break
        rows.append((case.get("name", ""), outcome, message))
    return rows


def outcome_counts(outcomes: Sequence[tuple[str, str, str]]) -> str:
    """`N tests: P passed, S skipped, ...`, then one line per skip reason with its count (what a cluster here
    could not show, and why)."""
    counts = Counter(outcome for _, outcome, _ in outcomes)
    order = ("pass", "FAIL", "ERROR", "skip")
    names = {"pass": "passed", "FAIL": "failed", "ERROR": "errors", "skip": "skipped"}
    parts = [f"{counts[o]} {names[o]}" for o in order if counts[o]]
    lines = [f"{len(outcomes)} tests: {', '.join(parts)}"]
    reasons = Counter(message for _, outcome, message in outcomes if outcome == "skip")
    lines += [f"  skipped x{n}: {reason}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.lib.report")
    parser.add_argument("--report", default=str(ARTIFACTS_DIR / "e2e-report.json"))
    parser.add_argument("--build-times", default=str(ARTIFACTS_DIR / "build-times.json"))
    parser.add_argument("--junit", action="append", default=[], help="pytest junit XML (repeatable)")
    args = parser.parse_args(argv)
    report = load_report(Path(args.report))
    timings = dict(report.timings_s)
    bt_path = Path(args.build_times)
    bt_text = bt_path.read_text() if bt_path.is_file() else ""
    if bt_text.strip():
        for key, value in build_timings(json.loads(bt_text)).items():
            timings.setdefault(key, value)
    print("\n== examples")
    print(examples_table(report.rows) if report.rows else "(no example ran)")
    outcomes = [row for f in args.junit if Path(f).exists() for row in junit_outcomes(Path(f))]
    if outcomes:
        print("\n== tests")
        print(render_table(("test", "result", "message"), outcomes, max_width=90))
        print(outcome_counts(outcomes))
    print("\n== timings")
    print(timings_table(timings, TIMING_LABELS))
    for note in report.notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
