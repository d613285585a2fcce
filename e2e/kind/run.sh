#!/usr/bin/env bash
# `make e2e-kind`: the same end-to-end suite on a kind cluster, the driver deployed by its Helm chart.
#
#   e2e/kind/run.sh [--real] [--keep] [pytest args...]
#
#   (default)  simulated DGX H100 (chart value hardware=dgx-h100) on the GPU-labelled worker;
#   --real     real GPUs through nvkind (the host's NVIDIA driver and container toolkit); values-real.yaml;
#   --keep     leave the cluster running afterwards.
#
# Steps: create the cluster from e2e/kind/cluster.yaml (or nvkind), build the image (manifests/image/build.sh)
# and `kind load` it, `helm install` the chart with e2e/kind/values*.yaml, then run pytest on e2e/ with
# DRA_GPU_E2E_MODE=in-cluster: every test talks to the chart's pods instead of host processes.
# Needs docker, kind, helm and kubectl on PATH (not available on the team's build machine).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
cd "$REPO"
# shellcheck source=../cluster/versions.env
source "$REPO/e2e/cluster/versions.env"
ARTIFACTS="$REPO/e2e/_artifacts/kind"
CLUSTER="${KIND_CLUSTER_NAME:-dra-gpu}"
NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:$KUBERNETES_VERSION}"
IMAGE="dra-gpu:kind"
NAMESPACE="dra-gpu"
SIM_ROOT_HOST="/tmp/dra-gpu-kind/driver-root"
PY="$REPO/.venv/bin/python"

real=0 keep=0
args=()
for a in "$@"; do
    case "$a" in
        --real) real=1 ;;
        --keep) keep=1 ;;
        *) args+=("$a") ;;
    esac
done

log() { echo "[kind] $*" >&2; }
need() { command -v "$1" >/dev/null || { log "ERROR: $1 is not installed ($2)"; exit 2; }; }
need docker "kind nodes are containers"
need kind "https://kind.sigs.k8s.io"
need helm "the chart is installed with helm"
need kubectl "the suite and the chart install use it"
docker info >/dev/null 2>&1 || { log "ERROR: the docker daemon is not reachable (docker info fails)"; exit 2; }
((real)) && need nvkind "--real uses nvkind for GPU nodes (github.com/NVIDIA/nvkind)"

mkdir -p "$ARTIFACTS"
KUBECONFIG_FILE="$ARTIFACTS/kubeconfig"
created=0
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    kubectl --kubeconfig "$KUBECONFIG_FILE" -n "$NAMESPACE" logs -l app.kubernetes.io/component=kubelet-plugin \
        --tail=-1 >"$ARTIFACTS/plugin.log" 2>&1 || true
    kind export logs "$ARTIFACTS/cluster-logs" --name "$CLUSTER" >/dev/null 2>&1 || true
    if ((created)) && ! ((keep)); then
        log "deleting cluster $CLUSTER"
        kind delete cluster --name "$CLUSTER" || true
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- cluster ----------------------------------------------------------------------------------------
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "using the existing kind cluster $CLUSTER"
else
    created=1
    if ((real)); then
        log "creating a GPU cluster with nvkind (node image $NODE_IMAGE)"
        nvkind cluster create --name "$CLUSTER" --image "$NODE_IMAGE" \
            --config-template "$HERE/nvkind-template.yaml" --config-values "$HERE/nvkind-values.yaml"
    else
        mkdir -p "$SIM_ROOT_HOST"
        log "creating kind cluster $CLUSTER (node image $NODE_IMAGE)"
        kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --config "$HERE/cluster.yaml" --wait 5m
    fi
fi
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_FILE"
export KUBECONFIG="$KUBECONFIG_FILE"

# --- image ------------------------------------------------------------------------------------------
log "building $IMAGE"
"$REPO/manifests/image/build.sh" "$IMAGE"
# The examples' containers run the suite's busybox image (examples/README.md, container contract).
docker pull -q busybox:1 >/dev/null
docker tag busybox:1 registry.local/busybox:1
kind load docker-image --name "$CLUSTER" "$IMAGE" registry.local/busybox:1

# --- chart ------------------------------------------------------------------------------------------
values="$HERE/values.yaml"
((real)) && values="$HERE/values-real.yaml"
log "helm install (values $(basename "$values"))"
helm upgrade --install dra-gpu "$REPO/manifests/helm/dra-gpu" --namespace "$NAMESPACE" --create-namespace \
    -f "$values" --wait --timeout 5m

# --- suite ------------------------------------------------------------------------------------------
export DRA_GPU_E2E_MODE=in-cluster
export DRA_GPU_E2E_KUBECONFIG="$KUBECONFIG_FILE"
export DRA_GPU_E2E_CHART_NAMESPACE="$NAMESPACE"
export DRA_GPU_E2E_PLUGIN_PORT=8080
export DRA_GPU_E2E_ARTIFACTS="$ARTIFACTS"
export DRA_GPU_E2E_REQUIRE=1
if ((real)); then
    export DRA_GPU_E2E_HARDWARE=real
else
    export DRA_GPU_E2E_HARDWARE=dgx-h100 DRA_GPU_E2E_DRIVER_ROOT=/opt/dra-gpu/driver-root
fi
rc=0
"$PY" -m pytest -p no:cacheprovider -o testpaths=e2e --junitxml="$ARTIFACTS/e2e-junit.xml" -v -rA \
    --timeout=900 e2e "${args[@]}" || rc=$?
"$PY" -m e2e.lib.report --report "$ARTIFACTS/e2e-report.json" --junit "$ARTIFACTS/e2e-junit.xml" \
    --build-times "$ARTIFACTS/none.json" | tee "$ARTIFACTS/e2e-summary.txt"
exit "$rc"
