#!/usr/bin/env bash
# End-to-end suite on a local single-node cluster built from real Kubernetes binaries (`make e2e`).
#
#   e2e/run-e2e.sh [pytest args...]
#
# 1. brings the cluster up if none runs (e2e/cluster/up.sh), timing it;
# 2. installs the driver as host processes (kubelet plugin + webhook, same flags as the chart's DaemonSet),
#    DeviceClasses from the chart and the webhook configuration;
# 3. runs pytest on e2e/ (every example, resilience, timing), then the scheduler differential tests of
#    tests/allocator (marker `scheduler`) if there are any;
# 4. prints a summary (examples table, tests, timings) and tears down whatever it started, even on failure
#    or Ctrl-C. Logs stay in e2e/_artifacts/.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
cd "$REPO"
ARTIFACTS="$REPO/e2e/_artifacts"
PY="$REPO/.venv/bin/python"
REPORT="$ARTIFACTS/e2e-report.json"
JUNIT="$ARTIFACTS/e2e-junit.xml"
export DRA_GPU_E2E_KUBECONFIG="${DRA_GPU_E2E_KUBECONFIG:-$ARTIFACTS/kubeconfig}"
export KUBECONFIG="$DRA_GPU_E2E_KUBECONFIG"

log() { echo "[e2e] $*" >&2; }
[[ -x "$PY" ]] || { log "no virtual environment: run 'make venv' first"; exit 2; }
# The Kubernetes release under test: $KUBERNETES_VERSION (v1.34.12, or a minor such as 1.34), else the default
# of versions.env. `make e2e` calls this script once per entry of KUBERNETES_VERSIONS.
# shellcheck source=cluster/versions.env
REQUESTED_VERSION="${KUBERNETES_VERSION:-}"
source "$REPO/e2e/cluster/versions.env"
# shellcheck source=cluster/k8s-version.sh
source "$REPO/e2e/cluster/k8s-version.sh"
select_kubernetes_version "$REQUESTED_VERSION" || exit 2
log "Kubernetes $KUBERNETES_VERSION"
mkdir -p "$ARTIFACTS"
rm -f "$REPORT" "$JUNIT" "$ARTIFACTS/scheduler-junit.xml" "$ARTIFACTS/chart-junit.xml"

started_cluster=0
started_driver=0
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if ((started_driver)); then
        log "stopping the driver"
        "$PY" -m e2e.lib.install down || log "driver stop failed (see $ARTIFACTS/plugin.log)"
    fi
    if ((started_cluster)) && [[ "${DRA_GPU_E2E_KEEP_CLUSTER:-0}" != 1 ]]; then
        log "stopping the cluster"
        cluster_cmd down || log "cluster stop failed"
    fi
    log "logs in $ARTIFACTS"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cluster_cmd() {
    if [[ -x "$REPO/e2e/cluster/$1.sh" ]]; then
        "$REPO/e2e/cluster/$1.sh"
    else
        "$PY" "$REPO/e2e/cluster/cluster.py" "$1"
    fi
}

record_since() { # name start ($EPOCHREALTIME): records now - start in the run report
    "$PY" - "$REPORT" "$1" "$2" "$EPOCHREALTIME" <<'PY'
import sys
from pathlib import Path
from e2e.lib.summary import record_timing
record_timing(Path(sys.argv[1]), sys.argv[2], float(sys.argv[4]) - float(sys.argv[3]))
PY
}

# --- 1. cluster ------------------------------------------------------------------------------------
t0=$EPOCHREALTIME
build_started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
"$REPO/e2e/cluster/build.sh" all
"$REPO/e2e/cluster/build.sh" helm || log "no helm: DeviceClasses come from manifests/rendered/"
# Warm only if build.sh rebuilt nothing (it stamps each component it builds in build-times.json).
if "$PY" - "$ARTIFACTS/build-times.json" "$build_started" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(1)
sys.exit(0 if any(c.get("build_s_at", "") >= sys.argv[2] for c in data.get("components", {}).values()) else 1)
PY
then
    log "build.sh rebuilt components; the warm build time will come from the next run"
