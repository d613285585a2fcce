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
#   SOURCE_DATE_EPOCH  the time every file and the image config claim; unset: the commit's time (git log -1).
#   DRA_GPU_IMAGE_META  where the SBOM and the provenance go (default build/image/): <image>.spdx.json and
#                    <image>.provenance.json, also written next to DRA_GPU_OCI_OUT when that is set.
#   DRA_GPU_SBOM=0   no SBOM (it needs syft, built once from its Go module by e2e/cluster/build.sh syft).
#   DRA_GPU_IMAGE_NO_CACHE=1  --no-cache (docker's BuildKit cache; buildah and podman build without a cache).
# Reproducible: two builds of one commit on one base give the same image ID and layers with buildah or podman
# (--timestamp sets every file's mtime and the config's dates); the log ends with both ("[image] layer ...").
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$REPO/manifests/image"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml" | awk 'NR == 1')"
IMAGE="${1:-dra-gpu:${VERSION}}"
REVISION="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
DEFAULT_BASE="$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$REPO/Dockerfile" | awk 'NR == 1')"
# The commit's time, so that a rebuild of the same commit writes the same bytes; git's exit status decides (a
# copy without .git builds with 0, still reproducible).
if [[ -z "${SOURCE_DATE_EPOCH:-}" ]]; then
    SOURCE_DATE_EPOCH="$(git -C "$REPO" log -1 --format=%ct 2>/dev/null)" || SOURCE_DATE_EPOCH=0
fi
[[ "$SOURCE_DATE_EPOCH" =~ ^[0-9]+$ ]] || { echo "SOURCE_DATE_EPOCH must be seconds since 1970, not '$SOURCE_DATE_EPOCH'" >&2; exit 1; }
TREE_CLEAN=false
[[ -z "$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null || echo unknown)" ]] && TREE_CLEAN=true
META_DIR="${DRA_GPU_IMAGE_META:-$REPO/build/image}"
META_NAME="${IMAGE//[^A-Za-z0-9._-]/_}"
log() { echo "[image] $*" >&2; }
# untagged REF: REF without its tag (a registry's port stays): name@digest is what every tool pulls.
untagged() { local last="${1##*/}"; if [[ "$last" == *:* ]]; then echo "${1%:*}"; else echo "$1"; fi; }
# The Dockerfile's base as tools pull it: qualified (buildah/podman refuse ambiguous short names) and by digest
# alone (some refuse name:tag@digest).
DEFAULT_REF="docker.io/library/$DEFAULT_BASE"
[[ "$DEFAULT_REF" != *@* ]] || DEFAULT_REF="$(untagged "${DEFAULT_REF%@*}")@${DEFAULT_REF#*@}"

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
# INSPECT ... FORMAT IMAGE: a Go template over the tool's image JSON (ID, digest, layers).
# buildah/podman without --layers: no step comes from a cache, whose entries keep the dates of the build that
# made them (the cache key ignores --timestamp), and each stage is committed once, as one layer on the base.
case "$TOOL" in
    docker) BUILD=(docker build); EXISTS=(docker image inspect); PULL=(docker pull)
        INSPECT=(docker image inspect --format) ;;
    buildah) BUILD=(buildah bud --isolation chroot --layers=false); EXISTS=(buildah inspect --type image)
        PULL=(buildah pull); INSPECT=(buildah inspect --type image --format) ;;
    podman) BUILD=(podman build --isolation chroot --layers=false); EXISTS=(podman image inspect); PULL=(podman pull)
        INSPECT=(podman image inspect --format) ;;
    *) echo "IMAGE_TOOL must be docker, buildah or podman, not '$TOOL'" >&2; exit 1 ;;
esac
image_id() { # IMAGE -> sha256:<config digest>
    local id
    case "$TOOL" in
        buildah) id="$("${INSPECT[@]}" '{{.FromImageID}}' "$1")" ;;
        *) id="$("${INSPECT[@]}" '{{.Id}}' "$1")" ;;
    esac
    echo "sha256:${id#sha256:}"
}
diff_ids() { # IMAGE -> its layers' diff IDs, bottom first, one a line
    case "$TOOL" in
        buildah) "${INSPECT[@]}" '{{range .OCIv1.RootFS.DiffIDs}}{{println .}}{{end}}' "$1" ;;
        *) "${INSPECT[@]}" '{{range .RootFS.Layers}}{{println .}}{{end}}' "$1" ;;
    esac
}
# base_digest IMAGE: the manifest digest a FROM line can name (empty when the tool knows none, e.g. an image
# docker built itself).
base_digest() {
    case "$TOOL" in
        buildah) "${INSPECT[@]}" '{{.FromImageDigest}}' "$1" ;;
        podman) "${INSPECT[@]}" '{{.Digest}}' "$1" ;;
        docker) "${INSPECT[@]}" '{{range .RepoDigests}}{{println .}}{{end}}' "$1" | awk -F@ 'NR == 1 { print $2 }' ;;
    esac
}

# The base: an explicit PYTHON_IMAGE, else the default if present or pullable, else the local Debian base.
BASE="${PYTHON_IMAGE:-}"
if [[ -z "$BASE" ]]; then
    if "${EXISTS[@]}" "$DEFAULT_REF" >/dev/null 2>&1 || timeout 120 "${PULL[@]}" "$DEFAULT_REF" >/dev/null 2>&1; then
        BASE="$DEFAULT_REF"
    elif [[ "$TOOL" == docker ]]; then
        echo "manifests/image/build.sh: cannot pull $DEFAULT_BASE; pass PYTHON_IMAGE=<a base with python3.11>" >&2
        exit 1
    else
        log "$DEFAULT_BASE cannot be pulled: using a local Debian base (manifests/image/debian-base.sh)"
        BASE="$("$HERE/debian-base.sh")"
    fi
