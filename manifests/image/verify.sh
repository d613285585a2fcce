#!/usr/bin/env bash
# Rebuilds a dra-gpu image from scratch and compares it with the build record (provenance) `make image` wrote:
# the same base (by digest), SOURCE_DATE_EPOCH and tool as recorded, every step run again (no layer cache).
# Passes when the rebuild has the recorded image ID and the same layer diff IDs; otherwise names each layer
# that differs and exits 1. `make image-verify` runs it.
# Usage: manifests/image/verify.sh [IMAGE]   (default: dra-gpu:<version>; the record is
#        ${DRA_GPU_IMAGE_META:-build/image}/<IMAGE>.provenance.json)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$REPO/manifests/image"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml" | awk 'NR == 1')"
IMAGE="${1:-dra-gpu:${VERSION}}"
META_DIR="${DRA_GPU_IMAGE_META:-$REPO/build/image}"
RECORD="$META_DIR/${IMAGE//[^A-Za-z0-9._-]/_}.provenance.json"
log() { echo "[verify] $*" >&2; }
[[ -f "$RECORD" ]] || { echo "no build record $RECORD: run 'make image' (manifests/image/build.sh $IMAGE) first" >&2; exit 1; }

# field NAME: one input of the recorded build.
field() {
    python3 - "$RECORD" "$1" <<'PY'
import json, sys
statement = json.load(open(sys.argv[1]))
build = statement["predicate"]["buildDefinition"]
values = {
    "base": build["resolvedDependencies"][0]["uri"] if build["resolvedDependencies"] else "",
    "epoch": build["externalParameters"]["sourceDateEpoch"],
    "revision": build["externalParameters"]["revision"],
    "tool": statement["predicate"]["runDetails"]["builder"]["id"].removeprefix("local:"),
}
print(values[sys.argv[2]])
PY
}
revision="$(field revision)"
head="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
[[ "$revision" == "$head" ]] || log "WARNING: the record is of revision $revision, the tree is at $head: expect differences"

out="$(mktemp -d /tmp/dra-gpu-verify.XXXXXX)"
rebuild="${IMAGE}-rebuild"
[[ "${IMAGE##*/}" == *:* ]] || rebuild="$IMAGE:rebuild"
# The rebuild's tag goes (its layers are the original's when it reproduces); its record is in $out.
trap 'rm -rf "$out"; "$(field tool)" rmi "$rebuild" >/dev/null 2>&1 || true' EXIT
log "rebuilding $IMAGE as $rebuild without cache (base $(field base), SOURCE_DATE_EPOCH=$(field epoch))"
PYTHON_IMAGE="$(field base)" SOURCE_DATE_EPOCH="$(field epoch)" IMAGE_TOOL="$(field tool)" DRA_GPU_SBOM=0 \
    DRA_GPU_IMAGE_NO_CACHE=1 DRA_GPU_IMAGE_META="$out" DRA_GPU_OCI_OUT="" "$HERE/build.sh" "$rebuild"

python3 - "$RECORD" "$out/${rebuild//[^A-Za-z0-9._-]/_}.provenance.json" <<'PY'
import json, sys

def identity(path):
    statement = json.load(open(path))
    layers = [b["digest"]["sha256"] for b in statement["predicate"]["runDetails"]["byproducts"]]
    return statement["subject"][0]["digest"]["sha256"], layers

(want_id, want), (got_id, got) = identity(sys.argv[1]), identity(sys.argv[2])
differ = 0
for index in range(max(len(want), len(got))):
    a = want[index] if index < len(want) else "-"
    b = got[index] if index < len(got) else "-"
    differ += a != b
    print(f"layer {index:2}  {a[:19]}  {b[:19]}  {'same' if a == b else 'DIFFERENT'}")
print(f"image ID  {want_id[:19]}  {got_id[:19]}  {'same' if want_id == got_id else 'DIFFERENT'}")
if differ or want_id != got_id:
    print(f"not reproduced: {differ} of {len(want)} layers differ", file=sys.stderr)
    sys.exit(1)
print(f"reproduced: the rebuild has the recorded image ID and all {len(want)} layers")
PY
