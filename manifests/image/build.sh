#!/usr/bin/env bash
# Builds the dra-gpu container image with the first tool that works here: docker (with a reachable daemon),
# podman, or buildah. Without one it says why and exits 1.
# Usage: manifests/image/build.sh [IMAGE]   (default: dra-gpu:<version from pyproject.toml>)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml" | head -n1)"
IMAGE="${1:-dra-gpu:${VERSION}}"
REVISION="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
ARGS=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" -t "$IMAGE" -f "$REPO/Dockerfile" "$REPO")
[[ -n "${PYTHON_IMAGE:-}" ]] && ARGS=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE" "${ARGS[@]}")

why=()
if command -v docker >/dev/null; then
    if docker info >/dev/null 2>&1; then
        exec docker build "${ARGS[@]}"
    fi
    why+=("docker is installed but its daemon is not reachable (docker info fails)")
else
    why+=("docker is not installed")
fi
if command -v podman >/dev/null; then
    exec podman build "${ARGS[@]}"
fi
why+=("podman is not installed")
if command -v buildah >/dev/null; then
    exec buildah bud "${ARGS[@]}"
fi
why+=("buildah is not installed")
echo "manifests/image/build.sh: cannot build $IMAGE:" >&2
printf '  - %s\n' "${why[@]}" >&2
echo "Install one of them (or start the Docker daemon) and run 'make image' again." >&2
exit 1