else
    record_since cluster_build_warm_s "$t0"
fi
if "$PY" "$REPO/e2e/cluster/cluster.py" status >/dev/null 2>&1; then
    log "using the running cluster ($KUBECONFIG)"
    running="$("$PY" -c 'from kubernetes import client, config; config.load_kube_config(); print(client.VersionApi().get_code().git_version)' 2>/dev/null || true)"
    if [[ -n "$running" && "$running" != "$KUBERNETES_VERSION" ]]; then
        log "the running cluster is Kubernetes $running, not $KUBERNETES_VERSION: stop it (e2e/cluster/down.sh) first"
        exit 2
    fi
else
    log "starting the cluster"
    t0=$EPOCHREALTIME
    started_cluster=1
    cluster_cmd up
    record_since cluster_start_s "$t0"
fi

# --- 2. driver --------------------------------------------------------------------------------------
if ! "$PY" -m e2e.lib.install status >/dev/null 2>&1; then
    started_driver=1
fi
"$PY" -m e2e.lib.install up --report "$REPORT"

# --- 3. tests ---------------------------------------------------------------------------------------
rc=0
# The chart's tests (3b) install the driver themselves: never next to the host-process driver.
CHART_TESTS=(e2e/test_chart_*.py e2e/test_webhook_rotation.py)
DRA_GPU_E2E_REQUIRE=1 DRA_GPU_E2E_KEEP_DRIVER=1 "$PY" -m pytest -p no:cacheprovider -o testpaths=e2e \
    --junitxml="$JUNIT" -v -rA --timeout=900 "${CHART_TESTS[@]/#/--ignore=}" e2e "$@" || rc=$?

if compgen -G "tests/allocator/test_*.py" >/dev/null; then
    log "scheduler differential tests (tests/allocator, marker 'scheduler') against the cluster"
    DRA_GPU_E2E_REQUIRE=1 "$PY" -m pytest -p no:cacheprovider -q -m scheduler tests/allocator \
        --junitxml="$ARTIFACTS/scheduler-junit.xml" || { r=$?; ((r == 5)) || rc=$r; }  # 5: none collected
fi

# --- 3b. the chart, opt-in (DRA_GPU_E2E_CHART=1) ---------------------------------------------------------
# The node serves one gpu.nvidia.com plugin: the host-process driver stops first, then the chart's DaemonSet
# (image built from this machine by e2e/image/build.sh) is installed, checked and uninstalled.
if [[ "${DRA_GPU_E2E_CHART:-0}" == 1 ]]; then
    log "chart install test: stopping the host-process driver first"
    "$PY" -m e2e.lib.install down || log "driver stop failed (see $ARTIFACTS/plugin.log)"
    started_driver=0
    DRA_GPU_E2E_REQUIRE=1 "$PY" -m pytest -p no:cacheprovider -v -rA --timeout=900 \
        --junitxml="$ARTIFACTS/chart-junit.xml" "${CHART_TESTS[@]}" || rc=$?
fi

# --- 4. summary -------------------------------------------------------------------------------------
"$PY" -m e2e.lib.report --report "$REPORT" --junit "$JUNIT" --junit "$ARTIFACTS/scheduler-junit.xml" \
    --junit "$ARTIFACTS/chart-junit.xml" \
    | tee "$ARTIFACTS/e2e-summary.txt"
# One copy per version, so that the runs of `make e2e` on several releases keep their own results.
for f in e2e-summary.txt e2e-report.json e2e-junit.xml; do
    [[ -f "$ARTIFACTS/$f" ]] && cp "$ARTIFACTS/$f" "$ARTIFACTS/${f%%.*}-$KUBERNETES_VERSION.${f#*.}"
done
exit "$rc"
