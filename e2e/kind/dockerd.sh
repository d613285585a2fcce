#!/usr/bin/env bash
# A private Docker daemon for kind, on a machine where none runs (this team's machines; CI).
#
#   e2e/kind/dockerd.sh start   prints `export DOCKER_HOST=...` once the daemon answers
#   e2e/kind/dockerd.sh stop    stops it, and removes the cgroups its containers used
#
# Docker's engine is Debian's docker.io (e2e/cluster/install-host-deps.sh kind). What differs from a stock
# daemon, and why:
# - its socket, data and state live under /run/dra-gpu-dockerd and /var/lib/dra-gpu-dockerd, so a system
#   daemon (if any) is left alone; the kind node images stay there between runs, like the other caches;
# - every container goes under this process's own cgroup (<ours>/dra-gpu-kind, cgroupfs driver), never
#   elsewhere, as the local cluster does (e2e/cluster/cluster.py);
# - the runtime is runc_bounded.py around the pinned runc: `--privileged` (every kind node) asks for
#   capabilities this machine withholds (CAP_SYS_RESOURCE), which runc refuses;
# - --iptables=false: the host's firewall is not touched; kind's nodes share one bridge, and the API server
#   is published on 127.0.0.1 by docker-proxy.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../cluster/versions.env
source "$REPO/e2e/cluster/versions.env"
RUN_DIR=/run/dra-gpu-dockerd
DATA_DIR=/var/lib/dra-gpu-dockerd
SOCK="$RUN_DIR/docker.sock"
CGROUP_LEAF=dra-gpu-kind
CACHE="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}"
RUNC="$CACHE/k8s/$KUBERNETES_VERSION/bin/runc"

log() { echo "[dockerd] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Our cgroup, the deepest path inside it in every hierarchy: the local cluster's rule (cluster.py).
own_cgroup() { python3 "$REPO/e2e/cluster/cluster.py" cgroup-root; }

start() {
    command -v dockerd >/dev/null || die "dockerd is not installed: run e2e/cluster/install-host-deps.sh kind"
    [[ -x "$RUNC" ]] || die "$RUNC is missing: run e2e/cluster/build.sh node"
    if [[ -S "$SOCK" ]] && DOCKER_HOST="unix://$SOCK" docker info >/dev/null 2>&1; then
        echo "export DOCKER_HOST=unix://$SOCK"; return 0
    fi
    mkdir -p "$RUN_DIR" "$DATA_DIR"
    local parent; parent="$(own_cgroup)"
    log "starting (data $DATA_DIR, containers under cgroup ${parent%/}/$CGROUP_LEAF)"
    DRA_GPU_REAL_RUNC="$RUNC" setsid dockerd \
        --host "unix://$SOCK" --data-root "$DATA_DIR" --exec-root "$RUN_DIR/exec" --pidfile "$RUN_DIR/dockerd.pid" \
        --cgroup-parent "${parent%/}/$CGROUP_LEAF" --exec-opt native.cgroupdriver=cgroupfs \
        --add-runtime "bounded=$HERE/runc_bounded.py" --default-runtime bounded \
        --iptables=false --ip-masq=false --containerd-namespace dra-gpu-kind \
        >"$RUN_DIR/dockerd.log" 2>&1 </dev/null &
    local i
    for i in $(seq 1 60); do
        DOCKER_HOST="unix://$SOCK" docker info >/dev/null 2>&1 && { echo "export DOCKER_HOST=unix://$SOCK"; return 0; }
        sleep 0.5
    done
    tail -n 20 "$RUN_DIR/dockerd.log" >&2
    die "dockerd did not answer within 30 s"
}

stop() {
    local pid
    pid="$(cat "$RUN_DIR/dockerd.pid" 2>/dev/null || true)"
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        DOCKER_HOST="unix://$SOCK" docker ps -aq 2>/dev/null | xargs -r env DOCKER_HOST="unix://$SOCK" docker rm -f \
            >/dev/null 2>&1 || true
        kill "$pid"
        local i
        for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$pid" 2>/dev/null || true
        log "stopped"
    fi
    # The cgroups docker made for its containers, deepest first; busy ones (a container still dying) stay.
    local parent; parent="$(own_cgroup)"
    find /sys/fs/cgroup -depth -type d -path "*${parent%/}/$CGROUP_LEAF*" -exec rmdir {} \; 2>/dev/null || true
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
