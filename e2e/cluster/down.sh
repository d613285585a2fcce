#!/usr/bin/env bash
# Stops the local cluster started by up.sh: every process it started, containers, mounts, cgroups, host rules.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="$REPO/.venv/bin/python"
[[ -x "$PY" ]] || PY=python3
exec "$PY" "$HERE/cluster.py" down "$@"
