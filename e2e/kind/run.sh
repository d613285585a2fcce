#!/usr/bin/env bash
# `make e2e-kind`: the end-to-end suite on a kind cluster, the driver installed by its Helm chart.
#
#   e2e/kind/run.sh [--real] [--keep] [pytest args...]
#
#   (default)  four simulated GPU nodes: dra-gpu-worker a DGX H100 (the suite's node), dra-gpu-worker2 a PCIe
#              server with 4 L40S, dra-gpu-worker3 a DGX A100 with MIG set up as NVIDIA's gpu-test4 needs,
#              dra-gpu-worker4 two GH200 with 1g.12gb MIG devices (chart value hardware=simulated: each
#              node's driver root is prepared here, per node). KUBERNETES_VERSION picks the release (a minor
#              of KUBERNETES_VERSIONS such as 1.34, or a full version; default that of versions.env);
#   --real     real GPUs through nvkind (the host's NVIDIA driver and container toolkit); values-real.yaml;
#   --keep     leave the cluster (and the private Docker daemon) running afterwards.
#
# Steps (each in e2e/kind/README.md):
#  1. a Docker daemon: the one DOCKER_HOST (or the default socket) reaches, else a private one (dockerd.sh);
#  2. kind and the node image: KIND_NODE_IMAGE if set; else kindest/node:<version> when a registry serves it;
#     else one assembled here from the pinned builds (node_image.py), cached by recipe;
#  3. `kind create cluster` (cluster.yaml rendered for the version by cluster_config.py), pod networking
#     (cni.py), nodes Ready; an existing cluster of that name is reused when it runs the same version;
#  4. the driver image (manifests/image/build.sh) and the test image, loaded into the nodes;
#  5. `helm install` with values.yaml, then pytest on e2e/ with DRA_GPU_E2E_MODE=in-cluster;
#  6. the summary, then the cluster and the private daemon are removed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
cd "$REPO"
# KUBERNETES_VERSION from the caller wins over the default in versions.env (as in build.sh).
REQUESTED_VERSION="${KUBERNETES_VERSION:-}"
# shellcheck source=../cluster/versions.env
source "$REPO/e2e/cluster/versions.env"
# shellcheck source=../cluster/k8s-version.sh
source "$REPO/e2e/cluster/k8s-version.sh"
select_kubernetes_version "$REQUESTED_VERSION" || exit 2
ARTIFACTS="$REPO/e2e/_artifacts/kind/$KUBERNETES_VERSION"  # one folder per version (make e2e-kind runs each)
CLUSTER="${KIND_CLUSTER_NAME:-dra-gpu}"
IMAGE="dra-gpu:kind"
NAMESPACE="dra-gpu"
SIM_ROOTS="/tmp/dra-gpu-kind"
PY="$REPO/.venv/bin/python"
CACHE="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}"
BIN="$CACHE/k8s/$KUBERNETES_VERSION/bin"
# The simulated GPU nodes: kind node name -> hardware profile (cluster.yaml has the same workers), and for a
# node prepared as one of NVIDIA's examples needs, that example (its expect.yaml nvidiaSmi steps run on the root
# before the cluster starts, as an admin sets the GPUs up out of band). One node simulates one profile: the
# A100 node carries gpu-test4's half-balanced MIG layout (gpu-test6 runs on its four GPUs without MIG).
declare -A SIM_NODES=(["$CLUSTER-worker"]=dgx-h100 ["$CLUSTER-worker2"]=pcie-4x-l40s
    ["$CLUSTER-worker3"]=dgx-a100 ["$CLUSTER-worker4"]=dual-gh200)
CONFORMANCE="$REPO/tests/conformance/nvidia"
declare -A SIM_SETUP=(["$CLUSTER-worker3"]="$CONFORMANCE/gpu-test4/expect.yaml"
    ["$CLUSTER-worker4"]="$CONFORMANCE/extended-resources-mig-1g-12gb/expect.yaml")

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
die() { log "ERROR: $*"; exit 2; }
now() { date +%s.%N; }
t_start="$(now)"
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

mkdir -p "$ARTIFACTS"
e2e/cluster/install-host-deps.sh kind
e2e/cluster/build.sh all helm kind >&2
export PATH="$CACHE/kind/$KIND_VERSION:$BIN:$PATH"
[[ -x "$PY" ]] || die "$PY is missing: run make venv"

# --- 1. Docker -------------------------------------------------------------------------------------
private_docker=0
if ! docker info >/dev/null 2>&1; then
    log "no Docker daemon answers; starting a private one (e2e/kind/dockerd.sh)"
    eval "$("$HERE/dockerd.sh" start)"
    private_docker=1
