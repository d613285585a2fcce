#!/usr/bin/env bash
# Builds the dra-gpu container image with the first tool that works here: docker (with a reachable daemon),
# buildah, or podman. Without one it says why and exits 1.
# Usage: manifests/image/build.sh [IMAGE]   (default: dra-gpu:<version from pyproject.toml>)
# Environment:
#   PYTHON_IMAGE     the base (Dockerfile build argument). Unset: the Dockerfile's default when it can be pulled,
#                    otherwise a local Debian bookworm + Python base made by debian-base.sh (debootstrap).
#   DRA_GPU_OCI_OUT  also write the image as an OCI archive there (e2e/image/build.sh imports it into the
#                    local cluster's containerd).
#   IMAGE_TOOL       docker, buildah or podman: skip the detection.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$REPO/manifests/image"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml" | awk 'NR == 1')"
IMAGE="${1:-dra-gpu:${VERSION}}"
REVISION="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
DEFAULT_BASE="$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$REPO/Dockerfile" | awk 'NR == 1')"
log() { echo "[image] $*" >&2; }

pick_tool() {
    local why=()
    if [[ -n "${IMAGE_TOOL:-}" ]]; then echo "$IMAGE_TOOL"; return; fi
    if command -v docker >/dev/null; then
        if docker info >/dev/null 2>&1; then echo docker; return; fi
        why+=("docker is installed but its daemon is not reachable (docker info fails)")
    else
        why+=("docker is not installed")
    fi
    # buildah and podman build without a daemon; --isolation chroot runs RUN steps without new cgroups.
    command -v buildah >/dev/null && { echo buildah; return; }
    why+=("buildah is not installed")
    command -v podman >/dev/null && { echo podman; return; }
    why+=("podman is not installed")
    echo "manifests/image/build.sh: cannot build $IMAGE:" >&2
    printf '  - %s\n' "${why[@]}" >&2
    echo "Install buildah (e2e/cluster/install-host-deps.sh image) or start the Docker daemon and run 'make image' again." >&2
    exit 1
}

# A Debian/Ubuntu machine with neither buildah, podman nor a Docker daemon: install buildah and debootstrap
# first (as root; DRA_GPU_NO_HOST_DEPS=1 skips it).
if [[ $EUID -eq 0 && -z "${IMAGE_TOOL:-}" && -z "${DRA_GPU_NO_HOST_DEPS:-}" ]] && command -v apt-get >/dev/null \
        && ! command -v buildah >/dev/null && ! command -v podman >/dev/null && ! docker info >/dev/null 2>&1; then
    "$REPO/e2e/cluster/install-host-deps.sh" image >&2
fi
TOOL="$(pick_tool)"
case "$TOOL" in
    docker) BUILD=(docker build); EXISTS=(docker image inspect); PULL=(docker pull) ;;
    buildah) BUILD=(buildah bud --isolation chroot --layers); EXISTS=(buildah inspect --type image); PULL=(buildah pull) ;;
    podman) BUILD=(podman build --isolation chroot --layers); EXISTS=(podman image inspect); PULL=(podman pull) ;;
    *) echo "IMAGE_TOOL must be docker, buildah or podman, not '$TOOL'" >&2; exit 1 ;;
esac

# The base: an explicit PYTHON_IMAGE, else the default if present or pullable, else the local Debian base.
BASE="${PYTHON_IMAGE:-}"
if [[ -z "$BASE" ]]; then
    if "${EXISTS[@]}" "docker.io/library/$DEFAULT_BASE" >/dev/null 2>&1 \
        || timeout 120 "${PULL[@]}" "docker.io/library/$DEFAULT_BASE" >/dev/null 2>&1; then
        BASE="docker.io/library/$DEFAULT_BASE"  # qualified: buildah/podman refuse ambiguous short names
    elif [[ "$TOOL" == docker ]]; then
        echo "manifests/image/build.sh: cannot pull $DEFAULT_BASE; pass PYTHON_IMAGE=<a base with python3.11>" >&2
        exit 1
    else
        log "$DEFAULT_BASE cannot be pulled: using a local Debian base (manifests/image/debian-base.sh)"
        BASE="$("$HERE/debian-base.sh")"
    fi
fi

# NVIDIA Container Toolkit binaries, built from NVIDIA's Go module (cached) and staged in the build context.
"$REPO/e2e/cluster/build.sh" nvidia-ctk
NVCTK_VERSION="$(sed -n 's/^NVIDIA_CONTAINER_TOOLKIT_VERSION=//p' "$REPO/e2e/cluster/versions.env")"
NVCTK_DIR="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}/nvidia-ctk/$NVCTK_VERSION"
mkdir -p "$REPO/build/image/nvidia"
cp -p "$NVCTK_DIR/nvidia-ctk" "$NVCTK_DIR/nvidia-cdi-hook" "$REPO/build/image/nvidia/"

ARGS=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "PYTHON_IMAGE=$BASE"
      -t "$IMAGE" -f "$REPO/Dockerfile")
# A TLS-intercepting proxy's CA (the host's pip trusts it through PIP_CERT): mounted for the RUN steps only.
if [[ -n "${PIP_CERT:-}" && -f "$PIP_CERT" && "$TOOL" != docker ]]; then
    ARGS+=(--volume "$PIP_CERT:/run/dra-gpu-build-ca.crt:ro" --build-arg PIP_CERT=/run/dra-gpu-build-ca.crt)
fi

log "$TOOL building $IMAGE from $BASE"
t0=$SECONDS
"${BUILD[@]}" "${ARGS[@]}" "$REPO"
log "built $IMAGE in $((SECONDS - t0))s"

# The unpacked size, as `docker images` / `buildah images` show it.
case "$TOOL" in
    docker) size="$(docker image inspect --format '{{.Size}}' "$IMAGE")" ;;
    # awk reads every line: `head -n1` may exit first, and under pipefail the writer's SIGPIPE (141) ended
    # the build (CI, stop 33: two tags of one image, two lines).
    *) size="$("$TOOL" images --format '{{.Size}}' --noheading "$IMAGE" | awk 'NR == 1')" ;;  # e.g. "241 MB"
esac
log "image size $size"

if [[ -n "${DRA_GPU_OCI_OUT:-}" ]]; then
    rm -f "$DRA_GPU_OCI_OUT"
    case "$TOOL" in
        docker) docker save -o "$DRA_GPU_OCI_OUT" "$IMAGE" ;;
        buildah) buildah push --quiet "$IMAGE" "oci-archive:$DRA_GPU_OCI_OUT:$IMAGE" ;;
        podman) podman save --quiet --format oci-archive -o "$DRA_GPU_OCI_OUT" "$IMAGE" ;;
    esac
    log "OCI archive $DRA_GPU_OCI_OUT"
fi