fi
# Pinned by digest: a tag can move between two builds, a digest cannot. The local Debian base (or any image
# given by tag) is named by the digest it has now, which the provenance records; the build then reads exactly
# that image, and a rebuild that finds another one under the tag fails to match instead of passing silently.
BASE_TAGGED="$BASE"
if [[ "$BASE" != *@sha256:* ]]; then
    digest="$(base_digest "$BASE" 2>/dev/null || true)"
    if [[ "$digest" == sha256:* ]]; then
        BASE="$(untagged "$BASE")@$digest"
        log "base $BASE_TAGGED pinned as $BASE"
    else
        log "WARNING: base $BASE has no digest here; the build is not pinned (pass PYTHON_IMAGE=<name>@sha256:...)"
    fi
fi

# NVIDIA Container Toolkit binaries, built from NVIDIA's Go module (cached) and staged in the build context.
"$REPO/e2e/cluster/build.sh" nvidia-ctk
NVCTK_VERSION="$(sed -n 's/^NVIDIA_CONTAINER_TOOLKIT_VERSION=//p' "$REPO/e2e/cluster/versions.env")"
NVCTK_DIR="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}/nvidia-ctk/$NVCTK_VERSION"
mkdir -p "$REPO/build/image/nvidia"
cp -p "$NVCTK_DIR/nvidia-ctk" "$NVCTK_DIR/nvidia-cdi-hook" "$REPO/build/image/nvidia/"

ARGS=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "PYTHON_IMAGE=$BASE"
      --build-arg "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH" -t "$IMAGE" -f "$REPO/Dockerfile")
# buildah/podman: every file of every new layer and the config's dates get this time. (docker: BuildKit takes
# SOURCE_DATE_EPOCH for the config's dates only; file mtimes stay as built.)
[[ "$TOOL" == docker ]] || ARGS+=(--timestamp "$SOURCE_DATE_EPOCH")
[[ "${DRA_GPU_IMAGE_NO_CACHE:-}" != 1 ]] || ARGS+=(--no-cache)
# A TLS-intercepting proxy's CA (the host's pip trusts it through PIP_CERT): mounted for the RUN steps only.
if [[ -n "${PIP_CERT:-}" && -f "$PIP_CERT" && "$TOOL" != docker ]]; then
    ARGS+=(--volume "$PIP_CERT:/run/dra-gpu-build-ca.crt:ro" --build-arg PIP_CERT=/run/dra-gpu-build-ca.crt)
fi

log "$TOOL building $IMAGE from $BASE (SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH)"
t0=$SECONDS
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
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

# What a rebuild must reproduce: the image ID (config digest) and every layer's diff ID.
ID="$(image_id "$IMAGE")"
mapfile -t LAYERS < <(diff_ids "$IMAGE")
log "image ID $ID"
for i in "${!LAYERS[@]}"; do log "layer $i ${LAYERS[$i]}"; done

if [[ -n "${DRA_GPU_OCI_OUT:-}" ]]; then
    rm -f "$DRA_GPU_OCI_OUT"
    case "$TOOL" in
        docker) docker save -o "$DRA_GPU_OCI_OUT" "$IMAGE" ;;
        buildah) buildah push --quiet "$IMAGE" "oci-archive:$DRA_GPU_OCI_OUT:$IMAGE" ;;
        podman) podman save --quiet --format oci-archive -o "$DRA_GPU_OCI_OUT" "$IMAGE" ;;
    esac
    log "OCI archive $DRA_GPU_OCI_OUT"
fi

# The SBOM and the provenance, next to the image: in META_DIR, and beside the OCI archive when there is one.
mkdir -p "$META_DIR"
if [[ "${DRA_GPU_SBOM:-1}" != 0 ]]; then
    "$HERE/sbom.sh" "$TOOL" "$IMAGE" "${DRA_GPU_OCI_OUT:-}" "$META_DIR/$META_NAME.spdx.json" || {
        echo "manifests/image/build.sh: $IMAGE is built but its SBOM could not be written (above);" \
            "DRA_GPU_SBOM=0 builds without one" >&2
        exit 1
    }
else
    # An SBOM of an earlier build must not pass for this one's.
    rm -f "$META_DIR/$META_NAME.spdx.json" "${DRA_GPU_OCI_OUT:+$DRA_GPU_OCI_OUT.spdx.json}"
fi
tool_version="$("$TOOL" --version 2>/dev/null | awk 'NR == 1')" || tool_version=""
diff_args=()
for layer in "${LAYERS[@]}"; do diff_args+=(--diff-id "$layer"); done
python3 "$HERE/provenance.py" --repo "$REPO" --image "$IMAGE" --image-id "$ID" --revision "$REVISION" \
    --tree-clean "$TREE_CLEAN" --source-date-epoch "$SOURCE_DATE_EPOCH" --tool "$TOOL" --tool-version "$tool_version" \
    --base "$BASE" --base-digest "$(sed -n 's/.*@//p' <<<"$BASE")" --started "$started" \
    --finished "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${diff_args[@]}" \
    --material Dockerfile --material manifests/image/requirements.lock \
    --material manifests/image/build-requirements.lock \
    --material build/image/nvidia/nvidia-ctk --material build/image/nvidia/nvidia-cdi-hook \
    --out "$META_DIR/$META_NAME.provenance.json"
log "provenance $META_DIR/$META_NAME.provenance.json"
if [[ -n "${DRA_GPU_OCI_OUT:-}" ]]; then
    for f in "$META_DIR/$META_NAME".{spdx,provenance}.json; do
        [[ ! -f "$f" ]] || cp "$f" "$DRA_GPU_OCI_OUT.${f#"$META_DIR/$META_NAME".}"
    done
fi
