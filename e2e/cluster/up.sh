#!/usr/bin/env bash
# Starts the local single-node cluster (see cluster.py); idempotent. Needs root and `e2e/cluster/build.sh all`.
# Prints `export KUBECONFIG=...` (the kubeconfig is e2e/_artifacts/kubeconfig).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="$REPO/.venv/bin/python"
[[ -x "$PY" ]] || PY=python3
"$HERE/install-host-deps.sh" >&2
"$HERE/build.sh" all >&2
exec "$PY" "$HERE/cluster.py" up "$@"
