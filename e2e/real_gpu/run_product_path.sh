#!/usr/bin/env bash
# The product-path check on a machine with a real GPU (see README.md, "The product path"): as root, with the
# machine's Python 3 and the wheels brought in the working tree, as run_checks.sh runs.
#
#   e2e/real_gpu/run_product_path.sh OUT_DIR [product_path.py options]
#
# OUT_DIR receives product-path.json (checks, figures, the clients' answers, the plugin's log tails) and
# product-path.txt (what was printed). Leaves no GPU setting changed and nothing running.
set -uo pipefail
out="$(realpath -m "$1")"; shift
cd "$(dirname "$0")/../.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
mkdir -p "$out"
OUT="$out" "${PYTHON:-python3}" e2e/real_gpu/product_path.py "$@" 2>&1 | tee "$out/product-path.txt"
exit "${PIPESTATUS[0]}"
