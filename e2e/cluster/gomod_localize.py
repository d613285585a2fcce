"""Turn a Go module that only builds inside its monorepo into one that builds from the module proxy alone.

Module zips leave out nested modules, so `replace X => ./staging/...` (Kubernetes) or `replace X => ../api`
(etcd) point at directories that do not exist in the downloaded copy. We drop every replace whose target is a
local path and, where the main module requires that module at the placeholder `v0.0.0`, require the published
version instead. Prints the `go mod edit` flags, one per line, for build.sh to apply.

Usage: go mod edit -json | python3 gomod_localize.py STAGING_VERSION
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

PLACEHOLDER_VERSION = "v0.0.0"


def _is_local_path(target: str) -> bool:
    return target.startswith(("./", "../", "/"))


def localize_edits(gomod: Mapping[str, Any], staging_version: str) -> list[str]:
    """Return `go mod edit` flags that remove local replaces and pin placeholder requirements."""
    if not staging_version.startswith("v"):
        raise ValueError(f"staging version {staging_version!r} must look like v0.36.3")
    requires: dict[str, str] = {r["Path"]: r["Version"] for r in gomod.get("Require") or []}
    replaces: Sequence[Mapping[str, Any]] = gomod.get("Replace") or []
    edits: list[str] = []
    for replace in replaces:
        old = replace["Old"]
        if not _is_local_path(replace["New"]["Path"]):
            continue
        old_path = old["Path"]
        edits.append(f"-dropreplace={old_path}" + (f"@{old['Version']}" if old.get("Version") else ""))
        if requires.get(old_path) == PLACEHOLDER_VERSION:
            edits.append(f"-require={old_path}@{staging_version}")
    return edits


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: go mod edit -json | gomod_localize.py STAGING_VERSION", file=sys.stderr)
        return 2
    for edit in localize_edits(json.load(sys.stdin), argv[1]):
        print(edit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
