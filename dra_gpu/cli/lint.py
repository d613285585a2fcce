"""`dra-gpu lint`: check DRA manifests before `kubectl apply`.

Checks DeviceClasses, ResourceClaims, ResourceClaimTemplates and Pods (and workloads with a pod template) in
multi-document YAML files or directories: CEL selectors compile in the Kubernetes environment, names and
references resolve, opaque configs for gpu.nvidia.com validate, API versions and kinds are known, and common
mistakes get a fix hint. Output: `file:line kind/name: message (hint: ...)`. Exit code 0 clean, 1 findings, 2
unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dra_gpu.lint.checks import Linter
from dra_gpu.lint.manifests import ManifestError, load_documents


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "lint",
        help="check DRA manifests (CEL, references, opaque config)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or directories")
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        default=[],
        metavar="PATH",
        help="file or directory (repeatable; same as a positional PATH)",
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.set_defaults(func=run)


def _decoder() -> Any:
    try:
        from dra_gpu.config.api import decode_opaque_config
    except ImportError:  # the config package is optional for linting
        return None
    return decode_opaque_config


def run(args: argparse.Namespace) -> int:
    paths = list(args.paths) + list(args.filename)
    if not paths:
        print("error: give files or directories to lint", file=sys.stderr)
        return 2
    try:
        documents = load_documents(paths)
        findings = Linter(documents, _decoder()).run()
    except ManifestError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # never a stack trace for the user
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(
            json.dumps(
                {
                    "findings": [
                        {
                            "file": f.path,
                            "line": f.line,
                            "object": f.obj,
                            "message": f.message,
                            "hint": f.hint,
                        }
                        for f in findings
                    ]
                },
                indent=2,
            )
        )
    else:
        for finding in findings:
            print(finding.render())
        if not findings:
            print(f"{len(documents)} object(s) checked, no findings")
    return 1 if findings else 0