fi
export DOCKER_HOST="${DOCKER_HOST:-}"
((real)) && { command -v nvkind >/dev/null || die "--real needs nvkind (github.com/NVIDIA/nvkind)"; }

KUBECONFIG_FILE="$ARTIFACTS/kubeconfig"
export KUBECONFIG="$KUBECONFIG_FILE"
created=0
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    kubectl -n "$NAMESPACE" logs -l app.kubernetes.io/component=kubelet-plugin --prefix --tail=-1 \
        >"$ARTIFACTS/plugin.log" 2>&1 || true
    kind export logs "$ARTIFACTS/cluster-logs" --name "$CLUSTER" >/dev/null 2>&1 || true
    if ((created)) && ! ((keep)); then
        log "deleting cluster $CLUSTER"
        kind delete cluster --name "$CLUSTER" >&2 || true
    fi
    if ((private_docker)) && ! ((keep)); then "$HERE/dockerd.sh" stop || true; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 2. node image ---------------------------------------------------------------------------------
if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then
    node_image="$KIND_NODE_IMAGE"
elif ((!private_docker)) && timeout 120 docker pull -q "kindest/node:$KUBERNETES_VERSION" >/dev/null 2>&1; then
    node_image="kindest/node:$KUBERNETES_VERSION"
else
    log "node image from the pinned builds (e2e/kind/node_image.py: assembled once, reused while its recipe holds)"
    node_image="$(python3 "$HERE/node_image.py" --kubernetes-version "$KUBERNETES_VERSION")"
fi
# An image assembled here says which etcd and CoreDNS it carries; a published one carries what kubeadm names.
label() { docker image inspect -f "{{index .Config.Labels \"dra-gpu.$1-image-tag\"}}" "$node_image" 2>/dev/null || true; }
etcd_tag="$(label etcd)" coredns_tag="$(label coredns)"
if [[ -z "$etcd_tag" ]]; then
    etcd_tag="$(kubeadm config images list --kubernetes-version "$KUBERNETES_VERSION" | sed -n 's|.*/etcd:||p')"
    coredns_tag="$(kubeadm config images list --kubernetes-version "$KUBERNETES_VERSION" | sed -n 's|.*/coredns:||p')"
fi
log "node image $node_image (etcd $etcd_tag, coredns $coredns_tag)"
config="$ARTIFACTS/cluster.yaml"
"$PY" "$HERE/cluster_config.py" config --apiserver "$BIN/kube-apiserver" --cluster "$CLUSTER" \
    --sim-roots "$SIM_ROOTS" --etcd-tag "$etcd_tag" --coredns-tag "$coredns_tag" >"$config"

# --- 3. cluster ------------------------------------------------------------------------------------
t_cluster="$(now)"
if kind get clusters 2>/dev/null | grep -x "$CLUSTER" >/dev/null; then  # not -q: its early exit is a SIGPIPE
    log "using the existing kind cluster $CLUSTER"
    kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_FILE"
    running="$(kubectl version -o json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
    [[ "$running" == "$KUBERNETES_VERSION" ]] ||
        die "kind cluster $CLUSTER runs $running, not $KUBERNETES_VERSION: kind delete cluster --name $CLUSTER"
else
    created=1
    if ((real)); then
        nvkind cluster create --name "$CLUSTER" --image "$node_image" \
            --config-template "$HERE/nvkind-template.yaml" --config-values "$HERE/nvkind-values.yaml"
    else
        # Each simulated node's driver root: made here, mounted into its node (cluster.yaml extraMounts).
        for node in "${!SIM_NODES[@]}"; do
            rm -rf "${SIM_ROOTS:?}/$node"
            mkdir -p "$SIM_ROOTS/$node/driver-root"
            setup=()
            [[ -n "${SIM_SETUP[$node]:-}" ]] && setup=(--setup-from "${SIM_SETUP[$node]}")
            "$PY" "$HERE/cluster_config.py" prepare-root --hardware "${SIM_NODES[$node]}" --seed "$node" \
                --root "$SIM_ROOTS/$node/driver-root" "${setup[@]}"
        done
        log "creating kind cluster $CLUSTER"
        kind create cluster --name "$CLUSTER" --image "$node_image" --config "$config" --kubeconfig "$KUBECONFIG_FILE" >&2
    fi
    python3 "$HERE/cni.py" "$KUBECONFIG_FILE"
