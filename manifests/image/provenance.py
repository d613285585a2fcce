"""Writes the build record of a dra-gpu image: an in-toto Statement with a SLSA provenance v1 predicate.

manifests/image/build.sh calls it after a build. The subject is the image ID (the config digest, the same in
docker, podman and buildah, and the one thing two reproducible builds must share); the resolved dependencies
are the base image by digest and the sha256 of every file the build reads beside the source (the locks, the
NVIDIA binaries); the layers' diff IDs go with it, so a rebuild can be compared layer by layer
(manifests/image/verify.sh). Nothing here is signed: it says what was built from what, for a reviewer to
rebuild and compare, not a proof of who built it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
# The project has no published home yet: a URN names the build script and its record format version.
BUILD_TYPE = "urn:dra-gpu:manifests/image/build.sh:v1"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _bare(digest: str) -> str:
    """sha256:abc or abc -> abc (in-toto digest sets name the algorithm in the key)."""
    return digest.removeprefix("sha256:")


def statement(args: argparse.Namespace) -> dict[str, Any]:
    repo = Path(args.repo)
    materials = [
        {"uri": path, "digest": {"sha256": _sha256(repo / path)}} for path in sorted(args.material or [])
    ]
    base = {"uri": args.base, "digest": {"sha256": _bare(args.base_digest)}} if args.base_digest else None
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": args.image, "digest": {"sha256": _bare(args.image_id)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "image": args.image,
                    "dockerfile": "Dockerfile",
                    "revision": args.revision,
                    "treeClean": args.tree_clean == "true",
                    "sourceDateEpoch": int(args.source_date_epoch),
                },
                "resolvedDependencies": ([base] if base else []) + materials,
            },
            "runDetails": {
                "builder": {"id": f"local:{args.tool}", "version": {args.tool: args.tool_version}},
                "metadata": {"startedOn": args.started, "finishedOn": args.finished},
                "byproducts": [
                    {"name": f"layer {index}", "digest": {"sha256": _bare(diff_id)}}
                    for index, diff_id in enumerate(args.diff_id or [])
                ],
            },
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("repo", "image", "image-id", "revision", "tree-clean", "source-date-epoch", "tool", "out"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--tool-version", default="")
    parser.add_argument("--base", required=True)
    parser.add_argument("--base-digest", default="")
    parser.add_argument("--started", default="")
    parser.add_argument("--finished", default="")
    parser.add_argument("--diff-id", action="append", help="a layer's diff ID, bottom first; repeat")
    parser.add_argument("--material", action="append", help="a file (relative to --repo) the build read")
    args = parser.parse_args()
    out = Path(args.out)
    out.write_text(json.dumps(statement(args), indent=2) + "\n")


if __name__ == "__main__":
    main()
