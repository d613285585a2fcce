#!/usr/bin/env bash
# Builds the driver image registry.local/dra-gpu:dev from this machine's interpreter and .venv (no Docker) and
# imports it into the local e2e cluster's containerd. See build_local_image.py; extra args go to it
# (--no-import: only build the archive).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
cd "$REPO"
exec "$REPO/.venv/bin/python" "$HERE/build_local_image.py" "$@"
