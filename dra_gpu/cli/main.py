"""`dra-gpu`: one command, one sub-command per job; each sub-command module has `register()`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

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

# Top-level packages of the optional `dra-gpu[tools]` extra (pyproject.toml): explain and lint need them.
TOOLS_EXTRA_MODULES = frozenset({"celpy", "lark", "re2"})


def version() -> str:
    """The installed distribution's version (pyproject.toml's); 'unknown' from an uninstalled tree."""
    try:
        return metadata.version("dra-gpu")
    except metadata.PackageNotFoundError:
        return "unknown"


class _VersionAction(argparse.Action):
    """`--version`, reading the installed metadata only when asked (it costs a scan of site-packages)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"dra-gpu {version()}")  # stdout, as argparse's own version action
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `command` (the first argument) only that sub-command's module is imported, so the
    kubelet plugin's process never loads the CEL/explain/lint stack (cel-python, lark, re2: memory and
    start-up time it does not need)."""
    parser = argparse.ArgumentParser(prog="dra-gpu", description="Kubernetes DRA driver for NVIDIA GPUs")
    parser.add_argument("--version", action=_VersionAction)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = (command or "").replace("-", "_")
    for name in (chosen,) if chosen in SUBCOMMAND_MODULES else SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"dra_gpu.cli.{name}")
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in TOOLS_EXTRA_MODULES:
                raise
            _register_missing_tools(subparsers, name.replace("_", "-"), exc.name or "")
            continue
        module.register(subparsers)
    return parser


def _register_missing_tools(subparsers: Any, command: str, missing: str) -> None:
    """A sub-command whose dependencies (the `tools` extra) are not installed, as in the node image: it is
    listed, and running it says what to install instead of failing with a traceback."""
    message = (
        f"dra-gpu {command}: needs the optional CEL tools ({missing} is not installed); "
        "install them with: pip install 'dra-gpu[tools]'"
    )
    # No option prefix: every argument ("-f claim.yaml", "--help") is taken as ignored text, so whatever the
    # user typed ends in the message below, not in argparse's "unrecognized arguments: -f".
    parser = subparsers.add_parser(
        command, help="(not installed: pip install 'dra-gpu[tools]')", prefix_chars="\0", add_help=False
    )
    parser.add_argument("ignored", nargs="*", help=argparse.SUPPRESS)
    parser.set_defaults(func=lambda _args: sys.exit(message))


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(arguments[0] if arguments and not arguments[0].startswith("-") else None)
    args = parser.parse_args(arguments)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
