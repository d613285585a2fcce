#!/usr/bin/env bash
# Writes the SBOM of a built dra-gpu image as SPDX 2.3 JSON, with syft (anchore/syft, built from its Go module
# at the version pinned in e2e/cluster/versions.env and cached: e2e/cluster/build.sh syft).
# syft, because it reads the whole image: the Debian packages of the base (dpkg status), the Python packages
# of /opt/dra-gpu (dist-info) and the Go modules compiled into nvidia-ctk and nvidia-cdi-hook (build info), in
# one document. A Python-only tool (cyclonedx-py) would see the second only.
# Usage: manifests/image/sbom.sh TOOL IMAGE OCI_ARCHIVE|"" OUT
#   TOOL: docker, buildah or podman (what built IMAGE); OCI_ARCHIVE: an archive of IMAGE already written
#   (DRA_GPU_OCI_OUT), read instead of exporting the image again.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOL="$1" IMAGE="$2" ARCHIVE="$3" OUT="$4"
log() { echo "[image] $*" >&2; }

"$REPO/e2e/cluster/build.sh" syft
SYFT_VERSION="$(sed -n 's/^SYFT_VERSION=//p' "$REPO/e2e/cluster/versions.env")"
SYFT="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}/syft/$SYFT_VERSION/syft"

work="$(mktemp -d /tmp/dra-gpu-sbom.XXXXXX)"
trap 'rm -rf "$work"' EXIT
if [[ -n "$ARCHIVE" ]]; then
    # docker save writes a docker archive; buildah push and podman save (build.sh) an OCI one.
    if [[ "$TOOL" == docker ]]; then SOURCE="docker-archive:$ARCHIVE"; else SOURCE="oci-archive:$ARCHIVE"; fi
else
    case "$TOOL" in
        docker) docker save -o "$work/image.tar" "$IMAGE"; SOURCE="docker-archive:$work/image.tar" ;;
        buildah) buildah push --quiet "$IMAGE" "oci:$work/oci:$IMAGE"; SOURCE="oci-dir:$work/oci" ;;
        podman) podman save --quiet --format oci-dir -o "$work/oci" "$IMAGE"; SOURCE="oci-dir:$work/oci" ;;
        *) echo "sbom.sh: TOOL must be docker, buildah or podman, not '$TOOL'" >&2; exit 1 ;;
    esac
fi
# The document is named after IMAGE (name and tag; a registry's port is not a tag).
name="$IMAGE" version=""
if [[ "${IMAGE##*/}" == *:* ]]; then name="${IMAGE%:*}" version="${IMAGE##*:}"; fi
# Offline: no update check; the image's own files are all it reads.
SYFT_CHECK_FOR_APP_UPDATE=false "$SYFT" scan "$SOURCE" --quiet --source-name "$name" \
    ${version:+--source-version "$version"} -o "spdx-json=$OUT.tmp"
mv "$OUT.tmp" "$OUT"
log "SBOM $OUT (syft $SYFT_VERSION, SPDX JSON)"