fi
kubectl wait --for=condition=Ready nodes --all --timeout=300s >&2
cluster_s="$(secs "$t_cluster")"
log "cluster ready in ${cluster_s}s"
kubectl get nodes -o wide >&2
if ((!real)); then
    # The suite's examples assume the DGX node; e2e/test_two_nodes.py uncordons the L40S node while it runs,
    # and NVIDIA's examples for A100 and GH200 run with their node the only one uncordoned.
    # (A cordon keeps new pods off the node; the plugin's DaemonSet pod runs there all the same.)
    for node in "${!SIM_NODES[@]}"; do
        [[ "$node" == "$CLUSTER-worker" ]] || kubectl cordon "$node" >&2
    done
fi

# --- 4. images -------------------------------------------------------------------------------------
t_image="$(now)"
tool=""
((private_docker)) && tool=buildah  # the private daemon pulls nothing; buildah builds on a local base
log "building $IMAGE"
IMAGE_TOOL="$tool" "$REPO/manifests/image/build.sh" "$IMAGE" >&2
if [[ "$tool" == buildah ]]; then
    rm -f "$ARTIFACTS/driver-image.tar"
    buildah push --quiet "$IMAGE" "docker-archive:$ARTIFACTS/driver-image.tar:docker.io/library/$IMAGE"
    kind load image-archive --name "$CLUSTER" "$ARTIFACTS/driver-image.tar" >&2
    rm -f "$ARTIFACTS/driver-image.tar"
else
    kind load docker-image --name "$CLUSTER" "$IMAGE" >&2
fi
# The examples' containers run the suite's busybox image (examples/README.md, container contract).
busybox="$("$PY" e2e/cluster/cluster.py images | awk '$1 == "registry.local/busybox:1" {print $2}')"
kind load image-archive --name "$CLUSTER" "$busybox" >&2
image_s="$(secs "$t_image")"

# --- 5. chart and suite ----------------------------------------------------------------------------
values="$HERE/values.yaml"
((real)) && values="$HERE/values-real.yaml"
log "helm install (values $(basename "$values"))"
t_helm="$(now)"
helm upgrade --install dra-gpu "$REPO/manifests/helm/dra-gpu" --namespace "$NAMESPACE" --create-namespace \
    -f "$values" --wait --timeout 5m >&2
helm_s="$(secs "$t_helm")"

export DRA_GPU_E2E_MODE=in-cluster
export DRA_GPU_E2E_KUBECONFIG="$KUBECONFIG_FILE"
export DRA_GPU_E2E_CHART_NAMESPACE="$NAMESPACE"
# The chart tests uninstall and upgrade this release, then install it again as here.
export DRA_GPU_E2E_CHART_RELEASE=dra-gpu DRA_GPU_E2E_CHART_VALUES="$values"
export DRA_GPU_E2E_PLUGIN_PORT=8080
export DRA_GPU_E2E_ARTIFACTS="$ARTIFACTS"
export DRA_GPU_E2E_REQUIRE=1
export DRA_GPU_E2E_KIND_CLUSTER="$CLUSTER"
if ((real)); then
    export DRA_GPU_E2E_HARDWARE=real
else
    # The suite's GPU node: the DGX H100 (its examples assume 8 H100s); the L40S node is for the two-node tests.
    export DRA_GPU_E2E_HARDWARE=dgx-h100 DRA_GPU_E2E_DRIVER_ROOT=/opt/dra-gpu/driver-root
    export DRA_GPU_E2E_NODE="$CLUSTER-worker" DRA_GPU_E2E_SECOND_NODE="$CLUSTER-worker2"
    export DRA_GPU_E2E_HARDWARE_NODES="dgx-a100=$CLUSTER-worker3,dual-gh200=$CLUSTER-worker4"
fi
t_suite="$(now)"
rc=0
"$PY" -m pytest -p no:cacheprovider -o testpaths=e2e --junitxml="$ARTIFACTS/e2e-junit.xml" -v -rA \
    --timeout=900 e2e "${args[@]}" || rc=$?
suite_s="$(secs "$t_suite")"
"$PY" -m e2e.lib.report --report "$ARTIFACTS/e2e-report.json" --junit "$ARTIFACTS/e2e-junit.xml" \
    --build-times "$ARTIFACTS/none.json" | tee "$ARTIFACTS/e2e-summary.txt"
printf '[kind] Kubernetes %s; wall time: cluster %ss, images %ss, helm install %ss, suite %ss, total %ss (node image %s)\n' \
    "$KUBERNETES_VERSION" "$cluster_s" "$image_s" "$helm_s" "$suite_s" "$(secs "$t_start")" "$node_image" | tee -a "$ARTIFACTS/e2e-summary.txt"
exit "$rc"
