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

from dra_gpu.cel.release import MODELED_RELEASE, OLDEST_SUPPORTED, CelRelease, ReleaseError, parse_minor
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
    parser.add_argument(
        "--kubernetes-version",
        default=_show(MODELED_RELEASE),
        metavar="MAJOR.MINOR",
        help=f"check CEL against this release, {_show(OLDEST_SUPPORTED)} to {_show(MODELED_RELEASE)} "
        f"(default {_show(MODELED_RELEASE)})",
    )
    parser.add_argument(
        "--feature-gates",
        default="",
        metavar="NAME=BOOL,...",
        help="gates of the target cluster that change CEL; known: DRAListTypeAttributes (alpha, default "
        "false; on 1.36 it adds includes(), on 1.37 includes() is there anyway)",
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.set_defaults(func=run)


def _show(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def _release(version: str, gates: str) -> CelRelease:
    """--kubernetes-version and --feature-gates as a CelRelease; ReleaseError names the bad part."""
    list_attributes = False
    for item in filter(None, (g.strip() for g in gates.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise ReleaseError(f"--feature-gates {item!r}: expected NAME=true or NAME=false")
        if name != "DRAListTypeAttributes":
            raise ReleaseError(
                f"--feature-gates {name!r}: unknown; the gate lint models is DRAListTypeAttributes"
            )
        list_attributes = value.lower() == "true"
    return CelRelease(parse_minor(version), list_attributes)


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
        release = _release(args.kubernetes_version, args.feature_gates)
        documents = load_documents(paths)
        findings = Linter(documents, _decoder(), release).run()
    except (ManifestError, ReleaseError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # never a stack trace for the user
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(
            json.dumps(
                {
                    "kubernetesVersion": _show(release.version),
                    "findings": [
                        {
                            "file": f.path,
                            "line": f.line,
                            "object": f.obj,
                            "message": f.message,
                            "hint": f.hint,
                        }
                        for f in findings
                    ],
                },
                indent=2,
            )
        )
    else:
        for finding in findings:
            print(finding.render())
        if not findings:
            print(f"{len(documents)} object(s) checked against {release.label}, no findings")
    return 1 if findings else 0
