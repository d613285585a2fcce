#!/usr/bin/env bash
# Builds the pinned Kubernetes test-cluster components from the Go module proxy into
#   ${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}/k8s/<KUBERNETES_VERSION>/bin
# Usage: [KUBERNETES_VERSION=v1.34.12|1.34|all] e2e/cluster/build.sh control-plane|node|all|helm|image [...]
#   KUBERNETES_VERSION  unset: the default of versions.env; a minor (1.34) picks that entry of
#                       KUBERNETES_VERSIONS; "all" builds every entry of KUBERNETES_VERSIONS, one after the other.
#   control-plane  etcd, kube-apiserver, kube-scheduler (what the pytest fixtures need)
#   all            control-plane + kube-controller-manager, kube-scheduler, kubelet, kubectl, containerd, runc, CNI
#   helm           helm
#   nvidia-ctk     nvidia-ctk and nvidia-cdi-hook (NVIDIA Container Toolkit) for the driver image
#   dra-example-driver  the Go example driver's kubelet plugin (the baseline of make bench's side-by-side table)
#   syft           syft (anchore/syft), which writes the driver image's SBOM (manifests/image/build.sh)
#   image          the driver image, via manifests/image/build.sh (needs docker, podman or buildah)
#   kind           kind (sigs.k8s.io/kind), coredns, kubeadm and kube-proxy, for e2e/kind/node_image.py
# A stamp per component (version + recipe) makes a second run instant. Build times go to
# e2e/_artifacts/build-times.json.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# KUBERNETES_VERSION from the caller wins over the default in versions.env.
REQUESTED_VERSION="${KUBERNETES_VERSION:-}"
# shellcheck source=versions.env
source "$HERE/versions.env"
# shellcheck source=k8s-version.sh
source "$HERE/k8s-version.sh"
if [[ "$REQUESTED_VERSION" == all ]]; then
    # One run per tested version; the version-independent components are built once and then reused.
    IFS=, read -r -a _versions <<<"$KUBERNETES_VERSIONS"
    for _v in "${_versions[@]}"; do KUBERNETES_VERSION="$_v" "${BASH_SOURCE[0]}" "$@" || exit; done
    exit 0
fi
select_kubernetes_version "$REQUESTED_VERSION" || exit 1

CACHE="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}"
BIN="$CACHE/k8s/$KUBERNETES_VERSION/bin"
SRC="$CACHE/src"
STAMPS="$BIN/.stamps"
ARTIFACTS="$REPO/e2e/_artifacts"
TIMES_JSON="$ARTIFACTS/build-times.json"
# The cache outlives clones: keep a copy of the build times beside the binaries so that a fresh clone with a
# warm cache can still report the cold build figures.
TIMES_CACHE="$CACHE/k8s/$KUBERNETES_VERSION/build-times.json"
if [[ ! -f "$TIMES_JSON" && -f "$TIMES_CACHE" ]]; then
    mkdir -p "$ARTIFACTS" && cp "$TIMES_CACHE" "$TIMES_JSON"
fi
LOG_DIR="$CACHE/build-logs"

# Everything comes from the module proxy; never let go fetch another toolchain or touch a workspace.
export GOTOOLCHAIN=local GOWORK=off
export GOFLAGS="-mod=mod -buildvcs=false -trimpath"
NICE=(nice -n 10)

log() { echo "[build] $*" >&2; }
# Microsecond clock (bash 5 EPOCHREALTIME); since T0 prints seconds with 2 decimals.
now_us() { echo "${EPOCHREALTIME/./}"; }
since() { local d=$(( $(now_us) - $1 )); printf '%d.%02d' $((d / 1000000)) $(((d % 1000000) / 10000)); }
die() { echo "[build] ERROR: $*" >&2; exit 1; }

BUILT=0  # components actually compiled in this run (0: every stamp was current, a "warm" run)

