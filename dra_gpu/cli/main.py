"""`dra-gpu`: one command, one sub-command per job; each sub-command module has `register()`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# module name in dra_gpu.cli -> it defines register(subparsers) that adds its parser and sets `func`.
SUBCOMMAND_MODULES = (
    "hardware",
    "inventory",
    "slices",
    "kubelet_plugin",
    "webhook",
    "explain",
    "lint",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dra-gpu", description="Kubernetes DRA driver for NVIDIA GPUs")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(f"dra_gpu.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
