#!/usr/bin/env bash
# Installs the host packages the local test cluster needs (Debian/Ubuntu). Idempotent: when every package is
# already installed it only runs dpkg-query and returns within a second.
set -euo pipefail

PACKAGES=(
    iptables        # kubelet/CNI portmap and bridge masquerade rules
    conntrack       # kubelet/kube-proxy style conntrack cleanup; the bridge plugin tolerates its absence
    socat           # kubectl port-forward through the kubelet
    ethtool
    iproute2        # ip, for CNI and for debugging pod networking
    util-linux      # mount, nsenter, unshare
    mount
    busybox-static  # the test image's only binary
    openssl         # certificates for the control plane
    ca-certificates
    gcc             # the pause image is a tiny static C program
    libc6-dev
    libseccomp-dev  # runc built with seccomp support
    pkg-config
    kmod
    procps
    psmisc
)

# `install-host-deps.sh image`: also what `make image` needs on a machine without Docker: buildah builds the
# Dockerfile without a daemon (RUN steps with --isolation chroot, no new cgroups) and debootstrap makes the
# local Debian base when the default base image cannot be pulled (manifests/image/debian-base.sh).
if [[ "${1:-}" == "image" || "${1:-}" == "kind" ]]; then
    PACKAGES+=(buildah debootstrap)
fi
# `install-host-deps.sh kind`: also the Docker engine kind's nodes run in (Debian's docker.io: dockerd, its
# containerd and the docker CLI); e2e/kind/dockerd.sh starts a private daemon when none is running.
if [[ "${1:-}" == "kind" ]]; then
    PACKAGES+=(docker.io)
fi

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null; then
        missing+=("$p")
    fi
done
if ((${#missing[@]} == 0)); then
    echo "[host-deps] all ${#PACKAGES[@]} packages present"
    exit 0
fi
if [[ $EUID -ne 0 ]]; then
    echo "[host-deps] missing: ${missing[*]}; run as root: apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "[host-deps] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "[host-deps] done"