record_time() { # component version field seconds [section]
    mkdir -p "$ARTIFACTS"
    [[ "$3" == build_s ]] && BUILT=$((BUILT + 1))
    python3 - "$TIMES_JSON" "$1" "$2" "$3" "$4" "${5:-components}" <<'PY'
import json, sys, os, time
path, comp, version, field, secs, section = sys.argv[1:]
data = {}
if os.path.exists(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
entry = data.setdefault(section, {}).setdefault(comp, {})
entry["version"] = version
entry[field] = round(float(secs), 2)
entry[field + "_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
data["host"] = {"cpus": os.cpu_count()}
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(data, f, indent=2, sort_keys=True)
    f.write("\n")
os.replace(tmp, path)
PY
    mkdir -p "$(dirname "$TIMES_CACHE")" && cp "$TIMES_JSON" "$TIMES_CACHE"
}

# run_logged COMPONENT CMD...: runs a build command, its output in a log; on failure names both.
run_logged() {
    local component="$1"; shift
    local logf="$LOG_DIR/$component.log"
    mkdir -p "$LOG_DIR"
    echo "+ $*" >>"$logf"
    if ! "$@" >>"$logf" 2>&1; then
        echo "[build] ERROR: $component failed; command: $*" >&2
        echo "[build] last lines of $logf:" >&2
        tail -n 30 "$logf" >&2
        exit 1
    fi
}

stamp_ok() { # name recipe binaries...
    local name="$1" recipe="$2"; shift 2
    [[ -f "$STAMPS/$name" && "$(cat "$STAMPS/$name")" == "$recipe" ]] || return 1
    local b
    for b in "$@"; do [[ -x "$BIN/$b" ]] || return 1; done
}

# dir_stamp_ok DIR RECIPE BINARIES...: the same for a component installed in a directory of its own (not a
# Kubernetes version's bin dir), its stamp at DIR/.stamp.
dir_stamp_ok() {
    local dir="$1" recipe="$2"; shift 2
    [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$recipe" ]] || return 1
    local b
    for b in "$@"; do [[ -x "$dir/$b" ]] || return 1; done
}

# locked NAME CMD...: runs CMD holding $CACHE/k8s/.lock-NAME. Several sessions may call build.sh at once: one
# builds a component, the others wait for that component only and then find its stamp current.
locked() {
    local name="$1" fd; shift
    exec {fd}>"$CACHE/k8s/.lock-$name"
    flock "$fd"
    "$@"
    exec {fd}>&-
}

write_stamp() { mkdir -p "$STAMPS"; printf '%s' "$2" >"$STAMPS/$1"; }

# reuse_shared NAME RECIPE BINARIES...: etcd, containerd, runc, CNI and Helm do not depend on the Kubernetes
# version. When another version's bin dir holds them with the same recipe, link (or copy) them instead of
# compiling again: the second Kubernetes version costs only its own binaries.
reuse_shared() {
    local name="$1" recipe="$2"; shift 2
    local other b
    for other in "$CACHE"/k8s/*/bin; do
        [[ "$other" != "$BIN" && -f "$other/.stamps/$name" && "$(cat "$other/.stamps/$name")" == "$recipe" ]] || continue
        for b in "$@"; do [[ -x "$other/$b" ]] || continue 2; done
        for b in "$@"; do
            mkdir -p "$(dirname "$BIN/$b")"
            ln -f "$other/$b" "$BIN/$b" 2>/dev/null || cp -p "$other/$b" "$BIN/$b"
        done
        write_stamp "$name" "$recipe"
        log "$name reused from $other"
        return 0
    done
    return 1
}

# module_dir MODULE@VERSION: downloads a module and prints its (read-only) directory in the module cache.
module_dir() {
    local json dir
    json="$(go mod download -json "$1")" || die "go mod download -json $1 failed"
    dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
    [[ -n "$dir" && -d "$dir" ]] || die "go mod download $1 gave no directory: $json"
    echo "$dir"
}

# writable_source MODULE VERSION STAGING_VERSION: a writable copy of a module with its monorepo-local
# replaces dropped (see gomod_localize.py). Prints the directory.
writable_source() {
    local module="$1" version="$2" staging="$3"
    local name dest ready
    name="$(echo "$module" | tr '/' '_')@$version"
    dest="$SRC/$name"
    ready="$dest/.dra-gpu-prepared"
    if [[ ! -f "$ready" ]]; then
        log "preparing source $module@$version"
        local from
        from="$(module_dir "$module@$version")"
        rm -rf "$dest"; mkdir -p "$dest"
        cp -r "$from/." "$dest/"
        chmod -R u+w "$dest"
        rm -f "$dest/go.work" "$dest/go.work.sum"
        local edits
        edits="$(cd "$dest" && go mod edit -json | python3 "$HERE/gomod_localize.py" "$staging")"
        if [[ -n "$edits" ]]; then
            # shellcheck disable=SC2086
            (cd "$dest" && go mod edit $edits) || die "go mod edit in $dest failed"
        fi
        touch "$ready"
    fi
    echo "$dest"
}

# ---------------------------------------------------------------------------------------------- Kubernetes
k8s_ldflags() {
    local v="${KUBERNETES_VERSION#v}" major minor date
    major="${v%%.*}"; minor="$(echo "$v" | cut -d. -f2)"
    # The module's publication time: a reproducible build date.
    date="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.info" 2>/dev/null || true)"
    [[ -n "$date" ]] || date="1970-01-01T00:00:00Z"
    local flags="-s -w" pkg
    # /version and --version come from these; the driver picks its ResourceSlice layout from the minor.
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date -X $pkg.gitCommit=module-proxy-$KUBERNETES_VERSION"
    done
    echo "$flags"
}

build_k8s() { # binaries...
    local todo=() b
    for b in "$@"; do
        if stamp_ok "$b" "$KUBERNETES_VERSION cgo0" "$b"; then
            log "$b $KUBERNETES_VERSION up to date"
        else
            todo+=("$b")
        fi
    done
    ((${#todo[@]})) || return 0
    local src
    src="$(writable_source k8s.io/kubernetes "$KUBERNETES_VERSION" "$KUBERNETES_STAGING_VERSION")"
    local ldflags
    ldflags="$(k8s_ldflags)"
    for b in "${todo[@]}"; do
        log "$b $KUBERNETES_VERSION ..."
        local t0; t0=$(now_us)
        (cd "$src" && CGO_ENABLED=0 run_logged "$b" "${NICE[@]}" go build -ldflags "$ldflags" -o "$BIN/$b" "./cmd/$b")
        write_stamp "$b" "$KUBERNETES_VERSION cgo0"
        log "$b $KUBERNETES_VERSION done in $(since "$t0")s"
        record_time "$b" "$KUBERNETES_VERSION" build_s "$(since "$t0")"
    done
}

# -------------------------------------------------------------------------------------------------- etcd
build_etcd() {
    if stamp_ok etcd "$ETCD_VERSION cgo0" etcd; then log "etcd $ETCD_VERSION up to date"; return 0; fi
    reuse_shared etcd "$ETCD_VERSION cgo0" etcd && return 0
    log "etcd $ETCD_VERSION ..."
    local t0 src; t0=$(now_us)
    src="$(writable_source go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$ETCD_VERSION")"
    (cd "$src" && CGO_ENABLED=0 run_logged etcd "${NICE[@]}" go build -ldflags "-s -w" -o "$BIN/etcd" .)
    write_stamp etcd "$ETCD_VERSION cgo0"
    log "etcd $ETCD_VERSION done in $(since "$t0")s"
    record_time etcd "$ETCD_VERSION" build_s "$(since "$t0")"
}

# ----------------------------------------------------------------------------------------- containerd
build_containerd() {
    local recipe="$CONTAINERD_VERSION cgo0 no_btrfs,no_devmapper,no_zfs"
    if stamp_ok containerd "$recipe" containerd containerd-shim-runc-v2 ctr; then
        log "containerd $CONTAINERD_VERSION up to date"; return 0
    fi
    reuse_shared containerd "$recipe" containerd containerd-shim-runc-v2 ctr && return 0
    log "containerd $CONTAINERD_VERSION ..."
    local t0 src; t0=$(now_us)
    src="$(writable_source github.com/containerd/containerd/v2 "$CONTAINERD_VERSION" "$CONTAINERD_VERSION")"
    local ld="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
    ld+=" -X github.com/containerd/containerd/v2/version.Revision=module-proxy"
    local c
    for c in containerd containerd-shim-runc-v2 ctr; do
        (cd "$src" && CGO_ENABLED=0 run_logged containerd "${NICE[@]}" go build \
            -tags "no_btrfs no_devmapper no_zfs" -ldflags "$ld" -o "$BIN/$c" "./cmd/$c")
    done
    write_stamp containerd "$recipe"
    log "containerd $CONTAINERD_VERSION done in $(since "$t0")s"
    record_time containerd "$CONTAINERD_VERSION" build_s "$(since "$t0")"
}

# ------------------------------------------------------------------------------------------------- runc
build_runc() {
    # runc's nsenter is C, so cgo is required; seccomp only when libseccomp-dev is installed.
    local tags=""
    if [[ -f /usr/include/seccomp.h ]]; then tags="seccomp"; fi
    local recipe="$RUNC_VERSION cgo1 tags=$tags"
    if stamp_ok runc "$recipe" runc; then log "runc $RUNC_VERSION up to date"; return 0; fi
    reuse_shared runc "$recipe" runc && return 0
    log "runc $RUNC_VERSION (tags: ${tags:-none}) ..."
    local t0 src; t0=$(now_us)
    src="$(writable_source github.com/opencontainers/runc "$RUNC_VERSION" "$RUNC_VERSION")"
    (cd "$src" && CGO_ENABLED=1 run_logged runc "${NICE[@]}" go build -tags "$tags" \
        -ldflags "-s -w -X main.version=${RUNC_VERSION#v} -X main.gitCommit=module-proxy" -o "$BIN/runc" .)
    write_stamp runc "$recipe"
    log "runc $RUNC_VERSION done in $(since "$t0")s"
    record_time runc "$RUNC_VERSION" build_s "$(since "$t0")"
}

# ------------------------------------------------------------------------------------------ CNI plugins
# ptp: the kind cluster's pod network (e2e/kind/cni.py), as kind's own nodes carry it.
CNI_PLUGINS=(main/bridge main/ptp main/loopback ipam/host-local meta/portmap)
build_cni() {
    local names=() p
    for p in "${CNI_PLUGINS[@]}"; do names+=("cni/${p#*/}"); done
    if stamp_ok cni "$CNI_PLUGINS_VERSION cgo0 ${CNI_PLUGINS[*]}" "${names[@]}"; then
        log "cni plugins $CNI_PLUGINS_VERSION up to date"; return 0
    fi
    reuse_shared cni "$CNI_PLUGINS_VERSION cgo0 ${CNI_PLUGINS[*]}" "${names[@]}" && return 0
    log "cni plugins $CNI_PLUGINS_VERSION ..."
    local t0 src; t0=$(now_us)
    src="$(writable_source github.com/containernetworking/plugins "$CNI_PLUGINS_VERSION" "$CNI_PLUGINS_VERSION")"
    mkdir -p "$BIN/cni"
    for p in "${CNI_PLUGINS[@]}"; do
        (cd "$src" && CGO_ENABLED=0 run_logged cni "${NICE[@]}" go build -ldflags "-s -w" \
            -o "$BIN/cni/${p#*/}" "./plugins/$p")
    done
    write_stamp cni "$CNI_PLUGINS_VERSION cgo0 ${CNI_PLUGINS[*]}"
    log "cni plugins $CNI_PLUGINS_VERSION done in $(since "$t0")s"
    record_time cni-plugins "$CNI_PLUGINS_VERSION" build_s "$(since "$t0")"
}

# ------------------------------------------------------------------------------------------------- helm
build_helm() {
    local major="${HELM_VERSION%%.*}"
    if stamp_ok helm "$HELM_VERSION cgo0" helm; then log "helm $HELM_VERSION up to date"; return 0; fi
    reuse_shared helm "$HELM_VERSION cgo0" helm && return 0
    log "helm $HELM_VERSION ..."
    local t0 src; t0=$(now_us)
    src="$(writable_source "helm.sh/helm/$major" "$HELM_VERSION" "$HELM_VERSION")"
    (cd "$src" && CGO_ENABLED=0 run_logged helm "${NICE[@]}" go build \
        -ldflags "-s -w -X helm.sh/helm/$major/internal/version.version=$HELM_VERSION" -o "$BIN/helm" ./cmd/helm)
    write_stamp helm "$HELM_VERSION cgo0"
    log "helm $HELM_VERSION done in $(since "$t0")s"
    record_time helm "$HELM_VERSION" build_s "$(since "$t0")"
}

# ------------------------------------------------------------------------------ NVIDIA Container Toolkit
# nvidia-ctk (cdi generate; cgo: it dlopens NVML through go-nvml) and nvidia-cdi-hook (static: the plugin copies
# it onto the node, whose libc we do not know) for the driver image. Installed under $CACHE/nvidia-ctk/<version>.
NVCTK_DIR="$CACHE/nvidia-ctk/${NVIDIA_CONTAINER_TOOLKIT_VERSION:-unset}"
build_nvidia_ctk() {
    local v="$NVIDIA_CONTAINER_TOOLKIT_VERSION" recipe="$NVIDIA_CONTAINER_TOOLKIT_VERSION ctk-cgo1 hook-cgo1-static"
    if dir_stamp_ok "$NVCTK_DIR" "$recipe" nvidia-ctk nvidia-cdi-hook; then
        log "nvidia-ctk $v up to date"; return 0
    fi
    log "nvidia-ctk, nvidia-cdi-hook $v ..."
    local t0 src; t0=$(now_us)
    src="$(module_dir "github.com/NVIDIA/nvidia-container-toolkit@$v")"
    local ld="-s -w -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${v#v}"
    ld+=" -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.gitCommit=module-proxy"
    mkdir -p "$NVCTK_DIR"
    (cd "$src" && CGO_ENABLED=1 run_logged nvidia-ctk "${NICE[@]}" go build -ldflags "$ld" \
        -o "$NVCTK_DIR/nvidia-ctk" ./cmd/nvidia-ctk)
    # go-nvml needs cgo even where NVML is never called; linked statically all the same (the hooks it runs
    # do not dlopen NVML), so any node's libc runs it.
    (cd "$src" && CGO_ENABLED=1 run_logged nvidia-ctk "${NICE[@]}" go build -tags "osusergo netgo" \
        -ldflags "$ld -linkmode external -extldflags -static" -o "$NVCTK_DIR/nvidia-cdi-hook" ./cmd/nvidia-cdi-hook)
    printf '%s' "$recipe" >"$NVCTK_DIR/.stamp"
    log "nvidia-ctk $v done in $(since "$t0")s"
    record_time nvidia-ctk "$v" build_s "$(since "$t0")"
}

# ---------------------------------------------------------------------------------- Go example DRA driver
# sigs.k8s.io/dra-example-driver's kubelet plugin: the Go baseline that bench/bench_side_by_side.py runs next to
# ours against the same apiserver. Built from the module's own go.mod (`go install pkg@version` would ask the
# proxy for the module's version list, which it does not serve). Installed under $CACHE/dra-example-driver/<v>.
EXAMPLE_DRIVER_DIR="$CACHE/dra-example-driver/${DRA_EXAMPLE_DRIVER_VERSION:-unset}"
build_dra_example_driver() {
    local v="$DRA_EXAMPLE_DRIVER_VERSION" recipe="$DRA_EXAMPLE_DRIVER_VERSION kubeletplugin-cgo0"
    if dir_stamp_ok "$EXAMPLE_DRIVER_DIR" "$recipe" dra-example-kubeletplugin; then
        log "dra-example-driver $v up to date"; return 0
    fi
    log "dra-example-driver $v ..."
    local t0 src; t0=$(now_us)
    src="$(writable_source sigs.k8s.io/dra-example-driver "$v" "$v")"
    mkdir -p "$EXAMPLE_DRIVER_DIR"
    (cd "$src" && CGO_ENABLED=0 run_logged dra-example-driver "${NICE[@]}" go build -ldflags "-s -w" \
        -o "$EXAMPLE_DRIVER_DIR/dra-example-kubeletplugin" ./cmd/dra-example-kubeletplugin)
    printf '%s' "$recipe" >"$EXAMPLE_DRIVER_DIR/.stamp"
    log "dra-example-driver $v done in $(since "$t0")s"
    record_time dra-example-driver "$v" build_s "$(since "$t0")"
}

# ------------------------------------------------------------------------------------------------- kind
# build_go_tool NAME VERSION MODULE DIR: the main package at a module's root, built from the module's own go.mod
# (like the example driver) into DIR/NAME, with DIR/.stamp.
build_go_tool() {
    local name="$1" v="$2" module="$3" dir="$4" recipe="$2 cgo0"
    if dir_stamp_ok "$dir" "$recipe" "$name"; then log "$name $v up to date"; return 0; fi
    log "$name $v ..."
    local t0 src; t0=$(now_us)
    src="$(module_dir "$module@$v")"
    mkdir -p "$dir"
    (cd "$src" && CGO_ENABLED=0 run_logged "$name" "${NICE[@]}" go build -ldflags "-s -w" -o "$dir/$name" .)
    printf '%s' "$recipe" >"$dir/.stamp"
    log "$name $v done in $(since "$t0")s"
    record_time "$name" "$v" build_s "$(since "$t0")"
}
# kind's CLI for `make e2e-kind` (e2e/kind/), and CoreDNS, the cluster DNS kubeadm deploys, which
# e2e/kind/node_image.py wraps as the node image's coredns image.
build_kind() { build_go_tool kind "$KIND_VERSION" sigs.k8s.io/kind "$CACHE/kind/${KIND_VERSION:-unset}"; }
build_coredns() {
    build_go_tool coredns "$COREDNS_VERSION" github.com/coredns/coredns "$CACHE/coredns/${COREDNS_VERSION:-unset}"
}

# ------------------------------------------------------------------------------------------------- syft
# anchore/syft: manifests/image/build.sh writes the image's SBOM with it (Debian packages, Python dist-infos and
# the Go build info of nvidia-ctk, all in one document). Built from the module's own go.mod into
# $CACHE/syft/<version>; main.version set as syft's release builds set it, so the SBOM names the tool's version.
SYFT_DIR="$CACHE/syft/${SYFT_VERSION:-unset}"
build_syft() {
    local v="$SYFT_VERSION" recipe="$SYFT_VERSION cgo0"
    if dir_stamp_ok "$SYFT_DIR" "$recipe" syft; then log "syft $v up to date"; return 0; fi
    log "syft $v ..."
    local t0 src; t0=$(now_us)
    src="$(module_dir "github.com/anchore/syft@$v")"
    mkdir -p "$SYFT_DIR"
    (cd "$src" && CGO_ENABLED=0 run_logged syft "${NICE[@]}" go build \
        -ldflags "-s -w -X main.version=${v#v} -X main.gitCommit=module-proxy" -o "$SYFT_DIR/syft" ./cmd/syft)
    printf '%s' "$recipe" >"$SYFT_DIR/.stamp"
    log "syft $v done in $(since "$t0")s"
    record_time syft "$v" build_s "$(since "$t0")"
}

# ------------------------------------------------------------------------------------------------- main
main() {
    (($#)) || set -- control-plane
    command -v go >/dev/null || die "go is not installed (need go >= 1.26 for Kubernetes $KUBERNETES_VERSION)"
    mkdir -p "$BIN" "$SRC"
    local t0 target; t0=$(now_us)
    for target in "$@"; do
        local t_target built_before=$BUILT; t_target=$(now_us)
        case "$target" in
            # kube-scheduler too: `make test` builds only this target and the kube_scheduler fixture needs it.
            control-plane) locked etcd build_etcd; locked "k8s-$KUBERNETES_VERSION" build_k8s kube-apiserver kube-scheduler ;;
            node) locked "k8s-$KUBERNETES_VERSION" build_k8s kubelet; locked containerd build_containerd; locked runc build_runc
                locked cni build_cni ;;
            all)
                locked etcd build_etcd
                locked "k8s-$KUBERNETES_VERSION" build_k8s kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl
                locked containerd build_containerd; locked runc build_runc; locked cni build_cni ;;
            scheduler) locked "k8s-$KUBERNETES_VERSION" build_k8s kube-scheduler ;;  # kept for callers; control-plane has it
            helm) locked helm build_helm ;;
            nvidia-ctk) locked nvidia-ctk build_nvidia_ctk ;;
            dra-example-driver) locked dra-example-driver build_dra_example_driver ;;
            syft) locked syft build_syft ;;
            # kind and what its node image needs beyond `all`: kubeadm sets the node up, kube-proxy serves
            # ClusterIPs inside the kind cluster.
            kind) locked kind build_kind; locked coredns build_coredns
                locked "k8s-$KUBERNETES_VERSION" build_k8s kubeadm kube-proxy ;;
            # The driver's container image (docker/podman/buildah); `make image` calls this target.
            image) "$REPO/manifests/image/build.sh" ;;
            *) die "unknown target '$target' (use control-plane, node, all, scheduler, helm, nvidia-ctk, dra-example-driver, syft, kind or image)" ;;
        esac
        # cold_s: this target compiled something; warm_s: every stamp was current.
        local kind=warm_s
        ((BUILT > built_before)) && kind=cold_s
        record_time "$target" "$KUBERNETES_VERSION" "$kind" "$(since "$t_target")" targets
    done
    log "binaries in $BIN ($(since "$t0")s)"
}

main "$@"
