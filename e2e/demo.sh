#!/usr/bin/env bash
# `make demo` / `make demo-down`: a local cluster with a simulated DGX H100 node, the dra-gpu driver, and a
# sharing showcase (whole GPU, time-slicing, MPS with limits, on-demand MIG with mixed profiles, fractional
# shares) printed as a table of pods, devices and how they are shared.
#
#   e2e/demo.sh up     build what is missing, start the cluster and the driver, apply the showcase, print the table
#   e2e/demo.sh show   print the table again
#   e2e/demo.sh down   delete the showcase, stop the driver and the cluster
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
cd "$REPO"
PY="$REPO/.venv/bin/python"
ARTIFACTS="$REPO/e2e/_artifacts"
export DRA_GPU_E2E_KUBECONFIG="${DRA_GPU_E2E_KUBECONFIG:-$ARTIFACTS/kubeconfig}"

log() { echo "[demo] $*" >&2; }
[[ -x "$PY" ]] || { log "no virtual environment: run 'make venv' first"; exit 2; }

cluster_cmd() {
    if [[ -x "$REPO/e2e/cluster/$1.sh" ]]; then "$REPO/e2e/cluster/$1.sh"; else "$PY" "$REPO/e2e/cluster/cluster.py" "$1"; fi
}

case "${1:-up}" in
up)
    log "step 1/4: Kubernetes binaries (first time: builds from the Go module proxy, progress below)"
    "$REPO/e2e/cluster/build.sh" all
    "$REPO/e2e/cluster/build.sh" helm || log "no helm: DeviceClasses come from manifests/rendered/"
    log "step 2/4: local cluster"
    if "$PY" "$REPO/e2e/cluster/cluster.py" status >/dev/null 2>&1; then
        log "cluster already running"
    else
        cluster_cmd up
    fi
    log "step 3/4: driver on the simulated dgx-h100 node (kubelet plugin + webhook, logs in $ARTIFACTS)"
    "$PY" -m e2e.lib.install up
    log "step 4/4: showcase"
    "$PY" -m e2e.lib.demo up
    ;;
show)
    "$PY" -m e2e.lib.demo show
    ;;
down)
    if "$PY" "$REPO/e2e/cluster/cluster.py" status >/dev/null 2>&1; then
        "$PY" -m e2e.lib.demo down || log "could not delete the showcase namespaces"
        "$PY" -m e2e.lib.install down || log "could not stop the driver cleanly"
        cluster_cmd down
    else
        # No cluster: only host processes may be left.
        "$PY" - <<'PY'
from e2e.lib.processes import ProcessTable
from e2e.lib.settings import load_settings
table = ProcessTable(load_settings().artifacts / "driver" / "processes.json")
for name in table.names():
    if table.stop(name):
        print(f"[demo] stopped {name}")
PY
    fi
    log "demo stopped"
    ;;
*)
    echo "usage: e2e/demo.sh up|show|down" >&2; exit 2 ;;
esac
