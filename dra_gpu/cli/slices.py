"""`dra-gpu slices`: print the ResourceSlices the kubelet plugin would publish for a node (checked
client-side)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

import yaml

from dra_gpu.cli.feature_gates import parse_feature_gates
from dra_gpu.cli.hardware import add_hardware_args, hardware_from_args
from dra_gpu.hardware.interface import HardwareError
from dra_gpu.inventory.consumable_shares import parse_consumable_shares
from dra_gpu.inventory.device_model import ModelOptions, build_device_model
from dra_gpu.slices.slice_builder import build_slices
from dra_gpu.slices.slice_validation import validate_slices


def kubernetes_version(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Kubernetes version such as 1.36")
    return int(match[1]), int(match[2])


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "slices",
        help="print the ResourceSlices published for a node",
        description="Discover GPUs (real NVML or a simulated node), build the node's ResourceSlices "
        "and print them.",
    )
    add_hardware_args(parser, seed_help="simulator seed for GPU UUIDs (default: the node name)")
    parser.add_argument("--node", required=True, help="node name (pool name, spec.nodeName, slice names)")
    parser.add_argument(
        "--node-uid", default=None, help="Node UID for ownerReferences (omitted when not given)"
    )
    parser.add_argument(
        "--kubernetes-version",
        type=kubernetes_version,
        default=(1, 37),
        help="target Kubernetes minor: 1.34 or 1.35+ layout, list attributes from 1.36 (default 1.37)",
    )
    parser.add_argument(
        "--feature-gates",
        default="",
        help="driver feature gates as for kubelet-plugin, e.g. DRAListTypeAttributes=true",
    )
    parser.add_argument("--generation", type=int, default=1, help="pool generation (default 1)")
    parser.add_argument("--no-dynamic-mig", dest="dynamic_mig", action="store_false")
    parser.add_argument("--no-fractional", dest="fractional", action="store_false")
    parser.add_argument(
        "--consumable-shares",
        default="disabled",
        help="as for kubelet-plugin: disabled, memory, unlimited or N (whole GPUs shared among claims)",
    )
    parser.add_argument("-o", "--output", choices=("json", "yaml"), default="yaml")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        lists = parse_feature_gates(args.feature_gates)["DRAListTypeAttributes"]
        shares = parse_consumable_shares(args.consumable_shares)
    except ValueError as bad_gate:
        print(f"dra-gpu slices: {bad_gate}", file=sys.stderr)
        return 2
    try:
        with hardware_from_args(args, default_seed=args.node) as hardware:
            discovery = hardware.discover()
    except HardwareError as err:
        print(f"dra-gpu slices: {err}", file=sys.stderr)
        return 1
    for error in discovery.errors:  # a broken GPU is reported, the others are still published
        where = f"GPU index {error.gpu_index}" if error.gpu_index is not None else "driver"
        print(f"dra-gpu slices: warning: {where} not published: {error.message}", file=sys.stderr)
    model = build_device_model(
        discovery,
        ModelOptions(dynamic_mig=args.dynamic_mig, fractional=args.fractional, consumable_shares=shares),
    )
    try:
        slices = build_slices(
            model,
            args.node,
            args.kubernetes_version,
            args.generation,
            args.node_uid,
            list_type_attributes=lists,
        )
    except ValueError as err:
        print(f"dra-gpu slices: {err}", file=sys.stderr)
        return 1
    problems = validate_slices(slices, args.kubernetes_version)
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": slices}, indent=2))
    else:
        print(yaml.safe_dump_all(slices, sort_keys=False), end="")
    for problem in problems:
        print(f"dra-gpu slices: invalid: {problem}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    """Run this sub-command alone (`python -m dra_gpu.cli.slices ...`), without the other sub-commands."""
    parser = argparse.ArgumentParser(prog="dra-gpu")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["slices", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
